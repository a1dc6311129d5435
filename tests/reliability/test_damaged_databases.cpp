// Reliability, part 8 (docs/RELIABILITY.md, "Damaged databases"; issue 46): every command that
// opens a database, against copies of a real one damaged as files get damaged: pages overwritten
// with random bytes at 20 offsets, pages zeroed, pages replaced by another page of the file (a copy
// made while a writer checkpointed holds pages of two moments), the file cut short three ways, an
// index or table dropped, a file that is no database. Each run must exit 2 with one line naming the
// file, having printed and written nothing, or give exactly the answer it gives on the undamaged
// database (the same output, the same files, and for a writer the same results recorded and a
// database that passes SQLite's integrity check). Anything else is a wrong answer.
//
// The commands: best (all, and one campaign), campaigns, report, export, status, replay, retime
// (exit 3 without a GPU, --device 99 with one: it must refuse a damaged file first), tune (a resume),
// submit, serve --simulate (the queued campaign), merge with the damaged file as input and as output.
#include <gtest/gtest.h>

#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "fault_util.hpp"

namespace attntune::reliability {
namespace test_damaged_databases {
namespace {

constexpr std::size_t kPage = 4096;

struct Damage {
  std::string kind;   // the class, for the table
  std::string where;  // which page, how
  std::function<void(const std::string& db)> apply;
  std::size_t page = 0;  // the page damaged, for the page classes
  std::size_t from = 0;  // a replaced page's source
};

std::string read_file(const std::string& path) { return read_bytes(path); }

void overwrite(const std::string& db, std::size_t page, const std::string& bytes) {
  std::string data = read_file(db);
  if (page * kPage > data.size()) throw std::runtime_error("no such page");
  data.replace((page - 1) * kPage, kPage, bytes);
  write_bytes(db, data);
}

// The damage cases, for a database of `pages` pages.
std::vector<Damage> damages(std::size_t pages) {
  std::vector<Damage> out;
  // 20 offsets spread over the file, the header page first.
  std::vector<std::size_t> offsets;
  for (std::size_t i = 0; i < 20; ++i) offsets.push_back(1 + i * (pages - 1) / 19);
  for (std::size_t p : offsets)
    out.push_back({"page of random bytes", fmt::format("page {}", p),
                   [p](const std::string& db) {
                     std::mt19937 rng(static_cast<unsigned>(p));
                     std::string bytes(kPage, '\0');
                     for (char& c : bytes) c = static_cast<char>(rng());
                     overwrite(db, p, bytes);
                   },
                   p});
  for (std::size_t i = 1; i < offsets.size(); i += 3)
    out.push_back({"page zeroed", fmt::format("page {}", offsets[i]),
                   [p = offsets[i]](const std::string& db) { overwrite(db, p, std::string(kPage, '\0')); }, offsets[i]});
  for (std::size_t i = 2; i < offsets.size(); i += 2) {
    const std::size_t p = offsets[i], from = 2 + (p + 3) % (pages - 1);
    out.push_back({"page replaced by another page", fmt::format("page {} <- page {}", p, from),
                   [p, from](const std::string& db) {
                     overwrite(db, p, read_file(db).substr((from - 1) * kPage, kPage));
                   },
                   p, from});
  }
  out.push_back({"truncated", "cut inside the last page", [](const std::string& db) {
                   fs::resize_file(db, fs::file_size(db) - 1000);
                 }});
  out.push_back({"truncated", "last page removed", [](const std::string& db) {
                   fs::resize_file(db, fs::file_size(db) - kPage);
                 }});
  out.push_back({"truncated", "half the pages", [pages](const std::string& db) {
                   fs::resize_file(db, pages / 2 * kPage);
                 }});
  for (const char* sql : {"DROP INDEX evaluations_best", "DROP INDEX queue_state", "DROP TABLE campaign_runs"})
    out.push_back({"index or table dropped", sql, [sql](const std::string& db) {
                     sqlite::Connection c = sqlite::Connection::open(db, SQLITE_OPEN_READWRITE);
                     c.exec(sql);
                   }});
  out.push_back({"not a database", "a text file", [](const std::string& db) {
                   write_bytes(db, std::string(20000, 'x') + "\nnot a database\n");
                 }});
  out.push_back({"not a database", "random bytes", [](const std::string& db) {
                   std::mt19937 rng(7);
                   std::string bytes(16 * kPage, '\0');
                   for (char& c : bytes) c = static_cast<char>(rng());
                   write_bytes(db, bytes);
                 }});
  out.push_back({"not a database", "another program's SQLite database", [](const std::string& db) {
                   fs::remove(db);
                   sqlite::Connection c = sqlite::Connection::open(db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
                   c.exec("CREATE TABLE notes (t TEXT); INSERT INTO notes VALUES ('mine')");
                 }});
  return out;
}

// The pages that hold only the tail of a long value (the last page of an overflow chain: its first
// four bytes, the next page's number, are 0): nothing in them is structure SQLite can check, and
// SQLite keeps no checksums, so their bytes can change unseen.
std::set<std::size_t> value_tails(const std::string& db) {
  std::set<std::size_t> out;
  const std::string bytes = read_file(db);
  sqlite::Connection c = sqlite::Connection::open(db, SQLITE_OPEN_READWRITE);
  sqlite::Statement st(c, "SELECT pageno FROM dbstat WHERE pagetype = 'overflow'");
  while (st.step()) {
    const auto p = static_cast<std::size_t>(st.int64(0));
    if (bytes.compare((p - 1) * kPage, 4, std::string(4, '\0')) == 0) out.insert(p);
  }
  return out;
}

// A case's directory: the (damaged) database, another database for merge, the space, an output
// folder.
struct Dir {
  fs::path root;
  std::string db() const { return (root / "work.db").string(); }
  std::string other() const { return (root / "other.db").string(); }
  std::string out(const std::string& name) const { return (root / "out" / name).string(); }
};

struct Command {
  std::string name;
  bool writer = false;  // its database is `work.db`, written: its results are compared
  std::string result_db(const Dir& d) const { return name == "merge (damaged input)" ? d.out("merged.db") : d.db(); }
  std::function<std::vector<std::string>(const Dir&, const Recording&)> args;
  // What a writer checks and writes when it is not the whole file (submit: the queue,
  // Store::Options): its result is judged on those tables, the rest being what it found.
  std::vector<std::string> scope = {};
};

std::vector<Command> commands() {
  using V = std::vector<std::string>;
  return {
      {"best", false, [](const Dir& d, const Recording&) { return V{"best", "--db", d.db(), "--top", "5", "--format", "json"}; }},
      {"best --campaign", false,
       [](const Dir& d, const Recording&) { return V{"best", "--db", d.db(), "--campaign", "k", "--top", "3", "--format", "csv"}; }},
      {"campaigns", false, [](const Dir& d, const Recording&) { return V{"campaigns", "--db", d.db(), "--format", "json"}; }},
      {"report", false,
       [](const Dir& d, const Recording&) { return V{"report", "--db", d.db(), "--campaign", "k", "--format", "json"}; }},
      {"export", false,
       [](const Dir& d, const Recording&) { return V{"export", "--db", d.db(), "--campaign", "k", "-o", d.out("k.cu")}; }},
      {"status", false, [](const Dir& d, const Recording&) { return V{"status", "--db", d.db(), "--format", "csv"}; }},
      {"replay", false,
       [](const Dir& d, const Recording&) {
         return V{"replay", "--db", d.db(), "--campaign", "k", "--partial", "--seeds", "2", "--budget", "10",
                  "--format", "json"};
       }},
      {"retime", true,
       [](const Dir& d, const Recording&) { return V{"retime", "--db", d.db(), "--campaign", "k", "--device", "99"}; }},
      {"tune", true,
       [](const Dir& d, const Recording& rec) {
         return rec.tune(d.db(), "k", 0, {"--budget-evals", "48", "--final-top", "3", "--final-rounds", "1"});
       }},
      {"submit", true, [](const Dir& d, const Recording&) { return submit_args(d.db(), {service_problem(3)}, 8); },
       {"queue"}},
      {"serve", true, [](const Dir& d, const Recording&) { return serve_args(d.db(), "0", 0); }},
      {"merge (damaged input)", true,
       [](const Dir& d, const Recording&) { return V{"merge", d.db(), "-o", d.out("merged.db")}; }},
      {"merge (damaged output)", true, [](const Dir& d, const Recording&) { return V{"merge", d.other(), "-o", d.db()}; }},
  };
}

// What a command did: its exit, its output, the files it wrote, and for a writer its results.
struct Result {
  int rc = -1;
  std::string out, err, content, integrity;
  std::map<std::string, std::string> outputs;  // files under out/
};

std::map<std::string, std::string> files_under(const fs::path& dir) {
  std::map<std::string, std::string> out;
  if (fs::exists(dir))
    for (const auto& e : fs::directory_iterator(dir)) out[e.path().filename().string()] = read_bytes(e.path().string());
  return out;
}

// The directory's text as the answer sees it: the case's own path replaced, so answers from two
// directories compare.
std::string portable(std::string s, const Dir& d) {
  const std::string root = d.root.string();
  for (std::size_t at = s.find(root); at != std::string::npos; at = s.find(root, at)) s.replace(at, root.size(), "DIR");
  return s;
}

Result run_in(const Command& c, const Dir& d, const Recording& rec) {
  const Ran r = run(c.args(d, rec), d.root);
  Result out{r.rc, portable(r.out, d), portable(r.err, d), "", "", {}};
  for (auto& [name, bytes] : files_under(d.root / "out")) out.outputs[name] = portable(bytes, d);
  if (c.writer && r.rc == 0 && fs::exists(c.result_db(d))) {
    const std::string db = c.result_db(d);
    if (c.scope.empty()) {
      out.integrity = integrity_check(db);
      out.content = out.integrity == "ok" ? content(db) : "(damaged)";
    } else {
      // Its tables only: the queue's rows, and SQLite's check of each.
      sqlite::Connection conn = sqlite::Connection::open(db, SQLITE_OPEN_READWRITE);
      for (const std::string& t : c.scope) {
        sqlite::Statement st(conn, fmt::format("PRAGMA integrity_check('{}')", t));
        while (st.step()) out.integrity += st.text(0) == "ok" ? "" : st.text(0) + "; ";
      }
      if (out.integrity.empty()) out.integrity = "ok";
      sqlite::Statement q(conn, "SELECT campaign, state, attempts, plan, regime FROM queue ORDER BY campaign");
      while (q.step()) out.content += fmt::format("{}|{}|{}|{}|{}\n", q.text(0), q.text(1), q.int64(2), q.text(3), q.text(4));
    }
  }
  return out;
}

enum class Verdict { kRefused, kRight, kWrong };

// Judges one run against the answer on the undamaged database.
Verdict judge(const Result& got, const Result& ref, const std::map<std::string, std::string>& before,
              const std::map<std::string, std::string>& after, std::string& why) {
  if (got.rc == 2) {
    const std::vector<std::string> lines = testing::lines(got.err);
    if (lines.empty() || lines.back().rfind("attntune: error: ", 0) != 0) why = "exit 2 without the error line";
    else if (lines.back().find("database") == std::string::npos) why = "the error does not name the database: " + lines.back();
    else if (!got.out.empty()) why = "exit 2 after printing: " + got.out.substr(0, 200);
    else if (before != after) why = "exit 2 but the directory changed";
    return why.empty() ? Verdict::kRefused : Verdict::kWrong;
  }
  if (got.rc != ref.rc) why = fmt::format("exit {} (undamaged: {}): {}", got.rc, ref.rc, got.err.substr(0, 300));
  else if (got.out != ref.out) why = "another answer on stdout";
  else if (got.outputs != ref.outputs) why = "other files written";
  else if (got.content != ref.content) why = "other results recorded";
  else if (!ref.integrity.empty() && got.integrity != "ok") why = "integrity check: " + got.integrity;
  return why.empty() ? Verdict::kRight : Verdict::kWrong;
}

TEST(ReliabilityDamage, EveryCommandOnEveryDamagedDatabaseRefusesOrAnswersRight) {
  TempDir dir;
  const Recording rec(dir);
  const fs::path base = dir.path() / "base";
  fs::create_directories(base / "out");
  const Dir base_dir{base};
  ASSERT_EQ(make_full_database(rec, base_dir.db(), dir.path()), "");
  ASSERT_EQ(run(rec.tune(base_dir.other(), "o", 0, {"--budget-evals", "15", "--final-top", "2", "--final-rounds", "1"}),
                dir.path()).rc, 0);
  const std::size_t pages = fs::file_size(base_dir.db()) / kPage;
  ASSERT_EQ(integrity_check(base_dir.db()), "ok");
  const std::set<std::size_t> tails = value_tails(base_dir.db());

  const std::vector<Command> cmds = commands();
  const std::vector<Damage> cases = damages(pages);
  std::printf("database: %zu pages (%zu bytes); %zu damaged copies x %zu commands\n", pages,
              static_cast<std::size_t>(fs::file_size(base_dir.db())), cases.size(), cmds.size());

  // Copies `base` into a fresh directory, damaged by `d` (or not).
  std::atomic<int> serial{0};
  const auto fresh = [&](const Damage* d) {
    const Dir out{dir.path() / fmt::format("case{}", serial++)};
    fs::create_directories(out.root / "out");
    fs::copy_file(base_dir.db(), out.db());
    fs::copy_file(base_dir.other(), out.other());
    if (d) d->apply(out.db());
    return out;
  };

  // The answers on the undamaged database.
  std::vector<Result> refs;
  for (const Command& c : cmds) {
    const Dir d = fresh(nullptr);
    refs.push_back(run_in(c, d, rec));
    fs::remove_all(d.root);
    const bool ok = refs.back().rc == 0 || (c.name == "retime" && refs.back().rc == 3);
    ASSERT_TRUE(ok) << c.name << " on the undamaged database: exit " << refs.back().rc << ": " << refs.back().err;
  }

  // Every (damage, command), two at a time.
  // Two outcomes beyond any check SQLite offers, counted apart (docs/RELIABILITY.md says why): a
  // value's tail page changed (no checksum), and a reader of a page replaced by a valid page of
  // the file (only a full integrity check, which writers run, tells it from the right one).
  struct Tally {
    int refused = 0, right = 0, wrong = 0, unseen = 0;
  };
  std::map<std::string, Tally> by_kind;
  std::map<std::pair<std::string, std::string>, Tally> by_kind_command;
  std::vector<std::string> wrongs, unseen;
  std::mutex mutex;
  std::atomic<std::size_t> next{0};
  const auto worker = [&] {
    for (std::size_t i; (i = next++) < cases.size() * cmds.size();) {
      const Damage& dmg = cases[i / cmds.size()];
      const Command& c = cmds[i % cmds.size()];
      const Dir d = fresh(&dmg);
      const auto before = tree(d.root);
      Result got;
      try {
        got = run_in(c, d, rec);
      } catch (const std::exception& e) {
        got.rc = -2;  // reading what it left failed: judged wrong below
        got.err = std::string("the test could not read its result: ") + e.what();
      }
      auto after = tree(d.root);
      // SQLite may leave an empty log beside a database it opened for writing and closed.
      std::erase_if(after, [&](const auto& f) {
        return !before.count(f.first) && f.first.size() > 4 && f.first.compare(f.first.size() - 4, 4, "-wal") == 0 &&
               f.second.empty();
      });
      std::string why;
      const Verdict v = judge(got, refs[i % cmds.size()], before, after, why);
      fs::remove_all(d.root);
      const std::lock_guard<std::mutex> lock(mutex);
      Tally& t = by_kind[dmg.kind];
      Tally& tc = by_kind_command[{dmg.kind, c.name}];
      if (v == Verdict::kRefused) ++t.refused, ++tc.refused;
      if (v == Verdict::kRight) ++t.right, ++tc.right;
      // A value's tail changed: its bytes, or the whole page replaced by another value's tail (both
      // end their chain, so every structure SQLite checks still holds; only the value differs).
      const bool tail = tails.count(dmg.page) && (dmg.kind != "page replaced by another page" || tails.count(dmg.from));
      const bool torn_read = dmg.kind == "page replaced by another page" && !c.writer;
      if (v == Verdict::kWrong && (tail || torn_read)) {
        ++t.unseen, ++tc.unseen;
        unseen.push_back(fmt::format("{} ({}{}) / {}: {}", dmg.kind, dmg.where, tail ? ", a value's tail" : "", c.name, why));
      } else if (v == Verdict::kWrong) {
        ++t.wrong, ++tc.wrong;
        wrongs.push_back(fmt::format("{} ({}) / {}: {}", dmg.kind, dmg.where, c.name, why));
      }
      if (std::getenv("ATTNTUNE_DAMAGE_VERBOSE"))
        std::printf("%s (%s) / %s: exit %d %s %s\n", dmg.kind.c_str(), dmg.where.c_str(), c.name.c_str(), got.rc,
                    v == Verdict::kRefused ? "refused" : v == Verdict::kRight ? "right" : "WRONG",
                    (got.rc == 2 ? testing::lines(got.err).back() : why).c_str());
    }
  };
  const auto t0 = Clock::now();
  std::thread a(worker), b(worker);
  a.join();
  b.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  std::printf("\n%-32s %8s %8s %8s %8s\n", "damage", "exit 2", "right", "wrong", "unseen");
  for (const auto& [kind, t] : by_kind)
    std::printf("%-32s %8d %8d %8d %8d\n", kind.c_str(), t.refused, t.right, t.wrong, t.unseen);
  std::printf("(unseen: a value's tail page changed or replaced by another tail, or a reader of a page replaced by another: beyond SQLite's "
              "page checks; %zu of the %zu pages are value tails)\n",
              tails.size(), pages);
  for (const std::string& u : unseen) std::printf("  unseen: %s\n", u.c_str());
  std::printf("\nper command (exit 2 / right / wrong / unseen), by damage:\n  %-24s", "");
  for (const auto& [kind, t] : by_kind) std::printf(" %s |", kind.c_str());
  std::printf("\n");
  for (const Command& c : cmds) {
    std::string line = fmt::format("  {:<24}", c.name);
    for (const auto& [kind, t] : by_kind) {
      const Tally& tc = by_kind_command[{kind, c.name}];
      line += fmt::format(" {:>3}/{:<3}/{}/{:<2}", tc.refused, tc.right, tc.wrong, tc.unseen);
    }
    std::printf("%s\n", line.c_str());
  }
  std::printf("%zu runs in %.1f s\n", cases.size() * cmds.size(), seconds);
  for (const std::string& w : wrongs) ADD_FAILURE() << w;
}

}  // namespace
}  // namespace test_damaged_databases
}  // namespace attntune::reliability
