#include "search/campaign.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

#include "core/text.hpp"
#include "search/multi_family.hpp"
#include "search/retime.hpp"
#include "search/strategy.hpp"

namespace attntune::search {
namespace {

using Clock = std::chrono::steady_clock;

bool raised(const std::atomic<bool>* flag) { return flag && flag->load(); }

// Of `count` candidates in order (fastest first; family_of(k): the k-th one's template), the
// positions of the first `n` and, with several families, after them each family's first that is
// not among them: the finalists' rule, by search time (finalists()) and again by the screening.
template <class FamilyOf>
std::vector<std::size_t> top_and_family_bests(std::size_t count, int n, bool mixed, FamilyOf family_of) {
  std::vector<std::size_t> out;
  std::set<std::string> families_in;
  for (std::size_t k = 0; k < count; ++k) {
    if (static_cast<int>(k) >= n && (!mixed || families_in.count(family_of(k)))) continue;
    families_in.insert(family_of(k));
    out.push_back(k);
  }
  return out;
}

// What the campaign knows so far: counts, the best, and when it last improved enough to matter.
struct Tally {
  ProgressState progress;
  std::int64_t last_gain_at = 0;  // evaluation number of the last improvement over min_gain_pct
  double min_gain_pct = 0.5;

  // Counts one more search evaluation; returns true when it is a new best.
  bool add(const EvalRecord& r) {
    const std::int64_t seq = ++progress.evaluations;
    ++progress.by_status[r.status];
    if (r.status != "ok" || !r.median_us) return false;
    const double t = *r.median_us;
    if (progress.best_us && t >= *progress.best_us) return false;
    if (!progress.best_us || t < *progress.best_us * (1 - min_gain_pct / 100)) last_gain_at = seq;
    progress.best_us = t;
    progress.best_tflops = r.tflops;
    progress.best_at = seq;
    return true;
  }
  std::int64_t ok() const {
    auto it = progress.by_status.find("ok");
    return it == progress.by_status.end() ? 0 : it->second;
  }
};

// The campaign in the log: its id, the device each family's results are filed under, and the
// mapping between a config as the strategy and the runner see it (tagged with its family when
// several) and as it is stored.
class CampaignEntry {
 public:
  // Records the device(s) and opens (or resumes) the campaign.
  CampaignEntry(CampaignLog& log, Runner& runner, const std::vector<const SearchSpace*>& spaces,
                const CampaignSpec& spec)
      : log_(log), mixed_(spaces.size() > 1), first_family_(spaces[0]->family()) {
    const DeviceInfo& device = runner.device();
    device_id_ = log_.upsert_device(device);
    // Each family's results are filed under the arch its kernels were built for (a mixed campaign on
    // an H100: sm_90 for flash_fwd_mma, sm_90a for flash_fwd_wgmma).
    for (const SearchSpace* s : spaces) {
      DeviceInfo d = device;
      d.arch = runner.arch_for(s->family());
      device_of_[s->family()] = d.arch == device.arch ? device_id_ : log_.upsert_device(d);
    }
    id_ = log_.open_campaign(spec, device_id_);
  }

  CampaignLog& log() { return log_; }
  std::int64_t id() const { return id_; }
  std::int64_t device_id() const { return device_id_; }
  std::int64_t device_of(const std::string& family) const { return device_of_.at(family); }

  Config as_seen(const std::string& family, const Config& c) const { return mixed_ ? tag_family(family, c) : c; }
  std::pair<std::string, Config> as_stored(const Config& c) const {
    return mixed_ ? untag_family(c) : std::pair<std::string, Config>{first_family_, c};
  }

  // The candidate of a config as seen, built from `source_hash`.
  std::int64_t candidate(const Config& seen, const std::string& source_hash) {
    const auto [family, plain] = as_stored(seen);
    return log_.upsert_candidate(family, plain, source_hash);
  }
  // One result, in its own transaction.
  void record(const RunResult& r, Phase phase) {
    const auto [family, plain] = as_stored(r.config);
    const std::int64_t candidate = log_.upsert_candidate(family, plain, r.source_hash);
    log_.record_evaluation(id_, candidate, device_of_.at(family), r.record, phase);
  }
  // A re-timing of the final ranking as it will be recorded, with its ranking (put_final).
  FinalEvaluation final_row(const RunResult& r) {
    const auto [family, plain] = as_stored(r.config);
    return {log_.upsert_candidate(family, plain, r.source_hash), device_of_.at(family), r.record};
  }

