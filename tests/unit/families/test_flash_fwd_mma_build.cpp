// flash_fwd_mma on CI (no GPU): rendering, NVRTC builds of the d=64 and d=128 spaces for sm_89
// and sm_90, and of every other head dim (multiples of 16 from 32 to 256) on every entry point. Every valid config would take CI past its budget on 2 cores (about 2,300
// builds of 2-4 s), so a fixed, deterministic spread is built: ATTNTUNE_BUILD_SAMPLE configs per
// (d, arch), default 10; 0 builds all. The GPU property test covers every config on sm_90.
#include <algorithm>
#include <cstdlib>
#include <map>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cuda/nvrtc.hpp"
#include "eval/build_pool.hpp"
#include "search/valid_configs.hpp"
#include "tests/common/plan_call.hpp"
#include "tests/common/run_attntune.hpp"

namespace test_flash_fwd_mma_build {
using namespace attntune;

namespace {

SearchSpace load_space() { return SearchSpace::load(ATTNTUNE_SOURCE_DIR "/search_spaces/flash_fwd_mma.yaml"); }

std::vector<Config> spread(std::vector<Config> all, std::size_t n) {
  if (n == 0 || n >= all.size()) return all;
  std::vector<Config> out;
  for (std::size_t i = 0; i < n; ++i) out.push_back(all[i * all.size() / n]);
  return out;
}

}  // namespace

TEST(FlashFwdMmaRender, SourceIsFlatAndCarriesEveryTunable) {
  const SearchSpace space = load_space();
  const Problem p = Problem::parse("b=2,h=8,s=1000,d=128,dtype=bf16,causal=1");
  const Config c = space.enumerate(p, "sm_90").front();
  const RenderedKernel k = render_kernel(space, c, p, "sm_90");
  EXPECT_EQ(k.source.find("#include \""), std::string::npos) << "includes must be inlined";
  EXPECT_NE(k.source.find("#define ATT_HEAD_DIM 128\n"), std::string::npos);
  EXPECT_NE(k.source.find("#define ATT_DTYPE_BF16 1\n"), std::string::npos);
  EXPECT_NE(k.source.find("#define ATT_CAUSAL 1\n"), std::string::npos);
  for (const auto& param : space.params())
    EXPECT_NE(k.source.find("#define " + macro_name(param.name) + " "), std::string::npos) << param.name;
  EXPECT_NE(k.source.find("#define KV_SCHEDULE_BLOCKWISE 1\n"), std::string::npos);
  EXPECT_NE(k.source.find("#define SMEM_BYTES "), std::string::npos);
  EXPECT_NE(k.source.find("struct AttnParams"), std::string::npos);
  EXPECT_EQ(k.kernel_name, "flash_fwd_mma");
  // Sequence lengths, batch and heads are run-time arguments: the same build serves them all.
  const Problem other = Problem::parse("b=7,h=3,hkv=1,s=77,sk=5000,d=128,dtype=bf16,causal=1");
  EXPECT_EQ(render_kernel(space, c, other, "sm_90").source_hash, k.source_hash);
  Problem fp16 = p;
  fp16.dtype = DType::kFp16;
  EXPECT_NE(render_kernel(space, c, fp16, "sm_90").source_hash, k.source_hash);
}

// No prefill kernel reads an FP8 cache: a call with one is refused with the reason by the plan
// (common/dense_params.h's check_prefill_entry, every prefill family), never run as 16-bit values.
TEST(FlashFwdMmaRender, AnFp8CacheCallIsRefusedWithTheReason) {
  const SearchSpace space = load_space();
  const Problem p = Problem::parse("b=3,h=5,s=1000,d=64,dtype=fp16,causal=0");
  const Config c = space.enumerate(p, "sm_90").front();
  attntune_plan::Call call = attntune::testing::dense_call_of(p);
  call.kv_fp8 = 1;
  std::string why;
  EXPECT_FALSE(plan_call(render_kernel(space, c, p, "sm_90").launch, call, attntune::testing::FakeDevice{}.device(), &why));
  EXPECT_NE(why.find("FP8 e4m3"), std::string::npos) << why;
}

TEST(FlashFwdMmaRender, GeometryFollowsTheSpace) {
  const SearchSpace space = load_space();
  const Problem p = Problem::parse("b=3,h=5,s=1000,d=64,dtype=fp16,causal=0");
  for (const Config& c : spread(space.enumerate(p, "sm_90"), 20)) {
    const auto plan = plan_call(render_kernel(space, c, p, "sm_90").launch, attntune::testing::dense_call_of(p),
                                attntune::testing::FakeDevice{}.device());
    ASSERT_TRUE(plan);
    const attntune_plan::Launch& g = plan->launch[0];
    const auto bm = std::get<std::int64_t>(c.at("block_m")), warps = std::get<std::int64_t>(c.at("warps"));
    EXPECT_EQ(g.grid[0], static_cast<unsigned>((1000 + bm - 1) / bm));
    EXPECT_EQ(g.grid[1], 5u);
    EXPECT_EQ(g.grid[2], 3u);
    EXPECT_EQ(g.block, static_cast<unsigned>(warps * 32));
    EXPECT_LE(g.smem, 232448u);
  }
}

// GQA packing (pack_gqa): one CTA per block_m packed rows of a (batch, KV head), seqlen_q *
// q_per_kv of them; offered only with GQA where packing needs fewer tiles (or a packed batch).
TEST(FlashFwdMmaRender, PackedGeometryAndWhereItIsOffered) {
  const SearchSpace space = load_space();
  auto packs = [](const Config& c) { return std::get<bool>(c.at("pack_gqa")); };
  const Problem p = Problem::parse("b=3,h=28,hkv=4,s=40,sk=4096,d=64,dtype=bf16,causal=1");
  std::size_t packed = 0;
  for (const Config& c : spread(space.enumerate(p, "sm_90"), 40)) {
    const auto plan = plan_call(render_kernel(space, c, p, "sm_90").launch, attntune::testing::dense_call_of(p),
                                attntune::testing::FakeDevice{}.device());
    ASSERT_TRUE(plan);
    const auto bm = std::get<std::int64_t>(c.at("block_m"));
    const attntune_plan::Launch& g = plan->launch[0];
    if (packs(c)) {
      ++packed;
      EXPECT_EQ(g.grid[0], static_cast<unsigned>((40 * 7 + bm - 1) / bm));
      EXPECT_EQ(g.grid[1], 4u);
    } else {
      EXPECT_EQ(g.grid[0], 1u);
      EXPECT_EQ(g.grid[1], 28u);
    }
    EXPECT_EQ(g.grid[2], 3u);
  }
  EXPECT_GT(packed, 0u);
  // Not without GQA, nor where block_m divides s (no tile to fill); always for a packed batch with GQA.
  auto any_pack = [&](const char* spec) {
    bool any = false;
    space.for_each_valid(Problem::parse(spec), "sm_90", [&](const Config& c) { any = any || packs(c); });
    return any;
  };
  EXPECT_FALSE(any_pack("b=1,h=8,s=40,d=64,dtype=bf16,causal=1"));
  EXPECT_FALSE(any_pack("b=1,h=32,hkv=8,s=4096,d=64,dtype=bf16,causal=1"));
  EXPECT_TRUE(any_pack("b=1,h=32,hkv=8,s=1000,d=64,dtype=bf16,causal=1"));
  EXPECT_TRUE(any_pack("b=4,h=32,hkv=8,s=4096,d=64,dtype=bf16,causal=1,varlen=1"));
  EXPECT_FALSE(any_pack("b=4,h=8,s=4096,d=64,dtype=bf16,causal=1,varlen=1"));
  // A packed build refuses a call whose query heads are not a multiple of its KV heads.
  Config c = attntune::testing::first_config(space, p, "sm_90", packs);
  attntune_plan::Call call = attntune::testing::dense_call_of(p);
  call.heads_q = 30;
  std::string why;
  EXPECT_FALSE(plan_call(render_kernel(space, c, p, "sm_90").launch, call, attntune::testing::FakeDevice{}.device(), &why));
  EXPECT_NE(why.find("not a multiple"), std::string::npos) << why;
}

// A config recorded before pack_gqa existed (no pack_gqa) renders as pack_gqa=false: the same source.
TEST(FlashFwdMmaRender, AConfigWithoutPackGqaIsAnUnpackedBuild) {
  const SearchSpace space = load_space();
  const Problem p = Problem::parse("b=1,h=32,hkv=8,s=1000,d=128,dtype=bf16,causal=1");
  Config c = space.enumerate(p, "sm_90").front();
  ASSERT_FALSE(std::get<bool>(c.at("pack_gqa")));
  Config old = c;
  old.erase("pack_gqa");
  EXPECT_EQ(render_kernel(space, old, p, "sm_90").source_hash, render_kernel(space, c, p, "sm_90").source_hash);
  EXPECT_EQ(space.check(old, p, "sm_90"), std::nullopt);
  // ... and the strategies' warm starts find it (evo seeds with ValidConfigs::genome_of).
  const search::ValidConfigs valid(space, p, "sm_90");
  ASSERT_TRUE(valid.find(c));
  EXPECT_EQ(valid.find(old), valid.find(c));
}

TEST(FlashFwdMmaRender, InvalidConfigIsRejectedBeforeRendering) {
  const SearchSpace space = load_space();
  const Problem p = Problem::parse("b=1,h=1,s=128,d=128,dtype=bf16,causal=0");
  Config c = space.enumerate(p, "sm_90").front();
  c["block_m"] = std::int64_t{96};
  EXPECT_THROW(render_kernel(space, c, p, "sm_90"), InputError);
  EXPECT_THROW(check_family("flash_fwd_nope"), InputError);
}

class FlashFwdMmaBuild : public ::testing::TestWithParam<std::tuple<int, const char*>> {};

TEST_P(FlashFwdMmaBuild, SampledValidConfigsCompile) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const auto [d, arch] = GetParam();
  const SearchSpace space = load_space();
  const Problem p = Problem::parse(fmt::format("b=1,h=1,s=128,d={},dtype=bf16,causal=0", d));
  const std::size_t n = attntune::testing::build_sample(10);
  BuildPoolOptions pool_opts;
  pool_opts.nvrtc_options = family_nvrtc_options("flash_fwd_mma");
  pool_opts.worker_argv = {attntune::testing::attntune_bin(), "build-worker"};
  BuildPool pool(pool_opts);
  std::size_t i = 0;
  for (const Config& c : spread(space.enumerate(p, arch), n)) {
    Problem v = p;  // alternate dtype and causal over the sample
    v.dtype = i % 2 ? DType::kFp16 : DType::kBf16;
    v.causal = (i++ / 2) % 2;
    pool.submit({c, render_kernel(space, c, v, arch), arch});
  }
  ASSERT_GT(i, 0u);
  std::size_t built = 0;
  while (auto o = pool.next()) {
    ++built;
    EXPECT_EQ(o->build.status, "ok") << config_str(o->job.config) << "\n" << o->build.log;
    EXPECT_FALSE(o->build.cubin.empty());
    EXPECT_GT(o->build.registers, 0) << "ptxas resource report missing";
  }
  EXPECT_EQ(built, std::min<std::uint64_t>(n == 0 ? UINT64_MAX : n, space.count(p, arch)));
}

