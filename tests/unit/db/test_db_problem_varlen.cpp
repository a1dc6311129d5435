// Schema version 8: a campaign's problem has varlen and lens_seed (0 and 0: not a packed batch).
// Databases of version 7 migrate with every campaign dense; `best --problem`, resuming, warm starts,
// submit's campaign names and merge keep a packed batch apart from its dense shape and from another
// draw of lengths.
#include <sqlite3.h>

#include <algorithm>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/embedded.hpp"
#include "db/merge.hpp"
#include "db/sqlite.hpp"
#include "db_test_util.hpp"
#include "service/job.hpp"
#include "tests/common/input_error.hpp"
#include "tests/common/run_attntune.hpp"

namespace attntune::test {
namespace test_db_problem_varlen {
namespace {

using attntune::testing::input_error_of;
using sqlite::Connection;
using sqlite::Statement;

const char* kDense = "b=4,h=16,s=4096,d=128,dtype=bf16,causal=1";
const char* kVarlen = "b=4,h=16,s=4096,d=128,dtype=bf16,causal=1,varlen=256";
const char* kVarlenSeeded = "b=4,h=16,s=4096,d=128,dtype=bf16,causal=1,varlen=256,lens_seed=9";

// A database as attntune wrote it at schema version 7: one dense campaign with one ok evaluation.
void make_v7(const std::string& path) {
  Connection db = Connection::open(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  db.exec("PRAGMA journal_mode = WAL; PRAGMA foreign_keys = ON; BEGIN");
  for (const char* m : {"db/migrations/001_initial.sql", "db/migrations/002_timing_stats_stop_reason.sql",
                        "db/migrations/003_search.sql", "db/migrations/004_campaign_spaces.sql",
                        "db/migrations/005_problem_page.sql", "db/migrations/006_queue.sql",
                        "db/migrations/007_campaign_runs.sql"})
    db.exec(embedded_file(m));
  db.exec("PRAGMA application_id = " + std::to_string(Store::kApplicationId) + "; PRAGMA user_version = 7");
  const Problem p = problem(kDense);
  Statement(db, "INSERT INTO devices (name, arch, sm_count, uuid, driver_version) VALUES (?1, ?2, ?3, ?4, ?5)")
      .bind("NVIDIA H100 80GB HBM3", "sm_90", 132, "GPU-1111", "550.54")
      .run();
  Statement(db,
            "INSERT INTO campaigns (name, problem, b, h, hkv, s, sk, d, dtype, causal, page, space_path, space_hash, "
            "family, strategy, seed, device_id, space_text) VALUES ('v7', ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 0, "
            "'search_spaces/flash_fwd_mma.yaml', '0123456789abcdef0123456789abcdef', 'flash_fwd_mma', 'evo', 7, 1, "
            "'family: flash_fwd_mma\n')")
      .bind(p.json().dump(), p.b, p.h, p.hkv, p.s, p.sk, p.d, dtype_name(p.dtype), p.causal)
      .run();
  db.exec("INSERT INTO campaign_spaces (campaign_id, family, space_path, space_hash, space_text) SELECT id, family, "
          "space_path, space_hash, space_text FROM campaigns");
  db.exec("INSERT INTO campaign_runs (campaign_id, run, strategy, seed, device_id) SELECT id, 1, strategy, seed, "
          "device_id FROM campaigns");
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

std::vector<std::string> index_columns(const std::string& path, const std::string& index) {
  Connection db = Connection::open(path, SQLITE_OPEN_READONLY);
  Statement st(db, "SELECT name FROM pragma_index_info(?1) ORDER BY seqno");
  st.bind(index);
  std::vector<std::string> out;
  while (st.step()) out.push_back(st.text(0));
  return out;
}

BestQuery query(const char* spec, int top = 10) {
  BestQuery q;
  q.problem = problem(spec);
  q.top = top;
  return q;
}

TEST(ProblemVarlenDb, Version7DatabasesMigrateWithEveryCampaignDense) {
  TempDir dir;
  const std::string path = dir.file("v7.db");
  make_v7(path);
  {
    Store ro = Store::open(path, Store::Mode::kReadOnly);
    const auto row = ro.campaign_row("v7");
    ASSERT_TRUE(row);
    EXPECT_EQ(row->spec.problem, problem(kDense));
    EXPECT_EQ(ro.best(query(kDense)).size(), 1u) << "read through the migrated copy";
    EXPECT_TRUE(ro.best(query(kVarlen)).empty());
  }
  EXPECT_EQ(header_u32(path, 60), 7u) << "a read-only open left it at version 7";

  Store store = Store::open(path, Store::Mode::kExisting);
  EXPECT_GE(store.schema_version(), 8);
  EXPECT_EQ(store.schema_version(), Store::current_schema_version());
  const auto row = store.campaign_row("v7");
  ASSERT_TRUE(row);
  EXPECT_EQ(row->spec.problem, problem(kDense));
  EXPECT_EQ(row->spec.problem.varlen, 0);
  EXPECT_EQ(row->spec.problem.lens_seed, 0);
  EXPECT_EQ(row->evaluations, 1);
  EXPECT_EQ(index_columns(path, "campaigns_problem"),
            (std::vector<std::string>{"b", "h", "hkv", "s", "sk", "d", "dtype", "causal", "page", "varlen",
                                      "lens_seed", "variants", "dv"}));
  {
    Connection db = Connection::open(path, SQLITE_OPEN_READONLY);
    Statement st(db, "SELECT varlen, lens_seed FROM campaigns WHERE name = 'v7'");
    ASSERT_TRUE(st.step());
    EXPECT_EQ(st.int64(0), 0);
    EXPECT_EQ(st.int64(1), 0);
  }
  EXPECT_EQ(store.best(query(kDense)).size(), 1u);
  EXPECT_TRUE(store.best(query(kVarlen)).empty());
  EXPECT_EQ(store.problems_with_results("flash_fwd_mma"), std::vector<Problem>{problem(kDense)});
  EXPECT_EQ(store.open_campaign(spec("v7", problem(kDense)), 1), row->id);
  EXPECT_NE(input_error_of([&] { store.check_resume(spec("v7", problem(kVarlen))); })
                .find("tunes problem b=4,h=16,hkv=16,s=4096,sk=4096,d=128,dtype=bf16,causal=1; it cannot be "
                      "resumed for problem b=4,h=16,hkv=16,s=4096,sk=4096,d=128,dtype=bf16,causal=1,varlen=256"),
            std::string::npos);
}

// A dense campaign and two packed batches of one shape (two draws of lengths), the packed ones
// faster: each problem answers with its own.
struct VarlenAndDense : ::testing::Test {
  TempDir dir;
  std::string db = dir.file("results.db");

  void SetUp() override {
    Store store = Store::open(db, Store::Mode::kCreate);
    const std::int64_t dev = store.upsert_device(h100());
    const std::int64_t dense = store.open_campaign(spec("dense", problem(kDense)), dev);
    const std::int64_t varlen = store.open_campaign(spec("varlen", problem(kVarlen)), dev);
    const std::int64_t seeded = store.open_campaign(spec("seeded", problem(kVarlenSeeded)), dev);
    store.record_evaluation(dense, store.upsert_candidate("flash_fwd_mma", config(128, 64), "d1"), dev, ok_eval(200));
    store.record_evaluation(dense, store.upsert_candidate("flash_fwd_mma", config(64, 64), "d2"), dev, ok_eval(250));
    store.record_evaluation(varlen, store.upsert_candidate("flash_fwd_mma", config(128, 32), "v1"), dev, ok_eval(150));
    store.record_evaluation(seeded, store.upsert_candidate("flash_fwd_mma", config(64, 32), "s1"), dev, ok_eval(120));
  }
};

TEST_F(VarlenAndDense, TheStoreKeepsThemApart) {
  Store store = Store::open(db, Store::Mode::kReadOnly);
  const auto dense = store.best(query(kDense));
  ASSERT_EQ(dense.size(), 2u);
  for (const BestRow& r : dense) {
    EXPECT_EQ(r.campaign, "dense");
    EXPECT_FALSE(r.problem.is_varlen());
  }
  const auto varlen = store.best(query(kVarlen));
  ASSERT_EQ(varlen.size(), 1u);
  EXPECT_EQ(varlen[0].campaign, "varlen");
  EXPECT_EQ(varlen[0].problem, problem(kVarlen));
  const auto seeded = store.best(query(kVarlenSeeded));
  ASSERT_EQ(seeded.size(), 1u);
  EXPECT_EQ(seeded[0].campaign, "seeded") << "another draw of lengths is another problem";
  EXPECT_EQ(seeded[0].problem.lens_seed, 9);
  EXPECT_TRUE(store.best(query("b=4,h=16,s=4096,d=128,dtype=bf16,causal=1,varlen=255")).empty());
  EXPECT_EQ(store.best({std::nullopt, std::nullopt, 10}).size(), 4u);
  EXPECT_EQ(store.campaign_row("seeded")->spec.problem, problem(kVarlenSeeded));
  EXPECT_EQ(store.problems_with_results("flash_fwd_mma"),
            (std::vector<Problem>{problem(kDense), problem(kVarlen), problem(kVarlenSeeded)}));
}

TEST_F(VarlenAndDense, WarmStartsStayOnTheirSide) {
  Store store = Store::open(db, Store::Mode::kReadOnly);
  // A dense problem of another length warm-starts from the dense campaign, never a packed one
  // (faster though they are); a packed batch from the nearest packed batch.
  const auto [dense_from, dense_configs] =
      service::warm_start(store, "flash_fwd_mma", problem("b=4,h=16,s=2048,d=128,dtype=bf16,causal=1"), 4);
  ASSERT_TRUE(dense_from);
  EXPECT_EQ(*dense_from, problem(kDense));
  const auto [varlen_from, varlen_configs] = service::warm_start(
      store, "flash_fwd_mma", problem("b=4,h=16,s=2048,d=128,dtype=bf16,causal=1,varlen=250"), 4);
  ASSERT_TRUE(varlen_from);
  EXPECT_TRUE(varlen_from->is_varlen());
  ASSERT_FALSE(varlen_configs.empty());
  EXPECT_GT(service::problem_distance(problem("b=4,h=16,s=4096,d=128,dtype=bf16,causal=1,varlen=16"),
                                      problem(kVarlen)),
            service::problem_distance(problem(kVarlenSeeded), problem(kVarlen)))
      << "the shortest lengths count like lengths";
}

TEST_F(VarlenAndDense, BestProblemKeepsThemApart) {
  using attntune::testing::run_attntune;
  const auto dense = run_attntune(fmt::format("best --db '{}' --problem {} --top 10 --format json", db, kDense));
  ASSERT_EQ(dense.rc, 0) << dense.err;
  const auto dj = nlohmann::json::parse(dense.out);
  ASSERT_EQ(dj.size(), 2u);
  for (const auto& r : dj) {
    EXPECT_EQ(r.at("campaign"), "dense");
    EXPECT_FALSE(r.at("problem").contains("varlen")) << "a dense problem reads as it always did";
    EXPECT_FALSE(r.at("problem").contains("lens_seed"));
  }
  const auto seeded =
      run_attntune(fmt::format("best --db '{}' --problem {} --top 10 --format json", db, kVarlenSeeded));
  ASSERT_EQ(seeded.rc, 0) << seeded.err;
  const auto sj = nlohmann::json::parse(seeded.out);
  ASSERT_EQ(sj.size(), 1u);
  EXPECT_EQ(sj[0].at("campaign"), "seeded");
  EXPECT_EQ(sj[0].at("problem").at("varlen"), 256);
  EXPECT_EQ(sj[0].at("problem").at("lens_seed"), 9);
  const auto table = run_attntune(fmt::format("best --db '{}' --problem {}", db, kVarlen));
  ASSERT_EQ(table.rc, 0) << table.err;
  EXPECT_NE(table.out.find("problem b=4,h=16,hkv=16,s=4096,sk=4096,d=128,dtype=bf16,causal=1,varlen=256"),
            std::string::npos)
      << table.out;
  const auto none = run_attntune(fmt::format("best --db '{}' --problem {},varlen=8", db, kDense));
  EXPECT_EQ(none.rc, 1) << none.err;
  EXPECT_NE(none.err.find("no valid results for problem b=4,h=16,hkv=16,s=4096,sk=4096,d=128,dtype=bf16,causal=1,"
                          "varlen=8"),
            std::string::npos)
      << none.err;
  const auto campaigns = run_attntune(fmt::format("campaigns --db '{}' --format json", db));
  ASSERT_EQ(campaigns.rc, 0) << campaigns.err;
  for (const auto& c : nlohmann::json::parse(campaigns.out))
    EXPECT_EQ(c.at("problem").contains("varlen"), c.at("name") != "dense") << c.dump();
}

TEST(ProblemVarlenDb, SubmitQueuesThePackedBatchBesideItsDenseShape) {
  TempDir dir;
  Store store = Store::open(dir.file("queue.db"), Store::Mode::kCreate);
  const std::vector<CampaignSpace> spaces = {
      {"flash_fwd_mma", "search_spaces/flash_fwd_mma.yaml", "0123456789abcdef0123456789abcdef", "family: x\n"}};
  std::vector<std::string> names;
  for (const char* spec : {kDense, kVarlen, kVarlenSeeded}) {
    QueuedJob job;
    job.problem = problem(spec);
    job.request.spaces = spaces;
    job.campaign = service::default_campaign_name(spaces, job.problem);
    names.push_back(job.campaign);
    EXPECT_EQ(store.submit_job(job).first, Store::Submitted::kQueued) << job.campaign;
    EXPECT_EQ(store.submit_job(job).first, Store::Submitted::kExisting) << "idempotent: " << job.campaign;
  }
  EXPECT_EQ(names[1], std::string("flash_fwd_mma:") + "b=4,h=16,hkv=16,s=4096,sk=4096,d=128,dtype=bf16,causal=1,"
                                                         "varlen=256");
  const auto rows = store.queue_status();
  ASSERT_EQ(rows.size(), 3u);
  std::vector<Problem> queued;
  for (const auto& r : rows) queued.push_back(r.job.problem);
  EXPECT_NE(std::find(queued.begin(), queued.end(), problem(kVarlenSeeded)), queued.end())
      << "the queue's problem JSON reads back whole";
}

TEST(ProblemVarlenDb, MergeRenamesASameNamedCampaignOfThePackedBatch) {
  TempDir dir;
  const std::string a = dir.file("A.db"), b = dir.file("B.db"), out = dir.file("out.db");
  for (const auto& [path, spec_text] : {std::pair{a, kDense}, std::pair{b, kVarlen}}) {
    Store s = Store::open(path, Store::Mode::kCreate);
    const std::int64_t dev = s.upsert_device(h100());
    const std::int64_t c = s.open_campaign(spec("x", problem(spec_text)), dev);
    s.record_evaluation(c, s.upsert_candidate("flash_fwd_mma", config(128, 64), "h1"), dev, ok_eval(100));
  }
  const auto report = merge_databases({a, b}, out);
  ASSERT_EQ(report[1].renamed.size(), 1u);
  EXPECT_EQ(report[1].renamed[0].stored_as, "x@B");
  Store s = Store::open(out, Store::Mode::kReadOnly);
  EXPECT_EQ(s.campaign_row("x")->spec.problem, problem(kDense));
  EXPECT_EQ(s.campaign_row("x@B")->spec.problem, problem(kVarlen));
  EXPECT_EQ(s.best(query(kVarlen)).size(), 1u);
}

}  // namespace
}  // namespace test_db_problem_varlen
}  // namespace attntune::test
