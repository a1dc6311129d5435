// The export of FP8-forward builds (`dtype=fp8`, issue 42: q, k, v e4m3, v transposed, out bf16;
// flash_fwd_wgmma): the kernel table's row and label say it, the info's problem carries "dtype": "fp8",
// only a file with one explains the call in its header, and (ExportFp8ForwardNvcc) its dispatcher and
// extended entry point on the host (fp8_forward_dispatch_checks.cu): the FP8 kernel for calls whose
// attntune_options say qkv_dtype 1 only, the 16-bit kernel for every other, and the refusals of the
// FP8-forward options and strides. No GPU: the campaigns are recorded through the Store (export_db.hpp).
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/common/run_attntune.hpp"
#include "tests/unit/db/db_test_util.hpp"
#include "tests/unit/export/export_db.hpp"
#include "tests/unit/export/nvcc_util.hpp"

namespace test_export_fp8_forward {
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

// The FP8 build is tuned at s=16384, the bf16 one at 4096: a bf16 call at 16384 is nearer the FP8
// kernel by the usual rule, and must still run the bf16 one (and the reverse).
const std::string kFp8 = "b=1,h=16,hkv=16,s=16384,sk=16384,d=128,dtype=fp8,causal=0";
const std::string kPlain = "b=1,h=16,hkv=16,s=4096,sk=4096,d=128,dtype=bf16,causal=0";

struct Fixture {
  TempDir dir;
  std::string db = dir.file("fp8fwd.db");
  ExportDb d{db, source_dir()};
  Fixture() {
    auto any = [](const Config&) { return true; };
    d.campaign("flash_fwd_wgmma", "fwd-fp8", kFp8, {d.config_if("flash_fwd_wgmma", kFp8, any)}, {2500.0});
    d.campaign("flash_fwd_wgmma", "fwd-bf16", kPlain, {d.config_if("flash_fwd_wgmma", kPlain, any)}, {300.0});
  }
  std::string export_all() {
    const std::string out = dir.file("all.cu");
    const auto r = run_attntune("export --db " + shq(db) + " --all-best -o " + shq(out));
    EXPECT_EQ(r.rc, 0) << r.err;
    return out;
  }
};

}  // namespace

TEST(ExportFp8Forward, TheTableInfoAndHeaderSayFp8AndOnlyAnFp8FileExplainsIt) {
  Fixture f;
  const std::string cu = read_bytes(f.export_all());
  const nlohmann::json info = info_from_source(cu);
  std::map<std::string, nlohmann::json> problems;  // campaign -> problem
  for (const auto& k : info.at("kernels")) problems[k.at("campaign").get<std::string>()] = k.at("problem");
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_EQ(problems["fwd-fp8"].at("dtype"), "fp8");
  EXPECT_EQ(problems["fwd-bf16"].at("dtype"), "bf16");
  EXPECT_EQ(Problem::from_json(problems["fwd-fp8"]).str(), kFp8);
  const auto& specs = info.at("entry_points").at("attntune_attention_forward");
  EXPECT_NE(std::find(specs.begin(), specs.end(), kFp8), specs.end()) << specs.dump();
  // The rows: ..., latent, kv_fp8, qkv_fp8; the label names it.
  EXPECT_NE(cu.find(", 0, 0, 0, 1,\n     &attntune_plan::kFlashFwdWgmma"), std::string::npos);
  EXPECT_NE(cu.find(", 0, 0, 0, 0,\n     &attntune_plan::kFlashFwdWgmma"), std::string::npos);
  EXPECT_NE(cu.find("tuned for b=1,h=16,hkv=16,s=16384,sk=16384 dtype=fp8\""), std::string::npos);
  EXPECT_NE(cu.find("tuned for b=1,h=16,hkv=16,s=4096,sk=4096\""), std::string::npos);
  EXPECT_NE(cu.find("// The FP8 forward (label \"dtype=fp8\"): q, k and v hold FP8 e4m3"), std::string::npos);
  EXPECT_NE(cu.find("attntune_options.qkv_dtype = ATTNTUNE_QKV_FP8_E4M3 (1)"), std::string::npos);
  EXPECT_NE(cu.find("#define ATTNTUNE_QKV_FP8_E4M3 1"), std::string::npos);
  EXPECT_NE(cu.find("{\"ATT_QKV_FP8\", 1LL}"), std::string::npos);

  // A file without one: no FP8 header, no define, rows as before.
  const std::string plain = f.dir.file("bf16.cu");
  const auto s = run_attntune("export --db " + shq(f.db) + " --campaign fwd-bf16 -o " + shq(plain));
  ASSERT_EQ(s.rc, 0) << s.err;
  const std::string pcu = read_bytes(plain);
  EXPECT_EQ(pcu.find("The FP8 forward (label"), std::string::npos);
  EXPECT_EQ(pcu.find("{\"ATT_QKV_FP8\", "), std::string::npos);
  EXPECT_NE(pcu.find(", 0, 0, 0, 0,\n     &attntune_plan::kFlashFwdWgmma"), std::string::npos);
}

