// ---- templates/flash_fwd_wgmma/mainloop.cuh: the K/V loop of flash_fwd_wgmma. The producer side
// (one thread issues every TMA copy: Q, and K/V tiles dense, multicast to a cluster, or in boxes
// within KV-cache pages) and the consumer side: per K/V tile j a consumer warpgroup runs
//   S = Q K_j^T           wgmma, A (Q) and B (K) from shared memory
//   P = online softmax(S)  in registers, fp32; O rescaled by the row max change
//   O += P V_j            wgmma, A (P, packed to 16 bit) from registers, B (V) N-major in smem
// (consume: the plain schedule, or S_j beside P_{j-1} V_{j-1} with intra_wg_overlap; ping-pong
// turns between the consumer warpgroups; the tiles a warpgroup does not see skipped).
#ifndef ATTNTUNE_FLASH_FWD_WGMMA_MAINLOOP_CUH
#define ATTNTUNE_FLASH_FWD_WGMMA_MAINLOOP_CUH

#include "../common/attn_params.h"
#include "../common/fp8.cuh"
#include "../common/ptx_sm90.cuh"
#include "args.h"
#include "epilogue.cuh"
#include "smem.cuh"
#include "traits.cuh"
#include "wgmma.cuh"
#include "wgmma_e4m3.cuh"
#include "work_tiles.cuh"

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

// ---- producer side: one thread issues every copy ----
// The column blocks of a tile, one TMA box each: unrolled, but for the dense persistent causal grid
// (dynamic tiles) past 4 blocks (d = 80, 112, 144, 160, 176, 208, 224, 240: 5 to 15 blocks of 32- or
// 64-byte rows), in a loop: there the unrolled copies spilled the producer's 24 registers (20 bytes
// at d = 112, 144, 176, 208, 224) and the loop does not; in the other modes (multicast, the split
// tail, varlen) it was the other way round (8-44 bytes with the loop, none unrolled; ptxas, CUDA 13.0).
// d % 64 == 0 (at most 4 blocks) never loops: its code is as before.
// kBlocks: Q's and K's column blocks, or V's (kColBlocksV) for V's tiles.
template <int kBlocks = T::kColBlocks, class F>
__device__ __forceinline__ void for_col_blocks(F&& f) {
  if constexpr (!(kBlocks > 4 && T::kDynamicTiles && !T::kVarlen && !T::kKvcache)) {
#pragma unroll
    for (int cb = 0; cb < kBlocks; ++cb) f(cb);
  } else {
#pragma unroll 1
    for (int cb = 0; cb < kBlocks; ++cb) f(cb);
  }
}
// The geometry of a K tile (kV false) or a V tile (true) as TMA loads it: V's differs where
// kHeadDimV != kHeadDim. An FP8 cache's is its staging buffer's (kRaw): rows of head_dim bytes,
// head_dim / 2 16-bit elements to the maps.
template <bool kV, bool kRaw = false>
struct KvTile {
  static constexpr int kBytes = kRaw ? (kV ? T::kRawVBytes : T::kRawKBytes) : kV ? T::kVBytes : T::kKVBytes;
  static constexpr int kCols = kRaw ? (kV ? T::kColsRawV : T::kColsRawK) : kV ? T::kColsV : T::kCols;
  static constexpr int kRowBytes = kRaw ? (kV ? T::kRowBytesRawV : T::kRowBytesRawK) : kV ? T::kRowBytesV : T::kRowBytes;
  static constexpr int kColBlocks = kRaw ? (kV ? T::kColBlocksRawV : T::kColBlocksRawK)
                                         : kV ? T::kColBlocksV : T::kColBlocks;
  static constexpr int kColBlockBytes = kRaw ? (kV ? T::kRawVColBlockBytes : T::kRawKColBlockBytes)
                                             : kV ? T::kVColBlockBytes : T::kKVColBlockBytes;
  // A column block's width in the map's elements (an FP8 forward's maps count bytes: Traits::kColCoord).
  static constexpr int kColCoord = kRaw ? kCols : kV ? T::kColCoordV : T::kColCoord;
  // An FP8 forward's V^T tile: its columns are the tile's keys, its rows the value dims.
  static constexpr bool kKeysInRow = kV && T::kQkvFp8;
};
// Q rows from row0. kKvMulticast's padding block (past seqlen_q, rows nobody stores) loads from
// the last row on instead: a box that starts past the tensor's end is not one TMA promises to
// fill, and branching around the load spilled the producer's 24 registers at d=64.
// Varlen: the map spans the packed rows (batch 0) and the tile's rows start at its sequence's
// first, q_start; a tile that runs past its sequence loads the next one's rows, which nobody stores.
// GQA-packed (Traits::kPackGqa): `head` is the KV head, and each column block is one box of (its
// group's query heads, maps.pack_rows query rows) over Q's (head_dim, heads_q, rows, batch) map,
// which fills the tile's first heads * pack_rows rows in packed order (row r: query row r / group
// of head r % group; TMA's swizzle follows the shared-memory address, so the rows swizzle as a
// plain box's); the tile's rows past them keep whatever they held, and nobody stores them.
__device__ __forceinline__ void load_q(const Smem& sm, const TmaMaps& maps, const AttnParams& p, int m_block, int head,
                                       int batch, int q_start = 0) {
  if constexpr (T::kPackGqa) {
    const int group = p.q_per_kv, rows = maps.pack_rows;
    mbar_arrive_expect_tx(sm.q_full(), static_cast<u32>(group * rows * T::kHeadDim * 2));
    for_col_blocks([&](int cb) {
      tma_load_4d(sm.q + cb * T::kQColBlockBytes, &maps.q, sm.q_full(), cb * T::kCols, head * group,
                  q_start + m_block * rows, T::kVarlen ? 0 : batch);
    });
    return;
  }
  const int row0 = T::kKvMulticast ? min(m_block * T::kBlockM, p.seqlen_q - 1) : m_block * T::kBlockM;
  mbar_arrive_expect_tx(sm.q_full(), T::kQBytes);
  for_col_blocks([&](int cb) {
    if constexpr (T::kVarlen)
      tma_load_4d(sm.q + cb * T::kQColBlockBytes, &maps.q, sm.q_full(), cb * T::kColCoord, q_start + row0, head, 0);
    else
      tma_load_4d(sm.q + cb * T::kQColBlockBytes, &maps.q, sm.q_full(), cb * T::kColCoord, row0, head, batch);
  });
}

