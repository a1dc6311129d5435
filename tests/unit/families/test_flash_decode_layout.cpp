// flash_decode's shared-memory tiles and their cp.async loads (templates/flash_decode/args.h, the
// functions its kernels compile), for every head dim a multiple of 16 from 32 to 512: a tile's
// chunks land on distinct 16-byte slots that fill it; the swizzle is TMA's for the column
// blocks' row span (128, 64 or 32 bytes), so a box lands where the kernels read it; the 8 rows
// an ldmatrix phase reads of one chunk column fall in 8 bank groups; the loads' items cover each
// chunk of a load group's rows once, and a thread's passes revisit the rows it looked up.
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "templates/flash_decode/args.h"

namespace test_flash_decode_layout {
namespace {

std::vector<int> head_dims() {
  std::vector<int> d;
  for (int x = 32; x <= 512; x += 16) d.push_back(x);
  return d;
}

// TMA's swizzle of a `span`-byte pattern (128, 64, 32; CUTLASS Swizzle<3|2|1, 4, 3>) applied to a
// byte offset from a multiple of the pattern's repeat (8 * span).
unsigned tma_swizzle(unsigned o, int span) {
  const unsigned mask = static_cast<unsigned>(span / 16 - 1);
  return o ^ (((o >> 7) & mask) << 4);
}

}  // namespace

TEST(FlashDecodeLayout, ColumnBlocksAreTheWidestThatDivideTheHeadDim) {
  for (int d : head_dims()) {
    const int cols = att::decode_tile_cols(d);
    EXPECT_EQ(d % cols, 0) << d;
    EXPECT_EQ(cols, d % 64 == 0 ? 64 : d % 32 == 0 ? 32 : 16) << d;
    EXPECT_EQ(1 << att::decode_block_chunks_log2(d), cols / 8) << d;
  }
  // Today's dims keep their 128-byte rows.
  for (int d : {64, 128, 192, 256, 512}) EXPECT_EQ(att::decode_tile_cols(d), 64);
  EXPECT_EQ(att::decode_tile_cols(96), 32);
  EXPECT_EQ(att::decode_tile_cols(160), 32);
  EXPECT_EQ(att::decode_tile_cols(80), 16);
  EXPECT_EQ(att::decode_tile_cols(112), 16);
}

TEST(FlashDecodeLayout, TilesAreTmasSwizzledColumnBlocksWithoutBankConflicts) {
  for (int d : head_dims())
    for (int rows : {8, 16, 32, 64, 128}) {
      const int chunks = d / 8, cols = att::decode_tile_cols(d), span = cols * 2, per_block = cols / 8;
      for (bool swizzled : {true, false}) {
        std::set<unsigned> slots;
        for (int r = 0; r < rows; ++r)
          for (int ch = 0; ch < chunks; ++ch) {
            const unsigned at = att::decode_tile_bytes(r, ch, rows, swizzled ? r & 7 : 0, d);
            ASSERT_EQ(at % 16, 0u);
            ASSERT_LT(at, static_cast<unsigned>(rows * d * 2)) << d << " " << rows;
            slots.insert(at);
            // Where a box of (cols, rows) of column block ch / per_block puts the chunk: its
            // unswizzled offset in the box, swizzled (or not) as TMA does, from the block's start.
            const unsigned in_box = static_cast<unsigned>(r * span + (ch % per_block) * 16);
            const unsigned block = static_cast<unsigned>(ch / per_block * rows * span);
            ASSERT_EQ(at, block + (swizzled ? tma_swizzle(in_box, span) : in_box))
                << "d " << d << " rows " << rows << " row " << r << " chunk " << ch;
          }
        EXPECT_EQ(slots.size(), static_cast<std::size_t>(rows * chunks)) << d << " " << rows;  // a bijection
      }
      // An ldmatrix phase: 8 rows from a multiple of 8, one chunk column: 8 bank groups.
      for (int r0 = 0; r0 < rows; r0 += 8)
        for (int ch = 0; ch < chunks; ++ch) {
          std::set<unsigned> groups;
          for (int r = r0; r < r0 + 8; ++r) groups.insert(att::decode_tile_bytes(r, ch, rows, r & 7, d) % 128 / 16);
          EXPECT_EQ(groups.size(), 8u) << "d " << d << " rows " << r0 << ".. chunk " << ch;
        }
    }
}

TEST(FlashDecodeLayout, LoadsCoverEveryChunkOnceAndRevisitTheirRows) {
  for (int d : head_dims())
    for (int threads : {32, 64, 128, 256})
      for (int rows : {16, 32, 64, 128}) {
        const int chunks = d / 8, passes = att::decode_load_passes(d, threads, rows);
        const int lookups = att::decode_load_lookups(d, threads, rows);
        std::vector<int> seen(static_cast<std::size_t>(rows * chunks), 0);
        if (att::decode_row_loads(d, threads)) {
          const int per_pass = threads / chunks;
          // The space's rule for row loads: whole rows a pass, whole passes a tile.
          if (per_pass > rows || rows * chunks % threads) continue;
          EXPECT_EQ(lookups, passes);
          for (int t = 0; t < threads; ++t)
            for (int i = 0; i < passes; ++i)
              ++seen[static_cast<std::size_t>((t / chunks + i * per_pass) * chunks + t % chunks)];
        } else {
          ASSERT_GE(lookups, 1);
          for (int t = 0; t < threads; ++t)
            for (int i = 0; i < passes; ++i) {
              const int item = t + i * threads;
              if (item >= rows * chunks) continue;  // the ragged last pass
              const int r = att::decode_block_item_row(item, rows, d), ch = att::decode_block_item_chunk(item, rows, d);
              ASSERT_GE(r, 0);
              ASSERT_LT(r, rows);
              ASSERT_GE(ch, 0);
              ASSERT_LT(ch, chunks);
              ++seen[static_cast<std::size_t>(r * chunks + ch)];
              // The row of pass i is the one looked up for pass i % lookups.
              ASSERT_EQ(r, att::decode_block_item_row(t + i % lookups * threads, rows, d))
                  << "d " << d << " threads " << threads << " rows " << rows << " pass " << i;
            }
          // No pass is wholly idle.
          EXPECT_LT((passes - 1) * threads, rows * chunks) << d << " " << threads << " " << rows;
        }
        for (std::size_t k = 0; k < seen.size(); ++k)
          ASSERT_EQ(seen[k], 1) << "d " << d << " threads " << threads << " rows " << rows << ": chunk " << k % chunks
                                << " of row " << k / chunks;
      }
}
}  // namespace test_flash_decode_layout
