"""The paged KV pool: preallocated tensors of fixed-size blocks that every running sequence
writes its keys and values into, wherever the block manager put its blocks.

Owns: the pool tensors, slot arithmetic (a token at position p of a sequence lives in slot
`block_table[p // block_size] * block_size + p % block_size`), writes for a whole step in one
`index_copy_` per layer, gathers of sequences' keys and values, copies of whole blocks (a
forked sequence's copy-on-write) and export/load as plain per-layer tensors (the handoff).
Must not know: which blocks belong to whom (that is `inference.core.block_manager`), sampling.

What a "key" and a "value" are is the model's: heads x head_dim for ordinary attention, or,
for DeepSeek's multi-head latent attention, the compressed latent (1 x kv_lora_rank) and the
shared rotary key (1 x qk_rope_head_dim). Keys and values of equal shape share one buffer
(layers, 2, slots, heads, dim), the layout the fused CPU kernels address.
"""

from __future__ import annotations

import math

import torch

# A cache exported as plain tensors: one (keys, values) pair per layer, each (heads, T, dim).
LayerKV = list[tuple[torch.Tensor, torch.Tensor]]


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Keys and values of one token in every layer (keys and values of one shape)."""
    return 2 * num_layers * num_kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()


def num_blocks_for(budget_bytes: int, block_size: int, bytes_per_token: int) -> int:
    """How many blocks a byte budget buys (at least one)."""
    return max(1, budget_bytes // (block_size * bytes_per_token))


def layer_kv_nbytes(layers: LayerKV) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)


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
        value_shape: tuple[int, int] | None = None,
    ) -> None:
        """Keys of (num_kv_heads, head_dim) per token and layer; values the same unless
        `value_shape` says otherwise (MLA's rotary key beside its latent)."""
        key_shape = (num_kv_heads, head_dim)
        value_shape = value_shape or key_shape
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.num_layers = num_layers
        self.key_shape, self.value_shape = tuple(key_shape), tuple(value_shape)
        num_slots = num_blocks * block_size
        # `empty`: the OS backs pages only as blocks are used. Every slot is written before it is
        # read, except the first block, whose slot 0 pads gathers (masked, weight 0): it must hold
        # finite numbers, since 0 * NaN is NaN.
        if self.key_shape == self.value_shape:
            self.buffer: torch.Tensor | None = torch.empty(
                num_layers, 2, num_slots, *key_shape, dtype=dtype, device=device
            )
            self.keys, self.values = self.buffer[:, 0], self.buffer[:, 1]  # (layers, slots, heads, dim)
        else:
            self.buffer = None
            self.keys = torch.empty(num_layers, num_slots, *key_shape, dtype=dtype, device=device)
            self.values = torch.empty(num_layers, num_slots, *value_shape, dtype=dtype, device=device)
        self.keys[:, :block_size].zero_()
        self.values[:, :block_size].zero_()

    @property
    def dtype(self) -> torch.dtype:
        return self.keys.dtype

    @property
    def device(self) -> torch.device:
        return self.keys.device

    @property
    def bytes_per_token(self) -> int:
        size = self.keys.element_size()
        return self.num_layers * size * (math.prod(self.key_shape) + math.prod(self.value_shape))

    @property
    def nbytes(self) -> int:
        return self.bytes_per_token * self.num_blocks * self.block_size

    def slots(self, block_table: list[int], start: int, end: int) -> torch.Tensor:
        """Slot index of positions start..end-1 of a sequence, (end - start,) int64 on the CPU."""
        return torch.tensor(self.slot_ids(block_table, start, end), dtype=torch.long)

    def slot_ids(self, block_table: list[int], start: int, end: int) -> list[int]:
        """`slots` as a list. A step's bookkeeping builds every sequence's slots this way and
        makes one tensor of them: five small torch ops per sequence each gave up the GIL, which
        under the serving stack's threads is a wait every time."""
        size, first = self.block_size, start // self.block_size
        ids: list[int] = []
        for block in block_table[first : (end + size - 1) // size]:
            ids.extend(range(block * size, (block + 1) * size))
        return ids[start - first * size : end - first * size]

    def write(self, layer: int, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """keys/values (T, heads, dim) into `slots` (T,)."""
        self.keys[layer].index_copy_(0, slots, keys)
        self.values[layer].index_copy_(0, slots, values)

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values at `slots` (any shape S) -> (*S, heads, dim) each."""
        flat = slots.reshape(-1)
        keys = self.keys[layer].index_select(0, flat)
        values = self.values[layer].index_select(0, flat)
        return keys.view(*slots.shape, *keys.shape[1:]), values.view(*slots.shape, *values.shape[1:])

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copies every layer's keys and values of block `src` into block `dst`, for each pair."""
        if not pairs:
            return
        src = self.slots([s for s, _ in pairs], 0, len(pairs) * self.block_size).to(self.device)
        dst = self.slots([d for _, d in pairs], 0, len(pairs) * self.block_size).to(self.device)
        self.keys.index_copy_(1, dst, self.keys.index_select(1, src))
        self.values.index_copy_(1, dst, self.values.index_select(1, src))

    def export(self, block_table: list[int], num_tokens: int) -> LayerKV:
        """A sequence's first `num_tokens` tokens as plain per-layer (heads, T, dim) tensors
        (the prefill -> decode handoff's format)."""
        slots = self.slots(block_table, 0, num_tokens).to(self.device)
        return [tuple(t.transpose(0, 1).contiguous() for t in self.gather(i, slots)) for i in range(self.num_layers)]

    def load(self, block_table: list[int], layers: LayerKV) -> None:
        """The inverse of `export`: write exported tensors into a sequence's blocks."""
        num_tokens = layers[0][0].shape[1]
        slots = self.slots(block_table, 0, num_tokens).to(self.device)
        for i, (keys, values) in enumerate(layers):
            self.write(i, slots, keys.transpose(0, 1).to(self.dtype), values.transpose(0, 1).to(self.dtype))
