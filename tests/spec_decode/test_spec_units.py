"""Speculative decoding pieces without a model: config validation, the n-gram lookup, logits
rows of a verify span, draft scheduling under the token budget and the block limit, rollback
of rejected draft slots, acceptance counting and the counters."""
import json

import pytest

from paged_core import EngineConfig
from paged_core.core.kv_cache_manager import KVCacheManager
from paged_core.executor.packed_batch import StepInput, pack_batch
from paged_core.core.scheduler import Scheduler
from paged_core.core.sequence import Sequence
from paged_core.spec_decode import SpeculativeConfig
from paged_core.spec_decode.metrics import SpecDecodingStats
from paged_core.spec_decode.ngram_proposer import NgramProposer
from paged_core.spec_decode.rejection_sampler import num_accepted

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
         "prompt_lookup_min": 2}


def test_ngram_config_and_vllm_defaults():
    cfg = SpeculativeConfig.from_value(NGRAM)
    assert (cfg.method, cfg.num_speculative_tokens, cfg.prompt_lookup_min,
            cfg.prompt_lookup_max) == ("ngram", 4, 2, 4)
    only_max = SpeculativeConfig.from_value({"method": "ngram", "num_speculative_tokens": 2,
                                             "prompt_lookup_max": 3})
    assert (only_max.prompt_lookup_min, only_max.prompt_lookup_max) == (3, 3)
    neither = SpeculativeConfig.from_value({"model": "[ngram]", "num_speculative_tokens": 2})
    assert (neither.method, neither.prompt_lookup_min, neither.prompt_lookup_max) == ("ngram", 5, 5)
    assert SpeculativeConfig.from_value(json.dumps(NGRAM)) == cfg
    assert SpeculativeConfig.from_value(None) is None and SpeculativeConfig.from_value({}) is None


def test_draft_model_config(tmp_path):
    cfg = SpeculativeConfig.from_value({"model": str(tmp_path), "num_speculative_tokens": 3})
    assert (cfg.method, cfg.model) == ("draft_model", str(tmp_path))
    same = SpeculativeConfig.from_value({"method": "draft_model", "model": str(tmp_path),
                                         "num_speculative_tokens": 3})
    assert same == cfg


@pytest.mark.parametrize("value, key", [
    ({**NGRAM, "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({**NGRAM, "num_speculative_tokens": True}, "num_speculative_tokens"),
    ({"method": "ngram"}, "num_speculative_tokens"),
    ({**NGRAM, "prompt_lookup_min": 5}, "prompt_lookup_min"),
    ({**NGRAM, "prompt_lookup_max": -1}, "prompt_lookup_max"),
    ({**NGRAM, "method": "eagle7"}, "method"),
    ({**NGRAM, "draft_tokens": 3}, "draft_tokens"),
    ({"model": "/no/such/folder", "num_speculative_tokens": 2}, "model"),
    ({"num_speculative_tokens": 2}, "method"),
    ("{not json", "speculative_config"),
    ([1, 2], "speculative_config"),
])
def test_bad_values_name_the_key(value, key):
    with pytest.raises(ValueError, match=key):
        SpeculativeConfig.from_value(value)
    with pytest.raises(ValueError, match=key):
        EngineConfig(speculative_config=value)


def test_draft_model_needs_a_single_rank(tmp_path):
    with pytest.raises(ValueError, match="tensor_parallel_size=1"):
        EngineConfig(tensor_parallel_size=2,
                     speculative_config={"model": str(tmp_path), "num_speculative_tokens": 2})


def test_engine_config_reads_json_from_the_environment():
    config = EngineConfig.from_env({"PAGED_CORE_SPECULATIVE_CONFIG": json.dumps(NGRAM)})
    assert config.speculative_config == SpeculativeConfig.from_value(NGRAM)


def test_ngram_lookup_longest_match_then_earliest_occurrence():
    p = NgramProposer(SpeculativeConfig.from_value(NGRAM), max_total_tokens=1000)
    assert p.propose_tokens([1, 2, 3, 4, 1, 2, 3]) == [4, 1, 2, 3]
    assert p.propose_tokens([1, 2, 3, 4, 2, 3]) == [4, 2, 3]  # fewer followers than k
    # [2, 3] occurs twice, [7, 2, 3] once: the longer match wins.
    assert p.propose_tokens([2, 3, 9, 7, 2, 3, 5, 6, 7, 2, 3]) == [5, 6, 7, 2]
    # Equal lengths: the earliest occurrence, as in vLLM.
    assert p.propose_tokens([8, 2, 3, 9, 2, 3, 5, 2, 3]) == [9, 2, 3, 5]
    assert p.propose_tokens([1, 2, 3, 4, 1, 2, 3], k=2) == [4, 1]
    assert p.propose_tokens([1, 2, 3, 4, 5, 3]) == []  # a 1-gram is shorter than prompt_lookup_min
    assert p.propose_tokens([1, 2]) == []


def test_ngram_propose_sets_drafts_only_for_decodes_within_the_context():
    p = NgramProposer(SpeculativeConfig.from_value(NGRAM), max_total_tokens=10)
    decode, prefill, near_end = (Sequence(i, None, [1, 2, 3, 1, 2], 3, 0) for i in range(3))
    decode.num_computed_tokens = 4
    prefill.num_computed_tokens = 2
    near_end.token_ids = [1, 2, 3, 1, 2, 3, 1, 2]
    near_end.num_computed_tokens = 7
    p.propose([decode, prefill, near_end])
    assert decode.spec_token_ids == [3, 1, 2]
    assert prefill.spec_token_ids == []
    assert near_end.spec_token_ids == [3]  # positions 8 only: room for 10 - 8 - 1 drafts


def test_pack_batch_returns_logits_for_every_verified_position():
    batch = [StepInput(list(range(10)), 9, 1, [0], needs_logits=True),
             StepInput(list(range(12)), 8, 4, [1], needs_logits=True, num_spec_tokens=3),
             StepInput(list(range(30)), 0, 5, [2, 3], needs_logits=False),
             StepInput(list(range(9)), 6, 3, [4], needs_logits=True, num_spec_tokens=2)]
    packed = pack_batch(batch, block_size=16, bucketed=True)
    assert packed.logits_indices.tolist() == [0, 1, 2, 3, 4, 10, 11, 12]
    # where each sequence's rows start among the logits (the prefill chunk samples nothing)
    assert packed.first_logits_row.tolist() == [0, 1, -1, 5]
    assert packed.input_ids[1:5].tolist() == [8, 9, 10, 11]
    assert packed.positions[10:13].tolist() == [6, 7, 8]
    assert packed.input_ids[10:13].tolist() == [6, 7, 8]
    assert packed.block_tables.tolist() == [[0, 0], [1, 0], [2, 3], [4, 0]]


def _decoding(seq_id, kv, sched, num_tokens, drafts):
    seq = Sequence(seq_id, None, list(range(num_tokens)), num_tokens - 1, 0)
    sched.add(seq)
    sched.schedule()
    seq.num_computed_tokens = num_tokens - 1
    seq.spec_token_ids = list(drafts)
    return seq


def test_scheduler_gives_drafts_tokens_then_trims_them_to_the_budget():
    kv = KVCacheManager(100, 4, False)
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=7)
    a = _decoding(1, kv, sched, 6, [7, 8, 9])
    b = _decoding(2, kv, sched, 6, [7, 8, 9])
    out = sched.schedule()
    assert [(s.seq, s.num_new_tokens) for s in out.scheduled] == [(a, 4), (b, 3)]
    assert a.spec_token_ids == [7, 8, 9] and b.spec_token_ids == [7, 8]
    assert len(kv.block_ids(a)) == 3  # 5 computed + 4 new tokens in blocks of 4


def test_drafts_are_dropped_before_anyone_is_preempted():
    kv = KVCacheManager(3, 4, False)
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=64)
    a = _decoding(1, kv, sched, 4, [])
    b = _decoding(2, kv, sched, 4, [5, 6, 7, 8, 9])  # would need 2 more blocks, only 1 is free
    out = sched.schedule()
    assert [(s.seq, s.num_new_tokens) for s in out.scheduled] == [(a, 1), (b, 1)]
    assert b.spec_token_ids == [] and not out.preempted and sched.num_preemptions == 0


