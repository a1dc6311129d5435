// Property test of flash_decode's attention variants (issue 41): sliding windows (left in {0, 1,
// 127, 4096, -1} x right in {0 (causal), -1, 64}), attention sinks (random, -1e4 and 1e3 logits by
// head: AttnBuffers' sink_logits), soft-caps of 30 and 50, and combinations, each on a spread of
// the space's configs (some of every combine and kv_load: one cluster size a case) built through
// the tuner's pool and launched through the plan (the worker's LoadedBuild), against the reference
// by FlashAttention-2's criterion: GQA/MQA packing, seqlen_q 1..16 (rows of one unit with different
// windows), odd lengths, one sequence split many ways, paged caches (ragged lengths 0, 1, odd, all;
// shuffled block tables; NaN past each length), NaN-poisoned outputs; each launch again with the
// plan's optional workspaces withheld (fewer splits: the sinks then join in the unsplit epilogue).
// With a window, the keys no row sees are then poisoned with NaN too (every page row before a
// sequence's window; in the contiguous K/V, the rows before the reference's own first chunk) and
// the launch must give the same verdict: the kernels neither read them (cp.async, paged TMA) nor
// let them reach an output (contiguous TMA tiles that start before the window). Head dims 64, 128,
// 256 and those of narrower column blocks (80, 96, 112, 160) or block loads (192); where d % 64 !=
// 0 the odd page size 7 becomes 12 (TMA refuses boxes narrower than 128 bytes: test_flash_decode.cpp).
// Split head dims (`dv=N`, V's and O's other than Q's and K's: 192 / 128, 64 / 128, 128 / 64,
// 128 / 96): every case of variants on a spread of each's configs (FlashDecodeVariantsSplitDims).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gpu_env.hpp"
#include "property_check.hpp"
#include "templates/flash_decode/split.h"

