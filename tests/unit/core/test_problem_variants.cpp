// Attention variants in a problem spec (`window=L,R`, `softcap=C`, `sinks=1`): parsing and its
// canonical form (causal is a window whose right side is 0), the text and JSON round trips (plain
// problems read as they always did), the database's `variants` text, refusals, and FLOPs and bytes
// that count only what a window lets a query see.
#include <random>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "core/problem.hpp"

namespace test_problem_variants {
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

// Visible pairs counted one by one: query i (bottom-right aligned) sees key j iff
// i' - left <= j <= i' + right (-1 unbounded).
double brute_pairs(long long lq, long long lk, long long left, long long right) {
  double n = 0;
  for (long long i = 0; i < lq; ++i)
    for (long long j = 0; j < lk; ++j) {
      const long long x = i + lk - lq;
      if ((left < 0 || j >= x - left) && (right < 0 || j <= x + right)) ++n;
    }
  return n;
}

// K/V rows some query sees, counted one by one.
long long brute_keys(long long lq, long long lk, long long left, long long right) {
  long long n = 0;
  for (long long j = 0; j < lk; ++j) {
    bool seen = false;
    for (long long i = 0; i < lq && !seen; ++i) {
      const long long x = i + lk - lq;
      seen = (left < 0 || j >= x - left) && (right < 0 || j <= x + right);
    }
    n += seen;
  }
  return n;
}

}  // namespace

TEST(ProblemVariants, ParsesPrintsAndRoundTrips) {
  const Problem w = Problem::parse("b=1,h=64,hkv=8,s=8192,d=64,dtype=bf16,causal=1,window=128,sinks=1");
  EXPECT_TRUE(w.windowed());
  EXPECT_EQ(w.window_left, 128);
  EXPECT_EQ(w.window_right, -1);  // causal bounds it
  EXPECT_EQ(w.right_bound(), 0);
  EXPECT_TRUE(w.sinks);
  EXPECT_EQ(w.str(), "b=1,h=64,hkv=8,s=8192,sk=8192,d=64,dtype=bf16,causal=1,window=128,sinks=1");
  EXPECT_EQ(w.variant_spec(), "window=128,sinks=1");
  EXPECT_EQ(Problem::parse(w.str()), w);
  EXPECT_EQ(Problem::from_json(w.json()), w);
  EXPECT_EQ(w.json()["window"], nlohmann::json::array({128, -1}));
  EXPECT_EQ(w.json()["sinks"], true);

  const Problem two = Problem::parse("b=2,h=16,hkv=8,s=1000,sk=3000,d=256,dtype=fp16,causal=0,window=100,64,softcap=50");
  EXPECT_EQ(two.window_left, 100);
  EXPECT_EQ(two.window_right, 64);
  EXPECT_EQ(two.softcap, 50);
  EXPECT_EQ(two.str(), "b=2,h=16,hkv=8,s=1000,sk=3000,d=256,dtype=fp16,causal=0,window=100,64,softcap=50");
  EXPECT_EQ(Problem::parse(two.str()), two);
  EXPECT_EQ(Problem::from_json(two.json()), two);
  EXPECT_EQ(two.variant_words(), "window=100,64 softcap=50");

  // The window may come before other keys, its right side a bare integer after it.
  EXPECT_EQ(Problem::parse("window=100,64,b=2,h=16,hkv=8,s=1000,sk=3000,d=256,dtype=fp16,causal=0,softcap=50"), two);
  // A fractional cap prints in its shortest form and reads back the same.
  const Problem frac = Problem::parse("b=1,h=8,s=64,d=128,dtype=bf16,causal=1,softcap=30.5");
  EXPECT_EQ(frac.str(), "b=1,h=8,hkv=8,s=64,sk=64,d=128,dtype=bf16,causal=1,softcap=30.5");
  EXPECT_EQ(Problem::parse(frac.str()), frac);

  // The database's variants text reads back into a problem whose other fields it was given.
  Problem plain = Problem::parse("b=2,h=16,hkv=8,s=1000,sk=3000,d=256,dtype=fp16,causal=0");
  EXPECT_EQ(plain.variant_spec(), "");
  plain.set_variants(two.variant_spec());
  EXPECT_EQ(plain, two);
  plain.set_variants("");
  EXPECT_FALSE(plain.has_variant());
}

TEST(ProblemVariants, CausalIsAWindowWhoseRightSideIsZero) {
  const Problem a = Problem::parse("b=1,h=8,s=512,d=64,dtype=bf16,causal=0,window=64,0");
  const Problem b = Problem::parse("b=1,h=8,s=512,d=64,dtype=bf16,causal=1,window=64");
  EXPECT_EQ(a, b);
  EXPECT_TRUE(a.causal);
  EXPECT_EQ(a.str(), b.str());
  // A causal problem's window given with R = 0 or R = -1 is the same window.
  EXPECT_EQ(Problem::parse("b=1,h=8,s=512,d=64,dtype=bf16,causal=1,window=64,0"), b);
  EXPECT_EQ(Problem::parse("b=1,h=8,s=512,d=64,dtype=bf16,causal=1,window=64,-1"), b);
  // (-1, 0) is causal attention, (-1, -1) no window: plain problems.
  const Problem c = Problem::parse("b=1,h=8,s=512,d=64,dtype=bf16,causal=0,window=-1,0");
  EXPECT_FALSE(c.windowed());
  EXPECT_TRUE(c.causal);
  EXPECT_EQ(c.str(), "b=1,h=8,hkv=8,s=512,sk=512,d=64,dtype=bf16,causal=1");
  EXPECT_EQ(Problem::parse("b=1,h=8,s=512,d=64,dtype=bf16,causal=0,window=-1,-1").str(),
            "b=1,h=8,hkv=8,s=512,sk=512,d=64,dtype=bf16,causal=0");
  // A left-unbounded window that reaches right of the diagonal.
  const Problem r = Problem::parse("b=1,h=8,s=512,d=64,dtype=bf16,causal=0,window=-1,5");
  EXPECT_TRUE(r.windowed());
  EXPECT_EQ(r.str(), "b=1,h=8,hkv=8,s=512,sk=512,d=64,dtype=bf16,causal=0,window=-1,5");
  EXPECT_EQ(Problem::parse(r.str()), r);
}

