// ---- templates/flash_fwd_wgmma/args.h: what flash_fwd_wgmma takes after AttnParams, shared by the
// kernel (kernel.cu and its headers) and its launch plan (launch.h, host code), so the layout exists once.
// Plain C++, no CUDA header.
#ifndef ATTNTUNE_FLASH_FWD_WGMMA_ARGS_H
#define ATTNTUNE_FLASH_FWD_WGMMA_ARGS_H

#include "../common/kv_scales.h"
#include "../common/tma_desc.h"
#include "scheduler.h"

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define ATT_WGMMA_FN __host__ __device__ __forceinline__
#else
#define ATT_WGMMA_FN inline
#endif

namespace att {

// ---- the tiles' shared-memory layout, as TMA writes it and wgmma reads it ----
// Every Q, K and V tile is [column block][row][wgmma_tile::cols(head_dim) elements]: each TMA box
// is one column block (box (cols, rows)), its rows of 2 * cols bytes swizzled by TMA in 16-byte
// chunks over that span (CU_TENSOR_MAP_SWIZZLE_128B / 64B / 32B: chunk ^= (row & 7), ((row >> 1)
// & 3), ((row >> 2) & 1), an atom of 8 rows: 1024, 512 or 256 bytes), which is the wgmma
// descriptors' layout type of the same span. One span for the whole tile, the widest that divides
// the head dim: 64 columns (128 B) when head_dim % 64 == 0 (d = 64, 128, 192, 256: the layout
// before other head dims), 32 (64 B) when head_dim % 32 == 0 (32, 96, 160, 224), else 16 (32 B:
// 48, 80, 112, 144, 176, 208, 240). Tile and column-block starts are multiples of the atom (rows
// come in multiples of 16; the kernel aligns the first tile to 1024).
namespace wgmma_tile {  // (launch.h includes every family's args.h into one program: names inside)
ATT_WGMMA_FN constexpr int cols(int head_dim) { return head_dim % 64 == 0 ? 64 : head_dim % 32 == 0 ? 32 : 16; }
ATT_WGMMA_FN constexpr int swizzle_bytes(int head_dim) { return 2 * cols(head_dim); }

// wgmma's shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): the start address
// >> 4 (bits 0-13), the leading and stride byte offsets >> 4 (bits 16-29, 32-45), the base offset 0
// (the atoms start aligned) and the layout type in bits 62-63 (1: 128B swizzle, 2: 64B, 3: 32B).
// For a swizzled K-major operand (Q and K in Q.K^T) the leading offset is unused (1 by convention,
// 16 bytes) and the stride offset steps between groups of 8 rows: the atom, 8 * swizzle bytes. For a
// swizzled MN-major operand (V in P.V, N = head_dim across the column blocks) the leading offset
// steps between column blocks of N (swizzle bytes / 2 elements each) and the stride offset between
// groups of 8 keys (K): again the atom (CUTLASS's cute/atom/mma_traits_sm90_gmma.hpp, make_gmma_desc).
ATT_WGMMA_FN constexpr unsigned long long desc(unsigned addr, unsigned lead_bytes, unsigned stride_bytes,
                                              int swizzle_bytes) {
  return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4) |
         (static_cast<unsigned long long>(lead_bytes >> 4) << 16) |
         (static_cast<unsigned long long>(stride_bytes >> 4) << 32) |
         (static_cast<unsigned long long>(swizzle_bytes == 128 ? 1 : swizzle_bytes == 64 ? 2 : 3) << 62);
}
// What a k16 step adds to a descriptor's start address, in bytes. Q.K^T's step kk (head_dim
// columns 16kk..16kk+15, K-major): column block 16kk / cols, 32 bytes per step inside its row. P.V's
// step kk (keys 16kk..16kk+15, V MN-major): 16 rows of 2 * cols bytes.
ATT_WGMMA_FN constexpr int qk_step_bytes(int kk, int cols, int col_block_bytes) {
  return (kk * 16 / cols) * col_block_bytes + (kk * 16 % cols) * 2;
}
ATT_WGMMA_FN constexpr int pv_step_bytes(int kk, int cols) { return kk * 16 * cols * 2; }
}  // namespace wgmma_tile

// Tensor maps over Q, K, V as 4-d tensors (head_dim, seqlen, heads, batch), box
// (wgmma_tile::cols(head_dim), rows), swizzle wgmma_tile::swizzle_bytes(head_dim): Q's box is kBlockM
// rows, K's and V's kBlockN (or kv_box_rows). The launch plan encodes them per call.
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
  // within a page and a tile is whole boxes; a multiple of 8, the swizzle atom's rows in every span). Then the
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
  // A GQA-packed build (Traits::kPackGqa): the query rows of a work tile, scheduler.h's
  // pack_rows(BLOCK_M, heads_q / heads_kv) (Q's map is then (head_dim, heads_q, seqlen, batch) in
  // boxes of (cols, heads_q / heads_kv, pack_rows)). Unused otherwise.
  int pack_rows;
  // An FP8 cache (Traits::kKvFp8): its dequantisation scales (common/kv_scales.h). Unused otherwise.
  KvScales kv;
  // An FP8 cache converted before the main kernel (flash_fwd_wgmma_kv_dequant, launch 0, into a
  // workspace): k and v are then maps over that 16-bit copy, contiguous ((head_dim, seqlen_k,
  // heads_kv, batch), unscaled: the scales still apply), and the producer loads them into the stages
  // as for a 16-bit cache. 0: the kernel converts each staged tile itself (mainloop.cuh).
  int kv_dequantised;
  // An FP8 forward (Traits::kQkvFp8): Q's dequantisation scales, FlashAttention-3's descale_q
  // ([batch, heads_kv] fp32 through {batch, head} strides in elements; {0, 0}: one for the tensor;
  // null: 1). K's and V's are kv's. Unused otherwise.
  const float* q_descale;
  int q_descale_stride[2];
  // The causal split (Traits::kSplitCausal; scheduler.h, CausalSplit): the counter's last units are
  // pieces of the last s1 + s2 work tiles, with split_ws a slot a piece and split_count a counter a
  // split tile. Zero: no split (the counter hands out the tiles whole). (Last: the other fields keep
  // their offsets, and the builds without it their machine code.)
  sched::CausalSplit causal_split;
};
// The dequantising kernel's block, and where the V copy starts in its workspace (after K's,
// 1024-aligned): K [batch][heads_kv][seqlen_k][head_dim], V the same at head_dim_v, 16-bit.
constexpr int kKvDequantThreads = 256;
ATT_WGMMA_FN constexpr unsigned long long kv_dequant_v_offset(long long batch, long long heads_kv, long long seqlen_k,
                                                              long long head_dim) {
  return static_cast<unsigned long long>((batch * heads_kv * seqlen_k * head_dim * 2 + 1023) / 1024 * 1024);
}

// The order kernel's block (one CTA) and the most sequences it orders: a larger batch runs in the
// packed order.
constexpr int kVarlenOrderThreads = 1024;

}  // namespace att

#endif  // ATTNTUNE_FLASH_FWD_WGMMA_ARGS_H
