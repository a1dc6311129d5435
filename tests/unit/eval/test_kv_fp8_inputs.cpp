// What an FP8 e4m3 KV cache (kv_dtype=fp8) is validated with, decided without a GPU: the devices
// that can run it (sm_89 and newer: a clear refusal below, not a crash), its dequantisation scales
// (fixed seeds, in [0.25, 2], K's not V's), and that the reference kernels, FP8 ones included (and the
// backward pass's), compile for every target the tuner builds for.
#include <algorithm>
#include <string>

#include <gtest/gtest.h>

#include "core/error.hpp"
#include "cuda/nvrtc.hpp"
#include "eval/attention_gpu.hpp"
#include "families/family.hpp"

namespace test_kv_fp8_inputs {
using namespace attntune;

namespace {

Problem fp8(const char* spec) {
  Problem p = Problem::parse(spec);
  p.kv_fp8 = true;  // the spec key is another change's
  return p;
}

}  // namespace

TEST(KvFp8Inputs, OlderDevicesRefuseAnFp8CacheWithTheReason) {
  const Problem p = fp8("b=4,h=32,hkv=8,s=1,sk=4096,d=128,dtype=bf16,causal=1,page=64");
  for (const char* arch : {"sm_80", "sm_86", "sm_87"}) {
    SCOPED_TRACE(arch);
    try {
      check_device_serves(p, arch);
      ADD_FAILURE() << "no refusal";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("FP8 e4m3 KV cache"), std::string::npos) << what;
      EXPECT_NE(what.find("sm_89"), std::string::npos) << what;
      EXPECT_NE(what.find(arch), std::string::npos) << what;
    }
  }
  for (const char* arch : {"sm_89", "sm_90", "sm_90a", "sm_100", "sm_120"}) EXPECT_NO_THROW(check_device_serves(p, arch)) << arch;
  // A 16-bit cache runs anywhere, as before.
  EXPECT_NO_THROW(check_device_serves(Problem::parse("b=4,h=32,hkv=8,s=1,sk=4096,d=128,dtype=bf16,causal=1,page=64"), "sm_80"));
}

TEST(KvFp8Inputs, DescalesAreFixedAndNotOne) {
  const std::vector<float> k = kv_descales(64, kDescaleSeedK), v = kv_descales(64, kDescaleSeedV);
  ASSERT_EQ(k.size(), 64u);
  EXPECT_EQ(k, kv_descales(64, kDescaleSeedK)) << "a fixed draw";
  EXPECT_NE(k, v);
  for (const auto* t : {&k, &v}) {
    for (float x : *t) {
      EXPECT_GE(x, 0.25f);
      EXPECT_LE(x, 2.0f);
    }
    // Spread over the range: some well below 1, some well above.
    EXPECT_LT(*std::min_element(t->begin(), t->end()), 0.6f);
    EXPECT_GT(*std::max_element(t->begin(), t->end()), 1.5f);
  }
  // A smaller table is the start of the same draw.
  const std::vector<float> few = kv_descales(3, kDescaleSeedK);
  EXPECT_TRUE(std::equal(few.begin(), few.end(), k.begin()));
  EXPECT_TRUE(kv_descales(0, kDescaleSeedK).empty());
}

// The reference module is NVRTC-compiled for the device's own arch: every kernel, the FP8 ones too,
// must compile for each: here the lowest (sm_80, where the e4m3 conversion is a stub) and sm_90.
TEST(KvFp8Inputs, ReferenceKernelsCompileForEveryTarget) {
  const std::string source = flatten_includes("templates/reference/reference.cu");
  for (const char* arch : {"sm_80", "sm_90"}) {  // the lowest target and the GPU tests' (CI time)
    SCOPED_TRACE(arch);
    cuda::CompileOptions opts;
    opts.arch = arch;
    opts.extra = {"-std=c++17"};
    const cuda::CompileOutput out = cuda::nvrtc_compile(source, "reference.cu", opts);
    ASSERT_TRUE(out.ok) << out.log;
    for (const char* kernel : {"fill_normal", "attn_reference", "compare_outputs", "scatter_pages", "fill_normal_e4m3",
                               "attn_reference_kv_fp8", "scatter_pages_e4m3", "quantize_e4m3", "dequantize_e4m3"})
      EXPECT_NE(out.ptxas.entry(kernel), nullptr) << kernel;
    // The FP8 reference keeps the 16-bit one's shape: no spills, the same static shared memory.
    const cuda::PtxasFunction* plain = out.ptxas.entry("attn_reference");
    const cuda::PtxasFunction* fp8 = out.ptxas.entry("attn_reference_kv_fp8");
    ASSERT_TRUE(plain && fp8);
    EXPECT_EQ(fp8->smem, plain->smem);
    EXPECT_EQ(fp8->spill_stores + fp8->spill_loads, 0);
    // The backward pass's (pass=bwd, issue 45), compiled in the same module: every kernel there, the
    // two that hold a warp's accumulators without spills.
    for (const char* kernel : {"attn_bwd_rowdot", "attn_reference_bwd_dq", "attn_reference_bwd_dkdv", "compare_grad",
                               "store_rounded"})
      EXPECT_NE(out.ptxas.entry(kernel), nullptr) << kernel;
    for (const char* kernel : {"attn_reference_bwd_dq", "attn_reference_bwd_dkdv"}) {
      const cuda::PtxasFunction* f = out.ptxas.entry(kernel);
      ASSERT_TRUE(f) << kernel;
      EXPECT_EQ(f->spill_stores + f->spill_loads, 0) << kernel;
    }
  }
}

// The FP8 forward (dtype=fp8): older devices refuse it with the reason, Q's descales are a third fixed
// draw (not K's or V's), and its reference kernels (attn_reference_qkv_fp8, transpose_e4m3) compile
// for every target without spills, in the 16-bit reference's shared memory.
TEST(KvFp8Inputs, TheFp8ForwardsInputsAndReference) {
  const Problem p = Problem::parse("b=1,h=16,s=4096,d=128,dtype=fp8,causal=0");
  try {
    check_device_serves(p, "sm_86");
    ADD_FAILURE() << "no refusal";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("FP8 forward (dtype=fp8)"), std::string::npos) << what;
    EXPECT_NE(what.find("sm_89"), std::string::npos) << what;
  }
  EXPECT_NO_THROW(check_device_serves(p, "sm_90a"));
  const std::vector<float> q = kv_descales(64, kDescaleSeedQ);
  EXPECT_NE(q, kv_descales(64, kDescaleSeedK));
  EXPECT_NE(q, kv_descales(64, kDescaleSeedV));
  const std::string source = flatten_includes("templates/reference/reference.cu");
  for (const char* arch : {"sm_80", "sm_90"}) {
    SCOPED_TRACE(arch);
    cuda::CompileOptions opts;
    opts.arch = arch;
    opts.extra = {"-std=c++17"};
    const cuda::CompileOutput out = cuda::nvrtc_compile(source, "reference.cu", opts);
    ASSERT_TRUE(out.ok) << out.log;
    const cuda::PtxasFunction* plain = out.ptxas.entry("attn_reference");
    const cuda::PtxasFunction* fwd8 = out.ptxas.entry("attn_reference_qkv_fp8");
    ASSERT_TRUE(plain && fwd8);
    EXPECT_EQ(fwd8->smem, plain->smem);
    EXPECT_EQ(fwd8->spill_stores + fwd8->spill_loads, 0);
    EXPECT_NE(out.ptxas.entry("transpose_e4m3"), nullptr);
  }
}
}  // namespace test_kv_fp8_inputs
