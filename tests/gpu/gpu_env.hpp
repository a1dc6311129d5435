// GPU tests skip visibly (with the reason) where there is no driver or GPU, as on CI.
#pragma once
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "cuda/driver.hpp"
#include "tests/common/run_attntune.hpp"

#define ATTNTUNE_REQUIRE_GPU()                                   \
  do {                                                           \
    std::string why_;                                            \
    if (!::attntune::cuda::driver_available(&why_))              \
      GTEST_SKIP() << "no GPU: " << why_;                        \
  } while (0)

using attntune::testing::source_dir;
