"""Prepacked oneDNN linears: bf16-native ones give the same numbers as F.linear, float32-computed
ones (CPUs without bf16 dot products) the float32 product rounded once; the engine uses them."""
import pytest
import torch
import torch.nn.functional as F

from paged_core.models.cpu_linear import PackedLinear, packed_linear_dtype

CPU = torch.device("cpu")
NATIVE_BF16 = packed_linear_dtype(CPU, torch.bfloat16) == torch.bfloat16


@pytest.mark.skipif(not NATIVE_BF16, reason="this CPU has no native bfloat16 dot products")
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


def test_which_dtype_packed_linears_compute_in():
    assert packed_linear_dtype(CPU, torch.float32) is None  # float32 keeps F.linear (parity)
    assert packed_linear_dtype(CPU, torch.float16) == torch.float32
    assert packed_linear_dtype(CPU, torch.bfloat16) == (torch.bfloat16 if NATIVE_BF16 else torch.float32)
    assert packed_linear_dtype(torch.device("meta"), torch.bfloat16) is None


def test_bf16_engine_packs_and_fp32_engine_does_not():
    from paged_core import LLM, SamplingParams
    bf16 = LLM(dtype="bfloat16", num_kv_blocks=32)
    model = bf16.engine.runner.model
    assert isinstance(model.layers[0].mlp.down_proj, PackedLinear)
    assert isinstance(model.lm_head, PackedLinear)
    assert model.lm_head.compute_dtype == packed_linear_dtype(CPU, torch.bfloat16)
    out = bf16.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=4),
                        use_tqdm=False)[0].outputs[0]
    assert "Paris" in out.text
    fp32 = LLM(dtype="float32", num_kv_blocks=32)
    assert isinstance(fp32.engine.runner.model.layers[0].mlp.down_proj, torch.nn.Linear)
