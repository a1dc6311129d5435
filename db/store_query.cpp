// The Store's answers about results: `best` (rankings first, then the fastest ok evaluations),
// campaign rows (`campaigns`, `report`, `export`) and the problems tuned so far (warm starts).
#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>

#include "core/error.hpp"
#include "db/sqlite.hpp"
#include "db/store.hpp"
#include "db/store_rows.hpp"

namespace attntune {

using sqlite::Connection;
using sqlite::Statement;
using sqlite::Transaction;

// A final re-timing row counts only when a ranking covers it (written with or before it): one
// that a kill cut short (databases written before Store::put_final) is never a result.
#define kCountedFinal                                                                                     \
  " AND (e.phase = 'search' OR e.evaluated_at <= IFNULL((SELECT MAX(r2.ranked_at) FROM rankings r2 WHERE " \
  "r2.campaign_id = e.campaign_id), ''))"
using store_rows::config_from_text;
using store_rows::problem_from_columns;
using store_rows::read_campaign_spaces;

std::vector<Problem> Store::problems_with_results(const std::string& family) {
  Statement st(db(),
               "SELECT " + store_rows::problem_columns("c") +
                   " FROM campaigns c WHERE EXISTS "
                   "(SELECT 1 FROM evaluations e JOIN candidates k ON k.id = e.candidate_id WHERE e.campaign_id = c.id "
                   "AND e.status = 'ok' AND k.family = ?1) ORDER BY c.id");
  st.bind(family);
  std::vector<Problem> out;
  while (st.step()) {
    Problem p = problem_from_columns(st);
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// best

namespace {

// The columns of a best row, ranked and evaluated rows alike: `row` the table holding the median
// and the time it was measured (`at`), c the candidate, d the device.
std::string best_row_columns(const std::string& row, const std::string& at) {
  return fmt::format(
      "{0}.median_us AS median_us, {0}.tflops AS tflops, {0}.max_abs_err AS max_abs_err, {0}.{1} AS measured_at, "
      "c.family AS family, c.config AS config, d.name AS gpu, d.arch AS arch, c.source_hash AS source_hash",
      row, at);
}

BestRow read_best_row(const Statement& st, const std::string& campaign, const Problem& problem,
                      const std::string& db_path) {
  BestRow row;
  row.campaign = campaign;
  row.problem = problem;
  row.median_us = st.real("median_us");
  row.tflops = st.real("tflops");
  row.max_abs_err = st.real("max_abs_err");
  row.evaluated_at = st.text("measured_at");
  row.family = st.text("family");
  row.config = config_from_text(st.text("config"), db_path);
  row.gpu = st.text("gpu");
  row.arch = st.text("arch");
  row.source_hash = st.text("source_hash");
  return row;
}

// The campaigns a query covers, in creation order: id, name and the problem columns. A problem
// matches all of its columns, page, varlen, lens_seed, variants and dv included (a paged problem, a packed
// batch or a windowed problem is never its plain dense shape).
Statement select_campaigns(Connection& db, const BestQuery& q) {
  Statement camps(db,
                  "SELECT c.id AS id, c.name AS name, " + store_rows::problem_columns("c") +
                      " FROM campaigns c "
                      "WHERE (?1 IS NULL OR name = ?1) AND (?2 IS NULL OR (b = ?2 AND h = ?3 AND hkv = ?4 AND "
                  "s = ?5 AND sk = ?6 AND d = ?7 AND dtype = ?8 AND causal = ?9 AND page = ?10 AND varlen = ?11 "
                  "AND lens_seed = ?12 AND variants = ?13 AND dv = ?14)) ORDER BY id");
  camps.bind(q.campaign);
  if (q.problem) {
    const Problem& p = *q.problem;
    camps.bind_at(2, p.b);
    camps.bind_at(3, p.h);
    camps.bind_at(4, p.hkv);
    camps.bind_at(5, p.s);
    camps.bind_at(6, p.sk);
    camps.bind_at(7, p.d);
    camps.bind_at(8, dtype_name(p.dtype));
    camps.bind_at(9, p.causal);
    camps.bind_at(10, p.page);
    camps.bind_at(11, p.varlen);
    camps.bind_at(12, p.lens_seed);
    camps.bind_at(13, p.variants_column());
    camps.bind_at(14, p.dv);
  }
  return camps;
}

// One result a campaign contributes to the answer, before the answer is cut to `top`.
struct Found {
  double key;                       // the order: the median, never ahead of what the campaign ranked above it
  std::int64_t campaign_id, local;  // ties: campaign, then its own order
  std::int64_t evaluation_id;       // 0 for a ranked row (filled in `row`)
  std::optional<BestRow> row;       // a ranked row, complete
  std::string campaign;
  Problem problem;
};

// Walks each campaign's results, its ranking first, then its ok evaluations fastest first, straight
// off the evaluations_best index (which holds candidate_id, so the walk reads no table rows and
// needs no sort; ties go to the lower candidate, then the earlier evaluation): the first time a
// (template, config) shows up is its best median, so a campaign needs only as many entries as it
// takes to see `top` distinct configs, however many evaluations it holds. The statements are
// prepared once for all campaigns.
class CampaignResults {
 public:
  CampaignResults(Connection& db, std::string db_path)
      : db_path_(std::move(db_path)),
        ranked_(db,
                "SELECT " + best_row_columns("r", "ranked_at") +
                    ", c.config_key AS config_key FROM rankings r JOIN candidates c ON c.id = r.candidate_id "
                    "JOIN devices d ON d.id = r.device_id WHERE r.campaign_id = ?1 AND (?2 IS NULL OR d.name = ?2) "
                    "ORDER BY r.rank"),
        walk_(db,
              "SELECT e.id AS id, e.median_us AS median_us, e.candidate_id AS candidate_id FROM evaluations e "
              "WHERE e.campaign_id = ?1 AND e.status = 'ok'" kCountedFinal " ORDER BY e.median_us, e.candidate_id, e.id"),
        // With a GPU model: the walk reads each row's device too (so it is not the covering walk above).
        walk_gpu_(db,
                  "SELECT e.id AS id, e.median_us AS median_us, e.candidate_id AS candidate_id FROM evaluations e "
                  "WHERE e.campaign_id = ?1 AND e.status = 'ok' AND e.device_id IN (SELECT id FROM devices WHERE "
                  "name = ?2)" kCountedFinal " ORDER BY e.median_us, e.candidate_id, e.id"),
        config_of_(db, "SELECT family AS family, config_key AS config_key FROM candidates WHERE id = ?1") {}

  // Appends the campaign's first `top` distinct (template, config) to `found`.
  void collect(std::int64_t campaign_id, const std::string& name, const Problem& problem, int top,
               const std::optional<std::string>& gpu, std::vector<Found>& found) {
    std::set<std::pair<std::string, std::string>> seen;
    double floor = 0;  // the last ranked median: unranked configs never go ahead of it
    std::int64_t local = 0;
    ranked_.reset();
    ranked_.bind(campaign_id, gpu);
    while (static_cast<int>(seen.size()) < top && ranked_.step()) {
      BestRow row = read_best_row(ranked_, name, problem, db_path_);
      if (!seen.insert({row.family, ranked_.text("config_key")}).second) continue;
      floor = std::max(floor, row.median_us);
      found.push_back({floor, campaign_id, local++, 0, std::move(row), name, problem});
    }
    Statement& walk = gpu ? walk_gpu_ : walk_;
    walk.reset();
    if (gpu)
      walk.bind(campaign_id, *gpu);
    else
      walk.bind(campaign_id);
    while (static_cast<int>(seen.size()) < top && walk.step()) {
      if (seen.insert(key_of(walk.int64("candidate_id"))).second)
        found.push_back({std::max(floor, walk.real("median_us")), campaign_id, local++, walk.int64("id"),
                         std::nullopt, name, problem});
    }
  }

  void reset() {
    ranked_.reset();
    walk_.reset();
    walk_gpu_.reset();
    config_of_.reset();
  }

 private:
  // (family, config_key) of a candidate, read once.
  const std::pair<std::string, std::string>& key_of(std::int64_t candidate) {
    auto key = candidate_keys_.find(candidate);
    if (key == candidate_keys_.end()) {
      config_of_.reset();
      config_of_.bind(candidate);
      // The index and the table disagree: a page of one replaced (a copy made while a writer
      // checkpointed, a hand edit).
      if (!config_of_.step())
        throw InputError(fmt::format("database '{}' is damaged: an evaluation refers to candidate {}, which it does "
                                     "not hold",
                                     db_path_, candidate));
      key = candidate_keys_.emplace(candidate, std::pair(config_of_.text("family"), config_of_.text("config_key")))
                .first;
    }
    return key->second;
  }

  std::string db_path_;  // for messages
  Statement ranked_, walk_, walk_gpu_, config_of_;
  std::map<std::int64_t, std::pair<std::string, std::string>> candidate_keys_;  // id -> (family, config_key)
};

// The `top` best of everything found, in order.
void keep_top(std::vector<Found>& found, int top) {
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return std::tie(a.key, a.campaign_id, a.local) < std::tie(b.key, b.campaign_id, b.local);
  });
  if (found.size() > static_cast<std::size_t>(top)) found.resize(static_cast<std::size_t>(top));
}

// The rows kept, read in full (only now, so a large campaign reads only what it answers with).
std::vector<BestRow> read_found(Connection& db, const std::string& db_path, std::vector<Found>& found) {
  Statement detail(db, "SELECT " + best_row_columns("e", "evaluated_at") +
                           " FROM evaluations e JOIN candidates c ON c.id = e.candidate_id JOIN devices d ON d.id = "
                           "e.device_id WHERE e.id = ?1");
  std::vector<BestRow> out;
  for (Found& f : found) {
    if (f.row) {
      out.push_back(std::move(*f.row));
      continue;
    }
    detail.reset();
    detail.bind(f.evaluation_id);
    if (!detail.step()) throw std::logic_error("evaluation vanished inside a read transaction");
    out.push_back(read_best_row(detail, f.campaign, f.problem, db_path));
  }
  detail.reset();
  return out;
}

}  // namespace

std::vector<std::string> Store::result_gpus(const BestQuery& q) {
  Transaction read(db(), Transaction::Kind::kDeferred);
  Statement camps = select_campaigns(db(), q);
  Statement models(db(),
                   "SELECT DISTINCT d.name FROM evaluations e JOIN devices d ON d.id = e.device_id "
                   "WHERE e.campaign_id = ?1 AND e.status = 'ok'");
  std::set<std::string> names;
  while (camps.step()) {
    models.reset();
    models.bind(camps.int64("id"));
    while (models.step()) names.insert(models.text(0));
  }
  read.commit();
  return {names.begin(), names.end()};
}

std::vector<BestRow> Store::best(const BestQuery& q) {
  if (q.top < 1) throw InputError(fmt::format("best: top must be at least 1 (got {})", q.top));
  // One snapshot for all campaigns, so a concurrent writer's commit cannot split the answer.
  Transaction read(db(), Transaction::Kind::kDeferred);
  Statement camps = select_campaigns(db(), q);
  CampaignResults results(db(), path());
  std::vector<Found> found;
  while (camps.step())
    results.collect(camps.int64("id"), camps.text("name"), problem_from_columns(camps), q.top, q.gpu, found);
  results.reset();
  keep_top(found, q.top);
  std::vector<BestRow> out = read_found(db(), path(), found);
  read.commit();
  return out;
}

// ---------------------------------------------------------------------------------------------
// Campaign rows

namespace {

// The SELECT of the campaign columns every CampaignRow query reads (read_campaign_row), by name.
const std::string kCampaignRowSelect =
    "SELECT c.id AS id, c.name AS name, " + store_rows::problem_columns("c") +
    ", c.space_path AS space_path, c.space_hash AS space_hash, c.family AS family, c.strategy AS strategy, "
    "c.seed AS seed, c.budget_evals AS budget_evals, c.budget_seconds AS budget_seconds, c.status AS status, "
    "c.stop_reason AS stop_reason, c.started_at AS started_at, IFNULL(c.ended_at, '') AS ended_at, d.name AS gpu, "
    "d.arch AS arch, "
    "(SELECT count(*) FROM evaluations e WHERE e.campaign_id = c.id AND e.phase = 'search') AS evaluations, "
    "(SELECT count(*) FROM evaluations e WHERE e.campaign_id = c.id AND e.phase = 'search' AND e.status = 'ok') "
    "AS ok, "
    "IFNULL(rk.median_us, best.median_us) AS best_us, IFNULL(rk.tflops, best.tflops) AS best_tflops, "
    "c.space_text AS space_text "
    "FROM campaigns c JOIN devices d ON d.id = c.device_id "
    "LEFT JOIN rankings rk ON rk.campaign_id = c.id AND rk.rank = 1 "
    "LEFT JOIN evaluations best ON best.id = (SELECT e.id FROM evaluations e "
    "  WHERE e.campaign_id = c.id AND e.status = 'ok'" kCountedFinal " ORDER BY e.median_us, e.candidate_id, e.id LIMIT 1) ";

CampaignRow read_campaign_row(Statement& st) {
  CampaignRow r;
  r.id = st.int64("id");
  r.spec.name = st.text("name");
  r.spec.problem = problem_from_columns(st);
  r.spec.space_path = st.text("space_path");
  r.spec.space_hash = st.text("space_hash");
  r.spec.family = st.text("family");
  r.spec.strategy = st.text("strategy");
  r.spec.seed = st.int64("seed");
  r.spec.budget_evals = st.int64("budget_evals");
  r.spec.budget_seconds = st.real("budget_seconds");
  r.status = st.text("status");
  r.stop_reason = st.text("stop_reason");
  r.started_at = st.text("started_at");
  r.ended_at = st.text("ended_at");
  r.gpu = st.text("gpu");
  r.arch = st.text("arch");
  r.evaluations = st.int64("evaluations");
  r.ok = st.int64("ok");
  r.best_us = st.opt_real("best_us");
  r.best_tflops = st.opt_real("best_tflops");
  r.spec.space_text = st.text("space_text");
  return r;
}

}  // namespace

std::vector<CampaignRow> Store::campaigns() {
  Statement st(db(), kCampaignRowSelect + "ORDER BY c.id");
  std::vector<CampaignRow> out;
  while (st.step()) out.push_back(read_campaign_row(st));
  for (CampaignRow& r : out) r.spec.spaces = read_campaign_spaces(db(), r.id);
  return out;
}

std::optional<CampaignRow> Store::campaign_row(const std::string& name) {
  Statement st(db(), kCampaignRowSelect + "WHERE c.name = ?1");
  st.bind(name);
  if (!st.step()) return std::nullopt;
  CampaignRow row = read_campaign_row(st);
  st.reset();
  row.spec.spaces = read_campaign_spaces(db(), row.id);
  return row;
}

}  // namespace attntune
