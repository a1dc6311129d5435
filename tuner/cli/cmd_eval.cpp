// attntune eval: validate and time one config of a space on the GPU, print the result and, with
// --db, record it (campaign "eval:<family>:<problem>:<space hash>"). Exit 0 when the candidate is
// ok, 1 when it failed (its status says how), 3 when there is no GPU.
#include <chrono>
#include <iostream>
#include <optional>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "cli/format.hpp"
#include "cli/job_options.hpp"
#include "core/error.hpp"
#include "db/store.hpp"
#include "eval/build_pool.hpp"
#include "eval/evaluator.hpp"

namespace attntune::cli::cmd_eval {
namespace {

std::string opt_str(const std::optional<double>& v, std::string (*fmt_fn)(double)) { return v ? fmt_fn(*v) : "-"; }

nlohmann::ordered_json opt_json(const std::optional<double>& v) {
  return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
}

int run_eval(const std::vector<std::string>& args) {
  po::options_description opts("options");
  std::string space_path, problem_spec, config_text, db_path, format = "table";
  int device = 0;
  double compile_timeout_s = 120, deadline_floor_s = 10, max_seconds = 2.0, min_seconds = 0;
  std::uint64_t seed = 1;
  opts.add_options()
      ("space", po::value(&space_path)->required(), "search space YAML")
      ("problem", po::value(&problem_spec)->required(), "problem spec, e.g. b=4,h=16,s=4096,d=128,dtype=bf16,causal=0")
      ("config", po::value(&config_text)->required(), "the config: every parameter of the space, k=v,k=v")
      ("db", po::value(&db_path), "record the result in this database (created if missing)")
      ("device", po::value(&device), "CUDA device ordinal (default 0)")
      ("format", po::value(&format), "table | json")
      ("seed", po::value(&seed), "seed of the validation inputs (timing uses others; default 1)")
      ("max-seconds", po::value(&max_seconds), "cap on timing repetitions, in seconds (default 2)")
      ("min-seconds", po::value(&min_seconds), "least time the timing samples, in seconds (default 0: until the "
                                               "median holds within 1%)");
  add_limit_options(opts, compile_timeout_s, deadline_floor_s);
  po::variables_map vm;
  if (parse_args("eval", "validate and time one config on the GPU; print (and record) the result", opts, args, vm))
    return 0;
  const Format fmt_out = parse_format(format, false);
  if (device < 0) throw InputError("eval: --device must not be negative");
  if (compile_timeout_s <= 0 || deadline_floor_s <= 0 || max_seconds <= 0)
    throw InputError("eval: --compile-timeout, --deadline-floor and --max-seconds must be positive");
  if (min_seconds < 0 || min_seconds > max_seconds)
    throw InputError(fmt::format("eval: --min-seconds ({:g}) must lie between 0 and --max-seconds ({:g})", min_seconds,
                                 max_seconds));

  const SearchSpace space = SearchSpace::load(space_path);
  const Problem problem = Problem::parse(problem_spec);
  const Config config = space.parse_config(config_text);

  // The worker says which GPU (and so which arch) this is; no GPU ends here with exit code 3.
  EvaluatorOptions eopts;
  eopts.device = device;
  eopts.deadline_floor_s = deadline_floor_s;
  Evaluator evaluator(eopts);
  DeviceInfo gpu = evaluator.device();
  gpu.arch = space_arch_for_device(space, gpu.arch);  // sm_90 -> sm_90a for a Hopper-only space: built and filed so
  const std::string arch = gpu.arch;
  check_family_serves(space.family(), problem);
  space.check_problem(problem, arch);
  if (auto why = space.check(config, problem, arch))
    throw InputError(fmt::format("eval: {} is not a valid config of {} for {} on {}: {}", config_str(config), space.path(),
                                 problem.str(), arch, *why));
  const RenderedKernel kernel = render_kernel(space, config, problem, arch);
  const std::int64_t smem_dynamic = define_value(kernel.launch.defines, "SMEM_BYTES");

  std::optional<Store> store;
  if (!db_path.empty()) store.emplace(Store::open(db_path, Store::Mode::kCreate));

  BuildPoolOptions bopts;
  bopts.nvrtc_options = family_nvrtc_options(space.family());
  bopts.jobs = 1;
  bopts.compile_timeout = std::chrono::milliseconds(static_cast<long long>(compile_timeout_s * 1000));
  bopts.store = store ? &*store : nullptr;
  BuildPool pool(bopts);
  pool.submit(BuildJob{config, kernel, arch});
  const BuildOutcome built = *pool.next();

  EvalOutcome result;
  if (built.build.status != "ok") {
    result.record = build_failure_record(built.build);
  } else {
    EvalRequest req;
    req.cubin = built.build.cubin;
    req.launch = kernel.launch;
    req.problem = problem;
    req.validation_seed = seed;
    req.timing_seed = seed + 0x9e3779b97f4a7c15ull;  // far from any validation seed
    req.timing.max_seconds = max_seconds;
    req.timing.min_seconds = min_seconds;
    result = evaluator.evaluate(req);
  }
  const EvalRecord& r = result.record;

  if (store) {
    const std::int64_t device_id = store->upsert_device(gpu);
    CampaignSpec spec;
    spec.name = fmt::format("eval:{}:{}:{}", space.family(), problem.str(), space.hash().substr(0, 8));
    spec.problem = problem;
    // With the space's text, as tune stores it: export reads the space from the campaign (without
    // it, exporting an eval's result needed --space).
    set_spaces(spec, {{space.family(), space.path(), space.hash(), space.text()}});
    spec.strategy = "eval";
    spec.seed = static_cast<std::int64_t>(seed);
    const std::int64_t campaign = store->open_campaign(spec, device_id);
    const std::int64_t candidate = store->upsert_candidate(space.family(), config, kernel.source_hash);
    store->record_evaluation(campaign, candidate, device_id, r);
    store->finish_campaign(campaign, "completed", "eval");
  }

  const BuildRecord& b = built.build;
  if (fmt_out == Format::kJson) {
    nlohmann::ordered_json j;
    j["template"] = space.family();
    j["config"] = config_json(config);
    j["problem"] = problem_json(problem);
    j["gpu"] = gpu.name;
    j["arch"] = arch;
    j["status"] = r.status;
    j["error"] = r.error;
    j["median_us"] = opt_json(r.median_us);
    j["min_us"] = opt_json(r.min_us);
    j["max_us"] = opt_json(r.max_us);
    j["stdev_us"] = opt_json(r.stdev_us);
    j["count"] = r.count;
    j["tflops"] = opt_json(r.tflops);
    j["max_abs_err"] = opt_json(r.max_abs_err);
    j["err_bound"] = opt_json(r.err_bound);
    j["registers"] = b.registers;
    j["spill_stores"] = b.spill_stores;
    j["spill_loads"] = b.spill_loads;
    j["local_bytes"] = b.local_bytes;
    j["smem_static"] = b.smem_static;
    j["smem_dynamic"] = smem_dynamic;
    j["compile_ms"] = b.compile_ms;
    j["cached"] = built.cache_hit;
    j["source_hash"] = kernel.source_hash;
    print_json(std::cout, j);
  } else {
    Table t({"field", "value"});
    t.add_row({"config", config_str(config)});
    t.add_row({"problem", problem.str()});
    t.add_row({"gpu", fmt::format("{} ({})", gpu.name, arch)});
    t.add_row({"status", r.status});
    if (r.median_us)
      t.add_row({"median µs", fmt::format("{} (min {}, max {}, stdev {}, {} runs)", format_us(*r.median_us),
                                          opt_str(r.min_us, format_us), opt_str(r.max_us, format_us),
                                          opt_str(r.stdev_us, format_us), r.count)});
    if (r.tflops) t.add_row({"TFLOP/s", format_tflops(*r.tflops)});
    if (r.max_abs_err)
      t.add_row({"max error", fmt::format("{} (bound {})", format_error(*r.max_abs_err), opt_str(r.err_bound, format_error))});
    t.add_row({"registers", fmt::format("{} (spill stores {}, loads {}; stack {} B)", b.registers, b.spill_stores,
                                        b.spill_loads, b.local_bytes)});
    t.add_row({"smem", fmt::format("{} B static + {} B dynamic", b.smem_static, smem_dynamic)});
    t.add_row({"compile", built.cache_hit ? "cached" : fmt::format("{:.0f} ms", b.compile_ms)});
    t.print(std::cout);
    if (r.status != "ok") std::cout << "\n" << r.status << ": " << r.error << "\n";
  }
  return r.status == "ok" ? 0 : 1;
}

const bool registered = register_command(
    {"eval", "validate and time one config on the GPU; print (and record) the result", false, run_eval});

}  // namespace
}  // namespace attntune::cli::cmd_eval
