// The driver layer on a real GPU: kernels compiled by NVRTC for this device, loaded, launched,
// timed, and a faulting kernel's sticky error. Without a GPU each test skips with the reason.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "tests/common/mma_tile_kernel.hpp"
#include "cuda/driver.hpp"
#include "cuda/nvrtc.hpp"

namespace test_cuda_driver {
using namespace attntune;
using namespace attntune::cuda;
using attntune::testing::kMmaTile;

#define REQUIRE_GPU()                                               \
  do {                                                              \
    std::string why_;                                               \
    if (!driver_available(&why_)) GTEST_SKIP() << "no GPU: " << why_; \
    if (!nvrtc_available(&why_)) GTEST_SKIP() << "no NVRTC: " << why_; \
  } while (0)

namespace {

constexpr const char* kKernels = R"(
extern "C" __global__ void fill(unsigned* out, unsigned n, unsigned seed) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i * 2654435761u ^ seed;
}

__device__ unsigned counter;
extern "C" __global__ void count() { atomicAdd(&counter, 1u); }

// Reverses n floats through dynamic shared memory (n * 4 bytes of it).
extern "C" __global__ void smem_reverse(float* out, int n) {
  extern __shared__ float s[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = static_cast<float>(i);
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = s[n - 1 - i];
}
extern "C" __global__ void smem_reverse_no_optin(float* out, int n) {
  extern __shared__ float s[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = static_cast<float>(i);
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = s[n - 1 - i];
}

extern "C" __global__ void spin(long long cycles, unsigned* sink) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
  if (threadIdx.x == 0) sink[blockIdx.x] = 1u;
}

// Writes 1 TiB past the end of its buffer: an illegal address on any GPU.
extern "C" __global__ void out_of_bounds(unsigned* p) { p[(1ull << 38) + threadIdx.x] = 1u; }
)";

// A kernel in clusters of two CTAs (sm_90+), as flash_fwd_wgmma's kv_multicast is: each CTA
// writes its rank in the cluster.
constexpr const char* kClusterKernel = R"(
extern "C" __global__ void __cluster_dims__(2, 1, 1) cluster_rank(unsigned* out) {
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  if (threadIdx.x == 0) out[blockIdx.x] = rank;
}
)";

CompileOutput compile_for_device(const char* source, const std::string& arch) {
  CompileOptions o;
  o.arch = arch;
  CompileOutput out = nvrtc_compile(source, "test_cuda_driver.cu", o);
  if (!out.ok) throw WorkError("test kernels do not compile:\n" + out.log);
  return out;
}

unsigned pattern(unsigned i, unsigned seed) { return i * 2654435761u ^ seed; }

std::uint16_t to_bf16(float f) {  // exact for the small integers used here
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<std::uint16_t>(bits >> 16);
}

}  // namespace

TEST(CudaDriverGpu, DeviceProps) {
  REQUIRE_GPU();
  ASSERT_GE(device_count(), 1);
  const DeviceProps p = device_props(0);
  EXPECT_EQ(p.ordinal, 0);
  EXPECT_FALSE(p.name.empty());
  EXPECT_TRUE(std::regex_match(p.arch, std::regex(R"(sm_\d+)"))) << p.arch;
  EXPECT_EQ(p.arch, "sm_" + std::to_string(p.cc_major) + std::to_string(p.cc_minor));
  EXPECT_TRUE(std::regex_match(p.uuid, std::regex(
      R"(GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"))) << p.uuid;
  EXPECT_GT(p.sm_count, 0);
  EXPECT_GE(p.max_smem_per_block_optin, 48 * 1024);
  EXPECT_GE(p.smem_per_sm, p.max_smem_per_block_optin);
  EXPECT_GE(p.regs_per_sm, 64 * 1024);
  EXPECT_EQ(p.max_threads_per_block, 1024);
  EXPECT_GT(p.l2_bytes, 0);
  EXPECT_GT(p.total_mem, std::size_t{1} << 30);
  EXPECT_GE(p.driver_version, 13000);
  EXPECT_TRUE(std::regex_match(p.driver_version_str, std::regex(R"(\d+\.\d)"))) << p.driver_version_str;
  std::printf("device 0: %s %s, %d SMs, %d KiB smem/block opt-in, driver %s (CUDA %s)\n",
              p.name.c_str(), p.arch.c_str(), p.sm_count, p.max_smem_per_block_optin / 1024,
              p.driver_release.c_str(), p.driver_version_str.c_str());
  EXPECT_THROW(device_props(device_count()), InputError);
  EXPECT_THROW(Context(-1), InputError);
}

