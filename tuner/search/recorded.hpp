// A recorded campaign as an oracle: the result of every config it evaluated, looked up by config.
// `replay` runs strategies against it with no GPU; `tune --simulate` evaluates from it (tests, and
// trying a strategy on a real landscape); both need the campaign's space, which the store keeps.
#pragma once
#include <map>
#include <optional>
#include <string>

#include "core/config.hpp"
#include "core/record_stores.hpp"
#include "core/problem.hpp"
#include "space/search_space.hpp"

namespace attntune::search {

struct RecordedCampaign {
  std::string name;
  SearchSpace space;  // parsed from the text the campaign stored
  Problem problem;
  std::string arch, gpu, strategy;
  std::map<std::string, EvalRecord> results;  // config_str(config) -> its first search evaluation
  std::optional<double> best_us;              // the fastest ok median
  std::uint64_t space_size = 0;               // valid configs of the space for the problem and arch

  // InputError for an unknown campaign, one recorded without its space text (schema < 3), or one
  // of several templates (tune --space A --space B).
  static RecordedCampaign load(ResultReader& results, const std::string& campaign);
  const EvalRecord* find(const Config& c) const;  // nullptr when it was not evaluated
};

}  // namespace attntune::search
