// Property test of flash_fwd_wgmma's FP8 forward (`dtype=fp8`, issue 42): Q, K and V in e4m3 with
// per-(sequence, KV head) descales (Q's and K's join the softmax scale, V's multiplies O), V given
// transposed (the call's v is [b, hkv, dv, sk] with the keys contiguous), O in bf16. Both GEMMs are
// FP8 wgmma; P goes to e4m3 A fragments through the quad shuffles of mainloop.cuh's pack_p_e4m3, and
// each tile's P.V is added to O in fp32. A spread of the configs that serve it (block_m 64-192,
// block_n multiples of 32, stages, persistent grids, the split tail, multicast pairs, the overlap
// and ping-pong schedules, narrow first tiles), against the float64-checked reference over the
// dequantised inputs with FlashAttention-2's criterion, its baseline rounding P to e4m3 as a good FP8
// kernel does: odd lengths, more queries than keys (causal rows that see nothing), GQA groups 1-8,
// both layouts (V^T from either), one query row, windows and sinks (builds with them), per-tensor
// scales (strides 0), head dims 64, 96, 128 and 256, and long key ranges (sk 65537 and 131101, V also
// around a nonzero mean: the LSE and O over 64k-128k keys, where FP8 wgmma's own accumulation alone
// would drift). At d=256, and at d=128 with key tiles past 128, each tile's P.V runs in column chunks
// (pv_chunks: halves or quarters of the value dims, one chunk's accumulator or two, pv_buffers), each
// chunk added to O in fp32 before the next reuses its accumulator: every chunking and schedule the
// space offers there is checked, with the long keys too. ATTNTUNE_PROPERTY_SAMPLE configs a kind
// (causal or not; default 6 at d=128 and 256, 2 at the others).
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gpu_env.hpp"
#include "property_check.hpp"

