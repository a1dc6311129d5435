#include "eval/worker.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "cuda/driver.hpp"
#include "eval/attention_gpu.hpp"
#include "eval/compile.hpp"
#include "eval/protocol.hpp"

namespace attntune {

namespace {

using Clock = std::chrono::steady_clock;

// The protocol gets its own descriptor; fd 1 then points at stderr, so a stray printf from any
// library goes to the log instead of corrupting the frames.
int take_protocol_fd(int out_fd) {
  const int fd = ::fcntl(out_fd, F_DUPFD_CLOEXEC, 3);
  if (fd < 0) return out_fd;
  if (out_fd == STDOUT_FILENO) {
    std::fflush(stdout);
    ::dup2(STDERR_FILENO, STDOUT_FILENO);
  }
  return fd;
}

void die_with_parent() { ::prctl(PR_SET_PDEATHSIG, SIGKILL); }

// Says why on the stream (the parent prints it, once); on stderr only when the parent is gone.
int fail_fatal(int out, const std::string& message, int code) {
  try {
    proto::write_frame(out, proto::fatal_frame(message, code));
  } catch (const proto::ProtocolError&) {
    std::fprintf(stderr, "attntune worker: %s\n", message.c_str());
  }
  return code;
}

// ---- The GPU worker -----------------------------------------------------------------------------

// Where in a candidate's run a driver error came from decides its status.
enum class Stage { kLoad, kLaunch, kRun, kTiming };

// One set of validation inputs and its reference outputs.
struct Check {
  std::unique_ptr<AttnBuffers> inputs;
  std::unique_ptr<ReferenceCache> refs;
};

// Inputs, references and timing inputs of the problem being evaluated.
struct ProblemState {
  proto::PrepareRequest key;
  std::vector<Check> checks;  // validation_inputs(problem): the problem first
  std::unique_ptr<TimingInputs> timing;
  double reference_us() const { return checks.front().refs->reference_us(); }
};

class GpuWorker {
 public:
  explicit GpuWorker(int device)
      : ctx_(device), props_(cuda::device_props(device)), reference_(props_.arch) {}

  DeviceInfo device_info() const { return cuda::device_info(props_); }

  // Returns the fp32 reference's time for the problem.
  double prepare(const proto::PrepareRequest& req) {
    if (state_ && state_->key.problem == req.problem && state_->key.validation_seed == req.validation_seed &&
        state_->key.timing_seed == req.timing_seed)
      return state_->reference_us();
    state_.reset();  // frees the previous problem's buffers first
    auto st = std::make_unique<ProblemState>();
    st->key = req;
    for (auto& inputs : validation_inputs(req.problem, req.validation_seed)) {
      reference_.fill(*inputs, req.validation_seed);
      auto refs = std::make_unique<ReferenceCache>(reference_, *inputs);
      // A paged problem's contiguous K and V served the references; each candidate's refill draws
      // the same values straight into the pages (AttnBuffers::contiguous_kv).
      if (inputs->problem.paged()) inputs->drop_contiguous_kv();
      st->checks.push_back({std::move(inputs), std::move(refs)});
    }
    st->timing = std::make_unique<TimingInputs>(reference_, req.problem, req.timing_seed);
    ctx_.synchronize();
    state_ = std::move(st);
    return state_->reference_us();
  }

  bool poisoned() const { return poisoned_; }

  // What a prepare that ran out of memory says besides the driver's error: what the problem's K and
  // V take, how the worker holds them, and what was free (the failed prepare's buffers are freed).
  std::string out_of_memory_hint(const Problem& p) const {
    const double kv = double(p.b) * double(p.hkv) * double(p.sk) *
                      double(p.d + (p.latent ? 0 : p.head_dim_v())) * (p.kv_fp8 || p.qkv_fp8 ? 1 : 2);
    const cuda::Context::MemInfo m = ctx_.mem_info();
    return fmt::format(
        "; its K and V take {:.1f} GB, held once for validation and once for timing (a paged problem's "
        "validation sets also in contiguous form while their references are computed), and {:.1f} of this "
        "GPU's {:.1f} GB are free: tune it on a GPU with more memory, or at a smaller batch",
        kv / 1e9, double(m.free) / 1e9, double(m.total) / 1e9);
  }

  proto::EvalReply evaluate(const proto::EvalRequest& req) {
    const auto t0 = Clock::now();
    proto::EvalReply rep = run(req);
    rep.wall_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    return rep;
  }

 private:
  static proto::EvalReply status(const std::string& s, const std::string& error) {
    proto::EvalReply r;
    r.record.status = s;
    r.record.error = error;
    return r;
  }

