// ---- templates/flash_fwd_wgmma/args.h: what flash_fwd_wgmma takes after AttnParams, shared by the
// kernel (kernel.cu and its headers) and its launch plan (launch.h, host code), so the layout exists once.
// Plain C++, no CUDA header.
#ifndef ATTNTUNE_FLASH_FWD_WGMMA_ARGS_H
#define ATTNTUNE_FLASH_FWD_WGMMA_ARGS_H

#include "../common/tma_desc.h"

namespace att {

// Tensor maps over Q, K, V as 4-d tensors (head_dim, seqlen, heads, batch), box (64, rows): Q's
// box is kBlockM rows, K's and V's kBlockN. The launch plan encodes them per call.
struct TmaMaps {
  TmaDesc q, k, v;
  // Stream-K tail (Traits::kSplitTail): the last split_tail work tiles of a persistent grid are
  // shared out by K/V iterations, an equal share per CTA; split_ws holds each piece's partial O,
  // m and l ([2 * CTAs][consumer warps][head_dim / 2 + 4][32] floats), split_count each (tail
  // tile, consumer warp)'s arrivals (zero before the first launch; the last arrival resets it).
  // split_tail 0: no split (every launcher that passes no workspace).
  float* split_ws;
  int* split_count;
  int split_tail;
  // Causal and varlen persistent grids with a producer (Traits::kDynamicTiles): two ints, zero before the
  // first launch, which the last CTA to finish resets: [0] the work tiles handed out beyond each
  // CTA's first, [1] the CTAs done. Null: the static round-robin (correct, but causal tiles differ
  // in length and the SMs end unevenly).
  int* tile_count;
  // A kvcache build with a page table: K/V rows per TMA box, gcd(page_size, BLOCK_N) (a box stays
  // within a page and a tile is whole boxes; a multiple of 8, the 128-byte swizzle atom). Then the
  // K and V maps are (head_dim, page_size, heads_kv, pages). 0 otherwise.
  int kv_box_rows;
  // A varlen build's order of the work tiles, longest sequences first (flash_fwd_wgmma_varlen_order
  // fills it before the main kernel): [0, batch) the sequences by descending key count, [batch,
  // 2 * batch + 1) the first work tile of each in that order (a prefix sum of their tiles,
  // ceil(len_q / BLOCK_M) * heads_q each). Null: the packed order (scheduler.h, work_tiles.cuh's varlen_tile).
  const int* varlen_order;
  // A varlen build: the work tiles of the packed index space, (total_q / BLOCK_M + batch) * heads_q
  // (the grid of a launch of one CTA a tile; a persistent grid is smaller).
  int varlen_tiles;
};

// The order kernel's block (one CTA) and the most sequences it orders: a larger batch runs in the
// packed order.
constexpr int kVarlenOrderThreads = 1024;

}  // namespace att

#endif  // ATTNTUNE_FLASH_FWD_WGMMA_ARGS_H
