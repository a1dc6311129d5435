// The runner of real campaigns: each submitted config is rendered and queued in the build pool
// (NVRTC in build-worker processes, cached in the build cache), and each finished build is validated and
// timed by the evaluator (GPU worker process) as next() hands it back, while the other builds
// carry on. Build failures come back as compile_error / compile_timeout records.
#pragma once
#include <atomic>
#include <map>
#include <memory>

#include "core/record_stores.hpp"
#include "eval/build_pool.hpp"
#include "eval/evaluator.hpp"
#include "eval/pipeline_depth.hpp"
#include "search/runner.hpp"
#include "space/search_space.hpp"

namespace attntune {

struct GpuRunnerOptions {
  int device = 0;
  int jobs = 0;  // concurrent NVRTC builds; 0: one per core
  std::chrono::milliseconds compile_timeout{std::chrono::minutes(2)};
  double deadline_floor_s = 10;
  TimingLimits timing;
  // The final ranking's re-timings: each one samples for >= 1 s, spanning the swings of the
  // clock under the power cap that make ~20 ms timings of one config differ by 5-10% between
  // rounds (docs/log/PERFORMANCE.md run 53). 1 s, as tools/compare_sdpa.py times: at 0.3 s a
  // campaign's finalists still spread up to 4-7% over their rounds, and the gaps between them
  // differed by up to 2.2% from the gaps between their exports; at 1 s the spread is at most
  // 0.7-4.3% per campaign and the gaps agree within 1.5% (runs 69-72). The cost is ~35 s a
  // campaign (8 finalists x 6 rounds).
  TimingLimits final_timing{200, 2.0, 1.0};
  // The screening before the ranking (TuneOptions::final_screen): one re-timing of each of the wider
  // set of finalists, >= 0.3 s each (a finalist's rounds spread 0.6-3.3% at 0.3 s, run 53), where
  // search timings of the same configs read 4-13% fast and rank them only loosely among themselves
  // (run 244: the re-timed winners were the search's 2nd, 6th, 7th, 3rd, 1st and 1st).
  TimingLimits screen_timing{200, 2.0, 0.3};
  std::uint64_t validation_seed = 1;
  const std::atomic<bool>* cancel = nullptr;  // abandons the candidate on the GPU (second Ctrl-C)
  // A GPU worker kept across campaigns (the serve worker's, made with evaluator_options()): the
  // runner uses it, with its own `cancel`, instead of starting one. A worker's start (the driver,
  // a context and the reference kernels' NVRTC compile, ~2.7 s of CPU) was 3.2 s of a shipped-
  // database campaign's median 9.9 on an H100 (docs/design/shipped_db.md). Null: the runner
  // starts its own and stops it when it ends. The evaluator must outlive the runner.
  Evaluator* evaluator = nullptr;
};

// The options of the GPU worker a runner with `options` starts (device, deadline floor, cancel).
EvaluatorOptions evaluator_options(const GpuRunnerOptions& options);

class GpuRunner : public search::Runner {
 public:
  // Starts the GPU worker (EnvError without a GPU) to learn the device. Builds target its arch as
  // the space names it (space_arch_for_device: sm_90 -> sm_90a for a Hopper-only space), and
  // device() reports that arch, so the store files results under the arch they were built for.
  // `cache` holds the builds (the CLI's Store); may be null.
  GpuRunner(const SearchSpace& space, const Problem& problem, BuildCache* cache, GpuRunnerOptions options);
  // Several families in one campaign: one GPU worker and one build pool for all, each family built
  // for its own arch; configs come tagged with their family (search/multi_family.hpp), and device()
  // reports the device's own arch. InputError for two spaces of one family.
  GpuRunner(const std::vector<const SearchSpace*>& spaces, const Problem& problem, BuildCache* cache,
            GpuRunnerOptions options);
  const DeviceInfo& device() override { return device_; }
  std::string arch_for(const std::string& family) override;
  std::size_t capacity() const override;
  std::size_t outstanding() const override { return pool_->outstanding(); }
  void submit(const Config& config) override;
  std::optional<search::RunResult> next() override;
  void begin_final_timing() override { mode_ = Mode::kFinal; }
  void begin_screen_timing() override { mode_ = Mode::kScreen; }
  const std::string& arch() const { return device_.arch; }

 private:
  struct SpaceOnArch {  // one template's space and the arch its configs build for
    const SearchSpace* space;
    std::string arch;
  };
  // The space and arch of a submitted config, and the config as its family's renderer takes it.
  std::pair<const SpaceOnArch*, Config> family_of(const Config& config) const;

  std::map<std::string, SpaceOnArch> families_;
  bool tagged_ = false;  // several families: configs carry their family
  Problem problem_;
  GpuRunnerOptions options_;
  // A kept evaluator (GpuRunnerOptions::evaluator) forgets this campaign's cancel flag when the
  // runner ends, or when its constructor throws after taking it.
  struct KeptEvaluator {
    Evaluator* evaluator = nullptr;
    KeptEvaluator() = default;
    KeptEvaluator(const KeptEvaluator&) = delete;
    KeptEvaluator& operator=(const KeptEvaluator&) = delete;
    ~KeptEvaluator() {
      if (evaluator) evaluator->set_cancel(nullptr);
    }
  };
  std::unique_ptr<Evaluator> own_evaluator_;  // when GpuRunnerOptions::evaluator is null
  KeptEvaluator kept_;
  Evaluator& evaluator() { return own_evaluator_ ? *own_evaluator_ : *kept_.evaluator; }
  DeviceInfo device_;
  std::unique_ptr<BuildPool> pool_;
  PipelineDepth depth_{0};  // capacity(): from the measured build and evaluation times
  enum class Mode { kSearch, kScreen, kFinal };
  Mode mode_ = Mode::kSearch;  // what submit() times: search candidates, the screening, the ranking's rounds
};

}  // namespace attntune
