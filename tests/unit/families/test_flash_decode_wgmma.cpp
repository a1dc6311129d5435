// flash_decode_wgmma on the CPU: its space offers configs for multi-head latent attention's decode
// (d=576, dv=512, one KV head, 16..128 query heads, q-len 1..16, pages of 64 or contiguous) and
// for d=512, on sm_90a only, and refuses with the reason what it cannot serve (pages whose TMA
// boxes break the swizzle atoms, q-len 17, other head dims); a config of each schedule (pipe)
// compiles with NVRTC for sm_90a without spills; its launch plan is flash_decode's (splits by the
// SM count, the pieces of dv floats, the combine kernel at dv) with 384 threads, and refuses a
// call whose pages make boxes of fewer than 8 rows with the reason.
#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cuda/nvrtc.hpp"
#include "eval/build_pool.hpp"
#include "templates/flash_decode_wgmma/launch.h"
#include "tests/common/plan_call.hpp"
#include "tests/common/run_attntune.hpp"
#include "tests/common/sass.hpp"

namespace test_flash_decode_wgmma {
using namespace attntune;

namespace {

SearchSpace load_space() { return SearchSpace::load(ATTNTUNE_SOURCE_DIR "/search_spaces/flash_decode_wgmma.yaml"); }

const char* kMla[] = {
    "b=64,h=128,hkv=1,s=1,sk=8192,d=576,dv=512,dtype=bf16,causal=0,page=64",   // the bar
    "b=128,h=128,hkv=1,s=2,sk=8192,d=576,dv=512,dtype=bf16,causal=1,page=64",  // q-len 2
    "b=1,h=16,hkv=1,s=1,sk=32768,d=576,dv=512,dtype=fp16,causal=0",            // contiguous
    "b=8,h=32,hkv=1,s=16,sk=4096,d=576,dv=512,dtype=bf16,causal=1,page=16",    // speculative 16
    "b=16,h=32,hkv=4,s=1,sk=8192,d=512,dtype=bf16,causal=0,page=64",           // 512-dim heads
    "b=64,h=128,hkv=1,s=1,sk=8192,d=576,dv=512,dtype=bf16,causal=0,page=64,latent=1",  // the latent cache
};

attntune_plan::Call call_of(const Problem& p) {
  attntune_plan::Call c = attntune::testing::dense_call_of(p);
  c.head_dim_v = static_cast<int>(p.head_dim_v());
  for (long long* st : {c.v_stride, c.o_stride}) {
    st[0] = st[0] / p.d * p.head_dim_v();
    st[1] = st[1] / p.d * p.head_dim_v();
    st[2] = p.head_dim_v();
  }
  return c;
}

// Builds each job for sm_90a through the tuner's pool (as `tune` does): every one ok and without
// spills, and with no_c75 without ptxas's C75xx warnings (wgmma serialized).
void expect_clean_builds(const std::vector<BuildJob>& jobs, bool no_c75 = false) {
  BuildPoolOptions pool_opts;
  pool_opts.nvrtc_options = family_nvrtc_options("flash_decode_wgmma");
  pool_opts.worker_argv = {attntune::testing::attntune_bin(), "build-worker"};
  BuildPool pool(pool_opts);
  for (const BuildJob& j : jobs) pool.submit(j);
  std::size_t built = 0;
  while (auto o = pool.next()) {
    ++built;
    EXPECT_EQ(o->build.status, "ok") << config_str(o->job.config) << "\n" << o->build.log;
    EXPECT_EQ(o->build.spill_stores + o->build.spill_loads, 0)
        << config_str(o->job.config) << ": " << o->build.registers << " registers";
    if (no_c75) {
      EXPECT_EQ(o->build.log.find("C75"), std::string::npos) << config_str(o->job.config) << "\n" << o->build.log;
    }
  }
  EXPECT_EQ(built, jobs.size());
}

}  // namespace

TEST(FlashDecodeWgmmaSpace, MlaAndWideHeadsHaveConfigsOnHopperOnly) {
  const SearchSpace space = load_space();
  for (const char* spec : kMla) {
    const Problem p = Problem::parse(spec);
    EXPECT_GT(space.count(p, "sm_90a"), 1u) << p.str();
    EXPECT_NO_THROW(check_family_serves("flash_decode_wgmma", p)) << p.str();
  }
  // A latent cache leaves room for tiles of 64 keys and for rings deep enough to overlap.
  std::set<std::string> latent_pipes;
  std::set<std::int64_t> latent_blocks;
  for (const Config& c : space.enumerate(Problem::parse(kMla[5]), "sm_90a")) {
    latent_pipes.insert(std::get<std::string>(c.at("pipe")));
    latent_blocks.insert(std::get<std::int64_t>(c.at("block_n")));
  }
  EXPECT_EQ(latent_pipes, (std::set<std::string>{"serial", "fused", "overlap"}));
  EXPECT_EQ(latent_blocks, (std::set<std::int64_t>{32, 64}));
  // Only the Hopper target; flash_decode's mma.sync space stops at 256.
  EXPECT_THROW(space.check_problem(Problem::parse(kMla[0]), "sm_90"), InputError);
  EXPECT_THROW(SearchSpace::load(ATTNTUNE_SOURCE_DIR "/search_spaces/flash_decode.yaml")
                   .check_problem(Problem::parse(kMla[0]), "sm_90"),
               InputError);
  // Pages whose boxes break the 8-row swizzle atoms, q-len past 16, head dims it does not hold.
  for (const char* bad : {"b=4,h=16,hkv=1,s=1,sk=1000,d=576,dv=512,dtype=bf16,causal=0,page=12",
                          "b=4,h=16,hkv=1,s=17,sk=1000,d=576,dv=512,dtype=bf16,causal=1",
                          "b=4,h=16,hkv=1,s=1,sk=1000,d=256,dtype=bf16,causal=0"}) {
    try {
      space.check_problem(Problem::parse(bad), "sm_90a");
      ADD_FAILURE() << bad << " accepted";
    } catch (const InputError& e) {
      EXPECT_GT(std::string(e.what()).size(), 20u) << bad;
    }
  }
}

TEST(FlashDecodeWgmmaPlan, FlashDecodesSplitsWithThreeWarpgroupsAndDvPieces) {
  const SearchSpace space = load_space();
  const Problem p = Problem::parse("b=1,h=128,hkv=1,s=1,sk=32768,d=576,dv=512,dtype=bf16,causal=0");
  const Config c = attntune::testing::first_config(space, p, "sm_90a", [](const Config& x) {
    return std::get<std::string>(x.at("combine")) == "kernel";
  });
  ASSERT_FALSE(c.empty());
  const auto spec = render_kernel(space, c, p, "sm_90a").launch;
  std::string why;
  const auto plan = plan_call(spec, call_of(p), attntune::testing::FakeDevice{132}.device(), &why);
  ASSERT_TRUE(plan) << why;
  EXPECT_EQ(plan->launch[0].block, 384u);
  EXPECT_EQ(plan->launch[0].grid[1], 1u);            // one KV head
  EXPECT_EQ(plan->launch[0].grid[0] % 2, 0u);         // two row blocks of 64 a split
  EXPECT_GT(plan->launch[0].grid[0], 2u);             // b=1: split by the SM count
  ASSERT_EQ(plan->launches, 2);                       // the combine kernel
  EXPECT_EQ(plan->launch[1].grid[0], 128u);           // one row of 512 a combine CTA (128 threads)
  EXPECT_EQ(plan->maps, 2);
  const int splits = static_cast<int>(plan->launch[0].grid[0] / 2);
  EXPECT_EQ(plan->workspace[0].bytes, static_cast<unsigned long long>(splits) * 128 * (512 + 1) * 4);

  // Pages of 12 make boxes of 4 rows: refused with the reason; pages of 64 are served.
  const Problem paged = Problem::parse("b=2,h=16,hkv=1,s=1,sk=1000,d=576,dv=512,dtype=bf16,causal=0,page=64");
  auto call = call_of(paged);
  call.entry = attntune_plan::kEntryKvcache;
  call.block_table = reinterpret_cast<const int*>(std::uintptr_t{1} << 20);
  call.max_blocks_per_seq = 100;
  call.page_size = 64;
  const Config pc = attntune::testing::first_config(space, paged, "sm_90a", [](const Config&) { return true; });
  const auto pspec = render_kernel(space, pc, paged, "sm_90a").launch;
  EXPECT_TRUE(plan_call(pspec, call, attntune::testing::FakeDevice{132}.device(), &why)) << why;
  call.page_size = 12;
  why.clear();
  EXPECT_FALSE(plan_call(pspec, call, attntune::testing::FakeDevice{132}.device(), &why));
  EXPECT_NE(why.find("multiple of 8"), std::string::npos) << why;

  // A latent build serves only calls whose V is K (the same pointer and strides).
  const Problem latent = Problem::parse(kMla[5]);
  const Config lc = attntune::testing::first_config(space, latent, "sm_90a", [](const Config& x) {
    return std::get<std::int64_t>(x.at("block_n")) == 64;
  });
  ASSERT_FALSE(lc.empty());
  const auto lspec = render_kernel(space, lc, latent, "sm_90a").launch;
  auto lcall = call_of(latent);
  why.clear();
  EXPECT_FALSE(plan_call(lspec, lcall, attntune::testing::FakeDevice{132}.device(), &why));
  EXPECT_NE(why.find("latent"), std::string::npos) << why;
  lcall.v = lcall.k;
  std::copy(std::begin(lcall.k_stride), std::end(lcall.k_stride), std::begin(lcall.v_stride));
  why.clear();
  EXPECT_TRUE(plan_call(lspec, lcall, attntune::testing::FakeDevice{132}.device(), &why)) << why;

  // Multicast: clusters of 2 (a split's two row blocks); a call of an odd row-block count refused.
  const Config mc = attntune::testing::first_config(space, latent, "sm_90a", [](const Config& x) {
    return std::get<bool>(x.at("multicast"));
  });
  ASSERT_FALSE(mc.empty());
  const auto mspec = render_kernel(space, mc, latent, "sm_90a").launch;
  why.clear();
  const auto mplan = plan_call(mspec, lcall, attntune::testing::FakeDevice{132}.device(), &why);
  ASSERT_TRUE(mplan) << why;
  EXPECT_EQ(mplan->launch[0].cluster, 2u);
  EXPECT_EQ(mplan->launch[0].grid[0] % 2, 0u);
  auto odd = lcall;
  odd.heads_q = 16;  // 16 rows: one row block
  why.clear();
  EXPECT_FALSE(plan_call(mspec, odd, attntune::testing::FakeDevice{132}.device(), &why));
  EXPECT_NE(why.find("odd number"), std::string::npos) << why;
}

// Every schedule (scores and pipe) of the MLA problem (V apart and a latent cache) and of d=512 builds for sm_90a with no spills
// (the consumers hold O's 64 x 256 fp32 in 128 registers of their 224 after setmaxnreg).
TEST(FlashDecodeWgmmaBuild, EveryScheduleCompilesWithoutSpills) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = load_space();
  std::vector<BuildJob> jobs;
  for (const char* spec : {kMla[1], kMla[4], kMla[5]}) {
    const Problem p = Problem::parse(spec);
    std::set<std::string> pipes;
    for (const Config& c : space.enumerate(p, "sm_90a")) {
      const std::string schedule = std::get<std::string>(c.at("scores")) + "/" + std::get<std::string>(c.at("pipe")) +
                                   (std::get<bool>(c.at("multicast")) ? "/multicast" : "");
      if (!pipes.insert(schedule).second) continue;
      jobs.push_back({c, render_kernel(space, c, p, "sm_90a"), "sm_90a"});
    }
  }
  ASSERT_GE(jobs.size(), 14u);
  expect_clean_builds(jobs);
}

