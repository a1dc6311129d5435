#include "core/process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "core/error.hpp"

extern char** environ;

namespace attntune {

std::string ExitStatus::str() const {
  if (!signaled) return fmt::format("exited with status {}", value);
  const char* name = strsignal(value);
  return fmt::format("killed by signal {} ({})", value, name ? name : "unknown");
}

namespace {

ExitStatus decode_wait(int status) {
  if (WIFSIGNALED(status)) return {true, WTERMSIG(status)};
  return {false, WEXITSTATUS(status)};
}

void close_fd(int& fd) noexcept {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Both ends of a pipe (close-on-exec), or none.
struct Pipe {
  int fd[2] = {-1, -1};
  ~Pipe() {
    close_fd(fd[0]);
    close_fd(fd[1]);
  }
  void open() {
    if (::pipe2(fd, O_CLOEXEC) != 0) throw Error(ExitCode::kFailed, fmt::format("pipe2 failed: {}", std::strerror(errno)));
  }
  int take(int end) { return std::exchange(fd[end], -1); }
};

}  // namespace

Child Child::spawn(const std::vector<std::string>& argv, const SpawnOptions& options) {
  if (argv.empty()) throw std::invalid_argument("Child::spawn: empty argv");
  using Stdio = SpawnOptions::Stdio;
  Pipe in, out, err;
  if (options.in == Stdio::kPipe) in.open();
  if (options.out == Stdio::kPipe) out.open();
  if (options.err == Stdio::kPipe) err.open();
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  // The child's end of each pipe on its stdio (the pipes are close-on-exec: nothing else leaks).
  const struct {
    Stdio how;
    int child_fd, pipe_end;
    Pipe* pipe;
    int null_flags;
  } stdio[] = {{options.in, 0, 0, &in, O_RDONLY}, {options.out, 1, 1, &out, O_WRONLY}, {options.err, 2, 1, &err, O_WRONLY}};
  for (const auto& s : stdio) {
    if (s.how == Stdio::kPipe) posix_spawn_file_actions_adddup2(&fa, s.pipe->fd[s.pipe_end], s.child_fd);
    if (s.how == Stdio::kNull) posix_spawn_file_actions_addopen(&fa, s.child_fd, "/dev/null", s.null_flags, 0);
  }
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
  if (options.own_group) {
    flags |= POSIX_SPAWN_SETPGROUP;
    posix_spawnattr_setpgroup(&attr, 0);
  }
  posix_spawnattr_setflags(&attr, flags);
  sigset_t none, defaults;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  sigemptyset(&defaults);
  for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD, SIGALRM, SIGUSR1, SIGUSR2}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigdefault(&attr, &defaults);

  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = options.program.empty()
                     ? ::posix_spawnp(&pid, cargv[0], &fa, &attr, cargv.data(), environ)
                     : ::posix_spawn(&pid, options.program.c_str(), &fa, &attr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0)
    throw Error(ExitCode::kFailed, fmt::format("cannot start {}: {}",
                                               options.program.empty() ? argv[0] : options.program, std::strerror(rc)));
  Child c;
  c.pid_ = pid;
  c.own_group_ = options.own_group;
  c.in_ = in.take(1);
  c.out_ = out.take(0);
  c.err_ = err.take(0);
  return c;  // the child's ends close with the Pipes
}

Child::~Child() {
  kill_noexcept();
  close_fds();
}

Child::Child(Child&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)),
      in_(std::exchange(o.in_, -1)),
      out_(std::exchange(o.out_, -1)),
      err_(std::exchange(o.err_, -1)),
      own_group_(o.own_group_) {}

Child& Child::operator=(Child&& o) noexcept {
  if (this != &o) {
    kill_noexcept();
    close_fds();
    pid_ = std::exchange(o.pid_, -1);
    in_ = std::exchange(o.in_, -1);
    out_ = std::exchange(o.out_, -1);
    err_ = std::exchange(o.err_, -1);
    own_group_ = o.own_group_;
  }
  return *this;
}

void Child::close_stdin() { close_fd(in_); }

void Child::close_fds() noexcept {
  close_fd(in_);
  close_fd(out_);
  close_fd(err_);
}

void Child::signal(int sig) const {
  if (pid_ > 0) ::kill(pid_, sig);
}

void Child::kill_noexcept() noexcept {
  if (pid_ <= 0) return;
  if (own_group_) ::kill(-pid_, SIGKILL);
  ::kill(pid_, SIGKILL);  // in case it left its group
  int status;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

ExitStatus Child::reaped(int status) {
  pid_ = -1;
  close_fds();
  return decode_wait(status);
}

ExitStatus Child::wait() {
  if (pid_ <= 0) return {};
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, 0);
    if (r == pid_) return reaped(status);
    if (r < 0 && errno == EINTR) continue;
    // ECHILD: someone else reaped it (e.g. a SIGCHLD handler set to SIG_IGN); its status is lost.
    pid_ = -1;
    close_fds();
    return {false, -1};
  }
}

ExitStatus Child::kill() {
  if (pid_ <= 0) return {};
  if (own_group_) ::kill(-pid_, SIGKILL);
  ::kill(pid_, SIGKILL);
  return wait();
}

std::optional<ExitStatus> Child::poll() {
  if (pid_ <= 0) return ExitStatus{};
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) return reaped(status);
    if (r == 0) return std::nullopt;
    if (errno == EINTR) continue;
    pid_ = -1;
    close_fds();
    return ExitStatus{false, -1};
  }
}

ExitStatus Child::reap(std::chrono::milliseconds grace) {
  if (pid_ <= 0) return {};
  close_stdin();
  const auto until = std::chrono::steady_clock::now() + grace;
  for (;;) {
    // The group may hold grandchildren; they go with their leader.
    if (std::optional<ExitStatus> st = poll()) return *st;
    if (std::chrono::steady_clock::now() >= until) return kill();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::string self_exe() {
  std::string buf(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size());
  if (n <= 0 || static_cast<std::size_t>(n) >= buf.size())
    throw Error(ExitCode::kEnvironment, "cannot find this executable's path (/proc/self/exe)");
  buf.resize(static_cast<std::size_t>(n));
  return buf;
}

}  // namespace attntune
