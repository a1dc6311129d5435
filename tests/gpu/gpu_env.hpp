// GPU tests skip visibly (with the reason) where there is no driver or GPU, as on CI.
#pragma once
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "cuda/driver.hpp"

#define ATTNTUNE_REQUIRE_GPU()                                   \
  do {                                                           \
    std::string why_;                                            \
    if (!::attntune::cuda::driver_available(&why_))              \
      GTEST_SKIP() << "no GPU: " << why_;                        \
  } while (0)

// The repository root: $ATTNTUNE_SOURCE_DIR when set (a build carried to another machine),
// else where the tests were built from.
inline std::string source_dir() {
  const char* env = std::getenv("ATTNTUNE_SOURCE_DIR");
  return env && *env ? env : ATTNTUNE_SOURCE_DIR;
}
