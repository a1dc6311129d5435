#include "eval/protocol.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>

extern char** environ;

namespace attntune::proto {

namespace {

void put_u32(char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void put_u64(char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
std::uint64_t get_le(const char* p, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

std::string printable(std::string_view bytes) {
  std::string s;
  for (char c : bytes) s += (c >= 32 && c < 127) ? std::string(1, c) : fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
  return s;
}

struct Prefix {
  std::uint32_t header_bytes;
  std::uint64_t payload_bytes;
};

// Checks a 16-byte prefix; ProtocolError naming what is wrong.
Prefix parse_prefix(const char* p) {
  if (std::memcmp(p, kMagic, 4) != 0)
    throw ProtocolError(fmt::format("not a frame: expected magic 'ATF1', got '{}'", printable({p, 4})));
  Prefix pr{static_cast<std::uint32_t>(get_le(p + 4, 4)), get_le(p + 8, 8)};
  if (pr.header_bytes > kMaxHeaderBytes)
    throw ProtocolError(fmt::format("frame header of {} bytes exceeds the limit of {}", pr.header_bytes, kMaxHeaderBytes));
  if (pr.payload_bytes > kMaxPayloadBytes)
    throw ProtocolError(fmt::format("frame payload of {} bytes exceeds the limit of {}", pr.payload_bytes, kMaxPayloadBytes));
  return pr;
}

nlohmann::json parse_header(std::string_view text) {
  nlohmann::json h = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (h.is_discarded()) throw ProtocolError(fmt::format("frame header is not JSON: '{}'", printable(text.substr(0, 80))));
  if (!h.is_object()) throw ProtocolError("frame header is not a JSON object");
  return h;
}

// Holds SIGPIPE off this thread while writing to a pipe whose reader may have died: the write
// fails with EPIPE instead of the signal killing the process. A SIGPIPE our write raised is
// consumed before the mask is restored (unless one was already pending before we started).
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &block, &old_);
  }
  ~SigpipeGuard() {
    if (raised_ && !was_pending_) {
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, SIGPIPE);
      const timespec zero{0, 0};
      while (sigtimedwait(&set, nullptr, &zero) == -1 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  void raised() { raised_ = true; }

 private:
  sigset_t old_;
  bool was_pending_ = false, raised_ = false;
};

void write_all(int fd, const char* p, std::size_t n) {
  SigpipeGuard guard;
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EPIPE) {
        guard.raised();
        throw ProtocolError("the reader of the pipe has gone (EPIPE)");
      }
      throw ProtocolError(fmt::format("write to pipe failed: {}", std::strerror(errno)));
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

// Reads exactly n bytes; returns how many it got before EOF.
std::size_t read_all(int fd, char* p, std::size_t n) {
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, p + got, n - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw ProtocolError(fmt::format("read from pipe failed: {}", std::strerror(errno)));
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  return got;
}

}  // namespace

std::string Frame::type() const {
  auto it = header.find("type");
  return it != header.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::string encode(const Frame& f) {
  const std::string h = f.header.dump();
  if (h.size() > kMaxHeaderBytes) throw ProtocolError(fmt::format("frame header of {} bytes exceeds the limit", h.size()));
  if (f.payload.size() > kMaxPayloadBytes) throw ProtocolError(fmt::format("frame payload of {} bytes exceeds the limit", f.payload.size()));
  std::string out(kPrefixBytes, '\0');
  std::memcpy(out.data(), kMagic, 4);
  put_u32(out.data() + 4, static_cast<std::uint32_t>(h.size()));
  put_u64(out.data() + 8, f.payload.size());
  out.reserve(kPrefixBytes + h.size() + f.payload.size());
  out += h;
  out += f.payload;
  return out;
}

void FrameDecoder::feed(std::string_view bytes) {
  if (pos_ > 0 && pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  } else if (pos_ > (1u << 20) && pos_ > buf_.size() / 2) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  buf_.append(bytes);
}

std::optional<Frame> FrameDecoder::next() {
  if (buffered() < kPrefixBytes) {
    // A bad magic is reported as soon as it can be seen, not only once 16 bytes arrived.
    const std::size_t n = std::min<std::size_t>(buffered(), 4);
    if (std::memcmp(buf_.data() + pos_, kMagic, n) != 0) parse_prefix((buf_.substr(pos_) + std::string(16, '\0')).data());
    return std::nullopt;
  }
  const Prefix pr = parse_prefix(buf_.data() + pos_);
  const std::uint64_t total = kPrefixBytes + pr.header_bytes + pr.payload_bytes;
  if (buffered() < total) return std::nullopt;
  Frame f;
  f.header = parse_header(std::string_view(buf_).substr(pos_ + kPrefixBytes, pr.header_bytes));
  f.payload = buf_.substr(pos_ + kPrefixBytes + pr.header_bytes, pr.payload_bytes);
  pos_ += total;
  return f;
}

void write_frame(int fd, const Frame& f) {
  const std::string bytes = encode(f);
  write_all(fd, bytes.data(), bytes.size());
}

std::optional<Frame> read_frame(int fd) {
  char prefix[kPrefixBytes];
  const std::size_t got = read_all(fd, prefix, kPrefixBytes);
  if (got == 0) return std::nullopt;
  if (got < kPrefixBytes) {
    if (std::memcmp(prefix, kMagic, std::min<std::size_t>(got, 4)) != 0)  // a bad magic first
      parse_prefix((std::string(prefix, got) + std::string(kPrefixBytes, '\0')).data());
    throw ProtocolError(fmt::format("truncated frame: the stream ended after {} of {} prefix bytes", got, kPrefixBytes));
  }
  const Prefix pr = parse_prefix(prefix);
  std::string header(pr.header_bytes, '\0');
  if (std::size_t n = read_all(fd, header.data(), header.size()); n < header.size())
    throw ProtocolError(fmt::format("truncated frame: the stream ended after {} of {} header bytes", n, header.size()));
  Frame f;
  f.header = parse_header(header);
  f.payload.resize(pr.payload_bytes);
  if (std::size_t n = read_all(fd, f.payload.data(), f.payload.size()); n < f.payload.size())
    throw ProtocolError(fmt::format("truncated frame: the stream ended after {} of {} payload bytes", n, f.payload.size()));
  return f;
}

ReadResult read_frame_until(int fd, FrameDecoder& decoder, std::chrono::steady_clock::time_point deadline,
                            Frame& out) {
  std::string chunk(1 << 16, '\0');
  for (;;) {
    if (auto f = decoder.next()) {
      out = std::move(*f);
      return ReadResult::kFrame;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return ReadResult::kTimeout;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1 << 30)));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw ProtocolError(fmt::format("poll on pipe failed: {}", std::strerror(errno)));
    }
    if (r == 0) continue;  // re-checks the deadline
    const ssize_t n = ::read(fd, chunk.data(), chunk.size());
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw ProtocolError(fmt::format("read from pipe failed: {}", std::strerror(errno)));
    }
    if (n == 0) {
      if (decoder.buffered() > 0)
        throw ProtocolError(fmt::format("truncated frame: the stream ended {} bytes into a frame", decoder.buffered()));
      return ReadResult::kEof;
    }
    decoder.feed(std::string_view(chunk.data(), static_cast<std::size_t>(n)));
  }
}

