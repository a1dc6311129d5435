// A database of campaigns built through the Store, as `attntune tune` records them on an H100
// (flash_fwd_mma results filed under sm_90, flash_fwd_wgmma ones under sm_90a), for the export
// tests: tests/unit/export/test_export_wgmma.cpp and tests/gpu/test_export_wgmma.cpp.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "db/store.hpp"
#include "families/family.hpp"
#include "space/search_space.hpp"
#include "tests/unit/db/db_test_util.hpp"

namespace attntune::test {

class ExportDb {
 public:
  // source_dir: the repository (the spaces are read from its search_spaces/).
  ExportDb(const std::string& path, const std::string& source_dir)
      : store_(Store::open(path, Store::Mode::kCreate)), source_dir_(source_dir) {}

  // The arch a family's results are filed under on an H100: sm_90a for the Hopper-only families.
  static std::string arch_of(const std::string& family) {
    return family == "flash_fwd_wgmma" || family == "flash_decode_wgmma" ? "sm_90a" : "sm_90";
  }

  std::shared_ptr<const SearchSpace> space(const std::string& family) { return entry(family).space; }

  // The first valid config of the family's space for `problem` whose parameters include every one
  // of `want` (ints, and bools as 0/1); std::runtime_error if none.
  Config config(const std::string& family, const std::string& problem,
                const std::map<std::string, std::int64_t>& want) {
    return config_if(family, problem, [&](const Config& c) {
      for (const auto& [name, value] : want) {
        const Value& v = c.at(name);
        if ((std::holds_alternative<bool>(v) ? std::get<bool>(v) : std::get<std::int64_t>(v)) != value) return false;
      }
      return true;
    });
  }

  // The first valid config of `family` for `problem` that `keep` accepts.
  Config config_if(const std::string& family, const std::string& problem,
                   const std::function<bool(const Config&)>& keep) {
    for (const Config& c : space(family)->enumerate(Problem::parse(problem), arch_of(family)))
      if (keep(c)) return c;
    throw std::runtime_error("no valid " + family + " config for " + problem + " that the test accepts");
  }

  // A campaign with one ok result per config (medians in µs, in order), as tune records them; with
  // source_hash, every candidate is recorded as measured from that source instead of its own.
  void campaign(const std::string& family, const std::string& name, const std::string& problem,
                const std::vector<Config>& configs, const std::vector<double>& medians,
                const std::optional<std::string>& source_hash = std::nullopt) {
    const Entry& e = entry(family);
    const Problem p = Problem::parse(problem);
    CampaignSpec spec;
    spec.name = name;
    spec.problem = p;
    spec.space_path = "search_spaces/" + family + ".yaml";
    spec.space_hash = e.space->hash();
    spec.space_text = e.text;
    spec.family = family;
    spec.strategy = "evo";
    const std::int64_t id = store_.open_campaign(spec, e.device);
    for (std::size_t i = 0; i < configs.size(); ++i) {
      const std::string hash =
          source_hash ? *source_hash : render_kernel(*e.space, configs[i], p, arch_of(family)).source_hash;
      const auto cand = store_.upsert_candidate(family, configs[i], hash);
      store_.record_evaluation(id, cand, e.device, ok_eval(medians.at(i), p.flops() / medians.at(i) * 1e-6));
    }
  }

  // A campaign of both templates (tune --space A --space B), on an H100 as tune records it: results
  // filed under the first family's arch (sm_90), each kernel built for its own (wgmma: sm_90a).
  void mixed_campaign(const std::string& name, const std::string& problem,
                      const std::vector<std::pair<std::string, Config>>& results, const std::vector<double>& medians) {
    const Problem p = Problem::parse(problem);
    CampaignSpec spec;
    spec.name = name;
    spec.problem = p;
    spec.strategy = "evo";
    std::vector<CampaignSpace> spaces;
    for (const char* family : {"flash_fwd_mma", "flash_fwd_wgmma"}) {
      const Entry& e = entry(family);
      spaces.push_back({family, "search_spaces/" + std::string(family) + ".yaml", e.space->hash(), e.text});
    }
    set_spaces(spec, std::move(spaces));
    const std::int64_t id = store_.open_campaign(spec, entry("flash_fwd_mma").device);
    for (std::size_t i = 0; i < results.size(); ++i) {
      const auto& [family, config] = results[i];
      const Entry& e = entry(family);
      const auto cand = store_.upsert_candidate(family, config, render_kernel(*e.space, config, p, arch_of(family)).source_hash);
      store_.record_evaluation(id, cand, entry("flash_fwd_mma").device,
                               ok_eval(medians.at(i), p.flops() / medians.at(i) * 1e-6));
    }
  }

  Store& store() { return store_; }

  // Spaces read through `edit` (a test's change to a shipped space, e.g. serving a variant),
  // before a family's first use.
  void edit_spaces(std::function<std::string(const std::string& family, std::string text)> edit) {
    edit_ = std::move(edit);
  }

 private:
  struct Entry {
    std::string text;
    std::shared_ptr<const SearchSpace> space;
    std::int64_t device = 0;
  };
  const Entry& entry(const std::string& family) {
    auto it = entries_.find(family);
    if (it != entries_.end()) return it->second;
    Entry e;
    e.text = read_bytes(source_dir_ + "/search_spaces/" + family + ".yaml");
    if (edit_) e.text = edit_(family, std::move(e.text));
    e.space = std::make_shared<const SearchSpace>(SearchSpace::parse(e.text, family + ".yaml"));
    e.device = store_.upsert_device({"NVIDIA H100 80GB HBM3", arch_of(family), "GPU-2", 132, "580.1"});
    return entries_.emplace(family, std::move(e)).first->second;
  }

  Store store_;
  std::string source_dir_;
  std::map<std::string, Entry> entries_;
  std::function<std::string(const std::string&, std::string)> edit_;
};

}  // namespace attntune::test
