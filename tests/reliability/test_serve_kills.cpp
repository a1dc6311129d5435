// Reliability, part 10b (docs/RELIABILITY.md, "Faults injected at every step"; issue 46): SIGKILL
// and SIGTERM of `serve`'s supervisor and of its worker at each phase of a campaign's life: while
// the worker claims it, opens it, evaluates, commits an evaluation, re-times the finalists, commits
// the ranking, and releases it; the supervisor as it starts, mid-campaign, during a re-timing, and
// while it drains. The store's test hook (db/test_hook.hpp) holds the named transaction open so the
// signal lands inside it; the other phases are found from the log and the database.
//
// After each signal: the process is let end (a worker killed is restarted by the supervisor; the
// workers of a killed supervisor finish on their own: this process is their subreaper), then the
// next `serve` runs the queue to the end. Then: every campaign done with exactly its budget of
// search evaluations, none written twice, its final rows those of its ranking, no lease left,
// every row committed before the signal still there unchanged, and SQLite's integrity check ok.
#include <gtest/gtest.h>
#include <sys/prctl.h>

#include <random>
#include <regex>

#include "fault_util.hpp"

namespace attntune::reliability {
namespace test_serve_kills {
namespace {

using namespace std::chrono_literals;

constexpr int kBudget = 12;
constexpr int kHoldMs = 300;

std::int64_t count_evaluations(const std::string& db) {
  if (!fs::exists(db)) return 0;
  try {
    sqlite::Connection c = sqlite::Connection::open(db, SQLITE_OPEN_READONLY);
    c.set_busy_timeout(std::chrono::seconds(1));
    sqlite::Statement st(c, "SELECT count(*) FROM evaluations");
    return st.step() ? st.int64(0) : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

// The pid in the last line of `log` that contains `mark`: "... (pid N)" of a hook line, or
// "worker N on" of a worker's first line.
pid_t pid_in(const std::string& log, const std::string& mark) {
  const std::size_t at = log.rfind(mark);
  if (at == std::string::npos) return 0;
  const std::string line = log.substr(at, log.find('\n', at) - at);
  std::smatch m;
  if (std::regex_search(line, m, std::regex(R"(\(pid (\d+)\))")) || std::regex_search(line, m, std::regex(R"(worker (\d+) on)")))
    return static_cast<pid_t>(std::stol(m[1]));
  return 0;
}

std::vector<pid_t> worker_pids(const std::string& log) {
  std::vector<pid_t> out;
  const std::regex re(R"(worker (\d+) on .* ready)");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back(static_cast<pid_t>(std::stol((*it)[1])));
  return out;
}

bool alive(pid_t pid) { return pid > 0 && ::kill(pid, 0) == 0; }

// Waits for a process this one is the subreaper of (or the parent of); true if it ended in time.
bool reap(pid_t pid, std::chrono::seconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    int st = 0;
    const pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD && !alive(pid))) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

struct Phase {
  std::string name;
  bool parent;        // signal the supervisor, else the worker
  std::string hold;   // ATTNTUNE_TEST_HOLD, "" for none
  // Waits (polling the log and the database) until the phase is reached; returns the pid to signal
  // (the worker's or the supervisor's), 0 if the run ended first.
  std::function<pid_t(Proc& serve, pid_t serve_pid, const std::string& log, const std::string& db, std::mt19937& rng)> reach;
};

// Polls until `ready` says so, serve ended, or a minute passed.
template <class F>
bool wait_until(Proc& serve, F ready) {
  const auto deadline = Clock::now() + 60s;
  while (Clock::now() < deadline) {
    if (ready()) return true;
    if (serve.done()) return false;
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

std::vector<Phase> phases() {
  const auto at_hook = [](std::string mark) {
    return [mark](Proc& serve, pid_t, const std::string& log, const std::string&, std::mt19937&) -> pid_t {
      if (!wait_until(serve, [&] { return read_bytes(log).find(mark) != std::string::npos; })) return 0;
      return pid_in(read_bytes(log), mark);
    };
  };
  const auto evaluating = [](Proc& serve, pid_t, const std::string& log, const std::string& db, std::mt19937& rng) -> pid_t {
    if (!wait_until(serve, [&] { return count_evaluations(db) >= 4; })) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 30)(rng)));
    const std::vector<pid_t> w = worker_pids(read_bytes(log));
    return w.empty() ? 0 : w.back();
  };
  const auto retiming = [](Proc& serve, pid_t, const std::string& log, const std::string&, std::mt19937& rng) -> pid_t {
    if (!wait_until(serve, [&] { return read_bytes(log).find("re-timing the top") != std::string::npos; })) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 20)(rng)));
    const std::vector<pid_t> w = worker_pids(read_bytes(log));
    return w.empty() ? 0 : w.back();
  };
  const auto parent = [](auto inner) {
    return [inner](Proc& serve, pid_t serve_pid, const std::string& log, const std::string& db, std::mt19937& rng) -> pid_t {
      return inner(serve, serve_pid, log, db, rng) ? serve_pid : 0;
    };
  };
  return {
      {"worker: claiming a campaign", false, "claim", at_hook("test hook: claim of campaign")},
      {"worker: opening it", false, "open", at_hook("test hook: open of campaign")},
      {"worker: evaluating", false, "", evaluating},
      {"worker: committing an evaluation", false, "evaluation", at_hook("test hook: evaluation ")},
      {"worker: re-timing the finalists", false, "", retiming},
      {"worker: committing the ranking", false, "final", at_hook("test hook: evaluation ")},
      {"worker: releasing the campaign", false, "release", at_hook("test hook: release of campaign")},
      {"supervisor: starting", true, "",
       [](Proc& serve, pid_t serve_pid, const std::string&, const std::string&, std::mt19937& rng) -> pid_t {
         std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 40)(rng)));
         return serve.done() ? 0 : serve_pid;
       }},
      {"supervisor: mid-campaign", true, "", parent(evaluating)},
      {"supervisor: a worker re-timing", true, "", parent(retiming)},
      {"supervisor: a worker committing", true, "evaluation", parent(at_hook("test hook: evaluation "))},
  };
}

