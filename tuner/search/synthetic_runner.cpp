#include "search/synthetic_runner.hpp"

#include <cmath>
#include <thread>

#include <fmt/format.h>

#include "core/hash.hpp"
#include "families/family.hpp"
#include "search/multi_family.hpp"

namespace attntune::search {

namespace {

// A number in [0, 1) from a string: the landscape's only source of randomness.
double unit(const std::string& key) {
  const std::string h = content_hash(key);
  return static_cast<double>(std::stoull(h.substr(0, 12), nullptr, 16)) / static_cast<double>(1ull << 48);
}

}  // namespace

DeviceInfo SyntheticRunner::device_info(int ordinal) {
  DeviceInfo d;
  d.name = "simulated GPU";
  d.arch = "sm_90";
  d.uuid = fmt::format("SIM-{}", ordinal);
  d.sm_count = 132;
  d.driver_version = "simulated";
  return d;
}

SyntheticRunner::SyntheticRunner(const std::vector<const SearchSpace*>& spaces, const Problem& problem, int ordinal,
                                 std::chrono::milliseconds delay, const std::atomic<bool>* cancel)
    : tagged_(spaces.size() > 1), problem_(problem), delay_(delay), cancel_(cancel), device_(device_info(ordinal)) {
  for (const SearchSpace* s : spaces) spaces_.emplace(s->family(), s);
  // One template: the campaign's arch is its build arch on this device (sm_90a for a Hopper-only
  // space on the simulated sm_90), as GpuRunner's is; the strategy enumerates configs at it.
  if (!tagged_ && !spaces_.empty()) device_.arch = arch_for(spaces_.begin()->first);
}

std::string SyntheticRunner::arch_for(const std::string& family) {
  const auto it = spaces_.find(family);
  return it == spaces_.end() ? device_.arch : space_arch_for_device(*it->second, device_.arch);
}

std::optional<RunResult> SyntheticRunner::next() {
  if (queue_.empty()) return std::nullopt;
  RunResult out;
  out.config = queue_.front();
  queue_.pop_front();
  if (!sleep_unless(cancel_, delay_)) {
    out.abandoned = true;
    return out;
  }
  auto [family, plain] = tagged_ ? untag_family(out.config) : std::pair{spaces_.begin()->first, out.config};
  const SearchSpace& space = *spaces_.at(family);
  out.source_hash = render_kernel(space, plain, problem_, arch_for(family)).source_hash;

  const std::string where = family + "|" + problem_.str();
  const std::string key = config_str(plain);
  const double fate = unit("fate|" + where + "|" + key);
  EvalRecord& r = out.record;
  if (fate < 0.06) {
    r.status = "resources";
    r.error = "simulated: too much shared memory";
  } else if (fate < 0.10) {
    r.status = "compile_error";
    r.error = "simulated: compile error";
  } else if (fate < 0.13) {
    r.status = "wrong_result";
    r.error = "simulated: max |err| 0.5 over the bound";
    r.max_abs_err = 0.5;
  } else {
    // Each parameter value scales the time by 1.0-1.5; a 3% term per config breaks ties.
    double factor = 1.0 + 0.03 * unit("config|" + where + "|" + key);
    for (const auto& [name, value] : plain) factor *= 1.0 + 0.5 * unit(fmt::format("{}|{}={}", where, name, value_str(value)));
    const double floor_us = problem_.flops() / 600e12 * 1e6;  // a 600 TFLOP/s kernel
    const double us = std::max(floor_us, 1.0) * factor;
    r.status = "ok";
    r.median_us = us;
    r.min_us = us * 0.995;
    r.max_us = us * 1.01;
    r.stdev_us = us * 0.003;
    r.count = 100;
    r.tflops = problem_.flops() / (us * 1e-6) / 1e12;
    r.max_abs_err = 1e-3;
    r.err_bound = 4e-3;
  }
  return out;
}

}  // namespace attntune::search
