// Reliability, part 1 and the GPU half of part 2 (docs/RELIABILITY.md), and this executable's main.
//
// Planted faults: one campaign (run_campaign with the GpuRunner: BuildPool, Evaluator, the store) over
// the planted-fault family (planted_faults.hpp): 55 faulty candidates, 5 of each of 11 kinds covering
// every status the evaluator gives (compile_error, compile_timeout, resources, launch_error, crashed,
// timeout, wrong_result, nan_or_unwritten), interleaved with 20 real flash_fwd_mma candidates. Each is
// classified as planted, the campaign completes and ranks, and every good result is committed and
// correct: ok within FA2's bound, and its time confirmed by a fresh evaluator afterwards.
//
// GPU kills: 20 SIGKILLs of `attntune tune` on a real campaign (NVRTC builds, GPU evaluation): before
// a run's first commit (its builds compiling), inside a commit (held open by the store's test hook),
// and between commits (GPU evaluating, builds compiling); each followed by a resume. Nothing
// committed is lost, nothing evaluated twice, integrity holds after each kill, and the final ranking
// matches an uninterrupted run's within timing noise.
//
// The planted campaign runs in this process, where its family is registered, so its GPU and build
// workers are this executable: main() serves `worker` and `build-worker` with the library's own
// run_gpu_worker / run_build_worker, exactly as `attntune worker` does. Without a GPU the GPU tests
// skip with the reason; the family's rendering and builds are checked on the CPU (NVRTC only).
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <random>
#include <set>

#include "cuda/driver.hpp"
#include "eval/build_pool.hpp"
#include "eval/evaluator.hpp"
#include "eval/gpu_runner.hpp"
#include "eval/worker.hpp"
#include "planted_faults.hpp"
#include "reliability_util.hpp"
#include "search/campaign.hpp"
#include "tests/gpu/gpu_env.hpp"

