"""The W8A8 reference: transformers with compressed-tensors' activation quantization."""
from __future__ import annotations

import torch


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