TEST(CudaDriverGpu, LaunchWritesPatternAndMemcpyReadsIt) {
  REQUIRE_GPU();
  const DeviceProps p = device_props(0);
  Context ctx(0);
  const CompileOutput out = compile_for_device(kKernels, p.arch);
  Module module(out.cubin);
  const Function fill = module.function("fill");

  unsigned n = 1'000'003;  // not a multiple of the block
  const unsigned seed = 0x5eedu;
  constexpr unsigned kGuard = 64;  // words past n the kernel must leave alone
  DeviceBuffer buf((n + kGuard) * sizeof(unsigned));
  buf.fill_u32(0xdeadbeefu);
  CUdeviceptr ptr = buf.ptr();
  unsigned seed_arg = seed;
  void* args[] = {&ptr, &n, &seed_arg};
  launch(fill, Dim3{(n + 255) / 256}, Dim3{256}, 0, nullptr, args);
  ctx.synchronize();

  std::vector<unsigned> host(n + kGuard);
  buf.download(host.data(), host.size() * sizeof(unsigned));
  unsigned bad = 0;
  for (unsigned i = 0; i < n; ++i) bad += host[i] != pattern(i, seed);
  EXPECT_EQ(bad, 0u);
  for (unsigned i = n; i < n + kGuard; ++i) EXPECT_EQ(host[i], 0xdeadbeefu) << i;

  // Device to device and partial copies at an offset.
  DeviceBuffer copy(buf.bytes());
  copy.copy_from(buf, buf.bytes());
  std::vector<unsigned> tail(16);
  copy.download(tail.data(), 16 * sizeof(unsigned), (n - 8) * sizeof(unsigned));
  for (unsigned i = 0; i < 8; ++i) EXPECT_EQ(tail[i], pattern(n - 8 + i, seed));
  for (unsigned i = 8; i < 16; ++i) EXPECT_EQ(tail[i], 0xdeadbeefu);
  const std::vector<unsigned> ones(4, 1u);
  copy.upload(ones.data(), 16, 4);
  unsigned first[6];
  copy.download(first, sizeof(first));
  EXPECT_EQ(first[0], pattern(0, seed));
  for (int i = 1; i <= 4; ++i) EXPECT_EQ(first[i], 1u);
  EXPECT_EQ(first[5], pattern(5, seed));
  EXPECT_THROW(copy.download(first, 8, copy.bytes() - 4), std::out_of_range);
}

TEST(CudaDriverGpu, ModuleGlobalsAndFunctionAttributes) {
  REQUIRE_GPU();
  const DeviceProps p = device_props(0);
  Context ctx(0);
  const CompileOutput out = compile_for_device(kKernels, p.arch);
  Module module(out.cubin);
  const Function count = module.function("count");

  const DeviceSymbol counter = module.global("counter");
  ASSERT_EQ(counter.bytes, sizeof(unsigned));
  CU_CHECK(driver().cuMemsetD32(counter.ptr, 0, 1));
  launch(count, Dim3{37}, Dim3{96}, 0, nullptr, nullptr);
  unsigned total = 0;
  CU_CHECK(driver().cuMemcpyDtoH(&total, counter.ptr, sizeof(total)));
  EXPECT_EQ(total, 37u * 96u);

  // The driver agrees with what the ptxas log said.
  const Function fill = module.function("fill");
  const PtxasFunction* info = out.ptxas.entry("fill");
  ASSERT_NE(info, nullptr) << "flags: " << fmt::format("{}", fmt::join(compile_flags(CompileOptions{p.arch, {}, false, 0}), " ")) << "\nptxas log:\n" << out.log;
  EXPECT_EQ(fill.num_regs(), info->registers);
  EXPECT_EQ(fill.local_bytes(), info->stack_frame);
  EXPECT_EQ(fill.static_smem_bytes(), 0);
  EXPECT_EQ(fill.max_threads_per_block(), 1024);
  EXPECT_GT(fill.max_active_blocks_per_sm(256, 0), 0);

  try {
    module.function("no_such_kernel");
    FAIL() << "no exception";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.result(), CUDA_ERROR_NOT_FOUND) << e.what();
    EXPECT_FALSE(e.sticky());
    EXPECT_NE(std::string(e.what()).find("no_such_kernel"), std::string::npos) << e.what();
  }
  EXPECT_GT(ctx.limit(CU_LIMIT_STACK_SIZE), 0u);
  const Context::MemInfo mem = ctx.mem_info();
  EXPECT_GT(mem.total, 0u);
  EXPECT_LE(mem.free, mem.total);
}

