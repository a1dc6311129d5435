// Property test of flash_bwd_wgmma (the Hopper backward, issue 45): a spread of its configs (both dQ
// reductions, one and two warpgroups, 64- and 128-row steps) at d=64 and d=128 (and d=256's), causal and not,
// through the worker's validation (dQ, dK and dV each by FlashAttention-2's criterion against the
// reference's gradients, NaN-poisoned outputs) on the backward families' shapes (bwd_checks.hpp): GQA and MQA,
// odd lengths, sk > s, sk < s, one query or key row; then window builds on windowed shapes.
// ATTNTUNE_PROPERTY_SAMPLE=N: N configs per (d, kind) (default 8; 0: all).
// FlashBwdWgmmaDeterministic: the deterministic mode's bits run to run (tests/gpu/bwd_checks.hpp).
// LongestFirst: every config of the longest-first order. WgSkew: the skewed consumer warpgroups.
// LateLoads: head dim 256's loads issued under S^T and dP^T. VarlenLpt: a packed batch's sorted CTA order.
// WalkCursor128RowSteps: the consumers' cursor at d <= 64's 128-row steps. TmaLoads: Q and dO by TMA.
#include <fmt/format.h>

#include <iterator>
#include <vector>

#include "bwd_checks.hpp"
#include "gpu_env.hpp"
#include "property_check.hpp"

namespace test_flash_bwd_wgmma {
using namespace attntune;

using attntune::testing::check_backward_spread;

namespace {

// A tunable's builds (those `keep` keeps): a spread at each head dim of `dims`, causal and not, on the
// backward shapes (seed plain + d, `sample` configs a kind); then at head dim d causal windows with
// sinks (`variant_sample`), soft-caps (`softcap_sample`) and packed batches (`varlen_shapes`,
// `variant_sample`), and the deterministic mode's bits. Sample 0: every config.
struct SweepSeeds {
  unsigned plain, window, softcap, varlen, determinism;
};
void check_tunable_sweep(std::initializer_list<int> dims, int d, std::size_t sample, std::size_t variant_sample,
                         std::size_t softcap_sample, const std::function<bool(const Config&)>& keep,
                         std::span<const attntune::testing::PropertyShape> varlen_shapes, SweepSeeds seeds) {
  for (int dd : dims)
    check_backward_spread("flash_bwd_wgmma", "sm_90a", dd, {0, 1}, "", attntune::testing::kBwdShapes,
                          seeds.plain + static_cast<unsigned>(dd), sample, keep);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", d, {1}, ",window=64,sinks=1",
                        attntune::testing::kBwdWindowSinkShapes, seeds.window, variant_sample, keep);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", d, {0, 1}, ",softcap=50", attntune::testing::kBwdSoftcapShapes,
                        seeds.softcap, softcap_sample, keep);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", d, {0, 1}, ",varlen=1", varlen_shapes, seeds.varlen,
                        variant_sample, keep);
  cuda::Context ctx(0);
  attntune::testing::check_determinism(ctx, "flash_bwd_wgmma", "sm_90a", seeds.determinism, {keep}, {d});
}

}  // namespace

// The checks skip before sm_90 (wgmma); the builds are sm_90a's.
#define REQUIRE_SM90()                                                                                  \
  do {                                                                                                 \
    ATTNTUNE_REQUIRE_GPU();                                                                            \
    cuda::Context ctx(0);                                                                              \
    if (cuda::device_props(0).arch < "sm_90")                                                          \
      GTEST_SKIP() << "flash_bwd_wgmma needs sm_90 (wgmma); this GPU is " << cuda::device_props(0).arch; \
  } while (0)

TEST(FlashBwdWgmmaProperty, SpreadD64) {
  REQUIRE_SM90();
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 64, {0, 1}, "", attntune::testing::kBwdShapes, 5500);
}

TEST(FlashBwdWgmmaProperty, SpreadD128) {
  REQUIRE_SM90();
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 128, {0, 1}, "", attntune::testing::kBwdShapes, 5600);
}

TEST(FlashBwdWgmmaProperty, WindowsCausal) {
  REQUIRE_SM90();
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 64, {1}, ",window=64", attntune::testing::kBwdWindowShapes, 5700);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 128, {1}, ",window=64", attntune::testing::kBwdWindowShapes, 5800);
}

// Sinks: the plain kernels built with ATT_SINKS, reading the forward's LSE (which holds the sink)
// against the reference's gradients of the sink problem; causal and not, and a causal window.
TEST(FlashBwdWgmmaProperty, Sinks) {
  REQUIRE_SM90();
  for (int d : {64, 128})
    check_backward_spread("flash_bwd_wgmma", "sm_90a", d, {0, 1}, ",sinks=1", attntune::testing::kBwdSinkShapes,
                          6600u + static_cast<unsigned>(d), 4);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 128, {1}, ",window=64,sinks=1",
                        attntune::testing::kBwdWindowSinkShapes, 6700, 2);
}

