// flash_fwd_wgmma on CI (no GPU): the space, rendering, and NVRTC builds for sm_90a. A build takes
// 3-6 s on one core and CI has 2 cores and little time left, so a fixed, deterministic spread of
// the valid configs is built: ATTNTUNE_BUILD_SAMPLE per head dim, default 4, which with the named
// configs below covers every option on and off; 0 builds all. Dtype and causal alternate.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <tuple>


#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cuda/nvrtc.hpp"
#include "eval/build_pool.hpp"
#include "search/valid_configs.hpp"
#include "tests/common/plan_call.hpp"
#include "tests/common/run_attntune.hpp"
#include "tests/common/sass.hpp"
#include "templates/flash_fwd_wgmma/launch.h"

namespace test_flash_fwd_wgmma_build {
using namespace attntune;

namespace {

// The plan of a dense call of p for a config, on a 132-SM device.
attntune_plan::Plan plan_of(const SearchSpace& space, const Config& c, const Problem& p) {
  std::string why;
  const auto plan =
      plan_call(render_kernel(space, c, p, "sm_90a").launch, attntune::testing::dense_call_of(p), attntune::testing::FakeDevice{}.device(), &why);
  EXPECT_TRUE(plan) << config_str(c) << ": " << why;
  return plan ? *plan : attntune_plan::empty_plan();
}
attntune_plan::Launch launch_of(const SearchSpace& space, const Config& c, const Problem& p) {
  return plan_of(space, c, p).launch[0];
}

constexpr const char* kArch = "sm_90a";

SearchSpace load_space() { return SearchSpace::load(ATTNTUNE_SOURCE_DIR "/search_spaces/flash_fwd_wgmma.yaml"); }

std::vector<Config> spread(std::vector<Config> all, std::size_t n) {
  if (n == 0 || n >= all.size()) return all;
  std::vector<Config> out;
  for (std::size_t i = 0; i < n; ++i) out.push_back(all[i * all.size() / n]);
  return out;
}

bool flag(const Config& c, const char* name) { return std::get<bool>(c.at(name)); }
std::int64_t num(const Config& c, const char* name) { return std::get<std::int64_t>(c.at(name)); }

// The first valid config (in the space's order) that `pred` accepts; empty if none.
template <class Pred>
Config first_valid(const SearchSpace& space, const Problem& p, Pred pred) {
  Config found;
  space.for_each_valid(p, kArch, [&](const Config& c) {
    if (found.empty() && pred(c)) found = c;
  });
  return found;
}

// The first valid config with these options (the ablation steps of docs/log/WGMMA.md).
Config find(const SearchSpace& space, const Problem& p, std::int64_t block_m, bool ws, bool pp, bool ov) {
  return first_valid(space, p, [&](const Config& c) {
    return num(c, "block_m") == block_m && num(c, "block_n") == 128 && flag(c, "warp_specialize") == ws &&
           flag(c, "ping_pong") == pp && flag(c, "intra_wg_overlap") == ov;
  });
}

// The last valid config of p (the space's order: the largest tiles) that `pred` accepts; empty if none.
template <class Pred>
Config last_valid(const SearchSpace& space, const Problem& p, Pred pred) {
  Config found;
  space.for_each_valid(p, kArch, [&](const Config& c) {
    if (pred(c)) found = c;
  });
  return found;
}

// The (config, problem) pairs a build test compiles: for each problem spec, the last valid config a
// predicate picks (and, given `flag`, that has that tunable on).
struct EdgeJobs {
  const SearchSpace& space;
  const char* flag_name = nullptr;
  std::vector<std::pair<Config, Problem>> jobs = {};
  template <class Pred>
  void add(const char* spec, Pred pred) {
    const Problem p = Problem::parse(spec);
    const Config c = last_valid(space, p, [&](const Config& x) { return (!flag_name || flag(x, flag_name)) && pred(x); });
    ASSERT_FALSE(c.empty()) << spec;
    jobs.emplace_back(c, p);
  }
};

// Builds every (config, problem) for kArch: each one ok, without spills or serialised wgmmas; prints
// its registers.
void expect_clean_builds(const SearchSpace& space, const std::vector<std::pair<Config, Problem>>& jobs) {
  BuildPoolOptions pool_opts;
  pool_opts.nvrtc_options = family_nvrtc_options("flash_fwd_wgmma");
  pool_opts.worker_argv = {attntune::testing::attntune_bin(), "build-worker"};
  BuildPool pool(pool_opts);
  for (const auto& [c, p] : jobs) pool.submit({c, render_kernel(space, c, p, kArch), kArch});
  std::size_t built = 0;
  while (auto o = pool.next()) {
    ++built;
    EXPECT_EQ(o->build.status, "ok") << config_str(o->job.config) << "\n" << o->build.log;
    EXPECT_EQ(o->build.spill_stores + o->build.spill_loads, 0) << config_str(o->job.config);
    EXPECT_EQ(o->build.log.find("C751"), std::string::npos) << "wgmma serialised: " << o->build.log;
    std::printf("d=%lld %s: %d registers, %d spill bytes\n",
                static_cast<long long>(define_value(o->job.kernel.launch.defines, "ATT_HEAD_DIM")),
                config_str(o->job.config).c_str(), o->build.registers, o->build.spill_stores + o->build.spill_loads);
  }
  EXPECT_EQ(built, jobs.size());
}

}  // namespace

TEST(FlashFwdWgmmaSpace, OptionsAndLimitsAreConsistent) {
  const SearchSpace space = load_space();
  for (int d : {64, 128, 256}) {
    const Problem p = Problem::parse(fmt::format("b=1,h=1,s=4096,d={},dtype=bf16,causal=0", d));
    std::set<std::int64_t> block_ms;
    std::size_t n = 0;
    space.for_each_valid(p, kArch, [&](const Config& c) {
      ++n;
      block_ms.insert(num(c, "block_m"));
      if (flag(c, "ping_pong")) {
        EXPECT_GE(num(c, "block_m"), 128) << config_str(c);  // a ring of two or three warpgroups
      }
      EXPECT_EQ(num(c, "head_group"), 1) << "non-causal tiles need no order: " << config_str(c);
      if (!flag(c, "warp_specialize")) {
        EXPECT_FALSE(flag(c, "ping_pong") || flag(c, "intra_wg_overlap")) << config_str(c);
      }
      const attntune_plan::Launch g = launch_of(space, c, p);
      EXPECT_LE(g.smem, 232448u) << config_str(c);
      EXPECT_EQ(g.block, static_cast<unsigned>(num(c, "block_m") * 2 + (flag(c, "warp_specialize") ? 128 : 0)));
      if (!flag(c, "persistent")) {
        EXPECT_EQ(g.grid[0], static_cast<unsigned>((4096 + num(c, "block_m") - 1) / num(c, "block_m")));
      }
    });
    EXPECT_GT(n, 20u) << "d=" << d;
    // d=256: O alone is 128 registers a consumer thread, so three warpgroups (160 each) do not fit.
    const std::set<std::int64_t> want =
        d == 256 ? std::set<std::int64_t>{64, 128} : std::set<std::int64_t>{64, 128, 192};
    EXPECT_EQ(block_ms, want) << "d=" << d;
  }
  EXPECT_THROW(space.enumerate(Problem::parse("b=1,h=1,s=128,d=128,dtype=bf16,causal=0"), "sm_90"), InputError);
}

// Causal adds the tile order (head_group); ping-pong rings two or three consumer warpgroups; a
// persistent causal grid takes its tiles from a counter, which needs the producer warpgroup.
TEST(FlashFwdWgmmaSpace, CausalOrdersTilesInHeadGroups) {
  const SearchSpace space = load_space();
  const Problem p = Problem::parse("b=8,h=16,s=2048,d=64,dtype=bf16,causal=1");
  std::set<std::int64_t> groups, ring_block_ms;
  std::size_t persistent = 0;
  space.for_each_valid(p, kArch, [&](const Config& c) {
    groups.insert(num(c, "head_group"));
    if (flag(c, "ping_pong")) ring_block_ms.insert(num(c, "block_m"));
    if (flag(c, "persistent")) {  // the tile counter lives in the producer
      EXPECT_TRUE(flag(c, "warp_specialize")) << config_str(c);
      ++persistent;
    }
  });
  EXPECT_GT(persistent, 0u);
  // Without a producer a persistent causal grid is refused; with one, its launch takes the counter.
  Config plain = first_valid(space, p, [](const Config& c) { return !flag(c, "warp_specialize"); });
  Config dynamic = first_valid(space, p, [](const Config& c) { return flag(c, "persistent"); });
  ASSERT_FALSE(plain.empty());
  plain["persistent"] = true;
  const std::optional<std::string> why = space.check(plain, p, kArch);
  ASSERT_TRUE(why.has_value()) << "a persistent causal grid without a producer must be refused";
  EXPECT_NE(why->find("takes its tiles from a counter"), std::string::npos) << *why;
  ASSERT_FALSE(dynamic.empty());
  // The counter: one zeroed, optional workspace of two ints.
  const attntune_plan::Plan with_counter = plan_of(space, dynamic, p);
  ASSERT_EQ(with_counter.workspaces, 1);
  EXPECT_EQ(with_counter.workspace[0].bytes, 2 * sizeof(int));
  EXPECT_EQ(with_counter.workspace[0].zeroed, 1);
  Problem non_causal = p;
  non_causal.causal = false;
  dynamic["head_group"] = std::int64_t{1};
  EXPECT_EQ(plan_of(space, dynamic, non_causal).workspaces, 0) << "non-causal tiles are dealt in turn";
  EXPECT_EQ(groups, (std::set<std::int64_t>{1, 4, 16}));
  EXPECT_EQ(ring_block_ms, (std::set<std::int64_t>{128, 192}));
}

// A narrow first tile is one of two widths below block_n; block_n 64 has only the full one.
TEST(FlashFwdWgmmaSpace, NarrowFirstTileIsNarrowerThanTheTile) {
  const SearchSpace space = load_space();
  const Problem p = Problem::parse("b=4,h=16,s=4096,d=128,dtype=bf16,causal=0");
  std::set<std::int64_t> narrow;
  space.for_each_valid(p, kArch, [&](const Config& c) {
    narrow.insert(num(c, "narrow_n"));
    if (num(c, "narrow_n") > 0) {
      EXPECT_LT(num(c, "narrow_n"), num(c, "block_n")) << config_str(c);
    }
  });
  EXPECT_EQ(narrow, (std::set<std::int64_t>{0, 64}));
  Config c;
  space.for_each_valid(p, kArch, [&](const Config& x) {
    if (c.empty() && num(x, "block_n") == 64) c = x;
  });
  ASSERT_FALSE(c.empty());
  c["narrow_n"] = std::int64_t{64};
  const std::optional<std::string> why = space.check(c, p, kArch);
  ASSERT_TRUE(why.has_value()) << "narrow_n = block_n must be refused";
  EXPECT_NE(why->find("narrower than block_n"), std::string::npos) << *why;
}

// The lazy rescale is d=64's (it lost at d=128): off, or P below 2^8.
TEST(FlashFwdWgmmaSpace, LazyRescaleIsForD64) {
  const SearchSpace space = load_space();
  for (int d : {64, 128, 256}) {
    std::set<std::int64_t> lazy;
    const Problem p = Problem::parse(fmt::format("b=8,h=16,s=2048,d={},dtype=bf16,causal=1", d));
    space.for_each_valid(p, kArch, [&](const Config& c) { lazy.insert(num(c, "lazy_rescale")); });
    const std::set<std::int64_t> want = d == 64 ? std::set<std::int64_t>{0, 8} : std::set<std::int64_t>{0};
    EXPECT_EQ(lazy, want) << "d=" << d;
  }
}

// split_tail shares out a persistent grid's last round with a producer's pieces: refused
// elsewhere, with the space's reason; offered both ways where it applies.
TEST(FlashFwdWgmmaSpace, SplitTailNeedsAPersistentGridWithAProducer) {
  const SearchSpace space = load_space();
  const Problem p = Problem::parse("b=4,h=16,s=4096,d=128,dtype=bf16,causal=0");
  std::set<bool> split;
  Config plain;
  space.for_each_valid(p, kArch, [&](const Config& c) {
    if (flag(c, "split_tail")) {
      EXPECT_TRUE(flag(c, "persistent") && flag(c, "warp_specialize")) << config_str(c);
    }
    split.insert(flag(c, "split_tail"));
    if (plain.empty() && !flag(c, "persistent")) plain = c;
  });
  EXPECT_EQ(split, (std::set<bool>{false, true}));
  ASSERT_FALSE(plain.empty());
  plain["split_tail"] = true;
  const std::optional<std::string> why = space.check(plain, p, kArch);
  ASSERT_TRUE(why.has_value()) << "split_tail without a persistent grid must be refused";
  EXPECT_NE(why->find("persistent grid's last round"), std::string::npos) << *why;

  // d=64 and block_m 64: not offered (slower at d=64; the producer spills).
  const Problem d64 = Problem::parse("b=8,h=16,s=2048,d=64,dtype=bf16,causal=0");
  Config persistent;
  space.for_each_valid(d64, kArch, [&](const Config& c) {
    EXPECT_FALSE(flag(c, "split_tail")) << config_str(c);
    if (persistent.empty() && flag(c, "persistent") && flag(c, "warp_specialize")) persistent = c;
  });
  space.for_each_valid(p, kArch, [&](const Config& c) {
    if (flag(c, "split_tail")) {
      EXPECT_GE(num(c, "block_m"), 128) << config_str(c);
    }
  });
  ASSERT_FALSE(persistent.empty());
  persistent["split_tail"] = true;
  const std::optional<std::string> why64 = space.check(persistent, d64, kArch);
  ASSERT_TRUE(why64.has_value());
  EXPECT_NE(why64->find("d=64 measured slower"), std::string::npos) << *why64;

  // d=256: offered with producer_regs 40 only (at 24 the producer of 128x80 spills).
  const Problem d256 = Problem::parse("b=4,h=8,s=4096,d=256,dtype=bf16,causal=0");
  std::set<std::int64_t> split_producer_regs;
  space.for_each_valid(d256, kArch, [&](const Config& c) {
    if (flag(c, "split_tail")) split_producer_regs.insert(num(c, "producer_regs"));
  });
  EXPECT_EQ(split_producer_regs, (std::set<std::int64_t>{40}));

  // Causal: not offered where the tiles are many (over ~4 rounds): its persistent grids take tiles
  // from a counter, longest first, and the causal split's plan would split nothing, so split_tail 0
  // and 1 would be one kernel twice (each evaluated, in every causal campaign). Where they are few
  // (a chunked prefill) it is the causal split: PersistentGrid.CausalSplitPiecesTheLastRoundOfAChunkedPrefill.
  const Problem causal = Problem::parse("b=4,h=16,s=4096,d=128,dtype=bf16,causal=1");
  Config counter;
  space.for_each_valid(causal, kArch, [&](const Config& c) {
    EXPECT_FALSE(flag(c, "split_tail")) << config_str(c);
    if (counter.empty() && flag(c, "persistent")) counter = c;
  });
  ASSERT_FALSE(counter.empty());
  counter["split_tail"] = true;
  const std::optional<std::string> why_causal = space.check(counter, causal, kArch);
  ASSERT_TRUE(why_causal.has_value());
  EXPECT_NE(why_causal->find("same kernel twice"), std::string::npos) << *why_causal;
}

// kv_multicast pairs a non-causal persistent grid's CTAs, one of whose producers loads every K/V
// tile into both: offered there, refused elsewhere with the space's reason.
TEST(FlashFwdWgmmaSpace, KvMulticastNeedsAPairablePersistentGrid) {
  const SearchSpace space = load_space();
  for (int d : {64, 128, 256}) {
    for (bool causal : {false, true}) {
      const Problem p = Problem::parse(fmt::format("b=4,h=16,s=4096,d={},dtype=bf16,causal={}", d, causal ? 1 : 0));
      std::set<bool> offered;
      Config refused;
      std::size_t n = 0;
      space.for_each_valid(p, kArch, [&](const Config& c) {
        offered.insert(flag(c, "kv_multicast"));
        if (flag(c, "kv_multicast")) {
          EXPECT_TRUE(flag(c, "persistent") && flag(c, "warp_specialize")) << config_str(c);
        }
        // The launch's cluster: of every multicast config and every 16th other one (planning each of
        // the space's configs took most of CI's minute and a half here).
        if (flag(c, "kv_multicast") || n++ % 16 == 0) {
          EXPECT_EQ(launch_of(space, c, p).cluster, flag(c, "kv_multicast") ? 2u : 1u) << config_str(c);
        }
        if (refused.empty() && !flag(c, "persistent") && flag(c, "warp_specialize")) refused = c;
      });
      const bool want = !causal;
      const std::set<bool> expected = want ? std::set<bool>{false, true} : std::set<bool>{false};
      EXPECT_EQ(offered, expected) << "d=" << d << " causal=" << causal;
      ASSERT_FALSE(refused.empty());
      refused["kv_multicast"] = true;
      const std::optional<std::string> why = space.check(refused, p, kArch);
      ASSERT_TRUE(why.has_value()) << "kv_multicast without a persistent grid must be refused";
      EXPECT_NE(why->find("kv_multicast pairs the CTAs"), std::string::npos) << *why;
    }
  }
}

// The tail rule the evaluator and the exported launcher share: two K/V iterations per CTA at
// least, nothing to split when the rounds are whole, and 32-bit share arithmetic in the kernel.
TEST(FlashFwdWgmmaSpace, SplitTailTilesRule) {
  EXPECT_EQ(att::sched::split_tail_tiles(2048, 132, 24), 68u);   // s=4k: 16 rounds, the last with 68 tiles
  EXPECT_EQ(att::sched::split_tail_tiles(4224, 132, 24), 0u);    // whole rounds
  EXPECT_EQ(att::sched::split_tail_tiles(100, 132, 24), 0u);     // fewer tiles than CTAs: one round
  EXPECT_EQ(att::sched::split_tail_tiles(133, 132, 1), 0u);      // 1 tail tile x 1 iteration < 2 per CTA
  EXPECT_EQ(att::sched::split_tail_tiles(2048, 132, 1u << 20), 0u);  // tail * n * ctas >= 2^31
  EXPECT_EQ(att::sched::split_tail_tiles((1ull << 31) - 195, 132, 60), 0u);  // 5 tail tiles, but tiles + 2 * ctas >= 2^31
  EXPECT_EQ(att::sched::split_tail_tiles((1ull << 30) + 5, 132, 60), 105u);  // far from it: split
  EXPECT_EQ(att::sched::split_workspace_bytes(132, 8, 128), 2ull * 132 * 8 * 68 * 32 * 4);
  EXPECT_EQ(att::sched::split_counter_bytes(68, 8), 544u * 4);
}

// The variants (window, soft-cap, sinks) on every entry point, causal and not, every head dim;
// the split tail never with a window (its tiles differ in iterations); softcap_tanh only where
// there is a soft-cap; and a build serves exactly its variants.
TEST(FlashFwdWgmmaSpace, ServesTheVariants) {
  const SearchSpace space = load_space();
  for (int d : {64, 128, 256})
    for (const char* entry : {"", ",page=16", ",varlen=1"})
      for (const char* variant : {"window=127", "window=127,64", "softcap=30", "sinks=1", "window=4096,softcap=50,sinks=1"})
        for (int causal : {0, 1}) {
          if (causal && std::string(variant).find(",64") != std::string::npos) continue;  // causal bounds the right
          const Problem p = Problem::parse(fmt::format("b=4,h=8,s=1024,sk=2048,d={},dtype=bf16,causal={},{}{}", d, causal,
                                                       variant, entry));
          std::size_t n = 0;
          std::set<std::string> tanh;
          space.for_each_valid(p, kArch, [&](const Config& c) {
            ++n;
            tanh.insert(std::get<std::string>(c.at("softcap_tanh")));
            if (p.windowed()) {
              EXPECT_FALSE(flag(c, "split_tail")) << p.str() << " " << config_str(c);
            }
          });
          EXPECT_GT(n, 20u) << p.str();
          const std::set<std::string> want =
              p.softcapped() ? std::set<std::string>{"accurate", "approx"} : std::set<std::string>{"accurate"};
          EXPECT_EQ(tanh, want) << p.str();
        }
  // A non-causal window with the split tail: refused, with the reason.
  const Problem windowed = Problem::parse("b=4,h=16,s=4096,d=128,dtype=bf16,causal=0,window=127");
  Problem plain = windowed;
  plain.window_left = -1;
  Config split = first_valid(space, plain, [](const Config& c) { return flag(c, "split_tail"); });
  ASSERT_FALSE(split.empty());
  const std::optional<std::string> why = space.check(split, windowed, kArch);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("window's tiles differ"), std::string::npos) << *why;
  // Plain problems keep their configs: softcap_tanh is one value there.
  Config plain_cfg = first_valid(space, plain, [](const Config&) { return true; });
  plain_cfg["softcap_tanh"] = std::string("approx");
  EXPECT_TRUE(space.check(plain_cfg, plain, kArch).has_value());

