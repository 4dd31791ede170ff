"""The model runner: everything of a step that touches the device.

Owns: the loaded model's forward pass for a whole continuous-batching step (the lean
Llama-family pass, on the fused CPU kernels where they run, or any transformers model's own
modules), the paged KV pool that pass reads and writes, copies of forked blocks, the KV export
and import of a prefill/decode handoff, and the MoE routing of each sampled row (captured from
the routers of that same pass). Callers hand it the scheduler's chunks; it hands back float32
logits, one row per chunk that samples.
Must not know: sampling, requests, the scheduler's policy, Django.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from inference.config import EngineConfig
from inference.core.scheduler import Chunk
from inference.introspect.moe import PassRouting
from inference.kv.paged import LayerKV, PagedKVPool, num_blocks_for
from inference.models import llama
from inference.models.batched_llama import BatchedLlamaRunner
from inference.models.hf import HFBatchedRunner
from inference.models.loader import LoadedModel

MoERouting = tuple[dict[str, Any], ...]  # one choice per MoE layer (`inference.introspect.moe.choice_at`)


@dataclass(frozen=True)
class StepOutput:
    logits: torch.Tensor  # (S, vocab) float32: one row per chunk that samples, in chunk order
    routing: list[MoERouting | None]  # (S,) the MoE routing of each row's position; None: dense model


class ModelRunner:
    def __init__(self, loaded: LoadedModel, config: EngineConfig) -> None:
        self.model = loaded.model
        self.device = loaded.device
        self.llama: BatchedLlamaRunner | None = None
        self.hf: HFBatchedRunner | None = None
        if config.runner == "auto" and llama.supports(self.model):
            lean = llama.LlamaRunner(self.model, loaded.max_context, config.batch_invariant)
            shape = (lean.num_kv_heads, lean.head_dim)
            num_blocks = _num_blocks(config, len(lean.layers), shape, shape, lean.dtype)
            self.pool = PagedKVPool(len(lean.layers), num_blocks, config.block_size, *shape, lean.dtype, self.device)
            self.llama = BatchedLlamaRunner(lean, self.pool)
        else:
            self.hf = HFBatchedRunner(self.model, kernel_matmuls=config.batch_invariant)
            g = self.hf.geometry
            num_blocks = _num_blocks(config, g.num_layers, g.key_shape, g.value_shape, g.dtype)
            self.pool = self.hf.new_pool(num_blocks, config.block_size)
        self.routing = PassRouting(self.model)  # hooks the routers of each pass (none on a dense model)

    @property
    def name(self) -> str:
        return self.llama.name if self.llama is not None else self.hf.name

    @property
    def kernels(self) -> str:
        """What runs between the matmuls: the fused CPU kernels, or torch's ops (GPU, no compiler)."""
        return "fused CPU kernels" if self.llama is not None and self.llama.lean.fused is not None else "torch ops"

    @property
    def is_batch_invariant(self) -> bool:
        """Whether a token's numbers are the same whatever shares its step and however its prefix
        was computed: the fused kernels' default, not their fast mode, torch ops or other runners."""
        fused = self.llama.lean.fused if self.llama is not None else None
        return fused is not None and fused.is_batch_invariant

    @property
    def bytes_per_token(self) -> int:
        return self.pool.bytes_per_token

    def run(self, chunks: list[Chunk], pixel_values: torch.Tensor | None = None) -> StepOutput:
        """One forward pass for the step's chunks (their blocks allocated by the block manager).
        `pixel_values` (num_images, 3, H, W): the images whose tokens are in these chunks, in order."""
        rows = _logit_rows(chunks)
        with self.routing.at_rows(rows) as routing:
            if self.llama is not None:
                if pixel_values is not None:
                    raise ValueError("the lean runner takes no images")
                logits = self.llama.forward(self.llama.prepare(chunks))
            else:
                logits = self.hf.forward(self.hf.prepare(chunks, self.pool), self.pool, pixel_values)
        return StepOutput(logits=logits, routing=routing or [None] * len(rows))

    def run_layers(self, chunks: list[Chunk]) -> torch.Tensor:
        """The logit lens of one forward pass: float32 (L + 1, S, vocab), the model's final norm
        and output layer read after the embedding and after each layer at the rows that sample;
        the last row is the pass's own logits (what a step computes)."""
        if self.llama is not None:
            return self.llama.forward_layers(self.llama.prepare(chunks))
        return self.hf.forward(self.hf.prepare(chunks, self.pool), self.pool, all_layers=True)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        self.pool.copy_blocks(pairs)

    def export(self, block_table: list[int], num_tokens: int) -> LayerKV:
        return self.pool.export(block_table, num_tokens)

    def load(self, block_table: list[int], layers: LayerKV) -> None:
        self.pool.load(block_table, layers)


def _num_blocks(
    config: EngineConfig, num_layers: int, key_shape: tuple[int, int], value_shape: tuple[int, int], dtype
) -> int:
    """How many KV blocks the worker's byte budget buys."""
    numel = num_layers * (key_shape[0] * key_shape[1] + value_shape[0] * value_shape[1])
    per_token = numel * torch.empty(0, dtype=dtype).element_size()
    return num_blocks_for(config.kv_cache_bytes, config.block_size, per_token)


def _logit_rows(chunks: list[Chunk]) -> list[int]:
    """Rows of the packed step whose logits are computed: each sampling chunk's last token (every
    row of a scored one)."""
    rows, row = [], 0
    for chunk in chunks:
        rows += [row + offset for offset in chunk.logit_offsets()]
        row += chunk.num_tokens
    return rows
