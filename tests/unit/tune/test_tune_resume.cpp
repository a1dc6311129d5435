// tune against a simulated evaluator (a recorded campaign answering after a delay): killed with
// SIGKILL at random moments and resumed, nothing committed is lost and nothing is evaluated twice;
// Ctrl-C stops cleanly; the end re-times the top candidates and ranks them.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "search/warm_start.hpp"
#include "tune_test_util.hpp"

namespace attntune::test {
namespace test_tune_resume {
namespace {

using namespace std::chrono_literals;

class TuneResume : public ::testing::Test {
 protected:
  void SetUp() override { make_recording(rec); }
  std::vector<std::string> args(int budget, const std::string& strategy = "evo") const {
    return {"tune", "--space", space_file(), "--problem", kProblem, "--db", work, "--campaign", "k",
            "--simulate-db", rec, "--simulate-campaign", "rec", "--simulate-delay-ms", "10", "--budget-evals",
            std::to_string(budget), "--strategy", strategy, "--patience", "0", "--log-interval", "1"};
  }
  std::string log() const { return read_bytes(log_path); }
  // The committed search evaluations: seq -> (config, status).
  std::map<std::int64_t, std::pair<std::string, std::string>> committed() const {
    std::map<std::int64_t, std::pair<std::string, std::string>> out;
    if (!fs::exists(work)) return out;
    Store s = Store::open(work, Store::Mode::kReadOnly);
    auto id = s.find_campaign("k");
    if (!id) return out;
    for (const EvaluationRow& e : s.campaign_evaluations(*id))
      out[e.seq] = {config_str(e.config), e.record.status};
    return out;
  }
  TempDir dir;
  std::string rec = dir.file("rec.db"), work = dir.file("work.db"), log_path = dir.file("tune.log");
};

TEST_F(TuneResume, RandomKillsLoseNothingCommittedAndEvaluateNothingTwice) {
  const int budget = 150;
  std::mt19937 rng(20261122);
  std::map<std::int64_t, std::pair<std::string, std::string>> seen_before;
  int kills = 0;
  for (; kills < 12; ++kills) {
    TuneProcess p(args(budget), log_path);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(30, 400)(rng)));
    p.signal(SIGKILL);
    const int rc = p.wait();
    const auto now = committed();
    // Near the end of the budget the run can finish before the kill lands: then it must be complete.
    if (rc == 0)
      ASSERT_EQ(static_cast<int>(now.size()), budget) << log();
    else
      ASSERT_EQ(rc, 128 + SIGKILL) << log();
    for (const auto& [seq, row] : seen_before) {
      auto it = now.find(seq);
      ASSERT_NE(it, now.end()) << "evaluation #" << seq << " was committed, then lost after kill " << kills;
      EXPECT_EQ(it->second, row) << "evaluation #" << seq << " changed";
    }
    seen_before = now;
    if (static_cast<int>(now.size()) >= budget) break;
  }
  EXPECT_GE(kills, 3) << "the kills came too late to test anything";

  TuneProcess last(args(budget), log_path);
  ASSERT_EQ(last.wait(), 0) << log();
  const auto rows = committed();
  EXPECT_EQ(static_cast<int>(rows.size()), budget) << "the budget counts every evaluation of the campaign";
  std::set<std::string> configs;
  for (const auto& [seq, row] : rows) EXPECT_TRUE(configs.insert(row.first).second) << "evaluated twice: " << row.first;
  for (const auto& [seq, row] : seen_before) EXPECT_EQ(rows.at(seq), row);
  // Numbered without gaps: a killed transaction leaves no hole and no half row.
  std::int64_t expect = 1;
  for (const auto& [seq, row] : rows) EXPECT_EQ(seq, expect++);

  Store s = Store::open(work, Store::Mode::kReadOnly);
  const auto c = s.campaign_row("k");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, "completed");
  EXPECT_EQ(c->stop_reason, "budget: 150 evaluations");
  EXPECT_EQ(c->spec.space_text, SearchSpace::load(space_file()).text());
  EXPECT_FALSE(s.ranking(c->id).empty());
  EXPECT_NE(log().find("resuming campaign 'k'"), std::string::npos) << log();
}

