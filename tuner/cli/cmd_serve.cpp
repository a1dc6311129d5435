// attntune serve: run the queue (docs/design/service.md). One worker process per listed GPU (a GPU
// listed twice gets two workers), each claiming campaigns under a lease (service/worker.hpp) until
// the queue is empty, or waiting for more with --follow. This process supervises: it forwards
// SIGTERM/Ctrl-C (the workers drain: the campaign in flight stops after its candidate and goes back
// to the queue), restarts a worker that crashed (its campaign is taken over and resumed; nothing
// evaluated is evaluated again), and does not restart one whose GPU failed (marked failed in the
// database, skipped). Exit: 0 all done; 1 some campaigns failed; 3 no GPU could work.
#include <signal.h>

#include <atomic>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "cli/job_options.hpp"
#include "core/error.hpp"
#include "core/process.hpp"
#include "cuda/driver.hpp"
#include "db/store.hpp"
#include "service/worker.hpp"

namespace attntune::cli::cmd_serve {
namespace {

constexpr const char* kSummary = "run the queued campaigns on every GPU (a process each) until the queue is empty";

std::atomic<bool> g_stop{false}, g_abandon{false};
std::atomic<int> g_signals{0};

extern "C" void on_signal(int) {
  const int n = ++g_signals;
  g_stop = true;
  if (n > 1) g_abandon = true;
}

void install_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

struct ServeArgs {
  std::string db_path, gpus = "all";
  bool follow = false, simulate = false, allow_network_fs = false;
  int simulate_delay_ms = 50, jobs = 0, log_interval = 30, worker = -1, max_restarts = 3;
  double lease_seconds = service::kDefaultLeaseSeconds, poll_seconds = 2, compile_timeout_s = 120,
         deadline_floor_s = 10;
};

std::vector<int> parse_gpus(const ServeArgs& a) {
  std::vector<int> out;
  if (a.gpus == "all") {
    if (a.simulate) return {0};
    const int n = cuda::device_count();  // EnvError without a driver or a GPU
    for (int i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  std::size_t at = 0;
  while (at <= a.gpus.size()) {
    const std::size_t comma = std::min(a.gpus.find(',', at), a.gpus.size());
    const std::string item = a.gpus.substr(at, comma - at);
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end || v < 0 || v > 1023)
      throw InputError(fmt::format("serve: --gpus '{}': '{}' is not a GPU ordinal (give all, or ordinals such as "
                                   "0,1; an ordinal twice runs two workers on it)",
                                   a.gpus, item));
    out.push_back(static_cast<int>(v));
    at = comma + 1;
  }
  if (out.size() > 64) throw InputError("serve: --gpus lists more than 64 workers");
  return out;
}

// The worker: `serve --worker N` (started by the supervisor below).
int run_worker_process(const ServeArgs& a) {
  install_handlers();
  // The supervisor checked the file (its pages, its filesystem) as it started.
  Store::Options open_options;
  open_options.check_integrity = false;
  Store store = Store::open(a.db_path, Store::Mode::kExisting, open_options);
  service::WorkerOptions o;
  o.gpu = a.worker;
  o.simulate = a.simulate;
  o.simulate_delay = std::chrono::milliseconds(a.simulate_delay_ms);
  o.lease_seconds = a.lease_seconds;
  o.follow = a.follow;
  o.poll = std::chrono::milliseconds(static_cast<long long>(a.poll_seconds * 1000));
  o.runner = {a.worker, a.jobs, a.compile_timeout_s, a.deadline_floor_s};
  o.log_interval = std::chrono::seconds(a.log_interval);
  // The heartbeat's connection: never a second Store::open in this process (store.hpp says why).
  service::WorkerStores stores{store, store, store, store, [&store]() -> std::unique_ptr<JobQueue> {
                                 return std::make_unique<Store>(store.another_connection());
                               }};
  return service::run_worker(stores, o, g_stop, g_abandon, std::cerr);
}

std::vector<std::string> worker_argv(const ServeArgs& a, int gpu) {
  std::vector<std::string> v = {"attntune", "serve", "--worker", std::to_string(gpu), "--db", a.db_path,
                                "--lease-seconds", fmt::format("{}", a.lease_seconds), "--poll-seconds",
                                fmt::format("{}", a.poll_seconds), "--log-interval", std::to_string(a.log_interval),
                                "--jobs", std::to_string(a.jobs), "--compile-timeout",
                                fmt::format("{}", a.compile_timeout_s), "--deadline-floor",
                                fmt::format("{}", a.deadline_floor_s)};
  if (a.follow) v.push_back("--follow");
  if (a.simulate) {
    v.push_back("--simulate");
    v.push_back("--simulate-delay-ms");
    v.push_back(std::to_string(a.simulate_delay_ms));
  }
  return v;
}

// A worker: this binary again, with our stdio and in our process group (a terminal's Ctrl-C
// reaches it as it reaches serve).
Child spawn(const std::vector<std::string>& args) {
  SpawnOptions o;
  o.in = o.out = o.err = SpawnOptions::Stdio::kInherit;
  o.own_group = false;
  o.program = "/proc/self/exe";
  try {
    return Child::spawn(args, o);
  } catch (const Error& e) {
    throw EnvError(fmt::format("serve: cannot start a worker: {}", e.what()));
  }
}

std::string describe_exit(const ExitStatus& st) {
  if (!st.signaled) return fmt::format("exit {}", st.value);
  return fmt::format("killed by signal {} ({})", st.value, strsignal(st.value));
}

int supervise(const ServeArgs& a) {
  const std::vector<int> gpus = parse_gpus(a);
  if (gpus.empty()) throw EnvError("serve: no GPU to serve on");
  {
    // The database must be ours, whole, on a local disk (and is migrated) before any worker starts.
    Store::Options open_options;
    open_options.refuse_network_fs = !a.allow_network_fs;
    Store store = Store::open(a.db_path, Store::Mode::kExisting, open_options);
  }
  install_handlers();
  std::cerr << fmt::format("serve: {} worker{} on {} GPU {} ({}), database {}{}\n", gpus.size(),
                           gpus.size() == 1 ? "" : "s", a.simulate ? "simulated" : "", fmt::join(gpus, ","),
                           a.follow ? "following the queue" : "until the queue is empty", a.db_path,
                           a.simulate ? "" : "");
  struct Slot {
    int gpu;
    int restarts = 0;
  };
  std::vector<std::pair<Child, Slot>> running;
  for (const int g : gpus) running.emplace_back(spawn(worker_argv(a, g)), Slot{g});
  int gpu_failures = 0;
  bool forwarded_stop = false, forwarded_abandon = false;
  while (!running.empty()) {
    if (g_stop && !forwarded_stop) {
      forwarded_stop = true;
      std::cerr << "serve: draining: the workers stop after the candidates in flight (again: abandon them)\n";
      for (const auto& [child, slot] : running) child.signal(SIGTERM);
    }
    if (g_abandon && !forwarded_abandon) {
      forwarded_abandon = true;
      for (const auto& [child, slot] : running) child.signal(SIGTERM);
    }
    std::vector<Slot> restart;
    bool ended = false;
    for (auto it = running.begin(); it != running.end();) {
      const std::optional<ExitStatus> status = it->first.poll();
      if (!status) {
        ++it;
        continue;
      }
      ended = true;
      Slot slot = it->second;
      it = running.erase(it);
      if (status->ok()) continue;
      if (!status->signaled && status->value == 3) {
        // Its GPU failed, or the database cannot be written (a full disk): it said which, above.
        ++gpu_failures;
        std::cerr << fmt::format("serve: the worker of GPU {} stopped ({}: its GPU or the database failed, as it "
                                 "said); not restarted\n",
                                 slot.gpu, describe_exit(*status));
        continue;
      }
      if (g_stop) continue;
      if (slot.restarts >= a.max_restarts) {
        std::cerr << fmt::format("serve: the worker of GPU {} ended ({}) {} times; not restarted\n", slot.gpu,
                                 describe_exit(*status), slot.restarts + 1);
        continue;
      }
      ++slot.restarts;
      std::cerr << fmt::format("serve: the worker of GPU {} ended ({}); restarting it (its campaign resumes where "
                               "it stopped)\n",
                               slot.gpu, describe_exit(*status));
      restart.push_back(slot);
    }
    for (const Slot& slot : restart) running.emplace_back(spawn(worker_argv(a, slot.gpu)), slot);
    if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }

  Store store = Store::open(a.db_path, Store::Mode::kReadOnly);
  std::map<std::string, int> counts;
  std::vector<std::string> failed;
  for (const QueueStatusRow& r : store.queue_status()) {
    ++counts[r.job.state];
    if (r.job.state == "failed") failed.push_back(fmt::format("  {}: {}", r.job.campaign, r.job.error));
  }
  std::cerr << fmt::format("serve: {} done, {} failed, {} queued, {} running{}\n", counts["done"], counts["failed"],
                           counts["queued"], counts["running"], g_stop ? " (stopped)" : "");
  for (const std::string& f : failed) std::cerr << f << "\n";
  if (gpu_failures == static_cast<int>(gpus.size()) && counts["queued"] > 0)
    throw EnvError(fmt::format("serve: every worker stopped (its GPU or the database failed); {} campaigns still "
                               "queued",
                               counts["queued"]));
  if (!failed.empty()) throw WorkError(fmt::format("serve: {} campaign{} failed", failed.size(), failed.size() == 1 ? "" : "s"));
  return 0;
}

int run_serve(const std::vector<std::string>& args) {
  ServeArgs a;
  po::options_description opts("options");
  opts.add_options()
      ("db", po::value(&a.db_path)->default_value(default_db_path()), "database ($ATTNTUNE_DB, else ./attntune.db)")
      ("gpus", po::value(&a.gpus), "all (default), or CUDA ordinals: 0,1 (an ordinal twice: two workers on it)")
      ("follow", po::bool_switch(&a.follow), "keep serving: wait for more campaigns when the queue is empty")
      ("lease-seconds", po::value(&a.lease_seconds),
       fmt::format("a worker's lease lasts this long without a heartbeat (default {:g}); a dead worker on this host "
                   "is seen at once", a.lease_seconds).c_str())
      ("poll-seconds", po::value(&a.poll_seconds), "with --follow, how often an idle worker looks (default 2)")
      ("max-restarts", po::value(&a.max_restarts), "restart a crashed worker at most this often (default 3)")
      ("jobs", po::value(&a.jobs), "concurrent NVRTC compiles per worker (default: one per core)");
  add_limit_options(opts, a.compile_timeout_s, a.deadline_floor_s);
  add_network_fs_option(opts, a.allow_network_fs);
  opts.add_options()
      ("log-interval", po::value(&a.log_interval), "seconds between progress lines (default 30)")
      ("simulate", po::bool_switch(&a.simulate), "simulated GPUs (a synthetic landscape, no GPU needed): testing and "
                                                 "rehearsing a plan")
      ("simulate-delay-ms", po::value(&a.simulate_delay_ms), "simulated time per candidate (default 50)")
      ("worker", po::value(&a.worker), "(internal) run as the worker of this GPU");
  po::variables_map vm;
  if (parse_args("serve", kSummary, opts, args, vm)) return 0;
  if (a.lease_seconds < 1 || a.lease_seconds > 3600)
    throw InputError("serve: --lease-seconds must lie between 1 and 3600");
  if (a.poll_seconds < 0.05 || a.poll_seconds > 3600) throw InputError("serve: --poll-seconds must lie between 0.05 and 3600");
  if (a.jobs < 0 || a.max_restarts < 0 || a.simulate_delay_ms < 0 || a.log_interval < 1)
    throw InputError("serve: --jobs, --max-restarts and --simulate-delay-ms must not be negative, --log-interval >= 1");
  check_limit_options(a.compile_timeout_s, a.deadline_floor_s, "serve");
  if (!a.simulate) {
    std::string why;
    if (!cuda::driver_available(&why)) throw EnvError(why);
  }
  return a.worker >= 0 ? run_worker_process(a) : supervise(a);
}

const bool registered = register_command({"serve", kSummary, false, run_serve});

}  // namespace
}  // namespace attntune::cli::cmd_serve
