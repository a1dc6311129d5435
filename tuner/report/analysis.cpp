#include "report/analysis.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <utility>

#include <fmt/format.h>

namespace attntune::report {

namespace {

// Days from 1970-01-01 to a proleptic Gregorian date (H. Hinnant's days_from_civil).
std::int64_t days_from_civil(std::int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const std::int64_t era = (y >= 0 ? y : y - 399) / 400;
  const auto yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<std::int64_t>(doe) - 719468;
}

// Reads `n` digits at `pos`; false if any is not a digit.
bool digits(std::string_view s, std::size_t pos, std::size_t n, int& out) {
  if (pos + n > s.size()) return false;
  out = 0;
  for (std::size_t i = pos; i < pos + n; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
    out = out * 10 + (s[i] - '0');
  }
  return true;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string format_ratio(double r) { return r < 1.01 ? fmt::format("{:.3f}x", r) : fmt::format("{:.2f}x", r); }

}  // namespace

std::optional<double> parse_utc(std::string_view s) {
  // YYYY-MM-DDTHH:MM:SS[.f+]Z
  int y, mo, d, h, mi, sec;
  if (s.size() < 20 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' ||
      s.back() != 'Z')
    return std::nullopt;
  if (!digits(s, 0, 4, y) || !digits(s, 5, 2, mo) || !digits(s, 8, 2, d) || !digits(s, 11, 2, h) ||
      !digits(s, 14, 2, mi) || !digits(s, 17, 2, sec))
    return std::nullopt;
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60) return std::nullopt;
  double fraction = 0;
  const std::string_view rest = s.substr(19, s.size() - 20);
  if (!rest.empty()) {
    if (rest[0] != '.' || rest.size() < 2) return std::nullopt;
    double scale = 0.1;
    for (char c : rest.substr(1)) {
      if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
      fraction += (c - '0') * scale;
      scale /= 10;
    }
  }
  const std::int64_t days = days_from_civil(y, static_cast<unsigned>(mo), static_cast<unsigned>(d));
  return static_cast<double>(days * 86400 + h * 3600 + mi * 60 + sec) + fraction;
}

Timeline timeline(const std::vector<EvaluationRow>& rows) {
  Timeline t;
  std::optional<double> first;
  double previous = 0;
  for (const auto& r : rows) {
    const std::optional<double> at = parse_utc(r.evaluated_at);
    double s = previous;
    if (at) {
      if (!first) first = *at;
      s = *at - *first;
    }
    t.seconds.push_back(s);
    previous = s;
  }
  if (t.seconds.empty()) return t;
  t.span_seconds = std::max(0.0, t.seconds.back());

  std::vector<double> intervals;
  for (std::size_t i = 1; i < t.seconds.size(); ++i)
    if (t.seconds[i] > t.seconds[i - 1]) intervals.push_back(t.seconds[i] - t.seconds[i - 1]);
  const double typical = intervals.empty() ? 0 : median_of(intervals);
  const double threshold = std::max(kMinGapSeconds, kGapFactor * typical);
  double paused = 0;
  for (std::size_t i = 1; i < t.seconds.size(); ++i) {
    const double dt = t.seconds[i] - t.seconds[i - 1];
    if (dt > threshold) {
      t.gaps.push_back({rows[i - 1].seq, t.seconds[i - 1], dt});
      paused += dt;
    }
  }
  t.active_seconds = std::max(0.0, t.span_seconds - paused);
  return t;
}

std::map<std::string, std::int64_t> status_counts(const std::vector<EvaluationRow>& rows) {
  std::map<std::string, std::int64_t> counts;
  for (const auto& r : rows) ++counts[r.record.status];
  return counts;
}

bool timed_ok(const EvalRecord& r) { return r.status == "ok" && r.median_us.has_value(); }

std::vector<ConvergencePoint> convergence(const std::vector<EvaluationRow>& rows, const Timeline& time) {
  std::vector<ConvergencePoint> points;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const EvalRecord& r = rows[i].record;
    if (!timed_ok(r) || (!points.empty() && *r.median_us >= points.back().best_us)) continue;
    points.push_back({rows[i].seq, time.seconds.at(i), *r.median_us, r.tflops, rows[i].config, true});
  }
  if (!points.empty() && points.back().eval != rows.back().seq) {
    ConvergencePoint last = points.back();
    last.eval = rows.back().seq;
    last.seconds = time.seconds.back();
    last.improved = false;
    points.push_back(std::move(last));
  }
  return points;
}

