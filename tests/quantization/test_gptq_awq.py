"""GPTQ and AWQ checkpoints served quantized (``gptq_format``, ``awq_format``).

gptqmodel (the GPTQ writer, and transformers' only GPTQ/AWQ loader) would replace this
venv's torch, numpy and triton, so it is not installed: the checkpoints here are written by
this file in the exact layouts gptqmodel writes (its ``pack_original`` loops for GPTQ, the
v1 zero points minus one per word, ``pack_awq_columns`` with AWQ's order) from a
round-to-nearest quantization computed here, act-order as a random permutation's ``g_idx``.
The reference is each checkpoint's *dequantized twin*, a float folder with the weights the
levels stand for, loaded by transformers.

``data/gptqmodel_q_proj.safetensors`` is the one piece written by gptqmodel 7.7.0 itself (in
a separate venv, on CPU): a tiny llama's ``q_proj`` quantized by ``GPTQModel.quantize``
(GPTQ 4-bit, group 32, ``desc_act``, asymmetric, v1; and AWQ GEMM, group 32), its tensors
as saved, its ``quantization_config`` in the metadata, and gptqmodel's own dequantization
(``TorchLinear.dequantize_weight`` / ``dequantize_gemm``, float32 scales) beside them.
"""
import json
import os

import pytest
import torch
import torch.nn.functional as F

from paged_core import LLM, SamplingParams
from paged_core.quantization.act_order import ActOrderLinear, ActOrderWeight
from paged_core.quantization.awq_format import AwqFormat
from paged_core.quantization.gptq_format import GptqFormat
from paged_core.quantization.int4_linear import Int4Linear
from paged_core.quantization.projections import _shard, quantized_linear

from ..reference import assert_close_with_cached_prefix, assert_greedy_close, \
    engine_top_logprobs, hf_greedy_top_logprobs, passage_token_ids
from ..tiny_models import build_tiny_model

TOP_K = 5
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


# --- a round-to-nearest quantizer and the writers of each layout ---------------------------

