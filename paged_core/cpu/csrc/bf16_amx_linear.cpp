// The calls of bf16_dot_linear that run on AMX tiles (CPUs with AMX-BF16: Sapphire
// Rapids and later), over the same packed weights:
//   packed[g, k / 2, c, k % 2] = W[32 g + c, k]
// is, for a column group g, a [K / 2][32 columns][2] array of k pairs: 16 consecutive pairs
// of 16 consecutive columns are exactly an AMX B tile (16 rows of 64 bytes, 128 bytes
// apart), so the weights need no second copy or layout.
//
// A unit of work is 32 rows x one group (32 columns): four float32 C tiles (rows 0-15 /
// 16-31 x columns 0-15 / 16-31), two A tiles (the rows' next 32 k), two B tiles (the
// group's next 16 k pairs); per 32 k, four tdpbf16ps. A call's last block holds only its
// own rows (tiles configured for them, so no tile reads past x: two tdpbf16ps on one A tile
// up to 16 rows). A thread's groups go in chunks whose weights fit L2 (groups_in_l2), every
// row tile of the call passing each chunk: weights are
// read from memory once per call and each row tile's A is reused across the chunk (row
// blocks re-reading every weight per block ran at half this speed at 2048 rows, on two
// threads with distinct weights per layer). tdpbf16ps sums each k pair differently from
// vdpbf16ps (measured: the last bits differ), so a row's bits depend on whether its call
// took AMX (bf16_dot_linear's amx_min_rows); within AMX calls they do not depend on the
// other rows.
//
// gate_up's SiLU-and-mul (bf16_amx_silu_and_mul) runs units of two groups, gate group u and
// up group u + I / 32, and stores silu_and_mul's bits of the pair's sums (silu_mul_bits, as
// the vdpbf16ps fused op does), so the [rows, 2 I] product never reaches memory.
//
// The weights may also come a chunk at a time from a widening function (GroupWeights.widen:
// the quantized column layout's dense path, gate_up's SiLU-and-mul too), written into a
// per-thread buffer that the chunk's row tiles then read from L2.
//
// Linux hands out AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM, once per
// process): bf16_amx_ready() asks once and says whether it was granted.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "amx_tiles.h"
#include "bf16_dot_linear.h"
#include "bf16_linear_epilogue.h"

#if defined(__AVX512BF16__)
#if defined(PAGED_CORE_AMX_BUILT)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace paged_core_cpu {

