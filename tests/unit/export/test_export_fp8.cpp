// The export of FP8-cache builds (`kv_dtype=fp8`, issue 42: K and V FP8 e4m3 with per-(sequence, KV
// head) scales, q and out bf16; flash_decode): the kernel table's row and label say it, the info's
// problem carries "kv_dtype": "fp8", only a file with one explains the call in its header, and such a
// file refuses targets below sm_89 at compile time (its kernels convert e4m3 there). No GPU: the
// campaigns are recorded through the Store (export_db.hpp). ExportFp8Nvcc builds the library for
// sm_89 and sm_90 with the contract's command line, and asks its dispatcher and its extended entry
// points on the host (fp8_dispatch_checks.cu) which kernel each call runs: the FP8 kernel for calls
// whose attntune_options say kv_dtype 1 only, the 16-bit kernel for every other (the contract's
// entry points included), and the refusals of the FP8 options and strides.
#include <future>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/common/run_attntune.hpp"
#include "tests/unit/db/db_test_util.hpp"
#include "tests/unit/export/export_db.hpp"
#include "tests/unit/export/nvcc_util.hpp"

namespace test_export_fp8 {
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

// The FP8 build is tuned for shorter caches than the 16-bit one: a 16-bit call at its lengths is
// nearer the FP8 kernel by the usual rule, and must still run the 16-bit one (and the reverse).
const std::string kFp8 = "b=16,h=32,hkv=8,s=1,sk=2048,d=128,dtype=bf16,causal=0,page=16,kv_dtype=fp8";
const std::string kPlain = "b=16,h=32,hkv=8,s=1,sk=8192,d=128,dtype=bf16,causal=0,page=16";

struct Fixture {
  TempDir dir;
  std::string db = dir.file("fp8.db");
  ExportDb d{db, source_dir()};
  Fixture() {
    // cp.async and no clusters: configs that sm_89 (an L40S, FP8's first arch) builds as sm_90 does.
    auto portable = [](const Config& c) {
      const std::string combine = std::get<std::string>(c.at("combine"));
      return std::get<std::string>(c.at("kv_load")) == "cp_async" && (combine == "kernel" || combine == "last_cta");
    };
    d.campaign("flash_decode", "dec-fp8", kFp8, {d.config_if("flash_decode", kFp8, portable)}, {40.0});
    d.campaign("flash_decode", "dec-bf16", kPlain, {d.config_if("flash_decode", kPlain, portable)}, {90.0});
  }
  std::string export_all() {
    const std::string out = dir.file("all.cu");
    const auto r = run_attntune("export --db " + shq(db) + " --all-best -o " + shq(out));
    EXPECT_EQ(r.rc, 0) << r.err;
    return out;
  }
};

}  // namespace

