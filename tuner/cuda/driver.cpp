// Loading the driver, its error checker and device properties. The RAII handles are in handles.cpp.
#include "cuda/driver.hpp"

#include "core/text.hpp"
#include <atomic>
#include <fstream>
#include <regex>

#include <fmt/format.h>

#include "cuda/shared_library.hpp"

namespace attntune::cuda {

namespace {

constexpr const char* kDriverSoname = "libcuda.so.1";
constexpr const char* kNeedsGpu =
    "this command needs a GPU; space, compile, best, export and replay work without one";

std::string cuda_version_str(int v) { return fmt::format("{}.{}", v / 1000, v % 1000 / 10); }

struct DriverLoad {
  Driver table;
  std::string error;  // "" when loaded
};

// The error name through a bootstrap pointer, for messages written before the table exists.
std::string bootstrap_name(decltype(&::cuGetErrorName) get_name, CUresult r) {
  const char* s = nullptr;
  if (get_name && get_name(r, &s) == CUDA_SUCCESS && s) return s;
  return fmt::format("CUresult {}", static_cast<int>(r));
}

// dlopen, check the driver is new enough, cuInit, resolve every entry point, count devices. Never
// throws: the outcome, good or bad, is what every later driver() call sees.
DriverLoad load_driver(const std::string& soname) {
  DriverLoad out;
  std::string why;
  SharedLibrary lib = SharedLibrary::open(soname, &why);
  if (!lib) {
    // A missing file is the common case and needs no detail; anything else (a broken install,
    // a 32-bit library, a missing dependency) does.
    const bool missing = why.find("No such file") != std::string::npos;
    out.error = fmt::format("no NVIDIA driver: {} could not be loaded{} ({})", soname,
                            missing ? "" : ": " + why, kNeedsGpu);
    return out;
  }
  out.table.path = lib.path();

  // Bootstrap by plain dlsym: these four have one ABI, and cuInit must run before anything else.
  auto get_proc = reinterpret_cast<decltype(&::cuGetProcAddress)>(lib.symbol("cuGetProcAddress_v2"));
  auto get_version = reinterpret_cast<decltype(&::cuDriverGetVersion)>(lib.symbol("cuDriverGetVersion"));
  auto init = reinterpret_cast<decltype(&::cuInit)>(lib.symbol("cuInit"));
  auto get_name = reinterpret_cast<decltype(&::cuGetErrorName)>(lib.symbol("cuGetErrorName"));
  if (!get_proc || !get_version || !init) {
    out.error = fmt::format(
        "no usable NVIDIA driver: {} has no cuGetProcAddress_v2 (attntune needs a driver for CUDA "
        "{} or newer, e.g. 580+)",
        out.table.path, cuda_version_str(CUDA_VERSION));
    return out;
  }
  int version = 0;
  if (get_version(&version) != CUDA_SUCCESS || version < CUDA_VERSION) {
    out.error = fmt::format(
        "NVIDIA driver too old: it supports CUDA {}, attntune needs CUDA {} or newer (driver 580+)",
        cuda_version_str(version), cuda_version_str(CUDA_VERSION));
    return out;
  }
  out.table.version = version;

  // Once cuInit has run the driver may have started threads: never unload it after that. The
  // handle stays ours until the entry points are resolved below; then it is leaked.
  struct LeakOnExit {
    SharedLibrary& lib;
    ~LeakOnExit() { lib.leak(); }
  } leak_on_exit{lib};
  if (CUresult r = init(0); r != CUDA_SUCCESS) {
    const std::string name = bootstrap_name(get_name, r);
    if (r == CUDA_ERROR_NO_DEVICE)
      out.error = fmt::format("no CUDA device found (cuInit: {})", name);
    else if (r == CUDA_ERROR_STUB_LIBRARY)
      out.error = fmt::format("no NVIDIA driver: {} is the CUDA toolkit's stub library ({})",
                              out.table.path, kNeedsGpu);
    else
      out.error = fmt::format("the NVIDIA driver failed to initialise (cuInit: {})", name);
    return out;
  }

  // Each entry point by the exact symbol the header maps its name to (cuMemAlloc ->
  // cuMemAlloc_v2), so the ABI always matches the declaration we call through. Asking
  // cuGetProcAddress for CUDA 13.0 instead returns the newest ABI of that version, which can
  // differ from the header's default: cuCtxSynchronize came back as cuCtxSynchronize_v2(CUcontext)
  // and failed with CONTEXT_IS_DESTROYED (seen on an H200, driver 580, 2026-11-22). The
  // exported symbols are the legacy-default-stream variants, which is what we use.
  (void)get_proc;
  auto resolve = [&](const char* base, const char* symbol, void** slot) {
    *slot = lib.symbol(symbol);
    if (!*slot && out.error.empty())
      out.error = fmt::format("NVIDIA driver at {} lacks {} ({}) for CUDA {}", out.table.path, base, symbol,
                              cuda_version_str(CUDA_VERSION));
  };
#define ATTNTUNE_CU_SYMBOL_(x) #x
#define ATTNTUNE_CU_SYMBOL(x) ATTNTUNE_CU_SYMBOL_(x)
#define ATTNTUNE_CU_RESOLVE(fn) resolve(#fn, ATTNTUNE_CU_SYMBOL(fn), reinterpret_cast<void**>(&out.table.fn));
  ATTNTUNE_CU_FUNCTIONS(ATTNTUNE_CU_RESOLVE)
#undef ATTNTUNE_CU_RESOLVE
  if (!out.error.empty()) return out;

  int count = 0;
  if (CUresult r = out.table.cuDeviceGetCount(&count); r != CUDA_SUCCESS || count <= 0) {
    out.error = r != CUDA_SUCCESS
                    ? fmt::format("no CUDA device found (cuDeviceGetCount: {})",
                                  bootstrap_name(get_name, r))
                    : std::string("no CUDA device found (cuDeviceGetCount: 0)");
    return out;
  }
  out.table.device_count = count;
  return out;
}

// Set once the process-wide driver has loaded; read by the error formatter and by destructors,
// which must never trigger a load.
std::atomic<const Driver*> g_loaded{nullptr};

const DriverLoad& process_driver() {
  // Built once, thread-safe; never destroyed, so handles destroyed at exit can still use it.
  static const DriverLoad* result = [] {
    auto* r = new DriverLoad(load_driver(kDriverSoname));
    if (r->error.empty()) g_loaded.store(&r->table, std::memory_order_release);
    return r;
  }();
  return *result;
}


std::string describe(CUresult r) {
  const Driver* d = g_loaded.load(std::memory_order_acquire);
  const char* s = nullptr;
  if (d && d->cuGetErrorString(r, &s) == CUDA_SUCCESS && s) return s;
  return "";
}

// "driver().cuMemAlloc(&p, n)" reads better in a message as "cuMemAlloc(&p, n)".
std::string tidy_driver_call(std::string_view call) {
  constexpr std::string_view prefix = "driver().";
  if (call.substr(0, prefix.size()) == prefix) call.remove_prefix(prefix.size());
  return std::string(call);
}

std::string format_error(CUresult r, const std::string& call, const std::string& name,
                         const std::string& detail) {
  std::string msg = fmt::format("{} failed: {} ({})", call, name, static_cast<int>(r));
  if (std::string d = describe(r); !d.empty()) msg += ": " + d;
  if (!detail.empty()) msg += ": " + one_line(detail);
  return msg;
}

}  // namespace

const Driver& driver() {
  const DriverLoad& r = process_driver();
  if (!r.error.empty()) throw EnvError(r.error);
  return r.table;
}

bool driver_available(std::string* why) {
  const DriverLoad& r = process_driver();
  if (why) *why = r.error;
  return r.error.empty();
}

std::string detail::probe_driver(const std::string& soname) { return load_driver(soname).error; }

// ---- Errors -------------------------------------------------------------------------------------

bool is_sticky(CUresult r) noexcept {
  switch (r) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:  // also what a trap instruction gives
    case CUDA_ERROR_TENSOR_MEMORY_LEAK:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_NVLINK_UNCORRECTABLE:
    case CUDA_ERROR_CONTAINED:
    case CUDA_ERROR_EXTERNAL_DEVICE:
      return true;
    default:
      return false;
  }
}

