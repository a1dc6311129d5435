// ---- templates/flash_decode_wgmma/kernel.cu: split-KV decode for head dims past flash_decode's
// registers (d 512, 576), sm_90a: multi-head latent attention over its latent cache (d=576, dv=512,
// one KV head, V = the cache's first 512 dims: ATT_LATENT, read once for both products) and
// 512-dim heads. README.md has the design; the host side (the plan: units, splits, workspaces,
// tensor maps) is flash_decode's (../flash_decode/launch.h, split.h, args.h), so a CTA's unit,
// split, keys and pieces are exactly flash_decode's.
//
// A CTA: one unit's row block (64 packed rows: the group's query heads times the queries) and one
// split's tiles of BLOCK_N keys. Warpgroup 2 is the producer (its first warp issues the TMA boxes K's column blocks, and V's unless
// latent, into a ring of STAGES on mbarriers). Warpgroups 0 and 1 consume: per tile, warpgroup w
// scores keys [w * BLOCK_N / 2, (w + 1) * BLOCK_N / 2) of all 64 rows (wgmma m64nN, Q and K from
// shared memory), the two exchange their rows' maxima (one barrier), each makes P of its keys and
// leaves its P fragments in shared memory (another), and each accumulates O's columns
// [w * dv / 2, (w + 1) * dv / 2) over all the tile's keys (wgmma m64n(dv/2) with P from registers:
// its own fragments and its partner's, which have the same thread layout). O's 64 x 256 fp32 of a
// warpgroup are 128 registers a thread, which is why d=512 needs two.
//
// An FP8 e4m3 cache at head dim 128 (ATT_KV_FP8; issue 42) runs another consumer, fp8.cuh's: one
// warpgroup, S = Q K^T and O^T = V^T P^T as FP8 wgmma over the cache's bytes as they lie.
#include "../common/ptx_sm90.cuh"
#include "../flash_decode/args.h"
#include "../flash_fwd_wgmma/wgmma.cuh"
#include "../flash_fwd_wgmma/wgmma_e4m3.cuh"

#ifndef ATT_LATENT
#define ATT_LATENT 0
#endif
#ifndef ATT_KV_FP8
#define ATT_KV_FP8 0
#endif

namespace att {

struct Traits {
  static constexpr int kHeadDim = ATT_HEAD_DIM;  // Q's and K's
#ifdef ATT_HEAD_DIM_V
  static constexpr int kHeadDimV = ATT_HEAD_DIM_V;
#else
  static constexpr int kHeadDimV = kHeadDim;
#endif
  static constexpr bool kBf16 = ATT_DTYPE_BF16 != 0;
  static constexpr bool kCausal = ATT_CAUSAL != 0;
  static constexpr bool kLatent = ATT_LATENT != 0;  // V is K's first kHeadDimV columns (one buffer)
  // An FP8 e4m3 cache (`kv_dtype=fp8`, head dim 128: fp8.cuh): rows of d bytes, which the host side
  // (flash_decode's plan) hands over as rows of d / 2 16-bit elements (kKDim, kVDim); one consumer
  // warpgroup whose FP8 wgmma read K and V as they lie, two CTAs an SM.
  static constexpr bool kKvFp8 = ATT_KV_FP8 != 0;
  static constexpr int kKDim = kKvFp8 ? kHeadDim / 2 : kHeadDim;    // a K row in 16-bit elements
  static constexpr int kVDim = kKvFp8 ? kHeadDimV / 2 : kHeadDimV;  // a V row likewise
  static constexpr int kElemBytes = kKvFp8 ? 1 : 2;                  // a cache element's bytes
  static constexpr int kCtasPerSm = kKvFp8 ? 2 : 1;
  static constexpr bool kLastCta = COMBINE == COMBINE_LAST_CTA;
  // The consumers' schedule (README.md): 0 serial, 1 fused (P_t V_t and S_{t+1} back to back), 2
  // overlap (S_{t+1} then P_t V_t, the softmax of tile t+1 while P_t V_t runs; three stages or more).
  static constexpr int kPipe = PIPE;
  // Who scores a tile's keys (README.md): split, each warpgroup half of them; single, warpgroup 0
  // all of them (wgmma N = BLOCK_N), warpgroup 1 P.V alone.
  static constexpr bool kSingle = SCORES == SCORES_SINGLE;
  static constexpr int kL2Ahead = L2_AHEAD;  // tiles past the ring prefetched into L2 (0: none)
  // multicast: the unit's two row blocks (adjacent CTAs of one split) run as a cluster of 2, each
  // producer loading half of a tile's column blocks into both CTAs' rings (one L2 read for both).
  static constexpr bool kMulticast = MULTICAST != 0;
  static constexpr int kPeers = kMulticast ? 2 : 1;
  // wg_uniform: the warpgroup index and Q's descriptor made warp-uniform by a shfl from lane 0, so
  // that ptxas keeps the descriptors (Q's k-step values, the wg-dependent K and V ones) in uniform
  // registers; without it each tile's Q descriptor comes out of an opaque `mov` (which keeps ptxas
  // from holding all d/16 k-step values across the loop) as a per-thread value, and every wgmma
  // waits for an R2UR pair (80 a tile in the MLA scorer's loop). A tunable with a default, as
  // flash_fwd_wgmma's: a config recorded before it is a build without it.
#if defined(WG_UNIFORM)
  static constexpr bool kWgUniform = WG_UNIFORM != 0;
#else
  static constexpr bool kWgUniform = false;
#endif

