// Property test: valid configs of the flash_fwd_wgmma space (sm_90a) match the reference on fresh
// random inputs, with a NaN-poisoned output, at shapes covering odd lengths, causal (rows that see
// no key), GQA/MQA, sk != s, the [B,S,H,D] layout and, for the persistent grid, several work tiles
// per CTA; launched through LoadedKernel, i.e. with the tensor maps the evaluator encodes. dtype
// alternates over the configs. By default a fixed spread: ATTNTUNE_PROPERTY_SAMPLE per head dim
// and causality (default 24), plus every ablation step (plain, producer, ping-pong, overlap, both;
// persistent or not), the ping-pong ring of three warpgroups and four kv_multicast configs (the
// shapes' odd query-block counts give pairs with an idle block); 0 checks the whole space.
// Every head dim the space serves: 64, 128, 256 (128-byte swizzle), the users' 96, 80, 112, 192,
// 160 and 32 (64-, 32-, 128-, 64-, 64-byte spans) each on its own, the other multiples of 16 with a
// smaller spread; and for the new head dims the KV cache (paged, and the same cache contiguous) and
// packed batches (varlen), causal and not, persistent and per-tile grids.
// Skips on GPUs without sm_90a (wgmma).
#include <cstdlib>
#include <functional>

#include <fmt/format.h>

#include "gpu_env.hpp"
#include "tests/common/plan_call.hpp"
#include "property_check.hpp"

namespace test_flash_fwd_wgmma {
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

// dv: V's head dim when it is not d.
void check_space(int d, std::size_t fallback = 24, int dv = 0) {
  cuda::Context ctx(0);
  const auto props = cuda::device_props(0);
  if (props.arch != "sm_90") GTEST_SKIP() << "flash_fwd_wgmma needs sm_90a (Hopper); this GPU is " << props.arch;
  const std::string arch = "sm_90a";
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_fwd_wgmma.yaml");
  const Problem base = Problem::parse(
      fmt::format("b=1,h=1,s=128,d={}{},dtype=bf16,causal=0", d, dv ? fmt::format(",dv={}", dv) : std::string()));
  Problem causal_base = base;
  causal_base.causal = true;
  const char* env = std::getenv("ATTNTUNE_PROPERTY_SAMPLE");
  const std::size_t n = env ? std::strtoul(env, nullptr, 10) : fallback;
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
      // Each ablation step once, block_n 128 (64 past d=192, where 128 does not fit the registers;
      // both grid modes where the space has them), and the ping-pong ring of three consumer
      // warpgroups (where it fits: not at d=256).
      const std::int64_t block_n = d > 192 ? 64 : 128;
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
  attntune::testing::PropertyRun run{"flash_fwd_wgmma", d, arch, 2000, /*require_no_spills=*/true};
  run.dv = dv;
  attntune::testing::check_configs(space, configs, variants, kShapes, run);
}

// The configs `keep` keeps, dense (non-causal and causal, both dtypes) on kShapes: a spread of n each.
void check_kept(int d, int dv, std::size_t n, const std::function<bool(const Config&)>& keep) {
  cuda::Context ctx(0);
  if (cuda::device_props(0).arch != "sm_90") GTEST_SKIP() << "flash_fwd_wgmma needs sm_90a (Hopper)";
  const std::string arch = "sm_90a";
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_fwd_wgmma.yaml");
  std::vector<Config> configs;
  std::vector<Problem> variants;
  for (int causal : {0, 1}) {
    const Problem kind = Problem::parse(fmt::format("b=1,h=1,s=128,d={}{},dtype=bf16,causal={}", d,
                                                    dv ? fmt::format(",dv={}", dv) : std::string(), causal));
    ASSERT_TRUE(attntune::testing::spread_configs(space, kind, arch, n, configs, variants, keep)) << kind.str();
  }
  for (std::size_t i = 0; i < variants.size(); ++i) variants[i].dtype = i % 2 ? DType::kFp16 : DType::kBf16;
  attntune::testing::PropertyRun run{"flash_fwd_wgmma kept", d, arch, 2000, /*require_no_spills=*/true};
  run.dv = dv;
  attntune::testing::check_configs(space, configs, variants, kShapes, run);
}

}  // namespace

