// tools/transfer_check.py: issue 43's transfer bar without a whole main job a shape. Each shape's short
// campaign runs as a new user's (a database of its own; here tune on a recorded landscape, no shipped
// file); its evaluations and the reference pick of a finished campaign are timed side by side,
// interleaved round after round (the reference first each round); a shape's figure is the first n
// whose best so far is within 2% of the reference. The GPU's `eval` is stood in for by a wrapper that
// times the reference pick at 100 us and every other config at a time the test sets, and passes
// every other command to the real binary.
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../db/db_test_util.hpp"  // TempDir
#include "../export/nvcc_util.hpp"  // sh()
#include "../tune/tune_test_util.hpp"

namespace attntune::test {
namespace test_transfer_check {
namespace {

std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

struct TransferCheck : ::testing::Test {
  TempDir dir;
  const SearchSpace space = SearchSpace::load(space_file());
  Config ref_config;

  void SetUp() override {
    make_recording(dir.file("rec.db"));
    // The reference: a finished campaign of kProblem whose rank 1 is one config of the space.
    const Problem problem = Problem::parse(kProblem);
    ref_config = space.enumerate(problem, "sm_90").at(5);
    ranked_campaign(dir.file("ref.db"), space, problem, "ref", ref_config, 100.0);
    std::ofstream(dir.file("ref.txt")) << config_str(ref_config) << "\n";
    std::ofstream f(dir.file("attntune"));
    f << "#!/bin/sh\n"
      << "if [ \"$1\" = eval ]; then\n"
      << "  config=''; while [ $# -gt 0 ]; do [ \"$1\" = --config ] && config=$2; shift; done\n"
      << "  echo \"$config\" >> " << dir.file("calls.log") << "\n"
      << "  if [ \"$config\" = \"$(cat " << dir.file("ref.txt") << ")\" ]; then t=100; else t=$(cat "
      << dir.file("other.txt") << "); fi\n"
      << "  echo \"{\\\"status\\\": \\\"ok\\\", \\\"median_us\\\": $t}\"\n"
      << "  exit 0\n"
      << "fi\n"
      << "exec " << testing::attntune_bin() << " \"$@\"\n";
    f.close();
    sh("chmod +x " + dir.file("attntune"));
  }
  // The tool over `shapes` ("NAME PROBLEM REF_DB" each), 3 evaluations, 2 rounds, every other config at
  // `other_us`.
  Shell run(const std::string& shapes, double other_us, const std::string& out) {
    std::ofstream(dir.file("other.txt")) << other_us << "\n";
    std::remove(dir.file("calls.log").c_str());
    return sh("ATTNTUNE_SHIPPED_DB= ATTNTUNE_BIN=" + dir.file("attntune") + " python3 " + testing::source_dir() +
              "/tools/transfer_check.py " + shapes + " --out " + dir.file(out) + " --evals 3 --rounds 2 " +
              "--tune-args '--space " + space_file() + " --simulate-db " + dir.file("rec.db") +
              " --simulate-campaign rec --simulate-delay-ms 0' --json " + dir.file(out + ".json") + " 2>&1");
  }
  // The short campaign's search evaluations, in order, as `eval --config` takes them.
  std::vector<std::string> campaign_configs(const std::string& db) {
    Store s = Store::open(db, Store::Mode::kReadOnly);
    std::vector<std::string> out;
    for (const EvaluationRow& e : s.campaign_evaluations(*s.find_campaign("a"))) out.push_back(config_str(e.config));
    return out;
  }
};

TEST_F(TransferCheck, TimesEachShapesEvaluationsBesideItsReferenceAndCountsToWithin2Percent) {
  const std::string shape = std::string("--shape a ") + kProblem + " " + dir.file("ref.db");
  // Every other config 1% behind the reference: the first evaluation is within 2%.
  const Shell near = run(shape, 101.0, "near");
  ASSERT_EQ(near.status, 0) << near.output;
  const auto j = nlohmann::json::parse(read(dir.file("near.json")));
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["evals_to_within"], 1);
  EXPECT_DOUBLE_EQ(j[0]["reference"]["median_us"].get<double>(), 100.0);
  ASSERT_EQ(j[0]["evaluations"].size(), 3u);
  EXPECT_NE(near.output.find("transfer: median 1 evaluations to within 2%"), std::string::npos) << near.output;
  // The calls: round 1 (the reference, then the campaign's evaluations in their order), then round 2.
  const std::vector<std::string> evaluated = campaign_configs(dir.file("near/a-t1.db"));
  ASSERT_GE(evaluated.size(), 3u);
  const std::vector<std::string> expected{config_str(ref_config), evaluated[0], evaluated[1], evaluated[2],
                                          config_str(ref_config), evaluated[0], evaluated[1], evaluated[2]};
  EXPECT_EQ(lines(read(dir.file("calls.log"))), expected);

  // 5% behind: none within 2% in 3 evaluations, counted as 4.
  const Shell far = run(shape, 105.0, "far");
  ASSERT_EQ(far.status, 0) << far.output;
  EXPECT_EQ(nlohmann::json::parse(read(dir.file("far.json")))[0]["evals_to_within"], nullptr);
  EXPECT_NE(far.output.find("transfer: median 4 evaluations"), std::string::npos) << far.output;
}

TEST_F(TransferCheck, AShapeWithoutAReferenceIsNamedAndTheRunExitsOne) {
  const std::string shapes = std::string("--shape a ") + kProblem + " " + dir.file("ref.db") + " --shape b " +
                             kProblem + " " + dir.file("missing.db");
  const Shell r = run(shapes, 101.0, "two");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find(std::string("b: no finished campaign of ") + kProblem + " in " + dir.file("missing.db")),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("transfer: median 1 evaluations to within 2% of the reference pick over 1 shapes"),
            std::string::npos)
      << r.output;
  // Two shapes of one name: refused before anything runs.
  const Shell dup = sh("python3 " + testing::source_dir() + "/tools/transfer_check.py --shape a P x --shape a P y --out " +
                       dir.file("dup") + " 2>&1");
  EXPECT_EQ(dup.status, 2) << dup.output;
}

}  // namespace
}  // namespace test_transfer_check
}  // namespace attntune::test
