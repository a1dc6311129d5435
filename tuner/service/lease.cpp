#include "service/lease.hpp"

#include <unistd.h>

#include <fstream>
#include <sstream>

namespace attntune::service {

namespace {

// Field 22 of /proc/PID/stat: the process's start time in clock ticks since boot; "" when there is
// no such process or it has ended (a zombie, state Z or X, not yet reaped by its parent). The
// command name (field 2) may hold spaces and parentheses, so fields are counted after its last ')'.
std::string start_time(std::int64_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  if (!in) return "";
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::size_t close = text.rfind(')');
  if (close == std::string::npos) return "";
  std::istringstream fields(text.substr(close + 1));
  std::string f;
  for (int i = 3; i <= 22 && fields >> f; ++i) {
    if (i == 3 && (f == "Z" || f == "X")) return "";
    if (i == 22) return f;
  }
  return "";
}

}  // namespace

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || !buf[0]) return "localhost";
  return buf;
}

LeaseOwner this_process(std::optional<int> gpu) {
  LeaseOwner o;
  o.host = host_name();
  o.pid = ::getpid();
  o.start = start_time(o.pid);
  o.gpu = gpu;
  return o;
}

bool process_alive(std::int64_t pid, const std::string& start) {
  const std::string now = start_time(pid);
  if (now.empty()) return false;           // no such process
  return start.empty() || now == start;    // a reused pid is another process
}

bool lease_is_stale(const LeaseRow& lease, double now) {
  if (lease.expires < now) return true;
  if (lease.host != host_name()) return false;
  const std::size_t colon = lease.owner.rfind(':');
  const std::string start = colon == std::string::npos ? "" : lease.owner.substr(colon + 1);
  return !process_alive(lease.pid, start);
}

Heartbeat::Heartbeat(std::function<bool()> renew, std::chrono::milliseconds period, std::function<void()> on_lost)
    : renew_(std::move(renew)), period_(period), on_lost_(std::move(on_lost)), thread_([this] { loop(); }) {}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Heartbeat::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, period_, [this] { return stop_; })) {
    lock.unlock();
    bool ours = true;
    try {
      ours = renew_();
    } catch (...) {
      // A busy or briefly unwritable database: the next beat tries again.
    }
    lock.lock();
    if (!ours) {
      lost_ = true;
      if (on_lost_) on_lost_();
      return;
    }
  }
}

}  // namespace attntune::service
