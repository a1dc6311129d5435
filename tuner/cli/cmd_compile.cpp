// attntune compile: NVRTC-compile the valid configs of a space for an arch and report failures
// and resource use. Needs no GPU.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <random>
#include <thread>

#include <unistd.h>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "cli/format.hpp"
#include "core/error.hpp"
#include "db/store.hpp"
#include "eval/build_pool.hpp"

namespace attntune::cli::cmd_compile {
namespace {

// Every k-th config from a seeded offset: a fixed, deterministic spread over the enumeration.
std::vector<Config> sample(std::vector<Config> all, std::size_t n, std::uint64_t seed) {
  if (n >= all.size()) return all;
  std::vector<Config> out;
  std::mt19937_64 rng(seed);
  std::vector<std::size_t> idx(all.size());
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::shuffle(idx.begin(), idx.end(), rng);
  idx.resize(n);
  std::sort(idx.begin(), idx.end());
  for (auto i : idx) out.push_back(std::move(all[i]));
  return out;
}

int run_compile(const std::vector<std::string>& args) {
  po::options_description opts("options");
  std::string space_path, problem_spec, arch, db_path, format = "table";
  long long limit = 0, sample_n = 0, seed = 1;
  double compile_timeout_s = 120;
  int jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  opts.add_options()
      ("space", po::value(&space_path)->required(), "search space YAML")
      ("problem", po::value(&problem_spec)->required(), "problem spec, e.g. b=4,h=16,s=4096,d=128,dtype=bf16,causal=0")
      ("arch", po::value(&arch), "target arch, e.g. sm_89, sm_90 (default: the space's highest)")
      ("limit", po::value(&limit), "compile only the first N valid configs")
      ("sample", po::value(&sample_n), "compile a fixed pseudo-random sample of N valid configs (see --seed)")
      ("seed", po::value(&seed), "seed of --sample (default 1)")
      ("jobs,j", po::value(&jobs), "parallel NVRTC jobs (default: all cores)")
      ("compile-timeout", po::value(&compile_timeout_s), "seconds before a hung NVRTC build is killed (default 120)")
      ("db", po::value(&db_path), "cache builds in this database (created if missing)")
      ("format", po::value(&format), "table | json | csv");
  po::variables_map vm;
  if (parse_args("compile", "NVRTC-compile valid configs of a space; report failures and resource use", opts, args, vm))
    return 0;
  const Format fmt_out = parse_format(format);
  if (jobs < 1) throw InputError("compile: --jobs must be at least 1");
  if (limit < 0 || sample_n < 0) throw InputError("compile: --limit and --sample must not be negative");
  if (compile_timeout_s <= 0) throw InputError("compile: --compile-timeout must be positive");

  const SearchSpace space = SearchSpace::load(space_path);
  const Problem problem = Problem::parse(problem_spec);
  if (arch.empty()) arch = space.default_arch();
  check_family_serves(space.family(), problem);
  space.check_problem(problem, arch);
  std::vector<Config> configs = space.enumerate(problem, arch);
  if (configs.empty()) throw WorkError(fmt::format("no valid config in {} for {} on {}", space.path(), problem.str(), arch));
  if (sample_n > 0) configs = sample(std::move(configs), static_cast<std::size_t>(sample_n), static_cast<std::uint64_t>(seed));
  if (limit > 0 && static_cast<std::size_t>(limit) < configs.size()) configs.resize(static_cast<std::size_t>(limit));

  std::optional<Store> store;
  if (!db_path.empty()) store.emplace(Store::open(db_path, Store::Mode::kCreate));

  // Builds run in build-worker processes (a hung NVRTC is killed after --compile-timeout), all
  // at once up to --jobs, answered from the cache when the store has them.
  BuildPoolOptions pool_opts;
  pool_opts.nvrtc_options = family_nvrtc_options(space.family());
  pool_opts.jobs = jobs;
  pool_opts.compile_timeout = std::chrono::milliseconds(static_cast<long long>(compile_timeout_s * 1000));
  pool_opts.store = store ? &*store : nullptr;
  BuildPool pool(pool_opts);
  for (const auto& c : configs) pool.submit({c, render_kernel(space, c, problem, arch), arch});

  std::vector<BuildOutcome> outcomes;
  const auto t0 = std::chrono::steady_clock::now();
  const bool tty = isatty(fileno(stderr));
  std::size_t done = 0, failed = 0, hits = 0;
  while (auto o = pool.next()) {
    ++done;
    failed += o->build.status != "ok";
    hits += o->cache_hit;
    if (tty) std::cerr << fmt::format("\rcompiled {}/{} ({} failed, {} cached)", done, configs.size(), failed, hits) << std::flush;
    outcomes.push_back(std::move(*o));
  }
  if (tty) std::cerr << "\n";
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Report in enumeration order, whatever order the builds finished in.
  std::sort(outcomes.begin(), outcomes.end(),
            [&](const BuildOutcome& a, const BuildOutcome& b) { return config_str(a.job.config) < config_str(b.job.config); });

  if (fmt_out == Format::kJson) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& o : outcomes) {
      const auto smem_dynamic = define_value(o.job.kernel.launch.defines, "SMEM_BYTES");
      nlohmann::json j = {{"config", config_json(o.job.config)}, {"status", o.build.status}, {"arch", arch},
                          {"registers", o.build.registers}, {"smem_static", o.build.smem_static},
                          {"smem_dynamic", smem_dynamic}, {"spill_stores", o.build.spill_stores},
                          {"spill_loads", o.build.spill_loads}, {"local_bytes", o.build.local_bytes},
                          {"compile_ms", o.build.compile_ms}, {"cached", o.cache_hit},
                          {"source_hash", o.job.kernel.source_hash}};
      if (o.build.status != "ok") j["log"] = o.build.log;
      arr.push_back(std::move(j));
    }
    print_json(std::cout, arr);
  } else {
    Table t({"config", "status", "regs", "smem", "spill_st", "spill_ld", "stack", "ms"});
    for (const auto& o : outcomes) {
      const auto smem_dynamic = define_value(o.job.kernel.launch.defines, "SMEM_BYTES");
      t.add_row({config_str(o.job.config), o.build.status, std::to_string(o.build.registers),
                 std::to_string(o.build.smem_static + smem_dynamic), std::to_string(o.build.spill_stores),
                 std::to_string(o.build.spill_loads), std::to_string(o.build.local_bytes),
                 o.cache_hit ? "cached" : fmt::format("{:.0f}", o.build.compile_ms)});
    }
    if (fmt_out == Format::kCsv) t.print_csv(std::cout);
    else t.print(std::cout);
    for (const auto& o : outcomes)
      if (o.build.status != "ok")
        std::cerr << fmt::format("compile error: {}\n{}\n", config_str(o.job.config), o.build.log);
    std::cerr << fmt::format("{} configs for {} on {}: {} ok, {} failed, {} from cache, {:.1f} s with {} jobs\n",
                             outcomes.size(), problem.str(), arch, outcomes.size() - failed, failed, hits, wall, jobs);
  }
  return failed ? 1 : 0;
}

const bool registered = register_command(
    {"compile", "NVRTC-compile valid configs of a space for an arch; report failures and resource use", false, run_compile});

}  // namespace
}  // namespace attntune::cli::cmd_compile
