// Chunked prefill over a KV cache (attntune_attention_forward_kvcache) in the prefill families, on
// CI (no GPU): a paged problem renders ATT_KVCACHE (and only it does, and only in the prefill
// families), one build serves every page size, the spaces leave decode-length paged problems to
// flash_decode and flash_fwd_wgmma odd pages to flash_fwd_mma, the launch plans accept the kvcache
// entry point from kvcache builds only, flash_fwd_wgmma's K/V tensor maps span pages in boxes of
// gcd(page_size, block_n) rows, and kvcache builds compile for every arch the spaces list.
// tests/gpu/ checks the values.
#include <cstdint>
#include <cstring>
#include <future>
#include <map>
#include <numeric>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cuda/nvrtc.hpp"
#include "tests/common/plan_call.hpp"
#include "templates/flash_fwd_mma/launch.h"
#include "templates/flash_fwd_wgmma/launch.h"

namespace test_prefill_kvcache {
using namespace attntune;
using attntune::testing::dense_call_of;
using attntune::testing::FakeDevice;
using attntune::testing::first_config;
using attntune::testing::space_of;
using attntune::testing::varlen_call_of;

namespace {

std::string arch_of(const std::string& family) { return family == "flash_fwd_wgmma" ? "sm_90a" : "sm_90"; }

std::int64_t int_of(const Config& c, const char* name) { return std::get<std::int64_t>(c.at(name)); }

const Problem kPaged = Problem::parse("b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=bf16,causal=1,page=64");
const Problem kDense = Problem::parse("b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=bf16,causal=1");
const Problem kVarlen = Problem::parse("b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=bf16,causal=1,varlen=128");
const Problem kDecodePaged = Problem::parse("b=16,h=32,hkv=8,s=1,sk=8192,d=128,dtype=bf16,causal=1,page=16");

constexpr long long kTableAddress = 1ll << 41;

// A kvcache call of p (seqlen_k_max p.sk, cache_seqlens at a fake address). With a table: pages of
// `page` rows (p.page when 0), K/V [pages, page, heads_kv, d] through {page, head, row} strides,
// as many table entries per sequence as sk needs (`blocks` when > 0). Without: K/V contiguous
// [batch, heads_kv, sk, d] with {batch, head, row} strides, as for a dense call.
attntune_plan::Call kvcache_call_of(const Problem& p, bool table, int page = 0, int blocks = 0) {
  attntune_plan::Call c = dense_call_of(p);
  c.entry = attntune_plan::kEntryKvcache;
  c.cache_seqlens = reinterpret_cast<const int*>(1ll << 40);
  if (!table) return c;
  const long long rows = page > 0 ? page : p.page;
  c.block_table = reinterpret_cast<const int*>(kTableAddress);
  c.page_size = static_cast<int>(rows);
  c.max_blocks_per_seq = blocks > 0 ? blocks : static_cast<int>((p.sk + rows - 1) / rows);
  for (long long* st : {c.k_stride, c.v_stride}) {
    st[0] = rows * p.hkv * p.d;  // a page
    st[1] = p.d;                 // a head
    st[2] = p.hkv * p.d;         // a row
  }
  return c;
}

// The kernel arguments bind writes for `call` (AttnParams first, then flash_fwd_wgmma's TmaMaps).
template <class Launch>
attntune_plan::Args bind_of(const RenderedKernel& k, const attntune_plan::Call& call, const attntune_plan::Plan& plan,
                            const char* family) {
  const Launch consts = launch_constants<Launch>(k.launch.defines, family);
  alignas(64) static unsigned char map_bytes[attntune_plan::kMaxTensorMaps][attntune_plan::kTensorMapBytes];
  attntune_plan::Resources res;
  std::memset(&res, 0, sizeof res);
  for (int m = 0; m < attntune_plan::kMaxTensorMaps; ++m) res.map[m] = map_bytes[m];
  attntune_plan::Args args;
  attntune_plan::Why why;
  why.text[0] = 0;
  EXPECT_EQ(consts.bind(call, plan, res, 0, &args, &why), 0) << why.text;
  return args;
}

AttnParams params_of(const attntune_plan::Args& args) {
  AttnParams p;
  std::memcpy(&p, args.ptr[0], sizeof p);
  return p;
}

}  // namespace

TEST(PrefillKvcache, OnlyPagedProblemsRenderAttKvcacheInThePrefillFamilies) {
  for (const char* family : {"flash_fwd_mma", "flash_fwd_wgmma"}) {
    const SearchSpace space = space_of(family);
    const std::string arch = arch_of(family);
    const Config c = first_config(space, kPaged, arch, [](const Config&) { return true; });
    ASSERT_FALSE(c.empty()) << family;
    const RenderedKernel paged = render_kernel(space, c, kPaged, arch), dense = render_kernel(space, c, kDense, arch),
                         varlen = render_kernel(space, c, kVarlen, arch);
    EXPECT_NE(paged.source.find("#define ATT_KVCACHE 1\n"), std::string::npos) << family;
    EXPECT_EQ(paged.source.find("#define ATT_VARLEN"), std::string::npos) << family;
    EXPECT_EQ(dense.source.find("#define ATT_KVCACHE"), std::string::npos) << family;
    EXPECT_EQ(varlen.source.find("#define ATT_KVCACHE"), std::string::npos) << family;
    EXPECT_NE(paged.source_hash, dense.source_hash) << family;
    EXPECT_NE(paged.source_hash, varlen.source_hash) << family;
    // The launch constants say which entry point the build serves.
    const auto entry = [](const RenderedKernel& k) {
      const auto defs = plan_defines(k.launch.defines);
      return attntune_plan::prefill_entry(defs.data(), static_cast<int>(defs.size()));
    };
    EXPECT_EQ(entry(paged), attntune_plan::kEntryKvcache) << family;
    EXPECT_EQ(entry(dense), attntune_plan::kEntryDense) << family;
    EXPECT_EQ(entry(varlen), attntune_plan::kEntryVarlen) << family;
    // Cache lengths, batch, query rows and page size are run-time arguments: one build serves them all.
    for (const char* other : {"b=1,h=32,hkv=8,s=100,sk=777,d=128,dtype=bf16,causal=1,page=16",
                              "b=64,h=32,hkv=8,s=4096,sk=131072,d=128,dtype=bf16,causal=1,page=256",
                              "b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=bf16,causal=1,page=8"}) {
      const Problem o = Problem::parse(other);
      EXPECT_EQ(render_kernel(space, c, o, arch).source_hash, paged.source_hash) << family << " " << other;
    }
    if (std::string(family) == "flash_fwd_mma") {  // odd pages too (wgmma's space refuses them)
      for (const char* other : {"b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=bf16,causal=1,page=1",
                                "b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=bf16,causal=1,page=7"})
        EXPECT_EQ(render_kernel(space, c, Problem::parse(other), arch).source_hash, paged.source_hash) << other;
    }
  }
  // flash_decode builds once for both of its entry points: a paged problem adds no constant.
  const SearchSpace decode = space_of("flash_decode");
  const Problem contiguous = Problem::parse("b=16,h=32,hkv=8,s=1,sk=8192,d=128,dtype=bf16,causal=1");
  const Config c = first_config(decode, kDecodePaged, "sm_90", [](const Config&) { return true; });
  ASSERT_FALSE(c.empty());
  const RenderedKernel paged = render_kernel(decode, c, kDecodePaged, "sm_90");
  EXPECT_EQ(paged.source.find("#define ATT_KVCACHE"), std::string::npos);
  EXPECT_EQ(paged.source_hash, render_kernel(decode, c, contiguous, "sm_90").source_hash);
}

TEST(PrefillKvcache, TheSpacesLeaveDecodeToFlashDecodeAndOddPagesToMma) {
  const SearchSpace mma = space_of("flash_fwd_mma"), wgmma = space_of("flash_fwd_wgmma");
  // flash_fwd_wgmma: a KV cache may run persistent grids, but never the split tail (tiles of equal
  // keys) or multicast (one CTA loading pages for two).
  std::size_t n = 0, persistent = 0;
  wgmma.for_each_valid(kPaged, "sm_90a", [&](const Config& c) {
    ++n;
    persistent += std::get<bool>(c.at("persistent"));
    EXPECT_FALSE(std::get<bool>(c.at("split_tail"))) << config_str(c);
    EXPECT_FALSE(std::get<bool>(c.at("kv_multicast"))) << config_str(c);
  });
  EXPECT_GT(n, 0u);
  EXPECT_GT(persistent, 0u);
  // The dense problem has them all (and causal persistent grids on 24 producer registers, which
  // spilled over pages); the non-causal one the split tail and multicast too.
  std::size_t dense = 0;
  wgmma.for_each_valid(kDense, "sm_90a", [&](const Config& c) {
    dense += !(std::get<bool>(c.at("persistent")) && std::get<std::int64_t>(c.at("producer_regs")) == 24);
  });
  EXPECT_EQ(dense, n);
  Problem noncausal = kDense;
  noncausal.causal = false;
  Problem noncausal_paged = kPaged;
  noncausal_paged.causal = false;
  EXPECT_GT(wgmma.count(noncausal, "sm_90a"), wgmma.count(noncausal_paged, "sm_90a"));
  EXPECT_GT(mma.count(kPaged, "sm_90"), 0u);
  EXPECT_EQ(mma.count(kPaged, "sm_90"), mma.count(kDense, "sm_90"));  // no param of mma's depends on the cache

  // Pages of 12 rows: not whole TMA swizzle atoms for flash_fwd_wgmma; flash_fwd_mma takes them.
  const Problem odd = Problem::parse("b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=bf16,causal=1,page=12");
  try {
    wgmma.check_problem(odd, "sm_90a");
    ADD_FAILURE() << "flash_fwd_wgmma takes pages of 12 rows";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 8"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(mma.check_problem(odd, "sm_90"));
  EXPECT_GT(mma.count(odd, "sm_90"), 0u);
  EXPECT_NO_THROW(wgmma.check_problem(Problem::parse("b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=bf16,causal=1,page=8"),
                                      "sm_90a"));

  // 16 query rows or fewer over a paged cache is decoding: flash_decode's, and both spaces say so.
  for (const char* decode : {"b=16,h=32,hkv=8,s=1,sk=8192,d=128,dtype=bf16,causal=1,page=16",
                             "b=16,h=32,hkv=8,s=16,sk=8192,d=128,dtype=bf16,causal=1,page=64"}) {
    for (const SearchSpace* space : {&mma, &wgmma}) {
      const std::string arch = arch_of(space->family());
      try {
        space->check_problem(Problem::parse(decode), arch);
        ADD_FAILURE() << space->family() << " takes the paged decode problem " << decode;
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("flash_decode"), std::string::npos) << e.what();
      }
    }
  }
  // 17 rows is chunked prefill; a dense problem of one row stays the prefill families' as before.
  for (const char* ok : {"b=16,h=32,hkv=8,s=17,sk=8192,d=128,dtype=bf16,causal=1,page=64",
                         "b=16,h=32,hkv=8,s=1,sk=8192,d=128,dtype=bf16,causal=1"}) {
    EXPECT_NO_THROW(mma.check_problem(Problem::parse(ok), "sm_90")) << ok;
    EXPECT_NO_THROW(wgmma.check_problem(Problem::parse(ok), "sm_90a")) << ok;
  }
}

TEST(PrefillKvcache, WgmmaMapsSpanThePagesInBoxesWithinAPage) {
  const SearchSpace space = space_of("flash_fwd_wgmma");
  const Config c = first_config(space, kPaged, "sm_90a", [](const Config& x) {
    return int_of(x, "block_n") == 176 && std::get<bool>(x.at("warp_specialize"));
  });
  ASSERT_FALSE(c.empty()) << "no block_n 176 config for " << kPaged.str();
  const RenderedKernel k = render_kernel(space, c, kPaged, "sm_90a");
  const auto dev = FakeDevice{}.device();
  const auto bm = int_of(c, "block_m");
  std::string why;

  struct Case {
    int page;
    unsigned box;
  } cases[] = {{64, 16}, {16, 16}, {256, 16}, {8, 8}, {176, 176}};
  for (const Case& cs : cases) {
    const attntune_plan::Call call = kvcache_call_of(kPaged, true, cs.page);
    const auto plan = plan_call(k.launch, call, dev, &why);
    ASSERT_TRUE(plan) << cs.page << ": " << why;
    ASSERT_EQ(plan->launches, 1);
    EXPECT_EQ(plan->launch[0].grid[0], static_cast<unsigned>((2048 + bm - 1) / bm)) << cs.page;
    EXPECT_EQ(plan->launch[0].grid[1], 32u);
    EXPECT_EQ(plan->launch[0].grid[2], 4u);
    EXPECT_EQ(plan->launch[0].cluster, 1u);
    EXPECT_EQ(plan->workspaces, 0);
    ASSERT_EQ(plan->maps, 3);
    // Q as for a dense call.
    EXPECT_EQ(plan->map[0].dims[1], 2048u);
    EXPECT_EQ(plan->map[0].dims[3], 4u);
    EXPECT_EQ(plan->map[0].box[1], static_cast<unsigned>(bm));
    for (int m = 1; m <= 2; ++m) {
      const attntune_plan::TensorMap& map = plan->map[m];
      EXPECT_EQ(map.base, m == 1 ? call.k : call.v) << m;
      EXPECT_EQ(map.rank, 4);
      EXPECT_EQ(map.dims[0], 128u) << m;
      EXPECT_EQ(map.dims[1], static_cast<unsigned long long>(cs.page)) << m;  // a page's rows
      EXPECT_EQ(map.dims[2], 8u) << m;                                        // heads_kv
      EXPECT_EQ(map.dims[3], 2147483647u) << m;                                // as many pages as a map allows
      EXPECT_EQ(map.box[0], 64u) << m;
      EXPECT_EQ(map.box[1], cs.box) << "page " << cs.page << " map " << m;      // gcd(page, block_n)
      EXPECT_EQ(map.box[2], 1u);
      EXPECT_EQ(map.box[3], 1u);
      // Bytes: a row (heads_kv * d), a head (d), a page (page * heads_kv * d).
      EXPECT_EQ(map.strides[0], 8ull * 128 * 2) << m;
      EXPECT_EQ(map.strides[1], 128ull * 2) << m;
      EXPECT_EQ(map.strides[2], static_cast<unsigned long long>(cs.page) * 8 * 128 * 2) << m;
      EXPECT_EQ(map.swizzle_bytes, 128);
    }
    // The kernel's arguments: the box rows, the table and the page divisor.
    const attntune_plan::Args args = bind_of<attntune_plan::FlashFwdWgmmaLaunch>(k, call, *plan, "flash_fwd_wgmma");
    ASSERT_EQ(args.count, 2);
    att::TmaMaps maps;
    std::memcpy(&maps, args.ptr[1], sizeof maps);
    EXPECT_EQ(maps.kv_box_rows, static_cast<int>(cs.box)) << cs.page;
    EXPECT_EQ(maps.kv_box_rows, std::gcd(cs.page, 176));
    const AttnParams p = params_of(args);
    EXPECT_EQ(p.block_table, call.block_table);
    EXPECT_EQ(p.cache_seqlens, call.cache_seqlens);
    EXPECT_EQ(p.page_size, cs.page);
    EXPECT_EQ(p.max_blocks_per_seq, call.max_blocks_per_seq);
    for (unsigned j : {0u, 1u, 7u, static_cast<unsigned>(cs.page) - 1, static_cast<unsigned>(cs.page),
                       10239u, 123456789u, 2147483647u}) {
      const unsigned q = p.page_mul ? static_cast<unsigned>((static_cast<unsigned long long>(j) * p.page_mul) >> 32) >>
                                          p.page_shift
                                    : j;
      EXPECT_EQ(q, j / static_cast<unsigned>(cs.page)) << "page " << cs.page << " j " << j;
    }
  }

  // Pages of 256 rows with block_n 128: boxes of 128 rows.
  {
    const Config c128 = first_config(space, kPaged, "sm_90a", [](const Config& x) { return int_of(x, "block_n") == 128; });
    ASSERT_FALSE(c128.empty());
    const RenderedKernel k128 = render_kernel(space, c128, kPaged, "sm_90a");
    const auto plan = plan_call(k128.launch, kvcache_call_of(kPaged, true, 256), dev, &why);
    ASSERT_TRUE(plan) << why;
    EXPECT_EQ(plan->map[1].box[1], 128u);
    EXPECT_EQ(plan->map[2].box[1], 128u);
    EXPECT_EQ(plan->map[1].dims[1], 256u);
  }

  // A contiguous cache (no table): the dense maps over seqlen_k_max rows, boxes of block_n rows.
  {
    const attntune_plan::Call call = kvcache_call_of(kPaged, false);
    const auto plan = plan_call(k.launch, call, dev, &why);
    ASSERT_TRUE(plan) << why;
    EXPECT_EQ(plan->launch[0].grid[0], static_cast<unsigned>((2048 + bm - 1) / bm));
    EXPECT_EQ(plan->launch[0].grid[1], 32u);
    EXPECT_EQ(plan->launch[0].grid[2], 4u);
    EXPECT_EQ(plan->launch[0].cluster, 1u);
    for (int m = 1; m <= 2; ++m) {
      EXPECT_EQ(plan->map[m].dims[1], 10240u) << m;
      EXPECT_EQ(plan->map[m].dims[2], 8u) << m;
      EXPECT_EQ(plan->map[m].dims[3], 4u) << m;
      EXPECT_EQ(plan->map[m].box[1], 176u) << m;
      EXPECT_EQ(plan->map[m].strides[0], 128ull * 2) << m;
      EXPECT_EQ(plan->map[m].strides[1], 10240ull * 128 * 2) << m;
      EXPECT_EQ(plan->map[m].strides[2], 8ull * 10240 * 128 * 2) << m;
    }
    const attntune_plan::Args args = bind_of<attntune_plan::FlashFwdWgmmaLaunch>(k, call, *plan, "flash_fwd_wgmma");
    att::TmaMaps maps;
    std::memcpy(&maps, args.ptr[1], sizeof maps);
    EXPECT_EQ(maps.kv_box_rows, 0);
    const AttnParams p = params_of(args);
    EXPECT_EQ(p.block_table, nullptr);
    EXPECT_EQ(p.cache_seqlens, call.cache_seqlens);
    EXPECT_EQ(p.page_size, 0);
    EXPECT_EQ(p.max_blocks_per_seq, 0);
  }

  // Refusals: pages of 12 rows, too few table entries, page_size 0, and the other entry points.
  EXPECT_FALSE(plan_call(k.launch, kvcache_call_of(kPaged, true, 12), dev, &why));
  EXPECT_NE(why.find("multiple of 8"), std::string::npos) << why;
  EXPECT_FALSE(plan_call(k.launch, kvcache_call_of(kPaged, true, 64, 159), dev, &why));  // 159 * 64 < 10240
  EXPECT_NE(why.find("max_blocks_per_seq"), std::string::npos) << why;
  EXPECT_TRUE(plan_call(k.launch, kvcache_call_of(kPaged, true, 64, 160), dev, &why)) << why;
  {
    attntune_plan::Call call = kvcache_call_of(kPaged, true, 64);
    call.page_size = 0;
    EXPECT_FALSE(plan_call(k.launch, call, dev, &why));
    EXPECT_NE(why.find("page_size"), std::string::npos) << why;
  }
  EXPECT_FALSE(plan_call(k.launch, dense_call_of(kDense), dev, &why));
  EXPECT_NE(why.find("attntune_attention_forward_kvcache only"), std::string::npos) << why;
  EXPECT_NE(why.find("flash_fwd_wgmma"), std::string::npos) << why;
  EXPECT_FALSE(plan_call(k.launch, varlen_call_of(kVarlen), dev, &why));
  EXPECT_NE(why.find("attntune_attention_forward_kvcache only"), std::string::npos) << why;
  EXPECT_NE(why.find("`varlen=N`"), std::string::npos) << why;

  // A dense build (and a varlen one) refuses kvcache calls, naming the problem to tune.
  for (const Problem* other : {&kDense, &kVarlen}) {
    const RenderedKernel o = render_kernel(space, c, *other, "sm_90a");
    for (bool table : {true, false}) {
      EXPECT_FALSE(plan_call(o.launch, kvcache_call_of(kPaged, table), dev, &why)) << other->str();
      EXPECT_NE(why.find("`page=N`"), std::string::npos) << why;
    }
  }
}

TEST(PrefillKvcache, MmaPlansTheDenseGridForKvcacheBuildsOnly) {
  const SearchSpace space = space_of("flash_fwd_mma");
  const Config c = first_config(space, kPaged, "sm_90", [](const Config&) { return true; });
  ASSERT_FALSE(c.empty());
  const RenderedKernel k = render_kernel(space, c, kPaged, "sm_90");
  const auto dev = FakeDevice{}.device();
  const auto bm = int_of(c, "block_m");
  std::string why;
  for (int page : {0, 64, 12, 7, 1, 256}) {  // 0: no table
    const attntune_plan::Call call = kvcache_call_of(kPaged, page > 0, page);
    const auto plan = plan_call(k.launch, call, dev, &why);
    ASSERT_TRUE(plan) << page << ": " << why;
    ASSERT_EQ(plan->launches, 1);
    EXPECT_EQ(plan->launch[0].grid[0], static_cast<unsigned>((2048 + bm - 1) / bm)) << page;
    EXPECT_EQ(plan->launch[0].grid[1], 32u) << page;
    EXPECT_EQ(plan->launch[0].grid[2], 4u) << page;
    EXPECT_EQ(plan->launch[0].cluster, 1u);
    EXPECT_EQ(plan->launch[0].block, static_cast<unsigned>(int_of(c, "warps") * 32));
    EXPECT_EQ(plan->maps, 0);
    EXPECT_EQ(plan->workspaces, 0);
    const AttnParams p = params_of(bind_of<attntune_plan::FlashFwdMmaLaunch>(k, call, *plan, "flash_fwd_mma"));
    EXPECT_EQ(p.block_table, page > 0 ? call.block_table : nullptr);
    EXPECT_EQ(p.cache_seqlens, call.cache_seqlens);
    EXPECT_EQ(p.page_size, page);
    EXPECT_EQ(p.k_stride[0], call.k_stride[0]);
    if (page > 1) {
      for (unsigned j : {0u, 5u, static_cast<unsigned>(page), 10239u, 2147483647u}) {
        const unsigned q =
            static_cast<unsigned>((static_cast<unsigned long long>(j) * p.page_mul) >> 32) >> p.page_shift;
        EXPECT_EQ(q, j / static_cast<unsigned>(page)) << "page " << page << " j " << j;
      }
    } else {
      EXPECT_EQ(p.page_mul, 0u) << page;
    }
  }
  // Seqlen_q past the tuned one: the grid follows the call.
  {
    attntune_plan::Call call = kvcache_call_of(kPaged, true);
    call.seqlen_q = 100;
    const auto plan = plan_call(k.launch, call, dev, &why);
    ASSERT_TRUE(plan) << why;
    EXPECT_EQ(plan->launch[0].grid[0], static_cast<unsigned>((100 + bm - 1) / bm));
  }
  EXPECT_FALSE(plan_call(k.launch, kvcache_call_of(kPaged, true, 64, 100), dev, &why));
  EXPECT_NE(why.find("max_blocks_per_seq"), std::string::npos) << why;
  EXPECT_FALSE(plan_call(k.launch, dense_call_of(kDense), dev, &why));
  EXPECT_NE(why.find("attntune_attention_forward_kvcache only"), std::string::npos) << why;
  EXPECT_NE(why.find("flash_fwd_mma"), std::string::npos) << why;
  EXPECT_FALSE(plan_call(k.launch, varlen_call_of(kVarlen), dev, &why));
  EXPECT_NE(why.find("attntune_attention_forward_kvcache only"), std::string::npos) << why;

  // The dense build of the same config: kvcache calls refused, naming the paged problem to tune;
  // it still serves its dense calls.
  const RenderedKernel dense = render_kernel(space, c, kDense, "sm_90");
  for (bool table : {true, false}) {
    EXPECT_FALSE(plan_call(dense.launch, kvcache_call_of(kPaged, table), dev, &why));
    EXPECT_NE(why.find("`page=N`"), std::string::npos) << why;
  }
  EXPECT_TRUE(plan_call(dense.launch, dense_call_of(kDense), dev, &why)) << why;
  const RenderedKernel varlen = render_kernel(space, c, kVarlen, "sm_90");
  EXPECT_FALSE(plan_call(varlen.launch, kvcache_call_of(kPaged, true), dev, &why));
  EXPECT_NE(why.find("`page=N`"), std::string::npos) << why;
}

TEST(PrefillKvcache, ServedEntriesFollowTheProblemKind) {
  using attntune_plan::kEntryDense;
  using attntune_plan::kEntryKvcache;
  using attntune_plan::kEntryVarlen;
  for (const char* family : {"flash_fwd_mma", "flash_fwd_wgmma"}) {
    const Family& f = builtin_family(family);
    EXPECT_TRUE(f.build_per_entry) << family;
    EXPECT_EQ(f.plan->entries, kEntryDense | kEntryKvcache | kEntryVarlen) << family;
    EXPECT_EQ(served_entries(f, kDense), kEntryDense) << family;
    EXPECT_EQ(served_entries(f, kPaged), kEntryKvcache) << family;
    EXPECT_EQ(served_entries(f, kVarlen), kEntryVarlen) << family;
    EXPECT_EQ(served_entries(f, kDecodePaged), kEntryKvcache) << family;  // what a build of it would serve
  }
  const Family& decode = builtin_family("flash_decode");
  EXPECT_FALSE(decode.build_per_entry);
  const Problem contiguous = Problem::parse("b=16,h=32,hkv=8,s=1,sk=8192,d=128,dtype=bf16,causal=1");
  EXPECT_EQ(served_entries(decode, kDecodePaged), kEntryDense | kEntryKvcache);
  EXPECT_EQ(served_entries(decode, contiguous), kEntryDense | kEntryKvcache);
  EXPECT_EQ(served_entries(decode, kVarlen) & kEntryVarlen, 0);
}

namespace {

// An NVRTC compile of a rendered source, started now on a thread of its own; `what` names it.
struct Job {
  std::string what;
  std::future<cuda::CompileOutput> out;
};
Job compile_job(std::string what, std::string source, cuda::CompileOptions opts) {
  return {std::move(what), std::async(std::launch::async, [src = std::move(source), opts] {
            return cuda::nvrtc_compile(src, "k.cu", opts);
          })};
}

}  // namespace

// A spread of kvcache configs compiles for each arch the spaces list (sm_80 and sm_89: the L4),
// without spills.
TEST(PrefillKvcache, KvcacheBuildsCompileForEveryArch) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  struct Case {
    const char* family;
    const char* arch;
    const char* problem;
    std::map<std::string, std::int64_t> want;  // and a producer warpgroup where the space has one, unless said
  } cases[] = {
      {"flash_fwd_mma", "sm_80", "b=4,h=8,hkv=2,s=2048,sk=4096,d=64,dtype=fp16,causal=0,page=16", {}},
      {"flash_fwd_mma", "sm_89", "b=4,h=8,s=2048,sk=4096,d=128,dtype=bf16,causal=1,page=7", {}},
      {"flash_fwd_mma", "sm_90", "b=4,h=8,s=2048,sk=4096,d=256,dtype=bf16,causal=1,page=256", {}},
      {"flash_fwd_wgmma", "sm_90a", "b=4,h=8,hkv=2,s=2048,sk=4096,d=128,dtype=bf16,causal=1,page=64", {}},
      {"flash_fwd_wgmma", "sm_90a", "b=4,h=8,s=2048,sk=4096,d=64,dtype=fp16,causal=0,page=16", {}},
      {"flash_fwd_wgmma", "sm_90a", "b=4,h=8,s=2048,sk=4096,d=256,dtype=bf16,causal=0,page=256", {}},
      // Shapes tuning favours: wide tiles, Q in registers, two stages; ping-pong with intra-WG overlap.
      {"flash_fwd_mma", "sm_90", "b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=bf16,causal=1,page=64",
       {{"block_m", 128}, {"block_n", 64}, {"warps", 8}, {"kv_stages", 2}, {"q_in_regs", 1}}},
      {"flash_fwd_wgmma", "sm_90a", "b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=bf16,causal=1,page=64",
       {{"block_m", 128}, {"block_n", 176}, {"ping_pong", 1}, {"intra_wg_overlap", 1}}},
      // No producer warpgroup: the consumers issue the page loads themselves.
      {"flash_fwd_wgmma", "sm_90a", "b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=bf16,causal=1,page=32",
       {{"warp_specialize", 0}, {"block_m", 128}, {"block_n", 128}}},
  };
  std::vector<Job> jobs;
  for (const Case& k : cases) {
    const SearchSpace space = space_of(k.family);
    const Problem p = Problem::parse(k.problem);
    // With a producer warpgroup when the space has one (its loads take the pages), unless the case says.
    const Config c = first_config(space, p, k.arch, [&](const Config& x) {
      if (x.count("warp_specialize") && !k.want.count("warp_specialize") && !std::get<bool>(x.at("warp_specialize")))
        return false;
      for (const auto& [name, value] : k.want) {
        const Value& v = x.at(name);
        if ((std::holds_alternative<bool>(v) ? std::get<bool>(v) : std::get<std::int64_t>(v)) != value) return false;
      }
      return true;
    });
    ASSERT_FALSE(c.empty()) << k.family << " " << k.problem;
    const RenderedKernel r = render_kernel(space, c, p, k.arch);
    ASSERT_NE(r.source.find("#define ATT_KVCACHE 1\n"), std::string::npos) << k.problem;
    cuda::CompileOptions opts{k.arch, family_nvrtc_options(k.family), true, 0};
    jobs.push_back(compile_job(fmt::format("{} {} {} {}", k.family, k.arch, k.problem, config_str(c)), r.source, opts));
  }
  for (Job& j : jobs) {
    const cuda::CompileOutput out = j.out.get();
    EXPECT_TRUE(out.ok) << j.what << "\n" << out.log;
    EXPECT_EQ(out.spill_stores, 0) << j.what;
  }
}

