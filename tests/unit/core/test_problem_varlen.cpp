// `varlen=N` (and `lens_seed=M`): a packed batch of sequences of lengths drawn from N..s, for
// attntune_attention_forward_varlen. The spec, its canonical text and JSON, the generator (fixed:
// tools reproduce it, and recorded campaigns name their problems by it), FLOPs and bytes.
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.hpp"
#include "core/problem.hpp"

namespace test_problem_varlen {
using namespace attntune;

namespace {

std::string error_of(const std::string& spec) {
  try {
    Problem::parse(spec);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// Visible pairs of one sequence counted one by one (bottom-right aligned when causal).
double brute_pairs(long long lq, long long lk, bool causal) {
  double n = 0;
  for (long long i = 0; i < lq; ++i)
    for (long long j = 0; j < lk; ++j)
      if (!causal || j <= i + lk - lq) ++n;
  return n;
}

const char* kDense = "b=8,h=32,hkv=8,s=4096,sk=4096,d=128,dtype=bf16,causal=1";

}  // namespace

TEST(ProblemVarlen, ParsesPrintsAndRoundTrips) {
  const Problem p = Problem::parse("b=8,h=32,hkv=8,s=4096,d=128,dtype=bf16,causal=1,varlen=128");
  EXPECT_TRUE(p.is_varlen());
  EXPECT_FALSE(p.paged());
  EXPECT_EQ(p.varlen, 128);
  EXPECT_EQ(p.lens_seed, 0);
  EXPECT_EQ(p.str(), "b=8,h=32,hkv=8,s=4096,sk=4096,d=128,dtype=bf16,causal=1,varlen=128");
  EXPECT_EQ(Problem::parse(p.str()), p);
  EXPECT_EQ(Problem::from_json(p.json()), p);
  EXPECT_EQ(p.json().at("varlen"), 128);
  EXPECT_EQ(p.json().at("lens_seed"), 0);

  const Problem q = Problem::parse("lens_seed=7,varlen=1,b=2,h=4,s=100,sk=130,d=64,dtype=fp16,causal=0");
  EXPECT_EQ(q.str(), "b=2,h=4,hkv=4,s=100,sk=130,d=64,dtype=fp16,causal=0,varlen=1,lens_seed=7");
  EXPECT_EQ(Problem::parse(q.str()), q);
  EXPECT_EQ(Problem::from_json(q.json()), q);
  EXPECT_EQ(Problem::from_json(nlohmann::json::parse(q.json().dump())), q);
  EXPECT_NE(q, Problem::parse("b=2,h=4,s=100,sk=130,d=64,dtype=fp16,causal=0,varlen=1")) << "another draw";
  EXPECT_NE(p, Problem::parse(kDense)) << "a packed batch is not its dense shape";

  // varlen=0 is the dense problem, spelled as it always was.
  const Problem d = Problem::parse(std::string(kDense) + ",varlen=0");
  EXPECT_FALSE(d.is_varlen());
  EXPECT_EQ(d, Problem::parse(kDense));
  EXPECT_EQ(d.str(), kDense);
}

TEST(ProblemVarlen, DenseAndPagedTextAndJsonAreUnchanged) {
  const Problem d = Problem::parse(kDense);
  EXPECT_EQ(d.json().dump(),
            R"({"b":8,"causal":true,"d":128,"dtype":"bf16","h":32,"hkv":8,"s":4096,"sk":4096})");
  EXPECT_TRUE(d.q_lens().empty());
  EXPECT_TRUE(d.k_lens().empty());
  EXPECT_EQ(d.total_q(), 8 * 4096);
  EXPECT_EQ(d.total_k(), 8 * 4096);
  const Problem p = Problem::parse("b=4,h=16,s=1,sk=8192,d=128,dtype=bf16,causal=1,page=16");
  EXPECT_EQ(p.str(), "b=4,h=16,hkv=16,s=1,sk=8192,d=128,dtype=bf16,causal=1,page=16");
  EXPECT_EQ(p.json().dump(),
            R"({"b":4,"causal":true,"d":128,"dtype":"bf16","h":16,"hkv":16,"page":16,"s":1,"sk":8192})");
  EXPECT_EQ(Problem::from_json(nlohmann::json::parse(
                R"({"b":4,"causal":true,"d":128,"dtype":"bf16","h":16,"hkv":16,"s":1,"sk":8192})")),
            Problem::parse("b=4,h=16,s=1,sk=8192,d=128,dtype=bf16,causal=1"))
      << "JSON without varlen reads as before";
}

TEST(ProblemVarlen, RejectsBadSpecsWithOneLineReasons) {
  const std::string base = "b=4,h=16,s=512,sk=512,d=128,dtype=bf16,causal=1";
  EXPECT_NE(error_of(base + ",varlen=513").find("varlen=513 is longer than s=512"), std::string::npos);
  EXPECT_NE(error_of(base + ",varlen=16,page=16").find("different entry points"), std::string::npos);
  EXPECT_NE(error_of("b=4,h=16,s=512,sk=256,d=128,dtype=bf16,causal=1,varlen=1").find("varlen needs sk >= s"),
            std::string::npos);
  EXPECT_NE(error_of(base + ",lens_seed=3").find("lens_seed=3 needs varlen=N"), std::string::npos);
  EXPECT_NE(error_of(base + ",varlen=0,lens_seed=3").find("needs varlen=N"), std::string::npos);
  EXPECT_NE(error_of(base + ",varlen=-1").find("out of range"), std::string::npos);
  EXPECT_NE(error_of(base + ",varlen=1,lens_seed=-1").find("out of range"), std::string::npos);
  EXPECT_NE(error_of(base + ",varlen=x").find("expected an integer"), std::string::npos);
  EXPECT_NE(error_of(base + ",varlen=1,varlen=2").find("given twice"), std::string::npos);
  EXPECT_NE(error_of("b=65536,h=1,s=65536,d=64,dtype=bf16,causal=0,varlen=1").find("cu_seqlens are int"),
            std::string::npos);
  const std::string unknown = error_of(base + ",lens=3");
  EXPECT_NE(unknown.find("unknown key 'lens' (known: b, h, hkv, s, sk, d, dtype, causal, page, varlen, lens_seed, window, softcap, sinks, dv, latent, kv_dtype, pass)"),
            std::string::npos)
      << unknown;
  for (const std::string& bad : {base + ",varlen=513", base + ",varlen=16,page=16", base + ",lens_seed=3"})
    EXPECT_EQ(error_of(bad).find('\n'), std::string::npos) << bad;
  EXPECT_THROW(Problem::from_json(nlohmann::json::parse(
                   R"({"b":4,"causal":true,"d":128,"dtype":"bf16","h":16,"hkv":16,"s":8,"sk":8,"varlen":9})")),
               InputError);
}

// The generator is part of the problem's identity: this pins it (and tools' copies of it).
TEST(ProblemVarlen, LengthsAreAFixedDraw) {
  const Problem p = Problem::parse("b=8,h=32,hkv=8,s=4096,d=128,dtype=bf16,causal=1,varlen=128");
  EXPECT_EQ(p.q_lens(), (std::vector<int>{1026, 3881, 1488, 3429, 2013, 2111, 556, 865}));
  EXPECT_EQ(p.q_lens(), p.q_lens());
  const Problem seeded = Problem::parse("b=8,h=32,hkv=8,s=4096,d=128,dtype=bf16,causal=1,varlen=128,lens_seed=7");
  EXPECT_EQ(seeded.q_lens(), (std::vector<int>{284, 3932, 3026, 1664, 2520, 3893, 3024, 2354}));
  const Problem small = Problem::parse("b=5,h=2,s=100,sk=120,d=8,dtype=fp16,causal=1,varlen=1,lens_seed=42");
  EXPECT_EQ(small.q_lens(), (std::vector<int>{14, 92, 59, 65, 51}));
  EXPECT_EQ(small.k_lens(), (std::vector<int>{34, 112, 79, 85, 71}));
  EXPECT_EQ(small.total_q(), 14 + 92 + 59 + 65 + 51);
  EXPECT_EQ(small.total_k(), small.total_q() + 5 * 20);
  // varlen=s: every sequence is s long.
  const Problem full = Problem::parse("b=3,h=2,s=77,d=8,dtype=fp16,causal=0,varlen=77,lens_seed=5");
  EXPECT_EQ(full.q_lens(), (std::vector<int>{77, 77, 77}));
  // Every draw lies in varlen..s.
  const Problem wide = Problem::parse("b=1000,h=1,s=300,d=8,dtype=fp16,causal=0,varlen=200,lens_seed=99");
  const std::vector<int> lens = wide.q_lens();
  ASSERT_EQ(lens.size(), 1000u);
  EXPECT_EQ(*std::min_element(lens.begin(), lens.end()), 200);
  EXPECT_EQ(*std::max_element(lens.begin(), lens.end()), 300);
}

TEST(ProblemVarlen, FlopsSumEachSequenceBottomRightAligned) {
  for (const char* spec : {"b=5,h=2,s=100,sk=120,d=8,dtype=fp16,causal=1,varlen=1,lens_seed=42",
                           "b=5,h=2,s=100,sk=120,d=8,dtype=fp16,causal=0,varlen=1,lens_seed=42",
                           "b=7,h=3,s=64,sk=64,d=16,dtype=bf16,causal=1,varlen=1,lens_seed=1"}) {
    const Problem p = Problem::parse(spec);
    const std::vector<int> q = p.q_lens(), k = p.k_lens();
    double pairs = 0;
    for (std::size_t i = 0; i < q.size(); ++i) pairs += brute_pairs(q[i], k[i], p.causal);
    EXPECT_DOUBLE_EQ(p.flops(), 4.0 * p.h * p.d * pairs) << spec;
    const double rows_q = double(p.total_q()), rows_k = double(p.total_k());
    EXPECT_DOUBLE_EQ(p.bytes(), 2.0 * p.d * (2.0 * p.hkv * rows_k + 2.0 * p.h * rows_q)) << spec;
  }
  // Every sequence s long: the dense problem's FLOPs and bytes.
  for (const char* causal : {"0", "1"}) {
    const std::string dims = std::string("b=3,h=4,hkv=2,s=96,sk=160,d=64,dtype=bf16,causal=") + causal;
    const Problem v = Problem::parse(dims + ",varlen=96"), d = Problem::parse(dims);
    EXPECT_DOUBLE_EQ(v.flops(), d.flops()) << dims;
    EXPECT_DOUBLE_EQ(v.bytes(), d.bytes()) << dims;
  }
}
}  // namespace test_problem_varlen
