// attntune best: the fastest valid configs recorded, per problem or campaign (docs/CONTRACT.md gives the
// JSON). Reads the database read-only, so it runs beside a tune that is writing to it. A problem the
// database has no result for is answered from the shipped database (cli/shipped.hpp), saying so.
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "cli/format.hpp"
#include "cli/shipped.hpp"
#include "core/error.hpp"
#include "cuda/driver.hpp"
#include "db/store.hpp"
#include "export/select.hpp"

namespace attntune::cli::cmd_best {

namespace {

constexpr const char* kSummary = "best valid configs, fastest first";

// Bytes moved per second: (Q + K + V + O) / time, a window's K/V rows only (Problem::bytes). The
// measure decode is judged by, beside TFLOP/s for prefill.
double gb_per_s(const BestRow& r) { return r.median_us > 0 ? r.problem.bytes() / r.median_us / 1e3 : 0.0; }

nlohmann::ordered_json to_json(const BestRow& r, bool shipped) {
  return {{"campaign", r.campaign},
          {"problem", problem_json(r.problem)},
          {"template", r.family},
          {"config", config_json(r.config)},
          {"median_us", r.median_us},
          {"tflops", r.tflops},
          {"gb_per_s", gb_per_s(r)},
          {"max_abs_err", r.max_abs_err},
          {"gpu", r.gpu},
          {"arch", r.arch},
          {"evaluated_at", r.evaluated_at},
          {"source", shipped ? "shipped" : "database"}};
}

Table csv_table(const std::vector<BestRow>& rows) {
  Table t({"rank", "campaign", "problem", "template", "config", "median_us", "tflops", "max_abs_err", "gpu", "arch",
           "evaluated_at", "gb_per_s"});
  int rank = 0;
  for (const auto& r : rows)
    t.add_row({std::to_string(++rank), r.campaign, r.problem.str(), r.family, config_str(r.config),
               format_exact(r.median_us), format_exact(r.tflops), format_exact(r.max_abs_err), r.gpu, r.arch,
               r.evaluated_at, format_exact(gb_per_s(r))});
  return t;
}

// Values every row shares (the problem, usually the GPU) go in a title line rather than a column.
void print_table(std::ostream& out, const std::vector<BestRow>& rows) {
  bool one_problem = true, one_gpu = true;
  for (const auto& r : rows) {
    one_problem = one_problem && r.problem == rows.front().problem;
    one_gpu = one_gpu && r.gpu == rows.front().gpu && r.arch == rows.front().arch;
  }
  std::vector<std::string> title;
  if (one_problem) title.push_back("problem " + rows.front().problem.str());
  if (one_gpu) title.push_back(fmt::format("{} ({})", rows.front().gpu, rows.front().arch));
  if (!title.empty()) out << fmt::format("{}\n\n", fmt::join(title, "  on  "));

  std::vector<std::string> headers = {"rank", "campaign"};
  if (!one_problem) headers.push_back("problem");
  for (const char* h : {"template", "median µs", "TFLOP/s", "GB/s", "max |err|"}) headers.push_back(h);
  if (!one_gpu) headers.push_back("gpu");
  for (const char* h : {"evaluated (UTC)", "config"}) headers.push_back(h);
  Table t(headers);
  int rank = 0;
  for (const auto& r : rows) {
    std::vector<std::string> cells = {std::to_string(++rank), r.campaign};
    if (!one_problem) cells.push_back(r.problem.str());
    for (auto& c : {r.family, format_us(r.median_us), format_tflops(r.tflops), fmt::format("{:.0f}", gb_per_s(r)),
                   format_error(r.max_abs_err)})
      cells.push_back(c);
    if (!one_gpu) cells.push_back(fmt::format("{} ({})", r.gpu, r.arch));
    cells.push_back(format_time(r.evaluated_at));
    cells.push_back(config_str(r.config));
    t.add_row(std::move(cells));
  }
  t.print(out);
}

// One problem's (or campaign's) ranking never mixes GPU models: an H200's time is not a faster H100's.
// `this_gpu_first` (the shipped database's answers): results of several models are ranked for this
// machine's GPU model when it is one of them, instead of refused.
std::vector<BestRow> ranked_rows(Store& store, BestQuery query, bool this_gpu_first = false) {
  if (query.campaign && !store.find_campaign(*query.campaign))
    throw InputError(
        fmt::format("no campaign '{}' in database '{}' (attntune campaigns lists them)", *query.campaign, store.path()));
  if (!query.gpu && (query.problem || query.campaign)) {
    const std::vector<std::string> models = store.result_gpus(query);
    if (models.size() > 1 && this_gpu_first) query.gpu = pick_gpu_model(models, cuda::first_device_name());
    if (models.size() > 1 && !query.gpu)
      throw InputError(fmt::format("best: the results in database '{}' were measured on several GPU models ({}): "
                                   "pass --gpu with one of them",
                                   store.path(), fmt::join(models, ", ")));
  }
  return store.best(query);
}

// The shipped database's answer for query.problem, said on stderr; nullopt when there is none.
std::optional<std::vector<BestRow>> shipped_rows(ShippedDb& shipped, const BestQuery& query,
                                                 const std::string& db_path) {
  Store* store = shipped.store();
  if (!store) return std::nullopt;
  std::vector<BestRow> rows = ranked_rows(*store, query, /*this_gpu_first=*/true);
  if (rows.empty()) return std::nullopt;
  std::cerr << shipped_note(shipped.path(), db_path, "for problem " + query.problem->str(), rows,
                            fmt::format("attntune tune --problem {}", query.problem->str()));
  return rows;
}

int print_rows(const std::vector<BestRow>& rows, Format fmt_kind, bool shipped) {
  if (fmt_kind == Format::kJson) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& r : rows) out.push_back(to_json(r, shipped));
    print_json(std::cout, out);
  } else if (fmt_kind == Format::kCsv) {
    csv_table(rows).print_csv(std::cout);
  } else if (!rows.empty()) {
    print_table(std::cout, rows);
  }
  std::cout.flush();
  return 0;
}

