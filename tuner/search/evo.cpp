// evo: an EvoEngineer-style evolutionary search, its children screened by a surrogate model.
// Autotuning landscapes are rugged in the big parameters (a tile size is good only with the right
// warp count) and nearly flat in the small ones, and the good configs cluster; so a small elite
// bred by tournament, crossover and mutation to neighbouring values finds them in a fraction of
// what random sampling needs. What a GPU tuner adds:
//  - every child is repaired to a valid config the search has never proposed or observed (the
//    nearest one by single-parameter steps), so no evaluation is wasted or repeated;
//  - failures are data: a child next to (Hamming distance 1) configs that failed, or carrying a
//    parameter value that mostly fails, is rejected with that likelihood and bred again;
//  - results are data too: each proposal breeds a pool of children, adds a few random unseen
//    configs (so the model can pull the search out of a basin the elite is stuck in), and keeps
//    the one a Gaussian-process surrogate of log time (surrogate.hpp) expects to improve most on
//    the best time so far. The model learns which parameters matter and which values go together;
//    it is conditioned on the proposals still in flight (as if they had come back as predicted),
//    so proposals made while results are outstanding spread instead of piling up in one spot;
//  - the first population is the warm start (best configs of the nearest tuned problem, repaired)
//    topped up with random configs spread apart; immigrants (random configs), and a burst of them
//    after a long stagnation, keep it from settling in one basin; it ends with every config proposed.
// Proposals may run ahead of results: until a first ok result it keeps proposing initial configs.
// All randomness comes from one Rng seeded with the context's seed, and the model is a pure function
// of the observations, so a seed and a sequence of propose/observe calls give the same proposals
// everywhere.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <limits>
#include <string>

#include "search/rng.hpp"
#include "search/strategies.hpp"
#include "search/surrogate.hpp"
#include "search/valid_configs.hpp"

namespace attntune::search {

namespace {

// Tuned by replaying three exhaustive H100 campaigns (tests/data/campaigns: b4-s4k-d128, b8-s2k-d64
// and b4-s4k-d128 causal) and the synthetic landscapes (tests/unit/search/synthetic.hpp), 300 seeds
// each, 8 proposals in flight, and checked on seeds 1001..1600. What the model's screening of a
// larger pool bought, over the optimistic marginal model that ranked 4 children before it: the tail
// (p90 to within 2% on b4-s4k-d128 from 184 to 52; 42 -> 37 and 39 -> 36 on the others; within
// 1%: 193 -> 62); the median hardly moves (28.5 -> 25.5, and 29 -> 28 on the other seeds), as it
// is set by the first batch, proposed blind. Conditioning on the proposals in flight is worth about
// 3 evaluations of median and 15 of p90; the random configs in the pool about 20 of p90; the other
// values here move the figures by less than the noise of 300 seeds.
struct Hyper {
  std::size_t population = 12;  // at most this many in the elite; the spread of the first ones
  std::size_t initial = 8;       // proposals before breeding starts (the first batch in flight)
  double elite_share = 1.0 / 3;  // the elite: this share of the ok results, the fastest (a tighter
                                 // elite converges sooner; the cap keeps two basins alive)
  std::size_t tournament = 2;    // contestants per parent; the fastest wins
  double crossover = 0.6;        // a child mixes two parents (uniform), else it is a mutant of one
  double mutate_after_crossover = 0.5;
  double extra_mutation = 0.35;  // after the first mutated parameter, the chance of one more
  double jump = 0.15;            // a mutation goes to any value rather than a neighbouring one
  std::size_t children = 32;     // bred per proposal, for the model to choose from
  std::size_t explorers = 16;    // random unseen configs in the same pool
  std::size_t model_window = 64; // the model is fitted to the fastest this many ok results
  double immigrants = 0.12;      // a proposal is a random config
  std::size_t spread = 8;        // an initial config: the farthest from those proposed, of this many
  std::size_t stagnation = 60;   // evaluations without a better time before a burst of immigrants
  double reject_near_failure = 0.9;
  double reject_near_wrong = 0.5;  // wrong_result / nan: more often a bug of one config
  int breed_attempts = 128;
  int immigrant_attempts = 8;
};

bool hard_failure(const std::string& status) { return status != "wrong_result" && status != "nan_or_unwritten"; }

int distance(const Genome& a, const Genome& b) {
  int d = 0;
  for (std::size_t p = 0; p < a.size(); ++p) d += a[p] != b[p];
  return d;
}

class Evo final : public Strategy {
 public:
  explicit Evo(const StrategyContext& c)
      : valid_(*c.space, c.problem, c.arch), rng_(c.seed), outcome_(valid_.size(), Outcome::kUnknown) {
    for (int size : valid_.domain_sizes()) values_.emplace_back(static_cast<std::size_t>(size));
    for (const Config& w : c.warm_start)
      if (auto g = valid_.genome_of(w)) warm_.push_back(std::move(*g));
    seed_new_tunables(*c.space, c.warm_start);
  }

