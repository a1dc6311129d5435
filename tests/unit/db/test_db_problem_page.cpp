// Schema version 5: a campaign's problem has a page size (0: dense; N: a paged KV cache). Databases
// of version 4 migrate with every campaign dense; `best --problem` and resuming keep a paged problem
// apart from the dense problem of the same shape.
#include <sqlite3.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/embedded.hpp"
#include "db/sqlite.hpp"
#include "db_test_util.hpp"
#include "tests/common/input_error.hpp"
#include "tests/common/run_attntune.hpp"

namespace attntune::test {
namespace test_db_problem_page {
namespace {

using attntune::testing::input_error_of;
using sqlite::Connection;
using sqlite::Statement;

const char* kDense = "b=4,h=16,s=4096,d=128,dtype=bf16,causal=1";
const char* kPaged = "b=4,h=16,s=4096,d=128,dtype=bf16,causal=1,page=16";

// A database as attntune wrote it at schema version 4: one dense campaign with one ok evaluation.
void make_v4(const std::string& path) {
  Connection db = Connection::open(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  db.exec("PRAGMA journal_mode = WAL; PRAGMA foreign_keys = ON; BEGIN");
  for (const char* m : {"db/migrations/001_initial.sql", "db/migrations/002_timing_stats_stop_reason.sql",
                        "db/migrations/003_search.sql", "db/migrations/004_campaign_spaces.sql"})
    db.exec(embedded_file(m));
  db.exec("PRAGMA application_id = " + std::to_string(Store::kApplicationId) + "; PRAGMA user_version = 4");
  const Problem p = problem(kDense);
  Statement(db, "INSERT INTO devices (name, arch, sm_count, uuid, driver_version) VALUES (?1, ?2, ?3, ?4, ?5)")
      .bind("NVIDIA H100 80GB HBM3", "sm_90", 132, "GPU-1111", "550.54")
      .run();
  Statement(db,
            "INSERT INTO campaigns (name, problem, b, h, hkv, s, sk, d, dtype, causal, space_path, space_hash, family, "
            "strategy, seed, device_id, space_text) VALUES ('v4', ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, "
            "'search_spaces/flash_fwd_mma.yaml', '0123456789abcdef0123456789abcdef', 'flash_fwd_mma', 'evo', 7, 1, "
            "'family: flash_fwd_mma\n')")
      .bind(p.json().dump(), p.b, p.h, p.hkv, p.s, p.sk, p.d, dtype_name(p.dtype), p.causal)
      .run();
  db.exec("INSERT INTO campaign_spaces (campaign_id, family, space_path, space_hash, space_text) SELECT id, family, "
          "space_path, space_hash, space_text FROM campaigns");
  Statement(db,
            "INSERT INTO candidates (family, config, config_key, source_hash) VALUES ('flash_fwd_mma', "
            "'{\"block_m\":128}', 'block_m=128', 'h1')")
      .run();
  Statement(db,
            "INSERT INTO evaluations (campaign_id, seq, candidate_id, device_id, status, median_us, tflops, "
            "max_abs_err) VALUES (1, 1, 1, 1, 'ok', 100.0, 300.0, 0.001)")
      .run();
  db.exec("COMMIT");
}

// The columns of an index, in order.
std::vector<std::string> index_columns(const std::string& path, const std::string& index) {
  Connection db = Connection::open(path, SQLITE_OPEN_READONLY);
  Statement st(db, "SELECT name FROM pragma_index_info(?1) ORDER BY seqno");
  st.bind(index);
  std::vector<std::string> out;
  while (st.step()) out.push_back(st.text(0));
  return out;
}

TEST(ProblemPage, Version4DatabasesMigrateWithEveryCampaignDense) {
  TempDir dir;
  const std::string path = dir.file("v4.db");
  make_v4(path);
  {
    Store ro = Store::open(path, Store::Mode::kReadOnly);
    const auto row = ro.campaign_row("v4");
    ASSERT_TRUE(row);
    EXPECT_EQ(row->spec.problem, problem(kDense));
    EXPECT_EQ(row->spec.problem.page, 0);
    EXPECT_EQ(ro.best({problem(kDense), std::nullopt, 5}).size(), 1u) << "read through the migrated copy";
  }
  EXPECT_EQ(header_u32(path, 60), 4u) << "a read-only open left it at version 4";

  Store store = Store::open(path, Store::Mode::kExisting);
  EXPECT_GE(store.schema_version(), 5);
  EXPECT_EQ(store.schema_version(), Store::current_schema_version());
  const auto row = store.campaign_row("v4");
  ASSERT_TRUE(row);
  EXPECT_EQ(row->spec.problem.page, 0);
  EXPECT_EQ(row->evaluations, 1);
  EXPECT_EQ(index_columns(path, "campaigns_problem"),
            (std::vector<std::string>{"b", "h", "hkv", "s", "sk", "d", "dtype", "causal", "page", "varlen",
                                      "lens_seed", "variants", "dv"}));  // varlen, lens_seed: version 8
  const auto dense = store.best({problem(kDense), std::nullopt, 5});
  ASSERT_EQ(dense.size(), 1u);
  EXPECT_EQ(dense[0].campaign, "v4");
  EXPECT_TRUE(store.best({problem(kPaged), std::nullopt, 5}).empty());
  EXPECT_EQ(store.problems_with_results("flash_fwd_mma"), std::vector<Problem>{problem(kDense)});
  // Still resumable as the dense problem it was, and not as a paged one.
  EXPECT_EQ(store.open_campaign(spec("v4", problem(kDense)), 1), row->id);
  EXPECT_NE(input_error_of([&] { store.check_resume(spec("v4", problem(kPaged))); })
                .find("tunes problem b=4,h=16,hkv=16,s=4096,sk=4096,d=128,dtype=bf16,causal=1; it cannot be "
                      "resumed for problem b=4,h=16,hkv=16,s=4096,sk=4096,d=128,dtype=bf16,causal=1,page=16"),
            std::string::npos);
}

// A dense and a paged campaign of one shape, the paged one faster: each problem answers with its own.
struct PagedAndDense : ::testing::Test {
  TempDir dir;
  std::string db = dir.file("results.db");

  void SetUp() override {
    Store store = Store::open(db, Store::Mode::kCreate);
    const std::int64_t dev = store.upsert_device(h100());
    const std::int64_t dense = store.open_campaign(spec("dense", problem(kDense)), dev);
    const std::int64_t paged = store.open_campaign(spec("paged", problem(kPaged)), dev);
    store.record_evaluation(dense, store.upsert_candidate("flash_fwd_mma", config(128, 64), "d1"), dev, ok_eval(200));
    store.record_evaluation(dense, store.upsert_candidate("flash_fwd_mma", config(64, 64), "d2"), dev, ok_eval(250));
    store.record_evaluation(paged, store.upsert_candidate("flash_fwd_mma", config(128, 32), "p1"), dev, ok_eval(150));
  }
};

TEST_F(PagedAndDense, TheStoreKeepsThemApart) {
  Store store = Store::open(db, Store::Mode::kReadOnly);
  const auto dense = store.best({problem(kDense), std::nullopt, 10});
  ASSERT_EQ(dense.size(), 2u);
  for (const BestRow& r : dense) {
    EXPECT_EQ(r.campaign, "dense");
    EXPECT_EQ(r.problem.page, 0);
  }
  const auto paged = store.best({problem(kPaged), std::nullopt, 10});
  ASSERT_EQ(paged.size(), 1u);
  EXPECT_EQ(paged[0].campaign, "paged");
  EXPECT_EQ(paged[0].problem, problem(kPaged));
  EXPECT_EQ(config_str(paged[0].config), config_str(config(128, 32)));
  EXPECT_TRUE(store.best({problem(std::string(kDense) + ",page=32"), std::nullopt, 10}).empty())
      << "another page size is another problem";
  EXPECT_EQ(store.best({std::nullopt, std::nullopt, 10}).size(), 3u);
  EXPECT_EQ(store.campaign_row("paged")->spec.problem.page, 16);
  EXPECT_EQ(store.problems_with_results("flash_fwd_mma"), (std::vector<Problem>{problem(kDense), problem(kPaged)}));
}

TEST_F(PagedAndDense, BestProblemKeepsThemApart) {
  using attntune::testing::run_attntune;
  const auto dense = run_attntune(fmt::format("best --db '{}' --problem {} --top 10 --format json", db, kDense));
  ASSERT_EQ(dense.rc, 0) << dense.err;
  const auto dj = nlohmann::json::parse(dense.out);
  ASSERT_EQ(dj.size(), 2u);
  for (const auto& r : dj) {
    EXPECT_EQ(r.at("campaign"), "dense");
    EXPECT_FALSE(r.at("problem").contains("page")) << "a dense problem reads as it always did";
  }
  const auto paged = run_attntune(fmt::format("best --db '{}' --problem {} --top 10 --format json", db, kPaged));
  ASSERT_EQ(paged.rc, 0) << paged.err;
  const auto pj = nlohmann::json::parse(paged.out);
  ASSERT_EQ(pj.size(), 1u);
  EXPECT_EQ(pj[0].at("campaign"), "paged");
  EXPECT_EQ(pj[0].at("problem").at("page"), 16);
  const auto table = run_attntune(fmt::format("best --db '{}' --problem {}", db, kPaged));
  ASSERT_EQ(table.rc, 0) << table.err;
  EXPECT_NE(table.out.find("problem b=4,h=16,hkv=16,s=4096,sk=4096,d=128,dtype=bf16,causal=1,page=16"),
            std::string::npos)
      << table.out;
  const auto none = run_attntune(fmt::format("best --db '{}' --problem {},page=8", db, kDense));
  EXPECT_EQ(none.rc, 1) << none.err;
  EXPECT_NE(none.err.find("no valid results for problem b=4,h=16,hkv=16,s=4096,sk=4096,d=128,dtype=bf16,causal=1,"
                          "page=8"),
            std::string::npos)
      << none.err;
}

}  // namespace
}  // namespace test_db_problem_page
}  // namespace attntune::test
