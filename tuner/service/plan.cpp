#include "service/plan.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "core/error.hpp"
#include "core/output_file.hpp"
#include "core/input_file.hpp"
#include "core/text.hpp"
#include "core/yaml_input.hpp"
#include "families/family.hpp"
#include "space/search_space.hpp"

namespace attntune {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr std::int64_t kMaxHeads = 1 << 16;  // Problem::parse's limit on h and hkv
constexpr std::int64_t kMaxLatentDim = 1024;   // Problem::parse's limit on d


// "64, 128 and 256"
std::string and_list(const std::vector<int>& v) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i)
    out += (i == 0 ? "" : i + 1 == v.size() ? " and " : ", ") + std::to_string(v[i]);
  return out;
}

// nlohmann's parse error as "FILE:LINE:COLUMN: invalid JSON: what went wrong".
[[noreturn]] void throw_json_error(const std::string& path, const std::string& text, const json::parse_error& e) {
  // e.byte counts the characters read, the offending one included.
  const std::size_t at = std::min<std::size_t>(e.byte > 0 ? e.byte - 1 : 0, text.size());
  int line = 1;
  std::size_t line_start = 0;
  for (std::size_t i = 0; i < at; ++i)
    if (text[i] == '\n') ++line, line_start = i + 1;
  const int column = static_cast<int>(at - line_start) + 1;
  std::string msg = e.what();
  const std::size_t p = msg.find("parse error");
  if (p != std::string::npos) {
    const std::size_t colon = msg.find(": ", p);
    msg = colon == std::string::npos ? msg.substr(p) : msg.substr(colon + 2);
  }
  throw InputError(fmt::format("{}: invalid JSON: {}", SourcePos{path, line, column}.str(), msg));
}

json parse_json(const std::string& path, const std::string& text) {
  check_json_nesting(text, path);  // to_node and the readers recurse over what is parsed
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw_json_error(path, text, e);
  }
}

std::string describe(const json& v) {
  if (v.is_string()) return fmt::format("the string {}", v.dump(-1, ' ', false, json::error_handler_t::replace));
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_array()) return "a list";
  if (v.is_object()) return "an object";
  std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 40) + "..." : s;
}

// The keys of a config.json that describe attention: the top level's, or a multimodal config's
// "text_config" when the top level has no num_attention_heads.
class ConfigReader {
 public:
  ConfigReader(std::string path, const json& top) : path_(std::move(path)), top_(top), scope_(&top) {
    const auto tc = top.find("text_config");
    if (!has(top, "num_attention_heads") && tc != top.end() && tc->is_object() && has(*tc, "num_attention_heads")) {
      scope_ = &*tc;
      prefix_ = "text_config.";
    }
  }

  // The key's value in the attention scope, or nullptr when absent or null.
  const json* get(const std::string& key) const { return has(*scope_, key) ? &scope_->at(key) : nullptr; }
  // Looks at the top level first (torch_dtype sits there in multimodal configs), then the scope.
  std::pair<const json*, std::string> get_anywhere(const std::string& key) const {
    if (has(top_, key)) return {&top_.at(key), key};
    if (const json* v = get(key)) return {v, name(key)};
    return {nullptr, key};
  }
  std::string name(const std::string& key) const { return prefix_ + key; }
  // The key's value in the attention scope, else at the top level (keys that say what the model
  // is, as model_type and alibi, may sit at either), with its name; {nullptr, ""} when absent.
  std::pair<const json*, std::string> get_scope_first(const std::string& key) const {
    if (const json* v = get(key)) return {v, name(key)};
    if (scope_ != &top_ && has(top_, key)) return {&top_.at(key), key};
    return {nullptr, ""};
  }
  // Whether the attention scope has the key, null included (transformers takes a null as given,
  // an absent key as its class default).
  bool present(const std::string& key) const { return scope_->contains(key); }
  // A true/false key of the scope; false when absent or null.
  bool flag(const std::string& key) const {
    const json* v = get(key);
    if (!v) return false;
    if (!v->is_boolean()) fail(fmt::format("{}: expected true or false, got {}", name(key), describe(*v)));
    return v->get<bool>();
  }

  [[noreturn]] void fail(const std::string& msg) const { throw InputError(fmt::format("{}: {}", path_, msg)); }

  std::int64_t positive(const std::string& key, std::int64_t hi) const {
    const json* v = get(key);
    if (!v) fail(fmt::format("no {} (is this a Hugging Face config.json of a transformer?)", name(key)));
    return positive(key, *v, hi);
  }
  std::int64_t positive(const std::string& key, const json& v, std::int64_t hi) const {
    if (!v.is_number_integer())
      fail(fmt::format("{}: expected a positive whole number, got {}", name(key), describe(v)));
    if (v.is_number_unsigned() ? v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi) : v.get<std::int64_t>() > hi)
      fail(fmt::format("{}: {} is more than {}", name(key), v.dump(), hi));
    const std::int64_t n = v.get<std::int64_t>();
    if (n < 1) fail(fmt::format("{}: expected a positive whole number, got {}", name(key), n));
    return n;
  }
  // A whole number in [0, hi] (max_window_layers may be 0: every layer windowed).
  std::int64_t count(const std::string& key, const json& v, std::int64_t hi) const {
    if (v.is_number_integer() && v.get<std::int64_t>() == 0) return 0;
    if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<std::int64_t>() < 0))
      fail(fmt::format("{}: expected a whole number (0 or more), got {}", name(key), describe(v)));
    return positive(key, v, hi);
  }
  // A positive finite number (a soft-cap, a scale); `what` says what null means where it may be.
  double positive_number(const std::string& key, const json& v, double hi, const std::string& what) const {
    const double x = v.is_number() ? v.get<double>() : 0;
    if (!v.is_number() || !std::isfinite(x) || !(x > 0))
      fail(fmt::format("{}: expected a positive number{}, got {}", name(key), what, describe(v)));
    if (x > hi) fail(fmt::format("{}: {} is more than {}", name(key), v.dump(), hi));
    return x;
  }

 private:
  static bool has(const json& obj, const std::string& key) {
    const auto it = obj.find(key);
    return it != obj.end() && !it->is_null();
  }
  std::string path_;
  const json& top_;
  const json* scope_;
  std::string prefix_;
};

// ---- attention that is not plain ---------------------------------------------------------------

constexpr std::int64_t kMaxLayers = 1 << 16;
constexpr std::int64_t kMaxWindow = std::int64_t{1} << 24;  // Problem::parse's longest window side
constexpr double kMaxSoftcap = 1e6;                          // Problem::parse's largest soft-cap

// The architecture's name: the attention scope's model_type (a multimodal config's text_config:
// "gemma3_text"), else the top level's; "" when neither says.
std::string model_type(const ConfigReader& cfg) {
  const auto [v, key] = cfg.get_scope_first("model_type");
  return v && v->is_string() ? v->get<std::string>() : "";
}

// "1 layer", "21 layers".
std::string count_of(std::int64_t n, const std::string& word) {
  return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s");
}

