// Evaluator throughput (issue 4): candidates evaluated per minute over a fixed sample of the
// flash_fwd_mma space for one problem, builds running ahead in the compile pool, and the share of
// wall time the GPU sat idle waiting for a build. Not a test: run it on the GPU machine.
//   bench_evaluator ATTNTUNE_BIN SPACE.yaml PROBLEM [N=64] [JOBS=all cores]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "eval/build_pool.hpp"
#include "eval/evaluator.hpp"

using namespace attntune;

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s ATTNTUNE_BIN SPACE.yaml PROBLEM [N] [JOBS]\n", argv[0]);
    return 2;
  }
  try {
    const std::string bin = argv[1];
    const SearchSpace space = SearchSpace::load(argv[2]);
    const Problem problem = Problem::parse(argv[3]);
    const std::size_t n = argc > 4 ? std::stoul(argv[4]) : 64;
    const int jobs = argc > 5 ? std::stoi(argv[5]) : static_cast<int>(std::thread::hardware_concurrency());

    EvaluatorOptions eo;
    eo.worker_argv = {bin, "worker", "--device", "0"};
    Evaluator evaluator(eo);
    const std::string arch = evaluator.device().arch;
    std::vector<Config> all = space.enumerate(problem, arch);
    std::vector<Config> sample;
    for (std::size_t i = 0; i < std::min(n, all.size()); ++i) sample.push_back(all[i * all.size() / std::min(n, all.size())]);

    BuildPoolOptions bo;
    bo.nvrtc_options = family_nvrtc_options(space.family());
    bo.jobs = jobs;
    bo.worker_argv = {bin, "build-worker"};
    const auto t0 = std::chrono::steady_clock::now();
    BuildPool pool(bo);
    for (const auto& c : sample) pool.submit({c, render_kernel(space, c, problem, arch), arch});

    std::map<std::string, int> by_status;
    double gpu_busy_s = 0, best_us = 0;
    std::string best;
    while (auto built = pool.next()) {
      EvalRecord rec;
      if (built->build.status != "ok") {
        rec = build_failure_record(built->build);
      } else {
        EvalRequest req;
        req.cubin = built->build.cubin;
        req.launch = built->job.kernel.launch;
        req.problem = problem;
        const EvalOutcome out = evaluator.evaluate(req);
        gpu_busy_s += out.wall_s;
        rec = out.record;
      }
      ++by_status[rec.status];
      if (rec.status == "ok" && (best.empty() || *rec.median_us < best_us)) {
        best_us = *rec.median_us;
        best = config_str(built->job.config);
      }
    }
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("problem %s on %s (%s), %zu candidates, %d compile jobs\n", problem.str().c_str(),
                evaluator.device().name.c_str(), arch.c_str(), sample.size(), pool.jobs());
    for (const auto& [s, c] : by_status) std::printf("  %-18s %d\n", s.c_str(), c);
    std::printf("wall %.1f s: %.1f candidates/min; GPU worker busy %.1f s; waited for builds %.1f s (%.0f%% of wall)\n",
                wall, 60.0 * sample.size() / wall, gpu_busy_s, pool.waited_seconds(), 100.0 * pool.waited_seconds() / wall);
    if (!best.empty()) std::printf("best %.1f us (%.1f TFLOP/s): %s\n", best_us, problem.flops() / best_us / 1e6, best.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_evaluator: %s\n", e.what());
    return 1;
  }
}
