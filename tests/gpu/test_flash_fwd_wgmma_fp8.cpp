// Property test of flash_fwd_wgmma over an FP8 e4m3 KV cache (`kv_dtype=fp8`, issue 42: chunked
// prefill over FP8 pages), both ways a call reads it: each shape with the plan's workspaces (calls
// of two or more query tiles a KV head convert the cache once into a 16-bit copy first:
// flash_fwd_wgmma_kv_dequant) and again without them (the producer warpgroup's other three warps
// convert each staged tile: mainloop.cuh, convert_tile). K's per-(sequence, KV head) scale joins the
// softmax scale, V's multiplies O. A spread of the configs that serve it (block_m 128-192, block_n,
// stages, persistent grids taking tiles from the counter, GQA packing, the overlap and ping-pong
// schedules), bf16 and fp16 queries alternating, against the reference over the dequantised cache:
// chunks of queries over longer caches (causal bottom-right and not), odd lengths and ragged
// batches with NaN bytes past each sequence's keys (the staging and the copy hold whatever was
// there: K's scores are masked by assignment, V's rows zeroed), pages of 8, 16 and 64 and shuffled
// tables, both layouts, windows and sinks (builds with them), GQA groups 1-8, head dims 64 (the
// staging's 64-byte swizzle), 96 (32-byte), 128 and 256 (128-byte; block_m 64), per-tensor scales
// (strides 0), and one long cache (sk 65537: the LSE over 64k keys). ATTNTUNE_PROPERTY_SAMPLE
// configs a kind (causal or not; default 6 at d=128, 2 at the other head dims: at 3 they ran past
// 140 s on an H200, at 1 in 14 s, run 250).
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gpu_env.hpp"
#include "property_check.hpp"

namespace test_flash_fwd_wgmma_fp8 {
using namespace attntune;

namespace {

using attntune::testing::PropertyShape;

std::vector<PropertyShape> fp8_chunk_shapes() {
  return {
      {"b=5,h=8,hkv=2,s=17,sk=1000,page=16", Layout::kBHSD},
      {"b=3,h=8,hkv=1,s=300,sk=2049,page=64", Layout::kBSHD},
      {"b=5,h=4,hkv=2,s=100,sk=500,page=8", Layout::kBHSD},
      {"b=2,h=6,hkv=6,s=257,sk=257,page=16", Layout::kBSHD},
      {"b=4,h=16,hkv=2,s=33,sk=4000,page=16", Layout::kBSHD},
      {"b=1,h=8,hkv=2,s=64,sk=65537,page=64", Layout::kBHSD},
  };
}

// A window and sinks need builds with those variants (a plain build refuses such a call).
std::vector<PropertyShape> fp8_variant_shapes() {
  return {
      {"b=5,h=8,hkv=2,s=40,sk=1000,page=16,window=127,sinks=1", Layout::kBHSD},
      {"b=3,h=8,hkv=4,s=129,sk=3000,page=64,window=127,sinks=1", Layout::kBSHD},
  };
}

void check_fp8_shapes(int d, std::size_t sample, bool per_tensor, const std::function<bool(const Config&)>& keep,
                      const char* variants, const std::vector<PropertyShape>& shapes) {
  cuda::Context ctx(0);
  const auto props = cuda::device_props(0);
  if (props.arch < "sm_90") GTEST_SKIP() << "flash_fwd_wgmma needs sm_90; this GPU is " << props.arch;
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_fwd_wgmma.yaml");
  const std::string arch = space_arch_for_device(space, props.arch);  // sm_90a
  std::vector<Config> configs;
  std::vector<Problem> problems;
  for (const char* kind : {"causal=1", "causal=0"}) {
    const Problem base = Problem::parse(fmt::format(
        "b=4,h=32,hkv=8,s=300,sk=4096,d={},dtype=bf16,{},page=16{},kv_dtype=fp8", d, kind, variants));
    ASSERT_TRUE(attntune::testing::spread_configs(space, base, arch, sample, configs, problems, keep)) << base.str();
  }
  attntune::testing::PropertyRun run;
  run.label = "flash_fwd_wgmma fp8";
  run.d = d;
  run.arch = arch;
  run.seed = 9100 + d + (per_tensor ? 1 : 0) + (*variants ? 2 : 0);
  run.require_no_spills = true;
  run.without_workspaces = true;
  run.kv_fp8 = true;
  run.per_tensor_descale = per_tensor;
  attntune::testing::check_configs(space, configs, problems, shapes, run);
}

void check_fp8(int d, std::size_t sample, bool per_tensor = false,
               const std::function<bool(const Config&)>& keep = {}) {
  check_fp8_shapes(d, sample, per_tensor, keep, "", fp8_chunk_shapes());
}

bool flag(const Config& c, const char* name) { return std::get<bool>(c.at(name)); }

}  // namespace

TEST(FlashFwdWgmmaFp8Property, SpreadD128) {
  ATTNTUNE_REQUIRE_GPU();
  check_fp8(128, attntune::testing::property_sample(6));
}

TEST(FlashFwdWgmmaFp8Property, PackedAndPersistentD128) {
  ATTNTUNE_REQUIRE_GPU();
  check_fp8(128, attntune::testing::property_sample(4), false,
            [](const Config& c) { return flag(c, "pack_gqa") || flag(c, "persistent"); });
}

TEST(FlashFwdWgmmaFp8Property, PerTensorScales) {
  ATTNTUNE_REQUIRE_GPU();
  check_fp8(128, attntune::testing::property_sample(2), true);
}

TEST(FlashFwdWgmmaFp8Property, WindowAndSinksD128) {
  ATTNTUNE_REQUIRE_GPU();
  check_fp8_shapes(128, attntune::testing::property_sample(3), false, {}, ",window=127,sinks=1", fp8_variant_shapes());
}

TEST(FlashFwdWgmmaFp8Property, OtherHeadDims) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {64, 96, 256}) check_fp8(d, attntune::testing::property_sample(2));
}
}  // namespace test_flash_fwd_wgmma_fp8
