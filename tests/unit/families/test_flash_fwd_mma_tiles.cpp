// flash_fwd_mma's tiles (templates/flash_fwd_mma/tiles.h), the one view of them that the launch
// plan (host) and the kernel (device) share, checked on the CPU against brute force: the grid's
// query blocks cover every row once, the causal order is a permutation running the heaviest block
// first, a packed sequence's and a cache's bounds, and the K/V tiles a query block visits hold
// every key one of its rows sees; with a window, only the tiles its rows see, and a warp masks
// exactly the tiles that cross one of its bounds, and the mask's per-key test is the window.
#include <algorithm>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "templates/flash_fwd_mma/launch.h"
#include "tests/common/plan_call.hpp"

namespace test_flash_fwd_mma_tiles {
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

namespace {

// The same with a window (left, right; -1 unbounded): i' - left <= j <= i' + right as well.
bool visible_window(int r, int j, int len_q, int len_k, bool causal, int left, int right) {
  const int rr = r + len_k - len_q;
  if (!visible(r, j, len_q, len_k, causal)) return false;
  return (left < 0 || j >= rr - left) && (causal || right < 0 || j <= rr + right);
}

struct WindowCase {
  bool causal;
  int left, right;
};
const WindowCase kWindows[] = {
    {true, 0, -1},    {true, 1, -1},    {true, 127, -1},   {true, 4096, -1}, {false, 0, -1},  {false, 1, 64},
    {false, 127, -1}, {false, 127, 64}, {false, 4096, 0}, {false, -1, 64},  {false, -1, 0}, {false, 5, 300},
};

template <bool kCausal>
tiles::KeyRange window_block_keys(int row0, int row_end, int len_k, int diag, int left, int right) {
  return tiles::block_keys<kCausal, true>(row0, row_end, len_k, diag, left, right);
}
template <bool kCausal>
tiles::KeyRange window_unmasked(int row0, int row_end, int len_k, int diag, int left, int right) {
  return tiles::unmasked_keys<kCausal, true>(row0, row_end, len_k, diag, left, right);
}

}  // namespace

// A window's block visits exactly the tiles that hold a key one of its rows sees: none outside
// the window is loaded (so its time follows the window), and the first and last it visits hold
// one; blocks whose rows see nothing visit none.
TEST(FlashFwdMmaTiles, AWindowsBlockVisitsOnlyTheTilesItsRowsSee) {
  for (const WindowCase& w : kWindows)
    for (int block_m : {64, 128})
      for (int block_n : {32, 64, 128})
        for (auto [len_q, len_k] : {std::pair{1, 1}, {100, 300}, {333, 129}, {1000, 1000}, {5, 0}, {777, 1001}}) {
          const int diag = len_k - len_q;
          for (int mb = 0; mb < tiles::query_blocks(len_q, block_m); ++mb) {
            const int m0 = mb * block_m;
            const tiles::KeyRange keys =
                w.causal ? window_block_keys<true>(m0, m0 + block_m, len_k, diag, w.left, w.right)
                         : window_block_keys<false>(m0, m0 + block_m, len_k, diag, w.left, w.right);
            const int first = tiles::first_tile(keys, block_n), count = tiles::tile_count(keys, block_n);
            // Rows past len_q (the last block's padding) bound the range too: count them as the
            // kernel does, then check that every visited tile holds a key some row sees.
            std::vector<bool> seen_tile(static_cast<std::size_t>(len_k / block_n + 2), false);
            int lo = len_k, hi = 0;
            for (int r = m0; r < m0 + block_m; ++r)
              for (int j = 0; j < len_k; ++j)
                if (visible_window(r, j, len_q, len_k, w.causal, w.left, w.right)) {
                  lo = std::min(lo, j);
                  hi = std::max(hi, j + 1);
                  seen_tile[static_cast<std::size_t>(j / block_n)] = true;
                }
            const std::string at = fmt::format("window ({}, {}) causal {} s={} sk={} block {} ({}x{})", w.left, w.right,
                                               w.causal, len_q, len_k, mb, block_m, block_n);
            if (lo >= hi) {
              EXPECT_EQ(count, 0) << at;
              continue;
            }
            EXPECT_EQ(first, lo / block_n) << at;
            EXPECT_EQ(first + count, (hi + block_n - 1) / block_n) << at;
            for (int t = first; t < first + count; ++t) EXPECT_TRUE(seen_tile[static_cast<std::size_t>(t)]) << at << " tile " << t;
          }
        }
}

// A warp masks a tile exactly when one of its rows does not see one of the tile's keys: the tiles
// inside every bound cost nothing (as causal's do), and no tile that crosses one goes unmasked.
TEST(FlashFwdMmaTiles, AWarpMasksExactlyTheTilesThatCrossABound) {
  for (const WindowCase& w : kWindows)
    for (int warp_rows : {16, 32})
      for (int n : {32, 64, 128})
        for (auto [len_q, len_k] : {std::pair{100, 300}, {333, 129}, {1000, 1000}, {777, 1001}}) {
          const int diag = len_k - len_q;
          for (int r0 = 0; r0 < len_q; r0 += warp_rows) {
            const tiles::KeyRange um = w.causal ? window_unmasked<true>(r0, r0 + warp_rows, len_k, diag, w.left, w.right)
                                                : window_unmasked<false>(r0, r0 + warp_rows, len_k, diag, w.left, w.right);
            for (int n0 = 0; n0 < len_k + n; n0 += n) {
              bool all = true;
              for (int r = r0; r < r0 + warp_rows && all; ++r)
                for (int j = n0; j < n0 + n && all; ++j) all = visible_window(r, j, len_q, len_k, w.causal, w.left, w.right);
              const bool masked = n0 < um.begin || n0 + n > um.end;
              ASSERT_EQ(masked, !all) << fmt::format("window ({}, {}) causal {} s={} sk={} rows {}+{} keys {}+{}", w.left,
                                                     w.right, w.causal, len_q, len_k, r0, warp_rows, n0, n);
            }
          }
        }
}

// The mask's per-key test (visible_offsets: lo <= j - r <= hi, and j < len_k) is the window's
// visibility, for every row and key, causal and not.
TEST(FlashFwdMmaTiles, TheMasksKeyOffsetsAreTheWindow) {
  for (const WindowCase& w : kWindows)
    for (auto [len_q, len_k] : {std::pair{100, 300}, {333, 129}, {257, 257}}) {
      const int diag = len_k - len_q;
      const tiles::Offsets o = w.causal ? tiles::visible_offsets<true>(diag, w.left, w.right)
                                        : tiles::visible_offsets<false>(diag, w.left, w.right);
      for (int r = 0; r < len_q; ++r)
        for (int j = 0; j < len_k + 64; ++j) {
          const bool seen = j - r >= o.lo && j - r <= o.hi && j < len_k;
          ASSERT_EQ(seen, visible_window(r, j, len_q, len_k, w.causal, w.left, w.right))
              << fmt::format("window ({}, {}) causal {} s={} sk={} row {} key {}", w.left, w.right, w.causal, len_q,
                             len_k, r, j);
        }
    }
}

// ---- shared-memory tiles (head dims 32..256 in steps of 16) -------------------------------------

namespace {

constexpr int kDims = 15;  // head dims 32, 48, ..., 256
constexpr int dim(int i) { return 32 + 16 * i; }

// The 16-byte bank group (of 8) a smem byte address falls in.
int bank_group(int byte) { return (byte / 16) % 8; }

// Every chunk of a row lands once in the row, and each span's chunks stay in the span.
template <int kD>
void check_swizzle() {
  SCOPED_TRACE(fmt::format("d={}", kD));
  constexpr int kW = tiles::swizzle_chunks(kD);
  ASSERT_EQ((kD / 8) % kW, 0);
  ASSERT_TRUE(kW == 8 || (kD / 8) % (2 * kW) != 0) << "the widest span that divides a row";
  for (int row = 0; row < 64; ++row) {
    std::vector<int> hit(kD / 8, 0);
    for (int c = 0; c < kD / 8; ++c) {
      const int e = tiles::swizzled<kD>(row, c);
      ASSERT_EQ(e % 8, 0);
      ASSERT_EQ(e / kD, row);
      const int slot = (e % kD) / 8;
      ASSERT_EQ(slot / kW, c / kW) << "row " << row << " chunk " << c;
      ++hit[static_cast<std::size_t>(slot)];
    }
    EXPECT_TRUE(std::all_of(hit.begin(), hit.end(), [](int h) { return h == 1; })) << "row " << row;
  }
  // One chunk column of 8 consecutive rows (an ldmatrix phase): 8 different bank groups.
  for (int row0 = 0; row0 < 16; ++row0)
    for (int c = 0; c < kD / 8; ++c) {
      std::vector<int> groups;
      for (int r = row0; r < row0 + 8; ++r) groups.push_back(bank_group(tiles::swizzled<kD>(r, c) * 2));
      std::sort(groups.begin(), groups.end());
      EXPECT_EQ(std::unique(groups.begin(), groups.end()), groups.end()) << "rows " << row0 << "+8, chunk " << c;
    }
}

// The loaders' passes (CopyGeometry) write every chunk of a tile once, at its swizzled place, from
// its row and chunk of the tensor, at the immediate offsets the kernel uses, and each quarter-warp
// of a pass writes 8 different bank groups.
template <int kD, int kThreads, int kRows>
void check_copy() {
  using G = tiles::CopyGeometry<kD, kThreads, kRows>;
  SCOPED_TRACE(fmt::format("d={} threads={} rows={}", kD, kThreads, kRows));
  constexpr int kStride = 3 * kD + 40;  // the tensor's row stride in elements (any)
  std::vector<int> hit(static_cast<std::size_t>(kRows * kD / 8), 0);
  for (int f = 0; f < G::kPasses; ++f) {
    for (int w = 0; w < kThreads / 32; ++w)
      for (int quarter = 0; quarter < 4; ++quarter) {
        std::vector<int> groups;
        for (int t = w * 32 + quarter * 8; t < w * 32 + quarter * 8 + 8; ++t) {
          struct {
            int r, chunk;
          } x{G::thread_row(static_cast<unsigned>(t)), G::thread_chunk(static_cast<unsigned>(t))};
          if (!G::all_copy(f) && !G::thread_tail(static_cast<unsigned>(t))) continue;
          const int row = x.r + G::row_pass(f) * G::kRowsPerIter;
          const int chunk = x.chunk + G::panel_pass(f) * G::kPanelElems / 8;
          ASSERT_LT(row, kRows) << "pass " << f << " thread " << t;
          ASSERT_LT(chunk, kD / 8) << "pass " << f << " thread " << t;
          ++hit[static_cast<std::size_t>(row * kD / 8 + chunk)];
          // smem: the thread's base (row r, or r + kRowsPerIter for odd passes) plus the immediate.
          const int base = tiles::swizzled<kD>(x.r + (G::odd(f) ? G::kRowsPerIter : 0), x.chunk) * 2;
          EXPECT_EQ(base + G::off(f), tiles::swizzled<kD>(row, chunk) * 2) << "pass " << f << " thread " << t;
          // gmem: row r's chunk, advanced by kRowsPerIter rows a row pass, kPanelElems a panel pass.
          const long long src = static_cast<long long>(x.r) * kStride + x.chunk * 8 +
                                static_cast<long long>(G::row_pass(f)) * G::kRowsPerIter * kStride +
                                G::panel_pass(f) * G::kPanelElems;
          EXPECT_EQ(src, static_cast<long long>(row) * kStride + chunk * 8);
          groups.push_back(bank_group(base + G::off(f)));
        }
        std::sort(groups.begin(), groups.end());
        EXPECT_EQ(std::unique(groups.begin(), groups.end()), groups.end()) << "pass " << f << " warp " << w << " quarter " << quarter;
      }
  }
  for (std::size_t i = 0; i < hit.size(); ++i)
    ASSERT_EQ(hit[i], 1) << "row " << i / (kD / 8) << " chunk " << i % (kD / 8);
}

// ldmatrix: each lane's address of a fragment is its step-0 address XOR frag_xor plus the
// immediate frag_offset, and each of the 4 matrices (8 lanes, 8 rows of one chunk column) reads 8
// different bank groups. Q/V lanes: rows lane % 16, chunk half lane / 16; K lanes: rows lane % 8 +
// 8 * (lane / 16), chunk half lane / 8 % 2. Tiles at multiples of 128 bytes.
template <int kD>
void check_fragments() {
  SCOPED_TRACE(fmt::format("d={}", kD));
  for (const int tile : {0, 128 * 37}) {
    for (bool k_layout : {false, true}) {
      for (int row = 0; row < 64; row += 16)
        for (int step = 0; step < kD / 16; ++step) {
          std::vector<int> groups[4];
          for (int lane = 0; lane < 32; ++lane) {
            const int r = k_layout ? (lane & 7) + ((lane >> 4) << 3) : lane & 15;
            const int half = k_layout ? (lane >> 3) & 1 : lane >> 4;
            const unsigned addr0 = static_cast<unsigned>(tile + tiles::swizzled<kD>(r, half) * 2);
            const unsigned addr = (addr0 ^ static_cast<unsigned>(tiles::frag_xor(kD, step))) +
                                  static_cast<unsigned>(tiles::frag_offset(kD, row, step));
            ASSERT_EQ(addr, static_cast<unsigned>(tile + tiles::swizzled<kD>(row + r, 2 * step + half) * 2))
                << "row " << row << " step " << step << " lane " << lane << (k_layout ? " (K)" : " (Q/V)");
            groups[lane / 8].push_back(bank_group(static_cast<int>(addr)));
          }
          for (auto& g : groups) {
            std::sort(g.begin(), g.end());
            EXPECT_EQ(std::unique(g.begin(), g.end()), g.end()) << "row " << row << " step " << step;
          }
        }
    }
  }
}

template <int kD>
void check_dim() {
  check_swizzle<kD>();
  check_fragments<kD>();
  check_copy<kD, 128, 32>();
  check_copy<kD, 128, 64>();
  check_copy<kD, 128, 128>();
  check_copy<kD, 256, 32>();
  check_copy<kD, 256, 64>();
  check_copy<kD, 256, 128>();
}

}  // namespace

TEST(FlashFwdMmaTiles, EveryHeadDimsSmemLayoutIsCoveredSwizzledAndConflictFree) {
  []<int... i>(std::integer_sequence<int, i...>) { (check_dim<dim(i)>(), ...); }(std::make_integer_sequence<int, kDims>{});
}

// The head dims the kernel served before (64, 128, 256) keep their layout: 128-byte spans, chunk ^
// (row % 8), and one panel a pass (thread t: chunk t % (d / 8) of row t / (d / 8)).
TEST(FlashFwdMmaTiles, MultiplesOf64KeepTheirLayout) {
  auto check = []<int kD, int kThreads, int kRows>() {
    using G = tiles::CopyGeometry<kD, kThreads, kRows>;
    EXPECT_EQ(tiles::swizzle_chunks(kD), 8);
    for (int row = 0; row < 16; ++row)
      for (int c = 0; c < kD / 8; ++c) EXPECT_EQ(tiles::swizzled<kD>(row, c), row * kD + ((c ^ (row & 7)) << 3));
    EXPECT_EQ(G::kPanels, 1);
    EXPECT_EQ(G::kPanelIters, 1);
    EXPECT_EQ(G::kRowsPerIter, kThreads / (kD / 8));
    for (unsigned t = 0; t < kThreads; ++t) {
      EXPECT_EQ(G::thread_row(t), static_cast<int>(t) / (kD / 8));
      EXPECT_EQ(G::thread_chunk(t), static_cast<int>(t) % (kD / 8));
      EXPECT_TRUE(G::thread_tail(t));
    }
    for (int s = 0; s < kD / 16; ++s) {
      EXPECT_EQ(tiles::frag_offset(kD, 16, s), 16 * kD * 2 + (s / 4) * 128);
      EXPECT_EQ(tiles::frag_xor(kD, s), (s % 4) * 32);
    }
  };
  check.operator()<64, 128, 32>();
  check.operator()<64, 256, 64>();
  check.operator()<128, 128, 32>();
  check.operator()<128, 256, 128>();
  check.operator()<256, 128, 64>();
  check.operator()<256, 256, 32>();
}
}  // namespace test_flash_fwd_mma_tiles
