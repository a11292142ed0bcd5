"""Multi-LoRA greedy output equals PEFT's (``PeftModel`` over transformers, float32) token for
token: one batch mixing three adapters of different ranks (one rsLoRA, one adapting only the
attention) with the base model; the same with fewer slots than adapters (they take turns),
under preemption, with prefix caching (never shared across adapters), on Phi-3's fused
projections, on the embedded model, and with tensor parallelism."""
import pytest
import torch

from paged_core import LLM, LoRARequest, SamplingParams

from ..reference import assert_greedy_close, engine_top_logprobs, hf_greedy, \
    hf_greedy_top_logprobs, passage_token_ids
from .adapters import make_adapter, peft_model

NEW_TOKENS = 24
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def base(tiny_checkpoints):
    return tiny_checkpoints.model("llama")


@pytest.fixture(scope="module")
def adapters(base, tmp_path_factory):
    """Three adapters: rank 4 (all projections), rank 8 (attention only), rank 16 (rsLoRA)."""
    root = tmp_path_factory.mktemp("adapters")
    made = [make_adapter(base, str(root / "r4"), 4, seed=1),
            make_adapter(base, str(root / "r8"), 8, seed=2,
                         target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
            make_adapter(base, str(root / "r16"), 16, seed=3, use_rslora=True, scale=0.1)]
    return [LoRARequest(f"adapter-{i}", i + 1, path) for i, path in enumerate(made)]


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [passage_token_ids(tokenizer, n, offset=11 * i) for i, n in enumerate([3, 19, 40])]


@pytest.fixture(scope="module")
def expected(base, adapters, prompts):
    """PEFT's greedy tokens per adapter (``None``: the base model)."""
    from transformers import AutoModelForCausalLM

    reference = {None: AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()}
    reference.update({a.lora_int_id: peft_model(base, a.lora_path) for a in adapters})
    return {key: [hf_greedy(model, p, NEW_TOKENS) for p in prompts]
            for key, model in reference.items()}


def mixed(prompts, adapters):
    """Every prompt under the base model and under each adapter, interleaved."""
    cases = [(p, a) for p in prompts for a in [None, *adapters]]
    return [p for p, _ in cases], [a for _, a in cases]


def check(llm, prompts, adapters, expected):
    batch, loras = mixed(prompts, adapters)
    outputs = llm.generate(batch, GREEDY, use_tqdm=False, lora_request=loras)
    for (prompt, lora), out in zip(zip(batch, loras), outputs):
        key = None if lora is None else lora.lora_int_id
        assert out.outputs[0].token_ids == expected[key][prompts.index(prompt)], key
    assert llm.stats()["kv_blocks_used"] == 0


def test_adapters_change_the_output(expected):
    assert all(expected[i] != expected[None] for i in (1, 2, 3))
    assert len({tuple(map(tuple, v)) for v in expected.values()}) == 4


@pytest.mark.parametrize("path", ["cpu_decoder_stack", "python_layers"])
def test_one_batch_mixing_adapters_and_the_base_matches_peft(base, adapters, prompts, expected,
                                                             path):
    """Both CPU paths: the one-call C++ decoder stack adding the adapters' products itself,
    and the Python layers' ``LoRALinear`` wrappers."""
    llm = LLM(model=base, dtype="float32", num_kv_blocks=96, enable_lora=True, max_loras=3,
              max_lora_rank=16)
    model = llm.engine.core.executor.runner.model
    if path == "python_layers":
        model.decoder_stack = None
    elif model.decoder_stack is None:
        pytest.skip("no C++ decoder stack on this device / CPU level (see cpu_decoder_stack)")
    check(llm, prompts, adapters, expected)
    assert llm.list_loras() == {1, 2, 3}


@pytest.mark.parametrize("path", ["cpu_decoder_stack", "python_layers"])
def test_bfloat16_adapters_are_close_to_peft_in_bfloat16(base, adapters, prompts, path):
    """bfloat16 (the C++ ops' tables in bfloat16 too) against PEFT over transformers in
    bfloat16, under the near-tie rule, in one batch mixing the adapters and the base."""
    from transformers import AutoModelForCausalLM

    top_k = 5
    reference = {None: AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16).eval()}
    reference.update({a.lora_int_id: peft_model(base, a.lora_path, torch.bfloat16)
                      for a in adapters})
    expected = {key: [hf_greedy_top_logprobs(model, p, NEW_TOKENS, top_k) for p in prompts]
                for key, model in reference.items()}
    llm = LLM(model=base, dtype="bfloat16", num_kv_blocks=96, enable_lora=True, max_loras=3,
              max_lora_rank=16)
    runner = llm.engine.core.executor.runner
    if path == "python_layers":
        runner.model.decoder_stack = None
    elif runner.model.decoder_stack is None:
        pytest.skip("no C++ decoder stack on this device / CPU level (see cpu_decoder_stack)")
    for _, _, wrapper in runner.lora.wrappers:
        wanted = torch.bfloat16 if wrapper.products.name == "cpu" else torch.float32
        assert wrapper.a.dtype == wrapper.b_t.dtype == wanted
    batch, loras = mixed(prompts, adapters)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=top_k)
    outputs = llm.generate(batch, params, use_tqdm=False, lora_request=loras)
    for (prompt, lora), out in zip(zip(batch, loras), outputs):
        tokens, tops = expected[None if lora is None else lora.lora_int_id][prompts.index(prompt)]
        completion = out.outputs[0]
        assert_greedy_close(completion.token_ids, engine_top_logprobs(completion), tokens, tops)


