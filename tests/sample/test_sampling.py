"""Sampling features end to end on the embedded model: n>1 block sharing, seeds, stops,
logprobs, penalties, and validation errors."""
import pytest

from paged_core import LLM, LLMEngine, EngineConfig, SamplingParams

from ..reference import passage_token_ids


def test_n4_shares_prompt_blocks_copy_on_write(tokenizer):
    engine = LLMEngine(EngineConfig(dtype="float32", num_kv_blocks=64, enable_prefix_caching=False))
    prompt = passage_token_ids(tokenizer, 40)  # 2 full blocks + 1 partial block of 8 tokens
    request = engine.make_request("r", prompt, SamplingParams(n=4, temperature=1.0, seed=3,
                                                             max_tokens=4, ignore_eos=True))
    engine.add_request(request)
    engine.step()  # prefill once, fork into 4 samples
    assert len(engine.core.requests["r"].sequences) == 4
    assert engine.stats()["kv_blocks_used"] == 3  # shared by reference, not 4 x 3 = 12
    engine.step()  # every sample writes its first token into the shared partial block
    assert engine.stats()["kv_blocks_used"] == 2 + 4  # full blocks still shared; 3 copies made
    while engine.has_unfinished_requests():
        outputs = engine.step()
    (out,) = outputs
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert all(len(c.token_ids) == 4 for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1  # different samples
    assert engine.stats()["kv_blocks_used"] == 0


def test_seeded_sampling_is_reproducible_across_batches(llm_fp32, tokenizer):
    params = SamplingParams(temperature=1.0, top_p=0.95, top_k=50, seed=1234, max_tokens=24,
                            ignore_eos=True)
    prompt = passage_token_ids(tokenizer, 30)
    alone = llm_fp32.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
    others = [passage_token_ids(tokenizer, n, offset=50) for n in (7, 70, 120)]
    mixed = llm_fp32.generate(others[:2] + [prompt] + others[2:],
                              [SamplingParams(temperature=1.0, max_tokens=30)] * 2 + [params]
                              + [SamplingParams(temperature=0.7, max_tokens=10)], use_tqdm=False)
    assert mixed[2].outputs[0].token_ids == alone
    different_seed = llm_fp32.generate([prompt], SamplingParams(
        temperature=1.0, top_p=0.95, top_k=50, seed=99, max_tokens=24, ignore_eos=True),
        use_tqdm=False)[0].outputs[0].token_ids
    assert different_seed != alone


def test_stop_string_ends_output_and_is_not_emitted(llm_fp32):
    greedy = SamplingParams(temperature=0, max_tokens=40)
    full = llm_fp32.generate("The capital of France is", greedy, use_tqdm=False)[0].outputs[0].text
    stop = full[8:11]
    out = llm_fp32.generate("The capital of France is", SamplingParams(
        temperature=0, max_tokens=40, stop=[stop]), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == full[:full.index(stop)]


def test_stop_token_ids_max_tokens_min_tokens(llm_fp32):
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    ids = llm_fp32.generate("Hello, my name is", greedy, use_tqdm=False)[0].outputs[0].token_ids
    assert len(ids) == 12
    out = llm_fp32.generate("Hello, my name is", SamplingParams(
        temperature=0, max_tokens=12, stop_token_ids=[ids[3]]), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == ids[:4] and out.finish_reason == "stop" and out.stop_reason == ids[3]
    out = llm_fp32.generate("Hello, my name is", SamplingParams(
        temperature=0, max_tokens=12, min_tokens=6, stop_token_ids=[ids[3]]), use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) >= 6 and ids[3] not in out.token_ids[:5]


def test_eos_stops_unless_ignored(llm_fp32):
    eos = sorted(llm_fp32.engine.input_processor.eos_token_ids)
    out = llm_fp32.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=200),
                            use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] in eos
    out = llm_fp32.generate("The capital of France is", SamplingParams(
        temperature=0, max_tokens=len(out.token_ids) + 5, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "length"


def test_logprobs_report_sampled_and_top_tokens(llm_fp32):
    out = llm_fp32.generate("The capital of France is", SamplingParams(
        temperature=0, max_tokens=5, logprobs=3), use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == 5
    for token, entry in zip(out.token_ids, out.logprobs):
        assert entry[token].rank == 1  # greedy picks the most likely token
        assert len(entry) == 3
        values = [lp.logprob for lp in entry.values()]
        assert all(v <= 0 for v in values)
    assert out.cumulative_logprob == pytest.approx(sum(e[t].logprob for t, e in zip(out.token_ids, out.logprobs)))


def test_penalties_and_top_k_change_sampling(llm_fp32):
    prompt = "List the days of the week: Monday, Tuesday,"
    base = llm_fp32.generate(prompt, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
                             use_tqdm=False)[0].outputs[0].token_ids
    penalised = llm_fp32.generate(prompt, SamplingParams(
        temperature=0, max_tokens=30, ignore_eos=True, repetition_penalty=1.8,
        frequency_penalty=1.0, presence_penalty=1.0), use_tqdm=False)[0].outputs[0].token_ids
    assert penalised != base
    assert len(set(penalised)) >= len(set(base))
    top1 = llm_fp32.generate(prompt, SamplingParams(temperature=1.5, top_k=1, max_tokens=30,
                                                    ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert top1.token_ids == base  # top-k=1 is greedy whatever the temperature


@pytest.mark.parametrize("repetition,frequency,presence", [(1.3, 0.7, 0.4), (1.0, 1.5, 1.0)])
def test_penalised_greedy_matches_transformers(llm_fp32, hf_embedded, tokenizer, repetition,
                                               frequency, presence):
    """Repetition (prompt and output), frequency and presence (output only) penalties, vLLM's
    rules, against transformers' own repetition processor plus the OpenAI frequency/presence
    rule over the tokens generated so far: token for token in float32."""
    import torch
    from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

    prompt = passage_token_ids(tokenizer, 30, offset=11)

    def output_penalties(input_ids, scores):
        generated = input_ids[:, len(prompt):]
        counts = torch.zeros_like(scores).scatter_add_(
            1, generated, torch.ones_like(generated, dtype=scores.dtype))
        return scores - frequency * counts - presence * (counts > 0).to(scores.dtype)

    ids = torch.tensor([prompt])
    expected = hf_embedded.generate(
        ids, attention_mask=torch.ones_like(ids), eos_token_id=[], max_new_tokens=40,
        do_sample=False, pad_token_id=0, logits_processor=LogitsProcessorList(
            [RepetitionPenaltyLogitsProcessor(repetition), output_penalties])
    )[0, len(prompt):].tolist()

    def engine_tokens(**penalties) -> list[int]:
        params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, **penalties)
        (out,) = llm_fp32.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        return out.outputs[0].token_ids

    assert engine_tokens(repetition_penalty=repetition, frequency_penalty=frequency,
                         presence_penalty=presence) == expected
    if repetition == 1.0:  # the output-only penalties alone change the greedy tokens
        assert engine_tokens() != expected


@pytest.mark.parametrize("field,value,message", [
    ("temperature", -1, "temperature must be >= 0"),
    ("top_p", 0, "top_p must be in (0, 1]"),
    ("max_tokens", -5, "max_tokens must be >= 1"),
    ("n", 0, "n must be in [1, 128]"),
    ("min_p", 2, "min_p must be in [0, 1]"),
    ("logprobs", 50, "logprobs must be in [0, 20]"),
    ("presence_penalty", 3, "presence_penalty must be in [-2, 2]"),
    ("top_k", -3, "top_k must be >= 0"),
    ("seed", "x", "seed must be an integer"),
    ("seed", 2**64, "seed must be in [-9223372036854775808, 18446744073709551615]"),
    ("temperature", float("inf"), "temperature must be a finite number"),
    ("ignore_eos", "yes", "ignore_eos must be true or false"),
    ("stop", 5, "stop must be a list"),
    ("stop_token_ids", "12", "stop_token_ids must be a list"),
    ("output_kind", 3, "output_kind must be one of 0 (CUMULATIVE), 1 (DELTA), 2 (FINAL_ONLY)"),
    ("output_kind", True, "output_kind must be one of"),
])
def test_invalid_sampling_values_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        SamplingParams(**{field: value})


def test_llm_generate_runs_final_only_and_leaves_the_callers_params_alone(llm_fp32):
    from paged_core.sampling_params import RequestOutputKind
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)
    engine = llm_fp32.engine
    seen = []
    add_request = engine.add_request

    def recording(request):
        seen.append(request.params.output_kind)
        add_request(request)
    engine.add_request = recording
    try:
        (out,) = llm_fp32.generate("Hello", params, use_tqdm=False)
    finally:
        del engine.add_request
    assert seen == [RequestOutputKind.FINAL_ONLY] and params.output_kind == RequestOutputKind.DELTA
    assert out.finished and len(out.outputs[0].token_ids) == 6  # the whole output, not a delta
    assert out.outputs[0].text == llm_fp32.get_tokenizer().decode(out.outputs[0].token_ids,
                                                                 skip_special_tokens=True)


def test_per_sample_seeds_wrap_modulo_2_64():
    assert SamplingParams(seed=2**64 - 1, n=3).sample_seed(1) == 0
    assert [SamplingParams(seed=-2).sample_seed(i) for i in range(3)] == [2**64 - 2, 2**64 - 1, 0]
    assert SamplingParams(seed=5).sample_seed(0) == 5 and SamplingParams().sample_seed(1) is None


@pytest.mark.parametrize("values,message", [
    ({"stop_token_ids": [100]}, r"stop_token_ids must be token ids in \[0, 100\)"),
    ({"top_k": 101}, "top_k must be at most the vocabulary size"),
    ({"max_tokens": 11}, "max_tokens is too large: 11.*at most 10 tokens"),
    ({"max_tokens": None, "min_tokens": 11}, "min_tokens is too large: 11"),
])
def test_values_are_checked_against_the_model_and_prompt(values, message):
    params = SamplingParams(**values)
    with pytest.raises(ValueError, match=message):
        params.verify_for_model(vocab_size=100, max_model_len=20, num_prompt_tokens=10)
    SamplingParams(stop_token_ids=[99], top_k=100, max_tokens=10).verify_for_model(100, 20, 10)


def test_unknown_sampling_field_is_rejected():
    with pytest.raises(ValueError, match="unknown sampling parameter"):
        SamplingParams.from_dict({"temprature": 0.5})


def test_over_long_prompt_is_refused_and_engine_keeps_serving(tokenizer):
    llm = LLM(dtype="float32", num_kv_blocks=8, max_model_len=256)
    with pytest.raises(ValueError, match="prompt is too long: 300 tokens"):
        llm.generate([passage_token_ids(tokenizer, 300)], use_tqdm=False)
    with pytest.raises(ValueError, match="KV cache"):  # 8 blocks x 16 = 128 tokens of KV cache
        llm.generate([passage_token_ids(tokenizer, 200)], use_tqdm=False)
    out = llm.generate(["Hi"], SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) >= 1
    assert llm.stats()["kv_blocks_used"] == 0


def test_generation_is_capped_by_kv_capacity(tokenizer):
    llm = LLM(dtype="float32", num_kv_blocks=4)  # 64 tokens in all
    out = llm.generate([passage_token_ids(tokenizer, 50)], SamplingParams(
        temperature=0, max_tokens=100, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 64 - 50


def test_prompt_forms_and_per_prompt_params(llm_fp32, tokenizer):
    ids = tokenizer.encode("The capital of France is")
    greedy = SamplingParams(temperature=0, max_tokens=6)
    outs = llm_fp32.generate(["The capital of France is", {"prompt_token_ids": ids}], greedy,
                             use_tqdm=False)
    single = llm_fp32.generate(ids, greedy, use_tqdm=False)
    assert outs[0].outputs[0].token_ids == outs[1].outputs[0].token_ids == single[0].outputs[0].token_ids
    with pytest.raises(ValueError, match="2 sampling_params for 1 prompts"):
        llm_fp32.generate(["x"], [greedy, greedy], use_tqdm=False)
    with pytest.raises(ValueError, match="prompt is empty"):
        llm_fp32.generate([[]], greedy, use_tqdm=False)


def test_chat_uses_the_chat_template(llm_fp32, tokenizer):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    out = llm_fp32.chat(messages, SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)[0]
    expected_prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(expected_prompt, list):
        expected_prompt = expected_prompt["input_ids"]
    assert out.prompt_token_ids == list(expected_prompt)
    assert "Paris" in out.outputs[0].text
