// ---- templates/export/launcher.cuh: the host side of an exported attntune file.
//
// `attntune export` appends this after the kernels and replaces each marker (a name between two
// pairs of at-signs) with integers, fixed identifiers (attntune_kN namespaces, the family's renamed
// entry point), the launch parts of the kernels' families (templates/export/launch_*.cuh, verbatim)
// and one C string literal of ASCII JSON with every quote, backslash and question mark escaped.
// Nothing else from the database reaches this code.
//
// One launcher for every family: argument checks, kernel selection, device checks, errors and
// provenance are here; what differs between families (the kernel's arguments after AttnParams,
// checks only that launch needs) is a family's launch part, which each kernel of the table names.
//
// The C entry points check everything the kernels assume before any CUDA call, and answer
// ATTNTUNE_UNSUPPORTED with a reason (attntune_last_error) rather than computing garbage:
//   - head_dim and is_causal: one of the kernels of this file was built for them;
//   - sizes: batch, heads, lengths >= 0, heads_q a multiple of heads_kv, grid limits;
//   - alignment: the kernels copy rows into shared memory 16 bytes at a time (cp.async, or TMA
//     whose tensor maps take 16-byte-aligned bases and strides), so q, k, v and out start on
//     16-byte boundaries and every stride is a multiple of 8 elements;
//   - strides >= 0, and out's strides never make two outputs share an element;
//   - softmax_scale finite and > 0 (the online softmax tracks the row maximum of the raw scores);
//   - what the kernel's launch part adds (TMA: strides under 2^40 bytes, work tiles in an int);
//   - the device: the kernel has code for it and fits its shared memory and registers.
// The element type cannot be checked through void pointers: it is the "dtype" of
// attntune_kernel_info().

// Host code only: the device passes of nvcc need the kernels alone (and with -arch=sm_90a, the
// compute_90 PTX pass sees no arch-specific kernel: see the kernel's #if).
#if !defined(__CUDA_ARCH__)

#define ATTNTUNE_UNSUPPORTED 1000
#if defined(_WIN32)
#define ATTNTUNE_API __declspec(dllexport)
#else
#define ATTNTUNE_API __attribute__((visibility("default")))
#endif

