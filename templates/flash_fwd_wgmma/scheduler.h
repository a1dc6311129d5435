// ---- templates/flash_fwd_wgmma/scheduler.h: the work tiles of flash_fwd_wgmma, as the launch plan
// (launch.h, host) and the kernel (work_tiles.cuh, device) both see them, written once (as
// FlashAttention-3's tile_scheduler.hpp holds get_grid_shape and get_next_work): how many query
// blocks and work tiles a call has, which (query block, head, batch) work tile t is, how many
// K/V tiles it visits, the persistent grid, the stream-K split of the last round and its
// workspace. Plain C++ with no CUDA header and no Traits (every size is an argument), so that g++
// (the tuner), nvcc (exports, harnesses) and NVRTC (the kernel) compile the same code (every
// function host and device: NVRTC takes no host-only one); the kernel passes its Traits' constants,
// which fold.
#ifndef ATTNTUNE_FLASH_FWD_WGMMA_SCHEDULER_H
#define ATTNTUNE_FLASH_FWD_WGMMA_SCHEDULER_H

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define ATT_SCHED_FN __host__ __device__ __forceinline__
#else
#define ATT_SCHED_FN inline
#endif

namespace att {

namespace sched {

// min and max of two ints: the device's min() and max() (one IMNMX) in kernel code, the same on the
// host.
ATT_SCHED_FN int imin(int a, int b) {
#ifdef __CUDA_ARCH__
  return min(a, b);
#else
  return a < b ? a : b;
#endif
}
ATT_SCHED_FN int imax(int a, int b) {
#ifdef __CUDA_ARCH__
  return max(a, b);
#else
  return a < b ? b : a;
#endif
}

// ---- query blocks and work tiles ----------------------------------------------------------------
// The query blocks of `seqlen_q` rows: ceil(seqlen_q / block_m), padded to whole clusters of
// `cluster` CTAs (kv_multicast pairs CTAs 2k and 2k+1 on one head; the padding block idles).
// A work tile is (query block, head, batch): blocks * heads_q * batch of them for a dense call.
template <class I>
ATT_SCHED_FN constexpr I query_blocks(I seqlen_q, int block_m, int cluster) {
  return (seqlen_q + block_m * cluster - 1) / (block_m * cluster) * cluster;
}

// Work tile t of a grid of m_blocks query blocks over `pairs` (batch, head) pairs (or the heads of
// one varlen sequence): its query block and pair. M blocks fastest, so that CTAs running together
// share K/V in L2. Causal: the pairs in groups of head_group, and inside a group the longest m
// blocks of all its pairs first, so that the short tiles of one group fill the SMs the long ones of
// the next leave free (per pair alone, each pair's long tiles start behind the previous pair's
// short ones and the grid ends unevenly); a small group keeps the K/V that CTAs running together
// read within a few heads.
struct TileCoord {
  int m_block, pair;
};
template <bool kCausal>
ATT_SCHED_FN TileCoord tile_coord(int t, int m_blocks, int pairs, int head_group) {
  TileCoord c;
  if (kCausal) {
    const int g0 = t / (head_group * m_blocks) * head_group;  // the group's first pair
    const int group = imin(head_group, pairs - g0);
    const int r = t - g0 * m_blocks;  // tile inside the group
    c.m_block = m_blocks - 1 - r / group;
    c.pair = g0 + r % group;
  } else {
    c.pair = t / m_blocks;
    c.m_block = t % m_blocks;
  }
  return c;
}

// GQA packing (pack_gqa): a work tile of a packed build holds pack_rows(block_m, group) query rows of
// every query head of one KV head (group = heads_q / heads_kv of them), packed row r being query row
// r / group of the group's head r % group: one TMA box of (group heads, pack_rows rows) fills the
// tile's first group * pack_rows <= block_m rows (the rest idle when group does not divide block_m).
// Its work tiles are then (query blocks of pack_rows rows, heads_kv, batch): few query rows a head
// (chunked prefill, speculative decoding) fill a tile, and a tile's diagonal spans fewer keys.
// 0 (refused by the launch plan): a group larger than block_m.
ATT_SCHED_FN constexpr int pack_rows(int block_m, int group) { return group > 0 ? block_m / group : 0; }

// The K/V tiles a work tile visits: [0, kv_tiles(kv_end)) where kv_end is the first key no row of
// it sees: every key, or causal (bottom-right aligned: row r's diagonal key is r + diag, diag =
// len_k - len_q) the last row's diagonal + 1.
template <bool kCausal>
ATT_SCHED_FN int kv_end(int m_block, int block_m, int len_k, int diag) {
  return kCausal ? imin(len_k, (m_block + 1) * block_m + diag) : len_k;
}
ATT_SCHED_FN int kv_tiles(int kv_end, int block_n) { return kv_end > 0 ? (kv_end + block_n - 1) / block_n : 0; }

// A sliding window (a build with ATT_WINDOW; templates/common/variants.cuh has a row's keys): rows
// [row_begin, row_end) of a sequence see keys [begin, end), the union of their windows: from the
// first row's row + diag - left (left >= 0; else key 0) to the last row's row + diag + right + 1
// (causal: right 0; right -1: every key), clamped to the sequence's keys. The K/V tiles [first,
// first + n) hold them (n 0: no row sees a key); a work tile visits only these, from the last to
// the first, so time follows the window, not the keys.
struct KeyRange {
  int begin, end;
};
struct KvTiles {
  int first, n;
};
template <bool kCausal>
ATT_SCHED_FN KeyRange window_keys(int row_begin, int row_end, int len_k, int diag, int left, int right) {
  KeyRange k;
  k.begin = left >= 0 ? imin(len_k, imax(0, row_begin + diag - left)) : 0;
  k.end = kCausal ? imin(len_k, row_end + diag) : right >= 0 ? imin(len_k, row_end + diag + right) : len_k;
  return k;
}
ATT_SCHED_FN KvTiles window_tiles(KeyRange k, int block_n) {
  KvTiles t;
  t.first = k.begin / block_n;
  t.n = k.end > k.begin ? (k.end + block_n - 1) / block_n - t.first : 0;
  return t;
}

// ---- packed batches (varlen) -------------------------------------------------------------------
// The tiles of the packed sequences without the longest one's grid for every sequence (whose
// blocks past a short sequence's end, empty CTAs, cost 1.4% at issue 25's batch: run 105).
// Sequence b's tiles sit at indices heads_q * varlen_block_start(cu_seqlens_q[b], b) onwards,
// ceil(len_b / block_m) * heads_q of them: the starts increase and a sequence's tiles fit before
// the next one's (at most heads_q indices between two sequences are empty), so tile t's sequence is
// found by a binary search over cu_seqlens_q, and the index space is
// varlen_block_start(total_q, batch) * heads_q tiles.
template <class I>
ATT_SCHED_FN I varlen_block_start(I cu_seqlens_q_b, int b, int block_m) {
  return cu_seqlens_q_b / block_m + b;
}
ATT_SCHED_FN long long varlen_index_tiles(long long total_q, int batch, int heads_q, int block_m) {
  return varlen_block_start(total_q, batch, block_m) * static_cast<long long>(heads_q);
}

// ---- persistent grids --------------------------------------------------------------------------
// The CTAs of a persistent grid over `tiles` work tiles (a multiple of `cluster`): one per tile, at
// most one per SM in whole clusters (sm_count rounded down to a multiple of cluster), and at most
// max_clusters clusters (how many fit on the device at once; 0: unknown, the SMs alone bound it).
// A multiple of `cluster`, never 0 for tiles > 0. Non-causal grids walk their tiles in turn
// (c, c + CTAs, ...); causal and varlen ones with a producer take them from a counter
// (TmaMaps::tile_count) after their first.
ATT_SCHED_FN unsigned persistent_ctas(unsigned long long tiles, unsigned sm_count, unsigned max_clusters, unsigned cluster) {
  unsigned long long cap = sm_count / cluster * cluster;
  if (max_clusters > 0 && static_cast<unsigned long long>(max_clusters) * cluster < cap)
    cap = static_cast<unsigned long long>(max_clusters) * cluster;
  if (cap < cluster) cap = cluster;  // a device of fewer SMs than a cluster still gets one
  return static_cast<unsigned>(tiles < cap ? tiles : cap);
}

// ---- the stream-K tail (split_tail) ------------------------------------------------------------
// A non-causal persistent grid's last partial round: its `tail` tiles (the last of the tile order)
// are shared out by K/V iterations, an equal share per cluster of CTAs (a CTA without
// kv_multicast). The tail's clusters of tiles (tail tiles cluster * v .. + cluster - 1) are shared
// out among the grid's clusters, and the CTAs of one cluster take the same iterations of their own
// tile of it, so that they load the same K/V. Each work tile has `iterations` K/V iterations (every
// tile of a non-causal grid the same).

// The K/V iterations of a tail tile: every K/V tile of the keys (the launcher splits only with keys).
template <class I>
ATT_SCHED_FN I split_iterations(I seqlen_k, int block_n) {
  return (seqlen_k + block_n - 1) / block_n;
}

// How many tail tiles to split (0: none). Split only when the tail gives every CTA at least two
// iterations and the kernel's 32-bit share arithmetic cannot overflow (tail * iterations * ctas
// and tiles + 2 * ctas below 2^31).
ATT_SCHED_FN unsigned split_tail_tiles(unsigned long long tiles, unsigned ctas, unsigned long long iterations) {
  if (ctas == 0 || tiles <= ctas) return 0;
  const unsigned long long tail = tiles % ctas;
  if (tail == 0 || tail * iterations < 2ull * ctas || tail * iterations * ctas >= (1ull << 31) ||
      tiles + 2ull * ctas >= (1ull << 31))
    return 0;
  return static_cast<unsigned>(tail);
}

// Cluster g of G's share of the tail's `total` = tail / cluster * iterations iterations:
// [tail_begin(g), tail_begin(g + 1)). The owner of iteration x is the largest g with
// tail_begin(g) <= x.
ATT_SCHED_FN int tail_begin(int total, int g, int G) { return total * g / G; }
ATT_SCHED_FN int tail_owner(int x, int total, int G) { return ((x + 1) * G - 1) / total; }

// A share is shorter than a tile, so it meets at most two tail tiles: piece k = 0, 1 of the share
// [b, e) of a CTA of cluster rank `rank`: tail tile u (-1: none) and its iterations [lo, hi).
struct SplitPiece {
  int u, lo, hi;
};
ATT_SCHED_FN SplitPiece split_piece(int k, int b, int e, int n, int rank, int cluster) {
  const int x = k == 0 ? b : (b / n + 1) * n;
  const int v = x < e ? x / n : -1;
  SplitPiece s;
  s.u = v < 0 ? -1 : v * cluster + rank;
  s.lo = x - v * n;
  s.hi = imin(e - v * n, n);
  return s;
}
// Piece k of CTA c keeps its partial result in workspace slot split_slot(c, k); the piece of
// cluster g that meets tail cluster v is its first when g's share starts in v, else its second.
ATT_SCHED_FN int split_slot(int cta, int k) { return 2 * cta + k; }

// ---- the causal split (split_tail on a causal grid, whose tiles come from the counter) -----------
// A causal persistent grid hands its tiles out longest first; when they are few and alike (a
// chunked prefill: a chunk of queries over a longer cache), the last of them start late on a
// round where most SMs are idle (u-q28-chunk: 344 tiles of 52-61 K/V iterations on 132 SMs end in
// a third round 80 tiles wide, 13% of the SMs' time idle). Then the last s1 + s2 tiles are handed
// out as pieces instead: each of the first s1 as p1 pieces of its K/V iterations, each of the last
// s2 as p2 (finer: they start last), so that the counter's units grow finer towards the end and the
// SMs end together. A work unit u < tiles - s1 - s2 is the tile itself; the pieces follow, tile by
// tile. Pieces are combined as the stream-K tail's are (a slot a piece, a counter a split tile).
struct CausalSplit {
  int s1, p1, s2, p2;  // s1 + s2 == 0: no split
};
ATT_SCHED_FN int causal_split_units(int tiles, CausalSplit c) { return tiles - c.s1 - c.s2 + c.s1 * c.p1 + c.s2 * c.p2; }
ATT_SCHED_FN int causal_split_slots(CausalSplit c) { return c.s1 * c.p1 + c.s2 * c.p2; }
// Unit u (>= tiles - s1 - s2) as a piece: its split tile (0 .. s1 + s2 - 1; work tile plain + it),
// its piece and the split tile's pieces, and the tile's first slot (its pieces' slots follow).
struct UnitPiece {
  int split, piece, pieces, first_slot;
};
ATT_SCHED_FN UnitPiece causal_unit_piece(int u, int tiles, CausalSplit c) {
  const int k = u - (tiles - c.s1 - c.s2);
  UnitPiece r;
  if (k < c.s1 * c.p1) {
    r.split = k / c.p1;
    r.piece = k - r.split * c.p1;
    r.pieces = c.p1;
    r.first_slot = r.split * c.p1;
  } else {
    const int f = (k - c.s1 * c.p1) / c.p2;
    r.split = c.s1 + f;
    r.piece = k - c.s1 * c.p1 - f * c.p2;
    r.pieces = c.p2;
    r.first_slot = c.s1 * c.p1 + f * c.p2;
  }
  return r;
}
// A split tile's first slot and pieces from its index alone (the combine's).
ATT_SCHED_FN UnitPiece causal_split_tile(int split, CausalSplit c) {
  UnitPiece r;
  r.split = split;
  r.piece = 0;
  r.pieces = split < c.s1 ? c.p1 : c.p2;
  r.first_slot = split < c.s1 ? split * c.p1 : c.s1 * c.p1 + (split - c.s1) * c.p2;
  return r;
}
// Piece j of `pieces` of a tile of n K/V iterations: [piece_begin(j), piece_begin(j + 1)) (empty
// when n < pieces; the piece still arrives, with no keys).
ATT_SCHED_FN int piece_begin(int n, int j, int pieces) {
  return static_cast<int>(static_cast<long long>(n) * j / pieces);
}

// The split's workspace: per slot (2 per CTA) and consumer warp, split_values(head_dim) rows of 32
// lanes of floats: a warp's partial O (head_dim / 2 a lane), then m and l of the lane's two rows.
// And one counter per tail tile and consumer warp (zeroed; the warp that combines resets it).
ATT_SCHED_FN constexpr int split_values(int head_dim) { return head_dim / 2 + 4; }
ATT_SCHED_FN constexpr int split_value_m(int head_dim, int h) { return head_dim / 2 + h; }
ATT_SCHED_FN constexpr int split_value_l(int head_dim, int h) { return head_dim / 2 + 2 + h; }
ATT_SCHED_FN unsigned long long split_workspace_bytes(unsigned ctas, unsigned consumer_warps, unsigned head_dim) {
  return 2ull * ctas * consumer_warps * static_cast<unsigned>(split_values(static_cast<int>(head_dim))) * 32 *
         sizeof(float);
}
ATT_SCHED_FN unsigned long long split_counter_bytes(unsigned tail, unsigned consumer_warps) {
  return 1ull * tail * consumer_warps * sizeof(int);
}

}  // namespace sched

}  // namespace att

#endif  // ATTNTUNE_FLASH_FWD_WGMMA_SCHEDULER_H
