"""A step of rows under several LoRA adapters, and the float64 answer of its two products
(``paged_core.lora.products``), shared by the tests of every implementation of them."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from paged_core.lora.products import LoRABatch, SlotWidths


@dataclass
class LoRAStep:
    x: torch.Tensor  # [rows + padding, in]
    y: torch.Tensor  # [rows + padding, out], the base output
    a: torch.Tensor  # [slots, W, in]
    b_t: torch.Tensor  # [slots, W, out], block-diagonal over the parts
    widths: SlotWidths
    part_starts: list[int]
    batch: LoRABatch


def make_step(dtype: torch.dtype, in_features: int = 77, out_features: int = 1100,
              token_slots: tuple[int, ...] = (2, -1, 0, 2, 2, 2, 2, 3, 0, -1),
              widths: tuple[int, ...] = (24, 9, 15, 0), max_width: int = 24, padding: int = 3,
              part_starts: tuple[int, ...] = (0, 400, 750, 1100),
              table_dtype: torch.dtype = torch.float32, seed: int = 0) -> LoRAStep:
    """Rows under slots ``token_slots`` (-1: none; slot 1 holds an adapter no row uses, slot 3
    none at all), ``padding`` rows past them, feature sizes that are no multiple of 8; each
    slot's ``b_t`` block-diagonal over the parts (``part_starts``) as ``LoRALinear`` lays a
    fused projection's adapter out."""
    gen = torch.Generator().manual_seed(seed)
    rows = len(token_slots) + padding
    slot_widths = SlotWidths(len(widths), torch.device("cpu"))
    a = torch.zeros(len(widths), max_width, in_features)
    b_t = torch.zeros(len(widths), max_width, out_features)
    for slot, width in enumerate(widths):
        slot_widths.set(slot, width)
        a[slot, :width] = torch.randn(width, in_features, generator=gen) / in_features ** 0.5
        rank = width // (len(part_starts) - 1)
        for part, (start, end) in enumerate(zip(part_starts, part_starts[1:])):
            b_t[slot, part * rank:(part + 1) * rank, start:end] = torch.randn(
                rank, end - start, generator=gen)
    slots = torch.tensor(token_slots, dtype=torch.int64)
    return LoRAStep(torch.randn(rows, in_features, generator=gen).to(dtype),
                    torch.randn(rows, out_features, generator=gen).to(dtype),
                    a.to(table_dtype), b_t.to(table_dtype), slot_widths, list(part_starts),
                    LoRABatch(token_slots=slots))


def expected_shrink(step: LoRAStep) -> torch.Tensor:
    u = torch.zeros(len(step.batch.token_slots), step.a.shape[1], dtype=torch.float64)
    for t, slot in enumerate(step.batch.token_slots.tolist()):
        if slot >= 0:
            width = step.widths.values[slot]
            u[t, :width] = step.a[slot, :width].double() @ step.x[t].double()
    return u


def expected_expand(step: LoRAStep, u: torch.Tensor) -> torch.Tensor:
    """The new ``y`` (float64) after the expand of ``u``."""
    y = step.y.double().clone()
    for t, slot in enumerate(step.batch.token_slots.tolist()):
        if slot >= 0:
            width = step.widths.values[slot]
            y[t] += u[t, :width].double() @ step.b_t[slot, :width].double()
    return y
