// A latent cache (`latent=1`: V is the first dv columns of K, one buffer; DeepSeek's MLA decode is
// d=576,dv=512,hkv=1): parsing and its refusals (split dims dv < d only, no varlen), the text and JSON
// round trips (every other problem reads as it always did), bytes that read K once, the spaces that
// refuse it unless they list `latent`, and the database, which keeps it in the `variants` column after
// the variants (no schema change) and never mixes it with the same shape over separate K and V.
#include <sqlite3.h>

#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/problem.hpp"
#include "db/merge.hpp"
#include "db/sqlite.hpp"
#include "db/store.hpp"
#include "service/job.hpp"
#include "space/search_space.hpp"
#include "tests/common/input_error.hpp"
#include "tests/unit/db/db_test_util.hpp"

namespace attntune::test {
namespace test_problem_latent {
namespace {

using attntune::testing::input_error_of;

const char* kMla = "b=16,h=128,hkv=1,s=1,sk=4096,d=576,dv=512,dtype=bf16,causal=1,page=64,latent=1";
const char* kSplit = "b=16,h=128,hkv=1,s=1,sk=4096,d=576,dv=512,dtype=bf16,causal=1,page=64";

TEST(ProblemLatent, ParsesPrintsAndRoundTrips) {
  const Problem p = Problem::parse(kMla);
  EXPECT_TRUE(p.latent);
  EXPECT_EQ(p.d, 576);
  EXPECT_EQ(p.head_dim_v(), 512);
  EXPECT_EQ(p.str(), kMla);
  EXPECT_EQ(Problem::parse(p.str()), p);
  EXPECT_EQ(p.json().at("latent"), true);
  EXPECT_EQ(Problem::from_json(p.json()), p);
  EXPECT_EQ(p.ordered_json().dump(),
            R"({"b":16,"h":128,"hkv":1,"s":1,"sk":4096,"d":576,"dv":512,"dtype":"bf16","causal":true,"page":64,)"
            R"("latent":true})");
  // Its place in the spec is free, and latent=0 (or false) is no latent cache: the same problem,
  // printed and stored as it always was.
  EXPECT_EQ(Problem::parse("latent=1,b=16,h=128,hkv=1,s=1,sk=4096,d=576,dv=512,dtype=bf16,causal=1,page=64"), p);
  EXPECT_EQ(Problem::parse("b=16,h=128,hkv=1,s=1,sk=4096,d=576,dv=512,dtype=bf16,causal=1,page=64,latent=true"), p);
  const Problem split = Problem::parse(kSplit);
  EXPECT_FALSE(split.latent);
  EXPECT_NE(split, p);
  EXPECT_EQ(Problem::parse(std::string(kSplit) + ",latent=0"), split);
  EXPECT_EQ(split.str(), kSplit);
  EXPECT_FALSE(split.json().contains("latent"));
  EXPECT_EQ(split.ordered_json().dump().find("latent"), std::string::npos);
  nlohmann::json j = split.json();
  j["latent"] = false;
  EXPECT_EQ(Problem::from_json(j), split);
  // After the variants, which keep their order: str()'s tail is the variants column.
  const Problem w = Problem::parse("b=1,h=16,hkv=1,s=1,sk=9000,d=192,dv=128,dtype=fp16,causal=1,latent=1,sinks=1,"
                                   "window=255");
  EXPECT_EQ(w.str(), "b=1,h=16,hkv=1,s=1,sk=9000,d=192,dv=128,dtype=fp16,causal=1,window=255,sinks=1,latent=1");
  EXPECT_EQ(Problem::parse(w.str()), w);
  EXPECT_EQ(Problem::from_json(w.json()), w);
  // Dense too.
  const Problem dense = Problem::parse("b=2,h=16,hkv=1,s=4,sk=100,d=192,dv=128,dtype=bf16,causal=1,latent=1");
  EXPECT_EQ(dense.str(), "b=2,h=16,hkv=1,s=4,sk=100,d=192,dv=128,dtype=bf16,causal=1,latent=1");
}

TEST(ProblemLatent, IsNotAVariantButTheVariantsColumnKeepsIt) {
  const Problem p = Problem::parse(kMla);
  EXPECT_FALSE(p.has_variant());
  EXPECT_EQ(p.variant_spec(), "");
  EXPECT_EQ(p.variant_words(), "");
  EXPECT_EQ(p.variants_column(), "latent=1");
  const Problem w = Problem::parse("b=1,h=16,hkv=1,s=1,sk=9000,d=192,dv=128,dtype=fp16,causal=1,window=255,softcap=30,"
                                   "latent=1");
  EXPECT_EQ(w.variant_spec(), "window=255,softcap=30");
  EXPECT_EQ(w.variants_column(), "window=255,softcap=30,latent=1");
  EXPECT_EQ(w.variant_words(), "window=255,0 softcap=30");
  // Read back: the flag and the variants, whatever the problem held before.
  for (const Problem& want : {p, w, Problem::parse(kSplit)}) {
    Problem got = Problem::parse("b=16,h=128,hkv=1,s=1,sk=4096,d=576,dv=512,dtype=bf16,causal=1,window=7,sinks=1,"
                                 "latent=1");
    got.b = want.b, got.h = want.h, got.sk = want.sk, got.d = want.d, got.dv = want.dv, got.dtype = want.dtype;
    got.causal = want.causal, got.page = want.page;
    got.set_variants_column(want.variants_column());
    EXPECT_EQ(got, want) << want.str();
  }
  // Every problem without one stores what it always stored.
  const Problem plain = Problem::parse("b=4,h=16,s=4096,d=128,dtype=bf16,causal=1,window=127,sinks=1");
  EXPECT_EQ(plain.variants_column(), plain.variant_spec());
  EXPECT_EQ(Problem::parse("b=4,h=16,s=4096,d=128,dtype=bf16,causal=1").variants_column(), "");
  // Not a key a variants text may hold elsewhere.
  Problem q = Problem::parse(kSplit);
  EXPECT_THROW(q.set_variants_column("latent=1,window=7"), InputError);
  EXPECT_THROW(q.set_variants_column("xlatent=1"), InputError);
}

TEST(ProblemLatent, RefusesWhatIsNotALatentCacheWithTheReason) {
  const std::string no_dv = input_error_of([] { Problem::parse("b=1,h=16,hkv=1,s=1,sk=64,d=576,dtype=bf16,causal=0,latent=1"); });
  EXPECT_NE(no_dv.find("latent=1 needs a value head dim below d (dv=N, N < d=576): V is the first dv columns of K"),
            std::string::npos)
      << no_dv;
  // dv equal to d is one head dim: no columns left for a latent cache's rope part.
  EXPECT_NE(input_error_of([] {
              Problem::parse("b=1,h=16,hkv=1,s=1,sk=64,d=576,dv=576,dtype=bf16,causal=0,latent=1");
            }).find("needs a value head dim below d"),
            std::string::npos);
  EXPECT_NE(input_error_of([] {
              Problem::parse("b=1,h=16,hkv=1,s=1,sk=64,d=128,dv=192,dtype=bf16,causal=0,latent=1");
            }).find("latent=1 with dv=192 > d=128: V is the first dv columns of K, so dv must be below d"),
            std::string::npos);
  EXPECT_NE(input_error_of([] {
              Problem::parse("b=4,h=16,hkv=1,s=64,sk=64,d=192,dv=128,dtype=bf16,causal=1,varlen=8,latent=1");
            }).find("latent=1 with varlen=8: a latent cache is read by the dense and paged entry points only"),
            std::string::npos);
  EXPECT_NE(input_error_of([] { Problem::parse("b=1,h=16,s=1,d=192,dv=128,dtype=bf16,causal=0,latent=2"); })
                .find("'latent=2': expected 0 or 1"),
            std::string::npos);
  // The JSON form refuses the same.
  nlohmann::json j = Problem::parse(kMla).json();
  j.erase("dv");
  EXPECT_NE(input_error_of([&] { Problem::from_json(j); }).find("problem JSON: latent=1 needs a value head dim below d"),
            std::string::npos);
  j = Problem::parse(kMla).json();
  j["dv"] = 640;
  EXPECT_NE(input_error_of([&] { Problem::from_json(j); }).find("dv=640 > d=576"), std::string::npos);
}

TEST(ProblemLatent, BytesReadTheCacheOnceAndFlopsCountBothProducts) {
  const Problem p = Problem::parse("b=2,h=16,hkv=1,s=1,sk=1000,d=576,dv=512,dtype=bf16,causal=0,page=64,latent=1");
  const Problem split = Problem::parse("b=2,h=16,hkv=1,s=1,sk=1000,d=576,dv=512,dtype=bf16,causal=0,page=64");
  // FLOPs as for separate K and V: Q.K^T at 576, P.V at 512.
  EXPECT_DOUBLE_EQ(p.flops(), 2.0 * 2 * 16 * 1 * 1000 * (576 + 512));
  EXPECT_DOUBLE_EQ(p.flops(), split.flops());
  // Bytes: the cache once (576 a key), Q (576) read and O (512) written; V is not read apart.
  EXPECT_DOUBLE_EQ(p.bytes(), 2.0 * (2 * 1 * 1000 * 576 + 2 * 16 * 1 * (576 + 512)));
  EXPECT_DOUBLE_EQ(split.bytes(), 2.0 * (2 * 1 * 1000 * (576 + 512) + 2 * 16 * 1 * (576 + 512)));
  // A window counts the rows it reads, as for any problem.
  const Problem w = Problem::parse("b=1,h=16,hkv=1,s=1,sk=1000,d=192,dv=128,dtype=bf16,causal=1,window=99,latent=1");
  EXPECT_DOUBLE_EQ(w.bytes(), 2.0 * (100 * 192 + 16 * (192 + 128)));
}

TEST(ProblemLatent, ASpaceServesItOnlyWhereItsProblemSectionListsLatent) {
  const std::string head = R"(family: flash_decode
archs: [sm_80]
device_limits:
  sm_80: {max_smem_per_block: 166912}
problem:
  d: [192, 576]
  dv: [128, 512]
)";
  const std::string params = R"(params:
  block_n: [32, 64]
)";
  const Problem p = Problem::parse("b=1,h=16,hkv=1,s=1,sk=64,d=192,dv=128,dtype=bf16,causal=0,latent=1");
  const Problem split = Problem::parse("b=1,h=16,hkv=1,s=1,sk=64,d=192,dv=128,dtype=bf16,causal=0");
  const SearchSpace without = SearchSpace::parse(head + params, "no_latent.yaml");
  const std::string why = input_error_of([&] { without.check_problem(p, "sm_80"); });
  EXPECT_NE(why.find("flash_decode does not support a latent cache (the problem " + p.str() +
                     " has latent=1: V is the first dv=128 columns of K; its space's problem section does not list "
                     "`latent`)"),
            std::string::npos)
      << why;
  EXPECT_NO_THROW(without.check_problem(split, "sm_80"));
  // Listed: served, and its constraints and derived quantities can use it.
  const SearchSpace with = SearchSpace::parse(head + R"(  latent: [false, true]
  constraints:
    - {expr: "!latent || hkv == 1", why: "a latent cache has one KV head in this test"}
)" + params + R"(constraints:
  - {expr: "!latent || block_n == 64", why: "latent caches take 64-key tiles in this test"}
)",
                                              "latent.yaml");
  EXPECT_NO_THROW(with.check_problem(p, "sm_80"));
  EXPECT_NO_THROW(with.check_problem(split, "sm_80"));
  EXPECT_EQ(with.enumerate(p, "sm_80").size(), 1u);
  EXPECT_EQ(with.enumerate(split, "sm_80").size(), 2u);
  EXPECT_NE(input_error_of([&] {
              with.check_problem(Problem::parse("b=1,h=16,hkv=2,s=1,sk=64,d=192,dv=128,dtype=bf16,causal=0,latent=1"),
                                 "sm_80");
            }).find("a latent cache has one KV head in this test"),
            std::string::npos);
  // `latent: [true]` serves latent caches only.
  const SearchSpace only = SearchSpace::parse(head + "  latent: [true]\n" + params, "only.yaml");
  EXPECT_NO_THROW(only.check_problem(p, "sm_80"));
  EXPECT_NE(input_error_of([&] { only.check_problem(split, "sm_80"); }).find("does not support latent=0 (supported: 1)"),
            std::string::npos);
  // flash_decode lists it: its latent problems have exactly the configs of the same shape over
  // separate K and V (it reads V through V's pointer and strides either way).
  const auto decode = SearchSpace::shipped("flash_decode");
  ASSERT_TRUE(decode);
  for (const char* arch : {"sm_80", "sm_90"}) {
    EXPECT_NO_THROW(decode->check_problem(p, arch));
    const auto latent = decode->enumerate(p, arch);
    EXPECT_FALSE(latent.empty()) << arch;
    EXPECT_EQ(latent, decode->enumerate(split, arch)) << arch;
  }
  // The prefill families do not list it.
  for (const char* family : {"flash_fwd_mma", "flash_fwd_wgmma"}) {
    const auto space = SearchSpace::shipped(family);
    ASSERT_TRUE(space) << family;
    EXPECT_NE(input_error_of([&] { space->check_problem(p, space->default_arch()); }).find("does not support a latent cache"),
              std::string::npos)
        << family;
  }
}

