"""The W8A8 reference: transformers with compressed-tensors' activation quantization; and the
skip of W8A8 tests that name paged-core's vnni kernel where it cannot run."""
from __future__ import annotations

import pytest
import torch


def use_w8a8_kernel(monkeypatch, kernel: str, cpu_isa: str | None = None) -> None:
    """``PAGED_CORE_CPU_W8A8=kernel`` for the test; ``vnni`` skips, saying why, where the kernels
    of ``cpu_isa`` (default: the selected level) cannot run it."""
    from paged_core.cpu.extension import cpu_extension_available, cpu_ops
    from paged_core.quantization.w8a8_linear import W8A8_SETTING

    monkeypatch.setenv(W8A8_SETTING, kernel)
    if kernel == "vnni" and not (cpu_extension_available(cpu_isa)
                                 and cpu_ops(cpu_isa).int8_vnni_ready()):
        pytest.skip(f"the vnni W8A8 kernel needs paged-core's AVX-512 build on a CPU with "
                    f"AVX512-VNNI; this run's level is {cpu_isa or 'the selected one'}")


def quantize_activations_per_token(model) -> None:
    """Make ``model``'s quantized linears see their inputs as W8A8 does: symmetric int8 per
    token (compressed-tensors' dynamic ``token`` strategy), through ``fake_quantize``."""
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
