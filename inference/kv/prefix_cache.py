"""Prefix cache: KV tensors of token sequences seen before, reused by later prompts.

Owns: which token prefixes are remembered, their KV tensors, the byte budget, LRU eviction
and hit/miss statistics. Must not know: models, runners, requests, sampling; it stores
whatever per-layer (keys, values) it is given and hands back the same layout.

Design: a token-level radix tree (SGLang's RadixAttention), not hashed fixed-size blocks
(vLLM's automatic prefix caching). Each node owns the KV of the tokens on its edge (only
those: an insert stores just the suffix that is not cached yet); a match walks from the
root and concatenates the KV along the path. Why a tree rather than blocks: the engine
has one contiguous cache per request, not a paged block pool, so blocks would buy no
sharing and would lose up to a block of reuse at every divergence; the tree reuses up to
the exact token where a chat turn, an edited message or an explorer branch diverges.

Budget: `max_bytes` counts the tensors the tree owns. When an insert does not fit, whole
leaves are evicted least recently used first (a node's parent becomes a leaf when its last
child goes), never a node on the path being inserted. If the new suffix still does not
fit, its leading part that does is kept: a conversation is reused from its start.

Thread safety: one lock around every public method (one worker process, a few threads).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from inference.kv.cache import LayerKV, layer_kv_nbytes


@dataclass(eq=False)
class _Node:
    """One radix-tree edge: `token_ids` after the parent's tokens, and their KV."""

    token_ids: tuple[int, ...]
    layers: LayerKV  # (kv_heads, len(token_ids), head_dim) per layer
    parent: _Node | None
    children: dict[int, _Node] = field(default_factory=dict)  # keyed by the child's first token
    last_used: int = 0  # logical clock: ordering, not time
    nbytes: int = 0


def _owned(t: torch.Tensor) -> torch.Tensor:
    """`t` itself if it owns exactly its storage, else a copy: a view would keep the whole
    source storage alive while the byte budget counted only the view."""
    if t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone()


def _owned_slice(layers: LayerKV, start: int, end: int) -> LayerKV:
    return [(_owned(k[:, start:end]), _owned(v[:, start:end])) for k, v in layers]


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if tuple(a[:n]) == tuple(b[:n]):  # the common case (whole edge matches) at C speed
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


def _layout(layers: LayerKV) -> tuple:
    """Everything but the token axis: two inserts must agree on it to be concatenated."""
    return tuple((k.shape[0], k.shape[2], v.shape[0], v.shape[2], k.dtype, k.device) for k, v in layers)


