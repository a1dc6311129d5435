#include "export/select.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include <fmt/format.h>

#include "core/error.hpp"
#include "cuda/driver.hpp"
#include "families/family.hpp"

namespace attntune {

namespace {

// Enough rows to find `rank` of them on `arch` when some were measured elsewhere.
constexpr int kArchFilterRows = 100000;

}  // namespace

std::optional<std::string> pick_gpu_model(const std::vector<std::string>& models,
                                          const std::optional<std::string>& prefer) {
  if (models.size() == 1) return models.front();
  if (prefer && std::find(models.begin(), models.end(), *prefer) != models.end()) return prefer;
  return std::nullopt;
}

namespace {

std::vector<BestRow> best_rows(ResultReader& results, const std::optional<Problem>& problem,
                               const std::optional<std::string>& campaign, int top, const ExportQuery& q) {
  BestQuery bq;
  bq.problem = problem;
  bq.campaign = campaign;
  bq.gpu = q.gpu;
  if (!q.gpu) {
    const std::vector<std::string> models = results.result_gpus(bq);
    if (models.size() > 1 && q.this_gpu_first) bq.gpu = pick_gpu_model(models, cuda::first_device_name());
    if (models.size() > 1 && !bq.gpu)
      throw InputError(fmt::format("the results{}{} in database '{}' were measured on several GPU models ({}): pass "
                                   "--gpu with one of them (times of two models never rank together)",
                                   campaign ? fmt::format(" of campaign '{}'", *campaign) : "",
                                   problem ? " for problem " + problem->str() : "", results.path(),
                                   fmt::join(models, ", ")));
  }
  bq.top = q.arch ? kArchFilterRows : top;
  std::vector<BestRow> rows = results.best(bq);
  if (q.arch) rows.erase(std::remove_if(rows.begin(), rows.end(), [&](const BestRow& r) { return r.arch != *q.arch; }),
                         rows.end());
  if (static_cast<int>(rows.size()) > top) rows.resize(static_cast<std::size_t>(top));
  return rows;
}

class SpaceCache {
 public:
  SpaceCache(ResultReader& results, const ExportQuery& q) : results_(results), query_(q) {}

  // The space a campaign tuned `family` in (a campaign of several templates has one per family).
  std::shared_ptr<const SearchSpace> of(const std::string& campaign, const std::string& family) {
    const std::string key = campaign + '\n' + family;
    if (auto it = spaces_.find(key); it != spaces_.end()) return it->second;
    const std::optional<CampaignRow> row = results_.campaign_row(campaign);
    if (!row) throw std::logic_error("a best row names a campaign the database does not hold");
    const CampaignSpec& spec = row->spec;
    const CampaignSpace* own = spec.space_of(family);
    const std::string& text = own ? own->text : spec.space_text;
    const std::string& hash = own ? own->hash : spec.space_hash;
    const std::string& path = own ? own->path : spec.space_path;
    std::shared_ptr<const SearchSpace> space;
    if (!text.empty()) {
      space = std::make_shared<const SearchSpace>(SearchSpace::parse(
          text, fmt::format("search space of template '{}' stored with campaign '{}'", family, campaign)));
    } else if (query_.space_file) {
      auto loaded = std::make_shared<const SearchSpace>(SearchSpace::load(*query_.space_file));
      if (loaded->hash() != hash)
        throw InputError(fmt::format(
            "--space {}: not the space campaign '{}' was tuned with (its content hash is {}, the campaign's {})",
            *query_.space_file, campaign, loaded->hash(), hash));
      space = std::move(loaded);
    } else {
      throw InputError(fmt::format(
          "campaign '{}' was recorded without its search space's text (a database from before schema 3): pass "
          "--space FILE, the space it was tuned with ({}, content hash {})",
          campaign, path, hash));
    }
    spaces_.emplace(key, space);
    return space;
  }

