#include "families/family.hpp"

#include <algorithm>
#include <cctype>
#include <set>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "core/embedded.hpp"
#include "core/error.hpp"
#include "core/hash.hpp"

namespace attntune {

namespace {

const std::vector<FamilyInfo>& families() {
  static const std::vector<FamilyInfo> f = {
      {"flash_fwd_mma", "templates/flash_fwd_mma/kernel.cu", "flash_fwd_mma"},
      {"flash_fwd_wgmma", "templates/flash_fwd_wgmma/kernel.cu", "flash_fwd_wgmma"},
  };
  return f;
}

struct TestFamily {
  FamilyInfo info;
  FamilyHooks hooks;
};
// Registered by tests (register_test_family); empty in the product.
std::vector<TestFamily>& test_families() {
  static std::vector<TestFamily> f;
  return f;
}
const TestFamily* find_test_family(const std::string& name) {
  for (const auto& f : test_families())
    if (f.info.name == name) return &f;
  return nullptr;
}

std::string dir_of(const std::string& path) {
  auto pos = path.rfind('/');
  return pos == std::string::npos ? "" : path.substr(0, pos + 1);
}

// Resolves "a/../b" segments of an embedded path.
std::string normalise(const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
  }
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : "/") + p;
  return out;
}

void flatten_into(const std::string& path, std::set<std::string>& seen, std::string& out) {
  if (!seen.insert(path).second) return;
  std::stringstream in{std::string(embedded_file(path))};
  std::string line;
  out += "// ---- " + path + "\n";
  while (std::getline(in, line)) {
    auto first = line.find_first_not_of(" \t");
    if (first != std::string::npos && line.compare(first, 8, "#include") == 0) {
      auto q1 = line.find('"'), q2 = line.rfind('"');
      if (q1 != std::string::npos && q2 > q1) {
        flatten_into(normalise(dir_of(path) + line.substr(q1 + 1, q2 - q1 - 1)), seen, out);
        continue;
      }
    }
    out += line;
    out += '\n';
  }
}

std::int64_t derived_value(const std::vector<std::pair<std::string, std::int64_t>>& derived, const std::string& name,
                           const SearchSpace& space) {
  for (const auto& [k, v] : derived)
    if (k == name) return v;
  throw InputError(fmt::format("{}: family {} needs a derived quantity '{}'", space.path(), space.family(), name));
}

// A boolean parameter that configs recorded before it existed lack: absent reads as false.
bool flag_or_false(const Config& config, const std::string& name) {
  const auto it = config.find(name);
  return it != config.end() && std::get<bool>(it->second);
}

}  // namespace

const FamilyInfo& family_info(const std::string& name) {
  for (const auto& f : families())
    if (f.name == name) return f;
  if (const TestFamily* t = find_test_family(name)) return t->info;
  throw InputError(fmt::format("unknown template family '{}' (known: {})", name, fmt::join(known_families(), ", ")));
}

std::vector<std::string> known_families() {
  std::vector<std::string> names;
  for (const auto& f : families()) names.push_back(f.name);
  for (const auto& f : test_families()) names.push_back(f.info.name);
  return names;
}

void register_test_family(const FamilyInfo& info, FamilyHooks hooks) {
  if (!hooks.render || !hooks.geometry) throw std::logic_error("register_test_family: a hook is missing");
  for (const auto& name : known_families())
    if (name == info.name) throw std::logic_error("register_test_family: family '" + info.name + "' exists");
  test_families().push_back({info, std::move(hooks)});
}

std::string macro_name(const std::string& param) {
  std::string m = param;
  std::transform(m.begin(), m.end(), m.begin(), [](unsigned char c) { return std::toupper(c); });
  return m;
}

std::string flatten_includes(const std::string& embedded_path) {
  std::set<std::string> seen;
  std::string out;
  flatten_into(embedded_path, seen, out);
  return out;
}

std::vector<std::pair<std::string, std::int64_t>> kernel_defines(const SearchSpace& space, const Config& config,
                                                                 const Problem& problem, const std::string& arch) {
  if (auto why = space.check(config, problem, arch))
    throw InputError(fmt::format("config {} is not valid for {}: {}", config_str(config), problem.str(), *why));
  std::vector<std::pair<std::string, std::int64_t>> defs = {
      {"ATT_HEAD_DIM", problem.d},
      {"ATT_DTYPE_BF16", problem.dtype == DType::kBf16 ? 1 : 0},
      {"ATT_CAUSAL", problem.causal ? 1 : 0},
  };
  for (const auto& param : space.params()) {
    const Value& v = config.at(param.name);
    const std::string macro = macro_name(param.name);
    switch (param.kind) {
      case ParamKind::kInt: defs.emplace_back(macro, std::get<std::int64_t>(v)); break;
      case ParamKind::kBool: defs.emplace_back(macro, std::get<bool>(v) ? 1 : 0); break;
      case ParamKind::kEnum: {
        // Each declared value gets a constant, the parameter its index: `#if KV_SCHEDULE ==
        // KV_SCHEDULE_BLOCKWISE`. Enum values are identifiers checked by the space loader.
        std::int64_t index = -1;
        for (std::size_t i = 0; i < param.values.size(); ++i) {
          const auto& name = std::get<std::string>(param.values[i]);
          defs.emplace_back(macro + "_" + macro_name(name), static_cast<std::int64_t>(i));
          if (name == std::get<std::string>(v)) index = static_cast<std::int64_t>(i);
        }
        defs.emplace_back(macro, index);
        break;
      }
    }
  }
  for (const auto& [name, value] : space.derive(config, problem, arch)) defs.emplace_back(macro_name(name), value);
  return defs;
}

