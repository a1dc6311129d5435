// The one check every floating-point option of every command goes through. parse_args
// (command.hpp) runs it on whatever it parsed, so a command cannot forget it: "nan", "inf" and
// "1e999" all parse as doubles, and a timeout of 1e300 seconds overflows to a negative number of
// milliseconds. Every double option is a time in seconds or a percentage: finite, not negative,
// at most kMaxDurationSeconds (core/text.hpp; --budget-time's durations obey the same bound).
// Commands add their own tighter ranges (--max-seconds > 0, --min-seconds <= --max-seconds).
#pragma once
#include <string>

#include "cli/command.hpp"

namespace attntune::cli {

// InputError "COMMAND: --FLAG must be a finite number, not nan" / "... must not be negative" /
// "... is more than ..." unless x is finite and within [0, kMaxDurationSeconds].
void check_number(double x, const std::string& command, const std::string& flag);

// check_number for every option in `vm` that holds a double (or a list of doubles); and for every
// unsigned integer option, that it is not a wrapped negative number (InputError "... must not be
// negative").
void check_numeric_options(const po::variables_map& vm, const std::string& command);

}  // namespace attntune::cli
