#include "eval/attention_gpu.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "cuda/nvrtc.hpp"

namespace attntune {

namespace {

std::size_t rows_of(const Problem& p, bool kv) { return static_cast<std::size_t>(p.b) * (kv ? p.hkv : p.h) * (kv ? p.sk : p.s); }

void set_strides(long long* st, Layout layout, std::int64_t heads, std::int64_t len, std::int64_t d) {
  if (layout == Layout::kBHSD) {
    st[0] = heads * len * d; st[1] = len * d; st[2] = d;
  } else {
    st[0] = len * heads * d; st[1] = d; st[2] = heads * d;
  }
}

float as_float(unsigned bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace

const char* layout_name(Layout l) { return l == Layout::kBHSD ? "BHSD" : "BSHD"; }

AttnBuffers::AttnBuffers(const Problem& p, Layout l)
    : problem(p),
      layout(l),
      q(rows_of(p, false) * p.d * 2),
      k(rows_of(p, true) * p.d * 2),
      v(rows_of(p, true) * p.d * 2),
      o(rows_of(p, false) * p.d * 2),
      lse(rows_of(p, false) * sizeof(float)) {}

AttnParams AttnBuffers::params() const {
  AttnParams a{};
  a.q = reinterpret_cast<const void*>(q.ptr());
  a.k = reinterpret_cast<const void*>(k.ptr());
  a.v = reinterpret_cast<const void*>(v.ptr());
  a.o = reinterpret_cast<void*>(o.ptr());
  a.lse = reinterpret_cast<float*>(lse.ptr());
  set_strides(a.q_stride, layout, problem.h, problem.s, problem.d);
  set_strides(a.k_stride, layout, problem.hkv, problem.sk, problem.d);
  set_strides(a.v_stride, layout, problem.hkv, problem.sk, problem.d);
  set_strides(a.o_stride, layout, problem.h, problem.s, problem.d);
  a.batch = static_cast<int>(problem.b);
  a.heads_q = static_cast<int>(problem.h);
  a.heads_kv = static_cast<int>(problem.hkv);
  a.seqlen_q = static_cast<int>(problem.s);
  a.seqlen_k = static_cast<int>(problem.sk);
  a.q_per_kv = static_cast<int>(problem.h / problem.hkv);
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(problem.d)));
  a.scale_log2 = static_cast<float>(a.scale * 1.4426950408889634);
  return a;
}

double criterion_atol(DType t) {
  // FA3's test tolerance: twice the rounding error of the dtype near 0.3 (outputs are O(1)).
  return t == DType::kBf16 ? 1.0 / 512 : 1.0 / 4096;
}

std::string Verdict::detail() const {
  return fmt::format("{}: max|out-ref|={:.3g} bound={:.3g} (2 x same-dtype error {:.3g} + atol), lse error {:.3g}, "
                     "{} non-finite outputs, {} LSE mismatches",
                     status, max_abs_err, err_bound, lowp_err, lse_err, nonfinite, lse_mismatch);
}

Reference::Reference(const std::string& arch) {
  cuda::CompileOptions opts;
  opts.arch = arch;
  opts.extra = {"-std=c++17"};
  auto out = cuda::nvrtc_compile(flatten_includes("templates/reference/reference.cu"), "reference.cu", opts);
  if (!out.ok) throw std::logic_error("the reference kernels do not compile:\n" + out.log);
  module_ = cuda::Module(out.cubin);
  fill_ = module_.function("fill_normal");
  ref_ = module_.function("attn_reference");
  compare_ = module_.function("compare_outputs");
}

void Reference::fill(AttnBuffers& b, std::uint64_t seed) const {
  int bf16 = b.problem.dtype == DType::kBf16;
  cuda::DeviceBuffer* bufs[3] = {&b.q, &b.k, &b.v};
  for (int i = 0; i < 3; ++i) {
    CUdeviceptr ptr = bufs[i]->ptr();
    long long n = static_cast<long long>(bufs[i]->bytes() / 2);
    unsigned long long s = seed * 3 + i + 1;
    void* args[] = {&ptr, &n, &s, &bf16};
    cuda::launch(fill_, {1024, 1, 1}, {256, 1, 1}, 0, nullptr, args);
  }
  poison_output(b);
}

void Reference::poison_output(AttnBuffers& b) const {
  b.o.fill_u16(0xFFFF);   // NaN in fp16 and bf16
  b.lse.fill_u32(0x7FC00000u);  // NaN
}

std::vector<float> Reference::output(const AttnBuffers& b, bool lowp_flag, std::vector<float>* lse) const {
  const Problem& p = b.problem;
  AttnParams a = b.params();
  const std::size_t rows = rows_of(p, false);
  cuda::DeviceBuffer out(rows * p.d * 4), lse_buf(rows * 4);
  int d = static_cast<int>(p.d), bf16 = p.dtype == DType::kBf16, causal = p.causal, lowp = lowp_flag;
  CUdeviceptr o = out.ptr(), l = lse_buf.ptr();
  void* args[] = {&a, &d, &bf16, &causal, &lowp, &o, &l};
  cuda::launch(ref_, {static_cast<unsigned>((p.s + 7) / 8), static_cast<unsigned>(p.h), static_cast<unsigned>(p.b)},
               {256, 1, 1}, 0, nullptr, args);
  std::vector<float> host(rows * p.d);
  out.download(host.data(), host.size() * 4);
  if (lse) {
    lse->resize(rows);
    lse_buf.download(lse->data(), rows * 4);
  }
  return host;
}

Verdict Reference::check(const AttnBuffers& b) const { return ReferenceCache(*this, b, false).check(b); }

ReferenceCache::ReferenceCache(const Reference& ref, const AttnBuffers& b, bool keep_host_copy)
    : ref_(&ref), problem_(b.problem) {
  const Problem& p = b.problem;
  AttnParams a = b.params();
  const std::size_t rows = rows_of(p, false);
  out32_ = cuda::DeviceBuffer(rows * p.d * 4);
  outlow_ = cuda::DeviceBuffer(rows * p.d * 4);
  lse32_ = cuda::DeviceBuffer(rows * 4);
  stats_ = cuda::DeviceBuffer(32);
  cuda::DeviceBuffer lselow(rows * 4);
  int d = static_cast<int>(p.d), bf16 = p.dtype == DType::kBf16, causal = p.causal;
  cuda::Event start, stop;
  for (int lowp = 0; lowp < 2; ++lowp) {
    CUdeviceptr o = lowp ? outlow_.ptr() : out32_.ptr(), l = lowp ? lselow.ptr() : lse32_.ptr();
    void* args[] = {&a, &d, &bf16, &causal, &lowp, &o, &l};
    if (!lowp) start.record();
    cuda::launch(ref.ref_, {static_cast<unsigned>((p.s + 7) / 8), static_cast<unsigned>(p.h), static_cast<unsigned>(p.b)},
                 {256, 1, 1}, 0, nullptr, args);
    if (!lowp) stop.record();
  }
  stop.synchronize();
  reference_us_ = cuda::elapsed_ms(start, stop) * 1000.0;
  if (keep_host_copy) {
    host_out32_.resize(rows * p.d);
    host_outlow_.resize(rows * p.d);
    host_lse32_.resize(rows);
    out32_.download(host_out32_.data(), host_out32_.size() * 4);
    outlow_.download(host_outlow_.data(), host_outlow_.size() * 4);
    lse32_.download(host_lse32_.data(), host_lse32_.size() * 4);
  }
}

void ReferenceCache::restore() {
  if (host_out32_.empty()) throw std::logic_error("ReferenceCache::restore without a host copy");
  out32_.upload(host_out32_.data(), host_out32_.size() * 4);
  outlow_.upload(host_outlow_.data(), host_outlow_.size() * 4);
  lse32_.upload(host_lse32_.data(), host_lse32_.size() * 4);
}

Verdict ReferenceCache::check(const AttnBuffers& b) const {
  const Problem& p = b.problem;
  if (!(p == problem_))
    throw std::logic_error(fmt::format("ReferenceCache for {} asked to check {}", problem_.str(), p.str()));
  AttnParams a = b.params();
  int d = static_cast<int>(p.d), bf16 = p.dtype == DType::kBf16;
  CUdeviceptr o32 = out32_.ptr(), olow = outlow_.ptr(), l32 = lse32_.ptr(), st = stats_.ptr();
  CUdeviceptr counts = st + 16;
  stats_.fill_u32(0);
  void* cargs[] = {&a, &d, &bf16, &o32, &olow, &l32, &st, &counts};
  cuda::launch(ref_->compare_, {256, 1, 1}, {32, 8, 1}, 0, nullptr, cargs);
  unsigned host[8];
  stats_.download(host, sizeof host);
  Verdict v;
  v.max_abs_err = as_float(host[0]);
  v.lowp_err = as_float(host[1]);
  v.lse_err = as_float(host[2]);
  v.nonfinite = host[4];
  v.lse_mismatch = host[5];
  v.err_bound = 2 * v.lowp_err + criterion_atol(p.dtype);
  if (v.nonfinite) v.status = "nan_or_unwritten";
  else if (v.max_abs_err > v.err_bound || v.lse_mismatch || v.lse_err > kLseTolerance) v.status = "wrong_result";
  else v.status = "ok";
  return v;
}

namespace {

// What flash_fwd_wgmma takes after AttnParams (templates/flash_fwd_wgmma/kernel.cu, TmaMaps).
struct TmaMaps {
  CUtensorMap q, k, v;
  float* split_ws;  // split_tail's workspace, counters and tail tile count (0: no split)
  int* split_count;
  int split_tail;
  int* tile_count;  // dynamic_tiles' counters (null: round-robin)
};

// One operand as a 4-d tensor (head_dim, seqlen, heads, batch) with the params' strides (in
// elements; bytes here), box (64, rows), 128-byte swizzle, zeros past the ends (odd lengths).
CUtensorMap encode_tensor_map(const void* base, const long long* stride, int len, int heads, int batch, unsigned rows,
                              const TmaSpec& t) {
  CUtensorMap m;
  const cuuint64_t dims[4] = {t.head_dim, static_cast<cuuint64_t>(len), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(stride[2]) * 2, static_cast<cuuint64_t>(stride[1]) * 2,
                                 static_cast<cuuint64_t>(stride[0]) * 2};
  const cuuint32_t box[4] = {64, rows, 1, 1}, elem[4] = {1, 1, 1, 1};
  CU_CHECK(cuda::driver().cuTensorMapEncodeTiled(
      &m, t.bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, const_cast<void*>(base), dims,
      strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return m;
}

// How many clusters of a persistent kernel fit on the device at once, for its grid of whole
// clusters; 0 (persistent_ctas then counts the SMs alone) when the driver cannot say, or says 0 (a
// kernel built without the cluster dims its geometry names: its launch would show why).
unsigned max_active_clusters(const cuda::Function& fn, const LaunchGeometry& g, unsigned sm_count) {
  try {
    const int n = fn.max_active_clusters({sm_count / g.cluster * g.cluster, 1, 1}, static_cast<int>(g.block),
                                         g.smem_bytes);
    return n > 0 ? static_cast<unsigned>(n) : 0;
  } catch (const cuda::CudaError& e) {
    if (e.sticky()) throw;
    return 0;
  }
}

}  // namespace

LoadedKernel::LoadedKernel(const std::string& cubin, const std::string& name, const LaunchGeometry& geometry)
    : module_(cubin), fn_(module_.function(name)), geometry_(geometry) {
  if (geometry_.smem_bytes > 48 * 1024) fn_.set_max_dynamic_smem(static_cast<int>(geometry_.smem_bytes));
  if (geometry_.persistent) {
    CUdevice dev;
    int sms = 0;
    CU_CHECK(cuda::driver().cuCtxGetDevice(&dev));
    CU_CHECK(cuda::driver().cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    sm_count_ = static_cast<unsigned>(sms);
    if (geometry_.cluster > 1) max_clusters_ = max_active_clusters(fn_, geometry_, sm_count_);
  }
}

void LoadedKernel::launch(const AttnParams& p, unsigned grid_x, CUstream stream) const {
  AttnParams copy = p;
  cuda::Dim3 grid{grid_x, static_cast<unsigned>(p.heads_q), static_cast<unsigned>(p.batch)};
  // A persistent kernel walks the work tiles itself: (grid_x padded to whole clusters, h, b).
  const unsigned long long tiles = persistent_work_tiles(grid_x, grid.y, grid.z, geometry_.cluster);
  if (geometry_.persistent) grid = {persistent_ctas(tiles, sm_count_, max_clusters_, geometry_.cluster), 1, 1};
  const TmaSpec& t = geometry_.tma;
  if (t.q_rows == 0) {
    void* args[] = {&copy};
    cuda::launch(fn_, grid, {geometry_.block, 1, 1}, geometry_.smem_bytes, stream, args);
    return;
  }
  TmaMaps maps{};
  // Workspace is grown outside a stream capture only (it would fail there; the evaluator launches
  // once before it captures); a launch without it runs unsplit, or round-robin, as correct.
  // Counters are zeroed in stream order, before this launch.
  auto ensure = [&](cuda::DeviceBuffer& b, std::size_t bytes, bool counters) {
    if (b.bytes() < bytes) {
      CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
      CU_CHECK(cuda::driver().cuStreamIsCapturing(stream, &status));
      if (status == CU_STREAM_CAPTURE_STATUS_NONE) {
        b = cuda::DeviceBuffer(bytes);
        if (counters) b.fill_u32_async(0, stream);
      }
    }
    return b.bytes() >= bytes;
  };
  if (geometry_.dynamic_tiles && ensure(tile_count_, 2 * sizeof(int), true))
    maps.tile_count = reinterpret_cast<int*>(tile_count_.ptr());
  if (geometry_.split_tail) {
    const unsigned tail = split_tail_tiles(tiles, grid.x, (p.seqlen_k + t.kv_rows - 1) / t.kv_rows);
    if (tail > 0) {
      const bool ws = ensure(split_ws_, split_workspace_floats(grid.x, geometry_.consumer_warps, t.head_dim) * sizeof(float), false);
      const bool cnt = ensure(split_count_, split_counters(tail, geometry_.consumer_warps) * sizeof(int), true);
      if (ws && cnt) {
        maps.split_ws = reinterpret_cast<float*>(split_ws_.ptr());
        maps.split_count = reinterpret_cast<int*>(split_count_.ptr());
        maps.split_tail = static_cast<int>(tail);
      }
    }
  }
  maps.q = encode_tensor_map(p.q, p.q_stride, p.seqlen_q, p.heads_q, p.batch, t.q_rows, t);
  maps.k = encode_tensor_map(p.k, p.k_stride, p.seqlen_k, p.heads_kv, p.batch, t.kv_rows, t);
  maps.v = encode_tensor_map(p.v, p.v_stride, p.seqlen_k, p.heads_kv, p.batch, t.kv_rows, t);
  void* args[] = {&copy, &maps};
  cuda::launch(fn_, grid, {geometry_.block, 1, 1}, geometry_.smem_bytes, stream, args);
}

void LoadedKernel::launch(const AttnBuffers& b) const { launch(b.params(), geometry_.grid[0]); }

TimingInputs::TimingInputs(const Reference& ref, const Problem& p, std::uint64_t seed) : buffers_(p, Layout::kBHSD) {
  ref.fill(buffers_, seed);
}

TimingStats time_kernel(const LoadedKernel& k, const Reference& ref, const Problem& p, std::uint64_t seed, int max_reps,
                        double max_seconds, double min_seconds) {
  return time_kernel(k, TimingInputs(ref, p, seed), max_reps, max_seconds, min_seconds);
}

TimingStats time_kernel(const LoadedKernel& k, const TimingInputs& inputs, int max_reps, double max_seconds,
                        double min_seconds) {
  // Timed as PyTorch's peers and tools/compare_sdpa.py time a kernel, so the tuner's numbers, the
  // exported kernel's and SDPA's compare: launches captured in one CUDA graph; a sample is one
  // replay between two events, divided by the launches in it; replays first for ~50 ms, so the
  // clocks settle where they stay under back-to-back load. No CPU work between launches: launched
  // one by one from the host, a 5 µs kernel measured its launch cost (15-20% slower than the same
  // kernel exported and timed by graph replay, H100 2026-11-22), and synchronised launches let
  // the GPU boost between them. The peers capture 20 calls; a long kernel gets fewer (at least 2,
  // a replay >= ~1 ms), which amortises the replay's own few µs as well and keeps a candidate's
  // timing short.
  constexpr int kMaxGraphCalls = 20;   // compare_sdpa.py --calls, sdpa_peers.py's default
  constexpr double kWarmUpUs = 50e3;
  const AttnParams params = inputs.buffers().params();
  const unsigned grid_x = k.geometry().grid[0];
  cuda::Stream stream;
  cuda::Event start, stop;
  // Launch errors (bad geometry, too much shared memory) show here, before any capture.
  k.launch(params, grid_x, stream.get());
  start.record(stream.get());
  for (int i = 0; i < 3; ++i) k.launch(params, grid_x, stream.get());
  stop.record(stream.get());
  stop.synchronize();
  const double one_us = std::max(1e-3, cuda::elapsed_ms(start, stop) * 1000.0 / 3);
  const int calls = static_cast<int>(std::clamp(std::ceil(1000.0 / one_us), 2.0, double(kMaxGraphCalls)));
  const cuda::Graph graph(stream.get(), [&] {
    for (int i = 0; i < calls; ++i) k.launch(params, grid_x, stream.get());
  });
  const int warm_replays = static_cast<int>(std::clamp(std::ceil(kWarmUpUs / (one_us * calls)), 3.0, 1000.0));
  for (int i = 0; i < warm_replays; ++i) graph.launch(stream.get());
  stream.synchronize();

  std::vector<double> times;
  const auto t0 = std::chrono::steady_clock::now();
  double last_median = -1;
  for (;;) {
    for (int r = 0; r < 5; ++r) {
      start.record(stream.get());
      graph.launch(stream.get());
      stop.record(stream.get());
      stop.synchronize();
      times.push_back(cuda::elapsed_ms(start, stop) * 1000.0 / calls);
    }
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const bool stable = times.size() >= 10 && last_median > 0 && std::abs(median - last_median) <= 0.01 * median;
    // max_seconds bounds it all; below min_seconds it goes on whatever the samples say.
    if (elapsed > max_seconds) break;
    if (elapsed >= min_seconds && (stable || static_cast<int>(times.size()) >= max_reps)) break;
    last_median = median;
  }
  std::sort(times.begin(), times.end());
  TimingStats st;
  st.count = static_cast<int>(times.size());
  st.median_us = times[times.size() / 2];
  st.min_us = times.front();
  st.max_us = times.back();
  double mean = 0;
  for (double t : times) mean += t;
  mean /= times.size();
  double var = 0;
  for (double t : times) var += (t - mean) * (t - mean);
  st.stdev_us = std::sqrt(var / times.size());
  return st;
}

}  // namespace attntune
