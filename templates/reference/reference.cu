// Trusted reference kernels: a plain attention in fp32 math that every candidate is compared
// with, plus random fill and comparison. Written for obviousness, not speed; tested against a
// CPU float64 reference (tests/gpu/test_reference.cpp).
//
// attn_reference computes, per query row i of (batch, head):
//   s_j = scale * <q_i, k_j> for visible keys j (j < n; causal: j <= i + n - seqlen_q), where n is
//   the sequence's key count: seqlens_k[batch] when given (a KV cache's ragged lengths), else seqlen_k
//   p_j = exp(s_j - max s) / sum exp(s - max s),  o_i = sum_j p_j v_j,  lse_i = log sum exp(s)
// in two passes (max and sum first, then the exact normalised sum). With lowp=1 it rounds s, p
// and o to the input dtype as a same-dtype framework reference would (FA2's criterion compares
// a candidate's error with that reference's error).
// The variants (p.variant, common/variant_params.h), always applied (the reference is one build):
// a window bounds the visible keys to i' - left <= j <= i' + right (i' = i + n - seqlen_q; -1
// unbounded; causal sets right 0); a soft-cap c > 0 makes s_j = c * tanh(s_j / c) (tanhf, before
// the masking and the rounding); sinks add exp(sink[head] - m) to the denominator and to the LSE,
// with m the larger of max s and the sink.
//
// A varlen batch (p.cu_seqlens_q set: attntune_attention_forward_varlen's packed tensors): sequence
// b's rows start at cu_seqlens_q[b] (keys at cu_seqlens_k[b]) through the row strides, its lengths
// are the prefix sums' differences, p.seqlen_q bounds them, and causal is bottom-right aligned per
// sequence. Its outputs are indexed as the packed LSE: row head * total_q + cu_seqlens_q[b] + i.
//
// An FP8 e4m3 KV cache (a `kv_dtype=fp8` problem: docs/CONTRACT.md "FP8 KV caches") is read by
// attn_reference_kv_fp8, the same kernel with one more argument, the scales (`kv`,
// common/kv_scales.h) (one template, reference_rows<true>;
// attn_reference is reference_rows<false>, the 16-bit path as it always was: its machine code, and
// fill_normal's and scatter_pages', are the same instructions as before FP8 existed). Q stays in the
// problem's dtype (bf16 selects it) and O is fp32 as always; K and V hold one byte an element
// (OCP FP8 E4M3, "e4m3fn": bias 7, no infinities, S.1111.111 NaN), their strides counting bytes.
// Key j's element c of K is read as
//   k(j, c) = e4m3(byte) * kd,  kd = kv.k_descale[batch * kv.k_descale_stride[0] +
//                                               kv_head * kv.k_descale_stride[1]]
// (V's likewise with v_descale), where e4m3(byte) is the byte's value, exact in fp32 (e4m3_to_float,
// plain integer arithmetic), the product is one fp32 multiplication (one rounding), a null table is
// a scale of 1, and strides {0, 0} read one scale for the whole tensor (entry 0). batch is the
// sequence (blockIdx.z), kv_head = head / q_per_kv. Then the same fp32 math as above: s_j = scale *
// sum_c q_c k(j, c) (fmaf in column order), o = sum_j p_j v(j) (fmaf in key order); with lowp=1 s, p
// and o are rounded to Q's dtype exactly as for a 16-bit cache (the dequantised K and V are not).
// A kernel that applies the scales to the dot products (s = scale * kd * <q, e4m3(k)>, o = vd *
// sum_j p_j e4m3(v_j)) computes the same values up to fp32 rounding. NaN bytes (0x7F, 0xFF: a stale
// cache past a sequence's length) read as NaN, so a kernel that lets one reach an output fails.
// fill_normal_e4m3 draws K and V from fill_normal's distribution (V around a mean a test may set),
// each value rounded to e4m3 (round
// to nearest even, saturated to +-448: cvt.rn.satfinite.e4m3x2.f32, sm_89 and newer; FP8 problems
// run there only, the host refuses them on older devices, where the conversion returns NaN bytes).
// quantize_e4m3 and dequantize_e4m3 expose both conversions for tests.
//
// An FP8 forward (a `dtype=fp8` problem: docs/CONTRACT.md "FP8 forward") is read by
// attn_reference_qkv_fp8, reference_rows<true, true>: Q's bytes too, each q(i, c) = e4m3(byte) * qd
// with qd = q_descale[batch * q_descale_stride0 + kv_head * q_descale_stride1] (the kernel argument
// after `kv`; FlashAttention-3's descale_q, [batch, heads_kv]), O in bf16 (bf16 1). V is read as
// [batch, heads_kv, seqlen_k, head_dim_v] through p's strides, as always; the kernel reads a
// transposed copy (transpose_e4m3). With lowp=1 it is the baseline a good FP8 kernel's error is
// measured against: s rounded to bf16 as for a 16-bit problem (FP8 wgmma's own accumulation keeps
// about 13-14 bits of its running sum, not fp32's 24: a kernel's scores carry errors of that order,
// which the bf16 rounding bounds), P into P.V as e4m3 (each 2^8 exp(s_j - max s) rounded to e4m3, then
// divided by 2^8 times the exact fp32 sum, which saw P unrounded), O rounded to bf16. Its LSE is the bound of
// the kernel's (compare_outputs' lse_low: FlashAttention-2's criterion on the LSE too).
//
// The backward pass (a `pass=bwd` problem, issue 45; dense tensors, one batch offset a sequence, or a
// varlen batch's packed ones, each sequence from its prefix sums' rows, BwdSeqRef) is
// three kernels over the forward's inputs (bp.fwd: q, k, v through their strides) and dO (bp.dout
// through bp.do_stride), after attn_reference has given the forward's O (fp32, as its `out`) and LSE
// of the same inputs: the reference's own forward, never the candidate's. Per (batch, query head h,
// query row i, key j), kv_head = h / q_per_kv:
//   s_ij = scale * <q_i, k_j> (fmaf in column order: the forward's scores, bit for bit)
//   P_ij = exp(s_ij - lse_i) for visible j (the forward's masks: causal bottom-right, windows), else 0
//   D_i = sum_c dO_ic O_ic                                   (attn_bwd_rowdot)
//   dP_ij = <dO_i, v_j>,  dS_ij = P_ij (dP_ij - D_i)
//   dQ_i = scale * sum_j dS_ij k_j                          (attn_reference_bwd_dq: a warp per query row)
//   dK_j = scale * sum_h sum_i dS_ij q_i,  dV_j = sum_h sum_i P_ij dO_i, summed over the query heads h of
//   j's KV head (GQA)                                       (attn_reference_bwd_dkdv: a warp per key row)
// in fp32 and fixed orders (keys and query rows ascending, heads ascending, column blocks of kCols):
// deterministic, one thread writes each output. With lowp=1 they round what a same-dtype framework's
// autograd rounds: s, P, dP and dS to the dtype, each query head's dK and dV contribution (the
// backward of repeating K and V over the group) and the outputs; D and the LSE are then the lowp
// forward's (its O rounded to the dtype). A softmax sink needs nothing more: the forward's LSE and O
// hold it, so P and D above are the sink problem's (the sink's own gradient is not the kernels': the
// ops compute it). A soft-cap C makes s_ij = C tanh(scale <q_i, k_j> / C) (the forward's) and
// multiplies dS_ij by 1 - tanh^2 (its derivative; softcap_bwd). Outputs are fp32 and contiguous: dQ (batch, heads_q, seqlen_q,
// head_dim), dK (batch, heads_kv, seqlen_k, head_dim), dV (batch, heads_kv, seqlen_k, head_dim_v);
// varlen, the packed rows: dQ (heads_q, total_q, head_dim), dK and dV (heads_kv, total_k, ...), as
// the forward's varlen LSE and O.
// compare_grad compares one strided 16-bit gradient with them, store_rounded writes the forward's O
// to a candidate's input in the dtype.
#include "../common/attn_params.h"
#include "../common/bwd_params.h"
#include "../common/kv_scales.h"

