// ---- templates/flash_decode/args.h: the one argument of flash_decode's two kernels, shared by the
// kernels (kernel.cu, NVRTC) and the launch plan (launch.h, host), so the layout exists once.
// Plain C++, no CUDA header.
#ifndef ATTNTUNE_FLASH_DECODE_ARGS_H
#define ATTNTUNE_FLASH_DECODE_ARGS_H

#include "../common/tma_desc.h"
#include "../common/variant_params.h"
#include "split.h"

namespace att {

// One call of flash_decode, as its launch plan filled it (launch.h: decode_params).
//
// Work unit: (batch b, kv head, row block). Its rows are the group's query heads times seqlen_q,
// packed: row r = g * seqlen_q + i is query i of query head kv_head * group + g. Global row id
// R = (b * heads_q + head) * seqlen_q + i (the index of lse); a unit's rows are contiguous in R.
struct DecodeParams {
  const void* q;         // [batch, heads_q, seqlen_q, d] through q_stride
  const void* k;         // contiguous: [batch, heads_kv, seqlen_k, d]; paged: [pages, page_size, heads_kv, d]
  const void* v;
  void* o;               // like q, through o_stride
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
  // stays within a page) and whether the boxes are 128-byte swizzled (rows a multiple of 8).
  int tma_rows, tma_swizzle;
  VariantParams variant;  // windows, soft-cap, sinks (common/variant_params.h); read only by builds with them
};

// KV_LOAD tma: tensor maps over K and V (contiguous: (head_dim, seqlen_k, heads_kv, batch); paged:
// (head_dim, page_size, heads_kv, pages)), box (64, tma_rows, 1, 1), encoded per call by the
// executor from the plan. Zeros (unused) for cp.async builds.
struct DecodeMaps {
  TmaDesc k, v;
};

}  // namespace att

#endif  // ATTNTUNE_FLASH_DECODE_ARGS_H