class PrefixCache:
    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes={max_bytes} must be >= 0 (0 disables the prefix cache)")
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._clock = itertools.count(1)
        self.clear()

    @property
    def is_enabled(self) -> bool:
        return self.max_bytes > 0

    def clear(self) -> None:
        """Forget every cached prefix and reset the statistics."""
        with self._lock:
            self._root = _Node(token_ids=(), layers=[], parent=None)
            self._nodes: set[_Node] = set()
            self._layout: tuple | None = None
            self.num_bytes = 0
            self.num_hits = self.num_misses = self.num_evictions = self.num_cached_tokens = 0

    # ---- public ----------------------------------------------------------------------

    def match(self, token_ids: Sequence[int]) -> tuple[int, LayerKV | None]:
        """Longest cached prefix of token_ids: (num_tokens, per-layer (keys, values) each
        (kv_heads, num_tokens, head_dim)) or (0, None).

        The tensors are read-only: they may share storage with the cache (copy before writing).
        """
        if not self.is_enabled:
            return 0, None
        token_ids = [int(t) for t in token_ids]
        with self._lock:
            path, num_tokens = self._walk(token_ids)
            if num_tokens == 0:
                self.num_misses += 1
                return 0, None
            self._touch(node for node, _ in path)
            self.num_hits += 1
            self.num_cached_tokens += num_tokens
            return num_tokens, self._gather(path)

    def insert(self, token_ids: Sequence[int], layers: LayerKV) -> None:
        """Remember KV for token_ids (layers cover exactly len(token_ids) positions).
        Store only what is not already cached."""
        if not self.is_enabled or not len(token_ids):
            return
        token_ids = [int(t) for t in token_ids]
        self._check(token_ids, layers)
        with self._lock:
            if self._layout is None:
                self._layout = _layout(layers)
            elif _layout(layers) != self._layout:
                raise ValueError("KV layout (layers, heads, head_dim, dtype, device) differs from the cached one")
            path, num_known = self._walk(token_ids)
            if path and path[-1][1] < len(path[-1][0].token_ids) and num_known < len(token_ids):
                path[-1] = (self._split(*path[-1]), path[-1][1])
            self._touch(node for node, _ in path)
            if num_known < len(token_ids):
                parent = path[-1][0] if path else self._root
                self._add_suffix(parent, token_ids, layers, num_known, protected={node for node, _ in path})

    def stats(self) -> dict:
        with self._lock:
            num_lookups = self.num_hits + self.num_misses
            return {
                "hits": self.num_hits,
                "misses": self.num_misses,
                "hit_rate": self.num_hits / num_lookups if num_lookups else 0.0,
                "num_entries": len(self._nodes),
                "num_bytes": self.num_bytes,
                "max_bytes": self.max_bytes,
                "num_evictions": self.num_evictions,
                "num_cached_tokens": self.num_cached_tokens,
                "num_stored_tokens": sum(len(node.token_ids) for node in self._nodes),
            }

    # ---- the tree --------------------------------------------------------------------

    def _walk(self, token_ids: Sequence[int]) -> tuple[list[tuple[_Node, int]], int]:
        """The path of nodes token_ids runs along, each with how many of its tokens match
        (only the last may match partly), and the total number of matching tokens."""
        path: list[tuple[_Node, int]] = []
        node, num_tokens = self._root, 0
        while num_tokens < len(token_ids):
            child = node.children.get(token_ids[num_tokens])
            if child is None:
                break
            used = _common_length(child.token_ids, token_ids[num_tokens : num_tokens + len(child.token_ids)])
            path.append((child, used))
            num_tokens += used
            if used < len(child.token_ids):
                break
            node = child
        return path, num_tokens

    def _gather(self, path: list[tuple[_Node, int]]) -> LayerKV:
        num_layers = len(path[0][0].layers)
        pieces = [
            [(node.layers[i][0][:, :used], node.layers[i][1][:, :used]) for node, used in path]
            for i in range(num_layers)
        ]
        if len(path) == 1:  # one node: views, no copy
            return [layer[0] for layer in pieces]
        return [(torch.cat([k for k, _ in layer], dim=1), torch.cat([v for _, v in layer], dim=1)) for layer in pieces]

    def _touch(self, nodes) -> None:
        now = next(self._clock)
        for node in nodes:
            node.last_used = now

    def _split(self, node: _Node, at: int) -> _Node:
        """Cut node's edge after `at` tokens; return the new upper node (the lower keeps `node`)."""
        upper = _Node(
            token_ids=node.token_ids[:at],
            layers=_owned_slice(node.layers, 0, at),
            parent=node.parent,
            last_used=node.last_used,
        )
        node.layers = _owned_slice(node.layers, at, len(node.token_ids))
        node.token_ids = node.token_ids[at:]
        upper.parent.children[upper.token_ids[0]] = upper
        upper.children[node.token_ids[0]] = node
        node.parent = upper
        self._nodes.add(upper)
        self.num_bytes -= node.nbytes
        upper.nbytes, node.nbytes = layer_kv_nbytes(upper.layers), layer_kv_nbytes(node.layers)
        self.num_bytes += upper.nbytes + node.nbytes
        return upper

    def _add_suffix(
        self, parent: _Node, token_ids: Sequence[int], layers: LayerKV, start: int, protected: set[_Node]
    ) -> None:
        num_new = len(token_ids) - start
        bytes_per_token = layer_kv_nbytes(layers) // len(token_ids)
        self._evict(self.num_bytes + num_new * bytes_per_token - self.max_bytes, protected)
        num_new = min(num_new, (self.max_bytes - self.num_bytes) // max(bytes_per_token, 1))
        if num_new <= 0:
            return
        end = start + num_new
        node = _Node(
            token_ids=tuple(token_ids[start:end]),
            layers=_owned_slice(layers, start, end),
            parent=parent,
            last_used=next(self._clock),
        )
        node.nbytes = layer_kv_nbytes(node.layers)
        parent.children[node.token_ids[0]] = node
        self._nodes.add(node)
        self.num_bytes += node.nbytes

    def _evict(self, num_bytes: int, protected: set[_Node]) -> None:
        """Drop least recently used leaves (never `protected` ones) until num_bytes are freed."""
        if num_bytes <= 0:
            return
        heap = [(n.last_used, id(n), n) for n in self._nodes if not n.children and n not in protected]
        heapq.heapify(heap)
        freed = 0
        while freed < num_bytes and heap:
            _, _, victim = heapq.heappop(heap)
            parent = victim.parent
            del parent.children[victim.token_ids[0]]
            self._nodes.discard(victim)
            self.num_bytes -= victim.nbytes
            freed += victim.nbytes
            self.num_evictions += 1
            if not parent.children and parent is not self._root and parent not in protected:
                heapq.heappush(heap, (parent.last_used, id(parent), parent))

    @staticmethod
    def _check(token_ids: Sequence[int], layers: LayerKV) -> None:
        if not layers:
            raise ValueError("layers is empty: expected one (keys, values) pair per layer")
        for i, (k, v) in enumerate(layers):
            if k.dim() != 3 or v.dim() != 3 or k.shape[1] != len(token_ids) or v.shape[1] != len(token_ids):
                raise ValueError(
                    f"layer {i}: keys {tuple(k.shape)} / values {tuple(v.shape)} must be "
                    f"(kv_heads, {len(token_ids)}, head_dim) to match the token ids"
                )
