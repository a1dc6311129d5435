// `merge` (db/merge.hpp, docs/design/merge.md): other attntune databases into this one, content-
// addressed, in one write transaction. Each input is read through its own connection, in one read
// transaction, and its rows are written here through prepared statements that copy every value as
// it is stored (Statement::bind_column), with the input's ids mapped to this database's.
//
// Not ATTACH with INSERT ... SELECT: SQLite refuses to ATTACH inside a transaction, so attaching the
// inputs one at a time would split the merge into one transaction per input, and attaching them all
// first stops at SQLITE_MAX_ATTACHED (10) inputs, fewer than the hosts of a job array. An input's own
// connection also keeps the Store's way of reading a live WAL database (and an older schema through
// an in-memory migration) without writing it.
#include <sys/stat.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/output_file.hpp"
#include "db/merge.hpp"
#include "db/sqlite.hpp"
#include "db/store.hpp"
#include "db/test_hook.hpp"

namespace attntune {

using sqlite::Connection;
using sqlite::Statement;
using sqlite::Transaction;

namespace {

namespace fs = std::filesystem;

// The campaigns columns merge copies, in this order (everything but the id).
constexpr const char* kMergedCampaignColumns =
    "name, problem, b, h, hkv, s, sk, d, dtype, causal, page, varlen, lens_seed, space_path, space_hash, family, "
    "strategy, seed, status, stop_reason, budget_evals, budget_seconds, device_id, started_at, ended_at, space_text, "
    "variants, dv";
constexpr int kCampaignColumnCount = 28;
constexpr int kCampaignName = 0, kCampaignDevice = 22;

// The evaluations columns copied, campaign_id and id aside.
constexpr const char* kEvaluationColumns =
    "seq, candidate_id, device_id, status, error, median_us, min_us, max_us, stdev_us, count, tflops, max_abs_err, "
    "err_bound, evaluated_at, phase";
constexpr int kEvaluationColumnCount = 15;
constexpr int kEvaluationCandidate = 1, kEvaluationDevice = 2;

constexpr const char* kRankingColumns =
    "rank, candidate_id, device_id, median_us, tflops, max_abs_err, spread_pct, rounds, ranked_at";
constexpr int kRankingColumnCount = 9;
constexpr int kRankingCandidate = 1, kRankingDevice = 2;

constexpr const char* kBuildColumns =
    "source_hash, arch, nvrtc_version, options, status, cubin, log, registers, smem_static, spill_stores, "
    "spill_loads, local_bytes, compile_ms, created_at";
constexpr int kBuildColumnCount = 14;

// "?1, ?2, ..., ?n"
std::string placeholders(int n, int first = 1) {
  std::string out;
  for (int i = 0; i < n; ++i) out += fmt::format("{}?{}", i ? ", " : "", first + i);
  return out;
}

// "a = ?2, b = ?3, ..." for the comma-separated `columns`, numbered from `first`.
std::string assignments(std::string_view columns, int first) {
  std::string out;
  int i = first;
  for (std::size_t at = 0; at < columns.size();) {
    std::size_t comma = columns.find(',', at);
    if (comma == std::string_view::npos) comma = columns.size();
    std::string_view name = columns.substr(at, comma - at);
    while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
    out += fmt::format("{}{} = ?{}", i == first ? "" : ", ", name, i);
    ++i;
    at = comma + 1;
  }
  return out;
}

// Queue states, the one further along first: a job done anywhere is done.
int queue_rank(const std::string& state) {
  if (state == "done") return 3;
  if (state == "failed") return 2;
  if (state == "running") return 1;
  return 0;  // queued
}

// One evaluation as the comparison of two campaigns sees it: what was evaluated, in which order,
// with what outcome. The candidate is this database's id (the input's mapped).
struct EvalKey {
  std::int64_t seq = 0, candidate = 0;
  std::string status;
  std::optional<double> median_us;
  bool operator==(const EvalKey& o) const {
    return seq == o.seq && candidate == o.candidate && status == o.status && median_us == o.median_us;
  }
};

// How an input's campaign relates to the campaign of the same name here.
struct Relation {
  enum Kind {
    kOther,    // another problem, search space or template: not the same campaign
    kDiverge,  // the same campaign, but the evaluations differ at `at` (two hosts both ran it)
    kSame,     // nothing to add: the same evaluations and state, or this database has more
    kExtend,   // this database holds a prefix of it: add what follows, take its state and ranking
  } kind = kSame;
  std::int64_t at = 0;  // kDiverge: the first seq that differs; kExtend: the last seq held here
};

// Merges one input. `out` is inside the caller's write transaction, `in` inside a read transaction.
class InputMerger {
 public:
  InputMerger(Connection& out, Connection& in, const MergeSource& source, MergeCounts& counts)
      : out_(out), in_(in), source_(source), counts_(counts) {}

