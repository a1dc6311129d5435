// The replay engine on synthetic landscapes: exact figures for exhaustive, the budget and
// not-reached rule, partial landscapes, percentiles, and evo against random search.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "core/error.hpp"
#include "search/replay.hpp"
#include "synthetic.hpp"

namespace test_replay {
using namespace attntune;
using namespace attntune::search;
using namespace attntune::test;

namespace {

ReplayOptions options(const std::string& strategy, int seeds = 30, double target_pct = 2) {
  ReplayOptions o;
  o.strategy = strategy;
  o.seeds = seeds;
  o.target_pct = target_pct;
  return o;
}

TEST(ReplayEngine, Percentiles) {
  EXPECT_EQ(percentiles({5}).median, 5);
  EXPECT_EQ(percentiles({5}).p90, 5);
  EXPECT_EQ(percentiles({4, 1, 3, 2}).median, 2.5);
  const Percentiles p = percentiles({10, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  EXPECT_EQ(p.median, 5.5);
  EXPECT_EQ(p.p90, 9);  // nearest rank: the 9th of 10
  EXPECT_EQ(percentiles({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}).p90, 10);
}

// Exhaustive's figure is known in advance: the position in enumeration order of the first config
// within the target, the same for every seed and pipeline depth.
TEST(ReplayEngine, ExhaustiveNeedsThePositionOfTheFirstGoodConfig) {
  const Synthetic& s = landscape();
  const std::vector<Config> all = s.space->enumerate(s.problem, s.arch);
  const double target = s.optimum() * 1.02;
  std::size_t position = 0;
  while (!(s.results.at(config_str(all[position])).status == "ok" &&
           *s.results.at(config_str(all[position])).median_us <= target))
    ++position;
  for (std::size_t pipeline : {1, 8}) {
    ReplayOptions o = options("exhaustive", 3);
    o.pipeline = pipeline;
    const ReplayStats r = replay(s.landscape(), o);
    EXPECT_EQ(r.evals, std::vector<std::uint64_t>(3, position + 1));
    EXPECT_EQ(r.reached_fraction, 1);
    EXPECT_DOUBLE_EQ(r.space_fraction, static_cast<double>(position + 1) / static_cast<double>(all.size()));
  }
  const ReplaySummary sum = summarize(s.landscape(), options("exhaustive"));
  EXPECT_EQ(sum.space_size, all.size());
  EXPECT_EQ(sum.recorded, all.size());
  EXPECT_EQ(sum.budget, all.size());
  EXPECT_DOUBLE_EQ(sum.optimum_us, s.optimum());
  EXPECT_DOUBLE_EQ(sum.target_us, target);
}

TEST(ReplayEngine, RandomMatchesItsExpectation) {
  // Without replacement, k good configs among N: the first is found after (N + 1) / (k + 1) draws on
  // average. The mean over 100 seeds should be close (and the run reproducible).
  const Synthetic& s = landscape();
  const double n = static_cast<double>(s.results.size()), k = static_cast<double>(s.within(2));
  const ReplayStats r = replay(s.landscape(), options("random", 100));
  double mean = 0;
  for (auto e : r.evals) mean += static_cast<double>(e) / 100;
  EXPECT_NEAR(mean, (n + 1) / (k + 1), 0.2 * (n + 1) / (k + 1)) << "k=" << k;
  EXPECT_EQ(r.reached_fraction, 1);
  EXPECT_EQ(replay(s.landscape(), options("random", 100)).evals, r.evals);
}

TEST(ReplayEngine, NotReachedWithinTheBudgetCountsAsBudgetPlusOne) {
  const Synthetic& s = landscape();
  ReplayOptions o = options("random", 40);
  o.budget = 3;
  const ReplayStats r = replay(s.landscape(), o);
  std::size_t reached = 0;
  for (auto e : r.evals) {
    EXPECT_TRUE(e <= 3 || e == 4) << e;
    reached += e <= 3;
  }
  EXPECT_EQ(r.reached, reached);
  EXPECT_LT(r.reached_fraction, 1);
  EXPECT_EQ(r.p90_evals, 4);
}

TEST(ReplayEngine, RefusesAPartialLandscapeUnlessAskedThenSkipsTheGaps) {
  Synthetic s = make_synthetic({});
  // Drop every 4th config, keeping the optimum.
  const double best = s.optimum();
  std::size_t i = 0;
  for (auto it = s.results.begin(); it != s.results.end(); ++i)
    it = (i % 4 == 0 && !(it->second.status == "ok" && *it->second.median_us == best)) ? s.results.erase(it)
                                                                                        : std::next(it);
  EXPECT_THROW(replay(s.landscape(), options("random", 3)), InputError);
  ReplayOptions o = options("exhaustive", 1, 0);
  o.partial = true;
  const ReplayStats r = replay(s.landscape(), o);
  // Exhaustive reaches the optimum after exactly the recorded configs before it, in enumeration order.
  std::size_t counted = 0;
  for (const Config& c : s.space->enumerate(s.problem, s.arch)) {
    auto it = s.results.find(config_str(c));
    if (it == s.results.end()) continue;
    ++counted;
    if (it->second.status == "ok" && *it->second.median_us == best) break;
  }
  EXPECT_EQ(r.evals, std::vector<std::uint64_t>{counted});
}

TEST(ReplayEngine, BadOptionsAndUnknownStrategyAreInputErrors) {
  const Synthetic& s = landscape();
  ReplayOptions o = options("evo");
  o.seeds = 0;
  EXPECT_THROW(replay(s.landscape(), o), InputError);
  o = options("evo", 1, -1);
  EXPECT_THROW(replay(s.landscape(), o), InputError);
  o = options("evo");
  o.pipeline = 0;
  EXPECT_THROW(replay(s.landscape(), o), InputError);
  EXPECT_THROW(replay(s.landscape(), options("hill_climb", 1)), InputError);
}

// evo against random search on synthetic landscapes (three seeds of the generator, two problems):
// the median over 30 seeds of evaluations to within 2% of the optimum.
TEST(ReplayEngine, EvoBeatsRandomOnSyntheticLandscapes) {
  for (const std::string problem : {"b=4,h=16,s=4096,d=128,dtype=bf16,causal=0", "b=8,h=16,s=2048,d=64,dtype=fp16,causal=1"})
    for (std::uint64_t gen : {1, 2, 3}) {
      SyntheticOptions so;
      so.seed = gen;
      so.problem = problem;
      const Synthetic s = make_synthetic(so);
      const ReplayStats evo = replay(s.landscape(), options("evo"));
      const ReplayStats rnd = replay(s.landscape(), options("random"));
      std::cout << fmt::format("[ replay ] {} landscape {}: {} configs, {} within 2%; evo median {} p90 {}, random median {} p90 {}, speedup {:.2f}x\n",
                               problem, gen, s.results.size(), s.within(2), evo.median_evals, evo.p90_evals,
                               rnd.median_evals, rnd.p90_evals, rnd.median_evals / evo.median_evals);
      EXPECT_EQ(evo.reached_fraction, 1);
      EXPECT_LE(evo.median_evals * 2, rnd.median_evals) << problem << " landscape " << gen;
    }
}

}  // namespace
}  // namespace test_replay