  // The plan: a window build takes windowed calls and refuses plain ones (and the other way round).
  const Config c = first_valid(space, windowed, [](const Config& x) { return flag(x, "persistent"); });
  ASSERT_FALSE(c.empty());
  const auto windowed_build = render_kernel(space, c, windowed, kArch).launch;
  attntune_plan::Call call = attntune::testing::dense_call_of(windowed);
  std::string why_plan;
  EXPECT_FALSE(plan_call(windowed_build, call, attntune::testing::FakeDevice{}.device(), &why_plan));
  EXPECT_NE(why_plan.find("window"), std::string::npos) << why_plan;
  call.window_left = 127;
  call.window_right = -1;
  EXPECT_TRUE(plan_call(windowed_build, call, attntune::testing::FakeDevice{}.device(), &why_plan)) << why_plan;
  Config plain_c = c;
  const auto plain_build = render_kernel(space, plain_c, plain, kArch).launch;
  EXPECT_FALSE(plan_call(plain_build, call, attntune::testing::FakeDevice{}.device(), &why_plan));
}

// The varlen order's work estimate counts the keys a window lets a row see: a batch whose
// causal work orders it runs in the packed order under a window of 127 keys (its order kernel's
// launch would cost more than the better end gains), as a small plain batch does.
TEST(FlashFwdWgmmaSpace, VarlenOrderCountsTheWindowsKeys) {
  const SearchSpace space = load_space();
  for (bool windowed : {false, true}) {
    Problem p = Problem::parse("b=8,h=32,hkv=8,s=3000,sk=3000,d=128,dtype=bf16,causal=1,varlen=1000");
    if (windowed) p.window_left = 127;
    const Config c = first_valid(space, p, [](const Config&) { return true; });
    ASSERT_FALSE(c.empty());
    const RenderedKernel k = render_kernel(space, c, p, kArch);  // the defines' names point into it
    const auto l = launch_constants<attntune_plan::FlashFwdWgmmaLaunch>(k.launch.defines, "flash_fwd_wgmma");
    attntune_plan::Call call = attntune::testing::varlen_call_of(p);
    call.window_left = windowed ? 127 : -1;
    // 4 * 32 * 128 * 24000 rows * (3000 / 2 keys, or 128) FLOPs: 5.9e11 plain, 5.0e10 windowed.
    EXPECT_DOUBLE_EQ(l.visible_keys(call), windowed ? 128.0 : 1500.0);
    EXPECT_EQ(l.varlen_orders(call), !windowed);
  }
}

// A soft-cap's tanh costs registers: ptxas spilled at est_regs = consumer_regs (d=128 128x192) and,
// at d=64, with 20 and 32 to spare (128x208, 128x192), so the space asks 8 more of a soft-cap build
// (40 at d=64); plain builds keep those configs.
TEST(FlashFwdWgmmaSpace, SoftcapLeavesRoomForItsTanh) {
  const SearchSpace space = load_space();
  for (auto [d, block_m, block_n] : {std::tuple{128, 128, 192}, {64, 128, 208}, {64, 192, 96}}) {
    const Problem plain = Problem::parse(fmt::format("b=4,h=16,s=4096,d={},dtype=bf16,causal=0", d));
    Problem capped = plain;
    capped.softcap = 50;
    const Config c = first_valid(space, plain, [&](const Config& x) {
      return num(x, "block_m") == block_m && num(x, "block_n") == block_n && flag(x, "warp_specialize") &&
             num(x, "exp2_emu") == 0;
    });
    ASSERT_FALSE(c.empty()) << d;
    const std::optional<std::string> why = space.check(c, capped, kArch);
    ASSERT_TRUE(why.has_value()) << config_str(c);
    EXPECT_NE(why->find("accumulators exceed"), std::string::npos) << *why;
  }
}

// Every multiple of 16 from 32 to 256 on every entry point, causal and not, with persistent grids;
// the multiples of 8 between them refused with the reason; the modes where each head dim has them.
TEST(FlashFwdWgmmaSpace, ServesEveryHeadDimOfSixteen) {
  const SearchSpace space = load_space();
  for (int d = 32; d <= 256; d += 16)
    for (const char* entry : {"", ",page=16", ",varlen=1"})
      for (int causal : {0, 1}) {
        const Problem p =
            Problem::parse(fmt::format("b=4,h=16,s=4096,d={},dtype=bf16,causal={}{}", d, causal, entry));
        std::size_t n = 0, persistent = 0, multicast = 0;
        const bool before = d == 64 || d == 128 || d == 256;  // the head dims the space served before
        space.for_each_valid(p, kArch, [&](const Config& c) {
          ++n;
          persistent += flag(c, "persistent");
          multicast += flag(c, "kv_multicast");
          // Where the producer spilled at 24 registers (the space's whys): the split tail with
          // multicast but at d=128, a persistent grid over pages at the new head dims.
          if ((flag(c, "split_tail") && flag(c, "kv_multicast") && d != 128) ||
              (p.page > 0 && flag(c, "persistent") && !before)) {
            EXPECT_EQ(num(c, "producer_regs"), 40) << p.str() << " " << config_str(c);
          }
          if (flag(c, "split_tail")) {
            EXPECT_GT(d, 64) << config_str(c);
          }
        });
        EXPECT_GT(n, 20u) << p.str();
        EXPECT_GT(persistent, 0u) << p.str();
        if (!causal && std::string(entry).empty()) {
          EXPECT_GT(multicast, 0u) << p.str();
        }
      }
  for (int d = 40; d < 256; d += 16) {
    const Problem p = Problem::parse(fmt::format("b=4,h=16,s=4096,d={},dtype=bf16,causal=0", d));
    try {
      space.check_problem(p, kArch);
      ADD_FAILURE() << "d=" << d << " must be refused";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("head dims step by 16"), std::string::npos) << e.what();
    }
  }
  for (int d : {16, 24, 264, 512}) {
    EXPECT_THROW(space.check_problem(Problem::parse(fmt::format("b=1,h=1,s=128,d={},dtype=bf16,causal=0", d)), kArch),
                 InputError)
        << d;
  }
}

