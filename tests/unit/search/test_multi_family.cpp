// The search over several templates (search/multi_family.hpp) on the real flash_fwd_mma (sm_90) and
// flash_fwd_wgmma (sm_90a) spaces with synthetic landscapes: both templates explored, the one that
// fails or is slower gets fewer proposals, exhausted templates drop out, results routed to the
// template they belong to, and the same seed gives the same proposals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "core/error.hpp"
#include "search/multi_family.hpp"

namespace test_multi_family {
using namespace attntune;
using namespace attntune::search;

namespace {

const Problem& problem() {
  static const Problem p = Problem::parse("b=4,h=16,s=4096,d=128,dtype=bf16,causal=0");
  return p;
}
const SearchSpace& mma() {
  static const SearchSpace s = SearchSpace::load(std::string(ATTNTUNE_SOURCE_DIR) + "/search_spaces/flash_fwd_mma.yaml");
  return s;
}
const SearchSpace& wgmma() {
  static const SearchSpace s =
      SearchSpace::load(std::string(ATTNTUNE_SOURCE_DIR) + "/search_spaces/flash_fwd_wgmma.yaml");
  return s;
}
std::vector<FamilySpace> both() {
  return {{"flash_fwd_mma", &mma(), "sm_90"}, {"flash_fwd_wgmma", &wgmma(), "sm_90a"}};
}

// A landscape per template: `base` µs times a smooth spread per config; base 0: every config fails.
struct Landscape {
  std::map<std::string, double> base;
  Trial operator()(const Config& tagged) const {
    const auto [family, plain] = untag_family(tagged);
    const double b = base.at(family);
    if (b <= 0) return {tagged, "compile_error", std::nullopt};
    const std::uint64_t h = std::hash<std::string>{}(config_str(plain));
    return {tagged, "ok", b * (1 + 0.3 * double(h % 101) / 101)};
  }
};

// Proposes `in_flight` at a time and observes the oldest, as tune does, for `evals` evaluations.
// Returns the tagged configs in the order they were evaluated.
std::vector<Config> drive(MultiFamily& s, const Landscape& land, std::size_t evals, std::size_t in_flight = 4) {
  std::vector<Config> done, queue;
  while (done.size() < evals) {
    if (queue.size() < in_flight)
      for (Config& c : s.propose(std::min(in_flight - queue.size(), evals - done.size() - queue.size())))
        queue.push_back(std::move(c));
    if (queue.empty()) break;
    s.observe(land(queue.front()));
    done.push_back(queue.front());
    queue.erase(queue.begin());
  }
  return done;
}

// A warm start of both templates: the first 8 valid configs of each, tagged.
std::vector<Config> warm_of_both() {
  std::vector<Config> warm;
  for (const Config& c : mma().enumerate(problem(), "sm_90")) {
    warm.push_back(tag_family("flash_fwd_mma", c));
    if (warm.size() == 8) break;
  }
  for (const Config& c : wgmma().enumerate(problem(), "sm_90a")) {
    warm.push_back(tag_family("flash_fwd_wgmma", c));
    if (warm.size() == 16) break;
  }
  return warm;
}

std::map<std::string, std::size_t> per_family(const std::vector<Config>& configs) {
  std::map<std::string, std::size_t> n;
  for (const Config& c : configs) ++n[untag_family(c).first];
  return n;
}

TEST(MultiFamilyTag, RoundTripsAndReadsForPeople) {
  Config c{{"block_m", std::int64_t{128}}, {"causal_skip", true}};
  const Config t = tag_family("flash_fwd_wgmma", c);
  EXPECT_EQ(std::get<std::string>(t.at(kTemplateKey)), "flash_fwd_wgmma");
  const auto [family, plain] = untag_family(t);
  EXPECT_EQ(family, "flash_fwd_wgmma");
  EXPECT_EQ(plain, c);
  EXPECT_EQ(untag_family(c).first, "");
  EXPECT_EQ(tagged_str(t), "flash_fwd_wgmma: block_m=128,causal_skip=true");
  EXPECT_EQ(tagged_str(c), "block_m=128,causal_skip=true");
}

TEST(MultiFamily, BothTemplatesExploredAndTheFasterGetsMore) {
  for (const std::string strategy : {"evo", "random"}) {
    MultiFamily s(strategy, both(), problem(), 7, {});
    const Landscape land{{{"flash_fwd_mma", 1000}, {"flash_fwd_wgmma", 600}}};
    const auto done = drive(s, land, 120);
    ASSERT_EQ(done.size(), 120u) << strategy;
    const auto n = per_family(done);
    EXPECT_GE(n.at("flash_fwd_mma"), 8u) << strategy << ": the warm-up gives every template its share";
    EXPECT_GE(n.at("flash_fwd_wgmma"), 8u) << strategy;
    EXPECT_GT(n.at("flash_fwd_wgmma"), 2 * n.at("flash_fwd_mma")) << strategy << ": wgmma is 1.7x faster";
    // Every config once, and each routed to its own template's space.
    std::set<std::string> keys;
    for (const Config& c : done) {
      EXPECT_TRUE(keys.insert(config_str(c)).second) << "proposed twice: " << tagged_str(c);
      const auto [family, plain] = untag_family(c);
      const bool is_mma = family == "flash_fwd_mma";
      EXPECT_EQ((is_mma ? mma() : wgmma()).check(plain, problem(), is_mma ? "sm_90" : "sm_90a"), std::nullopt)
          << tagged_str(c);
    }
    const auto stats = s.stats();
    ASSERT_EQ(stats.size(), 2u);
    EXPECT_EQ(stats[0].observed + stats[1].observed, 120u);
    EXPECT_EQ(stats[1].family, "flash_fwd_wgmma");
    ASSERT_TRUE(stats[1].best_us);
    EXPECT_LT(*stats[1].best_us, 600 * 1.3 + 1);
  }
}

TEST(MultiFamily, ATemplateWhoseConfigsAllFailGetsLittleMoreThanItsWarmUp) {
  MultiFamily s("evo", both(), problem(), 3, {});
  const Landscape land{{{"flash_fwd_mma", 1000}, {"flash_fwd_wgmma", 0}}};
  const auto n = per_family(drive(s, land, 150));
  EXPECT_GE(n.at("flash_fwd_wgmma"), 8u) << "it was tried";
  EXPECT_LE(n.at("flash_fwd_wgmma"), 14u) << "and then left alone";
  EXPECT_EQ(n.at("flash_fwd_mma"), 150u - n.at("flash_fwd_wgmma"));
}

TEST(MultiFamily, ASlowTemplateIsExploredLessButNotDropped) {
  MultiFamily s("random", both(), problem(), 11, {});
  const Landscape land{{{"flash_fwd_mma", 500}, {"flash_fwd_wgmma", 2000}}};  // wgmma 4x slower here
  const auto n = per_family(drive(s, land, 300));
  EXPECT_GE(n.at("flash_fwd_wgmma"), 8u);
  EXPECT_LT(n.at("flash_fwd_wgmma"), 40u);
}

TEST(MultiFamily, SameSeedSameProposalsOtherSeedOthers) {
  const Landscape land{{{"flash_fwd_mma", 1000}, {"flash_fwd_wgmma", 900}}};
  auto run = [&](std::uint64_t seed) {
    MultiFamily s("evo", both(), problem(), seed, {});
    std::vector<std::string> out;
    for (const Config& c : drive(s, land, 60)) out.push_back(config_str(c));
    return out;
  };
  EXPECT_EQ(run(5), run(5));
  EXPECT_NE(run(5), run(6));
  EXPECT_NE(MultiFamily::derived_seed(5, "flash_fwd_mma"), MultiFamily::derived_seed(5, "flash_fwd_wgmma"));
}

TEST(MultiFamily, ExhaustiveCoversBothSpacesOnceAsTemplatesRunOut) {
  MultiFamily s("exhaustive", both(), problem(), 1, {});
  const std::size_t total = mma().count(problem(), "sm_90") + wgmma().count(problem(), "sm_90a");
  const Landscape land{{{"flash_fwd_mma", 1000}, {"flash_fwd_wgmma", 900}}};
  const auto done = drive(s, land, total + 10, 8);
  EXPECT_EQ(done.size(), total) << "nothing proposed twice, nothing left out";
  EXPECT_TRUE(s.exhausted());
  EXPECT_TRUE(s.propose(4).empty());
  const auto n = per_family(done);
  EXPECT_EQ(n.at("flash_fwd_mma"), mma().count(problem(), "sm_90"));
  EXPECT_EQ(n.at("flash_fwd_wgmma"), wgmma().count(problem(), "sm_90a"));
}

TEST(MultiFamily, ResumedResultsCountAndAreNeverProposedAgain) {
  const Landscape land{{{"flash_fwd_mma", 1000}, {"flash_fwd_wgmma", 900}}};
  MultiFamily first("random", both(), problem(), 9, {});
  const auto before = drive(first, land, 30);
  MultiFamily resumed("random", both(), problem(), 9, {});
  for (const Config& c : before) resumed.observe(land(c));
  std::size_t proposed = 0;
  for (const auto& f : resumed.stats()) proposed += f.proposed;
  EXPECT_EQ(proposed, 30u);
  std::set<std::string> seen;
  for (const Config& c : before) seen.insert(config_str(c));
  for (const Config& c : drive(resumed, land, 60)) EXPECT_FALSE(seen.count(config_str(c))) << tagged_str(c);
}

TEST(MultiFamily, WarmStartGoesToItsTemplate) {
  const Config good = mma().enumerate(problem(), "sm_90").back();
  MultiFamily s("evo", both(), problem(), 1, {tag_family("flash_fwd_mma", good)});
  bool found = false;
  for (const Config& c : s.propose(16)) found = found || c == tag_family("flash_fwd_mma", good);
  EXPECT_TRUE(found) << "evo seeds its first population with the warm start";
}

// The warm start's times (AllocationOptions::prior_us): the fastest template's seeds first, and a
// template far behind (>= 1.25x) warms up on its best 2 seeds instead of 8; without times, or with
// one template's missing, the warm-up is as before (the templates in turn, the first one first).
TEST(MultiFamily, AWarmStartFarBehindShortensThatTemplatesWarmUp) {
  const std::vector<Config> warm = warm_of_both();
  const auto first_ten = [&](std::map<std::string, double> prior) {
    AllocationOptions o;
    o.prior_us = std::move(prior);
    MultiFamily s("evo", both(), problem(), 1, warm, o);
    std::vector<std::string> order;
    for (const Config& c : s.propose(10)) order.push_back(untag_family(c).first);
    return order;
  };
  const std::string m = "flash_fwd_mma", w = "flash_fwd_wgmma";
  const auto behind = first_ten({{m, 150.0}, {w, 100.0}});
  ASSERT_EQ(behind.size(), 10u);
  EXPECT_EQ(behind.front(), w) << "the fastest template's best seed first";
  EXPECT_EQ(std::count(behind.begin(), behind.end(), m), 2) << "two seeds of the one far behind";
  EXPECT_EQ(std::count(behind.begin(), behind.end(), w), 8);

  const auto close = first_ten({{m, 110.0}, {w, 100.0}});
  EXPECT_EQ(close.front(), w);
  EXPECT_EQ(std::count(close.begin(), close.end(), m), 5) << "within 1.25x: the templates in turn";

  for (const auto& none : {std::map<std::string, double>{}, std::map<std::string, double>{{m, 150.0}}}) {
    const auto plain = first_ten(none);
    EXPECT_EQ(plain.front(), m) << "no times for every template: the first template first, as before";
    EXPECT_EQ(std::count(plain.begin(), plain.end(), m), 5);
  }
  // Exhaustive takes no warm start, nor its times: resumed, it must evaluate what it would have.
  AllocationOptions o;
  o.prior_us = {{m, 150.0}, {w, 100.0}};
  MultiFamily exhaustive("exhaustive", both(), problem(), 1, warm, o);
  std::vector<std::string> order;
  for (const Config& c : exhaustive.propose(10)) order.push_back(untag_family(c).first);
  EXPECT_EQ(order.front(), m);
  EXPECT_EQ(std::count(order.begin(), order.end(), m), 5);
}

// tune keeps ~34 proposals in flight, so its first batch is allocated before any result. Until a
// template has a result of its own its value is the warm start's word (the fastest time over its
// own): one far behind gets a few of the batch beyond its warm-up, not half (runs 271-273: 15-19 of
// 34 went to flash_fwd_mma at 1.6-1.75x behind); without times, the batch is split as before. Once
// results come, they decide, and a template whose configs all failed is worth nothing.
TEST(MultiFamily, BeforeAnyResultTheWarmStartsTimesAllocateTheFirstBatch) {
  const std::vector<Config> warm = warm_of_both();
  const std::string m = "flash_fwd_mma", w = "flash_fwd_wgmma";
  const auto first_batch = [&](std::map<std::string, double> prior) {
    AllocationOptions o;
    o.prior_us = std::move(prior);
    MultiFamily s("evo", both(), problem(), 1, warm, o);
    return per_family(s.propose(34));
  };
  const auto behind = first_batch({{m, 170.0}, {w, 100.0}});
  EXPECT_EQ(behind.at(m) + behind.at(w), 34u);
  EXPECT_GE(behind.at(m), 2u) << "its warm-up at least";
  EXPECT_LE(behind.at(m), 6u) << "1.7x behind: a few of the batch, not half";
  const auto close = first_batch({{m, 105.0}, {w, 100.0}});
  EXPECT_GE(close.at(m), 12u) << "within 1.25x: nearly its share";
  const auto none = first_batch({});
  EXPECT_GE(none.at(m), 15u) << "no times: the bound alone, as before";
  EXPECT_LE(none.at(m), 19u);

  // Results decide once they come: flash_fwd_mma measured faster than the warm start said gets most
  // of what follows; and one whose every config fails gets little beyond its warm-up.
  AllocationOptions o;
  o.prior_us = {{m, 170.0}, {w, 100.0}};
  MultiFamily turned("evo", both(), problem(), 1, warm, o);
  const auto n_turned = per_family(drive(turned, Landscape{{{m, 50.0}, {w, 100.0}}}, 120, 8));
  EXPECT_GT(n_turned.at(m), n_turned.at(w)) << "the landscape, not the warm start, has the last word";
  MultiFamily failing("evo", both(), problem(), 1, warm, o);
  const auto n_failing = per_family(drive(failing, Landscape{{{m, 0.0}, {w, 100.0}}}, 120, 8));
  EXPECT_LE(n_failing.at(m), 12u) << "every config failed: worth 0, the warm start's word no longer counts";
}

TEST(MultiFamily, RefusesUnknownTemplatesAndDuplicates) {
  MultiFamily s("random", both(), problem(), 1, {});
  EXPECT_THROW(s.observe({mma().enumerate(problem(), "sm_90").front(), "ok", 1.0}), std::logic_error)
      << "an untagged config belongs to no template";
  std::vector<FamilySpace> twice = {both()[0], both()[0]};
  EXPECT_THROW(MultiFamily("random", twice, problem(), 1, {}), InputError);
  EXPECT_THROW(MultiFamily("random", {both()[0]}, problem(), 1, {}), std::logic_error);
  EXPECT_THROW(MultiFamily("annealing", both(), problem(), 1, {}), InputError);
}

}  // namespace
}  // namespace test_multi_family
