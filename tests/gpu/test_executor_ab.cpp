// The tuner measures the code it ships: for one config of each family and entry point, the tuner's
// launch (LoadedBuild: the executor of templates/common/run_plan.h over the driver API, what the
// worker validates and times) and the exported library's (the same executor over the runtime API,
// flattened into the .cu, built with docs/CONTRACT.md's nvcc line and dlopen'ed) run the same
// config on the same inputs:
//   - ExecutorAbGpu: bit-identical outputs and LSE (each side also against itself, run to run),
//     both correct by the reference's criterion, and times within noise: CUDA graphs of the same
//     calls, replayed back to back in samples of >= 1 s, the two sides interleaved, three rounds;
//   - ExecutorGraphGpu: a kernel whose plan has a zeroed workspace (counters every launch leaves
//     at zero) captured in a CUDA graph on its first call, through each executor (so the
//     workspaces are made during the capture: run_plan.h's policy), replayed, checked, and a
//     direct call on the capture's stream after it.
// Each case prints one line (ExecutorAbGpu: both medians, their spread and ratio). Skips without a
// GPU; the flash_fwd_wgmma cases and the decode clusters need sm_90.
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "eval/attention_gpu.hpp"
#include "eval/compile.hpp"
#include "export/export.hpp"
#include "gpu_env.hpp"
#include "tests/unit/db/db_test_util.hpp"
#include "tests/unit/export/nvcc_util.hpp"

namespace test_executor_ab {
using namespace attntune;
using attntune::test::Shell;
using attntune::test::TempDir;

namespace {

// The exported library's entry points, as a host program declares them (stream as void*).
typedef int (*DenseFn)(const void*, const void*, const void*, void*, float*, int, int, int, int, int, int,
                       const long long*, const long long*, const long long*, const long long*, float, int, void*);
typedef int (*KvcacheFn)(const void*, const void*, const void*, void*, float*, const int*, const int*, int, int, int,
                         int, int, int, int, int, const long long*, const long long*, const long long*,
                         const long long*, float, int, void*);
typedef int (*VarlenPackedFn)(const void*, const void*, const void*, void*, float*, const int*, const int*, int,
                              long long, long long, int, int, int, int, int, const long long*, const long long*,
                              const long long*, const long long*, float, int, void*);

// An exported library, loaded for the rest of the process (static cudart inside: never unloaded).
struct Library {
  DenseFn dense = nullptr;
  KvcacheFn kvcache = nullptr;
  VarlenPackedFn varlen = nullptr;
  const char* (*last_error)() = nullptr;

  std::string load(const std::string& path) {
    void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) return ::dlerror();
    dense = reinterpret_cast<DenseFn>(::dlsym(h, "attntune_attention_forward"));
    kvcache = reinterpret_cast<KvcacheFn>(::dlsym(h, "attntune_attention_forward_kvcache"));
    varlen = reinterpret_cast<VarlenPackedFn>(::dlsym(h, "attntune_attention_forward_varlen_packed"));
    last_error = reinterpret_cast<const char* (*)()>(::dlsym(h, "attntune_last_error"));
    return dense && kvcache && varlen && last_error ? "" : "missing C symbols";
  }

