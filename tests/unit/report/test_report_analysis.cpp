// The report's analysis on handmade evaluation lists: timestamps, best-so-far steps, time offsets
// and gaps, statuses counted, parameter effects and their one-line readings.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include "report/analysis.hpp"

namespace test_report_analysis {
using namespace attntune;
using namespace attntune::report;

namespace {

EvaluationRow row(std::int64_t seq, const std::string& at, const Config& c, const std::string& status,
                  std::optional<double> us = std::nullopt) {
  EvaluationRow r;
  r.seq = seq;
  r.config = c;
  r.record.status = status;
  if (status == "ok") {
    r.record.median_us = us;
    r.record.tflops = 1000.0 / *us;  // tflops * us is constant for one problem
    r.record.max_abs_err = 1e-3;
  } else {
    r.record.error = "something went wrong";
  }
  r.evaluated_at = at;
  return r;
}

Config cfg(std::int64_t block_n, bool q_in_regs, const std::string& schedule = "interleaved") {
  return {{"block_n", block_n}, {"q_in_regs", q_in_regs}, {"kv_schedule", schedule}};
}

// Ten evaluations over two runs: a gap of two hours between eval 6 and eval 7.
std::vector<EvaluationRow> campaign() {
  return {
      row(1, "2026-11-22T10:00:00.000Z", cfg(32, false), "ok", 20.0),
      row(2, "2026-11-22T10:00:01.500Z", cfg(64, false), "ok", 12.0),
      row(3, "2026-11-22T10:00:02.000Z", cfg(128, false), "resources"),
      row(4, "2026-11-22T10:00:03.250Z", cfg(64, true), "ok", 13.0),
      row(5, "2026-11-22T10:00:04.000Z", cfg(32, true), "timeout"),
      row(6, "2026-11-22T10:00:05.000Z", cfg(128, true), "resources"),
      row(7, "2026-11-22T12:00:05.000Z", cfg(64, true, "blockwise"), "ok", 10.0),
      row(8, "2026-11-22T12:00:06.000Z", cfg(32, true, "blockwise"), "ok", 11.8),
      row(9, "2026-11-22T12:00:07.000Z", cfg(64, false, "blockwise"), "wrong_result"),
      row(10, "2026-11-22T12:00:08.000Z", cfg(32, false, "blockwise"), "ok", 14.0),
  };
}

const ParamEffect& param(const std::vector<ParamEffect>& ps, const std::string& name) {
  for (const auto& p : ps)
    if (p.name == name) return p;
  throw std::runtime_error("no parameter " + name);
}

const ValueEffect& value(const ParamEffect& p, const Value& v) {
  for (const auto& e : p.values)
    if (e.value == v) return e;
  throw std::runtime_error("no value " + value_str(v));
}

}  // namespace

TEST(ReportAnalysis, ParsesTheStoresTimestamps) {
  EXPECT_DOUBLE_EQ(*parse_utc("1970-01-01T00:00:00Z"), 0);
  EXPECT_DOUBLE_EQ(*parse_utc("1970-01-02T00:00:01.500Z"), 86401.5);
  EXPECT_DOUBLE_EQ(*parse_utc("2000-03-01T00:00:00.000Z"), 951868800);  // after a leap day
  EXPECT_NEAR(*parse_utc("2026-11-22T10:00:00.123Z") - *parse_utc("2026-11-21T10:00:00.000Z"), 86400.123, 1e-6);
  for (const char* bad : {"", "2026-11-22 10:00:00", "2026-11-22T10:00:00", "2026-13-01T00:00:00Z",
                          "2026-11-22T10:00:00.Z", "2026-11-22T10:0a:00.000Z", "yesterday"})
    EXPECT_FALSE(parse_utc(bad).has_value()) << bad;
}

TEST(ReportAnalysis, CountsEveryStatus) {
  const auto counts = status_counts(campaign());
  const std::map<std::string, std::int64_t> expected = {
      {"ok", 6}, {"resources", 2}, {"timeout", 1}, {"wrong_result", 1}};
  EXPECT_EQ(counts, expected);
  EXPECT_EQ(status_summary(counts), "6 ok, 2 resources, 1 timeout, 1 wrong_result");
  const Analysis a = analyze(campaign());
  EXPECT_EQ(a.evaluations, 10);
  EXPECT_EQ(a.ok, 6);
  EXPECT_EQ(a.by_status, expected);
}

TEST(ReportAnalysis, TimeCountsFromTheFirstEvaluationAndFindsTheGap) {
  const auto rows = campaign();
  const Timeline t = timeline(rows);
  ASSERT_EQ(t.seconds.size(), rows.size());
  EXPECT_DOUBLE_EQ(t.seconds[0], 0);
  EXPECT_DOUBLE_EQ(t.seconds[1], 1.5);
  EXPECT_DOUBLE_EQ(t.seconds[3], 3.25);
  EXPECT_DOUBLE_EQ(t.seconds[6], 7205);  // shown as is: the gap stays on the time axis
  EXPECT_DOUBLE_EQ(t.span_seconds, 7208);
  ASSERT_EQ(t.gaps.size(), 1u);
  EXPECT_EQ(t.gaps[0].after_eval, 6);
  EXPECT_DOUBLE_EQ(t.gaps[0].start_seconds, 5);
  EXPECT_DOUBLE_EQ(t.gaps[0].seconds, 7200);
  EXPECT_DOUBLE_EQ(t.active_seconds, 8);
}

TEST(ReportAnalysis, SlowCandidatesAreNotGaps) {
  // Evaluations a minute apart (slow compiles) are work, not a stopped campaign.
  std::vector<EvaluationRow> rows;
  for (int i = 0; i < 5; ++i)
    rows.push_back(row(i + 1, fmt::format("2026-11-22T10:{:02}:00.000Z", i * 4), cfg(64, true), "ok", 10.0 + i));
  const Timeline t = timeline(rows);
  EXPECT_TRUE(t.gaps.empty());
  EXPECT_DOUBLE_EQ(t.active_seconds, 960);
}

TEST(ReportAnalysis, UnreadableTimestampsTakeThePreviousTime) {
  auto rows = campaign();
  rows[2].evaluated_at = "garbled";
  const Timeline t = timeline(rows);
  EXPECT_DOUBLE_EQ(t.seconds[2], 1.5);
  EXPECT_DOUBLE_EQ(t.seconds[3], 3.25);
}

TEST(ReportAnalysis, ConvergenceKeepsTheImprovementsThenTheLast) {
  const auto rows = campaign();
  const auto points = convergence(rows, timeline(rows));
  ASSERT_EQ(points.size(), 4u);
  EXPECT_EQ(points[0].eval, 1);
  EXPECT_DOUBLE_EQ(points[0].best_us, 20);
  EXPECT_EQ(points[1].eval, 2);
  EXPECT_DOUBLE_EQ(points[1].best_us, 12);
  EXPECT_DOUBLE_EQ(points[1].seconds, 1.5);
  EXPECT_EQ(points[2].eval, 7);
  EXPECT_DOUBLE_EQ(points[2].best_us, 10);
  EXPECT_DOUBLE_EQ(points[2].seconds, 7205);
  EXPECT_EQ(points[2].config, cfg(64, true, "blockwise"));
  EXPECT_DOUBLE_EQ(*points[2].tflops, 100);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(points[i].improved);
  // The closing point: the last evaluation, holding the best.
  EXPECT_EQ(points[3].eval, 10);
  EXPECT_DOUBLE_EQ(points[3].best_us, 10);
  EXPECT_DOUBLE_EQ(points[3].seconds, 7208);
  EXPECT_FALSE(points[3].improved);
}

TEST(ReportAnalysis, ConvergenceNeedsAnOkResultAndNeverRepeatsTheLast) {
  std::vector<EvaluationRow> failed = {row(1, "2026-11-22T10:00:00.000Z", cfg(32, true), "timeout"),
                                       row(2, "2026-11-22T10:00:01.000Z", cfg(64, true), "crashed")};
  EXPECT_TRUE(convergence(failed, timeline(failed)).empty());
  EXPECT_TRUE(convergence({}, timeline({})).empty());
  // The last evaluation improved: it appears once.
  std::vector<EvaluationRow> rows = {row(1, "2026-11-22T10:00:00.000Z", cfg(32, true), "ok", 5.0),
                                     row(2, "2026-11-22T10:00:01.000Z", cfg(64, true), "ok", 5.0),
                                     row(3, "2026-11-22T10:00:02.000Z", cfg(64, false), "ok", 4.0)};
  const auto points = convergence(rows, timeline(rows));
  ASSERT_EQ(points.size(), 2u);  // a tie is not an improvement
  EXPECT_EQ(points[1].eval, 3);
  EXPECT_TRUE(points[1].improved);
}

TEST(ReportAnalysis, ParameterEffectsPerValue) {
  const auto effects = parameter_effects(campaign());
  ASSERT_EQ(effects.size(), 3u);

  const ParamEffect& block_n = param(effects, "block_n");
  ASSERT_EQ(block_n.values.size(), 3u);
  EXPECT_EQ(block_n.values[0].value, Value(std::int64_t{32}));  // numbers ascending
  EXPECT_EQ(block_n.values[2].value, Value(std::int64_t{128}));
  const ValueEffect& n32 = value(block_n, std::int64_t{32});
  EXPECT_EQ(n32.evaluated, 4);
  EXPECT_EQ(n32.ok, 3);
  EXPECT_EQ(n32.failed_by_status, (std::map<std::string, std::int64_t>{{"timeout", 1}}));
  EXPECT_DOUBLE_EQ(*n32.best_us, 11.8);
  EXPECT_DOUBLE_EQ(*n32.median_us, 14);  // of 20, 11.8, 14
  EXPECT_NEAR(*n32.best_ratio, 1.18, 1e-12);
  const ValueEffect& n64 = value(block_n, std::int64_t{64});
  EXPECT_EQ(n64.evaluated, 4);
  EXPECT_EQ(n64.ok, 3);
  EXPECT_DOUBLE_EQ(*n64.best_ratio, 1);
  EXPECT_DOUBLE_EQ(*n64.median_us, 12);  // of 12, 13, 10
  const ValueEffect& n128 = value(block_n, std::int64_t{128});
  EXPECT_EQ(n128.evaluated, 2);
  EXPECT_EQ(n128.ok, 0);
  EXPECT_EQ(n128.failed_by_status, (std::map<std::string, std::int64_t>{{"resources", 2}}));
  EXPECT_FALSE(n128.best_us || n128.median_us || n128.best_ratio);
  EXPECT_NEAR(block_n.spread, 0.18, 1e-12);

  const ParamEffect& schedule = param(effects, "kv_schedule");
  const ValueEffect& inter = value(schedule, std::string("interleaved"));
  EXPECT_EQ(inter.evaluated, 6);
  EXPECT_DOUBLE_EQ(*inter.best_ratio, 1.2);
  EXPECT_DOUBLE_EQ(*inter.median_us, 13);  // of 20, 12, 13
  const ValueEffect& q_false = value(param(effects, "q_in_regs"), false);
  EXPECT_DOUBLE_EQ(*q_false.median_us, 14);  // of 20, 12, 14
  const ValueEffect& q_true = value(param(effects, "q_in_regs"), true);
  EXPECT_DOUBLE_EQ(*q_true.median_us, 11.8);  // of 13, 10, 11.8

  // Most influential first: kv_schedule (1.2), q_in_regs (1.2: false's best is 12), block_n (1.18).
  EXPECT_EQ(effects[2].name, "block_n");
  EXPECT_GE(effects[0].spread, effects[1].spread);
  EXPECT_GE(effects[1].spread, effects[2].spread);
}

TEST(ReportAnalysis, EvenCountsTakeTheMeanOfTheMiddleTwo) {
  std::vector<EvaluationRow> rows = {row(1, "2026-11-22T10:00:00.000Z", cfg(64, true), "ok", 10.0),
                                     row(2, "2026-11-22T10:00:01.000Z", cfg(64, true), "ok", 13.0),
                                     row(3, "2026-11-22T10:00:02.000Z", cfg(64, true), "ok", 11.0),
                                     row(4, "2026-11-22T10:00:03.000Z", cfg(64, true), "ok", 40.0)};
  const auto effects = parameter_effects(rows);
  EXPECT_DOUBLE_EQ(*value(param(effects, "block_n"), std::int64_t{64}).median_us, 12);
}

TEST(ReportAnalysis, ReadingsSayWhatMatters) {
  const auto effects = parameter_effects(campaign());
  EXPECT_EQ(reading(param(effects, "block_n")),
            "block_n: 64 is best; 32 is 1.18x slower at best; 128 never ran ok (2 resources)");
  EXPECT_EQ(reading(param(effects, "kv_schedule")), "kv_schedule: blockwise is best; interleaved is 1.20x slower at best");

  ParamEffect three{"warps", {}, 0.25};
  auto ok_value = [](std::int64_t v, double ratio) {
    ValueEffect e;
    e.value = v;
    e.evaluated = e.ok = 3;
    e.best_us = 10 * ratio;
    e.median_us = 11 * ratio;
    e.best_ratio = ratio;
    return e;
  };
  three.values = {ok_value(2, 1.05), ok_value(4, 1.0), ok_value(8, 1.25)};
  EXPECT_EQ(reading(three), "warps: 4 is best; 8 is 1.25x slower at best, 2 1.05x");

  ParamEffect flat{"lazy_rescale", {ok_value(0, 1.0), ok_value(1, 1.002)}, 0.002};
  EXPECT_EQ(reading(flat), "lazy_rescale: little effect: all values within 0.20% at best (0 is best)");

  ParamEffect single{"min_blocks", {ok_value(2, 1.0)}, 0};
  EXPECT_EQ(reading(single), "min_blocks: only 2 was evaluated");

  ValueEffect failing;
  failing.value = std::int64_t{3};
  failing.evaluated = 4;
  failing.failed_by_status = {{"resources", 3}, {"crashed", 1}};
  ParamEffect only_one_ok{"kv_stages", {ok_value(2, 1.0), failing}, 0};
  EXPECT_EQ(reading(only_one_ok), "kv_stages: only 2 ran ok; 3 never ran ok (3 resources, 1 crashed)");
  ParamEffect none_ok{"sub_n", {failing, failing}, 0};
  EXPECT_EQ(reading(none_ok).rfind("sub_n: no value ran ok", 0), 0u);
}

TEST(ReportAnalysis, BestIsTheFastestOkOfTheSearch) {
  const Analysis a = analyze(campaign());
  ASSERT_TRUE(a.best);
  EXPECT_EQ(a.best->eval, 7);
  EXPECT_DOUBLE_EQ(a.best->median_us, 10);
  EXPECT_EQ(a.best->config, cfg(64, true, "blockwise"));
  EXPECT_EQ(a.convergence.size(), 4u);
  EXPECT_EQ(a.parameters.size(), 3u);

  const Analysis empty = analyze({});
  EXPECT_EQ(empty.evaluations, 0);
  EXPECT_FALSE(empty.best);
  EXPECT_TRUE(empty.convergence.empty());
  EXPECT_TRUE(empty.parameters.empty());
  EXPECT_DOUBLE_EQ(empty.time.active_seconds, 0);
}

TEST(ReportAnalysis, DurationsForPeople) {
  EXPECT_EQ(format_duration(0), "0.0s");
  EXPECT_EQ(format_duration(42.26), "42.3s");
  EXPECT_EQ(format_duration(725), "12m05s");
  EXPECT_EQ(format_duration(3 * 3600 + 4 * 60 + 10), "3h04m");
}
}  // namespace test_report_analysis
