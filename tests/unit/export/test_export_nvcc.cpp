// Exported files compile with nvcc (CI has the toolkit but no GPU; a missing nvcc fails the test):
// as a shared library with docs/CONTRACT.md's command line, for sm_89 and sm_90, exporting the three
// C entry points unmangled; and the launcher's argument checks, run on the host with no GPU.
// nvcc takes tens of seconds per kernel and arch, so this is one test case with few compiles, run
// side by side: it runs in parallel with the rest of the suite under ctest -j.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <future>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "db/store.hpp"
#include "tests/common/run_attntune.hpp"
#include "tests/unit/db/db_test_util.hpp"
#include "tests/unit/export/nvcc_util.hpp"

namespace test_export_nvcc {
using namespace attntune;
using attntune::test::find_nvcc;
using attntune::test::read_bytes;
using attntune::test::sh;
using attntune::test::Shell;
using attntune::test::shq;
using attntune::test::TempDir;
using attntune::testing::run_attntune;

namespace {

using attntune::testing::source_dir;

// The C symbols a library defines and exports, from `nm -D --defined-only`.
void expect_c_symbols(const std::string& lib) {
  const Shell nm = sh("nm -D --defined-only " + shq(lib));
  ASSERT_EQ(nm.status, 0) << nm.output;
  for (const char* sym : {"attntune_attention_forward", "attntune_kernel_info", "attntune_last_error",
                          "attntune_select_kernel"})
    EXPECT_TRUE(std::regex_search(nm.output, std::regex(std::string(" T ") + sym + "\n"))) << sym << "\n" << nm.output;
}

TEST(ExportNvcc, CompilesAsSharedLibraryWithCSymbolsAndChecksArguments) {
  const std::string nvcc = find_nvcc();
  ASSERT_FALSE(nvcc.empty()) << "nvcc not found ($CUDACXX, $CUDA_HOME, PATH, /usr/local/cuda/bin): CI has the toolkit";
  const std::string db = source_dir() + "/tests/data/campaigns/h100-suite.db";
  ASSERT_TRUE(std::filesystem::exists(db)) << db << " is missing";
  TempDir dir;

  // The recorded suite's first campaign with results, and its all-best over bf16.
  Store store = Store::open(db, Store::Mode::kReadOnly);
  std::optional<CampaignRow> first;
  for (const CampaignRow& c : store.campaigns())
    if (c.ok > 0 && !first) first = c;
  ASSERT_TRUE(first) << "no campaign with results in " << db;
  const std::string one = dir.file("one.cu"), all = dir.file("all.cu");
  auto r = run_attntune("export --db " + shq(db) + " --campaign " + shq(first->spec.name) + " -o " + shq(one));
  ASSERT_EQ(r.rc, 0) << r.err;
  r = run_attntune("export --db " + shq(db) + " --all-best --dtype bf16 -o " + shq(all));
  ASSERT_EQ(r.rc, 0) << r.err;

  // 1: docs/CONTRACT.md's command line, sm_90. 2: --all-best for sm_89 and sm_90 in one call.
  // 3: the single export for sm_89 linked with the host-side checks (cudart static, nvcc's default).
  const std::string lib1 = dir.file("libattn.so"), lib2 = dir.file("liball.so"), checks = dir.file("checks");
  const std::string flags = " -std=c++17 -Xcompiler -fPIC -shared ";
  std::vector<std::future<Shell>> jobs;
  jobs.push_back(std::async(std::launch::async, sh,
                            shq(nvcc) + " -std=c++17 -arch=sm_90 -Xcompiler -fPIC -shared " + shq(one) + " -o " +
                                shq(lib1)));
  jobs.push_back(std::async(std::launch::async, sh,
                            shq(nvcc) + flags + "-gencode arch=compute_89,code=sm_89 "
                                               "-gencode arch=compute_90,code=sm_90 " +
                                shq(all) + " -o " + shq(lib2)));
  jobs.push_back(std::async(std::launch::async, sh,
                            shq(nvcc) + " -std=c++17 -arch=sm_89 " + shq(one) + " " +
                                shq(source_dir() + "/tests/data/export/launcher_checks.cpp") + " -o " +
                                shq(checks)));
  const Shell c1 = jobs[0].get(), c2 = jobs[1].get(), c3 = jobs[2].get();
  ASSERT_EQ(c1.status, 0) << c1.output;
  expect_c_symbols(lib1);
  ASSERT_EQ(c2.status, 0) << c2.output;
  expect_c_symbols(lib2);
  ASSERT_EQ(c3.status, 0) << c3.output;

  const Shell run = sh(shq(checks) + " " + std::to_string(first->spec.problem.d) + " " +
                       std::to_string(first->spec.problem.causal ? 1 : 0));
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("checks: 0 failed"), std::string::npos) << run.output;
  const std::size_t at = run.output.find("info: ");
  ASSERT_NE(at, std::string::npos) << run.output;
  const nlohmann::json info = nlohmann::json::parse(run.output.substr(at + 6, run.output.find('\n', at) - at - 6));
  EXPECT_EQ(info["campaign"], first->spec.name);
  EXPECT_EQ(info["kernels"].size(), 1u);
}

}  // namespace
}  // namespace test_export_nvcc