  void run() {
    merge_devices();
    merge_candidates();
    merge_builds();
    merge_campaigns();
    merge_queue();
    merge_gpus();
  }

 private:
  Connection& out_;
  Connection& in_;
  const MergeSource& source_;
  MergeCounts& counts_;
  std::map<std::int64_t, std::int64_t> devices_, candidates_;  // input id -> id here

  std::int64_t mapped(const std::map<std::int64_t, std::int64_t>& ids, std::int64_t id, const char* what) const {
    const auto it = ids.find(id);
    if (it == ids.end())
      throw InputError(fmt::format("database '{}' is corrupt (a row refers to {} {}, which it does not hold)",
                                   source_.path, what, id));
    return it->second;
  }

  // ---- devices: by (name, arch, uuid); a uuid unknown (NULL) counts as '', as the unique index does
  void merge_devices() {
    Statement rows(in_, "SELECT id, name, arch, sm_count, uuid, driver_version FROM devices ORDER BY id");
    Statement find(out_, "SELECT id FROM devices WHERE name = ?1 AND arch = ?2 AND IFNULL(uuid, '') = IFNULL(?3, '')");
    Statement insert(out_, "INSERT INTO devices (name, arch, sm_count, uuid, driver_version) VALUES (?1, ?2, ?3, ?4, ?5)");
    while (rows.step()) {
      find.reset();
      find.bind_column(1, rows, 1);
      find.bind_column(2, rows, 2);
      find.bind_column(3, rows, 4);
      if (find.step()) {
        devices_[rows.int64(0)] = find.int64(0);
        continue;
      }
      insert.reset();
      for (int c = 1; c <= 5; ++c) insert.bind_column(c, rows, c);
      insert.run();
      devices_[rows.int64(0)] = out_.last_insert_rowid();
      ++counts_.devices_added;
    }
  }

  // ---- candidates: by (family, config_key, source_hash), the rendered kernel's identity
  void merge_candidates() {
    Statement rows(in_, "SELECT id, family, config, config_key, source_hash FROM candidates ORDER BY id");
    Statement find(out_, "SELECT id FROM candidates WHERE family = ?1 AND config_key = ?2 AND source_hash = ?3");
    Statement insert(out_, "INSERT INTO candidates (family, config, config_key, source_hash) VALUES (?1, ?2, ?3, ?4)");
    while (rows.step()) {
      find.reset();
      find.bind_column(1, rows, 1);
      find.bind_column(2, rows, 3);
      find.bind_column(3, rows, 4);
      if (find.step()) {
        candidates_[rows.int64(0)] = find.int64(0);
        continue;
      }
      insert.reset();
      for (int c = 1; c <= 4; ++c) insert.bind_column(c, rows, c);
      insert.run();
      candidates_[rows.int64(0)] = out_.last_insert_rowid();
      ++counts_.candidates_added;
    }
  }

