// `attntune eval` through the binary where it can run without a GPU: bad input is exit 2 before
// any worker starts, and no GPU is exit 3 with one line. (On a GPU: tests/gpu/test_evaluator.cpp.)
#include <array>
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "cuda/driver.hpp"

namespace {

struct RunResult {
  int code;
  std::string out;
};

RunResult shell(const std::string& command) {
  const std::string cmd = "( " + command + " ) 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (std::size_t n = fread(buf.data(), 1, buf.size(), f)) out.append(buf.data(), n);
  const int status = pclose(f);
  return {WEXITSTATUS(status), out};
}

RunResult run(const std::string& args) { return shell(std::string(ATTNTUNE_BIN) + " " + args); }

const std::string kEval = std::string("eval --space ") + ATTNTUNE_SOURCE_DIR + "/search_spaces/flash_fwd_mma.yaml";
const std::string kConfig =
    "block_m=64,block_n=64,warps=4,kv_stages=2,q_in_regs=1,min_blocks=1,frag_prefetch=1,lazy_rescale=0,"
    "kv_schedule=interleaved,sub_n=64";

}  // namespace

TEST(CmdEval, BadInputIsExit2BeforeAnyGpuWork) {
  RunResult missing = run(kEval + " --problem b=1,h=2,s=256,d=64,dtype=fp16,causal=0 --config block_m=64");
  EXPECT_EQ(missing.code, 2) << missing.out;
  EXPECT_NE(missing.out.find("attntune: error: "), std::string::npos) << missing.out;
  EXPECT_NE(missing.out.find("missing parameter 'block_n'"), std::string::npos) << missing.out;
  RunResult domain = run(kEval + " --problem b=1,h=2,s=256,d=64,dtype=fp16,causal=0 --config " +
                         std::string(kConfig).replace(0, 10, "block_m=96"));
  EXPECT_EQ(domain.code, 2) << domain.out;
  RunResult problem = run(kEval + " --problem b=1,h=2,s=256,d=64,dtype=fp33 --config " + kConfig);
  EXPECT_EQ(problem.code, 2) << problem.out;
  RunResult format = run(kEval + " --problem b=1,h=2,s=256,d=64,dtype=fp16,causal=0 --format csv --config " + kConfig);
  EXPECT_EQ(format.code, 2) << format.out;
  RunResult usage = run("eval --config " + kConfig);
  EXPECT_EQ(usage.code, 2) << usage.out;
}

TEST(CmdEval, NoGpuIsExit3WithOneLine) {
  std::string why;
  if (attntune::cuda::driver_available(&why)) GTEST_SKIP() << "this machine has a GPU (tests/gpu covers eval there)";
  RunResult r = run(kEval + " --problem b=1,h=2,s=256,d=64,dtype=fp16,causal=0 --config " + kConfig);
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_EQ(r.out, "attntune: error: " + why + "\n");
}

TEST(CmdEval, HiddenWorkersAreNotListedButAnswer) {
  RunResult help = run("--help");
  EXPECT_NE(help.out.find("eval"), std::string::npos);
  EXPECT_EQ(help.out.find("worker"), std::string::npos) << help.out;
  // A build worker given nothing to build exits 0; given garbage, it says so and exits 1.
  EXPECT_EQ(run("build-worker < /dev/null").code, 0);
  RunResult garbage = shell(std::string("printf 'not a frame' | ") + ATTNTUNE_BIN + " build-worker");
  EXPECT_EQ(garbage.code, 1) << garbage.out;
  EXPECT_NE(garbage.out.find("expected magic"), std::string::npos) << garbage.out;
}
