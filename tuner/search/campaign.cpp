#include "search/campaign.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

#include "core/text.hpp"
#include "search/multi_family.hpp"
#include "search/strategy.hpp"

namespace attntune::search {
namespace {

using Clock = std::chrono::steady_clock;

bool raised(const std::atomic<bool>* flag) { return flag && flag->load(); }

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

struct Retimed {
  Config config;
  std::string source_hash;
  std::vector<double> medians;
  double max_err = 0;
  bool failed = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

TuneResult run_campaign(Store& store, Runner& runner, const SearchSpace& space, const CampaignSpec& spec,
                        const TuneOptions& options, Progress& progress, StopFlags flags) {
  return run_campaign(store, runner, std::vector<const SearchSpace*>{&space}, spec, options, progress, flags);
}

TuneResult run_campaign(Store& store, Runner& runner, const std::vector<const SearchSpace*>& spaces,
                        const CampaignSpec& spec, const TuneOptions& options, Progress& progress, StopFlags flags) {
  if (spaces.empty()) throw std::logic_error("run_campaign: no search space");
  const bool mixed = spaces.size() > 1;
  const DeviceInfo& device = runner.device();
  const std::int64_t device_id = store.upsert_device(device);
  // Each family's results are filed under the arch its kernels were built for (a mixed campaign on
  // an H100: sm_90 for flash_fwd_mma, sm_90a for flash_fwd_wgmma).
  std::map<std::string, std::int64_t> device_of;
  for (const SearchSpace* s : spaces) {
    DeviceInfo d = device;
    d.arch = runner.arch_for(s->family());
    device_of[s->family()] = d.arch == device.arch ? device_id : store.upsert_device(d);
  }
  // A config as the strategy and the runner see it (tagged with its family when several), and back.
  auto as_seen = [&](const std::string& family, const Config& c) { return mixed ? tag_family(family, c) : c; };
  auto as_stored = [&](const Config& c) {
    return mixed ? untag_family(c) : std::pair<std::string, Config>{spaces[0]->family(), c};
  };
  const std::int64_t campaign_id = store.open_campaign(spec, device_id);
  try {
    TuneResult result;
    Tally tally;
    tally.min_gain_pct = options.min_gain_pct;
    tally.progress.budget_evals = options.budget_evals;
    tally.progress.budget_seconds = options.budget_seconds;

    std::unique_ptr<Strategy> strategy;
    const MultiFamily* families = nullptr;  // the allocation between families, when several
    if (mixed) {
      std::vector<FamilySpace> fs;
      for (const SearchSpace* s : spaces) fs.push_back({s->family(), s, runner.arch_for(s->family())});
      auto multi = std::make_unique<MultiFamily>(options.strategy, std::move(fs), spec.problem, options.seed,
                                                 options.warm_start);
      families = multi.get();
      strategy = std::move(multi);
    } else {
      StrategyContext context;
      context.space = spaces[0];
      context.problem = spec.problem;
      context.arch = device.arch;
      context.seed = options.seed;
      context.warm_start = options.warm_start;
      strategy = make_strategy(options.strategy, context);
    }

    // Resume: what the campaign evaluated before, in order, is the strategy's first knowledge.
    std::set<std::string> seen;  // config_str of everything evaluated or submitted: never twice
    for (const EvaluationRow& e : store.campaign_evaluations(campaign_id)) {
      const Config c = as_seen(e.family, e.config);
      strategy->observe(Trial{c, e.record.status, e.record.median_us});
      seen.insert(config_str(c));
      tally.add(e.record);
    }
    const std::int64_t resumed_from = tally.progress.evaluations;
    if (resumed_from > 0)
      progress.event(fmt::format("resuming campaign '{}': {} evaluations recorded, {} ok{}", spec.name, resumed_from,
                                 tally.ok(),
                                 tally.progress.best_us ? fmt::format(", best {:.1f} µs", *tally.progress.best_us) : ""));

    const auto t0 = Clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
    bool interrupted = false;
    std::string stop_reason;
    std::size_t last_capacity = 0;  // the runner's pipeline depth last reported
    for (;;) {
      tally.progress.elapsed_s = elapsed();
      if (stop_reason.empty()) {
        const std::int64_t done = tally.progress.evaluations;
        if (raised(flags.stop)) {
          interrupted = true;
          stop_reason = "interrupted";
        } else if (options.budget_evals > 0 && done >= options.budget_evals) {
          stop_reason = fmt::format("budget: {} evaluations", options.budget_evals);
        } else if (options.budget_seconds > 0 && tally.progress.elapsed_s >= options.budget_seconds) {
          stop_reason = fmt::format("time budget: {} of this run", format_duration(options.budget_seconds));
        } else if (options.patience > 0 && tally.ok() > 0 && done - tally.last_gain_at >= options.patience) {
          stop_reason = fmt::format("converged: no gain over {:g}% in the last {} evaluations (best since #{})",
                                    options.min_gain_pct, done - tally.last_gain_at, tally.last_gain_at);
        }
      }
      if (stop_reason.empty()) {
        // A GPU runner sizes its pipeline from measured build and GPU times; say so when that moves
        // by a quarter or more (not on every step of its running mean).
        const std::size_t capacity = runner.capacity();
        if (last_capacity == 0) {
          last_capacity = capacity;
        } else if (4 * (capacity > last_capacity ? capacity - last_capacity : last_capacity - capacity) >= last_capacity) {
          progress.event(fmt::format("proposals in flight: {} (was {})", capacity, last_capacity));
          last_capacity = capacity;
        }
        std::size_t room = capacity > runner.outstanding() ? capacity - runner.outstanding() : 0;
        if (options.budget_evals > 0) {
          const std::int64_t left =
              options.budget_evals - tally.progress.evaluations - static_cast<std::int64_t>(runner.outstanding());
          room = std::min<std::size_t>(room, static_cast<std::size_t>(std::max<std::int64_t>(0, left)));
        }
        if (room > 0) {
          for (Config& c : strategy->propose(room))
            if (seen.insert(config_str(c)).second) runner.submit(c);
        }
        if (runner.outstanding() == 0) {
          stop_reason = strategy->exhausted()
                            ? fmt::format("space exhausted: all {} valid configs evaluated", seen.size())
                            : "the strategy has nothing more to propose";
        }
      }
      if (interrupted || runner.outstanding() == 0) break;

      std::optional<RunResult> r = runner.next();
      if (!r) continue;
      if (r->abandoned) {
        interrupted = true;
        stop_reason = "interrupted (the candidate in flight was abandoned)";
        break;
      }
      {
        const auto [family, plain] = as_stored(r->config);
        const std::int64_t candidate = store.upsert_candidate(family, plain, r->source_hash);
        store.record_evaluation(campaign_id, candidate, device_of.at(family), r->record);
      }
      strategy->observe(Trial{r->config, r->record.status, r->record.median_us});
      ++tally.progress.this_run;
      tally.progress.elapsed_s = elapsed();
      if (tally.add(r->record))
        progress.event(fmt::format("#{} new best {:.1f} µs ({:.1f} TFLOP/s): {}", tally.progress.evaluations,
                                   *tally.progress.best_us, tally.progress.best_tflops.value_or(0),
                                   tagged_str(r->config)));
      progress.update(tally.progress);
    }
    if (families && tally.progress.this_run > 0) {
      std::vector<std::string> parts;
      for (const MultiFamily::FamilyStats& f : families->stats())
        parts.push_back(fmt::format("{} {} ({} ok{}{})", f.family, f.observed, f.ok,
                                    f.best_us ? fmt::format(", best {:.1f} µs", *f.best_us) : "",
                                    f.exhausted ? ", exhausted" : ""));
      progress.done();
      progress.event(fmt::format("evaluations by template: {}", fmt::join(parts, ", ")));
    }

    // The result: the top candidates re-timed interleaved, unless nothing changed since the last ranking.
    std::vector<RankedRow> ranking = store.ranking(campaign_id);
    if (!interrupted && tally.ok() > 0 && (tally.progress.this_run > 0 || ranking.empty()) && options.final_top > 0) {
      std::vector<Retimed> top;
      {
        std::vector<EvaluationRow> rows = store.campaign_evaluations(campaign_id);
        std::stable_sort(rows.begin(), rows.end(), [](const EvaluationRow& a, const EvaluationRow& b) {
          const bool ao = a.record.status == "ok", bo = b.record.status == "ok";
          if (ao != bo) return ao;
          return ao && *a.record.median_us < *b.record.median_us;
        });
        std::set<std::string> taken, families_in;
        for (const EvaluationRow& e : rows) {
          if (e.record.status != "ok" || static_cast<int>(top.size()) >= options.final_top) break;
          const Config c = as_seen(e.family, e.config);
          if (taken.insert(config_str(c)).second) top.push_back({c, "", {}, 0, false});
          families_in.insert(e.family);
        }
        // Several families: each one's best is re-timed too (beyond the top if need be), so the
        // ranking says how the best of each compares, measured alike.
        if (mixed)
          for (const EvaluationRow& e : rows) {
            if (e.record.status != "ok") break;
            if (families_in.insert(e.family).second) top.push_back({as_seen(e.family, e.config), "", {}, 0, false});
          }
      }
      progress.done();
      progress.event(fmt::format("re-timing the top {} interleaved, {} rounds", top.size(), options.final_rounds));
      runner.begin_final_timing();
      for (int round = 0; round < options.final_rounds && !interrupted; ++round) {
        for (Retimed& t : top) {
          if (raised(flags.stop)) {
            interrupted = true;
            break;
          }
          if (t.failed) continue;
          runner.submit(t.config);
          std::optional<RunResult> r = runner.next();
          if (!r || r->abandoned) {
            interrupted = true;
            break;
          }
          t.source_hash = r->source_hash;
          const auto [family, plain] = as_stored(r->config);
          const std::int64_t candidate = store.upsert_candidate(family, plain, r->source_hash);
          store.record_evaluation(campaign_id, candidate, device_of.at(family), r->record, Phase::kFinal);
          if (r->record.status != "ok") {
            t.failed = true;  // flaky: it failed where it once passed, so it cannot be the result
            progress.event(fmt::format("re-timing: {} failed this time ({}: {}); dropped from the ranking",
                                       tagged_str(t.config), r->record.status, one_line(r->record.error)));
            continue;
          }
          t.medians.push_back(*r->record.median_us);
          t.max_err = std::max(t.max_err, r->record.max_abs_err.value_or(0));
        }
        // A line a round: with >= 1 s a re-timing, the ranking takes most of a minute.
        if (interrupted) break;
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
        progress.event(fmt::format("re-timing round {}/{} done{}", round + 1, options.final_rounds,
                                   lead ? fmt::format("; leading: {:.1f} µs (median so far), {}", lead_us,
                                                      tagged_str(lead->config))
                                        : ""));
      }
      if (interrupted) {
        stop_reason += stop_reason.empty() ? "interrupted during the final re-timing"
                                           : "; interrupted during the final re-timing";
      } else {
        std::vector<RankingEntry> entries;
        for (const Retimed& t : top) {
          if (t.failed || t.medians.empty()) continue;
          RankingEntry e;
          const auto [family, plain] = as_stored(t.config);
          e.candidate_id = store.upsert_candidate(family, plain, t.source_hash);
          e.device_id = device_of.at(family);
          e.median_us = median(t.medians);
          e.tflops = spec.problem.flops() / (e.median_us * 1e-6) / 1e12;
          e.max_abs_err = t.max_err;
          const auto [lo, hi] = std::minmax_element(t.medians.begin(), t.medians.end());
          e.spread_pct = (*hi - *lo) / e.median_us * 100;
          e.rounds = static_cast<int>(t.medians.size());
          entries.push_back(e);
        }
        std::stable_sort(entries.begin(), entries.end(),
                         [](const RankingEntry& a, const RankingEntry& b) { return a.median_us < b.median_us; });
        store.put_ranking(campaign_id, device_id, entries);
      }
      ranking = store.ranking(campaign_id);
    }
    progress.done();

    result.status = interrupted ? "stopped" : "completed";
    result.stop_reason = stop_reason;
    result.evaluations = tally.progress.evaluations;
    result.this_run = tally.progress.this_run;
    result.ok = tally.ok();
    result.ranking = std::move(ranking);
    store.finish_campaign(campaign_id, result.status, result.stop_reason);
    return result;
  } catch (const std::exception& e) {
    try {
      store.finish_campaign(campaign_id, "failed", one_line(e.what()));
    } catch (...) {
      // The original error matters more than a failure to record it.
    }
    throw;
  }
}

}  // namespace attntune::search