// The dispatcher and the extended entry point of the all-best file, on the host (no kernel run).
TEST(ExportFp8ForwardNvcc, OnlyFp8CallsRunTheFp8KernelAndBadOptionsAreRefused) {
  const std::string nvcc = attntune::test::find_nvcc();
  ASSERT_FALSE(nvcc.empty()) << "nvcc not found ($CUDACXX, $CUDA_HOME, PATH, /usr/local/cuda/bin): CI has the toolkit";
  Fixture f;
  const std::string out = f.export_all();
  const nlohmann::json info = info_from_source(read_bytes(out));
  int fp8 = -1, plain = -1;
  for (std::size_t i = 0; i < info.at("kernels").size(); ++i)
    (info.at("kernels")[i].at("campaign") == "fwd-fp8" ? fp8 : plain) = static_cast<int>(i);
  ASSERT_GE(fp8, 0);
  ASSERT_GE(plain, 0);
  const std::string exe = f.dir.file("checks");
  // sm_90a: the wgmma kernels' entry points exist only in an arch-specific build (no kernel runs here).
  const Shell built = sh(shq(nvcc) + " -std=c++17 -gencode arch=compute_90a,code=sm_90a -include " + shq(out) + " " +
                         shq(source_dir() + "/tests/unit/export/fp8_forward_dispatch_checks.cu") + " -o " + shq(exe));
  ASSERT_EQ(built.status, 0) << built.output;
  const Shell ran = sh(shq(exe));
  ASSERT_EQ(ran.status, 0) << ran.output;
  const std::string& o = ran.output;
  const auto line = [](const std::string& what, int index) { return what + " -> " + std::to_string(index) + "\n"; };
  EXPECT_NE(o.find("fp8 " + std::to_string(fp8) + "\n"), std::string::npos) << o;
  EXPECT_NE(o.find(line("fp8_near", fp8)), std::string::npos) << o;
  EXPECT_NE(o.find(line("fp8_far", fp8)), std::string::npos) << o;          // nearer the bf16 kernel's lengths
  EXPECT_NE(o.find(line("bf16_near_fp8", plain)), std::string::npos) << o;  // nearer the FP8 kernel's lengths
  EXPECT_NE(o.find(line("bf16_far", plain)), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_fp8", fp8)), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_null", plain)), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_old_options", plain)), std::string::npos) << o;
  EXPECT_NE(o.find("plain_refuses: this flash_fwd_wgmma kernel was built for 16-bit q, k and v; the call's are FP8 "
                   "e4m3 (tune a problem with dtype=fp8)"),
            std::string::npos)
      << o;
  EXPECT_NE(o.find("fp8_refuses: this flash_fwd_wgmma kernel was built for FP8 e4m3 q, k and v; the call's are "
                   "16-bit"),
            std::string::npos)
      << o;
  const auto refused = [&](const std::string& what, const std::string& why) {  // its line has both
    const std::size_t at = o.find("\n" + what + ": 1000 ");
    ASSERT_NE(at, std::string::npos) << what << "\n" << o;
    EXPECT_NE(o.substr(at, o.find('\n', at + 1) - at).find(why), std::string::npos) << what << "\n" << o;
  };
  refused("qkv_dtype_2", "attntune_options: qkv_dtype must be 0 (ATTNTUNE_QKV_16BIT) or 1 (ATTNTUNE_QKV_FP8_E4M3: "
                         "the FP8 forward) (got 2)");
  refused("qkv_and_kv_dtype", "qkv_dtype 1 (the FP8 forward) makes k and v FP8 e4m3 already: leave kv_dtype 0");
  refused("q_descale_16bit", "q_descale (and its strides) dequantises the FP8 forward's q, and qkv_dtype is 0");
  refused("q_descale_misaligned", "q_descale must be a 4-byte aligned fp32 array");
  refused("q_descale_stride_negative", "q_descale_stride {16, -1}");
  refused("q_stride_odd", "q_strides {");
  refused("qkv_on_kvcache", "is served by attntune_attention_forward_ex only");
  refused("no_fp8_kernel_d64", "no kernel in this file for head_dim=64 is_causal=0 dtype=fp8 serves");
}

