// The export of backward kernels (`pass=bwd`, issue 45: flash_bwd_mma, attntune_attention_backward in
// the C ABI), on the CPU: a backward result exports by problem and by campaign, `--all-best` puts
// forward and backward kernels into one file, `--torch` packages them; the info, the kernel table's
// labels and entry bits, and the header say which kernels are backward. No GPU: the campaigns are
// recorded through the Store (export_db.hpp). ExportBackwardNvcc compiles the all-best file into a
// host program of checks (bwd_dispatch_checks.cu, PTX only) and asks its dispatcher which kernel each
// call of each entry point runs (deterministic backward calls too: attntune_options.deterministic),
// and its backward entry points what they refuse.
#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/problem.hpp"
#include "tests/common/run_attntune.hpp"
#include "tests/unit/db/db_test_util.hpp"
#include "tests/unit/export/export_db.hpp"
#include "tests/unit/export/nvcc_util.hpp"

namespace test_export_bwd {
using namespace attntune;
using attntune::test::ExportDb;
using attntune::test::info_from_source;
using attntune::test::read_bytes;
using attntune::test::sh;
using attntune::test::Shell;
using attntune::test::shq;
using attntune::test::TempDir;
using attntune::testing::run_attntune;
using attntune::testing::source_dir;

namespace {

const std::string kFwd = "b=2,h=8,hkv=2,s=1024,sk=1024,d=128,dtype=bf16,causal=1";
const std::string kBwd = kFwd + ",pass=bwd";
const std::string kBwdLong = "b=1,h=16,hkv=16,s=8192,sk=8192,d=128,dtype=bf16,causal=1,pass=bwd";
const std::string kBwdFull = "b=2,h=8,hkv=2,s=1024,sk=1024,d=128,dtype=bf16,causal=0,pass=bwd";
const std::string kBwdWindow = "b=1,h=8,hkv=8,s=2048,sk=2048,d=64,dtype=bf16,causal=1,window=255,pass=bwd";
const std::string kBwdVarlen = "b=4,h=8,hkv=2,s=1024,sk=1024,d=128,dtype=bf16,causal=1,varlen=64,pass=bwd";

struct Fixture {
  TempDir dir;
  std::string db = dir.file("bwd.db");
  ExportDb d{db, source_dir()};
  Fixture() {
    d.campaign("flash_fwd_mma", "fwd", kFwd, {d.config("flash_fwd_mma", kFwd, {})}, {100});
    d.campaign("flash_bwd_mma", "bwd", kBwd, {d.config("flash_bwd_mma", kBwd, {})}, {250});
    d.campaign("flash_bwd_mma", "bwd-long", kBwdLong, {d.config("flash_bwd_mma", kBwdLong, {})}, {9000});
    d.campaign("flash_bwd_mma", "bwd-full", kBwdFull, {d.config("flash_bwd_mma", kBwdFull, {})}, {400});
    d.campaign("flash_bwd_mma", "bwd-window", kBwdWindow, {d.config("flash_bwd_mma", kBwdWindow, {})}, {300});
    d.campaign("flash_bwd_mma", "bwd-varlen", kBwdVarlen, {d.config("flash_bwd_mma", kBwdVarlen, {})}, {500});
  }
  std::string export_all() {
    const std::string out = dir.file("all.cu");
    const auto r = run_attntune("export --db " + shq(db) + " --all-best -o " + shq(out));
    EXPECT_EQ(r.rc, 0) << r.err;
    return out;
  }
};

// Each kernel's index in the info's "kernels", by its problem's canonical spec.
std::map<std::string, int> indices(const nlohmann::json& info) {
  std::map<std::string, int> index;
  for (std::size_t i = 0; i < info.at("kernels").size(); ++i)
    index[Problem::from_json(info.at("kernels")[i].at("problem")).str()] = static_cast<int>(i);
  return index;
}

}  // namespace

TEST(ExportBackward, ABackwardResultExportsByProblemAndByCampaign) {
  Fixture f;
  for (const std::string& how : {"--problem " + kBwd, std::string("--campaign bwd")}) {
    const std::string out = f.dir.file("one.cu");
    const auto r = run_attntune("export --db " + shq(f.db) + " " + how + " -o " + shq(out) + " --no-shipped");
    ASSERT_EQ(r.rc, 0) << how << ": " << r.err;
    const std::string cu = read_bytes(out);
    const nlohmann::json info = info_from_source(cu);
    ASSERT_EQ(info.at("kernels").size(), 1u) << how;
    const nlohmann::json& k = info.at("kernels")[0];
    EXPECT_EQ(k.at("template"), "flash_bwd_mma");
    EXPECT_EQ(k.at("problem").value("pass", ""), "bwd") << k.dump();
    EXPECT_EQ(k.at("variants"), nlohmann::json::array());  // the pass is not a variant
    EXPECT_EQ(Problem::from_json(k.at("problem")).str(), Problem::parse(kBwd).str());
    // Its launch, as the family describes it.
    EXPECT_TRUE(k.at("launch").contains("block_n")) << k.dump();
    // The backward entry point alone lists it.
    const auto& entries = info.at("entry_points");
    EXPECT_EQ(entries.size(), 1u) << entries.dump();
    EXPECT_EQ(entries.at("attntune_attention_backward"), nlohmann::json::array({Problem::parse(kBwd).str()}));
    // The label and the table's entry bits (8: attntune_attention_backward) say it.
    EXPECT_NE(cu.find("tuned for b=2,h=8,hkv=2,s=1024,sk=1024 pass=bwd\", \"sm_90\", 128, 1, 1, 2, 8, 2, 1024, 1024, 8,"),
              std::string::npos);
    EXPECT_NE(cu.find("// Backward kernels (label \"pass=bwd\"; tuned on a problem with pass=bwd) serve"),
              std::string::npos);
    EXPECT_NE(cu.find("//   int attntune_attention_backward(q, k, v, out, softmax_lse, dout, dq, dk, dv, batch,"),
              std::string::npos);
    EXPECT_NE(cu.find("{\"ATT_BWD\", 1LL}"), std::string::npos);
    EXPECT_NE(cu.find("&attntune_plan::kFlashBwdMma"), std::string::npos);
    EXPECT_NE(r.out.find(Problem::parse(kBwd).str()), std::string::npos) << r.out;
  }
  // A forward file lists the entry point (every file defines it) but says nothing of backward kernels.
  const std::string fwd = f.dir.file("fwd.cu");
  const auto r = run_attntune("export --db " + shq(f.db) + " --campaign fwd -o " + shq(fwd));
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string cu = read_bytes(fwd);
  EXPECT_EQ(cu.find("Backward kernels (label"), std::string::npos);
  EXPECT_EQ(cu.find("pass=bwd"), std::string::npos);
  EXPECT_NE(cu.find("//   int attntune_attention_backward(q, k, v, out, softmax_lse, dout, dq, dk, dv, batch,"),
            std::string::npos);
  EXPECT_FALSE(info_from_source(cu).at("entry_points").contains("attntune_attention_backward"));
}

TEST(ExportBackward, AllBestHoldsForwardAndBackwardKernelsAndTorchPackagesThem) {
  Fixture f;
  const std::string cu = read_bytes(f.export_all());
  const nlohmann::json info = info_from_source(cu);
  const auto index = indices(info);
  ASSERT_EQ(index.size(), 6u) << info.dump(2);
  const auto& entries = info.at("entry_points");
  EXPECT_EQ(entries.at("attntune_attention_forward"), nlohmann::json::array({Problem::parse(kFwd).str()}));
  std::vector<std::string> bwd = entries.at("attntune_attention_backward").get<std::vector<std::string>>();
  std::sort(bwd.begin(), bwd.end());
  std::vector<std::string> want = {Problem::parse(kBwd).str(), Problem::parse(kBwdLong).str(),
                                   Problem::parse(kBwdFull).str(), Problem::parse(kBwdWindow).str()};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(bwd, want);
  // The packed batch's backward kernel: its own entry point, its table bits 16.
  EXPECT_EQ(entries.at("attntune_attention_backward_varlen"), nlohmann::json::array({Problem::parse(kBwdVarlen).str()}));
  EXPECT_NE(cu.find("varlen=64 pass=bwd\", \"sm_90\", 128, 1, 1, 4, 8, 2, 1024, 1024, 16,"), std::string::npos);
  EXPECT_NE(cu.find("{\"ATT_VARLEN\", 1LL}"), std::string::npos);
  EXPECT_NE(cu.find("//   int attntune_attention_backward_varlen(q, k, v, out, softmax_lse, dout, dq, dk, dv,"),
            std::string::npos);
  for (const auto& k : info.at("kernels"))
    EXPECT_EQ(k.at("problem").value("pass", "fwd") == "bwd", k.at("template") == "flash_bwd_mma") << k.dump();
  EXPECT_NE(cu.find("// Dispatch: the kernels of the call's entry point (a backward call runs backward kernels only"),
            std::string::npos);

  // The package: the same file and info, and tuner.json says the backward families (flash_bwd_mma,
  // flash_bwd_wgmma) tune the backward pass.
  const std::string pkg = f.dir.file("pkg");
  const auto r = run_attntune("export --db " + shq(f.db) + " --all-best --torch " + shq(pkg));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(read_bytes(pkg + "/attntune/kernels.cu"), cu);
  const nlohmann::json tuner = nlohmann::json::parse(read_bytes(pkg + "/attntune/tuner.json"));
  bool found = false;
  for (const auto& fam : tuner.at("families")) {
    const auto& support = fam.at("support");
    const std::string name = fam.at("family");
    if (name.rfind("flash_bwd_", 0) == 0) {
      found = found || name == "flash_bwd_mma";
      EXPECT_EQ(support.at("pass"), nlohmann::json::array({"bwd"})) << fam.dump();
      // Every multiple of 16 from 32 to 256, computed over 64, 128 or 256 (zero-padded).
      nlohmann::json dims = nlohmann::json::array();
      for (int d = 32; d <= 256; d += 16) dims.push_back(std::to_string(d));
      EXPECT_EQ(support.at("d"), dims) << fam.dump();
      EXPECT_EQ(fam.at("regimes"), nlohmann::json::array({"train"})) << fam.dump();
    } else {
      EXPECT_FALSE(support.contains("pass")) << fam.dump();  // the forward families: as before
    }
  }
  EXPECT_TRUE(found) << tuner.dump(2);
}

// The dispatcher and the backward entry points of the all-best file, on the host (bwd_dispatch_checks.cu:
// the file included, PTX only, no kernel run).
TEST(ExportBackwardNvcc, EachEntryPointRunsItsOwnKernelsAndBadCallsAreRefused) {
  const std::string nvcc = attntune::test::find_nvcc();
  ASSERT_FALSE(nvcc.empty()) << "nvcc not found ($CUDACXX, $CUDA_HOME, PATH, /usr/local/cuda/bin): CI has the toolkit";
  Fixture f;
  const std::string out = f.export_all();
  const auto index = indices(info_from_source(read_bytes(out)));
  const auto at = [&](const std::string& spec) { return index.at(Problem::parse(spec).str()); };
  const std::string exe = f.dir.file("checks");
  const Shell built = sh(shq(nvcc) + " -std=c++17 -gencode arch=compute_90,code=compute_90 -include " + shq(out) + " " +
                         shq(source_dir() + "/tests/unit/export/bwd_dispatch_checks.cu") + " -o " + shq(exe));
  ASSERT_EQ(built.status, 0) << built.output;
  const Shell ran = sh(shq(exe));
  ASSERT_EQ(ran.status, 0) << ran.output;
  const std::string& o = ran.output;
  const auto line = [](const std::string& what, int i) { return what + " -> " + std::to_string(i) + "\n"; };
  // Calls: a forward call never runs a backward kernel, nor the reverse; then the usual rule.
  EXPECT_NE(o.find(line("fwd_d128_causal", at(kFwd))), std::string::npos) << o;
  EXPECT_NE(o.find(line("bwd_d128_causal", at(kBwd))), std::string::npos) << o;
  EXPECT_NE(o.find(line("bwd_d128_causal_long", at(kBwdLong))), std::string::npos) << o;
  EXPECT_NE(o.find(line("bwd_d128_full", at(kBwdFull))), std::string::npos) << o;
  EXPECT_NE(o.find(line("bwd_d64_window", at(kBwdWindow))), std::string::npos) << o;
  EXPECT_NE(o.find(line("bwd_d64_no_window", -1)), std::string::npos) << o;
  EXPECT_NE(o.find(line("bwd_varlen_d128_causal", at(kBwdVarlen))), std::string::npos) << o;
  EXPECT_NE(o.find(line("bwd_varlen_d128_full", -1)), std::string::npos) << o;
  EXPECT_NE(o.find(line("bwd_varlen_d128_causal_deterministic", at(kBwdVarlen))), std::string::npos) << o;
  EXPECT_NE(o.find(line("fwd_d64_window", -1)), std::string::npos) << o;
  // Deterministic backward calls run the same kernels (flash_bwd_mma serves the mode).
  EXPECT_NE(o.find(line("bwd_d128_causal_deterministic", at(kBwd))), std::string::npos) << o;
  EXPECT_NE(o.find(line("bwd_d64_window_deterministic", at(kBwdWindow))), std::string::npos) << o;
  // Sizes only: entry 8 weighs the backward kernels; options other than a window answer -1.
  EXPECT_NE(o.find(line("sizes_bwd", at(kBwd))), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_bwd_entry", at(kBwd))), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_fwd", at(kFwd))), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_bwd_window", at(kBwdWindow))), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_bwd_softcap", -1)), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_bwd_dv", -1)), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_bwd_d96", -1)), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_entry_16", at(kBwdVarlen))), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_entry_16_full", -1)), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_entry_32", -1)), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_bwd_deterministic", at(kBwd))), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_fwd_deterministic", at(kFwd))), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_bwd_window_deterministic", at(kBwdWindow))), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_bwd_deterministic_2", -1)), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_bwd_before_deterministic", at(kBwd))), std::string::npos) << o;
  const auto refused = [&](const std::string& what, const std::string& why) {  // its line has both
    const std::size_t p = o.find(what + ": 1000 ");
    ASSERT_NE(p, std::string::npos) << what << "\n" << o;
    EXPECT_NE(o.substr(p, o.find('\n', p) - p).find(why), std::string::npos) << what << "\n" << o;
  };
  refused("null_strides", "q_strides, k_strides, v_strides, o_strides, do_strides, dq_strides, dk_strides and "
                          "dv_strides must not be NULL");
  refused("negative_size", "negative size: batch=2 heads_q=8 heads_kv=2 seqlen_q=-1 seqlen_k=1000");
  refused("causal_2", "is_causal must be 0 or 1 (got 2)");
  refused("no_kernel_d64", "no kernel in this file for head_dim=64 is_causal=1 serves attntune_attention_backward; "
                           "it holds: ");
  refused("no_kernel_d64_full", "no kernel in this file for head_dim=64 is_causal=0 serves attntune_attention_backward");
  refused("heads", "heads_q (7) must be a positive multiple of heads_kv (2)");
  refused("scale", "softmax_scale must be finite and > 0");
  refused("null_dout", "q, out, softmax_lse, dout and dq must not be NULL (they may be NULL only when seqlen_q is 0)");
  refused("null_dk", "k, v, dk and dv must not be NULL (they may be NULL only when seqlen_k is 0)");
  refused("misaligned_dq", "q, k, v, out, dout, dq, dk and dv must be 16-byte aligned");
  refused("misaligned_lse", "softmax_lse must be 4-byte aligned");
  refused("do_stride_132", "do_strides {1024000, 128000, 132}: a stride is not a multiple of 8 elements");
  refused("dk_overlaps", "dk_strides {256000, 64, 128} make gradients overlap for batch=2 heads=2 rows=1000 "
                         "head_dim=128");
  refused("dv_is_dk", "dq, dk and dv must be three tensors");
  const std::string only = ": the backward pass serves plain attention, sliding windows, soft-caps and sinks for now; "
                           "no kernel family computes these gradients yet";
  // Soft-caps and sinks are served by kernels built for them; this file has none.
  refused("opt_softcap", "no kernel in this file for head_dim=128 is_causal=1 with a logit soft-cap serves "
                         "attntune_attention_backward");
  refused("opt_sinks", "no kernel in this file for head_dim=128 is_causal=1 with attention sinks serves "
                       "attntune_attention_backward");
  refused("opt_head_dim_v", "attntune_options.head_dim_v (a value head dim other than head_dim)" + only);
  refused("opt_latent", "attntune_options.latent (a latent cache)" + only);
  refused("opt_kv_dtype", "attntune_options.kv_dtype (an FP8 KV cache)" + only);
  refused("window_no_kernel", "no kernel in this file for head_dim=128 is_causal=1 with a sliding window serves "
                              "attntune_attention_backward");
  refused("opt_deterministic_2", "attntune_options: deterministic must be 0 or 1 (got 2)");
  refused("varlen_null_strides", "do_strides, dq_strides, dk_strides and dv_strides must not be NULL (2 strides each: "
                                 "{row, head})");
  refused("varlen_negative_total", "total_q (-1) and total_k (3000) must not be negative");
  refused("varlen_null_cu", "cu_seqlens_q and cu_seqlens_k must not be NULL");
  refused("varlen_misaligned_cu", "cu_seqlens_q and cu_seqlens_k must be 4-byte aligned");
  refused("varlen_dk_overlaps", "dk_strides {row 64, head 128} make gradients overlap for heads=2 rows=3000 head_dim=128");
  refused("varlen_no_kernel_d64", "no kernel in this file for head_dim=64 is_causal=1 serves "
                                  "attntune_attention_backward_varlen");
  refused("varlen_opt_head_dim_v", "attntune_attention_backward_varlen_ex: attntune_options.head_dim_v (a value head "
                                   "dim other than head_dim)" + only);
  refused("opt_newer_than_deterministic", "an option of a newer attntune");
  refused("fwd_window_d64", "no kernel in this file for head_dim=64 is_causal=1 with a sliding window serves "
                            "attntune_attention_forward;");
  EXPECT_NE(o.find("batch_0: 0\n"), std::string::npos) << o;
  EXPECT_NE(o.find("lengths_0: 0\n"), std::string::npos) << o;
  if (o.find("a GPU is present") == std::string::npos) {
    for (const char* what : {"valid", "valid_window", "valid_deterministic", "valid_window_deterministic", "no_keys",
                             "no_queries", "bshd", "varlen_valid", "varlen_valid_deterministic", "varlen_no_queries"})
      EXPECT_NE(o.find(std::string(what) + ": past the checks\n"), std::string::npos) << what << "\n" << o;
  }
}
}  // namespace test_export_bwd
