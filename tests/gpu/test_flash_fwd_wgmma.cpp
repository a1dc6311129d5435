// Property test: valid configs of the flash_fwd_wgmma space (sm_90a) match the reference on fresh
// random inputs, with a NaN-poisoned output, at shapes covering odd lengths, causal (rows that see
// no key), GQA/MQA, sk != s, the [B,S,H,D] layout and, for the persistent grid, several work tiles
// per CTA; launched through LoadedKernel, i.e. with the tensor maps the evaluator encodes. dtype
// alternates over the configs. By default a fixed spread: ATTNTUNE_PROPERTY_SAMPLE per head dim
// and causality (default 24), plus every ablation step (plain, producer, ping-pong, overlap, both;
// persistent or not), the ping-pong ring of three warpgroups and four kv_multicast configs (the
// shapes' odd query-block counts give pairs with an idle block); 0 checks the whole space.
// Skips on GPUs without sm_90a (wgmma).
#include <cstdlib>

#include <fmt/format.h>

#include "gpu_env.hpp"
#include "property_check.hpp"

using namespace attntune;

namespace {

using attntune::testing::PropertyShape;
const PropertyShape kShapes[] = {
    {"b=2,h=6,hkv=2,s=777,sk=1001", Layout::kBSHD},    // GQA, sk > s, odd lengths
    {"b=1,h=4,hkv=4,s=333,sk=129", Layout::kBHSD},     // sk < s: causal rows that see no key
    {"b=1,h=3,hkv=1,s=100,sk=300", Layout::kBSHD},     // MQA, s shorter than a block
    {"b=3,h=40,hkv=8,s=1000,sk=1000", Layout::kBHSD},  // 320-960 work tiles: several per SM
};

bool flag(const Config& c, const char* name) { return std::get<bool>(c.at(name)); }

void check_space(int d) {
  cuda::Context ctx(0);
  const auto props = cuda::device_props(0);
  if (props.arch != "sm_90") GTEST_SKIP() << "flash_fwd_wgmma needs sm_90a (Hopper); this GPU is " << props.arch;
  const std::string arch = "sm_90a";
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_fwd_wgmma.yaml");
  const Problem base = Problem::parse(fmt::format("b=1,h=1,s=128,d={},dtype=bf16,causal=0", d));
  Problem causal_base = base;
  causal_base.causal = true;
  const char* env = std::getenv("ATTNTUNE_PROPERTY_SAMPLE");
  const std::size_t n = env ? std::strtoul(env, nullptr, 10) : 24;
  std::vector<Config> configs;
  std::vector<Problem> variants;
  // Non-causal and causal each from their own enumeration (causal adds head_group and drops the
  // persistent grid); dtype alternates.
  for (const Problem& kind : {base, causal_base}) {
    const std::vector<Config> all = space.enumerate(kind, arch);
    ASSERT_FALSE(all.empty());
    std::vector<Config> picked;
    if (n == 0 || n >= all.size()) {
      picked = all;
    } else {
      for (std::size_t i = 0; i < n; ++i) picked.push_back(all[i * all.size() / n]);
      // Each ablation step once, block_n 128 (64 at d=256; both grid modes where the space has
      // them), and the ping-pong ring of three consumer warpgroups (not at d=256).
      const std::int64_t block_n = d == 256 ? 64 : 128;
      int mc_picked = 0;
      for (const Config& c : all) {
        if (std::get<std::int64_t>(c.at("block_n")) != block_n || std::get<std::int64_t>(c.at("stages")) != 2 ||
            std::get<std::int64_t>(c.at("producer_regs")) != 24 || std::get<std::int64_t>(c.at("exp2_emu")) != 0 ||
            std::get<std::int64_t>(c.at("head_group")) != (kind.causal ? 4 : 1))
          continue;
        const bool ws = flag(c, "warp_specialize");
        const auto bm = std::get<std::int64_t>(c.at("block_m"));
        if (flag(c, "kv_multicast")) {
          // K/V multicast (2-CTA clusters): a few, with and without the split tail where offered.
          if (bm == 128 && flag(c, "ping_pong") && flag(c, "intra_wg_overlap") && mc_picked++ < 4) picked.push_back(c);
          continue;
        }
        if ((bm == 64 && !ws) || (bm == 128 && ws) || (bm == 192 && flag(c, "ping_pong")))
          picked.push_back(c);  // (a); (b')-(e)
      }
    }
    for (const Config& c : picked) {
      Problem p = kind;
      p.dtype = configs.size() % 2 ? DType::kFp16 : DType::kBf16;
      configs.push_back(c);
      variants.push_back(p);
    }
  }
  attntune::testing::check_configs(space, configs, variants, kShapes,
                                   {"flash_fwd_wgmma", d, arch, 2000, /*require_no_spills=*/true});
}

}  // namespace

TEST(FlashFwdWgmmaProperty, SampledConfigsD64) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(64);
}

TEST(FlashFwdWgmmaProperty, SampledConfigsD128) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(128);
}

TEST(FlashFwdWgmmaProperty, SampledConfigsD256) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(256);
}
