// attntune tune: run, or resume, a campaign (search/campaign.hpp does the loop). Re-running the same
// command resumes it: what it evaluated is never evaluated again. Ctrl-C (or SIGTERM) finishes the
// candidate on the GPU, records it and exits; a second Ctrl-C abandons that candidate too; a SIGKILL
// loses at most the candidates in flight. Progress goes to stderr, the result to stdout.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "cli/format.hpp"
#include "cli/job_options.hpp"
#include "cli/shipped.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "cuda/driver.hpp"
#include "db/store.hpp"
#include "eval/gpu_runner.hpp"
#include "search/campaign.hpp"
#include "search/multi_family.hpp"
#include "search/warm_start.hpp"
#include "service/job.hpp"
#include "service/lease.hpp"
#include "search/recorded.hpp"
#include "search/simulated_runner.hpp"
#include "search/strategy.hpp"

namespace attntune::cli::cmd_tune {
namespace {

constexpr const char* kSummary = "run (or resume) a tuning campaign on the GPU";

std::atomic<bool> g_stop{false}, g_abandon{false};
std::atomic<int> g_signals{0};

extern "C" void on_interrupt(int sig) {
  const int n = ++g_signals;
  if (n == 1) {
    g_stop = true;
    const char msg[] = "\nattntune: stopping after the candidate in flight (Ctrl-C again abandons it)\n";
    [[maybe_unused]] auto w = ::write(2, msg, sizeof msg - 1);
  } else {
    g_abandon = true;
    g_stop = true;
    ::signal(sig, SIG_DFL);  // a third one ends the process at once
  }
}

struct SignalGuard {
  struct sigaction old_int {}, old_term {};
  SignalGuard() {
    g_stop = false;
    g_abandon = false;
    g_signals = 0;
    struct sigaction sa {};
    sa.sa_handler = on_interrupt;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &old_int);
    ::sigaction(SIGTERM, &sa, &old_term);
  }
  ~SignalGuard() {
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGTERM, &old_term, nullptr);
  }
};

// A campaign name is free text, stored and printed as given, but one line of it: no control
// characters (a newline would split every message and table that names it).
void check_campaign_name(const std::string& name) {
  // Stored, and printed in every JSON output of the database: one line of valid UTF-8 (core/text.hpp).
  check_stored_text(name, "tune: --campaign");
}

nlohmann::ordered_json result_json(const std::string& campaign, const search::TuneResult& r, const Problem& problem,
                                   const CampaignSpec& spec, const DeviceInfo& device) {
  const std::string& family = spec.family;
  nlohmann::ordered_json templates = nlohmann::ordered_json::array();
  for (const CampaignSpace& s : spec.spaces) templates.push_back(s.family);
  nlohmann::ordered_json ranking = nlohmann::ordered_json::array();
  for (const RankedRow& row : r.ranking)
    ranking.push_back({{"rank", row.rank},
                       {"template", row.family},
                       {"config", config_json(row.config)},
                       {"median_us", row.entry.median_us},
                       {"tflops", row.entry.tflops},
                       {"max_abs_err", row.entry.max_abs_err},
                       {"spread_pct", row.entry.spread_pct},
                       {"rounds", row.entry.rounds}});
  return {{"campaign", campaign},     {"problem", problem_json(problem)}, {"template", family},
          {"gpu", device.name},       {"arch", device.arch},              {"status", r.status},
          {"stop_reason", r.stop_reason}, {"evaluations", r.evaluations}, {"this_run", r.this_run},
          {"ok", r.ok},               {"templates", templates},           {"ranking", ranking}};
}

// ---------------------------------------------------------------------------------------------
// run_tune, in the order it runs: the arguments, the spaces and problem, the runner, the campaign,
// the result.

// The command line, as given.
struct TuneArgs {
  std::vector<std::string> space_paths, simulate_campaigns;
  std::string problem_spec, db_path, campaign, format = "table";
  JobOptionValues job;  // the campaign's options (cli/job_options.hpp)
  int jobs = 0, device = 0, log_interval = 30;
  double compile_timeout_s = 120, deadline_floor_s = 10;
  std::string simulate_db;
  int simulate_delay_ms = 0;
  bool allow_network_fs = false;
  // Derived by check_tune_args.
  Format out_format = Format::kTable;
  JobRequest request;  // the campaign's options as a queued one carries them (spaces: once loaded)
};

