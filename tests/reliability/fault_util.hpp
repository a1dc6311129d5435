// Helpers of the second reliability round (issue 46; docs/RELIABILITY.md parts 8-11): a real
// database with every table filled (campaigns from the recording, a queue run by `serve
// --simulate`, builds), what a database holds once the clocks are set aside, whole-tree snapshots.
#pragma once
#include <random>

#include "reliability_util.hpp"

namespace attntune::reliability {

// Every file and directory under `dir` with the contents of files: "unchanged" is equality.
inline std::map<std::string, std::string> tree(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string rel = fs::relative(e.path(), dir).string();
    if (e.is_directory())
      out[rel + "/"] = "";
    else if (e.is_regular_file())
      out[rel] = read_bytes(e.path().string());
  }
  return out;
}

// Every evaluation committed, by (campaign, sequence number): what must never change or vanish.
using Committed = std::map<std::pair<std::string, std::int64_t>, CommittedRow>;
inline Committed all_committed(const std::string& db) {
  Committed out;
  if (!fs::exists(db)) return out;
  sqlite::Connection c = sqlite::Connection::open(db, SQLITE_OPEN_READWRITE);
  c.set_busy_timeout(std::chrono::seconds(5));
  sqlite::Statement st(c,
                       "SELECT c.name, e.seq, e.phase, k.config_key, e.status, e.median_us FROM evaluations e "
                       "JOIN candidates k ON k.id = e.candidate_id JOIN campaigns c ON c.id = e.campaign_id");
  while (st.step()) out[{st.text(0), st.int64(1)}] = {st.text(2), st.text(3), st.text(4), st.opt_real(5)};
  return out;
}

// The rows of `before` missing from `after` or changed in it.
inline std::vector<std::string> lost_rows(const Committed& before, const Committed& after) {
  std::vector<std::string> out;
  for (const auto& [key, row] : before) {
    const auto it = after.find(key);
    if (it == after.end() || !(it->second == row)) out.push_back(fmt::format("{} #{}", key.first, key.second));
  }
  return out;
}

// What a database holds, clocks aside: each campaign's evaluations and ranking, the queue, and how
// many rows the other tables have (campaign_runs aside: a run that failed is recorded too). Two runs that recorded the same results give the same text.
inline std::string content(const std::string& db) {
  sqlite::Connection c = sqlite::Connection::open(db, SQLITE_OPEN_READONLY);
  std::string out;
  // Eight columns a row.
  const auto dump = [&](const std::string& sql) {
    sqlite::Statement st(c, sql);
    while (st.step()) {
      for (int i = 0; i < 8; ++i) out += (st.is_null(i) ? std::string("NULL") : st.text(i)) + "|";
      out += "\n";
    }
  };
  dump("SELECT c.name, c.status, e.seq, e.phase, k.config_key, e.status, e.median_us, e.tflops FROM evaluations e "
       "JOIN campaigns c ON c.id = e.campaign_id JOIN candidates k ON k.id = e.candidate_id ORDER BY c.name, e.seq");
  dump("SELECT c.name, r.rank, k.config_key, r.median_us, r.rounds, d.name, '', '' FROM rankings r JOIN campaigns c ON "
       "c.id = r.campaign_id JOIN candidates k ON k.id = r.candidate_id JOIN devices d ON d.id = r.device_id ORDER BY "
       "c.name, r.rank");
  dump("SELECT campaign, state, plan, regime, '', '', '', '' FROM queue ORDER BY campaign");
  dump("SELECT (SELECT count(*) FROM devices), (SELECT count(*) FROM candidates), (SELECT count(*) FROM builds), "
       "(SELECT count(*) FROM campaigns), (SELECT count(*) FROM campaign_spaces), (SELECT count(*) FROM gpus), "
       "(SELECT count(*) FROM leases), ''");
  return out;
}

