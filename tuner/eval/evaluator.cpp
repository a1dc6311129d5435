#include "eval/evaluator.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace attntune {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

EvalRecord failure(const std::string& status, const std::string& error) {
  EvalRecord r;
  r.status = status;
  r.error = error;
  return r;
}

// After an answer that ends the worker (crashed) it exits by itself; give it a moment.
constexpr std::chrono::milliseconds kExitGrace{5000};

}  // namespace

struct Evaluator::Worker {
  Child child;
  proto::FrameDecoder decoder;
  std::optional<proto::PrepareRequest> prepared;
};

Evaluator::Evaluator(EvaluatorOptions options) : options_(std::move(options)) {
  if (options_.worker_argv.empty())
    options_.worker_argv = {self_exe(), "worker", "--device", std::to_string(options_.device)};
}

Evaluator::~Evaluator() = default;  // ~Child kills and reaps the worker

pid_t Evaluator::worker_pid() const { return worker_ && worker_->child.running() ? worker_->child.pid() : -1; }

ExitStatus Evaluator::drop_worker(bool kill_now) {
  ExitStatus st;
  if (worker_) st = kill_now ? worker_->child.kill() : worker_->child.reap(kExitGrace);
  worker_.reset();
  return st;
}

const DeviceInfo& Evaluator::device() {
  ensure_worker();
  return *device_;
}

void Evaluator::ensure_worker() {
  if (worker_) return;
  auto w = std::make_unique<Worker>();
  w->child = Child::spawn(options_.worker_argv);
  ++workers_started_;
  const auto seconds = options_.startup_timeout.count() / 1000.0;
  proto::Frame hello;
  proto::ReadResult rr;
  try {
    rr = proto::read_frame_until(w->child.stdout_fd(), w->decoder, Clock::now() + options_.startup_timeout, hello);
  } catch (const proto::ProtocolError& e) {
    const auto st = w->child.kill();
    throw Error(ExitCode::kFailed, fmt::format("the GPU worker sent a malformed greeting ({}; {})", e.what(), st.str()));
  }
  if (rr == proto::ReadResult::kTimeout) {
    w->child.kill();
    throw Error(ExitCode::kFailed, fmt::format("the GPU worker did not start within {:g} s; it was killed", seconds));
  }
  if (rr == proto::ReadResult::kEof) {
    const auto st = w->child.reap(kExitGrace);
    throw Error(ExitCode::kFailed, fmt::format("the GPU worker {} before it was ready (its stderr says why)", st.str()));
  }
  if (hello.type() == "fatal") {
    w->child.reap(kExitGrace);
    proto::throw_if_fatal(hello, "GPU worker");
  }
  try {
    DeviceInfo d = proto::hello_device(hello);
    if (device_ && (d.name != device_->name || d.uuid != device_->uuid))
      throw Error(ExitCode::kFailed, fmt::format("the restarted GPU worker holds {} ({}), not {} ({})", d.name, d.uuid,
                                                 device_->name, device_->uuid));
    device_ = std::move(d);
  } catch (const proto::ProtocolError& e) {
    w->child.kill();
    throw Error(ExitCode::kFailed, fmt::format("the GPU worker sent a malformed greeting: {}", e.what()));
  }
  worker_ = std::move(w);
}

void Evaluator::ensure_prepared(const EvalRequest& r) {
  const proto::PrepareRequest want{r.problem, r.validation_seed, r.timing_seed};
  if (worker_->prepared && worker_->prepared->problem == want.problem &&
      worker_->prepared->validation_seed == want.validation_seed && worker_->prepared->timing_seed == want.timing_seed)
    return;
  const std::string what = fmt::format("preparing {} (inputs and reference outputs)", r.problem.str());
  try {
    proto::write_frame(worker_->child.stdin_fd(), proto::to_frame(want));
  } catch (const proto::ProtocolError& e) {
    const auto st = drop_worker(false);
    throw Error(ExitCode::kFailed, fmt::format("the GPU worker {} before {}", st.str(), what));
  }
  proto::Frame f;
  proto::ReadResult rr;
  try {
    rr = proto::read_frame_until(worker_->child.stdout_fd(), worker_->decoder, Clock::now() + options_.prepare_timeout, f);
  } catch (const proto::ProtocolError& e) {
    drop_worker(true);
    throw Error(ExitCode::kFailed, fmt::format("the GPU worker sent a malformed reply while {}: {}", what, e.what()));
  }
  if (rr == proto::ReadResult::kTimeout) {
    drop_worker(true);
    throw Error(ExitCode::kFailed,
                fmt::format("the GPU worker took longer than {:g} s {}; it was killed", options_.prepare_timeout.count() / 1000.0, what));
  }
  if (rr == proto::ReadResult::kEof) {
    const auto st = drop_worker(false);
    throw Error(ExitCode::kFailed, fmt::format("the GPU worker {} while {}", st.str(), what));
  }
  if (f.type() == "fatal") {
    drop_worker(false);
    proto::throw_if_fatal(f, "GPU worker, " + what);
  }
  try {
    reference_us_ = proto::prepared_reference_us(f);
  } catch (const proto::ProtocolError& e) {
    drop_worker(true);
    throw Error(ExitCode::kFailed, fmt::format("the GPU worker sent a malformed reply while {}: {}", what, e.what()));
  }
  worker_->prepared = want;
}