// With kKvMulticast the cluster's rank-0 CTA loads every tile into both CTAs, and each CTA's full
// barrier expects the whole tile. (Each CTA loading half of the tile's column blocks put rank-
// dependent offsets in the producer's loop, which spilled its 24 registers.)
// Varlen: `batch` is the sequence's first key row in the packed K/V (the maps' batch is 0).
// An FP8 forward's V^T (G::kKeysInRow): the map is (keys, head_dim_v, heads_kv, batch), a column
// block a span of the tile's keys, all head_dim_v rows.
template <bool kV, bool kRaw = false>
__device__ __forceinline__ void load_kv_tile(u32 dst, u32 full, const TmaDesc* desc, int tile, int kv_head, int batch) {
  using G = KvTile<kV, kRaw>;
  mbar_arrive_expect_tx(full, G::kBytes);
  if (T::kKvMulticast && cluster_ctarank() != 0) return;
  if constexpr (!kV && !kRaw && T::kKPerm) {
    // k_perm: two boxes over the 5-d map (head_dim, 4, keys / 4, heads_kv, batch), one per h in 0..1,
    // of (2, block_n / 4) at (2h, the tile's first four): the tile's keys 16g + 4t + 2h + e (g its
    // 16-key groups, t in 0..3, e in 0..1) land as rows h * block_n / 2 + 8g + 2t + e (traits.cuh,
    // kKPerm).
    for_col_blocks<G::kColBlocks>([&](int cb) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
        tma_load_5d(dst + cb * G::kColBlockBytes + h * (T::kBlockN / 2) * G::kRowBytes, desc, full, cb * G::kColCoord,
                    2 * h, tile * (T::kBlockN / 4), kv_head, batch);
    });
    return;
  }
  for_col_blocks<G::kColBlocks>([&](int cb) {
    if constexpr (G::kKeysInRow) {
      if (T::kKvMulticast)
        tma_load_4d_multicast(dst + cb * G::kColBlockBytes, desc, full, (1 << T::kCluster) - 1,
                              tile * T::kBlockN + cb * G::kColCoord, 0, kv_head, batch);
      else
        tma_load_4d(dst + cb * G::kColBlockBytes, desc, full, tile * T::kBlockN + cb * G::kColCoord, 0, kv_head, batch);
    } else if constexpr (T::kVarlen)
      tma_load_4d(dst + cb * G::kColBlockBytes, desc, full, cb * G::kCols, batch + tile * T::kBlockN, kv_head, 0);
    else if (T::kKvMulticast)
      tma_load_4d_multicast(dst + cb * G::kColBlockBytes, desc, full, (1 << T::kCluster) - 1, cb * G::kColCoord,
                            tile * T::kBlockN, kv_head, batch);
    else
      tma_load_4d(dst + cb * G::kColBlockBytes, desc, full, cb * G::kColCoord, tile * T::kBlockN, kv_head, batch);
  });
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
template <bool kV, bool kRaw = false>
__device__ __forceinline__ void load_kv_paged(u32 dst, u32 full, const TmaDesc* desc, const AttnParams& p,
                                              const TmaMaps& maps, int tile, int kv_head, int batch, int len_k) {
  using G = KvTile<kV, kRaw>;
  const int rows = maps.kv_box_rows, end = min((tile + 1) * T::kBlockN, len_k), row0 = batch * p.max_blocks_per_seq;
  for (int j = tile * T::kBlockN; j < end; j += rows, dst += rows * G::kRowBytes) {
    const int page = p.page_mul ? static_cast<int>(__umulhi(static_cast<unsigned>(j), p.page_mul) >> p.page_shift) : j;
    const int pg = __ldg(p.block_table + (row0 + page)), pr = j - page * p.page_size;
    mbar_expect_tx(full, static_cast<u32>(rows * G::kRowBytes * G::kColBlocks));
#pragma unroll
    for (int cb = 0; cb < G::kColBlocks; ++cb)
      tma_load_4d(dst + cb * G::kColBlockBytes, desc, full, cb * G::kCols, pr, kv_head, pg);
  }
  mbar_arrive(full);
}

// Iteration `it` of a work tile (global iteration it_base + it) loads K/V tile tile_end-1-it
// (WorkTile::kv_end_tile) into its stage once the consumers released that stage. Varlen: `batch`
// is the sequence's first key row. Kvcache: `batch` is the sequence, len_k its keys (pages when the
// call has a page table).
__device__ __forceinline__ void produce(const Smem& sm, const TmaMaps& maps, const AttnParams& p, int it_base, int it,
                                        int tile_end, int kv_head, int batch, int len_k) {
  const Slot sl(it_base + it);
  const int tile = tile_end - 1 - it;
  const bool paged = T::kKvcache && p.block_table != nullptr;
  if (T::kKvFp8 && !maps.kv_dequantised) {  // into the staging buffers (phase: the iteration's parity)
    const u32 ph = static_cast<u32>(it_base + it) & 1;
    mbar_wait(sm.raw_empty(false), ph ^ 1);
    if (paged) load_kv_paged<false, true>(sm.raw_k, sm.raw_full(false), &maps.k, p, maps, tile, kv_head, batch, len_k);
    else load_kv_tile<false, true>(sm.raw_k, sm.raw_full(false), &maps.k, tile, kv_head, batch);
    mbar_wait(sm.raw_empty(true), ph ^ 1);
    if (paged) load_kv_paged<true, true>(sm.raw_v, sm.raw_full(true), &maps.v, p, maps, tile, kv_head, batch, len_k);
    else load_kv_tile<true, true>(sm.raw_v, sm.raw_full(true), &maps.v, tile, kv_head, batch);
    return;
  }
  mbar_wait(sm.k_empty(sl.stage), sl.phase ^ 1);
  if (paged) load_kv_paged<false>(sm.k + sl.stage * T::kKVBytes, sm.k_full(sl.stage), &maps.k, p, maps, tile, kv_head, batch, len_k);
  else load_kv_tile<false>(sm.k + sl.stage * T::kKVBytes, sm.k_full(sl.stage), &maps.k, tile, kv_head, batch);
  mbar_wait(sm.v_empty(sl.stage), sl.phase ^ 1);
  if (paged) load_kv_paged<true>(sm.v + sl.stage * T::kVBytes, sm.v_full(sl.stage), &maps.v, p, maps, tile, kv_head, batch, len_k);
  else load_kv_tile<true>(sm.v + sl.stage * T::kVBytes, sm.v_full(sl.stage), &maps.v, tile, kv_head, batch);
}

// ---- FP8 caches: the converters (the producer warpgroup's warps 1-3) ----
// The producer's end mark after its last tile (it_end: the CTA's K/V iterations): once the
// converters are done with the last K tile (so that they have read the end word for every tile
// before: they read it after each full barrier, in order), K's full barrier gets a plain arrive
// with the end word set.
__device__ __forceinline__ void raw_end_mark(const Smem& sm, int it_end) {
  if (it_end > 0) mbar_wait(sm.raw_empty(false), static_cast<u32>(it_end - 1) & 1);
  st_shared_s32(sm.raw_end(), 1);
  mbar_arrive(sm.raw_full(false));
}
// A 16-byte chunk's byte offset in a tile of rows of `row_bytes` (128, 64 or 32: the swizzle span),
// as TMA's swizzle places it: the chunk index XOR the row's bits above the span (args.h).
template <int kRowBytes>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  const int off = row * kRowBytes + chunk * 16;
  return off ^ (((off >> 7) & (kRowBytes / 16 - 1)) << 4);
}
// The staged bytes of a K (kV false) or V tile into the 16-bit stage at `dst`, by converter ctid
// (0..95): each 16-byte chunk (16 keys' bytes of a row) to two 16-byte chunks of the row, exactly
// (common/fp8.cuh). A quarter warp takes one chunk of 8 consecutive rows, so that its loads and
// stores each cover the 8 swizzle positions of a span: conflict-free on both sides. (Two chunks a
// step, both loaded first, spilled the producer's 40 registers at d=64 with block_m 64; this path
// serves the calls that convert in the kernel, one query tile a KV head: launch.h, dequant_first.)
template <bool kV>
__device__ __forceinline__ void convert_tile(u32 raw, u32 dst, int ctid) {
  using R = KvTile<kV, true>;
  using D = KvTile<kV, false>;
  constexpr int kChunks = (kV ? T::kHeadDimV : T::kHeadDim) / 16;  // a row's 16-byte chunks of bytes
#pragma unroll 1
  for (int i = ctid; i < T::kBlockN * kChunks; i += T::kConverters) {
    const int row = (i & 7) + (i >> 3) / kChunks * 8, c = (i >> 3) % kChunks;
    // Bytes 16c..16c+15 of the row: the staging tile's 16-bit elements 8c..8c+7, the stage's 16c..16c+15.
    const u32 src = raw + (8 * c / R::kCols) * R::kColBlockBytes + swizzled<R::kRowBytes>(row, 8 * c % R::kCols / 8);
    u32 x[4], y[8];
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
                 : "r"(src));
#pragma unroll
    for (int j = 0; j < 4; ++j) e4m3x4_to_pairs<T::kBf16>(x[j], y[2 * j], y[2 * j + 1]);
    const u32 base = dst + (16 * c / D::kCols) * D::kColBlockBytes;
    const int chunk = 16 * c % D::kCols / 8;
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(base + swizzled<D::kRowBytes>(row, chunk)),
                 "r"(y[0]), "r"(y[1]), "r"(y[2]), "r"(y[3])
                 : "memory");
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(base + swizzled<D::kRowBytes>(row, chunk + 1)),
                 "r"(y[4]), "r"(y[5]), "r"(y[6]), "r"(y[7])
                 : "memory");
  }
}

