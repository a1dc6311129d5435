// Resource use from ptxas's verbose log (NVRTC --ptxas-options=-v). NVRTC 13.0 writes, per kernel:
//
//   ptxas info    : 400 bytes gmem, 256 bytes cmem[3]                 (module; cmem on sm_89 only)
//   ptxas info    : Compiling entry function 'big' for 'sm_90'
//   ptxas info    : Function properties for big
//   ptxas         .     2048 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
//   ptxas info    : Used 32 registers, used 0 barriers, 4096 bytes smem, 2048 bytes cumulative
//                   stack size, 360 bytes cmem[0]                     (one line in the log)
//   ptxas info    : Compile time = 28.190 ms
//
// and "Function properties for <callee>" blocks (no "Used" line) for device functions that were
// not inlined. The parser reads the comma-separated items of each line ("N bytes <kind>", "Used N
// registers", "used N barriers") in any order and ignores what it does not know, so a new item or
// a reordering in a later ptxas does not break it; warnings and errors are not parsed.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace attntune::cuda {

struct PtxasFunction {
  std::string name;            // as ptxas prints it (mangled unless extern "C")
  bool entry = false;          // a kernel; false for a called device function
  int registers = 0;           // entries only
  int barriers = 0;
  int smem = 0;                // static shared memory, bytes
  int cmem = 0;                // constant banks on the "Used" line (kernel parameters), bytes
  int stack_frame = 0;         // bytes per thread
  int cumulative_stack = 0;    // stack frame including callees', bytes per thread
  int spill_stores = 0, spill_loads = 0;  // bytes
};

struct PtxasInfo {
  std::vector<PtxasFunction> functions;  // in log order
  int gmem = 0;                          // module __device__ data, bytes
  int cmem = 0;                          // module constant banks (__constant__ data), bytes

  // Over all kernels of the module: what limits the worst of them.
  const PtxasFunction* entry(std::string_view name) const;
  int max_registers() const;
  int max_smem() const;
  int max_local_bytes() const;   // max over kernels of max(stack frame, cumulative stack)
  int max_spill_stores() const;  // kernels and callees
  int max_spill_loads() const;
  int max_entry_cmem() const;
};

PtxasInfo parse_ptxas_log(std::string_view log);

}  // namespace attntune::cuda
