// attntune submit: queue campaigns for `serve` (docs/design/service.md). From a plan (`attntune
// plan -o PLAN`) or --problem specs; each problem is one campaign over every template that serves
// it (the spaces shipped with attntune, or --space), named TEMPLATES:PROBLEM (then --name-suffix's
// text, for a second GPU model's campaigns in one database). Idempotent: a
// campaign already queued, running, done or failed is not queued again (said, with its state).
#include <iostream>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "cli/format.hpp"
#include "cli/job_options.hpp"
#include "core/error.hpp"
#include "db/store.hpp"
#include "families/family.hpp"
#include "service/job.hpp"
#include "service/plan.hpp"

namespace attntune::cli::cmd_submit {
namespace {

constexpr const char* kSummary = "queue campaigns (a plan's problems, or --problem) for `serve`";

struct SubmitArgs {
  std::vector<std::string> plan_paths, problems, space_paths;
  std::string db_path, shard, format = "table", name_suffix;
  JobOptionValues job;
  bool allow_network_fs = false;
};

// "K/N" -> {K, N} with 0 <= K < N.
std::pair<int, int> parse_shard(const std::string& text) {
  int k = -1, n = 0;
  char slash = 0, extra = 0;
  if (std::sscanf(text.c_str(), "%d%c%d%c", &k, &slash, &n, &extra) != 3 || slash != '/' || n < 1 || k < 0 || k >= n)
    throw InputError(fmt::format("submit: --shard '{}' is not K/N with 0 <= K < N (e.g. 0/4)", text));
  return {k, n};
}

// A suffix makes another set of campaign names, not another kind of name: printable, no spaces, and
// not one of the endings the tools give names themselves (merge's NAME@STEM.2, the shipped build's
// NAME@stale).
void check_name_suffix(const std::string& suffix) {
  if (suffix.empty()) return;
  for (const char c : suffix)
    if (static_cast<unsigned char>(c) <= ' ' || static_cast<unsigned char>(c) >= 0x7f)
      throw InputError(fmt::format("submit: --name-suffix '{}' must be printable ASCII without spaces", suffix));
  if (suffix.size() > 64) throw InputError("submit: --name-suffix is longer than 64 characters");
  if (suffix.ends_with("@stale"))
    throw InputError("submit: --name-suffix must not end in @stale (tools/build_shipped_db.sh's mark of a campaign "
                     "to measure again)");
}

int run_submit(const std::vector<std::string>& args) {
  SubmitArgs a;
  po::options_description opts("options");
  opts.add_options()
      ("plan", po::value(&a.plan_paths), "a plan file (attntune plan -o PLAN.yaml); also the positional argument")
      ("problem", po::value(&a.problems), "a problem spec to queue; repeat it for several")
      ("db", po::value(&a.db_path)->default_value(default_db_path()), "database ($ATTNTUNE_DB, else ./attntune.db); created if missing")
      ("space", po::value(&a.space_paths), "search space YAML (repeat: one per template); default: the shipped space "
                                           "of every template that serves each problem")
      ("shard", po::value(&a.shard), "K/N: queue only the plan's entries i with i % N == K (one of N hosts)")
      ("name-suffix", po::value(&a.name_suffix), "appended to each campaign's name (TEMPLATES:PROBLEM): one plan "
                                                 "tuned again on another GPU model into the same database, e.g. "
                                                 "@h100 (a campaign stays with the GPU model that started it)")
      ("format", po::value(&a.format), "table | json: what was queued");
  add_job_options(opts, a.job);
  add_network_fs_option(opts, a.allow_network_fs);
  po::variables_map vm;
  if (parse_args("submit", kSummary, opts, args, vm, {"plan", "PLAN", 1})) return 0;
  const Format format = parse_format(a.format, false);
  JobRequest request = check_job_options(a.job, vm, "submit");
  if (a.plan_paths.empty() == a.problems.empty())
    throw InputError("submit: give a plan file or --problem (one of them)");
  std::optional<std::pair<int, int>> shard;
  if (!a.shard.empty()) shard = parse_shard(a.shard);
  check_name_suffix(a.name_suffix);

  // Everything is read and checked before the database is touched.
  struct Entry {
    Problem problem;
    std::string regime;
  };
  std::vector<Entry> entries;
  std::string plan_name;
  if (!a.plan_paths.empty()) {
    const Plan plan = Plan::load(a.plan_paths.front());
    plan_name = plan.model;
    for (const PlanEntry& e : plan.entries) entries.push_back({e.problem, e.regime});
  } else {
    // pass=fwdbwd: a training step's forward and backward, two campaigns.
    for (const std::string& p : a.problems)
      for (const Problem& one : Problem::parse_passes(p)) entries.push_back({one, ""});
  }
  if (shard) {
    std::vector<Entry> mine;
    for (std::size_t i = 0; i < entries.size(); ++i)
      if (static_cast<int>(i % shard->second) == shard->first) mine.push_back(entries[i]);
    entries = std::move(mine);
  }
  std::vector<CampaignSpace> given;
  if (!a.space_paths.empty()) {
    const service::JobSpaces spaces = service::load_space_files(a.space_paths, "submit");
    for (const SearchSpace* s : spaces.sorted) check_family(s->family());
    given = service::campaign_spaces(spaces);
  }
  std::vector<QueuedJob> jobs;
  for (const Entry& e : entries) {
    QueuedJob job;
    job.problem = e.problem;
    job.regime = e.regime;
    job.plan = plan_name;
    job.request = request;
    if (given.empty()) {
      job.request.spaces = service::default_spaces(e.problem);
    } else {
      for (const CampaignSpace& s : given) {
        check_family_serves(s.family, e.problem);
        const SearchSpace space = SearchSpace::parse(s.text, s.path);
        space.check_problem(e.problem, space.default_arch());
      }
      job.request.spaces = given;
    }
    job.campaign = service::default_campaign_name(job.request.spaces, e.problem) + a.name_suffix;
    jobs.push_back(std::move(job));
  }

  // submit writes the queue: its pages are checked before the first write. It reads the campaigns
  // of those names (one tune completed enters as done): read first, each page checked as read, so
  // a damaged one refuses the submit before anything is queued.
  Store::Options open_options;
  open_options.tables = {"queue"};
  open_options.refuse_network_fs = !a.allow_network_fs;
  Store store = Store::open(a.db_path, Store::Mode::kCreate, open_options);
  for (const QueuedJob& job : jobs) (void)store.campaign_row(job.campaign);
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  int queued = 0, existing = 0;
  Table table({"campaign", "regime", "state"});
  for (const QueuedJob& job : jobs) {
    const auto [what, state] = store.submit_job(job);
    const std::string said = what == Store::Submitted::kQueued        ? "queued"
                             : what == Store::Submitted::kAlreadyDone ? "done (tuned before)"
                                                                      : "already " + state;
    (what == Store::Submitted::kQueued ? queued : existing) += 1;
    table.add_row({job.campaign, job.regime, said});
    out.push_back({{"campaign", job.campaign}, {"problem", problem_json(job.problem)}, {"regime", job.regime},
                   {"queued", what == Store::Submitted::kQueued}, {"state", state}});
  }
  if (format == Format::kJson)
    print_json(std::cout, out);
  else
    table.print(std::cout);
  std::cerr << fmt::format("submit: {} campaign{} queued, {} already in the queue ({})\n", queued,
                           queued == 1 ? "" : "s", existing, store.path());
  return 0;
}

const bool registered = register_command({"submit", kSummary, false, run_submit});

}  // namespace
}  // namespace attntune::cli::cmd_submit
