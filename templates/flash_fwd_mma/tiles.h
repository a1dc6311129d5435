// ---- templates/flash_fwd_mma/tiles.h: the tiles of flash_fwd_mma as the launch plan (launch.h,
// host) and the kernel (kernel.cu, device) both see them, written once: how many query blocks a
// sequence has (the grid's x), which query block CTA x computes (causal: heaviest first), a
// sequence's bounds in a packed batch (varlen) or a KV cache, the keys a query block visits (its
// K/V tiles), and the shared-memory tiles' swizzle and the cp.async passes that fill them. Plain
// C++ with no CUDA header and no Traits (every size is an argument), so that g++ (the tuner and
// its tests), nvcc (exports, harnesses) and NVRTC (the kernel) compile the same code; the kernel
// passes its Traits' constants, which fold.
#ifndef ATTNTUNE_FLASH_FWD_MMA_TILES_H
#define ATTNTUNE_FLASH_FWD_MMA_TILES_H

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define ATT_MMA_TILES_FN __host__ __device__ __forceinline__
#else
#define ATT_MMA_TILES_FN inline
#endif

namespace att {

namespace mma_tiles {

// min and max of two ints: the device's (one IMNMX) in kernel code, the same on the host.
ATT_MMA_TILES_FN int imin(int a, int b) {
#ifdef __CUDA_ARCH__
  return min(a, b);
#else
  return a < b ? a : b;
#endif
}
ATT_MMA_TILES_FN int imax(int a, int b) {
#ifdef __CUDA_ARCH__
  return max(a, b);
#else
  return a > b ? a : b;
#endif
}

// ---- query blocks ------------------------------------------------------------------------------
// One CTA computes block_m query rows of one (batch, head): a sequence of len_q rows has
// ceil(len_q / block_m) query blocks. The grid's x is the dense call's seqlen_q, or a packed
// batch's longest sequence (max_seqlen_q): a shorter sequence's CTAs past its blocks return.
template <class I>
ATT_MMA_TILES_FN constexpr I query_blocks(I len_q, int block_m) {
  return (len_q + block_m - 1) / block_m;
}

// The query block CTA x of a sequence's `blocks` computes: causal blocks with more rows see more
// keys, so the heaviest (the last) runs first and the grid's tail is short.
template <bool kCausal>
ATT_MMA_TILES_FN int query_block(int x, int blocks) {
  return kCausal ? blocks - 1 - x : x;
}

// ---- sequences ---------------------------------------------------------------------------------
// Sequence b of a packed batch (the varlen entry point): its rows [q0, q0 + len_q) of q/o and
// [k0, k0 + len_k) of k/v, from the [batch + 1] prefix sums.
struct PackedSequence {
  int q0, k0, len_q, len_k;
};
ATT_MMA_TILES_FN PackedSequence packed_sequence(const int* cu_seqlens_q, const int* cu_seqlens_k, int b) {
  PackedSequence s;
  s.q0 = cu_seqlens_q[b];
  s.k0 = cu_seqlens_k[b];
  s.len_q = cu_seqlens_q[b + 1] - s.q0;
  s.len_k = cu_seqlens_k[b + 1] - s.k0;
  return s;
}

// The keys of a sequence of a KV cache (the kvcache entry point): its cache_seqlens entry,
// clamped to 0..seqlen_k_max (the cache's rows), so that no load leaves the cache.
ATT_MMA_TILES_FN int cache_keys(int seqlen_k_max, int cache_seqlen) { return imax(0, imin(seqlen_k_max, cache_seqlen)); }

// ---- the keys a query block visits -------------------------------------------------------------
// Query row r of a sequence is aligned bottom-right: its diagonal key is r + diag, diag = len_k -
// len_q. It sees keys j with r + diag - left <= j <= r + diag + right within [0, len_k): causal is
// right = 0; a window build (kWindow) reads its sides (-1: unbounded) at run time; without one
// both are unbounded but for causal. Rows [row0, row_end) of a query block (row0 = m0, row_end =
// m0 + block_m) see keys [begin, end) at most: from the first row's left bound to the last row's
// right one. The block's K/V loop runs over the tiles of block_n keys that hold them and loads no
// other, so a window's time follows the window, not the keys. (The last block's rows past len_q
// count too: their outputs are not stored.)
struct KeyRange {
  int begin, end;  // keys [begin, end); empty when end <= begin
};
template <bool kCausal, bool kWindow = false>
ATT_MMA_TILES_FN KeyRange block_keys(int row0, int row_end, int len_k, int diag, int left = -1, int right = -1) {
  KeyRange r;
  r.begin = 0;
  r.end = kCausal ? imin(len_k, row_end + diag) : len_k;
  if (kWindow) {
    if (left >= 0) r.begin = imin(len_k, imax(0, row0 + diag - left));
    if (!kCausal && right >= 0) r.end = imin(len_k, imax(0, row_end + diag + right));
  }
  return r;
}

// Per key, as the mask tests it (window builds): row r sees key j < len_k when lo <= j - r <= hi,
// the key's offset from the row's position; lo = diag - left (no bound: a value no offset
// reaches), hi = diag + right (causal: diag; no bound likewise). Two per-thread constants, so the
// mask of a tile needs no bound per row.
struct Offsets {
  int lo, hi;
};
constexpr int kNoOffsetBound = 1 << 30;  // beyond any key offset (2^30 keys of K alone: 128 GiB at d=64)
template <bool kCausal>
ATT_MMA_TILES_FN Offsets visible_offsets(int diag, int left, int right) {
  Offsets o;
  o.lo = left >= 0 ? diag - left : -kNoOffsetBound;
  o.hi = kCausal ? diag : right >= 0 ? diag + right : kNoOffsetBound;
  return o;
}

// The keys every row of [row0, row_end) sees (window builds): a tile of keys [n0, n0 + n) with
// n0 >= begin and n0 + n <= end needs no mask for these rows; one that crosses a bound (the last
// row's left bound, the first row's right bound or diagonal, len_k) is masked per key. Rows of a
// warp, so that a warp whose rows all see a tile pays nothing for the rows of other warps.
template <bool kCausal, bool kWindow>
ATT_MMA_TILES_FN KeyRange unmasked_keys(int row0, int row_end, int len_k, int diag, int left, int right) {
  KeyRange r;
  r.begin = kWindow && left >= 0 ? row_end - 1 + diag - left : 0;
  r.end = kCausal                   ? imin(len_k, row0 + diag + 1)
          : kWindow && right >= 0 ? imin(len_k, row0 + diag + right + 1)
                                  : len_k;
  return r;
}

// The K/V tiles of block_n keys that hold a key range: tiles [first_tile, first_tile + tiles).
// Tiles start at multiples of block_n, so a range's first and last tiles may hold keys outside it
// (masked, as keys past len_k are).
ATT_MMA_TILES_FN int first_tile(const KeyRange& r, int block_n) { return r.begin / block_n; }
ATT_MMA_TILES_FN int tile_count(const KeyRange& r, int block_n) {
  return r.end > r.begin ? (r.end + block_n - 1) / block_n - r.begin / block_n : 0;
}

// ---- shared-memory tiles -----------------------------------------------------------------------
// Q, K and V tiles are row-major (rows, head_dim) of 16-bit values in 16-byte chunks (head_dim / 8
// a row), each chunk index XORed within a span of swizzle_chunks chunks by a pattern of period 8
// rows, so that the 8 rows an ldmatrix phase reads (one chunk column of 8 consecutive rows) and the
// 8 chunks a quarter-warp's cp.async copies write fall in 8 different 16-byte bank groups:
//  - 8-chunk (128-byte) spans, rows of a multiple of 128 bytes (d = 64, 128, 192, 256):
//    chunk ^ (row % 8);
//  - 4-chunk (64-byte) spans, rows of 64 bytes mod 128 (d = 32, 96, 160, 224):
//    chunk ^ ((row / 2) % 4): rows r and r + 1 are 64 bytes apart mod 128;
//  - 2-chunk (32-byte) spans, rows of 32 or 96 bytes mod 128 (d = 48, 80, 112, 144, ...):
//    chunk ^ ((row / 4) % 2): rows r..r + 3 are 4 different multiples of 32 bytes mod 128.
// (TMA's SWIZZLE_128B, 64B and 32B patterns.)
ATT_MMA_TILES_FN constexpr int swizzle_chunks(int head_dim) {
  return (head_dim / 8) % 8 == 0 ? 8 : (head_dim / 8) % 4 == 0 ? 4 : 2;
}
// The element offset of chunk `chunk` of row `row` in a tile.
template <int kHeadDim>
ATT_MMA_TILES_FN int swizzled(int row, int chunk) {
  constexpr int kW = swizzle_chunks(kHeadDim);
  return row * kHeadDim + ((chunk ^ (kW == 8 ? (row & 7) : kW == 4 ? ((row >> 1) & 3) : ((row >> 2) & 1))) << 3);
}
// ldmatrix addresses (kernel.cu): a 16-row x 16-dim fragment at tile row `row` (a multiple of 16)
// and head-dim step `step` (16 dims: chunks 2 * step and 2 * step + 1) starts, for a lane, at its
// step-0 address of row 0 (a tile at a multiple of 128 bytes, the lane's row < 16, its chunk half
// 0 or 1) XOR frag_xor(step), plus the immediate frag_offset(row, step): the swizzle XORs only
// the chunk bits within a span (swizzle_chunks chunks, swizzle_chunks / 2 steps) with a function
// of row % 8, so within a span step s is step 0's offset XOR (s % span steps) * 32, and rows and
// spans start at multiples of the span's bytes, which the XOR does not touch. One LOP3 per step
// 1..3 of a 128-byte span, per step 1 of a 64-byte span, none with 32-byte spans.
ATT_MMA_TILES_FN constexpr int frag_offset(int head_dim, int row, int step) {
  return row * head_dim * 2 + (step / (swizzle_chunks(head_dim) / 2)) * swizzle_chunks(head_dim) * 16;
}
ATT_MMA_TILES_FN constexpr int frag_xor(int head_dim, int step) { return (step % (swizzle_chunks(head_dim) / 2)) * 32; }

// The chunks of a row that one thread row of a cp.async pass covers (a panel): a whole row where
// the threads divide it (d = 32, 64, 128, 256), else one swizzle span (d = 96: 3 panels of 4
// chunks; 80: 5 of 2; 192: 3 of 8).
ATT_MMA_TILES_FN constexpr int copy_chunks(int head_dim, int threads) {
  return threads % (head_dim / 8) == 0 ? head_dim / 8 : swizzle_chunks(head_dim);
}

// How the cp.async passes of the kernel's loaders cover a tile of kRows rows with kThreads
// threads: the threads form kThreadRows rows of kChunks chunks (copy_chunks), and a pass covers
// kRowsPerIter rows of kPanelsPerIter panels (more than one only when the tile has fewer rows than
// the threads form: d = 32 at 8 warps and block_n 32, d = 80 at block_n 32, ...). Pass f is row
// pass it = f / kPanelIters, panel pass pi = f % kPanelIters: rows + it * kRowsPerIter, panels +
// pi * kPanelsPerIter; the last panel pass leaves out the threads past the row's panels where the
// panels do not divide among them (kPanelTail). A panel offset does not touch the chunk bits the
// swizzle XORs, whose pattern has a period of 8 rows, so each pass's smem offset from the thread's
// first chunk is an immediate (off(f)): row % 8 is the same in every pass when kRowsPerIter % 8 ==
// 0 and alternates between two values at 4 (a second base, odd(f)). With one panel a pass (every
// d % 64 == 0 and d = 32 but for its short tiles) this is the loaders' form before other head
// dims: thread t copies chunk t % chunks_per_row of rows t / chunks_per_row + it * kRowsPerIter.
template <int kHeadDim, int kThreads, int kRows>
struct CopyGeometry {
  static constexpr int kChunksPerRow = kHeadDim / 8;
  static constexpr int kChunks = copy_chunks(kHeadDim, kThreads);
  static constexpr int kPanels = kChunksPerRow / kChunks;
  static constexpr int kThreadRows = kThreads / kChunks;
  static constexpr int kRowsPerIter = kThreadRows < kRows ? kThreadRows : kRows;
  static constexpr int kPanelsPerIter = kThreadRows / kRowsPerIter;
  static constexpr int kRowIters = kRows / kRowsPerIter;
  static constexpr int kPanelIters = (kPanels + kPanelsPerIter - 1) / kPanelsPerIter;
  static constexpr int kPasses = kRowIters * kPanelIters;
  static constexpr bool kPanelTail = kPanels % kPanelsPerIter != 0;
  static constexpr int kPanelElems = kPanelsPerIter * kChunks * 8;  // elements a panel pass moves on
  static_assert(kChunksPerRow % kChunks == 0 && kChunks % swizzle_chunks(kHeadDim) == 0,
                "a panel must be whole swizzle spans of a row");
  static_assert(kThreads % kChunks == 0 && kThreadRows % kRowsPerIter == 0 && kRows % kRowsPerIter == 0 &&
                    kRowsPerIter % 4 == 0,
                "each cp.async pass must cover whole rows of whole panels, and rows % 8 in at most two patterns");

