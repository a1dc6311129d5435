// flash_decode through export: a paged decode campaign and a dense one beside a flash_fwd_mma one
// export to one file whose kernel_info lists each entry point with the problems tuned for it; the
// file builds with the contract's command line for sm_80 and sm_90 (the family's mma.sync path) and
// its serving entry points refuse what its kernels cannot do before any CUDA call.
#include <fstream>
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

namespace test_export_decode {
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
    if (k["template"] == "flash_decode") {
      EXPECT_TRUE(k["launch"].contains("combine")) << k.dump();
    }
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
                          "attntune_attention_forward_varlen", "attntune_attention_forward_varlen_packed",
                          "attntune_kernel_info", "attntune_last_error"})
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

// The --all-best dispatcher passes over a kernel whose launch plan would refuse the call: a dense
// call with seqlen_q 20 over 4096 keys is nearest to the decode kernel tuned at s=1, sk=4096, which
// serves seqlen_q up to 16; the prefill kernel (s=512) serves it. Before, the library answered
// ATTNTUNE_UNSUPPORTED for it. On the kvcache entry no kernel accepts s=20, and the refusal names the
// nearest kernel's reason. Host code only: no GPU.
TEST(ExportDecodeNvcc, AllBestPassesOverKernelsWhosePlanRefusesTheCall) {
  const std::string nvcc = attntune::test::find_nvcc();
  ASSERT_FALSE(nvcc.empty()) << "nvcc not found ($CUDACXX, $CUDA_HOME, PATH, /usr/local/cuda/bin): CI has the toolkit";
  Fixture f;
  const std::string all = f.dir.file("all.cu");
  auto r = run_attntune("export --db " + shq(f.db) + " --all-best --dtype bf16 -o " + shq(all));
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json info = info_from_source(read_bytes(all));
  std::vector<std::string> templates;
  for (const auto& k : info["kernels"]) templates.push_back(k["template"]);
  ASSERT_EQ(templates, (std::vector<std::string>{"flash_decode", "flash_decode", "flash_fwd_mma"}));
  const Shell b = sh(shq(nvcc) + " -std=c++17 -arch=sm_80 -Xcompiler -fPIC -shared " + shq(all) + " -o " +
                     shq(f.dir.file("liball.so")));
  ASSERT_EQ(b.status, 0) << b.output;
  const std::string checks = f.dir.file("select.cpp");
  {
    std::ofstream o(checks);
    o << R"(#include <cstdio>
extern "C" int attntune_select_kernel_entry(int, int, int, int, int, int, int, int);
extern "C" int attntune_attention_forward_kvcache(const void*, const void*, const void*, void*, float*, const int*,
    const int*, int, int, int, int, int, int, int, int, const long long*, const long long*, const long long*,
    const long long*, float, int, void*);
extern "C" const char* attntune_last_error(void);
alignas(16) static char fake[64];
int main() {
  std::printf("decode %d\n", attntune_select_kernel_entry(1, 128, 0, 2, 32, 8, 1, 4096));
  std::printf("s20 %d\n", attntune_select_kernel_entry(1, 128, 0, 2, 32, 8, 20, 4096));
  std::printf("kv_s20 %d\n", attntune_select_kernel_entry(2, 128, 0, 2, 32, 8, 20, 4096));
  const long long st[3] = {32LL * 20 * 128, 20LL * 128, 128};
  const int rc = attntune_attention_forward_kvcache(fake, fake, fake, fake, nullptr, nullptr, nullptr, 0, 0, 2, 32, 8,
                                                    20, 4096, 128, st, st, st, st, 0.08f, 0, nullptr);
  std::printf("kv_call %d %s\n", rc, attntune_last_error());
}
)";
  }
  const std::string exe = f.dir.file("select");
  const Shell built = sh(attntune::test::host_link_command(checks, f.dir.path().string(), "all", exe));
  ASSERT_EQ(built.status, 0) << built.output;
  const Shell out = sh(shq(exe));
  ASSERT_EQ(out.status, 0) << out.output;
  EXPECT_NE(out.output.find("decode 0\n"), std::string::npos) << out.output;
  EXPECT_NE(out.output.find("s20 2\n"), std::string::npos) << out.output;
  EXPECT_NE(out.output.find("kv_s20 -1\n"), std::string::npos) << out.output;
  EXPECT_NE(out.output.find("kv_call 1000 kernel d=128 bf16 causal=0, tuned for b=64,h=32,hkv=8,s=1,sk=4096"),
            std::string::npos)
      << out.output;
  EXPECT_NE(out.output.find("serves seqlen_q 1..16"), std::string::npos) << out.output;
}

// combine: cluster16 (sm_90): the export compiles the kernel with its 16-CTA cluster dims, and the
// launcher opts it into the non-portable cluster size; its info names the combine.
TEST(ExportDecodeNvcc, ClusterCombineBuildsForSm90) {
  const std::string nvcc = attntune::test::find_nvcc();
  ASSERT_FALSE(nvcc.empty()) << "nvcc not found ($CUDACXX, $CUDA_HOME, PATH, /usr/local/cuda/bin): CI has the toolkit";
  TempDir dir;
  const std::string db = dir.file("cluster.db");
  ExportDb d{db, source_dir()};
  d.campaign("flash_decode", "dec-cluster", kDense,
             {d.config_if("flash_decode", kDense,
                          [](const Config& c) { return std::get<std::string>(c.at("combine")) == "cluster16"; })},
             {48.0});
  const std::string cu = dir.file("cluster.cu"), lib = dir.file("libcluster.so");
  auto r = run_attntune("export --db " + shq(db) + " --campaign dec-cluster -o " + shq(cu));
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string src = read_bytes(cu);
  EXPECT_NE(src.find("#define CLUSTER 16"), std::string::npos);
  EXPECT_NE(src.find("__cluster_dims__(CLUSTER, 1, 1)"), std::string::npos);
  EXPECT_NE(src.find("cudaFuncAttributeNonPortableClusterSizeAllowed"), std::string::npos);
  const nlohmann::json info = info_from_source(src);
  ASSERT_EQ(info["kernels"].size(), 1u);
  EXPECT_EQ(info["kernels"][0]["launch"]["combine"], "cluster16") << info.dump();
  const Shell b = sh(attntune::test::nvcc_shared_command(nvcc, "sm_90", cu, lib));
  ASSERT_EQ(b.status, 0) << b.output;
  // ptxas took the cluster dims: the kernel requires 16 CTAs a cluster.
  const Shell ptx = sh(shq(nvcc) + " -std=c++17 -arch=sm_90 -ptx " + shq(cu) + " -o -");
  ASSERT_EQ(ptx.status, 0) << ptx.output;
  EXPECT_NE(ptx.output.find(".reqnctapercluster 16, 1, 1"), std::string::npos);
}
}  // namespace test_export_decode
