// Progress of a campaign for the person waiting on it. On a terminal: one live line, redrawn in
// place (evaluations / budget, ok and failed by status, best time and TFLOP/s, evaluations per
// minute, ETA). Off a terminal (a log file, nohup): the same line as a log line every
// `log_interval`, so a long run leaves a readable trace. Events (a new best, a stop) are always
// printed as lines of their own.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>

namespace attntune::search {

struct ProgressState {
  std::int64_t evaluations = 0;   // in the campaign, earlier runs included
  std::int64_t this_run = 0;      // evaluated by this run
  std::int64_t budget_evals = 0;  // 0: none
  double budget_seconds = 0;      // of this run; 0: none
  std::map<std::string, std::int64_t> by_status;
  std::optional<double> best_us, best_tflops;
  std::int64_t best_at = 0;       // evaluation number of the best
  double elapsed_s = 0;           // of this run
};

// "123/500 evals | ok 100, resources 12 | best 1746.2 µs 314.8 TFLOP/s (#87) | 42.1/min | ETA 9m 12s"
std::string progress_line(const ProgressState& s);
std::string format_duration(double seconds);  // "42s", "9m 12s", "3h 05m"

class Progress {
 public:
  Progress(std::ostream& out, bool live, std::chrono::seconds log_interval);
  ~Progress();
  void update(const ProgressState& s);  // after each evaluation
  void event(const std::string& line);  // a line of its own (the live line is redrawn after it)
  void done();                          // ends the live line

 private:
  void clear_live();
  std::ostream& out_;
  bool live_;
  std::chrono::seconds log_interval_;
  std::chrono::steady_clock::time_point last_;
  std::string last_line_;
  bool drawn_ = false;
};

}  // namespace attntune::search