  // `c` through the C entry point of its entry (varlen: the packed one, which takes the rows).
  int run(const attntune_plan::Call& c, CUstream stream) const {
    void* s = stream;
    if (c.entry == attntune_plan::kEntryKvcache)
      return kvcache(c.q, c.k, c.v, c.out, c.lse, c.cache_seqlens, c.block_table, c.max_blocks_per_seq, c.page_size,
                     c.batch, c.heads_q, c.heads_kv, c.seqlen_q, c.seqlen_k, c.head_dim, c.q_stride, c.k_stride,
                     c.v_stride, c.o_stride, c.scale, c.causal, s);
    if (c.entry == attntune_plan::kEntryVarlen) {
      const long long qs[2] = {c.q_stride[2], c.q_stride[1]}, ks[2] = {c.k_stride[2], c.k_stride[1]},
                      vs[2] = {c.v_stride[2], c.v_stride[1]}, os[2] = {c.o_stride[2], c.o_stride[1]};
      return varlen(c.q, c.k, c.v, c.out, c.lse, c.cu_seqlens_q, c.cu_seqlens_k, c.batch, c.total_q, c.total_k,
                    c.seqlen_q, c.seqlen_k, c.heads_q, c.heads_kv, c.head_dim, qs, ks, vs, os, c.scale, c.causal, s);
    }
    return dense(c.q, c.k, c.v, c.out, c.lse, c.batch, c.heads_q, c.heads_kv, c.seqlen_q, c.seqlen_k, c.head_dim,
                 c.q_stride, c.k_stride, c.v_stride, c.o_stride, c.scale, c.causal, s);
  }
};

struct Case {
  const char* name;
  const char* family;
  const char* problem;
  bool needs_sm90;
  std::function<bool(const Config&)> pick;  // the config to compare: the first valid one it accepts
};

bool flag(const Config& c, const char* name) { return std::get<bool>(c.at(name)); }
std::string choice(const Config& c, const char* name) { return std::get<std::string>(c.at(name)); }

// One config of each family and entry point: dense, kvcache paged, varlen, persistent, clusters.
const Case kCases[] = {
    {"flash_fwd_mma dense", "flash_fwd_mma", "b=4,h=16,hkv=4,s=2048,sk=2048,d=128,dtype=bf16,causal=1", false,
     [](const Config&) { return true; }},
    {"flash_fwd_mma kvcache paged", "flash_fwd_mma", "b=4,h=16,hkv=4,s=512,sk=4096,page=64,d=128,dtype=bf16,causal=1",
     false, [](const Config&) { return true; }},
    {"flash_fwd_wgmma varlen persistent", "flash_fwd_wgmma",
     "b=8,h=16,hkv=4,s=2048,sk=2048,varlen=1,d=128,dtype=bf16,causal=1", true,
     [](const Config& c) { return flag(c, "persistent"); }},
    {"flash_fwd_wgmma persistent clusters", "flash_fwd_wgmma", "b=4,h=16,s=4096,d=128,dtype=bf16,causal=0", true,
     [](const Config& c) { return flag(c, "persistent") && flag(c, "kv_multicast") && flag(c, "split_tail"); }},
    {"flash_decode kvcache paged clusters", "flash_decode", "b=8,h=32,hkv=8,s=1,sk=8192,page=64,d=128,dtype=bf16,causal=0",
     true, [](const Config& c) { return choice(c, "combine") == "cluster16"; }},
};

// Kernels whose plan has a zeroed workspace: the decode merge's counters (last CTA of each unit),
// the causal persistent tile counter.
const Case kGraphCases[] = {
    {"flash_decode last_cta", "flash_decode", "b=8,h=32,hkv=8,s=2,sk=4000,page=32,d=128,dtype=fp16,causal=1", false,
     [](const Config& c) { return choice(c, "combine") == "last_cta"; }},
    {"flash_fwd_wgmma causal persistent", "flash_fwd_wgmma", "b=2,h=16,hkv=8,s=1000,sk=1500,d=128,dtype=bf16,causal=1",
     true, [](const Config& c) { return flag(c, "persistent") && flag(c, "warp_specialize"); }},
};

// A case built both ways: the tuner's cubin (NVRTC, as the build workers make it) and the exported
// library (nvcc).
struct Built {
  const Case* c = nullptr;
  Problem problem;
  Config config;
  std::string arch;  // the build's: the device's, or its arch-specific variant (sm_90a)
  RenderedKernel kernel;
  BuildRecord cubin;
  std::string library;  // the .so
  std::future<Shell> nvcc;
};

// Renders, exports and builds every case that the device can run: the nvcc builds in parallel,
// the NVRTC builds meanwhile. Appends what it skipped to `skipped`.
std::vector<std::unique_ptr<Built>> build_all(const Case* cases, std::size_t n, const TempDir& dir,
                                              std::string* skipped) {
  const cuda::DeviceProps props = cuda::device_props(0);
  const std::string nvcc = attntune::test::find_nvcc();
  EXPECT_FALSE(nvcc.empty()) << "nvcc not found ($CUDACXX, $CUDA_HOME, PATH, /usr/local/cuda/bin)";
  std::vector<std::unique_ptr<Built>> out;
  if (nvcc.empty()) return out;
  for (std::size_t i = 0; i < n; ++i) {
    const Case& c = cases[i];
    if (c.needs_sm90 && props.arch != "sm_90") {
      *skipped += fmt::format(" [{}: needs sm_90, this GPU is {}]", c.name, props.arch);
      continue;
    }
    auto b = std::make_unique<Built>();
    b->c = &c;
    b->problem = Problem::parse(c.problem);
    auto space = std::make_shared<const SearchSpace>(
        SearchSpace::load(source_dir() + "/search_spaces/" + c.family + ".yaml"));
    const std::string arch = b->arch = space_arch_for_device(*space, props.arch);
    space->for_each_valid(b->problem, arch, [&](const Config& x) {
      if (b->config.empty() && c.pick(x)) b->config = x;
    });
    if (b->config.empty()) {
      ADD_FAILURE() << c.name << ": no valid config the case accepts for " << c.problem << " on " << arch;
      continue;
    }
    b->kernel = render_kernel(*space, b->config, b->problem, arch);
    BestRow row;
    row.campaign = "executor-ab";
    row.problem = b->problem;
    row.family = c.family;
    row.config = b->config;
    row.median_us = 1;
    row.tflops = 1;
    row.gpu = props.name;
    row.arch = props.arch;
    const std::string cu = dir.file(fmt::format("case{}.cu", i));
    {
      std::ofstream f(cu);
      f << export_source({ExportItem{row, space}}, ExportMode::kSingle);
    }
    b->library = dir.file(fmt::format("libcase{}.so", i));
    b->nvcc = std::async(std::launch::async, attntune::test::sh,
                         attntune::test::nvcc_shared_command(nvcc, arch, cu, b->library));
    out.push_back(std::move(b));
  }
  for (auto& b : out) b->cubin = build_kernel(b->kernel, b->arch, family_nvrtc_options(b->c->family));
  return out;
}

std::vector<unsigned char> download(const cuda::DeviceBuffer& b, std::size_t bytes) {
  std::vector<unsigned char> h(bytes);
  b.download(h.data(), bytes);
  return h;
}

// The output and LSE of the last call on `in`.
struct Result {
  std::vector<unsigned char> out, lse;
  bool operator==(const Result& o) const { return out == o.out && lse == o.lse; }
};
Result result_of(const AttnBuffers& in) {
  const std::size_t rows = in.out_rows();
  return {download(in.o, rows * static_cast<std::size_t>(in.problem.d) * 2), download(in.lse, rows * 4)};
}

// Microseconds per call of `graph` (`calls` calls) over `replays` replays back to back.
double sample_us(const cuda::Graph& graph, int calls, int replays, const cuda::Stream& s) {
  cuda::Event start, stop;
  start.record(s.get());
  for (int i = 0; i < replays; ++i) graph.launch(s.get());
  stop.record(s.get());
  stop.synchronize();
  return cuda::elapsed_ms(start, stop) * 1000.0 / (static_cast<double>(replays) * calls);
}

struct Samples {
  std::vector<double> us;
  double median() const {
    std::vector<double> s = us;
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
  }
  double spread() const {  // (max - min) / median
    return (*std::max_element(us.begin(), us.end()) - *std::min_element(us.begin(), us.end())) / median();
  }
};

constexpr int kGraphCalls = 20;        // calls per graph, as the worker and the PyTorch peers time
constexpr double kSampleSeconds = 1.0;  // each sample: >= 1 s of back-to-back replays
constexpr int kRounds = 3;             // tuner, export, tuner, export, ...

}  // namespace

