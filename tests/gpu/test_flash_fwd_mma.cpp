// Property test: every valid config of the flash_fwd_mma space (d=64, 128 and 256) matches the
// reference on fresh random inputs, with a NaN-poisoned output, at shapes covering odd lengths,
// causal, GQA/MQA, sk != s and the [B,S,H,D] layout. dtype and causal alternate over the configs
// so every combination is covered without building each config four times.
// ATTNTUNE_PROPERTY_SAMPLE=N checks a fixed spread of N configs per head dim instead of all.
#include <cstdlib>

#include <fmt/format.h>

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
};

void check_space(int d) {
  cuda::Context ctx(0);
  const auto props = cuda::device_props(0);
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_fwd_mma.yaml");
  const std::string arch = props.arch;
  const Problem base = Problem::parse(fmt::format("b=1,h=1,s=128,d={},dtype=bf16,causal=0", d));
  std::vector<Config> configs = space.enumerate(base, arch);
  ASSERT_FALSE(configs.empty());
  if (const char* env = std::getenv("ATTNTUNE_PROPERTY_SAMPLE")) {
    const std::size_t n = std::strtoul(env, nullptr, 10), step = std::max<std::size_t>(1, configs.size() / std::max<std::size_t>(1, n));
    std::vector<Config> picked;
    for (std::size_t i = 0; i < configs.size() && picked.size() < n; i += step) picked.push_back(configs[i]);
    configs = picked;
  }
  std::vector<Problem> variants;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    Problem p = base;
    p.dtype = i % 2 ? DType::kFp16 : DType::kBf16;
    p.causal = (i / 2) % 2;
    variants.push_back(p);
  }
  attntune::testing::check_configs(space, configs, variants, kShapes, {"flash_fwd_mma", d, arch, 1000});
}

}  // namespace

TEST(FlashFwdMmaProperty, AllConfigsD64) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(64);
}

TEST(FlashFwdMmaProperty, AllConfigsD128) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(128);
}

TEST(FlashFwdMmaProperty, AllConfigsD256) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(256);
}
