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
namespace test_ab_eval {
namespace {

// A fake `attntune eval` at `path`: appends "LABEL PROBLEM" to `log` and prints eval's JSON with a
// median of `us` (and TFLOP/s 100 at 10 us, as the same problem's FLOPs), or status `status`.
void fake_bin(const std::string& path, const std::string& log, const std::string& label, double us,
              const std::string& status = "ok", double sleep_s = 0, const std::string& error = "wrong values") {
  std::ofstream f(path);
  f << "#!/bin/sh\n"
    << (sleep_s > 0 ? "sleep " + std::to_string(sleep_s) + "\n" : "")
    << "problem=''; while [ $# -gt 0 ]; do [ \"$1\" = --problem ] && problem=$2; shift; done\n"
    << "echo \"" << label << " $problem\" >> " << log << "\n"
    << "echo '{\"status\": \"" << status << "\", \"error\": \"" << (status == "ok" ? "" : error)
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
  // eval's whole error under the table, each round's: the failing figure is at its end (run 389's
  // table cut "lse error 0.00117" off at 80 characters).
  const std::string why = "wrong_result: max|out-ref|=0.0153 bound=0.0476 (2 x same-dtype error 0.0228 + atol), "
                          "lse error 0.00117, 0 non-finite outputs, 0 LSE mismatches";
  fake_bin(dir.file("lse"), log, "lse", 0, "wrong_result", 0, why);
  const Shell l = sh("python3 " + testing::source_dir() + "/tools/ab_eval.py --problem P --rounds 2 --run base " +
                     dir.file("base") + " s.yaml a=1 --run lse " + dir.file("lse") + " s.yaml a=2 2>/dev/null");
  EXPECT_EQ(l.status, 1) << l.output;
  EXPECT_NE(l.output.find("lse round 1: wrong_result: " + why), std::string::npos) << l.output;
  EXPECT_NE(l.output.find("lse round 2: wrong_result: " + why), std::string::npos) << l.output;
  // Two runs with one label: refused before any eval.
  const Shell dup = sh("python3 " + testing::source_dir() + "/tools/ab_eval.py --problem P --run x " +
                       dir.file("base") + " s a=1 --run x " + dir.file("base") + " s a=2 2>&1");
  EXPECT_EQ(dup.status, 2) << dup.output;
}

// Device time is boxed: --budget-seconds starts no round the last one's duration says would end past
// it (whole rounds: both runs keep one round each here), and a SIGTERM mid-run prints the tables of
// what was measured and exits 3.
TEST(AbEval, ABudgetOrASigtermStillReportsTheRoundsMeasured) {
  TempDir dir;
  const std::string log = dir.file("calls.log");
  fake_bin(dir.file("a"), log, "a", 10.0, "ok", 0.4);
  fake_bin(dir.file("b"), log, "b", 8.0, "ok", 0.4);
  const std::string runs = " --run a " + dir.file("a") + " s.yaml x=1 --run b " + dir.file("b") + " s.yaml x=2";
  const std::string tool = "python3 " + testing::source_dir() + "/tools/ab_eval.py --problem P";
  // Rounds of ~0.8 s against a budget of 1.2 s: one round, then no other.
  const Shell r = sh(tool + " --rounds 5 --budget-seconds 1.2" + runs + " --json " + dir.file("o.json") + " 2>/dev/null");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(read(log), "a P\nb P\n");
  EXPECT_NE(r.output.find("stopped after 1 of 5 rounds: --budget-seconds"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1.250"), std::string::npos) << r.output;
  const auto j = nlohmann::json::parse(read(dir.file("o.json")));
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[1]["evaluations"].size(), 1u);
  // A SIGTERM after a round or more of 10 (~3 rounds' time): the tables of what is done, exit 3.
  const Shell t = sh(tool + " --rounds 10" + runs + " 2>/dev/null & pid=$!; sleep 2.5; kill -TERM $pid; wait $pid; "
                     "echo rc=$?");
  EXPECT_NE(t.output.find("rc=3"), std::string::npos) << t.output;
  EXPECT_NE(t.output.find(" of 10 rounds: SIGTERM"), std::string::npos) << t.output;
  EXPECT_EQ(t.output.find("stopped after 0 of"), std::string::npos) << t.output;
  EXPECT_NE(t.output.find("1.250"), std::string::npos) << t.output;
  // Bad budgets are refused before any eval.
  EXPECT_EQ(sh(tool + " --budget-seconds 0" + runs + " 2>&1").status, 2);
}

}  // namespace
}  // namespace test_ab_eval
}  // namespace attntune::test
