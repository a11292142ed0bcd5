"""vLLM's KV-event wire format (``vllm.distributed.kv_events``, vLLM 0.32): msgpack of
``msgspec`` structs.

- A batch is an array ``[ts, events, data_parallel_rank]`` (``KVEventBatch``).
- An event is a map tagged by its class name under ``"type"``: ``BlockStored`` (block
  hashes, parent hash, the blocks' token ids, block size, ``lora_id``, ``medium``,
  ``lora_name``, ``extra_keys``), ``BlockRemoved`` (block hashes, medium),
  ``AllBlocksCleared``. vLLM's later optional fields (``group_idx``, ``locality``, ...)
  keep their defaults and are left out, as ``omit_defaults`` does there.
- ``extra_keys`` holds one entry per block: what besides its tokens the block's hash
  chains from, untagged as vLLM publishes it (the LoRA name, then the request's
  ``cache_salt`` on a sequence's first block), or ``None``.

Block hashes are paged-core's 16-byte chained blake2b digests (vLLM's ``ExternalBlockHash``
is bytes or int); routers that key blocks by their tokens (vllm-router's ``kv_aware``,
Dynamo) use them only to match a ``BlockRemoved`` to its ``BlockStored``.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from ..core import kv_cache_events as core

# vLLM's ``MEDIUM_GPU``: the engine's own KV cache (its block pool publishes it on every
# platform, CPU included); routers credit blocks in other media (host offload, disk) less.
PRIMARY_MEDIUM = "GPU"


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of every event; encoded as a map whose ``"type"`` is the class name."""


class BlockStored(KVCacheEvent):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[bytes | int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def to_wire(event: core.KVCacheEvent, medium: str,
            lora_names: Mapping[int, str]) -> KVCacheEvent:
    """The wire struct of a core event (``medium``: where the blocks live; ``lora_names``:
    every adapter id the engine has known, with its name)."""
    if isinstance(event, core.BlockStored):
        lora_name = None if event.lora_id is None else lora_names.get(event.lora_id)
        return BlockStored(block_hashes=event.block_hashes,
                           parent_block_hash=event.parent_block_hash, token_ids=event.token_ids,
                           block_size=event.block_size, lora_id=event.lora_id, medium=medium,
                           lora_name=lora_name, extra_keys=_extra_keys(event, lora_name))
    if isinstance(event, core.BlockRemoved):
        return BlockRemoved(block_hashes=event.block_hashes, medium=medium)
    return AllBlocksCleared()


def _extra_keys(event: core.BlockStored, lora_name: str | None) -> list[tuple | None]:
    """One entry per stored block: its LoRA name, then the salt if it opens its sequence."""
    entries: list[tuple | None] = []
    for i in range(len(event.block_hashes)):
        opens_sequence = i == 0 and event.parent_block_hash is None
        keys = ((lora_name,) if lora_name is not None else ()) + \
            ((event.cache_salt,) if opens_sequence and event.cache_salt else ())
        entries.append(keys or None)
    return entries