// A JSON string as the config wrote it, quoted and escaped (for messages).
std::string quoted(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

// Attention that attntune's kernels do not compute, named by the key that says so. A plan of
// plain problems for such a model would be wrong in every layer, so it is refused (exit 2).
void refuse_unserved_attention(const ConfigReader& cfg) {
  // (Multi-head latent attention, kv_lora_rank, is read by read_latent.)
  // ALiBi adds a per-head bias linear in the query-key distance to every score.
  const std::string alibi =
      "the model adds ALiBi position biases to its attention scores (a per-head penalty linear in the distance "
      "from query to key), which attntune's kernels do not compute";
  const std::string type = model_type(cfg);
  if (type == "bloom") cfg.fail(fmt::format("model_type bloom: {}", alibi));  // BLOOM has no key for it: always
  if (const auto [v, key] = cfg.get_scope_first("alibi"); v) {  // Falcon (falcon-rw-1b, falcon-rw-7b)
    if (!v->is_boolean()) cfg.fail(fmt::format("{}: expected true or false, got {}", key, describe(*v)));
    if (v->get<bool>()) cfg.fail(fmt::format("{}: true: {}", key, alibi));
  }
  if (const auto [v, key] = cfg.get_scope_first("position_embedding_type"); v && v->is_string() &&
                                                                             v->get<std::string>() == "alibi")
    cfg.fail(fmt::format("{}: \"alibi\": {}", key, alibi));
  if (const auto [ac, key] = cfg.get_scope_first("attn_config"); ac && ac->is_object()) {  // MPT
    if (const auto a = ac->find("alibi"); a != ac->end() && a->is_boolean() && a->get<bool>())
      cfg.fail(fmt::format("{}.alibi: true: {}", key, alibi));
  }
  if (const json* v = cfg.get("attention_chunk_size"))  // Llama 4
    cfg.fail(fmt::format("{} {}: chunked attention (Llama 4: a query sees only the keys of its own chunk of "
                         "tokens) is not what attntune's kernels compute",
                         cfg.name("attention_chunk_size"), quoted(*v)));
  if (cfg.flag("use_bidirectional_attention"))  // EmbeddingGemma
    cfg.fail(fmt::format("{}: true: the model's attention is bidirectional (an encoder), and plan plans the "
                         "causal attention of a decoder",
                         cfg.name("use_bidirectional_attention")));
}

// Why a layer kind of layer_types is not served.
std::string unserved_layer_kind(const std::string& kind) {
  if (kind == "chunked_attention")
    return "chunked attention (Llama 4: a query sees only the keys of its own chunk of attention_chunk_size "
           "tokens) is not what attntune's kernels compute; they serve full_attention and sliding_attention layers";
  return "attntune's kernels serve full_attention and sliding_attention layers only";
}

// What each layer runs (docs/design/plan.md "Layers that are not plain attention"), by the rules
// of transformers' configuration classes, in their order: layer_types when given; else, with
// use_sliding_window true (Qwen2, Qwen3), the first max_window_layers layers full and the rest
// windowed; else one full layer in every sliding_window_pattern (by default 6 for Gemma 3, 4 for
// Cohere2; Gemma 2 and gpt-oss alternate, sliding first); else, with a sliding_window, every layer windowed
// (Mistral, Phi-3, Starcoder2). A window of W (sliding_window) is W keys, the query's own
// included: window=W-1. attn_logit_softcapping caps every layer; gpt_oss has sinks in every layer.
void read_layers(const ConfigReader& cfg, ModelAttention& m) {
  const std::string type = model_type(cfg);
  static const std::set<std::string> kAlternating = {"gemma2", "gpt_oss"};  // no layer_types: sliding, full, ...
  // Their configuration classes' default sliding_window_pattern, when the key is absent.
  static const std::map<std::string, int> kDefaultPattern = {{"gemma3", 6}, {"gemma3_text", 6}, {"cohere2", 4}};
  // Their configuration classes give sliding_window a default, used when the key is absent (a null
  // is no window): attntune does not guess a class default.
  static const std::set<std::string> kDefaultWindow = {"mistral", "gemma2", "gemma3", "gemma3_text", "gpt_oss",
                                                       "cohere2"};
  int n = 0;
  if (const json* v = cfg.get("num_hidden_layers"))
    n = static_cast<int>(cfg.positive("num_hidden_layers", *v, kMaxLayers));

  // (Unless layer_types lists no sliding layer: then no layer has a window to guess.)
  const json* listed = cfg.get("layer_types");
  const bool lists_sliding =
      listed && listed->is_array() && std::count(listed->begin(), listed->end(), json("sliding_attention")) > 0;
  if (!cfg.present("sliding_window") && kDefaultWindow.count(type) && (!listed || lists_sliding))
    cfg.fail(fmt::format("no {}: transformers' {} configuration then uses its default window, which attntune "
                         "does not guess: give {} (null for none)",
                         cfg.name("sliding_window"), type, cfg.name("sliding_window")));
  std::int64_t w = 0;  // keys a query of a sliding_attention layer sees, its own included; 0: none
  if (const json* v = cfg.get("sliding_window")) w = cfg.positive("sliding_window", *v, kMaxWindow);
  // Qwen2/Qwen3: the window applies only when use_sliding_window is true (the class sets
  // sliding_window to None otherwise).
  const bool use_given = cfg.get("use_sliding_window") != nullptr;
  const bool use = cfg.flag("use_sliding_window");
  const bool switched_off = use_given && !use;

  auto need_layers = [&](const std::string& rule) {
    if (n == 0)
      cfg.fail(fmt::format("no {}: {} needs the number of layers", cfg.name("num_hidden_layers"), rule));
  };
  std::vector<bool> sliding;  // by layer, when the layers differ or are listed
  bool every_layer = false;   // every layer windowed (uncounted when n is 0)
  if (const json* lt = cfg.get("layer_types")) {
    const std::string key = cfg.name("layer_types");
    if (!lt->is_array() || lt->empty())
      cfg.fail(fmt::format("{}: expected a list of \"full_attention\" and \"sliding_attention\", got {}", key,
                           describe(*lt)));
    if (lt->size() > static_cast<std::size_t>(kMaxLayers))
      cfg.fail(fmt::format("{}: {} layers are more than {}", key, lt->size(), kMaxLayers));
    if (n > 0 && lt->size() != static_cast<std::size_t>(n))
      cfg.fail(fmt::format("{} lists {} and {} is {}", key, count_of(static_cast<std::int64_t>(lt->size()), "layer"),
                           cfg.name("num_hidden_layers"), n));
    n = static_cast<int>(lt->size());
    for (std::size_t i = 0; i < lt->size(); ++i) {
      const json& k = (*lt)[i];
      if (!k.is_string())
        cfg.fail(fmt::format("{}[{}]: expected a string like \"full_attention\", got {}", key, i, describe(k)));
      if (k == "sliding_attention" || k == "full_attention") {
        sliding.push_back(k == "sliding_attention");
        continue;
      }
      const auto same = std::count(lt->begin(), lt->end(), k);
      cfg.fail(fmt::format("{}[{}] is {} ({} of {} layers): {}", key, i, quoted(k), same, n,
                           unserved_layer_kind(k.get<std::string>())));
    }
  } else if (use && w > 0) {
    need_layers(cfg.name("use_sliding_window") + " with max_window_layers");
    std::int64_t full = 28;
    if (const json* v = cfg.get("max_window_layers"))
      full = cfg.count("max_window_layers", *v, kMaxLayers);
    else
      m.notes.push_back(fmt::format(
          "{} is true and there is no {}: planning transformers' Qwen2 default, the first 28 layers full attention",
          cfg.name("use_sliding_window"), cfg.name("max_window_layers")));
    for (int i = 0; i < n; ++i) sliding.push_back(i >= full);
  } else if (w > 0 && !switched_off &&
             (cfg.get("sliding_window_pattern") || kAlternating.count(type) || kDefaultPattern.count(type))) {
    std::int64_t pattern = 2;
    std::string rule = fmt::format("{}'s alternation of sliding and full layers", type);
    if (const json* v = cfg.get("sliding_window_pattern")) {
      pattern = cfg.positive("sliding_window_pattern", *v, kMaxLayers);
      rule = cfg.name("sliding_window_pattern");
    } else if (const auto d = kDefaultPattern.find(type); d != kDefaultPattern.end()) {
      pattern = d->second;
      rule = fmt::format("{}'s default sliding_window_pattern", type);
      m.notes.push_back(fmt::format("no {}: planning transformers' {} default, one full_attention layer in {}",
                                    cfg.name("sliding_window_pattern"), type, pattern));
    }
    need_layers(rule);
    for (int i = 0; i < n; ++i) sliding.push_back((i + 1) % pattern != 0);
  } else if (w > 0 && !switched_off) {
    every_layer = true;
  }

  const int n_sliding = static_cast<int>(std::count(sliding.begin(), sliding.end(), true));
  if (n_sliding > 0 && (w == 0 || switched_off)) {
    if (!switched_off)
      cfg.fail(fmt::format("{} lists {} and there is no {} (the window's length)", cfg.name("layer_types"),
                           count_of(n_sliding, "sliding_attention layer"), cfg.name("sliding_window")));
    m.notes.push_back(fmt::format(
        "{} is false: the {} that {} calls sliding_attention run full attention (as transformers' Qwen2 runs them)",
        cfg.name("use_sliding_window"), count_of(n_sliding, "layer"), cfg.name("layer_types")));
    std::fill(sliding.begin(), sliding.end(), false);
  }

  double cap = 0;
  if (const json* c = cfg.get("attn_logit_softcapping"))
    cap = cfg.positive_number("attn_logit_softcapping", *c, kMaxSoftcap, " (null: no cap)");
  const bool sinks = type == "gpt_oss";  // per-head sink logits in every layer's weights (self_attn.sinks)

  m.layers = n;
  LayerKind full{"full_attention", -1, cap, sinks, 0};
  LayerKind slide{"sliding_attention", w - 1, cap, sinks, 0};
  if (every_layer) {
    slide.layers = n;  // 0: every layer, uncounted
    m.layer_kinds = {slide};
  } else if (sliding.empty() || std::count(sliding.begin(), sliding.end(), true) == 0) {
    full.layers = n;
    m.layer_kinds = {full};
  } else {
    slide.layers = static_cast<int>(std::count(sliding.begin(), sliding.end(), true));
    full.layers = n - slide.layers;
    if (full.layers > 0) m.layer_kinds.push_back(full);
    m.layer_kinds.push_back(slide);
  }

  // What a caller passes for each variant: the problem specs name them, the calls must too.
  if (m.layer_kinds.back().window >= 0)
    m.notes.push_back(fmt::format(
        "{} {}: a query of a sliding_attention layer sees {} keys, its own included (transformers, vLLM), so their "
        "problems have window={}: call the library with window_left {} and is_causal 1",
        cfg.name("sliding_window"), w, w, w - 1, w - 1));
  if (cap > 0)
    m.notes.push_back(fmt::format(
        "{} {}: every layer caps its attention scores, softcap * tanh(scale * q.k / softcap), so the problems have "
        "softcap={}: pass attntune_options.softcap {}",
        cfg.name("attn_logit_softcapping"), cfg.get("attn_logit_softcapping")->dump(), fmt::format("{}", cap),
        fmt::format("{}", cap)));
  if (sinks)
    m.notes.push_back(
        fmt::format("model_type {}: every layer has learnable per-head attention sinks (self_attn.sinks in the "
                    "checkpoint), so the problems have sinks=1: pass each layer's sink logits as [heads_q] fp32 "
                    "(attntune_options.sinks)",
                    type));
}

// The softmax scale when the config sets one that is not head_dim^-0.5 as written: Gemma's
// query_pre_attn_scalar (scale = query_pre_attn_scalar^-0.5), Granite's attention_multiplier (the
// scale itself). A problem spec has no scale (every kernel takes it at run time, so a kernel tuned
// with the usual one serves any): a note says what the caller must pass.
void read_scale(const ConfigReader& cfg, ModelAttention& m) {
  std::string from;
  if (const json* q = cfg.get("query_pre_attn_scalar")) {
    const double x = cfg.positive_number("query_pre_attn_scalar", *q, 1e12, "");
    m.softmax_scale = 1.0 / std::sqrt(x);
    from = fmt::format("{}^-0.5 = {}^-0.5", cfg.name("query_pre_attn_scalar"), q->dump());
  } else if (const json* a = cfg.get("attention_multiplier")) {
    m.softmax_scale = cfg.positive_number("attention_multiplier", *a, 1e12, "");
    from = cfg.name("attention_multiplier");
  } else {
    return;
  }
  const double usual = 1.0 / std::sqrt(static_cast<double>(m.head_dim));
  if (std::abs(m.softmax_scale - usual) <= 1e-6 * usual)
    m.notes.push_back(fmt::format("the softmax scale is {} = {:.7g}, which is head_dim^-0.5 too: the usual "
                                  "softmax_scale (1/sqrt(head_dim)) is right",
                                  from, m.softmax_scale));
  else
    m.notes.push_back(fmt::format(
        "the softmax scale is {} = {:.7g}, not head_dim^-0.5 = {:.7g}: problem specs have no scale (the kernels take "
        "it at run time), so pass softmax_scale {:.7g} on every call (scale= in PyTorch)",
        from, m.softmax_scale, usual, m.softmax_scale));
}

// An HF id ("meta-llama/Meta-Llama-3-8B") as it is; a local path (which save_pretrained records
// in _name_or_path) by its last component, so that no machine's directories reach a plan file.
std::string model_name_from(const std::string& name_or_path) {
  const bool local = name_or_path.starts_with('/') || name_or_path.starts_with('.') || name_or_path.starts_with('~') ||
                     name_or_path.find('\\') != std::string::npos ||
                     std::count(name_or_path.begin(), name_or_path.end(), '/') > 1;
  if (!local) return name_or_path;
  std::string s = name_or_path;
  while (!s.empty() && (s.back() == '/' || s.back() == '\\')) s.pop_back();
  const std::size_t slash = s.find_last_of("/\\");
  return slash == std::string::npos ? s : s.substr(slash + 1);
}

// ---- the plan file --------------------------------------------------------------------------

enum class FileKind { kYaml, kJson };

FileKind file_kind(const std::string& path) {
  const std::string ext = ascii_lower(fs::path(path).extension().string());
  if (ext == ".yaml" || ext == ".yml") return FileKind::kYaml;
  if (ext == ".json") return FileKind::kJson;
  throw InputError(fmt::format("{}: unknown plan file type '{}' (use a .yaml, .yml or .json name)", path, ext));
}

bool is_regime(const std::string& r) {
  return std::find(std::begin(kRegimes), std::end(kRegimes), r) != std::end(kRegimes);
}
int regime_index(const std::string& r) {
  return static_cast<int>(std::find(std::begin(kRegimes), std::end(kRegimes), r) - std::begin(kRegimes));
}
std::string known_regimes() { return "prefill, decode, chunk, varlen, train"; }

// A YAML scalar: plain when that reads back as the same string, else double-quoted (JSON's
// escapes are YAML's).
std::string yaml_scalar(const std::string& s) {
  static const std::set<std::string> kReserved = {"true", "false", "yes", "no", "on", "off", "y", "n", "null", "~"};
  bool plain =
      !s.empty() && (std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_') && !kReserved.count(ascii_lower(s));
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && !std::strchr("._/+-", c)) plain = false;
  return plain ? s : json(s).dump(-1, ' ', false, json::error_handler_t::replace);
}

// A JSON document as yaml-cpp nodes, for the rare JSON that yaml-cpp cannot read itself (messages
// then name the entry without a line).
YAML::Node to_node(const json& j) {
  YAML::Node n;
  if (j.is_object()) {
    n = YAML::Node(YAML::NodeType::Map);
    for (const auto& [k, v] : j.items()) n[k] = to_node(v);
  } else if (j.is_array()) {
    n = YAML::Node(YAML::NodeType::Sequence);
    for (const auto& v : j) n.push_back(to_node(v));
  } else if (j.is_string()) {
    n = j.get<std::string>();
  } else if (!j.is_null()) {
    n = j.dump();
  }
  return n;
}

class PlanReader {
 public:
  explicit PlanReader(std::string path) : path_(std::move(path)) {}

  Plan read(const YAML::Node& root) {
    if (!root || root.IsNull()) fail(SourcePos{path_, 1, 1}, "empty plan file; expected model, source and problems");
    if (!root.IsMap()) fail(root, "expected a mapping with model, source and problems");
    check_duplicate_keys(root);
    Plan plan;
    bool has_model = false, has_problems = false;
    YAML::Node problems, problems_key;  // a default Node is null, not absent: has_* say what was given
    for (auto it = root.begin(); it != root.end(); ++it) {
      const std::string key = it->first.IsScalar() ? it->first.Scalar() : "";
      if (key == "model") {
        plan.model = scalar(it->second, it->first, "model", "the model's name");
        if (const std::string why = text_problem(plan.model); !why.empty())
          fail(it->second, fmt::format("model: the name is not one line of UTF-8 text: {}", why));
        has_model = true;
      } else if (key == "source") {
        plan.source = it->second.IsNull() ? "" : scalar(it->second, it->first, "source", "the config file's name");
        if (const std::string why = text_problem(plan.source); !why.empty())
          fail(it->second, fmt::format("source: not one line of UTF-8 text: {}", why));
      } else if (key == "problems") {
        problems = it->second, problems_key = it->first, has_problems = true;
      } else {
        fail(it->first, fmt::format("unknown key '{}' (expected model, source, problems)", key));
      }
    }
    if (!has_model) fail(root, "no model: a plan names its model");
    if (!has_problems) fail(root, "no problems: a plan lists its problems");
    if (!problems.IsSequence())
      fail(problems.IsNull() ? problems_key : problems, "problems: expected a list of {problem: ..., regime: ...}");
    if (problems.size() == 0) fail(problems, "problems: empty list; a plan lists at least one problem");
    std::map<std::string, std::pair<std::size_t, YAML::Mark>> seen;
    for (std::size_t i = 0; i < problems.size(); ++i) {
      const YAML::Node item = problems[i];
      PlanEntry e = entry(item, i);
      auto [at, added] = seen.emplace(e.problem.str(), std::make_pair(i, item.Mark()));
      if (!added) {
        const int line = at->second.second.line + 1;
        fail(item, fmt::format("problems[{}]: {} is listed twice (first as problems[{}]{})", i, e.problem.str(),
                               at->second.first, line > 0 ? fmt::format(", line {}", line) : ""));
      }
      plan.entries.push_back(std::move(e));
    }
    return plan;
  }

 private:
  SourcePos pos(const YAML::Mark& m) const {
    if (m.line < 0) return {path_, 0, 0};  // nodes made from JSON without yaml-cpp have no marks
    return {path_, m.line + 1, m.column + 1};
  }
  [[noreturn]] void fail(const SourcePos& at, const std::string& msg) const {
    throw InputError(fmt::format("{}: {}", at.str(), msg));
  }
  [[noreturn]] void fail(const YAML::Node& n, const std::string& msg) const { fail(pos(n.Mark()), msg); }

  // A null value has no useful mark: messages about it point at its key.
  std::string scalar(const YAML::Node& v, const YAML::Node& key, const std::string& path, const std::string& what) {
    if (!v.IsScalar()) fail(v.IsNull() ? key : v, fmt::format("{}: expected {}", path, what));
    return v.Scalar();
  }

  PlanEntry entry(const YAML::Node& item, std::size_t i) {
    const std::string where = fmt::format("problems[{}]", i);
    if (!item.IsMap())
      fail(item, fmt::format("{}: expected {{problem: \"b=...,h=...\", regime: prefill|decode|chunk}}", where));
    YAML::Node problem, regime, problem_key, regime_key, layers, layers_key;
    bool has_problem = false, has_regime = false, has_layers = false;
    for (auto it = item.begin(); it != item.end(); ++it) {
      const std::string key = it->first.IsScalar() ? it->first.Scalar() : "";
      if (key == "problem") {
        problem = it->second, problem_key = it->first, has_problem = true;
      } else if (key == "regime") {
        regime = it->second, regime_key = it->first, has_regime = true;
      } else if (key == "layers") {
        layers = it->second, layers_key = it->first, has_layers = true;
      } else {
        fail(it->first, fmt::format("{}: unknown key '{}' (expected problem, regime, layers)", where, key));
      }
    }
    if (!has_problem) fail(item, where + ": no problem");
    if (!has_regime) fail(item, where + ": no regime (prefill, decode, chunk, varlen or train)");
    PlanEntry e;
    const std::string spec = scalar(problem, problem_key, where + ".problem", "a problem spec like \"b=1,h=32,...\"");
    try {
      e.problem = Problem::parse(spec);
    } catch (const InputError& err) {
      fail(problem, fmt::format("{}: {}", where, err.what()));
    }
    e.regime = scalar(regime, regime_key, where + ".regime", "prefill, decode, chunk, varlen or train");
    if (!is_regime(e.regime))
      fail(regime, fmt::format("{}.regime: unknown regime '{}' (known: {})", where, e.regime, known_regimes()));
    // Optional: which of the model's layers run the problem (plan writes it for models with
    // variants). Free text, one line: it is printed and stored with the plan.
    if (has_layers) {
      e.layers = scalar(layers, layers_key, where + ".layers",
                        "the layers it serves, e.g. \"sliding_attention, 21 of 42 layers\"");
      if (const std::string why = text_problem(e.layers); !why.empty())
        fail(layers, fmt::format("{}.layers: not one line of UTF-8 text: {}", where, why));
    }
    return e;
  }

  // yaml-cpp keeps both entries of a repeated key and lookups see only the first.
  void check_duplicate_keys(const YAML::Node& n) const {
    if (n.IsMap()) {
      std::map<std::string, int> seen;
      for (auto it = n.begin(); it != n.end(); ++it) {
        if (it->first.IsScalar()) {
          auto [at, added] = seen.emplace(it->first.Scalar(), it->first.Mark().line + 1);
          if (!added)
            fail(it->first, fmt::format("key '{}' given twice{}", it->first.Scalar(),
                                        at->second > 0 ? fmt::format(" (first at line {})", at->second) : ""));
        }
        check_duplicate_keys(it->second);
      }
    } else if (n.IsSequence()) {
      for (const auto& x : n) check_duplicate_keys(x);
    }
  }

  std::string path_;
};

// ---- make_plan ------------------------------------------------------------------------------

void check_list(const std::vector<std::int64_t>& v, const std::string& option, std::int64_t lo, std::int64_t hi) {
  if (v.empty()) throw InputError(fmt::format("{}: empty list", option));
  for (std::int64_t x : v)
    if (x < lo || x > hi) throw InputError(fmt::format("{}: {} is out of range [{}, {}]", option, x, lo, hi));
}

std::vector<std::int64_t> sorted_unique(std::vector<std::int64_t> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

}  // namespace

std::string describe_head_dims(const std::vector<int>& dims) {
  // A run of four or more with one step reads as a rule ("every multiple of 16 from 32 to 256").
  bool run = dims.size() >= 4 && dims[1] > dims[0] && dims[0] % (dims[1] - dims[0]) == 0;
  for (std::size_t i = 2; run && i < dims.size(); ++i) run = dims[i] - dims[i - 1] == dims[1] - dims[0];
  if (run) return fmt::format("every multiple of {} from {} to {}", dims[1] - dims[0], dims.front(), dims.back());
  return "head dims " + and_list(dims);
}

namespace {

// Per head dim (multiples of 8 to 1024): whether some shipped family serves its prefill, and its
// decode, on the space's highest arch. Asked of the shipped spaces and the families' own rules.
struct HeadDimService {
  std::vector<int> both, decode_only;
};

const HeadDimService& head_dim_service() {
  static const HeadDimService kService = [] {
    std::vector<SearchSpace> spaces;  // parsed once, not once a dim
    for (const std::string& family : known_families())
      if (std::optional<SearchSpace> space = SearchSpace::shipped(family)) spaces.push_back(std::move(*space));
    const auto served = [&](const std::string& spec) {
      const Problem p = Problem::parse(spec);
      return std::any_of(spaces.begin(), spaces.end(), [&](const SearchSpace& space) {
        try {
          check_family_serves(space.family(), p);
          space.check_problem(p, space.default_arch());
          return true;
        } catch (const InputError&) {
          return false;
        }
      });
    };
    HeadDimService out;
    for (int d = 8; d <= 1024; d += 8) {
      const bool prefill = served(fmt::format("b=1,h=8,s=1024,d={},dtype=bf16,causal=1", d));
      const bool decode = served(fmt::format("b=1,h=8,s=1,sk=1024,d={},dtype=bf16,causal=0", d));
      if (prefill && decode) out.both.push_back(d);
      else if (decode) out.decode_only.push_back(d);
    }
    return out;
  }();
  return kService;
}

}  // namespace

const std::vector<int>& supported_head_dims() {
  // A head dim is planned in full when some family serves its prefill and some its decode (the
  // regimes every plan has); decode_only_head_dims() are planned for decode alone.
  return head_dim_service().both;
}

const std::vector<int>& decode_only_head_dims() { return head_dim_service().decode_only; }

ModelAttention read_model_config(const std::string& path) {
  const std::string text = read_input_file(path, "a config.json");
  const json top = parse_json(path, text);
  if (!top.is_object())
    throw InputError(fmt::format("{}: expected a JSON object (a Hugging Face config.json), got {}", path,
                                 top.is_array() ? "a list" : "a single value"));
  const ConfigReader cfg(path, top);
  ModelAttention m;
  m.source = fs::path(path).filename().string();

  if (const auto it = top.find("_name_or_path"); it != top.end() && it->is_string() && !it->get<std::string>().empty())
    m.name = model_name_from(it->get<std::string>());
  else if (const auto mt = top.find("model_type");
           mt != top.end() && mt->is_string() && !mt->get<std::string>().empty())
    m.name = mt->get<std::string>();
  else
    m.name = fs::path(path).stem().string();
  // The name and the file's name go into the plan and the queue, and are printed in JSON.
  check_stored_text(m.name, fmt::format("{}: the model's name", path));
  check_stored_text(m.source, "the config file's name");

  refuse_unserved_attention(cfg);

  const std::int64_t heads = cfg.positive("num_attention_heads", kMaxHeads);
  std::int64_t kv = heads;
  std::string kv_key;
  if (const json* v = cfg.get("num_key_value_heads")) {
    kv = cfg.positive("num_key_value_heads", *v, kMaxHeads), kv_key = "num_key_value_heads";
  } else if (const json* f = cfg.get("num_kv_heads")) {  // Falcon's new decoder architecture
    kv = cfg.positive("num_kv_heads", *f, kMaxHeads), kv_key = "num_kv_heads";
  } else if (const json* mq = cfg.get("multi_query")) {  // Falcon-7B: one K/V head
    if (!mq->is_boolean())
      cfg.fail(fmt::format("{}: expected true or false, got {}", cfg.name("multi_query"), describe(*mq)));
    if (mq->get<bool>()) kv = 1, kv_key = "multi_query";
  }
  if (heads % kv != 0)
    cfg.fail(
        fmt::format("{} ({}) does not divide {} ({})", cfg.name(kv_key), kv, cfg.name("num_attention_heads"), heads));

  std::int64_t d = 0;
  std::string d_from;
  if (const json* rank = cfg.get("kv_lora_rank")) {
    // Multi-head latent attention: prefill's heads are the decompressed ones, every query head with
    // its own K/V of qk_nope_head_dim + qk_rope_head_dim (V: v_head_dim).
    const std::int64_t r = cfg.positive("kv_lora_rank", *rank, kMaxHeads);
    for (const char* key : {"qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"})
      if (!cfg.get(key))
        cfg.fail(fmt::format("{} without {}: multi-head latent attention's head dims are qk_nope_head_dim + "
                             "qk_rope_head_dim (queries and keys) and v_head_dim (values)",
                             cfg.name("kv_lora_rank"), cfg.name(key)));
    const std::int64_t nope = cfg.positive("qk_nope_head_dim", *cfg.get("qk_nope_head_dim"), kMaxHeads);
    const std::int64_t rope = cfg.positive("qk_rope_head_dim", *cfg.get("qk_rope_head_dim"), kMaxHeads);
    const std::int64_t dv = cfg.positive("v_head_dim", *cfg.get("v_head_dim"), kMaxHeads);
    d = nope + rope;
    const auto& served = supported_head_dims();
    for (const auto& [dim, what] : {std::pair{d, fmt::format("the query/key head dim {} ({} {} + {} {})", d,
                                                             cfg.name("qk_nope_head_dim"), nope,
                                                             cfg.name("qk_rope_head_dim"), rope)},
                                    std::pair{dv, fmt::format("{} {}", cfg.name("v_head_dim"), dv)}})
      if (std::find(served.begin(), served.end(), dim) == served.end())
        cfg.fail(fmt::format("multi-head latent attention: {} is not supported: attntune's kernels serve {}", what,
                             describe_head_dims(served)));
    // Decode reads the latent cache: one KV head of r + rope dims, V its first r. A problem spec
    // takes head dims up to 1024 (whether a family serves them is the spaces' say, not plan's).
    if (r + rope > kMaxLatentDim)
      cfg.fail(fmt::format("multi-head latent attention: the latent cache's {} dims ({} {} + {} {}) are more than a "
                           "problem's head dim may be ({})",
                           r + rope, cfg.name("kv_lora_rank"), r, cfg.name("qk_rope_head_dim"), rope, kMaxLatentDim));
    m.latent = true;
    m.head_dim_v = dv == d ? 0 : static_cast<int>(dv);
    m.latent_head_dim = static_cast<int>(r + rope);
    m.latent_head_dim_v = static_cast<int>(r);
    kv = heads;  // decompressed: one K/V head per query head
    m.notes.push_back(fmt::format(
        "multi-head latent attention ({} {}): planning prefill on the decompressed K/V, {} heads of head dims "
        "{} / {} (d={},dv={}), and decode over the latent cache: one KV head of {} dims ({} + {}) whose first {} "
        "are V (d={},dv={},latent=1; call with v = k and head_dim_v {}), in pages of {} (FlashMLA's); chunked "
        "prefill is left out: a chunk's thousands of query rows make it compute-bound, where serving engines "
        "decompress the cache and run it as a prefill (d={},dv={}, the prefill regime's problems)",
        cfg.name("kv_lora_rank"), r, heads, d, dv, d, dv, r + rope, r, rope, r, r + rope, r, r, kLatentPage, d, dv));
  } else if (const json* hd = cfg.get("head_dim")) {
    d = cfg.positive("head_dim", *hd, kMaxHeads);
    d_from = cfg.name("head_dim");
  } else {
    const json* hidden = cfg.get("hidden_size");
    if (!hidden)
      cfg.fail(fmt::format("no {} and no {}: one of them gives the head dim", cfg.name("head_dim"),
                           cfg.name("hidden_size")));
    const std::int64_t h = cfg.positive("hidden_size", *hidden, std::int64_t{1} << 30);
    if (h % heads != 0)
      cfg.fail(fmt::format("{} ({}) is not a multiple of {} ({}), and there is no {}", cfg.name("hidden_size"), h,
                           cfg.name("num_attention_heads"), heads, cfg.name("head_dim")));
    d = h / heads;
    d_from = fmt::format("head dim {} ({} {} / {} {})", d, cfg.name("hidden_size"), h, cfg.name("num_attention_heads"),
                         heads);
  }
  const auto& dims = supported_head_dims();
  const auto& decode_dims = decode_only_head_dims();
  if (!m.latent && std::find(dims.begin(), dims.end(), d) == dims.end()) {
    const std::string what = cfg.get("head_dim") ? fmt::format("{} {}", d_from, d) : d_from;
    if (std::find(decode_dims.begin(), decode_dims.end(), d) == decode_dims.end())
      cfg.fail(fmt::format("{} is not supported: attntune's kernels serve {} (and {} for decode)", what,
                           describe_head_dims(dims), describe_head_dims(decode_dims)));
    m.decode_only = true;
    m.notes.push_back(fmt::format("{}: attntune's kernels serve its decode (flash_decode_wgmma) but no prefill "
                                  "family holds it: the plan has decode problems only",
                                  what));
  }

  m.heads = static_cast<int>(heads);
  m.kv_heads = static_cast<int>(kv);
  m.head_dim = static_cast<int>(d);

  // torch_dtype; transformers >= 4.56 writes "dtype".
  auto [dt, dt_key] = cfg.get_anywhere("torch_dtype");
  if (!dt) std::tie(dt, dt_key) = cfg.get_anywhere("dtype");
  if (!dt) {
    m.dtype = "bf16";
    m.dtype_note = "the config gives no torch_dtype: planning bf16 (--dtype chooses)";
  } else {
    if (!dt->is_string())
      cfg.fail(fmt::format("{}: expected a string like \"bfloat16\", got {}", dt_key, describe(*dt)));
    const std::string t = dt->get<std::string>();
    if (t == "bfloat16") {
      m.dtype = "bf16";
    } else if (t == "float16" || t == "half") {
      m.dtype = "fp16";
    } else if (t == "float32" || t == "float" || t == "float64") {
      m.dtype = "bf16";
      m.dtype_note = fmt::format(
          "{} is {} (the checkpoint's storage type): planning bf16, the usual inference "
          "dtype (--dtype chooses)",
          dt_key, t);
    } else {
      m.dtype = "bf16";
      m.dtype_note = fmt::format(
          "{} is '{}', which attntune does not tune (fp16, bf16): planning bf16 (--dtype "
          "chooses)",
          dt_key, t);
    }
  }

  if (const json* mp = cfg.get("max_position_embeddings"); mp && mp->is_number_integer() && mp->get<std::int64_t>() > 0)
    m.max_context = mp->get<std::int64_t>();
  read_layers(cfg, m);
  read_scale(cfg, m);
  return m;
}

bool ModelAttention::has_variants() const {
  return std::any_of(layer_kinds.begin(), layer_kinds.end(), [](const LayerKind& k) { return !k.plain(); });
}

std::vector<std::int64_t> parse_int_list(const std::string& text, const std::string& option, std::int64_t lo,
                                         std::int64_t hi) {
  std::vector<std::int64_t> out;
  auto trim = [](std::string s) {
    const auto b = s.find_first_not_of(" \t");
    const auto e = s.find_last_not_of(" \t");
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
  };
  if (trim(text).empty()) throw InputError(fmt::format("{}: empty list (expected e.g. 1,8)", option));
  std::size_t pos = 0;
  while (true) {
    const std::size_t end = std::min(text.find(',', pos), text.size());
    const std::string item = trim(text.substr(pos, end - pos));
    if (item.empty()) throw InputError(fmt::format("{} '{}': an empty item", option, text));
    std::int64_t v = 0;
    const char* first = item.data() + (item[0] == '+' ? 1 : 0);
    const auto [ptr, ec] = std::from_chars(first, item.data() + item.size(), v);
    if (ec == std::errc::result_out_of_range)
      throw InputError(fmt::format("{}: {} is out of range [{}, {}]", option, item, lo, hi));
    if (ec != std::errc() || ptr != item.data() + item.size())
      throw InputError(fmt::format("{}: '{}' is not a whole number", option, item));
    if (v < lo || v > hi) throw InputError(fmt::format("{}: {} is out of range [{}, {}]", option, v, lo, hi));
    out.push_back(v);
    if (end == text.size()) break;
    pos = end + 1;
  }
  return out;
}

std::vector<std::string> parse_regimes(const std::string& text) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  if (text.find_first_not_of(" \t") == std::string::npos)
    throw InputError(fmt::format("--regimes: empty list (known: {})", known_regimes()));
  while (true) {
    const std::size_t end = std::min(text.find(',', pos), text.size());
    std::string item = text.substr(pos, end - pos);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) throw InputError(fmt::format("--regimes '{}': an empty item", text));
    if (!is_regime(item))
      throw InputError(fmt::format("--regimes: unknown regime '{}' (known: {})", item, known_regimes()));
    out.push_back(item);
    if (end == text.size()) break;
    pos = end + 1;
  }
  return out;
}

