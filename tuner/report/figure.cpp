#include "report/figure.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "report/svg.hpp"

namespace attntune::report {

namespace {

using svg::Axes;
using svg::Canvas;
using svg::Point;
using svg::Rect;
using svg::Scale;
using svg::Style;
using svg::TextStyle;

constexpr double kWidth = 1000, kLeft = 80, kRight = 80;
constexpr double kPlotWidth = kWidth - kLeft - kRight;
constexpr double kLogAbove = 5;  // a y range wider than this ratio is drawn on a log scale
const std::string kStepColor = "#1f4e9a", kPointColor = "#4a90d9", kWinnerColor = "#2e8b57", kBarColor = "#7fa7d8";

// Rough text width in px for the sans fonts at `size` (layout only; no font metrics here).
double text_width(const std::string& s, double size) { return static_cast<double>(s.size()) * size * 0.6; }

// A y scale for times in [lo, hi] with room added below (`below` of the height) and above.
Scale time_scale(double lo, double hi, double below) {
  const bool log = lo > 0 && hi / lo > kLogAbove;
  if (log) {
    const double r = std::log(hi / lo);
    return Scale(lo / std::exp(r * below), hi * std::exp(r * 0.06), 0, 1, true);
  }
  const double r = hi > lo ? hi - lo : std::max(1e-9, lo * 0.1);
  return Scale(std::max(0.0, lo - r * below), hi + r * 0.06, 0, 1);
}

// TFLOP/s is inversely proportional to the time for one problem: tflops * us is the same for all.
std::optional<double> flop_constant(const std::vector<EvaluationRow>& rows) {
  for (const auto& r : rows)
    if (timed_ok(r.record) && r.record.tflops && *r.record.tflops > 0) return *r.record.tflops * *r.record.median_us;
  return std::nullopt;
}

struct TimeUnit {
  double divisor;
  const char* label;
};
TimeUnit time_unit(double span) {
  if (span < 120) return {1, "seconds since the first evaluation"};
  if (span < 2 * 3600) return {60, "minutes since the first evaluation"};
  return {3600, "hours since the first evaluation"};
}

double legend_item(Canvas& c, double x, double y, const std::string& color, const std::string& text, bool dot) {
  if (dot)
    c.circle({x + 5, y - 4}, 3, {color, "none", 1, 0.6});
  else
    c.rect(x, y - 9, 10, 10, {color, "none"});
  c.text({x + 15, y}, text, {11, "start", "#333333"});
  return x + 15 + text_width(text, 11) + 18;
}

void evaluations_panel(Canvas& c, double top, const std::vector<EvaluationRow>& rows, const Analysis& a) {
  const Rect area{kLeft, top, kPlotWidth, 270};
  std::vector<Point> ok;
  for (const auto& r : rows)
    if (timed_ok(r.record)) ok.push_back({static_cast<double>(r.seq), *r.record.median_us});
  double lo = 1, hi = 2;
  if (!ok.empty()) {
    lo = hi = ok[0].y;
    for (const auto& p : ok) lo = std::min(lo, p.y), hi = std::max(hi, p.y);
  }
  const double last_seq = rows.empty() ? 1 : static_cast<double>(rows.back().seq);
  Axes ax(c, area, Scale(0, std::max(1.0, last_seq), 0, 1), time_scale(lo, hi, 0.09));

  std::string title = "Best so far against evaluations";
  if (a.best)
    title += fmt::format(": {} µs{} at eval {} of {}", svg::number(a.best->median_us),
                         a.best->tflops ? fmt::format(" ({} TFLOP/s)", svg::number(*a.best->tflops)) : "",
                         a.best->eval, a.evaluations);
  ax.frame(title, "evaluation #", "median time (µs)");
  if (const auto k = flop_constant(rows))
    ax.right_labels("TFLOP/s", [&](double us) {
      const double t = *k / us;
      return t >= 100 ? fmt::format("{:.0f}", t) : t >= 10 ? fmt::format("{:.1f}", t) : fmt::format("{:.2f}", t);
    });

  ax.points(ok, 2.2, {kPointColor, "none", 1, 0.3});
  std::vector<Point> steps, dots;
  for (const auto& p : a.convergence) {
    steps.push_back({static_cast<double>(p.eval), p.best_us});
    if (p.improved) dots.push_back(steps.back());
  }
  ax.step_line(steps, {"none", kStepColor, 2});
  ax.points(dots, 3, {kStepColor, "none"});
  for (const auto& r : rows)
    if (r.record.status != "ok") ax.bottom_mark(static_cast<double>(r.seq), 11, status_color(r.record.status));
  if (ok.empty())
    c.text({area.x + area.w / 2, area.y + area.h / 2}, "no evaluation has run ok yet",
           {14, "middle", "#aa3333", true});

  // Legend: what the marks mean, with counts.
  double x = area.x;
  const double y = area.y + area.h + 56;
  x = legend_item(c, x, y, kPointColor, fmt::format("ok ({})", a.ok), true);
  x = legend_item(c, x, y, kStepColor, "best so far", false);
  for (const auto& [status, n] : a.by_status)
    if (status != "ok") x = legend_item(c, x, y, status_color(status), fmt::format("{} ({})", status, n), false);
}

void time_panel(Canvas& c, double top, const Analysis& a) {
  const Rect area{kLeft, top, kPlotWidth, 200};
  const TimeUnit unit = time_unit(a.time.span_seconds);
  double lo = 1, hi = 2;
  if (!a.convergence.empty()) lo = a.convergence.back().best_us, hi = a.convergence.front().best_us;
  Axes ax(c, area, Scale(0, std::max(a.time.span_seconds / unit.divisor, 1e-3), 0, 1), time_scale(lo, hi, 0.04));
  ax.frame(fmt::format("Best so far against time: evaluating for {}{}", format_duration(a.time.active_seconds),
                       a.time.gaps.empty() ? "" : fmt::format(" (plus {} gap{} without evaluations)",
                                                              a.time.gaps.size(), a.time.gaps.size() > 1 ? "s" : "")),
           unit.label, "best time (µs)");
  for (const auto& g : a.time.gaps) {
    const double x0 = g.start_seconds / unit.divisor, x1 = (g.start_seconds + g.seconds) / unit.divisor;
    ax.x_band(x0, x1, {"#d0d0d0", "none", 1, 0.5});
    c.text({(ax.px(x0) + ax.px(x1)) / 2, area.y + 16}, "gap " + format_duration(g.seconds),
           {11, "middle", "#555555"});
  }
  std::vector<Point> steps, dots;
  for (const auto& p : a.convergence) {
    steps.push_back({p.seconds / unit.divisor, p.best_us});
    if (p.improved) dots.push_back(steps.back());
  }
  ax.step_line(steps, {"none", kStepColor, 2});
  ax.points(dots, 3, {kStepColor, "none"});
}

void parameters_panel(Canvas& c, double top, const Analysis& a) {
  const Rect area{kLeft, top, kPlotWidth, 200};
  std::size_t slots = 0;
  double max_ratio = 1;
  for (const auto& p : a.parameters) {
    slots += p.values.size() + (slots ? 1 : 0);
    for (const auto& v : p.values)
      if (v.best_ratio) max_ratio = std::max(max_ratio, *v.best_ratio);
  }
  const double hi = std::max(max_ratio * 1.04, 1.05), lo = 1 - (hi - 1) * 0.06;
  Axes ax(c, area, Scale(-0.8, std::max<double>(1, static_cast<double>(slots)) - 0.2, 0, 1), Scale(lo, hi, 0, 1));
  ax.frame("Parameter effects: each value's best time / the campaign's best (1 = the winner's value; × never ran ok)",
           "", "best-time ratio", false);
  const double bottom = area.y + area.h;
  const double slot_px = ax.px(1) - ax.px(0);
  const double bar_px = std::min(30.0, slot_px * 0.75);
  c.line({area.x, ax.py(1)}, {area.x + area.w, ax.py(1)}, {"none", "#999999", 1, 1, "4 3"});

  double widest_label = 0;
  for (const auto& p : a.parameters)
    for (const auto& v : p.values) widest_label = std::max(widest_label, text_width(value_str(v.value), 10));
  const bool rotate = widest_label > slot_px - 2;

  double slot = 0;
  int group = 0;
  for (const auto& p : a.parameters) {
    const double first = slot;
    for (const auto& v : p.values) {
      const double x = ax.px(slot);
      if (v.best_ratio) {
        const bool winner = *v.best_ratio <= 1.0;
        ax.bar(slot, bar_px, lo, *v.best_ratio, {winner ? kWinnerColor : kBarColor, "none"});
        c.text({x, ax.py(*v.best_ratio) - 3}, fmt::format("{:.2f}", *v.best_ratio), {9, "middle", "#333333"});
      } else {
        c.text({x, ax.py(lo) - 4}, "×", {16, "middle", "#cc2222", true});
      }
      const std::string label = value_str(v.value);
      if (rotate)
        c.text({x + 3, bottom + 12}, label, {10, "end", "#333333", false, -40});
      else
        c.text({x, bottom + 14}, label, {10, "middle", "#333333"});
      slot += 1;
    }
    const double centre = (ax.px(first) + ax.px(slot - 1)) / 2;
    const double name_y = bottom + (rotate ? 58 : 30) + (group % 2 ? 14 : 0);
    c.text({centre, name_y}, p.name, {11, "middle", "#111111", true});
    slot += 1;
    ++group;
  }
  if (a.parameters.empty())
    c.text({area.x + area.w / 2, area.y + area.h / 2}, "no parameters to compare", {13, "middle", "#777777"});
}

}  // namespace

std::string status_color(const std::string& status) {
  static const std::map<std::string, std::string> colors = {
      {"ok", kPointColor},           {"compile_error", "#8c564b"}, {"compile_timeout", "#e377c2"},
      {"resources", "#ff7f0e"},      {"launch_error", "#bcbd22"},  {"crashed", "#d62728"},
      {"timeout", "#9467bd"},        {"wrong_result", "#17becf"},  {"nan_or_unwritten", "#555555"}};
  const auto it = colors.find(status);
  return it == colors.end() ? "#999999" : it->second;
}

std::string render_figure(const FigureText& text, const std::vector<EvaluationRow>& rows, const Analysis& a) {
  const double head = 50 + 16 * static_cast<double>(text.subtitle.size());
  Canvas c(kWidth, rows.empty() ? head + 70 : head + 1030);
  c.title(text.title);
  c.text({kLeft, 32}, text.title, {18, "start", "#111111", true});
  for (std::size_t i = 0; i < text.subtitle.size(); ++i)
    c.text({kLeft, 54 + 16 * static_cast<double>(i)}, text.subtitle[i], {12, "start", "#444444"});
  if (rows.empty()) {
    c.text({kWidth / 2, head + 40}, "No evaluations recorded yet.", {16, "middle", "#aa3333", true});
    return c.str();
  }
  evaluations_panel(c, head + 34, rows, a);
  time_panel(c, head + 419, a);
  parameters_panel(c, head + 694, a);
  return c.str();
}

}  // namespace attntune::report