// The rows of query (its problem set) from the user's database, else the shipped one's (said on
// stderr); empty when neither has any. `shipped_answer`: whether the shipped database answered.
std::vector<BestRow> answer(const std::string& db_path, const BestQuery& query, ShippedDb& shipped,
                            bool* shipped_answer) {
  *shipped_answer = false;
  const bool may_ship = query.problem && !query.campaign;
  std::error_code ec;
  std::vector<BestRow> rows;
  if (std::filesystem::exists(db_path, ec)) {
    Store store = Store::open(db_path, Store::Mode::kReadOnly);
    rows = ranked_rows(store, query);
  }
  if (rows.empty() && may_ship)
    if (std::optional<std::vector<BestRow>> s = shipped_rows(shipped, query, db_path)) {
      *shipped_answer = true;
      return *s;
    }
  return rows;
}

// `--problem P,pass=fwdbwd`: a training step's two problems, each answered as `best --problem`
// answers one (the user's database, else the shipped one's), the forward's rows first (JSON and
// CSV: one list of both, each row naming its problem); a table ends with the step: the best
// forward's time plus the best backward's. A pass without any result fails the command, naming it.
int best_of_step(const std::string& db_path, BestQuery query, const std::vector<Problem>& passes, Format fmt_kind,
                 bool no_shipped) {
  ShippedDb shipped(!no_shipped);
  std::vector<BestRow> all;
  std::vector<std::string> missing;
  double step_us = 0;
  bool any_shipped = false;
  for (const Problem& p : passes) {
    query.problem = p;
    bool from_shipped = false;
    const std::vector<BestRow> rows = answer(db_path, query, shipped, &from_shipped);
    any_shipped = any_shipped || from_shipped;
    if (rows.empty()) missing.push_back(p.str());
    else step_us += rows.front().median_us;
    all.insert(all.end(), rows.begin(), rows.end());
  }
  if (fmt_kind == Format::kTable) {
    for (const Problem& p : passes) {  // one table a pass
      std::vector<BestRow> mine;
      for (const BestRow& r : all)
        if (r.problem == p) mine.push_back(r);
      if (!mine.empty()) print_table(std::cout, mine);
    }
    if (missing.empty())
      std::cout << fmt::format("training step (forward + backward): {} µs\n", format_us(step_us));
    std::cout.flush();
  } else {
    print_rows(all, fmt_kind, any_shipped);
  }
  if (!missing.empty())
    throw WorkError(fmt::format("no valid results for {} in database '{}' (pass=fwdbwd is two problems: tune them "
                                "with attntune tune --problem ...,pass=fwdbwd)",
                                fmt::join(missing, " nor "), db_path));
  return 0;
}