def rtn(weight, group_size, bits=4, sym=False, order=None):
    """Levels ``[out, in]``, fp16-exact scales and zero points ``[out, groups]`` and ``g_idx``
    of ``weight``; with ``order``, group ``k`` holds features ``order[k*gs:(k+1)*gs]``."""
    out, width = weight.shape
    order = torch.arange(width) if order is None else order
    grouped = weight[:, order].view(out, width // group_size, group_size)
    maxq = (1 << bits) - 1
    if sym:
        scale = grouped.abs().amax(-1) * 2 / maxq
        zero = torch.full_like(scale, 1 << (bits - 1))
    else:
        low, high = grouped.amin(-1).clamp(max=0), grouped.amax(-1).clamp(min=0)
        scale = (high - low) / maxq
    scale = scale.clamp(min=1e-4).half().float()
    if not sym:
        zero = torch.round(-low / scale).clamp(0, maxq)
    levels = torch.clamp(torch.round(grouped / scale[..., None]) + zero[..., None], 0, maxq)
    q = torch.empty(out, width, dtype=torch.int64)
    q[:, order] = levels.view(out, width).long()
    g_idx = torch.empty(width, dtype=torch.int32)
    g_idx[order] = (torch.arange(width) // group_size).int()
    return q, scale, zero.long(), g_idx


def twin_weight(q, scale, zero, g_idx):
    """What the levels stand for: ``scale[g] * (q - zero[g])`` per feature's group ``g``."""
    g = g_idx.long()
    return scale[:, g] * (q - zero[:, g]).float()


def to_int32(words):
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def pack_gptq_rows(values, bits):
    """gptqmodel's ``qweight[row] |= w[row * p + j] << (bits * j)`` over ``[in, out]``."""
    p = 32 // bits
    packed = torch.zeros(values.shape[0] // p, values.shape[1], dtype=torch.int64)
    for row in range(packed.shape[0]):
        for j in range(p):
            packed[row] |= values[row * p + j] << (bits * j)
    return packed


def pack_gptq_columns(values, bits):
    """gptqmodel's ``qzeros[:, col] |= z[:, col * p + j] << (bits * j)`` over ``[groups, out]``."""
    return pack_gptq_rows(values.T.contiguous(), bits).T.contiguous()


def gptq_tensors(q, scale, zero, g_idx, bits=4, version="gptq"):
    qzeros = pack_gptq_columns(zero.T.contiguous(), bits)
    if version == "gptq":  # v1: zero points minus one, subtracted from the whole word
        qzeros = (qzeros - sum(1 << (bits * i) for i in range(32 // bits))) & 0xFFFFFFFF
    return {"qweight": to_int32(pack_gptq_rows(q.T.contiguous(), bits)),
            "qzeros": to_int32(qzeros), "scales": scale.T.contiguous().half(), "g_idx": g_idx}


def pack_awq(values):
    """gptqmodel's ``pack_awq_columns(values, 4, order=AWQ_ORDER)`` over ``[rows, out]``."""
    grouped = values.view(values.shape[0], -1, 8)[..., AWQ_ORDER]
    packed = torch.zeros(grouped.shape[:2], dtype=torch.int64)
    for i in range(8):
        packed |= grouped[..., i] << (4 * i)
    return to_int32(packed)


def awq_tensors(q, scale, zero):
    return {"qweight": pack_awq(q.T.contiguous()), "qzeros": pack_awq(zero.T.contiguous()),
            "scales": scale.T.contiguous().half()}


def random_weight(out, width, seed):
    weight = torch.randn(out, width, generator=torch.Generator().manual_seed(seed)) * 0.05
    weight[0] = weight[0].abs()  # row 0's zero points are 0: v1 stores -1, borrowing
    return weight


# --- decoding ------------------------------------------------------------------------------

@pytest.mark.parametrize("sym", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("act_order", [False, True], ids=["in-order", "act-order"])
@pytest.mark.parametrize("version", ["gptq", "gptq_v2"])
def test_gptq_decodes_to_the_dequantized_weights_exactly(sym, act_order, version):
    weight = random_weight(48, 128, seed=1)
    order = torch.randperm(128, generator=torch.Generator().manual_seed(2)) if act_order else None
    q, scale, zero, g_idx = rtn(weight, 32, sym=sym, order=order)
    reader = GptqFormat({"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": sym,
                         "desc_act": act_order, "checkpoint_format": version})
    decoded = reader.decode("m", gptq_tensors(q, scale, zero, g_idx, version=version))
    assert isinstance(decoded, ActOrderWeight) == act_order
    expected = twin_weight(q, scale, zero, g_idx)
    assert torch.equal(decoded.dequantize(), expected)
    x = torch.randn(3, 128)
    for rows in (x[:2], x.repeat(30, 1)):  # the int4 kernel's rows and the dense path's
        linear = quantized_linear([decoded], False, torch.float32)
        assert isinstance(linear, ActOrderLinear) == act_order
        assert torch.allclose(linear(rows), F.linear(rows, expected), atol=1e-4)


@pytest.mark.parametrize("group_size", [-1, 128])
def test_gptq_groups_are_fitted_to_the_kernels_exactly(group_size):
    weight = random_weight(32, 96, seed=3)  # 96 features: one group, or 128 covering them
    q, scale, zero, g_idx = rtn(weight, 96, order=None)
    reader = GptqFormat({"quant_method": "gptq", "bits": 4, "group_size": group_size})
    decoded = reader.decode("m", gptq_tensors(q, scale, zero, g_idx // 96))
    assert decoded.group_size == {-1: 96, 128: 32}[group_size]  # 128 over 96: split in 32s
    assert torch.equal(decoded.dequantize(), twin_weight(q, scale, zero, g_idx // 96))


@pytest.mark.parametrize("sym", [True, False], ids=["sym", "asym"])
def test_gptq_8bit_decodes_to_int8_exactly(sym):
    """Asymmetric: ``(level - 128) * scale + (128 - zero_point) * scale``, both products and
    their sum exact in float32 for float16 scales."""
    weight = random_weight(32, 128, seed=4)
    q, scale, zero, g_idx = rtn(weight, 64, bits=8, sym=sym)
    reader = GptqFormat({"quant_method": "gptq", "bits": 8, "group_size": 64, "sym": sym})
    decoded = reader.decode("m", gptq_tensors(q, scale, zero, g_idx, bits=8))
    assert (decoded.zeros is None) == sym
    expected = twin_weight(q, scale, zero, g_idx)
    assert torch.equal(decoded.dequantize(), expected)
    x = torch.randn(2, 128)
    for dtype in (torch.float32, torch.bfloat16):
        product = quantized_linear([decoded], False, dtype)(x.to(dtype)).float()
        torch.testing.assert_close(product, F.linear(x.to(dtype).float(), expected),
                                   atol=1e-4 if dtype is torch.float32 else 2e-2, rtol=1e-2)


def test_awq_decodes_to_the_dequantized_weights_exactly():
    weight = random_weight(48, 128, seed=5)
    q, scale, zero, g_idx = rtn(weight, 64)
    decoded = AwqFormat({"quant_method": "awq", "version": "gemm", "bits": 4,
                         "group_size": 64}).decode("m", awq_tensors(q, scale, zero))
    assert torch.equal(decoded.dequantize(), twin_weight(q, scale, zero, g_idx))


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_gptqmodel_written_weights_decode_to_gptqmodels_dequantization(method):
    from safetensors import safe_open

    path = os.path.join(os.path.dirname(__file__), "data", "gptqmodel_q_proj.safetensors")
    with safe_open(path, framework="pt") as f:
        config = json.loads(f.metadata()[method])
        tensors = {name.split(".", 1)[1]: f.get_tensor(name) for name in f.keys()
                   if name.startswith(f"{method}.")}
    reader = (GptqFormat if method == "gptq" else AwqFormat)(config)
    decoded = reader.decode("q_proj", tensors)
    assert isinstance(decoded, ActOrderWeight) == (method == "gptq")
    assert torch.equal(decoded.dequantize(), tensors["dequantized"])


def test_gptq_dynamic_overrides_bits_per_module():
    weight = random_weight(32, 64, seed=10)
    q, scale, zero, g_idx = rtn(weight, 32, bits=8, sym=True)
    reader = GptqFormat({"bits": 4, "group_size": 32, "sym": True,
                         "dynamic": {r"+:.*down_proj": {"bits": 8}, r"-:.*lm_head": {}}})
    decoded = reader.decode("model.layers.0.mlp.down_proj",
                            gptq_tensors(q, scale, zero, g_idx, bits=8))
    assert torch.equal(decoded.dequantize(), twin_weight(q, scale, zero, g_idx))


def test_bad_variants_are_refused_by_name():
    with pytest.raises(ValueError, match="m: 3-bit GPTQ weights are not served"):
        GptqFormat({"bits": 3, "group_size": 32}).decode("m", {})
    q, scale, zero, g_idx = rtn(random_weight(32, 48, seed=7), 8)
    with pytest.raises(ValueError, match="m: groups of 8 over 48 input features"):
        GptqFormat({"bits": 4, "group_size": 8}).decode("m", gptq_tensors(q, scale, zero, g_idx))
    scattered = {**gptq_tensors(q, scale, zero, g_idx), "g_idx": torch.zeros(48, dtype=torch.int32)}
    with pytest.raises(ValueError, match="m: g_idx does not split"):
        GptqFormat({"bits": 4, "group_size": 8}).decode("m", scattered)
    with pytest.raises(ValueError, match="checkpoint_format 'marlin' is not served"):
        GptqFormat({"bits": 4, "checkpoint_format": "marlin"})
    with pytest.raises(ValueError, match="AWQ version 'gemv' is not served"):
        AwqFormat({"version": "GEMV", "bits": 4, "group_size": 128})
    with pytest.raises(ValueError, match="AWQ weights without qzeros"):
        AwqFormat({"version": "gemm", "bits": 4, "group_size": 32}).decode(
            "m", {k: v for k, v in awq_tensors(*rtn(random_weight(32, 64, seed=6), 32)[:3]).items()
                  if k != "qzeros"})


def test_act_order_cannot_be_cut_row_parallel():
    weight = random_weight(32, 128, seed=8)
    order = torch.randperm(128, generator=torch.Generator().manual_seed(9))
    q, scale, zero, g_idx = rtn(weight, 32, order=order)
    decoded = GptqFormat({"bits": 4, "group_size": 32, "desc_act": True}).decode(
        "model.layers.0.self_attn.o_proj", gptq_tensors(q, scale, zero, g_idx))

    class RowParallel:
        def slice_of(self, name, shape):
            return (slice(None), slice(0, 64))

    with pytest.raises(ValueError, match="o_proj: an act-order .* tensor parallelism"):
        _shard(RowParallel(), "model.layers.0.self_attn.o_proj", decoded)


# --- the engine on whole checkpoints -------------------------------------------------------

def write_quantized(folder, quantized_folder, twin_folder, method, group_size, seed=0):
    """``folder``'s projections quantized into ``quantized_folder`` (GPTQ v1 asymmetric with
    act-order: q/k/v share a permutation, gate and up each have their own; or AWQ) and their
    dequantized twin into ``twin_folder``."""
    import shutil

    from safetensors.torch import load_file, save_file

    gen = torch.Generator().manual_seed(seed)
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    quantized, twin = dict(tensors), dict(tensors)
    orders = {}
    modules = [name.removesuffix(".weight") for name in tensors
               if name.endswith(tuple(f"{p}.weight" for p in PROJECTIONS))]
    for module in sorted(modules):
        name, weight = f"{module}.weight", tensors[f"{module}.weight"].float()
        order = None
        if method == "gptq":
            key = module[:-len("q_proj")] if module.endswith(("q_proj", "k_proj", "v_proj")) \
                else module
            order = orders.setdefault(key, torch.randperm(weight.shape[1], generator=gen))
        q, scale, zero, g_idx = rtn(weight, group_size, order=order)
        del quantized[name]
        parts = gptq_tensors(q, scale, zero, g_idx) if method == "gptq" else \
            awq_tensors(q, scale, zero)
        quantized.update({f"{module}.{part}": t for part, t in parts.items()})
        twin[name] = twin_weight(q, scale, zero, g_idx)
    config = {"gptq": {"quant_method": "gptq", "bits": 4, "group_size": group_size,
                       "desc_act": True, "sym": False, "checkpoint_format": "gptq"},
              "awq": {"quant_method": "awq", "version": "gemm", "bits": 4,
                      "group_size": group_size, "zero_point": True}}[method]
    for target, weights in ((quantized_folder, quantized), (twin_folder, twin)):
        shutil.copytree(folder, target)
        save_file(weights, os.path.join(target, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(quantized_folder, "config.json")) as f:
        hf_config = json.load(f)
    hf_config["quantization_config"] = config
    with open(os.path.join(quantized_folder, "config.json"), "w") as f:
        json.dump(hf_config, f)


@pytest.mark.parametrize("method,model_type", [("gptq", "llama"), ("awq", "qwen2")])
def test_engine_is_close_to_transformers_on_the_dequantized_twin(method, model_type, tmp_path,
                                                                 tokenizer):
    from transformers import AutoModelForCausalLM

    dense = build_tiny_model(model_type, str(tmp_path / "dense"), tokenizer)
    quantized, twin = str(tmp_path / method), str(tmp_path / "twin")
    write_quantized(dense, quantized, twin, method, group_size=32)
    reference = AutoModelForCausalLM.from_pretrained(twin, dtype=torch.float32).eval()
    system = passage_token_ids(tokenizer, 40)
    prompts = [system + passage_token_ids(tokenizer, n, offset=50 + 9 * i)
               for i, n in enumerate([4, 30])] + [passage_token_ids(tokenizer, 7, offset=3)]
    expected = [hf_greedy_top_logprobs(reference, p, 12, TOP_K) for p in prompts]
    llm = LLM(model=quantized, dtype="float32", num_kv_blocks=64, enable_prefix_caching=True)
    layer = llm.engine.core.executor.runner.model.layers[0]
    if method == "gptq":  # q/k/v share one order; gate and up run as two act-order linears
        assert type(layer.self_attn.qkv_proj) is ActOrderLinear
        assert [type(p) for p in layer.mlp.gate_up_proj.parts] == [ActOrderLinear] * 2
    else:
        assert type(layer.self_attn.qkv_proj) is Int4Linear
    assert_close_with_cached_prefix(llm, prompts, expected, 12, TOP_K)
    llm.shutdown()


def test_awq_with_biases_under_tensor_parallelism_is_close_to_transformers(tmp_path, tokenizer):
    """Two ranks cut the decoded weights; the q/k/v biases (dense) are sliced as read."""
    from transformers import AutoModelForCausalLM

    dense = build_tiny_model("qwen2", str(tmp_path / "dense"), tokenizer)
    quantized, twin = str(tmp_path / "awq"), str(tmp_path / "twin")
    write_quantized(dense, quantized, twin, "awq", group_size=32)
    reference = AutoModelForCausalLM.from_pretrained(twin, dtype=torch.float32).eval()
    prompts = [passage_token_ids(tokenizer, n, offset=3 * i) for i, n in enumerate([5, 30])]
    expected = [hf_greedy_top_logprobs(reference, p, 8, TOP_K) for p in prompts]
    llm = LLM(model=quantized, dtype="float32", num_kv_blocks=32, tensor_parallel_size=2)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=TOP_K)
    try:
        for out, (tokens, tops) in zip(llm.generate(prompts, params, use_tqdm=False), expected):
            completion = out.outputs[0]
            assert_greedy_close(completion.token_ids, engine_top_logprobs(completion), tokens, tops)
    finally:
        llm.shutdown()
