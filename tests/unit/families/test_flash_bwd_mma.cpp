// flash_bwd_mma on CI (no GPU): its space (which problems and archs), its render, its launch plan
// (three kernels, their grids, the workspaces, the refusals; the deterministic mode's semaphore
// workspace and arguments), the order the deterministic mode gives the CTAs that add into a query
// block's dQ (bwd_blocks.h, over many lengths, blocks and windows), and NVRTC builds of a spread of its
// configs for sm_80, sm_89 and sm_90. The GPU property test (tests/gpu/test_flash_bwd_mma.cpp) runs
// them against the reference, and runs the deterministic mode twice for bit-identical gradients.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cuda/nvrtc.hpp"
#include "eval/build_pool.hpp"
#include "templates/common/bwd_params.h"
#include "templates/common/bwd_blocks.h"
#include "templates/flash_bwd_mma/launch.h"
#include "tests/common/input_error.hpp"
#include "tests/common/plan_call.hpp"
#include "tests/common/run_attntune.hpp"
#include "tests/unit/families/bwd_plan.hpp"

namespace test_flash_bwd_mma {
using namespace attntune;
using attntune::testing::backward_call_of;
using attntune::testing::dense_call_of;
using attntune::testing::FakeDevice;
using attntune::testing::space_of;

namespace {

std::int64_t get(const Config& c, const char* name) { return std::get<std::int64_t>(c.at(name)); }

using Planned = attntune::testing::BwdBound;

// Plans and binds `call` for the build of (config, built) on sm_90 (bwd_plan.hpp).
Planned plan_and_bind(const SearchSpace& space, const Config& config, const Problem& built,
                      const attntune_plan::Call& call) {
  return attntune::testing::bwd_plan_and_bind("flash_bwd_mma", "sm_90", space, config, built, call);
}

}  // namespace

TEST(FlashBwdMmaSpace, ServesTheBackwardOfHeadDims64And128OnEveryArch) {
  const SearchSpace space = space_of("flash_bwd_mma");
  for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90"})
    for (const char* spec : {"b=1,h=16,s=8192,d=128,dtype=bf16,causal=0,pass=bwd",
                             "b=2,h=32,hkv=8,s=2048,d=64,dtype=fp16,causal=1,pass=bwd",
                             "b=1,h=8,s=4096,d=128,dtype=bf16,causal=1,window=1024,pass=bwd"}) {
      const auto configs = space.enumerate(Problem::parse(spec), arch);
      EXPECT_GE(configs.size(), 2u) << arch << " " << spec;  // sm_86/89 at d=128: 99 KB of shared memory
      std::set<std::string> reduces;
      for (const Config& c : configs) {
        // Two key tiles a warp only where dK, dV, S^T and dP^T fit the registers (d=64, 32-row steps).
        if (get(c, "key_tiles") == 2) {
          EXPECT_EQ(Problem::parse(spec).d, 64) << config_str(c);
        }
        // Vector reductions from sm_90 only; before it pair's and frag's scalar atomicAdds.
        const std::string reduce = std::get<std::string>(c.at("dq_reduce"));
        if (reduce != "pair" && reduce != "frag") {
          EXPECT_EQ(std::string(arch), "sm_90") << config_str(c);
        }
        reduces.insert(reduce);
      }
      EXPECT_EQ(reduces.count("frag"), 1u) << arch << " " << spec;  // every arch's coalesced scalar adds
      EXPECT_EQ(reduces.size(), std::string(arch) == "sm_90" ? 5u : 2u) << arch << " " << spec;
    }
  // The forward pass and head dims that are not multiples of 16 are refused with the reason.
  EXPECT_NE(attntune::testing::input_error_of([&] {
              space.enumerate(Problem::parse("b=1,h=16,s=8192,d=128,dtype=bf16,causal=0"), "sm_90");
            }).find("pass=bwd"),
            std::string::npos);
  EXPECT_NE(attntune::testing::input_error_of([&] {
              space.enumerate(Problem::parse("b=1,h=16,s=8192,d=72,dtype=bf16,causal=0,pass=bwd"), "sm_90");
            }).find("head dims step by 16"),
            std::string::npos);
}

// d=256 (Gemma 2 and 3): only with dkv_split 2, each of a key block's two CTAs writing half of dK's,
// dV's and dQ's head dims (128 fp32 values a thread, d=128's count), on sm_80 (32-row steps in its
// 163 KB) and sm_90; sm_86/89's 99 KB hold no config (K and V of 64 keys and two Q/dO tiles of 32
// rows: 133 KB; `attntune space` names the shared-memory constraint). Below 256 one part only.
TEST(FlashBwdMmaSpace, HeadDim256SplitsDkAndDvInTwo) {
  const SearchSpace space = space_of("flash_bwd_mma");
  for (const char* arch : {"sm_86", "sm_89"})
    EXPECT_TRUE(space.enumerate(Problem::parse("b=1,h=8,s=8192,d=256,dtype=bf16,causal=1,pass=bwd"), arch).empty())
        << arch;
  for (const char* arch : {"sm_80", "sm_90"}) {
    const auto configs = space.enumerate(Problem::parse("b=1,h=8,s=8192,d=256,dtype=bf16,causal=1,pass=bwd"), arch);
    EXPECT_FALSE(configs.empty()) << arch;
    for (const Config& c : configs) {
      EXPECT_EQ(get(c, "dkv_split"), 2) << config_str(c);
      EXPECT_EQ(get(c, "key_tiles"), 1) << config_str(c);
    }
  }
  for (const char* spec : {"b=1,h=8,s=4096,d=128,dtype=bf16,causal=1,pass=bwd", "b=1,h=8,s=4096,d=64,dtype=fp16,causal=0,pass=bwd"})
    for (const Config& c : space.enumerate(Problem::parse(spec), "sm_90")) EXPECT_EQ(get(c, "dkv_split"), 1) << spec;
}

// kv_pairs (FlashAttention-2's split of dK and dV over a pair of warps) where a warp's part of the
// head dims is 128 (d=128, and d=256's halves), not at d=64 (measured slower); its P^T tile beside
// dS^T's in the shared memory the space counts. dq_rows 32 (two m16 tiles of dQ a warp) wherever
// the step's rows divide among the warps so. longest_first on causal problems only.
TEST(FlashBwdMmaSpace, KvPairsAtHeadDim128PartsAndDqRowsOf32) {
  const SearchSpace space = space_of("flash_bwd_mma");
  for (const auto& [spec, pairs] : {std::pair{"b=1,h=16,s=8192,d=128,dtype=bf16,causal=0,pass=bwd", true},
                                    std::pair{"b=1,h=8,s=8192,d=256,dtype=bf16,causal=1,pass=bwd", true},
                                    std::pair{"b=1,h=16,s=8192,d=96,dtype=fp16,causal=1,pass=bwd", true},
                                    std::pair{"b=1,h=16,s=8192,d=64,dtype=bf16,causal=0,pass=bwd", false}}) {
    const Problem p = Problem::parse(spec);
    std::size_t paired = 0, rows32 = 0, longest = 0;
    for (const Config& c : space.enumerate(p, "sm_90")) {
      const bool kv_pairs = std::get<bool>(c.at("kv_pairs"));
      paired += kv_pairs;
      rows32 += get(c, "dq_rows") == 32;
      const std::int64_t bm = get(c, "block_m"), st = get(c, "q_stages"), bn = get(c, "warps") * 16 * get(c, "key_tiles");
      const std::int64_t dp = p.d <= 64 ? 64 : p.d <= 128 ? 128 : 256;
      std::int64_t smem = -1;
      for (const auto& [name, value] : space.derive(c, p, "sm_90"))
        if (name == "smem_bytes") smem = value;
      // (The kernel's static_assert holds the rendered SMEM_BYTES to its layout: the build test.)
      EXPECT_EQ(smem, (2 * bn * dp + 2 * st * bm * dp + (kv_pairs ? 2 : 1) * bn * bm) * 2 + 2 * st * bm * 4)
          << config_str(c);
      if (kv_pairs) {
        EXPECT_EQ(dp / get(c, "dkv_split"), 128) << config_str(c);
        EXPECT_GE(bm, 32) << config_str(c);
      }
      EXPECT_EQ(get(c, "warps") % (bm / get(c, "dq_rows")), 0) << config_str(c);
      longest += get(c, "longest_first") != 0;
    }
    // Longest first where the first key block's walk is the longest: causal problems.
    EXPECT_EQ(longest > 0, p.causal) << spec;
    EXPECT_EQ(paired > 0, pairs) << spec;
    EXPECT_GT(rows32, 0u) << spec;
  }
}

// Head dims between 64, 128 and 256 (Phi-3's 96, DeepSeek's 192 for Q and K where V's is 192 too):
// the kernels compute over the next of them with zero columns (D_PAD), so a config is the padded head
// dim's, its shared memory and dQ's accumulator the padded width's; 192 and 240 split dK and dV as
// 256 does; sm_86/89 have no config past 128 (256's shared memory).
TEST(FlashBwdMmaSpace, OtherHeadDimsRunPaddedTo64128Or256) {
  const SearchSpace space = space_of("flash_bwd_mma");
  for (const int d : {32, 48, 80, 96, 112, 160, 192, 240}) {
    const int pad = d <= 64 ? 64 : d <= 128 ? 128 : 256;
    const Problem p = Problem::parse("b=2,h=8,hkv=2,s=1000,sk=777,d=" + std::to_string(d) + ",dtype=bf16,causal=1,pass=bwd");
    for (const char* arch : {"sm_80", "sm_89", "sm_90"}) {
      const auto configs = space.enumerate(p, arch);
      if (pad == 256 && std::string(arch) == "sm_89") {
        EXPECT_TRUE(configs.empty()) << d;
        continue;
      }
      ASSERT_FALSE(configs.empty()) << d << " " << arch;
      for (const Config& c : configs) {
        const LaunchSpec spec = render_kernel(space, c, p, arch).launch;
        EXPECT_EQ(attntune::define_value(spec.defines, "D_PAD"), pad) << d;
        EXPECT_EQ(attntune::define_value(spec.defines, "ATT_HEAD_DIM"), d);
        EXPECT_EQ(get(c, "dkv_split"), pad == 256 ? 2 : 1) << d;
        const long long bm = get(c, "block_m"), bn = get(c, "warps") * 16 * get(c, "key_tiles");
        EXPECT_EQ(attntune::define_value(spec.defines, "SMEM_BYTES"),
                  (2 * bn * pad + 2 * get(c, "q_stages") * bm * pad + (std::get<bool>(c.at("kv_pairs")) ? 2 : 1) * bn * bm) * 2 +
                      2 * get(c, "q_stages") * bm * 4);
        const auto plan = plan_call(spec, backward_call_of(p), FakeDevice{}.device());
        ASSERT_TRUE(plan) << config_str(c);
        const long long rounded = (1000 + bm - 1) / bm * bm;
        EXPECT_EQ(plan->workspace[0].bytes, static_cast<unsigned long long>(2 * 8 * rounded * pad * 4)) << d;
        // The call's head dim is the problem's, not the padded one.
        attntune_plan::Call call = backward_call_of(p);
        call.head_dim = pad;
        if (pad != d) {
          EXPECT_FALSE(plan_call(spec, call, FakeDevice{}.device())) << d;
        }
      }
    }
  }
}

// The main kernel's grid has a CTA a part: heads_kv * dkv_split rows of y; the workspaces and the
// other two kernels are d=256's as any head dim's.
TEST(FlashBwdMmaPlan, HeadDim256LaunchesACtaAPart) {
  const SearchSpace space = space_of("flash_bwd_mma");
  const Problem p = Problem::parse("b=2,h=8,hkv=2,s=1000,sk=777,d=256,dtype=bf16,causal=0,pass=bwd");
  for (const Config& c : space.enumerate(p, "sm_90")) {
    const auto plan = plan_call(render_kernel(space, c, p, "sm_90").launch, backward_call_of(p), FakeDevice{}.device());
    ASSERT_TRUE(plan) << config_str(c);
    ASSERT_EQ(plan->launches, 3);
    EXPECT_EQ(plan->launch[1].grid[1], 4u) << config_str(c);  // 2 KV heads x 2 parts
    EXPECT_EQ(plan->launch[0].grid[1], 8u);
    const long long bm = get(c, "block_m"), rounded = (1000 + bm - 1) / bm * bm;
    EXPECT_EQ(plan->workspace[0].bytes, static_cast<unsigned long long>(2 * 8 * rounded * 256 * 4));
  }
}

TEST(FlashBwdMmaRender, SourceIsFlatWithThreeKernelsAndEveryTunable) {
  const SearchSpace space = space_of("flash_bwd_mma");
  const Problem p = Problem::parse("b=2,h=8,hkv=2,s=1000,sk=777,d=128,dtype=bf16,causal=1,pass=bwd");
  const Config c = space.enumerate(p, "sm_90").front();
  const RenderedKernel k = render_kernel(space, c, p, "sm_90");
  EXPECT_EQ(k.source.find("#include \""), std::string::npos) << "includes must be inlined";
  EXPECT_NE(k.source.find("#define ATT_BWD 1\n"), std::string::npos);
  for (const auto& param : space.params())
    EXPECT_NE(k.source.find("#define " + macro_name(param.name) + " "), std::string::npos) << param.name;
  for (const char* name : {"flash_bwd_preprocess(", "flash_bwd_mma(", "flash_bwd_convert("})
    EXPECT_NE(k.source.find(name), std::string::npos) << name;
  EXPECT_EQ(k.kernel_name, "flash_bwd_preprocess");
  // Sizes are run-time arguments: one build serves every batch, head count and length.
  const Problem other = Problem::parse("b=7,h=3,hkv=1,s=77,sk=5000,d=128,dtype=bf16,causal=1,pass=bwd");
  EXPECT_EQ(render_kernel(space, c, other, "sm_90").source_hash, k.source_hash);
}

TEST(FlashBwdMmaPlan, ThreeKernelsWithTheirGridsAndWorkspaces) {
  const SearchSpace space = space_of("flash_bwd_mma");
  const Problem p = Problem::parse("b=2,h=8,hkv=2,s=1000,sk=777,d=128,dtype=bf16,causal=0,pass=bwd");
  for (const Config& c : space.enumerate(p, "sm_90")) {
    const LaunchSpec spec = render_kernel(space, c, p, "sm_90").launch;
    const auto plan = plan_call(spec, backward_call_of(p), FakeDevice{}.device());
    ASSERT_TRUE(plan) << config_str(c);
    const long long bm = get(c, "block_m"), bn = get(c, "warps") * 16 * get(c, "key_tiles");
    const long long rounded = (1000 + bm - 1) / bm * bm;
    ASSERT_EQ(plan->launches, 3);
    EXPECT_EQ(plan->launch[0].kernel, 0);
    EXPECT_EQ(plan->launch[0].grid[0], static_cast<unsigned>(rounded / bm));
    EXPECT_EQ(plan->launch[1].kernel, 1);
    EXPECT_EQ(plan->launch[1].grid[0], static_cast<unsigned>((777 + bn - 1) / bn));
    EXPECT_EQ(plan->launch[1].grid[1], 2u);  // KV heads: GQA's group is summed inside a CTA
    EXPECT_EQ(plan->launch[1].grid[2], 2u);
    EXPECT_EQ(plan->launch[1].block, static_cast<unsigned>(get(c, "warps") * 32));
    const long long st = get(c, "q_stages");
    const long long tiles_ds = std::get<bool>(c.at("kv_pairs")) ? 2 : 1;  // kv_pairs: P^T's tile beside dS^T's
    EXPECT_EQ(plan->launch[1].smem,
              static_cast<unsigned>((2 * bn * 128 + 2 * st * bm * 128 + tiles_ds * bn * bm) * 2 + 2 * st * bm * 4));
    EXPECT_EQ(plan->launch[2].kernel, 2);
    EXPECT_EQ(plan->launch[2].grid[0], static_cast<unsigned>((1000 + bm - 1) / bm));
    EXPECT_EQ(plan->launch[2].grid[1], 8u);
    ASSERT_EQ(plan->workspaces, 3);
    EXPECT_EQ(plan->workspace[0].bytes, static_cast<unsigned long long>(2 * 8 * rounded * 128 * 4));
    EXPECT_EQ(plan->workspace[1].bytes, static_cast<unsigned long long>(2 * 8 * rounded * 4));
    EXPECT_EQ(plan->workspace[2].bytes, plan->workspace[1].bytes);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(plan->workspace[i].zeroed, 0);  // the preprocessing writes them
  }
}

TEST(FlashBwdMmaPlan, EmptyLengthsAndWrongCallsAreHandled) {
  const SearchSpace space = space_of("flash_bwd_mma");
  const Problem p = Problem::parse("b=1,h=4,s=300,sk=300,d=64,dtype=fp16,causal=1,pass=bwd");
  const LaunchSpec spec = render_kernel(space, space.enumerate(p, "sm_80").front(), p, "sm_80").launch;
  const auto device = FakeDevice{}.device();
  // No keys: dQ is 0 (preprocessing and conversion only); no queries: dK = dV = 0 (the main loop only).
  attntune_plan::Call c = backward_call_of(p);
  c.seqlen_k = 0;
  auto plan = plan_call(spec, c, device);
  ASSERT_TRUE(plan);
  ASSERT_EQ(plan->launches, 2);
  EXPECT_EQ(plan->launch[0].kernel, 0);
  EXPECT_EQ(plan->launch[1].kernel, 2);
  c = backward_call_of(p);
  c.seqlen_q = 0;
  plan = plan_call(spec, c, device);
  ASSERT_TRUE(plan);
  ASSERT_EQ(plan->launches, 1);
  EXPECT_EQ(plan->launch[0].kernel, 1);
  // Refusals, each with its reason.
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
  c.dk = nullptr;
  refused(c, "none may be NULL");
  c = backward_call_of(p);
  c.lse = nullptr;
  refused(c, "none may be NULL");
  c = backward_call_of(p);
  c.window_left = 64;
  refused(c, "sliding window");
  c = backward_call_of(p);
  c.heads_kv = 3;
  refused(c, "multiple of heads_kv");
}

// The deterministic mode: the plan of a call that asks for it is the same three launches with a
// fourth workspace, an int32 turn counter a (batch, query head, query block), after the three every
// call has (the executor keeps a build's workspaces by index); bind hands it to every kernel with
// the flag, and a call without the flag gets neither (the kernels' uniform branch skips the turns).
TEST(FlashBwdMmaPlan, ADeterministicCallGetsItsSemaphoreWorkspace) {
  const SearchSpace space = space_of("flash_bwd_mma");
  for (const char* spec : {"b=2,h=8,hkv=2,s=1000,sk=777,d=128,dtype=bf16,causal=0,pass=bwd",
                           "b=3,h=6,hkv=3,s=333,sk=4000,d=64,dtype=fp16,causal=1,window=100,pass=bwd"}) {
    const Problem p = Problem::parse(spec);
    const auto configs = space.enumerate(p, "sm_90");
    ASSERT_FALSE(configs.empty()) << spec;
    for (const Config& c : {configs.front(), configs[configs.size() / 2], configs.back()}) {
      attntune_plan::Call call = backward_call_of(p);
      if (p.window_left >= 0) call.window_left = static_cast<int>(p.window_left);
      const Planned normal = plan_and_bind(space, c, p, call);
      call.deterministic = 1;
      const Planned det = plan_and_bind(space, c, p, call);
      ASSERT_EQ(normal.why, "") << config_str(c);
      ASSERT_EQ(det.why, "") << config_str(c);
      const long long bm = get(c, "block_m"), rounded = (p.s + bm - 1) / bm * bm;
      ASSERT_EQ(normal.plan.workspaces, 3);
      ASSERT_EQ(det.plan.workspaces, 4);
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(det.plan.workspace[i].bytes, normal.plan.workspace[i].bytes) << i;
        EXPECT_EQ(det.plan.workspace[i].zeroed, 0) << i;
      }
      EXPECT_EQ(det.plan.workspace[3].bytes, static_cast<unsigned long long>(p.b * p.h * (rounded / bm) * 4));
      EXPECT_EQ(det.plan.workspace[3].zeroed, 0);  // the preprocessing kernel zeroes it every call
      EXPECT_EQ(det.plan.workspace[3].optional, 0);
      // The same launches, grids and shared memory: the turns cost no launch.
      ASSERT_EQ(det.plan.launches, normal.plan.launches);
      for (int l = 0; l < det.plan.launches; ++l)
        EXPECT_EQ(std::memcmp(&det.plan.launch[l], &normal.plan.launch[l], sizeof(attntune_plan::Launch)), 0) << l;
      for (int l = 0; l < det.plan.launches; ++l) {
        EXPECT_EQ(det.params[l].deterministic, 1) << l;
        EXPECT_EQ(det.params[l].dq_semaphore, static_cast<int*>(det.res.workspace[3])) << l;
        EXPECT_EQ(det.params[l].dq_accum, static_cast<float*>(det.res.workspace[0])) << l;
        EXPECT_EQ(det.params[l].seqlen_q_rounded, rounded) << l;  // the rows of every workspace, as before
        EXPECT_EQ(normal.params[l].deterministic, 0) << l;
        EXPECT_EQ(normal.params[l].dq_semaphore, nullptr) << l;
      }
    }
  }
  // Empty sides: no queries (the main kernel alone, no query block to take turns on) and no keys.
  const Problem p = Problem::parse("b=1,h=4,s=300,sk=300,d=64,dtype=fp16,causal=1,pass=bwd");
  const Config c = space.enumerate(p, "sm_90").front();
  attntune_plan::Call call = backward_call_of(p);
  call.deterministic = 1;
  call.seqlen_q = 0;
  Planned det = plan_and_bind(space, c, p, call);
  ASSERT_EQ(det.why, "");
  ASSERT_EQ(det.plan.launches, 1);
  EXPECT_EQ(det.plan.workspace[3].bytes, 0u);
  call = backward_call_of(p);
  call.deterministic = 1;
  call.seqlen_k = 0;
  det = plan_and_bind(space, c, p, call);
  ASSERT_EQ(det.why, "");
  EXPECT_EQ(det.plan.launches, 2);
  EXPECT_EQ(det.plan.workspaces, 4);
}

