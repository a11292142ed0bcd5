"""Greedy speculative decoding is exact: token for token (fp32) the output of plain decoding,
with n-gram drafts and with a draft model, in batches where some sequences have drafts and
others not, under chunked prefill and preemption, with prefix-cache hits, and with stop
tokens, stop strings, ``max_tokens`` landing mid-proposal, penalties, logit_bias,
allowed_token_ids, bad_words and logprobs."""
import math

import pytest

from paged_core import LLM, SamplingParams

from .narrow_models import narrow_prompts

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
         "prompt_lookup_min": 2}
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
PROMPTS = narrow_prompts([5, 20, 40, 3, 33])


@pytest.fixture(scope="module")
def plain(target):
    return LLM(model=target, dtype="float32", num_kv_blocks=64)


@pytest.fixture(scope="module")
def ngram(target):
    return LLM(model=target, dtype="float32", num_kv_blocks=64, speculative_config=NGRAM)


def _run(llm, prompts, params):
    return llm.generate(prompts, params, use_tqdm=False)


def _assert_same(ours, theirs, logprobs=False):
    for a, b in zip(ours, theirs, strict=True):
        for x, y in zip(a.outputs, b.outputs, strict=True):
            assert (x.token_ids, x.text, x.finish_reason, x.stop_reason) == \
                (y.token_ids, y.text, y.finish_reason, y.stop_reason)
            if logprobs:
                assert len(x.logprobs) == len(y.logprobs) == len(x.token_ids)
                for step_x, step_y in zip(x.logprobs, y.logprobs):
                    assert step_x.keys() == step_y.keys()
                    for tid in step_x:
                        assert step_x[tid].rank == step_y[tid].rank
                        assert math.isclose(step_x[tid].logprob, step_y[tid].logprob, abs_tol=1e-4)


def _record_mixed_steps(llm):
    """Wrap the proposer: count steps where some running sequences got drafts and some not."""
    proposer, mixed = llm.engine.core.speculation.proposer, []

    def propose(seqs):
        proposer.__class__.propose(proposer, seqs)
        with_drafts = {bool(s.spec_token_ids) for s in seqs}
        mixed.append(with_drafts == {True, False})
    proposer.propose = propose
    return mixed


def test_ngram_greedy_equals_plain_decoding_in_mixed_batches(plain, ngram):
    expected = _run(plain, PROMPTS, GREEDY)
    mixed = _record_mixed_steps(ngram)
    try:
        _assert_same(_run(ngram, PROMPTS, GREEDY), expected)
    finally:
        del ngram.engine.core.speculation.proposer.propose
    stats = ngram.stats()
    assert any(mixed), "no step mixed sequences with and without drafts"
    assert 0 < stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"]
    assert stats["spec_decode_mean_acceptance_length"] > 1
    assert stats["kv_blocks_used"] == 0
    # Again: the prompts' full blocks now come from the prefix cache (hashes cover accepted tokens).
    hits = stats["prefix_cache_hits"]
    _assert_same(_run(ngram, PROMPTS, GREEDY), expected)
    assert ngram.stats()["prefix_cache_hits"] > hits


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=7, ignore_eos=True),
    SamplingParams(temperature=0, max_tokens=13, ignore_eos=True, logprobs=2),
    SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[1023], min_tokens=3),
    SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[1011, 1029]),
    SamplingParams(temperature=0, max_tokens=40, repetition_penalty=1.3, presence_penalty=0.4,
                   frequency_penalty=0.3),
    SamplingParams(temperature=0, max_tokens=20, n=2, ignore_eos=True),
    SamplingParams(temperature=0, max_tokens=30, ignore_eos=True,
                   logit_bias={1003: 1.5, 1011: -2.0, 1020: 0.7}),
    SamplingParams(temperature=0, max_tokens=30, ignore_eos=True,
                   allowed_token_ids=list(range(1000, 1016))),
], ids=["max7", "max13-logprobs", "stop-token-min-tokens", "stop-tokens", "penalties", "n2",
        "logit-bias", "allowed-token-ids"])