RenderedKernel render_kernel(const SearchSpace& space, const Config& config, const Problem& problem,
                             const std::string& arch) {
  if (const TestFamily* t = find_test_family(space.family())) return t->hooks.render(space, config, problem, arch);
  const FamilyInfo& fam = family_info(space.family());
  std::string src = fmt::format("// attntune candidate: {} {} (d={}, dtype={}, causal={})\n", fam.name,
                                config_str(config), problem.d, dtype_name(problem.dtype), problem.causal ? 1 : 0);
  for (const auto& [name, value] : kernel_defines(space, config, problem, arch))
    src += fmt::format("#define {} {}\n", name, value);
  src += flatten_includes(fam.main_file);
  RenderedKernel r;
  r.source_hash = content_hash(src);
  r.source = std::move(src);
  r.kernel_name = fam.kernel_name;
  return r;
}

LaunchGeometry launch_geometry(const SearchSpace& space, const Config& config, const Problem& problem,
                               const std::string& arch) {
  if (const TestFamily* t = find_test_family(space.family())) return t->hooks.geometry(space, config, problem, arch);
  const auto derived = space.derive(config, problem, arch);
  const auto block_m = std::get<std::int64_t>(config.at("block_m"));
  LaunchGeometry g;
  g.grid[0] = static_cast<unsigned>((problem.s + block_m - 1) / block_m);
  g.grid[1] = static_cast<unsigned>(problem.h);
  g.grid[2] = static_cast<unsigned>(problem.b);
  g.block = static_cast<unsigned>(derived_value(derived, "threads", space));
  g.smem_bytes = static_cast<unsigned>(derived_value(derived, "smem_bytes", space));
  if (space.family() == "flash_fwd_wgmma") {
    g.tma.q_rows = static_cast<unsigned>(block_m);
    g.tma.kv_rows = static_cast<unsigned>(std::get<std::int64_t>(config.at("block_n")));
    g.tma.head_dim = static_cast<unsigned>(problem.d);
    g.tma.bf16 = problem.dtype == DType::kBf16;
    g.persistent = std::get<bool>(config.at("persistent"));
    g.split_tail = g.persistent && !problem.causal && flag_or_false(config, "split_tail");
    g.dynamic_tiles = g.persistent && problem.causal && std::get<bool>(config.at("warp_specialize"));
    g.consumer_warps = static_cast<unsigned>(block_m / 64 * 4);
    g.cluster = g.persistent && !problem.causal && flag_or_false(config, "kv_multicast") ? 2 : 1;
  }
  return g;
}

unsigned long long persistent_work_tiles(unsigned long long m_blocks, unsigned long long heads,
                                         unsigned long long batch, unsigned cluster) {
  return (m_blocks + cluster - 1) / cluster * cluster * heads * batch;
}

unsigned persistent_ctas(unsigned long long tiles, unsigned sm_count, unsigned max_clusters, unsigned cluster) {
  unsigned cap = sm_count / cluster * cluster;
  if (max_clusters > 0) cap = std::min(cap, max_clusters * cluster);
  cap = std::max(cap, cluster);  // a device of fewer SMs than a cluster still gets one
  return static_cast<unsigned>(std::min<unsigned long long>(tiles, cap));
}

unsigned split_tail_tiles(unsigned long long tiles, unsigned ctas, unsigned long long iterations) {
  if (ctas == 0 || tiles <= ctas) return 0;
  const unsigned long long tail = tiles % ctas;
  if (tail == 0 || tail * iterations < 2ull * ctas || tail * iterations * ctas >= (1ull << 31) ||
      tiles + 2ull * ctas >= (1ull << 31))
    return 0;
  return static_cast<unsigned>(tail);
}

std::size_t split_workspace_floats(unsigned ctas, unsigned consumer_warps, unsigned head_dim) {
  return 2ull * ctas * consumer_warps * (head_dim / 2 + 4) * 32;
}

std::size_t split_counters(unsigned tail, unsigned consumer_warps) { return 1ull * tail * consumer_warps; }

std::string space_arch_for_device(const SearchSpace& space, const std::string& device_arch) {
  const auto& archs = space.archs();
  if (std::find(archs.begin(), archs.end(), device_arch) != archs.end()) return device_arch;
  const std::string specific = device_arch + "a";
  if (std::find(archs.begin(), archs.end(), specific) != archs.end()) return specific;
  return device_arch;
}

std::vector<std::string> family_nvrtc_options(const FamilyInfo&) { return {"-std=c++17"}; }

}  // namespace attntune
