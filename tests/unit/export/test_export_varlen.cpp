// Packed batches through export: kernels tuned on varlen problems serve the varlen entry points
// only (kernel_info's entry_points and the dispatcher say so per kernel), a dense kernel of the
// same family never serves them, and the dispatcher picks among varlen kernels by max_seqlen. A
// flash_fwd_wgmma kernel (TMA tensor maps over the packed rows) needs the row counts: the
// contract's attntune_attention_forward_varlen passes over it to a flash_fwd_mma varlen kernel,
// or, with none, refuses naming attntune_attention_forward_varlen_packed. Host code only: no GPU
// (calls that would launch are checked only where no driver answers).
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/common/run_attntune.hpp"
#include "tests/unit/db/db_test_util.hpp"
#include "tests/unit/export/export_db.hpp"
#include "tests/unit/export/nvcc_util.hpp"

namespace test_export_varlen {
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

const std::string kLong = "b=16,h=32,hkv=8,s=8192,d=128,dtype=bf16,causal=1,varlen=128";   // wgmma
const std::string kShort = "b=64,h=32,hkv=8,s=1024,d=128,dtype=bf16,causal=1,varlen=16";   // mma
const std::string kDense = "b=4,h=32,hkv=8,s=4096,d=128,dtype=bf16,causal=1";              // mma

const char* kProgram = R"(#include <cstdio>
extern "C" int attntune_select_kernel_entry(int, int, int, int, int, int, int, int);
extern "C" int attntune_attention_forward_varlen(const void*, const void*, const void*, void*, float*, const int*,
    const int*, int, int, int, int, int, int, const long long*, const long long*, const long long*, const long long*,
    float, int, void*);
extern "C" int attntune_attention_forward_varlen_packed(const void*, const void*, const void*, void*, float*,
    const int*, const int*, int, long long, long long, int, int, int, int, int, const long long*, const long long*,
    const long long*, const long long*, float, int, void*);
extern "C" const char* attntune_last_error(void);
alignas(16) static char fake[64];
int main() {
  std::printf("varlen_long %d\n", attntune_select_kernel_entry(4, 128, 1, 16, 32, 8, 8000, 8000));
  std::printf("varlen_short %d\n", attntune_select_kernel_entry(4, 128, 1, 64, 32, 8, 900, 900));
  std::printf("dense %d\n", attntune_select_kernel_entry(1, 128, 1, 4, 32, 8, 4096, 4096));
  const long long qs[2] = {32 * 128, 128}, ks[2] = {8 * 128, 128};
  const int* cu = reinterpret_cast<const int*>(fake);
  int rc = attntune_attention_forward_varlen(fake, fake, fake, fake, nullptr, cu, cu, 16, 8000, 8000, 32, 8, 128, qs,
                                             ks, ks, qs, 0.08f, 1, nullptr);
  std::printf("contract %d %s\n", rc, attntune_last_error());
  rc = attntune_attention_forward_varlen_packed(fake, fake, fake, fake, nullptr, cu, cu, 16, 0, 0, 8000, 8000, 32, 8,
                                                128, qs, ks, ks, qs, 0.08f, 1, nullptr);
  std::printf("empty %d\n", rc);
  rc = attntune_attention_forward_varlen_packed(fake, fake, fake, fake, nullptr, nullptr, cu, 16, 100, 100, 8000, 8000,
                                                32, 8, 128, qs, ks, ks, qs, 0.08f, 1, nullptr);
  std::printf("null_cu %d %s\n", rc, attntune_last_error());
  rc = attntune_attention_forward_varlen_packed(fake, fake, fake, fake, nullptr, cu, cu, 16, 100, 100, 8000, 8000,
                                                32, 8, 128, qs, ks, ks, qs, 0.08f, 1, nullptr);
  std::printf("packed %d %s\n", rc, attntune_last_error());
}
)";

// Builds `cu` for sm_90a with the contract's line and runs kProgram against it: its output.
std::string run_program(const std::string& nvcc, TempDir& dir, const std::string& cu, const std::string& lib) {
  const Shell b = sh(attntune::test::nvcc_shared_command(nvcc, "sm_90a", cu, dir.file("lib" + lib + ".so")));
  EXPECT_EQ(b.status, 0) << b.output;
  const std::string src = dir.file(lib + ".cpp"), exe = dir.file(lib);
  std::ofstream(src) << kProgram;
  const Shell built = sh(attntune::test::host_link_command(src, dir.path().string(), lib, exe));
  EXPECT_EQ(built.status, 0) << built.output;
  const Shell out = sh(shq(exe));
  EXPECT_EQ(out.status, 0) << out.output;
  return out.output;
}

