// The Evaluator: runs candidates on one GPU in an isolated worker process and supervises it.
//
// The worker (`attntune worker --device N`, worker.hpp) owns the CUDA context; this side owns the
// worker. Every candidate comes back as an EvalRecord, whatever it did to the worker:
//   - the worker answers: its status (ok, resources, launch_error, wrong_result, nan_or_unwritten,
//     or crashed when the kernel poisoned the context; that worker then exits and is replaced);
//   - no answer by the deadline: the worker's process group is SIGKILLed and reaped -> timeout;
//   - the worker dies (EOF, a signal, an exit) -> crashed, with the exit status or signal;
//   - the worker answers something that is not a frame or not a result -> crashed, with the error.
// The next candidate gets a fresh worker. Exceptions are for what stops all evaluation: no GPU
// (EnvError, exit 3, from the worker's `fatal` handshake), a bad device ordinal (InputError), a
// worker that does not start or cannot prepare a problem (Error, exit 1).
//
// Deadline per candidate: timing.max_seconds + max(deadline_floor_s, deadline_factor x the
// reference kernel's time for the problem), which the worker measures once per problem when it
// prepares it (a candidate slower than the naive reference by that factor is not worth waiting for).
#pragma once
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/records.hpp"
#include "eval/protocol.hpp"

namespace attntune {

using proto::EvalRequest;
using proto::TimingLimits;

struct EvaluatorOptions {
  int device = 0;
  // The worker to run; empty: this executable's `worker --device N`. Tests put fakes here.
  std::vector<std::string> worker_argv;
  // From start to `hello`: driver initialisation and the reference kernels' NVRTC compile.
  std::chrono::milliseconds startup_timeout{std::chrono::minutes(2)};
  // A new problem: inputs, both references and the timing inputs.
  std::chrono::milliseconds prepare_timeout{std::chrono::minutes(5)};
  double deadline_floor_s = 10;
  double deadline_factor = 50;
  // When set and true, evaluate() abandons the running candidate: kills the worker and returns
  // with `abandoned` (the record then means nothing and must not be stored).
  const std::atomic<bool>* cancel = nullptr;
};

struct EvalOutcome {
  EvalRecord record;
  int registers = 0, local_bytes = 0;  // as loaded by the driver (0 when it did not load)
  double wall_s = 0;                   // request to answer, as the parent saw it
  double deadline_s = 0;               // what the watchdog allowed this candidate
  bool worker_replaced = false;        // this candidate ended its worker (timeout, crash)
  bool abandoned = false;              // cancelled while it ran (EvaluatorOptions::cancel)
};

class Evaluator {
 public:
  explicit Evaluator(EvaluatorOptions options = {});
  ~Evaluator();  // kills the worker
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  // The GPU the worker holds; starts the worker if none runs. Throws as described above.
  const DeviceInfo& device();
  // Validates and times one candidate. Throws only for what stops all evaluation (see above).
  EvalOutcome evaluate(const EvalRequest& request);

  double deadline_s(const EvalRequest& request);  // prepares the problem to know its reference time
  double reference_us() const { return reference_us_; }  // of the problem prepared last; 0 before
  int workers_started() const { return workers_started_; }
  // The cancel flag (EvaluatorOptions::cancel) of the campaign now using this evaluator: one kept
  // across campaigns (GpuRunnerOptions::evaluator) takes each campaign's in turn; null for none.
  void set_cancel(const std::atomic<bool>* cancel) { options_.cancel = cancel; }
  pid_t worker_pid() const;  // -1 when no worker runs

 private:
  struct Worker;
  void ensure_worker();
  void ensure_prepared(const EvalRequest& r);
  // Kills the worker (if any) and forgets it; returns how it ended.
  ExitStatus drop_worker(bool kill_now);

  EvaluatorOptions options_;
  std::unique_ptr<Worker> worker_;
  std::optional<DeviceInfo> device_;
  double reference_us_ = 0;
  int workers_started_ = 0;
};

// A build that failed as an evaluation record: its status (compile_error | compile_timeout) and log.
EvalRecord build_failure_record(const BuildRecord& build);

}  // namespace attntune