TEST(ExecutorAbGpu, TheExportedAndTheTunersLaunchOfAConfigAgreeBitForBitAndInTime) {
  ATTNTUNE_REQUIRE_GPU();
  TempDir dir;
  std::string skipped;
  cuda::Context ctx(0);
  auto built = build_all(kCases, std::size(kCases), dir, &skipped);
  const Reference ref(cuda::device_props(0).arch);
  std::uint64_t seed = 500;
  for (auto& b : built) {
    const char* name = b->c->name;
    ASSERT_EQ(b->cubin.status, "ok") << name << ":\n" << b->cubin.log;
    const Shell nvcc = b->nvcc.get();
    ASSERT_EQ(nvcc.status, 0) << name << ": nvcc failed:\n" << nvcc.output;
    Library lib;
    ASSERT_EQ(lib.load(b->library), "") << name;
    const LoadedBuild tuner(b->cubin.cubin, b->kernel.launch);

    // The inputs the worker validates on first (a paged problem: ragged lengths; varlen: packed).
    auto inputs = validation_inputs(b->problem, ++seed);
    AttnBuffers& in = *inputs.front();
    ref.fill(in, seed);
    const attntune_plan::Call call = in.call();
    tuner.launch(call);
    ctx.synchronize();
    const Verdict tv = ref.check(in);
    EXPECT_EQ(tv.status, "ok") << name << " (tuner): " << tv.detail();
    const Result t1 = result_of(in);
    ref.poison_output(in);
    tuner.launch(call);
    ctx.synchronize();
    EXPECT_TRUE(result_of(in) == t1) << name << ": the tuner's launch differs from itself run to run";
    ref.poison_output(in);
    ctx.synchronize();
    ASSERT_EQ(lib.run(call, nullptr), 0) << name << ": " << lib.last_error();
    ctx.synchronize();
    const Verdict ev = ref.check(in);
    EXPECT_EQ(ev.status, "ok") << name << " (export): " << ev.detail();
    EXPECT_TRUE(result_of(in) == t1) << name << ": the exported launch's output or LSE differs from the tuner's";

    // Times: each side's calls in a CUDA graph on a stream of its own, samples interleaved.
    cuda::Stream ts, es;
    int rc = 0;
    const cuda::Graph tg(ts.get(), [&] {
      for (int i = 0; i < kGraphCalls; ++i) tuner.launch(call, ts.get());
    });
    const cuda::Graph eg(es.get(), [&] {
      for (int i = 0; i < kGraphCalls && rc == 0; ++i) rc = lib.run(call, es.get());
    });
    ASSERT_EQ(rc, 0) << name << " in a capture: " << lib.last_error();
    for (int i = 0; i < 5; ++i) {
      tg.launch(ts.get());
      eg.launch(es.get());
    }
    ctx.synchronize();
    const double probe = sample_us(tg, kGraphCalls, 10, ts);
    const int replays = static_cast<int>(std::ceil(kSampleSeconds * 1e6 / (probe * kGraphCalls)));
    Samples t, e;
    for (int r = 0; r < kRounds; ++r) {
      t.us.push_back(sample_us(tg, kGraphCalls, replays, ts));
      e.us.push_back(sample_us(eg, kGraphCalls, replays, es));
    }
    const double ratio = e.median() / t.median(), noise = std::max(t.spread(), e.spread());
    const double tolerance = std::max(0.02, 3 * noise);
    std::printf("%-40s tuner %9.2f us (spread %.2f%%)  export %9.2f us (spread %.2f%%)  export/tuner %.4f  [%s]\n",
                name, t.median(), 100 * t.spread(), e.median(), 100 * e.spread(), ratio,
                config_str(b->config).c_str());
    EXPECT_LE(std::abs(ratio - 1), tolerance)
        << name << ": export " << e.median() << " us vs tuner " << t.median() << " us, beyond the noise ("
        << 100 * noise << "% spread)";
    // The graphs' calls: still the same bits.
    ctx.synchronize();
    EXPECT_TRUE(result_of(in) == t1) << name << ": the graphs' output differs from the direct calls'";
  }
  if (!skipped.empty()) std::printf("skipped:%s\n", skipped.c_str());
}

