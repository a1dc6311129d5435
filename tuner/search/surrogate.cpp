#include "search/surrogate.hpp"

#include <algorithm>
#include <cmath>

namespace attntune::search {

namespace {

constexpr double kRelevanceGrid[] = {0.03, 0.1, 0.3, 1, 3};
constexpr int kSweeps = 2;  // coordinate sweeps over the parameters

}  // namespace

double Surrogate::kernel(const Genome& a, const Genome& b) const {
  double k = 1;
  for (std::size_t p = 0; p < a.size(); ++p)
    if (a[p] != b[p]) k *= similarity_[p];
  return k;
}

void Surrogate::set_relevance(std::size_t p, double r) {
  relevance_[p] = r;
  similarity_[p] = std::exp(-r);
}

double Surrogate::factor(const std::vector<double>& z) {
  n_ = x_.size();
  gram_.assign(n_ * n_, 0);
  for (std::size_t i = 0; i < n_; ++i)
    for (std::size_t j = 0; j <= i; ++j) gram_[i * n_ + j] = kernel(x_[i], x_[j]);
  return factor_gram(z);
}

double Surrogate::factor_gram(const std::vector<double>& z) {
  chol_.resize(n_ * n_);
  for (std::size_t i = 0; i < n_; ++i)
    for (std::size_t j = 0; j <= i; ++j) chol_[i * n_ + j] = gram_[i * n_ + j] + (i == j ? options_.noise : 0);
  for (std::size_t j = 0; j < n_; ++j) {
    double d = chol_[j * n_ + j];
    for (std::size_t k = 0; k < j; ++k) d -= chol_[j * n_ + k] * chol_[j * n_ + k];
    d = std::sqrt(std::max(d, 1e-12));
    chol_[j * n_ + j] = d;
    for (std::size_t i = j + 1; i < n_; ++i) {
      double s = chol_[i * n_ + j];
      for (std::size_t k = 0; k < j; ++k) s -= chol_[i * n_ + k] * chol_[j * n_ + k];
      chol_[i * n_ + j] = s / d;
    }
  }
  // alpha = K^-1 z by two triangular solves; the likelihood from the first.
  alpha_ = z;
  double log_likelihood = 0;
  for (std::size_t i = 0; i < n_; ++i) {
    for (std::size_t k = 0; k < i; ++k) alpha_[i] -= chol_[i * n_ + k] * alpha_[k];
    alpha_[i] /= chol_[i * n_ + i];
    log_likelihood -= 0.5 * alpha_[i] * alpha_[i] + std::log(chol_[i * n_ + i]);
  }
  for (std::size_t i = n_; i-- > 0;) {
    for (std::size_t k = i + 1; k < n_; ++k) alpha_[i] -= chol_[k * n_ + i] * alpha_[k];
    alpha_[i] /= chol_[i * n_ + i];
  }
  return log_likelihood;
}

void Surrogate::fit(const std::vector<Genome>& x, const std::vector<double>& log_time, bool learn_relevance) {
  x_ = x;
  mean_ = 0;
  for (double y : log_time) mean_ += y;
  mean_ /= static_cast<double>(log_time.size());
  double var = 0;
  for (double y : log_time) var += (y - mean_) * (y - mean_);
  scale_ = std::max(std::sqrt(var / static_cast<double>(log_time.size())), 1e-3);
  z_.clear();
  for (double y : log_time) z_.push_back((y - mean_) / scale_);
  best_z_ = *std::min_element(z_.begin(), z_.end());
  if (relevance_.size() != x.front().size()) {
    relevance_.assign(x.front().size(), options_.relevance);
    similarity_.assign(x.front().size(), std::exp(-options_.relevance));
  }
  factor(z_);
  if (learn_relevance) {
    // Coordinate search: a new relevance r for parameter p scales the kernel of each pair that
    // differs in p by exp(current - r), so the Gram matrix is updated, not rebuilt.
    for (int sweep = 0; sweep < kSweeps; ++sweep)
      for (std::size_t p = 0; p < relevance_.size(); ++p) {
        const std::vector<double> base = gram_;
        double best = -1e300, chosen = relevance_[p];
        for (double r : kRelevanceGrid) {
          const double ratio = std::exp(relevance_[p] - r);
          for (std::size_t i = 0; i < n_; ++i)
            for (std::size_t j = 0; j < i; ++j)
              gram_[i * n_ + j] = x_[i][p] != x_[j][p] ? base[i * n_ + j] * ratio : base[i * n_ + j];
          const double pull = std::log(r / options_.relevance);
          const double score = factor_gram(z_) - options_.relevance_prior * pull * pull;
          if (score > best) best = score, chosen = r;
        }
        const double ratio = std::exp(relevance_[p] - chosen);
        for (std::size_t i = 0; i < n_; ++i)
          for (std::size_t j = 0; j < i; ++j)
            gram_[i * n_ + j] = x_[i][p] != x_[j][p] ? base[i * n_ + j] * ratio : base[i * n_ + j];
        set_relevance(p, chosen);
      }
    factor_gram(z_);
  }
}

void Surrogate::believe(const std::vector<Genome>& pending) {
  if (pending.empty() || !fitted()) return;
  std::vector<double> z = z_;
  for (const Genome& g : pending) {
    x_.push_back(g);
    z.push_back((predict(g).mean - mean_) / scale_);
  }
  factor(z);
}

Surrogate::Prediction Surrogate::predict(const Genome& g) const {
  scratch_.resize(n_);
  double mean = 0, var = 1;
  for (std::size_t i = 0; i < n_; ++i) {
    scratch_[i] = kernel(x_[i], g);
    mean += scratch_[i] * alpha_[i];
  }
  for (std::size_t i = 0; i < n_; ++i) {  // v = L^-1 k; var = k(g, g) - v.v
    double v = scratch_[i];
    for (std::size_t k = 0; k < i; ++k) v -= chol_[i * n_ + k] * scratch_[k];
    v /= chol_[i * n_ + i];
    scratch_[i] = v;
    var -= v * v;
  }
  return {mean_ + scale_ * mean, scale_ * std::sqrt(std::max(var, 1e-12))};
}

double Surrogate::expected_improvement(const Genome& g) const {
  const Prediction p = predict(g);
  const double mean = (p.mean - mean_) / scale_, sd = p.sd / scale_;
  const double u = (best_z_ - mean) / sd;
  const double cdf = 0.5 * std::erfc(-u / std::sqrt(2.0));
  const double pdf = std::exp(-0.5 * u * u) / std::sqrt(2 * 3.14159265358979323846);
  return sd * (u * cdf + pdf);
}

}  // namespace attntune::search
