// Store round trips and query semantics: devices, campaigns (resume), candidates (dedup), the build
// cache, evaluations, best and campaigns.
#include <sqlite3.h>

#include <gtest/gtest.h>

#include "db/sqlite.hpp"
#include "db_test_util.hpp"

namespace test_db_store {
using namespace attntune;
using namespace attntune::test;

namespace {

struct StoreTest : ::testing::Test {
  TempDir dir;
  std::string path = dir.file("attntune.db");
  Store store = Store::open(path, Store::Mode::kCreate);
  std::int64_t device = store.upsert_device(h100());
};

}  // namespace

TEST_F(StoreTest, NewDatabaseHasTheCurrentSchema) {
  EXPECT_EQ(store.schema_version(), Store::current_schema_version());
  EXPECT_GE(Store::current_schema_version(), 2);
  // Closing the last connection checkpoints the WAL into the file's header and removes -wal/-shm.
  store = Store::open(dir.file("other.db"), Store::Mode::kCreate);
  EXPECT_EQ(header_u32(path, 68), Store::kApplicationId);
  EXPECT_EQ(header_u32(path, 60), std::uint32_t(Store::current_schema_version()));
  EXPECT_EQ(read_bytes(path)[18], 2) << "WAL mode";
  EXPECT_FALSE(fs::exists(path + "-wal"));
  EXPECT_FALSE(fs::exists(path + "-shm"));
}

TEST_F(StoreTest, DevicesAreUniqueByNameArchAndUuid) {
  EXPECT_EQ(store.upsert_device(h100()), device);
  DeviceInfo upgraded = h100();
  upgraded.driver_version = "560.28";
  EXPECT_EQ(store.upsert_device(upgraded), device) << "a driver upgrade is the same GPU";
  DeviceInfo second = h100();
  second.uuid = "GPU-2222";
  EXPECT_NE(store.upsert_device(second), device);
  DeviceInfo unknown = h100();
  unknown.uuid = "";
  const std::int64_t no_uuid = store.upsert_device(unknown);
  EXPECT_EQ(store.upsert_device(unknown), no_uuid) << "an unknown uuid (NULL) still matches itself";
  EXPECT_NE(no_uuid, device);
}

TEST_F(StoreTest, CampaignRoundTrip) {
  CampaignSpec s = spec("c1", problem("b=2,h=32,hkv=8,s=1024,sk=2048,d=64,dtype=fp16,causal=0"));
  const std::int64_t id = store.open_campaign(s, device);
  auto rows = store.campaigns();
  ASSERT_EQ(rows.size(), 1u);
  const CampaignRow& r = rows[0];
  EXPECT_EQ(r.id, id);
  EXPECT_EQ(r.spec.name, "c1");
  EXPECT_EQ(r.spec.problem, s.problem);
  EXPECT_EQ(r.spec.space_path, s.space_path);
  EXPECT_EQ(r.spec.space_hash, s.space_hash);
  EXPECT_EQ(r.spec.family, s.family);
  EXPECT_EQ(r.spec.strategy, "evo");
  EXPECT_EQ(r.spec.seed, 7);
  EXPECT_EQ(r.spec.budget_evals, 500);
  EXPECT_EQ(r.spec.budget_seconds, 3600);
  EXPECT_EQ(r.status, "running");
  EXPECT_EQ(r.stop_reason, "");
  EXPECT_EQ(r.ended_at, "");
  EXPECT_EQ(r.gpu, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(r.arch, "sm_90");
  EXPECT_EQ(r.evaluations, 0);
  EXPECT_EQ(r.best_us, std::nullopt);
  EXPECT_EQ(r.started_at.size(), 24u) << r.started_at;  // 2025-01-31T12:00:00.000Z
  EXPECT_EQ(r.started_at.back(), 'Z');
  EXPECT_EQ(store.find_campaign("c1"), id);
  EXPECT_EQ(store.find_campaign("c2"), std::nullopt);

  store.finish_campaign(id, "completed", "budget of 500 evaluations spent");
  rows = store.campaigns();
  EXPECT_EQ(rows[0].status, "completed");
  EXPECT_EQ(rows[0].stop_reason, "budget of 500 evaluations spent");
  EXPECT_FALSE(rows[0].ended_at.empty());
  EXPECT_THROW(store.finish_campaign(id + 100, "completed", ""), std::logic_error);
  EXPECT_THROW(store.finish_campaign(id, "exploded", ""), SqliteError) << "status is checked";
}

TEST_F(StoreTest, ResumeReturnsTheSameCampaignOnlyWhenItMatches) {
  const std::int64_t id = store.open_campaign(spec("c1"), device);
  store.finish_campaign(id, "stopped", "interrupted (SIGINT)");
  CampaignSpec again = spec("c1");
  again.budget_evals = 900;
  again.strategy = "random";  // a resume may change strategy and budget
  EXPECT_EQ(store.open_campaign(again, device), id);
  auto rows = store.campaigns();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].status, "running");
  EXPECT_EQ(rows[0].stop_reason, "");
  EXPECT_EQ(rows[0].ended_at, "");
  EXPECT_EQ(rows[0].spec.budget_evals, 900);
  EXPECT_EQ(rows[0].spec.strategy, "random");