TEST(ExportFp8, TheTableInfoAndHeaderSayFp8AndOnlyAnFp8FileExplainsIt) {
  Fixture f;
  const std::string cu = read_bytes(f.export_all());
  const nlohmann::json info = info_from_source(cu);
  std::map<std::string, nlohmann::json> problems;  // campaign -> problem
  for (const auto& k : info.at("kernels")) {
    problems[k.at("campaign").get<std::string>()] = k.at("problem");
    EXPECT_EQ(k.at("variants"), nlohmann::json::array()) << k.dump();  // the cache dtype is not a variant
  }
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_EQ(problems["dec-fp8"].value("kv_dtype", ""), "fp8");
  EXPECT_FALSE(problems["dec-bf16"].contains("kv_dtype"));
  EXPECT_EQ(Problem::from_json(problems["dec-fp8"]).str(), kFp8);
  // Both entry points flash_decode serves list the FP8 problem by its spec.
  for (const char* entry : {"attntune_attention_forward", "attntune_attention_forward_kvcache"}) {
    const auto& specs = info.at("entry_points").at(entry);
    EXPECT_NE(std::find(specs.begin(), specs.end(), kFp8), specs.end()) << entry << ": " << specs.dump();
  }
  // The rows: ..., head_dim_v, latent, kv_fp8, qkv_fp8 (the FP8 forward's: 0 here); the label names it.
  EXPECT_NE(cu.find(", 0, 0, 1, 0,\n     &attntune_plan::kFlashDecode"), std::string::npos);
  EXPECT_NE(cu.find(", 0, 0, 0, 0,\n     &attntune_plan::kFlashDecode"), std::string::npos);
  EXPECT_NE(cu.find("tuned for b=16,h=32,hkv=8,s=1,sk=2048,page=16 kv_dtype=fp8\""), std::string::npos);
  EXPECT_NE(cu.find("tuned for b=16,h=32,hkv=8,s=1,sk=8192,page=16\""), std::string::npos);
  EXPECT_NE(cu.find("// FP8 KV caches (label \"kv_dtype=fp8\"): k and v (k_cache and v_cache) hold FP8 e4m3"),
            std::string::npos);
  EXPECT_NE(cu.find("attntune_options.kv_dtype = ATTNTUNE_KV_FP8_E4M3 (1)"), std::string::npos);
  EXPECT_NE(cu.find("#define ATTNTUNE_KV_FP8_E4M3 1"), std::string::npos);
  // The build's own define, and the file's lowest target: sm_89 (the space's arch with fp8: 1).
  EXPECT_NE(cu.find("{\"ATT_KV_FP8\", 1LL}"), std::string::npos);
  EXPECT_NE(cu.find("#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890\n"
                    "#error \"attntune: this file needs compute capability 8.9 or newer: compile with -arch=sm_89 or "
                    "higher\""),
            std::string::npos);

  // A file without an FP8 kernel: its header, table and prologue are as before.
  const std::string plain = f.dir.file("bf16.cu");
  const auto s = run_attntune("export --db " + shq(f.db) + " --campaign dec-bf16 -o " + shq(plain));
  ASSERT_EQ(s.rc, 0) << s.err;
  const std::string pcu = read_bytes(plain);
  EXPECT_EQ(pcu.find("FP8 KV caches (label"), std::string::npos);
  EXPECT_EQ(pcu.find(",page=16 kv_dtype=fp8\""), std::string::npos);
  EXPECT_EQ(pcu.find("{\"ATT_KV_FP8\", "), std::string::npos);
  EXPECT_NE(pcu.find("__CUDA_ARCH__ < 800\n"), std::string::npos);
  for (const auto& k : info_from_source(pcu).at("kernels")) EXPECT_FALSE(k.at("problem").contains("kv_dtype"));
  EXPECT_NE(pcu.find(", 0, 0, 0, 0,\n     &attntune_plan::kFlashDecode"), std::string::npos);
}

// The contract's build line for sm_90 and sm_89 (FP8's first arch, cp.async without TMA); for sm_80 the
// file refuses at compile time, saying which arch it needs (a kernel built there would read zeros).
TEST(ExportFp8Nvcc, BuildsForSm89AndSm90AndRefusesSm80) {
  const std::string nvcc = attntune::test::find_nvcc();
  ASSERT_FALSE(nvcc.empty()) << "nvcc not found ($CUDACXX, $CUDA_HOME, PATH, /usr/local/cuda/bin): CI has the toolkit";
  Fixture f;
  const std::string one = f.dir.file("fp8.cu");
  const auto r = run_attntune("export --db " + shq(f.db) + " --campaign dec-fp8 -o " + shq(one));
  ASSERT_EQ(r.rc, 0) << r.err;
  std::vector<std::future<Shell>> jobs;
  for (const char* arch : {"sm_90", "sm_89"})
    jobs.push_back(std::async(std::launch::async, sh,
                              attntune::test::nvcc_shared_command(nvcc, arch, one,
                                                                  f.dir.file(std::string("lib") + arch + ".so"))));
  for (auto& j : jobs) {
    const Shell b = j.get();
    EXPECT_EQ(b.status, 0) << b.output;
  }
  const Shell nm = sh("nm -D --defined-only " + shq(f.dir.file("libsm_89.so")));
  for (const char* sym : {"attntune_attention_forward_ex", "attntune_attention_forward_kvcache_ex",
                          "attntune_select_kernel_ex", "attntune_kernel_info"})
    EXPECT_NE(nm.output.find(std::string(" T ") + sym + "\n"), std::string::npos) << sym;
  // The device pass of sm_80 stops at the prologue (PTX only: it never reaches ptxas).
  const Shell b80 = sh(shq(nvcc) + " -std=c++17 -arch=compute_80 -ptx " + shq(one) + " -o " +
                       shq(f.dir.file("fp8_80.ptx")));
  EXPECT_NE(b80.status, 0);
  EXPECT_NE(b80.output.find("this file needs compute capability 8.9 or newer: compile with -arch=sm_89 or higher"),
            std::string::npos)
      << b80.output;
}