// An H100 reports sm_90; wgmma and setmaxnreg need the arch-specific sm_90a build.
TEST(FlashFwdWgmmaSpace, DeviceArchMapsToTheSpacesArch) {
  const SearchSpace wgmma = load_space();
  EXPECT_EQ(space_arch_for_device(wgmma, "sm_90"), "sm_90a");
  EXPECT_EQ(space_arch_for_device(wgmma, "sm_89"), "sm_89");  // which the space then refuses
  const SearchSpace mma = SearchSpace::load(ATTNTUNE_SOURCE_DIR "/search_spaces/flash_fwd_mma.yaml");
  EXPECT_EQ(space_arch_for_device(mma, "sm_90"), "sm_90");
  EXPECT_EQ(space_arch_for_device(mma, "sm_89"), "sm_89");
}

TEST(FlashFwdWgmmaRender, SourceIsFlatAndCarriesEveryTunable) {
  const SearchSpace space = load_space();
  const Problem p = Problem::parse("b=2,h=8,s=1000,d=128,dtype=bf16,causal=1");
  const Config c = find(space, p, 128, true, true, true);
  ASSERT_FALSE(c.empty());
  const RenderedKernel k = render_kernel(space, c, p, kArch);
  EXPECT_EQ(k.source.find("#include \""), std::string::npos) << "includes must be inlined";
  for (const auto& param : space.params())
    EXPECT_NE(k.source.find("#define " + macro_name(param.name) + " "), std::string::npos) << param.name;
  for (const char* derived : {"THREADS", "SMEM_BYTES", "CONSUMER_REGS"})
    EXPECT_NE(k.source.find(std::string("#define ") + derived + " "), std::string::npos) << derived;
  EXPECT_EQ(k.kernel_name, "flash_fwd_wgmma");
  const Problem other = Problem::parse("b=7,h=4,hkv=1,s=77,sk=5000,d=128,dtype=bf16,causal=1");
  EXPECT_EQ(render_kernel(space, c, other, kArch).source_hash, k.source_hash);
}

class FlashFwdWgmmaBuild : public ::testing::TestWithParam<int> {};

TEST_P(FlashFwdWgmmaBuild, SampledValidConfigsCompile) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const int d = GetParam();
  const SearchSpace space = load_space();
  const Problem p = Problem::parse(fmt::format("b=1,h=1,s=128,d={},dtype=bf16,causal=0", d));
  const std::size_t n = attntune::testing::build_sample(4);
  std::vector<Config> configs = spread(space.enumerate(p, kArch), n);
  if (d == 128 && n != 0) {  // each ablation step once: plain, producer, ping-pong, overlap, both
    for (auto [bm, ws, pp, ov] : {std::tuple{64, false, false, false}, {128, true, false, false},
                                  {128, true, true, false}, {128, true, false, true}, {128, true, true, true}}) {
      configs.push_back(find(space, p, bm, ws, pp, ov));
      ASSERT_FALSE(configs.back().empty()) << bm << ws << pp << ov;
    }
  }
  std::vector<Problem> problems(configs.size(), p);
  if (n != 0) {  // causal, three consumer warpgroups in a ping-pong ring, tiles in head groups
                 // taken from the counter (persistent), narrow first tiles, lazy rescale (d=64)
    Problem causal = p;
    causal.causal = true;
    // (d=256: two warpgroups, the most that fit.)
    const Config ring = first_valid(space, causal, [&](const Config& c) {
      return num(c, "block_m") == (d == 256 ? 128 : 192) && flag(c, "ping_pong") && flag(c, "intra_wg_overlap") &&
             num(c, "head_group") == 16 && num(c, "narrow_n") == 64 && num(c, "lazy_rescale") == (d == 64 ? 8 : 0) &&
             flag(c, "persistent");
    });
    ASSERT_FALSE(ring.empty());
    configs.push_back(ring);
    problems.push_back(causal);
    if (d >= 128) {
      // The stream-K tail: its pieces, the combine, the producer's share arithmetic (at d=256
      // with producer_regs 40: at 24 its 128x80 builds spill).
      const Config split = first_valid(space, p, [](const Config& c) {
        return flag(c, "split_tail") && flag(c, "ping_pong") && num(c, "block_m") == 128;
      });
      ASSERT_FALSE(split.empty());
      configs.push_back(split);
      problems.push_back(p);
    }
    {
      // K/V multicast over CTA pairs, with the split tail (pieces in pairs) where it applies; at
      // d=128 the tuner's s=4k pick's shape (128 x 192, producer_regs 24).
      const Config mc = first_valid(space, p, [&](const Config& c) {
        return flag(c, "kv_multicast") && flag(c, "split_tail") == (d >= 128) && flag(c, "ping_pong") &&
               flag(c, "intra_wg_overlap") && num(c, "block_m") == 128 &&
               num(c, "block_n") == (d == 256 ? 80 : 192) && num(c, "narrow_n") == 64 &&
               num(c, "producer_regs") == (d == 256 ? 40 : 24);
      });
      ASSERT_FALSE(mc.empty());
      configs.push_back(mc);
      problems.push_back(p);
    }
    if (d == 128) {
      // The producer's tightest corner: split pieces with block_n 64 and no overlap spilled 24
      // bytes at producer_regs 24 when its tile loop grew a branch (H100 property test, run 46).
      const Config tight = first_valid(space, p, [](const Config& c) {
        return flag(c, "split_tail") && num(c, "block_n") == 64 && !flag(c, "intra_wg_overlap") &&
               num(c, "producer_regs") == 24;
      });
      ASSERT_FALSE(tight.empty());
      configs.push_back(tight);
      problems.push_back(p);
    }
  }
  BuildPoolOptions pool_opts;
  pool_opts.nvrtc_options = family_nvrtc_options("flash_fwd_wgmma");
  pool_opts.worker_argv = {attntune::testing::attntune_bin(), "build-worker"};
  BuildPool pool(pool_opts);
  std::size_t i = 0;
  for (const Config& c : configs) {
    Problem v = problems[i];
    v.dtype = i % 2 ? DType::kFp16 : DType::kBf16;
    // Persistent causal grids need the producer (the tile counter), split_tail a non-causal
    // problem; a causal-only config (head_group > 1) stays causal.
    v.causal = v.causal || ((i / 2) % 2 && (!flag(c, "persistent") || flag(c, "warp_specialize")) &&
                            !flag(c, "split_tail") && !flag(c, "kv_multicast"));
    ++i;
    pool.submit({c, render_kernel(space, c, v, kArch), kArch});
  }
  std::size_t built = 0;
  while (auto o = pool.next()) {
    ++built;
    EXPECT_EQ(o->build.status, "ok") << config_str(o->job.config) << "\n" << o->build.log;
    EXPECT_GT(o->build.registers, 0) << "ptxas resource report missing";
    EXPECT_EQ(o->build.spill_stores + o->build.spill_loads, 0) << config_str(o->job.config);
  }
  EXPECT_EQ(built, configs.size());
}

// The attention variants (window, soft-cap, sinks; all three, each entry point and mode): configs
// of variant problems compile for sm_90a without spills or serialised wgmmas, as plain ones do.
// Per head dim, at the space's register edge (the largest block_n, or block_m, a variant problem
// keeps) where it can be: causal windows with sinks on a persistent grid (the producer computes each
// tile's window on its 24 registers), all three together, a soft-cap with sinks, the split tail
// and multicast, tanh.approx, a window over multicast pairs of one warpgroup, a paged KV cache on
// a persistent grid, a packed batch, and the plain schedule (no producer); the last four at d=128
// only (CI's two cores).
TEST_P(FlashFwdWgmmaBuild, VariantConfigsCompileWithoutSpills) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const int d = GetParam();
  const SearchSpace space = load_space();
  std::vector<std::pair<Config, Problem>> jobs;
  // The last valid config (the space's order: the largest tiles) that `pred` accepts.
  auto add = [&](const std::string& problem, auto pred) {
    const Problem p = Problem::parse(fmt::format("{},d={}", problem, d));
    const Config found = last_valid(space, p, pred);
    ASSERT_FALSE(found.empty()) << p.str();
    jobs.emplace_back(found, p);
  };
  add("b=4,h=16,s=4096,dtype=bf16,causal=1,window=127,sinks=1", [](const Config& c) {
    return flag(c, "persistent") && flag(c, "ping_pong") && flag(c, "intra_wg_overlap") && num(c, "narrow_n") > 0 &&
           num(c, "producer_regs") == 24 && num(c, "exp2_emu") == 0 && num(c, "stages") == 2;
  });
  add("b=4,h=16,s=4096,dtype=fp16,causal=1,window=4096,softcap=50,sinks=1", [](const Config& c) {
    return num(c, "block_m") == 128 && flag(c, "intra_wg_overlap") && flag(c, "ping_pong") && num(c, "exp2_emu") == 0 &&
           num(c, "stages") == 2 && !flag(c, "persistent");
  });
  add("b=4,h=16,s=4096,dtype=bf16,causal=0,softcap=30,sinks=1", [&](const Config& c) {
    return flag(c, "kv_multicast") && flag(c, "split_tail") == (d >= 128) && flag(c, "ping_pong") &&
           flag(c, "intra_wg_overlap") && num(c, "exp2_emu") == 0 && num(c, "stages") == 2;
  });
  add("b=4,h=32,hkv=8,s=2048,sk=10240,dtype=bf16,causal=1,page=16,window=4096,sinks=1", [](const Config& c) {
    return flag(c, "persistent") && flag(c, "intra_wg_overlap") && num(c, "stages") == 2 && num(c, "exp2_emu") == 0;
  });
  if (d == 128) {
    add("b=4,h=16,s=4096,dtype=bf16,causal=1,softcap=50", [](const Config& c) {
      return std::get<std::string>(c.at("softcap_tanh")) == "approx" && flag(c, "ping_pong") && num(c, "exp2_emu") == 0;
    });
    add("b=4,h=16,s=4096,dtype=bf16,causal=0,window=127,64",
        [](const Config& c) { return flag(c, "kv_multicast") && num(c, "block_m") == 64 && num(c, "stages") == 2; });
    add("b=16,h=16,s=4096,dtype=bf16,causal=1,varlen=1,window=127,softcap=30", [](const Config& c) {
      return flag(c, "persistent") && flag(c, "intra_wg_overlap") && num(c, "stages") == 2 && num(c, "exp2_emu") == 0 &&
             num(c, "producer_regs") == 24;
    });
    add("b=4,h=16,s=4096,dtype=bf16,causal=1,window=127",
        [](const Config& c) { return !flag(c, "warp_specialize") && num(c, "stages") == 2; });
  }
  expect_clean_builds(space, jobs);
}

INSTANTIATE_TEST_SUITE_P(HeadDims, FlashFwdWgmmaBuild, ::testing::Values(64, 128, 256),
                         [](const auto& info) { return fmt::format("d{}", info.param); });