 private:
  CampaignLog& log_;
  bool mixed_;
  std::string first_family_;
  std::int64_t device_id_ = 0, id_ = 0;
  std::map<std::string, std::int64_t> device_of_;
};

// One run of a campaign, from the strategy's first knowledge to its result.
class CampaignRun {
 public:
  CampaignRun(CampaignEntry& entry, Runner& runner, const std::vector<const SearchSpace*>& spaces,
              const CampaignSpec& spec, const TuneOptions& options, Progress& progress, StopFlags flags)
      : entry_(entry), runner_(runner), spaces_(spaces), spec_(spec), options_(options), progress_(progress),
        flags_(flags), mixed_(spaces.size() > 1) {
    tally_.min_gain_pct = options.min_gain_pct;
    tally_.progress.budget_evals = options.budget_evals;
    tally_.progress.budget_seconds = options.budget_seconds;
  }

  TuneResult run() {
    make_campaign_strategy();
    resume();
    search();
    report_families();
    std::vector<RankedRow> ranking = final_ranking();
    progress_.done();

    TuneResult result;
    result.status = interrupted_ ? "stopped" : "completed";
    result.stop_reason = stop_reason_;
    result.evaluations = tally_.progress.evaluations;
    result.this_run = tally_.progress.this_run;
    result.ok = tally_.ok();
    result.ranking = std::move(ranking);
    return result;
  }

 private:
  // One strategy, or with several families a MultiFamily with one inner strategy each.
  void make_campaign_strategy() {
    if (mixed_) {
      std::vector<FamilySpace> fs;
      for (const SearchSpace* s : spaces_) fs.push_back({s->family(), s, runner_.arch_for(s->family())});
      AllocationOptions allocation;
      allocation.prior_us = options_.warm_start_best_us;
      auto multi = std::make_unique<MultiFamily>(options_.strategy, std::move(fs), spec_.problem, options_.seed,
                                                 options_.warm_start, allocation);
      families_ = multi.get();
      strategy_ = std::move(multi);
    } else {
      StrategyContext context;
      context.space = spaces_[0];
      context.problem = spec_.problem;
      context.arch = runner_.device().arch;
      context.seed = options_.seed;
      context.warm_start = options_.warm_start;
      strategy_ = make_strategy(options_.strategy, context);
    }
  }

  // Resume: what the campaign evaluated before, in order, is the strategy's first knowledge.
  void resume() {
    for (const EvaluationRow& e : entry_.log().campaign_evaluations(entry_.id())) {
      const Config c = entry_.as_seen(e.family, e.config);
      strategy_->observe(Trial{c, e.record.status, e.record.median_us});
      seen_.insert(config_str(c));
      tally_.add(e.record);
    }
    const std::int64_t resumed_from = tally_.progress.evaluations;
    if (resumed_from > 0)
      progress_.event(fmt::format("resuming campaign '{}': {} evaluations recorded, {} ok{}", spec_.name,
                                  resumed_from, tally_.ok(),
                                  tally_.progress.best_us ? fmt::format(", best {:.1f} µs", *tally_.progress.best_us)
                                                          : ""));
  }

  // Why the search stops now (a signal, a budget, convergence), or "" to go on.
  std::string stop_condition() {
    const std::int64_t done = tally_.progress.evaluations;
    if (raised(flags_.stop)) {
      interrupted_ = true;
      return "interrupted";
    }
    if (options_.budget_evals > 0 && done >= options_.budget_evals)
      return fmt::format("budget: {} evaluations", options_.budget_evals);
    if (options_.budget_seconds > 0 && tally_.progress.elapsed_s >= options_.budget_seconds)
      return fmt::format("time budget: {} of this run", format_duration(options_.budget_seconds));
    if (options_.patience > 0 && tally_.ok() > 0 && done - tally_.last_gain_at >= options_.patience)
      return fmt::format("converged: no gain over {:g}% in the last {} evaluations (best since #{})",
                         options_.min_gain_pct, done - tally_.last_gain_at, tally_.last_gain_at);
    return "";
  }

