// Property test of packed batches of different lengths (attntune_attention_forward_varlen) in both
// prefill families: a spread of each space's varlen configs, causal and not, dtype alternating,
// on the inputs the worker validates with (the problem's drawn lengths packed, and a ragged batch
// of empty, one-row, odd and longest sequences), plus the same ragged batch head-major; fresh
// random inputs, NaN-poisoned output and NaN rows past the packed tensors, FA2's criterion
// against the reference, LSE [heads, total_q]; for flash_fwd_wgmma also a batch large enough that
// its launch orders the sequences longest first (FlashFwdWgmmaLongestFirst). ATTNTUNE_PROPERTY_SAMPLE configs per family, head
// dim and causality (default 6).
#include <cstdlib>
#include <functional>
#include <span>

#include <fmt/format.h>

#include "gpu_env.hpp"
#include "property_check.hpp"

namespace test_prefill_varlen {
using namespace attntune;

namespace {

using attntune::testing::PropertyShape;
const PropertyShape kShapes[] = {
    {"b=5,h=6,hkv=2,s=777,sk=777,varlen=1", Layout::kBSHD},     // GQA, odd lengths 1..777
    {"b=3,h=4,hkv=4,s=300,sk=429,varlen=17", Layout::kBHSD},     // sk > s: 129 more keys than rows
    {"b=9,h=8,hkv=1,s=1000,sk=1000,varlen=900", Layout::kBSHD},  // MQA, long sequences
};
// Enough work that flash_fwd_wgmma orders the sequences longest first (launch.h, varlen_orders:
// 4 * 32 * 128 * ~16k rows * 3000 keys, halved when causal, over 2.4e11 FLOPs).
const PropertyShape kOrdered[] = {
    {"b=8,h=32,hkv=8,s=3000,sk=3000,varlen=1000", Layout::kBSHD},
};

// arch "": the device's own. `sample` configs per causality (ATTNTUNE_PROPERTY_SAMPLE, default 6,
// when 0) on `shapes`.
void check_family(const char* family, std::string arch, int d, std::span<const PropertyShape> shapes = kShapes,
                  std::size_t sample = 0, const std::function<bool(const Config&)>& keep = {}) {
  cuda::Context ctx(0);
  const auto props = cuda::device_props(0);
  if (arch == "sm_90a" && props.arch != "sm_90") GTEST_SKIP() << family << " needs sm_90a; this GPU is " << props.arch;
  if (arch.empty()) arch = props.arch;
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/" + family + ".yaml");
  const std::size_t n = sample ? sample : attntune::testing::property_sample();
  std::vector<Config> configs;
  std::vector<Problem> variants;
  for (int causal = 0; causal < 2; ++causal) {
    const Problem kind =
        Problem::parse(fmt::format("b=4,h=4,s=1024,d={},dtype=bf16,causal={},varlen=1", d, causal));
    ASSERT_TRUE(attntune::testing::spread_configs(space, kind, arch, n, configs, variants, keep)) << family;
  }
  attntune::testing::check_configs(space, configs, variants, shapes,
                                   {family, d, arch, 7000, /*require_no_spills=*/false});
}

}  // namespace

TEST(PrefillVarlenProperty, FlashFwdMma) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {64, 128}) check_family("flash_fwd_mma", "", d);
}

TEST(PrefillVarlenProperty, FlashFwdWgmma) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {64, 128, 256}) check_family("flash_fwd_wgmma", "sm_90a", d);
}

// Persistent grids, the tiles from the counter: three configs per causality and head dim on the
// ragged shapes, two on a batch whose launch orders it longest first.
TEST(PrefillVarlenProperty, FlashFwdWgmmaPersistent) {
  ATTNTUNE_REQUIRE_GPU();
  auto persistent = [](const Config& c) { return std::get<bool>(c.at("persistent")); };
  for (int d : {64, 128, 256}) {
    check_family("flash_fwd_wgmma", "sm_90a", d, kShapes, 3, persistent);
    check_family("flash_fwd_wgmma", "sm_90a", d, kOrdered, 2, persistent);
  }
}

// Longest first: two configs per causality and head dim on a batch whose launch orders it.
TEST(PrefillVarlenProperty, FlashFwdWgmmaLongestFirst) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {64, 128, 256}) check_family("flash_fwd_wgmma", "sm_90a", d, kOrdered, 2);
}
}  // namespace test_prefill_varlen
