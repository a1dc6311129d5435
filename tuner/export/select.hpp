// Which recorded results an export holds, and the search spaces to render them with. The space of
// a campaign comes from the database (the YAML text it stored), so exporting needs no file of the
// tuning machine; a campaign from an older database, which stored only the space's hash, needs
// --space FILE, checked against that hash.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "core/record_stores.hpp"
#include "export/export.hpp"

namespace attntune {

struct ExportQuery {
  // Exactly one of: a campaign's best, a problem's best across campaigns, or every problem's best.
  std::optional<std::string> campaign;
  std::optional<Problem> problem;
  bool all_best = false;
  int rank = 1;                            // 1-based, campaign or problem only
  std::optional<DType> dtype;              // all_best: only this dtype's problems
  std::optional<std::string> arch;         // only results measured on this arch ("sm_90")
  // Only results measured on this GPU model; needed when the selected results span several (an
  // H100's times never rank against an H200's).
  std::optional<std::string> gpu;
  // Without `gpu`: a problem whose results span several models is answered for this machine's GPU
  // model (cuda::first_device_name, asked only then) when it is among them, instead of refused (the
  // shipped database's answers).
  bool this_gpu_first = false;
  // all_best: only these problems (export --plan: a model's plan); nullopt: every problem.
  std::optional<std::vector<Problem>> only;
  std::optional<std::string> space_file;   // for campaigns stored without their space's YAML
};

// Which of `models` (the GPU models a problem's results were measured on, Store::result_gpus) answers
// when the user named none: the only one; else `prefer` when it is among them (the shipped database:
// this machine's GPU, cuda::first_device_name); else nullopt, and the caller refuses, naming them.
std::optional<std::string> pick_gpu_model(const std::vector<std::string>& models,
                                          const std::optional<std::string>& prefer);

// InputError (exit 2): an unknown campaign, --rank < 1, an --all-best over two dtypes or archs
// without --dtype/--arch, results of several GPU models without --gpu, a missing or mismatching --space. WorkError (exit 1): no ok result, or
// fewer than --rank. Items come best first; for all_best one per problem, in campaign order.
std::vector<ExportItem> select_for_export(ResultReader& results, const ExportQuery& query);

// Those of `problems` that have no ok result among what `query` selects by GPU model and arch (in
// their order): what the shipped database may answer (docs/design/shipped_db.md).
std::vector<Problem> problems_without_results(ResultReader& results, const ExportQuery& query,
                                              const std::vector<Problem>& problems);

}  // namespace attntune
