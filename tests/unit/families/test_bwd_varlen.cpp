// The backward pass of packed varlen batches (issue 45: attntune_attention_backward_varlen,
// FlashAttention's flash_attn_varlen_func under autograd). A `varlen=N,pass=bwd` problem is the
// backward entry of a packed batch (kEntryBackwardVarlen); both backward families serve it with the
// dense problem's configs, their builds get ATT_VARLEN and serve that entry alone, and the launch
// plan sizes the grids by the longest sequence and the workspaces by the packed rows (a run a query
// head, each sequence from its own multiple of the query block: bwd_launch.h, bwd_prepost.cuh's
// bwd_seq). On CI: those, and the builds compile with NVRTC within the families' spill bounds. The
// GPU property tests (FlashBwd{Mma,Wgmma}Property.Varlen) check the gradients of ragged batches.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "templates/common/bwd_blocks.h"
#include "templates/common/bwd_params.h"
#include "tests/common/plan_call.hpp"
#include "tests/unit/families/bwd_builds.hpp"
#include "tests/unit/families/bwd_plan.hpp"

namespace test_bwd_varlen {
using namespace attntune;
using attntune::testing::backward_call_of;
using attntune::testing::backward_varlen_call_of;
using attntune::testing::FakeDevice;
using attntune::testing::space_of;

namespace {

const char* kVarlen = "b=3,h=6,hkv=2,s=300,sk=300,d=128,dtype=bf16,causal=1,varlen=100,pass=bwd";
const char* kDense = "b=3,h=6,hkv=2,s=300,sk=300,d=128,dtype=bf16,causal=1,pass=bwd";

struct BwdFamily {
  const char* name;
  const char* arch;
};
const BwdFamily kFamilies[] = {{"flash_bwd_mma", "sm_90"}, {"flash_bwd_wgmma", "sm_90a"}};

long long param(const Config& c, const char* name) { return std::get<std::int64_t>(c.at(name)); }
bool sorted_order(const Config& c) { return std::get<std::int64_t>(c.at("varlen_lpt")) != 0; }
long long block_n_of(const BwdFamily& fam, const Config& c) {
  return std::string(fam.name) == "flash_bwd_mma" ? param(c, "warps") * 16 * param(c, "key_tiles")
                                                  : param(c, "block_n");
}

using Bound = attntune::testing::BwdBound;
Bound plan_and_bind(const BwdFamily& fam, const SearchSpace& space, const Config& config, const Problem& built,
                    const attntune_plan::Call& call) {
  return attntune::testing::bwd_plan_and_bind(fam.name, fam.arch, space, config, built, call);
}

}  // namespace

TEST(BackwardVarlen, AProblemIsTheBackwardEntryOfAPackedBatch) {
  const Problem p = Problem::parse(kVarlen);
  EXPECT_TRUE(p.backward);
  EXPECT_TRUE(p.is_varlen());
  EXPECT_EQ(p.str(), kVarlen);
  EXPECT_EQ(Problem::from_json(p.json()), p);
  EXPECT_EQ(problem_entry(p), attntune_plan::kEntryBackwardVarlen);
  EXPECT_EQ(problem_entry(Problem::parse(kDense)), attntune_plan::kEntryBackward);
  for (const BwdFamily& fam : kFamilies) {
    EXPECT_EQ(served_entries(builtin_family(fam.name), p), attntune_plan::kEntryBackwardVarlen) << fam.name;
    EXPECT_EQ(served_entries(builtin_family(fam.name), Problem::parse(kDense)), attntune_plan::kEntryBackward)
        << fam.name;
    EXPECT_NO_THROW(check_family_serves(fam.name, p));
  }
  // A forward family refuses it naming the varlen backward entry and the families that serve it.
  try {
    check_family_serves("flash_fwd_mma", p);
    ADD_FAILURE() << "flash_fwd_mma served a varlen backward problem";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("attntune_attention_backward_varlen"), std::string::npos) << what;
    EXPECT_NE(what.find("flash_bwd_mma, flash_bwd_wgmma"), std::string::npos) << what;
  }
  // FLOPs: 2.5x the forward's over the packed sequences; bytes: the packed rows, not b times the longest.
  Problem fwd = p;
  fwd.backward = false;
  EXPECT_DOUBLE_EQ(p.flops(), 2.5 * fwd.flops());
  const double rows_q = double(p.h) * double(p.total_q());
  EXPECT_DOUBLE_EQ(p.bytes(), 2.0 * rows_q * (4 * 128) + 4.0 * rows_q + 2.0 * 2 * (2.0 * double(p.total_k())) * 256);
}

