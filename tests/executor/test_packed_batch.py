"""``pack_batch``: a step's sequences as the flat arrays the runner reads (the layout in
``executor/packed_batch.py``'s module doc), field by field, for a step that mixes a decode, a
decode with drafts, a prompt chunk crossing a block boundary that samples nothing, and the
last chunk of a prompt; padded to a bucket, with LoRA slots and LongRoPE rows."""
import numpy as np

from paged_core.executor.packed_batch import StepInput, bucketed_num_tokens, pack_batch

BLOCK = 4


def mixed_step(extra: dict[int, dict] | None = None) -> list[StepInput]:
    """Tokens are 100 + position, so a row's token says which position it holds; ``extra``:
    more fields of sequence i."""
    extra = extra or {}
    def tokens(n):
        return [100 + p for p in range(n)]
    return [StepInput(tokens(7), 6, 1, [5, 9], needs_logits=True, **extra.get(0, {})),
            StepInput(tokens(9), 6, 3, [2, 7, 8], needs_logits=True, num_spec_tokens=2,
                      **extra.get(1, {})),
            StepInput(tokens(20), 2, 5, [3, 4], needs_logits=False, **extra.get(2, {})),
            StepInput(tokens(3), 0, 3, [6], needs_logits=True, **extra.get(3, {}))]


def test_every_field_of_a_mixed_padded_step():
    packed = pack_batch(mixed_step(), BLOCK, bucketed=True)
    real = 1 + 3 + 5 + 3
    padded = bucketed_num_tokens(real)
    assert packed.num_tokens == real and padded > real
    positions = [6, 6, 7, 8, 2, 3, 4, 5, 6, 0, 1, 2]
    assert packed.positions.tolist() == positions + [0] * (padded - real)
    assert packed.input_ids.tolist() == [100 + p for p in positions] + [0] * (padded - real)
    # each token's slot: its block (position // 4 in the sequence's table) * 4 + position % 4
    slots = [9 * 4 + 2, 7 * 4 + 2, 7 * 4 + 3, 8 * 4 + 0, 3 * 4 + 2, 3 * 4 + 3, 4 * 4 + 0,
             4 * 4 + 1, 4 * 4 + 2, 6 * 4 + 0, 6 * 4 + 1, 6 * 4 + 2]
    assert packed.slot_mapping.tolist() == slots + [-1] * (padded - real)
    assert packed.block_tables.tolist() == [[5, 9, 0], [2, 7, 8], [3, 4, 0], [6, 0, 0]]
    assert packed.seq_lens.tolist() == [7, 9, 7, 3]
    assert packed.query_lens.tolist() == [1, 3, 5, 3]
    assert packed.query_start_loc.tolist() == [0, 1, 4, 9, 12]
    # the decode's row, all three of the drafted sequence's, none of the chunk's, the last row
    assert packed.logits_indices.tolist() == [0, 1, 2, 3, 11]
    assert packed.first_logits_row.tolist() == [0, 1, -1, 4]
    assert packed.rope_rows is packed.positions and packed.lora_slots is None
    assert packed.max_query_len == 5 and not packed.is_decode_only
    expected_types = {"input_ids": np.int64, "positions": np.int64, "slot_mapping": np.int64,
                      "block_tables": np.int32, "seq_lens": np.int32, "query_lens": np.int64,
                      "query_start_loc": np.int32, "logits_indices": np.int64,
                      "first_logits_row": np.int64}
    for name, dtype in expected_types.items():
        assert getattr(packed, name).dtype == dtype, name


def test_a_decode_step_is_unpadded_and_samples_every_row_in_order():
    batch = [StepInput([1, 2, 3], 2, 1, [0], needs_logits=True),
             StepInput([4, 5, 6, 7, 8], 4, 1, [1, 2], needs_logits=True)]
    packed = pack_batch(batch, BLOCK, bucketed=True)
    assert packed.is_decode_only and packed.input_ids.tolist() == [3, 8]
    assert packed.slot_mapping.tolist() == [2, 2 * 4 + 0]
    assert packed.logits_indices.tolist() == [0, 1]


def test_lora_slots_and_long_rope_rows_follow_each_token_sequence():
    extra = {0: {"lora_slot": 2}, 1: {"rotated_long": True}, 3: {"lora_slot": 0,
                                                                 "rotated_long": True}}
    packed = pack_batch(mixed_step(extra), BLOCK, bucketed=True, long_rope_rows=1000)
    padded = len(packed.input_ids)
    assert packed.lora_slots.tolist() == [2] + [-1] * 8 + [0] * 3 + [-1] * (padded - 12)
    long = [0, 1000, 1000, 1000, 0, 0, 0, 0, 0, 1000, 1000, 1000] + [0] * (padded - 12)
    assert packed.rope_rows.tolist() == (packed.positions + np.array(long)).tolist()
    assert pack_batch(mixed_step(), BLOCK, long_rope_rows=1000).rope_rows.tolist() == \
        packed.positions[:12].tolist()
