// The Store owns the SQLite database: devices, campaigns, candidates, the compile cache and every
// evaluation (db/schema.sql). Nothing else in the tuner sees SQLite.
//
// Opening never harms a file that is not ours: a file that is not SQLite, a SQLite database of
// another application, a corrupt or truncated file, or a database written by a newer attntune is
// refused (InputError, exit 2) after reading its 100-byte header, before SQLite touches it.
// Databases run in WAL mode, so readers (best, campaigns) and the one writer (tune) never block each
// other; writers wait up to the busy timeout for each other.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "space/problem.hpp"

namespace attntune {

namespace sqlite {
class Connection;
}

struct DeviceInfo {
  std::string name, arch, uuid;  // uuid "" when unknown
  int sm_count = 0;
  std::string driver_version;
};

// One search space of a campaign (a campaign searches one per template family).
struct CampaignSpace {
  std::string family, path, hash;
  std::string text;  // the YAML; "" for campaigns from before schema 3
};

struct CampaignSpec {
  std::string name;
  Problem problem;
  // For a campaign of one family: its space. For a campaign of several (set_spaces): family is the
  // families joined with '+' ("flash_fwd_mma+flash_fwd_wgmma"), space_hash the hash of the set,
  // space_path the paths joined with " + ", space_text "" (each space's text is in `spaces`).
  std::string space_path, space_hash, family, strategy;
  std::string space_text;  // the space's YAML, stored so the campaign can be replayed/exported elsewhere
  std::int64_t seed = 0;
  std::int64_t budget_evals = 0;  // 0: no limit
  double budget_seconds = 0;      // 0: no limit
  // Every space of the campaign, sorted by family. Read back from the store always; when writing,
  // empty means the one space the fields above describe.
  std::vector<CampaignSpace> spaces;

  bool mixed() const { return spaces.size() > 1; }
  // The space of `family`, nullptr if the campaign has none.
  const CampaignSpace* space_of(const std::string& family) const;
};

// Sets spec.spaces (sorted by family) and the campaign-level fields they imply (above). Throws
// InputError when two spaces share a family (the store keeps one space per family of a campaign).
void set_spaces(CampaignSpec& spec, std::vector<CampaignSpace> spaces);

struct CampaignRow {
  std::int64_t id = 0;
  CampaignSpec spec;
  std::string status, stop_reason, started_at, ended_at, gpu, arch;  // ended_at "" while running
  std::int64_t evaluations = 0, ok = 0;
  std::optional<double> best_us, best_tflops;  // the fastest ok evaluation, if any
};

struct BuildKey {
  std::string source_hash, arch, nvrtc_version, options;
};

struct BuildRecord {
  std::string status;  // ok | compile_error | compile_timeout
  std::string cubin;   // bytes; empty unless ok
  std::string log;
  int registers = 0, smem_static = 0, spill_stores = 0, spill_loads = 0, local_bytes = 0;
  double compile_ms = 0;
};

struct EvalRecord {
  // ok | compile_error | compile_timeout | resources | launch_error | crashed | timeout |
  // wrong_result | nan_or_unwritten. An ok record must carry median_us, tflops and max_abs_err.
  std::string status, error;
  std::optional<double> median_us, min_us, max_us, stdev_us, tflops, max_abs_err, err_bound;
  std::int64_t count = 0;
};

// Which part of a campaign made an evaluation: the search, or the re-timing of its top candidates
// at the end (which is not a second evaluation of the config).
enum class Phase { kSearch, kFinal };

struct EvaluationRow {
  std::int64_t seq = 0;  // 1, 2, ... within the campaign
  Config config;
  EvalRecord record;
  std::string evaluated_at;  // ISO-8601 UTC with milliseconds
  std::string family;        // the template of the candidate (campaigns of several families mix them)
};

// One place of a campaign's result (its top candidates re-timed interleaved at the end).
struct RankingEntry {
  std::int64_t candidate_id = 0;
  double median_us = 0, tflops = 0, max_abs_err = 0, spread_pct = 0;
  int rounds = 0;
  std::int64_t device_id = 0;  // what it was measured on (the arch it was built for); 0: put_ranking's
};
struct RankedRow {
  int rank = 0;
  Config config;
  RankingEntry entry;
  std::string family;  // the template of the candidate
};

struct BestRow {
  std::string campaign;
  Problem problem;
  std::string family;
  Config config;
  double median_us = 0, tflops = 0, max_abs_err = 0;
  std::string gpu, arch, evaluated_at;
  std::string source_hash;  // of the kernel as measured: a template edited since renders another
};

struct BestQuery {
  std::optional<Problem> problem;
  std::optional<std::string> campaign;
  int top = 1;
};

class Store {
 public:
  enum class Mode {
    kCreate,    // create if missing, migrate if older (tune)
    kExisting,  // must exist; migrate if older (writers other than tune)
    kReadOnly,  // must exist; queries only, never writes the file (best, campaigns, export, report)
  };
  static constexpr std::uint32_t kApplicationId = 0x4154544E;  // "ATTN" at header offset 68
  static constexpr std::chrono::milliseconds kDefaultBusyTimeout{5000};