// The dispatcher and the extended entry points of an all-best file with an FP8 kernel and a 16-bit one,
// on the host (fp8_dispatch_checks.cu: the file included, PTX only, no kernel run).
TEST(ExportFp8Nvcc, OnlyFp8CallsRunTheFp8KernelAndBadOptionsAreRefused) {
  const std::string nvcc = attntune::test::find_nvcc();
  ASSERT_FALSE(nvcc.empty()) << "nvcc not found ($CUDACXX, $CUDA_HOME, PATH, /usr/local/cuda/bin): CI has the toolkit";
  Fixture f;
  const std::string out = f.export_all();
  const nlohmann::json info = info_from_source(read_bytes(out));
  int fp8 = -1, plain = -1;
  for (std::size_t i = 0; i < info.at("kernels").size(); ++i)
    (info.at("kernels")[i].at("campaign") == "dec-fp8" ? fp8 : plain) = static_cast<int>(i);
  ASSERT_GE(fp8, 0);
  ASSERT_GE(plain, 0);
  const std::string exe = f.dir.file("checks");
  const Shell built = sh(shq(nvcc) + " -std=c++17 -gencode arch=compute_90,code=compute_90 -include " + shq(out) + " " +
                         shq(source_dir() + "/tests/unit/export/fp8_dispatch_checks.cu") + " -o " + shq(exe));
  ASSERT_EQ(built.status, 0) << built.output;
  const Shell ran = sh(shq(exe));
  ASSERT_EQ(ran.status, 0) << ran.output;
  const std::string& o = ran.output;
  const auto line = [](const std::string& what, int index) { return what + " -> " + std::to_string(index) + "\n"; };
  EXPECT_NE(o.find("fp8 " + std::to_string(fp8) + "\n"), std::string::npos) << o;
  // Calls (select_kernel: what every entry point runs): by their cache dtype first, then by lengths.
  EXPECT_NE(o.find(line("fp8_near", fp8)), std::string::npos) << o;
  EXPECT_NE(o.find(line("fp8_far", fp8)), std::string::npos) << o;       // nearer the 16-bit kernel's lengths
  EXPECT_NE(o.find(line("bf16_near_fp8", plain)), std::string::npos) << o;  // nearer the FP8 kernel's lengths
  EXPECT_NE(o.find(line("bf16_far", plain)), std::string::npos) << o;
  EXPECT_NE(o.find(line("fp8_dense", fp8)), std::string::npos) << o;     // flash_decode serves the dense entry too
  // Sizes only (attntune_select_kernel_ex): kv_dtype 1 weighs the FP8 kernel alone; 0, NULL options, an
  // older caller's struct and the contract's selector never.
  EXPECT_NE(o.find(line("sizes_fp8", fp8)), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_fp8_dense", fp8)), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_fp8_varlen", -1)), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_bf16", plain)), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_null", plain)), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_old_options", plain)), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_entry", plain)), std::string::npos) << o;
  EXPECT_NE(o.find(line("sizes_bad_kv_dtype", -1)), std::string::npos) << o;
  // The kernels' own plans refuse the other cache dtype, saying so.
  EXPECT_NE(o.find("plain_refuses: this flash_decode kernel was built for a KV cache of q's dtype; the call's cache "
                   "is FP8 e4m3"),
            std::string::npos)
      << o;
  EXPECT_NE(o.find("fp8_refuses: this flash_decode kernel was built for a KV cache of FP8 e4m3; the call's cache is "
                   "q's dtype"),
            std::string::npos)
      << o;
  // The options' refusals, before any CUDA call.
  const auto refused = [&](const std::string& what, const std::string& why) {  // its line has both
    const std::size_t at = o.find("\n" + what + ": 1000 ");
    ASSERT_NE(at, std::string::npos) << what << "\n" << o;
    EXPECT_NE(o.substr(at, o.find('\n', at + 1) - at).find(why), std::string::npos) << what << "\n" << o;
  };
  refused("kv_dtype_2", "attntune_options: kv_dtype must be 0 (ATTNTUNE_KV_DTYPE_Q: the cache is q's dtype) or 1 "
                        "(ATTNTUNE_KV_FP8_E4M3: an FP8 e4m3 cache) (got 2)");
  refused("descale_misaligned", "attntune_options: k_descale and v_descale must be 4-byte aligned fp32 arrays");
  refused("descale_stride_negative", "attntune_options: descale strides are {batch, head} in elements, 0 .. 2^31 - 1 "
                                     "(k_descale_stride {-1, 1}, v_descale_stride {8, 1})");
  refused("descale_stride_2p31", "(k_descale_stride {8, 1}, v_descale_stride {2147483648, 1})");
  refused("descales_without_fp8", "attntune_options: k_descale and v_descale (and their strides) dequantise an FP8 "
                                  "cache, and kv_dtype is 0");
  refused("descale_strides_without_fp8", "dequantise an FP8 cache, and kv_dtype is 0");
  // An FP8 cache's strides count bytes: 16-byte multiples, where a 16-bit cache's count 8-element ones.
  refused("fp8_stride_8_bytes", "k_strides {16384, 136, 1024}: a stride is not a multiple of 16 elements (an FP8 "
                                "cache's strides count bytes: 16-byte rows)");
  refused("fp8_no_kernel", "no kernel in this file for head_dim=64 is_causal=0 kv_dtype=fp8 serves "
                           "attntune_attention_forward_kvcache");
  refused("fp8_varlen", "kv_dtype=fp8 serves attntune_attention_forward_varlen");
  // Calls past every check reach the CUDA runtime (no GPU here: a cudaError_t, never 1000).
  if (o.find("a GPU is present") == std::string::npos) {
    EXPECT_NE(o.find("fp8_valid: past the checks\n"), std::string::npos) << o;
    EXPECT_NE(o.find("fp8_per_tensor: past the checks\n"), std::string::npos) << o;
    EXPECT_NE(o.find("bf16_stride_8_elements: past the checks\n"), std::string::npos) << o;
  }
}

