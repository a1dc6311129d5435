// flash_decode over a latent cache (`latent=1`: V is the first dv columns of K, one buffer; MLA
// decode), on the CPU: the renderer adds ATT_LATENT to a latent problem's build and nothing to any
// other (its source is the split-dim build's plus that line), and the launch plan of a latent build
// serves only calls whose v is k with k's strides (attntune_plan::check_latent), naming why it refuses
// the others, while a build over separate K and V serves an aliasing call as any other. With TMA, V's
// map reads the first dv columns of K's rows.
#include <cstdint>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/common/plan_call.hpp"
#include "templates/flash_decode/launch.h"

namespace test_flash_decode_latent {
using namespace attntune;

namespace {

const char* kDense = "b=16,h=16,hkv=1,s=1,sk=4096,d=192,dv=128,dtype=bf16,causal=0";
const char* kPaged = "b=16,h=16,hkv=1,s=4,sk=4096,d=192,dv=128,dtype=bf16,causal=1,page=64";

std::int64_t define_of(const Defines& defs, const std::string& name) {
  for (const auto& [k, v] : defs)
    if (k == name) return v;
  return -1;
}

Problem latent(const std::string& spec) { return Problem::parse(spec + ",latent=1"); }

// A dense call of a latent problem as an MLA decode passes it: v = k with k's strides ([B, Hkv,
// Sk, d] rows, V the first dv columns of each), out [B, H, S, dv].
attntune_plan::Call latent_call_of(const Problem& p) {
  attntune_plan::Call c = attntune::testing::dense_call_of(p);
  const long long dv = p.head_dim_v();
  c.head_dim_v = static_cast<int>(dv);
  c.v = c.k;
  for (int i = 0; i < 3; ++i) c.v_stride[i] = c.k_stride[i];
  c.o_stride[0] = p.h * p.s * dv;
  c.o_stride[1] = p.s * dv;
  c.o_stride[2] = dv;
  return c;
}

// The same as the kvcache entry point takes it: pages [pages, page, hkv, d], one table for K and V.
attntune_plan::Call latent_paged_call_of(const Problem& p) {
  attntune_plan::Call c = latent_call_of(p);
  c.entry = attntune_plan::kEntryKvcache;
  c.k_stride[0] = p.page * p.hkv * p.d;
  c.k_stride[1] = p.d;
  c.k_stride[2] = p.hkv * p.d;
  for (int i = 0; i < 3; ++i) c.v_stride[i] = c.k_stride[i];
  c.block_table = reinterpret_cast<const int*>(std::uintptr_t{1} << 40);
  c.cache_seqlens = reinterpret_cast<const int*>((std::uintptr_t{1} << 40) + 65536);
  c.page_size = static_cast<int>(p.page);
  c.max_blocks_per_seq = static_cast<int>((p.sk + p.page - 1) / p.page);
  return c;
}

// The plan of `config`'s build for problem `built` on `call` (132 SMs); "" or the refusal in `why`.
std::optional<attntune_plan::Plan> plan_of(const SearchSpace& space, const Config& config, const Problem& built,
                                           const attntune_plan::Call& call, std::string* why) {
  why->clear();
  return plan_call(render_kernel(space, config, built, "sm_90").launch, call, attntune::testing::FakeDevice{132}.device(),
                   why);
}

Config first_with(const SearchSpace& space, const Problem& p, const char* kv_load) {
  return attntune::testing::first_config(
      space, p, "sm_90", [&](const Config& c) { return std::get<std::string>(c.at("kv_load")) == kv_load; });
}

}  // namespace

TEST(FlashDecodeLatent, OnlyALatentProblemsBuildHasAttLatentAndItsSourceDiffersByThatAlone) {
  const SearchSpace space = attntune::testing::space_of("flash_decode");
  for (const char* spec : {kDense, kPaged}) {
    const Problem split = Problem::parse(spec), lat = latent(spec);
    const Config c = first_with(space, lat, "tma");
    ASSERT_FALSE(c.empty()) << spec;
    EXPECT_EQ(define_of(kernel_defines(space, c, lat, "sm_90"), "ATT_LATENT"), 1) << spec;
    EXPECT_EQ(define_of(kernel_defines(space, c, split, "sm_90"), "ATT_LATENT"), -1) << spec;
    const RenderedKernel with = render_kernel(space, c, lat, "sm_90"), without = render_kernel(space, c, split, "sm_90");
    EXPECT_NE(with.source_hash, without.source_hash);
    EXPECT_EQ(without.source.find("ATT_LATENT"), std::string::npos);
    // The latent build's source is the other's with its define and the header's word added.
    std::string s = with.source;
    const std::string line = "#define ATT_LATENT 1\n", word = ", latent=1";
    ASSERT_NE(s.find(line), std::string::npos);
    s.erase(s.find(line), line.size());
    ASSERT_LT(s.find(word), s.find('\n'));  // on the first line: "(d=192, dv=128, latent=1, ...)"
    s.erase(s.find(word), word.size());
    EXPECT_EQ(s, without.source) << spec;
  }
  // Problems of one head dim, with variants, paged or not: no ATT_LATENT anywhere.
  for (const char* spec : {"b=1,h=32,hkv=8,s=1,sk=32768,d=128,dtype=bf16,causal=0",
                           "b=4,h=16,hkv=2,s=2,sk=4096,d=128,dtype=fp16,causal=1,page=16,window=127,softcap=30,sinks=1"}) {
    const Problem p = Problem::parse(spec);
    const Config c = attntune::testing::first_config(space, p, "sm_90", [](const Config&) { return true; });
    EXPECT_EQ(render_kernel(space, c, p, "sm_90").source.find("ATT_LATENT"), std::string::npos) << spec;
  }
}

TEST(FlashDecodeLatent, ALatentBuildServesOnlyCallsWhoseVIsK) {
  const SearchSpace space = attntune::testing::space_of("flash_decode");
  for (const char* kv_load : {"cp_async", "tma"}) {
    const Problem lat = latent(kDense), split = Problem::parse(kDense);
    const Config c = first_with(space, lat, kv_load);
    ASSERT_FALSE(c.empty()) << kv_load;
    std::string why;
    // v = k, k's strides: served.
    const attntune_plan::Call alias = latent_call_of(lat);
    ASSERT_TRUE(plan_of(space, c, lat, alias, &why)) << kv_load << ": " << why;
    // Another V buffer (V's own rows of dv): refused, saying what to pass.
    attntune_plan::Call separate = alias;
    separate.v = reinterpret_cast<const void*>(std::uintptr_t{1} << 44);
    for (int i = 0; i < 3; ++i) separate.v_stride[i] = alias.v_stride[i] / lat.d * lat.dv;
    EXPECT_FALSE(plan_of(space, c, lat, separate, &why)) << kv_load;
    EXPECT_NE(why.find("this flash_decode kernel was built for a latent cache (V is the first head_dim_v columns of K): "
                       "the call's v must be its k (pass v = k with k's strides), and it is another buffer"),
              std::string::npos)
        << why;
    // v = k through other strides (not the cache's first columns): refused.
    attntune_plan::Call strided = alias;
    strided.v_stride[2] = 128;
    EXPECT_FALSE(plan_of(space, c, lat, strided, &why)) << kv_load;
    EXPECT_NE(why.find("the call's v is its k but with other strides (v {786432, 786432, 128}, k {786432, 786432, 192})"),
              std::string::npos)
        << why;
    // No k with keys to read (attntune_select_kernel_ex's size-only calls): refused; none without.
    attntune_plan::Call none = alias;
    none.k = none.v = nullptr;
    EXPECT_FALSE(plan_of(space, c, lat, none, &why)) << kv_load;
    EXPECT_NE(why.find("and it is not given"), std::string::npos) << why;
    none.seqlen_k = 0;
    EXPECT_TRUE(plan_of(space, c, lat, none, &why)) << kv_load << ": " << why;
    // The same config built over separate K and V serves both calls (it reads V through v).
    EXPECT_TRUE(plan_of(space, c, split, alias, &why)) << kv_load << ": " << why;
    EXPECT_TRUE(plan_of(space, c, split, separate, &why)) << kv_load << ": " << why;
    // The latent build still checks the value head dim first.
    attntune_plan::Call one = alias;
    one.head_dim_v = 0;
    EXPECT_FALSE(plan_of(space, c, lat, one, &why));
    EXPECT_NE(why.find("built for head_dim_v 128"), std::string::npos) << why;
  }
}

TEST(FlashDecodeLatent, TmaReadsVAsTheFirstDvColumnsOfKsRowsPagedOrNot) {
  const SearchSpace space = attntune::testing::space_of("flash_decode");
  for (const char* spec : {kDense, kPaged}) {
    const Problem lat = latent(spec);
    const Config c = first_with(space, lat, "tma");
    ASSERT_FALSE(c.empty()) << spec;
    const attntune_plan::Call call = lat.paged() ? latent_paged_call_of(lat) : latent_call_of(lat);
    std::string why;
    const auto plan = plan_of(space, c, lat, call, &why);
    ASSERT_TRUE(plan) << spec << ": " << why;
    ASSERT_EQ(plan->maps, 2);
    EXPECT_EQ(plan->map[1].base, plan->map[0].base);  // one buffer
    EXPECT_EQ(plan->map[0].dims[0], 192u);
    EXPECT_EQ(plan->map[1].dims[0], 128u);  // V: the first 128 columns
    EXPECT_EQ(plan->map[0].strides[0], plan->map[1].strides[0]);
    EXPECT_EQ(plan->map[1].strides[0], 192u * 2);  // of K's rows (hkv 1: a row is one head's 192)
    EXPECT_EQ(plan->map[1].box[0], 64u);           // V's column blocks (dv 128: 64 wide)
    // A paged call whose V pages are another buffer is refused as a dense one is.
    if (lat.paged()) {
      attntune_plan::Call other = call;
      other.v = reinterpret_cast<const void*>(std::uintptr_t{1} << 44);
      EXPECT_FALSE(plan_of(space, c, lat, other, &why));
      EXPECT_NE(why.find("built for a latent cache"), std::string::npos) << why;
    }
  }
}
}  // namespace test_flash_decode_latent
