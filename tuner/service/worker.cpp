#include "service/worker.hpp"

#include <unistd.h>

#include <map>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/text.hpp"
#include "cuda/driver.hpp"
#include "families/family.hpp"
#include "search/synthetic_runner.hpp"

namespace attntune::service {

namespace {

// An ostream that writes each finished line to `out` with a prefix, in one write, so the lines of
// several worker processes on one stderr never interleave within a line.
class PrefixedLines : public std::streambuf {
 public:
  PrefixedLines(std::ostream& out, std::string prefix) : out_(out), prefix_(std::move(prefix)) {}
  ~PrefixedLines() override {
    if (!line_.empty()) flush_line();
  }

 protected:
  int overflow(int c) override {
    if (c == traits_type::eof()) return 0;
    if (c == '\r') return c;  // no live redraws in a shared log
    if (c == '\n')
      flush_line();
    else
      line_.push_back(static_cast<char>(c));
    return c;
  }

 private:
  void flush_line() {
    out_ << (prefix_ + line_ + "\n") << std::flush;
    line_.clear();
  }
  std::ostream& out_;
  std::string prefix_, line_;
};

// Copies the process's stop/abandon flags into one campaign's flags while it runs, so that a lost
// lease can stop the campaign without stopping the worker.
class StopRelay {
 public:
  StopRelay(const std::atomic<bool>& stop, const std::atomic<bool>& abandon, std::atomic<bool>& job_stop,
            std::atomic<bool>& job_abandon)
      : thread_([&, this] {
          while (!done_) {
            if (stop) job_stop = true;
            if (abandon) job_abandon = true;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          }
        }) {}
  ~StopRelay() {
    done_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

DeviceInfo probe_device(const WorkerOptions& o) {
  if (o.simulate) return search::SyntheticRunner::device_info(o.gpu);
  return cuda::device_info(cuda::device_props(o.gpu));
}

}  // namespace

int run_worker(WorkerStores stores, const WorkerOptions& options, const std::atomic<bool>& stop,
               const std::atomic<bool>& abandon, std::ostream& log_out) {
  PrefixedLines lines(log_out, fmt::format("[gpu {}] ", options.gpu));
  std::ostream log(&lines);
  const LeaseOwner owner = this_process(options.gpu);

  DeviceInfo device;
  try {
    device = probe_device(options);
  } catch (const Error& e) {
    log << fmt::format("GPU {} cannot be used: {}", options.gpu, one_line(e.what())) << std::endl;
    stores.queue.put_gpu({owner.host, options.gpu, "", "", "failed", one_line(e.what()), ""});
    return 3;
  }
  stores.queue.put_gpu({owner.host, options.gpu, device.name, device.uuid, "ok", "", ""});
  log << fmt::format("worker {} on {} ({}) ready", owner.pid, device.name, device.arch) << std::endl;

  // A campaign that started on another GPU model stays with that model: its times never rank
  // against this one's.
  // Asked inside the claim's write transaction for every queued campaign ahead: each campaign's
  // spaces are parsed once per worker, not at every claim (a campaign's request never changes).
  std::map<std::string, bool> runnable;
  const auto accept = [&](const QueuedJob& job) {
    if (!job.ran_on.empty() && job.ran_on != device.name) return false;
    auto it = runnable.find(job.campaign);
    if (it == runnable.end())
      it = runnable.emplace(job.campaign, !runnable_spaces(job.request.spaces, job.problem, device.arch).empty()).first;
    return it->second;
  };
  // One GPU worker process for all the campaigns this worker runs (each GpuRunner takes it in turn
  // with its own cancel flag; a campaign's first evaluation prepares its problem), started at the
  // first and dropped while the queue is empty, so an idle `serve --follow` holds no GPU memory.
  std::unique_ptr<Evaluator> gpu_worker;
  int gpu_worker_starts = 0;
  const auto drop_gpu_worker = [&] {
    if (gpu_worker) gpu_worker_starts += gpu_worker->workers_started();
    gpu_worker.reset();
  };
  int done = 0;
  while (!stop) {
    std::optional<QueuedJob> job =
        stores.queue.claim_job(owner, unix_now(), options.lease_seconds, lease_is_stale, accept);
    if (!job) {
      if (!options.follow) break;
      drop_gpu_worker();
      if (!search::sleep_unless(&stop, options.poll)) break;
      continue;
    }
    log << fmt::format("campaign '{}': claimed ({}attempt {})", job->campaign,
                       job->error.empty() ? "" : job->error + "; ", job->attempts)
        << std::endl;

    std::atomic<bool> job_stop{false}, job_abandon{false}, lost{false};
    std::unique_ptr<JobQueue> beat_queue = stores.open_heartbeat();
    stores.queue.fence_writes(owner.id());
    std::string state = "failed", note;
    bool gpu_failed = false, stop_worker = false;
    {
      Heartbeat heartbeat(
          [&] { return beat_queue->renew_lease(job->campaign, owner.id(), unix_now() + options.lease_seconds); },
          std::chrono::milliseconds(static_cast<long long>(options.lease_seconds * 1000 / 3)), [&] {
            lost = true;
            job_stop = true;
            job_abandon = true;
          });
      StopRelay relay(stop, abandon, job_stop, job_abandon);
      try {
        JobRequest request = job->request;
        request.spaces = runnable_spaces(job->request.spaces, job->problem, device.arch);
        const JobSpaces spaces = parse_request_spaces(request);
        std::unique_ptr<search::Runner> runner;
        if (options.simulate) {
          runner = std::make_unique<search::SyntheticRunner>(spaces.sorted, job->problem, options.gpu,
                                                             options.simulate_delay, &job_abandon);
        } else {
          RunnerSettings settings = options.runner;
          settings.device = options.gpu;
          GpuRunnerOptions ropts = gpu_runner_options(request, settings, &job_abandon);
          if (!gpu_worker) gpu_worker = std::make_unique<Evaluator>(evaluator_options(ropts));
          ropts.evaluator = gpu_worker.get();
          runner = std::make_unique<GpuRunner>(spaces.sorted, job->problem, &stores.cache, ropts);
        }
        std::vector<std::string> sizes;
        const std::uint64_t size = count_valid(spaces, job->problem, *runner, &sizes);
        search::TuneOptions topts = tune_options(request, size);
        search::Progress progress(log, false, options.log_interval);
        if (request.warm > 0) {
          const WarmStartDevice at{device.sm_count, [&](const std::string& f) { return runner->arch_for(f); }};
          add_warm_starts(topts, stores.results, spaces, job->problem, request.warm, progress, nullptr, device.name, &at);
        }
        const CampaignSpec spec = campaign_spec(job->campaign, job->problem, request);
        progress.event(fmt::format("campaign '{}': {} on {}, {} valid configs ({})", job->campaign,
                                   job->problem.str(), device.name, size, fmt::join(sizes, " + ")));
        const search::TuneResult result = search::run_campaign(stores.log, *runner, spaces.sorted, spec, topts,
                                                               progress, {&job_stop, &job_abandon});
        if (result.status == "completed" && result.ok > 0) {
          state = "done";
          note = result.stop_reason;
          ++done;
        } else if (result.status == "completed") {
          state = "failed";
          note = fmt::format("no valid config found in {} evaluations", result.evaluations);
        } else {
          state = "queued";  // stopped: drained, resumable
          note = fmt::format("stopped on {} after {} evaluations: {}", owner.host, result.evaluations,
                             result.stop_reason);
        }
      } catch (const LeaseLost& e) {
        lost = true;
      } catch (const EnvError& e) {
        // The GPU or its driver failed: the campaign is not at fault.
        state = "queued";
        note = fmt::format("GPU {} on {} failed: {}", options.gpu, owner.host, one_line(e.what()));
        gpu_failed = true;
      } catch (const Error& e) {
        // The database cannot be written now (a full disk, another writer's lock past the busy
        // timeout: exit 3) or the campaign itself is at fault. Only the latter fails it: one the
        // disk stopped goes back to the queue, for the next serve to resume (docs/RELIABILITY.md,
        // part 10), and this worker stops, as every write of the next campaign would fail too.
        const bool environment = e.code() == ExitCode::kEnvironment;
        state = environment ? "queued" : "failed";
        note = environment ? fmt::format("stopped on {}: {}", owner.host, one_line(e.what())) : one_line(e.what());
        if (environment) stop_worker = true;
      } catch (const std::exception& e) {
        state = "failed";
        note = one_line(e.what());
      }
    }
    stores.queue.fence_writes("");
    if (lost) {
      log << fmt::format("campaign '{}': lease lost (taken over by another worker); left to it", job->campaign)
          << std::endl;
      continue;
    }
    if (!stores.queue.release_job(job->campaign, owner.id(), state, note))
      log << fmt::format("campaign '{}': lease lost before release; left to its new owner", job->campaign)
          << std::endl;
    else
      log << fmt::format("campaign '{}': {}{}", job->campaign, state, note.empty() ? "" : " (" + note + ")")
          << std::endl;
    if (gpu_failed) {
      stores.queue.put_gpu({owner.host, options.gpu, device.name, device.uuid, "failed", note, ""});
      return 3;
    }
    if (stop_worker) {
      log << fmt::format("worker {} ends: the database cannot be written ({})", owner.pid, note) << std::endl;
      return 3;
    }
  }
  drop_gpu_worker();
  log << fmt::format("worker {} ends: {} campaign{} done{}{}", owner.pid, done, done == 1 ? "" : "s",
                     stop ? " (stopped)" : ", queue empty",
                     options.simulate ? "" : fmt::format("; GPU worker processes started: {}", gpu_worker_starts))
      << std::endl;
  return 0;
}

}  // namespace attntune::service
