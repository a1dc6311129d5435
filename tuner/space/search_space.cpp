// SearchSpace semantics: problem support, enumeration, checking and deriving. Loading from YAML is
// in search_space_yaml.cpp.
#include "space/search_space.hpp"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>

#include "core/embedded.hpp"
#include "core/text.hpp"

namespace attntune {

namespace {

// sm_90a -> (90, 1); used to pick the highest arch.
std::pair<int, int> arch_rank(const std::string& arch) {
  int n = 0;
  std::from_chars(arch.data() + 3, arch.data() + arch.size(), n);
  return {n, arch.back() == 'a' ? 1 : 0};
}

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return "";
  return std::string(s.substr(b, s.find_last_not_of(" \t") - b + 1));
}

}  // namespace

std::string domain_text(const Param& p) {
  std::vector<std::string> v;
  for (const auto& x : p.values) v.push_back(value_str(x));
  return join(v);
}

const Value* param_value(const Config& c, const Param& p) {
  const auto it = c.find(p.name);
  if (it != c.end()) return &it->second;
  return p.default_value ? &*p.default_value : nullptr;
}

const char* param_kind_name(ParamKind k) {
  switch (k) {
    case ParamKind::kInt: return "int";
    case ParamKind::kBool: return "bool";
    case ParamKind::kEnum: return "enum";
  }
  return "?";
}

std::string SearchSpace::default_arch() const {
  return *std::max_element(archs_.begin(), archs_.end(),
                           [](const std::string& a, const std::string& b) { return arch_rank(a) < arch_rank(b); });
}

std::vector<std::pair<std::string, std::int64_t>> SearchSpace::device_limits(const std::string& arch) const {
  auto it = std::find(archs_.begin(), archs_.end(), arch);
  if (it == archs_.end())
    throw InputError(fmt::format("{} does not support arch {} (supported: {})", family_, arch, join(archs_)));
  const auto& values = limit_values_[static_cast<std::size_t>(it - archs_.begin())];
  std::vector<std::pair<std::string, std::int64_t>> out;
  for (std::size_t i = 0; i < limit_names_.size(); ++i) out.emplace_back(limit_names_[i], values[i]);
  return out;
}

// ---- planning ---------------------------------------------------------------------------------

void SearchSpace::plan() {
  const int n = static_cast<int>(params_.size());
  // The level of an expression: after how many bound params all of its inputs are known.
  auto level_of = [&](const Expr& e) {
    int level = 0;
    for (int slot : e.slots_used()) {
      if (slot >= derived_base_) level = std::max(level, derived_[static_cast<std::size_t>(slot - derived_base_)].level);
      else if (slot >= param_base_) level = std::max(level, slot - param_base_ + 1);
    }
    return level;
  };
  for (auto& d : derived_) d.level = level_of(d.expr);
  for (auto& c : constraints_) c.level = level_of(c.expr);

  // Each constraint is preceded by the derived quantities it needs that are not computed yet, so
  // enumeration computes only what some constraint reads, and a derived value that would fail
  // (say, divide by zero) is not computed for points an earlier constraint already rejected.
  auto schedule = [&](int c, std::vector<Step>& steps, std::vector<bool>& done) {
    std::vector<int> need;
    std::vector<int> stack;
    for (int slot : constraints_[static_cast<std::size_t>(c)].expr.slots_used())
      if (slot >= derived_base_) stack.push_back(slot - derived_base_);
    while (!stack.empty()) {
      const int d = stack.back();
      stack.pop_back();
      if (done[static_cast<std::size_t>(d)] || std::find(need.begin(), need.end(), d) != need.end()) continue;
      need.push_back(d);
      for (int slot : derived_[static_cast<std::size_t>(d)].expr.slots_used())
        if (slot >= derived_base_) stack.push_back(slot - derived_base_);
    }
    std::sort(need.begin(), need.end());  // declaration order respects dependencies
    for (int d : need) {
      steps.push_back({false, d});
      done[static_cast<std::size_t>(d)] = true;
    }
    steps.push_back({true, c});
  };

  steps_by_level_.assign(static_cast<std::size_t>(n) + 1, {});
  std::vector<bool> done(derived_.size(), false);
  for (int level = 0; level <= n; ++level)
    for (int c = 0; c < static_cast<int>(constraints_.size()); ++c)
      if (constraints_[static_cast<std::size_t>(c)].level == level)
        schedule(c, steps_by_level_[static_cast<std::size_t>(level)], done);

  check_steps_.clear();
  for (const auto& steps : steps_by_level_) check_steps_.insert(check_steps_.end(), steps.begin(), steps.end());

  subtree_size_.assign(static_cast<std::size_t>(n) + 1, 1);
  for (int i = n - 1; i >= 0; --i)
    subtree_size_[static_cast<std::size_t>(i)] =
        subtree_size_[static_cast<std::size_t>(i) + 1] * encoded_[static_cast<std::size_t>(i)].size();
  raw_size_ = subtree_size_[0];
}

