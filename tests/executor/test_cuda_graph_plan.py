"""What decides CUDA graph use, checked without a GPU (``tests/gpu`` runs the graphs): the
captured batch and token sizes, which steps a graph serves, the ``enforce_eager`` and
``cudagraph_mode`` settings, the memory set aside for activations, and that the CPU always runs
eagerly with the same tokens."""
import pytest
import torch

from paged_core import LLM, EngineConfig, SamplingParams
from paged_core.executor.cuda_graphs import StepGraphs, capture_sizes, mixed_capture_sizes
from paged_core.executor.packed_batch import StepInput, bucketed_num_tokens, pack_batch
from paged_core.executor.rank_worker import activation_reserve

from ..reference import passage_token_ids
from ..tiny_models import build_tiny_model


def test_capture_sizes_cover_every_batch_up_to_the_cap():
    assert capture_sizes(1, 512) == [1]
    assert capture_sizes(8, 512) == [1, 2, 4, 8]
    assert capture_sizes(20, 512) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(1024, 100)[-2:] == [96, 100]  # the cap itself, off the multiples of 8
    sizes = capture_sizes(1024, 512)
    assert sizes[-1] == 512 and all(b % 8 == 0 for b in sizes[3:])
    assert all(any(s >= n for s in sizes) for n in range(1, 513))


def test_mixed_capture_sizes_are_the_bucketed_token_counts():
    assert mixed_capture_sizes(0) == mixed_capture_sizes(1) == []
    assert mixed_capture_sizes(20) == [2, 4, 8, 16, 24]
    sizes = mixed_capture_sizes(512)
    assert sizes[-1] == 512 and len(sizes) == len(set(sizes)) == 50
    assert all(bucketed_num_tokens(n) in sizes for n in range(2, 513))


def _step(query_lens: list[int], context: int = 40) -> object:
    blocks = -(-context // 16)
    batch = [StepInput(token_ids=list(range(context)), num_computed_tokens=context - q,
                       num_new_tokens=q, block_ids=list(range(i * blocks, (i + 1) * blocks)),
                       needs_logits=True) for i, q in enumerate(query_lens)]
    return pack_batch(batch, block_size=16)


def _graphs(tmp_path, tokenizer, max_mixed_tokens: int, max_num_seqs: int = 4,
            max_capture_size: int = 512) -> StepGraphs:
    """Graphs planned (never captured: no GPU here) for a tiny model, ``max_num_seqs``
    sequences (4), 128 tokens."""
    from paged_core.models.model_loader import load_hf_config, load_model

    folder = build_tiny_model("llama", str(tmp_path / "llama"), tokenizer)
    model = load_model(folder, load_hf_config(folder), 128, torch.float32, torch.device("cpu"))
    return StepGraphs(model, None, [], max_num_seqs=max_num_seqs, max_model_len=128,
                      block_size=16, device=torch.device("cpu"),
                      max_capture_size=max_capture_size, max_mixed_tokens=max_mixed_tokens)


def test_decode_only_graphs_serve_decode_steps_that_fit_and_nothing_else(tmp_path, tokenizer):
    graphs = _graphs(tmp_path, tokenizer, max_mixed_tokens=0)
    assert graphs.sizes == [1, 2, 4] and graphs.mixed_sizes == []
    assert graphs.graph_for(_step([1, 1, 1])) == (False, 4)
    assert graphs.graph_for(_step([1, 3])) is None  # a chunk of prefill
    assert graphs.graph_for(_step([1] * 5)) is None  # more sequences than the largest graph
    assert graphs.graph_for(_step([1], context=200)) is None  # a wider block table than captured


def test_full_graphs_also_serve_prefill_chunks_beside_decodes(tmp_path, tokenizer):
    graphs = _graphs(tmp_path, tokenizer, max_mixed_tokens=20)
    assert graphs.mixed_sizes == [2, 4, 8, 16, 24]
    assert graphs.graph_for(_step([1, 1, 1])) == (False, 4)  # decode: its own graphs
    assert graphs.graph_for(_step([1, 3])) == (True, 4)
    assert graphs.graph_for(_step([1, 1, 1, 17])) == (True, 24)  # 20 tokens, 4 sequences
    assert graphs.graph_for(_step([1, 24])) is None  # more tokens than the largest graph
    assert graphs.graph_for(_step([1, 1, 1, 1, 3])) is None  # more sequences than max_num_seqs
    assert graphs.graph_for(_step([2], context=200)) is None  # a wider block table than captured
    # the buffers hold the largest step of either kind
    assert graphs.input_ids.shape[0] == 24 and graphs.query_start_loc.shape[0] == 5


def test_decode_graphs_go_up_to_the_capture_size_as_vllms_do(tmp_path, tokenizer):
    """A decode step of 300 sequences replays a decode graph (the attention kernel's decode
    tiles) under the default capture size of 512; capped at 256 it falls to a mixed graph."""
    default = _graphs(tmp_path, tokenizer, 512, max_num_seqs=1024)
    assert default.sizes[-1] == 512 and default.mixed_sizes[-1] == 512
    assert default.graph_for(_step([1] * 300)) == (False, 304)
    capped = _graphs(tmp_path, tokenizer, 512, max_num_seqs=1024, max_capture_size=256)
    assert capped.sizes[-1] == 256
    assert capped.graph_for(_step([1] * 300)) == (True, bucketed_num_tokens(300))


def test_enforce_eager_and_cudagraph_mode_are_checked_settings():
    assert EngineConfig().enforce_eager is False
    assert EngineConfig.from_env({"PAGED_CORE_ENFORCE_EAGER": "1"}).enforce_eager is True
    with pytest.raises(ValueError, match="enforce_eager"):
        EngineConfig(enforce_eager="sometimes")
    assert EngineConfig().cudagraph_mode == "FULL"
    assert EngineConfig.from_env({"PAGED_CORE_CUDAGRAPH_MODE": "FULL_DECODE_ONLY"}
                                 ).cudagraph_mode == "FULL_DECODE_ONLY"
    with pytest.raises(ValueError, match="cudagraph_mode must be one of"):
        EngineConfig(cudagraph_mode="PIECEWISE")
    with pytest.raises(ValueError, match="max_cudagraph_capture_size"):
        EngineConfig(max_cudagraph_capture_size=0)


def test_activation_reserve_grows_with_the_step_budget(tmp_path, tokenizer):
    from paged_core.models.model_loader import load_hf_config, load_model

    folder = build_tiny_model("llama", str(tmp_path / "llama"), tokenizer)
    model = load_model(folder, load_hf_config(folder), 128, torch.float32, torch.device("cpu"))
    small, large = (activation_reserve(EngineConfig(max_num_seqs=128, max_num_batched_tokens=n),
                                       model) for n in (512, 8192))
    assert 256 << 20 < small < large


def test_the_cpu_runs_eagerly_without_graphs(tmp_path, tokenizer):
    folder = build_tiny_model("qwen2", str(tmp_path / "qwen2"), tokenizer)
    prompts = [passage_token_ids(tokenizer, n, offset=5 * i) for i, n in enumerate([4, 21])]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outputs = {}
    for eager in (True, False):
        llm = LLM(model=folder, dtype="float32", num_kv_blocks=32, enforce_eager=eager)
        assert llm.engine.core.executor.runner.cuda_graphs is None
        outputs[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, params,
                                                                        use_tqdm=False)]
    assert outputs[True] == outputs[False]