TEST(CudaDriverGpu, DynamicSharedMemoryNeedsOptIn) {
  REQUIRE_GPU();
  const DeviceProps p = device_props(0);
  Context ctx(0);
  const CompileOutput out = compile_for_device(kKernels, p.arch);
  Module module(out.cubin);
  const int bytes = p.max_smem_per_block_optin;
  ASSERT_GT(bytes, 48 * 1024) << "this test needs a GPU with more than 48 KiB opt-in smem";
  int n = bytes / 4;
  DeviceBuffer buf(static_cast<std::size_t>(n) * 4);
  CUdeviceptr ptr = buf.ptr();
  void* args[] = {&ptr, &n};

  // Above 48 KiB without the attribute: a launch error, and not a sticky one.
  const Function plain = module.function("smem_reverse_no_optin");
  try {
    launch(plain, Dim3{1}, Dim3{1024}, static_cast<unsigned>(bytes), nullptr, args);
    FAIL() << "launch with " << bytes << " bytes of dynamic smem and no opt-in succeeded";
  } catch (const CudaError& e) {
    EXPECT_FALSE(e.sticky()) << e.what();
    EXPECT_NE(std::string(e.what()).find("smem_reverse_no_optin"), std::string::npos) << e.what();
  }

  const Function f = module.function("smem_reverse");
  f.set_max_dynamic_smem(bytes);
  EXPECT_EQ(f.attribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), bytes);
  EXPECT_EQ(f.max_active_blocks_per_sm(1024, static_cast<std::size_t>(bytes)), 1);
  launch(f, Dim3{1}, Dim3{1024}, static_cast<unsigned>(bytes), nullptr, args);
  ctx.synchronize();
  std::vector<float> host(static_cast<std::size_t>(n));
  buf.download(host.data(), buf.bytes());
  int bad = 0;
  for (int i = 0; i < n; ++i) bad += host[static_cast<std::size_t>(i)] != static_cast<float>(n - 1 - i);
  EXPECT_EQ(bad, 0);
}

// A kernel with compiled-in cluster dims: its co-resident clusters (what a persistent grid of
// them is capped at, LoadedKernel), a plain launch of whole clusters, and an odd grid refused.
TEST(CudaDriverGpu, ClusterDimsKernelLaunchesPlainlyInWholeClusters) {
  REQUIRE_GPU();
  const DeviceProps p = device_props(0);
  if (p.cc_major < 9) GTEST_SKIP() << p.arch << " has no thread block clusters";
  Context ctx(0);
  Module module(compile_for_device(kClusterKernel, p.arch).cubin);
  const Function f = module.function("cluster_rank");
  const unsigned grid = static_cast<unsigned>(p.sm_count / 2 * 2);
  const int light = f.max_active_clusters({grid, 1, 1}, 128, 0);
  EXPECT_GE(light, p.sm_count / 2) << "small CTAs: at least a cluster per two SMs";
  const int bytes = p.max_smem_per_block_optin;
  f.set_max_dynamic_smem(bytes);
  const int heavy = f.max_active_clusters({grid, 1, 1}, 128, static_cast<std::size_t>(bytes));
  EXPECT_GT(heavy, 0);
  EXPECT_LE(heavy, p.sm_count / 2) << "one CTA per SM";
  std::printf("%s: %d clusters of 2 fit with 128 threads, %d with %d bytes of smem a CTA\n", p.name.c_str(), light,
              heavy, bytes);

  DeviceBuffer out(grid * sizeof(unsigned));
  out.fill_u32(0xFFFFFFFFu);
  CUdeviceptr ptr = out.ptr();
  void* args[] = {&ptr};
  launch(f, Dim3{grid}, Dim3{128}, 0, nullptr, args);
  ctx.synchronize();
  std::vector<unsigned> ranks(grid);
  out.download(ranks.data(), out.bytes());
  for (unsigned i = 0; i < grid; ++i) EXPECT_EQ(ranks[i], i % 2) << "CTA " << i;
  try {
    launch(f, Dim3{3}, Dim3{128}, 0, nullptr, args);
    ctx.synchronize();
    FAIL() << "a grid of 3 CTAs in clusters of 2 launched";
  } catch (const CudaError& e) {
    EXPECT_FALSE(e.sticky()) << e.what();
  }

  // Without cluster dims the answer is 0 clusters, not an error (H100, driver 580): a persistent
  // grid then counts the SMs alone (persistent_ctas).
  Module plain(compile_for_device(kKernels, p.arch).cubin);
  EXPECT_EQ(plain.function("fill").max_active_clusters({grid, 1, 1}, 128, 0), 0);
}

