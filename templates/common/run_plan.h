// ---- templates/common/run_plan.h: the one executor of launch plans (launch_plan.h).
//
// Every launch of a tuned kernel goes through Executor<Api>: the tuner's worker, which validates
// and times candidates (tuner/eval/loaded_build.cpp: the driver API), every exported library
// (templates/export/run_plan.cuh: the runtime API, flattened into each file) and the nvcc
// harnesses (tests/harness/, through run_plan.cuh). So the time a campaign records comes from the
// code a user runs, and a launch feature is written here once. Per call:
//   1. the family plans it for the current device: its SM count, and how many clusters of a
//      kernel fit at once (asked once per device and kernel, after the kernel is allowed its
//      shared memory and cluster size: the query errs otherwise);
//   2. this encodes the plan's TMA tensor maps and provides its workspaces (below);
//   3. for each launch in order: an empty grid is skipped (nothing to compute); the kernel is
//      readied (once per device and kernel: its dynamic shared memory above 48 KiB, checked
//      against the device's opt-in limit with the kernel's static shared memory; clusters of more
//      than 8 CTAs, non-portable); the family binds the launch's arguments; it is launched on the
//      caller's stream.
// It decides nothing about a launch itself.
//
// Workspaces and CUDA graphs: the one policy of every executor.
//   - A workspace set per (build, device, stream): `owner` names the build (its constants: builds
//     of other families or configs lay their workspaces out differently), and launches on one
//     stream run in order, so each finds a zeroed workspace at zero (every launch leaves it so).
//     Kept by index from call to call and grown on demand; a zeroed one is zeroed when it is
//     allocated, never again.
//   - Allocated also inside a stream capture: the thread is switched to relaxed capture mode for
//     the allocation (as PyTorch's allocator does) and a zeroed workspace is zeroed on a stream of
//     the adapter's own, waited for, so that nothing of it is captured and it is zero before the
//     caller's launch is enqueued. So a first call inside a capture works, on a stream no call has
//     used before (PyTorch captures on such a stream), in the export and in the tuner alike. A
//     captured graph keeps its stream's workspaces: replay it on one stream at a time, apart from
//     direct launches on the stream it was captured from.
//   - Never freed by the executor: what a workspace outgrows is kept too (a launch still running,
//     or a graph captured earlier, may use it). The adapter owns what it allocated: an exported
//     library keeps it for the process's life, the worker frees it with the build, a harness with
//     its call (their adapters' destructors).
//   - An optional workspace is left out (the family's bind launches without it, as correctly)
//     when the table of workspace sets is full, or when the caller asks (RunOptions: the GPU
//     tests check the families' fallbacks); a required one then refuses the call.
//
// The adapter, Api, is the CUDA API underneath, and owns nothing of the policy above. It has
// types Function (a kernel) and Stream, and these members, each returning 0 or the API's error
// (a nonzero code other than kUnsupported) with the failed call described in `why`:
//   int current_device(int* device, Why* why);
//   int sm_count(int device, int* sms, Why* why);
//   int smem_limits(int device, Function f, long long* optin, long long* static_bytes, Why* why);
//       the device's opt-in limit of shared memory per block, and the kernel's static shared memory
//   int set_max_dynamic_smem(Function f, unsigned bytes, Why* why);
//   int allow_nonportable_cluster(Function f, Why* why);
//   int max_active_clusters(Function f, unsigned grid_x, unsigned block, unsigned smem);
//       a count, 0 when the API cannot say (its error is the adapter's to clear)
//   int encode_map(const TensorMap& m, void* out, Why* why);   may also answer kUnsupported
//   int relax_capture(int* saved, Why* why);   the thread's capture mode to relaxed; *saved the old
//   void restore_capture(int saved);
//   int allocate(unsigned long long bytes, void** out, Why* why);
//   void release(void* p);   what allocate made, when zeroing it failed
//   int zero(void* p, unsigned long long bytes, Why* why);   on a stream of its own, waited for
//   int launch(Function f, const Launch& l, void** args, Stream stream, Why* why);
//
// Plain C++17 and header-only, as launch_plan.h: no CUDA header, no exceptions, no allocation, no
// function-local statics (an executor is an object: an exported library keeps its own in an
// unnamed namespace, so two libraries in one process never share one).
#ifndef ATTNTUNE_RUN_PLAN_H
#define ATTNTUNE_RUN_PLAN_H

#include <atomic>
#include <mutex>

#include "launch_plan.h"

