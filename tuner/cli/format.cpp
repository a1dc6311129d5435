#include "cli/format.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

#include <fmt/format.h>

namespace attntune::cli {

namespace {

// Display width of UTF-8 text: one column per code point (continuation bytes do not count).
std::size_t display_width(std::string_view s) {
  return static_cast<std::size_t>(
      std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

bool is_number(const std::string& s) {
  if (s.empty()) return false;
  std::string_view v = s;
  if (v.back() == '%') v.remove_suffix(1);
  const std::string text(v);
  char* end = nullptr;
  std::strtod(text.c_str(), &end);
  return !text.empty() && end == text.c_str() + text.size() && !std::isspace(static_cast<unsigned char>(text[0]));
}

bool is_blank(const std::string& s) { return s.empty() || s == "-"; }

void pad(std::ostream& out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out << ' ';
}

}  // namespace

Table::Table(std::vector<std::string> headers) : headers_(std::move(headers)) {}

void Table::add_row(std::vector<std::string> cells) {
  if (cells.size() != headers_.size())
    throw std::logic_error(fmt::format("table row has {} cells for {} columns", cells.size(), headers_.size()));
  rows_.push_back(std::move(cells));
}

bool Table::numeric_column(std::size_t col) const {
  bool any = false;
  for (const auto& row : rows_) {
    if (is_blank(row[col])) continue;
    if (!is_number(row[col])) return false;
    any = true;
  }
  return any;
}

void Table::print(std::ostream& out) const {
  const std::size_t n = headers_.size();
  std::vector<std::size_t> width(n);
  std::vector<bool> right(n);
  for (std::size_t c = 0; c < n; ++c) {
    width[c] = display_width(headers_[c]);
    for (const auto& row : rows_) width[c] = std::max(width[c], display_width(row[c]));
    right[c] = numeric_column(c);
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string text;
    for (std::size_t c = 0; c < n; ++c) {
      const std::size_t gap = width[c] - display_width(cells[c]);
      const bool last = c + 1 == n;
      if (c > 0) text += "  ";
      if (right[c])
        text += std::string(gap, ' ') + cells[c];
      else
        text += cells[c] + (last ? "" : std::string(gap, ' '));
    }
    out << text << '\n';
  };
  line(headers_);
  for (std::size_t c = 0; c < n; ++c) {
    if (c > 0) pad(out, 2);
    out << std::string(width[c], '-');
  }
  out << '\n';
  for (const auto& row : rows_) line(row);
}

void Table::print_csv(std::ostream& out) const {
  write_csv_row(out, headers_);
  for (const auto& row : rows_) write_csv_row(out, row);
}

std::string csv_field(std::string_view s) {
  if (s.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(s);
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
  return out;
}

void write_csv_row(std::ostream& out, const std::vector<std::string>& cells) {
  for (std::size_t i = 0; i < cells.size(); ++i) {
    if (i > 0) out << ',';
    out << csv_field(cells[i]);
  }
  out << '\n';
}

std::string format_us(double us) {
  const double a = std::fabs(us);
  if (a < 10) return fmt::format("{:.3f}", us);
  if (a < 100) return fmt::format("{:.2f}", us);
  if (a < 1000) return fmt::format("{:.1f}", us);
  return fmt::format("{:.0f}", us);
}

std::string format_tflops(double tflops) {
  return std::fabs(tflops) < 100 ? fmt::format("{:.2f}", tflops) : fmt::format("{:.1f}", tflops);
}

std::string format_error(double err) { return fmt::format("{:.2e}", err); }

std::string format_exact(double v) { return fmt::format("{}", v); }

std::string format_time(std::string_view iso) {
  // YYYY-MM-DDTHH:MM:SS[.fff]Z
  if (iso.size() < 20 || iso[10] != 'T' || iso.back() != 'Z') return std::string(iso);
  std::string out(iso.substr(0, 19));
  out[10] = ' ';
  return out;
}

void print_json(std::ostream& out, const nlohmann::ordered_json& j) { out << j.dump(2) << '\n'; }

nlohmann::ordered_json problem_json(const Problem& p) { return p.ordered_json(); }

nlohmann::ordered_json value_json(const Value& v) {
  return std::visit([](const auto& x) { return nlohmann::ordered_json(x); }, v);
}

}  // namespace attntune::cli
