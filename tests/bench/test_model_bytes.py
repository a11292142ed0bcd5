"""``model_bytes.step_weight_bytes`` (what ``bench steps`` sets decode steps against): the
weights one decode step reads whole, each view of a shared storage counted for itself, the
input embedding's table only where the LM head multiplies by it; and ``memory_bound``'s
arithmetic."""
import pytest
import torch

from paged_core import LLM
from paged_core.bench.model_bytes import model_bytes, span_bytes, step_weight_bytes
from paged_core.bench.steps import memory_bound

from ..tiny_models import build_tiny_model


def _own_bytes(model) -> int:
    """The same count the plain way: every parameter and tensor attribute of every module but
    the embedding (unless the head is that table), the same tensor once."""
    skipped = model.embed_tokens if model.lm_head is not None else None
    seen = {}
    for module in model.modules():
        if module is skipped:
            continue
        tensors = [*module.parameters(recurse=False),
                   *(v for v in vars(module).values() if isinstance(v, torch.Tensor))]
        for t in tensors:
            key = id(t) if t.is_mkldnn else (t.data_ptr(), t.dtype, tuple(t.shape))
            seen[key] = t.numel() * t.element_size()
    return sum(seen.values())


def _embedding_bytes(model) -> int:
    weight = model.embed_tokens.weight
    return weight.numel() * weight.element_size()


def test_the_embedded_model_in_float32(llm_fp32):
    model = llm_fp32.engine.core.executor.runner.model
    assert step_weight_bytes(model) == _own_bytes(model)
    # SmolLM2 ties its head to the embedding: the table is read whole by the head or, packed
    # apart, by nobody but the head's own copy.
    spec_params = sum(p.numel() for p in model.parameters())
    assert step_weight_bytes(model) >= (spec_params * 4 if model.lm_head is None
                                        else (spec_params * 4 - _embedding_bytes(model)))


@pytest.fixture(scope="module")
def untied_bf16(tokenizer, tmp_path_factory):
    folder = build_tiny_model("llama", str(tmp_path_factory.mktemp("llama") / "llama"), tokenizer)
    return LLM(model=folder, dtype="bfloat16", num_kv_blocks=32)


def test_an_untied_model_skips_the_embedding_table(untied_bf16):
    model = untied_bf16.engine.core.executor.runner.model
    assert model.lm_head is not None  # its own head: a step reads only its tokens' rows
    assert step_weight_bytes(model) == _own_bytes(model)
    assert step_weight_bytes(model) <= model_bytes(model) - _embedding_bytes(model)


def test_views_of_one_storage_count_their_own_bytes():
    arena = torch.zeros(1000, dtype=torch.bfloat16)
    first, second = arena[:100], arena[500:800]
    assert span_bytes([first, second]) == 800
    assert span_bytes([first, first[10:20], arena[50:150]]) == 300  # overlaps once
    assert span_bytes([arena[::2][:10]]) == 38  # first to last element of a strided view


def test_memory_bound_is_bytes_over_bandwidth():
    memory = {"weight_bytes": 200e6, "kv_bytes_per_token": 1e4, "read_gbs": 40.0}
    bound = memory_bound({"mean_context_tokens": 5000, "mean_ms": 10.0}, memory)
    assert bound["mean_bytes"] == 250e6
    assert bound["bound_ms"] == pytest.approx(6.25)
    assert bound["over_bound"] == pytest.approx(1.6)