INSTANTIATE_TEST_SUITE_P(DimsAndArchs, FlashFwdMmaBuild,
                         ::testing::Combine(::testing::Values(64, 128), ::testing::Values("sm_89", "sm_90")),
                         [](const auto& info) {
                           return fmt::format("d{}_{}", std::get<0>(info.param), std::get<1>(info.param));
                         });

// The PTX carries the instructions the template is built on, for both schedules.
TEST(FlashFwdMmaBuild, PtxUsesMmaSyncLdmatrixCpAsync) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = load_space();
  for (const char* arch : {"sm_89", "sm_90"}) {
    const Problem p = Problem::parse("b=1,h=1,s=128,d=128,dtype=bf16,causal=1");
    for (const char* schedule : {"interleaved", "blockwise"}) {
      Config c;
      space.for_each_valid(p, arch, [&](const Config& x) {
        if (c.empty() && std::get<std::string>(x.at("kv_schedule")) == schedule) c = x;
      });
      ASSERT_FALSE(c.empty()) << schedule;
      cuda::CompileOptions opts{arch, family_nvrtc_options("flash_fwd_mma"), true, 0};
      const auto out = cuda::nvrtc_compile(render_kernel(space, c, p, arch).source, "k.cu", opts);
      ASSERT_TRUE(out.ok) << out.log;
      EXPECT_NE(out.ptx.find("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"), std::string::npos);
      EXPECT_NE(out.ptx.find("ldmatrix.sync.aligned.m8n8.x4.shared.b16"), std::string::npos);
      EXPECT_NE(out.ptx.find("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"), std::string::npos);
      EXPECT_NE(out.ptx.find("cp.async.cg.shared.global"), std::string::npos);
      EXPECT_NE(out.ptx.find("ex2.approx"), std::string::npos);
    }
  }
}

