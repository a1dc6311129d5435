#include "cli/job_options.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/text.hpp"
#include "eval/gpu_runner.hpp"
#include "search/campaign.hpp"
#include "search/progress.hpp"
#include "search/strategy.hpp"
#include "search/warm_start.hpp"

namespace attntune::cli {

void add_limit_options(po::options_description& opts, double& compile_timeout_s, double& deadline_floor_s) {
  opts.add_options()
      ("compile-timeout", po::value(&compile_timeout_s), "seconds before a hanging NVRTC compile is killed (default 120)")
      ("deadline-floor", po::value(&deadline_floor_s), "least seconds a candidate may run before it is killed (default "
                                                       "10; a timing's own length is added)");
}

void check_limit_options(double compile_timeout_s, double deadline_floor_s, const std::string& command) {
  if (compile_timeout_s <= 0 || deadline_floor_s <= 0 || compile_timeout_s > 86400 || deadline_floor_s > 86400)
    throw InputError(command + ": --compile-timeout and --deadline-floor must be positive and at most a day (86400 s)");
}

void add_network_fs_option(po::options_description& opts, bool& allow_network_fs) {
  opts.add_options()
      ("allow-network-fs", po::bool_switch(&allow_network_fs),
       "use a database on a network filesystem (NFS, SMB/CIFS, sshfs, Lustre, ...), where SQLite's locks do not hold "
       "between hosts: only when no other host ever opens it; several hosts: a database each, then `attntune merge`");
}

void add_job_options(po::options_description& opts, JobOptionValues& v) {
  const search::TuneOptions defaults;  // the final re-timing's defaults live there, with their reason
  v.final_top = defaults.final_top;
  v.final_rounds = defaults.final_rounds;
  v.final_screen = defaults.final_screen;
  v.warm = static_cast<int>(search::kWarmStartConfigs);
  v.final_min_seconds = GpuRunnerOptions{}.final_timing.min_seconds;
  opts.add_options()
      ("strategy", po::value(&v.strategy), "evo | random | exhaustive (default evo)")
      ("budget-evals", po::value(&v.budget_evals), "stop at this many evaluations in the campaign, earlier runs included")
      ("budget-time", po::value(&v.budget_time), "stop this run after this long: 90s, 45m, 8h")
      ("seed", po::value(&v.seed), "seed of the strategy and of the validation inputs (default 1)")
      ("patience", po::value(&v.patience), "converged after this many evaluations without a gain over --min-gain "
                                           "(default: max(50, an eighth of the space); exhaustive: 0, never)")
      ("min-gain", po::value(&v.min_gain), "the gain in percent that counts as progress (default 0.5)")
      ("final-top", po::value(&v.final_top),
       fmt::format("re-time this many of the best at the end (default {}; 0: skip)", v.final_top).c_str())
      ("final-rounds", po::value(&v.final_rounds),
       fmt::format("interleaved rounds of that re-timing (default {})", v.final_rounds).c_str())
      ("final-screen", po::value(&v.final_screen),
       fmt::format("first re-time this many of the best once each (>= 0.3 s), and take the --final-top fastest of "
                   "them to the rounds (default {}; at most --final-top: none)", v.final_screen).c_str())
      ("warm-start", po::value(&v.warm),
       fmt::format("seed evo with this many best configs of the nearest tuned problems (default {}; 0: none)", v.warm)
           .c_str())
      ("max-seconds", po::value(&v.max_seconds), "cap on each candidate's timing, in seconds (default 1)")
      ("min-seconds", po::value(&v.min_seconds), "least time each search candidate's timing samples, in seconds "
                                                 "(default 0: until its median holds within 1%; 0.1 makes search "
                                                 "times read as sustained ones)")
      ("final-min-seconds", po::value(&v.final_min_seconds),
       fmt::format("least time each re-timing of the final ranking samples, in seconds (default {:g}): the clock "
                   "swings under the GPU's power cap", v.final_min_seconds).c_str());
}

JobRequest check_job_options(const JobOptionValues& v, const po::variables_map& vm, const std::string& command) {
  if (v.budget_evals < 0) throw InputError(fmt::format("{}: --budget-evals must not be negative", command));
  if (v.patience < -1) throw InputError(fmt::format("{}: --patience must not be negative", command));
  if (v.final_top < 0 || v.final_screen < 0 || v.warm < 0)
    throw InputError(fmt::format("{}: --final-top, --final-screen and --warm-start must not be negative", command));
  if (v.final_rounds < 1) throw InputError(fmt::format("{}: --final-rounds must be at least 1", command));
  if (v.max_seconds <= 0 || v.min_gain < 0)
    throw InputError(fmt::format("{}: --max-seconds must be positive, --min-gain >= 0", command));
  // Each must lie within [0, --max-seconds] when given; the final default yields to a smaller --max-seconds.
  if (v.min_seconds < 0 || v.final_min_seconds < 0 || v.min_seconds > v.max_seconds ||
      (vm.count("final-min-seconds") && v.final_min_seconds > v.max_seconds))
    throw InputError(fmt::format("{}: --min-seconds ({:g}) and --final-min-seconds ({:g}) must lie between 0 and "
                                 "--max-seconds ({:g})",
                                 command, v.min_seconds, v.final_min_seconds, v.max_seconds));
  const auto names = search::strategy_names();
  if (std::find(names.begin(), names.end(), v.strategy) == names.end())
    throw InputError(fmt::format("{}: unknown strategy '{}' (known: {})", command, v.strategy, fmt::join(names, ", ")));
  JobRequest r;
  r.strategy = v.strategy;
  r.seed = v.seed;
  r.budget_evals = v.budget_evals;
  r.budget_seconds = v.budget_time.empty() ? 0 : parse_duration(v.budget_time, command + ": --budget-time");
  r.patience = v.patience;
  r.min_gain_pct = v.min_gain;
  r.final_top = v.final_top;
  r.final_rounds = v.final_rounds;
  r.final_screen = v.final_screen;
  r.warm = v.warm;
  r.max_seconds = v.max_seconds;
  r.min_seconds = v.min_seconds;
  r.final_min_seconds = std::min(v.final_min_seconds, v.max_seconds);
  return r;
}

}  // namespace attntune::cli
