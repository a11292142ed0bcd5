"""compressed-tensors checkpoints (what ``llmcompressor`` writes), read as they are stored.

``config.json``'s ``quantization_config`` (``quant_method: compressed-tensors``) holds config
groups, each a scheme for the modules its ``targets`` name (``Linear``, a module name, or
``re:<pattern>``), minus ``ignore``. Served here:

- ``pack-quantized``: integer levels packed eight 4-bit (or four 8-bit) to an int32 along
  the input features, each stored as ``level + 2 ** (bits - 1)``; ``weight_scale``
  ``[out, groups]`` (``group``), ``[out, 1]`` (``channel``) or ``[1]`` (``tensor``); an
  asymmetric scheme adds ``weight_zero_point`` packed the same way along the *output*
  rows. ``w = scale * (level - zero_point)``. 4-bit → ``Int4Weight`` (ATen's level is the
  stored nibble; ``zero = -zero_point * scale``), 8-bit → ``Int8Weight`` (with zeros
  ``-zero_point * scale`` where asymmetric).
- ``int-quantized`` / ``naive-quantized``: int8 ``weight`` with its scale; with dynamic
  per-token int8 input activations (W8A8) → ``W8A8Linear``'s weights (``Int8Weight`` with
  ``activations_int8``).
- 4-bit weights with dynamic per-token int8 input activations (W4A8, ``pack-quantized``) →
  ``W4A8Linear``'s weights (``Int4Weight`` with ``activations_int8``; zero points allowed).

Refused, naming the module: act-order checkpoints (``weight_g_idx``), static activation
scales, float formats (fp8, nvfp4), and group sizes the kernels do not take.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from .int4_linear import Int4Weight
from .int8_linear import Int8Weight
from .packed_ints import unpack_ints

_INT_FORMATS = ("int-quantized", "naive-quantized")
_FORMATS = ("pack-quantized", *_INT_FORMATS)
_PARTS = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx",
          "weight")


@dataclass
class _Scheme:
    format: str
    weights: dict
    input_activations: dict | None
    targets: list[str]


class CompressedTensorsFormat:
    """The modules of one checkpoint's ``quantization_config`` and how to decode each."""

    name = "compressed-tensors"

    def __init__(self, quantization_config: dict) -> None:
        default_format = quantization_config.get("format")
        self.ignore = list(quantization_config.get("ignore") or [])
        self.schemes = [
            _Scheme(group.get("format") or default_format, group.get("weights") or {},
                    group.get("input_activations"), list(group.get("targets") or []))
            for group in (quantization_config.get("config_groups") or {}).values()]
        for scheme in self.schemes:
            if scheme.format not in _FORMATS:
                raise ValueError(f"compressed-tensors format {scheme.format!r} is not served "
                                 f"(served: {', '.join(_FORMATS)})")

    def quantized_modules(self, names: set[str]) -> set[str]:
        """The modules among checkpoint tensor ``names`` that hold quantized weights."""
        return {name.removesuffix(".weight_scale") for name in names
                if name.endswith(".weight_scale")}

    def tensor_parts(self) -> tuple[str, ...]:
        """The tensor suffixes a quantized module may hold."""
        return _PARTS

    def decode(self, module: str, tensors: dict[str, torch.Tensor]):
        """Module ``module``'s weight from its ``tensors`` (keyed by suffix)."""
        scheme = self._scheme_of(module)
        weights = scheme.weights
        if "weight_g_idx" in tensors:
            raise ValueError(f"{module}: act-order compressed-tensors checkpoints (weight_g_idx) "
                             f"are not served yet; quantize with actorder=None or 'weight'")
        if weights.get("type", "int") != "int":
            raise ValueError(f"{module}: {weights.get('type')} weights are not served "
                             f"(integer weights only)")
        bits = int(weights.get("num_bits", 8))
        scale = tensors["weight_scale"].float()
        if scheme.format == "pack-quantized":
            out, width = (int(n) for n in tensors["weight_shape"].tolist())
            levels = unpack_ints(tensors["weight_packed"], bits, width)
        else:
            levels = tensors["weight"].to(torch.int16)
            out, width = levels.shape
            levels = levels + (1 << (bits - 1))
        scale = scale.expand(out, -1) if scale.shape[0] == 1 else scale.reshape(out, -1)
        group_size = width // scale.shape[1]
        zero_point = tensors.get("weight_zero_point")
        activations = scheme.input_activations
        if activations is not None and not (activations.get("dynamic") and
                                            activations.get("strategy") == "token" and
                                            activations.get("symmetric", True) and
                                            int(activations.get("num_bits", 8)) == 8):
            raise ValueError(f"{module}: input activations {activations} are not served "
                             f"(dynamic symmetric per-token int8 only)")
        if bits == 4:
            zeros = torch.zeros_like(scale) if zero_point is None else \
                -_zero_points(zero_point, bits, out, scheme.format) * scale
            return Int4Weight(levels.to(torch.uint8), scale, zeros, group_size,
                              activations_int8=activations is not None)
        if bits == 8 and (zero_point is None or activations is None):
            zeros = None if zero_point is None else \
                -_zero_points(zero_point, bits, out, scheme.format) * scale
            return Int8Weight((levels - 128).to(torch.int8), scale, group_size,
                              activations_int8=activations is not None, zeros=zeros)
        raise ValueError(f"{module}: {bits}-bit {'asymmetric ' if zero_point is not None else ''}"
                         f"weights{' with int8 activations' if activations else ''} are not "
                         f"served (4-bit and 8-bit weight-only, 4-bit with int8 activations, "
                         f"8-bit symmetric with int8 activations)")

    def _scheme_of(self, module: str) -> _Scheme:
        for scheme in self.schemes:
            if any(_matches(target, module) for target in scheme.targets):
                return scheme
        raise ValueError(f"{module} holds quantized weights but no config group targets it")


def _matches(target: str, module: str) -> bool:
    if target == "Linear":
        return True
    if target.startswith("re:"):
        return re.match(target[3:], module) is not None
    return module == target or module.endswith(f".{target}")


def _zero_points(packed: torch.Tensor, bits: int, rows: int, format: str) -> torch.Tensor:
    """Signed zero points ``[rows, groups]`` (packed along the rows by ``pack-quantized``)."""
    if format != "pack-quantized":
        return packed.float()
    return (unpack_ints(packed.T.contiguous(), bits, rows).T - (1 << (bits - 1))).float()
