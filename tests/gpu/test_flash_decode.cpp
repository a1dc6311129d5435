// Property test of flash_decode: every valid config of its space for d=128 (non-causal s=1 and
// causal s=4, bf16 and fp16 alternating), a spread at d=64 and d=256, and at the head dims whose
// tiles have column blocks of 32 or 16 elements (d=32, 80, 96, 112, 160) or 128-byte rows whose
// chunks do not divide the load threads (d=192), with spreads of their cluster and TMA configs
// (sm_90), and smaller spreads of every other multiple of 16 (48, 144, 176, 208, 224, 240), each
// built through the pool the tuner uses and launched through its launch plan (the worker's
// LoadedBuild: splits from this GPU's SM count, the combine kernel or the last CTA; clusterN: N
// splits, one cluster merging
// through distributed shared memory, a spread of those), on shapes covering what decoding brings:
// GQA/MQA packing, odd and long key counts (many splits, empty ones), seqlen_q 2..16 with
// bottom-right causal, the [B,S,H,D] layout, and paged KV caches (pages of 16, 64, 256 and an odd
// size; shuffled block tables with spare pages; ragged lengths 0, 1, odd, all; NaN past each
// length), each also with the plan's optional workspaces withheld (fewer splits). FlashAttention-2's
// criterion against the reference. (Where d % 64 != 0 the odd page size is 12 rather than 7: TMA
// boxes of a column block narrower than 128 bytes must fill 128 bytes, so the plan refuses pages of
// 7 there; 12 keeps boxes of 4 unswizzled rows.) Split head dims (`dv=N`: V's and O's head dim other
// than Q's and K's, DeepSeek's MLA decode 192 / 128 first) get spreads of their own
// (FlashDecodeSplitDims, below): the same shapes, plain, clustered and TMA configs; and latent caches
// (`latent=1`: v = k, FlashDecodeLatentProperty at the end) theirs.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gpu_env.hpp"
#include "property_check.hpp"
#include "cuda/nvrtc.hpp"
#include "families/family.hpp"

namespace test_flash_decode {
using namespace attntune;

namespace {

using attntune::testing::PropertyShape;
const PropertyShape kShapes[] = {
    {"b=3,h=32,hkv=8,s=1,sk=1001", Layout::kBHSD},           // GQA 4:1, odd length
    {"b=2,h=6,hkv=2,s=3,sk=777", Layout::kBSHD},             // s=3, strided
    {"b=1,h=32,hkv=8,s=1,sk=20011", Layout::kBHSD},          // one sequence: many splits
    {"b=7,h=8,hkv=8,s=1,sk=2049,page=16", Layout::kBHSD},    // MHA, pages of 16, ragged
    {"b=5,h=16,hkv=2,s=4,sk=600,page=256", Layout::kBHSD},   // GQA 8:1 x 4 rows, pages of 256
    {"b=6,h=4,hkv=1,s=16,sk=300,page=64", Layout::kBSHD},    // MQA, s=16 (64 packed rows)
    {"b=4,h=8,hkv=2,s=2,sk=1000,page=7", Layout::kBHSD},     // an odd page size
};

// combine: clusterN configs, or the others; kv_load tma configs.
bool clustered(const Config& c) { return std::get<std::string>(c.at("combine")).rfind("cluster", 0) == 0; }
bool tma(const Config& c) { return std::get<std::string>(c.at("kv_load")) == "tma"; }
// An FP8 cache converted once a key group into the 16-bit stage (fp8_convert group, group2).
bool group_convert(const Config& c) {
  const auto it = c.find("fp8_convert");
  return it != c.end() && std::get<std::string>(it->second) != "warp";
}

// The shapes at head dim d (and V's dv): kShapes, the odd page size 12 where d % 64 != 0 or dv %
// 64 != 0 (the file's comment; V's boxes are V's column blocks).
std::vector<PropertyShape> shapes_for(int d, int dv = 0) {
  static const std::string kPage12 = "b=4,h=8,hkv=2,s=2,sk=1000,page=12";
  std::vector<PropertyShape> out(std::begin(kShapes), std::end(kShapes));
  if (d % 64 != 0 || dv % 64 != 0)
    for (PropertyShape& sh : out)
      if (std::string(sh.dims) == "b=4,h=8,hkv=2,s=2,sk=1000,page=7") sh.dims = kPage12.c_str();
  return out;
}

// dv: V's head dim when it is not d (0: d).
void check_space(int d, std::size_t sample, const std::function<bool(const Config&)>& keep = {}, int dv = 0) {
  cuda::Context ctx(0);
  const auto props = cuda::device_props(0);
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_decode.yaml");
  std::vector<Config> configs;
  std::vector<Problem> variants;
  for (const char* kind : {"s=1,causal=0", "s=4,causal=1"}) {
    const Problem base = Problem::parse(fmt::format("b=1,h=32,hkv=8,{},sk=4096,d={}{},dtype=bf16", kind, d,
                                                    dv ? fmt::format(",dv={}", dv) : std::string()));
    const bool any = attntune::testing::spread_configs(space, base, props.arch, sample, configs, variants, keep);
    if (!any && keep && props.arch < "sm_90") GTEST_SKIP() << "no thread-block clusters or TMA on " << props.arch;
    ASSERT_TRUE(any) << base.str();
  }
  attntune::testing::PropertyRun run;
  run.label = "flash_decode";
  run.d = d;
  run.arch = props.arch;
  run.seed = 1000 + d;
  run.require_no_spills = true;
  run.without_workspaces = true;  // split merges fall back to fewer splits (cluster: one cluster a unit)
  run.dv = dv;
  attntune::testing::check_configs(space, configs, variants, shapes_for(d, dv), run);
}

}  // namespace

TEST(FlashDecodeProperty, AllConfigsD128) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(128, 0, [](const Config& c) { return !clustered(c); });
}

