// The campaign loop needs of a database only the CampaignLog (core/record_stores.hpp): run against
// a log held in memory it records, resumes, ranks and fails exactly as it does against the Store.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <stdexcept>

#include "core/record_stores.hpp"
#include "search/campaign.hpp"
#include "search/recorded.hpp"
#include "search/simulated_runner.hpp"
#include "tune_test_util.hpp"

namespace attntune::test {
namespace test_campaign_log {
namespace {

using namespace std::chrono_literals;

// A CampaignLog in memory: ids are positions + 1, as SQLite's rowids come.
class MemoryLog : public CampaignLog {
 public:
  struct Candidate {
    std::string family;
    Config config;
    std::string source_hash;
  };
  struct Evaluation {
    std::int64_t campaign_id, candidate_id, device_id;
    EvalRecord record;
    Phase phase;
  };
  struct Campaign {
    CampaignSpec spec;
    std::int64_t device_id = 0;
    std::string status, stop_reason;
    std::vector<RankingEntry> ranking;
  };

  std::int64_t upsert_device(const DeviceInfo& d) override {
    for (std::size_t i = 0; i < devices.size(); ++i)
      if (devices[i].name == d.name && devices[i].arch == d.arch && devices[i].uuid == d.uuid)
        return static_cast<std::int64_t>(i + 1);
    devices.push_back(d);
    return static_cast<std::int64_t>(devices.size());
  }
  std::int64_t open_campaign(const CampaignSpec& spec, std::int64_t device_id) override {
    for (std::size_t i = 0; i < campaigns.size(); ++i) {
      Campaign& c = campaigns[i];
      if (c.spec.name != spec.name) continue;
      if (c.spec.problem != spec.problem || c.spec.family != spec.family || c.spec.space_hash != spec.space_hash)
        throw InputError("campaign '" + spec.name + "' cannot be resumed");
      c.status = "running";
      c.device_id = device_id;
      return static_cast<std::int64_t>(i + 1);
    }
    campaigns.push_back({spec, device_id, "running", "", {}});
    return static_cast<std::int64_t>(campaigns.size());
  }
  void finish_campaign(std::int64_t id, const std::string& status, const std::string& stop_reason) override {
    campaigns.at(static_cast<std::size_t>(id - 1)).status = status;
    campaigns.at(static_cast<std::size_t>(id - 1)).stop_reason = stop_reason;
  }
  std::int64_t upsert_candidate(const std::string& family, const Config& config,
                                const std::string& source_hash) override {
    for (std::size_t i = 0; i < candidates.size(); ++i)
      if (candidates[i].family == family && candidates[i].config == config && candidates[i].source_hash == source_hash)
        return static_cast<std::int64_t>(i + 1);
    candidates.push_back({family, config, source_hash});
    return static_cast<std::int64_t>(candidates.size());
  }
  std::int64_t record_evaluation(std::int64_t campaign_id, std::int64_t candidate_id, std::int64_t device_id,
                                 const EvalRecord& eval, Phase phase) override {
    evaluations.push_back({campaign_id, candidate_id, device_id, eval, phase});
    return static_cast<std::int64_t>(evaluations.size());
  }
  std::vector<EvaluationRow> campaign_evaluations(std::int64_t campaign_id) override {
    std::vector<EvaluationRow> out;
    std::int64_t seq = 0;
    for (const Evaluation& e : evaluations) {
      if (e.campaign_id != campaign_id) continue;
      ++seq;
      if (e.phase != Phase::kSearch) continue;
      const Candidate& c = candidates.at(static_cast<std::size_t>(e.candidate_id - 1));
      out.push_back({seq, c.config, e.record, "", c.family});
    }
    return out;
  }
  void put_ranking(std::int64_t campaign_id, std::int64_t device_id,
                   const std::vector<RankingEntry>& entries) override {
    std::vector<RankingEntry>& r = campaigns.at(static_cast<std::size_t>(campaign_id - 1)).ranking;
    r = entries;
    for (RankingEntry& e : r)
      if (!e.device_id) e.device_id = device_id;
  }
  std::vector<RankedRow> ranking(std::int64_t campaign_id) override {
    std::vector<RankedRow> out;
    for (const RankingEntry& e : campaigns.at(static_cast<std::size_t>(campaign_id - 1)).ranking) {
      const Candidate& c = candidates.at(static_cast<std::size_t>(e.candidate_id - 1));
      out.push_back({static_cast<int>(out.size()) + 1, c.config, e, c.family});
    }
    return out;
  }

  std::vector<DeviceInfo> devices;
  std::vector<Campaign> campaigns;
  std::vector<Candidate> candidates;
  std::vector<Evaluation> evaluations;
};

// Fails the `n`th evaluation it is asked to record.
class FailingLog : public MemoryLog {
 public:
  explicit FailingLog(int n) : n_(n) {}
  std::int64_t record_evaluation(std::int64_t campaign_id, std::int64_t candidate_id, std::int64_t device_id,
                                 const EvalRecord& eval, Phase phase) override {
    if (--n_ == 0) throw std::runtime_error("disk on fire\nsecond line");
    return MemoryLog::record_evaluation(campaign_id, candidate_id, device_id, eval, phase);
  }