namespace att_ref {

typedef unsigned short elem_t;

__device__ __forceinline__ float to_float(elem_t x, int bf16) {
  if (bf16) return __uint_as_float(static_cast<unsigned>(x) << 16);
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
  return f;
}

__device__ __forceinline__ elem_t from_float(float x, int bf16) {
  elem_t r;
  if (bf16) asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
  else asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float round_to(float x, int bf16) { return to_float(from_float(x, bf16), bf16); }

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// One FP8 e4m3 byte of a KV cache.
typedef unsigned char fp8_t;

// An e4m3 byte's value, exact in fp32: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent
// 0 is subnormal (m * 2^-9), S.1111.111 is NaN (e4m3fn has no infinities; 0x7E is 448, the largest).
__device__ __forceinline__ float e4m3_to_float(unsigned x) {
  const unsigned sign = (x & 0x80u) << 24, e = (x >> 3) & 0xfu, m = x & 0x7u;
  if (e == 0xfu && m == 0x7u) return __uint_as_float(sign | 0x7fc00000u);
  if (e == 0) {
    const float v = static_cast<float>(m) * 0.001953125f;  // m * 2^-9, exact
    return sign ? -v : v;
  }
  return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));  // (1 + m/8) * 2^(e - 7)
}

// fp32 to e4m3: round to nearest even, saturated to +-448 (satfinite), NaN to NaN (0x7F). The
// conversion exists from sm_89; older targets compile a NaN byte (the host never runs FP8 there).
__device__ __forceinline__ fp8_t float_to_e4m3(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %1;" : "=h"(r) : "f"(x));  // x into both bytes
  return static_cast<fp8_t>(r & 0xffu);
#else
  return static_cast<fp8_t>(0x7fu);
#endif
}

// The element type a reference kernel reads K and V in: Q's 16-bit type, or FP8 e4m3 bytes.
template <bool kKvFp8> struct KvElem { typedef elem_t type; };
template <> struct KvElem<true> { typedef fp8_t type; };

// A K or V element as the reference computes with it: a 16-bit value's fp32 value, or an e4m3
// byte's (held in an elem_t slot of shared memory) times its (sequence, KV head) descale.
template <bool kKvFp8>
__device__ __forceinline__ float kv_value(elem_t x, int bf16, float descale) {
  if (kKvFp8) return e4m3_to_float(x) * descale;
  return to_float(x, bf16);
}

// A descale table's entry for (batch, kv_head) through its {batch, head} strides ({0, 0}: entry 0,
// one scale for the tensor); a null table is 1.
__device__ __forceinline__ float descale_of(const float* table, const int* stride, int batch, int kv_head) {
  return table ? table[static_cast<long long>(batch) * stride[0] + static_cast<long long>(kv_head) * stride[1]] : 1.f;
}

constexpr int kRowsPerBlock = 8;  // one warp per query row
constexpr int kKeysPerChunk = 32;
// Head dims up to kMaxDim (a problem's largest), held kCols columns at a time: Q.K^T sums its column
// blocks in column order (one block, as every head dim up to 256 is, sums as a row at once did), and
// P.V accumulates each block of O's columns in registers of its own (o[]: kMaxDim / 32 a lane).
constexpr int kCols = 256;
constexpr int kMaxDim = 1024;
constexpr int kPad = 2;  // odd word stride per smem row: lanes reading different rows hit different banks

