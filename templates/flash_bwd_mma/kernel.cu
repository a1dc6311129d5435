// flash_bwd_mma: FlashAttention-2-class attention backward (dQ, dK, dV) for sm_80..sm_90 using
// mma.sync m16n8k16 with fp32 accumulators. Three kernels, launched in order by launch.h:
//   flash_bwd_preprocess  D_i = rowsum(dO_i * O_i) and LSE_i * log2(e) into workspaces, dQ's fp32
//                         accumulator zeroed;
//   flash_bwd_mma         one CTA per (block of kBlockN keys, KV head, batch): K and V of its keys
//                         stay in shared memory and dK, dV in registers while it walks the query
//                         blocks of every query head of its KV head (GQA's sum over the group is a
//                         sum in registers), recomputing P from the LSE; dQ's share of each step is
//                         added into the fp32 accumulator with atomics (in a deterministic call,
//                         the key blocks' CTAs take turns on each query block: dq_step);
//   flash_bwd_convert     dQ = scale * accumulator, in the input dtype.
//
// The main loop works on the transposed score tile: warp w owns keys [w, w + 1) * 16 * kKeyTiles of
// the CTA's block, and computes S^T = K Q^T and dP^T = V dO^T for them (keys as MMA rows, queries as
// columns), so that P^T and dS^T = P^T o (dP^T - D) come out of the accumulators in the A-operand
// layout of dV += P^T dO and dK += dS^T Q without leaving registers (two n8 accumulator tiles are
// one k16 A fragment, as the forward's P is). Only dQ = dS K needs another warp's keys: dS^T goes
// through shared memory once, and each warp computes 16 query rows of dQ over all the block's keys.
// With kv_pairs (Traits::kPairs) two warps share 2 * kKeyTiles key tiles: each scores them against half
// of the step's queries, both write P^T and dS^T to shared memory, and each accumulates dK and dV of
// the shared keys over half of the head dims from there (FlashAttention-2's split).
//
// Per step and per key, the softmax backward of FlashAttention-2:
//   P_ij = exp2(scale * log2(e) * q_i.k_j - LSE_i * log2(e)),   dP_ij = dO_i.v_j,
//   dS_ij = P_ij (dP_ij - D_i),   dV_j += P_ij dO_i,   dK_j += scale dS_ij q_i,   dQ_i += scale dS_ij k_j.
// Masked pairs (causal, window) have P = 0, so they add nothing. Rows past seqlen_q have LSE +inf
// (P = 0) and zero dO; keys past seqlen_k are zero-filled K and V rows whose dK/dV are not stored
// (their dS times a zero K row adds nothing to dQ).
#include "../common/bwd_params.h"
#include "../common/ptx.cuh"
#include "../common/bwd_blocks.h"
#include "traits.cuh"

namespace att {

using T = Traits;

}  // namespace att

#include "../common/bwd_prepost.cuh"  // flash_bwd_preprocess, flash_bwd_convert

