// flash_fwd_wgmma: FlashAttention-3-class forward attention for Hopper (sm_90a).
//
// One CTA owns kBlockM query rows of one (batch, head); 64 rows per consumer warpgroup (wgmma is
// m64). K and V tiles arrive by TMA (cp.async.bulk.tensor, 128-byte swizzle) into two rings of
// kStages shared-memory tiles, each stage guarded by a "full" mbarrier (TMA bytes landed) and an
// "empty" one (every consumer warp done reading). Per K/V tile j a consumer warpgroup runs
//   S = Q K_j^T           wgmma, A (Q) and B (K) from shared memory
//   P = online softmax(S)  in registers, fp32; O rescaled by the row max change
//   O += P V_j            wgmma, A (P, packed to 16 bit) from registers, B (V) N-major in smem
// Kv tiles go from the last to the first, so the masked ones (causal diagonal, sequence end)
// come first. Options (traits.cuh): a producer warpgroup with setmaxnreg, ping-pong of two
// consumer warpgroups, intra-warpgroup overlap of softmax(j) with P_{j-1} V_{j-1}, and K/V tiles
// multicast to a 2-CTA cluster.
#include "../common/attn_params.h"
#include "../common/ptx_sm90.cuh"
#include "args.h"
#include "traits.cuh"
#include "wgmma.cuh"

namespace att {

#if ATT_TRACE
// Development trace (tests/harness/wgmma_harness.cu, -DATT_TRACE=1; never in the tuner's builds):
// per CTA, consumer warpgroup and work tile (the CTA's first kTraceTiles), clock64 at consume()'s
// entry, after the Q wait, after the first S and softmax, before the last P.V, after it and at
// the end; then the iterations it computed and %globaltimer at entry (for the SM clock).
constexpr int kTraceCtas = 160, kTraceWgs = 3, kTraceTiles = 24, kTraceEvents = 8;
__device__ long long att_trace[kTraceCtas][kTraceWgs][kTraceTiles][kTraceEvents];
__device__ __forceinline__ long long global_ns() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#define ATT_MARK(k, ev, value)                                                            \
  do {                                                                                    \
    if (threadIdx.x % 128 == 0 && blockIdx.x < kTraceCtas && (k) < kTraceTiles && cw < kTraceWgs) \
      att_trace[blockIdx.x][cw][k][ev] = (value);                                         \
  } while (0)
#else
#define ATT_MARK(k, ev, value) \
  do {                         \
  } while (0)
#endif

typedef Traits T;

// Shared-memory addresses (shared window), 1024-byte aligned tiles.
struct Smem {
  u32 q, k, v, bars;
  __device__ u32 q_full() const { return bars; }
  __device__ u32 k_full(int st) const { return bars + 8 * (1 + st); }
  __device__ u32 v_full(int st) const { return bars + 8 * (1 + T::kStages + st); }
  __device__ u32 k_empty(int st) const { return bars + 8 * (1 + 2 * T::kStages + st); }
  __device__ u32 v_empty(int st) const { return bars + 8 * (1 + 3 * T::kStages + st); }
  __device__ u32 q_empty() const { return bars + 8 * (1 + 4 * T::kStages); }
  // Split tail or multicast (split_pieces): this CTA's two pieces, (u, lo, hi) each, the plain
  // tiles' end and the query blocks, after the barriers.
  __device__ u32 pieces() const { return bars + 128; }
  // Dynamic tiles (Traits::kDynamicTiles): the producer's next work tile, written before that
  // tile's Q arrives on q_full (a plain arrive when it loads no Q).
  __device__ u32 sched() const { return bars + 160; }
};

// Ring stage and phase of K/V iteration `it`, counted over all the CTA's work tiles.
struct Slot {
  int stage;
  u32 phase;
  __device__ explicit Slot(int it) : stage(it % T::kStages), phase((it / T::kStages) & 1) {}
};

// ---- producer side: one thread issues every copy ----
// Q rows from row0. kKvMulticast's padding block (past seqlen_q, rows nobody stores) loads from
// the last row on instead: a box that starts past the tensor's end is not one TMA promises to
// fill, and branching around the load spilled the producer's 24 registers at d=64.
// Varlen: the map spans the packed rows (batch 0) and the tile's rows start at its sequence's
// first, q_start; a tile that runs past its sequence loads the next one's rows, which nobody stores.
__device__ __forceinline__ void load_q(const Smem& sm, const TmaMaps& maps, const AttnParams& p, int m_block, int head,
                                       int batch, int q_start = 0) {
  const int row0 = T::kKvMulticast ? min(m_block * T::kBlockM, p.seqlen_q - 1) : m_block * T::kBlockM;
  mbar_arrive_expect_tx(sm.q_full(), T::kQBytes);
#pragma unroll
  for (int cb = 0; cb < T::kColBlocks; ++cb) {
    if constexpr (T::kVarlen)
      tma_load_4d(sm.q + cb * T::kQColBlockBytes, &maps.q, sm.q_full(), cb * 64, q_start + row0, head, 0);
    else
      tma_load_4d(sm.q + cb * T::kQColBlockBytes, &maps.q, sm.q_full(), cb * 64, row0, head, batch);
  }
}

// With kKvMulticast the cluster's rank-0 CTA loads every tile into both CTAs, and each CTA's full
// barrier expects the whole tile. (Each CTA loading half of the tile's column blocks put rank-
// dependent offsets in the producer's loop, which spilled its 24 registers.)
// Varlen: `batch` is the sequence's first key row in the packed K/V (the maps' batch is 0).
__device__ __forceinline__ void load_kv_tile(u32 dst, u32 full, const TmaDesc* desc, int tile, int kv_head, int batch) {
  mbar_arrive_expect_tx(full, T::kKVBytes);
  if (T::kKvMulticast && cluster_ctarank() != 0) return;
#pragma unroll
  for (int cb = 0; cb < T::kColBlocks; ++cb) {
    if constexpr (T::kVarlen)
      tma_load_4d(dst + cb * T::kKVColBlockBytes, desc, full, cb * 64, batch + tile * T::kBlockN, kv_head, 0);
    else if (T::kKvMulticast)
      tma_load_4d_multicast(dst + cb * T::kKVColBlockBytes, desc, full, (1 << T::kCluster) - 1, cb * 64,
                            tile * T::kBlockN, kv_head, batch);
    else
      tma_load_4d(dst + cb * T::kKVColBlockBytes, desc, full, cb * 64, tile * T::kBlockN, kv_head, batch);
  }
}

// Kvcache with a page table: K/V tile `tile` of sequence `batch` (len_k keys) as boxes of
// maps.kv_box_rows rows, each within one page: the box at key j holds keys j.. on, row
// j % page_size of page block_table[batch][j / page_size]. Boxes wholly past len_k are not
// issued; their rows, and those of the last box past len_k, the consumers zero in V
// (zero_v_tail) and mask in S. Each box adds its bytes to the full barrier's expected count before
// it is issued, and one arrive closes the tile: no box count (a division) to hold, which spilled
// the producer's 24 registers in the persistent causal loop (112 bytes).
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void load_kv_paged(u32 dst, u32 full, const TmaDesc* desc, const AttnParams& p,
                                              const TmaMaps& maps, int tile, int kv_head, int batch, int len_k) {
  const int rows = maps.kv_box_rows, end = min((tile + 1) * T::kBlockN, len_k), row0 = batch * p.max_blocks_per_seq;
  for (int j = tile * T::kBlockN; j < end; j += rows, dst += rows * 128) {
    const int page = p.page_mul ? static_cast<int>(__umulhi(static_cast<unsigned>(j), p.page_mul) >> p.page_shift) : j;
    const int pg = __ldg(p.block_table + (row0 + page)), pr = j - page * p.page_size;
    mbar_expect_tx(full, static_cast<u32>(rows * 128 * T::kColBlocks));
#pragma unroll
    for (int cb = 0; cb < T::kColBlocks; ++cb)
      tma_load_4d(dst + cb * T::kKVColBlockBytes, desc, full, cb * 64, pr, kv_head, pg);
  }
  mbar_arrive(full);
}

// Iteration `it` of a work tile (global iteration it_base + it) loads K/V tile n-1-it into its
// stage once the consumers released that stage. Varlen: `batch` is the sequence's first key row.
// Kvcache: `batch` is the sequence, len_k its keys (pages when the call has a page table).
__device__ __forceinline__ void produce(const Smem& sm, const TmaMaps& maps, const AttnParams& p, int it_base, int it,
                                        int n, int kv_head, int batch, int len_k) {
  const Slot sl(it_base + it);
  const int tile = n - 1 - it;
  const bool paged = T::kKvcache && p.block_table != nullptr;
  mbar_wait(sm.k_empty(sl.stage), sl.phase ^ 1);
  if (paged) load_kv_paged(sm.k + sl.stage * T::kKVBytes, sm.k_full(sl.stage), &maps.k, p, maps, tile, kv_head, batch, len_k);
  else load_kv_tile(sm.k + sl.stage * T::kKVBytes, sm.k_full(sl.stage), &maps.k, tile, kv_head, batch);
  mbar_wait(sm.v_empty(sl.stage), sl.phase ^ 1);
  if (paged) load_kv_paged(sm.v + sl.stage * T::kKVBytes, sm.v_full(sl.stage), &maps.v, p, maps, tile, kv_head, batch, len_k);
  else load_kv_tile(sm.v + sl.stage * T::kKVBytes, sm.v_full(sl.stage), &maps.v, tile, kv_head, batch);
}

// ---- consumer side ----
// Kvcache: rows [valid, kBlockN) of the V stage at `v` (every column block) set to zero by the 128
// threads of consumer warpgroup cw, made visible to wgmma (the async proxy) and waited for by the
// warpgroup (named barrier 1 + kConsumerWgs + cw; ping-pong takes 1..kConsumerWgs). Whole
// 128-byte rows: the swizzle only permutes the 16-byte chunks inside a row. Every consumer
// warpgroup that reads the tile writes the same zeros.
__device__ __forceinline__ void zero_v_tail(u32 v, int valid, int cw) {
  const int per_block = (T::kBlockN - valid) * 8;  // 16-byte chunks past `valid` in one column block
  for (int i = threadIdx.x % 128; i < per_block * T::kColBlocks; i += 128) {
    const int cb = i / per_block, c = i - cb * per_block;
    const u32 addr = v + cb * T::kKVColBlockBytes + (valid * 8 + c) * 16;
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  named_bar_sync(1 + T::kConsumerWgs + cw, 128);
}
// Accumulator layout of wgmma m64nN (fp32), per thread: for each 8-column chunk c,
// acc[4c+0..1] = row g, columns 8c+2t..+1; acc[4c+2..3] = row g+8, same columns, where
// g = lane/4, t = lane%4 and the rows are those of the thread's warp (16 of the 64).

// Every S-tile step below takes the tile's width W in keys: kBlockN, or kNarrowW for a first tile
// that holds few visible keys (consume). A narrow tile uses the first W/2 registers of S, the
// first W/16 k-steps of P, and the first W rows of the K and V stages.
template <int W>
__device__ __forceinline__ float (&first_cols(float (&s)[T::kBlockN / 2]))[W / 2] {
  return *reinterpret_cast<float(*)[W / 2]>(&s[0]);
}

// S = Q K^T for one K stage (scale_d = 0 on the first k-step: no zeroing needed).
template <int W = T::kBlockN>
__device__ __forceinline__ void gemm_qk(float (&s)[T::kBlockN / 2], u64 q_desc, u64 k_desc) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < T::kKSteps; ++kk) {
    // k-step kk: column block kk/4, 32 bytes per 16 elements inside the 128-byte row.
    const u64 q_off = ((kk / 4) * T::kQColBlockBytes + (kk % 4) * 32) >> 4;
    const u64 k_off = ((kk / 4) * T::kKVColBlockBytes + (kk % 4) * 32) >> 4;
    Wgmma<W>::ss(first_cols<W>(s), q_desc + q_off, k_desc + k_off, kk > 0);
  }
  wgmma_commit();
}