TEST(FlashDecodeProperty, ClusterSpreadD128) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(128, 24, clustered);
}

TEST(FlashDecodeProperty, SpreadD64) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(64, 24);
}

TEST(FlashDecodeProperty, SpreadD256) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(256, 16);
}

// Head dims of narrower column blocks (64-byte rows: 96, 160, 32; 32-byte rows: 80, 112) and of
// block loads (d=192: 24 chunks a row), plain spreads over each space, then its clustered and its
// TMA configs (sm_90; elsewhere those tests skip or see none).
TEST(FlashDecodeProperty, SpreadD96) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(96, 16);
}

TEST(FlashDecodeProperty, SpreadD80) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(80, 16);
}

TEST(FlashDecodeProperty, SpreadD112) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(112, 12);
}

TEST(FlashDecodeProperty, SpreadD192) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(192, 12);
}

TEST(FlashDecodeProperty, SpreadD32) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(32, 12);
}

TEST(FlashDecodeProperty, SpreadD160) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(160, 12);
}

TEST(FlashDecodeProperty, ClusterSpreadD96) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(96, 12, clustered);
}

TEST(FlashDecodeProperty, ClusterSpreadD80) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(80, 12, clustered);
}

TEST(FlashDecodeProperty, TmaSpreadD96) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(96, 12, tma);
}

TEST(FlashDecodeProperty, TmaSpreadD80) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(80, 12, tma);
}

TEST(FlashDecodeProperty, TmaSpreadD192) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(192, 8, tma);
}

// The other head dims a multiple of 16 (column blocks of 16 elements: 48, 144, 176, 208, 240; of
// 32: 224), a smaller spread each.
TEST(FlashDecodeProperty, SpreadOtherHeadDims) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {48, 144, 176, 208, 224, 240}) check_space(d, 6);
}

// Split head dims (`dv=N`): DeepSeek's MLA decode (192 / 128: K block loads of 24 chunks a row, V row
// loads of 16), V wider than K (64 / 128) and narrower (128 / 64), V's column blocks of 32 elements
// under K's 64 (128 / 96: 64-byte V spans, TMA V boxes of their own width) and of 64 over K's 16
// (48 / 64: Q's rows padded so that the ring starts at V's swizzle repeat). A plain spread of each
// (every combine; sm_90 TMA ones among them), then its clustered and its TMA configs (sm_90;
// elsewhere those skip).
namespace {
struct SplitDims {
  int d, dv;
};
void PrintTo(const SplitDims& s, std::ostream* os) { *os << "d=" << s.d << ",dv=" << s.dv; }
class FlashDecodeSplitDims : public ::testing::TestWithParam<SplitDims> {};
}  // namespace

