#include "search/strategy.hpp"

#include <fmt/format.h>

#include "core/error.hpp"
#include "search/strategies.hpp"

namespace attntune::search {

namespace {

struct Entry {
  const char* name;
  std::unique_ptr<Strategy> (*make)(const StrategyContext&);
};
constexpr Entry kStrategies[] = {{"evo", make_evo}, {"random", make_random}, {"exhaustive", make_exhaustive}};

}  // namespace

std::vector<std::string> strategy_names() {
  std::vector<std::string> names;
  for (const Entry& e : kStrategies) names.emplace_back(e.name);
  return names;
}

std::unique_ptr<Strategy> make_strategy(const std::string& name, const StrategyContext& context) {
  for (const Entry& e : kStrategies)
    if (name == e.name) return e.make(context);
  throw InputError(fmt::format("unknown strategy '{}' (known: {})", name, fmt::join(strategy_names(), ", ")));
}

}  // namespace attntune::search
