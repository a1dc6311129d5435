// The plain values the tuner records and reads back: devices, campaigns, builds, evaluations,
// rankings and best results. The Store (db/store.hpp) keeps them in SQLite; everything else (search,
// eval, report, export) sees only these types and the narrow views of core/record_stores.hpp.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/problem.hpp"

namespace attntune {

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

// One run of a campaign (the first, then each resume): what it asked for and how it ended
// (campaign_runs, schema version 7). A resume with other budgets never overwrites the earlier ones.
struct CampaignRunRow {
  int run = 0;  // 1, 2, ... within the campaign
  std::string strategy;
  std::int64_t seed = 0, budget_evals = 0;
  double budget_seconds = 0;
  std::string gpu, arch, started_at, ended_at, status, stop_reason;  // ended_at "" while running
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
  std::optional<double> median_us = {}, min_us = {}, max_us = {}, stdev_us = {}, tflops = {}, max_abs_err = {},
                        err_bound = {};
  std::int64_t count = 0;
};

// Which part of a campaign made an evaluation: the search, or the re-timing of its top candidates
// at the end (which is not a second evaluation of the config).
enum class Phase { kSearch, kFinal };

// One re-timing of the final ranking, kept until the ranking is decided (CampaignLog::put_final).
struct FinalEvaluation {
  std::int64_t candidate_id = 0, device_id = 0;
  EvalRecord record;
};

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
  std::optional<Problem> problem;  // the problem exactly (a paged problem is not its dense shape)
  std::optional<std::string> campaign;
  int top = 1;
  // Only results measured on this GPU model (DeviceInfo::name, "NVIDIA H100 80GB HBM3"): times of
  // two models never rank together (an H200 is not a faster H100).
  std::optional<std::string> gpu = {};
};

}  // namespace attntune
