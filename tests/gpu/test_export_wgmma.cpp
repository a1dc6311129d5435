// Exported flash_fwd_wgmma kernels on the GPU: configs recorded in a database as tune records them
// (tests/unit/export/export_db.hpp), exported by the binary, each built with docs/CONTRACT.md's command
// line for sm_90a into a shared library, dlopen'ed, and attntune_attention_forward checked against
// the tuner's reference (tuner/eval: fp32 and same-dtype references, FA2's criterion, NaN-poisoned
// output and LSE) on odd lengths, sk != s both ways, GQA/MQA, [B,S,H,D] strides, causal rows that
// see no key and several work tiles per persistent CTA; plus LSE NULL, seqlen_k 0, and calls TMA
// cannot take (unaligned strides and bases: ATTNTUNE_UNSUPPORTED). Persistent (also in 2-CTA
// clusters) and per-tile grids, with and without a producer warpgroup, fp16 and bf16, d=64, 128 and 256. Skips without a GPU, and on
// GPUs without sm_90a.
#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <future>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "eval/attention_gpu.hpp"
#include "gpu_env.hpp"
#include "tests/common/run_attntune.hpp"
#include "tests/unit/db/db_test_util.hpp"
#include "tests/unit/export/export_db.hpp"
#include "tests/unit/export/nvcc_util.hpp"

