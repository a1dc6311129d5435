// `attntune export` of flash_fwd_wgmma results (sm_90a, TMA): the file's launch (tensor maps,
// persistent grid, the arch-specific build line), byte-determinism, the cases export refuses, and
// (ExportWgmmaNvcc) the file compiled by nvcc with docs/CONTRACT.md's command line for sm_90a, its
// launcher's argument checks run on the host with no GPU. The GPU side:
// tests/gpu/test_export_wgmma.cpp.
#include <cstdlib>
#include <filesystem>
#include <future>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "export/export.hpp"
#include "export/select.hpp"
#include "families/family.hpp"
#include "tests/common/plan_call.hpp"
#include "tests/common/run_attntune.hpp"
#include "tests/unit/db/db_test_util.hpp"
#include "tests/unit/export/export_db.hpp"
#include "tests/unit/export/nvcc_util.hpp"

namespace test_export_wgmma {
using namespace attntune;
using attntune::test::ExportDb;
using attntune::test::read_bytes;
using attntune::test::sh;
using attntune::test::Shell;
using attntune::test::shq;
using attntune::test::TempDir;
using attntune::testing::run_attntune;
using attntune::test::info_from_source;
using attntune::testing::source_dir;

namespace {

const std::string kWg = "flash_fwd_wgmma";
const std::string kD128 = "b=4,h=16,s=4096,d=128,dtype=bf16,causal=0";
const std::string kD64Causal = "b=8,h=16,s=2048,d=64,dtype=bf16,causal=1";

std::size_t count(const std::string& text, const std::string& part) {
  std::size_t n = 0;
  for (std::size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

std::int64_t param(const Config& c, const char* name) { return std::get<std::int64_t>(c.at(name)); }

// A database with the two wgmma campaigns these tests export: d=128 non-causal (its best config
// persistent, its second not, its third persistent in 2-CTA clusters: kv_multicast) and d=64
// causal (per-tile).
struct Fixture {
  TempDir dir;
  std::string db = dir.file("wg.db");
  ExportDb d{db, source_dir()};
  Config persistent, per_tile, multicast, causal;
  Fixture() {
    const std::map<std::string, std::int64_t> pp = {{"block_m", 128},         {"block_n", 128}, {"stages", 2},
                                                    {"warp_specialize", 1},   {"ping_pong", 1}, {"intra_wg_overlap", 1},
                                                    {"persistent", 1},        {"kv_multicast", 0}};
    persistent = d.config(kWg, kD128, pp);
    auto clustered = pp;
    clustered["kv_multicast"] = 1;
    multicast = d.config(kWg, kD128, clustered);
    per_tile = d.config(kWg, kD128, {{"block_m", 64}, {"warp_specialize", 0}, {"persistent", 0}});
    causal = d.config(kWg, kD64Causal, {{"block_m", 192}, {"block_n", 128}, {"warp_specialize", 1},
                                        {"intra_wg_overlap", 1}, {"persistent", 0}});
    d.campaign(kWg, "wg-d128", kD128, {persistent, per_tile, multicast}, {900.5, 950.25, 960.0});
    d.campaign(kWg, "wg-d64-causal", kD64Causal, {causal}, {210.75});
  }
  std::vector<ExportItem> items(const std::string& campaign, int rank = 1) {
    ExportQuery q;
    q.campaign = campaign;
    q.rank = rank;
    return select_for_export(d.store(), q);
  }
};

// The launch a kernel's plan makes for a dense call of p on a 132-SM device.
attntune_plan::Launch launch_of(const RenderedKernel& k, const Problem& p) {
  const auto plan = plan_call(k.launch, attntune::testing::dense_call_of(p), attntune::testing::FakeDevice{}.device());
  EXPECT_TRUE(plan);
  return plan ? plan->launch[0] : attntune_plan::Launch{};
}

TEST(ExportWgmma, LaunchesThroughTensorMapsWithTheTunedGridAndBuildsForSm90a) {
  Fixture f;
  const auto items = f.items("wg-d128");
  const std::string cu = export_source(items, ExportMode::kSingle);
  const Problem p = Problem::parse(kD128);
  const RenderedKernel k = render_kernel(*f.d.space(kWg), f.persistent, p, "sm_90a");
  const attntune_plan::Launch g = launch_of(k, p);
  ASSERT_EQ(define_value(k.launch.defines, "PERSISTENT"), 1);

  // The build line and the header name sm_90a and the tensor maps; the launch is the persistent one.
  EXPECT_NE(cu.find("//   nvcc -std=c++17 -arch=sm_90a -Xcompiler -fPIC -shared FILE.cu -o libattn.so\n"),
            std::string::npos);
  EXPECT_EQ(cu.find("-arch=sm_90 "), std::string::npos);
  EXPECT_NE(cu.find("cuTensorMapEncodeTiled"), std::string::npos);
  EXPECT_NE(cu.find(fmt::format("//   launch        persistent grid: min(work tiles (ceil(seqlen_q / 128), heads_q, "
                                "batch), SMs) CTAs, {} threads, {} bytes of dynamic shared memory, TMA tensor maps "
                                "with boxes of 64 x 128 (q) and 64 x 128 (k, v)\n",
                                g.block, g.smem)),
            std::string::npos);

  // The kernel verbatim, in the device passes that can hold sm_90a code (and the host pass), with
  // the TMA signature declared where the launcher looks.
  // Every entry point: the main kernel, the varlen order kernel and the FP8 cache's conversion
  // kernel (both empty in a dense build).
  EXPECT_NE(cu.find("#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)\n"
                    "#define flash_fwd_wgmma attntune_k0_flash_fwd_wgmma\n"
                    "#define flash_fwd_wgmma_varlen_order attntune_k0_flash_fwd_wgmma_varlen_order\n"
                    "#define flash_fwd_wgmma_kv_dequant attntune_k0_flash_fwd_wgmma_kv_dequant\n" +
                    k.source +
                    "#undef flash_fwd_wgmma\n"
                    "extern \"C\" __global__ void attntune_k0_flash_fwd_wgmma(const AttnParams p, const "
                    "__grid_constant__ att::TmaMaps maps);\n"
                    "#undef flash_fwd_wgmma_varlen_order\n"
                    "extern \"C\" __global__ void attntune_k0_flash_fwd_wgmma_varlen_order(const AttnParams p, "
                    "int* order);\n"
                    "#undef flash_fwd_wgmma_kv_dequant\n"
                    "extern \"C\" __global__ void attntune_k0_flash_fwd_wgmma_kv_dequant(const AttnParams p, "
                    "unsigned char* ws);\n#endif\n}  // namespace attntune_k0\n"),
            std::string::npos);
  // The table row: sm_90a, bf16, the tuned problem, the family's launch plan with the constants the
  // kernel was built with, its entry point.
  EXPECT_NE(cu.find("\"sm_90a\", 128, 0, 1, 4, 16, 16, 4096, 4096, 1, 0, 0, 0, 0, 0, 0, 0,\n"
                    "     &attntune_plan::kFlashFwdWgmma, kDefines_k0, "
                    "static_cast<int>(sizeof kDefines_k0 / sizeof kDefines_k0[0]),\n"
                    "     {reinterpret_cast<const void*>(&attntune_k0::attntune_k0_flash_fwd_wgmma), "
                    "reinterpret_cast<const void*>(&attntune_k0::attntune_k0_flash_fwd_wgmma_varlen_order), "
                    "reinterpret_cast<const void*>(&attntune_k0::attntune_k0_flash_fwd_wgmma_kv_dequant)}},"),
            std::string::npos);
  EXPECT_NE(cu.find("static const attntune_plan::Define kDefines_k0[] = {\n    {\"ATT_HEAD_DIM\", 128LL},\n"),
            std::string::npos);
  EXPECT_NE(cu.find(fmt::format("    {{\"SMEM_BYTES\", {}LL}},\n", g.smem)), std::string::npos);
  // The launch plan and its executor, once each, at global scope after the kernels.
  EXPECT_EQ(count(cu, "// ---- templates/flash_fwd_wgmma/launch.h\n"), 1u);
  EXPECT_EQ(count(cu, "// ---- templates/export/run_plan.cuh\n"), 1u);
  EXPECT_EQ(count(cu, "// ---- templates/flash_fwd_mma/launch.h\n"), 0u);
  EXPECT_LT(cu.find("}  // namespace attntune_k0"), cu.find("// ---- templates/flash_fwd_wgmma/launch.h\n"));
  // Host code stays out of the device passes (there the kernel alone matters).
  EXPECT_NE(cu.find("#if !defined(__CUDA_ARCH__)\n\n#define ATTNTUNE_UNSUPPORTED 1000"), std::string::npos);

  // Includes: the CUDA toolkit's (cuda.h for CUtensorMap's types) and the C++ standard library's.
  std::smatch m;
  std::string rest = cu;
  while (std::regex_search(rest, m, std::regex("#include[^\n]*"))) {
    EXPECT_TRUE(std::regex_match(
        m.str(), std::regex("#include <(cuda_runtime\\.h|cuda\\.h|atomic|cmath|cstdarg|cstddef|cstdint|cstdio|cstring|mutex)>")))
        << m.str();
    rest = m.suffix();
  }

  const nlohmann::json info = info_from_source(cu);
  EXPECT_EQ(info["template"], kWg);
  EXPECT_EQ(info["arch"], "sm_90a");
  EXPECT_EQ(info["median_us"], 900.5);
  EXPECT_EQ(info["launch"]["persistent"], true);
  EXPECT_EQ(info["launch"]["threads"], g.block);
  EXPECT_EQ(info["launch"]["smem_bytes"], g.smem);
  EXPECT_EQ(info["launch"]["tma_box_rows"]["q"], 128);
  EXPECT_EQ(info["launch"]["tma_box_rows"]["kv"], 128);
  EXPECT_EQ(info["config"]["persistent"], true);
  EXPECT_FALSE(info["launch"].contains("cluster"));  // only where there are clusters: docs/CONTRACT.md's fields unchanged
  EXPECT_EQ(cu.find("CTAs in 2-CTA clusters"), std::string::npos);

  // --rank 2: the per-tile grid and its own boxes.
  const std::string second = export_source(f.items("wg-d128", 2), ExportMode::kSingle);
  const nlohmann::json info2 = info_from_source(second);
  EXPECT_EQ(info2["launch"]["persistent"], false);
  EXPECT_EQ(info2["launch"]["tma_box_rows"]["q"], param(f.per_tile, "block_m"));
  EXPECT_EQ(info2["launch"]["tma_box_rows"]["kv"], param(f.per_tile, "block_n"));
  EXPECT_NE(second.find(fmt::format("//   launch        grid (ceil(seqlen_q / {}), heads_q, batch)",
                                    param(f.per_tile, "block_m"))),
            std::string::npos);
}

// kv_multicast: the table's cluster column, the info's launch "cluster", the header's launch line;
// the launcher's grid arithmetic itself is checked compiled (ExportWgmmaNvcc).
TEST(ExportWgmma, KvMulticastLaunchesTwoCtaClusters) {
  Fixture f;
  const std::string cu = export_source(f.items("wg-d128", 3), ExportMode::kSingle);
  const Problem p = Problem::parse(kD128);
  const RenderedKernel k = render_kernel(*f.d.space(kWg), f.multicast, p, "sm_90a");
  ASSERT_EQ(launch_of(k, p).cluster, 2u);
  EXPECT_NE(cu.find("#define KV_MULTICAST 1\n"), std::string::npos);
  EXPECT_NE(cu.find("    {\"KV_MULTICAST\", 1LL},\n"), std::string::npos);  // the plan's constants
  EXPECT_NE(cu.find("//   launch        persistent grid: min(work tiles (ceil(seqlen_q / 128) rounded up to a "
                    "multiple of 2, heads_q, batch), SMs) CTAs in 2-CTA clusters sharing each K/V load (TMA "
                    "multicast), as many as fit on the device at once, "),
            std::string::npos);
  const nlohmann::json info = info_from_source(cu);
  EXPECT_EQ(info["config"]["kv_multicast"], true);
  EXPECT_EQ(info["launch"]["persistent"], true);
  EXPECT_EQ(info["launch"]["cluster"], 2);
}

// The same result exports to the same bytes: through the CLI twice, and through export_source.
TEST(ExportWgmma, ExportIsByteDeterministic) {
  Fixture f;
  const std::string a = f.dir.file("a.cu"), b = f.dir.file("b.cu"), all_a = f.dir.file("all_a.cu"),
                    all_b = f.dir.file("all_b.cu");
  for (const std::string& out : {a, b}) {
    const auto r = run_attntune("export --db " + shq(f.db) + " --campaign wg-d128 -o " + shq(out));
    ASSERT_EQ(r.rc, 0) << r.err;
  }
  for (const std::string& out : {all_a, all_b}) {
    const auto r = run_attntune("export --db " + shq(f.db) + " --all-best -o " + shq(out));
    ASSERT_EQ(r.rc, 0) << r.err;
  }
  EXPECT_FALSE(read_bytes(a).empty());
  EXPECT_EQ(read_bytes(a), read_bytes(b));
  EXPECT_EQ(read_bytes(all_a), read_bytes(all_b));
  EXPECT_EQ(read_bytes(a), export_source(f.items("wg-d128"), ExportMode::kSingle));
}

// --all-best over the two wgmma problems: one file, both kernels with their own launch, one copy of
// the TMA launch part.
TEST(ExportWgmma, AllBestHoldsEachProblemsKernelWithItsOwnLaunch) {
  Fixture f;
  ExportQuery q;
  q.all_best = true;
  const std::string cu = export_source(select_for_export(f.d.store(), q), ExportMode::kAllBest);
  EXPECT_EQ(count(cu, "// ---- templates/flash_fwd_wgmma/launch.h\n"), 1u);
  EXPECT_EQ(count(cu, "#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)\n"), 2u);
  EXPECT_EQ(count(cu, "     &attntune_plan::kFlashFwdWgmma, kDefines_k"), 2u);
  EXPECT_NE(cu.find("&attntune_k1::attntune_k1_flash_fwd_wgmma"), std::string::npos);
  const nlohmann::json info = info_from_source(cu);
  ASSERT_EQ(info["kernels"].size(), 2u);
  EXPECT_EQ(info["kernels"][0]["launch"]["persistent"], true);
  EXPECT_EQ(info["kernels"][1]["launch"]["persistent"], false);
  EXPECT_EQ(info["kernels"][1]["problem"]["causal"], true);
  EXPECT_EQ(info["kernels"][1]["launch"]["tma_box_rows"]["q"], 192);
}

// Results of one GPU filed under sm_90 (flash_fwd_mma) and sm_90a (wgmma) go in one file (built
// for sm_90a, the wgmma kernels under their device condition): a model's library holds both;
// --arch still picks one; a wgmma result whose template changed since it was measured is not
// exported.
TEST(ExportWgmma, OneGpusArchsShareAFileArchPicksOneAndChangedTemplatesAreRefused) {
  Fixture f;
  const std::string mma_problem = "b=2,h=8,s=512,d=128,dtype=bf16,causal=0";
  f.d.campaign("flash_fwd_mma", "mma-d128", mma_problem, {f.d.config("flash_fwd_mma", mma_problem, {})}, {40.0});
  const std::string out = f.dir.file("o.cu");
  auto r = run_attntune("export --db " + shq(f.db) + " --all-best -o " + shq(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  {
    const std::string both = read_bytes(out);
    const nlohmann::json all = info_from_source(both);
    ASSERT_EQ(all["kernels"].size(), 3u);
    std::set<std::string> templates;
    for (const auto& k : all["kernels"]) templates.insert(k["template"].get<std::string>());
    EXPECT_EQ(templates, (std::set<std::string>{"flash_fwd_mma", kWg}));
    EXPECT_NE(both.find("-arch=sm_90a"), std::string::npos) << "the header's build line";
  }
  r = run_attntune("export --db " + shq(f.db) + " --all-best --arch sm_90a -o " + shq(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  nlohmann::json info = info_from_source(read_bytes(out));
  ASSERT_EQ(info["kernels"].size(), 2u);
  for (const auto& k : info["kernels"]) EXPECT_EQ(k["template"], kWg);
  r = run_attntune("export --db " + shq(f.db) + " --all-best --arch sm_90 -o " + shq(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string mma = read_bytes(out);
  info = info_from_source(mma);
  ASSERT_EQ(info["kernels"].size(), 1u);
  EXPECT_EQ(info["kernels"][0]["template"], "flash_fwd_mma");
  EXPECT_EQ(mma.find("// ---- templates/flash_fwd_wgmma/launch.h\n"), std::string::npos);  // nor wgmma's launch plan
  EXPECT_EQ(mma.find("it needs CUDA 12.0 or newer\"\n#endif"), std::string::npos);  // nor its CUDA 12 floor
  EXPECT_EQ(mma.find("__CUDA_ARCH_FEAT_SM90_ALL"), std::string::npos);

  // A config no other campaign recorded (a candidate keeps the source it was first recorded with).
  const Config other = f.d.config(kWg, kD128, {{"block_m", 192}});
  f.d.campaign(kWg, "wg-stale", kD128, {other}, {990.0}, std::string(64, 'e'));
  r = run_attntune("export --db " + shq(f.db) + " --campaign wg-stale -o " + shq(out));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("kernel template has changed"), std::string::npos) << r.err;
}

// A campaign of both templates files its results under sm_90 (the device's arch) while it built
// flash_fwd_wgmma for sm_90a: its wgmma best exports from that template's own stored space,
// rendered for sm_90a (the source the tuner measured), with the sm_90a build line.
TEST(ExportWgmma, MixedTemplateCampaignExportsItsWgmmaBestForSm90a) {
  Fixture f;
  const Config mma = f.d.config("flash_fwd_mma", kD128, {});
  f.d.mixed_campaign("both", kD128, {{"flash_fwd_mma", mma}, {kWg, f.persistent}}, {1500.0, 905.0});
  const auto items = f.items("both");
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0].row.family, kWg);
  EXPECT_EQ(items[0].row.arch, "sm_90");
  EXPECT_EQ(items[0].space->family(), kWg);
  const std::string cu = export_source(items, ExportMode::kSingle);
  EXPECT_NE(cu.find(render_kernel(*f.d.space(kWg), f.persistent, Problem::parse(kD128), "sm_90a").source),
            std::string::npos);
  EXPECT_NE(cu.find("//   nvcc -std=c++17 -arch=sm_90a -Xcompiler"), std::string::npos);
  EXPECT_NE(cu.find("\"sm_90a\", 128, 0, 1,"), std::string::npos);  // the table's arch
  // --rank 2 is the campaign's flash_fwd_mma result, from its own space.
  const auto second = f.items("both", 2);
  EXPECT_EQ(second[0].row.family, "flash_fwd_mma");
  EXPECT_NE(export_source(second, ExportMode::kSingle).find("&attntune_plan::kFlashFwdMma, kDefines_k0"),
            std::string::npos);
}

// The symbols a library defines and exports, from `nm -D --defined-only`.
void expect_c_symbols(const std::string& lib) {
  const Shell nm = sh("nm -D --defined-only " + shq(lib));
  ASSERT_EQ(nm.status, 0) << nm.output;
  for (const char* sym : {"attntune_attention_forward", "attntune_kernel_info", "attntune_last_error",
                          "attntune_select_kernel"})
    EXPECT_TRUE(std::regex_search(nm.output, std::regex(std::string(" T ") + sym + "\n"))) << sym << "\n" << nm.output;
}

// A program linked with an exported library (host code only: cheap next to the kernels).
Shell link_checks(const std::string& nvcc, const std::string& source, const std::string& lib_dir,
                  const std::string& lib_name, const std::string& exe) {
  return sh(shq(nvcc) + " -std=c++17 " + shq(source) + " -L" + shq(lib_dir) + " -l" + lib_name + " -Xlinker -rpath," +
            shq(lib_dir) + " -o " + shq(exe));
}

// docs/CONTRACT.md's command line with -arch=sm_90a (nvcc 13 adds compute_90 PTX there, which cannot hold
// wgmma: the file must still compile, with the kernels in the sm_90a code), for one kernel and for
// an all-best of two; -arch=sm_90 fails at the link; then the shared and the TMA argument checks,
// run with no GPU; and a kv_multicast export compiled into the checks of its clustered grid.
TEST(ExportWgmmaNvcc, CompilesForSm90aWithCSymbolsAndChecksArguments) {
  const std::string nvcc = attntune::test::find_nvcc();
  ASSERT_FALSE(nvcc.empty()) << "nvcc not found ($CUDACXX, $CUDA_HOME, PATH, /usr/local/cuda/bin): CI has the toolkit";
  Fixture f;
  const std::string one = f.dir.file("one.cu"), all = f.dir.file("all.cu"), multicast = f.dir.file("multicast.cu");
  auto r = run_attntune("export --db " + shq(f.db) + " --campaign wg-d128 -o " + shq(one));
  ASSERT_EQ(r.rc, 0) << r.err;
  r = run_attntune("export --db " + shq(f.db) + " --campaign wg-d128 --rank 3 -o " + shq(multicast));
  ASSERT_EQ(r.rc, 0) << r.err;
  r = run_attntune("export --db " + shq(f.db) + " --all-best -o " + shq(all));
  ASSERT_EQ(r.rc, 0) << r.err;

  const std::string libdir = f.dir.path().string();
  std::vector<std::future<Shell>> jobs;
  jobs.push_back(std::async(std::launch::async, sh,
                            attntune::test::nvcc_shared_command(nvcc, "sm_90a", one, f.dir.file("libone.so"))));
  jobs.push_back(std::async(std::launch::async, sh,
                            attntune::test::nvcc_shared_command(nvcc, "sm_90a", all, f.dir.file("liball.so"))));
  // Plain sm_90 has no wgmma: no device pass holds the kernel, and the link says so (cheap: no
  // kernel is compiled).
  jobs.push_back(std::async(std::launch::async, sh,
                            attntune::test::nvcc_shared_command(nvcc, "sm_90", one, f.dir.file("lib90.so"))));
  // The kv_multicast export, its launcher's static functions called by the checks it is included in.
  const std::string cluster_checks = f.dir.file("cluster_checks");
  jobs.push_back(std::async(std::launch::async, sh,
                            shq(nvcc) + " -std=c++17 -arch=sm_90a -include " + shq(multicast) + " " +
                                shq(source_dir() + "/tests/unit/export/cluster_grid_checks.cu") + " -o " +
                                shq(cluster_checks)));
  const Shell c1 = jobs[0].get(), c2 = jobs[1].get(), c3 = jobs[2].get(), c4 = jobs[3].get();
  ASSERT_EQ(c4.status, 0) << c4.output;
  const Shell clusters = sh(shq(cluster_checks));
  EXPECT_EQ(clusters.status, 0) << clusters.output;
  EXPECT_NE(clusters.output.find("checks: 0 failed"), std::string::npos) << clusters.output;
  ASSERT_EQ(c1.status, 0) << c1.output;
  ASSERT_EQ(c2.status, 0) << c2.output;
  expect_c_symbols(f.dir.file("libone.so"));
  expect_c_symbols(f.dir.file("liball.so"));
  EXPECT_NE(c3.status, 0) << c3.output;
  EXPECT_NE(c3.output.find("attntune_k0_flash_fwd_wgmma"), std::string::npos) << c3.output;
  // The sm_90a code holds each kernel (its cubin's sections are named after it; nvcc does not
  // compress the fatbinary unless asked): the #if around the kernels lets the sm_90a pass in.
  EXPECT_NE(read_bytes(f.dir.file("libone.so")).find(".text.attntune_k0_flash_fwd_wgmma"), std::string::npos);
  const std::string all_lib = read_bytes(f.dir.file("liball.so"));
  EXPECT_NE(all_lib.find(".text.attntune_k0_flash_fwd_wgmma"), std::string::npos);
  EXPECT_NE(all_lib.find(".text.attntune_k1_flash_fwd_wgmma"), std::string::npos);

  struct Run {
    const char* lib;
    const char* source;
    const char* args;
  };
  const Run runs[] = {
      {"one", "/tests/data/export/launcher_checks.cpp", "128 0"},
      {"one", "/tests/unit/export/tma_launcher_checks.cu", "128 0"},
      {"all", "/tests/data/export/launcher_checks.cpp", "128 0"},  // kernel 0 of the all-best
      {"all", "/tests/unit/export/tma_launcher_checks.cu", "64 1"},
  };
  int i = 0;
  for (const Run& run : runs) {
    const std::string exe = f.dir.file("checks" + std::to_string(i++));
    const Shell built = link_checks(nvcc, source_dir() + run.source, libdir, run.lib, exe);
    ASSERT_EQ(built.status, 0) << built.output;
    const Shell out = sh(shq(exe) + " " + run.args);
    EXPECT_EQ(out.status, 0) << run.source << " with lib" << run.lib << ":\n" << out.output;
    EXPECT_NE(out.output.find("checks: 0 failed"), std::string::npos) << out.output;
  }
}

}  // namespace
}  // namespace test_export_wgmma

namespace attntune {
namespace test_export_wgmma {
using namespace ::test_export_wgmma;
namespace {

// export --all-best --plan: one library for a model holds the plan's tuned problems only, and says
// which of the plan's problems have no result yet.
TEST(ExportWgmma, AllBestOverAPlanHoldsThePlansProblemsAndNamesTheMissing) {
  Fixture f;
  const std::string plan = f.dir.file("model.yaml");
  test::write_bytes(plan, "model: test\nproblems:\n  - {problem: \"" + kD128 +
                        "\", regime: prefill}\n  - {problem: \"b=1,h=16,s=8192,d=128,dtype=bf16,causal=1\", regime: "
                        "prefill}\n");
  const std::string out = f.dir.file("model.cu");
  auto r = run_attntune("export --db " + shq(f.db) + " --all-best --plan " + shq(plan) + " -o " + shq(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json info = info_from_source(read_bytes(out));
  ASSERT_EQ(info["kernels"].size(), 1u) << "the d=64 campaign is not in the plan";
  EXPECT_EQ(info["kernels"][0]["problem"]["s"], 4096);
  EXPECT_EQ(info["kernels"][0]["problem"]["d"], 128);
  EXPECT_NE(r.err.find("1 of the plan's 2 problems have no result yet"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("s=8192"), std::string::npos) << r.err;
  r = run_attntune("export --db " + shq(f.db) + " --campaign wg-d128 --plan " + shq(plan) + " -o " + shq(out));
  EXPECT_EQ(r.rc, 2) << r.err;
}

}  // namespace
}  // namespace test_export_wgmma
}  // namespace attntune