// The head dims of other tile layouts (templates/flash_fwd_wgmma/args.h, wgmma_tile: 64-byte rows
// at d = 32, 96, 160, 224; 32-byte rows at 48, 80, 112, 144, ...; 128-byte rows at 192) compile for
// sm_90a without spills or serialised wgmmas on every entry point (dense, a KV cache: the paged and
// the contiguous call run one build, varlen) and mode, at the space's register edge (the last valid
// config, the largest tiles): the users' dims (96, 80, 112, 192, 160, 32) in two modes each, the rest
// in the persistent causal grid with the producer on 24 registers (which copies 7-15 column blocks in
// a loop there). One build each: 18, ~30 s on CI's two cores.
TEST(FlashFwdWgmmaBuild, OtherHeadDimsCompileOnEveryEntryPoint) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = load_space();
  std::vector<std::pair<Config, Problem>> jobs;
  auto add = [&](int d, const std::string& problem, auto pred) {
    const Problem p = Problem::parse(fmt::format("{},d={}", problem, d));
    const Config found = last_valid(space, p, pred);
    ASSERT_FALSE(found.empty()) << p.str();
    jobs.emplace_back(found, p);
  };
  auto persistent_causal = [](const Config& c) {
    return flag(c, "persistent") && flag(c, "intra_wg_overlap") && num(c, "head_group") == 16 &&
           num(c, "stages") == 2 && num(c, "exp2_emu") == 0;
  };
  const char* dense = "b=4,h=16,s=4096,dtype=bf16,causal=0";
  const char* causal = "b=4,h=16,s=4096,dtype=fp16,causal=1";
  // Phi-3's 96: the split tail with multicast (the producer's tightest corner, producer_regs 40), a
  // packed batch.
  add(96, dense, [](const Config& c) {
    return flag(c, "split_tail") && flag(c, "kv_multicast") && flag(c, "ping_pong") && flag(c, "intra_wg_overlap") &&
           num(c, "stages") == 2;
  });
  add(96, "b=16,h=16,s=4096,dtype=bf16,causal=1,varlen=1", persistent_causal);
  // 80: a paged cache with a window and sinks on a persistent grid; the ring of three warpgroups.
  add(80, "b=4,h=32,hkv=8,s=2048,sk=10240,dtype=bf16,causal=1,page=16,window=4096,sinks=1", persistent_causal);
  add(80, causal, [&](const Config& c) {
    return persistent_causal(c) && num(c, "block_m") == 192 && flag(c, "ping_pong") && num(c, "producer_regs") == 24;
  });
  // 112: the persistent causal grid of one warpgroup (the column-block loop), the plain schedule.
  add(112, causal, [&](const Config& c) {
    return persistent_causal(c) && num(c, "block_m") == 64 && num(c, "producer_regs") == 24;
  });
  add(112, dense, [](const Config& c) { return !flag(c, "warp_specialize") && num(c, "stages") == 2; });
  // DeepSeek MLA prefill's 192 (qk): the split tail alone, a paged cache.
  add(192, dense, [](const Config& c) {
    return flag(c, "split_tail") && !flag(c, "kv_multicast") && flag(c, "ping_pong") && num(c, "producer_regs") == 24;
  });
  add(192, "b=4,h=32,hkv=8,s=2048,sk=10240,dtype=fp16,causal=1,page=64", persistent_causal);
  // 160: a soft-cap (tanh.approx) over multicast pairs, a packed batch with sinks.
  add(160, "b=4,h=16,s=4096,dtype=bf16,causal=0,softcap=30", [](const Config& c) {
    return flag(c, "kv_multicast") && std::get<std::string>(c.at("softcap_tanh")) == "approx" && num(c, "stages") == 2;
  });
  add(160, "b=16,h=16,s=4096,dtype=bf16,causal=0,varlen=1,sinks=1",
      [](const Config& c) { return flag(c, "persistent") && flag(c, "intra_wg_overlap") && num(c, "stages") == 2; });
  // 32: exp2 on the FMA pipe and the lazy rescale in the ring of three; a paged cache, non-causal.
  add(32, causal, [](const Config& c) {
    return num(c, "exp2_emu") == 1 && num(c, "lazy_rescale") == 8 && num(c, "block_m") == 192 && flag(c, "ping_pong");
  });
  add(32, "b=4,h=32,hkv=8,s=2048,sk=10240,dtype=bf16,causal=0,page=16", [](const Config& c) {
    return flag(c, "persistent") && flag(c, "intra_wg_overlap") && num(c, "exp2_emu") == 0 && num(c, "stages") == 2;
  });
  for (int d : {48, 144, 176, 208, 224, 240})
    add(d, causal, [&](const Config& c) { return persistent_causal(c) && num(c, "producer_regs") == 24; });
  expect_clean_builds(space, jobs);
}

// The PTX carries the Hopper machinery the template is built on.
TEST(FlashFwdWgmmaBuild, PtxUsesTmaWgmmaSetmaxnreg) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = load_space();
  const Problem p = Problem::parse("b=1,h=1,s=128,d=128,dtype=bf16,causal=1");
  const Config c = find(space, p, 128, true, true, true);
  cuda::CompileOptions opts{kArch, family_nvrtc_options("flash_fwd_wgmma"), true, 0};
  const auto out = cuda::nvrtc_compile(render_kernel(space, c, p, kArch).source, "k.cu", opts);
  ASSERT_TRUE(out.ok) << out.log;
  for (const char* instr : {"cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes",
                            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16", "wgmma.wait_group.sync.aligned",
                            "setmaxnreg.inc.sync.aligned.u32 240", "setmaxnreg.dec.sync.aligned.u32 24",
                            "mbarrier.try_wait.parity", "bar.arrive", "ex2.approx"})
    EXPECT_NE(out.ptx.find(instr), std::string::npos) << instr;
  EXPECT_EQ(out.log.find("C7512"), std::string::npos) << "wgmma serialized: " << out.log;
}

// kv_multicast: a kernel of 2-CTA clusters whose K/V copies go to both CTAs and whose consumers
// release each stage in both.
TEST(FlashFwdWgmmaBuild, KvMulticastPtxUsesClusters) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = load_space();
  const Problem p = Problem::parse("b=1,h=1,s=128,d=128,dtype=bf16,causal=0");
  cuda::CompileOptions opts{kArch, family_nvrtc_options("flash_fwd_wgmma"), true, 0};
  for (bool mc : {false, true}) {
    const Config c = first_valid(space, p, [&](const Config& x) {
      return flag(x, "persistent") && flag(x, "ping_pong") && flag(x, "kv_multicast") == mc;
    });
    ASSERT_FALSE(c.empty());
    const auto out = cuda::nvrtc_compile(render_kernel(space, c, p, kArch).source, "k.cu", opts);
    ASSERT_TRUE(out.ok) << out.log;
    for (const char* instr : {".multicast::cluster", "mapa.shared::cluster", "mbarrier.arrive.shared::cluster",
                              "barrier.cluster.arrive", ".reqnctapercluster 2, 1, 1"})
      EXPECT_EQ(out.ptx.find(instr) != std::string::npos, mc) << instr << " kv_multicast=" << mc;
  }
}

// GQA packing (pack_gqa): a tile holds block_m / G whole query rows of a KV head's G query heads, so
// the grid is (ceil(s / rows), hkv, b) and Q's map is (d, h, s, b) in boxes of (cols, G, rows), which
// TMA writes as G * rows rows in packed order; the kernel's tiles learn rows from TmaMaps::pack_rows.
// Offered with GQA only, G at most block_m, never with the split tail or the cluster pairs.
TEST(FlashFwdWgmmaRender, PackedGeometryAndWhereItIsOffered) {
  const SearchSpace space = load_space();
  auto packs = [](const Config& c) { return flag(c, "pack_gqa"); };
  const Problem p = Problem::parse("b=3,h=28,hkv=4,s=40,sk=4096,d=64,dtype=bf16,causal=1");
  std::size_t packed = 0;
  std::vector<Config> with, without;
  for (const Config& c : space.enumerate(p, kArch)) (packs(c) ? with : without).push_back(c);
  std::vector<Config> sample = spread(with, 40);
  for (const Config& c : spread(without, 20)) sample.push_back(c);
  for (const Config& c : sample) {
    const attntune_plan::Plan plan = plan_of(space, c, p);
    const unsigned bm = static_cast<unsigned>(num(c, "block_m"));
    const attntune_plan::Launch& g = plan.launch[0];
    const attntune_plan::TensorMap& q = plan.map[0];
    if (packs(c)) {
      ++packed;
      const unsigned rows = bm / 7;
      if (!flag(c, "persistent")) {
        EXPECT_EQ(g.grid[0], (40 + rows - 1) / rows) << config_str(c);
        EXPECT_EQ(g.grid[1], 4u);
        EXPECT_EQ(g.grid[2], 3u);
      } else {
        EXPECT_EQ(g.grid[0], std::min(132u, (40 + rows - 1) / rows * 4 * 3)) << config_str(c);
      }
      // (d, heads, rows, batch): heads one head apart (d elements), rows a sequence's row apart (d,
      // [B,H,S,D] here: the heads a sequence apart), boxes of the group's 7 heads and `rows` rows.
      EXPECT_EQ(q.dims[1], 28u);
      EXPECT_EQ(q.dims[2], 40u);
      EXPECT_EQ(q.dims[3], 3u);
      EXPECT_EQ(q.strides[0], 40u * 64 * 2);  // head
      EXPECT_EQ(q.strides[1], 64u * 2);       // row
      EXPECT_EQ(q.strides[2], 28u * 40 * 64 * 2);
      EXPECT_EQ(q.box[1], 7u);
      EXPECT_EQ(q.box[2], rows);
      EXPECT_EQ(q.box[3], 1u);
      EXPECT_FALSE(flag(c, "split_tail") || flag(c, "kv_multicast"));
    } else {
      EXPECT_EQ(q.dims[1], 40u);
      EXPECT_EQ(q.box[1], bm);
      if (!flag(c, "persistent")) {
        EXPECT_EQ(g.grid[1], 28u);
      }
    }
  }
  EXPECT_GT(packed, 0u);
  auto any_pack = [&](const char* spec) {
    bool any = false;
    space.for_each_valid(Problem::parse(spec), kArch, [&](const Config& c) { any = any || packs(c); });
    return any;
  };
  EXPECT_FALSE(any_pack("b=1,h=8,s=40,d=64,dtype=bf16,causal=1"));                      // no GQA
  EXPECT_TRUE(any_pack("b=1,h=64,hkv=8,s=8192,d=64,dtype=bf16,causal=1,sinks=1"));     // long sequences too
  EXPECT_TRUE(any_pack("b=4,h=32,hkv=8,s=40,sk=8192,d=128,dtype=bf16,causal=1,page=16"));
  EXPECT_TRUE(any_pack("b=4,h=32,hkv=8,s=4096,d=128,dtype=bf16,causal=1,varlen=1"));
  // Only the blocks that hold a row of every head (G = 128: 128 and 192), and never one consumer
  // warpgroup (its packed builds spilled).
  space.for_each_valid(Problem::parse("b=1,h=128,hkv=1,s=64,sk=4096,d=64,dtype=bf16,causal=1"), kArch,
                       [&](const Config& c) {
                         if (packs(c)) {
                           EXPECT_GE(num(c, "block_m"), 128) << config_str(c);
                         }
                       });
  EXPECT_FALSE(any_pack("b=1,h=256,hkv=1,s=64,sk=4096,d=64,dtype=bf16,causal=1"));
  // A packed build refuses a call whose query heads are not a multiple of its KV heads, or whose
  // group does not fit its block_m.
  const Config c = first_valid(space, p, [&](const Config& x) { return packs(x) && num(x, "block_m") == 128; });
  ASSERT_FALSE(c.empty());
  const RenderedKernel k = render_kernel(space, c, p, kArch);
  EXPECT_EQ(define_value(k.launch.defines, "PACK_GQA"), 1);
  attntune_plan::Call call = attntune::testing::dense_call_of(p);
  call.heads_q = 30;
  std::string why;
  EXPECT_FALSE(plan_call(k.launch, call, attntune::testing::FakeDevice{}.device(), &why));
  EXPECT_NE(why.find("a multiple of heads_kv"), std::string::npos) << why;
  call = attntune::testing::dense_call_of(Problem::parse("b=1,h=256,hkv=1,s=64,sk=4096,d=64,dtype=bf16,causal=1"));
  EXPECT_FALSE(plan_call(k.launch, call, attntune::testing::FakeDevice{}.device(), &why));
  EXPECT_NE(why.find("do not fit"), std::string::npos) << why;
}

// A config recorded before pack_gqa existed (no pack_gqa) renders as pack_gqa=false: the same source,
// and the warm starts find it.
TEST(FlashFwdWgmmaRender, AConfigWithoutPackGqaIsAnUnpackedBuild) {
  const SearchSpace space = load_space();
  const Problem p = Problem::parse("b=1,h=32,hkv=8,s=1000,d=128,dtype=bf16,causal=1");
  const Config c = first_valid(space, p, [](const Config& x) { return !flag(x, "pack_gqa"); });
  ASSERT_FALSE(c.empty());
  Config old = c;
  old.erase("pack_gqa");
  EXPECT_EQ(render_kernel(space, old, p, kArch).source_hash, render_kernel(space, c, p, kArch).source_hash);
  EXPECT_EQ(space.check(old, p, kArch), std::nullopt);
  const search::ValidConfigs valid(space, p, kArch);
  ASSERT_TRUE(valid.find(c));
  EXPECT_EQ(valid.find(old), valid.find(c));
}

// Packed builds at the register edges compile clean (no spills, no serialised wgmma): the dynamic
// tile counter's producer at 24 registers, three consumer warpgroups with sinks at d=64, a window
// over KV-cache pages, packed batches, and head dims of each swizzle span.
// FP8 caches (kv_dtype=fp8, issue 42): builds whose producer warpgroup converts the staged tiles
// compile clean at the edges: the converters' loop at the producer's 40 registers beside a persistent
// grid's tile counter and page lookups, packed tiles, three consumer warpgroups, each staging span
// (head dims 64: 64-byte rows, 96: 32-byte, 128 and 256: 128-byte), windows and sinks, both dtypes.
TEST(FlashFwdWgmmaBuild, Fp8CacheBuildsAreClean) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = load_space();
  EdgeJobs edge{space};
  auto add = [&](const char* spec, auto pred) { edge.add(spec, pred); };
  auto any = [](const Config&) { return true; };
  auto persistent = [](const Config& x) { return flag(x, "persistent"); };
  auto packed = [](const Config& x) { return flag(x, "pack_gqa") && flag(x, "persistent"); };
  auto three = [](const Config& x) { return num(x, "block_m") == 192; };
  add("b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=bf16,causal=1,page=16,kv_dtype=fp8", persistent);
  add("b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=fp16,causal=0,page=16,kv_dtype=fp8", packed);
  add("b=8,h=32,hkv=8,s=32,sk=8192,d=128,dtype=bf16,causal=1,page=16,kv_dtype=fp8", packed);
  add("b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=bf16,causal=1,page=16,kv_dtype=fp8", three);
  add("b=4,h=64,hkv=8,s=1024,sk=8192,d=64,dtype=bf16,causal=1,page=16,window=127,sinks=1,kv_dtype=fp8", persistent);
  add("b=4,h=32,hkv=8,s=1024,sk=8192,d=96,dtype=fp16,causal=1,page=16,kv_dtype=fp8", any);
  add("b=2,h=16,hkv=8,s=1024,sk=8192,d=256,dtype=bf16,causal=1,page=64,kv_dtype=fp8", any);
  expect_clean_builds(space, edge.jobs);
}

