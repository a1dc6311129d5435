// Issue 28, the output and campaign-record classes (docs/RELIABILITY.md, part 6):
//  - every command that writes a file x every hostile destination (the database itself, its
//    -wal/-shm/-journal, a symbolic link and a hard link to it, another spelling of it, a read-only
//    directory, a missing directory, a full device by RLIMIT_FSIZE, /dev/full);
//  - every command that prints x every hostile standard output (closed, a pipe whose reader is gone,
//    /dev/full, a file over the file-size limit);
//  each checked for its exit code, one line on stderr, no crash, the database's bytes unchanged and
//  no partial output left behind;
//  - SIGKILL of `tune` at random points inside the final re-timing, resumed each time: never a final
//    row without its ranking, one ranking at the end, shaped as an uninterrupted run's.
#include <gtest/gtest.h>
#include <sys/prctl.h>
#include <linux/capability.h>

#include <functional>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "tests/reliability/reliability_util.hpp"

namespace attntune::reliability {
namespace test_hostile_outputs {
namespace {

enum class StdoutKind { kFile, kClosed, kPipeGone, kDevFull, kFileOverLimit };

const char* kind_name(StdoutKind k) {
  switch (k) {
    case StdoutKind::kFile: return "file";
    case StdoutKind::kClosed: return "closed (>&-)";
    case StdoutKind::kPipeGone: return "pipe, reader gone";
    case StdoutKind::kDevFull: return "/dev/full";
    case StdoutKind::kFileOverLimit: return "file over RLIMIT_FSIZE";
  }
  return "?";
}

struct Spawn {
  std::vector<std::string> args;
  std::vector<std::pair<std::string, std::string>> env = {};
  StdoutKind out = StdoutKind::kFile;
  std::optional<rlim_t> file_size_limit = {};
  bool drop_dac = false;  // as root: no CAP_DAC_OVERRIDE, so a mode-0555 directory is read-only
};

// Runs the binary with the standard output `s.out` says; stderr (and a kFile stdout) kept.
Ran spawn(const Spawn& s, const fs::path& scratch) {
  static int counter = 0;
  const std::string tag = fmt::format("hostile{}-{}", ::getpid(), counter++);
  const std::string out_file = (scratch / (tag + ".out")).string();
  std::vector<std::string> argv{testing::attntune_bin()};
  argv.insert(argv.end(), s.args.begin(), s.args.end());
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string var = *e;
    bool replaced = false;
    for (const auto& [k, v] : s.env) replaced = replaced || var.rfind(k + "=", 0) == 0;
    if (!replaced) env.push_back(var);
  }
  for (const auto& [k, v] : s.env) env.push_back(k + "=" + v);
  std::vector<char*> argp, envp;
  for (auto& a : argv) argp.push_back(a.data());
  argp.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  int pipefd[2] = {-1, -1};
  // stderr through a pipe: a file-size limit meant for the output must not cut the error line.
  int errpipe[2];
  if (::pipe(errpipe) != 0) throw std::runtime_error("pipe failed");
  if (s.out == StdoutKind::kPipeGone) {
    if (::pipe(pipefd) != 0) throw std::runtime_error("pipe failed");
    ::close(pipefd[0]);  // the reader is gone before the first write
  }
  const auto t0 = Clock::now();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::close(errpipe[0]);
    if (::dup2(errpipe[1], 2) < 0) ::_exit(126);
    switch (s.out) {
      case StdoutKind::kFile:
      case StdoutKind::kFileOverLimit: {
        const int fo = ::open(out_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fo < 0 || ::dup2(fo, 1) < 0) ::_exit(126);
        break;
      }
      case StdoutKind::kClosed: ::close(1); break;
      case StdoutKind::kPipeGone: ::dup2(pipefd[1], 1); break;
      case StdoutKind::kDevFull: {
        const int fo = ::open("/dev/full", O_WRONLY);
        if (fo < 0 || ::dup2(fo, 1) < 0) ::_exit(126);
        break;
      }
    }
    if (s.file_size_limit) {
      ::signal(SIGXFSZ, SIG_IGN);
      const rlimit lim{*s.file_size_limit, *s.file_size_limit};
      ::setrlimit(RLIMIT_FSIZE, &lim);
    }
    if (s.drop_dac) {
      ::prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, 0, 0, 0);
      ::prctl(PR_CAPBSET_DROP, CAP_DAC_READ_SEARCH, 0, 0, 0);
    }
    ::execve(argp[0], argp.data(), envp.data());
    ::_exit(127);
  }
  if (pipefd[1] >= 0) ::close(pipefd[1]);
  ::close(errpipe[1]);
  std::string err;
  char buf[4096];
  for (ssize_t n; (n = ::read(errpipe[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    err.append(buf, static_cast<std::size_t>(n));
  }
  ::close(errpipe[0]);
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  Ran r;
  r.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = read_bytes(out_file);
  r.err = err;
  fs::remove(out_file);
  return r;
}

// Every temporary file the output writer may leave (".NAME.tmpPID.N") under `dir`.
std::vector<std::string> leftovers(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 1 && name[0] == '.' && name.find(".tmp") != std::string::npos) out.push_back(e.path().string());
  }
  return out;
}

bool one_error_line(const std::string& err) {
  return count_lines(err) == 1 && err.rfind("attntune: error: ", 0) == 0 && err.find("internal") == std::string::npos;
}

// A ranked campaign `k` (30 evaluations, the top 3 re-timed) written by `tune` from the recording.
void make_ranked_db(const Recording& rec, const std::string& db, const fs::path& scratch) {
  const Ran r = run(rec.tune(db, "k", 0, {"--budget-evals", "30", "--final-top", "3", "--final-rounds", "2"}), scratch);
  ASSERT_EQ(r.rc, 0) << r.err;
}

struct Writer {
  std::string name, db_name, ext;
  std::function<std::vector<std::string>(const std::string& db, const std::string& dest)> args;
  bool db_from_env = false;  // plan: no --db; the database in play is $ATTNTUNE_DB
};

struct Destination {
  std::string name;
  int rc;
  std::string says;  // part of the error line; "{db}" is the database's file name
  // Makes the destination in `dir` for database `db` (ext: the writer's), returns its path.
  std::function<std::string(const fs::path& dir, const std::string& db, const std::string& ext)> make;
  bool fresh = true;  // the destination did not exist before: it must not exist after either
  std::optional<rlim_t> limit = {};
  bool drop_dac = false;
};

TEST(ReliabilityHostileOutputs, EveryFileWriterTimesEveryHostileDestinationRefusesCleanly) {
  TempDir dir;
  const Recording rec(dir);
  const std::string model = source_dir() + "/tests/data/models/llama3_8b.json";
  const std::vector<Writer> writers = {
      {"export -o", "work.db", ".cu",
       [](const std::string& db, const std::string& d) {
         return std::vector<std::string>{"export", "--db", db, "--campaign", "k", "-o", d};
       }},
      {"report --plot", "work.svg", ".svg",
       [](const std::string& db, const std::string& d) {
         return std::vector<std::string>{"report", "--db", db, "--campaign", "k", "--plot", d};
       }},
      {"plan -o", "work.yaml", ".yaml",
       [model](const std::string&, const std::string& d) {
         return std::vector<std::string>{"plan", "--model", model, "-o", d};
       },
       true},
      {"merge -o", "work.db", ".db",
       [](const std::string& db, const std::string& d) {
         return std::vector<std::string>{"merge", db, "-o", d};
       }},
  };
  const bool root = ::geteuid() == 0;
  const std::vector<Destination> destinations = {
      {"the database", 2, "{db}", [](const fs::path&, const std::string& db, const std::string&) { return db; }, false},
      {"its -wal", 2, "{db}", [](const fs::path&, const std::string& db, const std::string&) { return db + "-wal"; }},
      {"its -shm", 2, "{db}", [](const fs::path&, const std::string& db, const std::string&) { return db + "-shm"; }},
      {"its -journal", 2, "{db}",
       [](const fs::path&, const std::string& db, const std::string&) { return db + "-journal"; }},
      {"a symlink to it", 2, "{db}",
       [](const fs::path& d, const std::string& db, const std::string& ext) {
         const fs::path p = d / ("alias" + ext);
         fs::remove(p);
         fs::create_symlink(db, p);
         return p.string();
       },
       false},
      {"a hard link to it", 2, "",
       [](const fs::path& d, const std::string& db, const std::string& ext) {
         const fs::path p = d / ("hard" + ext);
         fs::remove(p);
         fs::create_hard_link(db, p);
         return p.string();
       },
       false},
      {"another spelling of it", 2, "{db}",
       [](const fs::path& d, const std::string& db, const std::string&) {
         fs::create_directories(d / "sub");
         return (d / "sub" / ".." / "." / fs::path(db).filename()).string();
       },
       false},
      {"a read-only directory", 2, "",
       [](const fs::path& d, const std::string&, const std::string& ext) {
         fs::create_directories(d / "ro");
         fs::permissions(d / "ro", fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                                       fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
         return (d / "ro" / ("out" + ext)).string();
       },
       true, std::nullopt, root},
      {"a missing directory", 2, "does not exist",
       [](const fs::path& d, const std::string&, const std::string& ext) {
         return (d / "missing" / ("out" + ext)).string();
       }},
      {"a full device (RLIMIT_FSIZE)", 3, "no space left",
       [](const fs::path& d, const std::string&, const std::string& ext) { return (d / ("full" + ext)).string(); },
       true, rlim_t{64}},
      {"/dev/full (through a symlink)", 3, "no space left",
       [](const fs::path& d, const std::string&, const std::string& ext) {
         const fs::path p = d / ("devfull" + ext);
         fs::remove(p);
         fs::create_symlink("/dev/full", p);
         return p.string();
       },
       false},
  };

  int cases = 0, passed = 0;
  std::map<int, int> by_rc;
  double total_ms = 0;
  fmt::print("\n| writer | destination | exit | stderr |\n|---|---|---|---|\n");
  for (const Writer& w : writers) {
    const fs::path wdir = dir.path() / ("w" + std::to_string(&w - writers.data()));
    fs::create_directories(wdir);
    const std::string db = (wdir / w.db_name).string();
    make_ranked_db(rec, db, dir.path());
    // Control: a good destination is written.
    {
      Spawn s{w.args(db, (wdir / ("good" + w.ext)).string())};
      if (w.db_from_env) s.env = {{"ATTNTUNE_DB", db}};
      const Ran r = spawn(s, dir.path());
      EXPECT_EQ(r.rc, 0) << w.name << ": " << r.err;
      EXPECT_TRUE(fs::exists(wdir / ("good" + w.ext))) << w.name;
    }
    for (const Destination& d : destinations) {
      if (w.name == "merge -o" && d.name.rfind("/dev/full", 0) == 0) continue;  // a database, not a stream
      if (d.drop_dac && !root) {
        // Not root: the mode alone makes the directory read-only.
      }
      const std::string dest = d.make(wdir, db, w.ext);
      const std::string before = read_bytes(db);
      Spawn s{w.args(db, dest)};
      if (w.db_from_env) s.env = {{"ATTNTUNE_DB", db}};
      s.file_size_limit = d.limit;
      s.drop_dac = d.drop_dac;
      const Ran r = spawn(s, dir.path());
      ++cases;
      ++by_rc[r.rc];
      total_ms += r.ms;
      std::string says = d.says;
      if (says == "{db}") says = w.db_name;
      const std::string line = r.err.empty() ? "" : r.err.substr(0, r.err.find('\n'));
      // merge prints progress before it writes: its error is the last line.
      const std::string last = r.err.empty() ? "" : testing::lines(r.err).back();
      const bool lines_ok = w.name == "merge -o" ? (last.rfind("attntune: error: ", 0) == 0 &&
                                                    last.find("internal") == std::string::npos)
                                                 : one_error_line(r.err);
      EXPECT_EQ(r.rc, d.rc) << w.name << " -> " << d.name << ": " << r.err;
      EXPECT_TRUE(lines_ok) << w.name << " -> " << d.name << ": " << r.err;
      EXPECT_NE(last.find(says), std::string::npos) << w.name << " -> " << d.name << ": " << r.err;
      EXPECT_EQ(read_bytes(db), before) << w.name << " -> " << d.name << ": the database changed";
      if (d.fresh) {
        EXPECT_FALSE(fs::exists(dest)) << w.name << " -> " << d.name << ": left " << dest;
      }
      EXPECT_EQ(leftovers(wdir), std::vector<std::string>{}) << w.name << " -> " << d.name;
      EXPECT_EQ(integrity_check(db), "ok");
      const bool ok = r.rc == d.rc && lines_ok && last.find(says) != std::string::npos;
      passed += ok;
      fmt::print("| {} | {} | {} | `{}` |\n", w.name, d.name, r.rc,
                 last.substr(0, std::min<std::size_t>(last.size(), 150)));
      std::error_code ec;
      fs::permissions(wdir / "ro", fs::perms::owner_all, fs::perm_options::add, ec);
      fs::remove_all(wdir / "ro", ec);
      if (d.fresh) fs::remove(dest, ec);
    }
  }
  fmt::print("file writers: {} cases, {} as expected; exit codes:", cases, passed);
  for (const auto& [rc, n] : by_rc) fmt::print(" {}x{}", n, rc);
  fmt::print("; {:.0f} ms in all\n", total_ms);
}

TEST(ReliabilityHostileOutputs, EveryCommandTimesEveryHostileStandardOutputExitsThreeWithOneLine) {
  TempDir dir;
  const Recording rec(dir);
  const std::string db = dir.file("work.db");
  make_ranked_db(rec, db, dir.path());
  const std::string model = source_dir() + "/tests/data/models/llama3_8b.json";
  const std::vector<std::vector<std::string>> commands = {
      {"--version"},
      {"--help"},
      {"best", "--db", db},
      {"best", "--db", db, "--format", "json"},
      {"best", "--db", db, "--format", "csv", "--top", "20"},
      {"campaigns", "--db", db},
      {"campaigns", "--db", db, "--format", "json"},
      {"report", "--db", db, "--campaign", "k"},
      {"report", "--db", db, "--campaign", "k", "--format", "json"},
      {"report", "--db", db, "--campaign", "k", "--format", "csv"},
      {"export", "--db", db, "--campaign", "k", "-o", "-"},
      {"status", "--db", db},
      {"space", "--space", rec.space, "--problem", rec.problem, "--count"},
      {"space", "--space", rec.space, "--problem", rec.problem, "--list"},
      {"plan", "--model", model, "--seqlen", "2048", "--context", "4096"},
      {"plan", "--model", model, "--seqlen", "2048", "--context", "4096", "--format", "json"},
  };
  const std::vector<StdoutKind> kinds = {StdoutKind::kClosed, StdoutKind::kPipeGone, StdoutKind::kDevFull,
                                         StdoutKind::kFileOverLimit};
  int cases = 0, passed = 0;
  fmt::print("\n| command | stdout | exit | stderr |\n|---|---|---|---|\n");
  for (const auto& cmd : commands) {
    const Ran good = spawn(Spawn{cmd}, dir.path());
    ASSERT_EQ(good.rc, 0) << fmt::format("{}", fmt::join(cmd, " ")) << ": " << good.err;
    ASSERT_FALSE(good.out.empty());
    for (StdoutKind k : kinds) {
      const std::string before = read_bytes(db);
      Spawn s{cmd};
      s.out = k;
      if (k == StdoutKind::kFileOverLimit) s.file_size_limit = 1;
      const Ran r = spawn(s, dir.path());
      ++cases;
      const std::string what = fmt::format("{} with stdout {}", fmt::join(cmd, " "), kind_name(k));
      const bool ok = r.rc == 3 && one_error_line(r.err) &&
                      r.err.find("cannot write to standard output") != std::string::npos;
      EXPECT_TRUE(ok) << what << ": exit " << r.rc << ": " << r.err;
      EXPECT_EQ(read_bytes(db), before) << what << ": the database changed";
      passed += ok;
      fmt::print("| {} | {} | {} | `{}` |\n", fmt::join(cmd.begin(), cmd.begin() + std::min<std::size_t>(cmd.size(), 2), " "),
                 kind_name(k), r.rc, r.err.substr(0, r.err.find('\n')));
    }
  }
  EXPECT_EQ(integrity_check(db), "ok");
  fmt::print("standard output: {} cases, {} as expected\n", cases, passed);
}

// Final rows no ranking covers (what a kill inside the re-timing used to leave), and rankings.
struct FinalState {
  std::int64_t search = 0, finals = 0, partial = 0, ranked = 0;
  std::vector<std::string> ranking;  // config_key by rank
  std::vector<std::int64_t> rounds;
};

FinalState final_state(const std::string& db) {
  FinalState f;
  if (!fs::exists(db)) return f;
  sqlite::Connection c = sqlite::Connection::open(db, SQLITE_OPEN_READWRITE);
  c.set_busy_timeout(std::chrono::seconds(5));
  sqlite::Statement n(c,
                      "SELECT (SELECT count(*) FROM evaluations WHERE phase = 'search'), "
                      "(SELECT count(*) FROM evaluations WHERE phase = 'final'), "
                      "(SELECT count(*) FROM evaluations e WHERE phase = 'final' AND evaluated_at > "
                      "IFNULL((SELECT MAX(ranked_at) FROM rankings r WHERE r.campaign_id = e.campaign_id), '')), "
                      "(SELECT count(*) FROM rankings)");
  n.step();
  f.search = n.int64(0);
  f.finals = n.int64(1);
  f.partial = n.int64(2);
  f.ranked = n.int64(3);
  sqlite::Statement r(c, "SELECT k.config_key, r.rounds FROM rankings r JOIN candidates k ON k.id = r.candidate_id "
                         "ORDER BY r.rank");
  while (r.step()) {
    f.ranking.push_back(r.text(0));
    f.rounds.push_back(r.int64(1));
  }
  return f;
}

TEST(ReliabilityFinalKills, SigkillsInsideTheFinalRetimingLeaveNoPartialFinalsAndOneRanking) {
  TempDir dir;
  const Recording rec(dir);
  const int top = 5, rounds = 4, delay_ms = 15, kills = 12;
  const std::vector<std::string> more = {"--budget-evals", "20", "--final-top", std::to_string(top),
                                         "--final-rounds", std::to_string(rounds)};
  // Uninterrupted.
  const std::string clean = dir.file("clean.db");
  const Ran u = run(rec.tune(clean, "k", delay_ms, more), dir.path());
  ASSERT_EQ(u.rc, 0) << u.err;
  const FinalState want = final_state(clean);
  ASSERT_EQ(want.ranked, top);
  // The screening (one re-timing of each of the search's fastest, up to 24: default --final-screen)
  // stores only its failures (none here), written with the ranking.
  ASSERT_EQ(want.finals, top * rounds);
  ASSERT_EQ(want.partial, 0);

  // Killed: each run is killed at a random point after "screening the top" appears (the window is
  // about (screened + top * rounds) * delay), then resumed; the last run goes uninterrupted.
  const int window = (20 + top * rounds) * delay_ms;
  const std::string db = dir.file("killed.db");
  std::mt19937 rng(28);
  std::uniform_int_distribution<int> when(0, window);
  int landed_inside = 0, landed_after = 0, resumed_retimings = 0;
  std::vector<std::int64_t> partial_after_kill;
  const auto t0 = Clock::now();
  for (int i = 0; i < kills; ++i) {
    const std::string err_file = dir.file(fmt::format("kill{}.err", i));
    ProcOptions o;
    o.err_file = err_file;
    Proc p(rec.tune(db, "k", delay_ms, more), o);
    bool in_final = false;
    for (int waited = 0; waited < 20000 && !p.done(); waited += 2) {
      if (read_bytes(err_file).find("screening the top") != std::string::npos) {
        in_final = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (in_final) {
      ++resumed_retimings;
      std::this_thread::sleep_for(std::chrono::milliseconds(when(rng)));
    }
    const bool ended_before = p.done();
    p.signal(SIGKILL);
    p.wait();
    if (!ended_before && in_final) {
      const FinalState s = final_state(db);
      (s.ranked ? landed_after : landed_inside) += 1;
    }
    const FinalState s = final_state(db);
    partial_after_kill.push_back(s.partial);
    EXPECT_EQ(s.partial, 0) << "kill " << i;
    EXPECT_TRUE(s.ranked == 0 || s.ranked == top) << "kill " << i << ": " << s.ranked << " ranked";
    EXPECT_EQ(s.finals, s.ranked ? want.finals : 0) << "kill " << i;
    EXPECT_EQ(integrity_check(db), "ok");
    if (s.ranked) break;  // the re-timing committed before this kill: nothing left to kill inside
  }
  const Ran last = run(rec.tune(db, "k", delay_ms, more), dir.path());
  ASSERT_EQ(last.rc, 0) << last.err;
  const double total_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const FinalState got = final_state(db);
  EXPECT_EQ(got.partial, 0);
  EXPECT_EQ(got.finals, want.finals);
  EXPECT_EQ(got.ranked, top);
  EXPECT_EQ(got.search, want.search);
  EXPECT_EQ(got.ranking, want.ranking);
  EXPECT_EQ(got.rounds, want.rounds);
  EXPECT_EQ(integrity_check(db), "ok");
  fmt::print("\nfinal-re-timing kills: {} runs reached the re-timing and were killed, {} inside it (no ranking yet), {} "
             "after its commit; partial final rows after each kill: {}; at the end {} search rows, {} final rows, {} "
             "ranked (uninterrupted: {}, {}, {}); same ranking: {}; {:.1f} s in all\n",
             resumed_retimings, landed_inside, landed_after, fmt::join(partial_after_kill, ","), got.search,
             got.finals, got.ranked, want.search, want.finals, want.ranked, got.ranking == want.ranking ? "yes" : "no",
             total_s);
}

TEST(ReliabilityFinalKills, AResumeWithOtherBudgetsKeepsEachRunsBudgets) {
  TempDir dir;
  const Recording rec(dir);
  const std::string db = dir.file("runs.db");
  ASSERT_EQ(run(rec.tune(db, "k", 0, {"--budget-evals", "10", "--final-top", "2"}), dir.path()).rc, 0);
  ASSERT_EQ(run(rec.tune(db, "k", 0, {"--budget-evals", "25", "--budget-time", "45m", "--final-top", "2"}), dir.path()).rc,
            0);
  Store s = Store::open(db, Store::Mode::kReadOnly);
  const auto id = s.find_campaign("k");
  ASSERT_TRUE(id);
  const std::vector<CampaignRunRow> runs = s.campaign_runs(*id);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].budget_evals, 10);
  EXPECT_EQ(runs[0].budget_seconds, 0);
  EXPECT_EQ(runs[1].budget_evals, 25);
  EXPECT_EQ(runs[1].budget_seconds, 45 * 60);
  EXPECT_EQ(runs[0].status, "completed");
  EXPECT_FALSE(runs[0].ended_at.empty());
  const Ran report = run({"report", "--db", db, "--campaign", "k", "--format", "json"}, dir.path());
  ASSERT_EQ(report.rc, 0) << report.err;
  const auto j = nlohmann::json::parse(report.out);
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_EQ(j["runs"][0]["budget_evals"], 10);
  EXPECT_EQ(j["runs"][1]["budget_evals"], 25);
}

}  // namespace
}  // namespace test_hostile_outputs
}  // namespace attntune::reliability
