// `attntune eval` through the binary where it can run without a GPU: bad input is exit 2 before
// any worker starts, and no GPU is exit 3 with one line. (On a GPU: tests/gpu/test_evaluator.cpp.)
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "cuda/driver.hpp"
#include "tests/common/run_attntune.hpp"

namespace test_cmd_eval {
using attntune::testing::run_attntune;

namespace {

const std::string kEval = std::string("eval --space ") + ATTNTUNE_SOURCE_DIR + "/search_spaces/flash_fwd_mma.yaml";
const std::string kConfig =
    "block_m=64,block_n=64,warps=4,kv_stages=2,q_in_regs=1,min_blocks=1,frag_prefetch=1,lazy_rescale=0,"
    "kv_schedule=interleaved,sub_n=64";

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(CmdEval, BadInputIsExit2BeforeAnyGpuWork) {
  auto missing = run_attntune(kEval + " --problem b=1,h=2,s=256,d=64,dtype=fp16,causal=0 --config block_m=64");
  EXPECT_EQ(missing.rc, 2) << missing.err;
  EXPECT_TRUE(contains(missing.err, "attntune: error: ")) << missing.err;
  EXPECT_TRUE(contains(missing.err, "missing parameter 'block_n'")) << missing.err;
  auto domain = run_attntune(kEval + " --problem b=1,h=2,s=256,d=64,dtype=fp16,causal=0 --config " +
                             std::string(kConfig).replace(0, 10, "block_m=96"));
  EXPECT_EQ(domain.rc, 2) << domain.err;
  auto problem = run_attntune(kEval + " --problem b=1,h=2,s=256,d=64,dtype=fp33 --config " + kConfig);
  EXPECT_EQ(problem.rc, 2) << problem.err;
  auto format = run_attntune(kEval + " --problem b=1,h=2,s=256,d=64,dtype=fp16,causal=0 --format csv --config " + kConfig);
  EXPECT_EQ(format.rc, 2) << format.err;
  auto usage = run_attntune("eval --config " + kConfig);
  EXPECT_EQ(usage.rc, 2) << usage.err;
}

TEST(CmdEval, NoGpuIsExit3WithOneLine) {
  std::string why;
  if (attntune::cuda::driver_available(&why)) GTEST_SKIP() << "this machine has a GPU (tests/gpu covers eval there)";
  auto r = run_attntune(kEval + " --problem b=1,h=2,s=256,d=64,dtype=fp16,causal=0 --config " + kConfig);
  EXPECT_EQ(r.rc, 3) << r.err;
  EXPECT_EQ(r.err, "attntune: error: " + why + "\n");
  EXPECT_EQ(r.out, "");
}

TEST(CmdEval, HiddenWorkersAreNotListedButAnswer) {
  auto help = run_attntune("--help");
  EXPECT_TRUE(contains(help.out, "eval"));
  EXPECT_FALSE(contains(help.out, "worker")) << help.out;
  // A build worker given nothing to build exits 0; given garbage, it says so and exits 1.
  EXPECT_EQ(run_attntune("build-worker < /dev/null").rc, 0);
  const auto garbage_file = std::filesystem::temp_directory_path() / "attntune_not_a_frame.txt";
  std::ofstream(garbage_file) << "not a frame";
  auto garbage = run_attntune("build-worker < " + garbage_file.string());
  std::filesystem::remove(garbage_file);
  EXPECT_EQ(garbage.rc, 1) << garbage.err;
  EXPECT_TRUE(contains(garbage.err, "expected magic 'ATF1', got 'not '")) << garbage.err;
}
}  // namespace test_cmd_eval