// Packed varlen batches (attntune_attention_backward_varlen): each sequence from its prefix sums,
// the grids over the longest, the workspaces one run a head (bwd_prepost.cuh's bwd_seq); causal and
// not, and a causal window with a soft-cap and sinks.
TEST(FlashBwdWgmmaProperty, Varlen) {
  REQUIRE_SM90();
  for (int d : {64, 128})
    check_backward_spread("flash_bwd_wgmma", "sm_90a", d, {0, 1}, ",varlen=1", attntune::testing::kBwdVarlenShapes,
                          7600u + static_cast<unsigned>(d), 4);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 64, {1}, ",window=64,softcap=30,sinks=1,varlen=1",
                        attntune::testing::kBwdVarlenVariantShapes, 7700, 2);
}

// A packed batch's CTAs in the sorted order (varlen_lpt): every varlen_lpt config of the spread, d=64
// and 128, causal and not, and a causal window with a soft-cap and sinks.
TEST(FlashBwdWgmmaProperty, VarlenLpt) {
  REQUIRE_SM90();
  const auto lpt = [](const Config& c) { return std::get<std::int64_t>(c.at("varlen_lpt")) != 0; };
  for (int d : {64, 128})
    check_backward_spread("flash_bwd_wgmma", "sm_90a", d, {0, 1}, ",varlen=1", attntune::testing::kBwdVarlenLptShapes,
                          9600u + static_cast<unsigned>(d), 4, lpt);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 64, {1}, ",window=64,softcap=30,sinks=1,varlen=1",
                        attntune::testing::kBwdVarlenVariantShapes, 9700, 2, lpt);
}

// Soft-caps: the capped score recomputed and dS times its derivative, against the reference's
// gradients; causal and not, and a causal window with sinks.
TEST(FlashBwdWgmmaProperty, Softcap) {
  REQUIRE_SM90();
  for (int d : {64, 128})
    check_backward_spread("flash_bwd_wgmma", "sm_90a", d, {0, 1}, ",softcap=50", attntune::testing::kBwdSoftcapShapes,
                          7000u + static_cast<unsigned>(d), 4);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 64, {1}, ",window=64,softcap=50,sinks=1",
                        attntune::testing::kBwdWindowSinkSoftcapShapes, 7100, 2);
}

// d=256 (Gemma 2 and 3): two warpgroups of the same 64 keys, each scoring half of a step's queries
// and accumulating half of dK's, dV's and dQ's head dims, P^T and dS^T shared through shared memory;
// causal and not, a causal window with a soft-cap and sinks, a two-sided window, and a packed batch.
TEST(FlashBwdWgmmaProperty, HeadDim256) {
  REQUIRE_SM90();
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 256, {0, 1}, "", attntune::testing::kBwdShapes, 8700, 0);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 256, {1}, ",window=64,softcap=30,sinks=1",
                        attntune::testing::kBwdWindowSinkSoftcapShapes, 8800, 1);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 256, {0}, ",window=64,64", attntune::testing::kBwdTwoSidedShapes,
                        8850, 1);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 256, {0, 1}, ",varlen=1", attntune::testing::kBwdVarlenShapes,
                        8900, 1);
}

// Head dims between 64, 128 and 256 (48, 80, Phi-3's 96, 160, 192), computed over the next of them
// with zero columns (D_PAD; 160 and 192 in d=256's two warpgroups): causal and not on the backward
// shapes, a causal window with a soft-cap and sinks, and a packed batch.
TEST(FlashBwdWgmmaProperty, PaddedHeadDims) {
  REQUIRE_SM90();
  for (int d : {48, 80, 96, 160, 192})
    check_backward_spread("flash_bwd_wgmma", "sm_90a", d, {0, 1}, "", attntune::testing::kBwdShapes,
                          9500u + static_cast<unsigned>(d), 2);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 96, {1}, ",window=64,softcap=30,sinks=1",
                        attntune::testing::kBwdWindowSinkSoftcapShapes, 9800, 1);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 192, {0, 1}, ",varlen=1", attntune::testing::kBwdVarlenShapes,
                        9900, 1);
}

TEST(FlashBwdWgmmaProperty, WindowsTwoSided) {
  REQUIRE_SM90();
  // Non-causal window builds only (a causal build bounds the right side itself).
  for (int d : {64, 128})
    check_backward_spread("flash_bwd_wgmma", "sm_90a", d, {0}, ",window=64,64", attntune::testing::kBwdTwoSidedShapes,
                          5900u + static_cast<unsigned>(d), 4);
}

