// `varlen` as a problem field of search spaces: problem rules (`varlen: [0]`), problem constraints
// and param constraints can use it, as they use page; a param cannot be named after it.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "space/search_space.hpp"
#include "tests/common/input_error.hpp"

namespace test_space_varlen {
using namespace attntune;
using attntune::testing::input_error_of;

namespace {

Problem problem(const std::string& spec) { return Problem::parse(spec); }

const char* kDense = "b=2,h=4,s=512,d=64,dtype=bf16,causal=1";
const char* kVarlen = "b=2,h=4,s=512,d=64,dtype=bf16,causal=1,varlen=128";

}  // namespace

TEST(SpaceVarlen, ConstraintsSeeTheProblemsVarlen) {
  const SearchSpace sp = SearchSpace::parse(
      "family: toy\narchs: [sm_90]\ndevice_limits: {sm_90: {}}\n"
      "problem:\n  constraints:\n    - {expr: \"varlen == 0 || varlen >= 64\", why: packed batches of 64 rows and up}\n"
      "params:\n  x: [1, 2, 4]\n"
      "constraints:\n  - {expr: \"varlen == 0 || x >= 2\", why: a packed batch needs x >= 2}\n",
      "toy.yaml");
  EXPECT_EQ(sp.count(problem(kDense), "sm_90"), 3u);
  EXPECT_EQ(sp.count(problem(kVarlen), "sm_90"), 2u);
  EXPECT_EQ(sp.check({{"x", std::int64_t{1}}}, problem(kVarlen), "sm_90"), "a packed batch needs x >= 2");
  EXPECT_FALSE(sp.check({{"x", std::int64_t{1}}}, problem(kDense), "sm_90"));
  EXPECT_EQ(input_error_of([&] {
              sp.check_problem(problem("b=2,h=4,s=512,d=64,dtype=bf16,causal=1,varlen=16"), "sm_90");
            }),
            "toy does not support the problem b=2,h=4,hkv=4,s=512,sk=512,d=64,dtype=bf16,causal=1,varlen=16: "
            "packed batches of 64 rows and up");
}

TEST(SpaceVarlen, AProblemRuleListsTheVarlensServed) {
  const SearchSpace dense_only = SearchSpace::parse(
      "family: toy\narchs: [sm_90]\ndevice_limits: {sm_90: {}}\nproblem:\n  varlen: [0]\nparams: {x: [1]}\n",
      "toy.yaml");
  EXPECT_EQ(dense_only.count(problem(kDense), "sm_90"), 1u);
  EXPECT_EQ(input_error_of([&] { dense_only.check_problem(problem(kVarlen), "sm_90"); }),
            "toy does not support varlen=128 (supported: 0)");
}

TEST(SpaceVarlen, VarlenIsAReservedName) {
  const std::string err = input_error_of([] {
    SearchSpace::parse("family: toy\narchs: [sm_90]\ndevice_limits: {sm_90: {}}\nparams: {varlen: [1]}\n",
                       "toy.yaml");
  });
  EXPECT_NE(err.find("'varlen' is reserved: it is a problem field"), std::string::npos) << err;
}
}  // namespace test_space_varlen
