// The factories behind make_strategy (strategy.cpp), one per strategy file.
#pragma once
#include <memory>

#include "search/strategy.hpp"

namespace attntune::search {

std::unique_ptr<Strategy> make_evo(const StrategyContext& context);         // evo.cpp
std::unique_ptr<Strategy> make_random(const StrategyContext& context);      // random.cpp
std::unique_ptr<Strategy> make_exhaustive(const StrategyContext& context);  // exhaustive.cpp

}  // namespace attntune::search
