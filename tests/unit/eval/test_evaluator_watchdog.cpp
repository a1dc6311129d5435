// The Evaluator's supervision with no GPU: fake workers that speak the protocol but hang, die,
// babble or report no GPU. Each candidate still comes back as a record (timeout or crashed, with
// the reason), within its deadline plus a small slack, and the next candidate is served by a
// fresh worker.
//
// The fake worker is this test executable itself: started with ATTNTUNE_FAKE_WORKER=MODE, it acts
// the worker from a static initializer and exits before gtest's main runs. For each eval request
// it does what the candidate's launch plan's name says: "hang" sleeps forever, "die" kills itself with
// SIGSEGV, "garbage" writes text that is not a frame, "bad_reply" answers a result with a made-up
// status, "poisoned" answers `crashed` and exits 4 as the real worker does after a sticky CUDA error;
// anything else is answered ok.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "eval/evaluator.hpp"
#include "eval/protocol.hpp"

namespace test_evaluator_watchdog {
using namespace attntune;

namespace {

int fake_worker(const std::string& mode) {
  using namespace attntune::proto;
  if (mode == "no_gpu") {
    write_frame(1, fatal_frame("no GPU: libcuda.so.1: cannot open shared object file", 3));
    return 3;
  }
  if (mode == "silent") {  // never says hello
    for (;;) ::pause();
  }
  if (mode == "die_at_start") return 5;
  write_frame(1, hello_frame(DeviceInfo{"Fake GPU", "sm_90", "GPU-fake", 132, "580.00"}));
  for (;;) {
    std::optional<Frame> f = read_frame(0);
    if (!f) return 0;
    if (f->type() == "prepare") {
      if (mode == "die_on_prepare") return 6;
      write_frame(1, prepared_frame(2000.0));  // a 2 ms reference
      continue;
    }
    const std::string k = f->header.at("launch").at("plan").get<std::string>();
    if (k == "hang") {
      for (;;) ::pause();
    } else if (k == "die") {
      ::signal(SIGSEGV, SIG_DFL);
      ::raise(SIGSEGV);
    } else if (k == "garbage") {
      const char text[] = "CUDA error: an illegal memory access was encountered\n";
      [[maybe_unused]] auto n = ::write(1, text, sizeof text - 1);
      for (;;) ::pause();
    }
    EvalReply r;
    if (k == "poisoned") {
      r.record.status = "crashed";
      r.record.error = "the kernel faulted: CUDA_ERROR_ILLEGAL_ADDRESS";
      write_frame(1, to_frame(r));
      return 4;
    }
    r.record.status = k == "bad_reply" ? "splendid" : "ok";
    r.record.median_us = 100;
    r.record.tflops = 42;
    r.record.max_abs_err = 1e-3;
    r.record.err_bound = 4e-3;
    r.record.count = 30;
    r.registers = getpid();  // lets the test tell workers apart
    write_frame(1, to_frame(r));
  }
}

const bool kIsFakeWorker = [] {
  const char* mode = std::getenv("ATTNTUNE_FAKE_WORKER");
  if (mode && *mode) {
    int code = 1;
    try {
      code = fake_worker(mode);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fake worker: %s\n", e.what());
    }
    std::_Exit(code);
  }
  return false;
}();

using Clock = std::chrono::steady_clock;

EvaluatorOptions fake(const std::string& mode) {
  EvaluatorOptions o;
  o.worker_argv = {"/usr/bin/env", "ATTNTUNE_FAKE_WORKER=" + mode, self_exe()};
  o.deadline_floor_s = 1.0;
  o.deadline_factor = 50;  // 50 x 2 ms = 0.1 s: the floor decides
  o.startup_timeout = std::chrono::seconds(20);
  o.prepare_timeout = std::chrono::seconds(20);
  return o;
}

EvalRequest candidate(const std::string& kernel_name) {
  EvalRequest r;
  r.launch.plan = kernel_name;  // the fake worker reads what to do from it
  r.cubin = std::string(100000, '\x7f');
  r.problem = Problem::parse("b=1,h=2,s=512,d=64,dtype=fp16,causal=0");
  r.timing.max_seconds = 0.25;
  return r;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Whether a process still exists (reaped children do not).
bool alive(pid_t pid) { return pid > 0 && ::kill(pid, 0) == 0; }

}  // namespace

TEST(EvaluatorWatchdog, HangingCandidateTimesOutAndAFreshWorkerTakesTheNext) {
  Evaluator ev(fake("normal"));
  EXPECT_EQ(ev.device().name, "Fake GPU");
  const EvalOutcome first = ev.evaluate(candidate("good"));
  ASSERT_EQ(first.record.status, "ok") << first.record.error;
  EXPECT_DOUBLE_EQ(ev.reference_us(), 2000.0);
  EXPECT_DOUBLE_EQ(first.deadline_s, 1.25);  // 0.25 s timing cap + max(1 s floor, 50 x 2 ms)
  const pid_t first_pid = ev.worker_pid();
  EXPECT_EQ(first.registers, first_pid);

  const auto t0 = Clock::now();
  const EvalOutcome hung = ev.evaluate(candidate("hang"));
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(hung.record.status, "timeout");
  EXPECT_TRUE(contains(hung.record.error, "no answer within 1.25 s")) << hung.record.error;
  EXPECT_TRUE(contains(hung.record.error, "killed")) << hung.record.error;
  EXPECT_TRUE(hung.worker_replaced);
  EXPECT_GE(took, 1.25);
  EXPECT_LT(took, 1.25 + 2.0);
  EXPECT_EQ(ev.worker_pid(), -1);
  EXPECT_FALSE(alive(first_pid)) << "the hung worker must be killed and reaped";

  const EvalOutcome next = ev.evaluate(candidate("good"));
  ASSERT_EQ(next.record.status, "ok") << next.record.error;
  EXPECT_NE(next.registers, first_pid) << "served by a fresh worker";
  EXPECT_EQ(ev.workers_started(), 2);
  EXPECT_FALSE(next.worker_replaced);
}

TEST(EvaluatorWatchdog, WorkerDyingMidRequestIsCrashedWithItsSignal) {
  Evaluator ev(fake("normal"));
  const EvalOutcome died = ev.evaluate(candidate("die"));
  EXPECT_EQ(died.record.status, "crashed");
  EXPECT_TRUE(contains(died.record.error, "killed by signal 11")) << died.record.error;
  EXPECT_TRUE(contains(died.record.error, "while running the candidate")) << died.record.error;
  EXPECT_LT(died.wall_s, 1.0);  // noticed at once, not at the deadline
  const EvalOutcome next = ev.evaluate(candidate("good"));
  EXPECT_EQ(next.record.status, "ok") << next.record.error;
  EXPECT_EQ(ev.workers_started(), 2);
}

TEST(EvaluatorWatchdog, GarbageFromTheWorkerIsCrashedWithAClearError) {
  Evaluator ev(fake("normal"));
  const EvalOutcome g = ev.evaluate(candidate("garbage"));
  EXPECT_EQ(g.record.status, "crashed");
  EXPECT_TRUE(contains(g.record.error, "malformed reply")) << g.record.error;
  EXPECT_TRUE(contains(g.record.error, "expected magic 'ATF1', got 'CUDA'")) << g.record.error;
  EXPECT_LT(g.wall_s, 1.0);
  const EvalOutcome bad = ev.evaluate(candidate("bad_reply"));
  EXPECT_EQ(bad.record.status, "crashed");
  EXPECT_TRUE(contains(bad.record.error, "unknown status 'splendid'")) << bad.record.error;
  const EvalOutcome next = ev.evaluate(candidate("good"));
  EXPECT_EQ(next.record.status, "ok") << next.record.error;
  EXPECT_EQ(ev.workers_started(), 3);
}

TEST(EvaluatorWatchdog, PoisonedContextIsCrashedAndTheWorkerReplaced) {
  Evaluator ev(fake("normal"));
  const EvalOutcome p = ev.evaluate(candidate("poisoned"));
  EXPECT_EQ(p.record.status, "crashed");
  EXPECT_TRUE(contains(p.record.error, "CUDA_ERROR_ILLEGAL_ADDRESS")) << p.record.error;
  EXPECT_TRUE(contains(p.record.error, "exited with status 4")) << p.record.error;
  EXPECT_TRUE(p.worker_replaced);
  EXPECT_EQ(ev.evaluate(candidate("good")).record.status, "ok");
  EXPECT_EQ(ev.workers_started(), 2);
}

TEST(EvaluatorWatchdog, WorkerDeadWhileIdleIsReplacedWithoutBlamingTheCandidate) {
  Evaluator ev(fake("normal"));
  ASSERT_EQ(ev.evaluate(candidate("good")).record.status, "ok");
  const pid_t pid = ev.worker_pid();
  ASSERT_GT(pid, 0);
  ::kill(pid, SIGKILL);  // e.g. the OOM killer, between candidates
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const EvalOutcome next = ev.evaluate(candidate("good"));
  EXPECT_EQ(next.record.status, "ok") << next.record.error;
  EXPECT_EQ(ev.workers_started(), 2);
}

TEST(EvaluatorWatchdog, NoGpuIsAnEnvironmentErrorFromTheHandshake) {
  Evaluator ev(fake("no_gpu"));
  try {
    ev.evaluate(candidate("good"));
    FAIL() << "no exception";
  } catch (const EnvError& e) {
    EXPECT_STREQ(e.what(), "no GPU: libcuda.so.1: cannot open shared object file");
    EXPECT_EQ(e.code(), ExitCode::kEnvironment);
  }
}

TEST(EvaluatorWatchdog, WorkersThatNeverStartAreErrorsNotHangs) {
  {
    EvaluatorOptions o = fake("silent");
    o.startup_timeout = std::chrono::milliseconds(500);
    Evaluator ev(o);
    const auto t0 = Clock::now();
    try {
      ev.device();
      FAIL() << "no exception";
    } catch (const EnvError&) {
      FAIL() << "a silent worker is not a missing GPU";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "did not start within 0.5 s")) << e.what();
    }
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 3.0);
  }
  {
    EvaluatorOptions o;
    o.worker_argv = {"/bin/sh", "-c", "sleep 100"};
    o.startup_timeout = std::chrono::milliseconds(300);
    Evaluator ev(o);
    EXPECT_THROW(ev.device(), Error);
    EXPECT_EQ(ev.worker_pid(), -1);
  }
  {
    Evaluator ev(fake("die_at_start"));
    try {
      ev.device();
      FAIL() << "no exception";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "exited with status 5 before it was ready")) << e.what();
    }
  }
  {
    Evaluator ev(fake("die_on_prepare"));
    try {
      ev.evaluate(candidate("good"));
      FAIL() << "no exception";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "exited with status 6 while preparing b=1,h=2")) << e.what();
    }
  }
}

TEST(EvaluatorWatchdog, BuildFailuresBecomeRecords) {
  BuildRecord b;
  b.status = "compile_timeout";
  b.log = "NVRTC did not finish within 120 s";
  const EvalRecord r = build_failure_record(b);
  EXPECT_EQ(r.status, "compile_timeout");
  EXPECT_EQ(r.error, b.log);
  b.status = "ok";
  EXPECT_THROW(build_failure_record(b), std::logic_error);
}
}  // namespace test_evaluator_watchdog
