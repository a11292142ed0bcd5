"""bfloat16 greedy parity with transformers under the reduced-precision tolerance rule
(``reference.assert_greedy_close``): equal tokens up to the first near-tie, which must be
a near-tie on both sides, on every CPU path this host can run (``cpu_isa`` fixture: native
bfloat16-packed, float32-packed or plain ``F.linear`` linears with each C++ kernel build). The
GPU suite applies the same rule on CUDA.

The rule alone is the assertion: how many tokens agree before the first near-tie depends on
the CPU's bfloat16 arithmetic (native dot products round partial sums where AVX2 does not),
so no count of agreeing tokens is asserted."""
import torch

from paged_core import LLM, SamplingParams
from paged_core.cpu.isa import packed_linear_dtype

from ..reference import assert_greedy_close, engine_top_logprobs, hf_greedy_top_logprobs, \
    passage_token_ids

TOP_K = 5


def test_bf16_engine_is_close_to_transformers_bf16(embedded_folder, tokenizer, cpu_isa):
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(embedded_folder, dtype=torch.bfloat16).eval()
    prompts = [passage_token_ids(tokenizer, n, offset=9 * i) for i, n in enumerate([6, 40, 120])]
    expected = [hf_greedy_top_logprobs(reference, p, 24, TOP_K) for p in prompts]
    llm = LLM(dtype="bfloat16", num_kv_blocks=64)
    model = llm.engine.core.executor.runner.model
    assert model.ops.cpu_isa == cpu_isa
    assert getattr(model.lm_head, "compute_dtype", None) == packed_linear_dtype(
        torch.device("cpu"), torch.bfloat16, cpu_isa)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=TOP_K)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for out, (tokens, tops) in zip(outputs, expected):
        completion = out.outputs[0]
        assert_greedy_close(completion.token_ids, engine_top_logprobs(completion), tokens, tops)