namespace attntune::reliability {
namespace test_planted_faults_and_gpu_kills {
namespace {

using namespace std::chrono_literals;

const char* kPlantedProblem = "b=2,h=4,hkv=2,s=333,d=64,dtype=bf16,causal=1";  // GQA, causal, a partial tile

std::string planted_space_path() { return source_dir() + "/tests/reliability/planted_faults.yaml"; }
std::string flash_space_path() { return source_dir() + "/search_spaces/flash_fwd_mma.yaml"; }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// What each planted kind's record must also say, beyond its status.
void check_planted_record(const std::string& kind, const EvalRecord& r) {
  if (kind == "good") {
    ASSERT_TRUE(r.median_us && r.tflops && r.max_abs_err && r.err_bound) << r.error;
    EXPECT_LE(*r.max_abs_err, *r.err_bound);
    EXPECT_GT(*r.median_us, 0);
    EXPECT_GT(r.count, 0);
    return;
  }
  EXPECT_FALSE(r.error.empty());
  EXPECT_FALSE(r.median_us.has_value()) << "a failed candidate is not timed";
  if (kind == "oob_write") {
    EXPECT_TRUE(contains(r.error, "CUDA_ERROR_ILLEGAL_ADDRESS")) << r.error;
  }
  if (kind == "compile_error") {
    EXPECT_TRUE(contains(r.error, "undeclared_tile_size")) << r.error;
  }
  if (kind == "missing_entry") {
    EXPECT_TRUE(contains(r.error, "did not load")) << r.error;
  }
  if (kind == "nan_output" || kind == "unwritten") {
    EXPECT_TRUE(contains(r.error, "non-finite")) << r.error;
  }
  if (kind == "wrong_values") {
    ASSERT_TRUE(r.max_abs_err && r.err_bound);
    EXPECT_GT(*r.max_abs_err, *r.err_bound);
  }
}

TEST(ReliabilityPlantedFaults, FamilyInterleavesEveryKindAndBuildsAsIntended) {
  TempDir dir;
  const std::string fifo = dir.file("never-written.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const SearchSpace flash = SearchSpace::load(flash_space_path());
  const Problem problem = Problem::parse(kPlantedProblem);
  setup_planted_family(source_dir(), flash, problem, "sm_90", 232448, fifo);
  const SearchSpace space = SearchSpace::load(planted_space_path());
  const std::vector<Config> configs = space.enumerate(problem, "sm_90");

  // 75 candidates: 5 copies of 11 faults and 4 good ones; every status but ok among the faults.
  std::map<std::string, int> by_expected;
  int faults = 0, run = 0, longest_fault_run = 0;
  for (const Config& c : configs) {
    const PlantedKind& k = planted_kind(c);
    ++by_expected[k.expected];
    faults += k.kind != "good";
    run = k.kind == "good" ? 0 : run + 1;
    longest_fault_run = std::max(longest_fault_run, run);
  }
  EXPECT_EQ(configs.size(), 75u);
  EXPECT_EQ(faults, 55);
  EXPECT_EQ(by_expected["ok"], 20);
  for (const char* s : {"compile_error", "compile_timeout", "resources", "launch_error", "crashed", "timeout",
                        "wrong_result", "nan_or_unwritten"})
    EXPECT_GE(by_expected[s], 5) << s;
  EXPECT_LE(longest_fault_run, 11) << "good candidates come between the faults of each copy";

  // A good candidate is the flash_fwd_mma candidate itself; faults are distinct sources per copy.
  std::set<std::string> hashes;
  for (const Config& c : configs) {
    const RenderedKernel k = render_kernel(space, c, problem, "sm_90");
    EXPECT_TRUE(hashes.insert(k.source_hash).second) << config_str(c);
    if (planted_kind(c).kind == "good") {
      EXPECT_EQ(k.source, render_kernel(flash, planted_good_config(c), problem, "sm_90").source);
    }
    if (planted_kind(c).kind == "smem_over_limit") {
      EXPECT_GT(define_value(k.launch.defines, "SMEM_BYTES"), 232448);
    }
  }

  // Copy 0 of each fault through real NVRTC builds: compile_error fails, compile_hang is killed at
  // its timeout, the rest build (missing_entry without the entry point the worker looks for).
  BuildPoolOptions o;
  o.jobs = 2;
  o.compile_timeout = 3s;
  o.worker_argv = {testing::attntune_bin(), "build-worker"};
  BuildPool pool(o);
  for (const Config& c : configs)
    if (std::get<std::int64_t>(c.at("copy")) == 0 && planted_kind(c).kind != "good")
      pool.submit(BuildJob{c, render_kernel(space, c, problem, "sm_90"), "sm_90"});
  int built = 0;
  while (auto out = pool.next()) {
    ++built;
    const std::string kind = planted_kind(out->job.config).kind;
    if (kind == "compile_error") {
      EXPECT_EQ(out->build.status, "compile_error") << out->build.log;
    } else if (kind == "compile_hang") {
      EXPECT_EQ(out->build.status, "compile_timeout") << out->build.log;
    } else {
      EXPECT_EQ(out->build.status, "ok") << kind << ": " << out->build.log;
    }
    if (kind == "missing_entry") {
      EXPECT_FALSE(contains(out->build.cubin, std::string("flash_fwd_mma") + '\0'));
    }
  }
  EXPECT_EQ(built, 11);
}

TEST(ReliabilityPlantedFaultsGpu, OneCampaignClassifiesFiftyFiveFaultsAndKeepsEveryGoodResult) {
  ATTNTUNE_REQUIRE_GPU();
  TempDir dir;
  const std::string fifo = dir.file("never-written.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const cuda::DeviceProps props = cuda::device_props(0);
  const SearchSpace flash = SearchSpace::load(flash_space_path());
  const Problem problem = Problem::parse(kPlantedProblem);
  setup_planted_family(source_dir(), flash, problem, props.arch, props.max_smem_per_block_optin, fifo);
  const SearchSpace space = SearchSpace::load(planted_space_path());

  Store store = Store::open(dir.file("planted.db"), Store::Mode::kCreate);
  GpuRunnerOptions ro;
  ro.compile_timeout = 20s;  // a flash_fwd_mma build takes ~1-2 s
  ro.deadline_floor_s = 2;   // the endless loops are killed after 0.2 + 2 s
  ro.timing.max_seconds = 0.2;
  GpuRunner runner(space, problem, &store, ro);
  CampaignSpec spec;
  spec.name = "planted";
  spec.problem = problem;
  spec.space_path = space.path();
  spec.space_hash = space.hash();
  spec.space_text = space.text();
  spec.family = space.family();
  spec.strategy = "exhaustive";
  search::TuneOptions to;
  to.strategy = "exhaustive";
  to.final_top = 5;
  to.final_rounds = 2;
  search::Progress progress(std::cerr, false, 15s);
  const auto t0 = Clock::now();
  const search::TuneResult result = search::run_campaign(store, runner, space, spec, to, progress, {});
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  EXPECT_EQ(result.status, "completed") << result.stop_reason;
  EXPECT_EQ(result.evaluations, 75);
  EXPECT_EQ(result.ok, 20);
  const std::int64_t id = *store.find_campaign("planted");
  const std::vector<EvaluationRow> rows = store.campaign_evaluations(id);
  ASSERT_EQ(rows.size(), 75u);
  std::map<std::string, std::map<std::string, int>> got;  // kind -> status -> count
  std::vector<const EvaluationRow*> goods;
  for (const EvaluationRow& e : rows) {
    const PlantedKind& k = planted_kind(e.config);
    SCOPED_TRACE(config_str(e.config));
    ++got[k.kind][e.record.status];
    EXPECT_EQ(e.record.status, k.expected) << e.record.error;
    check_planted_record(k.kind, e.record);
    if (k.kind == "good") goods.push_back(&e);
  }
  ASSERT_EQ(goods.size(), 20u);
  const auto ranking = store.ranking(id);
  ASSERT_EQ(ranking.size(), 5u);
  for (const RankedRow& r : ranking) EXPECT_EQ(planted_kind(r.config).kind, "good");

  // Every good result committed is correct: a fresh evaluator, after the campaign, agrees.
  EvaluatorOptions eo;
  eo.worker_argv = {self_exe(), "worker", "--device", "0"};
  Evaluator fresh(eo);
  BuildPoolOptions bo;
  bo.nvrtc_options = family_nvrtc_options("flash_fwd_mma");
  bo.store = &store;  // the campaign's builds, from the cache
  BuildPool pool(bo);
  std::map<std::uint64_t, const EvaluationRow*> ticket;
  for (const EvaluationRow* e : goods)
    ticket[pool.submit(BuildJob{e->config, render_kernel(space, e->config, problem, props.arch), props.arch})] = e;
  double worst = 1;
  while (auto b = pool.next()) {
    const EvaluationRow& e = *ticket.at(b->ticket);
    ASSERT_EQ(b->build.status, "ok");
    EXPECT_TRUE(b->cache_hit) << "the campaign's build was cached";
    EvalRequest req;
    req.cubin = b->build.cubin;
    req.launch = b->job.kernel.launch;
    req.problem = problem;
    req.timing.max_seconds = 0.2;
    const EvalOutcome again = fresh.evaluate(req);
    ASSERT_EQ(again.record.status, "ok") << config_str(e.config) << ": " << again.record.error;
    const double ratio = *again.record.median_us / *e.record.median_us;
    worst = std::max(worst, std::max(ratio, 1 / ratio));
    EXPECT_LT(std::abs(ratio - 1), 0.5) << config_str(e.config) << ": " << *e.record.median_us << " µs then, "
                                        << *again.record.median_us << " now";
  }

  std::printf("planted campaign on %s: %lld evaluations in %.1f s (%s)\n", props.name.c_str(),
              static_cast<long long>(result.evaluations), seconds, result.stop_reason.c_str());
  std::printf("%-22s %-17s %s\n", "kind", "expected", "got");
  for (const PlantedKind& k : planted_kinds()) {
    std::string line;
    for (const auto& [status, n] : got[k.kind]) line += fmt::format("{}{} x{}", line.empty() ? "" : ", ", status, n);
    std::printf("%-22s %-17s %s\n", k.kind.c_str(), k.expected.c_str(), line.c_str());
  }
  std::printf("good results re-evaluated by a fresh evaluator: all ok, times within %.0f%% of the campaign's\n",
              (worst - 1) * 100);
}

// ---- GPU kills --------------------------------------------------------------------------------------

TEST(ReliabilityKillsGpu, TwentySigkillsDuringCompileEvaluationAndCommitThenResume) {
  ATTNTUNE_REQUIRE_GPU();
  TempDir dir;
  const std::string problem = "b=4,h=16,s=2048,d=64,dtype=bf16,causal=0";
  constexpr int kBudget = 32;
  auto args = [&](const std::string& db) {
    return std::vector<std::string>{"tune", "--space", flash_space_path(), "--problem", problem, "--db", db,
                                    "--campaign", "k", "--strategy", "exhaustive", "--budget-evals",
                                    std::to_string(kBudget), "--final-top", "5", "--final-rounds", "2",
                                    "--max-seconds", "0.2", "--log-interval", "1"};
  };
  const std::string work = dir.file("killed.db"), ref = dir.file("uninterrupted.db");
  std::mt19937 rng(20261124);
  std::vector<std::string> moments;
  for (int i = 0; i < 7; ++i) moments.push_back("compile");
  for (int i = 0; i < 7; ++i) moments.push_back("commit");
  for (int i = 0; i < 6; ++i) moments.push_back("evaluation");
  std::shuffle(moments.begin(), moments.end(), rng);

  constexpr int kHoldMs = 200;
  std::map<std::int64_t, CommittedRow> committed;
  std::vector<std::string> lines;
  int landed_before = 0, landed_inside = 0, landed_after = 0;
  const auto t0 = Clock::now();
  for (std::size_t k = 0; k < moments.size(); ++k) {
    const std::string log = dir.file(fmt::format("run{:02}.log", k));
    ProcOptions o;
    o.err_file = log;
    o.env = {{"ATTNTUNE_TEST_COMMIT_DELAY_MS", std::to_string(kHoldMs)}};
    Proc p(args(work), o);
    auto hooks = [&] { return static_cast<int>(count_of(read_bytes(log), "test hook: evaluation ")); };
    auto wait_for = [&](auto pred) {
      while (!p.done() && !pred()) std::this_thread::sleep_for(1ms);
    };
    const std::string& moment = moments[k];
    if (moment == "compile") {
      // The campaign line comes once the GPU worker is up; the builds start right after it.
      wait_for([&] { return contains(read_bytes(log), "campaign 'k'"); });
      std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(20, 250)(rng)));
    } else {
      const int nth = std::uniform_int_distribution<int>(1, 3)(rng);
      wait_for([&] { return hooks() >= nth; });
      if (moment == "evaluation") {
        std::this_thread::sleep_for(std::chrono::milliseconds(kHoldMs + std::uniform_int_distribution<int>(30, 300)(rng)));
      }
    }
    p.signal(SIGKILL);
    const int rc = p.wait();
    ASSERT_EQ(rc, 128 + SIGKILL) << "run " << k << " ended before the kill:\n" << read_bytes(log);
    ASSERT_EQ(integrity_check(work), "ok");
    const auto now = committed_rows(work);
    for (const auto& [seq, row] : committed) {
      ASSERT_TRUE(now.count(seq)) << "evaluation #" << seq << " lost at kill " << k;
      ASSERT_EQ(now.at(seq), row) << "evaluation #" << seq << " changed at kill " << k;
    }
    // Where it landed, from the log and the database: a row the hook announced that is not there
    // was written inside a transaction the kill cut, and rolled back.
    const int commits = hooks();
    const std::int64_t held = held_seq(read_bytes(log));
    std::string landed;
    if (commits == 0) {
      landed = "before the run's first commit (compiling)";
      ++landed_before;
    } else if (!now.count(held)) {
      landed = fmt::format("inside commit #{} (seq {} rolled back)", commits, held);
      ++landed_inside;
    } else {
      landed = fmt::format("after commit #{} (evaluating, compiling)", commits);
      ++landed_after;
    }
    lines.push_back(fmt::format("{:4} {:<10} {:<48} {:>5} -> {}", k + 1, moment, landed, committed.size(), now.size()));
    committed = now;
  }
  const Ran last = run(args(work), dir.path());
  ASSERT_EQ(last.rc, 0) << last.err;
  const double killed_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto t1 = Clock::now();
  const Ran whole = run(args(ref), dir.path());
  ASSERT_EQ(whole.rc, 0) << whole.err;
  const double whole_s = std::chrono::duration<double>(Clock::now() - t1).count();

  ASSERT_EQ(integrity_check(work), "ok");
  const auto final_rows = committed_rows(work), ref_rows = committed_rows(ref);
  for (const auto& [seq, row] : committed) ASSERT_EQ(final_rows.at(seq), row);
  std::map<std::string, std::string> killed_status, ref_status;
  for (const auto& [seq, r] : final_rows)
    if (r.phase == "search") {
      EXPECT_TRUE(killed_status.emplace(r.config, r.status).second) << "twice: " << r.config;
    }
  for (const auto& [seq, r] : ref_rows)
    if (r.phase == "search") ref_status.emplace(r.config, r.status);
  EXPECT_EQ(killed_status.size(), static_cast<std::size_t>(kBudget));
  EXPECT_EQ(killed_status, ref_status) << "the same configs, with the same outcomes";

  Store ks = Store::open(work, Store::Mode::kReadOnly), rs = Store::open(ref, Store::Mode::kReadOnly);
  const auto kr = ks.ranking(*ks.find_campaign("k")), rr = rs.ranking(*rs.find_campaign("k"));
  ASSERT_EQ(kr.size(), 5u);
  ASSERT_EQ(rr.size(), 5u);
  std::printf("kill aimed at  %-48s committed before -> after\n", "landed");
  for (const auto& l : lines) std::printf("%s\n", l.c_str());
  std::printf("rank  killed+resumed µs  uninterrupted µs   diff  same config\n");
  for (std::size_t i = 0; i < 5; ++i) {
    const double a = kr[i].entry.median_us, b = rr[i].entry.median_us;
    std::printf("%4zu  %17.2f  %16.2f  %+5.1f%%  %s\n", i + 1, a, b, (a / b - 1) * 100,
                kr[i].config == rr[i].config ? "yes" : "no");
    EXPECT_LT(std::abs(a / b - 1), 0.10) << "rank " << i + 1 << " differs beyond timing noise";
  }
  std::printf("20 kills (%d before a run's first commit, %d inside a commit, %d after one) then a resume: %.1f s; "
              "the uninterrupted run: %.1f s\n",
              landed_before, landed_inside, landed_after, killed_s, whole_s);
  EXPECT_GE(landed_before, 3);
  EXPECT_GE(landed_inside, 3);
  EXPECT_GE(landed_after, 3);
}

}  // namespace
}  // namespace test_planted_faults_and_gpu_kills
}  // namespace attntune::reliability

// The GPU and build workers of the in-process campaign are this executable (see the top).
int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "build-worker") return attntune::run_build_worker(0, 1);
  if (argc >= 4 && std::string(argv[1]) == "worker" && std::string(argv[2]) == "--device")
    return attntune::run_gpu_worker(std::atoi(argv[3]), 0, 1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