std::vector<ParamEffect> parameter_effects(const std::vector<EvaluationRow>& rows) {
  struct Acc {
    ValueEffect effect;
    std::vector<double> ok_us;
  };
  std::map<std::string, std::map<Value, Acc>> by_param;
  std::optional<double> best;
  for (const auto& row : rows) {
    const EvalRecord& r = row.record;
    const bool ok = timed_ok(r);
    if (ok && (!best || *r.median_us < *best)) best = r.median_us;
    for (const auto& [name, value] : row.config) {
      Acc& a = by_param[name][value];
      ++a.effect.evaluated;
      if (ok) {
        ++a.effect.ok;
        a.ok_us.push_back(*r.median_us);
      } else if (r.status != "ok") {
        ++a.effect.failed_by_status[r.status];
      }
    }
  }

  std::vector<ParamEffect> out;
  for (auto& [name, values] : by_param) {
    ParamEffect p;
    p.name = name;
    for (auto& [value, a] : values) {
      a.effect.value = value;
      if (!a.ok_us.empty()) {
        a.effect.best_us = *std::min_element(a.ok_us.begin(), a.ok_us.end());
        a.effect.median_us = median_of(a.ok_us);
        a.effect.best_ratio = *a.effect.best_us / *best;
        p.spread = std::max(p.spread, *a.effect.best_ratio - 1);
      }
      p.values.push_back(std::move(a.effect));
    }
    out.push_back(std::move(p));
  }
  std::stable_sort(out.begin(), out.end(), [](const ParamEffect& a, const ParamEffect& b) { return a.spread > b.spread; });
  return out;
}

std::string reading(const ParamEffect& p) {
  std::vector<const ValueEffect*> ran, failed;
  for (const auto& v : p.values) (v.best_ratio ? ran : failed).push_back(&v);
  std::stable_sort(ran.begin(), ran.end(),
                   [](const ValueEffect* a, const ValueEffect* b) { return *a->best_ratio < *b->best_ratio; });

  std::string line = p.name + ": ";
  if (p.values.size() == 1) {
    line += "only " + value_str(p.values[0].value) + " was evaluated";
    if (ran.empty()) line += ", and it never ran ok";
    return line;
  }
  if (ran.empty()) return line + "no value ran ok";
  const std::string winner = value_str(ran[0]->value);
  if (ran.size() == 1) {
    line += "only " + winner + " ran ok";
  } else if (p.spread < 0.005) {
    line += fmt::format("little effect: all values within {:.2f}% at best ({} is best)", p.spread * 100, winner);
  } else {
    line += winner + " is best; ";
    for (std::size_t i = ran.size() - 1; i >= 1; --i) {
      line += value_str(ran[i]->value) + (i == ran.size() - 1 ? " is " : " ") + format_ratio(*ran[i]->best_ratio);
      line += i == ran.size() - 1 ? " slower at best" : "";
      if (i > 1) line += ", ";
    }
  }
  for (const ValueEffect* v : failed)
    line += fmt::format("; {} never ran ok ({})", value_str(v->value), status_summary(v->failed_by_status));
  return line;
}

Analysis analyze(const std::vector<EvaluationRow>& rows) {
  Analysis a;
  a.evaluations = static_cast<std::int64_t>(rows.size());
  a.by_status = status_counts(rows);
  for (const auto& row : rows) {
    if (!timed_ok(row.record)) continue;
    ++a.ok;
    if (!a.best || *row.record.median_us < a.best->median_us)
      a.best = Best{row.seq, row.config, *row.record.median_us, row.record.tflops};
  }
  a.time = timeline(rows);
  a.convergence = convergence(rows, a.time);
  a.parameters = parameter_effects(rows);
  return a;
}

std::string format_duration(double seconds) {
  if (seconds < 60) return fmt::format("{:.1f}s", seconds);
  const auto s = static_cast<std::int64_t>(std::llround(seconds));
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
}

std::string status_summary(const std::map<std::string, std::int64_t>& counts) {
  std::vector<std::pair<std::string, std::int64_t>> v(counts.begin(), counts.end());
  std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string out;
  for (const auto& [status, n] : v) out += fmt::format("{}{} {}", out.empty() ? "" : ", ", n, status);
  return out;
}

}  // namespace attntune::report