  // ---- builds: by (source_hash, arch, nvrtc_version, options); an ok build replaces a failed one.
  // The cubin is read only for the builds written.
  void merge_builds() {
    Statement rows(in_, "SELECT id, source_hash, arch, nvrtc_version, options, status FROM builds ORDER BY id");
    Statement full(in_, fmt::format("SELECT {} FROM builds WHERE id = ?1", kBuildColumns));
    Statement find(out_,
                   "SELECT id, status FROM builds WHERE source_hash = ?1 AND arch = ?2 AND nvrtc_version = ?3 AND "
                   "options = ?4");
    Statement insert(out_, fmt::format("INSERT INTO builds ({}) VALUES ({})", kBuildColumns,
                                       placeholders(kBuildColumnCount)));
    Statement replace(out_, fmt::format("UPDATE builds SET {} WHERE id = ?1", assignments(kBuildColumns, 2)));
    while (rows.step()) {
      find.reset();
      for (int c = 1; c <= 4; ++c) find.bind_column(c, rows, c);
      std::optional<std::int64_t> existing;
      if (find.step()) {
        const bool ours_ok = find.text(1) == "ok";
        existing = find.int64(0);
        find.reset();
        if (ours_ok || rows.text(5) != "ok") continue;  // ours is as good
      }
      full.reset();
      full.bind(rows.int64(0));
      if (!full.step()) throw std::logic_error("merge: a build vanished inside a read transaction");
      Statement& write = existing ? replace : insert;
      write.reset();
      const int first = existing ? 2 : 1;
      if (existing) write.bind_at(1, *existing);
      for (int c = 0; c < kBuildColumnCount; ++c) write.bind_column(first + c, full, c);
      write.run();
      ++(existing ? counts_.builds_replaced : counts_.builds_added);
    }
  }

  // ---- campaigns: by name, then by their evaluations

  std::vector<EvalKey> eval_keys(Connection& db, std::int64_t campaign_id, bool map_candidates) {
    Statement st(db, "SELECT seq, candidate_id, status, median_us FROM evaluations WHERE campaign_id = ?1 ORDER BY seq");
    st.bind(campaign_id);
    std::vector<EvalKey> out;
    while (st.step())
      out.push_back({st.int64(0), map_candidates ? mapped(candidates_, st.int64(1), "candidate") : st.int64(1),
                     st.text(2), st.opt_real(3)});
    return out;
  }

  static bool has_ranking(Connection& db, std::int64_t campaign_id) {
    Statement st(db, "SELECT 1 FROM rankings WHERE campaign_id = ?1 LIMIT 1");
    st.bind(campaign_id);
    return st.step();
  }

  // The problem, search space and template that make two campaigns of one name the same campaign.
  static std::string identity(Connection& db, std::int64_t campaign_id) {
    Statement st(db,
                 "SELECT b, h, hkv, s, sk, d, dtype, causal, page, varlen, lens_seed, variants, dv, space_hash, family "
                 "FROM campaigns WHERE id = ?1");
    st.bind(campaign_id);
    if (!st.step()) throw std::logic_error("merge: a campaign vanished");
    std::string key;
    for (int c = 0; c < 15; ++c) key += st.text(c) + '\x1f';
    return key;
  }

  static std::string status_of(Connection& db, std::int64_t campaign_id) {
    Statement st(db, "SELECT status FROM campaigns WHERE id = ?1");
    st.bind(campaign_id);
    return st.step() ? st.text(0) : "";
  }

