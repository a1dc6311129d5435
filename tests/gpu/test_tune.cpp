// `attntune tune` on the GPU end to end: a small evo campaign records every evaluation, ranks its
// top candidates, answers `best` with that ranking, and a re-run resumes without re-evaluating.
#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>
#include <sqlite3.h>

#include "db/sqlite.hpp"
#include "db/store.hpp"
#include "gpu_env.hpp"
#include "tests/common/run_attntune.hpp"

namespace test_tune {
using namespace attntune;
namespace fs = std::filesystem;

TEST(TuneGpu, SmallCampaignRanksAndResumes) {
  ATTNTUNE_REQUIRE_GPU();
  const fs::path dir = fs::temp_directory_path() / ("attntune-tune-gpu-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string db = (dir / "t.db").string();
  const std::string base = "tune --space " + source_dir() + "/search_spaces/flash_fwd_mma.yaml" +
                           " --problem b=2,h=4,hkv=2,s=333,d=64,dtype=bf16,causal=1 --db " + db +
                           " --campaign gpu --seed 3 --final-top 3 --final-rounds 2 --format json";
  auto r = attntune::testing::run_attntune(base + " --budget-evals 12");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["status"], "completed");
  EXPECT_EQ(j["evaluations"], 12);
  EXPECT_GE(j["ok"].get<int>(), 3) << r.err;
  ASSERT_EQ(j["ranking"].size(), 3u);
  EXPECT_LE(j["ranking"][0]["median_us"].get<double>(), j["ranking"][1]["median_us"].get<double>());

  // The final ranking's re-timings sample for >= 1 s each (GpuRunnerOptions::final_timing): with
  // one sample a graph replay of ~20 launches of this ~5 us kernel, that is hundreds of samples,
  // where a search timing stops at 10-15 once its median holds.
  {
    const sqlite::Connection conn = sqlite::Connection::open(db, SQLITE_OPEN_READONLY);
    auto scalar = [&](const char* sql) {
      sqlite::Statement st(conn, sql);
      return st.step() ? st.int64(0) : -1;
    };
    // The screening (--final-screen, default 24) stores only its failures: the ok final rows are the
    // 3 finalists' 2 rounds.
    EXPECT_EQ(scalar("SELECT count(*) FROM evaluations WHERE phase = 'final' AND status = 'ok'"), 6);
    EXPECT_GE(scalar("SELECT min(count) FROM evaluations WHERE phase = 'final' AND status = 'ok'"), 100);
    EXPECT_LT(scalar("SELECT min(count) FROM evaluations WHERE phase = 'search' AND status = 'ok'"), 100);
  }

  auto best = attntune::testing::run_attntune("best --db " + db + " --campaign gpu --format json");
  ASSERT_EQ(best.rc, 0) << best.err;
  EXPECT_EQ(nlohmann::json::parse(best.out)[0]["config"], j["ranking"][0]["config"]);

  // Resume with a larger budget: 4 more, none repeated.
  r = attntune::testing::run_attntune(base + " --budget-evals 16");
  ASSERT_EQ(r.rc, 0) << r.err;
  Store s = Store::open(db, Store::Mode::kReadOnly);
  const auto evals = s.campaign_evaluations(*s.find_campaign("gpu"));
  ASSERT_EQ(evals.size(), 16u);
  std::set<std::string> configs;
  for (const auto& e : evals) EXPECT_TRUE(configs.insert(config_str(e.config)).second) << config_str(e.config);
  fs::remove_all(dir);
}

// The Hopper family through the whole path: tune renders for sm_90a (the space lists only that),
// the worker receives the launch (its plan and the build's constants) over the pipe,
// and candidates validate and time. (Before the protocol carried them, every candidate failed to
// launch with INVALID_VALUE while the in-process property tests passed.)
TEST(TuneGpu, WgmmaCampaignRunsThroughTheWorker) {
  ATTNTUNE_REQUIRE_GPU();
  const fs::path dir = fs::temp_directory_path() / ("attntune-tune-wgmma-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string db = (dir / "t.db").string();
  auto r = attntune::testing::run_attntune(
      "tune --space " + source_dir() + "/search_spaces/flash_fwd_wgmma.yaml" +
      " --problem b=2,h=4,hkv=2,s=1000,d=128,dtype=bf16,causal=1 --db " + db +
      " --campaign wg --seed 5 --budget-evals 8 --final-top 2 --final-rounds 2 --format json");
  if (r.rc == 2 && r.err.find("sm_90a") != std::string::npos) GTEST_SKIP() << "no sm_90a GPU: " << r.err;
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["evaluations"], 8);
  EXPECT_GE(j["ok"].get<int>(), 6) << r.err;
  ASSERT_FALSE(j["ranking"].empty());
  fs::remove_all(dir);
}

// Both templates in one campaign on an H100 (sm_90): flash_fwd_mma built for sm_90 and
// flash_fwd_wgmma for sm_90a through one worker and one build pool; each template's share of the
// evaluations, results filed under the arch each was built for, a ranking that holds the best of
// each, and a resume that evaluates nothing twice.
TEST(TuneGpu, TwoTemplatesInOneCampaignRankTogether) {
  ATTNTUNE_REQUIRE_GPU();
  const fs::path dir = fs::temp_directory_path() / ("attntune-tune-multi-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string db = (dir / "t.db").string();
  const std::string base = "tune --space " + source_dir() + "/search_spaces/flash_fwd_mma.yaml --space " +
                           source_dir() + "/search_spaces/flash_fwd_wgmma.yaml" +
                           " --problem b=2,h=4,hkv=2,s=1000,d=128,dtype=bf16,causal=1 --db " + db +
                           " --campaign both --seed 5 --final-top 2 --final-rounds 2 --format json";
  auto r = attntune::testing::run_attntune(base + " --budget-evals 20");
  if (r.rc == 2 && r.err.find("sm_90a") != std::string::npos) GTEST_SKIP() << "no sm_90a GPU: " << r.err;
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["template"], "flash_fwd_mma+flash_fwd_wgmma");
  EXPECT_EQ(j["evaluations"], 20);
  EXPECT_GE(j["ok"].get<int>(), 12) << r.err;
  std::set<std::string> ranked;
  for (const auto& row : j["ranking"]) ranked.insert(row["template"].get<std::string>());
  EXPECT_EQ(ranked, (std::set<std::string>{"flash_fwd_mma", "flash_fwd_wgmma"})) << r.out;

  Store s = Store::open(db, Store::Mode::kReadOnly);
  std::map<std::string, int> per_template;
  for (const auto& e : s.campaign_evaluations(*s.find_campaign("both"))) ++per_template[e.family];
  EXPECT_GE(per_template["flash_fwd_mma"], 8);
  EXPECT_GE(per_template["flash_fwd_wgmma"], 8);
  BestQuery q;
  q.campaign = "both";
  q.top = 50;
  for (const BestRow& b : s.best(q)) EXPECT_EQ(b.arch, b.family == "flash_fwd_wgmma" ? "sm_90a" : "sm_90");

  auto best = attntune::testing::run_attntune("best --db " + db + " --campaign both --format json");
  ASSERT_EQ(best.rc, 0) << best.err;
  EXPECT_EQ(nlohmann::json::parse(best.out)[0]["template"], j["ranking"][0]["template"]);
  EXPECT_EQ(nlohmann::json::parse(best.out)[0]["config"], j["ranking"][0]["config"]);

  r = attntune::testing::run_attntune(base + " --budget-evals 24");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto evals = s.campaign_evaluations(*s.find_campaign("both"));
  ASSERT_EQ(evals.size(), 24u);
  std::set<std::string> configs;
  for (const auto& e : evals) EXPECT_TRUE(configs.insert(e.family + " " + config_str(e.config)).second);
  fs::remove_all(dir);
}

// `attntune retime` on a finished campaign: its top configs and its pick re-timed side by side,
// ranked again, the pick found among them, the campaign's own rows left as they were.
TEST(TuneGpu, RetimeReRanksTheTopAroundThePick) {
  ATTNTUNE_REQUIRE_GPU();
  const fs::path dir = fs::temp_directory_path() / ("attntune-retime-gpu-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string db = (dir / "t.db").string();
  auto r = attntune::testing::run_attntune(
      "tune --space " + source_dir() + "/search_spaces/flash_fwd_mma.yaml" +
      " --problem b=2,h=4,hkv=2,s=333,d=64,dtype=bf16,causal=1 --db " + db +
      " --campaign rt --seed 3 --budget-evals 10 --final-top 2 --final-rounds 1 --final-min-seconds 0.1 --format json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string pick = nlohmann::json::parse(r.out)["ranking"][0]["config"].dump();
  std::size_t evals = 0;
  {
    Store s = Store::open(db, Store::Mode::kReadOnly);
    evals = s.campaign_evaluations(*s.find_campaign("rt")).size();
  }

  r = attntune::testing::run_attntune("retime --db " + db +
                                      " --campaign rt --top 4 --rounds 2 --min-seconds 0.2 --format json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["campaign"], "rt");
  const auto& configs = j["configs"];
  ASSERT_GE(configs.size(), 4u);  // the pick may come on top of the 4 fastest search results
  ASSERT_LE(configs.size(), 5u);
  int picks = 0, rank = 0;
  double last = 0;
  for (const auto& c : configs) {
    if (c["status"] != "ok") continue;
    EXPECT_EQ(c["rank"], ++rank);
    ASSERT_EQ(c["rounds_us"].size(), 2u);
    EXPECT_GE(c["median_us"].get<double>(), last);  // fastest first
    last = c["median_us"].get<double>();
    EXPECT_GE(c["behind_pct"].get<double>(), 0.0);
    if (c["pick"].get<bool>()) {
      ++picks;
      EXPECT_EQ(c["config"].dump(), pick);
      EXPECT_DOUBLE_EQ(c["behind_pct"].get<double>(), j["pick_behind_pct"].get<double>());
    }
  }
  EXPECT_EQ(picks, 1);
  EXPECT_DOUBLE_EQ(configs[0]["behind_pct"].get<double>(), 0.0);
  EXPECT_TRUE(j["pick_holds"].get<bool>());  // no tolerance given

  // A tolerance the pick cannot miss, then one it misses unless it is the fastest.
  r = attntune::testing::run_attntune("retime --db " + db + " --campaign rt --top 2 --rounds 1 --min-seconds 0.1 "
                                      "--tolerance 1000");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("within the 1000% tolerance"), std::string::npos) << r.out;
  r = attntune::testing::run_attntune("retime --db " + db + " --campaign rt --top 2 --rounds 1 --min-seconds 0.1 "
                                      "--tolerance 0 --format csv");
  EXPECT_EQ(r.rc == 0 || r.rc == 1, true) << r.err;
  EXPECT_EQ(r.out.rfind("rank,re-timed µs,spread,behind,search µs,pick,config\n", 0), 0u) << r.out;
  if (r.rc == 1) {
    EXPECT_NE(r.err.find("beyond the 0% tolerance"), std::string::npos) << r.err;
  }

  Store s = Store::open(db, Store::Mode::kReadOnly);
  EXPECT_EQ(s.campaign_evaluations(*s.find_campaign("rt")).size(), evals);  // retime records nothing of the campaign
  fs::remove_all(dir);
}
}  // namespace test_tune
