// The Store's writes, and the reads the campaign loop needs back: devices, campaigns (opened,
// resumed, finished), candidates, the build cache, evaluations and rankings. Opening and
// migrating: store_open.cpp; best results and campaign rows: store_query.cpp.
#include "db/store.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "core/error.hpp"
#include "db/sqlite.hpp"
#include "db/store_rows.hpp"
#include "db/test_hook.hpp"

namespace attntune {

using sqlite::Connection;
using sqlite::Statement;
using sqlite::Transaction;
using store_rows::config_from_text;
using store_rows::problem_from_columns;
using store_rows::read_campaign_spaces;

namespace {

std::optional<std::string> null_if_empty(const std::string& s) {
  if (s.empty()) return std::nullopt;
  return s;
}

// The spaces a spec writes: its list, or the one space its campaign-level fields describe.
std::vector<CampaignSpace> spaces_to_write(const CampaignSpec& spec) {
  if (!spec.spaces.empty()) return spec.spaces;
  return {CampaignSpace{spec.family, spec.space_path, spec.space_hash, spec.space_text}};
}

// "template 'a'", or for a campaign of several: "templates a and b", "templates a, b and c"
std::string templates_phrase(const std::string& family) {
  std::vector<std::string> names;
  for (std::size_t at = 0;;) {
    const std::size_t plus = family.find('+', at);
    names.push_back(family.substr(at, plus - at));
    if (plus == std::string::npos) break;
    at = plus + 1;
  }
  if (names.size() == 1) return fmt::format("template '{}'", family);
  const std::string last = names.back();
  names.pop_back();
  return fmt::format("templates {} and {}", fmt::join(names, ", "), last);
}

}  // namespace

std::int64_t Store::upsert_device(const DeviceInfo& device) {
  Transaction tx(db());
  Statement find(db(), "SELECT id FROM devices WHERE name = ?1 AND arch = ?2 AND IFNULL(uuid, '') = ?3");
  find.bind(device.name, device.arch, device.uuid);
  std::int64_t id = 0;
  if (find.step()) {
    id = find.int64(0);
    // A driver upgrade does not make it another GPU. (Nothing is written when nothing changed.)
    Statement update(db(),
                     "UPDATE devices SET sm_count = ?2, driver_version = ?3 "
                     "WHERE id = ?1 AND (sm_count IS NOT ?2 OR driver_version IS NOT ?3)");
    update.bind(id, device.sm_count, device.driver_version).run();
  } else {
    Statement insert(db(),
                     "INSERT INTO devices (name, arch, sm_count, uuid, driver_version) VALUES (?1, ?2, ?3, ?4, ?5)");
    insert.bind(device.name, device.arch, device.sm_count, null_if_empty(device.uuid), device.driver_version).run();
    id = db().last_insert_rowid();
  }
  tx.commit();
  return id;
}

std::optional<std::int64_t> Store::check_resume(const CampaignSpec& spec) {
  Statement find(db(), "SELECT c.id AS id, " + store_rows::problem_columns("c") +
                           ", c.space_hash AS space_hash, c.space_path AS space_path, c.family AS family "
                           "FROM campaigns c WHERE c.name = ?1");
  find.bind(spec.name);
  if (!find.step()) return std::nullopt;
  const Problem problem = problem_from_columns(find);
  const std::string space_hash = find.text("space_hash"), space_path = find.text("space_path"),
                    family = find.text("family");
  const std::string hint = "start a new campaign with another --campaign name";
  if (problem != spec.problem)
    throw InputError(fmt::format("campaign '{}' tunes problem {}; it cannot be resumed for problem {} ({})", spec.name,
                                 problem.str(), spec.problem.str(), hint));
  if (family != spec.family)
    throw InputError(fmt::format("campaign '{}' tunes {}; it cannot be resumed with {} ({})", spec.name,
                                 templates_phrase(family), templates_phrase(spec.family), hint));
  const std::int64_t id = find.int64("id");
  if (space_hash != spec.space_hash) {
    // The same families: name the space that changed.
    for (const CampaignSpace& now : spaces_to_write(spec))
      for (const CampaignSpace& then : read_campaign_spaces(db(), id))
        if (then.family == now.family && then.hash != now.hash)
          throw InputError(fmt::format(
              "campaign '{}' was started with another search space{} ('{}', hash {}; now '{}', hash {}); it cannot "
              "be resumed ({})",
              spec.name, family.find('+') == std::string::npos ? "" : " for template '" + now.family + "'", then.path,
              then.hash, now.path, now.hash, hint));
    throw InputError(fmt::format(
        "campaign '{}' was started with another search space ('{}', hash {}; now '{}', hash {}); it cannot be "
        "resumed ({})",
        spec.name, space_path, space_hash, spec.space_path, spec.space_hash, hint));
  }
  return id;
}

void Store::check_writable() {
  Transaction probe(db());  // takes the write lock (waiting up to the busy timeout), then rolls back
}

std::int64_t Store::open_campaign(const CampaignSpec& spec, std::int64_t device_id) {
  Transaction tx(db());
  check_fence_name(spec.name);
  std::int64_t id = 0;
  if (const std::optional<std::int64_t> existing = check_resume(spec)) {
    id = *existing;
    // Its results so far were measured on one GPU model: another model's times must not join them.
    Statement was(db(), "SELECT d.name FROM campaigns c JOIN devices d ON d.id = c.device_id WHERE c.id = ?1");
    was.bind(id);
    Statement now(db(), "SELECT name FROM devices WHERE id = ?1");
    now.bind(device_id);
    if (was.step() && now.step() && was.text(0) != now.text(0))
      throw InputError(fmt::format("campaign '{}' was tuned on a {}; this run is on a {}: resume it on a {}, or "
                                   "give this run another campaign name (times of two GPU models never rank "
                                   "together)",
                                   spec.name, was.text(0), now.text(0), was.text(0)));
    Statement resume(db(),
                     "UPDATE campaigns SET status = 'running', stop_reason = '', ended_at = NULL, "
                     "budget_evals = ?2, budget_seconds = ?3, device_id = ?4, strategy = ?5, seed = ?6, "
                     "space_path = ?7, space_text = CASE WHEN ?8 = '' THEN space_text ELSE ?8 END WHERE id = ?1");
    resume
        .bind(id, spec.budget_evals, spec.budget_seconds, device_id, spec.strategy, spec.seed, spec.space_path,
              spec.space_text)
        .run();
    // A re-timing that a kill cut short (a database written before put_final) left final rows that
    // no ranking covers: they are not the campaign's, and this run re-times afresh (issue 28).
    Statement partial(db(),
                      "DELETE FROM evaluations WHERE campaign_id = ?1 AND phase = 'final' AND evaluated_at > "
                      "IFNULL((SELECT MAX(ranked_at) FROM rankings WHERE campaign_id = ?1), '')");
    partial.bind(id).run();
  } else {
    const Problem& p = spec.problem;
    Statement insert(db(),
                     "INSERT INTO campaigns (name, problem, b, h, hkv, s, sk, d, dtype, causal, page, varlen, "
                     "lens_seed, space_path, space_hash, family, strategy, seed, budget_evals, budget_seconds, "
                     "device_id, space_text, variants, dv) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, "
                     "?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24)");
    insert
        .bind(spec.name, p.json().dump(), p.b, p.h, p.hkv, p.s, p.sk, p.d, dtype_name(p.dtype), p.causal, p.page,
              p.varlen, p.lens_seed, spec.space_path, spec.space_hash, spec.family, spec.strategy, spec.seed, spec.budget_evals,
              spec.budget_seconds, device_id, spec.space_text, p.variants_column(), p.dv)
        .run();
    id = db().last_insert_rowid();
  }
  // This run, as asked for: a resume with other budgets keeps the earlier runs' (campaign_runs).
  Statement run(db(),
                "INSERT INTO campaign_runs (campaign_id, run, strategy, seed, budget_evals, budget_seconds, device_id) "
                "VALUES (?1, (SELECT IFNULL(MAX(run), 0) + 1 FROM campaign_runs WHERE campaign_id = ?1), ?2, ?3, ?4, "
                "?5, ?6)");
  run.bind(id, spec.strategy, spec.seed, spec.budget_evals, spec.budget_seconds, device_id).run();
  // Each space of the campaign: the latest run's path, and its text unless it brings none.
  Statement space(db(),
                  "INSERT INTO campaign_spaces (campaign_id, family, space_path, space_hash, space_text) "
                  "VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (campaign_id, family) DO UPDATE SET "
                  "space_path = excluded.space_path, space_hash = excluded.space_hash, space_text = "
                  "CASE WHEN excluded.space_text = '' THEN space_text ELSE excluded.space_text END");
  for (const CampaignSpace& sp : spaces_to_write(spec)) {
    space.reset();
    space.bind(id, sp.family, sp.path, sp.hash, sp.text).run();
  }
  test_hook::hold("open", fmt::format("open of campaign '{}'", spec.name));
  tx.commit();
  return id;
}

void Store::finish_campaign(std::int64_t campaign_id, const std::string& status, const std::string& stop_reason) {
  Transaction tx(db());
  check_fence_id(campaign_id);
  Statement update(db(),
                   "UPDATE campaigns SET status = ?2, stop_reason = ?3, "
                   "ended_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE id = ?1");
  update.bind(campaign_id, status, stop_reason).run();
  if (db().changes() != 1) throw std::logic_error(fmt::format("finish_campaign: no campaign with id {}", campaign_id));
  Statement run(db(),
                "UPDATE campaign_runs SET status = ?2, stop_reason = ?3, ended_at = strftime('%Y-%m-%dT%H:%M:%fZ', "
                "'now') WHERE campaign_id = ?1 AND run = (SELECT MAX(run) FROM campaign_runs WHERE campaign_id = ?1)");
  run.bind(campaign_id, status, stop_reason).run();
  tx.commit();
}

std::optional<std::int64_t> Store::find_campaign(const std::string& name) {
  Statement find(db(), "SELECT id FROM campaigns WHERE name = ?1");
  find.bind(name);
  if (!find.step()) return std::nullopt;
  return find.int64(0);
}

std::int64_t Store::upsert_candidate(const std::string& family, const Config& config, const std::string& source_hash) {
  const std::string key = config_str(config);
  Transaction tx(db());
  Statement insert(db(),
                   "INSERT INTO candidates (family, config, config_key, source_hash) VALUES (?1, ?2, ?3, ?4) "
                   "ON CONFLICT (family, config_key, source_hash) DO NOTHING");
  insert.bind(family, config_json(config).dump(), key, source_hash).run();
  Statement find(db(), "SELECT id FROM candidates WHERE family = ?1 AND config_key = ?2 AND source_hash = ?3");
  find.bind(family, key, source_hash);
  if (!find.step()) throw std::logic_error("upsert_candidate: the row just written is missing");
  const std::int64_t id = find.int64(0);
  tx.commit();
  return id;
}

std::optional<BuildRecord> Store::find_build(const BuildKey& key) {
  Statement find(db(),
                 "SELECT status, cubin, log, registers, smem_static, spill_stores, spill_loads, local_bytes, "
                 "compile_ms FROM builds "
                 "WHERE source_hash = ?1 AND arch = ?2 AND nvrtc_version = ?3 AND options = ?4");
  find.bind(key.source_hash, key.arch, key.nvrtc_version, key.options);
  if (!find.step()) return std::nullopt;
  BuildRecord b;
  b.status = find.text(0);
  b.cubin = find.blob(1);
  b.log = find.text(2);
  b.registers = static_cast<int>(find.int64(3));
  b.smem_static = static_cast<int>(find.int64(4));
  b.spill_stores = static_cast<int>(find.int64(5));
  b.spill_loads = static_cast<int>(find.int64(6));
  b.local_bytes = static_cast<int>(find.int64(7));
  b.compile_ms = find.real(8);
  return b;
}

void Store::put_build(const BuildKey& key, const BuildRecord& b) {
  Statement put(db(),
                "INSERT INTO builds (source_hash, arch, nvrtc_version, options, status, cubin, log, registers, "
                "smem_static, spill_stores, spill_loads, local_bytes, compile_ms) "
                "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13) "
                "ON CONFLICT (source_hash, arch, nvrtc_version, options) DO UPDATE SET "
                "status = excluded.status, cubin = excluded.cubin, log = excluded.log, "
                "registers = excluded.registers, smem_static = excluded.smem_static, "
                "spill_stores = excluded.spill_stores, spill_loads = excluded.spill_loads, "
                "local_bytes = excluded.local_bytes, compile_ms = excluded.compile_ms, "
                "created_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')");
  std::optional<sqlite::Blob> cubin;
  if (!b.cubin.empty()) cubin = sqlite::Blob{b.cubin};
  put.bind(key.source_hash, key.arch, key.nvrtc_version, key.options, b.status, cubin, b.log, b.registers,
           b.smem_static, b.spill_stores, b.spill_loads, b.local_bytes, b.compile_ms)
      .run();
}

namespace {

// One evaluation row, numbered next in its campaign (read under the write lock: the unique
// (campaign_id, seq) index makes the MAX a single lookup), in the caller's transaction.
std::int64_t insert_evaluation(sqlite::Connection& db, std::int64_t campaign_id, std::int64_t candidate_id,
                               std::int64_t device_id, const EvalRecord& e, Phase phase) {
  Statement insert(db,
                   "INSERT INTO evaluations (campaign_id, seq, candidate_id, device_id, status, error, median_us, "
                   "min_us, max_us, stdev_us, count, tflops, max_abs_err, err_bound, phase) VALUES (?1, "
                   "(SELECT IFNULL(MAX(seq), 0) + 1 FROM evaluations WHERE campaign_id = ?1), "
                   "?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)");
  insert
      .bind(campaign_id, candidate_id, device_id, e.status, e.error, e.median_us, e.min_us, e.max_us, e.stdev_us,
            e.count, e.tflops, e.max_abs_err, e.err_bound, phase == Phase::kFinal ? "final" : "search")
      .run();
  return db.last_insert_rowid();
}

// Replaces the campaign's ranking, in the caller's transaction.
void replace_ranking(sqlite::Connection& db, std::int64_t campaign_id, std::int64_t device_id,
                     const std::vector<RankingEntry>& entries) {
  Statement clear(db, "DELETE FROM rankings WHERE campaign_id = ?1");
  clear.bind(campaign_id).run();
  Statement insert(db,
                   "INSERT INTO rankings (campaign_id, rank, candidate_id, device_id, median_us, tflops, max_abs_err, "
                   "spread_pct, rounds) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)");
  int rank = 1;
  for (const RankingEntry& e : entries) {
    insert.reset();
    insert
        .bind(campaign_id, rank++, e.candidate_id, e.device_id ? e.device_id : device_id, e.median_us, e.tflops,
              e.max_abs_err, e.spread_pct, e.rounds)
        .run();
  }
}

// The test hook (db/test_hook.hpp): says which evaluation is written and holds the transaction open,
// so a test can kill the process inside it.
void hold_commit(sqlite::Connection& db, std::string_view kind, std::int64_t campaign_id, std::int64_t evaluation_id) {
  if (test_hook::hold_ms(kind) <= 0) return;
  Statement seq(db, "SELECT seq FROM evaluations WHERE id = ?1");
  seq.bind(evaluation_id);
  seq.step();
  test_hook::hold(kind, fmt::format("evaluation {} of campaign {}", seq.int64(0), campaign_id));
}

}  // namespace

std::int64_t Store::record_evaluation(std::int64_t campaign_id, std::int64_t candidate_id, std::int64_t device_id,
                                      const EvalRecord& e, Phase phase) {
  Transaction tx(db());
  check_fence_id(campaign_id);
  const std::int64_t id = insert_evaluation(db(), campaign_id, candidate_id, device_id, e, phase);
  hold_commit(db(), "evaluation", campaign_id, id);
  tx.commit();
  return id;
}

void Store::put_final(std::int64_t campaign_id, std::int64_t device_id, const std::vector<FinalEvaluation>& finals,
                      const std::vector<RankingEntry>& entries) {
  Transaction tx(db());
  check_fence_id(campaign_id);
  std::int64_t last = 0;
  for (const FinalEvaluation& f : finals)
    last = insert_evaluation(db(), campaign_id, f.candidate_id, f.device_id, f.record, Phase::kFinal);
  replace_ranking(db(), campaign_id, device_id, entries);
  if (last) hold_commit(db(), "final", campaign_id, last);
  tx.commit();
}

std::vector<CampaignRunRow> Store::campaign_runs(std::int64_t campaign_id) {
  Statement st(db(),
               "SELECT r.run, r.strategy, r.seed, r.budget_evals, r.budget_seconds, d.name, d.arch, r.started_at, "
               "IFNULL(r.ended_at, ''), r.status, r.stop_reason FROM campaign_runs r JOIN devices d ON d.id = "
               "r.device_id WHERE r.campaign_id = ?1 ORDER BY r.run");
  st.bind(campaign_id);
  std::vector<CampaignRunRow> out;
  while (st.step()) {
    CampaignRunRow r;
    r.run = static_cast<int>(st.int64(0));
    r.strategy = st.text(1);
    r.seed = st.int64(2);
    r.budget_evals = st.int64(3);
    r.budget_seconds = st.real(4);
    r.gpu = st.text(5);
    r.arch = st.text(6);
    r.started_at = st.text(7);
    r.ended_at = st.text(8);
    r.status = st.text(9);
    r.stop_reason = st.text(10);
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<EvaluationRow> Store::campaign_evaluations(std::int64_t campaign_id) {
  Statement st(db(),
               "SELECT c.config, e.status, e.error, e.median_us, e.min_us, e.max_us, e.stdev_us, e.tflops, "
               "e.max_abs_err, e.err_bound, e.count, e.seq, e.evaluated_at, c.family "
               "FROM evaluations e JOIN candidates c ON c.id = e.candidate_id "
               "WHERE e.campaign_id = ?1 AND e.phase = 'search' ORDER BY e.seq");
  st.bind(campaign_id);
  std::vector<EvaluationRow> out;
  while (st.step()) {
    EvalRecord r;
    r.status = st.text(1);
    r.error = st.text(2);
    r.median_us = st.opt_real(3);
    r.min_us = st.opt_real(4);
    r.max_us = st.opt_real(5);
    r.stdev_us = st.opt_real(6);
    r.tflops = st.opt_real(7);
    r.max_abs_err = st.opt_real(8);
    r.err_bound = st.opt_real(9);
    r.count = st.int64(10);
    out.push_back({st.int64(11), config_from_text(st.text(0), path()), std::move(r), st.text(12), st.text(13)});
  }
  return out;
}

void Store::put_ranking(std::int64_t campaign_id, std::int64_t device_id, const std::vector<RankingEntry>& entries) {
  Transaction tx(db());
  check_fence_id(campaign_id);
  replace_ranking(db(), campaign_id, device_id, entries);
  tx.commit();
}

std::vector<RankedRow> Store::ranking(std::int64_t campaign_id) {
  Statement st(db(),
               "SELECT r.rank, c.config, r.candidate_id, r.median_us, r.tflops, r.max_abs_err, r.spread_pct, r.rounds, "
               "c.family, r.device_id FROM rankings r JOIN candidates c ON c.id = r.candidate_id WHERE r.campaign_id = ?1 ORDER BY r.rank");
  st.bind(campaign_id);
  std::vector<RankedRow> out;
  while (st.step()) {
    RankedRow row;
    row.rank = static_cast<int>(st.int64(0));
    row.config = config_from_text(st.text(1), path());
    row.entry.candidate_id = st.int64(2);
    row.entry.median_us = st.real(3);
    row.entry.tflops = st.real(4);
    row.entry.max_abs_err = st.real(5);
    row.entry.spread_pct = st.real(6);
    row.entry.rounds = static_cast<int>(st.int64(7));
    row.family = st.text(8);
    row.entry.device_id = st.int64(9);
    out.push_back(std::move(row));
  }
  return out;
}

}  // namespace attntune
