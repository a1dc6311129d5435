// The export of a latent-cache build (`latent=1`: V is the first dv columns of K; MLA decode): its
// kernel table row and label say latent, its info's problem carries "latent", and only a file with one
// says in its header how latent kernels are called (every other file is as it was). No GPU: the
// campaigns are recorded through the Store (export_db.hpp). ExportLatentNvcc compiles the library and
// asks its dispatcher on the host which kernel MLA decode calls run: the latent build for v = k, the
// build over separate K and V for any other call (the latent build's plan refuses it, saying why),
// and never the latent build for attntune_select_kernel_ex's size-only question unless its options
// say latent (attntune_options.latent = 1: then it is weighed, and the build over separate K and V
// still serves where it is nearer); a real _ex call that says latent and does not alias is refused.
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/common/run_attntune.hpp"
#include "tests/unit/db/db_test_util.hpp"
#include "tests/unit/export/export_db.hpp"
#include "tests/unit/export/nvcc_util.hpp"

namespace test_export_latent {
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

// The latent build is tuned for the calls' lengths, the other for longer ones: the dispatcher ranks
// the latent one first for every call below and must pass over it where its plan refuses.
const std::string kLatent = "b=16,h=16,hkv=1,s=1,sk=4096,d=192,dv=128,dtype=bf16,causal=0,latent=1";
const std::string kSplit = "b=16,h=16,hkv=1,s=1,sk=16384,d=192,dv=128,dtype=bf16,causal=0";

struct Fixture {
  TempDir dir;
  std::string db = dir.file("mla.db");
  ExportDb d{db, source_dir()};
  Fixture() {
    auto cp_async = [](const Config& c) { return std::get<std::string>(c.at("kv_load")) == "cp_async"; };
    d.campaign("flash_decode", "mla-latent", kLatent, {d.config_if("flash_decode", kLatent, cp_async)}, {30.0});
    d.campaign("flash_decode", "mla-split", kSplit, {d.config_if("flash_decode", kSplit, cp_async)}, {90.0});
  }
};

}  // namespace