// The KV cache (paged with ragged lengths and shuffled pages, each checked again contiguous) and
// packed ragged batches at head dim d: a spread of each kind's configs plus a persistent grid (tiles
// from the counter) and the plain schedule (no producer); `keep`, when given, of the configs it keeps
// (and the persistent grid only).
void check_entry_points(int d, int dv = 0, const std::function<bool(const Config&)>& keep = {}) {
  cuda::Context ctx(0);
  if (cuda::device_props(0).arch != "sm_90") GTEST_SKIP() << "flash_fwd_wgmma needs sm_90a (Hopper)";
  const std::string arch = "sm_90a";
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_fwd_wgmma.yaml");
  struct Kind {
    const char* kind;
    std::vector<PropertyShape> shapes;
  };
  const Kind kinds[] = {
      {"b=4,h=8,s=512,sk=4096,causal=1,page=64",
       {{"b=5,h=6,hkv=2,s=300,sk=1000,page=16", Layout::kBHSD}, {"b=3,h=4,hkv=4,s=129,sk=2049,page=64", Layout::kBSHD},
        {"b=6,h=4,hkv=2,s=40,sk=3001,page=64", Layout::kBHSD}}},
      {"b=4,h=8,s=512,sk=4096,causal=0,page=64",
       {{"b=5,h=6,hkv=2,s=300,sk=1000,page=16", Layout::kBSHD}, {"b=3,h=4,hkv=4,s=129,sk=2049,page=64", Layout::kBHSD}}},
      {"b=4,h=8,s=1024,causal=1,varlen=1",
       {{"b=5,h=6,hkv=2,s=777,sk=777,varlen=1", Layout::kBSHD}, {"b=3,h=4,hkv=4,s=300,sk=429,varlen=17", Layout::kBHSD}}},
      {"b=4,h=8,s=1024,causal=0,varlen=1", {{"b=9,h=8,hkv=1,s=1000,sk=1000,varlen=900", Layout::kBSHD}}},
  };
  for (const Kind& k : kinds) {
    SCOPED_TRACE(k.kind);
    const Problem kind = Problem::parse(
        fmt::format("{},d={}{},dtype=bf16", k.kind, d, dv ? fmt::format(",dv={}", dv) : std::string()));
    std::vector<Config> configs;
    std::vector<Problem> variants;
    ASSERT_TRUE(attntune::testing::spread_configs(space, kind, arch, attntune::testing::property_sample(4), configs,
                                                  variants, keep))  // an empty `keep` keeps every config
        << kind.str();
    for (bool persistent : {true, false}) {
      if (keep && !persistent) continue;
      ASSERT_TRUE(attntune::testing::spread_configs(space, kind, arch, 1, configs, variants, [&](const Config& c) {
        return (!keep || keep(c)) &&
               (persistent ? flag(c, "persistent") && flag(c, "warp_specialize") : !flag(c, "warp_specialize"));
      })) << kind.str();
    }
    attntune::testing::PropertyRun run{"flash_fwd_wgmma entry points", d, arch, 17000, /*require_no_spills=*/true};
    run.dv = dv;
    attntune::testing::check_configs(space, configs, variants, k.shapes, run);
  }
}

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

// Head dims of other swizzle spans (args.h, wgmma_tile): the users' first.
TEST(FlashFwdWgmmaProperty, SampledConfigsD96) {  // Phi-3; 64-byte span, 3 column blocks
  ATTNTUNE_REQUIRE_GPU();
  check_space(96);
}

TEST(FlashFwdWgmmaProperty, SampledConfigsD80) {  // 32-byte span, 5 column blocks; a half last store group
  ATTNTUNE_REQUIRE_GPU();
  check_space(80);
}

TEST(FlashFwdWgmmaProperty, SampledConfigsD112) {  // 32-byte span, 7 column blocks
  ATTNTUNE_REQUIRE_GPU();
  check_space(112);
}

TEST(FlashFwdWgmmaProperty, SampledConfigsD192) {  // DeepSeek MLA prefill's qk dim; 128-byte span, 3 blocks
  ATTNTUNE_REQUIRE_GPU();
  check_space(192);
}

TEST(FlashFwdWgmmaProperty, SampledConfigsD160) {  // 64-byte span, 5 column blocks
  ATTNTUNE_REQUIRE_GPU();
  check_space(160);
}

TEST(FlashFwdWgmmaProperty, SampledConfigsD32) {  // 64-byte span, one column block
  ATTNTUNE_REQUIRE_GPU();
  check_space(32);
}

// The rest of the multiples of 16, a smaller spread each.
TEST(FlashFwdWgmmaProperty, SampledConfigsOtherHeadDims) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {48, 144, 176, 208, 224, 240}) {
    SCOPED_TRACE(fmt::format("d={}", d));
    check_space(d, 6);
  }
}

