#include "report/svg.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace attntune::report::svg {

namespace {

// Coordinates with one decimal: enough for a screen, short in the file; never NaN or inf.
std::string coord(double v) {
  if (!std::isfinite(v)) v = 0;
  return fmt::format("{:.1f}", v);
}

std::string style_attrs(const Style& s) {
  std::string a = fmt::format(R"( fill="{}" stroke="{}")", escape(s.fill), escape(s.stroke));
  if (s.stroke != "none") a += fmt::format(R"( stroke-width="{}")", number(s.stroke_width));
  if (s.opacity < 1) a += fmt::format(R"( opacity="{}")", number(s.opacity));
  if (!s.dash.empty()) a += fmt::format(R"( stroke-dasharray="{}")", escape(s.dash));
  return a;
}

std::vector<double> linear_ticks(double lo, double hi, int target) {
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double step = (norm < 1.5 ? 1 : norm < 3.5 ? 2 : norm < 7.5 ? 5 : 10) * mag;
  std::vector<double> out;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
    out.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  return out;
}

std::vector<double> log_ticks(double lo, double hi, const std::vector<double>& mantissas) {
  std::vector<double> out;
  for (int k = static_cast<int>(std::floor(std::log10(lo))); k <= static_cast<int>(std::ceil(std::log10(hi))); ++k)
    for (double m : mantissas) {
      const double v = m * std::pow(10.0, k);
      if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) out.push_back(v);
    }
  return out;
}

}  // namespace

std::string escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r')
          out += '?';
        else
          out += c;
    }
  }
  return out;
}

std::string number(double v) {
  if (!std::isfinite(v)) return "0";
  if (std::fabs(v) >= 1e4 && std::fabs(v) < 1e6) return fmt::format("{:.0f}", v);
  return fmt::format("{:.4g}", v);
}

Canvas::Canvas(double width, double height, std::string_view background) : width_(width), height_(height) {
  rect(0, 0, width, height, {std::string(background), "none"});
}

void Canvas::title(std::string_view text) { title_ = escape(text); }

void Canvas::rect(double x, double y, double w, double h, const Style& s) {
  body_ += fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}"{}/>)", coord(x), coord(y),
                       coord(std::max(0.0, w)), coord(std::max(0.0, h)), style_attrs(s)) + "\n";
}

void Canvas::line(Point a, Point b, const Style& s) {
  body_ += fmt::format(R"(<line x1="{}" y1="{}" x2="{}" y2="{}"{}/>)", coord(a.x), coord(a.y), coord(b.x),
                       coord(b.y), style_attrs(s)) + "\n";
}

void Canvas::polyline(const std::vector<Point>& points, const Style& s) {
  if (points.empty()) return;
  std::string pts;
  for (const auto& p : points) pts += (pts.empty() ? "" : " ") + coord(p.x) + "," + coord(p.y);
  body_ += fmt::format(R"(<polyline points="{}"{} stroke-linejoin="round"/>)", pts, style_attrs(s)) + "\n";
}

void Canvas::circle(Point c, double r, const Style& s) {
  body_ += fmt::format(R"(<circle cx="{}" cy="{}" r="{}"{}/>)", coord(c.x), coord(c.y), coord(r), style_attrs(s)) +
           "\n";
}

void Canvas::text(Point at, std::string_view text, const TextStyle& s) {
  std::string attrs = fmt::format(R"( x="{}" y="{}" font-size="{}" fill="{}")", coord(at.x), coord(at.y),
                                  number(s.size), escape(s.color));
  if (s.anchor != "start") attrs += fmt::format(R"( text-anchor="{}")", escape(s.anchor));
  if (s.bold) attrs += R"( font-weight="bold")";
  if (s.rotate != 0)
    attrs += fmt::format(R"x( transform="rotate({} {} {})")x", number(s.rotate), coord(at.x), coord(at.y));
  body_ += fmt::format("<text{}>{}</text>\n", attrs, escape(text));
}

std::string Canvas::str() const {
  std::string doc = fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}" )"
      R"(font-family="DejaVu Sans, Helvetica, Arial, sans-serif">)"
      "\n",
      coord(width_), coord(height_));
  if (!title_.empty()) doc += "<title>" + title_ + "</title>\n";
  return doc + body_ + "</svg>\n";
}

Scale::Scale(double lo, double hi, double px_lo, double px_hi, bool log)
    : lo_(lo), hi_(hi), px_lo_(px_lo), px_hi_(px_hi), log_(log) {
  if (!std::isfinite(lo_) || !std::isfinite(hi_)) lo_ = 0, hi_ = 1;
  if (log_ && lo_ <= 0) log_ = false;
  if (hi_ < lo_) std::swap(lo_, hi_);
  if (hi_ == lo_) {
    if (log_) {
      lo_ /= 1.1, hi_ *= 1.1;
    } else {
      const double pad = lo_ == 0 ? 1 : std::fabs(lo_) * 0.05;
      lo_ -= pad, hi_ += pad;
    }
  }
}

