"""``KVCacheManager``: block tables of sequences on top of the ``BlockPool`` (no torch).

Responsibilities: on-demand allocation when a sequence crosses a block
boundary, prefix-cache lookup for new sequences, copy-on-write forks for
parallel sampling, and freeing. Invariants: a sequence's block table covers
exactly ``ceil(num_computed_tokens / block_size)`` blocks after a step; a block
shared by several sequences (``ref_cnt > 1``) is never written: the writer gets
a private copy first (``pending_copies``, applied by the runner before the step).
"""
from __future__ import annotations

from .block_hash import extend_block_hashes
from .block_pool import Block, BlockPool
from .engine_stats import KvCacheStats
from .kv_cache_events import BlockStored, KVCacheEvent
from .sequence import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, enable_prefix_caching)
        self.enable_prefix_caching = enable_prefix_caching
        self.block_tables: dict[int, list[Block]] = {}
        self._block_ids: dict[int, list[int]] = {}  # each table's block ids, kept alongside it
        self._num_cached: dict[int, int] = {}  # full blocks of a sequence already hashed into the pool
        self.pending_copies: list[tuple[int, int]] = []  # (src, dst) block ids to copy this step
        self.prefix_cache_queries = 0  # tokens looked up
        self.prefix_cache_hits = 0  # tokens found

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    def block_ids(self, seq: Sequence) -> list[int]:
        """The ids of ``seq``'s blocks in order. Kept alongside the table, so a step reads it
        without a copy: callers must not change it, and it is never changed afterwards (a
        change of the table makes a new list)."""
        return self._block_ids.get(seq.seq_id, [])

    def find_cached_prefix(self, seq: Sequence) -> list[Block]:
        """Longest run of cached full blocks that prefixes ``seq``, leaving >= 1 token to compute."""
        if not self.enable_prefix_caching or seq.seq_id in self.block_tables:
            return []
        extend_block_hashes(seq.block_hashes, seq.token_ids, self.block_size, seq.block_hash_salt)
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hits: list[Block] = []
        for block_hash in seq.block_hashes[:max_blocks]:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def record_prefix_lookup(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        """Count one admitted sequence's prefix-cache lookup (in tokens)."""
        if self.enable_prefix_caching:
            self.prefix_cache_queries += num_query_tokens
            self.prefix_cache_hits += num_hit_tokens

    def allocate_slots(self, seq: Sequence, num_new_tokens: int,
                       cached_prefix: list[Block] | None = None) -> bool:
        """Make room for ``num_new_tokens`` more tokens of K/V; False (and no change) if full.

        ``cached_prefix`` (from ``find_cached_prefix``) is attached first and
        counts as computed: the caller advances ``num_computed_tokens`` by its length.
        """
        table = self.block_tables.get(seq.seq_id, [])
        if not cached_prefix and self._fits(table, seq.num_computed_tokens, num_new_tokens):
            self._cache_full_blocks(seq, table, seq.num_computed_tokens + num_new_tokens)
            return True
        cached_prefix = cached_prefix or []
        num_computed = seq.num_computed_tokens + len(cached_prefix) * self.block_size
        total = num_computed + num_new_tokens
        num_needed = cdiv(total, self.block_size) - len(table) - len(cached_prefix)
        needs_copy = self._last_block_shared(table, num_computed)
        # Cached prefix blocks with ref_cnt 0 sit in the free queue: touching them uses them up.
        reclaimed = sum(1 for b in cached_prefix if b.ref_cnt == 0)
        if max(num_needed, 0) + needs_copy > self.pool.num_free_blocks - reclaimed:
            return False
        if cached_prefix:
            self.pool.touch(cached_prefix)
            table = table + cached_prefix
        if needs_copy:
            self._copy_on_write(table)
        if num_needed > 0:
            table = table + self.pool.get_new_blocks(num_needed)
        self.block_tables[seq.seq_id] = table
        self._block_ids[seq.seq_id] = [b.block_id for b in table]
        self._cache_full_blocks(seq, table, total)
        return True

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Share every block of ``parent`` with ``child`` by reference (copy-on-write); the
        child's keys are rotated as its parent's."""
        table = self.block_tables[parent.seq_id]
        self.pool.touch(table)
        self.block_tables[child.seq_id] = list(table)
        self._block_ids[child.seq_id] = list(self._block_ids[parent.seq_id])
        self._num_cached[child.seq_id] = self._num_cached.get(parent.seq_id, 0)
        child.rotated_long = parent.rotated_long
        child.block_hashes = list(parent.block_hashes)

    def free(self, seq: Sequence) -> None:
        """Release a sequence's blocks, tail first so the tail is evicted first.

        Blocks are hashed when scheduled, before the step computes them; a sequence freed in
        between (preempted after it was scheduled in this step) leaves blocks past its
        ``num_computed_tokens`` that hold no K/V yet: those it alone holds lose their hash, so
        no prefix hit can ever read them."""
        table = self.block_tables.pop(seq.seq_id, None)
        self._block_ids.pop(seq.seq_id, None)
        num_hashed = self._num_cached.pop(seq.seq_id, 0)
        if not table:
            return
        for block in table[seq.num_computed_tokens // self.block_size:num_hashed]:
            if block.ref_cnt == 1:
                self.pool.uncache(block)
        self.pool.free_blocks(reversed(table))

    def free_blocks_past_computed(self, seq: Sequence) -> None:
        """Drop the tail blocks that hold no computed token (rejected draft slots), tail first.

        Their slots were never hashed: block hashes only cover ``seq.token_ids``.
        """
        table = self.block_tables.get(seq.seq_id)
        keep = cdiv(seq.num_computed_tokens, self.block_size)
        if table and len(table) > keep:
            self.pool.free_blocks(reversed(table[keep:]))
            del table[keep:]
            self._block_ids[seq.seq_id] = self._block_ids[seq.seq_id][:keep]

    def reset_prefix_cache(self) -> None:
        """Evict every cached block with no reference; blocks in use keep their hashes."""
        self.pool.reset_prefix_cache()

    def take_pending_copies(self) -> list[tuple[int, int]]:
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def _fits(self, table: list[Block], num_computed: int, num_new_tokens: int) -> bool:
        """Whether ``num_new_tokens`` more tokens land in ``table``'s blocks as they are (most
        decode steps): no new block, and no write into a block another sequence holds."""
        return (num_computed + num_new_tokens <= len(table) * self.block_size
                and not self._last_block_shared(table, num_computed))

    def _last_block_shared(self, table: list[Block], num_computed: int) -> bool:
        """True if the next token lands in a partially filled block that another sequence holds."""
        if not table or num_computed % self.block_size == 0:
            return False
        return len(table) == cdiv(num_computed, self.block_size) and table[-1].ref_cnt > 1

    def _copy_on_write(self, table: list[Block]) -> None:
        shared = table[-1]
        (private,) = self.pool.get_new_blocks(1)
        self.pending_copies.append((shared.block_id, private.block_id))
        self.pool.free_blocks([shared])
        table[-1] = private

    def _cache_full_blocks(self, seq: Sequence, table: list[Block], num_tokens: int) -> None:
        if not self.enable_prefix_caching:
            return
        # known tokens only: a placeholder (schedule_ahead) is never hashed
        num_full = min(num_tokens, seq.num_known_tokens) // self.block_size
        start = self._num_cached.get(seq.seq_id, 0)
        if num_full <= start:
            return
        extend_block_hashes(seq.block_hashes, seq.token_ids, self.block_size, seq.block_hash_salt,
                            num_full)
        stored = [i for i in range(start, num_full)
                  if self.pool.cache_full_block(table[i], seq.block_hashes[i])]
        self._num_cached[seq.seq_id] = num_full
        if stored and self.pool.events is not None:
            self._report_stored(seq, stored)

    def _report_stored(self, seq: Sequence, stored: list[int]) -> None:
        """One ``BlockStored`` per run of consecutive newly cached blocks of ``seq``."""
        runs: list[list[int]] = []
        for i in stored:
            if runs and runs[-1][-1] == i - 1:
                runs[-1].append(i)
            else:
                runs.append([i])
        size = self.block_size
        for run in runs:
            first, last = run[0], run[-1]
            self.pool.events.append(BlockStored(
                block_hashes=[seq.block_hashes[i] for i in run],
                parent_block_hash=seq.block_hashes[first - 1] if first > 0 else None,
                token_ids=list(seq.token_ids[first * size:(last + 1) * size]), block_size=size,
                lora_id=seq.lora_id, cache_salt=seq.cache_salt))

    def record_events(self) -> None:
        """From now on, keep the prefix cache's events (``kv_cache_events``) for ``take_events``."""
        self.pool.events = []

    def take_events(self) -> list[KVCacheEvent]:
        """The events since the last call (empty unless ``record_events`` was called)."""
        if not self.pool.events:
            return []
        events, self.pool.events = self.pool.events, []
        return events

    def stats(self) -> KvCacheStats:
        pool = self.pool
        return KvCacheStats(
            kv_blocks_total=pool.num_blocks,
            kv_blocks_used=pool.num_used_blocks,
            kv_blocks_cached=pool.num_cached_free,
            kv_blocks_free=pool.num_free_blocks - pool.num_cached_free,
            kv_usage=pool.num_used_blocks / pool.num_blocks,
            prefix_cache_queries=self.prefix_cache_queries,
            prefix_cache_hits=self.prefix_cache_hits,
        )