// O += P V for one V stage; P's k-step kk covers keys 16kk..16kk+15, V rows of 128 bytes.
template <int W = T::kBlockN>
__device__ __forceinline__ void gemm_pv(float (&o)[T::kHeadDim / 2], const u32 (&pa)[T::kPSteps][4], u64 v_desc) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < W / 16; ++kk) Wgmma<T::kHeadDim>::rs(o, pa[kk], v_desc + ((kk * 16 * 128) >> 4), 1);
  wgmma_commit();
}

// The same, narrow (kNarrowW keys) or full: the callers pass constants, so each call site
// compiles to one of the two.
__device__ __forceinline__ void gemm_qk_w(bool narrow, float (&s)[T::kBlockN / 2], u64 q_desc, u64 k_desc) {
  if (narrow) gemm_qk<T::kNarrowW>(s, q_desc, k_desc);
  else gemm_qk(s, q_desc, k_desc);
}
__device__ __forceinline__ void gemm_pv_w(bool narrow, float (&o)[T::kHeadDim / 2], const u32 (&pa)[T::kPSteps][4],
                                          u64 v_desc) {
  if (narrow) gemm_pv<T::kNarrowW>(o, pa, v_desc);
  else gemm_pv(o, pa, v_desc);
}

// Scores of keys a row may not see become -inf: keys past seqlen_k, and for causal keys past
// the row's diagonal (bottom-right aligned: row r sees keys < r + diag + 1).
template <int W = T::kBlockN>
__device__ __forceinline__ void mask_tile(float (&s)[T::kBlockN / 2], int tile, int row0, int t, int sk, int diag) {
  const int lim0 = T::kCausal ? min(sk, row0 + diag + 1) : sk;
  const int lim1 = T::kCausal ? min(sk, row0 + 8 + diag + 1) : sk;
#pragma unroll
  for (int c = 0; c < W / 8; ++c)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = tile * T::kBlockN + 8 * c + 2 * t + e;
      if (col >= lim0) s[4 * c + e] = neg_inf();
      if (col >= lim1) s[4 * c + 2 + e] = neg_inf();
    }
}

