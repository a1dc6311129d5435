#include "eval/build_pool.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "cuda/nvrtc.hpp"
#include "eval/protocol.hpp"

namespace attntune {

namespace {

using Clock = std::chrono::steady_clock;

// One compile in flight: its build worker, the request still to be written, the reply so far.
struct Running {
  std::uint64_t ticket = 0;
  BuildJob job;
  Child child;
  std::string request;  // encoded frame
  std::size_t written = 0;
  proto::FrameDecoder reply;
  Clock::time_point started, deadline;
};

BuildRecord failed_build(const std::string& status, const std::string& log, const Running& r) {
  BuildRecord b;
  b.status = status;
  b.log = log;
  b.compile_ms = std::chrono::duration<double, std::milli>(Clock::now() - r.started).count();
  return b;
}

std::string seconds_str(std::chrono::milliseconds ms) { return fmt::format("{:g} s", ms.count() / 1000.0); }

}  // namespace

BuildPool::BuildPool(BuildPoolOptions options) : options_(std::move(options)) {
  nvrtc_version_ = cuda::nvrtc_version();  // EnvError here, on the caller's thread, without NVRTC
  jobs_ = options_.jobs > 0 ? options_.jobs : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (options_.worker_argv.empty()) options_.worker_argv = {self_exe(), "build-worker"};
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
    throw Error(ExitCode::kFailed, fmt::format("pipe2 failed: {}", std::strerror(errno)));
  wake_r_ = fds[0];
  wake_w_ = fds[1];
  thread_ = std::thread([this] { run(); });
}

BuildPool::~BuildPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake();
  thread_.join();
  ::close(wake_r_);
  ::close(wake_w_);
}

void BuildPool::wake() {
  const char c = 1;
  // Non-blocking: a full pipe already holds a wake-up.
  [[maybe_unused]] ssize_t n = ::write(wake_w_, &c, 1);
}

std::uint64_t BuildPool::submit(BuildJob job) {
  const std::uint64_t ticket = next_ticket_++;
  ++outstanding_;
  if (options_.store) {
    auto hit = options_.store->find_build(build_key(job.kernel, job.arch, options_.nvrtc_options));
    // A recorded timeout may have been a loaded machine: compile again.
    if (hit && hit->status != "compile_timeout") {
      std::lock_guard<std::mutex> lock(mu_);
      done_.push_back(BuildOutcome{std::move(job), std::move(*hit), true, ticket});
      cv_.notify_one();
      return ticket;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    todo_.push_back({ticket, std::move(job)});
  }
  wake();
  return ticket;
}

std::optional<BuildOutcome> BuildPool::next() {
  if (outstanding_ == 0) return std::nullopt;
  BuildOutcome out;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (done_.empty() && !failure_) {
      const auto t0 = Clock::now();
      cv_.wait(lock, [&] { return !done_.empty() || failure_; });
      waited_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
    }
    if (failure_) std::rethrow_exception(failure_);
    out = std::move(done_.front());
    done_.pop_front();
  }
  --outstanding_;
  if (options_.store && !out.cache_hit && out.build.status != "compile_timeout")
    options_.store->put_build(build_key(out.job.kernel, out.job.arch, options_.nvrtc_options), out.build);
  return out;
}

