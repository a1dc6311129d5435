// `merge` (db/store_merge.cpp, docs/design/merge.md): databases of several hosts combined without
// duplicates. Disjoint campaigns copied whole with their ids remapped (best answers as the input did),
// merging again adding nothing (every table's rows and contents compared), a campaign extended from a
// prefix, a diverging one kept under a new name, the queue's state precedence, builds and gpus,
// refused inputs leaving the output byte for byte as it was, one transaction for the whole merge, and
// the command end to end (with databases that `serve --simulate` wrote, one of them while it ran).
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <thread>

#include <fmt/format.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "db/merge.hpp"
#include "db/sqlite.hpp"
#include "db_test_util.hpp"
#include "service/job.hpp"
#include "tests/common/run_attntune.hpp"

namespace test_db_merge {
using namespace attntune;
using namespace attntune::test;
using attntune::testing::lines;
using attntune::testing::run_attntune;
using sqlite::Connection;
using sqlite::Statement;

namespace {

const char* const kTables[] = {"devices",  "campaigns", "campaign_spaces", "campaign_runs", "candidates", "builds",
                               "evaluations", "rankings", "queue", "leases", "gpus"};

// A connection that only reads (a read-write open, so a WAL database's side files go when it closes).
Connection reader(const std::string& path) { return Connection::open(path, SQLITE_OPEN_READWRITE); }

std::vector<std::string> rows_of(Connection& db, const std::string& sql) {
  Statement st(db, sql);
  std::vector<std::string> out;
  while (st.step()) out.push_back(st.text(0));
  return out;
}

// Every table's rows as SQLite quotes them, ids included, in order: equal when nothing changed.
std::map<std::string, std::vector<std::string>> exact_digest(const std::string& path) {
  Connection db = reader(path);
  std::map<std::string, std::vector<std::string>> out;
  for (const char* table : kTables) {
    std::string expr;
    for (const std::string& column : rows_of(db, fmt::format("SELECT name FROM pragma_table_info('{}')", table)))
      expr += (expr.empty() ? "" : " || '|' || ") + fmt::format("quote({})", column);
    out[table] = rows_of(db, fmt::format("SELECT {} FROM {} ORDER BY 1", expr, table));
  }
  return out;
}

std::map<std::string, std::int64_t> row_counts(const std::string& path) {
  Connection db = reader(path);
  std::map<std::string, std::int64_t> out;
  for (const char* table : kTables) {
    Statement st(db, fmt::format("SELECT count(*) FROM {}", table));
    st.step();
    out[table] = st.int64(0);
  }
  return out;
}

// The contents without ids: what a merged copy must hold of an input, whatever ids it gave the rows.
// Rows refer to devices, candidates and campaigns by their identity. `queue_state` maps the queue's
// state (a running job is merged as queued).
std::map<std::string, std::vector<std::string>> content(const std::string& path, bool running_as_queued = false) {
  Connection db = reader(path);
  const std::string device = "quote(d.name) || quote(d.arch) || quote(d.uuid)";
  const std::string cand = "quote(k.family) || quote(k.config_key) || quote(k.source_hash) || quote(k.config)";
  std::map<std::string, std::vector<std::string>> out;
  out["devices"] = rows_of(db, "SELECT " + device + " || quote(sm_count) || quote(driver_version) FROM devices d ORDER BY 1");
  out["candidates"] = rows_of(db, "SELECT " + cand + " FROM candidates k ORDER BY 1");
  out["builds"] = rows_of(db,
                          "SELECT quote(source_hash) || quote(arch) || quote(nvrtc_version) || quote(options) || "
                          "quote(status) || quote(cubin) || quote(log) || quote(registers) || quote(smem_static) || "
                          "quote(spill_stores) || quote(spill_loads) || quote(local_bytes) || quote(compile_ms) || "
                          "quote(created_at) FROM builds ORDER BY 1");
  out["campaigns"] = rows_of(
      db, "SELECT quote(c.name) || quote(problem) || quote(b) || quote(h) || quote(hkv) || quote(s) || quote(sk) || "
          "quote(c.d) || quote(dtype) || quote(causal) || quote(page) || quote(space_path) || quote(space_hash) || "
          "quote(family) || quote(strategy) || quote(seed) || quote(status) || quote(stop_reason) || "
          "quote(budget_evals) || quote(budget_seconds) || quote(started_at) || quote(ended_at) || "
          "quote(space_text) || " + device + " FROM campaigns c JOIN devices d ON d.id = c.device_id ORDER BY 1");
  out["campaign_spaces"] = rows_of(db,
                                   "SELECT quote(c.name) || quote(s.family) || quote(s.space_path) || "
                                   "quote(s.space_hash) || quote(s.space_text) FROM campaign_spaces s JOIN campaigns c "
                                   "ON c.id = s.campaign_id ORDER BY 1");
  out["campaign_runs"] = rows_of(
      db, "SELECT quote(c.name) || quote(r.run) || quote(r.strategy) || quote(r.seed) || quote(r.budget_evals) || "
          "quote(r.budget_seconds) || quote(r.started_at) || quote(r.ended_at) || quote(r.status) || "
          "quote(r.stop_reason) || " + device + " FROM campaign_runs r JOIN campaigns c ON c.id = r.campaign_id "
          "JOIN devices d ON d.id = r.device_id ORDER BY 1");
  out["evaluations"] = rows_of(
      db, "SELECT quote(c.name) || quote(e.seq) || " + cand + " || " + device +
              " || quote(e.status) || quote(error) || quote(median_us) || quote(min_us) || quote(max_us) || "
              "quote(stdev_us) || quote(count) || quote(tflops) || quote(max_abs_err) || quote(err_bound) || "
              "quote(evaluated_at) || quote(phase) FROM evaluations e JOIN campaigns c ON c.id = e.campaign_id "
              "JOIN candidates k ON k.id = e.candidate_id JOIN devices d ON d.id = e.device_id ORDER BY 1");
  out["rankings"] = rows_of(
      db, "SELECT quote(c.name) || quote(r.rank) || " + cand + " || " + device +
              " || quote(r.median_us) || quote(r.tflops) || quote(r.max_abs_err) || quote(spread_pct) || "
              "quote(rounds) || quote(ranked_at) FROM rankings r JOIN campaigns c ON c.id = r.campaign_id "
              "JOIN candidates k ON k.id = r.candidate_id JOIN devices d ON d.id = r.device_id ORDER BY 1");
  out["queue"] = rows_of(db, std::string("SELECT quote(campaign) || quote(plan) || quote(regime) || quote(problem) || "
                                         "quote(request) || quote(") +
                                 (running_as_queued ? "CASE state WHEN 'running' THEN 'queued' ELSE state END"
                                                    : "state") +
                                 ") || quote(attempts) || quote(error) || quote(worker) || quote(submitted_at) || "
                                 "quote(started_at) || quote(ended_at) FROM queue ORDER BY 1");
  out["gpus"] = rows_of(db,
                        "SELECT quote(host) || quote(ordinal) || quote(name) || quote(uuid) || quote(state) || "
                        "quote(error) || quote(updated_at) FROM gpus ORDER BY 1");
  return out;
}

void expect_sound(const std::string& path) {
  Connection db = reader(path);
  EXPECT_EQ(rows_of(db, "PRAGMA integrity_check"), std::vector<std::string>{"ok"}) << path;
  EXPECT_TRUE(rows_of(db, "PRAGMA foreign_key_check").empty()) << path;
}

// `best` of one campaign, everything it says, as text.
std::vector<std::string> best_of(const std::string& path, const std::string& campaign, int top = 10) {
  Store s = Store::open(path, Store::Mode::kReadOnly);
  BestQuery q;
  q.campaign = campaign;
  q.top = top;
  std::vector<std::string> out;
  for (const BestRow& r : s.best(q))
    out.push_back(fmt::format("{} {} {} {} {} {} {} {} {} {} {}", r.campaign, r.problem.str(), r.family,
                              config_str(r.config), r.median_us, r.tflops, r.max_abs_err, r.gpu, r.arch,
                              r.evaluated_at, r.source_hash));
  return out;
}

DeviceInfo a100() { return {"NVIDIA A100-SXM4-80GB", "sm_80", "GPU-2222", 108, "550.54"}; }

// A campaign of `n` evaluations (every fourth a failure), configs offset by `shift` so that two hosts
// evaluate different things, on `device`; ranked and completed when `finish`.
void run_campaign(Store& s, const std::string& name, const DeviceInfo& device, int n, int shift = 0,
                  bool finish = true, const Problem& p = problem()) {
  const std::int64_t dev = s.upsert_device(device);
  const std::int64_t c = s.open_campaign(spec(name, p), dev);
  std::vector<std::int64_t> ok;
  for (int i = 0; i < n; ++i) {
    const std::int64_t k = s.upsert_candidate("flash_fwd_mma", config(16 * ((i + shift) % 8 + 1), 32 + i + shift), "h1");
    // Medians all different: `best` breaks ties by candidate id, which a merge renumbers.
    s.record_evaluation(c, k, dev,
                        i % 4 == 3 ? failed_eval("wrong_result", "max error 0.5")
                                   : ok_eval(100 + 7 * ((i * 5 + shift) % 11) + 0.01 * i));
    if (i % 4 != 3) ok.push_back(k);
  }
  if (!finish) return;
  std::vector<RankingEntry> ranking;
  for (std::size_t r = 0; r < std::min<std::size_t>(3, ok.size()); ++r)
    ranking.push_back({ok[r], 90.0 + static_cast<double>(r), 300, 1e-3, 1.5, 6, 0});
  s.put_ranking(c, dev, ranking);
  s.finish_campaign(c, "completed", "budget spent");
}

// Records `n` more evaluations in campaign `name`, then ranks and completes it.
void continue_campaign(const std::string& path, const std::string& name, int n, bool finish = true) {
  Store s = Store::open(path, Store::Mode::kExisting);
  const std::int64_t dev = s.upsert_device(h100());
  const std::int64_t c = s.open_campaign(spec(name), dev);
  // With nothing evaluated, the ranking names run_campaign's first candidate.
  std::int64_t last = s.upsert_candidate("flash_fwd_mma", config(16, 32), "h1");
  for (int i = 0; i < n; ++i) {
    last = s.upsert_candidate("flash_fwd_mma", config(256, 1000 + i), "h2");
    s.record_evaluation(c, last, dev, ok_eval(80 + i));
  }
  if (!finish) return;
  s.put_ranking(c, dev, {{last, 79, 320, 1e-3, 0.5, 6, 0}});
  s.finish_campaign(c, "completed", "budget spent");
}

struct MergeTest : ::testing::Test {
  TempDir dir;
  std::string a = dir.file("A.db"), b = dir.file("B.db"), out = dir.file("OUT.db");
};

// ------------------------------------------------------------------------------------------------

TEST_F(MergeTest, DisjointCampaignsAreCopiedWithTheirIdsRemapped) {
  {
    Store s = Store::open(a, Store::Mode::kCreate);
    run_campaign(s, "on-h100", h100(), 12);
  }
  {
    Store s = Store::open(b, Store::Mode::kCreate);
    // Another device first, so B's ids for the same H100 and candidates differ from A's.
    run_campaign(s, "on-a100", a100(), 9, 3);
    run_campaign(s, "also-h100", h100(), 6, 0, false, problem("b=1,h=8,s=512,d=64,dtype=fp16,causal=0"));
  }
  const auto report = merge_databases({a, b}, out);
  ASSERT_EQ(report.size(), 2u);
  EXPECT_EQ(report[0].campaigns_added, 1);
  EXPECT_EQ(report[0].evaluations_added, 12);
  EXPECT_EQ(report[0].devices_added, 1);
  EXPECT_EQ(report[0].rankings_added, 3);
  EXPECT_EQ(report[1].campaigns_added, 2);
  EXPECT_EQ(report[1].campaigns_renamed, 0);
  EXPECT_EQ(report[1].evaluations_added, 15);
  EXPECT_EQ(report[1].devices_added, 1);  // the H100 is A's
  // Candidates are content-addressed: B's configs that A evaluated are not added again.
  EXPECT_EQ(report[0].candidates_added, 12);
  EXPECT_EQ(report[1].candidates_added, row_counts(out)["candidates"] - 12);
  EXPECT_LT(report[1].candidates_added, row_counts(b)["candidates"]);

  EXPECT_EQ(best_of(out, "on-h100"), best_of(a, "on-h100"));
  for (const char* c : {"on-a100", "also-h100"}) EXPECT_EQ(best_of(out, c), best_of(b, c));
  const auto counts = row_counts(out);
  EXPECT_EQ(counts.at("campaigns"), 3);
  EXPECT_EQ(counts.at("evaluations"), 27);
  EXPECT_EQ(counts.at("devices"), 2);
  expect_sound(out);
}

TEST_F(MergeTest, AFreshCopyHoldsEverythingTheInputHolds) {
  {
    Store s = Store::open(a, Store::Mode::kCreate);
    run_campaign(s, "first", h100(), 10);
    run_campaign(s, "second", a100(), 5, 2, false);
    s.put_build({"h1", "sm_90", "12.4", "-O3"}, {"ok", std::string("\x7f" "ELF\0\1\2", 7), "log", 96, 1024, 0, 0, 0, 812.5});
    s.put_build({"h2", "sm_90", "12.4", "-O3"}, {"compile_error", "", "error: x", 0, 0, 0, 0, 0, 20});
    s.put_gpu({"host-a", 0, "NVIDIA H100 80GB HBM3", "GPU-1111", "ok", "", ""});
  }
  const auto report = merge_databases({a}, out);
  EXPECT_EQ(report[0].builds_added, 2);
  EXPECT_EQ(report[0].gpus_updated, 1);
  EXPECT_EQ(content(out), content(a));
  EXPECT_EQ(row_counts(out), row_counts(a));
  expect_sound(out);
}

TEST_F(MergeTest, MergingTheSameInputsAgainAddsNothing) {
  {
    Store s = Store::open(a, Store::Mode::kCreate);
    run_campaign(s, "x", h100(), 8);
    run_campaign(s, "y", h100(), 4, 1, false);
    s.put_build({"h1", "sm_90", "12.4", "-O3"}, {"ok", "cubin", "", 96, 0, 0, 0, 0, 1});
    s.put_gpu({"host-a", 0, "H100", "GPU-1111", "ok", "", ""});
  }
  {
    Store s = Store::open(b, Store::Mode::kCreate);
    run_campaign(s, "x", h100(), 8, 5);  // diverges from A's x: kept as x@B
    run_campaign(s, "z", a100(), 3, 2);
    s.put_gpu({"host-b", 0, "A100", "GPU-2222", "ok", "", ""});
  }
  merge_databases({a}, out);
  const auto once = exact_digest(out);
  const auto again = merge_databases({a}, out);
  EXPECT_TRUE(again[0].nothing_added());
  EXPECT_EQ(again[0].campaigns_same, 2);
  EXPECT_EQ(exact_digest(out), once);

  // A, then B, then A again in one call: the second A adds nothing; then all of it again.
  const auto abc = merge_databases({a, b, a}, out);
  EXPECT_TRUE(abc[0].nothing_added());
  EXPECT_FALSE(abc[1].nothing_added());
  EXPECT_EQ(abc[1].campaigns_renamed, 1);
  EXPECT_TRUE(abc[2].nothing_added());
  const auto merged = exact_digest(out);
  const auto counts = row_counts(out);
  const auto all_again = merge_databases({b, a, b}, out);
  for (const MergeCounts& c : all_again) EXPECT_TRUE(c.nothing_added()) << c.input;
  EXPECT_EQ(all_again[0].campaigns_same, 2);  // x@B and z
  EXPECT_EQ(row_counts(out), counts);
  EXPECT_EQ(exact_digest(out), merged);
  expect_sound(out);
}

TEST_F(MergeTest, ACampaignThatContinuedElsewhereIsExtended) {
  {
    Store s = Store::open(a, Store::Mode::kCreate);
    run_campaign(s, "x", h100(), 6, 0, false);  // still running: 6 evaluations, no ranking
  }
  fs::copy_file(a, b);
  continue_campaign(b, "x", 4);  // B ran it on: 4 more, ranked, completed

  const auto first = merge_databases({a}, out);
  EXPECT_EQ(first[0].campaigns_added, 1);
  const auto second = merge_databases({b}, out);
  EXPECT_EQ(second[0].campaigns_extended, 1);
  EXPECT_EQ(second[0].campaigns_added + second[0].campaigns_renamed, 0);
  EXPECT_EQ(second[0].evaluations_added, 4);
  EXPECT_EQ(second[0].rankings_added, 1);
  EXPECT_EQ(content(out), content(b));
  EXPECT_EQ(best_of(out, "x"), best_of(b, "x"));

  // A's x is a prefix of what OUT holds now: nothing to add, whichever order.
  const auto older = merge_databases({a}, out);
  EXPECT_TRUE(older[0].nothing_added());
  EXPECT_EQ(older[0].campaigns_same, 1);
  const std::string out2 = dir.file("OUT2.db");
  const auto reverse = merge_databases({b, a}, out2);
  EXPECT_TRUE(reverse[1].nothing_added());
  EXPECT_EQ(content(out2), content(b));
  expect_sound(out);
}

TEST_F(MergeTest, TheSameEvaluationsFinishedElsewhereTakeTheEnd) {
  {
    Store s = Store::open(a, Store::Mode::kCreate);
    run_campaign(s, "x", h100(), 6, 0, false);
  }
  fs::copy_file(a, b);
  continue_campaign(b, "x", 0);  // ranked and completed, nothing more evaluated
  merge_databases({a}, out);
  const auto report = merge_databases({b}, out);
  EXPECT_EQ(report[0].campaigns_extended, 1);
  EXPECT_EQ(report[0].evaluations_added, 0);
  EXPECT_EQ(content(out), content(b));
  EXPECT_TRUE(merge_databases({a, b}, out)[1].nothing_added());
}

TEST_F(MergeTest, ADivergingCampaignIsKeptUnderANewName) {
  {
    Store s = Store::open(a, Store::Mode::kCreate);
    run_campaign(s, "x", h100(), 8);
  }
  {
    Store s = Store::open(b, Store::Mode::kCreate);
    run_campaign(s, "x", h100(), 8, 3);  // the same campaign run again on another host: other results
  }
  // A third host whose file is also named B.db, diverging from both.
  fs::create_directory(dir.path() / "other");
  const std::string b2 = (dir.path() / "other" / "B.db").string();
  {
    Store s = Store::open(b2, Store::Mode::kCreate);
    run_campaign(s, "x", h100(), 5, 6);
  }
  const auto report = merge_databases({a, b, b2}, out);
  EXPECT_EQ(report[1].campaigns_renamed, 1);
  ASSERT_EQ(report[1].renamed.size(), 1u);
  EXPECT_EQ(report[1].renamed[0].campaign, "x");
  EXPECT_EQ(report[1].renamed[0].stored_as, "x@B");
  EXPECT_NE(report[1].renamed[0].reason.find("differ from evaluation 1"), std::string::npos)
      << report[1].renamed[0].reason;
  ASSERT_EQ(report[2].renamed.size(), 1u);
  EXPECT_EQ(report[2].renamed[0].stored_as, "x@B.2");

  EXPECT_EQ(best_of(out, "x"), best_of(a, "x"));
  auto renamed = [](std::vector<std::string> rows, const std::string& from, const std::string& to) {
    for (std::string& r : rows) r.replace(0, from.size(), to);
    return rows;
  };
  EXPECT_EQ(best_of(out, "x@B"), renamed(best_of(b, "x"), "x", "x@B"));
  EXPECT_EQ(best_of(out, "x@B.2"), renamed(best_of(b2, "x"), "x", "x@B.2"));
  EXPECT_EQ(row_counts(out).at("evaluations"), 21);

  // Again: each finds its campaign where it put it.
  const auto again = merge_databases({b2, b, a}, out);
  for (const MergeCounts& c : again) {
    EXPECT_TRUE(c.nothing_added()) << c.input;
    EXPECT_EQ(c.campaigns_same, 1) << c.input;
  }
  expect_sound(out);
}

TEST_F(MergeTest, ASameNamedCampaignOfAnotherProblemIsRenamed) {
  {
    Store s = Store::open(a, Store::Mode::kCreate);
    run_campaign(s, "x", h100(), 4);
  }
  {
    Store s = Store::open(b, Store::Mode::kCreate);
    run_campaign(s, "x", h100(), 4, 0, true, problem("b=1,h=8,s=512,d=64,dtype=fp16,causal=0"));
  }
  const auto report = merge_databases({a, b}, out);
  ASSERT_EQ(report[1].renamed.size(), 1u);
  EXPECT_EQ(report[1].renamed[0].stored_as, "x@B");
  EXPECT_NE(report[1].renamed[0].reason.find("another problem"), std::string::npos);
  Store s = Store::open(out, Store::Mode::kReadOnly);
  EXPECT_EQ(s.campaign_row("x@B")->spec.problem, problem("b=1,h=8,s=512,d=64,dtype=fp16,causal=0"));
  EXPECT_EQ(s.campaign_row("x")->spec.problem, problem());
}

// ------------------------------------------------------------------------------------------------
// The queue, builds and gpus

QueuedJob job(const std::string& spec) {
  QueuedJob j;
  j.problem = Problem::parse(spec);
  j.request.spaces = service::default_spaces(j.problem);
  j.request.budget_evals = 10;
  j.campaign = service::default_campaign_name(j.request.spaces, j.problem);
  return j;
}

const auto never_stale = [](const LeaseRow&, double) { return false; };

// Claims `job` (and only it) for a worker, then releases it in `state` unless that is "running".
void claim(Store& s, const QueuedJob& j, const std::string& state, int pid = 100) {
  const LeaseOwner owner{"host", pid, "1", 0};
  const auto got = s.claim_job(owner, 1000, 60, never_stale, [&](const QueuedJob& q) { return q.campaign == j.campaign; });
  ASSERT_TRUE(got);
  if (state != "running") {
    ASSERT_TRUE(s.release_job(j.campaign, owner.id(), state, state == "failed" ? "boom" : ""));
  }
}

struct Queue {
  std::string state, ended_at;
  std::int64_t attempts;
};
std::map<std::string, Queue> queue_of(const std::string& path) {
  Store s = Store::open(path, Store::Mode::kReadOnly);
  std::map<std::string, Queue> out;
  for (const QueueStatusRow& r : s.queue_status()) out[r.job.campaign] = {r.job.state, r.job.ended_at, r.job.attempts};
  return out;
}

TEST_F(MergeTest, TheQueueKeepsTheStateFurthestAlong) {
  const QueuedJob j1 = job("b=1,h=8,s=512,d=64,dtype=bf16,causal=1"), j2 = job("b=2,h=8,s=512,d=64,dtype=bf16,causal=1"),
                  j3 = job("b=3,h=8,s=512,d=64,dtype=bf16,causal=1"), j4 = job("b=4,h=8,s=512,d=64,dtype=bf16,causal=1"),
                  j5 = job("b=5,h=8,s=512,d=64,dtype=bf16,causal=1");
  {
    Store s = Store::open(a, Store::Mode::kCreate);
    for (const QueuedJob* j : {&j1, &j2, &j3, &j4}) s.submit_job(*j);
    claim(s, j2, "running");
    claim(s, j3, "done");
    claim(s, j4, "failed");
  }
  {
    Store s = Store::open(b, Store::Mode::kCreate);
    for (const QueuedJob* j : {&j1, &j2, &j3, &j4, &j5}) s.submit_job(*j);
    claim(s, j1, "done");
    claim(s, j2, "queued");
    claim(s, j2, "queued");
    claim(s, j3, "queued");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // B's j4 ends later than A's
    claim(s, j4, "done");
    claim(s, j5, "running");
  }
  const auto first = merge_databases({a}, out);
  EXPECT_EQ(first[0].queue_added, 4);
  auto qs = queue_of(out);
  EXPECT_EQ(qs[j1.campaign].state, "queued");
  EXPECT_EQ(qs[j2.campaign].state, "queued");  // running on A: its lease is A's, not merged
  EXPECT_EQ(qs[j3.campaign].state, "done");
  EXPECT_EQ(qs[j4.campaign].state, "failed");

  const auto second = merge_databases({b}, out);
  EXPECT_EQ(second[0].queue_added, 1);
  EXPECT_EQ(second[0].queue_updated, 3);  // j1 done, j2 more attempts, j4 done
  qs = queue_of(out);
  const auto qb = queue_of(b);
  EXPECT_EQ(qs[j1.campaign].state, "done");
  EXPECT_EQ(qs[j1.campaign].ended_at, qb.at(j1.campaign).ended_at);
  EXPECT_EQ(qs[j2.campaign].state, "queued");
  EXPECT_EQ(qs[j2.campaign].attempts, 2);
  EXPECT_EQ(qs[j3.campaign].state, "done");  // done on A, queued on B: done
  EXPECT_EQ(qs[j3.campaign].ended_at, queue_of(a).at(j3.campaign).ended_at);
  EXPECT_EQ(qs[j4.campaign].state, "done");  // failed on A, done on B
  EXPECT_EQ(qs[j4.campaign].ended_at, qb.at(j4.campaign).ended_at);
  EXPECT_EQ(qs[j5.campaign].state, "queued");
  EXPECT_EQ(row_counts(out).at("leases"), 0);

  const auto again = merge_databases({a, b}, out);
  EXPECT_TRUE(again[0].nothing_added());
  EXPECT_TRUE(again[1].nothing_added());
  expect_sound(out);
}

TEST_F(MergeTest, AnOkBuildReplacesAFailedOne) {
  const BuildKey key{"h1", "sm_90", "12.4", "-O3 --std=c++17"};
  {
    Store s = Store::open(a, Store::Mode::kCreate);
    s.put_build(key, {"compile_timeout", "", "killed after 120 s", 0, 0, 0, 0, 0, 120000});
  }
  {
    Store s = Store::open(b, Store::Mode::kCreate);
    s.put_build(key, {"ok", std::string("\0cubin\0", 7), "ptxas info", 128, 2048, 0, 0, 0, 900});
  }
  const auto report = merge_databases({a, b, a}, out);
  EXPECT_EQ(report[0].builds_added, 1);
  EXPECT_EQ(report[1].builds_replaced, 1);
  EXPECT_TRUE(report[2].nothing_added());
  Store s = Store::open(out, Store::Mode::kReadOnly);
  const auto got = s.find_build(key);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->status, "ok");
  EXPECT_EQ(got->cubin, std::string("\0cubin\0", 7));
  EXPECT_EQ(got->registers, 128);
  EXPECT_EQ(row_counts(out).at("builds"), 1);
}

TEST_F(MergeTest, TheLatestGpuRowWins) {
  auto set_time = [](const std::string& path, const std::string& host, const std::string& at) {
    Connection db = Connection::open(path, SQLITE_OPEN_READWRITE);
    Statement(db, "UPDATE gpus SET updated_at = ?2 WHERE host = ?1").bind(host, at).run();
  };
  {
    Store s = Store::open(a, Store::Mode::kCreate);
    s.put_gpu({"host-a", 0, "H100", "GPU-1", "ok", "", ""});
  }
  set_time(a, "host-a", "2026-01-01T00:00:00.000Z");
  {
    Store s = Store::open(b, Store::Mode::kCreate);
    s.put_gpu({"host-a", 0, "H100", "GPU-1", "failed", "Xid 79", ""});
    s.put_gpu({"host-b", 1, "H100", "GPU-2", "ok", "", ""});
  }
  set_time(b, "host-a", "2026-01-02T00:00:00.000Z");
  const auto report = merge_databases({b, a}, out);
  EXPECT_EQ(report[0].gpus_updated, 2);
  EXPECT_EQ(report[1].gpus_updated, 0);  // A's row is older
  Store s = Store::open(out, Store::Mode::kReadOnly);
  const auto gpus = s.gpus();
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].state, "failed");
  EXPECT_EQ(gpus[0].error, "Xid 79");
  EXPECT_EQ(merge_databases({a, b}, dir.file("OUT2.db"))[1].gpus_updated, 2);
  EXPECT_EQ(content(dir.file("OUT2.db"))["gpus"], content(out)["gpus"]);
}

