// Re-timing finished candidates (search/retime.hpp), which the campaign's final ranking and
// `attntune retime` share: which configs are taken, and what a round does with each result.
#include <gtest/gtest.h>

#include <deque>
#include <map>

#include "search/multi_family.hpp"
#include "search/retime.hpp"

namespace attntune::test {
namespace test_retime {
namespace {

EvaluationRow row(const std::string& family, int block, const std::string& status, double us) {
  EvaluationRow e;
  e.family = family;
  e.config = Config{{"block_m", block}};
  e.record.status = status;
  if (status == "ok") e.record.median_us = us;
  return e;
}

Config plain(const EvaluationRow& e) { return e.config; }

TEST(Retime, FastestDistinctTakesOkConfigsFastestFirstOnceEach) {
  const std::vector<EvaluationRow> rows = {row("a", 64, "ok", 30),   row("a", 128, "ok", 10),
                                           row("a", 192, "wrong", 0), row("a", 128, "ok", 12),
                                           row("a", 32, "ok", 20),   row("a", 16, "timeout", 0)};
  const std::vector<search::Retimed> top = search::fastest_distinct(rows, 10, plain);
  ASSERT_EQ(top.size(), 3u);  // 128 once (its second timing is not a second finalist); no failures
  EXPECT_EQ(top[0].config, (Config{{"block_m", 128}}));
  EXPECT_EQ(top[1].config, (Config{{"block_m", 32}}));
  EXPECT_EQ(top[2].config, (Config{{"block_m", 64}}));
  EXPECT_EQ(top[0].family, "a");
  EXPECT_TRUE(top[0].medians.empty());
  EXPECT_EQ(search::fastest_distinct(rows, 2, plain).size(), 2u);
  EXPECT_TRUE(search::fastest_distinct({row("a", 1, "wrong", 0)}, 5, plain).empty());
}

TEST(Retime, FastestDistinctSeesConfigsAsTheRunnerDoes) {
  // In a campaign of several families the same parameters in two families are two configs.
  const std::vector<EvaluationRow> rows = {row("a", 64, "ok", 10), row("b", 64, "ok", 11), row("a", 64, "ok", 12)};
  auto tagged = [](const EvaluationRow& e) { return search::tag_family(e.family, e.config); };
  const std::vector<search::Retimed> top = search::fastest_distinct(rows, 5, tagged);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].family, "a");
  EXPECT_EQ(top[1].family, "b");
  EXPECT_EQ(search::untag_family(top[1].config).first, "b");
  EXPECT_EQ(search::fastest_distinct(rows, 5, plain).size(), 1u);
}

// Answers each submit with the next scripted result for that config.
class ScriptedRunner : public search::Runner {
 public:
  std::map<std::string, std::deque<search::RunResult>> script;
  std::vector<std::string> submitted;
  const DeviceInfo& device() override { return device_; }
  std::size_t capacity() const override { return 1; }
  std::size_t outstanding() const override { return pending_.size(); }
  void submit(const Config& c) override {
    submitted.push_back(config_str(c));
    auto& q = script.at(config_str(c));
    pending_.push_back(q.front());
    q.pop_front();
  }
  std::optional<search::RunResult> next() override {
    if (pending_.empty()) return std::nullopt;
    search::RunResult r = pending_.front();
    pending_.pop_front();
    return r;
  }
  void add(const Config& c, const std::string& status, double us, bool abandoned = false) {
    search::RunResult r;
    r.config = c;
    r.source_hash = "h" + config_str(c);
    r.record.status = status;
    if (status == "ok") r.record.median_us = us, r.record.max_abs_err = us / 1000;
    else r.record.error = "it broke";
    r.abandoned = abandoned;
    script[config_str(c)].push_back(r);
  }

 private:
  DeviceInfo device_{"fake", "sm_90", "GPU-x", 132, "580"};
  std::deque<search::RunResult> pending_;
};

TEST(Retime, ARoundTimesEachFinalistOnceAndDropsOneThatFails) {
  const Config a{{"block_m", 64}}, b{{"block_m", 128}};
  ScriptedRunner runner;
  runner.add(a, "ok", 10), runner.add(a, "ok", 12), runner.add(a, "ok", 11);
  runner.add(b, "wrong", 0);
  std::vector<search::Retimed> top = {{a, "f", "", {}, 0, false, ""}, {b, "f", "", {}, 0, false, ""}};
  int seen = 0;
  auto count = [&](search::Retimed&, const search::RunResult&) { ++seen; };
  for (int round = 0; round < 3; ++round) EXPECT_TRUE(search::retime_round(runner, top, nullptr, count));
  EXPECT_EQ(seen, 4);  // b's failure is seen once, then b is never submitted again
  EXPECT_EQ(runner.submitted.size(), 4u);
  EXPECT_EQ(top[0].medians, (std::vector<double>{10, 12, 11}));
  EXPECT_DOUBLE_EQ(search::median(top[0].medians), 11);
  EXPECT_DOUBLE_EQ(top[0].max_err, 0.012);
  EXPECT_EQ(top[0].source_hash, "hblock_m=64");
  EXPECT_TRUE(top[1].failed);
  EXPECT_EQ(top[1].failure, "wrong: it broke");
  EXPECT_TRUE(top[1].medians.empty());
}

TEST(Retime, ARoundStopsShortOnAStopOrAnAbandonedCandidate) {
  const Config a{{"block_m", 64}}, b{{"block_m", 128}};
  {
    ScriptedRunner runner;
    runner.add(a, "ok", 10);
    std::vector<search::Retimed> top = {{a, "f", "", {}, 0, false, ""}, {b, "f", "", {}, 0, false, ""}};
    int asked = 0;
    EXPECT_FALSE(search::retime_round(runner, top, [&] { return ++asked > 1; }, nullptr));
    EXPECT_EQ(runner.submitted.size(), 1u);  // stopped before b
    EXPECT_EQ(top[0].medians.size(), 1u);
  }
  {
    ScriptedRunner runner;
    runner.add(a, "ok", 10, /*abandoned=*/true);
    std::vector<search::Retimed> top = {{a, "f", "", {}, 0, false, ""}};
    EXPECT_FALSE(search::retime_round(runner, top, nullptr, nullptr));
    EXPECT_TRUE(top[0].medians.empty());  // an abandoned candidate's result is no result
    EXPECT_FALSE(top[0].failed);
  }
  EXPECT_DOUBLE_EQ(search::median({4, 1, 3, 2}), 2.5);
}

}  // namespace
}  // namespace test_retime
}  // namespace attntune::test
