// flash_bwd_wgmma on CI (no GPU): its space (which problems, sm_90a only, no config that spills),
// its render, its launch plan (three kernels, their grids, the shared memory the layout needs, the
// workspaces, the refusals) and NVRTC builds of every config of d=64 and d=128 for sm_90a, without
// spills. The GPU property test (tests/gpu/test_flash_bwd_wgmma.cpp) runs them against the reference.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "cuda/nvrtc.hpp"
#include "eval/build_pool.hpp"
#include "tests/common/input_error.hpp"
#include "tests/common/plan_call.hpp"
#include "tests/common/run_attntune.hpp"
#include "tests/common/sass.hpp"

namespace test_flash_bwd_wgmma {
using namespace attntune;
using attntune::testing::backward_call_of;
using attntune::testing::dense_call_of;
using attntune::testing::FakeDevice;
using attntune::testing::space_of;

namespace {

std::int64_t get(const Config& c, const char* name) { return std::get<std::int64_t>(c.at(name)); }

// The shared memory the kernel's layout takes (templates/flash_bwd_wgmma/traits.cuh), computed here
// independently of the space's formula.
long long smem_of(const Config& c, long long d) {
  d = d <= 64 ? 64 : d <= 128 ? 128 : 256;  // the padded head dim the kernels compute over (D_PAD)
  const long long bn = get(c, "block_n"), bm = get(c, "block_m"), st = get(c, "q_stages");
  const bool bulk = std::get<std::string>(c.at("dq_reduce")) == "bulk";
  const bool defer = std::get<bool>(c.at("dq_defer")), producer = std::get<bool>(c.at("producer"));
  const bool tma = std::get<bool>(c.at("tma_loads"));
  // dQ's staging: the whole (block_m x d) fp32 tile of a step, when bulk; a second dS^T when deferred
  // or with a producer warpgroup (no CTA barrier at a step's top); P^T beside dS^T at d=256; the
  // producer's full and empty mbarriers, one of each a stage, and with TMA loads K's and V's.
  return 2 * bn * d * 2 + 2 * st * bm * d * 2 + (defer || producer ? 2 : 1) * bn * bm * 2 +
         (d == 256 ? bn * bm * 2 : 0) + 2 * st * bm * 4 + (bulk ? bm * d * 4 : 0) + (producer ? 2 * st * 8 : 0) +
         (tma ? 8 : 0) + 1024;
}


// The family's builds in build-worker processes.
BuildPoolOptions pool_options() {
  BuildPoolOptions o;
  o.nvrtc_options = family_nvrtc_options("flash_bwd_wgmma");
  o.worker_argv = {attntune::testing::attntune_bin(), "build-worker"};
  return o;
}

// A boolean tunable's builds (those with `flag` on, longest_first 0): every config of each `plain`
// problem (at least `min_plain` of each) and the first and last of each `variants` problem build for
// sm_90a without wgmma serialisation, spilling nothing where the head dim pads to 128 and no soft-cap
// is compiled in, at most 8 bytes elsewhere.
void check_flag_builds(const char* flag, std::initializer_list<const char*> plain, std::size_t min_plain,
                       std::initializer_list<const char*> variants) {
  const SearchSpace space = space_of("flash_bwd_wgmma");
  BuildPool pool(pool_options());
  std::size_t submitted = 0;
  const auto flagged = [&](const Problem& p) {
    std::vector<Config> out;
    for (const Config& c : space.enumerate(p, "sm_90a"))
      if (std::get<bool>(c.at(flag)) && get(c, "longest_first") == 0) out.push_back(c);
    return out;
  };
  for (const char* spec : plain) {
    const Problem p = Problem::parse(spec);
    const auto configs = flagged(p);
    EXPECT_GE(configs.size(), min_plain) << spec;
    for (const Config& c : configs) {
      pool.submit({c, render_kernel(space, c, p, "sm_90a"), "sm_90a"});
      ++submitted;
    }
  }
  for (const char* spec : variants) {
    const Problem p = Problem::parse(spec);
    const auto configs = flagged(p);
    ASSERT_FALSE(configs.empty()) << spec;
    for (const Config* c : {&configs.front(), &configs.back()}) {
      pool.submit({*c, render_kernel(space, *c, p, "sm_90a"), "sm_90a"});
      ++submitted;
    }
  }
  std::size_t built = 0;
  while (auto o = pool.next()) {
    ++built;
    EXPECT_EQ(o->build.status, "ok") << config_str(o->job.config) << "\n" << o->build.log;
    const std::string& src = o->job.kernel.source;
    const bool clean = src.find("#define D_PAD 128\n") != std::string::npos &&
                       src.find("#define ATT_SOFTCAP 1\n") == std::string::npos;
    EXPECT_LE(o->build.spill_stores, clean ? 0 : 8) << config_str(o->job.config) << ": " << o->build.registers << " registers";
    EXPECT_EQ(o->build.log.find("Potential Performance Loss"), std::string::npos)
        << config_str(o->job.config) << "\n" << o->build.log;
  }
  EXPECT_EQ(built, submitted);
}

}  // namespace

TEST(FlashBwdWgmmaSpace, ServesTheBackwardOfHeadDims64And128OnHopperOnly) {
  const SearchSpace space = space_of("flash_bwd_wgmma");
  for (const char* spec : {"b=1,h=16,s=8192,d=128,dtype=bf16,causal=0,pass=bwd",
                           "b=2,h=32,hkv=8,s=2048,d=64,dtype=fp16,causal=1,pass=bwd",
                           "b=1,h=8,s=4096,d=128,dtype=bf16,causal=1,window=1024,pass=bwd"}) {
    const Problem p = Problem::parse(spec);
    const auto configs = space.enumerate(p, "sm_90a");
    EXPECT_GE(configs.size(), 4u) << spec;
    for (const Config& c : configs) {
      // d=128 with 128-row steps: S^T, dP^T, dK and dV would need 256 registers a thread.
      if (p.d == 128) {
        EXPECT_EQ(get(c, "block_m"), 64) << config_str(c);
      }
      // A deferred dQ only where each warpgroup has one dQ unit of at most 64 columns (its
      // accumulators live into the next step).
      if (std::get<bool>(c.at("dq_defer"))) {
        const std::int64_t split = std::max<std::int64_t>(1, get(c, "block_n") / get(c, "block_m"));
        EXPECT_EQ(get(c, "block_m") / 64 * split, get(c, "block_n") / 64) << config_str(c);
        EXPECT_LE(p.d / split, 64) << config_str(c);
      }
      EXPECT_LE(smem_of(c, p.d), 232448) << config_str(c);
    }
  }
  EXPECT_NE(attntune::testing::input_error_of([&] {
              space.enumerate(Problem::parse("b=1,h=16,s=8192,d=128,dtype=bf16,causal=0"), "sm_90a");
            }).find("pass=bwd"),
            std::string::npos);
  EXPECT_NE(attntune::testing::input_error_of([&] {
              space.enumerate(Problem::parse("b=1,h=16,s=8192,d=72,dtype=bf16,causal=0,pass=bwd"), "sm_90a");
            }).find("head dims step by 16"),
            std::string::npos);
  EXPECT_NE(attntune::testing::input_error_of([&] {
              space.enumerate(Problem::parse("b=1,h=16,s=8192,d=128,dtype=bf16,causal=0,pass=bwd"), "sm_80");
            }).find("does not support arch sm_80"),
            std::string::npos);
}

// d=256 (Gemma 2 and 3): two warpgroups of the same 64 keys, each scoring half of a step's 64 queries
// and holding half of dK's and dV's head dims; 64-row steps in two stages, dQ by red or quad (red.v4
// into the fragment order), not deferred, the loads before or after S^T and dP^T (late_loads): four
// configs a problem, twelve causal ones (longest_first). quad is d=256's alone.
TEST(FlashBwdWgmmaSpace, HeadDim256TakesTwoWarpgroupsAHalf) {
  const SearchSpace space = space_of("flash_bwd_wgmma");
  for (const bool causal : {false, true}) {
    const Problem p = Problem::parse(std::string("b=1,h=16,s=8192,d=256,dtype=bf16,pass=bwd,causal=") + (causal ? "1" : "0"));
    const auto configs = space.enumerate(p, "sm_90a");
    EXPECT_EQ(configs.size(), causal ? 12u : 4u);
    for (const Config& c : configs) {
      EXPECT_EQ(get(c, "block_n"), 64) << config_str(c);
      EXPECT_EQ(get(c, "block_m"), 64) << config_str(c);
      EXPECT_EQ(get(c, "q_stages"), 2) << config_str(c);
      EXPECT_NE(std::get<std::string>(c.at("dq_reduce")), "bulk");
      EXPECT_FALSE(std::get<bool>(c.at("dq_defer")));
      EXPECT_EQ(smem_of(c, 256), 215040);
      const LaunchSpec spec = render_kernel(space, c, p, "sm_90a").launch;
      EXPECT_EQ(attntune::define_value(spec.defines, "THREADS"), 256);
      EXPECT_EQ(attntune::define_value(spec.defines, "SMEM_BYTES"), 215040);
    }
  }
  for (const Config& c : space.enumerate(Problem::parse("b=1,h=16,s=8192,d=128,dtype=bf16,causal=1,pass=bwd"), "sm_90a"))
    EXPECT_NE(std::get<std::string>(c.at("dq_reduce")), "quad") << config_str(c);
}

// A producer warpgroup (producer): one more warpgroup of threads, a second dS^T buffer and the
// stages' mbarriers; at head dims up to 128 only (d=256's two warpgroups use every register), and
// never with a deferred dQ (its accumulators spill at setmaxnreg's 240 registers beside two consumer
// warpgroups; beside one, ptxas serialises the wgmmas). Old results (recorded without it) read as
// producer false.
TEST(FlashBwdWgmmaSpace, ProducerWarpgroup) {
  const SearchSpace space = space_of("flash_bwd_wgmma");
  bool has_default = false;
  for (const Param& q : space.params())
    if (q.name == "producer") has_default = q.default_value.has_value();
  EXPECT_TRUE(has_default);
  for (const int d : {64, 128, 256}) {
    const Problem p = Problem::parse("b=1,h=16,s=8192,d=" + std::to_string(d) + ",dtype=bf16,causal=1,pass=bwd");
    int with = 0;
    for (const Config& c : space.enumerate(p, "sm_90a")) {
      if (!std::get<bool>(c.at("producer"))) continue;
      ++with;
      const int consumers = static_cast<int>(get(c, "block_n") / 64);
      EXPECT_FALSE(std::get<bool>(c.at("dq_defer"))) << config_str(c);
      const LaunchSpec spec = render_kernel(space, c, p, "sm_90a").launch;
      EXPECT_EQ(attntune::define_value(spec.defines, "THREADS"), (consumers + 1) * 128) << config_str(c);
      EXPECT_EQ(attntune::define_value(spec.defines, "SMEM_BYTES"), smem_of(c, d)) << config_str(c);
      EXPECT_EQ(attntune::define_value(spec.defines, "PRODUCER"), 1) << config_str(c);
    }
    if (d == 256) EXPECT_EQ(with, 0);
    else EXPECT_GE(with, 8) << d;
  }
}

// tma_loads: producer builds of dense calls only (a packed batch's sequences are no map's boxes), both
// ways there; the build's plan has Q's and dO's maps (boxes of 64 columns by the query block's rows,
// over the call's head dim and seqlen_q), and a call whose q or dout rows TMA cannot read is refused
// with the reason.
TEST(FlashBwdWgmmaSpace, TmaLoadsIsProducerBuildsOfDenseCalls) {
  const SearchSpace space = space_of("flash_bwd_wgmma");
  const Problem p = Problem::parse("b=2,h=8,hkv=2,s=1000,sk=777,d=96,dtype=bf16,causal=1,pass=bwd");
  int with = 0, without = 0;
  const auto device = FakeDevice{}.device();
  for (const Config& c : space.enumerate(p, "sm_90a")) {
    const bool tma = std::get<bool>(c.at("tma_loads"));
    if (!std::get<bool>(c.at("producer"))) {
      EXPECT_FALSE(tma) << config_str(c);
      continue;
    }
    (tma ? with : without) += 1;
    const LaunchSpec spec = render_kernel(space, c, p, "sm_90a").launch;
    EXPECT_EQ(attntune::define_value(spec.defines, "TMA_LOADS"), tma ? 1 : 0) << config_str(c);
    EXPECT_EQ(attntune::define_value(spec.defines, "SMEM_BYTES"), smem_of(c, 96)) << config_str(c);
    const auto plan = plan_call(spec, backward_call_of(p), device);
    ASSERT_TRUE(plan) << config_str(c);
    ASSERT_EQ(plan->maps, tma ? 2 : 0) << config_str(c);
    if (!tma) continue;
    for (int m = 0; m < 2; ++m) {
      EXPECT_EQ(plan->map[m].rank, 4);
      EXPECT_EQ(plan->map[m].dims[0], 96u);  // the call's head dim: zeros past it, inside the second box
      EXPECT_EQ(plan->map[m].dims[1], 1000u);
      EXPECT_EQ(plan->map[m].dims[2], 8u);
      EXPECT_EQ(plan->map[m].dims[3], 2u);
      EXPECT_EQ(plan->map[m].box[0], 64u);
      EXPECT_EQ(plan->map[m].box[1], static_cast<unsigned>(get(c, "block_m")));
      EXPECT_EQ(plan->map[m].swizzle_bytes, 128);
    }
    attntune_plan::Call call = backward_call_of(p);
    call.do_stride[2] = 100;  // rows of 200 bytes: not TMA's 16-byte multiple
    std::string why;
    EXPECT_FALSE(plan_call(spec, call, device, &why));
    EXPECT_NE(why.find("loads dout by TMA"), std::string::npos) << why;
    call = backward_call_of(p);
    call.q = static_cast<const char*>(call.q) + 2;
    EXPECT_FALSE(plan_call(spec, call, device, &why));
    EXPECT_NE(why.find("16-byte aligned base"), std::string::npos) << why;
  }
  EXPECT_GE(with, 4);
  EXPECT_EQ(with, without);
  const Problem packed = Problem::parse("b=3,h=8,hkv=2,s=1000,sk=1000,d=128,dtype=bf16,causal=1,varlen=1,pass=bwd");
  for (const Config& c : space.enumerate(packed, "sm_90a")) EXPECT_FALSE(std::get<bool>(c.at("tma_loads"))) << config_str(c);
}

// fa4_order (FlashAttention-4's step order): producer builds of two consumer warpgroups and 64-row
// steps only (head dims padded to 128, no soft-cap: elsewhere it spilled), both ways there.
TEST(FlashBwdWgmmaSpace, Fa4OrderIsTwoWarpgroupProducerBuildsOf64RowSteps) {
  const SearchSpace space = space_of("flash_bwd_wgmma");
  for (const char* spec : {"b=1,h=16,s=16384,d=128,dtype=bf16,causal=0,pass=bwd",
                           "b=2,h=8,s=2048,d=96,dtype=fp16,causal=1,window=100,sinks=1,pass=bwd",
                           "b=1,h=16,s=8192,d=64,dtype=bf16,causal=1,pass=bwd",
                           "b=1,h=16,s=8192,d=128,dtype=bf16,causal=1,softcap=30,pass=bwd"}) {
    const Problem p = Problem::parse(spec);
    std::set<bool> where_offered;
    for (const Config& c : space.enumerate(p, "sm_90a")) {
      const bool fa4 = std::get<bool>(c.at("fa4_order"));
      if (std::get<bool>(c.at("producer")) && get(c, "block_n") == 128 && get(c, "block_m") == 64 && !p.softcapped())
        where_offered.insert(fa4);
      else
        EXPECT_FALSE(fa4) << spec << ": " << config_str(c);
    }
    const bool offered = p.d > 64 && !p.softcapped();
    const std::set<bool> want = offered ? std::set<bool>{false, true} : std::set<bool>{};
    EXPECT_EQ(where_offered, want) << spec;
    // sdp_split (S^T and dP^T one wait each) on fa4_order's step, at three stages (two spilled).
    std::set<bool> split_offered;
    for (const Config& c : space.enumerate(p, "sm_90a")) {
      const bool split = std::get<bool>(c.at("sdp_split"));
      if (std::get<bool>(c.at("fa4_order")) && get(c, "q_stages") == 3) split_offered.insert(split);
      else EXPECT_FALSE(split) << spec << ": " << config_str(c);
    }
    EXPECT_EQ(split_offered, want) << spec;
  }
}

// wg_skew (the two consumer warpgroups take turns to issue their products): producer builds of two
// consumer warpgroups in the step's own order (not fa4_order's), both ways there, at every head dim a
// producer serves (d=64 and 96 too) and with every variant but a soft-cap at 128-row steps (d=64:
// it spilled); a config recorded before wg_skew existed renders as wg_skew=false, the same source,
// and the render defines it.
TEST(FlashBwdWgmmaSpace, WgSkewIsTwoWarpgroupProducerBuildsInTheStepsOwnOrder) {
  const SearchSpace space = space_of("flash_bwd_wgmma");
  bool has_default = false;
  for (const Param& q : space.params())
    if (q.name == "wg_skew") has_default = q.default_value.has_value();
  EXPECT_TRUE(has_default);
  for (const char* spec : {"b=1,h=16,s=16384,d=128,dtype=bf16,causal=0,pass=bwd",
                           "b=1,h=16,s=8192,d=64,dtype=bf16,causal=0,pass=bwd",
                           "b=2,h=8,s=2048,d=96,dtype=fp16,causal=1,window=100,sinks=1,pass=bwd",
                           "b=1,h=16,s=8192,d=128,dtype=bf16,causal=1,softcap=30,pass=bwd",
                           "b=1,h=16,s=8192,d=64,dtype=bf16,causal=1,softcap=30,pass=bwd",
                           "b=3,h=8,hkv=2,s=1000,sk=1000,d=128,dtype=bf16,causal=1,varlen=1,pass=bwd",
                           "b=1,h=16,s=8192,d=256,dtype=bf16,causal=1,pass=bwd"}) {
    const Problem p = Problem::parse(spec);
    std::set<bool> where_offered;
    for (const Config& c : space.enumerate(p, "sm_90a")) {
      const bool skew = std::get<bool>(c.at("wg_skew"));
      if (std::get<bool>(c.at("producer")) && get(c, "block_n") == 128 && !std::get<bool>(c.at("fa4_order")) &&
          !(p.softcapped() && get(c, "block_m") == 128))
        where_offered.insert(skew);
      else
        EXPECT_FALSE(skew) << spec << ": " << config_str(c);
      const LaunchSpec launch = render_kernel(space, c, p, "sm_90a").launch;
      EXPECT_EQ(attntune::define_value(launch.defines, "WG_SKEW"), skew ? 1 : 0) << config_str(c);
      if (!skew) continue;
      // Nothing else of the build moves: the threads and the shared memory are the producer build's
      // (its two dS^T buffers are what the turns need).
      Config off = c;
      off["wg_skew"] = false;
      const LaunchSpec plain = render_kernel(space, off, p, "sm_90a").launch;
      EXPECT_EQ(attntune::define_value(launch.defines, "THREADS"), attntune::define_value(plain.defines, "THREADS"));
      EXPECT_EQ(attntune::define_value(launch.defines, "SMEM_BYTES"), smem_of(c, p.d)) << config_str(c);
    }
    // (d=64's two-warpgroup producer builds are all of 128-row steps: none with a soft-cap.)
    const bool offered = p.d <= 128 && !(p.d <= 64 && p.softcapped());
    const std::set<bool> want = offered ? std::set<bool>{false, true} : std::set<bool>{};
    EXPECT_EQ(where_offered, want) << spec;
  }
  // A config recorded before wg_skew existed (no wg_skew) is wg_skew=false: the same source.
  const Problem p = Problem::parse("b=1,h=16,s=16384,d=128,dtype=bf16,causal=0,pass=bwd");
  for (const Config& c : space.enumerate(p, "sm_90a")) {
    if (std::get<bool>(c.at("wg_skew")) || !std::get<bool>(c.at("producer"))) continue;
    Config old = c;
    old.erase("wg_skew");
    EXPECT_EQ(space.check(old, p, "sm_90a"), std::nullopt) << config_str(c);
    const RenderedKernel k = render_kernel(space, c, p, "sm_90a");
    EXPECT_EQ(render_kernel(space, old, p, "sm_90a").source_hash, k.source_hash) << config_str(c);
    EXPECT_NE(k.source.find("#define WG_SKEW 0\n"), std::string::npos);
  }
}

// late_loads (head dim 256's builds, which have no producer, issue the next stage's loads after S^T
// and dP^T): offered both ways at head dims padded to 256 and nowhere else; the threads and shared
// memory are the build's without it; a config recorded before late_loads existed renders as
// late_loads=false, the same source.
TEST(FlashBwdWgmmaSpace, LateLoadsIsHeadDim256s) {
  const SearchSpace space = space_of("flash_bwd_wgmma");
  for (const char* spec : {"b=1,h=16,s=16384,d=128,dtype=bf16,causal=0,pass=bwd",
                           "b=1,h=16,s=8192,d=64,dtype=bf16,causal=1,pass=bwd",
                           "b=2,h=8,s=2048,d=96,dtype=fp16,causal=1,window=100,sinks=1,pass=bwd",
                           "b=1,h=16,s=8192,d=256,dtype=bf16,causal=1,pass=bwd",
                           "b=3,h=8,hkv=2,s=1000,sk=1000,d=256,dtype=bf16,causal=0,varlen=1,pass=bwd",
                           "b=1,h=16,s=8192,d=192,dtype=bf16,causal=0,softcap=30,pass=bwd"}) {
    const Problem p = Problem::parse(spec);
    std::set<bool> offered;
    for (const Config& c : space.enumerate(p, "sm_90a")) {
      const bool late = std::get<bool>(c.at("late_loads"));
      offered.insert(late);
      if (!late) continue;
      const LaunchSpec launch = render_kernel(space, c, p, "sm_90a").launch;
      EXPECT_EQ(attntune::define_value(launch.defines, "LATE_LOADS"), 1) << config_str(c);
      Config top = c;
      top["late_loads"] = false;
      ASSERT_EQ(space.check(top, p, "sm_90a"), std::nullopt) << config_str(c);
      const LaunchSpec plain = render_kernel(space, top, p, "sm_90a").launch;
      EXPECT_EQ(attntune::define_value(launch.defines, "THREADS"), attntune::define_value(plain.defines, "THREADS"));
      EXPECT_EQ(attntune::define_value(launch.defines, "SMEM_BYTES"), smem_of(c, p.d)) << config_str(c);
    }
    const std::set<bool> want = p.d > 128 ? std::set<bool>{false, true} : std::set<bool>{false};
    EXPECT_EQ(offered, want) << spec;
  }
  // A config recorded before late_loads existed (none) is late_loads=false: the same source.
  for (const char* spec : {"b=1,h=16,s=8192,d=128,dtype=bf16,causal=1,pass=bwd",
                           "b=1,h=16,s=8192,d=256,dtype=bf16,causal=1,pass=bwd"}) {
    const Problem p = Problem::parse(spec);
    for (const Config& c : space.enumerate(p, "sm_90a")) {
      if (std::get<bool>(c.at("late_loads"))) continue;
      Config old = c;
      old.erase("late_loads");
      EXPECT_EQ(space.check(old, p, "sm_90a"), std::nullopt) << config_str(c);
      const RenderedKernel k = render_kernel(space, c, p, "sm_90a");
      EXPECT_EQ(render_kernel(space, old, p, "sm_90a").source_hash, k.source_hash) << config_str(c);
      EXPECT_NE(k.source.find("#define LATE_LOADS 0\n"), std::string::npos);
    }
  }
}

// Head dims between 64, 128 and 256: the kernels compute over the next of them with zero columns
// (D_PAD), so the configs are the padded head dim's (160..240 take d=256's two warpgroups), and dQ's
// accumulator is the padded width's.
TEST(FlashBwdWgmmaSpace, OtherHeadDimsRunPaddedTo64128Or256) {
  const SearchSpace space = space_of("flash_bwd_wgmma");
  for (const int d : {32, 48, 80, 96, 112, 160, 192, 240}) {
    const int pad = d <= 64 ? 64 : d <= 128 ? 128 : 256;
    const Problem p = Problem::parse("b=2,h=8,hkv=2,s=1000,sk=777,d=" + std::to_string(d) + ",dtype=bf16,causal=0,pass=bwd");
    const Problem padded = Problem::parse("b=2,h=8,hkv=2,s=1000,sk=777,d=" + std::to_string(pad) + ",dtype=bf16,causal=0,pass=bwd");
    const auto configs = space.enumerate(p, "sm_90a");
    EXPECT_EQ(configs.size(), space.enumerate(padded, "sm_90a").size()) << d;
    for (const Config& c : configs) {
      const LaunchSpec spec = render_kernel(space, c, p, "sm_90a").launch;
      EXPECT_EQ(attntune::define_value(spec.defines, "D_PAD"), pad) << d;
      EXPECT_EQ(attntune::define_value(spec.defines, "THREADS"),
                get(c, "block_n") / 64 * 128 * (pad == 256 ? 2 : 1) + (std::get<bool>(c.at("producer")) ? 128 : 0));
      EXPECT_EQ(attntune::define_value(spec.defines, "SMEM_BYTES"), smem_of(c, d)) << config_str(c);
      const auto plan = plan_call(spec, backward_call_of(p), FakeDevice{}.device());
      ASSERT_TRUE(plan) << config_str(c);
      const long long bm = get(c, "block_m"), rounded = (1000 + bm - 1) / bm * bm;
      EXPECT_EQ(plan->workspace[0].bytes, static_cast<unsigned long long>(2 * 8 * rounded * pad * 4)) << d;
    }
  }
}

TEST(FlashBwdWgmmaRender, SourceIsFlatWithThreeKernelsAndEveryTunable) {
  const SearchSpace space = space_of("flash_bwd_wgmma");
  const Problem p = Problem::parse("b=2,h=8,hkv=2,s=1000,sk=777,d=128,dtype=bf16,causal=1,pass=bwd");
  const Config c = space.enumerate(p, "sm_90a").front();
  const RenderedKernel k = render_kernel(space, c, p, "sm_90a");
  EXPECT_EQ(k.source.find("#include \""), std::string::npos) << "includes must be inlined";
  for (const auto& param : space.params())
    EXPECT_NE(k.source.find("#define " + macro_name(param.name) + " "), std::string::npos) << param.name;
  for (const char* name : {"flash_bwd_preprocess(", "flash_bwd_wgmma(", "flash_bwd_convert("})
    EXPECT_NE(k.source.find(name), std::string::npos) << name;
  const Problem other = Problem::parse("b=7,h=3,hkv=1,s=77,sk=5000,d=128,dtype=bf16,causal=1,pass=bwd");
  EXPECT_EQ(render_kernel(space, c, other, "sm_90a").source_hash, k.source_hash);
}

TEST(FlashBwdWgmmaPlan, ThreeKernelsWithTheirGridsSharedMemoryAndWorkspaces) {
  const SearchSpace space = space_of("flash_bwd_wgmma");
  for (int d : {64, 128, 256}) {
    const Problem p = Problem::parse(
        "b=2,h=8,hkv=2,s=1000,sk=777,d=" + std::to_string(d) + ",dtype=bf16,causal=0,pass=bwd");
    for (const Config& c : space.enumerate(p, "sm_90a")) {
      const LaunchSpec spec = render_kernel(space, c, p, "sm_90a").launch;
      const auto plan = plan_call(spec, backward_call_of(p), FakeDevice{}.device());
      ASSERT_TRUE(plan) << config_str(c);
      const long long bm = get(c, "block_m"), bn = get(c, "block_n");
      const long long rounded = (1000 + bm - 1) / bm * bm;
      ASSERT_EQ(plan->launches, 3);
      EXPECT_EQ(plan->launch[0].grid[0], static_cast<unsigned>(rounded / bm));
      EXPECT_EQ(plan->launch[1].kernel, 1);
      EXPECT_EQ(plan->launch[1].grid[0], static_cast<unsigned>((777 + bn - 1) / bn));
      EXPECT_EQ(plan->launch[1].grid[1], 2u);  // KV heads: GQA's group is summed inside a CTA
      EXPECT_EQ(plan->launch[1].block,
              static_cast<unsigned>(bn / 64 * 128 * (d == 256 ? 2 : 1) + (std::get<bool>(c.at("producer")) ? 128 : 0)));
      EXPECT_EQ(plan->launch[1].smem, static_cast<unsigned>(smem_of(c, d))) << config_str(c);
      EXPECT_EQ(plan->launch[2].kernel, 2);
      EXPECT_EQ(plan->launch[2].grid[0], static_cast<unsigned>((1000 + bm - 1) / bm));
      ASSERT_EQ(plan->workspaces, 3);
      EXPECT_EQ(plan->workspace[0].bytes, static_cast<unsigned long long>(2 * 8 * rounded * d * 4));
      EXPECT_EQ(plan->workspace[1].bytes, static_cast<unsigned long long>(2 * 8 * rounded * 4));
    }
  }
}

TEST(FlashBwdWgmmaPlan, WrongCallsAreRefusedWithTheReason) {
  const SearchSpace space = space_of("flash_bwd_wgmma");
  const Problem p = Problem::parse("b=1,h=4,s=300,sk=300,d=64,dtype=fp16,causal=1,pass=bwd");
  const LaunchSpec spec = render_kernel(space, space.enumerate(p, "sm_90a").front(), p, "sm_90a").launch;
  const auto device = FakeDevice{}.device();
  attntune_plan::Call c = backward_call_of(p);
  c.seqlen_q = 0;
  auto plan = plan_call(spec, c, device);
  ASSERT_TRUE(plan);
  ASSERT_EQ(plan->launches, 1);
  EXPECT_EQ(plan->launch[0].kernel, 1);
  auto refused = [&](attntune_plan::Call call, const char* words) {
    std::string why;
    EXPECT_FALSE(plan_call(spec, call, device, &why)) << words;
    EXPECT_NE(why.find(words), std::string::npos) << why;
  };
  refused(dense_call_of(p), "attntune_attention_backward only");
  c = backward_call_of(p);
  c.head_dim = 128;
  refused(c, "head_dim 64");
  c = backward_call_of(p);
  c.causal = 0;
  refused(c, "causal");
  c = backward_call_of(p);
  c.dq = nullptr;
  refused(c, "none may be NULL");
  c = backward_call_of(p);
  c.window_left = 64;
  refused(c, "sliding window");
  // A deterministic call: the turns' semaphores, one int a query block, as a fourth workspace.
  c = backward_call_of(p);
  c.deterministic = 1;
  plan = plan_call(spec, c, device);
  ASSERT_TRUE(plan);
  ASSERT_EQ(plan->workspaces, 4);
  const long long bm = get(space.enumerate(p, "sm_90a").front(), "block_m");
  EXPECT_EQ(plan->workspace[3].bytes, static_cast<unsigned long long>(1 * 4 * ((300 + bm - 1) / bm) * 4));
}

// Every config of d=64 and d=128 (causal, in the grid's order, and two longest-first ones; a window
// build of each head dim) and d=256's (non-causal; causal with a window, soft-cap and sinks) builds
// for sm_90a without wgmma serialisation and with few spilled bytes at 255 registers: d=128 at most
// 16 (its deferred-dQ builds, 4-12 bytes under NVRTC, none under nvcc; the space's register floor
// keeps its 128-row steps, which spill hundreds, out), d=64's 128-row steps at most 64, d=256 none.
TEST(FlashBwdWgmmaBuild, EveryConfigBuildsWithFewSpills) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = space_of("flash_bwd_wgmma");
  BuildPool pool(pool_options());
  std::size_t submitted = 0;
  for (const char* spec : {"b=1,h=16,s=8192,d=128,dtype=bf16,causal=1,pass=bwd",
                           "b=1,h=16,s=8192,d=64,dtype=fp16,causal=1,pass=bwd"}) {
    const Problem p = Problem::parse(spec);
    // longest_first only maps the CTA's block index at the kernel's start: each other config once in
    // the grid's order, and the first and last longest-first ones (the whole set would triple the
    // test's compile time, CI's 2 cores).
    std::vector<Config> lpt;
    for (const Config& c : space.enumerate(p, "sm_90a")) {
      if (std::get<bool>(c.at("tma_loads"))) continue;  // (TmaLoadsBuildsWithoutSpills)
      if (std::get<std::int64_t>(c.at("longest_first")) != 0) {
        lpt.push_back(c);
        continue;
      }
      pool.submit({c, render_kernel(space, c, p, "sm_90a"), "sm_90a"});
      ++submitted;
    }
    ASSERT_GE(lpt.size(), 2u) << spec;
    for (const Config* c : {&lpt.front(), &lpt.back()}) {
      pool.submit({*c, render_kernel(space, *c, p, "sm_90a"), "sm_90a"});
      ++submitted;
    }
  }
  for (const char* spec : {"b=1,h=16,s=8192,d=128,dtype=bf16,causal=0,window=256,256,pass=bwd",
                           "b=1,h=16,s=8192,d=64,dtype=bf16,causal=1,window=512,pass=bwd",
                           "b=1,h=16,s=8192,d=256,dtype=fp16,causal=1,window=512,softcap=30,sinks=1,pass=bwd"}) {
    const Problem p = Problem::parse(spec);
    const Config c = space.enumerate(p, "sm_90a").back();
    pool.submit({c, render_kernel(space, c, p, "sm_90a"), "sm_90a"});
    ++submitted;
  }
  // d=256: both of its dQ additions (red, quad); and padded head dims' first configs.
  const Problem d256 = Problem::parse("b=1,h=16,s=8192,d=256,dtype=bf16,causal=0,pass=bwd");
  for (const Config& c : space.enumerate(d256, "sm_90a")) {
    pool.submit({c, render_kernel(space, c, d256, "sm_90a"), "sm_90a"});
    ++submitted;
  }
  for (const char* spec : {"b=1,h=16,s=8192,d=96,dtype=bf16,causal=1,pass=bwd",
                           "b=1,h=16,s=8192,d=192,dtype=fp16,causal=0,pass=bwd"}) {
    const Problem p = Problem::parse(spec);
    const Config c = space.enumerate(p, "sm_90a").front();
    pool.submit({c, render_kernel(space, c, p, "sm_90a"), "sm_90a"});
    ++submitted;
  }
  std::size_t built = 0;
  while (auto o = pool.next()) {
    ++built;
    EXPECT_EQ(o->build.status, "ok") << config_str(o->job.config) << "\n" << o->build.log;
    const bool d128 = o->job.kernel.source.find("#define D_PAD 128\n") != std::string::npos;
    const bool d256 = o->job.kernel.source.find("#define D_PAD 256\n") != std::string::npos;
    EXPECT_LE(o->build.spill_stores, d256 ? 0 : d128 ? 16 : 64)
        << config_str(o->job.config) << ": " << o->build.registers << " registers";
    EXPECT_EQ(o->build.log.find("Potential Performance Loss"), std::string::npos)
        << config_str(o->job.config) << "\n" << o->build.log;
  }
  EXPECT_EQ(built, submitted);
}

