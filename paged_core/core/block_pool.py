"""The pool of physical KV-cache blocks: ref counts, an LRU free queue, the prefix-hash table.

Invariants (checked by the property tests):
- every block is in exactly one state: *used* (``ref_cnt > 0``), *cached*
  (``ref_cnt == 0`` with a ``block_hash``: reusable by a prefix hit, evictable)
  or *free* (``ref_cnt == 0``, no hash); ``free + cached + used == total``;
- a block is in ``free_block_queue`` iff its ``ref_cnt`` is 0;
- ``cached_blocks[h]`` is a block whose ``block_hash == h``.
"""
from __future__ import annotations

from typing import Iterable

from .kv_cache_events import AllBlocksCleared, BlockRemoved, KVCacheEvent


class Block:
    """One physical block of ``block_size`` token slots in every layer's KV cache."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free", "next_free")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None
        self.prev_free: Block | None = None
        self.next_free: Block | None = None

    def __repr__(self) -> str:
        return f"Block(id={self.block_id}, ref_cnt={self.ref_cnt}, cached={self.block_hash is not None})"


class FreeBlockQueue:
    """Doubly linked list of blocks with ``ref_cnt == 0``, least recently freed first.

    ``popleft``, ``append`` and ``remove`` are O(1): a prefix-cache hit takes a
    block out of the middle of the queue without a scan.
    """

    def __init__(self, blocks: Iterable[Block]) -> None:
        self._head = Block(-1)  # sentinels
        self._tail = Block(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_blocks = 0
        for block in blocks:
            self.append(block)

    def append(self, block: Block) -> None:
        last = self._tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_blocks += 1

    def remove(self, block: Block) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise RuntimeError(f"{block} is not in the free queue")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_blocks -= 1

    def popleft(self) -> Block:
        first = self._head.next_free
        if first is self._tail or first is None:
            raise RuntimeError("no free KV-cache block left")
        self.remove(first)
        return first


class BlockPool:
    """Hands out blocks, takes them back, and remembers full blocks by their chained hash."""

    def __init__(self, num_blocks: int, enable_prefix_caching: bool) -> None:
        if num_blocks <= 0:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_block_queue = FreeBlockQueue(self.blocks)
        self.cached_blocks: dict[bytes, Block] = {}
        self.enable_prefix_caching = enable_prefix_caching
        self.num_cached_free = 0  # blocks with ref_cnt == 0 that hold a hash
        # Where evictions and resets are reported (kv_cache_events), when someone listens.
        self.events: list[KVCacheEvent] | None = None

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now (free or evictable cached)."""
        return self.free_block_queue.num_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.free_block_queue.num_blocks

    def get_new_blocks(self, count: int) -> list[Block]:
        """Take ``count`` blocks from the head of the free queue, evicting cached ones."""
        if count > self.num_free_blocks:
            raise RuntimeError(f"asked for {count} blocks, only {self.num_free_blocks} free")
        out = []
        for _ in range(count):
            block = self.free_block_queue.popleft()
            if block.block_hash is not None:
                self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def lookup(self, block_hash: bytes) -> Block | None:
        return self.cached_blocks.get(block_hash)

    def touch(self, blocks: Iterable[Block]) -> None:
        """Take a reference on blocks found by a prefix hit (or shared by a fork)."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
                if block.block_hash is not None:
                    self.num_cached_free -= 1
            block.ref_cnt += 1

    def free_blocks(self, blocks: Iterable[Block]) -> None:
        """Drop one reference on each block; blocks reaching 0 join the free queue in order.

        Callers pass a request's blocks tail first, so its tail is evicted first.
        """
        for block in blocks:
            if block.ref_cnt <= 0:
                raise RuntimeError(f"double free of {block}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_block_queue.append(block)
                if block.block_hash is not None:
                    self.num_cached_free += 1

    def cache_full_block(self, block: Block, block_hash: bytes) -> bool:
        """Record a full, used block under its hash; the first block with a hash keeps it.
        True if the block is newly cached (a ``BlockStored`` for the caller to report)."""
        if not self.enable_prefix_caching or block.block_hash is not None:
            return False
        if block_hash in self.cached_blocks:
            return False
        block.block_hash = block_hash
        self.cached_blocks[block_hash] = block
        return True

    def uncache(self, block: Block) -> None:
        """Drop the hash of a block still in use whose K/V will never be computed (its
        sequence was preempted after it was scheduled): no prefix lookup finds it any more;
        reported as ``BlockRemoved``, since its ``BlockStored`` went out at scheduling."""
        if block.block_hash is not None:
            self._drop_hash(block)

    def _evict(self, block: Block, report: bool = True) -> None:
        assert block.block_hash is not None
        self._drop_hash(block, report)
        self.num_cached_free -= 1

    def _drop_hash(self, block: Block, report: bool = True) -> None:
        if self.cached_blocks.get(block.block_hash) is block:
            del self.cached_blocks[block.block_hash]
            if report and self.events is not None:
                self.events.append(BlockRemoved([block.block_hash]))
        block.block_hash = None

    def reset_prefix_cache(self) -> None:
        """Forget every cached-but-unused block (e.g. after weights change); reported as
        ``AllBlocksCleared`` when that empties the cache, else as the blocks removed."""
        unused = [block for block in self.cached_blocks.values() if block.ref_cnt == 0]
        removed = [block.block_hash for block in unused]
        for block in unused:
            self._evict(block, report=False)
        if self.events is not None and removed:
            self.events.append(BlockRemoved(removed) if self.cached_blocks else AllBlocksCleared())