  std::vector<Config> propose(std::size_t n) override {
    std::vector<Config> out;
    while (out.size() < n && !valid_.all_seen()) {
      const std::size_t i = next();
      valid_.mark_seen(i);
      in_flight_.push_back(i);
      if (proposed_.size() < h_.population) proposed_.push_back(i);
      ++proposals_;
      out.push_back(valid_.config(i));
    }
    return out;
  }

  void observe(const Trial& t) override {
    const std::optional<Genome> g = valid_.genome_of(t.config);
    if (!g) return;  // not a config of this space: nothing to learn
    const bool ok = t.status == "ok" && t.time_us;
    if (auto i = valid_.find(*g)) {
      valid_.mark_seen(*i);
      outcome_[*i] = ok ? Outcome::kOk : hard_failure(t.status) ? Outcome::kFailed : Outcome::kWrong;
      in_flight_.erase(std::remove(in_flight_.begin(), in_flight_.end(), *i), in_flight_.end());
    }
    for (std::size_t p = 0; p < g->size(); ++p) {
      ValueStats& v = value(p, *g);
      ++v.tried;
      v.ok += ok;
    }
    if (ok) {
      const Scored s{*t.time_us, *g};
      ok_.insert(std::upper_bound(ok_.begin(), ok_.end(), s), s);
      ++unmodelled_;
    }
    if (ok && *t.time_us < best_us_) {
      best_us_ = *t.time_us;
      since_best_ = 0;
    } else if (++since_best_ >= h_.stagnation) {
      burst_ = h_.population / 2;
      since_best_ = 0;
    }
  }

  bool exhausted() const override { return valid_.all_seen(); }

 private:
  struct Scored {
    double time_us;
    Genome genome;
    bool operator<(const Scored& o) const { return time_us != o.time_us ? time_us < o.time_us : genome < o.genome; }
  };
  enum class Outcome : std::uint8_t { kUnknown, kOk, kFailed, kWrong };
  struct ValueStats {  // one value of one parameter, over the observed configs that have it
    int tried = 0, ok = 0;
  };
  // The least risky candidate a proposal rejected: what it settles for when it accepts none.
  struct Fallback {
    std::optional<std::size_t> index;
    double risk = std::numeric_limits<double>::infinity();
  };
  static constexpr double kTaboo = 1;  // risk of a config with a value that never worked

  ValueStats& value(std::size_t p, const Genome& g) { return values_[p][static_cast<std::size_t>(g[p])]; }
  const ValueStats& value(std::size_t p, const Genome& g) const { return values_[p][static_cast<std::size_t>(g[p])]; }

  // A tunable the space gained after the warm start's configs were recorded (they name no value for
  // it; its `default:`, the old builds' value, stands in) gets its other values tried on the best of
  // those configs, after the warm start itself: children change what the model has seen pay, so a
  // short warm-started campaign hardly ever reached them (the shipped database's rebuild after
  // flash_fwd_wgmma's pack_gqa: 2021 evaluations, none packed; docs/design/search.md "Warm start").
  // An invalid combination is repaired as any warm start is.
  void seed_new_tunables(const SearchSpace& space, const std::vector<Config>& warm) {
    const std::vector<Param>& params = space.params();
    for (std::size_t p = 0; p < params.size(); ++p) {
      if (!params[p].default_value) continue;
      for (const Config& w : warm) {
        if (w.count(params[p].name)) continue;  // recorded with it
        const std::optional<Genome> g = valid_.genome_of(w);
        if (!g) continue;
        for (int v = 0; v < valid_.domain_sizes()[p]; ++v) {
          if (v == (*g)[p]) continue;
          Genome h = *g;
          h[p] = v;
          warm_.push_back(std::move(h));
        }
        break;  // the best such config only
      }
    }
  }