// Whether a training step's backward of a model's layers is a problem attntune tunes: the backward
// pass (Problem::backward) has one head dim for Q, K and V (windows, sinks and soft-caps are served).
bool train_backward(const ModelAttention& m) { return m.head_dim_v == 0 || m.head_dim_v == m.head_dim; }

std::string train_note(const ModelAttention& m, const PlanOptions& o) {
  if (std::find(o.regimes.begin(), o.regimes.end(), "train") == o.regimes.end()) return "";
  if (train_backward(m)) return "";
  return fmt::format("train: the backward of every layer is not planned (V's head dim {} is not Q's and K's {}: no "
                     "backward family serves it yet); the forward is",
                     m.head_dim_v, m.head_dim);
}

Plan make_plan(const ModelAttention& m, const PlanOptions& o) {
  // The model, as read_model_config checks it, for callers that fill it in themselves.
  if (m.heads < 1 || m.kv_heads < 1 || m.heads % m.kv_heads != 0)
    throw InputError(fmt::format("model {}: {} query heads and {} KV heads (the KV heads must divide the query heads)",
                                 m.name, m.heads, m.kv_heads));
  const auto& dims = m.decode_only ? decode_only_head_dims() : supported_head_dims();
  for (int dim : {m.head_dim, m.head_dim_v ? m.head_dim_v : m.head_dim})
    if (std::find(dims.begin(), dims.end(), dim) == dims.end())
      throw InputError(fmt::format("model {}: head dim {} is not supported: attntune's kernels serve {}{}", m.name, dim,
                                   describe_head_dims(dims), m.decode_only ? " for decode only" : ""));
  if (m.dtype != "bf16" && m.dtype != "fp16")
    throw InputError(fmt::format("model {}: dtype '{}' (expected bf16 or fp16)", m.name, m.dtype));

  // Tensor parallelism splits the heads over GPUs; KV heads fewer than GPUs are replicated.
  if (o.tp < 1 || o.tp > kMaxHeads) throw InputError(fmt::format("--tp: {} is out of range [1, {}]", o.tp, kMaxHeads));
  if (m.heads % o.tp != 0)
    throw InputError(fmt::format("--tp {} does not divide the model's {} query heads", o.tp, m.heads));
  std::int64_t hkv = 0;
  if (m.kv_heads % o.tp == 0)
    hkv = m.kv_heads / o.tp;
  else if (o.tp % m.kv_heads == 0)
    hkv = 1;
  else
    throw InputError(fmt::format("--tp {} and the model's {} KV heads: neither divides the other", o.tp, m.kv_heads));
  const std::int64_t h = m.heads / o.tp;

  // Options: every list is checked, whichever regimes use it.
  if (o.regimes.empty()) throw InputError(fmt::format("--regimes: empty list (known: {})", known_regimes()));
  std::set<std::string> regimes;
  for (const auto& r : o.regimes) {
    if (!is_regime(r)) throw InputError(fmt::format("--regimes: unknown regime '{}' (known: {})", r, known_regimes()));
    regimes.insert(r);
  }
  // A head dim served for decode only: its prefill, varlen and chunked prefill are left out
  // (read_model_config's note says why).
  if (m.decode_only) {
    regimes.erase("prefill");
    regimes.erase("varlen");
    regimes.erase("chunk");
    if (regimes.empty())
      throw InputError(fmt::format("model {}: head dim {} is served for decode only (no prefill family holds it); "
                                   "plan --regimes decode",
                                   m.name, m.head_dim));
  }
  // A latent (MLA) model: prefill and varlen on the decompressed K/V, decode over the latent cache;
  // its chunked prefill is left out (read_model_config's note says why).
  if (m.latent) {
    if (m.latent_head_dim <= m.latent_head_dim_v || m.latent_head_dim_v < 1 || m.latent_head_dim > kMaxLatentDim)
      throw InputError(fmt::format("model {}: a latent cache of {} dims with V its first {} (V must be fewer dims, "
                                   "at most {} in all)",
                                   m.name, m.latent_head_dim, m.latent_head_dim_v, kMaxLatentDim));
    regimes.erase("chunk");
    if (regimes.empty())
      throw InputError(fmt::format("model {}: multi-head latent attention's chunked prefill is left out: serving "
                                   "engines run it on the decompressed K/V as a prefill; plan --regimes "
                                   "prefill,decode (decode reads the latent cache)",
                                   m.name));
  }
  // The KV cache's dtype: fp8, else a cache of q's dtype, by any of its names.
  if (o.kv_dtype != "fp8" && o.kv_dtype != "fp16" && o.kv_dtype != "bf16" && o.kv_dtype != "model")
    throw InputError(fmt::format("--kv-dtype: unknown dtype '{}' (expected fp8, or fp16, bf16 or model: a cache of "
                                 "q's dtype)",
                                 o.kv_dtype));
  const bool kv_fp8 = o.kv_dtype == "fp8";
  std::vector<DType> dtypes;
  if (o.dtype == "model")
    dtypes = {m.dtype == "fp16" ? DType::kFp16 : DType::kBf16};
  else if (o.dtype == "bf16")
    dtypes = {DType::kBf16};
  else if (o.dtype == "fp16")
    dtypes = {DType::kFp16};
  else if (o.dtype == "both")
    dtypes = {DType::kBf16, DType::kFp16};  // by name: bf16 first
  else
    throw InputError(fmt::format("--dtype: unknown dtype '{}' (expected bf16, fp16, both or model)", o.dtype));
  check_list(o.batch, "--batch", 1, kPlanMaxBatch);
  check_list(o.seqlen, "--seqlen", 1, kPlanMaxLength);
  check_list(o.decode_batch, "--decode-batch", 1, kPlanMaxBatch);
  check_list(o.context, "--context", 1, kPlanMaxLength);
  check_list(o.q_len, "--q-len", 1, kPlanMaxLength);
  check_list({o.chunk}, "--chunk", 1, kPlanMaxLength);
  check_list({o.page}, "--page", 0, kPlanMaxLength);
  const auto batch = sorted_unique(o.batch), seqlen = sorted_unique(o.seqlen),
             decode_batch = sorted_unique(o.decode_batch), context = sorted_unique(o.context),
             q_len = sorted_unique(o.q_len);
  if (regimes.count("decode") && q_len.back() > context.front())
    throw InputError(
        fmt::format("decode: --q-len {} is longer than --context {}: a decode step's new tokens attend to "
                    "a cache that holds them",
                    q_len.back(), context.front()));
  if (regimes.count("chunk")) {
    if (o.chunk > context.front())
      throw InputError(
          fmt::format("chunk: --chunk {} is longer than --context {}: a full chunk follows at least one "
                      "earlier chunk in the cache (a prompt's first chunk is a prefill); lower --chunk or "
                      "leave out the shorter contexts",
                      o.chunk, context.front()));
    if (context.back() + o.chunk > kPlanMaxLength)
      throw InputError(fmt::format("chunk: --context {} + --chunk {} is {} keys, more than {}", context.back(), o.chunk,
                                   context.back() + o.chunk, kPlanMaxLength));
  }
  // A packed batch's rows are counted by int cu_seqlens (Problem::parse refuses more).
  if (regimes.count("varlen") && batch.back() * seqlen.back() > INT_MAX)
    throw InputError(fmt::format("varlen: --batch {} x --seqlen {} is {} rows, more than a packed batch holds ({}: "
                                 "cu_seqlens are int)",
                                 batch.back(), seqlen.back(), batch.back() * seqlen.back(), INT_MAX));

  // The layer kinds: every layer plain full attention unless the model says otherwise.
  std::vector<LayerKind> kinds = m.layer_kinds;
  if (kinds.empty()) kinds.push_back(LayerKind{"full_attention", -1, 0, false, m.layers});
  for (const LayerKind& k : kinds) {
    if (const std::string why = text_problem(k.name); k.name.empty() || !why.empty())
      throw InputError(fmt::format("model {}: a layer kind's name is not one line of text", m.name));
    if (k.window < -1 || k.window >= kMaxWindow || !std::isfinite(k.softcap) || k.softcap < 0 ||
        k.softcap > kMaxSoftcap || k.layers < 0 || k.layers > kMaxLayers)
      throw InputError(fmt::format("model {}: layer kind {}: window {} (-1 or 0..{}), softcap {} (0..{}), {} layers",
                                   m.name, k.name, k.window, kMaxWindow - 1, k.softcap, kMaxSoftcap, k.layers));
  }
  // Which layers a problem serves, said when the model has variants (a plain model's problems
  // serve every layer, and its plan reads as before).
  const bool variants = std::any_of(kinds.begin(), kinds.end(), [](const LayerKind& k) { return !k.plain(); });
  auto layers_text = [&](const LayerKind& k) -> std::string {
    if (!variants) return "";
    if (k.layers > 0 && m.layers > 0) return fmt::format("{}, {} of {} layers", k.name, k.layers, m.layers);
    return kinds.size() == 1 ? k.name + ", every layer" : k.name;
  };

  std::vector<std::pair<std::size_t, PlanEntry>> made;  // (layer kind, entry)
  for (std::size_t ki = 0; ki < kinds.size(); ++ki) {
    const LayerKind& kind = kinds[ki];
    const std::string layers = layers_text(kind);
    auto add = [&](const std::string& regime, DType dt, std::int64_t b, std::int64_t s, std::int64_t sk,
                   std::int64_t page, std::int64_t varlen = 0, bool backward = false) {
      Problem p;
      p.b = b, p.h = h, p.hkv = hkv, p.s = s, p.sk = sk, p.d = m.head_dim, p.dtype = dt, p.causal = true;
      p.dv = m.head_dim_v;
      p.page = page;
      p.varlen = varlen;
      // Every layer is causal: a window bounds the left side only (window=L, the right is the diagonal).
      p.window_left = kind.window;
      p.softcap = kind.softcap;
      p.sinks = kind.sinks;
      if (m.latent && regime == "decode") {
        // The latent cache: one KV head of latent_head_dim, V its first latent_head_dim_v columns,
        // shared by every query head (on every GPU at --tp: it is replicated, not split).
        p.d = m.latent_head_dim;
        p.dv = m.latent_head_dim_v;
        p.hkv = 1;
        p.latent = true;
      }
      // An FP8 cache where a decode step reads one (flash_decode), and where chunked prefill and
      // longer decode steps read one through flash_fwd_wgmma (Hopper): head dims multiples of 32, no
      // soft-cap (its space's rules); those keep q's dtype (kv_dtype_note says so).
      if (kv_fp8 && regime == "decode" && s <= kPlanDecodeMaxQ) p.kv_fp8 = true;
      if (kv_fp8 && (regime == "chunk" || regime == "decode") && s > kPlanDecodeMaxQ && !p.latent &&
          p.d % 32 == 0 && (p.dv ? p.dv : p.d) % 32 == 0 && p.softcap <= 0)
        p.kv_fp8 = true;
      p.backward = backward;
      made.push_back({ki, {p, regime, layers}});
    };
    for (DType dt : dtypes) {
      if (regimes.count("prefill"))
        for (auto b : batch)
          for (auto len : seqlen) add("prefill", dt, b, len, len, 0);
      if (regimes.count("decode"))
        for (auto b : decode_batch)
          for (auto ctx : context)
            for (auto q : q_len) add("decode", dt, b, q, ctx, m.latent ? kLatentPage : o.page);
      if (regimes.count("chunk"))
        for (auto b : batch)
          for (auto ctx : context) add("chunk", dt, b, o.chunk, ctx + o.chunk, o.page);
      // Prefill as serving engines batch it: b prompts packed together, of lengths len/16..len.
      if (regimes.count("varlen"))
        for (auto b : batch)
          for (auto len : seqlen) add("varlen", dt, b, len, len, 0, varlen_shortest(len));
      // A training step: the forward (the prefill problem: under prefill when both are asked, a
      // plan listing each problem once) and its backward, where a backward family can serve the
      // layer kind (train_note says what is left out).
      if (regimes.count("train"))
        for (auto b : batch)
          for (auto len : seqlen) {
            add("train", dt, b, len, len, 0);
            if (train_backward(m)) add("train", dt, b, len, len, 0, 0, true);
          }
    }
  }
  auto key = [](const std::pair<std::size_t, PlanEntry>& m) {
    const PlanEntry& e = m.second;
    return std::make_tuple(regime_index(e.regime), std::string(dtype_name(e.problem.dtype)), m.first, e.problem.b,
                           e.problem.s, e.problem.sk, e.problem.backward);
  };
  std::stable_sort(made.begin(), made.end(), [&](const auto& a, const auto& b) { return key(a) < key(b); });
  Plan plan;
  plan.model = m.name;
  plan.source = m.source;
  // One problem once, in its first regime: a decode step of q-len 2048 over a cache of 6144 is
  // the chunk regime's problem too, and a plan lists each problem once. Two layer kinds never
  // make the same problem: their variants differ.
  std::set<std::string> seen;
  for (auto& [ki, e] : made)
    if (seen.insert(e.problem.str()).second) plan.entries.push_back(std::move(e));
  return plan;
}