// The KV cache and packed batches at the new head dims (64, 128 and 256: test_prefill_kvcache.cpp,
// test_prefill_varlen.cpp and the variants' tests).
TEST(FlashFwdWgmmaProperty, EntryPointsD96) {
  ATTNTUNE_REQUIRE_GPU();
  check_entry_points(96);
}

TEST(FlashFwdWgmmaProperty, EntryPointsD80) {
  ATTNTUNE_REQUIRE_GPU();
  check_entry_points(80);
}

TEST(FlashFwdWgmmaProperty, EntryPointsD112) {
  ATTNTUNE_REQUIRE_GPU();
  check_entry_points(112);
}

TEST(FlashFwdWgmmaProperty, EntryPointsD192) {
  ATTNTUNE_REQUIRE_GPU();
  check_entry_points(192);
}

TEST(FlashFwdWgmmaProperty, EntryPointsD160) {
  ATTNTUNE_REQUIRE_GPU();
  check_entry_points(160);
}

TEST(FlashFwdWgmmaProperty, EntryPointsD32) {
  ATTNTUNE_REQUIRE_GPU();
  check_entry_points(32);
}

// V's head dim other than Q's and K's (`dv=N`): DeepSeek's MLA prefill (192 / 128: V's column blocks
// two of K's three, one span), a narrower V span under a 128-byte K span (128 / 96: 64-byte V rows),
// and V wider than K (64 / 128). Sampled configs (multicast, split tail, ping-pong, both grids) and
// every entry point (paged and contiguous KV cache, varlen).
TEST(FlashFwdWgmmaSplitDims, SampledConfigsD192V128) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(192, 12, 128);
}

TEST(FlashFwdWgmmaSplitDims, SampledConfigsD128V96) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(128, 6, 96);
}

TEST(FlashFwdWgmmaSplitDims, SampledConfigsD64V128) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(64, 6, 128);
}

TEST(FlashFwdWgmmaSplitDims, EntryPointsD192V128) {
  ATTNTUNE_REQUIRE_GPU();
  check_entry_points(192, 128);
}

// fa4_loop (FlashAttention-4's loop shape: the tiles that need a mask first, the unmasked ones in a
// loop of their own, a window's left edge last; the row sum from l * factor): dense at d=64, 128 and
// 192/128 (odd lengths, sk != s, rows that see no key), and every entry point at d=128. Its windows:
// FlashFwdWgmmaVariants.Fa4Loop.
TEST(FlashFwdWgmmaProperty, Fa4Loop) {
  ATTNTUNE_REQUIRE_GPU();
  const auto fa4 = [](const Config& c) { return flag(c, "fa4_loop"); };
  check_kept(64, 0, 6, fa4);
  check_kept(128, 0, 6, fa4);
  check_kept(192, 128, 4, fa4);
  check_entry_points(128, 0, fa4);
}

// wg_uniform (the consumer warpgroup's index broadcast from lane 0, Q's descriptors in uniform
// registers): dense at d=64 (three warpgroups among the sample), 128 and 192/128, with and without
// fa4_loop, and every entry point at d=128. Its FP8 forward: FlashFwdWgmmaFp8ForwardProperty.WgUniform.
TEST(FlashFwdWgmmaProperty, WgUniform) {
  ATTNTUNE_REQUIRE_GPU();
  const auto uniform = [](const Config& c) { return flag(c, "wg_uniform"); };
  check_kept(64, 0, 6, uniform);
  check_kept(128, 0, 6, uniform);
  check_kept(192, 128, 4, uniform);
  check_entry_points(128, 0, uniform);
}

// pp_pv (ping-pong's turn around P.V and the next Q.K^T's issue, one turn more a work tile): dense at
// d=64 (three warpgroups among the sample), 128 and 256, causal and not (warpgroups that skip tiles
// past their diagonal, or compute nothing in the last query block, take the extra turn idle), and
// every entry point at d=128 (pages, packed batches, persistent grids). Windows:
// FlashFwdWgmmaVariants.PpPv; the FP8 forward's chunks: FlashFwdWgmmaFp8ForwardProperty.PpPv.
TEST(FlashFwdWgmmaProperty, PpPv) {
  ATTNTUNE_REQUIRE_GPU();
  const auto pv = [](const Config& c) { return flag(c, "pp_pv"); };
  check_kept(64, 0, 6, pv);
  check_kept(128, 0, 6, pv);
  check_kept(256, 0, 4, pv);
  check_entry_points(128, 0, pv);
}

