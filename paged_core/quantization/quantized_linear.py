"""``QuantizedLinear``: the base of the weight-only quantized linears.

A quantized linear computes ``y = x @ W.T (+ bias)`` with ``W`` kept in its stored levels.
Its C++ kernel (``cpu/csrc/quantized_linear.cpp``, the selected CPU level's build) widens
the levels in registers and shares them between the rows in flight: the right tool for
decode, where a step multiplies a few rows and the bytes of weight read set the pace. For
many rows at once (a prefill chunk) one dense GEMM is faster, so from ``dense_rows`` rows
the weight is dequantized for that one call and multiplied densely: the model still holds
only the levels. Without the C++ kernels (another architecture, no compiler) every call
takes the dense path.

A bfloat16 linear at the ``avx512_bf16`` level keeps its levels in column groups of 32
outputs instead (``column_pack``; ``cpu/csrc/quantized_column_linear.cpp``): its decode
kernel multiplies the bfloat16 rows as they are with ``vdpbf16ps``, or, on a CPU with AMX
tiles, from ``COLUMN_AMX_MIN_ROWS`` rows, on the tiles (``quantized_column_amx.cpp``; the
same float32 sums; groups of a multiple of 32 features only: others take the many-rows path
early, ``COLUMN_UNTILED_DENSE_ROWS``); 8-bit levels on a CPU with AMX-INT8 go to the tiles
unwidened, the rows cut into 8-bit digits instead, for calls of up to ``INT8_TILE_ROWS`` rows
(``int8_tile_kernel``), 8-bit levels are kept as narrow as they allow (5 bits for GGUF's
5-bit types, biased bytes for 6-bit ones, 4-bit indices for IQ4: ``Int8Linear``'s
``column_packing``) and take zeros; its many-rows path widens the weight
straight into ``Bf16DotLinear``'s layout for that GEMM (AMX where the CPU has it).
``column_outputs`` says which layout a linear keeps. A bfloat16 8- or 4-bit linear at the
``avx2`` and ``avx512`` levels keeps its levels in column groups of 32 outputs too, but its
own (``_fma_columns_layout``: ``column_groups`` of 8-bit levels, ``int4_columns`` of 4-bit
ones), multiplied in float32 FMAs straight from the levels
(``cpu/csrc/quantized_fma_columns.cpp``), its many-rows path ``row_layout_dense``'s.

ATen's own weight-only CPU GEMMs were measured against these kernels and are not used: 30
SmolLM2 layers x 4 projections, bfloat16 rows, one process alternating (AMD EPYC family 25
model 17, avx512_bf16, 2 threads, 2026-12-06): ``_weight_int4pack_mm_for_cpu`` (4-bit,
groups of 64) 3.57 / 10.75 / 40.38 / 160.74 / 643.18 ms at 1 / 8 / 32 / 128 / 512 rows
against 2.96 / 5.69 / 18.23 / 65.03 / 252.93 here, ``_weight_int8pack_mm`` (8-bit, one
scale per channel) 8.65 / 21.61 / 55.31 / 191.65 / 737.28 against 4.38 / 6.71 / 20.16 /
66.74 / 252.67 (bfloat16 weights: 7.60 / 8.55 / 17.65 / 63.54 / 251.05).

Invariants: the output has the input's dtype (the ``dtype`` the linear was built for);
``bias`` is a parameter of that dtype under the dense layer's name, loaded with the
model's other weights; the kernels compute in float32.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from ..cpu.extension import cpu_extension_available, cpu_ops
from ..cpu.isa import selected_cpu_isa

# Rows from which one dequantization per call beats the kernels (default 24: between 16 and
# 32 rows on a 2-core AVX2 EPYC, where the kernels' time grows with the rows and a dense
# GEMM's much slower); overridable for tuning and tests
DENSE_ROWS_SETTING = "PAGED_CORE_QUANTIZED_DENSE_ROWS"

# The column layout on AMX tiles. Its 4-bit kernel beats one dense GEMM up to about 64 rows
# (30 SmolLM2 layers x 4 projections, 2-core Xeon with AMX: 4-bit 23 against 33 ms at 48
# rows, alike at 64-96), so the dense path starts there; 8-bit levels, twice the bytes, up
# to 48 rows (one pass on three row tiles), past which a second pass widens them again (30
# SmolLM2 layers x 4 projections, groups of 32, Intel(R) Xeon(R) Processor, amx_bf16,
# column kernel against dense path: levels 0..31 with zeros, 7-bit style, 40 rows 10.9 /
# 11.9 ms, 48 rows 12.0 / 12.4, 50 rows 14.1 / 12.6, 56 rows 14.6 / 12.5; full-range levels
# 48 rows 11.4 / 12.3, 50 rows 14.8 / 12.6, 63 rows 16.0 / 13.3). Rows take the tiles from
# 2: one row is a vector's work, and the tiles' per-group chain (the widened levels stored,
# loaded as B tiles, multiplied, the sums stored and read back) outlasts it (30 SmolLM2
# layers x 4 projections, one process alternating, float16 factors, Intel(R) Xeon(R)
# Processor, amx_bf16: 4-bit one row, groups of 32, tiles 3.51 against vdpbf16ps 2.80 ms,
# groups of 64 2.98 against 2.67; 2 rows 3.55 / 3.62 and 3.04 / 3.53; 2 Llama-8B-like
# layers, groups of 128: one row 8.85 / 8.51, 2 rows 8.91 / 11.39; 8-bit one row, groups of
# 32, 4.64 / 4.15; decode steps of the embedded model in W8A16, 2 sequences 13.5 against
# 14.3 ms).
COLUMN_AMX_DENSE_ROWS = {4: 64, 8: 49}
COLUMN_AMX_MIN_ROWS = 2
# Groups that are not whole tile steps (group_size % 32: GGUF Q6_K's groups of 16) keep the
# column kernel on vdpbf16ps, which widens the levels again for every 4 rows, while the dense
# path's GEMM still takes the tiles: there the dense path starts at 4 rows (30 SmolLM2 layers x
# 4 projections, groups of 16, Intel(R) Xeon(R) Processor, amx_bf16: 8-bit, column kernel
# against dense path, 3 rows 7.9 / 9.3 ms, 4 rows 9.2 / 8.7, 8 rows 15.8 / 9.5, 16 rows
# 29.6 / 11.3, 48 rows 82.5 / 14.1; 4-bit 2 rows 5.1 / 7.3, 4 rows 7.1 / 7.4, 8 rows 12.2 /
# 8.0, 16 rows 22.1 / 8.0).
COLUMN_UNTILED_DENSE_ROWS = 4
# The column layout on vdpbf16ps: the column kernel widens the levels again for every 4 rows
# (full-range 8-bit levels: every 8 rows, by halves; fetching the next column group's levels
# line by line as it reads its own); the dense path widens one column group at a time into
# L1 (the next group's levels fetched meanwhile), then runs bf16_dot_linear's row tiles over
# it. 4-bit rows take the dense path from 40 rows (30 SmolLM2 layers x 4 projections, AMD EPYC
# Zen 5, avx512_bf16, one run: 4-bit, groups of 64, column against dense 24 rows 7.9 against
# 8.3 ms, 40 rows 12.6 against 12.7, 48 rows 14.3 against 14.3, bfloat16 weights 8.9 / 12.9 /
# 13.7), full-range 8-bit rows from 36 (one scale per channel, one process alternating, AMD
# EPYC family 25 model 17, avx512_bf16: 12 rows 10.1 against 11.4, 24 rows 16.1 against 17.2,
# 32 rows 20.6 against 21.0, 40 rows 25.2 against 24.9). 8-bit levels within -64..63 (int7,
# GGUF Q6_K), which keep passes of 4 rows, keep the threshold measured for 8-bit levels in
# those passes (Zen 5 above, one scale per channel: 8 rows 4.3 against 4.8, 12 rows 5.8
# against 5.7, 16 rows 7.4 against 7.1).
COLUMN_DENSE_ROWS = {4: 40, 8: 36}
INT7_COLUMN_DENSE_ROWS = 12
# The row layout's many-rows path for bfloat16 linears at the avx2 and avx512 levels
# (row_layout_dense: bfloat16 weights widened a column group at a time, on bf16_dot_linear's
# tiles). 4-bit rows take it from 12 rows, 8-bit ones, whose row kernel widens its levels for
# less, from 20 (30 SmolLM2 layers x 4 projections, AMD EPYC Zen 3, best ISA avx2, 2 threads,
# one process alternating, noisy host: 4-bit groups of 32, row kernel against row_layout_dense
# 8 rows 60.2 against 58.3 ms, 12 rows 89.8 against 61.8, 24 rows 164.1 against 100.1; 8-bit
# groups of 64, 12 rows 64.5 against 92.0, 16 rows 78.3 against 81.9, 24 rows 105.4 against
# 98.7; the float32 dequantization and oneDNN GEMM they replace took 162.8-245.3 ms). Since
# row_layout_dense fetches the next group's levels during the current group's row tiles, 8-bit
# rows take it from 16: the same projections, one scale per channel, AMD EPYC family 25 model
# 17 capped to the level, one process alternating (2026-12-06), row kernel against
# row_layout_dense, avx2 12 rows 27.9 against 28.3 ms, 16 rows 37.8 / 33.8, 20 rows 48.0 /
# 39.7; avx512 12 rows 24.8 / 26.2, 16 rows 31.5 / 29.2 (not yet timed on a CPU whose best
# ISA is avx2). After the avx2 row kernel took one-scale 8-bit rows up to 10 a pass
# (quantized_linear.cpp's rows_in_flight) the crossover there still lies at 14-15 rows: row
# kernel against row_layout_dense 13 rows 28.1 / 31.8 ms, 15 rows 35.0 / 32.9, 16 rows 39.0 /
# 33.4 (same machine capped to avx2, one process switching per call).
ROW_DENSE_ROWS = {4: 12, 8: 16}
# 8-bit calls of up to INT8_TILE_ROWS rows on AMX-INT8 tiles instead, the levels unwidened
# (quantized_int8_tiles.cpp): PAGED_CORE_CPU_INT8_LINEAR, see int8_tile_kernel. Up to 5 rows
# (one pass: their three digit rows stacked in 15 tile rows) the tiles beat the widening
# kernels; from 8 rows, in passes, they lost (30 SmolLM2 layers x 4 projections, one scale per
# channel, 2 threads, one process alternating; Intel(R) Xeon(R) Processor, amx_bf16: 1 row
# 5.9 against 7.5 ms on vdpbf16ps (8.6 against 8.5 in a slower hour), 4 rows 6.2 against 8.0
# on AMX-BF16 tiles (8.8 against 10.3), 8 rows 8.9 against 8.0, 16 rows 11.3 against 8.6).
INT8_TILE_ROWS = 5
INT8_LINEAR_SETTING = "PAGED_CORE_CPU_INT8_LINEAR"
INT8_LINEAR_KERNELS = ("amx_int8", "bf16")


def int8_tile_kernel(kernels, group_size: int, amx_selected: bool) -> bool:
    """Whether an 8-bit column-layout linear with ``group_size`` takes ``int8_tile_gemm`` (the
    levels as int8 B tiles, the rows cut into three 8-bit digits each) rather than widening its
    levels to bfloat16 (``column_gemm``): ``PAGED_CORE_CPU_INT8_LINEAR`` ``amx_int8`` always,
    ``bf16`` never, ``auto`` (the default) where the bfloat16 linears take AMX tiles
    (``amx_selected``), the OS granted AMX-INT8 (``amx_int8_ready``) and the groups fit whole
    tile steps (a multiple of 64 features, at most 65536 or a multiple of it). Raises
    ``ValueError`` naming the setting for a value it does not know, or ``amx_int8`` where the
    tiles cannot run or the groups do not fit."""
    raw = os.environ.get(INT8_LINEAR_SETTING, "").strip().lower() or "auto"
    if raw not in ("auto", *INT8_LINEAR_KERNELS):
        raise ValueError(f"{INT8_LINEAR_SETTING}={raw!r} is not an 8-bit linear kernel; choose "
                         f"auto or one of {', '.join(INT8_LINEAR_KERNELS)}")
    if raw == "bf16":
        return False
    fits = group_size % 64 == 0 and (group_size <= 65536 or group_size % 65536 == 0)
    ready = bool(kernels.amx_int8_ready())
    if raw == "auto":
        return amx_selected and ready and fits
    if not ready:
        raise ValueError(f"{INT8_LINEAR_SETTING}=amx_int8: this CPU or OS gives no AMX-INT8 "
                         f"tiles; choose auto or bf16")
    if not fits:
        raise ValueError(f"{INT8_LINEAR_SETTING}=amx_int8: groups of {group_size} features do "
                         f"not fit whole tile steps of 64; choose auto or bf16")
    return True


def narrowed_factors(factors: torch.Tensor) -> torch.Tensor:
    """Float32 per-group factors (scales, offsets, zeros) as float16 if every value is one
    exactly (GGUF's fp16 scales, most checkpoints' bf16 or fp16 ones), else unchanged. The
    column kernels read either (``Factors`` in ``quantized_column_layout.h``): the same
    values, so the same sums, in half the bytes; a decode step of 4-bit groups of 32 reads
    0.625 bytes a weight instead of 0.75."""
    half = factors.half()
    return half if torch.equal(half.float(), factors) else factors


def column_groups(t: torch.Tensor) -> torch.Tensor:
    """Levels ``[N, K]`` or per-group factors ``[N, K / group_size]`` in column groups of 32
    outputs, ``[N / 32, ..., 32]`` (N a multiple of 32): the order of the float32 FMA column
    groups (``cpu/csrc/quantized_fma_columns.cpp``), whose kernels ``int8_gemm`` / ``int4_gemm``
    and the dequantize ops take beside the row layout."""
    n, width = t.shape
    return t.view(n // 32, 32, width).transpose(1, 2).contiguous()


class QuantizedLinear(nn.Module):
    bits: int  # 4 or 8: each subclass's

    def __init__(self, out_features: int, in_features: int, has_bias: bool,
                 dtype: torch.dtype, dense_dtype: torch.dtype | None = None) -> None:
        """``dense_dtype``: what the many-rows path multiplies in (default ``dtype``; the
        model's dense linears' compute dtype where that differs, e.g. float32 for a bfloat16
        model on a CPU without native bf16)."""
        super().__init__()
        self.out_features, self.in_features = out_features, in_features
        self.dtype = dtype
        self.dense_dtype = dense_dtype or dtype
        self.dense_rows = int(os.environ.get(DENSE_ROWS_SETTING, "24"))
        level = selected_cpu_isa()
        self.kernels = cpu_ops(level) if cpu_extension_available(level) else None
        self.level = level if self.kernels is not None else None  # whose kernels
        self.column_outputs = 0  # > 0: the levels are column_pack's, of this many outputs
        self.row_dense = False  # the many-rows path widens the row layout (row_layout_dense)
        self.amx_min_rows = 0  # the column layout's kernels: AMX tiles from these rows (0: none)
        self.int8_tile_rows = 0  # 8-bit column layout: calls of up to this many rows on AMX-INT8
        self.offsets = self.zeros = None  # per group, for the layout's kernels (subclasses')
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype),
                                 requires_grad=False) if has_bias else None

    def _keeps_column_layout(self) -> bool:
        """Whether this linear can keep the column layout: bfloat16 throughout, the
        ``avx512_bf16`` kernels."""
        return self.level == "avx512_bf16" and self.dtype == self.dense_dtype == torch.bfloat16

    def _amx_selected(self) -> bool:
        """Whether this linear's kernels take AMX tiles: they are the ``avx512_bf16`` level's
        (the only build with the tile ops), and the tiles are selected and granted (the dense
        path's and the column kernels', W8A8's and W4A8's int8 tiles)."""
        from ..models.cpu_linear import bf16_amx_min_rows

        return self.level == "avx512_bf16" and bf16_amx_min_rows() > 0

    def _column_layout(self, q: torch.Tensor, per_group: list[torch.Tensor],
                       packing: str = "") -> list | None:
        """``column_pack``'s levels and per-group tensors where this linear keeps the column
        layout (``_keeps_column_layout``), else ``None``; ``packing`` (``Int8Linear``): ``""``
        full bytes, ``"int7"`` int8 levels within -64..63 stored biased in a byte, ``"int5"``
        levels within -16..15 or 0..31 in 5 bits, ``"iq4"`` levels that are all IQ4_NL values
        as their 4-bit indices (these two take the 4-bit thresholds). Each per-group tensor is
        float16 where that holds every value exactly, else float32 (``narrowed_factors``)."""
        if not self._keeps_column_layout():
            return None
        bits = 4 if packing in ("int5", "iq4") else self.bits  # about the stored levels' cost
        self.column_outputs = self.out_features
        dense_from = INT7_COLUMN_DENSE_ROWS if packing == "int7" else COLUMN_DENSE_ROWS[bits]
        self.dense_rows = int(os.environ.get(DENSE_ROWS_SETTING, dense_from))
        if self._amx_selected():  # AMX tiles selected and granted (the dense path's too)
            self.amx_min_rows = COLUMN_AMX_MIN_ROWS
            tiled = self.group_size % 32 == 0  # the column kernel takes them as well
            self.dense_rows = int(os.environ.get(
                DENSE_ROWS_SETTING,
                COLUMN_AMX_DENSE_ROWS[bits] if tiled else COLUMN_UNTILED_DENSE_ROWS))
        levels, *packed = self.kernels.column_pack(q, per_group, packing)
        return [levels, *(narrowed_factors(t) for t in packed)]

    def _keeps_fma_columns(self) -> bool:
        """Whether the levels go in column groups for float32 FMAs (``column_groups``,
        ``int4_columns``): a bfloat16 linear at the ``avx2`` or ``avx512`` level (no bfloat16
        dot products there) whose outputs are whole groups of 32. With its many-rows path
        from the subclass's ``COLUMNS_DENSE_ROWS`` it beat the row layout's kernels at every
        batch measured (``quantized_fma_columns.cpp``)."""
        return (self.level in ("avx2", "avx512") and self.dtype == torch.bfloat16
                and self.out_features % 32 == 0)

    def _fma_columns_layout(self, levels: torch.Tensor, factors: list[torch.Tensor],
                            dense_from: int) -> list[torch.Tensor]:
        """``levels`` (already in column groups) and the ``factors`` (scales, then any zeros)
        in ``column_groups``. Calls from ``dense_from`` rows take the many-rows path,
        ``row_layout_dense``, which takes these levels too (each column group widened to
        bfloat16 once: the row layout's bits)."""
        self.row_dense = True
        self.dense_rows = int(os.environ.get(DENSE_ROWS_SETTING, dense_from))
        return [levels, *(column_groups(t) for t in factors)]

    def _row_layout(self) -> None:
        """Where the row layout's levels stay (every level but ``avx512_bf16``'s bfloat16
        linears and ``_fma_columns_layout``'s): a bfloat16 linear at the ``avx2`` or
        ``avx512`` level multiplies many rows by ``row_layout_dense`` (bfloat16 weights
        widened a column group at a time on ``bf16_dot_linear``'s tiles) from
        ``ROW_DENSE_ROWS`` rows, instead of a float32 dequantization of the whole weight
        times oneDNN's float32 GEMM."""
        if self.level in ("avx2", "avx512") and self.dtype == torch.bfloat16:
            self.row_dense = True
            self.dense_rows = int(os.environ.get(DENSE_ROWS_SETTING, ROW_DENSE_ROWS[self.bits]))

    def quantized_product(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows @ W.T`` (float32 ``[n, in]`` → ``[n, out]``) by the C++ kernel."""
        raise NotImplementedError

    def dequantized_weight(self) -> torch.Tensor:
        """``W`` in float32, built for one call."""
        if self.column_outputs:
            return self.kernels.column_dequantize(self.levels, self.scales, self.zeros,
                                                  self.group_size, self.column_outputs)
        return self.row_layout_weight()

    def row_layout_weight(self) -> torch.Tensor:
        """``W`` in float32 from the row layout's levels."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.product(x.reshape(-1, self.in_features), out_dtype=x.dtype).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def dense_silu_and_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """``silu(gate) * up`` of this gate_up projection's product (``[gate | up]``),
        ``[..., out_features / 2]``, computed in the dense path's epilogue
        (``column_dense_silu_and_mul``: bit for bit this level's ``FusedCpuOps.silu_and_mul``
        of ``self(x)``, without the ``[..., out_features]`` product), where the column layout
        takes its dense path for ``x``'s rows and there is no bias; else ``None``."""
        rows = x.reshape(-1, self.in_features)
        if not (self.column_outputs and self.bias is None and x.dtype == torch.bfloat16
                and rows.shape[0] >= self.dense_rows):
            return None
        y = self.kernels.column_dense_silu_and_mul(rows, self.levels, self.scales,
                                                   self.zeros, self.group_size,
                                                   self.column_outputs, self.amx_min_rows)
        return y.view(*x.shape[:-1], self.out_features // 2)

    def product(self, rows: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """``rows @ W.T`` (no bias), by the kernel or, for many rows, densely. The column
        kernel rounds its float32 sums to ``out_dtype`` bfloat16 as it stores them (as
        ``.to`` would, without another pass); otherwise the result's dtype is the path's."""
        if self.column_outputs:
            rows = rows.to(torch.bfloat16).contiguous()
            if rows.shape[0] < self.dense_rows:  # float32 sums
                out = out_dtype if out_dtype == torch.bfloat16 else None
                if rows.shape[0] <= self.int8_tile_rows:
                    return self.kernels.int8_tile_gemm(rows, self.levels, self.scales,
                                                       self.group_size, self.column_outputs, out)
                return self.kernels.column_gemm(rows, self.levels, self.scales, self.offsets,
                                                self.group_size, self.column_outputs,
                                                self.amx_min_rows, out)
            return self.kernels.column_dense(rows, self.levels, self.scales, self.zeros,
                                             self.group_size, self.column_outputs,
                                             self.amx_min_rows)  # bfloat16
        if self.row_dense and rows.shape[0] >= self.dense_rows:
            return self.kernels.row_layout_dense(rows, self.levels, self.scales, self.zeros,
                                                 self.group_size)  # bfloat16
        if self.kernels is None or rows.shape[0] >= self.dense_rows:
            weight = self.dequantized_weight().to(self.dense_dtype)
            return F.linear(rows.to(self.dense_dtype), weight)
        return self.quantized_product(rows.float().contiguous())
