// NVRTC compiles with no GPU and no driver: these run on CI. They need the CUDA 13 toolkit's
// libnvrtc.so.13, which CI has; without it every test here fails (NVRTC is required to build
// and test attntune, unlike the driver).
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "tests/common/mma_tile_kernel.hpp"
#include "cuda/nvrtc.hpp"

namespace test_nvrtc {
using namespace attntune;
using namespace attntune::cuda;
using attntune::testing::kMmaTile;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}


CompileOptions for_arch(const std::string& arch) {
  CompileOptions o;
  o.arch = arch;
  return o;
}

}  // namespace

TEST(Nvrtc, ReportsVersion13) {
  const std::string v = nvrtc_version();
  EXPECT_TRUE(std::regex_match(v, std::regex(R"(13\.\d+)"))) << v;
  EXPECT_EQ(nvrtc().major, 13);
  EXPECT_FALSE(nvrtc().archs.empty());
}

class NvrtcArch : public ::testing::TestWithParam<std::string> {};

TEST_P(NvrtcArch, CompilesMmaLdmatrixCpAsyncToCubin) {
  const std::string arch = GetParam();
  CompileOutput out = nvrtc_compile(kMmaTile, "mma_tile.cu", for_arch(arch));
  ASSERT_TRUE(out.ok) << out.log;
  ASSERT_GE(out.cubin.size(), 4u);
  EXPECT_EQ(out.cubin.substr(0, 4), std::string("\x7f" "ELF"));
  EXPECT_TRUE(out.ptx.empty());  // not asked for
  EXPECT_TRUE(contains(out.log, "Compiling entry function 'mma_tile' for '" + arch + "'")) << out.log;
  EXPECT_GT(out.registers, 0);
  EXPECT_EQ(out.smem_static, 16 * 16 * 2 + 16 * 8 * 2);  // sa + sb
  EXPECT_EQ(out.spill_stores, 0);
  EXPECT_EQ(out.spill_loads, 0);
  EXPECT_EQ(out.local_bytes, 0);
  EXPECT_GT(out.compile_ms, 0.0);
  const PtxasFunction* k = out.ptxas.entry("mma_tile");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->registers, out.registers);
  EXPECT_EQ(k->barriers, 1);
}

INSTANTIATE_TEST_SUITE_P(Archs, NvrtcArch, ::testing::Values("sm_89", "sm_90", "sm_90a"));

TEST(Nvrtc, WgmmaNeedsSm90a) {
  const char* src = R"(
extern "C" __global__ void wg(float* x) {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  x[0] = 1.f;
})";
  CompileOutput a = nvrtc_compile(src, "wg.cu", for_arch("sm_90a"));
  EXPECT_TRUE(a.ok) << a.log;
  EXPECT_FALSE(a.cubin.empty());
  CompileOutput plain = nvrtc_compile(src, "wg.cu", for_arch("sm_90"));
  EXPECT_FALSE(plain.ok);
  EXPECT_TRUE(plain.cubin.empty());
  EXPECT_TRUE(contains(plain.log, "wgmma")) << plain.log;
}

TEST(Nvrtc, SyntaxErrorIsAResultWithTheLineInTheLog) {
  const char* src =
      "extern \"C\" __global__ void k(float* x) {\n"
      "  int a = 1\n"  // line 2: missing ';' reported on line 3
      "  x[0] = a;\n"
      "}\n";
  CompileOutput out = nvrtc_compile(src, "broken_kernel.cu", for_arch("sm_90"));
  EXPECT_FALSE(out.ok);
  EXPECT_TRUE(out.cubin.empty());
  EXPECT_TRUE(contains(out.log, "broken_kernel.cu(3): error")) << out.log;
  EXPECT_EQ(out.registers, 0);
}

TEST(Nvrtc, LargeLocalArrayReportsStackFrame) {
  const char* src = R"(
extern "C" __global__ void local_array(const float* x, float* y, int n) {
  float a[1024];  // indexed at run time: lives in local memory
  for (int i = 0; i < 1024; ++i) a[i] = x[(i * n) & 4095];
  float s = 0.f;
  for (int i = 0; i < 1024; ++i) s += a[(i * 7 + n) & 1023];
  y[threadIdx.x] = s;
})";
  CompileOutput out = nvrtc_compile(src, "local.cu", for_arch("sm_90"));
  ASSERT_TRUE(out.ok) << out.log;
  EXPECT_GE(out.local_bytes, 4096);
  EXPECT_EQ(out.ptxas.entry("local_array")->stack_frame, out.local_bytes);
}