 private:
  int n_;
};

struct CampaignLogTest : ::testing::Test {
  void SetUp() override {
    make_recording(rec_path);
    rec_store.emplace(Store::open(rec_path, Store::Mode::kReadOnly));
    rec.emplace(search::RecordedCampaign::load(*rec_store, "rec"));
  }

  search::TuneResult run(CampaignLog& log, std::int64_t budget) {
    CampaignSpec spec = campaign_spec(space, Problem::parse(kProblem), "k", "evo", budget);
    spec.seed = 3;
    search::TuneOptions to;
    to.seed = 3;
    to.budget_evals = budget;
    to.final_top = 3;
    to.final_rounds = 2;
    search::Progress progress(out, false, 60s);
    search::SimulatedRunner runner(*rec, 0ms, 4, nullptr);
    return search::run_campaign(log, runner, space, spec, to, progress, {});
  }

  TempDir dir;
  std::string rec_path = dir.file("rec.db");
  std::optional<Store> rec_store;
  std::optional<search::RecordedCampaign> rec;
  const SearchSpace space = SearchSpace::load(space_file());
  std::ostringstream out;
};

// (seq, template, config, status) of each search evaluation.
std::vector<std::string> trail(const std::vector<EvaluationRow>& rows) {
  std::vector<std::string> out;
  for (const EvaluationRow& e : rows)
    out.push_back(fmt::format("{} {} {} {}", e.seq, e.family, config_str(e.config), e.record.status));
  return out;
}

std::vector<std::string> ranks(const std::vector<RankedRow>& rows) {
  std::vector<std::string> out;
  for (const RankedRow& r : rows)
    out.push_back(fmt::format("{} {} {} {} {} dev{}", r.rank, r.family, config_str(r.config), r.entry.median_us,
                              r.entry.rounds, r.entry.device_id));
  return out;
}

TEST_F(CampaignLogTest, AMemoryLogRecordsWhatTheStoreRecords) {
  MemoryLog memory;
  const search::TuneResult m = run(memory, 16);
  Store store = Store::open(dir.file("work.db"), Store::Mode::kCreate);
  const search::TuneResult s = run(store, 16);

  ASSERT_EQ(m.status, "completed") << m.stop_reason;
  EXPECT_EQ(m.status, s.status);
  EXPECT_EQ(m.stop_reason, s.stop_reason);
  EXPECT_EQ(m.evaluations, 16);
  EXPECT_EQ(m.evaluations, s.evaluations);
  EXPECT_EQ(m.ok, s.ok);
  EXPECT_EQ(ranks(m.ranking), ranks(s.ranking));
  EXPECT_EQ(m.ranking.size(), 3u);

  const std::int64_t id = *store.find_campaign("k");
  EXPECT_EQ(trail(memory.campaign_evaluations(1)), trail(store.campaign_evaluations(id)));
  EXPECT_EQ(ranks(memory.ranking(1)), ranks(store.ranking(id)));
  // The final re-timing: 3 finalists x 2 rounds, recorded as such, not as search evaluations.
  const auto finals = std::count_if(memory.evaluations.begin(), memory.evaluations.end(),
                                    [](const MemoryLog::Evaluation& e) { return e.phase == Phase::kFinal; });
  EXPECT_EQ(finals, 3 * 2);
  EXPECT_EQ(memory.campaigns.at(0).status, "completed");
  EXPECT_EQ(memory.campaigns.at(0).stop_reason, "budget: 16 evaluations");
  EXPECT_EQ(store.campaign_row("k")->status, "completed");
  ASSERT_EQ(memory.devices.size(), 1u);
  EXPECT_EQ(memory.devices[0].arch, rec->arch);
}

TEST_F(CampaignLogTest, AResumeReadsTheLogAndEvaluatesNothingTwice) {
  MemoryLog memory;
  ASSERT_EQ(run(memory, 10).evaluations, 10);
  const search::TuneResult again = run(memory, 24);
  EXPECT_EQ(again.evaluations, 24);
  EXPECT_EQ(again.this_run, 14);
  EXPECT_NE(out.str().find("resuming campaign 'k': 10 evaluations recorded"), std::string::npos) << out.str();
  ASSERT_EQ(memory.campaigns.size(), 1u);
  std::set<std::string> configs;
  for (const EvaluationRow& e : memory.campaign_evaluations(1))
    EXPECT_TRUE(configs.insert(config_str(e.config)).second) << "evaluated twice: " << config_str(e.config);
  EXPECT_EQ(configs.size(), 24u);
}

TEST_F(CampaignLogTest, AFailureToRecordMarksTheCampaignFailed) {
  FailingLog log(5);
  EXPECT_THROW(run(log, 16), std::runtime_error);
  ASSERT_EQ(log.campaigns.size(), 1u);
  EXPECT_EQ(log.campaigns[0].status, "failed");
  EXPECT_EQ(log.campaigns[0].stop_reason, "disk on fire; second line");
  EXPECT_EQ(log.evaluations.size(), 4u);
}

}  // namespace
}  // namespace test_campaign_log
}  // namespace attntune::test