// grid (ceil(seqlen_q / 8), heads_q, batch), block 256. head_dim is Q's and K's, head_dim_v V's and
// O's. out: (batch, heads_q, seqlen_q, head_dim_v) contiguous fp32; lse_out: (batch, heads_q,
// seqlen_q) fp32; seqlens_k: [batch] or null. A varlen batch: out (heads_q, total_q, head_dim_v),
// lse_out (heads_q, total_q). attn_reference and attn_reference_kv_fp8 (the header) are its two
// instantiations: K and V in Q's dtype, or FP8 e4m3 bytes with their descales.
template <bool kKvFp8, bool kQFp8 = false>
__device__ __forceinline__ void reference_rows(const AttnParams& p, int head_dim, int head_dim_v, int bf16, int causal,
                                               int lowp, float* out, float* lse_out, const int* seqlens_k,
                                               const KvScales& kv, const float* q_descale = nullptr,
                                               int q_descale_stride0 = 0, int q_descale_stride1 = 0) {
  typedef typename KvElem<kKvFp8>::type kv_t;
  __shared__ float sq[kRowsPerBlock][kCols];
  __shared__ elem_t sk[kKeysPerChunk][kCols + kPad];
  __shared__ elem_t sv[kKeysPerChunk][kCols + kPad];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int head = blockIdx.y, batch = blockIdx.z, kv_head = head / p.q_per_kv;
  const bool varlen = p.cu_seqlens_q != 0;
  // This sequence's first packed rows (varlen), else its batch offset; then its lengths.
  const int q0 = varlen ? p.cu_seqlens_q[batch] : 0, k0 = varlen ? p.cu_seqlens_k[batch] : 0;
  const int seqlen_q = varlen ? p.cu_seqlens_q[batch + 1] - q0 : p.seqlen_q;
  const int seqlen_k = varlen ? p.cu_seqlens_k[batch + 1] - k0 : seqlens_k ? seqlens_k[batch] : p.seqlen_k;
  // A CTA past a varlen sequence's rows has nothing to do (the whole CTA leaves: no barrier waits).
  if (int(blockIdx.x) * kRowsPerBlock >= seqlen_q) return;
  const int row = blockIdx.x * kRowsPerBlock + warp;
  const bool active = row < seqlen_q;
  const int diag = seqlen_k - seqlen_q;
  const int left = p.variant.window_left, right = causal ? 0 : p.variant.window_right;
  // Row r sees keys [first(r), visible(r)).
  auto visible = [&](int r) { return right >= 0 ? min(seqlen_k, max(0, r + diag + right + 1)) : seqlen_k; };
  auto first = [&](int r) { return left >= 0 ? min(seqlen_k, max(0, r + diag - left)) : 0; };
  const int limit = active ? visible(row) : 0;
  const int start = active ? first(row) : 0;
  // Keys any row of this block sees: the block's last valid row sees the most, its first the earliest.
  const int block_limit = visible(min(seqlen_q - 1, int(blockIdx.x) * kRowsPerBlock + kRowsPerBlock - 1));
  const int block_start = first(int(blockIdx.x) * kRowsPerBlock) / kKeysPerChunk * kKeysPerChunk;

  const long long q_base = varlen ? q0 * p.q_stride[2] : batch * p.q_stride[0];
  const long long k_base = varlen ? k0 * p.k_stride[2] : batch * p.k_stride[0];
  const long long v_base = varlen ? k0 * p.v_stride[2] : batch * p.v_stride[0];
  const elem_t* q = static_cast<const elem_t*>(p.q) + q_base + head * p.q_stride[1];
  const kv_t* k = static_cast<const kv_t*>(p.k) + k_base + kv_head * p.k_stride[1];
  const kv_t* v = static_cast<const kv_t*>(p.v) + v_base + kv_head * p.v_stride[1];
  // An FP8 cache's scales for this sequence and KV head (unused with a 16-bit cache).
  const float k_scale = kKvFp8 ? descale_of(kv.k_descale, kv.k_descale_stride, batch, kv_head) : 1.f;
  const float v_scale = kKvFp8 ? descale_of(kv.v_descale, kv.v_descale_stride, batch, kv_head) : 1.f;
  // An FP8 forward's Q scale (its table's strides as K's).
  const int q_stride_pair[2] = {q_descale_stride0, q_descale_stride1};
  const float q_scale = kQFp8 ? descale_of(q_descale, q_stride_pair, batch, kv_head) : 1.f;
  // The scaled score of this warp's row against key c0 + lane (keys past seqlen_k score zeros; an
  // inactive warp's is never used). Q and the chunk's K rows come in column blocks of kCols; every
  // thread calls it (it holds the block's barriers).
  auto score = [&](int c0) {
    float acc = 0.f;
    for (int cb = 0; cb < head_dim; cb += kCols) {
      const int w = min(kCols, head_dim - cb);
      __syncthreads();  // the previous block (or chunk) fully consumed
      if (active)
        for (int c = lane; c < w; c += 32) {
          if (kQFp8)  // Q's bytes (q_base and the head's offset count bytes: its strides do)
            sq[warp][c] = e4m3_to_float(reinterpret_cast<const fp8_t*>(p.q)[q_base + head * p.q_stride[1] +
                                                                             row * p.q_stride[2] + cb + c]) *
                          q_scale;
          else
            sq[warp][c] = to_float(q[row * p.q_stride[2] + cb + c], bf16);
        }
      for (int i = threadIdx.x; i < kKeysPerChunk * w; i += blockDim.x) {
        const int r = i / w, c = i % w, key = c0 + r;
        sk[r][c] = key < seqlen_k ? elem_t(k[key * p.k_stride[2] + cb + c]) : elem_t(0);
      }
      __syncthreads();
      for (int c = 0; c < w; ++c) acc = fmaf(sq[warp][c], kv_value<kKvFp8>(sk[lane][c], bf16, k_scale), acc);
    }
    acc *= p.scale;
    if (p.variant.softcap > 0.f) acc = p.variant.softcap * tanhf(acc / p.variant.softcap);
    return lowp ? round_to(acc, bf16) : acc;
  };

  // Pass 1: per-lane running max and sum over keys lane, lane+32, ...; then merged over the warp.
  float m = neg_inf(), l = 0.f;
  for (int c0 = block_start; c0 < block_limit; c0 += kKeysPerChunk) {
    const float s = score(c0);
    const int key = c0 + lane;
    if (key >= start && key < limit) {
      const float mn = fmaxf(m, s);
      l = l * expf(m - mn) + expf(s - mn);
      m = mn;
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
    const float l2 = __shfl_xor_sync(0xffffffffu, l, off);
    const float mn = fmaxf(m, m2);
    if (mn != neg_inf()) {
      l = (m == neg_inf() ? 0.f : l * expf(m - mn)) + (m2 == neg_inf() ? 0.f : l2 * expf(m2 - mn));
      m = mn;
    }
  }
  // A sink joins the denominator (and the LSE) with no value row; a row that sees no key then
  // outputs zeros with LSE = the sink.
  if (p.variant.sinks) {
    const float sink = p.variant.sinks[head];
    const float mn = fmaxf(m, sink);
    if (mn != neg_inf()) {
      l = (m == neg_inf() ? 0.f : l * expf(m - mn)) + expf(sink - mn);
      m = mn;
    }
  }

  // Pass 2: o = sum_j p_j v_j with exactly normalised p; lane owns dims lane, lane+32, ... (o[t] is
  // dim lane + 32 t); V's rows come in column blocks of kCols, each block's dims summed over the
  // chunk's keys in key order.
  float o[kMaxDim / 32];
#pragma unroll
  for (int t = 0; t < kMaxDim / 32; ++t) o[t] = 0.f;
  for (int c0 = block_start; c0 < block_limit; c0 += kKeysPerChunk) {
    const float s = score(c0);
    const int key = c0 + lane;
    float pj = 0.f;
    if (key >= start && key < limit) {
      // P into P.V as e4m3, scaled by 2^8 first (FlashAttention-3's max_offset: a good FP8 kernel keeps
      // the small P out of e4m3's subnormals, which would flush them and bias O as the keys grow).
      if (kQFp8 && lowp) pj = e4m3_to_float(float_to_e4m3(256.f * expf(s - m))) / (256.f * l);
      else pj = lowp ? round_to(expf(s - m) / l, bf16) : expf(s - m) / l;
    }
#pragma unroll
    for (int vb = 0; vb < kMaxDim / kCols; ++vb) {
      const int cb = vb * kCols;
      if (cb >= head_dim_v) break;  // the same for the whole block
      const int w = min(kCols, head_dim_v - cb);
      __syncthreads();  // the previous block (or Q.K^T's) fully consumed
      for (int i = threadIdx.x; i < kKeysPerChunk * w; i += blockDim.x) {
        const int r = i / w, c = i % w, key_r = c0 + r;
        sv[r][c] = key_r < seqlen_k ? elem_t(v[key_r * p.v_stride[2] + cb + c]) : elem_t(0);
      }
      __syncthreads();
      for (int kk = 0; kk < kKeysPerChunk; ++kk) {
        const float pk = __shfl_sync(0xffffffffu, pj, kk);
#pragma unroll
        for (int t = 0; t < kCols / 32; ++t) {
          const int c = lane + 32 * t;
          if (c < w)
            o[vb * (kCols / 32) + t] = fmaf(pk, kv_value<kKvFp8>(sv[kk][c], bf16, v_scale), o[vb * (kCols / 32) + t]);
        }
      }
    }
  }
  if (!active) return;
  const long long row_index = varlen ? static_cast<long long>(head) * p.cu_seqlens_q[p.batch] + q0 + row
                                     : (static_cast<long long>(batch) * p.heads_q + head) * p.seqlen_q + row;
#pragma unroll
  for (int t = 0; t < kMaxDim / 32; ++t) {
    const int c = lane + 32 * t;
    if (c < head_dim_v) out[row_index * head_dim_v + c] = lowp ? round_to(o[t], bf16) : o[t];
  }
  if (lane == 0) lse_out[row_index] = l > 0.f ? m + logf(l) : neg_inf();
}

extern "C" __global__ void __launch_bounds__(256)
attn_reference(const AttnParams p, int head_dim, int head_dim_v, int bf16, int causal, int lowp, float* out,
               float* lse_out, const int* seqlens_k) {
  reference_rows<false>(p, head_dim, head_dim_v, bf16, causal, lowp, out, lse_out, seqlens_k, KvScales{});
}

// The same over an FP8 e4m3 cache (the header): bf16 is Q's and O's dtype.
extern "C" __global__ void __launch_bounds__(256)
attn_reference_kv_fp8(const AttnParams p, int head_dim, int head_dim_v, int bf16, int causal, int lowp, float* out,
                      float* lse_out, const int* seqlens_k, const KvScales kv) {
  reference_rows<true>(p, head_dim, head_dim_v, bf16, causal, lowp, out, lse_out, seqlens_k, kv);
}

// The FP8 forward's reference (the header): Q, K and V e4m3 with their descales, O bf16. (256, 1): with
// 256 alone NVRTC 13's ptxas held it to 64 registers and spilled 144 bytes (Q's bytes and scale beside
// the FP8 cache's path).
extern "C" __global__ void __launch_bounds__(256, 1)
attn_reference_qkv_fp8(const AttnParams p, int head_dim, int head_dim_v, int bf16, int causal, int lowp, float* out,
                       float* lse_out, const int* seqlens_k, const KvScales kv, const float* q_descale,
                       int q_descale_stride0, int q_descale_stride1) {
  reference_rows<true, true>(p, head_dim, head_dim_v, bf16, causal, lowp, out, lse_out, seqlens_k, kv, q_descale,
                             q_descale_stride0, q_descale_stride1);
}

// An FP8 forward's V as its kernels read it: v [batch, heads, rows, dim] bytes through its {batch,
// head, row} strides (the last dim contiguous) to vt [batch][heads][dim][ld] (ld >= rows, the keys
// contiguous; the bytes past rows are left as they were).
extern "C" __global__ void transpose_e4m3(const fp8_t* v, long long s0, long long s1, long long s2, fp8_t* vt, int batch,
                                          int heads, int rows, int dim, int ld) {
  const long long n = static_cast<long long>(batch) * heads * rows * dim;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(i % dim);
    const long long r = i / dim;
    const int key = static_cast<int>(r % rows);
    const long long bh = r / rows;
    const int h = static_cast<int>(bh % heads), b = static_cast<int>(bh / heads);
    vt[(bh * dim + c) * ld + key] = v[b * s0 + h * s1 + key * s2 + c];
  }
}