  auto refusal = [&](const CampaignSpec& s) -> std::string {
    try {
      store.open_campaign(s, device);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  CampaignSpec other_problem = spec("c1", problem("b=1,h=16,s=4096,d=128,dtype=bf16,causal=1"));
  EXPECT_NE(refusal(other_problem).find("cannot be resumed for problem b=1,"), std::string::npos)
      << refusal(other_problem);
  CampaignSpec other_space = spec("c1");
  other_space.space_hash = "ffff";
  EXPECT_NE(refusal(other_space).find("another search space"), std::string::npos);
  CampaignSpec other_family = spec("c1");
  other_family.family = "flash_fwd_split";
  EXPECT_NE(refusal(other_family).find("template 'flash_fwd_split'"), std::string::npos);
  EXPECT_EQ(store.campaigns().size(), 1u) << "a refused resume writes nothing";
  EXPECT_EQ(store.campaigns()[0].spec.budget_evals, 900);
}

TEST_F(StoreTest, CandidatesAreDeduplicatedByFamilyConfigAndSource) {
  const std::int64_t a = store.upsert_candidate("flash_fwd_mma", config(128, 64), "hash-1");
  EXPECT_EQ(store.upsert_candidate("flash_fwd_mma", config(128, 64), "hash-1"), a);
  EXPECT_NE(store.upsert_candidate("flash_fwd_mma", config(128, 64), "hash-2"), a) << "edited template";
  EXPECT_NE(store.upsert_candidate("flash_fwd_split", config(128, 64), "hash-1"), a);
  EXPECT_NE(store.upsert_candidate("flash_fwd_mma", config(128, 32), "hash-1"), a);
  EXPECT_NE(store.upsert_candidate("flash_fwd_mma", config(128, 64, false), "hash-1"), a);
}

TEST_F(StoreTest, BuildCacheIsKeyedByAllFourFields) {
  const BuildKey key{"src-1", "sm_90", "12.4", "-std=c++17 --use_fast_math"};
  EXPECT_EQ(store.find_build(key), std::nullopt);
  BuildRecord ok;
  ok.status = "ok";
  ok.cubin = std::string(
      "\x7f"
      "ELF\0\0\1\2",
      8);
  ok.log = "ptxas info: Used 168 registers";
  ok.registers = 168;
  ok.smem_static = 49152;
  ok.spill_stores = 4;
  ok.spill_loads = 8;
  ok.local_bytes = 16;
  ok.compile_ms = 812.5;
  store.put_build(key, ok);
  auto hit = store.find_build(key);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->status, "ok");
  EXPECT_EQ(hit->cubin, ok.cubin);
  EXPECT_EQ(hit->log, ok.log);
  EXPECT_EQ(hit->registers, 168);
  EXPECT_EQ(hit->smem_static, 49152);
  EXPECT_EQ(hit->spill_stores, 4);
  EXPECT_EQ(hit->spill_loads, 8);
  EXPECT_EQ(hit->local_bytes, 16);
  EXPECT_EQ(hit->compile_ms, 812.5);

  for (BuildKey miss : {BuildKey{"src-2", key.arch, key.nvrtc_version, key.options},
                        BuildKey{key.source_hash, "sm_80", key.nvrtc_version, key.options},
                        BuildKey{key.source_hash, key.arch, "12.6", key.options},
                        BuildKey{key.source_hash, key.arch, key.nvrtc_version, "-std=c++17"}})
    EXPECT_EQ(store.find_build(miss), std::nullopt)
        << miss.source_hash << " " << miss.arch << " " << miss.nvrtc_version << " " << miss.options;

  BuildRecord failed;
  failed.status = "compile_error";
  failed.log = "kernel.cu(12): error: identifier \"kBlockQ\" is undefined";
  store.put_build(key, failed);  // replaces
  hit = store.find_build(key);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->status, "compile_error");
  EXPECT_EQ(hit->cubin, "");
  EXPECT_EQ(hit->log, failed.log);
  EXPECT_EQ(hit->registers, 0);
}