bool is_environment(CUresult r) noexcept {
  switch (r) {
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_STUB_LIBRARY:
    case CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:  // exclusive-process mode, another process holds it
    case CUDA_ERROR_DEVICE_NOT_LICENSED:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_NVLINK_UNCORRECTABLE:
    case CUDA_ERROR_JIT_COMPILER_NOT_FOUND:
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:  // PTX newer than the driver
    case CUDA_ERROR_JIT_COMPILATION_DISABLED:
    case CUDA_ERROR_SYSTEM_NOT_READY:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
    case CUDA_ERROR_MPS_CONNECTION_FAILED:
    case CUDA_ERROR_MPS_RPC_FAILURE:
    case CUDA_ERROR_MPS_SERVER_NOT_READY:
    case CUDA_ERROR_MPS_MAX_CLIENTS_REACHED:
    case CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED:
    case CUDA_ERROR_MPS_CLIENT_TERMINATED:
      return true;
    default:
      return false;
  }
}

std::string result_name(CUresult r) {
  const Driver* d = g_loaded.load(std::memory_order_acquire);
  const char* s = nullptr;
  if (d && d->cuGetErrorName(r, &s) == CUDA_SUCCESS && s) return s;
  return fmt::format("CUresult {}", static_cast<int>(r));
}

