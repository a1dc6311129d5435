// The campaign tells its runner when the final ranking starts (Runner::begin_final_timing), so
// GpuRunner can time the finalists longer than search candidates: every submit after the call is
// a re-timing of the ranking, every one before it a search candidate.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <sstream>

#include "search/campaign.hpp"
#include "search/recorded.hpp"
#include "search/simulated_runner.hpp"
#include "search/synthetic_runner.hpp"
#include "tune_test_util.hpp"

namespace attntune::test {
namespace test_final_timing {
namespace {

using namespace std::chrono_literals;

// Answers from a recording and counts the submits on either side of begin_final_timing.
class SpyRunner : public search::Runner {
 public:
  explicit SpyRunner(const search::RecordedCampaign& rec) : inner_(rec, 0ms, 4, nullptr) {}
  const DeviceInfo& device() override { return inner_.device(); }
  std::size_t capacity() const override { return inner_.capacity(); }
  std::size_t outstanding() const override { return inner_.outstanding(); }
  void submit(const Config& c) override {
    ++(final_ ? final_submits : screening_ ? screen_submits : search_submits);
    if (final_) {
      EXPECT_EQ(inner_.outstanding(), 0u) << "a search candidate still in flight at the final ranking";
    }
    inner_.submit(c);
  }
  std::optional<search::RunResult> next() override { return inner_.next(); }
  void begin_final_timing() override {
    ++begins;
    final_ = true;
  }
  void begin_screen_timing() override { screening_ = true; }
  int search_submits = 0, screen_submits = 0, final_submits = 0, begins = 0;

 private:
  search::SimulatedRunner inner_;
  bool final_ = false, screening_ = false;
};

TEST(FinalTiming, TheRunnerHearsWhenTheFinalRankingStarts) {
  TempDir dir;
  const std::string rec_path = dir.file("rec.db");
  make_recording(rec_path);
  Store rec_store = Store::open(rec_path, Store::Mode::kReadOnly);
  const search::RecordedCampaign rec = search::RecordedCampaign::load(rec_store, "rec");
  const SearchSpace space = SearchSpace::load(space_file());

  Store store = Store::open(dir.file("work.db"), Store::Mode::kCreate);
  const CampaignSpec spec = campaign_spec(space, Problem::parse(kProblem), "k", "evo", 20);
  search::TuneOptions to;
  to.budget_evals = 20;
  to.final_top = 3;
  to.final_rounds = 2;
  std::ostringstream log;
  search::Progress progress(log, false, 60s);
  SpyRunner runner(rec);
  const search::TuneResult r = search::run_campaign(store, runner, space, spec, to, progress, {});
  ASSERT_EQ(r.status, "completed") << r.stop_reason;
  EXPECT_EQ(runner.begins, 1);
  EXPECT_EQ(runner.search_submits, 20);
  // The screening (to.final_screen's default, 24): one re-timing of each distinct ok config, more
  // than the 3 finalists; then the 3 in 2 rounds.
  EXPECT_GT(runner.screen_submits, 3);
  EXPECT_LE(runner.screen_submits, 20);
  EXPECT_EQ(runner.final_submits, 3 * 2);
  EXPECT_EQ(r.ranking.size(), 3u);
  // A line a round, naming the leader so far.
  EXPECT_NE(log.str().find("re-timing round 1/2 done; leading: "), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("re-timing round 2/2 done; leading: "), std::string::npos) << log.str();
}


// Search timings that read fast by a different amount for each config (as ~20 ms timings do after
// the clock's idle boosts: 4-13% in run 243), and screening and final re-timings that read each
// config's true time. Counts what it times in each phase.
class NoisySearchRunner : public search::Runner {
 public:
  NoisySearchRunner(const SearchSpace& space, const Problem& problem, double noise)
      : inner_({&space}, problem, 0, 0ms, nullptr), noise_(noise) {}
  const DeviceInfo& device() override { return inner_.device(); }
  std::size_t capacity() const override { return inner_.capacity(); }
  std::size_t outstanding() const override { return inner_.outstanding(); }
  void submit(const Config& c) override {
    ++submits[phase_];
    inner_.submit(c);
  }
  std::optional<search::RunResult> next() override {
    std::optional<search::RunResult> r = inner_.next();
    if (r && r->record.status == "ok") {
      const std::string key = config_str(r->config);
      true_us[key] = *r->record.median_us;
      if (phase_ == 0) {
        const double u = double(std::hash<std::string>{}("noise|" + key) % 1000) / 1000;
        r->record.median_us = *r->record.median_us * (1 - noise_ * u);
        search_us[key] = *r->record.median_us;
      }
    }
    return r;
  }
  void begin_screen_timing() override {
    EXPECT_EQ(phase_, 0) << "the screening starts after the search, before the rounds";
    phase_ = 1;
  }
  void begin_final_timing() override { phase_ = 2; }
  std::map<std::string, double> true_us, search_us;  // each ok config's true time, its search reading
  int submits[3] = {0, 0, 0};              // search, screening, rounds