namespace attntune_export {

// The arguments of one call, after validation.
struct Args {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
  long long q_stride[3], k_stride[3], v_stride[3], o_stride[3];  // in elements: {batch, head, row}
  float scale;
};

// The device a call runs on, as far as launches need it.
struct Device {
  int index;
  int sm_count;      // for persistent grids
  int max_clusters;  // the call's kernel's clusters that fit on it at once (0: unknown, or no clusters)
};

struct Kernel;
// A family's checks beyond the shared ones (0, or unsupported(...)); NULL when it has none.
typedef int (*CheckFn)(const Kernel& kernel, const Args& args);
// Fills the kernel's arguments and launches: 0, unsupported(...) or cuda_failed(...).
typedef int (*LaunchFn)(const Kernel& kernel, const Args& args, const Device& device, cudaStream_t stream);

// One tuned kernel of this file: what it was built and tuned for, and how to launch it.
struct Kernel {
  const char* label;  // "d=128 bf16 causal=0, tuned for b=4,h=16,hkv=16,s=4096,sk=4096"
  const char* arch;   // what it was built and measured for: "sm_90", "sm_90a" (arch-specific)
  int head_dim, causal, bf16;
  int tuned_b, tuned_h, tuned_hkv, tuned_s, tuned_sk;
  int block_m, threads, smem_bytes;  // grid = (ceil(seqlen_q / block_m), heads_q, batch)
  int persistent;                    // 1: grid = min(work tiles above, SMs) CTAs that walk the tiles
                                     // (with clusters: whole ones, as many as fit at once)
  int tma_q_rows, tma_kv_rows;       // TMA box rows of Q's and of K's and V's tensor maps; 0: none
  int split_tail;                    // 1: a persistent grid's last partial round shared out by K/V
                                     // iterations, with a workspace this file keeps per device and stream
  int cluster;                       // CTAs per cluster along x, compiled into the kernel (2: each K/V
                                     // TMA load shared by two CTAs); the query blocks are padded to whole
                                     // clusters and a persistent grid is whole clusters
  const void* func;                  // the __global__ entry point
  CheckFn check;
  LaunchFn launch;
};

static thread_local char g_error[1024] = "";

#if defined(__GNUC__)
static int unsupported(const char* format, ...) __attribute__((format(printf, 1, 2)));
#endif
static int unsupported(const char* format, ...) {
  va_list ap;
  va_start(ap, format);
  std::vsnprintf(g_error, sizeof g_error, format, ap);
  va_end(ap);
  return ATTNTUNE_UNSUPPORTED;
}

static int cuda_failed(cudaError_t e, const char* call) {
  std::snprintf(g_error, sizeof g_error, "%s: %s (%s)", call, cudaGetErrorString(e), cudaGetErrorName(e));
  return static_cast<int>(e);
}

// The kernel's own AttnParams (each kernel has its namespace's copy of the one ABI in
// templates/common/attn_params.h), filled exactly as the tuner's evaluator fills it.
template <class Params>
Params make_params(const Args& a) {
  Params p;
  p.q = a.q;
  p.k = a.k;
  p.v = a.v;
  p.o = a.out;
  p.lse = a.lse;
  for (int i = 0; i < 3; ++i) {
    p.q_stride[i] = a.q_stride[i];
    p.k_stride[i] = a.k_stride[i];
    p.v_stride[i] = a.v_stride[i];
    p.o_stride[i] = a.o_stride[i];
  }
  p.batch = a.batch;
  p.heads_q = a.heads_q;
  p.heads_kv = a.heads_kv;
  p.seqlen_q = a.seqlen_q;
  p.seqlen_k = a.seqlen_k;
  p.q_per_kv = a.heads_q / a.heads_kv;
  p.scale = a.scale;
  p.scale_log2 = static_cast<float>(static_cast<double>(a.scale) * 1.4426950408889634);  // log2(e)
  return p;
}

// Query blocks of a call: ceil(seqlen_q / block_m), rounded up to whole clusters (the kernel
// leaves the padding blocks idle, so that a cluster's two tiles share one head's K and V).
static long long query_blocks(const Kernel& k, const Args& a) {
  const long long blocks = (a.seqlen_q + k.block_m - 1) / k.block_m;
  return (blocks + k.cluster - 1) / k.cluster * k.cluster;
}

// Work tiles of a call: (query blocks, heads_q, batch).
static long long work_tiles(const Kernel& k, const Args& a) { return query_blocks(k, a) * a.heads_q * a.batch; }

// CTAs of a persistent grid: one per work tile, at most one per SM in whole clusters, and no more
// clusters than fit on the device at once. The same rule as the tuner's (tuner/families).
static int persistent_ctas(const Kernel& k, const Args& a, const Device& device) {
  long long cap = device.sm_count / k.cluster * k.cluster;
  if (device.max_clusters > 0 && device.max_clusters * static_cast<long long>(k.cluster) < cap)
    cap = device.max_clusters * static_cast<long long>(k.cluster);
  if (cap < k.cluster) cap = k.cluster;  // a device of fewer SMs than a cluster still gets one
  const long long tiles = work_tiles(k, a);
  return static_cast<int>(tiles < cap ? tiles : cap);
}

// Launches with the kernel's grid (one CTA per work tile, or persistent_ctas) and the kernel
// arguments `params` (pointers to each, in order).
static int launch_kernel(const Kernel& k, const Args& a, const Device& device, void** params, cudaStream_t stream) {
  dim3 grid(static_cast<unsigned>(query_blocks(k, a)), static_cast<unsigned>(a.heads_q), static_cast<unsigned>(a.batch));
  if (k.persistent) grid = dim3(static_cast<unsigned>(persistent_ctas(k, a, device)), 1, 1);
  const cudaError_t e = cudaLaunchKernel(k.func, grid, dim3(static_cast<unsigned>(k.threads)), params,
                                         static_cast<size_t>(k.smem_bytes), stream);
  return e == cudaSuccess ? 0 : cuda_failed(e, "cudaLaunchKernel");
}

}  // namespace attntune_export