  Relation relate(std::int64_t here, std::int64_t theirs) {
    if (identity(out_, here) != identity(in_, theirs)) return {Relation::kOther, 0};
    const std::vector<EvalKey> a = eval_keys(out_, here, false), b = eval_keys(in_, theirs, true);
    const std::size_t common = std::min(a.size(), b.size());
    for (std::size_t i = 0; i < common; ++i)
      if (!(a[i] == b[i])) return {Relation::kDiverge, std::min(a[i].seq, b[i].seq)};
    const std::int64_t held = a.empty() ? 0 : a.back().seq;
    if (b.size() > a.size()) return {Relation::kExtend, held};
    if (b.size() < a.size()) return {Relation::kSame, 0};
    // The same evaluations: the input may still be further along, finished or ranked where this one
    // is not (a copy taken between the last evaluation and the ranking or the end).
    const bool finished_here = status_of(out_, here) != "running", finished_there = status_of(in_, theirs) != "running";
    const bool ranked_here = has_ranking(out_, here), ranked_there = has_ranking(in_, theirs);
    const bool further = finished_there >= finished_here && ranked_there >= ranked_here &&
                         (finished_there > finished_here || ranked_there > ranked_here);
    return further ? Relation{Relation::kExtend, held} : Relation{Relation::kSame, 0};
  }

  // The campaign's evaluations after seq `after`, its ranking and spaces, copied to `here`.
  void copy_evaluations(std::int64_t theirs, std::int64_t here, std::int64_t after) {
    Statement rows(in_, fmt::format("SELECT {} FROM evaluations WHERE campaign_id = ?1 AND seq > ?2 ORDER BY seq",
                                    kEvaluationColumns));
    rows.bind(theirs, after);
    Statement insert(out_, fmt::format("INSERT INTO evaluations (campaign_id, {}) VALUES (?1, {})", kEvaluationColumns,
                                       placeholders(kEvaluationColumnCount, 2)));
    while (rows.step()) {
      insert.reset();
      insert.bind_at(1, here);
      for (int c = 0; c < kEvaluationColumnCount; ++c) {
        if (c == kEvaluationCandidate)
          insert.bind_at(2 + c, mapped(candidates_, rows.int64(c), "candidate"));
        else if (c == kEvaluationDevice)
          insert.bind_at(2 + c, mapped(devices_, rows.int64(c), "device"));
        else
          insert.bind_column(2 + c, rows, c);
      }
      insert.run();
      ++counts_.evaluations_added;
    }
  }

  void copy_ranking(std::int64_t theirs, std::int64_t here) {
    Statement(out_, "DELETE FROM rankings WHERE campaign_id = ?1").bind(here).run();
    Statement rows(in_, fmt::format("SELECT {} FROM rankings WHERE campaign_id = ?1 ORDER BY rank", kRankingColumns));
    rows.bind(theirs);
    Statement insert(out_, fmt::format("INSERT INTO rankings (campaign_id, {}) VALUES (?1, {})", kRankingColumns,
                                       placeholders(kRankingColumnCount, 2)));
    while (rows.step()) {
      insert.reset();
      insert.bind_at(1, here);
      for (int c = 0; c < kRankingColumnCount; ++c) {
        if (c == kRankingCandidate)
          insert.bind_at(2 + c, mapped(candidates_, rows.int64(c), "candidate"));
        else if (c == kRankingDevice)
          insert.bind_at(2 + c, mapped(devices_, rows.int64(c), "device"));
        else
          insert.bind_column(2 + c, rows, c);
      }
      insert.run();
      ++counts_.rankings_added;
    }
  }

  void copy_spaces(std::int64_t theirs, std::int64_t here) {
    Statement rows(in_, "SELECT family, space_path, space_hash, space_text FROM campaign_spaces WHERE campaign_id = ?1");
    rows.bind(theirs);
    Statement put(out_,
                  "INSERT INTO campaign_spaces (campaign_id, family, space_path, space_hash, space_text) VALUES "
                  "(?1, ?2, ?3, ?4, ?5) ON CONFLICT (campaign_id, family) DO UPDATE SET space_path = "
                  "excluded.space_path, space_hash = excluded.space_hash, space_text = excluded.space_text");
    while (rows.step()) {
      put.reset();
      put.bind_at(1, here);
      for (int c = 0; c < 4; ++c) put.bind_column(2 + c, rows, c);
      put.run();
    }
  }

