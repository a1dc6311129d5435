// Reliability, part 10d (docs/RELIABILITY.md, "Faults injected at every step"; issue 46): a GPU
// worker whose CUDA context dies at each phase of a candidate's evaluation. The context-fault family
// (context_faults.yaml, registered in this process as planted_faults.hpp registers its family)
// renders real flash_fwd_mma candidates whose entry point is wrapped: the real kernel runs as a
// device function between a prologue and an epilogue that end the context at the phase the config
// names, counting the module's launches and reading the GPU's clock:
//
//   load        the module cannot load (a 1 TiB __device__ array: CUDA_ERROR_OUT_OF_MEMORY)
//   launch      the first launch faults before it writes anything (a store to an unmapped address)
//   validation  the first launch faults once it has written its output (__trap after the body)
//   timing      the first timed launch traps (the second launch of the module: validation is one)
//   final       a launch of a module alive for more than 0.5 s traps: only the final re-timing
//               samples that long (the search times for at most 0.05 s here), so the candidate
//               passes its search and dies in the final ranking's re-timing
//
// One campaign over all 24 candidates (4 good ones x 6 phases) through the real machinery
// (run_campaign, the GpuRunner: the BuildPool, the Evaluator and its worker, the store), cut at 14
// evaluations and resumed to the end. Every candidate gets the status its phase must give, the
// worker is replaced after each death and the rest go on, the ranking holds the 4 healthy ones only,
// nothing committed is lost or written twice, and the database passes SQLite's integrity check.
//
// On the CPU (CI): the wrapper around a small kernel builds with NVRTC for every phase. The GPU test
// skips without a GPU; the lead runs it:
//   ctest --test-dir build -L gpu -R ReliabilityContextFaultsGpu --output-on-failure
#include <gtest/gtest.h>

#include <set>

#include "cuda/driver.hpp"
#include "eval/build_pool.hpp"
#include "eval/gpu_runner.hpp"
#include "fault_util.hpp"
#include "families/family.hpp"
#include "search/campaign.hpp"
#include "space/search_space.hpp"
#include "tests/gpu/gpu_env.hpp"
#include "tests/unit/eval/fault_kernels.hpp"