// BwdParams keeps the fields the backward families read at their offsets (flash_bwd_wgmma shares
// it and bwd_prepost.cuh): the deterministic mode's are appended after seqlen_q_rounded.
TEST(FlashBwdMmaPlan, TheDeterministicFieldsFollowTheEarlierOnes) {
  EXPECT_GT(offsetof(BwdParams, deterministic), offsetof(BwdParams, seqlen_q_rounded));
  EXPECT_GT(offsetof(BwdParams, dq_semaphore), offsetof(BwdParams, deterministic));
  EXPECT_EQ(offsetof(BwdParams, seqlen_q_rounded), offsetof(BwdParams, lse_log2) + sizeof(float*));
}

// The deterministic mode's order (bwd_blocks.h), brute force against the kernel's own bounds: for every
// query block, the key blocks whose CTA walks it (key_block_rows, query_blocks: what the main loop
// walks) are consecutive, and first_key_block names the first, so that the CTA of key block n waits
// for exactly the n - first_key_block CTAs before it (a wrong count waits for a turn that never
// comes, or adds beside another CTA). Bottom-right causal with s < sk, s > sk (rows that see no
// key), left, right and two-sided windows (0, narrower and wider than a block, wider than the keys),
// every block shape the space has, GQA groups of 1 and 3. Both walks (walk_step) visit each of a
// CTA's (head, query block) pairs once (walk_step, and the cursor the Hopper kernel carries, at the
// same pair every step), and in the deterministic one a CTA's predecessor reaches each pair no later
// than it. And the bounds hold every visible (row, key) pair.
TEST(FlashBwdMmaDeterministic, TheCtasOfAQueryBlockAreConsecutiveKeyBlocks) {
  struct Window {
    int left, right;
  };
  const int lengths[] = {1, 7, 31, 64, 65, 200, 333, 1000};
  const Window windows[] = {{-1, -1}, {0, -1}, {1, -1}, {17, -1}, {63, -1}, {64, -1}, {300, -1}, {5000, -1},
                            {-1, 0},  {-1, 9}, {-1, 130}, {0, 0}, {17, 129}, {100, 50}, {64, 64}};
  long long checked = 0;
  for (int bm : {32, 64, 128})
    for (int bn : {64, 128, 256})
      for (int len_q : lengths)
        for (int len_k : lengths)
          for (int causal = 0; causal < 2; ++causal)
            for (const Window& w : windows) {
              if (causal && w.right >= 0) continue;  // a causal call keeps window_right -1
              const bool windowed = w.left >= 0 || w.right >= 0;
              VariantParams v{};
              v.window_left = w.left;
              v.window_right = w.right;
              const int diag = len_k - len_q, key_blocks = (len_k + bn - 1) / bn, q_blocks = (len_q + bm - 1) / bm;
              const int group = (len_q + len_k) % 3 == 0 ? 3 : 1;  // query heads a KV head (GQA), some of each
              std::vector<std::vector<int>> walkers(q_blocks);  // per query block, the key blocks that walk it
              std::vector<int> first_row(key_blocks), end_row(key_blocks);
              // Per key block, the deterministic walk's step at each (head, query block); -1: not walked.
              std::vector<std::vector<int>> det_step(key_blocks, std::vector<int>(group * q_blocks, -1));
              for (int n = 0; n < key_blocks; ++n) {
                int rb, re, m_first, m_blocks;
                if (causal && windowed) att_bwd::key_block_rows<true, true>(n * bn, bn, len_q, diag, v, &rb, &re);
                else if (causal) att_bwd::key_block_rows<true, false>(n * bn, bn, len_q, diag, v, &rb, &re);
                else if (windowed) att_bwd::key_block_rows<false, true>(n * bn, bn, len_q, diag, v, &rb, &re);
                else att_bwd::key_block_rows<false, false>(n * bn, bn, len_q, diag, v, &rb, &re);
                att_bwd::query_blocks(rb, re, bm, &m_first, &m_blocks);
                first_row[n] = rb, end_row[n] = re;
                // Both walks visit every (head, query block) of the CTA once.
                // The cursor flash_bwd_wgmma's loops carry (Walk, walk_next) is at walk_step's pair at
                // every step.
                for (int det = 0; det < 2; ++det) {
                  std::vector<int> seen(group * q_blocks, 0);
                  att_bwd::Walk cursor = att_bwd::walk_begin(det, group, m_first, m_blocks);
                  for (int i = 0; i < group * m_blocks; ++i, att_bwd::walk_next(cursor)) {
                    int h, m, ch, cm;
                    att_bwd::walk_step(i, det, group, m_first, m_blocks, &h, &m);
                    att_bwd::walk_at(cursor, &ch, &cm);
                    ASSERT_TRUE(ch == h && cm == m) << "step " << i << ": the cursor is at (" << ch << ", " << cm
                                                    << "), walk_step at (" << h << ", " << m << ")";
                    ASSERT_TRUE(h >= 0 && h < group && m >= m_first && m < m_first + m_blocks) << i;
                    ASSERT_EQ(seen[h * q_blocks + m]++, 0) << "step " << i << " walks a pair twice";
                    if (det) det_step[n][h * q_blocks + m] = i;
                  }
                }
                for (int m = m_first; m < m_first + m_blocks; ++m) {
                  ASSERT_GE(m, 0);
                  ASSERT_LT(m, q_blocks) << "a CTA walks a query block past seqlen_q";
                  walkers[m].push_back(n);
                }
              }
              const std::string what = "bm " + std::to_string(bm) + " bn " + std::to_string(bn) + " s " +
                                       std::to_string(len_q) + " sk " + std::to_string(len_k) + " causal " +
                                       std::to_string(causal) + " window " + std::to_string(w.left) + "," +
                                       std::to_string(w.right);
              for (int m = 0; m < q_blocks; ++m) {
                const auto& ns = walkers[m];
                for (std::size_t i = 0; i < ns.size(); ++i) {
                  ASSERT_EQ(ns[i], ns[0] + static_cast<int>(i)) << what << " query block " << m << ": not consecutive";
                  const int first = windowed ? att_bwd::first_key_block<true>(m * bm, bn, diag, w.left)
                                             : att_bwd::first_key_block<false>(m * bm, bn, diag, w.left);
                  // The turn the kernel waits for: the CTAs before it that add into this block.
                  ASSERT_EQ(ns[i] - first, static_cast<int>(i)) << what << " query block " << m << " key block " << ns[i];
                  // The CTA before it reaches the block (each head's) no later in its walk: no CTA
                  // waits on one that has most of its walk still ahead.
                  if (i > 0) {
                    for (int h = 0; h < group; ++h) {
                      ASSERT_LE(det_step[ns[i - 1]][h * q_blocks + m], det_step[ns[i]][h * q_blocks + m])
                          << what << " query block " << m << " head " << h << " key block " << ns[i];
                    }
                  }
                }
              }
              // Every visible pair is walked (the bounds are the kernel's masks' superset): a row sees
              // the keys [lo, hi] (off = key - row within the masks' bounds), each in a block whose
              // rows include it.
              for (int row = 0; row < len_q; ++row) {
                int lo = 0, hi = len_k - 1;
                if (causal) hi = std::min(hi, row + diag);
                if (w.left >= 0) lo = std::max(lo, row + diag - w.left);
                if (!causal && w.right >= 0) hi = std::min(hi, row + diag + w.right);
                for (int n = lo >= 0 ? lo / bn : 0; lo <= hi && n <= hi / bn; ++n)
                  ASSERT_TRUE(row >= first_row[n] && row < end_row[n]) << what << " row " << row << " block " << n;
              }
              ++checked;
            }
  EXPECT_GT(checked, 10000);
}

