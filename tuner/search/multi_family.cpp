#include "search/multi_family.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "core/error.hpp"

namespace attntune::search {

Config tag_family(const std::string& family, Config config) {
  config[kTemplateKey] = family;
  return config;
}

std::pair<std::string, Config> untag_family(const Config& config) {
  auto it = config.find(kTemplateKey);
  if (it == config.end() || !std::holds_alternative<std::string>(it->second)) return {"", config};
  Config rest = config;
  rest.erase(kTemplateKey);
  return {std::get<std::string>(it->second), std::move(rest)};
}

void check_mixable(const SearchSpace& space) {
  for (const auto& p : space.params())
    if (p.name == kTemplateKey)
      throw InputError(fmt::format("{} declares a parameter named '{}', which cannot be searched with other templates "
                                   "(the name says which template a config belongs to)",
                                   space.path(), kTemplateKey));
}

std::string tagged_str(const Config& config) {
  auto [family, rest] = untag_family(config);
  return family.empty() ? config_str(config) : fmt::format("{}: {}", family, config_str(rest));
}

std::uint64_t MultiFamily::derived_seed(std::uint64_t seed, const std::string& family) {
  // FNV-1a of the name, then splitmix64 of the mix: the same on every platform.
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char c : family) h = (h ^ c) * 0x100000001b3ull;
  std::uint64_t z = seed + h + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

MultiFamily::MultiFamily(const std::string& strategy, std::vector<FamilySpace> families, const Problem& problem,
                         std::uint64_t seed, const std::vector<Config>& warm_start, AllocationOptions options)
    : options_(options) {
  if (families.size() < 2) throw std::logic_error("MultiFamily: a search of several families needs two or more");
  for (std::size_t i = 0; i < families.size(); ++i) {
    const FamilySpace& f = families[i];
    for (std::size_t j = 0; j < i; ++j)
      if (families[j].family == f.family)
        throw InputError(fmt::format("two search spaces of template '{}' in one campaign", f.family));
    check_mixable(*f.space);
  }
  for (FamilySpace& f : families) {
    StrategyContext context;
    context.space = f.space;
    context.problem = problem;
    context.arch = f.arch;
    context.seed = derived_seed(seed, f.family);
    for (const Config& c : warm_start) {
      auto [family, rest] = untag_family(c);
      if (family == f.family) context.warm_start.push_back(std::move(rest));
    }
    Arm arm;
    arm.strategy = make_strategy(strategy, context);
    arm.stats.family = f.family;
    arm.space = std::move(f);
    arms_.push_back(std::move(arm));
  }
  warmup_.assign(arms_.size(), options_.warmup);
  rank_.assign(arms_.size(), 0);
  prior_value_.assign(arms_.size(), 0.0);
  // The warm start's times count only when every family has one (on the same problem), and only for
  // the strategy that takes a warm start (evo): exhaustive and random take none, and a resumed
  // campaign of theirs evaluates what an uninterrupted one does, which times read again at the
  // resume (then from the campaign's own results) would break.
  const bool priors = strategy == "evo" && std::all_of(arms_.begin(), arms_.end(), [&](const Arm& a) {
    const auto it = options_.prior_us.find(a.stats.family);
    return it != options_.prior_us.end() && it->second > 0;
  });
  if (priors) {
    double fastest = std::numeric_limits<double>::infinity();
    for (const Arm& a : arms_) fastest = std::min(fastest, options_.prior_us.at(a.stats.family));
    for (std::size_t i = 0; i < arms_.size(); ++i) {
      const double mine = options_.prior_us.at(arms_[i].stats.family);
      for (const Arm& a : arms_) rank_[i] += options_.prior_us.at(a.stats.family) < mine ? 1 : 0;
      prior_value_[i] = fastest / mine;
      if (mine >= options_.behind * fastest) warmup_[i] = std::min(options_.warmup, options_.behind_warmup);
    }
  }
}

std::size_t MultiFamily::index_of(const std::string& family) const {
  for (std::size_t i = 0; i < arms_.size(); ++i)
    if (arms_[i].stats.family == family) return i;
  return arms_.size();
}

double MultiFamily::score(std::size_t i, std::size_t total) const {
  const FamilyStats& s = arms_[i].stats;
  // Warm-up: above any bound (the most behind first, ties to the fastest by the warm start, then
  // to the first family).
  if (s.proposed < warmup_[i])
    return 1e9 + static_cast<double>(warmup_[i] - s.proposed) - 1e-3 * static_cast<double>(rank_[i]);
  // Its own results once it has any (a family whose every config failed is worth 0), else the warm
  // start's word.
  const double value = s.best_us && best_us_ ? *best_us_ / *s.best_us : s.observed == 0 ? prior_value_[i] : 0.0;
  const double n = static_cast<double>(std::max<std::size_t>(1, s.proposed));
  const double bonus = options_.exploration * std::sqrt(std::log(std::max<double>(2, total)) / n);
  return value + bonus;
}

std::vector<Config> MultiFamily::propose(std::size_t n) {
  std::vector<Config> out;
  std::vector<bool> live(arms_.size());
  for (std::size_t i = 0; i < arms_.size(); ++i) live[i] = !arms_[i].strategy->exhausted();
  while (out.size() < n) {
    // Plan the remaining slots one at a time (each pick counts at once), then ask each family once.
    std::vector<std::size_t> picks;
    std::vector<std::size_t> planned(arms_.size(), 0);
    std::size_t total = 0;
    for (const Arm& a : arms_) total += a.stats.proposed;
    for (std::size_t slot = out.size(); slot < n; ++slot) {
      std::size_t best = arms_.size();
      double best_score = -std::numeric_limits<double>::infinity();
      for (std::size_t i = 0; i < arms_.size(); ++i) {
        if (!live[i]) continue;
        arms_[i].stats.proposed += planned[i];  // as if the picks so far were made
        const double s = score(i, total);
        arms_[i].stats.proposed -= planned[i];
        if (s > best_score) best_score = s, best = i;
      }
      if (best == arms_.size()) break;
      picks.push_back(best);
      ++planned[best];
      ++total;
    }
    if (picks.empty()) break;
    std::vector<std::vector<Config>> got(arms_.size());
    for (std::size_t i = 0; i < arms_.size(); ++i) {
      if (planned[i] == 0) continue;
      got[i] = arms_[i].strategy->propose(planned[i]);
      // Fewer than asked: nothing more from it in this call; its slots go to the others.
      if (got[i].size() < planned[i]) live[i] = false;
    }
    std::vector<std::size_t> next(arms_.size(), 0);
    for (const std::size_t i : picks) {
      if (next[i] >= got[i].size()) continue;
      Config c = tag_family(arms_[i].stats.family, std::move(got[i][next[i]++]));
      pending_.insert(config_str(c));
      ++arms_[i].stats.proposed;
      out.push_back(std::move(c));
    }
    if (std::none_of(live.begin(), live.end(), [](bool b) { return b; })) break;
  }
  return out;
}

void MultiFamily::observe(const Trial& trial) {
  auto [family, config] = untag_family(trial.config);
  const std::size_t i = index_of(family);
  if (i == arms_.size())
    throw std::logic_error(fmt::format("MultiFamily::observe: {} is not a config of this search's templates",
                                       config_str(trial.config)));
  Arm& arm = arms_[i];
  if (pending_.erase(config_str(trial.config)) == 0) ++arm.stats.proposed;  // recorded before this run
  ++arm.stats.observed;
  if (trial.status == "ok" && trial.time_us) {
    ++arm.stats.ok;
    if (!arm.stats.best_us || *trial.time_us < *arm.stats.best_us) arm.stats.best_us = trial.time_us;
    if (!best_us_ || *trial.time_us < *best_us_) best_us_ = trial.time_us;
  }
  arm.strategy->observe(Trial{std::move(config), trial.status, trial.time_us});
}

bool MultiFamily::exhausted() const {
  return std::all_of(arms_.begin(), arms_.end(), [](const Arm& a) { return a.strategy->exhausted(); });
}

std::vector<MultiFamily::FamilyStats> MultiFamily::stats() const {
  std::vector<FamilyStats> out;
  for (const Arm& a : arms_) {
    out.push_back(a.stats);
    out.back().exhausted = a.strategy->exhausted();
  }
  return out;
}

}  // namespace attntune::search