// tma_loads' builds: at d=128 (non-causal and causal) and d=64 (causal), every TMA-loading config in
// the grid's order, and the first and last of a causal window with sinks, a soft-cap and d=96's zero
// columns, build for sm_90a without wgmma serialisation and spilling what the same config without TMA
// loads spills (0 bytes at head dims padded to 128 but for a soft-cap's, 4 at d=64's 128-row steps:
// the producer's one TMA-issuing thread and its 24 registers take nothing from the consumers; a
// soft-cap beside one consumer warpgroup, whose warps all hold 255 registers, spilled 12: ruled out).
TEST(FlashBwdWgmmaBuild, TmaLoadsBuildsWithoutSpills) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  check_flag_builds("tma_loads",
                    {"b=1,h=16,s=16384,d=128,dtype=bf16,causal=0,pass=bwd",
                     "b=1,h=16,s=8192,d=128,dtype=bf16,causal=1,pass=bwd",
                     "b=1,h=16,s=8192,d=64,dtype=fp16,causal=1,pass=bwd"},
                    4,
                    {"b=1,h=16,s=8192,d=128,dtype=bf16,causal=1,window=512,sinks=1,pass=bwd",
                     "b=1,h=16,s=8192,d=128,dtype=bf16,causal=1,softcap=30,pass=bwd",
                     "b=1,h=16,s=8192,d=96,dtype=fp16,causal=0,pass=bwd"});
}

