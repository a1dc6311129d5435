#include "search/progress.hpp"

#include <cmath>

#include <fmt/format.h>

namespace attntune::search {

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "?";
  const auto s = static_cast<long long>(std::llround(seconds));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m {:02}s", s / 60, s % 60);
  return fmt::format("{}h {:02}m", s / 3600, (s % 3600) / 60);
}

std::string progress_line(const ProgressState& s) {
  std::string line = s.budget_evals > 0 ? fmt::format("{}/{} evals", s.evaluations, s.budget_evals)
                                        : fmt::format("{} evals", s.evaluations);
  std::string statuses;
  const auto ok = s.by_status.find("ok");
  statuses = fmt::format("ok {}", ok == s.by_status.end() ? 0 : ok->second);
  for (const auto& [status, n] : s.by_status)
    if (status != "ok" && n > 0) statuses += fmt::format(", {} {}", status, n);
  line += " | " + statuses;
  if (s.best_us)
    line += fmt::format(" | best {:.1f} µs {:.1f} TFLOP/s (#{})", *s.best_us, s.best_tflops.value_or(0), s.best_at);
  const double rate = s.elapsed_s > 0 ? s.this_run / (s.elapsed_s / 60) : 0;
  if (s.this_run > 0) line += fmt::format(" | {:.1f}/min", rate);
  // ETA: whichever budget runs out first.
  std::optional<double> eta;
  if (s.budget_evals > 0 && rate > 0) eta = std::max<double>(0, s.budget_evals - s.evaluations) / rate * 60;
  if (s.budget_seconds > 0) {
    const double left = std::max(0.0, s.budget_seconds - s.elapsed_s);
    eta = eta ? std::min(*eta, left) : left;
  }
  if (eta) line += " | ETA " + format_duration(*eta);
  return line;
}

Progress::Progress(std::ostream& out, bool live, std::chrono::seconds log_interval)
    : out_(out), live_(live), log_interval_(log_interval), last_(std::chrono::steady_clock::now()) {}

Progress::~Progress() { done(); }

void Progress::clear_live() {
  if (live_ && drawn_) {
    out_ << "\r\033[K";
    drawn_ = false;
  }
}

void Progress::update(const ProgressState& s) {
  last_line_ = progress_line(s);
  const auto now = std::chrono::steady_clock::now();
  if (live_) {
    out_ << "\r\033[K" << last_line_ << std::flush;
    drawn_ = true;
  } else if (now - last_ >= log_interval_) {
    out_ << last_line_ << "\n" << std::flush;
    last_ = now;
  }
}

void Progress::event(const std::string& line) {
  clear_live();
  out_ << line << "\n";
  if (live_ && !last_line_.empty()) {
    out_ << last_line_;
    drawn_ = true;
  }
  out_ << std::flush;
}

void Progress::done() {
  if (live_ && drawn_) {
    out_ << "\n" << std::flush;
    drawn_ = false;
  }
}

}  // namespace attntune::search
