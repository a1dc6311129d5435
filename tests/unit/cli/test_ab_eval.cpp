// tools/ab_eval.py: runs side by side, interleaved round after round (every run sees the same clocks
// under the power cap), a table per problem with each run's median against the first run's; a run
// whose eval fails shows its status and the script exits 1. The GPU is stood in for by fake
// attntune binaries that print eval's JSON and log each call, so the order of the calls is checked.
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../db/db_test_util.hpp"  // TempDir
#include "../export/nvcc_util.hpp"  // sh()
#include "../tune/tune_test_util.hpp"

namespace attntune::test {
namespace {

// A fake `attntune eval` at `path`: appends "LABEL PROBLEM" to `log` and prints eval's JSON with a
// median of `us` (and TFLOP/s 100 at 10 us, as the same problem's FLOPs), or status `status`.
void fake_bin(const std::string& path, const std::string& log, const std::string& label, double us,
              const std::string& status = "ok") {
  std::ofstream f(path);
  f << "#!/bin/sh\n"
    << "problem=''; while [ $# -gt 0 ]; do [ \"$1\" = --problem ] && problem=$2; shift; done\n"
    << "echo \"" << label << " $problem\" >> " << log << "\n"
    << "echo '{\"status\": \"" << status << "\", \"error\": \"" << (status == "ok" ? "" : "wrong values")
    << "\", \"median_us\": " << (status == "ok" ? std::to_string(us) : "null") << ", \"tflops\": "
    << (status == "ok" ? std::to_string(1000.0 / us) : "null") << "}'\n";
  f.close();
  sh("chmod +x " + path);
}

std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(AbEval, InterleavesRoundsAndComparesEachRunWithTheFirst) {
  TempDir dir;
  const std::string log = dir.file("calls.log");
  fake_bin(dir.file("base"), log, "base", 10.0);
  fake_bin(dir.file("new"), log, "new", 8.0);
  const std::string cmd = "python3 " + testing::source_dir() + "/tools/ab_eval.py --problem P1 --problem P2 --rounds 2 " +
                          "--run base " + dir.file("base") + " s.yaml a=1 --run new " + dir.file("new") +
                          " s.yaml a=2 --json " + dir.file("out.json") + " 2>/dev/null";
  const Shell r = sh(cmd);
  ASSERT_EQ(r.status, 0) << r.output;
  // Round 1 of every (problem, run), then round 2: never one run's rounds back to back.
  EXPECT_EQ(read(log), "base P1\nnew P1\nbase P2\nnew P2\nbase P1\nnew P1\nbase P2\nnew P2\n");
  const auto j = nlohmann::json::parse(read(dir.file("out.json")));
  ASSERT_EQ(j.size(), 4u);
  EXPECT_EQ(j[1]["run"], "new");
  EXPECT_DOUBLE_EQ(j[1]["median_us"].get<double>(), 8.0);
  EXPECT_DOUBLE_EQ(j[1]["vs_first"].get<double>(), 1.25);  // 10 us / 8 us
  EXPECT_NEAR(j[1]["tflops"].get<double>(), 125.0, 1e-9);
  EXPECT_NE(r.output.find("1.250"), std::string::npos) << r.output;
}

TEST(AbEval, AFailingRunShowsItsStatusTheOthersGoOnAndItExitsOne) {
  TempDir dir;
  const std::string log = dir.file("calls.log");
  fake_bin(dir.file("base"), log, "base", 10.0);
  fake_bin(dir.file("bad"), log, "bad", 0, "wrong");
  const Shell r = sh("python3 " + testing::source_dir() + "/tools/ab_eval.py --problem P --rounds 2 --run base " +
                     dir.file("base") + " s.yaml a=1 --run bad " + dir.file("bad") + " s.yaml a=2 2>/dev/null");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("wrong values"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("10.00"), std::string::npos) << r.output;
  EXPECT_EQ(read(log), "base P\nbad P\nbase P\nbad P\n");
  // Two runs with one label: refused before any eval.
  const Shell dup = sh("python3 " + testing::source_dir() + "/tools/ab_eval.py --problem P --run x " +
                       dir.file("base") + " s a=1 --run x " + dir.file("base") + " s a=2 2>&1");
  EXPECT_EQ(dup.status, 2) << dup.output;
}

}  // namespace
}  // namespace attntune::test