// The FP8 forward (dtype=fp8, issue 42): both GEMMs FP8 wgmma (k32), P to e4m3 fragments by quad
// shuffles, each tile's P.V in an accumulator of its own. Its builds at the register edges compile
// clean: the largest tiles est_regs admits at d=128 (two consumer warpgroups, 128x128), three consumer
// warpgroups at d=64, one at d=96 (32-byte rows), persistent grids with the split tail, multicast
// pairs and narrow first tiles, causal with the tile counter, windows and sinks.
TEST(FlashFwdWgmmaBuild, Fp8ForwardBuildsAreClean) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = load_space();
  EdgeJobs edge{space};
  auto add = [&](const char* spec, auto pred) { edge.add(spec, pred); };
  auto any = [](const Config&) { return true; };
  auto big = [](const Config& x) { return num(x, "block_m") == 128 && num(x, "block_n") == 128; };
  auto split = [](const Config& x) { return flag(x, "split_tail"); };
  auto pairs = [](const Config& x) { return flag(x, "kv_multicast") && num(x, "narrow_n") > 0; };
  auto persistent = [](const Config& x) { return flag(x, "persistent"); };
  auto three = [](const Config& x) { return num(x, "block_m") == 192; };
  auto one = [](const Config& x) { return num(x, "block_m") == 64; };
  add("b=1,h=16,s=16384,d=128,dtype=fp8,causal=0", big);
  add("b=1,h=16,s=16384,d=128,dtype=fp8,causal=0", split);
  add("b=1,h=16,s=16384,d=128,dtype=fp8,causal=0", pairs);
  add("b=1,h=16,s=16384,d=128,dtype=fp8,causal=1", persistent);
  add("b=2,h=32,hkv=8,s=8192,d=64,dtype=fp8,causal=1,window=127,sinks=1", three);
  add("b=2,h=32,s=4096,d=96,dtype=fp8,causal=0", one);
  add("b=2,h=32,s=4096,d=64,dtype=fp8,causal=0", any);
  expect_clean_builds(space, edge.jobs);
}

// The FP8 forward at d=256: P.V in column chunks (pv_chunks, pv_buffers). Its builds at the register
// edges compile clean: the widest tiles without the overlap in halves and in quarters, quarters with
// two accumulators, the overlap's widest (quarters, one accumulator, 128x64, on 240 registers and on
// 232), persistent grids with the split tail and multicast pairs, causal with the counter, windows
// and sinks.
TEST(FlashFwdWgmmaBuild, Fp8ForwardD256BuildsAreClean) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = load_space();
  std::vector<std::pair<Config, Problem>> jobs;
  auto add = [&](const char* spec, auto pred) {
    const Problem p = Problem::parse(spec);
    const Config c = last_valid(space, p, pred);
    ASSERT_FALSE(c.empty()) << spec;
    jobs.emplace_back(c, p);
  };
  auto chunking = [](std::int64_t chunks, std::int64_t buffers, bool overlap) {
    return [=](const Config& x) {
      return num(x, "pv_chunks") == chunks && num(x, "pv_buffers") == buffers && flag(x, "intra_wg_overlap") == overlap;
    };
  };
  const char* nc = "b=1,h=16,s=16384,d=256,dtype=fp8,causal=0";
  add(nc, chunking(2, 1, false));
  add(nc, chunking(4, 1, false));
  add(nc, chunking(4, 2, false));
  add(nc, chunking(4, 1, true));
  add(nc, [](const Config& x) { return flag(x, "intra_wg_overlap") && num(x, "producer_regs") == 40; });
  add(nc, [](const Config& x) { return flag(x, "split_tail") && !flag(x, "intra_wg_overlap"); });
  add(nc, [](const Config& x) { return flag(x, "kv_multicast") && num(x, "narrow_n") > 0 && flag(x, "ping_pong"); });
  add(nc, [](const Config& x) { return flag(x, "kv_multicast") && flag(x, "intra_wg_overlap"); });
  add("b=1,h=16,s=16384,d=256,dtype=fp8,causal=1", [](const Config& x) { return flag(x, "persistent"); });
  add("b=2,h=16,hkv=4,s=8192,d=256,dtype=fp8,causal=1,window=127,sinks=1",
      [](const Config& x) { return flag(x, "persistent") && flag(x, "intra_wg_overlap"); });
  expect_clean_builds(space, jobs);
}

// Every FP8 d=256 config of a problem, or a spread: ATTNTUNE_BUILD_SAMPLE per problem (default 4; 0
// builds all: 310 non-causal and 552 causal configs, ~6 min on two cores, how the space's d=256
// rules were checked, with the windowed and sinks problems' configs too).
TEST(FlashFwdWgmmaBuild, Fp8ForwardD256SpreadCompiles) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = load_space();
  const std::size_t n = attntune::testing::build_sample(4);
  std::vector<std::pair<Config, Problem>> jobs;
  for (const char* spec : {"b=1,h=16,s=16384,d=256,dtype=fp8,causal=0", "b=1,h=16,s=16384,d=256,dtype=fp8,causal=1"}) {
    const Problem p = Problem::parse(spec);
    for (const Config& c : spread(space.enumerate(p, kArch), n)) jobs.emplace_back(c, p);
  }
  expect_clean_builds(space, jobs);
}

// The FP8 forward is offered where its kernel is written: dense problems of head dims multiples of
// 32 up to 128 and 256, without a soft-cap, block_n a multiple of 32, no lazy rescale or GQA packing;
// the other families refuse dtype=fp8 by their dtype lists.
TEST(FlashFwdWgmmaSpace, ServesTheFp8ForwardWhereItIsWritten) {
  const SearchSpace space = load_space();
  const Problem p = Problem::parse("b=1,h=32,hkv=8,s=4096,d=128,dtype=fp8,causal=1");
  std::size_t n = 0;
  space.for_each_valid(p, kArch, [&](const Config& c) {
    ++n;
    EXPECT_EQ(num(c, "block_n") % 32, 0) << config_str(c);
    EXPECT_EQ(num(c, "lazy_rescale"), 0) << config_str(c);
    EXPECT_FALSE(flag(c, "pack_gqa")) << config_str(c);
  });
  EXPECT_GT(n, 0u);
  // (fold_fma and pv_chunks are the FP8 forward's alone: a config without them, so that the bf16 shape
  // below takes it too.)
  const Config c =
      last_valid(space, p, [](const Config& x) { return !flag(x, "fold_fma") && num(x, "pv_chunks") == 1; });
  const RenderedKernel k = render_kernel(space, c, p, kArch);
  EXPECT_NE(k.source.find("#define ATT_QKV_FP8 1\n"), std::string::npos);
  EXPECT_NE(k.source.find("#define ATT_DTYPE_BF16 1\n"), std::string::npos);  // O is bf16
  EXPECT_NE(k.source.find(", dtype=fp8, causal=1"), std::string::npos) << k.source.substr(0, 200);
  // The same shape in bf16 renders no FP8 define.
  const RenderedKernel plain =
      render_kernel(space, c, Problem::parse("b=1,h=32,hkv=8,s=4096,d=128,dtype=bf16,causal=1"), kArch);
  EXPECT_EQ(plain.source.find("#define ATT_QKV_FP8"), std::string::npos);
  for (const char* spec : {"b=1,h=16,s=4096,d=192,dtype=fp8,causal=0", "b=1,h=16,s=4096,d=80,dtype=fp8,causal=0",
                           "b=1,h=16,s=4096,d=256,dv=128,dtype=fp8,causal=0", "b=1,h=16,s=4096,d=224,dtype=fp8,causal=1",
                           "b=1,h=16,s=4096,d=128,dtype=fp8,causal=0,softcap=30"}) {
    const Problem q = Problem::parse(spec);
    EXPECT_THROW(space.check_problem(q, kArch), InputError) << spec;
  }
  const SearchSpace mma = SearchSpace::load(ATTNTUNE_SOURCE_DIR "/search_spaces/flash_fwd_mma.yaml");
  try {
    mma.check_problem(p, "sm_90");
    ADD_FAILURE() << "flash_fwd_mma served dtype=fp8";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("dtype=fp8"), std::string::npos) << e.what();
  }
}

// The FP8 forward at d=256 runs P.V in column chunks, one chunk's accumulator (or two) beside O: the
// space offers it with two consumer warpgroups and a producer, in halves or quarters (two
// accumulators for quarters only) up to 128x160, the overlap in quarters with one accumulator at
// 128x64 (its S, P, chunk and O live together) and without fa4_loop; at d=128 past key tiles of 128
// (below); nowhere else (16-bit problems, FP8 below d=128: their configs as before, pv_chunks 1). A config recorded before the tunables existed renders as
// pv_chunks=1, pv_buffers=1.
TEST(FlashFwdWgmmaSpace, ServesTheFp8ForwardAtD256InColumnChunks) {
  const SearchSpace space = load_space();
  for (const char* spec : {"b=1,h=16,s=16384,d=256,dtype=fp8,causal=0", "b=2,h=16,hkv=2,s=4096,d=256,dtype=fp8,causal=1",
                           "b=2,h=8,s=3000,d=256,dtype=fp8,causal=1,window=255,sinks=1"}) {
    std::set<std::tuple<std::int64_t, std::int64_t, bool>> chunkings;
    std::int64_t widest = 0, widest_overlap = 0;
    std::size_t n = 0;
    space.for_each_valid(Problem::parse(spec), kArch, [&](const Config& c) {
      ++n;
      EXPECT_EQ(num(c, "block_m"), 128) << config_str(c);
      EXPECT_TRUE(flag(c, "warp_specialize")) << config_str(c);
      EXPECT_FALSE(flag(c, "fa4_loop")) << config_str(c);
      EXPECT_EQ(num(c, "exp2_emu"), 0) << config_str(c);
      chunkings.insert({num(c, "pv_chunks"), num(c, "pv_buffers"), flag(c, "intra_wg_overlap")});
      (flag(c, "intra_wg_overlap") ? widest_overlap : widest) =
          std::max(flag(c, "intra_wg_overlap") ? widest_overlap : widest, num(c, "block_n"));
    });
    EXPECT_GT(n, 100u) << spec;
    const std::set<std::tuple<std::int64_t, std::int64_t, bool>> want = {
        {2, 1, false}, {4, 1, false}, {4, 2, false}, {4, 1, true}};
    EXPECT_EQ(chunkings, want) << spec;
    EXPECT_EQ(widest, 160) << spec;
    EXPECT_EQ(widest_overlap, 64) << spec;
  }
  // At d=128 chunks only past key tiles of 128 (a whole tile's accumulator fits up to 128), with two
  // consumer warpgroups beside a producer, and not with fa4_loop (run 338); multicast pairs with a
  // producer of 40 registers (on 24 it spilled: at 256 and, in the plain schedule, at 160-224), and exp2 on the FMA pipe there
  // with k_perm and wg_uniform (but fold_fma) with one of 24 (on 40 it spilled).
  {
    const char* spec = "b=1,h=16,s=16384,d=128,dtype=fp8,causal=0";
    std::size_t chunked = 0;
    space.for_each_valid(Problem::parse(spec), kArch, [&](const Config& c) {
      if (num(c, "pv_chunks") == 1) return;
      ++chunked;
      EXPECT_GT(num(c, "block_n"), 128) << config_str(c);
      EXPECT_EQ(num(c, "block_m"), 128) << config_str(c);
      EXPECT_TRUE(flag(c, "warp_specialize")) << config_str(c);
      EXPECT_FALSE(flag(c, "fa4_loop")) << config_str(c);
      if (flag(c, "kv_multicast")) { EXPECT_EQ(num(c, "producer_regs"), 40) << config_str(c); }
      if (num(c, "exp2_emu") > 0 && num(c, "block_n") == 256 && flag(c, "k_perm") && flag(c, "wg_uniform") &&
          !flag(c, "fold_fma")) {
        EXPECT_EQ(num(c, "producer_regs"), 24) << config_str(c);
      }
    });
    EXPECT_GT(chunked, 100u) << spec;
  }
  for (const char* spec : {"b=1,h=16,s=4096,d=256,dtype=bf16,causal=1", "b=1,h=16,s=4096,d=64,dtype=fp8,causal=1"}) {
    std::size_t n = 0;
    space.for_each_valid(Problem::parse(spec), kArch, [&](const Config& c) {
      ++n;
      EXPECT_EQ(num(c, "pv_chunks"), 1) << spec << ": " << config_str(c);
      EXPECT_EQ(num(c, "pv_buffers"), 1) << spec << ": " << config_str(c);
    });
    EXPECT_GT(n, 0u) << spec;
  }
  const Problem p = Problem::parse("b=1,h=16,s=16384,d=256,dtype=fp8,causal=0");
  const Config c = last_valid(space, p, [](const Config& x) { return num(x, "pv_buffers") == 2; });
  ASSERT_FALSE(c.empty());
  const RenderedKernel k = render_kernel(space, c, p, kArch);
  EXPECT_NE(k.source.find("#define PV_CHUNKS 4\n"), std::string::npos);
  EXPECT_NE(k.source.find("#define PV_BUFFERS 2\n"), std::string::npos);
  const Problem q = Problem::parse("b=1,h=16,s=16384,d=128,dtype=fp8,causal=0");
  const Config one = last_valid(space, q, [](const Config& x) { return num(x, "pv_chunks") == 1; });
  ASSERT_FALSE(one.empty());
  Config old = one;
  old.erase("pv_chunks");
  old.erase("pv_buffers");
  EXPECT_EQ(render_kernel(space, old, q, kArch).source_hash, render_kernel(space, one, q, kArch).source_hash);
  EXPECT_EQ(space.check(old, q, kArch), std::nullopt);
}