  // One proposal (some config is unseen): the warm start, then initial configs until there is an
  // ok result to breed from, then children, immigrants among them.
  std::size_t next() {
    while (!warm_.empty()) {  // valid ones as they are (unless seen), invalid ones repaired
      Genome g = std::move(warm_.front());
      warm_.pop_front();
      if (auto i = valid_.find(g)) {
        if (!valid_.seen(*i)) return *i;
      } else if (auto j = settle(std::move(g))) {
        return *j;
      }
    }
    Fallback fallback;
    const bool breeding = proposals_ >= h_.initial && !ok_.empty();
    if (breeding && burst_ > 0) {
      --burst_;  // a burst of immigrants after a stagnation
    } else if (breeding && !rng_.chance(h_.immigrants)) {
      if (auto i = breed(fallback)) return *i;
    }
    if (auto i = immigrant(fallback, breeding ? 1 : h_.spread)) return *i;
    return *fallback.index;  // every candidate looked risky: the least risky
  }

  // A pool of children of two tournament winners (or mutants of one), each repaired and screened
  // for risk, and of random unseen configs screened the same way; the one the model expects to
  // improve most on the best time (the first child while there is no model yet).
  std::optional<std::size_t> breed(Fallback& fallback) {
    std::vector<std::size_t> pool;
    auto add = [&](std::optional<std::size_t> i) {
      if (i && std::find(pool.begin(), pool.end(), *i) == pool.end() && accept(*i, fallback)) pool.push_back(*i);
    };
    for (int attempt = 0; attempt < h_.breed_attempts && pool.size() < h_.children; ++attempt) {
      Genome child = parent();
      bool mutate_it = true;
      if (ok_.size() >= 2 && rng_.chance(h_.crossover)) {
        const Genome& other = parent();
        for (std::size_t p = 0; p < child.size(); ++p)
          if (rng_.chance(0.5)) child[p] = other[p];
        mutate_it = rng_.chance(h_.mutate_after_crossover);
      }
      if (mutate_it) mutate(child);
      add(settle(std::move(child)));
    }
    if (pool.empty()) return std::nullopt;
    if (!refresh_model()) return pool.front();
    const std::size_t bred = pool.size();
    for (std::size_t k = 0; k < 4 * h_.explorers && pool.size() < bred + h_.explorers; ++k)
      add(valid_.unseen(rng_.below(valid_.unseen_count())));
    auto gain = [&](std::size_t i) { return model_.expected_improvement(valid_.genome(i)); };
    std::size_t best = pool.front();
    double best_gain = gain(best);
    for (std::size_t k = 1; k < pool.size(); ++k)
      if (const double g = gain(pool[k]); g > best_gain) best = pool[k], best_gain = g;
    return best;
  }

  // Fits the model to the fastest ok results (relevances learned anew while results are few, then
  // at every eighth more) and conditions it on the proposals in flight. False with fewer than 2 ok.
  bool refresh_model() {
    if (ok_.size() < 2) return false;
    std::vector<Genome> x;
    std::vector<double> log_time;
    for (std::size_t k = 0; k < std::min(ok_.size(), h_.model_window); ++k) {
      x.push_back(ok_[k].genome);
      log_time.push_back(std::log(ok_[k].time_us));
    }
    const bool learn = !model_.fitted() || (unmodelled_ > 0 && unmodelled_ * 8 >= std::min(ok_.size(), std::size_t{64}));
    if (learn) unmodelled_ = 0;
    model_.fit(x, log_time, learn);
    std::vector<Genome> in_flight;
    for (std::size_t i : in_flight_) in_flight.push_back(valid_.genome(i));
    model_.believe(in_flight);
    return true;
  }

  // Tournament among the elite: the fastest elite_share of the ok results, at most `population`.
  const Genome& parent() {
    const auto share = static_cast<std::size_t>(h_.elite_share * static_cast<double>(ok_.size()));
    const std::size_t elite = std::min({ok_.size(), h_.population, std::max<std::size_t>(share, 2)});
    std::size_t best = elite;
    for (std::size_t k = 0; k < h_.tournament; ++k) best = std::min(best, static_cast<std::size_t>(rng_.below(elite)));
    return ok_[best].genome;
  }

  // One parameter to a neighbouring value in its declared order (or, sometimes, to any value);
  // possibly more parameters.
  void mutate(Genome& g) {
    const std::vector<int>& sizes = valid_.domain_sizes();
    do {
      const std::size_t p = rng_.below(g.size());
      const auto n = static_cast<std::uint64_t>(sizes[p]);
      if (n < 2) continue;
      if (rng_.chance(h_.jump)) {
        g[p] = static_cast<int>((static_cast<std::uint64_t>(g[p]) + 1 + rng_.below(n - 1)) % n);
      } else {
        const bool up = g[p] == 0 || (g[p] + 1 < sizes[p] && rng_.chance(0.5));
        g[p] += up ? 1 : -1;
      }
    } while (rng_.chance(h_.extra_mutation));
  }