TEST(ExportLatent, TheTableAndInfoSayLatentAndOnlyALatentFilesHeaderExplainsIt) {
  Fixture f;
  const std::string out = f.dir.file("mla.cu");
  const auto r = run_attntune("export --db " + shq(f.db) + " --all-best -o " + shq(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string cu = read_bytes(out);
  const nlohmann::json info = info_from_source(cu);
  std::map<std::string, nlohmann::json> problems;  // campaign -> problem
  for (const auto& k : info.at("kernels")) {
    problems[k.at("campaign").get<std::string>()] = k.at("problem");
    EXPECT_EQ(k.at("variants"), nlohmann::json::array()) << k.dump();  // latent is not a variant
  }
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_EQ(problems["mla-latent"].value("latent", false), true);
  EXPECT_FALSE(problems["mla-split"].contains("latent"));
  EXPECT_EQ(Problem::from_json(problems["mla-latent"]).str(), kLatent);
  // The rows: ..., head_dim_v, latent; the labels name it.
  EXPECT_NE(cu.find(", 128, 1, 0, 0,\n     &attntune_plan::kFlashDecode"), std::string::npos);
  EXPECT_NE(cu.find(", 128, 0, 0, 0,\n     &attntune_plan::kFlashDecode"), std::string::npos);
  EXPECT_NE(cu.find("tuned for b=16,h=16,hkv=1,s=1,sk=4096 dv=128 latent\""), std::string::npos);
  EXPECT_NE(cu.find("tuned for b=16,h=16,hkv=1,s=1,sk=16384 dv=128\""), std::string::npos);
  EXPECT_NE(cu.find("// Latent kernels (label \"latent\"; multi-head latent attention's decode): V is the first "
                    "head_dim_v\n"),
            std::string::npos);
  EXPECT_NE(cu.find("Call them with v = k and v_strides = k_strides"), std::string::npos);
  EXPECT_NE(cu.find("// attntune_options.latent = 1 says that v is k: attntune_select_kernel_ex then weighs latent "
                    "kernels\n"),
            std::string::npos);

  // A file without a latent kernel: its header and table say nothing of it (the launch plans it
  // flattens in know check_latent, as every file's).
  const std::string plain = f.dir.file("split.cu");
  const auto s = run_attntune("export --db " + shq(f.db) + " --campaign mla-split -o " + shq(plain));
  ASSERT_EQ(s.rc, 0) << s.err;
  const std::string pcu = read_bytes(plain);
  EXPECT_EQ(pcu.find("Latent kernels"), std::string::npos);
  EXPECT_EQ(pcu.find(" latent\""), std::string::npos);
  for (const auto& k : info_from_source(pcu).at("kernels")) EXPECT_FALSE(k.at("problem").contains("latent"));
  EXPECT_NE(pcu.find(", 128, 0, 0, 0,\n     &attntune_plan::kFlashDecode"), std::string::npos);
}

TEST(ExportLatentNvcc, ALatentKernelRunsOnlyCallsWhoseVIsK) {
  const std::string nvcc = attntune::test::find_nvcc();
  ASSERT_FALSE(nvcc.empty()) << "nvcc not found ($CUDACXX, $CUDA_HOME, PATH, /usr/local/cuda/bin): CI has the toolkit";
  Fixture f;
  const std::string out = f.dir.file("mla.cu");
  const auto r = run_attntune("export --db " + shq(f.db) + " --all-best -o " + shq(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json info = info_from_source(read_bytes(out));
  int latent = -1, split = -1;
  for (std::size_t i = 0; i < info.at("kernels").size(); ++i)
    (info.at("kernels")[i].at("campaign") == "mla-latent" ? latent : split) = static_cast<int>(i);
  ASSERT_GE(latent, 0);
  ASSERT_GE(split, 0);
  // The exported file included in a host program of checks; PTX only (no ptxas: the checks run no
  // kernel).
  const std::string exe = f.dir.file("checks");
  const Shell built = sh(shq(nvcc) + " -std=c++17 -gencode arch=compute_90,code=compute_90 -include " + shq(out) + " " +
                         shq(source_dir() + "/tests/unit/export/latent_dispatch_checks.cu") + " -o " + shq(exe));
  ASSERT_EQ(built.status, 0) << built.output;
  const Shell ran = sh(shq(exe));
  ASSERT_EQ(ran.status, 0) << ran.output;
  const auto line = [](const std::string& what, int index) { return what + " -> " + std::to_string(index) + "\n"; };
  EXPECT_NE(ran.output.find("latent " + std::to_string(latent) + "\n"), std::string::npos) << ran.output;
  EXPECT_NE(ran.output.find(line("alias", latent)), std::string::npos) << ran.output;
  EXPECT_NE(ran.output.find(line("separate", split)), std::string::npos) << ran.output;
  EXPECT_NE(ran.output.find(line("alias_strides", split)), std::string::npos) << ran.output;
  EXPECT_NE(ran.output.find(line("sizes", split)), std::string::npos) << ran.output;
  EXPECT_NE(ran.output.find(line("sizes_latent", latent)), std::string::npos) << ran.output;
  EXPECT_NE(ran.output.find(line("sizes_latent_far", split)), std::string::npos) << ran.output;
  EXPECT_NE(ran.output.find(line("sizes_old_options", split)), std::string::npos) << ran.output;
  EXPECT_NE(ran.output.find("ex_separate: 1000 attntune_options.latent is 1 (V is K's first head_dim_v columns, one "
                            "buffer), but v (0x120000000) is not k (0x110000000): pass v = k with v_strides = "
                            "k_strides, or latent 0 for separate K and V\n"),
            std::string::npos)
      << ran.output;
  EXPECT_NE(ran.output.find("ex_strides: 1000 attntune_options.latent is 1 (V is K's first head_dim_v columns, one "
                            "buffer), but v_strides {524288, 524288, 128} are not k_strides {786432, 786432, 192}"),
            std::string::npos)
      << ran.output;
  EXPECT_NE(ran.output.find("kvcache_ex_separate: 1000 attntune_options.latent is 1"), std::string::npos)
      << ran.output;
  EXPECT_NE(ran.output.find("refuses: this flash_decode kernel was built for a latent cache (V is the first "
                            "head_dim_v columns of K): the call's v must be its k"),
            std::string::npos)
      << ran.output;
}
}  // namespace test_export_latent
