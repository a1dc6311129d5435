// The renderer and an FP8 KV cache (`kv_dtype=fp8`, issue 42), on the CPU: a kv_fp8 problem's build
// gets ATT_KV_FP8 1 and its header says ", kv_dtype=fp8", and nothing else of its source differs from
// the same problem's over a cache of q's dtype, whose source has neither (every other build renders as
// before). A space of its own (family flash_decode, listing kv_fp8) so that the test holds whatever
// the shipped space's formulas make of kv_fp8.
#include <string>

#include <gtest/gtest.h>

#include "families/family.hpp"
#include "space/search_space.hpp"

namespace test_render_kv_fp8 {
using namespace attntune;

namespace {

const char* kSpace = R"(family: flash_decode
archs: [sm_90]
device_limits:
  sm_90: {max_smem_per_block: 232448}
problem:
  d: [128, 192]
  dv: [128]
  latent: [false, true]
  kv_fp8: [false, true]
  window: [false, true]
  softcap: [false, true]
  sinks: [false, true]
params:
  block_n: [64]
)";

std::int64_t define_of(const Defines& defs, const std::string& name) {
  for (const auto& [k, v] : defs)
    if (k == name) return v;
  return -1;
}

TEST(RenderKvFp8, OnlyAnFp8CachesBuildHasAttKvFp8AndItsSourceDiffersByThatAlone) {
  const SearchSpace space = SearchSpace::parse(kSpace, "kv_fp8.yaml");
  const Config c = {{"block_n", std::int64_t{64}}};
  for (const std::string spec : {"b=16,h=32,hkv=8,s=1,sk=4096,d=128,dtype=bf16,causal=1,page=16",
                                 "b=2,h=8,hkv=8,s=4,sk=1000,d=128,dtype=fp16,causal=0",
                                 "b=4,h=16,hkv=2,s=2,sk=4096,d=128,dtype=fp16,causal=1,page=16,window=127,softcap=30,sinks=1",
                                 "b=16,h=16,hkv=1,s=1,sk=4096,d=192,dv=128,dtype=bf16,causal=1,page=64,latent=1"}) {
    const Problem plain = Problem::parse(spec), fp8 = Problem::parse(spec + ",kv_dtype=fp8");
    EXPECT_EQ(define_of(kernel_defines(space, c, fp8, "sm_90"), "ATT_KV_FP8"), 1) << spec;
    EXPECT_EQ(define_of(kernel_defines(space, c, plain, "sm_90"), "ATT_KV_FP8"), -1) << spec;
    const RenderedKernel with = render_kernel(space, c, fp8, "sm_90"), without = render_kernel(space, c, plain, "sm_90");
    EXPECT_NE(with.source_hash, without.source_hash);
    EXPECT_EQ(without.source.find("#define ATT_KV_FP8"), std::string::npos) << spec;
    EXPECT_EQ(without.source.substr(0, without.source.find('\n')).find("kv_dtype"), std::string::npos) << spec;
    // The FP8 build's source is the other's with its define and the header's words added, the words
    // last on the first line (after the variants), as in the spec.
    std::string s = with.source;
    const std::string line = "#define ATT_KV_FP8 1\n", word = ", kv_dtype=fp8";
    ASSERT_NE(s.find(line), std::string::npos) << spec;
    s.erase(s.find(line), line.size());
    const std::size_t end = s.find('\n') - 1;  // the header's ')'
    ASSERT_EQ(s.substr(end - word.size(), word.size() + 1), word + ")") << s.substr(0, end + 1);
    s.erase(end - word.size(), word.size());
    EXPECT_EQ(s, without.source) << spec;
  }
  // A plain problem's header as it always was.
  const RenderedKernel plain =
      render_kernel(space, c, Problem::parse("b=16,h=32,hkv=8,s=1,sk=4096,d=128,dtype=bf16,causal=1,page=16"), "sm_90");
  EXPECT_EQ(plain.source.substr(0, plain.source.find('\n')),
            "// attntune candidate: flash_decode block_n=64 (d=128, dtype=bf16, causal=1)");
  const RenderedKernel fp8 = render_kernel(
      space, c, Problem::parse("b=4,h=16,hkv=2,s=2,sk=4096,d=128,dtype=fp16,causal=1,page=16,sinks=1,kv_dtype=fp8"),
      "sm_90");
  EXPECT_EQ(fp8.source.substr(0, fp8.source.find('\n')),
            "// attntune candidate: flash_decode block_n=64 (d=128, dtype=fp16, causal=1, sinks, kv_dtype=fp8)");
}

}  // namespace
}  // namespace test_render_kv_fp8