namespace test_flash_fwd_wgmma_fp8_forward {
using namespace attntune;

namespace {

using attntune::testing::PropertyShape;

std::vector<PropertyShape> fp8_forward_shapes() {
  return {
      {"b=2,h=8,hkv=2,s=1000,sk=1000", Layout::kBHSD},
      {"b=1,h=6,hkv=6,s=257,sk=4099", Layout::kBSHD},
      {"b=3,h=8,hkv=1,s=129,sk=65", Layout::kBHSD},
      {"b=2,h=4,hkv=4,s=1,sk=333", Layout::kBSHD},
      {"b=1,h=2,hkv=1,s=130,sk=65537", Layout::kBHSD},
  };
}

// A window and sinks need builds with those variants (a plain build refuses such a call).
std::vector<PropertyShape> fp8_forward_variant_shapes() {
  return {
      {"b=2,h=8,hkv=2,s=700,sk=1500,window=255,sinks=1", Layout::kBHSD},
      {"b=1,h=4,hkv=1,s=513,sk=513,window=63,sinks=1", Layout::kBSHD},
  };
}

void check_fp8_forward(int d, std::size_t sample, bool per_tensor, const std::function<bool(const Config&)>& keep,
                       const char* variants, const std::vector<PropertyShape>& shapes, float v_mean = 0.f) {
  cuda::Context ctx(0);
  const auto props = cuda::device_props(0);
  if (props.arch < "sm_90") GTEST_SKIP() << "flash_fwd_wgmma needs sm_90; this GPU is " << props.arch;
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_fwd_wgmma.yaml");
  const std::string arch = space_arch_for_device(space, props.arch);  // sm_90a
  std::vector<Config> configs;
  std::vector<Problem> problems;
  // k_perm kernels serve key counts of fours only (their launch refuses others): a spread over shapes
  // with other key counts leaves them out (the KPerm test checks them on shapes they serve).
  bool fours = true;
  for (const PropertyShape& sh : shapes)
    fours = fours && Problem::parse(fmt::format("{},d={},dtype=fp8,causal=0", sh.dims, d)).sk % 4 == 0;
  const auto served = [&](const Config& c) { return (fours || !std::get<bool>(c.at("k_perm"))) && (!keep || keep(c)); };
  for (const char* kind : {"causal=1", "causal=0"}) {
    const Problem base =
        Problem::parse(fmt::format("b=2,h=16,hkv=4,s=4096,sk=4096,d={},dtype=fp8,{}{}", d, kind, variants));
    ASSERT_TRUE(attntune::testing::spread_configs(space, base, arch, sample, configs, problems, served)) << base.str();
  }
  attntune::testing::PropertyRun run;
  run.label = "flash_fwd_wgmma fp8 forward";
  run.d = d;
  run.arch = arch;
  run.seed = 9300 + d + (per_tensor ? 1 : 0) + (*variants ? 2 : 0);
  run.require_no_spills = true;
  run.without_workspaces = true;  // the split tail's workspace withheld: the same kernel, unsplit
  run.qkv_fp8 = true;
  run.per_tensor_descale = per_tensor;
  run.v_mean = v_mean;
  if (v_mean != 0.f) run.seed += 10;
  attntune::testing::check_configs(space, configs, problems, shapes, run);
}

bool flag(const Config& c, const char* name) { return std::get<bool>(c.at(name)); }
std::int64_t num(const Config& c, const char* name) { return std::get<std::int64_t>(c.at(name)); }

// Persistent grids with the split tail, multicast pairs or a narrow first tile.
bool persistent_split_or_pair(const Config& c) {
  return flag(c, "persistent") &&
         (flag(c, "split_tail") || flag(c, "kv_multicast") || std::get<std::int64_t>(c.at("narrow_n")) > 0);
}

// 64k and 128k keys: where a reduced-precision accumulation of O would drift.
std::vector<PropertyShape> long_key_shapes() {
  return {{"b=1,h=2,hkv=1,s=130,sk=65537", Layout::kBHSD}, {"b=1,h=1,hkv=1,s=64,sk=131101", Layout::kBSHD}};
}

// Each chunking (halves and quarters with one accumulator, quarters with two), without the overlap and,
// where `overlap_fits(chunks, buffers)`, with it, on the spread's shapes at head dim d; of the configs
// `also` keeps, where given.
void check_every_chunking(int d, const std::function<bool(int, int)>& overlap_fits,
                          const std::function<bool(const Config&)>& also = {}) {
  for (auto [chunks, buffers] : {std::pair{2, 1}, {4, 1}, {4, 2}})
    for (bool overlap : {false, true}) {
      if (overlap && !overlap_fits(chunks, buffers)) continue;
      SCOPED_TRACE(fmt::format("pv_chunks={} pv_buffers={} intra_wg_overlap={}", chunks, buffers, overlap));
      check_fp8_forward(d, attntune::testing::property_sample(2), false,
                        [&](const Config& c) {
                          return num(c, "pv_chunks") == chunks && num(c, "pv_buffers") == buffers &&
                                 flag(c, "intra_wg_overlap") == overlap && (!also || also(c));
                        },
                        "", fp8_forward_shapes());
    }
}

}  // namespace

TEST(FlashFwdWgmmaFp8ForwardProperty, SpreadD128) {
  ATTNTUNE_REQUIRE_GPU();
  check_fp8_forward(128, attntune::testing::property_sample(6), false, {}, "", fp8_forward_shapes());
}

TEST(FlashFwdWgmmaFp8ForwardProperty, PersistentSplitAndPairsD128) {
  ATTNTUNE_REQUIRE_GPU();
  check_fp8_forward(128, attntune::testing::property_sample(4), false,
                    persistent_split_or_pair,
                    "", fp8_forward_shapes());
}

TEST(FlashFwdWgmmaFp8ForwardProperty, PerTensorScales) {
  ATTNTUNE_REQUIRE_GPU();
  check_fp8_forward(128, attntune::testing::property_sample(2), true, {}, "", fp8_forward_shapes());
}

TEST(FlashFwdWgmmaFp8ForwardProperty, WindowAndSinksD128) {
  ATTNTUNE_REQUIRE_GPU();
  check_fp8_forward(128, attntune::testing::property_sample(3), false, {}, ",window=127,sinks=1",
                    fp8_forward_variant_shapes());
}

TEST(FlashFwdWgmmaFp8ForwardProperty, OtherHeadDims) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {64, 96}) check_fp8_forward(d, attntune::testing::property_sample(2), false, {}, "", fp8_forward_shapes());
}

