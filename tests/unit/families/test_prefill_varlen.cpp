// Packed batches of different lengths (attntune_attention_forward_varlen) in the prefill families,
// on CI (no GPU): a varlen problem renders ATT_VARLEN (and only it does), the launch plans accept
// the varlen entry point from varlen builds only, flash_fwd_wgmma's tensor maps span the packed
// rows, and varlen builds compile for every arch the spaces list. tests/gpu/ checks the values.
#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cuda/nvrtc.hpp"
#include "templates/flash_fwd_wgmma/args.h"
#include "templates/flash_fwd_wgmma/launch.h"
#include "tests/common/plan_call.hpp"

namespace test_prefill_varlen {
using namespace attntune;
using attntune::testing::dense_call_of;
using attntune::testing::FakeDevice;
using attntune::testing::first_config;
using attntune::testing::space_of;
using attntune::testing::varlen_call_of;

namespace {

const Problem kVarlen = Problem::parse("b=16,h=32,hkv=8,s=8192,d=128,dtype=bf16,causal=1,varlen=128");
const Problem kDense = Problem::parse("b=16,h=32,hkv=8,s=8192,d=128,dtype=bf16,causal=1");

}  // namespace

TEST(PrefillVarlen, OnlyVarlenProblemsRenderAttVarlen) {
  for (const char* family : {"flash_fwd_mma", "flash_fwd_wgmma"}) {
    const SearchSpace space = space_of(family);
    const std::string arch = family == std::string("flash_fwd_mma") ? "sm_90" : "sm_90a";
    const Config c = first_config(space, kVarlen, arch, [](const Config&) { return true; });
    ASSERT_FALSE(c.empty()) << family;
    const RenderedKernel v = render_kernel(space, c, kVarlen, arch), d = render_kernel(space, c, kDense, arch);
    EXPECT_NE(v.source.find("#define ATT_VARLEN 1\n"), std::string::npos) << family;
    EXPECT_EQ(d.source.find("#define ATT_VARLEN"), std::string::npos) << family;
    EXPECT_NE(v.source_hash, d.source_hash) << family;
    // The lengths are run-time arguments: another draw, batch or maximum builds the same kernel.
    const Problem other = Problem::parse("b=3,h=32,hkv=8,s=1000,d=128,dtype=bf16,causal=1,varlen=1,lens_seed=9");
    EXPECT_EQ(render_kernel(space, c, other, arch).source_hash, v.source_hash) << family;
  }
}

// Persistent varlen builds take their tiles from the counter (kDynamicTiles): the space keeps them
// with a producer and off the split tail and the pairs, which index tiles of equal sequences.
TEST(PrefillVarlen, TheWgmmaSpaceKeepsPersistentVarlenBuildsOnTheCounter) {
  const SearchSpace space = space_of("flash_fwd_wgmma");
  std::size_t n = 0, persistent = 0;
  space.for_each_valid(kVarlen, "sm_90a", [&](const Config& c) {
    ++n;
    if (!std::get<bool>(c.at("persistent"))) return;
    ++persistent;
    EXPECT_TRUE(std::get<bool>(c.at("warp_specialize"))) << config_str(c);
    EXPECT_FALSE(std::get<bool>(c.at("split_tail"))) << config_str(c);
    EXPECT_FALSE(std::get<bool>(c.at("kv_multicast"))) << config_str(c);
  });
  EXPECT_GT(persistent, 0u);
  EXPECT_GT(n, persistent);
  // Causal, dense and varlen offer the same configs (no split tail, no pairs); non-causal, the
  // dense problem has the split tail and the pairs too.
  EXPECT_EQ(space.count(kDense, "sm_90a"), n);
  const Problem varlen_full = Problem::parse("b=16,h=32,hkv=8,s=8192,d=128,dtype=bf16,causal=0,varlen=128");
  const Problem dense_full = Problem::parse("b=16,h=32,hkv=8,s=8192,d=128,dtype=bf16,causal=0");
  EXPECT_GT(space.count(dense_full, "sm_90a"), space.count(varlen_full, "sm_90a"));
}

// A persistent varlen launch: at most one CTA per SM over the packed index space, the tile counter
// (two zeroed ints) and the kernel told the tile count. The counter is workspace 0 whether the call
// is ordered or not, the order 1: the launchers keep workspaces by index, and with the order first
// an ordered call's order served the next, unordered, call as its counter (tiles went unprocessed,
// GPU property test, 2026-11-26).
TEST(PrefillVarlen, WgmmaPersistentVarlenPlansTheCounterAfterTheOrder) {
  const SearchSpace space = space_of("flash_fwd_wgmma");
  const Config c = first_config(space, kVarlen, "sm_90a",
                                [](const Config& x) { return std::get<bool>(x.at("persistent")); });
  ASSERT_FALSE(c.empty());
  const RenderedKernel k = render_kernel(space, c, kVarlen, "sm_90a");
  const auto consts = launch_constants<attntune_plan::FlashFwdWgmmaLaunch>(k.launch.defines, "flash_fwd_wgmma");
  EXPECT_TRUE(consts.dynamic_tiles);
  EXPECT_FALSE(consts.split_tail);
  EXPECT_EQ(consts.cluster, 1);
  const auto dev = FakeDevice{}.device();
  const auto bm = std::get<std::int64_t>(c.at("block_m"));
  std::string why;
  for (const long long total_q : {70001LL, 300LL}) {  // ordered (enough work), and not
    attntune_plan::Call call = varlen_call_of(kVarlen, total_q, total_q);
    call.seqlen_q = call.seqlen_k = total_q < 1000 ? 40 : 8000;
    const auto plan = plan_call(k.launch, call, dev, &why);
    ASSERT_TRUE(plan) << why;
    const bool ordered = total_q > 1000;
    ASSERT_EQ(plan->launches, ordered ? 2 : 1) << total_q;
    const auto& main = plan->launch[ordered ? 1 : 0];
    const unsigned tiles = static_cast<unsigned>((total_q / bm + 16) * 32);
    EXPECT_EQ(main.grid[0], std::min(tiles, static_cast<unsigned>(dev.sm_count))) << total_q;
    EXPECT_EQ(main.grid[1] * main.grid[2] * main.cluster, 1u);
    ASSERT_EQ(plan->workspaces, ordered ? 2 : 1);
    const auto& counter = plan->workspace[0];
    EXPECT_EQ(counter.bytes, 2 * sizeof(int));
    EXPECT_TRUE(counter.zeroed);
    if (ordered) {
      EXPECT_EQ(plan->workspace[1].bytes, (2u * 16 + 1) * sizeof(int));
      EXPECT_FALSE(plan->workspace[1].zeroed);
    }

    int order_ws = 0, count_ws = 0;
    alignas(64) static unsigned char map_bytes[attntune_plan::kMaxTensorMaps][attntune_plan::kTensorMapBytes];
    attntune_plan::Resources res;
    std::memset(&res, 0, sizeof res);
    for (int m = 0; m < attntune_plan::kMaxTensorMaps; ++m) res.map[m] = map_bytes[m];
    res.workspace[0] = &count_ws;
    res.workspace[1] = ordered ? &order_ws : nullptr;
    attntune_plan::Args args;
    attntune_plan::Why bwhy;
    bwhy.text[0] = 0;
    ASSERT_EQ(consts.bind(call, *plan, res, ordered ? 1 : 0, &args, &bwhy), 0) << bwhy.text;
    att::TmaMaps maps;
    std::memcpy(&maps, args.ptr[1], sizeof maps);
    EXPECT_EQ(maps.varlen_order, ordered ? &order_ws : nullptr) << total_q;
    EXPECT_EQ(maps.tile_count, &count_ws) << total_q;
    EXPECT_EQ(maps.varlen_tiles, static_cast<int>(tiles)) << total_q;
    EXPECT_EQ(maps.split_tail, 0);
    if (ordered) {  // the order kernel writes workspace 1
      attntune_plan::Args oargs;
      ASSERT_EQ(consts.bind(call, *plan, res, 0, &oargs, &bwhy), 0) << bwhy.text;
      ASSERT_EQ(oargs.count, 2);
      int* order_arg = nullptr;
      std::memcpy(&order_arg, oargs.ptr[1], sizeof order_arg);
      EXPECT_EQ(order_arg, &order_ws);
    }
  }
}

TEST(PrefillVarlen, MmaPlansTheLongestSequencesGridForVarlenBuildsOnly) {
  const SearchSpace space = space_of("flash_fwd_mma");
  const Config c = first_config(space, kVarlen, "sm_90", [](const Config&) { return true; });
  const auto varlen = render_kernel(space, c, kVarlen, "sm_90").launch;
  const auto dense = render_kernel(space, c, kDense, "sm_90").launch;
  const auto dev = FakeDevice{}.device();
  const auto bm = std::get<std::int64_t>(c.at("block_m"));

  attntune_plan::Call call = varlen_call_of(kVarlen, -1, -1);  // no totals: cp.async needs none
  call.seqlen_q = 5000;                                        // max_seqlen_q
  std::string why;
  const auto plan = plan_call(varlen, call, dev, &why);
  ASSERT_TRUE(plan) << why;
  EXPECT_EQ(plan->launch[0].grid[0], static_cast<unsigned>((5000 + bm - 1) / bm));
  EXPECT_EQ(plan->launch[0].grid[1], 32u);
  EXPECT_EQ(plan->launch[0].grid[2], 16u);

  EXPECT_FALSE(plan_call(dense, call, dev, &why));
  EXPECT_NE(why.find("varlen=N"), std::string::npos) << why;
  EXPECT_FALSE(plan_call(varlen, dense_call_of(kDense), dev, &why));
  EXPECT_NE(why.find("serves attntune_attention_forward_varlen only"), std::string::npos) << why;
  call.cu_seqlens_k = nullptr;
  EXPECT_FALSE(plan_call(varlen, call, dev, &why));
  EXPECT_NE(why.find("cu_seqlens_q and cu_seqlens_k must not be NULL"), std::string::npos) << why;
}

TEST(PrefillVarlen, WgmmaMapsSpanThePackedRowsAndNeedTheirCounts) {
  const SearchSpace space = space_of("flash_fwd_wgmma");
  const Config c = first_config(space, kVarlen, "sm_90a", [](const Config&) { return true; });
  ASSERT_FALSE(c.empty());
  const auto launch = render_kernel(space, c, kVarlen, "sm_90a").launch;
  const auto dev = FakeDevice{}.device();
  std::string why;
  // The contract's entry point says no totals: refused, naming the one that does.
  EXPECT_FALSE(plan_call(launch, varlen_call_of(kVarlen, -1, -1), dev, &why));
  EXPECT_NE(why.find("attntune_attention_forward_varlen_packed"), std::string::npos) << why;

  attntune_plan::Call call = varlen_call_of(kVarlen, 70001, 70001);
  call.seqlen_q = call.seqlen_k = 8000;  // max_seqlen: no part of the grid
  const auto plan = plan_call(launch, call, dev, &why);
  ASSERT_TRUE(plan) << why;
  // That much work orders the sequences longest first: one CTA of the order kernel, with its
  // workspace (the order and each sequence's first tile), then the main kernel.
  ASSERT_EQ(plan->launches, 2);
  EXPECT_EQ(plan->launch[0].kernel, 1);
  EXPECT_EQ(plan->launch[0].grid[0] * plan->launch[0].grid[1] * plan->launch[0].grid[2], 1u);
  EXPECT_EQ(plan->launch[0].block, static_cast<unsigned>(att::kVarlenOrderThreads));
  ASSERT_EQ(plan->workspaces, 1);
  EXPECT_EQ(plan->workspace[0].bytes, (2u * 16 + 1) * sizeof(int));
  EXPECT_TRUE(plan->workspace[0].optional);  // without it the main kernel runs in the packed order
  // One CTA per tile of the packed index space: (total_q / block_m + batch) * heads_q.
  const auto bm = std::get<std::int64_t>(c.at("block_m"));
  const auto& main = plan->launch[1];
  EXPECT_EQ(main.kernel, 0);
  EXPECT_EQ(main.grid[0], static_cast<unsigned>((70001 / bm + 16) * 32));
  EXPECT_EQ(main.grid[1], 1u);
  EXPECT_EQ(main.grid[2], 1u);
  EXPECT_EQ(main.cluster, 1u);
  ASSERT_EQ(plan->maps, 3);
  for (int m = 0; m < 3; ++m) {
    EXPECT_EQ(plan->map[m].dims[1], 70001u) << m;  // the packed rows
    EXPECT_EQ(plan->map[m].dims[2], m == 0 ? 32u : 8u) << m;
    EXPECT_EQ(plan->map[m].dims[3], 1u) << m;      // one batch
    EXPECT_EQ(plan->map[m].strides[0], static_cast<unsigned long long>((m == 0 ? 32 : 8) * 128 * 2)) << m;  // a row
  }
  // No keys at all: q stands in for the K/V maps, as in a dense call with seqlen_k 0.
  const auto no_keys = plan_call(launch, varlen_call_of(kVarlen, 100, 0), dev, &why);
  ASSERT_TRUE(no_keys) << why;
  EXPECT_EQ(no_keys->map[1].dims[1], 100u);
}

// The packed order stays where ordering would not pay (little work, one sequence) or cannot run
// (more sequences than the order kernel's CTA has threads).
TEST(PrefillVarlen, WgmmaOrdersLongestFirstOnlyWhereItPays) {
  const SearchSpace space = space_of("flash_fwd_wgmma");
  const Config c = first_config(space, kVarlen, "sm_90a", [](const Config&) { return true; });
  const auto launch = render_kernel(space, c, kVarlen, "sm_90a").launch;
  const auto dev = FakeDevice{}.device();
  std::string why;
  auto launches = [&](long long total, int max_len, int batch) {
    attntune_plan::Call call = varlen_call_of(kVarlen, total, total);
    call.seqlen_q = call.seqlen_k = max_len;
    call.batch = batch;
    const auto plan = plan_call(launch, call, dev, &why);
    EXPECT_TRUE(plan) << why;
    return plan ? plan->launches : 0;
  };
  // 4 * 32 heads * 128 * total * max_len / 2 (causal) against 2.4e11.
  EXPECT_EQ(launches(70001, 8000, 16), 2);
  EXPECT_EQ(launches(4096, 512, 8), 1);      // ~1.4e10: a few microseconds of work
  EXPECT_EQ(launches(70001, 8000, 1), 1);    // one sequence: nothing to order
  EXPECT_EQ(launches(70001, 8000, att::kVarlenOrderThreads), 2);
  EXPECT_EQ(launches(70001, 8000, att::kVarlenOrderThreads + 1), 1);
  // A dense build never orders.
  EXPECT_EQ(plan_call(render_kernel(space, c, kDense, "sm_90a").launch, dense_call_of(kDense), dev, &why)->launches, 1);
}

// A spread of varlen configs compiles for each arch the spaces list (sm_80 and sm_89: the L4).
TEST(PrefillVarlen, VarlenBuildsCompileForEveryArch) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  struct Case {
    const char* family;
    const char* arch;
    const char* problem;
  } cases[] = {
      {"flash_fwd_mma", "sm_80", "b=4,h=8,hkv=2,s=2048,d=64,dtype=fp16,causal=0,varlen=1"},
      {"flash_fwd_mma", "sm_89", "b=4,h=8,s=2048,d=128,dtype=bf16,causal=1,varlen=7"},
      {"flash_fwd_mma", "sm_90", "b=4,h=8,s=2048,d=256,dtype=bf16,causal=1,varlen=7"},
      {"flash_fwd_wgmma", "sm_90a", "b=4,h=8,hkv=2,s=2048,d=128,dtype=bf16,causal=1,varlen=7"},
      {"flash_fwd_wgmma", "sm_90a", "b=4,h=8,s=2048,d=64,dtype=fp16,causal=0,varlen=7"},
      {"flash_fwd_wgmma", "sm_90a", "b=4,h=8,s=2048,d=256,dtype=bf16,causal=0,varlen=7"},
  };
  for (const Case& k : cases) {
    const SearchSpace space = space_of(k.family);
    const Problem p = Problem::parse(k.problem);
    // With a producer warpgroup when the space has one (its loads take the sequence's rows).
    const Config c = first_config(space, p, k.arch, [](const Config& x) {
      return !x.count("warp_specialize") || std::get<bool>(x.at("warp_specialize"));
    });
    ASSERT_FALSE(c.empty()) << k.family << " " << k.problem;
    cuda::CompileOptions opts{k.arch, family_nvrtc_options(k.family), true, 0};
    const auto out = cuda::nvrtc_compile(render_kernel(space, c, p, k.arch).source, "k.cu", opts);
    EXPECT_TRUE(out.ok) << k.family << " " << k.arch << " " << config_str(c) << "\n" << out.log;
    EXPECT_EQ(out.spill_stores, 0) << k.family << " " << k.arch << " " << config_str(c);
  }
}

