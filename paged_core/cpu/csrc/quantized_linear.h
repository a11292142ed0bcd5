// The weight-only quantized products of quantized_linear.cpp (see there for the layouts
// and the sum order), callable from the other C++ kernels of the same build.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "bf16_dot_linear.h"

namespace paged_core_cpu {

// Each row's sums of x (float32 [M, K]) over each group of G features, each summed k ascending
// (so a row's sums do not depend on M): [M][K / G], what the offsets multiply (y takes
// offset * sum(x_g) per group).
std::vector<float> group_sums_of(const float* x, int64_t M, int64_t K, int64_t G);

// x float32 [M, K] contiguous -> x W^T, float32 [M, N], W 4-bit (offsets = zero - 8 scale).
at::Tensor int4_gemm(const at::Tensor& x, const at::Tensor& levels, const at::Tensor& scales,
                     const at::Tensor& offsets, int64_t group_size);
// The same for W 8-bit (offsets: the zeros of W = level * scale + zero, where W has them).
at::Tensor int8_gemm(const at::Tensor& x, const at::Tensor& levels, const at::Tensor& scales,
                     const std::optional<at::Tensor>& offsets, int64_t group_size);
// W itself, float32 [N, K].
at::Tensor int4_dequantize(const at::Tensor& levels, const at::Tensor& scales,
                           const at::Tensor& zeros, int64_t group_size);
at::Tensor int8_dequantize(const at::Tensor& levels, const at::Tensor& scales,
                           const std::optional<at::Tensor>& zeros, int64_t group_size);
// Each takes its levels in the row layout (8-bit [N, K], 4-bit [N, K / 2]; scales, zeros
// [N, K / group_size]) or, in builds with PAGED_CORE_BF16_DOT, in column groups: column_groups'
// [N / 32, K, 32] int8 or int4_columns' [N / 32, K, 16] uint8 (scales, zeros, offsets [N / 32,
// K / group_size, 32]), whose products are quantized_fma_columns.cpp's (row_layout_dense takes
// those levels too: fma_columns_dense). fma_columns_gemm takes the offsets (8-bit: the zeros),
// the other two the zeros:
at::Tensor fma_columns_gemm(const at::Tensor& x, const at::Tensor& levels, const at::Tensor& scales,
                            const std::optional<at::Tensor>& offsets, int64_t group_size);
at::Tensor fma_columns_dense(const at::Tensor& x, const at::Tensor& levels, const at::Tensor& scales,
                             const std::optional<at::Tensor>& zeros, int64_t group_size);
at::Tensor fma_columns_dequantize(const at::Tensor& levels, const at::Tensor& scales,
                                  const std::optional<at::Tensor>& zeros, int64_t group_size);

// token_levels.cpp: each row of x ([M, K]; bfloat16 read as it is, any other dtype as float32)
// as int8 levels
// round(x / scale) (half to even, within -128..127) and its scale absmax / 127 (1 for a row of
// zeros): the same bits as quantization/w8a8_linear.py's torch formula (per_token_levels).
struct TokenLevels {
  at::Tensor levels;      // int8 [M, K]; biased: uint8 level + 128 [M, biased_width]
  at::Tensor scales;      // float32 [M, 1]
  at::Tensor group_sums;  // float32 [M, K / group_size]: each group's sum of levels, where asked
};
// biased_width > 0: the levels as unsigned bytes level + 128 in rows of biased_width >= K (128
// past K: a level 0), vnni_columns' rows. group_size > 0 (a multiple of 16 dividing K): the
// group sums too.
TokenLevels token_levels(const at::Tensor& x, int64_t biased_width = 0, int64_t group_size = 0);

// W8A8 (quantization/w8a8_linear.py): rows [M, K] (float32 or bfloat16) quantized per row to
// int8 levels (scale absmax / 127), times int8 weight levels with one scale per channel
// (scales, N floats). With vnni_sums (levels and vnni_sums: w8a8_vnni_pack's, on a CPU with
// AVX512-VNNI) every call takes exact integer sums on vnni_columns (on AMX-INT8 tiles,
// vnni_tiles, from amx_min_rows rows; 0: never); else levels [N, K] and integer sums
// (at::_int_mm) from int8_sums_from_rows rows (0: never), below that the levels as float32
// through int8_gemm (from dense_rows rows, the dequantized weight in dense_dtype). Sums times
// the channel's scale, then the row's: float32 [M, N]; with out_dtype bfloat16 the vnni
// layout's kernels round each as they store it (the float32 result's .to(bfloat16)), the
// others return float32.
at::Tensor w8a8_product(const at::Tensor& rows, const at::Tensor& levels, const at::Tensor& scales,
                        const std::optional<at::Tensor>& vnni_sums, int64_t int8_sums_from_rows,
                        int64_t dense_rows, at::ScalarType dense_dtype, int64_t amx_min_rows = 0,
                        std::optional<at::ScalarType> out_dtype = std::nullopt);
// Whether this build and CPU run vnni_columns (AVX-512 builds on CPUs with AVX512-VNNI).
bool int8_vnni_ready();
// int8 levels [N, K] as vnni_columns takes them: [ceil(N/16), ceil(K/4), 16, 4] int8 (zeros
// past N and K), and 128 * each row's sum of levels, int32 [ceil(N/16) * 16].
std::vector<at::Tensor> w8a8_vnni_pack(const at::Tensor& levels);

// quantized_w4a8.cpp, W4A8 (quantization/w4a8_linear.py): 4-bit levels q [N, K] (0..15),
// with float32 scales and offsets [N, K / group_size] (W = scale * q + offset), as
// w4a8_product takes them: {levels uint8 [ceil(N/32), K/4, 64], factors float32
// [ceil(N/32), K/group_size, F, 32]}: scales and offsets (F = 2), or the scales alone (F = 1)
// where every offset is -8 scale (a symmetric weight) (the layout: quantized_w4a8.cpp;
// w4a8_product also takes the factors as float16).
std::vector<at::Tensor> w4a8_pack(const at::Tensor& q, const at::Tensor& scales,
                                  const at::Tensor& offsets, int64_t group_size);
// rows [M, K] (float32 or bfloat16) quantized per row (token_levels), times w4a8_pack's levels
// on vpdpbusd (exact int32 sums per group), or, from amx_min_rows rows (0: never), on AMX-INT8
// tiles (w4a8_tiles: the same bits), scaled: [M, out_features] in out_dtype (float32 by
// default; bfloat16: each value rounded as at::Tensor::to rounds it, while it is stored). Only
// where int8_vnni_ready(); the tiles only where amx_int8_ready() and group_size % 64 == 0.
at::Tensor w4a8_product(const at::Tensor& rows, const at::Tensor& levels, const at::Tensor& factors,
                        int64_t group_size, int64_t out_features,
                        std::optional<at::ScalarType> out_dtype = std::nullopt,
                        int64_t amx_min_rows = 0);

#if PAGED_CORE_BF16_DOT
// quantized_row_dense.cpp: x [M, K] -> x W^T bfloat16 for many rows, the row layout's levels
// (zeros: 4-bit, and 8-bit ones that have them) widened a column group at a time into
// bf16_dot_linear's layout (the avx2, avx512 and avx512_bf16 builds).
at::Tensor row_layout_dense(const at::Tensor& x, const at::Tensor& levels, const at::Tensor& scales,
                            const std::optional<at::Tensor>& zeros, int64_t group_size);
#endif

#if defined(__AVX512BF16__)
// quantized_column_linear.cpp: levels in column groups of 32 outputs (column_pack), bfloat16
// rows; 4-bit levels take offsets (products) and zeros (dense, dequantize); 8-bit ones, and
// int8 levels packed narrower by `packing`: "int7" (within -64..63), "int5" (within -16..15
// or 0..31; both where the weight has zeros, then the same tensor, or neither) or "iq4" (all
// IQ4_NL values, as their 4-bit indices; scales only); "": by q's dtype.
std::vector<at::Tensor> column_pack(const at::Tensor& q, const std::vector<at::Tensor>& per_group,
                                    c10::string_view packing = "");
// x [M, K] -> x W^T (the float32 sums of column_layout), in out_dtype (float32 by default;
// bfloat16: each sum rounded as at::Tensor::to rounds it, while it is stored): AMX tiles from
// amx_min_rows rows (0: never; group_size % 32 == 0 and bf16_amx_ready() only), else vdpbf16ps.
at::Tensor column_gemm(const at::Tensor& x, const at::Tensor& levels, const at::Tensor& scales,
                       const std::optional<at::Tensor>& offsets, int64_t group_size,
                       int64_t out_features, int64_t amx_min_rows,
                       std::optional<at::ScalarType> out_dtype = std::nullopt);
// quantized_int8_tiles.cpp: 8-bit column-layout levels times bfloat16 rows x [M, K] on
// AMX-INT8 tiles (each row cut into three 8-bit digits), in out_dtype as column_gemm; only
// where amx_int8_ready(), group_size a multiple of 64 (at most 65536 or a multiple of it).
at::Tensor int8_tile_gemm(const at::Tensor& x, const at::Tensor& levels, const at::Tensor& scales,
                          int64_t group_size, int64_t out_features,
                          std::optional<at::ScalarType> out_dtype = std::nullopt);
// quantized_vnni_tiles.cpp: vnni_columns' product on AMX-INT8 tiles, the same bits: biased rows
// xu [M, Kp] (token_levels' biased levels), w8a8_vnni_pack's levels and biased sums, channel
// scales [N], token scales [M, 1] -> [M, N] float32 or (bf16_out) bfloat16 as vnni_columns
// stores them; only where amx_int8_ready().
at::Tensor vnni_tiles(const at::Tensor& xu, const at::Tensor& packed, const at::Tensor& biased_sums,
                      const at::Tensor& channel_scales, const at::Tensor& token_scales,
                      bool bf16_out);
// quantized_w4a8_tiles.cpp: w4a8_product's sums on AMX-INT8 tiles, the same bits: rows as
// token_levels gives them with group sums, w4a8_pack's levels and factors -> y (scaled_rows'
// [M, out_features]); only where amx_int8_ready(), group_size a multiple of 64.
void w4a8_tiles(const TokenLevels& rows, const at::Tensor& levels, const at::Tensor& factors,
                int64_t group_size, int64_t out_features, const at::Tensor& y);
// x [M, K] -> x W^T bfloat16 for many rows: W widened into bf16_dot_linear's layout, then
// its GEMM (on AMX tiles from amx_min_rows rows, widened a chunk of column groups at a time).
at::Tensor column_dense(const at::Tensor& x, const at::Tensor& levels, const at::Tensor& scales,
                        const std::optional<at::Tensor>& zeros, int64_t group_size,
                        int64_t out_features, int64_t amx_min_rows);
// silu_and_mul (fused_ops.h) of column_dense's product for gate_up's levels ([gate | up],
// out_features = 2 I): [M, I] bfloat16, bit for bit, without the [M, 2 I] product in between
// where I % 32 == 0 (each unit's gate and up groups widened together; bf16_silu_and_mul_groups),
// else the two ops one after the other.
at::Tensor column_dense_silu_and_mul(const at::Tensor& x, const at::Tensor& levels,
                                     const at::Tensor& scales, const std::optional<at::Tensor>& zeros,
                                     int64_t group_size, int64_t out_features, int64_t amx_min_rows);
at::Tensor column_dequantize(const at::Tensor& levels, const at::Tensor& scales,
                             const std::optional<at::Tensor>& zeros, int64_t group_size,
                             int64_t out_features);
#endif

}  // namespace paged_core_cpu
