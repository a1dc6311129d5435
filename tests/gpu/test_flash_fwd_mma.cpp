// Property test: every valid config of the flash_fwd_mma space (d=64, 128 and 256) matches the
// reference on fresh random inputs, with a NaN-poisoned output, at shapes covering odd lengths,
// causal, GQA/MQA, sk != s and the [B,S,H,D] layout. dtype and causal alternate over the configs
// so every combination is covered without building each config four times.
// ATTNTUNE_PROPERTY_SAMPLE=N checks a fixed spread of N configs per head dim instead of all.
// The other head dims (multiples of 16 from 32 to 256, issue 44: 64- and 32-byte swizzle spans,
// loaders in panels of a row) a spread of configs each (default 12), dense, and a spread of their
// KV cache (paged, odd pages, contiguous) and packed-batch configs (FlashFwdMmaHeadDims).
#include <cstdlib>
#include <span>

#include <fmt/format.h>

#include "gpu_env.hpp"
#include "property_check.hpp"

namespace test_flash_fwd_mma {
using namespace attntune;

namespace {

using attntune::testing::PropertyShape;
const PropertyShape kShapes[] = {
    {"b=2,h=6,hkv=2,s=777,sk=1001", Layout::kBSHD},  // GQA, sk > s, odd lengths
    {"b=1,h=4,hkv=4,s=333,sk=129", Layout::kBHSD},   // sk < s: causal rows that see no key
    {"b=1,h=3,hkv=1,s=100,sk=300", Layout::kBSHD},   // MQA, s shorter than a block
    {"b=2,h=2,hkv=2,s=257,sk=257", Layout::kBHSD},   // one past a tile
};

// `sample`: configs per head dim, a fixed spread (0: every valid config).
// dv: V's head dim when it is not d.
void check_space(int d, std::size_t sample, int dv = 0) {
  cuda::Context ctx(0);
  const auto props = cuda::device_props(0);
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_fwd_mma.yaml");
  const std::string arch = props.arch;
  const Problem base = Problem::parse(
      fmt::format("b=1,h=1,s=128,d={}{},dtype=bf16,causal=0", d, dv ? fmt::format(",dv={}", dv) : std::string()));
  std::vector<Config> configs = space.enumerate(base, arch);
  ASSERT_FALSE(configs.empty());
  if (sample) {
    const std::size_t n = sample, step = std::max<std::size_t>(1, configs.size() / n);
    std::vector<Config> picked;
    for (std::size_t i = 0; i < configs.size() && picked.size() < n; i += step) picked.push_back(configs[i]);
    configs = picked;
  }
  std::vector<Problem> variants;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    Problem p = base;
    p.dtype = i % 2 ? DType::kFp16 : DType::kBf16;
    p.causal = (i / 2) % 2;
    variants.push_back(p);
  }
  attntune::testing::PropertyRun run{"flash_fwd_mma", d, arch, 1000};
  run.dv = dv;
  attntune::testing::check_configs(space, configs, variants, kShapes, run);
}

// Every config unless ATTNTUNE_PROPERTY_SAMPLE says how many.
void check_space(int d) { check_space(d, attntune::testing::property_sample(0)); }

// KV caches (chunked prefill: ragged lengths, shuffled block tables with spare pages, NaN past
// each length, pages of 16, 64 and 7 rows, and the same cache contiguous) and packed batches, as
// tests/gpu/test_prefill_kvcache.cpp and test_prefill_varlen.cpp check d=64 and 128.
const PropertyShape kKvcacheShapes[] = {
    {"b=5,h=6,hkv=2,s=300,sk=1000,page=16", Layout::kBHSD},
    {"b=3,h=4,hkv=4,s=129,sk=2049,page=64", Layout::kBSHD},
    {"b=6,h=4,hkv=2,s=40,sk=3001,page=64", Layout::kBHSD},
    {"b=5,h=4,hkv=2,s=100,sk=500,page=7", Layout::kBHSD},
};
const PropertyShape kVarlenShapes[] = {
    {"b=5,h=6,hkv=2,s=777,sk=777,varlen=1", Layout::kBSHD},
    {"b=3,h=4,hkv=4,s=300,sk=429,varlen=17", Layout::kBHSD},
};

// A spread of `kind`'s configs (ATTNTUNE_PROPERTY_SAMPLE per causality, default 3), causal and
// not, on `shapes`.
void check_entry(const char* kind, int d, std::span<const PropertyShape> shapes, std::uint64_t seed, int dv = 0) {
  cuda::Context ctx(0);
  const std::string arch = cuda::device_props(0).arch;
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_fwd_mma.yaml");
  std::vector<Config> configs;
  std::vector<Problem> variants;
  for (int causal = 0; causal < 2; ++causal) {
    const Problem p = Problem::parse(fmt::format(fmt::runtime(kind), fmt::arg("d", d)) +
                                     (dv ? fmt::format(",dv={}", dv) : std::string()) + fmt::format(",causal={}", causal));
    ASSERT_TRUE(attntune::testing::spread_configs(space, p, arch, attntune::testing::property_sample(3), configs, variants))
        << p.str();
  }
  attntune::testing::PropertyRun run{"flash_fwd_mma", d, arch, seed, /*require_no_spills=*/false};
  run.dv = dv;
  attntune::testing::check_configs(space, configs, variants, shapes, run);
}

// The new head dims by layout: 64-byte spans (32: one panel, idle threads in a pass of 8 warps
// over 32 rows; 96, 160, 224: 3, 5, 7 panels of 4 chunks), 32-byte spans (48, 80, 112, 144, 176,
// 208, 240: 3 to 15 panels of 2 chunks, idle threads at block_n 32), 128-byte spans in panels
// (192: 3 of 8 chunks).
constexpr int kNewDims[] = {32, 48, 80, 96, 112, 144, 160, 176, 192, 208, 224, 240};

}  // namespace

