// Property test of flash_fwd_mma's attention variants (issue 41) on every entry point it serves:
// sliding windows (left in {0, 1, 127, 4096, -1}, right in {-1, 64} without causal; causal is
// right 0), soft-caps of 30 and 50 (on an H100 both tanh forms: Newton's at d=64), sinks (the
// worker's logits: random, -1e4 and 1e3 by head) and their combinations, causal and not, dtype
// alternating, GQA/MQA, odd lengths, sk < s (rows that see no key: zeros, LSE -inf or the sink),
// on dense tensors ([B,S,H,D] and [B,H,S,D]), on KV caches (ragged lengths, shuffled block tables
// with spare pages, NaN past each length, pages of 16, 64 and 7 rows, and the same cache
// contiguous) and on packed batches (the worker's inputs and a ragged batch with empty and
// one-row sequences); fresh random inputs, NaN-poisoned outputs, FA2's criterion against the
// reference (templates/reference/reference.cu, which tests/gpu/test_reference.cpp checks against
// float64). Each group builds a spread of configs for one set of variants (their sizes are run-time
// arguments) and runs them on shapes carrying the values. ATTNTUNE_PROPERTY_SAMPLE configs per
// group and head dim (default 2; the new head dims of issue 44, NewHeadDims: 1).
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gpu_env.hpp"
#include "property_check.hpp"

namespace test_flash_fwd_mma_variants {
using namespace attntune;

namespace {

using attntune::testing::PropertyShape;

using Group = attntune::testing::VariantGroup;

// Dense tensors.
const Group kDense[] = {
    {"causal=1,window=64",
     {{"b=2,h=6,hkv=2,s=777,sk=1001,window=0", Layout::kBSHD},
      {"b=1,h=4,hkv=4,s=333,sk=129,window=1", Layout::kBHSD},
      {"b=1,h=3,hkv=1,s=100,sk=300,window=127", Layout::kBSHD},
      {"b=2,h=2,hkv=2,s=257,sk=1500,window=4096", Layout::kBHSD}}},
    {"causal=0,window=64,64",
     {{"b=2,h=6,hkv=2,s=777,sk=1001,window=127,64", Layout::kBSHD},
      {"b=1,h=4,hkv=4,s=333,sk=129,window=0,-1", Layout::kBHSD},
      {"b=1,h=3,hkv=1,s=100,sk=300,window=-1,64", Layout::kBSHD},
      {"b=2,h=2,hkv=2,s=257,sk=257,window=4096,-1", Layout::kBHSD},
      {"b=1,h=2,hkv=1,s=700,sk=300,window=1,64", Layout::kBHSD}}},
    {"causal=1,softcap=30",
     {{"b=2,h=6,hkv=2,s=777,sk=1001,softcap=30", Layout::kBSHD},
      {"b=1,h=4,hkv=4,s=333,sk=129,softcap=50", Layout::kBHSD}}},
    {"causal=0,sinks=1",
     {{"b=2,h=6,hkv=2,s=777,sk=1001,sinks=1", Layout::kBSHD},
      {"b=1,h=3,hkv=1,s=100,sk=300,sinks=1", Layout::kBHSD}}},
    {"causal=1,window=64,softcap=30,sinks=1",
     {{"b=2,h=6,hkv=2,s=777,sk=1001,window=127,softcap=50,sinks=1", Layout::kBSHD},
      {"b=1,h=4,hkv=4,s=333,sk=129,window=1,softcap=30,sinks=1", Layout::kBHSD}}},
    {"causal=0,window=64,64,sinks=1",
     {{"b=2,h=6,hkv=2,s=777,sk=1001,window=127,64,sinks=1", Layout::kBHSD},
      {"b=1,h=4,hkv=4,s=333,sk=129,window=-1,64,sinks=1", Layout::kBSHD}}},
    {"causal=0,softcap=30,sinks=1",
     {{"b=2,h=6,hkv=2,s=777,sk=1001,softcap=30,sinks=1", Layout::kBSHD},
      {"b=1,h=3,hkv=1,s=100,sk=300,softcap=50,sinks=1", Layout::kBHSD}}},
};

// KV caches (chunked prefill over ragged lengths; flash_fwd_mma reads any page size).
const Group kKvcache[] = {
    {"causal=1,window=64",
     {{"b=5,h=6,hkv=2,s=300,sk=1000,page=16,window=127", Layout::kBHSD},
      {"b=3,h=4,hkv=4,s=129,sk=2049,page=64,window=0", Layout::kBSHD},
      {"b=5,h=4,hkv=2,s=100,sk=500,page=7,window=1", Layout::kBHSD},
      {"b=2,h=8,hkv=1,s=777,sk=777,page=16,window=4096", Layout::kBHSD}}},
    {"causal=0,window=64,64",
     {{"b=5,h=6,hkv=2,s=300,sk=1000,page=16,window=127,64", Layout::kBHSD},
      {"b=3,h=4,hkv=4,s=129,sk=2049,page=64,window=-1,64", Layout::kBSHD},
      {"b=5,h=4,hkv=2,s=100,sk=500,page=7,window=1,-1", Layout::kBHSD}}},
    {"causal=1,window=64,softcap=30,sinks=1",
     {{"b=5,h=6,hkv=2,s=300,sk=1000,page=16,window=127,softcap=30,sinks=1", Layout::kBHSD},
      {"b=5,h=4,hkv=2,s=100,sk=500,page=7,window=4096,softcap=50,sinks=1", Layout::kBSHD}}},
    {"causal=0,softcap=30",
     {{"b=5,h=6,hkv=2,s=300,sk=1000,page=16,softcap=50", Layout::kBHSD},
      {"b=3,h=4,hkv=4,s=129,sk=2049,page=64,softcap=30", Layout::kBSHD}}},
    {"causal=1,sinks=1",
     {{"b=5,h=6,hkv=2,s=300,sk=1000,page=16,sinks=1", Layout::kBHSD},
      {"b=5,h=4,hkv=2,s=100,sk=500,page=7,sinks=1", Layout::kBSHD}}},
};

// Packed batches of different lengths.
const Group kVarlen[] = {
    {"causal=1,window=64",
     {{"b=5,h=6,hkv=2,s=777,sk=777,varlen=1,window=127", Layout::kBSHD},
      {"b=3,h=4,hkv=4,s=300,sk=429,varlen=17,window=0", Layout::kBHSD}}},
    {"causal=0,window=64,64",
     {{"b=5,h=6,hkv=2,s=777,sk=777,varlen=1,window=127,64", Layout::kBSHD},
      {"b=3,h=4,hkv=4,s=300,sk=429,varlen=17,window=-1,64", Layout::kBHSD}}},
    {"causal=1,window=64,softcap=30,sinks=1",
     {{"b=5,h=6,hkv=2,s=777,sk=777,varlen=1,window=1,softcap=50,sinks=1", Layout::kBSHD},
      {"b=3,h=4,hkv=4,s=300,sk=429,varlen=17,window=4096,softcap=30,sinks=1", Layout::kBHSD}}},
    {"causal=0,softcap=30,sinks=1",
     {{"b=5,h=6,hkv=2,s=777,sk=777,varlen=1,softcap=30,sinks=1", Layout::kBSHD},
      {"b=3,h=4,hkv=4,s=300,sk=429,varlen=17,softcap=50,sinks=1", Layout::kBHSD}}},
};

// `base`: the entry point's problem kind ("{d}" for the head dim).
void check_groups(const char* base, const Group* groups, std::size_t n_groups, int d, std::uint64_t seed,
                  std::size_t sample = 2) {
  attntune::testing::check_variant_groups("flash_fwd_mma", "flash_fwd_mma variants", base, {groups, n_groups}, d, seed,
                                          sample);
}

}  // namespace

TEST(FlashFwdMmaVariantsProperty, Dense) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {64, 128, 256})
    check_groups("b=1,h=1,s=128,d={d},dtype=bf16", kDense, std::size(kDense), d, 41000 + d);
}