TEST(ProblemVariants, PlainProblemsReadAsTheyAlwaysDid) {
  const Problem p = Problem::parse("b=4,h=16,s=4096,d=128,dtype=bf16,causal=0");
  EXPECT_FALSE(p.has_variant());
  EXPECT_EQ(p.str(), "b=4,h=16,hkv=16,s=4096,sk=4096,d=128,dtype=bf16,causal=0");
  EXPECT_EQ(p.json().dump(), R"({"b":4,"causal":false,"d":128,"dtype":"bf16","h":16,"hkv":16,"s":4096,"sk":4096})");
  EXPECT_EQ(p.variant_words(), "");
}

TEST(ProblemVariants, RejectsBadSpecsWithOneLineReasons) {
  const std::string base = "b=1,h=8,s=64,d=64,dtype=bf16,";
  EXPECT_NE(error_of(base + "causal=1,window=8,4").find("causal=1 with window=8,4"), std::string::npos);
  EXPECT_NE(error_of(base + "causal=0,window=-2").find("out of range"), std::string::npos);
  EXPECT_NE(error_of(base + "causal=0,window=8,-3").find("out of range"), std::string::npos);
  EXPECT_NE(error_of(base + "causal=0,window=x").find("expected an integer"), std::string::npos);
  EXPECT_NE(error_of(base + "causal=0,softcap=-1").find("out of range"), std::string::npos);
  EXPECT_NE(error_of(base + "causal=0,softcap=nan").find("expected a number"), std::string::npos);
  EXPECT_NE(error_of(base + "causal=0,softcap=abc").find("expected a number"), std::string::npos);
  EXPECT_NE(error_of(base + "causal=0,sinks=2").find("expected 0 or 1"), std::string::npos);
  EXPECT_NE(error_of(base + "causal=0,window=4,window=5").find("given twice"), std::string::npos);
  // A bare integer anywhere but after window= is not a key.
  EXPECT_NE(error_of(base + "causal=0,7").find("not key=value"), std::string::npos);
  EXPECT_NE(error_of(base + "causal=0,window=4,5,6").find("not key=value"), std::string::npos);
  EXPECT_NE(error_of(base + "causal=0,wl=4").find("unknown key 'wl'"), std::string::npos);
}

TEST(ProblemVariants, FlopsCountTheWindowsPairsExactly) {
  // The closed form against a count of every pair, over random lengths and windows (lq > lk too).
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 400; ++trial) {
    const long long lq = 1 + static_cast<long long>(rng() % 40), lk = 1 + static_cast<long long>(rng() % 40);
    const long long left = static_cast<long long>(rng() % 50) - 1, right = static_cast<long long>(rng() % 50) - 1;
    const bool causal = rng() % 2;
    const std::string spec = fmt::format("b=3,h=2,s={},sk={},d=16,dtype=fp16,causal={},window={}{}", lq, lk,
                                         causal ? 1 : 0, left, causal ? "" : fmt::format(",{}", right));
    const Problem p = Problem::parse(spec);
    const double want = brute_pairs(lq, lk, p.window_left, p.right_bound());
    EXPECT_DOUBLE_EQ(p.flops(), 4.0 * 3 * 2 * 16 * want) << spec;
    const long long keys = p.windowed() ? brute_keys(lq, lk, p.window_left, p.right_bound()) : lk;
    EXPECT_DOUBLE_EQ(p.bytes(), 2.0 * 16 * (2.0 * 3 * 2 * double(keys) + 2.0 * 3 * 2 * double(lq))) << spec;
  }
  // gpt-oss's windowed prefill: 8192 rows see at most 129 keys each.
  const Problem g = Problem::parse("b=1,h=64,hkv=8,s=8192,d=64,dtype=bf16,causal=1,window=128");
  EXPECT_DOUBLE_EQ(g.flops(), 4.0 * 64 * 64 * (8192.0 * 129 - 128.0 * 129 / 2));
  // Decode over 32k keys with a window of 4096 reads only the window's keys.
  const Problem dec = Problem::parse("b=16,h=32,hkv=8,s=1,sk=32768,d=128,dtype=bf16,causal=1,window=4096,page=16");
  EXPECT_DOUBLE_EQ(dec.bytes(), 2.0 * 128 * (2.0 * 16 * 8 * 4097 + 2.0 * 16 * 32 * 1));
}

TEST(ProblemVariants, VarlenSequencesAreEachWindowedOnTheirOwn) {
  const Problem p = Problem::parse("b=5,h=2,s=300,sk=340,d=16,dtype=bf16,causal=1,varlen=3,window=17");
  double want = 0;
  for (int lq : p.q_lens()) want += brute_pairs(lq, lq + 40, 17, 0);
  EXPECT_DOUBLE_EQ(p.flops(), 4.0 * 2 * 16 * want);
}
}  // namespace test_problem_variants