#if defined(PAGED_CORE_AMX_BUILT)
namespace {

constexpr int kArchReqXcompPerm = 0x1023;  // arch_prctl: request an extended state feature
constexpr int kXfeatureXtiledata = 18;     // the AMX tile data state

// ldtilecfg's 64-byte operand (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// C tiles 0-3 = rows [x, x + rows) of x (ldx elements apart; rows <= 32, tiles configured by
// configure_row_block_tiles(rows): C tiles 2-3 and A tile 5 only past 16 rows) times group
// w's 32 columns, over K = 32 * kt_count; stored to c [rows][32] float32. A tile holds only
// the block's rows, so a decode step of 8-16 rows pays 2 tdpbf16ps of its own rows per 32 k,
// not 4 of 32, and every output is the same sum whatever the block's other rows.
// `prefetch`, if set, is the next group's weights, fetched into L2 as these are read
// (weights stream from memory during a group's first row tile; into L2 rather than L1 took
// 30 layers of 8-128 rows 5-15% faster, in one process alternating both, on a 2-core Xeon
// with AMX). The B lines of the step kAhead on are prefetched into L1: a tileloadd that meets
// L2 stalls the tiles (measured on one core, 32x32 units over 2048 rows: 570-610 GFLOP/s
// without, 770-870 with). So are x's where `fetch_x` says so: in a row block's first product
// of a chunk. The chunk's later groups find those lines in L1 or L2, and fetching them again
// only took load slots from the tile loads (one process alternating both, SmolLM2's q, o,
// gate_up and down at 64-2048 rows: 1.05-1.2x the GFLOP/s without; Intel(R) Xeon(R)
// Processor, amx_bf16, 1 and 2 threads).
// `between(kt, kt_count)` runs before each k step's tile loads: the previous unit's epilogue
// a slice at a time (PendingEpilogue), its vector work issued while the tiles multiply.
template <typename Between>
__attribute__((target("amx-tile,amx-bf16"))) inline void tile_product(
    const uint16_t* x, int64_t ldx, int64_t rows, const uint16_t* w, int64_t kt_count,
    const char* prefetch, float* c, bool fetch_x, const Between& between) {
  constexpr int64_t kGroupRowBytes = 32 * 2 * sizeof(uint16_t);  // one k pair of 32 columns
  constexpr int64_t kAhead = 2;  // k steps between a prefetch and the tile load it serves
  const int64_t x_stride = ldx * static_cast<int64_t>(sizeof(uint16_t));
  const uint16_t* x_lower = x + 16 * ldx;
  const bool lower = rows > 16;
  zero_row_block_sums(lower);
  for (int64_t kt = 0; kt < kt_count; ++kt) {
    const uint16_t* b = w + kt * 16 * 64;  // 16 k pairs x 32 columns x 2
    if (prefetch != nullptr)
      for (int line = 0; line < 32; ++line)
        _mm_prefetch(prefetch + (kt * 32 + line) * 64, _MM_HINT_T1);
    if (kt + kAhead < kt_count) {  // the lines of the tiles kAhead steps on, into L1
      const char* b_ahead = reinterpret_cast<const char*>(b + kAhead * 16 * 64);
      for (int line = 0; line < 32; ++line) _mm_prefetch(b_ahead + line * 64, _MM_HINT_T0);
      if (fetch_x)
        for (int64_t row = 0; row < rows; ++row)
          _mm_prefetch(reinterpret_cast<const char*>(x + row * ldx + (kt + kAhead) * 32),
                       _MM_HINT_T0);
    }
    between(kt, kt_count);
    _tile_loadd(4, x + kt * 32, x_stride);
    _tile_loadd(6, b, kGroupRowBytes);
    _tile_loadd(7, b + 32, kGroupRowBytes);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (lower) {
      _tile_loadd(5, x_lower + kt * 32, x_stride);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  constexpr int64_t kRowBytes = 32 * sizeof(float);
  _tile_stored(0, c, kRowBytes);
  _tile_stored(1, c + 16, kRowBytes);
  if (lower) {
    _tile_stored(2, c + 16 * 32, kRowBytes);
    _tile_stored(3, c + 16 * 32 + 16, kRowBytes);
  }
}

// Column groups per chunk: a chunk's weights (K2 * 128 bytes a group) stay in L2 while
// every row tile passes by, each row tile's A reused across the chunk from L1.
int64_t groups_in_l2(int64_t K2) {
  constexpr int64_t kChunkBytes = 512 * 1024;
  return std::max<int64_t>(1, kChunkBytes / (K2 * 128));
}

// CPUID leaf 7's EDX (0 where the leaf is missing): bit 22 AMX-BF16, 24 AMX-TILE, 25 AMX-INT8.
unsigned leaf7_edx() {
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) ? edx : 0u;
}

bool cpu_has_amx_bf16() {
  const unsigned edx = leaf7_edx();
  return (edx >> 22 & 1u) && (edx >> 24 & 1u);
}

bool cpu_has_amx_int8() { return leaf7_edx() >> 25 & 1u; }

bool request_tile_state() {
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

}  // namespace

// The configuration lives in thread storage, not on the stack: GCC's ldtilecfg asm names
// only the first 8 bytes as its input, so the stores of a local configuration could be dropped.
__attribute__((target("amx-tile"))) void configure_amx_tiles(const uint8_t (&rows)[8],
                                                             const uint8_t (&bytes)[8]) {
  thread_local TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = rows[t];
    config.colsb[t] = rows[t] > 0 ? bytes[t] : 0;
  }
  asm volatile("" : : "r"(&config) : "memory");  // the stores happen before ldtilecfg
  _tile_loadconfig(&config);
}

void configure_amx_tiles(const uint8_t (&rows)[8]) {
  static constexpr uint8_t kFullWidth[8] = {64, 64, 64, 64, 64, 64, 64, 64};
  configure_amx_tiles(rows, kFullWidth);
}

__attribute__((target("amx-tile"))) void release_amx_tiles() { _tile_release(); }

void configure_row_block_tiles(int64_t rows) {
  const auto upper = static_cast<uint8_t>(std::min<int64_t>(rows, 16));
  const auto lower = static_cast<uint8_t>(std::max<int64_t>(0, rows - 16));
  const uint8_t tile_rows[8] = {upper, upper, lower, lower, upper, lower, 16, 16};
  configure_amx_tiles(tile_rows);
}

__attribute__((target("amx-tile"))) void zero_row_block_sums(bool lower) {
  _tile_zero(0);
  _tile_zero(1);
  if (lower) {
    _tile_zero(2);
    _tile_zero(3);
  }
}

bool bf16_amx_ready() {
  static const bool ready = cpu_has_amx_bf16() && request_tile_state();
  return ready;
}

bool amx_int8_ready() {
  static const bool ready = cpu_has_amx_int8() && bf16_amx_ready();
  return ready;
}

namespace {

// The float32 sums of one unit (G groups x 32 columns, up to 32 rows) waiting for the
// epilogue that rounds and stores them (Store: store(c, m, u, r0, r1) for rows
// [m + r0, m + r1) of the unit's row block). A unit's tiles go to one of two buffers; its
// epilogue runs during
// the next unit's products, a slice of rows before each k step (run_slice), so its loads,
// conversions and stores issue while the tiles multiply instead of after the tiles drain
// (SmolLM2's q/k/v, o, gate_up and down at 256-2048 rows: 1.08-1.10x the product's rate,
// one process alternating both, Intel(R) Xeon(R) Processor, amx_bf16, 2 threads). An output
// is the same bits whenever its epilogue runs.
// Row blocks of fewer rows (decode-sized calls, which stream their weights) have each unit's
// epilogue run as it is handed over: interleaving cost one sequence's decode steps ~3%.
constexpr int64_t kInterleavedRows = 16;

template <int G, typename Store>
class PendingEpilogue {
 public:
  explicit PendingEpilogue(const Store& store) : store_(store) {}

