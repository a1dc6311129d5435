// Small text helpers shared by the error paths.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace attntune {
// The items with `sep` between them: {"a", "b"} -> "a, b".
std::string join(const std::vector<std::string>& items, std::string_view sep = ", ");

// The text with ASCII letters in lower case ("Qwen2" -> "qwen2"); other bytes unchanged.
std::string ascii_lower(std::string text);

// Folds a multi-line log (a JIT or compile log) into one line for an error message: line breaks
// become "; ", carriage returns are dropped, trailing separators trimmed.
std::string one_line(std::string_view text);

// The text with every control character escaped (\n, \t, \r, \xNN), so that an error message
// that quotes an input (a file name, a campaign name) stays one line on the terminal.
std::string printable_line(std::string_view text);

// "90s", "45m", "8h", "1h30m", "2.5h": seconds. InputError for anything else (a bare number, an
// unknown unit, zero or negative, more than kMaxDurationSeconds). `what` names the option in the message.
double parse_duration(std::string_view text, std::string_view what);

// The longest duration or timeout any option takes, in seconds (about 31.7 years): far below what
// overflows a conversion to nanoseconds (2^63 ns is 292 years), so no timeout can wrap to negative.
inline constexpr double kMaxDurationSeconds = 1e9;

// Why `text` cannot be stored as one line of text: "" when it is valid UTF-8 without control
// characters, else e.g. "byte 0xff at offset 3 is not UTF-8" or "a control character (\n) at
// offset 5". (JSON output needs valid UTF-8; one line per value needs no control characters.)
// With `lines`, only UTF-8 is checked (a whole file's text, which has line breaks and tabs).
std::string text_problem(std::string_view text, bool lines = false);

// The longest free text attntune stores (a path's limit, PATH_MAX): a name is never a document.
inline constexpr std::size_t kMaxStoredText = 4096;

// InputError "WHAT 'TEXT' is not one line of UTF-8 text: WHY" (TEXT quoted printably, cut at 80
// bytes) unless text_problem(text) is empty, or "WHAT 'TEXT' is N bytes long: at most 4096": every
// free text attntune stores (campaign names, problem specs, space paths, plan and model names)
// goes through this door.
void check_stored_text(std::string_view text, std::string_view what);
}  // namespace attntune
