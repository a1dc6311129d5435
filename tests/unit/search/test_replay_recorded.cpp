// Issue 5's measure on real landscapes: every valid flash_fwd_mma config timed on an H100, replayed
// with 8 proposals in flight; how many evaluations evo and random search need to come within X% of
// the optimum, over seeds 1..300 (random's median over 30 seeds swings by about 2x from one block of
// seeds to the next, so a 30-seed median proves little either way):
//  - tests/data/campaigns/h100-exhaustive-d128.db: b=4,h=16,s=4096,d=128 bf16 (564 configs), the
//    campaign issue 5 names;
//  - tests/data/campaigns/h100-exhaustive-d64-and-d128-causal.db: b=8,h=16,s=2048,d=64 (928) and
//    b4-s4k-d128 causal (564), to check that what evo learned on the first is not an overfit.
//
// The issue asks for 3x fewer evaluations than random at 2% (the compass: 5x, within 5% of the
// space). evo does that at 1% (about 3.8x), not at 2%: there it needs about 1.8x fewer (median 25.5
// against 47; 4.5% of the space). Only 8 configs lie within 2%, all in one corner of the space
// (block_m=128, block_n=32, warps=4, lazy_rescale), the first 8 proposals go out before any result
// is back, and a proposal made on seeing a first config of that corner is measured 8 evaluations
// later: median first sight of the corner 9, then about 12 more. Even with no pipeline at all evo
// needs 19 (2.5x), so the bar at 2% is out of reach here (docs/log/PERFORMANCE.md lists what was
// measured: depth, a GPU-aware prior, another initial design). What this test holds is what evo
// does achieve, so a regression shows; the tail is held too (p90), as it is what an overnight
// campaign with a fixed budget pays for.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "db/store.hpp"
#include "search/recorded.hpp"
#include "search/replay.hpp"
#include "search/warm_start.hpp"
#include "synthetic.hpp"

namespace test_replay_recorded {
using namespace attntune;
using namespace attntune::search;

namespace {

struct Figures {
  ReplaySummary summary;
  ReplayStats evo, random;
  double ratio() const { return random.median_evals / evo.median_evals; }
};

Figures replay_both(const Landscape& landscape, double target_pct, std::vector<Config> warm = {});

// Cold replays at 2%, once per test binary (two tests compare with them).
const Figures& cold(const RecordedCampaign& campaign) {
  static std::map<std::string, Figures> done;
  auto it = done.find(campaign.name);
  if (it == done.end()) it = done.emplace(campaign.name, replay_both(landscape_of(campaign), 2)).first;
  return it->second;
}

Figures replay_both(const Landscape& landscape, double target_pct, std::vector<Config> warm) {
  ReplayOptions o;
  o.seeds = 300;
  o.seed = 1;
  o.target_pct = target_pct;
  o.strategy = "evo";
  o.warm_start = std::move(warm);
  Figures f{summarize(landscape, o), replay(landscape, o), {}};
  o.strategy = "random";
  o.warm_start.clear();
  f.random = replay(landscape, o);
  return f;
}

std::string line(const RecordedCampaign& campaign, const Figures& f, double target, const std::string& note = "") {
  return fmt::format(
      "[ recorded ] {}{} ({} configs), within {}%, seeds 1..300: evo median {} p90 {} ({:.1f}% of the space, "
      "reached {:.0f}%), random median {} p90 {}: {:.2f}x fewer\n",
      campaign.name, note, f.summary.space_size, target, f.evo.median_evals, f.evo.p90_evals,
      100 * f.evo.space_fraction, 100 * f.evo.reached_fraction, f.random.median_evals, f.random.p90_evals, f.ratio());
}

class Recorded {
 public:
  Recorded(const std::string& relative, const std::string& name)
      : path_(test::source_path(relative)), store_(open(path_)), campaign_(RecordedCampaign::load(store_, name)) {}
  const RecordedCampaign& campaign() const { return campaign_; }
  Landscape landscape() const { return landscape_of(campaign_); }
  std::vector<Config> best() {  // what tune's warm start takes from it
    BestQuery q;
    q.campaign = campaign_.name;
    return warm_start_configs(store_, q, campaign_.space.family());
  }