  static constexpr int kBlockM = BLOCK_M;  // 64
  static constexpr int kBlockN = BLOCK_N;
  static constexpr int kStages = STAGES;
  static constexpr int kThreads = THREADS;  // 2 consumer warpgroups (FP8: 1) + the producer warpgroup
  static constexpr int kConsumers = kKvFp8 ? 128 : 256;
  static constexpr int kHalfN = kBlockN / 2;     // keys a warpgroup scores
  static constexpr int kHalfV = kHeadDimV / 2;   // O's columns a warpgroup accumulates (wgmma N)
  static constexpr int kColBlocks = kKDim / 64, kColBlocksV = kVDim / 64;
  static constexpr int kHalfBlocks = (kColBlocks + 1) / 2, kHalfBlocksV = (kColBlocksV + 1) / 2;  // multicast's split
  static constexpr int kKSteps = kHeadDim / 16;  // Q.K^T's k16 steps
  static constexpr int kPSteps = kHalfN / 16;    // P.V's k16 steps over one warpgroup's keys
  static constexpr int kColBlock = kBlockN * 128;  // a K or V tile's column block: BLOCK_N rows of 128 bytes

  // Dynamic shared memory, in this order (search_spaces/flash_decode_wgmma.yaml's smem_bytes).
  // (FP8: Q's two e4m3 pieces, kQPiece bytes each, hi then lo.)
  static constexpr int kQPiece = kBlockM * kHeadDim;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKBytes = kBlockN * kHeadDim * kElemBytes;
  static constexpr int kVBytes = kLatent ? 0 : kBlockN * kHeadDimV * kElemBytes;
  static constexpr int kStageBytes = kKBytes + kVBytes;
  static constexpr int kRing = kQBytes;
  static constexpr int kXchg = kRing + kStages * kStageBytes;  // [warpgroup][k-step][thread] uint4 (FP8: the P tile)
  // FP8: two P tiles of 64 rows of 128 bytes, taken in turn (fp8.cuh).
  static constexpr int kPTile = kBlockM * 128;
  static constexpr int kStats = kXchg + (kKvFp8 ? 2 * kPTile : 2 * kPSteps * 128 * 16);  // [max, sum][warpgroup][64 rows] floats
  static constexpr int kBars = kStats + 4 * 64 * 4;              // full[kStages], empty[kStages]
  static constexpr int kSmemBytes = kBars + 2 * kStages * 8;
};
typedef Traits T;
static_assert(T::kBlockM == 64, "one wgmma M of rows");
static_assert(T::kThreads == T::kConsumers + 128, "the consumer warpgroups (two; FP8 one) and a producer warpgroup");
// Registers after setmaxnreg: 2 * 128 * 224 + 128 * 56 = 64512 of the SM's 65536 (one CTA an SM);
// FP8, two CTAs of one consumer warpgroup: 2 * (128 * 216 + 128 * 40) = 65536.
constexpr int kConsumerRegs = T::kKvFp8 ? 216 : 224, kProducerRegs = T::kKvFp8 ? 40 : 56;
static_assert(!T::kKvFp8 || (T::kBf16 && T::kHeadDim == 128 && T::kHeadDimV == 128 && !T::kLatent &&
                             T::kBlockN == 64 && T::kPipe == 0 && !T::kSingle && !T::kMulticast),
              "FP8 caches: bf16 queries, head dim 128, V apart, 64-key tiles, one warpgroup's serial schedule");
static_assert(T::kSmemBytes == SMEM_BYTES, "the space's smem_bytes and the kernel's layout disagree");
static_assert(T::kHeadDim % 64 == 0 && T::kHeadDimV % 128 == 0 && T::kHeadDimV <= T::kHeadDim,
              "column blocks of 64; V's half a multiple of 64 columns");
static_assert(T::kLatent ? T::kHeadDimV < T::kHeadDim : true, "a latent V is K's first columns");
static_assert(T::kHalfN == 16 || T::kHalfN == 32, "block_n 32 or 64");

typedef unsigned short elem_bits;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// m64n16k16 with A and B from shared memory (wgmma.cuh starts at N = 32): a block_n 32 warpgroup's
// scores.
template <int N>
struct ScoreMma {
  __device__ __forceinline__ static void ss(float (&d)[N / 2], u64 a, u64 b, int scale_d) { Wgmma<N>::ss(d, a, b, scale_d); }
};
template <>
struct ScoreMma<16> {
  __device__ __forceinline__ static void ss(float (&d)[8], u64 a, u64 b, int scale_d) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %10, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32." ATT_WGMMA_AB
                 " {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0; }\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(a), "l"(b), "r"(scale_d));
  }
};

