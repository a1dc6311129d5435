// The planted faulty kernels of tests/data/faults/ (README there), rendered as the evaluator
// gets candidates: one self-contained source with the flash_fwd_mma entry point. Shared by the CPU
// test that they build as intended and the GPU test that classifies them.
#pragma once
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/hash.hpp"
#include "families/family.hpp"

namespace attntune::testing {

struct FaultKernel {
  std::string file;      // under tests/data/faults/
  std::string expected;  // the status the evaluator must give it
};

inline const std::vector<FaultKernel>& fault_kernels() {
  static const std::vector<FaultKernel> k = {
      {"oob_write.cu", "crashed"},       {"trap.cu", "crashed"},
      {"endless_loop.cu", "timeout"},    {"wrong_values.cu", "wrong_result"},
      {"nan_output.cu", "nan_or_unwritten"}, {"unwritten.cu", "nan_or_unwritten"},
      {"too_much_smem.cu", "resources"}, {"compile_error.cu", "compile_error"},
  };
  return k;
}

// Two more kinds, for the reliability suite's planted campaign (tests/reliability/), where the build
// pool and the worker see them as any candidate: a compile that never ends (its source includes
// NEVER_WRITTEN_FIFO, which the caller replaces with the path of a FIFO nobody writes) and an entry
// point that is not in the module.
inline const std::vector<FaultKernel>& campaign_fault_kernels() {
  static const std::vector<FaultKernel> k = {
      {"compile_hang.cu", "compile_timeout"},
      {"missing_entry.cu", "launch_error"},
  };
  return k;
}

inline std::string read_text(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// How a fault kernel launches (tests/data/faults/README.md): as flash_fwd_mma launches, 64 rows per
// block, 128 threads, `smem_bytes` of dynamic shared memory.
inline LaunchSpec fault_launch(long long smem_bytes = 0) {
  return {"flash_fwd_mma", {{"BLOCK_M", 64}, {"THREADS", 128}, {"SMEM_BYTES", smem_bytes}}};
}

// `#define HEAD_DIM d`, then the file with `#include "attn_params.h"` replaced by the struct (with
// what it includes, as the renderer flattens it).
inline RenderedKernel render_fault(const std::string& source_dir, const std::string& file, long long head_dim,
                                   long long smem_bytes = 0) {
  std::string src = read_text(source_dir + "/tests/data/faults/" + file);
  const std::string include = "#include \"attn_params.h\"";
  const auto at = src.find(include);
  if (at == std::string::npos) throw std::runtime_error(file + " does not include attn_params.h");
  src.replace(at, include.size(), flatten_includes("templates/common/attn_params.h"));
  src = "#define HEAD_DIM " + std::to_string(head_dim) + "\n" + src;
  return {src, "flash_fwd_mma", content_hash(src), fault_launch(smem_bytes)};
}

}  // namespace attntune::testing
