// Property test of flash_bwd_mma (the backward pass, issue 45): a spread of its configs at d=64 and
// d=128, causal and not, bf16 and fp16, through the worker's validation (dQ, dK and dV each by
// FlashAttention-2's criterion against the reference's gradients, NaN-poisoned outputs) on shapes
// covering GQA and MQA, odd lengths, sk > s, sk < s (causal rows that see no key: dQ = 0) and one
// query or key row; then a spread of window builds on windowed shapes (one-sided, two-sided, wider
// than the keys). ATTNTUNE_PROPERTY_SAMPLE=N: N configs per (d, kind) (default 8; 0: all).
// FlashBwdMmaDeterministic: the deterministic mode (Call::deterministic) gives the same bits of dQ, dK
// and dV run to run, on shapes of several key blocks (GQA, causal, windows), within the criterion.
// The checks and shapes are both backward families': tests/gpu/bwd_checks.hpp.
#include <iterator>
#include <string>
#include <vector>

#include "bwd_checks.hpp"
#include "gpu_env.hpp"

namespace test_flash_bwd_mma {
using namespace attntune;

using attntune::testing::check_backward_spread;

namespace {

// flash_bwd_mma builds for this GPU's arch (sm_80..sm_90).
std::string gpu_arch() {
  cuda::Context ctx(0);
  return cuda::device_props(0).arch;
}

}  // namespace

TEST(FlashBwdMmaProperty, SpreadD64) {
  ATTNTUNE_REQUIRE_GPU();
  check_backward_spread("flash_bwd_mma", gpu_arch(), 64, {0, 1}, "", attntune::testing::kBwdShapes, 4500);
}

TEST(FlashBwdMmaProperty, SpreadD128) {
  ATTNTUNE_REQUIRE_GPU();
  check_backward_spread("flash_bwd_mma", gpu_arch(), 128, {0, 1}, "", attntune::testing::kBwdShapes, 4600);
}

// Sinks: the plain kernels built with ATT_SINKS, reading the forward's LSE (which holds the sink)
// against the reference's gradients of the sink problem; causal and not, and a causal window.
TEST(FlashBwdMmaProperty, Sinks) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {64, 128})
    check_backward_spread("flash_bwd_mma", gpu_arch(), d, {0, 1}, ",sinks=1", attntune::testing::kBwdSinkShapes,
                          6400u + static_cast<unsigned>(d), 4);
  check_backward_spread("flash_bwd_mma", gpu_arch(), 128, {1}, ",window=64,sinks=1",
                        attntune::testing::kBwdWindowSinkShapes, 6500, 2);
}

// Packed varlen batches (attntune_attention_backward_varlen): each sequence from its prefix sums,
// the grids over the longest, the workspaces one run a head (bwd_prepost.cuh's bwd_seq); causal and
// not, and a causal window with a soft-cap and sinks.
TEST(FlashBwdMmaProperty, Varlen) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {64, 128})
    check_backward_spread("flash_bwd_mma", gpu_arch(), d, {0, 1}, ",varlen=1", attntune::testing::kBwdVarlenShapes,
                          7400u + static_cast<unsigned>(d), 4);
  check_backward_spread("flash_bwd_mma", gpu_arch(), 64, {1}, ",window=64,softcap=30,sinks=1,varlen=1",
                        attntune::testing::kBwdVarlenVariantShapes, 7500, 2);
}

// A packed batch's CTAs in the sorted order (varlen_lpt): every varlen_lpt config of the spread, d=64
// and 128, causal and not, and a causal window with a soft-cap and sinks (the sort's walks are the
// windowed ones).
TEST(FlashBwdMmaProperty, VarlenLpt) {
  ATTNTUNE_REQUIRE_GPU();
  const auto lpt = [](const Config& c) { return std::get<std::int64_t>(c.at("varlen_lpt")) != 0; };
  for (int d : {64, 128})
    check_backward_spread("flash_bwd_mma", gpu_arch(), d, {0, 1}, ",varlen=1", attntune::testing::kBwdVarlenLptShapes,
                          9400u + static_cast<unsigned>(d), 4, lpt);
  check_backward_spread("flash_bwd_mma", gpu_arch(), 64, {1}, ",window=64,softcap=30,sinks=1,varlen=1",
                        attntune::testing::kBwdVarlenVariantShapes, 9500, 2, lpt);
}

