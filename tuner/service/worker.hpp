// A serve worker: one process per GPU (cmd_serve.cpp starts them). It claims the first queued
// campaign its GPU can run under a lease, runs it as `tune` would (service/job.hpp), with a
// heartbeat renewing the lease and every write fenced by it, and releases it: done when the
// campaign completed, back to the queue when it was stopped (SIGTERM drains), failed when it
// cannot run. A campaign whose lease was taken over (this worker hung past the lease) is left to
// its new owner. Then the next one, until the queue is empty (or, following, forever).
#pragma once
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <ostream>

#include "core/record_stores.hpp"
#include "service/job.hpp"
#include "service/lease.hpp"

namespace attntune::service {

struct WorkerOptions {
  int gpu = 0;                       // CUDA ordinal (or the simulated GPU's number)
  bool simulate = false;             // search::SyntheticRunner instead of the GPU
  std::chrono::milliseconds simulate_delay{50};
  double lease_seconds = kDefaultLeaseSeconds;
  bool follow = false;               // wait for more work when the queue is empty
  std::chrono::milliseconds poll{2000};
  RunnerSettings runner;             // runner.device is set to gpu
  std::chrono::seconds log_interval{30};
};

// The stores a worker writes: the queue, the campaign log and build cache (one database), and a
// second connection for the heartbeat thread.
struct WorkerStores {
  JobQueue& queue;
  CampaignLog& log;
  ResultReader& results;
  BuildCache& cache;
  std::function<std::unique_ptr<JobQueue>()> open_heartbeat;
};

// Exit codes: 0 the queue is empty or the worker was stopped; 3 its GPU failed (marked failed in
// the gpus table; its campaign went back to the queue). `stop` (first SIGTERM/Ctrl-C): claim
// nothing more, stop the campaign after the candidate in flight; `abandon` (second): drop that
// candidate too. Messages go to `log`, each line prefixed "[gpu N] ".
int run_worker(WorkerStores stores, const WorkerOptions& options, const std::atomic<bool>& stop,
               const std::atomic<bool>& abandon, std::ostream& log);

}  // namespace attntune::service