// The converters' loop: for each K/V iteration of the CTA, in order (the ring's), K's staged bytes
// into K's stage once the consumers freed it, then V's; each warp fences its stores to the async
// proxy and arrives on the stage's full barrier (3 arrivals) and on the staging buffer's empty one.
// Ends at the producer's end mark.
__device__ __forceinline__ void convert_loop(const Smem& sm, int ctid) {
  const int lane = threadIdx.x % 32;
  for (int g = 0;; ++g) {
    const Slot sl(g);
    const u32 ph = static_cast<u32>(g) & 1;
    mbar_wait(sm.raw_full(false), ph);
    if (ld_shared_s32(sm.raw_end())) break;
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      if (v) mbar_wait(sm.raw_full(true), ph);
      mbar_wait(v ? sm.v_empty(sl.stage) : sm.k_empty(sl.stage), sl.phase ^ 1);
      if (v) convert_tile<true>(sm.raw_v, sm.v + sl.stage * T::kVBytes, ctid);
      else convert_tile<false>(sm.raw_k, sm.k + sl.stage * T::kKVBytes, ctid);
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      __syncwarp();
      if (lane == 0) {
        mbar_arrive(v ? sm.v_full(sl.stage) : sm.k_full(sl.stage));
        mbar_arrive(sm.raw_empty(v));
      }
    }
  }
}

// ---- consumer side ----
// Kvcache: rows [valid, kBlockN) of the V stage at `v` (every column block) set to zero by the 128
// threads of consumer warpgroup cw, made visible to wgmma (the async proxy) and waited for by the
// warpgroup (its named barrier, kNamedWarpgroup + cw). Whole rows (kRowBytes): the swizzle only
// permutes the 16-byte chunks inside a row. Every consumer warpgroup that reads the tile writes
// the same zeros.
__device__ __forceinline__ void zero_v_tail(u32 v, int valid, int cw) {
  constexpr int kRowChunks = T::kRowBytesV / 16;
  const int per_block = (T::kBlockN - valid) * kRowChunks;  // 16-byte chunks past `valid` in one column block
  for (int i = threadIdx.x % 128; i < per_block * T::kColBlocksV; i += 128) {
    const int cb = i / per_block, c = i - cb * per_block;
    const u32 addr = v + cb * T::kVColBlockBytes + (valid * kRowChunks + c) * 16;
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  named_bar_sync(T::kNamedWarpgroup + cw, 128);
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
    // k-step kk: column block 16kk / kCols, 32 bytes per 16 elements inside the row (args.h).
    const u64 q_off = wgmma_tile::qk_step_bytes(kk, T::kCols, T::kQColBlockBytes) >> 4;
    const u64 k_off = wgmma_tile::qk_step_bytes(kk, T::kCols, T::kKVColBlockBytes) >> 4;
    if constexpr (T::kQkvFp8) WgmmaE4m3<W>::ss(first_cols<W>(s), q_desc + q_off, k_desc + k_off, kk > 0);
    else Wgmma<W>::ss(first_cols<W>(s), q_desc + q_off, k_desc + k_off, kk > 0);
  }
  wgmma_commit();
}

// O += P V for one V stage; P's k-step kk covers keys 16kk..16kk+15, V rows of kRowBytesV.
// An FP8 forward: o = P V (the tile's own accumulator, added to O in fp32 by add_pv), k-steps of 32
// keys, each 32 bytes into V^T's K-major rows (its steps are Q.K^T's).
template <int W = T::kBlockN>
__device__ __forceinline__ void gemm_pv(float (&o)[T::kHeadDimV / 2], const u32 (&pa)[T::kPSteps][4], u64 v_desc) {
  // P.V's N as a value that depends on W, so that a 16-bit build (whose head dim need not be a multiple
  // of 32, nor have a WgmmaE4m3) never instantiates the FP8 wrapper in the discarded branch.
  constexpr int kFp8N = W > 0 ? T::kHeadDimV : 0;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < W / T::kPKeys; ++kk) {
    if constexpr (T::kQkvFp8)
      WgmmaE4m3<kFp8N>::rs(o, pa[kk], v_desc + (wgmma_tile::qk_step_bytes(kk, T::kColsV, T::kVColBlockBytes) >> 4),
                           kk > 0);
    else
      Wgmma<T::kHeadDimV>::rs(o, pa[kk], v_desc + (wgmma_tile::pv_step_bytes(kk, T::kColsV) >> 4), 1);
  }
  wgmma_commit();
}

// The same, narrow (kNarrowW keys) or full: the callers pass constants, so each call site
// compiles to one of the two.
__device__ __forceinline__ void gemm_qk_w(bool narrow, float (&s)[T::kBlockN / 2], u64 q_desc, u64 k_desc) {
  if (narrow) gemm_qk<T::kNarrowW>(s, q_desc, k_desc);
  else gemm_qk(s, q_desc, k_desc);
}
__device__ __forceinline__ void gemm_pv_w(bool narrow, float (&o)[T::kHeadDimV / 2], const u32 (&pa)[T::kPSteps][4],
                                          u64 v_desc) {
  if (narrow) gemm_pv<T::kNarrowW>(o, pa, v_desc);
  else gemm_pv(o, pa, v_desc);
}

