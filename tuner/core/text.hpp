// Small text helpers shared by the error paths.
#pragma once
#include <string>
#include <string_view>

namespace attntune {
// Folds a multi-line log (a JIT or compile log) into one line for an error message: line breaks
// become "; ", carriage returns are dropped, trailing separators trimmed.
std::string one_line(std::string_view text);

// The text with every control character escaped (\n, \t, \r, \xNN), so that an error message
// that quotes an input (a file name, a campaign name) stays one line on the terminal.
std::string printable_line(std::string_view text);

// "90s", "45m", "8h", "1h30m", "2.5h": seconds. InputError for anything else (a bare number, an
// unknown unit, zero or negative). `what` names the option in the message.
double parse_duration(std::string_view text, std::string_view what);
}  // namespace attntune