// The FP8 path (kv_dtype=fp8, d=128: templates/flash_decode_wgmma/fp8.cuh): issue 42's decode rows
// have configs on sm_90a (64-key tiles, the serial schedule, 2-4 stages, two CTAs an SM), a 16-bit
// cache at d=128, an FP8 one at another head dim and fp16 queries
// (whose e4m3 pieces miss fp16's bound: run 387) are refused with the reason, the plan launches
// one consumer and one producer warpgroup (256 threads) over flash_decode's FP8 tensor maps, and
// every config builds for sm_90a with no spill and no wgmma serialized (ptxas's C75xx warnings).
const char* kFp8Rows[] = {
    "b=16,h=32,hkv=8,s=1,sk=8192,d=128,dtype=bf16,causal=0,page=16,kv_dtype=fp8",   // b16-8k
    "b=32,h=32,hkv=8,s=16,sk=4096,d=128,dtype=bf16,causal=1,page=16,kv_dtype=fp8",  // q16
    "b=32,h=64,hkv=8,s=4,sk=4096,d=128,dtype=bf16,causal=1,page=64,kv_dtype=fp8",   // spec4, pages of 64
    "b=1,h=32,hkv=8,s=1,sk=32768,d=128,dtype=bf16,causal=0,kv_dtype=fp8",           // contiguous
};