// The two-level accumulation's check: V around a mean of 2 makes O's running sum grow with the keys
// (a zero-mean V's stays small), 64k and 128k keys, where FP8 wgmma's own accumulation (about 14
// bits of its running sum) alone would drift by several of bf16's units: each tile's P.V must reach
// O in fp32. The outputs and the LSE against the float64 reference, as above.
TEST(FlashFwdWgmmaFp8ForwardProperty, LongKeysNonzeroMeanV) {
  ATTNTUNE_REQUIRE_GPU();
  const std::vector<PropertyShape> shapes = long_key_shapes();
  check_fp8_forward(128, attntune::testing::property_sample(2), false, {}, "", shapes, 2.f);
}

// wg_uniform on the FP8 forward (Q's descriptors in uniform registers): d=128 plain and with a window
// and sinks, the long keys, and d=256's chunked schedules.
TEST(FlashFwdWgmmaFp8ForwardProperty, WgUniform) {
  ATTNTUNE_REQUIRE_GPU();
  const auto uniform = [](const Config& c) { return flag(c, "wg_uniform"); };
  check_fp8_forward(128, attntune::testing::property_sample(6), false, uniform, "", fp8_forward_shapes());
  check_fp8_forward(128, attntune::testing::property_sample(2), false, uniform, ",window=127,sinks=1",
                    fp8_forward_variant_shapes());
  check_fp8_forward(128, attntune::testing::property_sample(2), false, uniform, "", long_key_shapes(), 2.f);
  check_fp8_forward(256, attntune::testing::property_sample(4), false, uniform, "", fp8_forward_shapes());
}

// fold_fma (O's rescale joined to the addition of each tile's P.V, its factor held a tile in the
// overlapped schedule): d=128 in both schedules, causal and not (fp8_forward_shapes), a window with
// sinks (rows that see no key of a tile, and tiles a row sees none of), the long keys, and d=64.
TEST(FlashFwdWgmmaFp8ForwardProperty, FoldFma) {
  ATTNTUNE_REQUIRE_GPU();
  const auto fold = [](const Config& c) { return flag(c, "fold_fma"); };
  const auto fold_plain = [](const Config& c) { return flag(c, "fold_fma") && !flag(c, "intra_wg_overlap"); };
  check_fp8_forward(128, attntune::testing::property_sample(6), false, fold, "", fp8_forward_shapes());
  check_fp8_forward(128, attntune::testing::property_sample(2), false, fold_plain, "", fp8_forward_shapes());
  check_fp8_forward(128, attntune::testing::property_sample(2), false, fold, ",window=127,sinks=1",
                    fp8_forward_variant_shapes());
  check_fp8_forward(128, attntune::testing::property_sample(2), false, fold, "", long_key_shapes(), 2.f);
  check_fp8_forward(64, attntune::testing::property_sample(2), false, fold, "", fp8_forward_shapes());
}

