// The shipped database of tuned results (docs/design/shipped_db.md): `best` and `export` answer
// from it, saying so, when the user's database has nothing for the problem; the user's own result
// wins; --no-shipped and ATTNTUNE_SHIPPED_DB="" turn it off; a damaged one is refused only where an
// answer depends on it; `tune` warm-starts from it; and the plan it is rebuilt from is broad and
// served. Real binary, real files: the recorded suite (tests/data/campaigns/h100-suite.db, the
// shipped file's first content) copied as the shipped file, so that a template change stales one
// fixture (tools/rerecord_suite.sh), not two; the repository's own shipped file where its location
// is the point (`best` only: it answers from stale kernels too, export refuses them).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <sqlite3.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../tune/tune_test_util.hpp"
#include "cuda/driver.hpp"
#include "db/sqlite.hpp"
#include "export/select.hpp"
#include "service/job.hpp"
#include "service/plan.hpp"

namespace attntune::test {
namespace test_shipped_db {
namespace {

namespace fs = std::filesystem;
using testing::run_attntune;

// A problem of the shipped suite (campaign b4-s4k-d128-bf16), and one that no campaign has.
const std::string kShippedProblem = "b=4,h=16,hkv=16,s=4096,sk=4096,d=128,dtype=bf16,causal=0";
const std::string kOtherProblem = "b=2,h=8,hkv=8,s=1024,sk=1024,d=64,dtype=bf16,causal=1";

std::string repo_shipped() { return testing::source_dir() + "/db/shipped/attntune-shipped.db"; }
std::string recorded_suite() { return testing::source_dir() + "/tests/data/campaigns/h100-suite.db"; }
// tools/build_shipped_db.sh as the tests run it: with this build's binary.
std::string build_script() {
  return "ATTNTUNE_BIN=" + testing::attntune_bin() + " " + testing::source_dir() + "/tools/build_shipped_db.sh";
}

// The build script's plan of 4 problems on a simulated GPU (6 evaluations of 300 ms each), into `out`
// with the working database in `work`, its output in `log`; `seconds`: --serve-seconds ("": none).
// Its exit code.
int simulated_build(const std::string& work, const std::string& out, const std::string& log,
                    const std::string& seconds) {
  const std::string cmd = build_script() + " --simulate --simulate-delay-ms 300 --limit 4 --gpus 0 --work " + work +
                          " --out " + out + (seconds.empty() ? "" : " --serve-seconds " + seconds) +
                          " -- --budget-evals 6 --final-top 0 >" + log + " 2>&1";
  return WEXITSTATUS(std::system(cmd.c_str()));
}

// The build script's first `limit` problems on a simulated GPU, fast (1 ms a candidate, `budget`
// evaluations, no final ranking), into `out` with the working database in `work`, `extra` among the
// script's options; its exit code.
int rehearsal(const std::string& work, const std::string& out, const std::string& log, int limit, int budget,
              const std::string& extra = "") {
  const std::string cmd = fmt::format("{} --simulate --simulate-delay-ms 1 --limit {} --gpus 0 --work {} --out {} {} -- "
                                      "--budget-evals {} --final-top 0 >{} 2>&1",
                                      build_script(), limit, work, out, extra, budget, log);
  return WEXITSTATUS(std::system(cmd.c_str()));
}

// Sets $ATTNTUNE_SHIPPED_DB for the commands a test runs (the test binary sets it to "" for all
// others: tests/common/no_shipped_db.cpp); nullptr unsets it (the default locations).
class ShippedEnv {
 public:
  explicit ShippedEnv(const char* value) {
    if (value) ::setenv("ATTNTUNE_SHIPPED_DB", value, 1);
    else ::unsetenv("ATTNTUNE_SHIPPED_DB");
  }
  explicit ShippedEnv(const std::string& value) : ShippedEnv(value.c_str()) {}
  ~ShippedEnv() { ::setenv("ATTNTUNE_SHIPPED_DB", "", 1); }
};

class ShippedDb : public ::testing::Test {
 protected:
  void SetUp() override {
    shipped_ = dir_.file("attntune-shipped.db");
    fs::copy_file(recorded_suite(), shipped_);
  }
  // One ok result of `median_us` for `spec` in campaign `name` of `db` (created if missing), with a
  // valid config of flash_fwd_mma's space, stored with the space so that it exports.
  static void add_result(const std::string& db, const std::string& spec, const std::string& name, double median_us) {
    const SearchSpace space = SearchSpace::load(space_file());
    const Problem problem = Problem::parse(spec);
    Store store = Store::open(db, Store::Mode::kCreate);
    const std::int64_t dev = store.upsert_device({"NVIDIA H100 80GB HBM3", "sm_90", "GPU-mine", 132, "580"});
    CampaignSpec c;
    c.name = name;
    c.problem = problem;
    c.space_path = space_file();
    c.space_hash = space.hash();
    c.space_text = space.text();
    c.family = space.family();
    c.strategy = "evo";
    const std::int64_t id = store.open_campaign(c, dev);
    const Config cfg = space.enumerate(problem, "sm_90").front();
    const std::string source_hash = render_kernel(space, cfg, problem, "sm_90").source_hash;
    store.record_evaluation(id, store.upsert_candidate(space.family(), cfg, source_hash), dev,
                            recorded_ok(median_us, problem));
    store.finish_campaign(id, "completed", "budget");
  }
  std::string db(const std::string& name = "mine.db") const { return dir_.file(name); }
  std::string best(const std::string& database, const std::string& extra = "") const {
    return "best --problem " + kShippedProblem + " --format json --db " + database + " " + extra;
  }

