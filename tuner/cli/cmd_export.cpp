// attntune export: the winner as one self-contained .cu (docs/CONTRACT.md "The exported kernel";
// docs/EXPORT.md shows how to use it). Reads the database read-only.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "service/plan.hpp"
#include "cli/format.hpp"
#include "core/error.hpp"
#include "core/output_file.hpp"
#include "db/store.hpp"
#include "export/export.hpp"
#include "export/select.hpp"
#include "export/torch_package.hpp"

namespace attntune::cli {

namespace {

constexpr const char* kSummary = "write the best kernel (or every problem's best) as a standalone .cu";

int run_export(const std::vector<std::string>& args) {
  std::string db_path, campaign, problem_spec, output, dtype, arch, gpu, space_file, plan_path, torch_dir;
  int rank = 1;
  bool all_best = false;
  po::options_description opts("options");
  // clang-format off
  opts.add_options()
      ("db", po::value(&db_path)->default_value(default_db_path()), "database ($ATTNTUNE_DB, else ./attntune.db)")
      ("campaign", po::value(&campaign), "export this campaign's best config")
      ("problem", po::value(&problem_spec), "export this problem's best config across campaigns")
      ("all-best", po::bool_switch(&all_best), "export every problem's best, with a dispatcher, in one file")
      ("plan", po::value(&plan_path), "--all-best: only the problems of this plan (attntune plan -o PLAN): one "
                                      "library for a model")
      ("rank", po::value(&rank)->default_value(1), "the N-th best instead of the best (--campaign, --problem)")
      ("dtype", po::value(&dtype), "--all-best: only this dtype (fp16 or bf16); needed when the database has both")
      ("arch", po::value(&arch), "only results measured on this arch, e.g. sm_90")
      ("gpu", po::value(&gpu), "only results measured on this GPU model (as `campaigns` names it); needed when the "
                               "results span several")
      ("space", po::value(&space_file), "the search-space YAML, for campaigns stored without it (older databases)")
      ("output,o", po::value(&output), "the .cu file to write (- for stdout)")
      ("torch", po::value(&torch_dir), "also (or instead of -o) write a PyTorch package to this directory: "
                                       "`import attntune; attntune.attention(q, k, v)` (docs/EXPORT.md)");
  // clang-format on
  po::variables_map vm;
  if (parse_args("export", kSummary, opts, args, vm)) return 0;

  ExportQuery q;
  if (vm.count("campaign")) q.campaign = campaign;
  if (vm.count("problem")) q.problem = Problem::parse(problem_spec);
  q.all_best = all_best;
  q.rank = rank;
  if (vm.count("dtype")) {
    if (dtype != "fp16" && dtype != "bf16")
      throw InputError(fmt::format("export: --dtype must be fp16 or bf16 (got '{}')", dtype));
    q.dtype = dtype == "fp16" ? DType::kFp16 : DType::kBf16;
  }
  if (vm.count("arch")) q.arch = arch;
  if (vm.count("gpu")) q.gpu = gpu;
  std::optional<Plan> plan;
  if (vm.count("plan")) {
    if (!all_best) throw InputError("export: --plan applies to --all-best");
    plan = Plan::load(plan_path);
    q.only.emplace();
    for (const PlanEntry& e : plan->entries)
      if (!q.dtype || e.problem.dtype == *q.dtype) q.only->push_back(e.problem);
  }
  if (vm.count("space")) q.space_file = space_file;
  const int modes = (q.campaign ? 1 : 0) + (q.problem ? 1 : 0) + (q.all_best ? 1 : 0);
  if (modes != 1) throw InputError("export: give exactly one of --campaign, --problem or --all-best");
  const bool torch = vm.count("torch") > 0;
  if (torch && torch_dir.empty()) throw InputError("export: --torch needs a directory");
  if ((!vm.count("output") || output.empty()) && !torch)
    throw InputError("export: -o FILE.cu is required (- for stdout), or --torch DIR");

  Store store = Store::open(db_path, Store::Mode::kReadOnly);
  const std::vector<ExportItem> items = select_for_export(store, q);
  const ExportMode mode = q.all_best ? ExportMode::kAllBest : ExportMode::kSingle;
  const std::string source = export_source(items, mode);

  std::ostream& report = output == "-" ? std::cerr : std::cout;
  if (output == "-") {
    std::cout << source;
    finish_stdout();  // before saying it was exported
  } else if (!output.empty()) {
    // Never over the database read (or the default one), whatever the spelling (issue 28).
    write_output_file("-o", output, source, {db_path, default_db_path()});
  }
  if (!output.empty())
    report << fmt::format("exported {} kernel{} for {} to {}\n", items.size(), items.size() == 1 ? "" : "s",
                          items.front().row.arch, output == "-" ? "stdout" : output);
  if (torch) {
    write_torch_package(torch_dir, source, export_info(items, mode).dump(2), {db_path, default_db_path()});
    report << fmt::format("wrote a PyTorch package of {} kernel{} to {}: PYTHONPATH={} python -c 'import attntune' "
                          "(or pip install {}); the first import builds it (nvcc, torch.utils.cpp_extension)\n",
                          items.size(), items.size() == 1 ? "" : "s", torch_dir, torch_dir, torch_dir);
  }
  if (plan) {
    // What the model runs that the library does not serve yet: tune it next.
    std::vector<std::string> missing;
    for (const Problem& p : *q.only)
      if (std::none_of(items.begin(), items.end(), [&](const ExportItem& it) { return it.row.problem == p; }))
        missing.push_back(p.str());
    if (!missing.empty())
      std::cerr << fmt::format("attntune: note: {} of the plan's {} problems have no result yet (attntune status): "
                               "{}\n",
                               missing.size(), q.only->size(), fmt::join(missing, "; "));
  }
  for (const ExportItem& it : items)
    report << fmt::format("  {}  {} µs  {} TFLOP/s  {} {}  (campaign {}, {})\n", it.row.problem.str(),
                          format_us(it.row.median_us), format_tflops(it.row.tflops), it.row.family,
                          config_str(it.row.config), it.row.campaign, it.row.gpu);
  return 0;
}

const bool registered = register_command({"export", kSummary, false, run_export});

}  // namespace

}  // namespace attntune::cli
