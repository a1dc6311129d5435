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
#include "core/error.hpp"
#include "core/text.hpp"
#include "cuda/driver.hpp"
#include "db/store.hpp"
#include "eval/gpu_runner.hpp"
#include "search/campaign.hpp"
#include "search/multi_family.hpp"
#include "search/warm_start.hpp"
#include "search/recorded.hpp"
#include "search/simulated_runner.hpp"
#include "search/strategy.hpp"

namespace attntune::cli {
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

// How far apart two problems of the same head dim are, for warm starts: lengths count most, then
// the amount of parallel work, dtype and causality; page sizes (both paged) count like lengths.
double problem_distance(const Problem& a, const Problem& b) {
  auto lg = [](double x, double y) { return std::abs(std::log2(x / y)); };
  return lg(a.s, b.s) + lg(a.sk, b.sk) + 0.5 * lg(double(a.b) * a.h, double(b.b) * b.h) + 0.5 * lg(a.hkv, b.hkv) +
         (a.dtype != b.dtype ? 1.0 : 0.0) + (a.causal != b.causal ? 2.0 : 0.0) +
         (a.paged() && b.paged() ? lg(double(a.page), double(b.page)) : 0.0);
}

// The best configs of the nearest problem of this family already tuned (this problem included).
// A paged problem and a dense one never warm-start each other: their kernels read K and V apart.
std::pair<std::optional<Problem>, std::vector<Config>> warm_start(ResultReader& results, const std::string& family,
                                                                  const Problem& problem, int count) {
  std::optional<Problem> nearest;
  double best = std::numeric_limits<double>::infinity();
  for (const Problem& p : results.problems_with_results(family)) {
    if (p.d != problem.d || p.paged() != problem.paged()) continue;
    const double d = problem_distance(p, problem);
    if (d < best) best = d, nearest = p;
  }
  std::vector<Config> configs;
  if (nearest) {
    BestQuery q;
    q.problem = nearest;
    configs = search::warm_start_configs(results, q, family, static_cast<std::size_t>(count));
  }
  return {nearest, configs};
}

// A campaign name is free text, stored and printed as given, but one line of it: no control
// characters (a newline would split every message and table that names it).
void check_campaign_name(const std::string& name) {
  for (const char c : name)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      throw InputError(fmt::format("tune: --campaign {} holds a control character (a campaign name is one line of "
                                   "printable text)",
                                   nlohmann::json(name).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace)));
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
  std::string problem_spec, db_path, campaign, strategy = "evo", budget_time, format = "table";
  std::int64_t budget_evals = 0, patience = -1;
  std::uint64_t seed = 1;
  int jobs = 0, device = 0, final_top = search::TuneOptions{}.final_top,
      final_rounds = search::TuneOptions{}.final_rounds, warm = static_cast<int>(search::kWarmStartConfigs),
      log_interval = 30;
  double compile_timeout_s = 120, deadline_floor_s = 10, max_seconds = 1.0, min_gain = 0.5, min_seconds = 0,
         final_min_seconds = GpuRunnerOptions{}.final_timing.min_seconds;
  std::string simulate_db;
  int simulate_delay_ms = 0;
  // Derived by check_tune_args.
  Format out_format = Format::kTable;
  double budget_seconds = 0;
};