TEST(FlashDecodeWgmmaFp8, SpaceAndPlan) {
  const SearchSpace space = load_space();
  for (const char* spec : kFp8Rows) {
    const Problem p = Problem::parse(spec);
    EXPECT_GE(space.count(p, "sm_90a"), 6u) << p.str();
    std::set<std::string> pipes;
    for (const Config& c : space.enumerate(p, "sm_90a")) {
      EXPECT_EQ(std::get<std::int64_t>(c.at("block_n")), 64) << config_str(c);
      pipes.insert(std::get<std::string>(c.at("pipe")));
    }
    EXPECT_EQ(pipes, (std::set<std::string>{"serial"})) << p.str();
  }
  for (const char* bad : {"b=4,h=32,hkv=8,s=1,sk=1000,d=128,dtype=bf16,causal=0",
                          "b=4,h=32,hkv=8,s=1,sk=1000,d=64,dtype=bf16,causal=0,kv_dtype=fp8",
                          "b=4,h=16,hkv=1,s=1,sk=1000,d=576,dv=512,dtype=bf16,causal=0,kv_dtype=fp8",
                          "b=4,h=32,hkv=8,s=4,sk=1000,d=128,dtype=fp16,causal=1,kv_dtype=fp8"}) {
    try {
      space.check_problem(Problem::parse(bad), "sm_90a");
      ADD_FAILURE() << bad << " accepted";
    } catch (const InputError& e) {
      EXPECT_GT(std::string(e.what()).size(), 20u) << bad;
    }
  }
  const Problem p = Problem::parse("b=1,h=32,hkv=8,s=1,sk=32768,d=128,dtype=bf16,causal=0,kv_dtype=fp8");
  const Config c = attntune::testing::first_config(space, p, "sm_90a", [](const Config& x) {
    return std::get<std::string>(x.at("combine")) == "kernel";
  });
  ASSERT_FALSE(c.empty());
  const auto spec = render_kernel(space, c, p, "sm_90a").launch;
  auto call = call_of(p);
  call.kv_fp8 = 1;  // (strides in elements: e4m3's are bytes)
  std::string why;
  const auto plan = plan_call(spec, call, attntune::testing::FakeDevice{132}.device(), &why);
  ASSERT_TRUE(plan) << why;
  EXPECT_EQ(plan->launch[0].block, 256u);
  EXPECT_EQ(plan->launch[0].grid[1], 8u);  // KV heads
  EXPECT_GT(plan->launch[0].grid[0], 1u);  // b=1: split by the SM count
  EXPECT_EQ(plan->maps, 2);
}