TEST_P(FlashDecodeSplitDims, Spread) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(GetParam().d, attntune::testing::property_sample(12), {}, GetParam().dv);
}

TEST_P(FlashDecodeSplitDims, ClusterSpread) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(GetParam().d, attntune::testing::property_sample(8), clustered, GetParam().dv);
}

TEST_P(FlashDecodeSplitDims, TmaSpread) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(GetParam().d, attntune::testing::property_sample(8), tma, GetParam().dv);
}

INSTANTIATE_TEST_SUITE_P(Dv, FlashDecodeSplitDims,
                         ::testing::Values(SplitDims{192, 128}, SplitDims{64, 128}, SplitDims{128, 64},
                                           SplitDims{128, 96}, SplitDims{48, 64}),
                         [](const auto& info) { return fmt::format("D{}V{}", info.param.d, info.param.dv); });

// A latent cache (`latent=1`: V is the first dv columns of K, one buffer; MLA decode at DeepSeek's
// layout, one KV head for 16 query heads, at 192 / 128): flash_decode reads V through v, which the
// buffers pass as k with k's strides (dense, [B,S,H,D] too, and pages of 64: K's pages alone), so
// each check also proves the aliasing reaches the kernel and the reference. Builds for decoding
// (s=1) and causal s=4, a plain spread (every combine), then clustered and TMA ones (sm_90).
namespace {

const PropertyShape kLatentShapes[] = {
    {"b=3,h=16,hkv=1,s=1,sk=1001", Layout::kBHSD},           // odd length
    {"b=2,h=16,hkv=1,s=4,sk=777", Layout::kBSHD},            // s=4, strided
    {"b=1,h=16,hkv=1,s=1,sk=20011", Layout::kBHSD},          // one sequence: many splits
    {"b=7,h=16,hkv=1,s=1,sk=2049,page=64", Layout::kBHSD},   // pages of 64, ragged
    {"b=5,h=16,hkv=1,s=4,sk=600,page=64", Layout::kBSHD},    // 4 rows a query head, pages of 64
};

void check_latent(std::size_t sample, const std::function<bool(const Config&)>& keep = {}) {
  cuda::Context ctx(0);
  const auto props = cuda::device_props(0);
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_decode.yaml");
  std::vector<Config> configs;
  std::vector<Problem> variants;
  for (const char* kind : {"s=1,causal=0", "s=4,causal=1"}) {
    const Problem base =
        Problem::parse(fmt::format("b=16,h=16,hkv=1,{},sk=4096,d=192,dv=128,dtype=bf16,latent=1", kind));
    const bool any = attntune::testing::spread_configs(space, base, props.arch, sample, configs, variants, keep);
    if (!any && keep && props.arch < "sm_90") GTEST_SKIP() << "no thread-block clusters or TMA on " << props.arch;
    ASSERT_TRUE(any) << base.str();
  }
  // The inputs alias: no V of their own, v = k with k's strides (dense and paged).
  for (const char* spec : {"b=2,h=16,hkv=1,s=1,sk=100,d=192,dv=128,dtype=bf16,causal=0,latent=1",
                           "b=2,h=16,hkv=1,s=1,sk=100,d=192,dv=128,dtype=bf16,causal=0,page=64,latent=1"}) {
    const AttnBuffers b(Problem::parse(spec), Layout::kBSHD);
    const attntune_plan::Call c = b.call();
    const AttnParams a = b.params();
    EXPECT_EQ(b.v.bytes(), 0u) << spec;
    EXPECT_EQ(b.v_pages.bytes(), 0u) << spec;
    EXPECT_EQ(c.v, c.k) << spec;
    EXPECT_EQ(a.v, a.k) << spec;
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(c.v_stride[i], c.k_stride[i]) << spec;
      EXPECT_EQ(a.v_stride[i], a.k_stride[i]) << spec;
    }
    EXPECT_EQ(c.head_dim_v, 128) << spec;
  }
  attntune::testing::PropertyRun run;
  run.label = "flash_decode";
  run.d = 192;
  run.dv = 128;
  run.latent = true;
  run.arch = props.arch;
  run.seed = 5760;
  run.require_no_spills = true;
  run.without_workspaces = true;
  attntune::testing::check_configs(space, configs, variants, kLatentShapes, run);
}

}  // namespace

