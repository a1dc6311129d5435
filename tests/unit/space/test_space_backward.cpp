// The backward pass in search spaces (issue 45): a problem section lists the passes a space tunes
// (`pass: [bwd]`, `[fwd, bwd]`; without it the forward alone), a space refuses the other pass with the
// reason, and expressions see the bool problem field `bwd`. Spaces of their own here: the test holds
// whatever the shipped backward family's YAML makes of them.
#include <string>

#include <gtest/gtest.h>

#include "core/error.hpp"
#include "space/search_space.hpp"
#include "tests/common/input_error.hpp"

namespace test_space_backward {
using namespace attntune;
using attntune::testing::input_error_of;

namespace {

const std::string kHead = R"(family: toy
archs: [sm_80]
device_limits:
  sm_80: {max_smem_per_block: 166912}
problem:
  d: [64, 128]
)";
const std::string kParams = R"(params:
  block_n: [32, 64, 128]
)";

const char* kFwd = "b=2,h=16,hkv=4,s=1000,d=128,dtype=bf16,causal=1";
const char* kBwd = "b=2,h=16,hkv=4,s=1000,d=128,dtype=bf16,causal=1,pass=bwd";

TEST(SpaceBackward, ASpaceWithoutPassTunesTheForwardAlone) {
  const SearchSpace fwd = SearchSpace::parse(kHead + kParams, "fwd.yaml");
  const Problem p = Problem::parse(kBwd);
  EXPECT_EQ(input_error_of([&] { fwd.check_problem(p, "sm_80"); }),
            "toy does not support the backward pass (the problem " + p.str() +
                " has pass=bwd; its space's problem section does not list `pass: [bwd]`)");
  EXPECT_EQ(fwd.count(Problem::parse(kFwd), "sm_80"), 3u);
  // Nor does it print a pass it was never given.
  for (const auto& [key, values] : fwd.problem_support()) EXPECT_NE(key, "pass");
  // `pass: [fwd]` says the same thing in words.
  const SearchSpace listed = SearchSpace::parse(kHead + "  pass: [fwd]\n" + kParams, "listed.yaml");
  EXPECT_NE(input_error_of([&] { listed.check_problem(p, "sm_80"); }).find("does not support the backward pass"),
            std::string::npos);
  EXPECT_NO_THROW(listed.check_problem(Problem::parse(kFwd), "sm_80"));
}

TEST(SpaceBackward, ABackwardOnlySpaceRefusesForwardProblems) {
  const SearchSpace bwd = SearchSpace::parse(kHead + "  pass: [bwd]\n" + kParams, "bwd.yaml");
  EXPECT_EQ(bwd.count(Problem::parse(kBwd), "sm_80"), 3u);
  const Problem f = Problem::parse(kFwd);
  EXPECT_EQ(input_error_of([&] { bwd.check_problem(f, "sm_80"); }),
            "toy does not support the forward pass (the problem " + f.str() +
                " is a forward one; its space's problem section lists `pass: [bwd]` only: add pass=bwd to tune the "
                "backward pass)");
  // Its other rules still hold for the backward problem.
  EXPECT_EQ(input_error_of([&] {
              bwd.check_problem(Problem::parse("b=2,h=16,s=1000,d=96,dtype=bf16,causal=1,pass=bwd"), "sm_80");
            }),
            "toy does not support d=96 (supported: 64, 128)");
  // What `attntune space` prints of it.
  bool found = false;
  for (const auto& [key, values] : bwd.problem_support())
    if (key == "pass") {
      found = true;
      EXPECT_EQ(values, std::vector<std::string>{"bwd"});
    }
  EXPECT_TRUE(found);
}

TEST(SpaceBackward, BothPassesAndExpressionsOverBwd) {
  const SearchSpace both = SearchSpace::parse(kHead + R"(  pass: [fwd, bwd]
  constraints:
    - {expr: "!bwd || d <= 128", why: "the backward in this test stops at d=128"}
)" + kParams + R"(derived:
  tiles: {expr: "bwd ? 5 : 2"}
constraints:
  - {expr: "tiles * block_n <= 320", why: "the backward keeps five tiles of block_n in this test"}
)",
                                              "both.yaml");
  EXPECT_EQ(both.count(Problem::parse(kFwd), "sm_80"), 3u);
  EXPECT_EQ(both.count(Problem::parse(kBwd), "sm_80"), 2u);
  const Config big = {{"block_n", std::int64_t{128}}};
  EXPECT_EQ(both.check(big, Problem::parse(kBwd), "sm_80"), "the backward keeps five tiles of block_n in this test");
  EXPECT_FALSE(both.check(big, Problem::parse(kFwd), "sm_80"));
  const auto derived = both.derive(big, Problem::parse(kBwd), "sm_80");
  ASSERT_EQ(derived.size(), 1u);
  EXPECT_EQ(derived[0], (std::pair<std::string, std::int64_t>{"tiles", 5}));
  EXPECT_EQ(both.derive(big, Problem::parse(kFwd), "sm_80")[0].second, 2);
}

TEST(SpaceBackward, PassTakesFwdAndBwdOnlyAndBwdIsAProblemField) {
  EXPECT_NE(input_error_of([&] { SearchSpace::parse(kHead + "  pass: [backward]\n" + kParams, "bad.yaml"); })
                .find("problem.pass: expected fwd (the forward pass) or bwd (the backward pass), got 'backward'"),
            std::string::npos);
  EXPECT_NE(input_error_of([&] { SearchSpace::parse(kHead + "  pass: [bwd, bwd]\n" + kParams, "twice.yaml"); })
                .find("problem.pass: bwd is listed twice"),
            std::string::npos);
  EXPECT_NE(input_error_of([&] { SearchSpace::parse(kHead + "  pass: [1]\n" + kParams, "num.yaml"); })
                .find("got '1'"),
            std::string::npos);
  const std::string reserved = input_error_of([] {
    SearchSpace::parse("family: toy\narchs: [sm_90]\ndevice_limits: {sm_90: {}}\nparams: {bwd: [1]}\n", "toy.yaml");
  });
  EXPECT_NE(reserved.find("'bwd' is reserved: it is a problem field"), std::string::npos) << reserved;
}

// The shipped forward families tune no backward problem.
TEST(SpaceBackward, TheShippedForwardSpacesRefuseIt) {
  for (const char* family : {"flash_fwd_mma", "flash_fwd_wgmma", "flash_decode"}) {
    const auto space = SearchSpace::shipped(family);
    ASSERT_TRUE(space) << family;
    EXPECT_NE(input_error_of([&] { space->check_problem(Problem::parse(kBwd), space->default_arch()); })
                  .find("does not support the backward pass"),
              std::string::npos)
        << family;
  }
}

}  // namespace
}  // namespace test_space_backward
