// The campaign tells its runner when the final ranking starts (Runner::begin_final_timing), so
// GpuRunner can time the finalists longer than search candidates: every submit after the call is
// a re-timing of the ranking, every one before it a search candidate.
#include <gtest/gtest.h>

#include <sstream>

#include "search/campaign.hpp"
#include "search/recorded.hpp"
#include "search/simulated_runner.hpp"
#include "tune_test_util.hpp"

namespace attntune::test {
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
    ++(final_ ? final_submits : search_submits);
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
  int search_submits = 0, final_submits = 0, begins = 0;

 private:
  search::SimulatedRunner inner_;
  bool final_ = false;
};

TEST(FinalTiming, TheRunnerHearsWhenTheFinalRankingStarts) {
  TempDir dir;
  const std::string rec_path = dir.file("rec.db");
  make_recording(rec_path);
  Store rec_store = Store::open(rec_path, Store::Mode::kReadOnly);
  const search::RecordedCampaign rec = search::RecordedCampaign::load(rec_store, "rec");
  const SearchSpace space = SearchSpace::load(space_file());

  Store store = Store::open(dir.file("work.db"), Store::Mode::kCreate);
  CampaignSpec spec;
  spec.name = "k";
  spec.problem = Problem::parse(kProblem);
  spec.space_path = space.path();
  spec.space_hash = space.hash();
  spec.space_text = space.text();
  spec.family = space.family();
  spec.strategy = "evo";
  spec.budget_evals = 20;
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
  EXPECT_EQ(runner.final_submits, 3 * 2);
  EXPECT_EQ(r.ranking.size(), 3u);
  // A line a round, naming the leader so far.
  EXPECT_NE(log.str().find("re-timing round 1/2 done; leading: "), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("re-timing round 2/2 done; leading: "), std::string::npos) << log.str();
}

}  // namespace
}  // namespace attntune::test
