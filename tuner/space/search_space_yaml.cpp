// Reading a search space from YAML (format: search_spaces/README.md). Every rejection names the
// file, line and column of the offending key, value or expression token.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "core/hash.hpp"
#include "core/input_file.hpp"
#include "core/text.hpp"
#include "core/yaml_input.hpp"
#include "space/search_space.hpp"

namespace attntune {

namespace {

constexpr std::size_t kMaxDomain = std::size_t{1} << 20;
constexpr std::size_t kMaxParams = 256;
// b h hkv s sk d dtype causal page varlen window window_left window_right softcap sinks dv latent kv_fp8 bwd:
// slots 0..18
constexpr int kProblemFields = 19;

const std::vector<std::string> kTopKeys = {"family", "description", "archs", "device_limits",
                                           "problem", "params", "derived", "constraints"};
const std::vector<std::string> kProblemInts = {"b", "h", "hkv", "s", "sk", "d"};
// In slot order (search_space.hpp): the ints, dtype, causal, then page (added with the kvcache entry),
// varlen (added with the varlen entry) and the variants (window: any window; window_left and
// window_right its sides as the kernel applies them, -1 unbounded, 0 right when causal; softcap;
// sinks), then dv (V's head dim: d unless the problem names another; added with `dv=N`), then latent
// (V is K's first dv columns; added with `latent=1`), then kv_fp8 (an FP8 e4m3 KV cache; added with
// `kv_dtype=fp8`), then pass (slot `bwd`: the backward pass, `pass=bwd`; the section lists the passes
// a space tunes, `pass: [fwd, bwd]`, and without it the forward alone).
const std::vector<std::string> kProblemKeys = {"b",           "h",           "hkv",          "s",
                                               "sk",          "d",           "dtype",        "causal",
                                               "page",        "varlen",      "window",       "window_left",
                                               "window_right", "softcap",    "sinks",        "dv",
                                               "latent",       "kv_fp8",     "pass",         "constraints"};
// The variants a space serves only where its problem section says so (`window: [false, true]`): a
// space that does not name one refuses problems with it.
const std::vector<std::string> kVariantKeys = {"window", "softcap", "sinks"};
const std::vector<std::string> kKeywords = {"true", "false", "and", "or", "not"};
const std::vector<std::string> kFunctionNames = {"min", "max", "ceil_div", "is_pow2", "log2"};

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string did_you_mean(const std::string& name, const std::vector<std::string>& known) {
  auto hint = closest_name(name, known);
  return hint ? fmt::format(" (did you mean '{}'?)", *hint) : "";
}

bool is_plain(const YAML::Node& n) { return n.Tag() == "?"; }

// [a-z][a-z0-9_]* (or [a-z_][a-z0-9_]* with `underscore_first`), by hand: std::regex_match
// recurses once per character in libstdc++, so a name of a few hundred KiB overflowed the stack.
bool is_lower_name(std::string_view s, bool underscore_first = false) {
  if (s.empty()) return false;
  auto lower = [](char c) { return c >= 'a' && c <= 'z'; };
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  if (!lower(s[0]) && !(underscore_first && s[0] == '_')) return false;
  return std::all_of(s.begin() + 1, s.end(), [&](char c) { return lower(c) || digit(c) || c == '_'; });
}

// sm_NN, sm_NNN, each optionally followed by 'a'.
bool is_arch(std::string_view s) {
  if (s.rfind("sm_", 0) != 0) return false;
  std::string_view rest = s.substr(3);
  if (!rest.empty() && rest.back() == 'a') rest.remove_suffix(1);
  return (rest.size() == 2 || rest.size() == 3) &&
         std::all_of(rest.begin(), rest.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

class SpaceLoader {
 public:
  SpaceLoader(const std::string& text, const std::string& file) : text_(text), file_(file) {
    line_starts_.push_back(0);
    for (std::size_t i = 0; i < text_.size(); ++i)
      if (text_[i] == '\n') line_starts_.push_back(i + 1);
  }

  SearchSpace run();

 private:
  // A key and its value, with the dotted path used in messages ("params.block_n").
  struct Entry {
    std::string name;
    YAML::Node key;
    YAML::Node value;
    std::string path;
  };

  SourcePos pos(const YAML::Mark& m) const {
    if (m.line < 0) return {file_, 1, 1};
    return {file_, m.line + 1, m.column + 1};
  }
  // Null values have no useful mark of their own; messages about them point at their key.
  SourcePos pos(const Entry& e) const { return pos(e.value.IsNull() ? e.key.Mark() : e.value.Mark()); }
  [[noreturn]] void fail(const SourcePos& at, const std::string& msg) const {
    throw InputError(fmt::format("{}: {}", at.str(), msg));
  }
  [[noreturn]] void fail(const YAML::Node& n, const std::string& msg) const { fail(pos(n.Mark()), msg); }
  [[noreturn]] void fail(const Entry& e, const std::string& msg) const { fail(pos(e), e.path + ": " + msg); }

  SourcePos expr_pos(const YAML::Node& n, int column) const;
  void check_duplicate_keys(const YAML::Node& n) const;
  std::vector<Entry> entries(const Entry& map, const std::vector<std::string>& known) const;
  std::vector<YAML::Node> list(const Entry& e) const;
  std::string scalar(const Entry& e, const YAML::Node& n, std::string_view what) const;
  std::int64_t integer(const Entry& e, const YAML::Node& n) const;
  bool boolean(const Entry& e, const YAML::Node& n) const;
  void check_name(const Entry& e, const std::string& what);
  void claim(const std::string& name, const std::string& what, const YAML::Node& at, const std::string& path);
  void read_archs(const Entry& e);
  void read_device_limits(const Entry& e);
  void read_problem(const Entry& e);
  void add_variant_defaults();  // a variant the problem section does not list: refused
  void read_param(const Entry& e);
  void read_derived(const Entry& e);
  void read_constraint(const Entry& e, const YAML::Node& item);
  YAML::Node expr_node(const Entry& e, const std::string& note, std::string& note_value) const;
  Expr compile(const Entry& e, const YAML::Node& n, int visible, std::string_view why);

  const std::string& text_;
  std::string file_;
  std::vector<std::size_t> line_starts_;
  SearchSpace sp_;
  std::map<std::string, std::pair<std::string, int>> names_;  // name -> (what it is, line)
};

// ---- positions --------------------------------------------------------------------------------

// The file position of column `column` of an expression scalar. yaml-cpp marks where the scalar's
// token starts (the quote or the block indicator); walking the source alongside the value handles
// quotes, doubled single quotes and lines folded into spaces. Anything else falls back to the
// scalar's start plus the column.
SourcePos SpaceLoader::expr_pos(const YAML::Node& n, int column) const {
  const YAML::Mark m = n.Mark();
  const std::string& value = n.Scalar();
  std::size_t p = static_cast<std::size_t>(std::max(0, m.pos));
  const bool single = p < text_.size() && text_[p] == '\'';
  const bool dbl = p < text_.size() && text_[p] == '"';
  const SourcePos fallback{file_, m.line + 1, m.column + 1 + (single || dbl ? 1 : 0) + column - 1};
  auto line_of = [&](std::size_t off) {
    return static_cast<int>(std::upper_bound(line_starts_.begin(), line_starts_.end(), off) - line_starts_.begin());
  };
  if (m.pos < 0 || p >= text_.size() || line_of(p) != m.line + 1) return fallback;
  if (single || dbl) {
    ++p;
  } else if (text_[p] == '|' || text_[p] == '>') {
    p = text_.find('\n', p);
    if (p == std::string::npos) return fallback;
    while (p < text_.size() && std::isspace(static_cast<unsigned char>(text_[p]))) ++p;
  }
  const std::size_t k = std::min(value.size(), static_cast<std::size_t>(std::max(0, column - 1)));
  auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  std::size_t i = 0;
  while (i < k) {
    if (p >= text_.size()) return fallback;
    if (single && value[i] == '\'' && text_.compare(p, 2, "''") == 0) {
      p += 2, ++i;
    } else if (space(value[i]) && space(text_[p])) {  // folded lines, block indentation
      while (i < k && space(value[i])) ++i;
      while (p < text_.size() && space(text_[p])) ++p;
    } else if (text_[p] == value[i] && !(dbl && text_[p] == '\\')) {
      ++p, ++i;
    } else {
      return fallback;
    }
  }
  const int line = line_of(p);
  return {file_, line, static_cast<int>(p - line_starts_[static_cast<std::size_t>(line - 1)]) + 1};
}

// yaml-cpp keeps both entries of a duplicated key (and lookups see only the first), so a second
// `block_m:` would be ignored without a word.
void SpaceLoader::check_duplicate_keys(const YAML::Node& n) const {
  if (n.IsMap()) {
    std::map<std::string, int> seen;
    for (auto it = n.begin(); it != n.end(); ++it) {
      if (it->first.IsScalar()) {
        auto [at, added] = seen.emplace(it->first.Scalar(), it->first.Mark().line + 1);
        if (!added) fail(it->first, fmt::format("duplicate key '{}' (first at line {})", it->first.Scalar(), at->second));
      }
      check_duplicate_keys(it->first);
      check_duplicate_keys(it->second);
    }
  } else if (n.IsSequence()) {
    for (const auto& x : n) check_duplicate_keys(x);
  }
}

// ---- typed accessors --------------------------------------------------------------------------

std::vector<SpaceLoader::Entry> SpaceLoader::entries(const Entry& map, const std::vector<std::string>& known) const {
  if (!map.value.IsMap()) fail(map, "expected a mapping");
  std::vector<Entry> out;
  for (auto it = map.value.begin(); it != map.value.end(); ++it) {
    if (!it->first.IsScalar()) fail(it->first, fmt::format("{}: keys must be plain names", map.path));
    const std::string k = it->first.Scalar();
    const std::string path = map.path.empty() ? k : map.path + "." + k;
    if (!known.empty() && !contains(known, k))
      fail(it->first, fmt::format("{}: unknown key '{}'{}; expected one of: {}", map.path.empty() ? "top level" : map.path,
                                  k, did_you_mean(k, known), join(known)));
    out.push_back({k, it->first, it->second, path});
  }
  return out;
}

std::vector<YAML::Node> SpaceLoader::list(const Entry& e) const {
  if (!e.value.IsSequence())
    fail(e, e.value.IsNull() ? "expected a list, got nothing" : "expected a list like [a, b]");
  if (e.value.size() == 0) fail(e, "empty list");
  return {e.value.begin(), e.value.end()};
}

std::string SpaceLoader::scalar(const Entry& e, const YAML::Node& n, std::string_view what) const {
  if (!n.IsScalar()) fail(n.IsNull() ? pos(e) : pos(n.Mark()), fmt::format("{}: expected {}", e.path, what));
  return n.Scalar();
}

std::int64_t SpaceLoader::integer(const Entry& e, const YAML::Node& n) const {
  const std::string s = scalar(e, n, "an integer");
  std::int64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (!is_plain(n) || s.empty() || ec != std::errc() || ptr != s.data() + s.size()) {
    const bool named = !s.empty() && (std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_');
    fail(n, fmt::format("{}: expected an integer, got {}{}", e.path, is_plain(n) ? "'" + s + "'" : "the string \"" + s + "\"",
                        named && e.path.rfind("params.", 0) == 0 ? " (named values need {enum: [...]})" : ""));
  }
  return v;
}

bool SpaceLoader::boolean(const Entry& e, const YAML::Node& n) const {
  const std::string s = scalar(e, n, "true or false");
  if (is_plain(n) && (s == "true" || s == "false")) return s == "true";
  fail(n, fmt::format("{}: expected true or false, got '{}'", e.path, s));
}

// Validates the name of a param, derived quantity or device limit and claims it.
void SpaceLoader::check_name(const Entry& e, const std::string& what) {
  const std::string& n = e.name;
  // Lowercase-only names cannot collide once upper-cased into macros (block_n -> BLOCK_N).
  if (!is_lower_name(n))
    fail(e.key, fmt::format("{}: '{}' is not a valid {} name (lowercase letters, digits and '_', starting with a letter)",
                            e.path, n, what));
  // `bwd` is the slot of the problem section's `pass` (the one key whose field has another name).
  if ((contains(kProblemKeys, n) && n != "constraints") || n == "bwd")
    fail(e.key, fmt::format("{}: '{}' is reserved: it is a problem field", e.path, n));
  if (contains(kKeywords, n)) fail(e.key, fmt::format("{}: '{}' is reserved: it is a keyword", e.path, n));
  if (contains(kFunctionNames, n)) fail(e.key, fmt::format("{}: '{}' is reserved: it is a function", e.path, n));
  if (n.rfind("att_", 0) == 0)
    fail(e.key, fmt::format("{}: '{}' is reserved: names starting with att_ are the kernel renderer's (ATT_HEAD_DIM, ...)",
                            e.path, n));
  claim(n, "a " + what, e.key, e.path);
}

// Params, derived quantities and the constants of enum values (kv_schedule_blockwise) all become
// C macros when a kernel is rendered, so they share one namespace.
void SpaceLoader::claim(const std::string& name, const std::string& what, const YAML::Node& at, const std::string& path) {
  auto it = names_.find(name);
  if (it != names_.end()) {
    const std::string& other = it->second.first;
    std::string why;
    if (other.rfind("the constant", 0) == 0 || what.rfind("the constant", 0) == 0) {
      std::string macro = name;
      for (char& c : macro) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      why = fmt::format("; both would be the macro {}", macro);
    } else if (what == "a derived quantity" && other == "a parameter") {
      why = "; a derived name may not shadow it";
    }
    fail(at, fmt::format("{}: '{}' is already {} (line {}){}", path, name, other, it->second.second, why));
  }
  names_[name] = {what, at.Mark().line + 1};
}

// An expression entry: a scalar, or a mapping {expr: ..., <note>: ...}. (Nodes are never assigned
// to: yaml-cpp's Node::operator= writes through to the document.)
YAML::Node SpaceLoader::expr_node(const Entry& e, const std::string& note, std::string& note_value) const {
  if (!e.value.IsMap()) return e.value;
  std::optional<YAML::Node> expr;
  for (const Entry& k : entries(e, {"expr", note})) {
    if (k.name == "expr") expr.emplace(k.value);
    else note_value = scalar(k, k.value, "a string");
  }
  if (!expr || expr->IsNull()) fail(e, "missing 'expr'");
  return *expr;
}

Expr SpaceLoader::compile(const Entry& e, const YAML::Node& n, int visible, std::string_view why) {
  if (!n.IsScalar()) fail(n.IsNull() ? pos(e) : pos(n.Mark()), e.path + ": expected an expression");
  if (n.Tag() != "?" && n.Tag() != "!")
    fail(n, fmt::format("{}: '{}' was read as a YAML tag; quote the expression (or write 'not' for '!')", e.path, n.Tag()));
  try {
    Expr x = Expr::compile(n.Scalar(), sp_.scope_, visible, why);
    x.set_origin(fmt::format("{}: {}", expr_pos(n, 1).str(), e.path));
    return x;
  } catch (const ExprError& err) {
    fail(expr_pos(n, err.column()), fmt::format("{}: {}", e.path, err.message()));
  }
}

// ---- sections ---------------------------------------------------------------------------------

void SpaceLoader::read_archs(const Entry& e) {
  for (const auto& n : list(e)) {
    const std::string a = scalar(e, n, "an arch like sm_90");
    if (!is_arch(a)) fail(n, fmt::format("{}: '{}' is not an arch of the form sm_NN or sm_NNa", e.path, a));
    if (contains(sp_.archs_, a)) fail(n, fmt::format("{}: '{}' is listed twice", e.path, a));
    sp_.archs_.push_back(a);
  }
}

void SpaceLoader::read_device_limits(const Entry& e) {
  std::vector<Entry> per_arch = entries(e, {});
  for (const Entry& a : per_arch)
    if (!contains(sp_.archs_, a.name))
      fail(a.key, fmt::format("{}: '{}' is not in archs ({})", e.path, a.name, join(sp_.archs_)));
  sp_.limit_values_.assign(sp_.archs_.size(), {});
  const Entry* first = nullptr;
  for (std::size_t i = 0; i < sp_.archs_.size(); ++i) {
    const std::string& arch = sp_.archs_[i];
    auto it = std::find_if(per_arch.begin(), per_arch.end(), [&](const Entry& x) { return x.name == arch; });
    if (it == per_arch.end())
      fail(e.key, fmt::format("{}: no entry for {} (every arch in archs needs its limits)", e.path, arch));
  }
  for (const Entry& a : per_arch) {
    std::vector<Entry> limits = entries(a, {});
    const std::size_t arch = static_cast<std::size_t>(std::find(sp_.archs_.begin(), sp_.archs_.end(), a.name) - sp_.archs_.begin());
    if (!first) {
      first = &a;
      for (const Entry& l : limits) {
        check_name(l, "device limit");
        sp_.limit_names_.push_back(l.name);
      }
    }
    std::vector<std::int64_t> values(sp_.limit_names_.size());
    std::vector<bool> seen(values.size(), false);
    for (const Entry& l : limits) {
      auto at = std::find(sp_.limit_names_.begin(), sp_.limit_names_.end(), l.name);
      if (at == sp_.limit_names_.end())
        fail(l.key, fmt::format("{}: '{}' is not a limit of {}; all archs must have the same keys ({})", a.path,
                                l.name, first->name, join(sp_.limit_names_)));
      const auto k = static_cast<std::size_t>(at - sp_.limit_names_.begin());
      values[k] = integer(l, l.value);
      seen[k] = true;
    }
    for (std::size_t k = 0; k < seen.size(); ++k)
      if (!seen[k])
        fail(a, fmt::format("missing '{}'; all archs must have the same keys as {} ({})", sp_.limit_names_[k],
                            first->name, join(sp_.limit_names_)));
    sp_.limit_values_[arch] = std::move(values);
  }
}

void SpaceLoader::read_problem(const Entry& e) {
  for (const Entry& f : entries(e, kProblemKeys)) {
    if (f.name == "constraints") continue;  // read once params and limits are known (for messages)
    SearchSpace::ProblemRule rule{static_cast<int>(std::find(kProblemKeys.begin(), kProblemKeys.end(), f.name) - kProblemKeys.begin()), {}};
    std::vector<std::string> text;
    for (const auto& n : list(f)) {
      std::int64_t v;
      std::string t;
      if (f.name == "dtype") {
        t = scalar(f, n, "fp16, bf16 or fp8");
        if (t != "fp16" && t != "bf16" && t != "fp8")
          fail(n, fmt::format("{}: '{}' is not a dtype (fp16, bf16, fp8)", f.path, t));
        v = *sp_.scope_.symbol_id(t);
      } else if (f.name == "pass") {
        // The passes the space tunes, by name (slot `bwd`: 1 for the backward pass).
        t = scalar(f, n, "fwd or bwd");
        if (!is_plain(n) || (t != "fwd" && t != "bwd"))
          fail(n, fmt::format("{}: expected fwd (the forward pass) or bwd (the backward pass), got '{}'", f.path, t));
        v = t == "bwd";
      } else if (f.name == "causal" || f.name == "latent" || f.name == "kv_fp8" || contains(kVariantKeys, f.name)) {
        const std::string s = scalar(f, n, "true, false, 1 or 0");
        if (!is_plain(n) || (s != "true" && s != "false" && s != "1" && s != "0"))
          fail(n, fmt::format("{}: expected true, false, 1 or 0, got '{}'", f.path, s));
        v = s == "true" || s == "1";
        t = v ? "1" : "0";
      } else {
        v = integer(f, n);
        t = std::to_string(v);
      }
      if (std::find(rule.values.begin(), rule.values.end(), v) != rule.values.end())
        fail(n, fmt::format("{}: {} is listed twice", f.path, t));
      rule.values.push_back(v);
      text.push_back(t);
    }
    sp_.problem_rules_.push_back(std::move(rule));
    sp_.problem_support_text_.emplace_back(f.name, std::move(text));
  }
  add_variant_defaults();
}

void SpaceLoader::add_variant_defaults() {
  for (const std::string& key : kVariantKeys) {
    const int field = static_cast<int>(std::find(kProblemKeys.begin(), kProblemKeys.end(), key) - kProblemKeys.begin());
    const bool listed = std::any_of(sp_.problem_rules_.begin(), sp_.problem_rules_.end(),
                                    [&](const SearchSpace::ProblemRule& r) { return r.field == field; });
    if (listed) continue;
    sp_.problem_rules_.push_back(SearchSpace::ProblemRule{field, {0}});
    sp_.problem_support_text_.emplace_back(key, std::vector<std::string>{"0"});
  }
}

void SpaceLoader::read_param(const Entry& e) {
  check_name(e, "parameter");
  Param p{e.name, ParamKind::kInt, {}, "", std::nullopt};
  std::vector<std::int64_t> encoded;
  auto add_int = [&](std::int64_t v, const YAML::Node& at) {
    if (std::find(encoded.begin(), encoded.end(), v) != encoded.end()) fail(at, fmt::format("{}: {} is listed twice", e.path, v));
    if (encoded.size() >= kMaxDomain) fail(at, fmt::format("{}: more than {} values", e.path, kMaxDomain));
    encoded.push_back(v);
    p.values.emplace_back(v);
  };
  // A plain list: integers, or booleans when the first element is true/false.
  auto read_list = [&](const Entry& l) {
    const auto items = list(l);
    const bool bools = is_plain(items[0]) && items[0].IsScalar() && (items[0].Scalar() == "true" || items[0].Scalar() == "false");
    p.kind = bools ? ParamKind::kBool : ParamKind::kInt;
    for (const auto& n : items) {
      if (!bools) {
        add_int(integer(l, n), n);
        continue;
      }
      const bool b = boolean(l, n);
      if (std::find(encoded.begin(), encoded.end(), b) != encoded.end()) fail(n, fmt::format("{}: {} is listed twice", l.path, n.Scalar()));
      encoded.push_back(b);
      p.values.emplace_back(b);
    }
  };
  auto bounds = [&](const Entry& b) {
    const auto items = list(b);
    if (items.size() != 2) fail(b, fmt::format("expected [min, max], got {} values", items.size()));
    return std::pair{integer(b, items[0]), integer(b, items[1])};
  };

  if (e.value.IsScalar() && is_plain(e.value) && e.value.Scalar() == "bool") {
    p.kind = ParamKind::kBool;
    p.values = {false, true};
    encoded = {0, 1};
  } else if (e.value.IsSequence()) {
    read_list(e);
  } else if (e.value.IsMap()) {
    static const std::vector<std::string> kForms = {"values", "range", "pow2", "enum"};
    std::vector<Entry> keys = entries(e, {"values", "range", "step", "pow2", "enum", "doc", "default"});
    const Entry* form = nullptr;
    const Entry* step = nullptr;
    const Entry* fallback = nullptr;
    for (const Entry& k : keys) {
      if (k.name == "doc") p.doc = scalar(k, k.value, "a string");
      else if (k.name == "step") step = &k;
      else if (k.name == "default") fallback = &k;
      else if (form) fail(k.key, fmt::format("{}: both '{}' and '{}'; give one of {}", e.path, form->name, k.name, join(kForms)));
      else form = &k;
    }
    if (!form) fail(e, fmt::format("expected one of: {}", join(kForms)));
    if (step && form->name != "range") fail(step->key, fmt::format("{}: 'step' applies only to 'range'", e.path));
    if (form->name == "values") {
      read_list(*form);
    } else if (form->name == "range") {
      const auto [lo, hi] = bounds(*form);
      const std::int64_t st = step ? integer(*step, step->value) : 1;
      if (st <= 0) fail(step->value, fmt::format("{}: step must be positive, got {}", step->path, st));
      if (lo > hi) fail(form->value, fmt::format("{}: min {} is greater than max {}", form->path, lo, hi));
      auto span = [](std::int64_t a, std::int64_t b) { return static_cast<std::uint64_t>(b) - static_cast<std::uint64_t>(a); };
      if (span(lo, hi) / static_cast<std::uint64_t>(st) >= kMaxDomain)
        fail(form->value, fmt::format("{}: more than {} values", form->path, kMaxDomain));
      for (std::int64_t v = lo;; v += st) {
        add_int(v, form->value);
        if (span(v, hi) < static_cast<std::uint64_t>(st)) break;
      }
    } else if (form->name == "pow2") {
      const auto [lo, hi] = bounds(*form);
      if (lo < 1) fail(form->value, fmt::format("{}: min must be at least 1, got {}", form->path, lo));
      if (lo > hi) fail(form->value, fmt::format("{}: min {} is greater than max {}", form->path, lo, hi));
      for (std::int64_t v = 1; v <= hi; v *= 2) {
        if (v >= lo) add_int(v, form->value);
        if (v > INT64_MAX / 2) break;
      }
      if (encoded.empty()) fail(form->value, fmt::format("{}: no power of two in [{}, {}]", form->path, lo, hi));
    } else {
      p.kind = ParamKind::kEnum;
      std::vector<std::string> names;
      for (const auto& n : list(*form)) {
        const std::string v = scalar(*form, n, "a value name");
        if (!is_lower_name(v, true))
          fail(n, fmt::format("{}: '{}' is not a valid value name (lowercase letters, digits and '_')", form->path, v));
        if (contains(names, v)) fail(n, fmt::format("{}: '{}' is listed twice", form->path, v));
        claim(e.name + "_" + v, fmt::format("the constant for value {} of {}", v, e.name), n, form->path);
        names.push_back(v);
        p.values.emplace_back(v);
      }
      for (const auto& v : names) encoded.push_back(sp_.scope_.intern(v));
      sp_.scope_.add(e.name, ExprType::kString, names);
    }
    if (fallback) {
      // One of the domain's values, written as the domain's are.
      const std::string text = scalar(*fallback, fallback->value, "a value of the domain");
      for (const Value& v : p.values)
        if (value_str(v) == text || (p.kind == ParamKind::kBool && (text == "1" ? std::get<bool>(v) : text == "0" && !std::get<bool>(v))))
          p.default_value = v;
      if (!p.default_value)
        fail(fallback->value, fmt::format("{}: default {} is not in the domain ({})", fallback->path, text, domain_text(p)));
    }
  } else {
    fail(e, "expected a list [a, b], bool, or a mapping with one of values, range, pow2, enum");
  }
  if (p.kind != ParamKind::kEnum)
    sp_.scope_.add(e.name, p.kind == ParamKind::kBool ? ExprType::kBool : ExprType::kInt);
  sp_.params_.push_back(std::move(p));
  sp_.encoded_.push_back(std::move(encoded));
}

void SpaceLoader::read_derived(const Entry& e) {
  std::string doc;
  const YAML::Node expr = expr_node(e, "doc", doc);
  const int index = static_cast<int>(sp_.derived_.size());
  Expr x = compile(e, expr, sp_.derived_base_ + index,
                   "a derived quantity may use params, problem fields, device limits and earlier derived names");
  if (x.type() == ExprType::kString)
    fail(expr_pos(expr, 1), fmt::format("{}: a derived quantity must be int or bool, got string", e.path));
  sp_.scope_.set_type(sp_.derived_base_ + index, x.type());
  sp_.derived_defs_.push_back({e.name, x.text(), x.type(), doc});
  sp_.derived_.push_back({std::move(x), 0});
}

void SpaceLoader::read_constraint(const Entry& e, const YAML::Node& item) {
  const Entry c{"constraint", item, item, e.path == "constraints" ? "constraint" : "problem constraint"};
  std::string why;
  const YAML::Node expr = expr_node(c, "why", why);
  const bool problem = e.path != "constraints";
  Expr x = compile(c, expr, problem ? kProblemFields : -1,
                   "problem constraints may use only problem fields (b, h, hkv, s, sk, d, dtype, causal, page, varlen, "
                   "window, window_left, window_right, softcap, sinks, dv, latent, kv_fp8, bwd)");
  if (x.type() != ExprType::kBool)
    fail(expr_pos(expr, 1), fmt::format("{}: must be a bool expression, got {}", c.path, expr_type_name(x.type())));
  if (problem) {
    sp_.problem_constraint_defs_.push_back({x.text(), why});
    sp_.problem_constraints_.push_back(std::move(x));
  } else {
    sp_.constraint_defs_.push_back({x.text(), why});
    sp_.constraints_.push_back({std::move(x), 0});
  }
}

SearchSpace SpaceLoader::run() {
  YAML::Node root;  // default-constructed: the assignment below binds rather than writes through
  try {
    root = load_one_yaml_document(text_, file_);  // one document, bounded (aliases, depth)
  } catch (const YAML::ParserException& e) {
    std::string msg = e.msg;
    if (msg == "illegal map value") msg += " (quote an expression that contains ': ', such as a ternary)";
    fail(pos(e.mark), "YAML: " + msg);
  }
  // The text is stored with every campaign (campaigns.space_text) and its names reach JSON output.
  if (const std::string why = text_problem(text_, true); !why.empty()) {
    const std::size_t off = std::stoull(why.substr(why.find("offset ") + 7));
    const auto line = std::upper_bound(line_starts_.begin(), line_starts_.end(), off) - line_starts_.begin();
    fail(SourcePos{file_, static_cast<int>(line), static_cast<int>(off - line_starts_[static_cast<std::size_t>(line - 1)]) + 1},
         "not UTF-8 text: " + why);
  }
  if (root.IsNull() || !root.IsDefined())
    fail(SourcePos{file_, 1, 1}, "empty file; expected a mapping with family, archs, device_limits and params");
  if (!root.IsMap()) fail(root, "expected a mapping with family, archs, device_limits and params at the top level");
  check_duplicate_keys(root);

  std::map<std::string, Entry> top;
  for (Entry& e : entries(Entry{"", root, root, ""}, kTopKeys)) top.emplace(e.name, e);
  for (const char* k : {"family", "archs", "device_limits", "params"})
    if (!top.count(k)) fail(root, fmt::format("missing required key '{}'", k));

  const Entry& fam = top.at("family");
  sp_.family_ = scalar(fam, fam.value, "a family name");
  if (!is_lower_name(sp_.family_))
    fail(fam.value, fmt::format("family: '{}' is not a valid name (a folder under templates/: lowercase letters, digits, '_')",
                                sp_.family_));
  if (top.count("description")) sp_.description_ = scalar(top.at("description"), top.at("description").value, "a string");

  // Slots: problem fields, then device limits, params, derived (search_space.hpp).
  for (const auto& k : kProblemInts) sp_.scope_.add(k, ExprType::kInt);
  // fp8: an FP8 forward (`dtype=fp8`: e4m3 Q, K, V; O bf16), offered where a space's dtype list has it.
  sp_.scope_.add("dtype", ExprType::kString, {"fp16", "bf16", "fp8"});
  sp_.scope_.add("causal", ExprType::kBool);
  sp_.scope_.add("page", ExprType::kInt);
  sp_.scope_.add("varlen", ExprType::kInt);
  sp_.scope_.add("window", ExprType::kBool);
  sp_.scope_.add("window_left", ExprType::kInt);
  sp_.scope_.add("window_right", ExprType::kInt);
  sp_.scope_.add("softcap", ExprType::kBool);
  sp_.scope_.add("sinks", ExprType::kBool);
  sp_.scope_.add("dv", ExprType::kInt);
  sp_.scope_.add("latent", ExprType::kBool);
  sp_.scope_.add("kv_fp8", ExprType::kBool);
  sp_.scope_.add("bwd", ExprType::kBool);  // the problem section's `pass` (kProblemKeys)

  read_archs(top.at("archs"));
  read_device_limits(top.at("device_limits"));
  sp_.limit_base_ = kProblemFields;
  for (const auto& n : sp_.limit_names_) sp_.scope_.add(n, ExprType::kInt);
  if (top.count("problem")) read_problem(top.at("problem"));
  else add_variant_defaults();

  sp_.param_base_ = sp_.scope_.size();
  const Entry& params = top.at("params");
  if (params.value.IsMap() && params.value.size() == 0) fail(params, "no parameters");
  const std::vector<Entry> param_entries = entries(params, {});
  // Enumeration recurses once per parameter; the shipped spaces have a dozen.
  if (param_entries.size() > kMaxParams)
    fail(params, fmt::format("{} parameters; a space may have at most {}", param_entries.size(), kMaxParams));
  for (const Entry& p : param_entries) read_param(p);

  sp_.derived_base_ = sp_.scope_.size();
  if (top.count("derived")) {
    const Entry& d = top.at("derived");
    if (!d.value.IsNull()) {
      std::vector<Entry> ds = entries(d, {});
      for (const Entry& x : ds) {
        check_name(x, "derived quantity");
        sp_.scope_.add(x.name, ExprType::kInt);  // type fixed below, once compiled
      }
      // All names are reserved first, so that using a later one is refused with a reason rather
      // than reported unknown.
      for (const Entry& x : ds) read_derived(x);
    }
  }
  if (top.count("problem")) {
    for (const Entry& f : entries(top.at("problem"), kProblemKeys))
      if (f.name == "constraints" && !f.value.IsNull()) {
        if (!f.value.IsSequence()) fail(f, "expected a list of expressions");
        for (const auto& item : f.value) read_constraint(f, item);
      }
  }
  if (top.count("constraints")) {
    const Entry& c = top.at("constraints");
    if (!c.value.IsNull()) {
      if (!c.value.IsSequence()) fail(c, "expected a list of expressions");
      for (const auto& item : c.value) read_constraint(c, item);
    }
  }

  std::uint64_t raw = 1;
  for (const auto& enc : sp_.encoded_)
    if (__builtin_mul_overflow(raw, static_cast<std::uint64_t>(enc.size()), &raw))
      fail(params, "the space has more than 2^64 points");
  sp_.plan();
  return std::move(sp_);
}

SearchSpace SearchSpace::parse(const std::string& yaml_text, const std::string& display_name) {
  SearchSpace sp;
  try {
    sp = SpaceLoader(yaml_text, display_name).run();
  } catch (const YAML::Exception& e) {  // a yaml-cpp check the loader did not anticipate
    const SourcePos at{display_name, e.mark.line + 1, e.mark.column + 1};
    throw InputError(fmt::format("{}: YAML: {}", e.mark.line >= 0 ? at.str() : display_name, e.msg));
  }
  sp.path_ = display_name;
  sp.hash_ = content_hash(yaml_text);
  sp.text_ = yaml_text;
  return sp;
}

SearchSpace SearchSpace::load(const std::string& path) {
  // The path is stored with every campaign tuned from it (campaigns.space_path) and printed in JSON.
  check_stored_text(path, "search-space path");
  return parse(read_input_file(path, "a search-space YAML file"), path);
}

}  // namespace attntune
