// A candidate build loaded into the worker's CUDA context and launched through the one plan executor
// (templates/common/run_plan.h) with a driver-API adapter: the same executor, workspace policy and
// CUDA-graph behaviour as the exported library's (templates/export/run_plan.cuh), so the time a
// campaign records is the exported kernel's.
#pragma once
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cuda/driver.hpp"
#include "families/family.hpp"
#include "templates/common/launch_plan.h"
#include "templates/common/run_plan.h"

namespace attntune {

// A launch plan that refused a call: the reason (the family's words). The worker records it as a
// launch_error; the exported library answers ATTNTUNE_UNSUPPORTED with it.
class PlanRefused : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// run_plan.h's Api through the driver this process loaded, on the context current to the thread.
// A failed call's CudaError is kept (error()) for the caller to throw, as the driver wrappers
// would have; what it allocates it owns, and frees with itself (with the build).
class DriverApi {
 public:
  typedef const cuda::Function* Function;
  typedef CUstream Stream;

  int current_device(int* device, attntune_plan::Why* why);
  int sm_count(int device, int* sms, attntune_plan::Why* why);
  int smem_limits(int device, Function f, long long* optin, long long* static_bytes, attntune_plan::Why* why);
  int set_max_dynamic_smem(Function f, unsigned bytes, attntune_plan::Why* why);
  int allow_nonportable_cluster(Function f, attntune_plan::Why* why);
  int max_active_clusters(Function f, unsigned grid_x, unsigned block, unsigned smem);
  int encode_map(const attntune_plan::TensorMap& m, void* out, attntune_plan::Why* why);
  int relax_capture(int* saved, attntune_plan::Why* why);
  void restore_capture(int saved);
  int allocate(unsigned long long bytes, void** out, attntune_plan::Why* why);
  void release(void* p);
  int zero(void* p, unsigned long long bytes, attntune_plan::Why* why);
  int launch(Function f, const attntune_plan::Launch& l, void** args, Stream stream, attntune_plan::Why* why);

  // The error of the last failed call; cleared by take_error.
  std::optional<cuda::CudaError> take_error() { return std::exchange(error_, std::nullopt); }

 private:
  // Runs `call` (driver wrappers that throw CudaError): 0, or the error's CUresult, kept.
  template <class F>
  int guarded(F&& call, attntune_plan::Why* why);

  std::vector<cuda::DeviceBuffer> buffers_;
  std::optional<cuda::CudaError> error_;
};

// Workspace sets (run_plan.h): one build, a device and each stream it is launched on (validation,
// timing, a test's captures).
using DriverExecutor = attntune_plan::Executor<DriverApi, attntune_plan::kMaxKernels, 64>;

// A candidate build loaded and ready to launch through its family's launch plan.
class LoadedBuild {
 public:
  LoadedBuild(const std::string& cubin, const LaunchSpec& spec);
  // The plan of `call` on the current device; PlanRefused when the family cannot serve it.
  attntune_plan::Plan plan(const attntune_plan::Call& call) const;
  // One call on `stream` (also inside a stream capture: run_plan.h's policy); PlanRefused when the
  // family refuses it, CudaError when the driver fails. optional_workspaces false: the plan's
  // optional workspaces are withheld (tests: the families' fallbacks without them stay correct).
  void launch(const attntune_plan::Call& call, CUstream stream = nullptr, bool optional_workspaces = true) const;
  const attntune_plan::LaunchFamily& family() const { return *family_; }
  int kernels() const { return static_cast<int>(fns_.size()); }
  const cuda::Function& function(int i) const { return fns_.at(static_cast<std::size_t>(i)); }

 private:
  // PlanRefused or the driver's error for a nonzero answer of the executor.
  void check(int result, const attntune_plan::Why& why) const;

  cuda::Module module_;
  std::vector<cuda::Function> fns_;                 // the family's entry points, in its order
  std::vector<DriverApi::Function> funcs_;          // their addresses: the executor's handles
  const attntune_plan::LaunchFamily* family_ = nullptr;
  attntune_plan::Consts consts_{};
  std::unique_ptr<DriverExecutor> executor_;  // its tables and workspaces: this build's
};

}  // namespace attntune