// d=256 (Gemma 2 and 3): dkv_split 2, each of a key block's two CTAs computing S^T and dP^T over all
// 256 head dims and writing half of dK, dV and dQ; causal and not, a causal window with a soft-cap
// and sinks, and a packed batch.
TEST(FlashBwdMmaProperty, HeadDim256) {
  ATTNTUNE_REQUIRE_GPU();
  check_backward_spread("flash_bwd_mma", gpu_arch(), 256, {0, 1}, "", attntune::testing::kBwdShapes, 8400, 4);
  check_backward_spread("flash_bwd_mma", gpu_arch(), 256, {1}, ",window=64,softcap=30,sinks=1",
                        attntune::testing::kBwdWindowSinkSoftcapShapes, 8500, 2);
  check_backward_spread("flash_bwd_mma", gpu_arch(), 256, {1}, ",varlen=1", attntune::testing::kBwdVarlenShapes, 8600,
                        2);
}

// Head dims between 64, 128 and 256 (Phi-3's 96, 48, 80, 160, 192), computed over the next of them
// with zero columns (D_PAD): causal and not on the backward shapes, a causal window with a soft-cap
// and sinks, and a packed batch.
TEST(FlashBwdMmaProperty, PaddedHeadDims) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {48, 80, 96, 160, 192})
    check_backward_spread("flash_bwd_mma", gpu_arch(), d, {0, 1}, "", attntune::testing::kBwdShapes,
                          9000u + static_cast<unsigned>(d), 2);
  check_backward_spread("flash_bwd_mma", gpu_arch(), 96, {1}, ",window=64,softcap=30,sinks=1",
                        attntune::testing::kBwdWindowSinkSoftcapShapes, 9300, 1);
  check_backward_spread("flash_bwd_mma", gpu_arch(), 96, {1}, ",varlen=1", attntune::testing::kBwdVarlenShapes, 9400,
                        1);
}

// Soft-caps: the capped score recomputed and dS times its derivative, against the reference's
// gradients; causal and not, and a causal window with sinks.
TEST(FlashBwdMmaProperty, Softcap) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {64, 128})
    check_backward_spread("flash_bwd_mma", gpu_arch(), d, {0, 1}, ",softcap=50", attntune::testing::kBwdSoftcapShapes,
                          6800u + static_cast<unsigned>(d), 4);
  check_backward_spread("flash_bwd_mma", gpu_arch(), 64, {1}, ",window=64,softcap=50,sinks=1",
                        attntune::testing::kBwdWindowSinkSoftcapShapes, 6900, 2);
}

TEST(FlashBwdMmaProperty, WindowsCausal) {
  ATTNTUNE_REQUIRE_GPU();
  check_backward_spread("flash_bwd_mma", gpu_arch(), 64, {1}, ",window=64", attntune::testing::kBwdWindowShapes, 4700);
  check_backward_spread("flash_bwd_mma", gpu_arch(), 128, {1}, ",window=64", attntune::testing::kBwdWindowShapes, 4800);
}

TEST(FlashBwdMmaProperty, WindowsTwoSided) {
  ATTNTUNE_REQUIRE_GPU();
  // Non-causal window builds only (a causal build bounds the right side itself).
  for (int d : {64, 128})
    check_backward_spread("flash_bwd_mma", gpu_arch(), d, {0}, ",window=64,64", attntune::testing::kBwdTwoSidedShapes,
                          4900u + static_cast<unsigned>(d), 4);
}

// kv_pairs (a pair of warps sharing keys: each scores half the step's queries, P^T and dS^T through
// shared memory, dK and dV over half the head dims), dq_rows 32 (two m16 tiles of dQ a warp),
// and dq_reduce vec4 (the accumulator in the fragments' column order, flash_bwd_convert reading it
// back): pairs at d=128 causal and not, with a causal window, at d=256's halves and at d=96 (padded)
// with a window, a soft-cap and sinks; dq_rows 32 at d=64; vec4 at d=64 and 128 and in a packed
// varlen batch.
TEST(FlashBwdMmaProperty, PairedWarpsDqRowsAndVec4) {
  ATTNTUNE_REQUIRE_GPU();
  const auto pairs = [](const Config& c) { return std::get<bool>(c.at("kv_pairs")); };
  const auto rows32 = [](const Config& c) { return std::get<std::int64_t>(c.at("dq_rows")) == 32; };
  const auto vec4 = [](const Config& c) { return std::get<std::string>(c.at("dq_reduce")) == "vec4"; };
  const std::string arch = gpu_arch();
  check_backward_spread("flash_bwd_mma", arch, 128, {0, 1}, "", attntune::testing::kBwdShapes, 9600, 6, pairs);
  check_backward_spread("flash_bwd_mma", arch, 128, {1}, ",window=64", attntune::testing::kBwdWindowShapes, 9610, 2,
                        pairs);
  check_backward_spread("flash_bwd_mma", arch, 256, {0, 1}, "", attntune::testing::kBwdShapes, 9620, 2, pairs);
  check_backward_spread("flash_bwd_mma", arch, 96, {1}, ",window=64,softcap=30,sinks=1",
                        attntune::testing::kBwdWindowSinkSoftcapShapes, 9630, 2, pairs);
  check_backward_spread("flash_bwd_mma", arch, 64, {0, 1}, "", attntune::testing::kBwdShapes, 9640, 4, rows32);
  if (arch != "sm_90") GTEST_SKIP() << "vec4 is sm_90's";
  for (int d : {64, 128})
    check_backward_spread("flash_bwd_mma", arch, d, {0, 1}, "", attntune::testing::kBwdShapes,
                          9650u + static_cast<unsigned>(d), 4, vec4);
  check_backward_spread("flash_bwd_mma", arch, 128, {1}, ",varlen=1", attntune::testing::kBwdVarlenShapes, 9660, 2,
                        vec4);
}