void BuildPool::run() {
  // Writing to a build worker that died raises SIGPIPE; held off this thread, the write fails with
  // EPIPE instead (the signal stays pending here, harmlessly, and the workers start unmasked).
  sigset_t pipe_only;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_only, nullptr);

  std::vector<Running> running;
  auto finish = [&](std::size_t i, BuildRecord rec) {
    Running& r = running[i];
    BuildOutcome o{std::move(r.job), std::move(rec), false, r.ticket};
    running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));  // kills and reaps if still running
    std::lock_guard<std::mutex> lock(mu_);
    done_.push_back(std::move(o));
    cv_.notify_one();
  };
  auto fail_all = [&](std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_) failure_ = e;
    cv_.notify_all();
  };

  std::string chunk(1 << 16, '\0');
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_ || failure_) break;
      while (static_cast<int>(running.size()) < jobs_ && !todo_.empty()) {
        Queued q = std::move(todo_.front());
        todo_.pop_front();
        Running r;
        r.ticket = q.ticket;
        r.job = std::move(q.job);
        const proto::BuildRequest req{r.job.kernel.kernel_name + ".cu", r.job.kernel.source, r.job.arch,
                                      options_.nvrtc_options};
        try {
          r.request = proto::encode(proto::to_frame(req));
          r.child = Child::spawn(options_.worker_argv);
        } catch (...) {
          if (!failure_) failure_ = std::current_exception();
          cv_.notify_all();
          break;
        }
        ::fcntl(r.child.stdin_fd(), F_SETFL, ::fcntl(r.child.stdin_fd(), F_GETFL) | O_NONBLOCK);
        r.started = Clock::now();
        r.deadline = r.started + options_.compile_timeout;
        running.push_back(std::move(r));
      }
      if (failure_) break;
    }

    std::vector<pollfd> fds{{wake_r_, POLLIN, 0}};
    for (auto& r : running) {
      fds.push_back({r.child.stdout_fd(), POLLIN, 0});
      fds.push_back({r.child.stdin_fd(), static_cast<short>(r.child.stdin_fd() >= 0 ? POLLOUT : 0), 0});
    }
    int timeout_ms = -1;
    if (!running.empty()) {
      auto first = std::min_element(running.begin(), running.end(),
                                    [](const Running& a, const Running& b) { return a.deadline < b.deadline; })->deadline;
      timeout_ms = static_cast<int>(std::clamp<long long>(
          std::chrono::ceil<std::chrono::milliseconds>(first - Clock::now()).count(), 0, 1 << 30));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      fail_all(std::make_exception_ptr(Error(ExitCode::kFailed, fmt::format("poll failed: {}", std::strerror(errno)))));
      break;
    }
    if (fds[0].revents) {
      char buf[64];
      while (::read(wake_r_, buf, sizeof buf) > 0) {
      }
    }

    // Walk backwards: finish() erases.
    for (std::size_t i = running.size(); i-- > 0;) {
      Running& r = running[i];
      const pollfd& out = fds[1 + 2 * i];
      const pollfd& in = fds[2 + 2 * i];
      if (r.child.stdin_fd() >= 0 && (in.revents & (POLLOUT | POLLERR | POLLHUP))) {
        const ssize_t n = ::write(r.child.stdin_fd(), r.request.data() + r.written, r.request.size() - r.written);
        if (n > 0) r.written += static_cast<std::size_t>(n);
        // Done, or the worker stopped reading (it died: its stdout tells why).
        if (r.written == r.request.size() || (n < 0 && errno != EAGAIN && errno != EINTR)) {
          r.child.close_stdin();
          r.request.clear();
        }
      }
      bool ended = false;
      if (out.revents & (POLLIN | POLLHUP | POLLERR)) {
        const ssize_t n = ::read(r.child.stdout_fd(), chunk.data(), chunk.size());
        if (n > 0) r.reply.feed(std::string_view(chunk.data(), static_cast<std::size_t>(n)));
        else if (n == 0 || (errno != EAGAIN && errno != EINTR)) ended = true;
      }
      std::optional<proto::Frame> frame;
      try {
        frame = r.reply.next();
        if (!frame && ended && r.reply.buffered() > 0)
          throw proto::ProtocolError(fmt::format("truncated frame: the stream ended {} bytes into a frame", r.reply.buffered()));
      } catch (const proto::ProtocolError& e) {
        const ExitStatus st = r.child.kill();
        finish(i, failed_build("compile_error", fmt::format("the build worker sent a malformed reply ({}): {}", st.str(), e.what()), r));
        continue;
      }
      if (frame) {
        if (frame->type() == "fatal") {
          try {
            proto::throw_if_fatal(*frame, "build worker");
          } catch (...) {
            fail_all(std::current_exception());
          }
          r.child.kill();
          break;
        }
        BuildRecord rec;
        try {
          rec = proto::build_record(*frame);
        } catch (const proto::ProtocolError& e) {
          rec = failed_build("compile_error", fmt::format("the build worker sent a malformed reply: {}", e.what()), r);
        }
        r.child.reap(std::chrono::seconds(5));
        finish(i, std::move(rec));
        continue;
      }
      if (ended) {
        const ExitStatus st = r.child.reap(std::chrono::seconds(5));
        finish(i, failed_build("compile_error", fmt::format("the build worker died while compiling ({}): NVRTC crashed or "
                                                            "ran out of memory on this source", st.str()), r));
        continue;
      }
      if (Clock::now() >= r.deadline) {
        r.child.kill();
        finish(i, failed_build("compile_timeout", fmt::format("NVRTC did not finish within {}; the build worker was killed",
                                                              seconds_str(options_.compile_timeout)), r));
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failure_) break;
    }
  }
  // `running` goes out of scope here: every build worker still alive is killed and reaped.
}

}  // namespace attntune
