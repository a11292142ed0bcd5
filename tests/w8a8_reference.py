"""The reference of int8 activations (W8A8, W4A8): transformers with compressed-tensors'
activation quantization; and the skip of tests that name paged-core's vnni or amx kernels
where they cannot run."""
from __future__ import annotations

import pytest
import torch


def use_w8a8_kernel(monkeypatch, kernel: str, cpu_isa: str | None = None) -> None:
    """``PAGED_CORE_CPU_W8A8=kernel`` for the test; ``vnni`` skips, saying why, where the kernels
    of ``cpu_isa`` (default: the selected level) cannot run it."""
    from paged_core.quantization.w8a8_linear import W8A8_SETTING

    _use_kernel(monkeypatch, W8A8_SETTING, "W8A8", kernel, cpu_isa)


def use_w4a8_kernel(monkeypatch, kernel: str, cpu_isa: str | None = None) -> None:
    """``PAGED_CORE_CPU_W4A8=kernel`` for the test, skipping as ``use_w8a8_kernel`` does."""
    from paged_core.quantization.w4a8_linear import W4A8_SETTING

    _use_kernel(monkeypatch, W4A8_SETTING, "W4A8", kernel, cpu_isa)


def _use_kernel(monkeypatch, setting: str, scheme: str, kernel: str, cpu_isa: str | None) -> None:
    from paged_core.cpu.extension import cpu_extension_available, cpu_ops

    monkeypatch.setenv(setting, kernel)
    if kernel == "vnni" and not (cpu_extension_available(cpu_isa)
                                 and cpu_ops(cpu_isa).int8_vnni_ready()):
        pytest.skip(f"the vnni {scheme} kernel needs paged-core's AVX-512 build on a CPU with "
                    f"AVX512-VNNI; this run's level is {cpu_isa or 'the selected one'}")
    if kernel == "amx" and not amx_int8_runs(cpu_isa):
        pytest.skip(f"the amx {scheme} kernel needs paged-core's avx512_bf16 build on a CPU "
                    f"whose OS grants AMX-INT8 tiles; this run's level is "
                    f"{cpu_isa or 'the selected one'}")


def amx_int8_runs(cpu_isa: str | None) -> bool:
    """Whether the kernels of ``cpu_isa`` (default: the selected level) run AMX-INT8 tiles."""
    from paged_core.cpu.extension import cpu_extension_available, cpu_ops

    if not cpu_extension_available(cpu_isa):
        return False
    ready = getattr(cpu_ops(cpu_isa), "amx_int8_ready", None)  # the avx512_bf16 level alone
    return ready is not None and bool(ready())


def quantize_activations_per_token(model) -> None:
    """Make ``model``'s quantized linears see their inputs as W8A8 and W4A8 do: symmetric int8
    per token (compressed-tensors' dynamic ``token`` strategy), through ``fake_quantize``."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize

    args = QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="token",
                            dynamic=True)

    def hook(_module, inputs):
        x = inputs[0]
        scale = x.abs().amax(dim=-1, keepdim=True) / 127
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        return (fake_quantize(x, scale, torch.zeros_like(scale, dtype=torch.int8), args),)

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and "lm_head" not in name:
            module.register_forward_pre_hook(hook)
