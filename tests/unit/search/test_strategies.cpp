// exhaustive and random, and the strategy factory: the enumeration order, reproducible seeds, no
// duplicates, full coverage, configs observed on resume never proposed again.
#include <gtest/gtest.h>

#include <set>

#include "core/error.hpp"
#include "search/strategy.hpp"
#include "synthetic.hpp"

namespace test_strategies {
using namespace attntune;
using namespace attntune::search;
using namespace attntune::test;

namespace {

TEST(StrategyFactory, NamesAndUnknownName) {
  EXPECT_EQ(strategy_names(), (std::vector<std::string>{"evo", "random", "exhaustive"}));
  for (const std::string& name : strategy_names()) EXPECT_NE(make_strategy(name, context_of(landscape(), 1)), nullptr);
  try {
    make_strategy("annealing", context_of(landscape(), 1));
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "unknown strategy 'annealing' (known: evo, random, exhaustive)");
  }
}

TEST(ExhaustiveStrategy, ProposesTheEnumerationInOrderThenNothing) {
  const Synthetic& s = landscape();
  const std::vector<Config> all = s.space->enumerate(s.problem, s.arch);
  ASSERT_GT(all.size(), 100u);
  auto strategy = make_strategy("exhaustive", context_of(s, 1));
  std::vector<Config> got;
  while (!strategy->exhausted()) {
    const std::vector<Config> batch = strategy->propose(7);
    ASSERT_FALSE(batch.empty());
    got.insert(got.end(), batch.begin(), batch.end());
  }
  EXPECT_EQ(strs(got), strs(all));
  EXPECT_TRUE(strategy->propose(5).empty());
}

TEST(ExhaustiveStrategy, SkipsWhatWasObservedBefore) {
  const Synthetic& s = landscape();
  const std::vector<Config> all = s.space->enumerate(s.problem, s.arch);
  auto strategy = make_strategy("exhaustive", context_of(s, 1));
  std::vector<std::string> expected;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (i % 3 == 0) strategy->observe({all[i], "ok", 1.0});
    else expected.push_back(config_str(all[i]));
  }
  EXPECT_EQ(strs(drive(*strategy, s)), expected);
  EXPECT_TRUE(strategy->exhausted());
}

TEST(RandomStrategy, ReproducibleForASeedDifferentAcrossSeeds) {
  const Synthetic& s = landscape();
  auto a = make_strategy("random", context_of(s, 42)), b = make_strategy("random", context_of(s, 42)),
       c = make_strategy("random", context_of(s, 43));
  const auto pa = strs(a->propose(50)), pb = strs(b->propose(50)), pc = strs(c->propose(50));
  EXPECT_EQ(pa, pb);
  EXPECT_NE(pa, pc);
  // Not the enumeration order either.
  EXPECT_NE(pa, strs(make_strategy("exhaustive", context_of(s, 42))->propose(50)));
}

TEST(RandomStrategy, CoversTheSpaceWithoutDuplicates) {
  const Synthetic& s = landscape();
  const std::vector<Config> all = s.space->enumerate(s.problem, s.arch);
  auto strategy = make_strategy("random", context_of(s, 7));
  const std::vector<std::string> got = strs(drive(*strategy, s, 8));
  EXPECT_TRUE(strategy->exhausted());
  EXPECT_EQ(std::set<std::string>(got.begin(), got.end()).size(), got.size());
  const auto sorted = [](std::vector<std::string> v) { std::sort(v.begin(), v.end()); return v; };
  EXPECT_EQ(sorted(got), sorted(strs(all)));
}

TEST(RandomStrategy, NeverProposesWhatWasObservedBefore) {
  const Synthetic& s = landscape();
  const std::vector<Config> all = s.space->enumerate(s.problem, s.arch);
  auto strategy = make_strategy("random", context_of(s, 3));
  std::set<std::string> observed;
  for (std::size_t i = 0; i < all.size(); i += 2) {
    strategy->observe({all[i], "resources", std::nullopt});
    observed.insert(config_str(all[i]));
  }
  const std::vector<std::string> got = strs(drive(*strategy, s));
  EXPECT_EQ(got.size(), all.size() - observed.size());
  for (const std::string& c : got) EXPECT_FALSE(observed.count(c)) << c;
}

TEST(RandomStrategy, FirstProposalIsUniform) {
  // Over many seeds the first proposal lands in each half of the enumeration about equally often.
  const Synthetic& s = landscape();
  const std::vector<std::string> all = strs(s.space->enumerate(s.problem, s.arch));
  int first_half = 0;
  const int seeds = 200;
  for (int seed = 1; seed <= seeds; ++seed) {
    const std::string c = config_str(make_strategy("random", context_of(s, static_cast<std::uint64_t>(seed)))->propose(1)[0]);
    first_half += std::find(all.begin(), all.end(), c) - all.begin() < static_cast<long>(all.size() / 2);
  }
  EXPECT_NEAR(first_half, seeds / 2, 35);  // 5 sigma
}

}  // namespace
}  // namespace test_strategies
