// ---- templates/common/bwd_prepost.cuh: the backward families' preprocessing and conversion kernels
// (flash_bwd_mma, flash_bwd_wgmma), the steps before and after their main loops. Included after the
// family's traits, inside nothing: it reads the including kernel's `att::T` (kHeadDim, kBf16,
// kBlockM, kThreads) and BwdParams' workspaces, and defines
//   flash_bwd_preprocess  D_i = rowsum(dO_i * O_i), LSE_i * log2(e) and dQ's zeroed fp32 accumulator
//                         (and, when BwdParams::dq_semaphore is given, the deterministic mode's
//                         semaphore of each query block, zeroed; when cta_order is, a packed batch's
//                         CTA order, build_cta_order);
//   flash_bwd_convert     dQ = scale * accumulator, in the input dtype;
// and what both main loops use for dQ's fp32 additions (add_pair, add_pair2, add_quad) and the
// deterministic mode's semaphore (ld_acquire, add_release).
#ifndef ATTNTUNE_BWD_PREPOST_CUH
#define ATTNTUNE_BWD_PREPOST_CUH

#include "bwd_blocks.h"
#include "bwd_params.h"
#include "ptx.cuh"

namespace att {

// An fp16 value's bits as fp32 (exact).
__device__ __forceinline__ float half_to_float(unsigned short x) {
  float y;
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(y) : "h"(x));
  return y;
}

// Adds two consecutive floats into global memory (fire and forget): atomicAdds before sm_90.
__device__ __forceinline__ void add_pair(float* p, float a, float b) {
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
}
// The same by one vector reduction on sm_90 (REDG.ADD.F32x2: half the instructions; run 182: d=128
// from 216 to 267 TFLOP/s).
__device__ __forceinline__ void add_pair2(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
  add_pair(p, a, b);
#endif
}
// Adds four consecutive floats (16-byte aligned) by one vector reduction, sm_90's REDG.ADD.F32x4:
// a quarter of the instructions of scalar atomicAdds, after two shuffles (run 183: d=64 +9%; d=128
// -7%, where the shuffles' registers spill). The space's dq_reduce picks it, on sm_90 only.
__device__ __forceinline__ void add_quad(float* p, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
#else
  add_pair(p, a, b);
  add_pair(p + 2, c, d);
#endif
}