std::string kv_dtype_note(const PlanOptions& o, const Plan& plan) {
  if (o.kv_dtype != "fp8") return "";
  // Problems of more than kPlanDecodeMaxQ query rows over a cache: planned FP8 (flash_fwd_wgmma, on
  // Hopper only), or left 16-bit (a soft-cap, a head dim not a multiple of 32).
  bool fp8 = false, kept = false;
  for (const PlanEntry& e : plan.entries) {
    if (e.regime != "chunk" && e.regime != "decode") continue;
    if (e.problem.s <= kPlanDecodeMaxQ) continue;
    (e.problem.kv_fp8 ? fp8 : kept) = true;
  }
  std::string note;
  if (fp8)
    note = fmt::format("--kv-dtype fp8: chunked prefill and decode steps of more than {} query rows read the FP8 "
                       "cache through flash_fwd_wgmma, on Hopper (sm_90) only: for other GPUs plan them with "
                       "--kv-dtype model",
                       kPlanDecodeMaxQ);
  const std::string why16 = "a soft-cap or a head dim that is not a multiple of 32 still plan a 16-bit KV cache of "
                            "q's dtype (no kernel family serves them over an FP8 cache)";
  if (kept && fp8) note += "; those with " + why16;
  else if (kept)
    note = fmt::format("--kv-dtype fp8: chunked prefill and decode steps of more than {} query rows with {}",
                       kPlanDecodeMaxQ, why16);
  return note;
}