  TempDir dir_;
  std::string shipped_;
};

nlohmann::json parse(const std::string& text) { return nlohmann::json::parse(text); }

TEST_F(ShippedDb, BestAnswersFromItWhenTheDatabaseHasNoResultAndSaysSoInOneLine) {
  ShippedEnv env(shipped_);
  add_result(db(), kOtherProblem, "mine", 100.0);  // a database, with another problem's result
  for (const std::string& database : {db(), db("absent.db")}) {  // and none at all (day one)
    const auto r = run_attntune(best(database, "--top 3"));
    ASSERT_EQ(r.rc, 0) << r.err;
    const auto rows = parse(r.out);
    ASSERT_FALSE(rows.empty());
    EXPECT_EQ(rows[0]["campaign"], "b4-s4k-d128-bf16");
    for (const auto& row : rows) EXPECT_EQ(row["source"], "shipped") << row.dump();
    ASSERT_EQ(testing::lines(r.err).size(), 1u) << r.err;
    for (const std::string& part :
         {"attntune: note: no result for problem " + kShippedProblem + " in database '" + database + "'",
          "the shipped database '" + shipped_ + "'", std::string("NVIDIA H200"), std::string("2026-11-29"),
          "attntune tune --problem " + kShippedProblem + " to measure on your GPU"})
      EXPECT_NE(r.err.find(part), std::string::npos) << part << " is not in: " << r.err;

    // The same rows as asking the shipped file itself, where they are the database's own.
    const auto direct = run_attntune(best(shipped_, "--top 3"));
    ASSERT_EQ(direct.rc, 0) << direct.err;
    EXPECT_TRUE(direct.err.empty()) << direct.err;
    auto same = parse(direct.out);
    for (auto& row : same) {
      EXPECT_EQ(row["source"], "database");
      row["source"] = "shipped";
    }
    EXPECT_EQ(same, rows);
  }
}

TEST_F(ShippedDb, TheUsersOwnResultWinsEvenWhenTheShippedOneIsFaster) {
  ShippedEnv env(shipped_);
  add_result(db(), kShippedProblem, "mine", 99999.0);
  const auto r = run_attntune(best(db()));
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto rows = parse(r.out);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["campaign"], "mine");
  EXPECT_EQ(rows[0]["source"], "database");
  EXPECT_TRUE(r.err.empty()) << r.err;

