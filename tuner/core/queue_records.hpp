// The tuning service's records (db/migrations/006_queue.sql): a queued campaign, who holds a
// campaign's lease, the serving hosts' GPUs. The Store keeps them; `submit`, `serve` and `status`
// (tuner/service/) read and write them through it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/problem.hpp"
#include "core/records.hpp"

namespace attntune {

// Everything a worker needs to run a queued campaign as `tune` would: its spaces (with their text,
// so the worker needs no files) and the tune options. Stored as JSON in queue.request.
struct JobRequest {
  std::vector<CampaignSpace> spaces;  // sorted by family
  std::string strategy = "evo";
  std::uint64_t seed = 1;
  std::int64_t budget_evals = 0;  // 0: none
  double budget_seconds = 0;      // per run; 0: none
  std::int64_t patience = -1;     // -1: tune's default rule
  double min_gain_pct = 0.5;
  int final_top = 8, final_rounds = 6;
  int final_screen = 24;          // the screening before the rounds (search::TuneOptions::final_screen)
  int warm = 8;                   // warm-start configs from the nearest tuned problem
  double max_seconds = 1.0, min_seconds = 0, final_min_seconds = 1.0;
};
std::string job_request_json(const JobRequest& r);
JobRequest job_request_from_json(const std::string& text);  // InputError on a malformed request

struct QueuedJob {
  std::int64_t id = 0;
  std::string campaign, plan, regime;
  Problem problem;
  JobRequest request;
  std::string state;  // queued | running | done | failed
  std::int64_t attempts = 0;
  std::string error, worker, submitted_at, started_at, ended_at;
  std::string ran_on;  // the GPU model its campaign ran on so far, "" if it has not started
};

// A process that may hold leases: "host:pid:start" names it across pid reuse.
struct LeaseOwner {
  std::string host;
  std::int64_t pid = 0;
  std::string start;               // the process's start time (/proc/PID/stat), "" if unknown
  std::optional<int> gpu;          // the worker's GPU ordinal; none for `tune`
  std::string id() const { return host + ":" + std::to_string(pid) + ":" + start; }
};

struct LeaseRow {
  std::string campaign, owner, host;
  std::int64_t pid = 0;
  std::optional<int> gpu;
  std::string acquired_at, heartbeat_at;
  double expires = 0;  // unix seconds
};

struct GpuRow {
  std::string host;
  int ordinal = 0;
  std::string name, uuid, state, error, updated_at;  // state: ok | failed
};

// A queue row for `status`, with its campaign's progress where it has started.
struct QueueStatusRow {
  QueuedJob job;
  std::optional<LeaseRow> lease;
  std::int64_t evaluations = 0, ok = 0;
  std::optional<double> best_us;
  std::string gpu_name;  // the device of the campaign's latest run
};

}  // namespace attntune

namespace attntune {
// A write of a campaign's results by a process that no longer holds its lease (it expired and
// another worker took the campaign over): nothing was written. Exit 1.
struct LeaseLost : WorkError {
  using WorkError::WorkError;
};
}  // namespace attntune
