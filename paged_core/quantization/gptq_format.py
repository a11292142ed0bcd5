"""GPTQ checkpoints as gptqmodel / AutoGPTQ write them (``quant_method: gptq``).

A quantized linear ``[out, in]`` with ``bits`` per level stores, ``p = 32 // bits``:

- ``qweight`` int32 ``[in / p, out]``: word ``[r, o]`` holds the levels of input features
  ``r * p .. r * p + p - 1`` of row ``o``, feature ``r * p + j`` at bit ``j * bits``;
- ``qzeros`` int32 ``[groups, out / p]``: the zero points packed the same way along ``out``;
- ``scales`` fp16 (bf16 in some) ``[groups, out]``; ``g_idx`` int32 ``[in]``: each
  input feature's group (``i // group_size``, or scattered with act-order);
- ``w[o, i] = scales[g, o] * (level[o, i] - zero[g, o])``, ``g = g_idx[i]``.

``checkpoint_format`` (or ``format``) ``gptq`` (v1, AutoGPTQ's and the default) stores each
zero point minus one, subtracted from the whole word (``0x11111111`` for 4 bits, as
gptqmodel writes it; a zero point 0 borrows from the next field): added back the same way.
``gptq_v2`` stores them as they are. ``sym`` zero points are ``2 ** (bits - 1)``: the
stored zero points are used as they are, ``sym`` or not.

Served: 4-bit → ``Int4Weight`` (level as stored, ``zero = (8 - zero_point) * scale``,
exact in float32 for 16-bit scales); 8-bit → ``Int8Weight`` (``level - 128``; asymmetric
with ``zero = (128 - zero_point) * scale``, exact the same way).
Groups the int4 kernel does not take (``group_size`` -1, 512, ...) are split into ones it
does (``packed_ints.regroup``). Act-order (``desc_act``) ``g_idx`` gives an
``act_order.ActOrderWeight``. Per-module overrides of ``dynamic`` (``+:regex`` or
``regex`` → bits / group_size) are followed. Refused, naming the module: 2/3-bit
weights, groups that do not split; and any other ``checkpoint_format``
(marlin, planar ``gptq_p``...) or a ``pack_dtype`` other than int32.
"""
from __future__ import annotations

import re

import torch

from .act_order import ActOrderWeight, group_order
from .int4_linear import Int4Weight
from .int8_linear import Int8Weight
from .packed_ints import regroup, unpack_ints

_VERSIONS = ("gptq", "gptq_v2")


class GptqFormat:
    """The quantized modules of one GPTQ checkpoint and how to decode each."""

    name = "gptq"

    def __init__(self, quantization_config: dict) -> None:
        config = quantization_config
        self.version = config.get("checkpoint_format") or config.get("format") or "gptq"
        if self.version not in _VERSIONS or config.get("is_marlin_format"):
            raise ValueError(f"GPTQ checkpoint_format {self.version!r}"
                             f"{' (marlin)' if config.get('is_marlin_format') else ''} is not "
                             f"served (served: {', '.join(_VERSIONS)})")
        if str(config.get("pack_dtype", "int32")).removeprefix("torch.") != "int32":
            raise ValueError(f"GPTQ pack_dtype {config['pack_dtype']!r} is not served (int32)")
        self.defaults = {key: config.get(key, default) for key, default in
                         (("bits", 4), ("group_size", 128))}
        self.dynamic = config.get("dynamic") or {}

    def quantized_modules(self, names: set[str]) -> set[str]:
        """The modules among checkpoint tensor ``names`` that hold quantized weights."""
        return {name.removesuffix(".qweight") for name in names if name.endswith(".qweight")}

    def tensor_parts(self) -> tuple[str, ...]:
        """The tensor suffixes a quantized module may hold (its bias is a dense weight)."""
        return "qweight", "qzeros", "scales", "g_idx"

    def decode(self, module: str, tensors: dict[str, torch.Tensor]):
        """Module ``module``'s weight from its ``tensors`` (keyed by suffix)."""
        params = self._params(module)
        bits = int(params["bits"])
        if bits not in (4, 8):
            raise ValueError(f"{module}: {bits}-bit GPTQ weights are not served (4- or "
                             f"8-bit)")
        qweight = tensors["qweight"]
        if qweight.dtype != torch.int32:
            raise ValueError(f"{module}: qweight is {qweight.dtype}, GPTQ packs int32 words")
        width, out = qweight.shape[0] * 32 // bits, qweight.shape[1]
        group_size = width if int(params["group_size"]) <= 0 else int(params["group_size"])
        scales = tensors["scales"].float().T  # [out, groups]
        if scales.shape != (out, -(-width // group_size)):
            raise ValueError(f"{module}: scales {tuple(scales.T.shape)} do not match groups of "
                             f"{group_size} over {width} input features and {out} outputs")
        levels = unpack_ints(qweight.T.contiguous(), bits, width)  # [out, in]
        zero_points = self._zero_points(tensors["qzeros"], bits, out).T.float()
        order = group_order(module, tensors.get("g_idx"), width, group_size)
        if order is not None:
            levels = levels[:, order]
        if bits == 4:
            zeros = (8 - zero_points) * scales
            scales, zeros, size = regroup(scales, zeros, group_size, width, module)
            weight = Int4Weight(levels.to(torch.uint8), scales, zeros, size)
        else:  # symmetric where every zero point is 128: no zeros
            zeros = None if bool((zero_points == 128).all()) else (128 - zero_points) * scales
            if group_size < width:
                scales, zeros, group_size = regroup(scales, zeros, group_size, width, module)
            weight = Int8Weight((levels - 128).to(torch.int8), scales, min(group_size, width),
                                zeros=zeros)
        return weight if order is None else ActOrderWeight(weight, order, module)

    def _params(self, module: str) -> dict:
        """The config's bits / group_size, with ``dynamic``'s overrides for ``module``."""
        params = dict(self.defaults)
        for pattern, overrides in self.dynamic.items():
            if pattern.startswith("-:"):
                continue  # modules left unquantized: they hold no qweight
            if re.match(pattern.removeprefix("+:"), module):
                params.update({k: v for k, v in overrides.items() if k in params})
        return params

    def _zero_points(self, qzeros: torch.Tensor, bits: int, out: int) -> torch.Tensor:
        """``[groups, out]`` zero points from their packed words (v1: plus one per field)."""
        if self.version == "gptq":
            ones = sum(1 << (bits * i) for i in range(32 // bits))
            qzeros = (qzeros.to(torch.int64) + ones) & 0xFFFFFFFF
        return unpack_ints(qzeros, bits, out)