// Evaluations written twice: a config evaluated again by the search of one campaign, a search
// sequence number missing or repeated, or ok final re-timing rows other than those its ranking
// counts (one per finalist and round; a finalist that failed its re-timing is dropped from the
// ranking and its row is not ok). 0 in a sound database.
inline std::int64_t written_twice(const std::string& db) {
  if (!fs::exists(db)) return 0;
  sqlite::Connection c = sqlite::Connection::open(db, SQLITE_OPEN_READONLY);
  sqlite::Statement st(c,
                       "SELECT (SELECT count(*) - count(DISTINCT campaign_id || ':' || candidate_id) FROM evaluations "
                       "WHERE phase = 'search') + (SELECT count(*) FROM (SELECT campaign_id FROM evaluations WHERE "
                       "phase = 'search' GROUP BY campaign_id HAVING count(*) <> max(seq) OR count(DISTINCT seq) <> "
                       "count(*))) + (SELECT count(*) FROM (SELECT e.campaign_id FROM evaluations e WHERE e.phase = "
                       "'final' AND e.status = 'ok' GROUP BY e.campaign_id HAVING count(*) <> (SELECT IFNULL(sum(r.rounds), 0) FROM rankings r "
                       "WHERE r.campaign_id = e.campaign_id)))");
  return st.step() ? st.int64(0) : -1;
}

// The tuning service's commands against a database, with small budgets and no delays.
inline std::vector<std::string> submit_args(const std::string& db, const std::vector<std::string>& problems,
                                            int budget) {
  std::vector<std::string> a = {"submit", "--db", db, "--budget-evals", std::to_string(budget), "--patience", "1000",
                                "--final-top", "2", "--final-rounds", "1"};
  for (const std::string& p : problems) a.insert(a.end(), {"--problem", p});
  return a;
}
inline std::vector<std::string> serve_args(const std::string& db, const std::string& gpus, int delay_ms) {
  return {"serve", "--db", db, "--simulate", "--gpus", gpus, "--simulate-delay-ms", std::to_string(delay_ms),
          "--lease-seconds", "5", "--log-interval", "1"};
}

// Small dense problems the two prefill templates serve (the synthetic runner answers for them).
inline std::string service_problem(int i) {
  return fmt::format("b={},h={},s={},d=64,dtype=bf16,causal={}", 1 + i % 3, 8 << (i / 6 % 3), 256 << (i % 3), i % 2);
}

// A real database with every table written by the commands that write it: campaign `k` (40
// evaluations from the recording, ranked), `k2` (25, random order, ranked), two campaigns queued
// and run to the end by `serve --simulate` (queue, leases, gpus), a third one queued, and build-cache
// rows whose cubins span overflow pages. Returns "" or what failed.
inline std::string make_full_database(const Recording& rec, const std::string& db, const fs::path& scratch) {
  const auto must = [&](const std::vector<std::string>& args) -> std::string {
    const Ran r = run(args, scratch);
    return r.rc == 0 ? "" : fmt::format("{} -> exit {}: {}", fmt::join(args, " "), r.rc, r.err);
  };
  std::string failed =
      must(rec.tune(db, "k", 0, {"--budget-evals", "40", "--final-top", "3", "--final-rounds", "1"}));
  if (failed.empty()) {
    std::vector<std::string> a = rec.tune(db, "k2", 0, {"--budget-evals", "25", "--seed", "5", "--final-top", "2",
                                                        "--final-rounds", "1"});
    a[std::find(a.begin(), a.end(), "--strategy") - a.begin() + 1] = "random";
    failed = must(a);
  }
  if (failed.empty()) failed = must(submit_args(db, {service_problem(0), service_problem(1)}, 10));
  if (failed.empty()) failed = must(serve_args(db, "0", 0));
  if (failed.empty()) failed = must(submit_args(db, {service_problem(2)}, 8));
  if (!failed.empty()) return failed;
  Store store = Store::open(db, Store::Mode::kExisting);
  std::mt19937 rng(46);
  for (int i = 0; i < 4; ++i) {
    BuildRecord b;
    b.status = "ok";
    b.cubin.resize(12000 + 3000 * static_cast<std::size_t>(i));
    for (char& c : b.cubin) c = static_cast<char>(rng());
    b.log = fmt::format("ptxas info    : Used {} registers", 96 + 8 * i);
    b.registers = 96 + 8 * i;
    store.put_build({fmt::format("{:064x}", i + 1), "sm_90", "13.0", "-arch=sm_90 -O3"}, b);
  }
  return "";
}

}  // namespace attntune::reliability