// Chunked prefill over an FP8 cache (flash_fwd_wgmma, issue 42): its file carries the kernel that
// converts the cache once before the main kernel (launch 0 of a call with several query tiles a KV
// head), under the file's namespace as the other entry points, and builds for sm_90a.
TEST(ExportFp8Nvcc, ChunkedPrefillOverAnFp8CacheCarriesItsConversionKernelAndBuilds) {
  const std::string nvcc = attntune::test::find_nvcc();
  ASSERT_FALSE(nvcc.empty()) << "nvcc not found ($CUDACXX, $CUDA_HOME, PATH, /usr/local/cuda/bin): CI has the toolkit";
  const std::string chunk = "b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=bf16,causal=1,page=16,kv_dtype=fp8";
  TempDir dir;
  const std::string db = dir.file("chunk.db");
  ExportDb d{db, source_dir()};
  d.campaign("flash_fwd_wgmma", "chunk-fp8", chunk,
             {d.config_if("flash_fwd_wgmma", chunk, [](const Config& c) { return std::get<bool>(c.at("pack_gqa")); })},
             {1950.0});
  const std::string one = dir.file("chunk.cu");
  const auto r = run_attntune("export --db " + shq(db) + " --campaign chunk-fp8 -o " + shq(one));
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string src = read_bytes(one);
  for (const char* k : {"flash_fwd_wgmma", "flash_fwd_wgmma_varlen_order", "flash_fwd_wgmma_kv_dequant"})
    EXPECT_NE(src.find(std::string("#define ") + k + " attntune_k0_" + k + "\n"), std::string::npos) << k;
  EXPECT_NE(src.find("const AttnParams p, unsigned char* ws"), std::string::npos);
  const Shell b = sh(attntune::test::nvcc_shared_command(nvcc, "sm_90a", one, dir.file("libchunk.so")));
  EXPECT_EQ(b.status, 0) << b.output;
}
}  // namespace test_export_fp8
