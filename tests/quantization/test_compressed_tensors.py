"""compressed-tensors checkpoints served as stored: W4A16 (symmetric and with zero points),
W8A16 (groups and per channel), W8A8 and W4A8 (int8 activations per token). Each decodes to exactly
its dequantized twin's weights, and greedy output stays under the near-tie rule of
transformers loading the same checkpoint (where it can) or its twin, with the shared
prefix read from the cache and under tensor parallelism."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file

from paged_core import LLM, EngineConfig, SamplingParams
from paged_core.bench.quantized_models import compressed_tensors_checkpoint
from paged_core.quantization.compressed_tensors_format import CompressedTensorsFormat
from paged_core.quantization.int4_linear import Int4Linear
from paged_core.quantization.int8_linear import Int8Linear
from paged_core.quantization.quantized_linear import QuantizedLinear
from paged_core.quantization.w4a8_linear import W4A8_KERNELS, W4A8Linear
from paged_core.quantization.w8a8_linear import W8A8_KERNELS, W8A8Linear

from ..w8a8_reference import quantize_activations_per_token, use_w4a8_kernel, use_w8a8_kernel
from ..reference import assert_close_with_cached_prefix, assert_greedy_close, \
    engine_top_logprobs, hf_greedy_top_logprobs, passage_token_ids

pytest.importorskip("compressed_tensors")

TOP_K = 5
# scheme, weight overrides (group size, strategy), what the projections become, and whether
# transformers loads the packed checkpoint itself (it cannot read packed zero points, and
# runs W8A8's int8 weights unscaled: the twin is the reference there)
SCHEMES = {
    "W4A16": (32, None, Int4Linear, True),
    "W4A16_ASYM": (32, None, Int4Linear, False),
    "W8A16": (32, None, Int8Linear, True),
    "W8A16_ASYM": (32, None, Int8Linear, False),  # zero points: Int8Weight zeros
    "W8A16-channel": (None, "channel", Int8Linear, False),
    "W8A8": (None, None, W8A8Linear, False),
    "W4A8": (32, None, W4A8Linear, False),
}


@pytest.fixture(scope="module")
def tiny_llama(tiny_checkpoints):
    return tiny_checkpoints.model("llama")


@pytest.fixture(scope="module")
def checkpoints(tiny_llama, tmp_path_factory):
    out = tmp_path_factory.mktemp("compressed")
    made = {}
    for name, (group_size, strategy, _, _) in SCHEMES.items():
        made[name] = compressed_tensors_checkpoint(tiny_llama, name.split("-")[0],
                                                   str(out / name), group_size, strategy)
    return made


@pytest.mark.parametrize("name", SCHEMES)
def test_every_quantized_weight_decodes_to_its_twin(checkpoints, name):
    checkpoint, twin = checkpoints[name]
    with open(os.path.join(checkpoint, "config.json")) as f:
        reader = CompressedTensorsFormat(json.load(f)["quantization_config"])
    stored, dense = load_file(f"{checkpoint}/model.safetensors"), load_file(f"{twin}/model.safetensors")
    modules = reader.quantized_modules(set(stored))
    assert len(modules) == 2 * 7
    for module in modules:
        parts = {p: stored[f"{module}.{p}"] for p in reader.tensor_parts() if f"{module}.{p}" in stored}
        weight = reader.decode(module, parts).dequantize()
        # 8-bit zeros: level * scale + zero rounds twice where the twin's scale * (level -
        # zero_point) rounds once: a few float32 ulps of the largest level's product apart
        atol = 1e-6 if name == "W8A16_ASYM" else 0
        assert torch.allclose(weight, dense[f"{module}.weight"], rtol=1e-6, atol=atol), module


@pytest.mark.parametrize("name", SCHEMES)
def test_engine_is_close_to_transformers(checkpoints, tokenizer, name):
    checkpoint, twin = checkpoints[name]
    _, _, linear, loads_packed = SCHEMES[name]
    _assert_close_to_transformers(checkpoint if loads_packed else twin, checkpoint, tokenizer,
                                  linear, activations_int8=name in ("W8A8", "W4A8"))


@pytest.mark.parametrize("name,kernel", [*(("W8A8", k) for k in W8A8_KERNELS),
                                         *(("W4A8", k) for k in W4A8_KERNELS if k != "amx")])
def test_int8_activations_are_close_to_transformers_on_every_kernel(checkpoints, tokenizer,
                                                                     monkeypatch, name, kernel):
    """``PAGED_CORE_CPU_W8A8`` / ``PAGED_CORE_CPU_W4A8`` name the kernel for every call
    (``auto``, the default, is ``test_engine_is_close_to_transformers``): greedy output stays
    close on each; ``vnni`` skips, saying why, where it cannot run."""
    (use_w8a8_kernel if name == "W8A8" else use_w4a8_kernel)(monkeypatch, kernel)
    checkpoint, twin = checkpoints[name]
    _assert_close_to_transformers(twin, checkpoint, tokenizer, SCHEMES[name][2],
                                  activations_int8=True)


def test_w4a8_on_amx_tiles_is_close_to_transformers(tiny_llama, tokenizer, monkeypatch,
                                                   tmp_path):
    """``PAGED_CORE_CPU_W4A8=amx`` (every call on AMX-INT8 tiles, through the C++ decoder stack)
    on a W4A8 checkpoint in groups of 64 (whole tile steps; the tiles refuse others): greedy
    output stays close; skips, saying why, where the tiles cannot run."""
    use_w4a8_kernel(monkeypatch, "amx")
    checkpoint, twin = compressed_tensors_checkpoint(tiny_llama, "W4A8", str(tmp_path), 64)
    _assert_close_to_transformers(twin, checkpoint, tokenizer, W4A8Linear, activations_int8=True)


def test_embedded_model_w4a16_is_close_to_transformers(embedded_folder, tokenizer, tmp_path):
    """The embedded model (576 features: groups of 64) as llmcompressor's W4A16 would write it,
    loaded by transformers itself as the reference."""
    checkpoint, _ = compressed_tensors_checkpoint(embedded_folder, "W4A16", str(tmp_path), 64)
    _assert_close_to_transformers(checkpoint, checkpoint, tokenizer, Int4Linear)


def test_a_quantized_lm_head_is_served_quantized(tiny_llama, tokenizer, tmp_path):
    """A recipe that quantized the (untied) LM head too: the engine's LM head is the stored
    4-bit weight, and greedy output stays close to transformers loading the same checkpoint;
    under two ranks each holds its vocabulary rows and the tokens are the one rank's."""
    checkpoint, _ = compressed_tensors_checkpoint(tiny_llama, "W4A16", str(tmp_path), 32,
                                                  quantize_lm_head=True)
    stored = load_file(f"{checkpoint}/model.safetensors")
    assert "lm_head.weight_packed" in stored and "lm_head.weight" not in stored
    _assert_close_to_transformers(checkpoint, checkpoint, tokenizer, Int4Linear,
                                  lm_head=Int4Linear)
    prompts = [passage_token_ids(tokenizer, n, offset=7 * i) for i, n in enumerate([5, 30])]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    tokens = {}
    for size in (1, 2):
        llm = LLM(model=checkpoint, dtype="float32", num_kv_blocks=64, tensor_parallel_size=size)
        try:
            tokens[size] = [o.outputs[0].token_ids
                            for o in llm.generate(prompts, params, use_tqdm=False)]
        finally:
            llm.shutdown()
    assert tokens[1] == tokens[2]