 private:
  ResultReader& results_;
  const ExportQuery& query_;
  std::map<std::string, std::shared_ptr<const SearchSpace>> spaces_;
};

std::string where(const ExportQuery& q, const ResultReader& results) {
  std::string w;
  if (q.campaign) w += fmt::format(" in campaign '{}'", *q.campaign);
  if (q.problem) w += " for problem " + q.problem->str();
  if (q.dtype) w += fmt::format(" of dtype {}", dtype_name(*q.dtype));
  if (q.arch) w += fmt::format(" measured on {}", *q.arch);
  if (q.gpu) w += fmt::format(" measured on a {}", *q.gpu);
  return w + fmt::format(" in database '{}'", results.path());
}

std::vector<BestRow> all_best_rows(ResultReader& results, const ExportQuery& q) {
  std::vector<Problem> problems;
  for (const CampaignRow& c : results.campaigns()) {
    if (q.dtype && c.spec.problem.dtype != *q.dtype) continue;
    if (q.only && std::find(q.only->begin(), q.only->end(), c.spec.problem) == q.only->end()) continue;
    if (std::find(problems.begin(), problems.end(), c.spec.problem) == problems.end())
      problems.push_back(c.spec.problem);
  }
  std::vector<BestRow> rows;
  for (const Problem& p : problems)
    for (BestRow& r : best_rows(results, p, std::nullopt, 1, q)) rows.push_back(std::move(r));
  if (rows.empty()) return rows;

  std::set<std::string> dtypes, archs;
  for (const BestRow& r : rows) {
    dtypes.insert(dtype_name(r.problem.dtype));
    archs.insert(base_arch(r.arch));  // sm_90 and sm_90a results of one GPU go in one file
  }
  if (dtypes.size() > 1)
    throw InputError(fmt::format(
        "export --all-best: database '{}' holds fp16 and bf16 results, and attntune_attention_forward has no "
        "dtype argument: pass --dtype fp16 or --dtype bf16 (one file per dtype)",
        results.path()));
  if (archs.size() > 1)
    throw InputError(fmt::format(
        "export --all-best: the best results in database '{}' were measured on several archs ({}): pass --arch "
        "with one of them (one file per arch)",
        results.path(), fmt::join(archs, ", ")));
  return rows;
}

// A kernel whose config narrows the calls it serves (Family::narrowed_calls: flash_fwd_wgmma's k_perm,
// key counts of fours) is followed by the best result of its problem that serves them (of its campaign
// with --campaign), measured on the same GPU model and arch: the dispatcher ranks the two alike and
// tries them in the file's order, so a call the first refuses runs the second. None where the problem
// has no such result (the file then refuses those calls, saying why).
std::string narrowed_calls(const BestRow& r) {
  const Family& f = builtin_family(r.family);
  return f.narrowed_calls ? f.narrowed_calls(r.config) : "";
}

std::vector<ExportItem> add_companions(ResultReader& results, const ExportQuery& q, SpaceCache& spaces,
                                       std::vector<ExportItem> items) {
  std::vector<ExportItem> out;
  for (ExportItem& it : items) {
    const std::string narrowed = narrowed_calls(it.row);
    BestQuery bq;
    bq.problem = it.row.problem;
    bq.campaign = q.campaign;
    bq.gpu = it.row.gpu;
    bq.top = kArchFilterRows;
    const std::string arch = it.row.arch;
    out.push_back(std::move(it));
    if (narrowed.empty()) continue;
    for (BestRow& r : results.best(bq)) {
      if (r.arch != arch || !narrowed_calls(r).empty()) continue;
      auto space = spaces.of(r.campaign, r.family);
      out.push_back({std::move(r), std::move(space), {}, narrowed});
      break;
    }
  }
  return out;
}

}  // namespace

std::vector<ExportItem> select_for_export(ResultReader& results, const ExportQuery& q) {
  const int modes = (q.campaign ? 1 : 0) + (q.problem ? 1 : 0) + (q.all_best ? 1 : 0);
  if (modes != 1) throw InputError("export: give exactly one of --campaign, --problem or --all-best");
  if (q.rank < 1) throw InputError(fmt::format("export: --rank must be at least 1 (got {})", q.rank));
  if (q.all_best && q.rank != 1) throw InputError("export: --rank applies to --campaign and --problem, not --all-best");
  if (q.dtype && !q.all_best)
    throw InputError("export: --dtype applies to --all-best (a campaign or problem has its own dtype)");
  if (q.campaign && !results.find_campaign(*q.campaign))
    throw InputError(fmt::format("no campaign '{}' in database '{}' (attntune campaigns lists them)", *q.campaign,
                                 results.path()));

  std::vector<BestRow> rows;
  if (q.all_best) {
    rows = all_best_rows(results, q);
  } else {
    rows = best_rows(results, q.problem, q.campaign, q.rank, q);
    if (!rows.empty() && static_cast<int>(rows.size()) < q.rank)
      throw WorkError(fmt::format("only {} valid config{}{}: --rank {} is beyond them", rows.size(),
                                  rows.size() == 1 ? "" : "s", where(q, results), q.rank));
    if (!rows.empty()) rows = {rows.back()};
  }
  if (rows.empty()) throw WorkError("no valid results" + where(q, results) + ": nothing to export");

  SpaceCache spaces(results, q);
  std::vector<ExportItem> items;
  for (BestRow& r : rows) {
    auto space = spaces.of(r.campaign, r.family);
    items.push_back({std::move(r), std::move(space), {}});
  }
  return add_companions(results, q, spaces, std::move(items));
}

std::vector<Problem> problems_without_results(ResultReader& results, const ExportQuery& q,
                                              const std::vector<Problem>& problems) {
  std::vector<Problem> out;
  for (const Problem& p : problems) {
    BestQuery bq;
    bq.problem = p;
    bq.gpu = q.gpu;
    bq.top = q.arch ? kArchFilterRows : 1;
    const std::vector<BestRow> rows = results.best(bq);
    if (std::none_of(rows.begin(), rows.end(), [&](const BestRow& r) { return !q.arch || r.arch == *q.arch; }))
      out.push_back(p);
  }
  return out;
}

}  // namespace attntune
