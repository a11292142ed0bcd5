"""Prepacked oneDNN bfloat16 linears give the same numbers as F.linear, and the engine uses them."""
import pytest
import torch
import torch.nn.functional as F

from paged_core.models.cpu_linear import PackedLinear, packed_linear_supported

pytestmark = pytest.mark.skipif(not packed_linear_supported(torch.device("cpu"), torch.bfloat16),
                                reason="this CPU has no native bfloat16 dot products")


@pytest.mark.parametrize("rows", [1, 7, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_linear_is_bit_identical_to_f_linear(rows, with_bias):
    torch.manual_seed(0)
    weight = torch.randn(96, 48).bfloat16()
    bias = torch.randn(96).bfloat16() if with_bias else None
    x = torch.randn(rows, 48).bfloat16()
    assert torch.equal(PackedLinear(weight, bias)(x), F.linear(x, weight, bias))


def test_bf16_engine_packs_and_fp32_engine_does_not():
    from paged_core import LLM, SamplingParams
    bf16 = LLM(dtype="bfloat16", num_kv_blocks=32)
    model = bf16.engine.runner.model
    assert isinstance(model.layers[0].mlp.down_proj, PackedLinear)
    assert isinstance(model.lm_head, PackedLinear)
    out = bf16.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=4),
                        use_tqdm=False)[0].outputs[0]
    assert "Paris" in out.text
    fp32 = LLM(dtype="float32", num_kv_blocks=32)
    assert isinstance(fp32.engine.runner.model.layers[0].mlp.down_proj, torch.nn.Linear)
