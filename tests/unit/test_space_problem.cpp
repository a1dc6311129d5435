#include <gtest/gtest.h>

#include "core/error.hpp"
#include "core/problem.hpp"

namespace test_space_problem {
using namespace attntune;

TEST(Problem, ParsesAndDefaults) {
  auto p = Problem::parse("b=4,h=16,s=4096,d=128,dtype=bf16,causal=1");
  EXPECT_EQ(p.hkv, 16);
  EXPECT_EQ(p.sk, 4096);
  EXPECT_TRUE(p.causal);
  EXPECT_EQ(p.str(), "b=4,h=16,hkv=16,s=4096,sk=4096,d=128,dtype=bf16,causal=1");
  EXPECT_EQ(Problem::parse(p.str()), p);
  EXPECT_EQ(Problem::from_json(p.json()), p);
}

static std::string error_of(const std::string& spec) {
  try {
    Problem::parse(spec);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Problem, RejectsBadSpecsWithReasons) {
  EXPECT_NE(error_of("b=4,h=16,s=4096,d=128,dtype=bf16").find("missing key 'causal'"), std::string::npos);
  EXPECT_NE(error_of("b=4,h=16,s=4096,d=128,dtype=fp32,causal=0").find("expected fp16, bf16 or fp8"), std::string::npos);
  EXPECT_NE(error_of("b=4,h=16,s=4096,d=128,dtype=bf16,causal=0,x=1").find("unknown key 'x'"), std::string::npos);
  EXPECT_NE(error_of("b=4,h=16,hkv=5,s=4096,d=128,dtype=bf16,causal=0").find("not a multiple of hkv=5"), std::string::npos);
  EXPECT_NE(error_of("b=0,h=16,s=4096,d=128,dtype=bf16,causal=0").find("out of range"), std::string::npos);
  EXPECT_NE(error_of("b=4k,h=16,s=4096,d=128,dtype=bf16,causal=0").find("expected an integer"), std::string::npos);
  EXPECT_NE(error_of("b=4,b=4,h=16,s=4096,d=128,dtype=bf16,causal=0").find("given twice"), std::string::npos);
  EXPECT_NE(error_of("b=4,,h=16").find("not key=value"), std::string::npos);
  EXPECT_NE(error_of("").find("empty spec"), std::string::npos);
  EXPECT_NE(error_of("b=4,h=16,s=4096,d=128,dtype=bf16,causal=2").find("expected 0 or 1"), std::string::npos);
}

TEST(Problem, FlopsCountVisiblePairs) {
  auto p = Problem::parse("b=1,h=1,s=4,d=8,dtype=fp16,causal=0");
  EXPECT_DOUBLE_EQ(p.flops(), 4.0 * 8 * 16);
  p.causal = true;  // 1+2+3+4 visible pairs
  EXPECT_DOUBLE_EQ(p.flops(), 4.0 * 8 * 10);
  auto q = Problem::parse("b=1,h=1,s=2,sk=5,d=8,dtype=fp16,causal=1");  // rows see 4 and 5 keys
  EXPECT_DOUBLE_EQ(q.flops(), 4.0 * 8 * 9);
  auto r = Problem::parse("b=1,h=1,s=5,sk=2,d=8,dtype=fp16,causal=1");  // rows see 0,0,0,1,2
  EXPECT_DOUBLE_EQ(r.flops(), 4.0 * 8 * 3);
}
}  // namespace test_space_problem