// k_perm (K's rows permuted in pairs within each 16-key group, P packed without shuffles) serves key
// counts of fours only (the launch refuses others): the shapes above with their key counts moved to
// multiples of 4 that are not of 16 (a last 16-key group part past the keys, zero-filled by TMA in
// whole fours) nor of the tiles (more queries than keys, one query row, 64k keys).
std::vector<PropertyShape> key_four_shapes() {
  return {
      {"b=2,h=8,hkv=2,s=1000,sk=1000", Layout::kBHSD},
      {"b=1,h=6,hkv=6,s=257,sk=4100", Layout::kBSHD},
      {"b=3,h=8,hkv=1,s=129,sk=68", Layout::kBHSD},
      {"b=2,h=4,hkv=4,s=1,sk=332", Layout::kBSHD},
      {"b=1,h=2,hkv=1,s=130,sk=65540", Layout::kBHSD},
  };
}

// k_perm: d=128 in every schedule (fp8_forward's spread, causal and not), a window with sinks (its
// bounds through the permuted keys), 64k and 128k keys around a nonzero mean, per-tensor scales, d=64
// and d=96 (three 32-byte column blocks a row: a box each).
TEST(FlashFwdWgmmaFp8ForwardProperty, KPerm) {
  ATTNTUNE_REQUIRE_GPU();
  const auto perm = [](const Config& c) { return flag(c, "k_perm"); };
  check_fp8_forward(128, attntune::testing::property_sample(6), false, perm, "", key_four_shapes());
  check_fp8_forward(128, attntune::testing::property_sample(2), false, perm, ",window=127,sinks=1",
                    {{"b=2,h=8,hkv=2,s=700,sk=1500,window=255,sinks=1", Layout::kBHSD},
                     {"b=1,h=4,hkv=1,s=513,sk=516,window=63,sinks=1", Layout::kBSHD}});
  check_fp8_forward(128, attntune::testing::property_sample(2), false, perm, "",
                    {{"b=1,h=2,hkv=1,s=130,sk=65540", Layout::kBHSD}, {"b=1,h=1,hkv=1,s=64,sk=131100", Layout::kBSHD}},
                    2.f);
  check_fp8_forward(128, attntune::testing::property_sample(2), true, perm, "", key_four_shapes());
  for (int d : {64, 96}) check_fp8_forward(d, attntune::testing::property_sample(2), false, perm, "", key_four_shapes());
}

// ---- d=256: P.V in column chunks (pv_chunks, pv_buffers) ----
TEST(FlashFwdWgmmaFp8ForwardProperty, SpreadD256) {
  ATTNTUNE_REQUIRE_GPU();
  check_fp8_forward(256, attntune::testing::property_sample(6), false, {}, "", fp8_forward_shapes());
}

// Each chunking the space offers at d=256, in each schedule that takes it: halves and quarters with
// one accumulator, quarters with two (the next chunk issued before the last is added), with and
// without the overlap (whose first chunk runs beside the next tile's Q.K^T) and ping-pong.
TEST(FlashFwdWgmmaFp8ForwardProperty, EveryChunkingD256) {
  ATTNTUNE_REQUIRE_GPU();
  // The overlap fits quarters in one accumulator only at d=256.
  check_every_chunking(256, [](int chunks, int buffers) { return chunks == 4 && buffers == 1; });
}

// At d=128 the chunks make room for key tiles past 128 (block_n 144-256; a whole tile's accumulator
// fits up to 128): every chunking in each schedule, then a window with sinks, and the long keys
// around a nonzero mean (every chunk of every tile must reach O in fp32).
TEST(FlashFwdWgmmaFp8ForwardProperty, EveryChunkingD128) {
  ATTNTUNE_REQUIRE_GPU();
  check_every_chunking(128, [](int, int) { return true; });
  const auto chunked = [](const Config& c) { return num(c, "pv_chunks") > 1; };
  check_fp8_forward(128, attntune::testing::property_sample(2), false, chunked, ",window=127,sinks=1",
                    fp8_forward_variant_shapes());
  check_fp8_forward(128, attntune::testing::property_sample(2), false, chunked, "", long_key_shapes(), 2.f);
}