// The longest-first order of causal key blocks (longest_first: (batch, KV head) pairs in groups,
// each group's key blocks first to last), every such config of the space at d=64 and 128, on the
// backward shapes and two of several groups whose last has fewer pairs (6 and 5 pairs: groups of 4
// take 4 + 2 and 4 + 1).
TEST(FlashBwdWgmmaProperty, LongestFirst) {
  REQUIRE_SM90();
  std::vector<attntune::testing::PropertyShape> shapes(std::begin(attntune::testing::kBwdShapes),
                                                       std::end(attntune::testing::kBwdShapes));
  shapes.push_back({"b=3,h=4,hkv=2,s=300,sk=700", Layout::kBSHD});
  shapes.push_back({"b=5,h=2,hkv=1,s=513,sk=513", Layout::kBHSD});
  for (int d : {64, 128})
    check_backward_spread("flash_bwd_wgmma", "sm_90a", d, {1}, "", shapes,
                          6200u + static_cast<unsigned>(d), 0,
                          [](const Config& c) { return std::get<std::int64_t>(c.at("longest_first")) != 0; });
}

// The producer warpgroup (producer: cp.async loads published on mbarriers, the consumers released
// by the stage): a spread of its configs at d=64 and 128, causal and not, then causal windows, sinks
// and a packed varlen batch, where a step may have no rows and a CTA no steps.
TEST(FlashBwdWgmmaProperty, Producer) {
  REQUIRE_SM90();
  const auto producer = [](const Config& c) { return std::get<bool>(c.at("producer")); };
  for (int d : {64, 128})
    check_backward_spread("flash_bwd_wgmma", "sm_90a", d, {0, 1}, "", attntune::testing::kBwdShapes,
                          6300u + static_cast<unsigned>(d), 6, producer);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 128, {1}, ",window=64", attntune::testing::kBwdWindowShapes, 6400,
                        3, producer);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 64, {1}, ",window=64,sinks=1",
                        attntune::testing::kBwdWindowSinkShapes, 6500, 2, producer);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 128, {0, 1}, ",varlen=1", attntune::testing::kBwdVarlenShapes, 6550,
                        2, producer);
}

// fa4_order (FA4's step order on a producer build: a wait a product, the consumers' barrier under dV,
// dQ's addition under dK): as the producer's spread, and the deterministic mode's bits.
TEST(FlashBwdWgmmaProperty, Fa4Order) {
  REQUIRE_SM90();
  const auto fa4 = [](const Config& c) { return std::get<bool>(c.at("fa4_order")); };
  // (Offered at head dims padded to 128: d=128 and d=96, its zero columns.)
  for (int d : {128, 96})
    check_backward_spread("flash_bwd_wgmma", "sm_90a", d, {0, 1}, "", attntune::testing::kBwdShapes,
                          6600u + static_cast<unsigned>(d), 4, fa4);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 128, {1}, ",window=64", attntune::testing::kBwdWindowShapes, 6700,
                        3, fa4);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 128, {1}, ",window=64,sinks=1",
                        attntune::testing::kBwdWindowSinkShapes, 6750, 2, fa4);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 128, {0, 1}, ",varlen=1", attntune::testing::kBwdVarlenShapes, 6800,
                        2, fa4);
  // sdp_split (S^T and dP^T waited for one at a time, P^T under dP^T), on fa4_order's step.
  const auto split = [](const Config& c) { return std::get<bool>(c.at("sdp_split")); };
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 128, {0, 1}, "", attntune::testing::kBwdShapes, 6850, 2, split);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 128, {1}, ",window=64,sinks=1",
                        attntune::testing::kBwdWindowSinkShapes, 6860, 1, split);
  cuda::Context ctx(0);
  attntune::testing::check_determinism(ctx, "flash_bwd_wgmma", "sm_90a", 6900, {fa4, split}, {128});
}

// wg_skew (the two consumer warpgroups of a producer build take turns to issue their products, on
// named barriers that also order dS^T for dQ): a spread at d=128, 64 and 96 (zero columns), causal and
// not, on the backward shapes (GQA, MQA, odd lengths, CTAs with no step), then causal windows with
// sinks, a two-sided window, a soft-cap (d=128: d=64's 128-row steps do not offer it), packed varlen
// batches, and the deterministic mode's bits.
TEST(FlashBwdWgmmaProperty, WgSkew) {
  REQUIRE_SM90();
  const auto skew = [](const Config& c) { return std::get<bool>(c.at("wg_skew")); };
  for (int d : {128, 64, 96})
    check_backward_spread("flash_bwd_wgmma", "sm_90a", d, {0, 1}, "", attntune::testing::kBwdShapes,
                          7200u + static_cast<unsigned>(d), 4, skew);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 128, {1}, ",window=64,sinks=1",
                        attntune::testing::kBwdWindowSinkShapes, 7300, 2, skew);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 128, {0}, ",window=64,64", attntune::testing::kBwdTwoSidedShapes,
                        7320, 1, skew);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 128, {0, 1}, ",softcap=50", attntune::testing::kBwdSoftcapShapes,
                        7340, 1, skew);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 128, {0, 1}, ",varlen=1", attntune::testing::kBwdVarlenShapes, 7360,
                        2, skew);
  cuda::Context ctx(0);
  attntune::testing::check_determinism(ctx, "flash_bwd_wgmma", "sm_90a", 7400, {skew}, {128});
}