// Counter-based normal random numbers (splitmix64 + Box-Muller), so every launch with a new seed
// gives fresh inputs without host transfers.
__device__ __forceinline__ unsigned long long splitmix64(unsigned long long x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Element i's draw of the stream `seed`: the same value for a 16-bit and an FP8 tensor.
__device__ __forceinline__ float normal_at(unsigned long long seed, long long i) {
  const unsigned long long r = splitmix64(seed ^ splitmix64(static_cast<unsigned long long>(i)));
  const float u1 = (static_cast<float>(r >> 40) + 1.f) * (1.f / 16777217.f);  // (0, 1]
  const float u2 = static_cast<float>((r >> 16) & 0xffffff) * (1.f / 16777216.f);
  return sqrtf(-2.f * logf(u1)) * cosf(6.283185307179586f * u2);
}

extern "C" __global__ void fill_normal(elem_t* x, long long n, unsigned long long seed, int bf16) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    x[i] = from_float(normal_at(seed, i), bf16);
  }
}

// fill_normal's draws plus `mean` rounded to FP8 e4m3 (float_to_e4m3: sm_89 and newer), one byte an
// element.
extern "C" __global__ void fill_normal_e4m3(fp8_t* x, long long n, unsigned long long seed, float mean) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    x[i] = float_to_e4m3(normal_at(seed, i) + mean);
  }
}

// The two conversions alone, for tests: n floats to e4m3 bytes as fill_normal_e4m3 rounds them, and
// n bytes to the fp32 values attn_reference_kv_fp8 reads.
extern "C" __global__ void quantize_e4m3(const float* x, fp8_t* out, long long n) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    out[i] = float_to_e4m3(x[i]);
  }
}

extern "C" __global__ void dequantize_e4m3(const fp8_t* x, float* out, long long n) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    out[i] = e4m3_to_float(x[i]);
  }
}

// A KV cache's pages [num_pages, page, heads_kv, d]: key j < seqlens[b] of sequence b (d is head_dim
// for K, head_dim_v for V) goes to row j % page of page block_table[b * pages_per_seq + j / page],
// with the value value(t, offset) gives (t 0 for K, 1 for V; offset = b * stride[0] + head *
// stride[1] + j * stride[2] + c, the contiguous element through p's K or V strides). Rows past a
// sequence's length are left as they were (the caller fills the pages with NaN first). head_dim_v 0
// writes no V (a latent cache: V is the first columns of K's pages).
template <class T, class Value>
__device__ __forceinline__ void write_pages(const AttnParams& p, int head_dim, int head_dim_v, T* k_pages, T* v_pages,
                                            const int* block_table, const int* seqlens, int page, int pages_per_seq,
                                            Value value) {
  T* dst_pages[2] = {k_pages, v_pages};
  for (int t = 0; t < 2; ++t) {
    const int d = t ? head_dim_v : head_dim;
    const long long* stride = t ? p.v_stride : p.k_stride;
    const long long n = static_cast<long long>(p.batch) * p.heads_kv * p.seqlen_k * d;
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
      const int c = static_cast<int>(i % d);
      const long long r = i / d;
      const int key = static_cast<int>(r % p.seqlen_k);
      const long long bh = r / p.seqlen_k;
      const int head = static_cast<int>(bh % p.heads_kv), batch = static_cast<int>(bh / p.heads_kv);
      if (key >= seqlens[batch]) continue;
      const long long pg = block_table[static_cast<long long>(batch) * pages_per_seq + key / page];
      const long long dst = ((pg * page + key % page) * p.heads_kv + head) * d + c;
      dst_pages[t][dst] = value(t, batch * stride[0] + head * stride[1] + key * stride[2] + c);
    }
  }
}