TEST_F(StoreTest, EvaluationsRoundTripInOrder) {
  const std::int64_t c = store.open_campaign(spec("c1"), device);
  const std::int64_t k1 = store.upsert_candidate("flash_fwd_mma", config(128, 64), "h1");
  const std::int64_t k2 = store.upsert_candidate("flash_fwd_mma", config(64, 64), "h1");
  const EvalRecord good = ok_eval(812.25, 301.5, 0.0039);
  EvalRecord slow_ok = ok_eval(990);
  slow_ok.min_us = std::nullopt;  // optional statistics stay absent
  const EvalRecord bad = failed_eval("wrong_result", "max_abs_err 0.5 > bound 0.01 at (0, 3, 17, 5)");
  store.record_evaluation(c, k1, device, good);
  store.record_evaluation(c, k2, device, bad);
  store.record_evaluation(c, k2, device, slow_ok);

  auto evals = store.campaign_evaluations(c);
  ASSERT_EQ(evals.size(), 3u);
  EXPECT_EQ(evals[0].config, config(128, 64));
  const EvalRecord& r = evals[0].record;
  EXPECT_EQ(r.status, "ok");
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.median_us, 812.25);
  EXPECT_EQ(r.min_us, good.min_us);
  EXPECT_EQ(r.max_us, good.max_us);
  EXPECT_EQ(r.stdev_us, good.stdev_us);
  EXPECT_EQ(r.tflops, 301.5);
  EXPECT_EQ(r.max_abs_err, 0.0039);
  EXPECT_EQ(r.err_bound, 1e-2);
  EXPECT_EQ(r.count, 50);
  EXPECT_EQ(evals[1].config, config(64, 64));
  EXPECT_EQ(evals[1].record.status, "wrong_result");
  EXPECT_EQ(evals[1].record.error, bad.error);
  EXPECT_EQ(evals[1].record.median_us, std::nullopt);
  EXPECT_EQ(evals[2].record.min_us, std::nullopt);
  EXPECT_EQ(evals[2].record.median_us, 990);

  auto rows = store.campaigns();
  EXPECT_EQ(rows[0].evaluations, 3);
  EXPECT_EQ(rows[0].ok, 2);
  EXPECT_EQ(rows[0].best_us, 812.25);
  EXPECT_EQ(rows[0].best_tflops, 301.5);
}

TEST_F(StoreTest, AFailedEvaluationWritesNothing) {
  const std::int64_t c = store.open_campaign(spec("c1"), device);
  const std::int64_t k = store.upsert_candidate("flash_fwd_mma", config(128, 64), "h1");
  EXPECT_THROW(store.record_evaluation(c, k + 1000, device, ok_eval(5)), SqliteError) << "foreign key";
  EXPECT_THROW(store.record_evaluation(c, k, device, failed_eval("melted", "")), SqliteError) << "status check";
  EvalRecord ok_without_time = ok_eval(5);
  ok_without_time.median_us = std::nullopt;
  EXPECT_THROW(store.record_evaluation(c, k, device, ok_without_time), SqliteError) << "ok needs a time";
  EXPECT_TRUE(store.campaign_evaluations(c).empty());
  store.record_evaluation(c, k, device, ok_eval(5));
  // The failed attempts consumed no sequence number and left no transaction open.
  sqlite::Connection raw = sqlite::Connection::open(path, SQLITE_OPEN_READWRITE);
  sqlite::Statement seq(raw, "SELECT seq FROM evaluations");
  ASSERT_TRUE(seq.step());
  EXPECT_EQ(seq.int64(0), 1);
}

TEST_F(StoreTest, SequenceNumbersAreWithinACampaign) {
  const std::int64_t c1 = store.open_campaign(spec("c1"), device);
  const std::int64_t c2 = store.open_campaign(spec("c2"), device);
  const std::int64_t k = store.upsert_candidate("flash_fwd_mma", config(128, 64), "h1");
  for (int i = 0; i < 3; ++i) store.record_evaluation(c1, k, device, ok_eval(10 + i));
  store.record_evaluation(c2, k, device, ok_eval(20));
  sqlite::Connection raw = sqlite::Connection::open(path, SQLITE_OPEN_READWRITE);
  sqlite::Statement st(raw, "SELECT campaign_id, seq FROM evaluations ORDER BY id");
  std::vector<std::pair<std::int64_t, std::int64_t>> got;
  while (st.step()) got.emplace_back(st.int64(0), st.int64(1));
  EXPECT_EQ(got, (std::vector<std::pair<std::int64_t, std::int64_t>>{{c1, 1}, {c1, 2}, {c1, 3}, {c2, 1}}));
}

