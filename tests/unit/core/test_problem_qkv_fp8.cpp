// The FP8 forward (`dtype=fp8`: Q, K and V FP8 e4m3, V given transposed, O bf16; issue 42): parsing
// and its refusals (dense tensors only: no KV cache, packed batch, latent cache, kv_dtype or backward
// pass), the text and JSON round trips (dtype=fp8 where the dtype goes), the database's form (bf16 in
// its dtype column, "dtype=fp8" in the variants column after kv_dtype, so no earlier row changes),
// bytes at one byte a Q/K/V element, and the spaces: flash_fwd_wgmma serves it, the others refuse it
// by their dtype lists.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/problem.hpp"
#include "space/search_space.hpp"
#include "tests/common/input_error.hpp"

namespace attntune::test {
namespace test_problem_qkv_fp8 {
namespace {

using attntune::testing::input_error_of;

const char* kFp8 = "b=1,h=16,hkv=16,s=16384,sk=16384,d=128,dtype=fp8,causal=1";

TEST(ProblemQkvFp8, ParsesPrintsAndRoundTrips) {
  const Problem p = Problem::parse("b=1,h=16,s=16384,d=128,dtype=fp8,causal=1");
  EXPECT_TRUE(p.qkv_fp8);
  EXPECT_EQ(p.dtype, DType::kBf16);  // O's
  EXPECT_FALSE(p.kv_fp8);
  EXPECT_STREQ(p.dtype_spec(), "fp8");
  EXPECT_EQ(p.str(), kFp8);
  EXPECT_EQ(Problem::parse(p.str()), p);
  EXPECT_EQ(p.json().at("dtype"), "fp8");
  EXPECT_EQ(Problem::from_json(p.json()), p);
  EXPECT_EQ(p.ordered_json().dump(),
            R"({"b":1,"h":16,"hkv":16,"s":16384,"sk":16384,"d":128,"dtype":"fp8","causal":true})");
  // Not the bf16 problem of the same shape, which reads as it always did.
  const Problem plain = Problem::parse("b=1,h=16,s=16384,d=128,dtype=bf16,causal=1");
  EXPECT_NE(plain, p);
  EXPECT_FALSE(plain.qkv_fp8);
  EXPECT_EQ(plain.str(), "b=1,h=16,hkv=16,s=16384,sk=16384,d=128,dtype=bf16,causal=1");
  EXPECT_EQ(plain.variants_column(), "");
  // With variants and GQA: dtype=fp8 stays where the dtype goes, the variants after.
  const Problem w = Problem::parse("sinks=1,b=2,h=32,hkv=8,s=8192,d=64,dtype=fp8,causal=1,window=127");
  EXPECT_EQ(w.str(), "b=2,h=32,hkv=8,s=8192,sk=8192,d=64,dtype=fp8,causal=1,window=127,sinks=1");
  EXPECT_EQ(Problem::parse(w.str()), w);
  EXPECT_EQ(Problem::from_json(w.json()), w);
}

TEST(ProblemQkvFp8, TheDatabaseKeepsBf16AndTheFlagInTheVariantsColumn) {
  const Problem p = Problem::parse(kFp8);
  EXPECT_EQ(p.variants_column(), "dtype=fp8");
  EXPECT_FALSE(p.has_variant());
  EXPECT_EQ(p.variant_spec(), "");
  const Problem w = Problem::parse("b=2,h=32,hkv=8,s=8192,d=64,dtype=fp8,causal=1,window=127,sinks=1");
  EXPECT_EQ(w.variants_column(), "window=127,sinks=1,dtype=fp8");
  // Read back from the columns: bf16 in dtype, the rest from the variants column.
  for (const Problem& x : {p, w}) {
    Problem back = x;
    back.qkv_fp8 = false;
    back.set_variants(std::string());
    back.set_variants_column(x.variants_column());
    EXPECT_EQ(back, x) << x.str();
  }
}

TEST(ProblemQkvFp8, RefusesWhatTheFp8ForwardIsNot) {
  const std::string base = "b=1,h=16,hkv=4,s=1024,d=128,dtype=fp8,causal=1";
  for (const auto& [extra, says] : std::vector<std::pair<std::string, std::string>>{
           {",page=16,sk=4096", "dtype=fp8 with page=16"},
           {",varlen=100", "dtype=fp8 with varlen=100"},
           {",kv_dtype=fp8", "kv_dtype=fp8 with dtype=fp8"},
           {",pass=bwd", "dtype=fp8 with pass=bwd"},
       })
    EXPECT_NE(input_error_of([&] { Problem::parse(base + extra); }).find(says), std::string::npos) << extra;
  EXPECT_NE(input_error_of([&] { Problem::parse("b=1,h=16,hkv=1,s=1,sk=64,d=576,dv=512,dtype=fp8,causal=1,latent=1"); })
                .find("dtype=fp8 with latent=1"),
            std::string::npos);
  EXPECT_NE(input_error_of([&] { Problem::parse("b=1,h=1,s=1,d=64,dtype=fp4,causal=0"); }).find("fp16, bf16 or fp8"),
            std::string::npos);
  nlohmann::json j = Problem::parse(base).json();
  j["kv_dtype"] = "fp8";
  EXPECT_THROW(Problem::from_json(j), InputError);
}

TEST(ProblemQkvFp8, BytesCountQKAndVAtOneByte) {
  const Problem p = Problem::parse("b=2,h=8,hkv=2,s=1000,sk=3000,d=128,dtype=fp8,causal=0");
  const Problem b16 = Problem::parse("b=2,h=8,hkv=2,s=1000,sk=3000,d=128,dtype=bf16,causal=0");
  // Q 2*8*1000*128 and K, V 2*2*3000*128 bytes, O at two bytes an element.
  EXPECT_DOUBLE_EQ(p.bytes(), 2.0 * 8 * 1000 * 128 + 2.0 * 2 * 3000 * 256 + 2.0 * (2.0 * 8 * 1000 * 128));
  EXPECT_DOUBLE_EQ(p.flops(), b16.flops());
}

TEST(ProblemQkvFp8, OnlyFlashFwdWgmmaServesIt) {
  const Problem p = Problem::parse(kFp8);
  const SearchSpace wgmma = SearchSpace::load(ATTNTUNE_SOURCE_DIR "/search_spaces/flash_fwd_wgmma.yaml");
  EXPECT_NO_THROW(wgmma.check_problem(p, "sm_90a"));
  for (const char* other : {"flash_fwd_mma"}) {
    const SearchSpace s = SearchSpace::load(std::string(ATTNTUNE_SOURCE_DIR "/search_spaces/") + other + ".yaml");
    const std::string arch = s.archs().back();
    EXPECT_NE(input_error_of([&] { s.check_problem(p, arch); }).find("dtype=fp8"), std::string::npos) << other;
  }
}

}  // namespace
}  // namespace test_problem_qkv_fp8
}  // namespace attntune::test
