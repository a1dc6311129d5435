// evo: an EvoEngineer-style evolutionary search. Autotuning landscapes are mostly smooth along each
// parameter's declared order (tile sizes, stages, warps) with a few strong interactions, and the
// good configs cluster; so a small elitist population bred by tournament, crossover and mutation to
// neighbouring values finds them in a fraction of what random sampling needs. What a GPU tuner adds:
//  - every child is repaired to a valid config the search has never proposed or observed (the
//    nearest one by single-parameter steps), so no evaluation is wasted or repeated;
//  - failures are data: a child next to (Hamming distance 1) a config that failed, or carrying
//    parameter values that mostly fail, is rejected with high probability and bred again;
//  - results are data too: each proposal breeds a few children and keeps the one a marginal model
//    (mean log time of the ok configs sharing each parameter value) predicts fastest, which cuts
//    the evaluations to a near-optimum by about a third on replayed landscapes;
//  - the first population is the warm start (best configs of the nearest tuned problem, repaired)
//    topped up with random configs; immigrants (random configs) and a burst of them after a long
//    stagnation keep it from settling on one basin; it ends with every config proposed.
// Proposals may run ahead of results: until a first ok result it keeps proposing random configs.
// All randomness comes from one Rng seeded with the context's seed, so a seed and a sequence of
// propose/observe calls give the same proposals everywhere.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <limits>

#include "search/rng.hpp"
#include "search/strategies.hpp"
#include "search/valid_configs.hpp"

namespace attntune::search {

namespace {

// Tuned by replaying recorded and synthetic landscapes (tests/unit/search/), median over 30+ seeds.
struct Hyper {
  std::size_t population = 12;  // initial configs, and the elite the parents are drawn from
  std::size_t tournament = 3;   // contestants per parent; the fastest wins
  double crossover = 0.6;       // a child mixes two parents (uniform), else it is a mutated copy of one
  double mutate_after_crossover = 0.5;
  double extra_mutation = 0.35;  // after the first mutated parameter, the chance of one more
  double jump = 0.15;            // a mutation goes to any value rather than a neighbouring one
  double immigrants = 0.12;      // a proposal is a random config
  double reject_near_failure = 0.9;
  double reject_near_wrong = 0.5;  // wrong_result / nan: more often a bug of one config
  std::size_t stagnation = 60;     // evaluations without a better time before a burst of immigrants
  int breed_attempts = 32;
  int immigrant_attempts = 8;
  std::size_t screened = 4;  // children bred per proposal; the one the marginal model likes best wins
  double shrink = 2;         // marginal model: pseudo-observations at the mean, per value
};

bool hard_failure(const std::string& status) { return status != "wrong_result" && status != "nan_or_unwritten"; }

class Evo final : public Strategy {
 public:
  explicit Evo(const StrategyContext& c)
      : valid_(*c.space, c.problem, c.arch), rng_(c.seed), outcome_(valid_.size(), Outcome::kUnknown) {
    for (int size : valid_.domain_sizes()) values_.emplace_back(static_cast<std::size_t>(size));
    for (const Config& w : c.warm_start)
      if (auto g = valid_.genome_of(w)) warm_.push_back(std::move(*g));
  }

