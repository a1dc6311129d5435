// Property test of flash_fwd_wgmma's attention variants (sliding windows, logit soft-caps, sinks;
// docs/CONTRACT.md) on every entry point and mode the family has: a spread of each variant
// problem's valid configs, plus configs of each mode (persistent grids taking causal tiles from
// the counter, kv_multicast clusters, the split tail, narrow first tiles, head groups), built
// through the pool the tuner uses and checked on shapes that vary the window's sides (left in
// {0, 1, 127, 4096, -1}, right in {0 (causal), -1, 64}), the cap (30, 50) and the sinks (random,
// -1e4 and 1e3 by head), with GQA/MQA, odd lengths, sk != s (rows that see no key), ragged KV
// caches with shuffled pages and packed ragged batches; fresh random inputs, a NaN-poisoned
// output, FA2's criterion against the reference (which applies the variants). tanh.approx
// (softcap_tanh approx) runs on bf16 only: fp16's tighter criterion may not forgive its 2^-11
// (the campaign records that as wrong_result). ATTNTUNE_PROPERTY_SAMPLE spread configs per case
// (default 1).
#include <algorithm>
#include <cstdio>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gpu_env.hpp"
#include "property_check.hpp"

namespace test_flash_fwd_wgmma_variants {
using namespace attntune;

namespace {

using attntune::testing::PropertyShape;

// Causal windows (right 0): left 0 (the diagonal alone), 1, 127, 4096 (wider than the keys).
const PropertyShape kCausalWindows[] = {
    {"b=2,h=6,hkv=2,s=777,sk=1001,window=127", Layout::kBSHD},   // GQA, sk > s, odd lengths
    {"b=1,h=4,hkv=4,s=333,sk=129,window=0", Layout::kBHSD},      // sk < s: rows that see no key
    {"b=1,h=3,hkv=1,s=300,sk=300,window=1", Layout::kBSHD},      // MQA
    {"b=3,h=40,hkv=8,s=1000,sk=1000,window=4096", Layout::kBHSD},  // several work tiles per SM
};
// Two-sided and left-only windows (non-causal).
const PropertyShape kWindows[] = {
    {"b=2,h=6,hkv=2,s=777,sk=1001,window=127", Layout::kBSHD},   // left only
    {"b=1,h=4,hkv=4,s=333,sk=129,window=1,64", Layout::kBHSD},   // sk < s
    {"b=1,h=3,hkv=1,s=100,sk=300,window=-1,64", Layout::kBSHD},  // right only
    {"b=3,h=40,hkv=8,s=1000,sk=1000,window=4096,64", Layout::kBHSD},
    {"b=1,h=2,s=513,sk=513,window=0,-1", Layout::kBHSD},         // keys from the diagonal on
};
// Every shape of a case carries the case's variants (a build serves exactly its own): `extra`
// appended to each shape's dims (",sinks=1", ",softcap=50", ...).
std::vector<std::string> with(std::span<const PropertyShape> shapes, const std::string& extra) {
  std::vector<std::string> out;
  for (const PropertyShape& s : shapes) out.push_back(std::string(s.dims) + extra);
  return out;
}

bool flag(const Config& c, const char* name) { return std::get<bool>(c.at(name)); }
bool approx(const Config& c) { return std::get<std::string>(c.at("softcap_tanh")) == "approx"; }

struct Case {
  std::string kind;                    // the problem the builds are for (its variants, entry point, causal)
  std::vector<std::string> dims;       // the shapes, with the kind's variants
  std::vector<Layout> layouts;
  std::vector<std::function<bool(const Config&)>> modes;  // one config of each (the first valid), besides the spread
};

// `only`, when given: the spread and every mode of the configs it keeps.
void check_case(int d, const Case& k, const std::function<bool(const Config&)>& only = {}) {
  const std::string arch = "sm_90a";
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_fwd_wgmma.yaml");
  const Problem kind = Problem::parse(fmt::format("{},d={},dtype=bf16", k.kind, d));
  std::vector<Config> configs;
  std::vector<Problem> variants;
  ASSERT_TRUE(attntune::testing::spread_configs(space, kind, arch, attntune::testing::property_sample(1), configs,
                                                variants, only))  // an empty `only` keeps every config
      << kind.str();
  const std::vector<Config> all = space.enumerate(kind, arch);
  for (const auto& each : k.modes) {
    const std::function<bool(const Config&)> mode = [&](const Config& c) { return each(c) && (!only || only(c)); };
    const auto it = std::find_if(all.begin(), all.end(), mode);
    if (it == all.end()) {
      // A mode the space serves at other head dims only (the split tail is refused at d=64):
      // skipped here, but a mode no head dim serves is a broken case.
      const Problem at128 = Problem::parse(fmt::format("{},d=128,dtype=bf16", k.kind));
      const std::vector<Config> others = space.enumerate(at128, arch);
      // (With `only`, a mode it rules out, such as the plain schedule for a tunable of the overlap, is
      // skipped too.)
      if (!only) {
        ASSERT_NE(std::find_if(others.begin(), others.end(), mode), others.end())
            << "no config of a mode for " << kind.str() << ", nor at d=128";
      }
      std::printf("flash_fwd_wgmma variants d=%d: a mode of %s is not served at this head dim; skipped\n", d,
                  k.kind.c_str());
      continue;
    }
    Problem p = kind;
    p.dtype = configs.size() % 2 ? DType::kFp16 : DType::kBf16;
    configs.push_back(*it);
    variants.push_back(p);
  }
  for (std::size_t i = 0; i < configs.size(); ++i)
    if (approx(configs[i])) variants[i].dtype = DType::kBf16;
  std::vector<PropertyShape> shapes;
  for (std::size_t i = 0; i < k.dims.size(); ++i) shapes.push_back({k.dims[i].c_str(), k.layouts[i % k.layouts.size()]});
  attntune::testing::check_configs(space, configs, variants, shapes,
                                   {"flash_fwd_wgmma variants", d, arch, 11000, /*require_no_spills=*/true});
}

std::vector<Layout> layouts_of(std::span<const PropertyShape> shapes) {
  std::vector<Layout> out;
  for (const PropertyShape& s : shapes) out.push_back(s.layout);
  return out;
}

// `only`, when given: each case's configs of it alone (a tunable's own check).
void check_head_dim(int d, const std::function<bool(const Config&)>& only = {}) {
  cuda::Context ctx(0);
  if (cuda::device_props(0).arch != "sm_90") GTEST_SKIP() << "flash_fwd_wgmma needs sm_90a (Hopper)";
  auto persistent = [](const Config& c) { return flag(c, "persistent") && flag(c, "warp_specialize"); };
  auto narrow_groups = [](const Config& c) {
    return std::get<std::int64_t>(c.at("narrow_n")) > 0 && std::get<std::int64_t>(c.at("head_group")) > 1;
  };
  auto multicast = [](const Config& c) { return flag(c, "kv_multicast"); };
  auto multicast_one_wg = [](const Config& c) {
    return flag(c, "kv_multicast") && std::get<std::int64_t>(c.at("block_m")) == 64;
  };
  auto split = [](const Config& c) { return flag(c, "split_tail"); };
  auto plain_schedule = [](const Config& c) { return !flag(c, "warp_specialize"); };
  auto approx_tanh = [](const Config& c) { return approx(c) && flag(c, "persistent"); };
  const std::vector<Case> cases = {
      // Causal windows: the spread, a persistent grid (tiles from the counter), narrow first tiles
      // in head groups, and the plain schedule (no producer: every tile of the CTA, masked).
      {"b=4,h=8,s=2048,causal=1,window=127", with(kCausalWindows, ""), layouts_of(kCausalWindows),
       {persistent, narrow_groups, plain_schedule}},
      // All three together, causal.
      {"b=4,h=8,s=2048,causal=1,window=127,softcap=50,sinks=1", with(kCausalWindows, ",softcap=50,sinks=1"),
       layouts_of(kCausalWindows), {persistent}},
      // Two-sided and left-only windows: the spread, a persistent grid, kv_multicast (the pair loads
      // the tiles of both CTAs' windows; warpgroups idle through those outside theirs), with one
      // consumer warpgroup too.
      {"b=4,h=8,s=2048,causal=0,window=127,sinks=1", with(kWindows, ",sinks=1"), layouts_of(kWindows),
       {persistent, multicast, multicast_one_wg}},
      // Soft-caps: non-causal with the split tail and multicast, causal with tanh.approx.
      {"b=4,h=8,s=2048,causal=0,softcap=30", {"b=2,h=6,hkv=2,s=777,sk=1001,softcap=30",
                                               "b=3,h=40,hkv=8,s=1000,sk=1000,softcap=50",
                                               "b=1,h=3,hkv=1,s=100,sk=300,softcap=50"},
       {Layout::kBSHD, Layout::kBHSD}, {split, multicast}},
      {"b=4,h=8,s=2048,causal=1,softcap=50", {"b=1,h=4,hkv=4,s=333,sk=129,softcap=50",
                                               "b=3,h=40,hkv=8,s=1000,sk=1000,softcap=30"},
       {Layout::kBHSD}, {approx_tanh}},
      // Sinks: the split tail's combine, and causal rows that see no key (LSE = the sink).
      {"b=4,h=8,s=2048,causal=0,sinks=1", {"b=2,h=6,hkv=2,s=777,sk=1001,sinks=1", "b=3,h=40,hkv=8,s=1000,sk=1000,sinks=1"},
       {Layout::kBSHD, Layout::kBHSD}, {split}},
      {"b=4,h=8,s=2048,causal=1,sinks=1", {"b=1,h=4,hkv=4,s=333,sk=129,sinks=1", "b=2,h=6,hkv=2,s=777,sk=1001,sinks=1"},
       {Layout::kBHSD, Layout::kBSHD}, {persistent}},
      // A KV cache (ragged lengths, shuffled pages, and contiguous): causal windows with sinks.
      {"b=4,h=8,s=512,sk=4096,causal=1,page=64,window=127,sinks=1",
       {"b=5,h=6,hkv=2,s=300,sk=1000,page=16,window=127,sinks=1", "b=3,h=4,hkv=4,s=129,sk=2049,page=64,window=4096,sinks=1",
        "b=6,h=4,hkv=2,s=40,sk=3001,page=64,window=1,sinks=1"},
       {Layout::kBHSD, Layout::kBSHD}, {persistent}},
      {"b=4,h=8,s=512,sk=4096,causal=0,page=64,window=127,softcap=30",
       {"b=5,h=6,hkv=2,s=300,sk=1000,page=16,window=127,64,softcap=30", "b=3,h=4,hkv=4,s=129,sk=2049,page=64,window=-1,64,softcap=30"},
       {Layout::kBHSD}, {persistent}},
      // Packed ragged batches: causal windows with a soft-cap, and sinks alone.
      {"b=4,h=8,s=1024,causal=1,varlen=1,window=127,softcap=30",
       {"b=5,h=6,hkv=2,s=777,sk=777,varlen=1,window=127,softcap=30", "b=3,h=4,hkv=4,s=300,sk=429,varlen=17,window=0,softcap=50"},
       {Layout::kBSHD, Layout::kBHSD}, {persistent}},
      {"b=4,h=8,s=1024,causal=0,varlen=1,sinks=1", {"b=9,h=8,hkv=1,s=1000,sk=1000,varlen=900,sinks=1"}, {Layout::kBSHD},
       {persistent}},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.kind);
    check_case(d, k, only);
  }
}

}  // namespace