namespace att {

// ---- shared-memory tiles ----------------------------------------------------------------------
// Row-major (rows, kCols) 16-bit tiles in 16-byte chunks, each chunk index XORed with the row's
// pattern so that the 8 rows an ldmatrix phase reads and the 8 chunks a quarter warp's cp.async
// copies write fall in 8 different bank groups: rows of a multiple of 128 bytes (kCols 64, 128),
// chunk ^ (row % 8); rows of 64 bytes (kCols 32), chunk ^ ((row / 2) % 4).
template <int kCols>
__device__ __forceinline__ int swz(int row, int chunk) {
  constexpr int kChunks = kCols / 8;
  static_assert(kChunks % 8 == 0 || kChunks == 4, "tile rows of 64 bytes or a multiple of 128");
  if constexpr (kChunks % 8 == 0) return row * kCols + ((chunk ^ (row & 7)) << 3);
  else return row * kCols + ((chunk ^ ((row >> 1) & 3)) << 3);
}

// cp.async of rows [row0, row0 + kRows) of a (rows, kHeadDim) slice into a tile; rows at or past
// row_end, and the columns past the problem's head dim (Traits::kPadded), are zero-filled.
template <int kRows>
__device__ __forceinline__ void load_rows(elem_t* tile, const elem_t* gmem, long long row_stride, int row0,
                                          int row_end) {
  constexpr int kChunks = T::kHeadDim / 8;
  constexpr int kRowsPerPass = T::kThreads / kChunks;
  static_assert(kRows % kRowsPerPass == 0 || kRows < kRowsPerPass, "whole passes of rows");
  const int r = threadIdx.x / kChunks, c = threadIdx.x % kChunks;
#pragma unroll
  for (int it = 0; it < (kRows + kRowsPerPass - 1) / kRowsPerPass; ++it) {
    const int row = r + it * kRowsPerPass;
    if (kRows % kRowsPerPass == 0 || row < kRows) {
      const bool valid = row0 + row < row_end && (!T::kPadded || c * 8 < T::kHeadDimReal);
      const elem_t* src = valid ? gmem + (row0 + row) * row_stride + c * 8 : gmem;
      cp_async_16(smem_addr(tile + swz<T::kHeadDim>(row, c)), src, valid);
    }
  }
}

// A step's Q or dO tile (kBlockM rows): the thread copies chunk chunk() of rows row() + kRowsPerPass
// * it, so its source is the step's row 0 (uniform) plus its own offset (row() * stride + chunk() *
// 8: a few instructions a step; held in registers across the loop it spilled) plus it times a
// uniform stride, and its destination a constant offset in the stage's tile. load_rows recomputes
// (row0 + row) * row_stride in 64 bits for every row: at d=128 ~250 instructions a step between the
// step's barrier and its first MMA, ~180 this way (SASS); 4401 -> 4289 us at b1 h16 s8k d=128 with
// the stage cursors (H200 runs 324, 327); level at d=64.
struct StepLoads {
  static constexpr int kChunks = T::kHeadDim / 8;
  static constexpr int kRowsPerPass = T::kThreads / kChunks;
  static constexpr int kPasses = (T::kBlockM + kRowsPerPass - 1) / kRowsPerPass;
  static_assert(T::kBlockM % kRowsPerPass == 0 || T::kBlockM < kRowsPerPass, "whole passes of rows");
  static __device__ __forceinline__ int row() { return static_cast<int>(threadIdx.x) / kChunks; }
  static __device__ __forceinline__ int chunk() { return static_cast<int>(threadIdx.x) % kChunks; }
  // The thread's element of a tile from its row 0, in elements.
  static __device__ __forceinline__ long long thread_offset(long long row_stride) {
    return row() * row_stride + chunk() * 8;
  }
  // Rows [0, rows) of the tile at shared address `tile` from `thr` (this thread's element of the
  // tile's row 0: the row's pointer plus thread_offset; `safe` an address in bounds that rows past
  // `rows`, zero-filled, name instead).
  static __device__ __forceinline__ void load(u32 tile, const elem_t* thr, const elem_t* safe, long long row_stride,
                                              int rows) {
    const bool col = !T::kPadded || chunk() * 8 < T::kHeadDimReal;
#pragma unroll
    for (int it = 0; it < kPasses; ++it) {
      const int r = row() + it * kRowsPerPass;
      if (T::kBlockM % kRowsPerPass == 0 || r < T::kBlockM) {
        const bool valid = col && r < rows;
        const elem_t* src = thr + it * (kRowsPerPass * row_stride);
        cp_async_16(tile + static_cast<u32>(swz<T::kHeadDim>(r, chunk()) * 2), valid ? src : safe, valid);
      }
    }
  }
};

// kBlockM floats (a 16-byte-aligned workspace row) into shared memory, by the first kBlockM / 4
// threads from `lane0` on.
__device__ __forceinline__ void load_floats(float* dst, const float* src, int lane0) {
  const int t = static_cast<int>(threadIdx.x) - lane0;
  if (t >= 0 && t < T::kBlockM / 4) cp_async_16(smem_addr(dst + t * 4), src + t * 4, true);
}

// ---- fragments --------------------------------------------------------------------------------
// ldmatrix addresses. A lane's row and chunk within a 16x16 fragment follow one of three patterns
// (A: row lane % 16, chunk lane / 16; transposed A and N-major B: row lane % 8 + 8 (lane / 16),
// chunk lane / 8 % 2; K-major B: row lane % 8 + 8 (lane / 8 % 2), chunk lane / 16). Fragment rows
// start at multiples of 8 and tiles at multiples of 128 bytes, so the swizzle's XOR (a function of
// row % 8) touches only the chunk bits: the fragment at chunk C (even) of row R is the lane's
// fragment-0 address XOR (C % span) * 16, plus R's and the span's bytes as an immediate. One base
// register a pattern and tile width, one LOP3 a step: the compiler keeps no address per fragment.
template <int kCols>
struct Lanes {
  static constexpr int kRowBytes = kCols * 2;
  static constexpr int kSpan = kCols / 8 >= 8 ? 8 : kCols / 8;  // chunks the swizzle XORs within
  // A lane's byte offset in a tile for its (row, chunk) of fragment 0; chunk0 (a multiple of the
  // steps' reach) folds a warp's constant chunk offset in.
  static __device__ __forceinline__ u32 base(int row, int chunk) { return static_cast<u32>(swz<kCols>(row, chunk) * 2); }
  // The byte address of the fragment at (row R, chunk C) from a lane's base (tile address included).
  static __device__ __forceinline__ u32 at(u32 base_addr, int r, int c) {
    return (base_addr ^ static_cast<u32>((c % kSpan) << 4)) + static_cast<u32>(r * kRowBytes + (c / kSpan) * kSpan * 16);
  }
};
__device__ __forceinline__ int lane_row_a() { return threadIdx.x & 15; }
__device__ __forceinline__ int lane_chunk_a() { return (threadIdx.x & 31) >> 4; }
__device__ __forceinline__ int lane_row_nk() { return (threadIdx.x & 7) + (((threadIdx.x & 31) >> 4) << 3); }
__device__ __forceinline__ int lane_chunk_nk() { return (threadIdx.x >> 3) & 1; }
__device__ __forceinline__ int lane_row_kn() { return (threadIdx.x & 7) + (((threadIdx.x >> 3) & 1) << 3); }
__device__ __forceinline__ int lane_chunk_kn() { return (threadIdx.x & 31) >> 4; }

__device__ __forceinline__ void ldsm(u32 addr, u32 (&r)[4]) { ldmatrix_x4(addr, r[0], r[1], r[2], r[3]); }
__device__ __forceinline__ void ldsm_t(u32 addr, u32 (&r)[4]) { ldmatrix_x4_trans(addr, r[0], r[1], r[2], r[3]); }
// (frag_a: an A operand from a row-major tile, rows M, cols K. frag_a_trans: an A operand from a
// tile of its transpose, rows K, cols M, by the transposing ldmatrix. frag_b_nk: B operands of two
// n8 tiles (b[0], b[1] the first, b[2], b[3] the second) from a tile of rows N, cols K. frag_b_kn:
// the same from a tile of rows K, cols N, transposing.)

// Two n8 accumulator tiles (2s, 2s + 1) as the A operand of k16 step s, rounded to the dtype.
__device__ __forceinline__ void acc_to_a(const float (&lo)[4], const float (&hi)[4], u32 (&a)[4]) {
  a[0] = pack2<T::kBf16>(lo[0], lo[1]);
  a[1] = pack2<T::kBf16>(lo[2], lo[3]);
  a[2] = pack2<T::kBf16>(hi[0], hi[1]);
  a[3] = pack2<T::kBf16>(hi[2], hi[3]);
}

// ---- the main loop ----------------------------------------------------------------------------
// grid (ceil(seqlen_k / kBlockN), heads_kv * kDkvSplit, batch); varlen, seqlen_k is max_seqlen_k
// (bwd_seq); the order the CTAs take its blocks in: Traits::kLongestFirst.
extern "C" __global__ void __launch_bounds__(T::kThreads, T::kMinBlocks) flash_bwd_mma(const BwdParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  elem_t* s_k = reinterpret_cast<elem_t*>(smem);
  elem_t* s_v = s_k + T::kKElems;
  elem_t* s_q = s_v + T::kKElems;                // kStages tiles
  elem_t* s_do = s_q + T::kStages * T::kQElems;  // kStages tiles
  elem_t* s_ds = s_do + T::kStages * T::kQElems;
  elem_t* s_p = s_ds + T::kDsElems;  // kPairs: P^T (keys x queries, as dS^T)
  float* s_lse = reinterpret_cast<float*>(s_ds + T::kPairWays * T::kDsElems);  // kStages rows of kBlockM
  float* s_dp = s_lse + T::kStages * T::kBlockM;

  const AttnParams& f = p.fwd;
  // The CTA's key block, its grid row and batch (bwd_prepost.cuh's bwd_cta: the grid's order, longest
  // first, or a packed batch's sorted order); the row is the KV head and (dkv_split) the part of the head dims of dK, dV and
  // dQ this CTA writes.
  bool none;
  const att_bwd::CtaBlock cta = bwd_cta<T>(p, &none);
  if (none) return;  // a slot past a packed batch's key blocks
  const int key_block = cta.key_block, hk = cta.y / T::kDkvSplit, part = cta.y % T::kDkvSplit, b = cta.z,
            n0 = key_block * T::kBlockN;
  const int col0 = part * T::kAccDim;  // the part's first head dim
  const BwdSeq seq = bwd_seq(p, b);  // bwd_prepost.cuh: the sequence's lengths and offsets
  const int len_q = seq.len_q, len_k = seq.len_k, diag = len_k - len_q;
  if (kBwdVarlen && n0 >= len_k) return;  // past the sequence's keys (the grid covers the longest)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // The warp's first key in the block; kPairs, its pair's, and (half) which half of a step's queries
  // it scores and of the head dims of dK and dV it accumulates.
  const int half = warp % T::kPairWays, warp_key0 = warp / T::kPairWays * 16 * T::kRowTiles;
  const int q_row0 = half * T::kSQueries, dkv_col0 = col0 + half * T::kDkvDim;
  using LD = Lanes<T::kHeadDim>;
  using LM = Lanes<T::kBlockM>;
  // dQ's share of warp w: kDqRows query rows from kDqRows * dq_mt, kDqCols head dims from dq_col0.
  const int dq_mt = warp % T::kDqRowTiles, dq_col0 = col0 + (warp / T::kDqRowTiles) * T::kDqCols;
  // The lanes' fragment-0 addresses (Lanes): K's and V's rows of the warp as A operands, Q's and
  // dO's as N-major and K-major B operands, K's as dQ's K-major B operand at the warp's head dims,
  // dS^T's as dQ's transposed A operand at the warp's query rows.
  const u32 k_a = smem_addr(s_k) + LD::base(warp_key0 + lane_row_a(), lane_chunk_a());
  const u32 v_a = smem_addr(s_v) + LD::base(warp_key0 + lane_row_a(), lane_chunk_a());
  const u32 nk = LD::base(q_row0 + lane_row_nk(), lane_chunk_nk());
  // (dK's and dV's B operands start at the warp's first head dim: unpaired, the part's, a multiple of
  // 64 columns, whole swizzle spans, so a byte offset; paired, a half of 32 columns at d=64 is not,
  // so it is a chunk of the lane's base, whose bits do not overlap the fragments' chunk steps.)
  const u32 kn = T::kPairs ? LD::base(lane_row_kn(), dkv_col0 / 8 + lane_chunk_kn())
                           : LD::base(lane_row_kn(), lane_chunk_kn()) + static_cast<u32>(col0 * 2);
  // kPairs: P^T's and dS^T's rows of the pair's keys as dV's and dK's A operands.
  const u32 p_key_a = smem_addr(s_p) + LM::base(warp_key0 + lane_row_a(), lane_chunk_a());
  const u32 ds_key_a = smem_addr(s_ds) + LM::base(warp_key0 + lane_row_a(), lane_chunk_a());
  const u32 k_dq = smem_addr(s_k) + LD::base(lane_row_kn(), dq_col0 / 8 + lane_chunk_kn());
  const u32 ds_a = smem_addr(s_ds) + LM::base(lane_row_nk(), dq_mt * (T::kDqRows / 8) + lane_chunk_nk());

  // The query rows that see any key of the block (causal and windows bound them), and their query
  // blocks (bwd_blocks.h: the deterministic mode's order is derived from the same bounds).
  int row_begin, row_end, m_first, m_blocks;
  att_bwd::key_block_rows<T::kCausal, T::kWindow>(n0, T::kBlockN, len_q, diag, f.variant, &row_begin, &row_end);
  att_bwd::query_blocks(row_begin, row_end, T::kBlockM, &m_first, &m_blocks);
  const int steps = m_blocks * f.q_per_kv;  // (query head of the group, query block) pairs

  // K and V of the block's keys, once.
  const elem_t* k_g = static_cast<const elem_t*>(f.k) + bwd_offset(f.k_stride, b, hk, seq.k0);
  const elem_t* v_g = static_cast<const elem_t*>(f.v) + bwd_offset(f.v_stride, b, hk, seq.k0);
  load_rows<T::kBlockN>(s_k, k_g, f.k_stride[2], n0, len_k);
  load_rows<T::kBlockN>(s_v, v_g, f.v_stride[2], n0, len_k);
  cp_async_commit();

  // A step's query head and first query row (bwd_blocks.h's walk: up, heads outer; down, query blocks
  // outer, in the deterministic mode), from cursors carried through the loops, the loads' kStages - 1
  // steps ahead of the products': no divide by a run-time count a step (a divide twice a step, the
  // loads' and the products' that dQ shared, ran 2-6.5% slower: H200, 2026-12-02).
  att_bwd::Walk walk_ld = att_bwd::walk_begin(p.deterministic, f.q_per_kv, m_first, m_blocks), walk_st = walk_ld;
  auto cursor_at = [&](const att_bwd::Walk& w, int& head, int& m0) {
    int h, m;
    att_bwd::walk_at(w, &h, &m);
    head = hk * f.q_per_kv + h;
    m0 = m * T::kBlockM;
  };
  // The step loads' sources: the sequence's row 0 of head 0 (uniform), and this thread's element of
  // it (StepLoads).
  const elem_t* q_seq = static_cast<const elem_t*>(f.q) + bwd_offset(f.q_stride, b, 0, seq.q0);
  const elem_t* do_seq = static_cast<const elem_t*>(p.dout) + bwd_offset(p.do_stride, b, 0, seq.q0);
  int st_ld = 0;  // the stage step i's loads fill, i % kStages, carried as the walk is
  auto issue = [&](int i) {
    if (i < steps) {
      int head, m0;
      cursor_at(walk_ld, head, m0);
      const int st = st_ld;
      StepLoads::load(smem_addr(s_q + st * T::kQElems),
                      q_seq + (head * f.q_stride[1] + m0 * f.q_stride[2]) + StepLoads::thread_offset(f.q_stride[2]),
                      q_seq, f.q_stride[2], len_q - m0);
      StepLoads::load(smem_addr(s_do + st * T::kQElems),
                      do_seq + (head * p.do_stride[1] + m0 * p.do_stride[2]) + StepLoads::thread_offset(p.do_stride[2]),
                      do_seq, p.do_stride[2], len_q - m0);
      const long long row_base = bwd_ws_row(p, seq, b, head) + m0;
      load_floats(s_lse + st * T::kBlockM, p.lse_log2 + row_base, 0);
      load_floats(s_dp + st * T::kBlockM, p.dpsum + row_base, T::kBlockM / 4);
    }
    cp_async_commit();
    att_bwd::walk_next(walk_ld);
    st_ld = st_ld == T::kStages - 1 ? 0 : st_ld + 1;
  };
#pragma unroll
  for (int i = 0; i < T::kStages - 1; ++i) issue(i);

  float acc_dk[T::kRowTiles][T::kDTiles][4], acc_dv[T::kRowTiles][T::kDTiles][4];
#pragma unroll
  for (int kt = 0; kt < T::kRowTiles; ++kt)
#pragma unroll
    for (int dt = 0; dt < T::kDTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[kt][dt][e] = acc_dv[kt][dt][e] = 0.f;

  // dQ of a step (its query head and first row as the loop's): rows kDqRows * (warp % kDqRowTiles), columns
  // kDqCols from (warp / kDqRowTiles) * kDqCols, over every key of the block, from dS^T in shared
  // memory, added into the accumulator. (ATT_BWD_ABLATE, harness builds only: 1 leaves dQ out, 2 its
  // additions; wrong results, for timing where the step's time goes.)
  auto dq_step = [&](int head, int m0) {
#if defined(ATT_BWD_ABLATE) && ATT_BWD_ABLATE == 1
    return;
#endif
    float acc_dq[T::kDqMTiles][T::kDqTiles][4];
#pragma unroll
    for (int mt = 0; mt < T::kDqMTiles; ++mt)
#pragma unroll
      for (int dt = 0; dt < T::kDqTiles; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dq[mt][dt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < T::kKSteps; ++ks) {
      u32 a[T::kDqMTiles][4];
#pragma unroll
      for (int mt = 0; mt < T::kDqMTiles; ++mt) ldsm_t(LM::at(ds_a, ks * 16, 2 * mt), a[mt]);
#pragma unroll
      for (int dp = 0; dp < T::kDqTiles / 2; ++dp) {
        u32 bk[4];
        ldsm_t(LD::at(k_dq, ks * 16, 2 * dp), bk);
#pragma unroll
        for (int mt = 0; mt < T::kDqMTiles; ++mt) {
          mma_16816<T::kBf16>(acc_dq[mt][2 * dp], a[mt], bk[0], bk[1]);
          mma_16816<T::kBf16>(acc_dq[mt][2 * dp + 1], a[mt], bk[2], bk[3]);
        }
      }
    }
    // The lane's first float of its share: row g and columns 2t (row-major; vec4's order, 4t), or
    // (frag, frag4) its place in the first tile (Traits::dq_offset's orders).
    float* dq = T::kDqTileOrder
                    ? p.dq_accum + (bwd_ws_row(p, seq, b, head) + m0 + dq_mt * T::kDqRows) * T::kHeadDim +
                          dq_col0 * 16 + lane * (T::kDqFrag4 ? 4 : 1)
                    : p.dq_accum + (bwd_ws_row(p, seq, b, head) + m0 + dq_mt * T::kDqRows + g) * T::kHeadDim +
                          dq_col0 + (T::kDqVec4 ? 4 : 2) * t;
    // The deterministic mode (p.deterministic: uniform, so a call without it pays a branch): the CTAs
    // that add into this query block's dQ take turns in key-block order, so that every element's sum
    // is the same sequence of fp32 additions every run (FlashAttention-3's technique). Its semaphore
    // counts the CTAs that have added; this one waits until all those of lower key blocks that walk
    // the block have (its key block minus the first that does, bwd_blocks.h; with GQA the counter is
    // the query head's, and the CTAs of that head's KV head are the ones counted), adds, and raises
    // it. No deadlock: a CTA waits only for CTAs of the same KV head and batch with a lower key block,
    // launched before it (blocks are dispatched in increasing linear index, and cta_block puts a
    // pair's lower key blocks first in either order) and so resident or done, and those wait only
    // for lower ones in turn; the first waits for nothing.
    int* sem = nullptr;
    if (p.deterministic) {
      sem = p.dq_semaphore + (bwd_ws_row(p, seq, b, head) + m0) / T::kBlockM;
      if (threadIdx.x == 0) {
        const int turn = key_block -
                         att_bwd::first_key_block<T::kWindow>(m0, T::kBlockN, diag, f.variant.window_left);
        // (dkv_split: the key block's kDkvSplit CTAs each add their part and raise the counter once.)
        while (ld_acquire(sem) < turn * T::kDkvSplit) {
        }
      }
      __syncthreads();
    }
#pragma unroll
    for (int mt = 0; mt < T::kDqMTiles; ++mt) {
#pragma unroll
      for (int dt = 0; dt < T::kDqTiles; ++dt) {
        float* dq_m = dq + mt * 16 * T::kHeadDim;
#if defined(ATT_BWD_ABLATE) && ATT_BWD_ABLATE == 2
        if (acc_dq[mt][dt][0] != 12345.f) continue;
#endif
        if constexpr (T::kDqTileOrder) {  // the tile's 128 floats: its 16-row block's, 128 dt floats on
          float* at = dq_m + dt * 128;
          if constexpr (T::kDqFrag4) {
            add_quad(at, acc_dq[mt][dt][0], acc_dq[mt][dt][1], acc_dq[mt][dt][2], acc_dq[mt][dt][3]);
          } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) atomicAdd(at + 32 * e, acc_dq[mt][dt][e]);
          }
          continue;
        }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if constexpr (T::kDqVec4) {  // tiles dt and dt + 1 at once, rows g and g + 8
          if (dt % 2 == 0) {
            add_quad(dq_m + dt * 8, acc_dq[mt][dt][0], acc_dq[mt][dt][1], acc_dq[mt][dt + 1][0], acc_dq[mt][dt + 1][1]);
            add_quad(dq_m + 8 * T::kHeadDim + dt * 8, acc_dq[mt][dt][2], acc_dq[mt][dt][3], acc_dq[mt][dt + 1][2],
                     acc_dq[mt][dt + 1][3]);
          }
          continue;
        }
        if constexpr (!T::kDqQuad) {
          add_pair2(dq_m + dt * 8, acc_dq[mt][dt][0], acc_dq[mt][dt][1]);
          add_pair2(dq_m + 8 * T::kHeadDim + dt * 8, acc_dq[mt][dt][2], acc_dq[mt][dt][3]);
          continue;
        }
        // Lanes t and t ^ 1 trade halves so that each holds 4 consecutive columns of one row (the
        // even lane row g, the odd row g + 8): one 16-byte reduction a tile instead of two of 8.
        const bool even = (t & 1) == 0;
        const float x = __shfl_xor_sync(0xffffffffu, even ? acc_dq[mt][dt][2] : acc_dq[mt][dt][0], 1);
        const float y = __shfl_xor_sync(0xffffffffu, even ? acc_dq[mt][dt][3] : acc_dq[mt][dt][1], 1);
        if (even) add_quad(dq_m + dt * 8, acc_dq[mt][dt][0], acc_dq[mt][dt][1], x, y);
        else add_quad(dq_m + 8 * T::kHeadDim + dt * 8 - 2, x, y, acc_dq[mt][dt][2], acc_dq[mt][dt][3]);
#else
#if defined(__CUDA_ARCH__)
        static_assert(!T::kDqVec4 && !T::kDqFrag4, "vec4 and frag4 are sm_90's (the space offers them there only)");
#endif
        add_pair(dq_m + dt * 8, acc_dq[mt][dt][0], acc_dq[mt][dt][1]);
        add_pair(dq_m + 8 * T::kHeadDim + dt * 8, acc_dq[mt][dt][2], acc_dq[mt][dt][3]);
#endif
      }
    }
    if (p.deterministic) {
      __threadfence();  // this thread's adds performed before the turn passes on,
      __syncthreads();  // every thread's,
      if (threadIdx.x == 0) add_release(sem, 1);  // then the next CTA's turn
    }
  };

  int st_at = 0;  // the stage step i's products read, i % kStages
  for (int i = 0; i < steps; ++i) {
    int head, m0;
    cursor_at(walk_st, head, m0);
    att_bwd::walk_next(walk_st);
    const int st = st_at;
    st_at = st_at == T::kStages - 1 ? 0 : st_at + 1;
    const u32 q_nk = smem_addr(s_q + st * T::kQElems) + nk, q_kn = smem_addr(s_q + st * T::kQElems) + kn;
    const u32 do_nk = smem_addr(s_do + st * T::kQElems) + nk, do_kn = smem_addr(s_do + st * T::kQElems) + kn;
    const float* lse_t = s_lse + st * T::kBlockM + q_row0;
    const float* dp_t = s_dp + st * T::kBlockM + q_row0;
    // Step i's tiles complete and every warp past step i - 1, whose stage then takes step
    // i + kStages - 1's loads: two barriers a step (this one, and dS^T's before dQ), none to retire a
    // stage (run 185: 2% faster than a third at the end of the step; dQ deferred to the next step
    // from a second dS^T buffer, one barrier a step, timed 7% slower, though with a layout bug
    // that put the LSE rows in that buffer: not pursued).
    cp_async_wait<T::kStages - 2>();
    __syncthreads();
    issue(i + T::kStages - 1);

    // S^T = K Q^T and dP^T = V dO^T for the warp's keys.
    float acc_s[T::kRowTiles][T::kQTiles][4], acc_dp[T::kRowTiles][T::kQTiles][4];
#pragma unroll
    for (int kt = 0; kt < T::kRowTiles; ++kt)
#pragma unroll
      for (int qt = 0; qt < T::kQTiles; ++qt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[kt][qt][e] = acc_dp[kt][qt][e] = 0.f;
#pragma unroll
    for (int ds = 0; ds < T::kDSteps; ++ds) {
      u32 ak[T::kRowTiles][4], av[T::kRowTiles][4];
#pragma unroll
      for (int kt = 0; kt < T::kRowTiles; ++kt) {
        ldsm(LD::at(k_a, kt * 16, 2 * ds), ak[kt]);
        ldsm(LD::at(v_a, kt * 16, 2 * ds), av[kt]);
      }
#pragma unroll
      for (int qp = 0; qp < T::kQTiles / 2; ++qp) {
        u32 bq[4], bd[4];
        ldsm(LD::at(q_nk, qp * 16, 2 * ds), bq);
        ldsm(LD::at(do_nk, qp * 16, 2 * ds), bd);
#pragma unroll
        for (int kt = 0; kt < T::kRowTiles; ++kt) {
          mma_16816<T::kBf16>(acc_s[kt][2 * qp], ak[kt], bq[0], bq[1]);
          mma_16816<T::kBf16>(acc_s[kt][2 * qp + 1], ak[kt], bq[2], bq[3]);
          mma_16816<T::kBf16>(acc_dp[kt][2 * qp], av[kt], bd[0], bd[1]);
          mma_16816<T::kBf16>(acc_dp[kt][2 * qp + 1], av[kt], bd[2], bd[3]);
        }
      }
    }

    // P^T (in acc_s) and dS^T (in acc_dp). A pair is masked only in a tile that crosses the
    // diagonal or a window's bound, or the last keys (zero-filled K rows: their P, exp2(-LSE), is
    // not stored but could overflow to inf, and inf times a zero K row is NaN in dQ).
    bool masked = n0 + T::kBlockN > len_k;
    if (T::kCausal) masked = masked || n0 + T::kBlockN - 1 > m0 + diag;
    if constexpr (T::kWindow) {
      if (f.variant.window_left >= 0) masked = masked || n0 < m0 + T::kBlockM - 1 + diag - f.variant.window_left;
      if (!T::kCausal && f.variant.window_right >= 0)
        masked = masked || n0 + T::kBlockN - 1 > m0 + diag + f.variant.window_right;
    }
#pragma unroll
    for (int qt = 0; qt < T::kQTiles; ++qt) {
      const float2 lse2 = *reinterpret_cast<const float2*>(lse_t + qt * 8 + 2 * t);
      const float2 dp2 = *reinterpret_cast<const float2*>(dp_t + qt * 8 + 2 * t);
#pragma unroll
      for (int kt = 0; kt < T::kRowTiles; ++kt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float lse = (e & 1) ? lse2.y : lse2.x, dsum = (e & 1) ? dp2.y : dp2.x;
          float dcap;
          float pv = bwd_prob<T::kSoftcap>(acc_s[kt][qt][e], lse, f, dcap);
          if (masked) {
            const int key = n0 + warp_key0 + kt * 16 + g + (e >> 1) * 8;
            const int row = m0 + q_row0 + qt * 8 + 2 * t + (e & 1);
            const int off = key - row;  // visible when lo <= off <= hi
            bool visible = key < len_k;
            if (T::kCausal) visible = visible && off <= diag;
            if constexpr (T::kWindow) {
              if (f.variant.window_left >= 0) visible = visible && off >= diag - f.variant.window_left;
              if (!T::kCausal && f.variant.window_right >= 0) visible = visible && off <= diag + f.variant.window_right;
            }
            pv = visible ? pv : 0.f;
          }
          acc_s[kt][qt][e] = pv;
          acc_dp[kt][qt][e] = pv * (acc_dp[kt][qt][e] - dsum) * dcap;  // dcap 1 without a soft-cap
        }
    }

    // dV += P^T dO, dK += dS^T Q (scaled at the end) over the queries of k16 step qs, from the A
    // operands of the warp's key tiles; dS^T to shared memory for dQ.
    auto dkv_products = [&](int qs, const u32 (&ap)[T::kRowTiles][4], const u32 (&ads)[T::kRowTiles][4]) {
#pragma unroll
      for (int dp = 0; dp < T::kDTiles / 2; ++dp) {
        u32 bdo[4], bq[4];
        ldsm_t(LD::at(do_kn, qs * 16, 2 * dp), bdo);
        ldsm_t(LD::at(q_kn, qs * 16, 2 * dp), bq);
#pragma unroll
        for (int kt = 0; kt < T::kRowTiles; ++kt) {
          mma_16816<T::kBf16>(acc_dv[kt][2 * dp], ap[kt], bdo[0], bdo[1]);
          mma_16816<T::kBf16>(acc_dv[kt][2 * dp + 1], ap[kt], bdo[2], bdo[3]);
          mma_16816<T::kBf16>(acc_dk[kt][2 * dp], ads[kt], bq[0], bq[1]);
          mma_16816<T::kBf16>(acc_dk[kt][2 * dp + 1], ads[kt], bq[2], bq[3]);
        }
      }
    };
    if constexpr (T::kPairs) {
      // P^T and dS^T of the warp's queries to shared memory; once the pair's partner has written its
      // half, dV and dK over every query, their A operands read back from there.
#pragma unroll
      for (int qs = 0; qs < T::kSQueries / 16; ++qs)
#pragma unroll
        for (int kt = 0; kt < T::kRowTiles; ++kt) {
          u32 ap[4], ads[4];
          acc_to_a(acc_s[kt][2 * qs], acc_s[kt][2 * qs + 1], ap);
          acc_to_a(acc_dp[kt][2 * qs], acc_dp[kt][2 * qs + 1], ads);
          const int r0 = warp_key0 + kt * 16 + g, c0 = q_row0 / 8 + 2 * qs;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int o = swz<T::kBlockM>(r0 + (j & 1) * 8, c0 + (j >> 1)) + 2 * t;
            *reinterpret_cast<u32*>(s_p + o) = ap[j];
            *reinterpret_cast<u32*>(s_ds + o) = ads[j];
          }
        }
      __syncthreads();  // P^T and dS^T complete (dQ reads dS^T too)
#pragma unroll
      for (int qs = 0; qs < T::kQSteps; ++qs) {
        u32 ap[T::kRowTiles][4], ads[T::kRowTiles][4];
#pragma unroll
        for (int kt = 0; kt < T::kRowTiles; ++kt) {
          ldsm(LM::at(p_key_a, kt * 16, 2 * qs), ap[kt]);
          ldsm(LM::at(ds_key_a, kt * 16, 2 * qs), ads[kt]);
        }
        dkv_products(qs, ap, ads);
      }
      dq_step(head, m0);
    } else {
      // P^T and dS^T stay in registers as the A operands; dS^T goes to shared memory for dQ.
#pragma unroll
      for (int qs = 0; qs < T::kQSteps; ++qs) {
        u32 ap[T::kRowTiles][4], ads[T::kRowTiles][4];
#pragma unroll
        for (int kt = 0; kt < T::kRowTiles; ++kt) {
          acc_to_a(acc_s[kt][2 * qs], acc_s[kt][2 * qs + 1], ap[kt]);
          acc_to_a(acc_dp[kt][2 * qs], acc_dp[kt][2 * qs + 1], ads[kt]);
          // dS^T rows (keys) g and g + 8 of the tile, queries 16 qs + 2t (+1) and + 8.
          const int r0 = warp_key0 + kt * 16 + g;
          *reinterpret_cast<u32*>(s_ds + swz<T::kBlockM>(r0, 2 * qs) + 2 * t) = ads[kt][0];
          *reinterpret_cast<u32*>(s_ds + swz<T::kBlockM>(r0 + 8, 2 * qs) + 2 * t) = ads[kt][1];
          *reinterpret_cast<u32*>(s_ds + swz<T::kBlockM>(r0, 2 * qs + 1) + 2 * t) = ads[kt][2];
          *reinterpret_cast<u32*>(s_ds + swz<T::kBlockM>(r0 + 8, 2 * qs + 1) + 2 * t) = ads[kt][3];
        }
        dkv_products(qs, ap, ads);
      }
      __syncthreads();  // dS^T complete
      dq_step(head, m0);
    }
  }

  // dK (scaled) and dV of the block's keys, in the dtype.
  elem_t* dk = static_cast<elem_t*>(p.dk) + bwd_offset(p.dk_stride, b, hk, seq.k0);
  elem_t* dv = static_cast<elem_t*>(p.dv) + bwd_offset(p.dv_stride, b, hk, seq.k0);
#pragma unroll
  for (int kt = 0; kt < T::kRowTiles; ++kt)
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int key = n0 + warp_key0 + kt * 16 + g + h2 * 8;
      if (key < len_k) {
#pragma unroll
        for (int dt = 0; dt < T::kDTiles; ++dt) {
          const int col = dkv_col0 + dt * 8 + 2 * t;
          if (T::kPadded && col >= T::kHeadDimReal) continue;  // a padded column
          *reinterpret_cast<u32*>(dk + key * p.dk_stride[2] + col) =
              pack2<T::kBf16>(acc_dk[kt][dt][2 * h2] * f.scale, acc_dk[kt][dt][2 * h2 + 1] * f.scale);
          *reinterpret_cast<u32*>(dv + key * p.dv_stride[2] + col) =
              pack2<T::kBf16>(acc_dv[kt][dt][2 * h2], acc_dv[kt][dt][2 * h2 + 1]);
        }
      }
    }
}

}  // namespace att
