// Chunked prefill over a paged KV cache through export: kernels of the prefill families tuned on a
// paged problem (page=N, s > 16) serve attntune_attention_forward_kvcache only, beside a flash_decode
// kernel (both entry points) and a dense prefill kernel (attntune_attention_forward only). The
// --all-best dispatcher gives the kvcache entry point's decode-length calls to the decode kernel
// and longer ones to a chunked prefill kernel, passes over flash_fwd_wgmma for pages of a size it
// cannot box, and never gives a dense call to a kvcache build; a file without a kvcache kernel
// refuses a kvcache call saying so. Host code only: no GPU (calls that would launch are checked
// only where no driver answers).
#include <fstream>
#include <future>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/common/run_attntune.hpp"
#include "tests/unit/db/db_test_util.hpp"
#include "tests/unit/export/export_db.hpp"
#include "tests/unit/export/nvcc_util.hpp"

namespace test_export_kvcache_prefill {
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

const std::string kDecode = "b=16,h=32,hkv=8,s=1,sk=8192,d=128,dtype=bf16,causal=1,page=16";       // flash_decode
const std::string kChunk = "b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=bf16,causal=1,page=64";     // wgmma
const std::string kChunkOdd = "b=8,h=32,hkv=8,s=512,sk=8192,d=128,dtype=bf16,causal=1,page=12";    // mma
const std::string kDense = "b=4,h=32,hkv=8,s=4096,d=128,dtype=bf16,causal=1";                      // mma

struct Fixture {
  TempDir dir;
  std::string db = dir.file("kvcache.db");
  Fixture() {
    ExportDb d{db, source_dir()};
    d.campaign("flash_decode", "decode", kDecode, {d.config("flash_decode", kDecode, {{"block_n", 64}})}, {120.0});
    d.campaign("flash_fwd_wgmma", "chunk", kChunk, {d.config("flash_fwd_wgmma", kChunk, {{"warp_specialize", 1}})},
               {2900.0});
    d.campaign("flash_fwd_mma", "chunk-odd", kChunkOdd, {d.config("flash_fwd_mma", kChunkOdd, {})}, {800.0});
    d.campaign("flash_fwd_mma", "dense", kDense, {d.config("flash_fwd_mma", kDense, {})}, {1500.0});
  }
  // `attntune export` of this database with `how` (--all-best ..., --campaign NAME) into `name`.
  std::string export_to(const std::string& how, const std::string& name) {
    const std::string out = dir.file(name);
    const auto r = run_attntune("export --db " + shq(db) + " " + how + " -o " + shq(out));
    EXPECT_EQ(r.rc, 0) << r.err;
    return out;
  }
};

// Each kernel's index in kernel_info's "kernels", by the problem it was tuned for.
struct Indices {
  int decode = -1, chunk = -1, chunk_odd = -1, dense = -1;
};

Indices indices_of(const nlohmann::json& info) {
  Indices x;
  for (std::size_t i = 0; i < info["kernels"].size(); ++i) {
    const auto& problem = info["kernels"][i]["problem"];
    const int page = problem.contains("page") ? problem["page"].get<int>() : 0;
    const int at = static_cast<int>(i);
    if (page == 16) x.decode = at;
    else if (page == 64) x.chunk = at;
    else if (page == 12) x.chunk_odd = at;
    else x.dense = at;
  }
  return x;
}

std::set<std::string> set_of(const nlohmann::json& a) {
  std::set<std::string> s;
  for (const auto& x : a) s.insert(x.get<std::string>());
  return s;
}

// Choices and calls against an exported library: attntune_select_kernel_entry for the kvcache (2)
// and dense (1) entry points, and kvcache calls on fake (never dereferenced) device pointers, with
// a page table of PAGE rows (0: a contiguous cache), printing "NAME rc last_error".
const char* kProgram = R"(#include <cstdio>
extern "C" int attntune_select_kernel_entry(int, int, int, int, int, int, int, int);
extern "C" int attntune_attention_forward_kvcache(const void*, const void*, const void*, void*, float*, const int*,
    const int*, int, int, int, int, int, int, int, int, const long long*, const long long*, const long long*,
    const long long*, float, int, void*);
extern "C" const char* attntune_last_error(void);
alignas(16) static char fake[64];
static void kv(const char* name, int page, int max_blocks, int batch, int seqlen_q, int seqlen_k, int head_dim) {
  const long long h = 32, hkv = 8, d = head_dim;
  const long long qs[3] = {h * seqlen_q * d, seqlen_q * d, d};
  const long long paged[3] = {page * hkv * d, d, hkv * d}, contiguous[3] = {hkv * seqlen_k * d, seqlen_k * d, d};
  const long long* ks = page > 0 ? paged : contiguous;
  const int* table = page > 0 ? reinterpret_cast<const int*>(fake) : nullptr;
  const int rc = attntune_attention_forward_kvcache(fake, fake, fake, fake, nullptr, reinterpret_cast<const int*>(fake),
                                                    table, max_blocks, page, batch, 32, 8, seqlen_q, seqlen_k,
                                                    head_dim, qs, ks, ks, qs, 0.088f, 1, nullptr);
  std::printf("%s %d %s\n", name, rc, rc ? attntune_last_error() : "");
}
int main() {
  for (int q = 1; q <= 16; ++q) std::printf("kv_q%d %d\n", q, attntune_select_kernel_entry(2, 128, 1, 16, 32, 8, q, 8192));
  std::printf("kv_q17 %d\n", attntune_select_kernel_entry(2, 128, 1, 8, 32, 8, 17, 8192));
  std::printf("kv_q100 %d\n", attntune_select_kernel_entry(2, 128, 1, 4, 32, 8, 100, 10240));
  std::printf("kv_q1500 %d\n", attntune_select_kernel_entry(2, 128, 1, 4, 32, 8, 1500, 10240));
  std::printf("kv_q2048 %d\n", attntune_select_kernel_entry(2, 128, 1, 4, 32, 8, 2048, 10240));
  std::printf("kv_noncausal %d\n", attntune_select_kernel_entry(2, 128, 0, 4, 32, 8, 2048, 10240));
  std::printf("dense_q1 %d\n", attntune_select_kernel_entry(1, 128, 1, 16, 32, 8, 1, 8192));
  const int dense_q[] = {17, 100, 512, 2048, 4096};
  const int dense_k[] = {8192, 10240, 8192, 10240, 4096};
  for (int i = 0; i < 5; ++i)
    std::printf("dense_q%d %d\n", dense_q[i], attntune_select_kernel_entry(1, 128, 1, 4, 32, 8, dense_q[i], dense_k[i]));
  kv("call_paged64", 64, 160, 4, 2048, 10240, 128);
  kv("call_paged12", 12, 854, 4, 2048, 10240, 128);
  kv("call_contiguous", 0, 0, 4, 2048, 10240, 128);
  kv("call_decode", 16, 512, 16, 1, 8192, 128);
  kv("call_few_pages", 12, 100, 4, 2048, 10240, 128);
  kv("call_d64", 64, 160, 4, 2048, 10240, 64);
}
)";

