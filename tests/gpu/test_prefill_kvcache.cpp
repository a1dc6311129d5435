// Property test of chunked prefill over a KV cache (attntune_attention_forward_kvcache) in both
// prefill families: a spread of each space's configs for a paged problem, causal (bottom-right per
// sequence) and not, dtype alternating, on ragged caches (0, 1, odd, all and random keys per
// sequence: rows that see no key output zeros and LSE -inf), shuffled block tables with spare
// pages, NaN in every page row past a sequence's keys, and the same cache contiguous (block_table
// NULL, NaN past each length); fresh random inputs, NaN-poisoned output, FA2's criterion against
// the reference. ATTNTUNE_PROPERTY_SAMPLE configs per family, head dim and causality (default 6).
#include <functional>
#include <vector>

#include <fmt/format.h>

#include "gpu_env.hpp"
#include "property_check.hpp"

namespace test_prefill_kvcache {
using namespace attntune;

namespace {

using attntune::testing::PropertyShape;
// Pages of 16, 64 and 256 rows (sizes a serving engine uses), fewer and more query rows than a
// CTA's block, GQA, MQA and MHA, both layouts; the tuned size aside, every shape is a call the
// build serves (the lengths are run-time arguments).
const PropertyShape kShapes[] = {
    {"b=5,h=6,hkv=2,s=300,sk=1000,page=16", Layout::kBHSD},    // GQA, a chunk of 300 over 700 cached
    {"b=3,h=4,hkv=4,s=129,sk=2049,page=64", Layout::kBSHD},    // MHA, odd lengths, [B,S,H,D]
    {"b=2,h=8,hkv=1,s=777,sk=777,page=256", Layout::kBHSD},    // MQA, no earlier keys: a prefill
    {"b=6,h=4,hkv=2,s=40,sk=3001,page=64", Layout::kBHSD},     // a short chunk, a long cache
};
// flash_fwd_mma reads rows one by one: any page size.
const PropertyShape kOddPages[] = {
    {"b=5,h=4,hkv=2,s=100,sk=500,page=7", Layout::kBHSD},
};

// arch "": the device's own. `persistent_only`: configs with a persistent grid alone (a
// spread of them; causal ones take their tiles from a counter).
void check_family(const char* family, std::string arch, int d, bool persistent_only = false) {
  cuda::Context ctx(0);
  const auto props = cuda::device_props(0);
  if (arch == "sm_90a" && props.arch != "sm_90") GTEST_SKIP() << family << " needs sm_90a; this GPU is " << props.arch;
  if (arch.empty()) arch = props.arch;
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/" + family + ".yaml");
  std::vector<Config> configs;
  std::vector<Problem> variants;
  for (int causal = 0; causal < 2; ++causal) {
    const Problem kind =
        Problem::parse(fmt::format("b=4,h=32,hkv=8,s=2048,sk=10240,d={},dtype=bf16,causal={},page=64", d, causal));
    std::function<bool(const Config&)> keep;
    if (persistent_only) keep = [](const Config& c) { return std::get<bool>(c.at("persistent")); };
    ASSERT_TRUE(attntune::testing::spread_configs(space, kind, arch, attntune::testing::property_sample(), configs,
                                                  variants, keep))
        << family;
  }
  std::vector<PropertyShape> shapes(std::begin(kShapes), std::end(kShapes));
  if (std::string(family) == "flash_fwd_mma") shapes.insert(shapes.end(), std::begin(kOddPages), std::end(kOddPages));
  attntune::testing::check_configs(space, configs, variants, shapes,
                                   {family, d, arch, 9000, /*require_no_spills=*/false});
}

}  // namespace

TEST(PrefillKvcacheProperty, FlashFwdMma) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {64, 128}) check_family("flash_fwd_mma", "", d);
}

TEST(PrefillKvcacheProperty, FlashFwdWgmma) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {64, 128, 256}) check_family("flash_fwd_wgmma", "sm_90a", d);
}

// Persistent grids over a KV cache: every tile's keys from its own sequence (ragged caches), the
// causal ones' tiles handed out by the counter.
TEST(PrefillKvcachePersistent, FlashFwdWgmma) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {64, 128}) check_family("flash_fwd_wgmma", "sm_90a", d, /*persistent_only=*/true);
}
}  // namespace test_prefill_kvcache