  // Each run of the campaign (schema 7: what every run asked for), by run number; the input's
  // row of a run replaces ours (it is the same run, further along) and keeps its device mapped.
  void copy_runs(std::int64_t theirs, std::int64_t here) {
    Statement rows(in_,
                   "SELECT run, strategy, seed, budget_evals, budget_seconds, device_id, started_at, ended_at, status, "
                   "stop_reason FROM campaign_runs WHERE campaign_id = ?1 ORDER BY run");
    rows.bind(theirs);
    Statement put(out_,
                  "INSERT INTO campaign_runs (campaign_id, run, strategy, seed, budget_evals, budget_seconds, "
                  "device_id, started_at, ended_at, status, stop_reason) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, "
                  "?9, ?10, ?11) ON CONFLICT (campaign_id, run) DO UPDATE SET strategy = excluded.strategy, seed = "
                  "excluded.seed, budget_evals = excluded.budget_evals, budget_seconds = excluded.budget_seconds, "
                  "device_id = excluded.device_id, started_at = excluded.started_at, ended_at = excluded.ended_at, "
                  "status = excluded.status, stop_reason = excluded.stop_reason");
    while (rows.step()) {
      put.reset();
      put.bind_at(1, here);
      for (int c = 0; c < 10; ++c) {
        if (c == 5)
          put.bind_at(2 + c, mapped(devices_, rows.int64(c), "device"));
        else
          put.bind_column(2 + c, rows, c);
      }
      put.run();
    }
  }

  // A campaign new here, under `name`: the row, its spaces, evaluations and ranking.
  void add_campaign(std::int64_t theirs, const std::string& name) {
    Statement row(in_, fmt::format("SELECT {} FROM campaigns WHERE id = ?1", kMergedCampaignColumns));
    row.bind(theirs);
    if (!row.step()) throw std::logic_error("merge: a campaign vanished inside a read transaction");
    Statement insert(out_, fmt::format("INSERT INTO campaigns ({}) VALUES ({})", kMergedCampaignColumns,
                                       placeholders(kCampaignColumnCount)));
    for (int c = 0; c < kCampaignColumnCount; ++c) {
      if (c == kCampaignName)
        insert.bind_at(1 + c, name);
      else if (c == kCampaignDevice)
        insert.bind_at(1 + c, mapped(devices_, row.int64(c), "device"));
      else
        insert.bind_column(1 + c, row, c);
    }
    insert.run();
    const std::int64_t here = out_.last_insert_rowid();
    copy_spaces(theirs, here);
    copy_runs(theirs, here);
    copy_evaluations(theirs, here, 0);
    copy_ranking(theirs, here);
  }

  // The input's campaign is this one and further along: its evaluations after `held`, then its state
  // (every column a resumed or finished run sets) and its ranking.
  void extend_campaign(std::int64_t theirs, std::int64_t here, std::int64_t held) {
    copy_evaluations(theirs, here, held);
    Statement row(in_,
                  "SELECT strategy, seed, status, stop_reason, budget_evals, budget_seconds, device_id, ended_at, "
                  "space_path, space_text FROM campaigns WHERE id = ?1");
    row.bind(theirs);
    if (!row.step()) throw std::logic_error("merge: a campaign vanished inside a read transaction");
    Statement update(out_,
                     "UPDATE campaigns SET strategy = ?2, seed = ?3, status = ?4, stop_reason = ?5, budget_evals = ?6, "
                     "budget_seconds = ?7, device_id = ?8, ended_at = ?9, space_path = ?10, space_text = ?11 "
                     "WHERE id = ?1");
    update.bind_at(1, here);
    for (int c = 0; c < 10; ++c) {
      if (c == 6)
        update.bind_at(2 + c, mapped(devices_, row.int64(c), "device"));
      else
        update.bind_column(2 + c, row, c);
    }
    update.run();
    copy_spaces(theirs, here);
    copy_runs(theirs, here);
    copy_ranking(theirs, here);
  }