// For each family: the space serves it with the dense problem's configs, the render defines
// ATT_VARLEN beside ATT_BWD, a varlen build plans the varlen backward call only (a dense build
// refusing it and the reverse, each naming the entry points), and the plan's grids and workspaces.
TEST(BackwardVarlen, EachFamilyPlansAPackedBatchWithItsBuildOnly) {
  const auto device = FakeDevice{}.device();
  const Problem varlen = Problem::parse(kVarlen), dense = Problem::parse(kDense);
  const long long total_q = 517, total_k = 517;  // three sequences, the longest 300
  for (const BwdFamily& fam : kFamilies) {
    SCOPED_TRACE(fam.name);
    const SearchSpace space = space_of(fam.name);
    const auto configs = space.enumerate(varlen, fam.arch);
    ASSERT_FALSE(configs.empty());
    // The dense problem's configs but flash_bwd_wgmma's tma_loads (tensor maps of dense q and dout),
    // and those again in the sorted order (varlen_lpt, below).
    std::vector<Config> grid_order;
    for (const Config& c : configs)
      if (!sorted_order(c)) grid_order.push_back(c);
    std::size_t dense_configs = 0;
    for (const Config& c : space.enumerate(dense, fam.arch)) {
      const auto tma = c.find("tma_loads");
      dense_configs += !(tma != c.end() && std::get<bool>(tma->second));
    }
    EXPECT_EQ(grid_order.size(), dense_configs);
    for (const Config* c : {&grid_order.front(), &grid_order.back()}) {
      const RenderedKernel with = render_kernel(space, *c, varlen, fam.arch);
      const RenderedKernel without = render_kernel(space, *c, dense, fam.arch);
      EXPECT_NE(with.source.find("#define ATT_VARLEN 1\n"), std::string::npos);
      EXPECT_NE(with.source.find("#define ATT_BWD 1\n"), std::string::npos);
      EXPECT_EQ(without.source.find("#define ATT_VARLEN"), std::string::npos);
      const attntune_plan::Call call = backward_varlen_call_of(varlen, total_q, total_k);
      std::string why;
      const auto plan = plan_call(with.launch, call, device, &why);
      ASSERT_TRUE(plan) << why;
      const long long bm = param(*c, "block_m"), bn = block_n_of(fam, *c);
      ASSERT_EQ(plan->launches, 3);
      // The grids cover the longest sequence (300 rows and keys); the workspaces the packed rows: a
      // run of floor((total_q + b * block_m) / block_m) * block_m rows a query head.
      EXPECT_EQ(plan->launch[0].grid[0], static_cast<unsigned>((300 + bm - 1) / bm));
      EXPECT_EQ(plan->launch[0].grid[1], 6u);
      EXPECT_EQ(plan->launch[0].grid[2], 3u);
      EXPECT_EQ(plan->launch[1].grid[0], static_cast<unsigned>((300 + bn - 1) / bn));
      EXPECT_EQ(plan->launch[1].grid[1], 2u);
      EXPECT_EQ(plan->launch[1].grid[2], 3u);
      EXPECT_EQ(plan->launch[2].grid[0], static_cast<unsigned>((300 + bm - 1) / bm));
      const long long run = (total_q + 3 * bm) / bm * bm;
      ASSERT_EQ(plan->workspaces, 3);
      EXPECT_EQ(plan->workspace[0].bytes, static_cast<unsigned long long>(6 * run * 128 * 4));
      EXPECT_EQ(plan->workspace[1].bytes, static_cast<unsigned long long>(6 * run * 4));
      // Deterministic: one semaphore a query block of the runs.
      attntune_plan::Call det = call;
      det.deterministic = 1;
      const auto dplan = plan_call(with.launch, det, device, &why);
      ASSERT_TRUE(dplan) << why;
      ASSERT_EQ(dplan->workspaces, 4);
      EXPECT_EQ(dplan->workspace[3].bytes, static_cast<unsigned long long>(6 * run / bm * 4));
      // Each build serves its own entry point only, saying which.
      EXPECT_FALSE(plan_call(with.launch, backward_call_of(dense), device, &why));
      EXPECT_NE(why.find("packed varlen batches (attntune_attention_backward_varlen)"), std::string::npos) << why;
      EXPECT_FALSE(plan_call(without.launch, call, device, &why));
      EXPECT_NE(why.find("dense tensors (attntune_attention_backward); the call is a packed varlen batch's"),
                std::string::npos)
          << why;
      EXPECT_FALSE(plan_call(with.launch, attntune::testing::varlen_call_of(varlen), device, &why));
      EXPECT_NE(why.find("attntune_attention_backward_varlen only"), std::string::npos) << why;
      // A packed batch needs its prefix sums and its rows.
      attntune_plan::Call bad = call;
      bad.cu_seqlens_k = nullptr;
      EXPECT_FALSE(plan_call(with.launch, bad, device, &why));
      EXPECT_NE(why.find("cu_seqlens_q and cu_seqlens_k must not be NULL"), std::string::npos) << why;
      bad = backward_varlen_call_of(varlen, -1, total_k);
      EXPECT_FALSE(plan_call(with.launch, bad, device, &why));
      EXPECT_NE(why.find("needs total_q and total_k"), std::string::npos) << why;
      // Every sequence empty: the main loop's keys only (dK = dV = 0); no keys at all: dQ = 0.
      attntune_plan::Call no_q = backward_varlen_call_of(varlen, 0, total_k);
      no_q.seqlen_q = 0;
      const auto qplan = plan_call(with.launch, no_q, device, &why);
      ASSERT_TRUE(qplan) << why;
      ASSERT_EQ(qplan->launches, 1);
      EXPECT_EQ(qplan->launch[0].kernel, 1);
    }
  }
}

