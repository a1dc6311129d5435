// flash_fwd_mma's tiles (templates/flash_fwd_mma/tiles.h), the one view of them that the launch
// plan (host) and the kernel (device) share, checked on the CPU against brute force: the grid's
// query blocks cover every row once, the causal order is a permutation running the heaviest block
// first, a packed sequence's and a cache's bounds, and the K/V tiles a query block visits hold
// every key one of its rows sees.
#include <algorithm>
#include <vector>

#include <gtest/gtest.h>

#include "templates/flash_fwd_mma/launch.h"
#include "tests/common/plan_call.hpp"

namespace tiles = att::mma_tiles;

namespace {

// FlashAttention's visibility, written out: row r of len_q rows sees key j of len_k (bottom-right
// aligned, r' = r + len_k - len_q) when 0 <= j < len_k and, causal, j <= r'.
bool visible(int r, int j, int len_q, int len_k, bool causal) {
  const int rr = r + len_k - len_q;
  return j >= 0 && j < len_k && (!causal || j <= rr);
}

}  // namespace

TEST(FlashFwdMmaTiles, QueryBlocksCoverEveryRowAndCausalRunsTheHeaviestFirst) {
  for (int block_m : {64, 128}) {
    for (int len_q : {0, 1, 63, 64, 65, 1000, 4096}) {
      const int blocks = tiles::query_blocks(len_q, block_m);
      EXPECT_EQ(tiles::query_blocks<long long>(len_q, block_m), blocks);
      EXPECT_GE(blocks * block_m, len_q);
      EXPECT_LT((blocks - 1) * block_m, std::max(len_q, 1)) << "no block past the rows";
      for (bool causal : {false, true}) {
        std::vector<int> seen(static_cast<std::size_t>(blocks), 0);
        for (int x = 0; x < blocks; ++x) {
          const int m = causal ? tiles::query_block<true>(x, blocks) : tiles::query_block<false>(x, blocks);
          ASSERT_GE(m, 0);
          ASSERT_LT(m, blocks);
          ++seen[static_cast<std::size_t>(m)];
        }
        EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
        if (causal && blocks > 0) {
          EXPECT_EQ(tiles::query_block<true>(0, blocks), blocks - 1);
        }
      }
    }
  }
}

// The plan's grid is tiles.h's query blocks (the kernel's m_blocks for a packed batch's longest).
TEST(FlashFwdMmaTiles, ThePlansGridIsTheQueryBlocks) {
  const attntune::SearchSpace space = attntune::testing::space_of("flash_fwd_mma");
  for (const char* spec : {"b=3,h=5,s=1000,d=64,dtype=fp16,causal=1", "b=1,h=2,s=77,sk=300,d=128,dtype=bf16,causal=0"}) {
    const attntune::Problem p = attntune::Problem::parse(spec);
    for (const attntune::Config& c : space.enumerate(p, "sm_90")) {
      const auto plan = attntune::plan_call(attntune::render_kernel(space, c, p, "sm_90").launch,
                                            attntune::testing::dense_call_of(p), attntune::testing::FakeDevice{}.device());
      ASSERT_TRUE(plan);
      EXPECT_EQ(plan->launch[0].grid[0],
                static_cast<unsigned>(tiles::query_blocks(static_cast<int>(p.s),
                                                          static_cast<int>(std::get<std::int64_t>(c.at("block_m"))))));
    }
  }
}

TEST(FlashFwdMmaTiles, SequenceBounds) {
  const int cu_q[] = {0, 5, 5, 1005}, cu_k[] = {0, 7, 107, 107};
  const tiles::PackedSequence s0 = tiles::packed_sequence(cu_q, cu_k, 0), s1 = tiles::packed_sequence(cu_q, cu_k, 1),
                              s2 = tiles::packed_sequence(cu_q, cu_k, 2);
  EXPECT_EQ(s0.q0, 0);
  EXPECT_EQ(s0.len_q, 5);
  EXPECT_EQ(s0.len_k, 7);
  EXPECT_EQ(s1.q0, 5);
  EXPECT_EQ(s1.k0, 7);
  EXPECT_EQ(s1.len_q, 0);
  EXPECT_EQ(s1.len_k, 100);
  EXPECT_EQ(s2.q0, 5);
  EXPECT_EQ(s2.k0, 107);
  EXPECT_EQ(s2.len_q, 1000);
  EXPECT_EQ(s2.len_k, 0);
  // A cache's keys: its length, clamped to the cache's rows (no load leaves it).
  EXPECT_EQ(tiles::cache_keys(1000, 300), 300);
  EXPECT_EQ(tiles::cache_keys(1000, 0), 0);
  EXPECT_EQ(tiles::cache_keys(1000, -5), 0);
  EXPECT_EQ(tiles::cache_keys(1000, 5000), 1000);
}

// The tiles a query block visits hold every key one of its rows sees; causal, no tile past the one
// holding the last row's diagonal.
TEST(FlashFwdMmaTiles, ABlocksTilesHoldEveryKeyItsRowsSee) {
  for (int block_m : {64, 128})
    for (int block_n : {32, 64, 128})
      for (bool causal : {false, true})
        for (auto [len_q, len_k] : {std::pair{1, 1}, {100, 300}, {333, 129}, {1000, 1000}, {5, 0}, {257, 3001}}) {
          const int diag = len_k - len_q;
          for (int mb = 0; mb < tiles::query_blocks(len_q, block_m); ++mb) {
            const int m0 = mb * block_m;
            const tiles::KeyRange keys = causal ? tiles::block_keys<true>(m0, m0 + block_m, len_k, diag)
                                                : tiles::block_keys<false>(m0, m0 + block_m, len_k, diag);
            const int first = tiles::first_tile(keys, block_n), count = tiles::tile_count(keys, block_n);
            int lo = len_k, hi = 0;  // the keys the block's rows see
            for (int r = m0; r < std::min(len_q, m0 + block_m); ++r)
              for (int j = 0; j < len_k; ++j)
                if (visible(r, j, len_q, len_k, causal)) {
                  lo = std::min(lo, j);
                  hi = std::max(hi, j + 1);
                }
            if (lo >= hi) continue;  // sees nothing: any tiles are masked whole
            EXPECT_LE(first * block_n, lo) << len_q << " " << len_k << " block " << mb;
            EXPECT_GE((first + count) * block_n, hi) << len_q << " " << len_k << " block " << mb;
            if (causal) {
              EXPECT_LT((first + count - 1) * block_n, std::min(len_k, m0 + block_m + diag));
            }
          }
        }
}
