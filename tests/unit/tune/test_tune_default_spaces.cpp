// `tune` without --space searches the shipped space of every template that serves the problem on
// this GPU, as `submit` queues them (issue 43's "day one"). Without a GPU: a problem no template
// serves is exit 2 naming each template's reason, one that some do is exit 3 (no driver), and
// neither creates the database.
#include <filesystem>

#include <gtest/gtest.h>

#include "cuda/driver.hpp"
#include "tests/common/run_attntune.hpp"
#include "tune_test_util.hpp"

namespace attntune::test {
namespace test_tune_default_spaces {
namespace {

TEST(TuneDefaultSpaces, AProblemNoTemplateServesNamesEachReason) {
  TempDir dir;
  const std::string db = dir.file("t.db");
  const auto r = testing::run_attntune("tune --problem b=1,h=8,s=64,d=88,dtype=bf16,causal=0 --db " + db);
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("no template serves b=1,h=8,hkv=8,s=64,sk=64,d=88,dtype=bf16,causal=0"), std::string::npos)
      << r.err;
  for (const char* family : {"flash_fwd_mma", "flash_fwd_wgmma", "flash_decode"})
    EXPECT_NE(r.err.find(family), std::string::npos) << family << " is not named in: " << r.err;
  EXPECT_FALSE(std::filesystem::exists(db));
}

TEST(TuneDefaultSpaces, WithoutADriverItSaysSoAndWritesNothing) {
  if (std::string why; cuda::driver_available(&why)) GTEST_SKIP() << "a driver is here: tune would run a campaign";
  TempDir dir;
  const std::string db = dir.file("t.db");
  const auto r = testing::run_attntune("tune --problem b=1,h=8,s=256,d=64,dtype=bf16,causal=1 --db " + db);
  EXPECT_EQ(r.rc, 3) << r.err;
  EXPECT_FALSE(std::filesystem::exists(db));
}

TEST(TuneDefaultSpaces, ASimulatedRunNeedsOneRecordingPerServingTemplate) {
  // A dense d=128 problem: flash_fwd_mma and flash_fwd_wgmma serve it, so one recording is too few.
  TempDir dir;
  const auto r = testing::run_attntune(
      "tune --problem b=4,h=16,s=4096,d=128,dtype=bf16,causal=0 --db " + dir.file("t.db") +
      " --simulate-db " + testing::source_dir() + "/tests/data/campaigns/h100-exhaustive-d128.db "
      "--simulate-campaign h100-exhaustive-d128");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("2 spaces (--space, or without it every template that serves the problem) and 1 "
                       "--simulate-campaign"),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace test_tune_default_spaces
}  // namespace attntune::test