// 2^x for x <= 0 on the FMA pipe, for the scores that skip MUFU's ex2 (with the tensor cores
// the co-bottleneck: one ex2 per score, 16 per clock per SM). x is rounded to an integer j by
// adding 1.5 * 2^23, 2^(x - j) comes from a degree-3 minimax polynomial on [-0.5, 0.5] (relative
// error 7.5e-5, under half an ulp of bf16 and fp16), and j is added to its exponent bits (the
// low bits of x + 1.5 * 2^23, shifted). Clamped at -126: a masked score (-inf) gives <= 2^-126,
// nothing next to a row's maximum (1); a row that saw no key at all is zeroed in the epilogue.
__device__ __forceinline__ float exp2_fma(float x) {
  const float kRound = 12582912.f;  // 1.5 * 2^23
  x = fmaxf(x, -126.f);
  const float t = x + kRound;
  const float f = x - (t - kRound);
  const float p = fmaf(fmaf(fmaf(0.0551716691f, f, 0.242611122f), f, 0.693260985f), f, 0.999928074f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}

// Online softmax of one S tile, in place (S becomes P, fp32), in the log2 domain: m is the
// row's base, the running max of scale_log2 * s (with kLazyRescale, at most that much below it),
// l the thread's partial row sum relative to it (reduced over the quad at the end), factor what
// O must be multiplied by.
template <int W = T::kBlockN>
__device__ __forceinline__ void softmax_tile(float (&s)[T::kBlockN / 2], float (&m)[2], float (&l)[2],
                                             float (&factor)[2], float scale_log2) {
  float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
  for (int c = 0; c < W / 8; ++c) {
    mx[0] = fmaxf(mx[0], fmaxf(s[4 * c], s[4 * c + 1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[4 * c + 2], s[4 * c + 3]));
  }
  float neg_base[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float m_new = fmaxf(m[r], mx[r] * scale_log2);
    if constexpr (T::kLazyRescale > 0) {
      // The row's base moves only when its max grows by more than kLazyRescale (log2 units):
      // P stays below 2^kLazyRescale, and O's rescale is skipped while no row needs one.
      if (m_new > m[r] + float(T::kLazyRescale)) {  // always for a row's first key (m = -inf)
        factor[r] = ex2(m[r] - m_new);
        m[r] = m_new;
      } else {
        factor[r] = 1.f;
      }
      neg_base[r] = m[r] == neg_inf() ? 0.f : -m[r];  // a row that saw no key yet
    } else {
      const float base = m_new == neg_inf() ? 0.f : m_new;  // a row that saw no key yet
      factor[r] = ex2(m[r] - base);
      m[r] = m_new;
      neg_base[r] = -base;
    }
  }
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int c = 0; c < W / 8; ++c)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float x0 = fmaf(s[4 * c + e], scale_log2, neg_base[0]);
      const float x1 = fmaf(s[4 * c + 2 + e], scale_log2, neg_base[1]);
      const bool fma_pipe = c % 4 < T::kExp2Emu;  // exp2_emu of every 4 column chunks
      s[4 * c + e] = fma_pipe ? exp2_fma(x0) : ex2(x0);
      s[4 * c + 2 + e] = fma_pipe ? exp2_fma(x1) : ex2(x1);
      sum[0] += s[4 * c + e];
      sum[1] += s[4 * c + 2 + e];
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = l[r] * factor[r] + sum[r];
}

__device__ __forceinline__ void rescale_o(float (&o)[T::kHeadDim / 2], const float (&factor)[2]) {
  // Lazy: the whole warp skips it while every factor is 1 (a uniform branch).
  if (T::kLazyRescale > 0 && !__any_sync(0xffffffffu, factor[0] != 1.f || factor[1] != 1.f)) return;
#pragma unroll
  for (int c = 0; c < T::kHeadDim / 8; ++c) {
    o[4 * c] *= factor[0];
    o[4 * c + 1] *= factor[0];
    o[4 * c + 2] *= factor[1];
    o[4 * c + 3] *= factor[1];
  }
}

// P (fp32 accumulator layout) -> the m16n8k16 A fragments of wgmma's register operand.
template <int W = T::kBlockN>
__device__ __forceinline__ void pack_p(u32 (&pa)[T::kPSteps][4], const float (&s)[T::kBlockN / 2]) {
#pragma unroll
  for (int kk = 0; kk < W / 16; ++kk) {
    pa[kk][0] = pack2<T::kBf16>(s[8 * kk], s[8 * kk + 1]);      // row g,   keys 16kk+2t
    pa[kk][1] = pack2<T::kBf16>(s[8 * kk + 2], s[8 * kk + 3]);  // row g+8, keys 16kk+2t
    pa[kk][2] = pack2<T::kBf16>(s[8 * kk + 4], s[8 * kk + 5]);  // row g,   keys 16kk+8+2t
    pa[kk][3] = pack2<T::kBf16>(s[8 * kk + 6], s[8 * kk + 7]);  // row g+8, keys 16kk+8+2t
  }
}

// A work tile: query block m_block of (batch, head), visiting n K/V tiles.
struct WorkTile {
  int m_block, head, batch, n;
  int lo, hi;           // the K/V iterations this CTA computes: [0, n) but for a split tail piece
  int u, slot;          // tail tile index (-1: not split) and this piece's workspace slot
  // Varlen: the sequence's first query and key rows in the packed tensors, and its lengths.
  // Kvcache: 0, 0, seqlen_q and the sequence's keys. (Dense: unset; the code reads AttnParams.)
  int q0, k0, len_q, len_k;
};

// Work tile t of the grid's (m block, head, batch) tiles, m blocks fastest so that CTAs running
// together share K/V in L2. Causal: (batch, head) pairs in groups of kHeadGroup, and inside a
// group the longest m blocks of all its heads first, so that the short tiles of one group fill
// the SMs the long ones of the next leave free (per head alone, each head's long tiles start
// behind the previous head's short ones and the grid ends unevenly); a small group keeps the
// K/V that CTAs running together read within a few heads.
//
// Varlen: the tiles of the packed sequences without the longest one's grid for every sequence
// (whose blocks past a short sequence's end, empty CTAs, cost 1.4% at issue 25's batch: run 105).
// Sequence b's tiles sit at indices heads_q * varlen_start(b) onwards, varlen_start(b) =
// floor(cu_seqlens_q[b] / block_m) + b, ceil(len_b / block_m) * heads_q of them: the starts
// increase and a sequence's tiles fit before the next one's (at most heads_q indices between two
// sequences are empty), so tile t's sequence is found by a binary search over cu_seqlens_q, and the
// index space is (floor(total_q / block_m) + batch) * heads_q (launch.h). Inside a sequence the
// tiles go as a dense batch's do (below): causal in head groups, longest blocks first. (Every
// head of a block together, head groups aside, ran 2% slower on 16 equal sequences: run 106.)
__device__ __forceinline__ int varlen_start(const AttnParams& p, int b) {
  return p.cu_seqlens_q[b] / T::kBlockM + b;
}
//
// Longest first (maps.varlen_order, when the launch ordered the sequences): the sequences by
// descending key count, each one's tiles contiguous from its start in that order (no empty
// indices but past the last: the grid is the packed index space's, an upper bound), so the CTAs
// that start first take the longest sequences' tiles and the short ones fill the end.
__device__ __forceinline__ WorkTile varlen_tile(const AttnParams& p, const TmaMaps& maps, int t) {
  WorkTile w;
  int seq, r;  // the sequence, and the tile inside it
  if (const int* order = maps.varlen_order) {
    const int* start = order + p.batch;
    int lo = 0, hi = p.batch;  // the last position starting at or before t (batch: past the end)
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (start[mid] <= t) lo = mid;
      else hi = mid - 1;
    }
    seq = order[min(lo, p.batch - 1)];
    r = lo < p.batch ? t - start[lo] : 1 << 30;
  } else {
    const int i = t / p.heads_q;
    int lo = 0, hi = p.batch - 1;  // the last sequence starting at or before i
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (varlen_start(p, mid) <= i) lo = mid;
      else hi = mid - 1;
    }
    seq = lo;
    r = t - (p.cu_seqlens_q[lo] / T::kBlockM + lo) * p.heads_q;
  }
  w.batch = seq;
  w.q0 = p.cu_seqlens_q[seq];
  w.k0 = p.cu_seqlens_k[seq];
  w.len_q = p.cu_seqlens_q[seq + 1] - w.q0;
  w.len_k = p.cu_seqlens_k[seq + 1] - w.k0;
  const int mb = (w.len_q + T::kBlockM - 1) / T::kBlockM;
  if (r >= mb * p.heads_q) {  // between two sequences, or past the last: no keys, rows nobody stores
    w.head = 0;
    w.m_block = mb;
    w.n = 0;
    return w;
  }
  if constexpr (T::kCausal) {
    const int g0 = r / (T::kHeadGroup * mb) * T::kHeadGroup, group = min(T::kHeadGroup, p.heads_q - g0);
    const int rg = r - g0 * mb;
    w.m_block = mb - 1 - rg / group;
    w.head = g0 + rg % group;
  } else {
    w.head = r / mb;
    w.m_block = r % mb;
  }
  const int diag = w.len_k - w.len_q;
  const int kv_end = T::kCausal ? min(w.len_k, (w.m_block + 1) * T::kBlockM + diag) : w.len_k;
  w.n = kv_end > 0 ? (kv_end + T::kBlockN - 1) / T::kBlockN : 0;
  return w;
}

