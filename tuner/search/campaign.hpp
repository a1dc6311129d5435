// A campaign run: the loop of `attntune tune`. It asks the strategy for configs, keeps the runner's
// pipeline full, stores every result in its own transaction as it arrives (a SIGKILL loses at most
// the candidates in flight), feeds results back to the strategy, shows progress, and stops on a
// budget, on convergence, when the space is exhausted, or on Ctrl-C. At the end the top candidates
// are re-timed interleaved (round-robin, so drift in clocks or temperature hits them alike) and that
// ranking becomes the campaign's result.
//
// Resuming is re-running: everything the campaign already evaluated is fed to the strategy first
// and never submitted again.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/record_stores.hpp"
#include "core/records.hpp"
#include "search/progress.hpp"
#include "search/runner.hpp"
#include "space/search_space.hpp"

namespace attntune::search {

struct TuneOptions {
  std::string strategy = "evo";
  std::uint64_t seed = 1;
  std::int64_t budget_evals = 0;  // total for the campaign, earlier runs included; 0: none
  double budget_seconds = 0;      // for this run; 0: none
  // Converged: no improvement over min_gain_pct in the last `patience` evaluations (0: never).
  std::int64_t patience = 0;
  double min_gain_pct = 0.5;
  // The interleaved re-timing at the end. The best configs lie within 1-3%. With ~20 ms timings
  // its rounds spread 3-17% on the H100 suite (5 x 5 picked an s=16k config 2.4% slower than 8 x 9
  // did: docs/log/PERFORMANCE.md run 37); with each re-timing sampling >= 1 s
  // (GpuRunnerOptions::final_timing) a finalist's rounds spread 0.2-4.3% (run 72; 0.6-7% at
  // 0.3 s, runs 53, 57), and 8 x 6 ranks as steadily.
  int final_top = 8, final_rounds = 6;
  // Before those rounds, the fastest `final_screen` distinct configs by search time (more than
  // final_top; 0 or fewer: none) are re-timed once each, interleaved, for >= 0.3 s
  // (GpuRunnerOptions::screen_timing), and the final_top fastest of that screening go on to the
  // rounds. Search timings (~20 ms, the clock boosted after each idle gap) read 4-13% fast and
  // differently so from config to config: in run 244 the re-timed winners were the search's 2nd,
  // 6th, 7th, 3rd, 1st and 1st, and the search's 7th and 8th were the final's top two once: among
  // the fastest the search's order is weak, so the true best may rank past the 8th. One screening
  // of 24 costs ~10 s a campaign beside the rounds' ~50.
  int final_screen = 24;
  std::vector<Config> warm_start;       // for the strategy (the nearest tuned problem's best)
  // Per template, its best time on that problem where every template's nearest problem is the
  // same one (several templates: the warm-up's order and length follow it, AllocationOptions).
  std::map<std::string, double> warm_start_best_us;
};

// The signals a run watches: `stop` (first Ctrl-C / SIGTERM): submit nothing more, finish the
// candidate on the GPU, skip the re-timing; `abandon` (second Ctrl-C): the runner drops the
// candidate on the GPU too (the runner watches it itself).
struct StopFlags {
  const std::atomic<bool>* stop = nullptr;
  const std::atomic<bool>* abandon = nullptr;
};

struct TuneResult {
  std::string status;       // completed | stopped
  std::string stop_reason;  // "budget: 200 evaluations", "converged: ...", "interrupted", ...
  std::int64_t evaluations = 0, this_run = 0, ok = 0;
  std::vector<RankedRow> ranking;  // the campaign's result, best first (empty if not re-timed)
};

// Runs (or resumes) the campaign `spec` (already checked against the space and problem by the
// caller), recording it in `log` (tune passes the Store), and marks it completed or stopped. On an
// exception the campaign is marked failed with the reason and the exception propagates.
TuneResult run_campaign(CampaignLog& log, Runner& runner, const SearchSpace& space, const CampaignSpec& spec,
                        const TuneOptions& options, Progress& progress, StopFlags flags);
// A campaign over several template families (tune --space A --space B): `spaces` sorted by family
// as in spec.spaces, searched by a MultiFamily strategy (search/multi_family.hpp) through a runner
// that takes tagged configs; candidates of every family are stored under their own family and the
// arch the runner builds them for, and re-timed and ranked together at the end. With one space it
// is the campaign above.
TuneResult run_campaign(CampaignLog& log, Runner& runner, const std::vector<const SearchSpace*>& spaces,
                        const CampaignSpec& spec, const TuneOptions& options, Progress& progress, StopFlags flags);

}  // namespace attntune::search