// Parses the arguments into `a`; true when --help was asked for (and printed).
bool parse_tune_args(const std::vector<std::string>& args, TuneArgs& a, po::variables_map& vm) {
  po::options_description opts("options");
  opts.add_options()
      ("space", po::value(&a.space_paths), "search space YAML; repeat it to search several templates in one campaign "
                                           "(one space per template), ranked together; default: the shipped space of "
                                           "every template that serves the problem on this GPU")
      ("problem", po::value(&a.problem_spec)->required(), "problem spec, e.g. b=4,h=16,s=4096,d=128,dtype=bf16,causal=0")
      ("db", po::value(&a.db_path)->default_value(default_db_path()), "database ($ATTNTUNE_DB, else ./attntune.db); created if missing")
      ("campaign", po::value(&a.campaign), "campaign name (default: template:problem:arch); an existing one is resumed");
  add_job_options(opts, a.job);
  opts.add_options()
      ("jobs", po::value(&a.jobs), "concurrent NVRTC compiles (default: one per core)")
      ("device", po::value(&a.device), "CUDA device ordinal (default 0)");
  add_limit_options(opts, a.compile_timeout_s, a.deadline_floor_s);
  add_network_fs_option(opts, a.allow_network_fs);
  opts.add_options()
      ("log-interval", po::value(&a.log_interval), "seconds between progress lines when stderr is not a terminal (default 30)")
      ("format", po::value(&a.format), "table | json: how the result is printed")
      ("simulate-db", po::value(&a.simulate_db), "evaluate from this database's recorded campaign instead of a GPU (testing)")
      ("simulate-campaign", po::value(&a.simulate_campaigns), "the recorded campaign --simulate-db answers from (one "
                                                              "per template with several --space)")
      ("simulate-delay-ms", po::value(&a.simulate_delay_ms), "simulated time per candidate (default 0)");
  return parse_args("tune", kSummary, opts, args, vm);
}

// InputError for values out of range or options that go together given alone; fills in what the
// arguments imply (the output format, the campaign's request).
void check_tune_args(TuneArgs& a, const po::variables_map& vm) {
  a.out_format = parse_format(a.format, false);
  a.request = check_job_options(a.job, vm, "tune");
  if (a.jobs < 0 || a.device < 0 || a.log_interval < 1 || a.simulate_delay_ms < 0)
    throw InputError("tune: --jobs, --device and --simulate-delay-ms must not be negative; --log-interval must be at "
                     "least 1");
  check_limit_options(a.compile_timeout_s, a.deadline_floor_s, "tune");
  if (a.simulate_db.empty() != a.simulate_campaigns.empty())
    throw InputError("tune: --simulate-db and --simulate-campaign go together");
}

// The campaign's spaces: --space's files, or without --space the shipped space of every template
// that serves the problem (as `submit` queues them) and that this GPU's arch runs (flash_fwd_wgmma on
// Hopper only). The arch is read from the driver here, without a context; a simulated run keeps them
// all (its recordings say which it answers for).
service::JobSpaces load_spaces(TuneArgs& a, const Problem& problem) {
  if (!a.space_paths.empty()) return service::load_space_files(a.space_paths, "tune");
  std::vector<CampaignSpace> spaces = service::default_spaces(problem);  // InputError: no template serves it
  if (a.simulate_db.empty()) {
    if (std::string why; !cuda::driver_available(&why)) throw EnvError(why);
    const std::string arch = cuda::device_props(a.device).arch;
    std::vector<std::string> why_not;
    std::vector<CampaignSpace> runnable = service::runnable_spaces(spaces, problem, arch, &why_not);
    if (runnable.empty())
      throw InputError(fmt::format("tune: no shipped template serves {} on this GPU ({}): {}", problem.str(), arch,
                                   fmt::join(why_not, "; ")));
    spaces = std::move(runnable);
  }
  JobRequest request;
  request.spaces = std::move(spaces);
  return service::parse_request_spaces(request);
}

// What can be checked of the spaces, the problem and the names before a database or a GPU worker
// is touched.
void check_before_starting(const TuneArgs& a, const service::JobSpaces& spaces, const Problem& problem) {
  for (const SearchSpace* s : spaces.sorted) {
    check_family(s->family());  // an unknown template fails here, before anything starts
    check_family_serves(s->family(), problem);
    // What the family supports (d, dtype, problem constraints) does not depend on the arch: checked
    // now, before a database or a GPU worker is touched. The arch itself is checked once known.
    s->check_problem(problem, s->default_arch());
    if (spaces.mixed()) search::check_mixable(*s);
  }
  if (!a.simulate_campaigns.empty() && a.simulate_campaigns.size() != spaces.sorted.size())
    throw InputError(fmt::format("tune: {} spaces (--space, or without it every template that serves the problem) and "
                                 "{} --simulate-campaign: give one recorded campaign per space",
                                 spaces.sorted.size(), a.simulate_campaigns.size()));
  check_campaign_name(a.campaign);
}

