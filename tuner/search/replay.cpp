#include "search/replay.hpp"

#include <algorithm>
#include <cmath>
#include <deque>

#include <fmt/format.h>

#include "core/error.hpp"
#include "search/strategy.hpp"

namespace attntune::search {

Landscape landscape_of(const RecordedCampaign& campaign) {
  return {&campaign.space, campaign.problem, campaign.arch,
          [&campaign](const Config& c) { return campaign.find(c); }};
}

Percentiles percentiles(std::vector<std::uint64_t> values) {
  if (values.empty()) return {};
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  Percentiles p;
  p.median = n % 2 ? static_cast<double>(values[n / 2])
                   : (static_cast<double>(values[n / 2 - 1]) + static_cast<double>(values[n / 2])) / 2;
  const auto rank = static_cast<std::size_t>(std::ceil(0.9 * static_cast<double>(n)));
  p.p90 = static_cast<double>(values[std::max<std::size_t>(rank, 1) - 1]);
  return p;
}

ReplaySummary summarize(const Landscape& landscape, const ReplayOptions& options) {
  if (options.seeds < 1) throw InputError(fmt::format("replay: --seeds must be at least 1 (got {})", options.seeds));
  if (!(options.target_pct >= 0) || !std::isfinite(options.target_pct))
    throw InputError(fmt::format("replay: --target-pct must be a number >= 0 (got {})", options.target_pct));
  if (options.pipeline < 1) throw InputError("replay: --pipeline must be at least 1");
  ReplaySummary s;
  std::optional<double> optimum;
  landscape.space->for_each_valid(landscape.problem, landscape.arch, [&](const Config& c) {
    ++s.space_size;
    const EvalRecord* r = landscape.lookup(c);
    if (!r) return;
    ++s.recorded;
    if (r->status == "ok" && r->median_us && (!optimum || *r->median_us < *optimum)) optimum = r->median_us;
  });
  if (s.recorded < s.space_size && !options.partial)
    throw InputError(fmt::format(
        "replay: the campaign recorded {} of the {} valid configs; replay needs an exhaustive campaign "
        "(--partial replays the recorded part only)",
        s.recorded, s.space_size));
  if (!optimum) throw WorkError("replay: the campaign holds no ok result, so there is no optimum to reach");
  s.optimum_us = *optimum;
  s.target_us = *optimum * (1 + options.target_pct / 100);
  s.budget = options.budget ? options.budget : s.space_size;
  return s;
}

ReplayStats replay(const Landscape& landscape, const ReplayOptions& options) {
  const ReplaySummary summary = summarize(landscape, options);
  ReplayStats stats;
  stats.strategy = options.strategy;
  for (int k = 0; k < options.seeds; ++k) {
    const StrategyContext context{landscape.space, landscape.problem, landscape.arch,
                                  options.seed + static_cast<std::uint64_t>(k), options.warm_start};
    const std::unique_ptr<Strategy> strategy = make_strategy(options.strategy, context);
    std::deque<Config> in_flight;
    std::uint64_t evals = 0;
    bool reached = false;
    while (!reached && evals < summary.budget) {
      if (in_flight.size() < options.pipeline)
        for (Config& c : strategy->propose(options.pipeline - in_flight.size())) in_flight.push_back(std::move(c));
      if (in_flight.empty()) break;  // nothing left to propose
      const Config config = std::move(in_flight.front());
      in_flight.pop_front();
      const EvalRecord* r = landscape.lookup(config);
      if (!r) {
        if (options.partial) continue;
        throw WorkError(fmt::format("replay: {} proposed {}, which the campaign did not record", options.strategy,
                                    config_str(config)));
      }
      ++evals;
      const bool ok = r->status == "ok" && r->median_us;
      reached = ok && *r->median_us <= summary.target_us;
      strategy->observe({config, r->status, ok ? r->median_us : std::nullopt});
    }
    stats.evals.push_back(reached ? evals : summary.budget + 1);
    stats.reached += reached;
  }
  const Percentiles p = percentiles(stats.evals);
  stats.median_evals = p.median;
  stats.p90_evals = p.p90;
  stats.reached_fraction = static_cast<double>(stats.reached) / static_cast<double>(options.seeds);
  stats.space_fraction = p.median / static_cast<double>(summary.space_size);
  return stats;
}

}  // namespace attntune::search
