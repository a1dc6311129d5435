// Reliability, part 3 (docs/RELIABILITY.md): a corpus of bad inputs, each run through the real binary
// against a copy of a real database (a campaign of 30 evaluations, ranked, made by `tune` from the
// recorded H100 campaign): each gives exactly one line on stderr, "attntune: error: ...", that names
// the problem (and the file:line:column where it came from a file), the exit code docs/CONTRACT.md gives
// it (2 bad input; 3 environment: a database locked by another writer, a full disk), and leaves
// every file in the database's directory byte-for-byte as it was.
//
// The base command of most cases is a `tune` that would write to the database were its input good
// (the control case at the end shows it does). A full disk is a file-size limit (RLIMIT_FSIZE, with
// SIGXFSZ ignored, so writes fail with EFBIG as on a full disk), since CI may not mount a tmpfs; a
// locked database is another process holding BEGIN IMMEDIATE on it.
#include <gtest/gtest.h>

#include <functional>
#include <set>

#include "reliability_util.hpp"

namespace attntune::reliability {
namespace test_bad_inputs {
namespace {

using namespace std::chrono_literals;

// Every file and directory under `dir`, with the contents of files: "unchanged" is equality.
std::map<std::string, std::string> tree(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string rel = fs::relative(e.path(), dir).string();
    if (e.is_directory()) out[rel + "/"] = "";
    else if (e.is_regular_file()) out[rel] = read_bytes(e.path().string());
  }
  return out;
}

// A process holding the write lock of a database (BEGIN IMMEDIATE) until told to let go.
class LockHolder {
 public:
  explicit LockHolder(const std::string& db) {
    if (::pipe(ready_) != 0 || ::pipe(release_) != 0) throw std::runtime_error("pipe");
    pid_ = ::fork();
    if (pid_ == 0) {
      try {
        sqlite::Connection c = sqlite::Connection::open(db, SQLITE_OPEN_READWRITE);
        c.exec("BEGIN IMMEDIATE");
        char x = 'l';
        if (::write(ready_[1], &x, 1) != 1) ::_exit(1);
        if (::read(release_[0], &x, 1) < 0) ::_exit(1);
        c.exec("ROLLBACK");
      } catch (...) {
        ::_exit(1);
      }
      ::_exit(0);
    }
    char x = 0;
    if (::read(ready_[0], &x, 1) != 1) throw std::runtime_error("the lock holder did not start");
  }
  int release() {
    char x = 'r';
    [[maybe_unused]] auto w = ::write(release_[1], &x, 1);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    for (int fd : {ready_[0], ready_[1], release_[0], release_[1]}) ::close(fd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }

 private:
  int ready_[2], release_[2];
  pid_t pid_ = -1;
};

struct Env {
  fs::path dir;     // the case's directory: the database and whatever the case writes
  std::string db;   // dir/attntune.db, a copy of the real one
  const Recording* rec = nullptr;
  std::string file(const std::string& name) const { return (dir / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    write_bytes(file(name), text);
    return file(name);
  }
};

// The base command: resume campaign k up to 60 evaluations, from the recording. `set` replaces the
// value of an option (or removes the option when the value is "-"); `extra` goes at the end.
std::vector<std::string> tune(const Env& e, const std::map<std::string, std::string>& set = {},
                              const std::vector<std::string>& extra = {}) {
  std::vector<std::string> a = e.rec->tune(e.db, "k", 0, {"--budget-evals", "60"});
  for (const auto& [opt, value] : set) {
    auto it = std::find(a.begin(), a.end(), opt);
    if (it == a.end()) {
      a.push_back(opt);
      a.push_back(value);
    } else if (value == "-") {
      a.erase(it, it + 2);
    } else {
      *(it + 1) = value;
    }
  }
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::string bad_space(const std::string& name) { return source_dir() + "/tests/data/spaces/bad/" + name; }

struct Case {
  std::string name;
  std::function<std::vector<std::string>(const Env&)> args;  // may write files into the case's directory
  int rc;
  std::string says;                        // a part of the one line
  std::optional<rlim_t> file_size_limit = std::nullopt;  // a full disk
  bool locked = false;                     // another writer holds the database
};

// Files SQLite may leave beside a database it could not open for want of space: an empty log and a
// shared-memory index (no data, only locks and a header the next opener rebuilds). The database
// itself stays byte for byte; these two are then allowed to appear, and nothing else.
bool only_empty_side_files_added(const std::map<std::string, std::string>& before,
                                 std::map<std::string, std::string> after) {
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() > tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  std::erase_if(after, [&](const auto& file) {
    const auto& [name, bytes] = file;
    if (before.count(name)) return false;
    return (ends_with(name, "-wal") && bytes.empty()) ||
           (ends_with(name, "-shm") && bytes.find_first_not_of('\0') == std::string::npos);
  });
  return before == after;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

std::vector<Case> corpus() {
  const std::string P = "b=4,h=16,s=4096,d=128,dtype=bf16,causal=0";
  auto problem = [](const std::string& p) {
    return [p](const Env& e) { return tune(e, {{"--problem", p}}); };
  };
  auto space_file = [](const std::string& name) {
    return [name](const Env& e) { return tune(e, {{"--space", bad_space(name)}}); };
  };
  // The recorded space with one edit, as a new file (its hash then differs from the recording's,
  // so these go through `compile --db`, which also writes to the database: its build cache).
  auto edited_space = [](const std::string& from, const std::string& to) {
    return [from, to](const Env& e) {
      const std::string text = read_bytes(e.rec->space);
      if (text.find(from) == std::string::npos) throw std::runtime_error("the recorded space lacks: " + from);
      return std::vector<std::string>{"compile", "--space", e.write("edited.yaml", replace_all(text, from, to)),
                                      "--problem", e.rec->problem, "--arch", "sm_90", "--db", e.db};
    };
  };
  std::vector<Case> c = {
      // Search-space YAML (tests/data/spaces/bad/), through tune.
      {"YAML syntax error", space_file("syntax.yaml"), 2, "syntax.yaml:3:14: YAML: end of sequence flow not found"},
      {"unknown top-level key", space_file("unknown_top_key.yaml"), 2, "unknown_top_key.yaml:7:1: "},
      {"unknown parameter key", space_file("unknown_param_key.yaml"), 2, "unknown_param_key.yaml:6:30: "},
      {"wrong type: not an integer", space_file("non_integer.yaml"), 2, "expected an integer, got '12x'"},
      {"wrong type: quoted integer", space_file("quoted_integer.yaml"), 2, "got the string \"232448\""},
      {"wrong type: string for a list", space_file("string_for_list.yaml"), 2, "archs: expected a list like [a, b]"},
      {"duplicate key", space_file("duplicate_key.yaml"), 2, "duplicate key 'block_m' (first at line 6)"},
      {"no parameters", space_file("empty_params.yaml"), 2, "empty_params.yaml:5:9: params: no parameters"},
      {"type error in an expression", space_file("type_error.yaml"), 2, "'+' needs int operands"},
      {"unknown name in a constraint", space_file("unknown_name.yaml"), 2, "unknown name 'wraps' (did you mean 'warps'?)"},
      {"empty YAML file", [](const Env& e) { return tune(e, {{"--space", e.write("empty.yaml", "")}}); }, 2,
       "empty.yaml"},
      {"binary file as the space (the database)", [](const Env& e) { return tune(e, {{"--space", e.db}}); }, 2,
       "attntune.db"},
      {"missing space file", [](const Env& e) { return tune(e, {{"--space", e.file("nope.yaml")}}); }, 2,
       "nope.yaml: no such file"},
      {"directory as the space file", [](const Env& e) { return tune(e, {{"--space", e.dir.string()}}); }, 2,
       "is a directory"},
      {"an empty space (no valid config)", edited_space("block_m: [64, 128]", "block_m: [32]"), 1,
       "no valid config in"},
      {"unknown template", edited_space("family: flash_fwd_mma", "family: flash_bwd_wgmma_v9"), 2,
       "unknown template family 'flash_bwd_wgmma_v9'"},
      // Problems.
      {"unsupported head_dim", [P](const Env& e) {
         return std::vector<std::string>{"compile", "--space", e.rec->space, "--problem",
                                         replace_all(P, "d=128", "d=100"), "--arch", "sm_90", "--db", e.db};
       }, 2, "does not support d=100"},
      {"unsupported head_dim, no database yet (tune)", [P](const Env& e) {
         return tune(e, {{"--problem", replace_all(P, "d=128", "d=100")}, {"--db", e.file("new.db")}});
       }, 2, "does not support d=100"},
      {"unsupported dtype", problem(replace_all(P, "bf16", "fp32")), 2, "'dtype=fp32': expected fp16, bf16 or fp8"},
      {"problem: missing key", problem("b=4,h=16,s=4096,dtype=bf16,causal=0"), 2, "missing key 'd'"},
      {"problem: unknown key", problem(P + ",heads=3"), 2, "unknown key 'heads'"},
      {"problem: not an integer", problem(replace_all(P, "b=4", "b=four")), 2, "'b=four': expected an integer"},
      {"problem: out of range", problem(replace_all(P, "b=4", "b=0")), 2, "'b=0' is out of range"},
      {"problem: key given twice", problem(P + ",s=128"), 2, "key 's' given twice"},
      {"problem: h not a multiple of hkv", problem(P + ",hkv=5"), 2, "h=16 is not a multiple of hkv=5"},
      {"problem: not key=value", problem("b=4;h=16"), 2, "'b=4;h=16': expected an integer"},
      {"problem: a key without a value", problem("b=4,h"), 2, "'h' is not key=value"},
      {"problem: empty", problem(""), 2, "empty spec"},
      // Databases.
      {"directory as the database", [](const Env& e) {
         fs::create_directory(e.file("dir.db"));
         return tune(e, {{"--db", e.file("dir.db")}});
       }, 2, "is a directory"},
      {"database in a missing directory", [](const Env& e) { return tune(e, {{"--db", e.file("no/such/dir.db")}}); },
       2, "does not exist"},
      {"text file as the database", [](const Env& e) {
         return tune(e, {{"--db", e.write("notes.db", "campaign notes, not a database\n")}});
       }, 2, "is not an SQLite database"},
      {"another program's SQLite database", [](const Env& e) {
         {
           sqlite::Connection c = sqlite::Connection::open(e.file("other.db"), SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
           c.exec("CREATE TABLE photos (id INTEGER PRIMARY KEY, path TEXT)");
         }
         return tune(e, {{"--db", e.file("other.db")}});
       }, 2, "an SQLite database of another program"},
      {"truncated database (tune)", [](const Env& e) {
         const std::string bytes = read_bytes(e.db);
         write_bytes(e.file("cut.db"), bytes.substr(0, bytes.size() / 2 + 100));
         return tune(e, {{"--db", e.file("cut.db")}});
       }, 2, "truncated"},
      {"truncated database (best)", [](const Env& e) {
         const std::string bytes = read_bytes(e.db);
         write_bytes(e.file("cut.db"), bytes.substr(0, 4096 * 3 + 17));
         return std::vector<std::string>{"best", "--db", e.file("cut.db")};
       }, 2, "truncated"},
      {"newer schema", [](const Env& e) {
         std::string bytes = read_bytes(e.db);
         bytes[60] = 0, bytes[61] = 0, bytes[62] = 0, bytes[63] = 99;  // user_version 99
         write_bytes(e.file("newer.db"), bytes);
         return tune(e, {{"--db", e.file("newer.db")}});
       }, 2, "was written by a newer attntune (schema version 99"},
      {"empty database file (best)", [](const Env& e) {
         return std::vector<std::string>{"best", "--db", e.write("zero.db", "")};
       }, 2, "is empty, not an attntune database"},
      {"missing database (campaigns)", [](const Env& e) {
         return std::vector<std::string>{"campaigns", "--db", e.file("nope.db")};
       }, 2, "does not exist"},
      {"read-only database", [](const Env& e) {
         fs::permissions(e.db, fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
         return tune(e);
       }, 2, "is read-only"},
      {"database locked by another writer", [](const Env& e) { return tune(e); }, 3, "is locked by another writer",
       std::nullopt, true},
      // A full disk: every file stops at 4 KiB, so SQLite cannot even map its -shm index. (Through
      // compile --db: tune would first fail on the recording it simulates from, not on this database.)
      {"full disk", [](const Env& e) {
         return std::vector<std::string>{"compile", "--space", e.rec->space, "--problem", e.rec->problem, "--arch",
                                         "sm_90", "--limit", "1", "--db", e.db};
       }, 3, "cannot be written: no space left", rlim_t{4096}},
      {"resume with another problem", [](const Env& e) { return tune(e, {{"--campaign", "d64"}}); }, 2,
       "campaign 'd64' tunes problem b=4,h=16,hkv=16,s=4096,sk=4096,d=64"},
      {"resume with another search space", [](const Env& e) { return tune(e, {{"--campaign", "old_space"}}); }, 2,
       "campaign 'old_space' was started with another search space"},
      // Arguments.
      {"eval: value outside the domain", [](const Env& e) {
         return std::vector<std::string>{"eval", "--space", e.rec->space, "--problem", e.rec->problem, "--db", e.db,
                                         "--config", "block_m=96"};
       }, 2, "block_m"},
      {"unknown strategy", [](const Env& e) { return tune(e, {{"--strategy", "annealing"}}); }, 2,
       "unknown strategy 'annealing'"},
      {"bad duration", [](const Env& e) { return tune(e, {{"--budget-time", "5x"}}); }, 2, "--budget-time"},
      {"negative budget", [](const Env& e) { return tune(e, {{"--budget-evals", "-3"}}); }, 2, "must not be negative"},
      {"negative screening", [](const Env& e) { return tune(e, {{"--final-screen", "-1"}}); }, 2, "--final-screen"},
      {"unknown option", [](const Env& e) { return tune(e, {}, {"--turbo"}); }, 2, "unrecognised option '--turbo'"},
      {"unknown command", [](const Env&) { return std::vector<std::string>{"tuen"}; }, 2, "unknown command 'tuen'"},
      {"unknown format", [](const Env& e) {
         return std::vector<std::string>{"best", "--db", e.db, "--format", "xml"};
       }, 2, "unknown --format 'xml'"},
      {"unknown campaign (best)", [](const Env& e) {
         return std::vector<std::string>{"best", "--db", e.db, "--campaign", "nope"};
       }, 2, "no campaign 'nope'"},
  };
  return c;
}

TEST(ReliabilityBadInputs, EachIsOneLineTheDocumentedExitCodeAndChangesNothing) {
  TempDir dir;
  const Recording rec(dir);
  // The real database every case gets a copy of: campaign k (30 evaluations, ranked) from `tune`,
  // and two campaigns that a resume must not mix with: d64 (another problem), old_space (another space).
  const std::string pristine = dir.file("pristine.db");
  {
    const Ran made = run(rec.tune(pristine, "k", 0, {"--budget-evals", "30"}), dir.path());
    ASSERT_EQ(made.rc, 0) << made.err;
    Store s = Store::open(pristine, Store::Mode::kExisting);
    const std::int64_t dev = s.upsert_device({"simulated NVIDIA H100 80GB HBM3", "sm_90", "simulated:h100-exhaustive-d128", 0, ""});
    CampaignSpec spec = s.campaign_row("k")->spec;
    spec.name = "d64";
    spec.problem.d = 64;
    s.finish_campaign(s.open_campaign(spec, dev), "completed", "test");
    spec = s.campaign_row("k")->spec;
    spec.name = "old_space";
    spec.space_hash = "0123456789abcdef0123456789abcdef";
    s.finish_campaign(s.open_campaign(spec, dev), "completed", "test");
  }
  ASSERT_FALSE(fs::exists(pristine + "-wal"));
  const std::string pristine_bytes = read_bytes(pristine);

  const std::vector<Case> cases = corpus();
  int n = 0;
  std::printf("%-3s %-46s %3s  %-14s %s\n", "#", "case", "rc", "db digest", "stderr");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const fs::path case_dir = dir.path() / fmt::format("case{:02}", ++n);
    fs::create_directory(case_dir);
    Env env{case_dir, (case_dir / "attntune.db").string(), &rec};
    write_bytes(env.db, pristine_bytes);
    const std::vector<std::string> args = c.args(env);
    std::optional<LockHolder> holder;
    if (c.locked) holder.emplace(env.db);
    const auto before = tree(case_dir);
    ProcOptions o;
    o.file_size_limit = c.file_size_limit;
    const Ran r = run(args, dir.path(), o);
    const auto after = tree(case_dir);
    if (holder) {
      EXPECT_EQ(holder->release(), 0);
    }
    fs::permissions(env.db, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::add);

    EXPECT_EQ(r.rc, c.rc) << r.err;
    EXPECT_EQ(count_lines(r.err), 1u) << "not one line:\n" << r.err;
    EXPECT_EQ(r.err.rfind("attntune: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << "expected '" << c.says << "' in: " << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    if (c.file_size_limit) {
      EXPECT_TRUE(only_empty_side_files_added(before, after))
          << "the directory changed: " << digest(before) << " -> " << digest(after);
    } else {
      EXPECT_TRUE(before == after) << "the directory changed: " << digest(before) << " -> " << digest(after);
    }
    EXPECT_TRUE(read_bytes(env.db) == pristine_bytes) << "the database changed";
    std::string line = r.err.substr(0, r.err.find('\n'));
    if (line.size() > 150) line = line.substr(0, 147) + "...";
    std::printf("%-3d %-46s %3d  %-14s %s\n", n, c.name.c_str(), r.rc,
                content_hash(read_bytes(env.db)).substr(0, 12).c_str(), line.c_str());
  }
  std::printf("%zu bad inputs: each one line, its exit code, the database byte-for-byte unchanged\n", cases.size());
  EXPECT_GE(cases.size(), 30u);

  // Controls: the base command with good input does write (so "unchanged" above means something),
  // and readers still answer from a read-only or locked database, or on a full disk.
  const fs::path control = dir.path() / "control";
  fs::create_directory(control);
  Env env{control, (control / "attntune.db").string(), &rec};
  write_bytes(env.db, pristine_bytes);
  fs::permissions(env.db, fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
  const Ran ro = run({"best", "--db", env.db, "--campaign", "k", "--format", "json"}, dir.path());
  EXPECT_EQ(ro.rc, 0) << ro.err;
  EXPECT_TRUE(read_bytes(env.db) == pristine_bytes);
  fs::permissions(env.db, fs::perms::owner_write, fs::perm_options::add);
  {
    LockHolder holder(env.db);
    const Ran locked = run({"campaigns", "--db", env.db}, dir.path());
    EXPECT_EQ(locked.rc, 0) << locked.err;
    EXPECT_LT(locked.ms, 1000) << "a reader waited for the writer";
    EXPECT_EQ(holder.release(), 0);
  }
  {  // A full disk: a reader cannot make SQLite's -shm index, and reads the file as immutable.
    const auto before = tree(control);
    ProcOptions o;
    o.file_size_limit = rlim_t{4096};
    // Twice: the first leaves an empty -wal and an unused -shm behind, which the second must read past.
    for (int i = 0; i < 2; ++i) {
      const Ran full = run({"best", "--db", env.db, "--campaign", "k", "--format", "json"}, dir.path(), o);
      EXPECT_EQ(full.rc, 0) << "read " << i + 1 << ": " << full.err;
      EXPECT_EQ(full.out, ro.out) << "the same answer as from the read-only file";
    }
    EXPECT_TRUE(only_empty_side_files_added(before, tree(control)));
    EXPECT_TRUE(read_bytes(env.db) == pristine_bytes);
  }
  const Ran good = run(tune(env), dir.path());
  EXPECT_EQ(good.rc, 0) << good.err;
  EXPECT_FALSE(read_bytes(env.db) == pristine_bytes) << "the base command did not write: the corpus proves nothing";
}

}  // namespace
}  // namespace test_bad_inputs
}  // namespace attntune::reliability

namespace attntune::reliability {
namespace test_bad_inputs {
namespace {

// The disk fills in the middle of a campaign (a 64 KiB file-size limit: the write-ahead log reaches it
// after a few commits): tune stops with exit 3 and one clear last line, every evaluation committed
// before is intact, the database passes its integrity check, and a resume with space again completes
// the campaign with every config evaluated once.
TEST(ReliabilityBadInputs, ADiskThatFillsMidCampaignStopsCleanlyAndTheResumeCompletes) {
  TempDir dir;
  const Recording rec(dir);
  const std::string work = dir.file("work.db");
  ASSERT_EQ(run(rec.tune(work, "k", 0, {"--budget-evals", "20"}), dir.path()).rc, 0);
  std::vector<EvaluationRow> before;
  {
    Store s = Store::open(work, Store::Mode::kReadOnly);
    before = s.campaign_evaluations(*s.find_campaign("k"));
  }
  ASSERT_EQ(before.size(), 20u);

  ProcOptions full;
  full.file_size_limit = 64 * 1024;
  const Ran r = run(rec.tune(work, "k", 0, {"--budget-evals", "200"}), dir.path(), full);
  EXPECT_EQ(r.rc, 3) << r.err;
  const std::string last_line = r.err.substr(r.err.rfind('\n', r.err.size() - 2) + 1);
  EXPECT_EQ(last_line.rfind("attntune: error: ", 0), 0u) << r.err;
  EXPECT_NE(last_line.find("no space left"), std::string::npos) << last_line;

  ASSERT_EQ(integrity_check(work), "ok");
  std::size_t committed = 0;
  {
    Store s = Store::open(work, Store::Mode::kReadOnly);
    const auto rows = s.campaign_evaluations(*s.find_campaign("k"));
    committed = rows.size();
    ASSERT_GE(rows.size(), before.size());
    EXPECT_LT(rows.size(), 200u) << "the limit never bit";
    for (std::size_t i = 0; i < before.size(); ++i) {
      EXPECT_EQ(rows[i].config, before[i].config);
      EXPECT_EQ(rows[i].record.median_us, before[i].record.median_us);
    }
  }
  const Ran resumed = run(rec.tune(work, "k", 0, {"--budget-evals", "200"}), dir.path());
  ASSERT_EQ(resumed.rc, 0) << resumed.err;
  Store s = Store::open(work, Store::Mode::kReadOnly);
  const auto rows = s.campaign_evaluations(*s.find_campaign("k"));
  ASSERT_EQ(rows.size(), 200u);
  std::set<std::string> configs;
  for (const auto& e : rows) EXPECT_TRUE(configs.insert(config_str(e.config)).second) << "twice: " << config_str(e.config);
  std::printf("disk full after %zu of 200 evaluations (exit %d: %s); resumed to 200, each config once\n", committed,
              r.rc, last_line.substr(0, 120).c_str());
}

}  // namespace
}  // namespace test_bad_inputs
}  // namespace attntune::reliability
