// The persistent grid of tuner/families/family.hpp as every launcher sizes it (the evaluator's
// LoadedKernel; the exported file's launcher repeats the rule, tests/unit/export): work tiles with
// the query blocks padded to whole clusters, CTAs in whole clusters that fit on the device at once,
// split_tail on the padded tiles; and launch_geometry's cluster for flash_fwd_wgmma's kv_multicast.
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "families/family.hpp"

using namespace attntune;

namespace {

constexpr const char* kArch = "sm_90a";

constexpr const char* kWgmmaYaml = ATTNTUNE_SOURCE_DIR "/search_spaces/flash_fwd_wgmma.yaml";

// The space as campaigns recorded before kv_multicast stored it: every line naming it dropped.
SearchSpace space_before_kv_multicast() {
  std::ifstream in(kWgmmaYaml);
  std::string text, line;
  while (std::getline(in, line))
    if (line.find("kv_multicast") == std::string::npos) text += line + "\n";
  return SearchSpace::parse(text, "flash_fwd_wgmma.yaml before kv_multicast");
}

// The first valid config with kv_multicast on (persistent, a producer, non-causal: the space's rule).
Config multicast_config(const SearchSpace& space, const Problem& p) {
  Config found;
  space.for_each_valid(p, kArch, [&](const Config& c) {
    if (found.empty() && std::get<bool>(c.at("kv_multicast"))) found = c;
  });
  return found;
}

}  // namespace

TEST(PersistentGrid, QueryBlocksArePaddedToWholeClusters) {
  // s=4000, block_m 128: 32 query blocks, already pairs.
  EXPECT_EQ(persistent_work_tiles(32, 16, 4, 2), 32ull * 16 * 4);
  // s=4100: 33 blocks, padded to 34 (the 34th an idle ghost tile of each head).
  EXPECT_EQ(persistent_work_tiles(33, 16, 4, 2), 34ull * 16 * 4);
  EXPECT_EQ(persistent_work_tiles(33, 16, 4, 1), 33ull * 16 * 4);  // no clusters: no padding
  EXPECT_EQ(persistent_work_tiles(1, 1, 1, 2), 2ull);
  EXPECT_EQ(persistent_work_tiles(0, 16, 4, 2), 0ull);
  EXPECT_EQ(persistent_work_tiles(65535, 65535, 65535, 2), 65536ull * 65535 * 65535);  // no overflow
}

TEST(PersistentGrid, CtasAreWholeClustersThatFitAtOnce) {
  const unsigned long long tiles = 34ull * 16 * 4;
  EXPECT_EQ(persistent_ctas(tiles, 132, 64, 2), 128u);  // 64 clusters of 2 fit at once (an H100: 66)
  EXPECT_EQ(persistent_ctas(tiles, 132, 0, 2), 132u);   // unknown (the query failed): the SMs
  EXPECT_EQ(persistent_ctas(tiles, 132, 70, 2), 132u);  // more would fit than there are SMs
  EXPECT_EQ(persistent_ctas(tiles, 133, 0, 2), 132u);   // rounded down to whole clusters
  EXPECT_EQ(persistent_ctas(34, 132, 64, 2), 34u);      // fewer tiles than SMs: one CTA each
  EXPECT_EQ(persistent_ctas(10, 1, 0, 2), 2u);          // one SM still gets a cluster
  EXPECT_EQ(persistent_ctas(0, 132, 64, 2), 0u);
  // Without clusters: min(tiles, SMs), as before clusters.
  EXPECT_EQ(persistent_ctas(4224, 132, 0, 1), 132u);
  EXPECT_EQ(persistent_ctas(100, 132, 0, 1), 100u);
  EXPECT_EQ(persistent_ctas(4224, 133, 0, 1), 133u);
}

// split_tail takes the padded tiles: its tail is then whole clusters too, as the kernel's split
// over clusters needs. b=1, h=16, s=sk=4100, block_m=block_n=128: 33 blocks padded to 34.
TEST(PersistentGrid, SplitTailOfPaddedTilesIsWholeClusters) {
  const unsigned long long tiles = persistent_work_tiles(33, 16, 1, 2);
  ASSERT_EQ(tiles, 544ull);
  const unsigned ctas = persistent_ctas(tiles, 132, 64, 2);
  ASSERT_EQ(ctas, 128u);
  EXPECT_EQ(split_tail_tiles(tiles, ctas, 33), 32u);  // 544 = 4 x 128 + 32
  EXPECT_EQ(split_tail_tiles(tiles, persistent_ctas(tiles, 132, 0, 2), 33), 16u);  // 544 = 4 x 132 + 16
  EXPECT_EQ(split_tail_tiles(33ull * 16, 128, 33), 16u);  // unpadded: the kernel's tiles would not match
}

TEST(PersistentGrid, KvMulticastMakesTwoCtaClusters) {
  const SearchSpace space = SearchSpace::load(kWgmmaYaml);
  const Problem p = Problem::parse("b=4,h=16,s=4100,d=128,dtype=bf16,causal=0");
  Config c = multicast_config(space, p);
  ASSERT_FALSE(c.empty()) << "no valid kv_multicast config for " << p.str();
  LaunchGeometry g = launch_geometry(space, c, p, kArch);
  EXPECT_TRUE(g.persistent);
  EXPECT_EQ(g.cluster, 2u);
  EXPECT_EQ(g.grid[0], static_cast<unsigned>((4100 + std::get<std::int64_t>(c.at("block_m")) - 1) /
                                             std::get<std::int64_t>(c.at("block_m"))));  // unpadded: the launcher pads
  c["kv_multicast"] = false;
  EXPECT_EQ(launch_geometry(space, c, p, kArch).cluster, 1u);
  c.erase("kv_multicast");  // a config recorded before kv_multicast existed, in the space of then
  EXPECT_EQ(launch_geometry(space_before_kv_multicast(), c, p, kArch).cluster, 1u);
  // flash_fwd_mma has no clusters.
  const SearchSpace mma = SearchSpace::load(ATTNTUNE_SOURCE_DIR "/search_spaces/flash_fwd_mma.yaml");
  const Config m = mma.enumerate(p, "sm_90").front();
  EXPECT_EQ(launch_geometry(mma, m, p, "sm_90").cluster, 1u);
}
