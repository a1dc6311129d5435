// attntune merge A.db B.db ... -o OUT.db: combines the databases of several hosts (each serves its own,
// on its local disk) into one, without duplicates (db/merge.hpp, docs/design/merge.md). Merging an
// input again adds nothing; `merge LIVE.db -o COPY.db` copies a database that `serve` is writing.
// Progress goes to stderr, the result (a line per input, or --format json) to stdout.
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "cli/format.hpp"
#include "core/error.hpp"
#include "db/merge.hpp"

namespace attntune::cli::cmd_merge {
namespace {

constexpr const char* kSummary = "combine databases from several hosts into one, without duplicates";

std::string plural(std::int64_t n, const char* one, const char* many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

// "A.db: campaigns 2 added, 1 extended, 0 same, 1 renamed; 120 evaluations, 3 ranking rows, ..."
std::string summary_line(const MergeCounts& c) {
  std::string line = fmt::format("{}: campaigns {} added, {} extended, {} same, {} renamed; {} added", c.input,
                                 c.campaigns_added, c.campaigns_extended, c.campaigns_same, c.campaigns_renamed,
                                 plural(c.evaluations_added, "evaluation", "evaluations"));
  line += fmt::format(", {}, {}, {}, {}", plural(c.rankings_added, "ranking row", "ranking rows"),
                      plural(c.candidates_added, "candidate", "candidates"), plural(c.builds_added, "build", "builds"),
                      plural(c.devices_added, "device", "devices"));
  if (c.builds_replaced) line += fmt::format(" ({} failed build{} replaced by ok ones)", c.builds_replaced,
                                             c.builds_replaced == 1 ? "" : "s");
  line += fmt::format("; queue {} added, {} updated; {} updated", c.queue_added, c.queue_updated,
                      plural(c.gpus_updated, "gpu", "gpus"));
  if (c.nothing_added()) line += " (nothing new)";
  return line;
}

nlohmann::ordered_json to_json(const MergeCounts& c) {
  nlohmann::ordered_json renamed = nlohmann::ordered_json::array();
  for (const MergeRename& r : c.renamed)
    renamed.push_back({{"campaign", r.campaign}, {"stored_as", r.stored_as}, {"reason", r.reason}});
  return {{"input", c.input},
          {"campaigns",
           {{"added", c.campaigns_added},
            {"extended", c.campaigns_extended},
            {"same", c.campaigns_same},
            {"renamed", c.campaigns_renamed}}},
          {"renamed", renamed},
          {"evaluations_added", c.evaluations_added},
          {"rankings_added", c.rankings_added},
          {"candidates_added", c.candidates_added},
          {"builds_added", c.builds_added},
          {"builds_replaced", c.builds_replaced},
          {"devices_added", c.devices_added},
          {"queue_added", c.queue_added},
          {"queue_updated", c.queue_updated},
          {"gpus_updated", c.gpus_updated},
          {"nothing_added", c.nothing_added()}};
}

int run_merge(const std::vector<std::string>& args) {
  std::vector<std::string> inputs;
  std::string out, format = "table";
  po::options_description opts("options");
  // clang-format off
  opts.add_options()
      ("input", po::value(&inputs), "an input database (the positional arguments); read, never written")
      ("out,o", po::value(&out)->required(), "the merged database; created if missing (it must not be an input)")
      ("format", po::value(&format), "table | json: what each input added");
  // clang-format on
  po::variables_map vm;
  if (parse_args("merge", kSummary, opts, args, vm, {"input", "A.db B.db ...", -1})) return 0;
  const Format kind = parse_format(format, false);

  const std::vector<MergeCounts> report =
      merge_databases(inputs, out, [](const std::string& line) { std::cerr << line << '\n'; });

  std::int64_t renamed = 0;
  for (const MergeCounts& c : report) renamed += c.campaigns_renamed;
  if (kind == Format::kJson) {
    nlohmann::ordered_json doc = {{"out", out}, {"inputs", nlohmann::ordered_json::array()}};
    for (const MergeCounts& c : report) doc["inputs"].push_back(to_json(c));
    print_json(std::cout, doc);
  } else {
    for (const MergeCounts& c : report) {
      std::cout << summary_line(c) << '\n';
      for (const MergeRename& r : c.renamed)
        std::cout << fmt::format("  campaign '{}' stored as '{}': {}\n", r.campaign, r.stored_as, r.reason);
    }
  }
  std::cerr << fmt::format("merge: {} input{} merged into '{}'{}\n", report.size(), report.size() == 1 ? "" : "s",
                           out,
                           renamed ? fmt::format("; {} campaign{} stored under a new name (above)", renamed,
                                                 renamed == 1 ? "" : "s")
                                   : "");
  return 0;
}

const bool registered = register_command({"merge", kSummary, false, run_merge});

}  // namespace
}  // namespace attntune::cli::cmd_merge