__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void st_shared_v4(u32 addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ uint4 ld_shared_v4(u32 addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ void st_shared_f32(u32 addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ float ld_shared_f32(u32 addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}

// Keys of sequence b, and j / page_size (flash_decode's, kernel.cu: the same DecodeParams).
__device__ __forceinline__ int seq_len(const DecodeParams& p, int b) {
  return p.cache_seqlens ? min(max(__ldg(p.cache_seqlens + b), 0), p.seqlen_k) : p.seqlen_k;
}
__device__ __forceinline__ int page_index(int j, const DecodeParams& p) {
  return p.page_mul ? static_cast<int>(__umulhi(static_cast<unsigned>(j), p.page_mul) >> p.page_shift) : j;
}

// A box of a 4-d tensor map into L2 only (no shared memory, no barrier).
__device__ __forceinline__ void tma_prefetch_l2(const TmaDesc* desc, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];\n" ::"l"(reinterpret_cast<u64>(desc)),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

// The producer warp: the CTA's tiles t_begin.. (n of them) into the ring, tile t into stage t %
// kStages once both warpgroups released it. Contiguous: one box of (64, BLOCK_N) a column block
// (rows past seqlen_k zero-filled by TMA). Paged: boxes of p.tma_rows rows within a page; boxes
// wholly past len are not issued (their pages may not exist); the consumers zero V's rows past len.
__device__ __forceinline__ void producer(const DecodeParams& p, const DecodeMaps& maps, u32 ring, u32 bars, int b,
                                         int kvh, int t_begin, int n, int len, int lane) {
  const bool paged = p.block_table != nullptr;
  const int* bt = paged ? p.block_table + static_cast<long long>(b) * p.max_blocks_per_seq : nullptr;
  const int rows = p.tma_rows;
  // Multicast: this CTA's producer loads its half of the column blocks [c0, c1) (V's [v0, v1)) into
  // both CTAs of the cluster, completing the bytes on each one's full barrier; else all of them.
  int c0 = 0, c1 = T::kColBlocks, v0 = 0, v1 = T::kColBlocksV;
  if constexpr (T::kMulticast) {
    const int rank = static_cast<int>(cluster_ctarank());
    c0 = rank ? T::kHalfBlocks : 0, c1 = rank ? T::kColBlocks : T::kHalfBlocks;
    v0 = rank ? T::kHalfBlocksV : 0, v1 = rank ? T::kColBlocksV : T::kHalfBlocksV;
  }
  auto kv_load = [&](u32 dst, const TmaDesc* desc, u32 bar, int x0, int x1, int x2, int x3) {
    if constexpr (T::kMulticast) tma_load_4d_multicast(dst, desc, bar, 3, x0, x1, x2, x3);
    else tma_load_4d(dst, desc, bar, x0, x1, x2, x3);
  };
  // A paged tile's boxes from key j0: those holding keys within the length.
  auto boxes = [&](int j0) { return (min(T::kBlockN, len - j0) + rows - 1) / rows; };
  // l2_ahead: tile tt's boxes into L2 a tile or two before its stage frees, so that its load reads
  // L2 rather than DRAM (the ring holds only two 64-key tiles beside Q at d=576).
  auto prefetch = [&](int tt) {
    const int j0 = (t_begin + tt) * T::kBlockN;
    if (!paged) {
      if (lane == 0) {
        for (int c = c0; c < c1; ++c) tma_prefetch_l2(&maps.k, c * 64, j0, kvh, b);
        if constexpr (!T::kLatent) {
          for (int c = v0; c < v1; ++c) tma_prefetch_l2(&maps.v, c * 64, j0, kvh, b);
        }
      }
    } else {
      const int issued = boxes(j0);
      for (int x = lane; x < issued; x += 32) {
        const int j = j0 + x * rows, page = page_index(j, p);
        const int pg = __ldg(bt + page), pr = j - page * p.page_size;
        for (int c = c0; c < c1; ++c) tma_prefetch_l2(&maps.k, c * 64, pr, kvh, pg);
        if constexpr (!T::kLatent) {
          for (int c = v0; c < v1; ++c) tma_prefetch_l2(&maps.v, c * 64, pr, kvh, pg);
        }
      }
    }
  };
  for (int t = 0; t < n; ++t) {
    const int stage = t % T::kStages, round = t / T::kStages;
    const int j0 = (t_begin + t) * T::kBlockN;
    const u32 full = bars + 8 * stage, empty = bars + 8 * (T::kStages + stage);
    const u32 sk = ring + stage * T::kStageBytes, sv = sk + T::kKBytes;
    if constexpr (T::kL2Ahead > 0) {
      // Before this stage's wait: tile t + l2_ahead, if its load will wait for a stage (the first
      // kStages tiles load at once).
      const int tt = t + T::kL2Ahead;
      if (tt >= T::kStages && tt < n) prefetch(tt);
    }
    if (round > 0) mbar_wait(empty, (round - 1) & 1);
    if (!paged) {
      if (lane == 0) {
        mbar_arrive_expect_tx(full, T::kStageBytes);
#pragma unroll
        for (int c = c0; c < c1; ++c) kv_load(sk + c * T::kColBlock, &maps.k, full, c * 64, j0, kvh, b);
        if constexpr (!T::kLatent) {
#pragma unroll
          for (int c = v0; c < v1; ++c) kv_load(sv + c * T::kColBlock, &maps.v, full, c * 64, j0, kvh, b);
        }
      }
    } else {
      const int issued = boxes(j0);
      if (lane == 0)
        mbar_arrive_expect_tx(full, static_cast<u32>(issued * rows * 2 * (T::kKDim + (T::kLatent ? 0 : T::kVDim))));
      __syncwarp();
      for (int x = lane; x < issued; x += 32) {
        const int j = j0 + x * rows, page = page_index(j, p);
        const int pg = __ldg(bt + page), pr = j - page * p.page_size;
        for (int c = c0; c < c1; ++c)
          kv_load(sk + c * T::kColBlock + x * rows * 128, &maps.k, full, c * 64, pr, kvh, pg);
        if constexpr (!T::kLatent) {
          for (int c = v0; c < v1; ++c)
            kv_load(sv + c * T::kColBlock + x * rows * 128, &maps.v, full, c * 64, pr, kvh, pg);
        }
      }
    }
  }
}

// Q's rows row0.. of unit (b, kvh) into q (64 rows, K-major column blocks of 64 swizzled as TMA's
// 128-byte swizzle: args.h's decode_tile_bytes), zeros past rows_here. The 256 consumer threads.
__device__ __forceinline__ void load_q(const DecodeParams& p, u32 q, int b, int kvh, int row0, int rows_here, int tid) {
  constexpr int kChunks = T::kHeadDim / 8;
  const elem_bits* qg = static_cast<const elem_bits*>(p.q) + b * p.q_stride[0];
  for (int c = tid; c < T::kBlockM * kChunks; c += T::kConsumers) {
    const int r = c / kChunks, ch = c - r * kChunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < rows_here) {
      const int rr = row0 + r, gq = rr / p.seqlen_q, i = rr - gq * p.seqlen_q;
      v = __ldg(reinterpret_cast<const uint4*>(qg + (kvh * p.group + gq) * p.q_stride[1] + i * p.q_stride[2] + ch * 8));
    }
    st_shared_v4(q + decode_tile_bytes(r, ch, T::kBlockM, r & 7, T::kHeadDim), v);
  }
}

// Merges `count` pieces of the global rows r0 .. r0 + nrows - 1 into the output (flash_decode's
// combine_rows without sinks: one (row, 4 columns) item a thread, an online max over the pieces).
__device__ __forceinline__ void combine_rows(const DecodeParams& p, int r0, int nrows, int count, int tid,
                                             int nthreads) {
  constexpr int kQuads = T::kHeadDimV / 4;
  for (int it = tid; it < nrows * kQuads; it += nthreads) {
    const int r = it / kQuads, c4 = it - r * kQuads, row = r0 + r;
    float mx = neg_inf(), sum = 0.f, a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
#pragma unroll 8
    for (int k = 0; k < count; ++k) {
      const float v = __ldcg(p.part_lse + piece_lse(k, row, p.rows_total)) * kLog2e;
      const float4 x = __ldcg(reinterpret_cast<const float4*>(p.part_o + piece_o(k, row, p.rows_total, T::kHeadDimV)) + c4);
      const float mn = fmaxf(mx, v);
      const float f = mn == neg_inf() ? 1.f : ex2(mx - mn);
      const float w = v == neg_inf() ? 0.f : ex2(v - mn);
      mx = mn;
      sum = fmaf(sum, f, w);
      a0 = fmaf(w, x.x, a0 * f);
      a1 = fmaf(w, x.y, a1 * f);
      a2 = fmaf(w, x.z, a2 * f);
      a3 = fmaf(w, x.w, a3 * f);
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    if (c4 == 0 && p.lse) p.lse[row] = sum > 0.f ? (mx + lg2(sum)) * kLn2 : neg_inf();
    const int bh = row / p.seqlen_q, i = row - bh * p.seqlen_q;
    const int bb = bh / p.heads_q, hq = bh - bb * p.heads_q;
    elem_bits* dst = static_cast<elem_bits*>(p.o) + bb * p.o_stride[0] + hq * p.o_stride[1] + i * p.o_stride[2] + c4 * 4;
    uint2 out;
    out.x = pack2<T::kBf16>(a0 * inv, a1 * inv);
    out.y = pack2<T::kBf16>(a2 * inv, a3 * inv);
    *reinterpret_cast<uint2*>(dst) = out;
  }
}

// The keys rows r and r + 8 of a CTA's packed rows see: [0, len), causal rows bottom-right (query i
// of seqlen_q sees keys < len - seqlen_q + i + 1). Both consumers' (consume, fp8.cuh's consume_fp8).
__device__ __forceinline__ void key_limits(const DecodeParams& p, int r, int len, int (&lim)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    lim[h] = len;
    if constexpr (T::kCausal) {
      const int rr = r + 8 * h;
      lim[h] = min(len, len - p.seqlen_q + rr % p.seqlen_q + 1);
    }
  }
}

__device__ __forceinline__ void consume(const DecodeParams& p, u32 s_q, u32 ring, u32 bars, u32 xchg, u32 stats,
                                        int b, int kvh, int split, int rb, int t_begin, int n, int len, int tid) {
  const int wg = T::kWgUniform ? warp_uniform(tid >> 7) : tid >> 7, t128 = tid & 127, lane = tid & 31;
  const int r_lo = (t128 >> 5) * 16 + (lane >> 2), q4 = lane & 3;  // rows r_lo, r_lo + 8 of the 64
  const int row0 = rb * T::kBlockM, rows_here = min(T::kBlockM, p.rows - row0);

  load_q(p, s_q, b, kvh, row0, rows_here, tid);
  fence_proxy_async();  // Q's generic stores, then wgmma's reads through the async proxy
  named_bar_sync(1, T::kConsumers);

  int lim[2];
  key_limits(p, row0 + r_lo, len, lim);

  // Descriptors (K-major Q and K; V MN-major, this warpgroup's columns: column blocks wg * kHalfV / 64..).
  const u64 q_desc = smem_desc_sw128(s_q, 16, 1024);
  float o[T::kHalfV / 2];
#pragma unroll
  for (int i = 0; i < T::kHalfV / 2; ++i) o[i] = 0.f;
  float m_run[2] = {neg_inf(), neg_inf()}, l_run[2] = {0.f, 0.f};
  const float scale_log2 = p.scale_log2;
  const u32 s_max = stats, s_sum = stats + 2 * 64 * 4;

  // One tile's steps. issue_s: wait for tile t's stage, then S = Q K^T over this warpgroup's keys
  // (in flight until a wgmma wait). softmax: tile t's S complete in s: mask, zero V's rows past len,
  // the rows' maxima over both warpgroups (barrier 1), P in s and this warpgroup's P fragments in
  // the exchange (barrier 2); f: O's factors. pack: P's fragments of this warpgroup (pa) and of its
  // partner (pb). issue_pv: O += P V over the tile's keys, this warpgroup's columns. release: the
  // stage back to the producer once both products of its tile are done.
  // s: S's accumulators (written by wgmma alone: a non-wgmma write to them while another wgmma is
  // in flight makes ptxas serialize every wgmma, C7515); pr: the tile's P, made from s.
  float s[T::kHalfN / 2], pr[T::kHalfN / 2];
  u32 pa[T::kPSteps][4], pb[T::kPSteps][4];
  float f[2];
  auto stage_k = [&](int t) { return ring + (t % T::kStages) * T::kStageBytes; };
  auto issue_s = [&](int t) {
    mbar_wait(bars + 8 * (t % T::kStages), (t / T::kStages) & 1);
    const u64 k_desc = smem_desc_sw128(stage_k(t) + wg * T::kHalfN * 128, 16, 1024);
    // Q's descriptor made opaque each tile: otherwise ptxas keeps all d/16 of its k-step values in
    // registers across the loop (loop invariants), and the consumers spilled at their 224.
    u64 qd;
    if constexpr (T::kWgUniform) qd = __shfl_sync(0xffffffffu, q_desc, 0);  // opaque, and uniform
    else asm volatile("mov.b64 %0, %1;\n" : "=l"(qd) : "l"(q_desc));
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < T::kKSteps; ++kk) {
      const u32 qo = (kk / 4) * (T::kBlockM * 128) + (kk % 4) * 32;
      const u32 ko = (kk / 4) * T::kColBlock + (kk % 4) * 32;
      ScoreMma<T::kHalfN>::ss(s, qd + (qo >> 4), k_desc + (ko >> 4), kk > 0);
    }
    wgmma_commit();
  };
  auto softmax = [&](int t) {
    reg_fence(s);
#pragma unroll
    for (int i = 0; i < T::kHalfN / 2; ++i) pr[i] = s[i];
    const u32 sv = T::kLatent ? stage_k(t) : stage_k(t) + T::kKBytes;
    // Mask keys past each row's limit (anything may sit there: a stale cache, NaN); zero V's rows
    // past len in this warpgroup's keys (P = 0 times V = NaN is NaN), then the async proxy sees it.
    const int jw = (t_begin + t) * T::kBlockN + wg * T::kHalfN;
    if (jw + T::kHalfN > min(lim[0], lim[1])) {
#pragma unroll
      for (int i = 0; i < T::kHalfN / 2; ++i) {
        const int j = jw + 8 * (i / 4) + 2 * q4 + (i & 1);
        if (j >= lim[(i >> 1) & 1]) pr[i] = neg_inf();
      }
    }
    if (jw + T::kHalfN > len) {
      const int first = max(0, len - jw);  // this warpgroup's first row past len
      const int items = (T::kHalfN - first) * T::kColBlocksV * 8;
      for (int it = t128; it < items; it += 128) {
        const int r = first + it / (T::kColBlocksV * 8), rest = it % (T::kColBlocksV * 8);
        st_shared_v4(sv + (rest >> 3) * T::kColBlock + (wg * T::kHalfN + r) * 128 + (rest & 7) * 16,
                     make_uint4(0, 0, 0, 0));
      }
      fence_proxy_async();
    }
    float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int i = 0; i < T::kHalfN / 2; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], pr[i]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      if (q4 == 0) st_shared_f32(s_max + 4 * (wg * 64 + r_lo + 8 * h), mx[h]);
    }
    named_bar_sync(1, T::kConsumers);
    float m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float other = ld_shared_f32(s_max + 4 * ((1 - wg) * 64 + r_lo + 8 * h));
      const float m_new = fmaxf(m_run[h], fmaxf(mx[h], other) * scale_log2);
      m_use[h] = m_new == neg_inf() ? 0.f : m_new;
      f[h] = ex2(m_run[h] - m_use[h]);
      m_run[h] = m_new;
      l_run[h] *= f[h];
    }
