"""The paged KV pool: one preallocated tensor of fixed-size blocks that every running sequence
writes its keys and values into, wherever the block manager put its blocks.

Owns: the pool tensor, slot arithmetic (a token at position p of a sequence lives in slot
`block_table[p // block_size] * block_size + p % block_size`), writes for a whole step in one
`index_copy_` per layer, and gathers of one sequence's (or a padded batch's) keys and values.
Must not know: which blocks belong to whom (that is `inference.core.block_manager`), sampling.
"""

from __future__ import annotations

import torch

from inference.kv.cache import LayerKV


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Keys and values of one token in every layer."""
    return 2 * num_layers * num_kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()


def num_blocks_for(budget_bytes: int, block_size: int, bytes_per_token: int) -> int:
    """How many blocks a byte budget buys (at least one)."""
    return max(1, budget_bytes // (block_size * bytes_per_token))


class PagedKVPool:
    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        # (layers, k/v, slots, kv_heads, head_dim): a token's heads are contiguous, so one
        # index_copy_ writes every new token of the step. `empty`: the OS backs pages only as
        # blocks are used. Every slot is written before it is read, except slot 0, which pads
        # the decode batch (masked, weight 0): it must hold finite numbers, since 0 * NaN is NaN.
        self.buffer = torch.empty(
            num_layers, 2, num_blocks * block_size, num_kv_heads, head_dim, dtype=dtype, device=device
        )
        self.buffer[:, :, :block_size].zero_()

    @property
    def bytes_per_token(self) -> int:
        num_layers, _, _, num_kv_heads, head_dim = self.buffer.shape
        return kv_bytes_per_token(num_layers, num_kv_heads, head_dim, self.buffer.dtype)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def slots(self, block_table: list[int], start: int, end: int) -> torch.Tensor:
        """Slot index of positions start..end-1 of a sequence, (end - start,) int64 on the CPU."""
        table = torch.tensor(block_table, dtype=torch.long)
        per_block = table[:, None] * self.block_size + torch.arange(self.block_size)  # (blocks, block_size)
        return per_block.flatten()[start:end]

    def write(self, layer: int, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """keys/values (T, kv_heads, head_dim) into `slots` (T,)."""
        self.buffer[layer, 0].index_copy_(0, slots, keys)
        self.buffer[layer, 1].index_copy_(0, slots, values)

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values at `slots` (any shape S) -> (*S, kv_heads, head_dim) each."""
        flat = slots.reshape(-1)
        keys = self.buffer[layer, 0].index_select(0, flat)
        values = self.buffer[layer, 1].index_select(0, flat)
        shape = (*slots.shape, *keys.shape[1:])
        return keys.view(shape), values.view(shape)

    def export(self, block_table: list[int], num_tokens: int) -> LayerKV:
        """A sequence's first `num_tokens` tokens as plain per-layer (kv_heads, T, head_dim) tensors
        (the prefill -> decode handoff's format)."""
        slots = self.slots(block_table, 0, num_tokens).to(self.buffer.device)
        return [
            tuple(t.transpose(0, 1).contiguous() for t in self.gather(i, slots)) for i in range(self.buffer.shape[0])
        ]

    def load(self, block_table: list[int], layers: LayerKV) -> None:
        """The inverse of `export`: write exported tensors into a sequence's blocks."""
        num_tokens = layers[0][0].shape[1]
        slots = self.slots(block_table, 0, num_tokens).to(self.buffer.device)
        for i, (keys, values) in enumerate(layers):
            self.write(
                i, slots, keys.transpose(0, 1).to(self.buffer.dtype), values.transpose(0, 1).to(self.buffer.dtype)
            )