// varlen_lpt: the main kernel's CTAs in the order the preprocessing kernel sorts the batch's
// (sequence, key block) pairs into (bwd_prepost.cuh, build_cta_order). The space offers it for packed
// batches alone and never with longest_first's groups; its plan launches one CTA a slot and grid row
// (grid (KV heads, slots): total_k / block_n + batch slots, at least the batch's pairs,
// ceil(len_k / block_n) a sequence) with the order in workspace 3, which the preprocessing kernel and the main kernel both get; a
// deterministic call (its turns need a sequence's lower key blocks launched first), one without
// queries (no preprocessing kernel to sort) and one without keys keep the grid's order and shape.
TEST(BackwardVarlen, ASortedOrderLaunchesACtaASlotAndGridRow) {
  const Problem varlen = Problem::parse(kVarlen), dense = Problem::parse(kDense);
  const long long total_q = 517, total_k = 517;
  for (const BwdFamily& fam : kFamilies) {
    SCOPED_TRACE(fam.name);
    const SearchSpace space = space_of(fam.name);
    std::vector<Config> sorted;
    for (const Config& c : space.enumerate(varlen, fam.arch))
      if (sorted_order(c)) {
        EXPECT_EQ(param(c, "longest_first"), 0) << config_str(c);
        sorted.push_back(c);
      }
    ASSERT_FALSE(sorted.empty());
    for (const Config& c : space.enumerate(dense, fam.arch)) EXPECT_FALSE(sorted_order(c)) << config_str(c);
    for (const Config* c : {&sorted.front(), &sorted.back()}) {
      SCOPED_TRACE(config_str(*c));
      EXPECT_NE(render_kernel(space, *c, varlen, fam.arch).source.find(fmt::format("#define VARLEN_LPT {}\n", param(*c, "varlen_lpt"))),
                std::string::npos);
      const long long bn = block_n_of(fam, *c), slots = total_k / bn + 3;
      // The most key blocks three sequences of 517 keys can have: 300 + 217 (+ 0), 300 + 216 + 1, ...
      EXPECT_GE(slots, (300 + bn - 1) / bn + (216 + bn - 1) / bn + 1);
      attntune_plan::Call call = backward_varlen_call_of(varlen, total_q, total_k);
      const Bound lpt = plan_and_bind(fam, space, *c, varlen, call);
      ASSERT_EQ(lpt.why, "");
      ASSERT_EQ(lpt.plan.launches, 3);
      EXPECT_EQ(lpt.plan.launch[1].kernel, 1);
      EXPECT_EQ(lpt.plan.launch[1].grid[0], 2u);  // two KV heads a slot, side by side
      EXPECT_EQ(lpt.plan.launch[1].grid[1], static_cast<unsigned>(slots));
      EXPECT_EQ(lpt.plan.launch[1].grid[2], 1u);
      ASSERT_EQ(lpt.plan.workspaces, 4);
      EXPECT_EQ(lpt.plan.workspace[3].bytes, static_cast<unsigned long long>(slots * 8));
      for (int l = 0; l < 3; ++l) {
        EXPECT_EQ(lpt.params[l].cta_order, static_cast<int*>(lpt.res.workspace[3])) << l;
        EXPECT_EQ(lpt.params[l].cta_slots, slots) << l;
        EXPECT_EQ(lpt.params[l].dq_semaphore, nullptr) << l;
      }
      // The preprocessing and conversion kernels' grids are the grid order's.
      call.deterministic = 1;
      const Bound det = plan_and_bind(fam, space, *c, varlen, call);
      ASSERT_EQ(det.why, "");
      EXPECT_EQ(det.plan.launch[1].grid[0], static_cast<unsigned>((300 + bn - 1) / bn));
      EXPECT_EQ(det.plan.launch[1].grid[1], 2u);
      EXPECT_EQ(det.plan.launch[1].grid[2], 3u);
      EXPECT_EQ(std::memcmp(&det.plan.launch[0], &lpt.plan.launch[0], sizeof(attntune_plan::Launch)), 0);
      EXPECT_EQ(std::memcmp(&det.plan.launch[2], &lpt.plan.launch[2], sizeof(attntune_plan::Launch)), 0);
      for (int l = 0; l < 3; ++l) {
        EXPECT_EQ(det.params[l].cta_order, nullptr) << l;
        EXPECT_EQ(det.params[l].cta_slots, 0) << l;
        EXPECT_EQ(det.params[l].dq_semaphore, static_cast<int*>(det.res.workspace[3])) << l;
      }
      attntune_plan::Call no_q = backward_varlen_call_of(varlen, 0, total_k);
      no_q.seqlen_q = 0;
      const Bound q0 = plan_and_bind(fam, space, *c, varlen, no_q);
      ASSERT_EQ(q0.why, "");
      ASSERT_EQ(q0.plan.launches, 1);
      EXPECT_EQ(q0.plan.launch[0].grid[2], 3u);
      EXPECT_EQ(q0.params[0].cta_order, nullptr);
      EXPECT_EQ(q0.plan.workspaces, 3);
      attntune_plan::Call no_k = backward_varlen_call_of(varlen, total_q, 0);
      no_k.seqlen_k = 0;
      const Bound k0 = plan_and_bind(fam, space, *c, varlen, no_k);
      ASSERT_EQ(k0.why, "");
      EXPECT_EQ(k0.plan.launches, 2);
      EXPECT_EQ(k0.params[0].cta_order, nullptr);
    }
  }
  // The fields the families read keep their offsets: the order's are appended.
  EXPECT_GT(offsetof(BwdParams, cta_order), offsetof(BwdParams, dq_semaphore));
  EXPECT_GT(offsetof(BwdParams, cta_slots), offsetof(BwdParams, cta_order));
}

