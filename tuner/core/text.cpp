#include "core/text.hpp"

#include <cctype>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "core/error.hpp"

namespace attntune {

std::string one_line(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\n') {
      if (!out.empty() && out.back() != ' ') out += "; ";
    } else if (c != '\r') {
      out += c;
    }
  }
  while (!out.empty() && (out.back() == ' ' || out.back() == ';')) out.pop_back();
  return out;
}

std::string printable_line(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (u < 0x20 || u == 0x7f) out += fmt::format("\\x{:02x}", u);
    else out += c;
  }
  return out;
}

double parse_duration(std::string_view text, std::string_view what) {
  auto bad = [&] {
    return InputError(fmt::format("{}: '{}' is not a duration (examples: 90s, 45m, 8h, 1h30m)", what, text));
  };
  double total = 0;
  std::size_t i = 0;
  if (text.empty()) throw bad();
  while (i < text.size()) {
    const std::size_t start = i;
    while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
    if (i == start || i == text.size()) throw bad();  // a number, then a unit
    double value = 0;
    try {
      std::size_t used = 0;
      const std::string number(text.substr(start, i - start));
      value = std::stod(number, &used);
      if (used != number.size()) throw bad();
    } catch (const std::logic_error&) {
      throw bad();
    }
    switch (text[i++]) {
      case 's': total += value; break;
      case 'm': total += value * 60; break;
      case 'h': total += value * 3600; break;
      case 'd': total += value * 86400; break;
      default: throw bad();
    }
  }
  if (!(total > 0) || !std::isfinite(total)) throw bad();
  return total;
}

}  // namespace attntune