// Builds `cu` for sm_90a with the contract's line into lib<name>.so: the build's outcome.
Shell build_library(const std::string& nvcc, TempDir& dir, const std::string& cu, const std::string& name) {
  return sh(attntune::test::nvcc_shared_command(nvcc, "sm_90a", cu, dir.file("lib" + name + ".so")));
}

// Runs kProgram against lib<name>.so: its output.
std::string run_program(TempDir& dir, const std::string& name) {
  const std::string src = dir.file(name + ".cpp"), exe = dir.file(name);
  std::ofstream(src) << kProgram;
  const Shell built = sh(attntune::test::host_link_command(src, dir.path().string(), name, exe));
  EXPECT_EQ(built.status, 0) << built.output;
  const Shell out = sh(shq(exe));
  EXPECT_EQ(out.status, 0) << out.output;
  return out.output;
}

// The line of `out` that starts with "NAME ", without the name; "" if none.
std::string line_of(const std::string& out, const std::string& name) {
  const std::string key = name + " ";
  for (std::size_t at = 0; at < out.size();) {
    const std::size_t end = std::min(out.find('\n', at), out.size());
    if (out.compare(at, key.size(), key) == 0) return out.substr(at + key.size(), end - at - key.size());
    at = end + 1;
  }
  return "";
}

