// NVRTC, loaded on first use (libnvrtc.so.13 from the CUDA 13 toolkit; never linked). Compiles
// rendered kernel sources to a CUBIN for one architecture with no GPU and no driver, and reports
// the resources ptxas assigned (registers, shared memory, stack, spills).
//
// Thread-safe: separate programs compile concurrently (the compile pool runs one per core).
#pragma once
#include <nvrtc.h>

#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "cuda/ptxas_log.hpp"

namespace attntune::cuda {

#define ATTNTUNE_NVRTC_FUNCTIONS(X)                                                       \
  X(nvrtcVersion) X(nvrtcGetErrorString) X(nvrtcGetSupportedArchs)                        \
  X(nvrtcGetNumSupportedArchs) X(nvrtcCreateProgram) X(nvrtcDestroyProgram)             \
  X(nvrtcCompileProgram) X(nvrtcGetProgramLogSize) X(nvrtcGetProgramLog)                \
  X(nvrtcGetCUBINSize) X(nvrtcGetCUBIN) X(nvrtcGetPTXSize) X(nvrtcGetPTX)               \
  X(nvrtcAddNameExpression) X(nvrtcGetLoweredName)

struct Nvrtc {
#define ATTNTUNE_NVRTC_MEMBER(fn) decltype(&::fn) fn = nullptr;
  ATTNTUNE_NVRTC_FUNCTIONS(ATTNTUNE_NVRTC_MEMBER)
#undef ATTNTUNE_NVRTC_MEMBER
  int major = 0, minor = 0;
  std::vector<int> archs;  // supported sm_XX numbers: 75, 80, ..., 90, 100, 120, ...
  std::string path;        // the library that was loaded
};

// Loads NVRTC once (thread-safe). Looks for libnvrtc.so.13 and libnvrtc.so on the loader's path,
// then in $CUDA_HOME/lib64, $CUDA_PATH/lib64, /usr/local/cuda/lib64 and /usr/local/cuda-13*/lib64,
// taking the first that reports version 13.x. None: EnvError (exit 3), "NVRTC not found: ...".
const Nvrtc& nvrtc();
bool nvrtc_available(std::string* why = nullptr);
std::string nvrtc_version();  // "13.0": part of every compile cache key

// A failed NVRTC call other than a compile error in the source (those are results, see
// nvrtc_compile): the call, NVRTC's error string and code, and the program log when there is one.
// Exit code 1; 3 for NVRTC_ERROR_BUILTIN_OPERATION_FAILURE (libnvrtc-builtins missing or broken).
class NvrtcError : public Error {
 public:
  NvrtcError(nvrtcResult result, std::string call, std::string log = {});
  nvrtcResult result() const noexcept { return result_; }
  const std::string& call() const noexcept { return call_; }
  const std::string& name() const noexcept { return name_; }  // "NVRTC_ERROR_INVALID_OPTION"
  const std::string& log() const noexcept { return log_; }

 private:
  nvrtcResult result_;
  std::string call_, name_, log_;
};

[[noreturn]] void throw_nvrtc_error(nvrtcResult r, std::string_view call, std::string_view log = {});
inline void check(nvrtcResult r, std::string_view call) {
  if (r != NVRTC_SUCCESS) throw_nvrtc_error(r, call);
}
#define NVRTC_CHECK(call) ::attntune::cuda::check((call), #call)

// One nvrtcProgram (RAII).
class Program {
 public:
  Program(const std::string& source, const std::string& name);
  ~Program();
  Program(Program&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  Program& operator=(Program&& o) noexcept;
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  nvrtcProgram get() const noexcept { return p_; }
  // NVRTC_SUCCESS or NVRTC_ERROR_COMPILATION; anything else throws NvrtcError with the log.
  nvrtcResult compile(const std::vector<std::string>& options);
  std::string log() const;
  std::string cubin() const;
  std::string ptx() const;
  void add_name_expression(const std::string& expr);            // before compile
  std::string lowered_name(const std::string& expr) const;      // after compile

 private:
  nvrtcProgram p_ = nullptr;
};

struct CompileOptions {
  std::string arch;                // "sm_89", "sm_90", "sm_90a": a real architecture, for a CUBIN
  std::vector<std::string> extra;  // "-DBLOCK_N=64", "--use_fast_math", "-lineinfo", ...
  bool want_ptx = false;
  int max_registers = 0;           // > 0: --maxrregcount=N
};

struct CompileOutput {
  bool ok = false;  // false: the source did not compile; `log` says why
  std::string cubin, ptx, log;
  // Over all kernels of the program (see PtxasInfo); per kernel in `ptxas`.
  int registers = 0, smem_static = 0, spill_stores = 0, spill_loads = 0;
  int local_bytes = 0;  // stack frame per thread, callees included
  int cmem = 0;         // module __constant__ data plus the largest kernel's parameter bank
  double compile_ms = 0;
  PtxasInfo ptxas;
};

// The exact options nvrtc_compile passes (for cache keys and for reproducing a compile):
// --gpu-architecture=<arch> -std=c++17 --ptxas-options=-v [--maxrregcount=N] <extra...>.
// InputError when arch is not sm_<N>[a|f] or NVRTC does not support it.
std::vector<std::string> compile_flags(const CompileOptions& opts);

// A source that does not compile gives ok=false with the log; it is a normal result. Throws
// NvrtcError for misuse (an unknown option, out of memory), EnvError when NVRTC is missing.
CompileOutput nvrtc_compile(const std::string& source, const std::string& program_name,
                            const CompileOptions& opts);

namespace detail {
// Tries the candidates in order as nvrtc() does; returns "" when one loads as NVRTC 13.x, else the
// EnvError line. Does not touch the process-wide NVRTC. For tests of the messages.
std::string probe_nvrtc(const std::vector<std::string>& candidates);
std::vector<std::string> nvrtc_candidates();  // the search list nvrtc() uses, in order
}  // namespace detail

}  // namespace attntune::cuda