// The walk a pair is sorted by is the one its CTA steps through: key_block_rows and query_blocks,
// what the main loops walk (over lengths, causal bounds, windows, block shapes).
TEST(BackwardVarlen, TheSortKeyIsTheCtasWalk) {
  VariantParams v{};
  for (int causal = 0; causal < 2; ++causal)
    for (int wl : {-1, 0, 100})
      for (int len_q : {0, 1, 63, 64, 200})
        for (int len_k : {1, 64, 65, 200})
          for (int bn : {64, 128})
            for (int bm : {32, 64, 128}) {
              v.window_left = wl;
              v.window_right = causal ? -1 : wl;
              for (int kb = 0; kb * bn < len_k; ++kb) {
                int rb, re, mf, mb;
                const int w = causal ? att_bwd::walk_blocks<true, true>(kb, bn, bm, len_q, len_k, v)
                                     : att_bwd::walk_blocks<false, true>(kb, bn, bm, len_q, len_k, v);
                if (causal) att_bwd::key_block_rows<true, true>(kb * bn, bn, len_q, len_k - len_q, v, &rb, &re);
                else att_bwd::key_block_rows<false, true>(kb * bn, bn, len_q, len_k - len_q, v, &rb, &re);
                att_bwd::query_blocks(rb, re, bm, &mf, &mb);
                ASSERT_EQ(w, mb) << causal << " " << wl << " " << len_q << " " << len_k << " " << bn << " " << bm;
                // Counted directly: the query blocks holding a row that sees a key of the block.
                int count = 0;
                for (int m = 0; m * bm < len_q; ++m) {
                  bool sees = false;
                  for (int r = m * bm; r < std::min(len_q, (m + 1) * bm) && !sees; ++r)
                    for (int k = kb * bn; k < std::min(len_k, (kb + 1) * bn) && !sees; ++k) {
                      const int off = k - r, diag = len_k - len_q;
                      bool vis = true;
                      if (causal) vis = off <= diag;
                      if (wl >= 0) vis = vis && off >= diag - wl && (causal || off <= diag + wl);
                      sees = vis;
                    }
                  count += sees;
                }
                ASSERT_EQ(w, count) << causal << " " << wl << " " << len_q << " " << len_k << " " << bn << " " << bm
                                    << " kb " << kb;
              }
            }
}

TEST(BackwardVarlen, VarlenBuildsCompile) {
  // The smallest and largest tiles of d=128 and of d=64 with a window and sinks, and with a soft-cap
  // (deterministic and longest-first paths are run-time and compile-time alike in every build), and
  // kVarlen's sorted order (varlen_lpt).
  attntune::testing::expect_backward_builds(
      {kVarlen, "b=4,h=4,s=700,sk=900,d=64,dtype=fp16,causal=1,window=100,sinks=1,varlen=1,pass=bwd",
       "b=4,h=8,hkv=8,s=700,sk=700,d=64,dtype=bf16,causal=0,softcap=30,varlen=50,pass=bwd"});
}

// The sorted order's builds (varlen_lpt: the preprocessing kernel's sort, the main kernels' slots):
// d=128 causal, d=64 with a window and sinks, each family and arch, within the spill bounds.
TEST(BackwardVarlen, SortedOrderBuildsCompile) {
  attntune::testing::expect_backward_builds(
      {kVarlen, "b=4,h=4,s=700,sk=900,d=64,dtype=fp16,causal=1,window=100,sinks=1,varlen=1,pass=bwd"},
      [](const Config& c) { return sorted_order(c); });
}
}  // namespace test_bwd_varlen
