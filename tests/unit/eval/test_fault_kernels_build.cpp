// The planted faults of tests/data/faults/ build as intended with no GPU: each compiles except
// compile_error.cu, whose log names its mistake, and each keeps the flash_fwd_mma entry point.
// (Their classification on a GPU: tests/gpu/test_evaluator.cpp.)
#include <gtest/gtest.h>

#include "eval/build_pool.hpp"
#include "fault_kernels.hpp"

namespace test_fault_kernels_build {
using namespace attntune;

TEST(FaultKernels, BuildAsIntended) {
  BuildPoolOptions o;
  o.jobs = 2;
  o.worker_argv = {ATTNTUNE_BIN, "build-worker"};
  BuildPool pool(o);
  for (const auto& f : attntune::testing::fault_kernels()) {
    BuildJob j;
    j.config = {{"fault", Value(std::string(f.file))}};
    j.kernel = attntune::testing::render_fault(ATTNTUNE_SOURCE_DIR, f.file, 64);
    j.arch = "sm_90";
    EXPECT_NE(j.kernel.source.find("extern \"C\" __global__ void flash_fwd_mma(const AttnParams p)"), std::string::npos);
    EXPECT_EQ(j.kernel.source.find("#include"), std::string::npos) << f.file;
    pool.submit(std::move(j));
  }
  int n = 0;
  while (auto out = pool.next()) {
    ++n;
    const std::string file = std::get<std::string>(out->job.config.at("fault"));
    if (file == "compile_error.cu") {
      EXPECT_EQ(out->build.status, "compile_error");
      EXPECT_NE(out->build.log.find("undeclared_tile_size"), std::string::npos) << out->build.log;
    } else {
      EXPECT_EQ(out->build.status, "ok") << file << "\n" << out->build.log;
    }
    if (file == "too_much_smem.cu") {
      EXPECT_EQ(out->build.smem_static, 32768);
    }
  }
  EXPECT_EQ(n, static_cast<int>(attntune::testing::fault_kernels().size()));
}
}  // namespace test_fault_kernels_build