// dq_reduce frag (scalar atomicAdds, every arch) and frag4 (one REDG.F32x4 a lane and tile, sm_90):
// the accumulator in the MMA fragments' order, each 16-row block's 8-column tiles of 128 floats
// (Traits::dq_offset), read back by flash_bwd_convert: d=64 and 128 causal and not, d=256's halves
// (each CTA's part starts at a tile), d=96 (padded) with a window, a soft-cap and sinks, and packed
// varlen batches (each sequence's run of the workspaces from a multiple of block_m).
TEST(FlashBwdMmaProperty, FragmentOrderDq) {
  ATTNTUNE_REQUIRE_GPU();
  const std::string arch = gpu_arch();
  for (const char* mode : {"frag", "frag4"}) {
    if (std::string(mode) == "frag4" && arch != "sm_90") continue;  // (frag4 is sm_90's)
    const auto pick = [mode](const Config& c) { return std::get<std::string>(c.at("dq_reduce")) == mode; };
    const unsigned seed = std::string(mode) == "frag" ? 9800 : 9900;
    for (int d : {64, 128})
      check_backward_spread("flash_bwd_mma", arch, d, {0, 1}, "", attntune::testing::kBwdShapes,
                            seed + static_cast<unsigned>(d), 4, pick);
    check_backward_spread("flash_bwd_mma", arch, 256, {0, 1}, "", attntune::testing::kBwdShapes, seed + 1, 2, pick);
    check_backward_spread("flash_bwd_mma", arch, 96, {1}, ",window=64,softcap=30,sinks=1",
                          attntune::testing::kBwdWindowSinkSoftcapShapes, seed + 2, 2, pick);
    check_backward_spread("flash_bwd_mma", arch, 128, {0, 1}, ",varlen=1", attntune::testing::kBwdVarlenShapes,
                          seed + 3, 2, pick);
  }
}

// longest_first (causal: the CTAs take their key blocks first to last within groups of (batch, KV
// head) rows, bwd_blocks.h's cta_block): every such config at d=64 and 128 on the backward shapes,
// plus grids whose rows do not fill the last group (3 x 2 and 5 x 1 rows in groups of 4 and 16).
TEST(FlashBwdMmaProperty, LongestFirst) {
  ATTNTUNE_REQUIRE_GPU();
  std::vector<attntune::testing::PropertyShape> shapes(std::begin(attntune::testing::kBwdShapes),
                                                       std::end(attntune::testing::kBwdShapes));
  shapes.push_back({"b=3,h=4,hkv=2,s=300,sk=700", Layout::kBSHD});
  shapes.push_back({"b=5,h=2,hkv=1,s=513,sk=513", Layout::kBHSD});
  for (int d : {64, 128})
    check_backward_spread("flash_bwd_mma", gpu_arch(), d, {1}, "", shapes, 9700u + static_cast<unsigned>(d), 6,
                          [](const Config& c) { return std::get<std::int64_t>(c.at("longest_first")) != 0; });
}

// The deterministic mode: tests/gpu/bwd_checks.hpp (both backward families run it).
TEST(FlashBwdMmaDeterministic, TwoRunsGiveBitIdenticalGradients) {
  ATTNTUNE_REQUIRE_GPU();
  cuda::Context ctx(0);
  const std::string arch = cuda::device_props(0).arch;
  // (And of each kind a longest-first config, where there is one: its CTAs' turns follow cta_block's
  // order; one adding dQ in the fragments' order, frag or frag4; and a packed batch's sorted-order
  // build, whose deterministic calls keep the grid's order.)
  attntune::testing::check_determinism(
      ctx, "flash_bwd_mma", arch, 5100,
      {[](const Config& c) { return std::get<std::int64_t>(c.at("longest_first")) != 0; },
       [](const Config& c) { return std::get<std::string>(c.at("dq_reduce")).rfind("frag", 0) == 0; },
       [](const Config& c) { return std::get<std::int64_t>(c.at("varlen_lpt")) != 0; }},
      {64, 128, 256});
}
}  // namespace test_flash_bwd_mma