// fold_fma with P.V in column chunks: each chunk's addition rescales O's columns of that chunk (the
// tile's factor in the plain schedule, the held one of the tile whose P.V is in flight in the
// overlapped one), so every element of O is rescaled once a tile. Every chunking in each schedule
// at d=128 and d=256, a window with sinks (rows that see no key of a tile), and the long keys
// around a nonzero mean at both head dims.
TEST(FlashFwdWgmmaFp8ForwardProperty, FoldFmaChunked) {
  ATTNTUNE_REQUIRE_GPU();
  const auto fold = [](const Config& c) { return flag(c, "fold_fma"); };
  const auto fold_chunked = [](const Config& c) { return flag(c, "fold_fma") && num(c, "pv_chunks") > 1; };
  check_every_chunking(128, [](int, int) { return true; }, fold);
  check_every_chunking(256, [](int chunks, int buffers) { return chunks == 4 && buffers == 1; }, fold);
  check_fp8_forward(128, attntune::testing::property_sample(2), false, fold_chunked, ",window=127,sinks=1",
                    fp8_forward_variant_shapes());
  for (int d : {128, 256})
    check_fp8_forward(d, attntune::testing::property_sample(2), false, fold_chunked, "", long_key_shapes(), 2.f);
}

// pp_pv in the FP8 forward: the turn holds P.V's every chunk and addition (fold_fma or not) and the next
// Q.K^T's issue. d=128 with a whole tile's accumulator and every chunking, d=256's chunkings, a window
// with sinks (idle iterations after the extra turn), and the long keys around a nonzero mean.
TEST(FlashFwdWgmmaFp8ForwardProperty, PpPv) {
  ATTNTUNE_REQUIRE_GPU();
  const auto pv = [](const Config& c) { return flag(c, "pp_pv"); };
  const auto pv_whole = [](const Config& c) { return flag(c, "pp_pv") && num(c, "pv_chunks") == 1; };
  check_fp8_forward(128, attntune::testing::property_sample(4), false, pv_whole, "", fp8_forward_shapes());
  check_every_chunking(128, [](int, int) { return false; }, pv);
  check_every_chunking(256, [](int, int) { return false; }, pv);
  check_fp8_forward(128, attntune::testing::property_sample(2), false, pv, ",window=127,sinks=1",
                    fp8_forward_variant_shapes());
  check_fp8_forward(128, attntune::testing::property_sample(2), false, pv, "", long_key_shapes(), 2.f);
}

TEST(FlashFwdWgmmaFp8ForwardProperty, PersistentSplitAndPairsD256) {
  ATTNTUNE_REQUIRE_GPU();
  check_fp8_forward(256, attntune::testing::property_sample(4), false,
                    persistent_split_or_pair,
                    "", fp8_forward_shapes());
}

TEST(FlashFwdWgmmaFp8ForwardProperty, WindowAndSinksAndPerTensorScalesD256) {
  ATTNTUNE_REQUIRE_GPU();
  check_fp8_forward(256, attntune::testing::property_sample(3), false, {}, ",window=127,sinks=1",
                    fp8_forward_variant_shapes());
  check_fp8_forward(256, attntune::testing::property_sample(2), true, {}, "", fp8_forward_shapes());
}

// The two-level accumulation's check at d=256: every chunk of every tile must reach O in fp32 (a
// chunk added twice, or left out, or accumulated across tiles in FP8 wgmma, shows here first).
TEST(FlashFwdWgmmaFp8ForwardProperty, LongKeysNonzeroMeanVD256) {
  ATTNTUNE_REQUIRE_GPU();
  const std::vector<PropertyShape> shapes = long_key_shapes();
  for (int chunks : {2, 4})
    check_fp8_forward(256, attntune::testing::property_sample(2), false,
                      [&](const Config& c) { return num(c, "pv_chunks") == chunks; }, "", shapes, 2.f);
}
}  // namespace test_flash_fwd_wgmma_fp8_forward
