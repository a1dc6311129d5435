// ---- templates/export/run_plan.cuh: the runtime-API executor of launch plans
// (templates/common/launch_plan.h). The exported library's launcher and the nvcc harnesses run
// every call through run_plan(): the family plans the call, this encodes the plan's TMA tensor
// maps, provides its workspaces, raises the kernels' shared-memory limits and launches them in
// order on the caller's stream. It decides nothing about a launch itself.
//
// Host code only, the CUDA runtime and (for tensor maps, CUDA 12 or newer) cuda.h's types. The
// driver's cuTensorMapEncodeTiled comes through the runtime (cudaGetDriverEntryPoint), so a
// library needs no -lcuda.
#include <cuda_runtime.h>

#include <atomic>
#include <mutex>

#include "../common/launch_plan.h"
#if CUDART_VERSION >= 12000
#include "../common/tma_encode.h"
#endif

// Internal to each library (an unnamed namespace): its workspaces and caches are its own, also when a
// process loads several exported libraries (static locals of inline functions would otherwise be
// one object process-wide, STB_GNU_UNIQUE, whatever RTLD_LOCAL says).
namespace attntune_run {
namespace {

using attntune_plan::Why;

constexpr int kUnsupported = 1000;  // ATTNTUNE_UNSUPPORTED

inline int cuda_error(cudaError_t e, const char* call, Why* why) {
  std::snprintf(why->text, sizeof why->text, "%s: %s (%s)", call, cudaGetErrorString(e), cudaGetErrorName(e));
  return static_cast<int>(e);
}

inline int unsupported(Why* why, const char* format, ...) {
  va_list ap;
  va_start(ap, format);
  std::vsnprintf(why->text, sizeof why->text, format, ap);
  va_end(ap);
  return kUnsupported;
}

// ---- tensor maps -------------------------------------------------------------------------------

#if CUDART_VERSION >= 12000
using attntune_plan::EncodeTiledFn;

// cuTensorMapEncodeTiled from the driver, looked up once.
inline int tma_encoder(EncodeTiledFn* out, Why* why) {
  static std::atomic<EncodeTiledFn> cached(nullptr);
  EncodeTiledFn fn = cached.load(std::memory_order_acquire);
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
      return unsupported(why,
                         "the CUDA driver does not provide cuTensorMapEncodeTiled (query result %d): these kernels "
                         "load through TMA tensor maps, which need a driver for CUDA 12.0 or newer",
                         static_cast<int>(found));
    fn = reinterpret_cast<EncodeTiledFn>(p);
    cached.store(fn, std::memory_order_release);
  }
  *out = fn;
  return 0;
}
#endif

// Encodes one map of a plan into `out` (128 bytes, 64-byte aligned).
inline int encode_map(const attntune_plan::TensorMap& m, void* out, Why* why) {
#if CUDART_VERSION >= 12000
  EncodeTiledFn encode = nullptr;
  if (const int r = tma_encoder(&encode, why)) return r;
  const CUresult r = attntune_plan::encode_tensor_map(encode, m, out);
  if (r != CUDA_SUCCESS)
    return unsupported(why,
                       "cuTensorMapEncodeTiled refused %s's tensor map (CUresult %d): base %p, dims {%llu, %llu, "
                       "%llu, %llu}, strides {%llu, %llu, %llu} bytes, box {%u, %u}",
                       m.name, static_cast<int>(r), m.base, m.dims[0], m.dims[1], m.dims[2], m.dims[3], m.strides[0],
                       m.strides[1], m.strides[2], m.box[0], m.box[1]);
  return 0;
#else
  (void)out;
  return unsupported(why, "%s's TMA tensor map needs CUDA 12.0 or newer; this library was built with CUDA %d", m.name,
                     CUDART_VERSION);
#endif
}

// ---- workspaces --------------------------------------------------------------------------------

// The workspaces of plans: one set per (kernel, device, stream) for the library, grown on demand,
// never freed (nor what they outgrow). `owner` names the kernel (its constants): kernels of other
// families or configs lay their workspaces out differently, so none shares another's. Kernels on one stream run in order, so each finds a zeroed
// workspace at zero (every launch leaves it so), and launches on other streams have their own.
// Inside a stream capture (a CUDA graph) they are allocated all the same, with cudaMalloc in
// relaxed capture mode (as PyTorch's allocator does), and zeroed on a stream of their own: graphs
// are often captured on a stream no call has used before (PyTorch's, for one). A captured graph
// keeps its stream's workspaces, so replay it on one stream at a time, apart from direct launches
// on the stream it was captured from. When the table is full an optional workspace is left out
// (the family launches without it, as correctly) and a required one refuses the call.
inline int workspaces(const void* owner, int device, cudaStream_t stream, const attntune_plan::Plan& plan, void** out,
                      Why* why) {
  using attntune_plan::kMaxWorkspaces;
  struct Slot {
    const void* owner;
    int device;
    cudaStream_t stream;
    void* ptr[kMaxWorkspaces];
    unsigned long long bytes[kMaxWorkspaces];
  };
  static Slot slots[1024];
  static int used = 0;
  static std::mutex mutex;
  for (int i = 0; i < kMaxWorkspaces; ++i) out[i] = nullptr;
  if (plan.workspaces == 0) return 0;
  std::lock_guard<std::mutex> lock(mutex);
  Slot* s = nullptr;
  for (int i = 0; i < used && !s; ++i)
    if (slots[i].owner == owner && slots[i].device == device && slots[i].stream == stream) s = &slots[i];
  if (!s && used < static_cast<int>(sizeof slots / sizeof slots[0])) {
    s = &slots[used++];
    *s = Slot();
    s->owner = owner;
    s->device = device;
    s->stream = stream;
  }
  if (!s) {
    for (int i = 0; i < plan.workspaces; ++i)
      if (!plan.workspace[i].optional)
        return unsupported(why, "the workspace table is full (%d kernel and stream pairs have used this library)",
                           used);
    return 0;
  }
  for (int i = 0; i < plan.workspaces; ++i) {
    const attntune_plan::Workspace& w = plan.workspace[i];
    if (s->bytes[i] < w.bytes) {
      // Outgrown buffers are kept, not freed: a launch still running, or a graph captured earlier,
      // may use them (zeroed ones stay at zero).
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      if (const cudaError_t e = cudaThreadExchangeStreamCaptureMode(&mode))
        return cuda_error(e, "cudaThreadExchangeStreamCaptureMode", why);
      void* p = nullptr;
      cudaStream_t zero = nullptr;  // its own stream: the caller's may be capturing
      const char* call = "";
      cudaError_t e = cudaMalloc(&p, w.bytes);
      if (e) call = "cudaMalloc (workspace)";
      if (!e && w.zeroed) {
        if ((e = cudaStreamCreateWithFlags(&zero, cudaStreamNonBlocking)) != cudaSuccess) call = "cudaStreamCreate";
        else if ((e = cudaMemsetAsync(p, 0, w.bytes, zero)) != cudaSuccess) call = "cudaMemsetAsync (workspace)";
        else if ((e = cudaStreamSynchronize(zero)) != cudaSuccess) call = "cudaStreamSynchronize (workspace)";
        if (zero) cudaStreamDestroy(zero);
      }
      if (e && p) cudaFree(p);
      cudaThreadExchangeStreamCaptureMode(&mode);  // back to the caller's mode
      if (e) return cuda_error(e, call, why);
      s->ptr[i] = p;
      s->bytes[i] = w.bytes;
    }
    out[i] = s->ptr[i];
  }
  return 0;
}

// ---- the device --------------------------------------------------------------------------------

constexpr int kMaxDevices = 64;

// The device's SM count, cached per device.
inline int sm_count(int device, int* out, Why* why) {
  static std::atomic<int> cached[kMaxDevices];
  const bool cache = device >= 0 && device < kMaxDevices;
  int sms = cache ? cached[device].load(std::memory_order_acquire) : 0;
  if (sms == 0) {
    const cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (e != cudaSuccess) return cuda_error(e, "cudaDeviceGetAttribute(MultiProcessorCount)", why);
    if (sms < 1) sms = 1;
    if (cache) cached[device].store(sms, std::memory_order_release);
  }
  *out = sms;
  return 0;
}

// Readies a kernel for a launch on the current device (once per device, kernel, size and cluster):
// raises its dynamic shared-memory limit to `smem` after checking it fits with the kernel's static
// shared memory, and for clusters of more than 8 CTAs (compiled in, non-portable) opts it in.
inline int allow_launch(int device, const void* func, unsigned smem, unsigned cluster, Why* why) {
  const bool nonportable = cluster > 8;
  if (smem <= 48 * 1024 && !nonportable) return 0;
  struct Entry {
    int device;
    const void* func;
    unsigned smem;
    bool nonportable;
  };
  static Entry entries[512];
  static int used = 0;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  for (int i = 0; i < used; ++i)
    if (entries[i].device == device && entries[i].func == func && entries[i].smem >= smem &&
        (entries[i].nonportable || !nonportable))
      return 0;
  cudaError_t e;
  if (smem > 48 * 1024) {
    int optin = 0;
    e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (e != cudaSuccess) return cuda_error(e, "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)", why);
    cudaFuncAttributes attr;
    e = cudaFuncGetAttributes(&attr, func);
    if (e != cudaSuccess) return cuda_error(e, "cudaFuncGetAttributes", why);
    if (static_cast<long long>(smem) + static_cast<long long>(attr.sharedSizeBytes) > optin)
      return unsupported(why, "a kernel needs %llu bytes of shared memory per block; device %d allows %d",
                         static_cast<unsigned long long>(smem) + attr.sharedSizeBytes, device, optin);
    e = cudaFuncSetAttribute(func, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return cuda_error(e, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)", why);
  }
#if CUDART_VERSION >= 11080
  if (nonportable) {
    e = cudaFuncSetAttribute(func, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (e != cudaSuccess) return cuda_error(e, "cudaFuncSetAttribute(NonPortableClusterSizeAllowed)", why);
  }
#endif
  if (used < static_cast<int>(sizeof entries / sizeof entries[0])) entries[used++] = Entry{device, func, smem, nonportable};
  return 0;
}

struct DeviceContext {
  int device;
  const void* const* funcs;
};

// How many clusters of a kernel fit on the device at once (cudaOccupancyMaxActiveClusters: not
// cheap, so asked once per device and kernel; the cluster dims are compiled into the kernel). 0
// when the runtime cannot say.
inline int max_active_clusters(const void* ctx, int kernel, unsigned grid_x, unsigned cluster, unsigned block,
                               unsigned smem) {
  const DeviceContext& c = *static_cast<const DeviceContext*>(ctx);
  const void* func = c.funcs[kernel];
  struct Entry {
    int device;
    const void* func;
    int n;
  };
  static Entry entries[512];
  static int used = 0;
  static std::mutex mutex;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (int i = 0; i < used; ++i)
      if (entries[i].device == c.device && entries[i].func == func) return entries[i].n;
  }
  int n = 0;
  // The occupancy query needs the kernel allowed its dynamic shared memory (above 48 KiB it answers
  // an error, which read as 0 would size the grid by the SMs alone) and its cluster size first.
  Why ignored;
  if (allow_launch(c.device, func, smem, cluster, &ignored) != 0) return 0;
#if CUDART_VERSION >= 11080
  cudaLaunchConfig_t config = cudaLaunchConfig_t();
  config.gridDim = dim3(grid_x, 1, 1);
  config.blockDim = dim3(block, 1, 1);
  config.dynamicSmemBytes = smem;
  if (cudaOccupancyMaxActiveClusters(&n, func, &config) != cudaSuccess || n < 0) {
    cudaGetLastError();  // ours, not the caller's: do not leave it behind
    n = 0;
  }
#else
  (void)grid_x;
  (void)block;
  (void)smem;
#endif
  std::lock_guard<std::mutex> lock(mutex);
  if (used < static_cast<int>(sizeof entries / sizeof entries[0])) entries[used++] = Entry{c.device, func, n};
  return n;
}

// ---- the executor ------------------------------------------------------------------------------

// Runs one call: `family` with its loaded constants `consts` and its kernels `funcs` (the build's
// entry points, in the family's order) on the current device and `stream`. 0, kUnsupported or a
// cudaError_t value, with the reason in `why`.
inline int run_plan(const attntune_plan::Family& family, const void* consts, const void* const* funcs,
                    const attntune_plan::Call& call, cudaStream_t stream, Why* why) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device)) return cuda_error(e, "cudaGetDevice", why);
  DeviceContext ctx{device, funcs};
  attntune_plan::Device dev;
  dev.max_active_clusters = &max_active_clusters;
  dev.ctx = &ctx;
  if (const int r = sm_count(device, &dev.sm_count, why)) return r;
  attntune_plan::Plan plan;
  if (family.plan(consts, call, dev, &plan, why)) return kUnsupported;
  struct alignas(64) MapBytes {
    unsigned char bytes[attntune_plan::kTensorMapBytes];
  };
  MapBytes maps[attntune_plan::kMaxTensorMaps];
  attntune_plan::Resources res;
  for (int i = 0; i < plan.maps; ++i) {
    if (const int r = encode_map(plan.map[i], maps[i].bytes, why)) return r;
    res.map[i] = maps[i].bytes;
  }
  for (int i = plan.maps; i < attntune_plan::kMaxTensorMaps; ++i) res.map[i] = nullptr;
  if (const int r = workspaces(consts, device, stream, plan, res.workspace, why)) return r;
  for (int i = 0; i < plan.launches; ++i) {
    const attntune_plan::Launch& l = plan.launch[i];
    if (l.grid[0] == 0 || l.grid[1] == 0 || l.grid[2] == 0) continue;  // nothing to compute
    const void* func = funcs[l.kernel];
    if (const int r = allow_launch(device, func, l.smem, l.cluster, why)) return r;
    attntune_plan::Args args;
    if (family.bind(consts, call, plan, res, i, &args, why)) return kUnsupported;
    const cudaError_t e = cudaLaunchKernel(func, dim3(l.grid[0], l.grid[1], l.grid[2]), dim3(l.block), args.ptr,
                                           static_cast<size_t>(l.smem), stream);
    if (e != cudaSuccess) return cuda_error(e, "cudaLaunchKernel", why);
  }
  return 0;
}

}  // namespace
}  // namespace attntune_run
