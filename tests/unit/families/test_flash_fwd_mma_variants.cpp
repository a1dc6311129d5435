// flash_fwd_mma's attention variants (sliding windows, logit soft-caps, sinks; issue 41) on CI (no
// GPU): the space serves them on every entry point with the plain problem's configs, a problem
// renders exactly its variants' switches (their values are run-time arguments), the launch plan
// serves exactly the build's variants and binds their values, NVRTC builds of variant configs for
// every arch the space lists spill no more than the same config's plain build (ptxas's registers
// and spills printed), and the soft-cap's tanh takes the form traits.cuh picks for the arch and
// head dim. tests/gpu/test_flash_fwd_mma_variants.cpp checks the values against the reference.
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cuda/nvrtc.hpp"
#include "eval/build_pool.hpp"
#include "templates/flash_fwd_mma/launch.h"
#include "tests/common/plan_call.hpp"
#include "tests/common/run_attntune.hpp"

namespace test_flash_fwd_mma_variants {
using namespace attntune;
using attntune::testing::dense_call_of;
using attntune::testing::FakeDevice;
using attntune::testing::space_of;
using attntune::testing::varlen_call_of;

namespace {

// The entry points' problem kinds, and a spec's variants appended.
const char* const kEntries[] = {
    "b=4,h=16,hkv=4,s=4096,d={d},dtype=bf16",                   // dense
    "b=4,h=32,hkv=8,s=2048,sk=10240,d={d},dtype=bf16,page=16",  // kvcache
    "b=8,h=16,s=4096,d={d},dtype=bf16,varlen=64",               // varlen
};
Problem problem(const char* entry, int d, const std::string& variants) {
  return Problem::parse(fmt::format(fmt::runtime(entry), fmt::arg("d", d)) + "," + variants);
}

// A rendered source past its first line (the comment naming the candidate's problem).
std::string code(const std::string& source) { return source.substr(source.find('\n') + 1); }

// The call of p's entry point with p's variants (sinks at a fake device address).
attntune_plan::Call call_of(const Problem& p) {
  attntune_plan::Call c = p.is_varlen() ? varlen_call_of(p) : dense_call_of(p);
  if (p.paged()) {
    c.entry = attntune_plan::kEntryKvcache;
    c.cache_seqlens = reinterpret_cast<const int*>(1ll << 40);
  }
  c.window_left = static_cast<int>(p.window_left);
  c.window_right = static_cast<int>(p.window_right);
  c.softcap = static_cast<float>(p.softcap);
  c.sinks = p.sinks ? reinterpret_cast<const float*>(1ll << 42) : nullptr;
  return c;
}

}  // namespace

TEST(FlashFwdMmaVariants, TheSpaceServesEveryVariantOnEveryEntryPoint) {
  const SearchSpace space = space_of("flash_fwd_mma");
  auto get = [](const Config& c, const char* k) { return std::get<std::int64_t>(c.at(k)); };
  for (const char* entry : kEntries)
    for (int d : {64, 128, 256})
      for (const char* v : {"causal=1,window=128", "causal=0,window=4096,64", "causal=1,softcap=50", "causal=0,sinks=1",
                            "causal=1,window=128,softcap=30,sinks=1"}) {
        // The plain problem's configs (a variant needs no tunable of its own) but those whose
        // variant builds spilled where the plain ones did not (the space's whys): with a window or
        // a soft-cap, 2 row tiles a warp at d=128; with a window, Q in registers at d=256,
        // 128-key score steps beside 2 row tiles or d=256, and blockwise's two 8-warp blocks an SM.
        const Problem p = problem(entry, d, v), plain = problem(entry, d, p.causal ? "causal=1" : "causal=0");
        std::vector<Config> expected = space.enumerate(plain, "sm_90");
        std::erase_if(expected, [&](const Config& c) {
          const std::int64_t m_tiles = get(c, "block_m") / get(c, "warps") / 16;
          if ((p.windowed() || p.softcapped()) && m_tiles == 2 && d == 128) return true;
          if (p.windowed() && d == 256 && std::get<bool>(c.at("q_in_regs"))) return true;
          if (p.windowed() && get(c, "warps") == 8 && get(c, "min_blocks") == 2 &&
              std::get<std::string>(c.at("kv_schedule")) == "blockwise")
            return true;
          return p.windowed() && get(c, "sub_n") == 128 && (m_tiles == 2 || d == 256);
        });
        EXPECT_FALSE(expected.empty()) << p.str();
        EXPECT_EQ(space.enumerate(p, "sm_90"), expected) << p.str();
        EXPECT_GT(space.count(p, "sm_80"), 0u) << p.str();
      }
}

// The other head dims (issue 44) keep a margin under the register cap that ptxas measured
// (search_spaces/flash_fwd_mma.yaml): plain configs est_regs <= 200 with 2 row tiles a warp, 216
// with 1, in two 8-warp blocks an SM 112 (blockwise 96); with a variant <= 184 (the same in two
// 8-warp blocks), besides the constraints of every head dim (a window's 128-key score steps beside 2 row tiles, and beside blockwise's stages
// in two 8-warp blocks an SM).
TEST(FlashFwdMmaVariants, OtherHeadDimsKeepARegisterMargin) {
  const SearchSpace space = space_of("flash_fwd_mma");
  auto get = [](const Config& c, const char* k) { return std::get<std::int64_t>(c.at(k)); };
  for (const char* entry : kEntries)
    for (int d : {32, 80, 96, 112, 160, 192, 240})
      for (const char* v : {"causal=1,window=128", "causal=0,softcap=30", "causal=1,sinks=1",
                            "causal=1,window=128,softcap=30,sinks=1"}) {
        const Problem p = problem(entry, d, v), plain = problem(entry, d, p.causal ? "causal=1" : "causal=0");
        auto est = [&](const Config& c) {
          for (const auto& [name, value] : space.derive(c, plain, "sm_90"))
            if (name == "est_regs") return value;
          ADD_FAILURE() << "no est_regs";
          return std::int64_t{0};
        };
        auto capped = [&](const Config& c) { return get(c, "warps") == 8 && get(c, "min_blocks") == 2; };
        auto cap_margin = [&](const Config& c) {
          return std::get<std::string>(c.at("kv_schedule")) == "blockwise" ? 96 : 112;
        };
        std::vector<Config> expected = space.enumerate(plain, "sm_90");
        for (const Config& c : expected) {
          const std::int64_t m_tiles = get(c, "block_m") / get(c, "warps") / 16;
          EXPECT_LE(est(c), capped(c) ? cap_margin(c) : m_tiles == 2 ? 200 : 216) << d << " " << config_str(c);
        }
        std::erase_if(expected, [&](const Config& c) {
          const std::int64_t m_tiles = get(c, "block_m") / get(c, "warps") / 16;
          if (est(c) > (capped(c) ? cap_margin(c) : 184)) return true;
          if (p.windowed() && capped(c) && std::get<std::string>(c.at("kv_schedule")) == "blockwise") return true;
          return p.windowed() && get(c, "sub_n") == 128 && m_tiles == 2;
        });
        EXPECT_FALSE(expected.empty()) << p.str();
        EXPECT_EQ(space.enumerate(p, "sm_90"), expected) << p.str();
        EXPECT_GT(space.count(p, "sm_80"), 0u) << p.str();
        EXPECT_GT(space.count(p, "sm_89"), 0u) << p.str();
      }
}

// Only a problem with a variant renders its switch, so plain builds render as they did; the
// window's sides and the cap are run-time arguments: other values render the same code.
TEST(FlashFwdMmaVariants, AProblemRendersExactlyItsVariants) {
  const SearchSpace space = space_of("flash_fwd_mma");
  for (const char* entry : kEntries) {
    const Problem plain = problem(entry, 64, "causal=1");
    const Config c = space.enumerate(plain, "sm_89").front();
    const RenderedKernel k = render_kernel(space, c, plain, "sm_89");
    for (const char* sw : {"#define ATT_WINDOW 1", "#define ATT_SOFTCAP 1", "#define ATT_SINKS 1"})
      EXPECT_EQ(k.source.find(sw), std::string::npos) << sw;
    struct Case {
      const char* variants;
      const char* same;  // other values, the same build
      std::vector<const char*> switches;
    } cases[] = {
        {"causal=1,window=128", "causal=1,window=4096", {"ATT_WINDOW"}},
        {"causal=0,window=128,64", "causal=0,window=-1,7", {"ATT_WINDOW"}},
        {"causal=1,softcap=30", "causal=1,softcap=50", {"ATT_SOFTCAP"}},
        {"causal=1,sinks=1", "causal=1,sinks=1", {"ATT_SINKS"}},
        {"causal=1,window=128,softcap=30,sinks=1", "causal=1,window=1,softcap=7.5,sinks=1",
         {"ATT_WINDOW", "ATT_SOFTCAP", "ATT_SINKS"}},
    };
    for (const Case& x : cases) {
      const Problem p = problem(entry, 64, x.variants);
      const RenderedKernel v = render_kernel(space, c, p, "sm_89");
      for (const char* sw : x.switches) EXPECT_NE(v.source.find(fmt::format("#define {} 1\n", sw)), std::string::npos) << sw;
      EXPECT_NE(v.source_hash, k.source_hash) << x.variants;
      // The values are not in the code (the first line, a comment, names the problem's).
      EXPECT_EQ(code(render_kernel(space, c, problem(entry, 64, x.same), "sm_89").source), code(v.source)) << x.variants;
    }
  }
}

// A build serves exactly its variants (a windowed call never runs a full-attention kernel, nor the
// reverse), on its own entry point, and binds the call's values into AttnParams' variant.
TEST(FlashFwdMmaVariants, ThePlanServesExactlyTheBuildsVariantsAndBindsTheirValues) {
  const SearchSpace space = space_of("flash_fwd_mma");
  const auto dev = FakeDevice{}.device();
  for (const char* entry : kEntries) {
    const Problem windowed = problem(entry, 128, "causal=1,window=128,sinks=1");
    const Problem capped = problem(entry, 128, "causal=0,softcap=30");
    const Problem plain = problem(entry, 128, "causal=1");
    const Config c = space.enumerate(plain, "sm_90").front();
    const auto wk = render_kernel(space, c, windowed, "sm_90").launch;
    std::string why;
    // Its own variants, any values.
    for (const char* v : {"causal=1,window=128,sinks=1", "causal=1,window=0,sinks=1"}) {
      const auto plan = plan_call(wk, call_of(problem(entry, 128, v)), dev, &why);
      ASSERT_TRUE(plan) << why;
      EXPECT_EQ(plan->launch[0].grid[0], static_cast<unsigned>((plain.s + std::get<std::int64_t>(c.at("block_m")) - 1) /
                                                               std::get<std::int64_t>(c.at("block_m"))));
    }
    // Anything else: refused, naming both.
    for (const Problem& other : {plain, problem(entry, 128, "causal=1,window=128"), problem(entry, 128, "causal=1,sinks=1"),
                                 problem(entry, 128, "causal=1,window=128,softcap=30,sinks=1")}) {
      EXPECT_FALSE(plan_call(wk, call_of(other), dev, &why)) << other.str();
      EXPECT_NE(why.find("built for a sliding window, attention sinks"), std::string::npos) << why;
    }
    EXPECT_FALSE(plan_call(render_kernel(space, c, plain, "sm_90").launch, call_of(windowed), dev, &why));
    EXPECT_NE(why.find("no variant (plain attention)"), std::string::npos) << why;

    // The values travel in AttnParams' variant; a soft-cap's scores are scaled once capped.
    const auto ck = render_kernel(space, c, capped, "sm_90");
    const attntune_plan::Call call = call_of(capped);
    const auto plan = plan_call(ck.launch, call, dev, &why);
    ASSERT_TRUE(plan) << why;
    const auto consts = launch_constants<attntune_plan::FlashFwdMmaLaunch>(ck.launch.defines, "flash_fwd_mma");
    attntune_plan::Resources res{};
    attntune_plan::Args args;
    attntune_plan::Why bwhy;
    ASSERT_EQ(consts.bind(call, *plan, res, 0, &args, &bwhy), 0) << bwhy.text;
    AttnParams a;
    std::memcpy(&a, args.ptr[0], sizeof a);
    EXPECT_EQ(a.variant.window_left, -1);
    EXPECT_EQ(a.variant.window_right, -1);
    EXPECT_FLOAT_EQ(a.variant.softcap, 30.f);
    EXPECT_FLOAT_EQ(a.variant.softcap_scale, call.scale / 30.f);
    EXPECT_FLOAT_EQ(a.scale_log2, 1.4426950408889634f);
    EXPECT_EQ(a.variant.sinks, nullptr);
  }
}

// NVRTC builds of variant configs, every arch the space lists, every entry point and head dim
// over the sample: each compiles, and spills nothing where the same config's plain build spills
// nothing. ATTNTUNE_BUILD_SAMPLE configs per (arch, variant), default 1 (0: 4); the registers and
// spills are printed beside the plain build's.
class FlashFwdMmaVariantBuild : public ::testing::TestWithParam<const char*> {};

TEST_P(FlashFwdMmaVariantBuild, CompilesWithoutNewSpills) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const std::string arch = GetParam();
  std::size_t n = attntune::testing::build_sample(1);
  if (n == 0) n = 4;
  const SearchSpace space = space_of("flash_fwd_mma");
  BuildPoolOptions pool_opts;
  pool_opts.nvrtc_options = family_nvrtc_options("flash_fwd_mma");
  pool_opts.worker_argv = {attntune::testing::attntune_bin(), "build-worker"};
  BuildPool pool(pool_opts);
  struct Job {
    std::string what;
    bool plain;
    std::uint64_t pair;  // the plain and variant builds of one config share it
  };
  std::map<std::uint64_t, Job> jobs;
  const char* kinds[] = {"causal=1,window=128", "causal=0,window=128,64", "causal=1,softcap=30", "causal=0,sinks=1",
                         "causal=1,window=128,softcap=30,sinks=1"};
  std::uint64_t pairs = 0, turn = 0;
  for (const char* kind : kinds) {
    for (std::size_t i = 0; i < n; ++i, ++turn) {
      const int d = turn % 3 == 0 ? 64 : turn % 3 == 1 ? 128 : 256;
      const char* entry = kEntries[(turn / 3) % 3];
      const Problem p = problem(entry, d, kind);
      Problem plain = p;
      plain.set_variants("");
      const std::vector<Config> all = space.enumerate(p, arch);
      if (all.empty()) continue;
      const Config& c = all[(i * all.size() / n + turn * 7919) % all.size()];
      const std::string what = fmt::format("{} {} {}", arch, p.str(), config_str(c));
      jobs[pool.submit({c, render_kernel(space, c, p, arch), arch})] = {what, false, pairs};
      jobs[pool.submit({c, render_kernel(space, c, plain, arch), arch})] = {what, true, pairs};
      ++pairs;
    }
  }
  ASSERT_GT(pairs, 0u);
  struct Result {
    int regs = -1, spills = 0;
  };
  std::map<std::uint64_t, std::pair<Result, Result>> results;  // pair -> (plain, variant)
  while (auto o = pool.next()) {
    const Job& j = jobs.at(o->ticket);
    EXPECT_EQ(o->build.status, "ok") << j.what << "\n" << o->build.log;
    Result& r = j.plain ? results[j.pair].first : results[j.pair].second;
    r.regs = o->build.registers;
    r.spills = o->build.spill_stores + o->build.spill_loads;
  }
  for (const auto& [pair, r] : results) {
    std::string what;
    for (const auto& [t, j] : jobs) {
      if (j.pair == pair) what = j.what;
    }
    std::printf("%s: plain %d registers %d spilled, variant %d registers %d spilled\n", what.c_str(), r.first.regs,
                r.first.spills, r.second.regs, r.second.spills);
    if (r.first.spills == 0) {
      EXPECT_EQ(r.second.spills, 0) << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, FlashFwdMmaVariantBuild, ::testing::Values("sm_80", "sm_86", "sm_89", "sm_90"),
                         [](const auto& info) { return std::string(info.param); });

// The soft-cap's tanh (kernel.cu, softcap_scores): the MUFU form by default on every arch and head
// dim, Newton's reciprocal when ATT_SOFTCAP_NEWTON=1 (how the harness measures it); both compile.
TEST(FlashFwdMmaVariants, TheSoftcapsTanhTakesTheFormTheTraitsPick) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = space_of("flash_fwd_mma");
  struct Case {
    const char* arch;
    int d;
    const char* force;  // prepended to the source
    bool newton;
  } cases[] = {
      {"sm_90", 64, "", false},  {"sm_90", 128, "", false}, {"sm_80", 64, "", false},
      {"sm_89", 256, "", false}, {"sm_90", 64, "#define ATT_SOFTCAP_NEWTON 1\n", true},
      {"sm_80", 128, "#define ATT_SOFTCAP_NEWTON 1\n", true},
  };
  for (const Case& k : cases) {
    const Problem p = problem(kEntries[0], k.d, "causal=1,softcap=30");
    const Config c = space.enumerate(p, k.arch).front();
    cuda::CompileOptions opts{k.arch, family_nvrtc_options("flash_fwd_mma"), true, 0};
    const auto out = cuda::nvrtc_compile(k.force + render_kernel(space, c, p, k.arch).source, "k.cu", opts);
    ASSERT_TRUE(out.ok) << k.arch << " d=" << k.d << "\n" << out.log;
    // The MUFU form's reciprocal is the only rcp.approx.ftz of a soft-cap build.
    EXPECT_EQ(out.ptx.find("rcp.approx.ftz.f32") == std::string::npos, k.newton) << k.arch << " d=" << k.d << " " << k.force;
  }
}
}  // namespace test_flash_fwd_mma_variants
