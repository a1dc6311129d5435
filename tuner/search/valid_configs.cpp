#include "search/valid_configs.hpp"

#include <algorithm>

namespace attntune::search {

ValidConfigs::ValidConfigs(const SearchSpace& space, const Problem& problem, const std::string& arch)
    : space_(&space) {
  for (const Param& p : space.params()) domain_sizes_.push_back(static_cast<int>(p.values.size()));
  configs_ = space.enumerate(problem, arch);
  genomes_.reserve(configs_.size());
  for (std::size_t i = 0; i < configs_.size(); ++i) {
    genomes_.push_back(*genome_of(configs_[i]));
    by_key_.emplace(key(genomes_.back()), i);
    unseen_.push_back(i);
    unseen_pos_.push_back(i);
  }
}

std::optional<Genome> ValidConfigs::genome_of(const Config& c) const {
  Genome g;
  g.reserve(domain_sizes_.size());
  for (const Param& p : space_->params()) {
    const Value* value = param_value(c, p);
    if (!value) return std::nullopt;
    auto pos = std::find(p.values.begin(), p.values.end(), *value);
    if (pos == p.values.end()) return std::nullopt;
    g.push_back(static_cast<int>(pos - p.values.begin()));
  }
  return g;
}

std::uint64_t ValidConfigs::key(const Genome& g) const {
  std::uint64_t k = 0;
  for (std::size_t i = 0; i < g.size(); ++i) k = k * static_cast<std::uint64_t>(domain_sizes_[i]) + static_cast<std::uint64_t>(g[i]);
  return k;
}

std::optional<std::size_t> ValidConfigs::find(const Genome& g) const {
  if (g.size() != domain_sizes_.size()) return std::nullopt;
  auto it = by_key_.find(key(g));
  if (it == by_key_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::size_t> ValidConfigs::find(const Config& c) const {
  const std::optional<Genome> g = genome_of(c);
  return g ? find(*g) : std::nullopt;
}

void ValidConfigs::mark_seen(std::size_t i) {
  const std::size_t pos = unseen_pos_[i];
  if (pos == kSeen) return;
  unseen_[pos] = unseen_.back();  // swap-remove: O(1), and deterministic
  unseen_pos_[unseen_[pos]] = pos;
  unseen_.pop_back();
  unseen_pos_[i] = kSeen;
}

}  // namespace attntune::search
