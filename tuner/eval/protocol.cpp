#include "eval/protocol.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>

// std::optional as null or its value (nlohmann-json 3.11.2 has no mapping of its own).
NLOHMANN_JSON_NAMESPACE_BEGIN
template <typename T>
struct adl_serializer<std::optional<T>> {
  static void to_json(json& j, const std::optional<T>& o) {
    if (o) j = *o;
    else j = nullptr;
  }
  static void from_json(const json& j, std::optional<T>& o) {
    if (j.is_null()) o.reset();
    else o = j.get<T>();
  }
};
NLOHMANN_JSON_NAMESPACE_END

namespace attntune {

// The records and problems the messages carry (tuner/core/records.hpp, core/problem.hpp).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(DeviceInfo, name, arch, uuid, sm_count, driver_version)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(EvalRecord, status, error, median_us, min_us, max_us, stdev_us, tflops, max_abs_err,
                                   err_bound, count)
// BuildRecord's cubin is the built frame's payload.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(BuildRecord, status, log, registers, smem_static, spill_stores, spill_loads,
                                   local_bytes, compile_ms)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(LaunchSpec, plan, defines)
void to_json(nlohmann::json& j, const Problem& p) { j = p.json(); }
void from_json(const nlohmann::json& j, Problem& p) { p = Problem::from_json(j); }

}  // namespace attntune

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

// ---- Messages -----------------------------------------------------------------------------------

namespace {

void expect_type(const Frame& f, const char* type) {
  if (f.type() != type) throw ProtocolError(fmt::format("expected a '{}' message, got '{}'", type, f.type()));
}

// A message's header as T, through the field mappings below; a missing or mistyped field is a
// ProtocolError naming the message (and the field, where the JSON library says which).
template <class T>
T from_header(const Frame& f) {
  try {
    return f.header.get<T>();
  } catch (const ProtocolError&) {
    throw;
  } catch (const nlohmann::json::out_of_range& e) {
    // "[json.exception.out_of_range.403] key 'plan' not found"
    const std::string what = e.what();
    const auto a = what.find("key '"), b = what.find("' not found");
    if (e.id == 403 && a != std::string::npos && b != std::string::npos && b > a + 5)
      throw ProtocolError(fmt::format("message '{}' lacks field '{}'", f.type(), what.substr(a + 5, b - a - 5)));
    throw ProtocolError(fmt::format("message '{}': {}", f.type(), what));
  } catch (const nlohmann::json::exception& e) {
    throw ProtocolError(fmt::format("message '{}': a field has the wrong type ({})", f.type(), e.what()));
  } catch (const std::exception& e) {  // Problem's own checks
    throw ProtocolError(fmt::format("message '{}': {}", f.type(), e.what()));
  }
}

// The message `type` with T's fields in its header and `payload`.
template <class T>
Frame frame_of(const char* type, const T& value, std::string payload = {}) {
  Frame f;
  f.header = value;
  f.header["type"] = type;
  f.payload = std::move(payload);
  return f;
}

}  // namespace

// ---- Field mappings: nlohmann-json's macros map each message's fields; bulk bytes (cubins,
// sources) travel in the frame's payload, not in these.

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(TimingLimits, max_reps, max_seconds, min_seconds)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(EvalRequest, launch, problem, validation_seed, timing_seed, timing)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(PrepareRequest, problem, validation_seed, timing_seed)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(EvalReply, record, registers, local_bytes, wall_ms)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(BuildRequest, program_name, arch, options)

Frame fatal_frame(const std::string& message, int exit_code) {
  return {{{"type", "fatal"}, {"message", message}, {"exit_code", exit_code}}, {}};
}

Frame hello_frame(const DeviceInfo& d) {
  Frame f = frame_of("hello", d);
  f.header["pid"] = static_cast<long long>(::getpid());
  return f;
}

DeviceInfo hello_device(const Frame& f) {
  expect_type(f, "hello");
  return from_header<DeviceInfo>(f);
}

Frame to_frame(const EvalRequest& r) { return frame_of("eval", r, r.cubin); }

EvalRequest eval_request(const Frame& f) {
  expect_type(f, "eval");
  EvalRequest r = from_header<EvalRequest>(f);
  r.cubin = f.payload;
  return r;
}

Frame to_frame(const PrepareRequest& r) { return frame_of("prepare", r); }

PrepareRequest prepare_request(const Frame& f) {
  expect_type(f, "prepare");
  return from_header<PrepareRequest>(f);
}

Frame prepared_frame(double reference_us) { return {{{"type", "prepared"}, {"reference_us", reference_us}}, {}}; }

double prepared_reference_us(const Frame& f) {
  expect_type(f, "prepared");
  const auto it = f.header.find("reference_us");
  if (it == f.header.end()) throw ProtocolError("message 'prepared' lacks field 'reference_us'");
  if (!it->is_number()) throw ProtocolError("message 'prepared': field 'reference_us' is not a number");
  return it->get<double>();
}

Frame to_frame(const EvalReply& r) { return frame_of("result", r); }

EvalReply eval_reply(const Frame& f) {
  expect_type(f, "result");
  const EvalReply r = from_header<EvalReply>(f);
  const EvalRecord& e = r.record;
  static const char* kStatuses[] = {"ok", "resources", "launch_error", "crashed", "wrong_result", "nan_or_unwritten"};
  if (std::find(std::begin(kStatuses), std::end(kStatuses), e.status) == std::end(kStatuses))
    throw ProtocolError(fmt::format("message 'result': unknown status '{}'", e.status));
  if (e.status == "ok" && (!e.median_us || !e.tflops || !e.max_abs_err))
    throw ProtocolError("message 'result': an ok result lacks median_us, tflops or max_abs_err");
  return r;
}

Frame to_frame(const BuildRequest& r) { return frame_of("build", r, r.source); }

BuildRequest build_request(const Frame& f) {
  expect_type(f, "build");
  BuildRequest r = from_header<BuildRequest>(f);
  r.source = f.payload;
  return r;
}

Frame to_frame(const BuildRecord& b) { return frame_of("built", b, b.cubin); }

BuildRecord build_record(const Frame& f) {
  expect_type(f, "built");
  BuildRecord b = from_header<BuildRecord>(f);
  if (b.status != "ok" && b.status != "compile_error")
    throw ProtocolError(fmt::format("message 'built': unknown status '{}'", b.status));
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