// The runner (recorded campaigns, or the GPU) and what it makes of the spaces. Members in this
// order: the runner goes before the recordings it answers from.
struct TuneRunner {
  std::vector<search::RecordedCampaign> recordings;
  std::optional<Store> recording_store;
  std::unique_ptr<search::Runner> runner;
  std::string arch;
  std::uint64_t space_size = 0;
  std::vector<std::string> sizes;  // per template, for the first line of progress
};

void count_spaces(TuneRunner& r, const service::JobSpaces& spaces, const Problem& problem) {
  r.space_size = service::count_valid(spaces, problem, *r.runner, &r.sizes);
}

// --simulate-db: each space answers from the recorded campaign of its template.
void start_simulated_runner(TuneRunner& r, const TuneArgs& a, const service::JobSpaces& spaces, const Problem& problem) {
  r.recording_store.emplace(Store::open(a.simulate_db, Store::Mode::kReadOnly));
  r.recordings.reserve(a.simulate_campaigns.size());
  for (const std::string& name : a.simulate_campaigns)
    r.recordings.push_back(search::RecordedCampaign::load(*r.recording_store, name));
  std::vector<const search::RecordedCampaign*> by_space;
  for (const SearchSpace* s : spaces.sorted) {
    const search::RecordedCampaign* match = nullptr;
    for (const search::RecordedCampaign& rec : r.recordings)
      if (rec.space.family() == s->family()) match = &rec;
    if (!match)
      throw InputError(fmt::format("tune: no --simulate-campaign records template '{}' (of --space {})", s->family(),
                                   s->path()));
    if (match->problem != problem || match->space.hash() != s->hash())
      throw InputError(fmt::format("tune: the simulated campaign '{}' recorded problem {} with space hash {}; this "
                                   "run asks for {} with {}",
                                   match->name, match->problem.str(), match->space.hash().substr(0, 12),
                                   problem.str(), s->hash().substr(0, 12)));
    by_space.push_back(match);
  }
  r.runner = std::make_unique<search::SimulatedRunner>(by_space, std::chrono::milliseconds(a.simulate_delay_ms),
                                                       static_cast<std::size_t>(a.jobs > 0 ? a.jobs + 2 : 8),
                                                       &g_abandon);
  r.arch = r.runner->device().arch;
  count_spaces(r, spaces, problem);
}

// The GPU: its worker tells the arch (no GPU: exit 3); builds are cached in `cache`.
void start_gpu_runner(TuneRunner& r, const TuneArgs& a, const service::JobSpaces& spaces, const Problem& problem,
                      BuildCache& cache) {
  const service::RunnerSettings settings{a.device, a.jobs, a.compile_timeout_s, a.deadline_floor_s};
  r.runner = std::make_unique<GpuRunner>(spaces.sorted, problem, &cache,
                                         service::gpu_runner_options(a.request, settings, &g_abandon));
  r.arch = r.runner->device().arch;
  count_spaces(r, spaces, problem);
}

void print_result_table(const search::TuneResult& result, const std::string& campaign, bool mixed) {
  std::cout << fmt::format("campaign '{}' {}: {}\n", campaign, result.status, result.stop_reason);
  std::cout << fmt::format("{} evaluations ({} this run), {} ok\n", result.evaluations, result.this_run, result.ok);
  if (!result.ranking.empty()) {
    std::cout << "\n";
    std::vector<std::string> headers = {"rank", "median µs", "TFLOP/s", "spread", "max |err|", "config"};
    if (mixed) headers.insert(headers.end() - 1, "template");
    Table t(headers);
    for (const RankedRow& r : result.ranking) {
      std::vector<std::string> cells = {std::to_string(r.rank), format_us(r.entry.median_us),
                                        format_tflops(r.entry.tflops), fmt::format("{:.1f}%", r.entry.spread_pct),
                                        format_error(r.entry.max_abs_err), config_str(r.config)};
      if (mixed) cells.insert(cells.end() - 1, r.family);
      t.add_row(cells);
    }
    t.print(std::cout);
  }
  if (result.status == "stopped")
    std::cout << fmt::format("\nresume with the same command (campaign '{}')\n", campaign);
}