TEST(FlashDecodeLatentProperty, Spread) {
  ATTNTUNE_REQUIRE_GPU();
  check_latent(attntune::testing::property_sample(12));
}

TEST(FlashDecodeLatentProperty, ClusterSpread) {
  ATTNTUNE_REQUIRE_GPU();
  check_latent(attntune::testing::property_sample(8), clustered);
}

TEST(FlashDecodeLatentProperty, TmaSpread) {
  ATTNTUNE_REQUIRE_GPU();
  check_latent(attntune::testing::property_sample(8), tma);
}

// FP8 caches (`kv_dtype=fp8`, issue 42): K and V in e4m3 with per-(sequence, KV head) scales (the
// buffers' tables in [0.25, 2]; one spread also with one scale a tensor, strides 0), bf16 and fp16
// queries alternating, against the reference over the dequantised cache: decoding (s=1), causal
// speculative rows (s=4) and 16 queries of MQA, on the file's shapes (GQA and MQA packing, odd
// lengths, many splits, the [B,S,H,D] layout, pages of 16, 64, 256 and an odd size, ragged lengths
// with NaN bytes past each, shuffled tables, workspaces withheld) and a long context (sk 65537, one
// sequence: the LSE over 64k keys, where a reduced-precision accumulator would drift). The pages
// of 7 become 12 where K's rows, d / 2 16-bit elements, are no multiple of 64 (TMA's boxes).
namespace {

std::vector<PropertyShape> fp8_shapes(int d) {
  std::vector<PropertyShape> out = shapes_for(d / 2);
  out.push_back({"b=1,h=8,hkv=2,s=1,sk=65537", Layout::kBHSD});
  return out;
}

// kinds: the configs' problems' seqlen_q and causality (s=8 and s=16 with 4 query heads a KV head:
// 32 and 64 packed rows, 2 and 4 row warps); dtype: Q's and O's.
void check_fp8(int d, std::size_t sample, const std::function<bool(const Config&)>& keep = {},
               bool per_tensor = false, const std::vector<const char*>& kinds = {"s=1,causal=0", "s=4,causal=1"},
               const char* dtype = "bf16") {
  cuda::Context ctx(0);
  const auto props = cuda::device_props(0);
  if (props.arch < "sm_89") GTEST_SKIP() << "FP8 caches need sm_89 or later; this GPU is " << props.arch;
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_decode.yaml");
  std::vector<Config> configs;
  std::vector<Problem> variants;
  for (const char* kind : kinds) {
    const Problem base =
        Problem::parse(fmt::format("b=1,h=32,hkv=8,{},sk=4096,d={},dtype={},kv_dtype=fp8", kind, d, dtype));
    const bool any = attntune::testing::spread_configs(space, base, props.arch, sample, configs, variants, keep);
    if (!any && keep && props.arch < "sm_90") GTEST_SKIP() << "no thread-block clusters or TMA on " << props.arch;
    ASSERT_TRUE(any) << base.str();
  }
  attntune::testing::PropertyRun run;
  run.label = "flash_decode";
  run.d = d;
  run.arch = props.arch;
  run.seed = 8000 + d + (per_tensor ? 1 : 0) + (std::string(dtype) == "bf16" ? 0 : 2) +
             (kinds.size() == 2 && std::string(kinds[0]) == "s=1,causal=0" ? 0 : 4);
  run.require_no_spills = true;
  run.without_workspaces = true;
  run.kv_fp8 = true;
  run.per_tensor_descale = per_tensor;
  attntune::testing::check_configs(space, configs, variants, fp8_shapes(d), run);
}

}  // namespace

TEST(FlashDecodeFp8Property, SpreadD128) {
  ATTNTUNE_REQUIRE_GPU();
  check_fp8(128, attntune::testing::property_sample(16), [](const Config& c) { return !clustered(c); });
}