 private:
  search::SyntheticRunner inner_;
  double noise_;
  int phase_ = 0;
};

// The screening (TuneOptions::final_screen) re-times the fastest 24 by search time once each and
// takes the final_top fastest of those to the rounds, so a campaign picks its true best even when
// noisy search timings rank it past the final_top; without it, the rounds never see that config.
TEST(FinalTiming, TheScreeningFindsTheBestThatSearchTimingsRankPastTheTop) {
  TempDir dir;
  const SearchSpace space = SearchSpace::load(space_file());
  const Problem problem = Problem::parse(kProblem);
  int db_count = 0;
  auto run = [&](int final_screen, std::uint64_t seed, NoisySearchRunner& runner, std::string& log_text) {
    Store store = Store::open(dir.file("screen" + std::to_string(db_count++) + ".db"), Store::Mode::kCreate);
    const CampaignSpec spec = campaign_spec(space, problem, "k", "random", 60);
    search::TuneOptions to;
    to.strategy = "random";
    to.seed = seed;
    to.budget_evals = 60;
    to.final_top = 3;
    to.final_rounds = 2;
    to.final_screen = final_screen;
    std::ostringstream log;
    search::Progress progress(log, false, 60s);
    const search::TuneResult r = search::run_campaign(store, runner, space, spec, to, progress, {});
    log_text = log.str();
    EXPECT_EQ(r.status, "completed") << r.stop_reason;
    return r;
  };
  // The scenario: the first seed whose search reads the true best (the least true time among the
  // configs it timed) past the 3 finalists, and within the 24 screened.
  std::unique_ptr<NoisySearchRunner> screened;
  search::TuneResult r;
  std::string log, truth;
  std::uint64_t seed = 0;
  int search_rank = 0;
  while (++seed <= 20 && !(search_rank > 3 && search_rank <= 24)) {
    screened = std::make_unique<NoisySearchRunner>(space, problem, 0.3);
    r = run(24, seed, *screened, log);
    ASSERT_GT(screened->true_us.size(), 24u);
    truth.clear();
    for (const auto& [key, us] : screened->true_us)
      if (truth.empty() || us < screened->true_us.at(truth)) truth = key;
    search_rank = 1;
    for (const auto& [key, us] : screened->search_us) search_rank += us < screened->search_us.at(truth);
  }
  ASSERT_TRUE(search_rank > 3 && search_rank <= 24) << "no seed of 20 puts the true best past the finalists";
  --seed;
  ASSERT_FALSE(r.ranking.empty());
  EXPECT_EQ(config_str(r.ranking[0].config), truth) << log;
  EXPECT_EQ(screened->submits[0], 60);
  EXPECT_EQ(screened->submits[1], 24);     // one re-timing of each of the 24
  EXPECT_EQ(screened->submits[2], 3 * 2);  // the 3 it kept, 2 rounds
  EXPECT_NE(log.find("screening the top 24 by search time"), std::string::npos) << log;
  EXPECT_NE(log.find("screening kept 3 of 24 (their search ranks: "), std::string::npos) << log;

  // The same campaign without a screening: the true best ranked past the top 3 by search time, so
  // the rounds never timed it and the pick is another config.
  NoisySearchRunner plain(space, problem, 0.3);
  const search::TuneResult q = run(0, seed, plain, log);
  EXPECT_EQ(plain.submits[1], 0);
  EXPECT_EQ(plain.submits[2], 3 * 2);
  ASSERT_FALSE(q.ranking.empty());
  EXPECT_NE(config_str(q.ranking[0].config), truth) << log;
}

}  // namespace
}  // namespace test_final_timing
}  // namespace attntune::test