  // Throws InputError for a missing database (kExisting, kReadOnly), a file that is not an attntune
  // database, a corrupt one, or one newer than this binary; the file is then left byte-for-byte
  // unchanged. A kReadOnly open of an older schema migrates a private in-memory copy.
  static Store open(const std::string& path, Mode mode);
  Store(Store&&) noexcept;
  Store& operator=(Store&&) noexcept;
  ~Store();

  const std::string& path() const noexcept { return path_; }
  int schema_version() const noexcept { return schema_version_; }
  static int current_schema_version();
  // How long a writer waits for another writer before failing with "locked by another writer".
  void set_busy_timeout(std::chrono::milliseconds timeout);

  std::int64_t upsert_device(const DeviceInfo& device);

  // Creates the campaign, or returns the existing one with that name, marked running again with the
  // spec's budgets, strategy, seed, space path and device (those of the latest run); throws
  // InputError if it exists with a different problem, space_hash or family (a resume must match).
  std::int64_t open_campaign(const CampaignSpec& spec, std::int64_t device_id);
  // What open_campaign checks, without writing: the id of the campaign of that name, nullopt if there
  // is none; InputError if it could not be resumed with `spec`.
  std::optional<std::int64_t> check_resume(const CampaignSpec& spec);
  // Takes the write lock and lets it go, writing nothing: SqliteError (exit 3) when another writer
  // holds it past the busy timeout. So a writer can refuse before its first line of progress.
  void check_writable();
  // status: completed | stopped | failed (or running). Sets ended_at.
  void finish_campaign(std::int64_t campaign_id, const std::string& status, const std::string& stop_reason);
  std::optional<std::int64_t> find_campaign(const std::string& name);

  std::int64_t upsert_candidate(const std::string& family, const Config& config, const std::string& source_hash);

  std::optional<BuildRecord> find_build(const BuildKey& key);
  void put_build(const BuildKey& key, const BuildRecord& build);  // insert or replace

  // One transaction; numbers the evaluation within its campaign. Returns its id. (Tests can hold the
  // transaction open with ATTNTUNE_TEST_COMMIT_DELAY_MS to kill a process inside it: store.cpp.)
  std::int64_t record_evaluation(std::int64_t campaign_id, std::int64_t candidate_id, std::int64_t device_id,
                                 const EvalRecord& eval, Phase phase = Phase::kSearch);
  // Everything the search evaluated in a campaign (any status), in evaluation order, so a resumed
  // campaign evaluates nothing twice. The final re-timing is not included.
  std::vector<EvaluationRow> campaign_evaluations(std::int64_t campaign_id);

  // Replaces the campaign's result with `entries`, best first (rank 1, 2, ...), in one transaction.
  void put_ranking(std::int64_t campaign_id, std::int64_t device_id, const std::vector<RankingEntry>& entries);
  std::vector<RankedRow> ranking(std::int64_t campaign_id);  // empty until a campaign has ranked

  // Ok configs only, fastest first; one row per distinct (campaign, template, config); at most
  // query.top rows (>= 1). A campaign that has ranked its top candidates (tune's re-timing at the
  // end) answers with that ranking first, in its order and with its medians; its other configs
  // follow, never ahead of its last ranked one. Others answer with each config's best median.
  std::vector<BestRow> best(const BestQuery& query);
  std::vector<CampaignRow> campaigns();  // evaluations/ok count the search; best is the ranking's first
  std::optional<CampaignRow> campaign_row(const std::string& name);
  // The distinct problems with at least one ok evaluation of `family` (in any campaign, mixed ones
  // included), in campaign order.
  std::vector<Problem> problems_with_results(const std::string& family);

 private:
  Store(std::string path, std::unique_ptr<sqlite::Connection> db, int schema_version);
  sqlite::Connection& db();

  std::string path_;
  std::unique_ptr<sqlite::Connection> db_;
  int schema_version_ = 0;
};

}  // namespace attntune