TEST(FlashDecodeFp8Property, ClusterSpreadD128) {
  ATTNTUNE_REQUIRE_GPU();
  check_fp8(128, attntune::testing::property_sample(6), clustered);
}

TEST(FlashDecodeFp8Property, TmaSpreadD128) {
  ATTNTUNE_REQUIRE_GPU();
  check_fp8(128, attntune::testing::property_sample(8), tma);
}

TEST(FlashDecodeFp8Property, PerTensorScales) {
  ATTNTUNE_REQUIRE_GPU();
  check_fp8(128, attntune::testing::property_sample(4), {}, true);
}

// The conversion shared by a key group's row warps (fp8_convert group, group2: the 16-bit stage,
// the 16-bit path's MMAs in fp16, V rows outside the sequence zeroed by the conversion, a bf16 Q
// rewritten once as fp16 in shared memory), at 32 and 64 packed rows, bf16 and fp16, d=64 and 256
// (Q re-read a tile), every shape of the file (their 1-row units too).
TEST(FlashDecodeFp8Property, GroupConversionD128) {
  ATTNTUNE_REQUIRE_GPU();
  check_fp8(128, attntune::testing::property_sample(12), group_convert, false, {"s=8,causal=1", "s=16,causal=1"});
}

TEST(FlashDecodeFp8Property, GroupConversionFp16D128) {
  ATTNTUNE_REQUIRE_GPU();
  check_fp8(128, attntune::testing::property_sample(6), group_convert, false, {"s=8,causal=0", "s=16,causal=1"},
            "fp16");
}

TEST(FlashDecodeFp8Property, GroupConversionOtherHeadDims) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {64, 256})
    check_fp8(d, attntune::testing::property_sample(4), group_convert, false, {"s=8,causal=1", "s=16,causal=1"});
}

// The property tests' spread gives every other config fp16 queries: never where the space refuses
// the config for fp16 (flash_decode's fp16 group conversion at 64 packed rows, which spills where
// bf16's does not; session 93's GPU call threw "is not valid for ... dtype=fp16" before any check
// ran). No GPU: the space and the spread alone.
TEST(FlashDecodeFp8Spread, NoConfigGetsADtypeTheSpaceRefuses) {
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_decode.yaml");
  for (int d : {64, 128, 256}) {
    std::vector<Config> configs;
    std::vector<Problem> variants;
    for (const char* kind : {"s=8,causal=1", "s=16,causal=1"}) {
      const Problem base = Problem::parse(fmt::format("b=1,h=32,hkv=8,{},sk=4096,d={},dtype=bf16,kv_dtype=fp8", kind, d));
      ASSERT_TRUE(attntune::testing::spread_configs(space, base, "sm_90", 0, configs, variants, group_convert)) << d;
    }
    std::size_t fp16 = 0;
    for (std::size_t i = 0; i < configs.size(); ++i) {
      const auto why = space.check(configs[i], variants[i], "sm_90");
      EXPECT_FALSE(why.has_value()) << variants[i].str() << ": " << why.value_or("");
      fp16 += variants[i].dtype == DType::kFp16;
    }
    EXPECT_GT(fp16, 0u) << "d=" << d << ": the spread still alternates where the space allows it";
  }
}

TEST(FlashDecodeFp8Property, SpreadD64) {
  ATTNTUNE_REQUIRE_GPU();
  check_fp8(64, attntune::testing::property_sample(8));
}

TEST(FlashDecodeFp8Property, SpreadD256) {
  ATTNTUNE_REQUIRE_GPU();
  check_fp8(256, attntune::testing::property_sample(8));
}