  std::optional<std::int64_t> find_here(const std::string& name) {
    Statement st(out_, "SELECT id FROM campaigns WHERE name = ?1");
    st.bind(name);
    if (!st.step()) return std::nullopt;
    return st.int64(0);
  }

  enum class Settled { kAdded, kSame, kExtended, kRefused };

  // Settles `theirs` against the campaign named `name` here: added when there is none, nothing when
  // this one holds it already, extended when this one holds a prefix of it; refused (with why in
  // `reason`) when that name is another campaign or the evaluations diverge.
  Settled settle(std::int64_t theirs, const std::string& name, std::string& reason) {
    const std::optional<std::int64_t> here = find_here(name);
    if (!here) {
      add_campaign(theirs, name);
      return Settled::kAdded;
    }
    const Relation r = relate(*here, theirs);
    switch (r.kind) {
      case Relation::kSame:
        return Settled::kSame;
      case Relation::kExtend:
        extend_campaign(theirs, *here, r.at);
        return Settled::kExtended;
      case Relation::kOther:
        reason = fmt::format("'{}' in the output tunes another problem, search space or template", name);
        return Settled::kRefused;
      case Relation::kDiverge:
        reason = fmt::format("its evaluations and those of '{}' in the output differ from evaluation {} on (both "
                             "hosts ran it)",
                             name, r.at);
        return Settled::kRefused;
    }
    return Settled::kRefused;
  }

  void count(Settled s) {
    if (s == Settled::kAdded) ++counts_.campaigns_added;
    if (s == Settled::kSame) ++counts_.campaigns_same;
    if (s == Settled::kExtended) ++counts_.campaigns_extended;
  }

  void merge_campaigns() {
    std::vector<std::pair<std::int64_t, std::string>> campaigns;
    {
      Statement rows(in_, "SELECT id, name FROM campaigns ORDER BY id");
      while (rows.step()) campaigns.emplace_back(rows.int64(0), rows.text(1));
    }
    for (const auto& [theirs, name] : campaigns) {
      std::string reason;
      const Settled first = settle(theirs, name, reason);
      if (first != Settled::kRefused) {
        count(first);
        continue;
      }
      // Never lose data: under NAME@stem, or NAME@stem.2, ... the first that is free or already holds
      // it (so merging the input again finds it there and adds nothing).
      const std::string base = name + "@" + source_.stem;
      for (int n = 1;; ++n) {
        const std::string renamed = n == 1 ? base : fmt::format("{}.{}", base, n);
        std::string why;
        const Settled s = settle(theirs, renamed, why);
        if (s == Settled::kRefused) continue;
        if (s == Settled::kAdded) {
          ++counts_.campaigns_renamed;
          counts_.renamed.push_back({name, renamed, reason});
        } else {
          count(s);
        }
        break;
      }
    }
  }

