// The driver layer without a GPU: what a GPU command says on a machine with no driver, the
// loader's messages, and the error checker's classification. tests/gpu/test_cuda_driver.cpp
// covers the handles on a real device.
#include <gtest/gtest.h>
#include <dlfcn.h>

#include <string>

#include "core/error.hpp"
#include "cuda/driver.hpp"

namespace test_driver {
using namespace attntune;
using namespace attntune::cuda;

namespace {
bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool contains(const std::string& s, const std::string& p) { return s.find(p) != std::string::npos; }

// Whether this machine has a driver at all, asked independently of the code under test.
bool libcuda_present(std::string* where) {
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!h) return false;
  *where = "libcuda.so.1 loads here";
  dlclose(h);
  return true;
}
}  // namespace

TEST(Driver, WithoutADriverGpuEntryPointsThrowEnvError) {
  std::string where;
  if (libcuda_present(&where))
    GTEST_SKIP() << "an NVIDIA driver is installed (" << where
                 << "); this test checks the message on machines without one";

  const std::string expected =
      "no NVIDIA driver: libcuda.so.1 could not be loaded (this command needs a GPU; space, "
      "compile, best, export and replay work without one)";
  try {
    driver();
    FAIL() << "driver() did not throw";
  } catch (const EnvError& e) {
    EXPECT_EQ(e.what(), expected);
    EXPECT_EQ(e.code(), ExitCode::kEnvironment);
  }
  std::string why;
  EXPECT_FALSE(driver_available(&why));
  EXPECT_EQ(why, expected);
  // Every entry point that needs the driver says the same, and none of them crashes.
  EXPECT_THROW(device_count(), EnvError);
  EXPECT_THROW(device_props(0), EnvError);
  EXPECT_THROW(Context(0), EnvError);
  EXPECT_THROW(DeviceBuffer(1024), EnvError);
  EXPECT_THROW(Stream(), EnvError);
  EXPECT_THROW(Event(), EnvError);
  EXPECT_EQ(detail::loaded_driver(), nullptr);
  // Empty handles are destroyed without the driver.
  { Context c; Module m; DeviceBuffer b(0); }
}

TEST(Driver, LoaderMessages) {
  const std::string missing = detail::probe_driver("libattntune-no-such-driver.so.1");
  EXPECT_EQ(missing,
            "no NVIDIA driver: libattntune-no-such-driver.so.1 could not be loaded (this command "
            "needs a GPU; space, compile, best, export and replay work without one)");
  // A library that loads but is no CUDA driver.
  const std::string not_cuda = detail::probe_driver("libm.so.6");
  EXPECT_TRUE(starts_with(not_cuda, "no usable NVIDIA driver: ")) << not_cuda;
  EXPECT_TRUE(contains(not_cuda, "has no cuGetProcAddress_v2")) << not_cuda;
  EXPECT_TRUE(contains(not_cuda, "CUDA 13.0 or newer")) << not_cuda;
}

TEST(Driver, StickyErrorsAreThoseThatPoisonTheContext) {
  for (CUresult r : {CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_LAUNCH_FAILED,
                     CUDA_ERROR_ILLEGAL_INSTRUCTION, CUDA_ERROR_MISALIGNED_ADDRESS,
                     CUDA_ERROR_HARDWARE_STACK_ERROR, CUDA_ERROR_INVALID_PC, CUDA_ERROR_ASSERT,
                     CUDA_ERROR_INVALID_ADDRESS_SPACE, CUDA_ERROR_LAUNCH_TIMEOUT,
                     CUDA_ERROR_ECC_UNCORRECTABLE})
    EXPECT_TRUE(is_sticky(r)) << r;
  // Errors the tuner recovers from in the same process: a candidate that asks too much, a
  // module that does not load, a missing symbol.
  for (CUresult r : {CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY,
                     CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, CUDA_ERROR_INVALID_IMAGE,
                     CUDA_ERROR_NO_BINARY_FOR_GPU, CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_READY,
                     CUDA_ERROR_INVALID_PTX, CUDA_ERROR_NO_DEVICE})
    EXPECT_FALSE(is_sticky(r)) << r;
}

TEST(Driver, CudaErrorCarriesCallResultAndExitCode) {
  const CudaError e(CUDA_ERROR_ILLEGAL_ADDRESS, "cuCtxSynchronize()");
  EXPECT_TRUE(e.sticky());
  EXPECT_EQ(e.result(), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(e.call(), "cuCtxSynchronize()");
  EXPECT_EQ(e.code(), ExitCode::kFailed);
  EXPECT_TRUE(starts_with(e.what(), "cuCtxSynchronize() failed: ")) << e.what();
  EXPECT_TRUE(contains(e.what(), "(700)")) << e.what();
  // The name comes from the driver's cuGetErrorName when it is loaded.
  EXPECT_EQ(e.name(), driver_available() ? "CUDA_ERROR_ILLEGAL_ADDRESS" : "CUresult 700");

  EXPECT_EQ(CudaError(CUDA_ERROR_NO_DEVICE, "cuInit(0)").code(), ExitCode::kEnvironment);
  EXPECT_EQ(CudaError(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "cuInit(0)").code(),
            ExitCode::kEnvironment);
  EXPECT_EQ(CudaError(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc").code(), ExitCode::kFailed);

  // A multi-line JIT log becomes part of one line.
  const CudaError jit(CUDA_ERROR_INVALID_PTX, "cuModuleLoadDataEx(12-byte image)",
                      "ptxas application ptx input, line 9; error : bad\nptxas fatal : aborted\n");
  EXPECT_EQ(jit.detail(), "ptxas application ptx input, line 9; error : bad\nptxas fatal : aborted\n");
  EXPECT_EQ(std::string(jit.what()).find('\n'), std::string::npos) << jit.what();
  EXPECT_TRUE(contains(jit.what(), "error : bad; ptxas fatal : aborted")) << jit.what();
}

TEST(Driver, CuCheckNamesTheCallAsWritten) {
  auto fails = [](int) { return CUDA_ERROR_OUT_OF_MEMORY; };
  try {
    CU_CHECK(fails(42));
    FAIL() << "no exception";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.call(), "fails(42)");
    EXPECT_EQ(e.result(), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_FALSE(e.sticky());
  }
  EXPECT_NO_THROW(CU_CHECK(CUDA_SUCCESS));
  // Calls through the table read as the driver function's name.
  try {
    throw_cuda_error(CUDA_ERROR_INVALID_VALUE, "driver().cuMemAlloc(&p, n)");
  } catch (const CudaError& e) {
    EXPECT_EQ(e.call(), "cuMemAlloc(&p, n)");
  }
}
}  // namespace test_driver
