// A backward family's launch plan for one call, bound (tests/unit/families/test_flash_bwd_mma.cpp,
// test_bwd_varlen.cpp): the build of (config, built problem) for an arch plans the call, each launch
// is bound with workspaces at fake addresses, and its BwdParams are kept for the test to read.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "templates/common/bwd_params.h"
#include "tests/common/plan_call.hpp"

namespace attntune::testing {

struct BwdBound {
  attntune_plan::Plan plan{};
  attntune_plan::Resources res{};
  BwdParams params[3];  // what bind gives each launch (zeroed where it gave nothing)
  std::string why;      // a refusal's reason
};

inline BwdBound bwd_plan_and_bind(const char* family, const char* arch, const SearchSpace& space, const Config& config,
                                  const Problem& built, const attntune_plan::Call& call) {
  BwdBound out;
  std::memset(out.params, 0, sizeof out.params);
  const attntune_plan::LaunchFamily& lf = *builtin_family(family).plan;
  const Defines named = kernel_defines(space, config, built, arch);
  const auto defs = plan_defines(named);  // names point into `named`
  attntune_plan::Consts consts{};
  attntune_plan::Why why{};
  if (lf.load(defs.data(), static_cast<int>(defs.size()), consts.bytes, &why) ||
      lf.plan(consts.bytes, call, FakeDevice{}.device(), &out.plan, &why)) {
    out.why = why.text;
    return out;
  }
  for (int i = 0; i < out.plan.workspaces; ++i)
    out.res.workspace[i] = reinterpret_cast<void*>((std::uintptr_t{1} << 41) * (i + 1));
  for (int l = 0; l < out.plan.launches; ++l) {
    attntune_plan::Args args;
    if (lf.bind(consts.bytes, call, out.plan, out.res, l, &args, &why)) {
      out.why = why.text;
      return out;
    }
    EXPECT_EQ(args.count, 1);
    if (args.count > 0) std::memcpy(&out.params[l], args.ptr[0], sizeof(BwdParams));
  }
  return out;
}

}  // namespace attntune::testing
