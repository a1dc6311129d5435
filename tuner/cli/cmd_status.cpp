// attntune status: the queue of the tuning service (docs/design/service.md): each queued campaign's
// state (queued, running where and since when, how far, done, failed and why), the GPUs the
// serving hosts saw, and an ETA from the campaigns done so far. Read only: it never writes the
// database, and never waits for a writer (WAL).
#include <ctime>
#include <iostream>
#include <map>
#include <set>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "cli/format.hpp"
#include "core/error.hpp"
#include "db/store.hpp"
#include "search/progress.hpp"
#include "service/lease.hpp"

namespace attntune::cli::cmd_status {
namespace {

constexpr const char* kSummary = "the queue: queued, running (where, since when, how far), done, failed, ETA";

// "2025-01-31T12:00:00.123Z" -> unix seconds; nullopt for "".
std::optional<double> unix_seconds(const std::string& iso) {
  if (iso.size() < 19) return std::nullopt;
  std::tm tm{};
  if (!strptime(iso.c_str(), "%Y-%m-%dT%H:%M:%S", &tm)) return std::nullopt;
  double frac = 0;
  if (iso.size() > 20 && iso[19] == '.') frac = std::atof(iso.substr(19, iso.find('Z') - 19).c_str());
  return static_cast<double>(timegm(&tm)) + frac;
}

struct Summary {
  std::map<std::string, int> counts;
  std::optional<double> eta_seconds, mean_campaign_seconds;
  int workers = 0;
};

Summary summarize(const std::vector<QueueStatusRow>& rows) {
  Summary s;
  for (const char* state : {"queued", "running", "done", "failed"}) s.counts[state] = 0;
  double total = 0;
  int timed = 0;
  std::set<std::string> owners;
  for (const QueueStatusRow& r : rows) {
    ++s.counts[r.job.state];
    if (r.lease) owners.insert(r.lease->owner);
    if (r.job.state == "done") {
      const auto a = unix_seconds(r.job.started_at), b = unix_seconds(r.job.ended_at);
      if (a && b && *b >= *a) total += *b - *a, ++timed;
    }
  }
  s.workers = static_cast<int>(owners.size());
  if (timed > 0) s.mean_campaign_seconds = total / timed;
  const int left = s.counts["queued"] + s.counts["running"];
  if (left == 0)
    s.eta_seconds = 0;
  else if (s.mean_campaign_seconds && s.workers > 0)
    s.eta_seconds = *s.mean_campaign_seconds * left / s.workers;
  return s;
}

std::string progress_of(const QueueStatusRow& r) {
  const std::int64_t budget = r.job.request.budget_evals;
  if (r.evaluations == 0 && r.job.state == "queued") return "-";
  return budget > 0 ? fmt::format("{}/{}", r.evaluations, budget) : std::to_string(r.evaluations);
}

std::string where_of(const QueueStatusRow& r) {
  if (r.lease)
    return r.lease->gpu ? fmt::format("{} gpu {} (pid {})", r.lease->host, *r.lease->gpu, r.lease->pid)
                        : fmt::format("{} tune (pid {})", r.lease->host, r.lease->pid);
  return r.job.worker.empty() ? "-" : r.job.worker;
}

nlohmann::ordered_json row_json(const QueueStatusRow& r) {
  auto opt = [](const std::string& s) { return s.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(s); };
  nlohmann::ordered_json lease = nullptr;
  if (r.lease)
    lease = {{"host", r.lease->host},
             {"pid", r.lease->pid},
             {"gpu", r.lease->gpu ? nlohmann::ordered_json(*r.lease->gpu) : nlohmann::ordered_json(nullptr)},
             {"since", r.lease->acquired_at},
             {"heartbeat_at", r.lease->heartbeat_at}};
  return {{"campaign", r.job.campaign},
          {"state", r.job.state},
          {"plan", r.job.plan},
          {"regime", r.job.regime},
          {"problem", problem_json(r.job.problem)},
          {"attempts", r.job.attempts},
          {"worker", r.job.worker},
          {"lease", lease},
          {"gpu", r.gpu_name},
          {"evaluations", r.evaluations},
          {"ok", r.ok},
          {"budget_evals", r.job.request.budget_evals},
          {"best_us", r.best_us ? nlohmann::ordered_json(*r.best_us) : nlohmann::ordered_json(nullptr)},
          {"note", r.job.error},
          {"submitted_at", r.job.submitted_at},
          {"started_at", opt(r.job.started_at)},
          {"ended_at", opt(r.job.ended_at)}};
}

int run_status(const std::vector<std::string>& args) {
  std::string db_path, format = "table";
  po::options_description opts("options");
  opts.add_options()
      ("db", po::value(&db_path)->default_value(default_db_path()), "database ($ATTNTUNE_DB, else ./attntune.db)")
      ("format", po::value(&format), "table (default), json or csv");
  po::variables_map vm;
  if (parse_args("status", kSummary, opts, args, vm)) return 0;
  const Format kind = parse_format(format);
  Store store = Store::open(db_path, Store::Mode::kReadOnly);
  const std::vector<QueueStatusRow> rows = store.queue_status();
  const std::vector<GpuRow> gpus = store.gpus();
  const Summary sum = summarize(rows);

  if (kind == Format::kJson) {
    nlohmann::ordered_json campaigns = nlohmann::ordered_json::array(), gpu_list = nlohmann::ordered_json::array();
    for (const QueueStatusRow& r : rows) campaigns.push_back(row_json(r));
    for (const GpuRow& g : gpus)
      gpu_list.push_back({{"host", g.host}, {"ordinal", g.ordinal}, {"name", g.name}, {"uuid", g.uuid},
                          {"state", g.state}, {"error", g.error}, {"updated_at", g.updated_at}});
    nlohmann::ordered_json counts;
    for (const auto& [k, v] : sum.counts) counts[k] = v;
    auto opt = [](const std::optional<double>& v) { return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr); };
    print_json(std::cout, {{"database", store.path()},
                           {"counts", counts},
                           {"workers", sum.workers},
                           {"mean_campaign_seconds", opt(sum.mean_campaign_seconds)},
                           {"eta_seconds", opt(sum.eta_seconds)},
                           {"gpus", gpu_list},
                           {"campaigns", campaigns}});
    return 0;
  }
  Table t({"campaign", "state", "regime", "evals", "best µs", "where", "since (UTC)", "note"});
  for (const QueueStatusRow& r : rows)
    t.add_row({r.job.campaign, r.job.state, r.job.regime.empty() ? "-" : r.job.regime, progress_of(r),
               r.best_us ? format_us(*r.best_us) : "-", where_of(r),
               r.job.started_at.empty() ? "-" : format_time(r.job.started_at), r.job.error.empty() ? "-" : r.job.error});
  if (kind == Format::kCsv) {
    t.print_csv(std::cout);
    return 0;
  }
  if (rows.empty()) {
    std::cout << "the queue is empty (attntune submit PLAN queues a plan's campaigns)\n";
    return 0;
  }
  t.print(std::cout);
  std::cout << fmt::format("\n{} queued, {} running on {} worker{}, {} done, {} failed", sum.counts.at("queued"),
                           sum.counts.at("running"), sum.workers, sum.workers == 1 ? "" : "s", sum.counts.at("done"),
                           sum.counts.at("failed"));
  if (sum.eta_seconds && *sum.eta_seconds > 0)
    std::cout << fmt::format("; ETA {} (mean campaign {})", search::format_duration(*sum.eta_seconds),
                             search::format_duration(*sum.mean_campaign_seconds));
  std::cout << "\n";
  for (const GpuRow& g : gpus)
    if (g.state == "failed") std::cout << fmt::format("GPU {} on {} failed: {}\n", g.ordinal, g.host, g.error);
  return 0;
}

const bool registered = register_command({"status", kSummary, false, run_status});

}  // namespace
}  // namespace attntune::cli::cmd_status
