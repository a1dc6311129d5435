// A surrogate model of a landscape for evo to rank candidates with: a Gaussian process over
// genomes, log run time against configs, with an exponentiated Hamming kernel
//   k(a, b) = exp(-sum over parameters p where a[p] != b[p] of relevance[p]),
// so two configs are alike as far as they share values, and a parameter that matters (a tile size)
// makes configs that differ in it unlike, while one that hardly matters (a prefetch flag) does not.
// The relevances are learned from the observations (maximum marginal likelihood, a coordinate
// search over a small grid, with a weak prior), so the model learns which parameters matter on
// this landscape and which values of them go together, with no assumption about their order.
//
// Pending configs (proposed, not yet measured) can be conditioned on as if measured at their
// predicted time (the "kriging believer"): that removes their neighbourhood's uncertainty, so the
// next proposals spread instead of piling onto one promising spot while results are in flight.
//
// It ranks candidates only; it never decides validity or failure (evo's risk screen does that).
#pragma once
#include <cstddef>
#include <vector>

#include "search/valid_configs.hpp"

namespace attntune::search {

class Surrogate {
 public:
  struct Options {
    double noise = 0.01;         // observation noise variance, in units of the data's variance
    double relevance = 0.3;      // the prior's relevance of each parameter, and the fit's start
    double relevance_prior = 0;  // pull of the prior on log relevance (0: none)
  };
  struct Prediction {
    double mean = 0;  // log time
    double sd = 0;    // of the mean
  };

  Surrogate() = default;
  explicit Surrogate(const Options& options) : options_(options) {}

  // Fits to observed (genome, log time) pairs (at least 2); learns the relevances when asked,
  // else keeps those of the last fit. Forgets any belief.
  void fit(const std::vector<Genome>& x, const std::vector<double>& log_time, bool learn_relevance);
  // Conditions on pending genomes at their predicted means (until the next fit).
  void believe(const std::vector<Genome>& pending);

  bool fitted() const { return n_ > 0; }
  Prediction predict(const Genome& g) const;
  // Expected improvement below the best observed log time (larger is more promising).
  double expected_improvement(const Genome& g) const;
  const std::vector<double>& relevance() const { return relevance_; }

 private:
  double kernel(const Genome& a, const Genome& b) const;
  void set_relevance(std::size_t p, double r);
  // Cholesky factor of the kernel matrix of x_ plus noise, and alpha_ = K^-1 z; the log marginal
  // likelihood of z.
  double factor(const std::vector<double>& z);
  double factor_gram(const std::vector<double>& z);  // the same from gram_

  Options options_;
  std::vector<double> relevance_;
  std::vector<double> similarity_;  // exp(-relevance): the kernel's factor for a differing parameter
  std::vector<Genome> x_;
  std::vector<double> z_;          // standardised log times of x_ (believed ones included)
  double mean_ = 0, scale_ = 1;    // log time = mean_ + scale_ * z
  double best_z_ = 0;
  std::size_t n_ = 0;
  std::vector<double> gram_;       // n_ x n_ kernel matrix (lower triangle), without the noise
  std::vector<double> chol_;       // n_ x n_, lower, row-major
  std::vector<double> alpha_;
  mutable std::vector<double> scratch_;
};

}  // namespace attntune::search