namespace test_flash_decode_variants {
using namespace attntune;

namespace {

using attntune::testing::PropertyShape;

// One family of variants: the problem the configs are built for (its variants and causal; d, b and
// lengths are the shapes') and shapes whose dims carry the same variants with other values.
struct VariantCase {
  const char* build;
  std::vector<PropertyShape> shapes;
};

const VariantCase kCases[] = {
    // Causal windows (right 0), s 1..16.
    {"h=32,hkv=8,s=4,causal=1,window=127",
     {{"b=3,h=32,hkv=8,s=1,sk=1001,window=127", Layout::kBHSD},
      {"b=2,h=8,hkv=2,s=3,sk=5000,window=4096", Layout::kBSHD},              // the window ends inside
      {"b=1,h=32,hkv=8,s=1,sk=20011,window=1", Layout::kBHSD},               // many splits, 2 keys a row
      {"b=5,h=16,hkv=2,s=4,sk=600,window=0,page=16", Layout::kBHSD},         // the diagonal alone
      {"b=6,h=4,hkv=1,s=16,sk=3000,window=127,page=64", Layout::kBSHD},      // 16 rows, 16 windows
      {"b=4,h=8,hkv=2,s=2,sk=9000,window=4096,page=7", Layout::kBHSD}}},     // an odd page size
    // Windows reaching right of the diagonal and left-unbounded ones (non-causal), with sinks.
    {"h=16,hkv=4,s=3,causal=0,window=127,64,sinks=1",
     {{"b=3,h=16,hkv=4,s=3,sk=777,window=127,64,sinks=1", Layout::kBHSD},
      {"b=2,h=8,hkv=8,s=5,sk=3001,window=-1,64,sinks=1", Layout::kBSHD},
      {"b=1,h=32,hkv=8,s=2,sk=20011,window=4096,64,sinks=1", Layout::kBHSD},
      {"b=7,h=8,hkv=2,s=4,sk=2049,window=1,64,sinks=1,page=16", Layout::kBHSD},
      {"b=5,h=16,hkv=2,s=3,sk=600,window=127,-1,sinks=1,page=256", Layout::kBSHD}}},
    // Sinks alone (gpt-oss's full layers), causal s=4 and s=1.
    {"h=64,hkv=8,s=4,causal=1,sinks=1",
     {{"b=3,h=64,hkv=8,s=4,sk=1001,sinks=1", Layout::kBHSD},
      {"b=1,h=32,hkv=8,s=1,sk=20011,sinks=1", Layout::kBHSD},
      {"b=7,h=8,hkv=8,s=1,sk=2049,sinks=1,page=16", Layout::kBSHD},
      {"b=6,h=4,hkv=1,s=16,sk=300,sinks=1,page=64", Layout::kBSHD}}},
    // Soft-caps of 30 and 50 (Gemma-2), non-causal s=1 and 2.
    {"h=16,hkv=8,s=2,causal=0,softcap=50",
     {{"b=4,h=16,hkv=8,s=1,sk=1001,softcap=50", Layout::kBHSD},
      {"b=1,h=16,hkv=8,s=2,sk=20011,softcap=30", Layout::kBSHD},
      {"b=5,h=16,hkv=2,s=2,sk=600,softcap=30,page=16", Layout::kBHSD}}},
    // All three (gpt-oss's window layers with a cap), causal.
    {"h=64,hkv=8,s=4,causal=1,window=128,softcap=30,sinks=1",
     {{"b=3,h=64,hkv=8,s=4,sk=1001,window=128,softcap=30,sinks=1", Layout::kBHSD},
      {"b=1,h=32,hkv=8,s=1,sk=20011,window=4096,softcap=50,sinks=1", Layout::kBHSD},
      {"b=7,h=8,hkv=8,s=1,sk=2049,window=128,softcap=50,sinks=1,page=16", Layout::kBSHD},
      {"b=4,h=8,hkv=2,s=2,sk=1000,window=1,softcap=30,sinks=1,page=7", Layout::kBHSD}}},
};

const char* const kClusters[] = {"cluster2", "cluster4", "cluster8", "cluster16"};

// NaN (both dtypes) over K and V rows [0, until[b]) of every kv head of a contiguous [b, hkv, sk, d]
// layout (the reference's view of the buffers; V's rows of dv through its own strides).
void poison_rows_before(AttnBuffers& buf, const std::vector<int>& until) {
  const AttnParams a = buf.params();
  const std::int64_t hkv = buf.problem.hkv;
  for (cuda::DeviceBuffer* t : {&buf.k, &buf.v}) {
    const bool is_v = t == &buf.v;
    const long long* st = is_v ? a.v_stride : a.k_stride;
    const std::int64_t d = is_v ? buf.problem.head_dim_v() : buf.problem.d;
    const std::int64_t eb = static_cast<std::int64_t>(buf.kv_elem_bytes());  // 0xFF bytes: NaN in e4m3, fp16, bf16
    std::vector<std::uint8_t> host(t->bytes());
    t->download(host.data(), t->bytes());
    for (std::int64_t i = 0; i < buf.problem.b; ++i)
      for (std::int64_t h = 0; h < hkv; ++h)
        for (std::int64_t j = 0; j < until[static_cast<std::size_t>(i)]; ++j)
          std::fill_n(host.begin() + (i * st[0] + h * st[1] + j * st[2]) * eb, d * eb, 0xFF);
    t->upload(host.data(), t->bytes());
  }
}

// The same in the pages of a paged problem ([num_pages, page, hkv, d] through its block table; V's
// pages of dv).
void poison_page_rows_before(AttnBuffers& buf, const std::vector<int>& until) {
  const std::int64_t page = buf.problem.page, hkv = buf.problem.hkv;
  std::vector<int> table(buf.block_table.bytes() / 4);
  buf.block_table.download(table.data(), buf.block_table.bytes());
  for (cuda::DeviceBuffer* t : {&buf.k_pages, &buf.v_pages}) {
    const std::int64_t d = t == &buf.v_pages ? buf.problem.head_dim_v() : buf.problem.d;
    const std::int64_t eb = static_cast<std::int64_t>(buf.kv_elem_bytes());
    std::vector<std::uint8_t> host(t->bytes());
    t->download(host.data(), t->bytes());
    for (std::int64_t i = 0; i < buf.problem.b; ++i)
      for (std::int64_t j = 0; j < until[static_cast<std::size_t>(i)]; ++j) {
        const std::int64_t pg = table[static_cast<std::size_t>(i * buf.pages_per_seq + j / page)];
        std::fill_n(host.begin() + ((pg * page + j % page) * hkv) * d * eb, hkv * d * eb, 0xFF);
      }
    t->upload(host.data(), t->bytes());
  }
}

// dv: V's head dim when it is not d (0: d). kv: "" or ",kv_dtype=fp8" (an FP8 cache: the configs
// and the shapes; keep, where given, narrows each class's configs).
void check_case(const VariantCase& vc, int d, std::size_t sample, std::uint64_t seed, int dv = 0,
                const std::string& kv = "", const std::function<bool(const Config&)>& keep = {}) {
  const std::string dims_v = dv ? fmt::format(",dv={}", dv) : std::string();
  cuda::Context ctx(0);
  const auto props = cuda::device_props(0);
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_decode.yaml");
  const Problem base = Problem::parse(fmt::format("b=1,{},sk=4096,d={}{},dtype=bf16{}", vc.build, d, dims_v, kv));
  // Every combine and kv_load the arch serves: `sample` configs spread over each (combine, kv_load)
  // class's valid ones (a class of clusterN on sm_90 takes them in turns: one cluster size a case).
  std::vector<Config> configs;
  std::vector<Problem> built;
  const char* cluster = kClusters[static_cast<std::size_t>(seed / 100) % std::size(kClusters)];
  for (const char* combine : {"kernel", "last_cta", cluster})
    for (const char* kv_load : {"cp_async", "tma"})
      attntune::testing::spread_configs(space, base, props.arch, sample, configs, built, [&](const Config& c) {
        return std::get<std::string>(c.at("combine")) == combine &&
               std::get<std::string>(c.at("kv_load")) == kv_load && (!keep || keep(c));
      });
  ASSERT_FALSE(configs.empty()) << base.str();

  BuildPoolOptions pool_opts;
  pool_opts.nvrtc_options = family_nvrtc_options("flash_decode");
  pool_opts.worker_argv = {attntune::testing::attntune_bin(), "build-worker"};
  BuildPool pool(pool_opts);
  std::map<std::uint64_t, Problem> built_for;
  for (std::size_t i = 0; i < configs.size(); ++i)
    built_for[pool.submit({configs[i], render_kernel(space, configs[i], built[i], props.arch), props.arch})] = built[i];
  Reference ref(props.arch);
  const bool progress = std::getenv("ATTNTUNE_TEST_PROGRESS") != nullptr;
  int checked = 0, failures = 0;
  while (auto o = pool.next()) {
    EXPECT_EQ(o->build.status, "ok") << config_str(o->job.config) << "\n" << o->build.log;
    if (o->build.status != "ok") continue;
    EXPECT_EQ(o->build.spill_stores + o->build.spill_loads, 0) << config_str(o->job.config);
    const Problem& v = built_for.at(o->ticket);
    const LoadedBuild kernel(o->build.cubin, o->job.kernel.launch);
    for (const PropertyShape& sh : vc.shapes) {
      std::string dims = sh.dims;
      const int row_d = kv.empty() ? d : d / 2, row_dv = kv.empty() ? dv : dv / 2;  // TMA rows of 16-bit elements
      if (const auto at = dims.find(",page=7"); (row_d % 64 != 0 || row_dv % 64 != 0) && at != std::string::npos)
        dims.replace(at, 7, ",page=12");
      const Problem p = Problem::parse(fmt::format("{},d={}{},dtype={},causal={}{}", dims, d, dims_v,
                                                   dtype_name(v.dtype), v.causal ? 1 : 0, kv));
      ++seed;
      AttnBuffers buf(p, sh.layout, p.paged() ? ragged_seqlens(p, seed) : std::vector<int>{}, seed);
      ref.fill(buf, seed);
      auto check = [&](const attntune_plan::Call& call, const char* how, bool workspaces = true) {
        if (progress) std::fprintf(stderr, "[progress] %s on %s%s\n", config_str(o->job.config).c_str(), p.str().c_str(), how);
        ref.poison_output(buf);
        kernel.launch(call, nullptr, workspaces);
        const Verdict verdict = ref.check(buf);
        ++checked;
        if (verdict.status != "ok") {
          ++failures;
          ADD_FAILURE() << config_str(o->job.config) << " on " << p.str() << " " << layout_name(buf.layout) << how
                        << " (lengths " << fmt::format("{}", fmt::join(buf.seqlens, ",")) << "): " << verdict.detail();
        }
      };
      check(buf.call(), "");
      check(buf.call(), " without workspaces", false);
      // Each sequence's keys and the unit's first (split.h): the keys before it no row sees.
      std::vector<int> lens(static_cast<std::size_t>(p.b)), before(lens.size()), before_chunk(lens.size());
      for (std::size_t i = 0; i < lens.size(); ++i) {
        lens[i] = buf.seqlens.empty() ? static_cast<int>(p.sk) : buf.seqlens[i];
        before[i] = att::unit_first_key(lens[i], static_cast<int>(p.s), static_cast<int>(p.window_left));
        before_chunk[i] = before[i] / 32 * 32;  // the reference reads from its first chunk of 32 keys
      }
      if (p.paged()) {
        if (p.windowed()) {
          poison_page_rows_before(buf, before);
          check(buf.call(), " with the pages before each window NaN");
        }
        // The same cache contiguous (block_table NULL), NaN past each sequence's keys and (windows)
        // before the reference's first chunk.
        attntune::testing::poison_past_lengths(buf);
        if (p.windowed()) poison_rows_before(buf, before_chunk);
        check(attntune::testing::contiguous_call(buf), " contiguous");
      } else if (p.windowed()) {
        poison_rows_before(buf, before_chunk);
        check(buf.call(), " with the keys before each window NaN");
      }
    }
  }
  std::printf("flash_decode variants %s d=%d%s%s: %zu configs, %d checks, %d failures\n", vc.build, d, dims_v.c_str(),
              kv.c_str(), configs.size(), checked, failures);
}

}  // namespace

TEST(FlashDecodeVariantsProperty, CausalWindowsD128) {
  ATTNTUNE_REQUIRE_GPU();
  check_case(kCases[0], 128, attntune::testing::property_sample(2), 4100);
}

TEST(FlashDecodeVariantsProperty, RightWindowsWithSinksD64) {
  ATTNTUNE_REQUIRE_GPU();
  check_case(kCases[1], 64, attntune::testing::property_sample(2), 4200);
}

TEST(FlashDecodeVariantsProperty, SinksD64) {
  ATTNTUNE_REQUIRE_GPU();
  check_case(kCases[2], 64, attntune::testing::property_sample(2), 4300);
}

TEST(FlashDecodeVariantsProperty, SoftcapD256) {
  ATTNTUNE_REQUIRE_GPU();
  check_case(kCases[3], 256, attntune::testing::property_sample(1), 4400);
}

TEST(FlashDecodeVariantsProperty, EveryVariantD128) {
  ATTNTUNE_REQUIRE_GPU();
  check_case(kCases[4], 128, attntune::testing::property_sample(2), 4500);
}

// Over an FP8 cache (issue 42): every variant together (32 packed rows: two row warps), each
// combine and kv_load in both conversions (fp8_convert warp, and group / group2: the key group's
// 16-bit stage, whose conversion zeroes the V rows outside each window), the keys before each
// window poisoned with NaN bytes.
TEST(FlashDecodeVariantsProperty, Fp8CacheEveryVariantBothConversions) {
  ATTNTUNE_REQUIRE_GPU();
  if (cuda::device_props(0).arch < "sm_89") GTEST_SKIP() << "FP8 caches need sm_89 or later";
  auto converts = [](bool group) {
    return [group](const Config& c) {
      const auto it = c.find("fp8_convert");
      return (it != c.end() && std::get<std::string>(it->second) != "warp") == group;
    };
  };
  check_case(kCases[4], 128, attntune::testing::property_sample(1), 4900, 0, ",kv_dtype=fp8", converts(false));
  check_case(kCases[4], 128, attntune::testing::property_sample(1), 4950, 0, ",kv_dtype=fp8", converts(true));
}

TEST(FlashDecodeVariantsProperty, CausalWindowsD96) {
  ATTNTUNE_REQUIRE_GPU();
  check_case(kCases[0], 96, attntune::testing::property_sample(2), 4600);
}

TEST(FlashDecodeVariantsProperty, RightWindowsWithSinksD80) {
  ATTNTUNE_REQUIRE_GPU();
  check_case(kCases[1], 80, attntune::testing::property_sample(2), 4700);
}

TEST(FlashDecodeVariantsProperty, SinksD160) {
  ATTNTUNE_REQUIRE_GPU();
  check_case(kCases[2], 160, attntune::testing::property_sample(1), 4800);
}

TEST(FlashDecodeVariantsProperty, SoftcapD192) {
  ATTNTUNE_REQUIRE_GPU();
  check_case(kCases[3], 192, attntune::testing::property_sample(1), 4900);
}

TEST(FlashDecodeVariantsProperty, EveryVariantD112) {
  ATTNTUNE_REQUIRE_GPU();
  check_case(kCases[4], 112, attntune::testing::property_sample(2), 5000);
}

TEST(FlashDecodeVariantsProperty, EveryVariantOtherHeadDims) {
  ATTNTUNE_REQUIRE_GPU();
  std::uint64_t seed = 5100;
  for (int d : {32, 48, 144, 176, 208, 224, 240})
    check_case(kCases[4], d, attntune::testing::property_sample(1), seed += 100);
}

// Split head dims (`dv=N`): each case of variants on a spread of the pair's configs (every combine
// and kv_load class the arch serves), DeepSeek's 192 / 128 with two configs a class, the others one.
namespace {
struct SplitDims {
  int d, dv;
  std::size_t sample;
};
void PrintTo(const SplitDims& s, std::ostream* os) { *os << "d=" << s.d << ",dv=" << s.dv; }
class FlashDecodeVariantsSplitDims : public ::testing::TestWithParam<SplitDims> {};
}  // namespace

TEST_P(FlashDecodeVariantsSplitDims, EveryCase) {
  ATTNTUNE_REQUIRE_GPU();
  const SplitDims& s = GetParam();
  std::uint64_t seed = 6000 + 10ull * s.d + s.dv;
  for (const VariantCase& vc : kCases)
    check_case(vc, s.d, attntune::testing::property_sample(s.sample), seed += 100, s.dv);
}

INSTANTIATE_TEST_SUITE_P(Dv, FlashDecodeVariantsSplitDims,
                         ::testing::Values(SplitDims{192, 128, 2}, SplitDims{64, 128, 1}, SplitDims{128, 64, 1},
                                           SplitDims{128, 96, 1}),
                         [](const auto& info) { return fmt::format("D{}V{}", info.param.d, info.param.dv); });
}  // namespace test_flash_decode_variants