TEST(CudaDriverGpu, EventsTimeAKernelOnAStream) {
  REQUIRE_GPU();
  const DeviceProps p = device_props(0);
  Context ctx(0);
  const CompileOutput out = compile_for_device(kKernels, p.arch);
  Module module(out.cubin);
  const Function spin = module.function("spin");
  Stream stream;  // non-blocking: ordered only with itself, so everything below goes on it
  DeviceBuffer sink(4 * sizeof(unsigned));
  sink.fill_u32_async(0, stream.get());
  Event start, stop;
  // 4M cycles: at least 2 ms at any clock up to 2 GHz (H100/H200 boost to 1.98 GHz).
  long long cycles = 4'000'000;
  CUdeviceptr sink_ptr = sink.ptr();
  void* args[] = {&cycles, &sink_ptr};
  start.record(stream.get());
  launch(spin, Dim3{4}, Dim3{32}, 0, stream.get(), args);
  stop.record(stream.get());
  // 4M cycles take far longer than reaching here: the stream is busy and the interval not ready.
  EXPECT_FALSE(stream.done());
  try {
    elapsed_ms(start, stop);
    ADD_FAILURE() << "elapsed_ms succeeded before the kernel finished";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.result(), CUDA_ERROR_NOT_READY) << e.what();
  }
  stop.synchronize();
  EXPECT_TRUE(stream.done());
  const float ms = elapsed_ms(start, stop);
  EXPECT_GT(ms, 1.0f);
  EXPECT_LT(ms, 1000.0f);
  unsigned host[4] = {};
  sink.download_async(host, sizeof(host), stream.get());
  stream.synchronize();
  for (unsigned v : host) EXPECT_EQ(v, 1u);
}

TEST(CudaDriverGpu, MmaTileMatchesCpu) {
  REQUIRE_GPU();
  const DeviceProps p = device_props(0);
  if (p.cc_major < 8) GTEST_SKIP() << "cp.async and bf16 mma.sync need sm_80+, this is " << p.arch;
  Context ctx(0);
  const CompileOutput out = compile_for_device(kMmaTile, p.arch);
  Module module(out.cubin);

  std::vector<float> a(16 * 16), b(16 * 8);
  for (int i = 0; i < 16 * 16; ++i) a[static_cast<std::size_t>(i)] = static_cast<float>((i * 37 + 11) % 7 - 3);
  for (int i = 0; i < 16 * 8; ++i) b[static_cast<std::size_t>(i)] = static_cast<float>((i * 13 + 5) % 5 - 2);
  std::vector<std::uint16_t> a16(a.size()), b16(b.size());
  for (std::size_t i = 0; i < a.size(); ++i) a16[i] = to_bf16(a[i]);
  for (std::size_t i = 0; i < b.size(); ++i) b16[i] = to_bf16(b[i]);
  DeviceBuffer da(a16.size() * 2), db(b16.size() * 2), dc(16 * 8 * 4);
  da.upload(a16.data(), da.bytes());
  db.upload(b16.data(), db.bytes());
  dc.fill_u32(0xffffffffu);  // NaN: any element the kernel does not write fails below
  CUdeviceptr pa = da.ptr(), pb = db.ptr(), pc = dc.ptr();
  void* args[] = {&pa, &pb, &pc};
  launch(module.function("mma_tile"), Dim3{1}, Dim3{32}, 0, nullptr, args);
  ctx.synchronize();
  std::vector<float> c(16 * 8);
  dc.download(c.data(), dc.bytes());
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      float want = 0.f;
      for (int k = 0; k < 16; ++k)
        want += a[static_cast<std::size_t>(m * 16 + k)] * b[static_cast<std::size_t>(k * 8 + n)];
      EXPECT_EQ(c[static_cast<std::size_t>(m * 8 + n)], want) << "c[" << m << "," << n << "]";
    }
}

