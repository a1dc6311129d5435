// `attntune space` end to end, through the built binary.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "space/search_space.hpp"
#include "tests/common/run_attntune.hpp"

namespace test_cmd_space {
using namespace attntune;
using attntune::testing::lines;
using attntune::testing::Outcome;
using attntune::testing::run_attntune;

namespace {

const std::string kFlash = std::string(ATTNTUNE_SOURCE_DIR) + "/tests/data/spaces/flash_fwd_mma.yaml";
const std::string kProblem = "b=4,h=16,s=4096,d=128,dtype=bf16,causal=1";

}  // namespace

TEST(CmdSpace, CountPrintsTheNumberAlone) {
  const SearchSpace sp = SearchSpace::load(kFlash);
  const auto expected = sp.count(Problem::parse(kProblem), "sm_89");
  const Outcome r = run_attntune("space --space " + kFlash + " --problem " + kProblem + " --arch sm_89 --count");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, std::to_string(expected) + "\n");
  EXPECT_EQ(r.err, "");
  // The default arch is the highest listed, sm_90, which has more shared memory.
  const Outcome d = run_attntune("space --space " + kFlash + " --problem " + kProblem + " --count");
  EXPECT_EQ(d.out, std::to_string(sp.count(Problem::parse(kProblem), "sm_90")) + "\n");
  EXPECT_GT(std::stoull(d.out), expected);
}

TEST(CmdSpace, ListInEveryFormat) {
  const SearchSpace sp = SearchSpace::load(kFlash);
  const auto configs = sp.enumerate(Problem::parse(kProblem), "sm_90");
  const std::string base = "space --space " + kFlash + " --problem " + kProblem + " --list";

  const Outcome csv = run_attntune(base + " --format csv");
  ASSERT_EQ(csv.rc, 0) << csv.err;
  const auto rows = lines(csv.out);
  ASSERT_EQ(rows.size(), configs.size() + 1);
  EXPECT_EQ(rows[0], "block_m,block_n,warps,kv_stages,q_in_regs,min_blocks,frag_prefetch,lazy_rescale,kv_schedule,sub_n");
  const Config& c0 = configs[0];
  std::string first;
  for (const auto& p : sp.params()) first += (first.empty() ? "" : ",") + value_str(c0.at(p.name));
  EXPECT_EQ(rows[1], first);

  const Outcome json = run_attntune(base + " --format json");
  ASSERT_EQ(json.rc, 0) << json.err;
  const auto j = nlohmann::json::parse(json.out);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), configs.size());
  for (std::size_t i = 0; i < configs.size(); ++i) ASSERT_EQ(config_from_json(j[i]), configs[i]) << i;

  const Outcome table = run_attntune(base);
  ASSERT_EQ(table.rc, 0) << table.err;
  const auto trows = lines(table.out);
  ASSERT_EQ(trows.size(), configs.size() + 1);
  EXPECT_EQ(trows[0].rfind("block_m", 0), 0u);
  EXPECT_NE(trows[0].find("kv_schedule"), std::string::npos);

  const Outcome derived = run_attntune(base + " --derived --format csv");
  ASSERT_EQ(derived.rc, 0) << derived.err;
  EXPECT_EQ(lines(derived.out)[0],
            rows[0] + ",threads,warp_rows,m_tiles,smem_bytes,blockwise");
}

TEST(CmdSpace, DescribeAndSummarize) {
  const Outcome d = run_attntune("space --space " + kFlash);
  ASSERT_EQ(d.rc, 0) << d.err;
  EXPECT_NE(d.out.find("flash_fwd_mma: FA2-class forward kernel"), std::string::npos);
  EXPECT_NE(d.out.find("73728 points before constraints"), std::string::npos);
  EXPECT_NE(d.out.find("sm_80, sm_86, sm_89, sm_90 (default sm_90)"), std::string::npos);
  EXPECT_NE(d.out.find("smem_bytes <= max_smem_per_block"), std::string::npos);

  const Outcome dj = run_attntune("space --space " + kFlash + " --format json");
  ASSERT_EQ(dj.rc, 0) << dj.err;
  const auto j = nlohmann::json::parse(dj.out);
  EXPECT_EQ(j["raw_size"], 73728);
  EXPECT_EQ(j["params"].size(), 10u);
  EXPECT_EQ(j["device_limits"]["sm_89"]["max_smem_per_block"], 101376);

  const SearchSpace sp = SearchSpace::load(kFlash);
  const auto valid = sp.count(Problem::parse(kProblem), "sm_90");
  const Outcome s = run_attntune("space --space " + kFlash + " --problem " + kProblem);
  ASSERT_EQ(s.rc, 0) << s.err;
  EXPECT_NE(s.out.find("valid     " + std::to_string(valid) + " ("), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("never valid: 224, 256"), std::string::npos) << s.out;

  const Outcome sj = run_attntune("space --space " + kFlash + " --problem " + kProblem + " --format json");
  ASSERT_EQ(sj.rc, 0) << sj.err;
  const auto k = nlohmann::json::parse(sj.out);
  EXPECT_EQ(k["valid"], valid);
  std::uint64_t rejected = 0;
  for (const auto& c : k["constraints"]) rejected += c["rejected_first"].get<std::uint64_t>();
  EXPECT_EQ(rejected + valid, 73728u);
}

