"""The C++ decoder stack computes exactly what the Python layers compute.

Every forward of a real engine run (prefills, prefill chunks after a cached prefix,
decodes, batches with bucketing's padding rows) runs twice from the same KV cache:
once through ``CpuDecoderStack`` and once through the Python layers; hidden states and
the cache afterwards must be the same bits. Each Llama-family variant (sliding window,
qkv bias, per-head q/k norms, tied embeddings), float32 (plain linears) and bfloat16
(oneDNN-packed linears), and quantized KV caches (``kv_cache_dtype``), on every CPU path
this host runs (``cpu_isa`` fixture; ``attention_path``: with AMX attention tiles too).
"""
import shutil

import pytest
import torch

from ..w8a8_reference import use_w4a8_kernel, use_w8a8_kernel


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, so NaN in slots no sequence owns compares equal to itself."""
    return t.contiguous().view(torch.uint8)


def _record_both_paths(model):
    """Make every forward of ``model`` run the stack and the Python layers from the same cache
    and assert they agree; returns the list of (step tokens, padding rows) compared."""
    stack, forward, compared = model.decoder_stack, model.forward, []

    def both(input_ids, positions, kv_caches, meta, backend):
        before = [(k.clone(), v.clone()) for k, v in kv_caches]
        model.decoder_stack = stack
        fused = forward(input_ids, positions.clone(), kv_caches, meta, backend)
        fused_caches = [(k.clone(), v.clone()) for k, v in kv_caches]
        for (k, v), (k0, v0) in zip(kv_caches, before):
            k.copy_(k0)
            v.copy_(v0)
        model.decoder_stack = None
        try:
            python = forward(input_ids, positions, kv_caches, meta, backend)
        finally:
            model.decoder_stack = stack
        real = meta.num_scheduled_tokens
        assert torch.equal(_bits(fused[:real]), _bits(python[:real]))
        for (k, v), (fk, fv) in zip(kv_caches, fused_caches):
            assert torch.equal(_bits(k), _bits(fk)) and torch.equal(_bits(v), _bits(fv))
        compared.append((input_ids.shape[0], input_ids.shape[0] - real))
        return python

    model.forward = both
    return compared


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_stack_matches_the_python_layers_bit_for_bit(model_type, dtype, tiny_checkpoints,
                                                       attention_path):
    """On every level and both kinds of bfloat16 attention tiles (vdpbf16ps, AMX)."""
    from paged_core.attention.cpu_kernels import bf16_attention_amx

    llm = _generate_through_both_paths(tiny_checkpoints.model(model_type), dtype, attention_path)
    stack = llm.engine.core.executor.runner.model.decoder_stack
    assert stack.amx_tiles == bf16_attention_amx(attention_path)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8_e4m3", "fp8_e5m2"])
def test_stack_matches_the_python_layers_over_a_quantized_cache(kv_cache_dtype, dtype,
                                                                tiny_checkpoints, cpu_isa):
    """Both store K/V with ``write_kv_slots`` (quantizing) and read them with the kernel."""
    llm = _generate_through_both_paths(tiny_checkpoints.model("qwen3"), dtype, cpu_isa,
                                       kv_cache_dtype=kv_cache_dtype)
    assert llm.engine.core.executor.runner.kv_caches[0][0].element_size() == 1


def _generate_through_both_paths(folder, dtype, cpu_isa, **engine_args):
    """Prefills, a cached prefix, chunks and decodes of ``folder``, every forward through both
    paths (``_record_both_paths``); returns the ``LLM``."""
    from paged_core import LLM, SamplingParams

    llm = LLM(model=folder, dtype=dtype, num_kv_blocks=64, max_num_batched_tokens=48,
              **engine_args)
    model = llm.engine.core.executor.runner.model
    assert model.decoder_stack is not None and model.decoder_stack.cpu_isa == cpu_isa
    compared = _record_both_paths(model)
    shared = list(range(5, 45))  # a cached prefix for the later prompts (16-token blocks)
    prompts = [{"prompt_token_ids": shared + list(range(60, 60 + n))} for n in (3, 17, 30)]
    prompts.append({"prompt_token_ids": list(range(200, 207))})
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    llm.generate(prompts[:1], params, use_tqdm=False)  # fills the prefix cache
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 12 for o in outputs)
    # Packed linears round batches up to bucketed sizes: then some steps carry padding rows.
    assert any(padding for _, padding in compared) == model.prefers_bucketed_batches
    assert any(tokens > 1 for tokens, _ in compared) and len(compared) > 12
    return llm


def test_models_the_stack_cannot_serve_keep_the_python_layers(tiny_checkpoints, cpu_isa):
    from paged_core import LLM
    from paged_core.models.elementwise import TORCH_OPS

    folder = tiny_checkpoints.model("llama")
    assert LLM(model=folder, dtype="float16", num_kv_blocks=8).engine.core.executor.runner.model.decoder_stack is None
    invariant = LLM(model=folder, dtype="float32", num_kv_blocks=8, batch_invariant=True)
    assert invariant.engine.core.executor.runner.model.decoder_stack is None  # its linears are row-tiled
    model = LLM(model=folder, dtype="float32", num_kv_blocks=8).engine.core.executor.runner.model
    model.use_ops(TORCH_OPS)
    assert model.decoder_stack is None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("scheme", ["W4A16", "W4A16_ASYM", "W8A16", "W8A16_ASYM"])
def test_stack_matches_the_python_layers_with_quantized_weights(scheme, dtype, tiny_checkpoints,
                                                                cpu_isa, monkeypatch):
    """Weight-only 4- and 8-bit projections (8-bit with zeros too) run in the stack by the
    same kernels: decode steps (fewer rows than ``dense_rows``) on the levels (AMX tiles too,
    on a CPU with them), prefill chunks densely."""
    pytest.importorskip("compressed_tensors")
    from paged_core.quantization.int4_linear import Int4Linear
    from paged_core.quantization.int8_linear import Int8Linear
    from paged_core.quantization.quantized_linear import DENSE_ROWS_SETTING

    monkeypatch.setenv(DENSE_ROWS_SETTING, "24")  # below this test's prompts: both paths run

    llm = _generate_through_both_paths(tiny_checkpoints.compressed("llama", scheme, 32), dtype,
                                       cpu_isa)
    projection = llm.engine.core.executor.runner.model.layers[0].mlp.down_proj
    assert type(projection) is (Int8Linear if scheme.startswith("W8A16") else Int4Linear)
    if scheme.startswith("W8A16"):
        assert (projection.zeros is not None) == scheme.endswith("_ASYM")
    assert 1 < projection.dense_rows < 48  # both the kernels and the dense path ran


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kernel", ["auto", "vnni", "amx", "onednn", "float32"])
def test_stack_matches_the_python_layers_with_w8a8(kernel, dtype, tiny_checkpoints, cpu_isa,
                                                   monkeypatch):
    """W8A8 projections run in the stack by the same ``w8a8_product``: each step's rows
    quantized per token, then the kernel ``PAGED_CORE_CPU_W8A8`` names (``auto``: vnni where
    it runs, its calls of many rows on AMX-INT8 tiles where those run, else oneDNN's int8 GEMM
    from some rows or the float32 kernels, their dense path past ``dense_rows``)."""
    pytest.importorskip("compressed_tensors")
    from paged_core.quantization.quantized_linear import DENSE_ROWS_SETTING
    from paged_core.quantization.w8a8_linear import W8A8Linear

    use_w8a8_kernel(monkeypatch, kernel, cpu_isa)
    monkeypatch.setenv(DENSE_ROWS_SETTING, "24")  # below this test's prompts: both paths run
    llm = _generate_through_both_paths(tiny_checkpoints.compressed("llama", "W8A8"), dtype, cpu_isa)
    projection = llm.engine.core.executor.runner.model.layers[0].mlp.down_proj
    assert type(projection) is W8A8Linear
    assert kernel in ("auto", projection.kernel)
    assert (projection.vnni_sums is not None) == (projection.kernel in ("vnni", "amx"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kernel,scales", [("auto", "float32"), ("vnni", "float32"),
                                           ("float32", "float32"), ("vnni", "float16")])
def test_stack_matches_the_python_layers_with_w4a8(kernel, scales, dtype, tiny_checkpoints,
                                                   tmp_path, cpu_isa, monkeypatch):
    """W4A8 projections run in the stack by the same ops: ``w4a8_product`` on the vnni kernel's
    layout (its group factors float16 where the checkpoint's scales are), or each step's rows
    quantized per token (``token_levels``) and then ``Int4Linear``'s row-layout kernels and
    their dense path past ``dense_rows`` (``PAGED_CORE_CPU_W4A8``)."""
    pytest.importorskip("compressed_tensors")
    from paged_core.quantization.quantized_linear import DENSE_ROWS_SETTING
    from paged_core.quantization.w4a8_linear import W4A8Linear

    use_w4a8_kernel(monkeypatch, kernel, cpu_isa)
    monkeypatch.setenv(DENSE_ROWS_SETTING, "24")  # below this test's prompts: both paths run
    checkpoint = tiny_checkpoints.compressed("llama", "W4A8", 32)
    if scales == "float16":  # as a recipe run in float16 stores them (in a copy: others share it)
        from safetensors.torch import load_file, save_file

        checkpoint = str(shutil.copytree(checkpoint, tmp_path / "W4A8"))
        stored = load_file(f"{checkpoint}/model.safetensors")
        save_file({name: t.half() if name.endswith(".weight_scale") else t
                   for name, t in stored.items()}, f"{checkpoint}/model.safetensors",
                  metadata={"format": "pt"})
    llm = _generate_through_both_paths(checkpoint, dtype, cpu_isa)
    projection = llm.engine.core.executor.runner.model.layers[0].mlp.down_proj
    assert type(projection) is W4A8Linear
    assert kernel in ("auto", projection.kernel)
    assert (projection.w4a8_outputs > 0) == (projection.kernel == "vnni")
    assert (projection.scales.dtype == torch.float16) == (scales == "float16")
