// The CUDA driver, loaded on first use. The binary links no CUDA library: libcuda.so.1 is
// dlopen()ed the first time a GPU is needed, so space/compile/best/export/replay run on machines
// with no driver at all, and GPU commands there fail with one clear line and exit code 3.
//
// cuda.h is included for types and constants only. Entry points come from cuGetProcAddress with
// cudaVersion = CUDA_VERSION (13000), which hands back the ABI variant this header declares
// (cuMemAlloc_v2, cuEventElapsedTime_v2, cuDevicePrimaryCtxRelease_v2, ...), never an older one
// that dlsym("cuMemAlloc") would find.
//
// Everything here works on the context current to the calling thread: make a Context, then load
// Modules, allocate DeviceBuffers and launch on that thread (Context::make_current for another).
#pragma once
#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "core/error.hpp"
#include "core/records.hpp"

#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
#error "attntune resolves the legacy-stream driver entry points; build without per-thread default streams"
#endif

namespace attntune::cuda {

// Every driver function attntune calls. Names are cuda.h's base names; the struct members take
// cuda.h's versioned spelling through its own #defines (driver().cuMemAlloc is cuMemAlloc_v2), so
// their types are exactly the declarations of the header we compile against.
#define ATTNTUNE_CU_FUNCTIONS(X)                                                                 \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)                          \
  X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName) X(cuDeviceGetAttribute)                  \
  X(cuDeviceGetUuid) X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain)                             \
  X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxSynchronize)        \
  X(cuCtxGetDevice)                                                                              \
  X(cuCtxGetLimit) X(cuCtxSetLimit) X(cuMemGetInfo)                                              \
  X(cuModuleLoadDataEx) X(cuModuleUnload) X(cuModuleGetFunction) X(cuModuleGetGlobal)            \
  X(cuFuncSetAttribute) X(cuFuncGetAttribute) X(cuOccupancyMaxActiveBlocksPerMultiprocessor)     \
  X(cuOccupancyMaxActiveClusters) X(cuLaunchKernel)                                              \
  X(cuMemAlloc) X(cuMemFree) X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyDtoD)                     \
  X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemcpyDtoDAsync)                                 \
  X(cuMemsetD8) X(cuMemsetD16) X(cuMemsetD32) X(cuThreadExchangeStreamCaptureMode)               \
  X(cuMemsetD8Async) X(cuMemsetD16Async) X(cuMemsetD32Async)                                     \
  X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamQuery)                   \
  X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize)                      \
  X(cuEventElapsedTime)                                                                          \
  X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuGraphInstantiate) X(cuGraphLaunch)           \
  X(cuGraphExecDestroy) X(cuGraphDestroy)                                                        \
  X(cuTensorMapEncodeTiled)

struct Driver {
#define ATTNTUNE_CU_MEMBER(fn) decltype(&::fn) fn = nullptr;
  ATTNTUNE_CU_FUNCTIONS(ATTNTUNE_CU_MEMBER)
#undef ATTNTUNE_CU_MEMBER
  int version = 0;       // cuDriverGetVersion: 13000 is CUDA 13.0
  int device_count = 0;  // > 0 once loaded
  std::string path;      // the libcuda.so.1 that was loaded
};

// Loads the driver (once, thread-safe), resolves the table, calls cuInit(0) and checks that there
// is a device. Throws EnvError (exit 3) with one line when there is no driver, it is older than
// CUDA 13.0, cuInit fails or there is no device. The outcome is cached: later calls throw the same.
// cuInit runs here, so a process that fork()s CUDA workers must not call this before forking.
const Driver& driver();

// Like driver() but answers instead of throwing; *why gets the EnvError's line. For tests
// (GTEST_SKIP("no GPU: " + why)) and for commands that want to say what they will skip.
bool driver_available(std::string* why = nullptr);

// ---- Errors -------------------------------------------------------------------------------------

// A failed driver call: the call as written, the CUresult's name and number, and whether it has
// poisoned the context. Exit code 1 (the work failed), or 3 when the result says the environment is
// at fault (no device, MPS/driver mismatch, stub library, hardware ECC/NVLink errors).
class CudaError : public Error {
 public:
  CudaError(CUresult result, std::string call, std::string detail = {});

  CUresult result() const noexcept { return result_; }
  const std::string& call() const noexcept { return call_; }
  const std::string& name() const noexcept { return name_; }      // "CUDA_ERROR_ILLEGAL_ADDRESS"
  const std::string& detail() const noexcept { return detail_; }  // e.g. the JIT error log
  // The context is unusable after this error; every later call in this process fails the same way.
  // The worker that ran the kernel must exit and a fresh process take over.
  bool sticky() const noexcept;