bool has_driver() { return std::system("nvidia-smi > /dev/null 2>&1") == 0; }

}  // namespace

TEST(ExportKvcachePrefill, AllBestListsChunkedPrefillUnderTheKvcacheEntryOnly) {
  Fixture f;
  const std::string all = f.export_to("--all-best --dtype bf16", "all.cu");
  const std::string cu = read_bytes(all);
  const nlohmann::json info = info_from_source(cu);
  ASSERT_EQ(info["kernels"].size(), 4u) << info["kernels"].dump();
  const Indices x = indices_of(info);
  ASSERT_GE(x.decode, 0);
  ASSERT_GE(x.chunk, 0);
  ASSERT_GE(x.chunk_odd, 0);
  ASSERT_GE(x.dense, 0);
  EXPECT_EQ(info["kernels"][x.decode]["template"], "flash_decode");
  EXPECT_EQ(info["kernels"][x.chunk]["template"], "flash_fwd_wgmma");
  EXPECT_EQ(info["kernels"][x.chunk_odd]["template"], "flash_fwd_mma");
  EXPECT_EQ(info["kernels"][x.dense]["template"], "flash_fwd_mma");

  const auto& entries = info["entry_points"];
  ASSERT_TRUE(entries.contains("attntune_attention_forward_kvcache")) << entries.dump();
  ASSERT_TRUE(entries.contains("attntune_attention_forward")) << entries.dump();
  EXPECT_FALSE(entries.contains("attntune_attention_forward_varlen")) << entries.dump();
  // The chunked problems and the decode one under kvcache; the dense one only under the dense entry
  // point (with the decode one: flash_decode builds serve both).
  EXPECT_EQ(set_of(entries["attntune_attention_forward_kvcache"]),
            (std::set<std::string>{Problem::parse(kDecode).str(), Problem::parse(kChunk).str(),
                                   Problem::parse(kChunkOdd).str()}))
      << entries.dump();
  EXPECT_EQ(set_of(entries["attntune_attention_forward"]),
            (std::set<std::string>{Problem::parse(kDecode).str(), Problem::parse(kDense).str()}))
      << entries.dump();

  // The dispatcher's table says the same per kernel: entries 2 (kvcache) for the chunked builds,
  // 1 for the dense one, 3 for flash_decode.
  EXPECT_NE(cu.find(", 128, 1, 1, 4, 32, 8, 2048, 10240, 2, 0, 0, 0, 0, 0, 0, 0,\n"), std::string::npos);
  EXPECT_NE(cu.find(", 128, 1, 1, 8, 32, 8, 512, 8192, 2, 0, 0, 0, 0, 0, 0, 0,\n"), std::string::npos);
  EXPECT_NE(cu.find(", 128, 1, 1, 4, 32, 8, 4096, 4096, 1, 0, 0, 0, 0, 0, 0, 0,\n"), std::string::npos);
  EXPECT_NE(cu.find(", 128, 1, 1, 16, 32, 8, 1, 8192, 3, 0, 0, 0, 0, 0, 0, 0,\n"), std::string::npos);
  // The chunked builds are the kvcache ones: their constants carry ATT_KVCACHE, the dense one's not.
  EXPECT_NE(cu.find("&attntune_plan::kFlashFwdWgmma, kDefines_k"), std::string::npos);
  std::size_t count = 0;
  for (std::size_t at = cu.find("{\"ATT_KVCACHE\", 1LL}"); at != std::string::npos;
       at = cu.find("{\"ATT_KVCACHE\", 1LL}", at + 1))
    ++count;
  EXPECT_EQ(count, 2u);  // the two chunked builds; flash_decode's and the dense one have none
}