// Parses the arguments into `a`; true when --help was asked for (and printed).
bool parse_tune_args(const std::vector<std::string>& args, TuneArgs& a, po::variables_map& vm) {
  const search::TuneOptions defaults;  // the final re-timing's defaults live there, with their reason
  po::options_description opts("options");
  opts.add_options()
      ("space", po::value(&a.space_paths)->required(), "search space YAML; repeat it to search several templates in "
                                                       "one campaign (one space per template), ranked together")
      ("problem", po::value(&a.problem_spec)->required(), "problem spec, e.g. b=4,h=16,s=4096,d=128,dtype=bf16,causal=0")
      ("db", po::value(&a.db_path)->default_value(default_db_path()), "database ($ATTNTUNE_DB, else ./attntune.db); created if missing")
      ("campaign", po::value(&a.campaign), "campaign name (default: template:problem:arch); an existing one is resumed")
      ("strategy", po::value(&a.strategy), "evo | random | exhaustive (default evo)")
      ("budget-evals", po::value(&a.budget_evals), "stop at this many evaluations in the campaign, earlier runs included")
      ("budget-time", po::value(&a.budget_time), "stop this run after this long: 90s, 45m, 8h")
      ("seed", po::value(&a.seed), "seed of the strategy and of the validation inputs (default 1)")
      ("jobs", po::value(&a.jobs), "concurrent NVRTC compiles (default: one per core)")
      ("device", po::value(&a.device), "CUDA device ordinal (default 0)")
      ("patience", po::value(&a.patience), "converged after this many evaluations without a gain over --min-gain "
                                           "(default: max(50, an eighth of the space); exhaustive: 0, never)")
      ("min-gain", po::value(&a.min_gain), "the gain in percent that counts as progress (default 0.5)")
      ("final-top", po::value(&a.final_top),
       fmt::format("re-time this many of the best at the end (default {}; 0: skip)", defaults.final_top).c_str())
      ("final-rounds", po::value(&a.final_rounds),
       fmt::format("interleaved rounds of that re-timing (default {})", defaults.final_rounds).c_str())
      ("warm-start", po::value(&a.warm), "seed evo with this many best configs of the nearest tuned problem (default 8; 0: none)")
      ("max-seconds", po::value(&a.max_seconds), "cap on each candidate's timing, in seconds (default 1)")
      ("min-seconds", po::value(&a.min_seconds), "least time each search candidate's timing samples, in seconds "
                                                 "(default 0: until its median holds within 1%; 0.1 makes search "
                                                 "times read as sustained ones)")
      ("final-min-seconds", po::value(&a.final_min_seconds),
       fmt::format("least time each re-timing of the final ranking samples, in seconds (default {:g}): the clock "
                   "swings under the GPU's power cap", a.final_min_seconds).c_str())
      ("compile-timeout", po::value(&a.compile_timeout_s), "seconds before a hanging NVRTC compile is killed (default 120)")
      ("deadline-floor", po::value(&a.deadline_floor_s), "least seconds a candidate may run before it is killed (default 10)")
      ("log-interval", po::value(&a.log_interval), "seconds between progress lines when stderr is not a terminal (default 30)")
      ("format", po::value(&a.format), "table | json: how the result is printed")
      ("simulate-db", po::value(&a.simulate_db), "evaluate from this database's recorded campaign instead of a GPU (testing)")
      ("simulate-campaign", po::value(&a.simulate_campaigns), "the recorded campaign --simulate-db answers from (one "
                                                              "per template with several --space)")
      ("simulate-delay-ms", po::value(&a.simulate_delay_ms), "simulated time per candidate (default 0)");
  return parse_args("tune", kSummary, opts, args, vm);
}

// InputError for values out of range or options that go together given alone; fills in what the
// arguments imply (the output format, the time budget, the final re-timing's least time).
void check_tune_args(TuneArgs& a, const po::variables_map& vm) {
  a.out_format = parse_format(a.format, false);
  if (a.budget_evals < 0) throw InputError("tune: --budget-evals must not be negative");
  a.budget_seconds = a.budget_time.empty() ? 0 : parse_duration(a.budget_time, "tune: --budget-time");
  if (a.jobs < 0 || a.device < 0 || a.final_top < 0 || a.final_rounds < 1 || a.warm < 0 || a.log_interval < 1 ||
      a.simulate_delay_ms < 0)
    throw InputError("tune: --jobs, --device, --final-top, --warm-start and --simulate-delay-ms must not be negative; "
                     "--final-rounds and --log-interval must be at least 1");
  if (a.compile_timeout_s <= 0 || a.deadline_floor_s <= 0 || a.max_seconds <= 0 || a.min_gain < 0)
    throw InputError("tune: --compile-timeout, --deadline-floor and --max-seconds must be positive, --min-gain >= 0");
  // Each must lie within [0, --max-seconds] when given; the final default yields to a smaller --max-seconds.
  if (a.min_seconds < 0 || a.final_min_seconds < 0 || a.min_seconds > a.max_seconds ||
      (vm.count("final-min-seconds") && a.final_min_seconds > a.max_seconds))
    throw InputError(fmt::format("tune: --min-seconds ({:g}) and --final-min-seconds ({:g}) must lie between 0 and "
                                 "--max-seconds ({:g})", a.min_seconds, a.final_min_seconds, a.max_seconds));
  a.final_min_seconds = std::min(a.final_min_seconds, a.max_seconds);
  if (a.simulate_db.empty() != a.simulate_campaigns.empty())
    throw InputError("tune: --simulate-db and --simulate-campaign go together");
  const auto names = search::strategy_names();
  if (std::find(names.begin(), names.end(), a.strategy) == names.end())
    throw InputError(fmt::format("tune: unknown strategy '{}' (known: {})", a.strategy, fmt::join(names, ", ")));
}

