// ---- templates/flash_fwd_wgmma/work_tiles.cuh: the device side of the scheduler (scheduler.h holds
// what the launch plan shares): a work tile from its index and the kernel's arguments, and the
// work items of a CTA of a static persistent grid, the stream-K tail's pieces included.
#ifndef ATTNTUNE_FLASH_FWD_WGMMA_WORK_TILES_CUH
#define ATTNTUNE_FLASH_FWD_WGMMA_WORK_TILES_CUH

#include "../common/attn_params.h"
#include "args.h"
#include "scheduler.h"
#include "smem.cuh"

namespace att {

// A work tile: query block m_block of (batch, head) (a GQA-packed build: of every query head of KV
// head `head`), visiting n K/V tiles: kv_end_tile() - 1 down
// to kv_end_tile() - n (iteration it visits kv_end_tile() - 1 - it).
struct WorkTile {
  int m_block, head, batch, n;
  int lo, hi;           // the K/V iterations this CTA computes: [0, n) but for a split tail piece
  int u;                // tail tile index (-1: not split)
  // A split piece's workspace slot; a window build (which has no split tail): its first K/V tile
  // (else the tiles start at 0). One int either way: a field more changed how plain builds copy
  // the struct, and their machine code.
  union {
    int slot;
    int first;
  };
  // Varlen: the sequence's first query and key rows in the packed tensors, and its lengths.
  // Kvcache: 0, 0, seqlen_q and the sequence's keys. (Dense: unset; the code reads AttnParams.)
  int q0, k0, len_q, len_k;
  __device__ int kv_end_tile() const { return T::kWindow ? first + n : n; }
};

// A work tile's query rows, and the heads the work tiles run over: a GQA-packed build's are
// TmaMaps::pack_rows query rows of every query head of one KV head (scheduler.h, pack_rows), the
// others' block_m rows of one query head.
__device__ __forceinline__ int tile_rows(const TmaMaps& maps) { return T::kPackGqa ? maps.pack_rows : T::kBlockM; }
__device__ __forceinline__ int tile_heads(const AttnParams& p) { return T::kPackGqa ? p.heads_kv : p.heads_q; }

// A window build: the K/V tiles of a work tile's rows (scheduler.h, window_tiles) into w.first and
// w.n. With kv_multicast both CTAs of a cluster load the same K/V tiles (rank 0 issues them): the
// tiles of the cluster's rows, which each CTA's warpgroups trim to their own (consume).
__device__ __forceinline__ void window_tiles(const AttnParams& p, const TmaMaps& maps, WorkTile& w, int len_q,
                                             int len_k) {
  const int rows = T::kPackGqa ? maps.pack_rows : T::kBlockM * T::kCluster;
  const int r0 = w.m_block / T::kCluster * rows;
  const sched::KvTiles t = sched::window_tiles(
      sched::window_keys<T::kCausal>(r0, r0 + rows, len_k, len_k - len_q, p.variant.window_left, p.variant.window_right),
      T::kBlockN);
  w.first = t.first;
  w.n = t.n;
}

// Varlen (scheduler.h, varlen_block_start): inside a sequence the tiles go as a dense batch's do
// (causal in head groups, longest blocks first; every head of a block together, head groups aside,
// ran 2% slower on 16 equal sequences: run 106).
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
    const int i = t / tile_heads(p);
    int lo = 0, hi = p.batch - 1;  // the last sequence starting at or before i
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (sched::varlen_block_start(p.cu_seqlens_q[mid], mid, tile_rows(maps)) <= i) lo = mid;
      else hi = mid - 1;
    }
    seq = lo;
    r = t - sched::varlen_block_start(p.cu_seqlens_q[lo], lo, tile_rows(maps)) * tile_heads(p);
  }
  w.batch = seq;
  w.q0 = p.cu_seqlens_q[seq];
  w.k0 = p.cu_seqlens_k[seq];
  w.len_q = p.cu_seqlens_q[seq + 1] - w.q0;
  w.len_k = p.cu_seqlens_k[seq + 1] - w.k0;
  const int mb = sched::query_blocks(w.len_q, tile_rows(maps), 1);
  if (r >= mb * tile_heads(p)) {  // between two sequences, or past the last: no keys, rows nobody stores
    w.head = 0;
    w.m_block = mb;
    w.n = 0;
    if constexpr (T::kWindow) w.first = 0;
    return w;
  }
  const sched::TileCoord c = sched::tile_coord<T::kCausal>(r, mb, tile_heads(p), T::kHeadGroup);
  w.m_block = c.m_block;
  w.head = c.pair;
  if constexpr (T::kWindow) window_tiles(p, maps, w, w.len_q, w.len_k);
  else
    w.n = sched::kv_tiles(sched::kv_end<T::kCausal>(w.m_block, tile_rows(maps), w.len_k, w.len_k - w.len_q), T::kBlockN);
  return w;
}

