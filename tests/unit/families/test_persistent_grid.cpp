// flash_fwd_wgmma's persistent grid as its launch plan (templates/flash_fwd_wgmma/launch.h, with the
// kernel's scheduler.h) sizes it for every executor (the tuner's worker, exported files, the
// harness): work tiles with the query blocks padded to whole clusters, CTAs in whole clusters that
// fit on the device at once, split_tail on the padded tiles; kv_multicast's 2-CTA clusters.
#include <algorithm>
#include <cstring>
#include <fstream>
#include <tuple>
#include <vector>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/common/plan_call.hpp"
#include "families/family.hpp"
#include "templates/flash_fwd_wgmma/launch.h"

namespace test_persistent_grid {
using namespace attntune;
using attntune::testing::dense_call_of;
using attntune::testing::FakeDevice;
using namespace attntune_plan;

namespace {

constexpr const char* kArch = "sm_90a";

constexpr const char* kWgmmaYaml = ATTNTUNE_SOURCE_DIR "/search_spaces/flash_fwd_wgmma.yaml";

// The space as campaigns recorded before kv_multicast stored it: every line naming it dropped, but
// a derived quantity's, where it reads as false (a formula other lines use).
SearchSpace space_before_kv_multicast() {
  std::ifstream in(kWgmmaYaml);
  std::string text, line;
  while (std::getline(in, line)) {
    const std::size_t at = line.find("kv_multicast");
    if (at == std::string::npos) {
      text += line + "\n";
    } else if (line.rfind("  softcap_regs:", 0) == 0) {
      for (std::size_t p = at; p != std::string::npos; p = line.find("kv_multicast", p)) line.replace(p, 12, "false");
      text += line + "\n";
    }
  }
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

Plan plan_of(const SearchSpace& space, const Config& c, const Problem& p, const FakeDevice& dev) {
  std::string why;
  const auto plan = plan_call(render_kernel(space, c, p, kArch).launch, dense_call_of(p), dev.device(), &why);
  EXPECT_TRUE(plan) << why;
  return plan ? *plan : empty_plan();
}

}  // namespace

TEST(PersistentGrid, QueryBlocksArePaddedToWholeClusters) {
  // s=4000, block_m 128: 32 query blocks, already pairs.
  EXPECT_EQ(att::sched::query_blocks<long long>(4000, 128, 2), 32);
  // s=4100: 33 blocks, padded to 34 (the 34th an idle ghost tile of each head).
  EXPECT_EQ(att::sched::query_blocks<long long>(4100, 128, 2), 34);
  EXPECT_EQ(att::sched::query_blocks<long long>(4100, 128, 1), 33);  // no clusters: no padding
  EXPECT_EQ(att::sched::query_blocks<long long>(1, 128, 2), 2);
  EXPECT_EQ(att::sched::query_blocks<long long>(0, 128, 2), 0);
}

TEST(PersistentGrid, CtasAreWholeClustersThatFitAtOnce) {
  const unsigned long long tiles = 34ull * 16 * 4;
  EXPECT_EQ(att::sched::persistent_ctas(tiles, 132, 64, 2), 128u);  // 64 clusters of 2 fit at once (an H100: 66)
  EXPECT_EQ(att::sched::persistent_ctas(tiles, 132, 0, 2), 132u);   // unknown (the query failed): the SMs
  EXPECT_EQ(att::sched::persistent_ctas(tiles, 132, 70, 2), 132u);  // more would fit than there are SMs
  EXPECT_EQ(att::sched::persistent_ctas(tiles, 133, 0, 2), 132u);   // rounded down to whole clusters
  EXPECT_EQ(att::sched::persistent_ctas(34, 132, 64, 2), 34u);      // fewer tiles than SMs: one CTA each
  EXPECT_EQ(att::sched::persistent_ctas(10, 1, 0, 2), 2u);          // one SM still gets a cluster
  EXPECT_EQ(att::sched::persistent_ctas(0, 132, 64, 2), 0u);
  // Without clusters: min(tiles, SMs), as before clusters.
  EXPECT_EQ(att::sched::persistent_ctas(4224, 132, 0, 1), 132u);
  EXPECT_EQ(att::sched::persistent_ctas(100, 132, 0, 1), 100u);
  EXPECT_EQ(att::sched::persistent_ctas(4224, 133, 0, 1), 133u);
}

// split_tail takes the padded tiles: its tail is then whole clusters too, as the kernel's split
// over clusters needs. b=1, h=16, s=sk=4100, block_m=block_n=128: 33 blocks padded to 34.
TEST(PersistentGrid, SplitTailOfPaddedTilesIsWholeClusters) {
  const unsigned long long tiles = att::sched::query_blocks<long long>(4100, 128, 2) * 16;
  ASSERT_EQ(tiles, 544ull);
  const unsigned ctas = att::sched::persistent_ctas(tiles, 132, 64, 2);
  ASSERT_EQ(ctas, 128u);
  EXPECT_EQ(att::sched::split_tail_tiles(tiles, ctas, 33), 32u);  // 544 = 4 x 128 + 32
  EXPECT_EQ(att::sched::split_tail_tiles(tiles, att::sched::persistent_ctas(tiles, 132, 0, 2), 33), 16u);  // 544 = 4 x 132 + 16
  EXPECT_EQ(att::sched::split_tail_tiles(33ull * 16, 128, 33), 16u);  // unpadded: the kernel's tiles would not match
}

// The causal split (launch.h, causal_split): split_tail on a causal persistent grid. On a chunked
// prefill whose 344 packed tiles (28/4 heads, 18 query rows a tile) end in a third round 80 tiles
// wide on 132 SMs, the plan hands the last 132 tiles out as pieces (116 in halves, the last 16 in
// eighths: 360 slots) and sizes the workspaces for them; over 4 rounds it splits nothing and keeps
// one slot; the same config without split_tail has the counter alone.
TEST(PersistentGrid, CausalSplitPiecesTheLastRoundOfAChunkedPrefill) {
  const SearchSpace space = SearchSpace::load(kWgmmaYaml);
  const Problem chunk = Problem::parse("b=1,h=28,hkv=4,s=1536,sk=9728,d=128,dtype=bf16,causal=1");
  Config c;
  space.for_each_valid(chunk, kArch, [&](const Config& x) {
    if (c.empty() && std::get<bool>(x.at("split_tail")) && std::get<bool>(x.at("pack_gqa")) &&
        std::get<std::int64_t>(x.at("block_m")) == 128 && std::get<std::int64_t>(x.at("block_n")) == 160)
      c = x;
  });
  ASSERT_FALSE(c.empty()) << "the space offers no causal split_tail config for " << chunk.str();
  const Plan plan = plan_of(space, c, chunk, FakeDevice{132, 0});
  ASSERT_EQ(plan.launches, 1);
  EXPECT_EQ(plan.launch[0].grid[0], 132u);
  ASSERT_EQ(plan.workspaces, 3);  // the counter, the pieces' slots, their counters
  EXPECT_EQ(plan.workspace[0].bytes, 2 * sizeof(int));
  EXPECT_GE(plan.workspace[1].bytes, 360ull * 8 * att::sched::split_values(128) * 32 * sizeof(float));
  EXPECT_LT(plan.workspace[1].bytes, 362ull * 8 * att::sched::split_values(128) * 32 * sizeof(float));
  EXPECT_EQ(plan.workspace[2].bytes, 132ull * 8 * sizeof(int));
  EXPECT_TRUE(plan.workspace[2].zeroed);

  // Over 4 rounds: nothing split, one slot kept (the workspaces' indices stay the build's).
  const Problem longer = Problem::parse("b=1,h=28,hkv=4,s=2400,sk=9728,d=128,dtype=bf16,causal=1");  // 534 tiles
  const Plan whole = plan_of(space, c, longer, FakeDevice{132, 0});
  ASSERT_EQ(whole.workspaces, 3);
  EXPECT_EQ(whole.workspace[1].bytes, att::sched::split_workspace_bytes(1, 8, 128));
  EXPECT_EQ(whole.workspace[2].bytes, 8 * sizeof(int));

  c["split_tail"] = false;
  EXPECT_EQ(plan_of(space, c, chunk, FakeDevice{132, 0}).workspaces, 1);
  // And the space offers it only where the tiles are few: not at s=6000.
  bool offered = false;
  space.for_each_valid(Problem::parse("b=1,h=28,hkv=4,s=6000,d=128,dtype=bf16,causal=1"), kArch,
                       [&](const Config& x) { offered |= std::get<bool>(x.at("split_tail")); });
  EXPECT_FALSE(offered);
}

namespace {

// The causal split's choice as first written (launch.h, 435eab3): every band's hand-out simulated
// from the start, whole tiles and all. launch.h's causal_split must choose as this does; it shares
// the whole tiles' hand-out between the bands, stops early where no band can win and keeps its
// last answers, for the host time of a call.
att::sched::CausalSplit reference_causal_split(const FlashFwdWgmmaLaunch& l, const Call& call, unsigned ctas) {
  att::sched::CausalSplit none{0, 0, 0, 0};
  const long long tiles = l.work_tiles(call);
  if (!l.split_causal || ctas < 2 || ctas > 1024 || tiles <= ctas || tiles > 4LL * ctas || call.seqlen_k <= 0) return none;
  const int T = static_cast<int>(tiles), C = static_cast<int>(ctas);
  const int m_blocks = static_cast<int>(att::sched::query_blocks(static_cast<long long>(call.seqlen_q), l.tile_rows(call), 1));
  std::vector<int> n(static_cast<std::size_t>(T));
  for (int t = 0; t < T; ++t) {
    const att::sched::TileCoord c = att::sched::tile_coord<true>(t, m_blocks, l.tile_heads(call) * call.batch,
                                                                 l.head_group > 0 ? l.head_group : 1);
    n[t] = att::sched::kv_tiles(
        att::sched::kv_end<true>(c.m_block, l.tile_rows(call), call.seqlen_k, call.seqlen_k - call.seqlen_q), l.block_n);
  }
  auto makespan = [&](att::sched::CausalSplit cs) {
    std::vector<long long> busy(static_cast<std::size_t>(C), 0);  // when each CTA is free
    long long end = 0;
    auto take = [&](long long cost) {
      auto first = std::min_element(busy.begin(), busy.end());
      *first += cost;
      end = std::max(end, *first);
    };
    const int plain = T - cs.s1 - cs.s2;
    for (int t = 0; t < plain; ++t) take(10LL * n[t] + 10);
    for (int t = plain; t < T; ++t) {
      const int pieces = t - plain < cs.s1 ? cs.p1 : cs.p2;
      for (int j = 0; j < pieces; ++j)
        take(10LL * (att::sched::piece_begin(n[t], j + 1, pieces) - att::sched::piece_begin(n[t], j, pieces)) + 15 +
             (j == pieces - 1 ? 6LL * pieces : 0));
    }
    return end;
  };
  const long long whole = makespan(none);
  att::sched::CausalSplit best = none;
  long long best_end = whole;
  const int bands[][4] = {{C, 2, C / 4, 8}, {C, 2, C / 4, 6}, {C / 2, 2, C / 4, 6}, {C, 3, 0, 0},
                          {C / 4, 1, C / 4, 8}, {C / 2, 4, 0, 0}, {2 * C, 2, C / 4, 8}, {C / 2, 1, C / 2, 2},
                          {C / 2, 1, C / 2, 3}, {C, 2, C / 8, 8}};
  for (const auto& b : bands) {
    att::sched::CausalSplit cs{b[0] - b[2], b[1], b[2], b[3]};
    if (cs.s1 < 0 || cs.s1 + cs.s2 > T) continue;
    if (cs.s2 == 0) cs.p2 = 0;
    if (cs.s1 == 0) cs.p1 = 0;
    if (cs.s1 + cs.s2 == 0) continue;
    const long long e = makespan(cs);
    if (e < best_end) best_end = e, best = cs;
  }
  return best_end * 50 <= whole * 49 ? best : none;
}

std::string str(const att::sched::CausalSplit& c) { return fmt::format("{{{}, {}, {}, {}}}", c.s1, c.p1, c.s2, c.p2); }

// A split config of the space for `kind` with these tiles (block_n 0: any) and packing.
Config split_config(const SearchSpace& space, const Problem& kind, long long block_m, long long block_n, bool pack) {
  Config found;
  space.for_each_valid(kind, kArch, [&](const Config& x) {
    if (found.empty() && std::get<bool>(x.at("split_tail")) && std::get<bool>(x.at("pack_gqa")) == pack &&
        std::get<std::int64_t>(x.at("block_m")) == block_m &&
        (block_n == 0 || std::get<std::int64_t>(x.at("block_n")) == block_n))
      found = x;
  });
  return found;
}

}  // namespace

TEST(PersistentGrid, CausalSplitChoosesAsThePlainSimulationDoes) {
  const SearchSpace space = SearchSpace::load(kWgmmaYaml);
  const Problem kind = Problem::parse("b=1,h=28,hkv=4,s=1536,sk=9728,d=128,dtype=bf16,causal=1");
  int calls = 0, split = 0;
  for (auto [bm, bn, pack] : {std::tuple{128ll, 160ll, true}, {128ll, 176ll, false}, {192ll, 0ll, true}}) {
    const Config c = split_config(space, kind, bm, bn, pack);
    ASSERT_FALSE(c.empty()) << bm << "x" << bn << " pack " << pack;
    const auto l = launch_constants<FlashFwdWgmmaLaunch>(render_kernel(space, c, kind, kArch).launch.defines, "t");
    ASSERT_TRUE(l.split_causal);
    for (auto [b, h, hkv] : {std::tuple{1, 28, 4}, {2, 12, 12}, {1, 32, 8}, {3, 40, 8}})
      for (int s : {200, 777, 1000, 1536, 2000, 2400})
        for (int sk : {s, 3001, 9728})
          for (unsigned ctas : {132u, 114u, 78u}) {
            if (sk < s) continue;
            const Problem p = Problem::parse(fmt::format("b={},h={},hkv={},s={},sk={},d=128,dtype=bf16,causal=1", b, h,
                                                         hkv, s, sk));
            const Call call = dense_call_of(p);
            const att::sched::CausalSplit want = reference_causal_split(l, call, ctas);
            for (int again = 0; again < 2; ++again) {  // the second from the thread's memo
              const att::sched::CausalSplit got = l.causal_split(call, ctas);
              ASSERT_EQ(str(got), str(want)) << p.str() << " on " << ctas << " CTAs, " << config_str(c) << ", call "
                                             << again;
            }
            ++calls;
            split += want.s1 + want.s2 > 0;
          }
  }
  EXPECT_GT(split, 20) << "of " << calls;  // the sweep reaches the shapes the split is for
  EXPECT_LT(split, calls);
}

// The plan sizes the split's workspaces by its band, and bind launches that band: one simulation a
// call, handed over in Plan::handoff.
TEST(PersistentGrid, CausalSplitPlanHandsItsBandToBind) {
  const SearchSpace space = SearchSpace::load(kWgmmaYaml);
  const Problem chunk = Problem::parse("b=1,h=28,hkv=4,s=1536,sk=9728,d=128,dtype=bf16,causal=1");
  const Config c = split_config(space, chunk, 128, 160, true);
  ASSERT_FALSE(c.empty());
  const auto l = launch_constants<FlashFwdWgmmaLaunch>(render_kernel(space, c, chunk, kArch).launch.defines, "t");
  const Call call = dense_call_of(chunk);
  const FakeDevice h100{132, 0};
  Plan plan = empty_plan();
  Why why;
  ASSERT_EQ(l.plan(call, h100.device(), &plan, &why), 0) << why.text;
  EXPECT_EQ(str({plan.handoff[0], plan.handoff[1], plan.handoff[2], plan.handoff[3]}), "{116, 2, 16, 8}");
  alignas(64) unsigned char maps[kMaxTensorMaps][128] = {};
  Resources res{};
  for (int i = 0; i < plan.maps; ++i) res.map[i] = maps[i];
  static float slots[8];
  static int counters[8];
  for (int i = 0; i < plan.workspaces; ++i) res.workspace[i] = i == 0 ? static_cast<void*>(counters) : slots;
  auto bound = [&](const Plan& with) {
    Args args;
    EXPECT_EQ(l.bind(call, with, res, 0, &args, &why), 0) << why.text;
    att::TmaMaps m;
    std::memcpy(&m, args.ptr[1], sizeof m);
    return m;
  };
  att::TmaMaps m = bound(plan);
  EXPECT_EQ(str(m.causal_split), "{116, 2, 16, 8}");
  EXPECT_NE(m.split_ws, nullptr);
  // What bind launches is the plan's (what the workspaces were sized for), not a second simulation.
  Plan other = plan;
  other.handoff[0] = 100, other.handoff[2] = 32;
  EXPECT_EQ(str(bound(other).causal_split), "{100, 2, 32, 8}");
  // No split: no slots named.
  other.handoff[0] = other.handoff[1] = other.handoff[2] = other.handoff[3] = 0;
  m = bound(other);
  EXPECT_EQ(str(m.causal_split), "{0, 0, 0, 0}");
  EXPECT_EQ(m.split_ws, nullptr);
}

// A warm start's configs come from neighbours (the shipped database's, a plan's) whose tile counts
// are not this problem's: flash_fwd_wgmma's launch plan says where its causal split pays, and the
// warm start tries it right after the first config (service::add_warm_starts).
TEST(PersistentGrid, CausalSplitIsAWarmStartMoveWhereThePlanSplits) {
  const SearchSpace space = SearchSpace::load(kWgmmaYaml);
  const Family& f = builtin_family("flash_fwd_wgmma");
  ASSERT_TRUE(f.plan_moves);
  const Problem chunk = Problem::parse("b=1,h=28,hkv=4,s=1536,sk=9728,d=128,dtype=bf16,causal=1");
  // Issue 43's u-q28-chunk pick (H100, seed 1, run 401): 24 producer registers, no split.
  const Config pick = space.parse_config(
      "block_m=128,block_n=160,exp2_emu=0,fa4_loop=true,fold_fma=false,head_group=1,intra_wg_overlap=true,k"
      "_perm=false,kv_multicast=false,lazy_rescale=0,mask_bits=false,narrow_n=0,pack_gqa=true,persistent=true,ping_pong=false,pp_pv=false,producer_regs=24,pv_buffers=1,pv_chunks=1,softcap_tanh=accurate,split_tail=false,stages=2,warp_specialize=true,wg_uniform=true");
  ASSERT_FALSE(space.check(pick, chunk, kArch));
  const std::vector<Config> moves = f.plan_moves(space, pick, chunk, kArch, 132);
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_FALSE(space.check(moves[0], chunk, kArch));
  Config back = moves[0];  // the split and the producer registers it needs, nothing else
  EXPECT_TRUE(std::get<bool>(back.at("split_tail")));
  EXPECT_EQ(std::get<std::int64_t>(back.at("producer_regs")), 40);
  back["split_tail"] = false;
  back["producer_regs"] = std::int64_t{24};
  EXPECT_EQ(config_str(back), config_str(pick));
  // A config recorded before a tunable existed is completed with its default first.
  Config old = pick;
  old.erase("wg_uniform");
  ASSERT_EQ(f.plan_moves(space, old, chunk, kArch, 132).size(), 1u);
  // None: from a split config, on an unknown device, where the tiles are many (the space does not
  // offer it), where the whole tiles end together on these SMs (the plan would not split), and for
  // a problem that is not causal.
  EXPECT_TRUE(f.plan_moves(space, moves[0], chunk, kArch, 132).empty());
  EXPECT_TRUE(f.plan_moves(space, pick, chunk, kArch, 0).empty());
  EXPECT_TRUE(
      f.plan_moves(space, pick, Problem::parse("b=1,h=28,hkv=4,s=6000,d=128,dtype=bf16,causal=1"), kArch, 132).empty());
  EXPECT_TRUE(f.plan_moves(space, pick, Problem::parse("b=1,h=28,hkv=4,s=2350,sk=9728,d=128,dtype=bf16,causal=1"),
                           kArch, 132)
                  .empty());
  EXPECT_TRUE(f.plan_moves(space, pick, Problem::parse("b=1,h=28,hkv=4,s=1536,sk=9728,d=128,dtype=bf16,causal=0"),
                           kArch, 132)
                  .empty());
  // The other families predict nothing.
  for (const Family* other : builtin_families())
    if (other->name != "flash_fwd_wgmma") EXPECT_FALSE(other->plan_moves) << other->name;
}

// FlashFwdWgmmaProperty.CausalSplit (the GPU test) checks split builds on five chunked shapes and
// expects the plan to split at least one of them for each config: on an H100's or H200's 132 SMs,
// every split config the space offers for its two kinds (d=128 and 192/128) does.
TEST(PersistentGrid, CausalSplitGpuTestShapesSplitOnAHopper) {
  const SearchSpace space = SearchSpace::load(kWgmmaYaml);
  const char* shapes[] = {"b=1,h=28,hkv=4,s=1536,sk=9728", "b=1,h=28,hkv=4,s=1531,sk=9001", "b=2,h=12,hkv=12,s=1000,sk=3001",
                          "b=1,h=32,hkv=8,s=1300,sk=1300", "b=1,h=24,hkv=8,s=1200,sk=1100"};
  for (const char* dims : {"d=128", "d=192,dv=128"}) {
    const Problem kind = Problem::parse(fmt::format("b=1,h=28,hkv=4,s=1536,sk=9728,{},dtype=bf16,causal=1", dims));
    int configs = 0;
    space.for_each_valid(kind, kArch, [&](const Config& c) {
      if (!std::get<bool>(c.at("split_tail"))) return;
      ++configs;
      int split = 0;
      const FakeDevice h100{132, 0};
      const auto launch = render_kernel(space, c, kind, kArch).launch;  // one build, run on every shape
      for (const char* sh : shapes) {
        const Problem p = Problem::parse(fmt::format("{},{},dtype=bf16,causal=1", sh, dims));
        attntune_plan::Call call = dense_call_of(p);
        call.head_dim_v = static_cast<int>(p.head_dim_v());  // (the helper's call has one head dim)
        std::string why;
        const auto plan = plan_call(launch, call, h100.device(), &why);
        ASSERT_TRUE(plan) << why;
        ASSERT_EQ(plan->workspaces, 3);
        split += plan->workspace[2].bytes > sizeof(int) * std::get<std::int64_t>(c.at("block_m")) / 16;
      }
      EXPECT_GE(split, 1) << config_str(c) << " " << dims;
    });
    EXPECT_GT(configs, 0) << dims;
  }
}

TEST(PersistentGrid, KvMulticastPlansTwoCtaClustersThatFit) {
  const SearchSpace space = SearchSpace::load(kWgmmaYaml);
  const Problem p = Problem::parse("b=4,h=16,s=4100,d=128,dtype=bf16,causal=0");
  Config c = multicast_config(space, p);
  ASSERT_FALSE(c.empty()) << "no valid kv_multicast config for " << p.str();
  const long long block_m = std::get<std::int64_t>(c.at("block_m"));
  const Plan plan = plan_of(space, c, p, FakeDevice{132, 64});
  ASSERT_EQ(plan.launches, 1);
  EXPECT_EQ(plan.launch[0].cluster, 2u);
  EXPECT_EQ(plan.launch[0].grid[0], 128u);  // 64 clusters fit: 128 CTAs, not 132
  EXPECT_EQ(plan.launch[0].grid[1], 1u);
  EXPECT_EQ(plan.maps, 3);  // q, k, v
  EXPECT_EQ(plan.map[0].box[1], static_cast<unsigned>(block_m));
  // Few tiles: one CTA per padded tile.
  const Problem small = Problem::parse("b=1,h=1,s=300,d=128,dtype=bf16,causal=0");
  const Plan few = plan_of(space, c, small, FakeDevice{132, 64});
  EXPECT_EQ(few.launch[0].grid[0], static_cast<unsigned>(att::sched::query_blocks<long long>(300, static_cast<int>(block_m), 2)));

  c["kv_multicast"] = false;
  EXPECT_EQ(plan_of(space, c, p, FakeDevice{132, 64}).launch[0].cluster, 1u);
  c.erase("kv_multicast");  // a config recorded before kv_multicast existed, in the space of then
  EXPECT_EQ(plan_of(space_before_kv_multicast(), c, p, FakeDevice{132, 64}).launch[0].cluster, 1u);
}

TEST(PersistentGrid, FlashFwdMmaLaunchesOneCtaPerQueryBlock) {
  const SearchSpace mma = SearchSpace::load(ATTNTUNE_SOURCE_DIR "/search_spaces/flash_fwd_mma.yaml");
  const Problem p = Problem::parse("b=3,h=5,s=1000,d=128,dtype=bf16,causal=0");
  const Config m = mma.enumerate(p, "sm_90").front();
  const RenderedKernel k = render_kernel(mma, m, p, "sm_90");
  const auto plan = plan_call(k.launch, dense_call_of(p), FakeDevice{}.device());
  ASSERT_TRUE(plan);
  ASSERT_EQ(plan->launches, 1);
  const Launch& l = plan->launch[0];
  const long long block_m = std::get<std::int64_t>(m.at("block_m"));
  EXPECT_EQ(l.grid[0], static_cast<unsigned>((1000 + block_m - 1) / block_m));
  EXPECT_EQ(l.grid[1], 5u);
  EXPECT_EQ(l.grid[2], 3u);
  EXPECT_EQ(l.cluster, 1u);
  EXPECT_EQ(l.block, static_cast<unsigned>(define_value(k.launch.defines, "THREADS")));
  EXPECT_EQ(l.smem, static_cast<unsigned>(define_value(k.launch.defines, "SMEM_BYTES")));
  EXPECT_EQ(plan->maps, 0);
  EXPECT_EQ(plan->workspaces, 0);
  // The dense plans serve attntune_attention_forward only.
  auto kv = dense_call_of(p);
  kv.entry = kEntryKvcache;
  std::string why;
  EXPECT_FALSE(plan_call(k.launch, kv, FakeDevice{}.device(), &why));
  EXPECT_NE(why.find("attntune_attention_forward"), std::string::npos) << why;
}
}  // namespace test_persistent_grid
