// The valid configs of a space for one problem and arch, enumerated once (spaces are small: hundreds
// to a few thousand valid configs), each also as a genome: its domain index per parameter, in
// declaration order, so a search can step to a neighbouring value. Also the bookkeeping every
// strategy needs: which configs it has proposed or observed ("seen"), and a uniform draw among the
// others.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/config.hpp"
#include "core/problem.hpp"
#include "space/search_space.hpp"

namespace attntune::search {

using Genome = std::vector<int>;  // domain index per parameter

class ValidConfigs {
 public:
  ValidConfigs(const SearchSpace& space, const Problem& problem, const std::string& arch);

  std::size_t size() const { return configs_.size(); }
  const Config& config(std::size_t i) const { return configs_[i]; }
  const Genome& genome(std::size_t i) const { return genomes_[i]; }
  const std::vector<int>& domain_sizes() const { return domain_sizes_; }
  std::size_t params() const { return domain_sizes_.size(); }

  // nullopt when a parameter is missing or has a value outside its domain (extra keys are ignored).
  std::optional<Genome> genome_of(const Config& c) const;
  std::optional<std::size_t> find(const Genome& g) const;  // its index when g is a valid config
  std::optional<std::size_t> find(const Config& c) const;

  bool seen(std::size_t i) const { return unseen_pos_[i] == kSeen; }
  void mark_seen(std::size_t i);  // idempotent
  std::size_t unseen_count() const { return unseen_.size(); }
  bool all_seen() const { return unseen_.empty(); }
  // The k-th unseen config (k < unseen_count()), in an order that depends only on the sequence of
  // mark_seen calls: unseen(rng.below(unseen_count())) is a uniform, reproducible draw.
  std::size_t unseen(std::size_t k) const { return unseen_[k]; }

 private:
  static constexpr std::size_t kSeen = static_cast<std::size_t>(-1);
  std::uint64_t key(const Genome& g) const;

  const SearchSpace* space_;
  std::vector<int> domain_sizes_;
  std::vector<Config> configs_;
  std::vector<Genome> genomes_;
  std::unordered_map<std::uint64_t, std::size_t> by_key_;  // mixed-radix genome -> index
  std::vector<std::size_t> unseen_;                        // indices not yet seen
  std::vector<std::size_t> unseen_pos_;                    // index -> position in unseen_, or kSeen
};

}  // namespace attntune::search
