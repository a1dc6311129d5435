// An FP8 KV cache (`kv_dtype=fp8`: K and V FP8 e4m3, one byte an element, Q and O in dtype; issue
// 42): parsing and its refusals (kv_dtype is fp8 or q's dtype, no varlen), the text and JSON round
// trips (every other problem reads as it always did), the variants column that carries it after latent,
// bytes at one byte a K/V element, the spaces that refuse it unless they list `kv_fp8`, warm starts, and
// the database, which never mixes it with the same shape over a cache of q's dtype.
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
#include "space/search_space.hpp"
#include "tests/common/input_error.hpp"
#include "tests/unit/db/db_test_util.hpp"

namespace attntune::test {
namespace test_problem_kv_fp8 {
namespace {

using attntune::testing::input_error_of;

const char* kFp8 = "b=16,h=32,hkv=8,s=1,sk=4096,d=128,dtype=bf16,causal=1,page=16,kv_dtype=fp8";
const char* kBf16 = "b=16,h=32,hkv=8,s=1,sk=4096,d=128,dtype=bf16,causal=1,page=16";

TEST(ProblemKvFp8, ParsesPrintsAndRoundTrips) {
  const Problem p = Problem::parse(kFp8);
  EXPECT_TRUE(p.kv_fp8);
  EXPECT_EQ(p.dtype, DType::kBf16);  // q and o keep theirs
  EXPECT_EQ(p.str(), kFp8);
  EXPECT_EQ(Problem::parse(p.str()), p);
  EXPECT_EQ(p.json().at("kv_dtype"), "fp8");
  EXPECT_EQ(Problem::from_json(p.json()), p);
  EXPECT_EQ(p.ordered_json().dump(),
            R"({"b":16,"h":32,"hkv":8,"s":1,"sk":4096,"d":128,"dtype":"bf16","causal":true,"page":16,)"
            R"("kv_dtype":"fp8"})");
  // Its place in the spec is free (before dtype too); kv_dtype= q's dtype is a cache of q's dtype: the
  // same problem as without the key, printed and stored as it always was.
  EXPECT_EQ(Problem::parse("kv_dtype=fp8,b=16,h=32,hkv=8,s=1,sk=4096,d=128,dtype=bf16,causal=1,page=16"), p);
  const Problem plain = Problem::parse(kBf16);
  EXPECT_FALSE(plain.kv_fp8);
  EXPECT_NE(plain, p);
  EXPECT_EQ(Problem::parse(std::string(kBf16) + ",kv_dtype=bf16"), plain);
  EXPECT_EQ(Problem::parse("b=1,h=8,s=1,sk=64,d=64,kv_dtype=fp16,dtype=fp16,causal=0"),
            Problem::parse("b=1,h=8,s=1,sk=64,d=64,dtype=fp16,causal=0"));
  EXPECT_EQ(plain.str(), kBf16);
  EXPECT_FALSE(plain.json().contains("kv_dtype"));
  EXPECT_EQ(plain.ordered_json().dump().find("kv_dtype"), std::string::npos);
  nlohmann::json j = plain.json();
  j["kv_dtype"] = "bf16";
  EXPECT_EQ(Problem::from_json(j), plain);
  // At the very end, after the variants and latent; dense too.
  const Problem all = Problem::parse("kv_dtype=fp8,b=1,h=16,hkv=1,s=1,sk=9000,d=192,dv=128,dtype=fp16,causal=1,"
                                     "latent=1,sinks=1,window=255,page=64");
  EXPECT_EQ(all.str(), "b=1,h=16,hkv=1,s=1,sk=9000,d=192,dv=128,dtype=fp16,causal=1,page=64,window=255,sinks=1,"
                       "latent=1,kv_dtype=fp8");
  EXPECT_EQ(Problem::parse(all.str()), all);
  EXPECT_EQ(Problem::from_json(all.json()), all);
  EXPECT_EQ(all.ordered_json().dump(),
            R"({"b":1,"h":16,"hkv":1,"s":1,"sk":9000,"d":192,"dv":128,"dtype":"fp16","causal":true,"page":64,)"
            R"("window":[255,-1],"sinks":true,"latent":true,"kv_dtype":"fp8"})");
  const Problem dense = Problem::parse("b=2,h=16,hkv=2,s=4,sk=100,d=64,dtype=fp16,causal=0,kv_dtype=fp8");
  EXPECT_EQ(dense.str(), "b=2,h=16,hkv=2,s=4,sk=100,d=64,dtype=fp16,causal=0,kv_dtype=fp8");
  EXPECT_EQ(Problem::from_json(dense.json()), dense);
}

TEST(ProblemKvFp8, IsNotAVariantButTheVariantsColumnKeepsItAfterLatent) {
  const Problem p = Problem::parse(kFp8);
  EXPECT_FALSE(p.has_variant());
  EXPECT_EQ(p.variant_spec(), "");
  EXPECT_EQ(p.variant_words(), "");
  EXPECT_EQ(p.variants_column(), "kv_dtype=fp8");
  const Problem lat = Problem::parse("b=1,h=16,hkv=1,s=1,sk=64,d=576,dv=512,dtype=bf16,causal=1,latent=1,kv_dtype=fp8");
  EXPECT_EQ(lat.variants_column(), "latent=1,kv_dtype=fp8");
  const Problem w = Problem::parse("b=1,h=16,hkv=1,s=1,sk=64,d=192,dv=128,dtype=bf16,causal=1,window=255,softcap=30,"
                                   "latent=1,kv_dtype=fp8");
  EXPECT_EQ(w.variants_column(), "window=255,softcap=30,latent=1,kv_dtype=fp8");
  const Problem wv = Problem::parse(std::string(kFp8) + ",sinks=1");
  EXPECT_EQ(wv.variants_column(), "sinks=1,kv_dtype=fp8");
  // Read back: the flags and the variants, whatever the problem held before.
  const Problem lat_bf16 = Problem::parse("b=1,h=16,hkv=1,s=1,sk=64,d=576,dv=512,dtype=bf16,causal=1,latent=1");
  for (const Problem& want : {p, lat, w, wv, lat_bf16, Problem::parse(kBf16)}) {
    Problem got = Problem::parse("b=1,h=16,hkv=1,s=1,sk=64,d=192,dv=128,dtype=bf16,causal=1,window=7,sinks=1,latent=1,"
                                 "kv_dtype=fp8");
    got.b = want.b, got.h = want.h, got.hkv = want.hkv, got.sk = want.sk, got.d = want.d, got.dv = want.dv;
    got.dtype = want.dtype, got.causal = want.causal, got.page = want.page;
    got.set_variants_column(want.variants_column());
    EXPECT_EQ(got, want) << want.str();
  }
  // Every problem without it stores what it stored before.
  EXPECT_EQ(lat_bf16.variants_column(), "latent=1");
  EXPECT_EQ(Problem::parse(kBf16).variants_column(), "");
  // Out of its place it is no variants text.
  Problem q = Problem::parse(kBf16);
  for (const char* bad : {"kv_dtype=fp8,window=7", "kv_dtype=fp8,latent=1", "xkv_dtype=fp8", "kv_dtype=bf16"})
    EXPECT_THROW(q.set_variants_column(bad), InputError) << bad;
}

TEST(ProblemKvFp8, RefusesOtherCacheDtypesAndVarlenWithTheReason) {
  const std::string other16 = input_error_of([] { Problem::parse(std::string(kBf16) + ",kv_dtype=fp16"); });
  EXPECT_NE(other16.find("problem: 'kv_dtype=fp16' with dtype=bf16: a 16-bit KV cache is q's dtype"), std::string::npos)
      << other16;
  const std::string unknown = input_error_of([] { Problem::parse(std::string(kBf16) + ",kv_dtype=e5m2"); });
  EXPECT_NE(unknown.find("problem: 'kv_dtype=e5m2': expected fp8 (an FP8 e4m3 cache) or the problem's dtype, bf16"),
            std::string::npos)
      << unknown;
  EXPECT_NE(input_error_of([] { Problem::parse(std::string(kBf16) + ",kv_dtype="); }).find("'kv_dtype='"),
            std::string::npos);
  const std::string varlen = input_error_of([] {
    Problem::parse("b=4,h=16,hkv=2,s=64,sk=64,d=128,dtype=bf16,causal=1,varlen=8,kv_dtype=fp8");
  });
  EXPECT_NE(varlen.find("problem: kv_dtype=fp8 with varlen=8: an FP8 KV cache"), std::string::npos) << varlen;
  EXPECT_NE(varlen.find("not by a packed batch"), std::string::npos) << varlen;
  // The JSON form refuses the same.
  nlohmann::json j = Problem::parse(kFp8).json();
  j["kv_dtype"] = "fp16";
  EXPECT_NE(input_error_of([&] { Problem::from_json(j); }).find("problem JSON: 'kv_dtype=fp16' with dtype=bf16"),
            std::string::npos);
  j["kv_dtype"] = "int8";
  EXPECT_NE(input_error_of([&] { Problem::from_json(j); }).find("problem JSON: 'kv_dtype=int8': expected fp8"),
            std::string::npos);
  j["kv_dtype"] = true;
  EXPECT_NE(input_error_of([&] { Problem::from_json(j); }).find("kv_dtype must be a string"), std::string::npos);
  j = Problem::parse("b=4,h=16,hkv=2,s=64,sk=64,d=128,dtype=bf16,causal=1,varlen=8").json();
  j["kv_dtype"] = "fp8";
  EXPECT_NE(input_error_of([&] { Problem::from_json(j); }).find("problem JSON: kv_dtype=fp8 with varlen=8"),
            std::string::npos);
}

TEST(ProblemKvFp8, BytesCountKAndVAtOneByteAndFlopsAreUnchanged) {
  const Problem p = Problem::parse("b=2,h=16,hkv=2,s=1,sk=1000,d=128,dtype=bf16,causal=0,page=16,kv_dtype=fp8");
  const Problem plain = Problem::parse("b=2,h=16,hkv=2,s=1,sk=1000,d=128,dtype=bf16,causal=0,page=16");
  EXPECT_DOUBLE_EQ(p.flops(), plain.flops());
  // K and V: one byte an element; Q read and O written: two.
  EXPECT_DOUBLE_EQ(p.bytes(), 1.0 * 2 * 2 * 1000 * (128 + 128) + 2.0 * 2 * 16 * 1 * (128 + 128));
  EXPECT_DOUBLE_EQ(plain.bytes(), 2.0 * 2 * 2 * 1000 * (128 + 128) + 2.0 * 2 * 16 * 1 * (128 + 128));
  // Split dims, a window's rows, a latent cache once at d.
  const Problem split = Problem::parse("b=1,h=16,hkv=1,s=1,sk=1000,d=192,dv=128,dtype=fp16,causal=1,window=99,"
                                       "kv_dtype=fp8");
  EXPECT_DOUBLE_EQ(split.bytes(), 100.0 * (192 + 128) + 2.0 * 16 * (192 + 128));
  const Problem lat = Problem::parse("b=2,h=16,hkv=1,s=1,sk=1000,d=576,dv=512,dtype=bf16,causal=0,page=64,latent=1,"
                                     "kv_dtype=fp8");
  EXPECT_DOUBLE_EQ(lat.bytes(), 2.0 * 1000 * 576 + 2.0 * 2 * 16 * (576 + 512));
}

TEST(ProblemKvFp8, ASpaceServesItOnlyWhereItsProblemSectionListsKvFp8) {
  const std::string head = R"(family: flash_decode
archs: [sm_80]
device_limits:
  sm_80: {max_smem_per_block: 166912}
problem:
  d: [128]
)";
  const std::string params = R"(params:
  block_n: [32, 64]
)";
  const Problem p = Problem::parse(kFp8), plain = Problem::parse(kBf16);
  const SearchSpace without = SearchSpace::parse(head + params, "no_fp8.yaml");
  const std::string why = input_error_of([&] { without.check_problem(p, "sm_80"); });
  EXPECT_EQ(why, "flash_decode does not support an FP8 KV cache (the problem " + p.str() +
                     " has kv_dtype=fp8; its space's problem section does not list `kv_fp8`)");
  EXPECT_NO_THROW(without.check_problem(plain, "sm_80"));
  // Listed: served, and its constraints and derived quantities can use it.
  const SearchSpace with = SearchSpace::parse(head + R"(  kv_fp8: [false, true]
  constraints:
    - {expr: "!kv_fp8 || page > 0", why: "an FP8 cache is paged in this test"}
)" + params + R"(derived:
  kv_bytes: {expr: "kv_fp8 ? 1 : 2"}
constraints:
  - {expr: "kv_bytes * block_n <= 64", why: "FP8 tiles are twice as long in this test"}
)",
                                              "fp8.yaml");
  EXPECT_NO_THROW(with.check_problem(p, "sm_80"));
  EXPECT_NO_THROW(with.check_problem(plain, "sm_80"));
  EXPECT_EQ(with.enumerate(p, "sm_80").size(), 2u);
  EXPECT_EQ(with.enumerate(plain, "sm_80").size(), 1u);
  EXPECT_NE(input_error_of([&] {
              with.check_problem(Problem::parse("b=1,h=8,s=1,sk=64,d=128,dtype=bf16,causal=0,kv_dtype=fp8"), "sm_80");
            }).find("an FP8 cache is paged in this test"),
            std::string::npos);
  // `kv_fp8: [true]` serves FP8 caches only.
  const SearchSpace only = SearchSpace::parse(head + "  kv_fp8: [true]\n" + params, "only.yaml");
  EXPECT_NO_THROW(only.check_problem(p, "sm_80"));
  EXPECT_EQ(input_error_of([&] { only.check_problem(plain, "sm_80"); }),
            "flash_decode does not support kv_fp8=0 (supported: 1)");
  EXPECT_NE(input_error_of([&] { SearchSpace::parse(head + "  kv_fp8: [fp8]\n" + params, "bad.yaml"); })
                .find("problem.kv_fp8: expected true, false, 1 or 0, got 'fp8'"),
            std::string::npos);
  // flash_fwd_mma does not list it; flash_fwd_wgmma serves it over KV-cache pages (chunked prefill)
  // and says why not without them.
  const Problem prefill = Problem::parse("b=2,h=16,s=512,d=128,dtype=bf16,causal=1,kv_dtype=fp8");
  const auto mma = SearchSpace::shipped("flash_fwd_mma"), wgmma = SearchSpace::shipped("flash_fwd_wgmma");
  ASSERT_TRUE(mma && wgmma);
  EXPECT_NE(input_error_of([&] { mma->check_problem(prefill, mma->default_arch()); })
                .find("does not support an FP8 KV cache"),
            std::string::npos);
  EXPECT_NE(input_error_of([&] { wgmma->check_problem(prefill, wgmma->default_arch()); })
                .find("an FP8 cache is read through the KV-cache entry point's pages"),
            std::string::npos);
  EXPECT_NO_THROW(wgmma->check_problem(Problem::parse("b=2,h=16,s=512,sk=4096,d=128,dtype=bf16,causal=1,page=16,"
                                                      "kv_dtype=fp8"),
                                       wgmma->default_arch()));
}

