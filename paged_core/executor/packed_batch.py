"""``PackedBatch``: one step's scheduled sequences as flat host (numpy) arrays.

Built by :func:`pack_batch` from the scheduler's list of :class:`StepInput`.
Layout (the same as :class:`~paged_core.attention.AttentionMetadata`):

- the new tokens of every sequence back to back: sequence ``i`` owns rows
  ``query_start_loc[i]:query_start_loc[i + 1]`` of ``input_ids``/``positions``/``slot_mapping``;
- rows from ``num_tokens`` to ``len(input_ids)`` are padding (a batch rounded up to
  a bucketed size): token 0, position 0, slot ``-1`` (nothing is written);
- ``block_tables`` is ``[num_seqs, max blocks of any sequence]``, rows padded with 0;
- ``rope_rows`` are the rows of the model's rotary tables each token reads: its position,
  plus ``long_rope_rows`` for every token of a sequence ``rotated_long`` (LongRoPE's long
  factors, ``models.layers.RotaryEmbedding``); the same array as ``positions`` otherwise;
- ``lora_slots`` is each row's LoRA slot (``None`` when no sequence runs an adapter) and
  ``lora_loads`` the ``(slot, LoRARequest)`` assignments to apply before the step;
- ``ahead`` (``schedule_ahead`` only) names the rows whose token the previous step sampled
  and the host does not know yet (``ahead_tokens``): the runner writes them on the device;
- ``logits_indices`` are the rows whose logits are sampled (the last new token of
  each sequence whose known tokens are all computed after this step; with ``k``
  draft tokens, its last ``k + 1`` new tokens, in order); the runner returns logits
  in that order, and ``first_logits_row[i]`` is where sequence ``i``'s start in them
  (``-1``: it samples nothing this step). This is the one place the logits layout is
  computed.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .ahead_tokens import AheadTokens


@dataclass
class StepInput:
    """One scheduled sequence as the runner needs it."""

    token_ids: list[int]  # the sequence's tokens so far (only new ones are read)
    num_computed_tokens: int
    num_new_tokens: int
    block_ids: list[int]
    needs_logits: bool
    num_spec_tokens: int = 0  # drafts at the end of the new tokens: logits at 1 + this many rows
    rotated_long: bool = False  # LongRoPE: its keys are rotated with the long factors
    lora_slot: int = -1  # the LoRA slot of its adapter (-1: the base model)


@dataclass
class PackedBatch:
    input_ids: np.ndarray  # [padded] int64
    positions: np.ndarray  # [padded] int64
    slot_mapping: np.ndarray  # [padded] int64, -1 for padding rows
    block_tables: np.ndarray  # [num_seqs, max_blocks] int32
    seq_lens: np.ndarray  # [num_seqs] int32, context after this step
    query_lens: np.ndarray  # [num_seqs] int64
    query_start_loc: np.ndarray  # [num_seqs + 1] int32
    logits_indices: np.ndarray  # [num sampled rows] int64
    first_logits_row: np.ndarray  # [num_seqs] int64, -1 for a sequence that samples nothing
    num_tokens: int  # real (unpadded) tokens
    rope_rows: np.ndarray | None = None  # [padded] int64; None: the positions
    lora_slots: np.ndarray | None = None  # [padded] int64 LoRA slot per row (-1: none)
    lora_loads: tuple = ()  # (slot, LoRARequest): adapters to copy in before this step
    ahead: AheadTokens | None = None  # rows whose token the device still has to fill in

    def __post_init__(self) -> None:
        if self.rope_rows is None:
            self.rope_rows = self.positions

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def max_query_len(self) -> int:
        return int(self.query_lens.max())

    @property
    def is_decode_only(self) -> bool:
        """Every sequence computes exactly one new token (and there is no padding)."""
        return self.num_tokens == self.num_seqs == len(self.input_ids)


def bucketed_num_tokens(num_tokens: int) -> int:
    """Round up to a power of two up to 8, a multiple of 8 up to 256, then of 1/32 of the
    next power of two: under 8 padding rows up to 256 tokens, under 6.3% above; 83
    buckets up to 2048 tokens. Single-sequence decode (1 token) is never padded.
    """
    if num_tokens <= 8:
        return 1 << max(0, (num_tokens - 1).bit_length())
    step = max(8, 1 << max(0, (num_tokens - 1).bit_length() - 5))
    return -(-num_tokens // step) * step


def pack_batch(batch: list[StepInput], block_size: int, bucketed: bool = False,
               long_rope_rows: int = 0) -> PackedBatch:
    """Flatten a step; with ``bucketed`` the token rows are padded to ``bucketed_num_tokens``;
    ``long_rope_rows``: where the rotary tables' long-factor rows start (LongRoPE only)."""
    qlens = np.fromiter((s.num_new_tokens for s in batch), dtype=np.int64, count=len(batch))
    starts = np.fromiter((s.num_computed_tokens for s in batch), dtype=np.int64, count=len(batch))
    seq_lens = starts + qlens
    query_start_loc = np.zeros(len(batch) + 1, dtype=np.int64)
    np.cumsum(qlens, out=query_start_loc[1:])
    num_tokens = int(query_start_loc[-1])
    padded = bucketed_num_tokens(num_tokens) if bucketed else num_tokens

    input_ids = np.zeros(padded, dtype=np.int64)
    input_ids[:num_tokens] = np.fromiter(
        chain.from_iterable(s.token_ids[s.num_computed_tokens:s.num_computed_tokens
                                        + s.num_new_tokens] for s in batch),
        dtype=np.int64, count=num_tokens)
    block_tables = _block_tables(batch)
    rows = np.repeat(np.arange(len(batch)), qlens)
    positions = np.zeros(padded, dtype=np.int64)
    positions[:num_tokens] = np.arange(num_tokens) - query_start_loc[:-1][rows] + starts[rows]
    real = positions[:num_tokens]
    slot_mapping = np.full(padded, -1, dtype=np.int64)
    slot_mapping[:num_tokens] = block_tables[rows, real // block_size].astype(np.int64) * block_size \
        + real % block_size
    num_logits = np.fromiter(((1 + s.num_spec_tokens) * s.needs_logits for s in batch),
                             dtype=np.int64, count=len(batch))
    first_logit_row = np.repeat(query_start_loc[1:] - num_logits, num_logits)
    within = np.arange(len(first_logit_row)) - np.repeat(np.cumsum(num_logits) - num_logits,
                                                         num_logits)
    return PackedBatch(
        input_ids=input_ids, positions=positions, slot_mapping=slot_mapping,
        block_tables=block_tables, seq_lens=seq_lens.astype(np.int32), query_lens=qlens,
        query_start_loc=query_start_loc.astype(np.int32),
        logits_indices=first_logit_row + within,
        first_logits_row=np.where(num_logits > 0, np.cumsum(num_logits) - num_logits, -1),
        num_tokens=num_tokens, rope_rows=_rope_rows(batch, positions, rows, long_rope_rows),
        lora_slots=_lora_slots(batch, rows, padded))


def _block_tables(batch: list[StepInput]) -> np.ndarray:
    """``[num_seqs, max blocks]`` int32: each sequence's block ids, then zeros."""
    counts = np.fromiter((len(s.block_ids) for s in batch), dtype=np.int64, count=len(batch))
    tables = np.zeros((len(batch), int(counts.max())), dtype=np.int32)
    filled = np.arange(tables.shape[1]) < counts[:, None]  # row-major: each row's ids in order
    tables[filled] = np.fromiter(chain.from_iterable(s.block_ids for s in batch),
                                 dtype=np.int32, count=int(counts.sum()))
    return tables


def _lora_slots(batch: list[StepInput], rows: np.ndarray, padded: int) -> np.ndarray | None:
    """Each row's LoRA slot (-1: the base model, and padding); None when no row has one."""
    slots = np.fromiter((s.lora_slot for s in batch), dtype=np.int64, count=len(batch))
    if not (slots >= 0).any():
        return None
    per_row = np.full(padded, -1, dtype=np.int64)
    per_row[:len(rows)] = slots[rows]
    return per_row


def _rope_rows(batch: list[StepInput], positions: np.ndarray, rows: np.ndarray,
               long_rope_rows: int) -> np.ndarray:
    """Each token's rotary table row: its position, in the long factors' rows for a sequence
    ``rotated_long``."""
    if not long_rope_rows:
        return positions
    rotated = np.fromiter((s.rotated_long for s in batch), dtype=bool, count=len(batch))
    rope_rows = positions.copy()
    rope_rows[:len(rows)] += long_rope_rows * rotated[rows]
    return rope_rows
