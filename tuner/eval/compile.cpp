#include "eval/compile.hpp"

#include <fmt/format.h>

#include "cuda/nvrtc.hpp"

namespace attntune {

BuildKey build_key(const RenderedKernel& kernel, const std::string& arch, const std::vector<std::string>& options) {
  return BuildKey{kernel.source_hash, arch, cuda::nvrtc_version(), fmt::format("{}", fmt::join(options, " "))};
}

BuildRecord build_source(const std::string& source, const std::string& program_name, const std::string& arch,
                         const std::vector<std::string>& options) {
  cuda::CompileOptions opts;
  opts.arch = arch;
  opts.extra = options;
  const cuda::CompileOutput out = cuda::nvrtc_compile(source, program_name, opts);
  BuildRecord r;
  r.status = out.ok ? "ok" : "compile_error";
  r.cubin = out.cubin;
  r.log = out.log;
  r.registers = out.registers;
  r.smem_static = out.smem_static;
  r.spill_stores = out.spill_stores;
  r.spill_loads = out.spill_loads;
  r.local_bytes = out.local_bytes;
  r.compile_ms = out.compile_ms;
  return r;
}

BuildRecord build_kernel(const RenderedKernel& kernel, const std::string& arch,
                         const std::vector<std::string>& options) {
  return build_source(kernel.source, kernel.kernel_name + ".cu", arch, options);
}

}  // namespace attntune