TEST(FlashDecodeWgmmaFp8, EveryConfigBuildsWithoutSpillsOrSerializedWgmma) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = load_space();
  std::vector<BuildJob> jobs;
  for (const char* spec : {kFp8Rows[1], kFp8Rows[2]}) {  // q16 and spec4: causal, pages of 16 and 64
    const Problem p = Problem::parse(spec);
    for (const Config& c : space.enumerate(p, "sm_90a")) jobs.push_back({c, render_kernel(space, c, p, "sm_90a"), "sm_90a"});
  }
  ASSERT_GE(jobs.size(), 12u);
  expect_clean_builds(jobs, /*no_c75=*/true);
}

// wg_uniform (the warpgroup index and Q's descriptor broadcast from lane 0): the MLA decode picks
// (scores single, block_n 64, two stages, multicast, l2_ahead 1; the latent cache at q-len 1 and 2)
// and a split schedule build clean with and without it; without it the descriptors are moved from
// vector registers between the wgmmas (84 R2UR in the pick: Q's 36 k-steps and K's), with it none.
// The SASS half needs cuobjdump (tools/test.sh's .venv has triton's) and skips without one.
TEST(FlashDecodeWgmmaBuild, WgUniformKeepsTheDescriptorsInUniformRegisters) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = load_space();
  const std::vector<std::pair<std::string, std::string>> jobs = {
      {kMla[5], "block_n=64,stages=2,scores=single,l2_ahead=1,multicast=true,pipe=serial,combine=kernel,kv_load=tma"},
      {"b=128,h=128,hkv=1,s=2,sk=8192,d=576,dv=512,dtype=bf16,causal=1,page=64,latent=1",
       "block_n=64,stages=2,scores=single,l2_ahead=1,multicast=true,pipe=serial,combine=kernel,kv_load=tma"},
      {kMla[5], "block_n=64,stages=2,scores=split,l2_ahead=0,multicast=false,pipe=fused,combine=last_cta,kv_load=tma"},
  };
  const auto counts = attntune::testing::sass_counts_off_and_on(space, "sm_90a", jobs, "wg_uniform",
                                                                "R2UR between the wgmmas",
                                                                attntune::testing::r2ur_in_wgmma_batches);
  if (!counts) GTEST_SKIP() << attntune::testing::kNoSassHalf;
  for (const auto& [name, n] : *counts) {
    EXPECT_GE(n.first, 8) << "without wg_uniform, descriptors moved between the wgmmas: " << name;
    EXPECT_EQ(n.second, 0) << "with wg_uniform: " << name;
  }
}
}  // namespace test_flash_decode_wgmma
