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
    ``long_rope_rows``: where the rotary tables' long-factor rows start (LongRoPE only).

    Built in one pass over the sequences into Python lists, then one array per field: a step
    runs right after a forward that streamed the weights through every cache, so each numpy
    call here starts cold (10-30 us on an AMD EPYC Zen 4, against ~1 us warm); a one-sequence
    decode step packed in 46 against 231 us with a dozen numpy operations per field."""
    query_lens, seq_lens, query_start_loc = [], [], [0]
    input_ids, positions, slot_mapping, logits_indices, first_logits_row = [], [], [], [], []
    for s in batch:
        start, count, blocks = s.num_computed_tokens, s.num_new_tokens, s.block_ids
        end = start + count
        query_lens.append(count)
        seq_lens.append(end)
        input_ids += s.token_ids[start:end]
        positions += range(start, end)
        slot_mapping += [blocks[p // block_size] * block_size + p % block_size
                         for p in range(start, end)]
        sampled = (1 + s.num_spec_tokens) * s.needs_logits  # its last rows
        first_logits_row.append(len(logits_indices) if sampled else -1)
        rows_end = query_start_loc[-1] + count
        logits_indices += range(rows_end - sampled, rows_end)
        query_start_loc.append(rows_end)
    num_tokens = query_start_loc[-1]
    padded = bucketed_num_tokens(num_tokens) if bucketed else num_tokens
    padding = padded - num_tokens
    qlens = np.array(query_lens, dtype=np.int64)
    positions_array = np.array(positions + [0] * padding, dtype=np.int64)
    lora = any(s.lora_slot >= 0 for s in batch)
    # each token's sequence, for what differs by sequence (LongRoPE rows, LoRA slots)
    rows = np.repeat(np.arange(len(batch)), qlens) if long_rope_rows or lora else None
    return PackedBatch(
        input_ids=np.array(input_ids + [0] * padding, dtype=np.int64),
        positions=positions_array,
        slot_mapping=np.array(slot_mapping + [-1] * padding, dtype=np.int64),
        block_tables=_block_tables(batch), seq_lens=np.array(seq_lens, dtype=np.int32),
        query_lens=qlens, query_start_loc=np.array(query_start_loc, dtype=np.int32),
        logits_indices=np.array(logits_indices, dtype=np.int64),
        first_logits_row=np.array(first_logits_row, dtype=np.int64), num_tokens=num_tokens,
        rope_rows=_rope_rows(batch, positions_array, rows, long_rope_rows),
        lora_slots=_lora_slots(batch, rows, padded) if lora else None)


def _block_tables(batch: list[StepInput]) -> np.ndarray:
    """``[num_seqs, max blocks]`` int32: each sequence's block ids, then zeros."""
    width = max(len(s.block_ids) for s in batch)
    return np.array([s.block_ids + [0] * (width - len(s.block_ids)) for s in batch],
                    dtype=np.int32)


def _lora_slots(batch: list[StepInput], rows: np.ndarray, padded: int) -> np.ndarray:
    """Each row's LoRA slot (-1: the base model, and padding), for a step where some sequence
    runs an adapter."""
    slots = np.fromiter((s.lora_slot for s in batch), dtype=np.int64, count=len(batch))
    per_row = np.full(padded, -1, dtype=np.int64)
    per_row[:len(rows)] = slots[rows]
    return per_row


def _rope_rows(batch: list[StepInput], positions: np.ndarray, rows: np.ndarray | None,
               long_rope_rows: int) -> np.ndarray:
    """Each token's rotary table row: its position, in the long factors' rows for a sequence
    ``rotated_long`` (``rows``, each token's sequence, is given wherever ``long_rope_rows``
    is)."""
    if not long_rope_rows:
        return positions
    rotated = np.fromiter((s.rotated_long for s in batch), dtype=bool, count=len(batch))
    rope_rows = positions.copy()
    rope_rows[:len(rows)] += long_rope_rows * rotated[rows]
    return rope_rows
