// The ragged batch a varlen problem is validated on besides its own lengths (no GPU needed to pick
// the lengths): empty sequences first and last, the longest, one row, an odd length and random
// ones, the others capped so the batch stays small.
#include <algorithm>

#include <gtest/gtest.h>

#include "eval/attention_gpu.hpp"

namespace test_varlen_inputs {
using namespace attntune;

TEST(VarlenInputs, TheRaggedBatchHoldsEveryKindOfLength) {
  for (const char* spec : {"b=2,h=8,s=4096,sk=4096,d=128,dtype=bf16,causal=1,varlen=1024",
                           "b=64,h=8,s=300,sk=500,d=64,dtype=fp16,causal=0,varlen=1",
                           "b=1,h=1,s=1,d=64,dtype=fp16,causal=1,varlen=1",
                           "b=1,h=1,s=2,d=64,dtype=fp16,causal=1,varlen=2"}) {
    SCOPED_TRACE(spec);
    const Problem p = Problem::parse(spec);
    const std::vector<int> lens = varlen_ragged_lens(p, 17);
    ASSERT_GE(lens.size(), 5u);
    EXPECT_EQ(lens.front(), 0);
    EXPECT_EQ(lens.back(), 0);
    EXPECT_EQ(lens[1], p.s) << "the longest";
    EXPECT_NE(std::find(lens.begin(), lens.end(), 1), lens.end());
    EXPECT_TRUE(std::any_of(lens.begin(), lens.end(), [](int l) { return l % 2 == 1; }));
    const int cap = static_cast<int>(std::min<std::int64_t>(p.s, 1531));
    for (std::size_t i = 0; i < lens.size(); ++i) {
      EXPECT_GE(lens[i], 0);
      if (i != 1) {
        EXPECT_LE(lens[i], cap) << "length " << i;
      }
    }
    EXPECT_EQ(lens, varlen_ragged_lens(p, 17)) << "a seed's draw";
  }
  const Problem p = Problem::parse("b=2,h=8,s=4096,d=128,dtype=bf16,causal=1,varlen=1024");
  EXPECT_NE(varlen_ragged_lens(p, 1), varlen_ragged_lens(p, 2)) << "random lengths change with the seed";
}
}  // namespace test_varlen_inputs
