// tools/gpu_box.sh: one GPU call's share of a long job. Its parts that need no GPU are what these
// tests hold it to: the box ends the command, the state comes back slim (the compile cache gone, every
// result kept) and a later call on a bare machine starts from it, a machine with the wrong GPU runs
// nothing, and a static build carried to the GPU machine is given the shipped database.
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "../db/db_test_util.hpp"
#include "../export/nvcc_util.hpp"  // sh()
#include "../tune/tune_test_util.hpp"

namespace attntune::test {
namespace test_gpu_box {
namespace {

namespace fs = std::filesystem;

std::string box() { return testing::source_dir() + "/tools/gpu_box.sh"; }

std::string count(const std::string& db, const std::string& table) {
  const Shell r = sh(fmt::format("sqlite3 '{}' 'SELECT count(*) FROM {}'", db, table));
  EXPECT_EQ(r.status, 0) << r.output;
  return r.output;
}

// A tune phase's state: a database of results beside a compile cache of 4 MB, and a log.
void make_work(const fs::path& work) {
  fs::create_directories(work / "out");
  fs::copy_file(testing::source_dir() + "/tests/data/campaigns/h100-suite.db", work / "u.db");
  const Shell r = sh(fmt::format(
      "sqlite3 '{}' \"INSERT INTO builds (source_hash, arch, nvrtc_version, options, status, cubin) VALUES "
      "('a', 'sm_90a', '13.0', '', 'ok', zeroblob(4000000))\"",
      (work / "u.db").string()));
  ASSERT_EQ(r.status, 0) << r.output;
  std::ofstream(work / "out" / "tune_u_s1.log") << "warm start: 3 configs of the shipped database\n";
}

TEST(GpuBox, TheBoxEndsTheCommandAndTheStateComesBackWithoutTheCompileCache) {
  TempDir dir;
  const fs::path work = dir.path() / "w" / "uh";
  make_work(work);
  const std::string evaluations = count((work / "u.db").string(), "evaluations");
  const std::string save = dir.file("back/uh.tar.xz");
  const Shell r = sh(fmt::format("ATTNTUNE_SHIPPED_DB= {} --box 1 --work '{}' --save '{}' -- sleep 30", box(),
                                 work.string(), save));
  EXPECT_EQ(r.status, 124) << r.output;  // timeout's: the box ended it
  EXPECT_NE(r.output.find("the box ended it"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("u.db: "), std::string::npos) << r.output;  // the campaigns listed
  ASSERT_TRUE(fs::exists(save)) << r.output;

  const fs::path back = dir.path() / "unpacked";
  fs::create_directories(back);
  ASSERT_EQ(sh(fmt::format("tar -C '{}' -xJf '{}'", back.string(), save)).status, 0);
  EXPECT_EQ(count((back / "uh" / "u.db").string(), "builds"), "0\n");
  EXPECT_EQ(count((back / "uh" / "u.db").string(), "evaluations"), evaluations);
  EXPECT_LT(fs::file_size(back / "uh" / "u.db"), fs::file_size(work / "u.db") - 3'000'000u);  // VACUUMed
  EXPECT_TRUE(fs::exists(back / "uh" / "out" / "tune_u_s1.log"));
  // The machine's own copy keeps its compile cache (the next call on a warm machine reuses it).
  EXPECT_EQ(count((work / "u.db").string(), "builds"), "1\n");
}

// What COMMAND started may outlive it (bars.sh's tunes, told to stop, record their last results
// after the script has gone): the state is saved once nothing holds a file of DIR open.
TEST(GpuBox, TheStateIsSavedOnceWhatTheCommandStartedHasStoppedWriting) {
  TempDir dir;
  const fs::path work = dir.path() / "w" / "uh";
  fs::create_directories(work);
  const std::string held = (work / "held.log").string();
  const std::string save = dir.file("uh.tar.xz");
  const Shell r = sh(fmt::format("ATTNTUNE_SHIPPED_DB= {} --box 60 --work '{}' --save '{}' -- sh -c \"(exec 3>>'{}'; "
                                 "sleep 2; echo last >&3) >/dev/null 2>&1 & true\"",
                                 box(), work.string(), save, held));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("waited"), std::string::npos) << r.output;
  const fs::path back = dir.path() / "back";
  fs::create_directories(back);
  ASSERT_EQ(sh(fmt::format("tar -C '{}' -xJf '{}'", back.string(), save)).status, 0);
  EXPECT_EQ(read_bytes((back / "uh" / "held.log").string()), "last\n");
  // --linger 0: saved at once, with a warning naming what still writes.
  const Shell now = sh(fmt::format("ATTNTUNE_SHIPPED_DB= {} --box 60 --linger 0 --work '{}' --save '{}' -- sh -c "
                                   "\"(exec 3>>'{}'; sleep 2) >/dev/null 2>&1 & true\"",
                                   box(), work.string(), save, held));
  EXPECT_EQ(now.status, 0) << now.output;
  EXPECT_NE(now.output.find("still hold files under"), std::string::npos) << now.output;
}

TEST(GpuBox, ABareMachineStartsFromTheSavedStateAndAWarmOneKeepsItsOwn) {
  TempDir dir;
  const fs::path work = dir.path() / "w" / "uh";
  make_work(work);
  const std::string save = dir.file("uh.tar.xz");
  ASSERT_EQ(sh(fmt::format("ATTNTUNE_SHIPPED_DB= {} --box 60 --work '{}' --save '{}' -- true", box(), work.string(),
                           save))
                .status,
            0);
  fs::remove_all(dir.path() / "w");  // a new machine: the ignored folders are gone
  const Shell r = sh(fmt::format("ATTNTUNE_SHIPPED_DB= {} --box 60 --work '{}' --state '{}' -- sqlite3 '{}' "
                                 "'SELECT count(*) FROM evaluations'",
                                 box(), work.string(), save, (work / "u.db").string()));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("restored from"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\n320\n"), std::string::npos) << r.output;  // the command saw the results
  // A warm machine's folder is newer than any archive: --state leaves it alone.
  const Shell again = sh(fmt::format("ATTNTUNE_SHIPPED_DB= {} --box 60 --work '{}' --state '{}' -- true", box(),
                                     work.string(), save));
  EXPECT_EQ(again.status, 0) << again.output;
  EXPECT_EQ(again.output.find("restored from"), std::string::npos) << again.output;
  // A missing archive is refused before anything runs.
  fs::remove_all(dir.path() / "w");
  const Shell missing = sh(fmt::format("ATTNTUNE_SHIPPED_DB= {} --box 60 --work '{}' --state '{}' -- touch '{}'",
                                       box(), work.string(), dir.file("nope.tar.xz"), dir.file("ran")));
  EXPECT_EQ(missing.status, 2) << missing.output;
  EXPECT_FALSE(fs::exists(dir.file("ran")));
}

TEST(GpuBox, TheWrongGpuRunsNothing) {
  TempDir dir;
  const Shell r = sh(fmt::format("ATTNTUNE_SHIPPED_DB= {} --box 60 --gpu 'no such GPU model' --work '{}' -- touch '{}'",
                                 box(), dir.file("w"), dir.file("ran")));
  EXPECT_EQ(r.status, 3) << r.output;
  EXPECT_NE(r.output.find("nothing run"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir.file("ran")));
  EXPECT_FALSE(fs::exists(dir.file("w")));
  for (const char* bad : {"--box 0 --work w -- true", "--box 60 -- true", "--box 60 --work w", "--frob 1"}) {
    const Shell u = sh(fmt::format("{} {}", box(), bad));
    EXPECT_EQ(u.status, 2) << bad << ": " << u.output;
    EXPECT_NE(u.output.find("usage:"), std::string::npos) << bad;
  }
}

TEST(GpuBox, TheCommandIsGivenTheShippedDatabaseOfTheTree) {
  TempDir dir;
  const Shell r = sh(fmt::format("env -u ATTNTUNE_SHIPPED_DB GPU_BOX_SHIPPED_DIR='{}' {} --box 60 --work '{}' -- "
                                 "sh -c 'echo \"shipped=$ATTNTUNE_SHIPPED_DB\"'",
                                 dir.file("shipped"), box(), dir.file("w")));
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string path = dir.file("shipped/attntune-shipped.db");
  EXPECT_NE(r.output.find("shipped=" + path + "\n"), std::string::npos) << r.output;
  ASSERT_TRUE(fs::exists(path));
  // The tree's file: every campaign of both GPU models' halves.
  EXPECT_GT(std::stoi(count(path, "campaigns")), 1000);
  // The user's own choice stands (empty: without one).
  const Shell own = sh(fmt::format("ATTNTUNE_SHIPPED_DB=/elsewhere.db {} --box 60 --work '{}' -- sh -c 'echo "
                                   "\"shipped=$ATTNTUNE_SHIPPED_DB\"'",
                                   box(), dir.file("w")));
  EXPECT_NE(own.output.find("shipped=/elsewhere.db\n"), std::string::npos) << own.output;
}

}  // namespace
}  // namespace test_gpu_box
}  // namespace attntune::test