  ATT_MMA_TILES_FN static constexpr int row_pass(int f) { return f / kPanelIters; }
  ATT_MMA_TILES_FN static constexpr int panel_pass(int f) { return f % kPanelIters; }
  // Pass f writes from the thread's second base (row r + kRowsPerIter), not its first.
  ATT_MMA_TILES_FN static constexpr bool odd(int f) { return kRowsPerIter % 8 != 0 && (row_pass(f) & 1); }
  // Pass f's smem byte offset from that base.
  ATT_MMA_TILES_FN static constexpr int off(int f) {
    return (kRowsPerIter % 8 == 0 ? row_pass(f) * kRowsPerIter : (row_pass(f) >> 1) * 2 * kRowsPerIter) * kHeadDim *
               2 +
           panel_pass(f) * kPanelElems * 2;
  }
  // Every thread copies in pass f (else only those whose `tail` holds).
  ATT_MMA_TILES_FN static constexpr bool all_copy(int f) { return !kPanelTail || panel_pass(f) != kPanelIters - 1; }

  // Thread t's first row and chunk, and whether it copies in the last panel pass (unsigned, as
  // threadIdx.x: a signed division by a power of 2 costs a sign fix-up). Three functions of t, so
  // that the single-panel form compiles exactly as the loaders did before other head dims.
  ATT_MMA_TILES_FN static int thread_row(unsigned t) {
    if constexpr (kPanelsPerIter == 1) return static_cast<int>(t / kChunks);
    else return static_cast<int>(t / kChunks % kRowsPerIter);
  }
  ATT_MMA_TILES_FN static int thread_chunk(unsigned t) {
    if constexpr (kPanelsPerIter == 1) return static_cast<int>(t % kChunks);
    else return static_cast<int>(t / kChunks / kRowsPerIter * kChunks + t % kChunks);
  }
  ATT_MMA_TILES_FN static bool thread_tail(unsigned t) {
    if constexpr (!kPanelTail) return true;
    else return static_cast<int>(t / kChunks / kRowsPerIter) + (kPanelIters - 1) * kPanelsPerIter < kPanels;
  }
};

}  // namespace mma_tiles

}  // namespace att

#endif  // ATTNTUNE_FLASH_FWD_MMA_TILES_H
