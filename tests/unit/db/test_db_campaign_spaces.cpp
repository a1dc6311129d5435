// A campaign's search spaces (schema version 4): one row per template, a campaign of several
// templates identified by the set, resume checks naming what changed, and databases of schema 3
// migrated with the one space of each campaign, still resumable and readable.
#include <sqlite3.h>

#include <gtest/gtest.h>

#include "core/embedded.hpp"
#include "core/error.hpp"
#include "db/sqlite.hpp"
#include "db_test_util.hpp"
#include "tests/common/input_error.hpp"

namespace attntune::test {
namespace test_db_campaign_spaces {
namespace {

using sqlite::Connection;
using sqlite::Statement;

CampaignSpace space(const std::string& family, const std::string& hash) {
  return {family, "search_spaces/" + family + ".yaml", hash, "family: " + family + "\n"};
}

CampaignSpec mixed(const std::string& name, const std::string& wgmma_hash = "bbbb") {
  CampaignSpec s = spec(name);
  set_spaces(s, {space("flash_fwd_wgmma", wgmma_hash), space("flash_fwd_mma", "aaaa")});
  return s;
}

using attntune::testing::input_error_of;

TEST(CampaignSpaces, SetSpacesSortsByTemplateAndNamesTheSet) {
  const CampaignSpec s = mixed("m");
  ASSERT_EQ(s.spaces.size(), 2u);
  EXPECT_EQ(s.spaces[0].family, "flash_fwd_mma");
  EXPECT_EQ(s.family, "flash_fwd_mma+flash_fwd_wgmma");
  EXPECT_EQ(s.space_path, "search_spaces/flash_fwd_mma.yaml + search_spaces/flash_fwd_wgmma.yaml");
  EXPECT_EQ(s.space_text, "");
  EXPECT_TRUE(s.mixed());
  EXPECT_NE(s.space_hash, mixed("m", "cccc").space_hash) << "the set's hash changes with any space";
  EXPECT_EQ(s.space_of("flash_fwd_wgmma")->hash, "bbbb");
  EXPECT_EQ(s.space_of("other"), nullptr);

  CampaignSpec one = spec("o");
  set_spaces(one, {space("flash_fwd_mma", "aaaa")});
  EXPECT_EQ(one.family, "flash_fwd_mma");
  EXPECT_EQ(one.space_hash, "aaaa");
  EXPECT_EQ(one.space_text, "family: flash_fwd_mma\n");
  EXPECT_FALSE(one.mixed());

  CampaignSpec dup = spec("d");
  EXPECT_NE(input_error_of([&] { set_spaces(dup, {space("flash_fwd_mma", "a"), space("flash_fwd_mma", "b")}); })
                .find("are both spaces of template 'flash_fwd_mma'"),
            std::string::npos);
}

TEST(CampaignSpaces, StoredReadBackAndResumedOnlyWithTheSameSet) {
  TempDir dir;
  Store store = Store::open(dir.file("a.db"), Store::Mode::kCreate);
  const std::int64_t dev = store.upsert_device(h100());
  const std::int64_t id = store.open_campaign(mixed("m"), dev);
  auto row = store.campaign_row("m");
  ASSERT_TRUE(row);
  ASSERT_EQ(row->spec.spaces.size(), 2u);
  EXPECT_EQ(row->spec.spaces[1].family, "flash_fwd_wgmma");
  EXPECT_EQ(row->spec.spaces[1].text, "family: flash_fwd_wgmma\n");
  EXPECT_EQ(row->spec.family, "flash_fwd_mma+flash_fwd_wgmma");
  EXPECT_EQ(store.open_campaign(mixed("m"), dev), id) << "the same set resumes";

  CampaignSpec only_mma = spec("m");
  set_spaces(only_mma, {space("flash_fwd_mma", "aaaa")});
  EXPECT_EQ(input_error_of([&] { store.check_resume(only_mma); }),
            "campaign 'm' tunes templates flash_fwd_mma and flash_fwd_wgmma; it cannot be resumed with template "
            "'flash_fwd_mma' (start a new campaign with another --campaign name)");
  EXPECT_NE(input_error_of([&] { store.check_resume(mixed("m", "cccc")); })
                .find("campaign 'm' was started with another search space for template 'flash_fwd_wgmma' "
                      "('search_spaces/flash_fwd_wgmma.yaml', hash bbbb; now 'search_spaces/flash_fwd_wgmma.yaml', "
                      "hash cccc)"),
            std::string::npos);

  // A campaign of one template written the old way (no spaces list) gets its one row.
  store.open_campaign(spec("old-style"), dev);
  row = store.campaign_row("old-style");
  ASSERT_EQ(row->spec.spaces.size(), 1u);
  EXPECT_EQ(row->spec.spaces[0].hash, spec("old-style").space_hash);
  EXPECT_EQ(store.campaigns().size(), 2u);
  EXPECT_EQ(store.campaigns()[0].spec.spaces.size(), 2u);
}

TEST(CampaignSpaces, RankingAndEvaluationsCarryEachCandidatesTemplateAndDevice) {
  TempDir dir;
  Store store = Store::open(dir.file("a.db"), Store::Mode::kCreate);
  const std::int64_t dev = store.upsert_device(h100());
  DeviceInfo a = h100();
  a.arch = "sm_90a";
  const std::int64_t dev_a = store.upsert_device(a);
  const std::int64_t id = store.open_campaign(mixed("m"), dev);
  const std::int64_t c1 = store.upsert_candidate("flash_fwd_mma", config(128, 64), "h1");
  const std::int64_t c2 = store.upsert_candidate("flash_fwd_wgmma", config(128, 64), "h2");
  store.record_evaluation(id, c1, dev, ok_eval(300));
  store.record_evaluation(id, c2, dev_a, ok_eval(200));
  const auto rows = store.campaign_evaluations(id);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].family, "flash_fwd_mma");
  EXPECT_EQ(rows[1].family, "flash_fwd_wgmma");
  RankingEntry e1, e2;
  e1.candidate_id = c2, e1.median_us = 199, e1.tflops = 1, e1.rounds = 3, e1.device_id = dev_a;
  e2.candidate_id = c1, e2.median_us = 301, e2.tflops = 1, e2.rounds = 3;
  store.put_ranking(id, dev, {e1, e2});
  const auto ranking = store.ranking(id);
  ASSERT_EQ(ranking.size(), 2u);
  EXPECT_EQ(ranking[0].family, "flash_fwd_wgmma");
  EXPECT_EQ(ranking[0].entry.device_id, dev_a);
  EXPECT_EQ(ranking[1].entry.device_id, dev) << "0: the call's device";
  const auto best = store.best({std::nullopt, std::string("m"), 2});
  ASSERT_EQ(best.size(), 2u);
  EXPECT_EQ(best[0].arch, "sm_90a");
  EXPECT_EQ(best[1].arch, "sm_90");
  EXPECT_EQ(store.problems_with_results("flash_fwd_wgmma"), std::vector<Problem>{problem()})
      << "a mixed campaign's results warm-start either template";
}

// A database as attntune wrote it at schema version 3: one campaign with its space text.
void make_v3(const std::string& path) {
  Connection db = Connection::open(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  db.exec("PRAGMA journal_mode = WAL; PRAGMA foreign_keys = ON; BEGIN");
  for (const char* m : {"db/migrations/001_initial.sql", "db/migrations/002_timing_stats_stop_reason.sql",
                        "db/migrations/003_search.sql"})
    db.exec(embedded_file(m));
  db.exec("PRAGMA application_id = " + std::to_string(Store::kApplicationId) + "; PRAGMA user_version = 3");
  const Problem p = problem();
  Statement(db, "INSERT INTO devices (name, arch, sm_count, uuid, driver_version) VALUES (?1, ?2, ?3, ?4, ?5)")
      .bind("NVIDIA H100 80GB HBM3", "sm_90", 132, "GPU-1111", "550.54")
      .run();
  Statement(db,
            "INSERT INTO campaigns (name, problem, b, h, hkv, s, sk, d, dtype, causal, space_path, space_hash, family, "
            "strategy, seed, device_id, space_text) VALUES ('v3', ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, "
            "'search_spaces/flash_fwd_mma.yaml', '0123456789abcdef0123456789abcdef', 'flash_fwd_mma', 'evo', 7, 1, "
            "'family: flash_fwd_mma\n')")
      .bind(p.json().dump(), p.b, p.h, p.hkv, p.s, p.sk, p.d, dtype_name(p.dtype), p.causal)
      .run();
  db.exec("COMMIT");
}

TEST(CampaignSpaces, Version3DatabasesGetTheirOneSpaceAndStillResume) {
  TempDir dir;
  const std::string path = dir.file("v3.db");
  make_v3(path);
  {
    Store ro = Store::open(path, Store::Mode::kReadOnly);
    const auto row = ro.campaign_row("v3");
    ASSERT_TRUE(row);
    ASSERT_EQ(row->spec.spaces.size(), 1u);
    EXPECT_EQ(row->spec.spaces[0].text, "family: flash_fwd_mma\n");
  }
  EXPECT_EQ(header_u32(path, 60), 3u) << "a read-only open left it at version 3";
  Store store = Store::open(path, Store::Mode::kExisting);
  EXPECT_EQ(store.schema_version(), Store::current_schema_version());
  const auto row = store.campaign_row("v3");
  ASSERT_EQ(row->spec.spaces.size(), 1u);
  EXPECT_EQ(row->spec.spaces[0].family, "flash_fwd_mma");
  EXPECT_EQ(row->spec.spaces[0].hash, "0123456789abcdef0123456789abcdef");
  CampaignSpec again = spec("v3");
  EXPECT_EQ(store.open_campaign(again, 1), row->id) << "resumes as before";
  EXPECT_EQ(store.campaign_row("v3")->spec.spaces.size(), 1u);
  EXPECT_NE(input_error_of([&] { store.check_resume(mixed("v3")); }).find("cannot be resumed with templates"),
            std::string::npos);
}

}  // namespace
}  // namespace test_db_campaign_spaces
}  // namespace attntune::test
