// Every decoder layer of a Llama-family model in one C++ call, per step.
//
// A one-sequence decode step runs ~400 small tensor ops (30 layers x projections, norms,
// rotary, KV write, attention); from Python each costs microseconds of interpreter and
// dispatch work, a third of such a step on a 2-core machine. DecoderStack holds the
// layers' weights and runs the same ops in the same order from C++:
//
//   hidden = rms_norm(residual, input_norm[0])
//   per layer i:
//     q, k, v = split(qkv(hidden));  q, k = q_norm(q), k_norm(k) (if any);  rotate(q, k)
//     write k, v of the real tokens to their slots (quantized rows for an int8 / fp8
//     cache: write_slots, also the op write_kv_slots);  a = paged_attention(q, caches)
//     residual += o(a);  normed = rms_norm(residual, post_norm[i])
//     residual += down(silu(gate) * up of gate_up(normed))  (in gate_up's epilogue where
//                                                          bf16_dot_silu_and_mul can)
//     hidden = rms_norm(residual, input_norm[i + 1] or the final norm)
//   return hidden
//
// With LoRA adapters (set_lora: the slot tables of lora/layers.py's LoRALinear, shared, not
// copied), every projection adds each row's adapter product with the very call
// LoRALinear.forward makes on a CPU (lora_products.cpp's lora_apply).
//
// Each step is the very kernel the Python path (models/llama.py with the fused CPU ops,
// the torch attention backend and cpu_linear's PackedLinear, Bf16DotLinear or F.linear)
// calls, so both give bit-identical results. Projections are a oneDNN-packed weight (mkldnn layout:
// computed in the weight's dtype, the result cast back), a bf16_dot_linear weight
// (avx512 and avx512_bf16 builds), a plain one (at::linear) or weight-only 4- or 8-bit levels
// (set_quantized: quantization/quantized_linear.py's QuantizedLinear, same kernels).
// Registered as torch.classes.paged_core_cpu_<level>.DecoderStack.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bf16_dot_linear.h"
#include "cpu_common.h"
#include "fused_ops.h"
#include "kv_quant.h"
#include "lora_products.h"
#include "quantized_linear.h"

// The class lives in the build's own namespace: builds of several levels share a process,
// and torch tells custom classes apart by their C++ type.
namespace PAGED_CORE_OPS {

namespace {

#define PAGED_CORE_STR_IN(x) #x
#define PAGED_CORE_STR(x) PAGED_CORE_STR_IN(x)

// One projection's adapter slots: a [slots, width, in], b_t [slots, width, out] (LoRALinear's
// tensors); width[slot] is how many columns the slot's adapter uses (0: none); part_starts
// the output column boundaries of the projection's parts (lora_products.cpp).
struct LoRASlots {
  at::Tensor a, b_t;
  std::vector<int64_t> width, part_starts;
};

// A projection's weight-only 4- or 8-bit levels (quantization/int4_linear.py's Int4Linear or
// int8_linear.py's Int8Linear, tensors shared): product() is their product().
struct QuantizedWeight {
  int64_t bits;  // 4 or 8
  at::Tensor levels, scales;
  at::Tensor offsets, zeros;  // per group, as the layout's kernels take them (4-bit; 8-bit
                              // where the weight has zeros): Int4Linear's / Int8Linear's
  int64_t group_size;
  int64_t dense_rows;          // calls of this many rows take one dense GEMM
  at::ScalarType dense_dtype;  // what that GEMM multiplies in
  int64_t column_outputs;      // > 0: levels in column_pack's layout, of this many outputs
  int64_t amx_min_rows;        // the column layout (and W8A8's, W4A8's int8 ones): AMX tiles from
                               // this many rows
  int64_t int8_tile_rows;      // 8-bit column layout: calls of up to this many rows on AMX-INT8
  bool row_dense;              // the row layout's many rows: row_layout_dense (bfloat16)
  int64_t int8_sums_from_rows;  // >= 0: the rows quantized per token first (W8A8, or W4A8 where
                                // bits is 4), integer sums from this many rows (0: never); -1:
                                // weight-only levels
  at::Tensor w8a8_vnni_sums;  // W8A8 with levels in w8a8_vnni_pack's layout: its biased sums
  int64_t w4a8_outputs;       // > 0: W4A8 levels and factors (scales) in w4a8_pack's layout

