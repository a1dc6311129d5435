#include "export/torch_package.hpp"

#include <filesystem>
#include <optional>
#include <system_error>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/embedded.hpp"
#include "core/error.hpp"
#include "families/family.hpp"
#include "space/search_space.hpp"

namespace attntune {

namespace {

// The files of the package (templates/torch/, embedded), by their path inside it.
constexpr const char* kTorchFiles[] = {"pyproject.toml", "attntune/__init__.py", "attntune/_build.py",
                                       "attntune/_ops.cpp"};

}  // namespace

std::string tuner_support_json() {
  nlohmann::ordered_json out;
  out["families"] = nlohmann::ordered_json::array();
  for (const std::string& family : known_families()) {
    const std::optional<SearchSpace> space = SearchSpace::shipped(family);
    if (!space) continue;
    nlohmann::ordered_json support = nlohmann::ordered_json::object();
    for (const auto& [field, values] : space->problem_support()) support[field] = values;
    out["families"].push_back({{"family", family}, {"support", support}});
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
