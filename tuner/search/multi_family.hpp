// A search over several template families at once (`tune --space A.yaml --space B.yaml`): one inner
// strategy per family (the same strategy, a seed derived from the campaign's and the family's name),
// behind the ordinary Strategy interface. Its configs carry their family under the reserved key
// `template` (tag_family), which no space may declare as a parameter; the campaign strips it before
// a config reaches a family's renderer or the store (which keeps the family per candidate).
//
// Who gets each proposal (deterministic: the same propose/observe sequence gives the same split):
//  1. warm-up: each family gets proposals until it has had `warmup` (evo's first batch is 8), the
//     family with the fewest first, so every family is explored; with the warm start's times
//     (AllocationOptions::prior_us) the fastest family first on ties, and a family far behind
//     gets a shorter warm-up (its best seeds: enough to see whether this problem differs);
//  2. then the family with the highest upper confidence bound on its value, where a family's value
//     is the overall best time over its own best time (1 for the family that holds the best, 0 for
//     one with no ok result yet, 0.5 for one whose best is twice as slow) and the bound adds
//     `exploration * sqrt(ln(proposals of all families) / proposals of this family)`: a family that
//     fails, or is slower, gets fewer proposals, but never none while the bonus can outgrow the gap;
//     until a family has a result of its own, its value is what the warm start's times say (the
//     fastest template's time over its own; 0 without them): tune keeps ~34 proposals in flight, so
//     the first batch is allocated before any result, and with value 0 for all the bound alone split
//     it evenly (runs 271-273: 15-19 of each campaign's first 34 evaluations went to flash_fwd_mma,
//     1.6-1.75x behind by the warm start, and came first, its kernels compiling faster);
//  3. a family whose strategy is exhausted (or proposes nothing now) drops out, and its share goes to
//     the others.
// Proposals count when they are made (results may lag: tune keeps the compile pool full), and a
// resumed campaign's recorded results count as its family's proposals.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "search/strategy.hpp"

namespace attntune::search {

inline constexpr const char* kTemplateKey = "template";

// `config` with its family under kTemplateKey.
Config tag_family(const std::string& family, Config config);
// (family, config without kTemplateKey); family "" when the config carries none.
std::pair<std::string, Config> untag_family(const Config& config);
// InputError when `space` declares a parameter named kTemplateKey: it could not be told from the tag.
void check_mixable(const SearchSpace& space);
// For people: "flash_fwd_wgmma: block_m=128,..." for a tagged config, config_str otherwise.
std::string tagged_str(const Config& config);

struct FamilySpace {
  std::string family;
  const SearchSpace* space = nullptr;  // outlives the strategy
  std::string arch;                    // the arch its kernels are built for (sm_90a for wgmma on sm_90)
};

struct AllocationOptions {
  std::size_t warmup = 8;
  double exploration = 0.75;
  // What the warm start says of each template: its best time on the nearest tuned problem, where
  // that problem is the same for every template (service::add_warm_starts), else empty; evo only
  // (the strategy that takes a warm start). The warm-up then takes the templates fastest first, and one at least `behind` times slower than
  // the fastest gets `behind_warmup` proposals (its best seeds) instead of `warmup`: on an H200,
  // flash_fwd_mma took half of 104 prefill campaigns' evaluations and won 2 of them (run 200,
  // its best 1.53x flash_fwd_wgmma's at the median, within 1.25x only where it won or nearly did).
  std::map<std::string, double> prior_us;
  double behind = 1.25;
  std::size_t behind_warmup = 2;
};

class MultiFamily final : public Strategy {
 public:
  struct FamilyStats {
    std::string family;
    std::size_t proposed = 0;  // proposals made to it (a resumed campaign's results included)
    std::size_t observed = 0, ok = 0;
    std::optional<double> best_us;
    bool exhausted = false;
  };

  // `families`: at least two, distinct, none declaring a `template` parameter (InputError);
  // `warm_start`: tagged configs (each goes to its family's strategy). Seeds: derived_seed().
  MultiFamily(const std::string& strategy, std::vector<FamilySpace> families, const Problem& problem,
              std::uint64_t seed, const std::vector<Config>& warm_start, AllocationOptions options = {});

  std::vector<Config> propose(std::size_t n) override;  // tagged configs
  void observe(const Trial& trial) override;            // a tagged config (logic_error otherwise)
  bool exhausted() const override;

  std::vector<FamilyStats> stats() const;
  // The seed of a family's inner strategy: a mix of the campaign's seed and the family's name.
  static std::uint64_t derived_seed(std::uint64_t seed, const std::string& family);

 private:
  struct Arm {
    FamilySpace space;
    std::unique_ptr<Strategy> strategy;
    FamilyStats stats;
  };
  std::size_t index_of(const std::string& family) const;  // arms_.size() when unknown
  double score(std::size_t arm, std::size_t total) const;

  AllocationOptions options_;
  std::vector<Arm> arms_;
  std::vector<std::size_t> warmup_;  // per arm: options_.warmup, or behind_warmup for one far behind
  std::vector<std::size_t> rank_;    // per arm: its place by prior_us (fastest 0; none: all 0)
  std::vector<double> prior_value_;  // per arm: fastest prior_us over its own (no times: all 0)
  std::set<std::string> pending_;  // config_str of tagged proposals not yet observed
  std::optional<double> best_us_;  // over all families
};

}  // namespace attntune::search
