// What a campaign's evaluations say, for `attntune report`: how the best time improved against
// evaluations and against time, and how much each parameter's value matters. Plain functions over
// the store's rows (in evaluation order), so tests call them with handmade lists and no database.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/config.hpp"
#include "core/records.hpp"

namespace attntune::report {

// Seconds since the Unix epoch of "YYYY-MM-DDTHH:MM:SS[.fff]Z" (the store's evaluated_at);
// nullopt for any other text.
std::optional<double> parse_utc(std::string_view iso);

// A stretch with no evaluations long enough to be a stopped and resumed campaign rather than a
// slow candidate: longer than kMinGapSeconds and than kGapFactor times the median interval.
inline constexpr double kMinGapSeconds = 300;
inline constexpr double kGapFactor = 20;

struct Gap {
  std::int64_t after_eval = 0;  // seq of the evaluation before it
  double start_seconds = 0;     // Timeline::seconds of that evaluation
  double seconds = 0;           // its length
};

struct Timeline {
  std::vector<double> seconds;  // per row: since the first evaluation (gaps included, as recorded)
  double span_seconds = 0;      // first to last evaluation
  double active_seconds = 0;    // span less the gaps: how long the campaign has been evaluating
  std::vector<Gap> gaps;
};
// An unreadable timestamp takes the time of the evaluation before it.
Timeline timeline(const std::vector<EvaluationRow>& rows);

// Evaluations per status ("ok", "timeout", ...).
std::map<std::string, std::int64_t> status_counts(const std::vector<EvaluationRow>& rows);

// A usable result: status ok with a median time.
bool timed_ok(const EvalRecord& r);

struct ConvergencePoint {
  std::int64_t eval = 0;  // seq
  double seconds = 0;     // Timeline::seconds of that evaluation
  double best_us = 0;     // best so far, after this evaluation
  std::optional<double> tflops;  // of the best so far
  Config config;                 // of the best so far
  bool improved = false;         // false only for the closing point (the last evaluation)
};
// The evaluations that improved the best, then the last evaluation (if it did not); empty while
// no evaluation has run ok.
std::vector<ConvergencePoint> convergence(const std::vector<EvaluationRow>& rows, const Timeline& time);

struct ValueEffect {
  Value value;
  std::int64_t evaluated = 0, ok = 0;
  std::map<std::string, std::int64_t> failed_by_status;  // statuses other than ok
  std::optional<double> best_us;     // fastest ok median with this value
  std::optional<double> median_us;   // median of this value's ok medians
  std::optional<double> best_ratio;  // best_us / the campaign's best (1 for the winner's value)
};

struct ParamEffect {
  std::string name;
  std::vector<ValueEffect> values;  // evaluated values, in Value order (numbers ascending)
  double spread = 0;                // largest best_ratio - 1: what choosing this value wrong costs
};
// Every parameter of the evaluated configs, most influential (largest spread) first, then by name.
std::vector<ParamEffect> parameter_effects(const std::vector<EvaluationRow>& rows);

// One line for a person: "block_n: 64 is best; 32 is 1.18x slower at best, 128 1.05x".
std::string reading(const ParamEffect& p);

struct Best {
  std::int64_t eval = 0;
  Config config;
  double median_us = 0;
  std::optional<double> tflops;
};

struct Analysis {
  std::int64_t evaluations = 0, ok = 0;
  std::map<std::string, std::int64_t> by_status;
  std::optional<Best> best;  // of the search (a final ranking, if any, re-times it separately)
  Timeline time;
  std::vector<ConvergencePoint> convergence;
  std::vector<ParamEffect> parameters;
};
Analysis analyze(const std::vector<EvaluationRow>& rows);

// 42.3s, 12m05s, 3h04m: durations for people.
std::string format_duration(double seconds);
// "3 resources, 1 timeout" (most first); "" when empty.
std::string status_summary(const std::map<std::string, std::int64_t>& counts);

}  // namespace attntune::report