namespace attntune::reliability {
namespace test_context_faults {
namespace {

using namespace std::chrono_literals;

const char* kProblem = "b=2,h=4,s=512,d=64,dtype=bf16,causal=0";
const std::vector<std::string> kPhases = {"none", "load", "launch", "validation", "timing", "final"};

std::string context_space_path() { return source_dir() + "/tests/reliability/context_faults.yaml"; }

// The entry point `flash_fwd_mma(const AttnParams p)` of `src` turned into a device function,
// called from a new entry point that ends the context at `phase` (see the top).
std::string wrap_entry(const std::string& src, const std::string& phase) {
  const std::string sig = "flash_fwd_mma(const AttnParams p) {";
  const std::size_t at = src.find(sig);
  if (at == std::string::npos || src.find(sig, at + 1) != std::string::npos)
    throw std::logic_error("the source has not exactly one flash_fwd_mma entry point");
  const std::size_t ext = src.rfind("extern \"C\" __global__ void", at);
  if (ext == std::string::npos) throw std::logic_error("the entry point is not extern \"C\" __global__");
  const std::string decl = "extern \"C\" __global__ void";
  const std::string bounds = src.substr(ext + decl.size(), at - ext - decl.size());  // __launch_bounds__(...) or ""
  std::string out = src.substr(0, ext) + "__device__ __forceinline__ void flash_fwd_mma_body(const AttnParams p) {" +
                    src.substr(at + sig.size());
  const bool in_att = src.find("namespace att {") != std::string::npos;
  out += fmt::format(R"(
// ---- test-only: the context dies at phase '{0}' (tests/reliability/test_context_faults.cpp) ----
{1}
__device__ unsigned long long att_fault_launches;  // this module's launches (each evaluation loads it anew)
__device__ unsigned long long att_fault_start;     // the GPU clock at its first launch
{2}
extern "C" __global__ void{3}flash_fwd_mma(const AttnParams p) {{
  const bool lead = threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
  unsigned long long n = 0, now = 0;
  if (lead) {{
    n = atomicAdd(&att_fault_launches, 1ull);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (n == 0) att_fault_start = now;
  }}
  if ({4} && lead && n == 0) *reinterpret_cast<volatile int*>(0x10) = 1;  // launch
  if ({5} && lead && n == 1) __trap();                                     // timing
  if ({6} && lead && n > 0 && now - att_fault_start > 500000000ull) __trap();  // final
  if ({7}) att_fault_huge[p.batch & 1] = 1;                                  // load
  flash_fwd_mma_body(p);
  if ({8} && lead && n == 0) {{ __threadfence(); __trap(); }}              // validation
}}
{9}
)",
                     phase, in_att ? "namespace att {" : "",
                     phase == "load" ? "__device__ char att_fault_huge[1ull << 40];" : "__device__ char att_fault_huge[2];",
                     bounds, phase == "launch" ? "true" : "false", phase == "timing" ? "true" : "false",
                     phase == "final" ? "true" : "false", phase == "load" ? "true" : "false",
                     phase == "validation" ? "true" : "false", in_att ? "}  // namespace att" : "");
  return out;
}

// What the hook renders from.
struct ContextSetup {
  const SearchSpace* flash = nullptr;
  std::vector<Config> good;  // 4 valid flash_fwd_mma configs spread over the space
};
ContextSetup& context_setup() {
  static ContextSetup s;
  return s;
}

RenderedKernel render_context_fault(const SearchSpace& space, const Config& c, const Problem& p, const std::string& arch) {
  if (auto why = space.check(c, p, arch)) throw InputError("context_faults: " + config_str(c) + ": " + *why);
  const ContextSetup& s = context_setup();
  RenderedKernel k = render_kernel(*s.flash, s.good.at(static_cast<std::size_t>(std::get<std::int64_t>(c.at("good")))), p, arch);
  const std::string& phase = std::get<std::string>(c.at("fault"));
  if (phase != "none") k.source = wrap_entry(k.source, phase);
  k.source = fmt::format("// context fault {}\n", phase) + k.source;
  k.source_hash = content_hash(k.source);
  return k;
}

void setup_context_family(const SearchSpace& flash, const Problem& p, const std::string& arch) {
  ContextSetup& s = context_setup();
  s.flash = &flash;
  const std::vector<Config> all = flash.enumerate(p, arch);
  s.good.clear();
  for (std::size_t i = 0; i < 4; ++i) s.good.push_back(all.at(i * all.size() / 4));
  static const bool registered = [] {
    register_test_family("context_faults", render_context_fault);
    return true;
  }();
  (void)registered;
}

TEST(ReliabilityContextFaults, TheWrapperOfEveryPhaseBuildsWithNvrtc) {
  // Around a small kernel of the same entry point (tests/data/faults/unwritten.cu), every phase's
  // wrapper compiles; the flash_fwd_mma candidates of the GPU test are the same text around the real
  // kernel, which renders with exactly one entry point to wrap.
  const SearchSpace flash = SearchSpace::load(source_dir() + "/search_spaces/flash_fwd_mma.yaml");
  const Problem problem = Problem::parse(kProblem);
  const RenderedKernel real = render_kernel(flash, flash.enumerate(problem, "sm_90").front(), problem, "sm_90");
  for (const std::string& phase : kPhases) {
    if (phase == "none") continue;
    const std::string wrapped = wrap_entry(real.source, phase);
    EXPECT_NE(wrapped.find("void flash_fwd_mma_body(const AttnParams p)"), std::string::npos);
    EXPECT_EQ(count_of(wrapped, "flash_fwd_mma(const AttnParams p)"), 1u) << "one entry point, the wrapper";
  }
  BuildPoolOptions o;
  o.jobs = 2;
  o.compile_timeout = 300s;
  o.nvrtc_options = family_nvrtc_options("flash_fwd_mma");  // what a test family gets too
  o.worker_argv = {testing::attntune_bin(), "build-worker"};
  BuildPool pool(o);
  const RenderedKernel small = testing::render_fault(source_dir(), "unwritten.cu", 64);
  std::map<std::uint64_t, std::string> phase_of;
  for (const std::string& phase : kPhases) {
    if (phase == "none") continue;
    RenderedKernel k = small;
    k.source = wrap_entry(small.source, phase);
    k.source_hash = content_hash(k.source);
    phase_of[pool.submit(BuildJob{Config{{"fault", phase}}, k, "sm_90"})] = phase;
  }
  // And one real candidate, wrapped as the GPU test wraps it (the launch bounds and the namespace
  // of the real kernel): the wrapper of `final`, which reads the clock.
  RenderedKernel wrapped = real;
  wrapped.source = wrap_entry(real.source, "final");
  wrapped.source_hash = content_hash(wrapped.source);
  phase_of[pool.submit(BuildJob{Config{{"fault", std::string("final")}}, wrapped, "sm_90"})] = "final (flash_fwd_mma)";
  int built = 0;
  while (auto out = pool.next()) {
    EXPECT_EQ(out->build.status, "ok") << phase_of[out->ticket] << ": " << out->build.log.substr(0, 2000);
    ++built;
  }
  EXPECT_EQ(built, 6);
}

TEST(ReliabilityContextFaultsGpu, AWorkerWhoseContextDiesAtEachPhaseLosesNothingAndTheCampaignCompletes) {
  ATTNTUNE_REQUIRE_GPU();
  TempDir dir;
  const cuda::DeviceProps props = cuda::device_props(0);
  const SearchSpace flash = SearchSpace::load(source_dir() + "/search_spaces/flash_fwd_mma.yaml");
  const Problem problem = Problem::parse(kProblem);
  setup_context_family(flash, problem, props.arch);
  const SearchSpace space = SearchSpace::load(context_space_path());
  ASSERT_EQ(space.enumerate(problem, props.arch).size(), 24u);

  const std::string db = dir.file("context.db");
  CampaignSpec spec;
  spec.name = "context";
  spec.problem = problem;
  spec.space_path = space.path();
  spec.space_hash = space.hash();
  spec.space_text = space.text();
  spec.family = space.family();
  spec.strategy = "exhaustive";
  GpuRunnerOptions ro;
  ro.compile_timeout = 60s;
  ro.deadline_floor_s = 5;
  ro.timing.max_seconds = 0.05;      // the search's timing: well under the 0.5 s of `final`
  ro.final_timing.min_seconds = 1.0;  // the final re-timing's: well over it
  search::TuneOptions to;
  to.strategy = "exhaustive";
  to.final_top = 8;  // every candidate that passes the search is a finalist (4 none + 4 final)
  to.final_rounds = 2;
  search::Progress progress(std::cerr, false, 15s);

  const auto t0 = Clock::now();
  std::map<std::int64_t, CommittedRow> first_run;
  {
    // The first run stops at 14 evaluations; the next run completes the campaign.
    Store store = Store::open(db, Store::Mode::kCreate);
    GpuRunner runner(space, problem, &store, ro);
    search::TuneOptions cut = to;
    cut.budget_evals = 14;
    cut.final_top = 0;
    const search::TuneResult r = search::run_campaign(store, runner, space, spec, cut, progress, {});
    EXPECT_EQ(r.evaluations, 14) << r.stop_reason;
  }
  ASSERT_EQ(integrity_check(db), "ok");
  first_run = committed_rows(db);
  ASSERT_EQ(first_run.size(), 14u);
  search::TuneResult result;
  {
    Store store = Store::open(db, Store::Mode::kExisting);
    GpuRunner runner(space, problem, &store, ro);
    result = search::run_campaign(store, runner, space, spec, to, progress, {});
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(result.status, "completed") << result.stop_reason;
  EXPECT_EQ(result.evaluations, 24);

  ASSERT_EQ(integrity_check(db), "ok");
  EXPECT_EQ(written_twice(db), 0);
  const auto rows = committed_rows(db);
  for (const auto& [seq, row] : first_run) {
    ASSERT_TRUE(rows.count(seq)) << "evaluation " << seq << " of the first run lost";
    EXPECT_EQ(rows.at(seq), row) << "evaluation " << seq << " of the first run changed";
  }
  Store store = Store::open(db, Store::Mode::kReadOnly);
  const std::int64_t id = *store.find_campaign("context");
  const std::vector<EvaluationRow> evals = store.campaign_evaluations(id);
  ASSERT_EQ(evals.size(), 24u);
  std::map<std::string, std::map<std::string, int>> got;  // phase -> status -> count
  std::set<std::string> seen;
  for (const EvaluationRow& e : evals) {
    const std::string phase = std::get<std::string>(e.config.at("fault"));
    EXPECT_TRUE(seen.insert(config_str(e.config)).second) << "evaluated twice: " << config_str(e.config);
    ++got[phase][e.record.status];
    const std::string& s = e.record.status;
    if (phase == "none" || phase == "final") {
      EXPECT_EQ(s, "ok") << config_str(e.config) << ": " << e.record.error;
    } else if (phase == "load") {
      EXPECT_TRUE(s == "launch_error" || s == "resources") << s << ": " << e.record.error;
    } else {
      EXPECT_EQ(s, "crashed") << config_str(e.config) << ": " << e.record.error;
    }
  }
  // The final ranking: the four healthy candidates; the four `final` ones died in their re-timing.
  const std::vector<RankedRow> ranking = store.ranking(id);
  EXPECT_EQ(ranking.size(), 4u);
  for (const RankedRow& r : ranking) EXPECT_EQ(std::get<std::string>(r.config.at("fault")), "none");
  std::int64_t final_crashed = 0;
  for (const auto& [seq, row] : rows)
    if (row.phase == "final" && row.status == "crashed") ++final_crashed;
  EXPECT_GE(final_crashed, 4) << "each `final` candidate died in the re-timing";

  std::printf("context faults on %s: 24 candidates (14, then a resume) in %.1f s\n", props.name.c_str(), seconds);
  std::printf("%-11s %s\n", "phase", "search statuses");
  for (const std::string& phase : kPhases) {
    std::string line;
    for (const auto& [status, n] : got[phase]) line += fmt::format("{}{} x{}", line.empty() ? "" : ", ", status, n);
    std::printf("%-11s %s\n", phase.c_str(), line.c_str());
  }
  std::printf("final re-timing: %lld crashed re-timings (the `final` phase), ranking of %zu (all `none`); nothing "
              "lost, nothing twice, integrity ok\n",
              static_cast<long long>(final_crashed), ranking.size());
}

}  // namespace
}  // namespace test_context_faults
}  // namespace attntune::reliability