#pragma unroll
    for (int i = 0; i < T::kHalfN / 2; ++i) {
      const int h = (i >> 1) & 1;
      pr[i] = ex2(fmaf(pr[i], scale_log2, -m_use[h]));
      l_run[h] += pr[i];
    }
#pragma unroll
    for (int kk = 0; kk < T::kPSteps; ++kk)
      st_shared_v4(xchg + ((wg * T::kPSteps + kk) * 128 + t128) * 16,
                   make_uint4(pack2<T::kBf16>(pr[8 * kk], pr[8 * kk + 1]), pack2<T::kBf16>(pr[8 * kk + 2], pr[8 * kk + 3]),
                              pack2<T::kBf16>(pr[8 * kk + 4], pr[8 * kk + 5]),
                              pack2<T::kBf16>(pr[8 * kk + 6], pr[8 * kk + 7])));
    named_bar_sync(2, T::kConsumers);
  };
  auto pack = [&]() {
#pragma unroll
    for (int kk = 0; kk < T::kPSteps; ++kk) {
      pa[kk][0] = pack2<T::kBf16>(pr[8 * kk], pr[8 * kk + 1]);      // row g,   keys 16kk+2t
      pa[kk][1] = pack2<T::kBf16>(pr[8 * kk + 2], pr[8 * kk + 3]);  // row g+8
      pa[kk][2] = pack2<T::kBf16>(pr[8 * kk + 4], pr[8 * kk + 5]);  // row g,   keys 16kk+8+2t
      pa[kk][3] = pack2<T::kBf16>(pr[8 * kk + 6], pr[8 * kk + 7]);  // row g+8
      const uint4 v = ld_shared_v4(xchg + (((1 - wg) * T::kPSteps + kk) * 128 + t128) * 16);
      pb[kk][0] = v.x, pb[kk][1] = v.y, pb[kk][2] = v.z, pb[kk][3] = v.w;
    }
  };
  auto rescale = [&]() {
#pragma unroll
    for (int i = 0; i < T::kHalfV / 2; ++i) o[i] *= f[(i >> 1) & 1];
  };
  auto issue_pv = [&](int t) {
    const u32 sv = T::kLatent ? stage_k(t) : stage_k(t) + T::kKBytes;
    const u64 v_desc = smem_desc_sw128(sv + wg * (T::kHalfV / 64) * T::kColBlock, T::kColBlock, 1024);
    reg_fence(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < T::kPSteps; ++kk)
      Wgmma<T::kHalfV>::rs(o, pa[kk], v_desc + (((wg * T::kHalfN + 16 * kk) * 128) >> 4), 1);
#pragma unroll
    for (int kk = 0; kk < T::kPSteps; ++kk)
      Wgmma<T::kHalfV>::rs(o, pb[kk], v_desc + ((((1 - wg) * T::kHalfN + 16 * kk) * 128) >> 4), 1);
    wgmma_commit();
  };
  // A stage is free once both products of its tile are done here (and, multicast, in the peer too:
  // either producer writes into both CTAs' rings, so each waits for both CTAs' consumers).
  auto release = [&](int t) {
    const u32 empty = bars + 8 * (T::kStages + t % T::kStages);
    mbar_arrive(empty);
    if constexpr (T::kMulticast) mbar_arrive_cluster(empty, cluster_ctarank() ^ 1u);
  };
  // scores: single's P.V: this warpgroup's columns over the tile's keys, P's fragments of all of them.
  auto issue_pv_frags = [&](int t, const u32 (&pf)[T::kBlockN / 16][4]) {
    const u32 sv = T::kLatent ? stage_k(t) : stage_k(t) + T::kKBytes;
    const u64 v_desc = smem_desc_sw128(sv + wg * (T::kHalfV / 64) * T::kColBlock, T::kColBlock, 1024);
    reg_fence(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < T::kBlockN / 16; ++kk)
      Wgmma<T::kHalfV>::rs(o, pf[kk], v_desc + ((16 * kk * 128) >> 4), 1);
    wgmma_commit();
  };

  if constexpr (T::kSingle) {
    // scores: single (FlashMLA's division of the work): warpgroup 0 scores all of a tile's keys
    // (wgmma N = BLOCK_N: Q's 2 KB read once a 16-column step for all the keys, not once per half),
    // makes P, l and O's factor, and leaves P's fragments and the factors in the exchange; both
    // accumulate their half of O's columns. Warpgroup 0 issues S_{t+1} behind its P_t V_t, so the
    // tensor pipe runs S_{t+1} while warpgroup 1 still runs its P_t V_t. Barrier 2: P_t is in the
    // exchange; barrier 1 (warpgroup 1 arrives, 0 waits): P_t was read, the exchange is free.
    constexpr int kSteps = T::kBlockN / 16;
    const u32 xf = s_max;  // O's factors by row (64 floats; the maxima's place, which single leaves unused)
    u32 pf[kSteps][4];
    float fo[2] = {1.f, 1.f};
    if (wg == 0) {
      float sc[T::kBlockN / 2];
      auto issue_full = [&](int t) {
        mbar_wait(bars + 8 * (t % T::kStages), (t / T::kStages) & 1);
        const u64 k_desc = smem_desc_sw128(stage_k(t), 16, 1024);
        u64 qd;
        if constexpr (T::kWgUniform) qd = __shfl_sync(0xffffffffu, q_desc, 0);
        else asm volatile("mov.b64 %0, %1;\n" : "=l"(qd) : "l"(q_desc));
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < T::kKSteps; ++kk) {
          const u32 qo = (kk / 4) * (T::kBlockM * 128) + (kk % 4) * 32;
          const u32 ko = (kk / 4) * T::kColBlock + (kk % 4) * 32;
          ScoreMma<T::kBlockN>::ss(sc, qd + (qo >> 4), k_desc + (ko >> 4), kk > 0);
        }
        wgmma_commit();
      };
      // Tile t's S complete in sc: mask, zero V's rows past len (all the tile's), P's fragments into
      // pf and the exchange, O's factor into fo and the exchange (after barrier 1: the exchange is free).
      auto softmax_full = [&](int t) {
        reg_fence(sc);
        const u32 sv = T::kLatent ? stage_k(t) : stage_k(t) + T::kKBytes;
        const int j0 = (t_begin + t) * T::kBlockN;
        if (j0 + T::kBlockN > min(lim[0], lim[1])) {
#pragma unroll
          for (int i = 0; i < T::kBlockN / 2; ++i) {
            const int j = j0 + 8 * (i / 4) + 2 * q4 + (i & 1);
            if (j >= lim[(i >> 1) & 1]) sc[i] = neg_inf();
          }
        }
        if (j0 + T::kBlockN > len) {
          const int first = max(0, len - j0);
          const int items = (T::kBlockN - first) * T::kColBlocksV * 8;
          for (int it = t128; it < items; it += 128) {
            const int r = first + it / (T::kColBlocksV * 8), rest = it % (T::kColBlocksV * 8);
            st_shared_v4(sv + (rest >> 3) * T::kColBlock + r * 128 + (rest & 7) * 16, make_uint4(0, 0, 0, 0));
          }
          fence_proxy_async();
        }
        float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
        for (int i = 0; i < T::kBlockN / 2; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], sc[i]);
        float m_use[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
          mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
          const float m_new = fmaxf(m_run[h], mx[h] * scale_log2);
          m_use[h] = m_new == neg_inf() ? 0.f : m_new;
          fo[h] = ex2(m_run[h] - m_use[h]);
          m_run[h] = m_new;
          l_run[h] *= fo[h];
        }
#pragma unroll
        for (int i = 0; i < T::kBlockN / 2; ++i) {
          const int h = (i >> 1) & 1;
          sc[i] = ex2(fmaf(sc[i], scale_log2, -m_use[h]));
          l_run[h] += sc[i];
        }
        if (t > 0) named_bar_sync(1, T::kConsumers);  // warpgroup 1 has read P_{t-1}
#pragma unroll
        for (int kk = 0; kk < kSteps; ++kk) {
          pf[kk][0] = pack2<T::kBf16>(sc[8 * kk], sc[8 * kk + 1]);
          pf[kk][1] = pack2<T::kBf16>(sc[8 * kk + 2], sc[8 * kk + 3]);
          pf[kk][2] = pack2<T::kBf16>(sc[8 * kk + 4], sc[8 * kk + 5]);
          pf[kk][3] = pack2<T::kBf16>(sc[8 * kk + 6], sc[8 * kk + 7]);
          st_shared_v4(xchg + (kk * 128 + t128) * 16, make_uint4(pf[kk][0], pf[kk][1], pf[kk][2], pf[kk][3]));
        }
        if (q4 == 0) {
          st_shared_f32(xf + 4 * r_lo, fo[0]);
          st_shared_f32(xf + 4 * (r_lo + 8), fo[1]);
        }
        named_bar_sync(2, T::kConsumers);  // P_t and its factors are in the exchange
      };
      if (n > 0) {
        issue_full(0);
        wgmma_wait<0>();
        softmax_full(0);
      }
      for (int t = 0; t < n; ++t) {
#pragma unroll
        for (int i = 0; i < T::kHalfV / 2; ++i) o[i] *= fo[(i >> 1) & 1];
        issue_pv_frags(t, pf);
        if (t + 1 < n) {
          issue_full(t + 1);
          wgmma_wait<1>();
          reg_fence(o);
          release(t);
          wgmma_wait<0>();
          softmax_full(t + 1);
        } else {
          wgmma_wait<0>();
          reg_fence(o);
          release(t);
        }
      }
    } else {
      for (int t = 0; t < n; ++t) {
        named_bar_sync(2, T::kConsumers);  // P_t is in the exchange
#pragma unroll
        for (int kk = 0; kk < kSteps; ++kk) {
          const uint4 v = ld_shared_v4(xchg + (kk * 128 + t128) * 16);
          pf[kk][0] = v.x, pf[kk][1] = v.y, pf[kk][2] = v.z, pf[kk][3] = v.w;
        }
        fo[0] = ld_shared_f32(xf + 4 * r_lo);
        fo[1] = ld_shared_f32(xf + 4 * (r_lo + 8));
        if (t + 1 < n) named_bar_arrive(1, T::kConsumers);  // read: warpgroup 0 may write P_{t+1}
#pragma unroll
        for (int i = 0; i < T::kHalfV / 2; ++i) o[i] *= fo[(i >> 1) & 1];
        issue_pv_frags(t, pf);
        wgmma_wait<0>();
        reg_fence(o);
        release(t);
      }
    }
  } else if constexpr (T::kPipe == 0) {
    // serial: S_t, its softmax, P_t V_t, one tile after the other.
    for (int t = 0; t < n; ++t) {
      issue_s(t);
      wgmma_wait<0>();
      softmax(t);
      rescale();
      pack();
      issue_pv(t);
      wgmma_wait<0>();
      reg_fence(o);
      release(t);
    }
  } else if (n > 0) {
    issue_s(0);
    wgmma_wait<0>();
    softmax(0);
    pack();
    if constexpr (T::kPipe == 1) {
      // fused: P_t V_t and S_{t+1} back to back in the tensor pipe (one gap a tile: the softmax);
      // tile t+1 must have landed when P_t V_t is issued, as with two stages it has.
      for (int t = 0; t < n; ++t) {
        issue_pv(t);
        if (t + 1 < n) issue_s(t + 1);
        wgmma_wait<0>();
        reg_fence(o);
        release(t);
        if (t + 1 < n) {
          softmax(t + 1);
          rescale();
          pack();
        }
      }
    } else {
      // overlap: S_{t+1} then P_t V_t in the pipe, the softmax of t+1 while P_t V_t runs. Both
      // issues and both waits in one iteration, as FlashAttention-3 has them: ptxas tracks which
      // group a wait<1> leaves in flight only there (across iterations it injected full waits, C7517).
      for (int t = 0; t < n; ++t) {
        if (t + 1 < n) issue_s(t + 1);
        issue_pv(t);
        if (t + 1 < n) {
          wgmma_wait<1>();
          softmax(t + 1);
        }
        wgmma_wait<0>();
        reg_fence(o);
        release(t);
        if (t + 1 < n) {
          rescale();
          pack();
        }
      }
    }
  }

  // Row sums over both warpgroups, then O and the LSE (or this split's piece).
  float l[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] = l_run[h];
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    if (q4 == 0) st_shared_f32(s_sum + 4 * (wg * 64 + r_lo + 8 * h), l[h]);
  }
  named_bar_sync(1, T::kConsumers);
  const int pieces = p.num_splits;  // flash_decode's split_pieces(num_splits, 1)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r_lo + 8 * h;
    const float lt = l[h] + ld_shared_f32(s_sum + 4 * ((1 - wg) * 64 + r));
    if (r >= rows_here) continue;
    const float inv = lt > 0.f ? 1.f / lt : 0.f;
    const float lse = lt > 0.f ? (m_run[h] + lg2(lt)) * kLn2 : neg_inf();
    const int rr = row0 + r, gq = rr / p.seqlen_q, i = rr - gq * p.seqlen_q, head = kvh * p.group + gq;
    const long long R = (static_cast<long long>(b) * p.heads_q + head) * p.seqlen_q + i;
    if (pieces <= 1) {
      if (wg == 0 && q4 == 0 && p.lse) p.lse[R] = lse;
      elem_bits* dst = static_cast<elem_bits*>(p.o) + b * p.o_stride[0] + head * p.o_stride[1] + i * p.o_stride[2] +
                       wg * T::kHalfV + 2 * q4;
#pragma unroll
      for (int j = 0; j < T::kHalfV / 8; ++j)
        *reinterpret_cast<u32*>(dst + 8 * j) = pack2<T::kBf16>(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
    } else {
      if (wg == 0 && q4 == 0) __stcg(p.part_lse + piece_lse(split, R, p.rows_total), lse);
      float* dst = p.part_o + piece_o(split, R, p.rows_total, T::kHeadDimV) + wg * T::kHalfV + 2 * q4;
#pragma unroll
      for (int j = 0; j < T::kHalfV / 8; ++j)
        __stcg(reinterpret_cast<float2*>(dst + 8 * j), make_float2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv));
    }
  }
  if (pieces <= 1 || !T::kLastCta) return;
  // combine: last_cta: the unit's last CTA to arrive at its counter merges the pieces of its rows
  // (a unit's rows are contiguous global rows) and resets the counter (threadFenceReduction's pattern).
  __threadfence();
  named_bar_sync(1, T::kConsumers);
  const u32 s_last = s_max;  // the maxima are read: reuse a word
  if (tid == 0) {
    int* counter = p.counters + unit_counter(b, kvh, rb, p.heads_kv, p.row_blocks);
    const int last = atomicAdd(counter, 1) == pieces - 1;
    if (last) *counter = 0;
    st_shared_f32(s_last, last ? 1.f : 0.f);
  }
  named_bar_sync(1, T::kConsumers);
  if (ld_shared_f32(s_last) == 0.f) return;
  __threadfence();
  const int r_base = (b * p.heads_q + kvh * p.group) * p.seqlen_q + row0;
  combine_rows(p, r_base, rows_here, pieces, tid, T::kConsumers);
}

