// evo: reproducible for a seed and a sequence of observations, only valid configs never proposed or
// observed before, warm-start configs first, learns to avoid a failing region, ends with every
// config proposed.
#include <gtest/gtest.h>

#include <set>

#include "search/strategy.hpp"
#include "synthetic.hpp"

namespace test_evo {
using namespace attntune;
using namespace attntune::search;
using namespace attntune::test;

namespace {

TEST(EvoStrategy, ReproducibleForASeedAndObservationsDifferentAcrossSeeds) {
  const Synthetic& s = landscape();
  auto a = make_strategy("evo", context_of(s, 5)), b = make_strategy("evo", context_of(s, 5)),
       c = make_strategy("evo", context_of(s, 6));
  const auto pa = strs(drive(*a, s, 8, 200)), pb = strs(drive(*b, s, 8, 200)), pc = strs(drive(*c, s, 8, 200));
  ASSERT_EQ(pa.size(), 207u);  // 200 observed, 7 more in flight
  EXPECT_EQ(pa, pb);
  EXPECT_NE(pa, pc);
}

TEST(EvoStrategy, OnlyValidNewConfigsAndTheWholeSpaceInTheEnd) {
  const Synthetic& s = landscape();
  const std::size_t size = s.space->count(s.problem, s.arch);
  for (std::size_t pipeline : {1, 8, 16}) {
    auto evo = make_strategy("evo", context_of(s, 11));
    const std::vector<Config> got = drive(*evo, s, pipeline);
    std::set<std::string> distinct;
    for (const Config& c : got) {
      EXPECT_EQ(s.space->check(c, s.problem, s.arch), std::nullopt) << config_str(c);
      EXPECT_TRUE(distinct.insert(config_str(c)).second) << "proposed twice: " << config_str(c);
    }
    EXPECT_EQ(got.size(), size) << "pipeline " << pipeline;
    EXPECT_TRUE(evo->exhausted());
    EXPECT_TRUE(evo->propose(4).empty());
  }
}

TEST(EvoStrategy, ResumeNeverProposesWhatWasObserved) {
  const Synthetic& s = landscape();
  // A resumed campaign: 150 results recorded by an earlier run (here: random's first 150).
  auto earlier = make_strategy("random", context_of(s, 99));
  const std::vector<Config> before = earlier->propose(150);
  auto evo = make_strategy("evo", context_of(s, 1));
  std::set<std::string> observed;
  for (const Config& c : before) {
    const EvalRecord& r = s.results.at(config_str(c));
    evo->observe({c, r.status, r.status == "ok" ? r.median_us : std::nullopt});
    observed.insert(config_str(c));
  }
  const std::vector<Config> got = drive(*evo, s);
  EXPECT_EQ(got.size(), s.results.size() - observed.size());
  for (const Config& c : got) EXPECT_FALSE(observed.count(config_str(c))) << config_str(c);
}

TEST(EvoStrategy, WarmStartConfigsComeFirstRepairedWhereInvalid) {
  const Synthetic& s = landscape();
  const SearchSpace& space = *s.space;
  const Config a = space.parse_config(
      "block_m=128,block_n=32,warps=4,kv_stages=3,q_in_regs=false,min_blocks=2,frag_prefetch=1,lazy_rescale=true,"
      "kv_schedule=interleaved,sub_n=32");
  const Config b = space.parse_config(
      "block_m=64,block_n=64,warps=4,kv_stages=2,q_in_regs=true,min_blocks=1,frag_prefetch=0,lazy_rescale=false,"
      "kv_schedule=blockwise,sub_n=32");
  // Invalid: interleaved needs sub_n == block_n. One step (sub_n 32 -> 64... or block_n) repairs it.
  const Config broken = space.parse_config(
      "block_m=128,block_n=64,warps=8,kv_stages=2,q_in_regs=false,min_blocks=1,frag_prefetch=1,lazy_rescale=true,"
      "kv_schedule=interleaved,sub_n=32");
  ASSERT_EQ(space.check(a, s.problem, s.arch), std::nullopt);
  ASSERT_EQ(space.check(b, s.problem, s.arch), std::nullopt);
  ASSERT_NE(space.check(broken, s.problem, s.arch), std::nullopt);
  const Config foreign = {{"block_m", std::int64_t{96}}};  // not of this space: ignored

  auto evo = make_strategy("evo", context_of(s, 3, {a, foreign, b, a, broken}));
  const std::vector<Config> first = evo->propose(4);
  ASSERT_EQ(first.size(), 4u);
  EXPECT_EQ(config_str(first[0]), config_str(a));
  EXPECT_EQ(config_str(first[1]), config_str(b));
  const Config& repaired = first[2];
  EXPECT_EQ(space.check(repaired, s.problem, s.arch), std::nullopt);
  int changed = 0;
  for (const auto& [k, v] : broken) changed += repaired.at(k) != v;
  EXPECT_EQ(changed, 1) << config_str(repaired);
  EXPECT_NE(config_str(first[3]), config_str(a));  // the duplicate is not proposed again
}

// A planted failing region: every config with kv_stages=3 fails with `resources`. After its first
// few failures evo should stop proposing them; random keeps hitting them at their base rate.
TEST(EvoStrategy, AvoidsAFailingRegion) {
  SyntheticOptions o;
  o.fail_param = "kv_stages";
  o.fail_value = "3";
  o.compile_error_fraction = 0;
  o.resources_above_smem = 0;
  const Synthetic s = make_synthetic(o);
  std::size_t region = 0;
  for (const auto& [k, r] : s.results) region += r.status == "resources";
  ASSERT_GT(region, s.results.size() / 5);

  auto failing = [&](const std::vector<Config>& v) {
    std::size_t n = 0;
    for (const Config& c : v) n += std::get<std::int64_t>(c.at("kv_stages")) == 3;
    return n;
  };
  std::size_t evo_hits = 0, random_hits = 0;
  for (std::uint64_t seed = 1; seed <= 10; ++seed) {
    auto evo = make_strategy("evo", context_of(s, seed)), rnd = make_strategy("random", context_of(s, seed));
    evo_hits += failing(drive(*evo, s, 8, 150));
    random_hits += failing(drive(*rnd, s, 8, 150));
  }
  std::cout << "[ evo ] proposals into the failing region in 150 evaluations, 10 seeds: evo " << evo_hits
            << ", random " << random_hits << "\n";
  EXPECT_LT(evo_hits * 4, random_hits);
}

// Failures near a config steer children away; failures of one parameter value teach that value.
TEST(EvoStrategy, LearnsFromObservedFailuresBeforeProposing) {
  const Synthetic& s = landscape();
  const std::vector<Config> all = s.space->enumerate(s.problem, s.arch);
  auto evo = make_strategy("evo", context_of(s, 8));
  // Resume: every min_blocks=2 config seen so far failed; a few min_blocks=1 ones ran.
  std::size_t fed = 0;
  for (std::size_t i = 0; i < all.size() && fed < 60; i += 5, ++fed) {
    const bool bad = std::get<std::int64_t>(all[i].at("min_blocks")) == 2;
    evo->observe({all[i], bad ? "crashed" : "ok", bad ? std::nullopt : std::optional<double>(1000.0 + i)});
  }
  std::size_t bad = 0;
  const std::vector<Config> next = evo->propose(100);
  for (const Config& c : next) bad += std::get<std::int64_t>(c.at("min_blocks")) == 2;
  EXPECT_LT(bad, 15u) << "of 100";
}

}  // namespace

// A tunable the space gained after the warm start was recorded (its configs name no value for it:
// flash_fwd_mma's pack_gqa) has its other value tried on the best warm config right after the warm
// start; a short campaign left it to mutation and hardly ever reached it.
TEST(EvoStrategy, ANewTunableIsTriedOnTheBestWarmConfig) {
  const SearchSpace& space = flash_space();
  StrategyContext c;
  c.space = &space;
  c.problem = Problem::parse("b=1,h=32,hkv=8,s=1000,d=64,dtype=bf16,causal=1");
  c.arch = "sm_90";
  c.seed = 3;
  // Two valid unpacked configs whose packed twins are valid too.
  std::vector<Config> unpacked;
  space.for_each_valid(c.problem, c.arch, [&](const Config& x) {
    if (unpacked.size() >= 2 || std::get<bool>(x.at("pack_gqa"))) return;
    Config twin = x;
    twin["pack_gqa"] = true;
    if (space.check(twin, c.problem, c.arch) == std::nullopt) unpacked.push_back(x);
  });
  ASSERT_EQ(unpacked.size(), 2u);
  Config packed = unpacked[0];
  packed["pack_gqa"] = true;
  std::vector<Config> recorded = unpacked;  // as recorded before pack_gqa existed
  for (Config& x : recorded) x.erase("pack_gqa");
  c.warm_start = recorded;
  auto evo = make_strategy("evo", c);
  const std::vector<Config> first = evo->propose(3);
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(config_str(first[0]), config_str(unpacked[0]));
  EXPECT_EQ(config_str(first[1]), config_str(unpacked[1]));
  EXPECT_EQ(config_str(first[2]), config_str(packed));
  // Recorded with the tunable, the warm start is taken as it is.
  c.warm_start = unpacked;
  auto plain = make_strategy("evo", c);
  const std::vector<Config> again = plain->propose(3);
  ASSERT_EQ(again.size(), 3u);
  EXPECT_NE(config_str(again[2]), config_str(packed));
}
}  // namespace test_evo