CudaError::CudaError(CUresult result, std::string call, std::string detail)
    : Error(is_environment(result) ? ExitCode::kEnvironment : ExitCode::kFailed,
            format_error(result, call, result_name(result), detail)),
      result_(result),
      call_(std::move(call)),
      name_(result_name(result)),
      detail_(std::move(detail)) {}

bool CudaError::sticky() const noexcept { return is_sticky(result_); }

void throw_cuda_error(CUresult r, std::string_view call, std::string_view detail) {
  throw CudaError(r, tidy_driver_call(call), std::string(detail));
}

// ---- Device properties --------------------------------------------------------------------------

namespace {

std::string format_uuid(const CUuuid& u) {
  std::string hex;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) hex += '-';
    hex += fmt::format("{:02x}", static_cast<unsigned char>(u.bytes[i]));
  }
  return "GPU-" + hex;
}

// The kernel module's release ("580.95.05"), as nvidia-smi reports it; the driver API only tells
// the CUDA version. Both the proprietary and the open module print it on the first line.
std::string read_driver_release() {
  std::ifstream f("/proc/driver/nvidia/version");
  std::string line;
  if (!f || !std::getline(f, line)) return "";
  static const std::regex release(R"((?:^|\s)(\d{3,}\.\d+(?:\.\d+)?)(?:\s|$))");
  std::smatch m;
  return std::regex_search(line, m, release) ? m[1].str() : "";
}

void check_ordinal(int ordinal) {
  const int n = driver().device_count;
  if (ordinal < 0 || ordinal >= n)
    throw InputError(fmt::format("CUDA device {} does not exist (this machine has {} device{}: 0{})",
                                 ordinal, n, n == 1 ? "" : "s",
                                 n == 1 ? "" : fmt::format("..{}", n - 1)));
}

}  // namespace

int device_count() { return driver().device_count; }

std::optional<std::string> first_device_name() {
  static const std::optional<std::string> name = []() -> std::optional<std::string> {
    try {
      if (device_count() > 0) return device_props(0).name;
    } catch (const std::exception&) {  // no driver, no device, a driver too old for this build
    }
    return std::nullopt;
  }();
  return name;
}

DeviceProps device_props(int ordinal) {
  const Driver& d = driver();
  check_ordinal(ordinal);
  CUdevice dev = 0;
  CU_CHECK(d.cuDeviceGet(&dev, ordinal));
  auto attr = [&](CUdevice_attribute a) {
    int v = 0;
    CU_CHECK(d.cuDeviceGetAttribute(&v, a, dev));
    return v;
  };

  DeviceProps p;
  p.ordinal = ordinal;
  char name[256] = {};
  CU_CHECK(d.cuDeviceGetName(name, sizeof(name) - 1, dev));
  p.name = name;
  p.cc_major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  p.cc_minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  p.arch = fmt::format("sm_{}{}", p.cc_major, p.cc_minor);
  CUuuid uuid{};
  CU_CHECK(d.cuDeviceGetUuid(&uuid, dev));
  p.uuid = format_uuid(uuid);
  p.sm_count = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  p.max_smem_per_block_optin = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  p.smem_per_sm = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
  p.regs_per_sm = attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR);
  p.max_threads_per_block = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  p.max_threads_per_sm = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
  p.l2_bytes = attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
  p.clock_khz = attr(CU_DEVICE_ATTRIBUTE_CLOCK_RATE);
  CU_CHECK(d.cuDeviceTotalMem(&p.total_mem, dev));
  p.driver_version = d.version;
  p.driver_version_str = cuda_version_str(d.version);
  p.driver_release = read_driver_release();
  return p;
}

const Driver* detail::loaded_driver() noexcept { return g_loaded.load(std::memory_order_acquire); }
void detail::check_device_ordinal(int ordinal) { check_ordinal(ordinal); }

DeviceInfo device_info(const DeviceProps& p) {
  return {p.name, p.arch, p.uuid, p.sm_count, p.driver_release.empty() ? p.driver_version_str : p.driver_release};
}

}  // namespace attntune::cuda
