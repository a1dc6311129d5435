#include "search/simulated_runner.hpp"

#include <thread>

#include <fmt/format.h>

#include "core/error.hpp"
#include "families/family.hpp"

namespace attntune::search {

SimulatedRunner::SimulatedRunner(const RecordedCampaign& recording, std::chrono::milliseconds delay,
                                 std::size_t capacity, const std::atomic<bool>* cancel)
    : recording_(recording), delay_(delay), capacity_(capacity < 1 ? 1 : capacity), cancel_(cancel) {
  device_.name = fmt::format("simulated {}", recording.gpu);
  device_.arch = recording.arch;
  device_.uuid = fmt::format("simulated:{}", recording.name);
}

void SimulatedRunner::submit(const Config& config) { queue_.push_back(config); }

std::optional<RunResult> SimulatedRunner::next() {
  if (queue_.empty()) return std::nullopt;
  RunResult out;
  out.config = queue_.front();
  queue_.pop_front();
  const auto until = std::chrono::steady_clock::now() + delay_;
  while (std::chrono::steady_clock::now() < until) {
    if (cancel_ && cancel_->load()) {
      out.abandoned = true;
      return out;
    }
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
        std::chrono::milliseconds(5), until - std::chrono::steady_clock::now()));
  }
  const EvalRecord* r = recording_.find(out.config);
  if (!r)
    throw InputError(fmt::format("simulated campaign '{}' has no result for {} (replay needs a recording of the "
                                 "whole space)",
                                 recording_.name, config_str(out.config)));
  out.record = *r;
  out.source_hash = render_kernel(recording_.space, out.config, recording_.problem, recording_.arch).source_hash;
  return out;
}

}  // namespace attntune::search