 private:
  static Store open(const std::string& path) {
    if (!std::filesystem::exists(path))
      throw std::runtime_error(path + " is missing: a recorded exhaustive campaign this test replays (issue 5)");
    return Store::open(path, Store::Mode::kReadOnly);
  }
  std::string path_;
  Store store_;
  RecordedCampaign campaign_;
};

const char* const kD128 = "tests/data/campaigns/h100-exhaustive-d128.db";
const char* const kMore = "tests/data/campaigns/h100-exhaustive-d64-and-d128-causal.db";

void check_reached_all(const Figures& f) {
  EXPECT_EQ(f.summary.recorded, f.summary.space_size) << "the campaign is not exhaustive";
  EXPECT_EQ(f.evo.reached_fraction, 1);
}

TEST(ReplayRecorded, H100D128EvoNeedsFewerEvaluationsThanRandomOver300Seeds) {
  const auto start = std::chrono::steady_clock::now();
  Recorded d128(kD128, "h100-exhaustive-d128");
  const Figures& f = cold(d128.campaign());
  std::cout << line(d128.campaign(), f, 2);
  check_reached_all(f);
  EXPECT_GE(f.ratio(), 1.6) << "evo median " << f.evo.median_evals << ", random median " << f.random.median_evals;
  EXPECT_LE(f.evo.p90_evals, 80) << "the tail: seeds that settle in a good but wrong basin";
  EXPECT_LE(f.evo.space_fraction, 0.06);

  const Figures strict = replay_both(d128.landscape(), 1);
  std::cout << line(d128.campaign(), strict, 1);
  check_reached_all(strict);
  EXPECT_GE(strict.ratio(), 3) << "within 1%: evo median " << strict.evo.median_evals;
  EXPECT_LE(strict.evo.p90_evals, 100);

  const Figures loose = replay_both(d128.landscape(), 5);  // ~23 configs: the first batch often has one
  std::cout << line(d128.campaign(), loose, 5);
  EXPECT_LE(loose.evo.median_evals, loose.random.median_evals);
  EXPECT_LE(loose.evo.p90_evals, loose.random.p90_evals);
  std::cout << fmt::format("[ recorded ] {:.1f} s\n",
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

// The same evo on two other landscapes, with other optima (block_n=64 for d=64; warps=8 and block_n=128
// for causal, where many configs lie within 2% and random search is hard to beat by much).
TEST(ReplayRecorded, H100D64AndCausalEvoNeedsFewerEvaluationsThanRandom) {
  const auto start = std::chrono::steady_clock::now();
  Recorded d64(kMore, "exhaustive-d64"), causal(kMore, "exhaustive-d128-causal");
  const Figures& a = cold(d64.campaign());
  std::cout << line(d64.campaign(), a, 2);
  check_reached_all(a);
  EXPECT_GE(a.ratio(), 1.7);
  EXPECT_LE(a.evo.p90_evals, 50);
  const Figures& b = cold(causal.campaign());
  std::cout << line(causal.campaign(), b, 2);
  check_reached_all(b);
  EXPECT_GE(b.ratio(), 1.15);
  EXPECT_LE(b.evo.p90_evals, 50);
  std::cout << fmt::format("[ recorded ] {:.1f} s\n",
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

// What tune does on a database that holds a neighbour: it seeds evo with the neighbour's 8 best
// configs (same head dim; here causal <-> non-causal, whose optima differ but share a corner), which
// go out first, the same for every seed.
TEST(ReplayRecorded, H100WarmStartFromTheOtherD128Campaign) {
  Recorded d128(kD128, "h100-exhaustive-d128"), causal(kMore, "exhaustive-d128-causal");
  for (auto [to, from, note] : {std::tuple{&d128, &causal, " warm from causal"}, {&causal, &d128, " warm from non-causal"}}) {
    const Figures warm = replay_both(to->landscape(), 2, from->best());
    std::cout << line(to->campaign(), warm, 2, note);
    check_reached_all(warm);
    EXPECT_LT(warm.evo.median_evals, cold(to->campaign()).evo.median_evals) << note;
    EXPECT_LE(warm.evo.p90_evals, cold(to->campaign()).evo.p90_evals) << note;
  }
}

}  // namespace
}  // namespace test_replay_recorded
