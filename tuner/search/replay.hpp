// Replay: a strategy run against recorded results instead of a GPU (Kernel Tuner's simulation
// mode), to measure how many evaluations it needs to come within X% of the optimum, over many seeds.
//
// Pipelining is simulated as `tune` runs: the compile pool keeps `pipeline` proposals in flight, so
// each step tops the outstanding proposals up to `pipeline`, then observes the oldest one (one
// evaluation). `tune`'s depth is its runner's capacity: --jobs + 2 on a GPU (18 on 16 cores), so
// pipeline 8 is `tune --jobs 6` (docs/log/PERFORMANCE.md, search efficiency, has both).
// Evaluations-to-target is the count at which an ok result with median <= optimum *
// (1 + target_pct/100) is first observed; failures count as evaluations. A seed that does
// not reach the target within the budget counts as not reached, and as budget + 1 in the
// percentiles. Seeds are seed, seed + 1, ...
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/records.hpp"
#include "search/recorded.hpp"
#include "core/problem.hpp"
#include "space/search_space.hpp"

namespace attntune::search {

// What replay needs of a recorded campaign: the space, and the result of each config.
struct Landscape {
  const SearchSpace* space = nullptr;
  Problem problem;
  std::string arch;
  std::function<const EvalRecord*(const Config&)> lookup;  // nullptr: never evaluated
};
// A view of a loaded campaign (which must outlive it).
Landscape landscape_of(const RecordedCampaign& campaign);

struct ReplayOptions {
  std::string strategy = "evo";
  int seeds = 30;
  std::uint64_t seed = 1;        // the first seed
  double target_pct = 2;
  std::uint64_t budget = 0;      // evaluations per seed; 0: the size of the space
  std::size_t pipeline = 8;      // proposals in flight
  std::vector<Config> warm_start;
  // A landscape that lacks some valid configs is refused, unless partial: then proposals it does not
  // hold are skipped (neither counted nor observed), i.e. the search runs on the recorded part.
  bool partial = false;
};

struct Percentiles {
  double median = 0;  // the mean of the two middle values for an even count
  double p90 = 0;     // nearest rank: the ceil(0.9 * n)-th smallest
};
Percentiles percentiles(std::vector<std::uint64_t> values);

struct ReplayStats {
  std::string strategy;
  std::vector<std::uint64_t> evals;  // per seed: evaluations to target, budget + 1 when not reached
  std::size_t reached = 0;           // seeds that reached the target
  double median_evals = 0, p90_evals = 0, reached_fraction = 0;
  double space_fraction = 0;  // median_evals / space_size
};

struct ReplaySummary {
  std::uint64_t space_size = 0;  // valid configs
  std::uint64_t recorded = 0;    // of which the landscape holds a result
  std::uint64_t budget = 0;
  double optimum_us = 0, target_us = 0;
};

// InputError for an unknown strategy, bad options, or (without partial) a landscape that lacks valid
// configs; WorkError when it holds no ok result.
ReplaySummary summarize(const Landscape& landscape, const ReplayOptions& options);
ReplayStats replay(const Landscape& landscape, const ReplayOptions& options);

}  // namespace attntune::search
