// The renderer and the families' entry points for the backward pass (`pass=bwd`, issue 45), on the
// CPU: a backward problem's build gets ATT_BWD 1 and its header says ", pass=bwd", and nothing else of
// its source differs from the forward problem's, whose source has neither (every forward build renders
// as before); a backward problem's entry point is attntune_attention_backward (kEntryBackward), which
// the forward families do not serve. A space of its own (flash_fwd_mma's files, listing both passes)
// so that the test holds whatever the backward family's own space makes of `bwd`.
#include <string>

#include <gtest/gtest.h>

#include "core/error.hpp"
#include "families/family.hpp"
#include "space/search_space.hpp"
#include "tests/common/input_error.hpp"

namespace test_render_backward {
using namespace attntune;
using attntune::testing::input_error_of;

namespace {

const char* kSpace = R"(family: flash_fwd_mma
archs: [sm_80]
device_limits:
  sm_80: {max_smem_per_block: 166912}
problem:
  d: [64, 128]
  pass: [fwd, bwd]
  window: [false, true]
params:
  block_n: [64]
derived:
  passes: {expr: "bwd ? 2 : 1"}
)";

std::int64_t define_of(const Defines& defs, const std::string& name) {
  for (const auto& [k, v] : defs)
    if (k == name) return v;
  return -1;
}

TEST(RenderBackward, OnlyABackwardProblemsBuildHasAttBwdAndItsSourceDiffersByThatAlone) {
  const SearchSpace space = SearchSpace::parse(kSpace, "bwd.yaml");
  const Config c = {{"block_n", std::int64_t{64}}};
  for (const std::string spec : {"b=2,h=16,hkv=4,s=1000,sk=1000,d=128,dtype=bf16,causal=1",
                                 "b=1,h=8,s=333,sk=200,d=64,dtype=fp16,causal=0",
                                 "b=1,h=8,hkv=2,s=1000,sk=3000,d=64,dtype=fp16,causal=1,window=255"}) {
    const Problem fwd = Problem::parse(spec), bwd = Problem::parse(spec + ",pass=bwd");
    const Defines with_defs = kernel_defines(space, c, bwd, "sm_80"), without_defs = kernel_defines(space, c, fwd, "sm_80");
    EXPECT_EQ(define_of(with_defs, "ATT_BWD"), 1) << spec;
    EXPECT_EQ(define_of(without_defs, "ATT_BWD"), -1) << spec;
    EXPECT_EQ(define_of(with_defs, "PASSES"), 2) << spec;  // the derived quantities see bwd
    EXPECT_EQ(define_of(without_defs, "PASSES"), 1) << spec;
    const RenderedKernel with = render_kernel(space, c, bwd, "sm_80"), without = render_kernel(space, c, fwd, "sm_80");
    EXPECT_NE(with.source_hash, without.source_hash);
    EXPECT_EQ(without.source.find("#define ATT_BWD"), std::string::npos) << spec;
    EXPECT_EQ(without.source.substr(0, without.source.find('\n')).find("pass="), std::string::npos) << spec;
    // The backward build's source is the other's with its define, its derived value and the header's
    // words added, the words last on the first line (after the variants), as in the spec.
    std::string s = with.source;
    for (const auto& [from, to] : {std::pair<std::string, std::string>{"#define ATT_BWD 1\n", ""},
                                   std::pair<std::string, std::string>{"#define PASSES 2\n", "#define PASSES 1\n"}}) {
      ASSERT_NE(s.find(from), std::string::npos) << spec;
      s.replace(s.find(from), from.size(), to);
    }
    const std::string word = ", pass=bwd";
    const std::size_t end = s.find('\n') - 1;  // the header's ')'
    ASSERT_EQ(s.substr(end - word.size(), word.size() + 1), word + ")") << s.substr(0, end + 1);
    s.erase(end - word.size(), word.size());
    EXPECT_EQ(s, without.source) << spec;
  }
  // A forward problem's header as it always was.
  const RenderedKernel fwd =
      render_kernel(space, c, Problem::parse("b=2,h=16,s=1000,d=128,dtype=bf16,causal=1,window=255"), "sm_80");
  EXPECT_EQ(fwd.source.substr(0, fwd.source.find('\n')),
            "// attntune candidate: flash_fwd_mma block_n=64 (d=128, dtype=bf16, causal=1, window=255,0)");
  const RenderedKernel bwd =
      render_kernel(space, c, Problem::parse("b=2,h=16,s=1000,d=128,dtype=bf16,causal=1,window=255,pass=bwd"), "sm_80");
  EXPECT_EQ(bwd.source.substr(0, bwd.source.find('\n')),
            "// attntune candidate: flash_fwd_mma block_n=64 (d=128, dtype=bf16, causal=1, window=255,0, pass=bwd)");
}

TEST(RenderBackward, ABackwardProblemsEntryIsTheBackwardOne) {
  using namespace attntune_plan;
  const Problem bwd = Problem::parse("b=2,h=16,hkv=4,s=1000,d=128,dtype=bf16,causal=1,pass=bwd");
  const Problem dense = Problem::parse("b=2,h=16,hkv=4,s=1000,d=128,dtype=bf16,causal=1");
  const Problem paged = Problem::parse("b=2,h=16,hkv=4,s=1,sk=1000,d=128,dtype=bf16,causal=1,page=16");
  const Problem varlen = Problem::parse("b=2,h=16,hkv=4,s=1000,d=128,dtype=bf16,causal=1,varlen=10");
  EXPECT_EQ(problem_entry(bwd), kEntryBackward);
  EXPECT_EQ(problem_entry(dense), kEntryDense);
  EXPECT_EQ(problem_entry(paged), kEntryKvcache);
  EXPECT_EQ(problem_entry(varlen), kEntryVarlen);
  // A family that serves both passes: a backward build serves the backward entry alone, a forward
  // build never it, whether it builds per entry point or not.
  const LaunchFamily both{"both", kEntryDense | kEntryKvcache | kEntryVarlen | kEntryBackward, 1, {"k"},
                          nullptr, nullptr, nullptr};
  for (const bool per_entry : {false, true}) {
    Family f;
    f.name = "both";
    f.plan = &both;
    f.build_per_entry = per_entry;
    EXPECT_EQ(served_entries(f, bwd), kEntryBackward) << per_entry;
    EXPECT_EQ(served_entries(f, dense) & kEntryBackward, 0) << per_entry;
    EXPECT_EQ(served_entries(f, paged) & kEntryBackward, 0) << per_entry;
    EXPECT_EQ(served_entries(f, varlen) & kEntryBackward, 0) << per_entry;
  }
  // The forward families serve no backward problem, and say which families do.
  for (const char* family : {"flash_fwd_mma", "flash_fwd_wgmma", "flash_decode", "flash_decode_wgmma"}) {
    EXPECT_EQ(served_entries(builtin_family(family), bwd), 0) << family;
    const std::string why = input_error_of([&] { check_family_serves(family, bwd); });
    EXPECT_EQ(why.rfind(std::string(family) + " does not serve the backward pass of attention "
                            "(attntune_attention_backward: dQ, dK, dV), which the problem " + bwd.str() +
                            " is; families that do: ",
                        0),
              0u)
        << why;
    EXPECT_NO_THROW(check_family_serves(family, paged)) << family;  // every forward family serves a KV cache
  }
}

}  // namespace
}  // namespace test_render_backward