// fa4_loop (FlashAttention-4's loop shape: unmasked tiles in a loop of their own, the row sum from
// l * factor) reshapes the overlapped schedule only: offered with intra_wg_overlap, both ways.
TEST(FlashFwdWgmmaSpace, Fa4LoopIsOfferedWithTheOverlapOnly) {
  const SearchSpace space = load_space();
  for (const char* spec : {"b=1,h=128,s=8192,d=192,dv=128,dtype=bf16,causal=1", "b=4,h=20,s=1000,d=64,dtype=bf16,causal=0",
                           "b=4,h=8,s=2048,d=128,dtype=bf16,causal=1,window=127"}) {
    std::set<bool> with_overlap, without;
    space.for_each_valid(Problem::parse(spec), kArch, [&](const Config& c) {
      (flag(c, "intra_wg_overlap") ? with_overlap : without).insert(flag(c, "fa4_loop"));
    });
    EXPECT_EQ(with_overlap, (std::set<bool>{false, true})) << spec;
    EXPECT_EQ(without, (std::set<bool>{false})) << spec;
  }
}

// fa4_loop's second copy of the step needs registers past est_regs, and over KV-cache pages a
// persistent grid needs the producer's 40 (the space's whys: ptxas spilled there, 2026-11-30). The
// H200 property test's spilling config (36 bytes, fa4_loop or not) and the edge tiles that spilled
// with fa4_loop only are refused with it and kept without it; the H200's measured picks with
// registers to spare (and the FP8 forward's 128x128) keep it.
TEST(FlashFwdWgmmaSpace, Fa4LoopLeavesTheRegisterEdgeAndThePagedProducer) {
  const SearchSpace space = load_space();
  const std::string plain = "exp2_emu=0,kv_multicast=false,lazy_rescale=0,softcap_tanh=accurate,split_tail=false,warp_specialize=true";
  const auto why = [&](const std::string& spec, bool fa4, const char* problem) {
    return space.check(space.parse_config(fmt::format("{},{},fa4_loop={}", spec, plain, fa4)), Problem::parse(problem), kArch);
  };
  struct Case {
    std::string spec;
    const char* problem;
    const char* refused;  // nullptr: fa4_loop kept
    const char* refused_plain = nullptr;  // without fa4_loop; nullptr: kept
  };
  const Case cases[] = {
      // FlashFwdWgmmaProperty.Fa4Loop's kvcache entry point on the H200: 36 bytes, fa4_loop or not
      // (since 2026-12-01 every causal persistent grid over pages takes 40 producer registers).
      {"block_m=64,block_n=64,head_group=1,intra_wg_overlap=true,narrow_n=0,pack_gqa=false,persistent=true,"
       "ping_pong=false,producer_regs=24,stages=2",
       "b=4,h=8,s=512,sk=4096,d=128,dtype=bf16,causal=1,page=64", "producer", "persistent grid over KV-cache pages"},
      // d=128 64x192 (100 bytes with fa4_loop, none without) and the MLA prefill pick (80 bytes).
      {"block_m=64,block_n=192,head_group=1,intra_wg_overlap=true,narrow_n=0,pack_gqa=false,persistent=false,"
       "ping_pong=false,producer_regs=24,stages=2",
       "b=4,h=8,s=2048,d=128,dtype=bf16,causal=1", "fa4_loop's second copy"},
      {"block_m=192,block_n=80,head_group=4,intra_wg_overlap=true,narrow_n=0,pack_gqa=false,persistent=true,"
       "ping_pong=true,producer_regs=24,stages=2",
       "b=1,h=128,s=8192,d=192,dv=128,dtype=bf16,causal=1", "fa4_loop's second copy"},
      // Measured on the H200 with and without fa4_loop: MLA prefill's 128x128, the d=64 ring of three,
      // gpt-oss-like sinks, the FP8 forward.
      {"block_m=128,block_n=128,head_group=4,intra_wg_overlap=true,narrow_n=0,pack_gqa=false,persistent=true,"
       "ping_pong=false,producer_regs=24,stages=2",
       "b=1,h=128,s=8192,d=192,dv=128,dtype=bf16,causal=1", nullptr},
      {"block_m=192,block_n=128,head_group=4,intra_wg_overlap=true,narrow_n=64,pack_gqa=false,persistent=true,"
       "ping_pong=true,producer_regs=24,stages=2",
       "b=4,h=16,s=4096,d=64,dtype=bf16,causal=1", nullptr},
      {"block_m=192,block_n=112,head_group=4,intra_wg_overlap=true,narrow_n=64,pack_gqa=false,persistent=true,"
       "ping_pong=true,producer_regs=24,stages=2",
       "b=1,h=64,hkv=8,s=8192,d=64,dtype=bf16,causal=1,sinks=1", nullptr},
      {"block_m=128,block_n=128,head_group=1,intra_wg_overlap=true,narrow_n=0,pack_gqa=false,persistent=true,"
       "ping_pong=false,producer_regs=24,stages=2",
       "b=1,h=16,s=16384,d=128,dtype=fp8,causal=0", nullptr},
  };
  // d=256 with a soft-cap: spilled with up to 24 registers to spare, so not offered.
  std::size_t capped256 = 0;
  space.for_each_valid(Problem::parse("b=2,h=16,hkv=8,s=2048,d=256,dtype=bf16,causal=1,softcap=50"), kArch,
                       [&](const Config& c) { capped256 += flag(c, "fa4_loop"); });
  EXPECT_EQ(capped256, 0u);
  for (const Case& k : cases) {
    SCOPED_TRACE(fmt::format("{} on {}", k.spec, k.problem));
    const std::optional<std::string> plain_why = why(k.spec, false, k.problem);
    if (!k.refused_plain) {
      EXPECT_EQ(plain_why, std::nullopt);
    } else {
      ASSERT_TRUE(plain_why.has_value());
      EXPECT_NE(plain_why->find(k.refused_plain), std::string::npos) << *plain_why;
    }
    const std::optional<std::string> fa4 = why(k.spec, true, k.problem);
    if (!k.refused) {
      EXPECT_EQ(fa4, std::nullopt);
    } else {
      ASSERT_TRUE(fa4.has_value());
      EXPECT_NE(fa4->find(k.refused), std::string::npos) << *fa4;
    }
  }
  // With multicast pairs and wg_uniform at d >= 128 on 40 producer registers (on 24 it spilled).
  for (const char* spec : {"b=2,h=16,s=4096,d=128,dtype=bf16,causal=0", "b=2,h=16,s=4096,d=192,dv=128,dtype=bf16,causal=0"})
    space.for_each_valid(Problem::parse(spec), kArch, [&](const Config& c) {
      if (flag(c, "fa4_loop") && flag(c, "kv_multicast") && flag(c, "wg_uniform")) {
        EXPECT_EQ(num(c, "producer_regs"), 40) << spec << ": " << config_str(c);
      }
    });
}

// fa4_loop's builds on every entry point and variant (its three loops: the masked front, the
// unmasked middle, a window's masked left edge) build without spills or serialised wgmma.
TEST(FlashFwdWgmmaBuild, Fa4LoopBuildsAreClean) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = load_space();
  EdgeJobs edge{space, "fa4_loop"};
  auto add = [&](const char* spec, auto pred) { edge.add(spec, pred); };
  auto any = [](const Config&) { return true; };
  auto fa4_tile = [](const Config& x) {
    return num(x, "block_m") == 128 && num(x, "block_n") == 128 && !flag(x, "ping_pong") && flag(x, "persistent");
  };
  auto ring = [](const Config& x) { return num(x, "block_m") == 192 && flag(x, "ping_pong"); };
  add("b=1,h=128,s=8192,d=192,dv=128,dtype=bf16,causal=1", fa4_tile);
  add("b=1,h=128,s=8192,d=192,dv=128,dtype=bf16,causal=1", ring);
  add("b=1,h=28,hkv=4,s=6000,d=128,dtype=bf16,causal=1", fa4_tile);
  add("b=4,h=20,s=1000,d=64,dtype=bf16,causal=0", ring);
  add("b=1,h=32,hkv=8,s=16384,d=128,dtype=bf16,causal=1,window=4095", any);
  add("b=4,h=8,s=2048,d=128,dtype=bf16,causal=0,window=127,sinks=1", any);
  add("b=8,h=32,hkv=8,s=32,sk=8192,d=128,dtype=bf16,causal=1,page=16,window=127,sinks=1", any);
  add("b=4,h=32,hkv=8,s=1024,d=128,dtype=bf16,causal=1,varlen=1", [](const Config& x) { return flag(x, "pack_gqa"); });
  // d=256: block_n 64 (32 registers to spare; with a soft-cap none: the space's why).
  add("b=2,h=16,hkv=8,s=2048,d=256,dtype=bf16,causal=1,sinks=1", any);
  add("b=1,h=16,s=16384,d=128,dtype=fp8,causal=1", any);
  expect_clean_builds(space, edge.jobs);
}

TEST(FlashFwdWgmmaBuild, PackedBuildsAreClean) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = load_space();
  EdgeJobs edge{space, "pack_gqa"};
  auto add = [&](const char* spec, auto pred) { edge.add(spec, pred); };
  auto any = [](const Config&) { return true; };
  auto ring = [](const Config& x) {
    return num(x, "block_m") == 192 && flag(x, "persistent") && flag(x, "ping_pong") && flag(x, "intra_wg_overlap") &&
           num(x, "producer_regs") == 24;
  };
  add("b=1,h=64,hkv=8,s=8192,d=64,dtype=bf16,causal=1,sinks=1", ring);
  add("b=1,h=32,hkv=8,s=16384,d=128,dtype=bf16,causal=1,window=4095", [](const Config& x) {
    return flag(x, "persistent") && num(x, "producer_regs") == 24;
  });
  add("b=8,h=32,hkv=8,s=32,sk=8192,d=128,dtype=bf16,causal=1,page=16,window=127,sinks=1", any);
  add("b=4,h=32,hkv=8,s=1024,d=128,dtype=bf16,causal=1,varlen=1", [](const Config& x) { return flag(x, "persistent"); });
  add("b=4,h=40,hkv=8,s=1000,d=96,dtype=fp16,causal=0", any);
  add("b=4,h=28,hkv=4,s=100,sk=4096,d=80,dtype=bf16,causal=1,softcap=30", any);
  add("b=2,h=16,hkv=8,s=2048,d=256,dtype=bf16,causal=1,softcap=50,sinks=1", any);
  expect_clean_builds(space, edge.jobs);
}

// wg_uniform (the consumer warpgroup's index broadcast from lane 0) is offered where there are two or
// more consumer warpgroups: with one, the index is the constant 0 and the build is the same kernel.
TEST(FlashFwdWgmmaSpace, WgUniformNeedsTwoOrMoreConsumerWarpgroups) {
  const SearchSpace space = load_space();
  for (const char* spec : {"b=1,h=28,hkv=4,s=6000,d=128,dtype=bf16,causal=1", "b=4,h=20,s=1000,d=64,dtype=bf16,causal=0",
                           "b=1,h=16,s=16384,d=128,dtype=fp8,causal=0"}) {
    std::map<std::int64_t, std::set<bool>> by_rows;
    space.for_each_valid(Problem::parse(spec), kArch,
                         [&](const Config& c) { by_rows[num(c, "block_m")].insert(flag(c, "wg_uniform")); });
    for (const auto& [rows, values] : by_rows)
      EXPECT_EQ(values, rows == 64 ? std::set<bool>{false} : (std::set<bool>{false, true})) << spec << " block_m " << rows;
    EXPECT_GE(by_rows.size(), 2u) << spec;
  }
}

