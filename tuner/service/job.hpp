// One campaign as `tune` and `serve` both run it: the request (spaces and tune options, as queued
// in the database or given on tune's command line) turned into the search options, the GPU
// runner's options, the campaign's record and its warm start. One place, so a queued campaign runs
// exactly as the same `tune` command would.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/queue_records.hpp"
#include "core/record_stores.hpp"
#include "eval/gpu_runner.hpp"
#include "search/campaign.hpp"
#include "search/progress.hpp"
#include "space/search_space.hpp"

namespace attntune::service {

// Where and how candidates are built and run; not part of a campaign's record.
struct RunnerSettings {
  int device = 0;
  int jobs = 0;  // concurrent NVRTC compiles; 0: one per core
  double compile_timeout_s = 120, deadline_floor_s = 10;
};

// The spaces, parsed, and pointers to them in family order.
struct JobSpaces {
  std::vector<SearchSpace> loaded;
  std::vector<const SearchSpace*> sorted;
  bool mixed() const { return sorted.size() > 1; }
};
// From files (tune --space): InputError for two of one family or the same space twice.
JobSpaces load_space_files(const std::vector<std::string>& paths, const char* command);
// From a request's texts (a queued campaign needs no files).
JobSpaces parse_request_spaces(const JobRequest& request);
// The request's spaces as the campaign records them.
std::vector<CampaignSpace> campaign_spaces(const JobSpaces& spaces);

// The spaces of the families that serve `problem` (shipped with the binary: search_spaces/),
// sorted by family; a worker later drops those its GPU cannot run.
std::vector<CampaignSpace> default_spaces(const Problem& problem);
// Those of `spaces` that a GPU of `arch` runs for `problem` (wgmma on Hopper only); each refused
// one's reason goes to `why_not` when given.
std::vector<CampaignSpace> runnable_spaces(const std::vector<CampaignSpace>& spaces, const Problem& problem,
                                           const std::string& arch, std::vector<std::string>* why_not = nullptr);

CampaignSpec campaign_spec(const std::string& name, const Problem& problem, const JobRequest& request);
// The default campaign name: TEMPLATE:PROBLEM:ARCH (tune), or TEMPLATE:PROBLEM (a queued one, whose
// arch is the serving GPU's).
std::string default_campaign_name(const std::vector<CampaignSpace>& spaces, const Problem& problem,
                                  const std::string& arch = "");

search::TuneOptions tune_options(const JobRequest& request, std::uint64_t space_size);
GpuRunnerOptions gpu_runner_options(const JobRequest& request, const RunnerSettings& settings,
                                    const std::atomic<bool>* cancel);

// How far apart two problems of the same head dim are, for warm starts.
double problem_distance(const Problem& a, const Problem& b);
// The best configs of the problems of `family` already tuned nearest to `problem` (this one
// included), and the nearest of them: up to kWarmStartProblems problems within kWarmStartReach of the
// nearest, their configs taken in turns (each one's best, nearest first, then each one's second, ...;
// duplicates skipped), `count` in all. A paged problem and a dense one never warm-start each other:
// their kernels read K and V apart; nor a packed batch (varlen) and any other problem. `best_us`, when
// given, gets the nearest's best time; `problems`, how many problems gave a config. `gpu`, the GPU
// model the campaign runs on (DeviceInfo::name; "" for any): a problem whose template has results on
// that model gives those alone, ranked by their own times (a database holding one problem tuned on
// an H200 and an H100 seeds an H100 campaign with the H100's pick, not with the H200's, whose times
// are all shorter); one with results on other models only gives theirs.
std::pair<std::optional<Problem>, std::vector<Config>> warm_start(ResultReader& results, const std::string& family,
                                                                  const Problem& problem, int count,
                                                                  double* best_us = nullptr,
                                                                  std::size_t* problems = nullptr,
                                                                  const std::string& gpu = "");
// Why more than the nearest: a neighbour's best is one search's pick, and where the neighbours were
// searched shallowly (the shipped file's 16-evaluation campaigns, runs 271-273) they all hold the same
// few configs, so the nearest alone hands on whatever its own warm start was; a build that measures
// some problems again at a larger budget (build_shipped_db.sh --remeasure) reaches the problems
// around them only if their bests are taken too, beside the nearest's (its own earlier result, at
// distance 0). Reach 2.0: a neighbour at twice or half the length, or at the other causality.
inline constexpr std::size_t kWarmStartProblems = 3;
inline constexpr double kWarmStartReach = 2.0;
// Where a family's warm start comes from when `results` has no tuned neighbour for it: tune's
// shipped database (docs/design/shipped_db.md), opened on first use; it returns nullptr when there
// is none. `label` names it in the progress line ("the shipped database").
struct WarmStartFallback {
  std::function<ResultReader*()> open;
  std::string label;
};
// The device a campaign runs on, as the launch plans' predictions need it (Family::plan_moves).
struct WarmStartDevice {
  int sm_count = 0;  // 0: unknown (no predictions)
  std::function<std::string(const std::string& family)> arch_for;  // a family's build arch there
};

// Each family's warm start into topts, said on `progress` as it is found (with where it came from
// when that is the fallback). Several families whose nearest tuned problem is the same one, in the
// same database: their best times there go to topts.warm_start_best_us (the warm-up's order and
// length, search::AllocationOptions), and a family it puts far behind is said.
// `gpu`: the campaign's GPU model, as warm_start takes it. `device`: where given, the moves the
// family's launch plan predicts pay from the first warm config (Family::plan_moves) come right
// after it, the warm start's last configs giving way, and are said.
void add_warm_starts(search::TuneOptions& topts, ResultReader& results, const JobSpaces& spaces,
                     const Problem& problem, int count, search::Progress& progress,
                     const WarmStartFallback* fallback = nullptr, const std::string& gpu = "",
                     const WarmStartDevice* device = nullptr);

// Each space's valid configs for the problem on the runner's arch (WorkError when one has none);
// `sizes` gets "family N" per space.
std::uint64_t count_valid(const JobSpaces& spaces, const Problem& problem, search::Runner& runner,
                          std::vector<std::string>* sizes = nullptr);

}  // namespace attntune::service