__device__ __forceinline__ WorkTile work_tile(const AttnParams& p, const TmaMaps& maps, int t, int m_blocks) {
  if constexpr (T::kVarlen) return varlen_tile(p, maps, t);
  WorkTile w;
  int bh;
  if constexpr (T::kCausal) {
    const int g0 = t / (T::kHeadGroup * m_blocks) * T::kHeadGroup;  // the group's first (batch, head)
    const int group = min(T::kHeadGroup, p.heads_q * p.batch - g0);
    const int r = t - g0 * m_blocks;  // tile inside the group
    w.m_block = m_blocks - 1 - r / group;
    bh = g0 + r % group;
  } else {
    bh = t / m_blocks;
    w.m_block = t % m_blocks;
  }
  w.head = bh % p.heads_q;
  w.batch = bh / p.heads_q;
  int len_k = p.seqlen_k;
  if constexpr (T::kKvcache) {  // the sequence's keys: cache_seqlens, clamped to 0..seqlen_k
    if (p.cache_seqlens) len_k = max(0, min(p.seqlen_k, p.cache_seqlens[w.batch]));
    w.q0 = w.k0 = 0;
    w.len_q = p.seqlen_q;
    w.len_k = len_k;
  }
  const int diag = len_k - p.seqlen_q;
  const int kv_end = T::kCausal ? min(len_k, (w.m_block + 1) * T::kBlockM + diag) : len_k;
  w.n = kv_end > 0 ? (kv_end + T::kBlockN - 1) / T::kBlockN : 0;
  return w;
}

// Work tile t whole: K/V iterations [0, n), not a split piece.
__device__ __forceinline__ WorkTile plain_tile(const AttnParams& p, const TmaMaps& maps, int t, int m_blocks) {
  WorkTile w = work_tile(p, maps, t, m_blocks);
  w.lo = 0;
  w.hi = w.n;
  w.u = -1;
  return w;
}

// The work items of CTA c (of C), in turn: `next` starts at c and `next_item` advances it. First
// the plain work tiles c, c + C, ... below the split tail (next is the tile); then, with
// Traits::kSplitTail, the CTA's share of the tail's K/V iterations: at most two pieces, as a share
// is shorter than a tile (next is plain_end + C + the piece). Without a split this is the plain
// `t < tiles; t += C` loop. The pieces are computed once, before the warpgroups part
// (split_pieces): the producer runs on 24 registers, and the divisions spilled there.
__device__ __forceinline__ bool next_item(const AttnParams& p, const TmaMaps& maps, const Smem& sm, int c, int C,
                                          int tiles, int m_blocks, int& next, WorkTile& w) {
  // Traits::kScheduleInSmem: the end of the plain tiles and the query blocks from shared memory.
  const int plain_end = T::kScheduleInSmem ? ld_shared_s32(sm.pieces() + 24) : tiles;
  if (T::kScheduleInSmem) m_blocks = ld_shared_s32(sm.pieces() + 28);
  if (next < plain_end) {
    w = plain_tile(p, maps, next, m_blocks);
    next += C;
    return true;
  }
  if (!T::kSplitTail) return false;  // (without a split the pieces below are empty)
  if (next < plain_end + C) next = plain_end + C;  // the first tail piece
  const int k = next++ - (plain_end + C);
  if (k > 1) return false;
  const int u = ld_shared_s32(sm.pieces() + 12 * k);
  if (u < 0) return false;
  w = work_tile(p, maps, plain_end + u, m_blocks);
  w.lo = ld_shared_s32(sm.pieces() + 12 * k + 4);
  w.hi = ld_shared_s32(sm.pieces() + 12 * k + 8);
  w.u = u;
  w.slot = 2 * c + k;
  return true;
}

// The split is over clusters (kCluster CTAs, kKvMulticast): the tail's clusters of tiles (tail
// tiles kCluster * v .. + kCluster - 1) are shared out among the grid's clusters, and the CTAs of
// one cluster take the same iterations of their own tile of it, so that they load the same K/V.
// Without kKvMulticast a cluster is a CTA. Cluster g of G, and tail cluster v, with the split's
// total = split_tail / kCluster * n iterations: g's share is [total * g / G, total * (g + 1) / G).
// 32-bit arithmetic: the launcher splits only when split_tail * n * C and tiles + 2 * C stay
// below 2^31.
__device__ __forceinline__ int tail_begin(int total, int g, int G) { return total * g / G; }
// CTA c's share as pieces k = 0, 1 in sm.pieces(): tail tile u (-1: none) and its iterations
// [lo, hi); then the plain tiles' end, tiles - split_tail, and the query blocks (next_item).
__device__ __forceinline__ void split_pieces(const AttnParams& p, const TmaMaps& maps, const Smem& sm, int c, int C,
                                             int tiles, int m_blocks) {
  const int split = T::kSplitTail ? maps.split_tail : 0;
  const int g = c / T::kCluster, G = C / T::kCluster, rank = c % T::kCluster;
  int n = 1, b = 0, e = 0;  // no split: an empty share
  if (split > 0) {
    n = (p.seqlen_k + T::kBlockN - 1) / T::kBlockN;  // > 0: the launcher splits only with keys
    const int total = split / T::kCluster * n;
    b = tail_begin(total, g, G);
    e = tail_begin(total, g + 1, G);
  }
  for (int k = 0; k < 2; ++k) {
    const int x = k == 0 ? b : (b / n + 1) * n;
    const int v = x < e ? x / n : -1;
    st_shared_s32(sm.pieces() + 12 * k, v < 0 ? -1 : v * T::kCluster + rank);
    st_shared_s32(sm.pieces() + 12 * k + 4, x - v * n);
    st_shared_s32(sm.pieces() + 12 * k + 8, min(e - v * n, n));
  }
  st_shared_s32(sm.pieces() + 24, tiles - split);  // the plain tiles' end
  st_shared_s32(sm.pieces() + 28, m_blocks);
}

// Quad (4 lanes) transpose: lane t's v[j] becomes lane j's former v[t]. Two butterfly stages,
// each exchanging two registers: 2x2 blocks over lanes t ^ 1, then the off-diagonal blocks over
// t ^ 2.
__device__ __forceinline__ void quad_transpose(u32 (&v)[4], int t) {
  const bool odd = t & 1, high = t & 2;
#pragma unroll
  for (int pr = 0; pr < 2; ++pr) {  // element 2pr + !odd goes to the partner
    const u32 got = __shfl_xor_sync(0xffffffffu, odd ? v[2 * pr] : v[2 * pr + 1], 1);
    if (odd) v[2 * pr] = got;
    else v[2 * pr + 1] = got;
  }
#pragma unroll
  for (int e = 0; e < 2; ++e) {  // block !high goes to the partner
    const u32 got = __shfl_xor_sync(0xffffffffu, high ? v[e] : v[2 + e], 2);
    if (high) v[e] = got;
    else v[2 + e] = got;
  }
}