// A semaphore (the deterministic mode's turns, bwd_blocks.h): a load that acquires (the adds of the
// CTAs that raised it are visible after it) and an increment that releases (this CTA's adds, fenced,
// before it), gpu scope.
__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void add_release(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// ---- the sequence of a CTA ---------------------------------------------------------------------
// Dense tensors (attntune_attention_backward): every sequence has seqlen_q query rows and seqlen_k
// keys, sequence b at b * stride[0]. A varlen build (ATT_VARLEN: attntune_attention_backward_varlen,
// packed tensors with strides {0, head, row}) reads sequence b's rows from cu_seqlens_q[b] and its
// keys from cu_seqlens_k[b], its lengths their differences; the grids cover the longest (seqlen_q,
// seqlen_k are max_seqlen_q, max_seqlen_k), and a CTA past its sequence's rows or keys does nothing.
// The workspaces (dq_accum, dpsum, lse_log2, dq_semaphore) are runs of seqlen_q_rounded rows: one
// a (batch, query head), dense; one a query head, varlen, holding every sequence's rows from
// ws0 = floor((cu_seqlens_q[b] + b * kBlockM) / kBlockM) * kBlockM, a multiple of the query block at
// least round_up(len, kBlockM) past the previous sequence's (so a query block's rows are the
// sequence's own), seqlen_q_rounded = floor((total_q + batch * kBlockM) / kBlockM) * kBlockM rows in all
// (bwd_launch.h). The forward's varlen LSE is [heads_q, total_q].
#if defined(ATT_VARLEN) && ATT_VARLEN
constexpr bool kBwdVarlen = true;
#else
constexpr bool kBwdVarlen = false;
#endif

struct BwdSeq {
  int len_q, len_k;
  long long q0, k0;  // the sequence's first query row and key in the packed tensors (0: dense)
  long long ws0;     // its first row in a head's run of the workspaces (0: dense)
};

__device__ __forceinline__ BwdSeq bwd_seq(const BwdParams& p, int b) {
  BwdSeq s;
  if constexpr (kBwdVarlen) {
    const int* cq = p.fwd.cu_seqlens_q;
    const int* ck = p.fwd.cu_seqlens_k;
    s.q0 = cq[b];
    s.k0 = ck[b];
    s.len_q = cq[b + 1] - cq[b];
    s.len_k = ck[b + 1] - ck[b];
    s.ws0 = (s.q0 + static_cast<long long>(b) * T::kBlockM) / T::kBlockM * T::kBlockM;
  } else {
    s.len_q = p.fwd.seqlen_q;
    s.len_k = p.fwd.seqlen_k;
    s.q0 = s.k0 = s.ws0 = 0;
  }
  return s;
}

// The workspaces' first row of (sequence b, query head `head`): its query row i is this + i.
__device__ __forceinline__ long long bwd_ws_row(const BwdParams& p, const BwdSeq& s, int b, int head) {
  if constexpr (kBwdVarlen) return static_cast<long long>(head) * p.seqlen_q_rounded + s.ws0;
  return (static_cast<long long>(b) * p.fwd.heads_q + head) * p.seqlen_q_rounded;
}

// Row 0 of (sequence b, head) in a tensor with strides {batch, head, row} (varlen: {0, head, row}),
// first row row0 (the sequence's q0 or k0), as an element offset.
__device__ __forceinline__ long long bwd_offset(const long long (&stride)[3], int b, int head, long long row0) {
  return b * stride[0] + head * stride[1] + row0 * stride[2];
}

// ---- a packed batch's CTA order (varlen_lpt) -------------------------------------------------------
// A varlen grid sized by the longest sequence idles where the others are shorter, and its order
// (key blocks fastest, then KV heads, then sequences) can leave a long sequence's walks for the last
// wave. With the traits' kVarlenLpt (g sequences a group) and BwdParams::cta_order given (bwd_launch.h:
// a call that is not deterministic), block (0, 0, 0) of the preprocessing kernel lists the batch's
// (sequence, key block) pairs group by group (sequences [0, g), [g, 2g), ...), each group's sorted
// by their walks (bwd_blocks.h's walk_blocks: the query blocks the pair's CTAs step through a query
// head), longest first, and the main kernel's grid is (grid rows, slots), one CTA a slot and grid row
// (the KV head, with flash_bwd_mma's dkv_split part), a slot's rows side by side: the hardware hands
// out CTAs in that order as SMs free up, longest-processing-time-first list scheduling within a group
// of sequences. Groups keep the CTAs in flight on a few sequences' Q, dO and dQ (L2's reuse: one
// group of every pair lost 1-19% on dense causal shapes and 3-8% on a b16 batch, runs 335-336); a
// group as large as the batch sorts it whole (+11-22% on a b8 one, run 332). A counting sort:
// kOrderGroups x kWalkBuckets buckets (groups past the last share it, walks past the last bucket
// share that), each pair's place from a shared-memory atomicAdd on its bucket's start, so ties land
// in any order (the deterministic mode needs a sequence's lower key blocks first and does not take
// this order). Slots past the batch's pairs read -1: their CTAs end at once.
constexpr int kOrderGroups = 16, kWalkBuckets = 256, kOrderBuckets = kOrderGroups * kWalkBuckets;
// Every (sequence, key block) pair of the batch once, a warp a sequence and a lane a key block, into
// its bucket: counted (kPlace false), or given the bucket's next place in the order (true).
template <class Tr, bool kPlace>
__device__ __forceinline__ void sort_pairs(const BwdParams& p, int* bucket) {
  constexpr int kWarps = Tr::kThreads / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int* cq = p.fwd.cu_seqlens_q;
  const int* ck = p.fwd.cu_seqlens_k;
  for (int b = warp; b < p.fwd.batch; b += kWarps) {
    const int len_q = cq[b + 1] - cq[b], len_k = ck[b + 1] - ck[b];
    const int group = min(b / Tr::kVarlenLpt, kOrderGroups - 1);
    for (int kb = lane; kb * Tr::kBlockN < len_k; kb += 32) {
      const int w =
          att_bwd::walk_blocks<Tr::kCausal, Tr::kWindow>(kb, Tr::kBlockN, Tr::kBlockM, len_q, len_k, p.fwd.variant);
      // The group's bucket 0: its longest walks.
      const int at = atomicAdd(&bucket[group * kWalkBuckets + kWalkBuckets - 1 - min(w, kWalkBuckets - 1)], 1);
      if (kPlace && at < p.cta_slots) {  // (always, where total_k is the batch's: bwd_launch.h sizes the slots)
        p.cta_order[2 * at] = b;
        p.cta_order[2 * at + 1] = kb;
      }
    }
  }
}
template <class Tr>
__device__ __forceinline__ void build_cta_order(const BwdParams& p) {
  __shared__ int bucket[kOrderBuckets];  // counts, then each bucket's next place
  __shared__ int warp_total[32];
  __shared__ int pairs;
  constexpr int kPer = (kOrderBuckets + Tr::kThreads - 1) / Tr::kThreads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int i = tid; i < kOrderBuckets; i += Tr::kThreads) bucket[i] = 0;
  __syncthreads();
  sort_pairs<Tr, false>(p, bucket);
  __syncthreads();
  // Each bucket's first place: an exclusive scan over the buckets (a thread's kPer, then its warp's
  // threads, then the warps).
  int mine[kPer], sum = 0;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int i = tid * kPer + k;
    mine[k] = i < kOrderBuckets ? bucket[i] : 0;
    sum += mine[k];
  }
  int incl = sum;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int x = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += x;
  }
  if (lane == 31) warp_total[warp] = incl;
  __syncthreads();
  int base = incl - sum;
  for (int w = 0; w < warp; ++w) base += warp_total[w];
  if (tid == Tr::kThreads - 1) pairs = base + sum;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int i = tid * kPer + k;
    if (i < kOrderBuckets) bucket[i] = base;
    base += mine[k];
  }
  __syncthreads();
  sort_pairs<Tr, true>(p, bucket);
  for (int i = pairs + tid; i < p.cta_slots; i += Tr::kThreads) p.cta_order[2 * i] = -1;
}

