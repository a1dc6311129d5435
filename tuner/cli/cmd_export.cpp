// attntune export: the winner as one self-contained .cu (docs/CONTRACT.md "The exported kernel";
// docs/EXPORT.md shows how to use it). Reads the database read-only. A problem the database has no
// result for (--problem, or a problem of --all-best --plan) is answered from the shipped database
// (cli/shipped.hpp), saying so, and the export's provenance names it as the source.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "service/plan.hpp"
#include "cli/format.hpp"
#include "cli/shipped.hpp"
#include "core/error.hpp"
#include "core/output_file.hpp"
#include "db/store.hpp"
#include "export/export.hpp"
#include "export/select.hpp"
#include "export/torch_package.hpp"
#include "families/family.hpp"

namespace attntune::cli::cmd_export {

namespace {

constexpr const char* kSummary = "write the best kernel (or every problem's best) as a standalone .cu";

std::vector<Problem> without(const std::vector<Problem>& all, const std::vector<Problem>& drop) {
  std::vector<Problem> out;
  for (const Problem& p : all)
    if (std::find(drop.begin(), drop.end(), p) == drop.end()) out.push_back(p);
  return out;
}

// What to export: the user's database's results, and for the problems it has none for (--problem,
// or the plan's with --all-best --plan), the shipped database's, said in one line on stderr. The
// user's database may be absent then (day one); when the shipped one cannot answer either, the
// user's database gives its usual error.
std::vector<ExportItem> select_items(const std::string& db_path, const ExportQuery& q, ShippedDb& shipped,
                                     const std::string& plan_path) {
  const bool may_ship = q.problem.has_value() || (q.all_best && q.only);
  std::optional<Store> store;
  std::error_code ec;
  if (!may_ship || std::filesystem::exists(db_path, ec)) store.emplace(Store::open(db_path, Store::Mode::kReadOnly));
  if (!may_ship) return select_for_export(*store, q);

  const std::vector<Problem> wanted = q.problem ? std::vector<Problem>{*q.problem} : *q.only;
  const std::vector<Problem> missing = store ? problems_without_results(*store, q, wanted) : wanted;
  Store* from = missing.empty() ? nullptr : shipped.store();
  std::vector<Problem> served = from ? without(missing, problems_without_results(*from, q, missing)) : missing;
  std::vector<ExportItem> own;
  if (!from || served.empty() || missing.size() < wanted.size()) {
    // A problem neither database has: the error says both were asked.
    const bool none_shipped = q.problem && served.empty();
    if (!store) {  // absent: no such database (may_ship)
      if (none_shipped)
        throw InputError(fmt::format("database '{}' does not exist{}", db_path, shipped_miss(shipped, *q.problem)));
      store.emplace(Store::open(db_path, Store::Mode::kReadOnly));  // its error: no such database
    }
    try {
      own = select_for_export(*store, q);
    } catch (const WorkError& e) {
      if (!none_shipped) throw;
      throw WorkError(e.what() + shipped_miss(shipped, *q.problem));
    }
    if (!from) return own;
  }
  // One library holds one dtype and one arch: the shipped results follow the user's own. A problem the
  // file holds for several GPU models is answered for this machine's when it is one of them.
  ExportQuery sq = q;
  sq.this_gpu_first = true;
  if (!own.empty()) {
    const DType dtype = own.front().row.problem.dtype;
    served.erase(std::remove_if(served.begin(), served.end(), [&](const Problem& p) { return p.dtype != dtype; }),
                 served.end());
  }
  if (served.empty()) return own;
  if (q.all_best) sq.only = served;
  std::vector<ExportItem> items = select_for_export(*from, sq);
  if (!own.empty()) {
    const std::string arch = base_arch(own.front().row.arch);
    items.erase(std::remove_if(items.begin(), items.end(),
                               [&](const ExportItem& it) { return base_arch(it.row.arch) != arch; }),
                items.end());
  }
  if (items.empty()) return own;
  std::vector<BestRow> rows;
  for (ExportItem& it : items) {
    it.source = shipped_source(shipped.path());
    rows.push_back(it.row);
  }
  if (q.problem)
    std::cerr << shipped_note(shipped.path(), db_path, "for problem " + q.problem->str(), rows,
                              fmt::format("attntune tune --problem {}", q.problem->str()));
  else
    std::cerr << shipped_note(shipped.path(), db_path,
                              fmt::format("for {} of the {}'s {} problems", items.size(),
                                          plan_path.empty() ? "training step" : "plan", wanted.size()),
                              rows,
                              plan_path.empty() ? std::string("attntune tune --problem ...,pass=fwdbwd")
                                                : fmt::format("attntune submit {} and attntune serve", plan_path));
  own.insert(own.end(), std::make_move_iterator(items.begin()), std::make_move_iterator(items.end()));
  return own;
}

int run_export(const std::vector<std::string>& args) {
  std::string db_path, campaign, problem_spec, output, dtype, arch, gpu, space_file, plan_path, torch_dir;
  int rank = 1;
  bool all_best = false, no_shipped = false;
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
                                       "`import attntune; attntune.attention(q, k, v)` (docs/EXPORT.md)")
      ("no-shipped", po::bool_switch(&no_shipped), "--problem, --all-best --plan: never answer from the shipped "
                                                   "database of tuned results (docs/design/shipped_db.md)");
  // clang-format on
  po::variables_map vm;
  if (parse_args("export", kSummary, opts, args, vm)) return 0;