// A finished work tile's rows of one consumer warpgroup, ready to store: O / l in the output
// dtype (this thread's 8-column chunks), LSE in natural log, and where they go.
struct OutRows {
  uint4 vec[2][T::kHeadDim / 32];
  float lse[2];
  int row0, head, batch;  // this thread's first row, and row0 + 8
  int q0, len_q;          // varlen: the sequence's first packed row and its length
};

// The epilogue's arithmetic: O / l packed to the output dtype for 16-byte stores. Thread t of a
// quad holds columns 8c + 2t, +1 of every 8-column chunk c; a 4x4 transpose over the quad hands
// it all 8 columns of chunk 4q + t. A quarter of the store instructions of 4-byte stores, and
// full 32-byte sectors (those took ~2 us of a 56 us work tile at s=4096, docs/log/WGMMA.md run 30).
__device__ __forceinline__ void epilogue_pack(const float (&o)[T::kHeadDim / 2], const float (&m)[2], float (&l)[2],
                                              int row0, int head, int batch, OutRows& out) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    // A row whose max is still -inf saw no key: output 0, LSE -inf (its l may hold 2^-126 terms).
    const bool seen = m[h] != neg_inf();
    const float inv = seen ? rcp_approx(l[h]) : 0.f;  // no IEEE-division branch
    out.lse[h] = seen ? (m[h] + lg2(l[h])) * 0.6931471805599453f : neg_inf();
#pragma unroll
    for (int q = 0; q < T::kHeadDim / 32; ++q) {
      u32 v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j)
        v[j] = pack2<T::kBf16>(o[4 * (4 * q + j) + 2 * h] * inv, o[4 * (4 * q + j) + 2 * h + 1] * inv);
      quad_transpose(v, t);
      out.vec[h][q] = make_uint4(v[0], v[1], v[2], v[3]);
    }
  }
  out.row0 = row0;
  out.head = head;
  out.batch = batch;
}

// Varlen: where the rows go, the sequence's (after epilogue_pack).
__device__ __forceinline__ void epilogue_sequence(const WorkTile& w, OutRows& out) {
  if constexpr (T::kVarlen) {
    out.q0 = w.q0;
    out.len_q = w.len_q;
  }
}

// The epilogue's stores (all of them when `any`), predicated rather than branched over. With the
// packing at a tile's end and these at the next tile's start (before its Q wait), s=4k and s=16k
// ran 1-1.5% faster than the whole epilogue branched at the tile's end (docs/log/WGMMA.md run 32). Out rows and
// strides are 16-byte aligned (the launchers check).
__device__ __forceinline__ void epilogue_store(const AttnParams& p, const OutRows& out, bool any) {
  const int t = threadIdx.x % 4;
  // Where the rows go: O and LSE of (batch, head); varlen, the sequence's rows from its first
  // packed one in O [total_q, heads_q, d] and LSE [heads_q, total_q].
  elem_t* base;
  long long lse_row;  // LSE of the tile's row 0
  int rows;           // rows of the sequence: those at or past it are not stored
  if constexpr (T::kVarlen) {
    base = static_cast<elem_t*>(p.o) + static_cast<long long>(out.q0) * p.o_stride[2] + out.head * p.o_stride[1];
    lse_row = static_cast<long long>(out.head) * (p.lse ? p.cu_seqlens_q[p.batch] : 0) + out.q0;
    rows = out.len_q;
  } else {
    base = static_cast<elem_t*>(p.o) + out.batch * p.o_stride[0] + out.head * p.o_stride[1];
    lse_row = (static_cast<long long>(out.batch) * p.heads_q + out.head) * p.seqlen_q;
    rows = p.seqlen_q;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = out.row0 + 8 * h;
    const bool in = any && row < rows;
    elem_t* orow = base + row * p.o_stride[2] + 8 * t;
#pragma unroll
    for (int q = 0; q < T::kHeadDim / 32; ++q) st_global_v4_if(orow + 32 * q, out.vec[h][q], in);
    st_global_f32_if(p.lse + lse_row + row, out.lse[h], in && p.lse && t == 0);
  }
}

// A split tail piece: this warp's partial O, m and l to its workspace slot; the warp that
// arrives last for its (tile, warp) combines every piece, in piece order (deterministic), into
// o, m, l. The others get m = NaN: nothing to store.
__device__ __forceinline__ void split_combine(const TmaMaps& maps, const WorkTile& w, int cw, float (&o)[T::kHeadDim / 2],
                                              float (&m)[2], float (&l)[2]) {
  constexpr int kVals = T::kHeadDim / 2 + 4, kWarps = T::kConsumerWgs * 4;
  const int lane = threadIdx.x % 32, warp = cw * 4 + (threadIdx.x / 32) % 4;
  auto at = [&](int slot) { return maps.split_ws + (static_cast<long long>(slot) * kWarps + warp) * kVals * 32 + lane; };
  float* mine = at(w.slot);
#pragma unroll
  for (int i = 0; i < T::kHeadDim / 2; ++i) mine[i * 32] = o[i];
  mine[(T::kHeadDim / 2 + 0) * 32] = m[0];
  mine[(T::kHeadDim / 2 + 1) * 32] = m[1];
  mine[(T::kHeadDim / 2 + 2) * 32] = l[0];
  mine[(T::kHeadDim / 2 + 3) * 32] = l[1];
  __threadfence();
  __syncwarp();
  // In clusters (split_pieces): tail cluster v, rank `rank` in it, of G clusters.
  const int n = w.n, total = maps.split_tail / T::kCluster * n;
  const int G = gridDim.x * gridDim.y * gridDim.z / T::kCluster;
  const int v = w.u / T::kCluster, rank = w.u % T::kCluster;
  // The clusters whose shares meet this tile: g_first holds iteration v*n, g_last (v+1)*n - 1
  // (the owner of iteration x is the largest g with total * g / G <= x).
  auto owner = [&](int x) { return ((x + 1) * G - 1) / total; };
  const int g_first = owner(v * n), g_last = owner((v + 1) * n - 1);
  const int pieces = g_last - g_first + 1;
  int* cnt = maps.split_count + w.u * kWarps + warp;
  int old = 0;
  if (lane == 0) old = atomicAdd(cnt, 1);
  old = __shfl_sync(0xffffffffu, old, 0);
  if (old != pieces - 1) {
    m[0] = m[1] = __int_as_float(0x7fc00000);
    return;
  }
  if (lane == 0) *cnt = 0;  // for the next launch
  __threadfence();
  // Cluster g's piece of this tile is its CTA of this rank's first piece when g's share starts
  // in tail cluster v, else its second.
  auto slot_of = [&](int g) { return 2 * (g * T::kCluster + rank) + (tail_begin(total, g, G) / n == v ? 0 : 1); };
  float mx[2] = {neg_inf(), neg_inf()};
  for (int g = g_first; g <= g_last; ++g) {
    const float* q = at(slot_of(g));
    mx[0] = fmaxf(mx[0], __ldcg(q + (T::kHeadDim / 2 + 0) * 32));
    mx[1] = fmaxf(mx[1], __ldcg(q + (T::kHeadDim / 2 + 1) * 32));
  }
#pragma unroll
  for (int i = 0; i < T::kHeadDim / 2; ++i) o[i] = 0.f;
  l[0] = l[1] = 0.f;
  for (int g = g_first; g <= g_last; ++g) {
    const float* q = at(slot_of(g));
    const float f0 = ex2(__ldcg(q + (T::kHeadDim / 2 + 0) * 32) - mx[0]);
    const float f1 = ex2(__ldcg(q + (T::kHeadDim / 2 + 1) * 32) - mx[1]);
    l[0] += __ldcg(q + (T::kHeadDim / 2 + 2) * 32) * f0;
    l[1] += __ldcg(q + (T::kHeadDim / 2 + 3) * 32) * f1;
#pragma unroll
    for (int i = 0; i < T::kHeadDim / 2; ++i) o[i] += __ldcg(q + i * 32) * ((i & 2) ? f1 : f0);
  }
  m[0] = mx[0];
  m[1] = mx[1];
}

