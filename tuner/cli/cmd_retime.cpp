// attntune retime: does a campaign's pick hold up? Its fastest distinct configs (the search's
// medians) and its pick (what `best` and `export` give) are re-timed on this GPU side by side, one
// long timing each per round, interleaved, and ranked again. The answer is how far the pick lies
// behind the fastest of them. The campaign itself is only read: its evaluations and ranking stay
// as they are (the builds go to the database's cache, as tune's do). Exit 1 when --tolerance is
// given and the pick lies further behind, or when the pick fails its re-timing.
#include <algorithm>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "cli/format.hpp"
#include "cli/job_options.hpp"
#include "core/error.hpp"
#include "cuda/driver.hpp"
#include "db/store.hpp"
#include "eval/gpu_runner.hpp"
#include "search/multi_family.hpp"
#include "search/retime.hpp"
#include "service/job.hpp"

namespace attntune::cli::cmd_retime {
namespace {

constexpr const char* kSummary = "re-time a campaign's best configs side by side: does its pick hold up?";

struct RetimeArgs {
  std::string db_path, campaign, format = "table";
  int top = 20, rounds = 2, device = 0, jobs = 0;
  double min_seconds = 3, compile_timeout_s = 120, deadline_floor_s = 10;
  std::optional<double> tolerance_pct;
};

// A re-timed config: whether it held (every round passed), its median over the rounds and their spread.
bool held(const search::Retimed& t) { return !t.failed && !t.medians.empty(); }
double retimed_us(const search::Retimed& t) { return search::median(t.medians); }
double spread_pct(const search::Retimed& t) {
  const auto [lo, hi] = std::minmax_element(t.medians.begin(), t.medians.end());
  return (*hi - *lo) / retimed_us(t) * 100;
}

RetimeArgs parse(const std::vector<std::string>& args, bool& help) {
  RetimeArgs a;
  double tolerance = -1;
  po::options_description opts("options");
  // clang-format off
  opts.add_options()
      ("db", po::value(&a.db_path)->default_value(default_db_path()), "database ($ATTNTUNE_DB, else ./attntune.db)")
      ("campaign", po::value(&a.campaign)->required(), "the campaign whose pick is re-timed")
      ("top", po::value(&a.top)->default_value(20), "how many of its fastest distinct configs (search medians) "
                                                    "to re-time beside the pick")
      ("rounds", po::value(&a.rounds)->default_value(2), "interleaved rounds: each config timed once a round")
      ("min-seconds", po::value(&a.min_seconds)->default_value(3), "least time each timing samples, in seconds")
      ("tolerance", po::value(&tolerance), "exit 1 when the pick lies more than this many percent behind the fastest")
      ("device", po::value(&a.device), "CUDA device ordinal (default 0)")
      ("jobs", po::value(&a.jobs), "concurrent NVRTC compiles (default: one per core)")
      ("format", po::value(&a.format), "table | json | csv");
  // clang-format on
  add_limit_options(opts, a.compile_timeout_s, a.deadline_floor_s);
  po::variables_map vm;
  help = parse_args("retime", kSummary, opts, args, vm);
  if (help) return a;
  parse_format(a.format);
  if (a.top < 1 || a.rounds < 1) throw InputError("retime: --top and --rounds must be at least 1");
  if (a.min_seconds <= 0 || a.min_seconds > 600)
    throw InputError(fmt::format("retime: --min-seconds must lie in (0, 600] (got {:g})", a.min_seconds));
  if (a.device < 0 || a.jobs < 0) throw InputError("retime: --device and --jobs must not be negative");
  check_limit_options(a.compile_timeout_s, a.deadline_floor_s, "retime");
  if (vm.count("tolerance")) {
    if (tolerance < 0) throw InputError(fmt::format("retime: --tolerance must not be negative (got {:g})", tolerance));
    a.tolerance_pct = tolerance;
  }
  return a;
}

nlohmann::ordered_json line_json(const search::Retimed& t, bool pick, double fastest_us, int rank) {
  nlohmann::ordered_json j;
  j["rank"] = rank > 0 ? nlohmann::ordered_json(rank) : nlohmann::ordered_json(nullptr);
  j["template"] = t.family;
  j["config"] = config_json(search::untag_family(t.config).second);
  j["pick"] = pick;
  j["search_median_us"] = t.found_us > 0 ? nlohmann::ordered_json(t.found_us) : nlohmann::ordered_json(nullptr);
  if (held(t)) {
    j["median_us"] = retimed_us(t);
    j["rounds_us"] = t.medians;
    j["spread_pct"] = spread_pct(t);
    j["behind_pct"] = (retimed_us(t) / fastest_us - 1) * 100;
    j["max_abs_err"] = t.max_err;
    j["status"] = "ok";
  } else {
    j["median_us"] = nullptr;
    j["status"] = "failed";
    j["error"] = t.failure;
  }
  return j;
}

int run_retime(const std::vector<std::string>& args) {
  bool help = false;
  const RetimeArgs a = parse(args, help);
  if (help) return 0;
  const Format out_format = parse_format(a.format);

  Store store = Store::open(a.db_path, Store::Mode::kExisting);
  const std::optional<CampaignRow> row = store.campaign_row(a.campaign);
  if (!row)
    throw InputError(fmt::format("no campaign '{}' in database '{}' (attntune campaigns lists them)", a.campaign,
                                 a.db_path));
  const std::int64_t campaign_id = row->id;
  const std::vector<EvaluationRow> rows = store.campaign_evaluations(campaign_id);
  if (row->ok == 0 || std::none_of(rows.begin(), rows.end(), [](const auto& e) { return e.record.status == "ok"; }))
    throw WorkError(fmt::format("retime: campaign '{}' has no valid result to re-time", a.campaign));
  // The pick as `best --campaign` (and export) give it, among the results of the campaign's GPU.
  BestQuery q;
  q.campaign = a.campaign;
  q.gpu = row->gpu;
  const std::vector<BestRow> picked = store.best(q);
  if (picked.empty()) throw WorkError(fmt::format("retime: campaign '{}' has no pick", a.campaign));

  JobRequest request;
  request.spaces = row->spec.spaces;
  if (request.spaces.empty())
    throw InputError(fmt::format("retime: campaign '{}' was stored without its search space (an older database); "
                                 "tune it again to re-time it",
                                 a.campaign));
  request.seed = static_cast<std::uint64_t>(row->spec.seed);
  request.max_seconds = a.min_seconds * 2;
  request.final_min_seconds = a.min_seconds;
  const service::JobSpaces spaces = service::parse_request_spaces(request);
  const bool mixed = spaces.mixed();
  auto as_seen = [mixed](const std::string& family, const Config& c) {
    return mixed ? search::tag_family(family, c) : c;
  };

  // The finalists: the fastest distinct configs, and the pick if it is not among them (with its
  // own search reading, from every distinct config ranked).
  const std::vector<search::Retimed> all = search::fastest_distinct(
      rows, static_cast<int>(rows.size()), [&](const EvaluationRow& e) { return as_seen(e.family, e.config); });
  const Config pick = as_seen(picked.front().family, picked.front().config);
  auto is_pick = [&](const search::Retimed& t) { return t.config == pick; };
  std::vector<search::Retimed> top(all.begin(), all.begin() + std::min(all.size(), static_cast<std::size_t>(a.top)));
  if (std::none_of(top.begin(), top.end(), is_pick)) {
    const auto it = std::find_if(all.begin(), all.end(), is_pick);
    top.push_back(it != all.end() ? *it : search::Retimed{pick, picked.front().family, "", {}, 0, false, ""});
  }

  if (std::string why; !cuda::driver_available(&why)) throw EnvError(why);
  const service::RunnerSettings settings{a.device, a.jobs, a.compile_timeout_s, a.deadline_floor_s};
  GpuRunner runner(spaces.sorted, row->spec.problem, &store, service::gpu_runner_options(request, settings, nullptr));
  const DeviceInfo gpu = runner.device();
  if (gpu.name != row->gpu)
    std::cerr << fmt::format("retime: note: campaign '{}' was tuned on {}; this is {}: its pick is re-timed here\n",
                             a.campaign, row->gpu, gpu.name);
  std::cerr << fmt::format("retime: campaign '{}' ({}), {} configs, {} rounds of >= {:g} s each, on {}\n", a.campaign,
                           row->spec.problem.str(), top.size(), a.rounds, a.min_seconds, gpu.name);

  runner.begin_final_timing();
  for (int round = 0; round < a.rounds; ++round) {
    if (!search::retime_round(runner, top, nullptr, nullptr))
      throw WorkError("retime: the GPU worker stopped before the round ended");
    std::cerr << fmt::format("retime: round {}/{} done\n", round + 1, a.rounds);
  }

  // Ranked by the re-timed median; failures last.
  std::stable_sort(top.begin(), top.end(), [](const search::Retimed& x, const search::Retimed& y) {
    if (held(x) != held(y)) return held(x);
    return held(x) && retimed_us(x) < retimed_us(y);
  });
  if (!held(top.front())) throw WorkError("retime: every config failed its re-timing");
  const double fastest_us = retimed_us(top.front());
  const search::Retimed& pick_line = *std::find_if(top.begin(), top.end(), is_pick);
  const bool pick_held = held(pick_line);
  const double behind = pick_held ? (retimed_us(pick_line) / fastest_us - 1) * 100 : 0;
  const bool within = pick_held && (!a.tolerance_pct || behind <= *a.tolerance_pct);

  if (out_format == Format::kJson) {
    nlohmann::ordered_json j;
    j["campaign"] = a.campaign;
    j["problem"] = problem_json(row->spec.problem);
    j["gpu"] = gpu.name;
    j["tuned_on"] = row->gpu;
    j["rounds"] = a.rounds;
    j["min_seconds"] = a.min_seconds;
    j["pick_behind_pct"] = pick_held ? nlohmann::ordered_json(behind) : nlohmann::ordered_json(nullptr);
    j["tolerance_pct"] = a.tolerance_pct ? nlohmann::ordered_json(*a.tolerance_pct) : nlohmann::ordered_json(nullptr);
    j["pick_holds"] = within;
    j["configs"] = nlohmann::ordered_json::array();
    int rank = 0;
    for (const search::Retimed& t : top)
      j["configs"].push_back(line_json(t, is_pick(t), fastest_us, held(t) ? ++rank : 0));
    print_json(std::cout, j);
  } else {
    std::vector<std::string> headers = {"rank", "re-timed µs", "spread", "behind", "search µs", "pick"};
    if (mixed) headers.push_back("template");
    headers.push_back("config");
    Table t(headers);
    int rank = 0;
    for (const search::Retimed& r : top) {
      const bool ok = held(r);
      std::vector<std::string> cells = {
          ok ? std::to_string(++rank) : "-",
          ok ? (out_format == Format::kCsv ? format_exact(retimed_us(r)) : format_us(retimed_us(r))) : "failed",
          ok ? fmt::format("{:.1f}%", spread_pct(r)) : "-",
          ok ? fmt::format("{:+.2f}%", (retimed_us(r) / fastest_us - 1) * 100) : "-",
          r.found_us > 0 ? format_us(r.found_us) : "-",
          is_pick(r) ? "pick" : ""};
      if (mixed) cells.push_back(r.family);
      cells.push_back(config_str(search::untag_family(r.config).second));
      t.add_row(std::move(cells));
    }
    if (out_format == Format::kCsv) {
      t.print_csv(std::cout);
    } else {
      std::cout << fmt::format("campaign '{}'  problem {}  on {}\n\n", a.campaign, row->spec.problem.str(), gpu.name);
      t.print(std::cout);
      if (pick_held)
        std::cout << fmt::format("\nthe pick is {:.2f}% behind the fastest of {} re-timed ({} rounds of >= {:g} s){}\n",
                                 behind, top.size(), a.rounds, a.min_seconds,
                                 a.tolerance_pct ? fmt::format(": {} the {:g}% tolerance",
                                                               within ? "within" : "outside", *a.tolerance_pct)
                                                 : "");
      else
        std::cout << fmt::format("\nthe pick failed its re-timing: {}\n", pick_line.failure);
    }
  }
  std::cout.flush();
  if (!pick_held) throw WorkError(fmt::format("retime: the pick failed its re-timing ({})", pick_line.failure));
  if (!within)
    throw WorkError(fmt::format("retime: the pick is {:.2f}% behind the fastest, beyond the {:g}% tolerance", behind,
                                *a.tolerance_pct));
  return 0;
}

const bool registered = register_command({"retime", kSummary, false, run_retime});

}  // namespace
}  // namespace attntune::cli::cmd_retime