namespace test_export_wgmma {
using namespace attntune;
using attntune::test::ExportDb;
using attntune::test::sh;
using attntune::test::Shell;
using attntune::test::shq;
using attntune::test::TempDir;
using attntune::testing::run_attntune;

namespace {

typedef int (*ForwardFn)(const void*, const void*, const void*, void*, float*, int, int, int, int, int, int,
                         const long long*, const long long*, const long long*, const long long*, float, int, void*);

// An exported library, loaded for the rest of the process (static cudart inside: never unloaded).
struct Library {
  ForwardFn forward = nullptr;
  const char* (*info)() = nullptr;
  const char* (*last_error)() = nullptr;
  std::string load(const std::string& path) {
    void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) return ::dlerror();
    forward = reinterpret_cast<ForwardFn>(::dlsym(h, "attntune_attention_forward"));
    info = reinterpret_cast<const char* (*)()>(::dlsym(h, "attntune_kernel_info"));
    last_error = reinterpret_cast<const char* (*)()>(::dlsym(h, "attntune_last_error"));
    return forward && info && last_error ? "" : "missing C symbols";
  }
  // The call on AttnParams' pointers and strides (lse as given: NULL or another buffer).
  int call(const AttnParams& a, float* lse, int d, int causal, CUstream stream = nullptr) const {
    return forward(a.q, a.k, a.v, a.o, lse, a.batch, a.heads_q, a.heads_kv, a.seqlen_q, a.seqlen_k, d, a.q_stride,
                   a.k_stride, a.v_stride, a.o_stride, a.scale, causal, stream);
  }
};

struct Export {
  const char* campaign;
  std::string problem;                         // tuned problem: d, dtype, causal of the kernel
  std::map<std::string, std::int64_t> config;  // values the recorded config must have
};

const Export kExports[] = {
    // Persistent grid, producer warpgroup, ping-pong and overlap, the last partial round split by
    // K/V iterations (the 256- and 960-tile shapes below leave 124 and 36 tiles for it).
    {"wg-d128-bf16-persistent", "b=4,h=16,s=4096,d=128,dtype=bf16,causal=0",
     {{"block_m", 128}, {"block_n", 128}, {"stages", 2}, {"warp_specialize", 1}, {"ping_pong", 1},
      {"intra_wg_overlap", 1}, {"persistent", 1}, {"narrow_n", 64}, {"split_tail", 1}, {"kv_multicast", 0}}},
    // The same in 2-CTA clusters sharing each K/V load (kv_multicast): the grid whole clusters, as
    // many as fit at once; the query blocks padded to pairs (the shapes' odd block counts leave
    // idle ghost tiles); the split tail over clusters.
    {"wg-d128-bf16-multicast", "b=4,h=16,s=4096,d=128,dtype=bf16,causal=0",
     {{"block_m", 128}, {"block_n", 128}, {"stages", 2}, {"warp_specialize", 1}, {"ping_pong", 1},
      {"intra_wg_overlap", 1}, {"persistent", 1}, {"narrow_n", 64}, {"split_tail", 1}, {"kv_multicast", 1}}},
    // Causal persistent: work tiles from the counter (the 256+-tile shape below gives each CTA
    // several, the sk < s one tiles without keys), longest first in head groups of 4.
    {"wg-d128-bf16-causal-persistent", "b=4,h=16,s=4096,d=128,dtype=bf16,causal=1",
     {{"block_m", 128}, {"block_n", 128}, {"stages", 2}, {"warp_specialize", 1}, {"ping_pong", 1},
      {"intra_wg_overlap", 1}, {"persistent", 1}, {"head_group", 4}, {"narrow_n", 64}}},
    // Causal, per-tile grid, three consumer warpgroups in a
    // ping-pong ring, tiles in head groups of 4, warpgroups trimmed past their diagonal, narrow
    // first tiles (the diagonal of every other warpgroup, the odd lengths' ragged ends), lazy
    // rescale.
    {"wg-d64-fp16-causal", "b=8,h=16,s=2048,d=64,dtype=fp16,causal=1",
     {{"block_m", 192}, {"block_n", 128}, {"warp_specialize", 1}, {"ping_pong", 1}, {"intra_wg_overlap", 1},
      {"persistent", 0}, {"head_group", 4}, {"narrow_n", 64}, {"lazy_rescale", 8}}},
    // No producer warpgroup (consumer thread 0 issues the copies), per-tile grid.
    {"wg-d128-fp16-plain", "b=2,h=8,s=1024,d=128,dtype=fp16,causal=0",
     {{"block_m", 64}, {"warp_specialize", 0}, {"persistent", 0}}},
    // Persistent with three consumer warpgroups, d=64.
    {"wg-d64-bf16-persistent", "b=8,h=16,s=2048,d=64,dtype=bf16,causal=0",
     {{"block_m", 192}, {"warp_specialize", 1}, {"persistent", 1}, {"split_tail", 0}, {"kv_multicast", 0}}},
    // d=256: four 64-column blocks per row in every TMA copy, O across 128 registers a thread;
    // causal, persistent (the counter), ping-pong and overlap.
    {"wg-d256-fp16-causal-persistent", "b=4,h=8,s=4096,d=256,dtype=fp16,causal=1",
     {{"block_m", 128}, {"block_n", 64}, {"warp_specialize", 1}, {"ping_pong", 1}, {"intra_wg_overlap", 1},
      {"persistent", 1}}},
};

struct Shape {
  const char* dims;  // b,h,hkv,s,sk
  Layout layout;
};
const Shape kShapes[] = {
    {"b=1,h=2,s=1,sk=1", Layout::kBHSD},                 // one row
    {"b=2,h=3,s=200,sk=333", Layout::kBHSD},             // odd lengths, sk > s
    {"b=2,h=4,hkv=2,s=517,sk=77", Layout::kBSHD},        // sk < s (causal: rows that see no key), GQA
    {"b=1,h=4,hkv=1,s=300,sk=1000", Layout::kBSHD},      // MQA, sk > s
    {"b=2,h=3,s=77,sk=300", Layout::kBHSD},              // s shorter than a block
    {"b=2,h=16,hkv=8,s=1000,sk=1500", Layout::kBSHD},    // 256+ work tiles: several per persistent CTA
    {"b=3,h=40,hkv=8,s=1000,sk=1000", Layout::kBHSD},    // 360+ work tiles
};

std::vector<std::uint16_t> download16(const cuda::DeviceBuffer& b) {
  std::vector<std::uint16_t> h(b.bytes() / 2);
  b.download(h.data(), b.bytes());
  return h;
}
std::vector<float> download32(const cuda::DeviceBuffer& b) {
  std::vector<float> h(b.bytes() / 4);
  b.download(h.data(), b.bytes());
  return h;
}

// Every check of one exported kernel; failures are gtest failures naming the kernel and the shape.
void check_library(const Library& lib, const Reference& ref, const cuda::Context& ctx, const Problem& tuned,
                   std::uint64_t& seed) {
  const int d = static_cast<int>(tuned.d), causal = tuned.causal ? 1 : 0;
  const std::string kernel = tuned.str();
  for (const Shape& sh : kShapes) {
    const Problem p = Problem::parse(
        fmt::format("{},d={},dtype={},causal={}", sh.dims, d, dtype_name(tuned.dtype), causal));
    AttnBuffers buf(p, sh.layout);
    ref.fill(buf, ++seed);  // random inputs; output and LSE poisoned with NaN
    const AttnParams a = buf.params();
    const int rc = lib.call(a, a.lse, d, causal);
    ASSERT_EQ(rc, 0) << kernel << " on " << p.str() << ": " << lib.last_error();
    ctx.synchronize();
    const Verdict v = ref.check(buf);
    EXPECT_EQ(v.status, "ok") << kernel << " on " << p.str() << " " << layout_name(sh.layout) << ": " << v.detail();
  }

  // LSE NULL: the same output bit for bit, and the LSE buffer left alone.
  {
    const Problem p = Problem::parse(fmt::format("b=2,h=4,hkv=2,s=333,sk=517,d={},dtype={},causal={}", d,
                                                 dtype_name(tuned.dtype), causal));
    AttnBuffers buf(p, Layout::kBSHD);
    ref.fill(buf, ++seed);
    const AttnParams a = buf.params();
    ASSERT_EQ(lib.call(a, a.lse, d, causal), 0) << lib.last_error();
    ctx.synchronize();
    const std::vector<std::uint16_t> with_lse = download16(buf.o);
    ref.poison_output(buf);
    ASSERT_EQ(lib.call(a, nullptr, d, causal), 0) << lib.last_error();
    ctx.synchronize();
    EXPECT_TRUE(download16(buf.o) == with_lse) << kernel << ": the output differs when lse is NULL";
    for (float x : download32(buf.lse)) {
      ASSERT_TRUE(std::isnan(x)) << kernel << ": lse was written though NULL was passed";
    }
  }

  // No keys: k and v NULL; every row outputs zeros and LSE -inf.
  {
    const Problem p = Problem::parse(
        fmt::format("b=2,h=4,s=130,d={},dtype={},causal={}", d, dtype_name(tuned.dtype), causal));
    AttnBuffers buf(p, Layout::kBHSD);
    ref.fill(buf, ++seed);
    AttnParams a = buf.params();
    a.k = a.v = nullptr;
    a.seqlen_k = 0;
    ASSERT_EQ(lib.call(a, a.lse, d, causal), 0) << kernel << ": " << lib.last_error();
    ctx.synchronize();
    for (std::uint16_t x : download16(buf.o)) {
      ASSERT_EQ(x, 0u) << kernel << ", seqlen_k 0: an output is not zero";
    }
    for (float x : download32(buf.lse)) {
      ASSERT_TRUE(std::isinf(x) && x < 0) << kernel << ", seqlen_k 0: an LSE is " << x;
    }
  }

  // Streams and graphs: persistent grids keep counters (split_tail's, the causal tile counter)
  // per stream. Two streams at once, each on its own inputs, several work tiles per CTA; then a
  // graph captured on a stream no call has used (as PyTorch captures), replayed, and a direct call
  // on that stream after it (its counters were made during the capture).
  {
    const Problem p = Problem::parse(fmt::format("b=2,h=16,hkv=8,s=1000,sk=1500,d={},dtype={},causal={}", d,
                                                 dtype_name(tuned.dtype), causal));
    std::vector<AttnBuffers> bufs;
    bufs.reserve(3);
    for (int i = 0; i < 3; ++i) {
      bufs.emplace_back(p, Layout::kBHSD);
      ref.fill(bufs.back(), ++seed);
    }
    ctx.synchronize();  // fill and poison run on the default stream; the calls below on others
    cuda::Stream s0, s1, s2;
    for (int rep = 0; rep < 3; ++rep) {  // overlapping launches, counters reused
      ASSERT_EQ(lib.call(bufs[0].params(), bufs[0].params().lse, d, causal, s0.get()), 0) << lib.last_error();
      ASSERT_EQ(lib.call(bufs[1].params(), bufs[1].params().lse, d, causal, s1.get()), 0) << lib.last_error();
    }
    ctx.synchronize();
    for (int i = 0; i < 2; ++i) {
      const Verdict v = ref.check(bufs[i]);
      EXPECT_EQ(v.status, "ok") << kernel << ", stream " << i << " of two at once: " << v.detail();
    }
    const AttnParams a = bufs[2].params();
    int rc = -1;
    cuda::Graph graph(s2.get(), [&] { rc = lib.call(a, a.lse, d, causal, s2.get()); });
    ASSERT_EQ(rc, 0) << kernel << " in a stream capture: " << lib.last_error();
    for (int rep = 0; rep < 2; ++rep) {
      ref.poison_output(bufs[2]);
      ctx.synchronize();
      graph.launch(s2.get());
      s2.synchronize();
      const Verdict v = ref.check(bufs[2]);
      EXPECT_EQ(v.status, "ok") << kernel << ", graph replay " << rep << ": " << v.detail();
    }
    ref.poison_output(bufs[2]);
    ctx.synchronize();
    ASSERT_EQ(lib.call(a, a.lse, d, causal, s2.get()), 0) << lib.last_error();
    s2.synchronize();
    const Verdict v = ref.check(bufs[2]);
    EXPECT_EQ(v.status, "ok") << kernel << ", a call on the capture's stream after it: " << v.detail();
  }

  // What TMA cannot take, or the kernel was not built for: ATTNTUNE_UNSUPPORTED and a reason, no
  // launch; the next valid call still works.
  {
    const Problem p = Problem::parse(
        fmt::format("b=2,h=4,s=256,d={},dtype={},causal={}", d, dtype_name(tuned.dtype), causal));
    AttnBuffers buf(p, Layout::kBHSD);
    ref.fill(buf, ++seed);
    const AttnParams good = buf.params();
    AttnParams a = good;
    a.k_stride[2] = d + 4;  // K's rows 8 bytes off 16-byte alignment: refused before any launch
    EXPECT_EQ(lib.call(a, a.lse, d, causal), 1000) << kernel;
    EXPECT_NE(std::string(lib.last_error()).find("multiple of 8 elements"), std::string::npos) << lib.last_error();
    a = good;
    a.q = static_cast<const char*>(a.q) + 8;
    EXPECT_EQ(lib.call(a, a.lse, d, causal), 1000) << kernel;
    EXPECT_NE(std::string(lib.last_error()).find("16-byte aligned"), std::string::npos) << lib.last_error();
    EXPECT_EQ(lib.call(good, good.lse, d == 64 ? 128 : 64, causal), 1000) << kernel;
    EXPECT_EQ(lib.call(good, good.lse, d, 1 - causal), 1000) << kernel;
    ASSERT_EQ(lib.call(good, good.lse, d, causal), 0) << lib.last_error();
    ctx.synchronize();
    const Verdict v = ref.check(buf);
    EXPECT_EQ(v.status, "ok") << kernel << " after refused calls: " << v.detail();
  }
}

TEST(ExportWgmmaGpu, ExportedKernelsMatchTheReference) {
  ATTNTUNE_REQUIRE_GPU();
  cuda::Context ctx(0);
  const auto props = cuda::device_props(0);
  if (props.arch != "sm_90") GTEST_SKIP() << "flash_fwd_wgmma needs sm_90a (Hopper); this GPU is " << props.arch;
  const std::string nvcc = attntune::test::find_nvcc();
  ASSERT_FALSE(nvcc.empty()) << "nvcc not found ($CUDACXX, $CUDA_HOME, PATH, /usr/local/cuda/bin)";

  TempDir dir;
  const std::string db = dir.file("wg.db");
  {
    ExportDb edb(db, source_dir());
    for (const Export& e : kExports)
      edb.campaign("flash_fwd_wgmma", e.campaign, e.problem, {edb.config("flash_fwd_wgmma", e.problem, e.config)},
                   {500.0});
  }
  // Export with the binary, then build every library at once (nvcc is one process per file).
  std::vector<std::future<Shell>> builds;
  for (const Export& e : kExports) {
    const std::string cu = dir.file(std::string(e.campaign) + ".cu");
    const auto r = run_attntune("export --db " + shq(db) + " --campaign " + e.campaign + " -o " + shq(cu));
    ASSERT_EQ(r.rc, 0) << r.err;
    builds.push_back(std::async(std::launch::async, sh,
                                attntune::test::nvcc_shared_command(nvcc, "sm_90a", cu,
                                                                    dir.file(std::string("lib") + e.campaign + ".so"))));
  }
  std::vector<Shell> built;
  for (auto& b : builds) built.push_back(b.get());

  Reference ref(props.arch);
  std::uint64_t seed = 7000;
  for (std::size_t i = 0; i < std::size(kExports); ++i) {
    const Export& e = kExports[i];
    ASSERT_EQ(built[i].status, 0) << e.campaign << ":\n" << built[i].output;
    Library lib;
    const std::string why = lib.load(dir.file(std::string("lib") + e.campaign + ".so"));
    ASSERT_EQ(why, "") << e.campaign;
    EXPECT_NE(std::string(lib.info()).find("\"tma_box_rows\""), std::string::npos) << lib.info();
    SCOPED_TRACE(e.campaign);
    check_library(lib, ref, ctx, Problem::parse(e.problem), seed);
  }

  // One library of several kernels (--all-best): a split tail's partial results and a causal tile
  // counter on one stream, the calls alternating, each kernel with workspaces of its own (they once
  // shared one by index: the counter read the split's partial sums). Loaded beside the six above,
  // whose workspaces are theirs too.
  const std::string all = dir.file("all.cu"), all_so = dir.file("liball.so");
  const auto r = run_attntune("export --db " + shq(db) + " --all-best --dtype bf16 -o " + shq(all));
  ASSERT_EQ(r.rc, 0) << r.err;
  const Shell b = sh(attntune::test::nvcc_shared_command(nvcc, "sm_90a", all, all_so));
  ASSERT_EQ(b.status, 0) << b.output;
  Library lib;
  ASSERT_EQ(lib.load(all_so), "");
  for (int rep = 0; rep < 2; ++rep)
    for (int causal : {0, 1}) {
      const Problem p =
          Problem::parse(fmt::format("b=2,h=16,hkv=8,s=1000,sk=1500,d=128,dtype=bf16,causal={}", causal));
      AttnBuffers buf(p, Layout::kBHSD);
      ref.fill(buf, ++seed);
      const AttnParams a = buf.params();
      ASSERT_EQ(lib.call(a, a.lse, 128, causal), 0) << lib.last_error();
      ctx.synchronize();
      const Verdict v = ref.check(buf);
      EXPECT_EQ(v.status, "ok") << "all-best, causal=" << causal << ", round " << rep << ": " << v.detail();
    }
}

}  // namespace
}  // namespace test_export_wgmma
