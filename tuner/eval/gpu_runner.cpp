#include "eval/gpu_runner.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include <fmt/format.h>

#include "core/error.hpp"
#include "families/family.hpp"
#include "search/multi_family.hpp"

namespace attntune {

EvaluatorOptions evaluator_options(const GpuRunnerOptions& options) {
  EvaluatorOptions eopts;
  eopts.device = options.device;
  eopts.deadline_floor_s = options.deadline_floor_s;
  eopts.cancel = options.cancel;
  return eopts;
}

GpuRunner::GpuRunner(const SearchSpace& space, const Problem& problem, BuildCache* cache, GpuRunnerOptions options)
    : GpuRunner(std::vector<const SearchSpace*>{&space}, problem, cache, options) {}

GpuRunner::GpuRunner(const std::vector<const SearchSpace*>& spaces, const Problem& problem, BuildCache* cache,
                     GpuRunnerOptions options)
    : tagged_(spaces.size() > 1), problem_(problem), options_(options) {
  if (spaces.empty()) throw std::logic_error("GpuRunner: no search space");
  const std::vector<std::string> nvrtc_options = family_nvrtc_options(spaces[0]->family());
  for (const SearchSpace* s : spaces) {
    // One build pool serves every family: their NVRTC options (part of the cache key) must agree.
    if (family_nvrtc_options(s->family()) != nvrtc_options)
      throw std::logic_error(fmt::format("GpuRunner: templates {} and {} need different NVRTC options",
                                         spaces[0]->family(), s->family()));
    if (!families_.emplace(s->family(), SpaceOnArch{s, ""}).second)
      throw InputError(fmt::format("two search spaces of template '{}' in one campaign", s->family()));
  }
  if (options.evaluator) {
    kept_.evaluator = options.evaluator;
    kept_.evaluator->set_cancel(options.cancel);
  } else {
    own_evaluator_ = std::make_unique<Evaluator>(evaluator_options(options));
  }
  device_ = evaluator().device();
  for (auto& [name, f] : families_) f.arch = space_arch_for_device(*f.space, device_.arch);
  if (!tagged_) device_.arch = families_.begin()->second.arch;
  BuildPoolOptions bopts;
  bopts.nvrtc_options = nvrtc_options;
  bopts.jobs = options.jobs;
  bopts.compile_timeout = options.compile_timeout;
  bopts.store = cache;
  pool_ = std::make_unique<BuildPool>(bopts);
  depth_ = PipelineDepth(pool_->jobs());
}

std::string GpuRunner::arch_for(const std::string& family) {
  auto it = families_.find(family);
  return it == families_.end() ? device_.arch : it->second.arch;
}

std::pair<const GpuRunner::SpaceOnArch*, Config> GpuRunner::family_of(const Config& config) const {
  if (!tagged_) return {&families_.begin()->second, config};
  auto [family, rest] = search::untag_family(config);
  auto it = families_.find(family);
  if (it == families_.end())
    throw std::logic_error(fmt::format("GpuRunner: {} names no template of this campaign", config_str(config)));
  return {&it->second, std::move(rest)};
}

// Enough builds queued that the GPU never waits for NVRTC, yet few enough that a strategy's
// proposals are not made long before the results they could learn from (pipeline_depth.hpp).
std::size_t GpuRunner::capacity() const { return depth_.value(); }

void GpuRunner::submit(const Config& config) {
  const auto [family, plain] = family_of(config);
  // The job keeps the config as submitted (tagged when several families), to hand it back.
  pool_->submit(BuildJob{config, render_kernel(*family->space, plain, problem_, family->arch), family->arch});
}

std::optional<search::RunResult> GpuRunner::next() {
  std::optional<BuildOutcome> built = pool_->next();
  if (!built) return std::nullopt;
  if (!built->cache_hit) depth_.build_done(built->build.compile_ms);
  search::RunResult out;
  out.config = built->job.config;
  out.source_hash = built->job.kernel.source_hash;
  if (built->build.status != "ok") {
    out.record = build_failure_record(built->build);
    return out;
  }
  EvalRequest req;
  req.cubin = std::move(built->build.cubin);
  req.launch = built->job.kernel.launch;
  req.problem = problem_;
  req.validation_seed = options_.validation_seed;
  req.timing_seed = options_.validation_seed + 0x9e3779b97f4a7c15ull;  // far from any validation seed
  req.timing = mode_ == Mode::kFinal    ? options_.final_timing
               : mode_ == Mode::kScreen ? options_.screen_timing
                                        : options_.timing;
  const auto started = std::chrono::steady_clock::now();
  EvalOutcome r = evaluator().evaluate(req);
  depth_.evaluation_done(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
  out.record = std::move(r.record);
  out.abandoned = r.abandoned;
  return out;
}

}  // namespace attntune
