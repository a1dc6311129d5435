// attntune report: how a campaign went, for a person in the morning or a script. Best-so-far
// against evaluations and against time, the final ranking, and how much each parameter's value
// matters; as text, JSON or CSV, and optionally as a figure (SVG, or PNG through a converter).
// Reads the database read-only, so it runs beside a tune that is writing to it; no GPU.
#include <algorithm>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "cli/format.hpp"
#include "core/error.hpp"
#include "core/output_file.hpp"
#include "db/store.hpp"
#include "report/analysis.hpp"
#include "report/figure.hpp"
#include "report/plot_file.hpp"
#include "search/multi_family.hpp"

namespace attntune::cli::cmd_report {

namespace {

using report::Analysis;
using report::ConvergencePoint;

constexpr const char* kSummary = "how a campaign converged and what each parameter does (text, JSON, CSV, plot)";

// One template of a campaign that searched several: its own rows (configs as its space has them)
// and what they say.
struct FamilyReport {
  std::string family;
  std::vector<EvaluationRow> rows;
  Analysis analysis;
};

struct Report {
  CampaignRow campaign;
  // A campaign of several templates: configs carry theirs under `template` (so convergence says
  // when the best moved to another template), and the campaign-wide parameter effects keep only
  // `template`; each template's own effects and curve are in `families`.
  std::vector<EvaluationRow> rows;
  std::vector<RankedRow> ranking;
  Analysis analysis;
  std::vector<FamilyReport> families;  // empty for a campaign of one template
  std::vector<CampaignRunRow> runs;    // each run (the first, then each resume), as asked for
};

std::string ranked_config(const RankedRow& r, bool mixed) {
  return mixed ? search::tagged_str(search::tag_family(r.family, r.config)) : config_str(r.config);
}

nlohmann::ordered_json optional_json(const std::optional<double>& v) {
  return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
}

std::string ratio_text(double r) { return r < 1.01 ? fmt::format("{:.3f}x", r) : fmt::format("{:.2f}x", r); }

std::string status_line(const CampaignRow& c) {
  return c.stop_reason.empty() ? c.status : c.status + ": " + c.stop_reason;
}

// "block_n 32→64, kv_stages 2→3": what changed between two configs.
std::string config_change(const Config& from, const Config& to) {
  std::string out;
  for (const auto& [name, value] : to) {
    const auto it = from.find(name);
    if (it != from.end() && it->second == value) continue;
    out += fmt::format("{}{} {}→{}", out.empty() ? "" : ", ", name,
                       it == from.end() ? std::string("-") : value_str(it->second), value_str(value));
  }
  return out.empty() ? "(same config, re-measured)" : out;
}

// ---- JSON ----

nlohmann::ordered_json convergence_json(const Analysis& a);
nlohmann::ordered_json parameters_json(const Analysis& a);

nlohmann::ordered_json to_json(const Report& r) {
  const CampaignRow& c = r.campaign;
  const Analysis& a = r.analysis;
  nlohmann::ordered_json by_status = nlohmann::ordered_json::object();
  for (const auto& [status, n] : a.by_status) by_status[status] = n;

  nlohmann::ordered_json best(nullptr);
  if (!r.ranking.empty()) {
    const RankedRow& top = r.ranking.front();
    best = {{"template", top.family},
            {"config", config_json(top.config)},
            {"median_us", top.entry.median_us},
            {"tflops", top.entry.tflops},
            {"source", "ranking"}};
  } else if (a.best) {
    const auto [family, config] = search::untag_family(a.best->config);
    best = {{"template", family.empty() ? c.spec.family : family},
            {"config", config_json(config)},
            {"median_us", a.best->median_us},
            {"tflops", optional_json(a.best->tflops)},
            {"source", "search"},
            {"eval", a.best->eval}};
  }

  nlohmann::ordered_json ranking = nlohmann::ordered_json::array();
  for (const auto& e : r.ranking)
    ranking.push_back({{"rank", e.rank},
                       {"template", e.family},
                       {"config", config_json(e.config)},
                       {"median_us", e.entry.median_us},
                       {"tflops", e.entry.tflops},
                       {"max_abs_err", e.entry.max_abs_err},
                       {"spread_pct", e.entry.spread_pct},
                       {"rounds", e.entry.rounds}});

  nlohmann::ordered_json gaps = nlohmann::ordered_json::array();
  for (const auto& g : a.time.gaps)
    gaps.push_back({{"after_eval", g.after_eval}, {"start_seconds", g.start_seconds}, {"seconds", g.seconds}});

  nlohmann::ordered_json families = nlohmann::ordered_json::array();
  for (const FamilyReport& f : r.families) {
    nlohmann::ordered_json fs = nlohmann::ordered_json::object();
    for (const auto& [status, n] : f.analysis.by_status) fs[status] = n;
    nlohmann::ordered_json fbest(nullptr);
    if (f.analysis.best)
      fbest = {{"config", config_json(f.analysis.best->config)},
               {"median_us", f.analysis.best->median_us},
               {"tflops", optional_json(f.analysis.best->tflops)},
               {"eval", f.analysis.best->eval}};
    families.push_back({{"template", f.family},
                        {"evaluations", f.analysis.evaluations},
                        {"ok", f.analysis.ok},
                        {"by_status", fs},
                        {"best", fbest},
                        {"convergence", convergence_json(f.analysis)},
                        {"parameters", parameters_json(f.analysis)}});
  }
  nlohmann::ordered_json templates = nlohmann::ordered_json::array();
  for (const CampaignSpace& sp : c.spec.spaces) templates.push_back(sp.family);

  nlohmann::ordered_json out = {{"campaign", c.spec.name},
                                {"problem", problem_json(c.spec.problem)},
                                {"template", c.spec.family},
                                {"templates", templates},
                                {"gpu", c.gpu},
                                {"arch", c.arch},
                                {"strategy", c.spec.strategy},
                                {"seed", c.spec.seed},
                                {"status", c.status},
                                {"stop_reason", c.stop_reason},
                                {"started_at", c.started_at},
                                {"ended_at", c.ended_at.empty() ? nlohmann::ordered_json(nullptr)
                                                                : nlohmann::ordered_json(c.ended_at)},
                                {"evaluations", a.evaluations},
                                {"ok", a.ok},
                                {"by_status", by_status},
                                {"evaluating_seconds", a.time.active_seconds},
                                {"span_seconds", a.time.span_seconds},
                                {"gaps", gaps},
                                {"best", best},
                                {"convergence", convergence_json(a)},
                                {"parameters", parameters_json(a)},
                                {"ranking", ranking}};
  if (!r.families.empty()) out["families"] = families;
  nlohmann::ordered_json runs = nlohmann::ordered_json::array();
  for (const CampaignRunRow& run : r.runs)
    runs.push_back({{"run", run.run},
                    {"strategy", run.strategy},
                    {"seed", run.seed},
                    {"budget_evals", run.budget_evals},
                    {"budget_seconds", run.budget_seconds},
                    {"gpu", run.gpu},
                    {"arch", run.arch},
                    {"started_at", run.started_at},
                    {"ended_at", run.ended_at.empty() ? nlohmann::ordered_json(nullptr)
                                                      : nlohmann::ordered_json(run.ended_at)},
                    {"status", run.status},
                    {"stop_reason", run.stop_reason}});
  out["runs"] = runs;
  return out;
}

nlohmann::ordered_json convergence_json(const Analysis& a) {
  nlohmann::ordered_json convergence = nlohmann::ordered_json::array();
  for (const auto& p : a.convergence)
    convergence.push_back(
        {{"eval", p.eval}, {"seconds", p.seconds}, {"best_us", p.best_us}, {"tflops", optional_json(p.tflops)}});
  return convergence;
}

nlohmann::ordered_json parameters_json(const Analysis& a) {
  nlohmann::ordered_json parameters = nlohmann::ordered_json::array();
  for (const auto& p : a.parameters) {
    nlohmann::ordered_json values = nlohmann::ordered_json::array();
    for (const auto& v : p.values) {
      nlohmann::ordered_json failed = nlohmann::ordered_json::object();
      for (const auto& [status, n] : v.failed_by_status) failed[status] = n;
      values.push_back({{"value", value_json(v.value)},
                        {"evaluated", v.evaluated},
                        {"ok", v.ok},
                        {"failed_by_status", failed},
                        {"best_us", optional_json(v.best_us)},
                        {"median_us", optional_json(v.median_us)},
                        {"best_ratio", optional_json(v.best_ratio)}});
    }
    parameters.push_back({{"name", p.name}, {"values", values}, {"reading", report::reading(p)}});
  }
  return parameters;
}

// ---- CSV: one row per evaluation, with the best so far and each parameter in its own column ----

void print_csv(std::ostream& out, const Report& r) {
  std::vector<std::string> params;  // every parameter of the evaluated configs (and `template`)
  for (const EvaluationRow& row : r.rows)
    for (const auto& [name, value] : row.config)
      if (std::find(params.begin(), params.end(), name) == params.end()) params.push_back(name);
  std::sort(params.begin(), params.end());
  std::vector<std::string> headers = {"eval", "seconds", "status", "median_us", "tflops", "best_us"};
  headers.insert(headers.end(), params.begin(), params.end());
  headers.push_back("error");
  Table t(headers);
  std::optional<double> best;
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    const EvaluationRow& row = r.rows[i];
    const EvalRecord& e = row.record;
    if (report::timed_ok(e) && (!best || *e.median_us < *best)) best = e.median_us;
    auto opt = [](const std::optional<double>& v) { return v ? format_exact(*v) : std::string(); };
    std::vector<std::string> cells = {std::to_string(row.seq), format_exact(r.analysis.time.seconds[i]), e.status,
                                      opt(e.median_us),         opt(e.tflops),
                                      opt(best)};
    for (const auto& p : params) {
      const auto it = row.config.find(p);
      cells.push_back(it == row.config.end() ? "" : value_str(it->second));
    }
    cells.push_back(e.error);
    t.add_row(std::move(cells));
  }
  t.print_csv(out);
}

// ---- text ----

void print_header(std::ostream& out, const Report& r) {
  const CampaignRow& c = r.campaign;
  const Analysis& a = r.analysis;
  out << fmt::format("Campaign '{}'\n", c.spec.name);
  out << fmt::format("  problem    {}\n", c.spec.problem.str());
  if (c.spec.mixed()) {
    std::vector<std::string> parts;
    for (const CampaignSpace& sp : c.spec.spaces) parts.push_back(fmt::format("{} (space {})", sp.family, sp.path));
    out << fmt::format("  templates  {}\n", fmt::join(parts, ", "));
  } else {
    out << fmt::format("  template   {}{}\n", c.spec.family,
                       c.spec.space_path.empty() ? "" : fmt::format(" (space {})", c.spec.space_path));
  }
  out << fmt::format("  GPU        {} ({})\n", c.gpu, c.arch);
  std::string budget;
  if (c.spec.budget_evals > 0) budget += fmt::format(", budget {} evaluations", c.spec.budget_evals);
  if (c.spec.budget_seconds > 0)
    budget += fmt::format("{} {}", budget.empty() ? ", budget" : " or", report::format_duration(c.spec.budget_seconds));
  out << fmt::format("  strategy   {}, seed {}{}\n", c.spec.strategy, c.spec.seed, budget);
  out << fmt::format("  status     {}\n", status_line(c));
  if (r.runs.size() > 1)
    for (const CampaignRunRow& run : r.runs) {
      std::string asked;
      if (run.budget_evals > 0) asked += fmt::format(", budget {} evaluations", run.budget_evals);
      if (run.budget_seconds > 0) asked += fmt::format(", budget {}", report::format_duration(run.budget_seconds));
      out << fmt::format("  run {}      {} UTC: {}, seed {}{}; {}\n", run.run, format_time(run.started_at),
                         run.strategy, run.seed, asked,
                         run.stop_reason.empty() ? run.status : run.status + ": " + run.stop_reason);
    }
  out << fmt::format("  started    {} UTC{}\n", format_time(c.started_at),
                     c.ended_at.empty() ? "" : fmt::format(", ended {} UTC", format_time(c.ended_at)));
  if (a.evaluations == 0) {
    out << "  evaluated  nothing yet: the campaign has no evaluations\n";
    return;
  }
  out << fmt::format("  evaluated  {} config{} over {:.0f} s of evaluating ({}): {}\n", a.evaluations,
                     a.evaluations == 1 ? "" : "s", a.time.active_seconds,
                     report::format_duration(a.time.active_seconds), report::status_summary(a.by_status));
  for (const auto& g : a.time.gaps)
    out << fmt::format("             with a gap of {} without evaluations after eval {} (stopped and resumed?)\n",
                       report::format_duration(g.seconds), g.after_eval);
  if (!r.ranking.empty()) {
    const RankedRow& top = r.ranking.front();
    out << fmt::format("  best       {} µs, {} TFLOP/s (final ranking: re-timed over {} rounds)\n",
                       format_us(top.entry.median_us), format_tflops(top.entry.tflops), top.entry.rounds);
    out << fmt::format("             {}\n", ranked_config(top, c.spec.mixed()));
  } else if (a.best) {
    out << fmt::format("  best       {} µs{} (no final ranking yet)\n", format_us(a.best->median_us),
                       a.best->tflops ? fmt::format(", {} TFLOP/s", format_tflops(*a.best->tflops)) : "");
    out << fmt::format("             {}\n", search::tagged_str(a.best->config));
  } else {
    out << "  best       none: no evaluation has run ok\n";
  }
  if (a.best) {
    double at = 0;
    for (const auto& p : a.convergence)
      if (p.improved) at = p.seconds;
    out << fmt::format("             the search found it at eval {} of {}, {} in ({} µs then)\n", a.best->eval,
                       a.evaluations, report::format_duration(at), format_us(a.best->median_us));
  }
}

void print_convergence(std::ostream& out, const Analysis& a) {
  out << "\nConvergence (best so far: each improvement, then the last evaluation)\n";
  Table t({"eval", "time", "best µs", "TFLOP/s", "speedup", "change from the previous best"});
  const ConvergencePoint* previous = nullptr;
  for (const auto& p : a.convergence) {
    std::string speedup = "-", change;
    if (!p.improved) {
      change = "(last evaluation)";
    } else if (!previous) {
      change = "first ok: " + search::tagged_str(p.config);
    } else {
      speedup = ratio_text(previous->best_us / p.best_us);
      change = config_change(previous->config, p.config);
    }
    t.add_row({std::to_string(p.eval), report::format_duration(p.seconds), format_us(p.best_us),
               p.tflops ? format_tflops(*p.tflops) : "-", speedup, change});
    if (p.improved) previous = &p;
  }
  t.print(out);
  if (a.convergence.size() >= 2) {
    const auto& first = a.convergence.front();
    const auto& last = a.convergence.back();
    out << fmt::format("{} better than the first ok result ({} µs at eval {})\n",
                       ratio_text(first.best_us / last.best_us), format_us(first.best_us), first.eval);
  }
}

void print_ranking(std::ostream& out, const std::vector<RankedRow>& ranking, bool mixed) {
  out << fmt::format("\nFinal ranking (top {} re-timed, interleaved)\n", ranking.size());
  std::vector<std::string> headers = {"rank", "median µs", "TFLOP/s", "spread %", "rounds", "max |err|", "config"};
  if (mixed) headers.insert(headers.end() - 1, "template");
  Table t(headers);
  for (const auto& r : ranking) {
    std::vector<std::string> cells = {std::to_string(r.rank), format_us(r.entry.median_us),
                                      format_tflops(r.entry.tflops), fmt::format("{:.2f}", r.entry.spread_pct),
                                      std::to_string(r.entry.rounds), format_error(r.entry.max_abs_err),
                                      config_str(r.config)};
    if (mixed) cells.insert(cells.end() - 1, r.family);
    t.add_row(std::move(cells));
  }
  t.print(out);
}

void print_parameters(std::ostream& out, const Analysis& a, const std::string& whose = "the campaign's") {
  out << fmt::format("\nParameter effects (most influential first; ratio = a value's best time / {} best)\n", whose);
  // Parameters the campaign never varied say nothing about speed: one line for all of them.
  std::vector<const report::ParamEffect*> varied;
  std::string fixed;
  for (const auto& p : a.parameters) {
    if (p.values.size() > 1)
      varied.push_back(&p);
    else
      fixed += fmt::format("{}{}={}", fixed.empty() ? "" : ", ", p.name, value_str(p.values[0].value));
  }
  for (const auto* p : varied) out << "  " << report::reading(*p) << '\n';
  if (!fixed.empty()) out << "  not varied: " << fixed << '\n';
  if (varied.empty()) return;
  out << '\n';
  Table t({"parameter", "value", "evaluated", "ok", "failures", "best µs", "ratio", "median µs"});
  for (const auto* p : varied) {
    bool first = true;
    for (const auto& v : p->values) {
      const std::string failures = report::status_summary(v.failed_by_status);
      t.add_row({first ? p->name : "", value_str(v.value), std::to_string(v.evaluated), std::to_string(v.ok),
                 failures.empty() ? "-" : failures, v.best_us ? format_us(*v.best_us) : "-",
                 v.best_ratio ? fmt::format("{:.3f}", *v.best_ratio) : "-",
                 v.median_us ? format_us(*v.median_us) : "-"});
      first = false;
    }
  }
  t.print(out);
}

void print_text(std::ostream& out, const Report& r, const std::string& plot) {
  print_header(out, r);
  if (r.analysis.evaluations > 0) {
    if (!r.analysis.convergence.empty()) print_convergence(out, r.analysis);
    if (!r.ranking.empty()) print_ranking(out, r.ranking, !r.families.empty());
    print_parameters(out, r.analysis);
  }
  for (const FamilyReport& f : r.families) {
    const Analysis& fa = f.analysis;
    out << fmt::format("\nTemplate {}: {} evaluation{}, {} ok", f.family, fa.evaluations,
                       fa.evaluations == 1 ? "" : "s", fa.ok);
    if (fa.best && r.analysis.best)
      out << fmt::format("; best {} µs at eval {} ({} the campaign's best)", format_us(fa.best->median_us),
                         fa.best->eval, ratio_text(fa.best->median_us / r.analysis.best->median_us));
    out << '\n';
    if (fa.best) out << fmt::format("  {}\n", config_str(fa.best->config));
    if (!fa.convergence.empty()) print_convergence(out, fa);
    if (fa.evaluations > 0) print_parameters(out, fa, "the template's");
  }
  if (!plot.empty()) out << fmt::format("\nplot: {}\n", plot);
}

int run_report(const std::vector<std::string>& args) {
  std::string db_path, campaign, plot, format;
  po::options_description opts("options");
  // clang-format off
  opts.add_options()
      ("db", po::value(&db_path)->default_value(default_db_path()), "database ($ATTNTUNE_DB, else ./attntune.db)")
      ("campaign", po::value(&campaign)->required(), "the campaign to report on (attntune campaigns lists them)")
      ("plot", po::value(&plot), "also draw the figure: FILE.svg, or FILE.png (needs rsvg-convert or ImageMagick)")
      ("format", po::value(&format)->default_value("table"),
       "table (for people), json (one object) or csv (one row per evaluation, with the best so far)");
  // clang-format on
  po::variables_map vm;
  if (parse_args("report", kSummary, opts, args, vm)) return 0;
  const Format kind = parse_format(format);
  if (vm.count("plot")) {
    if (plot.empty()) throw InputError("report: --plot needs a file name ending .svg or .png");
    report::plot_format(plot);
    refuse_database_path("--plot", plot, {db_path, default_db_path()});  // the figure never replaces a database
    // Before any work: a name we cannot write, or PNG with no converter, fails at once.
    if (report::plot_format(plot) == report::PlotFormat::kPng && report::find_converters().empty())
      throw EnvError(report::no_converter_message(plot));
  }

  Store store = Store::open(db_path, Store::Mode::kReadOnly);
  std::optional<CampaignRow> row = store.campaign_row(campaign);
  if (!row)
    throw InputError(
        fmt::format("no campaign '{}' in database '{}' (attntune campaigns lists them)", campaign, db_path));
  Report r;
  r.campaign = std::move(*row);
  r.rows = store.campaign_evaluations(r.campaign.id);
  r.ranking = store.ranking(r.campaign.id);
  r.runs = store.campaign_runs(r.campaign.id);
  if (r.campaign.spec.mixed()) {
    for (const CampaignSpace& sp : r.campaign.spec.spaces) {
      FamilyReport f;
      f.family = sp.family;
      for (const EvaluationRow& e : r.rows)
        if (e.family == sp.family) f.rows.push_back(e);
      f.analysis = report::analyze(f.rows);
      r.families.push_back(std::move(f));
    }
    for (EvaluationRow& e : r.rows) e.config = search::tag_family(e.family, std::move(e.config));
  }
  r.analysis = report::analyze(r.rows);
  if (!r.families.empty()) {
    // Across templates only `template` means the same thing everywhere.
    auto& ps = r.analysis.parameters;
    ps.erase(std::remove_if(ps.begin(), ps.end(), [](const report::ParamEffect& p) { return p.name != search::kTemplateKey; }),
             ps.end());
  }

  if (!plot.empty()) {
    const CampaignRow& c = r.campaign;
    const report::FigureText text{
        fmt::format("attntune report: {}", c.spec.name),
        {fmt::format("{}  ·  {}  ·  {} ({})", c.spec.problem.str(), c.spec.family, c.gpu, c.arch),
         fmt::format("{} seed {}  ·  {}", c.spec.strategy, c.spec.seed, status_line(c))}};
    report::write_plot(plot, report::render_figure(text, r.rows, r.analysis), {db_path, default_db_path()});
  }

  if (kind == Format::kJson)
    print_json(std::cout, to_json(r));
  else if (kind == Format::kCsv)
    print_csv(std::cout, r);
  else
    print_text(std::cout, r, plot);
  return 0;
}

const bool registered = register_command({"report", kSummary, false, run_report});

}  // namespace

}  // namespace attntune::cli::cmd_report