std::string Plan::yaml() const {
  std::string out = "# attntune plan: the attention problems of a model (attntune plan --model ...)\n";
  out += fmt::format("model: {}\nsource: {}\nproblems:\n", yaml_scalar(model), yaml_scalar(source));
  for (const auto& e : entries)
    out += fmt::format("  - {{problem: \"{}\", regime: {}{}}}\n", e.problem.str(), yaml_scalar(e.regime),
                       e.layers.empty() ? "" : ", layers: " + yaml_scalar(e.layers));
  return out;
}

nlohmann::ordered_json Plan::json() const {
  nlohmann::ordered_json problems = nlohmann::ordered_json::array();
  for (const auto& e : entries) {
    nlohmann::ordered_json j = {{"problem", e.problem.str()}, {"regime", e.regime}};
    if (!e.layers.empty()) j["layers"] = e.layers;
    problems.push_back(std::move(j));
  }
  return {{"model", model}, {"source", source}, {"problems", std::move(problems)}};
}

Plan Plan::load(const std::string& path) {
  const FileKind kind = file_kind(path);
  const std::string text = read_input_file(path, "a plan file");
  YAML::Node root;
  if (kind == FileKind::kJson) {
    const nlohmann::json j = parse_json(path, text);  // strict JSON first: a .json file is JSON
    try {
      root = load_one_yaml_document(text, path);  // the same document again, for line:column marks
    } catch (const YAML::Exception&) {
      root = to_node(j);  // JSON yaml-cpp refuses (a surrogate pair, a newline before ':'): no positions
    }
  } else {
    try {
      root = load_one_yaml_document(text, path);  // one document, bounded (aliases, depth)
    } catch (const YAML::Exception& e) {
      const SourcePos at{path, e.mark.line + 1, e.mark.column + 1};
      throw InputError(fmt::format("{}: YAML: {}", e.mark.line >= 0 ? at.str() : path, e.msg));
    }
  }
  try {
    return PlanReader(path).read(root);
  } catch (const YAML::Exception& e) {  // a yaml-cpp check the reader did not anticipate
    throw InputError(fmt::format("{}: YAML: {}", path, e.msg));
  }
}

void Plan::save(const std::string& path, const std::vector<std::string>& databases, const std::string& what) const {
  const FileKind kind = file_kind(path);
  if (entries.empty()) throw InputError(fmt::format("{}: a plan without problems is not written", path));
  write_output_file(what, path, kind == FileKind::kYaml ? yaml() : json().dump(2) + "\n", databases);
}

}  // namespace attntune
