// Helpers for the `tune` tests: a synthetic recorded campaign (a landscape over the real
// flash_fwd_mma space, with failures) that `tune --simulate-db` answers from, and running the
// binary as a child we can signal.
#pragma once
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../../common/run_attntune.hpp"
#include "../db/db_test_util.hpp"
#include "core/hash.hpp"
#include "db/store.hpp"
#include "families/family.hpp"
#include "space/search_space.hpp"

namespace attntune::test {

inline std::string space_file() { return std::string(ATTNTUNE_SOURCE_DIR) + "/search_spaces/flash_fwd_mma.yaml"; }
inline const char* kProblem = "b=4,h=16,s=4096,d=128,dtype=bf16,causal=0";

// A campaign of `space` for `problem` named `name`, as the tune tests open one.
inline CampaignSpec campaign_spec(const SearchSpace& space, const Problem& problem, const std::string& name,
                                  const std::string& strategy, std::int64_t budget_evals = 0) {
  CampaignSpec spec;
  spec.name = name;
  spec.problem = problem;
  spec.space_path = space.path();
  spec.space_hash = space.hash();
  spec.space_text = space.text();
  spec.family = space.family();
  spec.strategy = strategy;
  spec.budget_evals = budget_evals;
  return spec;
}

// A recorded ok result of `t` µs for `problem`, as the synthetic recordings file it.
inline EvalRecord recorded_ok(double t, const Problem& problem) {
  EvalRecord r;
  r.status = "ok";
  r.median_us = t;
  r.min_us = t * 0.99;
  r.max_us = t * 1.02;
  r.stdev_us = t * 0.005;
  r.tflops = problem.flops() / (t * 1e-6) / 1e12;
  r.max_abs_err = 1e-3;
  r.err_bound = 4e-3;
  r.count = 100;
  return r;
}

// Records every valid config of the space for `problem_spec` (kProblem) on sm_90 as campaign "rec": a smooth
// landscape with interactions, and failures where the config is extreme (as real ones are).
inline void make_recording(const std::string& path, const char* problem_spec = kProblem) {
  const SearchSpace space = SearchSpace::load(space_file());
  const Problem problem = Problem::parse(problem_spec);
  Store store = Store::open(path, Store::Mode::kCreate);
  const std::int64_t dev = store.upsert_device({"NVIDIA H200", "sm_90", "GPU-rec", 132, "580"});
  CampaignSpec spec;
  spec.name = "rec";
  spec.problem = problem;
  spec.space_path = "/tuning/machine/flash_fwd_mma.yaml";
  spec.space_hash = space.hash();
  spec.space_text = space.text();
  spec.family = space.family();
  spec.strategy = "exhaustive";
  const std::int64_t c = store.open_campaign(spec, dev);
  for (const Config& cfg : space.enumerate(problem, "sm_90")) {
    const std::string key = config_str(cfg);
    const std::uint64_t h = std::hash<std::string>{}(key);
    EvalRecord r;
    if (h % 23 == 0) {
      r.status = "compile_error";
      r.error = "ptxas fatal: synthetic";
    } else if (h % 31 == 0) {
      r.status = "resources";
      r.error = "too many resources requested for launch";
    } else {
      double t = 1000;
      t *= 1 + 0.15 * std::abs(std::log2(double(std::get<std::int64_t>(cfg.at("block_n"))) / 64));
      t *= 1 + 0.10 * std::abs(std::log2(double(std::get<std::int64_t>(cfg.at("block_m"))) / 128));
      t *= 1 + 0.05 * double(h % 97) / 97;
      r = recorded_ok(t, problem);
    }
    store.record_evaluation(c, store.upsert_candidate(space.family(), cfg, content_hash(key)), dev, r);
  }
  store.finish_campaign(c, "completed", "space exhausted");
}

// A finished campaign `name` of `problem` in `db` (created if missing) whose rank 1 is `config` at
// `us` µs (one ok evaluation, a ranking of 6 rounds), as a tuned campaign's pick reads.
inline void ranked_campaign(const std::string& db, const SearchSpace& space, const Problem& problem,
                            const std::string& name, const Config& config, double us) {
  Store store = Store::open(db, Store::Mode::kCreate);
  const std::int64_t dev = store.upsert_device({"NVIDIA H200", "sm_90", "GPU-ref", 132, "580"});
  const std::int64_t c = store.open_campaign(campaign_spec(space, problem, name, "evo", 200), dev);
  const std::int64_t cand = store.upsert_candidate(space.family(), config, "src-" + name);
  store.record_evaluation(c, cand, dev, recorded_ok(us, problem));
  RankingEntry e;
  e.candidate_id = cand;
  e.median_us = us;
  e.rounds = 6;
  store.put_ranking(c, dev, {e});
  store.finish_campaign(c, "completed", "budget");
}

// `attntune ARGS...` as a child process (no shell), stdout and stderr to files.
class TuneProcess {
 public:
  TuneProcess(const std::vector<std::string>& args, const std::string& log) {
    pid_ = ::fork();
    if (pid_ == 0) {
      FILE* f = std::fopen(log.c_str(), "a");
      if (f) {
        ::dup2(fileno(f), 1);
        ::dup2(fileno(f), 2);
      }
      std::vector<std::string> argv{testing::attntune_bin()};
      argv.insert(argv.end(), args.begin(), args.end());
      std::vector<char*> p;
      for (auto& a : argv) p.push_back(a.data());
      p.push_back(nullptr);
      ::execv(p[0], p.data());
      ::_exit(127);
    }
  }
  void signal(int sig) { ::kill(pid_, sig); }
  // Exit code, or 128 + signal.
  int wait() {
    int st = 0;
    ::waitpid(pid_, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }

 private:
  pid_t pid_ = -1;
};

}  // namespace attntune::test
