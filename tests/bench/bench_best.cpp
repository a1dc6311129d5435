// How fast `best` answers on a large database: fills a fresh one with 100,000 evaluations (8
// campaigns over 4 problems, ~30% failures), then times the queries `attntune best` runs, opening the
// database read-only each time as the command does. Target: < 50 ms each.
//
//   bench_best [--evals N] [--runs R] [--keep FILE.db]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "db/store.hpp"

using namespace attntune;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr double kTargetMs = 50;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

std::vector<Config> config_grid() {
  std::vector<Config> out;
  for (std::int64_t bm : {32, 64, 128, 256})
    for (std::int64_t bn : {32, 64, 128, 256})
      for (std::int64_t stages : {1, 2, 3, 4})
        for (std::int64_t warps : {4, 8})
          for (bool swizzle : {false, true})
            out.push_back({{"block_m", bm},
                           {"block_n", bn},
                           {"stages", stages},
                           {"num_warps", warps},
                           {"swizzle", swizzle},
                           {"pipeline", std::string(stages > 1 ? "cp_async" : "sync")}});
  return out;
}

struct Filled {
  std::vector<Problem> problems;
  std::vector<std::string> campaigns;
  int failures = 0;
};

Filled fill(const std::string& path, int evals) {
  static const char* kFailures[] = {"compile_error", "resources",    "launch_error",    "crashed",
                                    "timeout",       "wrong_result", "nan_or_unwritten"};
  Filled f;
  for (const char* spec :
       {"b=4,h=16,s=4096,d=128,dtype=bf16,causal=1", "b=4,h=16,s=4096,d=128,dtype=bf16,causal=0",
        "b=8,h=32,hkv=8,s=2048,d=64,dtype=fp16,causal=1", "b=1,h=16,s=16384,d=128,dtype=bf16,causal=1"})
    f.problems.push_back(Problem::parse(spec));
  Store store = Store::open(path, Store::Mode::kCreate);
  const std::int64_t device = store.upsert_device({"NVIDIA H100 80GB HBM3", "sm_90", "GPU-bench", 132, "550.54"});
  std::vector<std::int64_t> ids;
  for (std::size_t i = 0; i < f.problems.size() * 2; ++i) {
    CampaignSpec s;
    s.name = "bench-" + std::to_string(i);
    s.problem = f.problems[i / 2];
    s.space_path = "search_spaces/flash_fwd_mma.yaml";
    s.space_hash = "00112233445566778899aabbccddeeff";
    s.family = "flash_fwd_mma";
    s.strategy = i % 2 ? "random" : "evo";
    s.seed = static_cast<std::int64_t>(i);
    ids.push_back(store.open_campaign(s, device));
    f.campaigns.push_back(s.name);
  }
  const std::vector<Config> grid = config_grid();
  std::vector<std::int64_t> candidates;
  for (const Config& c : grid) candidates.push_back(store.upsert_candidate("flash_fwd_mma", c, "src-v1"));

  std::mt19937_64 rng(20250131);
  std::uniform_real_distribution<double> unit(0, 1);
  std::vector<double> base(grid.size());
  for (double& b : base) b = 400 + 1600 * unit(rng);
  for (int i = 0; i < evals; ++i) {
    const std::size_t c = static_cast<std::size_t>(i) % ids.size();
    const std::size_t k = static_cast<std::size_t>(rng() % grid.size());
    EvalRecord e;
    if (unit(rng) < 0.3) {
      e.status = kFailures[rng() % std::size(kFailures)];
      e.error = "synthetic failure " + std::to_string(i);
      ++f.failures;
    } else {
      const double median = base[k] * (1 + 0.02 * unit(rng)) / (1 + 0.1 * static_cast<double>(c % 2));
      e.status = "ok";
      e.median_us = median;
      e.min_us = median * 0.99;
      e.max_us = median * 1.03;
      e.stdev_us = median * 0.005;
      e.tflops = f.problems[c / 2].flops() / (median * 1e-6) / 1e12;
      e.max_abs_err = 1e-3 * unit(rng);
      e.err_bound = 1e-2;
      e.count = 50;
    }
    store.record_evaluation(ids[c], candidates[k], device, e);
  }
  return f;
}

