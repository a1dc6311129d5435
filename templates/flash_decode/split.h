// ---- templates/flash_decode/split.h: how flash_decode shares a unit's keys out over CTAs and
// merges what they computed, stated once for both sides: the launch plan (launch.h: how many
// splits, the grid, the workspaces and their sizes, bind's pointers into them) and the kernels
// (kernel.cu: a CTA's split, row block and key tiles, where its piece goes, its unit's counter).
// Plain C++17 for the host (g++, nvcc's host pass, an export's flattened text); every function is
// __host__ __device__ under NVRTC (which takes no host-only function) and nvcc. No header.
//
// Work unit: (batch b, kv head, row block rb), its rows the kv head's query heads times seqlen_q,
// packed (args.h). Grid: (splits * row_blocks, heads_kv, batch); each of a unit's `splits` CTAs
// streams a share of the unit's key tiles (block_n keys each) and makes a partial (unnormalized
// O, max, sum) of every row. Partials are merged:
//   - one split: no merge; the CTA writes the output;
//   - combine kernel / last_cta: each split's partial is a piece in workspace 0, merged by the
//     combine kernel or by the unit's last CTA to arrive at its counter (workspace 1);
//   - combine clusterN: the splits come in clusters of N CTAs merged through distributed shared
//     memory; one cluster a unit writes the output, several each write their merge as a piece in
//     workspace 0, merged by the unit's last cluster (counters, as last_cta).
#ifndef ATTNTUNE_FLASH_DECODE_SPLIT_H
#define ATTNTUNE_FLASH_DECODE_SPLIT_H

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define ATT_SPLIT_FN __host__ __device__ __forceinline__
#else
#define ATT_SPLIT_FN inline
#endif