  // The buffer the next unit's tiles are stored to.
  float (&next_sums())[G][32 * 32] { return sums_[next_]; }

  // The unit just stored to next_sums() (rows [m, m + block), unit u) is now the pending one,
  // after the one before is finished; a block under kInterleavedRows rows is finished at once.
  void hand_over(int64_t block, int64_t m, int64_t u) {
    finish();
    block_ = block, m_ = m, u_ = u;
    next_ ^= 1;
    if (block < kInterleavedRows) finish();
  }

  // The pending unit's rows for k step `step` of `steps`: all of them by the last step.
  void run_slice(int64_t step, int64_t steps) {
    if (u_ < 0) return;
    const int64_t r0 = block_ * step / steps, r1 = block_ * (step + 1) / steps;
    if (r1 > r0) store_(sums_[next_ ^ 1], m_, u_, r0, r1);
    if (step + 1 == steps) u_ = -1;
  }

  // Whatever is left of the pending unit's epilogue, now.
  void finish() {
    if (u_ >= 0) store_(sums_[next_ ^ 1], m_, u_, 0, block_);
    u_ = -1;
  }

 private:
  const Store& store_;
  alignas(64) float sums_[2][G][32 * 32];
  int next_ = 0;
  int64_t block_ = 0, m_ = 0, u_ = -1;  // the pending unit (u_ < 0: none)
};

// Units [u_begin, u_end) of G column groups each (groups u + i * group_offset, i < G) times
// rows [0, rows) of x on AMX tiles: every unit's float32 sums, c[i] [block][32] for its group
// i, go to store(c, m, u, r0, r1), in slices of rows [r0, r1) that cover the row block
// [m, m + block) (PendingEpilogue). Units go in chunks whose weights fit L2, every row block
// passing each chunk; widened weights are widened a chunk at a time, part i of the chunk's
// units (their groups u + i * group_offset) after part i - 1 in the buffer.
template <int G, typename Store>
void amx_units(const uint16_t* x, int64_t ldx, int64_t rows, const GroupWeights& w, int64_t K2,
               int64_t group_offset, int64_t u_begin, int64_t u_end, const Store& store) {
  const int64_t K = 2 * K2, group_values = K2 * 64;
  // Widened weights: a chunk at a time, written where the chunk's row tiles read it (L2).
  thread_local std::vector<uint16_t> widened;
  PendingEpilogue<G, Store> epilogue(store);
  const auto between = [&](int64_t step, int64_t steps) { epilogue.run_slice(step, steps); };
  int64_t configured = 0;  // the rows the tiles are configured for (0: not yet)
  const int64_t chunk = std::max<int64_t>(1, groups_in_l2(K2) / G);
  for (int64_t u0 = u_begin; u0 < u_end; u0 += chunk) {
    const int64_t u1 = std::min(u_end, u0 + chunk);
    // group(u, i): (u - first) + i * part_offset groups in
    const uint16_t* weights = w.packed;
    int64_t first = 0, part_offset = group_offset;
    if (w.packed == nullptr) {
      widened.resize(std::max<size_t>(widened.size(), G * (u1 - u0) * group_values));
      for (int i = 0; i < G; ++i)
        w.widen(u0 + i * group_offset, u1 + i * group_offset,
                widened.data() + i * (u1 - u0) * group_values);
      weights = widened.data();
      first = u0;
      part_offset = u1 - u0;
    }
    // Units after this chunk's: in the packed weight only.
    const int64_t next_end = w.packed != nullptr ? u_end : u1;
    auto group = [&](int64_t u, int i) {
      return weights + ((u - first) + i * part_offset) * group_values;
    };
    for (int64_t m = 0; m < rows; m += 32) {
      const int64_t block = std::min<int64_t>(32, rows - m);
      if (block != configured) {  // a call's last block may be short: tiles of its rows only
        epilogue.finish();
        configure_row_block_tiles(block);
        configured = block;
      }
      for (int64_t u = u0; u < u1; ++u) {
        for (int i = 0; i < G; ++i) {
          // The first row tile streams the chunk's weights in, each group's while the one
          // before it runs.
          const uint16_t* next = m > 0 ? nullptr
                                 : i + 1 < G ? group(u, i + 1)
                                 : u + 1 < next_end ? group(u + 1, 0) : nullptr;
          tile_product(x + m * ldx, ldx, block, group(u, i), K / 32,
                       reinterpret_cast<const char*>(next), epilogue.next_sums()[i],
                       /*fetch_x=*/u == u0 && i == 0, between);
        }
        epilogue.hand_over(block, m, u);
      }
    }
  }
  epilogue.finish();
  release_amx_tiles();
}

}  // namespace

void bf16_amx_groups(const uint16_t* x, int64_t ldx, int64_t rows, const GroupWeights& w, int64_t K2,
                     int64_t g_begin, int64_t g_end, const uint16_t* bias, uint16_t* y,
                     int64_t ldy, int64_t N) {
  amx_units<1>(x, ldx, rows, w, K2, 0, g_begin, g_end,
               [&](const float (&c)[1][32 * 32], int64_t m, int64_t g, int64_t r0,
                   int64_t r1) {
                 for (int half = 0; half < 2; ++half)
                   store_bf16_rows(c[0] + r0 * 32 + 16 * half, 32, r1 - r0, bias,
                                   y + (m + r0) * ldy, ldy, g * 32 + 16 * half, N);
               });
}

void bf16_amx_silu_and_mul(const uint16_t* x, int64_t ldx, int64_t rows, const GroupWeights& w,
                           int64_t K2, int64_t I, int64_t u_begin, int64_t u_end,
                           const uint16_t* bias, uint16_t* y) {
  const __mmask16 all = 0xFFFF;
  amx_units<2>(x, ldx, rows, w, K2, I / 32, u_begin, u_end,
               [&](const float (&c)[2][32 * 32], int64_t m, int64_t u, int64_t r0,
                   int64_t r1) {
                 for (int half = 0; half < 2; ++half) {
                   const int64_t n = u * 32 + 16 * half;
                   const __m512 gate_bias = bias_block(bias, n, all);
                   const __m512 up_bias = bias_block(bias, I + n, all);
                   for (int64_t r = r0; r < r1; ++r)
                     _mm256_storeu_si256(
                         reinterpret_cast<__m256i*>(y + (m + r) * I + n),
                         silu_mul_bits(_mm512_loadu_ps(c[0] + r * 32 + 16 * half),
                                       _mm512_loadu_ps(c[1] + r * 32 + 16 * half), gate_bias,
                                       up_bias));
                 }
               });
}
#else
bool bf16_amx_ready() { return false; }
bool amx_int8_ready() { return false; }

void configure_amx_tiles(const uint8_t (&)[8]) { TORCH_CHECK(false, "this build has no AMX tiles"); }

void configure_amx_tiles(const uint8_t (&)[8], const uint8_t (&)[8]) {
  TORCH_CHECK(false, "this build has no AMX tiles");
}

void release_amx_tiles() {}

void configure_row_block_tiles(int64_t) { TORCH_CHECK(false, "this build has no AMX tiles"); }

void zero_row_block_sums(bool) { TORCH_CHECK(false, "this build has no AMX tiles"); }

void bf16_amx_groups(const uint16_t*, int64_t, int64_t, const GroupWeights&, int64_t, int64_t,
                     int64_t, const uint16_t*, uint16_t*, int64_t, int64_t) {
  TORCH_CHECK(false, "this build has no AMX tiles");
}

void bf16_amx_silu_and_mul(const uint16_t*, int64_t, int64_t, const GroupWeights&, int64_t,
                           int64_t, int64_t, int64_t, const uint16_t*, uint16_t*) {
  TORCH_CHECK(false, "this build has no AMX tiles");
}
#endif

}  // namespace paged_core_cpu

#endif  // __AVX512BF16__
