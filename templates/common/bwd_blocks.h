// ---- templates/common/bwd_blocks.h: which query blocks a key block's CTA walks and in which
// order, and, for the deterministic mode, how many CTAs add into a query block's dQ before a given
// one. Plain C++ shared by the main kernels of both backward families (flash_bwd_mma,
// flash_bwd_wgmma; NVRTC, nvcc) and the host's unit tests (tests/unit/families/test_flash_bwd_mma.cpp
// checks by brute force, over lengths, block shapes, causal bounds and windows, that the CTAs walking a query block are consecutive key blocks and
// first_key_block names the first, and the walks' order), so the turn the kernel waits for is the
// one the test checked, not a copy of it.
#ifndef ATTNTUNE_BWD_BLOCKS_H
#define ATTNTUNE_BWD_BLOCKS_H

#include "variant_params.h"

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define ATT_BWD_HD __host__ __device__ __forceinline__
#else
#define ATT_BWD_HD inline
#endif

namespace att_bwd {

#if defined(__CUDA_ARCH__)
ATT_BWD_HD int imax(int a, int b) { return max(a, b); }
ATT_BWD_HD int imin(int a, int b) { return min(a, b); }
#else
ATT_BWD_HD int imax(int a, int b) { return a > b ? a : b; }
ATT_BWD_HD int imin(int a, int b) { return a < b ? a : b; }
#endif

// The CTA's key block and the (y, z) of its grid row (the KV head, with flash_bwd_mma's dkv_split
// part, and the batch), from its block index in a grid (key blocks, gy, gz): the grid's own order
// (kLongestFirst 0: key blocks fastest), or the launch's linear order taken as (y, z) pairs in groups
// of kLongestFirst, each group's key blocks slowest, so that under a causal bound every pair's first
// key block (the longest walk) starts in the first wave and the last wave holds the short walks
// (longest-processing-time first: +10% causal in flash_bwd_wgmma, H200 run 208). Either way a pair's
// lower key blocks come earlier in the linear order, which the deterministic mode's turns rely on;
// tests/unit/families/test_flash_bwd_mma.cpp checks both by brute force.
struct CtaBlock {
  int key_block, y, z;
};
// (The grid's dims stay unsigned, as blockIdx's and gridDim's are: the divides by them are unsigned
// ones, fewer instructions than signed.)
template <int kLongestFirst>
ATT_BWD_HD CtaBlock cta_block(unsigned bx, unsigned by, unsigned bz, unsigned gx, unsigned gy, unsigned gz) {
  if constexpr (kLongestFirst > 0) {
    const int pairs = static_cast<int>(gy * gz);
    const int lin = static_cast<int>(bx + gx * (by + gy * bz));
    const int group = static_cast<int>(lin / (gx * kLongestFirst)), in_group = static_cast<int>(lin % (gx * kLongestFirst));
    const int group_pairs = imin(kLongestFirst, pairs - group * kLongestFirst);  // the last group's may be fewer
    const int pair = group * kLongestFirst + in_group % group_pairs;
    return CtaBlock{in_group / group_pairs, static_cast<int>(pair % gy), static_cast<int>(pair / gy)};
  } else {
    return CtaBlock{static_cast<int>(bx), static_cast<int>(by), static_cast<int>(bz)};
  }
}

// The query rows [*row_begin, *row_end) that see any key of the block of block_n keys from n0:
// causal (bottom-right, diag = len_k - len_q) and windows bound them (v's window_left/right, -1:
// unbounded; read by window builds only; a causal build ignores window_right, as the causal bound is
// tighter). Empty (*row_end <= *row_begin) when no row does.
template <bool kCausal, bool kWindow>
ATT_BWD_HD void key_block_rows(int n0, int block_n, int len_q, int diag, const VariantParams& v, int* row_begin,
                               int* row_end) {
  int rb = 0, re = len_q;
  if (kCausal) rb = imax(rb, n0 - diag);
  if constexpr (kWindow) {
    if (v.window_left >= 0) re = imin(re, n0 + block_n - diag + v.window_left);
    if (!kCausal && v.window_right >= 0) rb = imax(rb, n0 - diag - v.window_right);
  }
  *row_begin = rb;
  *row_end = re;
}

// The query blocks (of block_m rows) a key block's CTA walks, from its rows: [*m_first, *m_first +
// *m_blocks).
ATT_BWD_HD void query_blocks(int row_begin, int row_end, int block_m, int* m_first, int* m_blocks) {
  *m_first = imax(row_begin, 0) / block_m;
  *m_blocks = row_end > row_begin ? (row_end - 1) / block_m + 1 - *m_first : 0;
}

// The query blocks key block kb (of block_n keys) of a sequence walks: its CTA's steps a query head,
// the work a varlen batch's CTAs are ordered by (bwd_prepost.cuh, build_cta_order).
template <bool kCausal, bool kWindow>
ATT_BWD_HD int walk_blocks(int kb, int block_n, int block_m, int len_q, int len_k, const VariantParams& v) {
  int row_begin, row_end, m_first, m_blocks;
  key_block_rows<kCausal, kWindow>(kb * block_n, block_n, len_q, len_k - len_q, v, &row_begin, &row_end);
  query_blocks(row_begin, row_end, block_m, &m_first, &m_blocks);
  return m_blocks;
}

// Step i of a key block's CTA, over its q_per_kv query heads and m_blocks query blocks from m_first:
// the head within the group (*head) and the query block (*m_block). Normally upwards, heads outer
// (under a causal or windowed bound the CTAs of a KV head start on different query blocks, so their
// atomics spread). In the deterministic mode downwards, query blocks outer: the CTAs of lower key
// blocks, which add into a shared query block before this one, end their walks at the same or a
// lower query block (a key block's last row rises with its keys), so walking down each of them
// reaches the shared block (each head's) no later in its walk than this CTA does, and the turns pass
// down the CTAs as through a pipeline, about one hand-off per lower key block, once. Walking up, a
// causal key block would start at its diagonal, which key block 0 reaches only after walking every
// query block above it, and each CTA would wait about as long as the longest runs; with heads outer
// the same would happen at each head after the first (lower key blocks' walks are longer).
//
// Walk is the same walk as a cursor: step i = a * div + r, carried from one step to the next
// (walk_next) by loops that take every step in order, where walk_step divides i by a count known only
// at run time (flash_bwd_wgmma's consumer loop: ~50 instructions with a MUFU.RCP chain at the top of
// each step, ahead of its first MMA). walk_step is walk_at of the cursor it would reach, so the two
// cannot disagree.
struct Walk {
  int a, r;                                    // step a * div + r
  int div, deterministic, m_first, m_blocks;  // the walk's constants
};
ATT_BWD_HD Walk walk_begin(int deterministic, int q_per_kv, int m_first, int m_blocks) {
  return Walk{0, 0, deterministic ? q_per_kv : m_blocks, deterministic, m_first, m_blocks};
}
ATT_BWD_HD void walk_next(Walk& w) {
  if (++w.r == w.div) {
    w.r = 0;
    ++w.a;
  }
}
ATT_BWD_HD void walk_at(const Walk& w, int* head, int* m_block) {
  *head = w.deterministic ? w.r : w.a;
  *m_block = w.deterministic ? w.m_first + w.m_blocks - 1 - w.a : w.m_first + w.r;
}
// The cursor at step i of the walk w begins (a divide).
ATT_BWD_HD Walk walk_seek(Walk w, int i) {
  w.a = i / w.div;
  w.r = i % w.div;
  return w;
}
ATT_BWD_HD void walk_step(int i, int deterministic, int q_per_kv, int m_first, int m_blocks, int* head,
                          int* m_block) {
  walk_at(walk_seek(walk_begin(deterministic, q_per_kv, m_first, m_blocks), i), head, m_block);
}

// The first key block whose CTA walks the query block from row m0 (the deterministic mode's order:
// the CTAs that add into that block's dQ are the key blocks from first_key_block to some last one,
// every one between included, so that of key block n has n - first_key_block before it). Only a
// left window skips key blocks at the start. A causal bound or a right window starts a key block's
// rows at n0 - diag (- window_right), lower for every lower key block, so each reaches at least as
// far up and the first is 0. A left window ends them at n0 + block_n - diag + window_left, lower for
// lower key blocks, so key block n walks the query block only while that end is past m0: (n + 1) *
// block_n > m0 + diag - window_left. (Such a block's rows are never empty: they start no later than
// the caller's, below len_q, and end past m0 >= 0.)
template <bool kWindow>
ATT_BWD_HD int first_key_block(int m0, int block_n, int diag, int window_left) {
  if (!kWindow || window_left < 0) return 0;
  const int x = m0 + diag - window_left;
  return x > 0 ? x / block_n : 0;
}

}  // namespace att_bwd

#endif  // ATTNTUNE_BWD_BLOCKS_H
