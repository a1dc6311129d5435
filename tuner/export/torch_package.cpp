#include "export/torch_package.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/embedded.hpp"
#include "core/error.hpp"
#include "core/problem.hpp"
#include "families/family.hpp"
#include "space/search_space.hpp"

namespace attntune {

namespace {

// The files of the package (templates/torch/, embedded), by their path inside it.
constexpr const char* kTorchFiles[] = {"pyproject.toml", "attntune/__init__.py", "attntune/_build.py",
                                       "attntune/_ops.cpp"};

// One problem of each regime, in the words of coverage_plan(), at head dim d (with its value head dim:
// "576,dv=512") and dtype, `tail` at the end (",latent=1").
std::vector<std::pair<const char*, std::string>> regime_problems(const std::string& d, const std::string& dtype,
                                                                 const std::string& tail = "") {
  const std::string shape = fmt::format(",d={},dtype={}", d, dtype);
  return {{"prefill", "b=1,h=8,hkv=8,s=1024,sk=1024" + shape + ",causal=1" + tail},
          {"decode", "b=8,h=8,hkv=8,s=1,sk=4096" + shape + ",causal=0,page=16" + tail},
          {"chunk", "b=2,h=8,hkv=8,s=512,sk=4096" + shape + ",causal=1,page=64" + tail},
          {"varlen", "b=4,h=8,hkv=8,s=512,sk=512" + shape + ",causal=1,varlen=4" + tail}};
}

bool tunes(const SearchSpace& space, const std::string& spec) {
  try {
    space.check_problem(Problem::parse(spec), space.default_arch());
    return true;
  } catch (const InputError&) {
    return false;  // the family does not tune it
  }
}

// What `space` tunes, problem constraints included: its problem section says d, dtype and the
// variants, but only its constraints say that flash_decode tunes no prefill and the prefill families
// no decode (coverage_plan must not offer a windowed prefill problem because flash_decode tunes
// windows), and which listed head dims a family refuses (a multiple of 8 that is no multiple of 16).
struct Tuned {
  std::vector<std::string> d;        // the head dims some regime's problem is tuned at
  std::vector<std::string> regimes;  // the regimes tuned at the first of them
};
Tuned tuned(const SearchSpace& space) {
  std::vector<std::string> ds = {"128"}, dvs, passes = {"fwd"};
  std::string dtype = "bf16";
  bool latent = false;
  for (const auto& [field, values] : space.problem_support()) {
    if (field == "d" && !values.empty()) ds = values;
    if (field == "dtype" && !values.empty()) dtype = values.front();
    if (field == "dv") dvs = values;
    if (field == "latent") latent = std::find(values.begin(), values.end(), "1") != values.end();
    // The passes it tunes (`pass: [bwd]`: the backward pass alone; without the key, the forward).
    if (field == "pass" && !values.empty()) passes = values;
  }
  Tuned out;
  for (const std::string& d : ds) {
    // A head dim tuned with one head dim; else (where the space lists `dv`) with a smaller value
    // head dim, over separate K and V or (where it lists `latent`) a latent cache: MLA's d=576 is
    // tuned only beside dv=512.
    std::vector<std::pair<std::string, std::string>> forms = {{d, ""}};
    for (const std::string& dv : dvs) {
      if (std::atoi(dv.c_str()) >= std::atoi(d.c_str())) continue;
      forms.emplace_back(d + ",dv=" + dv, "");
      if (latent) forms.emplace_back(d + ",dv=" + dv, ",latent=1");
    }
    std::vector<std::string> regimes;
    for (const auto& [dims, tail] : forms) {
      // Each pass it tunes: a backward problem's spec ends in ,pass=bwd, and its regime is `train`
      // (plan's word for a training step's problems; the backward's are dense, prefill's shapes).
      for (const std::string& pass : passes)
        for (const auto& [regime, spec] : regime_problems(dims, dtype, tail + (pass == "bwd" ? ",pass=bwd" : ""))) {
          const std::string name = pass == "bwd" ? "train" : regime;
          if (std::find(regimes.begin(), regimes.end(), name) == regimes.end() && tunes(space, spec))
            regimes.push_back(name);
        }
      if (!regimes.empty()) break;
    }
    if (regimes.empty()) continue;
    if (out.d.empty()) out.regimes = regimes;
    out.d.push_back(d);
  }
  return out;
}

}  // namespace

std::string tuner_support_json() {
  nlohmann::ordered_json out;
  out["families"] = nlohmann::ordered_json::array();
  for (const std::string& family : known_families()) {
    const std::optional<SearchSpace> space = SearchSpace::shipped(family);
    if (!space) continue;
    nlohmann::ordered_json support = nlohmann::ordered_json::object();
    // The problem fields the family restricts: d, dtype, causal where it matters, and each variant
    // (window, softcap, sinks: ["0"] or ["0", "1"], from its problem section).
    const Tuned t = tuned(*space);
    for (const auto& [field, values] : space->problem_support()) support[field] = field == "d" ? t.d : values;
    out["families"].push_back({{"family", family}, {"support", support}, {"regimes", t.regimes}});
  }
  return out.dump(2) + "\n";
}

void write_torch_package(const std::string& dir, const std::string& source, const std::string& info,
                         const ProtectedDatabases& databases) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path root(dir), pkg = root / "attntune";
  if (fs::exists(root, ec)) {
    if (!fs::is_directory(root, ec))
      throw InputError(fmt::format("--torch {}: exists and is not a directory", dir));
    const bool ours = fs::exists(pkg / "_build.py", ec) && fs::exists(root / "pyproject.toml", ec);
    if (!ours && !fs::is_empty(root, ec))
      throw InputError(fmt::format("--torch {}: a directory that is neither empty nor a package attntune wrote "
                                   "(no attntune/_build.py): choose a new directory",
                                   dir));
  }
  fs::create_directories(pkg, ec);
  if (ec) throw InputError(fmt::format("--torch {}: cannot create {}: {}", dir, pkg.string(), ec.message()));
  for (const char* f : kTorchFiles)
    write_output_file("--torch", (root / f).string(), embedded_file(std::string("templates/torch/") + f), databases);
  write_output_file("--torch", (pkg / "kernels.json").string(), info + "\n", databases);
  write_output_file("--torch", (pkg / "tuner.json").string(), tuner_support_json(), databases);
  write_output_file("--torch", (pkg / "kernels.cu").string(), source, databases);  // last: the package is whole
}

}  // namespace attntune