namespace attntune_plan {

// What run answers for a call the family's plan or bind refuses, or that the device cannot take
// (the exported library's ATTNTUNE_UNSUPPORTED); the reason is in `why`. Neither the runtime's
// nor the driver's error codes take this value.
constexpr int kUnsupported = 1000;

#if defined(__GNUC__)
inline int unsupported(Why* why, const char* format, ...) __attribute__((format(printf, 2, 3)));
#endif
// Fills `why` and returns kUnsupported.
inline int unsupported(Why* why, const char* format, ...) {
  if (why) {
    va_list ap;
    va_start(ap, format);
    std::vsnprintf(why->text, sizeof why->text, format, ap);
    va_end(ap);
  }
  return kUnsupported;
}

// Shared memory a kernel may use without opting in: static and dynamic together.
constexpr unsigned kDefaultSmemBytes = 48 * 1024;
// Clusters larger than this are non-portable: a kernel must opt in.
constexpr unsigned kPortableClusterCtas = 8;

struct RunOptions {
  // 0: the plan's optional workspaces are withheld, as when they cannot be provided (tests: the
  // families' fallbacks without them must stay correct).
  int optional_workspaces = 1;
};

// A call made ready to launch: its plan for the device, its tensor maps encoded (res.map points
// into maps) and its workspaces. Not copyable: res points into it.
struct Prepared {
  int device = 0;
  Plan plan;
  struct alignas(64) MapBytes {
    unsigned char bytes[kTensorMapBytes];
  };
  MapBytes maps[kMaxTensorMaps];
  Resources res;
  Prepared() : plan(empty_plan()), res() {}
  Prepared(const Prepared&) = delete;
  Prepared& operator=(const Prepared&) = delete;
};

// kKernels: (device, kernel) pairs whose opt-ins and cluster occupancy are remembered (past that,
// asked again each call); kWorkspaceSets: (build, device, stream) workspace sets.
template <class Api, int kKernels = 512, int kWorkspaceSets = 1024>
class Executor {
 public:
  typedef typename Api::Function Function;
  typedef typename Api::Stream Stream;

  Api& api() { return api_; }

  // The plan of `call` for `family` with its loaded constants `consts` and kernels `funcs` (the
  // build's entry points, in the family's order) on the current device: 0, kUnsupported when the
  // family refuses it, or the API's error; the reason in `why`.
  int plan(const LaunchFamily& family, const void* consts, const Function* funcs, const Call& call, Plan* out, Why* why) {
    int device = 0;
    return plan_on(family, consts, funcs, call, out, &device, why);
  }

  // Steps 1 and 2 of a call (above) into *out.
  int prepare(const LaunchFamily& family, const void* consts, const Function* funcs, const Call& call, Stream stream,
              Prepared* out, Why* why, const RunOptions& options = RunOptions()) {
    if (const int r = plan_on(family, consts, funcs, call, &out->plan, &out->device, why)) return r;
    const Plan& plan = out->plan;
    for (int i = 0; i < kMaxTensorMaps; ++i) out->res.map[i] = nullptr;
    // The maps over the call's tensors, then the workspaces, then the maps over those
    // (TensorMap::workspace; none over a workspace left out).
    for (int i = 0; i < plan.maps; ++i) {
      if (plan.map[i].workspace > 0) continue;
      if (const int r = api_.encode_map(plan.map[i], out->maps[i].bytes, why)) return r;
      out->res.map[i] = out->maps[i].bytes;
    }
    if (const int r = workspaces(consts, out->device, stream, plan, options, out->res.workspace, why)) return r;
    for (int i = 0; i < plan.maps; ++i) {
      TensorMap m = plan.map[i];
      const int w = m.workspace - 1;
      if (w < 0 || w >= plan.workspaces || !out->res.workspace[w]) continue;
      m.base = static_cast<const char*>(out->res.workspace[w]) + reinterpret_cast<unsigned long long>(m.base);
      if (const int r = api_.encode_map(m, out->maps[i].bytes, why)) return r;
      out->res.map[i] = out->maps[i].bytes;
    }
    return 0;
  }