// mask_bits (a masked tile's visible keys as a word of bits a row and key parity): causal at d=64
// (three warpgroups among the sample), 128 and 256, the diagonal through the narrow first tile, and
// every entry point at d=128 (pages and packed batches: sequences that end inside a tile).
TEST(FlashFwdWgmmaProperty, MaskBits) {
  ATTNTUNE_REQUIRE_GPU();
  const auto bits = [](const Config& c) { return flag(c, "mask_bits"); };
  check_kept(64, 0, 6, bits);
  check_kept(128, 0, 6, bits);
  check_kept(256, 0, 4, bits);
  check_entry_points(128, 0, bits);
}

// The causal split (split_tail on a causal persistent grid: the counter's last units are pieces of
// the last tiles, combined by the last warp to arrive; docs/design/flash_fwd_wgmma.md "The causal
// split"): a spread of split builds, packed and not, at d=128 and 192/128, on chunked prefills the
// plan splits on this GPU (checked first: at least one shape of each config splits), with odd
// lengths, rows that see no key (sk < s), tiles shorter than their pieces (empty pieces), GQA and
// MHA; each launched twice (the combining warps reset the counters for the next launch) and once
// without the optional workspaces (then unsplit).
TEST(FlashFwdWgmmaProperty, CausalSplit) {
  ATTNTUNE_REQUIRE_GPU();
  cuda::Context ctx(0);
  const auto props = cuda::device_props(0);
  if (props.arch != "sm_90") GTEST_SKIP() << "flash_fwd_wgmma needs sm_90a (Hopper)";
  const std::string arch = "sm_90a";
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_fwd_wgmma.yaml");
  const PropertyShape shapes[] = {
      {"b=1,h=28,hkv=4,s=1536,sk=9728", Layout::kBSHD},  // issue 43's u-q28-chunk: 3 rounds of long tiles
      {"b=1,h=28,hkv=4,s=1531,sk=9001", Layout::kBHSD},  // odd lengths
      {"b=2,h=12,hkv=12,s=1000,sk=3001", Layout::kBSHD}, // MHA (packs nothing)
      {"b=1,h=32,hkv=8,s=1300,sk=1300", Layout::kBHSD},  // short diagonal tiles: empty pieces
      {"b=1,h=24,hkv=8,s=1200,sk=1100", Layout::kBSHD},  // sk < s: rows that see no key
  };
  const attntune::testing::FakeDevice device{props.sm_count, 0};
  for (const auto& [d, dv] : {std::pair{128, 0}, std::pair{192, 128}}) {
    const Problem kind = Problem::parse(fmt::format("b=1,h=28,hkv=4,s=1536,sk=9728,d={}{},dtype=bf16,causal=1", d,
                                                    dv ? fmt::format(",dv={}", dv) : std::string()));
    std::vector<Config> configs;
    std::vector<Problem> variants;
    for (bool pack : {true, false})
      ASSERT_TRUE(attntune::testing::spread_configs(
          space, kind, arch, attntune::testing::property_sample(3), configs, variants,
          [&](const Config& c) { return flag(c, "split_tail") && flag(c, "pack_gqa") == pack; }))
          << kind.str();
    for (std::size_t i = 0; i < variants.size(); ++i) variants[i].dtype = i % 2 ? DType::kFp16 : DType::kBf16;
    for (std::size_t i = 0; i < configs.size(); ++i) {
      int split = 0;
      const auto launch = render_kernel(space, configs[i], kind, arch).launch;  // the build check_configs runs
      for (const PropertyShape& sh : shapes) {
        const Problem p = Problem::parse(fmt::format("{},d={}{},dtype=bf16,causal=1", sh.dims, d,
                                                     dv ? fmt::format(",dv={}", dv) : std::string()));
        attntune_plan::Call call = attntune::testing::dense_call_of(p);
        call.head_dim_v = static_cast<int>(p.head_dim_v());  // (the helper's call has one head dim)
        std::string why;
        const auto plan = plan_call(launch, call, device.device(), &why);
        ASSERT_TRUE(plan) << why;
        ASSERT_EQ(plan->workspaces, 3) << config_str(configs[i]);
        split += plan->workspace[2].bytes > sizeof(int) * std::get<std::int64_t>(configs[i].at("block_m")) / 16;
      }
      EXPECT_GE(split, 1) << config_str(configs[i]) << ": the plan splits none of the shapes on " << props.sm_count
                          << " SMs";
    }
    attntune::testing::PropertyRun run{"flash_fwd_wgmma causal split", d, arch, 43000, /*require_no_spills=*/true};
    run.dv = dv;
    run.without_workspaces = true;
    attntune::testing::check_configs(space, configs, variants, shapes, run);
  }
}
}  // namespace test_flash_fwd_wgmma