def test_fewer_slots_than_adapters_take_turns(base, adapters, prompts, expected):
    """One slot for three adapters: requests wait for theirs (none fails)."""
    llm = LLM(model=base, dtype="float32", num_kv_blocks=64, enable_lora=True, max_loras=1,
              max_cpu_loras=2, max_lora_rank=16, max_num_batched_tokens=32)
    check(llm, prompts, adapters, expected)


def test_preempted_adapter_requests_recompute_the_same_tokens(base, adapters, tokenizer):
    """Four 40-token prompts under two adapters in a cache of 10 blocks: each ends holding
    4 blocks, so running ones are preempted and computed again."""
    prompts = [passage_token_ids(tokenizer, 40, offset=7 * i) for i in range(4)]
    loras = [adapters[0], adapters[2]] * 2
    expected = [hf_greedy(peft_model(base, lora.lora_path), p, NEW_TOKENS)
                for p, lora in zip(prompts, loras)]
    llm = LLM(model=base, dtype="float32", num_kv_blocks=10, enable_lora=True, max_loras=2,
              max_lora_rank=16)
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=loras)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert llm.stats()["num_preemptions"] > 0
    assert llm.stats()["kv_blocks_used"] == 0


def test_prefix_cache_hits_stay_within_one_adapter(base, adapters, tokenizer):
    llm = LLM(model=base, dtype="float32", num_kv_blocks=64, enable_lora=True, max_loras=2,
              max_lora_rank=16)
    prompt = passage_token_ids(tokenizer, 48, offset=5)
    hits = [llm.generate([prompt], GREEDY, use_tqdm=False, lora_request=lora)[0]
            .num_cached_tokens for lora in (adapters[0], adapters[1], adapters[0], None)]
    assert hits == [0, 0, 32, 0]  # two full blocks of 16 are reused under the same adapter


def test_phi3_fused_projections(tokenizer, tiny_checkpoints, tmp_path):
    """Phi-3 checkpoints fuse qkv_proj and gate_up_proj: PEFT adapts the fused weights."""
    base = tiny_checkpoints.model("phi3")
    folder = make_adapter(base, str(tmp_path / "adapter"), 8, seed=4,
                          target_modules=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"])
    prompts = [passage_token_ids(tokenizer, n, offset=3 * n) for n in (7, 30)]
    expected = [hf_greedy(peft_model(base, folder), p, NEW_TOKENS) for p in prompts]
    llm = LLM(model=base, dtype="float32", num_kv_blocks=64, enable_lora=True, max_lora_rank=8)
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False,
                           lora_request=LoRARequest("fused", 7, folder))
    assert [o.outputs[0].token_ids for o in outputs] == expected


def test_embedded_model_with_two_adapters(embedded_folder, hf_embedded, tokenizer, tmp_path):
    folders = [make_adapter(embedded_folder, str(tmp_path / f"a{r}"), r, seed=r)
               for r in (4, 8)]
    prompt = passage_token_ids(tokenizer, 20, offset=9)
    expected = [hf_greedy(hf_embedded, prompt, 12)] + [
        hf_greedy(peft_model(embedded_folder, folder), prompt, 12) for folder in folders]
    assert expected[1] != expected[0] and expected[2] != expected[0]
    llm = LLM(dtype="float32", kv_cache_memory="64MiB", enable_lora=True, max_loras=2,
              max_lora_rank=8)
    loras = [None] + [LoRARequest(f"e{i}", i + 1, f) for i, f in enumerate(folders)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outputs = llm.generate([prompt] * 3, params, use_tqdm=False, lora_request=loras)
    assert [o.outputs[0].token_ids for o in outputs] == expected


def test_tensor_parallel_shards_the_adapters(base, adapters, prompts, expected):
    """Two ranks: ``lora_B`` of q/k/v/gate/up cut by output rows, ``lora_A`` of o/down by
    input columns (its partial product all-reduced)."""
    llm = LLM(model=base, dtype="float32", num_kv_blocks=96, enable_lora=True, max_loras=3,
              max_lora_rank=16, tensor_parallel_size=2)
    try:
        check(llm, prompts, adapters, expected)
    finally:
        llm.shutdown()
