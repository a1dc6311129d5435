#include "eval/compile.hpp"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "cuda/nvrtc.hpp"

namespace attntune {

BuildKey build_key(const RenderedKernel& kernel, const std::string& arch, const std::vector<std::string>& options) {
  return BuildKey{kernel.source_hash, arch, cuda::nvrtc_version(), fmt::format("{}", fmt::join(options, " "))};
}

BuildRecord build_source(const std::string& source, const std::string& program_name, const std::string& arch,
                         const std::vector<std::string>& options) {
  cuda::CompileOptions opts;
  opts.arch = arch;
  opts.extra = options;
  const cuda::CompileOutput out = cuda::nvrtc_compile(source, program_name, opts);
  BuildRecord r;
  r.status = out.ok ? "ok" : "compile_error";
  r.cubin = out.cubin;
  r.log = out.log;
  r.registers = out.registers;
  r.smem_static = out.smem_static;
  r.spill_stores = out.spill_stores;
  r.spill_loads = out.spill_loads;
  r.local_bytes = out.local_bytes;
  r.compile_ms = out.compile_ms;
  return r;
}

BuildRecord build_kernel(const RenderedKernel& kernel, const std::string& arch,
                         const std::vector<std::string>& options) {
  return build_source(kernel.source, kernel.kernel_name + ".cu", arch, options);
}

void build_all(std::vector<BuildJob> jobs, const std::vector<std::string>& options, int threads, Store* store,
               const std::function<void(const BuildOutcome&)>& done) {
  cuda::nvrtc();  // EnvError now, on this thread, if NVRTC is missing
  std::deque<BuildJob> todo;
  for (auto& job : jobs) {
    if (store) {
      if (auto hit = store->find_build(build_key(job.kernel, job.arch, options))) {
        done(BuildOutcome{std::move(job), std::move(*hit), true});
        continue;
      }
    }
    todo.push_back(std::move(job));
  }
  if (todo.empty()) return;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<BuildOutcome> results;
  std::exception_ptr failure;
  std::size_t remaining = todo.size();
  auto worker = [&] {
    for (;;) {
      BuildJob job;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (todo.empty() || failure) return;
        job = std::move(todo.front());
        todo.pop_front();
      }
      try {
        BuildRecord rec = build_kernel(job.kernel, job.arch, options);
        std::lock_guard<std::mutex> lock(mu);
        results.push_back(BuildOutcome{std::move(job), std::move(rec), false});
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!failure) failure = std::current_exception();
      }
      cv.notify_one();
    }
  };
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(todo.size())));
  std::vector<std::thread> pool;
  for (int i = 0; i < n; ++i) pool.emplace_back(worker);
  struct Joiner {
    std::vector<std::thread>& pool;
    ~Joiner() {
      for (auto& t : pool) t.join();
    }
  } joiner{pool};

  while (remaining > 0) {
    BuildOutcome outcome;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return !results.empty() || failure; });
      if (failure && results.empty()) {
        todo.clear();
        break;
      }
      outcome = std::move(results.front());
      results.pop_front();
    }
    --remaining;
    if (store) store->put_build(build_key(outcome.job.kernel, outcome.job.arch, options), outcome.build);
    done(outcome);
  }
  if (failure) {
    {
      std::lock_guard<std::mutex> lock(mu);
      todo.clear();
    }
    for (auto& t : pool) t.join();
    pool.clear();
    std::rethrow_exception(failure);
  }
}

}  // namespace attntune
