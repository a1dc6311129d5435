#include "core/queue_records.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"

namespace attntune {

std::string job_request_json(const JobRequest& r) {
  nlohmann::ordered_json spaces = nlohmann::ordered_json::array();
  for (const CampaignSpace& s : r.spaces)
    spaces.push_back({{"family", s.family}, {"path", s.path}, {"hash", s.hash}, {"text", s.text}});
  nlohmann::ordered_json j = {{"spaces", spaces},
                              {"strategy", r.strategy},
                              {"seed", r.seed},
                              {"budget_evals", r.budget_evals},
                              {"budget_seconds", r.budget_seconds},
                              {"patience", r.patience},
                              {"min_gain_pct", r.min_gain_pct},
                              {"final_top", r.final_top},
                              {"final_rounds", r.final_rounds},
                              {"final_screen", r.final_screen},
                              {"warm", r.warm},
                              {"max_seconds", r.max_seconds},
                              {"min_seconds", r.min_seconds},
                              {"final_min_seconds", r.final_min_seconds}};
  return j.dump();
}

JobRequest job_request_from_json(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    JobRequest r;
    for (const auto& s : j.at("spaces"))
      r.spaces.push_back({s.at("family").get<std::string>(), s.at("path").get<std::string>(),
                          s.at("hash").get<std::string>(), s.at("text").get<std::string>()});
    r.strategy = j.at("strategy").get<std::string>();
    r.seed = j.at("seed").get<std::uint64_t>();
    r.budget_evals = j.at("budget_evals").get<std::int64_t>();
    r.budget_seconds = j.at("budget_seconds").get<double>();
    r.patience = j.at("patience").get<std::int64_t>();
    r.min_gain_pct = j.at("min_gain_pct").get<double>();
    r.final_top = j.at("final_top").get<int>();
    r.final_rounds = j.at("final_rounds").get<int>();
    // Requests queued before the screening existed run without it, as they were submitted.
    r.final_screen = j.contains("final_screen") ? j.at("final_screen").get<int>() : 0;
    r.warm = j.at("warm").get<int>();
    r.max_seconds = j.at("max_seconds").get<double>();
    r.min_seconds = j.at("min_seconds").get<double>();
    r.final_min_seconds = j.at("final_min_seconds").get<double>();
    if (r.spaces.empty()) throw InputError("no search space");
    return r;
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("a queued campaign's request is malformed: {}", e.what()));
  }
}

}  // namespace attntune