TEST(ExecutorGraphGpu, AKernelCapturedOnItsFirstCallThroughEitherExecutorReplaysCorrectlyAndAlike) {
  ATTNTUNE_REQUIRE_GPU();
  TempDir dir;
  std::string skipped;
  cuda::Context ctx(0);
  auto built = build_all(kGraphCases, std::size(kGraphCases), dir, &skipped);
  const Reference ref(cuda::device_props(0).arch);
  std::uint64_t seed = 900;
  for (auto& b : built) {
    const char* name = b->c->name;
    ASSERT_EQ(b->cubin.status, "ok") << name << ":\n" << b->cubin.log;
    const Shell nvcc = b->nvcc.get();
    ASSERT_EQ(nvcc.status, 0) << name << ": nvcc failed:\n" << nvcc.output;
    Library lib;
    ASSERT_EQ(lib.load(b->library), "") << name;
    const LoadedBuild tuner(b->cubin.cubin, b->kernel.launch);
    auto inputs = validation_inputs(b->problem, ++seed);
    AttnBuffers& in = *inputs.front();
    ref.fill(in, seed);
    ctx.synchronize();
    const attntune_plan::Call call = in.call();

    // The first call of each executor, inside a capture on a stream no call has used.
    cuda::Stream ts, es;
    const cuda::Graph tg(ts.get(), [&] { tuner.launch(call, ts.get()); });
    int rc = -1;
    const cuda::Graph eg(es.get(), [&] { rc = lib.run(call, es.get()); });
    ASSERT_EQ(rc, 0) << name << ": the export in a capture: " << lib.last_error();
    Result first;
    for (int rep = 0; rep < 3; ++rep) {
      for (const auto& [graph, stream, who] :
           {std::tuple{&tg, &ts, "tuner"}, std::tuple{&eg, &es, "export"}}) {
        ref.poison_output(in);
        ctx.synchronize();
        graph->launch(stream->get());
        stream->synchronize();
        const Verdict v = ref.check(in);
        EXPECT_EQ(v.status, "ok") << name << ", " << who << "'s graph, replay " << rep << ": " << v.detail();
        const Result r = result_of(in);
        if (first.out.empty()) first = r;
        EXPECT_TRUE(r == first) << name << ", " << who << "'s graph, replay " << rep
                                << ": not the bits of the tuner's first replay";
      }
    }
    // A direct call on each capture's stream after it: the workspaces made in the capture serve it.
    ref.poison_output(in);
    ctx.synchronize();
    tuner.launch(call, ts.get());
    ts.synchronize();
    EXPECT_TRUE(result_of(in) == first) << name << ": the tuner's call after its graph";
    ref.poison_output(in);
    ctx.synchronize();
    ASSERT_EQ(lib.run(call, es.get()), 0) << lib.last_error();
    es.synchronize();
    EXPECT_TRUE(result_of(in) == first) << name << ": the export's call after its graph";
    std::printf("%-40s captured on the first call, 3 replays each, bit-identical  [%s]\n", name,
                config_str(b->config).c_str());
  }
  if (!skipped.empty()) std::printf("skipped:%s\n", skipped.c_str());
}
}  // namespace test_executor_ab
