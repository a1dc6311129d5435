// `attntune export` without nvcc: which result it picks, its exit codes, the provenance header (all
// fields, no path of the tuning machine), the kernel source kept verbatim, and hostile names that
// must stay inside their comment and JSON string. tests/unit/export/test_export_nvcc.cpp compiles.
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "export/export.hpp"
#include "export/select.hpp"
#include "families/family.hpp"
#include "space/search_space.hpp"
#include "tests/common/run_attntune.hpp"
#include "tests/unit/db/db_test_util.hpp"
#include "tests/unit/export/nvcc_util.hpp"

namespace test_export_cli {
using namespace attntune;
using attntune::test::read_bytes;
using attntune::test::TempDir;
using attntune::testing::run_attntune;

namespace {

using attntune::test::info_from_source;
using attntune::test::Shell;
using attntune::test::sh;
using attntune::test::shq;
using attntune::testing::source_dir;

const std::string kSpacePath = "/home/tuner/work/attntune/search_spaces/flash_fwd_mma.yaml";  // must not leak

std::string space_text() { return read_bytes(source_dir() + "/search_spaces/flash_fwd_mma.yaml"); }

// A database built through the Store: campaigns of flash_fwd_mma with ok results (distinct valid
// configs, fastest first as given) and failed ones.
class Db {
 public:
  explicit Db(const std::string& path) : store_(Store::open(path, Store::Mode::kCreate)), path_(path) {
    space_ = std::make_shared<const SearchSpace>(SearchSpace::parse(space_text(), "flash_fwd_mma.yaml"));
    device_ = store_.upsert_device({"NVIDIA H200", "sm_90", "GPU-1", 132, "580.1"});
  }
  // Returns the configs recorded, in order of `medians`.
  std::vector<Config> campaign(const std::string& name, const std::string& problem, const std::vector<double>& medians,
                               bool store_space_text = true, int config_offset = 0) {
    const Problem p = Problem::parse(problem);
    CampaignSpec spec;
    spec.name = name;
    spec.problem = p;
    spec.space_path = kSpacePath;
    spec.space_hash = space_->hash();
    spec.space_text = store_space_text ? space_text() : "";
    spec.family = "flash_fwd_mma";
    spec.strategy = "random";
    const std::int64_t id = store_.open_campaign(spec, device_);
    const std::vector<Config> all = space_->enumerate(p, "sm_90");
    std::vector<Config> used;
    for (std::size_t i = 0; i < medians.size(); ++i) {
      const Config& c = all.at((config_offset + i * 7) % all.size());
      used.push_back(c);
      const auto cand = store_.upsert_candidate("flash_fwd_mma", c, render_kernel(*space_, c, p, "sm_90").source_hash);
      store_.record_evaluation(id, cand, device_, attntune::test::ok_eval(medians[i], p.flops() / medians[i] * 1e-6));
    }
    return used;
  }
  void failed_campaign(const std::string& name, const std::string& problem) {
    const Problem p = Problem::parse(problem);
    CampaignSpec spec;
    spec.name = name;
    spec.problem = p;
    spec.space_path = kSpacePath;
    spec.space_hash = space_->hash();
    spec.space_text = space_text();
    spec.family = "flash_fwd_mma";
    spec.strategy = "random";
    const std::int64_t id = store_.open_campaign(spec, device_);
    const Config c = space_->enumerate(p, "sm_90").front();
    const auto cand = store_.upsert_candidate("flash_fwd_mma", c, render_kernel(*space_, c, p, "sm_90").source_hash);
    store_.record_evaluation(id, cand, device_, attntune::test::failed_eval("wrong_result", "max err 0.5"));
  }
  Store& store() { return store_; }
  const std::string& path() const { return path_; }
  std::shared_ptr<const SearchSpace> space() const { return space_; }

