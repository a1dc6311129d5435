// `export --all-best --plan` for a model whose attention has variants: the plan `attntune plan`
// writes for gpt-oss-20b (prefill and decode of its full and its windowed layers, all with sinks).
// The plan's problems match campaigns by their variants too (a windowed problem never takes a
// full-attention result of its shape, nor the reverse, nor a result without the model's sinks);
// each exported kernel carries its variants; the plan's problems without a result are named with
// theirs. No GPU: the campaigns are recorded through the Store as tune records them
// (export_db.hpp), with the shipped spaces made to serve the variants where they do not list them
// yet. ExportPlanVariantsNvcc compiles the library and asks its dispatcher, on the host, which
// kernel each of the model's calls runs (attntune_select_kernel_ex).
#include <filesystem>
#include <future>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "service/plan.hpp"
#include "tests/common/run_attntune.hpp"
#include "tests/unit/db/db_test_util.hpp"
#include "tests/unit/export/export_db.hpp"
#include "tests/unit/export/nvcc_util.hpp"

namespace test_export_plan_variants {
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

// A shipped space's text, serving windows, soft-caps and sinks where its problem section does
// not list them (the families list them as their kernels learn them; this test is about the plan
// and the export, not the kernels).
std::string serving_variants(const std::string& family, std::string text) {
  const std::string head = "\nproblem:\n";
  const std::size_t at = text.find(head);
  if (at == std::string::npos) throw std::runtime_error(family + ".yaml has no problem section");
  const std::size_t start = at + head.size();
  std::size_t end = start;  // the section: the indented lines after it
  while (end < text.size() && text[end] == ' ') {
    const std::size_t nl = text.find('\n', end);
    end = nl == std::string::npos ? text.size() : nl + 1;
  }
  const std::string section = "\n" + text.substr(start, end - start);
  std::string add;
  for (const std::string key : {"window", "softcap", "sinks"})
    if (section.find("\n  " + key + ":") == std::string::npos) add += "  " + key + ": [false, true]\n";
  text.insert(start, add);
  return text;
}

const std::string kPrefill = "b=1,h=64,hkv=8,s=512,sk=512,d=64,dtype=bf16,causal=1";
const std::string kDecode = "b=1,h=64,hkv=8,s=1,sk=2048,d=64,dtype=bf16,causal=1,page=16";
const std::string kMma = "flash_fwd_mma", kFlashDecode = "flash_decode";

// A database of gpt-oss-20b results (three of the plan's four problems; the decode of the
// windowed layers is not tuned yet) and of shapes like them without the model's variants, which
// are faster and must never be taken for it; and the plan, as `attntune plan` writes it.
struct Fixture {
  TempDir dir;
  std::string db = dir.file("oss.db");
  std::string plan = dir.file("oss.yaml");
  ExportDb d{db, source_dir()};
  std::string plan_error;  // `attntune plan`'s stderr when it failed
  Fixture() {
    d.edit_spaces(serving_variants);
    auto first = [&](const std::string& family, const std::string& problem) {
      return d.config_if(family, problem, [](const Config&) { return true; });
    };
    auto campaign = [&](const std::string& family, const std::string& name, const std::string& problem, double us) {
      d.campaign(family, name, problem, {first(family, problem)}, {us});
    };
    campaign(kMma, "oss-full", kPrefill + ",sinks=1", 50.0);
    campaign(kMma, "oss-window", kPrefill + ",window=127,sinks=1", 40.0);
    campaign(kFlashDecode, "oss-decode-full", kDecode + ",sinks=1", 20.0);
    campaign(kMma, "plain", kPrefill, 30.0);                                    // another model's: no sinks
    campaign(kFlashDecode, "window-no-sinks", kDecode + ",window=127", 10.0);  // the window, but no sinks
    campaign(kFlashDecode, "window-softcap", kDecode + ",window=127,softcap=30,sinks=1", 9.0);  // and a cap
    const auto r = run_attntune("plan --model " + shq(source_dir() + "/tests/data/models/gpt_oss_20b.json") +
                                " --batch 1 --seqlen 512 --decode-batch 1 --context 2048 -o " + shq(plan));
    if (r.rc != 0) plan_error = r.err.empty() ? "plan failed" : r.err;
  }
};

}  // namespace

