// PipelineDepth: tune's proposals in flight on a GPU follow the measured build and evaluation times.
#include <gtest/gtest.h>

#include "eval/pipeline_depth.hpp"

namespace test_pipeline_depth {
using attntune::PipelineDepth;

TEST(PipelineDepth, AllTheBuildPoolCanUseUntilBothTimesAreKnown) {
  PipelineDepth d(16);
  EXPECT_EQ(d.value(), 18u);
  for (int i = 0; i < 10; ++i) d.build_done(750);
  EXPECT_EQ(d.value(), 18u) << "no evaluation timed yet";
  d.evaluation_done(85);
  d.evaluation_done(85);
  EXPECT_EQ(d.value(), 18u) << "two evaluations are not enough to go by";
}

TEST(PipelineDepth, BuildsPerEvaluationPlusOneOnTheGpuAndOneReady) {
  PipelineDepth d(16);
  for (int i = 0; i < 4; ++i) d.build_done(750), d.evaluation_done(85);  // flash_fwd_mma on an H100
  EXPECT_EQ(d.value(), 11u);                                               // ceil(8.8) + 2
  for (int i = 0; i < 16; ++i) d.build_done(170);                          // the recent past counts
  EXPECT_EQ(d.value(), 4u);
  for (int i = 0; i < 16; ++i) d.build_done(10);  // builds far faster than the GPU: one building, one on it, one ready
  EXPECT_EQ(d.value(), 3u);
}

TEST(PipelineDepth, NeverMoreThanTheBuildPoolNorFewerThanTwo) {
  PipelineDepth slow(4);
  for (int i = 0; i < 5; ++i) slow.build_done(8000), slow.evaluation_done(200);  // wgmma builds
  EXPECT_EQ(slow.value(), 6u);
  PipelineDepth one(0);
  EXPECT_EQ(one.value(), 2u);
  PipelineDepth odd(8);
  for (int i = 0; i < 5; ++i) odd.build_done(-1), odd.evaluation_done(std::nan(""));  // ignored
  EXPECT_EQ(odd.value(), 10u);
}
}  // namespace test_pipeline_depth
