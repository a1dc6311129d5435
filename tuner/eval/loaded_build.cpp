#include "eval/loaded_build.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "templates/common/tma_encode.h"

namespace attntune {

template <class F>
int DriverApi::guarded(F&& call, attntune_plan::Why* why) {
  try {
    call();
    return 0;
  } catch (const cuda::CudaError& e) {
    std::snprintf(why->text, sizeof why->text, "%s", e.what());
    const int r = static_cast<int>(e.result());
    error_ = e;
    return r;
  }
}

int DriverApi::current_device(int* device, attntune_plan::Why* why) {
  return guarded(
      [&] {
        CUdevice d = 0;
        CU_CHECK(cuda::driver().cuCtxGetDevice(&d));
        *device = static_cast<int>(d);
      },
      why);
}

int DriverApi::sm_count(int device, int* sms, attntune_plan::Why* why) {
  return guarded(
      [&] {
        CU_CHECK(cuda::driver().cuDeviceGetAttribute(sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device));
      },
      why);
}

int DriverApi::smem_limits(int device, Function f, long long* optin, long long* static_bytes,
                           attntune_plan::Why* why) {
  return guarded(
      [&] {
        int limit = 0;
        CU_CHECK(cuda::driver().cuDeviceGetAttribute(&limit, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                                     device));
        *optin = limit;
        *static_bytes = f->static_smem_bytes();
      },
      why);
}

int DriverApi::set_max_dynamic_smem(Function f, unsigned bytes, attntune_plan::Why* why) {
  return guarded([&] { f->set_max_dynamic_smem(static_cast<int>(bytes)); }, why);
}

int DriverApi::allow_nonportable_cluster(Function f, attntune_plan::Why* why) {
  return guarded([&] { f->set_attribute(CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1); }, why);
}

// 0 for a kernel built without the cluster dims its plan names (its launch shows why), and when
// the driver errs: a context lost to an earlier fault fails the next call the same way, and the
// worker classifies it there.
int DriverApi::max_active_clusters(Function f, unsigned grid_x, unsigned block, unsigned smem) {
  try {
    return std::max(0, f->max_active_clusters({grid_x, 1, 1}, static_cast<int>(block), smem));
  } catch (const cuda::CudaError&) {
    return 0;
  }
}

int DriverApi::encode_map(const attntune_plan::TensorMap& m, void* out, attntune_plan::Why* why) {
  return guarded([&] { CU_CHECK(attntune_plan::encode_tensor_map(cuda::driver().cuTensorMapEncodeTiled, m, out)); },
                 why);
}

int DriverApi::relax_capture(int* saved, attntune_plan::Why* why) {
  return guarded(
      [&] {
        CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        CU_CHECK(cuda::driver().cuThreadExchangeStreamCaptureMode(&mode));
        *saved = static_cast<int>(mode);
      },
      why);
}

void DriverApi::restore_capture(int saved) {
  CUstreamCaptureMode mode = static_cast<CUstreamCaptureMode>(saved);
  cuda::driver().cuThreadExchangeStreamCaptureMode(&mode);
}

int DriverApi::allocate(unsigned long long bytes, void** out, attntune_plan::Why* why) {
  return guarded(
      [&] {
        buffers_.emplace_back(static_cast<std::size_t>(bytes));
        *out = reinterpret_cast<void*>(buffers_.back().ptr());
      },
      why);
}

void DriverApi::release(void* p) {
  std::erase_if(buffers_, [&](const cuda::DeviceBuffer& b) { return reinterpret_cast<void*>(b.ptr()) == p; });
}

int DriverApi::zero(void* p, unsigned long long bytes, attntune_plan::Why* why) {
  return guarded(
      [&] {
        const cuda::Stream own(CU_STREAM_NON_BLOCKING);
        CU_CHECK(cuda::driver().cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(p), 0, static_cast<std::size_t>(bytes),
                                                own.get()));
        own.synchronize();
      },
      why);
}

int DriverApi::launch(Function f, const attntune_plan::Launch& l, void** args, Stream stream,
                      attntune_plan::Why* why) {
  return guarded([&] { cuda::launch(*f, {l.grid[0], l.grid[1], l.grid[2]}, {l.block, 1, 1}, l.smem, stream, args); },
                 why);
}

LoadedBuild::LoadedBuild(const std::string& cubin, const LaunchSpec& spec)
    : module_(cubin), executor_(std::make_unique<DriverExecutor>()) {
  family_ = builtin_family(spec.plan).plan;
  const auto defs = plan_defines(spec.defines);
  attntune_plan::Why why;
  if (family_->load(defs.data(), static_cast<int>(defs.size()), consts_.bytes, &why))
    throw std::logic_error(fmt::format("{}: {}", spec.plan, why.text));
  for (int i = 0; i < family_->kernels; ++i) fns_.push_back(module_.function(family_->kernel_names[i]));
  for (const cuda::Function& f : fns_) funcs_.push_back(&f);
}

void LoadedBuild::check(int result, const attntune_plan::Why& why) const {
  if (result == 0) return;
  if (result == attntune_plan::kUnsupported) throw PlanRefused(why.text);
  if (std::optional<cuda::CudaError> e = executor_->api().take_error()) throw *e;
  throw std::logic_error(fmt::format("{}: the executor failed without a driver error ({}): {}", family_->name, result,
                                     why.text));
}

attntune_plan::Plan LoadedBuild::plan(const attntune_plan::Call& call) const {
  attntune_plan::Plan p = attntune_plan::empty_plan();
  attntune_plan::Why why;
  check(executor_->plan(*family_, consts_.bytes, funcs_.data(), call, &p, &why), why);
  return p;
}

void LoadedBuild::launch(const attntune_plan::Call& call, CUstream stream, bool optional_workspaces) const {
  attntune_plan::RunOptions options;
  options.optional_workspaces = optional_workspaces ? 1 : 0;
  attntune_plan::Why why;
  check(executor_->run(*family_, consts_.bytes, funcs_.data(), call, stream, &why, options), why);
}

}  // namespace attntune
