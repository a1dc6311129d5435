// Printing results for people and for scripts, shared by the commands: aligned text tables, CSV
// (RFC 4180 quoting) and JSON, and the number formats that go in them.
#pragma once
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.hpp"
#include "core/problem.hpp"

namespace attntune::cli {

// Headers and rows of cells. print() aligns the columns, right-aligning those whose cells are all
// numbers (or blank or "-"); widths count UTF-8 characters, so "µs" is two columns wide.
class Table {
 public:
  explicit Table(std::vector<std::string> headers);
  void add_row(std::vector<std::string> cells);  // exactly as many cells as headers
  bool empty() const noexcept { return rows_.empty(); }
  std::size_t size() const noexcept { return rows_.size(); }

  void print(std::ostream& out) const;      // headers, a rule, the rows; two spaces between columns
  void print_csv(std::ostream& out) const;  // a header row, then the rows

 private:
  bool numeric_column(std::size_t col) const;
  std::vector<std::string> headers_;
  std::vector<std::vector<std::string>> rows_;
};

// RFC 4180: a field holding a comma, a double quote, CR or LF is quoted, its quotes doubled. Rows end
// with "\n" (what Unix tools and every CSV reader accept).
std::string csv_field(std::string_view s);
void write_csv_row(std::ostream& out, const std::vector<std::string>& cells);

// For tables: about four significant digits, never exponents (8.123, 12.35, 123.5, 1235).
std::string format_us(double us);
std::string format_tflops(double tflops);  // 312.4, 45.67
std::string format_error(double err);      // 1.95e-03: errors span decades
// For CSV and scripts: the shortest text that reads back as the same double.
std::string format_exact(double v);
// "2025-01-31T12:00:00.123Z" -> "2025-01-31 12:00:00" (UTC, as stored); other text unchanged.
std::string format_time(std::string_view iso_utc);

// Pretty-printed, two-space indent, newline-terminated. ordered_json keeps keys in the order written,
// so documents read in the order docs/CONTRACT.md lists their fields.
void print_json(std::ostream& out, const nlohmann::ordered_json& j);
// Problem::ordered_json(): the keys in the order of docs/CONTRACT.md, b, h, hkv, s, sk, d, dtype,
// causal (and page, varlen, lens_seed, window, softcap, sinks where the problem has them).
nlohmann::ordered_json problem_json(const Problem& p);
// A config value as JSON: 64, true, "interleaved".
nlohmann::ordered_json value_json(const Value& v);

}  // namespace attntune::cli
