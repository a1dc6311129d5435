// The backward pass as a problem (`pass=bwd`: dQ, dK, dV of a dense attention; issue 45): parsing and
// its refusals (pass is fwd or bwd; dense tensors of one head dim for now), the
// text and JSON round trips (every forward problem reads as it always did), the variants column that
// carries it after kv_dtype, FLOPs at 2.5x the forward's and the bytes a backward call moves, warm
// starts, and the database, which never mixes it with the forward problem of the same shape.
#include <sqlite3.h>

#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/problem.hpp"
#include "db/merge.hpp"
#include "db/sqlite.hpp"
#include "db/store.hpp"
#include "service/job.hpp"
#include "tests/common/input_error.hpp"
#include "tests/unit/db/db_test_util.hpp"

namespace attntune::test {
namespace test_problem_backward {
namespace {

using attntune::testing::input_error_of;

const char* kBwd = "b=2,h=16,hkv=4,s=4096,sk=4096,d=128,dtype=bf16,causal=1,pass=bwd";
const char* kFwd = "b=2,h=16,hkv=4,s=4096,sk=4096,d=128,dtype=bf16,causal=1";

// Sinks and soft-caps are served backward (the kernels' P = exp(S - LSE) with the forward's LSE,
// which holds the sink, and dS times the cap's derivative; the ops add the sinks' own gradient):
// parsed, printed and read back with the window and GQA.
TEST(ProblemBackward, SinksAndSoftcapsAreServedWithWindowsAndGqa) {
  const Problem p = Problem::parse("b=1,h=16,hkv=2,s=64,d=128,dtype=bf16,causal=1,window=32,sinks=1,pass=bwd");
  EXPECT_TRUE(p.backward);
  EXPECT_TRUE(p.sinks);
  EXPECT_EQ(p.str(), "b=1,h=16,hkv=2,s=64,sk=64,d=128,dtype=bf16,causal=1,window=32,sinks=1,pass=bwd");
  EXPECT_EQ(Problem::parse(p.str()), p);
  EXPECT_EQ(Problem::from_json(p.json()), p);
  const Problem c = Problem::parse("b=1,h=16,hkv=8,s=64,d=128,dtype=bf16,causal=1,softcap=50,sinks=1,pass=bwd");
  EXPECT_TRUE(c.backward);
  EXPECT_TRUE(c.softcapped());
  EXPECT_EQ(Problem::parse(c.str()), c);
  EXPECT_EQ(Problem::from_json(c.json()), c);
}

TEST(ProblemBackward, ParsesPrintsAndRoundTrips) {
  const Problem p = Problem::parse(kBwd);
  EXPECT_TRUE(p.backward);
  EXPECT_EQ(p.str(), kBwd);
  EXPECT_EQ(Problem::parse(p.str()), p);
  EXPECT_EQ(p.json().at("pass"), "bwd");
  EXPECT_EQ(Problem::from_json(p.json()), p);
  EXPECT_EQ(p.ordered_json().dump(),
            R"({"b":2,"h":16,"hkv":4,"s":4096,"sk":4096,"d":128,"dtype":"bf16","causal":true,"pass":"bwd"})");
  // Its place in the spec is free; pass=fwd is the forward problem, printed and stored as it always was.
  EXPECT_EQ(Problem::parse("pass=bwd,b=2,h=16,hkv=4,s=4096,d=128,dtype=bf16,causal=1"), p);
  const Problem fwd = Problem::parse(kFwd);
  EXPECT_FALSE(fwd.backward);
  EXPECT_NE(fwd, p);
  EXPECT_EQ(Problem::parse(std::string(kFwd) + ",pass=fwd"), fwd);
  EXPECT_EQ(fwd.str(), kFwd);
  EXPECT_FALSE(fwd.json().contains("pass"));
  EXPECT_EQ(fwd.ordered_json().dump().find("pass"), std::string::npos);
  nlohmann::json j = fwd.json();
  j["pass"] = "fwd";
  EXPECT_EQ(Problem::from_json(j), fwd);
  // At the very end, after a window (causal and two-sided, bottom-right with s != sk).
  const Problem w = Problem::parse("pass=bwd,b=1,h=8,hkv=2,s=1000,sk=3000,d=64,dtype=fp16,causal=1,window=255");
  EXPECT_EQ(w.str(), "b=1,h=8,hkv=2,s=1000,sk=3000,d=64,dtype=fp16,causal=1,window=255,pass=bwd");
  EXPECT_EQ(Problem::parse(w.str()), w);
  EXPECT_EQ(Problem::from_json(w.json()), w);
  EXPECT_EQ(w.ordered_json().dump(),
            R"({"b":1,"h":8,"hkv":2,"s":1000,"sk":3000,"d":64,"dtype":"fp16","causal":true,"window":[255,-1],)"
            R"("pass":"bwd"})");
  const Problem two = Problem::parse("b=1,h=8,s=333,sk=200,d=256,dtype=bf16,causal=0,window=16,8,pass=bwd");
  EXPECT_EQ(two.str(), "b=1,h=8,hkv=8,s=333,sk=200,d=256,dtype=bf16,causal=0,window=16,8,pass=bwd");
  EXPECT_EQ(Problem::from_json(two.json()), two);
  // dv equal to d is one head dim: served, and printed without it.
  EXPECT_EQ(Problem::parse("b=1,h=8,s=64,d=128,dv=128,dtype=bf16,causal=0,pass=bwd").str(),
            "b=1,h=8,hkv=8,s=64,sk=64,d=128,dtype=bf16,causal=0,pass=bwd");
}

TEST(ProblemBackward, IsNotAVariantButTheVariantsColumnKeepsItLast) {
  const Problem p = Problem::parse(kBwd);
  EXPECT_FALSE(p.has_variant());
  EXPECT_EQ(p.variant_spec(), "");
  EXPECT_EQ(p.variant_words(), "");
  EXPECT_EQ(p.variants_column(), "pass=bwd");
  const Problem w = Problem::parse("b=1,h=8,s=100,d=64,dtype=fp16,causal=0,window=7,3,pass=bwd");
  EXPECT_EQ(w.variants_column(), "window=7,3,pass=bwd");
  // Read back: the flag and the variants, whatever the problem held before (latent and an FP8 cache
  // included, which a backward problem cannot have but the column may hold for another).
  const Problem fp8 = Problem::parse("b=1,h=16,hkv=1,s=1,sk=64,d=192,dv=128,dtype=bf16,causal=1,window=9,latent=1,"
                                     "kv_dtype=fp8");
  for (const Problem& want : {p, w, fp8, Problem::parse(kFwd)}) {
    Problem got = Problem::parse("b=1,h=16,hkv=1,s=1,sk=64,d=128,dtype=bf16,causal=1,window=7,pass=bwd");
    got.b = want.b, got.h = want.h, got.hkv = want.hkv, got.s = want.s, got.sk = want.sk, got.d = want.d;
    got.dv = want.dv, got.dtype = want.dtype, got.causal = want.causal, got.page = want.page;
    got.set_variants_column(want.variants_column());
    EXPECT_EQ(got, want) << want.str();
  }
  // Every forward problem stores what it stored before.
  EXPECT_EQ(Problem::parse(kFwd).variants_column(), "");
  EXPECT_EQ(fp8.variants_column(), "window=9,latent=1,kv_dtype=fp8");
  // Out of its place it is no variants text.
  Problem q = Problem::parse(kFwd);
  for (const char* bad : {"pass=bwd,window=7", "pass=bwd,kv_dtype=fp8", "xpass=bwd", "pass=fwd"})
    EXPECT_THROW(q.set_variants_column(bad), InputError) << bad;
}

TEST(ProblemBackward, RefusesOtherPassesAndWhatTheBackwardDoesNotServeYetWithTheReason) {
  const std::string unknown = input_error_of([] { Problem::parse(std::string(kFwd) + ",pass=both"); });
  EXPECT_NE(unknown.find("problem: 'pass=both': expected fwd (the forward pass) or bwd (the backward pass: dQ, dK "
                         "and dV)"),
            std::string::npos)
      << unknown;
  // A training step's pair is two problems: Problem::parse_passes reads it (tests/unit/cli/test_fwdbwd.cpp).
  const std::string step = input_error_of([] { Problem::parse(std::string(kFwd) + ",pass=fwdbwd"); });
  EXPECT_NE(step.find("problem: 'pass=fwdbwd' is the pair a training step runs"), std::string::npos) << step;
  EXPECT_NE(input_error_of([] { Problem::parse(std::string(kFwd) + ",pass="); }).find("'pass='"), std::string::npos);
  EXPECT_NE(input_error_of([] { Problem::parse(std::string(kBwd) + ",pass=bwd"); }).find("key 'pass' given twice"),
            std::string::npos);
  // Each refusal names the key and what comes later.
  const std::pair<const char*, const char*> refused[] = {
      {"b=4,h=16,s=1,sk=4096,d=128,dtype=bf16,causal=1,page=16,pass=bwd", "pass=bwd with page=16: "},
      {"b=1,h=16,hkv=1,s=64,sk=64,d=192,dv=128,dtype=bf16,causal=1,latent=1,pass=bwd", "pass=bwd with latent=1: "},
      {"b=1,h=16,hkv=2,s=64,d=128,dtype=bf16,causal=1,kv_dtype=fp8,pass=bwd", "pass=bwd with kv_dtype=fp8: "},
      {"b=1,h=16,s=64,d=192,dv=128,dtype=bf16,causal=1,pass=bwd", "pass=bwd with dv=128 (d=192): "},
  };
  const char* later[] = {"paged KV caches come in a later step", "latent caches come in a later step",
                         "FP8 KV caches come in a later step", "value head dims other than d come"};
  for (std::size_t i = 0; i < std::size(refused); ++i) {
    const auto& [spec, why] = refused[i];
    const std::string e = input_error_of([&] { Problem::parse(spec); });
    EXPECT_NE(e.find(std::string("problem: ") + why +
                     "the backward pass is tuned over dense tensors and packed varlen batches of one head dim"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find(later[i]), std::string::npos) << e;
    // The same problem forward is served, and its JSON with "pass": "bwd" refused alike.
    std::string fwd = spec;
    fwd.erase(fwd.find(",pass=bwd"));
    nlohmann::json j = Problem::parse(fwd).json();
    j["pass"] = "bwd";
    const std::string ej = input_error_of([&] { Problem::from_json(j); });
    EXPECT_NE(ej.find(std::string("problem JSON: ") + why), std::string::npos) << ej;
  }
  nlohmann::json j = Problem::parse(kFwd).json();
  j["pass"] = "sideways";
  EXPECT_NE(input_error_of([&] { Problem::from_json(j); }).find("problem JSON: 'pass=sideways': expected fwd"),
            std::string::npos);
  j["pass"] = true;
  EXPECT_NE(input_error_of([&] { Problem::from_json(j); }).find("pass must be a string"), std::string::npos);
}

TEST(ProblemBackward, FlopsAreTwoAndAHalfTimesTheForwardsAndBytesWhatABackwardMoves) {
  for (const char* spec : {"b=2,h=16,hkv=4,s=4096,sk=4096,d=128,dtype=bf16,causal=0",
                           "b=2,h=16,hkv=4,s=1000,sk=3001,d=64,dtype=fp16,causal=1",
                           "b=1,h=8,s=333,sk=200,d=256,dtype=bf16,causal=0,window=16,8"}) {
    const Problem fwd = Problem::parse(spec), bwd = Problem::parse(std::string(spec) + ",pass=bwd");
    EXPECT_DOUBLE_EQ(bwd.flops(), 2.5 * fwd.flops()) << spec;
  }
  EXPECT_DOUBLE_EQ(Problem::parse("b=1,h=1,s=10,d=16,dtype=bf16,causal=0,pass=bwd").flops(), 2.5 * 4 * 10 * 10 * 16);
  // Q, O, dO, dQ (2 bytes) and the LSE (4) for every query row; K, V read and dK, dV written for every key.
  const Problem p = Problem::parse("b=2,h=16,hkv=4,s=1000,sk=3000,d=128,dtype=bf16,causal=0,pass=bwd");
  const double rows_q = 2.0 * 16 * 1000, rows_k = 2.0 * 4 * 3000;
  EXPECT_DOUBLE_EQ(p.bytes(), rows_q * (4 * 128 * 2 + 4) + rows_k * 4 * 128 * 2);
  // A window reads the K and V rows some query sees (a causal window of 99 over the last 1000 keys: 1099)
  // and still writes every key's dK and dV.
  const Problem w = Problem::parse("b=2,h=16,hkv=4,s=1000,sk=3000,d=128,dtype=bf16,causal=1,window=99,pass=bwd");
  EXPECT_DOUBLE_EQ(w.bytes(), rows_q * (4 * 128 * 2 + 4) + 2.0 * 4 * (1099 + 3000) * 2 * 128 * 2);
}

TEST(ProblemBackward, WarmStartsPreferTheSamePass) {
  const Problem p = Problem::parse(kBwd), fwd = Problem::parse(kFwd);
  EXPECT_DOUBLE_EQ(service::problem_distance(p, p), 0.0);
  EXPECT_DOUBLE_EQ(service::problem_distance(p, fwd), 2.0);  // as a causal flag
  Problem bigger = p;
  bigger.b = 8;  // a backward problem of another batch is nearer than the forward of the same shape
  EXPECT_LT(service::problem_distance(p, bigger), service::problem_distance(p, fwd));
}

TEST(ProblemBackwardDb, TheStoreKeepsItApartFromTheForwardProblem) {
  TempDir dir;
  const std::string path = dir.file("results.db");
  const char* kWindowed = "b=1,h=8,hkv=2,s=1000,sk=3000,d=64,dtype=fp16,causal=1,window=255,pass=bwd";
  {
    Store store = Store::open(path, Store::Mode::kCreate);
    const std::int64_t dev = store.upsert_device(h100());
    const std::int64_t bwd = store.open_campaign(spec("bwd", problem(kBwd)), dev);
    const std::int64_t fwd = store.open_campaign(spec("fwd", problem(kFwd)), dev);
    const std::int64_t win = store.open_campaign(spec("win", problem(kWindowed)), dev);
    store.record_evaluation(bwd, store.upsert_candidate("flash_bwd_mma", config(64, 64), "b1"), dev, ok_eval(300));
    store.record_evaluation(fwd, store.upsert_candidate("flash_fwd_mma", config(64, 32), "f1"), dev, ok_eval(100));
    store.record_evaluation(win, store.upsert_candidate("flash_bwd_mma", config(64, 16), "w1"), dev, ok_eval(80));
    BestQuery q;
    for (const auto& [spec_text, name] : {std::pair{kBwd, "bwd"}, std::pair{kFwd, "fwd"}, std::pair{kWindowed, "win"}}) {
      q.problem = problem(spec_text);
      const auto rows = store.best(q);
      ASSERT_EQ(rows.size(), 1u) << name;
      EXPECT_EQ(rows[0].campaign, name);
      EXPECT_EQ(rows[0].problem, problem(spec_text));
      EXPECT_EQ(store.campaign_row(name)->spec.problem, problem(spec_text));
    }
    EXPECT_NE(input_error_of([&] { store.check_resume(spec("bwd", problem(kFwd))); }).find("cannot be resumed"),
              std::string::npos);
  }
  {
    // Stored as the spec's tail, in the variants column; the forward problem's column as before.
    const sqlite::Connection db = sqlite::Connection::open(path, SQLITE_OPEN_READONLY);
    sqlite::Statement st(db, "SELECT name, variants FROM campaigns ORDER BY id");
    ASSERT_TRUE(st.step());
    EXPECT_EQ(st.text(0), "bwd");
    EXPECT_EQ(st.text(1), "pass=bwd");
    ASSERT_TRUE(st.step());
    EXPECT_EQ(st.text(1), "");
    ASSERT_TRUE(st.step());
    EXPECT_EQ(st.text(1), "window=255,pass=bwd");
  }
  // A merge carries it as it is.
  const std::string out = dir.file("merged.db");
  merge_databases({path}, out);
  Store merged = Store::open(out, Store::Mode::kReadOnly);
  EXPECT_EQ(merged.campaign_row("bwd")->spec.problem, problem(kBwd));
  BestQuery q;
  q.problem = problem(kBwd);
  ASSERT_EQ(merged.best(q).size(), 1u);
  EXPECT_EQ(merged.best(q)[0].campaign, "bwd");
}

}  // namespace
}  // namespace test_problem_backward
}  // namespace attntune::test