// The main kernel's CTA: its key block, grid row (y: the KV head, with flash_bwd_mma's dkv_split
// part) and sequence. From the preprocessing kernel's order where the call has one (above; *none: a
// slot past the batch's pairs, nothing to do), else from its block index (bwd_blocks.h's cta_block).
template <class Tr>
__device__ __forceinline__ att_bwd::CtaBlock bwd_cta(const BwdParams& p, bool* none) {
  *none = false;
  if constexpr (kBwdVarlen && Tr::kVarlenLpt > 0) {
    if (p.cta_order) {  // grid (rows, slots): a slot's rows side by side, the slots in the sorted order
      const int b = p.cta_order[2 * blockIdx.y];
      *none = b < 0;
      return att_bwd::CtaBlock{*none ? 0 : p.cta_order[2 * blockIdx.y + 1], static_cast<int>(blockIdx.x), *none ? 0 : b};
    }
  }
  return att_bwd::cta_block<Tr::kLongestFirst>(blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, gridDim.y, gridDim.z);
}

// ---- the main loops' recomputed probabilities --------------------------------------------------
// P of a raw score x = q.k whose row has lse2 = LSE * log2(e): 2^(x scale log2(e) - lse2), or under
// a soft-cap C (the forward's score C tanh(scale x / C)) 2^(C log2(e) tanh(x softcap_scale) - lse2);
// `dcap` is dS's extra factor, the cap's derivative 1 - tanh^2 (1 without a cap). The accurate tanh
// whatever the forward used: the gradient of the score the reference defines.
template <bool kSoftcap>
__device__ __forceinline__ float bwd_prob(float x, float lse2, const AttnParams& f, float& dcap) {
  if constexpr (kSoftcap) {
    const float th = tanh_accurate(x * f.variant.softcap_scale);
    dcap = fmaf(-th, th, 1.f);
    return ex2(fmaf(th, f.variant.softcap * 1.4426950408889634f, -lse2));
  } else {
    dcap = 1.f;
    return ex2(fmaf(x, f.scale_log2, -lse2));
  }
}

