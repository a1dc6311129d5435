// Re-timing finished candidates side by side. A campaign's final ranking (search/campaign.cpp) and
// `attntune retime` (cli/cmd_retime.cpp) both take the fastest distinct configs a campaign found
// and time each again, one timing per round, interleaved, so that the clock's swings under the
// power cap fall on all of them alike.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/records.hpp"
#include "search/runner.hpp"

namespace attntune::search {

// A candidate being re-timed: its medians so far, one a round.
struct Retimed {
  Config config;       // as the runner takes it (tagged with its family in a campaign of several)
  std::string family;  // its template
  std::string source_hash;
  std::vector<double> medians;
  double max_err = 0;
  bool failed = false;  // a re-timing did not pass (flaky): it cannot be a result
  std::string failure;  // "status: error" of that re-timing
  double found_us = 0;  // its fastest median among the rows it was chosen from (0: not chosen so)
};

double median(std::vector<double> v);  // of a non-empty vector

// At most `top` distinct configs among the ok rows of `rows`, fastest (by their median) first, each
// with that median (`found_us`); `as_seen` turns a row's stored config into the one the runner takes.
std::vector<Retimed> fastest_distinct(std::vector<EvaluationRow> rows, int top,
                                      const std::function<Config(const EvaluationRow&)>& as_seen);

// One round: every finalist not yet failed is timed once, in order. `on_result` sees each result
// (the campaign keeps the rows); one that is not ok marks its finalist failed, the others add a
// median. False when the round stopped short: `stop` said so before a submission, or the runner
// abandoned the candidate or returned none.
bool retime_round(Runner& runner, std::vector<Retimed>& top, const std::function<bool()>& stop,
                  const std::function<void(Retimed&, const RunResult&)>& on_result);

}  // namespace attntune::search
