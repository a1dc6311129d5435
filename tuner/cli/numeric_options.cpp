#include "cli/numeric_options.hpp"

#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/text.hpp"

namespace attntune::cli {

void check_number(double x, const std::string& command, const std::string& flag) {
  if (!std::isfinite(x)) throw InputError(fmt::format("{}: --{} must be a finite number, not {}", command, flag, x));
  if (x < 0) throw InputError(fmt::format("{}: --{} must not be negative (got {:g})", command, flag, x));
  if (x > kMaxDurationSeconds)
    throw InputError(fmt::format("{}: --{} {:g} is out of range (at most {:g}: seconds or a percentage)", command, flag,
                                 x, kMaxDurationSeconds));
}

void check_numeric_options(const po::variables_map& vm, const std::string& command) {
  for (const auto& [name, value] : vm) {
    if (value.empty()) continue;
    const std::type_info& t = value.value().type();
    if (t == typeid(double)) {
      check_number(value.as<double>(), command, name);
    } else if (t == typeid(float)) {
      check_number(value.as<float>(), command, name);
    } else if (t == typeid(std::vector<double>)) {
      for (const double x : value.as<std::vector<double>>()) check_number(x, command, name);
    } else if (t == typeid(unsigned long long) || t == typeid(unsigned long) || t == typeid(unsigned)) {
      // Boost parses "-1" into an unsigned option by wrapping it (to 2^64 - 1): a value past
      // 2^63 - 1 is refused as the negative number it almost certainly was.
      const unsigned long long x = t == typeid(unsigned long long) ? value.as<unsigned long long>()
                                   : t == typeid(unsigned long)    ? value.as<unsigned long>()
                                                                   : value.as<unsigned>();
      const unsigned long long limit = t == typeid(unsigned) ? 0x7fffffffULL : 0x7fffffffffffffffULL;
      if (x > limit)
        throw InputError(fmt::format("{}: --{} must not be negative (got {}, which is past {})", command, name, x, limit));
    }
  }
}

}  // namespace attntune::cli