  // ---- queue: by campaign name; done > failed > running > queued. A running job is imported as
  // queued: its lease is the input host's and is not merged.
  void merge_queue() {
    Statement rows(in_,
                   "SELECT campaign, plan, regime, problem, request, state, attempts, error, worker, submitted_at, "
                   "started_at, ended_at FROM queue ORDER BY id");
    Statement find(out_, "SELECT id, state, attempts FROM queue WHERE campaign = ?1");
    Statement insert(out_,
                     "INSERT INTO queue (campaign, plan, regime, problem, request, state, attempts, error, worker, "
                     "submitted_at, started_at, ended_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)");
    Statement take(out_,
                   "UPDATE queue SET state = ?2, attempts = MAX(attempts, ?3), error = ?4, worker = ?5, ended_at = ?6, "
                   "started_at = IFNULL(started_at, ?7) WHERE id = ?1");
    Statement attempts(out_, "UPDATE queue SET attempts = ?2 WHERE id = ?1 AND attempts < ?2");
    while (rows.step()) {
      const std::string state = rows.text(5) == "running" ? "queued" : rows.text(5);
      find.reset();
      find.bind_column(1, rows, 0);
      if (!find.step()) {
        insert.reset();
        for (int c = 0; c < 12; ++c) {
          if (c == 5)
            insert.bind_at(6, state);
          else
            insert.bind_column(1 + c, rows, c);
        }
        insert.run();
        ++counts_.queue_added;
        continue;
      }
      const std::int64_t id = find.int64(0), held_attempts = find.int64(2);
      const std::string held_state = find.text(1);
      find.reset();
      if (queue_rank(state) > queue_rank(held_state)) {
        take.reset();
        take.bind_at(1, id);
        take.bind_at(2, state);
        take.bind_column(3, rows, 6);
        take.bind_column(4, rows, 7);
        take.bind_column(5, rows, 8);
        take.bind_column(6, rows, 11);
        take.bind_column(7, rows, 10);
        take.run();
        ++counts_.queue_updated;
      } else if (rows.int64(6) > held_attempts) {
        attempts.reset();
        attempts.bind(id, rows.int64(6)).run();
        ++counts_.queue_updated;
      }
    }
  }

  // ---- gpus: by (host, ordinal), the latest updated_at wins
  void merge_gpus() {
    Statement rows(in_, "SELECT host, ordinal, name, uuid, state, error, updated_at FROM gpus ORDER BY host, ordinal");
    Statement put(out_,
                  "INSERT INTO gpus (host, ordinal, name, uuid, state, error, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, "
                  "?6, ?7) ON CONFLICT (host, ordinal) DO UPDATE SET name = excluded.name, uuid = excluded.uuid, "
                  "state = excluded.state, error = excluded.error, updated_at = excluded.updated_at "
                  "WHERE excluded.updated_at > gpus.updated_at");
    while (rows.step()) {
      put.reset();
      for (int c = 0; c < 7; ++c) put.bind_column(1 + c, rows, c);
      put.run();
      counts_.gpus_updated += out_.changes();
    }
  }
};

std::int64_t count_rows(Connection& db, const char* table) {
  Statement st(db, fmt::format("SELECT count(*) FROM {}", table));
  return st.step() ? st.int64(0) : 0;
}

// The schema version and application id in a file's header, when it is an SQLite file that says
// them (Store::open judges everything else).
struct HeaderVersion {
  std::uint32_t application_id = 0, version = 0;
};
std::optional<HeaderVersion> header_version(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::array<unsigned char, 100> h{};
  if (!f.read(reinterpret_cast<char*>(h.data()), h.size())) return std::nullopt;
  if (std::memcmp(h.data(), "SQLite format 3", 16) != 0) return std::nullopt;
  auto be32 = [&](int at) {
    return (std::uint32_t{h[at]} << 24) | (std::uint32_t{h[at + 1]} << 16) | (std::uint32_t{h[at + 2]} << 8) |
           h[at + 3];
  };
  return HeaderVersion{be32(68), be32(60)};
}

}  // namespace

std::vector<MergeCounts> Store::merge_from(const std::vector<MergeSource>& inputs, const MergeProgress& progress) {
  std::vector<MergeCounts> report;
  Transaction write(db());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const MergeSource& source = inputs[i];
    if (!source.store) throw std::logic_error("merge_from: an input without a store");
    Connection& in = source.store->db();
    MergeCounts counts;
    counts.input = source.path;
    Transaction read(in, Transaction::Kind::kDeferred);  // one snapshot of the input
    if (progress)
      progress(fmt::format("merge: reading '{}' ({} of {}): campaigns {}, evaluations {}", source.path, i + 1,
                           inputs.size(), count_rows(in, "campaigns"), count_rows(in, "evaluations")));
    InputMerger(db(), in, source, counts).run();
    read.commit();
    report.push_back(std::move(counts));
  }
  {
    Statement fk(db(), "PRAGMA foreign_key_check");
    if (fk.step()) throw std::logic_error(fmt::format("merge: foreign key violation in table {}", fk.text(0)));
  }
  if (progress) progress(fmt::format("merge: committing to '{}'", path()));
  test_hook::hold("merge", fmt::format("merge into '{}'", path()));
  write.commit();
  return report;
}