namespace {

// Two campaigns on one problem, one on another; several configs, repeated evaluations, failures.
struct BestTest : StoreTest {
  std::int64_t c1 = 0, c2 = 0, c3 = 0;
  void SetUp() override {
    c1 = store.open_campaign(spec("c1"), device);
    c2 = store.open_campaign(spec("c2"), device);
    c3 = store.open_campaign(spec("other", problem("b=1,h=8,s=512,d=64,dtype=fp16,causal=0")), device);
    auto eval = [&](std::int64_t campaign, const Config& cfg, const EvalRecord& e) {
      store.record_evaluation(campaign, store.upsert_candidate("flash_fwd_mma", cfg, "h1"), device, e);
    };
    eval(c1, config(128, 64), ok_eval(120));
    eval(c1, config(128, 64), ok_eval(100, 350));  // re-measured faster: this one counts
    eval(c1, config(64, 64), ok_eval(110, 320));
    eval(c1, config(32, 32), failed_eval("compile_error", "too much shared memory"));
    eval(c1, config(16, 16), failed_eval("timeout", "killed after 10 s"));
    eval(c2, config(128, 64), ok_eval(105, 333));
    eval(c2, config(128, 128), ok_eval(90, 390));
    eval(c3, config(128, 64), ok_eval(5, 50));
  }
};

std::vector<std::string> describe(const std::vector<BestRow>& rows) {
  std::vector<std::string> out;
  for (const auto& r : rows)
    out.push_back(r.campaign + " " + config_str(r.config) + " " + std::to_string(int(r.median_us)));
  return out;
}

}  // namespace

TEST_F(BestTest, FastestOkConfigPerCampaignFirst) {
  BestQuery q;
  q.problem = problem();
  q.top = 10;
  auto rows = store.best(q);
  EXPECT_EQ(describe(rows), (std::vector<std::string>{
                                "c2 block_m=128,block_n=128,pipeline=cp_async,swizzle=true 90",
                                "c1 block_m=128,block_n=64,pipeline=cp_async,swizzle=true 100",
                                "c2 block_m=128,block_n=64,pipeline=cp_async,swizzle=true 105",
                                "c1 block_m=64,block_n=64,pipeline=cp_async,swizzle=true 110",
                            }));
  const BestRow& top = rows[0];
  EXPECT_EQ(top.problem, problem());
  EXPECT_EQ(top.family, "flash_fwd_mma");
  EXPECT_EQ(top.config, config(128, 128));
  EXPECT_EQ(top.tflops, 390);
  EXPECT_EQ(top.max_abs_err, 1e-3);
  EXPECT_EQ(top.gpu, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(top.arch, "sm_90");
  EXPECT_EQ(top.evaluated_at.back(), 'Z');
  EXPECT_EQ(rows[1].tflops, 350) << "the row of the best median, not of the first measurement";
}

TEST_F(BestTest, FiltersAndTop) {
  BestQuery q;
  EXPECT_EQ(describe(store.best(q)),
            (std::vector<std::string>{"other block_m=128,block_n=64,pipeline=cp_async,swizzle=true 5"}));
  q.campaign = "c1";
  q.top = 5;
  EXPECT_EQ(describe(store.best(q)), (std::vector<std::string>{
                                         "c1 block_m=128,block_n=64,pipeline=cp_async,swizzle=true 100",
                                         "c1 block_m=64,block_n=64,pipeline=cp_async,swizzle=true 110",
                                     }));
  q.top = 1;
  q.problem = problem();
  EXPECT_EQ(store.best(q).size(), 1u);
  q.problem = problem("b=1,h=8,s=512,d=64,dtype=fp16,causal=0");
  EXPECT_TRUE(store.best(q).empty()) << "campaign c1 is not for that problem";
  q.campaign.reset();
  q.problem = problem("b=4,h=16,s=4096,d=128,dtype=bf16,causal=0");
  EXPECT_TRUE(store.best(q).empty()) << "causal differs";
  q.problem = problem("b=4,h=16,s=4096,d=128,dtype=fp16,causal=1");
  EXPECT_TRUE(store.best(q).empty()) << "dtype differs";
  q.top = 0;
  EXPECT_THROW(store.best(q), InputError);
}

TEST_F(BestTest, CampaignsSummarizeEach) {
  auto rows = store.campaigns();
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].spec.name, "c1");
  EXPECT_EQ(rows[0].evaluations, 5);
  EXPECT_EQ(rows[0].ok, 3);
  EXPECT_EQ(rows[0].best_us, 100);
  EXPECT_EQ(rows[0].best_tflops, 350);
  EXPECT_EQ(rows[1].spec.name, "c2");
  EXPECT_EQ(rows[1].best_us, 90);
  EXPECT_EQ(rows[2].spec.problem, problem("b=1,h=8,s=512,d=64,dtype=fp16,causal=0"));
}

TEST_F(StoreTest, StoreIsMovable) {
  Store moved = std::move(store);
  EXPECT_EQ(moved.upsert_device(h100()), device);
  Store assigned = Store::open(dir.file("second.db"), Store::Mode::kCreate);
  assigned = std::move(moved);
  EXPECT_EQ(assigned.upsert_device(h100()), device);
  EXPECT_EQ(assigned.path(), path);
}
}  // namespace test_db_store
