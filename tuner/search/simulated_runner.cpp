#include "search/simulated_runner.hpp"

#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "core/error.hpp"
#include "families/family.hpp"
#include "search/multi_family.hpp"

namespace attntune::search {

SimulatedRunner::SimulatedRunner(const RecordedCampaign& recording, std::chrono::milliseconds delay,
                                 std::size_t capacity, const std::atomic<bool>* cancel)
    : SimulatedRunner(std::vector<const RecordedCampaign*>{&recording}, delay, capacity, cancel) {}

SimulatedRunner::SimulatedRunner(const std::vector<const RecordedCampaign*>& recordings,
                                 std::chrono::milliseconds delay, std::size_t capacity,
                                 const std::atomic<bool>* cancel)
    : tagged_(recordings.size() > 1), delay_(delay), capacity_(capacity < 1 ? 1 : capacity), cancel_(cancel) {
  if (recordings.empty()) throw std::logic_error("SimulatedRunner: no recording");
  for (const RecordedCampaign* r : recordings)
    if (!recordings_.emplace(r->space.family(), r).second)
      throw InputError(fmt::format("simulated campaigns '{}' and '{}' both record template '{}'",
                                   recordings_.at(r->space.family())->name, r->name, r->space.family()));
  const RecordedCampaign& first = *recordings_.begin()->second;
  device_.name = fmt::format("simulated {}", first.gpu);
  device_.arch = first.arch;
  device_.uuid = fmt::format("simulated:{}", first.name);
}

std::string SimulatedRunner::arch_for(const std::string& family) {
  auto it = recordings_.find(family);
  return it == recordings_.end() ? device_.arch : it->second->arch;
}

void SimulatedRunner::submit(const Config& config) { queue_.push_back(config); }

std::optional<RunResult> SimulatedRunner::next() {
  if (queue_.empty()) return std::nullopt;
  RunResult out;
  out.config = queue_.front();
  queue_.pop_front();
  if (!sleep_unless(cancel_, delay_)) {
    out.abandoned = true;
    return out;
  }
  auto [family, plain] = tagged_ ? untag_family(out.config) : std::pair{recordings_.begin()->first, out.config};
  auto it = recordings_.find(family);
  if (it == recordings_.end())
    throw std::logic_error(fmt::format("SimulatedRunner: {} names no recorded template", config_str(out.config)));
  const RecordedCampaign& recording = *it->second;
  const EvalRecord* r = recording.find(plain);
  if (!r)
    throw InputError(fmt::format("simulated campaign '{}' has no result for {} (replay needs a recording of the "
                                 "whole space)",
                                 recording.name, config_str(plain)));
  out.record = *r;
  out.source_hash = render_kernel(recording.space, plain, recording.problem, recording.arch).source_hash;
  return out;
}

}  // namespace attntune::search