// Work tile t (scheduler.h, tile_coord) with its sequence's keys (kvcache) and its K/V tile count.
__device__ __forceinline__ WorkTile work_tile(const AttnParams& p, const TmaMaps& maps, int t, int m_blocks) {
  if constexpr (T::kVarlen) return varlen_tile(p, maps, t);
  WorkTile w;
  const sched::TileCoord c = sched::tile_coord<T::kCausal>(t, m_blocks, tile_heads(p) * p.batch, T::kHeadGroup);
  w.m_block = c.m_block;
  const int bh = c.pair;
  w.head = bh % tile_heads(p);  // a packed build's: the KV head
  w.batch = bh / tile_heads(p);
  int len_k = p.seqlen_k;
  if constexpr (T::kKvcache) {  // the sequence's keys: cache_seqlens, clamped to 0..seqlen_k
    if (p.cache_seqlens) len_k = max(0, min(p.seqlen_k, p.cache_seqlens[w.batch]));
    w.q0 = w.k0 = 0;
    w.len_q = p.seqlen_q;
    w.len_k = len_k;
  }
  if constexpr (T::kWindow) window_tiles(p, maps, w, p.seqlen_q, len_k);
  else
    w.n = sched::kv_tiles(sched::kv_end<T::kCausal>(w.m_block, tile_rows(maps), len_k, len_k - p.seqlen_q), T::kBlockN);
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

// Dynamic tiles: the counter's units, the work tiles themselves but with the causal split
// (Traits::kSplitCausal, TmaMaps::causal_split), whose last units are pieces of the last tiles
// (scheduler.h, CausalSplit). unit_tile(u) is unit u's work tile and K/V iterations [lo, hi); a
// piece's u is its split tile and slot its workspace slot.
__device__ __forceinline__ int work_units(const TmaMaps& maps, int tiles) {
  return T::kSplitCausal ? sched::causal_split_units(tiles, maps.causal_split) : tiles;
}
__device__ __forceinline__ WorkTile unit_tile(const AttnParams& p, const TmaMaps& maps, int u, int tiles, int m_blocks) {
  if constexpr (T::kSplitCausal) {
    const sched::CausalSplit c = maps.causal_split;
    const int plain = tiles - c.s1 - c.s2;
    if (u >= plain) {
      const sched::UnitPiece k = sched::causal_unit_piece(u, tiles, c);
      WorkTile w = work_tile(p, maps, plain + k.split, m_blocks);
      w.lo = sched::piece_begin(w.n, k.piece, k.pieces);
      w.hi = sched::piece_begin(w.n, k.piece + 1, k.pieces);
      w.u = k.split;
      w.slot = k.first_slot + k.piece;
      return w;
    }
  }
  return plain_tile(p, maps, u, m_blocks);
}

// The work items of CTA c (of C) of a static persistent grid, in turn: `next` starts at c and
// `next_item` advances it. First the plain work tiles c, c + C, ... below the split tail (next is
// the tile); then, with Traits::kSplitTail, the CTA's share of the tail's K/V iterations: at most
// two pieces, as a share is shorter than a tile (next is plain_end + C + the piece). Without a
// split this is the plain `t < tiles; t += C` loop. The pieces are computed once, before the
// warpgroups part (split_pieces): the producer runs on 24 registers, and the divisions spilled
// there.
__device__ __forceinline__ bool next_item(const AttnParams& p, const TmaMaps& maps, const Smem& sm, int c, int C,
                                          int tiles, int m_blocks, int& next, WorkTile& w) {
  // Traits::kScheduleInSmem: the end of the plain tiles and the query blocks from shared memory.
  const int plain_end = T::kScheduleInSmem ? ld_shared_s32(sm.plain_end()) : tiles;
  if (T::kScheduleInSmem) m_blocks = ld_shared_s32(sm.m_blocks());
  if (next < plain_end) {
    w = plain_tile(p, maps, next, m_blocks);
    next += C;
    return true;
  }
  if (!T::kSplitTail) return false;  // (without a split the pieces below are empty)
  if (next < plain_end + C) next = plain_end + C;  // the first tail piece
  const int k = next++ - (plain_end + C);
  if (k > 1) return false;
  const int u = ld_shared_s32(sm.piece(k) + T::kPieceU);
  if (u < 0) return false;
  w = work_tile(p, maps, plain_end + u, m_blocks);
  w.lo = ld_shared_s32(sm.piece(k) + T::kPieceLo);
  w.hi = ld_shared_s32(sm.piece(k) + T::kPieceHi);
  w.u = u;
  w.slot = sched::split_slot(c, k);
  return true;
}

// The split is over clusters (kCluster CTAs, kKvMulticast; scheduler.h): CTA c's share as pieces
// k = 0, 1 in shared memory, then the plain tiles' end, tiles - split_tail, and the query blocks
// (next_item). 32-bit arithmetic: the launcher splits only when split_tail * n * C and
// tiles + 2 * C stay below 2^31.
__device__ __forceinline__ void split_pieces(const AttnParams& p, const TmaMaps& maps, const Smem& sm, int c, int C,
                                             int tiles, int m_blocks) {
  const int split = T::kSplitTail ? maps.split_tail : 0;
  const int g = c / T::kCluster, G = C / T::kCluster, rank = c % T::kCluster;
  int n = 1, b = 0, e = 0;  // no split: an empty share
  if (split > 0) {
    n = sched::split_iterations(p.seqlen_k, T::kBlockN);  // > 0: the launcher splits only with keys
    const int total = split / T::kCluster * n;
    b = sched::tail_begin(total, g, G);
    e = sched::tail_begin(total, g + 1, G);
  }
  for (int k = 0; k < 2; ++k) {
    const sched::SplitPiece s = sched::split_piece(k, b, e, n, rank, T::kCluster);
    st_shared_s32(sm.piece(k) + T::kPieceU, s.u);
    st_shared_s32(sm.piece(k) + T::kPieceLo, s.lo);
    st_shared_s32(sm.piece(k) + T::kPieceHi, s.hi);
  }
  st_shared_s32(sm.plain_end(), tiles - split);
  st_shared_s32(sm.m_blocks(), m_blocks);
}

}  // namespace att

#endif  // ATTNTUNE_FLASH_FWD_WGMMA_WORK_TILES_CUH
