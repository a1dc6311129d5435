// search::warm_start_configs: what tune and `replay --warm-from` hand a strategy as its head start.
// Only the asked template's configs, each once, fastest first, at most `count`, however many
// faster results of another template or duplicate configs stand ahead of them in the store.
#include <sstream>
#include <chrono>
#include <gtest/gtest.h>

#include "../db/db_test_util.hpp"
#include "search/progress.hpp"
#include "search/warm_start.hpp"
#include "service/job.hpp"

namespace test_warm_start {
using namespace attntune;
using namespace attntune::test;

namespace {

struct WarmStartTest : ::testing::Test {
  TempDir dir;
  Store store = Store::open(dir.file("attntune.db"), Store::Mode::kCreate);
  std::int64_t device = store.upsert_device(h100());
  Problem p = problem();

  std::int64_t campaign(const std::string& name, const std::string& family) {
    CampaignSpec s = spec(name, p);
    s.family = family;
    return store.open_campaign(s, device);
  }
  void result(std::int64_t campaign_id, const std::string& family, const Config& c, double us) {
    store.record_evaluation(campaign_id, store.upsert_candidate(family, c, "src-" + config_str(c)), device,
                            ok_eval(us));
  }
  std::vector<std::string> keys(const std::vector<Config>& configs) {
    std::vector<std::string> out;
    for (const Config& c : configs) out.push_back(config_str(c));
    return out;
  }
};

TEST_F(WarmStartTest, OnlyTheTemplateEachConfigOnceFastestFirst) {
  const std::int64_t a = campaign("mma-a", "flash_fwd_mma");
  const std::int64_t b = campaign("mma-b", "flash_fwd_mma");
  const std::int64_t w = campaign("wgmma", "flash_fwd_wgmma");
  // Another template's results, all faster than every mma one: 20 of them, more than the count.
  for (int i = 0; i < 20; ++i) result(w, "flash_fwd_wgmma", config(64 + 16 * i, 128), 10.0 + i);
  result(a, "flash_fwd_mma", config(128, 64), 30.0);
  result(a, "flash_fwd_mma", config(64, 64), 50.0);
  result(a, "flash_fwd_mma", config(128, 32), 40.0);
  result(b, "flash_fwd_mma", config(128, 64), 31.0);  // the same config again, in another campaign
  result(b, "flash_fwd_mma", config(64, 32), 45.0);
  store.record_evaluation(b, store.upsert_candidate("flash_fwd_mma", config(32, 32), "src-x"), device,
                          failed_eval("resources", "too much shared memory"));

  BestQuery q;
  q.problem = p;
  EXPECT_EQ(keys(search::warm_start_configs(store, q, "flash_fwd_mma", 3)),
            keys({config(128, 64), config(128, 32), config(64, 32)}));
  // Asking for more than there is: every distinct ok config of the template, and no failed one.
  EXPECT_EQ(keys(search::warm_start_configs(store, q, "flash_fwd_mma", 50)),
            keys({config(128, 64), config(128, 32), config(64, 32), config(64, 64)}));
  EXPECT_TRUE(search::warm_start_configs(store, q, "flash_fwd_mma", 0).empty());
  EXPECT_EQ(search::warm_start_configs(store, q, "flash_fwd_wgmma").size(), search::kWarmStartConfigs);
  EXPECT_TRUE(search::warm_start_configs(store, q, "no_such_template").empty());
  // One campaign only (replay --warm-from NAME).
  BestQuery one;
  one.campaign = "mma-b";
  EXPECT_EQ(keys(search::warm_start_configs(store, one, "flash_fwd_mma")), keys({config(128, 64), config(64, 32)}));
}

// The moves a family's launch plan predicts pay (Family::plan_moves) come right after the first
// warm config, the last giving way, and are said; without a device, or where the plan predicts
// nothing, the warm start is the neighbour's configs alone.
TEST_F(WarmStartTest, ThePlansPredictedMovesComeSecond) {
  const service::JobSpaces spaces =
      service::load_space_files({ATTNTUNE_SOURCE_DIR "/search_spaces/flash_fwd_wgmma.yaml"}, "tune");
  const SearchSpace& space = *spaces.sorted[0];
  const Problem target = Problem::parse("b=1,h=28,hkv=4,s=1536,sk=9728,d=128,dtype=bf16,causal=1");
  p = Problem::parse("b=1,h=28,hkv=4,s=1536,sk=8192,d=128,dtype=bf16,causal=1");  // its tuned neighbour
  const std::int64_t n = campaign("chunk", "flash_fwd_wgmma");
  const Config pick = space.parse_config(
      "block_m=128,block_n=160,exp2_emu=0,fa4_loop=true,fold_fma=false,head_group=1,intra_wg_overlap=true,k"
      "_perm=false,kv_multicast=false,lazy_rescale=0,mask_bits=false,narrow_n=0,pack_gqa=true,persistent=true,ping_pong=false,pp_pv=false,producer_regs=24,pv_buffers=1,pv_chunks=1,softcap_tanh=accurate,split_tail=false,stages=2,warp_specialize=true,wg_uniform=true");
  Config second = pick, third = pick;
  second["stages"] = std::int64_t{3};
  third["block_n"] = std::int64_t{176};
  result(n, "flash_fwd_wgmma", pick, 300.0);
  result(n, "flash_fwd_wgmma", second, 310.0);
  result(n, "flash_fwd_wgmma", third, 320.0);
  Config split = pick;
  split["split_tail"] = true;
  split["producer_regs"] = std::int64_t{40};

  auto warm = [&](const service::WarmStartDevice* device, std::string* said) {
    search::TuneOptions topts;
    std::ostringstream out;
    {
      search::Progress progress(out, false, std::chrono::seconds(30));
      service::add_warm_starts(topts, store, spaces, target, 3, progress, nullptr, "", device);
    }
    *said = out.str();
    return keys(topts.warm_start);
  };
  std::string said;
  const service::WarmStartDevice h100{132, [](const std::string&) { return std::string("sm_90a"); }};
  EXPECT_EQ(warm(&h100, &said), keys({pick, split, second}));
  EXPECT_NE(said.find("warm start: 2 configs from " + p.str()), std::string::npos) << said;
  EXPECT_NE(said.find("flash_fwd_wgmma's launch plan predicts runs this problem sooner on 132 SMs: " +
                      config_str(split)),
            std::string::npos)
      << said;
  EXPECT_EQ(warm(nullptr, &said), keys({pick, second, third}));
  EXPECT_EQ(said.find("launch plan"), std::string::npos) << said;
  const service::WarmStartDevice unknown{0, h100.arch_for};
  EXPECT_EQ(warm(&unknown, &said), keys({pick, second, third}));
  // Already among the neighbour's: not twice.
  result(n, "flash_fwd_wgmma", split, 305.0);
  EXPECT_EQ(warm(&h100, &said), keys({pick, split, second}));
  EXPECT_EQ(said.find("launch plan"), std::string::npos) << said;
}

}  // namespace

namespace {

// Any ResultReader serves: warm_start_configs asks best() for more rows, doubling, until `count`
// configs of the template are in or the rows run out.
class ScriptedResults : public ResultReader {
 public:
  std::vector<BestRow> rows;
  std::vector<int> asked;  // query.top of each best() call

