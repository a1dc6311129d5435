// `attntune compile` end to end through the binary (no GPU).
#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/common/run_attntune.hpp"

namespace test_cmd_compile {
namespace {

attntune::testing::Outcome run(const std::string& args) {
  auto r = attntune::testing::run_attntune(args);
  r.out += r.err;  // these tests look for messages on either stream
  return r;
}

const std::string kSpace = std::string("compile --space ") + ATTNTUNE_SOURCE_DIR + "/search_spaces/flash_fwd_mma.yaml";

}  // namespace

TEST(CmdCompile, JsonReportsResourcesAndCachesBuilds) {
  const auto db = std::filesystem::temp_directory_path() / "attntune_cmd_compile.db";
  std::filesystem::remove(db);
  const std::string args = kSpace + " --problem b=1,h=2,s=300,d=64,dtype=fp16,causal=1 --arch sm_89 --sample 2 "
                           "--jobs 2 --format json --db " + db.string();
  auto first = run(args);
  ASSERT_EQ(first.rc, 0) << first.out;
  const auto j = nlohmann::json::parse(first.out.substr(first.out.find('[')));
  ASSERT_EQ(j.size(), 2u);
  for (const auto& row : j) {
    EXPECT_EQ(row["status"], "ok");
    EXPECT_EQ(row["arch"], "sm_89");
    EXPECT_GT(row["registers"].get<int>(), 0);
    EXPECT_GT(row["smem_dynamic"].get<int>(), 0);
    EXPECT_FALSE(row["cached"].get<bool>());
  }
  auto second = run(args);  // same sources, arch, NVRTC and options: served from the cache
  ASSERT_EQ(second.rc, 0) << second.out;
  for (const auto& row : nlohmann::json::parse(second.out.substr(second.out.find('['))))
    EXPECT_TRUE(row["cached"].get<bool>());
  std::filesystem::remove(db);
}

TEST(CmdCompile, UnsupportedProblemIsRejectedBeforeCompiling) {
  auto r = run(kSpace + " --problem b=1,h=2,s=300,d=88,dtype=fp16,causal=1 --arch sm_90");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("attntune: error: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("d=88"), std::string::npos) << r.out;
  auto arch = run(kSpace + " --problem b=1,h=2,s=300,d=64,dtype=fp16,causal=1 --arch sm_75");
  EXPECT_EQ(arch.rc, 2) << arch.out;
  auto usage = run(kSpace + " --arch sm_90");
  EXPECT_EQ(usage.rc, 2) << usage.out;
}
}  // namespace test_cmd_compile