  proto::EvalReply classify(const cuda::CudaError& e, Stage stage) {
    if (e.sticky()) {
      poisoned_ = true;
      return status("crashed", fmt::format("the kernel faulted, the CUDA context is lost: {}", e.what()));
    }
    const CUresult r = e.result();
    const bool limits = r == CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES || r == CUDA_ERROR_INVALID_VALUE;
    if ((stage == Stage::kLoad || stage == Stage::kLaunch) && limits)
      return status("resources", fmt::format("the launch exceeds the device's limits: {}", e.what()));
    if (stage == Stage::kLoad) return status("launch_error", fmt::format("the kernel did not load: {}", e.what()));
    return status("launch_error", e.what());
  }

  // A launch the device cannot take: its status, or nullopt when every launch of the plan fits.
  std::optional<proto::EvalReply> check_resources(const LoadedBuild& k, const attntune_plan::Plan& plan) const {
    for (int i = 0; i < plan.launches; ++i) {
      const attntune_plan::Launch& l = plan.launch[i];
      const cuda::Function& fn = k.function(l.kernel);
      if (l.block == 0 || static_cast<int>(l.block) > props_.max_threads_per_block)
        return status("resources", fmt::format("{}: a block of {} threads; the device allows 1 to {}", fn.name(),
                                               l.block, props_.max_threads_per_block));
      const int static_smem = fn.static_smem_bytes();
      if (static_smem + static_cast<long long>(l.smem) > props_.max_smem_per_block_optin)
        return status("resources", fmt::format("{}: {} bytes of static + {} of dynamic shared memory per block; the "
                                               "device allows at most {}",
                                               fn.name(), static_smem, l.smem, props_.max_smem_per_block_optin));
      const int max_threads = fn.max_threads_per_block();
      if (max_threads < static_cast<int>(l.block))
        return status("resources", fmt::format("{}: {} registers per thread allow at most {} threads per block; the "
                                               "launch has {}",
                                               fn.name(), fn.num_regs(), max_threads, l.block));
    }
    return std::nullopt;
  }

  proto::EvalReply run(const proto::EvalRequest& req) {
    prepare({req.problem, req.validation_seed, req.timing_seed});
    ProblemState& st = *state_;
    const attntune_plan::Call call = st.checks.front().inputs->call();

    std::optional<LoadedBuild> kernel;
    try {
      kernel.emplace(req.cubin, req.launch);
    } catch (const cuda::CudaError& e) {
      return classify(e, Stage::kLoad);
    }
    proto::EvalReply rep;
    try {
      // The registers and stack of the build's heaviest kernel.
      for (int i = 0; i < kernel->kernels(); ++i) {
        rep.registers = std::max(rep.registers, kernel->function(i).num_regs());
        rep.local_bytes = std::max(rep.local_bytes, kernel->function(i).local_bytes());
      }
      const attntune_plan::Plan plan = kernel->plan(call);
      if (auto r = check_resources(*kernel, plan)) {
        r->registers = rep.registers;
        return *r;
      }
    } catch (const PlanRefused& e) {
      auto r = status("launch_error", fmt::format("its launch plan refuses the problem: {}", e.what()));
      r.registers = rep.registers;
      return r;
    } catch (const cuda::CudaError& e) {
      return classify(e, Stage::kLoad);
    }

    auto with_resources = [&](proto::EvalReply r) {
      r.registers = rep.registers;
      r.local_bytes = rep.local_bytes;
      return r;
    };
    // Validation: inputs refilled (a previous candidate may have written over them), output NaN;
    // every set of inputs must pass, the first failure is the verdict.
    Verdict v;
    for (Check& c : st.checks) {
      try {
        reference_.fill(*c.inputs, req.validation_seed);
        kernel->launch(c.inputs->call());
      } catch (const cuda::CudaError& e) {
        return with_resources(classify(e, Stage::kLaunch));
      } catch (const PlanRefused& e) {
        return with_resources(status("launch_error", fmt::format("its launch plan refuses the problem: {}", e.what())));
      }
      try {
        ctx_.synchronize();
        v = c.refs->check(*c.inputs);
      } catch (const cuda::CudaError& e) {
        return with_resources(classify(e, Stage::kRun));
      }
      if (&c == &st.checks.front() || v.status != "ok") {  // the problem's own figures, or the failure's
        rep.record.max_abs_err = v.max_abs_err;
        rep.record.err_bound = v.err_bound;
      }
      if (v.status != "ok") {
        rep.record.status = v.status;
        const Problem& on = c.inputs->problem;
        const std::string lens = on.is_varlen() ? fmt::format(" {}", fmt::join(c.inputs->seqlens, ",")) : "";
        // Which inputs failed, past the problem's own: a paged or varlen problem's ragged lengths, the
        // backward pass's odd ones.
        const bool other = c.inputs != st.checks.front().inputs;
        rep.record.error = other && (on.paged() || on.is_varlen())
                               ? fmt::format("{} (on {}, ragged lengths{})", v.detail(), on.str(), lens)
                           : other ? fmt::format("{} (on {}, odd lengths)", v.detail(), on.str())
                                   : v.detail();
        try {
          for (Check& r : st.checks) r.refs->restore();  // it may have written outside its output too
        } catch (const cuda::CudaError& e) {
          return with_resources(classify(e, Stage::kRun));
        }
        return rep;
      }
    }

    TimingStats t;
    try {
      t = time_kernel(*kernel, *st.timing, req.timing.max_reps, req.timing.max_seconds, req.timing.min_seconds);
    } catch (const cuda::CudaError& e) {
      auto r = with_resources(classify(e, Stage::kTiming));
      r.record.max_abs_err = rep.record.max_abs_err;
      r.record.err_bound = rep.record.err_bound;
      return r;
    }
    rep.record.status = "ok";
    rep.record.median_us = t.median_us;
    rep.record.min_us = t.min_us;
    rep.record.max_us = t.max_us;
    rep.record.stdev_us = t.stdev_us;
    rep.record.count = t.count;
    rep.record.tflops = req.problem.flops() / (t.median_us * 1e-6) / 1e12;
    return rep;
  }