TEST(ReliabilityServeKills, SigkillAndSigtermOfServeAndItsWorkerAtEveryPhaseLoseAndDuplicateNothing) {
  // Workers whose supervisor is killed become this process's children, to be waited for.
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  TempDir dir;
  std::mt19937 rng(4646);
  const std::vector<std::string> problems = {service_problem(0), service_problem(1)};
  const std::string template_db = dir.file("queued.db");
  ASSERT_EQ(run(submit_args(template_db, problems, kBudget), dir.path()).rc, 0);

  struct Row {
    std::string phase, signal, outcome;
    std::int64_t committed_at_signal = 0, lost = 0, twice = 0;
    bool integrity = true, completed = true;
  };
  std::vector<Row> rows;
  int serial = 0;
  const auto t0 = Clock::now();
  for (const Phase& phase : phases()) {
    for (const int sig : {SIGKILL, SIGTERM}) {
      SCOPED_TRACE(phase.name + (sig == SIGKILL ? " SIGKILL" : " SIGTERM"));
      const std::string db = dir.file(fmt::format("q{}.db", serial)), log = dir.file(fmt::format("serve{}.log", serial));
      ++serial;
      fs::copy_file(template_db, db);
      Row row{phase.name, sig == SIGKILL ? "SIGKILL" : "SIGTERM", "", 0, 0, 0, true, true};
      ProcOptions o;
      o.err_file = log;
      if (!phase.hold.empty())
        o.env = {{"ATTNTUNE_TEST_COMMIT_DELAY_MS", std::to_string(kHoldMs)}, {"ATTNTUNE_TEST_HOLD", phase.hold}};
      Committed at_signal;
      std::vector<pid_t> workers;
      {
        Proc serve(serve_args(db, "0", 20), o);
        const pid_t target = phase.reach(serve, serve.pid(), log, db, rng);
        ASSERT_NE(target, 0) << "the phase was not reached; serve said:\n" << read_bytes(log);
        ::kill(target, sig);
        if (sig == SIGKILL) {
          // What was committed when it died (read beside whatever goes on running).
          std::this_thread::sleep_for(20ms);
          at_signal = all_committed(db);
        }
        // Let it end: the supervisor exits (restarting a killed worker first, or draining).
        const int rc = serve.wait();
        workers = worker_pids(read_bytes(log));
        for (pid_t w : workers) EXPECT_TRUE(reap(w, 60s)) << "worker " << w << " did not end";
        row.outcome = fmt::format("serve exit {}", rc);
        if (sig == SIGTERM) at_signal = all_committed(db);  // a drain commits what was in flight
        row.committed_at_signal = static_cast<std::int64_t>(at_signal.size());
      }
      // The next run finishes the queue.
      const Ran next = run(serve_args(db, "0", 0), dir.path());
      EXPECT_EQ(next.rc, 0) << next.err;
      // Every campaign done with its budget, nothing twice, nothing lost, no lease, integrity.
      {
        sqlite::Connection c = sqlite::Connection::open(db, SQLITE_OPEN_READWRITE);
        sqlite::Statement jobs(c,
                               "SELECT q.campaign, q.state, (SELECT count(*) FROM evaluations e JOIN campaigns k ON "
                               "k.id = e.campaign_id WHERE k.name = q.campaign AND e.phase = 'search') FROM queue q");
        int done = 0;
        while (jobs.step()) {
          const bool ok = jobs.text(1) == "done" && jobs.int64(2) == kBudget;
          done += ok;
          EXPECT_TRUE(ok) << jobs.text(0) << ": " << jobs.text(1) << " with " << jobs.int64(2) << " evaluations";
        }
        row.completed = done == static_cast<int>(problems.size());
        sqlite::Statement leases(c, "SELECT count(*) FROM leases");
        leases.step();
        EXPECT_EQ(leases.int64(0), 0) << "a lease outlived serve";
      }
      row.twice = written_twice(db);
      EXPECT_EQ(row.twice, 0);
      row.lost = static_cast<std::int64_t>(lost_rows(at_signal, all_committed(db)).size());
      EXPECT_EQ(row.lost, 0);
      const std::string ic = integrity_check(db);
      row.integrity = ic == "ok";
      EXPECT_EQ(ic, "ok");
      rows.push_back(row);
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("\n%-36s %-8s %-13s %10s %5s %6s %9s %9s\n", "phase", "signal", "outcome", "committed", "lost", "twice",
              "integrity", "completed");
  for (const Row& r : rows)
    std::printf("%-36s %-8s %-13s %10lld %5lld %6lld %9s %9s\n", r.phase.c_str(), r.signal.c_str(), r.outcome.c_str(),
                static_cast<long long>(r.committed_at_signal), static_cast<long long>(r.lost),
                static_cast<long long>(r.twice), r.integrity ? "ok" : "FAILED", r.completed ? "yes" : "NO");
  std::printf("%zu signals in %.1f s\n", rows.size(), seconds);
}

}  // namespace
}  // namespace test_serve_kills
}  // namespace attntune::reliability