// wg_uniform's builds: each measured pick's tile with and without it builds clean (no spills, no
// serialised wgmma); without it Q's descriptors are moved from vector registers between the Q.K^T
// wgmmas (8 R2UR a tile at d=64 and FP8, 16 at d=128: ptxas cannot see that the warpgroup index is
// warp-uniform), with it none (their descriptors stay in uniform registers). The SASS half
// needs cuobjdump (tools/test.sh's .venv has triton's), and skips, saying so, without one.
TEST(FlashFwdWgmmaBuild, WgUniformKeepsQsDescriptorsInUniformRegisters) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = load_space();
  const std::string rest = "exp2_emu=0,kv_multicast=false,softcap_tanh=accurate,split_tail=false,warp_specialize=true,"
                           "pv_buffers=1,pv_chunks=1,lazy_rescale=0,producer_regs=24,intra_wg_overlap=true,persistent=true";
  const std::vector<std::pair<std::string, std::string>> picks = {
      // runs 289-290's picks: u-q28-6k (no fa4_loop), u-40-32k, u-20-12k (three warpgroups, d=64); FA4's tile
      // on u-q28-chunk (run 292); the FP8 forward's d=128 pick (run 274)
      {"b=1,h=28,hkv=4,s=6000,sk=6000,d=128,dtype=bf16,causal=1",
       "block_m=128,block_n=192,fa4_loop=false,head_group=16,narrow_n=64,pack_gqa=false,ping_pong=true,stages=2"},
      {"b=1,h=40,hkv=8,s=32768,sk=32768,d=128,dtype=bf16,causal=1",
       "block_m=128,block_n=176,fa4_loop=true,head_group=1,narrow_n=64,pack_gqa=false,ping_pong=false,stages=2"},
      {"b=1,h=20,hkv=20,s=12000,sk=12000,d=64,dtype=bf16,causal=1",
       "block_m=192,block_n=128,fa4_loop=true,head_group=4,narrow_n=64,pack_gqa=false,ping_pong=true,stages=3"},
      {"b=1,h=28,hkv=4,s=1536,sk=9728,d=128,dtype=bf16,causal=1",
       "block_m=128,block_n=128,fa4_loop=true,head_group=1,narrow_n=0,pack_gqa=true,ping_pong=false,stages=2"},
      {"b=1,h=16,s=16384,d=128,dtype=fp8,causal=0",
       "block_m=128,block_n=128,fa4_loop=true,head_group=1,narrow_n=0,pack_gqa=false,ping_pong=false,stages=2"},
  };
  std::vector<std::pair<std::string, std::string>> jobs;
  for (const auto& [spec, cfg] : picks) jobs.emplace_back(spec, rest + "," + cfg);
  const auto counts = attntune::testing::sass_counts_off_and_on(space, kArch, jobs, "wg_uniform",
                                                                "R2UR between the wgmmas",
                                                                attntune::testing::r2ur_in_wgmma_batches);
  if (!counts) GTEST_SKIP() << attntune::testing::kNoSassHalf;
  for (const auto& [name, n] : *counts) {
    EXPECT_GE(n.first, 8) << "without wg_uniform, descriptors moved between the wgmmas: " << name;
    EXPECT_EQ(n.second, 0) << "with wg_uniform: " << name;
  }
}

// mask_bits is offered where some tile is masked: the causal diagonal, a window's edges, sequences
// that end inside a tile (packed batches, KV caches, seqlen_k not a multiple of block_n), never with
// k_perm (its tiles' keys are permuted).
TEST(FlashFwdWgmmaSpace, MaskBitsWhereSomeTileIsMasked) {
  const SearchSpace space = load_space();
  const auto offered = [&](const char* spec) {
    std::map<std::string, std::set<bool>> by;  // "block_n k_perm" -> mask_bits values
    space.for_each_valid(Problem::parse(spec), kArch, [&](const Config& c) {
      by[fmt::format("{} {}", num(c, "block_n"), flag(c, "k_perm"))].insert(flag(c, "mask_bits"));
    });
    return by;
  };
  const std::set<bool> both{false, true}, off{false};
  for (const char* spec : {"b=1,h=28,hkv=4,s=1536,sk=9728,d=128,dtype=bf16,causal=1",
                           "b=1,h=32,hkv=8,s=16384,d=128,dtype=bf16,causal=0,window=4095",
                           "b=4,h=8,s=1024,d=128,dtype=bf16,causal=0,varlen=1",
                           "b=4,h=8,s=512,sk=4096,d=128,dtype=bf16,causal=0,page=64"}) {
    const auto by = offered(spec);
    ASSERT_FALSE(by.empty()) << spec;
    for (const auto& [tile, values] : by) EXPECT_EQ(values, both) << spec << " block_n k_perm " << tile;
  }
  // Dense, non-causal, no window: where block_n divides seqlen_k no tile is masked.
  for (const auto& [tile, values] : offered("b=4,h=16,s=4096,d=128,dtype=bf16,causal=0")) {
    const int block_n = std::stoi(tile);
    EXPECT_EQ(values, 4096 % block_n == 0 ? off : both) << "block_n " << block_n;
  }
  // The FP8 forward: k_perm's configs keep the compares.
  std::set<bool> kperm_values;
  for (const auto& [tile, values] : offered("b=1,h=16,s=16384,d=128,dtype=fp8,causal=1"))
    if (tile.ends_with(" true")) kperm_values.insert(values.begin(), values.end());
  EXPECT_EQ(kperm_values, off);
}

// mask_bits' builds: the masked loops test each key's bit of a word (R2P sets seven predicates an
// instruction), where each score had a compare (ISETP) and each key pair an IADD3 for its index:
// measured picks and windows build clean either way, with R2P only with it and at least 40 ISETP
// fewer a build (NVRTC, CUDA 13.0: the u-q28-chunk pick's masked loop 770 -> 705 instructions,
// 2026-12-07). The FP8 forward's 256-key tile (32 column pairs: the word's every bit) included. The
// SASS half needs cuobjdump, and skips, saying so, without one.
TEST(FlashFwdWgmmaBuild, MaskBitsMasksWithR2P) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = load_space();
  const std::string rest = "exp2_emu=0,kv_multicast=false,softcap_tanh=accurate,split_tail=false,warp_specialize=true,"
                           "lazy_rescale=0,producer_regs=24,intra_wg_overlap=true,persistent=true,wg_uniform=true";
  const std::vector<std::pair<std::string, std::string>> jobs = {
      // the H100 shipped pick of the chunked neighbour of u-q28-chunk; u-20-12k's d=64 tile (three
      // warpgroups); a Mistral-like window; d=256 causal; the FP8 forward's 128x256 in quarters
      {"b=1,h=28,hkv=4,s=1536,sk=9728,d=128,dtype=bf16,causal=1",
       rest + ",block_m=128,block_n=160,fa4_loop=true,head_group=1,narrow_n=64,pack_gqa=true,ping_pong=false,stages=2"},
      {"b=1,h=20,hkv=20,s=12000,sk=12000,d=64,dtype=bf16,causal=1",
       rest + ",block_m=192,block_n=128,fa4_loop=true,head_group=4,narrow_n=64,pack_gqa=false,ping_pong=true,stages=3"},
      {"b=1,h=32,hkv=8,s=16384,sk=16384,d=128,dtype=bf16,causal=1,window=4095",
       rest + ",block_m=128,block_n=128,fa4_loop=true,head_group=1,narrow_n=0,pack_gqa=false,ping_pong=false,stages=2"},
      {"b=1,h=16,s=8192,d=256,dtype=bf16,causal=1",
       rest + ",block_m=128,block_n=80,fa4_loop=false,head_group=1,narrow_n=0,pack_gqa=false,ping_pong=true,stages=2"},
      {"b=1,h=16,s=16384,d=128,dtype=fp8,causal=1",
       "exp2_emu=0,kv_multicast=false,softcap_tanh=accurate,split_tail=false,warp_specialize=true,lazy_rescale=0,"
       "producer_regs=24,intra_wg_overlap=false,persistent=true,wg_uniform=false,block_m=128,block_n=256,"
       "fa4_loop=false,head_group=1,narrow_n=0,pack_gqa=false,ping_pong=false,stages=2,pv_chunks=4,pv_buffers=2,"
       "fold_fma=true"},
  };
  const auto cubins = attntune::testing::clean_builds_off_and_on(space, kArch, jobs, "mask_bits");
  EXPECT_EQ(cubins.size(), jobs.size());
  const std::string cuobjdump = attntune::testing::find_cuobjdump();
  if (cuobjdump.empty()) GTEST_SKIP() << attntune::testing::kNoSassHalf;
  for (const auto& [name, by] : cubins) {
    const auto count = [&](bool on, const char* op) {
      return attntune::testing::sass_op_count(cuobjdump, by.at(on), op);
    };
    const int r2p_off = count(false, "R2P"), r2p_on = count(true, "R2P");
    const int isetp_off = count(false, "ISETP"), isetp_on = count(true, "ISETP");
    std::printf("%s: R2P %d -> %d, ISETP %d -> %d\n", name.c_str(), r2p_off, r2p_on, isetp_off, isetp_on);
    EXPECT_EQ(r2p_off, 0) << "without mask_bits: " << name;
    EXPECT_GE(r2p_on, 4) << "with mask_bits, the masks' words as predicates: " << name;
    EXPECT_LE(isetp_on + 40, isetp_off) << "a compare a score left: " << name;
  }
}

// fold_fma is the FP8 forward's, with its tile accumulator whole or in column chunks (pv_chunks): never
// a 16-bit problem's (its P.V adds into O in the tensor cores); both values at d=64, 128 and 256, and
// at d=128 and 256 with chunks too.
TEST(FlashFwdWgmmaSpace, FoldFmaIsTheFp8Forwards) {
  const SearchSpace space = load_space();
  const auto values = [&](const char* spec, bool chunked) {
    std::set<bool> v;
    space.for_each_valid(Problem::parse(spec), kArch, [&](const Config& c) {
      if ((num(c, "pv_chunks") > 1) == chunked) v.insert(flag(c, "fold_fma"));
    });
    return v;
  };
  EXPECT_EQ(values("b=1,h=16,s=16384,d=128,dtype=fp8,causal=0", false), (std::set<bool>{false, true}));
  EXPECT_EQ(values("b=1,h=16,s=16384,d=128,dtype=fp8,causal=0", true), (std::set<bool>{false, true}));
  EXPECT_EQ(values("b=1,h=16,s=4096,d=64,dtype=fp8,causal=1", false), (std::set<bool>{false, true}));
  EXPECT_EQ(values("b=1,h=16,s=16384,d=256,dtype=fp8,causal=0", true), (std::set<bool>{false, true}));
  EXPECT_EQ(values("b=1,h=28,hkv=4,s=6000,d=128,dtype=bf16,causal=1", false), std::set<bool>{false});
  EXPECT_EQ(values("b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=bf16,causal=1,page=64,kv_dtype=fp8", false),
            std::set<bool>{false});
}

// fold_fma's builds: the FP8 forward's d=128 picks (the overlapped schedule with a whole tile's
// accumulator; 128x256 in quarters, two buffers, ping-pong), its plain and ping-pong forms and
// d=256's pick (128x160 in halves) build clean either way, and with it O's rescale is gone from the
// loops as FMULs: at least dv / 2 fewer a build (the elements of O a thread, one loop copy at least),
// the addition now an FFMA. The SASS half needs cuobjdump, and skips, saying so, without one.
TEST(FlashFwdWgmmaBuild, FoldFmaJoinsOsRescaleToTheTileAddition) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = load_space();
  const std::string rest = "exp2_emu=0,kv_multicast=false,softcap_tanh=accurate,split_tail=false,warp_specialize=true,"
                           "lazy_rescale=0,producer_regs=24,persistent=true,head_group=1,"
                           "pack_gqa=false,wg_uniform=true,block_m=128";
  const std::string whole = "pv_buffers=1,pv_chunks=1,stages=2,";
  struct Pick {
    std::string spec, cfg;
    int fewer;  // FMULs at least fewer with fold_fma
  };
  const std::vector<Pick> picks = {
      {"b=1,h=16,s=16384,d=128,dtype=fp8,causal=0",
       whole + "intra_wg_overlap=true,block_n=128,fa4_loop=true,narrow_n=0,ping_pong=false", 64},
      {"b=1,h=16,s=16384,d=128,dtype=fp8,causal=1",
       whole + "intra_wg_overlap=false,block_n=128,fa4_loop=false,narrow_n=0,ping_pong=true", 64},
      {"b=1,h=16,s=16384,d=128,dtype=fp8,causal=1",
       whole + "intra_wg_overlap=true,block_n=96,fa4_loop=false,narrow_n=64,ping_pong=true", 64},
      {"b=1,h=16,s=16384,d=128,dtype=fp8,causal=0",
       "pv_buffers=2,pv_chunks=4,stages=3,k_perm=true,intra_wg_overlap=false,block_n=256,fa4_loop=false,narrow_n=0,"
       "ping_pong=true",
       64},
      {"b=1,h=16,s=16384,d=256,dtype=fp8,causal=0",
       "pv_buffers=1,pv_chunks=2,stages=2,intra_wg_overlap=false,block_n=160,fa4_loop=false,narrow_n=0,ping_pong=true",
       128},
  };
  std::vector<std::pair<std::string, std::string>> jobs;
  for (const Pick& pk : picks) jobs.emplace_back(pk.spec, rest + "," + pk.cfg);
  const auto counts = attntune::testing::sass_counts_off_and_on(
      space, kArch, jobs, "fold_fma", "FMUL",
      [](const std::string& cuobjdump, const std::string& cubin) { return attntune::testing::sass_op_count(cuobjdump, cubin, "FMUL"); });
  if (!counts) GTEST_SKIP() << attntune::testing::kNoSassHalf;
  for (const Pick& pk : picks) {
    const std::string name = pk.spec + " " + rest + "," + pk.cfg;
    const auto& [off, on] = counts->at(name);
    EXPECT_GE(off - on, pk.fewer) << "fold_fma's builds keep O's rescale as FMULs: " << name;
  }
}