  // Keeps the runner's pipeline full: as many proposals as it has room for (within the budget),
  // none submitted twice. Sets the stop reason when nothing is left to run.
  void top_up() {
    // A GPU runner sizes its pipeline from measured build and GPU times; say so when that moves by a
    // quarter or more (not on every step of its running mean).
    const std::size_t capacity = runner_.capacity();
    if (last_capacity_ == 0) {
      last_capacity_ = capacity;
    } else if (4 * (capacity > last_capacity_ ? capacity - last_capacity_ : last_capacity_ - capacity) >=
               last_capacity_) {
      progress_.event(fmt::format("proposals in flight: {} (was {})", capacity, last_capacity_));
      last_capacity_ = capacity;
    }
    std::size_t room = capacity > runner_.outstanding() ? capacity - runner_.outstanding() : 0;
    if (options_.budget_evals > 0) {
      const std::int64_t left =
          options_.budget_evals - tally_.progress.evaluations - static_cast<std::int64_t>(runner_.outstanding());
      room = std::min<std::size_t>(room, static_cast<std::size_t>(std::max<std::int64_t>(0, left)));
    }
    if (room > 0) {
      for (Config& c : strategy_->propose(room))
        if (seen_.insert(config_str(c)).second) runner_.submit(c);
    }
    if (runner_.outstanding() == 0) {
      stop_reason_ = strategy_->exhausted()
                         ? fmt::format("space exhausted: all {} valid configs evaluated", seen_.size())
                         : "the strategy has nothing more to propose";
    }
  }

  double elapsed() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

  // A search result: recorded, observed, counted and shown.
  void take(const RunResult& r) {
    entry_.record(r, Phase::kSearch);
    strategy_->observe(Trial{r.config, r.record.status, r.record.median_us});
    ++tally_.progress.this_run;
    tally_.progress.elapsed_s = elapsed();
    if (tally_.add(r.record))
      progress_.event(fmt::format("#{} new best {:.1f} µs ({:.1f} TFLOP/s): {}", tally_.progress.evaluations,
                                  *tally_.progress.best_us, tally_.progress.best_tflops.value_or(0),
                                  tagged_str(r.config)));
    progress_.update(tally_.progress);
  }

  // The search: proposals run ahead of results until a stop condition, then what is in flight is
  // drained (unless interrupted).
  void search() {
    t0_ = Clock::now();
    for (;;) {
      tally_.progress.elapsed_s = elapsed();
      if (stop_reason_.empty()) stop_reason_ = stop_condition();
      if (stop_reason_.empty()) top_up();
      if (interrupted_ || runner_.outstanding() == 0) break;

      std::optional<RunResult> r = runner_.next();
      if (!r) continue;
      if (r->abandoned) {
        interrupted_ = true;
        stop_reason_ = "interrupted (the candidate in flight was abandoned)";
        break;
      }
      take(*r);
    }
  }

  // Several families: how the evaluations were shared out.
  void report_families() {
    if (!families_ || tally_.progress.this_run == 0) return;
    std::vector<std::string> parts;
    for (const MultiFamily::FamilyStats& f : families_->stats())
      parts.push_back(fmt::format("{} {} ({} ok{}{})", f.family, f.observed, f.ok,
                                  f.best_us ? fmt::format(", best {:.1f} µs", *f.best_us) : "",
                                  f.exhausted ? ", exhausted" : ""));
    progress_.done();
    progress_.event(fmt::format("evaluations by template: {}", fmt::join(parts, ", ")));
  }

  // The fastest distinct ok configs (final_top of them; with a screening, the fastest
  // max(final_top, final_screen)) and, with several families, each one's best too (beyond the top
  // if need be), so the ranking says how the best of each compares, measured alike. `by_search`:
  // how many came by search time (the first of `top`; the rest are families' bests).
  struct Finalists {
    std::vector<Retimed> top;
    std::size_t by_search = 0;
  };
  Finalists finalists() {
    const int n = std::max(options_.final_top, options_.final_screen);
    const std::vector<EvaluationRow> rows = entry_.log().campaign_evaluations(entry_.id());
    auto as_seen = [this](const EvaluationRow& e) { return entry_.as_seen(e.family, e.config); };
    // With several families, all of them in order: each family's fastest is its first.
    std::vector<Retimed> ordered = fastest_distinct(rows, mixed_ ? static_cast<int>(rows.size()) : n, as_seen);
    Finalists f;
    f.by_search = std::min(ordered.size(), static_cast<std::size_t>(n));
    for (std::size_t k : top_and_family_bests(ordered.size(), n, mixed_, [&](std::size_t i) { return ordered[i].family; }))
      f.top.push_back(std::move(ordered[k]));
    return f;
  }

