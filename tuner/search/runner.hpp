// The runner seam: what a campaign evaluates candidates with. The GPU runner (eval/gpu_runner.hpp)
// renders, compiles in the build pool and validates/times in the GPU worker; the simulated runner
// (search/simulated_runner.hpp) answers from a recorded campaign, for tests and for trying a
// strategy on a real landscape without a GPU. The campaign loop (search/campaign.hpp) drives either.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <thread>
#include <optional>
#include <string>

#include "core/config.hpp"
#include "core/records.hpp"

namespace attntune::search {

struct RunResult {
  Config config;
  std::string source_hash;  // the rendered kernel's identity (the store's candidate)
  EvalRecord record;
  bool abandoned = false;   // cancelled while it ran: no result, must not be stored
};

class Runner {
 public:
  virtual ~Runner() = default;
  virtual const DeviceInfo& device() = 0;
  // The arch the kernels of `family` are built for (and the store files them under): device().arch
  // unless the runner serves several families (tune --space A --space B), whose archs may differ
  // (sm_90 for flash_fwd_mma, sm_90a for flash_fwd_wgmma on an H100). Such a runner takes configs
  // tagged with their family (search/multi_family.hpp) and hands them back tagged.
  virtual std::string arch_for(const std::string& family) {
    (void)family;
    return device().arch;
  }
  // How many candidates are worth keeping submitted ahead of the GPU (the compile pipeline's depth).
  virtual std::size_t capacity() const = 0;
  virtual std::size_t outstanding() const = 0;  // submitted, not yet returned by next()
  virtual void submit(const Config& config) = 0;
  // The next finished candidate, in completion order, waiting for one; nullopt when none is
  // outstanding. Throws only for what stops all evaluation (no GPU, no NVRTC).
  virtual std::optional<RunResult> next() = 0;
  // The campaign's final ranking starts: from here on `submit` re-times its top candidates, which
  // a runner may time longer than search candidates (GpuRunner: GpuRunnerOptions::final_timing).
  virtual void begin_final_timing() {}
  // The final ranking's screening starts (TuneOptions::final_screen): from here until
  // begin_final_timing, `submit` re-times the wider set of finalists once each, which a runner may
  // time longer than search candidates and shorter than the ranking's rounds (GpuRunner:
  // GpuRunnerOptions::screen_timing).
  virtual void begin_screen_timing() {}
};

// Sleeps `total`, waking every few milliseconds to look at `flag` (may be null): false, early, once
// it is set (looked at before each nap, not after the last). The simulated runners' time per
// candidate and the serve worker's idle wait.
inline bool sleep_unless(const std::atomic<bool>* flag, std::chrono::steady_clock::duration total) {
  const auto until = std::chrono::steady_clock::now() + total;
  for (auto now = std::chrono::steady_clock::now(); now < until; now = std::chrono::steady_clock::now()) {
    if (flag && flag->load()) return false;
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(std::chrono::milliseconds(5), until - now));
  }
  return true;
}

}  // namespace attntune::search
