// `attntune export` and the backward pass (pass=bwd, issue 45), on the CPU: the export's entry points
// are the forward's, so a backward result is refused with the reason wherever it comes from (the
// campaign, the problem, the CLI), `--all-best` leaves backward results out rather than fail, and the
// PyTorch package's tuner.json lists only families that tune the forward pass.
#include <algorithm>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include "core/error.hpp"
#include "export/export.hpp"
#include "export/select.hpp"
#include "export/torch_package.hpp"
#include "families/family.hpp"
#include "space/search_space.hpp"
#include "tests/common/input_error.hpp"
#include "tests/common/run_attntune.hpp"
#include "tests/unit/db/db_test_util.hpp"
#include "tests/unit/export/export_db.hpp"

using namespace attntune;
using attntune::test::ExportDb;
using attntune::test::TempDir;
using attntune::testing::input_error_of;
using attntune::testing::source_dir;

namespace {

const std::string kFwd = "b=1,h=8,s=512,d=128,dtype=bf16,causal=1";
const std::string kBwd = kFwd + ",pass=bwd";

TEST(ExportBackward, ABackwardResultIsRefusedAndAllBestLeavesItOut) {
  TempDir dir;
  ExportDb d{dir.file("r.db"), source_dir()};
  const Config c = d.config("flash_fwd_mma", kFwd, {});
  d.campaign("flash_fwd_mma", "fwd", kFwd, {c}, {100});
  // A backward campaign as a backward family would record it (no shipped space tunes it yet: the
  // forward family's config, a source of its own).
  d.campaign("flash_fwd_mma", "bwd", kBwd, {c}, {250}, std::string(64, 'b'));

  for (const bool by_campaign : {true, false}) {
    ExportQuery q;
    if (by_campaign) q.campaign = "bwd";
    else q.problem = Problem::parse(kBwd);
    const auto items = select_for_export(d.store(), q);
    ASSERT_EQ(items.size(), 1u);
    const std::string why = input_error_of([&] { export_source(items, ExportMode::kSingle); });
    EXPECT_NE(why.find("export: \"" + Problem::parse(kBwd).str() +
                       "\" is the backward pass (pass=bwd), which exports in a later step"),
              std::string::npos)
        << why;
  }
  ExportQuery all;
  all.all_best = true;
  const auto items = select_for_export(d.store(), all);
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0].row.campaign, "fwd");
  EXPECT_NO_THROW(export_source(items, ExportMode::kAllBest));

  // The CLI says so before reading any database.
  const auto r = attntune::testing::run_attntune("export --db " + dir.file("none.db") + " --problem " + kBwd + " -o " +
                                                 dir.file("x.cu") + " --no-shipped");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("is the backward pass (pass=bwd), which exports in a later step"), std::string::npos) << r.err;
}

// The ops call the forward entry points only: a family whose shipped space tunes the backward pass
// alone (`pass: [bwd]`) is no answer to "which family tunes this call" (every other one is listed).
TEST(ExportBackward, TunerJsonListsTheFamiliesThatTuneTheForwardPass) {
  const nlohmann::json j = nlohmann::json::parse(tuner_support_json());
  std::set<std::string> listed;
  for (const auto& f : j.at("families")) listed.insert(f.at("family").get<std::string>());
  int shipped = 0;
  for (const std::string& family : known_families()) {
    const auto space = SearchSpace::shipped(family);
    if (!space) continue;
    ++shipped;
    bool forward = true;
    for (const auto& [field, values] : space->problem_support())
      if (field == "pass") forward = std::find(values.begin(), values.end(), "fwd") != values.end();
    EXPECT_EQ(listed.count(family), forward ? 1u : 0u) << family;
  }
  EXPECT_GE(shipped, 4);
}

}  // namespace