// A kernel tuned with k_perm (K loaded in fours: its launch refuses a seqlen_k that is not a multiple
// of 4) is followed in the file by its problem's best k_perm=false result, for --problem, --campaign
// and --all-best alike: the info marks it ("companion_for") and the report says it, and the
// dispatcher (ExportFp8ForwardNvcc's checks, on the host) runs the k_perm kernel at 16384 keys and the
// companion at 16383. A problem with k_perm results only exports the one kernel.
TEST(ExportFp8Forward, AKPermKernelIsFollowedByACompanionForOtherKeyCounts) {
  TempDir dir;
  const std::string db = dir.file("kperm.db");
  const std::string kOnly = "b=1,h=16,hkv=16,s=8192,sk=8192,d=128,dtype=fp8,causal=0";
  {
    ExportDb d{db, source_dir()};
    const auto perm = [](const Config& c) { return std::get<bool>(c.at("k_perm")); };
    const auto plain = [](const Config& c) { return !std::get<bool>(c.at("k_perm")); };
    const Config p = d.config_if("flash_fwd_wgmma", kFp8, perm), q = d.config_if("flash_fwd_wgmma", kFp8, plain);
    d.campaign("flash_fwd_wgmma", "fp8-kperm", kFp8, {q, p}, {2600.0, 2500.0});
    d.campaign("flash_fwd_wgmma", "fp8-only-kperm", kOnly, {d.config_if("flash_fwd_wgmma", kOnly, perm)}, {1300.0});
  }
  const auto kernels = [&](const std::string& how, const std::string& name, std::string* report) {
    const std::string out = dir.file(name + ".cu");
    const auto r = run_attntune("export --db " + shq(db) + " " + how + " -o " + shq(out));
    EXPECT_EQ(r.rc, 0) << r.err;
    if (report) *report = r.out;
    return info_from_source(read_bytes(out)).at("kernels");
  };
  for (const std::string& how : {"--problem " + kFp8, std::string("--campaign fp8-kperm")}) {
    std::string report;
    const nlohmann::json ks = kernels(how, "one", &report);
    ASSERT_EQ(ks.size(), 2u) << how << "\n" << ks.dump(1);
    EXPECT_EQ(ks[0].at("config").at("k_perm"), true) << how;
    EXPECT_FALSE(ks[0].contains("companion_for")) << how;
    EXPECT_EQ(ks[1].at("config").at("k_perm"), false) << how;
    EXPECT_EQ(ks[1].at("companion_for"), "seqlen_k not a multiple of 4 (k_perm)") << how;
    EXPECT_NE(report.find("for the calls the kernel above refuses: seqlen_k not a multiple of 4 (k_perm)"),
              std::string::npos)
        << report;
  }
  EXPECT_EQ(kernels("--problem " + kOnly, "only", nullptr).size(), 1u);
  const nlohmann::json all = kernels("--all-best", "all", nullptr);
  ASSERT_EQ(all.size(), 3u) << all.dump(1);
  int companions = 0;
  for (const auto& k : all) companions += k.contains("companion_for");
  EXPECT_EQ(companions, 1);

  const std::string nvcc = attntune::test::find_nvcc();
  ASSERT_FALSE(nvcc.empty()) << "nvcc not found ($CUDACXX, $CUDA_HOME, PATH, /usr/local/cuda/bin): CI has the toolkit";
  const std::string out = dir.file("one.cu"), exe = dir.file("checks");
  kernels("--problem " + kFp8, "one", nullptr);
  const Shell built = sh(shq(nvcc) + " -std=c++17 -gencode arch=compute_90a,code=sm_90a -include " + shq(out) + " " +
                         shq(source_dir() + "/tests/unit/export/fp8_forward_dispatch_checks.cu") + " -o " + shq(exe));
  ASSERT_EQ(built.status, 0) << built.output;
  const Shell ran = sh(shq(exe));
  ASSERT_EQ(ran.status, 0) << ran.output;
  EXPECT_NE(ran.output.find("fp8_near -> 0\n"), std::string::npos) << ran.output;
  EXPECT_NE(ran.output.find("fp8_ragged -> 1\n"), std::string::npos) << ran.output;
}
}  // namespace test_export_fp8_forward
