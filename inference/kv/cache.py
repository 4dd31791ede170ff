"""KV caches: what the model remembers about tokens it has already seen.

Owns: the two cache layouts the runners use, their token count, their size in bytes,
cropping (for branches and prefix reuse) and export/import as plain per-layer tensors
(for the prefix cache and prefill->decode handoff). Must not know: sampling, requests.

- `ContiguousKVCache`: preallocated (layers, 2, kv_heads, capacity, head_dim) buffer written in
  place, used by the lean Llama-family runner (no per-step `torch.cat`).
- `HFKVCache`: wraps a transformers `DynamicCache`, used for every other architecture.
"""

from __future__ import annotations

from typing import Protocol

import torch
from transformers import DynamicCache

# A cache exported as plain tensors: one (keys, values) pair per layer, each (kv_heads, T, head_dim).
LayerKV = list[tuple[torch.Tensor, torch.Tensor]]


class KVCache(Protocol):
    @property
    def num_tokens(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def crop(self, num_tokens: int) -> None: ...
    def export(self, num_tokens: int | None = None) -> LayerKV: ...


class ContiguousKVCache:
    """One preallocated buffer; `num_tokens` positions of it are valid."""

    def __init__(
        self, num_layers: int, num_kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.buffer = torch.empty(num_layers, 2, num_kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self._num_tokens = 0

    @property
    def capacity(self) -> int:
        return self.buffer.shape[3]

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    @property
    def nbytes(self) -> int:
        """Bytes the valid positions occupy (not the unused preallocated tail)."""
        per_token = self.buffer[:, :, :, :1].numel() * self.buffer.element_size()
        return per_token * self._num_tokens

    def reserve(self, num_new_tokens: int) -> None:
        """Grow (by copying) so that `num_new_tokens` more positions fit."""
        needed = self._num_tokens + num_new_tokens
        if needed <= self.capacity:
            return
        new_capacity = max(needed, 2 * self.capacity)
        grown = torch.empty(
            *self.buffer.shape[:3],
            new_capacity,
            self.buffer.shape[4],
            dtype=self.buffer.dtype,
            device=self.buffer.device,
        )
        grown[:, :, :, : self._num_tokens] = self.buffer[:, :, :, : self._num_tokens]
        self.buffer = grown

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store keys/values (kv_heads, T, head_dim) after the valid positions; return all valid k, v.

        The position counter advances in `advance()`, once per forward pass, after every layer wrote.
        """
        start, end = self._num_tokens, self._num_tokens + keys.shape[1]
        self.buffer[layer, 0, :, start:end] = keys
        self.buffer[layer, 1, :, start:end] = values
        return self.buffer[layer, 0, :, :end], self.buffer[layer, 1, :, :end]

    def advance(self, num_tokens: int) -> None:
        self._num_tokens += num_tokens

    def crop(self, num_tokens: int) -> None:
        if not 0 <= num_tokens <= self._num_tokens:
            raise ValueError(f"cannot crop a {self._num_tokens}-token cache to {num_tokens} tokens")
        self._num_tokens = num_tokens

    def export(self, num_tokens: int | None = None) -> LayerKV:
        n = self._num_tokens if num_tokens is None else num_tokens
        return [
            (self.buffer[i, 0, :, :n].clone(), self.buffer[i, 1, :, :n].clone()) for i in range(self.buffer.shape[0])
        ]

    def load(self, layers: LayerKV) -> None:
        """Replace the contents with exported tensors (same layer/head geometry)."""
        n = layers[0][0].shape[1]
        self._num_tokens = 0
        self.reserve(n)
        for i, (k, v) in enumerate(layers):
            self.buffer[i, 0, :, :n] = k
            self.buffer[i, 1, :, :n] = v
        self._num_tokens = n


class HFKVCache:
    """A transformers `DynamicCache` (batch 1) behind the same small interface."""

    def __init__(self, config) -> None:
        self.cache = DynamicCache(config=config)

    @property
    def num_tokens(self) -> int:
        return int(self.cache.get_seq_length())

    @property
    def nbytes(self) -> int:
        return dynamic_cache_nbytes(self.cache)

    def crop(self, num_tokens: int) -> None:
        if not 0 <= num_tokens <= self.num_tokens:
            raise ValueError(f"cannot crop a {self.num_tokens}-token cache to {num_tokens} tokens")
        if num_tokens < self.num_tokens:
            self.cache.crop(num_tokens)

    def export(self, num_tokens: int | None = None) -> LayerKV:
        n = self.num_tokens if num_tokens is None else num_tokens
        return [(layer.keys[0, :, :n].clone(), layer.values[0, :, :n].clone()) for layer in self.cache.layers]

    def load(self, layers: LayerKV) -> None:
        for i, (k, v) in enumerate(layers):
            self.cache.update(k.unsqueeze(0).clone(), v.unsqueeze(0).clone(), i)


def dynamic_cache_nbytes(cache: DynamicCache | None) -> int:
    """Bytes held by a transformers cache (any batch size); 0 for no cache."""
    if cache is None:
        return 0
    tensors = [t for layer in cache.layers for t in (getattr(layer, "keys", None), getattr(layer, "values", None))]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def layer_kv_nbytes(layers: LayerKV) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
