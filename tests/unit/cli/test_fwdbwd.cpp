// `pass=fwdbwd` (issue 45): the pair a training step runs, the forward and the backward of one
// problem, each its own problem and campaign. Problem::parse_passes reads it into the two; parse()
// refuses it naming the commands that take it. On the CPU: submit queues both campaigns, best
// answers both with the step's time, export writes both kernels into one file with the dispatcher,
// and tune refuses --space with it (its GPU path is tune_one twice; tests/gpu runs tune itself).
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/problem.hpp"
#include "tests/common/run_attntune.hpp"
#include "tests/unit/db/db_test_util.hpp"
#include "tests/unit/export/export_db.hpp"
#include "tests/unit/export/nvcc_util.hpp"

namespace test_fwdbwd {
using namespace attntune;
using attntune::test::ExportDb;
using attntune::test::info_from_source;
using attntune::test::read_bytes;
using attntune::test::shq;
using attntune::test::TempDir;
using attntune::testing::run_attntune;
using attntune::testing::source_dir;

namespace {

const std::string kShape = "b=2,h=8,hkv=2,s=1024,sk=1024,d=128,dtype=bf16,causal=1";
const std::string kStep = kShape + ",pass=fwdbwd";

std::string error_of(const std::string& spec) {
  try {
    Problem::parse(spec);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(FwdBwd, AStepSpecReadsAsItsTwoProblems) {
  const std::vector<Problem> two = Problem::parse_passes(kStep);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0], Problem::parse(kShape));
  EXPECT_EQ(two[1], Problem::parse(kShape + ",pass=bwd"));
  // The key anywhere in the spec; any other spec is itself.
  const std::vector<Problem> front = Problem::parse_passes("pass=fwdbwd," + kShape + ",window=127");
  ASSERT_EQ(front.size(), 2u);
  EXPECT_EQ(front[1], Problem::parse(kShape + ",window=127,pass=bwd"));
  for (const std::string& one : {kShape, kShape + ",pass=bwd", kShape + ",pass=fwd"}) {
    const std::vector<Problem> p = Problem::parse_passes(one);
    ASSERT_EQ(p.size(), 1u) << one;
    EXPECT_EQ(p[0], Problem::parse(one));
  }
  // parse() refuses it, naming the commands that take it.
  const std::string e = error_of(kStep);
  EXPECT_NE(e.find("problem: 'pass=fwdbwd' is the pair a training step runs, two problems (pass=fwd and pass=bwd): "
                   "tune, submit, best and export take it"),
            std::string::npos)
      << e;
  // The backward's own refusals, said as the backward pass's; a key given twice as ever.
  try {
    Problem::parse_passes("b=4,h=16,s=1,sk=4096,d=128,dtype=bf16,causal=1,page=16,pass=fwdbwd");
    ADD_FAILURE() << "a paged step parsed";
  } catch (const InputError& x) {
    EXPECT_NE(std::string(x.what()).find("pass=fwdbwd: its backward pass: problem: pass=bwd with page=16"),
              std::string::npos)
        << x.what();
  }
  EXPECT_THROW(Problem::parse_passes(kStep + ",pass=fwdbwd"), InputError);
  EXPECT_THROW(Problem::parse_passes(kStep + ",pass=bwd"), InputError);
}

TEST(FwdBwd, SubmitQueuesBothCampaigns) {
  TempDir dir;
  const std::string db = dir.file("q.db");
  const auto r = run_attntune("submit --db " + shq(db) + " --problem " + kStep);
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto st = run_attntune("status --db " + shq(db) + " --format json");
  ASSERT_EQ(st.rc, 0) << st.err;
  std::vector<Problem> queued;
  const nlohmann::json status = nlohmann::json::parse(st.out);
  for (const auto& c : status.at("campaigns")) queued.push_back(Problem::from_json(c.at("problem")));
  ASSERT_EQ(queued.size(), 2u) << st.out;
  EXPECT_NE(std::find(queued.begin(), queued.end(), Problem::parse(kShape)), queued.end()) << st.out;
  EXPECT_NE(std::find(queued.begin(), queued.end(), Problem::parse(kShape + ",pass=bwd")), queued.end()) << st.out;
}

TEST(FwdBwd, BestAnswersBothPassesAndTheStep) {
  TempDir dir;
  const std::string db = dir.file("step.db");
  const std::string bwd = kShape + ",pass=bwd";
  {
    ExportDb d{db, source_dir()};
    d.campaign("flash_fwd_mma", "fwd", kShape, {d.config("flash_fwd_mma", kShape, {})}, {100});
    d.campaign("flash_bwd_mma", "bwd", bwd, {d.config("flash_bwd_mma", bwd, {})}, {250});
  }
  const auto t = run_attntune("best --no-shipped --db " + shq(db) + " --problem " + kStep);
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_NE(t.out.find("flash_fwd_mma"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("flash_bwd_mma"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("training step (forward + backward): 350"), std::string::npos) << t.out;
  // JSON: one list, the forward's row first, each naming its problem.
  const auto j = run_attntune("best --no-shipped --db " + shq(db) + " --format json --problem " + kStep);
  ASSERT_EQ(j.rc, 0) << j.err;
  const nlohmann::json rows = nlohmann::json::parse(j.out);
  ASSERT_EQ(rows.size(), 2u) << j.out;
  EXPECT_EQ(Problem::from_json(rows[0].at("problem")), Problem::parse(kShape));
  EXPECT_EQ(Problem::from_json(rows[1].at("problem")), Problem::parse(bwd));
  // A pass without a result fails the command and names it.
  const std::string other = "b=2,h=8,hkv=2,s=1024,sk=1024,d=64,dtype=bf16,causal=1";
  {
    ExportDb d{db, source_dir()};
    d.campaign("flash_fwd_mma", "fwd64", other, {d.config("flash_fwd_mma", other, {})}, {80});
  }
  const auto m = run_attntune("best --no-shipped --db " + shq(db) + " --problem " + other + ",pass=fwdbwd");
  EXPECT_NE(m.rc, 0);
  EXPECT_NE(m.err.find("no valid results for " + Problem::parse(other + ",pass=bwd").str()), std::string::npos)
      << m.err;
  EXPECT_EQ(m.err.find("no valid results for " + Problem::parse(other).str() + " "), std::string::npos) << m.err;
}

TEST(FwdBwd, ExportWritesBothKernelsIntoOneFile) {
  TempDir dir;
  const std::string db = dir.file("step.db");
  const std::string bwd = kShape + ",pass=bwd";
  {
    ExportDb d{db, source_dir()};
    d.campaign("flash_fwd_mma", "fwd", kShape, {d.config("flash_fwd_mma", kShape, {})}, {100});
    d.campaign("flash_bwd_mma", "bwd", bwd, {d.config("flash_bwd_mma", bwd, {})}, {250});
    // Another problem's result, which the step's file must leave out.
    const std::string other = "b=1,h=8,s=512,d=128,dtype=bf16,causal=0";
    d.campaign("flash_fwd_mma", "other", other, {d.config("flash_fwd_mma", other, {})}, {50});
  }
  const std::string out = dir.file("step.cu");
  const auto r = run_attntune("export --no-shipped --db " + shq(db) + " --problem " + kStep + " -o " + shq(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json info = info_from_source(read_bytes(out));
  ASSERT_EQ(info.at("kernels").size(), 2u) << info.dump(2);
  const auto& entries = info.at("entry_points");
  EXPECT_EQ(entries.at("attntune_attention_forward"), nlohmann::json::array({Problem::parse(kShape).str()}));
  EXPECT_EQ(entries.at("attntune_attention_backward"), nlohmann::json::array({Problem::parse(bwd).str()}));
  // Refusals: with another mode, with --rank, and a pass without a result (nothing written).
  EXPECT_NE(run_attntune("export --db " + shq(db) + " --problem " + kStep + " --all-best -o " + shq(out)).rc, 0);
  EXPECT_NE(run_attntune("export --db " + shq(db) + " --problem " + kStep + " --rank 2 -o " + shq(out)).rc, 0);
  const std::string none = dir.file("none.cu");
  const auto m = run_attntune("export --no-shipped --db " + shq(db) + " --problem " +
                              "b=1,h=8,s=512,d=128,dtype=bf16,causal=0,pass=fwdbwd -o " + shq(none));
  EXPECT_NE(m.rc, 0);
  EXPECT_NE(m.err.find("pass=fwdbwd: no valid result for b=1,h=8,hkv=8,s=512,sk=512,d=128,dtype=bf16,causal=0,pass=bwd"),
            std::string::npos)
      << m.err;
  EXPECT_FALSE(std::filesystem::exists(none));
}

TEST(FwdBwd, TuneRefusesASpaceForTwoPasses) {
  TempDir dir;
  const auto r = run_attntune("tune --db " + shq(dir.file("t.db")) + " --problem " + kStep + " --space " +
                              shq(source_dir() + "/search_spaces/flash_bwd_mma.yaml"));
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("tune: --space with pass=fwdbwd: the passes are tuned by different templates"),
            std::string::npos)
      << r.err;
}
}  // namespace test_fwdbwd