// A causal persistent grid over pages takes each tile from the counter and looks each box's page
// up in the producer warpgroup: on 24 registers half of such builds spilled 8-32 bytes at d=64, 128
// and 256 (the H200 property test found d=128 128x64, 16 bytes), so the space gives them 40. A
// sample of what the space keeps there builds without spills; and none of it is on 24 registers.
TEST(PrefillKvcache, CausalPersistentPagedBuildsDoNotSpill) {
  std::string why;
  if (!cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  const SearchSpace space = space_of("flash_fwd_wgmma");
  std::vector<Job> jobs;
  for (const char* spec : {"b=4,h=8,s=512,sk=4096,d=128,dtype=bf16,causal=1,page=64",
                           "b=4,h=8,s=512,sk=4096,d=64,dtype=fp16,causal=1,page=16"}) {
    const Problem p = Problem::parse(spec);
    std::vector<Config> persistent;
    std::size_t on24 = 0;
    std::string first24;
    space.for_each_valid(p, "sm_90a", [&](const Config& c) {
      if (!std::get<bool>(c.at("persistent")) || !std::get<bool>(c.at("warp_specialize"))) return;
      if (std::get<std::int64_t>(c.at("producer_regs")) != 40 && on24++ == 0) first24 = config_str(c);
      persistent.push_back(c);
    });
    EXPECT_EQ(on24, 0u) << spec << ": persistent configs on 24 producer registers, the first " << first24;
    ASSERT_GE(persistent.size(), 3u) << spec;
    // Three spread over the list (its order is the space's: tiles vary slowest), the first 128x64
    // where there is one (the property test's find).
    std::vector<Config> pick;
    for (const Config& c : persistent)
      if (std::get<std::int64_t>(c.at("block_m")) == 128 && std::get<std::int64_t>(c.at("block_n")) == 64 &&
          !std::get<bool>(c.at("intra_wg_overlap"))) {
        pick.push_back(c);
        break;
      }
    pick.push_back(persistent[persistent.size() / 3]);
    pick.push_back(persistent[persistent.size() * 2 / 3]);
    for (const Config& c : pick) {
      const RenderedKernel r = render_kernel(space, c, p, "sm_90a");
      cuda::CompileOptions opts{"sm_90a", family_nvrtc_options("flash_fwd_wgmma"), true, 0};
      jobs.push_back(compile_job(fmt::format("{} {}", spec, config_str(c)), r.source, opts));
    }
  }
  for (Job& j : jobs) {
    const cuda::CompileOutput out = j.out.get();
    EXPECT_TRUE(out.ok) << j.what << "\n" << out.log;
    EXPECT_EQ(out.spill_stores + out.spill_loads, 0) << j.what;
  }
}

// An FP8 cache that several query tiles of each KV head read (chunked prefill) is converted once,
// before the main kernel: launch 0 is flash_fwd_wgmma_kv_dequant over every sequence's rows (a
// thread per 16 bytes of a K and V row), into an optional workspace that two more tensor maps lie
// over (K [batch][heads_kv][seqlen_k][d] then V, 16-bit); bind hands the main kernel those maps,
// no page table and kv_dequantised 1, and without the workspace the raw maps, the table and 0 (the
// kernel converts each tile). One query tile a KV head, or a copy past 1 GiB, converts in the kernel.
TEST(PrefillKvcache, WgmmaConvertsAnFp8CacheOnceWhenSeveralQueryTilesReadIt) {
  const Problem fp8 = Problem::parse("b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=bf16,causal=1,page=16,kv_dtype=fp8");
  const SearchSpace space = space_of("flash_fwd_wgmma");
  const Config c = first_config(space, fp8, "sm_90a", [](const Config& x) {
    return std::get<bool>(x.at("pack_gqa")) && !std::get<bool>(x.at("persistent"));
  });
  ASSERT_FALSE(c.empty());
  const RenderedKernel k = render_kernel(space, c, fp8, "sm_90a");
  const auto dev = FakeDevice{}.device();
  std::string why;
  auto fp8_call = [&](int batch, int seqlen_q) {
    attntune_plan::Call call = kvcache_call_of(fp8, true, 16);
    call.kv_fp8 = 1;
    call.batch = batch;
    call.seqlen_q = seqlen_q;
    return call;
  };
  const auto plan = plan_call(k.launch, fp8_call(4, 2048), dev, &why);
  ASSERT_TRUE(plan) << why;
  ASSERT_EQ(plan->launches, 2);
  EXPECT_EQ(plan->launch[0].kernel, 2);
  EXPECT_EQ(plan->launch[0].block, static_cast<unsigned>(att::kKvDequantThreads));
  EXPECT_EQ(plan->launch[0].grid[0], static_cast<unsigned>(10240ll * 8 * 16 / att::kKvDequantThreads));
  EXPECT_EQ(plan->launch[0].grid[1], 4u);
  EXPECT_EQ(plan->launch[1].kernel, 0);
  ASSERT_EQ(plan->workspaces, 1);
  const unsigned long long k_bytes = 4ull * 8 * 10240 * 128 * 2;
  EXPECT_EQ(plan->workspace[0].bytes, 2 * k_bytes);
  EXPECT_TRUE(plan->workspace[0].optional);
  EXPECT_FALSE(plan->workspace[0].zeroed);
  ASSERT_EQ(plan->maps, 5);
  for (int m : {3, 4}) {
    EXPECT_EQ(plan->map[m].workspace, 1) << m;
    EXPECT_EQ(plan->map[m].dims[0], 128u) << m;
    EXPECT_EQ(plan->map[m].dims[1], 10240u) << m;
    EXPECT_EQ(plan->map[m].dims[2], 8u) << m;
    EXPECT_EQ(plan->map[m].dims[3], 4u) << m;
    EXPECT_EQ(plan->map[m].strides[0], 128u * 2) << m;  // a row of the 16-bit copy
  }
  EXPECT_EQ(reinterpret_cast<unsigned long long>(plan->map[3].base), 0u);
  EXPECT_EQ(reinterpret_cast<unsigned long long>(plan->map[4].base), k_bytes);
  EXPECT_EQ(plan->map[1].workspace, 0);

  // Bind: with the workspace the main kernel reads the copy; without it, the pages.
  const auto consts =
      launch_constants<attntune_plan::FlashFwdWgmmaLaunch>(k.launch.defines, "flash_fwd_wgmma");
  alignas(64) static unsigned char map_bytes[attntune_plan::kMaxTensorMaps][attntune_plan::kTensorMapBytes];
  for (int m = 0; m < attntune_plan::kMaxTensorMaps; ++m) std::memset(map_bytes[m], m + 1, sizeof map_bytes[m]);
  unsigned char ws_byte = 0;
  for (bool with_ws : {true, false}) {
    attntune_plan::Resources res;
    std::memset(&res, 0, sizeof res);
    for (int m = 0; m < 3; ++m) res.map[m] = map_bytes[m];
    if (with_ws) {
      res.map[3] = map_bytes[3];
      res.map[4] = map_bytes[4];
      res.workspace[0] = &ws_byte;
    }
    const attntune_plan::Call call = fp8_call(4, 2048);
    attntune_plan::Why w;
    w.text[0] = 0;
    attntune_plan::Args first, main;
    ASSERT_EQ(consts.bind(call, *plan, res, 0, &first, &w), 0) << w.text;
    unsigned char* ws_arg = nullptr;
    std::memcpy(&ws_arg, first.ptr[1], sizeof ws_arg);
    EXPECT_EQ(ws_arg, with_ws ? &ws_byte : nullptr);
    ASSERT_EQ(consts.bind(call, *plan, res, 1, &main, &w), 0) << w.text;
    AttnParams p;
    std::memcpy(&p, main.ptr[0], sizeof p);
    att::TmaMaps maps;
    std::memcpy(&maps, main.ptr[1], sizeof maps);
    EXPECT_EQ(p.block_table, with_ws ? nullptr : call.block_table);
    EXPECT_EQ(maps.kv_dequantised, with_ws ? 1 : 0);
    EXPECT_EQ(maps.kv_box_rows, with_ws ? 0 : 16);
    EXPECT_EQ(reinterpret_cast<const unsigned char*>(&maps.k)[0], with_ws ? 4 : 2);  // map 3 or map 1
    EXPECT_EQ(reinterpret_cast<const unsigned char*>(&maps.v)[0], with_ws ? 5 : 3);
  }

  // One query tile a KV head (16 rows of 4 heads, packed) or a copy past 1 GiB: no conversion first.
  for (const auto& call : {fp8_call(4, 16), fp8_call(64, 2048)}) {
    const auto one = plan_call(k.launch, call, dev, &why);
    ASSERT_TRUE(one) << why;
    EXPECT_EQ(one->launches, 1) << call.batch << " " << call.seqlen_q;
    EXPECT_EQ(one->workspaces, 0);
    EXPECT_EQ(one->maps, 3);
  }
  // A cache of q's dtype never converts.
  const RenderedKernel bf16 = render_kernel(space, c, kPaged, "sm_90a");
  const auto plain = plan_call(bf16.launch, kvcache_call_of(kPaged, true, 16), dev, &why);
  ASSERT_TRUE(plain) << why;
  EXPECT_EQ(plain->launches, 1);
}
}  // namespace test_prefill_kvcache
