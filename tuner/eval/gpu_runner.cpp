#include "eval/gpu_runner.hpp"

#include <algorithm>

#include "families/family.hpp"

namespace attntune {

GpuRunner::GpuRunner(const SearchSpace& space, const Problem& problem, Store* store, GpuRunnerOptions options)
    : space_(space), problem_(problem), options_(options) {
  EvaluatorOptions eopts;
  eopts.device = options.device;
  eopts.deadline_floor_s = options.deadline_floor_s;
  eopts.cancel = options.cancel;
  evaluator_ = std::make_unique<Evaluator>(eopts);
  device_ = evaluator_->device();
  device_.arch = space_arch_for_device(space, device_.arch);
  BuildPoolOptions bopts;
  bopts.nvrtc_options = family_nvrtc_options(family_info(space.family()));
  bopts.jobs = options.jobs;
  bopts.compile_timeout = options.compile_timeout;
  bopts.store = store;
  pool_ = std::make_unique<BuildPool>(bopts);
}

// Enough builds queued that the GPU never waits for NVRTC, yet few enough that a strategy's
// proposals are not made long before the results they could learn from.
std::size_t GpuRunner::capacity() const { return static_cast<std::size_t>(std::max(2, pool_->jobs() + 2)); }

void GpuRunner::submit(const Config& config) {
  pool_->submit(BuildJob{config, render_kernel(space_, config, problem_, device_.arch), device_.arch});
}

std::optional<search::RunResult> GpuRunner::next() {
  std::optional<BuildOutcome> built = pool_->next();
  if (!built) return std::nullopt;
  search::RunResult out;
  out.config = built->job.config;
  out.source_hash = built->job.kernel.source_hash;
  if (built->build.status != "ok") {
    out.record = build_failure_record(built->build);
    return out;
  }
  EvalRequest req;
  req.kernel_name = built->job.kernel.kernel_name;
  req.cubin = std::move(built->build.cubin);
  req.geometry = launch_geometry(space_, out.config, problem_, device_.arch);
  req.problem = problem_;
  req.validation_seed = options_.validation_seed;
  req.timing_seed = options_.validation_seed + 0x9e3779b97f4a7c15ull;  // far from any validation seed
  req.timing = options_.timing;
  EvalOutcome r = evaluator_->evaluate(req);
  out.record = std::move(r.record);
  out.abandoned = r.abandoned;
  return out;
}

}  // namespace attntune
