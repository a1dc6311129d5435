// flash_decode's attention variants on the CPU (issue 41): its space serves sliding windows,
// soft-caps and sinks (alone and together, dense and paged, every head dim) on every arch it
// targets, and renders each only into the builds of problems with it; the plan serves exactly a
// build's variants, splits only the keys a window spans (the decode bars' shapes: gpt-oss's window
// of 128, Mistral's of 4096 over 32768 keys against 4096 keys) and hands the kernels window sides
// they cannot overflow with; and sampled variant configs (all three variants at once, the most
// registers) NVRTC-compile for sm_80, sm_89 and sm_90 without spills.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cuda/nvrtc.hpp"
#include "eval/build_pool.hpp"
#include "tests/common/plan_call.hpp"
#include "tests/common/run_attntune.hpp"
#include "templates/flash_decode/launch.h"

namespace test_flash_decode_variants {
using namespace attntune;

namespace {

SearchSpace load_space() { return SearchSpace::load(ATTNTUNE_SOURCE_DIR "/search_spaces/flash_decode.yaml"); }

// The decode rows of issue 41's bars and variants of them.
const char* kVariantRows[] = {
    "b=64,h=64,hkv=8,s=1,sk=32768,d=64,dtype=bf16,causal=1,sinks=1,page=16",             // gpt-oss full layer
    "b=64,h=64,hkv=8,s=4,sk=32768,d=64,dtype=bf16,causal=1,window=128,sinks=1,page=16",  // gpt-oss window layer
    "b=1,h=32,hkv=8,s=1,sk=32768,d=128,dtype=bf16,causal=1,window=4096",                 // Mistral
    "b=16,h=16,hkv=8,s=1,sk=8192,d=256,dtype=bf16,causal=0,softcap=50",                  // Gemma-2
    "b=16,h=16,hkv=8,s=2,sk=8192,d=256,dtype=fp16,causal=1,window=4096,softcap=50",      // Gemma-2 window layer
    "b=4,h=8,hkv=2,s=3,sk=1000,d=128,dtype=fp16,causal=0,window=127,64,softcap=30,sinks=1",
};

std::int64_t define(const Defines& defs, const char* name) {
  for (const auto& [k, v] : defs)
    if (k == name) return v;
  return -1;
}

// A config of `space` for `p` on sm_90 with the given combine and kv_load ("" any).
Config pick(const SearchSpace& space, const Problem& p, const char* combine, const char* kv_load = "") {
  return attntune::testing::first_config(space, p, "sm_90", [&](const Config& c) {
    return std::get<std::string>(c.at("combine")) == combine &&
           (!*kv_load || std::get<std::string>(c.at("kv_load")) == kv_load);
  });
}

// The call of problem p as the plan sees it (dense; page > 0: the kvcache entry on pages).
attntune_plan::Call call_of(const Problem& p) {
  attntune_plan::Call c = attntune::testing::dense_call_of(p);
  c.window_left = static_cast<int>(p.window_left);
  c.window_right = static_cast<int>(p.window_right);
  c.softcap = static_cast<float>(p.softcap);
  c.sinks = p.sinks ? reinterpret_cast<const float*>(std::uintptr_t{1} << 36) : nullptr;
  if (p.paged()) {
    c.entry = attntune_plan::kEntryKvcache;
    c.block_table = reinterpret_cast<const int*>(std::uintptr_t{1} << 38);
    c.cache_seqlens = reinterpret_cast<const int*>(std::uintptr_t{1} << 39);
    c.page_size = static_cast<int>(p.page);
    c.max_blocks_per_seq = static_cast<int>((p.sk + p.page - 1) / p.page);
    for (long long* st : {c.k_stride, c.v_stride}) {
      st[0] = p.page * p.hkv * p.d;
      st[1] = p.d;
      st[2] = p.hkv * p.d;
    }
  }
  return c;
}

struct Planned {
  attntune_plan::Plan plan;
  att::DecodeParams params;  // what bind gives the main kernel
  std::string why;
};

// Plans and binds `call` for the build of (config, built) on a device of `sms` SMs.
Planned plan_and_bind(const SearchSpace& space, const Config& config, const Problem& built,
                      const attntune_plan::Call& call, int sms = 132) {
  Planned out;
  std::memset(&out.params, 0, sizeof out.params);
  const Defines named = kernel_defines(space, config, built, "sm_90");
  const auto defs = plan_defines(named);  // names point into `named`
  attntune_plan::Consts consts{};
  attntune_plan::Why why{};
  if (attntune_plan::kFlashDecode.load(defs.data(), static_cast<int>(defs.size()), consts.bytes, &why)) {
    out.why = why.text;
    return out;
  }
  const attntune::testing::FakeDevice dev{sms};
  if (attntune_plan::kFlashDecode.plan(consts.bytes, call, dev.device(), &out.plan, &why)) {
    out.why = why.text;
    return out;
  }
  attntune_plan::Resources res{};
  for (int i = 0; i < out.plan.workspaces; ++i) res.workspace[i] = reinterpret_cast<void*>((std::uintptr_t{1} << 41) * (i + 1));
  for (int i = 0; i < out.plan.maps; ++i) res.map[i] = reinterpret_cast<const void*>((std::uintptr_t{1} << 42) + 128 * i);
  attntune_plan::Args args;
  if (out.plan.launches > 0 && attntune_plan::kFlashDecode.bind(consts.bytes, call, out.plan, res, 0, &args, &why)) {
    out.why = why.text;
    return out;
  }
  if (args.count > 0) std::memcpy(&out.params, args.ptr[0], sizeof out.params);
  return out;
}

// Splits the plan gives each unit (grid.x / row blocks).
int splits_of(const Planned& p, const Problem& prob, const Defines& defs) {
  const std::int64_t rows = prob.h / prob.hkv * prob.s, bm = define(defs, "BLOCK_M");
  return static_cast<int>(p.plan.launch[0].grid[0] / ((rows + bm - 1) / bm));
}

}  // namespace

TEST(FlashDecodeVariants, TheSpaceServesEveryVariantOnEveryArch) {
  const SearchSpace space = load_space();
  for (const char* row : kVariantRows) {
    const Problem p = Problem::parse(row);
    ASSERT_TRUE(p.has_variant()) << row;
    EXPECT_NO_THROW(space.check_problem(p, "sm_90")) << row;
    EXPECT_GT(space.count(p, "sm_90"), 8u) << row;
    EXPECT_GT(space.count(p, "sm_80"), 0u) << row;
    EXPECT_GT(space.count(p, "sm_89"), 0u) << row;
    // The plain shape's configs, less (window, soft-cap) those held at a register cap that the
    // variants' few registers more would spill (the space's last constraints).
    Problem plain = p;
    plain.window_left = plain.window_right = -1;
    plain.softcap = 0;
    plain.sinks = false;
    const std::uint64_t all = space.count(plain, "sm_90"), served = space.count(p, "sm_90");
    if (p.windowed() || p.softcapped()) {
      EXPECT_LE(served, all) << row;
      EXPECT_GE(served * 10, all * 8) << row << ": most of the plain configs serve the variants";
    } else {
      EXPECT_EQ(served, all) << row;
    }
    // Each variant reaches the build as its define, and only its own.
    const Config c = attntune::testing::first_config(space, p, "sm_90", [](const Config&) { return true; });
    const Defines defs = kernel_defines(space, c, p, "sm_90");
    EXPECT_EQ(define(defs, "ATT_WINDOW"), p.windowed() ? 1 : -1) << row;
    EXPECT_EQ(define(defs, "ATT_SOFTCAP"), p.softcapped() ? 1 : -1) << row;
    EXPECT_EQ(define(defs, "ATT_SINKS"), p.sinks ? 1 : -1) << row;
    const Defines plain_defs = kernel_defines(space, c, plain, "sm_90");
    EXPECT_EQ(define(plain_defs, "ATT_WINDOW"), -1);
    EXPECT_EQ(define(plain_defs, "ATT_SOFTCAP"), -1);
    EXPECT_EQ(define(plain_defs, "ATT_SINKS"), -1);
    EXPECT_NE(render_kernel(space, c, p, "sm_90").source_hash, render_kernel(space, c, plain, "sm_90").source_hash);
  }
}

TEST(FlashDecodeVariants, APlanServesExactlyItsBuildsVariants) {
  const SearchSpace space = load_space();
  const Problem windowed = Problem::parse(kVariantRows[2]);
  Problem plain = windowed;
  plain.window_left = -1;
  const Config c = pick(space, windowed, "last_cta");
  ASSERT_FALSE(c.empty());
  // A plain build refuses a windowed call and a window build a plain one, each with the reason.
  Planned p = plan_and_bind(space, c, plain, call_of(windowed));
  EXPECT_NE(p.why.find("sliding window"), std::string::npos) << p.why;
  p = plan_and_bind(space, c, windowed, call_of(plain));
  EXPECT_NE(p.why.find("sliding window"), std::string::npos) << p.why;
  // A sinks build needs the sinks (a null pointer is a call without them), and a soft-cap build
  // a cap.
  const Problem sinks = Problem::parse(kVariantRows[0]);
  attntune_plan::Call no_sinks = call_of(sinks);
  no_sinks.sinks = nullptr;
  p = plan_and_bind(space, pick(space, sinks, "last_cta"), sinks, no_sinks);
  EXPECT_NE(p.why.find("attention sinks"), std::string::npos) << p.why;
  const Problem capped = Problem::parse(kVariantRows[3]);
  attntune_plan::Call no_cap = call_of(capped);
  no_cap.softcap = 0;
  p = plan_and_bind(space, pick(space, capped, "last_cta"), capped, no_cap);
  EXPECT_NE(p.why.find("soft-cap"), std::string::npos) << p.why;
  // The matching calls plan, and bind hands the kernels the variants' values.
  for (const char* row : kVariantRows) {
    const Problem v = Problem::parse(row);
    const Planned ok = plan_and_bind(space, pick(space, v, "last_cta"), v, call_of(v));
    ASSERT_EQ(ok.why, "") << row;
    EXPECT_EQ(ok.params.variant.window_left, v.window_left) << row;
    EXPECT_EQ(ok.params.variant.window_right, v.window_right) << row;
    EXPECT_EQ(ok.params.variant.softcap, static_cast<float>(v.softcap)) << row;
    EXPECT_EQ(ok.params.variant.sinks != nullptr, v.sinks) << row;
    if (v.softcapped()) {
      // The capped score is scaled already: exp2 takes log2(e).
      EXPECT_FLOAT_EQ(ok.params.scale_log2, 1.4426950408889634f) << row;
      EXPECT_FLOAT_EQ(ok.params.variant.softcap_scale, 0.125f / static_cast<float>(v.softcap)) << row;
    }
  }
}

TEST(FlashDecodeVariants, AWindowSplitsOnlyTheKeysItSpans) {
  const SearchSpace space = load_space();
  for (const char* combine : {"kernel", "last_cta", "cluster2", "cluster8"}) {
    // Mistral-like: the window of 4096 keys left of the diagonal over 32768 keys (4097 keys) is
    // split by its keys, like a sequence of 4096 keys (split.h's test compares the two), not like
    // 32768.
    Problem win = Problem::parse(kVariantRows[2]);
    const Config c = pick(space, win, combine);
    ASSERT_FALSE(c.empty()) << combine;
    const Defines defs = kernel_defines(space, c, win, "sm_90");
    const std::int64_t block_n = define(defs, "BLOCK_N"), ctas = define(defs, "CTAS_PER_SM");
    const int cluster = static_cast<int>(define(defs, "CLUSTER"));
    const Planned windowed = plan_and_bind(space, c, win, call_of(win));
    ASSERT_EQ(windowed.why, "") << combine;
    const int want = att::grid_splits(
        att::decode_splits_keys(8, 4097, static_cast<int>(block_n), 132, static_cast<int>(ctas)), cluster);
    EXPECT_EQ(splits_of(windowed, win, defs), want) << combine;
    // The same build at 4096 keys (the window covers them all).
    Problem short_seq = win;
    short_seq.sk = 4096;
    const Planned at4k = plan_and_bind(space, c, win, call_of(short_seq));
    ASSERT_EQ(at4k.why, "") << combine;
    EXPECT_EQ(splits_of(at4k, short_seq, defs),
              att::grid_splits(att::decode_splits_keys(8, 4096, static_cast<int>(block_n), 132, static_cast<int>(ctas)),
                               cluster))
        << combine;
    // Without the window the 32768 keys split by their own count.
    Problem plain = win;
    plain.window_left = -1;
    const Planned full = plan_and_bind(space, c, plain, call_of(plain));
    EXPECT_EQ(splits_of(full, plain, defs),
              att::grid_splits(att::decode_splits(8, (32768 + block_n - 1) / block_n, 132, static_cast<int>(ctas)),
                               cluster))
        << combine;
  }
  // gpt-oss-like window layer: 512 units of a window of 128 (3 or 4 tiles of 64): one split, no
  // workspace, one kernel.
  const Problem oss = Problem::parse(kVariantRows[1]);
  const Config c = pick(space, oss, "kernel");
  const Planned p = plan_and_bind(space, c, oss, call_of(oss));
  ASSERT_EQ(p.why, "");
  EXPECT_EQ(splits_of(p, oss, kernel_defines(space, c, oss, "sm_90")), 1);
  EXPECT_EQ(p.plan.launches, 1);
  EXPECT_EQ(p.plan.workspaces, 0);
}

TEST(FlashDecodeVariants, WindowSidesReachTheKernelsWithoutOverflow) {
  const SearchSpace space = load_space();
  Problem p = Problem::parse("b=2,h=8,hkv=2,s=4,sk=1000,d=128,dtype=bf16,causal=0,window=127,64");
  const Config c = pick(space, p, "last_cta");
  attntune_plan::Call call = call_of(p);
  Planned b = plan_and_bind(space, c, p, call);
  ASSERT_EQ(b.why, "");
  EXPECT_EQ(b.params.variant.window_left, 127);
  EXPECT_EQ(b.params.variant.window_right, 64);
  // Sides of 2^31 - 1 keys see what unbounded sides see; the kernels get at most seqlen_k +
  // seqlen_q, so row + diag - left cannot wrap around.
  call.window_left = call.window_right = 2147483647;
  b = plan_and_bind(space, c, p, call);
  ASSERT_EQ(b.why, "");
  EXPECT_EQ(b.params.variant.window_left, 1004);
  EXPECT_EQ(b.params.variant.window_right, 1004);
  // And the split count is that of an unbounded window: every tile.
  call.window_right = -1;
  const Planned wide = plan_and_bind(space, c, p, call);
  Problem none = p;
  none.window_left = none.window_right = -1;
  const Planned unbounded = plan_and_bind(space, c, none, call_of(none));
  EXPECT_EQ(wide.plan.launch[0].grid[0], unbounded.plan.launch[0].grid[0]);
}

// The n configs of p's space with the least register headroom under their launch bounds, then n
// more spread over the others: where a variant's few registers would spill first. The registers a
// thread may have: each of an SM's 4 schedulers holds 16384 for its share of the resident warps
// (threads * ctas_per_sm / 32 over 4, rounded up), in steps of 8, at most 255 (ptxas holds a TMA
// build of 5 warps, 2 CTAs an SM, to 168); the headroom is that less the space's est_regs.
std::vector<Config> tightest_and_spread(const SearchSpace& space, const Problem& p, const std::string& arch,
                                        std::size_t n) {
  std::vector<std::pair<std::int64_t, Config>> by_room;
  for (const Config& c : space.enumerate(p, arch)) {
    std::int64_t threads = 0, est = 0;
    for (const auto& [k, v] : space.derive(c, p, arch)) {
      if (k == "threads") threads = v;
      if (k == "est_regs") est = v;
    }
    const std::int64_t ctas = std::get<std::int64_t>(c.at("ctas_per_sm"));
    const std::int64_t warps_per_scheduler = (threads * ctas / 32 + 3) / 4;
    const std::int64_t cap = std::min<std::int64_t>(255, 16384 / (warps_per_scheduler * 32) / 8 * 8);
    by_room.push_back({cap - est, c});
  }
  std::stable_sort(by_room.begin(), by_room.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Config> out;
  const std::size_t tight = std::min(n, by_room.size());
  for (std::size_t i = 0; i < tight; ++i) out.push_back(by_room[i].second);
  const std::size_t rest = by_room.size() - tight, m = std::min(n, rest);
  for (std::size_t i = 0; i < m; ++i) out.push_back(by_room[tight + i * rest / m].second);
  return out;
}

class FlashDecodeVariantBuild : public ::testing::TestWithParam<std::tuple<int, const char*>> {};

// Every variant at once (the most registers: a window's per-row bounds, the soft-cap's tanh, the
// sink in the epilogues), dense and paged, causal and not: the configs nearest their register cap
// and a spread of the others build with no spills (the space holds no spilling config).
TEST_P(FlashDecodeVariantBuild, ConfigsWithEveryVariantCompileWithoutSpills) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const auto [d, arch] = GetParam();
  const SearchSpace space = load_space();
  const std::size_t n = attntune::testing::build_sample(2);
  BuildPoolOptions pool_opts;
  pool_opts.nvrtc_options = family_nvrtc_options("flash_decode");
  pool_opts.worker_argv = {attntune::testing::attntune_bin(), "build-worker"};
  BuildPool pool(pool_opts);
  std::size_t submitted = 0;
  for (const char* kind : {"h=32,hkv=8,s=1,causal=1,window=4096,softcap=30,sinks=1",
                           "h=64,hkv=8,s=4,causal=0,window=127,64,softcap=50,sinks=1,page=16"}) {
    const Problem p = Problem::parse(fmt::format("b=4,{},sk=4096,d={},dtype=bf16", kind, d));
    const std::vector<Config> configs = tightest_and_spread(space, p, arch, n);
    ASSERT_FALSE(configs.empty()) << p.str();
    for (const Config& c : configs) {
      Problem v = p;
      v.dtype = submitted++ % 2 ? DType::kFp16 : DType::kBf16;
      pool.submit({c, render_kernel(space, c, v, arch), arch});
    }
  }
  std::size_t built = 0;
  while (auto o = pool.next()) {
    ++built;
    EXPECT_EQ(o->build.status, "ok") << config_str(o->job.config) << "\n" << o->build.log;
    EXPECT_EQ(o->build.spill_stores + o->build.spill_loads, 0)
        << config_str(o->job.config) << ": " << o->build.registers << " registers";
    EXPECT_GT(o->build.registers, 0) << "ptxas resource report missing";
    if (std::getenv("ATTNTUNE_BUILD_REPORT"))
      std::printf("%s %s: %d registers, spills %d/%d\n", arch, config_str(o->job.config).c_str(), o->build.registers,
                  o->build.spill_stores, o->build.spill_loads);
  }
  EXPECT_EQ(built, submitted);
}

INSTANTIATE_TEST_SUITE_P(DimsAndArchs, FlashDecodeVariantBuild,
                         ::testing::Combine(::testing::Values(64, 128, 256), ::testing::Values("sm_80", "sm_89", "sm_90")),
                         [](const auto& info) {
                           return fmt::format("d{}_{}", std::get<0>(info.param), std::get<1>(info.param));
                         });
}  // namespace test_flash_decode_variants