// An FP8 forward's P.V in column chunks (Traits::kPvChunks > 1): chunk c, value dims c * kPvCols on,
// of one tile's P.V into its accumulator in ot (chunk_acc: buffer c % kPvBuffers, kPvCols / 2
// registers each; scale_d 0 on the first k-step), from V^T's rows c * kPvCols on (whole swizzle atoms
// into each column block, so the descriptor moves by their bytes alone; traits.cuh). ot's registers
// past the buffers are never touched.
__device__ __forceinline__ float (&chunk_acc(float (&ot)[T::kHeadDimV / 2], int c))[T::kPvCols / 2] {
  return *reinterpret_cast<float(*)[T::kPvCols / 2]>(&ot[c % T::kPvBuffers * (T::kPvCols / 2)]);
}
template <int W = T::kBlockN>
__device__ __forceinline__ void gemm_pv_chunk(float (&ot)[T::kHeadDimV / 2], const u32 (&pa)[T::kPSteps][4], u64 v_desc,
                                              int c) {
  if constexpr (T::kPvChunks > 1) {
    constexpr int kN = W > 0 ? T::kPvCols : 0;  // dependent: instantiated only in a chunked build
    const u64 rows = static_cast<u64>(c * T::kPvCols * T::kRowBytesV) >> 4;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < W / T::kPKeys; ++kk)
      WgmmaE4m3<kN>::rs(chunk_acc(ot, c), pa[kk],
                        v_desc + rows + (wgmma_tile::qk_step_bytes(kk, T::kColsV, T::kVColBlockBytes) >> 4), kk > 0);
    wgmma_commit();
  }
}
// Chunk c's P.V, waited for, added to O's value dims c * kPvCols.. in fp32 (two-level accumulation).
// fold_fma: with O's rescale by the tile's factor, o = o * factor + acc (one FFMA an element); the
// chunks cover O's columns once each, so every element of O is rescaled once a tile. A chunk's
// registers are whole groups of four (kPvCols / 2 a multiple of 16), so element i's row is
// factor[(i / 2) % 2] as in rescale_o.
__device__ __forceinline__ void add_pv_chunk(float (&o)[T::kHeadDimV / 2], float (&ot)[T::kHeadDimV / 2], int c,
                                             const float (&factor)[2]) {
  float(&acc)[T::kPvCols / 2] = chunk_acc(ot, c);
  reg_fence(acc);
#pragma unroll
  for (int i = 0; i < T::kPvCols / 2; ++i) {
    float& oi = o[c * (T::kPvCols / 2) + i];
    if constexpr (T::kFoldFma) oi = fmaf(oi, factor[(i / 2) % 2], acc[i]);
    else oi += acc[i];
  }
}
// One tile's P.V chunks from kFrom on into O: kFrom 0 issues chunk 0 first; kFrom > 0 finds chunk
// kFrom - 1 issued and in flight (the overlapped schedule issues chunk 0 beside Q.K^T). Each chunk is
// added to O once its wgmma is done and before a later chunk reuses its buffer: with one buffer the
// next chunk is issued after the add; with two (pv_buffers) before it, so the tensor cores have the
// next chunk while the last one is added. Narrow (kNarrowW keys) or full, as gemm_pv_w.
// `factor`: the tile's rescale of O, which fold_fma joins to the chunks' additions (unused otherwise).
template <int kFrom, int W = T::kBlockN>
__device__ __forceinline__ void pv_chunks(float (&o)[T::kHeadDimV / 2], float (&ot)[T::kHeadDimV / 2],
                                          const u32 (&pa)[T::kPSteps][4], u64 v_desc, const float (&factor)[2]) {
  if constexpr (kFrom == 0) gemm_pv_chunk<W>(ot, pa, v_desc, 0);
#pragma unroll
  for (int c = kFrom > 0 ? kFrom - 1 : 0; c < T::kPvChunks; ++c) {  // chunk c in flight
    if (T::kPvBuffers == 2 && c + 1 < T::kPvChunks) {
      gemm_pv_chunk<W>(ot, pa, v_desc, c + 1);
      wgmma_wait<1>();
      add_pv_chunk(o, ot, c, factor);
    } else {
      wgmma_wait<0>();
      add_pv_chunk(o, ot, c, factor);
      if (c + 1 < T::kPvChunks) gemm_pv_chunk<W>(ot, pa, v_desc, c + 1);
    }
  }
}
template <int kFrom>
__device__ __forceinline__ void pv_chunks_w(bool narrow, float (&o)[T::kHeadDimV / 2], float (&ot)[T::kHeadDimV / 2],
                                            const u32 (&pa)[T::kPSteps][4], u64 v_desc, const float (&factor)[2]) {
  if (narrow) pv_chunks<kFrom, T::kNarrowW>(o, ot, pa, v_desc, factor);
  else pv_chunks<kFrom>(o, ot, pa, v_desc, factor);
}
__device__ __forceinline__ void gemm_pv_chunk_w(bool narrow, float (&ot)[T::kHeadDimV / 2],
                                                const u32 (&pa)[T::kPSteps][4], u64 v_desc, int c) {
  if (narrow) gemm_pv_chunk<T::kNarrowW>(ot, pa, v_desc, c);
  else gemm_pv_chunk(ot, pa, v_desc, c);
}

// The key (from the tile's first) of S's column 8c + 2t + e: that column itself, or with k_perm the
// key K's permuted rows put there, 16 (c % C) + 4t + 2 (c / C) + e with C = block_n / 16 (traits.cuh,
// kKPerm).
__device__ __forceinline__ int tile_key(int c, int t, int e) {
  constexpr int C = T::kBlockN / 16;
  return T::kKPerm ? 16 * (c % C) + 4 * t + 2 * (c / C) + e : 8 * c + 2 * t + e;
}

// Visible keys as bits (T::kMaskBits). Of a thread's scores of one row and key parity e (keys
// 8c + 2t + e of the tile, c < W / 8: tile_key without k_perm), bit c set for the keys below a bound:
// n = the bound - (the tile's first key + 2t + e), so key c is below it iff 8c < n.
template <int W>
__device__ __forceinline__ unsigned cols_below(int n) {
  const int k = min(max((n + 7) >> 3, 0), W / 8);  // (n + 7) >> 3: ceil(n / 8), negative n too
  if constexpr (W / 8 >= 32) return k >= 32 ? 0xffffffffu : (1u << k) - 1u;
  else return (1u << k) - 1u;
}
// Scores at `slot` (row a's parity e: e; row b's: 2 + e) of the columns whose bit is clear become
// -inf. The test as `bits & (1 << c)`, c a constant: ptxas makes it R2P's predicates (seven a word).
template <int W>
__device__ __forceinline__ void mask_cols(float (&s)[T::kBlockN / 2], int slot, unsigned bits) {
#pragma unroll
  for (int c = 0; c < W / 8; ++c) s[4 * c + slot] = (bits & (1u << c)) ? s[4 * c + slot] : neg_inf();
}

// Scores of keys a row may not see become -inf: keys past seqlen_k, and for causal keys past
// the row's diagonal (bottom-right aligned: row r sees keys < r + diag + 1). ra and rb: the query
// rows of the thread's two rows (row0 and row0 + 8; a GQA-packed build's, their packed rows' own).
template <int W = T::kBlockN>
__device__ __forceinline__ void mask_tile(float (&s)[T::kBlockN / 2], int tile, int ra, int rb, int t, int sk, int diag) {
  const int lim0 = T::kCausal ? min(sk, ra + diag + 1) : sk;
  const int lim1 = T::kCausal ? min(sk, rb + diag + 1) : sk;
  if constexpr (T::kMaskBits && !T::kKPerm) {
    const int first = tile * T::kBlockN + 2 * t;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      mask_cols<W>(s, e, cols_below<W>(lim0 - first - e));
      mask_cols<W>(s, 2 + e, cols_below<W>(lim1 - first - e));
    }
    return;
  }
#pragma unroll
  for (int c = 0; c < W / 8; ++c)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = tile * T::kBlockN + tile_key(c, t, e);
      if (col >= lim0) s[4 * c + e] = neg_inf();
      if (col >= lim1) s[4 * c + 2 + e] = neg_inf();
    }
}