def test_the_last_rank_pads_its_quantized_lm_head_rows():
    """A vocabulary of 10 over 3 ranks (4 rows each): the last rank holds rows 8 and 9, then
    repeats row 9 for its padding, whose logits ``compute_logits`` cuts off."""
    from types import SimpleNamespace

    from paged_core.quantization.int8_linear import Int8Weight
    from paged_core.quantization.projections import _vocab_rows

    weight = Int8Weight(torch.arange(10, dtype=torch.int8)[:, None].expand(10, 32).contiguous(),
                        torch.ones(10, 1), 32)
    spec = SimpleNamespace(vocab_size=10, hidden_size=32)
    for rank, rows in ((0, [0, 1, 2, 3]), (2, [8, 9, 9, 9])):
        shard = SimpleNamespace(spec=spec, size=3, vocab_size=4, vocab_start=4 * rank)
        assert _vocab_rows(shard, weight).q[:, 0].tolist() == rows
    with pytest.raises(ValueError, match="lm_head: quantized weight"):
        _vocab_rows(SimpleNamespace(spec=SimpleNamespace(vocab_size=12, hidden_size=32), size=1),
                    weight)


def _assert_close_to_transformers(reference_folder, checkpoint, tokenizer, linear,
                                  activations_int8=False, lm_head=None):
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(reference_folder, dtype=torch.float32).eval()
    if activations_int8:
        quantize_activations_per_token(reference)
    system = passage_token_ids(tokenizer, 40)
    prompts = [system + passage_token_ids(tokenizer, n, offset=50 + 9 * i)
               for i, n in enumerate([4, 30])] + [passage_token_ids(tokenizer, 7, offset=3)]
    expected = [hf_greedy_top_logprobs(reference, p, 12, TOP_K) for p in prompts]
    llm = LLM(model=checkpoint, dtype="float32", num_kv_blocks=64, enable_prefix_caching=True)
    assert llm.engine.config.quantization == "compressed-tensors"  # read from config.json
    model = llm.engine.core.executor.runner.model
    assert type(model.layers[0].self_attn.qkv_proj) is linear
    assert type(model.layers[-1].mlp.down_proj) is linear
    if lm_head is None:  # the recipe ignored the LM head: dense
        assert not isinstance(model.lm_head, QuantizedLinear)
    else:
        assert type(model.lm_head) is lm_head
    assert_close_with_cached_prefix(llm, prompts, expected, 12, TOP_K)
    llm.shutdown()


