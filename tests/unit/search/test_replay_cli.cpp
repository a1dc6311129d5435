// attntune replay end to end, through the binary, on a campaign written to a scratch database from a
// synthetic landscape: the JSON of docs/CONTRACT.md, the table, and exit 2 with one error line for bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "../../common/run_attntune.hpp"
#include "db/store.hpp"
#include "search/warm_start.hpp"
#include "synthetic.hpp"

namespace test_replay_cli {
using namespace attntune;
using namespace attntune::test;
using attntune::testing::run_attntune;

namespace {

namespace fs = std::filesystem;

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Records every config of `s` as one campaign (an exhaustive run), and `partial` with half of them.
void write_campaigns(const std::string& db, const Synthetic& s, const std::string& space_path) {
  Store store = Store::open(db, Store::Mode::kCreate);
  const std::int64_t dev = store.upsert_device({"NVIDIA H200", "sm_90", "GPU-1", 132, "580.1"});
  auto make = [&](const std::string& name) {
    CampaignSpec spec;
    spec.name = name;
    spec.problem = s.problem;
    spec.space_path = space_path;
    spec.space_text = read_text(space_path);
    spec.space_hash = s.space->hash();
    spec.family = s.space->family();
    spec.strategy = "exhaustive";
    return store.open_campaign(spec, dev);
  };
  const std::int64_t full = make("sweep"), partial = make("partial");
  std::size_t i = 0;
  for (const Config& c : s.space->enumerate(s.problem, s.arch)) {
    const std::int64_t cand = store.upsert_candidate(s.space->family(), c, "hash-" + config_str(c));
    const EvalRecord& r = s.results.at(config_str(c));
    store.record_evaluation(full, cand, dev, r);
    if (i++ % 2 == 0) store.record_evaluation(partial, cand, dev, r);
  }
  store.finish_campaign(full, "completed", "space exhausted");
  store.finish_campaign(partial, "stopped", "interrupted");
}

struct ReplayCli : ::testing::Test {
  static inline std::string dir, db;
  static inline Synthetic s;
  static void SetUpTestSuite() {
    dir = (fs::temp_directory_path() / ("attntune-replay-" + std::to_string(::getpid()))).string();
    fs::create_directories(dir);
    db = dir + "/replay.db";
    SyntheticOptions o;
    o.problem = "b=2,h=8,s=2048,d=256,dtype=bf16,causal=0";  // d=256: a smaller space, a quicker setup
    s = make_synthetic(o);
    write_campaigns(db, s, source_path("search_spaces/flash_fwd_mma.yaml"));
  }
  static void TearDownTestSuite() { fs::remove_all(dir); }
  std::string base() const { return "replay --db '" + db + "' "; }
};

TEST_F(ReplayCli, JsonHasTheContractFieldsAndTheRandomBaseline) {
  const auto r = run_attntune(base() + "--campaign sweep --strategy evo --seeds 31 --target-pct 2 --format json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  for (const char* key : {"strategy", "seeds", "target_pct", "space_size", "median_evals", "p90_evals",
                          "reached_fraction", "random", "speedup_vs_random", "space_fraction", "optimum_us",
                          "pipeline", "budget"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["strategy"], "evo");
  EXPECT_EQ(j["seeds"], 31);
  EXPECT_EQ(j["target_pct"], 2.0);
  EXPECT_EQ(j["space_size"], s.results.size());
  EXPECT_EQ(j["budget"], s.results.size());
  EXPECT_EQ(j["pipeline"], 8);
  EXPECT_DOUBLE_EQ(j["optimum_us"].get<double>(), s.optimum());
  EXPECT_EQ(j["evals"].size(), 31u);
  EXPECT_EQ(j["random"]["strategy"], "random");
  for (const char* key : {"median_evals", "p90_evals", "reached_fraction", "space_fraction"})
    EXPECT_TRUE(j["random"].contains(key)) << key;
  EXPECT_DOUBLE_EQ(j["speedup_vs_random"].get<double>(),
                   j["random"]["median_evals"].get<double>() / j["median_evals"].get<double>());
  EXPECT_DOUBLE_EQ(j["space_fraction"].get<double>(), j["median_evals"].get<double>() / s.results.size());
  EXPECT_LE(j["median_evals"].get<double>(), j["p90_evals"].get<double>());
  // Reproducible: the same command prints the same document.
  EXPECT_EQ(run_attntune(base() + "--campaign sweep --strategy evo --seeds 31 --target-pct 2 --format json").out, r.out);
}

TEST_F(ReplayCli, TableComparesWithRandom) {
  const auto r = run_attntune(base() + "--campaign sweep --strategy exhaustive --seeds 3 --budget 20");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("campaign 'sweep'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("exhaustive"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("random"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("speedup"), std::string::npos) << r.out;
}

TEST_F(ReplayCli, PartialCampaignNeedsTheFlag) {
  auto r = run_attntune(base() + "--campaign partial --strategy random --seeds 3");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("attntune: error: replay: the campaign recorded"), std::string::npos) << r.err;
  r = run_attntune(base() + "--campaign partial --strategy evo --seeds 3 --partial --format json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["recorded"], (s.results.size() + 1) / 2);
}

TEST_F(ReplayCli, BadInputExitsTwoWithOneErrorLine) {
  for (const std::string args :
       {"--campaign nope --strategy evo", "--campaign sweep --strategy annealing", "--campaign sweep --seeds 0",
        "--campaign sweep --seeds abc", "--campaign sweep --target-pct -1", "--campaign sweep --target-pct x",
        "--campaign sweep --pipeline 0", "--campaign sweep --budget -5", "--campaign sweep --format csv",
        "--strategy evo", "--campaign sweep --warm-from sweep", "--campaign sweep --warm-from ghost"}) {
    const auto r = run_attntune(base() + args);
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.out << r.err;
    EXPECT_EQ(r.err.rfind("attntune: error: ", 0), 0u) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
  const auto missing = run_attntune("replay --db '" + dir + "/missing.db' --campaign sweep");
  EXPECT_EQ(missing.rc, 2) << missing.err;
}

TEST_F(ReplayCli, HelpStatesTheRules) {
  const auto r = run_attntune("replay --help");
  ASSERT_EQ(r.rc, 0);
  for (const char* text : {"--pipeline", "--target-pct", "budget + 1", "--partial", "--warm-from", "random"})
    EXPECT_NE(r.out.find(text), std::string::npos) << text;
}

TEST_F(ReplayCli, WarmFromAnotherCampaign) {
  const auto r = run_attntune(base() + "--campaign sweep --warm-from partial --seeds 5 --format json");
  ASSERT_EQ(r.rc, 0) << r.err;
  // As many as tune takes (search/warm_start.hpp).
  EXPECT_EQ(nlohmann::json::parse(r.out)["warm_start"], search::kWarmStartConfigs);
}

}  // namespace
}  // namespace test_replay_cli
