#include "core/records.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/hash.hpp"

namespace attntune {

const CampaignSpace* CampaignSpec::space_of(const std::string& family_name) const {
  for (const CampaignSpace& s : spaces)
    if (s.family == family_name) return &s;
  return nullptr;
}

void set_spaces(CampaignSpec& spec, std::vector<CampaignSpace> spaces) {
  if (spaces.empty()) throw std::logic_error("set_spaces: a campaign has at least one space");
  std::stable_sort(spaces.begin(), spaces.end(),
                   [](const CampaignSpace& a, const CampaignSpace& b) { return a.family < b.family; });
  for (std::size_t i = 1; i < spaces.size(); ++i)
    if (spaces[i].family == spaces[i - 1].family)
      throw InputError(fmt::format("{} and {} are both spaces of template '{}'; a campaign searches one space per "
                                   "template",
                                   spaces[i - 1].path, spaces[i].path, spaces[i].family));
  if (spaces.size() == 1) {
    spec.family = spaces[0].family;
    spec.space_path = spaces[0].path;
    spec.space_hash = spaces[0].hash;
    spec.space_text = spaces[0].text;
  } else {
    std::vector<std::string> families, paths;
    std::string identity;
    for (const CampaignSpace& s : spaces) {
      families.push_back(s.family);
      paths.push_back(s.path);
      identity += s.family + ":" + s.hash + "\n";
    }
    spec.family = fmt::format("{}", fmt::join(families, "+"));
    spec.space_path = fmt::format("{}", fmt::join(paths, " + "));
    spec.space_hash = content_hash(identity);
    spec.space_text.clear();
  }
  spec.spaces = std::move(spaces);
}

}  // namespace attntune
