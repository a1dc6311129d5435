// flash_decode_wgmma through export: an MLA latent decode campaign (d=576, dv=512, one KV head,
// pages of 64, latent=1) and a 512-dim one export to one file that names the family's launch plan
// and entry points, says which kernel is latent and which launches clusters of 2 (multicast), and
// builds with the contract's command line for sm_90a (its wgmma, setmaxnreg and cluster code);
// ptxas takes the multicast kernel's cluster dims. Host code only: no GPU.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/common/run_attntune.hpp"
#include "tests/unit/db/db_test_util.hpp"
#include "tests/unit/export/export_db.hpp"
#include "tests/unit/export/nvcc_util.hpp"

namespace test_export_decode_wgmma {
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
const std::string kMla = "b=64,h=128,hkv=1,s=1,sk=8192,d=576,dv=512,dtype=bf16,causal=0,page=64,latent=1";
const std::string kWide = "b=16,h=32,hkv=4,s=1,sk=8192,d=512,dtype=bf16,causal=0,page=64";
}  // namespace

TEST(ExportDecodeWgmmaNvcc, MlaAndWideKernelsExportAndBuildForSm90a) {
  const std::string nvcc = attntune::test::find_nvcc();
  ASSERT_FALSE(nvcc.empty()) << "nvcc not found ($CUDACXX, $CUDA_HOME, PATH, /usr/local/cuda/bin): CI has the toolkit";
  TempDir dir;
  const std::string db = dir.file("mla.db");
  ExportDb d{db, source_dir()};
  d.campaign("flash_decode_wgmma", "mla", kMla,
             {d.config_if("flash_decode_wgmma", kMla, [](const Config& c) {
               return std::get<bool>(c.at("multicast")) && std::get<std::string>(c.at("scores")) == "single";
             })},
             {272.0});
  d.campaign("flash_decode_wgmma", "wide", kWide, {d.config("flash_decode_wgmma", kWide, {})}, {259.0});
  const std::string cu = dir.file("mla.cu"), lib = dir.file("libmla.so");
  const auto r = run_attntune("export --db " + shq(db) + " --all-best --dtype bf16 -o " + shq(cu));
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string src = read_bytes(cu);
  EXPECT_NE(src.find("&attntune_plan::kFlashDecodeWgmma, kDefines_k"), std::string::npos);
  EXPECT_NE(src.find("// ---- templates/flash_decode_wgmma/launch.h\n"), std::string::npos);
  EXPECT_NE(src.find("#define MULTICAST 1"), std::string::npos);
  const nlohmann::json info = info_from_source(src);
  ASSERT_EQ(info["kernels"].size(), 2u) << info.dump();
  int latent = 0, multicast = 0;
  for (const auto& k : info["kernels"]) {
    EXPECT_EQ(k["template"], "flash_decode_wgmma") << k.dump();
    EXPECT_EQ(k["launch"]["threads"], 384) << k.dump();
    latent += k["launch"].value("latent", false);
    multicast += k["launch"].value("multicast", false);
  }
  EXPECT_EQ(latent, 1) << info.dump();
  EXPECT_EQ(multicast, 1) << info.dump();
  const Shell b = sh(attntune::test::nvcc_shared_command(nvcc, "sm_90a", cu, lib));
  ASSERT_EQ(b.status, 0) << b.output;
  const Shell nm = sh("nm -D --defined-only " + shq(lib));
  for (const char* sym : {"attntune_attention_forward", "attntune_attention_forward_kvcache", "attntune_kernel_info"})
    EXPECT_NE(nm.output.find(std::string(" T ") + sym + "\n"), std::string::npos) << sym;
  // ptxas took the multicast kernel's cluster dims.
  const Shell ptx = sh(shq(nvcc) + " -std=c++17 -arch=sm_90a -ptx " + shq(cu) + " -o -");
  ASSERT_EQ(ptx.status, 0) << ptx.output;
  EXPECT_NE(ptx.output.find(".reqnctapercluster 2, 1, 1"), std::string::npos);
}

// The FP8 path (kv_dtype=fp8, d=128): an export of its kernel carries the FP8 consumer
// (templates/flash_decode_wgmma/fp8.cuh, ATT_KV_FP8), says 256 threads, and builds for sm_90a.
TEST(ExportDecodeWgmmaNvcc, Fp8CacheKernelExportsAndBuildsForSm90a) {
  const std::string nvcc = attntune::test::find_nvcc();
  ASSERT_FALSE(nvcc.empty()) << "nvcc not found ($CUDACXX, $CUDA_HOME, PATH, /usr/local/cuda/bin): CI has the toolkit";
  const std::string fp8 = "b=32,h=32,hkv=8,s=16,sk=4096,d=128,dtype=bf16,causal=1,page=16,kv_dtype=fp8";
  TempDir dir;
  const std::string db = dir.file("fp8.db");
  ExportDb d{db, source_dir()};
  d.campaign("flash_decode_wgmma", "fp8", fp8, {d.config("flash_decode_wgmma", fp8, {})}, {101.0});
  const std::string cu = dir.file("fp8.cu"), lib = dir.file("libfp8.so");
  const auto r = run_attntune("export --db " + shq(db) + " --all-best --dtype bf16 -o " + shq(cu));
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string src = read_bytes(cu);
  EXPECT_NE(src.find("#define ATT_KV_FP8 1"), std::string::npos);
  EXPECT_NE(src.find("consume_fp8"), std::string::npos);
  const nlohmann::json info = info_from_source(src);
  ASSERT_EQ(info["kernels"].size(), 1u) << info.dump();
  EXPECT_EQ(info["kernels"][0]["launch"]["threads"], 256) << info.dump();
  const Shell b = sh(attntune::test::nvcc_shared_command(nvcc, "sm_90a", cu, lib));
  ASSERT_EQ(b.status, 0) << b.output;
}
}  // namespace test_export_decode_wgmma
