// Property test of flash_bwd_mma (the backward pass, issue 45): a spread of its configs at d=64 and
// d=128, causal and not, bf16 and fp16, through the worker's validation (dQ, dK and dV each by
// FlashAttention-2's criterion against the reference's gradients, NaN-poisoned outputs) on shapes
// covering GQA and MQA, odd lengths, sk > s, sk < s (causal rows that see no key: dQ = 0) and one
// query or key row; then a spread of window builds on windowed shapes (one-sided, two-sided, wider
// than the keys). ATTNTUNE_PROPERTY_SAMPLE=N: N configs per (d, kind) (default 8; 0: all).
// FlashBwdMmaDeterministic: the deterministic mode (Call::deterministic) gives the same bits of dQ, dK
// and dV run to run, on shapes of several key blocks (GQA, causal, windows), within the criterion.
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "gpu_env.hpp"
#include "bwd_determinism.hpp"
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

void check(int d, bool window, std::span<const PropertyShape> shapes, std::uint64_t seed, bool causal_only = false) {
  cuda::Context ctx(0);
  const std::string arch = cuda::device_props(0).arch;
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_bwd_mma.yaml");
  std::vector<Config> configs;
  std::vector<Problem> variants;
  for (int causal = causal_only ? 1 : 0; causal < 2; ++causal) {
    const Problem p = Problem::parse(fmt::format("b=1,h=4,s=512,d={},dtype=bf16,causal={}{},pass=bwd", d, causal,
                                                 window ? (causal ? ",window=64" : ",window=64,64") : ""));
    ASSERT_TRUE(attntune::testing::spread_configs(space, p, arch, attntune::testing::property_sample(8), configs, variants))
        << p.str();
  }
  attntune::testing::PropertyRun run{"flash_bwd_mma", d, arch, seed};
  run.extra = ",pass=bwd";
  attntune::testing::check_configs(space, configs, variants, shapes, run);
}

}  // namespace

TEST(FlashBwdMmaProperty, SpreadD64) {
  ATTNTUNE_REQUIRE_GPU();
  check(64, false, kShapes, 4500);
}

TEST(FlashBwdMmaProperty, SpreadD128) {
  ATTNTUNE_REQUIRE_GPU();
  check(128, false, kShapes, 4600);
}

TEST(FlashBwdMmaProperty, WindowsCausal) {
  ATTNTUNE_REQUIRE_GPU();
  check(64, true, kWindowShapes, 4700, /*causal_only=*/true);
  check(128, true, kWindowShapes, 4800, /*causal_only=*/true);
}

TEST(FlashBwdMmaProperty, WindowsTwoSided) {
  ATTNTUNE_REQUIRE_GPU();
  // Non-causal window builds only (a causal build bounds the right side itself).
  cuda::Context ctx(0);
  const std::string arch = cuda::device_props(0).arch;
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_bwd_mma.yaml");
  for (int d : {64, 128}) {
    std::vector<Config> configs;
    std::vector<Problem> variants;
    const Problem p = Problem::parse(fmt::format("b=1,h=4,s=512,d={},dtype=bf16,causal=0,window=64,64,pass=bwd", d));
    ASSERT_TRUE(attntune::testing::spread_configs(space, p, arch, attntune::testing::property_sample(4), configs, variants));
    attntune::testing::PropertyRun run{"flash_bwd_mma", d, arch, 4900u + static_cast<unsigned>(d)};
    run.extra = ",pass=bwd";
    attntune::testing::check_configs(space, configs, variants, kTwoSidedShapes, run);
  }
}

// The deterministic mode: tests/gpu/bwd_determinism.hpp (both backward families run it).
TEST(FlashBwdMmaDeterministic, TwoRunsGiveBitIdenticalGradients) {
  ATTNTUNE_REQUIRE_GPU();
  cuda::Context ctx(0);
  const std::string arch = cuda::device_props(0).arch;
  attntune::testing::check_determinism(ctx, "flash_bwd_mma", arch, 5100);
}
