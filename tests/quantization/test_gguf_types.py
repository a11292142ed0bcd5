"""GGUF tensor types beyond Q4_0/Q4_1: Q8_0, Q2_K, Q3_K, Q4_K, Q6_K, Q5_0, Q5_1, Q5_K,
IQ4_NL and IQ4_XS served quantized, exactly (decoded blocks equal ``gguf.quants.dequantize``),
the codebook IQ types dense; q/k rows
back in Hugging Face order whatever the type; an engine on a GGUF file mixing Q8_0, Q4_K,
Q6_K, Q4_1, Q5_0, Q5_1, Q5_K and F16 projections stays greedy-close to transformers reading
the same file."""
import logging
import re

import numpy as np
import pytest
import torch

from paged_core import LLM, SamplingParams
from paged_core.bench.llama_cpp_build import built_binary
from paged_core.models.embedded_model import converted_folder_for, embedded_gguf_path
from paged_core.quantization.gguf_weights import decode, gguf_weights, log_served
from paged_core.quantization.int4_linear import Int4Linear, Int4Weight
from paged_core.quantization.int8_linear import Int8Linear, Int8Weight
from paged_core.quantization.projections import ConcatLinear

from ..reference import assert_greedy_close, engine_top_logprobs, hf_greedy_top_logprobs, \
    passage_token_ids
from .gguf_blocks import quantize, requantized_copy

# type -> (weight, group size)
QUANTIZED = {"Q4_0": (Int4Weight, 32), "Q4_1": (Int4Weight, 32), "Q8_0": (Int8Weight, 32),
             "Q4_K": (Int4Weight, 32), "Q6_K": (Int8Weight, 16), "Q5_0": (Int8Weight, 32),
             "Q5_1": (Int8Weight, 32), "Q5_K": (Int8Weight, 32), "Q2_K": (Int4Weight, 16),
             "Q3_K": (Int4Weight, 16)}


def _dequantized(raw: np.ndarray, kind: str) -> torch.Tensor:
    from gguf import GGMLQuantizationType, quants
    return torch.from_numpy(quants.dequantize(raw, GGMLQuantizationType[kind]))


@pytest.mark.parametrize("kind", sorted(QUANTIZED))
def test_blocks_written_by_gguf_decode_to_what_gguf_dequantizes(kind):
    data = np.random.default_rng(0).standard_normal((8, 512)).astype(np.float32)
    raw = quantize(data, kind)
    weight = decode(raw, 8, 512, kind)
    assert (type(weight), weight.group_size) == QUANTIZED[kind]
    assert torch.equal(weight.dequantize(), _dequantized(raw, kind))


def test_any_q6_k_bytes_decode_to_what_gguf_dequantizes():
    """Every bit of ``ql`` / ``qh`` and negative int8 scales, which the writer never makes."""
    raw = np.random.default_rng(3).integers(0, 256, (4, 2, 210), dtype=np.uint8)
    raw[..., 208:210] = np.float16(0.01).reshape(1).view(np.uint8)  # a finite d
    weight = decode(raw.reshape(4, -1), 4, 512, "Q6_K")
    assert (weight.scales < 0).any() and weight.q.min() == -32 and weight.q.max() == 31
    assert torch.equal(weight.dequantize(), _dequantized(raw.reshape(4, -1), "Q6_K"))


def test_any_q5_0_bytes_decode_to_what_gguf_dequantizes():
    """Every bit of ``qh`` (each weight's fifth bit) and of the nibbles: levels -16..15."""
    raw = np.random.default_rng(4).integers(0, 256, (4, 16, 22), dtype=np.uint8)
    raw[..., 0:2] = np.float16(-0.01).reshape(1).view(np.uint8)  # a finite, negative d
    weight = decode(raw.reshape(4, -1), 4, 512, "Q5_0")
    assert weight.q.min() == -16 and weight.q.max() == 15
    assert torch.equal(weight.dequantize(), _dequantized(raw.reshape(4, -1), "Q5_0"))


