// Fault injection on the GPU: each planted kernel of tests/data/faults/ is classified as its
// README says (crashed, timeout, wrong_result, nan_or_unwritten, resources, compile_error), and a
// good flash_fwd_mma candidate evaluated right after each one, by the same Evaluator, still comes
// back ok and correct. Then `attntune eval` end to end, recording into a database.
//
// The workers are the attntune binary these tests were built with (ATTNTUNE_BIN), as for every
// end-to-end command test (tests/common/run_attntune.hpp).
#include <cstdlib>
#include <filesystem>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "eval/build_pool.hpp"
#include "eval/evaluator.hpp"
#include "gpu_env.hpp"
#include "tests/common/run_attntune.hpp"
#include "tests/unit/eval/fault_kernels.hpp"

namespace test_evaluator {
using namespace attntune;

namespace {

const char* kProblem = "b=2,h=4,hkv=2,s=333,d=64,dtype=bf16,causal=1";  // GQA, causal, a partial last tile

EvalRequest request(const BuildOutcome& b, const LaunchSpec& launch, const Problem& p) {
  EvalRequest r;
  r.cubin = b.build.cubin;
  r.launch = launch;
  r.problem = p;
  r.validation_seed = 11;
  r.timing_seed = 12;
  r.timing.max_seconds = 0.5;
  return r;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(EvaluatorGpu, PlantedFaultsAreClassifiedAndTheNextGoodCandidateStillPasses) {
  ATTNTUNE_REQUIRE_GPU();
  const std::string bin = attntune::testing::attntune_bin();
  EvaluatorOptions eo;
  eo.worker_argv = {bin, "worker", "--device", "0"};
  eo.deadline_floor_s = 3;  // the endless loop is killed after 0.5 + 3 s
  Evaluator ev(eo);
  const DeviceInfo gpu = ev.device();
  const cuda::DeviceProps props = cuda::device_props(0);
  const Problem problem = Problem::parse(kProblem);
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_fwd_mma.yaml");
  const std::vector<Config> configs = space.enumerate(problem, gpu.arch);
  ASSERT_FALSE(configs.empty());
  const Config good_config = configs[configs.size() / 2];

  BuildPoolOptions bo;
  bo.worker_argv = {bin, "build-worker"};
  bo.nvrtc_options = family_nvrtc_options(space.family());
  BuildPool pool(bo);
  const auto good_ticket =
      pool.submit(BuildJob{good_config, render_kernel(space, good_config, problem, gpu.arch), gpu.arch});
  std::map<std::uint64_t, std::string> fault_of;
  for (const auto& f : attntune::testing::fault_kernels())
    fault_of[pool.submit(BuildJob{{{"fault", Value(std::string(f.file))}},
                                  attntune::testing::render_fault(source_dir(), f.file, problem.d), gpu.arch})] = f.file;
  std::map<std::string, BuildOutcome> built;
  BuildOutcome good_build;
  while (auto o = pool.next()) {
    if (o->ticket == good_ticket) good_build = std::move(*o);
    else built[fault_of.at(o->ticket)] = std::move(*o);
  }
  ASSERT_EQ(good_build.build.status, "ok") << good_build.build.log;
  const EvalRequest good = request(good_build, good_build.job.kernel.launch, problem);

  auto check_good = [&](const std::string& after) {
    const EvalOutcome g = ev.evaluate(good);
    EXPECT_EQ(g.record.status, "ok") << "good candidate after " << after << ": " << g.record.error;
    ASSERT_TRUE(g.record.max_abs_err && g.record.err_bound && g.record.median_us && g.record.tflops);
    EXPECT_LE(*g.record.max_abs_err, *g.record.err_bound) << after;
    EXPECT_GT(*g.record.median_us, 0) << after;
    EXPECT_GT(g.record.count, 0) << after;
    EXPECT_GT(g.registers, 0) << after;
  };
  check_good("nothing");
  EXPECT_GT(ev.reference_us(), 0);

  struct Case {
    std::string file, expected;
    LaunchSpec launch;
    std::string label;
  };
  std::vector<Case> cases;
  for (const auto& f : attntune::testing::fault_kernels()) {
    if (f.file == "too_much_smem.cu") {
      const LaunchSpec over = attntune::testing::fault_launch(props.max_smem_per_block_optin + 1024);  // alone too much
      const LaunchSpec with_static =
          attntune::testing::fault_launch(props.max_smem_per_block_optin - 16384);  // + 32 KiB static
      cases.push_back({f.file, f.expected, over, "dynamic alone over the limit"});
      cases.push_back({f.file, f.expected, with_static, "static + dynamic over the limit"});
    } else {
      cases.push_back({f.file, f.expected, attntune::testing::fault_launch(), ""});
    }
  }

  int started = ev.workers_started();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file + " " + c.label);
    const BuildOutcome& b = built.at(c.file);
    EvalOutcome out;
    if (b.build.status != "ok") {
      out.record = build_failure_record(b.build);
    } else {
      out = ev.evaluate(request(b, c.launch, problem));
    }
    const EvalRecord& r = out.record;
    std::printf("%-18s %-32s -> %-16s %.2f s  %s\n", c.file.c_str(), c.label.c_str(), r.status.c_str(), out.wall_s,
                r.error.substr(0, 160).c_str());
    EXPECT_EQ(r.status, c.expected) << r.error;
    EXPECT_FALSE(r.error.empty());
    if (c.expected == "crashed" || c.expected == "timeout") {
      EXPECT_TRUE(out.worker_replaced);
    } else {
      EXPECT_FALSE(out.worker_replaced) << "a candidate that did not poison the context keeps its worker";
    }
    if (c.file == "oob_write.cu") {
      EXPECT_TRUE(contains(r.error, "CUDA_ERROR_ILLEGAL_ADDRESS")) << r.error;
    }
    if (c.expected == "timeout") {
      // The reference time the worker measured when it prepared the problem for this candidate.
      EXPECT_NEAR(out.deadline_s, 0.5 + std::max(3.0, 50 * ev.reference_us() * 1e-6), 1e-9);
      EXPECT_LT(out.wall_s, out.deadline_s + 2.0);
    }
    if (c.expected == "wrong_result") {
      ASSERT_TRUE(r.max_abs_err && r.err_bound);
      EXPECT_GT(*r.max_abs_err, *r.err_bound);
      EXPECT_FALSE(r.median_us.has_value()) << "a wrong kernel is not timed";
    }
    if (c.expected == "nan_or_unwritten") {
      EXPECT_TRUE(contains(r.error, "non-finite")) << r.error;
    }
    if (c.expected == "compile_error") {
      EXPECT_TRUE(contains(r.error, "undeclared_tile_size")) << r.error;
    }
    check_good(c.file + " " + c.label);
  }
  // One fresh worker per crash or timeout, none for the rest.
  int replaced = 0;
  for (const Case& c : cases) replaced += c.expected == "crashed" || c.expected == "timeout";
  EXPECT_EQ(ev.workers_started(), started + replaced);
}

TEST(EvaluatorGpu, EvalCommandRecordsTheResult) {
  ATTNTUNE_REQUIRE_GPU();
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_fwd_mma.yaml");
  const Problem problem = Problem::parse(kProblem);
  const std::string arch = cuda::device_props(0).arch;
  const std::vector<Config> configs = space.enumerate(problem, arch);
  ASSERT_FALSE(configs.empty());
  const Config config = configs.front();
  const auto db = std::filesystem::temp_directory_path() / fmt::format("attntune_eval_{}.db", ::getpid());
  std::filesystem::remove(db);
  const std::string args = fmt::format("eval --space {}/search_spaces/flash_fwd_mma.yaml --problem {} --config {} --db {}",
                                       source_dir(), kProblem, config_str(config), db.string());
  auto run = [&](const std::string& a) { return attntune::testing::run_attntune(a); };

  auto json = run(args + " --format json");
  ASSERT_EQ(json.rc, 0) << json.out << json.err;
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["status"], "ok");
  EXPECT_GT(j["median_us"].get<double>(), 0);
  EXPECT_GT(j["tflops"].get<double>(), 0);
  EXPECT_LE(j["max_abs_err"].get<double>(), j["err_bound"].get<double>());
  EXPECT_GT(j["registers"].get<int>(), 0);
  EXPECT_FALSE(j["cached"].get<bool>());