  // g itself when it is valid and unseen, else the nearest valid unseen config one parameter away
  // (smallest step in the domain's order; ties at random), else nothing.
  std::optional<std::size_t> settle(Genome g) {
    if (auto i = valid_.find(g); i && !valid_.seen(*i)) return i;
    std::vector<std::size_t> nearest;
    int best_step = std::numeric_limits<int>::max();
    for (std::size_t p = 0; p < g.size(); ++p) {
      const int own = g[p];
      for (int v = 0; v < valid_.domain_sizes()[p]; ++v) {
        const int step = std::abs(v - own);
        if (v == own || step > best_step) continue;
        g[p] = v;
        if (auto i = valid_.find(g); i && !valid_.seen(*i)) {
          if (step < best_step) nearest.clear(), best_step = step;
          nearest.push_back(*i);
        }
      }
      g[p] = own;
    }
    if (nearest.empty()) return std::nullopt;
    return nearest[rng_.below(nearest.size())];
  }

  // A random unseen config that passes the risk screen; of the first `spread` that do, the one
  // farthest (Hamming) from the initial configs proposed so far, so the first population covers
  // the space. Nothing when a few draws all look risky.
  std::optional<std::size_t> immigrant(Fallback& fallback, std::size_t spread) {
    std::optional<std::size_t> chosen;
    int chosen_distance = -1;
    std::size_t accepted = 0;
    for (int attempt = 0; attempt < h_.immigrant_attempts * static_cast<int>(spread) && accepted < spread; ++attempt) {
      const std::size_t i = valid_.unseen(rng_.below(valid_.unseen_count()));
      if (!accept(i, fallback)) continue;
      ++accepted;
      int d = std::numeric_limits<int>::max();
      for (std::size_t q : proposed_) d = std::min(d, distance(valid_.genome(i), valid_.genome(q)));
      if (d > chosen_distance) chosen = i, chosen_distance = d;
    }
    return chosen;
  }

  // Keeps candidate i with probability 1 - risk (never when taboo); remembers the least risky one
  // it turns down.
  bool accept(std::size_t i, Fallback& fallback) {
    const double r = risk(valid_.genome(i));
    if (r < kTaboo && !rng_.chance(r)) return true;
    if (r < fallback.risk) fallback = {i, r};
    return false;
  }

  // Learning from failures: how likely g is to fail, judged by its observed neighbours (configs one
  // parameter away: failures against successes) and by its parameter values (one that failed in
  // most of the configs that had it). A value that failed 3+ times and never worked is taboo: its
  // configs are proposed only when nothing else is left.
  double risk(const Genome& g) const {
    double weight = 0, failed_near = 0, ok_near = 0;
    Genome h = g;
    for (std::size_t p = 0; p < g.size(); ++p) {
      for (int v = 0; v < valid_.domain_sizes()[p]; ++v) {
        if (v == g[p]) continue;
        h[p] = v;
        if (auto i = valid_.find(h)) {
          const Outcome o = outcome_[*i];
          ok_near += o == Outcome::kOk;
          failed_near += o == Outcome::kFailed || o == Outcome::kWrong;
          weight += o == Outcome::kFailed ? h_.reject_near_failure : o == Outcome::kWrong ? h_.reject_near_wrong : 0;
        }
      }
      h[p] = g[p];
    }
    // Only failures around: reject_near_*; as many successes as failures: half that.
    double r = failed_near > 0 ? weight / (failed_near + ok_near) : 0;
    for (std::size_t p = 0; p < g.size(); ++p) {
      const ValueStats& v = value(p, g);
      const int failed = v.tried - v.ok;
      if (failed >= 3 && v.ok == 0) return kTaboo;
      if (failed >= 2) r = std::max(r, static_cast<double>(failed) / static_cast<double>(v.tried + 1));
    }
    return r;
  }

  Hyper h_;
  ValidConfigs valid_;
  Rng rng_;
  std::deque<Genome> warm_;
  std::size_t proposals_ = 0;
  std::vector<std::size_t> proposed_;   // the first `population` proposals, for the initial spread
  std::vector<std::size_t> in_flight_;  // proposed, not observed yet (in proposal order)
  std::vector<Scored> ok_;              // fastest first
  std::vector<Outcome> outcome_;        // per valid config
  std::vector<std::vector<ValueStats>> values_;  // per parameter, per value
  Surrogate model_;
  std::size_t unmodelled_ = 0;  // ok results since the model last learned its relevances
  double best_us_ = std::numeric_limits<double>::infinity();
  std::size_t since_best_ = 0, burst_ = 0;
};

}  // namespace

std::unique_ptr<Strategy> make_evo(const StrategyContext& context) { return std::make_unique<Evo>(context); }

}  // namespace attntune::search