 private:
  CUresult result_;
  std::string call_, name_, detail_;
};

bool is_sticky(CUresult r) noexcept;
bool is_environment(CUresult r) noexcept;
// cuGetErrorName's answer, or "CUresult N" when the driver is not loaded or does not know N.
std::string result_name(CUresult r);

[[noreturn]] void throw_cuda_error(CUresult r, std::string_view call, std::string_view detail = {});
inline void check(CUresult r, std::string_view call) {
  if (r != CUDA_SUCCESS) throw_cuda_error(r, call);
}

// CU_CHECK(driver().cuMemAlloc(&p, n)): throws CudaError naming the call as written.
#define CU_CHECK(call) ::attntune::cuda::check((call), #call)

// ---- Device properties --------------------------------------------------------------------------

struct DeviceProps {
  int ordinal = 0;
  std::string name;                   // "NVIDIA H100 80GB HBM3"
  std::string arch;                   // "sm_90" (compute capability; NVRTC also takes "sm_90a")
  std::string uuid;                   // "GPU-8f6b...": as nvidia-smi -L prints it
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  int max_smem_per_block_optin = 0;   // bytes a block may use after set_max_dynamic_smem
  int smem_per_sm = 0;
  int regs_per_sm = 0;
  int max_threads_per_block = 0;
  int max_threads_per_sm = 0;
  int l2_bytes = 0;
  int clock_khz = 0;                  // typical SM clock
  std::size_t total_mem = 0;          // bytes
  int driver_version = 0;             // 13000
  std::string driver_version_str;     // "13.0": the CUDA version the driver supports
  std::string driver_release;         // "580.95.05" from /proc/driver/nvidia/version; "" if unknown
};

int device_count();                      // EnvError when there is no driver or device
// The model of this machine's first visible GPU (DeviceProps::name), asked of the driver once;
// nullopt without a driver or a device (a CPU machine planning a deployment). Never throws.
std::optional<std::string> first_device_name();
DeviceProps device_props(int ordinal);   // InputError for an ordinal that does not exist
// The device as results are filed under it (the driver's release, else the CUDA version it supports).
DeviceInfo device_info(const DeviceProps& p);

// ---- Handles (RAII, move-only; destructors never throw) ----------------------------------------

// The primary context of one device, retained and made current on the constructing thread.
class Context {
 public:
  Context() = default;  // empty
  explicit Context(int ordinal);
  ~Context();
  Context(Context&& o) noexcept;
  Context& operator=(Context&& o) noexcept;
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int ordinal() const noexcept { return ordinal_; }
  CUdevice device() const noexcept { return device_; }
  CUcontext get() const noexcept { return ctx_; }

  void make_current() const;  // on another thread
  // Waits for all work; asynchronous kernel faults (illegal address, trap) surface here.
  void synchronize() const;
  std::size_t limit(CUlimit which) const;
  void set_limit(CUlimit which, std::size_t value) const;
  struct MemInfo {
    std::size_t free = 0, total = 0;
  };
  MemInfo mem_info() const;

 private:
  void reset() noexcept;
  int ordinal_ = -1;
  CUdevice device_ = 0;
  CUcontext ctx_ = nullptr;
};

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// A kernel of a loaded Module. A plain handle: valid while its Module lives.
class Function {
 public:
  Function() = default;
  Function(CUfunction f, std::string name) : f_(f), name_(std::move(name)) {}

  CUfunction get() const noexcept { return f_; }
  const std::string& name() const noexcept { return name_; }

  int attribute(CUfunction_attribute a) const;
  void set_attribute(CUfunction_attribute a, int value) const;
  int num_regs() const { return attribute(CU_FUNC_ATTRIBUTE_NUM_REGS); }
  int local_bytes() const { return attribute(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES); }  // per thread
  int static_smem_bytes() const { return attribute(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES); }
  int max_threads_per_block() const { return attribute(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK); }
  // Dynamic shared memory above 48 KiB must be opted into per kernel, up to
  // DeviceProps::max_smem_per_block_optin minus static_smem_bytes().
  void set_max_dynamic_smem(int bytes) const {
    set_attribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes);
  }
  int max_active_blocks_per_sm(int block_threads, std::size_t dynamic_smem) const;
  // How many clusters of a kernel with compiled-in __cluster_dims__ fit on the device at once, for
  // a launch of `grid` (cuOccupancyMaxActiveClusters; no cluster attribute: the dims are the
  // kernel's). 0 for a kernel without cluster dims (not an error: H100, driver 580).
  int max_active_clusters(Dim3 grid, int block_threads, std::size_t dynamic_smem) const;

 private:
  CUfunction f_ = nullptr;
  std::string name_;
};

