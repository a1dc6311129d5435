// tools/tune_suite.sh against a stub attntune that logs its arguments: which campaigns it tunes
// (shapes, dtypes, --min-s, --only), with which spaces, what it exports where, and its refusals.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/common/run_attntune.hpp"
#include "tests/unit/db/db_test_util.hpp"

namespace test_tune_suite_script {
using attntune::test::CommandResult;
using attntune::test::read_bytes;
using attntune::test::run_shell;
using attntune::test::TempDir;
using attntune::test::write_bytes;
using attntune::testing::lines;
using attntune::testing::source_dir;

namespace {

class TuneSuiteScript : public ::testing::Test {
 protected:
  void SetUp() override {
    stub_ = dir_.file("attntune");
    // Each call appends its arguments as one line; `export ... -o FILE` writes FILE.
    write_bytes(stub_,
                "#!/usr/bin/env bash\n"
                "echo \"$*\" >> " + dir_.file("calls.log") + "\n"
                "if [ \"$1\" = export ]; then while (($#)); do [ \"$1\" = -o ] && echo kernel > \"$2\"; shift; done; fi\n");
    ASSERT_EQ(run_shell("chmod +x '" + stub_ + "'", dir_.path()).status, 0);
  }
  CommandResult run(const std::string& args) {
    return run_shell("ATTNTUNE_BIN='" + stub_ + "' bash '" + source_dir() + "/tools/tune_suite.sh' '" +
                         dir_.file("suite.db") + "' " + args,
                     dir_.path());
  }
  std::vector<std::string> calls() const { return lines(read_bytes(dir_.file("calls.log"))); }

  TempDir dir_;
  std::string stub_;
};

TEST_F(TuneSuiteScript, DefaultTunesEveryShapeAndDtypeWithTheMmaSpace) {
  const CommandResult r = run("");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::vector<std::string> c = calls();
  ASSERT_EQ(c.size(), 17u);  // 8 shapes x 2 dtypes, then `campaigns`
  EXPECT_EQ(c[0].rfind("tune --space search_spaces/flash_fwd_mma.yaml --db ", 0), 0u) << c[0];
  EXPECT_NE(c[0].find("--campaign b1-s16k-d128-bf16 --problem b=1,h=16,s=16384,d=128,dtype=bf16,causal=0 "
                      "--budget-evals 120"),
            std::string::npos)
      << c[0];
  EXPECT_NE(c[15].find("--campaign seed-s128-causal-fp16 --problem b=2,h=8,s=128,d=64,dtype=fp16,causal=1"),
            std::string::npos)
      << c[15];
  EXPECT_EQ(c[16].rfind("campaigns --db ", 0), 0u) << c[16];
}

TEST_F(TuneSuiteScript, HopperSuiteWithExports) {
  const std::string ex = dir_.file("ex");
  const CommandResult r = run("--space search_spaces/flash_fwd_wgmma.yaml --min-s 2048 --dtypes fp16 "
                              "--budget-evals 64 --export '" + ex + "' --final-top 4");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::vector<std::string> c = calls();
  ASSERT_EQ(c.size(), 13u);  // six s >= 2048 shapes: tune and export each, then `campaigns`
  const std::vector<std::string> names = {"b1-s16k-d128", "b1-s16k-d128-causal", "b4-s4k-d128",
                                          "b4-s4k-d128-causal", "b8-s2k-d64", "b8-s2k-d64-causal"};
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string campaign = names[i] + "-fp16", tune = c[2 * i], exp = c[2 * i + 1];
    EXPECT_EQ(tune.rfind("tune --space search_spaces/flash_fwd_wgmma.yaml --db ", 0), 0u) << tune;
    EXPECT_NE(tune.find("--campaign " + campaign + " "), std::string::npos) << tune;
    EXPECT_NE(tune.find("--budget-evals 64 --final-top 4"), std::string::npos) << tune;  // passed through
    EXPECT_EQ(exp, "export --db " + dir_.file("suite.db") + " --campaign " + campaign + " -o " + ex + "/" +
                       campaign + ".cu");
    EXPECT_EQ(read_bytes(ex + "/" + campaign + ".cu"), "kernel\n") << campaign;
  }
}

TEST_F(TuneSuiteScript, SeveralSpacesMakeOneCampaign) {
  const CommandResult r = run("--space a.yaml --space b.yaml --only b4-s4k-d128 --dtypes bf16");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::vector<std::string> c = calls();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].rfind("tune --space a.yaml --space b.yaml --db ", 0), 0u) << c[0];
  EXPECT_NE(c[0].find("--campaign b4-s4k-d128-bf16 "), std::string::npos) << c[0];
}

TEST_F(TuneSuiteScript, RefusesBadArgumentsWithoutTuning) {
  CommandResult r = run("--min-s 2k");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--min-s takes a whole number"), std::string::npos) << r.err;
  r = run("--only b4-s4k-d128 --min-s 8192");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("no suite shape matches"), std::string::npos) << r.err;
  r = run("--space");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(calls().empty()) << read_bytes(dir_.file("calls.log"));
}

}  // namespace
}  // namespace test_tune_suite_script
