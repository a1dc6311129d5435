// ---- templates/export/run_plan.cuh: the runtime-API adapter of the plan executor
// (templates/common/run_plan.h), and the executor of the exported library and the nvcc harnesses:
// run_plan() runs every call through it. What a call becomes, and the workspace and CUDA-graph
// policy, are run_plan.h's; this file says how the CUDA runtime does each step.
//
// Host code only, the CUDA runtime and (for tensor maps, CUDA 12 or newer) cuda.h's types. The
// driver's cuTensorMapEncodeTiled comes through the runtime (cudaGetDriverEntryPoint), so a
// library needs no -lcuda.
#include <cuda_runtime.h>

#include <atomic>

#include "../common/launch_plan.h"
#include "../common/run_plan.h"
#if CUDART_VERSION >= 12000
#include "../common/tma_encode.h"
#endif

// Internal to each library (an unnamed namespace): its executor's tables (workspaces, opt-ins,
// cluster occupancy) are its own, also when a process loads several exported libraries (static
// locals of inline functions would otherwise be one object process-wide, STB_GNU_UNIQUE, whatever
// RTLD_LOCAL says).
namespace attntune_run {
namespace {

using attntune_plan::Why;
using attntune_plan::kUnsupported;

inline int cuda_error(cudaError_t e, const char* call, Why* why) {
  std::snprintf(why->text, sizeof why->text, "%s: %s (%s)", call, cudaGetErrorString(e), cudaGetErrorName(e));
  return static_cast<int>(e);
}

// run_plan.h's Api through the CUDA runtime, on the current device. Allocations are never freed:
// the library keeps its workspaces for the process's life.
struct RuntimeApi {
  typedef const void* Function;  // a __global__ function's address
  typedef cudaStream_t Stream;

  int current_device(int* device, Why* why) {
    const cudaError_t e = cudaGetDevice(device);
    return e == cudaSuccess ? 0 : cuda_error(e, "cudaGetDevice", why);
  }

  int sm_count(int device, int* sms, Why* why) {
    const cudaError_t e = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device);
    return e == cudaSuccess ? 0 : cuda_error(e, "cudaDeviceGetAttribute(MultiProcessorCount)", why);
  }

  int smem_limits(int device, Function f, long long* optin, long long* static_bytes, Why* why) {
    int limit = 0;
    cudaError_t e = cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (e != cudaSuccess) return cuda_error(e, "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)", why);
    cudaFuncAttributes attr;
    e = cudaFuncGetAttributes(&attr, f);
    if (e != cudaSuccess) return cuda_error(e, "cudaFuncGetAttributes", why);
    *optin = limit;
    *static_bytes = static_cast<long long>(attr.sharedSizeBytes);
    return 0;
  }

  int set_max_dynamic_smem(Function f, unsigned bytes, Why* why) {
    const cudaError_t e = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    return e == cudaSuccess ? 0 : cuda_error(e, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)", why);
  }