TEST(ExportKvcachePrefillNvcc, TheDispatcherSplitsKvcacheCallsByQueryRows) {
  const std::string nvcc = attntune::test::find_nvcc();
  if (nvcc.empty()) GTEST_SKIP() << "nvcc not found ($CUDACXX, $CUDA_HOME, PATH, /usr/local/cuda/bin): not checked";
  Fixture f;
  const std::string all = f.export_to("--all-best --dtype bf16", "all.cu");
  const Indices x = indices_of(info_from_source(read_bytes(all)));
  ASSERT_GE(x.decode, 0);
  ASSERT_GE(x.chunk, 0);
  ASSERT_GE(x.chunk_odd, 0);
  ASSERT_GE(x.dense, 0);
  const Shell b = build_library(nvcc, f.dir, all, "all");
  ASSERT_EQ(b.status, 0) << b.output;
  const std::string out = run_program(f.dir, "all");
  const auto idx = [](int i) { return std::to_string(i); };

  // Decode-length calls of the kvcache entry point: the decode kernel.
  for (int q = 1; q <= 16; ++q) EXPECT_EQ(line_of(out, "kv_q" + std::to_string(q)), idx(x.decode)) << q << "\n" << out;
  // Longer ones: a chunked prefill kernel, the one tuned nearest (flash_decode refuses them).
  EXPECT_EQ(line_of(out, "kv_q17"), idx(x.chunk_odd)) << out;
  EXPECT_EQ(line_of(out, "kv_q100"), idx(x.chunk_odd)) << out;
  EXPECT_EQ(line_of(out, "kv_q1500"), idx(x.chunk)) << out;
  EXPECT_EQ(line_of(out, "kv_q2048"), idx(x.chunk)) << out;
  EXPECT_EQ(line_of(out, "kv_noncausal"), "-1") << out;  // every kernel here is causal
  // The dense entry point: the dense kernel, never a kvcache build (one row: flash_decode, which
  // serves dense calls too).
  EXPECT_EQ(line_of(out, "dense_q1"), idx(x.decode)) << out;
  for (const char* q : {"dense_q17", "dense_q100", "dense_q512", "dense_q2048", "dense_q4096"})
    EXPECT_EQ(line_of(out, q), idx(x.dense)) << q << "\n" << out;

  // Calls: too few pages and a head_dim no kernel has are refused before any CUDA call.
  EXPECT_NE(line_of(out, "call_few_pages").find("1000 max_blocks_per_seq (100)"), std::string::npos) << out;
  EXPECT_NE(line_of(out, "call_d64").find("1000 no kernel in this file for head_dim=64"), std::string::npos) << out;
  if (!has_driver()) {
    // Past every check and the choice to a kernel whose plan accepts the call, which then finds no
    // driver here: pages of 64 (flash_fwd_wgmma), of 12 (flash_fwd_wgmma refuses them: the mma
    // kernel), a contiguous cache, one decode row.
    for (const char* call : {"call_paged64", "call_paged12", "call_contiguous", "call_decode"}) {
      const std::string line = line_of(out, call);
      EXPECT_FALSE(line.empty()) << call << "\n" << out;
      EXPECT_NE(line.rfind("0 ", 0), 0u) << call << ": " << line;      // not done without a GPU
      EXPECT_NE(line.rfind("1000", 0), 0u) << call << ": " << line;  // not refused
    }
  }
}