  // One re-timing of each finalist, interleaved; a finalist that fails is dropped. Sets
  // interrupted_ on a stop or an abandoned candidate. The screening's (`screening`) stores only
  // its failures: its timings choose the finalists and are not results, so a campaign's ok final
  // rows stay its ranking's rounds, one a finalist a round.
  void retime_round(std::vector<Retimed>& top, bool screening = false) {
    const bool done = search::retime_round(
        runner_, top, [this] { return raised(flags_.stop); },
        [this, screening](Retimed& t, const RunResult& r) {
          // Kept until the ranking is decided, then written with it in one transaction: a kill or a
          // stop before that leaves no final rows without a ranking, and a resume re-times afresh.
          if (!screening || r.record.status != "ok") finals_.push_back(entry_.final_row(r));
          if (r.record.status != "ok")  // flaky: it failed where it once passed, so it cannot be the result
            progress_.event(fmt::format("re-timing: {} failed this time ({}: {}); dropped from the ranking",
                                        tagged_str(t.config), r.record.status, one_line(r.record.error)));
        });
    if (!done) interrupted_ = true;
  }

  // A line a round: with >= 1 s a re-timing, the ranking takes most of a minute.
  void report_round(int round, const std::vector<Retimed>& top) {
    const Retimed* lead = nullptr;
    double lead_us = 0;
    for (const Retimed& t : top) {
      if (t.failed || t.medians.empty()) continue;
      const double m = median(t.medians);
      if (!lead || m < lead_us) {
        lead = &t;
        lead_us = m;
      }
    }
    progress_.event(fmt::format("re-timing round {}/{} done{}", round + 1, options_.final_rounds,
                                lead ? fmt::format("; leading: {:.1f} µs (median so far), {}", lead_us,
                                                   tagged_str(lead->config))
                                     : ""));
  }

  // The finalists that held, fastest median over the rounds first, as the campaign's result.
  void put_ranking(const std::vector<Retimed>& top) {
    std::vector<RankingEntry> entries;
    for (const Retimed& t : top) {
      if (t.failed || t.medians.empty()) continue;
      RankingEntry e;
      e.candidate_id = entry_.candidate(t.config, t.source_hash);
      e.device_id = entry_.device_of(entry_.as_stored(t.config).first);
      e.median_us = median(t.medians);
      e.tflops = spec_.problem.flops() / (e.median_us * 1e-6) / 1e12;
      e.max_abs_err = t.max_err;
      const auto [lo, hi] = std::minmax_element(t.medians.begin(), t.medians.end());
      e.spread_pct = (*hi - *lo) / e.median_us * 100;
      e.rounds = static_cast<int>(t.medians.size());
      entries.push_back(e);
    }
    std::stable_sort(entries.begin(), entries.end(),
                     [](const RankingEntry& a, const RankingEntry& b) { return a.median_us < b.median_us; });
    entry_.log().put_final(entry_.id(), entry_.device_id(), finals_, entries);
  }

