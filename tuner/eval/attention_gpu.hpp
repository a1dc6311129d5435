// Running attention candidates on the GPU: inputs, the trusted reference, validation by
// FlashAttention-2's criterion and event timing. Used by the GPU tests and the evaluator; knows
// nothing of the store or the search.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/driver.hpp"
#include "families/family.hpp"
#include "space/problem.hpp"
#include "templates/common/attn_params.h"

namespace attntune {

enum class Layout { kBHSD, kBSHD };  // [batch, heads, seq, dim] or [batch, seq, heads, dim]
const char* layout_name(Layout l);

// Device tensors of one problem in one layout, last dim contiguous.
struct AttnBuffers {
  AttnBuffers(const Problem& p, Layout layout);
  AttnParams params() const;  // pointers, strides, sizes and scale 1/sqrt(d)
  Problem problem;
  Layout layout;
  cuda::DeviceBuffer q, k, v, o, lse;
};

// FA2's criterion: max|out - ref32| <= 2 * max|lowp - ref32| + atol, every element written and
// finite, LSE within lse_tol of the reference's (and -inf exactly where no key is visible).
struct Verdict {
  std::string status;  // ok | wrong_result | nan_or_unwritten
  double max_abs_err = 0, err_bound = 0, lowp_err = 0, lse_err = 0;
  unsigned nonfinite = 0, lse_mismatch = 0;
  std::string detail() const;  // one line for logs
};
double criterion_atol(DType t);
constexpr double kLseTolerance = 1e-3;

// The reference kernels (templates/reference/reference.cu), NVRTC-compiled for the device.
class Reference {
 public:
  explicit Reference(const std::string& arch);
  // Fresh normal random inputs (mean 0, std 1) from `seed`; poisons o and lse with NaN.
  void fill(AttnBuffers& b, std::uint64_t seed) const;
  void poison_output(AttnBuffers& b) const;
  // Runs the fp32 and same-dtype references on b's inputs, then compares b's output with them.
  Verdict check(const AttnBuffers& b) const;
  // The reference output itself, (batch, heads, seq, dim) contiguous, and its LSE (for tests).
  std::vector<float> output(const AttnBuffers& b, bool lowp, std::vector<float>* lse = nullptr) const;

 private:
  friend class ReferenceCache;
  cuda::Module module_;
  cuda::Function fill_, ref_, compare_;
};

// The fp32 and same-dtype reference outputs of one set of inputs, computed once and then compared
// with any number of candidate outputs on those inputs (the evaluator's worker keeps one per
// problem). The naive reference is the slow part of a check; this runs it once per problem.
class ReferenceCache {
 public:
  // Runs both references on `inputs` (the fp32 one timed with events). With keep_host_copy, the
  // results are also kept in host memory for restore().
  ReferenceCache(const Reference& ref, const AttnBuffers& inputs, bool keep_host_copy = true);
  // Compares b's output with the cached results; b must hold the same problem and inputs.
  Verdict check(const AttnBuffers& b) const;
  // One launch of the fp32 reference kernel, in microseconds (a yardstick for deadlines).
  double reference_us() const { return reference_us_; }
  // Re-uploads the results from the host copy: after a candidate that may have written outside its
  // output (a failed check), so later candidates are not compared with what it scribbled.
  void restore();

 private:
  const Reference* ref_;
  Problem problem_;
  cuda::DeviceBuffer out32_, outlow_, lse32_;
  mutable cuda::DeviceBuffer stats_;
  std::vector<float> host_out32_, host_outlow_, host_lse32_;
  double reference_us_ = 0;
};

// A candidate kernel loaded and ready to launch.
class LoadedKernel {
 public:
  LoadedKernel(const std::string& cubin, const std::string& name, const LaunchGeometry& geometry);
  // Launch geometry for another problem size with the same config: grid_x = ceil(seqlen_q /
  // block_m), as the geometry's grid[0] (a persistent grid pads it to whole clusters here).
  void launch(const AttnParams& p, unsigned grid_x, CUstream stream = nullptr) const;
  void launch(const AttnBuffers& b) const;
  const cuda::Function& function() const { return fn_; }
  const LaunchGeometry& geometry() const { return geometry_; }

 private:
  cuda::Module module_;
  cuda::Function fn_;
  LaunchGeometry geometry_;
  unsigned sm_count_ = 0;  // the current device's, for a persistent grid
  unsigned max_clusters_ = 0;  // with clusters: how many fit on it at once (0: unknown)
  // split_tail's workspace and zeroed counters, grown on demand outside stream capture (the
  // evaluator launches once before it captures a graph).
  mutable cuda::DeviceBuffer split_ws_, split_count_;
  mutable cuda::DeviceBuffer tile_count_;  // dynamic_tiles' two counters, the same way
};

// Inputs for time_kernel: one set of random inputs (from `seed`), built once per problem and
// reused by every candidate of it. One set, reused launch after launch, as the peers are timed:
// warm in L2 when they fit, as a model's freshly written q/k/v are.
class TimingInputs {
 public:
  TimingInputs(const Reference& ref, const Problem& p, std::uint64_t seed);
  const Problem& problem() const { return buffers_.problem; }
  const AttnBuffers& buffers() const { return buffers_; }

 private:
  AttnBuffers buffers_;
};

struct TimingStats {
  double median_us = 0, min_us = 0, max_us = 0, stdev_us = 0;
  int count = 0;
};
// Timed as PyTorch's peers are (tools/compare_sdpa.py, shared/peers/sdpa_peers.py): back-to-back
// launches captured in a CUDA graph (20, or fewer but >= ~1 ms of work), ~50 ms of warm-up
// replays, then samples, each one replay between two events divided by its launches, until their
// median is stable within 1% (at least 10 samples) or max_reps samples, for at least min_seconds
// and at most ~max_seconds. Timing inputs are random (from `seed`), never constants: constant
// inputs make every softmax row flat and would flatter lazy rescaling.
TimingStats time_kernel(const LoadedKernel& k, const Reference& ref, const Problem& p, std::uint64_t seed,
                        int max_reps = 200, double max_seconds = 2.0, double min_seconds = 0);
// The same on inputs prepared beforehand (k's geometry must be for inputs.problem()).
TimingStats time_kernel(const LoadedKernel& k, const TimingInputs& inputs, int max_reps = 200, double max_seconds = 2.0,
                        double min_seconds = 0);

}  // namespace attntune
