// Leases: a campaign has at most one writer. The Store takes and checks them in its transactions
// (Store::claim_job, acquire_lease, fence_writes); this is the process's side: who it is (host,
// pid and start time, so a reused pid is not mistaken for the owner), when another's lease is
// stale (expired, or its process on this host is gone), and the heartbeat thread that renews one.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "core/queue_records.hpp"

namespace attntune::service {

// A lease lives this long without a heartbeat; heartbeats come every third of it. A worker whose
// process died on this host is seen at once; one on another host (a shared database) or a hung
// one, once its lease expires.
inline constexpr double kDefaultLeaseSeconds = 30;

double unix_now();
std::string host_name();
// This process as a lease owner (gpu: the serve worker's GPU ordinal).
LeaseOwner this_process(std::optional<int> gpu = std::nullopt);
// Whether the process `pid` that started at `start` (/proc/PID/stat's start time) still runs here.
bool process_alive(std::int64_t pid, const std::string& start);
// Expired at `now`, or held by a process of this host that is gone.
bool lease_is_stale(const LeaseRow& lease, double now);

// Renews a lease every `period` on its own thread (and so its own database connection, inside
// `renew`) until destroyed. `renew` returns false when the lease was taken over: then `lost` is
// set, `on_lost` runs once, and the heartbeats stop. An exception from `renew` (a busy database)
// is retried at the next beat; the lease is only lost when the Store says so.
class Heartbeat {
 public:
  Heartbeat(std::function<bool()> renew, std::chrono::milliseconds period, std::function<void()> on_lost);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;
  bool lost() const { return lost_; }

 private:
  void loop();
  std::function<bool()> renew_;
  std::chrono::milliseconds period_;
  std::function<void()> on_lost_;
  std::atomic<bool> lost_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace attntune::service
