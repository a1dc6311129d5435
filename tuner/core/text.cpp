#include "core/text.hpp"

#include <cctype>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "core/error.hpp"

namespace attntune {

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (const std::string& s : items) {
    if (!out.empty()) out += sep;
    out += s;
  }
  return out;
}

std::string ascii_lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

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
  if (total > kMaxDurationSeconds)
    throw InputError(fmt::format("{}: '{}' is longer than the {:g} seconds (31 years) a duration may be", what, text,
                                 kMaxDurationSeconds));
  return total;
}

std::string text_problem(std::string_view text, bool lines) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  for (std::size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      if (!lines && (c < 0x20 || c == 0x7f)) return fmt::format("a control character ({}) at offset {}", printable_line(text.substr(i, 1)), i);
      ++i;
      continue;
    }
    // Well-formed UTF-8 (Unicode 15, table 3-7): no overlong forms, no surrogates, nothing past U+10FFFF.
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c == 0xe0) len = 3, lo = 0xa0;
    else if (c >= 0xe1 && c <= 0xec) len = 3;
    else if (c == 0xed) len = 3, hi = 0x9f;
    else if (c >= 0xee && c <= 0xef) len = 3;
    else if (c == 0xf0) len = 4, lo = 0x90;
    else if (c >= 0xf1 && c <= 0xf3) len = 4;
    else if (c == 0xf4) len = 4, hi = 0x8f;
    else return fmt::format("byte 0x{:02x} at offset {} is not UTF-8", c, i);
    if (i + len > n) return fmt::format("the UTF-8 sequence at offset {} is cut short", i);
    if (p[i + 1] < lo || p[i + 1] > hi) return fmt::format("byte 0x{:02x} at offset {} is not UTF-8", p[i + 1], i + 1);
    for (std::size_t k = 2; k < len; ++k)
      if (p[i + k] < 0x80 || p[i + k] > 0xbf) return fmt::format("byte 0x{:02x} at offset {} is not UTF-8", p[i + k], i + k);
    // C1 controls (U+0080..U+009F) are control characters too.
    if (!lines && c == 0xc2 && p[i + 1] <= 0x9f) return fmt::format("a control character (U+{:04X}) at offset {}", p[i + 1], i);
    i += len;
  }
  return "";
}

namespace {
// The text quoted for a message: control characters escaped, bytes that are not UTF-8 as \xNN,
// and cut after 80 bytes (the message is one line, and valid UTF-8 itself).
std::string quoted(std::string_view text) {
  std::string out;
  std::size_t i = 0;
  for (; i < text.size() && out.size() < 80;) {
    const std::string_view rest = text.substr(i);
    // Take the longest prefix (up to 4 bytes) that is a whole valid character.
    std::size_t take = 0;
    for (std::size_t k = 1; k <= std::min<std::size_t>(4, rest.size()); ++k)
      if (text_problem(rest.substr(0, k)).empty()) {
        take = k;
        break;
      }
    if (take == 0) {
      const auto u = static_cast<unsigned char>(rest[0]);
      out += u < 0x80 ? printable_line(rest.substr(0, 1)) : fmt::format("\\x{:02x}", u);
      i += 1;
    } else {
      out += rest.substr(0, take);
      i += take;
    }
  }
  if (i < text.size()) out += "...";
  return out;
}
}  // namespace

void check_stored_text(std::string_view text, std::string_view what) {
  if (text.size() > kMaxStoredText)
    throw InputError(fmt::format("{} '{}' is {} bytes long: at most {}", what, quoted(text), text.size(),
                                 kMaxStoredText));
  const std::string why = text_problem(text);
  if (why.empty()) return;
  throw InputError(fmt::format("{} '{}' is not one line of UTF-8 text: {}", what, quoted(text), why));
}

}  // namespace attntune
