"""``CoreRequest``: what the core keeps of every request, whatever its kind (a sampling
``Request``, a ``BeamSearchRequest``), beside the ``EngineRequest`` it was made from.

The scheduler reads ``request_id``, ``priority``, ``tenant`` (the waiting queue and the
preemption victim choice are keyed by them; ``core.sequence.SequenceOwner``), the KV cache
manager its sequences' ``cache_salt`` and ``lora_id``; none of them ever changes.
What the core learns while running the request (prefix-cache hits, when it was first
scheduled, its first token) goes out with each ``EngineCoreOutput``.
"""
from __future__ import annotations

import itertools
import time
from typing import Any

from .engine_io import EngineCoreOutput, EngineRequest

_seq_ids = itertools.count()


def next_seq_id() -> int:
    """A new sequence id: one id space for every sequence of every kind (block tables are
    keyed by it)."""
    return next(_seq_ids)


class CoreRequest:
    def __init__(self, source: EngineRequest) -> None:
        self.source = source
        self.request_id = source.request_id
        self.prompt_token_ids = list(source.prompt_token_ids)
        self.priority = source.priority
        self.tenant = source.tenant
        self.cache_salt = source.cache_salt
        self.lora_id = source.lora_id
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None

    def mark_first_token(self) -> None:
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()

    def core_output(self, index: int = 0, **fields: Any) -> EngineCoreOutput:
        """An ``EngineCoreOutput`` of sample ``index`` carrying what the core learned so far."""
        return EngineCoreOutput(self.request_id, index, num_cached_tokens=self.num_cached_tokens,
                                first_scheduled_time=self.first_scheduled_time,
                                first_token_time=self.first_token_time, **fields)
