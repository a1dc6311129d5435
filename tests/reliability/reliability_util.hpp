// Helpers of the reliability suite (tests/reliability/, docs/RELIABILITY.md): the attntune binary as
// a child process (environment, a file-size limit, stdout and stderr kept, wall time measured), a
// real recorded campaign to simulate `tune` from, whole-directory snapshots and digests, SQLite's
// integrity check, percentiles.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <sqlite3.h>

#include "core/hash.hpp"
#include "db/sqlite.hpp"
#include "db/store.hpp"
#include "search/recorded.hpp"
#include "tests/common/run_attntune.hpp"
#include "tests/unit/db/db_test_util.hpp"

namespace attntune::reliability {

namespace fs = std::filesystem;
using test::read_bytes;
using test::snapshot;
using test::TempDir;
using test::write_bytes;
using Clock = std::chrono::steady_clock;

using attntune::testing::source_dir;

// ---- The binary as a child ------------------------------------------------------------------------

struct ProcOptions {
  std::vector<std::pair<std::string, std::string>> env;  // set in the child only
  std::optional<rlim_t> file_size_limit;                 // RLIMIT_FSIZE, with SIGXFSZ ignored
  std::string out_file, err_file;                        // "" : /dev/null; appended to
  std::optional<double> time_limit_s;                    // run(): SIGKILL past this wall time (Ran::timed_out)
};

// `attntune ARGS...` (no shell) in its own process; the destructor kills and reaps it if it runs.
class Proc {
 public:
  Proc(const std::vector<std::string>& args, const ProcOptions& o) {
    // Everything the child needs is built before fork: readers run in threads, and after a fork
    // only async-signal-safe calls are allowed (no allocation).
    std::vector<std::string> argv{testing::attntune_bin()};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      const std::string var = *e;
      bool replaced = false;
      for (const auto& [k, v] : o.env) replaced = replaced || var.rfind(k + "=", 0) == 0;
      if (!replaced) env.push_back(var);
    }
    for (const auto& [k, v] : o.env) env.push_back(k + "=" + v);
    std::vector<char*> argp, envp;
    for (auto& a : argv) argp.push_back(a.data());
    argp.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const std::string out = o.out_file.empty() ? "/dev/null" : o.out_file;
    const std::string err = o.err_file.empty() ? "/dev/null" : o.err_file;
    started_ = Clock::now();
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      const int fo = ::open(out.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      const int fe = ::open(err.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fo < 0 || fe < 0 || ::dup2(fo, 1) < 0 || ::dup2(fe, 2) < 0) ::_exit(126);
      if (o.file_size_limit) {
        ::signal(SIGXFSZ, SIG_IGN);  // an ignored signal stays ignored across exec: writes fail with EFBIG
        const rlimit lim{*o.file_size_limit, *o.file_size_limit};
        ::setrlimit(RLIMIT_FSIZE, &lim);
      }
      ::execve(argp[0], argp.data(), envp.data());
      ::_exit(127);
    }
  }
  ~Proc() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      wait();
    }
  }
  Proc(const Proc&) = delete;
  Proc& operator=(const Proc&) = delete;

  void signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  // Exit code, or 128 + the signal that ended it.
  int wait() {
    if (pid_ <= 0) return rc_;
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    ms_ = std::chrono::duration<double, std::milli>(Clock::now() - started_).count();
    pid_ = -1;
    rc_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return rc_;
  }
  // True once it has ended (reaps it then).
  bool done() {
    if (pid_ <= 0) return true;
    int st = 0;
    const pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r != pid_) return false;
    ms_ = std::chrono::duration<double, std::milli>(Clock::now() - started_).count();
    pid_ = -1;
    rc_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return true;
  }
  double ms() const { return ms_; }  // start to exit, once waited for
  pid_t pid() const { return pid_; }  // the child's, while it runs

 private:
  pid_t pid_ = -1;
  int rc_ = -1;
  double ms_ = 0;
  Clock::time_point started_;
};

struct Ran {
  int rc = -1;
  std::string out, err;
  double ms = 0;           // fork to exit
  bool timed_out = false;  // killed at ProcOptions::time_limit_s (rc is then 128 + SIGKILL)
};