// ---- binding ----------------------------------------------------------------------------------

void SearchSpace::bind_problem(const Problem& p, const std::string& arch, std::vector<std::int64_t>& slots) const {
  auto it = std::find(archs_.begin(), archs_.end(), arch);
  if (it == archs_.end())
    throw InputError(fmt::format("{} does not support arch {} (supported: {})", family_, arch, join(archs_)));
  slots.assign(static_cast<std::size_t>(scope_.size()), 0);
  slots[0] = p.b;
  slots[1] = p.h;
  slots[2] = p.hkv;
  slots[3] = p.s;
  slots[4] = p.sk;
  slots[5] = p.d;
  slots[6] = *scope_.symbol_id(p.dtype_spec());  // fp16, bf16, or fp8 (an FP8 forward)
  slots[7] = p.causal;
  slots[8] = p.page;
  slots[9] = p.varlen;
  slots[10] = p.windowed();
  slots[11] = p.window_left;
  slots[12] = p.right_bound();
  slots[13] = p.softcapped();
  slots[14] = p.sinks;
  slots[15] = p.head_dim_v();
  slots[16] = p.latent;
  slots[17] = p.kv_fp8;
  slots[18] = p.backward;
  const auto& limits = limit_values_[static_cast<std::size_t>(it - archs_.begin())];
  std::copy(limits.begin(), limits.end(), slots.begin() + limit_base_);
}

std::optional<std::string> SearchSpace::bind_config(const Config& c, std::vector<std::int64_t>& slots) const {
  for (const auto& [name, value] : c) {
    (void)value;
    if (std::none_of(params_.begin(), params_.end(), [&](const Param& p) { return p.name == name; }))
      return fmt::format("unknown parameter {}", name);
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Param& p = params_[i];
    const Value* value = param_value(c, p);
    if (!value) return fmt::format("missing parameter {}", p.name);
    auto pos = std::find(p.values.begin(), p.values.end(), *value);
    if (pos == p.values.end())
      return fmt::format("{}={} is not in the domain of {} ({})", p.name, value_str(*value), p.name, domain_text(p));
    slots[static_cast<std::size_t>(param_base_) + i] = encoded_[i][static_cast<std::size_t>(pos - p.values.begin())];
  }
  return std::nullopt;
}

Config SearchSpace::decode(const std::int64_t* slots) const {
  Config c;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::int64_t v = slots[static_cast<std::size_t>(param_base_) + i];
    switch (params_[i].kind) {
      case ParamKind::kInt: c.emplace(params_[i].name, v); break;
      case ParamKind::kBool: c.emplace(params_[i].name, v != 0); break;
      case ParamKind::kEnum: c.emplace(params_[i].name, scope_.symbol(v)); break;
    }
  }
  return c;
}

int SearchSpace::run_steps(const std::vector<Step>& steps, std::int64_t* slots) const {
  for (const Step& s : steps) {
    if (s.constraint) {
      if (!constraints_[static_cast<std::size_t>(s.index)].expr.eval(slots)) return s.index;
    } else {
      slots[derived_base_ + s.index] = derived_[static_cast<std::size_t>(s.index)].expr.eval(slots);
    }
  }
  return -1;
}

// ---- problem support --------------------------------------------------------------------------