TEST(FlashFwdWgmmaVariants, D64) {
  ATTNTUNE_REQUIRE_GPU();
  check_head_dim(64);
}

TEST(FlashFwdWgmmaVariants, D128) {
  ATTNTUNE_REQUIRE_GPU();
  check_head_dim(128);
}

TEST(FlashFwdWgmmaVariants, D256) {
  ATTNTUNE_REQUIRE_GPU();
  check_head_dim(256);
}

// The new head dims (other swizzle spans: templates/flash_fwd_wgmma/args.h), the users' first.
TEST(FlashFwdWgmmaVariants, D96) {
  ATTNTUNE_REQUIRE_GPU();
  check_head_dim(96);
}

TEST(FlashFwdWgmmaVariants, D80) {
  ATTNTUNE_REQUIRE_GPU();
  check_head_dim(80);
}

TEST(FlashFwdWgmmaVariants, D112) {
  ATTNTUNE_REQUIRE_GPU();
  check_head_dim(112);
}

TEST(FlashFwdWgmmaVariants, D192) {
  ATTNTUNE_REQUIRE_GPU();
  check_head_dim(192);
}

TEST(FlashFwdWgmmaVariants, D160) {
  ATTNTUNE_REQUIRE_GPU();
  check_head_dim(160);
}