// scatter_pages moves the contiguous keys p.k, p.v ([batch, heads_kv, seqlen_k, d] through p's
// strides) into the pages: 16-bit elements; scatter_pages_e4m3 an FP8 cache's bytes (strides in bytes).
template <class T>
struct ContiguousKv {
  const T* src[2];
  __device__ T operator()(int t, long long offset) const { return src[t][offset]; }
};

extern "C" __global__ void scatter_pages(const AttnParams p, int head_dim, int head_dim_v, elem_t* k_pages,
                                         elem_t* v_pages, const int* block_table, const int* seqlens, int page,
                                         int pages_per_seq) {
  write_pages(p, head_dim, head_dim_v, k_pages, v_pages, block_table, seqlens, page, pages_per_seq,
              ContiguousKv<elem_t>{{static_cast<const elem_t*>(p.k), static_cast<const elem_t*>(p.v)}});
}

extern "C" __global__ void scatter_pages_e4m3(const AttnParams p, int head_dim, int head_dim_v, fp8_t* k_pages,
                                              fp8_t* v_pages, const int* block_table, const int* seqlens, int page,
                                              int pages_per_seq) {
  write_pages(p, head_dim, head_dim_v, k_pages, v_pages, block_table, seqlens, page, pages_per_seq,
              ContiguousKv<fp8_t>{{static_cast<const fp8_t*>(p.k), static_cast<const fp8_t*>(p.v)}});
}

// fill_pages_normal (fill_pages_normal_e4m3) writes the pages scatter_pages would after fill_normal
// (fill_normal_e4m3) drew the contiguous keys, without them: each element the draw of its contiguous
// offset (K from seed_k, V from seed_v and around v_mean), so the pages match bit for bit; p.k and
// p.v are not read. A paged problem's timing inputs, and its validation inputs once their references
// are computed, hold no contiguous K and V (AttnBuffers::contiguous_kv): a KV cache of 40% of the
// GPU's memory then fits as validation and timing inputs both.
struct DrawNormal {
  unsigned long long seed[2];
  int bf16;
  __device__ elem_t operator()(int t, long long offset) const { return from_float(normal_at(seed[t], offset), bf16); }
};
struct DrawE4m3 {
  unsigned long long seed[2];
  float v_mean;
  __device__ fp8_t operator()(int t, long long offset) const {
    return float_to_e4m3(normal_at(seed[t], offset) + (t ? v_mean : 0.f));
  }
};

extern "C" __global__ void fill_pages_normal(const AttnParams p, int head_dim, int head_dim_v, elem_t* k_pages,
                                             elem_t* v_pages, const int* block_table, const int* seqlens, int page,
                                             int pages_per_seq, unsigned long long seed_k, unsigned long long seed_v,
                                             int bf16) {
  write_pages(p, head_dim, head_dim_v, k_pages, v_pages, block_table, seqlens, page, pages_per_seq,
              DrawNormal{{seed_k, seed_v}, bf16});
}

extern "C" __global__ void fill_pages_normal_e4m3(const AttnParams p, int head_dim, int head_dim_v, fp8_t* k_pages,
                                                  fp8_t* v_pages, const int* block_table, const int* seqlens, int page,
                                                  int pages_per_seq, unsigned long long seed_k,
                                                  unsigned long long seed_v, float v_mean) {
  write_pages(p, head_dim, head_dim_v, k_pages, v_pages, block_table, seqlens, page, pages_per_seq,
              DrawE4m3{{seed_k, seed_v}, v_mean});
}

// Compares a candidate's strided output with the fp32 and same-dtype references.
// stats[0] = max|out - ref32|, stats[1] = max|lowp - ref32|, stats[2] = max|lse - lse_ref|
// (finite rows), as float bits (non-negative floats order like their bit patterns);
// counts[0] = non-finite output elements, counts[1] = LSE mismatches in finiteness. A varlen
// batch's rows are (head, packed row), as attn_reference wrote them: every packed row is some
// sequence's. head_dim is O's (the problem's value head dim).
// lse_low (nullable): the same-dtype reference's LSE, whose error stats[3] gets (the FP8 forward's LSE
// bound; other problems' LSE is checked against a fixed tolerance).
extern "C" __global__ void compare_outputs(const AttnParams p, int head_dim, int bf16,
                                           const float* ref32, const float* reflow,
                                           const float* lse_ref, unsigned* stats, unsigned* counts,
                                           const float* lse_low) {
  const bool varlen = p.cu_seqlens_q != 0;
  const long long total_q = varlen ? p.cu_seqlens_q[p.batch] : 0;
  const long long rows = varlen ? p.heads_q * total_q : static_cast<long long>(p.batch) * p.heads_q * p.seqlen_q;
  const elem_t* o = static_cast<const elem_t*>(p.o);
  float e_out = 0.f, e_low = 0.f, e_lse = 0.f, e_lse_low = 0.f;
  unsigned nonfinite = 0, lse_bad = 0;
  for (long long r = blockIdx.x * static_cast<long long>(blockDim.y) + threadIdx.y; r < rows;
       r += static_cast<long long>(gridDim.x) * blockDim.y) {
    const elem_t* orow;
    if (varlen) {
      const long long t = r % total_q;
      const int head = static_cast<int>(r / total_q);
      orow = o + head * p.o_stride[1] + t * p.o_stride[2];
    } else {
      const int row = static_cast<int>(r % p.seqlen_q);
      const long long bh = r / p.seqlen_q;
      const int head = static_cast<int>(bh % p.heads_q), batch = static_cast<int>(bh / p.heads_q);
      orow = o + batch * p.o_stride[0] + head * p.o_stride[1] + row * p.o_stride[2];
    }
    for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
      const float x = to_float(orow[c], bf16), ref = ref32[r * head_dim + c];
      if (!isfinite(x)) ++nonfinite;
      else e_out = fmaxf(e_out, fabsf(x - ref));
      e_low = fmaxf(e_low, fabsf(reflow[r * head_dim + c] - ref));
    }
    if (lse_low && threadIdx.x == 0 && isfinite(lse_ref[r]) && isfinite(lse_low[r]))
      e_lse_low = fmaxf(e_lse_low, fabsf(lse_low[r] - lse_ref[r]));
    if (p.lse && threadIdx.x == 0) {
      const float a = p.lse[r], b = lse_ref[r];
      if (isfinite(b)) {
        if (!isfinite(a)) ++lse_bad;
        else e_lse = fmaxf(e_lse, fabsf(a - b));
      } else if (!(isinf(a) && a < 0)) {
        ++lse_bad;
      }
    }
  }
  atomicMax(&stats[0], __float_as_uint(e_out));
  atomicMax(&stats[1], __float_as_uint(e_low));
  atomicMax(&stats[2], __float_as_uint(e_lse));
  if (lse_low) atomicMax(&stats[3], __float_as_uint(e_lse_low));
  if (nonfinite) atomicAdd(&counts[0], nonfinite);
  if (lse_bad) atomicAdd(&counts[1], lse_bad);
}