std::vector<MergeCounts> merge_databases(const std::vector<std::string>& inputs, const std::string& out,
                                         const MergeProgress& progress) {
  if (inputs.empty()) throw InputError("merge: no input databases (attntune merge A.db B.db ... -o OUT.db)");
  if (out.empty()) throw InputError("merge: no output database (-o OUT.db)");

  // The output must not be an input, by filesystem identity: another name, a link or a path through
  // a symbolic link is still the same file.
  struct stat out_stat {};
  if (::stat(out.c_str(), &out_stat) == 0) {
    for (const std::string& input : inputs) {
      struct stat in_stat {};
      if (::stat(input.c_str(), &in_stat) == 0 && in_stat.st_dev == out_stat.st_dev &&
          in_stat.st_ino == out_stat.st_ino)
        throw InputError(fmt::format("merge: the output '{}' is the input '{}' (the same file); merge into another "
                                     "file (nothing merged)",
                                     out, input));
    }
  }

  // Nor one of an input's SQLite companions (-wal, -shm, -journal), nor an input one of the
  // output's: SQLite would take one for the other's log (core/output_file.hpp, issue 28).
  for (const std::string& input : inputs) {
    std::string which;
    if (is_database_file(out, input, &which) || is_database_file(input, out, &which))
      throw InputError(fmt::format("merge: the output '{}' and the input '{}' are one database's files ({}); merge "
                                   "into another file (nothing merged)",
                                   out, input, which));
  }

  // Every input is opened (and judged) before the output is touched.
  const int current = Store::current_schema_version();
  std::vector<Store> stores;
  stores.reserve(inputs.size());
  for (const std::string& input : inputs) {
    const std::optional<HeaderVersion> h = header_version(input);
    if (h && h->application_id == Store::kApplicationId && static_cast<int>(h->version) > current)
      throw InputError(fmt::format(
          "merge: input database '{}' has schema version {}, this attntune's is {}: merge with the newer attntune, "
          "which reads databases of version {} too (nothing merged)",
          input, h->version, current, current));
    try {
      stores.push_back(Store::open(input, Store::Mode::kReadOnly));
      // Read whole below, and often a copy brought from another host: checked whole first (a copy
      // made while its writer checkpointed holds pages of two moments, which only this finds).
      stores.back().check_integrity();
    } catch (const InputError& e) {
      throw InputError(fmt::format("merge: input {} (nothing merged)", e.what()));
    }
    if (progress && h && h->application_id == Store::kApplicationId && h->version >= 1 &&
        static_cast<int>(h->version) < current)
      progress(fmt::format("merge: '{}' has schema version {}: read through a migrated in-memory copy (the file is "
                           "not changed)",
                           input, h->version));
  }

  std::vector<MergeSource> sources;
  for (std::size_t i = 0; i < inputs.size(); ++i)
    sources.push_back({inputs[i], fs::path(inputs[i]).stem().string(), &stores[i]});
  // A merge that fails into a database it created (a full disk) leaves no half-made file behind.
  std::error_code ec;
  const bool existed = fs::exists(fs::symlink_status(out, ec));
  try {
    Store target = Store::open(out, Store::Mode::kCreate);
    return target.merge_from(sources, progress);
  } catch (...) {
    if (!existed)
      for (const char* suffix : {"", "-wal", "-shm", "-journal"}) fs::remove(out + suffix, ec);
    throw;
  }
}

}  // namespace attntune
