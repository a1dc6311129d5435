// Small text helpers shared by the error paths.
#pragma once
#include <string>
#include <string_view>

namespace attntune {
// Folds a multi-line log (a JIT or compile log) into one line for an error message: line breaks
// become "; ", carriage returns are dropped, trailing separators trimmed.
std::string one_line(std::string_view text);
}  // namespace attntune