void SearchSpace::check_problem(const Problem& p, const std::string& arch) const {
  std::vector<std::int64_t> slots;
  bind_problem(p, arch, slots);
  // V's head dim other than d only where the problem section lists `dv` (then its values rule).
  if (p.split_dims() && std::none_of(problem_support_text_.begin(), problem_support_text_.end(),
                                     [](const auto& f) { return f.first == "dv"; }))
    throw InputError(fmt::format("{} does not support a value head dim other than the query/key one (the problem {} "
                                 "has d={}, dv={}; its space's problem section does not list `dv`)",
                                 family_, p.str(), p.d, p.dv));
  // V as K's first dv columns (`latent=1`) only where the problem section lists `latent` (as `dv`).
  if (p.latent && std::none_of(problem_support_text_.begin(), problem_support_text_.end(),
                               [](const auto& f) { return f.first == "latent"; }))
    throw InputError(fmt::format("{} does not support a latent cache (the problem {} has latent=1: V is the first "
                                 "dv={} columns of K; its space's problem section does not list `latent`)",
                                 family_, p.str(), p.dv));
  // An FP8 e4m3 KV cache (`kv_dtype=fp8`) only where the problem section lists `kv_fp8` (as `latent`).
  if (p.kv_fp8 && std::none_of(problem_support_text_.begin(), problem_support_text_.end(),
                               [](const auto& f) { return f.first == "kv_fp8"; }))
    throw InputError(fmt::format("{} does not support an FP8 KV cache (the problem {} has kv_dtype=fp8; its space's "
                                 "problem section does not list `kv_fp8`)",
                                 family_, p.str()));
  // The passes the problem section lists (`pass: [fwd, bwd]`); without `pass`, the forward alone. A
  // backward problem only where it lists bwd, a forward one only where it lists fwd.
  const auto pass = std::find_if(problem_support_text_.begin(), problem_support_text_.end(),
                                 [](const auto& f) { return f.first == "pass"; });
  const auto lists = [&](const char* name) {
    return pass == problem_support_text_.end() ? std::string(name) == "fwd"
                                               : std::find(pass->second.begin(), pass->second.end(), name) !=
                                                     pass->second.end();
  };
  if (p.backward && !lists("bwd"))
    throw InputError(fmt::format("{} does not support the backward pass (the problem {} has pass=bwd; its space's "
                                 "problem section does not list `pass: [bwd]`)",
                                 family_, p.str()));
  if (!p.backward && !lists("fwd"))
    throw InputError(fmt::format("{} does not support the forward pass (the problem {} is a forward one; its space's "
                                 "problem section lists `pass: [bwd]` only: add pass=bwd to tune the backward pass)",
                                 family_, p.str()));
  for (std::size_t i = 0; i < problem_rules_.size(); ++i) {
    const ProblemRule& r = problem_rules_[i];
    if (std::find(r.values.begin(), r.values.end(), slots[static_cast<std::size_t>(r.field)]) == r.values.end()) {
      const auto& [key, text] = problem_support_text_[i];
      if (key == "window" || key == "softcap" || key == "sinks") {
        const char* what = key == "window" ? "sliding windows" : key == "softcap" ? "logit soft-capping" : "attention sinks";
        throw InputError(fmt::format("{} does not support {} (the problem {} has {}; its space's problem section "
                                     "does not list `{}: [true]`)",
                                     family_, what, p.str(), p.variant_words(), key));
      }
      const std::string value = key == "dtype" ? p.dtype_spec()
                                : key == "causal" ? (p.causal ? "1" : "0")
                                                  : std::to_string(slots[static_cast<std::size_t>(r.field)]);
      throw InputError(fmt::format("{} does not support {}={} (supported: {})", family_, key, value, join(text)));
    }
  }
  for (std::size_t i = 0; i < problem_constraints_.size(); ++i) {
    if (!problem_constraints_[i].eval(slots.data())) {
      const auto& def = problem_constraint_defs_[i];
      throw InputError(fmt::format("{} does not support the problem {}: {}", family_, p.str(),
                                   def.why.empty() ? "'" + def.expr + "' does not hold" : def.why));
    }
  }
}

// ---- enumeration ------------------------------------------------------------------------------

template <class Visit>
void SearchSpace::dfs(int depth, std::int64_t* slots, Visit& visit, PruneStats* stats) const {
  const int failed = run_steps(steps_by_level_[static_cast<std::size_t>(depth)], slots);
  if (failed >= 0) {
    if (stats) stats->rejected_by[static_cast<std::size_t>(failed)] += subtree_size_[static_cast<std::size_t>(depth)];
    return;
  }
  if (depth == static_cast<int>(params_.size())) {
    if (stats) ++stats->valid;
    visit(slots);
    return;
  }
  std::int64_t& slot = slots[param_base_ + depth];
  for (std::int64_t v : encoded_[static_cast<std::size_t>(depth)]) {
    slot = v;
    dfs(depth + 1, slots, visit, stats);
  }
}

template <class Visit>
void SearchSpace::walk(const Problem& p, const std::string& arch, Visit& visit, PruneStats* stats) const {
  check_problem(p, arch);
  std::vector<std::int64_t> slots;
  bind_problem(p, arch, slots);
  if (stats) *stats = {raw_size_, 0, std::vector<std::uint64_t>(constraints_.size(), 0)};
  dfs(0, slots.data(), visit, stats);
}

std::vector<Config> SearchSpace::enumerate(const Problem& p, const std::string& arch) const {
  std::vector<Config> out;
  auto visit = [&](const std::int64_t* slots) { out.push_back(decode(slots)); };
  walk(p, arch, visit, nullptr);
  return out;
}

