// Reliability, part 10a (docs/RELIABILITY.md, "Faults injected at every step"; issue 46): a disk
// that fills at >= 50 points of tune, serve, merge, export and report. Each command first runs with
// room to spare while the test samples how much of the disk it uses at its peak (its footprint);
// then it runs again, once per point, with only i/n of that footprint free, so that the disk fills
// at a different moment of its work each time, and once more (the next run) with room again.
//
// The disk is a private tmpfs: the test process moves into a mount namespace of its own (nothing it
// mounts outlives it or shows outside) and remounts the tmpfs at the size each point needs. Where
// mounting is not allowed, a file-size limit (RLIMIT_FSIZE) on the command stands in: writes past
// it fail with EFBIG as they would with ENOSPC.
//
// At every point: the command exits 0 (the room sufficed) or 3 with one line (a full disk); nothing
// committed before the run or by it is lost or changed; no output file is left half-written and no
// temporary file is left; the database passes SQLite's integrity check; and the next run, with
// room, exits 0 and leaves exactly what an uninterrupted run leaves (no evaluation written twice).
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/statvfs.h>

#include <atomic>
#include <thread>

#include "fault_util.hpp"

namespace attntune::reliability {
namespace test_full_disks {
namespace {

using namespace std::chrono_literals;

// A size-limited filesystem at `at` (a tmpfs), or a file-size limit where mounting is refused.
class LimitedDisk {
 public:
  explicit LimitedDisk(const fs::path& at) : at_(at) {
    fs::create_directories(at_);
    if (const char* no = std::getenv("ATTNTUNE_TEST_NO_TMPFS"); no && *no && *no != '0') {
      why_ = "ATTNTUNE_TEST_NO_TMPFS is set";  // to run the fallback where mounting works
      return;
    }
    static bool unshared = false;
    if (!unshared) {
      if (::unshare(CLONE_NEWNS) != 0) {
        why_ = fmt::format("unshare(CLONE_NEWNS): {}", std::strerror(errno));
        return;
      }
      // Nothing mounted from here on propagates to the rest of the machine.
      if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
        why_ = fmt::format("making / private: {}", std::strerror(errno));
        return;
      }
      unshared = true;
    }
    if (::mount("tmpfs", at_.c_str(), "tmpfs", 0, "size=256m,mode=0755") != 0) {
      why_ = fmt::format("mount -t tmpfs: {}", std::strerror(errno));
      return;
    }
    tmpfs_ = true;
  }
  ~LimitedDisk() {
    if (tmpfs_) ::umount2(at_.c_str(), MNT_DETACH);
  }
  bool tmpfs() const { return tmpfs_; }
  const std::string& why_not_tmpfs() const { return why_; }

  // Bytes in use on the tmpfs, or the largest file under it (a file-size limit applies per file).
  std::uint64_t used() const {
    if (tmpfs_) {
      struct statvfs v {};
      ::statvfs(at_.c_str(), &v);
      return (v.f_blocks - v.f_bfree) * v.f_frsize;
    }
    std::uint64_t largest = 0;
    std::error_code ec;
    for (const auto& e : fs::recursive_directory_iterator(at_, ec))
      if (e.is_regular_file(ec)) largest = std::max<std::uint64_t>(largest, e.file_size(ec));
    return largest;
  }
  // Leaves `free` bytes: the tmpfs's size (in pages) set to what is used and `free` more; or, with
  // a file-size limit, each file the next command writes may reach `free` bytes.
  void leave_free(std::uint64_t free) {
    const std::uint64_t bytes = tmpfs_ ? used() + free : free;
    if (tmpfs_) {
      const std::string opts = fmt::format("size={}k", (bytes + 4095) / 4096 * 4);
      if (::mount("tmpfs", at_.c_str(), "tmpfs", MS_REMOUNT, opts.c_str()) != 0)
        throw std::runtime_error(fmt::format("remount {}: {}", opts, std::strerror(errno)));
    } else {
      limit_ = std::max<std::uint64_t>(bytes, 1);
    }
  }
  void unlimited() {
    if (tmpfs_) {
      if (::mount("tmpfs", at_.c_str(), "tmpfs", MS_REMOUNT, "size=256m") != 0)
        throw std::runtime_error(fmt::format("remount: {}", std::strerror(errno)));
    }
    limit_.reset();
  }
  ProcOptions options() const {
    ProcOptions o;
    if (limit_) o.file_size_limit = static_cast<rlim_t>(*limit_);
    return o;
  }