// What the campaign recorded is what a resume feeds the strategy and re-times at the end: each config
// must name its space's parameters with values of their domains (the store reads configs only as
// attntune writes them), or the database was edited or crafted. Refused here, before anything is
// written (docs/RELIABILITY.md, part 10). Not the constraints: they may depend on the GPU.
void check_recorded_configs(Store& store, std::int64_t campaign_id, const service::JobSpaces& spaces) {
  for (const EvaluationRow& e : store.campaign_evaluations(campaign_id))
    for (const SearchSpace* s : spaces.sorted) {
      if (s->family() != e.family) continue;
      std::string why;
      try {
        if (s->parse_config(config_str(e.config)) != e.config) why = "a value of another type";
      } catch (const InputError& err) {
        why = err.what();
      }
      if (!why.empty())
        throw InputError(fmt::format("database '{}': campaign evaluated {}, which its space does not allow ({}): "
                                     "the file was edited or crafted; refusing to resume it",
                                     store.path(), config_str(e.config), why));
    }
}

// tune's lease of its campaign (a campaign has one writer: another tune, or a serve worker): taken
// before the first write, renewed by a heartbeat, and let go when the run ends.
class TuneLease {
 public:
  TuneLease(Store& store, const std::string& campaign)
      : store_(store), campaign_(campaign), owner_(service::this_process()) {
    store_.acquire_lease(campaign_, owner_, service::unix_now(), service::kDefaultLeaseSeconds,
                         service::lease_is_stale);
    store_.fence_writes(owner_.id());
    beat_store_.emplace(store_.another_connection());  // never a second Store::open: store.hpp
    heartbeat_.emplace(
        [this] {
          return beat_store_->renew_lease(campaign_, owner_.id(), service::unix_now() + service::kDefaultLeaseSeconds);
        },
        std::chrono::milliseconds(static_cast<long long>(service::kDefaultLeaseSeconds * 1000 / 3)),
        [] { g_stop = true, g_abandon = true; });
  }
  ~TuneLease() {
    heartbeat_.reset();
    try {
      store_.fence_writes("");
      store_.release_lease(campaign_, owner_.id());
    } catch (...) {
      // The lease expires on its own; the process is gone anyway.
    }
  }

 private:
  Store& store_;
  std::string campaign_;
  LeaseOwner owner_;
  std::optional<Store> beat_store_;
  std::optional<service::Heartbeat> heartbeat_;
};

