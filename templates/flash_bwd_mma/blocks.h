// ---- templates/flash_bwd_mma/blocks.h: which query blocks a key block's CTA walks. Plain C++
// shared by the main kernel (NVRTC, nvcc) and the host's unit tests, so that what a test derives
// from the kernel's bounds is derived from the kernel's own code, not a copy of it.
#ifndef ATTNTUNE_FLASH_BWD_MMA_BLOCKS_H
#define ATTNTUNE_FLASH_BWD_MMA_BLOCKS_H

#include "../common/variant_params.h"

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

}  // namespace att_bwd

#endif  // ATTNTUNE_FLASH_BWD_MMA_BLOCKS_H