  ExportQuery q;
  if (vm.count("campaign")) q.campaign = campaign;
  // pass=fwdbwd: a training step's pair, the forward's and the backward's best, in one file with the
  // dispatcher (an --all-best of those two problems): attntune.attention and its autograd both run
  // tuned kernels.
  std::vector<Problem> step;
  if (vm.count("problem")) {
    std::vector<Problem> passes = Problem::parse_passes(problem_spec);
    if (passes.size() > 1) {
      if (all_best || vm.count("campaign") || vm.count("plan"))
        throw InputError("export: --problem ...,pass=fwdbwd is an export of two problems: not with --all-best, "
                         "--campaign or --plan");
      if (rank != 1) throw InputError("export: --rank applies to one problem, not pass=fwdbwd's two");
      step = std::move(passes);
      all_best = true;
    } else {
      q.problem = passes.front();
    }
  }
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
  if (!step.empty()) {
    q.dtype = step.front().dtype;
    q.only = step;
  }
  if (vm.count("space")) q.space_file = space_file;
  const int modes = (q.campaign ? 1 : 0) + (q.problem ? 1 : 0) + (q.all_best ? 1 : 0);
  if (modes != 1) throw InputError("export: give exactly one of --campaign, --problem or --all-best");
  const bool torch = vm.count("torch") > 0;
  if (torch && torch_dir.empty()) throw InputError("export: --torch needs a directory");
  if ((!vm.count("output") || output.empty()) && !torch)
    throw InputError("export: -o FILE.cu is required (- for stdout), or --torch DIR");

  ShippedDb shipped(!no_shipped);
  const std::vector<ExportItem> items = select_items(db_path, q, shipped, plan_path);
  for (const Problem& p : step)  // both passes, or nothing written
    if (std::none_of(items.begin(), items.end(), [&](const ExportItem& it) { return it.row.problem == p; }))
      throw WorkError(fmt::format("export: pass=fwdbwd: no valid result for {} in database '{}': tune it (attntune "
                                  "tune --problem {}), then export the pair",
                                  p.str(), db_path, p.str()));
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
    report << fmt::format("  {}  {} µs  {} TFLOP/s  {} {}  (campaign {}, {}{}){}\n", it.row.problem.str(),
                          format_us(it.row.median_us), format_tflops(it.row.tflops), it.row.family,
                          config_str(it.row.config), it.row.campaign, it.row.gpu,
                          it.source.empty() ? "" : ", " + it.source,
                          it.companion_for.empty() ? ""
                                                   : "\n    for the calls the kernel above refuses: " + it.companion_for);
  return 0;
}

const bool registered = register_command({"export", kSummary, false, run_export});

}  // namespace

}  // namespace attntune::cli::cmd_export
