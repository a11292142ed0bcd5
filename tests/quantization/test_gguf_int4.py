"""GGUF 4-bit projections served 4-bit (``quantization="gguf"``): exact levels, parity with
transformers reading the same file (the embedded folder is transformers' own load of the
embedded Q4_1 GGUF), clear refusals."""
import pytest
import torch
import torch.nn.functional as F

from paged_core import LLM, EngineConfig
from paged_core.models.embedded_model import embedded_gguf_path
from paged_core.quantization.gguf_weights import gguf_weights
from paged_core.quantization.int4_linear import Int4Linear, Int4Weight
from paged_core.quantization.int8_linear import Int8Linear, Int8Weight

from ..reference import assert_close_with_cached_prefix, hf_greedy_top_logprobs, \
    passage_token_ids

TOP_K = 5


def test_every_projection_and_the_lm_head_decode_to_transformers_weights_exactly(embedded_folder):
    """Every projection of the 30 layers is Q4_1; the LM head is the Q8_0 token embedding
    (the file ties the two), whose dense copy transformers made the embedding."""
    from safetensors.torch import load_file
    import glob

    dense = {}
    for path in glob.glob(f"{embedded_folder}/*.safetensors"):
        dense.update(load_file(path))
    weights = gguf_weights(embedded_gguf_path(), num_heads=9, num_kv_heads=3)
    head = weights.pop("lm_head")
    assert isinstance(head, Int8Weight) and head.group_size == 32
    assert torch.equal(head.dequantize(), dense["model.embed_tokens.weight"].float())
    assert len(weights) == 30 * 7
    for name, weight in weights.items():
        assert isinstance(weight, Int4Weight)
        assert torch.equal(weight.dequantize(), dense[f"{name}.weight"].float()), name


@pytest.mark.parametrize("group_size", [32, 64])
def test_int4_linear_equals_the_dequantized_product(group_size):
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (48, 128), generator=gen, dtype=torch.uint8)
    scales = torch.rand(48, 128 // group_size, generator=gen) * 0.02
    zeros = torch.randn(48, 128 // group_size, generator=gen) * 0.01
    weight, bias = Int4Weight(q, scales, zeros, group_size), torch.randn(48, generator=gen)
    x = torch.randn(2, 3, 128, generator=gen)
    expected = F.linear(x, weight.dequantize(), bias)
    linear = Int4Linear(weight, True, torch.float32)
    linear.bias.copy_(bias)
    assert torch.allclose(linear(x), expected, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gguf_int4_engine_is_close_to_transformers(embedded_folder, tokenizer, dtype):
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(
        embedded_folder, dtype=getattr(torch, dtype)).eval()
    system = passage_token_ids(tokenizer, 40)
    prompts = [system + passage_token_ids(tokenizer, n, offset=50 + 9 * i)
               for i, n in enumerate([4, 30])] + [passage_token_ids(tokenizer, 7, offset=3)]
    expected = [hf_greedy_top_logprobs(reference, p, 16, TOP_K) for p in prompts]
    llm = LLM(dtype=dtype, quantization="gguf", num_kv_blocks=64, enable_prefix_caching=True)
    model = llm.engine.core.executor.runner.model
    assert type(model.layers[0].mlp.down_proj) is Int4Linear
    assert type(model.lm_head) is Int8Linear  # the file's Q8_0 token embedding
    assert_close_with_cached_prefix(llm, prompts, expected, 16, TOP_K)
    llm.shutdown()


def test_bad_quantization_settings_are_refused_by_name(embedded_folder):
    with pytest.raises(ValueError, match="quantization must be one of"):
        EngineConfig(quantization="bogus")
    with pytest.raises(ValueError, match="quantization='gguf' does not match model"):
        EngineConfig(model=embedded_folder, quantization="gguf")
    assert EngineConfig.from_env({"PAGED_CORE_QUANTIZATION": "gguf"}).quantization == "gguf"