  // Step 3: the prepared call's kernels, in order, on `stream`.
  int launch(const LaunchFamily& family, const void* consts, const Function* funcs, const Call& call,
             const Prepared& prepared, Stream stream, Why* why) {
    const Plan& plan = prepared.plan;
    for (int i = 0; i < plan.launches; ++i) {
      const Launch& l = plan.launch[i];
      if (l.grid[0] == 0 || l.grid[1] == 0 || l.grid[2] == 0) continue;  // nothing to compute
      const Function f = funcs[l.kernel];
      if (const int r = allow_launch(prepared.device, f, l.smem, l.cluster, why)) return r;
      Args args;
      if (family.bind(consts, call, plan, prepared.res, i, &args, why)) return kUnsupported;
      if (const int r = api_.launch(f, l, args.ptr, stream, why)) return r;
    }
    return 0;
  }

  // One call, start to end: 0, kUnsupported or the API's error, with the reason in `why`.
  int run(const LaunchFamily& family, const void* consts, const Function* funcs, const Call& call, Stream stream, Why* why,
          const RunOptions& options = RunOptions()) {
    Prepared prepared;
    if (const int r = prepare(family, consts, funcs, call, stream, &prepared, why, options)) return r;
    return launch(family, consts, funcs, call, prepared, stream, why);
  }

  // Readies kernel `f` on `device` for launches of `smem` bytes of dynamic shared memory in
  // clusters of `cluster` CTAs (step 3's opt-ins; once per device, kernel and need).
  // Without an opt-in a kernel may launch with 48 KiB of shared memory in all, static and dynamic:
  // 48 KiB dynamic beside 1 KiB static fails (invalid argument; an H100, 2026-12-06, flash_decode
  // over an FP8 cache at 5 stages of 32 keys). So any dynamic shared memory is held against the
  // kernel's own allowance, its static bytes asked once per device and kernel.
  int allow_launch(int device, Function f, unsigned smem, unsigned cluster, Why* why) {
    if (smem == 0 && cluster <= kPortableClusterCtas) return 0;
    std::lock_guard<std::mutex> lock(mutex_);
    return allow_locked(device, f, smem, cluster, why);
  }

 private:
  struct KernelState {
    int device;
    Function f;
    long long smem;   // dynamic shared memory allowed; -1 until the kernel's static bytes are known
    int nonportable;  // opted into clusters of more than kPortableClusterCtas
    int clusters;     // max active clusters; -1 not asked yet
  };
  struct WorkspaceSet {
    const void* owner;
    int device;
    Stream stream;
    void* ptr[kMaxWorkspaces];
    unsigned long long bytes[kMaxWorkspaces];
  };
  struct ClusterQuery {
    Executor* self;
    int device;
    const Function* funcs;
  };

  int plan_on(const LaunchFamily& family, const void* consts, const Function* funcs, const Call& call, Plan* out,
              int* device, Why* why) {
    if (const int r = api_.current_device(device, why)) return r;
    Device dev;
    if (const int r = sm_count(*device, &dev.sm_count, why)) return r;
    ClusterQuery query = {this, *device, funcs};
    dev.max_active_clusters = &max_active_clusters;
    dev.ctx = &query;
    return family.plan(consts, call, dev, out, why) ? kUnsupported : 0;
  }

  int sm_count(int device, int* out, Why* why) {
    const bool cache = device >= 0 && device < kMaxDevices;
    int sms = cache ? sms_[device].load(std::memory_order_acquire) : 0;
    if (sms == 0) {
      if (const int r = api_.sm_count(device, &sms, why)) return r;
      if (sms < 1) sms = 1;
      if (cache) sms_[device].store(sms, std::memory_order_release);
    }
    *out = sms;
    return 0;
  }

  // Device::max_active_clusters: how many clusters of a kernel fit at once, asked once per device
  // and kernel (the cluster dims are compiled into the kernel, its shared memory fixed by its
  // build); 0 when the API cannot say, or the kernel cannot be allowed its shared memory (its
  // launch then says why).
  static int max_active_clusters(const void* ctx, int kernel, unsigned grid_x, unsigned cluster, unsigned block,
                                 unsigned smem) {
    const ClusterQuery& q = *static_cast<const ClusterQuery*>(ctx);
    Executor& self = *q.self;
    const Function f = q.funcs[kernel];
    std::lock_guard<std::mutex> lock(self.mutex_);
    KernelState* k = self.kernel_state(q.device, f);
    if (k && k->clusters >= 0) return k->clusters;
    Why ignored;
    if (self.allow_locked(q.device, f, smem, cluster, &ignored) != 0) return 0;
    int n = self.api_.max_active_clusters(f, grid_x, block, smem);
    if (n < 0) n = 0;
    if (!k) k = self.kernel_state(q.device, f);  // allow_locked may have made it
    if (k) k->clusters = n;
    return n;
  }

