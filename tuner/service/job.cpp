#include "service/job.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "core/error.hpp"
#include "families/family.hpp"
#include "search/multi_family.hpp"
#include "search/warm_start.hpp"

namespace attntune::service {

JobSpaces load_space_files(const std::vector<std::string>& paths, const char* command) {
  JobSpaces out;
  out.loaded.reserve(paths.size());
  for (const std::string& path : paths) {
    SearchSpace s = SearchSpace::load(path);
    for (const SearchSpace& other : out.loaded) {
      if (other.hash() == s.hash())
        throw InputError(fmt::format("{}: --space {} is the same search space as --space {} (give each once)", command,
                                     path, other.path()));
      if (other.family() == s.family())
        throw InputError(fmt::format("{}: --space {} and --space {} are both spaces of template '{}' (a campaign "
                                     "searches one space per template)",
                                     command, other.path(), path, s.family()));
    }
    out.loaded.push_back(std::move(s));
  }
  for (const SearchSpace& s : out.loaded) out.sorted.push_back(&s);
  std::sort(out.sorted.begin(), out.sorted.end(),
            [](const SearchSpace* a, const SearchSpace* b) { return a->family() < b->family(); });
  return out;
}

JobSpaces parse_request_spaces(const JobRequest& request) {
  JobSpaces out;
  out.loaded.reserve(request.spaces.size());
  for (const CampaignSpace& s : request.spaces) out.loaded.push_back(SearchSpace::parse(s.text, s.path));
  for (const SearchSpace& s : out.loaded) out.sorted.push_back(&s);
  std::sort(out.sorted.begin(), out.sorted.end(),
            [](const SearchSpace* a, const SearchSpace* b) { return a->family() < b->family(); });
  return out;
}

std::vector<CampaignSpace> campaign_spaces(const JobSpaces& spaces) {
  std::vector<CampaignSpace> list;
  for (const SearchSpace* s : spaces.sorted) list.push_back({s->family(), s->path(), s->hash(), s->text()});
  return list;
}

std::vector<CampaignSpace> default_spaces(const Problem& problem) {
  std::vector<CampaignSpace> out;
  std::vector<std::string> why_not;
  for (const std::string& family : known_families()) {
    const std::optional<SearchSpace> shipped = SearchSpace::shipped(family);
    if (!shipped) continue;  // a family without a shipped space (tests register some)
    const SearchSpace& space = *shipped;
    try {
      check_family_serves(family, problem);
      space.check_problem(problem, space.default_arch());
    } catch (const InputError& e) {
      why_not.push_back(e.what());
      continue;
    }
    out.push_back({space.family(), space.path(), space.hash(), space.text()});
  }
  if (out.empty())
    throw InputError(fmt::format("no template serves {}: {}", problem.str(), fmt::join(why_not, "; ")));
  return out;
}

std::vector<CampaignSpace> runnable_spaces(const std::vector<CampaignSpace>& spaces, const Problem& problem,
                                           const std::string& arch, std::vector<std::string>* why_not) {
  std::vector<CampaignSpace> out;
  for (const CampaignSpace& s : spaces) {
    try {
      const SearchSpace space = SearchSpace::parse(s.text, s.path);
      space.check_problem(problem, space_arch_for_device(space, arch));
      out.push_back(s);
    } catch (const InputError& e) {
      if (why_not) why_not->push_back(e.what());
    }
  }
  return out;
}

CampaignSpec campaign_spec(const std::string& name, const Problem& problem, const JobRequest& request) {
  CampaignSpec spec;
  set_spaces(spec, request.spaces);
  spec.name = name;
  spec.problem = problem;
  spec.strategy = request.strategy;
  spec.seed = static_cast<std::int64_t>(request.seed);
  spec.budget_evals = request.budget_evals;
  spec.budget_seconds = request.budget_seconds;
  return spec;
}

std::string default_campaign_name(const std::vector<CampaignSpace>& spaces, const Problem& problem,
                                  const std::string& arch) {
  CampaignSpec spec;
  set_spaces(spec, spaces);
  return arch.empty() ? fmt::format("{}:{}", spec.family, problem.str())
                      : fmt::format("{}:{}:{}", spec.family, problem.str(), arch);
}

search::TuneOptions tune_options(const JobRequest& r, std::uint64_t space_size) {
  search::TuneOptions topts;
  topts.strategy = r.strategy;
  topts.seed = r.seed;
  topts.budget_evals = r.budget_evals;
  topts.budget_seconds = r.budget_seconds;
  // Exhaustive means all of it: it converges only when asked to.
  topts.patience = r.patience >= 0              ? r.patience
                   : r.strategy == "exhaustive" ? 0
                                                : std::max<std::int64_t>(50, static_cast<std::int64_t>(space_size / 8));
  topts.min_gain_pct = r.min_gain_pct;
  topts.final_top = r.final_top;
  topts.final_rounds = r.final_rounds;
  topts.final_screen = r.final_screen;
  return topts;
}

GpuRunnerOptions gpu_runner_options(const JobRequest& r, const RunnerSettings& settings,
                                    const std::atomic<bool>* cancel) {
  GpuRunnerOptions ropts;
  ropts.device = settings.device;
  ropts.jobs = settings.jobs;
  ropts.compile_timeout = std::chrono::milliseconds(static_cast<long long>(settings.compile_timeout_s * 1000));
  ropts.deadline_floor_s = settings.deadline_floor_s;
  ropts.timing.max_seconds = r.max_seconds;
  ropts.timing.min_seconds = r.min_seconds;
  ropts.final_timing.max_seconds = r.max_seconds;
  ropts.final_timing.min_seconds = std::min(r.final_min_seconds, r.max_seconds);
  // The screening samples 0.3 s, or less where the rounds' timings are shorter still.
  ropts.screen_timing.max_seconds = r.max_seconds;
  ropts.screen_timing.min_seconds = std::min(ropts.screen_timing.min_seconds, ropts.final_timing.min_seconds);
  ropts.validation_seed = r.seed;
  ropts.cancel = cancel;
  return ropts;
}

double problem_distance(const Problem& a, const Problem& b) {
  // Lengths count most, then the amount of parallel work, dtype and causality; page sizes (both
  // paged) and the shortest lengths of packed batches (both varlen) count like lengths. Variants:
  // a window changes how many keys a row sees (its span counts like a length when both have one,
  // a window against none like a causal flag); a soft-cap or sinks change only the softmax's cost.
  // A latent cache (V is K's columns) against separate K and V counts like a dtype: the same tiles,
  // other traffic. So does an FP8 KV cache against one of q's dtype (kv_dtype=fp8: other loads and
  // conversions, half the cache's bytes). The backward pass against the forward counts more than any
  // of those (2.0): other kernels altogether, whose configs say little of each other's (a space that
  // lists both passes). The FP8 forward against a 16-bit one counts as much (2.0): FP8 MMAs at twice
  // the rate, another register budget (P.V's own accumulator), block_n in steps of 32.
  auto lg = [](double x, double y) { return std::abs(std::log2(x / y)); };
  auto span = [](const Problem& p) { return p.window_left < 0 ? double(p.sk) : double(p.window_left + 1); };
  return lg(a.s, b.s) + lg(a.sk, b.sk) + 0.5 * lg(double(a.b) * a.h, double(b.b) * b.h) + 0.5 * lg(a.hkv, b.hkv) +
         (a.dtype != b.dtype ? 1.0 : 0.0) + (a.causal != b.causal ? 2.0 : 0.0) +
         (a.paged() && b.paged() ? lg(double(a.page), double(b.page)) : 0.0) +
         (a.is_varlen() && b.is_varlen() ? lg(double(a.varlen), double(b.varlen)) : 0.0) +
         (a.windowed() != b.windowed() ? 2.0 : a.windowed() ? lg(span(a), span(b)) : 0.0) +
         (a.softcapped() != b.softcapped() ? 0.5 : 0.0) + (a.sinks != b.sinks ? 0.25 : 0.0) +
         (a.latent != b.latent ? 1.0 : 0.0) + (a.kv_fp8 != b.kv_fp8 ? 1.0 : 0.0) +
         (a.backward != b.backward ? 2.0 : 0.0) + (a.qkv_fp8 != b.qkv_fp8 ? 2.0 : 0.0);
}

std::pair<std::optional<Problem>, std::vector<Config>> warm_start(ResultReader& results, const std::string& family,
                                                                  const Problem& problem, int count, double* best_us,
                                                                  std::size_t* problems, const std::string& gpu) {
  if (best_us) *best_us = 0;
  if (problems) *problems = 0;
  std::vector<std::pair<double, Problem>> near;
  for (const Problem& p : results.problems_with_results(family)) {
    // The same head dims (a config's tiles are sized by them), entry point and packing.
    if (p.d != problem.d || p.head_dim_v() != problem.head_dim_v() || p.paged() != problem.paged() ||
        p.is_varlen() != problem.is_varlen())
      continue;
    near.emplace_back(problem_distance(p, problem), p);
  }
  if (near.empty() || count <= 0) return {std::nullopt, {}};
  // Nearest first; among equals, the results' own order (as before: the first one found).
  std::stable_sort(near.begin(), near.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<std::vector<Config>> tops;
  for (const auto& [d, p] : near) {
    if (tops.size() == kWarmStartProblems || d > near.front().first + kWarmStartReach) break;
    BestQuery q;
    q.problem = p;
    double* time = tops.empty() ? best_us : nullptr;
    std::vector<Config> top;
    if (!gpu.empty()) {  // this GPU model's own results first; another model's where it has none
      q.gpu = gpu;
      top = search::warm_start_configs(results, q, family, static_cast<std::size_t>(count), time);
      q.gpu.reset();
    }
    if (top.empty()) top = search::warm_start_configs(results, q, family, static_cast<std::size_t>(count), time);
    tops.push_back(std::move(top));
  }
  // In turns: each problem's best, nearest first, then each one's second, ...; a config already
  // taken is skipped, so where the neighbours agree the nearest gives more of its own.
  std::vector<Config> configs;
  std::set<std::string> taken;
  std::vector<bool> gave(tops.size(), false);
  for (std::size_t r = 0; configs.size() < static_cast<std::size_t>(count); ++r) {
    bool more = false;
    for (std::size_t i = 0; i < tops.size() && configs.size() < static_cast<std::size_t>(count); ++i) {
      if (r >= tops[i].size()) continue;
      more = true;
      if (taken.insert(config_str(tops[i][r])).second) configs.push_back(tops[i][r]), gave[i] = true;
    }
    if (!more) break;
  }
  if (problems) *problems = static_cast<std::size_t>(std::count(gave.begin(), gave.end(), true));
  return {near.front().second, configs};
}

namespace {

// The moves the family's launch plan predicts pay from configs[0] (Family::plan_moves), put right after
// it, the last configs giving way; what was added, said as config strings.
std::vector<std::string> add_plan_moves(std::vector<Config>& configs, const SearchSpace& space, const Problem& problem,
                                        std::size_t count, const WarmStartDevice& device) {
  if (configs.empty() || device.sm_count <= 0 || !device.arch_for) return {};
  const std::vector<const Family*>& builtin = builtin_families();
  const auto f = std::find_if(builtin.begin(), builtin.end(), [&](const Family* x) { return x->name == space.family(); });
  if (f == builtin.end() || !(*f)->plan_moves) return {};  // a test family, or no predictions
  std::vector<Config> moves;
  try {
    moves = (*f)->plan_moves(space, configs[0], problem, device.arch_for(space.family()), device.sm_count);
  } catch (const std::exception&) {
    return {};  // a prediction that cannot be made (a config the space renders no longer): none
  }
  std::vector<std::string> added;
  std::size_t at = 1;
  for (Config& m : moves) {
    const std::string key = config_str(m);
    if (std::any_of(configs.begin(), configs.end(), [&](const Config& c) { return config_str(space.complete(c)) == key; }))
      continue;  // the warm start has it already
    configs.insert(configs.begin() + static_cast<std::ptrdiff_t>(at++), std::move(m));
    added.push_back(key);
  }
  if (configs.size() > count) configs.resize(std::max(count, at));
  return added;
}

}  // namespace

void add_warm_starts(search::TuneOptions& topts, ResultReader& results, const JobSpaces& spaces,
                     const Problem& problem, int count, search::Progress& progress,
                     const WarmStartFallback* fallback, const std::string& gpu, const WarmStartDevice* device) {
  ResultReader* other = nullptr;
  bool opened = false;
  // Per family: where its warm start came from and its best time there.
  struct Source {
    std::string family, problem;
    const ResultReader* reader = nullptr;
    double best_us = 0;
  };
  std::vector<Source> sources;
  for (const SearchSpace* s : spaces.sorted) {
    double best_us = 0;
    ResultReader* reader = &results;
    std::size_t problems = 0;
    auto [nearest, configs] = warm_start(results, s->family(), problem, count, &best_us, &problems, gpu);
    std::string from;
    if ((!nearest || configs.empty()) && fallback) {
      if (!opened) other = fallback->open(), opened = true;
      if (other) {
        reader = other;
        std::tie(nearest, configs) = warm_start(*other, s->family(), problem, count, &best_us, &problems, gpu);
        from = fmt::format(" of {} '{}'", fallback->label, other->path());
      }
    }
    if (!nearest || configs.empty()) continue;
    const std::vector<std::string> moves =
        device ? add_plan_moves(configs, *s, problem, static_cast<std::size_t>(count), *device) : std::vector<std::string>{};
    sources.push_back({s->family(), nearest->str(), reader, best_us});
    for (Config& c : configs)
      topts.warm_start.push_back(spaces.mixed() ? search::tag_family(s->family(), std::move(c)) : c);
    progress.event(fmt::format("warm start: {} configs from {}{}{}{}", configs.size() - moves.size(), nearest->str(),
                               problems > 1 ? fmt::format(" and {} problems near it", problems - 1) : "", from,
                               spaces.mixed() ? fmt::format(" ({})", s->family()) : ""));
    for (const std::string& m : moves)
      progress.event(fmt::format("warm start: after the first, what {}'s launch plan predicts runs this problem "
                                 "sooner on {} SMs: {}",
                                 s->family(), device->sm_count, m));
  }
  // Times compare only on one problem of one database, and only when every family has one; and only
  // evo's warm-up takes them (MultiFamily: exhaustive and random take no warm start).
  if (!spaces.mixed() || sources.size() != spaces.sorted.size() || topts.strategy != "evo") return;
  double fastest = 0;
  std::string fastest_family;
  for (const Source& s : sources) {
    if (s.problem != sources[0].problem || s.reader != sources[0].reader || s.best_us <= 0) return;
    if (fastest == 0 || s.best_us < fastest) fastest = s.best_us, fastest_family = s.family;
  }
  const search::AllocationOptions allocation;
  for (const Source& s : sources) {
    topts.warm_start_best_us[s.family] = s.best_us;
    if (s.best_us >= allocation.behind * fastest)
      progress.event(fmt::format("warm start: {} was {:.2f}x {}'s time there: its warm-up is its best {} configs",
                                 s.family, s.best_us / fastest, fastest_family, allocation.behind_warmup));
  }
}

std::uint64_t count_valid(const JobSpaces& spaces, const Problem& problem, search::Runner& runner,
                          std::vector<std::string>* sizes) {
  std::uint64_t total = 0;
  for (const SearchSpace* s : spaces.sorted) {
    const std::string a = runner.arch_for(s->family());
    s->check_problem(problem, a);
    const std::uint64_t n = s->count(problem, a);
    if (n == 0) throw WorkError(fmt::format("{} has no valid config for {} on {}", s->path(), problem.str(), a));
    total += n;
    if (sizes) sizes->push_back(fmt::format("{} {}", s->family(), n));
  }
  return total;
}

}  // namespace attntune::service
