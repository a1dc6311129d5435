// ---- templates/flash_fwd_mma/tiles.h: the tiles of flash_fwd_mma as the launch plan (launch.h,
// host) and the kernel (kernel.cu, device) both see them, written once: how many query blocks a
// sequence has (the grid's x), which query block CTA x computes (causal: heaviest first), a
// sequence's bounds in a packed batch (varlen) or a KV cache, and the keys a query block visits
// (its K/V tiles). Plain C++ with no CUDA header and no Traits (every size is an argument), so
// that g++ (the tuner and its tests), nvcc (exports, harnesses) and NVRTC (the kernel) compile
// the same code; the kernel passes its Traits' constants, which fold.
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

}  // namespace mma_tiles

}  // namespace att

#endif  // ATTNTUNE_FLASH_FWD_MMA_TILES_H
