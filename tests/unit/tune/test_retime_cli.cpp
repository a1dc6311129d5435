// attntune retime without a GPU: bad input is exit 2 with one clear line, checked before the GPU
// is looked for; on a machine without a driver a good request is exit 3, and the campaign is left
// as it was. tests/gpu/test_tune.cpp (TuneGpu.RetimeReRanksTheTopAroundThePick) runs it on a GPU.
#include <gtest/gtest.h>
#include <dlfcn.h>

#include <filesystem>

#include "../../common/run_attntune.hpp"
#include "tune_test_util.hpp"

namespace attntune::test {
namespace test_retime_cli {
namespace {

namespace fs = std::filesystem;
using attntune::testing::run_attntune;

bool libcuda_present() {
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h) dlclose(h);
  return h != nullptr;
}

// A copy of the recorded H100 suite (16 flash_fwd_mma campaigns, each ranked).
std::string suite_copy(TempDir& dir) {
  const std::string db = dir.file("suite.db");
  fs::copy_file(std::string(ATTNTUNE_SOURCE_DIR) + "/tests/data/campaigns/h100-suite.db", db);
  return db;
}

TEST(RetimeCli, BadInputIsExit2BeforeTheGpu) {
  TempDir dir;
  const std::string db = suite_copy(dir);
  auto r = run_attntune("retime --db " + db + " --campaign nope");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("no campaign 'nope' in database"), std::string::npos) << r.err;
  for (const char* bad : {"--top 0", "--rounds 0", "--min-seconds 0", "--min-seconds 601", "--tolerance -1",
                          "--format yaml", "--device -1"}) {
    r = run_attntune("retime --db " + db + " --campaign seed-s512-bf16 " + bad);
    EXPECT_EQ(r.rc, 2) << bad << ": " << r.err;
    EXPECT_NE(r.err.find("attntune: error: "), std::string::npos) << bad << ": " << r.err;
  }
  r = run_attntune("retime --db " + dir.file("missing.db") + " --campaign x");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_FALSE(fs::exists(dir.file("missing.db")));  // not created
  r = run_attntune("retime --db " + db);
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("campaign"), std::string::npos) << r.err;
}

TEST(RetimeCli, WithoutADriverAGoodRequestIsExit3AndLeavesTheCampaign) {
  if (libcuda_present()) GTEST_SKIP() << "an NVIDIA driver is installed; tests/gpu/test_tune.cpp covers retime there";
  TempDir dir;
  const std::string db = suite_copy(dir);
  Store before = Store::open(db, Store::Mode::kReadOnly);
  const std::size_t evals = before.campaign_evaluations(*before.find_campaign("seed-s512-bf16")).size();
  const auto ranked = before.ranking(*before.find_campaign("seed-s512-bf16"));
  auto r = run_attntune("retime --db " + db + " --campaign seed-s512-bf16 --top 3");
  EXPECT_EQ(r.rc, 3) << r.err;
  EXPECT_NE(r.err.find("no NVIDIA driver"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  Store after = Store::open(db, Store::Mode::kReadOnly);
  EXPECT_EQ(after.campaign_evaluations(*after.find_campaign("seed-s512-bf16")).size(), evals);
  ASSERT_EQ(after.ranking(*after.find_campaign("seed-s512-bf16")).size(), ranked.size());
}

}  // namespace
}  // namespace test_retime_cli
}  // namespace attntune::test
