"""The model's elementwise steps behind one seam: RMSNorm, residual add + RMSNorm, rotary
embedding, the MLP's SiLU-and-multiply.

``TORCH_OPS`` is plain torch, computed as Hugging Face's Llama computes them:
the reference, and the path wherever the C++ kernels cannot run.
``TritonOps`` does the same on GPUs with the Triton kernels of
``paged_core.kernels.elementwise`` (``PAGED_CORE_GPU_FUSED_OPS=0`` turns them off).
``FusedCpuOps(level)`` does each step in one pass over the rows with the C++ kernels
of one CPU path (``paged_core/cpu/csrc/fused_ops.cpp``), rounding where torch rounds, so both give
the same numbers up to the last bit of RMSNorm's float32 sum of squares and of
SiLU's exp. CPU models in float32 or bfloat16 use it when the kernels build
(``select_ops``).

All three implement:

- ``rms_norm(x, weight, eps)``: ``weight * dtype(x * rsqrt(mean(x^2) + eps))``, float32 inside;
- ``add_rms_norm(residual, x, weight, eps)``: ``(r, rms_norm(r))`` with ``r = residual + x``;
  ``residual`` (the model's own running hidden state) may be updated in place;
- ``rope_tables(rotary, positions)``: what ``rotate`` needs for this step's positions
  (made once per step, shared by every layer);
- ``rotate(q, k, tables)``: rotary embedding (rotate-half convention, over the tables'
  width: the first ``rotary_dim`` dims of each head where rotary is partial) of ``q``
  ``[T, Hq, D]`` and ``k`` ``[T, Hk, D]``; may work in place;
- ``silu_and_mul(gate_up)``: ``silu(gate) * up`` for ``gate_up = [gate | up]`` ``[T, 2 * I]``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class TorchOps:
    name = "torch"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        return weight * x32.to(x.dtype)

    def add_rms_norm(self, residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        residual = residual + x
        return residual, self.rms_norm(residual, weight, eps)

    def rope_tables(self, rotary, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rotary.cos[positions].unsqueeze(1), rotary.sin[positions].unsqueeze(1)

    def rotate(self, q: torch.Tensor, k: torch.Tensor,
               tables: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = tables
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The first ``rotary_dim`` (the tables' width) dims of each head rotated, as transformers
    does it (partial rotary passes the rest through)."""
    rotary_dim = cos.shape[-1]
    if rotary_dim == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat([rot * cos + _rotate_half(rot) * sin, rest], dim=-1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _TablesByRow:
    """Fused rotary kernels read the whole tables and each token's row: ``rope_tables`` is
    ``(positions, cos, sin)``, no per-step gather."""

    def rope_tables(self, rotary, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return positions, rotary.cos, rotary.sin


class FusedCpuOps(_TablesByRow):
    """The fused C++ ops of one CPU kernel build (``cpu_isa``, a ``paged_core.cpu.isa`` level)."""

    name = "fused-cpu"

    def __init__(self, cpu_isa: str) -> None:
        from ..cpu.extension import cpu_ops

        self.cpu_isa = cpu_isa
        self._ops = cpu_ops(cpu_isa)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.empty_like(rows)
        self._ops.rms_norm(rows, weight, eps, out)
        return out.view(x.shape)

    def add_rms_norm(self, residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.empty_like(residual)
        self._ops.add_rms_norm(residual, x.contiguous(), weight, eps, out)
        return residual, out

    def rotate(self, q: torch.Tensor, k: torch.Tensor,
               tables: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        self._ops.rotary_embedding(q, k, *tables)
        return q, k

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        out = gate_up.new_empty(gate_up.shape[0], gate_up.shape[1] // 2)
        self._ops.silu_and_mul(gate_up.contiguous(), out)
        return out


class TritonOps(_TablesByRow):
    """The fused Triton kernels of ``paged_core.kernels.elementwise``: one launch per step
    (GPU models; on CPU only in Triton's interpreter, for tests)."""

    name = "triton"

    def __init__(self) -> None:
        from paged_core.kernels import elementwise

        self._kernels = elementwise

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return self._kernels.rms_norm(x, weight, eps)

    def add_rms_norm(self, residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        return residual, self._kernels.rms_norm(x, weight, eps, residual=residual)

    def rotate(self, q: torch.Tensor, k: torch.Tensor,
               tables: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        self._kernels.rotate_(q, k, *tables)
        return q, k

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self._kernels.silu_and_mul(gate_up)


TORCH_OPS = TorchOps()


def select_ops(device: torch.device, dtype: torch.dtype) -> TorchOps | FusedCpuOps | TritonOps:
    """CUDA models: the fused Triton ops (unless ``PAGED_CORE_GPU_FUSED_OPS=0``); CPU
    float32/bfloat16 models: the fused C++ ops when they build here; else plain torch."""
    from ..cpu.extension import cpu_extension_available
    from ..cpu.isa import selected_cpu_isa
    from ..config.setting_values import env_flag

    if device.type == "cuda":
        return TritonOps() if env_flag("gpu_fused_ops", default=True) else TORCH_OPS
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return TORCH_OPS
    cpu_isa = selected_cpu_isa()
    return FusedCpuOps(cpu_isa) if cpu_extension_available(cpu_isa) else TORCH_OPS