TEST_F(TuneResume, CtrlCFinishesTheCandidateAndResumes) {
  TuneProcess p(args(400), log_path);
  std::this_thread::sleep_for(300ms);
  p.signal(SIGINT);
  EXPECT_EQ(p.wait(), 130) << log();
  EXPECT_NE(log().find("stopping after the candidate in flight"), std::string::npos) << log();
  EXPECT_NE(log().find("resume with the same command"), std::string::npos) << log();
  const auto before = committed();
  ASSERT_FALSE(before.empty());
  {
    Store s = Store::open(work, Store::Mode::kReadOnly);
    const auto c = s.campaign_row("k");
    EXPECT_EQ(c->status, "stopped");
    EXPECT_EQ(c->stop_reason, "interrupted");
    EXPECT_TRUE(s.ranking(c->id).empty()) << "an interrupted campaign is not ranked";
  }
  TuneProcess again(args(static_cast<int>(before.size()) + 20), log_path);
  EXPECT_EQ(again.wait(), 0) << log();
  const auto after = committed();
  EXPECT_EQ(after.size(), before.size() + 20);
  for (const auto& [seq, row] : before) EXPECT_EQ(after.at(seq), row);
}

TEST_F(TuneResume, ExhaustiveCoversTheSpaceAndRanksTheTop) {
  TuneProcess p({"tune", "--space", space_file(), "--problem", kProblem, "--db", work, "--campaign", "k",
                 "--simulate-db", rec, "--simulate-campaign", "rec", "--strategy", "exhaustive", "--format", "json"},
                log_path);
  ASSERT_EQ(p.wait(), 0) << log();
  const SearchSpace space = SearchSpace::load(space_file());
  const auto rows = committed();
  EXPECT_EQ(rows.size(), space.count(Problem::parse(kProblem), "sm_90"));
  const nlohmann::json j = nlohmann::json::parse(log().substr(log().find("{\n")));
  EXPECT_EQ(j["status"], "completed");
  EXPECT_EQ(j["stop_reason"].get<std::string>().rfind("space exhausted", 0), 0u) << j.dump();
  ASSERT_EQ(j["ranking"].size(), 8u);  // the default --final-top
  // The recorded optimum is the ranking's first (the simulated re-timing answers the same times).
  Store r = Store::open(rec, Store::Mode::kReadOnly);
  BestQuery q;
  q.campaign = "rec";
  EXPECT_EQ(j["ranking"][0]["median_us"].get<double>(), r.best(q).at(0).median_us);
  // best answers with the ranking.
  Store s = Store::open(work, Store::Mode::kReadOnly);
  q.campaign = "k";
  q.top = 7;
  const auto best = s.best(q);
  ASSERT_EQ(best.size(), 7u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(config_json(best[i].config), j["ranking"][i]["config"]);
  // Re-running a finished campaign evaluates nothing more.
  TuneProcess again({"tune", "--space", space_file(), "--problem", kProblem, "--db", work, "--campaign", "k",
                     "--simulate-db", rec, "--simulate-campaign", "rec", "--strategy", "exhaustive"},
                    log_path);
  EXPECT_EQ(again.wait(), 0) << log();
  EXPECT_EQ(committed().size(), rows.size());
}

// A new campaign starts from the best configs of the nearest problem tuned before (here the same
// problem, another campaign): its first evaluations are exactly search::warm_start_configs' answer.
TEST_F(TuneResume, ANewCampaignStartsFromTheBestOfTheNearestTunedProblem) {
  auto run = [&](const std::string& campaign, const std::string& strategy, int budget, const std::string& warm) {
    TuneProcess p({"tune", "--space", space_file(), "--problem", kProblem, "--db", work, "--campaign", campaign,
                   "--simulate-db", rec, "--simulate-campaign", "rec", "--simulate-delay-ms", "2", "--budget-evals",
                   std::to_string(budget), "--strategy", strategy, "--warm-start", warm, "--log-interval", "1"},
                  log_path);
    return p.wait();
  };
  ASSERT_EQ(run("first", "random", 40, "8"), 0) << log();
  EXPECT_EQ(log().find("warm start:"), std::string::npos) << "nothing was tuned before the first campaign";
  std::set<std::string> expected;
  {
    Store s = Store::open(work, Store::Mode::kReadOnly);
    BestQuery q;
    q.problem = Problem::parse(kProblem);
    for (const Config& c : search::warm_start_configs(s, q, "flash_fwd_mma")) expected.insert(config_str(c));
  }
  ASSERT_EQ(expected.size(), search::kWarmStartConfigs);
  ASSERT_EQ(run("second", "evo", 12, "8"), 0) << log();
  EXPECT_NE(log().find("warm start: 8 configs from b=4,h=16"), std::string::npos) << log();
  std::set<std::string> first8;
  {
    Store s = Store::open(work, Store::Mode::kReadOnly);
    for (const EvaluationRow& e : s.campaign_evaluations(*s.find_campaign("second")))
      if (e.seq <= 8) first8.insert(config_str(e.config));
  }
  EXPECT_EQ(first8, expected);
  // --warm-start 0: none.
  fs::remove(log_path);
  ASSERT_EQ(run("third", "evo", 4, "0"), 0) << log();
  EXPECT_EQ(log().find("warm start:"), std::string::npos) << log();
}

// A paged problem (page=N) and the dense problem of the same shape never warm-start each other: a
// dense campaign starts from the nearest dense problem, even when a paged one of its very shape has
// results.
TEST_F(TuneResume, APagedProblemDoesNotWarmStartADenseOne) {
  const SearchSpace space = SearchSpace::load(space_file());
  const std::vector<Config> configs = space.enumerate(Problem::parse(kProblem), "sm_90");
  ASSERT_GE(configs.size(), 8u);
  auto tuned = [&](const std::string& db, const std::string& name, const Problem& p) {
    Store s = Store::open(db, Store::Mode::kCreate);
    const std::int64_t dev = s.upsert_device({"NVIDIA H200", "sm_90", "GPU-rec", 132, "580"});
    const std::int64_t c = s.open_campaign(campaign_spec(space, p, name, "evo"), dev);
    for (std::size_t i = 0; i < 8; ++i)
      s.record_evaluation(c, s.upsert_candidate(space.family(), configs[i], "src" + std::to_string(i)), dev,
                          recorded_ok(500.0 + double(i), p));
    s.finish_campaign(c, "completed", "budget");
  };
  auto run = [&](const std::string& db) {
    TuneProcess p({"tune", "--space", space_file(), "--problem", kProblem, "--db", db, "--campaign", "dense",
                   "--simulate-db", rec, "--simulate-campaign", "rec", "--budget-evals", "4", "--warm-start", "8",
                   "--final-top", "0", "--log-interval", "1"},
                  log_path);
    return p.wait();
  };
  const Problem paged = Problem::parse(std::string(kProblem) + ",page=16");
  tuned(work, "paged", paged);
  ASSERT_EQ(run(work), 0) << log();
  EXPECT_EQ(log().find("warm start:"), std::string::npos) << log();

  const std::string other = dir.file("other.db");
  tuned(other, "paged", paged);
  tuned(other, "dense-s2048", Problem::parse("b=4,h=16,s=2048,d=128,dtype=bf16,causal=0"));
  fs::remove(log_path);
  ASSERT_EQ(run(other), 0) << log();
  EXPECT_NE(log().find("warm start: 8 configs from b=4,h=16,hkv=16,s=2048,sk=2048,d=128,dtype=bf16,causal=0\n"),
            std::string::npos)
      << log();
}

// A --max-seconds under the final re-timing's default minimum (1 s) caps that minimum; only a
// --final-min-seconds given above --max-seconds is refused.
TEST_F(TuneResume, ASmallMaxSecondsCapsTheFinalMinimum) {
  std::vector<std::string> a = args(6);
  a.insert(a.end(), {"--max-seconds", "0.2", "--final-top", "2", "--final-rounds", "1"});
  TuneProcess ok(a, log_path);
  ASSERT_EQ(ok.wait(), 0) << log();
  a.insert(a.end(), {"--final-min-seconds", "0.5"});
  TuneProcess refused(a, log_path);
  EXPECT_EQ(refused.wait(), 2) << log();
  EXPECT_NE(log().find("--final-min-seconds (0.5)"), std::string::npos) << log();
}

TEST_F(TuneResume, BadArgumentsAreOneClearLineAndCreateNothing) {
  for (const std::string bad : {"--budget-time 5x", "--strategy annealing", "--budget-evals -3", "--final-rounds 0",
                                "--simulate-db x.db", "--min-seconds 2", "--final-min-seconds -1",
                                "--seed -1", "--seed -9223372036854775807"}) {
    auto r = testing::run_attntune("tune --space " + space_file() + " --problem " + kProblem + " --db " + work + " " +
                                   bad);
    EXPECT_EQ(r.rc, 2) << bad << ": " << r.err;
    EXPECT_EQ(r.err.rfind("attntune: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(work)) << bad;
  }
}

}  // namespace
}  // namespace test_tune_resume
}  // namespace attntune::test
