"""``kv_cache_dtype`` through the engine: the setting's names and checks; int8 / fp8 KV
caches give the greedy output of the model-dtype cache under the near-tie rule through a
shared prefix (prefix cache hits), forced preemption and ``n > 1`` forks (copy-on-write
block copies); a fixed ``kv_cache_memory`` holds ~1.9x the blocks of bfloat16 in int8."""
import pytest
import torch

from paged_core import LLM, EngineConfig, SamplingParams

from ..reference import assert_greedy_close, engine_top_logprobs, passage_token_ids

TOP_K = 5
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=TOP_K)


def test_setting_names_checks_and_environment():
    assert EngineConfig().kv_cache_dtype == "auto"
    assert EngineConfig(kv_cache_dtype="fp8").kv_cache_dtype == "fp8"
    env = EngineConfig.from_env({"PAGED_CORE_KV_CACHE_DTYPE": "int8"})
    assert env.kv_cache_dtype == "int8"
    # CLI flags and Triton's config.pbtxt parameters arrive as strings.
    assert EngineConfig.from_strings({"kv_cache_dtype": "fp8_e5m2"}).kv_cache_dtype == "fp8_e5m2"
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype="int4")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig.from_env({"PAGED_CORE_KV_CACHE_DTYPE": "float8"})


def _prompts(tokenizer) -> list[list[int]]:
    """Five prompts sharing a 48-token prefix (three blocks of 16), 50 to 90 tokens long."""
    shared = passage_token_ids(tokenizer, 48)
    return [shared + passage_token_ids(tokenizer, n, offset=60 + 11 * i)
            for i, n in enumerate([2, 17, 30, 42, 9])]


def _run(kv_cache_dtype: str, prompts):
    """Greedy runs of the embedded model in 12 blocks of 16: five sequences of up to 106
    tokens (7 blocks, 3 of them the shared prefix's), so some are preempted and recomputed."""
    llm = LLM(dtype="float32", num_kv_blocks=12, max_num_batched_tokens=32,
              kv_cache_dtype=kv_cache_dtype)
    outputs = [o.outputs[0] for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    return llm, outputs


@pytest.fixture(scope="module")
def auto_run(tokenizer):
    return _run("auto", _prompts(tokenizer))[1]


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8_e4m3", "fp8_e5m2"])
def test_quantized_cache_keeps_greedy_output_through_prefix_hits_and_preemption(
        kv_cache_dtype, auto_run, tokenizer):
    llm, outputs = _run(kv_cache_dtype, _prompts(tokenizer))
    runner = llm.engine.core.executor.runner
    k_cache = runner.kv_caches[0][0]
    assert k_cache.dtype == {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn,
                             "fp8_e5m2": torch.float8_e5m2}[kv_cache_dtype]
    stack = runner.model.decoder_stack  # the whole-stack C++ path quantizes as it writes
    assert stack is None or stack.serves(runner.backend, runner.kv_caches)
    stats = llm.stats()
    assert stats["num_preemptions"] > 0 and stats["prefix_cache_hits"] > 0
    assert stats["kv_blocks_used"] == 0
    for ours, theirs in zip(outputs, auto_run, strict=True):
        assert_greedy_close(ours.token_ids, engine_top_logprobs(ours), theirs.token_ids,
                            engine_top_logprobs(theirs))


def test_forks_copy_blocks_with_their_scales(tokenizer):
    """``n = 2`` greedy samples fork after the prompt: the partial last block is copied on
    write; both samples equal the one-sample run (a copy without its scales would not)."""
    llm = LLM(dtype="float32", num_kv_blocks=32, kv_cache_dtype="int8")
    runner = llm.engine.core.executor.runner
    copies = []
    copy_blocks = runner.backend.copy_blocks
    runner.backend.copy_blocks = lambda k, v, src, dst: (copies.append(len(src)),
                                                         copy_blocks(k, v, src, dst))
    prompt = passage_token_ids(tokenizer, 40)  # 2.5 blocks: the third is shared, then copied
    single = llm.generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    forked = llm.generate([prompt], SamplingParams(n=2, temperature=0, max_tokens=16,
                                                   ignore_eos=True), use_tqdm=False)[0]
    assert sum(copies) > 0
    assert [c.token_ids for c in forked.outputs] == [single, single]


def test_fixed_memory_holds_more_quantized_blocks():
    """Rows of 64 bytes + a 4-byte scale against 128 (bfloat16) or 256 (float32) bytes."""
    blocks = {(dtype, kv): LLM(dtype=dtype, kv_cache_memory="32MiB",
                               kv_cache_dtype=kv).stats()["kv_blocks_total"]
              for dtype, kv in [("bfloat16", "auto"), ("bfloat16", "int8"), ("float32", "auto"),
                                ("float32", "fp8")]}
    assert blocks["bfloat16", "int8"] >= 1.8 * blocks["bfloat16", "auto"]
    assert blocks["float32", "fp8"] >= 3.5 * blocks["float32", "auto"]
    assert blocks["bfloat16", "int8"] == blocks["float32", "fp8"]  # one byte per element both