// A window build: scores of keys outside a row's window (templates/common/variants.cuh: from
// row + diag - left to row + diag + right, causal right 0) or past seqlen_k become -inf. Only tiles
// that cross a bound of some row of the CTA come here (consume, needs_mask), as causal ones do.
template <int W = T::kBlockN>
__device__ __forceinline__ void mask_window(float (&s)[T::kBlockN / 2], int tile, int ra, int rb, int t, int sk, int diag,
                                            const VariantParams& v) {
  const int beg0 = key_begin<true>(ra, diag, sk, v), lim0 = key_end<T::kCausal, true>(ra, diag, sk, v);
  const int beg1 = key_begin<true>(rb, diag, sk, v), lim1 = key_end<T::kCausal, true>(rb, diag, sk, v);
  if constexpr (T::kMaskBits && !T::kKPerm) {  // visible: below lim and not below beg
    const int first = tile * T::kBlockN + 2 * t;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      mask_cols<W>(s, e, cols_below<W>(lim0 - first - e) & ~cols_below<W>(beg0 - first - e));
      mask_cols<W>(s, 2 + e, cols_below<W>(lim1 - first - e) & ~cols_below<W>(beg1 - first - e));
    }
    return;
  }
#pragma unroll
  for (int c = 0; c < W / 8; ++c)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = tile * T::kBlockN + tile_key(c, t, e);
      if (col >= lim0 || col < beg0) s[4 * c + e] = neg_inf();
      if (col >= lim1 || col < beg1) s[4 * c + 2 + e] = neg_inf();
    }
}

// A soft-cap build: each raw score q.k becomes c * tanh(q.k * scale / c) (the call's scale_log2 is
// then log2(e): the capped score is already scaled), before the mask. tanh accurate (ex2 and rcp:
// two MUFU operations a score beside the softmax's ex2) or tanh.approx (one; softcap_tanh).
template <int W = T::kBlockN>
__device__ __forceinline__ void cap_tile(float (&s)[T::kBlockN / 2], const VariantParams& v) {
#pragma unroll
  for (int i = 0; i < W / 2; ++i) s[i] = softcap_score<T::kSoftcapApprox>(s[i], v);
}

// S of K/V tile `tile` ready for the softmax: capped (soft-cap builds), then masked where `masked`
// (a tile that crosses the keys' end, the causal diagonal or a window's bound for some row).
template <int W = T::kBlockN>
__device__ __forceinline__ void finish_scores(float (&s)[T::kBlockN / 2], bool masked, int tile, int ra, int rb, int t,
                                              int sk, int diag, const VariantParams& v) {
  if constexpr (T::kSoftcap) cap_tile<W>(s, v);
  if (masked) {
    if constexpr (T::kWindow) mask_window<W>(s, tile, ra, rb, t, sk, diag, v);
    else mask_tile<W>(s, tile, ra, rb, t, sk, diag);
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

// An FP8 forward's P offset (log2 units): see softmax_tile.
constexpr float kFp8POffset = 8.f;

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
      // An FP8 forward's P is 2^kFp8POffset times the row's: up to 256 in e4m3 (whose largest is 448),
      // so that small P stay normal (e4m3's smallest normal is 2^-6); l holds the same factor, and
      // consume takes it out of m at the end (FlashAttention-3's max_offset).
      neg_base[r] = T::kQkvFp8 ? kFp8POffset - base : -base;
    }
  }
  // kFa4Loop: the sum starts from l * factor (l = sum at the end), so ex2 of the factor is needed
  // first and ptxas interleaves O's rescale with the scores' ex2 instead of queueing its 64 FMULs
  // behind them, ahead of the next Q.K^T (FA4's order; SASS read on 2026-11-30).
  float sum[2] = {T::kFa4Loop ? l[0] * factor[0] : 0.f, T::kFa4Loop ? l[1] * factor[1] : 0.f};
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
  for (int r = 0; r < 2; ++r) l[r] = T::kFa4Loop ? sum[r] : l[r] * factor[r] + sum[r];
}

__device__ __forceinline__ void rescale_o(float (&o)[T::kHeadDimV / 2], const float (&factor)[2]) {
  // Lazy: the whole warp skips it while every factor is 1 (a uniform branch).
  if (T::kLazyRescale > 0 && !__any_sync(0xffffffffu, factor[0] != 1.f || factor[1] != 1.f)) return;
#pragma unroll
  for (int c = 0; c < T::kHeadDimV / 8; ++c) {
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

// fp32 x, y to e4m3 bytes (x in byte 0, y in byte 1): round to nearest even, saturated to +-448.
__device__ __forceinline__ u32 e4m3x2(float x, float y) {
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(y), "f"(x));  // the first operand: the high byte
  return r;
}

// An FP8 forward's P (fp32 accumulator layout) -> the k32 A fragments of FP8 wgmma: per k-step kk
// (keys 32kk..32kk+31) register 0 holds row g's keys 4t..4t+3, register 1 row g+8's, registers 2
// and 3 the same at keys 16 + 4t.. (4 bytes each, the lowest key first). The accumulator gives
// thread t the pairs of keys 8c + 2t, 8c + 2t + 1 of each 8-key chunk c, so a register takes a pair
// from each of two threads of its quad: threads A = 2 (t % 2) and A + 1 hold keys 4t..4t+3 of chunk
// t / 2 (and of chunk 2 + t / 2). Each thread packs its chunks 0 and 2 into one word, 1 and 3 into
// another; two shuffles a row bring each thread the word it needs from A and from A + 1 (each
// thread offers the word its readers of that shuffle want: readers t = 0, 1, 2, 3 read lanes 0, 2,
// 1, 3 first, then 1, 3, 0, 2), and byte permutes place the pairs (FlashAttention-3's
// permute_Aregs_fp8 does this for its column-major V; the derivation here is our own).
// With k_perm, S's column chunk c holds keys 16 (c % C) + 4t + 2 (c / C) + e (tile_key; C = block_n /
// 16): the A operand's keys 4t..4t+3 of 16-key group j are chunks j (the low two) and j + C (the high
// two), so each register is two conversions and a merge.
template <int W = T::kBlockN>
__device__ __forceinline__ void pack_p_e4m3(u32 (&pa)[T::kPSteps][4], const float (&s)[T::kBlockN / 2]) {
  if constexpr (T::kKPerm) {
    constexpr int C = T::kBlockN / 16;
#pragma unroll
    for (int kk = 0; kk < W / 32; ++kk)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int lo = 2 * kk + j, hi = lo + C;  // group 2kk + j: keys 4t, 4t + 1 and 4t + 2, 4t + 3
          pa[kk][2 * j + r] =
              e4m3x2(s[4 * lo + 2 * r], s[4 * lo + 2 * r + 1]) | (e4m3x2(s[4 * hi + 2 * r], s[4 * hi + 2 * r + 1]) << 16);
        }
    return;
  }
  const int lane = threadIdx.x % 32, t = lane % 4;
  const int src1 = (lane & ~3) | (t >> 1) | ((t & 1) << 1), src2 = src1 ^ 1;
  const u32 sel_lo = t < 2 ? 0x5410u : 0x1054u, sel_hi = t < 2 ? 0x7632u : 0x3276u;
#pragma unroll
  for (int kk = 0; kk < W / 32; ++kk)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      u32 c[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) c[i] = e4m3x2(s[4 * (4 * kk + i) + 2 * r], s[4 * (4 * kk + i) + 2 * r + 1]);
      const u32 w0 = c[0] | (c[2] << 16), w1 = c[1] | (c[3] << 16);
      const u32 x1 = __shfl_sync(0xffffffffu, (t & 1) ? w1 : w0, src1);
      const u32 x2 = __shfl_sync(0xffffffffu, (t & 1) ? w0 : w1, src2);
      pa[kk][r] = __byte_perm(x1, x2, sel_lo);
      pa[kk][2 + r] = __byte_perm(x1, x2, sel_hi);
    }
}

