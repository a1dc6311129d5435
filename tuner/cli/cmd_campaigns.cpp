// attntune campaigns: every campaign in the database with its status, size and best result. Reads
// the database read-only, so it runs beside a tune that is writing to it.
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "cli/format.hpp"
#include "db/store.hpp"

namespace attntune::cli::cmd_campaigns {

namespace {

constexpr const char* kSummary = "list campaigns with status, evaluations and best result";

nlohmann::ordered_json to_json(const CampaignRow& r) {
  auto optional = [](const std::optional<double>& v) {
    return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
  };
  return {{"name", r.spec.name},
          {"status", r.status},
          {"stop_reason", r.stop_reason},
          {"problem", problem_json(r.spec.problem)},
          {"template", r.spec.family},
          {"strategy", r.spec.strategy},
          {"seed", r.spec.seed},
          {"space_path", r.spec.space_path},
          {"space_hash", r.spec.space_hash},
          {"budget_evals", r.spec.budget_evals},
          {"budget_seconds", r.spec.budget_seconds},
          {"gpu", r.gpu},
          {"arch", r.arch},
          {"started_at", r.started_at},
          {"ended_at", r.ended_at.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(r.ended_at)},
          {"evaluations", r.evaluations},
          {"ok", r.ok},
          {"best_us", optional(r.best_us)},
          {"best_tflops", optional(r.best_tflops)}};
}

void print_csv(std::ostream& out, const std::vector<CampaignRow>& rows) {
  Table t({"name", "status", "stop_reason", "problem", "template", "strategy", "seed", "space_path", "space_hash",
           "budget_evals", "budget_seconds", "gpu", "arch", "started_at", "ended_at", "evaluations", "ok", "best_us",
           "best_tflops"});
  auto optional = [](const std::optional<double>& v) { return v ? format_exact(*v) : std::string(); };
  for (const auto& r : rows)
    t.add_row({r.spec.name, r.status, r.stop_reason, r.spec.problem.str(), r.spec.family, r.spec.strategy,
               std::to_string(r.spec.seed), r.spec.space_path, r.spec.space_hash, std::to_string(r.spec.budget_evals),
               format_exact(r.spec.budget_seconds), r.gpu, r.arch, r.started_at, r.ended_at,
               std::to_string(r.evaluations), std::to_string(r.ok), optional(r.best_us), optional(r.best_tflops)});
  t.print_csv(out);
}

void print_table(std::ostream& out, const std::vector<CampaignRow>& rows) {
  Table t({"campaign", "status", "template", "strategy", "evals", "ok", "best µs", "TFLOP/s", "gpu", "started (UTC)",
           "stop reason", "problem"});
  for (const auto& r : rows)
    t.add_row({r.spec.name, r.status, r.spec.family, r.spec.strategy, std::to_string(r.evaluations),
               std::to_string(r.ok), r.best_us ? format_us(*r.best_us) : "-",
               r.best_tflops ? format_tflops(*r.best_tflops) : "-", fmt::format("{} ({})", r.gpu, r.arch),
               format_time(r.started_at), r.stop_reason.empty() ? "-" : r.stop_reason, r.spec.problem.str()});
  t.print(out);
}

int run_campaigns(const std::vector<std::string>& args) {
  std::string db_path, format;
  po::options_description opts("options");
  // clang-format off
  opts.add_options()
      ("db", po::value(&db_path)->default_value(default_db_path()), "database ($ATTNTUNE_DB, else ./attntune.db)")
      ("format", po::value(&format)->default_value("table"), "table, json or csv");
  // clang-format on
  po::variables_map vm;
  if (parse_args("campaigns", kSummary, opts, args, vm)) return 0;
  const Format kind = parse_format(format);

  Store store = Store::open(db_path, Store::Mode::kReadOnly);
  const std::vector<CampaignRow> rows = store.campaigns();
  if (kind == Format::kJson) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& r : rows) out.push_back(to_json(r));
    print_json(std::cout, out);
  } else if (kind == Format::kCsv) {
    print_csv(std::cout, rows);
  } else {
    print_table(std::cout, rows);
  }
  return 0;
}

const bool registered = register_command({"campaigns", kSummary, false, run_campaigns});

}  // namespace

}  // namespace attntune::cli::cmd_campaigns