struct Timing {
  double median_ms, min_ms;
  std::size_t rows;
};

Timing time_runs(int runs, const std::function<std::size_t()>& body) {
  std::vector<double> ms;
  std::size_t rows = 0;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = Clock::now();
    rows = body();
    ms.push_back(ms_since(t0));
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), rows};
}

}  // namespace

int main(int argc, char** argv) {
  int evals = 100000, runs = 9;
  std::string keep;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--evals" && i + 1 < argc)
      evals = std::atoi(argv[++i]);
    else if (a == "--runs" && i + 1 < argc)
      runs = std::atoi(argv[++i]);
    else if (a == "--keep" && i + 1 < argc)
      keep = argv[++i];
    else {
      std::fprintf(stderr, "usage: bench_best [--evals N] [--runs R] [--keep FILE.db]\n");
      return 2;
    }
  }
  if (evals < 1 || runs < 1) {
    std::fprintf(stderr, "bench_best: --evals and --runs must be at least 1\n");
    return 2;
  }

  std::string dir_template = (fs::temp_directory_path() / "attntune-bench-XXXXXX").string();
  if (!::mkdtemp(dir_template.data())) {
    std::perror("mkdtemp");
    return 1;
  }
  const fs::path dir = dir_template;
  const std::string path = keep.empty() ? (dir / "bench.db").string() : keep;
  if (!keep.empty()) fs::remove(keep);

  try {
    const auto t0 = Clock::now();
    const Filled f = fill(path, evals);
    const double fill_s = ms_since(t0) / 1000;
    std::printf(
        "filled %d evaluations (%zu campaigns, %zu problems, %.1f%% failed) in %.1f s: %.0f evaluations/s, "
        "one transaction each; database %.1f MB\n",
        evals, f.campaigns.size(), f.problems.size(), 100.0 * f.failures / evals, fill_s, evals / fill_s,
        static_cast<double>(fs::file_size(path)) / 1e6);

    struct Case {
      std::string name;
      BestQuery query;
    };
    std::vector<Case> cases;
    {
      BestQuery q;
      q.problem = f.problems[0];
      cases.push_back({"best --problem P", q});
      q.top = 10;
      cases.push_back({"best --problem P --top 10", q});
      BestQuery c;
      c.campaign = f.campaigns[3];
      cases.push_back({"best --campaign C", c});
      c.top = 10;
      cases.push_back({"best --campaign C --top 10", c});
      BestQuery all;
      all.top = 10;
      cases.push_back({"best --top 10 (every campaign)", all});
    }

    std::printf("\n%-34s %14s %14s %14s  %s\n", "query (median of runs)", "open+query ms", "query ms", "min query ms",
                "rows");
    bool met = true;
    auto report = [&](const std::string& name, const Timing& open_and_query, const Timing& query) {
      met = met && open_and_query.median_ms < kTargetMs;
      std::printf("%-34s %14.3f %14.3f %14.3f  %zu\n", name.c_str(), open_and_query.median_ms, query.median_ms,
                  query.min_ms, query.rows);
    };
    Store shared = Store::open(path, Store::Mode::kReadOnly);
    for (const Case& c : cases) {
      const Timing cold =
          time_runs(runs, [&] { return Store::open(path, Store::Mode::kReadOnly).best(c.query).size(); });
      const Timing warm = time_runs(runs, [&] { return shared.best(c.query).size(); });
      report(c.name, cold, warm);
    }
    report("campaigns", time_runs(runs, [&] { return Store::open(path, Store::Mode::kReadOnly).campaigns().size(); }),
           time_runs(runs, [&] { return shared.campaigns().size(); }));
    std::printf("\ntarget: < %.0f ms per command (open + query): %s\n", kTargetMs, met ? "met" : "MISSED");
    if (keep.empty())
      fs::remove_all(dir);
    else
      fs::remove(dir);
    return met ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_best: %s\n", e.what());
    return 1;
  }
}