// tma_loads (a producer build's Q and dO tiles, LSE and D rows by the TMA unit, over tensor maps of
// dense q and dout): a spread at d=128, 64, 96 and 48 (zero columns past the head dim, inside a box),
// causal and not, on the backward shapes (GQA, MQA, odd lengths: zero rows past seqlen_q; CTAs with no
// step), then causal windows with sinks, a two-sided window, a soft-cap, and the deterministic mode's
// bits.
TEST(FlashBwdWgmmaProperty, TmaLoads) {
  REQUIRE_SM90();
  const auto tma = [](const Config& c) { return std::get<bool>(c.at("tma_loads")); };
  for (int d : {128, 64, 96, 48})
    check_backward_spread("flash_bwd_wgmma", "sm_90a", d, {0, 1}, "", attntune::testing::kBwdShapes,
                          7600u + static_cast<unsigned>(d), 4, tma);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 128, {1}, ",window=64,sinks=1",
                        attntune::testing::kBwdWindowSinkShapes, 7700, 2, tma);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 128, {0}, ",window=64,64", attntune::testing::kBwdTwoSidedShapes,
                        7720, 1, tma);
  check_backward_spread("flash_bwd_wgmma", "sm_90a", 64, {0, 1}, ",softcap=50", attntune::testing::kBwdSoftcapShapes,
                        7740, 1, tma);
  cuda::Context ctx(0);
  attntune::testing::check_determinism(ctx, "flash_bwd_wgmma", "sm_90a", 7800, {tma}, {128});
}

// late_loads (head dim 256's builds issue the next stage's loads after S^T and dP^T instead of
// before them): a spread at d=256 and 192 (zero columns), causal and not, on the backward shapes (GQA,
// MQA, odd lengths, CTAs with no step), then causal windows with sinks, a soft-cap, packed varlen
// batches, and the deterministic mode's bits.
TEST(FlashBwdWgmmaProperty, LateLoads) {
  REQUIRE_SM90();
  const auto late = [](const Config& c) { return std::get<bool>(c.at("late_loads")); };
  check_tunable_sweep({256, 192}, 256, 4, 2, 1, late, attntune::testing::kBwdVarlenShapes, {7500, 7600, 7640, 7660, 7700});
}

// The walk's cursor in the consumers of 128-row steps (d <= 64): producer builds of two consumer
// warpgroups with dQ's bulk reductions and no skew (traits.cuh kWalkCursorSteps), every such config
// at d=64 and a padded d=48, causal and not, longest first, windows with sinks, a soft-cap, packed
// batches in either order; then their deterministic bits.
TEST(FlashBwdWgmmaProperty, WalkCursor128RowSteps) {
  REQUIRE_SM90();
  const auto cursor = [](const Config& c) {
    return std::get<bool>(c.at("producer")) && std::get<std::int64_t>(c.at("block_m")) == 128 &&
           std::get<std::int64_t>(c.at("block_n")) == 128 && std::get<std::string>(c.at("dq_reduce")) == "bulk" &&
           !std::get<bool>(c.at("wg_skew"));
  };
  check_tunable_sweep({64, 48}, 64, 0, 0, 0, cursor, attntune::testing::kBwdVarlenLptShapes, {7800, 7900, 7940, 7960, 7990});
}

TEST(FlashBwdWgmmaDeterministic, TwoRunsGiveBitIdenticalGradients) {
  REQUIRE_SM90();
  cuda::Context ctx(0);
  // Beside the spread, a longest-first build of the causal kind (the turns must hold in either order
  // of the key blocks), a build with a producer warpgroup, and a packed batch's sorted-order build
  // (its deterministic calls keep the grid's order).
  attntune::testing::check_determinism(
      ctx, "flash_bwd_wgmma", "sm_90a", 6100,
      {[](const Config& c) { return std::get<std::int64_t>(c.at("longest_first")) != 0; },
       [](const Config& c) { return std::get<bool>(c.at("producer")); },
       [](const Config& c) { return std::get<std::int64_t>(c.at("varlen_lpt")) != 0; }},
      {64, 128, 256});
}
}  // namespace test_flash_bwd_wgmma
