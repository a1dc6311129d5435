// How the tuner talks to the processes it runs candidates in: the GPU worker (`attntune worker`,
// one per GPU, owns the CUDA context) and the build workers (`attntune build-worker`, one per
// NVRTC compile). Both read requests on their stdin and answer on their stdout; stderr passes
// through for logs. A candidate that hangs or kills its process takes only that process with it.
//
// Wire format, one frame per message (integers little-endian):
//   "ATF1" | u32 header bytes | u64 payload bytes | header: a JSON object | payload: raw bytes
// The header says what the message is ("type") and carries every field but bulk data; the payload
// carries a cubin, a CUDA source or nothing. A reader refuses a bad magic, a header over 16 MiB, a
// payload over 2 GiB or a header that is not a JSON object (ProtocolError), and tells a clean end
// of stream (EOF between frames) from a truncated frame.
//
// Messages (header "type"; fields as in the structs below):
//   GPU worker   <- prepare {problem, validation_seed, timing_seed}   -> prepared {reference_us}
//                <- eval {EvalRequest}, payload cubin                   -> result {EvalReply}
//                at start, unasked:                                     -> hello {DeviceInfo, pid}
//   build worker <- build {name, arch, options}, payload source         -> built {BuildRecord}, payload cubin
//   either, when it cannot work at all:  -> fatal {message, exit_code}  (then it exits with exit_code)
#pragma once
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/process.hpp"
#include "core/records.hpp"
#include "families/family.hpp"
#include "core/problem.hpp"

namespace attntune::proto {

// ---- Frames -------------------------------------------------------------------------------------

constexpr char kMagic[4] = {'A', 'T', 'F', '1'};
constexpr std::size_t kPrefixBytes = 16;
constexpr std::uint32_t kMaxHeaderBytes = 16u << 20;
constexpr std::uint64_t kMaxPayloadBytes = 2ull << 30;

struct Frame {
  nlohmann::json header = nlohmann::json::object();
  std::string payload;
  std::string type() const;  // header["type"], "" when absent or not a string
};

// A malformed or truncated frame, or a pipe that failed. Exit code 1.
class ProtocolError : public Error {
 public:
  explicit ProtocolError(const std::string& what) : Error(ExitCode::kFailed, what) {}
};

std::string encode(const Frame& f);

// Incremental decoding of a byte stream into frames (for readers that poll).
class FrameDecoder {
 public:
  void feed(std::string_view bytes);
  // The next complete frame, nullopt until one has arrived; ProtocolError for a malformed one.
  std::optional<Frame> next();
  std::size_t buffered() const { return buf_.size() - pos_; }  // bytes of a frame not yet complete

 private:
  std::string buf_;
  std::size_t pos_ = 0;
};

// Blocking I/O on a file descriptor, retrying on EINTR.
// Writes the whole frame; ProtocolError when the reader has gone (EPIPE: SIGPIPE is held off for
// the write, never delivered to the process) or the write fails.
void write_frame(int fd, const Frame& f);
// Reads one frame: nullopt at a clean EOF (no byte of a new frame read), ProtocolError for a
// truncated or malformed frame.
std::optional<Frame> read_frame(int fd);

enum class ReadResult { kFrame, kEof, kTimeout };
// Reads until `decoder` yields a frame (returned in `out`), the stream ends (kEof: a partial frame
// left in the decoder makes that a ProtocolError instead) or `deadline` passes (kTimeout).
ReadResult read_frame_until(int fd, FrameDecoder& decoder, std::chrono::steady_clock::time_point deadline,
                            Frame& out);

// ---- Messages -----------------------------------------------------------------------------------

// A worker that cannot work at all (no GPU, no NVRTC): its message and the exit code (3 for the
// environment) the parent should fail with.
Frame fatal_frame(const std::string& message, int exit_code);

// hello: the GPU the worker holds.
Frame hello_frame(const DeviceInfo& device);
DeviceInfo hello_device(const Frame& f);

// How long a candidate is timed: samples until the median holds within 1% (at least 10 samples),
// or max_reps samples; never less than min_seconds, never more than ~max_seconds. Under the
// H100's power cap the SM clock swings over tens of milliseconds, so a ~20 ms timing reads 5-10%
// apart from one round to the next while its own samples agree within 1% (docs/log/PERFORMANCE.md
// run 53); min_seconds spans those swings.
struct TimingLimits {
  int max_reps = 200;
  double max_seconds = 2.0;
  double min_seconds = 0;
};

// One candidate to validate and time: its cubin and how it launches (its family's launch plan and
// the constants it was built with); the worker runs the plan (tuner/eval/attention_gpu.hpp).
struct EvalRequest {
  std::string cubin;
  LaunchSpec launch;
  Problem problem;
  std::uint64_t validation_seed = 1;  // inputs the output is checked on
  std::uint64_t timing_seed = 2;      // different inputs for timing
  TimingLimits timing;
};
Frame to_frame(const EvalRequest& r);
EvalRequest eval_request(const Frame& f);  // ProtocolError for missing or mistyped fields

// prepare: inputs and reference outputs for a problem (computed once, cached by the worker).
struct PrepareRequest {
  Problem problem;
  std::uint64_t validation_seed = 1, timing_seed = 2;
};
Frame to_frame(const PrepareRequest& r);
PrepareRequest prepare_request(const Frame& f);
Frame prepared_frame(double reference_us);
double prepared_reference_us(const Frame& f);

// result: the candidate's outcome. record.status is ok | resources | launch_error | crashed |
// wrong_result | nan_or_unwritten (the worker never says timeout: the parent decides that).
struct EvalReply {
  EvalRecord record;
  int registers = 0;     // as the driver loaded the kernel (0 when it did not load)
  int local_bytes = 0;   // stack per thread
  double wall_ms = 0;    // in the worker, load to last timed launch
};
Frame to_frame(const EvalReply& r);
EvalReply eval_reply(const Frame& f);

// build / built: one NVRTC compile in a build worker.
struct BuildRequest {
  std::string program_name;  // "flash_fwd_mma.cu", for NVRTC's messages
  std::string source;
  std::string arch;
  std::vector<std::string> options;
};
Frame to_frame(const BuildRequest& r);
BuildRequest build_request(const Frame& f);
Frame to_frame(const BuildRecord& r);
BuildRecord build_record(const Frame& f);

// Throws the Error a fatal frame carries (EnvError for exit code 3, else Error with its code),
// prefixed by `who` ("GPU worker"); does nothing for other frames.
void throw_if_fatal(const Frame& f, const std::string& who);

}  // namespace attntune::proto