std::uint64_t SearchSpace::count(const Problem& p, const std::string& arch) const {
  std::uint64_t n = 0;
  auto visit = [&](const std::int64_t*) { ++n; };
  walk(p, arch, visit, nullptr);
  return n;
}

void SearchSpace::for_each_valid(const Problem& p, const std::string& arch,
                                 const std::function<void(const Config&)>& visit, PruneStats* stats) const {
  auto v = [&](const std::int64_t* slots) { visit(decode(slots)); };
  walk(p, arch, v, stats);
}

// ---- one config -------------------------------------------------------------------------------

std::optional<std::string> SearchSpace::check(const Config& c, const Problem& p, const std::string& arch) const {
  check_problem(p, arch);
  std::vector<std::int64_t> slots;
  bind_problem(p, arch, slots);
  if (auto why = bind_config(c, slots)) return why;
  const int failed = run_steps(check_steps_, slots.data());
  if (failed < 0) return std::nullopt;
  const ConstraintDef& def = constraint_defs_[static_cast<std::size_t>(failed)];
  return def.why.empty() ? def.expr : def.why;
}

std::vector<std::pair<std::string, std::int64_t>> SearchSpace::derive(const Config& c, const Problem& p,
                                                                      const std::string& arch) const {
  std::vector<std::int64_t> slots;
  bind_problem(p, arch, slots);
  if (auto why = bind_config(c, slots)) throw InputError(fmt::format("config {}: {}", config_str(c), *why));
  std::vector<std::pair<std::string, std::int64_t>> out;
  for (std::size_t i = 0; i < derived_.size(); ++i) {
    const std::int64_t v = derived_[i].expr.eval(slots.data());
    slots[static_cast<std::size_t>(derived_base_) + i] = v;
    out.emplace_back(derived_defs_[i].name, v);
  }
  return out;
}

Config SearchSpace::parse_config(const std::string& text) const {
  std::vector<std::string> names;
  for (const auto& p : params_) names.push_back(p.name);
  if (trim(text).empty())
    throw InputError(fmt::format("config: empty (expected {})", join(names)));
  Config c;
  std::size_t pos = 0;
  for (;;) {
    std::size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos || trim(item.substr(0, eq)).empty())
      throw InputError(fmt::format("config: '{}' is not name=value", trim(item)));
    const std::string key = trim(item.substr(0, eq)), val = trim(item.substr(eq + 1));
    auto it = std::find(names.begin(), names.end(), key);
    if (it == names.end()) {
      auto hint = closest_name(key, names);
      throw InputError(fmt::format("config: unknown parameter '{}'{} (parameters of {}: {})", key,
                                   hint ? fmt::format(" (did you mean '{}'?)", *hint) : "", family_, join(names)));
    }
    if (c.count(key)) throw InputError(fmt::format("config: parameter '{}' given twice", key));
    const Param& p = params_[static_cast<std::size_t>(it - names.begin())];
    Value v;
    switch (p.kind) {
      case ParamKind::kInt: {
        std::int64_t x = 0;
        auto [ptr, ec] = std::from_chars(val.data(), val.data() + val.size(), x);
        if (val.empty() || ec != std::errc() || ptr != val.data() + val.size())
          throw InputError(fmt::format("config: '{}={}': expected an integer", key, val));
        v = x;
        break;
      }
      case ParamKind::kBool:
        if (val == "true" || val == "1") v = true;
        else if (val == "false" || val == "0") v = false;
        else throw InputError(fmt::format("config: '{}={}': expected true, false, 1 or 0", key, val));
        break;
      case ParamKind::kEnum:
        v = val;
        break;
    }
    if (std::find(p.values.begin(), p.values.end(), v) == p.values.end())
      throw InputError(fmt::format("config: {}={} is not in the domain of {} ({})", key, val, key, domain_text(p)));
    c.emplace(key, std::move(v));
    if (end == text.size()) break;
    pos = end + 1;
  }
  c = complete(std::move(c));
  for (const auto& n : names)
    if (!c.count(n)) throw InputError(fmt::format("config: missing parameter '{}' (parameters of {}: {})", n, family_, join(names)));
  return c;
}

Config SearchSpace::complete(Config c) const {
  for (const Param& p : params_)
    if (!c.count(p.name) && p.default_value) c.emplace(p.name, *p.default_value);
  return c;
}

std::optional<SearchSpace> SearchSpace::shipped(const std::string& family) {
  const std::string path = fmt::format("search_spaces/{}.yaml", family);
  const auto& files = embedded_files();
  const auto it = files.find(path);
  if (it == files.end()) return std::nullopt;
  return SearchSpace::parse(std::string(it->second), path);
}

}  // namespace attntune