TEST(CudaDriverGpu, ModuleLoadErrorsAreReportedAndNotSticky) {
  REQUIRE_GPU();
  const DeviceProps p = device_props(0);
  Context ctx(0);
  try {
    Module garbage(std::string(4096, 'x'));
    FAIL() << "a garbage image loaded";
  } catch (const CudaError& e) {
    EXPECT_FALSE(e.sticky()) << e.what();
    EXPECT_NE(std::string(e.what()).find("cuModuleLoadDataEx(4096-byte image)"), std::string::npos)
        << e.what();
  }

  // PTX loads through the driver's JIT; broken PTX fails with the JIT's log attached.
  CompileOptions o;
  o.arch = p.arch;
  o.want_ptx = true;
  const CompileOutput out = nvrtc_compile(kKernels, "ptx_path.cu", o);
  ASSERT_TRUE(out.ok) << out.log;
  {
    Module from_ptx(out.ptx);
    EXPECT_NE(from_ptx.function("fill").get(), nullptr);
  }
  std::string broken = out.ptx;
  const std::size_t ret = broken.find("ret;");
  ASSERT_NE(ret, std::string::npos);
  broken.insert(ret, "no_such_instruction.b32 %r1;\n\t");
  try {
    Module bad(broken);
    FAIL() << "broken PTX loaded";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.result(), CUDA_ERROR_INVALID_PTX) << e.what();
    EXPECT_FALSE(e.detail().empty()) << "no JIT error log: " << e.what();
    EXPECT_FALSE(e.sticky());
  }

  // The context still works.
  Module module(out.cubin);
  DeviceBuffer buf(1024 * sizeof(unsigned));
  CUdeviceptr ptr = buf.ptr();
  unsigned n = 1024, seed = 1;
  void* args[] = {&ptr, &n, &seed};
  launch(module.function("fill"), Dim3{4}, Dim3{256}, 0, nullptr, args);
  ctx.synchronize();
  unsigned last = 0;
  buf.download(&last, sizeof(last), 1023 * sizeof(unsigned));
  EXPECT_EQ(last, pattern(1023, seed));
}

TEST(CudaDriverGpu, TensorMapEncodeTiled) {
  REQUIRE_GPU();
  const DeviceProps p = device_props(0);
  if (p.cc_major < 9) GTEST_SKIP() << "TMA needs sm_90+, this is " << p.arch;
  Context ctx(0);
  // A [256 rows, 128 cols] bf16 tensor, tiles of 64 x 64 with the 128-byte swizzle.
  DeviceBuffer buf(256 * 128 * 2);
  CUtensorMap map;
  const cuuint64_t dims[2] = {128, 256};           // innermost first
  const cuuint64_t strides[1] = {128 * 2};         // bytes between rows
  const cuuint32_t box[2] = {64, 64};
  const cuuint32_t elem_strides[2] = {1, 1};
  CU_CHECK(driver().cuTensorMapEncodeTiled(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, reinterpret_cast<void*>(buf.ptr()), dims, strides,
      box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  // A box wider than the swizzle span is refused, as a plain (non-sticky) error.
  const cuuint32_t too_wide[2] = {128, 64};  // 256 bytes > 128-byte swizzle
  const CUresult r = driver().cuTensorMapEncodeTiled(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, reinterpret_cast<void*>(buf.ptr()), dims, strides,
      too_wide, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  EXPECT_NE(r, CUDA_SUCCESS);
  EXPECT_FALSE(is_sticky(r));
}

namespace {
// Runs in a fresh process (death test): launches the faulting kernel and exits 0 if the fault came
// back as a sticky CudaError that later calls repeat, else 1. Prints what it saw on stderr.
[[noreturn]] void fault_and_report() {
  try {
    const DeviceProps p = device_props(0);
    Context ctx(0);
    const CompileOutput out = compile_for_device(kKernels, p.arch);
    Module module(out.cubin);
    DeviceBuffer buf(1024 * sizeof(unsigned));
    CUdeviceptr ptr = buf.ptr();
    void* args[] = {&ptr};
    launch(module.function("out_of_bounds"), Dim3{1}, Dim3{32}, 0, nullptr, args);
    try {
      ctx.synchronize();
    } catch (const CudaError& e) {
      std::fprintf(stderr, "fault: %s sticky=%d\n", e.name().c_str(), e.sticky() ? 1 : 0);
      bool repeats = false;
      try {
        buf.fill_u32(0);
        ctx.synchronize();
      } catch (const CudaError& again) {
        repeats = again.result() == e.result();
        std::fprintf(stderr, "next call: %s\n", again.name().c_str());
      }
      std::fflush(stderr);
      std::_Exit(e.sticky() && repeats ? 0 : 1);
    }
    std::fprintf(stderr, "no fault reported\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected: %s\n", e.what());
  }
  std::fflush(stderr);
  std::_Exit(2);
}
}  // namespace

TEST(CudaDriverGpu, OutOfBoundsKernelGivesStickyError) {
  REQUIRE_GPU();
  // The fault poisons the context for the rest of the process, so it happens in a child that
  // re-executes this binary (the "threadsafe" style: no CUDA state inherited through fork).
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(fault_and_report(), ::testing::ExitedWithCode(0), "fault: CUDA_ERROR_[A-Z_]+ sticky=1");
}
}  // namespace test_cuda_driver
