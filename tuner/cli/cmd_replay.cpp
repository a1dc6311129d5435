// attntune replay: a strategy run against the recorded results of an exhaustive campaign instead of
// a GPU, over many seeds, next to random search: how many evaluations each needs to come within X%
// of the campaign's optimum (search/replay.hpp has the rules). Reads the database read-only.
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "cli/format.hpp"
#include "core/error.hpp"
#include "db/store.hpp"
#include "search/recorded.hpp"
#include "search/replay.hpp"
#include "search/strategy.hpp"
#include "search/warm_start.hpp"

namespace attntune::cli::cmd_replay {

namespace {

constexpr const char* kSummary = "replay a strategy over a recorded exhaustive campaign (no GPU)";
constexpr const char* kRules =
    "\nEach seed (--seed, --seed + 1, ...) runs the strategy with --pipeline proposals in flight, as tune\n"
    "does: top up to N outstanding, then observe the oldest. Evaluations-to-target counts every\n"
    "evaluation, failures included, up to the first ok result within --target-pct of the optimum (the\n"
    "fastest recorded ok median). A seed that does not reach it within --budget counts as not reached\n"
    "(reached_fraction) and as budget + 1 in the median and p90 (nearest rank). Random search runs on\n"
    "the same seeds and pipeline as the baseline. The campaign must hold every valid config of its\n"
    "space; with --partial, configs it did not record are skipped (neither counted nor observed).";

nlohmann::ordered_json stats_json(const search::ReplayStats& s) {
  return {{"strategy", s.strategy},
          {"median_evals", s.median_evals},
          {"p90_evals", s.p90_evals},
          {"reached_fraction", s.reached_fraction},
          {"space_fraction", s.space_fraction},
          {"evals", s.evals}};
}

// Medians of an even number of seeds may end in .5.
std::string evals_text(double v) { return fmt::format("{:g}", v); }

int run_replay(const std::vector<std::string>& args) {
  std::string db_path, campaign, strategy, format, warm_from;
  std::int64_t seeds = 30, seed = 1, budget = 0, pipeline = 8;
  double target_pct = 2;
  po::options_description opts("options");
  // clang-format off
  opts.add_options()
      ("db", po::value(&db_path)->default_value(default_db_path()), "database ($ATTNTUNE_DB, else ./attntune.db)")
      ("campaign", po::value(&campaign)->required(), "the recorded exhaustive campaign")
      ("strategy", po::value(&strategy)->default_value("evo"), "evo, random or exhaustive")
      ("seeds", po::value(&seeds)->default_value(30), "how many seeds to run")
      ("seed", po::value(&seed)->default_value(1), "the first seed")
      ("target-pct", po::value(&target_pct)->default_value(2), "target: within this many % of the optimum")
      ("budget", po::value(&budget)->default_value(0), "evaluations per seed (0: the size of the space)")
      ("pipeline", po::value(&pipeline)->default_value(8), "proposals in flight")
      ("warm-from", po::value(&warm_from), "seed the strategy with the best configs of this other campaign, as many as tune takes")
      ("partial", po::bool_switch(), "replay a campaign that lacks some valid configs: skip them")
      ("format", po::value(&format)->default_value("table"), "table or json");
  // clang-format on
  po::variables_map vm;
  if (parse_args("replay", std::string(kSummary) + "\n" + kRules, opts, args, vm)) return 0;
  const Format kind = parse_format(format, false);
  if (seeds < 1) throw InputError(fmt::format("replay: --seeds must be at least 1 (got {})", seeds));
  if (seed < 0) throw InputError(fmt::format("replay: --seed must be >= 0 (got {})", seed));
  if (budget < 0) throw InputError(fmt::format("replay: --budget must be >= 0 (got {})", budget));
  if (pipeline < 1) throw InputError(fmt::format("replay: --pipeline must be at least 1 (got {})", pipeline));
  if (!(target_pct >= 0 && target_pct < 1e6))
    throw InputError(fmt::format("replay: --target-pct must be a number >= 0 (got {})", target_pct));

  search::ReplayOptions o;
  o.strategy = strategy;
  o.seeds = static_cast<int>(std::min<std::int64_t>(seeds, 1'000'000));
  o.seed = static_cast<std::uint64_t>(seed);
  o.target_pct = target_pct;
  o.budget = static_cast<std::uint64_t>(budget);
  o.pipeline = static_cast<std::size_t>(pipeline);
  o.partial = vm["partial"].as<bool>();
  const std::vector<std::string> names = search::strategy_names();
  if (std::find(names.begin(), names.end(), strategy) == names.end())
    throw InputError(fmt::format("replay: unknown strategy '{}' (known: {})", strategy, fmt::join(names, ", ")));

  Store store = Store::open(db_path, Store::Mode::kReadOnly);
  const search::RecordedCampaign recorded = search::RecordedCampaign::load(store, campaign);
  if (vm.count("warm-from")) {
    if (warm_from == campaign)
      throw InputError("replay: --warm-from names the replayed campaign itself, which would hand it the answer");
    if (!store.find_campaign(warm_from))
      throw InputError(fmt::format("no campaign '{}' in database '{}' (attntune campaigns lists them)", warm_from, db_path));
    BestQuery q;
    q.campaign = warm_from;
    o.warm_start = search::warm_start_configs(store, q, recorded.space.family());
  }

  const search::Landscape landscape = search::landscape_of(recorded);
  const search::ReplaySummary summary = search::summarize(landscape, o);
  const search::ReplayStats stats = search::replay(landscape, o);
  search::ReplayOptions baseline = o;
  baseline.strategy = "random";
  baseline.warm_start.clear();
  const search::ReplayStats random = strategy == "random" ? stats : search::replay(landscape, baseline);
  const double speedup = stats.median_evals > 0 ? random.median_evals / stats.median_evals : 0;

  if (kind == Format::kJson) {
    nlohmann::ordered_json j = {{"campaign", campaign},
                                {"strategy", strategy},
                                {"seeds", seeds},
                                {"seed", seed},
                                {"target_pct", target_pct},
                                {"pipeline", pipeline},
                                {"budget", summary.budget},
                                {"space_size", summary.space_size},
                                {"recorded", summary.recorded},
                                {"optimum_us", summary.optimum_us},
                                {"target_us", summary.target_us},
                                {"median_evals", stats.median_evals},
                                {"p90_evals", stats.p90_evals},
                                {"reached_fraction", stats.reached_fraction},
                                {"space_fraction", stats.space_fraction},
                                {"speedup_vs_random", speedup},
                                {"warm_start", o.warm_start.size()},
                                {"evals", stats.evals},
                                {"random", stats_json(random)}};
    print_json(std::cout, j);
    return 0;
  }
  std::cout << fmt::format(
      "campaign '{}': {} on {} ({}), {} valid configs, optimum {} µs\n"
      "evaluations to within {}% ({} µs), {} seeds from {}, {} in flight, budget {}\n\n",
      campaign, recorded.problem.str(), recorded.gpu, recorded.arch, summary.space_size, format_us(summary.optimum_us),
      format_exact(target_pct), format_us(summary.target_us), seeds, seed, pipeline, summary.budget);
  Table t({"strategy", "median", "p90", "reached", "% of space", "speedup"});
  auto row = [&](const search::ReplayStats& s) {
    t.add_row({s.strategy, evals_text(s.median_evals), evals_text(s.p90_evals),
               fmt::format("{:.0f}%", 100 * s.reached_fraction), fmt::format("{:.1f}", 100 * s.space_fraction),
               fmt::format("{:.2f}x", s.median_evals > 0 ? random.median_evals / s.median_evals : 0)});
  };
  row(stats);
  if (strategy != "random") row(random);
  t.print(std::cout);
  return 0;
}

const bool registered = register_command({"replay", kSummary, false, run_replay});

}  // namespace

}  // namespace attntune::cli::cmd_replay