// Device global (__device__ / __constant__) of a Module.
struct DeviceSymbol {
  CUdeviceptr ptr = 0;
  std::size_t bytes = 0;
};

// A module loaded into the current context from a CUBIN (or fatbin), or from NUL-terminated PTX,
// which the driver then JIT-compiles. Load failures carry the JIT error log in CudaError::detail().
class Module {
 public:
  Module() = default;
  explicit Module(const std::string& image);
  ~Module();
  Module(Module&& o) noexcept : m_(o.m_) { o.m_ = nullptr; }
  Module& operator=(Module&& o) noexcept;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  CUmodule get() const noexcept { return m_; }
  Function function(const std::string& name) const;  // CudaError CUDA_ERROR_NOT_FOUND if absent
  DeviceSymbol global(const std::string& name) const;

 private:
  CUmodule m_ = nullptr;
};

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);  // uninitialised; 0 bytes allocates nothing
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = 0;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  CUdeviceptr ptr() const noexcept { return ptr_; }
  std::size_t bytes() const noexcept { return bytes_; }

  // Copies at byte `offset` into this buffer; std::out_of_range past its end.
  void upload(const void* src, std::size_t bytes, std::size_t offset = 0);
  void download(void* dst, std::size_t bytes, std::size_t offset = 0) const;
  void upload_async(const void* src, std::size_t bytes, CUstream stream, std::size_t offset = 0);
  void download_async(void* dst, std::size_t bytes, CUstream stream, std::size_t offset = 0) const;
  void copy_from(const DeviceBuffer& src, std::size_t bytes);  // device to device, from offset 0
  void copy_from_async(const DeviceBuffer& src, std::size_t bytes, CUstream stream);

  // Fill the whole buffer with an 8/16/32-bit pattern (its size must be a multiple of it).
  void fill_u8(std::uint8_t value);
  void fill_u16(std::uint16_t value);
  void fill_u32(std::uint32_t value);
  void fill_u8_async(std::uint8_t value, CUstream stream);
  void fill_u16_async(std::uint16_t value, CUstream stream);
  void fill_u32_async(std::uint32_t value, CUstream stream);

 private:
  void check_range(std::size_t bytes, std::size_t offset) const;
  std::size_t count_of(std::size_t elem) const;
  CUdeviceptr ptr_ = 0;
  std::size_t bytes_ = 0;
};

class Stream {
 public:
  explicit Stream(unsigned flags = CU_STREAM_NON_BLOCKING);
  ~Stream();
  Stream(Stream&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  CUstream get() const noexcept { return s_; }
  void synchronize() const;
  bool done() const;  // cuStreamQuery: false while work is pending

 private:
  CUstream s_ = nullptr;
};

class Event {
 public:
  explicit Event(unsigned flags = CU_EVENT_DEFAULT);  // CU_EVENT_DISABLE_TIMING cannot be timed
  ~Event();
  Event(Event&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  CUevent get() const noexcept { return e_; }
  void record(CUstream stream = nullptr);
  void synchronize() const;

 private:
  CUevent e_ = nullptr;
};

// A CUDA graph captured from the work `record` enqueues on `stream`, instantiated: replaying it
// runs that work again with one launch and no CPU in between (how PyTorch's peers are timed).
// `stream` must be a created Stream, not the legacy default one, which cannot be captured. When
// `record` throws, the capture is ended and discarded before the exception goes on.
class Graph {
 public:
  Graph(CUstream stream, const std::function<void()>& record);
  ~Graph();
  Graph(Graph&& o) noexcept : exec_(o.exec_) { o.exec_ = nullptr; }
  Graph& operator=(Graph&&) = delete;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  void launch(CUstream stream) const;

 private:
  CUgraphExec exec_ = nullptr;
};

// Milliseconds between two recorded events (both complete: synchronize on `end` first or this
// throws CUDA_ERROR_NOT_READY). Resolution is about half a microsecond.
float elapsed_ms(const Event& start, const Event& end);

// cuLaunchKernel. args[i] points at the i-th kernel argument. Launch errors (bad configuration,
// too much shared memory) throw here; faults inside the kernel surface at the next synchronize.
void launch(const Function& f, Dim3 grid, Dim3 block, unsigned smem_bytes, CUstream stream,
            void** args);

namespace detail {
// Loads `soname` as the driver would be, without touching the process-wide driver; returns the
// EnvError line, or "" when it loaded, initialised and found a device. For tests of the messages.
std::string probe_driver(const std::string& soname);
// The process-wide driver if it has loaded, else nullptr; never loads it, never throws. For
// destructors, which must neither.
const Driver* loaded_driver() noexcept;
void check_device_ordinal(int ordinal);  // InputError unless 0 <= ordinal < device_count()
}  // namespace detail

}  // namespace attntune::cuda