// wg_skew's builds: every one of the plain d=128 and d=64 problems (non-causal and causal, in the
// grid's order) and the first and last of each variant's (windows, sinks, a soft-cap, a packed
// batch, d=96's zero columns) build for sm_90a without wgmma serialisation and without spills where
// the head dim pads to 128 (64-row steps) and no soft-cap is compiled in; elsewhere at most 8 bytes,
// what the same builds without the skew spill (a word kept over setmaxnreg and reloaded a step: 4
// bytes at d=64's 128-row steps and the soft-cap's two stages, either way; CUDA 13.0, 2026-12-01).
TEST(FlashBwdWgmmaBuild, WgSkewBuildsWithoutSpills) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  check_flag_builds("wg_skew",
                    {"b=1,h=16,s=16384,d=128,dtype=bf16,causal=0,pass=bwd",
                     "b=1,h=16,s=8192,d=128,dtype=bf16,causal=1,pass=bwd",
                     "b=1,h=16,s=8192,d=64,dtype=bf16,causal=0,pass=bwd",
                     "b=1,h=16,s=8192,d=64,dtype=fp16,causal=1,pass=bwd"},
                    2,
                    {"b=1,h=16,s=8192,d=128,dtype=bf16,causal=1,window=512,sinks=1,pass=bwd",
                     "b=1,h=16,s=8192,d=128,dtype=bf16,causal=0,window=256,256,pass=bwd",
                     "b=1,h=16,s=8192,d=128,dtype=bf16,causal=1,softcap=30,pass=bwd",
                     "b=1,h=16,s=8192,d=64,dtype=bf16,causal=1,window=512,sinks=1,pass=bwd",
                     "b=3,h=8,hkv=2,s=1000,sk=1000,d=128,dtype=bf16,causal=1,varlen=1,pass=bwd",
                     "b=1,h=16,s=8192,d=96,dtype=fp16,causal=0,pass=bwd"});
}

