// The worker protocol without a GPU: frames round-trip through encode/decode and real pipes (a
// payload far larger than a pipe's buffer included), truncated and malformed streams are errors
// that say what went wrong, messages keep every field, and child processes are killed and reaped.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "eval/protocol.hpp"

namespace test_protocol {
using namespace attntune;
using namespace attntune::proto;

namespace {

std::string random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

struct Pipe {
  int r = -1, w = -1;
  Pipe() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
    r = fds[0];
    w = fds[1];
  }
  ~Pipe() {
    close_r();
    close_w();
  }
  void close_r() {
    if (r >= 0) ::close(r);
    r = -1;
  }
  void close_w() {
    if (w >= 0) ::close(w);
    w = -1;
  }
};

void write_raw(int fd, const std::string& bytes) {
  ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ProtocolError& e) {
    return e.what();
  }
  return "(no ProtocolError)";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(Protocol, EncodeDecodeRoundTrip) {
  Frame f;
  f.header = {{"type", "eval"}, {"n", 42}, {"text", "quotes \" and \\ and \n newlines"}};
  f.payload = random_bytes(1000, 1);
  f.payload[10] = '\0';
  const std::string bytes = encode(f);
  ASSERT_EQ(bytes.substr(0, 4), "ATF1");
  FrameDecoder d;
  d.feed(bytes);
  auto out = d.next();
  ASSERT_TRUE(out);
  EXPECT_EQ(out->header, f.header);
  EXPECT_EQ(out->payload, f.payload);
  EXPECT_EQ(out->type(), "eval");
  EXPECT_EQ(d.buffered(), 0u);
  EXPECT_FALSE(d.next());
}

TEST(Protocol, DecoderAssemblesFramesFedByteByByte) {
  Frame a{{{"type", "a"}}, "payload-a"}, b{{{"type", "b"}}, ""}, c{{{"type", "c"}}, random_bytes(300, 2)};
  const std::string bytes = encode(a) + encode(b) + encode(c);
  FrameDecoder d;
  std::vector<Frame> got;
  for (char ch : bytes) {
    d.feed(std::string_view(&ch, 1));
    while (auto f = d.next()) got.push_back(std::move(*f));
  }
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].payload, "payload-a");
  EXPECT_EQ(got[1].type(), "b");
  EXPECT_TRUE(got[1].payload.empty());
  EXPECT_EQ(got[2].payload, c.payload);
}

TEST(Protocol, DecoderRejectsGarbageAndOversizeFrames) {
  {
    FrameDecoder d;
    d.feed("hello, I am not a frame");
    EXPECT_TRUE(contains(error_of([&] { d.next(); }), "expected magic 'ATF1', got 'hell'"));
  }
  {
    FrameDecoder d;
    d.feed("XY");  // a bad magic is reported before a whole prefix has arrived
    EXPECT_TRUE(contains(error_of([&] { d.next(); }), "expected magic"));
  }
  {
    std::string bytes = encode({{{"type", "x"}}, ""});
    bytes[7] = 0x7f;  // header length ~2 GiB
    FrameDecoder d;
    d.feed(bytes);
    EXPECT_TRUE(contains(error_of([&] { d.next(); }), "exceeds the limit"));
  }
  {
    std::string bytes = encode({{{"type", "x"}}, ""});
    bytes[15] = 0x01;  // payload length 2^56
    FrameDecoder d;
    d.feed(bytes);
    EXPECT_TRUE(contains(error_of([&] { d.next(); }), "payload"));
  }
  {
    std::string bytes = encode({{{"type", "x"}}, ""});
    bytes[16] = '[';  // header no longer JSON
    FrameDecoder d;
    d.feed(bytes);
    EXPECT_TRUE(contains(error_of([&] { d.next(); }), "not JSON"));
  }
  {
    Frame arr;
    arr.header = nlohmann::json::array({1, 2});
    FrameDecoder d;
    d.feed(encode(arr));
    EXPECT_TRUE(contains(error_of([&] { d.next(); }), "not a JSON object"));
  }
}

TEST(Protocol, LargePayloadThroughARealPipe) {
  // 24 MiB: hundreds of times a pipe's buffer, so writer and reader must interleave.
  Frame f{{{"type", "eval"}, {"kernel_name", "k"}}, random_bytes(24u << 20, 3)};
  Pipe p;
  std::thread writer([&] {
    write_frame(p.w, f);
    write_frame(p.w, Frame{{{"type", "second"}}, "x"});
    p.close_w();
  });
  auto got = read_frame(p.r);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->payload.size(), f.payload.size());
  EXPECT_TRUE(got->payload == f.payload);
  auto second = read_frame(p.r);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->type(), "second");
  EXPECT_FALSE(read_frame(p.r));  // clean EOF between frames
  writer.join();
}

