"""The two LoRA products of a projection, for every adapter of a step in one call each
(Punica's shrink and expand), behind one seam:

- ``shrink(x, a, widths, batch)``: ``u[t, :w] = a[s, :w] @ x[t]``, float32 ``[T, W]``, zero
  past ``w`` and for rows without an adapter;
- ``expand(y, u, b_t, widths, part_starts, batch)``: ``y[t] = dtype(y[t] + u[t, :w] @ b_t[s, :w])``
  in place,

- ``apply(y, x, a, b_t, widths, part_starts, batch)``: both, with the bits of ``shrink`` then
  ``expand`` (the C++ ops keep each row group's ``u`` to themselves and wake threads once),

where ``s`` is row ``t``'s slot in ``batch.token_slots`` (-1: none), ``w = widths.values[s]`` and
``T = len(batch.token_slots)`` (padding rows past it are left alone). Between shrink and
expand a row-parallel projection all-reduces ``u`` (``LoRALinear``); every other projection
calls ``apply``. ``b_t`` of a fused projection is block-diagonal (``layers``): ``part_starts``
(its parts' output column boundaries, ``P + 1`` of them) lets the C++ ops multiply only part
``p``'s rows ``[p w/P, (p+1) w/P)`` by its columns; the others multiply the whole table, zeros
included (the same sums).

Each implementation names the dtype it wants the tables in (``table_dtype``).
``CpuLoRAProducts`` runs the C++ ops of one CPU kernel build (``cpu/csrc/lora_products.cpp``;
the one-call decoder stack calls the same functions, so both paths give the same bits),
``TritonLoRAProducts`` the Triton kernels of ``paged_core.kernels.lora`` (CUDA), and
``TorchLoRAProducts`` plain torch, one pair of GEMMs per adapter segment of the step
(wherever neither runs). ``select_products`` picks by the model's elementwise ops, which are
chosen by the same rules (``models.elementwise.select_ops``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


class SlotWidths:
    """How many table columns the adapter in each slot uses (0: none), on the host
    (``values``) and as an int64 tensor on the tables' device (``tensor``, for kernels that
    must not read the host's)."""

    def __init__(self, num_slots: int, device: torch.device) -> None:
        self.values = [0] * num_slots
        self.tensor = torch.zeros(num_slots, dtype=torch.int64, device=device)

    def set(self, slot: int, width: int) -> None:
        self.values[slot] = width
        self.tensor[slot] = width


@dataclass
class LoRABatch:
    """This step's rows by adapter: ``token_slots`` each row's slot (int64 on the model's
    device; ``None`` when no row runs an adapter)."""

    token_slots: torch.Tensor | None = None


class ShrinkThenExpand:
    """``apply`` as ``shrink`` then ``expand``, for implementations with no fused one."""

    def apply(self, y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b_t: torch.Tensor,
              widths: SlotWidths, part_starts: list[int], batch: LoRABatch) -> None:
        self.expand(y, self.shrink(x, a, widths, batch), b_t, widths, part_starts, batch)


class TorchLoRAProducts(ShrinkThenExpand):
    name = "torch"

    @staticmethod
    def table_dtype(model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
        """float32 on a CPU (ATen's bf16 GEMM with an inner size of a LoRA rank takes a slow
        path there without native bf16 dot products: ~20x float32's time measured on an AVX2
        EPYC), else the model's dtype."""
        return torch.float32 if device.type == "cpu" else model_dtype

    def shrink(self, x: torch.Tensor, a: torch.Tensor, widths: SlotWidths,
               batch: LoRABatch) -> torch.Tensor:
        u = x.new_zeros(len(batch.token_slots), a.shape[1], dtype=torch.float32)
        for slot, rows in _segment_rows(batch, widths):
            width = widths.values[slot]
            u[rows, :width] = x[rows].to(a.dtype) @ a[slot, :width].T
        return u

    def expand(self, y: torch.Tensor, u: torch.Tensor, b_t: torch.Tensor, widths: SlotWidths,
               part_starts: list[int], batch: LoRABatch) -> None:
        for slot, rows in _segment_rows(batch, widths):
            width = widths.values[slot]
            delta = u[rows, :width].to(b_t.dtype) @ b_t[slot, :width]
            y[rows] = (y[rows].float() + delta.float()).to(y.dtype)


class CpuLoRAProducts:
    """The C++ ops of one CPU kernel build (``cpu_isa``, a ``paged_core.cpu.isa`` level)."""

    name = "cpu"

    @staticmethod
    def table_dtype(model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
        """The model's (float32 or bfloat16): the ops widen table elements as they load them,
        so bfloat16 tables halve the bytes a step streams (rank-64 tables of four adapters
        outweigh SmolLM2-135M's bf16 weights in float32)."""
        return torch.bfloat16 if model_dtype == torch.bfloat16 else torch.float32

    def __init__(self, cpu_isa: str) -> None:
        from ..cpu.extension import cpu_ops

        self._ops = cpu_ops(cpu_isa)

    def shrink(self, x: torch.Tensor, a: torch.Tensor, widths: SlotWidths,
               batch: LoRABatch) -> torch.Tensor:
        return self._ops.lora_shrink(x, a, widths.values, batch.token_slots)

    def expand(self, y: torch.Tensor, u: torch.Tensor, b_t: torch.Tensor, widths: SlotWidths,
               part_starts: list[int], batch: LoRABatch) -> None:
        self._ops.lora_expand(y, u, b_t, widths.values, part_starts, batch.token_slots)

    def apply(self, y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b_t: torch.Tensor,
              widths: SlotWidths, part_starts: list[int], batch: LoRABatch) -> None:
        self._ops.lora_apply(y, x, a, b_t, widths.values, part_starts, batch.token_slots)


class TritonLoRAProducts(ShrinkThenExpand):
    """The Triton kernels of ``paged_core.kernels.lora`` (CUDA; on CPU only in Triton's
    interpreter, for tests)."""

    name = "triton"

    @staticmethod
    def table_dtype(model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
        return model_dtype

    def __init__(self) -> None:
        from paged_core.kernels import lora

        self._kernels = lora

    def shrink(self, x: torch.Tensor, a: torch.Tensor, widths: SlotWidths,
               batch: LoRABatch) -> torch.Tensor:
        return self._kernels.lora_shrink(x, a, widths.tensor, batch.token_slots)

    def expand(self, y: torch.Tensor, u: torch.Tensor, b_t: torch.Tensor, widths: SlotWidths,
               part_starts: list[int], batch: LoRABatch) -> None:
        self._kernels.lora_expand_(y, u, b_t, widths.tensor, batch.token_slots)


def _segment_rows(batch: LoRABatch, widths: SlotWidths):
    """``(slot, rows)`` for each slot with an adapter that rows of the step run, ``rows`` their
    index tensor."""
    slots = batch.token_slots
    for slot in torch.unique(slots[slots >= 0]).tolist():
        if widths.values[slot]:
            yield slot, torch.nonzero(slots == slot).flatten()


def select_products(ops) -> TorchLoRAProducts | CpuLoRAProducts | TritonLoRAProducts:
    """The products that go with the model's elementwise ``ops``: the C++ ops of the same CPU
    build, the Triton kernels beside the Triton ops, else plain torch."""
    from ..models.elementwise import FusedCpuOps, TritonOps

    if isinstance(ops, FusedCpuOps):
        return CpuLoRAProducts(ops.cpu_isa)
    if isinstance(ops, TritonOps):
        return TritonLoRAProducts()
    return TorchLoRAProducts()