// The spaces, one per template, and pointers to them in template order (so the order of --space
// does not matter).
struct TuneSpaces {
  std::vector<SearchSpace> loaded;
  std::vector<const SearchSpace*> sorted;
  bool mixed() const { return sorted.size() > 1; }
};

TuneSpaces load_spaces(const std::vector<std::string>& paths) {
  TuneSpaces out;
  out.loaded.reserve(paths.size());
  for (const std::string& path : paths) {
    SearchSpace s = SearchSpace::load(path);
    for (const SearchSpace& other : out.loaded) {
      if (other.hash() == s.hash())
        throw InputError(fmt::format("tune: --space {} is the same search space as --space {} (give each once)",
                                     path, other.path()));
      if (other.family() == s.family())
        throw InputError(fmt::format("tune: --space {} and --space {} are both spaces of template '{}' (a campaign "
                                     "searches one space per template)",
                                     other.path(), path, s.family()));
    }
    out.loaded.push_back(std::move(s));
  }
  for (const SearchSpace& s : out.loaded) out.sorted.push_back(&s);
  std::sort(out.sorted.begin(), out.sorted.end(),
            [](const SearchSpace* a, const SearchSpace* b) { return a->family() < b->family(); });
  return out;
}

// What can be checked of the spaces, the problem and the names before a database or a GPU worker
// is touched.
void check_before_starting(const TuneArgs& a, const TuneSpaces& spaces, const Problem& problem) {
  for (const SearchSpace* s : spaces.sorted) {
    check_family(s->family());  // an unknown template fails here, before anything starts
    check_family_serves(s->family(), problem);
    // What the family supports (d, dtype, problem constraints) does not depend on the arch: checked
    // now, before a database or a GPU worker is touched. The arch itself is checked once known.
    s->check_problem(problem, s->default_arch());
    if (spaces.mixed()) search::check_mixable(*s);
  }
  if (!a.simulate_campaigns.empty() && a.simulate_campaigns.size() != spaces.sorted.size())
    throw InputError(fmt::format("tune: {} --space and {} --simulate-campaign: give one recorded campaign per space",
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

// Each space's valid configs for the problem on the runner's arch (WorkError when one has none).
void count_spaces(TuneRunner& r, const TuneSpaces& spaces, const Problem& problem) {
  for (const SearchSpace* s : spaces.sorted) {
    const std::string a = r.runner ? r.runner->arch_for(s->family()) : r.arch;
    s->check_problem(problem, a);
    const std::uint64_t n = s->count(problem, a);
    if (n == 0) throw WorkError(fmt::format("tune: {} has no valid config for {} on {}", s->path(), problem.str(), a));
    r.space_size += n;
    r.sizes.push_back(fmt::format("{} {}", s->family(), n));
  }
}

// --simulate-db: each space answers from the recorded campaign of its template.
void start_simulated_runner(TuneRunner& r, const TuneArgs& a, const TuneSpaces& spaces, const Problem& problem) {
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
void start_gpu_runner(TuneRunner& r, const TuneArgs& a, const TuneSpaces& spaces, const Problem& problem,
                      BuildCache& cache) {
  GpuRunnerOptions ropts;
  ropts.device = a.device;
  ropts.jobs = a.jobs;
  ropts.compile_timeout = std::chrono::milliseconds(static_cast<long long>(a.compile_timeout_s * 1000));
  ropts.deadline_floor_s = a.deadline_floor_s;
  ropts.timing.max_seconds = a.max_seconds;
  ropts.timing.min_seconds = a.min_seconds;
  ropts.final_timing.max_seconds = a.max_seconds;
  ropts.final_timing.min_seconds = a.final_min_seconds;
  ropts.validation_seed = a.seed;
  ropts.cancel = &g_abandon;
  r.runner = std::make_unique<GpuRunner>(spaces.sorted, problem, &cache, ropts);
  r.arch = r.runner->device().arch;
  count_spaces(r, spaces, problem);
}

// The campaign as recorded: its spaces, name (default TEMPLATE:PROBLEM:ARCH), problem, strategy,
// seed and budgets.
CampaignSpec campaign_spec(const TuneArgs& a, const TuneSpaces& spaces, const Problem& problem,
                           const std::string& arch) {
  CampaignSpec spec;
  std::vector<CampaignSpace> list;
  for (const SearchSpace* s : spaces.sorted) list.push_back({s->family(), s->path(), s->hash(), s->text()});
  set_spaces(spec, std::move(list));
  spec.name = a.campaign.empty() ? fmt::format("{}:{}:{}", spec.family, problem.str(), arch) : a.campaign;
  spec.problem = problem;
  spec.strategy = a.strategy;
  spec.seed = static_cast<std::int64_t>(a.seed);
  spec.budget_evals = a.budget_evals;
  spec.budget_seconds = a.budget_seconds;
  return spec;
}

search::TuneOptions tune_options(const TuneArgs& a, std::uint64_t space_size) {
  search::TuneOptions topts;
  topts.strategy = a.strategy;
  topts.seed = a.seed;
  topts.budget_evals = a.budget_evals;
  topts.budget_seconds = a.budget_seconds;
  // Exhaustive means all of it: it converges only when asked to.
  topts.patience = a.patience >= 0              ? a.patience
                   : a.strategy == "exhaustive" ? 0
                                                : std::max<std::int64_t>(50, static_cast<std::int64_t>(space_size / 8));
  topts.min_gain_pct = a.min_gain;
  topts.final_top = a.final_top;
  topts.final_rounds = a.final_rounds;
  return topts;
}

// Each template's warm start (the best configs of its nearest tuned problem), said as it is found.
void add_warm_starts(search::TuneOptions& topts, ResultReader& results, const TuneSpaces& spaces,
                     const Problem& problem, int count, search::Progress& progress) {
  for (const SearchSpace* s : spaces.sorted) {
    auto [nearest, configs] = warm_start(results, s->family(), problem, count);
    if (!nearest || configs.empty()) continue;
    for (Config& c : configs)
      topts.warm_start.push_back(spaces.mixed() ? search::tag_family(s->family(), std::move(c)) : c);
    progress.event(fmt::format("warm start: {} configs from {}{}", configs.size(), nearest->str(),
                               spaces.mixed() ? fmt::format(" ({})", s->family()) : ""));
  }
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

int run_tune(const std::vector<std::string>& args) {
  TuneArgs a;
  po::variables_map vm;
  if (parse_tune_args(args, a, vm)) return 0;
  check_tune_args(a, vm);
  const TuneSpaces spaces = load_spaces(a.space_paths);
  const Problem problem = Problem::parse(a.problem_spec);
  check_before_starting(a, spaces, problem);

  SignalGuard signals;
  // Every input is checked before anything is written: a bad one leaves the database as it was.
  TuneRunner r;
  if (!a.simulate_db.empty()) {
    start_simulated_runner(r, a, spaces, problem);
  } else if (std::string why; !cuda::driver_available(&why)) {
    throw EnvError(why);  // no driver: say so before a database is created for nothing
  }
  Store store = Store::open(a.db_path, Store::Mode::kCreate);
  if (!r.runner) start_gpu_runner(r, a, spaces, problem, store);
  const DeviceInfo gpu = r.runner->device();

  const CampaignSpec spec = campaign_spec(a, spaces, problem, r.arch);
  // A campaign of that name must be resumable with these inputs, and the database writable now
  // (another writer's lock, a full disk), before the first line of progress.
  store.check_resume(spec);
  store.check_writable();

  search::TuneOptions topts = tune_options(a, r.space_size);
  const bool live = ::isatty(2);
  search::Progress progress(std::cerr, live, std::chrono::seconds(a.log_interval));
  if (a.warm > 0) add_warm_starts(topts, store, spaces, problem, a.warm, progress);
  progress.event(fmt::format("campaign '{}': {} on {} ({}), {} valid configs{}, strategy {}, seed {}{}{}", spec.name,
                             problem.str(), gpu.name, r.arch, r.space_size,
                             spaces.mixed() ? fmt::format(" ({})", fmt::join(r.sizes, " + ")) : "", a.strategy,
                             a.seed, a.budget_evals ? fmt::format(", budget {} evaluations", a.budget_evals) : "",
                             a.budget_seconds ? fmt::format(", time budget {}", search::format_duration(a.budget_seconds))
                                              : ""));

  const search::TuneResult result =
      search::run_campaign(store, *r.runner, spaces.sorted, spec, topts, progress, {&g_stop, &g_abandon});
  r.runner.reset();  // workers end before the summary

  if (a.out_format == Format::kJson)
    print_json(std::cout, result_json(spec.name, result, problem, spec, gpu));
  else
    print_result_table(result, spec.name, spaces.mixed());
  if (result.status == "stopped") return 130;
  if (result.ok == 0)
    throw WorkError(fmt::format("tune: no valid config found for {} in {} evaluations", problem.str(), result.evaluations));
  return 0;
}

const bool registered = register_command({"tune", kSummary, false, run_tune});

}  // namespace
}  // namespace attntune::cli
