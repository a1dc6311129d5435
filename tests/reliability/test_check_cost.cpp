// Reliability, part 8 (docs/RELIABILITY.md, "Damaged databases": what the check costs): the
// integrity checks of Store::open on a large database of real rows, against the commands' own time.
// ATTNTUNE_CHECK_COST_MB sets the size (default 16, what CI runs; the figures in the doc are of
// 1024: `ATTNTUNE_CHECK_COST_MB=1024 build/tests/attntune_reliability_tests
// --gtest_filter='*CheckCost*'`).
//
// The database: campaign `k`, all 564 configs of the recorded H100 campaign (real evaluations, from
// `tune --simulate-db`), copied into one campaign per MiB of the target (200 evaluations each, each
// with its space's YAML), and the build cache filled with the rest: 80% of the file, as a database
// that has served many problems is (a flash_fwd_mma cubin is ~160 KB; one build serves every shape
// of a head dim, dtype and causality, but every config, arch and compiler version is a build).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>

#include "fault_util.hpp"

namespace attntune::reliability {
namespace test_check_cost {
namespace {

double median_of(std::vector<double> v) { return percentile(std::move(v), 50); }

template <class F>
double time_ms(F f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

void fill_large(const std::string& db, std::size_t target_mb) {
  sqlite::Connection c = sqlite::Connection::open(db, SQLITE_OPEN_READWRITE);
  c.exec("PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF");
  sqlite::Transaction tx(c);
  const std::int64_t k = [&] {
    sqlite::Statement st(c, "SELECT id FROM campaigns WHERE name = 'k'");
    st.step();
    return st.int64(0);
  }();
  // One campaign per MiB: k's first 200 evaluations, under another name and batch size.
  const std::size_t campaigns = std::max<std::size_t>(1, target_mb);
  for (std::size_t i = 0; i < campaigns; ++i) {
    sqlite::Statement(c,
                      "INSERT INTO campaigns (name, problem, b, h, hkv, s, sk, d, dtype, causal, page, varlen, lens_seed, "
                      "space_path, space_hash, family, strategy, seed, status, stop_reason, budget_evals, "
                      "budget_seconds, device_id, started_at, ended_at, space_text) SELECT ?1, problem, b + ?2, h, hkv, "
                      "s, sk, d, dtype, causal, page, varlen, lens_seed, space_path, space_hash, family, strategy, seed, "
                      "status, stop_reason, budget_evals, budget_seconds, device_id, started_at, ended_at, space_text "
                      "FROM campaigns WHERE id = ?3")
        .bind(fmt::format("copy{}", i), static_cast<std::int64_t>(i + 1), k)
        .run();
    const std::int64_t id = c.last_insert_rowid();
    sqlite::Statement(c,
                      "INSERT INTO campaign_spaces (campaign_id, family, space_path, space_hash, space_text) SELECT ?1, "
                      "family, space_path, space_hash, space_text FROM campaign_spaces WHERE campaign_id = ?2")
        .bind(id, k)
        .run();
    sqlite::Statement(c,
                      "INSERT INTO evaluations (campaign_id, seq, candidate_id, device_id, status, error, median_us, "
                      "min_us, max_us, stdev_us, count, tflops, max_abs_err, err_bound, evaluated_at, phase) SELECT ?1, "
                      "seq, candidate_id, device_id, status, error, median_us, min_us, max_us, stdev_us, count, tflops, "
                      "max_abs_err, err_bound, evaluated_at, phase FROM evaluations WHERE campaign_id = ?2 AND seq <= 200")
        .bind(id, k)
        .run();
  }
  // The build cache: 160 KB cubins until the file is target_mb.
  std::string cubin(160 * 1024, '\0');
  std::mt19937_64 rng(46);
  for (std::size_t i = 0; i < cubin.size(); i += 8) {
    const std::uint64_t r = rng();
    std::memcpy(&cubin[i], &r, 8);
  }
  const std::size_t builds = target_mb * 1024 * 1024 * 8 / 10 / cubin.size();
  sqlite::Statement put(c,
                        "INSERT INTO builds (source_hash, arch, nvrtc_version, options, status, cubin, log, registers) "
                        "VALUES (?1, ?2, '13.0', '-O3', 'ok', ?3, 'ptxas info    : Used 128 registers', 128)");
  for (std::size_t i = 0; i < builds; ++i) {
    cubin[i % cubin.size()] ^= 1;  // each cubin its own bytes
    put.reset();
    put.bind(fmt::format("{:064x}", i), i % 2 ? "sm_90" : "sm_80", sqlite::Blob{cubin}).run();
  }
  tx.commit();
  c.exec("PRAGMA wal_checkpoint(TRUNCATE)");
}

TEST(ReliabilityCheckCost, TheIntegrityChecksCostLittleOnALargeDatabase) {
  const char* env = std::getenv("ATTNTUNE_CHECK_COST_MB");
  const std::size_t target_mb = env && *env ? static_cast<std::size_t>(std::max(1, std::atoi(env))) : 16;
  TempDir dir;
  const Recording rec(dir);
  const std::string db = dir.file("large.db");
  ASSERT_EQ(run(rec.tune(db, "k", 0, {"--final-top", "5", "--final-rounds", "1"}), dir.path()).rc, 0);
  ASSERT_EQ(run(submit_args(db, {service_problem(0)}, 20), dir.path()).rc, 0);
  const double fill_s = time_ms([&] { fill_large(db, target_mb); }) / 1000;
  const std::uintmax_t bytes = fs::file_size(db);
  std::int64_t evaluations = 0, builds = 0;
  {
    sqlite::Connection c = sqlite::Connection::open(db, SQLITE_OPEN_READONLY);
    sqlite::Statement e(c, "SELECT (SELECT count(*) FROM evaluations), (SELECT count(*) FROM builds)");
    e.step();
    evaluations = e.int64(0), builds = e.int64(1);
  }
  std::printf("database: %.0f MB (%lld evaluations, %lld builds), filled in %.1f s\n", bytes / 1e6,
              static_cast<long long>(evaluations), static_cast<long long>(builds), fill_s);

  // The checks alone, in this process: open with and without them (median of 3, after one to warm
  // the page cache as any second command finds it).
  const auto open_ms = [&](Store::Mode mode, const Store::Options& o) {
    std::vector<double> t;
    for (int i = 0; i < 4; ++i) t.push_back(time_ms([&] { Store s = Store::open(db, mode, o); }));
    t.erase(t.begin());
    return median_of(t);
  };
  Store::Options none;
  none.check_integrity = false;
  Store::Options submit_scope;
  submit_scope.tables = {"queue"};
  const double writer_open = open_ms(Store::Mode::kExisting, none);
  const double whole_check = open_ms(Store::Mode::kExisting, {}) - writer_open;
  const double submit_check = open_ms(Store::Mode::kExisting, submit_scope) - writer_open;
  const double reader_open = open_ms(Store::Mode::kReadOnly, {});
  // Readers' part: SQLite's check of each page as it is read (cell_size_check), on the read that
  // touches the most: every page of the evaluations table.
  // Alternated, nine of each, so that the machine's load falls on both alike.
  std::vector<double> plain_t, checked_t;
  for (int i = 0; i < 18; ++i) {
    const bool check = i % 2;
    sqlite::Connection c = sqlite::Connection::open(db, SQLITE_OPEN_READONLY);
    if (check) c.exec("PRAGMA cell_size_check = ON");
    (check ? checked_t : plain_t).push_back(time_ms([&] {
      sqlite::Statement st(c, "SELECT count(*), sum(median_us), sum(length(error)) FROM evaluations");
      st.step();
    }));
  }
  const double scan_plain = median_of(plain_t), scan_checked = median_of(checked_t);

  // The commands, whole (fork to exit; median of 3 after one).
  const auto cmd_ms = [&](const std::vector<std::string>& args, int* rc = nullptr) {
    std::vector<double> t;
    for (int i = 0; i < 4; ++i) {
      const Ran r = run(args, dir.path());
      if (rc) *rc = r.rc;
      EXPECT_EQ(r.rc, 0) << fmt::format("{}", fmt::join(args, " ")) << ": " << r.err;
      t.push_back(r.ms);
    }
    t.erase(t.begin());
    return median_of(t);
  };
  struct Line {
    std::string command, check;
    double command_ms, check_ms;
  };
  std::vector<Line> lines = {
      {"best --campaign k", "schema, pages as read", cmd_ms({"best", "--db", db, "--campaign", "k"}), reader_open},
      {"best --top 5 (every campaign)", "schema, pages as read", cmd_ms({"best", "--db", db, "--top", "5"}), reader_open},
      {"campaigns", "schema, pages as read", cmd_ms({"campaigns", "--db", db, "--format", "json"}),
       reader_open + std::max(0.0, scan_checked - scan_plain)},
      {"status", "schema, pages as read", cmd_ms({"status", "--db", db}), reader_open},
      {"report --campaign k", "schema, pages as read", cmd_ms({"report", "--db", db, "--campaign", "k", "--format", "json"}),
       reader_open},
      {"export --campaign k", "schema, pages as read",
       cmd_ms({"export", "--db", db, "--campaign", "k", "-o", dir.file("k.cu")}), reader_open},
      {"submit --problem", "integrity_check(queue)",
       cmd_ms({"submit", "--db", db, "--problem", service_problem(1), "--budget-evals", "5"}), submit_check},
  };
  // The writers that check the whole file: once each (they change the database).
  const auto once = [&](const std::vector<std::string>& args) {
    const Ran r = run(args, dir.path());
    EXPECT_EQ(r.rc, 0) << r.err;
    return r.ms;
  };
  lines.push_back({"tune (simulated, 20 evaluations)", "integrity_check (whole file)",
                   once(rec.tune(db, "t", 0, {"--budget-evals", "20", "--final-top", "0"})), whole_check});
  lines.push_back({"serve --simulate (2 campaigns)", "integrity_check (whole file)",
                   once(serve_args(db, "0", 0)), whole_check});
  lines.push_back({"merge into a new file", "integrity_check of its input (whole)",
                   once({"merge", db, "-o", dir.file("merged.db")}), whole_check});

  std::printf("\n%-34s %-38s %12s %10s %8s\n", "command", "its check", "command ms", "check ms", "share");
  for (const Line& l : lines)
    std::printf("%-34s %-38s %12.1f %10.1f %7.1f%%\n", l.command.c_str(), l.check.c_str(), l.command_ms, l.check_ms,
                100 * l.check_ms / l.command_ms);
  std::printf("\nopen without checks %.1f ms (writer), reader open (header, schema) %.1f ms; a scan of every "
              "evaluation %.1f ms, %.1f ms with each page checked as read (cell_size_check)\n",
              writer_open, reader_open, scan_plain, scan_checked);
  std::printf("the whole-file check: %.0f ms for %.0f MB (%.2f s per GB); a GPU campaign's final re-timing alone "
              "takes ~35 s by default (eval/gpu_runner.hpp): %.1f%% of that\n",
              whole_check, bytes / 1e6, whole_check / 1000 / (bytes / 1e9), 100 * whole_check / 35000);
  double load[1] = {0};
  if (::getloadavg(load, 1) == 1) std::printf("machine load average %.1f (the timings scale with it)\n", load[0]);
  EXPECT_EQ(integrity_check(db), "ok");
}

}  // namespace
}  // namespace test_check_cost
}  // namespace attntune::reliability