TEST(Nvrtc, RegisterCapForcesSpillsThatAreReported) {
  // 96 values live across an unrolled reduction need ~100 registers; capped at 32 they spill.
  const char* src = R"(
extern "C" __global__ void spill(const float* __restrict__ x, float* y) {
  float r[96];
#pragma unroll
  for (int i = 0; i < 96; ++i) r[i] = x[threadIdx.x + i * 128];
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < 8; ++k)
#pragma unroll
    for (int i = 0; i < 96; ++i) s += r[i] * r[(i + k) % 96];
  y[threadIdx.x] = s;
})";
  CompileOptions o = for_arch("sm_90");
  CompileOutput free_regs = nvrtc_compile(src, "spill.cu", o);
  ASSERT_TRUE(free_regs.ok) << free_regs.log;
  EXPECT_EQ(free_regs.spill_stores, 0) << free_regs.log;
  EXPECT_GT(free_regs.registers, 32);

  o.max_registers = 32;
  CompileOutput capped = nvrtc_compile(src, "spill.cu", o);
  ASSERT_TRUE(capped.ok) << capped.log;
  EXPECT_LE(capped.registers, 32);
  EXPECT_GT(capped.spill_stores, 0) << capped.log;
  EXPECT_GT(capped.spill_loads, 0);
  EXPECT_GT(capped.local_bytes, 0);
}

TEST(Nvrtc, SeveralKernelsReportTheMaxAndEachOne) {
  const char* src = R"(
extern "C" __global__ void light(float* x) { x[threadIdx.x] *= 2.f; }
extern "C" __global__ void heavy(float* x) {
  __shared__ float t[2048];
  t[threadIdx.x] = x[threadIdx.x];
  __syncthreads();
  x[threadIdx.x] = t[2047 - threadIdx.x];
})";
  CompileOutput out = nvrtc_compile(src, "two.cu", for_arch("sm_90"));
  ASSERT_TRUE(out.ok) << out.log;
  const PtxasFunction* light = out.ptxas.entry("light");
  const PtxasFunction* heavy = out.ptxas.entry("heavy");
  ASSERT_NE(light, nullptr);
  ASSERT_NE(heavy, nullptr);
  EXPECT_EQ(light->smem, 0);
  EXPECT_EQ(heavy->smem, 8192);
  EXPECT_EQ(out.smem_static, 8192);
  EXPECT_EQ(out.registers, std::max(light->registers, heavy->registers));
}

TEST(Nvrtc, ExtraOptionsAndPtxAreApplied) {
  const char* src = R"(
#if BLOCK_N != 64
#error "BLOCK_N must be 64"
#endif
extern "C" __global__ void k(int* x) { x[threadIdx.x] = BLOCK_N * 1001; })";
  CompileOptions o = for_arch("sm_90");
  CompileOutput missing = nvrtc_compile(src, "defs.cu", o);
  EXPECT_FALSE(missing.ok);
  EXPECT_TRUE(contains(missing.log, "BLOCK_N must be 64")) << missing.log;

  o.extra = {"-DBLOCK_N=64", "--use_fast_math", "-lineinfo"};
  o.want_ptx = true;
  CompileOutput out = nvrtc_compile(src, "defs.cu", o);
  ASSERT_TRUE(out.ok) << out.log;
  EXPECT_TRUE(contains(out.ptx, ".target sm_90")) << out.ptx.substr(0, 400);
  EXPECT_TRUE(contains(out.ptx, "64064"));  // BLOCK_N * 1001, folded
  EXPECT_TRUE(contains(out.ptx, ".loc"));   // -lineinfo
  EXPECT_EQ(out.ptx.find('\0'), std::string::npos);
}

TEST(Nvrtc, FlagsAreFixedAndComplete) {
  CompileOptions o = for_arch("sm_90a");
  o.max_registers = 128;
  o.extra = {"-DX=1"};
  const std::vector<std::string> want = {"--gpu-architecture=sm_90a", "-std=c++17",
                                         "--ptxas-options=-v", "--maxrregcount=128", "-DX=1"};
  EXPECT_EQ(compile_flags(o), want);
}

TEST(Nvrtc, RejectsArchitecturesThatGiveNoCubin) {
  EXPECT_THROW(compile_flags(for_arch("compute_90")), InputError);
  EXPECT_THROW(compile_flags(for_arch("90")), InputError);
  EXPECT_THROW(compile_flags(for_arch("")), InputError);
  try {
    compile_flags(for_arch("sm_20"));
    FAIL() << "sm_20 accepted";
  } catch (const InputError& e) {
    EXPECT_TRUE(contains(e.what(), "cannot compile for sm_20")) << e.what();
    EXPECT_TRUE(contains(e.what(), "sm_90")) << e.what();
  }
}

