#include "search/recorded.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

namespace attntune::search {

RecordedCampaign RecordedCampaign::load(ResultReader& results, const std::string& campaign) {
  const std::optional<CampaignRow> row = results.campaign_row(campaign);
  if (!row) throw InputError(fmt::format("no campaign named '{}' in {}", campaign, results.path()));
  if (row->spec.mixed())
    throw InputError(fmt::format("campaign '{}' in {} searched several templates ({}); a recorded campaign to replay "
                                 "or simulate from must have one (record each template's space in its own campaign)",
                                 campaign, results.path(), row->spec.family));
  if (row->spec.space_text.empty())
    throw InputError(fmt::format("campaign '{}' in {} was recorded without its search space (an older attntune); "
                                 "it cannot be replayed",
                                 campaign, results.path()));
  RecordedCampaign out{campaign,
                       SearchSpace::parse(row->spec.space_text, fmt::format("{} (campaign '{}')", row->spec.space_path, campaign)),
                       row->spec.problem,
                       row->arch,
                       row->gpu,
                       row->spec.strategy,
                       {},
                       std::nullopt,
                       0};
  for (EvaluationRow& e : results.campaign_evaluations(row->id)) {
    if (e.record.status == "ok" && e.record.median_us && (!out.best_us || *e.record.median_us < *out.best_us))
      out.best_us = e.record.median_us;
    out.results.emplace(config_str(e.config), std::move(e.record));  // the first evaluation wins
  }
  out.space_size = out.space.count(out.problem, out.arch);
  return out;
}

const EvalRecord* RecordedCampaign::find(const Config& c) const {
  auto it = results.find(config_str(c));
  return it == results.end() ? nullptr : &it->second;
}

}  // namespace attntune::search