@pytest.mark.parametrize("scheme", ["W4A16", "W4A8"])
def test_tensor_parallel_cuts_quantized_weights_along_their_groups(tokenizer, tiny_llama, tmp_path,
                                                                  scheme):
    """Two ranks: q/k/v and gate/up rows split, o_proj and down_proj split by whole groups
    of 32 input features; greedy output stays close to transformers' and, weight-only, equals
    the one-rank engine's token for token (W4A8's row-parallel ranks quantize their own half
    of each row, with its own scale, as vLLM's do: close, not equal)."""
    from transformers import AutoModelForCausalLM

    checkpoint, twin = compressed_tensors_checkpoint(tiny_llama, scheme, str(tmp_path), 32)
    reference = AutoModelForCausalLM.from_pretrained(twin, dtype=torch.float32).eval()
    if scheme == "W4A8":
        quantize_activations_per_token(reference)
    prompts = [passage_token_ids(tokenizer, n, offset=7 * i) for i, n in enumerate([5, 30])]
    expected = [hf_greedy_top_logprobs(reference, p, 16, TOP_K) for p in prompts]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=TOP_K)
    tokens = {}
    for size in (1, 2):
        llm = LLM(model=checkpoint, dtype="float32", num_kv_blocks=64, tensor_parallel_size=size)
        try:
            outputs = llm.generate(prompts, params, use_tqdm=False)
        finally:
            llm.shutdown()
        tokens[size] = [o.outputs[0].token_ids for o in outputs]
        for out, (ref_tokens, tops) in zip(outputs, expected):
            completion = out.outputs[0]
            assert_greedy_close(completion.token_ids, engine_top_logprobs(completion),
                                ref_tokens, tops)
    if scheme == "W4A16":  # weight-only: two ranks' products are one rank's
        assert tokens[1] == tokens[2]


def test_a_group_cut_by_tensor_parallelism_is_refused(tiny_llama, tmp_path):
    checkpoint, _ = compressed_tensors_checkpoint(tiny_llama, "W4A16", str(tmp_path), 64)
    with pytest.raises(Exception, match="inside its groups of 64"):
        LLM(model=checkpoint, dtype="float32", num_kv_blocks=16, tensor_parallel_size=2)


def test_settings_that_contradict_the_checkpoint_are_refused(checkpoints):
    checkpoint, _ = checkpoints["W4A16"]
    with pytest.raises(ValueError, match="quantization='gptq' does not match"):
        EngineConfig(model=checkpoint, quantization="gptq")
    with pytest.raises(ValueError, match="cannot run with batch_invariant"):
        EngineConfig(model=checkpoint, batch_invariant=True)
    with pytest.raises(ValueError, match="quantization must be one of"):
        EngineConfig(quantization="squeezellm")


def test_unserved_variants_are_refused_naming_the_module(checkpoints):
    checkpoint, _ = checkpoints["W4A16"]
    with open(os.path.join(checkpoint, "config.json")) as f:
        config = json.load(f)["quantization_config"]
    stored = load_file(f"{checkpoint}/model.safetensors")
    module = "model.layers.0.mlp.up_proj"
    parts = {p: stored[f"{module}.{p}"] for p in ("weight_packed", "weight_scale", "weight_shape")}
    with pytest.raises(ValueError, match=f"{module}: act-order"):
        CompressedTensorsFormat(config).decode(module, {**parts, "weight_g_idx": torch.zeros(1)})
    config["config_groups"]["group_0"]["input_activations"] = {
        "dynamic": False, "strategy": "tensor", "num_bits": 8}
    with pytest.raises(ValueError, match=f"{module}: input activations"):
        CompressedTensorsFormat(config).decode(module, parts)
    with pytest.raises(ValueError, match="format 'float-quantized' is not served"):
        CompressedTensorsFormat({**config, "config_groups": {"g": {
            "format": "float-quantized", "targets": ["Linear"]}}})