TEST(FlashFwdMmaVariantsProperty, Kvcache) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {64, 128})
    check_groups("b=4,h=32,hkv=8,s=2048,sk=10240,d={d},dtype=bf16,page=64", kKvcache, std::size(kKvcache), d, 42000 + d);
}

TEST(FlashFwdMmaVariantsProperty, Varlen) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {64, 128})
    check_groups("b=4,h=4,s=1024,d={d},dtype=bf16,varlen=1", kVarlen, std::size(kVarlen), d, 43000 + d);
}

// Head dims other than 64, 128, 256 (issue 44), one of each swizzle span and loader shape: 64-byte
// spans in one panel (32) and in 3 (96), 32-byte spans in 5 panels (80), 128-byte spans in 3
// (192), 32-byte spans in 15 (240); every group of every entry point, a config each.
TEST(FlashFwdMmaVariantsProperty, NewHeadDims) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {32, 80, 96, 192, 240}) {
    SCOPED_TRACE(fmt::format("d={}", d));
    check_groups("b=1,h=1,s=128,d={d},dtype=bf16", kDense, std::size(kDense), d, 46000 + d, 1);
    check_groups("b=4,h=32,hkv=8,s=2048,sk=10240,d={d},dtype=bf16,page=64", kKvcache, std::size(kKvcache), d,
                 47000 + d, 1);
    check_groups("b=4,h=4,s=1024,d={d},dtype=bf16,varlen=1", kVarlen, std::size(kVarlen), d, 48000 + d, 1);
  }
}
}  // namespace test_flash_fwd_mma_variants