// One consumer warpgroup (cw) over the n K/V tiles of one work tile; its rows end packed in
// `out`, which holds the CTA's previous work tile's rows on entry (stored first when `had`; the
// kernel stores the last tile's after its loop).
// it_base counts the K/V iterations of the CTA's earlier work tiles (ring stages and phases);
// q_phase the Q loads of tiles with n > 0.
__device__ __forceinline__ void consume(const AttnParams& p, const Smem& sm, const TmaMaps& maps, int cw,
                                        const WorkTile& w, int it_base, u32 q_phase, OutRows& out, bool had,
                                        int trace_k = 0) {
  const int m_block = w.m_block, head = w.head, batch = w.batch, n = w.n, lo = w.lo, end = w.hi;
  it_base -= lo;  // ring slot of iteration it: it_base + it
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int row0 = m_block * T::kBlockM + cw * 64 + warp * 16 + g;  // and row0 + 8
  const int len_q = T::kSeqLens ? w.len_q : p.seqlen_q;
  const int sk = T::kSeqLens ? w.len_k : p.seqlen_k, diag = T::kSeqLens ? w.len_k - w.len_q : p.seqlen_k - p.seqlen_q;
  // Tiles at or past this key need masking for some row of the CTA.
  const int kv_min = T::kCausal ? min(sk, m_block * T::kBlockM + diag + 1) : sk;

  float o[T::kHeadDim / 2];  // (64 rows, head_dim) accumulator, this thread's part
#pragma unroll
  for (int i = 0; i < T::kHeadDim / 2; ++i) o[i] = 0.f;
  float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f}, factor[2];
  ATT_MARK(trace_k, 0, clock64());
  ATT_MARK(trace_k, 7, global_ns());
  epilogue_store(p, out, had);
  float s[T::kBlockN / 2];     // (64 rows, block_n) scores, then P in fp32
  u32 pa[T::kPSteps][4];       // P as 16-bit A fragments

  // Ping-pong (a ring of the consumer warpgroups): warpgroup cw issues its GEMMs between
  // sync(bar 1+cw) and arrive(bar of the next warpgroup). The kernel lets warpgroup 0 go first
  // and consumes the last warpgroup's final arrive.
  auto pp_sync = [&]() {
    if (T::kPingPong) named_bar_sync(1 + cw, 256);
  };
  auto pp_arrive = [&]() {
    if (T::kPingPong) named_bar_arrive(1 + (cw + 1) % T::kConsumerWgs, 256);
  };
  auto release = [&](u32 empty_bar) {
    if (lane == 0) mbar_arrive(empty_bar);
  };
  // A K/V stage: with kKvMulticast the peer CTA's producer writes into it too, so it is released
  // in both CTAs (their empty barriers count both CTAs' consumer warps).
  const u32 peer = T::kKvMulticast ? cluster_ctarank() ^ 1 : 0;
  auto release_kv = [&](u32 empty_bar) {
    if (lane == 0) {
      mbar_arrive(empty_bar);
      if (T::kKvMulticast) mbar_arrive_cluster(empty_bar, peer);
    }
  };
  // Q's buffer is free once this warpgroup's last Q.K^T has completed: the next work tile's Q
  // (a persistent CTA's) then loads during the last P.V and the epilogue, not after them: its
  // ~2 us from memory stalled each tile's start (docs/log/WGMMA.md run 30).
  auto q_done = [&](bool last_qk) {
    if (last_qk) release(sm.q_empty());
  };

  if (n > 0) {
    mbar_wait(sm.q_full(), q_phase);
    ATT_MARK(trace_k, 1, clock64());
    const u64 q_desc = smem_desc_sw128(sm.q + cw * 64 * 128, 16, 1024);
    auto k_desc = [&](int st) { return smem_desc_sw128(sm.k + st * T::kKVBytes, 16, 1024); };
    auto v_desc = [&](int st) { return smem_desc_sw128(sm.v + st * T::kKVBytes, T::kKVColBlockBytes, 1024); };
    auto needs_mask = [&](int tile) { return (tile + 1) * T::kBlockN > kv_min; };
    // V of iteration `it` (tile n-1-it) landed. Kvcache: the rows of the sequence's last tile past
    // its keys hold whatever the cache (or an earlier tile, or nothing) left there, NaN included,
    // which P's zeros would not cancel (0 * NaN): zeroed first (the last tile is iteration 0).
    const int v_valid = T::kKvcache ? sk - (n - 1) * T::kBlockN : T::kBlockN;
    auto wait_v = [&](const Slot& sl, int it) {
      mbar_wait(sm.v_full(sl.stage), sl.phase);
      if (T::kKvcache && it == 0 && v_valid < T::kBlockN) zero_v_tail(sm.v + sl.stage * T::kKVBytes, v_valid, cw);
    };
    // The first `skip` iterations visit K/V tiles none of this warpgroup's 64 rows sees: past its
    // causal diagonal when block_m > block_n, or all of them for rows past seqlen_q (the last
    // query block). They only keep the ring in step: wait for the tile, take the ping-pong turn,
    // release the stages (after the full barrier, so the arrive counts toward this use of the
    // stage). Broadcast so that the loop bounds stay warp-uniform for ptxas. Without a producer
    // warpgroup, consumer thread 0 issues the loads inside its loop and may skip nothing; a single
    // consumer warpgroup needs every tile of its CTA.
    const int wg_row0 = m_block * T::kBlockM + cw * 64;
    const int wg_kv_end = wg_row0 >= len_q ? 0 : T::kCausal ? min(sk, wg_row0 + 64 + diag) : sk;
    const int skip_all = T::kWarpSpecialize && T::kConsumerWgs > 1
                         ? warp_uniform(n - (wg_kv_end > 0 ? (wg_kv_end + T::kBlockN - 1) / T::kBlockN : 0))
                         : 0;
    // Iterations [lo, skip) idle, [skip, end) computed. A split piece (non-causal) has skip_all 0
    // or n. No min/max clamp here: ptxas 13.0 fused max(lo, min(skip_all, end)) into a VIMNMX.RELU
    // whose predicate output then stood in for `skip == end` below, wrongly: every build with
    // split_tail 0 hung (docs/log/WGMMA.md run 34).
    const int skip = w.u < 0 ? skip_all : skip_all > 0 ? end : lo;
    auto idle_turn = [&](int it) {
      const Slot sl(it_base + it);
      mbar_wait(sm.k_full(sl.stage), sl.phase);
      pp_sync();
      pp_arrive();
      release_kv(sm.k_empty(sl.stage));
      mbar_wait(sm.v_full(sl.stage), sl.phase);
      release_kv(sm.v_empty(sl.stage));
    };
    for (int it = lo; it < skip; ++it) idle_turn(it);
    q_done(skip == end);
    // The first tile this warpgroup computes, n-1-skip, is narrow when the keys its rows see end
    // within kNarrowN of its start: the ragged end of the keys (s=4096 in tiles of 192 leaves 64),
    // or the causal diagonal of a warpgroup whose rows start a tile's span.
    // None when it computes no tile (skip == end): a split piece's idle warpgroup ends before the
    // key tiles do, and the test below alone would make it compute past its piece (and hang).
    const bool narrow = T::kNarrowN > 0 && skip < end &&
                        warp_uniform(min(sk, wg_kv_end) - (n - 1 - skip) * T::kBlockN <= T::kNarrowN);
    // Mask, softmax and pack of S for tile `tile`, narrow or full width (called with constants).
    auto s_tile = [&](int tile, bool nar) {
      if (nar) {
        if (needs_mask(tile)) mask_tile<T::kNarrowW>(s, tile, row0, t, sk, diag);
        softmax_tile<T::kNarrowW>(s, m, l, factor, p.scale_log2);
        pack_p<T::kNarrowW>(pa, s);
      } else {
        if (needs_mask(tile)) mask_tile(s, tile, row0, t, sk, diag);
        softmax_tile(s, m, l, factor, p.scale_log2);
        pack_p(pa, s);
      }
    };

    if constexpr (!T::kIntraWgOverlap) {
      auto step = [&](int it, bool nar) {
        const Slot sl(it_base + it);
        const int tile = n - 1 - it;
        mbar_wait(sm.k_full(sl.stage), sl.phase);
        pp_sync();
        gemm_qk_w(nar, s, q_desc, k_desc(sl.stage));
        wgmma_wait<0>();
        reg_fence(s);
        q_done(it == end - 1);
        pp_arrive();
        release_kv(sm.k_empty(sl.stage));
        s_tile(tile, nar);
        rescale_o(o, factor);
        wait_v(sl, it);
        gemm_pv_w(nar, o, pa, v_desc(sl.stage));
        wgmma_wait<0>();
        reg_fence(o);
        release_kv(sm.v_empty(sl.stage));
        if (!T::kWarpSpecialize && threadIdx.x == 0 && it + T::kStages < n)
          produce(sm, maps, p, it_base, it + T::kStages, n, head / p.q_per_kv, T::kVarlen ? w.k0 : batch, sk);
      };
      int it = skip;
      if (narrow) step(it++, true);
      for (; it < end; ++it) step(it, false);
    } else if (skip == end) {
      pp_sync();  // the turn of the last P.V
      pp_arrive();
    } else {
      // Prologue: S and P of the first tile.
      auto prologue = [&](bool nar) {
        const Slot first(it_base + skip);
        mbar_wait(sm.k_full(first.stage), first.phase);
        pp_sync();
        gemm_qk_w(nar, s, q_desc, k_desc(first.stage));
        pp_arrive();
        wgmma_wait<0>();
        reg_fence(s);
        q_done(skip == end - 1);
        release_kv(sm.k_empty(first.stage));
        s_tile(n - 1 - skip, nar);
      };
      // Iteration it: S_j of tile n-1-it beside P.V of the previous tile (narrow if pv_nar).
      auto step = [&](int it, bool pv_nar) {
        const Slot sl(it_base + it), prev(it_base + it - 1);
        const int tile = n - 1 - it;
        mbar_wait(sm.k_full(sl.stage), sl.phase);
        pp_sync();
        gemm_qk(s, q_desc, k_desc(sl.stage));          // S_j
        wait_v(prev, it - 1);
        gemm_pv_w(pv_nar, o, pa, v_desc(prev.stage));  // O += P_{j-1} V_{j-1}, in flight ...
        pp_arrive();
        wgmma_wait<1>();
        reg_fence(s);
        q_done(it == end - 1);
        release_kv(sm.k_empty(sl.stage));
        if (needs_mask(tile)) mask_tile(s, tile, row0, t, sk, diag);
        softmax_tile(s, m, l, factor, p.scale_log2);  // ... while this runs
        wgmma_wait<0>();
        reg_fence(o);
        release_kv(sm.v_empty(prev.stage));
        rescale_o(o, factor);
        pack_p(pa, s);
      };
      auto last_pv = [&](bool nar) {
        const Slot last(it_base + end - 1);
        wait_v(last, end - 1);
        pp_sync();
        gemm_pv_w(nar, o, pa, v_desc(last.stage));
        pp_arrive();
        wgmma_wait<0>();
        reg_fence(o);
        release_kv(sm.v_empty(last.stage));
      };
      if (narrow) prologue(true);
      else prologue(false);
      ATT_MARK(trace_k, 2, clock64());
      int it = skip + 1;
      if (narrow && it < end) step(it++, true);
      for (; it < end; ++it) step(it, false);
      ATT_MARK(trace_k, 3, clock64());
      if (narrow && skip == end - 1) last_pv(true);
      else last_pv(false);
      ATT_MARK(trace_k, 4, clock64());
      ATT_MARK(trace_k, 6, end - skip);
    }
  }

  if (w.u >= 0) split_combine(maps, w, cw, o, m, l);
  epilogue_pack(o, m, l, row0, head, batch, out);
  epilogue_sequence(w, out);
  if (w.u >= 0 && m[0] != m[0]) out.row0 = 1 << 30;  // not the last piece: nothing to store (NaN mark)
  ATT_MARK(trace_k, 5, clock64());
}

