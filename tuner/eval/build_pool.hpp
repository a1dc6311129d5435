// The compile pool: NVRTC builds run ahead of the GPU, each in its own `attntune build-worker`
// process, up to `jobs` at a time. A compile that runs past `compile_timeout` (NVRTC has been seen
// to hang) is killed with its process and comes back as compile_timeout while the others carry on;
// a build worker that dies gives compile_error with the reason. Builds come from the build cache
// (core/record_stores.hpp; the CLI passes the store) when the rendered source, arch, NVRTC version
// and options match.
//
// Pipelined: submit() queues builds and returns at once; next() hands back each finished build in
// completion order, so the consumer can start on the GPU as soon as the first is done while the
// rest compile. submit() and next() belong to one thread (the consumer), which is also the only one
// that touches the cache. A background thread drives the build workers.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/record_stores.hpp"
#include "eval/compile.hpp"

namespace attntune {

struct BuildPoolOptions {
  std::vector<std::string> nvrtc_options;  // family_nvrtc_options(): passed to NVRTC, part of the cache key
  int jobs = 0;                            // concurrent compiles; 0: one per core
  std::chrono::milliseconds compile_timeout{std::chrono::minutes(2)};
  // The build worker to run: it reads a `build` frame on stdin and answers `built` (protocol.hpp).
  // Empty: this executable's `build-worker` subcommand.
  std::vector<std::string> worker_argv;
  BuildCache* store = nullptr;  // the build cache (the CLI's Store); may be null
};

class BuildPool {
 public:
  // EnvError when NVRTC is missing (its version is part of every cache key).
  explicit BuildPool(BuildPoolOptions options);
  ~BuildPool();  // kills the compiles still running
  BuildPool(const BuildPool&) = delete;
  BuildPool& operator=(const BuildPool&) = delete;

  // Queues a build; returns its ticket (BuildOutcome::ticket). A cache hit is ready at once.
  std::uint64_t submit(BuildJob job);
  // The next finished build, waiting for one; nullopt when nothing is outstanding. Fresh results
  // (ok and compile_error, never compile_timeout) are put into the cache here. Rethrows what stops
  // every build (EnvError when a build worker reports NVRTC missing, a build worker that cannot be
  // started).
  std::optional<BuildOutcome> next();
  std::size_t outstanding() const { return outstanding_; }  // submitted, not yet returned by next()
  // Seconds next() spent waiting for a compile to finish: time a consumer sat idle for builds.
  double waited_seconds() const { return waited_s_; }
  int jobs() const { return jobs_; }

 private:
  struct Queued {
    std::uint64_t ticket;
    BuildJob job;
  };
  void run();  // the background thread
  void wake();

  BuildPoolOptions options_;
  int jobs_ = 1;
  std::string nvrtc_version_;
  std::uint64_t next_ticket_ = 1;
  std::size_t outstanding_ = 0;
  double waited_s_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Queued> todo_;          // guarded by mu_
  std::deque<BuildOutcome> done_;    // guarded by mu_
  std::exception_ptr failure_;       // guarded by mu_
  bool stop_ = false;                // guarded by mu_
  int wake_r_ = -1, wake_w_ = -1;    // self-pipe: wakes the thread's poll()
  std::thread thread_;
};

}  // namespace attntune
