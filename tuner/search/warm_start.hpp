// A warm start: the best configs of a problem already tuned, handed to a strategy
// (StrategyContext::warm_start) so it starts where that problem ended. `tune` takes them from the
// nearest tuned problem, `replay --warm-from` from a named campaign; both through this function and
// the same count, so a replay measures what tune does.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/record_stores.hpp"

namespace attntune::search {

// How many: evo's first batch (8 proposals in flight) is the warm start and nothing else, so the
// whole batch starts where the neighbour ended; more would delay evo's own proposals behind configs
// that are good only for the neighbour.
inline constexpr std::size_t kWarmStartConfigs = 8;

// The fastest `count` distinct configs of template `family` among the results `where` selects (its
// `top` is ignored), fastest first; `best_us`, when given, gets the first one's time (0: none).
std::vector<Config> warm_start_configs(ResultReader& results, BestQuery where, const std::string& family,
                                       std::size_t count = kWarmStartConfigs, double* best_us = nullptr);

}  // namespace attntune::search