  int allow_nonportable_cluster(Function f, Why* why) {
#if CUDART_VERSION >= 11080
    const cudaError_t e = cudaFuncSetAttribute(f, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    return e == cudaSuccess ? 0 : cuda_error(e, "cudaFuncSetAttribute(NonPortableClusterSizeAllowed)", why);
#else
    (void)f;
    (void)why;
    return 0;
#endif
  }

  int max_active_clusters(Function f, unsigned grid_x, unsigned block, unsigned smem) {
    int n = 0;
#if CUDART_VERSION >= 11080
    cudaLaunchConfig_t config = cudaLaunchConfig_t();
    config.gridDim = dim3(grid_x, 1, 1);
    config.blockDim = dim3(block, 1, 1);
    config.dynamicSmemBytes = smem;
    if (cudaOccupancyMaxActiveClusters(&n, f, &config) != cudaSuccess || n < 0) {
      cudaGetLastError();  // ours, not the caller's: do not leave it behind
      n = 0;
    }
#else
    (void)f;
    (void)grid_x;
    (void)block;
    (void)smem;
#endif
    return n;
  }

  int encode_map(const attntune_plan::TensorMap& m, void* out, Why* why) {
#if CUDART_VERSION >= 12000
    attntune_plan::EncodeTiledFn encode = nullptr;
    if (const int r = encoder(&encode, why)) return r;
    const CUresult r = attntune_plan::encode_tensor_map(encode, m, out);
    if (r != CUDA_SUCCESS)
      return attntune_plan::unsupported(
          why,
          "cuTensorMapEncodeTiled refused %s's tensor map (CUresult %d): base %p, dims {%llu, %llu, %llu, %llu}, "
          "strides {%llu, %llu, %llu} bytes, box {%u, %u}",
          m.name, static_cast<int>(r), m.base, m.dims[0], m.dims[1], m.dims[2], m.dims[3], m.strides[0], m.strides[1],
          m.strides[2], m.box[0], m.box[1]);
    return 0;
#else
    (void)out;
    return attntune_plan::unsupported(
        why, "%s's TMA tensor map needs CUDA 12.0 or newer; this library was built with CUDA %d", m.name,
        CUDART_VERSION);
#endif
  }

  int relax_capture(int* saved, Why* why) {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    const cudaError_t e = cudaThreadExchangeStreamCaptureMode(&mode);
    if (e != cudaSuccess) return cuda_error(e, "cudaThreadExchangeStreamCaptureMode", why);
    *saved = static_cast<int>(mode);
    return 0;
  }

  void restore_capture(int saved) {
    cudaStreamCaptureMode mode = static_cast<cudaStreamCaptureMode>(saved);
    cudaThreadExchangeStreamCaptureMode(&mode);
  }

  int allocate(unsigned long long bytes, void** out, Why* why) {
    const cudaError_t e = cudaMalloc(out, bytes);
    if (e == cudaSuccess) return 0;
    cudaGetLastError();  // not sticky: cleared, so that a call going on without it is not blamed for it
    return cuda_error(e, "cudaMalloc (workspace)", why);
  }

  void release(void* p) { cudaFree(p); }

  int zero(void* p, unsigned long long bytes, Why* why) {
    cudaStream_t own = nullptr;
    const char* call = "";
    cudaError_t e = cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking);
    if (e != cudaSuccess) call = "cudaStreamCreate";
    else if ((e = cudaMemsetAsync(p, 0, bytes, own)) != cudaSuccess) call = "cudaMemsetAsync (workspace)";
    else if ((e = cudaStreamSynchronize(own)) != cudaSuccess) call = "cudaStreamSynchronize (workspace)";
    if (own) cudaStreamDestroy(own);
    return e == cudaSuccess ? 0 : cuda_error(e, call, why);
  }

  int launch(Function f, const attntune_plan::Launch& l, void** args, Stream stream, Why* why) {
    const cudaError_t e = cudaLaunchKernel(f, dim3(l.grid[0], l.grid[1], l.grid[2]), dim3(l.block), args,
                                           static_cast<size_t>(l.smem), stream);
    return e == cudaSuccess ? 0 : cuda_error(e, "cudaLaunchKernel", why);
  }

 private:
#if CUDART_VERSION >= 12000
  // cuTensorMapEncodeTiled from the driver, looked up once.
  std::atomic<attntune_plan::EncodeTiledFn> encoder_{nullptr};

  int encoder(attntune_plan::EncodeTiledFn* out, Why* why) {
    attntune_plan::EncodeTiledFn fn = encoder_.load(std::memory_order_acquire);
    if (!fn) {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
      const cudaError_t e =
          cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found);
#else
      const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &found);
#endif
      if (e != cudaSuccess) return cuda_error(e, "cudaGetDriverEntryPoint(cuTensorMapEncodeTiled)", why);
      if (found != cudaDriverEntryPointSuccess || !p)
        return attntune_plan::unsupported(
            why,
            "the CUDA driver does not provide cuTensorMapEncodeTiled (query result %d): these kernels load through "
            "TMA tensor maps, which need a driver for CUDA 12.0 or newer",
            static_cast<int>(found));
      fn = reinterpret_cast<attntune_plan::EncodeTiledFn>(p);
      encoder_.store(fn, std::memory_order_release);
    }
    *out = fn;
    return 0;
  }
#endif
};

typedef attntune_plan::Executor<RuntimeApi> RuntimeExecutor;

// The library's executor.
inline RuntimeExecutor& executor() {
  static RuntimeExecutor e;
  return e;
}

// Runs one call: `family` with its loaded constants `consts` and its kernels `funcs` (the build's
// entry points, in the family's order) on the current device and `stream`. 0, kUnsupported or a
// cudaError_t value, with the reason in `why`.
inline int run_plan(const attntune_plan::LaunchFamily& family, const void* consts, const void* const* funcs,
                    const attntune_plan::Call& call, cudaStream_t stream, Why* why) {
  return executor().run(family, consts, funcs, call, stream, why);
}

}  // namespace
}  // namespace attntune_run
