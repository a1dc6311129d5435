// flash_fwd_wgmma's shared-memory layout on the host (templates/flash_fwd_wgmma/args.h, wgmma_tile):
// per head dim the column blocks and swizzle span, the wgmma descriptors' fields against hand-computed
// values for each span, and a model of both sides of the layout: TMA's swizzled copy of each column
// block (box) into shared memory, and wgmma's reading of an operand through the kernel's descriptor
// (decoded from its 64 bits: start, leading and stride offsets, layout type) and k-step offsets, as
// the PTX ISA and CUTLASS (make_gmma_desc) define the canonical K-major and MN-major layouts. Every
// element Q.K^T and P.V read must be the one the copies wrote there; a descriptor bug shows here
// instead of as a wrong result on the GPU. Then the launch plan's tensor maps (box, swizzle) per head
// dim and entry point. No GPU, no NVRTC.
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/common/plan_call.hpp"
#include "templates/flash_fwd_wgmma/launch.h"

namespace test_flash_fwd_wgmma_layout {
using namespace attntune;
namespace wt = att::wgmma_tile;

namespace {

constexpr const char* kArch = "sm_90a";

// TMA's (and wgmma's) swizzle of a shared-memory byte address over a span of 128, 64 or 32 bytes:
// the 16-byte chunk bits [4, 4 + b) XOR the bits [7, 7 + b), b = log2(span / 16) (CUTLASS's
// Swizzle<b, 4, 3>): chunk ^= row & 7 for 128-byte rows, (row >> 1) & 3 for 64, (row >> 2) & 1 for 32.
std::uint32_t swizzle(std::uint32_t addr, int span) {
  const int b = span == 128 ? 3 : span == 64 ? 2 : 1;
  const std::uint32_t mask = (1u << b) - 1;
  return addr ^ (((addr >> 7) & mask) << 4);
}

// A tile as the producer's copies leave it in a shared memory of 16-bit cells: column block cb's box
// (cols, rows) at tile + cb * col_block_bytes, optionally as several boxes of box_rows rows each (the
// paged copies: box j at row j * box_rows), element (r, c) -> its id.
struct Smem {
  std::vector<std::uint16_t> cell = std::vector<std::uint16_t>(1 << 17, 0xFFFF);
  void put(std::uint32_t addr, std::uint16_t v) {
    ASSERT_EQ(addr % 2, 0u);
    ASSERT_LT(addr / 2, cell.size());
    cell[addr / 2] = v;
  }
  std::uint16_t at(std::uint32_t addr) const { return cell.at(addr / 2); }
};
std::uint16_t id(int r, int c) { return static_cast<std::uint16_t>(r * 256 + c); }  // rows < 256, cols < 256

void tma_tile(Smem& sm, std::uint32_t tile, int rows, int d, int box_rows) {
  const int cols = wt::cols(d), span = wt::swizzle_bytes(d), row_bytes = 2 * cols;
  const std::uint32_t col_block_bytes = static_cast<std::uint32_t>(rows * row_bytes);
  for (int cb = 0; cb < d / cols; ++cb)
    for (int r0 = 0; r0 < rows; r0 += box_rows) {
      // One box: its destination is a whole swizzle atom (the pattern is the address's, so a box at
      // a row inside an atom would not line up with the descriptor's atoms).
      const std::uint32_t dst = tile + cb * col_block_bytes + static_cast<std::uint32_t>(r0 * row_bytes);
      ASSERT_EQ(dst % (8u * row_bytes), 0u) << "a box starts inside a swizzle atom";
      for (int r = 0; r < box_rows && r0 + r < rows; ++r)
        for (int c = 0; c < cols; ++c)
          sm.put(swizzle(dst + static_cast<std::uint32_t>(r * row_bytes + 2 * c), span), id(r0 + r, cb * cols + c));
    }
}

struct Fields {
  std::uint32_t start, lead, stride;
  int span;
};
Fields decode(std::uint64_t desc) {
  Fields f;
  f.start = static_cast<std::uint32_t>(desc & 0x3FFF) << 4;
  f.lead = static_cast<std::uint32_t>((desc >> 16) & 0x3FFF) << 4;
  f.stride = static_cast<std::uint32_t>((desc >> 32) & 0x3FFF) << 4;
  const int type = static_cast<int>(desc >> 62);
  f.span = type == 1 ? 128 : type == 2 ? 64 : type == 3 ? 32 : 0;
  EXPECT_EQ((desc >> 49) & 7, 0u) << "base offset";
  return f;
}

// wgmma's element (i, k) of a K-major operand (i < M or N, k < 16) through descriptor `desc`:
// ((8, m), (T, 2)) : ((span, SBO), (1, T)) in 16-byte units; the leading offset is unused.
std::uint32_t k_major(std::uint64_t desc, int i, int k) {
  const Fields f = decode(desc);
  const std::uint32_t off =
      static_cast<std::uint32_t>((i % 8) * f.span + (i / 8) * f.stride + (k / 8) * 16 + (k % 8) * 2);
  return swizzle(f.start + off, f.span);
}
// wgmma's element (n, k) of an MN-major operand (n < N, k < 16): ((T, span / 16, m), (8, 2)) :
// ((1, T, LBO), (span, SBO)): blocks of span / 2 elements of N a leading offset apart, 8-row groups
// of K a stride offset apart.
std::uint32_t mn_major(std::uint64_t desc, int n, int k) {
  const Fields f = decode(desc);
  const int w = f.span / 2;
  const std::uint32_t off =
      static_cast<std::uint32_t>((n % w) * 2 + (n / w) * f.lead + (k % 8) * f.span + (k / 8) * f.stride);
  return swizzle(f.start + off, f.span);
}

// The kernel's descriptors (mainloop.cuh, consume) for a tile at `addr`.
std::uint64_t qk_desc(std::uint32_t addr, int d) {
  const int row_bytes = 2 * wt::cols(d);
  return wt::desc(addr, 16, 8 * row_bytes, row_bytes);
}
std::uint64_t v_desc(std::uint32_t addr, int d, int block_n) {
  const int row_bytes = 2 * wt::cols(d);
  return wt::desc(addr, static_cast<unsigned>(block_n * row_bytes), 8 * row_bytes, row_bytes);
}

}  // namespace

TEST(FlashFwdWgmmaLayout, ColumnBlocksAndSwizzlePerHeadDim) {
  for (int d = 32; d <= 256; d += 16) {
    const int want = d % 64 == 0 ? 64 : d % 32 == 0 ? 32 : 16;
    EXPECT_EQ(wt::cols(d), want) << d;
    EXPECT_EQ(wt::swizzle_bytes(d), 2 * want) << d;
    EXPECT_EQ(d % wt::cols(d), 0) << d;
  }
  // The head dims before: one 128-byte span, as always.
  for (int d : {64, 128, 192, 256}) EXPECT_EQ(wt::swizzle_bytes(d), 128) << d;
  for (int d : {32, 96, 160, 224}) EXPECT_EQ(wt::swizzle_bytes(d), 64) << d;
  for (int d : {48, 80, 112, 144, 176, 208, 240}) EXPECT_EQ(wt::swizzle_bytes(d), 32) << d;
}

// Hand-computed descriptors: start >> 4 in bits 0-13, leading >> 4 in 16-29, stride >> 4 in 32-45,
// layout type in 62-63 (1: 128B, 2: 64B, 3: 32B).
TEST(FlashFwdWgmmaLayout, DescriptorFieldsByHand) {
  // d=128 (the layout before): Q/K at 0x8400 (start 0x840), leading 16 (1), stride 1024 (64).
  EXPECT_EQ(qk_desc(0x8400, 128), 0x4000004000010840ull);
  // V, block_n 128: leading = a column block, 128 rows * 128 bytes = 16384 (0x400).
  EXPECT_EQ(v_desc(0x8400, 128, 128), 0x4000004004000840ull);
  // d=96, 64-byte swizzle: stride 512 (0x20), type 2.
  EXPECT_EQ(qk_desc(0x8400, 96), 0x8000002000010840ull);
  // V, block_n 80: leading 80 * 64 = 5120 (0x140).
  EXPECT_EQ(v_desc(0x8400, 96, 80), 0x8000002001400840ull);
  // d=80, 32-byte swizzle: stride 256 (0x10), type 3.
  EXPECT_EQ(qk_desc(0x8400, 80), 0xC000001000010840ull);
  // V, block_n 176: leading 176 * 32 = 5632 (0x160).
  EXPECT_EQ(v_desc(0x8400, 80, 176), 0xC000001001600840ull);
  // The address wraps at 256 KiB (18 bits of the shared window, bits 4-17 kept).
  EXPECT_EQ(wt::desc(0x40000 + 0x400, 16, 1024, 128) & 0x3FFF, 0x40u);

  // The k-steps' offsets: Q.K^T's step kk of 16 columns inside the row, then the next column block.
  // 128-byte rows (d=128, block_m 128: column blocks of 16384 bytes): 0, 32, 64, 96, 16384, ...
  EXPECT_EQ(wt::qk_step_bytes(0, 64, 16384), 0);
  EXPECT_EQ(wt::qk_step_bytes(3, 64, 16384), 96);
  EXPECT_EQ(wt::qk_step_bytes(4, 64, 16384), 16384);
  EXPECT_EQ(wt::qk_step_bytes(7, 64, 16384), 16384 + 96);
  // 64-byte rows (d=96, block_m 128: 8192 a block): 0, 32, 8192, 8224, 16384, 16416.
  EXPECT_EQ(wt::qk_step_bytes(1, 32, 8192), 32);
  EXPECT_EQ(wt::qk_step_bytes(2, 32, 8192), 8192);
  EXPECT_EQ(wt::qk_step_bytes(5, 32, 8192), 16416);
  // 32-byte rows (d=80, block_n 80: 2560 a block): every step a column block.
  EXPECT_EQ(wt::qk_step_bytes(1, 16, 2560), 2560);
  EXPECT_EQ(wt::qk_step_bytes(4, 16, 2560), 4 * 2560);
  // P.V's step kk: 16 rows.
  EXPECT_EQ(wt::pv_step_bytes(1, 64), 2048);
  EXPECT_EQ(wt::pv_step_bytes(3, 32), 3 * 1024);
  EXPECT_EQ(wt::pv_step_bytes(2, 16), 2 * 512);
}

// Every element each wgmma of Q.K^T (A = Q's 64 rows of a consumer warpgroup, B = K's block_n rows,
// both K-major) and of P.V (B = V, MN-major, N = d) reads is the one TMA wrote there, for every head
// dim, through the kernel's descriptors and k-step offsets; K and V also as the paged copies write
// them (boxes of 8 or 16 rows).
TEST(FlashFwdWgmmaLayout, WgmmaReadsWhatTmaWrote) {
  for (int d = 32; d <= 256; d += 16) {
    SCOPED_TRACE(fmt::format("d={}", d));
    const int cols = wt::cols(d), row_bytes = 2 * cols;
    for (const auto& [block_m, block_n, box_rows] : {std::tuple{128, 80, 80}, {192, 64, 8}, {64, 176, 16}}) {
      SCOPED_TRACE(fmt::format("block_m {} block_n {} box rows {}", block_m, block_n, box_rows));
      Smem sm;
      // Q at 0 and a K or V stage after it (traits.cuh: kOffK = kQBytes), the second of two stages.
      const std::uint32_t q = 0, kv = static_cast<std::uint32_t>(block_m * d * 2 + block_n * d * 2);
      tma_tile(sm, q, block_m, d, block_m);
      tma_tile(sm, kv, block_n, d, box_rows);
      const int q_col_block = block_m * row_bytes, kv_col_block = block_n * row_bytes;
      int bad = 0;
      for (int cw = 0; cw < block_m / 64; ++cw) {
        const std::uint64_t a = qk_desc(q + static_cast<std::uint32_t>(cw * 64 * row_bytes), d);
        for (int kk = 0; kk < d / 16; ++kk) {
          const std::uint64_t a_kk = a + static_cast<std::uint64_t>(wt::qk_step_bytes(kk, cols, q_col_block) >> 4);
          for (int i = 0; i < 64; ++i)
            for (int k = 0; k < 16; ++k) bad += sm.at(k_major(a_kk, i, k)) != id(cw * 64 + i, 16 * kk + k);
        }
      }
      const std::uint64_t b = qk_desc(kv, d);
      for (int kk = 0; kk < d / 16; ++kk) {
        const std::uint64_t b_kk = b + static_cast<std::uint64_t>(wt::qk_step_bytes(kk, cols, kv_col_block) >> 4);
        for (int n = 0; n < block_n; ++n)
          for (int k = 0; k < 16; ++k) bad += sm.at(k_major(b_kk, n, k)) != id(n, 16 * kk + k);
      }
      // The same stage as V: P's k-step kk takes keys 16kk.., N = d.
      const std::uint64_t v = v_desc(kv, d, block_n);
      for (int kk = 0; kk < block_n / 16; ++kk) {
        const std::uint64_t v_kk = v + static_cast<std::uint64_t>(wt::pv_step_bytes(kk, cols) >> 4);
        for (int n = 0; n < d; ++n)
          for (int k = 0; k < 16; ++k) bad += sm.at(mn_major(v_kk, n, k)) != id(16 * kk + k, n);
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

// The launch plan's tensor maps: box (the head dim's column block, rows), its swizzle span, on each
// entry point; K/V pages in boxes of gcd(page, block_n) rows.
TEST(FlashFwdWgmmaLayout, TensorMapsTakeTheColumnBlock) {
  const SearchSpace space = attntune::testing::space_of("flash_fwd_wgmma");
  const auto dev = attntune::testing::FakeDevice{}.device();
  for (int d : {32, 64, 80, 96, 112, 128, 160, 192, 240, 256}) {
    for (const char* entry : {"", ",page=16", ",varlen=1"}) {
      const Problem p =
          Problem::parse(fmt::format("b=2,h=8,hkv=2,s=1000,sk=1500,d={},dtype=bf16,causal=1{}", d, entry));
      const Config c = attntune::testing::first_config(space, p, kArch, [](const Config&) { return true; });
      ASSERT_FALSE(c.empty()) << p.str();
      const RenderedKernel k = render_kernel(space, c, p, kArch);
      attntune_plan::Call call = attntune::testing::dense_call_of(p);
      const bool paged = p.page > 0;
      if (p.varlen > 0) call = attntune::testing::varlen_call_of(p);
      if (paged) {
        call.entry = attntune_plan::kEntryKvcache;
        call.cache_seqlens = reinterpret_cast<const int*>(1ll << 40);
        call.block_table = reinterpret_cast<const int*>(1ll << 41);
        call.page_size = 16;
        call.max_blocks_per_seq = (1500 + 15) / 16;
        for (long long* st : {call.k_stride, call.v_stride}) {
          st[0] = 16LL * p.hkv * d;
          st[1] = d;
          st[2] = p.hkv * d;
        }
      }
      std::string why;
      const auto plan = plan_call(k.launch, call, dev, &why);
      ASSERT_TRUE(plan) << p.str() << ": " << why;
      ASSERT_EQ(plan->maps, 3);
      const unsigned block_m = static_cast<unsigned>(std::get<std::int64_t>(c.at("block_m")));
      const unsigned block_n = static_cast<unsigned>(std::get<std::int64_t>(c.at("block_n")));
      for (int m = 0; m < 3; ++m) {
        const attntune_plan::TensorMap& map = plan->map[m];
        EXPECT_EQ(map.dims[0], static_cast<unsigned long long>(d)) << p.str() << " map " << m;
        EXPECT_EQ(map.box[0], static_cast<unsigned>(wt::cols(d))) << p.str() << " map " << m;
        EXPECT_EQ(map.swizzle_bytes, wt::swizzle_bytes(d)) << p.str() << " map " << m;
        EXPECT_LE(map.box[0] * 2, static_cast<unsigned>(map.swizzle_bytes)) << "TMA: a box row within the span";
        const unsigned rows = m == 0 ? block_m : paged ? std::gcd(16u, block_n) : block_n;
        EXPECT_EQ(map.box[1], rows) << p.str() << " map " << m;
      }
    }
  }
}
}  // namespace test_flash_fwd_wgmma_layout