  // The state of (device, f), made when the table has room; null when it has none.
  KernelState* kernel_state(int device, Function f) {
    for (int i = 0; i < kernels_used_; ++i)
      if (kernels_[i].device == device && kernels_[i].f == f) return &kernels_[i];
    if (kernels_used_ == kKernels) return nullptr;
    KernelState& k = kernels_[kernels_used_++];
    k.device = device;
    k.f = f;
    k.smem = -1;
    k.nonportable = 0;
    k.clusters = -1;
    return &k;
  }

  int allow_locked(int device, Function f, unsigned smem, unsigned cluster, Why* why) {
    KernelState* k = kernel_state(device, f);
    const bool nonportable = cluster > kPortableClusterCtas;
    if (static_cast<long long>(smem) > (k ? k->smem : -1)) {
      long long optin = 0, static_bytes = 0;
      if (const int r = api_.smem_limits(device, f, &optin, &static_bytes, why)) return r;
      // What the kernel may use without an opt-in, or what an earlier opt-in allowed.
      long long allowed = static_cast<long long>(kDefaultSmemBytes) - static_bytes;
      if (k && k->smem > allowed) allowed = k->smem;
      if (static_cast<long long>(smem) > allowed) {
        if (static_cast<long long>(smem) + static_bytes > optin)
          return unsupported(why, "a kernel needs %lld bytes of shared memory per block; device %d allows %lld",
                             static_cast<long long>(smem) + static_bytes, device, optin);
        if (const int r = api_.set_max_dynamic_smem(f, smem, why)) return r;
        allowed = smem;
      }
      if (k) k->smem = allowed;
    }
    if (nonportable && !(k && k->nonportable)) {
      if (const int r = api_.allow_nonportable_cluster(f, why)) return r;
      if (k) k->nonportable = 1;
    }
    return 0;
  }

  // Step 2's workspaces of `plan` into out (null: an optional one left out).
  int workspaces(const void* owner, int device, Stream stream, const Plan& plan, const RunOptions& options, void** out,
                 Why* why) {
    for (int i = 0; i < kMaxWorkspaces; ++i) out[i] = nullptr;
    if (plan.workspaces == 0) return 0;
    std::lock_guard<std::mutex> lock(mutex_);
    WorkspaceSet* s = nullptr;
    for (int i = 0; i < sets_used_ && !s; ++i)
      if (sets_[i].owner == owner && sets_[i].device == device && sets_[i].stream == stream) s = &sets_[i];
    if (!s && sets_used_ < kWorkspaceSets) {
      s = &sets_[sets_used_++];
      *s = WorkspaceSet();
      s->owner = owner;
      s->device = device;
      s->stream = stream;
    }
    for (int i = 0; i < plan.workspaces; ++i) {
      const Workspace& w = plan.workspace[i];
      if (w.optional && (!s || !options.optional_workspaces)) continue;  // left out
      if (!s)
        return unsupported(why, "the workspace table is full (%d build, device and stream combinations have used it)",
                           sets_used_);
      if (s->bytes[i] < w.bytes) {
        void* p = nullptr;
        if (const int r = allocate(w, &p, why)) {
          // An optional one that cannot be had (out of memory: flash_fwd_wgmma's FP8 copy is up to
          // 1 GiB) is left out, as when withheld: the family does without it, as correctly.
          if (w.optional) continue;
          return r;
        }
        s->ptr[i] = p;
        s->bytes[i] = w.bytes;
      }
      out[i] = s->ptr[i];
    }
    return 0;
  }

  // One workspace, in relaxed capture mode; zeroed on the adapter's stream when it must be.
  int allocate(const Workspace& w, void** out, Why* why) {
    int saved = 0;
    if (const int r = api_.relax_capture(&saved, why)) return r;
    void* p = nullptr;
    int r = api_.allocate(w.bytes, &p, why);
    if (r == 0 && w.zeroed) r = api_.zero(p, w.bytes, why);
    if (r != 0 && p) api_.release(p);
    api_.restore_capture(saved);
    if (r == 0) *out = p;
    return r;
  }

  static constexpr int kMaxDevices = 64;

  Api api_;
  std::mutex mutex_;
  std::atomic<int> sms_[kMaxDevices] = {};
  KernelState kernels_[kKernels];
  int kernels_used_ = 0;
  WorkspaceSet sets_[kWorkspaceSets];
  int sets_used_ = 0;
};

}  // namespace attntune_plan

#endif  // ATTNTUNE_RUN_PLAN_H