double Evaluator::deadline_s(const EvalRequest& r) {
  ensure_worker();
  ensure_prepared(r);
  return r.timing.max_seconds + std::max(options_.deadline_floor_s, options_.deadline_factor * reference_us_ * 1e-6);
}

EvalOutcome Evaluator::evaluate(const EvalRequest& r) {
  EvalOutcome out;
  // A worker can die while idle (not the candidate's doing): then a fresh one gets the candidate.
  for (int attempt = 0;; ++attempt) {
    out.deadline_s = deadline_s(r);
    try {
      proto::write_frame(worker_->child.stdin_fd(), proto::to_frame(r));
      break;
    } catch (const proto::ProtocolError&) {
      const auto st = drop_worker(false);
      if (attempt > 0) {
        out.record = failure("crashed", fmt::format("the GPU worker {} before it took the candidate, twice", st.str()));
        out.worker_replaced = true;
        return out;
      }
    }
  }
  const auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(out.deadline_s));
  proto::Frame f;
  proto::ReadResult rr;
  try {
    // In slices, so a cancel request (a second Ctrl-C) is seen while a candidate runs.
    for (;;) {
      const auto slice = std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
      rr = proto::read_frame_until(worker_->child.stdout_fd(), worker_->decoder, slice, f);
      if (rr != proto::ReadResult::kTimeout || Clock::now() >= deadline) break;
      if (options_.cancel && options_.cancel->load()) {
        drop_worker(true);
        out.wall_s = seconds_since(t0);
        out.abandoned = true;
        out.worker_replaced = true;
        out.record = failure("crashed", "abandoned: evaluation cancelled by the user");
        return out;
      }
    }
  } catch (const proto::ProtocolError& e) {
    const auto st = drop_worker(true);
    out.record = failure("crashed", fmt::format("the GPU worker sent a malformed reply ({}); it was killed ({})", e.what(), st.str()));
    out.wall_s = seconds_since(t0);
    out.worker_replaced = true;
    return out;
  }
  out.wall_s = seconds_since(t0);
  switch (rr) {
    case proto::ReadResult::kTimeout: {
      drop_worker(true);
      out.record = failure("timeout", fmt::format("no answer within {:.3g} s (timing cap {:g} s + max({:g} s floor, {:g} x "
                                                  "reference {:.4g} ms)); the GPU worker was killed",
                                                  out.deadline_s, r.timing.max_seconds, options_.deadline_floor_s,
                                                  options_.deadline_factor, reference_us_ / 1000));
      out.worker_replaced = true;
      return out;
    }
    case proto::ReadResult::kEof: {
      const auto st = drop_worker(false);
      out.record = failure("crashed", fmt::format("the GPU worker {} while running the candidate", st.str()));
      out.worker_replaced = true;
      return out;
    }
    case proto::ReadResult::kFrame:
      break;
  }
  if (f.type() == "fatal") {
    const auto st = drop_worker(false);
    out.record = failure("crashed", fmt::format("the GPU worker gave up on the candidate ({}): {}", st.str(),
                                                f.header.value("message", std::string())));
    out.worker_replaced = true;
    return out;
  }
  try {
    proto::EvalReply reply = proto::eval_reply(f);
    out.record = std::move(reply.record);
    out.registers = reply.registers;
    out.local_bytes = reply.local_bytes;
  } catch (const proto::ProtocolError& e) {
    const auto st = drop_worker(true);
    out.record = failure("crashed", fmt::format("the GPU worker sent a malformed reply ({}); it was killed ({})", e.what(), st.str()));
    out.worker_replaced = true;
    return out;
  }
  if (out.record.status == "crashed") {
    // The context is poisoned: the worker exits by itself after answering.
    const auto st = drop_worker(false);
    out.record.error += fmt::format(" (GPU worker {})", st.str());
    out.worker_replaced = true;
  }
  return out;
}

EvalRecord build_failure_record(const BuildRecord& build) {
  if (build.status == "ok") throw std::logic_error("build_failure_record: the build succeeded");
  return failure(build.status, build.log);
}

}  // namespace attntune
