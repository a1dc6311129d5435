// The message of the InputError that f throws, for tests of what users are told; "(no error)" when
// f throws none.
#pragma once
#include <functional>
#include <string>

#include "core/error.hpp"

namespace attntune::testing {

inline std::string input_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace attntune::testing
