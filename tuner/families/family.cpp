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

struct TestFamily {
  std::string name;
  RenderHook render;
};
// Registered by tests (register_test_family); empty in the product.
std::vector<TestFamily>& test_families() {
  static std::vector<TestFamily> f;
  return f;
}
const TestFamily* find_test_family(const std::string& name) {
  for (const auto& f : test_families())
    if (f.name == name) return &f;
  return nullptr;
}

const Family* find_builtin(const std::string& name) {
  for (const Family* f : builtin_families())
    if (f->name == name) return f;
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

}  // namespace

const Family& builtin_family(const std::string& name) {
  if (const Family* f = find_builtin(name)) return *f;
  throw InputError(fmt::format("unknown template family '{}' (known: {})", name, fmt::join(known_families(), ", ")));
}

std::vector<std::string> known_families() {
  std::vector<std::string> names;
  for (const Family* f : builtin_families()) names.push_back(f->name);
  for (const auto& f : test_families()) names.push_back(f.name);
  return names;
}

void check_family(const std::string& name) {
  if (!find_builtin(name) && !find_test_family(name)) builtin_family(name);  // throws, naming the known ones
}

int problem_entry(const Problem& p) {
  if (p.backward) return p.is_varlen() ? attntune_plan::kEntryBackwardVarlen : attntune_plan::kEntryBackward;
  return p.paged()       ? attntune_plan::kEntryKvcache
         : p.is_varlen() ? attntune_plan::kEntryVarlen
                         : attntune_plan::kEntryDense;
}

void check_family_serves(const std::string& name, const Problem& p) {
  if (find_test_family(name)) return;
  const int entry = problem_entry(p);
  if (builtin_family(name).plan->entries & entry) return;
  std::vector<std::string> serving;
  for (const Family* f : builtin_families())
    if (f->plan->entries & entry) serving.push_back(f->name);
  if (p.backward)
    throw InputError(fmt::format("{} does not serve the backward pass of attention ({}: dQ, dK, dV), which the "
                                 "problem {} is; families that do: {}",
                                 name, p.is_varlen() ? "attntune_attention_backward_varlen" : "attntune_attention_backward",
                                 p.str(), serving.empty() ? "none yet" : fmt::format("{}", fmt::join(serving, ", "))));
  const char* what = p.paged()       ? "a paged KV cache (attntune_attention_forward_kvcache)"
                     : p.is_varlen() ? "packed batches of different lengths (attntune_attention_forward_varlen)"
                                     : "dense tensors (attntune_attention_forward)";
  throw InputError(fmt::format("{} does not serve attention over {}, which the problem {} is; families that do: {}",
                               name, what, p.str(), fmt::join(serving, ", ")));
}

int served_entries(const Family& family, const Problem& p) {
  using namespace attntune_plan;
  // A backward problem's build (ATT_BWD) serves the backward entry alone; a forward one's never it.
  if (p.backward) return family.plan->entries & problem_entry(p);
  if (!family.build_per_entry) return family.plan->entries & ~kEntryVarlen & ~kEntryBackward & ~kEntryBackwardVarlen;
  return family.plan->entries & problem_entry(p);
}

std::vector<std::string> family_nvrtc_options(const std::string& name) {
  if (find_test_family(name)) return {"-std=c++17"};
  return builtin_family(name).nvrtc_options;
}