TEST(Protocol, PolledReadOfLargePayloadAndDeadline) {
  Frame f{{{"type", "result"}}, random_bytes(5u << 20, 4)};
  Pipe p;
  std::thread writer([&] { write_frame(p.w, f); });
  FrameDecoder d;
  Frame out;
  const auto far = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  ASSERT_EQ(read_frame_until(p.r, d, far, out), ReadResult::kFrame);
  EXPECT_TRUE(out.payload == f.payload);
  writer.join();
  // Nothing more is written: the deadline passes, on time.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(read_frame_until(p.r, d, t0 + std::chrono::milliseconds(150), out), ReadResult::kTimeout);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited, 0.14);
  EXPECT_LT(waited, 2.0);
  p.close_w();
  EXPECT_EQ(read_frame_until(p.r, d, far, out), ReadResult::kEof);
}

TEST(Protocol, TruncatedFramesAreErrorsNotEof) {
  const std::string bytes = encode({{{"type", "result"}, {"status", "ok"}}, random_bytes(4096, 5)});
  for (std::size_t cut : {std::size_t{3}, std::size_t{10}, std::size_t{20}, bytes.size() - 1}) {
    SCOPED_TRACE(cut);
    {
      Pipe p;
      write_raw(p.w, bytes.substr(0, cut));
      p.close_w();
      const std::string e = error_of([&] { read_frame(p.r); });
      EXPECT_TRUE(contains(e, "truncated frame")) << e;
    }
    {
      Pipe p;
      write_raw(p.w, bytes.substr(0, cut));
      p.close_w();
      FrameDecoder d;
      Frame out;
      const std::string e =
          error_of([&] { read_frame_until(p.r, d, std::chrono::steady_clock::now() + std::chrono::seconds(10), out); });
      EXPECT_TRUE(contains(e, "truncated frame")) << e;
    }
  }
}

TEST(Protocol, WritingToAPipeWithoutReaderIsAnErrorNotASignal) {
  Pipe p;
  p.close_r();
  // Were SIGPIPE delivered, this test process would die here.
  const std::string e = error_of([&] { write_frame(p.w, Frame{{{"type", "x"}}, random_bytes(1 << 20, 6)}); });
  EXPECT_TRUE(contains(e, "EPIPE")) << e;
  sigset_t pending;
  sigemptyset(&pending);
  sigpending(&pending);
  EXPECT_FALSE(sigismember(&pending, SIGPIPE));  // consumed, not left pending
}

TEST(Protocol, MessagesRoundTrip) {
  EvalRequest r;
  r.cubin = random_bytes(70000, 7);
  // How it launches: the family's launch plan and the build's constants (the worker plans from them).
  r.launch = {"flash_fwd_wgmma",
              {{"ATT_HEAD_DIM", 128}, {"BLOCK_M", 128}, {"BLOCK_N", 176}, {"SPLIT_TAIL", 1}, {"KV_MULTICAST", 1},
               {"SMEM_BYTES", 98304}, {"BIG", std::int64_t{1} << 40}, {"NEGATIVE", -3}}};
  r.problem = Problem::parse("b=4,h=16,hkv=2,s=4096,sk=1000,d=128,dtype=bf16,causal=1");
  r.validation_seed = 0xFFFFFFFFFFFFFFF0ull;
  r.timing_seed = 77;
  r.timing.max_reps = 50;
  r.timing.max_seconds = 0.5;
  r.timing.min_seconds = 0.25;
  FrameDecoder d;
  d.feed(encode(to_frame(r)));
  const EvalRequest back = eval_request(*d.next());
  EXPECT_TRUE(back.cubin == r.cubin);
  EXPECT_EQ(back.launch.plan, "flash_fwd_wgmma");
  EXPECT_EQ(back.launch.defines, r.launch.defines);  // in order, 64-bit values intact
  EXPECT_EQ(back.problem, r.problem);
  EXPECT_EQ(back.validation_seed, r.validation_seed);
  EXPECT_EQ(back.timing_seed, 77u);
  EXPECT_EQ(back.timing.max_reps, 50);
  EXPECT_DOUBLE_EQ(back.timing.max_seconds, 0.5);
  EXPECT_DOUBLE_EQ(back.timing.min_seconds, 0.25);
  Frame no_plan = to_frame(r);
  no_plan.header["launch"].erase("plan");
  EXPECT_TRUE(contains(error_of([&] { eval_request(no_plan); }), "lacks field 'plan'"));
  Frame bad_defines = to_frame(r);
  bad_defines.header["launch"]["defines"] = nlohmann::json::array({nlohmann::json::array({"BLOCK_M", "x"})});
  EXPECT_TRUE(contains(error_of([&] { eval_request(bad_defines); }), "message 'eval': a field has the wrong type"));
  Frame bad_problem = to_frame(r);
  bad_problem.header["problem"]["dtype"] = "fp4";
  EXPECT_TRUE(contains(error_of([&] { eval_request(bad_problem); }), "bad dtype 'fp4'"));

  EvalReply rep;
  rep.record.status = "wrong_result";
  rep.record.error = "max|out-ref|=0.5";
  rep.record.max_abs_err = 0.5;
  rep.record.err_bound = 0.01;
  rep.registers = 128;
  const EvalReply rb = eval_reply(to_frame(rep));
  EXPECT_EQ(rb.record.status, "wrong_result");
  EXPECT_EQ(rb.record.error, rep.record.error);
  EXPECT_EQ(rb.record.max_abs_err, 0.5);
  EXPECT_FALSE(rb.record.median_us.has_value());
  EXPECT_EQ(rb.registers, 128);

  Frame bad = to_frame(rep);
  bad.header["record"]["status"] = "timeout";  // only the parent decides timeouts
  EXPECT_TRUE(contains(error_of([&] { eval_reply(bad); }), "unknown status"));
  Frame ok_without_time = to_frame(rep);
  ok_without_time.header["record"]["status"] = "ok";
  EXPECT_TRUE(contains(error_of([&] { eval_reply(ok_without_time); }), "lacks median_us"));
  Frame missing = to_frame(rep);
  missing.header["record"].erase("count");
  EXPECT_TRUE(contains(error_of([&] { eval_reply(missing); }), "lacks field 'count'"));

  BuildRecord b;
  b.status = "ok";
  b.cubin = random_bytes(5000, 8);
  b.log = "ptxas info";
  b.registers = 96;
  b.spill_stores = 4;
  b.compile_ms = 812.5;
  const BuildRecord bb = build_record(to_frame(b));
  EXPECT_TRUE(bb.cubin == b.cubin);
  EXPECT_EQ(bb.registers, 96);
  EXPECT_EQ(bb.spill_stores, 4);
  EXPECT_DOUBLE_EQ(bb.compile_ms, 812.5);

  const BuildRequest breq{"k.cu", "extern \"C\" __global__ void k() {}", "sm_90", {"-DX=1", "--use_fast_math"}};
  const BuildRequest bq = build_request(to_frame(breq));
  EXPECT_EQ(bq.source, breq.source);
  EXPECT_EQ(bq.options, breq.options);

  DeviceInfo dev{"NVIDIA H200", "sm_90", "GPU-1234", 132, "13.0"};
  const DeviceInfo db = hello_device(hello_frame(dev));
  EXPECT_EQ(db.name, "NVIDIA H200");
  EXPECT_EQ(db.sm_count, 132);
  EXPECT_EQ(db.driver_version, "13.0");
  EXPECT_DOUBLE_EQ(prepared_reference_us(prepared_frame(1234.5)), 1234.5);
  EXPECT_EQ(prepare_request(to_frame(PrepareRequest{r.problem, 5, 6})).problem, r.problem);
}

