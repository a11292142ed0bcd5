"""The engine on CUDA against transformers on the CPU: float32 greedy output token for token
for tiny random models of every supported family, eagerly and with CUDA graphs for decode
steps (``cudagraph_mode="FULL_DECODE_ONLY"``) and for every step (``"FULL"``; MoE models run
eagerly either way), one step at a time, with ``async_scheduling`` alone and with the
defaults (``"FULL"`` graphs, ``async_scheduling`` and ``schedule_ahead``); bfloat16 under the
near-tie rule. Prompts of 3 to 90 tokens arrive together under a 64-token step budget, so
later ones prefill in chunks while earlier ones decode."""
import pytest
import torch

from paged_core import LLM, SamplingParams

from ..reference import assert_greedy_close, engine_top_logprobs, hf_greedy, \
    hf_greedy_top_logprobs, passage_token_ids
from ..tiny_models import GEMMA, MOE, build_tiny_model

FAMILIES = ["llama", "llama3-rope", "mistral", "qwen2", "qwen3", "phi3", "phi3-longrope",
            "phi3-partial-rotary", *GEMMA, *MOE]
NEW_TOKENS = 40
TOP_K = 5
# (enforce_eager, cudagraph_mode, async_scheduling, schedule_ahead): one step at a time
# eagerly, with decode graphs, with graphs for every step; async_scheduling alone (None: on
# for CUDA); then the defaults, which also schedule each step ahead (None: on where
# async_scheduling is, for one CUDA device)
STEP_MODES = ((True, "FULL_DECODE_ONLY", False, False), (False, "FULL_DECODE_ONLY", False, False),
              (False, "FULL", False, False), (False, "FULL", None, False),
              (False, "FULL", None, None))


def cuda_llm(folder: str, **settings) -> LLM:
    """An engine on the GPU with a small fixed KV cache (tests share the card)."""
    return LLM(model=folder, device="cuda", **{"num_kv_blocks": 64, "max_num_batched_tokens": 64,
                                              **settings})


def graph_replays(llm: LLM) -> tuple[int, int]:
    """Steps served by a graph: ``(decode steps, other steps)``."""
    graphs = llm.engine.core.executor.runner.cuda_graphs
    return (0, 0) if graphs is None else (graphs.replays, graphs.mixed_replays)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [passage_token_ids(tokenizer, n, offset=13 * i) for i, n in enumerate([3, 20, 41, 90])]


@pytest.mark.parametrize("model_type", FAMILIES)
def test_fp32_greedy_matches_transformers_eager_and_with_graphs(model_type, prompts, tokenizer,
                                                                tmp_path):
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model(model_type, str(tmp_path / model_type), tokenizer)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    expected = [hf_greedy(reference, p, NEW_TOKENS) for p in prompts]
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    for eager, mode, overlap, ahead in STEP_MODES:
        llm = cuda_llm(folder, dtype="float32", enforce_eager=eager, cudagraph_mode=mode,
                       async_scheduling=overlap, schedule_ahead=ahead)
        assert llm.engine.config.async_scheduling is (overlap is not False)  # None: on for CUDA
        assert llm.engine.config.schedule_ahead is (overlap is not False and ahead is not False)
        assert llm.engine.attention_backend == "triton"
        assert llm.engine.core.executor.runner.model.ops.name == "triton"  # fused elementwise
        outputs = llm.generate(prompts, params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outputs] == expected, (eager, mode, overlap,
                                                                       ahead)
        assert llm.stats()["kv_blocks_used"] == 0
        decode, mixed = graph_replays(llm)
        graphs = not eager and model_type not in MOE
        assert (decode > 0) == graphs and (mixed > 0) == (graphs and mode == "FULL")
        llm.shutdown()


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gemma2", "phi3"])
def test_bf16_is_close_to_transformers(model_type, prompts, tokenizer, tmp_path):
    """bfloat16 on the GPU against transformers bfloat16 on the CPU, near-tie rule."""
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model(model_type, str(tmp_path / model_type), tokenizer)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    expected = [hf_greedy_top_logprobs(reference, p, 24, TOP_K) for p in prompts]
    llm = cuda_llm(folder, dtype="bfloat16", enforce_eager=False)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=TOP_K)
    for out, (tokens, tops) in zip(llm.generate(prompts, params, use_tqdm=False), expected):
        completion = out.outputs[0]
        assert_greedy_close(completion.token_ids, engine_top_logprobs(completion), tokens, tops)
    llm.shutdown()


def test_plain_torch_elementwise_ops_match_too(prompts, tokenizer, tmp_path, monkeypatch):
    """``PAGED_CORE_GPU_FUSED_OPS=0``: norms, rotary and SiLU in plain torch on the GPU."""
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("PAGED_CORE_GPU_FUSED_OPS", "0")
    folder = build_tiny_model("qwen3", str(tmp_path / "qwen3"), tokenizer)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    expected = [hf_greedy(reference, p, NEW_TOKENS) for p in prompts]
    llm = cuda_llm(folder, dtype="float32")
    assert llm.engine.core.executor.runner.model.ops.name == "torch"
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)] \
        == expected
    llm.shutdown()
