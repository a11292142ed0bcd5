"""Per-sequence state shared by the scheduler, the block manager and the engine (no torch).

A request with ``n`` samples owns ``n`` sequences once its prompt is prefilled;
before that it has a single one. ``num_computed_tokens`` is the one scheduling
invariant: it counts tokens whose K/V are in the cache and catches up to
``num_tokens`` step by step (prefill and decode are not separate phases).

Under ``schedule_ahead`` a sequence whose next token is still on its way from the device
holds ``PLACEHOLDER`` for it at the end of ``token_ids`` (``num_placeholders`` of them, at
most two: the token of the step finishing and of the step launched after it), so that the
next step can be scheduled; the oldest placeholder is replaced by the token when it arrives
(``Request.append_token``). Only the first ``num_known_tokens`` are ever hashed or read as
text.
"""
from __future__ import annotations

import enum
import json
from typing import Protocol


class SequenceOwner(Protocol):
    """What the core reads of the request that owns a sequence (``Request`` and
    ``BeamSearchRequest`` both qualify): its id, and the fields the waiting queue
    and the preemption victim choice are keyed by (``engine.core_request.CoreRequest``)."""

    request_id: str
    priority: int
    tenant: str | None


PLACEHOLDER = -1  # a token id not yet known on the host (``schedule_ahead``)


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """One stream of tokens: the prompt followed by what was generated for it."""

    def __init__(self, seq_id: int, request: SequenceOwner, token_ids: list[int],
                 num_prompt_tokens: int, sample_index: int, cache_salt: str | None = None,
                 lora_id: int | None = None) -> None:
        self.seq_id = seq_id
        self.request = request
        self.token_ids = token_ids
        self.num_prompt_tokens = num_prompt_tokens
        self.sample_index = sample_index
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache at admission
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        # Hashes of this sequence's full blocks (chained from ``block_hash_salt``); extended as
        # it grows.
        self.cache_salt = cache_salt
        self.lora_id = lora_id  # the LoRA adapter it runs under (None: the base model)
        self.block_hashes: list[bytes] = []
        # LongRoPE: its keys are (to be) rotated with the long factors (set by the engine core)
        self.rotated_long = False
        # Draft tokens proposed for the next step (speculative decoding); never in token_ids.
        self.spec_token_ids: list[int] = []
        # schedule_ahead: placeholders ending token_ids, and the row of the newest one's token
        # in its step's sampled tokens (where the next step's runner reads it)
        self.num_placeholders = 0
        self.placeholder_row = -1

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_known_tokens(self) -> int:
        """Its tokens whose ids the host has (all but the placeholders)."""
        return len(self.token_ids) - self.num_placeholders

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def block_hash_salt(self) -> str | None:
        """What its block hashes chain from: its request's ``cache_salt``, marked when its keys
        are rotated with LongRoPE's long factors and with its LoRA adapter (its blocks are then
        shared only with sequences alike)."""
        marks = (["long-rope"] if self.rotated_long else []) + \
            ([f"lora:{self.lora_id}"] if self.lora_id is not None else [])
        return json.dumps([self.cache_salt, *marks]) if marks else self.cache_salt

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def __repr__(self) -> str:
        return (f"Sequence({self.seq_id}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, {self.status.value})")
