// Reliability, parts 2 and 4 on the CPU (docs/RELIABILITY.md): `tune` against a simulated runner that
// answers from a real recorded H100 campaign (tests/data/campaigns/h100-exhaustive-d128.db).
//
// Kills: 20 SIGKILLs, each at a random moment of a run (during a simulated evaluation, or inside an
// evaluation's commit transaction, held open by the store's ATTNTUNE_TEST_COMMIT_DELAY_MS hook), each
// followed by a resume. After every kill: every row committed before is there unchanged, the row whose
// commit was cut is not, and SQLite's integrity check passes. At the end: every config evaluated
// exactly once, and the evaluations and the final ranking equal those of an uninterrupted run.
//
// Readers: `best` and `campaigns` (the binary) and the Store API queried in a loop while `tune` writes:
// p99 latency under 100 ms, and every row seen complete and equal to what was recorded.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "reliability_util.hpp"

namespace attntune::reliability {
namespace test_kills_and_readers {
namespace {

using namespace std::chrono_literals;

std::map<std::string, CommittedRow> search_by_config(const std::map<std::int64_t, CommittedRow>& rows) {
  std::map<std::string, CommittedRow> out;
  for (const auto& [seq, r] : rows)
    if (r.phase == "search") out.emplace(r.config, r);
  return out;
}

TEST(ReliabilityKills, TwentySigkillsThenResumesLoseNothingAndRankAsAnUninterruptedRun) {
  TempDir dir;
  const Recording rec(dir);
  const std::string work = dir.file("killed.db"), ref = dir.file("uninterrupted.db");
  constexpr int kKills = 20;
  constexpr int kEvalDelayMs = 4;      // a simulated evaluation
  constexpr int kCommitHoldMs = 250;   // a commit held open by the store's test hook
  std::mt19937 rng(20261123);

  struct Kill {
    std::string moment;
    double at_ms = 0;
    std::size_t committed_before = 0, committed_after = 0;
    std::int64_t held = 0;  // the seq whose commit the kill cut
  };
  std::vector<Kill> kills;
  std::map<std::int64_t, CommittedRow> committed;
  const auto t0 = Clock::now();

  for (int k = 0; k < kKills; ++k) {
    Kill kill;
    const bool in_commit = std::bernoulli_distribution(0.5)(rng);
    const std::string log = dir.file(fmt::format("run{:02}.log", k));
    ProcOptions o;
    o.err_file = log;
    if (in_commit) o.env = {{"ATTNTUNE_TEST_COMMIT_DELAY_MS", std::to_string(kCommitHoldMs)}};
    Proc p(rec.tune(work, "k", kEvalDelayMs), o);
    const auto start = Clock::now();
    if (in_commit) {
      // Wait for the n-th commit of this run to start, then kill inside it.
      const std::size_t nth = std::uniform_int_distribution<std::size_t>(1, 4)(rng);
      while (!p.done() && count_of(read_bytes(log), "test hook: evaluation ") < nth) std::this_thread::sleep_for(1ms);
      kill.moment = fmt::format("inside commit #{} of the run", nth);
    } else {
      const int ms = std::uniform_int_distribution<int>(30, 200)(rng);
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      kill.moment = "at a random time";
    }
    kill.at_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    p.signal(SIGKILL);
    const int rc = p.wait();
    ASSERT_EQ(rc, 128 + SIGKILL) << "run " << k << " ended before the kill landed (rc " << rc << "):\n"
                                 << read_bytes(log);

    ASSERT_EQ(integrity_check(work), "ok") << "after kill " << k;
    const auto now = committed_rows(work, "k");
    for (const auto& [seq, row] : committed) {
      auto it = now.find(seq);
      ASSERT_NE(it, now.end()) << "evaluation #" << seq << " was committed, then lost at kill " << k;
      ASSERT_EQ(it->second, row) << "evaluation #" << seq << " changed at kill " << k;
    }
    // A row the hook announced that is not there was written inside the transaction the kill cut,
    // and rolled back with it. (A kill that the scheduler delays past the hold lands after it.)
    if (const std::int64_t held = held_seq(read_bytes(log)); held > 0 && !now.count(held)) kill.held = held;
    kill.committed_before = committed.size();
    kill.committed_after = now.size();
    committed = now;
    kills.push_back(kill);
  }

  // The last resume runs to the end.
  const Ran last = run(rec.tune(work, "k", kEvalDelayMs), dir.path());
  ASSERT_EQ(last.rc, 0) << last.err;
  EXPECT_NE(last.err.find("resuming campaign 'k'"), std::string::npos) << last.err;
  const double killed_s = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_EQ(integrity_check(work), "ok");
  const auto final_rows = committed_rows(work, "k");
  for (const auto& [seq, row] : committed) ASSERT_EQ(final_rows.at(seq), row) << "evaluation #" << seq;

  // Nothing evaluated twice, nothing missing: each valid config once in the search.
  std::multiset<std::string> configs;
  for (const auto& [seq, r] : final_rows)
    if (r.phase == "search") configs.insert(r.config);
  EXPECT_EQ(configs.size(), rec.size);
  for (const std::string& c : configs) EXPECT_EQ(configs.count(c), 1u) << "evaluated twice: " << c;
  std::int64_t expect = 1;  // numbered without gaps: no half row, no hole
  for (const auto& [seq, r] : final_rows) EXPECT_EQ(seq, expect++);

  // The same campaign without interruption.
  const Ran whole = run(rec.tune(ref, "k", 0), dir.path());
  ASSERT_EQ(whole.rc, 0) << whole.err;
  const auto ref_rows = committed_rows(ref, "k");
  EXPECT_TRUE(search_by_config(final_rows) == search_by_config(ref_rows))
      << "the killed campaign's results differ from the uninterrupted one's";

  Store killed_store = Store::open(work, Store::Mode::kReadOnly), ref_store = Store::open(ref, Store::Mode::kReadOnly);
  const auto killed_c = killed_store.campaign_row("k"), ref_c = ref_store.campaign_row("k");
  ASSERT_TRUE(killed_c && ref_c);
  EXPECT_EQ(killed_c->status, "completed");
  EXPECT_EQ(killed_c->stop_reason, ref_c->stop_reason);
  const auto killed_rank = killed_store.ranking(killed_c->id), ref_rank = ref_store.ranking(ref_c->id);
  ASSERT_EQ(killed_rank.size(), 8u);  // the default --final-top
  ASSERT_EQ(killed_rank.size(), ref_rank.size());
  for (std::size_t i = 0; i < ref_rank.size(); ++i) {
    EXPECT_EQ(config_str(killed_rank[i].config), config_str(ref_rank[i].config)) << "rank " << i + 1;
    // Simulated timings carry no noise: equal, not merely close.
    EXPECT_EQ(killed_rank[i].entry.median_us, ref_rank[i].entry.median_us) << "rank " << i + 1;
  }

  int in_commit = 0;
  std::printf("kill  aimed                       at (ms)  committed before -> after  cut inside a commit\n");
  for (std::size_t i = 0; i < kills.size(); ++i) {
    const Kill& k = kills[i];
    in_commit += k.held > 0;
    std::printf("%4zu  %-26s %8.0f  %16zu -> %-5zu  %s\n", i + 1, k.moment.c_str(), k.at_ms, k.committed_before,
                k.committed_after, k.held ? fmt::format("{} (rolled back)", k.held).c_str() : "-");
  }
  std::printf("%zu kills (%d landed inside a commit), then a resume to the end: %zu evaluations, integrity ok after every "
              "kill, ranking equal to the uninterrupted run's; %.1f s\n",
              kills.size(), in_commit, configs.size(), killed_s);
  EXPECT_GE(in_commit, 5);
  EXPECT_GE(static_cast<int>(kills.size()) - in_commit, 5);
}

// ---- Readers while tune writes ----------------------------------------------------------------------

struct Latencies {
  std::mutex mu;
  std::vector<double> ms;
  std::set<std::int64_t> evaluations_seen;  // distinct campaign sizes the reader saw
  int rows_checked = 0;
  void add(double v, std::int64_t evaluations, int rows) {
    std::lock_guard<std::mutex> lock(mu);
    ms.push_back(v);
    evaluations_seen.insert(evaluations);
    rows_checked += rows;
  }
};

TEST(ReliabilityReaders, BestAndCampaignsWhileTuneWritesAreFastAndSeeOnlyWholeRows) {
  TempDir dir;
  const Recording rec(dir);
  const std::string work = dir.file("work.db");
  // The recorded result of every config: a row seen by a reader must be exactly one of these.
  std::map<std::string, double> recorded;
  std::size_t params = 0;
  {
    Store s = Store::open(rec.db, Store::Mode::kReadOnly);
    const search::RecordedCampaign r = search::RecordedCampaign::load(s, rec.campaign);
    for (const auto& [key, e] : r.results) recorded[key] = e.median_us.value_or(-1);
    params = r.space.params().size();
  }
  const Problem problem = Problem::parse(rec.problem);
  // A first run leaves a ranked campaign of 40 evaluations, so readers have rows from the start.
  ASSERT_EQ(run(rec.tune(work, "k", 0, {"--budget-evals", "40"}), dir.path()).rc, 0);

  std::atomic<bool> writing{true};
  Latencies best_bin, campaigns_bin, store_api;
  std::atomic<int> failures{0};
  auto fail = [&](const std::string& what) {
    if (failures++ < 10) ADD_FAILURE() << what;
  };
  auto check_best_row = [&](const nlohmann::json& r) {
    for (const char* key : {"campaign", "problem", "template", "config", "median_us", "tflops", "max_abs_err", "gpu",
                            "arch", "evaluated_at"})
      if (!r.contains(key)) return fail(std::string("best row without ") + key + ": " + r.dump());
    if (r["config"].size() != params) return fail("best row with a partial config: " + r.dump());
    Config c = config_from_json(r["config"]);
    auto it = recorded.find(config_str(c));
    if (it == recorded.end()) return fail("best row of a config never recorded: " + r.dump());
    const double median = r["median_us"].get<double>();
    if (median != it->second) return fail(fmt::format("best row median {} != recorded {}", median, it->second));
    const double tflops = problem.flops() / (median * 1e-6) / 1e12;
    if (std::abs(r["tflops"].get<double>() - tflops) > 1e-6 * tflops) return fail("best row tflops: " + r.dump());
    if (r["evaluated_at"].get<std::string>().empty() || r["gpu"].get<std::string>().empty())
      return fail("best row with empty fields: " + r.dump());
  };

  // Every search row any reader saw, by seq: at the end each must be the row the database holds.
  struct SeenRows {
    std::mutex mu;
    std::map<std::int64_t, std::pair<std::string, std::string>> rows;  // seq -> (config, evaluated_at)
    void note(const EvaluationRow& e) {
      std::lock_guard<std::mutex> lock(mu);
      rows.emplace(e.seq, std::pair(config_str(e.config), e.evaluated_at));
    }
  } seen_rows;
  const auto pause = 5ms;  // between queries: readers that leave the writer some of the 2 cores

  auto best_loop = [&] {
    for (int extra = 0; writing || extra < 5; extra += !writing) {
      const Ran r = run({"best", "--db", work, "--campaign", "k", "--top", "5", "--format", "json"}, dir.path());
      if (r.rc != 0) {
        fail("best: " + r.err);
        continue;
      }
      const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
      if (!j.is_array() || j.empty() || j.size() > 5) {
        fail("best: not 1-5 rows: " + r.out);
        continue;
      }
      for (const auto& row : j) check_best_row(row);
      best_bin.add(r.ms, -1, static_cast<int>(j.size()));
      std::this_thread::sleep_for(pause);
    }
  };
  auto campaigns_loop = [&] {
    std::int64_t last = 0;
    for (int extra = 0; writing || extra < 5; extra += !writing) {
      const Ran r = run({"campaigns", "--db", work, "--format", "json"}, dir.path());
      const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
      if (r.rc != 0 || !j.is_array() || j.size() != 1) {
        fail("campaigns: " + r.err + r.out);
        continue;
      }
      const auto& c = j[0];
      const std::int64_t n = c["evaluations"], ok = c["ok"];
      if (n < last) fail(fmt::format("campaigns: evaluations went from {} to {}", last, n));
      if (ok > n || n > static_cast<std::int64_t>(rec.size)) fail("campaigns: counts " + c.dump());
      if (c["name"] != "k" || c["problem"]["d"] != 128 || c["best_us"].is_null() ||
          (c["status"] != "running" && c["status"] != "completed"))
        fail("campaigns: row " + c.dump());
      last = n;
      campaigns_bin.add(r.ms, n, 1);
      std::this_thread::sleep_for(pause);
    }
  };
  auto store_loop = [&] {
    std::size_t last = 0;
    for (int extra = 0; writing || extra < 5; extra += !writing) {
      const auto t = Clock::now();
      Store s = Store::open(work, Store::Mode::kReadOnly);
      BestQuery q;
      q.campaign = "k";
      q.top = 5;
      const std::vector<BestRow> best = s.best(q);
      const std::optional<CampaignRow> row = s.campaign_row("k");
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t).count();
      const std::vector<EvaluationRow> evals = s.campaign_evaluations(row->id);
      if (evals.size() < last) fail("store: evaluations shrank");
      last = evals.size();
      std::int64_t previous = 0;
      for (const EvaluationRow& e : evals) {
        if (e.seq <= previous) fail(fmt::format("store: seq {} after {}", e.seq, previous));
        previous = e.seq;
        auto it = recorded.find(config_str(e.config));
        if (e.config.size() != params || it == recorded.end() || e.record.status != "ok" ||
            e.record.median_us != it->second || e.evaluated_at.empty())
          fail("store: a row unlike the recorded one: " + config_str(e.config));
        seen_rows.note(e);
      }
      for (const BestRow& b : best) {
        auto it = recorded.find(config_str(b.config));
        if (it == recorded.end() || b.median_us != it->second) fail("store: best row " + config_str(b.config));
      }
      // The campaign row was read first: it cannot count more than the evaluations read after it.
      if (best.empty() || !row || row->evaluations > static_cast<std::int64_t>(evals.size()) || row->ok > row->evaluations)
        fail("store: campaign row");
      store_api.add(ms, static_cast<std::int64_t>(evals.size()), static_cast<int>(evals.size() + best.size()));
      std::this_thread::sleep_for(pause);
    }
  };

