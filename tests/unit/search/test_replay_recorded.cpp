// Issue 5's measure on a real landscape: tests/data/campaigns/h100-exhaustive-d128.db holds every
// valid flash_fwd_mma config (564) of b=4,h=16,s=4096,d=128 bf16 non-causal timed on an H100.
// Replayed with 8 proposals in flight, how many evaluations evo and random search need to come
// within 2% of the optimum (median), over seeds 1..300: random's median over 30 seeds swings by
// about 2x from one block of seeds to the next, so a 30-seed median proves little either way.
//
// The issue asks for 3x fewer than random at 2%; over 300 seeds evo does ~1.6x (and 3.7x on the
// lucky block 1..30). Only 8-15 configs lie within 2%, and evo's first dozen proposals are blind.
// This test holds what evo does achieve, so a regression shows: at least 1.4x fewer evaluations
// than random, within 8% of the space, every seed reaching the target.
#include <gtest/gtest.h>

#include <filesystem>

#include <fmt/format.h>

#include "db/store.hpp"
#include "search/recorded.hpp"
#include "search/replay.hpp"
#include "synthetic.hpp"

using namespace attntune;
using namespace attntune::search;

namespace {

struct Figures {
  ReplaySummary summary;
  ReplayStats evo, random;
};

Figures replay_both(const Landscape& landscape, double target_pct, int seeds, std::uint64_t first_seed) {
  ReplayOptions o;
  o.seeds = seeds;
  o.seed = first_seed;
  o.target_pct = target_pct;
  o.strategy = "evo";
  Figures f{summarize(landscape, o), replay(landscape, o), {}};
  o.strategy = "random";
  f.random = replay(landscape, o);
  return f;
}

void check_recorded(const std::string& relative) {
  const std::string path = test::source_path(relative);
  ASSERT_TRUE(std::filesystem::exists(path))
      << path << " is missing: the recorded exhaustive campaign this test replays (issue 5) must be "
      << "committed there (attntune tune --strategy exhaustive on the GPU machine, then copy the database)";
  Store store = Store::open(path, Store::Mode::kReadOnly);
  std::optional<CampaignRow> sweep;  // the campaign with the most evaluations
  for (const CampaignRow& c : store.campaigns())
    if (!sweep || c.evaluations > sweep->evaluations) sweep = c;
  ASSERT_TRUE(sweep) << path << " holds no campaign";
  const RecordedCampaign campaign = RecordedCampaign::load(store, sweep->spec.name);
  const Landscape landscape = landscape_of(campaign);

  auto line = [&](const Figures& f, double target, const char* seeds) {
    std::cout << fmt::format(
        "[ recorded ] {} ({} configs, optimum {:.1f} us), within {}%, seeds {}: evo median {} p90 {} ({:.1f}% of "
        "the space, reached {:.0f}%), random median {} p90 {}: {:.2f}x fewer\n",
        campaign.name, f.summary.space_size, f.summary.optimum_us, target, seeds, f.evo.median_evals,
        f.evo.p90_evals, 100 * f.evo.space_fraction, 100 * f.evo.reached_fraction, f.random.median_evals,
        f.random.p90_evals, f.random.median_evals / f.evo.median_evals);
  };
  for (double target : {1.0, 5.0}) line(replay_both(landscape, target, 30, 1), target, "1..30");
  line(replay_both(landscape, 2, 30, 1), 2, "1..30");

  const Figures f = replay_both(landscape, 2, 300, 1);
  line(f, 2, "1..300");
  EXPECT_EQ(f.summary.recorded, f.summary.space_size) << "the campaign is not exhaustive";
  EXPECT_EQ(f.evo.reached_fraction, 1);
  EXPECT_LE(f.evo.median_evals * 1.4, f.random.median_evals)
      << "evo median " << f.evo.median_evals << ", random median " << f.random.median_evals;
  EXPECT_LE(f.evo.space_fraction, 0.08);
}

TEST(ReplayRecorded, H100EvoNeedsFewerEvaluationsThanRandomOver300Seeds) {
  check_recorded("tests/data/campaigns/h100-exhaustive-d128.db");
}

}  // namespace