// ---- preprocessing ----------------------------------------------------------------------------
// grid (seqlen_q_rounded / kBlockM, heads_q, batch), varlen (ceil(max_seqlen_q / kBlockM), heads_q,
// batch): rows [m0, m0 + kBlockM) of one (sequence, head).
extern "C" __global__ void __launch_bounds__(T::kThreads) flash_bwd_preprocess(const BwdParams p) {
  const AttnParams& f = p.fwd;
  const int head = blockIdx.y, b = blockIdx.z, m0 = blockIdx.x * T::kBlockM;
  if constexpr (kBwdVarlen && T::kVarlenLpt > 0) {
    if (p.cta_order && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) build_cta_order<T>(p);
  }
  const BwdSeq seq = bwd_seq(p, b);
  // Varlen: the blocks past the sequence's rows (the grid covers the longest) own no rows of it.
  if (kBwdVarlen && m0 >= seq.len_q) return;
  const long long row_base = bwd_ws_row(p, seq, b, head);
  constexpr int kChunks = T::kHeadDim / 8;  // 8 or 16 lanes a row
  constexpr int kRowsPerPass = T::kThreads / kChunks;
  const int r = threadIdx.x / kChunks, c = threadIdx.x % kChunks;
  // The deterministic mode's turn counter of this query block (one CTA here a block): 0, no CTA of
  // the main kernel has added its share yet.
  if (p.dq_semaphore && threadIdx.x == 0) p.dq_semaphore[(row_base + m0) / T::kBlockM] = 0;
  const elem_t* o = static_cast<const elem_t*>(f.o) + bwd_offset(f.o_stride, b, head, seq.q0);
  const elem_t* d_o = static_cast<const elem_t*>(p.dout) + bwd_offset(p.do_stride, b, head, seq.q0);
  // The LSE of the sequence's row 0: [batch, heads_q, seqlen_q], or varlen [heads_q, total_q].
  const long long lse0 = kBwdVarlen ? static_cast<long long>(head) * f.cu_seqlens_q[f.batch] + seq.q0
                                    : (static_cast<long long>(b) * f.heads_q + head) * f.seqlen_q;
  for (int row = m0 + r; row < m0 + T::kBlockM; row += kRowsPerPass) {
    float dot = 0.f;
    if (row < seq.len_q && (!T::kPadded || c * 8 < T::kHeadDimReal)) {  // (a padded column adds nothing)
      const uint4 x = *reinterpret_cast<const uint4*>(o + row * f.o_stride[2] + c * 8);
      const uint4 y = *reinterpret_cast<const uint4*>(d_o + row * p.do_stride[2] + c * 8);
      const u32 xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float x0, x1, y0, y1;
        if (T::kBf16) {
          x0 = __uint_as_float(xs[i] << 16), x1 = __uint_as_float(xs[i] & 0xffff0000u);
          y0 = __uint_as_float(ys[i] << 16), y1 = __uint_as_float(ys[i] & 0xffff0000u);
        } else {
          x0 = half_to_float(static_cast<unsigned short>(xs[i] & 0xffff));
          x1 = half_to_float(static_cast<unsigned short>(xs[i] >> 16));
          y0 = half_to_float(static_cast<unsigned short>(ys[i] & 0xffff));
          y1 = half_to_float(static_cast<unsigned short>(ys[i] >> 16));
        }
        dot = fmaf(x0, y0, dot);
        dot = fmaf(x1, y1, dot);
      }
    }
#pragma unroll
    for (int s = kChunks / 2; s >= 1; s >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, s);
    if (c == 0) {
      p.dpsum[row_base + row] = row < seq.len_q ? dot : 0.f;
      const float lse = row < seq.len_q ? f.lse[lse0 + row] : __int_as_float(0x7f800000);
      p.lse_log2[row_base + row] = lse * 1.4426950408889634f;
    }
    float4* acc = reinterpret_cast<float4*>(p.dq_accum + (row_base + row) * T::kHeadDim + c * 8);
    acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
    acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// ---- conversion -------------------------------------------------------------------------------
// dQ's accumulator is row-major ([rows][head_dim] fp32) unless the family's traits say otherwise:
// a Traits with kDqFragmentOrder true keeps some rows in another order and gives each (row, column)
// its place by Traits::dq_offset(row_base, row, col) (flash_bwd_wgmma's bulk reductions).
template <class Tr, class = void>
struct DqFragmentOrder {
  static constexpr bool value = false;
};
template <class Tr>
struct DqFragmentOrder<Tr, decltype(void(Tr::kDqFragmentOrder))> {
  static constexpr bool value = Tr::kDqFragmentOrder;
};

// Floats between a row's columns col and col + 1 (even col) in the accumulator: 1 unless the traits
// say otherwise (kDqPairStride: flash_bwd_mma's frag order keeps them 32 apart).
template <class Tr, class = void>
struct DqPairStride {
  static constexpr int value = 1;
};
template <class Tr>
struct DqPairStride<Tr, decltype(void(Tr::kDqPairStride))> {
  static constexpr int value = Tr::kDqPairStride;
};

// Eight consecutive columns from col of a row of the accumulator, scaled, in the dtype.
template <class Tr>
__device__ __forceinline__ uint4 dq_row_chunk(const float* acc, long long row_base, int row, int col, float scale) {
  uint4 out;
  if constexpr (!DqFragmentOrder<Tr>::value) {
    const float4* a = reinterpret_cast<const float4*>(acc + (row_base + row) * Tr::kHeadDim + col);
    const float4 x = a[0], y = a[1];
    out.x = pack2<Tr::kBf16>(x.x * scale, x.y * scale);
    out.y = pack2<Tr::kBf16>(x.z * scale, x.w * scale);
    out.z = pack2<Tr::kBf16>(y.x * scale, y.y * scale);
    out.w = pack2<Tr::kBf16>(y.z * scale, y.w * scale);
  } else {
    u32 o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float* a = acc + Tr::dq_offset(row_base, row, col + 2 * i);
      float2 x;
      if constexpr (DqPairStride<Tr>::value == 1) x = *reinterpret_cast<const float2*>(a);
      else x = make_float2(a[0], a[DqPairStride<Tr>::value]);
      o[i] = pack2<Tr::kBf16>(x.x * scale, x.y * scale);
    }
    out = make_uint4(o[0], o[1], o[2], o[3]);
  }
  return out;
}