// Runs the binary to completion in `scratch` (stdout and stderr through files there).
inline Ran run(const std::vector<std::string>& args, const fs::path& scratch, ProcOptions o = {}) {
  static std::atomic<int> counter{0};
  const std::string tag = fmt::format("run{}-{}", ::getpid(), counter++);
  o.out_file = (scratch / (tag + ".out")).string();
  o.err_file = (scratch / (tag + ".err")).string();
  Ran r;
  {
    Proc p(args, o);
    if (o.time_limit_s) {
      const auto deadline = Clock::now() + std::chrono::duration<double>(*o.time_limit_s);
      while (!p.done()) {
        if (Clock::now() > deadline) {
          r.timed_out = true;
          p.signal(SIGKILL);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
    r.rc = p.wait();
    r.ms = p.ms();
  }
  r.out = read_bytes(o.out_file);
  r.err = read_bytes(o.err_file);
  fs::remove(o.out_file);
  fs::remove(o.err_file);
  return r;
}

inline std::size_t count_lines(const std::string& s) { return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n')); }

inline std::size_t count_of(const std::string& text, const std::string& part) {
  std::size_t n = 0;
  for (std::size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// The store's commit hook (ATTNTUNE_TEST_COMMIT_DELAY_MS) says "test hook: evaluation N of campaign
// C written, commit in X ms" while it holds evaluation N's transaction open: N of the last such line
// in a log, 0 if none.
inline std::int64_t held_seq(const std::string& log) {
  const std::string mark = "test hook: evaluation ";
  const std::size_t at = log.rfind(mark);
  return at == std::string::npos ? 0 : std::stoll(log.substr(at + mark.size()));
}

// ---- A real recorded campaign to simulate from ----------------------------------------------------

// tests/data/campaigns/h100-exhaustive-d128.db: all 564 valid flash_fwd_mma configs of
// b=4,h=16,s=4096,d=128 bf16 timed on an H100. `tune --simulate-db` answers from it; the space it
// was recorded with is written to `space` so the hashes match.
struct Recording {
  std::string db, campaign = "h100-exhaustive-d128", space, problem;
  std::size_t size = 0;  // valid configs

  explicit Recording(const TempDir& dir) {
    db = source_dir() + "/tests/data/campaigns/h100-exhaustive-d128.db";
    Store s = Store::open(db, Store::Mode::kReadOnly);
    const search::RecordedCampaign rec = search::RecordedCampaign::load(s, campaign);
    space = dir.file("flash_fwd_mma.yaml");
    write_bytes(space, rec.space.text());
    problem = rec.problem.str();
    size = rec.space_size;
  }
  // `tune` against it: exhaustive unless said otherwise, no convergence stop.
  std::vector<std::string> tune(const std::string& work_db, const std::string& campaign_name, int delay_ms,
                                const std::vector<std::string>& more = {}) const {
    std::vector<std::string> a = {"tune", "--space", space, "--problem", problem, "--db", work_db, "--campaign",
                                  campaign_name, "--simulate-db", db, "--simulate-campaign", campaign,
                                  "--simulate-delay-ms", std::to_string(delay_ms), "--strategy", "exhaustive",
                                  "--log-interval", "1"};
    a.insert(a.end(), more.begin(), more.end());
    return a;
  }
};

// ---- The database ------------------------------------------------------------------------------------

// What SQLite's full integrity check says ("ok" when sound). Opens read-write so that a WAL left by
// a killed writer is recovered as any next user would.
inline std::string integrity_check(const std::string& path) {
  sqlite::Connection db = sqlite::Connection::open(path, SQLITE_OPEN_READWRITE);
  db.set_busy_timeout(std::chrono::seconds(5));
  sqlite::Statement st(db, "PRAGMA integrity_check");
  std::string out;
  while (st.step()) out += (out.empty() ? "" : "; ") + st.text(0);
  return out;
}

// One evaluation row as committed: what must never change or vanish once committed.
struct CommittedRow {
  std::string phase, config, status;
  std::optional<double> median_us;
  bool operator==(const CommittedRow&) const = default;
};

// seq -> row of campaign `campaign` (every campaign when ""), both phases, read the way any user of
// the file would; empty when the file does not exist yet.
inline std::map<std::int64_t, CommittedRow> committed_rows(const std::string& db, const std::string& campaign = "") {
  std::map<std::int64_t, CommittedRow> out;
  if (!fs::exists(db)) return out;
  sqlite::Connection c = sqlite::Connection::open(db, SQLITE_OPEN_READWRITE);
  c.set_busy_timeout(std::chrono::seconds(5));
  sqlite::Statement st(c,
                       "SELECT e.seq, e.phase, k.config_key, e.status, e.median_us FROM evaluations e "
                       "JOIN candidates k ON k.id = e.candidate_id JOIN campaigns c ON c.id = e.campaign_id "
                       "WHERE ?1 = '' OR c.name = ?1 ORDER BY e.seq");
  st.bind(campaign);
  while (st.step()) out[st.int64(0)] = {st.text(1), st.text(2), st.text(3), st.opt_real(4)};
  return out;
}

// A digest of every file in a directory, for messages: "attntune.db 3f2a..., attntune.db-wal ...".
inline std::string digest(const std::map<std::string, std::string>& files) {
  std::string out;
  for (const auto& [name, bytes] : files)
    out += fmt::format("{}{} {}", out.empty() ? "" : ", ", name, content_hash(bytes).substr(0, 12));
  return out.empty() ? "(empty)" : out;
}

// ---- Exported sources ----------------------------------------------------------------------------

// The code of a C/C++/CUDA source: comments removed, every string or character literal emptied
// (adjacent string literals, which the compiler joins, as one). Two sources with the same code differ
// only in what no compiler reads as code.
inline std::string code_only(const std::string& src) {
  enum { kCode, kLine, kBlock, kString, kChar } st = kCode;
  std::string out;
  for (std::size_t i = 0; i < src.size(); ++i) {
    const char c = src[i], n = i + 1 < src.size() ? src[i + 1] : '\0';
    switch (st) {
      case kCode:
        if (c == '/' && n == '/') st = kLine, ++i;
        else if (c == '/' && n == '*') st = kBlock, ++i;
        else if (c == '"') {
          st = kString;
          const std::size_t end = out.find_last_not_of(" \t\n");
          if (end != std::string::npos && end >= 1 && out.compare(end - 1, 2, "\"\"") == 0) out.resize(end + 1);
          else out += "\"\"";
        }
        else if (c == '\'') st = kChar, out += "''";
        else out += c;
        break;
      case kLine:  // a backslash at the end of a // comment continues it on the next line
        if (c == '\\' && n == '\n') ++i;
        else if (c == '\n') st = kCode, out += '\n';
        break;
      case kBlock:
        if (c == '*' && n == '/') st = kCode, ++i, out += ' ';
        break;
      case kString:
        if (c == '\\') ++i;
        else if (c == '"') st = kCode;
        else if (c == '\n') throw std::runtime_error("a newline inside a string literal");
        break;
      case kChar:
        if (c == '\\') ++i;
        else if (c == '\'') st = kCode;
        break;
    }
  }
  if (st == kString || st == kChar || st == kBlock) throw std::runtime_error("the source ends inside a literal or comment");
  return out;
}

// The value of `static const char kInfo[] = "..." "...";` in an exported .cu, unescaped.
inline std::string kernel_info(const std::string& cu) {
  const std::size_t at = cu.find("kInfo[] =");
  if (at == std::string::npos) throw std::runtime_error("no kInfo in the export");
  std::string out;
  bool in = false;
  for (std::size_t i = at; i < cu.size(); ++i) {
    const char c = cu[i];
    if (!in && c == ';') return out;
    if (c == '"') in = !in;
    else if (in && c == '\\') out += cu[++i];
    else if (in) out += c;
  }
  throw std::runtime_error("kInfo does not end");
}

// ---- Figures ------------------------------------------------------------------------------------------

inline double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100 * static_cast<double>(v.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(rank);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}

}  // namespace attntune::reliability
