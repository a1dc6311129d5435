// search::warm_start_configs: what tune and `replay --warm-from` hand a strategy as its head start.
// Only the asked template's configs, each once, fastest first, at most `count`, however many
// faster results of another template or duplicate configs stand ahead of them in the store.
#include <gtest/gtest.h>

#include "../db/db_test_util.hpp"
#include "search/warm_start.hpp"

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

}  // namespace