  // The screening (TuneOptions::final_screen): each of `top` re-timed once, interleaved; those
  // that failed are dropped, and the final_top fastest of the others stay (with several families,
  // each family's fastest too, as finalists() keeps them), their screening medians cleared for the
  // rounds. Of its re-timings only the failures are stored (with the ranking's rows). Sets
  // interrupted_ on a stop.
  void screen(std::vector<Retimed>& top, std::size_t by_search) {
    progress_.done();
    progress_.event(fmt::format("screening the top {} by search time: one re-timing each, interleaved", top.size()));
    runner_.begin_screen_timing();
    retime_round(top, true);
    if (interrupted_) return;
    std::vector<std::size_t> order;  // search rank (top's order) of each screened config, fastest screening first
    for (std::size_t i = 0; i < top.size(); ++i)
      if (!top[i].failed && !top[i].medians.empty()) order.push_back(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return top[a].medians[0] < top[b].medians[0]; });
    std::vector<Retimed> kept;
    std::vector<std::string> ranks;
    for (std::size_t k : top_and_family_bests(order.size(), options_.final_top, mixed_,
                                              [&](std::size_t j) { return top[order[j]].family; })) {
      const std::size_t i = order[k];
      // A template's best beyond the fastest (finalists()): its rank among all is not counted.
      ranks.push_back(i < by_search ? std::to_string(i + 1) : top[i].family + "'s best");
      kept.push_back(std::move(top[i]));
      kept.back().medians.clear();
      kept.back().max_err = 0;
    }
    progress_.event(fmt::format("screening kept {} of {} (their search ranks: {})", kept.size(), top.size(),
                                fmt::join(ranks, ", ")));
    top = std::move(kept);
  }

  // The result: the top candidates re-timed interleaved, unless nothing changed since the last
  // ranking (or the run was interrupted, or nothing passed).
  std::vector<RankedRow> final_ranking() {
    std::vector<RankedRow> ranking = entry_.log().ranking(entry_.id());
    if (interrupted_ || tally_.ok() == 0 || (tally_.progress.this_run == 0 && !ranking.empty()) ||
        options_.final_top <= 0)
      return ranking;
    Finalists f = finalists();
    std::vector<Retimed>& top = f.top;
    if (options_.final_screen > options_.final_top && static_cast<int>(f.by_search) > options_.final_top)
      screen(top, f.by_search);
    if (!interrupted_) {
      progress_.done();
      progress_.event(fmt::format("re-timing the top {} interleaved, {} rounds", top.size(), options_.final_rounds));
      runner_.begin_final_timing();
    }
    for (int round = 0; round < options_.final_rounds && !interrupted_; ++round) {
      retime_round(top);
      if (interrupted_) break;
      report_round(round, top);
    }
    if (interrupted_)
      stop_reason_ += stop_reason_.empty() ? "interrupted during the final re-timing"
                                           : "; interrupted during the final re-timing";
    else
      put_ranking(top);
    return entry_.log().ranking(entry_.id());
  }

  CampaignEntry& entry_;
  Runner& runner_;
  const std::vector<const SearchSpace*>& spaces_;
  const CampaignSpec& spec_;
  const TuneOptions& options_;
  Progress& progress_;
  StopFlags flags_;
  bool mixed_;

  std::unique_ptr<Strategy> strategy_;
  const MultiFamily* families_ = nullptr;  // the allocation between families, when several
  Tally tally_;
  std::set<std::string> seen_;  // config_str of everything evaluated or submitted: never twice
  std::vector<FinalEvaluation> finals_;  // the final re-timing's results, until put_final
  bool interrupted_ = false;
  std::string stop_reason_;
  std::size_t last_capacity_ = 0;  // the runner's pipeline depth last reported
  Clock::time_point t0_;           // the search's start (budget_seconds counts from here)
};

}  // namespace

TuneResult run_campaign(CampaignLog& log, Runner& runner, const SearchSpace& space, const CampaignSpec& spec,
                        const TuneOptions& options, Progress& progress, StopFlags flags) {
  return run_campaign(log, runner, std::vector<const SearchSpace*>{&space}, spec, options, progress, flags);
}

TuneResult run_campaign(CampaignLog& log, Runner& runner, const std::vector<const SearchSpace*>& spaces,
                        const CampaignSpec& spec, const TuneOptions& options, Progress& progress, StopFlags flags) {
  if (spaces.empty()) throw std::logic_error("run_campaign: no search space");
  CampaignEntry entry(log, runner, spaces, spec);
  try {
    TuneResult result = CampaignRun(entry, runner, spaces, spec, options, progress, flags).run();
    log.finish_campaign(entry.id(), result.status, result.stop_reason);
    return result;
  } catch (const std::exception& e) {
    try {
      log.finish_campaign(entry.id(), "failed", one_line(e.what()));
    } catch (...) {
      // The original error matters more than a failure to record it.
    }
    throw;
  }
}

}  // namespace attntune::search
