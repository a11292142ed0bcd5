"""Engine features on CUDA (float32; CUDA graphs for decode steps, then for every step, one
step at a time; then graphs for every step with ``async_scheduling``; then the defaults,
which also schedule each step ahead, ``schedule_ahead``) against transformers on the CPU, token
for token:
prefix caching, preemption by recompute, ``n > 1``, beam search, n-gram and draft-model
speculative decoding, stop strings; structured outputs that follow their JSON schema."""
import json

import pytest
import torch

from paged_core import BeamSearchParams, SamplingParams
from paged_core.structured_outputs.params import StructuredOutputsParams

from ..reference import hf_beams, hf_greedy, passage_token_ids
from ..spec_decode.narrow_models import build_narrow_model, narrow_prompts
from ..tiny_models import build_tiny_model
from .test_cuda_parity import cuda_llm, graph_replays

NEW_TOKENS = 32


def greedy(max_tokens: int = NEW_TOKENS, **fields) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **fields)


@pytest.fixture(scope="module", params=[
    {"cudagraph_mode": "FULL_DECODE_ONLY", "async_scheduling": False},
    {"cudagraph_mode": "FULL", "async_scheduling": False}, {"schedule_ahead": False}, {}],
    ids=["decode-graphs", "full-graphs", "async-scheduling-alone", "defaults-schedule-ahead"])
def step_settings(request) -> dict:
    """The engine's step settings: decode steps replay graphs, or every step that fits one,
    one step at a time; or every step that fits one replays a graph while the front end
    works on the previous step (``async_scheduling``); or the defaults: those with each step
    scheduled and launched before the previous one's tokens reach the host
    (``schedule_ahead``; speculative decoding resolves it off and goes one step at a
    time)."""
    return request.param


@pytest.fixture(scope="module")
def folder(tokenizer, tmp_path_factory):
    return build_tiny_model("llama", str(tmp_path_factory.mktemp("cuda") / "llama"), tokenizer)


@pytest.fixture(scope="module")
def reference(folder):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def llm(folder, step_settings):
    return cuda_llm(folder, dtype="float32", enforce_eager=False, **step_settings)


def test_prefix_cache_hits_give_the_same_tokens(llm, reference, tokenizer):
    shared = passage_token_ids(tokenizer, 48, offset=5)
    prompts = [shared + passage_token_ids(tokenizer, n, offset=70 + n) for n in (4, 19)]
    expected = [hf_greedy(reference, p, NEW_TOKENS) for p in prompts]
    first = llm.generate(prompts[:1], greedy(), use_tqdm=False)
    second = llm.generate(prompts[1:], greedy(), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in first + second] == expected
    assert second[0].num_cached_tokens >= 32
    assert graph_replays(llm)[0] > 0