// Grid: one CTA per work tile, (ceil(seqlen_q / block_m), heads_q, batch); or persistent, any
// number of CTAs (the SM count): CTA c then takes work tiles c, c + CTAs, ... in turn, and the
// producer loads the next tile's Q and K/V while the consumers finish the current one.
// Block T::kThreads, dynamic smem T::kSmemBytes. With kKvMulticast the grid runs in clusters of
// two (the launcher makes it even) and the query blocks are padded to pairs.
#if KV_MULTICAST
#define ATT_CLUSTER_DIMS __cluster_dims__(2, 1, 1)
#else
#define ATT_CLUSTER_DIMS
#endif
extern "C" __global__ void __launch_bounds__(T::kThreads, 1) ATT_CLUSTER_DIMS
flash_fwd_wgmma(const AttnParams p, const __grid_constant__ TmaMaps maps) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  Smem sm;
  sm.q = (smem_addr(smem_raw) + 1023) & ~1023u;
  sm.k = sm.q + T::kOffK;
  sm.v = sm.q + T::kOffV;
  sm.bars = sm.q + T::kOffBars;

  const int m_blocks = T::query_blocks(p.seqlen_q);
  // Varlen: the packed index space's tiles (launch.h), one CTA each or a persistent grid.
  const int tiles = T::kVarlen ? maps.varlen_tiles : m_blocks * p.heads_q * p.batch;
  const int ctas = gridDim.x * gridDim.y * gridDim.z;
  const int first_tile = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);

  if (threadIdx.x == 0) {
    mbar_init(sm.q_full(), 1);
    mbar_init(sm.q_empty(), T::kConsumerWgs * 4);  // one arrive per consumer warp
    if constexpr (T::kScheduleInSmem) split_pieces(p, maps, sm, first_tile, ctas, tiles, m_blocks);
    for (int st = 0; st < T::kStages; ++st) {
      mbar_init(sm.k_full(st), 1);
      mbar_init(sm.v_full(st), 1);
      mbar_init(sm.k_empty(st), T::kConsumerWgs * 4 * T::kCluster);  // and the peer's warps (kKvMulticast)
      mbar_init(sm.v_empty(st), T::kConsumerWgs * 4 * T::kCluster);
    }
    mbar_init_fence();
  }
  __syncthreads();
  if constexpr (T::kKvMulticast) cluster_sync();  // the peer's barriers are ready for its copies and arrives

  // Producer side for one work tile: K/V iteration 0 (into a stage the previous tile freed),
  // then Q once the consumers are done with the previous tile's, then the other iterations
  // (all of them with a producer warpgroup; without, the first `stages` and the consumer loop
  // issues the rest).
  // A split tail piece loads only its iterations [w.lo, w.hi) (count = w.hi - w.lo with a producer).
  // Dynamic tiles: tile index `sched` goes to the consumers before the Q load; with count 0 (a
  // tile without keys, or the end mark) q_full gets a plain arrive instead. Else sched is unused.
  auto produce_tile = [&](const WorkTile& w, int it_base, u32 q_phase, int count, int sched) {
    const int kv_head = w.head / p.q_per_kv;
    it_base -= w.lo;
    const bool loads = !T::kDynamicTiles || count > 0;  // the static schedules pass no empty tile
    const int kv_batch = T::kVarlen ? w.k0 : w.batch;  // varlen: the sequence's first key row
    const int len_k = T::kSeqLens ? w.len_k : p.seqlen_k;
    if (loads) produce(sm, maps, p, it_base, w.lo, w.n, kv_head, kv_batch, len_k);
    mbar_wait(sm.q_empty(), q_phase ^ 1);
    if (T::kDynamicTiles) st_shared_s32(sm.sched(), sched);
    if (loads) load_q(sm, maps, p, w.m_block, w.head, w.batch, T::kVarlen ? w.q0 : 0);
    else mbar_arrive(sm.q_full());
    for (int it = w.lo + 1; it < w.lo + count; ++it) produce(sm, maps, p, it_base, it, w.n, kv_head, kv_batch, len_k);
  };
  // Dynamic tiles (causal, persistent, with a producer): after its first tile (the CTA's index)
  // the producer takes the next one from the counter once it has issued the current tile's last
  // load, so that the CTAs that finish first take the next longest tiles (without a counter:
  // round-robin). Every tile, those without keys and the end mark (an index >= tiles) included,
  // passes through q_full; the consumers read its index there.

  if constexpr (T::kWarpSpecialize) {
    const int wg = threadIdx.x / 128;
    if (wg == 0) {
      setmaxnreg_dec<T::kProducerRegs>();
      if (threadIdx.x == 0) {
        tma_prefetch_desc(&maps.q);
        tma_prefetch_desc(&maps.k);
        tma_prefetch_desc(&maps.v);
        int it_base = 0;
        u32 q_phase = 0;
        WorkTile w{};
        if constexpr (T::kDynamicTiles) {
          int* const counter = maps.tile_count;
          for (int t = first_tile; t < tiles;) {
            w = plain_tile(p, maps, t, m_blocks);
            produce_tile(w, it_base, q_phase, w.n, t);
            q_phase ^= 1;
            it_base += w.n;
            // t back from shared memory: kept in a register through the loads, the producer spilled.
            t = counter ? ctas + atomicAdd(counter, 1) : ld_shared_s32(sm.sched()) + ctas;
          }
          produce_tile(w, it_base, q_phase, 0, tiles);  // the end mark
          // The last CTA to be done with the counter resets both for the next launch.
          if (counter) {
            __threadfence();
            if (atomicAdd(counter + 1, 1) == ctas - 1) {
              atomicExch(counter, 0);
              atomicExch(counter + 1, 0);
            }
          }
        } else {
          for (int next = first_tile; next_item(p, maps, sm, first_tile, ctas, tiles, m_blocks, next, w);) {
            if (w.n == 0) continue;
            produce_tile(w, it_base, q_phase, w.hi - w.lo, -1);
            it_base += w.hi - w.lo;
            q_phase ^= 1;
          }
        }
      }
    } else {
      setmaxnreg_inc<T::kConsumerRegs>();
      const int cw = wg - 1;
      if (T::kPingPong && cw == T::kConsumerWgs - 1) named_bar_arrive(1, 256);  // warpgroup 0 goes first
      int it_base = 0, trace_k = 0;
      u32 q_phase = 0;
      OutRows out{};
      bool had = false;
      WorkTile w;
      for (int next = first_tile;;) {
        if constexpr (T::kDynamicTiles) {
          mbar_wait(sm.q_full(), q_phase);
          const int t = warp_uniform(ld_shared_s32(sm.sched()));
          if (t >= tiles) break;
          w = plain_tile(p, maps, t, m_blocks);
        } else if (!next_item(p, maps, sm, first_tile, ctas, tiles, m_blocks, next, w)) {
          break;
        }
        consume(p, sm, maps, cw, w, it_base, q_phase, out, had, trace_k++);
        if (T::kDynamicTiles && w.n == 0 && threadIdx.x % 32 == 0) mbar_arrive(sm.q_empty());  // its index read
        had = true;
        it_base += w.hi - w.lo;
        q_phase ^= T::kDynamicTiles || w.n > 0;
      }
      epilogue_store(p, out, had);
      if (T::kPingPong && cw == 0) named_bar_sync(1, 256);  // the last warpgroup's final arrive
    }
  } else {
    int it_base = 0;
    u32 q_phase = 0;
    OutRows out{};
    bool had = false;
    WorkTile w;
    for (int next = first_tile; next_item(p, maps, sm, first_tile, ctas, tiles, m_blocks, next, w);) {
      if (threadIdx.x == 0 && w.n > 0) produce_tile(w, it_base, q_phase, min(w.n, T::kStages), -1);
      consume(p, sm, maps, threadIdx.x / 128, w, it_base, q_phase, out, had);
      had = true;
      it_base += w.n;
      q_phase ^= w.n > 0;
    }
    epilogue_store(p, out, had);
  }
  if constexpr (T::kKvMulticast) cluster_sync();  // the peer may still arrive on this CTA's barriers
}