// ---- The backward pass (the header) ------------------------------------------------------------

// The dQ and dK/dV kernels say __launch_bounds__(256, 1): with 256 alone, NVRTC 13's ptxas holds them
// to 64 registers and spills their accumulators (tests/unit/eval/test_kv_fp8_inputs.cpp checks).
constexpr int kBwdRows = 8;    // rows per CTA, a warp each: query rows (dQ, D) or key rows (dK, dV)
constexpr int kBwdChunk = 32;  // keys (dQ) or query rows (dK, dV) a step, a lane each

// The score of a raw dot product s = q.k, in place (scale * s; soft-capped: C tanh(scale * s / C),
// the forward's; rounded to the dtype with lowp), and its derivative's factor beyond the scale: 1 -
// tanh^2 under a soft-cap (dS with respect to scale * q.k is P (dP - D) (1 - tanh^2)), else 1.
__device__ __forceinline__ float softcap_bwd(float& s, const AttnParams& p, int lowp, int bf16) {
  s *= p.scale;
  float d = 1.f;
  if (p.variant.softcap > 0.f) {
    const float t = tanhf(s / p.variant.softcap);
    s = p.variant.softcap * t;
    d = 1.f - t * t;
  }
  if (lowp) s = round_to(s, bf16);
  return d;
}

// The lane's dot product of this warp's row `a_row` of A (a row per warp; a_row < 0: none, the lane's
// value unused) with row r0 + lane of B (rows at and past b_rows read as zeros), over `cols` columns
// in blocks of kCols, each block in column order: sum_c fmaf(a_c, b_c, acc), the forward's order. Every
// thread of the CTA calls it (it holds the CTA's barriers).
__device__ __forceinline__ float warp_row_dot(float (*srow)[kCols], elem_t (*schunk)[kCols + kPad], const elem_t* a,
                                              long long a_stride, int a_row, const elem_t* b, long long b_stride,
                                              int b_rows, int r0, int cols, int bf16) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float acc = 0.f;
  for (int cb = 0; cb < cols; cb += kCols) {
    const int w = min(kCols, cols - cb);
    __syncthreads();  // the previous block (or step) fully consumed
    if (a_row >= 0)
      for (int c = lane; c < w; c += 32) srow[warp][c] = to_float(a[a_row * a_stride + cb + c], bf16);
    for (int i = threadIdx.x; i < kBwdChunk * w; i += blockDim.x) {
      const int r = i / w, c = i % w, row = r0 + r;
      schunk[r][c] = row < b_rows ? b[row * b_stride + cb + c] : elem_t(0);
    }
    __syncthreads();
    for (int c = 0; c < w; ++c) acc = fmaf(srow[warp][c], to_float(schunk[lane][c], bf16), acc);
  }
  return acc;
}

// Rows r0..r0+31 of B, columns [cb, cb + w), into schunk (rows at and past b_rows zeros); every thread
// calls it.
__device__ __forceinline__ void load_chunk(elem_t (*schunk)[kCols + kPad], const elem_t* b, long long b_stride,
                                           int b_rows, int r0, int cb, int w) {
  __syncthreads();
  for (int i = threadIdx.x; i < kBwdChunk * w; i += blockDim.x) {
    const int r = i / w, c = i % w, row = r0 + r;
    schunk[r][c] = row < b_rows ? b[row * b_stride + cb + c] : elem_t(0);
  }
  __syncthreads();
}

// The backward kernels' sequence `batch`: its lengths, first packed rows (varlen: bp.fwd.cu_seqlens_q
// set; 0 dense) and the row index of (head, row 0) in the [batch, heads, len] (varlen: [heads,
// total]) layout of the LSE, D and the gradients (q_rows: heads_q's; k_rows: heads_kv's).
struct BwdSeqRef {
  int len_q, len_k, q0, k0;
  __device__ long long q_rows(const AttnParams& p, int batch, int head) const {
    return p.cu_seqlens_q ? static_cast<long long>(head) * p.cu_seqlens_q[p.batch] + q0
                          : (static_cast<long long>(batch) * p.heads_q + head) * p.seqlen_q;
  }
  __device__ long long k_rows(const AttnParams& p, int batch, int kv_head) const {
    return p.cu_seqlens_k ? static_cast<long long>(kv_head) * p.cu_seqlens_k[p.batch] + k0
                          : (static_cast<long long>(batch) * p.heads_kv + kv_head) * p.seqlen_k;
  }
};
__device__ __forceinline__ BwdSeqRef bwd_seq_ref(const AttnParams& p, int batch) {
  BwdSeqRef s;
  const bool varlen = p.cu_seqlens_q != 0;
  s.q0 = varlen ? p.cu_seqlens_q[batch] : 0;
  s.k0 = varlen ? p.cu_seqlens_k[batch] : 0;
  s.len_q = varlen ? p.cu_seqlens_q[batch + 1] - s.q0 : p.seqlen_q;
  s.len_k = varlen ? p.cu_seqlens_k[batch + 1] - s.k0 : p.seqlen_k;
  return s;
}

// D_i = sum_c dO_ic O_ic (o: the forward's fp32 output, (batch, heads_q, seqlen_q, head_dim_v)
// contiguous), into dsum (batch, heads_q, seqlen_q). grid (ceil(seqlen_q / 8), heads_q, batch), block
// 256, a warp a row.
extern "C" __global__ void __launch_bounds__(256)
attn_bwd_rowdot(const BwdParams bp, int head_dim_v, int bf16, const float* o, float* dsum) {
  const AttnParams& p = bp.fwd;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int head = blockIdx.y, batch = blockIdx.z, row = blockIdx.x * kBwdRows + warp;
  const BwdSeqRef sq = bwd_seq_ref(p, batch);
  if (row >= sq.len_q) return;  // no barrier below
  const long long r = sq.q_rows(p, batch, head) + row;
  const elem_t* d_o = static_cast<const elem_t*>(bp.dout) + batch * bp.do_stride[0] + head * bp.do_stride[1] +
                      (sq.q0 + row) * bp.do_stride[2];
  float acc = 0.f;
  for (int c = lane; c < head_dim_v; c += 32) acc = fmaf(to_float(d_o[c], bf16), o[r * head_dim_v + c], acc);
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) dsum[r] = acc;
}