def test_preempted_requests_recompute_the_same_tokens(folder, reference, tokenizer,
                                                      step_settings):
    prompts = [passage_token_ids(tokenizer, 40, offset=9 * i) for i in range(4)]
    expected = [hf_greedy(reference, p, 60) for p in prompts]
    small = cuda_llm(folder, dtype="float32", enforce_eager=False, num_kv_blocks=14,
                     **step_settings)
    outputs = small.generate(prompts, greedy(60), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert small.stats()["num_preemptions"] > 0
    assert small.stats()["kv_blocks_used"] == 0
    small.shutdown()


def test_n_greedy_samples_all_match_transformers(llm, reference, tokenizer):
    prompt = passage_token_ids(tokenizer, 21, offset=3)
    (out,) = llm.generate([prompt], greedy(n=3), use_tqdm=False)
    assert [c.token_ids for c in out.outputs] == [hf_greedy(reference, prompt, NEW_TOKENS)] * 3


def test_beam_search_matches_transformers(llm, reference, tokenizer):
    prompts = [passage_token_ids(tokenizer, n, offset=3 * i) for i, n in enumerate([5, 19, 30])]
    eos = llm.engine.input_processor.eos_token_ids
    outs = llm.beam_search(prompts, BeamSearchParams(beam_width=4, max_tokens=7, ignore_eos=True))
    assert [[s.tokens for s in o.sequences] for o in outs] == \
        [hf_beams(reference, p, 4, 7, eos) for p in prompts]


@pytest.mark.parametrize("speculative", ["ngram", "draft"])
def test_speculative_decoding_keeps_greedy_tokens(speculative, tokenizer, tmp_path,
                                                   step_settings):
    """On narrow models (``spec_decode.narrow_models``: outputs repeat, so drafts happen)."""
    from transformers import AutoModelForCausalLM

    target = build_narrow_model(str(tmp_path / "target"), tokenizer)
    if speculative == "ngram":
        config = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
                  "prompt_lookup_min": 2}
    else:
        draft = build_narrow_model(str(tmp_path / "draft"), tokenizer, noise=1.5)
        config = {"model": draft, "num_speculative_tokens": 3}
    reference = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    prompts = narrow_prompts([5, 20, 40, 33])
    expected = [hf_greedy(reference, p["prompt_token_ids"], NEW_TOKENS) for p in prompts]
    spec = cuda_llm(target, dtype="float32", enforce_eager=False, speculative_config=config,
                    **step_settings)
    assert spec.engine.config.schedule_ahead is False  # drafts are verified step by step
    outputs = spec.generate(prompts, greedy(), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert spec.stats()["spec_decode_num_accepted_tokens"] > 0
    spec.shutdown()


def test_stop_strings_end_samples_where_the_text_matches(llm, reference, tokenizer):
    """Under ``async_scheduling`` the stop is found one step late: the extra token must not
    show, and its blocks come back."""
    prompt = passage_token_ids(tokenizer, 20, offset=3)
    expected = hf_greedy(reference, prompt, NEW_TOKENS)
    text = tokenizer.decode(expected)
    start = next(i for i in range(len(text) // 3, len(text) - 3)
                 if text[i:i + 3].isascii() and text[i:i + 3].isalpha())
    stop = text[start:start + 3]
    (out,) = llm.generate([{"prompt_token_ids": prompt}], greedy(stop=[stop]), use_tqdm=False)
    sample = out.outputs[0]
    assert sample.finish_reason == "stop" and sample.stop_reason == stop
    assert stop not in sample.text and text.startswith(sample.text)
    assert sample.token_ids == expected[:len(sample.token_ids)]
    assert len(sample.token_ids) < NEW_TOKENS
    assert llm.stats()["kv_blocks_used"] == 0


def test_structured_output_follows_the_schema(llm):
    """The same prompt unconstrained is not such JSON (the random model writes noise), so the
    grammar is what shapes the output."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    constrained = SamplingParams(temperature=0, max_tokens=80,
                                 structured_outputs=StructuredOutputsParams(json=schema))
    prompt = "Describe a person as JSON:"
    (out,) = llm.generate([prompt], constrained, use_tqdm=False)
    value = json.loads(out.outputs[0].text)
    assert set(value) == {"name", "age"} and isinstance(value["age"], int)
    assert isinstance(value["name"], str) and len(value["name"]) <= 12
    (free,) = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=80),
                           use_tqdm=False)
    assert not free.outputs[0].text.lstrip().startswith("{")


def test_steps_go_ahead_on_the_device_with_graphs(folder, reference, tokenizer):
    """``schedule_ahead``: decode rows read the previous step's tokens on the device, inside
    graph replays, and give transformers' tokens."""
    llm = cuda_llm(folder, dtype="float32", enforce_eager=False, schedule_ahead=True)
    ahead = []
    run = llm.engine.core.executor.execute_model
    llm.engine.core.executor.execute_model = lambda packed, copies, plan: (
        ahead.append(packed.ahead is not None), run(packed, copies, plan))[1]
    prompts = [passage_token_ids(tokenizer, n, offset=7 * n) for n in (6, 30)]
    outputs = llm.generate(prompts, greedy(), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == \
        [hf_greedy(reference, p, NEW_TOKENS) for p in prompts]
    assert sum(ahead) >= NEW_TOKENS - 2 and graph_replays(llm)[0] > 0
    assert llm.stats()["kv_blocks_used"] == 0
    llm.shutdown()