 private:
  fs::path at_;
  bool tmpfs_ = false;
  std::string why_;
  std::optional<std::uint64_t> limit_;
};

// A command of the suite: where its inputs come from, what it runs, how its result is read.
struct Scenario {
  std::string name;
  int points;
  // Copies the inputs into `dir` (on the limited disk).
  std::function<void(const fs::path& dir)> setup;
  std::function<std::vector<std::string>(const fs::path& dir)> args;
  // The result, as a text to compare with the uninterrupted run's: database contents, output files.
  std::function<std::string(const fs::path& dir)> result;
  // The databases whose committed rows must survive (in `dir`).
  std::vector<std::string> databases;
  std::vector<std::string> outputs;  // files that must be whole or absent
};

std::string file_or_absent(const fs::path& p) { return fs::exists(p) ? read_bytes(p.string()) : "(absent)"; }

// Temporary files of core/output_file (".NAME.tmpPID.N") and SQLite's journals left behind.
std::vector<std::string> leftovers(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.find(".tmp") != std::string::npos || (name.size() > 8 && name.compare(name.size() - 8, 8, "-journal") == 0))
      out.push_back(name);
  }
  return out;
}

// Runs `args` and samples the disk's use until it ends: exit code and peak use.
std::pair<Ran, std::uint64_t> run_sampling(const std::vector<std::string>& args, const fs::path& dir,
                                           const LimitedDisk& disk) {
  std::atomic<bool> done{false};
  std::atomic<std::uint64_t> peak{disk.used()};
  std::thread sampler([&] {
    while (!done) {
      peak = std::max<std::uint64_t>(peak, disk.used());
      std::this_thread::sleep_for(200us);
    }
  });
  Ran r = run(args, dir, disk.options());
  done = true;
  sampler.join();
  return {r, peak.load()};
}

