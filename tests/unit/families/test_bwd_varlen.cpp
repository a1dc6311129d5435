// The backward pass of packed varlen batches (issue 45: attntune_attention_backward_varlen,
// FlashAttention's flash_attn_varlen_func under autograd). A `varlen=N,pass=bwd` problem is the
// backward entry of a packed batch (kEntryBackwardVarlen); both backward families serve it with the
// dense problem's configs, their builds get ATT_VARLEN and serve that entry alone, and the launch
// plan sizes the grids by the longest sequence and the workspaces by the packed rows (a run a query
// head, each sequence from its own multiple of the query block: bwd_launch.h, bwd_prepost.cuh's
// bwd_seq). On CI: those, and the builds compile with NVRTC within the families' spill bounds. The
// GPU property tests (FlashBwd{Mma,Wgmma}Property.Varlen) check the gradients of ragged batches.
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "tests/common/plan_call.hpp"
#include "tests/unit/families/bwd_builds.hpp"

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
    EXPECT_EQ(configs.size(), space.enumerate(dense, fam.arch).size());
    for (const Config* c : {&configs.front(), &configs.back()}) {
      const RenderedKernel with = render_kernel(space, *c, varlen, fam.arch);
      const RenderedKernel without = render_kernel(space, *c, dense, fam.arch);
      EXPECT_NE(with.source.find("#define ATT_VARLEN 1\n"), std::string::npos);
      EXPECT_NE(with.source.find("#define ATT_BWD 1\n"), std::string::npos);
      EXPECT_EQ(without.source.find("#define ATT_VARLEN"), std::string::npos);
      const attntune_plan::Call call = backward_varlen_call_of(varlen, total_q, total_k);
      std::string why;
      const auto plan = plan_call(with.launch, call, device, &why);
      ASSERT_TRUE(plan) << why;
      const long long bm = param(*c, "block_m");
      const long long bn = std::string(fam.name) == "flash_bwd_mma" ? param(*c, "warps") * 16 * param(*c, "key_tiles")
                                                                    : param(*c, "block_n");
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

TEST(BackwardVarlen, VarlenBuildsCompile) {
  // The smallest and largest tiles of d=128 and of d=64 with a window and sinks, and with a soft-cap
  // (deterministic and longest-first paths are run-time and compile-time alike in every build).
  attntune::testing::expect_backward_builds(
      {kVarlen, "b=4,h=4,s=700,sk=900,d=64,dtype=fp16,causal=1,window=100,sinks=1,varlen=1,pass=bwd",
       "b=4,h=8,hkv=8,s=700,sk=700,d=64,dtype=bf16,causal=0,softcap=30,varlen=50,pass=bwd"});
}