TEST(FlashFwdMmaProperty, AllConfigsD64) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(64);
}

TEST(FlashFwdMmaProperty, AllConfigsD128) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(128);
}

TEST(FlashFwdMmaProperty, AllConfigsD256) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(256);
}

// A spread of each new head dim's dense configs (ATTNTUNE_PROPERTY_SAMPLE, default 12).
class FlashFwdMmaHeadDims : public ::testing::TestWithParam<int> {};

TEST_P(FlashFwdMmaHeadDims, Spread) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(GetParam(), attntune::testing::property_sample(12));
}

TEST_P(FlashFwdMmaHeadDims, Kvcache) {
  ATTNTUNE_REQUIRE_GPU();
  check_entry("b=4,h=32,hkv=8,s=2048,sk=10240,d={d},dtype=bf16,page=64", GetParam(), kKvcacheShapes, 44000);
}

TEST_P(FlashFwdMmaHeadDims, Varlen) {
  ATTNTUNE_REQUIRE_GPU();
  check_entry("b=4,h=4,s=1024,d={d},dtype=bf16,varlen=1", GetParam(), kVarlenShapes, 45000);
}

INSTANTIATE_TEST_SUITE_P(NewDims, FlashFwdMmaHeadDims, ::testing::ValuesIn(kNewDims),
                         [](const auto& info) { return fmt::format("D{}", info.param); });

// V's head dim other than Q's and K's (`dv=N`): DeepSeek's MLA prefill (192 / 128: V's rows one
// 128-byte span narrower than K's), the other way round (64 / 128), and 32-byte and 64-byte V spans
// under a 128-byte K span (128 / 80, 192 / 96). Dense spreads, the KV cache (paged, odd pages,
// contiguous) and packed batches.
struct SplitDims {
  int d, dv;
};
void PrintTo(const SplitDims& s, std::ostream* os) { *os << "d=" << s.d << ",dv=" << s.dv; }
class FlashFwdMmaSplitDims : public ::testing::TestWithParam<SplitDims> {};

TEST_P(FlashFwdMmaSplitDims, Spread) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(GetParam().d, attntune::testing::property_sample(12), GetParam().dv);
}

TEST_P(FlashFwdMmaSplitDims, Kvcache) {
  ATTNTUNE_REQUIRE_GPU();
  check_entry("b=4,h=32,hkv=8,s=2048,sk=10240,d={d},dtype=bf16,page=64", GetParam().d, kKvcacheShapes, 46000,
              GetParam().dv);
}

TEST_P(FlashFwdMmaSplitDims, Varlen) {
  ATTNTUNE_REQUIRE_GPU();
  check_entry("b=4,h=4,s=1024,d={d},dtype=bf16,varlen=1", GetParam().d, kVarlenShapes, 47000, GetParam().dv);
}

INSTANTIATE_TEST_SUITE_P(Dv, FlashFwdMmaSplitDims,
                         ::testing::Values(SplitDims{192, 128}, SplitDims{64, 128}, SplitDims{128, 80},
                                           SplitDims{192, 96}),
                         [](const auto& info) { return fmt::format("D{}V{}", info.param.d, info.param.dv); });
}  // namespace test_flash_fwd_mma
