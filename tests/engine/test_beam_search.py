"""Beam search inside the engine: token-for-token parity with transformers' ``generate(num_beams=k)``
(fp32, tiny random Llama and the embedded model, k = 1, 2, 4, 8), with EOS, ``length_penalty``
and ``early_stopping``; blocks shared between beams and freed at once; preemption; the
``priority`` policy and tenant fairness; validation."""
import asyncio
import json
import os
import shutil
from collections import Counter

import pytest
import torch

from paged_core import AsyncEngine, BeamSearchParams, EngineConfig, LLM, SamplingParams
from paged_core.requests.beam_search_request import BeamSearchRequest

from ..reference import hf_beams, passage_token_ids
from ..tiny_models import build_tiny_model

NEW_TOKENS = 7


@pytest.fixture(scope="module")
def tiny_folder(tokenizer, tmp_path_factory):
    return build_tiny_model("llama", str(tmp_path_factory.mktemp("beam") / "llama"), tokenizer)


@pytest.fixture(scope="module")
def tiny_ref(tiny_folder):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(tiny_folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tiny_llm(tiny_folder):
    return LLM(model=tiny_folder, dtype="float32", num_kv_blocks=128)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [passage_token_ids(tokenizer, n, offset=3 * i) for i, n in enumerate([5, 19, 30])]


def _tokens(output):
    return [s.tokens for s in output.sequences]


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_tiny_model_matches_transformers(tiny_llm, tiny_ref, prompts, k):
    eos = tiny_llm.engine.input_processor.eos_token_ids
    outs = tiny_llm.beam_search(prompts, BeamSearchParams(beam_width=k, max_tokens=NEW_TOKENS,
                                                          ignore_eos=True))
    assert [_tokens(o) for o in outs] == [hf_beams(tiny_ref, p, k, NEW_TOKENS, eos) for p in prompts]
    for out in outs:
        assert len(out.sequences) == k
        assert all(s.finish_reason == "length" for s in out.sequences)
        cums = [s.cum_logprob for s in out.sequences]
        assert cums == sorted(cums, reverse=True)  # equal lengths: best score = best cum_logprob
    assert tiny_llm.stats()["kv_blocks_used"] == 0


def test_embedded_model_matches_transformers(llm_fp32, hf_embedded, tokenizer):
    prompt = passage_token_ids(tokenizer, 12, offset=11)
    eos = llm_fp32.engine.input_processor.eos_token_ids
    for k in (1, 2, 4, 8):
        (out,) = llm_fp32.beam_search([{"prompt_token_ids": prompt}],
                                      BeamSearchParams(beam_width=k, max_tokens=4, ignore_eos=True))
        assert _tokens(out) == hf_beams(hf_embedded, prompt, k, 4, eos), k
        best = out.sequences[0]
        assert best.text == tokenizer.decode(best.tokens[len(prompt):], skip_special_tokens=True)
        assert sum(lp.logprob for step in best.logprobs for lp in step.values()) == \
            pytest.approx(best.cum_logprob, abs=1e-4)
    assert llm_fp32.stats()["kv_blocks_used"] == 0


@pytest.fixture(scope="module")
def eos_folder(tiny_llm, tiny_folder, prompts, tmp_path_factory):
    """The tiny model with its three most generated tokens declared EOS, so beams end early."""
    outs = tiny_llm.beam_search(prompts, BeamSearchParams(beam_width=4, max_tokens=10,
                                                          ignore_eos=True))
    common = Counter(t for o in outs for s in o.sequences for t in s.tokens[-10:])
    folder = str(tmp_path_factory.mktemp("beam") / "llama-eos")
    shutil.copytree(tiny_folder, folder)
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    config["eos_token_id"] = [t for t, _ in common.most_common(3)]
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return folder


def test_eos_length_penalty_and_early_stopping_match_transformers(eos_folder, tiny_ref, prompts):
    """With EOS allowed the hypotheses, their length-penalised ranking and the stopping rule
    are transformers' (``early_stopping`` False / True / "never"; ``length_penalty`` of any sign)."""
    llm = LLM(model=eos_folder, dtype="float32", num_kv_blocks=128)
    eos = llm.engine.input_processor.eos_token_ids
    reasons, lengths = Counter(), Counter()
    cases = [(4, lp, es) for lp in (1.0, 2.0, -1.0) for es in (False, True, "never")]
    for k, length_penalty, early_stopping in cases + [(4, 0.0, False), (2, 1.0, False),
                                                      (8, 1.0, False)]:
        params = BeamSearchParams(beam_width=k, max_tokens=10, length_penalty=length_penalty,
                                  early_stopping=early_stopping)
        outs = llm.beam_search(prompts[1:], params)
        expected = [hf_beams(tiny_ref, p, k, 10, eos, exact_length=False,
                             length_penalty=length_penalty, early_stopping=early_stopping)
                    for p in prompts[1:]]
        assert [_tokens(o) for o in outs] == expected, (k, length_penalty, early_stopping)
        for p, out in zip(prompts[1:], outs):
            for s in out.sequences:
                reasons[s.finish_reason] += 1
                lengths[len(s.tokens) - len(p)] += 1
                assert (s.finish_reason == "stop") == (s.tokens[-1] in eos)
    assert reasons["stop"] > 0 and reasons["length"] > 0 and len(lengths) > 2  # EOS did matter
    assert llm.stats()["kv_blocks_used"] == 0


def test_beams_share_blocks_and_free_dropped_ones_at_once(tiny_llm, tokenizer):
    """After every step the cache holds exactly the distinct blocks of the live beams; the
    peak is well below the same beams without sharing; nothing is left at the end."""
    engine = tiny_llm.engine
    prompt = passage_token_ids(tokenizer, 40, offset=1)
    k, m, bs = 4, 8, engine.config.block_size
    engine.add_request(engine.make_request("share", {"prompt_token_ids": prompt},
                                           BeamSearchParams(beam_width=k, max_tokens=m,
                                                            ignore_eos=True)))
    request = engine.core.requests["share"]
    peak, forked = 0, False
    while engine.has_unfinished_requests():
        engine.step()
        live = {b for seq in request.sequences for b in engine.core.kv.block_ids(seq)}
        assert engine.stats()["kv_blocks_used"] == len(live)
        forked |= any(engine.core.kv.pool.blocks[b].ref_cnt > 1 for b in live)
        peak = max(peak, len(live))
    assert forked
    shared_prompt_blocks = len(prompt) // bs
    assert peak <= shared_prompt_blocks + k * -(-(len(prompt) + m - shared_prompt_blocks * bs) // bs)
    assert peak < k * -(-(len(prompt) + m) // bs)
    assert engine.stats()["kv_blocks_used"] == 0 and not request.sequences


def test_preempted_beams_recompute_and_give_the_same_result(tiny_folder, tiny_llm, tokenizer):
    prompt = passage_token_ids(tokenizer, 19, offset=2)
    params = BeamSearchParams(beam_width=4, max_tokens=8, ignore_eos=True)
    (expected,) = tiny_llm.beam_search([prompt], params)
    llm = LLM(model=tiny_folder, dtype="float32", num_kv_blocks=12)  # room for the group, barely
    engine = llm.engine
    victims = []
    preempt = engine.core.scheduler._preempt
    engine.core.scheduler._preempt = lambda seq, out: (victims.append(seq.request), preempt(seq, out))
    engine.add_request(engine.make_request("beam", {"prompt_token_ids": prompt}, params))
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for i in range(3):
        engine.add_request(engine.make_request(
            f"g{i}", {"prompt_token_ids": passage_token_ids(tokenizer, 40, offset=10 * i)}, greedy))
    finished = {}
    while engine.has_unfinished_requests():
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
    assert any(isinstance(r, BeamSearchRequest) for r in victims)
    assert [prompt + c.token_ids for c in finished["beam"].outputs] == _tokens(expected)
    assert engine.stats()["kv_blocks_used"] == 0


@pytest.mark.parametrize("scheduling", [{"scheduling_policy": "priority"},
                                        {"tenant_fairness": True},
                                        {"scheduling_policy": "priority", "tenant_fairness": True}])
def test_every_scheduling_policy_gives_the_fcfs_beams(tiny_folder, tiny_llm, prompts, scheduling):
    params = BeamSearchParams(beam_width=3, max_tokens=NEW_TOKENS, ignore_eos=True)
    expected = tiny_llm.beam_search(prompts, params)  # fcfs, no fairness
    llm = LLM(model=tiny_folder, dtype="float32", num_kv_blocks=128, **scheduling)
    assert llm.beam_search(prompts, params) == expected
    assert llm.stats()["kv_blocks_used"] == 0


def test_beam_requests_are_admitted_by_priority_then_tenant_turns(tiny_folder, prompts):
    """One group runs at a time (``max_num_seqs=1``: a group's forks never let the next one
    in), so the finish order is the admission order: the lowest ``priority`` first, the
    tenants of a level taking turns; arrival order would be a-low, a1, a2, b1."""
    llm = LLM(model=tiny_folder, dtype="float32", num_kv_blocks=128, max_num_seqs=1,
              scheduling_policy="priority", tenant_fairness=True)
    engine = llm.engine
    params = BeamSearchParams(beam_width=2, max_tokens=3, ignore_eos=True)
    for request_id, priority, tenant in (("a-low", 1, "a"), ("a1", 0, "a"), ("a2", 0, "a"),
                                         ("b1", 0, "b")):
        request = engine.make_request(request_id, {"prompt_token_ids": prompts[0]}, params,
                                      priority=priority, tenant=tenant)
        assert request.is_beam_search
        assert (request.priority, request.tenant) == (priority, tenant)
        engine.add_request(request)
    order = []
    while engine.has_unfinished_requests():
        order += [out.request_id for out in engine.step() if out.finished]
    assert order == ["a1", "b1", "a2", "a-low"]
    assert engine.stats()["kv_blocks_used"] == 0


@pytest.mark.parametrize("priority", [2**31 + 1, 1.5, True])
def test_a_bad_priority_is_refused_for_beam_requests_too(tiny_llm, prompts, priority):
    with pytest.raises(ValueError, match="priority must be an integer"):
        tiny_llm.engine.make_request("bad", {"prompt_token_ids": prompts[0]},
                                     BeamSearchParams(beam_width=2, max_tokens=3),
                                     priority=priority)


@pytest.mark.parametrize("kwargs, field", [
    ({"beam_width": 0, "max_tokens": 4}, "beam_width"),
    ({"beam_width": 2.5, "max_tokens": 4}, "beam_width"),
    ({"beam_width": 2, "max_tokens": 0}, "max_tokens"),
    ({"beam_width": 2, "max_tokens": 4, "temperature": -1}, "temperature"),
    ({"beam_width": 2, "max_tokens": 4, "length_penalty": float("nan")}, "length_penalty"),
    ({"beam_width": 2, "max_tokens": 4, "early_stopping": "sometimes"}, "early_stopping"),
    ({"beam_width": 2, "max_tokens": 4, "ignore_eos": 1}, "ignore_eos"),
])
def test_bad_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        BeamSearchParams(**kwargs)


def test_requests_that_cannot_fit_are_refused(tiny_llm, tokenizer):
    prompt = passage_token_ids(tokenizer, 100)
    with pytest.raises(ValueError, match="beam_width"):  # 128 blocks of 16: not 64 beams of 108
        tiny_llm.beam_search([prompt], BeamSearchParams(beam_width=64, max_tokens=8))
    with pytest.raises(ValueError, match="max_tokens is too large"):
        tiny_llm.beam_search([prompt], BeamSearchParams(beam_width=2, max_tokens=500))
    with pytest.raises(ValueError, match="BeamSearchParams"):
        tiny_llm.beam_search([prompt], SamplingParams())
    assert tiny_llm.stats()["kv_blocks_used"] == 0 and tiny_llm.stats()["num_requests"] == 0


def test_async_engine_returns_the_final_beams(tiny_folder, tiny_llm, prompts):
    params = BeamSearchParams(beam_width=3, max_tokens=5, ignore_eos=True)
    (expected,) = tiny_llm.beam_search([prompts[1]], params)

    async def run():
        engine = AsyncEngine(EngineConfig(model=tiny_folder, dtype="float32", num_kv_blocks=64))
        try:
            return [o async for o in engine.beam_search({"prompt_token_ids": prompts[1]},
                                                        "beam-1", params)]
        finally:
            await engine.shutdown()

    (final,) = asyncio.run(run())
    assert final.finished and [c.index for c in final.outputs] == [0, 1, 2]
    assert [prompts[1] + c.token_ids for c in final.outputs] == _tokens(expected)
    assert [c.text for c in final.outputs] == [s.text for s in expected.sequences]


def test_abort_returns_the_live_beams_and_frees_every_block(tiny_llm, prompts):
    engine = tiny_llm.engine
    engine.add_request(engine.make_request("gone", {"prompt_token_ids": prompts[2]},
                                           BeamSearchParams(beam_width=4, max_tokens=50,
                                                            ignore_eos=True)))
    for _ in range(4):
        assert engine.step() == []  # no output before the search ends
    out = engine.abort_request("gone")
    assert out.finished and len(out.outputs) == 4
    # the prefill step chose each beam's first token, the next three one more each
    assert all(c.finish_reason == "abort" and len(c.token_ids) == 4 for c in out.outputs)
    assert engine.stats()["kv_blocks_used"] == 0 and not engine.has_unfinished_requests()


def test_vllm_import_paths():
    from paged_core import BeamSearchOutput, BeamSearchSequence
    from paged_core.sampling_params import BeamSearchParams as FromSamplingParams
    assert FromSamplingParams is BeamSearchParams
    assert BeamSearchParams(beam_width=2, max_tokens=3).n == 2
    assert BeamSearchOutput([BeamSearchSequence([1, 2], [])]).sequences[0].cum_logprob == 0.0
