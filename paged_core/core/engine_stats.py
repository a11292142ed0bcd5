"""What an engine's ``stats()`` reports: typed fields, still readable as the flat mapping
of numbers it always was (``stats.kv.kv_blocks_used`` or ``stats["kv_blocks_used"]``).

Invariant: a stats object's mapping view (``as_dict``) holds every non-``None`` number
field under its own name, nested stats flattened into it, in field order; nothing else.
Metric exporters (``engine_metrics.reported``) and JSON output read that view.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass


class FlatStats(Mapping[str, float]):
    """The mapping view of a frozen stats dataclass (see the module doc), built once per
    object: an exporter's lookups of every metric do not rebuild it."""

    @functools.cached_property
    def _flat(self) -> dict[str, float]:
        flat: dict[str, float] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, FlatStats):
                flat.update(value._flat)
            elif value is not None:
                flat[field.name] = value
        return flat

    def as_dict(self) -> dict[str, float]:
        return dict(self._flat)

    def __getitem__(self, key: str) -> float:
        return self._flat[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._flat)

    def __len__(self) -> int:
        return len(self._flat)


@dataclass(frozen=True)
class KvCacheStats(FlatStats):
    """The KV block pool now (blocks) and the prefix cache's counters so far (tokens)."""
    kv_blocks_total: int
    kv_blocks_used: int
    kv_blocks_cached: int  # free, but still holding a cached prefix
    kv_blocks_free: int  # free and empty
    kv_usage: float  # used / total
    prefix_cache_queries: int
    prefix_cache_hits: int


@dataclass(frozen=True)
class SpecDecodeStats(FlatStats):
    """Speculative decoding's counters so far, under vLLM's metric names."""
    spec_decode_num_drafts: int
    spec_decode_num_draft_tokens: int
    spec_decode_num_accepted_tokens: int
    spec_decode_mean_acceptance_length: float
    spec_decode_draft_acceptance_rate: float


@dataclass(frozen=True)
class KvEventStats(FlatStats):
    """The KV-event publisher's counters so far (``kv_events_config``)."""
    kv_events_published: int  # events sent
    kv_event_batches_published: int
    kv_event_batches_dropped: int  # the publisher's queue was full


@dataclass(frozen=True)
class EngineStats(FlatStats):
    """One engine's gauges and counters at one moment."""
    kv: KvCacheStats
    num_running: int  # sequences
    num_waiting: int
    num_requests: int  # unfinished
    num_preemptions: int
    generated_tokens: int
    spec_decode: SpecDecodeStats | None = None  # only with speculative decoding
    kv_events: KvEventStats | None = None  # only with KV events published
    num_rejected: int | None = None  # requests refused by admission control (AsyncEngine)