// P^T and dS^T tiles go to shared memory by stmatrix (Traits::kStoreStmatrix): four a 64-query
// k-step group of a tile, so 4 STSM in the d=128 pick (dS^T), 8 at d=64's 128-row steps, 4 at head
// dim 256 (P^T and dS^T, 32 queries a warpgroup), and none where a soft-cap, red dQ reductions or the
// deferred dQ keep the 32-bit stores (stmatrix's register quads spilled there). Each stmatrix build
// builds without spills or wgmma serialisation. (The layout is checked on the GPU: FlashBwdWgmmaProperty.*.)
TEST(FlashBwdWgmmaBuild, TilesStoredByStmatrixWhereTheyDoNotSpill) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = space_of("flash_bwd_wgmma");
  const std::string pick =
      "block_n=128,block_m=64,q_stages=3,dq_reduce=bulk,dq_defer=false,longest_first=0,varlen_lpt=0,producer=true,"
      "late_loads=false,fa4_order=true,sdp_split=true,wg_skew=false";
  const std::string d64 =
      "block_n=128,block_m=128,q_stages=2,dq_reduce=bulk,dq_defer=false,longest_first=0,varlen_lpt=0,producer=true,"
      "late_loads=false,fa4_order=false,sdp_split=false,wg_skew=false";
  const std::string d256 =
      "block_n=64,block_m=64,q_stages=2,dq_reduce=quad,dq_defer=false,longest_first=0,varlen_lpt=0,producer=false,"
      "late_loads=true,fa4_order=false,sdp_split=false,wg_skew=false,tma_loads=false";
  const std::string red =
      "block_n=128,block_m=64,q_stages=3,dq_reduce=red,dq_defer=false,longest_first=0,varlen_lpt=0,producer=true,"
      "late_loads=false,fa4_order=true,sdp_split=false,wg_skew=false";
  const std::string softcap =
      "block_n=128,block_m=64,q_stages=3,dq_reduce=bulk,dq_defer=false,longest_first=0,varlen_lpt=0,producer=true,"
      "late_loads=false,fa4_order=false,sdp_split=false,wg_skew=false";
  const std::string defer =
      "block_n=128,block_m=64,q_stages=2,dq_reduce=bulk,dq_defer=true,longest_first=4,varlen_lpt=0,producer=false,"
      "late_loads=false,fa4_order=false,sdp_split=false,wg_skew=false,tma_loads=false";
  // (spec, config) -> the STSM count expected
  const std::vector<std::tuple<std::string, std::string, int>> cases = {
      {"b=1,h=16,s=16384,d=128,dtype=bf16,causal=0,pass=bwd", pick + ",tma_loads=true", 4},
      {"b=1,h=16,s=8192,d=128,dtype=bf16,causal=1,pass=bwd", pick + ",tma_loads=false", 4},
      {"b=1,h=16,s=8192,d=64,dtype=bf16,causal=0,pass=bwd", d64 + ",tma_loads=true", 8},
      {"b=1,h=16,s=8192,d=256,dtype=bf16,causal=1,pass=bwd", d256, 4},
      {"b=1,h=16,s=8192,d=128,dtype=bf16,causal=0,pass=bwd", red + ",tma_loads=true", 0},
      {"b=1,h=16,s=8192,d=128,dtype=bf16,causal=1,softcap=30,pass=bwd", softcap + ",tma_loads=true", 0},
      {"b=1,h=16,s=8192,d=128,dtype=bf16,causal=1,pass=bwd", defer, 0},
  };
  BuildPool pool(pool_options());
  std::map<std::uint64_t, std::size_t> case_of;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& [spec, cfg, n] = cases[i];
    const Problem p = Problem::parse(spec);
    const Config c = space.parse_config(cfg);
    const std::optional<std::string> invalid = space.check(c, p, "sm_90a");
    ASSERT_EQ(invalid, std::nullopt) << spec << " " << cfg;
    case_of[pool.submit({c, render_kernel(space, c, p, "sm_90a"), "sm_90a"})] = i;
  }
  std::map<std::size_t, std::string> cubins;
  while (auto o = pool.next()) {
    EXPECT_EQ(o->build.status, "ok") << config_str(o->job.config) << "\n" << o->build.log;
    if (o->build.status != "ok") continue;
    const std::size_t i = case_of.at(o->ticket);
    // (The builds left on 32-bit stores are main's machine code, checked by EveryConfigBuildsWithFewSpills;
    // the deferred dQ's has a warpgroup.wait injected, C7517, as it had before.)
    if (std::get<2>(cases[i]) > 0) {
      EXPECT_EQ(o->build.spill_stores + o->build.spill_loads, 0) << config_str(o->job.config);
      EXPECT_EQ(o->build.log.find("C751"), std::string::npos) << "wgmma serialised: " << o->build.log;
    }
    cubins[i] = o->build.cubin;
  }
  ASSERT_EQ(cubins.size(), cases.size());
  const std::string cuobjdump = attntune::testing::find_cuobjdump();
  if (cuobjdump.empty()) GTEST_SKIP() << attntune::testing::kNoSassHalf;
  for (const auto& [i, cubin] : cubins) {
    const auto& [spec, cfg, n] = cases[i];
    EXPECT_EQ(attntune::testing::sass_op_count(cuobjdump, cubin, "STSM"), n) << spec << " " << cfg;
  }
}
}  // namespace test_flash_bwd_wgmma