namespace att {

// The most splits of one unit the plan makes (the wave model's search bound).
constexpr int kDecodeMaxSplits = 128;

// The combine kernel (combine: kernel): kDecodeCombineThreads threads a CTA, one (row, 4 columns)
// item each, so decode_combine_rows(head_dim) rows a CTA (O's head dim: dv with split dims).
constexpr int kDecodeCombineThreads = 128;
ATT_SPLIT_FN constexpr int decode_combine_rows(int head_dim) { return kDecodeCombineThreads / (head_dim / 4); }

ATT_SPLIT_FN int split_min(int a, int b) { return a < b ? a : b; }
ATT_SPLIT_FN int split_max(int a, int b) { return a > b ? a : b; }

// ---- the grid ------------------------------------------------------------------------------------

// The (split, row block) of the CTA at grid x. Row-block-major (split = x / row_blocks: a split's
// row blocks, adjacent CTAs, read the same K/V together); clustered (combine clusterN) split-minor,
// so that each cluster's consecutive CTAs are splits of one unit: split = x % splits, with splits
// the grid's (grid_x / row_blocks; bind may ask the kernels for fewer, num_splits, and the CTAs of
// the others exit at once).
struct SplitCta {
  int split, rb;
};
template <bool kClustered>
ATT_SPLIT_FN SplitCta split_cta(unsigned x, unsigned grid_x, int row_blocks) {
  if (kClustered) {
    const int splits = static_cast<int>(grid_x) / row_blocks;
    const int split = x % splits;
    return SplitCta{split, static_cast<int>(x / splits)};
  }
  const int split = x / row_blocks;
  return SplitCta{split, static_cast<int>(x - split * row_blocks)};
}

// The splits a unit gets from the count the wave model wants (decode_splits, below): combine
// clusterN (cluster > 1) rounds it down to whole clusters, at least one.
ATT_SPLIT_FN int grid_splits(int want, int cluster) {
  if (cluster <= 1) return want;
  const int clusters = want / cluster > 1 ? want / cluster : 1;
  return clusters * cluster;
}

// The pieces merged through workspace 0: each split's partial, or with clusters each cluster's
// merge (1: none, the output is written directly). Split `split`'s partial, or its cluster's
// merge, is piece split_piece(split, cluster); its rank in its cluster split_rank(split, cluster).
ATT_SPLIT_FN int split_pieces(int splits, int cluster) { return splits / cluster; }
ATT_SPLIT_FN int split_piece(int split, int cluster) { return split / cluster; }
ATT_SPLIT_FN int split_rank(int split, int cluster) { return split % cluster; }

// ---- the keys ------------------------------------------------------------------------------------

// A unit of a sequence of len keys (its cache_seqlens entry, or seqlen_k) sees keys [first, len):
// rows are aligned bottom-right, so the last query's diagonal is key len - 1 and every right side
// (causal, a bounded window's, none) ends at len for it; a window reaching window_left keys left of
// each row's diagonal (window_left >= 0; -1: unbounded) starts at row 0's first key, len -
// seqlen_q - window_left, clamped to [0, len]. The rows' own bounds are masked per row.
ATT_SPLIT_FN int unit_first_key(int len, int seqlen_q, int window_left) {
  if (window_left < 0) return 0;
  const int first = len - seqlen_q - window_left;
  return split_min(len, split_max(0, first));
}

// The tiles of a unit's keys [first_key, len) (0 <= first_key <= len), tiles of block_n keys at
// multiples of block_n (so a paged box never crosses a page): [first, first + count).
struct UnitTiles {
  int first, count;
};
ATT_SPLIT_FN UnitTiles unit_tiles(int first_key, int len, int block_n) {
  const int first = first_key / block_n;
  return UnitTiles{first, (len + block_n - 1) / block_n - first};
}

// A split's share of its unit's tiles: tiles begin .. begin + n - 1 (n 0: none, its piece is
// empty: O 0, LSE -inf).
struct TileShare {
  int begin, n;
};
// In runs of ceil(count / splits) tiles from the first: plain builds, whose plan picks split counts
// that leave no split of the longest sequence empty (a shorter sequence leaves its last splits
// empty).
ATT_SPLIT_FN TileShare split_tiles(UnitTiles u, int splits, int split) {
  const int per = (u.count + splits - 1) / splits;
  const int begin = split * per;
  return TileShare{u.first + begin, split_max(0, split_min(u.count, begin + per) - begin)};
}
// As evenly as they go, the remainder one each to the first splits (the first holds the window's
// partial first tile): window builds, whose plan counts keys (decode_splits_keys), so a unit's
// tile count rarely divides by the split count.
ATT_SPLIT_FN TileShare split_tiles_even(UnitTiles u, int splits, int split) {
  const int base = u.count / splits, extra = u.count - base * splits;
  const int begin = split * base + (split < extra ? split : extra);
  return TileShare{u.first + begin, base + (split < extra ? 1 : 0)};
}

// The host's count of a unit's keys, for the split count (the plan reads no cache_seqlens): the most
// keys a unit of a sequence of at most seqlen_k keys sees: seqlen_k; with a window (window_left >=
// 0), no more than its rows' windows span, window_left + seqlen_q (len - unit_first_key).
ATT_SPLIT_FN long long unit_keys_max(long long seqlen_k, int seqlen_q, int window_left) {
  if (window_left < 0) return seqlen_k;
  const long long span = static_cast<long long>(window_left) + seqlen_q;
  return span < seqlen_k ? span : seqlen_k;
}

// The split count for `units` work units of `tiles` K/V tiles each (ceil(unit_keys_max / block_n)), on a device
// of sm_count SMs running ctas_per_sm CTAs each (slots = sm_count * ctas_per_sm): among the split
// counts s that leave no split empty (s = ceil(tiles / ceil(tiles / s))), up to min(tiles,
// kDecodeMaxSplits), the one that minimizes ceil(units * s / slots) * (ceil(tiles / s) + cost) +
// (s > 1 ? cost : 0), the smallest on a tie: a CTA costs its tiles plus a fixed `cost` in tiles
// (prologue, epilogue, partial writes), the last wave costs as much as a full one, and splitting
// at all costs the merge. (Forcing at least one or more full waves of CTAs measured slower:
// README.md.)
constexpr int kDecodeSplitCost = 1;

ATT_SPLIT_FN int decode_splits(long long units, long long tiles, int sm_count, int ctas_per_sm,
                               int cost = kDecodeSplitCost) {
  if (units <= 0 || tiles <= 1) return 1;
  const long long slots = static_cast<long long>(sm_count > 0 ? sm_count : 1) * (ctas_per_sm > 0 ? ctas_per_sm : 1);
  const long long most = tiles < kDecodeMaxSplits ? tiles : kDecodeMaxSplits;
  long long best_s = 1, best = -1;
  for (long long s = 1; s <= most; ++s) {
    const long long per = (tiles + s - 1) / s, used = (tiles + per - 1) / per;
    if (used != s) continue;  // the same as `used` splits
    const long long t = (units * s + slots - 1) / slots * (per + cost) + (s > 1 ? cost : 0);
    if (best < 0 || t < best) {
      best = t;
      best_s = s;
    }
  }
  return static_cast<int>(best_s);
}

// Window builds: the same wave model over the unit's keys (unit_keys_max) rather than its tiles,
// for split_tiles_even's shares: a split's cost is ceil(keys / s) keys plus `cost` tiles of
// block_n keys, for s up to ceil(keys / block_n) (and kDecodeMaxSplits). A window's keys rarely
// fill whole tiles (Mistral's 4096 keys left of the diagonal are 4097 keys, 65 tiles of 64 at
// most): counted in tiles, the split count fell from 16 to 13 CTAs a unit of 5 tiles each against
// 4 of 4096 keys; counted in keys it stays 16, the first split taking the window's partial first
// tile beside 4 whole ones.
ATT_SPLIT_FN int decode_splits_keys(long long units, long long keys, int block_n, int sm_count, int ctas_per_sm,
                                    int cost = kDecodeSplitCost) {
  const long long tiles = (keys + block_n - 1) / block_n;
  if (units <= 0 || tiles <= 1) return 1;
  const long long slots = static_cast<long long>(sm_count > 0 ? sm_count : 1) * (ctas_per_sm > 0 ? ctas_per_sm : 1);
  const long long most = tiles < kDecodeMaxSplits ? tiles : kDecodeMaxSplits;
  const long long fixed = static_cast<long long>(cost) * block_n;
  long long best_s = 1, best = -1;
  for (long long s = 1; s <= most; ++s) {
    const long long t = (units * s + slots - 1) / slots * ((keys + s - 1) / s + fixed) + (s > 1 ? fixed : 0);
    if (best < 0 || t < best) {
      best = t;
      best_s = s;
    }
  }
  return static_cast<int>(best_s);
}

// ---- the workspace -------------------------------------------------------------------------------

// Workspace 0 (pieces > 1), in floats: every piece's normalized partial O of every global row R (=
// lse's index, args.h), [pieces][rows_total][head_dim], then their natural-log LSE (-inf: the piece
// saw no key), [pieces][rows_total]. part_o points at its start, part_lse at piece_lse_start.
// head_dim here is O's: V's head dim (dv) where a build has one of its own.
ATT_SPLIT_FN long long piece_o(int piece, long long row, long long rows_total, int head_dim) {
  return (static_cast<long long>(piece) * rows_total + row) * head_dim;
}
ATT_SPLIT_FN long long piece_lse(int piece, long long row, long long rows_total) {
  return static_cast<long long>(piece) * rows_total + row;
}
ATT_SPLIT_FN long long piece_lse_start(int pieces, long long rows_total, int head_dim) {
  return static_cast<long long>(pieces) * rows_total * head_dim;
}
ATT_SPLIT_FN unsigned long long pieces_bytes(int pieces, long long rows_total, int head_dim) {
  return static_cast<unsigned long long>(pieces) * rows_total * (head_dim + 1) * 4;
}

// Workspace 1 (the merge by the unit's last CTA or cluster): an int counter per unit, zero before
// and after every launch (the last to arrive resets it).
ATT_SPLIT_FN long long unit_counter(int b, int kvh, int rb, int heads_kv, int row_blocks) {
  return static_cast<long long>((b * heads_kv + kvh) * row_blocks) + rb;
}
ATT_SPLIT_FN unsigned long long counters_bytes(long long units) { return static_cast<unsigned long long>(units) * 4; }

}  // namespace att

#endif  // ATTNTUNE_FLASH_DECODE_SPLIT_H
