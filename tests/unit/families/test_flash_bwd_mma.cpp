// flash_bwd_mma on CI (no GPU): its space (which problems and archs), its render, its launch plan
// (three kernels, their grids, the workspaces, the refusals) and NVRTC builds of a spread of its
// configs for sm_80, sm_89 and sm_90. The GPU property test (tests/gpu/test_flash_bwd_mma.cpp) runs
// them against the reference.
#include <set>

#include <gtest/gtest.h>

#include "cuda/nvrtc.hpp"
#include "eval/build_pool.hpp"
#include "tests/common/input_error.hpp"
#include "tests/common/plan_call.hpp"
#include "tests/common/run_attntune.hpp"

using namespace attntune;
using attntune::testing::dense_call_of;
using attntune::testing::FakeDevice;
using attntune::testing::space_of;

namespace {

// The backward call of p on fake addresses: the dense call's tensors and dO, dQ, dK, dV beside them.
attntune_plan::Call backward_call_of(const Problem& p) {
  attntune_plan::Call c = dense_call_of(p);
  c.entry = attntune_plan::kEntryBackward;
  c.lse = reinterpret_cast<float*>(3ll << 40);
  c.dout = reinterpret_cast<const void*>(4ll << 40);
  c.dq = reinterpret_cast<void*>(5ll << 40);
  c.dk = reinterpret_cast<void*>(6ll << 40);
  c.dv = reinterpret_cast<void*>(7ll << 40);
  for (int i = 0; i < 3; ++i) {
    c.do_stride[i] = c.dq_stride[i] = c.q_stride[i];
    c.dk_stride[i] = c.k_stride[i];
    c.dv_stride[i] = c.v_stride[i];
  }
  return c;
}

std::int64_t get(const Config& c, const char* name) { return std::get<std::int64_t>(c.at(name)); }

}  // namespace

TEST(FlashBwdMmaSpace, ServesTheBackwardOfHeadDims64And128OnEveryArch) {
  const SearchSpace space = space_of("flash_bwd_mma");
  for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90"})
    for (const char* spec : {"b=1,h=16,s=8192,d=128,dtype=bf16,causal=0,pass=bwd",
                             "b=2,h=32,hkv=8,s=2048,d=64,dtype=fp16,causal=1,pass=bwd",
                             "b=1,h=8,s=4096,d=128,dtype=bf16,causal=1,window=1024,pass=bwd"}) {
      const auto configs = space.enumerate(Problem::parse(spec), arch);
      EXPECT_GE(configs.size(), 2u) << arch << " " << spec;  // sm_86/89 at d=128: 99 KB of shared memory
      for (const Config& c : configs) {
        // Two key tiles a warp only where dK, dV, S^T and dP^T fit the registers (d=64, 32-row steps).
        if (get(c, "key_tiles") == 2) EXPECT_EQ(Problem::parse(spec).d, 64) << config_str(c);
        // Vector reductions from sm_90 only.
        if (std::get<std::string>(c.at("dq_reduce")) == "quad") EXPECT_EQ(std::string(arch), "sm_90");
      }
    }
  // The forward pass and other head dims are refused with the reason.
  EXPECT_NE(attntune::testing::input_error_of([&] {
              space.enumerate(Problem::parse("b=1,h=16,s=8192,d=128,dtype=bf16,causal=0"), "sm_90");
            }).find("pass=bwd"),
            std::string::npos);
  EXPECT_NE(attntune::testing::input_error_of([&] {
              space.enumerate(Problem::parse("b=1,h=16,s=8192,d=256,dtype=bf16,causal=0,pass=bwd"), "sm_90");
            }).find("head dims 64 and 128"),
            std::string::npos);
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
    EXPECT_EQ(plan->launch[1].smem, static_cast<unsigned>((2 * bn * 128 + 2 * st * bm * 128 + bn * bm) * 2 + 2 * st * bm * 4));
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
  c = backward_call_of(p);
  c.deterministic = 1;  // dQ's atomics: never served silently
  refused(c, "no deterministic mode");
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
  };
  for (const auto& [arch, spec] : kinds) {
    const Problem p = Problem::parse(spec);
    const auto all = space.enumerate(p, arch);
    for (std::size_t i = 0; i < 2; ++i) {
      const Config& c = all[(i * 2 + 1) * all.size() / 4];
      pool.submit({c, render_kernel(space, c, p, arch), arch});
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
