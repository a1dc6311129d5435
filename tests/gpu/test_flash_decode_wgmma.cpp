// Property test of flash_decode_wgmma (sm_90a): a spread of 32 valid configs (or all, where fewer) of its space at multi-head
// latent attention's dims (d=576, dv=512; V apart and a latent cache, V = K's first 512 columns) and
// at d=512, causal and not, bf16 and fp16 alternating,
// each built through the tuner's pool and launched through its launch plan (flash_decode's: splits
// from this GPU's SM count, the combine kernel or the last CTA, and again with the plan's workspaces
// withheld), on the shapes MLA decoding brings: one KV head under 16..128 query heads (one or two
// 64-row blocks), seqlen_q 1..4 with bottom-right causal masks, GQA groups whose rows do not fill a
// block, odd and long key counts (many splits, empty ones), the [B,S,H,D] layout, and paged caches
// (pages of 64, FlashMLA's, and 16; shuffled block tables, ragged lengths 0, 1, odd, all, NaN past
// each length; then the same cache contiguous). FlashAttention-2's criterion against the reference.
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gpu_env.hpp"
#include "property_check.hpp"

namespace test_flash_decode_wgmma {
using namespace attntune;

namespace {

using attntune::testing::PropertyShape;
const PropertyShape kShapes[] = {
    {"b=3,h=16,hkv=1,s=1,sk=1001", Layout::kBHSD},          // 16 rows of 64, odd length
    {"b=2,h=128,hkv=1,s=1,sk=777,page=64", Layout::kBSHD},  // two row blocks, FlashMLA's pages
    {"b=1,h=64,hkv=1,s=1,sk=20011", Layout::kBHSD},         // one sequence: many splits
    {"b=4,h=32,hkv=1,s=2,sk=600,page=64", Layout::kBHSD},   // q-len 2: 64 rows
    {"b=5,h=16,hkv=1,s=4,sk=300,page=16", Layout::kBSHD},   // q-len 4, pages of 16
    {"b=2,h=40,hkv=2,s=3,sk=500", Layout::kBSHD},           // GQA 20:1 x 3 = 60 rows, two KV heads
};
// Multicast builds pair a unit's row blocks in clusters of 2: shapes of an even row-block count.
const PropertyShape kEvenShapes[] = {
    {"b=2,h=128,hkv=1,s=1,sk=777,page=64", Layout::kBSHD},  // two row blocks, FlashMLA's pages
    {"b=1,h=128,hkv=1,s=1,sk=20011", Layout::kBHSD},        // one sequence: many splits
    {"b=3,h=64,hkv=1,s=2,sk=1001", Layout::kBHSD},          // q-len 2: 128 rows
    {"b=2,h=32,hkv=1,s=4,sk=600,page=16", Layout::kBSHD},   // q-len 4, pages of 16
    {"b=2,h=64,hkv=2,s=3,sk=500", Layout::kBSHD},           // 96 rows a KV head: two blocks, one partial
};

// latent: `latent=1` (V is K's first dv columns, one buffer: the buffers pass v = k).
// multicast: the multicast configs on kEvenShapes, else the others on kShapes.
// uniform: only wg_uniform builds (the warpgroup index and Q's descriptor broadcast from lane 0).
void check_space(int d, int dv, bool latent = false, bool multicast = false, bool uniform = false) {
  cuda::Context ctx(0);
  const auto props = cuda::device_props(0);
  if (props.arch < "sm_90") GTEST_SKIP() << "flash_decode_wgmma needs sm_90 (wgmma, TMA); this GPU is " << props.arch;
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_decode_wgmma.yaml");
  std::vector<Config> configs;
  std::vector<Problem> variants;
  const std::string dvs = (dv != d ? fmt::format(",dv={}", dv) : std::string()) + (latent ? ",latent=1" : "");
  for (const char* kind : {"s=1,causal=0", "s=4,causal=1"}) {
    const Problem base =
        Problem::parse(fmt::format("b=1,h=128,hkv=1,{},sk=4096,d={}{},dtype=bf16,page=64", kind, d, dvs));
    ASSERT_TRUE(attntune::testing::spread_configs(space, base, "sm_90a", attntune::testing::property_sample(32),
                                                  configs, variants,
                                                  [&](const Config& c) {
                                                    return std::get<bool>(c.at("multicast")) == multicast &&
                                                           (!uniform || std::get<bool>(c.at("wg_uniform")));
                                                  }))
        << base.str();
  }
  attntune::testing::PropertyRun run;
  run.label = "flash_decode_wgmma";
  run.d = d;
  run.arch = "sm_90a";
  run.seed = 5000 + d;
  run.require_no_spills = true;
  run.without_workspaces = true;
  run.dv = dv != d ? dv : 0;
  run.latent = latent;
  if (multicast) attntune::testing::check_configs(space, configs, variants, kEvenShapes, run);
  else attntune::testing::check_configs(space, configs, variants, kShapes, run);
}

// The FP8 path (kv_dtype=fp8, d=128: templates/flash_decode_wgmma/fp8.cuh): every config of its
// space (or a spread) over the decode rows it is for: 4, 32 and 64 packed rows (q-len 1, spec4, q8,
// q16), GQA rows that do not fill a block, several row blocks a KV head, odd and long key counts
// (65537: many splits, the LSE over a long range), pages of 16 and 64, per-(sequence, KV head) and
// per-tensor scales; bf16 queries (the space refuses fp16 ones: run 387).
const PropertyShape kFp8Shapes[] = {
    {"b=3,h=32,hkv=8,s=1,sk=1001", Layout::kBHSD},          // 4 rows, odd length
    {"b=2,h=32,hkv=8,s=16,sk=777,page=16", Layout::kBSHD},  // q16: 64 rows, paged
    {"b=1,h=8,hkv=2,s=1,sk=65537", Layout::kBHSD},          // one long sequence: many splits
    {"b=4,h=64,hkv=8,s=4,sk=600,page=64", Layout::kBHSD},   // spec4: 32 rows
    {"b=5,h=32,hkv=8,s=8,sk=300,page=16", Layout::kBSHD},   // q8: 32 rows
    {"b=2,h=40,hkv=2,s=3,sk=500", Layout::kBSHD},           // 20:1 x 3 = 60 rows
    {"b=1,h=16,hkv=1,s=16,sk=3000", Layout::kBHSD},         // 256 rows: four row blocks
};

void check_fp8(bool per_tensor, std::size_t sample) {
  cuda::Context ctx(0);
  const auto props = cuda::device_props(0);
  if (props.arch < "sm_90") GTEST_SKIP() << "flash_decode_wgmma needs sm_90 (wgmma, TMA); this GPU is " << props.arch;
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_decode_wgmma.yaml");
  std::vector<Config> configs;
  std::vector<Problem> variants;
  for (const char* kind : {"s=1,causal=0", "s=16,causal=1"}) {
    const Problem base =
        Problem::parse(fmt::format("b=4,h=32,hkv=8,{},sk=4096,d=128,dtype=bf16,page=16,kv_dtype=fp8", kind));
    ASSERT_TRUE(attntune::testing::spread_configs(space, base, "sm_90a", sample, configs, variants)) << base.str();
  }
  attntune::testing::PropertyRun run;
  run.label = "flash_decode_wgmma";
  run.d = 128;
  run.arch = "sm_90a";
  run.seed = 5900 + (per_tensor ? 1 : 0);
  run.require_no_spills = true;
  run.without_workspaces = true;
  run.kv_fp8 = true;
  run.per_tensor_descale = per_tensor;
  attntune::testing::check_configs(space, configs, variants, kFp8Shapes, run);
}

}  // namespace

TEST(FlashDecodeWgmmaFp8Property, D128) {
  ATTNTUNE_REQUIRE_GPU();
  check_fp8(false, attntune::testing::property_sample(12));
}

TEST(FlashDecodeWgmmaFp8Property, PerTensorScales) {
  ATTNTUNE_REQUIRE_GPU();
  check_fp8(true, attntune::testing::property_sample(4));
}

TEST(FlashDecodeWgmmaProperty, MlaDims) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(576, 512);
}

// MLA's latent cache: a spread of the latent space (block_n 64 and the overlap schedule among them:
// a tile of K alone leaves room for more stages).
TEST(FlashDecodeWgmmaProperty, MlaLatent) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(576, 512, true);
}

// Multicast (the row blocks of a split in clusters of 2, each producer loading half of a tile's
// column blocks into both): MLA's latent cache (the space offers multicast for latent caches only).
TEST(FlashDecodeWgmmaProperty, MlaLatentMulticast) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(576, 512, true, true);
}

TEST(FlashDecodeWgmmaProperty, D512) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(512, 512);
}

// wg_uniform: the latent cache with and without multicast, and MLA's separate V, each build with the
// warpgroup index and Q's descriptor in uniform registers.
TEST(FlashDecodeWgmmaProperty, WgUniform) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(576, 512, true, false, true);
  check_space(576, 512, true, true, true);
  check_space(576, 512, false, false, true);
}
}  // namespace test_flash_decode_wgmma