TEST(CmdSpace, BadInputExitsTwoWithOneErrorLine) {
  const std::string bad = std::string(ATTNTUNE_SOURCE_DIR) + "/tests/data/spaces/bad/unknown_name.yaml";
  const Outcome r = run_attntune("space --space " + bad + " --problem " + kProblem + " --count");
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "attntune: error: " + bad + ":10:16: constraint: unknown name 'wraps' (did you mean 'warps'?)\n");

  const Outcome missing = run_attntune("space --space /nonexistent/x.yaml");
  EXPECT_EQ(missing.rc, 2);
  EXPECT_EQ(missing.err, "attntune: error: /nonexistent/x.yaml: no such file\n");

  const Outcome no_problem = run_attntune("space --space " + kFlash + " --count");
  EXPECT_EQ(no_problem.rc, 2);
  EXPECT_EQ(no_problem.err,
            "attntune: error: space: --count needs --problem (which configs are valid depends on the problem)\n");
  EXPECT_EQ(run_attntune("space --space " + kFlash + " --list").rc, 2);

  const Outcome arch = run_attntune("space --space " + kFlash + " --arch sm_75");
  EXPECT_EQ(arch.rc, 2);
  EXPECT_EQ(arch.err, "attntune: error: flash_fwd_mma does not support arch sm_75 (supported: sm_80, sm_86, sm_89, sm_90)\n");

  const Outcome d96 = run_attntune("space --space " + kFlash + " --problem b=1,h=1,s=64,d=96,dtype=fp16,causal=0 --count");
  EXPECT_EQ(d96.rc, 2);
  EXPECT_EQ(d96.err, "attntune: error: flash_fwd_mma does not support d=96 (supported: 64, 128, 192, 256)\n");

  const Outcome prob = run_attntune("space --space " + kFlash + " --problem b=1,h=1 --count");
  EXPECT_EQ(prob.rc, 2);
  EXPECT_EQ(prob.err.rfind("attntune: error: problem: missing key", 0), 0u) << prob.err;

  EXPECT_EQ(run_attntune("space --space " + kFlash + " --format csv").rc, 2);
  EXPECT_EQ(run_attntune("space --space " + kFlash + " --problem " + kProblem + " --count --list").rc, 2);
  EXPECT_EQ(run_attntune("space").rc, 2);  // --space is required
  EXPECT_EQ(run_attntune("space --help").rc, 0);
}

// A varlen problem's summary says the packed batch it stands for: the drawn lengths (the table
// shows the first 16; JSON has every one, queries and keys), so tools need not draw them again.
TEST(CmdSpace, VarlenSummaryShowsTheDrawnLengths) {
  const std::string spec = "b=20,h=8,s=500,sk=530,d=128,dtype=bf16,causal=1,varlen=7,lens_seed=3";
  const Problem p = Problem::parse(spec);
  const std::vector<int> lens = p.q_lens();
  const Outcome t = run_attntune("space --space " + kFlash + " --problem " + spec);
  ASSERT_EQ(t.rc, 0) << t.err;
  std::string first16;
  for (int i = 0; i < 16; ++i) first16 += (i ? "," : "") + std::to_string(lens[static_cast<std::size_t>(i)]);
  EXPECT_NE(t.out.find("sequences  20 of "), std::string::npos) << t.out;
  EXPECT_NE(t.out.find(std::to_string(p.total_q()) + " packed, keys 30 more each): " + first16 + ",...\n"),
            std::string::npos)
      << t.out;
  const Outcome j = run_attntune("space --space " + kFlash + " --problem " + spec + " --format json");
  ASSERT_EQ(j.rc, 0) << j.err;
  const nlohmann::json doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc["lens_q"].get<std::vector<int>>(), lens);
  EXPECT_EQ(doc["lens_k"].get<std::vector<int>>(), p.k_lens());
  // A dense problem has neither.
  const Outcome d = run_attntune("space --space " + kFlash + " --problem " + kProblem + " --format json");
  EXPECT_FALSE(nlohmann::json::parse(d.out).contains("lens_q"));
  EXPECT_EQ(run_attntune("space --space " + kFlash + " --problem " + kProblem).out.find("sequences"), std::string::npos);
}
}  // namespace test_cmd_space
