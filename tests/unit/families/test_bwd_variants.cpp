// Sinks and soft-caps in the backward pass (issue 45: gpt-oss and Gemma 2 training): both backward
// families serve `sinks=1` and `softcap=C` with `pass=bwd`. Sinks: the plain kernels built with
// ATT_SINKS (P = exp(S - LSE) reads the forward's LSE, which holds the sink; the sinks' gradient is
// the ops'). Soft-caps: the capped score recomputed and dS times its derivative (ATT_SOFTCAP). On CI:
// the spaces serve them, the render defines the variant, a variant build plans its variant's calls
// only (and a plain build refuses them), and the builds compile with NVRTC (flash_bwd_mma for sm_80
// and sm_90, flash_bwd_wgmma for sm_90a) without wgmma serialisation and within the spill bounds of
// FlashBwd*Build. The GPU property tests (FlashBwd{Mma,Wgmma}Property.Sinks and .Softcap) check the
// gradients.
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "tests/common/plan_call.hpp"
#include "tests/unit/families/bwd_builds.hpp"

namespace test_bwd_variants {
using namespace attntune;
using attntune::testing::backward_call_of;
using attntune::testing::FakeDevice;
using attntune::testing::space_of;

namespace {

const char* kSinks = "b=2,h=6,hkv=2,s=300,sk=300,d=128,dtype=bf16,causal=1,sinks=1,pass=bwd";
const char* kCapped = "b=2,h=6,hkv=2,s=300,sk=300,d=128,dtype=bf16,causal=1,softcap=30,pass=bwd";
const char* kPlain = "b=2,h=6,hkv=2,s=300,sk=300,d=128,dtype=bf16,causal=1,pass=bwd";
const float kSinkLogits[6] = {0.f, 1.f, 2.f, 3.f, 4.f, 5.f};  // a host address: the plan never reads it

struct BwdFamily {
  const char* name;
  const char* arch;
};
const BwdFamily kFamilies[] = {{"flash_bwd_mma", "sm_90"}, {"flash_bwd_wgmma", "sm_90a"}};

}  // namespace

// For each family and variant (sinks, a soft-cap): the space serves it with the plain problem's
// configs (a variant changes nothing the space constrains but fa4_order, which a soft-cap leaves out,
// and tma_loads beside one consumer warpgroup, likewise), the render defines it, and a build with it
// plans that variant's calls only, a plain build refusing them, both naming the variant.
TEST(BackwardVariants, EachFamilyServesAVariantsCallsWithItsBuildOnly) {
  const auto device = FakeDevice{}.device();
  struct Case {
    const char* spec;
    const char* define;
    const char* words;                       // how a refusal names the variant
    void (*set)(attntune_plan::Call&);       // the call's variant field
  };
  const Case cases[] = {
      {kSinks, "#define ATT_SINKS 1\n", "attention sinks", [](attntune_plan::Call& c) { c.sinks = kSinkLogits; }},
      {kCapped, "#define ATT_SOFTCAP 1\n", "soft-cap", [](attntune_plan::Call& c) { c.softcap = 30.f; }},
  };
  const Problem plain = Problem::parse(kPlain);
  for (const BwdFamily& fam : kFamilies)
    for (const Case& v : cases) {
      SCOPED_TRACE(std::string(fam.name) + " " + v.spec);
      const SearchSpace space = space_of(fam.name);
      const Problem variant = Problem::parse(v.spec);
      const auto configs = space.enumerate(variant, fam.arch);
      ASSERT_FALSE(configs.empty());
      // The plain problem's configs, but flash_bwd_wgmma's fa4_order with a soft-cap (the cap's
      // derivative beside its reordered step spilled 32-72 bytes: the space's why), and its
      // tma_loads with a soft-cap beside one consumer warpgroup (block_n 64: 12 bytes).
      std::size_t plain_configs = 0;
      space.for_each_valid(plain, fam.arch, [&](const Config& c) {
        const auto flag = [&](const char* name) {
          const auto it = c.find(name);
          return it != c.end() && std::get<bool>(it->second);
        };
        const auto bn = c.find("block_n");
        const bool narrow = bn != c.end() && std::get<std::int64_t>(bn->second) == 64;
        plain_configs += !(variant.softcap > 0 && (flag("fa4_order") || (flag("tma_loads") && narrow)));
      });
      EXPECT_EQ(configs.size(), plain_configs);
      const RenderedKernel with = render_kernel(space, configs.front(), variant, fam.arch);
      const RenderedKernel without = render_kernel(space, configs.front(), plain, fam.arch);
      EXPECT_NE(with.source.find(v.define), std::string::npos);
      EXPECT_EQ(without.source.find(v.define), std::string::npos);
      attntune_plan::Call call = backward_call_of(variant);
      v.set(call);
      std::string why;
      EXPECT_TRUE(plan_call(with.launch, call, device, &why)) << why;
      EXPECT_FALSE(plan_call(with.launch, backward_call_of(plain), device, &why));
      EXPECT_NE(why.find(v.words), std::string::npos) << why;
      why.clear();
      EXPECT_FALSE(plan_call(without.launch, call, device, &why));
      EXPECT_NE(why.find(v.words), std::string::npos) << why;
    }
}

TEST(BackwardVariants, VariantBuildsCompile) {
  // Each variant's first and last config (the smallest and largest tiles), d=128 and d=64.
  attntune::testing::expect_backward_builds(
      {kSinks, kCapped, "b=1,h=4,s=500,sk=700,d=64,dtype=fp16,causal=1,window=100,sinks=1,pass=bwd",
       "b=1,h=4,s=500,sk=700,d=64,dtype=bf16,causal=0,softcap=50,sinks=1,pass=bwd"});
}
}  // namespace test_bwd_variants
