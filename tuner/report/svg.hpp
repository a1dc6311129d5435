// A small SVG writer for the report's figure: a canvas of primitives (rect, line, polyline, circle,
// text; all text XML-escaped), linear and log scales with nice ticks, and Axes, which maps data to
// a rectangle of the canvas and draws its frame, ticks and labels. No plotting library needed.
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace attntune::report::svg {

// Text for element content or an attribute value: & < > " ' escaped; characters XML 1.0 forbids
// (C0 controls other than tab, LF, CR) become '?'.
std::string escape(std::string_view text);

struct Point {
  double x = 0, y = 0;
};

struct Style {
  Style(std::string fill_ = "none", std::string stroke_ = "none", double stroke_width_ = 1, double opacity_ = 1,
        std::string dash_ = "")
      : fill(std::move(fill_)), stroke(std::move(stroke_)), stroke_width(stroke_width_), opacity(opacity_),
        dash(std::move(dash_)) {}
  std::string fill, stroke;
  double stroke_width, opacity;
  std::string dash;  // stroke-dasharray, e.g. "4 3"; "" for solid
};

struct TextStyle {
  TextStyle(double size_ = 12, std::string anchor_ = "start", std::string color_ = "#222222", bool bold_ = false,
            double rotate_ = 0)
      : size(size_), anchor(std::move(anchor_)), color(std::move(color_)), bold(bold_), rotate(rotate_) {}
  double size;
  std::string anchor;  // start | middle | end
  std::string color;
  bool bold;
  double rotate;  // degrees about the anchor point
};

class Canvas {
 public:
  Canvas(double width, double height, std::string_view background = "#ffffff");
  double width() const noexcept { return width_; }
  double height() const noexcept { return height_; }

  void title(std::string_view text);  // the document's <title> (shown as a tooltip, read by tools)
  void rect(double x, double y, double w, double h, const Style& s);
  void line(Point a, Point b, const Style& s);
  void polyline(const std::vector<Point>& points, const Style& s);
  void circle(Point c, double r, const Style& s);
  void text(Point at, std::string_view text, const TextStyle& s = {});

  std::string str() const;  // the whole document, starting "<svg"

 private:
  double width_, height_;
  std::string title_, body_;
};

// Data to pixels. A log scale needs lo > 0. An empty range (lo == hi) is widened.
class Scale {
 public:
  Scale(double lo, double hi, double px_lo, double px_hi, bool log = false);
  double operator()(double v) const;
  double lo() const noexcept { return lo_; }
  double hi() const noexcept { return hi_; }
  bool log() const noexcept { return log_; }
  // About `target` round values inside [lo, hi]: 1, 2, 5 x 10^k steps (linear), or 1-2-5 per
  // decade, thinned or filled to a readable count (log).
  std::vector<double> ticks(int target = 6) const;

 private:
  double lo_, hi_, px_lo_, px_hi_;
  bool log_;
};

// 0.5, 12, 1234, 2.5e+06: at most four significant digits, no trailing zeros.
std::string number(double v);

struct Rect {
  double x = 0, y = 0, w = 0, h = 0;
};

// A plot area: x grows right, y grows up.
class Axes {
 public:
  Axes(Canvas& canvas, Rect area, Scale x, Scale y);
  const Rect& area() const noexcept { return area_; }
  Point at(double x, double y) const { return {x_(x), y_(y)}; }
  double px(double x) const { return x_(x); }
  double py(double y) const { return y_(y); }

  // Frame, grid lines and tick labels on the left and bottom, the axis labels and a title above.
  void frame(std::string_view title, std::string_view x_label, std::string_view y_label, bool x_ticks = true);
  // Labels on the right edge at the y ticks, e.g. TFLOP/s for a time axis: label(tick value).
  template <class F>
  void right_labels(std::string_view axis_label, F label) {
    std::vector<std::string> texts;
    for (double v : y_.ticks()) texts.push_back(label(v));
    right_labels_text(axis_label, texts);
  }

  // Horizontal then vertical: a best-so-far line through (x_i, y_i), held until x_{i+1}.
  void step_line(const std::vector<Point>& data, const Style& s);
  void polyline(const std::vector<Point>& data, const Style& s);
  void points(const std::vector<Point>& data, double radius, const Style& s);
  // A vertical mark of `height` px standing on the bottom edge at data x.
  void bottom_mark(double x, double height, const std::string& color);
  // A shaded band between data x0 and x1 over the full height.
  void x_band(double x0, double x1, const Style& s);
  // A bar at data x, `width` px wide, from data y0 to y1.
  void bar(double x, double width, double y0, double y1, const Style& s);

 private:
  void right_labels_text(std::string_view axis_label, const std::vector<std::string>& texts);
  Canvas& c_;
  Rect area_;
  Scale x_, y_;
};

}  // namespace attntune::report::svg
