// `attntune export` and the backward pass (pass=bwd, issue 45), on the CPU: a model's plan of forward
// and backward problems (a training step's) exports both into one library, naming the plan's problems
// that have no result yet with their pass, and the PyTorch package's tuner.json lists every family
// with a shipped space, with the passes it tunes where its space names them. (test_export_bwd.cpp
// checks the file itself: its info, labels, header, dispatcher and the backward entry point's checks.)
#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include "core/problem.hpp"
#include "export/torch_package.hpp"
#include "families/family.hpp"
#include "space/search_space.hpp"
#include "tests/common/run_attntune.hpp"
#include "tests/unit/db/db_test_util.hpp"
#include "tests/unit/export/export_db.hpp"
#include "tests/unit/export/nvcc_util.hpp"

namespace test_export_backward {
using namespace attntune;
using attntune::test::ExportDb;
using attntune::test::info_from_source;
using attntune::test::read_bytes;
using attntune::test::shq;
using attntune::test::TempDir;
using attntune::testing::source_dir;

namespace {

const std::string kFwd = "b=1,h=8,s=512,d=128,dtype=bf16,causal=1";
const std::string kBwd = kFwd + ",pass=bwd";
const std::string kUntuned = "b=1,h=8,s=2048,d=64,dtype=bf16,causal=0,pass=bwd";

TEST(ExportBackward, APlanOfForwardAndBackwardProblemsExportsBoth) {
  TempDir dir;
  ExportDb d{dir.file("r.db"), source_dir()};
  d.campaign("flash_fwd_mma", "fwd", kFwd, {d.config("flash_fwd_mma", kFwd, {})}, {100});
  d.campaign("flash_bwd_mma", "bwd", kBwd, {d.config("flash_bwd_mma", kBwd, {})}, {250});
  const std::string plan = dir.file("train.json");
  {
    std::ofstream f(plan);
    f << nlohmann::json{{"model", "train"},
                        {"source", "test"},
                        {"problems",
                         {{{"problem", kFwd}, {"regime", "train"}},
                          {{"problem", kBwd}, {"regime", "train"}},
                          {{"problem", kUntuned}, {"regime", "train"}}}}}
             .dump();
  }
  const std::string out = dir.file("train.cu");
  const auto r = attntune::testing::run_attntune("export --db " + shq(dir.file("r.db")) + " --all-best --plan " +
                                                 shq(plan) + " -o " + shq(out) + " --no-shipped");
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json info = info_from_source(read_bytes(out));
  ASSERT_EQ(info.at("kernels").size(), 2u) << info.dump(2);
  EXPECT_EQ(info.at("entry_points").at("attntune_attention_forward"),
            nlohmann::json::array({Problem::parse(kFwd).str()}));
  EXPECT_EQ(info.at("entry_points").at("attntune_attention_backward"),
            nlohmann::json::array({Problem::parse(kBwd).str()}));
  // The plan's untuned backward problem is named as one to tune next, with its pass.
  EXPECT_NE(r.err.find("attntune: note: 1 of the plan's 3 problems have no result yet (attntune status): " +
                       Problem::parse(kUntuned).str() + "\n"),
            std::string::npos)
      << r.err;
}

// tuner.json lists every family with a shipped space; a family whose space names its passes (`pass:
// [bwd]`: flash_bwd_mma) carries them as "pass", the others none (the forward alone, as before).
TEST(ExportBackward, TunerJsonListsEveryFamilyWithItsPasses) {
  const nlohmann::json j = nlohmann::json::parse(tuner_support_json());
  std::map<std::string, nlohmann::json> listed;
  for (const auto& f : j.at("families")) listed[f.at("family").get<std::string>()] = f;
  int shipped = 0;
  for (const std::string& family : known_families()) {
    const auto space = SearchSpace::shipped(family);
    if (!space) continue;
    ++shipped;
    ASSERT_EQ(listed.count(family), 1u) << family;
    const nlohmann::json& support = listed[family].at("support");
    bool named = false;
    for (const auto& [field, values] : space->problem_support())
      if (field == "pass") {
        named = true;
        EXPECT_EQ(support.at("pass"), nlohmann::json(values)) << family;
      }
    if (!named) {
      EXPECT_FALSE(support.contains("pass")) << family;
    }
  }
  EXPECT_GE(shipped, 5);
  EXPECT_EQ(listed.at("flash_bwd_mma").at("support").at("pass"), nlohmann::json::array({"bwd"}));
  EXPECT_EQ(listed.at("flash_bwd_mma").at("regimes"), nlohmann::json::array({"train"}));
}

}  // namespace
}  // namespace test_export_backward