// ---- Child processes ----------------------------------------------------------------------------

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

ExitStatus wait_blocking(pid_t pid) {
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, 0);
    if (r == pid) return decode_wait(status);
    if (r < 0 && errno == EINTR) continue;
    // ECHILD: someone else reaped it (e.g. a SIGCHLD handler set to SIG_IGN); its status is lost.
    return {false, -1};
  }
}

}  // namespace

Child Child::spawn(const std::vector<std::string>& argv) {
  if (argv.empty()) throw std::invalid_argument("Child::spawn: empty argv");
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0) throw Error(ExitCode::kFailed, fmt::format("pipe2 failed: {}", std::strerror(errno)));
  if (::pipe2(out, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(in[0]);
    ::close(in[1]);
    throw Error(ExitCode::kFailed, fmt::format("pipe2 failed: {}", std::strerror(e)));
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attr, 0);
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
  const int rc = ::posix_spawnp(&pid, cargv[0], &fa, &attr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(in[0]);
  ::close(out[1]);
  if (rc != 0) {
    ::close(in[1]);
    ::close(out[0]);
    throw Error(ExitCode::kFailed, fmt::format("cannot start {}: {}", argv[0], std::strerror(rc)));
  }
  Child c;
  c.pid_ = pid;
  c.in_ = in[1];
  c.out_ = out[0];
  return c;
}

Child::~Child() {
  kill_noexcept();
  close_fds();
}

Child::Child(Child&& o) noexcept : pid_(o.pid_), in_(o.in_), out_(o.out_) {
  o.pid_ = -1;
  o.in_ = o.out_ = -1;
}

Child& Child::operator=(Child&& o) noexcept {
  if (this != &o) {
    kill_noexcept();
    close_fds();
    pid_ = o.pid_;
    in_ = o.in_;
    out_ = o.out_;
    o.pid_ = -1;
    o.in_ = o.out_ = -1;
  }
  return *this;
}

void Child::close_stdin() { close_fd(in_); }

void Child::close_fds() noexcept {
  close_fd(in_);
  close_fd(out_);
}

void Child::kill_noexcept() noexcept {
  if (pid_ <= 0) return;
  ::kill(-pid_, SIGKILL);
  ::kill(pid_, SIGKILL);  // in case it left its group
  int status;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

ExitStatus Child::kill() {
  if (pid_ <= 0) return {};
  ::kill(-pid_, SIGKILL);
  ::kill(pid_, SIGKILL);
  const ExitStatus st = wait_blocking(pid_);
  pid_ = -1;
  close_fds();
  return st;
}

ExitStatus Child::reap(std::chrono::milliseconds grace) {
  if (pid_ <= 0) return {};
  close_stdin();
  const auto until = std::chrono::steady_clock::now() + grace;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      close_fds();
      // The group may hold grandchildren; they go with their leader.
      return decode_wait(status);
    }
    if (r < 0 && errno != EINTR) {
      pid_ = -1;
      close_fds();
      return {false, -1};
    }
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

// ---- Messages -----------------------------------------------------------------------------------

namespace {

template <class T>
T field(const Frame& f, const char* key) {
  auto it = f.header.find(key);
  if (it == f.header.end()) throw ProtocolError(fmt::format("message '{}' lacks field '{}'", f.type(), key));
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw ProtocolError(fmt::format("message '{}': field '{}' has the wrong type ({})", f.type(), key, e.what()));
  }
}

std::optional<double> opt_double(const Frame& f, const char* key) {
  auto it = f.header.find(key);
  if (it == f.header.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) throw ProtocolError(fmt::format("message '{}': field '{}' is not a number", f.type(), key));
  return it->get<double>();
}

nlohmann::json opt_json(const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); }

void expect_type(const Frame& f, const char* type) {
  if (f.type() != type) throw ProtocolError(fmt::format("expected a '{}' message, got '{}'", type, f.type()));
}

Problem problem_field(const Frame& f) {
  try {
    return Problem::from_json(field<nlohmann::json>(f, "problem"));
  } catch (const ProtocolError&) {
    throw;
  } catch (const std::exception& e) {
    throw ProtocolError(fmt::format("message '{}': bad problem: {}", f.type(), e.what()));
  }
}

}  // namespace

