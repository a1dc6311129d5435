// attntune space: load a search space; describe it, or for a problem count, list or summarize
// its valid configs.
#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "cli/format.hpp"
#include "core/error.hpp"
#include "core/problem.hpp"
#include "core/text.hpp"
#include "space/search_space.hpp"

namespace attntune::cli::cmd_space {

namespace {

using ojson = nlohmann::ordered_json;

const char* kSummary = "load a search space; count, list or summarize its valid configs for a problem";

std::string percent(std::uint64_t part, std::uint64_t whole) {
  return whole ? fmt::format("{:.1f}%", 100.0 * double(part) / double(whole)) : "-";
}

// Columns padded to their widest cell; the last column is not padded.
void print_table(const std::vector<std::vector<std::string>>& rows, const std::string& indent = "") {
  std::vector<std::size_t> width;
  for (const auto& r : rows)
    for (std::size_t i = 0; i < r.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], r[i].size());
    }
  for (const auto& r : rows) {
    std::string line = indent;
    for (std::size_t i = 0; i < r.size(); ++i)
      line += i + 1 == r.size() ? r[i] : fmt::format("{:<{}}  ", r[i], width[i]);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::printf("%s\n", line.c_str());
  }
}

// ---- without a problem: the space itself ------------------------------------------------------

