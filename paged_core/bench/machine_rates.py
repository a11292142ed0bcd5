"""The rates ``bench attention`` holds attention against, measured in the same run.

- memory bandwidth: ``torch.sum`` (reads ``n`` bytes) and ``copy_`` (reads ``n``, writes
  ``n``: counted ``2n``) of a float32 tensor far larger than any CPU cache, with torch's
  threads; the best of several passes (the rate this machine can reach now);
- linear FLOP rate: one model layer's projections (``ModelShape.projections``) on ``rows``
  tokens through the linear the engine uses for that dtype at that CPU path
  (``packed_linear_dtype``: ``cpu_linear.packed_linear`` computing in that dtype, or
  ``F.linear``),
  ``2 * rows * in * out`` FLOPs each.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..cpu.isa import packed_linear_dtype, selected_bf16_linear
from ..models.cpu_linear import bf16_dot_level, packed_linear
from .attention_cases import ModelShape


# The probe whose best torch.sum rate sets runs against the machine's memory speed of the
# moment (bench steps, bench throughput): a tensor far larger than any CPU cache, 5 passes.
PROBE_BYTES = 1 << 30
PROBE_PASSES = 5


def read_bandwidth() -> float:
    """This machine's memory read GB/s now: the best ``torch.sum`` of ``memory_bandwidth``'s
    probe (``PROBE_BYTES``, ``PROBE_PASSES``), without its copies."""
    return memory_bandwidth(PROBE_BYTES, PROBE_PASSES, copies=False)["read_gbs"]


def memory_bandwidth(num_bytes: int, passes: int, copies: bool = True) -> dict[str, float]:
    """Best GB/s (1e9 bytes/s) of ``passes`` sums (``read_gbs``) and, with ``copies``, copies
    (``copy_gbs``) of a ``num_bytes`` tensor."""
    src = torch.ones(num_bytes // 4, dtype=torch.float32)
    probes = [("read_gbs", num_bytes, src.sum)]
    if copies:
        dst = torch.zeros_like(src)  # written once here: no page faults inside the timed copies
        probes.append(("copy_gbs", 2 * num_bytes, lambda: dst.copy_(src)))
    best = {key: 0.0 for key, _, _ in probes}
    for _ in range(passes):
        for key, moved, fn in probes:
            start = time.perf_counter()
            fn()
            best[key] = max(best[key], moved / (time.perf_counter() - start) / 1e9)
    return best


def linear_kind(dtype: torch.dtype, cpu_isa: str) -> str:
    """Which linear a ``dtype`` model uses at ``cpu_isa``: ``F.linear``, ``packed <dtype>``
    (oneDNN), ``bf16_dot`` or ``amx`` (``Bf16DotLinear`` in bfloat16, with AMX tiles for many
    rows), or ``bf16_dot (<level>)`` (``Bf16DotLinear`` widening bfloat16 weights to float32
    at the ``avx2`` or ``avx512`` level). Two levels share a name only where they run the
    same kernel: ``bench attention`` times each name once."""
    compute = packed_linear_dtype(torch.device("cpu"), dtype, cpu_isa)
    if compute is None:
        return "F.linear"
    level = bf16_dot_level(dtype, compute, cpu_isa)
    if level is not None:
        return selected_bf16_linear() if level == "avx512_bf16" else f"bf16_dot ({level})"
    return f"packed {str(compute).removeprefix('torch.')}"


def linear_flops(shape: ModelShape, rows: int) -> int:
    """FLOPs of one layer's projections on ``rows`` tokens."""
    return sum(2 * rows * fan_in * fan_out for fan_in, fan_out in shape.projections())


def linear_call(shape: ModelShape, dtype: torch.dtype, cpu_isa: str, rows: int,
                generator: torch.Generator) -> Callable[[], None]:
    """Run every projection of one layer on ``rows`` tokens with the engine's linear for
    ``dtype`` at ``cpu_isa`` (random weights and inputs)."""
    compute = packed_linear_dtype(torch.device("cpu"), dtype, cpu_isa)
    layers, inputs = [], []
    for fan_in, fan_out in shape.projections():
        weight = torch.empty(fan_out, fan_in, dtype=dtype).normal_(std=fan_in ** -0.5,
                                                                   generator=generator)
        layers.append(_plain_linear(weight) if compute is None
                      else packed_linear(weight, None, compute, cpu_isa))
        inputs.append(torch.empty(rows, fan_in, dtype=dtype).normal_(generator=generator))

    def run() -> None:
        for layer, x in zip(layers, inputs, strict=True):
            layer(x)
    return run


def _plain_linear(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x -> F.linear(x, weight)``: the unpacked linear (float32 models, ``generic``)."""
    return lambda x: F.linear(x, weight)