def test_ngram_matches_plain_decoding_for_each_stop_rule(plain, ngram, params):
    _assert_same(_run(ngram, PROMPTS, params), _run(plain, PROMPTS, params),
                 logprobs=params.logprobs is not None)


def test_bad_words_hold_under_drafts(plain, ngram, tokenizer):
    """A bad word's spelling is banned at every draft position verified, as without drafts."""
    free = _run(plain, PROMPTS, GREEDY)[1].outputs[0].token_ids
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                            bad_words=[tokenizer.decode(free[6:8]).strip()])
    banned = _run(plain, PROMPTS, params)
    assert banned[1].outputs[0].token_ids != free
    _assert_same(_run(ngram, PROMPTS, params), banned)


def test_stop_strings_cut_inside_an_accepted_run(plain, ngram, tokenizer):
    expected_ids = _run(plain, PROMPTS, GREEDY)[2].outputs[0].token_ids
    stop = tokenizer.decode(expected_ids[17:19])  # a string that first appears mid-output
    for include in (False, True):
        params = SamplingParams(temperature=0, max_tokens=40, stop=[stop],
                                include_stop_str_in_output=include)
        _assert_same(_run(ngram, PROMPTS, params), _run(plain, PROMPTS, params))


def test_ngram_under_preemption_and_chunked_prefill(target, plain):
    llm = LLM(model=target, dtype="float32", num_kv_blocks=12, block_size=8,
              max_num_batched_tokens=16, speculative_config=NGRAM)
    prompts = PROMPTS[:3]
    _assert_same(_run(llm, prompts, GREEDY), _run(plain, prompts, GREEDY))
    stats = llm.stats()
    assert stats["num_preemptions"] > 0 and stats["spec_decode_num_accepted_tokens"] > 0
    assert stats["kv_blocks_used"] == 0


def test_draft_model_greedy_equals_plain_decoding(target, draft, plain):
    llm = LLM(model=target, dtype="float32", num_kv_blocks=12, block_size=8,
              max_num_batched_tokens=24,
              speculative_config={"model": draft, "num_speculative_tokens": 3})
    prompts = PROMPTS[:3]
    _assert_same(_run(llm, prompts, GREEDY), _run(plain, prompts, GREEDY))
    stats = llm.stats()
    assert stats["num_preemptions"] > 0
    assert 0 < stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"]
    assert stats["kv_blocks_used"] == 0
    assert llm.engine.core.speculation.proposer.kv.stats()["kv_blocks_used"] == 0  # the draft's cache too


def test_draft_model_must_share_the_vocabulary(target, tmp_path):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(target).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"speculative_config\['model'\] has vocab_size 100"):
        LLM(model=target, dtype="float32", num_kv_blocks=8,
            speculative_config={"model": str(tmp_path), "num_speculative_tokens": 2})


def test_prometheus_exports_the_spec_decode_counters(ngram):
    from paged_core.openai.metrics import ServingMetrics

    text = ServingMetrics(ngram.stats).render().decode()
    for name in ("spec_decode_num_drafts", "spec_decode_num_draft_tokens",
                 "spec_decode_num_accepted_tokens", "spec_decode_mean_acceptance_length"):
        assert f"paged_core_{name}" in text


async def test_async_engine_streams_accepted_runs_as_deltas(target, plain):
    """Streaming under speculation: a step may add several tokens; the deltas still add up."""
    from paged_core import AsyncEngine, EngineConfig

    engine = AsyncEngine(EngineConfig(model=target, dtype="float32", num_kv_blocks=64,
                                      speculative_config=NGRAM))
    try:
        params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
        expected = _run(plain, PROMPTS[2], params)[0].outputs[0]
        deltas, text, last = [], "", None
        async for out in engine.generate(PROMPTS[2], params, request_id="spec-stream"):
            deltas.append(len(out.outputs[0].delta_token_ids))
            text += out.outputs[0].delta_text
            last = out
        assert last.finished and last.outputs[0].token_ids == expected.token_ids
        assert text == expected.text and sum(deltas) == len(expected.token_ids)
        assert max(deltas) > 1  # accepted drafts arrive together
    finally:
        engine.shutdown_sync()