  const std::string& path() const noexcept override { return path_; }
  std::optional<std::int64_t> find_campaign(const std::string&) override { return std::nullopt; }
  std::optional<CampaignRow> campaign_row(const std::string&) override { return std::nullopt; }
  std::vector<CampaignRow> campaigns() override { return {}; }
  std::vector<EvaluationRow> campaign_evaluations(std::int64_t) override { return {}; }
  std::vector<BestRow> best(const BestQuery& q) override {
    asked.push_back(q.top);
    return {rows.begin(), rows.begin() + std::min<std::ptrdiff_t>(q.top, static_cast<std::ptrdiff_t>(rows.size()))};
  }
  std::vector<Problem> problems_with_results(const std::string&) override { return {}; }
  std::vector<std::string> result_gpus(const BestQuery&) override { return {}; }

 private:
  std::string path_ = "(scripted)";
};

BestRow row(const std::string& family, const Config& c) {
  BestRow r;
  r.family = family;
  r.config = c;
  return r;
}

// service::warm_start, what tune hands the search: the nearest problems' bests in turns (each one's
// best, nearest first, then each one's second; a config already taken skipped), from at most
// kWarmStartProblems problems within kWarmStartReach of the nearest; the time is the nearest's best.
TEST_F(WarmStartTest, TheNearestProblemsBestsInTurns) {
  const auto tuned = [&](const std::string& name, const std::string& spec_text,
                         const std::vector<std::pair<Config, double>>& results) {
    CampaignSpec s = spec(name, Problem::parse(spec_text));
    s.family = "flash_fwd_mma";
    const std::int64_t id = store.open_campaign(s, device);
    for (const auto& [c, us] : results) result(id, "flash_fwd_mma", c, us);
  };
  const Problem target = Problem::parse("b=1,h=16,s=4096,d=128,dtype=bf16,causal=0");
  tuned("same", target.str(), {{config(128, 64), 100}, {config(64, 64), 110}, {config(128, 32), 120}});
  tuned("heads", "b=1,h=32,s=4096,d=128,dtype=bf16,causal=0", {{config(64, 32), 200}, {config(128, 64), 210}});
  tuned("kv", "b=1,h=16,hkv=4,s=4096,d=128,dtype=bf16,causal=0", {{config(32, 32), 90}});
  tuned("twice", "b=1,h=16,s=8192,d=128,dtype=bf16,causal=0", {{config(64, 128), 400}});   // a 4th within reach
  tuned("far", "b=1,h=16,s=32768,d=128,dtype=bf16,causal=0", {{config(32, 64), 900}});     // beyond it
  tuned("d64", "b=1,h=16,s=4096,d=64,dtype=bf16,causal=0", {{config(32, 128), 10}});       // another head dim

  double best_us = 0;
  std::size_t problems = 0;
  const auto [nearest, configs] = service::warm_start(store, "flash_fwd_mma", target, 5, &best_us, &problems);
  ASSERT_TRUE(nearest);
  EXPECT_EQ(*nearest, target);
  EXPECT_DOUBLE_EQ(best_us, 100);
  EXPECT_EQ(problems, 3u);
  EXPECT_EQ(keys(configs), keys({config(128, 64), config(64, 32), config(32, 32), config(64, 64), config(128, 32)}))
      << "same's best, heads', kv's, then same's second (heads' second is same's best: skipped), same's third";
  const auto two = service::warm_start(store, "flash_fwd_mma", target, 2, nullptr, &problems);
  EXPECT_EQ(keys(two.second), keys({config(128, 64), config(64, 32)}));
  EXPECT_EQ(problems, 2u);
  // Beyond reach of the nearest: the nearest alone.
  const Problem long_one = Problem::parse("b=1,h=16,s=32768,d=128,dtype=bf16,causal=0");
  const auto alone = service::warm_start(store, "flash_fwd_mma", long_one, 8, &best_us, &problems);
  EXPECT_EQ(*alone.first, long_one);
  EXPECT_EQ(keys(alone.second), keys({config(32, 64)}));
  EXPECT_EQ(problems, 1u);
  EXPECT_DOUBLE_EQ(best_us, 900);
}

// A problem tuned on two GPU models (the shipped file once it holds H100 results beside the H200's):
// a campaign on one of them starts from that model's own pick, ranked by its own times; the other
// model's times are all shorter and would put its configs first. A neighbour tuned on the other
// model only still gives its configs, and a template the campaign's model has no result of takes
// the other model's.
TEST_F(WarmStartTest, ACampaignsOwnGpuModelsResultsFirst) {
  DeviceInfo h200 = h100();
  h200.name = "NVIDIA H200";
  h200.uuid = "GPU-other";
  const std::int64_t other = store.upsert_device(h200);
  const Problem target = Problem::parse("b=1,h=16,s=4096,d=128,dtype=bf16,causal=0");
  const auto tuned = [&](const std::string& name, const Problem& prob, const std::string& family, std::int64_t dev,
                         const std::vector<std::pair<Config, double>>& results) {
    CampaignSpec s = spec(name, prob);
    s.family = family;
    const std::int64_t id = store.open_campaign(s, dev);
    for (const auto& [c, us] : results)
      store.record_evaluation(id, store.upsert_candidate(family, c, "src-" + config_str(c)), dev, ok_eval(us));
  };
  tuned("h200", target, "flash_fwd_mma", other, {{config(64, 64), 80}, {config(128, 32), 85}});
  tuned("h100", target, "flash_fwd_mma", device, {{config(128, 64), 100}, {config(64, 64), 120}});
  tuned("h200-wgmma", target, "flash_fwd_wgmma", other, {{config(128, 128), 70}});
  tuned("h200-heads", Problem::parse("b=1,h=32,s=4096,d=128,dtype=bf16,causal=0"), "flash_fwd_mma", other,
        {{config(32, 32), 150}});

  double best_us = 0;
  const std::string h100_name = h100().name;
  auto [nearest, configs] = service::warm_start(store, "flash_fwd_mma", target, 3, &best_us, nullptr, h100_name);
  ASSERT_TRUE(nearest);
  EXPECT_EQ(keys(configs), keys({config(128, 64), config(32, 32), config(64, 64)}))
      << "the H100's best (its own time), the neighbour's (H200 only), the H100's second";
  EXPECT_DOUBLE_EQ(best_us, 100);
  // For the H200, or for any model: the H200's times rank the problem's configs.
  std::tie(nearest, configs) = service::warm_start(store, "flash_fwd_mma", target, 2, &best_us, nullptr, "NVIDIA H200");
  EXPECT_EQ(keys(configs), keys({config(64, 64), config(32, 32)}));
  EXPECT_DOUBLE_EQ(best_us, 80);
  std::tie(nearest, configs) = service::warm_start(store, "flash_fwd_mma", target, 1, &best_us);
  EXPECT_EQ(keys(configs), keys({config(64, 64)}));
  // No H100 result of this template: the H200's.
  std::tie(nearest, configs) = service::warm_start(store, "flash_fwd_wgmma", target, 2, &best_us, nullptr, h100_name);
  EXPECT_EQ(keys(configs), keys({config(128, 128)}));
  EXPECT_DOUBLE_EQ(best_us, 70);
}

TEST(WarmStartReader, AsksForMoreRowsUntilTheTemplateHasEnough) {
  ScriptedResults results;
  for (int i = 0; i < 10; ++i) results.rows.push_back(row("flash_fwd_wgmma", config(16 * (i + 1), 64)));
  results.rows.push_back(row("flash_fwd_mma", config(128, 64)));
  results.rows.push_back(row("flash_fwd_mma", config(64, 64)));
  const std::vector<Config> got = search::warm_start_configs(results, BestQuery{}, "flash_fwd_mma", 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(config_str(got[0]), config_str(config(128, 64)));
  EXPECT_EQ(results.asked, (std::vector<int>{2, 4, 8, 16}));
}

}  // namespace
}  // namespace test_warm_start
