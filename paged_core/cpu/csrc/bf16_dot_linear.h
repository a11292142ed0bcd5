// The bfloat16 linear of bf16_dot_linear.cpp (see there for the packed layout and the sum
// order), callable from the other C++ kernels of the avx2, avx512 and avx512_bf16 builds
// (PAGED_CORE_BF16_DOT: AVX2 and FMA; PAGED_CORE_BF16_DOT_ZMM: 16-lane tiles, AVX-512F, BW
// and VL; the AMX parts need the avx512_bf16 build).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define PAGED_CORE_BF16_DOT_ZMM 1
#else
#define PAGED_CORE_BF16_DOT_ZMM 0
#endif
#if PAGED_CORE_BF16_DOT_ZMM || (defined(__AVX2__) && defined(__FMA__))
#define PAGED_CORE_BF16_DOT 1
#else
#define PAGED_CORE_BF16_DOT 0
#endif

namespace paged_core_cpu {

#if PAGED_CORE_BF16_DOT
// weight [N, K] bfloat16 (K even) -> its packed form [ceil(N / 32), K / 2, 32, 2].
at::Tensor pack_bf16_dot_weight(const at::Tensor& weight);
// x [..., K] bfloat16 -> x W^T + bias [..., out_features] bfloat16; calls of at least
// amx_min_rows rows (0: none) run on AMX tiles where bf16_amx_ready() and K % 32 == 0.
at::Tensor bf16_dot_linear(const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
                           const std::optional<at::Tensor>& bias, int64_t amx_min_rows);
// silu_and_mul (fused_ops.h) of bf16_dot_linear(x, packed, out_features = 2 I, bias,
// amx_min_rows) [..., I], bit for bit, without the [..., 2 I] product in between: each
// row tile's gate and up sums go through SiLU-and-mul in registers, on AMX tiles where the
// linear would take them (unless I % 32 != 0: then the two ops run one after the other).
at::Tensor bf16_dot_silu_and_mul(const at::Tensor& x, const at::Tensor& packed,
                                 int64_t out_features, const std::optional<at::Tensor>& bias,
                                 int64_t amx_min_rows);

#if defined(__AVX512BF16__)
// True if this CPU has AMX-BF16, this build has the AMX code and the OS granted the tile
// state (asked once per process; bf16_amx_linear.cpp).
bool bf16_amx_ready();
// True if bf16_amx_ready() and this CPU has AMX-INT8 too (quantized_int8_tiles.cpp).
bool amx_int8_ready();
// Whether a call of M rows over K2 k pairs takes the AMX tiles: amx_min_rows rows or more
// (0: never), whole 32-k tile steps, AMX granted.
inline bool bf16_amx_takes(int64_t M, int64_t K2, int64_t amx_min_rows) {
  return amx_min_rows > 0 && M >= amx_min_rows && K2 % 16 == 0 && bf16_amx_ready();
}
#endif
// The weights bf16_dot_rows and bf16_amx_groups multiply, in the packed layout: the whole
// packed weight, or (packed null) `widen(g0, g1, out)`, which writes column groups [g0, g1)
// into out (K2 * 64 values a group; e.g. quantized levels, dequantized a chunk at a time;
// it runs inside parallel regions and must not throw).
// source (or null): where widen(g, g + 1, ...) reads group g's bytes, source_group_bytes of
// them from source + g * source_group_bytes (a multiple of K2), for bf16_dot_rows to prefetch
// a thread's next group in shares over its current group's row tiles.
struct GroupWeights {
  const uint16_t* packed = nullptr;
  std::function<void(int64_t g0, int64_t g1, uint16_t* out)> widen;
  const char* source = nullptr;
  int64_t source_group_bytes = 0;
};
// Rows [0, M) of x (ldx elements apart) times the `groups` column groups of w (K2 k pairs) on
// vdpbf16ps (two float32 FMAs per pair without AVX512-BF16), plus bias (or null), into
// y [M, N] (N columns, N apart), groups claimed by threads as they go (the bits do not depend on which
// thread ran a group). Widened weights (w.widen) are widened one group at a time into a
// buffer of the thread's, right before that group's row tiles read it from L1/L2.
void bf16_dot_rows(const uint16_t* x, int64_t ldx, int64_t M, const GroupWeights& w, int64_t K2,
                   int64_t groups, const uint16_t* bias, uint16_t* y, int64_t N);
#if defined(__AVX512BF16__)
// Rows [0, rows) of x (ldx elements apart) times column groups [g_begin, g_end) of w (K2 k
// pairs) on AMX tiles, plus bias, into y (ldy apart, N columns); K2 % 16 == 0.
void bf16_amx_groups(const uint16_t* x, int64_t ldx, int64_t rows, const GroupWeights& w, int64_t K2,
                     int64_t g_begin, int64_t g_end, const uint16_t* bias, uint16_t* y,
                     int64_t ldy, int64_t N);
// Units [u_begin, u_end) of gate_up's weights w ([gate | up], I % 32 == 0 outputs each;
// unit u: gate group u and up group u + I / 32) times rows [0, rows) of x on AMX tiles:
// y [rows, I] columns [32 u_begin, 32 u_end) get silu_and_mul's bits of those outputs, as
// bf16_amx_groups would give them (bias [2 I] or null); K2 % 16 == 0.
void bf16_amx_silu_and_mul(const uint16_t* x, int64_t ldx, int64_t rows, const GroupWeights& w,
                           int64_t K2, int64_t I, int64_t u_begin, int64_t u_end,
                           const uint16_t* bias, uint16_t* y);
#endif  // __AVX512BF16__
// Rows [0, M) of x (ldx elements apart) times gate_up's weights w ([gate | up], I outputs
// each, I % 32 == 0): y [M, I] (I apart) gets silu_and_mul's bits (fused_ops.h) of the
// bfloat16 products plus bias ([2 I] or null), without the [M, 2 I] product in between;
// on AMX tiles with `amx` (the avx512_bf16 build, bf16_amx_ready(), K2 % 16 == 0), else on
// vdpbf16ps (bf16_dot_rows' tiles).
void bf16_silu_and_mul_groups(const uint16_t* x, int64_t ldx, int64_t M, const GroupWeights& w,
                              int64_t K2, int64_t I, const uint16_t* bias, uint16_t* y, bool amx);
#endif  // PAGED_CORE_BF16_DOT

}  // namespace paged_core_cpu
