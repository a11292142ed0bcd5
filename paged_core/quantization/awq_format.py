"""AWQ checkpoints in the GEMM layout (AutoAWQ, gptqmodel; vLLM's ``awq``).

``quantization_config``: ``quant_method: awq``, ``version`` (or gptqmodel's ``format``)
``gemm``, ``bits`` (``w_bit``) 4, ``group_size`` (``q_group_size``). ``zero_point`` is not
read: gptqmodel writes ``false`` for its symmetric AWQ yet stores ``qzeros`` (all 8).
A quantized linear ``[out, in]`` stores:

- ``qweight`` int32 ``[in, out / 8]``: eight 4-bit levels of one input feature per word,
  packed along the *output* features in AWQ's order: the word's value ``i`` (bit ``4 i``)
  is output ``8 c + AWQ_ORDER[i]``, ``AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]``;
- ``qzeros`` int32 ``[groups, out / 8]``: the zero points, packed the same way;
- ``scales`` fp16 (bf16 in some) ``[groups, out]``; groups of ``group_size`` consecutive
  input features;
- ``w[o, i] = (level[o, i] - zero[g, o]) * scales[g, o]``, ``g = i // group_size``.

Decoded to an ``Int4Weight`` (``zero = (8 - zero_point) * scale``, exact in float32 for
16-bit scales; groups the kernel does not take are split, ``packed_ints.regroup``).
Refused: other versions (``gemv``, ``gemv_fast``, ``marlin``...), other bit widths, modules
without ``qzeros`` (AutoAWQ's GEMM layout always has them).
"""
from __future__ import annotations

import torch

from .int4_linear import Int4Weight
from .packed_ints import regroup, unpack_awq


class AwqFormat:
    """The quantized modules of one AWQ checkpoint and how to decode each."""

    name = "awq"

    def __init__(self, quantization_config: dict) -> None:
        config = quantization_config
        version = str(config.get("version") or config.get("format") or "gemm").lower()
        if version != "gemm":
            raise ValueError(f"AWQ version {version!r} is not served (served: 'gemm')")
        self.bits = int(config.get("bits") or config.get("w_bit") or 4)
        if self.bits != 4:
            raise ValueError(f"{self.bits}-bit AWQ weights are not served (4-bit)")
        self.group_size = int(config.get("group_size") or config.get("q_group_size") or 128)

    def quantized_modules(self, names: set[str]) -> set[str]:
        """The modules among checkpoint tensor ``names`` that hold quantized weights."""
        return {name.removesuffix(".qweight") for name in names if name.endswith(".qweight")}

    def tensor_parts(self) -> tuple[str, ...]:
        """The tensor suffixes a quantized module may hold (its bias is a dense weight)."""
        return "qweight", "qzeros", "scales"

    def decode(self, module: str, tensors: dict[str, torch.Tensor]) -> Int4Weight:
        """Module ``module``'s weight from its ``tensors`` (keyed by suffix)."""
        qweight = tensors["qweight"]
        if qweight.dtype != torch.int32:
            raise ValueError(f"{module}: qweight is {qweight.dtype}, AWQ packs int32 words")
        width, out = qweight.shape[0], qweight.shape[1] * 8
        group_size = width if self.group_size <= 0 else self.group_size
        scales = tensors["scales"].float().T  # [out, groups]
        if scales.shape != (out, -(-width // group_size)):
            raise ValueError(f"{module}: scales {tuple(scales.T.shape)} do not match groups of "
                             f"{group_size} over {width} input features and {out} outputs")
        if "qzeros" not in tensors:
            raise ValueError(f"{module}: AWQ weights without qzeros (zero_point: false) are not "
                             f"served")
        levels = unpack_awq(qweight, out).T  # [out, in]
        zeros = (8 - unpack_awq(tensors["qzeros"], out).T.float()) * scales
        scales, zeros, size = regroup(scales, zeros, group_size, width, module)
        return Int4Weight(levels.to(torch.uint8).contiguous(), scales, zeros, size)