#if MULTICAST && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900)
#define ATT_DECODE_WGMMA_CLUSTER __cluster_dims__(2, 1, 1)
#else
#define ATT_DECODE_WGMMA_CLUSTER
#endif
#include "fp8.cuh"

extern "C" __global__ void __launch_bounds__(T::kThreads, T::kCtasPerSm) ATT_DECODE_WGMMA_CLUSTER
    flash_decode_wgmma(const DecodeParams p, const __grid_constant__ DecodeMaps maps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(1024) unsigned char smem[];
  const int tid = threadIdx.x;
  if (split_cta<false>(blockIdx.x, gridDim.x, p.row_blocks).split >= p.num_splits)
    return;  // launched without its workspace: split 0 does it all
  if (tid == 0) {
    const u32 bars = smem_addr(smem) + T::kBars;
    for (int i = 0; i < T::kStages; ++i) {
      mbar_init(bars + 8 * i, 1);
      mbar_init(bars + 8 * (T::kStages + i), T::kConsumers * T::kPeers);
    }
    mbar_init_fence();
  }
  // Multicast: no copy into the peer and no remote arrive before the peer's barriers exist.
  if constexpr (T::kMulticast) cluster_sync();
  else __syncthreads();
  // The registers move first and the unit's values are computed after, in each role: values live
  // across setmaxnreg spilled (ptxas, 2026-11-28: 16-28 bytes; 600 with one setmaxnreg under an
  // if/else and the unit computed after the join; 4 for shared memory's address).
  struct Unit {
    SplitCta cta;
    int kvh, b, len;
    TileShare share;
  };
  auto unit = [&]() {
    Unit u;
    u.cta = split_cta<false>(blockIdx.x, gridDim.x, p.row_blocks);
    u.kvh = blockIdx.y, u.b = blockIdx.z;
    u.len = seq_len(p, u.b);
    u.share = split_tiles(unit_tiles(0, u.len, T::kBlockN), p.num_splits, u.cta.split);
    return u;
  };
  if (tid >= T::kConsumers) {
    setmaxnreg_dec<kProducerRegs>();
    const u32 base = smem_addr(smem), bars = base + T::kBars;
    if (tid < T::kConsumers + 32) {
      const Unit u = unit();
      producer(p, maps, base + T::kRing, bars, u.b, u.kvh, u.share.begin, u.share.n, u.len, tid & 31);
    }
    if constexpr (T::kMulticast) cluster_sync();  // the peer may still copy into this CTA and arrive here
    return;
  }
  setmaxnreg_inc<kConsumerRegs>();
  const u32 base = smem_addr(smem), bars = base + T::kBars;
  const Unit u = unit();
  if constexpr (T::kKvFp8)
    consume_fp8(p, base, base + T::kRing, bars, base + T::kXchg, base + T::kStats, u.b, u.kvh, u.cta.split, u.cta.rb,
                u.share.begin, u.share.n, u.len, tid);
  else
    consume(p, base, base + T::kRing, bars, base + T::kXchg, base + T::kStats, u.b, u.kvh, u.cta.split, u.cta.rb,
            u.share.begin, u.share.n, u.len, tid);
  if constexpr (T::kMulticast) cluster_sync();
#endif
}

// Merges the splits' pieces (combine: kernel): decode_combine_rows(dv) global rows a CTA.
extern "C" __global__ void __launch_bounds__(kDecodeCombineThreads)
    flash_decode_wgmma_combine(const DecodeParams p, const __grid_constant__ DecodeMaps) {
  if (p.num_splits <= 1) return;  // the main kernel wrote o
  constexpr int kRows = decode_combine_rows(T::kHeadDimV);
  const int r0 = blockIdx.x * kRows;
  const int nrows = min(kRows, p.rows_total - r0);
  if (nrows <= 0) return;
  combine_rows(p, r0, nrows, p.num_splits, threadIdx.x, kDecodeCombineThreads);
}

}  // namespace att