// ---- the order of a varlen call's work tiles (launch.h: the launch before the main kernel) ----
// One CTA of kVarlenOrderThreads threads, thread i for sequence i: its rank by key count
// (descending; ties by index, so the order is deterministic), the sequences in that order into
// order[0, batch), and each one's first work tile, the exclusive prefix sum of the tile counts
// (ceil(len_q / kBlockM) * heads_q) in that order, into order[batch, 2 * batch + 1). Every build
// has this entry point (a family's kernels are the same in every build); it does something in a
// varlen build only, and the plan launches it only there, for at most kVarlenOrderThreads
// sequences.
extern "C" __global__ void __launch_bounds__(kVarlenOrderThreads)
flash_fwd_wgmma_varlen_order(const AttnParams p, int* order) {
  if constexpr (T::kVarlen) {
    __shared__ int keys[kVarlenOrderThreads], scan[kVarlenOrderThreads];
    const int i = threadIdx.x, n = p.batch;
    if (!order || n < 1 || n > kVarlenOrderThreads) return;
    const int key = i < n ? p.cu_seqlens_k[i + 1] - p.cu_seqlens_k[i] : 0;
    const int tiles = i < n ? (p.cu_seqlens_q[i + 1] - p.cu_seqlens_q[i] + T::kBlockM - 1) / T::kBlockM * p.heads_q : 0;
    keys[i] = key;
    scan[i] = 0;
    __syncthreads();
    int rank = 0;
    if (i < n)
      for (int j = 0; j < n; ++j) rank += keys[j] > key || (keys[j] == key && j < i);
    __syncthreads();
    if (i < n) {
      order[rank] = i;
      scan[rank] = tiles;
    }
    __syncthreads();
    for (int off = 1; off < kVarlenOrderThreads; off <<= 1) {  // inclusive scan (Hillis-Steele)
      const int v = i >= off ? scan[i - off] : 0;
      __syncthreads();
      scan[i] += v;
      __syncthreads();
    }
    if (i < n) order[n + i] = i == 0 ? 0 : scan[i - 1];
    if (i == 0) order[2 * n] = scan[n - 1];
  }
}

}  // namespace att
