// Property test of flash_fwd_mma's GQA packing (pack_gqa, issue 43): a spread of the configs that
// pack a KV head's query heads into a CTA's rows, on every entry point (dense, KV cache paged and
// contiguous, packed batches) and with the variants whose state is per row (a window's and the
// causal diagonal's bounds, a sink's head), causal and not, dtype alternating. The shapes are
// where packing is easy to get wrong: groups of 2, 3, 4 and 7 heads (a packed row's head is r % G,
// its query r / G), and 1 (MQA's opposite: a packed build still serves it), few and odd query
// rows (a tile of several heads' rows, a last tile part empty), sk < s (rows that see no key), and
// both layouts ([B,S,H,D]: a group's heads 1 row apart; [B,H,S,D]: a sequence apart). Fresh random
// inputs, NaN-poisoned outputs, FA2's criterion against the reference. ATTNTUNE_PROPERTY_SAMPLE
// configs per group and head dim (default 3).
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gpu_env.hpp"
#include "property_check.hpp"

namespace test_flash_fwd_mma_pack {
using namespace attntune;

namespace {

using attntune::testing::PropertyShape;

using Group = attntune::testing::VariantGroup;

const Group kDense[] = {
    {"causal=1",
     {{"b=2,h=6,hkv=2,s=17,sk=1001", Layout::kBSHD},
      {"b=1,h=7,hkv=1,s=33,sk=129", Layout::kBHSD},
      {"b=3,h=8,hkv=2,s=5,sk=300", Layout::kBSHD},
      {"b=1,h=4,hkv=2,s=257,sk=100", Layout::kBHSD},
      {"b=2,h=6,hkv=6,s=40,sk=300", Layout::kBSHD}}},
    {"causal=0",
     {{"b=2,h=6,hkv=3,s=17,sk=1001", Layout::kBHSD},
      {"b=1,h=7,hkv=1,s=100,sk=129", Layout::kBSHD},
      {"b=3,h=8,hkv=2,s=1,sk=300", Layout::kBHSD}}},
    {"causal=1,window=64,softcap=30,sinks=1",
     {{"b=2,h=6,hkv=2,s=17,sk=1001,window=127,softcap=50,sinks=1", Layout::kBSHD},
      {"b=1,h=7,hkv=1,s=33,sk=129,window=1,softcap=30,sinks=1", Layout::kBHSD},
      {"b=1,h=4,hkv=2,s=257,sk=100,window=0,softcap=30,sinks=1", Layout::kBSHD}}},
    {"causal=0,window=64,64,sinks=1",
     {{"b=2,h=6,hkv=3,s=40,sk=1001,window=127,64,sinks=1", Layout::kBHSD},
      {"b=1,h=8,hkv=2,s=9,sk=300,window=-1,64,sinks=1", Layout::kBSHD}}},
};

const Group kKvcache[] = {
    {"causal=1",
     {{"b=5,h=6,hkv=2,s=17,sk=1000,page=16", Layout::kBHSD},
      {"b=3,h=8,hkv=1,s=40,sk=2049,page=64", Layout::kBSHD},
      {"b=5,h=4,hkv=2,s=100,sk=500,page=7", Layout::kBHSD}}},
    {"causal=0",
     {{"b=5,h=6,hkv=3,s=17,sk=1000,page=16", Layout::kBSHD},
      {"b=3,h=7,hkv=1,s=33,sk=2049,page=64", Layout::kBHSD}}},
    {"causal=1,window=64,softcap=30,sinks=1",
     {{"b=5,h=6,hkv=2,s=17,sk=1000,page=16,window=127,softcap=30,sinks=1", Layout::kBHSD},
      {"b=5,h=4,hkv=2,s=100,sk=500,page=7,window=4096,softcap=50,sinks=1", Layout::kBSHD}}},
};

const Group kVarlen[] = {
    {"causal=1",
     {{"b=5,h=6,hkv=2,s=77,sk=77,varlen=1", Layout::kBSHD},
      {"b=3,h=8,hkv=2,s=300,sk=429,varlen=17", Layout::kBHSD}}},
    {"causal=0,window=64,64,softcap=30,sinks=1",
     {{"b=5,h=7,hkv=1,s=77,sk=77,varlen=1,window=1,64,softcap=50,sinks=1", Layout::kBSHD},
      {"b=3,h=6,hkv=3,s=300,sk=429,varlen=17,window=127,-1,softcap=30,sinks=1", Layout::kBHSD}}},
};

// `base`: the entry point's problem kind ("{d}" for the head dim), with GQA and few query rows so
// that packing is valid for it; the spread keeps the configs that pack.
void check_groups(const char* base, const Group* groups, std::size_t n_groups, int d, std::uint64_t seed,
                  std::size_t sample = 3) {
  attntune::testing::check_variant_groups("flash_fwd_mma", "flash_fwd_mma pack_gqa", base, {groups, n_groups}, d, seed,
                                          sample, [](const Config& c) { return std::get<bool>(c.at("pack_gqa")); });
}

}  // namespace

TEST(FlashFwdMmaPackGqa, Dense) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {64, 128})
    check_groups("b=4,h=32,hkv=8,s=40,sk=4096,d={d},dtype=bf16", kDense, std::size(kDense), d, 51000 + d);
}

TEST(FlashFwdMmaPackGqa, Kvcache) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {64, 128})
    check_groups("b=4,h=32,hkv=8,s=40,sk=8192,d={d},dtype=bf16,page=16", kKvcache, std::size(kKvcache), d, 52000 + d);
}

TEST(FlashFwdMmaPackGqa, Varlen) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {64, 128})
    check_groups("b=4,h=32,hkv=8,s=1024,d={d},dtype=bf16,varlen=1", kVarlen, std::size(kVarlen), d, 53000 + d);
}

// Head dims whose Q loads go in panels of a row (96: 3 of 4 chunks; 80: 5 of 2) and d = 256, one
// config a group.
TEST(FlashFwdMmaPackGqa, OtherHeadDims) {
  ATTNTUNE_REQUIRE_GPU();
  for (int d : {80, 96, 256}) {
    SCOPED_TRACE(fmt::format("d={}", d));
    check_groups("b=4,h=32,hkv=8,s=40,sk=4096,d={d},dtype=bf16", kDense, std::size(kDense), d, 54000 + d, 1);
    check_groups("b=4,h=32,hkv=8,s=40,sk=8192,d={d},dtype=bf16,page=16", kKvcache, std::size(kKvcache), d,
                 55000 + d, 1);
  }
}
}  // namespace test_flash_fwd_mma_pack