// pp_pv is a tunable of the plain schedule with ping-pong (the overlapped schedule's turn already holds
// P.V and the next Q.K^T): both values there, at 16 bits and in the FP8 forward whole or chunked; only
// false without ping-pong or with the overlap.
TEST(FlashFwdWgmmaSpace, PpPvIsThePlainSchedulesPingPongTurn) {
  const SearchSpace space = load_space();
  const auto values = [&](const char* spec, const std::function<bool(const Config&)>& which) {
    std::set<bool> v;
    space.for_each_valid(Problem::parse(spec), kArch, [&](const Config& c) {
      if (which(c)) v.insert(flag(c, "pp_pv"));
    });
    return v;
  };
  const auto plain_pp = [](const Config& c) { return flag(c, "ping_pong") && !flag(c, "intra_wg_overlap"); };
  const auto other = [](const Config& c) { return !flag(c, "ping_pong") || flag(c, "intra_wg_overlap"); };
  for (const char* spec : {"b=1,h=16,s=16384,d=128,dtype=bf16,causal=0", "b=1,h=16,s=4096,d=64,dtype=fp16,causal=1",
                           "b=1,h=16,s=16384,d=256,dtype=fp8,causal=0", "b=1,h=16,s=16384,d=128,dtype=fp8,causal=1",
                           "b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=bf16,causal=1,page=64"}) {
    EXPECT_EQ(values(spec, plain_pp), (std::set<bool>{false, true})) << spec;
    EXPECT_EQ(values(spec, other), std::set<bool>{false}) << spec;
  }
  EXPECT_EQ(values("b=1,h=16,s=16384,d=128,dtype=fp8,causal=0",
                   [&](const Config& c) { return plain_pp(c) && num(c, "pv_chunks") == 4; }),
            (std::set<bool>{false, true}));
  // Its spilling corners (ptxas, 2026-12-03): a narrow first tile with the split tail on the 24-register
  // producer, and at d=128 chunked key tiles of 224 with exp2 on the FMA pipe, k_perm and wg_uniform
  // on 40 without fold_fma.
  space.for_each_valid(Problem::parse("b=2,h=16,s=4096,d=128,dtype=bf16,causal=0"), kArch, [&](const Config& c) {
    if (flag(c, "pp_pv") && num(c, "narrow_n") > 0 && flag(c, "split_tail")) {
      EXPECT_EQ(num(c, "producer_regs"), 40) << config_str(c);
    }
  });
  space.for_each_valid(Problem::parse("b=1,h=16,s=16384,d=128,dtype=fp8,causal=0"), kArch, [&](const Config& c) {
    EXPECT_FALSE(flag(c, "pp_pv") && num(c, "pv_chunks") > 1 && num(c, "block_n") == 224 && num(c, "exp2_emu") > 0 &&
                 flag(c, "k_perm") && flag(c, "wg_uniform") && num(c, "producer_regs") == 40 && !flag(c, "fold_fma"))
        << config_str(c);
  });
}

// pp_pv's builds: bf16 d=128 and d=64 (three warpgroups), the FP8 forward's d=128 picks (a whole tile,
// and 128x256 in quarters with two buffers) and d=256's (128x160 in halves) build clean both ways, and
// with it the turn is handed on while Q.K^T is in flight (a BAR.ARV between a wgmma batch's commit and
// its wait: every loop copy has one), which without it comes after the wait (none in flight). The SASS
// half needs cuobjdump, and skips, saying so, without one.
TEST(FlashFwdWgmmaBuild, PpPvPassesTheTurnOnUnderQk) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = load_space();
  const std::string rest = "exp2_emu=0,kv_multicast=false,softcap_tanh=accurate,split_tail=false,warp_specialize=true,"
                           "lazy_rescale=0,producer_regs=24,persistent=true,head_group=1,pack_gqa=false,wg_uniform=true,"
                           "intra_wg_overlap=false,ping_pong=true,fa4_loop=false,k_perm=false,";
  const std::string whole = "pv_buffers=1,pv_chunks=1,fold_fma=false,";
  const std::vector<std::pair<std::string, std::string>> jobs = {
      {"b=1,h=16,s=16384,d=128,dtype=bf16,causal=0", whole + "block_m=128,block_n=128,stages=2,narrow_n=0"},
      {"b=1,h=16,s=4096,d=64,dtype=bf16,causal=1", whole + "block_m=192,block_n=128,stages=2,narrow_n=0"},
      {"b=1,h=16,s=16384,d=128,dtype=fp8,causal=1", whole + "block_m=128,block_n=128,stages=2,narrow_n=0"},
      {"b=1,h=16,s=16384,d=128,dtype=fp8,causal=0",
       "pv_buffers=2,pv_chunks=4,fold_fma=true,block_m=128,block_n=256,stages=3,narrow_n=0"},
      {"b=1,h=16,s=16384,d=256,dtype=fp8,causal=0",
       "pv_buffers=1,pv_chunks=2,fold_fma=true,block_m=128,block_n=160,stages=2,narrow_n=0"},
  };
  std::vector<std::pair<std::string, std::string>> full;
  for (const auto& [spec, cfg] : jobs) full.emplace_back(spec, rest + cfg);
  const auto counts = attntune::testing::sass_counts_off_and_on(space, kArch, full, "pp_pv", "BAR.ARV under a wgmma",
                                                                attntune::testing::bar_arrives_under_wgmma);
  if (!counts) GTEST_SKIP() << attntune::testing::kNoSassHalf;
  for (const auto& [name, n] : *counts) {
    EXPECT_EQ(n.first, 0) << "without pp_pv the turn ends after Q.K^T's wait: " << name;
    EXPECT_GE(n.second, 1) << "with pp_pv the turn ends under Q.K^T: " << name;
  }
}

// k_perm is the FP8 forward's (16-bit P packs without shuffles already), at key counts of fours
// (K's map splits the keys in fours, which TMA bounds-checks as fours), never with multicast pairs
// (their K is one box) or a narrow first tile (its first columns are not the tile's first keys); every
// FP8 head dim up to 128 has both values, d=256 none (little to save, and its picks spilled).
TEST(FlashFwdWgmmaSpace, KPermIsTheFp8ForwardsAtKeyCountsOfFours) {
  const SearchSpace space = load_space();
  const auto values = [&](const char* spec) {
    std::set<bool> v;
    space.for_each_valid(Problem::parse(spec), kArch, [&](const Config& c) {
      v.insert(flag(c, "k_perm"));
      if (flag(c, "k_perm")) { EXPECT_FALSE(flag(c, "kv_multicast")) << spec << " " << config_str(c); }
    });
    return v;
  };
  EXPECT_EQ(values("b=1,h=16,s=16384,d=128,dtype=fp8,causal=0"), (std::set<bool>{false, true}));
  EXPECT_EQ(values("b=2,h=8,hkv=2,s=1000,sk=1000,d=64,dtype=fp8,causal=1"), (std::set<bool>{false, true}));
  EXPECT_EQ(values("b=1,h=16,s=16384,d=96,dtype=fp8,causal=1"), (std::set<bool>{false, true}));
  EXPECT_EQ(values("b=1,h=16,s=16384,d=256,dtype=fp8,causal=1"), std::set<bool>{false});
  EXPECT_EQ(values("b=2,h=8,hkv=2,s=1000,sk=1001,d=128,dtype=fp8,causal=0"), std::set<bool>{false});
  EXPECT_EQ(values("b=1,h=16,s=16384,d=128,dtype=bf16,causal=0"), std::set<bool>{false});
  EXPECT_EQ(values("b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=bf16,causal=1,page=64,kv_dtype=fp8"), std::set<bool>{false});
}

// k_perm's K map: (head_dim, 4, keys / 4, heads_kv, batch) in byte strides (a row, four rows, a head, a
// batch), boxes of (a column block, 2, block_n / 4): half a tile, a pair of each 4-key unit. Q's and
// V^T's maps are as without it. A call whose seqlen_k is not a multiple of 4 is refused, saying why.
TEST(FlashFwdWgmmaPlan, KPermLoadsKInBoxesOfKeyPairs) {
  const SearchSpace space = load_space();
  const Problem p = Problem::parse("b=2,h=16,hkv=4,s=4096,sk=4096,d=128,dtype=fp8,causal=1");
  // The FP8 forward's call: q, k and v^T e4m3 (dense_call_of's element strides are bytes).
  const auto fp8_call = [](const Problem& x) {
    attntune_plan::Call call = attntune::testing::dense_call_of(x);
    call.qkv_fp8 = 1;
    return call;
  };
  const auto dev = attntune::testing::FakeDevice{}.device();
  for (const bool on : {false, true}) {
    const Config c = first_valid(space, p, [&](const Config& x) { return flag(x, "k_perm") == on; });
    ASSERT_FALSE(c.empty()) << on;
    const RenderedKernel kernel = render_kernel(space, c, p, kArch);
    std::string why;
    const auto planned = plan_call(kernel.launch, fp8_call(p), dev, &why);
    ASSERT_TRUE(planned) << config_str(c) << ": " << why;
    const attntune_plan::Plan& plan = *planned;
    ASSERT_EQ(plan.maps, 3);
    const attntune_plan::TensorMap& k = plan.map[1];
    EXPECT_EQ(plan.map[0].rank, 4);
    EXPECT_EQ(plan.map[2].rank, 4);
    if (!on) {
      EXPECT_EQ(k.rank, 4);
      continue;
    }
    ASSERT_EQ(k.rank, 5);
    EXPECT_EQ(k.bf16, attntune_plan::kMapBytes);
    EXPECT_EQ(k.swizzle_bytes, 128);
    const unsigned long long dims[5] = {128, 4, 1024, 4, 2};
    const unsigned box[5] = {128, 2, static_cast<unsigned>(num(c, "block_n") / 4), 1, 1};
    // dense_call_of's [b, hkv, sk, d] strides, in bytes for FP8: a row d, a head sk * d, a batch hkv * sk * d.
    const unsigned long long strides[4] = {128, 512, 4096ull * 128, 4ull * 4096 * 128};
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(k.dims[i], dims[i]) << i;
      EXPECT_EQ(k.box[i], box[i]) << i;
    }
    for (int i = 0; i < 4; ++i) EXPECT_EQ(k.strides[i], strides[i]) << i;

    const Problem odd = Problem::parse("b=2,h=16,hkv=4,s=4096,sk=4097,d=128,dtype=fp8,causal=1");
    const auto refused = plan_call(kernel.launch, fp8_call(odd), dev, &why);
    EXPECT_FALSE(refused);
    EXPECT_NE(why.find("seqlen_k 4097 is not a multiple of 4"), std::string::npos) << why;
  }
}

// k_perm's builds: the FP8 forward's d=128 pick (overlapped, fa4_loop) and its causal forms (ping-pong;
// 96-key tiles), d=64 and d=96 (three 32-byte column blocks a row) build clean either way (the
// producer's two boxes a tile on its 24 registers too), and with it P's pack has no shuffles: at least
// 12 SHFLs fewer a build (two a k-step of 32 keys and row, one loop copy at least). The SASS half
// needs cuobjdump, and skips, saying so, without one.
TEST(FlashFwdWgmmaBuild, KPermPacksPWithoutShuffles) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = load_space();
  const std::string rest = "exp2_emu=0,kv_multicast=false,softcap_tanh=accurate,split_tail=false,warp_specialize=true,"
                           "pv_buffers=1,lazy_rescale=0,producer_regs=24,persistent=true,head_group=1,"
                           "pack_gqa=false,stages=2,wg_uniform=true,block_m=128,fold_fma=false";
  const std::vector<std::pair<std::string, std::string>> picks = {
      {"b=1,h=16,s=16384,d=128,dtype=fp8,causal=0",
       "pv_chunks=1,intra_wg_overlap=true,block_n=128,fa4_loop=true,narrow_n=0,ping_pong=false"},
      {"b=1,h=16,s=16384,d=128,dtype=fp8,causal=1",
       "pv_chunks=1,intra_wg_overlap=false,block_n=128,fa4_loop=false,narrow_n=0,ping_pong=true"},
      {"b=1,h=16,s=16384,d=128,dtype=fp8,causal=1",
       "pv_chunks=1,intra_wg_overlap=true,block_n=96,fa4_loop=false,narrow_n=0,ping_pong=true"},
      {"b=1,h=32,s=16384,d=64,dtype=fp8,causal=0",
       "pv_chunks=1,intra_wg_overlap=true,block_n=128,fa4_loop=true,narrow_n=0,ping_pong=false"},
      {"b=1,h=16,s=16384,d=96,dtype=fp8,causal=0",
       "pv_chunks=1,intra_wg_overlap=true,block_n=96,fa4_loop=true,narrow_n=0,ping_pong=false"},
  };
  std::vector<std::pair<std::string, std::string>> jobs;
  for (const auto& [spec, cfg] : picks) jobs.emplace_back(spec, rest + "," + cfg);
  const auto counts = attntune::testing::sass_counts_off_and_on(
      space, kArch, jobs, "k_perm", "SHFL",
      [](const std::string& cuobjdump, const std::string& cubin) { return attntune::testing::sass_op_count(cuobjdump, cubin, "SHFL"); });
  if (!counts) GTEST_SKIP() << attntune::testing::kNoSassHalf;
  for (const auto& [name, n] : *counts) EXPECT_GE(n.first - n.second, 12) << "k_perm's builds still shuffle P: " << name;
}
}  // namespace test_flash_fwd_wgmma_build
