// flash_decode on the CPU: its space offers configs for every decode suite row and every head dim
// a multiple of 16 from 32 to 256, and refuses what it cannot serve (multiples of 8 that are not
// of 16 with the reason); a spread of its configs compiles with NVRTC for sm_80, sm_89 and sm_90
// without spills, and the configs nearest their register cap of each other head dim; its launch
// plan splits the keys by the SM count, asks for its workspaces, launches the combine kernel or
// not, sizes its TMA boxes and their swizzle by the tiles' column blocks, and refuses
// prefill-sized calls, bad page tables and pages whose boxes TMA cannot place with a reason.
#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cuda/nvrtc.hpp"
#include "eval/build_pool.hpp"
#include "tests/common/plan_call.hpp"
#include "tests/common/run_attntune.hpp"
#include "templates/common/tma_encode.h"
#include "templates/flash_decode/launch.h"

namespace test_flash_decode_build {
using namespace attntune;

namespace {

SearchSpace load_space() { return SearchSpace::load(ATTNTUNE_SOURCE_DIR "/search_spaces/flash_decode.yaml"); }

// The decode suite (issue 24): each row and its paged variants.
const char* kSuite[] = {
    "b=1,h=32,hkv=8,s=1,sk=32768,d=128,dtype=bf16,causal=0",
    "b=16,h=32,hkv=8,s=1,sk=8192,d=128,dtype=bf16,causal=0",
    "b=128,h=32,hkv=8,s=1,sk=2048,d=128,dtype=bf16,causal=0",
    "b=32,h=64,hkv=8,s=4,sk=4096,d=128,dtype=bf16,causal=1",
    "b=64,h=16,hkv=16,s=1,sk=4096,d=64,dtype=fp16,causal=0",
};

std::vector<Config> spread(const std::vector<Config>& all, std::size_t n) {
  if (n == 0 || n >= all.size()) return all;
  std::vector<Config> out;
  for (std::size_t i = 0; i < n; ++i) out.push_back(all[i * all.size() / n]);
  return out;
}

attntune_plan::Plan plan_of(const SearchSpace& space, const Config& c, const Problem& p, const attntune_plan::Call& call,
                            int sms = 132, std::string* why = nullptr) {
  const auto plan = plan_call(render_kernel(space, c, p, "sm_90").launch, call, attntune::testing::FakeDevice{sms}.device(), why);
  return plan ? *plan : attntune_plan::empty_plan();
}

// The tuner's build pool for flash_decode (NVRTC in worker processes).
BuildPoolOptions decode_pool_options() {
  BuildPoolOptions o;
  o.nvrtc_options = family_nvrtc_options("flash_decode");
  o.worker_argv = {attntune::testing::attntune_bin(), "build-worker"};
  return o;
}

// Every build the pool returns compiled and spilled nothing (named by arch, config and registers),
// and all `submitted` came back.
void expect_clean_builds(BuildPool& pool, std::size_t submitted) {
  std::size_t built = 0;
  while (auto o = pool.next()) {
    ++built;
    EXPECT_EQ(o->build.status, "ok") << config_str(o->job.config) << "\n" << o->build.log;
    EXPECT_EQ(o->build.spill_stores + o->build.spill_loads, 0)
        << o->job.arch << " " << config_str(o->job.config) << ": " << o->build.registers << " registers";
  }
  EXPECT_EQ(built, submitted);
}

Config with(const SearchSpace& space, const Problem& p, const char* combine) {
  Config found;
  space.for_each_valid(p, "sm_90", [&](const Config& c) {
    if (found.empty() && std::get<std::string>(c.at("combine")) == combine) found = c;
  });
  return found;
}

}  // namespace

TEST(FlashDecodeSpace, EverySuiteRowHasConfigsPagedOrNot) {
  const SearchSpace space = load_space();
  for (const char* row : kSuite)
    for (const char* page : {"", ",page=16", ",page=256"}) {
      const Problem p = Problem::parse(std::string(row) + page);
      EXPECT_GT(space.count(p, "sm_90"), 8u) << p.str();
      EXPECT_GT(space.count(p, "sm_80"), 0u) << p.str();
      EXPECT_GT(space.count(p, "sm_89"), 0u) << p.str();
      EXPECT_LT(space.count(p, "sm_90"), 1000u) << p.str();
      check_family_serves("flash_decode", p);
    }
  // Prefill-sized queries belong to the prefill families. Those serve a paged cache too (chunked
  // prefill), but their spaces leave decode-length paged problems (16 rows or fewer) to this one.
  const Problem prefill = Problem::parse("b=1,h=8,s=17,d=128,dtype=bf16,causal=0");
  EXPECT_THROW(space.check_problem(prefill, "sm_90"), InputError);
  const Problem paged_decode = Problem::parse(std::string(kSuite[0]) + ",page=16");
  EXPECT_NO_THROW(check_family_serves("flash_fwd_mma", paged_decode));
  for (const char* family : {"flash_fwd_mma", "flash_fwd_wgmma"}) {
    const SearchSpace prefill_space = SearchSpace::load(ATTNTUNE_SOURCE_DIR "/search_spaces/" + std::string(family) + ".yaml");
    try {
      prefill_space.check_problem(paged_decode, prefill_space.default_arch());
      ADD_FAILURE() << family << " takes the paged decode problem " << paged_decode.str();
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("flash_decode"), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(check_family_serves("flash_fwd_mma", Problem::parse(kSuite[0])));
}

// The head dims besides 64, 128 and 256 (column blocks of 32 or 16 elements, or block loads).
const int kOtherDims[] = {32, 48, 80, 96, 112, 144, 160, 176, 192, 208, 224, 240};

TEST(FlashDecodeSpace, EveryHeadDimOfSixteenHasConfigsAndOthersAreRefusedWithAReason) {
  const SearchSpace space = load_space();
  for (int d = 32; d <= 256; d += 16)
    for (const char* kind : {"b=1,h=32,hkv=8,s=1,sk=4096,causal=0", "b=4,h=64,hkv=8,s=4,sk=4096,causal=1,page=16",
                             "b=4,h=16,hkv=2,s=2,sk=4096,causal=1,page=7,window=127,softcap=30,sinks=1"}) {
      const Problem p = Problem::parse(fmt::format("{},d={},dtype=bf16", kind, d));
      for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90"})
        EXPECT_GT(space.count(p, arch), 0u) << p.str() << " " << arch;
      EXPECT_GT(space.count(p, "sm_90"), 8u) << p.str();
      check_family_serves("flash_decode", p);
    }
  for (int d : {40, 72, 88, 136, 200, 248}) {
    const Problem p = Problem::parse(fmt::format("b=1,h=32,hkv=8,s=1,sk=4096,d={},dtype=bf16,causal=0", d));
    try {
      space.check_problem(p, "sm_90");
      ADD_FAILURE() << "d=" << d << " is served";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("multiples of 16"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(space.check_problem(Problem::parse("b=1,h=8,hkv=8,s=1,sk=4096,d=512,dtype=bf16,causal=0"), "sm_90"),
               InputError);
  // Paged TMA boxes fill 128 bytes (launch.h): with 64-byte rows (d=96) even pages only, with 32-byte
  // rows (d=80) multiples of 4; cp.async serves any page.
  for (const auto& [d, page, tma] :
       {std::tuple{96, 7, false}, {96, 6, true}, {80, 6, false}, {80, 12, true}, {128, 7, true}}) {
    const Problem p =
        Problem::parse(fmt::format("b=4,h=32,hkv=8,s=1,sk=4096,d={},dtype=bf16,causal=0,page={}", d, page));
    std::size_t with_tma = 0, total = 0;
    space.for_each_valid(p, "sm_90", [&](const Config& c) {
      ++total;
      with_tma += std::get<std::string>(c.at("kv_load")) == "tma";
    });
    EXPECT_GT(total, 0u) << p.str();
    EXPECT_EQ(with_tma > 0, tma) << p.str();
  }
}

TEST(FlashDecodePlan, TmaBoxesAreTheColumnBlocksSwizzledByTheirSpan) {
  const SearchSpace space = load_space();
  for (const auto& [d, cols] : {std::pair{128, 64}, {192, 64}, {96, 32}, {160, 32}, {80, 16}, {112, 16}}) {
    const Problem p = Problem::parse(fmt::format("b=2,h=32,hkv=8,s=1,sk=4096,d={},dtype=bf16,causal=0", d));
    Config c;
    space.for_each_valid(p, "sm_90", [&](const Config& x) {
      if (c.empty() && std::get<std::string>(x.at("kv_load")) == "tma") c = x;
    });
    ASSERT_FALSE(c.empty()) << d;
    const int block_n = static_cast<int>(std::get<std::int64_t>(c.at("block_n")));
    const attntune_plan::Plan dense = plan_of(space, c, p, attntune::testing::dense_call_of(p));
    ASSERT_EQ(dense.maps, 2) << d;
    for (int m = 0; m < 2; ++m) {
      EXPECT_EQ(dense.map[m].box[0], static_cast<unsigned>(cols)) << d;
      EXPECT_EQ(dense.map[m].box[1], static_cast<unsigned>(block_n)) << d;
      EXPECT_EQ(dense.map[m].swizzle_bytes, 2 * cols) << d;
      EXPECT_EQ(dense.map[m].l2_promotion, 128) << d;  // launch.h: kDecodeL2Promotion, runs 377-378
    }
    // Paged: boxes of gcd(page, block_n) rows, swizzled when they are a multiple of 8 rows; a box
    // of a column block must fill 128 bytes, else the plan refuses and says why.
    for (int page : {16, 12, 6, 7, 1}) {
      auto paged = attntune::testing::dense_call_of(p);
      paged.entry = attntune_plan::kEntryKvcache;
      paged.block_table = reinterpret_cast<const int*>(std::uintptr_t{1} << 20);
      paged.page_size = page;
      paged.max_blocks_per_seq = (4096 + page - 1) / page;
      std::string why;
      const attntune_plan::Plan plan = plan_of(space, c, p, paged, 132, &why);
      const int rows = std::gcd(page, block_n);
      if (rows * cols * 2 % 128 != 0) {
        EXPECT_NE(why.find("128-byte"), std::string::npos) << "d " << d << " page " << page << ": " << why;
        continue;
      }
      ASSERT_EQ(why, "") << d << " page " << page;
      ASSERT_EQ(plan.maps, 2);
      EXPECT_EQ(plan.map[0].box[0], static_cast<unsigned>(cols));
      EXPECT_EQ(plan.map[0].box[1], static_cast<unsigned>(rows));
      EXPECT_EQ(plan.map[0].swizzle_bytes, rows % 8 == 0 ? 2 * cols : 0) << d << " page " << page;
      EXPECT_EQ(plan.map[0].l2_promotion, 128) << d << " page " << page;
      EXPECT_EQ(plan.map[1].l2_promotion, 128) << d << " page " << page;
    }
  }
  // What the encoder passes TMA for a map's bytes: 0 (every other family's maps) stays 256.
  EXPECT_EQ(attntune_plan::tma_l2_promotion(0), CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
  EXPECT_EQ(attntune_plan::tma_l2_promotion(256), CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
  EXPECT_EQ(attntune_plan::tma_l2_promotion(128), CU_TENSOR_MAP_L2_PROMOTION_L2_128B);
  EXPECT_EQ(attntune_plan::tma_l2_promotion(64), CU_TENSOR_MAP_L2_PROMOTION_L2_64B);
}

TEST(FlashDecodePlan, SplitsFollowTheSmCountAndAskForTheirWorkspace) {
  const SearchSpace space = load_space();
  const Problem p = Problem::parse(kSuite[0]);  // one sequence, 8 kv heads: the keys must be split
  for (const char* combine : {"kernel", "last_cta"}) {
    const Config c = with(space, p, combine);
    ASSERT_FALSE(c.empty()) << combine;
    const attntune_plan::Plan plan = plan_of(space, c, p, attntune::testing::dense_call_of(p));
    ASSERT_GE(plan.launches, 1);
    const unsigned ctas = plan.launch[0].grid[0] * plan.launch[0].grid[1] * plan.launch[0].grid[2];
    EXPECT_GE(ctas, 64u) << "8 units spread over the 132 SMs: " << config_str(c);
    EXPECT_EQ(plan.launch[0].grid[1], 8u);  // kv heads
    ASSERT_GE(plan.workspaces, 1);
    EXPECT_EQ(plan.workspace[0].optional, 1);
    if (std::string(combine) == "kernel") {
      EXPECT_EQ(plan.launches, 2);
      EXPECT_EQ(plan.launch[1].kernel, 1);
      EXPECT_EQ(plan.workspaces, 1);
    } else {
      EXPECT_EQ(plan.launches, 1);
      ASSERT_EQ(plan.workspaces, 2);
      EXPECT_EQ(plan.workspace[1].zeroed, 1);  // the counters the last CTA resets
    }
    // Fewer SMs, fewer splits.
    const attntune_plan::Plan small = plan_of(space, c, p, attntune::testing::dense_call_of(p), 24);
    EXPECT_LT(small.launch[0].grid[0], plan.launch[0].grid[0]) << config_str(c);
  }
  // A batch that fills the GPU by itself needs no split: no workspace, no combine.
  const Problem big = Problem::parse(kSuite[2]);
  const Config c = with(space, big, "kernel");
  const attntune_plan::Plan plan = plan_of(space, c, big, attntune::testing::dense_call_of(big));
  EXPECT_EQ(plan.launches, 1) << config_str(c);
  EXPECT_EQ(plan.workspaces, 0);
}

TEST(FlashDecodePlan, ClusterCombineSplitsIntoWholeClusters) {
  const SearchSpace space = load_space();
  // s=4 with 8 query heads a kv head: 32 packed rows, row blocks of 16 or 32.
  const Problem p = Problem::parse(kSuite[3]);
  for (const char* combine : {"cluster2", "cluster4", "cluster8", "cluster16"}) {
    const Config c = with(space, p, combine);
    ASSERT_FALSE(c.empty()) << combine;
    const int n = std::atoi(combine + 7);
    const Defines defs = kernel_defines(space, c, p, "sm_90");
    auto define = [&](const char* name) {
      for (const auto& [k, v] : defs)
        if (k == name) return v;
      ADD_FAILURE() << "no " << name;
      return std::int64_t{0};
    };
    EXPECT_EQ(define("CLUSTER"), n) << combine;
    const unsigned row_blocks = static_cast<unsigned>((8 * 4 + define("BLOCK_M") - 1) / define("BLOCK_M"));
    for (int sms : {132, 24}) {  // 256 units: one cluster a unit, whatever the SM count
      const attntune_plan::Plan plan = plan_of(space, c, p, attntune::testing::dense_call_of(p), sms);
      ASSERT_EQ(plan.launches, 1) << combine;
      EXPECT_EQ(plan.launch[0].grid[0], n * row_blocks) << combine;
      EXPECT_EQ(plan.launch[0].grid[1], 8u);
      EXPECT_EQ(plan.launch[0].grid[2], 32u);
      EXPECT_EQ(plan.launch[0].cluster, static_cast<unsigned>(n)) << combine;
      EXPECT_EQ(plan.workspaces, 0) << combine;  // merged in distributed shared memory
    }
  }
  // A unit that wants more splits than a cluster holds (one sequence: 8 units on 132 SMs) gets
  // whole clusters, each merging into a workspace piece, and the last cluster's counters.
  const Problem one = Problem::parse(kSuite[0]);
  const attntune_plan::Plan by_sms = plan_of(space, with(space, one, "last_cta"), one, attntune::testing::dense_call_of(one));
  const unsigned want = by_sms.launch[0].grid[0];  // the wave model's splits (row_blocks 1)
  ASSERT_GE(want, 8u);
  for (const char* combine : {"cluster2", "cluster4", "cluster8", "cluster16"}) {
    const unsigned n = static_cast<unsigned>(std::atoi(combine + 7));
    const attntune_plan::Plan plan = plan_of(space, with(space, one, combine), one, attntune::testing::dense_call_of(one));
    const unsigned groups = std::max(1u, want / n);
    EXPECT_EQ(plan.launch[0].grid[0], groups * n) << combine;
    EXPECT_EQ(plan.launch[0].cluster, n) << combine;
    if (groups > 1) {
      ASSERT_EQ(plan.workspaces, 2) << combine;
      EXPECT_EQ(plan.workspace[0].bytes, groups * 32ull * 129 * 4) << combine;  // a piece per cluster: O and LSE
      EXPECT_EQ(plan.workspace[0].optional, 1);
      EXPECT_EQ(plan.workspace[1].zeroed, 1);  // the counters the last cluster resets
      EXPECT_EQ(plan.workspace[1].optional, 1);
    } else {
      EXPECT_EQ(plan.workspaces, 0) << combine;
    }
  }
  // Other combines launch without clusters.
  const attntune_plan::Plan plan = plan_of(space, with(space, p, "last_cta"), p, attntune::testing::dense_call_of(p));
  EXPECT_EQ(plan.launch[0].cluster, 1u);
  // Clusters are sm_90's: the space offers them nowhere else.
  for (const char* arch : {"sm_80", "sm_86", "sm_89"})
    space.for_each_valid(p, arch, [&](const Config& c) {
      EXPECT_EQ(std::get<std::string>(c.at("combine")).rfind("cluster", 0), std::string::npos) << arch;
    });
}

TEST(FlashDecodePlan, RefusesWhatItCannotServeWithAReason) {
  const SearchSpace space = load_space();
  const Problem p = Problem::parse(kSuite[0]);
  const Config c = with(space, p, "kernel");
  std::string why;
  Problem long_q = p;
  long_q.s = 17;
  plan_of(space, c, p, attntune::testing::dense_call_of(long_q), 132, &why);
  EXPECT_NE(why.find("seqlen_q"), std::string::npos) << why;
  why.clear();
  auto paged = attntune::testing::dense_call_of(p);
  paged.entry = attntune_plan::kEntryKvcache;
  paged.block_table = reinterpret_cast<const int*>(std::uintptr_t{1} << 20);
  paged.page_size = 16;
  paged.max_blocks_per_seq = 10;  // 160 keys of 32768
  plan_of(space, c, p, paged, 132, &why);
  EXPECT_NE(why.find("max_blocks_per_seq"), std::string::npos) << why;
  why.clear();
  auto varlen = attntune::testing::dense_call_of(p);
  varlen.entry = attntune_plan::kEntryVarlen;
  plan_of(space, c, p, varlen, 132, &why);
  EXPECT_NE(why.find("attntune_attention_forward_kvcache"), std::string::npos) << why;
}

class FlashDecodeBuild : public ::testing::TestWithParam<std::tuple<int, const char*>> {};

// CI compiles the space for every arch it lists: a spread of configs (dtype and causal alternating)
// builds with no spills.
TEST_P(FlashDecodeBuild, SampledValidConfigsCompileWithoutSpills) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const auto [d, arch] = GetParam();
  const SearchSpace space = load_space();
  const std::size_t n = attntune::testing::build_sample(6);
  BuildPool pool(decode_pool_options());
  std::size_t submitted = 0;
  for (const char* kind : {"h=32,hkv=8,s=1,causal=0", "h=64,hkv=8,s=4,causal=1"}) {
    const Problem p = Problem::parse(fmt::format("b=4,{},sk=4096,d={},dtype=bf16", kind, d));
    for (const Config& c : spread(space.enumerate(p, arch), n)) {
      Problem v = p;
      v.dtype = submitted++ % 2 ? DType::kFp16 : DType::kBf16;
      pool.submit({c, render_kernel(space, c, v, arch), arch});
    }
  }
  ASSERT_GT(submitted, 0u);
  std::size_t built = 0;
  while (auto o = pool.next()) {
    ++built;
    EXPECT_EQ(o->build.status, "ok") << config_str(o->job.config) << "\n" << o->build.log;
    EXPECT_EQ(o->build.spill_stores + o->build.spill_loads, 0) << config_str(o->job.config);
    EXPECT_GT(o->build.registers, 0) << "ptxas resource report missing";
  }
  EXPECT_EQ(built, submitted);
}

// Every other head dim, on sm_80, sm_89 and sm_90 in turn: the config nearest its register cap
// (the space's est_regs against the launch bounds' share of a scheduler's registers) for decoding
// (s=1, dense; on sm_90 a clustered one) and for a paged causal s=4 call (every variant on every
// other dim; on sm_90 a TMA one) builds with no spills.
TEST(FlashDecodeBuild, EveryOtherHeadDimsTightestConfigsCompileWithoutSpills) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = load_space();
  BuildPool pool(decode_pool_options());
  const char* const archs[] = {"sm_80", "sm_89", "sm_90"};
  std::size_t submitted = 0, i = 0;
  for (int d : kOtherDims) {
    const char* arch = archs[i % 3];
    const bool variants = i++ % 2 == 1;
    for (const bool paged : {false, true}) {
      const Problem p = Problem::parse(
          paged ? fmt::format("b=4,h=64,hkv=8,s=4,sk=4096,d={},dtype={},causal=1,page=16{}", d,
                              variants ? "fp16" : "bf16", variants ? ",window=127,softcap=30,sinks=1" : "")
                : fmt::format("b=4,h=32,hkv=8,s=1,sk=4096,d={},dtype=bf16,causal=0", d));
      Config tightest;
      std::int64_t least = 1 << 20;
      space.for_each_valid(p, arch, [&](const Config& c) {
        if (std::string(arch) == "sm_90" && std::get<std::string>(c.at(paged ? "kv_load" : "combine")) !=
                                                (paged ? "tma" : "cluster4"))
          return;
        std::int64_t threads = 0, est = 0;
        for (const auto& [k, v] : space.derive(c, p, arch)) {
          if (k == "threads") threads = v;
          if (k == "est_regs") est = v;
        }
        const std::int64_t per_scheduler = (threads * std::get<std::int64_t>(c.at("ctas_per_sm")) / 32 + 3) / 4;
        const std::int64_t room = std::min<std::int64_t>(255, 16384 / (per_scheduler * 32) / 8 * 8) - est;
        if (room < least) {
          least = room;
          tightest = c;
        }
      });
      ASSERT_FALSE(tightest.empty()) << p.str() << " " << arch;
      pool.submit({tightest, render_kernel(space, tightest, p, arch), arch});
      ++submitted;
    }
  }
  std::size_t built = 0;
  while (auto o = pool.next()) {
    ++built;
    EXPECT_EQ(o->build.status, "ok") << config_str(o->job.config) << "\n" << o->build.log;
    EXPECT_EQ(o->build.spill_stores + o->build.spill_loads, 0)
        << o->job.arch << " " << config_str(o->job.config) << ": " << o->build.registers << " registers";
    EXPECT_GT(o->build.registers, 0) << "ptxas resource report missing";
  }
  EXPECT_EQ(built, submitted);
}

INSTANTIATE_TEST_SUITE_P(DimsAndArchs, FlashDecodeBuild,
                         ::testing::Combine(::testing::Values(64, 128, 256), ::testing::Values("sm_80", "sm_89", "sm_90")),
                         [](const auto& info) {
                           return fmt::format("d{}_{}", std::get<0>(info.param), std::get<1>(info.param));
                         });

// ---- split head dims (`dv=N`: V's and O's head dim other than Q's and K's) ----------------------

namespace {

// DeepSeek's MLA decode (192 / 128), V wider than K (64 / 128) and narrower (128 / 64), and V's
// column blocks narrower than K's (128 / 96: 64-byte rows; 192 / 80: 32-byte rows) and wider (48 /
// 64: Q's 1536-byte rows padded so that the ring starts at V's 1024-byte swizzle repeat).
const std::pair<int, int> kSplitDims[] = {{192, 128}, {64, 128}, {128, 64}, {128, 96}, {192, 80}, {48, 64}};

// A dense call of a split-dim problem: V and O rows of dv ([B, H, S, D] tensors).
attntune_plan::Call split_call_of(const Problem& p) {
  attntune_plan::Call c = attntune::testing::dense_call_of(p);
  const long long dv = p.head_dim_v();
  c.head_dim_v = static_cast<int>(dv);
  c.v_stride[0] = p.hkv * p.sk * dv;
  c.v_stride[1] = p.sk * dv;
  c.v_stride[2] = dv;
  c.o_stride[0] = p.h * p.s * dv;
  c.o_stride[1] = p.s * dv;
  c.o_stride[2] = dv;
  return c;
}

}  // namespace

TEST(FlashDecodeSpace, SplitHeadDimsHaveConfigsOnEveryArchAndEntry) {
  const SearchSpace space = load_space();
  for (const auto& [d, dv] : kSplitDims)
    for (const char* kind : {"b=1,h=32,hkv=8,s=1,sk=4096,causal=0", "b=16,h=16,hkv=1,s=1,sk=4096,causal=0,page=64",
                             "b=4,h=64,hkv=8,s=4,sk=4096,causal=1,page=16",
                             "b=4,h=16,hkv=2,s=2,sk=4096,causal=1,page=16,window=127,softcap=30,sinks=1"}) {
      const Problem p = Problem::parse(fmt::format("{},d={},dv={},dtype=bf16", kind, d, dv));
      ASSERT_TRUE(p.split_dims());
      for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90"})
        EXPECT_GT(space.count(p, arch), 0u) << p.str() << " " << arch;
      EXPECT_GT(space.count(p, "sm_90"), 8u) << p.str();
      check_family_serves("flash_decode", p);
      // sm_90 offers its TMA loads and cluster merges for them too.
      std::size_t tma = 0, cluster = 0;
      space.for_each_valid(p, "sm_90", [&](const Config& c) {
        tma += std::get<std::string>(c.at("kv_load")) == "tma";
        cluster += std::get<std::string>(c.at("combine")).rfind("cluster", 0) == 0;
      });
      EXPECT_GT(tma, 0u) << p.str();
      EXPECT_GT(cluster, 0u) << p.str();
    }
  // V's head dim is refused off multiples of 16, as d is.
  try {
    space.check_problem(Problem::parse("b=1,h=32,hkv=8,s=1,sk=4096,d=192,dv=120,dtype=bf16,causal=0"), "sm_90");
    ADD_FAILURE() << "dv=120 is served";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("V's head dim must be a multiple of 16"), std::string::npos) << e.what();
  }
  // dv equal to d is one head dim: the same configs.
  const Problem one = Problem::parse("b=1,h=32,hkv=8,s=1,sk=4096,d=128,dtype=bf16,causal=0");
  const Problem same = Problem::parse("b=1,h=32,hkv=8,s=1,sk=4096,d=128,dv=128,dtype=bf16,causal=0");
  EXPECT_EQ(space.enumerate(one, "sm_90"), space.enumerate(same, "sm_90"));
  // Paged TMA boxes of V's column blocks fill 128 bytes too: V rows of 32 bytes (dv=80) under K's
  // of 128 need pages of a multiple of 4, as K's would.
  for (const auto& [page, tma] : {std::pair{6, false}, {12, true}}) {
    const Problem p =
        Problem::parse(fmt::format("b=4,h=32,hkv=8,s=1,sk=4096,d=192,dv=80,dtype=bf16,causal=0,page={}", page));
    std::size_t with_tma = 0;
    space.for_each_valid(p, "sm_90", [&](const Config& c) { with_tma += std::get<std::string>(c.at("kv_load")) == "tma"; });
    EXPECT_EQ(with_tma > 0, tma) << p.str();
  }
}

TEST(FlashDecodePlan, SplitHeadDimsSizeVsMapPiecesAndCombineByDv) {
  const SearchSpace space = load_space();
  for (const auto& [d, dv] : kSplitDims) {
    const Problem p = Problem::parse(fmt::format("b=1,h=32,hkv=8,s=1,sk=32768,d={},dv={},dtype=bf16,causal=0", d, dv));
    const attntune_plan::Call call = split_call_of(p);
    // TMA: K's map over d in K's column blocks, V's over dv in V's, each swizzled by its span.
    const Config t = attntune::testing::first_config(
        space, p, "sm_90", [](const Config& c) { return std::get<std::string>(c.at("kv_load")) == "tma"; });
    ASSERT_FALSE(t.empty()) << p.str();
    std::string why;
    const attntune_plan::Plan tp = plan_of(space, t, p, call, 132, &why);
    ASSERT_EQ(why, "") << p.str();
    ASSERT_EQ(tp.maps, 2);
    EXPECT_EQ(tp.map[0].dims[0], static_cast<unsigned long long>(d));
    EXPECT_EQ(tp.map[1].dims[0], static_cast<unsigned long long>(dv));
    EXPECT_EQ(tp.map[0].box[0], static_cast<unsigned>(att::decode_tile_cols(d)));
    EXPECT_EQ(tp.map[1].box[0], static_cast<unsigned>(att::decode_tile_cols(dv)));
    EXPECT_EQ(tp.map[0].swizzle_bytes, 2 * att::decode_tile_cols(d));
    EXPECT_EQ(tp.map[1].swizzle_bytes, 2 * att::decode_tile_cols(dv));
    EXPECT_EQ(tp.map[1].strides[0], static_cast<unsigned long long>(dv) * 2);  // V's rows
    // Split over the SMs: the pieces hold O's rows (dv floats and an LSE), the combine kernel's
    // CTAs cover them by dv's items.
    const Config k = with(space, p, "kernel");
    ASSERT_FALSE(k.empty()) << p.str();
    const attntune_plan::Plan kp = plan_of(space, k, p, call);
    ASSERT_EQ(kp.launches, 2) << p.str();
    ASSERT_EQ(kp.workspaces, 1);
    const unsigned long long rows = 32, block_m = 16;  // 4 query heads a kv head, s=1: one row block
    const unsigned long long splits = kp.launch[0].grid[0] / ((4 + block_m - 1) / block_m);
    EXPECT_EQ(kp.workspace[0].bytes, splits * rows * (dv + 1) * 4) << p.str();
    EXPECT_EQ(kp.launch[1].grid[0], (rows + att::decode_combine_rows(dv) - 1) / att::decode_combine_rows(dv));
    // A call of another V head dim (or of one head dim) is refused, naming it.
    attntune_plan::Call one = attntune::testing::dense_call_of(p);
    why.clear();
    plan_of(space, k, p, one, 132, &why);
    EXPECT_NE(why.find(fmt::format("built for head_dim_v {}", dv)), std::string::npos) << why;
  }
  // A build of one head dim refuses a split call.
  const Problem p = Problem::parse(kSuite[0]);
  attntune_plan::Call split = attntune::testing::dense_call_of(p);
  split.head_dim_v = 64;
  std::string why;
  plan_of(space, with(space, p, "kernel"), p, split, 132, &why);
  EXPECT_NE(why.find("built for one head dim (V's and O's as Q's and K's); the call has head_dim 128 and head_dim_v 64"),
            std::string::npos)
      << why;
  // Paged TMA: V boxes narrower than K's (dv=80: 32-byte rows) must fill 128 bytes as K's must.
  const Problem narrow = Problem::parse("b=1,h=32,hkv=8,s=1,sk=4096,d=192,dv=80,dtype=bf16,causal=0,page=12");
  const Config t = attntune::testing::first_config(
      space, narrow, "sm_90", [](const Config& c) { return std::get<std::string>(c.at("kv_load")) == "tma"; });
  ASSERT_FALSE(t.empty());
  attntune_plan::Call paged = split_call_of(narrow);
  paged.entry = attntune_plan::kEntryKvcache;
  paged.block_table = reinterpret_cast<const int*>(std::uintptr_t{1} << 20);
  paged.max_blocks_per_seq = 4096;
  for (const auto& [page, ok] : {std::pair{12, true}, {6, false}}) {
    paged.page_size = page;
    why.clear();
    const attntune_plan::Plan plan = plan_of(space, t, narrow, paged, 132, &why);
    if (!ok) {
      EXPECT_NE(why.find("V boxes"), std::string::npos) << why;
      continue;
    }
    ASSERT_EQ(why, "");
    EXPECT_EQ(plan.map[1].box[0], 16u);
    EXPECT_EQ(plan.map[1].box[1], 4u);           // gcd(12, block_n): 4 rows
    EXPECT_EQ(plan.map[1].swizzle_bytes, 0);     // fewer than 8 rows: unswizzled
  }
}

// Split-dim builds compile without spills on sm_80, sm_89 and sm_90: for each pair a spread of its
// decoding (s=1, dense) and paged causal s=4 configs with every variant, and on sm_90 its TMA and
// cluster configs.
TEST(FlashDecodeBuild, SplitHeadDimsCompileWithoutSpills) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = load_space();
  const std::size_t n = attntune::testing::build_sample(1);  // 18 builds (CI time); the sweep is in the space's comments
  BuildPool pool(decode_pool_options());
  std::size_t submitted = 0;
  const char* const archs[] = {"sm_80", "sm_89", "sm_90"};
  std::size_t i = 0;
  for (const auto& [d, dv] : {std::pair{192, 128}, {64, 128}, {128, 64}}) {
    for (const char* arch : archs)
      for (const char* kind : {"b=4,h=32,hkv=8,s=1,sk=4096,causal=0,dtype=bf16",
                               "b=4,h=64,hkv=8,s=4,sk=4096,causal=1,page=16,dtype=fp16,window=127,softcap=30,sinks=1"}) {
        const Problem p = Problem::parse(fmt::format("{},d={},dv={}", kind, d, dv));
        std::vector<Config> all = space.enumerate(p, arch);
        if (std::string(arch) == "sm_90")  // its TMA or cluster configs, in turn
          std::erase_if(all, [&](const Config& c) {
            return i % 2 ? std::get<std::string>(c.at("kv_load")) != "tma"
                         : std::get<std::string>(c.at("combine")).rfind("cluster", 0) != 0;
          });
        ++i;
        for (const Config& c : spread(all, n)) {
          pool.submit({c, render_kernel(space, c, p, arch), arch});
          ++submitted;
        }
      }
  }
  ASSERT_GT(submitted, 0u);
  expect_clean_builds(pool, submitted);
}

// FP8 caches (`kv_dtype=fp8`, issue 42): configs on sm_89 and sm_90 only (the e4m3 conversions), at
// head dims that are multiples of 32, each refusal with its reason; the plan sees the cache as rows
// of d / 2 16-bit elements (its TMA maps), refuses a 16-bit call to an FP8 build and the reverse,
// and byte strides off 16; and a spread of FP8 builds compiles without spills on sm_89 and sm_90.
TEST(FlashDecodeSpace, Fp8CachesHaveConfigsFromSm89AtMultiplesOf32) {
  const SearchSpace space = load_space();
  for (int d : {64, 128, 256})
    for (const char* arch : {"sm_89", "sm_90"}) {
      const Problem p = Problem::parse(
          fmt::format("b=16,h=32,hkv=8,s=1,sk=8192,d={},dtype=bf16,causal=0,page=16,kv_dtype=fp8", d));
      EXPECT_FALSE(space.enumerate(p, arch).empty()) << p.str() << " " << arch;
    }
  const Problem p = Problem::parse("b=16,h=32,hkv=8,s=1,sk=8192,d=128,dtype=bf16,causal=0,kv_dtype=fp8");
  for (const char* arch : {"sm_80", "sm_86"}) EXPECT_TRUE(space.enumerate(p, arch).empty()) << arch;
  const auto refusal = attntune::testing::run_attntune(
      "space --space " ATTNTUNE_SOURCE_DIR "/search_spaces/flash_decode.yaml --problem "
      "b=16,h=32,hkv=8,s=1,sk=8192,d=80,dtype=bf16,causal=0,kv_dtype=fp8 --arch sm_90");
  EXPECT_EQ(refusal.rc, 2) << refusal.out << refusal.err;
  EXPECT_NE(refusal.err.find("multiples of 32"), std::string::npos) << refusal.err;
}

TEST(FlashDecodePlan, Fp8CacheIsRowsOfHalfTheDimAndOnlyFp8CallsAreServed) {
  const SearchSpace space = load_space();
  const Problem p = Problem::parse("b=2,h=32,hkv=8,s=1,sk=4096,d=128,dtype=bf16,causal=0,kv_dtype=fp8");
  Config c;
  space.for_each_valid(p, "sm_90", [&](const Config& x) {
    if (c.empty() && std::get<std::string>(x.at("kv_load")) == "tma") c = x;
  });
  ASSERT_FALSE(c.empty());
  attntune_plan::Call call = attntune::testing::dense_call_of(p);  // K and V one byte an element:
  call.k_stride[0] = 8 * 4096 * 128;
  call.k_stride[1] = 4096 * 128;
  call.k_stride[2] = 128;
  std::copy(std::begin(call.k_stride), std::end(call.k_stride), std::begin(call.v_stride));
  call.kv_fp8 = 1;
  std::string why;
  const attntune_plan::Plan plan = plan_of(space, c, p, call, 132, &why);
  ASSERT_EQ(why, "");
  ASSERT_EQ(plan.maps, 2);
  for (int m = 0; m < 2; ++m) {
    EXPECT_EQ(plan.map[m].dims[0], 64u);  // 128 bytes a row: 64 16-bit elements
    EXPECT_EQ(plan.map[m].box[0], 64u);
    EXPECT_EQ(plan.map[m].swizzle_bytes, 128);
    EXPECT_EQ(plan.map[m].strides[0], 128u);  // bytes, as the call's
    EXPECT_EQ(plan.map[m].strides[1], 4096u * 128u);
  }
  // A 16-bit call to the FP8 build, and an FP8 one to a 16-bit build: refused, naming the dtypes.
  attntune_plan::Call plain = attntune::testing::dense_call_of(p);
  why.clear();
  plan_of(space, c, p, plain, 132, &why);
  EXPECT_NE(why.find("FP8"), std::string::npos) << why;
  Problem p16 = p;
  p16.kv_fp8 = false;
  Config c16;
  space.for_each_valid(p16, "sm_90", [&](const Config& x) {
    if (c16.empty()) c16 = x;
  });
  why.clear();
  plan_of(space, c16, p16, call, 132, &why);
  EXPECT_NE(why.find("FP8"), std::string::npos) << why;
  // Byte strides off a 16-byte chunk.
  attntune_plan::Call odd = call;
  odd.k_stride[2] = 136;  // a multiple of 8, not of 16
  why.clear();
  plan_of(space, c, p, odd, 132, &why);
  EXPECT_NE(why.find("16 bytes"), std::string::npos) << why;
}

TEST(FlashDecodeBuild, Fp8CachesCompileWithoutSpills) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = load_space();
  const std::size_t n = attntune::testing::build_sample(1);
  BuildPool pool(decode_pool_options());
  std::size_t submitted = 0, i = 0;
  for (const char* arch : {"sm_89", "sm_90"})
    for (const char* kind : {"b=4,h=32,hkv=8,s=1,sk=4096,d=128,causal=0,dtype=bf16,kv_dtype=fp8",
                             "b=4,h=64,hkv=8,s=4,sk=4096,d=256,causal=1,page=16,dtype=fp16,window=127,softcap=30,"
                             "sinks=1,kv_dtype=fp8"}) {
      const Problem p = Problem::parse(kind);
      std::vector<Config> all = space.enumerate(p, arch);
      if (std::string(arch) == "sm_90")
        std::erase_if(all, [&](const Config& c) {
          return i % 2 ? std::get<std::string>(c.at("kv_load")) != "tma"
                       : std::get<std::string>(c.at("combine")).rfind("cluster", 0) != 0;
        });
      ++i;
      for (const Config& c : spread(all, n)) {
        pool.submit({c, render_kernel(space, c, p, arch), arch});
        ++submitted;
      }
    }
  ASSERT_EQ(submitted, 4u * n);
  expect_clean_builds(pool, submitted);
}

// fp8_convert (an FP8 cache converted once a key group into a 16-bit stage): offered only over an
// FP8 cache and with several row warps (32 and 64 packed rows here, none at 16), both buffer
// counts; a spread of such builds compiles without spills on sm_89 and sm_90 at d=128 (q-len 16,
// 64 rows; q-len 8 with every variant) and d=64 / 256 (the space's register rules).
TEST(FlashDecodeSpace, GroupConversionOnlyOverFp8CachesWithSeveralRowWarps) {
  const SearchSpace space = load_space();
  auto converts = [&](const char* problem, const char* arch) {
    std::set<std::string> seen;
    for (const Config& c : space.enumerate(Problem::parse(problem), arch)) {
      const std::string v = std::get<std::string>(c.at("fp8_convert"));
      seen.insert(v);
      if (v != "warp") {
        EXPECT_GT(std::get<std::int64_t>(c.at("warps_m")), 1) << config_str(c);
      }
    }
    return seen;
  };
  EXPECT_EQ(converts("b=16,h=32,hkv=8,s=16,sk=8192,d=128,dtype=bf16,causal=1,page=16,kv_dtype=fp8", "sm_90"),
            (std::set<std::string>{"warp", "group", "group2"}));
  EXPECT_EQ(converts("b=16,h=32,hkv=8,s=8,sk=8192,d=128,dtype=fp16,causal=1,kv_dtype=fp8", "sm_89"),
            (std::set<std::string>{"warp", "group", "group2"}));
  EXPECT_EQ(converts("b=16,h=32,hkv=8,s=1,sk=8192,d=128,dtype=bf16,causal=0,page=16,kv_dtype=fp8", "sm_90"),
            (std::set<std::string>{"warp"}));  // 16 rows: one row warp
  EXPECT_EQ(converts("b=16,h=32,hkv=8,s=16,sk=8192,d=128,dtype=bf16,causal=1,page=16", "sm_90"),
            (std::set<std::string>{"warp"}));  // a 16-bit cache
}

TEST(FlashDecodeBuild, GroupConversionCompilesWithoutSpills) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = load_space();
  const std::size_t n = attntune::testing::build_sample(1);
  BuildPool pool(decode_pool_options());
  std::size_t submitted = 0;
  for (const char* arch : {"sm_89", "sm_90"})
    for (const char* kind : {"b=4,h=32,hkv=8,s=16,sk=4096,d=128,causal=1,page=16,dtype=bf16,kv_dtype=fp8",
                             "b=4,h=32,hkv=8,s=8,sk=4096,d=128,causal=1,page=16,dtype=fp16,window=127,softcap=30,"
                             "sinks=1,kv_dtype=fp8",
                             "b=4,h=32,hkv=8,s=16,sk=4096,d=64,causal=1,dtype=fp16,kv_dtype=fp8",
                             "b=4,h=32,hkv=8,s=16,sk=4096,d=256,causal=1,page=16,dtype=bf16,kv_dtype=fp8"}) {
      const Problem p = Problem::parse(kind);
      std::vector<Config> all = space.enumerate(p, arch);
      std::erase_if(all, [](const Config& c) { return std::get<std::string>(c.at("fp8_convert")) == "warp"; });
      ASSERT_FALSE(all.empty()) << kind << " " << arch;
      for (const Config& c : spread(all, n)) {
        pool.submit({c, render_kernel(space, c, p, arch), arch});
        ++submitted;
      }
    }
  expect_clean_builds(pool, submitted);
}
}  // namespace test_flash_decode_build