Frame fatal_frame(const std::string& message, int exit_code) {
  return {{{"type", "fatal"}, {"message", message}, {"exit_code", exit_code}}, {}};
}

Frame hello_frame(const DeviceInfo& d) {
  return {{{"type", "hello"}, {"name", d.name}, {"arch", d.arch}, {"uuid", d.uuid}, {"sm_count", d.sm_count},
           {"driver_version", d.driver_version}, {"pid", static_cast<long long>(::getpid())}},
          {}};
}

DeviceInfo hello_device(const Frame& f) {
  expect_type(f, "hello");
  DeviceInfo d;
  d.name = field<std::string>(f, "name");
  d.arch = field<std::string>(f, "arch");
  d.uuid = field<std::string>(f, "uuid");
  d.sm_count = field<int>(f, "sm_count");
  d.driver_version = field<std::string>(f, "driver_version");
  return d;
}

Frame to_frame(const EvalRequest& r) {
  Frame f;
  // The launch plan's family and the build's constants: the worker plans each launch from them.
  nlohmann::json defines = nlohmann::json::array();
  for (const auto& [name, value] : r.launch.defines) defines.push_back({name, value});
  f.header = {{"type", "eval"},
              {"plan", r.launch.plan},
              {"defines", std::move(defines)},
              {"problem", r.problem.json()},
              {"validation_seed", r.validation_seed},
              {"timing_seed", r.timing_seed},
              {"max_reps", r.timing.max_reps},
              {"max_seconds", r.timing.max_seconds},
              {"min_seconds", r.timing.min_seconds}};
  f.payload = r.cubin;
  return f;
}

EvalRequest eval_request(const Frame& f) {
  expect_type(f, "eval");
  EvalRequest r;
  r.launch.plan = field<std::string>(f, "plan");
  for (const auto& d : field<std::vector<std::pair<std::string, std::int64_t>>>(f, "defines"))
    r.launch.defines.push_back(d);
  r.problem = problem_field(f);
  r.validation_seed = field<std::uint64_t>(f, "validation_seed");
  r.timing_seed = field<std::uint64_t>(f, "timing_seed");
  r.timing.max_reps = field<int>(f, "max_reps");
  r.timing.max_seconds = field<double>(f, "max_seconds");
  r.timing.min_seconds = field<double>(f, "min_seconds");
  r.cubin = f.payload;
  return r;
}

Frame to_frame(const PrepareRequest& r) {
  return {{{"type", "prepare"}, {"problem", r.problem.json()}, {"validation_seed", r.validation_seed},
           {"timing_seed", r.timing_seed}},
          {}};
}

PrepareRequest prepare_request(const Frame& f) {
  expect_type(f, "prepare");
  PrepareRequest r;
  r.problem = problem_field(f);
  r.validation_seed = field<std::uint64_t>(f, "validation_seed");
  r.timing_seed = field<std::uint64_t>(f, "timing_seed");
  return r;
}

