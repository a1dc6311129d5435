// Property test of flash_bwd_wgmma (the Hopper backward, issue 45): a spread of its configs (both dQ
// reductions, one and two warpgroups, 64- and 128-row steps) at d=64 and d=128, causal and not,
// through the worker's validation (dQ, dK and dV each by FlashAttention-2's criterion against the
// reference's gradients, NaN-poisoned outputs) on the shapes of flash_bwd_mma's test: GQA and MQA,
// odd lengths, sk > s, sk < s, one query or key row; then window builds on windowed shapes.
// ATTNTUNE_PROPERTY_SAMPLE=N: N configs per (d, kind) (default 8; 0: all).
// FlashBwdWgmmaDeterministic: the deterministic mode's bits run to run (tests/gpu/bwd_determinism.hpp).
#include <fmt/format.h>

#include "bwd_determinism.hpp"
#include "gpu_env.hpp"
#include "property_check.hpp"

using namespace attntune;

namespace {

using attntune::testing::PropertyShape;
const PropertyShape kShapes[] = {
    {"b=2,h=6,hkv=2,s=777,sk=1001", Layout::kBSHD},  // GQA, sk > s, odd lengths
    {"b=1,h=4,hkv=4,s=333,sk=129", Layout::kBHSD},   // sk < s: causal rows that see no key
    {"b=1,h=3,hkv=1,s=100,sk=300", Layout::kBSHD},   // MQA, s shorter than a block
    {"b=2,h=2,hkv=2,s=257,sk=257", Layout::kBHSD},   // one past a tile
    {"b=1,h=2,hkv=1,s=1,sk=77", Layout::kBHSD},      // one query row
    {"b=1,h=2,hkv=2,s=77,sk=1", Layout::kBSHD},      // one key
};
const PropertyShape kWindowShapes[] = {
    {"b=2,h=6,hkv=2,s=777,sk=1001,window=100", Layout::kBSHD},
    {"b=1,h=4,hkv=4,s=333,sk=129,window=17", Layout::kBHSD},
    {"b=1,h=4,hkv=2,s=1000,sk=1000,window=5000", Layout::kBSHD},
};
const PropertyShape kTwoSidedShapes[] = {
    {"b=2,h=6,hkv=2,s=777,sk=1001,window=100,50", Layout::kBSHD},
    {"b=1,h=4,hkv=4,s=333,sk=129,window=-1,40", Layout::kBHSD},
};

void check(int d, const char* window, std::span<const PropertyShape> shapes, std::uint64_t seed,
           bool causal_only = false) {
  cuda::Context ctx(0);
  const auto props = cuda::device_props(0);
  if (props.arch < "sm_90") GTEST_SKIP() << "flash_bwd_wgmma needs sm_90 (wgmma); this GPU is " << props.arch;
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_bwd_wgmma.yaml");
  std::vector<Config> configs;
  std::vector<Problem> variants;
  for (int causal = causal_only ? 1 : 0; causal < 2; ++causal) {
    const Problem p =
        Problem::parse(fmt::format("b=1,h=4,s=512,d={},dtype=bf16,causal={}{},pass=bwd", d, causal, window));
    ASSERT_TRUE(attntune::testing::spread_configs(space, p, "sm_90a", attntune::testing::property_sample(8), configs,
                                                  variants))
        << p.str();
  }
  attntune::testing::PropertyRun run{"flash_bwd_wgmma", d, "sm_90a", seed};
  run.extra = ",pass=bwd";
  // (Some builds spill a few bytes at 255 registers: the unit test bounds them.)
  attntune::testing::check_configs(space, configs, variants, shapes, run);
}

}  // namespace

TEST(FlashBwdWgmmaProperty, SpreadD64) {
  ATTNTUNE_REQUIRE_GPU();
  check(64, "", kShapes, 5500);
}

TEST(FlashBwdWgmmaProperty, SpreadD128) {
  ATTNTUNE_REQUIRE_GPU();
  check(128, "", kShapes, 5600);
}

TEST(FlashBwdWgmmaProperty, WindowsCausal) {
  ATTNTUNE_REQUIRE_GPU();
  check(64, ",window=64", kWindowShapes, 5700, /*causal_only=*/true);
  check(128, ",window=64", kWindowShapes, 5800, /*causal_only=*/true);
}

TEST(FlashBwdWgmmaProperty, WindowsTwoSided) {
  ATTNTUNE_REQUIRE_GPU();
  // Non-causal window builds only (a causal build bounds the right side itself).
  cuda::Context ctx(0);
  if (cuda::device_props(0).arch < "sm_90") GTEST_SKIP() << "flash_bwd_wgmma needs sm_90";
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_bwd_wgmma.yaml");
  for (int d : {64, 128}) {
    std::vector<Config> configs;
    std::vector<Problem> variants;
    const Problem p = Problem::parse(fmt::format("b=1,h=4,s=512,d={},dtype=bf16,causal=0,window=64,64,pass=bwd", d));
    ASSERT_TRUE(attntune::testing::spread_configs(space, p, "sm_90a", attntune::testing::property_sample(4), configs,
                                                  variants));
    attntune::testing::PropertyRun run{"flash_bwd_wgmma", d, "sm_90a", 5900u + static_cast<unsigned>(d)};
    run.extra = ",pass=bwd";
    attntune::testing::check_configs(space, configs, variants, kTwoSidedShapes, run);
  }
}

TEST(FlashBwdWgmmaDeterministic, TwoRunsGiveBitIdenticalGradients) {
  ATTNTUNE_REQUIRE_GPU();
  cuda::Context ctx(0);
  if (cuda::device_props(0).arch < "sm_90") GTEST_SKIP() << "flash_bwd_wgmma needs sm_90";
  attntune::testing::check_determinism(ctx, "flash_bwd_wgmma", "sm_90a", 6100);
}