int run_best(const std::vector<std::string>& args) {
  std::string db_path, problem_spec, campaign, format, gpu;
  int top = 1;
  bool no_shipped = false;
  po::options_description opts("options");
  // clang-format off
  opts.add_options()
      ("db", po::value(&db_path)->default_value(default_db_path()), "database ($ATTNTUNE_DB, else ./attntune.db)")
      ("problem", po::value(&problem_spec), "only this problem, e.g. b=4,h=16,s=4096,d=128,dtype=bf16,causal=1")
      ("campaign", po::value(&campaign), "only this campaign")
      ("gpu", po::value(&gpu), "only results measured on this GPU model (as `campaigns` names it); needed when a "
                               "problem's results span several")
      ("top", po::value(&top)->default_value(1), "how many configs to list")
      ("format", po::value(&format)->default_value("table"), "table, json or csv")
      ("no-shipped", po::bool_switch(&no_shipped), "--problem: never answer from the shipped database of tuned "
                                                   "results (docs/design/shipped_db.md)");
  // clang-format on
  po::variables_map vm;
  if (parse_args("best", kSummary, opts, args, vm)) return 0;
  const Format fmt_kind = parse_format(format);
  if (top < 1) throw InputError(fmt::format("best: --top must be at least 1 (got {})", top));

  BestQuery query;
  query.top = top;
  if (vm.count("campaign")) query.campaign = campaign;
  if (vm.count("gpu")) query.gpu = gpu;
  if (vm.count("problem")) {
    const std::vector<Problem> passes = Problem::parse_passes(problem_spec);
    if (passes.size() > 1) return best_of_step(db_path, query, passes, fmt_kind, no_shipped);
    query.problem = passes.front();
  }

  // A problem of no campaign of the user's (the database is empty or absent on day one) is
  // answered from the shipped database, when it has one.
  ShippedDb shipped(!no_shipped);
  const bool may_ship = query.problem && !query.campaign;
  std::error_code ec;
  if (may_ship && !std::filesystem::exists(db_path, ec)) {
    if (std::optional<std::vector<BestRow>> rows = shipped_rows(shipped, query, db_path))
      return print_rows(*rows, fmt_kind, true);
    throw InputError(fmt::format("database '{}' does not exist{}", db_path, shipped_miss(shipped, *query.problem)));
  }

  Store store = Store::open(db_path, Store::Mode::kReadOnly);
  std::vector<BestRow> rows = ranked_rows(store, query);
  if (rows.empty() && may_ship)
    if (std::optional<std::vector<BestRow>> shipped_answer = shipped_rows(shipped, query, db_path))
      return print_rows(*shipped_answer, fmt_kind, true);
  print_rows(rows, fmt_kind, false);

  if (rows.empty()) {
    std::string what = "no valid results";
    if (query.problem) what += " for problem " + query.problem->str();
    if (query.campaign) what += fmt::format(" in campaign '{}'", *query.campaign);
    if (query.gpu) what += fmt::format(" measured on a {}", *query.gpu);
    throw WorkError(fmt::format("{} in database '{}'{}", what, db_path,
                                may_ship ? shipped_miss(shipped, *query.problem) : std::string()));
  }
  return 0;
}

const bool registered = register_command({"best", kSummary, false, run_best});

}  // namespace

}  // namespace attntune::cli::cmd_best