Frame prepared_frame(double reference_us) { return {{{"type", "prepared"}, {"reference_us", reference_us}}, {}}; }

double prepared_reference_us(const Frame& f) {
  expect_type(f, "prepared");
  return field<double>(f, "reference_us");
}

Frame to_frame(const EvalReply& r) {
  const EvalRecord& e = r.record;
  return {{{"type", "result"},
           {"status", e.status},
           {"error", e.error},
           {"median_us", opt_json(e.median_us)},
           {"min_us", opt_json(e.min_us)},
           {"max_us", opt_json(e.max_us)},
           {"stdev_us", opt_json(e.stdev_us)},
           {"tflops", opt_json(e.tflops)},
           {"max_abs_err", opt_json(e.max_abs_err)},
           {"err_bound", opt_json(e.err_bound)},
           {"count", e.count},
           {"registers", r.registers},
           {"local_bytes", r.local_bytes},
           {"wall_ms", r.wall_ms}},
          {}};
}

EvalReply eval_reply(const Frame& f) {
  expect_type(f, "result");
  EvalReply r;
  EvalRecord& e = r.record;
  e.status = field<std::string>(f, "status");
  e.error = field<std::string>(f, "error");
  e.median_us = opt_double(f, "median_us");
  e.min_us = opt_double(f, "min_us");
  e.max_us = opt_double(f, "max_us");
  e.stdev_us = opt_double(f, "stdev_us");
  e.tflops = opt_double(f, "tflops");
  e.max_abs_err = opt_double(f, "max_abs_err");
  e.err_bound = opt_double(f, "err_bound");
  e.count = field<std::int64_t>(f, "count");
  r.registers = field<int>(f, "registers");
  r.local_bytes = field<int>(f, "local_bytes");
  r.wall_ms = field<double>(f, "wall_ms");
  static const char* kStatuses[] = {"ok", "resources", "launch_error", "crashed", "wrong_result", "nan_or_unwritten"};
  if (std::find(std::begin(kStatuses), std::end(kStatuses), e.status) == std::end(kStatuses))
    throw ProtocolError(fmt::format("message 'result': unknown status '{}'", e.status));
  if (e.status == "ok" && (!e.median_us || !e.tflops || !e.max_abs_err))
    throw ProtocolError("message 'result': an ok result lacks median_us, tflops or max_abs_err");
  return r;
}

Frame to_frame(const BuildRequest& r) {
  return {{{"type", "build"}, {"program_name", r.program_name}, {"arch", r.arch}, {"options", r.options}}, r.source};
}

BuildRequest build_request(const Frame& f) {
  expect_type(f, "build");
  BuildRequest r;
  r.program_name = field<std::string>(f, "program_name");
  r.arch = field<std::string>(f, "arch");
  r.options = field<std::vector<std::string>>(f, "options");
  r.source = f.payload;
  return r;
}

Frame to_frame(const BuildRecord& b) {
  return {{{"type", "built"},
           {"status", b.status},
           {"log", b.log},
           {"registers", b.registers},
           {"smem_static", b.smem_static},
           {"spill_stores", b.spill_stores},
           {"spill_loads", b.spill_loads},
           {"local_bytes", b.local_bytes},
           {"compile_ms", b.compile_ms}},
          b.cubin};
}

BuildRecord build_record(const Frame& f) {
  expect_type(f, "built");
  BuildRecord b;
  b.status = field<std::string>(f, "status");
  if (b.status != "ok" && b.status != "compile_error")
    throw ProtocolError(fmt::format("message 'built': unknown status '{}'", b.status));
  b.log = field<std::string>(f, "log");
  b.registers = field<int>(f, "registers");
  b.smem_static = field<int>(f, "smem_static");
  b.spill_stores = field<int>(f, "spill_stores");
  b.spill_loads = field<int>(f, "spill_loads");
  b.local_bytes = field<int>(f, "local_bytes");
  b.compile_ms = field<double>(f, "compile_ms");
  b.cubin = f.payload;
  if (b.status == "ok" && b.cubin.empty()) throw ProtocolError("message 'built': status ok without a cubin");
  return b;
}

void throw_if_fatal(const Frame& f, const std::string& who) {
  if (f.type() != "fatal") return;
  const std::string message = f.header.value("message", std::string("(no message)"));
  const int code = f.header.value("exit_code", 1);
  if (code == static_cast<int>(ExitCode::kEnvironment)) throw EnvError(message);
  if (code == static_cast<int>(ExitCode::kBadInput)) throw InputError(fmt::format("{}: {}", who, message));
  throw Error(ExitCode::kFailed, fmt::format("{}: {}", who, message));
}

}  // namespace attntune::proto