  // silu_and_mul of a gate_up's product(rows) (bfloat16 rows, no bias), in the dense path's
  // epilogue where the column layout takes that path: the same bits (column_dense_silu_and_mul);
  // nullopt where it does not.
  std::optional<at::Tensor> dense_silu_and_mul(const at::Tensor& rows) const {
#if defined(__AVX512BF16__)
    if (column_outputs > 0 && rows.size(0) >= dense_rows && rows.scalar_type() == at::kBFloat16)
      return paged_core_cpu::column_dense_silu_and_mul(
          rows, levels, scales, given(zeros), group_size, column_outputs, amx_min_rows);
#endif
    (void)rows;
    return std::nullopt;
  }

  // rows [M, in] -> rows W^T: float32 (the kernels, and W8A8's product; the column kernel
  // rounds to bfloat16 as it stores where out is bfloat16), or dense_dtype / bfloat16 (many
  // rows; row_dense).
  at::Tensor product(const at::Tensor& rows, at::ScalarType out) const {
    if (int8_sums_from_rows >= 0 && bits == 8)
      return paged_core_cpu::w8a8_product(  // rounded to bfloat16 as it is stored, where out is
          rows, levels, scales, given(w8a8_vnni_sums), int8_sums_from_rows, dense_rows,
          dense_dtype, amx_min_rows,
          out == at::kBFloat16 ? std::optional<at::ScalarType>(out) : std::nullopt);
    if (w4a8_outputs > 0)  // rounded to bfloat16 as it is stored, where out is
      return paged_core_cpu::w4a8_product(
          rows, levels, scales, group_size, w4a8_outputs,
          out == at::kBFloat16 ? std::optional<at::ScalarType>(out) : std::nullopt, amx_min_rows);
    if (int8_sums_from_rows >= 0) {  // W4A8Linear's float32 path: the levels as float32 rows
      const paged_core_cpu::TokenLevels token = paged_core_cpu::token_levels(rows);
      return weight_only_product(token.levels.to(at::kFloat), at::kFloat)
          .to(at::kFloat)
          .mul_(token.scales);
    }
    return weight_only_product(rows, out);
  }

 private:
  static std::optional<at::Tensor> given(const at::Tensor& t) {
    return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
  }

  at::Tensor weight_only_product(const at::Tensor& rows, at::ScalarType out) const {
    if (column_outputs > 0) return column_product(rows.to(at::kBFloat16).contiguous(), out);
    if (rows.size(0) >= dense_rows) {
#if PAGED_CORE_BF16_DOT
      if (row_dense)
        return paged_core_cpu::row_layout_dense(
            rows, levels, scales, given(zeros), group_size);
#endif
      const at::Tensor w = bits == 4
          ? paged_core_cpu::int4_dequantize(levels, scales, zeros, group_size)
          : paged_core_cpu::int8_dequantize(levels, scales, given(zeros), group_size);
      return at::linear(rows.to(dense_dtype), w.to(dense_dtype));
    }
    const at::Tensor x = rows.to(at::kFloat).contiguous();
    return bits == 4 ? paged_core_cpu::int4_gemm(x, levels, scales, offsets, group_size)
                     : paged_core_cpu::int8_gemm(x, levels, scales, given(offsets), group_size);
  }

  at::Tensor column_product(const at::Tensor& x, at::ScalarType out) const {
#if defined(__AVX512BF16__)
    const std::optional<at::ScalarType> rounded =
        out == at::kBFloat16 ? std::optional<at::ScalarType>(out) : std::nullopt;
    if (x.size(0) <= int8_tile_rows && x.size(0) < dense_rows)
      return paged_core_cpu::int8_tile_gemm(x, levels, scales, group_size, column_outputs, rounded);
    if (x.size(0) < dense_rows)
      return paged_core_cpu::column_gemm(
          x, levels, scales, given(offsets), group_size, column_outputs, amx_min_rows, rounded);
    return paged_core_cpu::column_dense(x, levels, scales, given(zeros), group_size, column_outputs,
                                        amx_min_rows);
#else
    TORCH_CHECK(false, "column layouts need the avx512_bf16 build");
    return x;
#endif
  }
};

struct Projection {
  at::Tensor weight;  // [out, in], oneDNN's packed layout of it, or pack_bf16_dot_weight's
  std::optional<at::Tensor> bias;
  int64_t bf16_dot_out_features;  // > 0: weight is pack_bf16_dot_weight's, of this many outputs
  int64_t amx_min_rows;           // bf16_dot_linear's: calls of this many rows take AMX (0: none)
  std::optional<LoRASlots> lora;
  std::optional<QuantizedWeight> quantized;  // set: weight is unused

  // The base product, plus each row's adapter product (LoRALinear.forward's ops);
  // lora_token_slots: each row's slot (-1: none), undefined when no row has an adapter.
  at::Tensor operator()(const at::Tensor& x, const at::Tensor& lora_token_slots) const {
    at::Tensor y = base(x);
    if (!lora || !lora_token_slots.defined()) return y;
    paged_core_cpu::lora_apply(y, x, lora->a, lora->b_t, lora->width, lora->part_starts,
                               lora_token_slots);
    return y;
  }

  // silu_and_mul of this projection's product (a gate_up: [gate | up]): in the product's
  // epilogue where the weight is bf16_dot_linear's, or quantized levels on their dense path
  // without a bias, and no row has an adapter (the same bits).
  at::Tensor silu_and_mul_of(const at::Tensor& x, const at::Tensor& lora_token_slots) const {
    const bool adapted = lora && lora_token_slots.defined();
    if (quantized && !bias && !adapted)
      if (std::optional<at::Tensor> fused = quantized->dense_silu_and_mul(x)) return *fused;
#if PAGED_CORE_BF16_DOT
    if (bf16_dot_out_features > 0 && !quantized && !adapted)
      return paged_core_cpu::bf16_dot_silu_and_mul(x, weight, bf16_dot_out_features, bias, amx_min_rows);
#endif
    const at::Tensor gate_up = (*this)(x, lora_token_slots);
    at::Tensor activated = at::empty({gate_up.size(0), gate_up.size(1) / 2}, gate_up.options());
    paged_core_cpu::silu_and_mul(gate_up, activated);
    return activated;
  }

  at::Tensor base(const at::Tensor& x) const {
    if (quantized) {  // QuantizedLinear.forward: the product in x's dtype, then the bias
      at::Tensor y = quantized->product(x, x.scalar_type()).to(x.scalar_type());
      return bias ? y + *bias : y;
    }
    if (bf16_dot_out_features > 0) {
#if PAGED_CORE_BF16_DOT
      return paged_core_cpu::bf16_dot_linear(x, weight, bf16_dot_out_features, bias, amx_min_rows);
#else
      TORCH_CHECK(false, "bf16_dot_linear weights need an avx512 or avx512_bf16 build");
#endif
    }
    if (!weight.is_mkldnn()) return at::linear(x, weight, bias);
    static const auto linear_pointwise =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
            .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                              c10::string_view, c10::List<std::optional<c10::Scalar>>,
                              std::optional<c10::string_view>)>();
    const at::Tensor y = linear_pointwise.call(x.to(weight.scalar_type()), weight, bias, "none",
                                               c10::List<std::optional<c10::Scalar>>(), "");
    return y.to(x.scalar_type());
  }
};

struct Layer {
  at::Tensor input_norm, post_norm;
  std::optional<at::Tensor> q_norm, k_norm;  // per-head norms (Qwen3), or none
  Projection qkv, o, gate_up, down;
  int64_t sliding_window;  // 0: full attention
};

// Quantize each real token's K (or V) heads (T: float or bf16 bits) into its slot of a
// quantized cache of C (kv_quant.h): cache [Hk, blocks * block_size, D + 4].
template <typename T, typename C>
void quantize_slots(const at::Tensor& rows, at::Tensor& cache, const int64_t* slots,
                    int64_t tokens) {
  const int64_t heads = cache.size(0), capacity = cache.size(1) * cache.size(2);
  const int D = static_cast<int>(rows.size(2));
  const T* src = reinterpret_cast<const T*>(rows.const_data_ptr());
  C* dst = reinterpret_cast<C*>(cache.mutable_data_ptr());
  std::vector<float> buf(D);
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(slots[t] >= 0 && slots[t] < capacity, "slot ", slots[t], " of token ", t,
                " is outside the cache's ", capacity, " slots");
    for (int64_t h = 0; h < heads; ++h) {
      const float* row = paged_core_cpu::Row<T>::load(
          src + t * rows.stride(0) + h * rows.stride(1), buf.data(), D);
      paged_core_cpu::quantize_row(row, D, dst + (h * capacity + slots[t]) * (D + 4));
    }
  }
}

template <typename T>
void quantize_slots_of(const at::Tensor& rows, at::Tensor& cache, const int64_t* slots,
                       int64_t tokens) {
  using paged_core_cpu::Fp8E4M3;
  using paged_core_cpu::Fp8E5M2;
  switch (cache.scalar_type()) {
    case at::kChar: return quantize_slots<T, int8_t>(rows, cache, slots, tokens);
    case at::kFloat8_e4m3fn: return quantize_slots<T, Fp8E4M3>(rows, cache, slots, tokens);
    case at::kFloat8_e5m2: return quantize_slots<T, Fp8E5M2>(rows, cache, slots, tokens);
    default: TORCH_CHECK(false, "the KV cache must be in the rows' dtype, int8 or float8, got ",
                         cache.scalar_type());
  }
}

// Store each real token's K (or V) heads in its cache slot: cache [Hk, blocks * block_size, row],
// row = D in the rows' dtype (a copy), or D + 4 for a quantized cache (quantize_row).
void write_slots(const at::Tensor& rows, at::Tensor& cache, const int64_t* slots, int64_t tokens) {
  const int64_t heads = cache.size(0), capacity = cache.size(1) * cache.size(2), D = rows.size(2);
  const bool quantized = cache.scalar_type() != rows.scalar_type();
  TORCH_CHECK(cache.is_contiguous() && rows.size(1) == heads &&
                  cache.size(3) == (quantized ? D + 4 : D) && rows.stride(2) == 1,
              "K/V rows must be [tokens, num_kv_heads, head_dim] with a contiguous last dim, "
              "cache rows head_dim (quantized: head_dim + 4) long");
  if (quantized) {
    TORCH_CHECK(rows.scalar_type() == at::kFloat || rows.scalar_type() == at::kBFloat16,
                "quantized K/V caches take float32 or bfloat16 rows, got ", rows.scalar_type());
    if (rows.scalar_type() == at::kFloat)
      quantize_slots_of<float>(rows, cache, slots, tokens);
    else
      quantize_slots_of<uint16_t>(rows, cache, slots, tokens);
    return;
  }
  const int64_t bytes = D * rows.element_size();
  const auto* src = static_cast<const char*>(rows.const_data_ptr());
  auto* dst = static_cast<char*>(cache.mutable_data_ptr());
  const int64_t t_stride = rows.stride(0) * rows.element_size();
  const int64_t h_stride = rows.stride(1) * rows.element_size();
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(slots[t] >= 0 && slots[t] < capacity, "slot ", slots[t], " of token ", t,
                " is outside the cache's ", capacity, " slots");
    for (int64_t h = 0; h < heads; ++h)
      std::memcpy(dst + (h * capacity + slots[t]) * bytes, src + t * t_stride + h * h_stride, bytes);
  }
}

// The op write_kv_slots: write_slots of the first slots.numel() rows (int64 slots >= 0).
void write_kv_slots(const at::Tensor& rows, at::Tensor& cache, const at::Tensor& slots) {
  TORCH_CHECK(rows.dim() == 3 && cache.dim() == 4 && rows.device().is_cpu() &&
                  cache.device().is_cpu(), "rows [tokens, heads, D] and a 4-d cache, on the CPU");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.dim() == 1 && slots.is_contiguous() &&
                  slots.numel() <= rows.size(0),
              "slots must be contiguous int64 [tokens] (at most the rows)");
  write_slots(rows, cache, slots.const_data_ptr<int64_t>(), slots.numel());
}

}  // namespace

class DecoderStack : public torch::CustomClassHolder {
 public:
  // attention_amx, kv_first_line: paged_attention's amx_tiles and kv_first_line, for every layer.
  DecoderStack(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps, double scale,
               at::Tensor cos, at::Tensor sin, at::Tensor final_norm, bool attention_amx,
               bool kv_first_line)
      : num_heads_(num_heads), num_kv_heads_(num_kv_heads), head_dim_(head_dim), eps_(eps),
        scale_(scale), attention_amx_(attention_amx), kv_first_line_(kv_first_line),
        cos_(std::move(cos)), sin_(std::move(sin)),
        final_norm_(std::move(final_norm)) {
    TORCH_CHECK(num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0 && head_dim > 0,
                "num_heads must be a positive multiple of num_kv_heads");
  }

  // Append the next layer (weights are shared with the Python model, not copied).
  // bf16_dot_out_features (qkv, o, gate_up, down): a projection's out_features if its weight
  // is pack_bf16_dot_weight's, else 0; amx_min_rows: those projections' bf16_dot_linear
  // argument.
  void add_layer(at::Tensor input_norm, at::Tensor post_norm, std::optional<at::Tensor> q_norm,
                 std::optional<at::Tensor> k_norm, at::Tensor qkv_weight,
                 std::optional<at::Tensor> qkv_bias, at::Tensor o_weight,
                 std::optional<at::Tensor> o_bias, at::Tensor gate_up_weight,
                 std::optional<at::Tensor> gate_up_bias, at::Tensor down_weight,
                 std::optional<at::Tensor> down_bias, std::vector<int64_t> bf16_dot_out_features,
                 int64_t amx_min_rows, int64_t sliding_window) {
    TORCH_CHECK(q_norm.has_value() == k_norm.has_value(), "q_norm and k_norm come together");
    TORCH_CHECK(bf16_dot_out_features.size() == 4, "one bf16_dot_out_features per projection");
    const auto& n = bf16_dot_out_features;
    layers_.push_back(Layer{std::move(input_norm), std::move(post_norm), std::move(q_norm),
                            std::move(k_norm),
                            Projection{std::move(qkv_weight), std::move(qkv_bias), n[0], amx_min_rows},
                            Projection{std::move(o_weight), std::move(o_bias), n[1], amx_min_rows},
                            Projection{std::move(gate_up_weight), std::move(gate_up_bias), n[2],
                                       amx_min_rows},
                            Projection{std::move(down_weight), std::move(down_bias), n[3], amx_min_rows},
                            sliding_window});
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

  // Make projection `projection` (0 qkv, 1 o, 2 gate_up, 3 down) of layer `layer` multiply
  // by weight-only levels of `bits` (QuantizedWeight; offsets and zeros for 4 bits, and for 8
  // where the weight has zeros;
  // column_outputs > 0: column_pack's layout, its many-rows GEMM on AMX from amx_min_rows
  // rows, its calls of up to int8_tile_rows rows on AMX-INT8 tiles; int8_sums_from_rows >= 0:
  // W8A8 (8 bits) or W4A8 (4), its rows quantized per token, QuantizedWeight's fields, with
  // w8a8_vnni_sums where W8A8's levels are w8a8_vnni_pack's, w4a8_outputs > 0 where W4A8's are
  // w4a8_pack's: then scales holds its factors, and offsets and zeros are not given) instead
  // of the weight add_layer gave it; its bias stays.
  void set_quantized(int64_t layer, int64_t projection, int64_t bits, at::Tensor levels,
                     at::Tensor scales, std::optional<at::Tensor> offsets,
                     std::optional<at::Tensor> zeros, int64_t group_size, int64_t dense_rows,
                     at::ScalarType dense_dtype, int64_t column_outputs, int64_t amx_min_rows,
                     int64_t int8_tile_rows, bool row_dense, int64_t int8_sums_from_rows,
                     std::optional<at::Tensor> w8a8_vnni_sums, int64_t w4a8_outputs) {
    TORCH_CHECK(bits == 8 || (bits == 4 && ((offsets && zeros) || w4a8_outputs > 0)),
                "quantized projections are 8-bit, 4-bit with offsets and zeros, or W4A8 levels "
                "in w4a8_pack's layout");
    TORCH_CHECK(offsets.has_value() == zeros.has_value(), "give offsets and zeros together");
    TORCH_CHECK(levels.is_contiguous() && scales.is_contiguous() && group_size > 0 &&
                    (scales.scalar_type() == at::kFloat ||
                     ((column_outputs > 0 || w4a8_outputs > 0) &&
                      scales.scalar_type() == at::kHalf)),
                "levels and scales (float32; float16 in the column and W4A8 layouts) must be "
                "contiguous, group_size positive");
    projection_at(layer, projection).quantized = QuantizedWeight{
        bits, std::move(levels), std::move(scales), offsets.value_or(at::Tensor()),
        zeros.value_or(at::Tensor()), group_size, dense_rows, dense_dtype, column_outputs,
        amx_min_rows, int8_tile_rows, row_dense, int8_sums_from_rows,
        w8a8_vnni_sums.value_or(at::Tensor()), w4a8_outputs};
  }

  // Give projection `projection` (0 qkv, 1 o, 2 gate_up, 3 down) of layer `layer` the LoRA
  // slot tables a [slots, width, in] and b_t [slots, width, out] (shared; every slot unused)
  // and its parts' output column boundaries.
  void set_lora(int64_t layer, int64_t projection, at::Tensor a, at::Tensor b_t,
                std::vector<int64_t> part_starts) {
    TORCH_CHECK(a.dim() == 3 && b_t.dim() == 3 && a.size(0) == b_t.size(0) &&
                    a.size(1) == b_t.size(1),
                "LoRA tables must be a [slots, width, in] and b_t [slots, width, out]");
    const int64_t slots = a.size(0);
    projection_at(layer, projection).lora =
        LoRASlots{std::move(a), std::move(b_t), std::vector<int64_t>(slots, 0),
                  std::move(part_starts)};
  }

  // The columns of a / b that the adapter now in `slot` uses there (0: none).
  void set_lora_width(int64_t layer, int64_t projection, int64_t slot, int64_t width) {
    Projection& p = projection_at(layer, projection);
    TORCH_CHECK(p.lora && slot >= 0 && slot < p.lora->a.size(0) && width >= 0 &&
                    width <= p.lora->a.size(1),
                "set_lora first; then a slot and a width within its tables");
    p.lora->width[slot] = width;
  }

  // The final-normed hidden states [tokens, hidden] of a packed step; `residual` (the
  // embedded tokens) becomes the last residual stream. Rows from `real_tokens` on are
  // padding: their K/V are not stored. The metadata is the step's AttentionMetadata;
  // lora_token_slots: each row's LoRA slot (int64, -1: none; None: no row has an adapter).
  at::Tensor forward(at::Tensor residual, at::Tensor positions, std::vector<at::Tensor> k_caches,
                     std::vector<at::Tensor> v_caches, at::Tensor slot_mapping, int64_t real_tokens,
                     at::Tensor block_tables, at::Tensor seq_lens, at::Tensor query_start_loc,
                     std::optional<at::Tensor> lora_token_slots) {
    TORCH_CHECK(!layers_.empty(), "DecoderStack has no layers");
    TORCH_CHECK(k_caches.size() == layers_.size() && v_caches.size() == layers_.size(),
                "one K and one V cache per layer");
    TORCH_CHECK(residual.dim() == 2 && residual.is_contiguous(), "residual must be contiguous [tokens, hidden]");
    TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous() &&
                    real_tokens >= 0 && real_tokens <= slot_mapping.numel() &&
                    slot_mapping.numel() == residual.size(0),
                "slot_mapping must be contiguous int64 [tokens], real_tokens at most that");
    const auto int32 = [](const at::Tensor& t) { return t.to(at::kInt).contiguous(); };
    const Step step{positions, slot_mapping.const_data_ptr<int64_t>(), real_tokens,
                    int32(block_tables), int32(seq_lens), int32(query_start_loc),
                    lora_token_slots.value_or(at::Tensor())};
    at::Tensor hidden = at::empty_like(residual);
    paged_core_cpu::rms_norm(residual, layers_[0].input_norm, eps_, hidden);
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& layer = layers_[i];
      const at::Tensor attention = attend(layer, hidden, k_caches[i], v_caches[i], step);
      at::Tensor normed = at::empty_like(residual);
      paged_core_cpu::add_rms_norm(residual, attention, layer.post_norm, eps_, normed);
      const at::Tensor activated = layer.gate_up.silu_and_mul_of(normed, step.lora);
      const at::Tensor mlp = layer.down(activated, step.lora);
      hidden = at::empty_like(residual);
      const at::Tensor& next_norm = i + 1 < layers_.size() ? layers_[i + 1].input_norm : final_norm_;
      paged_core_cpu::add_rms_norm(residual, mlp, next_norm, eps_, hidden);
    }
    return hidden;
  }

 private:
  struct Step {
    const at::Tensor& positions;
    const int64_t* slots;
    int64_t real_tokens;
    at::Tensor block_tables, seq_lens, query_start_loc;  // int32
    at::Tensor lora;  // each row's LoRA slot, or undefined
  };

  Projection& projection_at(int64_t layer, int64_t projection) {
    TORCH_CHECK(layer >= 0 && layer < num_layers() && projection >= 0 && projection < 4,
                "no layer ", layer, " projection ", projection);
    Layer& l = layers_[layer];
    Projection* projections[] = {&l.qkv, &l.o, &l.gate_up, &l.down};
    return *projections[projection];
  }

  // o(attention of the layer's q over its paged cache), after storing this step's K/V.
  at::Tensor attend(const Layer& layer, const at::Tensor& hidden, at::Tensor& k_cache,
                    at::Tensor& v_cache, const Step& step) const {
    const int64_t tokens = hidden.size(0), q_size = num_heads_ * head_dim_,
                  kv_size = num_kv_heads_ * head_dim_;
    const at::Tensor qkv = layer.qkv(hidden, step.lora);
    const auto parts = qkv.split_with_sizes({q_size, kv_size, kv_size}, -1);
    at::Tensor q = parts[0].view({tokens, num_heads_, head_dim_});
    at::Tensor k = parts[1].view({tokens, num_kv_heads_, head_dim_});
    const at::Tensor v = parts[2].view({tokens, num_kv_heads_, head_dim_});
    if (layer.q_norm) {
      q = head_norm(q, *layer.q_norm);
      k = head_norm(k, *layer.k_norm);
    }
    paged_core_cpu::rotary_embedding(q, k, step.positions, cos_, sin_);
    TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.dim() == 4 &&
                    k_cache.sizes() == v_cache.sizes() && k_cache.size(0) == num_kv_heads_ &&
                    v_cache.scalar_type() == k_cache.scalar_type(),
                "caches must be contiguous [num_kv_heads, blocks, block_size, row], K and V alike "
                "(in the model's dtype, or quantized: write_slots checks the rows)");
    write_slots(k, k_cache, step.slots, step.real_tokens);
    write_slots(v, v_cache, step.slots, step.real_tokens);
    at::Tensor out = at::empty({tokens, num_heads_, head_dim_}, q.options());
    if (step.real_tokens < tokens) out.narrow(0, step.real_tokens, tokens - step.real_tokens).zero_();
    static const auto paged_attention =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow(PAGED_CORE_STR(PAGED_CORE_OPS) "::paged_attention", "")
            .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                        const at::Tensor&, const at::Tensor&, double, int64_t, double,
                        at::Tensor&, bool, bool, bool)>();
    paged_attention.call(q, k_cache, v_cache, step.block_tables, step.seq_lens, step.query_start_loc,
                         scale_, layer.sliding_window, /*logits_soft_cap=*/0.0, out, attention_amx_,
                         /*decode_loop=*/true, kv_first_line_);
    return layer.o(out.view({tokens, q_size}), step.lora);
  }

  // RMSNorm of every head row [tokens, heads, D] (contiguous result).
  at::Tensor head_norm(const at::Tensor& x, const at::Tensor& weight) const {
    const at::Tensor rows = x.reshape({-1, head_dim_}).contiguous();
    at::Tensor out = at::empty_like(rows);
    paged_core_cpu::rms_norm(rows, weight, eps_, out);
    return out.view(x.sizes());
  }

  int64_t num_heads_, num_kv_heads_, head_dim_;
  double eps_, scale_;
  bool attention_amx_, kv_first_line_;
  at::Tensor cos_, sin_, final_norm_;
  std::vector<Layer> layers_;
};

}  // namespace PAGED_CORE_OPS

PAGED_CORE_LIBRARY_FRAGMENT(m) {
  m.def("write_kv_slots(Tensor rows, Tensor(a!) cache, Tensor slots) -> ()");
  m.impl("write_kv_slots", c10::DispatchKey::CPU, TORCH_FN(PAGED_CORE_OPS::write_kv_slots));
  m.class_<PAGED_CORE_OPS::DecoderStack>("DecoderStack")
      .def(torch::init<int64_t, int64_t, int64_t, double, double, at::Tensor, at::Tensor, at::Tensor,
                       bool, bool>())
      .def("add_layer", &PAGED_CORE_OPS::DecoderStack::add_layer)
      .def("num_layers", &PAGED_CORE_OPS::DecoderStack::num_layers)
      .def("set_quantized", &PAGED_CORE_OPS::DecoderStack::set_quantized)
      .def("set_lora", &PAGED_CORE_OPS::DecoderStack::set_lora)
      .def("set_lora_width", &PAGED_CORE_OPS::DecoderStack::set_lora_width)
      .def("forward", &PAGED_CORE_OPS::DecoderStack::forward);
}
