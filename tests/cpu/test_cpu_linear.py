"""Prepacked oneDNN linears: bf16-native ones give the same numbers as F.linear, float32-computed
ones (CPUs without bf16 dot products) the float32 product rounded once; the engine uses the
kind ``PAGED_CORE_CPU_ISA`` selects (every kind this host can run is tested)."""
import pytest
import torch
import torch.nn.functional as F

from paged_core.cpu.isa import packed_linear_dtype, selected_bf16_linear, unsupported_reason
from paged_core.models.bf16_dot_linear import BF16_DOT_LEVELS, Bf16DotLinear
from paged_core.models.cpu_linear import PACKED_LINEARS, PackedLinear

CPU = torch.device("cpu")
NO_NATIVE_BF16 = unsupported_reason("avx512_bf16")


@pytest.mark.skipif(NO_NATIVE_BF16 is not None, reason=str(NO_NATIVE_BF16))
@pytest.mark.parametrize("rows", [1, 7, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_native_packed_linear_is_bit_identical_to_f_linear(rows, with_bias):
    torch.manual_seed(0)
    weight = torch.randn(96, 48).bfloat16()
    bias = torch.randn(96).bfloat16() if with_bias else None
    x = torch.randn(rows, 48).bfloat16()
    assert torch.equal(PackedLinear(weight, bias)(x), F.linear(x, weight, bias))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_float32_computed_linear_rounds_the_exact_product_once(dtype, rows):
    torch.manual_seed(0)
    weight, bias = torch.randn(96, 48).to(dtype), torch.randn(96).to(dtype)
    x = torch.randn(rows, 48).to(dtype)
    layer = PackedLinear(weight, bias, torch.float32)
    y = layer(x)
    reference = F.linear(x.double(), weight.double(), bias.double())
    assert y.dtype == dtype and layer.compute_dtype == torch.float32
    # one rounding to ``dtype`` of a float32 sum: within half a unit in the last place (+ fp32 noise)
    assert torch.allclose(y.double(), reference, rtol=torch.finfo(dtype).eps, atol=1e-5)


@pytest.mark.parametrize("level,bf16,fp16", [
    ("generic", None, None),  # plain F.linear
    ("avx2", torch.float32, torch.float32),
    ("avx512", torch.float32, torch.float32),
    ("avx512_bf16", torch.bfloat16, torch.float32),
])
def test_which_dtype_packed_linears_compute_in(level, bf16, fp16):
    assert packed_linear_dtype(CPU, torch.float32, level) is None  # float32 keeps F.linear (parity)
    assert packed_linear_dtype(CPU, torch.bfloat16, level) == bf16
    assert packed_linear_dtype(CPU, torch.float16, level) == fp16
    assert packed_linear_dtype(torch.device("meta"), torch.bfloat16, level) is None


def test_the_setting_picks_the_path_and_refuses_what_the_cpu_lacks(monkeypatch):
    from paged_core.cpu.isa import selected_cpu_isa, supported_cpu_isas
    monkeypatch.setenv("PAGED_CORE_CPU_ISA", "auto")
    assert selected_cpu_isa() == supported_cpu_isas()[-1]
    monkeypatch.setenv("PAGED_CORE_CPU_ISA", "generic")
    assert selected_cpu_isa() == "generic" and packed_linear_dtype(CPU, torch.bfloat16) is None
    monkeypatch.setenv("PAGED_CORE_CPU_ISA", "sse9")
    with pytest.raises(ValueError, match="PAGED_CORE_CPU_ISA='sse9' is not a CPU path"):
        selected_cpu_isa()
    missing = [level for level in ("avx2", "avx512", "avx512_bf16")
               if level not in supported_cpu_isas()]
    for level in missing:  # only on CPUs without it: an error naming the flags, not SIGILL
        monkeypatch.setenv("PAGED_CORE_CPU_ISA", level)
        with pytest.raises(ValueError, match="this CPU lacks"):
            selected_cpu_isa()


def test_bf16_engine_takes_the_selected_linears_and_fp32_engine_keeps_f_linear(cpu_isa):
    from paged_core import LLM, SamplingParams
    bf16 = LLM(dtype="bfloat16", num_kv_blocks=32)
    model = bf16.engine.core.executor.runner.model
    compute_dtype = packed_linear_dtype(CPU, torch.bfloat16, cpu_isa)
    if compute_dtype is None:  # plain F.linear (the tied LM head stays the embedding)
        qkv = model.layers[0].self_attn.qkv_proj
        assert type(qkv) is torch.nn.Linear and qkv.weight.dtype == torch.bfloat16
        assert model.lm_head is None
    else:
        assert isinstance(model.layers[0].mlp.down_proj, PACKED_LINEARS)
        head = model.lm_head
        assert head.compute_dtype == compute_dtype
        if cpu_isa in BF16_DOT_LEVELS and selected_bf16_linear() != "onednn":
            # the bfloat16 linear (float32 FMAs over the bfloat16 weights at avx2 and avx512)
            assert isinstance(head, Bf16DotLinear) and head.level == cpu_isa
        else:
            assert isinstance(head, PackedLinear)
    out = bf16.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=4),
                        use_tqdm=False)[0].outputs[0]
    assert "Paris" in out.text
    fp32 = LLM(dtype="float32", num_kv_blocks=32)
    assert isinstance(fp32.engine.core.executor.runner.model.layers[0].mlp.down_proj, torch.nn.Linear)


def test_an_unknown_bf16_linear_kernel_is_refused_naming_the_setting(monkeypatch):
    monkeypatch.setenv("PAGED_CORE_CPU_LINEAR", "mkl")
    with pytest.raises(ValueError, match="PAGED_CORE_CPU_LINEAR='mkl' is not a bfloat16 linear kernel"):
        selected_bf16_linear()
    monkeypatch.setenv("PAGED_CORE_CPU_LINEAR", "oneDNN")  # any case
    assert selected_bf16_linear() == "onednn"