// Files of one kernel: the dense prefill kernel alone has nothing for the kvcache entry point; the
// flash_fwd_wgmma chunked kernel alone refuses pages that are not whole swizzle atoms, and dense calls.
TEST(ExportKvcachePrefillNvcc, SingleKernelFilesRefuseWhatTheirKernelCannotServe) {
  const std::string nvcc = attntune::test::find_nvcc();
  if (nvcc.empty()) GTEST_SKIP() << "nvcc not found ($CUDACXX, $CUDA_HOME, PATH, /usr/local/cuda/bin): not checked";
  Fixture f;
  const std::string dense = f.export_to("--campaign dense", "dense.cu");
  const std::string chunk = f.export_to("--campaign chunk", "chunk.cu");
  {
    const nlohmann::json info = info_from_source(read_bytes(dense));
    EXPECT_FALSE(info["entry_points"].contains("attntune_attention_forward_kvcache")) << info["entry_points"].dump();
    const nlohmann::json one = info_from_source(read_bytes(chunk));
    EXPECT_FALSE(one["entry_points"].contains("attntune_attention_forward")) << one["entry_points"].dump();
    EXPECT_EQ(one["entry_points"]["attntune_attention_forward_kvcache"],
              nlohmann::json::array({Problem::parse(kChunk).str()}));
  }
  std::vector<std::future<Shell>> jobs;
  jobs.push_back(std::async(std::launch::async, build_library, nvcc, std::ref(f.dir), dense, "dense"));
  jobs.push_back(std::async(std::launch::async, build_library, nvcc, std::ref(f.dir), chunk, "chunk"));
  const Shell bd = jobs[0].get(), bc = jobs[1].get();
  ASSERT_EQ(bd.status, 0) << bd.output;
  ASSERT_EQ(bc.status, 0) << bc.output;

  const std::string d = run_program(f.dir, "dense");
  EXPECT_EQ(line_of(d, "kv_q2048"), "-1") << d;
  EXPECT_EQ(line_of(d, "kv_q1"), "-1") << d;
  EXPECT_EQ(line_of(d, "dense_q4096"), "0") << d;
  for (const char* call : {"call_paged64", "call_contiguous", "call_decode"}) {
    const std::string line = line_of(d, call);
    EXPECT_NE(line.find("1000 no kernel in this file for head_dim=128 is_causal=1 serves "
                        "attntune_attention_forward_kvcache; it holds: d=128 bf16 causal=1, tuned for "
                        "b=4,h=32,hkv=8,s=4096,sk=4096 (flash_fwd_mma)"),
              std::string::npos)
        << call << ": " << line;
  }

  const std::string c = run_program(f.dir, "chunk");
  EXPECT_EQ(line_of(c, "kv_q2048"), "0") << c;
  EXPECT_EQ(line_of(c, "kv_q1"), "0") << c;  // the only kvcache kernel, and its plan takes one row
  EXPECT_EQ(line_of(c, "dense_q4096"), "-1") << c;
  EXPECT_EQ(line_of(c, "dense_q2048"), "-1") << c;
  const std::string odd = line_of(c, "call_paged12");
  EXPECT_EQ(odd.rfind("1000 kernel d=128 bf16 causal=1, tuned for b=4,h=32,hkv=8,s=2048,sk=10240", 0), 0u) << odd;
  EXPECT_NE(odd.find("page_size 12 is not a multiple of 8"), std::string::npos) << odd;
  if (!has_driver()) {
    for (const char* call : {"call_paged64", "call_contiguous"}) {
      const std::string line = line_of(c, call);
      EXPECT_FALSE(line.empty()) << call << "\n" << c;
      EXPECT_NE(line.rfind("0 ", 0), 0u) << call << ": " << line;
      EXPECT_NE(line.rfind("1000", 0), 0u) << call << ": " << line;
    }
  }
}
}  // namespace test_export_kvcache_prefill
