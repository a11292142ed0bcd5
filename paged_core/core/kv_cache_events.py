"""What happens to the prefix cache, as vLLM's KV-cache events name it.

The block pool and the KV-cache manager append these to an event list (only when one is
attached: ``KVCacheManager.record_events``); the engine hands each step's events to a
publisher (``paged_core.kv_events``), which sends them in vLLM's wire format. Plain data:
the core does not depend on any wire library.

- ``BlockStored``: full blocks of one sequence became cached, in order; ``parent_block_hash``
  is the hash of the block before the first (``None`` at the start of a sequence) and
  ``token_ids`` the blocks' tokens back to back. ``lora_id`` is the adapter the blocks were
  computed under (``None``: the base model) and ``cache_salt`` the request's salt: both are
  part of what the hashes chain from, so a router that keys blocks by their tokens needs them.
- ``BlockRemoved``: cached blocks stopped being cached (evicted for reuse, or reset).
- ``AllBlocksCleared``: no block is cached any more (a prefix-cache reset emptied it).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockStored:
    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    cache_salt: str | None = None


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list[bytes]


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared
