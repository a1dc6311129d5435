// ---- templates/common/variants.cuh: the device side of the attention variants (sliding windows,
// logit soft-capping, attention sinks; docs/CONTRACT.md), one spelling for every family. A kernel
// uses these only under #if ATT_WINDOW / ATT_SOFTCAP / ATT_SINKS (the renderer defines them for a
// problem with the variant), so a plain build compiles to the code it always did. The run-time
// values come in the kernel argument's `variant` (variant_params.h).
#ifndef ATTNTUNE_VARIANTS_CUH
#define ATTNTUNE_VARIANTS_CUH

#include "ptx.cuh"
#include "variant_params.h"

#ifndef ATT_WINDOW
#define ATT_WINDOW 0
#endif
#ifndef ATT_SOFTCAP
#define ATT_SOFTCAP 0
#endif
#ifndef ATT_SINKS
#define ATT_SINKS 0
#endif

namespace att {

// ---- windows -----------------------------------------------------------------------------------
// Query row `row` of a sequence (0-based within it) is aligned bottom-right: its diagonal key is
// row + diag, diag = len_k - len_q. It sees keys [key_begin, key_end): from row + diag - left
// (window builds with left >= 0; else 0) to row + diag + right (causal: right 0; window builds
// with right >= 0; else every key), clamped to [0, len_k]. A row whose range is empty sees no key
// (zeros out, LSE -inf, or the sink's).

template <bool kWindow>
__device__ __forceinline__ int key_begin(int row, int diag, int len_k, const VariantParams& v) {
  if constexpr (kWindow) {
    if (v.window_left >= 0) return min(len_k, max(0, row + diag - v.window_left));
  }
  return 0;
}

template <bool kCausal, bool kWindow>
__device__ __forceinline__ int key_end(int row, int diag, int len_k, const VariantParams& v) {
  if constexpr (kCausal) return min(len_k, max(0, row + diag + 1));
  if constexpr (kWindow) {
    if (v.window_right >= 0) return min(len_k, max(0, row + diag + v.window_right + 1));
  }
  return len_k;
}

// Whether key `col` is visible from row `row` (for masking inside a tile that crosses a bound).
template <bool kCausal, bool kWindow>
__device__ __forceinline__ bool key_visible(int row, int col, int diag, int len_k, const VariantParams& v) {
  return col >= key_begin<kWindow>(row, diag, len_k, v) && col < key_end<kCausal, kWindow>(row, diag, len_k, v);
}

// ---- soft-cap ----------------------------------------------------------------------------------
// score = c * tanh(scale * s / c) for a raw score s = q.k: c * tanh(s * softcap_scale). The
// accurate form, tanh(x) = sign(x) (1 - 2 / (exp(2|x|) + 1)) through ex2 and rcp (~1e-7 absolute,
// so c * tanh is exact to ~c * 1e-7), or tanh.approx.f32 (one MUFU op, relative error 2^-11: at
// c = 50 up to ~0.02 in the score, which fp16's criterion may not forgive).
__device__ __forceinline__ float tanh_accurate(float x) {
  const float e = ex2(fabsf(x) * 2.8853900817779268f);  // exp(2|x|) = 2^(2|x| log2(e))
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(e + 1.f));  // exp overflowing to inf: r = 0, tanh 1
  return copysignf(fmaf(-2.f, r, 1.f), x);
}
__device__ __forceinline__ float tanh_fast(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
template <bool kApprox = false>
__device__ __forceinline__ float softcap_score(float s, const VariantParams& v) {
  const float x = s * v.softcap_scale;
  return v.softcap * (kApprox ? tanh_fast(x) : tanh_accurate(x));
}

// ---- sinks -------------------------------------------------------------------------------------
// A row's softmax finished with its head's sink logit (natural log units): the row's running
// maximum m2 and sum l are in log2 units (l = sum 2^(x_j - m2), x_j = score_j * log2(e) as the
// kernels keep them; m2 -inf when the row saw no key). The sink joins the denominator:
//   M = max(m2, sink * log2(e)),  L = l 2^(m2 - M) + 2^(sink log2(e) - M)
// and the unnormalised output (sum 2^(x_j - m2) v_j) is multiplied by o_scale = 2^(m2 - M) / L;
// lse (natural log) = (M + log2 L) ln 2. A sink of -inf is no sink; with no key and no sink the
// row outputs zeros and LSE -inf.
struct SinkFinish {
  float o_scale, lse;
};
__device__ __forceinline__ SinkFinish sink_finish(float m2, float l, float sink) {
  const float s2 = sink * 1.4426950408889634f;
  const float m = fmaxf(m2, s2);  // fmaxf(-inf, -inf) = -inf
  if (m == neg_inf()) return SinkFinish{0.f, neg_inf()};
  const float keep = m2 == neg_inf() ? 0.f : ex2(m2 - m);
  const float total = l * keep + (s2 == neg_inf() ? 0.f : ex2(s2 - m));
  if (!(total > 0.f)) return SinkFinish{0.f, neg_inf()};
  return SinkFinish{keep / total, (m + lg2(total)) * 0.6931471805599453f};
}

}  // namespace att

#endif  // ATTNTUNE_VARIANTS_CUH