  std::vector<Config> propose(std::size_t n) override {
    std::vector<Config> out;
    while (out.size() < n && !valid_.all_seen()) {
      const std::size_t i = next();
      valid_.mark_seen(i);
      ++proposed_;
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
    }
    const double log_time = ok ? std::log(*t.time_us) : 0;
    for (std::size_t p = 0; p < g->size(); ++p) {
      ValueStats& v = value(p, *g);
      ++v.tried;
      if (ok) ++v.ok, v.log_time += log_time;
    }
    if (ok) {
      log_time_ += log_time;
      const Scored s{*t.time_us, *g};
      ok_.insert(std::upper_bound(ok_.begin(), ok_.end(), s), s);
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
  struct ValueStats {  // of one value of one parameter, over the observed configs that have it
    int tried = 0, ok = 0;
    double log_time = 0;  // sum over the ok ones
  };
  ValueStats& value(std::size_t p, const Genome& g) { return values_[p][static_cast<std::size_t>(g[p])]; }
  const ValueStats& value(std::size_t p, const Genome& g) const { return values_[p][static_cast<std::size_t>(g[p])]; }
  // The candidate a proposal settles on: the first one accepted, else the least risky one.
  struct Pick {
    std::optional<std::size_t> index;
    double risk = 2;
    bool accepted = false;
  };

  // One proposal (some config is unseen): warm start, then random until there is a first result
  // to breed from, then children, immigrants among them.
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
    Pick pick;
    const bool breeding = proposed_ >= h_.population && !ok_.empty();
    if (breeding && burst_ > 0) --burst_;  // a burst of immigrants after a stagnation
    else if (breeding && !rng_.chance(h_.immigrants)) breed(pick);
    // No child was accepted (or none was bred): a random config, unless all look riskier.
    if (!pick.accepted) immigrant(pick);
    return *pick.index;
  }

  // Children of two tournament winners (or mutants of one); those that look likely to fail are
  // rejected with that likelihood. Of the first `screened` accepted, the one predicted fastest.
  void breed(Pick& pick) {
    std::vector<std::size_t> children;
    for (int attempt = 0; attempt < h_.breed_attempts && children.size() < h_.screened; ++attempt) {
      Genome child = parent();
      bool mutate_it = true;
      if (ok_.size() >= 2 && rng_.chance(h_.crossover)) {
        const Genome& other = parent();
        for (std::size_t p = 0; p < child.size(); ++p)
          if (rng_.chance(0.5)) child[p] = other[p];
        mutate_it = rng_.chance(h_.mutate_after_crossover);
      }
      if (mutate_it) mutate(child);
      if (const std::optional<std::size_t> i = settle(std::move(child))) {
        if (std::find(children.begin(), children.end(), *i) != children.end()) continue;
        Pick one;
        consider(one, *i);
        if (one.accepted) children.push_back(*i);
        else if (one.risk < pick.risk) pick = one;
      }
    }
    if (children.empty()) return;
    auto faster = [&](std::size_t a, std::size_t b) { return predict(valid_.genome(a)) < predict(valid_.genome(b)); };
    pick = {*std::min_element(children.begin(), children.end(), faster), 0, true};
  }

  // The marginal model, relative log time: the sum over parameters of the mean log time of the ok
  // configs sharing g's value (shrunk towards the overall mean, so rare values count less), less
  // that mean. Crude (no interactions), but it only has to rank a few siblings.
  double predict(const Genome& g) const {
    const double mean = log_time_ / static_cast<double>(ok_.size());
    double sum = 0;
    for (std::size_t p = 0; p < g.size(); ++p) {
      const ValueStats& v = value(p, g);
      sum += (v.log_time + h_.shrink * mean) / (v.ok + h_.shrink) - mean;
    }
    return sum;
  }

  // Tournament among the elite (the fastest `population` ok results).
  const Genome& parent() {
    const std::size_t elite = std::min(ok_.size(), h_.population);
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
      const int n = sizes[p];
      if (n < 2) continue;
      if (rng_.chance(h_.jump)) {
        g[p] = static_cast<int>((static_cast<std::uint64_t>(g[p]) + 1 + rng_.below(static_cast<std::uint64_t>(n - 1))) %
                                static_cast<std::uint64_t>(n));
      } else {
        const bool up = g[p] == 0 || (g[p] < n - 1 && rng_.chance(0.5));
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

  // A random unseen config, drawn again (a few times) while it looks likely to fail.
  void immigrant(Pick& pick) {
    for (int attempt = 0; attempt < h_.immigrant_attempts && !pick.accepted; ++attempt)
      consider(pick, valid_.unseen(rng_.below(valid_.unseen_count())));
  }

  // Accepts candidate i with probability 1 - risk (never when taboo); else keeps it if it is the
  // least risky so far.
  void consider(Pick& pick, std::size_t i) {
    const double r = risk(valid_.genome(i));
    if (r < kTaboo && !rng_.chance(r)) pick = {i, r, true};
    else if (r < pick.risk) pick = {i, r, false};
  }

  // Learning from failures: how likely g is to fail, judged by its observed neighbours (configs one
  // parameter away: failures against successes) and by its parameter values (one that failed in
  // most of the configs that had it). A value that failed 3+ times and never worked is taboo: its
  // configs are proposed only when nothing else is left.
  static constexpr double kTaboo = 1;
  double risk(const Genome& g) const {
    double weight_near = 0, failed_near = 0, ok_near = 0;
    Genome h = g;
    for (std::size_t p = 0; p < g.size(); ++p) {
      for (int v = 0; v < valid_.domain_sizes()[p]; ++v) {
        if (v == g[p]) continue;
        h[p] = v;
        if (auto i = valid_.find(h)) {
          const Outcome o = outcome_[*i];
          ok_near += o == Outcome::kOk;
          failed_near += o == Outcome::kFailed || o == Outcome::kWrong;
          weight_near += o == Outcome::kFailed ? h_.reject_near_failure : o == Outcome::kWrong ? h_.reject_near_wrong : 0;
        }
      }
      h[p] = g[p];
    }
    // Only failures around: reject_near_*; as many successes as failures: half that.
    double r = failed_near > 0 ? weight_near / (failed_near + ok_near) : 0;
    for (std::size_t p = 0; p < g.size(); ++p) {
      const ValueStats& v = value(p, g);
      const int failed = v.tried - v.ok;
      if (failed >= 3 && v.ok == 0) return kTaboo;  // it never worked
      if (failed >= 2) r = std::max(r, static_cast<double>(failed) / static_cast<double>(v.tried + 1));
    }
    return r;
  }

  Hyper h_;
  ValidConfigs valid_;
  Rng rng_;
  std::deque<Genome> warm_;
  std::size_t proposed_ = 0;
  std::vector<Scored> ok_;  // fastest first
  std::vector<Outcome> outcome_;  // per valid config
  std::vector<std::vector<ValueStats>> values_;  // per parameter, per value
  double log_time_ = 0;                          // sum over ok_
  double best_us_ = std::numeric_limits<double>::infinity();
  std::size_t since_best_ = 0, burst_ = 0;
};

}  // namespace

std::unique_ptr<Strategy> make_evo(const StrategyContext& context) { return std::make_unique<Evo>(context); }

}  // namespace attntune::search