TEST(ReliabilityFullDisk, FiftyPointsOfTuneServeMergeExportAndReportLoseNothingAndTheNextRunCompletes) {
  TempDir dir;
  const Recording rec(dir);
  // The inputs, made once on the ordinary disk.
  const fs::path inputs = dir.path() / "inputs";
  fs::create_directories(inputs);
  const std::string k30 = (inputs / "k30.db").string(), queue = (inputs / "queue.db").string(),
                    other = (inputs / "o20.db").string(), ranked = (inputs / "ranked.db").string();
  ASSERT_EQ(run(rec.tune(k30, "k", 0, {"--budget-evals", "30", "--final-top", "0"}), dir.path()).rc, 0);
  // Exhaustive, so that a campaign resumed after the disk filled evaluates what an uninterrupted one
  // does (evo's proposals after a resume differ from its proposals without one).
  std::vector<std::string> submit = submit_args(queue, {service_problem(0), service_problem(1)}, 10);
  submit.insert(submit.end(), {"--strategy", "exhaustive"});
  ASSERT_EQ(run(submit, dir.path()).rc, 0);
  ASSERT_EQ(run(rec.tune(other, "o", 0, {"--budget-evals", "20", "--final-top", "2", "--final-rounds", "1"}),
                dir.path()).rc, 0);
  ASSERT_EQ(run(rec.tune(ranked, "k", 0, {"--budget-evals", "40", "--final-top", "3", "--final-rounds", "1"}),
                dir.path()).rc, 0);

  LimitedDisk disk(dir.path() / "disk");
  std::printf("disk: %s\n", disk.tmpfs() ? "a private tmpfs, remounted at each point's size"
                                         : ("a file-size limit (RLIMIT_FSIZE); no tmpfs: " + disk.why_not_tmpfs()).c_str());
  const auto copy_in = [](const std::string& from, const fs::path& to) { fs::copy_file(from, to); };

  const std::vector<Scenario> scenarios = {
      {"tune (resume 30 -> 60, re-time the top 3)", 14,
       [&](const fs::path& d) { copy_in(k30, d / "work.db"); },
       [&](const fs::path& d) {
         return rec.tune((d / "work.db").string(), "k", 0, {"--budget-evals", "60", "--final-top", "3", "--final-rounds", "1"});
       },
       [](const fs::path& d) { return content((d / "work.db").string()); }, {"work.db"}, {}},
      {"serve --simulate (2 exhaustive campaigns of 10)", 12,
       [&](const fs::path& d) { copy_in(queue, d / "work.db"); },
       [](const fs::path& d) { return serve_args((d / "work.db").string(), "0", 0); },
       [](const fs::path& d) { return content((d / "work.db").string()); }, {"work.db"}, {}},
      {"merge (two databases into a new one)", 10,
       [&](const fs::path& d) {
         copy_in(ranked, d / "a.db");
         copy_in(other, d / "b.db");
       },
       [](const fs::path& d) {
         return std::vector<std::string>{"merge", (d / "a.db").string(), (d / "b.db").string(), "-o",
                                         (d / "merged.db").string()};
       },
       [](const fs::path& d) { return fs::exists(d / "merged.db") ? content((d / "merged.db").string()) : "(absent)"; },
       {"a.db", "b.db"}, {"merged.db"}},
      {"export", 8, [&](const fs::path& d) { copy_in(ranked, d / "work.db"); },
       [](const fs::path& d) {
         return std::vector<std::string>{"export", "--db", (d / "work.db").string(), "--campaign", "k", "-o",
                                         (d / "k.cu").string()};
       },
       [](const fs::path& d) { return file_or_absent(d / "k.cu"); }, {"work.db"}, {"k.cu"}},
      {"report --plot", 8, [&](const fs::path& d) { copy_in(ranked, d / "work.db"); },
       [](const fs::path& d) {
         return std::vector<std::string>{"report", "--db", (d / "work.db").string(), "--campaign", "k", "--plot",
                                         (d / "k.svg").string()};
       },
       [](const fs::path& d) { return file_or_absent(d / "k.svg"); }, {"work.db"}, {"k.svg"}},
  };

  struct Tally {
    int points = 0, filled = 0, completed = 0, lost = 0, duplicated = 0, partial = 0, integrity = 0, next_failed = 0,
        differs = 0;
  };
  std::vector<std::string> failures;
  std::map<std::string, Tally> tallies;
  const auto t0 = Clock::now();
  int serial = 0;
  for (const Scenario& s : scenarios) {
    // The uninterrupted run: its result, and its footprint on the disk.
    const fs::path ref = dir.path() / "disk" / fmt::format("ref{}", serial++);
    fs::create_directories(ref);
    s.setup(ref);
    disk.unlimited();
    const std::uint64_t base = disk.used();
    const auto [ref_run, peak] = run_sampling(s.args(ref), dir.path(), disk);
    ASSERT_EQ(ref_run.rc, 0) << s.name << ": " << ref_run.err;
    const std::string expected = s.result(ref);
    // What the command needs: the disk space it takes at its peak; with a file-size limit, the size
    // of the largest file there at its peak.
    const std::uint64_t footprint = std::max<std::uint64_t>(disk.tmpfs() ? peak - std::min(peak, base) : peak, 4096);
    fs::remove_all(ref);
    Tally& t = tallies[s.name];

    for (int i = 0; i < s.points; ++i) {
      // With a file-size limit, the limit applies to the command's stderr too: from 64 KiB up, so
      // that its last line can still be written.
      const std::uint64_t floor = disk.tmpfs() ? 0 : std::min<std::uint64_t>(65536, footprint);
      const std::uint64_t free =
          floor + (footprint - floor) * static_cast<std::uint64_t>(i) / static_cast<std::uint64_t>(s.points);
      const fs::path d = dir.path() / "disk" / fmt::format("p{}", serial++);
      disk.unlimited();
      fs::create_directories(d);
      s.setup(d);
      std::map<std::string, Committed> before;
      for (const std::string& db : s.databases) before[db] = all_committed((d / db).string());
      disk.leave_free(free);
      const Ran r = run(s.args(d), dir.path(), disk.options());  // its stdout and stderr off the small disk
      disk.unlimited();
      const std::string where = fmt::format("{} with {} of {} bytes free", s.name, free, footprint);
      ++t.points;
      if (r.rc == 0) {
        ++t.completed;
      } else if (r.rc == 3) {
        ++t.filled;
        // The line that says so (serve: its worker's, then the supervisor's own error last).
        const auto ls = testing::lines(r.err);
        const bool says = std::any_of(ls.begin(), ls.end(), [](const std::string& l) {
          return l.find("cannot be written: no space left") != std::string::npos;
        });
        if (ls.empty() || ls.back().rfind("attntune: error: ", 0) != 0 || !says)
          failures.push_back(where + ": exit 3 without the line saying the disk is full: " + r.err);
      } else {
        failures.push_back(fmt::format("{}: exit {}: {}", where, r.rc, r.err));
      }
      // No output half-written, no temporary file left.
      if (r.rc != 0)
        for (const std::string& out : s.outputs)
          if (fs::exists(d / out)) ++t.partial, failures.push_back(where + ": " + out + " left after the failure");
      for (const std::string& left : leftovers(d)) ++t.partial, failures.push_back(where + ": left " + left);
      // Nothing committed lost or changed; the files whole.
      std::map<std::string, Committed> after;
      for (const std::string& db : s.databases) {
        const std::string path = (d / db).string();
        const std::string ic = integrity_check(path);
        if (ic != "ok") ++t.integrity, failures.push_back(where + ": " + db + ": integrity check: " + ic);
        after[db] = all_committed(path);
        for (const std::string& l : lost_rows(before[db], after[db]))
          ++t.lost, failures.push_back(fmt::format("{}: {}: evaluation {} lost or changed", where, db, l));
      }
      // The next run, with room: completes, and leaves what the uninterrupted run left.
      const Ran next = run(s.args(d), dir.path());
      if (next.rc != 0) ++t.next_failed, failures.push_back(fmt::format("{}: the next run: exit {}: {}", where, next.rc, next.err));
      for (const std::string& db : s.databases)
        for (const std::string& l : lost_rows(after[db], all_committed((d / db).string())))
          ++t.lost, failures.push_back(fmt::format("{}: {}: evaluation {} committed by the failed run lost", where, db, l));
      for (const std::string& db : s.databases)
        if (const std::int64_t twice = written_twice((d / db).string()); twice != 0)
          t.duplicated += static_cast<int>(twice), failures.push_back(fmt::format("{}: {}: {} written twice", where, db, twice));
      if (s.result(d) != expected) {
        ++t.differs;
        failures.push_back(where + ": the next run's result differs from an uninterrupted run's");
      }
      fs::remove_all(d);
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("\n%-44s %6s %6s %9s %5s %10s %7s %9s %9s %7s\n", "command", "points", "full", "completed", "lost",
              "duplicated", "partial", "integrity", "next run", "differs");
  int points = 0;
  for (const auto& [name, t] : tallies) {
    std::printf("%-44s %6d %6d %9d %5d %10d %7d %9d %9d %7d\n", name.c_str(), t.points, t.filled, t.completed, t.lost,
                t.duplicated, t.partial, t.integrity, t.next_failed, t.differs);
    points += t.points;
  }
  std::printf("%d points in %.1f s\n", points, seconds);
  EXPECT_GE(points, 50);
  for (const std::string& f : failures) ADD_FAILURE() << f;
}

}  // namespace
}  // namespace test_full_disks
}  // namespace attntune::reliability