def test_preemption_clears_drafts():
    kv = KVCacheManager(2, 4, False)
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=64)
    a = _decoding(1, kv, sched, 4, [])
    b = _decoding(2, kv, sched, 4, [5])
    a.token_ids.append(9)  # a crosses into a new block: nothing is left, b is preempted
    out = sched.schedule()
    assert out.preempted == [b] and b.spec_token_ids == [] and b.num_computed_tokens == 0


def test_rejected_draft_slots_free_their_blocks_tail_first():
    kv = KVCacheManager(8, 4, True)
    seq = Sequence(1, None, list(range(6)), 6, 0)
    assert kv.allocate_slots(seq, 6)
    seq.num_computed_tokens = 6
    seq.token_ids.append(6)
    assert kv.allocate_slots(seq, 1 + 4)  # the new token and 4 drafts: positions 6..10, 3 blocks
    table = kv.block_ids(seq)
    assert len(table) == 3
    seq.num_computed_tokens = 7  # one draft accepted: tokens 0..6 computed, 7 pending
    seq.token_ids.append(7)
    kv.free_blocks_past_computed(seq)
    assert kv.block_ids(seq) == table[:2]
    assert kv.pool.num_free_blocks == 6 and kv.stats()["kv_blocks_cached"] == 0
    # The freed block (never hashed) is the next one handed out after the untouched ones.
    assert kv.pool.blocks[table[2]].block_hash is None


def test_acceptance_counting_and_counters():
    assert num_accepted([5, 6, 7], [5, 6, 9, 1]) == 2
    assert num_accepted([5, 6, 7], [4, 6, 7, 1]) == 0
    assert num_accepted([5, 6], [5, 6, 3]) == 2
    assert num_accepted([], [3]) == 0
    stats = SpecDecodingStats(3)
    stats.observe(3, 2)
    stats.observe(3, 0)
    stats.observe(0, 0)  # a step without drafts is not a draft
    assert stats.num_accepted_tokens_per_pos == [1, 1, 0]
    assert stats.snapshot().as_dict() == {
        "spec_decode_num_drafts": 2, "spec_decode_num_draft_tokens": 6,
        "spec_decode_num_accepted_tokens": 2, "spec_decode_mean_acceptance_length": 2.0,
        "spec_decode_draft_acceptance_rate": 2 / 6}
