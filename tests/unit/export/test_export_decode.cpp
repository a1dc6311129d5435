// flash_decode through export: a paged decode campaign and a dense one beside a flash_fwd_mma one
// export to one file whose kernel_info lists each entry point with the problems tuned for it; the
// file builds with the contract's command line for sm_80 and sm_90 (the family's mma.sync path) and
// its serving entry points refuse what its kernels cannot do before any CUDA call.
#include <future>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "export/export.hpp"
#include "export/select.hpp"
#include "families/family.hpp"
#include "tests/common/run_attntune.hpp"
#include "tests/unit/db/db_test_util.hpp"
#include "tests/unit/export/export_db.hpp"
#include "tests/unit/export/nvcc_util.hpp"

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

const std::string kPaged = "b=64,h=32,hkv=8,s=1,sk=4096,d=128,dtype=bf16,causal=0,page=16";
const std::string kDense = "b=1,h=32,hkv=8,s=1,sk=32768,d=128,dtype=bf16,causal=0";
const std::string kPrefill = "b=2,h=8,s=512,d=128,dtype=bf16,causal=0";

struct Fixture {
  TempDir dir;
  std::string db = dir.file("decode.db");
  ExportDb d{db, source_dir()};
  Fixture() {
    d.campaign("flash_decode", "dec-paged", kPaged, {d.config("flash_decode", kPaged, {{"block_n", 64}})}, {360.0});
    d.campaign("flash_decode", "dec-dense", kDense, {d.config("flash_decode", kDense, {{"block_n", 64}})}, {52.0});
    d.campaign("flash_fwd_mma", "prefill", kPrefill, {d.config("flash_fwd_mma", kPrefill, {})}, {40.0});
  }
};

}  // namespace

TEST(ExportDecode, AllBestListsEachEntryPointWithItsProblems) {
  Fixture f;
  const std::string out = f.dir.file("all.cu");
  const auto r = run_attntune("export --db " + shq(f.db) + " --all-best --dtype bf16 -o " + shq(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string cu = read_bytes(out);
  const nlohmann::json info = info_from_source(cu);
  ASSERT_EQ(info["kernels"].size(), 3u);
  const auto& entries = info["entry_points"];
  ASSERT_TRUE(entries.contains("attntune_attention_forward_kvcache")) << entries.dump();
  EXPECT_EQ(entries["attntune_attention_forward_kvcache"].size(), 2u);  // both decode problems
  EXPECT_EQ(entries["attntune_attention_forward"].size(), 3u);          // decode serves dense calls too
  EXPECT_FALSE(entries.contains("attntune_attention_forward_varlen"));
  EXPECT_NE(cu.find("&attntune_plan::kFlashDecode, kDefines_k"), std::string::npos);
  EXPECT_NE(cu.find("// ---- templates/flash_decode/launch.h\n"), std::string::npos);
  EXPECT_NE(cu.find("extern \"C\" __global__ void attntune_k0_flash_decode_combine(const att::DecodeParams p, const __grid_constant__ att::DecodeMaps maps);"),
            std::string::npos);
  for (const auto& k : info["kernels"])
    if (k["template"] == "flash_decode") EXPECT_TRUE(k["launch"].contains("combine")) << k.dump();
  // The paged problem keeps its page in the provenance, also in each kernel's problem object, so a
  // caller (tools/compare_sdpa.py) matches the kernel with its entry in entry_points.
  EXPECT_NE(cu.find("page=16"), std::string::npos);
  int paged = 0;
  for (const auto& k : info["kernels"]) paged += k["problem"].contains("page") && k["problem"]["page"] == 16;
  EXPECT_EQ(paged, 1) << info["kernels"].dump();
}

TEST(ExportDecodeNvcc, BuildsForSm80AndSm90AndRefusesBadServingCalls) {
  const std::string nvcc = attntune::test::find_nvcc();
  ASSERT_FALSE(nvcc.empty()) << "nvcc not found ($CUDACXX, $CUDA_HOME, PATH, /usr/local/cuda/bin): CI has the toolkit";
  Fixture f;
  const std::string one = f.dir.file("paged.cu"), lib = f.dir.file("libpaged.so");
  auto r = run_attntune("export --db " + shq(f.db) + " --campaign dec-paged -o " + shq(one));
  ASSERT_EQ(r.rc, 0) << r.err;
  std::vector<std::future<Shell>> jobs;
  jobs.push_back(std::async(std::launch::async, sh, attntune::test::nvcc_shared_command(nvcc, "sm_90", one, lib)));
  jobs.push_back(std::async(std::launch::async, sh,
                            shq(nvcc) + " -std=c++17 -arch=sm_80 -Xcompiler -fPIC -shared " + shq(one) + " -o " +
                                shq(f.dir.file("lib80.so"))));
  const Shell b90 = jobs[0].get(), b80 = jobs[1].get();
  ASSERT_EQ(b90.status, 0) << b90.output;
  ASSERT_EQ(b80.status, 0) << b80.output;
  const Shell nm = sh("nm -D --defined-only " + shq(lib));
  for (const char* sym : {"attntune_attention_forward", "attntune_attention_forward_kvcache",
                          "attntune_attention_forward_varlen", "attntune_kernel_info", "attntune_last_error"})
    EXPECT_NE(nm.output.find(std::string(" T ") + sym + "\n"), std::string::npos) << sym;
  const std::string exe = f.dir.file("checks");
  const Shell built = sh(shq(nvcc) + " -std=c++17 " + shq(source_dir() + "/tests/unit/export/kvcache_launcher_checks.cu") +
                         " -L" + shq(f.dir.path().string()) + " -lpaged -Xlinker -rpath," + shq(f.dir.path().string()) +
                         " -o " + shq(exe));
  ASSERT_EQ(built.status, 0) << built.output;
  const Shell out = sh(shq(exe));
  EXPECT_EQ(out.status, 0) << out.output;
  EXPECT_NE(out.output.find("checks: 0 failed"), std::string::npos) << out.output;
}