 private:
  Store store_;
  std::string path_;
  std::shared_ptr<const SearchSpace> space_;
  std::int64_t device_ = 0;
};

const std::string kBf16 = "b=2,h=8,s=512,d=128,dtype=bf16,causal=0";
const std::string kBf16Causal = "b=2,h=8,s=1024,d=64,dtype=bf16,causal=1";
const std::string kFp16 = "b=2,h=8,s=512,d=64,dtype=fp16,causal=0";

// The leading comment block of a file.
std::vector<std::string> header_lines(const std::string& cu) {
  std::vector<std::string> out;
  std::istringstream in(cu);
  std::string line;
  while (std::getline(in, line) && line.rfind("//", 0) == 0) out.push_back(line);
  return out;
}

class ExportCli : public ::testing::Test {
 protected:
  TempDir dir;
  std::string db = dir.file("t.db");
  std::string out = dir.file("attn.cu");
  attntune::testing::Outcome run(const std::string& args) { return run_attntune("export --db " + shq(db) + " " + args); }
};

TEST_F(ExportCli, ExportsTheCampaignsBestOrTheNthBest) {
  Db d(db);
  const auto configs = d.campaign("c1", kBf16, {100, 120, 150});
  auto r = run("--campaign c1 -o " + shq(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  std::string cu = read_bytes(out);
  EXPECT_NE(cu.find(json_quoted(config_str(configs[0]))), std::string::npos);
  EXPECT_NE(r.out.find("exported 1 kernel"), std::string::npos) << r.out;
  nlohmann::json info = info_from_source(cu);
  EXPECT_EQ(info["mode"], "single");
  EXPECT_EQ(info["median_us"], 100.0);
  EXPECT_EQ(info["campaign"], "c1");

  r = run("--campaign c1 --rank 2 -o " + shq(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  cu = read_bytes(out);
  EXPECT_NE(cu.find(json_quoted(config_str(configs[1]))), std::string::npos);
  EXPECT_EQ(info_from_source(cu)["median_us"], 120.0);
}

TEST_F(ExportCli, ProblemPicksTheBestAcrossCampaigns) {
  Db d(db);
  d.campaign("slow", kBf16, {200, 210});
  const auto fast = d.campaign("fast", kBf16, {90}, true, 3);
  d.campaign("other-problem", kFp16, {10});
  const auto r = run("--problem " + kBf16 + " -o " + shq(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json info = info_from_source(read_bytes(out));
  EXPECT_EQ(info["campaign"], "fast");
  EXPECT_EQ(info["median_us"], 90.0);
  EXPECT_EQ(info["config"], config_json(fast[0]));
  EXPECT_EQ(info["problem"]["s"], 512);
}

TEST_F(ExportCli, NoOkResultExitsOne) {
  Db d(db);
  d.failed_campaign("bad", kBf16);
  auto r = run("--campaign bad -o " + shq(out));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("attntune: error: no valid results in campaign 'bad'"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(out));
  r = run("--problem b=1,h=1,s=64,d=64,dtype=fp16,causal=0 -o " + shq(out));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("no valid results for problem"), std::string::npos) << r.err;
  r = run("--all-best -o " + shq(out));
  EXPECT_EQ(r.rc, 1) << r.err;
}

TEST_F(ExportCli, UnknownCampaignExitsTwo) {
  Db d(db);
  d.campaign("c1", kBf16, {100});
  const auto r = run("--campaign nope -o " + shq(out));
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("no campaign 'nope'"), std::string::npos) << r.err;
}

TEST_F(ExportCli, RankBeyondTheResultsExitsOneAndRankZeroTwo) {
  Db d(db);
  d.campaign("c1", kBf16, {100, 110});
  auto r = run("--campaign c1 --rank 3 -o " + shq(out));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("only 2 valid configs in campaign 'c1'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--rank 3 is beyond them"), std::string::npos) << r.err;
  r = run("--campaign c1 --rank 0 -o " + shq(out));
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("--rank must be at least 1"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST_F(ExportCli, BadArgumentsExitTwo) {
  Db d(db);
  d.campaign("c1", kBf16, {100});
  for (const std::string& args :
       {std::string("--campaign c1"), "--campaign c1 --problem " + kBf16 + " -o " + shq(out),
        "-o " + shq(out), "--all-best --campaign c1 -o " + shq(out), "--all-best --rank 2 -o " + shq(out),
        "--campaign c1 --dtype bf16 -o " + shq(out), "--all-best --dtype fp32 -o " + shq(out),
        "--problem b=1 -o " + shq(out), "--campaign c1 -o " + shq(dir.path().string())}) {
    const auto r = run(args);
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("attntune: error: ", 0), 0u) << args << "\n" << r.err;
  }
  EXPECT_NE(run("--campaign c1").err.find("-o FILE.cu is required"), std::string::npos);
  EXPECT_NE(run("-o x.cu").err.find("exactly one of --campaign, --problem or --all-best"), std::string::npos);
  EXPECT_EQ(run("--campaign c1 -o " + shq(out)).rc, 0);
}

TEST_F(ExportCli, AllBestHoldsEachProblemsBestAndNeedsDtypeWhenMixed) {
  Db d(db);
  d.campaign("a", kBf16, {300, 310});
  const auto best_a = d.campaign("a2", kBf16, {250}, true, 5);
  const auto best_b = d.campaign("b", kBf16Causal, {80});
  d.campaign("c", kFp16, {40});
  auto r = run("--all-best -o " + shq(out));
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("--dtype"), std::string::npos) << r.err;

  r = run("--all-best --dtype bf16 -o " + shq(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string cu = read_bytes(out);
  const nlohmann::json info = info_from_source(cu);
  EXPECT_EQ(info["mode"], "all-best");
  EXPECT_EQ(info["dtype"], "bf16");
  ASSERT_EQ(info["kernels"].size(), 2u) << info.dump(2);
  EXPECT_EQ(info["kernels"][0]["campaign"], "a2");
  EXPECT_EQ(info["kernels"][0]["config"], config_json(best_a[0]));
  EXPECT_EQ(info["kernels"][1]["campaign"], "b");
  EXPECT_EQ(info["kernels"][1]["problem"]["causal"], true);
  EXPECT_NE(cu.find("attntune_k1_flash_fwd_mma"), std::string::npos);

  r = run("--all-best --dtype fp16 -o " + shq(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(info_from_source(read_bytes(out))["kernels"].size(), 1u);
}

TEST_F(ExportCli, AllBestSharesOneSourceBetweenProblemsWithTheSameKernel) {
  Db d(db);
  d.campaign("s512", kBf16, {100});
  d.campaign("s4096", "b=1,h=8,s=4096,d=128,dtype=bf16,causal=0", {900});  // same config index: same source
  const auto r = run("--all-best -o " + shq(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string cu = read_bytes(out);
  EXPECT_EQ(info_from_source(cu)["kernels"].size(), 2u);
  EXPECT_NE(cu.find("namespace attntune_k0 {"), std::string::npos);
  EXPECT_EQ(cu.find("namespace attntune_k1 {"), std::string::npos);
}

TEST_F(ExportCli, ArchFilterKeepsOnlyResultsFromThatArch) {
  Db d(db);
  d.campaign("c1", kBf16, {100});
  auto r = run("--campaign c1 --arch sm_89 -o " + shq(out));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("measured on sm_89"), std::string::npos) << r.err;
  r = run("--campaign c1 --arch sm_90 -o " + shq(out));
  EXPECT_EQ(r.rc, 0) << r.err;
}

TEST_F(ExportCli, OlderCampaignWithoutSpaceTextNeedsTheMatchingSpaceFile) {
  Db d(db);
  d.campaign("old", kBf16, {100}, /*store_space_text=*/false);
  auto r = run("--campaign old -o " + shq(out));
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("--space FILE"), std::string::npos) << r.err;

  const std::string edited = dir.file("edited.yaml");
  attntune::test::write_bytes(edited, space_text() + "\n# edited\n");
  r = run("--campaign old --space " + shq(edited) + " -o " + shq(out));
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("not the space campaign 'old' was tuned with"), std::string::npos) << r.err;

  r = run("--campaign old --space " + shq(source_dir() + "/search_spaces/flash_fwd_mma.yaml") + " -o " +
          shq(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(read_bytes(out).find(source_dir()), std::string::npos);
}

TEST_F(ExportCli, DashWritesToStdout) {
  Db d(db);
  d.campaign("c1", kBf16, {100});
  const auto r = run("--campaign c1 -o -");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.rfind("// attntune export: 1 tuned attention kernel", 0), 0u) << r.out.substr(0, 200);
  EXPECT_NE(r.err.find("exported 1 kernel"), std::string::npos);
}

// The header carries the provenance docs/CONTRACT.md lists, and nothing of the tuning machine's disk.
TEST(ExportSource, ProvenanceHeaderHasEveryFieldAndNoPath) {
  TempDir dir;
  Db d(dir.file("t.db"));
  const auto configs = d.campaign("suite-b2-s512", kBf16, {123.456});
  ExportQuery q;
  q.campaign = "suite-b2-s512";
  const auto items = select_for_export(d.store(), q);
  const std::string cu = export_source(items, ExportMode::kSingle);
  std::string header;
  for (const auto& l : header_lines(cu)) header += l + "\n";
  for (const char* field : {"template ", "config ", "problem ", "gpu ", "arch ", "median_us ", "tflops ",
                            "campaign ", "evaluated_at ", "source_hash "})
    EXPECT_NE(header.find(std::string("//   ") + field), std::string::npos) << field << "\n" << header;
  EXPECT_NE(header.find("\"flash_fwd_mma\""), std::string::npos);
  EXPECT_NE(header.find(json_quoted(config_str(configs[0]))), std::string::npos);
  EXPECT_NE(header.find(json_quoted(Problem::parse(kBf16).str())), std::string::npos);
  EXPECT_NE(header.find("\"NVIDIA H200\""), std::string::npos);
  EXPECT_NE(header.find("\"sm_90\""), std::string::npos);
  EXPECT_NE(header.find("123.456"), std::string::npos);
  EXPECT_NE(header.find("\"suite-b2-s512\""), std::string::npos);
  EXPECT_TRUE(std::regex_search(header, std::regex("evaluated_at +\"20[0-9][0-9]-[0-9][0-9]-[0-9][0-9]T"))) << header;
  EXPECT_NE(header.find("nvcc -std=c++17 -arch=sm_90 -Xcompiler -fPIC -shared FILE.cu -o libattn.so"),
            std::string::npos);
  for (const std::string& path : {std::string("/work"), std::string("/home"), std::string("/tmp"), kSpacePath,
                                  source_dir(), dir.path().string()})
    EXPECT_EQ(cu.find(path), std::string::npos) << path;
  // Includes: the CUDA runtime and standard C++ headers only.
  std::smatch m;
  std::string rest = cu;
  while (std::regex_search(rest, m, std::regex("#include[^\n]*"))) {
    EXPECT_TRUE(std::regex_match(m.str(), std::regex("#include <(cuda_runtime\\.h|cuda\\.h|atomic|cmath|cstdarg|cstddef|cstdint|cstdio|cstring|mutex)>")))
#include "tests/unit/export/nvcc_util.hpp"
        << m.str();
    rest = m.suffix();
  }
  const nlohmann::json info = info_from_source(cu);
  EXPECT_EQ(info["format"], "attntune-export/1");
  for (const char* key : {"template", "config", "problem", "gpu", "arch", "median_us", "tflops", "max_abs_err",
                          "campaign", "evaluated_at", "source_hash"})
    EXPECT_TRUE(info.contains(key)) << key;
  EXPECT_EQ(info["median_us"], 123.456);
}

// The file holds render_kernel's output verbatim: the kernel the tuner measured, not a copy of it.
TEST(ExportSource, KernelSourceIsVerbatim) {
  TempDir dir;
  Db d(dir.file("t.db"));
  const auto configs = d.campaign("c", kBf16Causal, {50});
  ExportQuery q;
  q.campaign = "c";
  const auto items = select_for_export(d.store(), q);
  const std::string cu = export_source(items, ExportMode::kSingle);
  const RenderedKernel k = render_kernel(*d.space(), configs[0], Problem::parse(kBf16Causal), "sm_90");
  EXPECT_NE(cu.find("#define flash_fwd_mma attntune_k0_flash_fwd_mma\n" + k.source + "#undef flash_fwd_mma\n"),
            std::string::npos);
  EXPECT_NE(cu.find(k.source_hash), std::string::npos);
  // Every macro the kernel defines is undefined after it (several kernels can follow each other).
  for (const char* m : {"BLOCK_M", "ATT_HEAD_DIM", "ATTNTUNE_PTX_CUH", "ATTNTUNE_ATTN_PARAMS_H"})
    EXPECT_NE(cu.find(std::string("#undef ") + m + "\n"), std::string::npos) << m;
}

// Names from the database cannot end the comment, start a line of code, or leave the JSON string.
TEST(ExportSource, HostileNamesStayInsideCommentAndJson) {
  TempDir dir;
  const std::string hostile = "x */ int evil; /* \"q\" \\ back\\\n#error injected\r\n?\?/\n\xff\\";
  std::string cu;
  {
    Db d(dir.file("t.db"));
    d.campaign(hostile, kBf16, {100});
    ExportQuery q;
    q.campaign = hostile;
    auto items = select_for_export(d.store(), q);
    items[0].row.gpu = "GPU \"*/\" \\\n#define x 1 ?\?=";
    cu = export_source(items, ExportMode::kSingle);
  }
  EXPECT_EQ(cu.find("\n#error injected"), std::string::npos);
  EXPECT_EQ(cu.find("\n#define x 1"), std::string::npos);
  // The names show only on comment lines and in the lines of kInfo's string literal.
  int seen = 0;
  std::istringstream lines(cu);
  for (std::string line; std::getline(lines, line);)
    if (line.find("evil") != std::string::npos) {
      ++seen;
      EXPECT_TRUE(line.rfind("//", 0) == 0 || line.rfind("    \"", 0) == 0) << line;
    }
  EXPECT_GE(seen, 2);
  const auto header = header_lines(cu);
  ASSERT_GT(header.size(), 20u);
  for (const auto& l : header) {
    EXPECT_NE(l.back(), '\\') << l;
    for (unsigned char c : l) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << l;
  }
  EXPECT_NE(cu.find("//   campaign      " + json_quoted(hostile) + "\n"), std::string::npos);
  const nlohmann::json info = info_from_source(cu);
  EXPECT_EQ(info["gpu"], "GPU \"*/\" \\\n#define x 1 ?\?=");
  const std::string name = info["campaign"];
  EXPECT_EQ(name.substr(0, name.size() - 4), hostile.substr(0, hostile.size() - 2));  // \xff: U+FFFD
  // No line outside the kernel sources ends in a backslash (a continuation into code).
  std::istringstream in(cu);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line.back() == '\\') {
      EXPECT_EQ(line.rfind("#define", 0), std::string::npos) << line;
    }
}

TEST(ExportSource, CStringLiteralEscapesQuotesBackslashesAndQuestionMarks) {
  EXPECT_EQ(c_string_literal("a\"b\\c?\?=d", ""), "\"a\\\"b\\\\c\\?\\?=d\"");
  EXPECT_EQ(c_string_literal("", "  "), "  \"\"");
  const std::string long_text(200, 'x');
  EXPECT_EQ(c_string_literal(long_text, ""), "\"" + long_text.substr(0, 96) + "\"\n\"" + long_text.substr(96, 96) +
                                                 "\"\n\"" + long_text.substr(192) + "\"");
  EXPECT_THROW(c_string_literal("a\nb"), std::logic_error);
  EXPECT_EQ(json_quoted("a\n\"\\\xc3\xa9"), "\"a\\n\\\"\\\\\\u00e9\"");
}

// The database recorded on the GPU machine (tests/data/campaigns/): its best exports with its
// provenance and no path of that machine.
TEST(ExportRealDb, ExportsTheRecordedSuite) {
  const std::string db = source_dir() + "/tests/data/campaigns/h100-suite.db";
  ASSERT_TRUE(std::filesystem::exists(db)) << db << " is missing";
  TempDir dir;
  Store store = Store::open(db, Store::Mode::kReadOnly);
  std::optional<CampaignRow> first;
  for (const CampaignRow& c : store.campaigns())
    if (c.ok > 0 && !first) first = c;
  ASSERT_TRUE(first) << "no campaign with results in " << db;
  const std::string out = dir.file("one.cu");
  auto r = run_attntune("export --db " + shq(db) + " --campaign " + shq(first->spec.name) + " -o " + shq(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string cu = read_bytes(out);
  const nlohmann::json info = info_from_source(cu);
  EXPECT_EQ(info["campaign"], first->spec.name);
  EXPECT_EQ(info["template"], "flash_fwd_mma");
  EXPECT_EQ(std::string(info["gpu"]).rfind("NVIDIA ", 0), 0u) << info["gpu"];  // a real device name
  EXPECT_EQ(info["problem"]["d"], first->spec.problem.d);
  // The campaign's space path, when absolute, is the tuning machine's (a relative one is the
  // repository's, which the template's comments name too).
  std::vector<std::string> paths = {"/work", "/home", "/tmp", "/root"};
  if (first->spec.space_path.rfind("/", 0) == 0) paths.push_back(first->spec.space_path);
  for (const std::string& path : paths) EXPECT_EQ(cu.find(path), std::string::npos) << path;

  r = run_attntune("export --db " + shq(db) + " --all-best --dtype bf16 -o " + shq(dir.file("all.cu")));
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json all = info_from_source(read_bytes(dir.file("all.cu")));
  EXPECT_GE(all["kernels"].size(), 2u);
  for (const auto& k : all["kernels"]) EXPECT_EQ(k["problem"]["dtype"], "bf16");
}

TEST(ComparePy, CompilesWithPython3) {
  ASSERT_EQ(std::system("command -v python3 >/dev/null 2>&1"), 0) << "python3 is missing";
  TempDir dir;
  for (const char* tool : {"compare_sdpa.py", "compare_chunked.py", "compare_varlen.py", "peer_common.py",
                           "gpu_timing.py", "compare_bwd.py", "compare_fp8_forward.py"}) {
    const std::string cmd = "PYTHONPYCACHEPREFIX=" + shq(dir.path().string()) + " python3 -m py_compile " +
                            shq(source_dir() + "/tools/" + tool);
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
}

// The peer tools' shared run code (tools/peer_common.py: specs, options, their checks) without torch:
// their dry runs, and bad input as one line and exit 2.
TEST(ComparePy, PeerToolsDryRunsAndRefuseBadInput) {
  ASSERT_EQ(std::system("command -v python3 >/dev/null 2>&1"), 0) << "python3 is missing";
  TempDir dir;
  const std::string py = "PYTHONPYCACHEPREFIX=" + shq(dir.path().string()) + " python3 " + shq(source_dir() + "/tools/");
  Shell r = sh(py + "compare_chunked.py --dry-run --problem b=2,h=8,hkv=2,s=512,sk=4096,d=128,dtype=bf16,causal=1,page=64");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("problem b=2,h=8,hkv=2,s=512,sk=4096,d=128,dtype=bf16,causal=1,page=64"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("dense equivalent b=2,h=8,hkv=2,s=512,sk=4096,d=128,dtype=bf16,causal=1\n"),
            std::string::npos)
      << r.output;
  r = sh(py + "compare_varlen.py --dry-run --contenders fa4,sdpa_padded,sdpa_loop "
              "--problem b=4,h=8,hkv=2,s=1024,d=128,dtype=bf16,causal=1,varlen=1");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("problem b=4,h=8,hkv=2,s=1024,sk=1024,d=128,dtype=bf16,causal=1,varlen=1"),
            std::string::npos)
      << r.output;
  // compare_fp8_forward.py: the FP8 forward's problem (dtype given or not) and its contenders.
  r = sh(py + "compare_fp8_forward.py --dry-run --cu x.cu --problem b=1,h=16,s=16384,d=128,causal=0");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("problem b=1,h=16,hkv=16,s=16384,sk=16384,d=128,dtype=fp8,causal=0: 2.199 TFLOP; "
                          "contenders fp8, ours, fa4, sdpa"),
            std::string::npos)
      << r.output;
  r = sh(py + "compare_fp8_forward.py --dry-run --cu x.cu --problem b=1,h=16,s=16384,d=256,causal=1 --contenders fp8,sdpa");
  EXPECT_EQ(r.status, 0) << r.output;
  // compare_bwd.py --varlen: the packed batch's lengths as attntune draws them (compare_varlen's
  // generator), and which peers a causal batch with sk = s gets.
  r = sh(py + "compare_bwd.py --dry-run --varlen b=8,h=16,hkv=4,s=2048,d=128,dtype=bf16,causal=1,varlen=256");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("varlen b8 h16/4 d128 bf16 causal: query lengths 384..1733 (total 8065), key lengths "
                          "384..1733 (total 8065); peers torch_varlen, sdpa_loop_cudnn, sdpa_padded_cudnn"),
            std::string::npos)
      << r.output;
  for (const auto& [tool, args, says] :
       {std::tuple{"compare_bwd.py", "--varlen b=8,h=16,s=2048,d=128,dtype=bf16,causal=1", "names no varlen=N"},
        std::tuple{"compare_bwd.py", "--varlen b=8,h=16,s=2048,d=128,dtype=fp16,causal=1,varlen=9",
                   "is not --dtype bf16"},
        std::tuple{"compare_bwd.py", "--shapes 1,16,16,x,128,0", "is not b,h,hkv,s,d,causal"},
        std::tuple{"compare_bwd.py", "", "give --shapes or --varlen"},
        std::tuple{"compare_chunked.py", "--problem b=2,h=8,s=512,d=128,dtype=bf16,causal=1,page=64,page=3",
                   "key 'page' given twice"},
        std::tuple{"compare_varlen.py", "--problem b=2,h=8,s=x,d=128,dtype=bf16,causal=1,varlen=1",
                   "s='x' is not an integer"},
        std::tuple{"compare_varlen.py", "--problem b=2,h=8,s=512,d=128,dtype=bf16,causal=1,varlen=1 --contenders fa4,x",
                   "--contenders: unknown 'x'"},
        std::tuple{"compare_chunked.py", "--problem b=2,h=8,s=512,d=128,dtype=bf16,causal=1,page=64 --rounds 0",
                   "--rounds and --calls must be >= 1"},
        std::tuple{"compare_fp8_forward.py", "--problem b=1,h=16,s=4096,d=192,causal=0 --contenders sdpa",
                   "head dims multiples of 32 up to 128, and 256"},
        std::tuple{"compare_fp8_forward.py", "--problem b=1,h=16,s=4096,d=128,causal=0", "--cu is needed"}}) {
    r = sh(py + tool + " --dry-run " + args);
    EXPECT_EQ(r.status, 2) << tool << " " << args << ": " << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << tool << " " << args << ": " << r.output;
  }
}

}  // namespace
}  // namespace test_export_cli