// The CTAs' order (bwd_blocks.h's cta_block, both backward families): the grid's, or longest first in
// groups of (y, z) rows. Every block index names one (key block, y, z) of the grid and no two the
// same; in either order a row's lower key blocks come at lower linear indices (the deterministic
// mode's turns wait on them, so they must be dispatched first); longest first puts every row of a
// group's key block k before any of its key block k + 1, the first wave the first key blocks'.
TEST(FlashBwdBlocks, LongestFirstIsAPermutationThatKeepsEachRowsKeyBlocksInOrder) {
  long long checked = 0;
  for (int gx : {1, 2, 7, 16, 33})
    for (int gy : {1, 2, 3, 8, 64})
      for (int gz : {1, 2, 5})
        for (int lf : {0, 1, 4, 16}) {
          const int n = gx * gy * gz;
          std::vector<int> seen(n, 0), last_kb(gy * gz, -1);
          for (int lin = 0; lin < n; ++lin) {
            const int bx = lin % gx, by = lin / gx % gy, bz = lin / (gx * gy);
            att_bwd::CtaBlock c{};
            switch (lf) {
              case 0: c = att_bwd::cta_block<0>(bx, by, bz, gx, gy, gz); break;
              case 1: c = att_bwd::cta_block<1>(bx, by, bz, gx, gy, gz); break;
              case 4: c = att_bwd::cta_block<4>(bx, by, bz, gx, gy, gz); break;
              default: c = att_bwd::cta_block<16>(bx, by, bz, gx, gy, gz); break;
            }
            const std::string what = "grid " + std::to_string(gx) + "x" + std::to_string(gy) + "x" +
                                     std::to_string(gz) + " longest_first " + std::to_string(lf) + " block " +
                                     std::to_string(lin);
            ASSERT_TRUE(c.key_block >= 0 && c.key_block < gx && c.y >= 0 && c.y < gy && c.z >= 0 && c.z < gz) << what;
            ASSERT_EQ(seen[c.key_block + gx * (c.y + gy * c.z)]++, 0) << what << ": named twice";
            const int row = c.y + gy * c.z;
            ASSERT_EQ(c.key_block, last_kb[row] + 1) << what << ": a row's key blocks out of order";
            last_kb[row] = c.key_block;
            if (lf == 0) {
              ASSERT_TRUE(c.key_block == bx && c.y == by && c.z == bz) << what << ": the grid's own order";
            } else {
              // A group's key block k comes before its key block k + 1 for every row of the group:
              // the rows of a group are consecutive, and the linear index runs over them fastest.
              const int group = row / lf, group_rows = std::min(lf, gy * gz - group * lf);
              ASSERT_EQ(lin, group * lf * gx + c.key_block * group_rows + (row - group * lf)) << what;
            }
            ++checked;
          }
        }
  EXPECT_GT(checked, 10000);
}