// The FP8 caches' conversions (templates/common/fp8.cuh) on every e4m3 code but the NaNs: to fp16
// (cvt) and to bf16 (the bits moved, one bf16x2 multiply by 2^120: subnormals and the sign of zero
// included), each byte where the MMA expects it, and the transposed V register's key pairs.
namespace {

double e4m3_value(int code) {  // OCP e4m3fn: bias 7, subnormals, no infinities
  const int e = (code >> 3) & 15, m = code & 7;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return code & 0x80 ? -mag : mag;
}
double f16_value(std::uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const double mag = e == 0 ? std::ldexp(m / 1024.0, -14) : std::ldexp(1.0 + m / 1024.0, e - 15);
  return h & 0x8000 ? -mag : mag;
}
double bf16_value(std::uint16_t h) {
  const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

TEST(Fp8Convert, EveryCodeExactly) {
  ATTNTUNE_REQUIRE_GPU();
  cuda::Context ctx(0);
  const auto props = cuda::device_props(0);
  if (props.arch < "sm_89") GTEST_SKIP() << "e4m3 conversions need sm_89 or later; this GPU is " << props.arch;
  const std::string src = flatten_includes("templates/common/fp8.cuh") + R"(
extern "C" __global__ void convert(const unsigned* in, unsigned* f16, unsigned* bf16, unsigned* keys) {
  const int i = threadIdx.x;  // codes 4i .. 4i + 3
  att::u32 lo, hi;
  att::e4m3x4_to_pairs<false>(in[i], lo, hi);
  f16[2 * i] = lo;
  f16[2 * i + 1] = hi;
  att::e4m3x4_to_pairs<true>(in[i], lo, hi);
  bf16[2 * i] = lo;
  bf16[2 * i + 1] = hi;
  att::e4m3_key_pairs(in[i], lo, hi);
  keys[2 * i] = lo;
  keys[2 * i + 1] = hi;
}
)";
  cuda::CompileOptions opts;
  opts.arch = props.arch;
  const auto out = cuda::nvrtc_compile(src, "fp8_convert.cu", opts);
  ASSERT_TRUE(out.ok) << out.log;
  const cuda::Module module(out.cubin);
  const cuda::Function f = module.function("convert");
  std::vector<std::uint32_t> codes(64);
  for (int i = 0; i < 64; ++i)
    codes[i] = static_cast<std::uint32_t>(4 * i) | static_cast<std::uint32_t>(4 * i + 1) << 8 |
               static_cast<std::uint32_t>(4 * i + 2) << 16 | static_cast<std::uint32_t>(4 * i + 3) << 24;
  cuda::DeviceBuffer in(256), f16(512), bf16(512), keys(512);
  in.upload(codes.data(), 256);
  CUdeviceptr pin = in.ptr(), pf = f16.ptr(), pb = bf16.ptr(), pk = keys.ptr();
  void* args[] = {&pin, &pf, &pb, &pk};
  cuda::launch(f, {1, 1, 1}, {64, 1, 1}, 0, nullptr, args);
  std::vector<std::uint16_t> hf(256), hb(256), hk(256);
  f16.download(hf.data(), 512);
  bf16.download(hb.data(), 512);
  keys.download(hk.data(), 512);
  int checked = 0;
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;  // NaN
    const double want = e4m3_value(code);
    // Pairs in byte order: half j of the output is byte j of the input.
    EXPECT_EQ(f16_value(hf[code]), want) << "fp16, code " << code;
    EXPECT_EQ(bf16_value(hb[code]), want) << "bf16, code " << code;
    EXPECT_EQ((hf[code] & 0x8000) != 0, (code & 0x80) != 0) << "fp16 sign, code " << code;
    EXPECT_EQ((hb[code] & 0x8000) != 0, (code & 0x80) != 0) << "bf16 sign, code " << code;
    // Key pairs: word i's bytes (b0, b1, b2, b3) give (b0, b2) then (b1, b3).
    const int i = code / 4, j = code % 4, at = 4 * i + (j == 0 ? 0 : j == 2 ? 1 : j == 1 ? 2 : 3);
    EXPECT_EQ(f16_value(hk[at]), want) << "key pairs, code " << code;
    ++checked;
  }
  EXPECT_EQ(checked, 254);
}

// FP8 at the other head dims the space serves (multiples of 32): d=96 (K rows of 48 16-bit elements:
// three 32-byte column blocks) and d=192 (a 64-element block and a 32-element one).
TEST(FlashDecodeFp8Property, SpreadOtherHeadDims) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {96, 192}) check_fp8(d, attntune::testing::property_sample(4));
}
}  // namespace test_flash_decode
