// The Store owns the SQLite database: devices, campaigns, candidates, the compile cache and every
// evaluation (db/schema.sql). Nothing else in the tuner sees SQLite, and only db/ and the CLI see
// the Store: the values it keeps are core/records.hpp's, and it implements the narrow views the
// other modules take (core/record_stores.hpp: BuildCache, CampaignLog, ResultReader).
//
// Opening never harms a file that is not ours: a file that is not SQLite, a SQLite database of
// another application, a corrupt or truncated file, or a database written by a newer attntune is
// refused (InputError, exit 2) after reading its 100-byte header, before SQLite touches it.
// Databases run in WAL mode, so readers (best, campaigns) and the one writer (tune) never block each
// other; writers wait up to the busy timeout for each other.
#pragma once
#include <chrono>
#include <functional>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "core/record_stores.hpp"
#include "core/records.hpp"
#include "core/problem.hpp"
#include "core/queue_records.hpp"
#include "db/merge.hpp"

namespace attntune {

namespace sqlite {
class Connection;
}

class Store final : public BuildCache, public CampaignLog, public ResultReader, public JobQueue {
 public:
  enum class Mode {
    kCreate,    // create if missing, migrate if older (tune)
    kExisting,  // must exist; migrate if older (writers other than tune)
    kReadOnly,  // must exist; queries only, never writes the file (best, campaigns, export, report)
  };
  static constexpr std::uint32_t kApplicationId = 0x4154544E;  // "ATTN" at header offset 68
  static constexpr std::chrono::milliseconds kDefaultBusyTimeout{5000};

  // What open() checks of an existing database before it hands it over (docs/RELIABILITY.md,
  // "Damaged databases"). Every open: the header (above), that every table and index of its schema
  // version is there, and every page as SQLite reads it (cell_size_check: a damaged page a command
  // reads is SQLITE_CORRUPT, exit 2, before anything is printed or written). A writer (kCreate,
  // kExisting) also runs, before its first write, SQLite's integrity check of the b-trees it uses,
  // so that it never adds results to a damaged file.
  struct Options {
    // The tables the writer reads and writes, checked with their indexes; empty: the whole file
    // (with the free list and that every page is used once). submit: the queue.
    std::vector<std::string> tables;
    // false: none (a serve worker: its supervisor checked the file as it started).
    bool check_integrity = true;
    // serve, submit and tune: refuse a database on a network filesystem (InputError naming the
    // filesystem and what to do instead: db/filesystem.hpp); --allow-network-fs turns this off.
    bool refuse_network_fs = false;
  };

  // Throws InputError for a missing database (kExisting, kReadOnly), a file that is not an attntune
  // database, a corrupt or damaged one, or one newer than this binary; the file is then left
  // byte-for-byte unchanged. A kReadOnly open of an older schema migrates a private in-memory copy.
  static Store open(const std::string& path, Mode mode) { return open(path, mode, Options{}); }
  static Store open(const std::string& path, Mode mode, const Options& options);
  // A second connection to the same database for another thread of this process (a heartbeat),
  // opened by SQLite alone. Never Store::open the file again while a connection of this process is
  // open: open() reads the header through its own file descriptor, and closing any descriptor of a
  // file drops every POSIX lock this process holds on it, SQLite's included; another process then
  // takes itself for the last connection, checkpoints and deletes the -wal under us, and our later
  // commits go to the deleted file (seen: a worker's last release lost while `status` ran).
  Store another_connection() const;
  // SQLite's integrity check of `tables` and their indexes (empty: the whole file), CHECK
  // constraints aside: InputError naming what is damaged. open() runs it for writers (Options);
  // merge runs it on its inputs, which it reads whole.
  void check_integrity(const std::vector<std::string>& tables = {});
  Store(Store&&) noexcept;
  Store& operator=(Store&&) noexcept;
  ~Store();

  const std::string& path() const noexcept override { return path_; }
  int schema_version() const noexcept { return schema_version_; }
  static int current_schema_version();
  // How long a writer waits for another writer before failing with "locked by another writer".
  void set_busy_timeout(std::chrono::milliseconds timeout);

  std::int64_t upsert_device(const DeviceInfo& device) override;

  // Creates the campaign, or returns the existing one with that name, marked running again with the
  // spec's budgets, strategy, seed, space path and device (those of the latest run); throws
  // InputError if it exists with a different problem, space_hash or family (a resume must match).
  std::int64_t open_campaign(const CampaignSpec& spec, std::int64_t device_id) override;
  // What open_campaign checks, without writing: the id of the campaign of that name, nullopt if there
  // is none; InputError if it could not be resumed with `spec`.
  std::optional<std::int64_t> check_resume(const CampaignSpec& spec);
  // Takes the write lock and lets it go, writing nothing: SqliteError (exit 3) when another writer
  // holds it past the busy timeout. So a writer can refuse before its first line of progress.
  void check_writable();
  // status: completed | stopped | failed (or running). Sets ended_at.
  void finish_campaign(std::int64_t campaign_id, const std::string& status, const std::string& stop_reason) override;
  std::optional<std::int64_t> find_campaign(const std::string& name) override;

  std::int64_t upsert_candidate(const std::string& family, const Config& config,
                                const std::string& source_hash) override;

  std::optional<BuildRecord> find_build(const BuildKey& key) override;
  void put_build(const BuildKey& key, const BuildRecord& build) override;  // insert or replace

