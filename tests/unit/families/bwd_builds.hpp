// The backward families' variant builds compiled with NVRTC (tests/unit/families/test_bwd_variants.cpp,
// test_bwd_varlen.cpp): for each problem the smallest and largest tiles of its space, each built for
// flash_bwd_mma on sm_80 and sm_90 and flash_bwd_wgmma on sm_90a, without wgmma serialisation and
// within FlashBwdWgmmaBuild's and FlashBwdMmaBuild's spill bounds (d=128 at most 16 bytes, d=64 64).
#pragma once
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "cuda/nvrtc.hpp"
#include "eval/build_pool.hpp"
#include "tests/common/plan_call.hpp"
#include "tests/common/run_attntune.hpp"

namespace attntune::testing {

// keep (optional): the configs of each problem's space to take the smallest and largest of.
inline void expect_backward_builds(std::initializer_list<const char*> specs,
                                   const std::function<bool(const Config&)>& keep = {}) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const std::pair<const char*, const char*> builds[] = {
      {"flash_bwd_mma", "sm_80"}, {"flash_bwd_mma", "sm_90"}, {"flash_bwd_wgmma", "sm_90a"}};
  for (const auto& [family, arch] : builds) {
    SCOPED_TRACE(std::string(family) + " " + arch);
    const SearchSpace space = space_of(family);
    BuildPoolOptions pool_opts;
    pool_opts.nvrtc_options = family_nvrtc_options(family);
    pool_opts.worker_argv = {attntune_bin(), "build-worker"};
    BuildPool pool(pool_opts);
    std::size_t submitted = 0;
    for (const char* spec : specs) {
      const Problem p = Problem::parse(spec);
      std::vector<Config> all;
      for (const Config& c : space.enumerate(p, arch))
        if (!keep || keep(c)) all.push_back(c);
      ASSERT_FALSE(all.empty()) << spec;
      for (const Config* c : {&all.front(), &all.back()}) {
        pool.submit({*c, render_kernel(space, *c, p, arch), arch});
        ++submitted;
      }
    }
    std::size_t built = 0;
    while (auto o = pool.next()) {
      ++built;
      EXPECT_EQ(o->build.status, "ok") << config_str(o->job.config) << "\n" << o->build.log;
      EXPECT_EQ(o->build.log.find("Potential Performance Loss"), std::string::npos) << o->build.log;
      const bool d128 = o->job.kernel.source.find("#define ATT_HEAD_DIM 128\n") != std::string::npos;
      EXPECT_LE(o->build.spill_stores, d128 ? 16 : 64)
          << config_str(o->job.config) << ": " << o->build.registers << " registers";
    }
    EXPECT_EQ(built, submitted);
  }
}

}  // namespace attntune::testing