TEST(ExportPlanVariants, AllBestOverAGptOssPlanTakesEachLayerKindsOwnResults) {
  Fixture f;
  ASSERT_EQ(f.plan_error, "");
  std::vector<std::string> planned;
  for (const PlanEntry& e : Plan::load(f.plan).entries) planned.push_back(e.problem.str() + " " + e.layers);
  EXPECT_EQ(planned, (std::vector<std::string>{kPrefill + ",sinks=1 full_attention, 12 of 24 layers",
                                               kPrefill + ",window=127,sinks=1 sliding_attention, 12 of 24 layers",
                                               kDecode + ",sinks=1 full_attention, 12 of 24 layers",
                                               kDecode + ",window=127,sinks=1 sliding_attention, 12 of 24 layers"}));

  const std::string out = f.dir.file("oss.cu");
  const auto r = run_attntune("export --db " + shq(f.db) + " --all-best --plan " + shq(f.plan) + " -o " + shq(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json info = info_from_source(read_bytes(out));
  std::map<std::string, std::pair<std::string, nlohmann::json>> kernels;  // campaign -> (problem, variants)
  for (const auto& k : info.at("kernels"))
    kernels[k.at("campaign").get<std::string>()] = {
        Problem::from_json(k.at("problem")).str(), k.at("variants")};
  // The model's three results, each with its variants; none of the faster shapes without them.
  ASSERT_EQ(kernels.size(), 3u) << info.dump(2);
  EXPECT_EQ(kernels["oss-full"], std::make_pair(kPrefill + ",sinks=1", nlohmann::json::array({"sinks"})));
  EXPECT_EQ(kernels["oss-window"],
            std::make_pair(kPrefill + ",window=127,sinks=1", nlohmann::json::array({"window", "sinks"})));
  EXPECT_EQ(kernels["oss-decode-full"], std::make_pair(kDecode + ",sinks=1", nlohmann::json::array({"sinks"})));
  // The dispatch table's rows carry the variants (the dispatcher matches a call's exactly).
  const std::string cu = read_bytes(out);
  EXPECT_NE(cu.find(" window=127,0 sinks\""), std::string::npos);  // the windowed kernel's label
  // The windowed layers' decode has no result: named with its variants, so that it is tuned next.
  EXPECT_NE(r.err.find("attntune: note: 1 of the plan's 4 problems have no result yet (attntune status): " + kDecode +
                       ",window=127,sinks=1\n"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("window-no-sinks"), std::string::npos) << r.err;
}

// Every plan entry with a result runs its own tuned kernel: the library's dispatcher, compiled
// by nvcc and asked on the host (attntune_select_kernel_ex plans dry, no GPU), picks for each of
// the model's calls (its variants in attntune_options) the kernel of that problem; the decode of
// the windowed layers, untuned, has none (-1: the caller falls back), never a full-attention or a
// sink-less kernel.
TEST(ExportPlanVariantsNvcc, TheModelsCallsRunTheirTunedKernels) {
  const std::string nvcc = attntune::test::find_nvcc();
  ASSERT_FALSE(nvcc.empty()) << "nvcc not found ($CUDACXX, $CUDA_HOME, PATH, /usr/local/cuda/bin): CI has the toolkit";
  Fixture f;
  ASSERT_EQ(f.plan_error, "");
  const std::string out = f.dir.file("oss.cu");
  const auto r = run_attntune("export --db " + shq(f.db) + " --all-best --plan " + shq(f.plan) + " -o " + shq(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json info = info_from_source(read_bytes(out));
  std::map<std::string, int> index;  // problem -> kernel index
  for (std::size_t i = 0; i < info.at("kernels").size(); ++i)
    index[Problem::from_json(info.at("kernels")[i].at("problem")).str()] = static_cast<int>(i);

  // The exported file included in a host program of checks; PTX only (no ptxas: the checks run no
  // kernel), for the arch the results were measured on.
  const std::string exe = f.dir.file("checks");
  const Shell built = sh(shq(nvcc) + " -std=c++17 -gencode arch=compute_90,code=compute_90 -include " + shq(out) + " " +
                         shq(source_dir() + "/tests/unit/export/variant_dispatch_checks.cu") + " -o " + shq(exe));
  ASSERT_EQ(built.status, 0) << built.output;
  // entry (1 dense, 2 kvcache), b, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, window_left (-1
  // none), softcap, sinks (0/1).
  struct Case {
    std::string call;
    int want;
  };
  const std::vector<Case> cases = {
      {"1,1,64,8,512,512,64,-1,0,1", index.at(kPrefill + ",sinks=1")},
      {"1,1,64,8,512,512,64,127,0,1", index.at(kPrefill + ",window=127,sinks=1")},
      {"1,2,64,8,700,700,64,127,0,1", index.at(kPrefill + ",window=127,sinks=1")},  // other sizes: the same kernel
      {"2,1,64,8,1,2048,64,-1,0,1", index.at(kDecode + ",sinks=1")},
      {"2,4,64,8,1,9000,64,-1,0,1", index.at(kDecode + ",sinks=1")},
      {"2,1,64,8,1,2048,64,127,0,1", -1},  // the windowed layers' decode: not tuned
      {"1,1,64,8,512,512,64,-1,0,0", -1},  // no sinks: not this model's call, and no kernel of it here
  };
  std::string args;
  for (const Case& c : cases) args += " " + c.call;
  const Shell ran = sh(shq(exe) + args);
  ASSERT_EQ(ran.status, 0) << ran.output;
  std::istringstream lines(ran.output);
  std::string line;
  std::size_t i = 0;
  while (std::getline(lines, line) && i < cases.size()) {
    EXPECT_EQ(line, cases[i].call + " -> " + std::to_string(cases[i].want)) << ran.output;
    ++i;
  }
  EXPECT_EQ(i, cases.size()) << ran.output;
}
}  // namespace test_export_plan_variants