  // One transaction; numbers the evaluation within its campaign. Returns its id. (Tests can hold the
  // transaction open with ATTNTUNE_TEST_COMMIT_DELAY_MS to kill a process inside it: store.cpp.)
  std::int64_t record_evaluation(std::int64_t campaign_id, std::int64_t candidate_id, std::int64_t device_id,
                                 const EvalRecord& eval, Phase phase = Phase::kSearch) override;
  // Everything the search evaluated in a campaign (any status), in evaluation order, so a resumed
  // campaign evaluates nothing twice. The final re-timing is not included.
  std::vector<EvaluationRow> campaign_evaluations(std::int64_t campaign_id) override;

  // Replaces the campaign's result with `entries`, best first (rank 1, 2, ...), in one transaction.
  void put_ranking(std::int64_t campaign_id, std::int64_t device_id,
                   const std::vector<RankingEntry>& entries) override;
  std::vector<RankedRow> ranking(std::int64_t campaign_id) override;  // empty until a campaign has ranked
  // The final re-timing's rows and the ranking, in one transaction (CampaignLog::put_final).
  void put_final(std::int64_t campaign_id, std::int64_t device_id, const std::vector<FinalEvaluation>& finals,
                 const std::vector<RankingEntry>& entries) override;
  // Each run of a campaign (campaign_runs, since version 7): what it asked for, when, how it ended.
  std::vector<CampaignRunRow> campaign_runs(std::int64_t campaign_id);

  // Ok configs only, fastest first; one row per distinct (campaign, template, config); at most
  // query.top rows (>= 1). A campaign that has ranked its top candidates (tune's re-timing at the
  // end) answers with that ranking first, in its order and with its medians; its other configs
  // follow, never ahead of its last ranked one. Others answer with each config's best median.
  // query.problem matches campaigns of exactly that problem: a paged one (page=N) is never its
  // dense shape, nor one of another page size.
  std::vector<BestRow> best(const BestQuery& query) override;
  std::vector<std::string> result_gpus(const BestQuery& query) override;
  // evaluations/ok count the search; best is the ranking's first
  std::vector<CampaignRow> campaigns() override;
  std::optional<CampaignRow> campaign_row(const std::string& name) override;
  // The distinct problems with at least one ok evaluation of `family` (in any campaign, mixed ones
  // included), in campaign order.
  std::vector<Problem> problems_with_results(const std::string& family) override;

  // ---- The tuning service (store_queue.cpp; db/migrations/006_queue.sql) ----
  enum class Submitted { kQueued, kAlreadyDone, kExisting };
  // Queues `job` unless the queue already holds its campaign (kExisting, with its state); a
  // campaign that `tune` already completed is entered as done (kAlreadyDone).
  std::pair<Submitted, std::string> submit_job(const QueuedJob& job);
  // In one write transaction: drops stale leases (their running jobs go back to the queue), then
  // leases the first queued job that `accept` takes (all when empty) to `owner` until now +
  // lease_seconds and marks it running. nullopt when there is none.
  std::optional<QueuedJob> claim_job(const LeaseOwner& owner, double now, double lease_seconds,
                                     const StaleLease& is_stale, const JobFilter& accept = {}) override;
  // The heartbeat: false when `owner` no longer holds the lease (it was taken over).
  bool renew_lease(const std::string& campaign, const std::string& owner, double expires) override;
  // Ends `owner`'s lease and sets the job's state (queued | done | failed) and note; false, and
  // nothing changed, when the lease was no longer `owner`'s.
  bool release_job(const std::string& campaign, const std::string& owner, const std::string& state,
                   const std::string& error) override;
  // `tune`'s lease of one campaign (queued or not): EnvError naming the holder when another live
  // process holds it. release_lease lets it go (a queued campaign goes back to queued, or done).
  void acquire_lease(const std::string& campaign, const LeaseOwner& owner, double now, double lease_seconds,
                     const StaleLease& is_stale);
  void release_lease(const std::string& campaign, const std::string& owner);
  // From now on every write of a campaign's results (open_campaign, record_evaluation,
  // put_ranking, finish_campaign) checks, in its own transaction, that `owner` holds the campaign's
  // lease, and throws LeaseLost having written nothing when it does not. "" turns the fence off.
  void fence_writes(std::string owner) override;
  std::vector<QueueStatusRow> queue_status();
  std::vector<LeaseRow> leases();
  void put_gpu(const GpuRow& gpu) override;
  std::vector<GpuRow> gpus();

  // ---- Merging databases (store_merge.cpp; db/merge.hpp, docs/design/merge.md) ----
  // Merges each input (opened kReadOnly; each read in one read transaction) into this database, in
  // order, all in one write transaction: when it throws, nothing was written. One MergeCounts per
  // input. merge_databases (db/merge.hpp) checks and opens the files, then calls this.
  std::vector<MergeCounts> merge_from(const std::vector<MergeSource>& inputs, const MergeProgress& progress = {});

 private:
  Store(std::string path, std::unique_ptr<sqlite::Connection> db, int schema_version);
  sqlite::Connection& db();

  std::string path_;
  std::unique_ptr<sqlite::Connection> db_;
  int schema_version_ = 0;
  std::string fence_owner_;  // fence_writes
  void reap_stale_leases(double now, const StaleLease& is_stale);
  void check_fence_name(const std::string& campaign);
  void check_fence_id(std::int64_t campaign_id);
};

}  // namespace attntune
