"""KV blocks: which fixed-size blocks of the KV pool hold which sequence's tokens, and which
full blocks can be shared because an earlier request computed the same prefix.

Owns: the free list (least recently freed first out, so a freed conversation's blocks stay
reusable as long as possible), reference counts (a block shared by several sequences is
freed when the last one lets go), and a hash per full block chained from its parent's, so
equal hashes mean equal prefixes (the prefix cache). A block is hashed only once its KV is
computed, so nobody can reuse a block that is still being prefilled.
Must not know: tensors (the pool is the model runner's), sampling, Django.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from inference.core.sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None  # set once the block is full and its KV computed
    token_ids: tuple[int, ...] = ()  # the tokens it holds, to rule out hash collisions


def chain_hash(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """Hash of a full block given its parent's: equal only for equal prefixes (up to collisions,
    which `Block.token_ids` rules out). Python hashes int tuples the same in every process."""
    return hash((parent_hash, token_ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks={num_blocks} and block_size={block_size} must be >= 1")
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))  # LRU order
        self.hash_to_block: dict[int, int] = {}
        # seq_id -> (how many of its leading blocks are hashed, the chain hash of the last of them).
        # The chain is kept here, not read back from the last block: a block that duplicates one
        # already cached stays unhashed, and a chain resumed from it began again from no parent.
        self.hashed: dict[int, tuple[int, int | None]] = {}
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0
        self.num_hits = 0  # admissions that reused at least one cached block
        self.num_misses = 0
        self.num_evictions = 0  # cached blocks reused for other tokens
        # Kept as blocks change hands (the live view reads them every step: counting over every
        # block of a 512 MB pool took ~0.7 ms a step, more than a tenth of an int4 decode step).
        self.num_shared_blocks = 0  # held by more than one sequence
        self.num_cached_free_blocks = 0  # free, but still holding a hashed prefix
        # Copy-on-write of forked sequences: (source block, new block) pairs the model runner must
        # copy before the next forward pass writes into the new block (`take_copies`).
        self.pending_copies: list[tuple[int, int]] = []

    # ---- sizes ---------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def stats(self) -> dict[str, int | float]:
        return {
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "num_used_blocks": self.num_used_blocks,
            "num_free_blocks": self.num_free_blocks,
            "num_shared_blocks": self.num_shared_blocks,
            "num_cached_free_blocks": self.num_cached_free_blocks,
            "num_queried_tokens": self.num_queried_tokens,
            "num_hit_tokens": self.num_hit_tokens,
            "hit_rate": self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0,
        }

    def reset_prefix_cache(self) -> None:
        """Forgets every cached prefix that no sequence holds, and the hit counters."""
        for block_id in self.free:
            block = self.blocks[block_id]
            if block.hash is not None and self.hash_to_block.get(block.hash) == block_id:
                del self.hash_to_block[block.hash]
            block.hash, block.token_ids = None, ()
        self.num_cached_free_blocks = 0
        self.num_queried_tokens = self.num_hit_tokens = self.num_hits = self.num_misses = self.num_evictions = 0

    # ---- admission -----------------------------------------------------------------------

    def _prefix_hits(self, seq: Sequence) -> list[int]:
        """Cached blocks equal to the sequence's leading full blocks, never covering its last
        token: that one must be computed, its logits give the next token."""
        hits, parent = [], None
        for start in range(0, seq.num_tokens - 1 - self.block_size + 1, self.block_size):
            tokens = seq.key_ids(start, start + self.block_size)
            h = chain_hash(parent, tokens)
            block_id = self.hash_to_block.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            hits.append(block_id)
            parent = h
        # A reused prefix must not end inside an image: its tokens are computed together.
        while hits and seq.chunk_end(0, len(hits) * self.block_size) != len(hits) * self.block_size:
            hits.pop()
        return hits

    def can_allocate(self, seq: Sequence) -> bool:
        return self.can_allocate_together([seq])

    def can_allocate_together(self, seqs: list[Sequence]) -> bool:
        """Whether all of `seqs` fit at once, a cached block several of them reuse counted once
        (a preempted beam search's beams share their prompt's: counted once per beam, three
        beams of a long prompt could never come back into a small pool). Allocating them one
        after another takes exactly this many free blocks: a block one of them evicts is counted
        as another's hit here and as the evictor's fresh block there, never both."""
        cached: set[int] = set()  # free blocks taken back as hits
        num_fresh = 0
        for seq in seqs:
            hits = self._prefix_hits(seq) if seq.uses_prefix_cache and not seq.num_imported_tokens else []
            cached.update(i for i in hits if self.blocks[i].ref_count == 0)
            num_fresh += seq.num_blocks_needed(self.block_size) - len(hits)
        return num_fresh + len(cached) <= self.num_free_blocks

    def allocate(self, seq: Sequence) -> None:
        """Blocks for all of the sequence's tokens; a cached prefix is shared, not recomputed."""
        assert not seq.block_table, f"sequence {seq.seq_id} already holds blocks"
        # An imported sequence's KV arrives whole: its blocks are its own (never written over shared ones).
        hits = self._prefix_hits(seq) if seq.uses_prefix_cache and not seq.num_imported_tokens else []
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free[block_id]
                self.num_cached_free_blocks -= 1  # a hit always carries its hash
            block.ref_count += 1
            self.num_shared_blocks += block.ref_count == 2
        seq.block_table = list(hits)
        self._grow(seq, seq.num_blocks_needed(self.block_size))
        seq.num_cached_tokens = seq.num_computed_tokens = len(hits) * self.block_size
        seq.num_computed_tokens = max(seq.num_computed_tokens, seq.num_imported_tokens)
        self.hashed[seq.seq_id] = (len(hits), self.blocks[hits[-1]].hash if hits else None)
        if seq.num_imported_tokens:
            return  # not a prefix-cache lookup
        self.num_queried_tokens += seq.num_tokens
        self.num_hit_tokens += seq.num_cached_tokens
        if seq.uses_prefix_cache:
            self.num_hits += bool(hits)
            self.num_misses += not hits

    # ---- growth --------------------------------------------------------------------------

    def can_append(self, seq: Sequence, num_tokens: int) -> bool:
        """Whether blocks for the first `num_tokens` tokens fit (growing by what is missing, and
        a private copy of a shared block the next tokens are written into)."""
        missing = seq.num_blocks_needed(self.block_size, num_tokens) - len(seq.block_table)
        return missing + self._needs_copy(seq) <= self.num_free_blocks

    def append_slots(self, seq: Sequence, num_tokens: int) -> None:
        if self._needs_copy(seq):
            self._copy_on_write(seq, seq.num_computed_tokens // self.block_size)
        self._grow(seq, seq.num_blocks_needed(self.block_size, num_tokens))

    def _needs_copy(self, seq: Sequence) -> bool:
        """The block the next token is written into is shared (a fork's partly filled last block)."""
        index = seq.num_computed_tokens // self.block_size
        return index < len(seq.block_table) and self.blocks[seq.block_table[index]].ref_count > 1

    def _copy_on_write(self, seq: Sequence, index: int) -> None:
        shared = self.blocks[seq.block_table[index]]
        shared.ref_count -= 1
        self.num_shared_blocks -= shared.ref_count == 1
        seq.block_table[index] = self._take_free_block()
        self.pending_copies.append((shared.block_id, seq.block_table[index]))

    def take_copies(self) -> list[tuple[int, int]]:
        """The block copies owed before the next forward pass (and forget them)."""
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """`child` shares every block of `parent` (its KV up to `parent.num_computed_tokens`); the
        first write into a shared, partly filled block copies it (`append_slots`)."""
        assert not child.block_table, f"sequence {child.seq_id} already holds blocks"
        for block_id in parent.block_table:
            block = self.blocks[block_id]
            block.ref_count += 1
            self.num_shared_blocks += block.ref_count == 2
        child.block_table = list(parent.block_table)
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_cached_tokens
        self.hashed[child.seq_id] = self.hashed.get(parent.seq_id, (0, None))

    def _grow(self, seq: Sequence, num_blocks: int) -> None:
        while len(seq.block_table) < num_blocks:
            seq.block_table.append(self._take_free_block())

    def _take_free_block(self) -> int:
        """The least recently freed block (its old prefix evicted), now held once."""
        block_id, _ = self.free.popitem(last=False)
        block = self.blocks[block_id]
        self.num_cached_free_blocks -= block.hash is not None
        if block.hash is not None and self.hash_to_block.get(block.hash) == block_id:
            del self.hash_to_block[block.hash]
            self.num_evictions += 1
        block.hash, block.token_ids, block.ref_count = None, (), 1
        return block_id

    def mark_computed(self, seq: Sequence) -> None:
        """After a step: hash the blocks that are now full and computed, so later requests may share them."""
        if not seq.uses_prefix_cache:
            return
        done, parent = self.hashed.get(seq.seq_id, (0, None))
        while (done + 1) * self.block_size <= seq.num_computed_tokens:
            block = self.blocks[seq.block_table[done]]
            tokens = seq.key_ids(done * self.block_size, (done + 1) * self.block_size)
            h = chain_hash(parent, tokens)
            if block.hash is None and h not in self.hash_to_block:
                block.hash, block.token_ids = h, tokens
                self.hash_to_block[h] = block.block_id
            parent, done = h, done + 1
        self.hashed[seq.seq_id] = (done, parent)

    # ---- release -------------------------------------------------------------------------

    def trim(self, seq: Sequence) -> None:
        """Gives back the blocks past those its tokens need (rejected proposed tokens' blocks)."""
        keep = seq.num_blocks_needed(self.block_size)
        for block_id in reversed(seq.block_table[keep:]):
            self._release(block_id)
        del seq.block_table[keep:]

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        self.num_shared_blocks -= block.ref_count == 1
        if block.ref_count == 0:
            self.free[block_id] = None
            self.num_cached_free_blocks += block.hash is not None

    def deallocate(self, seq: Sequence) -> None:
        """Lets go of the sequence's blocks; a block nobody holds goes to the free list, keeping
        its hash (a later request with the same prefix takes it back) until it is reused."""
        for block_id in reversed(seq.block_table):  # the tail is evicted before the shared head
            self._release(block_id)
        seq.block_table = []
        seq.num_computed_tokens = 0
        self.hashed.pop(seq.seq_id, None)
