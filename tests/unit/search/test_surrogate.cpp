// evo's surrogate: a Gaussian process over genomes that learns which parameters matter, interpolates
// what it saw, is unsure of what it did not, and, conditioned on configs in flight, stops expecting
// much of their neighbourhood.
#include <gtest/gtest.h>

#include <cmath>

#include "search/rng.hpp"
#include "search/surrogate.hpp"

namespace test_surrogate {
using namespace attntune::search;

namespace {

// Four parameters (3, 3, 2, 2 values); log time depends on the first two only, with an interaction:
// value 1 of the first is fast only with value 0 of the second.
double truth(const Genome& g) { return 7 + 0.4 * (g[0] != 1) + 0.2 * g[1] + 0.5 * (g[0] == 1 && g[1] != 0); }

std::vector<Genome> all_genomes() {
  std::vector<Genome> out;
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b)
      for (int c = 0; c < 2; ++c)
        for (int d = 0; d < 2; ++d) out.push_back({a, b, c, d});
  return out;
}

TEST(Surrogate, LearnsWhichParametersMatterAndPredictsUnseenConfigs) {
  const std::vector<Genome> all = all_genomes();  // 36
  std::vector<Genome> x;
  std::vector<double> y;
  for (std::size_t i = 0; i < all.size(); i += 2) x.push_back(all[i]), y.push_back(truth(all[i]));
  Surrogate model;
  model.fit(x, y, true);
  const std::vector<double>& r = model.relevance();
  ASSERT_EQ(r.size(), 4u);
  EXPECT_GT(std::min(r[0], r[1]), std::max(r[2], r[3])) << r[0] << " " << r[1] << " " << r[2] << " " << r[3];
  for (std::size_t i = 1; i < all.size(); i += 2)  // the half it did not see
    EXPECT_NEAR(model.predict(all[i]).mean, truth(all[i]), 0.05) << i;
}

TEST(Surrogate, SureWhereItLookedUnsureElsewhere) {
  const std::vector<Genome> x = {{0, 0, 0, 0}, {0, 1, 0, 0}, {1, 0, 0, 0}};
  std::vector<double> y;
  for (const Genome& g : x) y.push_back(truth(g));
  Surrogate model;
  model.fit(x, y, false);
  const Surrogate::Prediction seen = model.predict(x[1]), far = model.predict({2, 2, 1, 1});
  EXPECT_NEAR(seen.mean, y[1], 0.02);
  EXPECT_LT(seen.sd * 3, far.sd);
}

TEST(Surrogate, ExpectsMoreOfPromisingConfigsAndLessOnceOneIsInFlight) {
  const std::vector<Genome> all = all_genomes();
  std::vector<Genome> x;
  std::vector<double> y;
  for (const Genome& g : all)
    if (!(g[0] == 1 && g[1] == 0)) x.push_back(g), y.push_back(truth(g));  // the best ones unseen
  Surrogate model;
  model.fit(x, y, true);
  const Genome best = {1, 0, 1, 1}, bad = {2, 2, 0, 0};
  const double gain = model.expected_improvement(best), sd = model.predict(best).sd;
  EXPECT_GT(gain, 10 * model.expected_improvement(bad));
  // With its twin {1, 0, 1, 0} in flight (believed at its predicted time), less is left to hope for.
  model.believe({{1, 0, 1, 0}});
  EXPECT_LT(model.predict(best).sd, sd);
  EXPECT_LT(model.expected_improvement(best), gain / 2);
}

TEST(Surrogate, SameObservationsSamePredictions) {
  Rng rng(3);
  std::vector<Genome> x;
  std::vector<double> y;
  for (int k = 0; k < 20; ++k) {
    Genome g = {int(rng.below(3)), int(rng.below(3)), int(rng.below(2)), int(rng.below(2))};
    y.push_back(truth(g) + 0.01 * rng.uniform());
    x.push_back(std::move(g));
  }
  Surrogate a, b;
  a.fit(x, y, true);
  b.fit(x, y, true);
  for (const Genome& g : all_genomes()) {
    EXPECT_EQ(a.predict(g).mean, b.predict(g).mean);
    EXPECT_EQ(a.expected_improvement(g), b.expected_improvement(g));
  }
}

}  // namespace
}  // namespace test_surrogate