TEST(FlashFwdWgmmaVariants, D32) {
  ATTNTUNE_REQUIRE_GPU();
  check_head_dim(32);
}

// fa4_loop's three loops on every variant and entry point: causal and two-sided windows (the masked
// front, the unmasked middle, the window's masked left edge), soft-caps, sinks, KV caches and packed
// batches.
TEST(FlashFwdWgmmaVariants, Fa4Loop) {
  ATTNTUNE_REQUIRE_GPU();
  const auto fa4 = [](const Config& c) { return flag(c, "fa4_loop"); };
  check_head_dim(128, fa4);
  check_head_dim(64, fa4);
}

// pp_pv on every variant and entry point: a window's idle iterations after the warpgroup's last
// computed tile come after its extra turn (the last P.V's), and rows that see no key take the extra
// turn idle; soft-caps, sinks, KV caches and packed batches.
TEST(FlashFwdWgmmaVariants, PpPv) {
  ATTNTUNE_REQUIRE_GPU();
  const auto pv = [](const Config& c) { return flag(c, "pp_pv"); };
  check_head_dim(128, pv);
  check_head_dim(64, pv);
}

// mask_bits (a masked tile's visible keys as bits, R2P): both bounds of two-sided windows, causal
// windows, sinks and soft-caps, on every entry point (ragged KV caches and packed batches, whose
// sequences end inside tiles).
TEST(FlashFwdWgmmaVariants, MaskBits) {
  ATTNTUNE_REQUIRE_GPU();
  const auto bits = [](const Config& c) { return flag(c, "mask_bits"); };
  check_head_dim(128, bits);
  check_head_dim(64, bits);
}
}  // namespace test_flash_fwd_wgmma_variants