// dQ. grid (ceil(seqlen_q / 8), heads_q, batch), block 256: a warp per query row, the CTA's keys 32 at
// a time (those some row of the CTA sees), dQ's columns kCols at a time (a pass over the keys each).
// lse and dsum: (batch, heads_q, seqlen_q); dq_out (batch, heads_q, seqlen_q, head_dim).
extern "C" __global__ void __launch_bounds__(256, 1)
attn_reference_bwd_dq(const BwdParams bp, int head_dim, int head_dim_v, int bf16, int causal, int lowp,
                      const float* lse, const float* dsum, float* dq_out) {
  const AttnParams& p = bp.fwd;
  __shared__ float srow[kBwdRows][kCols];
  __shared__ elem_t schunk[kBwdChunk][kCols + kPad];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int head = blockIdx.y, batch = blockIdx.z, kv_head = head / p.q_per_kv;
  const BwdSeqRef sq = bwd_seq_ref(p, batch);
  const int seqlen_q = sq.len_q, seqlen_k = sq.len_k;
  // A CTA past a varlen sequence's rows has nothing to do (the whole CTA leaves: no barrier waits).
  if (int(blockIdx.x) * kBwdRows >= seqlen_q) return;
  const int row = blockIdx.x * kBwdRows + warp;
  const bool active = row < seqlen_q;
  const int diag = seqlen_k - seqlen_q;
  const int left = p.variant.window_left, right = causal ? 0 : p.variant.window_right;
  auto visible = [&](int r) { return right >= 0 ? min(seqlen_k, max(0, r + diag + right + 1)) : seqlen_k; };
  auto first = [&](int r) { return left >= 0 ? min(seqlen_k, max(0, r + diag - left)) : 0; };
  const int limit = active ? visible(row) : 0, start = active ? first(row) : 0;
  const int block_limit = visible(min(seqlen_q - 1, int(blockIdx.x) * kBwdRows + kBwdRows - 1));
  const int block_start = first(int(blockIdx.x) * kBwdRows) / kBwdChunk * kBwdChunk;

  const elem_t* q = static_cast<const elem_t*>(p.q) + batch * p.q_stride[0] + head * p.q_stride[1] + sq.q0 * p.q_stride[2];
  const elem_t* k = static_cast<const elem_t*>(p.k) + batch * p.k_stride[0] + kv_head * p.k_stride[1] +
                    sq.k0 * p.k_stride[2];
  const elem_t* v = static_cast<const elem_t*>(p.v) + batch * p.v_stride[0] + kv_head * p.v_stride[1] +
                    sq.k0 * p.v_stride[2];
  const elem_t* d_o = static_cast<const elem_t*>(bp.dout) + batch * bp.do_stride[0] + head * bp.do_stride[1] +
                      sq.q0 * bp.do_stride[2];
  const long long r = sq.q_rows(p, batch, head) + row;
  const float lse_r = active ? lse[r] : 0.f, d_r = active ? dsum[r] : 0.f;
  const int a_row = active ? row : -1;

  for (int ob = 0; ob < head_dim; ob += kCols) {
    const int ow = min(kCols, head_dim - ob);
    float acc[kCols / 32];
#pragma unroll
    for (int t = 0; t < kCols / 32; ++t) acc[t] = 0.f;
    for (int c0 = block_start; c0 < block_limit; c0 += kBwdChunk) {
      float s = warp_row_dot(srow, schunk, q, p.q_stride[2], a_row, k, p.k_stride[2], seqlen_k, c0, head_dim, bf16);
      const float dcap = softcap_bwd(s, p, lowp, bf16);
      float dp = warp_row_dot(srow, schunk, d_o, bp.do_stride[2], a_row, v, p.v_stride[2], seqlen_k, c0, head_dim_v, bf16);
      if (lowp) dp = round_to(dp, bf16);
      const int key = c0 + lane;
      float ds = 0.f;
      if (key >= start && key < limit) {
        float pj = expf(s - lse_r);
        if (lowp) pj = round_to(pj, bf16);
        ds = pj * (dp - d_r) * dcap;
        if (lowp) ds = round_to(ds, bf16);
      }
      // dQ_i += dS_ij k_j over the chunk's keys, in key order, columns [ob, ob + ow).
      load_chunk(schunk, k + ob, p.k_stride[2], seqlen_k, c0, 0, ow);
      for (int kk = 0; kk < kBwdChunk; ++kk) {
        const float dsk = __shfl_sync(0xffffffffu, ds, kk);
#pragma unroll
        for (int t = 0; t < kCols / 32; ++t) {
          const int c = lane + 32 * t;
          if (c < ow) acc[t] = fmaf(dsk, to_float(schunk[kk][c], bf16), acc[t]);
        }
      }
    }
    if (active) {
#pragma unroll
      for (int t = 0; t < kCols / 32; ++t) {
        const int c = lane + 32 * t;
        if (c < ow) {
          const float x = acc[t] * p.scale;
          dq_out[r * head_dim + ob + c] = lowp ? round_to(x, bf16) : x;
        }
      }
    }
  }
}

