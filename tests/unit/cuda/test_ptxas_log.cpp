// The ptxas -v log parser on fixed text: logs NVRTC 13.0 wrote for sm_89 and sm_90, plus
// variations a later ptxas could plausibly produce.
#include <gtest/gtest.h>

#include "cuda/ptxas_log.hpp"

namespace test_ptxas_log {
using namespace attntune::cuda;

namespace {

// NVRTC 13.0, --gpu-architecture=sm_89 --ptxas-options=-v --maxrregcount=16: a template kernel,
// one with static smem, one with a 2 KiB local array, one trivial; module __device__ and
// __constant__ data.
constexpr const char* kSm89 = R"(ptxas warning : For profile sm_89 adjusting per thread register count of 16 to lower bound of 24
ptxas info    : Overriding maximum register limit 256 for '_Z4tmplILi3EEvPf' with  24 of maxrregcount option
ptxas info    : Overriding maximum register limit 256 for 'smem' with  24 of maxrregcount option
ptxas info    : 400 bytes gmem, 256 bytes cmem[3], 8 bytes cmem[4]
ptxas info    : Compiling entry function '_Z4tmplILi3EEvPf' for 'sm_89'
ptxas info    : Function properties for _Z4tmplILi3EEvPf
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 360 bytes cmem[0]
ptxas info    : Compile time = 2.530 ms
ptxas info    : Compiling entry function 'smem' for 'sm_89'
ptxas info    : Function properties for smem
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 14 registers, used 1 barriers, 4096 bytes smem, 360 bytes cmem[0]
ptxas info    : Compile time = 2.864 ms
ptxas info    : Compiling entry function 'big' for 'sm_89'
ptxas info    : Function properties for big
ptxas         .     2048 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers, 2048 bytes cumulative stack size, 364 bytes cmem[0]
ptxas info    : Compile time = 20.385 ms
ptxas info    : Compiling entry function 'small' for 'sm_89'
ptxas info    : Function properties for small
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 360 bytes cmem[0]
ptxas info    : Compile time = 1.948 ms
)";

// NVRTC 13.0, sm_90, --maxrregcount=32: a kernel that spills, and a callee that was not inlined
// (its block comes after the kernel's and has no "Used" line). sm_90 logs print no cmem.
constexpr const char* kSm90Spills = R"(ptxas info    : Overriding maximum register limit 256 for 'spill' with  32 of maxrregcount option
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'spill' for 'sm_90'
ptxas info    : Function properties for spill
ptxas         .     1840 bytes stack frame, 1572 bytes spill stores, 3504 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 1840 bytes cumulative stack size
ptxas info    : Compile time = 173.667 ms
ptxas info    : Function properties for _Z6helperPKfi
ptxas         .     96 bytes stack frame, 40 bytes spill stores, 4000 bytes spill loads

)";

}  // namespace

TEST(PtxasLog, ReadsEveryKernelOfAnSm89Log) {
  const PtxasInfo info = parse_ptxas_log(kSm89);
  ASSERT_EQ(info.functions.size(), 4u);
  EXPECT_EQ(info.gmem, 400);
  EXPECT_EQ(info.cmem, 264);  // cmem[3] + cmem[4]

  const PtxasFunction* tmpl = info.entry("_Z4tmplILi3EEvPf");
  ASSERT_NE(tmpl, nullptr);
  EXPECT_EQ(tmpl->registers, 8);
  EXPECT_EQ(tmpl->cmem, 360);

  const PtxasFunction* smem = info.entry("smem");
  ASSERT_NE(smem, nullptr);
  EXPECT_EQ(smem->registers, 14);
  EXPECT_EQ(smem->barriers, 1);
  EXPECT_EQ(smem->smem, 4096);

  const PtxasFunction* big = info.entry("big");
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(big->registers, 24);
  EXPECT_EQ(big->stack_frame, 2048);
  EXPECT_EQ(big->cumulative_stack, 2048);
  EXPECT_EQ(big->cmem, 364);

  EXPECT_EQ(info.max_registers(), 24);
  EXPECT_EQ(info.max_smem(), 4096);
  EXPECT_EQ(info.max_local_bytes(), 2048);
  EXPECT_EQ(info.max_spill_stores(), 0);
  EXPECT_EQ(info.max_entry_cmem(), 364);
  EXPECT_EQ(info.entry("nonexistent"), nullptr);
}

