// flash_fwd_wgmma's scheduler (templates/flash_fwd_wgmma/scheduler.h), the one statement of its work
// tiles that the launch plan and the kernel both include: checked here on the host, as the kernel
// runs it (the kernel passes its Traits' constants to the same functions).
#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "templates/flash_fwd_wgmma/scheduler.h"

namespace test_flash_fwd_wgmma_scheduler {
namespace sched = att::sched;

// Every (query block, pair) is one work tile; causal tiles go longest first inside each head group
// (query blocks descending), each group's pairs together.
TEST(FlashFwdWgmmaScheduler, TileCoordsAreABijectionLongestFirstInHeadGroups) {
  for (int m_blocks : {1, 5, 16}) {
    for (int pairs : {1, 7, 12}) {
      for (int group : {1, 3, 4, 16}) {
        std::set<std::pair<int, int>> seen;
        int prev_group = -1, prev_m = 1 << 30;
        for (int t = 0; t < m_blocks * pairs; ++t) {
          const sched::TileCoord c = sched::tile_coord<true>(t, m_blocks, pairs, group);
          ASSERT_GE(c.m_block, 0);
          ASSERT_LT(c.m_block, m_blocks);
          ASSERT_GE(c.pair, 0);
          ASSERT_LT(c.pair, pairs);
          EXPECT_TRUE(seen.insert({c.m_block, c.pair}).second) << "tile " << t << " repeats a coordinate";
          const int g = c.pair / group;
          EXPECT_GE(g, prev_group) << "head groups run in order";
          if (g == prev_group) {
            EXPECT_LE(c.m_block, prev_m) << "longest first inside a group (t " << t << ")";
          }
          prev_group = g;
          prev_m = c.m_block;
        }
        EXPECT_EQ(seen.size(), static_cast<std::size_t>(m_blocks * pairs));
      }
      // Non-causal: query blocks fastest (CTAs running together share K/V in L2).
      for (int t = 0; t < m_blocks * pairs; ++t) {
        const sched::TileCoord c = sched::tile_coord<false>(t, m_blocks, pairs, 1);
        EXPECT_EQ(c.m_block, t % m_blocks);
        EXPECT_EQ(c.pair, t / m_blocks);
      }
    }
  }
}

TEST(FlashFwdWgmmaScheduler, KvTilesEndAtTheLastRowsDiagonal) {
  // s = sk = 1000, block_m 128, block_n 176: causal block 2 (rows 256..383) sees keys < 384.
  EXPECT_EQ(sched::kv_end<true>(2, 128, 1000, 0), 384);
  EXPECT_EQ(sched::kv_tiles(384, 176), 3);
  EXPECT_EQ(sched::kv_end<false>(2, 128, 1000, 0), 1000);
  // sk < s: the first rows see no key.
  EXPECT_EQ(sched::kv_end<true>(0, 128, 100, -300), -172);
  EXPECT_EQ(sched::kv_tiles(-172, 176), 0);
  EXPECT_EQ(sched::kv_tiles(0, 176), 0);
}

// A packed batch: each sequence's tiles fit in its slice of the index space, the slices in order
// and within varlen_index_tiles.
TEST(FlashFwdWgmmaScheduler, VarlenSequencesFitTheirIndexSlices) {
  const int block_m = 128, heads_q = 5;
  const std::vector<int> lens = {0, 1, 127, 128, 129, 1000, 3, 256};
  std::vector<int> cu = {0};
  for (int l : lens) cu.push_back(cu.back() + l);
  const int batch = static_cast<int>(lens.size());
  long long prev_end = 0;
  for (int b = 0; b < batch; ++b) {
    const long long start = sched::varlen_block_start(cu[b], b, block_m) * heads_q;
    const long long tiles = sched::query_blocks(lens[b], block_m, 1) * heads_q;
    EXPECT_GE(start, prev_end) << "sequence " << b << " overlaps the previous one";
    const long long next = sched::varlen_block_start(cu[b + 1], b + 1, block_m) * heads_q;
    EXPECT_LE(start + tiles, next) << "sequence " << b << " runs into the next one's slice";
    prev_end = start + tiles;
  }
  EXPECT_LE(prev_end, sched::varlen_index_tiles(cu[batch], batch, heads_q, block_m));
  EXPECT_EQ(sched::varlen_index_tiles(cu[batch], batch, heads_q, block_m), (cu[batch] / block_m + batch) * 5LL);
}

// The stream-K tail as the kernel runs it: every cluster's share as pieces (split_pieces), each
// piece's slot, and the combine's view (tail_owner, slot_of): every iteration of every tail tile
// computed exactly once, and the combining warp finds exactly the pieces that meet its tile.
TEST(FlashFwdWgmmaScheduler, SplitTailPiecesCoverEveryIterationOnce) {
  for (int cluster : {1, 2}) {
    for (auto [tail, n, ctas] : {std::tuple{68, 24, 132}, {32, 33, 128}, {16, 33, 132}, {3, 2, 4}, {130, 7, 132}}) {
      if (tail % cluster || ctas % cluster) continue;
      const int G = ctas / cluster, total = tail / cluster * n;
      std::map<std::pair<int, int>, int> covered;  // (tail tile, iteration) -> times
      std::map<int, std::set<int>> slots_of_tile;   // tail tile -> slots holding a piece of it
      for (int c = 0; c < ctas; ++c) {
        const int g = c / cluster, rank = c % cluster;
        const int b = sched::tail_begin(total, g, G), e = sched::tail_begin(total, g + 1, G);
        for (int k = 0; k < 2; ++k) {
          const sched::SplitPiece s = sched::split_piece(k, b, e, n, rank, cluster);
          if (s.u < 0) continue;
          ASSERT_LT(s.u, tail);
          ASSERT_LE(0, s.lo);
          ASSERT_LE(s.hi, n);
          for (int it = s.lo; it < s.hi; ++it) ++covered[{s.u, it}];
          if (s.hi > s.lo) slots_of_tile[s.u].insert(sched::split_slot(c, k));
        }
      }
      for (int u = 0; u < tail; ++u) {
        for (int it = 0; it < n; ++it) EXPECT_EQ((covered[{u, it}]), 1) << "tile " << u << " iteration " << it;
        // The combine (epilogue.cuh, split_combine): the owners of the tile's first and last
        // iterations bound the clusters whose pieces meet it.
        const int v = u / cluster, rank = u % cluster;
        const int g_first = sched::tail_owner(v * n, total, G), g_last = sched::tail_owner((v + 1) * n - 1, total, G);
        std::set<int> combined;
        for (int g = g_first; g <= g_last; ++g)
          combined.insert(sched::split_slot(g * cluster + rank, sched::tail_begin(total, g, G) / n == v ? 0 : 1));
        EXPECT_EQ(combined, slots_of_tile[u]) << "tile " << u << " cluster " << cluster;
      }
    }
  }
}

// The causal split (CausalSplit): the counter's units are the plain tiles, then s1 tiles in p1
// pieces and s2 in p2; every (tile, iteration) is computed by exactly one unit, each piece has a slot
// of its own among its split tile's (first_slot .. + pieces: what the combine reads), and the
// combine's view of a split tile (causal_split_tile) is the units'.
TEST(FlashFwdWgmmaScheduler, CausalSplitUnitsCoverEveryIterationOnce) {
  for (auto [tiles, s1, p1, s2, p2] : {std::tuple{344, 99, 2, 33, 8}, {344, 0, 0, 33, 8}, {300, 132, 3, 0, 0},
                                       {10, 4, 2, 6, 5}, {7, 0, 0, 0, 0}}) {
    const sched::CausalSplit c{s1, p1, s2, p2};
    const int plain = tiles - s1 - s2, units = sched::causal_split_units(tiles, c);
    EXPECT_EQ(units, plain + s1 * p1 + s2 * p2);
    EXPECT_EQ(sched::causal_split_slots(c), s1 * p1 + s2 * p2);
    for (int n : {1, 3, 8, 61}) {  // n < pieces: some pieces are empty, and still arrive
      std::map<std::pair<int, int>, int> covered;
      std::map<int, std::set<int>> slots;  // split tile -> the slots of its pieces
      std::set<int> all_slots;
      for (int u = 0; u < units; ++u) {
        if (u < plain) {
          for (int it = 0; it < n; ++it) ++covered[{u, it}];
          continue;
        }
        const sched::UnitPiece k = sched::causal_unit_piece(u, tiles, c);
        ASSERT_GE(k.split, 0);
        ASSERT_LT(k.split, s1 + s2);
        ASSERT_LT(k.piece, k.pieces);
        EXPECT_EQ(k.pieces, k.split < s1 ? p1 : p2);
        const sched::UnitPiece v = sched::causal_split_tile(k.split, c);
        EXPECT_EQ(v.first_slot, k.first_slot);
        EXPECT_EQ(v.pieces, k.pieces);
        const int lo = sched::piece_begin(n, k.piece, k.pieces), hi = sched::piece_begin(n, k.piece + 1, k.pieces);
        ASSERT_LE(0, lo);
        ASSERT_LE(lo, hi);
        ASSERT_LE(hi, n);
        for (int it = lo; it < hi; ++it) ++covered[{plain + k.split, it}];
        slots[k.split].insert(k.first_slot + k.piece);
        EXPECT_TRUE(all_slots.insert(k.first_slot + k.piece).second) << "slot used twice";
      }
      for (int t = 0; t < tiles; ++t)
        for (int it = 0; it < n; ++it) EXPECT_EQ((covered[{t, it}]), 1) << "tile " << t << " iteration " << it;
      for (auto& [split, set] : slots) EXPECT_EQ(static_cast<int>(set.size()), split < s1 ? p1 : p2);
      if (!all_slots.empty()) EXPECT_EQ(*all_slots.rbegin() + 1, sched::causal_split_slots(c));
    }
  }
}

TEST(FlashFwdWgmmaScheduler, SplitWorkspaceLayout) {
  // Per slot and consumer warp: O's head_dim / 2 values a lane, then m0, m1, l0, l1.
  EXPECT_EQ(sched::split_values(128), 68);
  EXPECT_EQ(sched::split_value_m(128, 0), 64);
  EXPECT_EQ(sched::split_value_m(128, 1), 65);
  EXPECT_EQ(sched::split_value_l(128, 0), 66);
  EXPECT_EQ(sched::split_value_l(128, 1), 67);
  EXPECT_EQ(sched::split_workspace_bytes(132, 8, 128), 2ull * 132 * 8 * 68 * 32 * 4);
}

// A window's K/V tiles (window_keys, window_tiles) against the rows' windows one by one
// (docs/CONTRACT.md: row i sees keys i + diag - left .. i + diag + right, causal right 0, -1
// unbounded): every key a row of the block sees lies in the tiles, and when every row sees a key
// the range is exactly their union.
TEST(FlashFwdWgmmaScheduler, WindowTilesHoldExactlyTheRowsWindows) {
  int checked = 0;
  for (int len_q : {1, 63, 200, 1000})
    for (int len_k : {0, 1, 100, 1000, 3001})
      for (bool causal : {false, true})
        for (int left : {-1, 0, 1, 127, 4096})
          for (int right : {-1, 0, 64}) {
            if (causal && right != -1) continue;       // causal bounds the right side itself
            if (left < 0 && (causal || right < 0)) continue;  // no window
            const int diag = len_k - len_q;
            for (int block_m : {64, 128, 192})
              for (int block_n : {64, 176})
                for (int m = 0; m * block_m < len_q; ++m) {
                  const int r0 = m * block_m, r1 = r0 + block_m;
                  int lo = 1 << 30, hi = -1;  // the union of the rows' (in the sequence) visible keys
                  bool every = true;
                  for (int r = r0; r < std::min(r1, len_q); ++r) {
                    const int b = left < 0 ? 0 : std::max(0, r + diag - left);
                    const int e = causal ? std::min(len_k, r + diag + 1) : right < 0 ? len_k : std::min(len_k, r + diag + right + 1);
                    if (b >= e) {
                      every = false;
                      continue;
                    }
                    lo = std::min(lo, b);
                    hi = std::max(hi, e);
                  }
                  const sched::KeyRange k = causal ? sched::window_keys<true>(r0, r1, len_k, diag, left, right)
                                                   : sched::window_keys<false>(r0, r1, len_k, diag, left, right);
                  const sched::KvTiles t = sched::window_tiles(k, block_n);
                  if (hi < 0) continue;  // no row sees a key (the range may still hold tiles the rows mask)
                  ++checked;
                  ASSERT_LE(t.first * block_n, lo) << len_q << " " << len_k << " " << causal << " " << left << "," << right;
                  ASSERT_GE((t.first + t.n) * block_n, hi) << len_q << " " << len_k << " " << causal << " " << left << "," << right;
                  if (every && r1 <= len_q) {
                    EXPECT_EQ(k.begin, lo);
                    EXPECT_EQ(k.end, hi);
                  }
                }
          }
  EXPECT_GT(checked, 1000);
  // gpt-oss's window (128 keys, causal) at block_m 128, block_n 128, s = sk = 8192: block 10 sees
  // keys 1152 .. 1407: two tiles, both crossing a bound, whatever the key count.
  const sched::KvTiles t = sched::window_tiles(sched::window_keys<true>(1280, 1408, 8192, 0, 128, -1), 128);
  EXPECT_EQ(t.first, 9);
  EXPECT_EQ(t.n, 2);
}
}  // namespace test_flash_fwd_wgmma_scheduler