TEST(ProblemKvFp8, WarmStartsPreferTheSameCacheDtype) {
  const Problem p = Problem::parse(kFp8), plain = Problem::parse(kBf16);
  EXPECT_DOUBLE_EQ(service::problem_distance(p, p), 0.0);
  EXPECT_DOUBLE_EQ(service::problem_distance(p, plain), 1.0);  // as a dtype
  Problem fp16 = plain;
  fp16.dtype = DType::kFp16;
  EXPECT_DOUBLE_EQ(service::problem_distance(fp16, plain), service::problem_distance(p, plain));
}

TEST(ProblemKvFp8Db, TheStoreKeepsItApartFromACacheOfQsDtype) {
  TempDir dir;
  const std::string path = dir.file("results.db");
  const char* kLatent8 = "b=16,h=128,hkv=1,s=1,sk=4096,d=576,dv=512,dtype=bf16,causal=1,page=64,latent=1,kv_dtype=fp8";
  {
    Store store = Store::open(path, Store::Mode::kCreate);
    const std::int64_t dev = store.upsert_device(h100());
    const std::int64_t fp8 = store.open_campaign(spec("fp8", problem(kFp8)), dev);
    const std::int64_t bf16 = store.open_campaign(spec("bf16", problem(kBf16)), dev);
    const std::int64_t lat = store.open_campaign(spec("lat8", problem(kLatent8)), dev);
    store.record_evaluation(fp8, store.upsert_candidate("flash_decode", config(64, 64), "f1"), dev, ok_eval(100));
    store.record_evaluation(bf16, store.upsert_candidate("flash_decode", config(64, 32), "b1"), dev, ok_eval(90));
    store.record_evaluation(lat, store.upsert_candidate("flash_decode", config(64, 16), "l1"), dev, ok_eval(80));
    BestQuery q;
    for (const auto& [spec_text, name] : {std::pair{kFp8, "fp8"}, std::pair{kBf16, "bf16"}, std::pair{kLatent8, "lat8"}}) {
      q.problem = problem(spec_text);
      const auto rows = store.best(q);
      ASSERT_EQ(rows.size(), 1u) << name;
      EXPECT_EQ(rows[0].campaign, name);
      EXPECT_EQ(rows[0].problem, problem(spec_text));
      EXPECT_EQ(store.campaign_row(name)->spec.problem, problem(spec_text));
    }
    EXPECT_NE(input_error_of([&] { store.check_resume(spec("fp8", problem(kBf16))); }).find("cannot be resumed"),
              std::string::npos);
  }
  {
    // Stored as the spec's tail after page, in the variants column.
    const sqlite::Connection db = sqlite::Connection::open(path, SQLITE_OPEN_READONLY);
    sqlite::Statement st(db, "SELECT name, variants FROM campaigns ORDER BY id");
    ASSERT_TRUE(st.step());
    EXPECT_EQ(st.text(0), "fp8");
    EXPECT_EQ(st.text(1), "kv_dtype=fp8");
    ASSERT_TRUE(st.step());
    EXPECT_EQ(st.text(1), "");
    ASSERT_TRUE(st.step());
    EXPECT_EQ(st.text(1), "latent=1,kv_dtype=fp8");
  }
  // A merge carries it as it is.
  const std::string out = dir.file("merged.db");
  merge_databases({path}, out);
  Store merged = Store::open(out, Store::Mode::kReadOnly);
  EXPECT_EQ(merged.campaign_row("fp8")->spec.problem, problem(kFp8));
  BestQuery q;
  q.problem = problem(kFp8);
  ASSERT_EQ(merged.best(q).size(), 1u);
  EXPECT_EQ(merged.best(q)[0].campaign, "fp8");
}

}  // namespace
}  // namespace test_problem_kv_fp8
}  // namespace attntune::test
