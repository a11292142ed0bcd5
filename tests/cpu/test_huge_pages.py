"""The CPU KV cache and a loaded model's weights live on 2 MiB pages wherever the kernel
grants them."""
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from paged_core.cpu.huge_pages import (HUGE_PAGE, MIN_WEIGHT_BYTES, move_weights_to_huge_pages,
                                    zeros_on_huge_pages)
from paged_core.models.row_tiles import WeightProduct

WEIGHTS_SETTING = "PAGED_CORE_WEIGHTS_ON_HUGE_PAGES"


def _thp_mode() -> str | None:
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not path.exists():
        return None
    return path.read_text().split("[")[1].split("]")[0]


def _vm_flags(address: int) -> set[str]:
    """The VmFlags of the mapping holding ``address`` (from /proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        first = line.split()[0]
        if "-" in first and ":" not in first:
            start, end = (int(x, 16) for x in first.split("-"))
            inside = start <= address < end
        elif inside and first == "VmFlags:":
            return set(line.split()[1:])
    return set()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zeros_with_the_asked_shape_and_dtype(dtype):
    for shape in ((3, 700, 16, 64), (2, 3)):  # over and under one huge page
        t = zeros_on_huge_pages(shape, dtype)
        assert t.shape == shape and t.dtype == dtype and t.is_contiguous()
        assert not t.any()
        t.fill_(1)  # writable, and the whole span is the tensor's own
        assert (t == 1).all()


needs_thp = pytest.mark.skipif(
    not sys.platform.startswith("linux") or _thp_mode() in (None, "never"),
    reason="needs Linux with transparent huge pages in madvise or always mode")


@needs_thp
def test_the_memory_is_advised_onto_huge_pages():
    """Whether the kernel then grants 2 MiB pages depends on its free memory and
    fragmentation at that moment, so what is asserted is the advice ("hg" flag)."""
    t = zeros_on_huge_pages((64 * HUGE_PAGE // 2,), torch.bfloat16)  # 64 MiB
    assert t.data_ptr() % HUGE_PAGE == 0
    assert "hg" in _vm_flags(t.data_ptr())


def test_engines_keep_their_kv_cache_on_huge_pages_on_cpu():
    from paged_core import LLM

    runner = LLM(dtype="bfloat16", kv_cache_memory="256MiB").engine.core.executor.runner
    k_cache = runner.kv_caches[0][0]
    assert k_cache.data_ptr() % HUGE_PAGE == 0 and not k_cache.any()


class _Holder(nn.Module):
    """Weights held every way a model holds them: a parameter, a buffer, plain tensor
    attributes (packed weights) of which two share one storage, and one below the size
    that moves."""

    def __init__(self) -> None:
        super().__init__()
        big = HUGE_PAGE // 4 + 3  # float32 elements: over a huge page each
        self.weight = nn.Parameter(torch.randn(big), requires_grad=False)
        self.register_buffer("table", torch.arange(2 * big, dtype=torch.int32).view(2, big))
        self.packed = torch.randn(3, big, dtype=torch.float64).to(torch.bfloat16)
        self.packed_rows = self.packed[1:]  # a view of packed's storage
        self.small = torch.randn(16)


@needs_thp
def test_moved_weights_keep_their_values_layout_and_sharing():
    holder = nn.Sequential(_Holder(), _Holder())
    before = {name: t.clone() for name, t in _tensors(holder).items()}
    to_move = sum(t.untyped_storage().nbytes() for name, t in _tensors(holder).items()
                  if not name.endswith(("small", "packed_rows")))
    params = [p for p in holder.parameters()]
    small_ptrs = [m.small.data_ptr() for m in holder]

    moved = move_weights_to_huge_pages(holder)

    after = _tensors(holder)
    assert to_move <= moved < to_move + 64 * 6  # each storage once, on a 64-byte boundary
    for name, t in after.items():
        assert torch.equal(t, before[name]) and t.dtype == before[name].dtype, name
        assert t.stride() == before[name].stride(), name
    assert [p for p in holder.parameters()] == params  # the same Parameter objects
    for m in holder:
        assert m.packed_rows.untyped_storage().data_ptr() == m.packed.untyped_storage().data_ptr()
        assert m.packed_rows.data_ptr() == m.packed.data_ptr() + m.packed.stride(0) * 2
        assert "hg" in _vm_flags(m.packed.data_ptr()) and "hg" in _vm_flags(m.weight.data_ptr())
        assert "table" in dict(m.named_buffers())
    assert [m.small.data_ptr() for m in holder] == small_ptrs  # small tensors stay


@needs_thp
def test_a_parameter_held_by_two_modules_keeps_its_values_in_both():
    """A tied LM head wraps the embedding's own Parameter object (``WeightProduct``, as
    batch-invariant mode does): both holders see the weight's values after the move, the
    first rebinding must not shift where the second looks."""
    embedding = nn.Embedding(HUGE_PAGE // 256, 128)  # 2 MiB of float32
    head = WeightProduct(embedding.weight)
    model = nn.ModuleDict({"embed": embedding, "head": head})
    before = embedding.weight.detach().clone()

    assert move_weights_to_huge_pages(model) >= before.untyped_storage().nbytes()

    assert head.weight is embedding.weight and torch.equal(embedding.weight, before)
    x = torch.randn(3, 128)
    assert torch.equal(head(x), F.linear(x, before))
    assert "hg" in _vm_flags(embedding.weight.data_ptr())


def test_weights_under_one_huge_page_stay_where_they_are():
    tiny = nn.Linear(64, MIN_WEIGHT_BYTES // 256)  # one weight of MIN_WEIGHT_BYTES
    address = tiny.weight.data_ptr()
    assert move_weights_to_huge_pages(tiny) == 0 and tiny.weight.data_ptr() == address


def _tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    return {f"{i}.{name}": getattr(m, name) for i, m in enumerate(module)
            for name in ("weight", "table", "packed", "packed_rows", "small")}


@needs_thp
def test_a_loaded_model_streams_its_weights_from_huge_pages_and_says_the_same(monkeypatch):
    from paged_core import LLM, SamplingParams

    greedy = SamplingParams(max_tokens=12, temperature=0)
    prompt = ["The capital of France is"]
    monkeypatch.setenv(WEIGHTS_SETTING, "false")
    plain = LLM(dtype="bfloat16", kv_cache_memory="64MiB")
    expected = plain.generate(prompt, greedy, use_tqdm=False)[0].outputs[0].token_ids
    del plain
    monkeypatch.setenv(WEIGHTS_SETTING, "true")
    llm = LLM(dtype="bfloat16", kv_cache_memory="64MiB")
    model = llm.engine.core.executor.runner.model
    weights = [model.embed_tokens.weight]
    for layer in model.layers:  # packed on CPUs with AVX512-BF16; oneDNN's opaque ones stay
        for projection in (layer.self_attn.qkv_proj, layer.mlp.down_proj):
            weight = getattr(projection, "packed_weight", getattr(projection, "weight", None))
            if weight is not None and weight.layout == torch.strided:
                weights.append(weight)
    assert all("hg" in _vm_flags(w.data_ptr()) for w in weights)
    assert llm.generate(prompt, greedy, use_tqdm=False)[0].outputs[0].token_ids == expected


def test_a_setting_that_is_not_a_boolean_is_refused_by_name(monkeypatch):
    from paged_core import LLM

    monkeypatch.setenv(WEIGHTS_SETTING, "sometimes")
    with pytest.raises(ValueError, match=WEIGHTS_SETTING):
        LLM(dtype="bfloat16", kv_cache_memory="64MiB")