// One campaign of `problem` (run_tune's, once per pass of pass=fwdbwd). `json`: where a JSON result
// goes instead of stdout (null: printed); `best_us`: the re-timed best's time (0: none).
int tune_one(TuneArgs a, const Problem& problem, nlohmann::ordered_json* json, double* best_us) {
  *best_us = 0;
  const service::JobSpaces spaces = load_spaces(a, problem);
  a.request.spaces = service::campaign_spaces(spaces);
  check_before_starting(a, spaces, problem);

  SignalGuard signals;
  // Every input is checked before anything is written: a bad one leaves the database as it was.
  TuneRunner r;
  if (!a.simulate_db.empty()) {
    start_simulated_runner(r, a, spaces, problem);
  } else if (std::string why; !cuda::driver_available(&why)) {
    throw EnvError(why);  // no driver: say so before a database is created for nothing
  }
  // Checked whole before the first write (a damaged file refused, exit 2): Store::Options.
  Store::Options open_options;
  open_options.refuse_network_fs = !a.allow_network_fs;
  Store store = Store::open(a.db_path, Store::Mode::kCreate, open_options);
  if (!r.runner) start_gpu_runner(r, a, spaces, problem, store);
  const DeviceInfo gpu = r.runner->device();

  const CampaignSpec spec = service::campaign_spec(
      a.campaign.empty() ? service::default_campaign_name(a.request.spaces, problem, r.arch) : a.campaign, problem,
      a.request);
  // A campaign of that name must be resumable with these inputs, and the database writable now
  // (another writer's lock, a full disk), before the first line of progress.
  if (const std::optional<std::int64_t> id = store.check_resume(spec)) {
    check_recorded_configs(store, *id, spaces);
    // Store::open_campaign refuses another GPU model too; said here before the device and the
    // lease are written.
    if (const std::optional<CampaignRow> row = store.campaign_row(spec.name); row && row->gpu != gpu.name)
      throw InputError(fmt::format("campaign '{}' was tuned on a {}; this run is on a {}: resume it on a {}, or give "
                                   "this run another campaign name (times of two GPU models never rank together)",
                                   spec.name, row->gpu, gpu.name, row->gpu));
  }
  store.check_writable();
  TuneLease lease(store, spec.name);

  search::TuneOptions topts = service::tune_options(a.request, r.space_size);
  const bool live = ::isatty(2);
  search::Progress progress(std::cerr, live, std::chrono::seconds(a.log_interval));
  // A problem unlike any the user's database has tuned starts where the shipped database's nearest
  // campaign of each template ended (docs/design/shipped_db.md).
  ShippedDb shipped(true);
  const service::WarmStartFallback from_shipped{[&]() -> ResultReader* { return shipped.store_or_warn(std::cerr); },
                                                "the shipped database"};
  if (a.request.warm > 0) {
    service::WarmStartDevice device{gpu.sm_count, [&](const std::string& f) { return r.runner->arch_for(f); }};
    service::add_warm_starts(topts, store, spaces, problem, a.request.warm, progress, &from_shipped, gpu.name, &device);
  }
  progress.event(fmt::format("campaign '{}': {} on {} ({}), {} valid configs{}, strategy {}, seed {}{}{}", spec.name,
                             problem.str(), gpu.name, r.arch, r.space_size,
                             spaces.mixed() ? fmt::format(" ({})", fmt::join(r.sizes, " + ")) : "",
                             a.request.strategy, a.request.seed,
                             a.request.budget_evals ? fmt::format(", budget {} evaluations", a.request.budget_evals) : "",
                             a.request.budget_seconds
                                 ? fmt::format(", time budget {}", search::format_duration(a.request.budget_seconds))
                                 : ""));

  const search::TuneResult result =
      search::run_campaign(store, *r.runner, spaces.sorted, spec, topts, progress, {&g_stop, &g_abandon});
  r.runner.reset();  // workers end before the summary

  if (a.out_format == Format::kJson) {
    if (json) json->push_back(result_json(spec.name, result, problem, spec, gpu));
    else print_json(std::cout, result_json(spec.name, result, problem, spec, gpu));
  } else {
    print_result_table(result, spec.name, spaces.mixed());
  }
  if (!result.ranking.empty()) *best_us = result.ranking.front().entry.median_us;
  if (result.status == "stopped") return 130;
  if (result.ok == 0)
    throw WorkError(fmt::format("tune: no valid config found for {} in {} evaluations", problem.str(), result.evaluations));
  return 0;
}

int run_tune(const std::vector<std::string>& args) {
  TuneArgs a;
  po::variables_map vm;
  if (parse_tune_args(args, a, vm)) return 0;
  check_tune_args(a, vm);
  const std::vector<Problem> passes = Problem::parse_passes(a.problem_spec);
  double best_us = 0;
  if (passes.size() == 1) return tune_one(a, passes.front(), nullptr, &best_us);
  // pass=fwdbwd: a training step's two campaigns, the forward's then the backward's (each over every
  // template that serves its pass; --campaign NAME names them NAME:fwd and NAME:bwd). An interrupted
  // or failed forward stops before the backward. JSON: an array of the two results.
  if (!a.space_paths.empty())
    throw InputError("tune: --space with pass=fwdbwd: the passes are tuned by different templates; leave --space out "
                     "(each pass's own), or tune pass=fwd and pass=bwd one at a time");
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  double step_us = 0;
  bool timed = true;
  for (const Problem& p : passes) {
    TuneArgs one = a;
    if (!a.campaign.empty()) one.campaign = a.campaign + (p.backward ? ":bwd" : ":fwd");
    if (const int rc = tune_one(one, p, &results, &best_us)) {
      if (a.out_format == Format::kJson) print_json(std::cout, results);
      return rc;
    }
    step_us += best_us;
    timed = timed && best_us > 0;
  }
  if (a.out_format == Format::kJson) print_json(std::cout, results);
  else if (timed)
    std::cout << fmt::format("training step (forward + backward) of {}: {} µs\n", passes.front().str(),
                             format_us(step_us));
  return 0;
}

const bool registered = register_command({"tune", kSummary, false, run_tune});

}  // namespace
}  // namespace attntune::cli::cmd_tune