  Proc writer(rec.tune(work, "k", 3), {});
  const auto t0 = Clock::now();
  std::thread a(best_loop), b(campaigns_loop), c(store_loop);
  const int writer_rc = writer.wait();
  const double write_s = std::chrono::duration<double>(Clock::now() - t0).count();
  writing = false;
  a.join();
  b.join();
  c.join();
  ASSERT_EQ(writer_rc, 0);
  {
    Store s = Store::open(work, Store::Mode::kReadOnly);
    EXPECT_EQ(s.campaign_row("k")->evaluations, static_cast<std::int64_t>(rec.size));
    std::map<std::int64_t, std::pair<std::string, std::string>> final_rows;
    for (const EvaluationRow& e : s.campaign_evaluations(s.campaign_row("k")->id))
      final_rows.emplace(e.seq, std::pair(config_str(e.config), e.evaluated_at));
    for (const auto& [seq, row] : seen_rows.rows) {
      auto it = final_rows.find(seq);
      if (it == final_rows.end() || it->second != row) fail(fmt::format("a reader saw evaluation #{} as it never was", seq));
    }
  }

  std::printf("while tune wrote %zu evaluations and its ranking (%.1f s), queries from 3 threads; %zu rows checked "
              "against the final database:\n",
              rec.size - 40, write_s, seen_rows.rows.size());
  std::printf("%-38s %7s %8s %8s %8s %12s\n", "query", "count", "p50 ms", "p99 ms", "max ms", "sizes seen");
  for (auto [name, l] : {std::pair<const char*, Latencies*>{"attntune best --top 5 --format json", &best_bin},
                         {"attntune campaigns --format json", &campaigns_bin},
                         {"Store: open + best(5) + campaign_row", &store_api}}) {
    const double worst = l->ms.empty() ? 0 : *std::max_element(l->ms.begin(), l->ms.end());
    const std::string sizes = l == &best_bin ? "-" : std::to_string(l->evaluations_seen.size());
    std::printf("%-38s %7zu %8.2f %8.2f %8.2f %12s\n", name, l->ms.size(), percentile(l->ms, 50),
                percentile(l->ms, 99), worst, sizes.c_str());
    EXPECT_GE(l->ms.size(), 20u) << name;
    EXPECT_LT(percentile(l->ms, 99), 100.0) << name;
  }
  // The readers really ran beside the writes: they saw the campaign grow.
  EXPECT_GE(campaigns_bin.evaluations_seen.size(), 10u);
  EXPECT_GE(store_api.evaluations_seen.size(), 10u);
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace test_kills_and_readers
}  // namespace attntune::reliability