  auto table = run(args);  // the build now comes from the database
  ASSERT_EQ(table.rc, 0) << table.out << table.err;
  EXPECT_TRUE(contains(table.out, "status")) << table.out;
  EXPECT_TRUE(contains(table.out, "cached")) << table.out;

  auto best = run(fmt::format("best --db {} --format json", db.string()));
  ASSERT_EQ(best.rc, 0) << best.err;
  const auto rows = nlohmann::json::parse(best.out);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["config"], config_json(config));
  EXPECT_EQ(rows[0]["arch"], arch);

  // The recorded result exports as it is, without --space: eval stores the space with it.
  const std::string cu = db.string() + ".cu";
  auto exported = run(fmt::format("export --db {} --problem {} -o {}", db.string(), kProblem, cu));
  ASSERT_EQ(exported.rc, 0) << exported.err;
  EXPECT_TRUE(std::filesystem::file_size(cu) > 0);
  std::filesystem::remove(cu);
  std::filesystem::remove(db);
}

// A paged decode whose K and V take 41% of the GPU's memory (on an 80 GB H100: b=64, 32 KV heads,
// sk=32k, d=128, bf16, 34 GB, a problem of the shipped plan) prepares and validates: the worker keeps
// the pages alone of its validation inputs once their references are computed, and its timing
// inputs never had contiguous K and V (AttnBuffers::contiguous_kv). With both copies in both (137 GB)
// its prepare ran out of memory on the H100 (run 383).
TEST(EvaluatorGpu, APagedDecodeOfFortyPercentOfTheGpusMemoryPreparesAndPasses) {
  ATTNTUNE_REQUIRE_GPU();
  const std::string bin = attntune::testing::attntune_bin();
  const cuda::DeviceProps props = cuda::device_props(0);
  const std::size_t per_sequence = std::size_t{32} * 32768 * 128 * 2 * 2;  // K and V of one sequence
  const long long b = static_cast<long long>(0.41 * static_cast<double>(props.total_mem) / per_sequence);
  ASSERT_GE(b, 1);
  const Problem problem =
      Problem::parse(fmt::format("b={},h=32,hkv=32,s=1,sk=32768,d=128,dtype=bf16,causal=1,page=16", b));
  EvaluatorOptions eo;
  eo.worker_argv = {bin, "worker", "--device", "0"};
  Evaluator ev(eo);
  const DeviceInfo gpu = ev.device();
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_decode.yaml");
  std::vector<Config> configs = space.enumerate(problem, gpu.arch);
  ASSERT_FALSE(configs.empty());
  BuildPoolOptions bo;
  bo.worker_argv = {bin, "build-worker"};
  bo.nvrtc_options = family_nvrtc_options(space.family());
  BuildPool pool(bo);
  // A few configs spread over the space: the first that builds and fits is validated and timed.
  for (std::size_t i = 0; i < 4; ++i) {
    const Config& c = configs[i * configs.size() / 4];
    pool.submit(BuildJob{c, render_kernel(space, c, problem, gpu.arch), gpu.arch});
  }
  int ok = 0;
  while (auto o = pool.next()) {
    if (o->build.status != "ok") continue;
    EvalRequest r = request(*o, o->job.kernel.launch, problem);
    r.timing.max_seconds = 0.3;
    const EvalOutcome e = ev.evaluate(r);
    SCOPED_TRACE(config_str(o->job.config));
    EXPECT_TRUE(e.record.status == "ok" || e.record.status == "resources") << e.record.status << ": " << e.record.error;
    ok += e.record.status == "ok";
  }
  EXPECT_GE(ok, 1);
  EXPECT_EQ(ev.workers_started(), 1);

  // Twice that (82%: validation and timing inputs cannot both fit) fails to prepare, saying why.
  const Problem too_big = Problem::parse(
      fmt::format("b={},h=32,hkv=32,s=1,sk=32768,d=128,dtype=bf16,causal=1,page=16", 2 * b));
  EvalRequest r;
  r.problem = too_big;
  r.validation_seed = 11;
  r.timing_seed = 12;
  try {
    ev.deadline_s(r);  // prepares
    ADD_FAILURE() << too_big.str() << " prepared";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("CUDA_ERROR_OUT_OF_MEMORY"), std::string::npos) << what;
    EXPECT_NE(what.find("its K and V take"), std::string::npos) << what;
    EXPECT_NE(what.find("GB are free: tune it on a GPU with more memory"), std::string::npos) << what;
  }
}
}  // namespace test_evaluator