  cuda::Context ctx_;
  cuda::DeviceProps props_;
  Reference reference_;
  std::unique_ptr<ProblemState> state_;
  bool poisoned_ = false;
};

}  // namespace

int run_gpu_worker(int device, int in_fd, int out_fd) {
  die_with_parent();
  const int out = take_protocol_fd(out_fd);
  std::unique_ptr<GpuWorker> w;
  try {
    w = std::make_unique<GpuWorker>(device);
    proto::write_frame(out, proto::hello_frame(w->device_info()));
  } catch (const proto::ProtocolError&) {
    return 1;  // the parent has gone
  } catch (const Error& e) {
    return fail_fatal(out, e.what(), static_cast<int>(e.code()));
  } catch (const std::exception& e) {
    return fail_fatal(out, fmt::format("internal: {}", e.what()), 1);
  }

  for (;;) {
    std::optional<proto::Frame> req;
    try {
      req = proto::read_frame(in_fd);
      if (!req) return 0;  // the parent closed the stream: done
      if (req->type() == "prepare") {
        double ref_us = 0;
        const proto::PrepareRequest prepare = proto::prepare_request(*req);
        try {
          ref_us = w->prepare(prepare);
        } catch (const cuda::CudaError& e) {
          const std::string hint =
              e.result() == CUDA_ERROR_OUT_OF_MEMORY ? w->out_of_memory_hint(prepare.problem) : std::string();
          return fail_fatal(out, fmt::format("cannot prepare the problem: {}{}", e.what(), hint),
                            e.sticky() ? kExitPoisoned : 1);
        }
        proto::write_frame(out, proto::prepared_frame(ref_us));
      } else if (req->type() == "eval") {
        proto::EvalReply rep;
        try {
          rep = w->evaluate(proto::eval_request(*req));
        } catch (const cuda::CudaError& e) {
          // Preparing the problem failed inside an eval (the parent prepares first; this is a fallback).
          return fail_fatal(out, fmt::format("cannot prepare the problem: {}", e.what()), e.sticky() ? kExitPoisoned : 1);
        }
        proto::write_frame(out, proto::to_frame(rep));
        if (w->poisoned()) return kExitPoisoned;
      } else {
        return fail_fatal(out, fmt::format("unknown request '{}'", req->type()), 1);
      }
    } catch (const proto::ProtocolError& e) {
      std::fprintf(stderr, "attntune worker: %s\n", e.what());
      return 1;
    } catch (const Error& e) {
      return fail_fatal(out, e.what(), static_cast<int>(e.code()));
    } catch (const std::exception& e) {
      return fail_fatal(out, fmt::format("internal: {}", e.what()), 1);
    }
  }
}

int run_build_worker(int in_fd, int out_fd) {
  die_with_parent();
  const int out = take_protocol_fd(out_fd);
  try {
    const std::optional<proto::Frame> f = proto::read_frame(in_fd);
    if (!f) return 0;
    const proto::BuildRequest req = proto::build_request(*f);
    const BuildRecord rec = build_source(req.source, req.program_name, req.arch, req.options);
    proto::write_frame(out, proto::to_frame(rec));
    return 0;
  } catch (const proto::ProtocolError& e) {
    std::fprintf(stderr, "attntune build-worker: %s\n", e.what());
    return 1;
  } catch (const Error& e) {
    return fail_fatal(out, e.what(), static_cast<int>(e.code()));
  } catch (const std::exception& e) {
    return fail_fatal(out, fmt::format("internal: {}", e.what()), 1);
  }
}

}  // namespace attntune