// P into the P.V operand: 16-bit A fragments, or an FP8 forward's e4m3 ones.
template <int W = T::kBlockN>
__device__ __forceinline__ void pack_p_any(u32 (&pa)[T::kPSteps][4], const float (&s)[T::kBlockN / 2]) {
  if constexpr (T::kQkvFp8) pack_p_e4m3<W>(pa, s);
  else pack_p<W>(pa, s);
}

// An FP8 forward: the tile's P.V (ot) into O, in fp32 (two-level accumulation).
__device__ __forceinline__ void add_pv(float (&o)[T::kHeadDimV / 2], float (&ot)[T::kHeadDimV / 2]) {
  if constexpr (T::kQkvFp8) {
    reg_fence(ot);
#pragma unroll
    for (int i = 0; i < T::kHeadDimV / 2; ++i) o[i] += ot[i];
  }
}

// fold_fma: the tile's P.V (ot) into O with O's rescale, o = o * factor + ot (one FFMA an element).
__device__ __forceinline__ void add_pv_rescaled(float (&o)[T::kHeadDimV / 2], float (&ot)[T::kHeadDimV / 2],
                                                const float (&factor)[2]) {
  reg_fence(ot);
#pragma unroll
  for (int c = 0; c < T::kHeadDimV / 8; ++c) {
    o[4 * c] = fmaf(o[4 * c], factor[0], ot[4 * c]);
    o[4 * c + 1] = fmaf(o[4 * c + 1], factor[0], ot[4 * c + 1]);
    o[4 * c + 2] = fmaf(o[4 * c + 2], factor[1], ot[4 * c + 2]);
    o[4 * c + 3] = fmaf(o[4 * c + 3], factor[1], ot[4 * c + 3]);
  }
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
  // The tile's query rows from q_first, and the thread's two rows: query rows ra and rb (row0 and
  // row0 + 8). A GQA-packed build's packed row r is query row q_first + r / group of head
  // head * group + r % group (`head` the KV head; rows_of), and its rows at or past group * pack_rows
  // idle: they mask as its last row and store nothing.
  const int q_rows = T::kPackGqa ? maps.pack_rows : T::kBlockM;
  const int q_first = m_block * q_rows;
  // A packed row's query row (clamped to the tile's live rows), head, and whether it is live: worked
  // out again for the epilogue rather than held through the loop (one consumer warpgroup at d=128
  // spilled with them held).
  struct PackedRow {
    int q, head;
    bool live;
  };
  auto rows_of = [&](int r) {
    const int group = p.q_per_kv, packed = group * q_rows;
    return PackedRow{q_first + min(r, packed - 1) / group, head * group + r % group, r < packed};
  };
  const int prow = cw * 64 + warp * 16 + g;
  const int ra = T::kPackGqa ? rows_of(prow).q : q_first + prow;
  const int rb = T::kPackGqa ? rows_of(prow + 8).q : ra + 8;
  const int len_q = T::kSeqLens ? w.len_q : p.seqlen_q;
  const int sk = T::kSeqLens ? w.len_k : p.seqlen_k, diag = T::kSeqLens ? w.len_k - w.len_q : p.seqlen_k - p.seqlen_q;
  // Iteration it visits K/V tile kv_end_tile - 1 - it. (Plain builds: n itself; a second read of
  // w.n there reordered their machine code.)
  const int kv_end_tile = T::kWindow ? w.kv_end_tile() : n;
  // Tiles at or past this key need masking for some row of the CTA (its first row's end); with a
  // window, tiles before kv_left too (its last row's first key).
  const int kv_min = T::kWindow   ? key_end<T::kCausal, true>(q_first, diag, sk, p.variant)
                     : T::kCausal ? min(sk, q_first + diag + 1)
                                  : sk;
  const int kv_left = T::kWindow ? key_begin<true>(q_first + q_rows - 1, diag, sk, p.variant) : 0;

  // An FP8 cache: its K scale (the sequence's and KV head's) joins the softmax's; its V scale
  // multiplies O before the epilogue (the space offers no soft-cap with it: the cap's scale is the
  // call's).
  // (Other builds read p.scale_log2 where they use it, as before: a copy held from here changed
  // their machine code.)
  // An FP8 forward: Q's scale joins them too (maps.q_descale, the same shape as K's).
  constexpr bool kScaled = T::kKvFp8 || T::kQkvFp8;
  float fp8_scale_log2 = 0.f, v_scale = 1.f;
  if constexpr (kScaled) {
    const int kv_head = T::kPackGqa ? head : head / p.q_per_kv;
    const KvScales& kv = maps.kv;
    fp8_scale_log2 = p.scale_log2;
    if (T::kQkvFp8 && maps.q_descale)
      fp8_scale_log2 *= __ldg(maps.q_descale + batch * maps.q_descale_stride[0] + kv_head * maps.q_descale_stride[1]);
    if (kv.k_descale)
      fp8_scale_log2 *= __ldg(kv.k_descale + batch * kv.k_descale_stride[0] + kv_head * kv.k_descale_stride[1]);
    if (kv.v_descale) v_scale = __ldg(kv.v_descale + batch * kv.v_descale_stride[0] + kv_head * kv.v_descale_stride[1]);
  }
  float o[T::kHeadDimV / 2];  // (64 rows, head_dim_v) accumulator, this thread's part
  // An FP8 forward's P.V of one tile, added to o in fp32 (add_pv; unused otherwise); with pv_chunks, of
  // one column chunk of it, in the first kPvCols / 2 registers (the rest never touched).
  float ot[T::kHeadDimV / 2];
#pragma unroll
  for (int i = 0; i < T::kHeadDimV / 2; ++i) o[i] = 0.f;
  float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f}, factor[2];
  float sink_a = 0.f, sink_b = 0.f;  // sinks: the rows' heads' logits, read now for the epilogue (a load there stalls it)
  if constexpr (T::kSinks) {
    sink_a = __ldg(p.variant.sinks + (T::kPackGqa ? rows_of(prow).head : head));
    sink_b = T::kPackGqa ? __ldg(p.variant.sinks + rows_of(prow + 8).head) : sink_a;
  }
  ATT_MARK(trace_k, 0, clock64());
  ATT_MARK(trace_k, 7, global_ns());
  epilogue_store(p, out, had);
  float s[T::kBlockN / 2];     // (64 rows, block_n) scores, then P in fp32
  u32 pa[T::kPSteps][4];       // P as 16-bit A fragments

  // Ping-pong (a ring of the consumer warpgroups): warpgroup cw issues its GEMMs between a sync on
  // its named barrier and an arrive on the next warpgroup's. The kernel lets warpgroup 0 go first
  // and consumes the last warpgroup's final arrive.
  auto pp_sync = [&]() {
    if (T::kPingPong) named_bar_sync(T::kNamedPingPong + cw, T::kPingPongThreads);
  };
  auto pp_arrive = [&]() {
    if (T::kPingPong) named_bar_arrive(T::kNamedPingPong + (cw + 1) % T::kConsumerWgs, T::kPingPongThreads);
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
    // Descriptors (args.h, wgmma_tile::desc): Q and K K-major (8-row groups an atom apart), V MN-major
    // (column blocks of N kKVColBlockBytes apart, 8-key groups an atom apart); warpgroup cw's Q rows
    // start cw * 64 rows into each column block.
    const u64 q_desc = wgmma_tile::desc(sm.q + cw * 64 * T::kRowBytes, 16, T::kAtomBytes, T::kRowBytes);
    auto k_desc = [&](int st) { return wgmma_tile::desc(sm.k + st * T::kKVBytes, 16, T::kAtomBytes, T::kRowBytes); };
    // An FP8 forward's V^T: K-major as K (the keys along its rows).
    auto v_desc = [&](int st) {
      if constexpr (T::kQkvFp8) return wgmma_tile::desc(sm.v + st * T::kVBytes, 16, T::kAtomBytesV, T::kRowBytesV);
      else return wgmma_tile::desc(sm.v + st * T::kVBytes, T::kVColBlockBytes, T::kAtomBytesV, T::kRowBytesV);
    };
    auto needs_mask = [&](int tile) {
      return (tile + 1) * T::kBlockN > kv_min || (T::kWindow && tile * T::kBlockN < kv_left);
    };
    // V of iteration `it` (tile kv_end_tile-1-it) landed. Kvcache: the rows of the sequence's last
    // tile past its keys hold whatever the cache (or an earlier tile, or nothing) left there, NaN
    // included, which P's zeros would not cancel (0 * NaN): zeroed first (the last tile is
    // iteration 0; with a window, when it reaches the keys' end).
    const int v_valid = T::kKvcache ? sk - (kv_end_tile - 1) * T::kBlockN : T::kBlockN;
    auto wait_v = [&](const Slot& sl, int it) {
      mbar_wait(sm.v_full(sl.stage), sl.phase);
      if (T::kKvcache && it == 0 && v_valid < T::kBlockN) zero_v_tail(sm.v + sl.stage * T::kVBytes, v_valid, cw);
    };
    // The first `skip` iterations visit K/V tiles none of this warpgroup's 64 rows sees: past its
    // causal diagonal when block_m > block_n, or all of them for rows past seqlen_q (the last
    // query block). They only keep the ring in step: wait for the tile, take the ping-pong turn,
    // release the stages (after the full barrier, so the arrive counts toward this use of the
    // stage). Broadcast so that the loop bounds stay warp-uniform for ptxas. Without a producer
    // warpgroup, consumer thread 0 issues the loads inside its loop and may skip nothing; a single
    // consumer warpgroup needs every tile of its CTA (but with a window and kv_multicast, whose
    // tiles are the cluster's).
    // A window: the tiles the warpgroup's rows' windows reach are a range inside the CTA's, so the
    // iterations [cend, end) past its first tile idle too.
    // The warpgroup's query rows [wg_q0, wg_q1): a GQA-packed build's, those of its live packed rows
    // (none: wg_q0 = len_q, as rows past the sequence).
    int wg_q0, wg_q1;
    if constexpr (T::kPackGqa) {
      const int group = p.q_per_kv;
      wg_q0 = cw * 64 < group * q_rows ? q_first + cw * 64 / group : len_q;
      wg_q1 = q_first + min(q_rows, (cw * 64 + 63) / group + 1);
    } else {
      wg_q0 = q_first + cw * 64;
      wg_q1 = wg_q0 + 64;
    }
    int wg_kv_end, skip, cend;  // the first key none of its rows sees; iterations [skip, cend) computed
    if constexpr (T::kWindow) {
      constexpr bool kTrim = T::kWarpSpecialize && (T::kConsumerWgs > 1 || T::kKvMulticast);
      const sched::KeyRange wk = sched::window_keys<T::kCausal>(wg_q0, wg_q1, sk, diag, p.variant.window_left,
                                                                p.variant.window_right);
      const sched::KvTiles wt = sched::window_tiles(wk, T::kBlockN);
      const bool none = wg_q0 >= len_q || wt.n == 0;
      wg_kv_end = none ? 0 : wk.end;
      skip = kTrim ? warp_uniform(none ? n : kv_end_tile - (wt.first + wt.n)) : lo;
      cend = kTrim ? warp_uniform(none ? n : kv_end_tile - wt.first) : end;
    } else {
      wg_kv_end = wg_q0 >= len_q ? 0 : T::kCausal ? min(sk, wg_q1 + diag) : sk;
      const int skip_all = T::kWarpSpecialize && T::kConsumerWgs > 1
                           ? warp_uniform(n - (wg_kv_end > 0 ? (wg_kv_end + T::kBlockN - 1) / T::kBlockN : 0))
                           : 0;
      // Iterations [lo, skip) idle, [skip, end) computed. A split piece (non-causal) has skip_all 0
      // or n. No min/max clamp here: ptxas 13.0 fused max(lo, min(skip_all, end)) into a VIMNMX.RELU
      // whose predicate output then stood in for `skip == end` below, wrongly: every build with
      // split_tail 0 hung (docs/log/WGMMA.md run 34).
      // A causal split's piece [lo, end) idles through the part of [0, skip_all) inside it: the
      // clamp broadcast, so that no fused min/max's predicate can stand in for skip == cend below.
      if constexpr (T::kSplitCausal)
        skip = w.u < 0 ? skip_all : warp_uniform(skip_all >= end ? end : skip_all > lo ? skip_all : lo);
      else skip = w.u < 0 ? skip_all : skip_all > 0 ? end : lo;
      cend = end;
    }
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
    q_done(skip == cend);
    // The first tile this warpgroup computes, kv_end_tile-1-skip, is narrow when the keys its rows
    // see end within kNarrowN of its start: the ragged end of the keys (s=4096 in tiles of 192
    // leaves 64), the causal diagonal of a warpgroup whose rows start a tile's span, or a window's
    // right bound. None when it computes no tile (skip == cend): a split piece's idle warpgroup ends
    // before the key tiles do, and the test below alone would make it compute past its piece (and
    // hang).
    const bool narrow = T::kNarrowN > 0 && skip < cend &&
                        warp_uniform(min(sk, wg_kv_end) - (kv_end_tile - 1 - skip) * T::kBlockN <= T::kNarrowN);
    // Mask, softmax and pack of S for tile `tile`, narrow or full width (called with constants).
    auto s_tile = [&](int tile, bool nar) {
      if (nar) {
        finish_scores<T::kNarrowW>(s, needs_mask(tile), tile, ra, rb, t, sk, diag, p.variant);
        softmax_tile<T::kNarrowW>(s, m, l, factor, kScaled ? fp8_scale_log2 : p.scale_log2);
        pack_p_any<T::kNarrowW>(pa, s);
      } else {
        finish_scores(s, needs_mask(tile), tile, ra, rb, t, sk, diag, p.variant);
        softmax_tile(s, m, l, factor, kScaled ? fp8_scale_log2 : p.scale_log2);
        pack_p_any(pa, s);
      }
    };

    if constexpr (!T::kIntraWgOverlap) {
      // The turn: Q.K^T's issue and completion; with pp_pv, P.V and the next Q.K^T's issue (a turn
      // opened before the first Q.K^T and closed after the last P.V, one more a work tile).
      auto step = [&](int it, bool nar) {
        const Slot sl(it_base + it);
        const int tile = kv_end_tile - 1 - it;
        mbar_wait(sm.k_full(sl.stage), sl.phase);
        if constexpr (!T::kPpPv) pp_sync();
        gemm_qk_w(nar, s, q_desc, k_desc(sl.stage));
        if constexpr (T::kPpPv) pp_arrive();
        wgmma_wait<0>();
        reg_fence(s);
        q_done(it == cend - 1);
        if constexpr (!T::kPpPv) pp_arrive();
        release_kv(sm.k_empty(sl.stage));
        s_tile(tile, nar);
        if constexpr (!T::kFoldFma) rescale_o(o, factor);  // fold_fma: with the tile's P.V, below
        wait_v(sl, it);
        if constexpr (T::kPpPv) pp_sync();
        if constexpr (T::kPvChunks > 1) {
          pv_chunks_w<0>(nar, o, ot, pa, v_desc(sl.stage), factor);
        } else {
          gemm_pv_w(nar, T::kQkvFp8 ? ot : o, pa, v_desc(sl.stage));
          wgmma_wait<0>();
          reg_fence(o);
          if constexpr (T::kFoldFma) add_pv_rescaled(o, ot, factor);
          else add_pv(o, ot);
        }
        release_kv(sm.v_empty(sl.stage));
        if (!T::kWarpSpecialize && threadIdx.x == 0 && it + T::kStages < n)
          produce(sm, maps, p, it_base, it + T::kStages, kv_end_tile, T::kPackGqa ? head : head / p.q_per_kv,
                  T::kVarlen ? w.k0 : batch, sk);
      };
      int it = skip;
      if constexpr (T::kPpPv) pp_sync();  // the first Q.K^T's turn (idle when nothing is computed)
      if (narrow) step(it++, true);
      for (; it < cend; ++it) step(it, false);
      if constexpr (T::kPpPv) pp_arrive();  // the last P.V's
    } else if (skip == cend) {
      pp_sync();  // the turn of the last P.V
      pp_arrive();
    } else {
      // fold_fma: the factor O's next addition rescales it by (O is at the base of the tile whose
      // P.V is in flight; 1 before the first, when O is 0).
      float pend[2] = {1.f, 1.f};
      // Prologue: S and P of the first tile.
      auto prologue = [&](bool nar) {
        const Slot first(it_base + skip);
        mbar_wait(sm.k_full(first.stage), first.phase);
        pp_sync();
        gemm_qk_w(nar, s, q_desc, k_desc(first.stage));
        pp_arrive();
        wgmma_wait<0>();
        reg_fence(s);
        q_done(skip == cend - 1);
        release_kv(sm.k_empty(first.stage));
        s_tile(kv_end_tile - 1 - skip, nar);
      };
      // Iteration it: S_j of tile kv_end_tile-1-it beside P.V of the previous tile (narrow if pv_nar).
      // `may_mask` false (a constant, kFa4Loop's middle loop): the tile needs no mask, so the step has
      // no test and no masked code, and ptxas keeps the P.V wait behind the first ex2s instead of
      // hoisting it above the branch.
      auto step = [&](int it, bool pv_nar, bool may_mask) {
        const Slot sl(it_base + it), prev(it_base + it - 1);
        const int tile = kv_end_tile - 1 - it;
        mbar_wait(sm.k_full(sl.stage), sl.phase);
        pp_sync();
        gemm_qk(s, q_desc, k_desc(sl.stage));          // S_j
        wait_v(prev, it - 1);
        // O += P_{j-1} V_{j-1}, in flight ... (in column chunks: the first)
        if constexpr (T::kPvChunks > 1) gemm_pv_chunk_w(pv_nar, ot, pa, v_desc(prev.stage), 0);
        else gemm_pv_w(pv_nar, T::kQkvFp8 ? ot : o, pa, v_desc(prev.stage));
        pp_arrive();
        wgmma_wait<1>();
        reg_fence(s);
        q_done(it == cend - 1);
        release_kv(sm.k_empty(sl.stage));
        finish_scores(s, may_mask && needs_mask(tile), tile, ra, rb, t, sk, diag, p.variant);
        softmax_tile(s, m, l, factor, kScaled ? fp8_scale_log2 : p.scale_log2);  // ... while this runs
        if constexpr (T::kPvChunks > 1) {
          pv_chunks_w<1>(pv_nar, o, ot, pa, v_desc(prev.stage), pend);  // chunk 0 waited for, the others after it
        } else {
          wgmma_wait<0>();
          reg_fence(o);
          if constexpr (T::kFoldFma) add_pv_rescaled(o, ot, pend);
          else add_pv(o, ot);
        }
        release_kv(sm.v_empty(prev.stage));
        if constexpr (T::kFoldFma) {  // O's rescale waits for the next tile's P.V
          pend[0] = factor[0];
          pend[1] = factor[1];
        } else {
          rescale_o(o, factor);
        }
        pack_p_any(pa, s);
      };
      auto last_pv = [&](bool nar) {
        const Slot last(it_base + cend - 1);
        wait_v(last, cend - 1);
        pp_sync();
        if constexpr (T::kPvChunks > 1) {
          gemm_pv_chunk_w(nar, ot, pa, v_desc(last.stage), 0);
          pp_arrive();
          pv_chunks_w<1>(nar, o, ot, pa, v_desc(last.stage), pend);
        } else {
          gemm_pv_w(nar, T::kQkvFp8 ? ot : o, pa, v_desc(last.stage));
          pp_arrive();
          wgmma_wait<0>();
          reg_fence(o);
          if constexpr (T::kFoldFma) add_pv_rescaled(o, ot, pend);
          else add_pv(o, ot);
        }
        release_kv(sm.v_empty(last.stage));
      };
      if (narrow) prologue(true);
      else prologue(false);
      ATT_MARK(trace_k, 2, clock64());
      int it = skip + 1;
      if (narrow && it < cend) step(it++, true, true);
      if constexpr (T::kFa4Loop) {
        // Tiles go from the keys' end down: those that need the mask (the ragged end, the causal
        // diagonal) first, then the unmasked ones in a loop of their own, then a window's left edge.
        for (; it < cend && needs_mask(kv_end_tile - 1 - it); ++it) step(it, false, true);
        int unmasked_end = cend;
        if constexpr (T::kWindow)
          while (unmasked_end > it && needs_mask(kv_end_tile - unmasked_end)) --unmasked_end;
        for (; it < unmasked_end; ++it) step(it, false, false);
        if constexpr (T::kWindow)
          for (; it < cend; ++it) step(it, false, true);
      } else {
        for (; it < cend; ++it) step(it, false, true);
      }
      ATT_MARK(trace_k, 3, clock64());
      if (narrow && skip == cend - 1) last_pv(true);
      else last_pv(false);
      ATT_MARK(trace_k, 4, clock64());
      ATT_MARK(trace_k, 6, cend - skip);
    }
    if constexpr (T::kWindow)
      for (int it = cend; it < end; ++it) idle_turn(it);  // tiles left of the warpgroup's window
  }

  if constexpr (T::kQkvFp8) {  // P and l held 2^kFp8POffset: the rows' bases as the epilogue reads them
    m[0] -= kFp8POffset;
    m[1] -= kFp8POffset;
  }
  if (w.u >= 0) split_combine(maps, w, cw, o, m, l);
  if constexpr (kScaled) {
#pragma unroll
    for (int i = 0; i < T::kHeadDimV / 2; ++i) o[i] *= v_scale;
  }
  if constexpr (T::kPackGqa) {
    const PackedRow a = rows_of(prow), b = rows_of(prow + 8);
    epilogue_pack(o, m, l, sink_a, sink_b, a.live ? a.q : 1 << 30, b.live ? b.q : 1 << 30, a.head, b.head, batch, out);
  } else {
    epilogue_pack(o, m, l, sink_a, sink_b, ra, rb, head, head, batch, out);
  }
  epilogue_sequence(w, out);
  if (w.u >= 0 && m[0] != m[0]) {  // not the last piece: nothing to store (NaN mark)
    out.row0 = 1 << 30;
    if constexpr (T::kPackGqa) out.row1 = 1 << 30;  // (a packed tile's second row is a row of its own)
  }
  ATT_MARK(trace_k, 5, clock64());
}

}  // namespace att

#endif  // ATTNTUNE_FLASH_FWD_WGMMA_MAINLOOP_CUH