bool has_driver() { return std::system("nvidia-smi > /dev/null 2>&1") == 0; }

}  // namespace

TEST(ExportVarlenNvcc, VarlenKernelsServeTheVarlenEntryPointsOnly) {
  const std::string nvcc = attntune::test::find_nvcc();
  ASSERT_FALSE(nvcc.empty()) << "nvcc not found ($CUDACXX, $CUDA_HOME, PATH, /usr/local/cuda/bin): CI has the toolkit";
  TempDir dir;
  const std::string db = dir.file("varlen.db");
  {
    ExportDb d{db, source_dir()};
    d.campaign("flash_fwd_wgmma", "long", kLong, {d.config("flash_fwd_wgmma", kLong, {{"warp_specialize", 1}})}, {6700});
    d.campaign("flash_fwd_mma", "short", kShort, {d.config("flash_fwd_mma", kShort, {})}, {900});
    d.campaign("flash_fwd_mma", "dense", kDense, {d.config("flash_fwd_mma", kDense, {})}, {1500});
  }
  const std::string all = dir.file("all.cu"), one = dir.file("one.cu");
  auto r = run_attntune("export --db " + shq(db) + " --all-best --dtype bf16 -o " + shq(all));
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json info = info_from_source(read_bytes(all));
  ASSERT_EQ(info["kernels"].size(), 3u);
  const auto& entries = info["entry_points"];
  ASSERT_TRUE(entries.contains("attntune_attention_forward_varlen")) << entries.dump();
  EXPECT_EQ(entries["attntune_attention_forward_varlen"].size(), 2u) << entries.dump();
  ASSERT_TRUE(entries.contains("attntune_attention_forward")) << entries.dump();
  EXPECT_EQ(entries["attntune_attention_forward"], nlohmann::json::array({Problem::parse(kDense).str()}));
  int long_index = -1, short_index = -1, dense_index = -1;
  for (std::size_t i = 0; i < info["kernels"].size(); ++i) {
    const auto& p = info["kernels"][i]["problem"];
    if (p.value("varlen", 0) == 128) long_index = static_cast<int>(i);
    else if (p.value("varlen", 0) == 16) short_index = static_cast<int>(i);
    else dense_index = static_cast<int>(i);
  }
  ASSERT_GE(long_index, 0);
  ASSERT_GE(short_index, 0);
  ASSERT_GE(dense_index, 0);

  const std::string out = run_program(nvcc, dir, all, "all");
  EXPECT_NE(out.find("varlen_long " + std::to_string(long_index) + "\n"), std::string::npos) << out;
  EXPECT_NE(out.find("varlen_short " + std::to_string(short_index) + "\n"), std::string::npos) << out;
  EXPECT_NE(out.find("dense " + std::to_string(dense_index) + "\n"), std::string::npos) << out;
  EXPECT_NE(out.find("empty 0\n"), std::string::npos) << out;  // total_q 0: nothing to compute
  EXPECT_NE(out.find("null_cu 1000 cu_seqlens_q and cu_seqlens_k must not be NULL"), std::string::npos) << out;
  if (!has_driver()) {
    // Past the checks and the choice: the contract's entry point runs the mma varlen kernel (the
    // wgmma one refuses it), which then finds no driver here.
    EXPECT_EQ(out.find("contract 1000"), std::string::npos) << out;
    EXPECT_EQ(out.find("packed 1000"), std::string::npos) << out;
  }

  // A file of the wgmma varlen kernel alone: the contract's entry point is refused, naming the
  // one that passes the row counts.
  r = run_attntune("export --db " + shq(db) + " --campaign long -o " + shq(one));
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string alone = run_program(nvcc, dir, one, "one");
  EXPECT_NE(alone.find("contract 1000 kernel d=128 bf16 causal=1, tuned for b=16,h=32,hkv=8,s=8192,sk=8192,varlen=128"),
            std::string::npos)
      << alone;
  EXPECT_NE(alone.find("attntune_attention_forward_varlen_packed, which takes them"), std::string::npos) << alone;
  EXPECT_NE(alone.find("dense -1\n"), std::string::npos) << alone;
  if (!has_driver()) {
    EXPECT_EQ(alone.find("packed 1000"), std::string::npos) << alone;
  }
}
}  // namespace test_export_varlen
