// flash_decode's split of keys (templates/flash_decode/split.h), the one statement its launch plan
// and its kernels both compile: every CTA of the grid is one (split, row block) of its unit; the
// splits' shares of a unit's tiles are disjoint and cover them; the plan's key count bounds what a
// kernel sees of any sequence (a window's too), and a window splits as a sequence of its length
// does; the workspace holds every piece and every unit has its own counter.
#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "templates/flash_decode/launch.h"

namespace test_flash_decode_split {
namespace {

// The keys row i of seqlen_q rows sees in a sequence of len keys, bottom-right aligned (the
// semantics of templates/common/variants.cuh): [begin, end).
std::pair<int, int> row_keys(int i, int seqlen_q, int len, int left, int right, bool causal) {
  const int diag = i + len - seqlen_q;
  int begin = left >= 0 ? diag - left : 0, end = causal ? diag + 1 : (right >= 0 ? diag + right + 1 : len);
  begin = std::clamp(begin, 0, len);
  end = std::clamp(end, 0, len);
  return {begin, end};
}

}  // namespace

TEST(FlashDecodeSplit, EveryCtaIsOneSplitOfOneRowBlock) {
  for (int row_blocks = 1; row_blocks <= 5; ++row_blocks)
    for (int cluster : {1, 2, 4, 16})
      for (int splits = cluster; splits <= 40; splits += cluster) {
        const unsigned grid_x = static_cast<unsigned>(splits * row_blocks);
        std::set<std::pair<int, int>> seen;
        for (unsigned x = 0; x < grid_x; ++x) {
          const att::SplitCta c = cluster > 1 ? att::split_cta<true>(x, grid_x, row_blocks)
                                              : att::split_cta<false>(x, grid_x, row_blocks);
          ASSERT_GE(c.split, 0);
          ASSERT_LT(c.split, splits);
          ASSERT_GE(c.rb, 0);
          ASSERT_LT(c.rb, row_blocks);
          EXPECT_TRUE(seen.insert({c.split, c.rb}).second) << "x " << x << " splits " << splits;
          if (cluster > 1) {
            // A cluster (cluster consecutive CTAs) is the splits of one unit, ranks 0..cluster-1.
            const att::SplitCta first = att::split_cta<true>(x - x % cluster, grid_x, row_blocks);
            EXPECT_EQ(c.rb, first.rb) << x;
            EXPECT_EQ(att::split_piece(c.split, cluster), att::split_piece(first.split, cluster)) << x;
            EXPECT_EQ(att::split_rank(c.split, cluster), static_cast<int>(x % cluster)) << x;
          } else {
            // Row-block-major: a split's row blocks are adjacent CTAs.
            EXPECT_EQ(c.split, static_cast<int>(x) / row_blocks);
          }
        }
        EXPECT_EQ(seen.size(), grid_x);
      }
  // Whole clusters, at least one; the pieces a cluster merges into.
  EXPECT_EQ(att::grid_splits(13, 1), 13);
  EXPECT_EQ(att::grid_splits(13, 4), 12);
  EXPECT_EQ(att::grid_splits(3, 4), 4);
  EXPECT_EQ(att::grid_splits(7, 4), 4);
  EXPECT_EQ(att::split_pieces(12, 4), 3);
  EXPECT_EQ(att::split_pieces(12, 1), 12);
}

TEST(FlashDecodeSplit, SharesAreDisjointAndCoverTheUnitsTiles) {
  for (int first : {0, 1, 7})
    for (int count = 0; count <= 70; ++count)
      for (int splits = 1; splits <= 24; ++splits) {
        const att::UnitTiles u{first, count};
        for (bool even : {false, true}) {
          int next = first, busy = 0, most = 0, least = count + 1;
          for (int s = 0; s < splits; ++s) {
            const att::TileShare t = even ? att::split_tiles_even(u, splits, s) : att::split_tiles(u, splits, s);
            ASSERT_GE(t.n, 0);
            if (t.n == 0) continue;
            ASSERT_EQ(t.begin, next) << "splits in order, no gap, no overlap: " << count << " / " << splits;
            next += t.n;
            ++busy;
            most = std::max(most, t.n);
            least = std::min(least, t.n);
          }
          EXPECT_EQ(next, first + count) << count << " / " << splits << (even ? " even" : "");
          const int per = (count + splits - 1) / splits;
          if (count > 0) {
            EXPECT_EQ(most, per) << "no split takes more than ceil(count / splits)";
          }
          if (even) {
            EXPECT_EQ(busy, std::min(count, splits)) << "every split takes a share while there are tiles";
            if (busy) {
              EXPECT_LE(most - least, 1);
            }
          } else if (count > 0 && (count + per - 1) / per == splits) {
            EXPECT_EQ(busy, splits) << "a count decode_splits offers leaves no split empty";
          }
        }
      }
}

TEST(FlashDecodeSplit, UnitKeysHoldEveryRowsKeysAndThePlanBoundsThem) {
  for (int block_n : {32, 64, 128})
    for (int seqlen_q : {1, 2, 3, 4, 16})
      for (int left : {-1, 0, 1, 5, 63, 64, 127, 128, 300})
        for (int seqlen_k : {1, 17, 64, 65, 129, 200, 300}) {
          const long long bound = att::unit_keys_max(seqlen_k, seqlen_q, left);
          EXPECT_LE(bound, seqlen_k);
          long long most = 0;
          for (int len = 0; len <= seqlen_k; ++len) {
            const int first = att::unit_first_key(len, seqlen_q, left);
            ASSERT_GE(first, 0);
            ASSERT_LE(first, len);
            for (int causal : {0, 1})
              for (int right : {-1, 0, 3}) {
                // Every row's keys lie in [first, len), and some row sees key `first` (when any
                // row sees a key at all).
                bool first_seen = false, any = false;
                for (int i = 0; i < seqlen_q; ++i) {
                  const auto [b, e] = row_keys(i, seqlen_q, len, left, right, causal);
                  if (b >= e) continue;
                  any = true;
                  EXPECT_GE(b, first) << len << " " << i;
                  EXPECT_LE(e, len);
                  first_seen = first_seen || b == first;
                }
                if (any) {
                  EXPECT_TRUE(first_seen) << "len " << len << " left " << left << " s " << seqlen_q;
                }
              }
            const att::UnitTiles u = att::unit_tiles(first, len, block_n);
            EXPECT_GE(u.count, 0);
            EXPECT_LE(u.first * block_n, first);
            EXPECT_GE((u.first + u.count) * block_n, len);
            EXPECT_LT((u.first + u.count - 1) * block_n, std::max(len, 1)) << "no tile wholly past the keys";
            most = std::max<long long>(most, len - first);
          }
          EXPECT_EQ(most, bound) << "the plan's keys are the most a sequence of up to sk keys has: sk " << seqlen_k
                                 << " s " << seqlen_q << " left " << left;
        }
}

// The wave model over keys (window builds) splits a window as the one over tiles splits a
// sequence as long as it: Mistral-like decode (8 units a sequence) over a window of 4096 keys left
// of the diagonal (4097 keys, 65 tiles of 64 where it is not aligned) against 4096 keys. Counted in
// tiles the window got 13 splits of 5 tiles where 4096 keys get 16 of 4 (25% more a CTA); counted
// in keys, no split of the window holds 2% more keys than a split of the 4096, and no more waves.
TEST(FlashDecodeSplit, AWindowSplitsAsASequenceOfItsLength) {
  for (int block_n : {32, 64, 128})
    for (int ctas : {1, 2})
      for (long long units : {8LL, 16LL, 32LL, 128LL}) {
        const int plain = att::decode_splits(units, 4096 / block_n, 132, ctas);
        const int win = att::decode_splits_keys(units, att::unit_keys_max(32768, 1, 4096), block_n, 132, ctas);
        const long long slots = 132LL * ctas;
        EXPECT_LE((units * win + slots - 1) / slots, (units * plain + slots - 1) / slots)
            << "waves: block_n " << block_n << " ctas " << ctas << " units " << units;
        const double keys_plain = 4096.0 / plain, keys_win = 4097.0 / win;
        EXPECT_LE(keys_win, keys_plain * 1.02) << "keys a split: block_n " << block_n << " ctas " << ctas
                                                << " units " << units << ": " << plain << " vs " << win << " splits";
      }
  // A window of 128 (gpt-oss) at 512 units: one split.
  EXPECT_EQ(att::decode_splits_keys(512, att::unit_keys_max(32768, 1, 128), 64, 132, 2), 1);
  EXPECT_EQ(att::decode_splits_keys(512, att::unit_keys_max(32768, 4, 128), 64, 132, 1), 1);
  // No window larger than the sequence: its keys.
  EXPECT_EQ(att::unit_keys_max(4096, 1, 4096), 4096);
  EXPECT_EQ(att::unit_keys_max(32768, 1, 4096), 4097);
  EXPECT_EQ(att::unit_keys_max(32768, 4, -1), 32768);
}

TEST(FlashDecodeSplit, TheWorkspaceHoldsEveryPieceAndEachUnitHasACounter) {
  for (int d : {64, 128, 256})
    for (int pieces : {2, 3, 16})
      for (long long rows_total : {1LL, 40LL, 4096LL}) {
        const long long floats = static_cast<long long>(att::pieces_bytes(pieces, rows_total, d) / 4);
        const long long lse0 = att::piece_lse_start(pieces, rows_total, d);
        // Piece O rows are disjoint and end where the LSEs start; the LSEs end with the workspace.
        EXPECT_EQ(att::piece_o(0, 0, rows_total, d), 0);
        EXPECT_EQ(att::piece_o(pieces - 1, rows_total - 1, rows_total, d) + d, lse0);
        EXPECT_EQ(att::piece_o(1, 0, rows_total, d), rows_total * d);
        EXPECT_EQ(lse0 + att::piece_lse(pieces - 1, rows_total - 1, rows_total) + 1, floats);
        EXPECT_EQ(att::piece_lse(1, 0, rows_total), rows_total);
      }
  const int batch = 3, heads_kv = 4, row_blocks = 2;
  std::set<long long> counters;
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads_kv; ++h)
      for (int rb = 0; rb < row_blocks; ++rb) counters.insert(att::unit_counter(b, h, rb, heads_kv, row_blocks));
  ASSERT_EQ(counters.size(), static_cast<std::size_t>(batch * heads_kv * row_blocks));
  EXPECT_EQ(*counters.begin(), 0);
  EXPECT_EQ(*counters.rbegin() + 1, static_cast<long long>(att::counters_bytes(batch * heads_kv * row_blocks) / 4));
}
}  // namespace test_flash_decode_split