// flash_fwd_wgmma's packed index space (kernel.cu, varlen_tile): sequence b's blocks start at
// floor(cu[b] / block_m) + b; for any packing these starts increase, a sequence's blocks fit before
// the next one's start, and the index space (total / block_m + batch) holds them all. Checked here
// on the arithmetic the kernel does, over ragged packings with empty sequences.
TEST(PrefillVarlen, ThePackedIndexSpaceHoldsEveryBlockOnce) {
  std::uint64_t state = 7;
  auto next = [&]() { state = state * 6364136223846793005ull + 1442695040888963407ull; return state >> 33; };
  for (int trial = 0; trial < 2000; ++trial) {
    const int bm = trial % 3 == 0 ? 64 : trial % 3 == 1 ? 128 : 192, batch = 1 + static_cast<int>(next() % 40);
    std::vector<int> cu = {0};
    for (int b = 0; b < batch; ++b) cu.push_back(cu.back() + (next() % 4 == 0 ? 0 : static_cast<int>(next() % 700)));
    const int space = cu.back() / bm + batch;
    std::vector<int> owner(static_cast<std::size_t>(space), -1);
    for (int b = 0; b < batch; ++b) {
      const int start = cu[b] / bm + b, blocks = (cu[b + 1] - cu[b] + bm - 1) / bm;
      if (b > 0) {
        ASSERT_GT(start, cu[b - 1] / bm + b - 1);
      }
      for (int x = 0; x < blocks; ++x) {
        ASSERT_LT(start + x, space) << "trial " << trial;
        ASSERT_EQ(owner[static_cast<std::size_t>(start + x)], -1) << "trial " << trial;
        owner[static_cast<std::size_t>(start + x)] = b;
      }
    }
    // The kernel's search: the last sequence starting at or before i owns i (or nobody does).
    for (int i = 0; i < space; ++i) {
      int lo = 0, hi = batch - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (cu[mid] / bm + mid <= i) lo = mid;
        else hi = mid - 1;
      }
      const int blocks = (cu[lo + 1] - cu[lo] + bm - 1) / bm, x = i - (cu[lo] / bm + lo);
      if (owner[static_cast<std::size_t>(i)] >= 0) ASSERT_EQ(lo, owner[static_cast<std::size_t>(i)]) << trial;
      else ASSERT_TRUE(x >= blocks || x < 0) << trial;
    }
  }
}
}  // namespace test_prefill_varlen
