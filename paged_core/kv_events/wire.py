"""vLLM's KV-event wire format: msgpack of ``msgspec`` structs, arrays with a type tag.

The same definitions as ``vllm.distributed.kv_events`` (so vLLM's subscribers, Dynamo's
and llm-d's KV routers decode them): ``KVEventBatch(ts, events, data_parallel_rank)``,
events ``BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id,
medium)``, ``BlockRemoved(block_hashes, medium)``, ``AllBlocksCleared()``. Block hashes
are paged-core's 16-byte chained blake2b digests (vLLM's ``ExternalBlockHash`` is bytes or
int).
"""
from __future__ import annotations

from typing import Any

import msgspec

from ..core import kv_cache_events as core


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of every event; the tag is the class name."""


class BlockStored(KVCacheEvent):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[bytes | int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def to_wire(event: core.KVCacheEvent, medium: str) -> KVCacheEvent:
    """The wire struct of a core event (``medium``: where the blocks live, "CPU" or "GPU")."""
    if isinstance(event, core.BlockStored):
        return BlockStored(block_hashes=event.block_hashes,
                           parent_block_hash=event.parent_block_hash, token_ids=event.token_ids,
                           block_size=event.block_size, lora_id=None, medium=medium)
    if isinstance(event, core.BlockRemoved):
        return BlockRemoved(block_hashes=event.block_hashes, medium=medium)
    return AllBlocksCleared()