// dK and dV. grid (ceil(seqlen_k / 8), heads_kv, batch), block 256: a warp per key row, the query
// rows of each of the KV head's query heads 32 at a time (chunks no key of the CTA is seen from are
// skipped), the columns kCols at a time (dK's of head_dim, dV's of head_dim_v; a pass each). lse and
// dsum: (batch, heads_q, seqlen_q); dk_out (batch, heads_kv, seqlen_k, head_dim), dv_out (batch,
// heads_kv, seqlen_k, head_dim_v).
extern "C" __global__ void __launch_bounds__(256, 1)
attn_reference_bwd_dkdv(const BwdParams bp, int head_dim, int head_dim_v, int bf16, int causal, int lowp,
                        const float* lse, const float* dsum, float* dk_out, float* dv_out) {
  const AttnParams& p = bp.fwd;
  __shared__ float srow[kBwdRows][kCols];
  __shared__ elem_t schunk[kBwdChunk][kCols + kPad];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kv_head = blockIdx.y, batch = blockIdx.z;
  const BwdSeqRef sq = bwd_seq_ref(p, batch);
  const int seqlen_q = sq.len_q, seqlen_k = sq.len_k;
  if (int(blockIdx.x) * kBwdRows >= seqlen_k) return;  // past a varlen sequence's keys (no barrier waits)
  const int key = blockIdx.x * kBwdRows + warp;
  const bool active = key < seqlen_k;
  const int diag = seqlen_k - seqlen_q;
  const int left = p.variant.window_left, right = causal ? 0 : p.variant.window_right;
  // Query row i sees keys [first(i), visible(i)); both grow with i.
  auto visible = [&](int i) { return right >= 0 ? min(seqlen_k, max(0, i + diag + right + 1)) : seqlen_k; };
  auto first = [&](int i) { return left >= 0 ? min(seqlen_k, max(0, i + diag - left)) : 0; };
  const int j0 = blockIdx.x * kBwdRows, j1 = min(seqlen_k, j0 + kBwdRows);  // the CTA's keys

  const elem_t* k = static_cast<const elem_t*>(p.k) + batch * p.k_stride[0] + kv_head * p.k_stride[1] +
                    sq.k0 * p.k_stride[2];
  const elem_t* v = static_cast<const elem_t*>(p.v) + batch * p.v_stride[0] + kv_head * p.v_stride[1] +
                    sq.k0 * p.v_stride[2];
  const long long out_row = sq.k_rows(p, batch, kv_head) + key;
  const int a_row = active ? key : -1;
  const int cols = max(head_dim, head_dim_v);

  for (int ob = 0; ob < cols; ob += kCols) {
    const int kw = max(0, min(kCols, head_dim - ob)), vw = max(0, min(kCols, head_dim_v - ob));
    float dk[kCols / 32], dv[kCols / 32];
#pragma unroll
    for (int t = 0; t < kCols / 32; ++t) dk[t] = dv[t] = 0.f;
    for (int g = 0; g < p.q_per_kv; ++g) {
      const int head = kv_head * p.q_per_kv + g;
      const elem_t* q = static_cast<const elem_t*>(p.q) + batch * p.q_stride[0] + head * p.q_stride[1] +
                        sq.q0 * p.q_stride[2];
      const elem_t* d_o = static_cast<const elem_t*>(bp.dout) + batch * bp.do_stride[0] + head * bp.do_stride[1] +
                          sq.q0 * bp.do_stride[2];
      const long long row0 = sq.q_rows(p, batch, head);
      float dkh[kCols / 32], dvh[kCols / 32];  // this query head's contribution
#pragma unroll
      for (int t = 0; t < kCols / 32; ++t) dkh[t] = dvh[t] = 0.f;
      for (int i0 = 0; i0 < seqlen_q; i0 += kBwdChunk) {
        // The chunk's rows see keys [first(i0), visible(last)): none of the CTA's, skip it (the same
        // for the whole CTA).
        if (!(first(i0) < j1 && visible(min(seqlen_q - 1, i0 + kBwdChunk - 1)) > j0)) continue;
        float s = warp_row_dot(srow, schunk, k, p.k_stride[2], a_row, q, p.q_stride[2], seqlen_q, i0, head_dim, bf16);
        const float dcap = softcap_bwd(s, p, lowp, bf16);
        float dp = warp_row_dot(srow, schunk, v, p.v_stride[2], a_row, d_o, bp.do_stride[2], seqlen_q, i0, head_dim_v,
                                bf16);
        if (lowp) dp = round_to(dp, bf16);
        const int i = i0 + lane;
        float pj = 0.f, ds = 0.f;
        if (active && i < seqlen_q && key >= first(i) && key < visible(i)) {
          pj = expf(s - lse[row0 + i]);
          if (lowp) pj = round_to(pj, bf16);
          ds = pj * (dp - dsum[row0 + i]) * dcap;
          if (lowp) ds = round_to(ds, bf16);
        }
        // dV_j += P_ij dO_i and dK_j += dS_ij q_i over the chunk's rows, in row order.
        if (vw > 0) {
          load_chunk(schunk, d_o + ob, bp.do_stride[2], seqlen_q, i0, 0, vw);
          for (int ii = 0; ii < kBwdChunk; ++ii) {
            const float pk = __shfl_sync(0xffffffffu, pj, ii);
#pragma unroll
            for (int t = 0; t < kCols / 32; ++t) {
              const int c = lane + 32 * t;
              if (c < vw) dvh[t] = fmaf(pk, to_float(schunk[ii][c], bf16), dvh[t]);
            }
          }
        }
        if (kw > 0) {
          load_chunk(schunk, q + ob, p.q_stride[2], seqlen_q, i0, 0, kw);
          for (int ii = 0; ii < kBwdChunk; ++ii) {
            const float dsk = __shfl_sync(0xffffffffu, ds, ii);
#pragma unroll
            for (int t = 0; t < kCols / 32; ++t) {
              const int c = lane + 32 * t;
              if (c < kw) dkh[t] = fmaf(dsk, to_float(schunk[ii][c], bf16), dkh[t]);
            }
          }
        }
      }
      // The head's contribution, rounded as a same-dtype framework's per-head gradient is before the
      // group's sum.
#pragma unroll
      for (int t = 0; t < kCols / 32; ++t) {
        const float kx = dkh[t] * p.scale, vx = dvh[t];
        dk[t] += lowp ? round_to(kx, bf16) : kx;
        dv[t] += lowp ? round_to(vx, bf16) : vx;
      }
    }
    if (active) {
#pragma unroll
      for (int t = 0; t < kCols / 32; ++t) {
        const int c = lane + 32 * t;
        if (c < kw) dk_out[out_row * head_dim + ob + c] = lowp ? round_to(dk[t], bf16) : dk[t];
        if (c < vw) dv_out[out_row * head_dim_v + ob + c] = lowp ? round_to(dv[t], bf16) : dv[t];
      }
    }
  }
}

// Compares a candidate's strided 16-bit gradient x (batch, heads, len, dim; strides {batch, head, row}
// in elements) with the fp32 and same-dtype references (contiguous): stats[0] = max|x - ref32| (finite
// elements), stats[1] = max|lowp - ref32|, as float bits; counts[0] = non-finite elements of x.
extern "C" __global__ void compare_grad(const elem_t* x, long long sb, long long sh, long long sr, int batch, int heads,
                                        int len, int dim, int bf16, const float* ref32, const float* reflow,
                                        unsigned* stats, unsigned* counts) {
  const long long rows = static_cast<long long>(batch) * heads * len;
  float e_out = 0.f, e_low = 0.f;
  unsigned nonfinite = 0;
  for (long long r = blockIdx.x * static_cast<long long>(blockDim.y) + threadIdx.y; r < rows;
       r += static_cast<long long>(gridDim.x) * blockDim.y) {
    const int row = static_cast<int>(r % len);
    const long long bh = r / len;
    const int head = static_cast<int>(bh % heads), b = static_cast<int>(bh / heads);
    const elem_t* xr = x + b * sb + head * sh + row * sr;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
      const float v = to_float(xr[c], bf16), ref = ref32[r * dim + c];
      if (!isfinite(v)) ++nonfinite;
      else e_out = fmaxf(e_out, fabsf(v - ref));
      e_low = fmaxf(e_low, fabsf(reflow[r * dim + c] - ref));
    }
  }
  atomicMax(&stats[0], __float_as_uint(e_out));
  atomicMax(&stats[1], __float_as_uint(e_low));
  if (nonfinite) atomicAdd(&counts[0], nonfinite);
}

// src (batch, heads, len, dim) fp32 contiguous into dst in the dtype (round to nearest), through dst's
// strides {batch, head, row} in elements: the forward's O as a backward call's input.
extern "C" __global__ void store_rounded(const float* src, elem_t* dst, long long sb, long long sh, long long sr,
                                         int batch, int heads, int len, int dim, int bf16) {
  const long long n = static_cast<long long>(batch) * heads * len * dim;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(i % dim);
    const long long r = i / dim;
    const int row = static_cast<int>(r % len);
    const long long bh = r / len;
    const int head = static_cast<int>(bh % heads), b = static_cast<int>(bh / heads);
    dst[b * sb + head * sh + row * sr + c] = from_float(src[i], bf16);
  }
}

}  // namespace att_ref