// The launch parts of this file's kernel families.
@@FAMILY_LAUNCHERS@@
namespace attntune_export {

// clang-format off
static const Kernel kKernels[] = {
@@KERNEL_TABLE@@
};
// clang-format on
static const int kKernelCount = static_cast<int>(sizeof(kKernels) / sizeof(kKernels[0]));

static const char kInfo[] =
@@INFO_JSON@@;

// The arch list nvcc compiled this file for ("800,900"), for the message when a device has none.
#define ATTNTUNE_STR2(...) #__VA_ARGS__
#define ATTNTUNE_STR(...) ATTNTUNE_STR2(__VA_ARGS__)
#ifdef __CUDA_ARCH_LIST__
static const char kBuiltFor[] = ATTNTUNE_STR(__CUDA_ARCH_LIST__);
#else
static const char kBuiltFor[] = "unknown";
#endif

static bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Checks a tensor's 3 strides; returns a reason or nullptr.
static const char* check_strides(const long long* s) {
  for (int i = 0; i < 3; ++i) {
    if (s[i] < 0) return "a stride is negative";
    if (s[i] % 8 != 0) return "a stride is not a multiple of 8 elements (16-byte rows)";
  }
  return nullptr;
}

// out must not have two (batch, head, row) positions sharing an element: sorted by stride, each
// dimension of extent > 1 must step past everything the smaller ones span (a row spans head_dim).
static bool out_overlaps(const long long* s, int batch, int heads, int rows, int head_dim) {
  long long stride[3] = {s[0], s[1], s[2]}, extent[3] = {batch, heads, rows};
  for (int i = 0; i < 3; ++i)
    for (int j = i + 1; j < 3; ++j)
      if (stride[j] < stride[i]) {
        long long t = stride[i]; stride[i] = stride[j]; stride[j] = t;
        t = extent[i]; extent[i] = extent[j]; extent[j] = t;
      }
  long long span = head_dim;
  for (int i = 0; i < 3; ++i) {
    if (extent[i] <= 1) continue;
    if (stride[i] < span) return true;
    span = stride[i] * (extent[i] - 1) + span;
  }
  return false;
}

static double log_ratio(double a, double b) {
  const double r = std::log((a > 0 ? a : 1) / (b > 0 ? b : 1));
  return r < 0 ? -r : r;
}

// The kernel for these arguments: among those built for head_dim and is_causal, the one tuned for
// the nearest sequence lengths (by ratio); ties go to the same GQA group size, then the nearest
// batch * heads, then the order of kernel_info's "kernels". -1 if none was built for them.
static int select_kernel(int head_dim, int is_causal, int batch, int heads_q, int heads_kv, int seqlen_q,
                         int seqlen_k) {
  int best = -1;
  double best_key[3] = {0, 0, 0};
  for (int i = 0; i < kKernelCount; ++i) {
    const Kernel& k = kKernels[i];
    if (k.head_dim != head_dim || k.causal != (is_causal ? 1 : 0)) continue;
    const int group = heads_kv > 0 ? heads_q / heads_kv : 1, tuned_group = k.tuned_h / k.tuned_hkv;
    const double key[3] = {log_ratio(seqlen_q, k.tuned_s) + log_ratio(seqlen_k, k.tuned_sk),
                           group == tuned_group ? 0.0 : 1.0,
                           log_ratio(static_cast<double>(batch) * heads_q, static_cast<double>(k.tuned_b) * k.tuned_h)};
    bool better = best < 0;
    for (int j = 0; j < 3 && !better; ++j) {
      if (key[j] < best_key[j] - 1e-12) better = true;
      else if (key[j] > best_key[j] + 1e-12) break;
    }
    if (better) {
      best = i;
      for (int j = 0; j < 3; ++j) best_key[j] = key[j];
    }
  }
  return best;
}

static int no_kernel(int head_dim, int is_causal) {
  char built[600] = "";
  size_t used = 0;
  for (int i = 0; i < kKernelCount && used + 1 < sizeof built; ++i) {
    const int n = std::snprintf(built + used, sizeof built - used, "%s%s", i ? "; " : "", kKernels[i].label);
    if (n < 0) break;
    used += static_cast<size_t>(n);
  }
  return unsupported("no kernel in this file for head_dim=%d is_causal=%d; it holds: %s", head_dim, is_causal,
                     built);
}

// Per device and kernel: 1 once the device was checked and the shared-memory limit raised; 1 + the
// kernel's max_clusters, once asked (0 before). Per device: its SM count, once read (0 before).
static const int kMaxDevices = 64;
static std::atomic<int> g_ready[kMaxDevices][sizeof(kKernels) / sizeof(kKernels[0])];
static std::atomic<int> g_max_clusters[kMaxDevices][sizeof(kKernels) / sizeof(kKernels[0])];
static std::atomic<int> g_sm_count[kMaxDevices];

// "sm_90a": code for that arch runs on compute capability 9.0 only (wgmma, setmaxnreg).
static bool arch_specific(const char* arch) {
  size_t n = 0;
  while (arch[n]) ++n;
  return n > 0 && arch[n - 1] == 'a';
}

// 90 for "sm_90a" (the table's archs are "sm_", digits and at most an "a").
static int arch_number(const char* arch) {
  int n = 0;
  for (const char* c = arch + 3; *c >= '0' && *c <= '9'; ++c) n = n * 10 + (*c - '0');
  return n;
}

// How many clusters of persistent kernel `index` fit on `device` at once, for its grid of whole
// clusters over the SMs (cudaOccupancyMaxActiveClusters: not cheap, so asked once per device and
// kernel; no cluster attribute, the dims are compiled into the kernel). 0 when the runtime cannot
// say (the SMs alone bound the grid then), and for kernels without clusters.
static int max_active_clusters(int device, int index, int sm_count) {
  const Kernel& k = kKernels[index];
  if (!k.persistent || k.cluster <= 1) return 0;
  const bool cached = device >= 0 && device < kMaxDevices;
  int n = cached ? g_max_clusters[device][index].load(std::memory_order_acquire) : 0;
  if (n > 0) return n - 1;
#if CUDART_VERSION >= 11080  // kernels with clusters load through TMA, which needs CUDA 12 anyway
  cudaLaunchConfig_t config = cudaLaunchConfig_t();
  config.gridDim = dim3(static_cast<unsigned>(sm_count / k.cluster * k.cluster), 1, 1);
  config.blockDim = dim3(static_cast<unsigned>(k.threads), 1, 1);
  config.dynamicSmemBytes = static_cast<size_t>(k.smem_bytes);
  if (cudaOccupancyMaxActiveClusters(&n, k.func, &config) != cudaSuccess || n < 0) {
    cudaGetLastError();  // ours, not the caller's: do not leave it behind
    n = 0;
  }
#else
  n = 0;
#endif
  if (cached) g_max_clusters[device][index].store(n + 1, std::memory_order_release);
  return n;
}

// The device's SM count (cached per device) and how many clusters of kernel `index` fit on it.
static int device_info(int device, int index, Device* out) {
  out->index = device;
  int sms = device >= 0 && device < kMaxDevices ? g_sm_count[device].load(std::memory_order_acquire) : 0;
  if (sms == 0) {
    const cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (e != cudaSuccess) return cuda_failed(e, "cudaDeviceGetAttribute(MultiProcessorCount)");
    if (sms < 1) sms = 1;
    if (device >= 0 && device < kMaxDevices) g_sm_count[device].store(sms, std::memory_order_release);
  }
  out->sm_count = sms;
  out->max_clusters = max_active_clusters(device, index, sms);
  return 0;
}

// Checks that kernel `index` runs on `device` and raises its dynamic shared-memory limit there.
static int prepare(int device, int index) {
  const Kernel& k = kKernels[index];
  if (device >= 0 && device < kMaxDevices && g_ready[device][index].load(std::memory_order_acquire)) return 0;
  int major = 0, minor = 0, optin = 0;
  cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (e != cudaSuccess) return cuda_failed(e, "cudaDeviceGetAttribute");
  if (arch_specific(k.arch) && major * 10 + minor != arch_number(k.arch))
    return unsupported("kernel %s is %s code, which runs only on GPUs of compute capability %d.%d; device %d is "
                       "sm_%d%d: export a kernel tuned for it",
                       k.label, k.arch, arch_number(k.arch) / 10, arch_number(k.arch) % 10, device, major, minor);
  cudaFuncAttributes attr;
  e = cudaFuncGetAttributes(&attr, k.func);
  if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction ||
      e == cudaErrorUnsupportedPtxVersion || e == cudaErrorInvalidPtx) {
    cudaGetLastError();  // ours, not the caller's: do not leave it behind
    if (arch_specific(k.arch))
      return unsupported(
          "kernel %s has no code for device %d (sm_%d%d): it uses %s-only instructions, so it runs only on "
          "that arch's GPUs, compiled with -arch=%s (this library: compute capabilities %s; %s)",
          k.label, device, major, minor, k.arch, k.arch, kBuiltFor, cudaGetErrorName(e));
    return unsupported(
        "kernel %s has no code for device %d (sm_%d%d): this library was compiled for compute "
        "capabilities %s; rebuild the .cu with -arch=sm_%d%d (%s)",
        k.label, device, major, minor, kBuiltFor, major, minor, cudaGetErrorName(e));
  }
  if (e != cudaSuccess) return cuda_failed(e, "cudaFuncGetAttributes");
  if (static_cast<long long>(k.smem_bytes) + static_cast<long long>(attr.sharedSizeBytes) > optin)
    return unsupported(
        "kernel %s needs %d bytes of shared memory per block; device %d (sm_%d%d) allows %d: export a "
        "kernel tuned for this GPU",
        k.label, k.smem_bytes + static_cast<int>(attr.sharedSizeBytes), device, major, minor, optin);
  if (attr.maxThreadsPerBlock < k.threads)
    return unsupported("kernel %s needs %d threads per block; device %d (sm_%d%d) runs it with at most %d", k.label,
                       k.threads, device, major, minor, attr.maxThreadsPerBlock);
  if (k.smem_bytes > 48 * 1024) {
    e = cudaFuncSetAttribute(k.func, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem_bytes);
    if (e != cudaSuccess) return cuda_failed(e, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  }
  if (device >= 0 && device < kMaxDevices) g_ready[device][index].store(1, std::memory_order_release);
  return 0;
}

static int forward(const Args& a, int is_causal, cudaStream_t stream) {
  // Sizes first: a zero-sized tensor may come with a NULL pointer.
  if (a.batch < 0 || a.heads_q < 0 || a.heads_kv < 0 || a.seqlen_q < 0 || a.seqlen_k < 0)
    return unsupported("negative size: batch=%d heads_q=%d heads_kv=%d seqlen_q=%d seqlen_k=%d", a.batch,
                       a.heads_q, a.heads_kv, a.seqlen_q, a.seqlen_k);
  if (is_causal != 0 && is_causal != 1) return unsupported("is_causal must be 0 or 1 (got %d)", is_causal);
  const int index = select_kernel(a.head_dim, is_causal, a.batch, a.heads_q, a.heads_kv, a.seqlen_q, a.seqlen_k);
  if (index < 0) return no_kernel(a.head_dim, is_causal);
  if (a.heads_q > 0 && (a.heads_kv <= 0 || a.heads_q % a.heads_kv != 0))
    return unsupported("heads_q (%d) must be a positive multiple of heads_kv (%d)", a.heads_q, a.heads_kv);
  if (a.batch > 65535 || a.heads_q > 65535)
    return unsupported("batch (%d) and heads_q (%d) must be at most 65535 (grid limits)", a.batch, a.heads_q);
  if (a.seqlen_q > (1 << 30) || a.seqlen_k > (1 << 30))
    return unsupported("sequence lengths must be at most 2^30 (got seqlen_q=%d seqlen_k=%d)", a.seqlen_q,
                       a.seqlen_k);
  if (!(a.scale > 0.f && a.scale <= 3.402823466e+38f))
    return unsupported("softmax_scale must be finite and > 0 (got %g); the usual value is 1/sqrt(head_dim)",
                       static_cast<double>(a.scale));
  if (a.batch == 0 || a.heads_q == 0 || a.seqlen_q == 0) return 0;  // nothing to compute

  const bool has_keys = a.seqlen_k > 0;
  if (!a.q || !a.out || (has_keys && (!a.k || !a.v)))
    return unsupported("q, k, v and out must not be NULL (k and v may be NULL only when seqlen_k is 0)");
  if (!aligned16(a.q) || !aligned16(a.k) || !aligned16(a.v) || !aligned16(a.out))
    return unsupported("q, k, v and out must be 16-byte aligned (q=%p k=%p v=%p out=%p)", a.q, a.k, a.v, a.out);
  if (a.lse && reinterpret_cast<std::uintptr_t>(a.lse) % 4 != 0)
    return unsupported("lse must be 4-byte aligned (got %p)", static_cast<void*>(a.lse));
  const struct {
    const char* name;
    const long long* stride;
  } tensors[] = {{"q_strides", a.q_stride}, {"k_strides", a.k_stride}, {"v_strides", a.v_stride},
                 {"o_strides", a.o_stride}};
  for (const auto& t : tensors)
    if (const char* why = check_strides(t.stride))
      return unsupported("%s {%lld, %lld, %lld}: %s", t.name, t.stride[0], t.stride[1], t.stride[2], why);
  if (out_overlaps(a.o_stride, a.batch, a.heads_q, a.seqlen_q, a.head_dim))
    return unsupported("o_strides {%lld, %lld, %lld} make outputs overlap for batch=%d heads_q=%d seqlen_q=%d "
                       "head_dim=%d",
                       a.o_stride[0], a.o_stride[1], a.o_stride[2], a.batch, a.heads_q, a.seqlen_q, a.head_dim);
  const Kernel& kernel = kKernels[index];
  if (kernel.check)
    if (const int r = kernel.check(kernel, a)) return r;

  int device = 0;
  const cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return cuda_failed(e, "cudaGetDevice");
  if (const int r = prepare(device, index)) return r;
  Device dev;
  if (const int r = device_info(device, index, &dev)) return r;
  return kernel.launch(kernel, a, dev, stream);
}

}  // namespace attntune_export