@pytest.mark.parametrize("kind, d_at, blocks, size, levels", [
    ("Q2_K", 80, 2, 84, (0, 3)), ("Q3_K", 108, 2, 110, (0, 7))])
def test_any_q2_k_and_q3_k_bytes_decode_to_what_gguf_dequantizes(kind, d_at, blocks, size,
                                                                  levels):
    """Every bit of the 2-bit fields, Q3_K's hmask and packed 6-bit scales, Q2_K's scale and
    minimum nibbles: int4 groups of 16 (Q3_K's levels -4..3 stored plus 4)."""
    raw = np.random.default_rng(6).integers(0, 256, (8, blocks, size), dtype=np.uint8)
    raw[..., d_at:size] = np.float16([0.01, -0.02][:(size - d_at) // 2]).view(np.uint8)
    weight = decode(raw.reshape(8, -1), 8, 512, kind)
    assert (type(weight), weight.group_size) == (Int4Weight, 16)
    assert (weight.q.min(), weight.q.max()) == levels
    assert torch.equal(weight.dequantize(), _dequantized(raw.reshape(8, -1), kind))


@pytest.mark.parametrize("kind, blocks, size", [("IQ4_NL", 16, 18), ("IQ4_XS", 2, 136)])
def test_any_iq4_bytes_decode_to_what_gguf_dequantizes(kind, blocks, size):
    """Every nibble an index into llama.cpp's table (levels -127..113), IQ4_XS's scale bits:
    int8 groups of 32."""
    raw = np.random.default_rng(7).integers(0, 256, (8, blocks, size), dtype=np.uint8)
    raw[..., 0:2] = np.float16(0.01).reshape(1).view(np.uint8)  # a finite d
    weight = decode(raw.reshape(8, -1), 8, 512, kind)
    assert (type(weight), weight.group_size) == (Int8Weight, 32)
    assert (weight.q.min(), weight.q.max()) == (-127, 113)
    assert torch.equal(weight.dequantize(), _dequantized(raw.reshape(8, -1), kind))


@pytest.mark.parametrize("kind, blocks, size", [("Q5_1", 16, 24), ("Q5_K", 2, 176)])
def test_any_q5_1_and_q5_k_bytes_decode_to_what_gguf_dequantizes(kind, blocks, size):
    """Every bit of ``qh``, the nibbles (and Q5_K's packed 6-bit scales and minimums): levels
    0..31 with zeros, the minimums."""
    raw = np.random.default_rng(5).integers(0, 256, (4, blocks, size), dtype=np.uint8)
    raw[..., 0:4] = np.float16([0.01, -0.02]).view(np.uint8)  # finite d and m / dmin
    weight = decode(raw.reshape(4, -1), 4, 512, kind)
    assert weight.q.min() == 0 and weight.q.max() == 31 and weight.zeros is not None
    assert torch.equal(weight.dequantize(), _dequantized(raw.reshape(4, -1), kind))


# the largest and mean error of the test writers' K-quant blocks on standard normal weights
@pytest.mark.parametrize("kind, largest, mean", [
    ("Q4_K", 0.35, 0.1),  # 16 levels over a ~6-sigma range
    ("Q5_K", 0.18, 0.05),  # 32 levels over the same range
    ("Q2_K", 1.0, 0.3),  # 4 levels over a sub-block of 16's range
    ("Q3_K", 1.0, 0.16),  # 8 levels over twice its largest magnitude
    ("Q6_K", 0.08, 0.025),  # 64 levels over twice a sub-block of 16's largest magnitude
])
def test_k_quant_writers_are_close_to_their_input(kind, largest, mean):
    data = np.random.default_rng(1).standard_normal((4, 256)).astype(np.float32)
    error = (_dequantized(quantize(data, kind), kind) - torch.from_numpy(data)).abs()
    assert error.max() < largest and error.mean() < mean


@pytest.mark.parametrize("kind", ["IQ2_XS", "IQ3_S", "F16"])
def test_types_that_fit_no_kernel_group_are_left_dense(kind):
    assert decode(np.zeros((4, 256), np.uint8), 4, 256, kind) is None


def _permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's rotary interleave of q/k rows (``convert_hf_to_gguf.py``'s ``permute``)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("kind", sorted(QUANTIZED))
def test_q_and_k_rows_come_back_in_hugging_face_order_for_every_type(tmp_path, kind):
    import gguf

    rng, heads = np.random.default_rng(2), {"attn_q": 4, "attn_k": 2}
    hf = {name: torch.from_numpy(rng.standard_normal((16 * n, 256)).astype(np.float32))
          for name, n in heads.items()}
    path = str(tmp_path / "tiny.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    raws = {}
    for name, w in hf.items():
        raws[name] = quantize(_permute(w, heads[name]).numpy(), kind)
        writer.add_tensor(f"blk.0.{name}.weight", raws[name],
                          raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    weights = gguf_weights(path, num_heads=4, num_kv_heads=2)
    for name, module in (("attn_q", "q_proj"), ("attn_k", "k_proj")):
        ours = weights[f"model.layers.0.self_attn.{module}"].dequantize()
        assert torch.equal(_permute(ours, heads[name]), _dequantized(raws[name], kind))
    assert f"{kind} 0 quantized / 2 dense" in log_served(path, set())


def test_the_lm_head_is_the_output_tensor_or_else_the_token_embedding(tmp_path):
    """An untied file's ``output`` (Q6_K, as llama.cpp's Q4_K_M writes it) is the LM head; a
    tied file's ``token_embd`` (Q8_0) is; a dense one leaves the head to the loader."""
    import gguf

    rng = np.random.default_rng(3)
    dense = {name: rng.standard_normal((64, 256)).astype(np.float32)
             for name in ("token_embd", "output")}

    def write(path, kinds):
        writer = gguf.GGUFWriter(path, "llama")
        for name, kind in kinds.items():
            raw = dense[name] if kind == "F32" else quantize(dense[name], kind)
            writer.add_tensor(f"{name}.weight", raw, raw_dtype=gguf.GGMLQuantizationType[kind])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path

    for kinds, source in (({"token_embd": "Q8_0", "output": "Q6_K"}, "output"),
                          ({"token_embd": "Q8_0"}, "token_embd")):
        path = write(str(tmp_path / f"{len(kinds)}.gguf"), kinds)
        head = gguf_weights(path, num_heads=4, num_kv_heads=2)["lm_head"]
        kind = kinds[source]
        assert isinstance(head, QUANTIZED[kind][0]) and head.group_size == QUANTIZED[kind][1]
        assert torch.equal(head.dequantize(),
                           _dequantized(quantize(dense[source], kind), kind).reshape(64, 256))
        assert f"{kind} 0 quantized / 1 dense" in log_served(path, set())
    path = write(str(tmp_path / "dense.gguf"), {"token_embd": "F32"})
    assert "lm_head" not in gguf_weights(path, num_heads=4, num_kv_heads=2)


def _kinds(num_layers: int = 30) -> dict[str, str]:
    """Down projections (the only input width, 1536, that is whole super-blocks of 256) Q6_K
    in every third layer from 0, as llama.cpp's Q4_K_M gives some of them more bits, Q5_K in
    layer 1, Q3_K in layer 7, Q2_K in layer 8, Q4_K in the others; even layers all-Q8_0 attention; odd layers Q8_0 q beside
    Q4_1 k/v (one linear per kind) and Q8_0 gate beside Q4_1 up; layer 1's v Q5_1 (zeros,
    beside its Q8_0 q in one int8 linear); layer 5's v F16, so its q/k/v is served dense;
    layer 2's o and layer 4's k (beside Q8_0 q and v: one int8 linear) Q5_0."""
    kinds = {}
    for i in range(num_layers):
        kinds[f"blk.{i}.ffn_down.weight"] = "Q6_K" if i % 3 == 0 else "Q4_K"
        names = ("attn_q", "attn_k", "attn_v", "attn_output") if i % 2 == 0 \
            else ("attn_q", "ffn_gate")
        kinds.update({f"blk.{i}.{n}.weight": "Q8_0" for n in names})
    kinds["blk.1.attn_v.weight"] = "Q5_1"
    kinds["blk.1.ffn_down.weight"] = "Q5_K"
    kinds["blk.7.ffn_down.weight"] = "Q3_K"
    kinds["blk.8.ffn_down.weight"] = "Q2_K"
    kinds["blk.5.attn_v.weight"] = "F16"
    kinds["blk.2.attn_output.weight"] = kinds["blk.4.attn_k.weight"] = "Q5_0"
    return kinds


@pytest.fixture(scope="module")
def mixed_gguf_and_cache(tmp_path_factory) -> tuple[str, str]:
    """The requantized file, and the fresh conversion cache folder it was converted into."""
    folder = tmp_path_factory.mktemp("mixed")
    path, cache = str(folder / "SmolLM2-mixed.gguf"), str(folder / "cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PAGED_CORE_CACHE_DIR", cache)
        requantized_copy(embedded_gguf_path(), path, _kinds())
        converted_folder_for(path)
    return path, cache


@pytest.fixture
def mixed_gguf(mixed_gguf_and_cache, monkeypatch) -> str:
    """The requantized file, its conversion cache the fresh folder for this test only: the
    module's other tests read the user's cache (llama.cpp's tools built there; with the fresh
    one they rebuilt them, past the test timeout)."""
    path, cache = mixed_gguf_and_cache
    monkeypatch.setenv("PAGED_CORE_CACHE_DIR", cache)
    return path


@pytest.mark.extended
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mixed_gguf_engine_is_close_to_transformers(mixed_gguf, tokenizer, dtype, caplog):
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(
        converted_folder_for(mixed_gguf), dtype=getattr(torch, dtype)).eval()
    prompts = [passage_token_ids(tokenizer, n, offset=7 * i) for i, n in enumerate([5, 40, 17])]
    expected = [hf_greedy_top_logprobs(reference, p, 16, 5) for p in prompts]
    with caplog.at_level(logging.INFO, logger="paged_core.quantization.gguf_weights"):
        llm = LLM(model=mixed_gguf, dtype=dtype, quantization="gguf", num_kv_blocks=64)
    assert "Q4_K 17 quantized / 0 dense" in caplog.text
    assert "Q3_K 1 quantized / 0 dense" in caplog.text and "Q2_K 1 quantized / 0 dense" in caplog.text
    assert "Q5_K 1 quantized / 0 dense" in caplog.text
    assert "Q6_K 10 quantized / 0 dense" in caplog.text
    assert "Q5_0 2 quantized / 0 dense" in caplog.text
    assert "Q5_1 1 quantized / 0 dense" in caplog.text
    # layer 5's q (Q8_0) and k (Q4_1) are served dense with its F16 v
    assert "F16 0 quantized / 1 dense" in caplog.text
    assert "Q8_0 88 quantized / 1 dense" in caplog.text  # the LM head (token_embd) too
    assert "Q4_1 87 quantized / 1 dense" in caplog.text
    layers = llm.engine.core.executor.runner.model.layers
    assert type(layers[0].self_attn.qkv_proj) is Int8Linear
    assert type(layers[4].self_attn.qkv_proj) is Int8Linear  # Q8_0 q and v, Q5_0 k
    assert (type(layers[2].self_attn.o_proj), layers[2].self_attn.o_proj.group_size) == \
        (Int8Linear, 32)  # Q5_0
    assert type(layers[0].mlp.down_proj) is Int8Linear  # Q6_K: groups of 16
    assert layers[0].mlp.down_proj.group_size == 16
    assert type(layers[2].mlp.down_proj) is Int4Linear  # Q4_K
    for layer in (7, 8):  # Q3_K, Q2_K: int4 groups of 16
        assert (type(layers[layer].mlp.down_proj), layers[layer].mlp.down_proj.group_size) == \
            (Int4Linear, 16)
    assert (type(layers[1].mlp.down_proj), layers[1].mlp.down_proj.zeros is not None) == \
        (Int8Linear, True)  # Q5_K: levels 0..31 and zeros
    assert type(layers[1].self_attn.qkv_proj) is ConcatLinear  # Q8_0 and Q5_1 q/v, Q4_1 k
    assert type(layers[3].self_attn.qkv_proj) is ConcatLinear
    assert not isinstance(layers[5].self_attn.qkv_proj, (Int8Linear, Int4Linear, ConcatLinear))
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=5)
    for out, (tokens, tops) in zip(llm.generate(prompts, params, use_tqdm=False), expected):
        completion = out.outputs[0]
        assert_greedy_close(completion.token_ids, engine_top_logprobs(completion), tokens, tops)
    llm.shutdown()


@pytest.mark.extended
@pytest.mark.skipif(built_binary("llama-quantize") is None,
                    reason="llama-quantize not built in the cache: run `paged-core bench "
                           "throughput --concurrency 1 --llama-cpp q4_k_m --quick` once (~5 min)")
@pytest.mark.parametrize("kind, served", [
    ("q4_k_m", {"Q5_0": (166, 0), "Q8_0": (15, 0), "Q4_K": (16, 0), "Q6_K": (14, 0)}),
    ("q5_k_m", {"Q5_1": (166, 0), "Q8_0": (15, 0), "Q5_K": (16, 0), "Q6_K": (14, 0)}),
    ("iq4_xs", {"IQ4_NL": (180, 0), "IQ4_XS": (27, 0), "Q5_K": (3, 0), "Q8_0": (1, 0)})])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_llama_cpps_own_k_quant_files_are_served_quantized_close_to_transformers(
        tokenizer, caplog, kind, served, dtype):
    """The files users download: llama.cpp's Q4_K_M (Q5_K_M) of the embedded model holds Q5_0
    (Q5_1) wherever 576 features are not whole super-blocks (q, k, o, gate, up, half the v),
    Q8_0 for the other v, K-quants only in the down projections; its IQ4_XS holds IQ4_NL
    there instead; every projection is served quantized. In bfloat16 at the avx512_bf16 level
    (the column layout) the IQ4 projections keep their 4-bit indices."""
    from transformers import AutoModelForCausalLM

    from paged_core.bench.llama_cpp_models import gguf_path

    path = str(gguf_path(kind))
    reference = AutoModelForCausalLM.from_pretrained(converted_folder_for(path),
                                                     dtype=getattr(torch, dtype)).eval()
    prompts = [passage_token_ids(tokenizer, n, offset=5 * i) for i, n in enumerate([9, 33])]
    expected = [hf_greedy_top_logprobs(reference, p, 16, 5) for p in prompts]
    with caplog.at_level(logging.INFO, logger="paged_core.quantization.gguf_weights"):
        llm = LLM(model=path, dtype=dtype, num_kv_blocks=64)
    assert served == {type_: (int(quantized), int(dense)) for type_, quantized, dense
                      in re.findall(r"(\w+) (\d+) quantized / (\d+) dense", caplog.text)}
    o_proj = llm.engine.core.executor.runner.model.layers[0].self_attn.o_proj
    if kind == "iq4_xs" and o_proj.column_outputs:  # IQ4_NL: int8 levels as 4-bit indices
        assert (o_proj.levels.dtype, o_proj.levels.shape[-1]) == (torch.int8, 32)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=5)
    for out, (tokens, tops) in zip(llm.generate(prompts, params, use_tqdm=False), expected):
        completion = out.outputs[0]
        assert_greedy_close(completion.token_ids, engine_top_logprobs(completion), tokens, tops)
    llm.shutdown()