  const auto e = run_attntune("export --problem " + kShippedProblem + " --db " + db() + " -o " + dir_.file("k.cu"));
  ASSERT_EQ(e.rc, 0) << e.err;
  EXPECT_EQ(e.err.find("shipped"), std::string::npos) << e.err;
  EXPECT_EQ(read_bytes(dir_.file("k.cu")).find("//   source "), std::string::npos);
}

TEST_F(ShippedDb, NoShippedAnEmptyVariableAndTheFiltersTurnItOff) {
  add_result(db(), kOtherProblem, "mine", 100.0);
  {
    ShippedEnv env(shipped_);
    const auto off = run_attntune(best(db(), "--no-shipped"));
    EXPECT_EQ(off.rc, 1) << off.err;
    EXPECT_NE(off.err.find("no valid results for problem " + kShippedProblem), std::string::npos) << off.err;
    EXPECT_EQ(off.err.find("shipped"), std::string::npos) << off.err;
    // --gpu and --arch select among the shipped results too: an H200's times are not an H100's.
    const auto h100 = run_attntune(best(db(), "--gpu 'NVIDIA H100 80GB HBM3'"));
    EXPECT_EQ(h100.rc, 1) << h100.err;
    const auto e = run_attntune("export --problem " + kShippedProblem + " --arch sm_80 --db " + db() + " -o " +
                                dir_.file("k.cu"));
    EXPECT_EQ(e.rc, 1) << e.err;
    EXPECT_FALSE(fs::exists(dir_.file("k.cu")));
    const auto e_off = run_attntune("export --no-shipped --problem " + kShippedProblem + " --db " + db() + " -o " +
                                    dir_.file("k.cu"));
    EXPECT_EQ(e_off.rc, 1) << e_off.err;
    // Without a database and without the shipped one: the usual error for a missing database.
    const auto absent = run_attntune(best(db("absent.db"), "--no-shipped"));
    EXPECT_EQ(absent.rc, 2) << absent.err;
    EXPECT_NE(absent.err.find("does not exist"), std::string::npos) << absent.err;
  }
  ShippedEnv none("");
  const auto r = run_attntune(best(db()));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(r.err.find("shipped"), std::string::npos) << r.err;
}

// A problem neither database holds: the error says that both were asked and what measures it, for
// a user with a database and for one without (day one), from `best` and from `export` alike.
TEST_F(ShippedDb, AProblemNeitherDatabaseHoldsIsAnErrorThatSaysBothWereAsked) {
  ShippedEnv env(shipped_);
  const std::string unseen = "b=3,h=12,hkv=4,s=777,sk=777,d=128,dtype=bf16,causal=1";
  add_result(db(), kOtherProblem, "mine", 100.0);
  const std::string either = "; the shipped database '" + shipped_ + "' has none for it either: attntune tune --problem " +
                             unseen + " measures it on your GPU";
  struct Case {
    std::string database, error;
    int rc;
  };
  for (const Case& c : {Case{db("absent.db"), "database '" + db("absent.db") + "' does not exist", 2},
                        Case{db(), "no valid results for problem " + unseen + " in database '" + db() + "'", 1}}) {
    const auto b = run_attntune("best --problem " + unseen + " --db " + c.database);
    EXPECT_EQ(b.rc, c.rc) << b.err;
    EXPECT_NE(b.err.find(c.error), std::string::npos) << b.err;
    EXPECT_NE(b.err.find(either), std::string::npos) << b.err;
    const auto e = run_attntune("export --problem " + unseen + " --db " + c.database + " -o " + dir_.file("k.cu"));
    EXPECT_EQ(e.rc, c.rc) << e.err;
    EXPECT_NE(e.err.find(c.error), std::string::npos) << e.err;
    EXPECT_NE(e.err.find(either), std::string::npos) << e.err;
    EXPECT_FALSE(fs::exists(dir_.file("k.cu")));
    // Without the shipped database the error names the user's alone.
    const auto off = run_attntune("best --no-shipped --problem " + unseen + " --db " + c.database);
    EXPECT_EQ(off.rc, c.rc) << off.err;
    EXPECT_EQ(off.err.find("shipped"), std::string::npos) << off.err;
  }
}

TEST_F(ShippedDb, TheDefaultIsTheSourceTreesFile) {
  ShippedEnv unset(nullptr);
  const auto r = run_attntune(best(db("absent.db")));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(parse(r.out)[0]["source"], "shipped");
  EXPECT_NE(r.err.find("'" + repo_shipped() + "'"), std::string::npos) << r.err;
}

TEST_F(ShippedDb, AnInstalledBinaryFindsItInShareBesideIt) {
  // prefix/bin/attntune and prefix/share/attntune/attntune-shipped.db, as `cmake --install` lays
  // them out; the install tree is beside the binary (a hard link needs the same filesystem).
  const fs::path prefix = fs::path(testing::attntune_bin()).parent_path() / ("install-test-" + std::to_string(::getpid()));
  fs::remove_all(prefix);
  fs::create_directories(prefix / "bin");
  fs::create_directories(prefix / "share" / "attntune");
  std::error_code ec;
  fs::create_hard_link(testing::attntune_bin(), prefix / "bin" / "attntune", ec);
  if (ec) fs::copy_file(testing::attntune_bin(), prefix / "bin" / "attntune");
  const std::string installed = (prefix / "share" / "attntune" / "attntune-shipped.db").string();
  fs::copy_file(shipped_, installed);
  ShippedEnv unset(nullptr);
  ::setenv("ATTNTUNE_BIN", (prefix / "bin" / "attntune").c_str(), 1);
  const auto r = run_attntune(best(db("absent.db")));
  ::unsetenv("ATTNTUNE_BIN");
  fs::remove_all(prefix);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("'" + installed + "'"), std::string::npos) << r.err;
}

TEST_F(ShippedDb, ADamagedFileIsRefusedWhereAnAnswerDependsOnItAndUnreadOtherwise) {
  // Two kinds of damage the store's readers refuse: a header that is not SQLite's, a truncated file.
  const std::string bytes = read_bytes(shipped_);
  for (const std::string& damaged : {"not an sqlite db" + bytes.substr(16), bytes.substr(0, bytes.size() / 2)}) {
    write_bytes(shipped_, damaged);
    ShippedEnv env(shipped_);
    const auto r = run_attntune(best(db("absent.db")));
    EXPECT_EQ(r.rc, 2) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    for (const std::string& part : {std::string("attntune: error: the shipped database cannot be used: "), shipped_,
                                    std::string("--no-shipped")})
      EXPECT_NE(r.err.find(part), std::string::npos) << part << " is not in: " << r.err;
    const auto e = run_attntune("export --problem " + kShippedProblem + " --db " + db("absent.db") + " -o " +
                                dir_.file("k.cu"));
    EXPECT_EQ(e.rc, 2) << e.err;
    EXPECT_NE(e.err.find("the shipped database cannot be used"), std::string::npos) << e.err;
    EXPECT_FALSE(fs::exists(dir_.file("k.cu")));
    EXPECT_EQ(read_bytes(shipped_), damaged);  // never written
  }
  // Not needed: the user's own result answers and the damaged file is never read.
  add_result(db(), kShippedProblem, "mine", 1000.0);
  ShippedEnv env(shipped_);
  const auto r = run_attntune(best(db()));
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST_F(ShippedDb, ExportAnswersFromItAndItsProvenanceNamesIt) {
  ShippedEnv env(shipped_);
  const std::string cu = dir_.file("k.cu");
  const auto r = run_attntune("export --problem " + kShippedProblem + " --db " + db("absent.db") + " -o " + cu);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("answering from the shipped database '" + shipped_ + "'"), std::string::npos) << r.err;
  const std::string text = read_bytes(cu);
  EXPECT_NE(text.find("//   source        \"shipped database attntune-shipped.db\"\n"), std::string::npos);
  EXPECT_NE(text.find("//   campaign      \"b4-s4k-d128-bf16\"\n"), std::string::npos);
  // No path of this machine in the file (docs/CONTRACT.md: provenance without the tuning machine's paths).
  EXPECT_EQ(text.find(dir_.path().string()), std::string::npos);
}

TEST_F(ShippedDb, ExportAllBestOfAPlanTakesWhatTheDatabaseLacksFromIt) {
  // The user's database: the suite without b8-s2k-d64-causal-bf16.
  fs::copy_file(shipped_, db());
  {
    sqlite::Connection c = sqlite::Connection::open(db(), SQLITE_OPEN_READWRITE);
    c.exec("PRAGMA foreign_keys = ON; DELETE FROM campaigns WHERE name = 'b8-s2k-d64-causal-bf16'");
  }
  const std::string plan = dir_.file("plan.yaml");
  write_bytes(plan, "model: t\nproblems:\n"
                    "  - {problem: \"" + kShippedProblem + "\", regime: prefill}\n"
                    "  - {problem: \"b=8,h=16,s=2048,d=64,dtype=bf16,causal=1\", regime: prefill}\n"
                    "  - {problem: \"b=3,h=16,s=2048,d=64,dtype=bf16,causal=1\", regime: prefill}\n");
  ShippedEnv env(shipped_);
  const std::string cu = dir_.file("all.cu");
  const auto r = run_attntune("export --all-best --plan " + plan + " --db " + db() + " -o " + cu);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("exported 2 kernels"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("no result for 1 of the plan's 3 problems in database '" + db() + "'"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("1 of the plan's 3 problems have no result yet"), std::string::npos) << r.err;
  const std::string text = read_bytes(cu);
  std::size_t sources = 0;
  for (std::size_t at = text.find("//   source "); at != std::string::npos; at = text.find("//   source ", at + 1))
    ++sources;
  EXPECT_EQ(sources, 1u);  // the b8 kernel's; the b4 one is the user's own

  const auto off = run_attntune("export --no-shipped --all-best --plan " + plan + " --db " + db() + " -o " + cu);
  ASSERT_EQ(off.rc, 0) << off.err;
  EXPECT_NE(off.out.find("exported 1 kernel "), std::string::npos) << off.out;
}

// Which GPU model answers a problem whose results span several: the only one, else the preferred
// one (this machine's) when it is among them, else none (the command refuses, naming them).
TEST(ShippedGpu, TheOnlyModelElseThisMachinesElseNone) {
  const std::vector<std::string> both = {"NVIDIA H100 80GB HBM3", "NVIDIA H200"};
  EXPECT_EQ(pick_gpu_model({"NVIDIA H200"}, std::nullopt), "NVIDIA H200");
  EXPECT_EQ(pick_gpu_model({"NVIDIA H200"}, "NVIDIA L4"), "NVIDIA H200");
  EXPECT_EQ(pick_gpu_model(both, "NVIDIA H100 80GB HBM3"), "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(pick_gpu_model(both, "NVIDIA H200"), "NVIDIA H200");
  EXPECT_FALSE(pick_gpu_model(both, "NVIDIA L4"));
  EXPECT_FALSE(pick_gpu_model(both, std::nullopt));
  EXPECT_FALSE(pick_gpu_model({}, "NVIDIA H200"));
}

// A shipped file holding one problem measured on two GPU models (H200 and H100 builds in one file):
// `best` and `export` answer for this machine's model when it is one of them; without a GPU (or on
// another model) they refuse as for the user's own database, naming both, until --gpu picks one;
// a problem shipped for one model only is answered by it whatever this machine is.
TEST_F(ShippedDb, AProblemShippedForTwoGpuModelsIsAnsweredForThisMachinesOrNamesThem) {
  add_result(shipped_, kShippedProblem, "b4-s4k-d128-bf16@h100", 800.0);  // the suite's is an H200's
  const std::string h100 = "NVIDIA H100 80GB HBM3";
  ShippedEnv env(shipped_);
  const std::optional<std::string> here = cuda::first_device_name();
  const std::optional<std::string> expected = pick_gpu_model({h100, "NVIDIA H200"}, here);
  const auto r = run_attntune(best(db("absent.db")));
  if (expected) {
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(parse(r.out)[0]["gpu"], *expected) << r.out;
    EXPECT_NE(r.err.find("(measured on " + *expected), std::string::npos) << r.err;
  } else {
    EXPECT_EQ(r.rc, 2) << r.out;
    for (const std::string& part : {std::string("several GPU models"), h100, std::string("NVIDIA H200"),
                                    std::string("--gpu"), shipped_})
      EXPECT_NE(r.err.find(part), std::string::npos) << part << " is not in: " << r.err;
  }
  // --gpu picks either, on any machine; best and export agree.
  for (const auto& [gpu, campaign] : std::vector<std::pair<std::string, std::string>>{
           {h100, "b4-s4k-d128-bf16@h100"}, {"NVIDIA H200", "b4-s4k-d128-bf16"}}) {
    const auto one = run_attntune(best(db("absent.db"), "--gpu '" + gpu + "'"));
    ASSERT_EQ(one.rc, 0) << one.err;
    EXPECT_EQ(parse(one.out)[0]["campaign"], campaign);
    EXPECT_EQ(parse(one.out)[0]["source"], "shipped");
    const std::string cu = dir_.file("k.cu");
    const auto e = run_attntune("export --problem " + kShippedProblem + " --gpu '" + gpu + "' --db " +
                                db("absent.db") + " -o " + cu);
    ASSERT_EQ(e.rc, 0) << e.err;
    EXPECT_NE(read_bytes(cu).find("//   campaign      \"" + campaign + "\"\n"), std::string::npos) << campaign;
  }
  const auto e = run_attntune("export --problem " + kShippedProblem + " --db " + db("absent.db") + " -o " +
                              dir_.file("k2.cu"));
  EXPECT_EQ(e.rc, expected ? 0 : 2) << e.err;
  // A problem the file holds for the H200 only: answered by it wherever this runs.
  const auto other = run_attntune("best --format json --db " + db("absent.db") +
                                  " --problem b=8,h=16,hkv=16,s=2048,sk=2048,d=64,dtype=bf16,causal=1");
  ASSERT_EQ(other.rc, 0) << other.err;
  EXPECT_EQ(parse(other.out)[0]["gpu"], "NVIDIA H200");
}

// `tune` on a problem its database has no neighbour for starts from the nearest shipped campaign of
// the template (a recorded campaign stands in for the GPU, as in the other tune tests).
TEST_F(ShippedDb, TuneWarmStartsFromItWhenTheDatabaseHasNoNeighbour) {
  const char* spec = "b=2,h=16,hkv=16,s=6000,sk=6000,d=128,dtype=bf16,causal=0";
  const std::string rec = dir_.file("rec.db");
  make_recording(rec, spec);
  auto tune = [&](const std::string& database, const std::string& extra) {
    return run_attntune("tune --space " + space_file() + " --problem " + spec + " --db " + database +
                        " --simulate-db " + rec + " --simulate-campaign rec --simulate-delay-ms 0 --budget-evals 12 "
                        "--patience 0 --final-top 0 --seed 3 --campaign t " + extra);
  };
  // What the warm start should take: the nearest shipped campaign's best configs (same template,
  // same head dim and layout, service::problem_distance).
  Store shipped_store = Store::open(shipped_, Store::Mode::kReadOnly);
  double warm_us = 0;
  std::size_t problems = 0;
  const auto [nearest, warm] =
      service::warm_start(shipped_store, "flash_fwd_mma", Problem::parse(spec), 8, &warm_us, &problems);
  ASSERT_TRUE(nearest);
  EXPECT_EQ(nearest->str(), kShippedProblem);
  ASSERT_FALSE(warm.empty());
  {  // and the time of its first config there, the best (the warm-up's priors, AllocationOptions)
    BestQuery q;
    q.problem = *nearest;
    const std::vector<BestRow> best = shipped_store.best(q);
    ASSERT_FALSE(best.empty());
    EXPECT_EQ(config_str(best[0].config), config_str(warm[0]));
    EXPECT_DOUBLE_EQ(warm_us, best[0].median_us);
  }

  ShippedEnv env(shipped_);
  const auto r = tune(db(), "");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find(fmt::format("warm start: {} configs from {}{} of the shipped database '{}'", warm.size(),
                                   kShippedProblem,
                                   problems > 1 ? fmt::format(" and {} problems near it", problems - 1) : "",
                                   shipped_)),
            std::string::npos)
      << r.err;
  // Evo's first batch is the warm start: the campaign's first evaluations are those configs.
  const SearchSpace space = SearchSpace::load(space_file());
  std::set<std::string> valid, expected, first;
  for (const Config& c : space.enumerate(Problem::parse(spec), "sm_90")) valid.insert(config_str(c));
  for (const Config& c : warm)
    if (valid.count(config_str(c))) expected.insert(config_str(c));
  ASSERT_FALSE(expected.empty());
  {
    Store mine = Store::open(db(), Store::Mode::kReadOnly);
    const auto evals = mine.campaign_evaluations(*mine.find_campaign("t"));
    ASSERT_GE(evals.size(), expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) first.insert(config_str(evals[i].config));
  }
  EXPECT_EQ(first, expected);

  // --warm-start 0: no warm start at all.
  const auto cold = tune(db("cold.db"), "--warm-start 0");
  ASSERT_EQ(cold.rc, 0) << cold.err;
  EXPECT_EQ(cold.err.find("warm start"), std::string::npos) << cold.err;

  // A neighbour in the user's own database comes first.
  add_result(db("near.db"), "b=2,h=16,hkv=16,s=8192,sk=8192,d=128,dtype=bf16,causal=0", "near", 500.0);
  const auto own = tune(db("near.db"), "");
  ASSERT_EQ(own.rc, 0) << own.err;
  EXPECT_NE(own.err.find("warm start: 1 configs from b=2,h=16,hkv=16,s=8192,sk=8192,d=128,dtype=bf16,causal=0\n"),
            std::string::npos)
      << own.err;
  EXPECT_EQ(own.err.find("shipped"), std::string::npos) << own.err;

  // A damaged shipped file only costs the warm start: a warning, and the campaign runs.
  write_bytes(shipped_, "not an sqlite db" + read_bytes(shipped_).substr(16));
  const auto damaged = tune(db("damaged.db"), "");
  ASSERT_EQ(damaged.rc, 0) << damaged.err;
  EXPECT_NE(damaged.err.find("attntune: warning: the shipped database cannot be used: "), std::string::npos)
      << damaged.err;
  EXPECT_EQ(damaged.err.find("warm start:"), std::string::npos) << damaged.err;
}

// The plan tools/build_shipped_db.sh tunes: broad (issue 43: >= 200 problems over the common
// families' shapes) and every problem served by a shipped space with valid configs.
TEST(ShippedPlan, HoldsAtLeast200DistinctProblemsThatTheShippedSpacesServe) {
  TempDir dir;
  const std::string plan_path = dir.file("plan.yaml");
  ASSERT_EQ(std::system(("python3 " + testing::source_dir() + "/tools/shipped_plan.py --bin " +
                          testing::attntune_bin() + " -o " + plan_path)
                             .c_str()),
            0);
  const Plan plan = Plan::load(plan_path);  // refuses a problem listed twice
  ASSERT_GE(plan.entries.size(), 200u);
  // Day one: every problem of a user's default `plan --model` for the shipped models is in it, the
  // variants of the windowed, soft-capped, sink and MLA models included, so `export --all-best
  // --plan` can answer the whole plan from the shipped database.
  std::set<std::string> listed;
  for (const PlanEntry& e : plan.entries) listed.insert(e.problem.str());
  for (const char* model : {"llama3_8b", "mistral_7b_v01", "gpt_oss_20b", "gemma2_9b", "deepseek_v3", "llama2_7b"}) {
    const auto r = run_attntune(fmt::format("plan --model {}/tests/data/models/{}.json --format json",
                                            testing::source_dir(), model));
    ASSERT_EQ(r.rc, 0) << r.err;
    const auto problems = nlohmann::json::parse(r.out)["problems"];
    ASSERT_FALSE(problems.empty()) << model;
    for (const auto& p : problems)
      EXPECT_TRUE(listed.count(p["problem"].get<std::string>())) << model << ": " << p["problem"];
  }
  std::set<std::int64_t> heads, groups, dims, seqlens, batches, pages, chunked_dims;
  std::set<bool> causal;
  for (const PlanEntry& e : plan.entries) {
    const Problem& p = e.problem;
    if (e.regime == "prefill") {
      heads.insert(p.h);
      groups.insert(p.h / p.hkv);
      dims.insert(p.d);
      seqlens.insert(p.s);
      causal.insert(p.causal);
      if (p.s < p.sk) chunked_dims.insert(p.d);
    } else {
      ASSERT_EQ(e.regime, "decode");
      batches.insert(p.b);
      pages.insert(p.page);
    }
    std::uint64_t configs = 0;
    for (const CampaignSpace& c : service::default_spaces(p)) {  // InputError: no template serves it
      const std::optional<SearchSpace> space = SearchSpace::shipped(c.family);
      ASSERT_TRUE(space);
      configs += space->count(p, space->default_arch());
    }
    EXPECT_GT(configs, 0u) << p.str();
  }
  EXPECT_EQ(*heads.begin(), 8);
  EXPECT_EQ(*heads.rbegin(), 128);
  EXPECT_EQ(*groups.begin(), 1);
  EXPECT_EQ(*groups.rbegin(), 71);  // Falcon-7B's multi-query attention (the grid's largest: 16)
  EXPECT_TRUE(groups.count(16));
  EXPECT_EQ(dims, (std::set<std::int64_t>{64, 128, 192, 256}));  // 192: DeepSeek-V3's MLA prefill
  EXPECT_EQ(causal.size(), 2u);
  EXPECT_EQ(*seqlens.begin(), 512);
  EXPECT_EQ(*seqlens.rbegin(), 32768);
  EXPECT_EQ(*batches.begin(), 1);
  EXPECT_EQ(*batches.rbegin(), 256);
  EXPECT_EQ(pages, (std::set<std::int64_t>{16, 64}));
  // Chunked prefills (fewer queries than keys, bottom-right causal) at every head dim of the grid:
  // the warm start of a user's chunk had no neighbour of its kind (run 284).
  for (const std::int64_t d : {64, 128, 256}) EXPECT_TRUE(chunked_dims.count(d)) << d;

  // And the service takes it: `submit` queues every problem (what tools/build_shipped_db.sh runs).
  const auto r = run_attntune("submit " + plan_path + " --db " + dir.file("q.db") + " --format json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto queued = nlohmann::json::parse(r.out);
  ASSERT_EQ(queued.size(), plan.entries.size());
  for (const auto& q : queued) EXPECT_EQ(q["queued"], true) << q.dump();
}

// The repository keeps the shipped file packed (db/shipped/attntune-shipped.db.tar.xz,
// tools/shipped_archive.py); the build unpacks it where attntune and these tests read it.
std::string archive_tool() { return "python3 " + testing::source_dir() + "/tools/shipped_archive.py"; }
int sh(const std::string& cmd) { return WEXITSTATUS(std::system(cmd.c_str())); }

TEST(ShippedArchive, TheBuildUnpackedTheTrackedArchive) {
  EXPECT_EQ(sh(archive_tool() + " check " + repo_shipped() + ".tar.xz " + repo_shipped()), 0)
      << "the shipped database is not what its archive holds";
}

TEST(ShippedArchive, PacksTheSameBytesTwiceUnpacksTheFileAndChecksIt) {
  TempDir dir;
  const std::string db = dir.file("x.db"), a1 = dir.file("a1.tar.xz"), a2 = dir.file("a2.tar.xz");
  fs::copy_file(recorded_suite(), db);
  ASSERT_EQ(sh(archive_tool() + " pack " + db + " " + a1 + " 2>/dev/null"), 0);
  ASSERT_EQ(sh("touch -d '2001-01-01' " + db + " && " + archive_tool() + " pack " + db + " " + a2 + " 2>/dev/null"), 0);
  EXPECT_EQ(read_bytes(a1), read_bytes(a2));  // no time of this machine in it
  EXPECT_LT(fs::file_size(a1), fs::file_size(db));
  const std::string back = dir.file("back.db");
  ASSERT_EQ(sh(archive_tool() + " unpack " + a1 + " " + back + " 2>/dev/null"), 0);
  EXPECT_EQ(read_bytes(back), read_bytes(db));
  EXPECT_EQ(sh(archive_tool() + " check " + a1 + " " + back), 0);
  // A file that differs, a missing one, and an archive that is not one.
  { std::ofstream(back, std::ios::app) << "x"; }
  EXPECT_EQ(sh(archive_tool() + " check " + a1 + " " + back + " 2>/dev/null"), 1);
  EXPECT_EQ(sh(archive_tool() + " check " + a1 + " " + dir.file("none.db") + " 2>/dev/null"), 1);
  { std::ofstream(dir.file("bad.tar.xz")) << "not an archive"; }
  EXPECT_EQ(sh(archive_tool() + " check " + dir.file("bad.tar.xz") + " " + back + " 2>/dev/null"), 2);
  EXPECT_EQ(sh(archive_tool() + " unpack " + dir.file("bad.tar.xz") + " " + back + " 2>/dev/null"), 2);
  EXPECT_FALSE(fs::exists(back + ".tmp"));
}

// tools/build_shipped_db.sh end to end on simulated GPUs (`serve --simulate`): plan, submit, serve,
// then a file of results only. Synthetic results never go to the shipped file itself.
TEST(ShippedPlan, TheBuildScriptRehearsesWithoutAGpuAndNeverOverwritesTheShippedFile) {
  TempDir dir;
  const std::string out = dir.file("rehearsal.db");
  const std::string log = dir.file("log");
  ASSERT_EQ(rehearsal(dir.file("work"), out, log, 3, 4), 0) << read_bytes(log);
  {
    Store store = Store::open(out, Store::Mode::kReadOnly);
    EXPECT_EQ(store.campaigns().size(), 3u);
    sqlite::Connection c = sqlite::Connection::open(out, SQLITE_OPEN_READONLY);
    for (const char* table : {"builds", "queue", "leases", "gpus"}) {
      sqlite::Statement st(c, std::string("SELECT COUNT(*) FROM ") + table);
      ASSERT_TRUE(st.step());
      EXPECT_EQ(st.int64(0), 0) << table;
    }
  }
  // The file answers as a shipped database.
  ShippedEnv env(out);
  // The plan's first problem, as the script wrote the plan into its working folder.
  const std::string plan_text = read_bytes(dir.file("work") + "/plan.yaml");
  const std::size_t at = plan_text.find("{problem: \"");
  ASSERT_NE(at, std::string::npos) << plan_text;
  const std::string first = plan_text.substr(at + 11, plan_text.find('"', at + 11) - at - 11);
  const auto r = run_attntune("best --problem " + first + " --db " + dir.file("absent.db") + " --format json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)[0]["source"], "shipped");

  const std::string shipped_before = read_bytes(repo_shipped());
  const int refused = std::system((build_script() + " --simulate --limit 1 --work " + dir.file("w2") + " >" + log +
                                   " 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(refused), 2);
  EXPECT_NE(read_bytes(log).find("--simulate makes synthetic results"), std::string::npos) << read_bytes(log);
  EXPECT_EQ(read_bytes(repo_shipped()), shipped_before);
}

// build_shipped_db.sh --coverage: for each GPU model the file holds results of, how many of the plan's
// problems `best --problem --gpu MODEL` answers from it as the shipped file (issue 43: "answers at
// once for any problem of the shipped plan" on an H100), the others listed; exit 1 if one is missed.
TEST(ShippedPlan, TheCoverageSaysWhatEachGpuModelIsAnsweredOfThePlan) {
  TempDir dir;
  const std::string out = dir.file("built.db");
  const std::string log = dir.file("log");
  ASSERT_EQ(rehearsal(dir.file("work"), out, log, 2, 3), 0) << read_bytes(log);
  const auto coverage = [&](int limit) {
    return WEXITSTATUS(std::system((build_script() + " --coverage --limit " + std::to_string(limit) + " --out " +
                                    out + " >" + log + " 2>&1")
                                       .c_str()));
  };
  std::string model;
  {
    sqlite::Connection c = sqlite::Connection::open(out, SQLITE_OPEN_READONLY);
    sqlite::Statement st(c, "SELECT DISTINCT d.name FROM evaluations e JOIN devices d ON d.id = e.device_id");
    ASSERT_TRUE(st.step());
    model = st.text(0);
    EXPECT_FALSE(st.step()) << "one simulated GPU model";
  }
  EXPECT_EQ(coverage(2), 0) << read_bytes(log);
  EXPECT_NE(read_bytes(log).find(model + ": 2 of the plan's 2 problems answered"), std::string::npos) << read_bytes(log);
  // The plan's third problem has no campaign: listed, and the exit says the file falls short.
  EXPECT_EQ(coverage(3), 1) << read_bytes(log);
  EXPECT_NE(read_bytes(log).find(model + ": 2 of the plan's 3 problems answered"), std::string::npos) << read_bytes(log);
  EXPECT_NE(read_bytes(log).find("not answered on " + model + ": "), std::string::npos) << read_bytes(log);
  // One campaign's results moved to a second model: each model is answered the problem it measured.
  {
    sqlite::Connection c = sqlite::Connection::open(out, SQLITE_OPEN_READWRITE);
    c.exec("INSERT INTO devices (name, arch, sm_count, uuid, driver_version) VALUES ('Other GPU', 'sm_90', 132, "
           "'GPU-other', '1')");
    c.exec("UPDATE evaluations SET device_id = (SELECT id FROM devices WHERE name = 'Other GPU') WHERE campaign_id = "
           "(SELECT MIN(id) FROM campaigns)");
    c.exec("UPDATE rankings SET device_id = (SELECT id FROM devices WHERE name = 'Other GPU') WHERE campaign_id = "
           "(SELECT MIN(id) FROM campaigns)");
  }
  EXPECT_EQ(coverage(2), 1) << read_bytes(log);
  EXPECT_NE(read_bytes(log).find(model + ": 1 of the plan's 2 problems answered"), std::string::npos) << read_bytes(log);
  EXPECT_NE(read_bytes(log).find("Other GPU: 1 of the plan's 2 problems answered"), std::string::npos) << read_bytes(log);
}

// build_shipped_db.sh --serve-seconds: a build stopped by its time box writes what is done (the
// campaign in flight goes back to the queue, its evaluations kept), says how much is left, and the
// same command from the written file (a new --work: the GPU machine that ran the first part is gone)
// finishes the plan without evaluating anything twice.
TEST(ShippedPlan, ATimeBoxedBuildWritesWhatIsDoneAndTheSameCommandFinishesIt) {
  TempDir dir;
  const std::string out = dir.file("partial.db");
  const std::string log = dir.file("log");
  // 4 problems x 6 evaluations x 300 ms on one worker: over 7 s of serving, stopped after 3.
  const auto build = [&](const std::string& work, const std::string& seconds) {
    return simulated_build(work, out, log, seconds);
  };
  const auto evaluations = [&] {
    sqlite::Connection c = sqlite::Connection::open(out, SQLITE_OPEN_READONLY);
    sqlite::Statement st(c, "SELECT COUNT(*), COUNT(DISTINCT campaign_id || ':' || candidate_id) FROM evaluations");
    EXPECT_TRUE(st.step());
    return std::make_pair(st.int64(0), st.int64(1));
  };
  ASSERT_EQ(build(dir.file("w1"), "3"), 0) << read_bytes(log);
  EXPECT_NE(read_bytes(log).find("--serve-seconds 3 reached"), std::string::npos) << read_bytes(log);
  EXPECT_NE(read_bytes(log).find("campaigns of the plan not done yet"), std::string::npos) << read_bytes(log);
  EXPECT_LT(evaluations().first, 24);  // written, part-way
  ASSERT_EQ(build(dir.file("w2"), ""), 0) << read_bytes(log);
  EXPECT_EQ(read_bytes(log).find("not done yet"), std::string::npos) << read_bytes(log);
  Store store = Store::open(out, Store::Mode::kReadOnly);
  EXPECT_EQ(store.campaigns().size(), 4u);
  const auto [total, distinct] = evaluations();
  EXPECT_EQ(total, distinct);  // nothing evaluated twice
  EXPECT_EQ(total, 24);        // every campaign's budget, once
}

// A campaign a time box left unfinished, whose search space then changed (a tunable added: run 209,
// where serve failed it because `tune` cannot resume a campaign with another space): the next build
// measures it again under its name, as a stale one, and completes the plan with nothing failed,
// lost or evaluated twice.
TEST(ShippedPlan, ABuildMeasuresAgainAnUnfinishedCampaignWhoseSpaceChanged) {
  TempDir dir;
  const std::string out = dir.file("partial.db");
  const std::string log = dir.file("log");
  const auto build = [&](const std::string& work, const std::string& seconds) {
    return simulated_build(work, out, log, seconds);
  };
  ASSERT_EQ(build(dir.file("w1"), "3"), 0) << read_bytes(log);
  std::string unfinished;
  {
    sqlite::Connection c = sqlite::Connection::open(out, SQLITE_OPEN_READWRITE);
    sqlite::Statement st(c, "SELECT name FROM campaigns WHERE status != 'completed'");
    ASSERT_TRUE(st.step()) << "the time box left no campaign unfinished";
    unfinished = st.text(0);
    c.exec("UPDATE campaign_spaces SET space_hash = 'before-a-change' WHERE campaign_id IN (SELECT id FROM campaigns "
           "WHERE status != 'completed')");
    c.exec("UPDATE campaigns SET space_hash = 'before-a-change' WHERE status != 'completed'");
  }
  ASSERT_EQ(build(dir.file("w2"), ""), 0) << read_bytes(log);  // 1: serve failed the campaign
  EXPECT_NE(read_bytes(log).find("1 campaigns measured before their template or space changed: measured again"),
            std::string::npos)
      << read_bytes(log);
  EXPECT_EQ(read_bytes(log).find("not done yet"), std::string::npos) << read_bytes(log);
  sqlite::Connection c = sqlite::Connection::open(out, SQLITE_OPEN_READONLY);
  sqlite::Statement names(c, "SELECT name, status, space_hash FROM campaigns ORDER BY name");
  int n = 0;
  while (names.step()) {
    ++n;
    EXPECT_EQ(names.text(1), "completed") << names.text(0);
    EXPECT_EQ(names.text(0).find("@stale"), std::string::npos);
    if (names.text(0) == unfinished) {
      EXPECT_NE(names.text(2), "before-a-change");
    }
  }
  EXPECT_EQ(n, 4);
  sqlite::Statement evals(c, "SELECT COUNT(*), COUNT(DISTINCT campaign_id || ':' || candidate_id) FROM evaluations");
  ASSERT_TRUE(evals.step());
  EXPECT_EQ(evals.int64(0), evals.int64(1));  // nothing evaluated twice
  EXPECT_EQ(evals.int64(0), 24);              // every campaign's budget, once: the unfinished one's measured anew
}

// build_shipped_db.sh --check: the campaigns whose kernel source changed since they were measured
// (export refuses them), found by exporting each; none in a fresh copy of the recorded suite, every
// one once their stored source hashes no longer match what this tree renders.
TEST(ShippedPlan, TheCheckListsCampaignsWhoseTemplateChanged) {
  TempDir dir;
  const std::string db = dir.file("shipped.db");
  const std::string log = dir.file("log");
  fs::copy_file(recorded_suite(), db);
  const auto check = [&] { return WEXITSTATUS(std::system((build_script() + " --check --out " + db + " >" + log + " 2>&1").c_str())); };
  EXPECT_EQ(check(), 0) << read_bytes(log);
  EXPECT_NE(read_bytes(log).find("16 campaigns with results, 0 stale"), std::string::npos) << read_bytes(log);
  {
    sqlite::Connection c = sqlite::Connection::open(db, SQLITE_OPEN_READWRITE);
    c.exec("UPDATE candidates SET source_hash = 'measured-before-a-change-' || id");
  }
  EXPECT_EQ(check(), 1) << read_bytes(log);
  EXPECT_NE(read_bytes(log).find("16 campaigns with results, 16 stale"), std::string::npos) << read_bytes(log);
  EXPECT_NE(read_bytes(log).find("stale: b4-s4k-d128-bf16\n"), std::string::npos) << read_bytes(log);
}

// A template change: the next build measures again each campaign of its plan whose kernel source
// changed (warm-started from the stale campaign's own best configs) and writes it under its name; a
// stale campaign outside the plan (here: past --limit) keeps its results and its name. No
// "@stale" name reaches the file, nothing is lost.
TEST(ShippedPlan, ABuildMeasuresAgainTheCampaignsATemplateChangeMadeStale) {
  TempDir dir;
  const std::string out = dir.file("out.db");
  const std::string log = dir.file("log");
  const auto build = [&](const std::string& work, int limit) { return rehearsal(dir.file(work), out, log, limit, 4); };
  const auto check = [&] { return read_bytes(log); };
  const auto stale_count = [&] {
    std::system((build_script() + " --check --out " + out + " >" + log + " 2>&1").c_str());
    const std::string text = read_bytes(log);
    const std::size_t at = text.find("campaigns with results, ");
    return at == std::string::npos ? -1 : std::atoi(text.c_str() + at + 24);
  };
  const auto names = [&] {
    std::vector<std::string> v;
    sqlite::Connection c = sqlite::Connection::open(out, SQLITE_OPEN_READONLY);
    sqlite::Statement st(c, "SELECT name FROM campaigns ORDER BY name");
    while (st.step()) v.push_back(st.text(0));
    return v;
  };
  ASSERT_EQ(build("w1", 2), 0) << check();
  const std::vector<std::string> before = names();
  ASSERT_EQ(before.size(), 2u);
  EXPECT_EQ(stale_count(), 0);
  {
    sqlite::Connection c = sqlite::Connection::open(out, SQLITE_OPEN_READWRITE);
    c.exec("UPDATE candidates SET source_hash = 'measured-before-a-change-' || id");
  }
  EXPECT_EQ(stale_count(), 2);
  // The plan's first problem only: it is measured again; the other keeps its stale results.
  ASSERT_EQ(build("w2", 1), 0) << check();
  EXPECT_NE(check().find("2 campaigns measured before their template or space changed: measured again"),
            std::string::npos)
      << check();
  EXPECT_NE(check().find("1 measured again, 1 kept as they were"), std::string::npos) << check();
  EXPECT_EQ(names(), before);
  EXPECT_EQ(stale_count(), 1);
  // The whole plan: both measured under the current template.
  ASSERT_EQ(build("w3", 2), 0) << check();
  EXPECT_EQ(names(), before);
  EXPECT_EQ(stale_count(), 0);
  sqlite::Connection c = sqlite::Connection::open(out, SQLITE_OPEN_READONLY);
  sqlite::Statement st(c, "SELECT COUNT(*) FROM evaluations e JOIN campaigns c ON c.id = e.campaign_id");
  ASSERT_TRUE(st.step());
  EXPECT_EQ(st.int64(0), 8);  // each campaign's budget once, under the current template
}

// build_shipped_db.sh --remeasure WHERE: the campaigns an SQL condition selects are measured again
// at this build's budget (deepening a part of the file), under their names, each evaluated once; the
// same command again selects nothing the condition now excludes; a bad condition is refused before
// anything is written.
TEST(ShippedPlan, RemeasureDeepensTheCampaignsAConditionSelects) {
  TempDir dir;
  const std::string out = dir.file("out.db");
  const std::string log = dir.file("log");
  const auto build = [&](const std::string& work, const std::string& extra, int budget) {
    return rehearsal(dir.file(work), out, log, 2, budget, extra);
  };
  const auto per_campaign = [&] {
    std::map<std::string, std::pair<std::int64_t, std::int64_t>> m;  // name: evaluations, budget
    sqlite::Connection c = sqlite::Connection::open(out, SQLITE_OPEN_READONLY);
    sqlite::Statement st(c, "SELECT c.name, (SELECT COUNT(*) FROM evaluations e WHERE e.campaign_id = c.id), "
                            "COALESCE(c.budget_evals, 0) FROM campaigns c");
    while (st.step()) m[st.text(0)] = {st.int64(1), st.int64(2)};
    return m;
  };
  ASSERT_EQ(build("w1", "", 4), 0) << read_bytes(log);
  const auto before = per_campaign();
  ASSERT_EQ(before.size(), 2u);
  std::string first;
  {  // the condition picks one of the two by its problem
    sqlite::Connection c = sqlite::Connection::open(out, SQLITE_OPEN_READONLY);
    sqlite::Statement st(c, "SELECT name FROM campaigns ORDER BY s, name LIMIT 1");
    ASSERT_TRUE(st.step());
    first = st.text(0);
  }
  const std::string where = "\"name = '" + first + "' AND COALESCE(budget_evals, 0) < 7\"";
  ASSERT_EQ(build("w2", "--remeasure " + where, 7), 0) << read_bytes(log);
  EXPECT_NE(read_bytes(log).find("1 campaigns chosen by --remeasure: measured again"), std::string::npos)
      << read_bytes(log);
  const auto after = per_campaign();
  ASSERT_EQ(after.size(), 2u);  // the same names, no @stale left
  for (const auto& [name, v] : after) {
    if (name == first) {
      EXPECT_EQ(v.first, 7) << "measured again at the new budget: " << name;
      EXPECT_EQ(v.second, 7);
    } else {
      EXPECT_EQ(v, before.at(name)) << "not selected: as it was";
    }
  }
  {
    sqlite::Connection c = sqlite::Connection::open(out, SQLITE_OPEN_READONLY);
    sqlite::Statement st(c, "SELECT COUNT(*), COUNT(DISTINCT campaign_id || ':' || candidate_id) FROM evaluations");
    ASSERT_TRUE(st.step());
    EXPECT_EQ(st.int64(0), st.int64(1)) << "nothing evaluated twice";
  }
  // The same command again: the condition now excludes it; nothing is measured.
  ASSERT_EQ(build("w3", "--remeasure " + where, 7), 0) << read_bytes(log);
  EXPECT_NE(read_bytes(log).find("--remeasure selects 0 campaigns"), std::string::npos) << read_bytes(log);
  EXPECT_EQ(per_campaign(), after);
  // A bad condition: refused (exit 2) before a working database exists; the file untouched.
  const std::string file_before = read_bytes(out);
  EXPECT_EQ(build("w4", "--remeasure \"no_such_column < 3\"", 7), 2) << read_bytes(log);
  EXPECT_NE(read_bytes(log).find("--remeasure 'no_such_column < 3'"), std::string::npos) << read_bytes(log);
  EXPECT_FALSE(fs::exists(dir.file("w4") + "/attntune.db"));
  EXPECT_EQ(read_bytes(out), file_before);
  EXPECT_EQ(build("w5", "--fresh --remeasure \"1\"", 7), 2) << read_bytes(log);
}

}  // namespace
}  // namespace test_shipped_db
}  // namespace attntune::test