extern "C" {

// Returns 0 on success, ATTNTUNE_UNSUPPORTED (1000) when the arguments do not match what this file
// was compiled for (dtype, head_dim, causal, alignment), or a cudaError_t value.
ATTNTUNE_API int attntune_attention_forward(
    const void* q, const void* k, const void* v, void* out, float* lse, int batch, int heads_q, int heads_kv,
    int seqlen_q, int seqlen_k, int head_dim, const long long* q_strides, const long long* k_strides,
    const long long* v_strides, const long long* o_strides, float softmax_scale, int is_causal,
    cudaStream_t stream) {
  using namespace attntune_export;
  if (!q_strides || !k_strides || !v_strides || !o_strides)
    return unsupported("q_strides, k_strides, v_strides and o_strides must not be NULL (3 strides each)");
  Args a;
  a.q = q;
  a.k = k;
  a.v = v;
  a.out = out;
  a.lse = lse;
  a.batch = batch;
  a.heads_q = heads_q;
  a.heads_kv = heads_kv;
  a.seqlen_q = seqlen_q;
  a.seqlen_k = seqlen_k;
  a.head_dim = head_dim;
  for (int i = 0; i < 3; ++i) {
    a.q_stride[i] = q_strides[i];
    a.k_stride[i] = k_strides[i];
    a.v_stride[i] = v_strides[i];
    a.o_stride[i] = o_strides[i];
  }
  a.scale = softmax_scale;
  return forward(a, is_causal, stream);
}

// JSON: how this file was made (template, config, problem, GPU, arch, measured time, campaign, date).
ATTNTUNE_API const char* attntune_kernel_info(void) { return attntune_export::kInfo; }

// The reason for the last nonzero return of attntune_attention_forward on this thread.
ATTNTUNE_API const char* attntune_last_error(void) { return attntune_export::g_error; }

// Added to the contract's three: the index in attntune_kernel_info()'s "kernels" of the kernel a
// call with these sizes would run, or -1 if none of this file's kernels was built for them.
ATTNTUNE_API int attntune_select_kernel(int head_dim, int is_causal, int batch,
                                                                  int heads_q, int heads_kv, int seqlen_q,
                                                                  int seqlen_k) {
  if (is_causal != 0 && is_causal != 1) return -1;
  const int i = attntune_export::select_kernel(head_dim, is_causal, batch, heads_q, heads_kv, seqlen_q, seqlen_k);
  return i;
}

}  // extern "C"

#endif  // !defined(__CUDA_ARCH__)