void describe(const SearchSpace& sp, Format format) {
  if (format == Format::kJson) {
    ojson j;
    j["path"] = sp.path();
    j["hash"] = sp.hash();
    j["family"] = sp.family();
    j["description"] = sp.description();
    j["archs"] = sp.archs();
    j["default_arch"] = sp.default_arch();
    j["problem"] = ojson::object();
    for (const auto& [k, v] : sp.problem_support()) j["problem"][k] = v;
    j["problem_constraints"] = ojson::array();
    for (const auto& c : sp.problem_constraints()) j["problem_constraints"].push_back({{"expr", c.expr}, {"why", c.why}});
    j["params"] = ojson::array();
    for (const auto& p : sp.params()) {
      ojson values = ojson::array();
      for (const auto& v : p.values) values.push_back(value_json(v));
      j["params"].push_back({{"name", p.name}, {"kind", param_kind_name(p.kind)}, {"values", values}, {"doc", p.doc}});
    }
    j["derived"] = ojson::array();
    for (const auto& d : sp.derived())
      j["derived"].push_back({{"name", d.name}, {"type", expr_type_name(d.type)}, {"expr", d.expr}, {"doc", d.doc}});
    j["constraints"] = ojson::array();
    for (const auto& c : sp.constraints()) j["constraints"].push_back({{"expr", c.expr}, {"why", c.why}});
    j["device_limits"] = ojson::object();
    for (const auto& a : sp.archs())
      for (const auto& [k, v] : sp.device_limits(a)) j["device_limits"][a][k] = v;
    j["raw_size"] = sp.raw_size();
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::vector<std::vector<std::string>> head = {
      {"space", fmt::format("{} (hash {})", sp.path(), sp.hash().substr(0, 12))},
      {"family", sp.description().empty() ? sp.family() : sp.family() + ": " + sp.description()},
      {"archs", fmt::format("{} (default {})", join(sp.archs()), sp.default_arch())}};
  std::vector<std::string> support;
  for (const auto& [k, v] : sp.problem_support()) support.push_back(k + " in {" + join(v) + "}");
  for (const auto& c : sp.problem_constraints()) support.push_back(c.expr);
  head.push_back({"problem", support.empty() ? "any" : join(support, "; ")});
  head.push_back({"raw size", fmt::format("{} points before constraints", sp.raw_size())});
  print_table(head);

  std::printf("\nparams (enumeration order)\n");
  std::vector<std::vector<std::string>> rows = {{"name", "kind", "size", "values", "doc"}};
  for (const auto& p : sp.params())
    rows.push_back({p.name, param_kind_name(p.kind), std::to_string(p.values.size()), domain_text(p), p.doc});
  print_table(rows, "  ");
  if (!sp.derived().empty()) {
    std::printf("\nderived\n");
    rows.clear();
    for (const auto& d : sp.derived())
      rows.push_back({d.name, expr_type_name(d.type), "= " + d.expr, d.doc.empty() ? "" : "# " + d.doc});
    print_table(rows, "  ");
  }
  if (!sp.constraints().empty()) {
    std::printf("\nconstraints\n");
    rows.clear();
    for (std::size_t i = 0; i < sp.constraints().size(); ++i) {
      const auto& c = sp.constraints()[i];
      rows.push_back({std::to_string(i + 1), c.expr, c.why.empty() ? "" : "# " + c.why});
    }
    print_table(rows, "  ");
  }
  const auto first = sp.device_limits(sp.archs().front());
  if (!first.empty()) {
    std::printf("\ndevice limits\n");
    rows = {{"limit"}};
    rows[0].insert(rows[0].end(), sp.archs().begin(), sp.archs().end());
    for (const auto& [k, v] : first) rows.push_back({k});
    for (const auto& a : sp.archs()) {
      const auto limits = sp.device_limits(a);
      for (std::size_t i = 0; i < limits.size(); ++i) rows[i + 1].push_back(std::to_string(limits[i].second));
    }
    print_table(rows, "  ");
  }
}

// ---- with a problem: what the constraints leave -----------------------------------------------

void summarize(const SearchSpace& sp, const Problem& problem, const std::string& arch, Format format) {
  // Which values of each param occur in some valid config, and the range of each derived quantity.
  std::vector<std::set<std::size_t>> used(sp.params().size());
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges(sp.derived().size(), {INT64_MAX, INT64_MIN});
  PruneStats stats;
  sp.for_each_valid(problem, arch, [&](const Config& c) {
    for (std::size_t i = 0; i < sp.params().size(); ++i) {
      const auto& p = sp.params()[i];
      used[i].insert(static_cast<std::size_t>(std::find(p.values.begin(), p.values.end(), c.at(p.name)) - p.values.begin()));
    }
    const auto derived = sp.derive(c, problem, arch);
    for (std::size_t i = 0; i < derived.size(); ++i)
      ranges[i] = {std::min(ranges[i].first, derived[i].second), std::max(ranges[i].second, derived[i].second)};
  }, &stats);

  auto used_values = [&](std::size_t i) {
    std::vector<std::string> v;
    for (std::size_t k : used[i]) v.push_back(value_str(sp.params()[i].values[k]));
    return v;
  };
  auto range_text = [&](std::size_t i) {
    const auto [lo, hi] = ranges[i];
    return lo == hi ? std::to_string(lo) : fmt::format("{} .. {}", lo, hi);
  };
  auto label = [&](std::size_t i) {
    const auto& c = sp.constraints()[i];
    return c.why.empty() ? c.expr : fmt::format("{} ({})", c.expr, c.why);
  };

  if (format == Format::kJson) {
    ojson j;
    j["path"] = sp.path();
    j["family"] = sp.family();
    j["problem"] = problem.json();
    if (problem.is_varlen()) {  // the drawn lengths, so tools need not draw them again
      j["lens_q"] = problem.q_lens();
      j["lens_k"] = problem.k_lens();
    }
    j["arch"] = arch;
    j["raw_size"] = stats.raw;
    j["valid"] = stats.valid;
    j["params"] = ojson::array();
    for (std::size_t i = 0; i < sp.params().size(); ++i) {
      const auto& p = sp.params()[i];
      ojson all = ojson::array(), valid = ojson::array();
      for (const auto& v : p.values) all.push_back(value_json(v));
      for (std::size_t k : used[i]) valid.push_back(value_json(p.values[k]));
      j["params"].push_back({{"name", p.name}, {"values", all}, {"valid_values", valid}});
    }
    j["constraints"] = ojson::array();
    for (std::size_t i = 0; i < sp.constraints().size(); ++i)
      j["constraints"].push_back({{"expr", sp.constraints()[i].expr}, {"why", sp.constraints()[i].why},
                                  {"rejected_first", stats.rejected_by[i]}});
    j["derived"] = ojson::array();
    for (std::size_t i = 0; i < sp.derived().size(); ++i) {
      ojson d = {{"name", sp.derived()[i].name}};
      if (stats.valid) d["min"] = ranges[i].first, d["max"] = ranges[i].second;
      j["derived"].push_back(d);
    }
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }

  std::vector<std::vector<std::string>> head = {{"family", sp.family()}, {"problem", problem.str()}};
  if (problem.is_varlen()) {
    // The packed batch the problem stands for: its drawn lengths (the first 16), shortest to
    // longest, and the packed rows.
    const std::vector<int> lens = problem.q_lens();
    const auto [lo, hi] = std::minmax_element(lens.begin(), lens.end());
    std::vector<std::string> shown;
    for (std::size_t i = 0; i < lens.size() && i < 16; ++i) shown.push_back(std::to_string(lens[i]));
    head.push_back({"sequences", fmt::format("{} of {}..{} query rows ({} packed, keys {} more each): {}{}", lens.size(),
                                             *lo, *hi, problem.total_q(), problem.sk - problem.s,
                                             fmt::join(shown, ","), lens.size() > 16 ? ",..." : "")});
  }
  head.push_back({"arch", arch});
  head.push_back({"raw size", std::to_string(stats.raw)});
  head.push_back({"valid", fmt::format("{} ({} of the raw space)", stats.valid, percent(stats.valid, stats.raw))});
  print_table(head);
  std::printf("\nparams (values that occur in some valid config)\n");
  std::vector<std::vector<std::string>> rows;
  for (std::size_t i = 0; i < sp.params().size(); ++i) {
    const auto& p = sp.params()[i];
    const auto valid = used_values(i);
    std::string note;
    if (valid.size() != p.values.size()) {
      std::vector<std::string> never;
      for (std::size_t k = 0; k < p.values.size(); ++k)
        if (!used[i].count(k)) never.push_back(value_str(p.values[k]));
      note = "never valid: " + join(never);
    }
    rows.push_back({p.name, valid.empty() ? "-" : join(valid), note});
  }
  print_table(rows, "  ");
  if (!sp.constraints().empty()) {
    std::printf("\nconstraints (raw points each one rejects first, in evaluation order)\n");
    rows = {{"#", "rejects", "share", "constraint"}};
    for (std::size_t i = 0; i < sp.constraints().size(); ++i)
      rows.push_back({std::to_string(i + 1), std::to_string(stats.rejected_by[i]),
                      percent(stats.rejected_by[i], stats.raw), label(i)});
    print_table(rows, "  ");
  }
  if (!sp.derived().empty() && stats.valid) {
    std::printf("\nderived (range over valid configs)\n");
    rows.clear();
    for (std::size_t i = 0; i < sp.derived().size(); ++i) rows.push_back({sp.derived()[i].name, range_text(i)});
    print_table(rows, "  ");
  }
}

void list(const SearchSpace& sp, const Problem& problem, const std::string& arch, Format format, bool with_derived) {
  std::vector<std::string> header;
  for (const auto& p : sp.params()) header.push_back(p.name);
  if (with_derived)
    for (const auto& d : sp.derived()) header.push_back(d.name);
  std::vector<std::vector<std::string>> rows;
  ojson array = ojson::array();
  if (format != Format::kJson) rows.push_back(header);
  sp.for_each_valid(problem, arch, [&](const Config& c) {
    std::vector<std::pair<std::string, std::int64_t>> derived;
    if (with_derived) derived = sp.derive(c, problem, arch);
    if (format == Format::kJson) {
      ojson o = ojson::object();
      for (const auto& p : sp.params()) o[p.name] = value_json(c.at(p.name));
      for (std::size_t i = 0; i < derived.size(); ++i) {
        if (sp.derived()[i].type == ExprType::kBool) o[derived[i].first] = derived[i].second != 0;
        else o[derived[i].first] = derived[i].second;
      }
      array.push_back(std::move(o));
      return;
    }
    std::vector<std::string> row;
    for (const auto& p : sp.params()) row.push_back(value_str(c.at(p.name)));
    for (std::size_t i = 0; i < derived.size(); ++i)
      row.push_back(sp.derived()[i].type == ExprType::kBool ? (derived[i].second ? "true" : "false")
                                                             : std::to_string(derived[i].second));
    rows.push_back(std::move(row));
  });
  if (format == Format::kJson) {
    std::printf("%s\n", array.dump(2).c_str());
  } else if (format == Format::kCsv) {
    for (const auto& r : rows) std::printf("%s\n", join(r, ",").c_str());
  } else {
    print_table(rows);
  }
}

int run_space(const std::vector<std::string>& args) {
  po::options_description opts("options");
  opts.add_options()
      ("space", po::value<std::string>()->required(), "search-space YAML file")
      ("problem", po::value<std::string>(), "problem spec, e.g. b=4,h=16,s=4096,d=128,dtype=bf16,causal=1")
      ("arch", po::value<std::string>(), "arch whose device limits apply (default: the space's highest)")
      ("count", po::bool_switch(), "print the number of valid configs alone (needs --problem)")
      ("list", po::bool_switch(), "list the valid configs (needs --problem)")
      ("derived", po::bool_switch(), "with --list: add the derived quantities as columns")
      ("format", po::value<std::string>()->default_value("table"), "table, json or csv (csv: --list only)");
  po::variables_map vm;
  if (parse_args("space", kSummary, opts, args, vm)) return 0;

  const bool count = vm["count"].as<bool>(), list_configs = vm["list"].as<bool>();
  const bool with_derived = vm["derived"].as<bool>();
  const Format format = parse_format(vm["format"].as<std::string>());
  if (count && list_configs) throw InputError("space: --count and --list exclude each other");
  if ((count || list_configs) && !vm.count("problem"))
    throw InputError(fmt::format("space: --{} needs --problem (which configs are valid depends on the problem)",
                                 count ? "count" : "list"));
  if (with_derived && !list_configs) throw InputError("space: --derived applies only to --list");
  if (format == Format::kCsv && !list_configs) throw InputError("space: --format csv applies only to --list");

  const SearchSpace sp = SearchSpace::load(vm["space"].as<std::string>());
  const std::string arch = vm.count("arch") ? vm["arch"].as<std::string>() : sp.default_arch();
  sp.device_limits(arch);  // rejects an arch the space does not list
  if (!vm.count("problem")) {
    describe(sp, format);
    return 0;
  }
  const Problem problem = Problem::parse(vm["problem"].as<std::string>());
  if (count) std::printf("%llu\n", static_cast<unsigned long long>(sp.count(problem, arch)));
  else if (list_configs) list(sp, problem, arch, format, with_derived);
  else summarize(sp, problem, arch, format);
  return 0;
}

const bool registered = register_command({"space", kSummary, false, run_space});

}  // namespace

}  // namespace attntune::cli::cmd_space