void register_test_family(const std::string& name, RenderHook render) {
  if (!render) throw std::logic_error("register_test_family: the render hook is missing");
  for (const auto& known : known_families())
    if (known == name) throw std::logic_error("register_test_family: family '" + name + "' exists");
  test_families().push_back({name, std::move(render)});
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

Defines kernel_defines(const SearchSpace& space, const Config& config, const Problem& problem, const std::string& arch) {
  if (auto why = space.check(config, problem, arch))
    throw InputError(fmt::format("config {} is not valid for {}: {}", config_str(config), problem.str(), *why));
  Defines defs = {
      {"ATT_HEAD_DIM", problem.d},
      {"ATT_DTYPE_BF16", problem.dtype == DType::kBf16 ? 1 : 0},
      {"ATT_CAUSAL", problem.causal ? 1 : 0},
  };
  // V's head dim where it is not d (`dv=N`): only then, so that every other build renders as before.
  if (problem.split_dims()) defs.emplace_back("ATT_HEAD_DIM_V", problem.dv);
  // V is K's first dv columns (`latent=1`): only then, so that every other build renders as before. A
  // latent build serves only calls whose v is k with k's strides (attntune_plan::check_latent).
  if (problem.latent) defs.emplace_back("ATT_LATENT", 1);
  // An FP8 e4m3 KV cache (`kv_dtype=fp8`): only then, so that every other build renders as before. Such a
  // build reads its cache as FP8 only, and serves only calls that say so (attntune_plan::check_kv_dtype).
  if (problem.kv_fp8) defs.emplace_back("ATT_KV_FP8", 1);
  // An FP8 forward (`dtype=fp8`: e4m3 Q, K and V^T, O bf16, so ATT_DTYPE_BF16 1): only then. Such a build
  // serves only calls that say so (attntune_plan::check_kv_dtype).
  if (problem.qkv_fp8) defs.emplace_back("ATT_QKV_FP8", 1);
  // The backward pass (`pass=bwd`): only then, so that every forward build renders as before. Such a
  // build computes dQ, dK and dV and serves attntune_attention_backward alone (served_entries).
  if (problem.backward) defs.emplace_back("ATT_BWD", 1);
  // A packed batch (the varlen entry point); only then, so that every other build renders as before.
  if (problem.is_varlen()) defs.emplace_back("ATT_VARLEN", 1);
  // A KV cache (the kvcache entry point), for a family that builds per entry point: only then.
  if (problem.paged() && !find_test_family(space.family()) && builtin_family(space.family()).build_per_entry)
    defs.emplace_back("ATT_KVCACHE", 1);
  // The variants a build is compiled with (their sizes and values are run-time arguments), only when
  // the problem has them: plain builds render as before. A build serves exactly its variants
  // (attntune_plan::check_variants).
  if (problem.windowed()) defs.emplace_back("ATT_WINDOW", 1);
  if (problem.softcapped()) defs.emplace_back("ATT_SOFTCAP", 1);
  if (problem.sinks) defs.emplace_back("ATT_SINKS", 1);
  for (const auto& param : space.params()) {
    const Value& v = *param_value(config, param);  // check() above: named or defaulted
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
  if (const TestFamily* t = find_test_family(space.family())) return t->render(space, config, problem, arch);
  const Family& fam = builtin_family(space.family());
  Defines defines = kernel_defines(space, config, problem, arch);
  std::string src = fmt::format("// attntune candidate: {} {} (d={}{}, dtype={}, causal={}{}{}{}{})\n", fam.name,
                                config_str(space.complete(config)), problem.d,
                                problem.split_dims() ? fmt::format(", dv={}{}", problem.dv, problem.latent ? ", latent=1" : "")
                                                     : std::string(),
                                problem.dtype_spec(), problem.causal ? 1 : 0,
                                problem.has_variant() ? ", " : "", problem.variant_words(),
                                problem.kv_fp8 ? ", kv_dtype=fp8" : "", problem.backward ? ", pass=bwd" : "");
  for (const auto& [name, value] : defines) src += fmt::format("#define {} {}\n", name, value);
  src += flatten_includes(fam.main_file);
  RenderedKernel r;
  r.source_hash = content_hash(src);
  r.source = std::move(src);
  r.kernel_name = fam.plan->kernel_names[0];
  r.launch = {fam.name, std::move(defines)};
  return r;
}

std::int64_t define_value(const Defines& defines, const std::string& name) {
  for (const auto& [k, v] : defines)
    if (k == name) return v;
  throw std::logic_error("a build's constants lack " + name);
}

std::vector<attntune_plan::Define> plan_defines(const Defines& defines) {
  std::vector<attntune_plan::Define> out;
  out.reserve(defines.size());
  for (const auto& [k, v] : defines) out.push_back({k.c_str(), static_cast<long long>(v)});
  return out;
}

attntune_plan::Call problem_dense_call(const Problem& p, long long base) {
  attntune_plan::Call c = attntune_plan::empty_call();
  c.entry = attntune_plan::kEntryDense;
  const long long elems_q = p.b * p.h * p.s * p.d, elems_kv = p.b * p.hkv * p.sk * p.d;
  c.q = reinterpret_cast<const void*>(base);
  c.k = reinterpret_cast<const void*>(base + elems_q * 2 + 256);
  c.v = reinterpret_cast<const void*>(base + elems_q * 2 + elems_kv * 2 + 512);
  c.out = reinterpret_cast<void*>(base + elems_q * 2 + elems_kv * 4 + 768);
  c.batch = static_cast<int>(p.b);
  c.heads_q = static_cast<int>(p.h);
  c.heads_kv = static_cast<int>(p.hkv);
  c.seqlen_q = static_cast<int>(p.s);
  c.seqlen_k = static_cast<int>(p.sk);
  c.head_dim = static_cast<int>(p.d);
  auto strides = [&](long long* st, std::int64_t heads, std::int64_t len) {
    st[0] = heads * len * p.d;
    st[1] = len * p.d;
    st[2] = p.d;
  };
  strides(c.q_stride, p.h, p.s);
  strides(c.o_stride, p.h, p.s);
  strides(c.k_stride, p.hkv, p.sk);
  strides(c.v_stride, p.hkv, p.sk);
  c.scale = 0.125f;
  c.causal = p.causal ? 1 : 0;
  return c;
}

std::optional<attntune_plan::Plan> plan_call(const LaunchSpec& spec, const attntune_plan::Call& call,
                                             const attntune_plan::Device& device, std::string* why) {
  const attntune_plan::LaunchFamily& f = *builtin_family(spec.plan).plan;
  const auto defs = plan_defines(spec.defines);
  attntune_plan::Consts consts{};
  attntune_plan::Why reason;
  if (f.load(defs.data(), static_cast<int>(defs.size()), consts.bytes, &reason))
    throw std::logic_error(fmt::format("{}: {}", spec.plan, reason.text));
  attntune_plan::Plan plan;
  if (f.plan(consts.bytes, call, device, &plan, &reason)) {
    if (why) *why = reason.text;
    return std::nullopt;
  }
  return plan;
}

std::string base_arch(const std::string& arch) {
  return !arch.empty() && arch.back() == 'a' ? arch.substr(0, arch.size() - 1) : arch;
}

std::string space_arch_for_device(const SearchSpace& space, const std::string& device_arch) {
  const auto& archs = space.archs();
  if (std::find(archs.begin(), archs.end(), device_arch) != archs.end()) return device_arch;
  const std::string specific = device_arch + "a";
  if (std::find(archs.begin(), archs.end(), specific) != archs.end()) return specific;
  return device_arch;
}


}  // namespace attntune