TEST(ProblemLatent, WarmStartsPreferTheSameCacheLayout) {
  const Problem p = Problem::parse(kMla), split = Problem::parse(kSplit);
  EXPECT_DOUBLE_EQ(service::problem_distance(p, p), 0.0);
  EXPECT_DOUBLE_EQ(service::problem_distance(p, split), 1.0);
}

TEST(ProblemLatentDb, TheStoreKeepsItApartFromSeparateKAndV) {
  TempDir dir;
  const std::string path = dir.file("results.db");
  {
    Store store = Store::open(path, Store::Mode::kCreate);
    const std::int64_t dev = store.upsert_device(h100());
    const std::int64_t mla = store.open_campaign(spec("mla", problem(kMla)), dev);
    const std::int64_t split = store.open_campaign(spec("split", problem(kSplit)), dev);
    store.record_evaluation(mla, store.upsert_candidate("flash_decode", config(64, 64), "m1"), dev, ok_eval(100));
    store.record_evaluation(split, store.upsert_candidate("flash_decode", config(64, 32), "s1"), dev, ok_eval(90));
    BestQuery q;
    q.problem = problem(kMla);
    const auto rows = store.best(q);
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_EQ(rows[0].campaign, "mla");
    EXPECT_EQ(rows[0].problem, problem(kMla));
    q.problem = problem(kSplit);
    const auto split_rows = store.best(q);
    ASSERT_EQ(split_rows.size(), 1u);
    EXPECT_EQ(split_rows[0].campaign, "split");
    EXPECT_EQ(store.campaign_row("mla")->spec.problem, problem(kMla));
    EXPECT_EQ(store.campaign_row("split")->spec.problem, problem(kSplit));
    EXPECT_NE(input_error_of([&] { store.check_resume(spec("mla", problem(kSplit))); }).find("cannot be resumed"),
              std::string::npos);
  }
  {
    // Stored as the spec's tail after page, in the variants column.
    const sqlite::Connection db = sqlite::Connection::open(path, SQLITE_OPEN_READONLY);
    sqlite::Statement st(db, "SELECT name, variants FROM campaigns ORDER BY id");
    ASSERT_TRUE(st.step());
    EXPECT_EQ(st.text(0), "mla");
    EXPECT_EQ(st.text(1), "latent=1");
    ASSERT_TRUE(st.step());
    EXPECT_EQ(st.text(1), "");
  }
  // A merge carries it as it is.
  const std::string out = dir.file("merged.db");
  merge_databases({path}, out);
  Store merged = Store::open(out, Store::Mode::kReadOnly);
  EXPECT_EQ(merged.campaign_row("mla")->spec.problem, problem(kMla));
  BestQuery q;
  q.problem = problem(kMla);
  ASSERT_EQ(merged.best(q).size(), 1u);
  EXPECT_EQ(merged.best(q)[0].campaign, "mla");
}

}  // namespace
}  // namespace test_problem_latent
}  // namespace attntune::test