// A spread of configs of each head dim, causal and windowed, builds for each arch; the configs the
// GPU runs (sm_90) build without spills beyond the few bytes d=128's single key tile leaves (4-24
// bytes of 255 registers, run 180-183), d=64 without any.
TEST(FlashBwdMmaBuild, ASpreadBuildsOnEveryArch) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = space_of("flash_bwd_mma");
  BuildPoolOptions pool_opts;
  pool_opts.nvrtc_options = family_nvrtc_options("flash_bwd_mma");
  pool_opts.worker_argv = {attntune::testing::attntune_bin(), "build-worker"};
  BuildPool pool(pool_opts);
  std::size_t submitted = 0;
  const std::pair<const char*, const char*> kinds[] = {
      {"sm_90", "b=1,h=16,s=8192,d=128,dtype=bf16,causal=0,pass=bwd"},
      {"sm_90", "b=1,h=16,s=8192,d=64,dtype=fp16,causal=1,window=512,pass=bwd"},
      {"sm_89", "b=1,h=16,s=8192,d=128,dtype=bf16,causal=1,pass=bwd"},
      {"sm_80", "b=1,h=16,s=8192,d=64,dtype=bf16,causal=0,pass=bwd"},
      // d=256 (dkv_split 2): nvcc-free NVRTC builds of 247-255 registers and no spills (2026-11-29).
      {"sm_90", "b=1,h=8,s=8192,d=256,dtype=bf16,causal=1,pass=bwd"},
      {"sm_80", "b=1,h=8,s=8192,d=256,dtype=fp16,causal=0,pass=bwd"},
      // Padded head dims (D_PAD 128 and 256: zero columns loaded, padded columns not stored).
      {"sm_89", "b=1,h=8,s=8192,d=96,dtype=bf16,causal=1,pass=bwd"},
      {"sm_90", "b=1,h=8,s=8192,d=192,dtype=bf16,causal=0,pass=bwd"},
  };
  for (const auto& [arch, spec] : kinds) {
    const Problem p = Problem::parse(spec);
    const auto all = space.enumerate(p, arch);
    for (std::size_t i = 0; i < 2; ++i) {
      const Config& c = all[(i * 2 + 1) * all.size() / 4];
      pool.submit({c, render_kernel(space, c, p, arch), arch});
      ++submitted;
    }
    // And the first config with kv_pairs and dq_rows 32 together, where the space has one, the first
    // with dq_rows 32 alone, the first with dq_reduce vec4 (sm_90), the first longest first (causal),
    // and the first with dq_reduce frag (every arch) and frag4 (sm_90).
    for (const int kind : {0, 1, 2, 3, 4, 5}) {
      const auto it = std::find_if(all.begin(), all.end(), [&](const Config& c) {
        if (kind == 5) return std::get<std::string>(c.at("dq_reduce")) == "frag4";
        if (kind == 4) return std::get<std::string>(c.at("dq_reduce")) == "frag";
        if (kind == 3) return get(c, "longest_first") != 0;
        if (kind == 2) return std::get<std::string>(c.at("dq_reduce")) == "vec4";
        return std::get<bool>(c.at("kv_pairs")) == (kind == 0) && get(c, "dq_rows") == 32;
      });
      if (it == all.end()) continue;
      pool.submit({*it, render_kernel(space, *it, p, arch), arch});
      ++submitted;
    }
  }
  std::size_t built = 0;
  while (auto o = pool.next()) {
    ++built;
    EXPECT_EQ(o->build.status, "ok") << config_str(o->job.config) << "\n" << o->build.log;
    EXPECT_LE(o->build.spill_stores, 32) << config_str(o->job.config) << ": " << o->build.registers << " registers";
  }
  EXPECT_EQ(built, submitted);
}
}  // namespace test_flash_bwd_mma