// Head dims are multiples of 16 from 32 to 256; the multiples of 8 between them are refused with
// the reason (the MMA's k-step, the swizzle's 32-byte spans), those outside as unsupported.
TEST(FlashFwdMmaRender, HeadDimsAreMultiplesOf16From32To256) {
  const SearchSpace space = load_space();
  for (int d = 16; d <= 272; d += 8) {
    const Problem p = Problem::parse(fmt::format("b=1,h=1,s=128,d={},dtype=bf16,causal=0", d));
    if (d >= 32 && d <= 256 && d % 16 == 0) {
      EXPECT_GT(space.count(p, "sm_80"), 0u) << d;
      EXPECT_GT(space.count(p, "sm_89"), 0u) << d;
      EXPECT_GT(space.count(p, "sm_90"), 0u) << d;
      continue;
    }
    try {
      space.check_problem(p, "sm_90");
      ADD_FAILURE() << "d=" << d << " accepted";
    } catch (const InputError& e) {
      const std::string what = e.what();
      if (d >= 32 && d <= 256)
        EXPECT_NE(what.find("head dims must be multiples of 16"), std::string::npos) << what;
      else
        EXPECT_NE(what.find(fmt::format("does not support d={}", d)), std::string::npos) << what;
    }
  }
}

// Every head dim but 64, 128 and 256 (built above and by the variant tests) compiles on every
// entry point: a config of a dense, a KV-cache and a packed-batch problem each, the arch (sm_80,
// sm_89, sm_90), dtype, causality and variants turning over them, and spills nothing (the space's
// constraints leave out the configs that spill: search_spaces/flash_fwd_mma.yaml). ptxas's
// registers are printed. ATTNTUNE_BUILD_SAMPLE configs per (head dim, entry point), default 1.
TEST(FlashFwdMmaBuild, EveryHeadDimCompilesOnEveryEntryPointWithoutSpills) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const std::size_t n = std::max<std::size_t>(attntune::testing::build_sample(1), 1);  // 0: 1 as well
  const SearchSpace space = load_space();
  const char* const entries[] = {
      "b=2,h=8,hkv=2,s=1000,d={d},dtype={t}",                  // dense
      "b=4,h=32,hkv=8,s=2048,sk=10240,d={d},dtype={t},page=16",  // kvcache
      "b=8,h=16,s=4096,d={d},dtype={t},varlen=64",             // varlen
  };
  const char* const archs[] = {"sm_80", "sm_89", "sm_90"};
  const char* const variants[] = {"causal=1", "causal=0,window=128,64", "causal=1,softcap=30", "causal=0,sinks=1",
                                  "causal=1,window=128,softcap=30,sinks=1"};
  BuildPoolOptions pool_opts;
  pool_opts.nvrtc_options = family_nvrtc_options("flash_fwd_mma");
  pool_opts.worker_argv = {attntune::testing::attntune_bin(), "build-worker"};
  BuildPool pool(pool_opts);
  std::map<std::uint64_t, std::string> what;
  std::size_t turn = 0;
  for (int d = 32; d <= 256; d += 16) {
    if (d == 64 || d == 128 || d == 256) continue;
    for (const char* entry : entries) {
      for (std::size_t i = 0; i < n; ++i, ++turn) {
        const char* arch = archs[turn % 3];
        const std::string spec = fmt::format(fmt::runtime(entry), fmt::arg("d", d), fmt::arg("t", turn % 2 ? "fp16" : "bf16"));
        const Problem p = Problem::parse(spec + "," + variants[turn % 5]);
        const std::vector<Config> all = space.enumerate(p, arch);
        ASSERT_FALSE(all.empty()) << p.str() << " " << arch;
        const Config& c = all[(i * all.size() / n + turn * 7919) % all.size()];
        what[pool.submit({c, render_kernel(space, c, p, arch), arch})] =
            fmt::format("{} {} {}", arch, p.str(), config_str(c));
      }
    }
  }
  std::size_t built = 0;
  while (auto o = pool.next()) {
    ++built;
    const std::string& w = what.at(o->ticket);
    EXPECT_EQ(o->build.status, "ok") << w << "\n" << o->build.log;
    EXPECT_GT(o->build.registers, 0) << w << ": ptxas resource report missing";
    EXPECT_EQ(o->build.spill_stores + o->build.spill_loads, 0) << w;
    std::printf("%s: %d registers, %d bytes spilled\n", w.c_str(), o->build.registers,
                o->build.spill_stores + o->build.spill_loads);
  }
  EXPECT_EQ(built, turn);
}
}  // namespace test_flash_fwd_mma_build