// grid (ceil(seqlen_q / kBlockM), heads_q, batch): dQ = scale * accumulator for the sequence's rows.
extern "C" __global__ void __launch_bounds__(T::kThreads) flash_bwd_convert(const BwdParams p) {
  const AttnParams& f = p.fwd;
  const int head = blockIdx.y, b = blockIdx.z, m0 = blockIdx.x * T::kBlockM;
  constexpr int kChunks = T::kHeadDim / 8;
  constexpr int kRowsPerPass = T::kThreads / kChunks;
  const int r = threadIdx.x / kChunks, c = threadIdx.x % kChunks;
  const BwdSeq seq = bwd_seq(p, b);
  const long long row_base = bwd_ws_row(p, seq, b, head);
  elem_t* dq = static_cast<elem_t*>(p.dq) + bwd_offset(p.dq_stride, b, head, seq.q0);
  if (T::kPadded && c * 8 >= T::kHeadDimReal) return;  // a padded column: not stored
  for (int row = m0 + r; row < min(m0 + T::kBlockM, seq.len_q); row += kRowsPerPass)
    *reinterpret_cast<uint4*>(dq + row * p.dq_stride[2] + c * 8) = dq_row_chunk<T>(p.dq_accum, row_base, row, c * 8, f.scale);
}

}  // namespace att

#endif  // ATTNTUNE_BWD_PREPOST_CUH
