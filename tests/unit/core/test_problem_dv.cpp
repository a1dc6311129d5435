// A value head dim other than the query/key one (`dv=N`; DeepSeek's MLA prefill is d=192,dv=128):
// parsing and its one form (dv equal to d is no dv), the text and JSON round trips (problems with one
// head dim read as they always did), FLOPs and bytes that count each operand at its own dim, the
// spaces that refuse it unless they list `dv`, and the database (schema version 10) that keeps a
// (192, 128) problem apart from its (192, 192) shape.
#include <algorithm>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/config.hpp"
#include "core/problem.hpp"
#include "db/store.hpp"
#include "space/search_space.hpp"
#include "tests/common/input_error.hpp"
#include "tests/unit/db/db_test_util.hpp"

namespace attntune::test {
namespace test_problem_dv {
namespace {

using attntune::testing::input_error_of;

const char* kMla = "b=1,h=128,s=8192,d=192,dv=128,dtype=bf16,causal=1";
const char* kSquare = "b=1,h=128,s=8192,d=192,dtype=bf16,causal=1";

TEST(ProblemDv, ParsesPrintsAndRoundTrips) {
  const Problem p = Problem::parse(kMla);
  EXPECT_EQ(p.d, 192);
  EXPECT_EQ(p.dv, 128);
  EXPECT_TRUE(p.split_dims());
  EXPECT_EQ(p.head_dim_v(), 128);
  EXPECT_EQ(p.str(), "b=1,h=128,hkv=128,s=8192,sk=8192,d=192,dv=128,dtype=bf16,causal=1");
  EXPECT_EQ(Problem::parse(p.str()), p);
  EXPECT_EQ(p.json().at("dv"), 128);
  EXPECT_EQ(Problem::from_json(p.json()), p);
  EXPECT_EQ(p.ordered_json().dump(),
            R"({"b":1,"h":128,"hkv":128,"s":8192,"sk":8192,"d":192,"dv":128,"dtype":"bf16","causal":true})");
  // dv equal to d is one head dim: the same problem, printed and stored as it always was.
  const Problem same = Problem::parse("b=1,h=128,s=8192,d=192,dv=192,dtype=bf16,causal=1");
  EXPECT_EQ(same, Problem::parse(kSquare));
  EXPECT_FALSE(same.split_dims());
  EXPECT_EQ(same.head_dim_v(), 192);
  EXPECT_EQ(same.str(), "b=1,h=128,hkv=128,s=8192,sk=8192,d=192,dtype=bf16,causal=1");
  EXPECT_FALSE(same.json().contains("dv"));
  nlohmann::json j = same.json();
  j["dv"] = 192;
  EXPECT_EQ(Problem::from_json(j), same);
  // Its place in the spec is free, like every key's.
  EXPECT_EQ(Problem::parse("dv=128,b=1,h=128,s=8192,d=192,dtype=bf16,causal=1"), p);
}

TEST(ProblemDv, RefusesBadValues) {
  EXPECT_NE(input_error_of([] { Problem::parse("b=1,h=2,s=8,d=64,dv=0,dtype=bf16,causal=0"); }).find("dv"),
            std::string::npos);
  EXPECT_NE(input_error_of([] { Problem::parse("b=1,h=2,s=8,d=64,dv=x,dtype=bf16,causal=0"); }).find("dv"),
            std::string::npos);
  EXPECT_NE(input_error_of([] { Problem::parse("b=1,h=2,s=8,d=64,dv=64,dv=32,dtype=bf16,causal=0"); })
                .find("given twice"),
            std::string::npos);
  nlohmann::json j = Problem::parse(kMla).json();
  j["dv"] = -1;
  EXPECT_NE(input_error_of([&] { Problem::from_json(j); }).find("head dims"), std::string::npos);
}

TEST(ProblemDv, FlopsAndBytesCountEachOperandAtItsDim) {
  const Problem p = Problem::parse("b=2,h=4,hkv=2,s=100,sk=300,d=192,dv=128,dtype=bf16,causal=0");
  // Q.K^T at 192, P.V at 128: 2 * pairs * (d + dv).
  EXPECT_DOUBLE_EQ(p.flops(), 2.0 * 2 * 4 * 100 * 300 * (192 + 128));
  // K (192) and V (128) once per KV head, Q (192) read and O (128) written: 2 bytes an element.
  EXPECT_DOUBLE_EQ(p.bytes(), 2.0 * (2 * 2 * 300 * (192 + 128) + 2 * 4 * 100 * (192 + 128)));
  // One head dim: what it always was.
  const Problem q = Problem::parse("b=2,h=4,hkv=2,s=100,sk=300,d=128,dtype=bf16,causal=1");
  double pairs = 0;
  for (int i = 0; i < 100; ++i) pairs += i + 200 + 1;
  EXPECT_DOUBLE_EQ(q.flops(), 4.0 * 2 * 4 * 128 * pairs);
  EXPECT_DOUBLE_EQ(q.bytes(), 2.0 * 128 * (2.0 * 2 * 2 * 300 + 2.0 * 2 * 4 * 100));
}

TEST(ProblemDv, ShippedSpacesServeItOrRefuseItWithTheReason) {
  // The prefill families serve it; their valid configs are those of the (192, 192) shape whose
  // shared memory and registers (O at dv) fit, V's tiles smaller.
  for (const char* family : {"flash_fwd_mma", "flash_fwd_wgmma"}) {
    const auto space = SearchSpace::shipped(family);
    ASSERT_TRUE(space) << family;
    const std::vector<std::string> archs =
        std::string(family) == "flash_fwd_mma" ? std::vector<std::string>{"sm_80", "sm_89", "sm_90"}
                                               : std::vector<std::string>{"sm_90a"};
    for (const std::string& arch : archs) {
      EXPECT_NO_THROW(space->check_problem(Problem::parse(kMla), arch));
      const auto split = space->enumerate(Problem::parse(kMla), arch);
      const auto square = space->enumerate(Problem::parse(kSquare), arch);
      EXPECT_FALSE(split.empty()) << family << " " << arch;
      for (const Config& c : square)
        EXPECT_NE(std::find(split.begin(), split.end(), c), split.end()) << family << " " << arch << " " << config_str(c);
    }
    EXPECT_NE(input_error_of([&] {
                space->check_problem(Problem::parse("b=1,h=2,s=64,d=192,dv=120,dtype=bf16,causal=0"),
                                     space->default_arch());
              }).find("V's head dim"),
              std::string::npos)
        << family;
  }
  // flash_decode serves it too (a paged cache, one KV head).
  const auto decode = SearchSpace::shipped("flash_decode");
  ASSERT_TRUE(decode);
  for (const char* arch : {"sm_80", "sm_89", "sm_90"})
    EXPECT_FALSE(
        decode->enumerate(Problem::parse("b=16,h=16,hkv=1,s=1,sk=4096,d=192,dv=128,dtype=bf16,causal=0,page=64"), arch)
            .empty())
        << arch;
  // A space that does not list dv refuses it with the reason.
  const SearchSpace plain = SearchSpace::parse(R"(family: flash_fwd_mma
archs: [sm_80]
device_limits:
  sm_80: {max_smem_per_block: 166912}
params:
  block_m: [64, 128]
)",
                                               "plain.yaml");
  const std::string why = input_error_of([&] { plain.check_problem(Problem::parse(kMla), "sm_80"); });
  EXPECT_NE(why.find("flash_fwd_mma does not support a value head dim other than the query/key one"), std::string::npos)
      << why;
  EXPECT_NE(why.find("d=192, dv=128"), std::string::npos) << why;
  EXPECT_NO_THROW(plain.check_problem(Problem::parse(kSquare), "sm_80"));
}

TEST(ProblemDv, ASpaceThatListsDvServesItAndItsConstraintsSeeIt) {
  const std::string yaml = R"(family: flash_fwd_mma
archs: [sm_80]
device_limits:
  sm_80: {max_smem_per_block: 166912}
problem:
  d: [64, 192]
  dv: [64, 128, 192]
  constraints:
    - {expr: "dv <= d", why: "V's head dim at most Q's in this test"}
params:
  block_m: [64, 128]
)";
  const SearchSpace space = SearchSpace::parse(yaml, "dv_test.yaml");
  EXPECT_NO_THROW(space.check_problem(Problem::parse(kMla), "sm_80"));
  EXPECT_NO_THROW(space.check_problem(Problem::parse(kSquare), "sm_80"));
  EXPECT_NE(input_error_of([&] {
              space.check_problem(Problem::parse("b=1,h=2,s=8,d=64,dv=128,dtype=bf16,causal=0"), "sm_80");
            }).find("V's head dim at most Q's in this test"),
            std::string::npos);
  EXPECT_NE(input_error_of([&] {
              space.check_problem(Problem::parse("b=1,h=2,s=8,d=192,dv=96,dtype=bf16,causal=0"), "sm_80");
            }).find("does not support dv=96 (supported: 64, 128, 192)"),
            std::string::npos);
}

TEST(ProblemDvDb, TheStoreKeepsItApartFromItsSquareShape) {
  TempDir dir;
  const std::string path = dir.file("results.db");
  Store store = Store::open(path, Store::Mode::kCreate);
  const std::int64_t dev = store.upsert_device(h100());
  const std::int64_t mla = store.open_campaign(spec("mla", problem(kMla)), dev);
  const std::int64_t square = store.open_campaign(spec("square", problem(kSquare)), dev);
  store.record_evaluation(mla, store.upsert_candidate("flash_fwd_mma", config(128, 64), "m1"), dev, ok_eval(100));
  store.record_evaluation(square, store.upsert_candidate("flash_fwd_mma", config(64, 64), "s1"), dev, ok_eval(90));
  BestQuery q;
  q.problem = problem(kMla);
  const auto rows = store.best(q);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].campaign, "mla");
  EXPECT_EQ(rows[0].problem, problem(kMla));
  q.problem = problem(kSquare);
  const auto square_rows = store.best(q);
  ASSERT_EQ(square_rows.size(), 1u);
  EXPECT_EQ(square_rows[0].campaign, "square");
  EXPECT_EQ(store.campaign_row("mla")->spec.problem, problem(kMla));
  EXPECT_NE(input_error_of([&] { store.check_resume(spec("mla", problem(kSquare))); }).find("cannot be resumed"),
            std::string::npos);
}

}  // namespace
}  // namespace test_problem_dv
}  // namespace attntune::test