// ------------------------------------------------------------------------------------------------
// Refusals: OUT byte for byte as it was

struct MergeRefusalTest : MergeTest {
  TempDir out_dir;
  std::string target = out_dir.file("OUT.db");

  void SetUp() override {
    {
      Store s = Store::open(a, Store::Mode::kCreate);
      run_campaign(s, "x", h100(), 5);
    }
    merge_databases({a}, target);
  }

  // merge_databases(inputs, out) throws InputError mentioning `why`; the output's folder is as it was.
  void expect_refused(const std::vector<std::string>& inputs, const std::string& out, const std::string& why) {
    const auto before = snapshot(out_dir.path());
    std::string message = "(no error)";
    try {
      merge_databases(inputs, out);
    } catch (const InputError& e) {
      message = e.what();
    }
    EXPECT_NE(message.find(why), std::string::npos) << message;
    EXPECT_EQ(snapshot(out_dir.path()), before) << message;
  }
};

TEST_F(MergeRefusalTest, MergeRefusesBadInputsAndLeavesTheOutputUntouched) {
  const std::string a_bytes = read_bytes(a);
  expect_refused({}, target, "no input databases");
  expect_refused({a, dir.file("missing.db")}, target, "does not exist");

  const std::string text = dir.file("notes.db");
  write_bytes(text, "these are not the rows you are looking for\n");
  expect_refused({a, text}, target, "not an SQLite database");

  const std::string other = dir.file("other.db");
  {
    Connection db = Connection::open(other, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    db.exec("CREATE TABLE t (x); INSERT INTO t VALUES (1)");
  }
  expect_refused({a, other}, target, "not an attntune database");

  const std::string newer = dir.file("newer.db");
  fs::copy_file(a, newer);
  {
    Connection db = Connection::open(newer, SQLITE_OPEN_READWRITE);
    db.exec(fmt::format("PRAGMA user_version = {}", Store::current_schema_version() + 1));
  }
  expect_refused({a, newer}, target,
                 fmt::format("has schema version {}, this attntune's is {}", Store::current_schema_version() + 1,
                             Store::current_schema_version()));

  // The output as an input: by name, by another spelling, through a hard link and a symbolic link.
  expect_refused({a, target}, target, "is the input");
  expect_refused({(out_dir.path() / "." / "OUT.db").string()}, target, "(the same file)");
  const std::string hard = dir.file("hard.db"), soft = dir.file("soft.db");
  fs::create_hard_link(target, hard);
  fs::create_symlink(target, soft);
  expect_refused({a, hard}, target, "is the input");
  expect_refused({soft}, target, "is the input");
  fs::remove(hard);

  // A missing output is not created for a refused merge.
  const std::string fresh = out_dir.file("fresh.db");
  expect_refused({a, text}, fresh, "not an SQLite database");
  EXPECT_FALSE(fs::exists(fresh));
  // And the input was never written.
  EXPECT_EQ(read_bytes(a), a_bytes);
}

TEST_F(MergeRefusalTest, AFailureHalfwayWritesNothing) {
  // B passes every check when opened, but an evaluation refers to a candidate it does not hold:
  // found while merging the second input, after the first was merged in the same transaction.
  const std::string c = dir.file("C.db");
  {
    Store s = Store::open(c, Store::Mode::kCreate);
    run_campaign(s, "fresh", a100(), 3);
  }
  {
    Store s = Store::open(b, Store::Mode::kCreate);
    run_campaign(s, "broken", h100(), 3);
  }
  {
    Connection db = Connection::open(b, SQLITE_OPEN_READWRITE);  // foreign keys off: SQLite's default
    db.exec("UPDATE evaluations SET candidate_id = 999 WHERE seq = 2");
  }
  expect_refused({c, b}, target, "refers to candidate 999");
  EXPECT_FALSE(Store::open(target, Store::Mode::kReadOnly).campaign_row("fresh"));
}

TEST_F(MergeTest, AnOlderInputIsReadThroughAnInMemoryMigration) {
  {
    Store s = Store::open(a, Store::Mode::kCreate);
    run_campaign(s, "old", h100(), 5);
  }
  {
    // Schema version 5: version 6 only added the service's tables, version 7 campaign_runs,
    // version 8 campaigns.varlen and lens_seed, version 9 campaigns.variants, version 10
    // campaigns.dv (and them in campaigns_problem).
    Connection db = Connection::open(a, SQLITE_OPEN_READWRITE);
    db.exec("DROP TABLE campaign_runs; DROP TABLE queue; DROP TABLE leases; DROP TABLE gpus; "
            "DROP INDEX campaigns_problem; ALTER TABLE campaigns DROP COLUMN varlen; "
            "ALTER TABLE campaigns DROP COLUMN lens_seed; ALTER TABLE campaigns DROP COLUMN variants; "
            "ALTER TABLE campaigns DROP COLUMN dv; "
            "CREATE INDEX campaigns_problem ON campaigns (b, h, hkv, s, sk, d, dtype, causal, page); "
            "PRAGMA user_version = 5");
  }
  const std::string before = read_bytes(a);
  std::vector<std::string> progress;
  const auto report = merge_databases({a}, out, [&](const std::string& line) { progress.push_back(line); });
  EXPECT_EQ(report[0].campaigns_added, 1);
  EXPECT_EQ(read_bytes(a), before);
  EXPECT_EQ(header_u32(a, 60), 5u);
  ASSERT_FALSE(progress.empty());
  EXPECT_NE(progress[0].find("schema version 5"), std::string::npos) << progress[0];
  EXPECT_EQ(best_of(out, "old"), best_of(a, "old"));
}

// ------------------------------------------------------------------------------------------------
// The command

std::string q(const std::string& path) { return "'" + path + "'"; }

TEST_F(MergeTest, CliPrintsALinePerInputOrJson) {
  {
    Store s = Store::open(a, Store::Mode::kCreate);
    run_campaign(s, "x", h100(), 6);
  }
  {
    Store s = Store::open(b, Store::Mode::kCreate);
    run_campaign(s, "x", h100(), 6, 2);
    run_campaign(s, "y", a100(), 2);
  }
  const auto r = run_attntune("merge " + q(a) + " " + q(b) + " -o " + q(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto out_lines = lines(r.out);
  ASSERT_EQ(out_lines.size(), 3u) << r.out;
  EXPECT_EQ(out_lines[0].rfind(a + ": campaigns 1 added, 0 extended, 0 same, 0 renamed; 6 evaluations added", 0), 0u)
      << out_lines[0];
  EXPECT_EQ(out_lines[1].rfind(b + ": campaigns 1 added, 0 extended, 0 same, 1 renamed; 8 evaluations added", 0), 0u)
      << out_lines[1];
  EXPECT_NE(out_lines[2].find("campaign 'x' stored as 'x@B'"), std::string::npos) << out_lines[2];
  EXPECT_NE(r.err.find("merged into"), std::string::npos) << r.err;

  const auto j = run_attntune("merge " + q(a) + " " + q(b) + " --format json -o " + q(out));
  ASSERT_EQ(j.rc, 0) << j.err;
  const auto doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc["out"], out);
  ASSERT_EQ(doc["inputs"].size(), 2u);
  for (const auto& input : doc["inputs"]) {
    EXPECT_EQ(input["nothing_added"], true);
    EXPECT_EQ(input["evaluations_added"], 0);
    EXPECT_EQ(input["campaigns"]["same"], input["input"] == a ? 1 : 2);
  }
}

TEST_F(MergeTest, CliRefusalsAreOneLineExitTwoAndTouchNothing) {
  {
    Store s = Store::open(a, Store::Mode::kCreate);
    run_campaign(s, "x", h100(), 3);
  }
  ASSERT_EQ(run_attntune("merge " + q(a) + " -o " + q(out)).rc, 0);
  const std::string text = dir.file("notes.txt");
  write_bytes(text, "hello\n");
  const std::string before = read_bytes(out);
  for (const std::string& args : {"merge -o " + q(out), "merge " + q(a) + " " + q(dir.file("nope.db")) + " -o " + q(out),
                                  "merge " + q(a) + " " + q(text) + " -o " + q(out), "merge " + q(out) + " -o " + q(out),
                                  "merge " + q(a)}) {
    const auto r = run_attntune(args);
    EXPECT_EQ(r.rc, 2) << args;
    const auto err = lines(r.err);
    ASSERT_EQ(err.size(), 1u) << args << "\n" << r.err;
    EXPECT_EQ(err[0].rfind("attntune: error: merge", 0), 0u) << err[0];
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_EQ(read_bytes(out), before) << args;
    EXPECT_FALSE(fs::exists(out + "-wal")) << args;
  }
}

// Databases the service wrote (`serve --simulate`: a synthetic runner, no GPU), one per host.
TEST_F(MergeTest, CliMergesWhatServeWrote) {
  const std::string p1 = "b=1,h=8,s=512,d=64,dtype=bf16,causal=1", p2 = "b=2,h=8,s=512,d=64,dtype=bf16,causal=1";
  for (const auto& [db, problems] : {std::pair{a, std::vector{p1}}, std::pair{b, std::vector{p1, p2}}}) {
    std::string submit = "submit --db " + q(db) + " --budget-evals 20";
    for (const std::string& p : problems) submit += " --problem " + p;
    ASSERT_EQ(run_attntune(submit).rc, 0);
    const auto served = run_attntune("serve --db " + q(db) + " --simulate --gpus 0 --simulate-delay-ms 0");
    ASSERT_EQ(served.rc, 0) << served.err;
  }
  const auto r = run_attntune("merge " + q(a) + " " + q(b) + " --format json -o " + q(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["inputs"][0]["campaigns"]["added"], 1);
  EXPECT_GE(doc["inputs"][0]["evaluations_added"].get<int>(), 20);
  // B's p1 campaign has the name of A's: the same, or kept beside it when its results differ.
  const auto& second = doc["inputs"][1]["campaigns"];
  EXPECT_EQ(second["added"], 1);
  EXPECT_EQ(second["same"].get<int>() + second["renamed"].get<int>(), 1);
  expect_sound(out);

  Store sa = Store::open(a, Store::Mode::kReadOnly);
  for (const CampaignRow& c : sa.campaigns()) {
    const auto in = run_attntune("best --db " + q(a) + " --campaign '" + c.spec.name + "' --top 5 --format json");
    const auto merged = run_attntune("best --db " + q(out) + " --campaign '" + c.spec.name + "' --top 5 --format json");
    ASSERT_EQ(in.rc, 0) << in.err;
    EXPECT_EQ(merged.out, in.out);
  }
  const auto again = run_attntune("merge " + q(b) + " " + q(a) + " -o " + q(out));
  ASSERT_EQ(again.rc, 0) << again.err;
  for (const std::string& line : lines(again.out)) EXPECT_NE(line.find("(nothing new)"), std::string::npos) << line;
}

// `merge LIVE -o COPY` while `serve` writes LIVE: every copy is consistent, and the copies extend
// one another until the last holds all of it.
TEST_F(MergeTest, CliCopiesADatabaseWhileServeWritesIt) {
  ASSERT_EQ(run_attntune("submit --db " + q(a) +
                         " --budget-evals 40 --problem b=1,h=8,s=512,d=64,dtype=bf16,causal=1")
                .rc,
            0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string bin = attntune::testing::attntune_bin();
    ::execl(bin.c_str(), bin.c_str(), "serve", "--db", a.c_str(), "--simulate", "--gpus", "0",
            "--simulate-delay-ms", "30", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int copies = 0;
  for (int status = 0; ::waitpid(pid, &status, WNOHANG) == 0; ++copies) {
    const auto r = run_attntune("merge " + q(a) + " -o " + q(out));
    ASSERT_EQ(r.rc, 0) << r.err;
    expect_sound(out);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (copies > 400) {
      ::kill(pid, SIGKILL);
      FAIL() << "serve did not finish";
    }
  }
  EXPECT_GT(copies, 1);
  ASSERT_EQ(run_attntune("merge " + q(a) + " -o " + q(out)).rc, 0);
  EXPECT_EQ(content(out), content(a));
}

}  // namespace
}  // namespace test_db_merge