TEST(Nvrtc, UnknownOptionIsAnErrorNotAResult) {
  CompileOptions o = for_arch("sm_90");
  o.extra = {"--no-such-option"};
  try {
    nvrtc_compile("extern \"C\" __global__ void k() {}", "opt.cu", o);
    FAIL() << "no exception";
  } catch (const NvrtcError& e) {
    EXPECT_EQ(e.result(), NVRTC_ERROR_INVALID_OPTION);
    EXPECT_EQ(e.name(), "NVRTC_ERROR_INVALID_OPTION");
    EXPECT_EQ(e.code(), ExitCode::kFailed);
    EXPECT_TRUE(contains(e.what(), "nvrtcCompileProgram(")) << e.what();
    EXPECT_TRUE(contains(e.log(), "--no-such-option")) << e.log();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line: " << e.what();
  }
}

TEST(Nvrtc, NvrtcCheckNamesTheCall) {
  auto fails = [](int) { return NVRTC_ERROR_INVALID_INPUT; };
  try {
    NVRTC_CHECK(fails(7));
    FAIL() << "no exception";
  } catch (const NvrtcError& e) {
    EXPECT_EQ(e.call(), "fails(7)");
    EXPECT_TRUE(contains(e.what(), "fails(7) failed: NVRTC_ERROR_INVALID_INPUT (3)")) << e.what();
  }
}

TEST(Nvrtc, ParallelCompilesFromFourThreads) {
  constexpr int kThreads = 4, kPerThread = 3;
  std::vector<std::vector<CompileOutput>> outs(kThreads);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([t, &outs, &errors] {
      try {
        for (int i = 0; i < kPerThread; ++i) {
          CompileOptions o = for_arch(t % 2 ? "sm_90a" : "sm_89");
          o.want_ptx = true;
          o.extra = {"-DVALUE=" + std::to_string(7000 + t * 10 + i)};
          outs[t].push_back(nvrtc_compile(
              std::string(kMmaTile) +
                  "extern \"C\" __global__ void tag(int* x) { x[threadIdx.x] = VALUE; }\n",
              "parallel_" + std::to_string(t) + ".cu", o));
        }
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  }
  for (auto& th : pool) th.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(errors[t], "") << "thread " << t;
    ASSERT_EQ(outs[t].size(), static_cast<std::size_t>(kPerThread));
    for (int i = 0; i < kPerThread; ++i) {
      const CompileOutput& out = outs[t][i];
      ASSERT_TRUE(out.ok) << out.log;
      EXPECT_FALSE(out.cubin.empty());
      EXPECT_GT(out.registers, 0);
      // Each result is its own program's: its constant, its architecture.
      EXPECT_TRUE(contains(out.ptx, std::to_string(7000 + t * 10 + i))) << "thread " << t;
      EXPECT_TRUE(contains(out.ptx, t % 2 ? ".target sm_90a" : ".target sm_89"));
    }
  }
}

TEST(Nvrtc, MissingLibraryMessage) {
  const std::string why = detail::probe_nvrtc({"libattntune-no-such-nvrtc.so.13", "/nonexistent/lib64/libnvrtc.so.13"});
  EXPECT_EQ(why, "NVRTC not found: libnvrtc.so.13 (install the CUDA 13 toolkit or set CUDA_HOME)");
  // A library that loads but is not NVRTC is named, so a broken setup can be told from a missing one.
  const std::string wrong = detail::probe_nvrtc({"libm.so.6"});
  EXPECT_EQ(wrong.rfind("NVRTC not found: libnvrtc.so.13 (", 0), 0u) << wrong;
  EXPECT_TRUE(contains(wrong, "has no nvrtcVersion")) << wrong;
  EXPECT_EQ(detail::probe_nvrtc(detail::nvrtc_candidates()), "");
}

TEST(Nvrtc, SearchesCudaHome) {
  const char* old = std::getenv("CUDA_HOME");
  const std::string saved = old ? old : "";
  setenv("CUDA_HOME", "/opt/cuda-test-home", 1);
  const std::vector<std::string> c = detail::nvrtc_candidates();
  if (old) setenv("CUDA_HOME", saved.c_str(), 1); else unsetenv("CUDA_HOME");
  ASSERT_GE(c.size(), 3u);
  EXPECT_EQ(c[0], "libnvrtc.so.13");
  EXPECT_NE(std::find(c.begin(), c.end(), "/opt/cuda-test-home/lib64/libnvrtc.so.13"), c.end());
  EXPECT_NE(std::find(c.begin(), c.end(), "/usr/local/cuda/lib64/libnvrtc.so.13"), c.end());
}
}  // namespace test_nvrtc