double Scale::operator()(double v) const {
  double t;
  if (log_)
    t = v > 0 ? (std::log(v) - std::log(lo_)) / (std::log(hi_) - std::log(lo_)) : 0;
  else
    t = (v - lo_) / (hi_ - lo_);
  return px_lo_ + t * (px_hi_ - px_lo_);
}

std::vector<double> Scale::ticks(int target) const {
  if (log_) {
    std::vector<double> t = log_ticks(lo_, hi_, {1, 2, 5});
    if (static_cast<int>(t.size()) > target + 2) t = log_ticks(lo_, hi_, {1});
    if (t.size() < 3) t = log_ticks(lo_, hi_, {1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9});
    if (t.size() >= 3) return t;
  }
  return linear_ticks(lo_, hi_, target);
}

Axes::Axes(Canvas& canvas, Rect area, Scale x, Scale y)
    : c_(canvas),
      area_(area),
      x_(x.lo(), x.hi(), area.x, area.x + area.w, x.log()),
      y_(y.lo(), y.hi(), area.y + area.h, area.y, y.log()) {}

void Axes::frame(std::string_view title, std::string_view x_label, std::string_view y_label, bool x_ticks) {
  const Style grid{"none", "#e3e3e3", 1};
  const Style tick{"none", "#555555", 1};
  const TextStyle label{11, "end", "#444444"};
  const double bottom = area_.y + area_.h;
  for (double v : y_.ticks()) {
    const double y = y_(v);
    c_.line({area_.x, y}, {area_.x + area_.w, y}, grid);
    c_.line({area_.x - 4, y}, {area_.x, y}, tick);
    c_.text({area_.x - 7, y + 4}, number(v), label);
  }
  if (x_ticks)
    for (double v : x_.ticks(8)) {
      const double x = x_(v);
      c_.line({x, area_.y}, {x, bottom}, grid);
      c_.line({x, bottom}, {x, bottom + 4}, tick);
      c_.text({x, bottom + 17}, number(v), {11, "middle", "#444444"});
    }
  c_.rect(area_.x, area_.y, area_.w, area_.h, {"none", "#888888", 1});
  c_.text({area_.x, area_.y - 10}, title, {13, "start", "#111111", true});
  if (!x_label.empty()) c_.text({area_.x + area_.w / 2, bottom + 34}, x_label, {12, "middle", "#333333"});
  if (!y_label.empty())
    c_.text({area_.x - 48, area_.y + area_.h / 2}, y_label, {12, "middle", "#333333", false, -90});
}

void Axes::right_labels_text(std::string_view axis_label, const std::vector<std::string>& texts) {
  const std::vector<double> ticks = y_.ticks();
  const double right = area_.x + area_.w;
  for (std::size_t i = 0; i < ticks.size() && i < texts.size(); ++i) {
    const double y = y_(ticks[i]);
    c_.line({right, y}, {right + 4, y}, {"none", "#555555", 1});
    c_.text({right + 7, y + 4}, texts[i], {11, "start", "#444444"});
  }
  c_.text({right + 52, area_.y + area_.h / 2}, axis_label, {12, "middle", "#333333", false, 90});
}

void Axes::step_line(const std::vector<Point>& data, const Style& s) {
  std::vector<Point> px;
  for (std::size_t i = 0; i < data.size(); ++i) {
    if (i > 0) px.push_back(at(data[i].x, data[i - 1].y));
    px.push_back(at(data[i].x, data[i].y));
  }
  c_.polyline(px, s);
}

void Axes::polyline(const std::vector<Point>& data, const Style& s) {
  std::vector<Point> px;
  for (const auto& p : data) px.push_back(at(p.x, p.y));
  c_.polyline(px, s);
}

void Axes::points(const std::vector<Point>& data, double radius, const Style& s) {
  for (const auto& p : data) c_.circle(at(p.x, p.y), radius, s);
}

void Axes::bottom_mark(double x, double height, const std::string& color) {
  const double bottom = area_.y + area_.h;
  c_.line({x_(x), bottom - 1}, {x_(x), bottom - 1 - height}, {"none", color, 1.5, 0.9});
}

void Axes::x_band(double x0, double x1, const Style& s) {
  const double a = std::clamp(x_(x0), area_.x, area_.x + area_.w), b = std::clamp(x_(x1), area_.x, area_.x + area_.w);
  c_.rect(std::min(a, b), area_.y, std::fabs(b - a), area_.h, s);
}

void Axes::bar(double x, double width, double y0, double y1, const Style& s) {
  const double top = std::min(y_(y0), y_(y1)), bottom = std::max(y_(y0), y_(y1));
  c_.rect(x_(x) - width / 2, top, width, bottom - top, s);
}

}  // namespace attntune::report::svg
