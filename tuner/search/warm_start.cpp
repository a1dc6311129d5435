#include "search/warm_start.hpp"

#include <set>

namespace attntune::search {

std::vector<Config> warm_start_configs(ResultReader& results, BestQuery where, const std::string& family, std::size_t count,
                                       double* best_us) {
  std::vector<Config> out;
  if (best_us) *best_us = 0;
  if (count == 0) return out;
  // best() counts distinct configs per campaign over every template: ask for more until `count` of
  // this template are in, or the results run out.
  for (std::size_t top = count;; top *= 2) {
    where.top = static_cast<int>(top);
    const std::vector<BestRow> rows = results.best(where);
    out.clear();
    std::set<std::string> taken;
    for (const BestRow& r : rows)
      if (r.family == family && taken.insert(config_str(r.config)).second) {
        if (out.empty() && best_us) *best_us = r.median_us;
        out.push_back(r.config);
        if (out.size() == count) return out;
      }
    if (rows.size() < top || top >= (1u << 16)) return out;
  }
}

}  // namespace attntune::search
