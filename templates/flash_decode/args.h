// ---- templates/flash_decode/args.h: the one argument of flash_decode's two kernels, shared by the
// kernels (kernel.cu, NVRTC) and the launch plan (launch.h, host), so the layout exists once.
// Plain C++, no CUDA header.
#ifndef ATTNTUNE_FLASH_DECODE_ARGS_H
#define ATTNTUNE_FLASH_DECODE_ARGS_H

#include "../common/kv_scales.h"
#include "../common/tma_desc.h"
#include "../common/variant_params.h"
#include "split.h"

namespace att {

// ---- shared-memory tiles and their cp.async loads (traits.cuh, kernel.cu; launch.h's TMA boxes) ----

// The tiles' column blocks, in elements: 64 where head_dim is a multiple of 64 (rows of 128
// bytes, TMA's 128-byte swizzle), else 32 where it is one of 32 (64 bytes, the 64-byte swizzle),
// else 16 (32 bytes, the 32-byte swizzle). Also the K/V TMA boxes' width (launch.h); their
// swizzle span is twice it in bytes.
ATT_SPLIT_FN constexpr int decode_tile_cols(int head_dim) {
  return head_dim % 64 == 0 ? 64 : head_dim % 32 == 0 ? 32 : 16;
}
// log2 of a column block's 16-byte chunks (8, 4, 2).
ATT_SPLIT_FN constexpr int decode_block_chunks_log2(int head_dim) {
  return decode_tile_cols(head_dim) == 64 ? 3 : decode_tile_cols(head_dim) == 32 ? 2 : 1;
}

// The byte offset of 16-byte chunk `chunk` (of head_dim / 8) of row `row` of a tile of `rows` rows:
// head_dim / cols column blocks of (rows, cols elements) (cols = decode_tile_cols), rows of cols *
// 2 bytes, the chunk's index within its block XORed with a function of xr = row % 8 (0:
// unswizzled), TMA's swizzle of the rows' span (CUTLASS Swizzle<3|2|1, 4, 3>: byte bits 4.. XOR
// bits 7..), the layout a TMA box of (cols, rows) lands in at a multiple of 8 rows' bytes:
//   128-byte rows: chunk ^ xr          (8 chunks a row; the pattern repeats every 1024 bytes)
//    64-byte rows: chunk ^ (xr >> 1)   (4 chunks, ^ row / 2 % 4; 512 bytes)
//    32-byte rows: chunk ^ (xr >> 2)   (2 chunks, ^ row / 4 % 2; 256 bytes)
// so the 8 rows from a multiple of 8 of one chunk column (an ldmatrix phase) fall in 8 different
// 16-byte bank groups. Linear in row: rows from row0 are the tile's address + row0 * cols * 2.
ATT_SPLIT_FN constexpr unsigned decode_tile_bytes(int row, int chunk, int rows, int xr, int head_dim) {
  return static_cast<unsigned>(
      (chunk >> decode_block_chunks_log2(head_dim)) * rows * (decode_tile_cols(head_dim) * 2) +
      row * (decode_tile_cols(head_dim) * 2) +
      (((chunk & ((1 << decode_block_chunks_log2(head_dim)) - 1)) ^ (xr >> (3 - decode_block_chunks_log2(head_dim))))
       << 4));
}

// A load group's `threads` threads copy `rows` rows of a K and a V tile by 16-byte cp.async.
// Row loads, where the row's chunks (head_dim / 8) divide the threads (head_dim 32, 64, 128,
// 256): thread t copies chunk t % chunks of rows t / chunks + pass * threads / chunks. Else
// block loads: the rows' column blocks one after the other, each rows x block_chunks items (row
// major); thread t copies item t + pass * threads (decode_block_item), the last pass ragged
// where the items do not fill it.
ATT_SPLIT_FN constexpr bool decode_row_loads(int head_dim, int threads) { return threads % (head_dim / 8) == 0; }
ATT_SPLIT_FN constexpr int decode_load_passes(int head_dim, int threads, int rows) {
  return (rows * (head_dim / 8) + threads - 1) / threads;
}
// Block loads: the row of item `item` (from the group's first) and its chunk (of head_dim / 8).
ATT_SPLIT_FN constexpr int decode_block_item_row(int item, int rows, int head_dim) {
  return (item >> decode_block_chunks_log2(head_dim)) % rows;
}
ATT_SPLIT_FN constexpr int decode_block_item_chunk(int item, int rows, int head_dim) {
  return (item >> decode_block_chunks_log2(head_dim)) / rows * (decode_tile_cols(head_dim) / 8) +
         (item & (decode_tile_cols(head_dim) / 8 - 1));
}
// The distinct rows of a thread's passes (paged: the page lookups it keeps): row loads, one a
// pass; block loads, pass p's row is pass p % lookups' (threads and rows powers of 2).
ATT_SPLIT_FN constexpr int decode_load_lookups(int head_dim, int threads, int rows) {
  return decode_row_loads(head_dim, threads) ? decode_load_passes(head_dim, threads, rows)
         : rows * (decode_tile_cols(head_dim) / 8) > threads ? rows * (decode_tile_cols(head_dim) / 8) / threads
                                                              : 1;
}

// One call of flash_decode, as its launch plan filled it (launch.h: decode_params).
//
// Work unit: (batch b, kv head, row block). Its rows are the group's query heads times seqlen_q,
// packed: row r = g * seqlen_q + i is query i of query head kv_head * group + g. Global row id
// R = (b * heads_q + head) * seqlen_q + i (the index of lse); a unit's rows are contiguous in R.
struct DecodeParams {
  const void* q;         // [batch, heads_q, seqlen_q, d] through q_stride
  const void* k;         // contiguous: [batch, heads_kv, seqlen_k, d]; paged: [pages, page_size, heads_kv, d]
  const void* v;         // as k, rows of dv (V's head dim: ATT_HEAD_DIM_V, else d)
  void* o;               // like q, rows of dv, through o_stride
  float* lse;            // null, or [batch, heads_q, seqlen_q] fp32 contiguous, natural log
  const int* cache_seqlens;  // null: every sequence has seqlen_k keys; else [batch] (clamped to 0..seqlen_k)
  const int* block_table;    // null: contiguous K/V; else [batch, max_blocks_per_seq] page indices
  // Split-KV (split_pieces(num_splits, CLUSTER) > 1): the pieces, each split's normalized partial
  // (or with clusters each cluster's merge), in workspace 0 as split.h lays it out (part_o its
  // start, part_lse its LSE), merged by the combine kernel or by the unit's last CTA (cluster) to
  // arrive at its counter (workspace 1, split.h's unit_counter).
  float* part_o;
  float* part_lse;
  int* counters;
  long long q_stride[3], k_stride[3], v_stride[3], o_stride[3];  // elements; k/v paged: {page, head, row}
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k;  // seqlen_k: the max (kvcache: seqlen_k_max)
  int group;       // heads_q / heads_kv
  int rows;        // group * seqlen_q: the rows of one (batch, kv head)
  int row_blocks;  // ceil(rows / BLOCK_M)
  int rows_total;  // batch * heads_q * seqlen_q
  int num_splits;  // grid.x = num_splits * row_blocks (clusterN: a multiple of N); 1: the main kernel writes o and lse itself
  int max_blocks_per_seq, page_size;
  // page_size as a multiply-shift divisor (FastDivmod): j / page_size = umulhi(j, page_mul) >>
  // page_shift for 0 <= j < 2^31 (page_size 1: page_mul 0, j itself).
  unsigned page_mul;
  int page_shift;
  float scale;       // softmax scale
  float scale_log2;  // scale * log2(e)
  // KV_LOAD tma: rows per K/V box (contiguous: BLOCK_N; paged: gcd(page_size, BLOCK_N), so a box
  // stays within a page) and whether the boxes are swizzled (rows a multiple of 8; the span is
  // decode_tile_cols(head_dim) * 2 bytes; V's, decode_tile_cols(dv) * 2).
  int tma_rows, tma_swizzle;
  VariantParams variant;  // windows, soft-cap, sinks (common/variant_params.h); read only by builds with them
  KvScales kv;            // an FP8 cache's scales (common/kv_scales.h); read only by ATT_KV_FP8 builds
};

// KV_LOAD tma: tensor maps over K and V (contiguous: (head_dim, seqlen_k, heads_kv, batch); paged:
// (head_dim, page_size, heads_kv, pages)), box (decode_tile_cols(head_dim), tma_rows, 1, 1), V's
// of its own head dim (dv) and column blocks, encoded per call by the executor from the plan.
// Zeros (unused) for cp.async builds.
struct DecodeMaps {
  TmaDesc k, v;
};

}  // namespace att

#endif  // ATTNTUNE_FLASH_DECODE_ARGS_H