TEST(PtxasLog, ReadsSpillsOfKernelsAndCallees) {
  const PtxasInfo info = parse_ptxas_log(kSm90Spills);
  ASSERT_EQ(info.functions.size(), 2u);
  const PtxasFunction& spill = info.functions[0];
  EXPECT_EQ(spill.name, "spill");
  EXPECT_TRUE(spill.entry);
  EXPECT_EQ(spill.registers, 32);
  EXPECT_EQ(spill.stack_frame, 1840);
  EXPECT_EQ(spill.spill_stores, 1572);
  EXPECT_EQ(spill.spill_loads, 3504);

  const PtxasFunction& helper = info.functions[1];
  EXPECT_EQ(helper.name, "_Z6helperPKfi");
  EXPECT_FALSE(helper.entry);  // a callee, not a kernel
  EXPECT_EQ(helper.registers, 0);
  EXPECT_EQ(helper.spill_stores, 40);
  EXPECT_EQ(helper.spill_loads, 4000);
  EXPECT_EQ(info.entry("_Z6helperPKfi"), nullptr);

  EXPECT_EQ(info.max_registers(), 32);        // kernels only
  EXPECT_EQ(info.max_spill_stores(), 1572);   // kernels and callees
  EXPECT_EQ(info.max_spill_loads(), 4000);
  EXPECT_EQ(info.max_local_bytes(), 1840);
  EXPECT_EQ(info.cmem, 0);
  EXPECT_EQ(info.gmem, 0);
}

TEST(PtxasLog, ToleratesReorderedUnknownItemsCrlfAndNoise) {
  // Items in another order, one it does not know, CRLF line ends, front-end warnings, a
  // -warn-spills warning that repeats the spill numbers (not to be counted twice), and
  // an older format where "Used" comes straight after "Compiling entry function".
  const char* log =
      "kern.cu(2): warning #177-D: variable \"a\" was declared but never referenced\r\n"
      "ptxas info    : Compiling entry function '_Z1kPf' for 'sm_90a'\r\n"
      "ptxas info    : Used 40 registers, 12288 bytes smem, used 2 barriers, 7 bytes wibble\r\n"
      "ptxas info    : Function properties for _Z1kPf\r\n"
      "ptxas         .     16 bytes stack frame, 8 bytes spill loads, 4 bytes spill stores\r\n"
      "ptxas warning : Registers are spilled to local memory in function '_Z1kPf', 999 bytes "
      "spill stores, 999 bytes spill loads\r\n";
  const PtxasInfo info = parse_ptxas_log(log);
  ASSERT_EQ(info.functions.size(), 1u);
  const PtxasFunction& k = info.functions[0];
  EXPECT_TRUE(k.entry);
  EXPECT_EQ(k.registers, 40);
  EXPECT_EQ(k.barriers, 2);
  EXPECT_EQ(k.smem, 12288);
  EXPECT_EQ(k.stack_frame, 16);
  EXPECT_EQ(k.spill_stores, 4);
  EXPECT_EQ(k.spill_loads, 8);
  EXPECT_EQ(info.max_local_bytes(), 16);
}

TEST(PtxasLog, EmptyOrErrorLogsHaveNoFunctions) {
  EXPECT_TRUE(parse_ptxas_log("").functions.empty());
  const PtxasInfo err = parse_ptxas_log(
      "ptxas application ptx input, line 26; error   : Instruction 'wgmma.fence' not supported on "
      ".target 'sm_90'\nptxas fatal   : Ptx assembly aborted due to errors\n");
  EXPECT_TRUE(err.functions.empty());
  EXPECT_EQ(err.max_registers(), 0);
}
}  // namespace test_ptxas_log