TEST(Protocol, FatalFramesBecomeTheirErrors) {
  try {
    throw_if_fatal(fatal_frame("no GPU: libcuda.so.1 not found", 3), "GPU worker");
    FAIL() << "no exception";
  } catch (const EnvError& e) {
    EXPECT_STREQ(e.what(), "no GPU: libcuda.so.1 not found");
  }
  try {
    throw_if_fatal(fatal_frame("device 7 does not exist", 2), "GPU worker");
    FAIL() << "no exception";
  } catch (const InputError& e) {
    EXPECT_TRUE(contains(e.what(), "GPU worker: device 7"));
  }
  EXPECT_NO_THROW(throw_if_fatal(prepared_frame(1), "x"));
}

TEST(Protocol, ChildExitStatusAndGroupKill) {
  {
    Child c = Child::spawn({"/bin/sh", "-c", "exit 7"});
    EXPECT_EQ(c.reap(std::chrono::seconds(10)).str(), "exited with status 7");
    EXPECT_FALSE(c.running());
  }
  {
    Child c = Child::spawn({"/bin/sh", "-c", "kill -SEGV $$"});
    const ExitStatus st = c.reap(std::chrono::seconds(10));
    EXPECT_TRUE(st.signaled);
    EXPECT_EQ(st.value, SIGSEGV);
    EXPECT_TRUE(contains(st.str(), "signal 11")) << st.str();
  }
  {
    // A grandchild in the group goes too: the pipe's last writer dies, so the read sees EOF.
    Child c = Child::spawn({"/bin/sh", "-c", "sleep 100 & sleep 100"});
    const auto t0 = std::chrono::steady_clock::now();
    const int out = ::dup(c.stdout_fd());
    const ExitStatus st = c.reap(std::chrono::milliseconds(100));
    EXPECT_TRUE(st.signaled);
    EXPECT_EQ(st.value, SIGKILL);
    char buf[1];
    EXPECT_EQ(::read(out, buf, 1), 0);
    ::close(out);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  }
  {
    // The child speaks the protocol over its stdin/stdout: `cat` echoes a frame back.
    Child c = Child::spawn({"cat"});
    write_frame(c.stdin_fd(), Frame{{{"type", "echo"}}, random_bytes(1000, 9)});
    c.close_stdin();
    auto f = read_frame(c.stdout_fd());
    ASSERT_TRUE(f);
    EXPECT_EQ(f->type(), "echo");
    EXPECT_TRUE(c.reap(std::chrono::seconds(10)).ok());
  }
  EXPECT_THROW(Child::spawn({"/nonexistent/attntune-worker"}), Error);
}
}  // namespace test_protocol
