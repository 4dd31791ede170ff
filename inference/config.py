"""Per-model, per-worker engine settings (`EngineConfig`).

Owns: which model to load, where, in which dtype, and the limits that hold for every
request on that model. Must not know: anything per request (see `SamplingParams`),
Django, Celery or Channels.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from inference.bundled_models import SMOLLM2, check_bundled_source

BUNDLED_MODEL = SMOLLM2.source  # "bundled": SmolLM2-135M-Instruct; the others are "bundled:<name>" (bundled_models)
VALID_DTYPES = ("auto", "float32", "bfloat16", "float16", "int8", "int4", "gguf")  # the weight precision
VALID_DEVICES = ("auto", "cpu", "cuda")
MAX_NUM_ALTERNATIVES = 50


def default_data_dir() -> Path:
    """Where converted models and other engine data live (`PLAYGROUND_DATA_DIR` or ./data)."""
    return Path(os.environ.get("PLAYGROUND_DATA_DIR", Path.cwd() / "data")).resolve()


@dataclass(frozen=True)
class EngineConfig:
    """Settings fixed for the lifetime of a loaded model.

    `source` is a Hugging Face model folder, a hub id already in the local HF cache, a `.gguf`
    file, or a bundled model (`"bundled"`: SmolLM2; `"bundled:qwen2.5-coder-0.5b-instruct"`).
    `dtype` is the weight precision: `float32`, `bfloat16`, `float16`, or weight-only `int8` (per
    output channel) / `int4` (groups of 32; from a GGUF, its Q4_0/Q4_1/Q4_K blocks exactly and its
    other quantized types in 8 bits), both with bfloat16 activations. `"auto"` means bfloat16 on CUDA and
    on CPUs with bfloat16 units (AVX512-BF16/AMX), float32 on other CPUs. `max_context` caps the model's own
    context length (None: the model's `max_position_embeddings`). `name` is what people call the
    model (the playground's record name): it is the model's name in everything the engine reports
    (`model_info()`, errors, handoffs); empty, the source's own name (folder, file stem, hub id).
    """

    source: str = BUNDLED_MODEL
    name: str = ""
    dtype: str = "auto"
    device: str = "auto"
    max_context: int | None = None
    trust_remote_code: bool = False
    data_dir: str | None = None
    num_threads: int | None = None
    # The paged KV pool every request's KV lives in; what running requests do not hold keeps the
    # prefix cache (freed blocks keep their hashes until they are reused).
    kv_cache_bytes: int = 512 * 1024 * 1024
    # Tokens per KV block: the unit of allocation and of prefix sharing. Small, because attention
    # here gathers keys token by token (block size costs nothing there) and small blocks let short
    # prompts (the explorer's one-token steps) share their prefix too; GPU kernels prefer 16.
    block_size: int = 4
    max_num_seqs: int = 16  # sequences sharing one step
    max_num_batched_tokens: int = 512  # tokens (prefill chunks + decodes) in one step
    # A step that prefills is cut to about this long (its tokens from a step's measured fixed cost
    # and the cost of one prefilled token, `core.pacer`), so a newcomer's first token and every
    # running answer's next one wait about two steps whatever the prompts beside them. None: the
    # token budget alone.
    max_step_ms: float | None = None
    # "auto": the lean Llama-family runner when it supports the model; "transformers": always generic.
    runner: str = "auto"
    # True: every token's logits are computed in one fixed order whatever shares its step (the
    # fused CPU kernels' batch-invariant matmuls and attention): the same request gives bitwise
    # the same numbers alone or batched, chunked or not, cold or from the prefix cache.
    # False (the fast mode): torch's matmuls for float weights and torch's attention for prompts,
    # faster prefill where torch's kernels beat ours, last bits then depending on the batch.
    # Only the lean runner on the fused kernels is batch-invariant (model info: `batch_invariant`).
    batch_invariant: bool = True
    eos_token_ids: tuple[int, ...] | None = None  # None: the model's own stop ids (see models.loader)

    def __post_init__(self) -> None:
        if not self.source:
            raise ValueError("source must name a model folder, hub id, .gguf file or 'bundled'")
        check_bundled_source(self.source)
        if self.dtype not in VALID_DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is not one of {VALID_DTYPES}")
        if self.device not in VALID_DEVICES and not self.device.startswith("cuda:"):
            raise ValueError(f"device={self.device!r} is not one of {VALID_DEVICES} (or 'cuda:N')")
        if self.max_context is not None and self.max_context < 2:
            raise ValueError(f"max_context={self.max_context} must be at least 2")
        for name in ("kv_cache_bytes", "block_size", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.max_step_ms is not None and not self.max_step_ms > 0:
            raise ValueError(f"max_step_ms={self.max_step_ms} must be > 0 (or None: no time goal)")
        if self.runner not in ("auto", "transformers"):
            raise ValueError(f"runner={self.runner!r} is not 'auto' or 'transformers'")
        if self.eos_token_ids is not None and (
            not self.eos_token_ids
            or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in self.eos_token_ids)
        ):
            raise ValueError(f"eos_token_ids={self.eos_token_ids!r} must be a non-empty list of token ids (>= 0)")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads={self.num_threads} must be >= 1")

    @property
    def resolved_data_dir(self) -> Path:
        return Path(self.data_dir).resolve() if self.data_dir else default_data_dir()
