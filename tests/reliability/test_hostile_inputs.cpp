// Reliability, part 6 (docs/RELIABILITY.md, issue 28): hostile inputs made by generators rather
// than listed by hand, each run through the real binary with a wall-time limit:
//   - constraint expressions from the expression grammar (tuner/space/expr.hpp): random trees over
//     every operator and function, deep spines (nesting up to thousands), long chains (up to
//     megabytes), then mutated (characters dropped, doubled, replaced);
//   - search-space YAML: the recorded space with nested aliases (billion laughs), an alias inside
//     itself, a second document, deep nesting, huge scalars and keys, wrong types, tags, invalid
//     UTF-8, bytes flipped, lines dropped or doubled, files too large, FIFOs and devices;
//   - the same spaces stored in a database (campaigns.space_text, campaign_spaces) and read back by
//     `export`, `replay` and `report`;
//   - plan files and model config.json files (nested aliases, deep JSON, non-UTF-8 names);
//   - problem specs (keys and values mutated: NaN, huge integers, non-UTF-8, control characters);
//   - numeric options of every command that has them, and durations (nan, inf, overflow, negative).
// Each case runs against a copy of a real database (campaign k, 30 evaluations, from `tune` on the
// recorded H100 campaign) and must: exit 0, 1, 2 or 3 (never a signal), print exactly one line
// "attntune: error: ..." on stderr when it fails, finish within the time limit, and leave the
// database's directory byte for byte as it was when it failed (refused input changes nothing).
//
// Seeded and deterministic: ATTNTUNE_HOSTILE_SEED (default 28) and ATTNTUNE_HOSTILE_CASES (default
// 600 generated cases, plus the fixed ones) for a longer run; ATTNTUNE_HOSTILE_VERBOSE=1 prints
// each case with its exit code and first line.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "core/text.hpp"
#include "reliability_util.hpp"

namespace attntune::reliability {
namespace test_hostile_inputs {
namespace {

using Rng = std::mt19937_64;

std::size_t pick(Rng& r, std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(r); }
template <class T>
const T& pick(Rng& r, const std::vector<T>& v) {
  return v[pick(r, v.size())];
}
bool coin(Rng& r, double p = 0.5) { return std::bernoulli_distribution(p)(r); }

std::string repeat(const std::string& s, std::size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (std::size_t i = 0; i < n; ++i) out += s;
  return out;
}

std::string replace_once(std::string s, const std::string& from, const std::string& to) {
  const std::size_t at = s.find(from);
  if (at == std::string::npos) throw std::runtime_error("not found: " + from);
  return s.replace(at, from.size(), to);
}

// Every file under `dir` with its bytes: "unchanged" is equality.
std::map<std::string, std::string> tree(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string rel = fs::relative(e.path(), dir).string();
    if (e.is_directory()) out[rel + "/"] = "";
    else if (e.is_regular_file()) out[rel] = read_bytes(e.path().string());
  }
  return out;
}

// ---- Expressions, from the grammar -----------------------------------------------------------------

// The names of the recorded flash_fwd_mma space, by type.
const std::vector<std::string> kInts = {"block_m", "block_n", "warps", "sub_n", "kv_stages", "smem_bytes",
                                        "min_blocks", "est_regs", "threads", "b", "h", "hkv", "s", "sk", "d",
                                        "page", "max_smem_per_block", "smem_per_sm", "regs_per_sm"};
const std::vector<std::string> kIntLiterals = {"0", "1", "2", "16", "64", "255", "007", "9223372036854775807"};
// Literals the lexer refuses: rare, so that most trees reach type checking and evaluation.
const std::vector<std::string> kBadLiterals = {"99999999999999999999", "1x", "0x10"};

class ExprGen {
 public:
  explicit ExprGen(Rng& r) : r_(r) {}

  // A well-typed expression (mostly: literals out of range, a bad integer) of about `depth` levels:
  // at each level one operand continues the spine, the others are small.
  std::string boolean(int depth) {
    if (depth <= 0) {
      switch (pick(r_, 5)) {
        case 0: return coin(r_) ? "true" : "false";
        case 1: return "causal";
        case 2: return coin(r_) ? "dtype == 'bf16'" : "kv_schedule != \"interleaved\"";
        case 3: return fmt::format("{} <= {}", leaf(), leaf());
        default: return fmt::format("is_pow2({})", leaf());
      }
    }
    const std::string deep = boolean(depth - 1);
    switch (pick(r_, 11)) {
      case 0: return fmt::format("{} && {}", deep, boolean(0));
      case 1: return fmt::format("{} || {}", boolean(0), deep);
      case 2: return fmt::format("{} and {}", deep, boolean(0));
      case 3: return fmt::format("{} or {}", deep, boolean(0));
      case 4: return "!" + wrap(deep);
      case 5: return "not " + wrap(deep);
      case 6: return "(" + deep + ")";
      case 7: return fmt::format("{} ? {} : {}", boolean(0), wrap(deep), boolean(0));
      case 8: return fmt::format("{} {} {}", integer(depth - 1), pick(r_, kCompare), leaf());
      case 9: return fmt::format("is_pow2({})", integer(depth - 1));
      default: return fmt::format("{} == {}", wrap(deep), boolean(0));
    }
  }
  std::string integer(int depth) {
    if (depth <= 0) return leaf();
    const std::string deep = integer(depth - 1);
    switch (pick(r_, 10)) {
      case 0: return fmt::format("{} {} {}", deep, pick(r_, kArith), leaf());
      case 1: return fmt::format("{} {} {}", leaf(), pick(r_, kArith), wrap(deep));
      case 2: return "-" + wrap(deep);
      case 3: return "(" + deep + ")";
      case 4: return fmt::format("{}({}, {})", coin(r_) ? "min" : "max", deep, leaf());
      case 5: return fmt::format("ceil_div({}, {})", deep, leaf());
      case 6: return fmt::format("log2({})", deep);
      case 7: return fmt::format("{} ? {} : {}", boolean(0), wrap(deep), leaf());
      case 8: return fmt::format("max({}, {}, {})", leaf(), deep, leaf());
      default: return fmt::format("{} * {}", wrap(deep), leaf());
    }
  }
  std::string leaf() {
    if (coin(r_, 0.001)) return pick(r_, kBadLiterals);
    return coin(r_, 0.6) ? pick(r_, kInts) : pick(r_, kIntLiterals);
  }

  // The shapes that used to hurt: one of them, `n` units long.
  std::string shape(std::size_t n) {
    switch (pick(r_, 12)) {
      case 0: return repeat("(", n) + "block_m" + repeat(")", n) + " > 0";
      case 1: return repeat("-", n) + "1 < 0";
      case 2: return repeat("!", n) + "true";
      case 3: return repeat("not ", n) + "causal";
      case 4: return repeat("true ? ", n) + "1" + repeat(" : 0", n) + " > 0";
      case 5: return repeat("min(", n) + "1" + repeat(", 2)", n) + " > 0";
      case 6: return repeat("1 + ", n) + "1 > 0";
      case 7: return repeat("causal && ", n) + "true";
      case 8: return "block_m == " + repeat("9", n);
      case 9: return "dtype == '" + repeat("x", n) + "'";
      case 10: return repeat("block_m * ", n) + "0 == 0";
      default: return repeat("(true ? ", n) + "1" + repeat(" : 2)", n) + " == 1";
    }
  }

  // Characters dropped, doubled, replaced by operator characters, or the text cut.
  std::string mutate(std::string s) {
    static const std::string kChars = "()?:!-+*/%<>=&|,'\" \x01\xff" "abc019_";
    const int edits = 1 + static_cast<int>(pick(r_, 4));
    for (int i = 0; i < edits && !s.empty(); ++i) {
      const std::size_t at = pick(r_, s.size());
      switch (pick(r_, 4)) {
        case 0: s.erase(at, 1); break;
        case 1: s.insert(at, 1, s[at]); break;
        case 2: s[at] = kChars[pick(r_, kChars.size())]; break;
        default: s.resize(at); break;
      }
    }
    return s;
  }

 private:
  std::string wrap(const std::string& s) { return "(" + s + ")"; }
  const std::vector<std::string> kArith = {"+", "-", "*", "/", "%"};
  const std::vector<std::string> kCompare = {"==", "!=", "<", "<=", ">", ">="};
  Rng& r_;
};

// An expression as a YAML double-quoted scalar.
std::string yaml_quoted(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (u < 0x20) out += fmt::format("\\x{:02x}", u);
    else out += c;
  }
  return out + "\"";
}

// ---- Cases ----------------------------------------------------------------------------------------

// What a case runs on: where its files go, the recording, the pristine database.
struct Ctx {
  fs::path dir;         // the case's own directory (scratch files)
  fs::path db_dir;      // the database's directory (only the database): compared before and after
  std::string db;       // db_dir/attntune.db, a fresh copy of the pristine database
  const Recording* rec;
  std::string space_text, plan_text, model_json;
  std::string file(const std::string& name) const { return (dir / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    write_bytes(file(name), text);
    return file(name);
  }
  // campaign k's stored space replaced by `text` (in both tables), as a database from elsewhere could hold it.
  void store_space(const std::string& text) const {
    sqlite::Connection c = sqlite::Connection::open(db, SQLITE_OPEN_READWRITE);
    for (const char* sql : {"UPDATE campaigns SET space_text = ?1 WHERE name = 'k'",
                            "UPDATE campaign_spaces SET space_text = ?1 WHERE campaign_id = "
                            "(SELECT id FROM campaigns WHERE name = 'k')"}) {
      sqlite::Statement st(c, sql);
      st.bind(text);
      st.step();
    }
  }
};

struct Case {
  std::string cls, what;  // class (figures are per class) and a short description
  std::function<std::vector<std::string>(const Ctx&)> args;
  std::vector<std::string> nonfinite_accepted_is_bug;  // numeric: values that must never be accepted
};

std::vector<std::string> space_cmd(const Ctx& c, const std::string& space, Rng& r) {
  switch (pick(r, 3)) {
    case 0:
      return {"tune", "--space", space, "--problem", c.rec->problem, "--db", c.db, "--campaign", "hostile",
              "--simulate-db", c.rec->db, "--simulate-campaign", c.rec->campaign, "--strategy", "exhaustive",
              "--budget-evals", "3"};
    case 1: return {"space", "--space", space, "--problem", c.rec->problem, "--count"};
    default: return {"space", "--space", space};
  }
}

// A reader of campaign k, whose stored space is hostile.
std::vector<std::string> stored_space_cmd(const Ctx& c, Rng& r) {
  switch (pick(r, 4)) {
    case 0: return {"export", "--db", c.db, "--campaign", "k", "-o", c.file("k.cu")};
    case 1: return {"replay", "--db", c.db, "--campaign", "k", "--strategy", "random", "--seeds", "1", "--partial"};
    case 2: return {"report", "--db", c.db, "--campaign", "k", "--format", "json"};
    default: return {"campaigns", "--db", c.db, "--format", "json"};
  }
}

// The recorded space with a hostile YAML edit.
std::string yaml_mutation(const std::string& base, Rng& r, std::string& what) {
  static const std::vector<std::string> kValues = {
      "[]", "{}", "~", "\"\"", "[[[[1]]]]", "{a: {b: {c: 1}}}", "99999999999999999999999", "-1", "1.5", ".nan",
      ".inf", "!!binary aGVsbG8=", "!custom 1", "'64'", "true", "&x 1", "*nope", "\"\\xff\"", "[64, 128, 64]",
      "{values: [64], range: [1, 2]}", "{enum: []}", "{range: [1, 99999999999]}", "{pow2: [1, 9223372036854775807]}"};
  std::string s = base;
  switch (pick(r, 17)) {
    case 0: {  // billion laughs: `levels` anchors, each a list of `width` aliases of the one before
      const std::size_t levels = 3 + pick(r, 10), width = 2 + pick(r, 9);
      std::string lol = "lol0: &l0 [lol, lol]\n";
      for (std::size_t i = 1; i <= levels; ++i) {
        std::vector<std::string> items(width, fmt::format("*l{}", i - 1));
        lol += fmt::format("lol{}: &l{} [{}]\n", i, i, fmt::format("{}", fmt::join(items, ", ")));
      }
      what = fmt::format("nested aliases: {} levels of {}", levels, width);
      if (coin(r)) return lol + s;  // unknown top-level keys, walked before they are refused
      return replace_once(s, "description:", lol + "description: *l" + std::to_string(levels) + "\nx_description:");
    }
    case 1:
      what = "an alias inside its own anchor";
      return replace_once(s, "block_m: [64, 128]", coin(r) ? "block_m: &a [64, *a]" : "block_m: &a {values: *a}");
    case 2: {
      what = "a second document";
      switch (pick(r, 3)) {
        case 0: return s + "\n---\n" + s;
        case 1: return "---\n" + s + "\n---\nfamily: flash_fwd_wgmma\n";
        default: return s + "\n--- \n";
      }
    }
    case 3: {
      const std::size_t n = pick(r, std::vector<std::size_t>{64, 1000, 2000, 5000, 100000});
      what = fmt::format("a value nested {} deep", n);
      const std::string v = coin(r) ? repeat("[", n) + "64" + repeat("]", n) : repeat("{a: ", n) + "1" + repeat("}", n);
      return replace_once(s, "block_m: [64, 128]", "block_m: " + v);
    }
    case 4: {
      const std::size_t n = pick(r, std::vector<std::size_t>{1 << 16, 1 << 20, (4 << 20) - 100000, (4 << 20) + 1});
      what = fmt::format("a description of {} bytes", n);
      return replace_once(s, "description:", "description: " + repeat("x", n) + "\nx_description:");
    }
    case 5: {
      const std::size_t n = pick(r, std::vector<std::size_t>{1 << 12, 1 << 16, 1 << 20, 3 << 20});
      what = fmt::format("a parameter name of {} bytes", n);
      return replace_once(s, "block_m: [64, 128]", "block_m: [64, 128]\n  " + repeat("a", n) + ": [1, 2]");
    }
    case 6: {
      const std::size_t n = pick(r, std::vector<std::size_t>{1 << 12, 1 << 20});
      what = fmt::format("an arch of {} bytes", n);
      return replace_once(s, "archs: [", "archs: [sm_" + repeat("9", n) + ", ");
    }
    case 7: {
      const std::string v = pick(r, kValues);
      what = "block_m: " + v;
      return replace_once(s, "block_m: [64, 128]", "block_m: " + v);
    }
    case 8: {
      const std::string v = pick(r, kValues);
      what = "family: " + v;
      return replace_once(s, "family: flash_fwd_mma", "family: " + v);
    }
    case 9: {  // bytes flipped
      const int n = 1 + static_cast<int>(pick(r, 8));
      for (int i = 0; i < n; ++i) s[pick(r, s.size())] = static_cast<char>(pick(r, 256));
      what = fmt::format("{} bytes replaced at random", n);
      return s;
    }
    case 10: {
      const std::size_t at = pick(r, s.size());
      what = fmt::format("cut at byte {}", at);
      return s.substr(0, at);
    }
    case 11: {  // a line dropped or doubled
      std::vector<std::string> lines;
      for (std::size_t a = 0, b; a < s.size(); a = b + 1) {
        b = s.find('\n', a);
        if (b == std::string::npos) b = s.size();
        lines.push_back(s.substr(a, b - a));
      }
      const std::size_t i = pick(r, lines.size());
      const bool dup = coin(r);
      what = fmt::format("line {} {}", i + 1, dup ? "doubled" : "dropped");
      if (dup) lines.insert(lines.begin() + static_cast<long>(i), lines[i]);
      else lines.erase(lines.begin() + static_cast<long>(i));
      std::string out;
      for (const auto& l : lines) out += l + "\n";
      return out;
    }
    case 12: {
      const std::string bad = pick(r, std::vector<std::string>{"\xff", "\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80",
                                                               "\xe2\x82", std::string(1, '\0'), "\x1b[31m"});
      what = "invalid UTF-8 or a control byte in a comment or the description";
      return coin(r) ? replace_once(s, "family:", "# " + bad + "\nfamily:")
                     : replace_once(s, "description:", "description: \"" + bad + "\"\nx_description:");
    }
    case 13: {
      what = "valid anchors and aliases";
      return replace_once(replace_once(s, "block_m: [64, 128]", "block_m: &bm [64, 128]"), "block_n: [", "x_block_n: [");
    }
    case 14: {
      what = "a duplicated top-level section";
      return s + "\nparams:\n  block_m: [64]\n";
    }
    case 15: {
      const std::size_t n = pick(r, std::vector<std::size_t>{257, 30000});
      std::string params;
      for (std::size_t i = 0; i < n; ++i) params += fmt::format("  p{}: [1, 2]\n", i);
      what = fmt::format("{} parameters", n);
      return replace_once(s, "params:\n", "params:\n" + params);
    }
    default: {
      what = "the file over 4 MiB";
      return s + "\n#" + repeat("x", (4 << 20) + 10) + "\n";
    }
  }
}

std::string problem_mutation(Rng& r, std::string& what) {
  static const std::vector<std::string> kKeys = {"b", "h", "hkv", "s", "sk", "d", "dtype", "causal", "page"};
  static const std::vector<std::string> kValues = {
      "nan", "NaN", "inf", "-inf", "1e9", "1e400", "-1", "0", "99999999999999999999", "9223372036854775807",
      "0x10", "1.5", "", " 4", "4 ", "+4", "\xd9\xa4", "\xff", "\xc0\xb4", "\n", "4\t", "bf16\x1b[31m", "fp32",
      "1048577", "2147483648", std::string(100000, '9'), "4,", "=4"};
  std::map<std::string, std::string> p = {{"b", "4"},  {"h", "16"},      {"s", "4096"},
                                          {"d", "128"}, {"dtype", "bf16"}, {"causal", "0"}};
  std::vector<std::string> edits;
  const int n = 1 + static_cast<int>(pick(r, 3));
  for (int i = 0; i < n; ++i) {
    switch (pick(r, 5)) {
      case 0: case 1: case 2: {
        const std::string& k = pick(r, kKeys);
        const std::string& v = pick(r, kValues);
        p[k] = v;
        edits.push_back(k + "=" + (v.size() > 12 ? fmt::format("<{} bytes>", v.size()) : v));
        break;
      }
      case 3: {
        const std::string k = pick(r, kKeys);
        p.erase(k);
        edits.push_back("no " + k);
        break;
      }
      default: {
        const std::string k = pick(r, std::vector<std::string>{"B", "heads", "\xff", "b ", "d\n", ""});
        p[k] = "1";
        edits.push_back("key '" + k + "'");
        break;
      }
    }
  }
  std::string spec;
  for (const auto& [k, v] : p) spec += (spec.empty() ? "" : ",") + k + "=" + v;
  if (coin(r, 0.1)) spec += ",", edits.push_back("trailing comma");
  what = fmt::format("{}", fmt::join(edits, "; "));
  return spec;
}

// Option values a number or a duration must refuse, or take.
const std::vector<std::string> kNumbers = {"nan", "NaN", "-nan", "inf", "-inf", "infinity", "1e308", "1e309",
                                           "-1e309", "1e-320", "-0", "0", "-1", "0.5", "2", "1e9", "1000000001",
                                           "1e10", "1e18", "0x1p4", "1,5", "", " 2", "1e", "5s", "\xff"};
const std::vector<std::string> kDurations = {"nan", "nans", "infs", "1e999s", "99999999999999999999999h",
                                             "1000000000s", "1000000001s", "0s", "-5s", "5", "5x", "1h-5m", ".s",
                                             "5.5.5s", std::string(400, '1') + "s", "9e9d", "2s", "1h30m"};

bool nonfinite(const std::string& v) {
  std::string l;
  for (char c : v) l += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return l.find("nan") != std::string::npos || l.find("inf") != std::string::npos || l == "1e309" ||
         l == "-1e309" || l == "1e999s" || l == "99999999999999999999999h" || l == std::string(400, '1') + "s";
}

Case numeric_case(Rng& r) {
  struct Opt {
    std::string cmd, flag;
  };
  static const std::vector<Opt> kOpts = {
      {"tune", "--max-seconds"},      {"tune", "--min-seconds"},         {"tune", "--min-gain"},
      {"tune", "--final-min-seconds"}, {"tune", "--compile-timeout"},     {"tune", "--deadline-floor"},
      {"tune", "--budget-time"},      {"submit", "--max-seconds"},       {"submit", "--min-gain"},
      {"submit", "--budget-time"},    {"submit", "--final-min-seconds"}, {"compile", "--compile-timeout"},
      {"eval", "--max-seconds"},      {"eval", "--min-seconds"},         {"eval", "--compile-timeout"},
      {"eval", "--deadline-floor"},   {"replay", "--target-pct"},        {"serve", "--lease-seconds"},
      {"serve", "--poll-seconds"},    {"serve", "--compile-timeout"},    {"serve", "--deadline-floor"}};
  const Opt o = pick(r, kOpts);
  const std::string v = o.flag == "--budget-time" ? pick(r, kDurations) : pick(r, kNumbers);
  Case c{"numeric options", fmt::format("{} {} '{}'", o.cmd, o.flag, v.size() > 16 ? v.substr(0, 13) + "..." : v),
         nullptr, {}};
  if (nonfinite(v)) c.nonfinite_accepted_is_bug.push_back(v);
  c.args = [o, v](const Ctx& x) -> std::vector<std::string> {
    const std::string flag = o.flag + "=" + v;  // "--flag=-1": a value that starts with '-' stays a value
    if (o.cmd == "tune")
      return {"tune", "--space", x.rec->space, "--problem", x.rec->problem, "--db", x.db, "--campaign", "k",
              "--simulate-db", x.rec->db, "--simulate-campaign", x.rec->campaign, "--strategy", "exhaustive",
              "--budget-evals", "33", flag};
    if (o.cmd == "submit") return {"submit", "--problem", x.rec->problem, "--space", x.rec->space, "--db", x.db, flag};
    if (o.cmd == "compile")  // an arch no space has: a value that passes is then refused, before NVRTC runs
      return {"compile", "--space", x.rec->space, "--problem", x.rec->problem, "--arch", "sm_10", "--db", x.db, flag};
    if (o.cmd == "eval")  // a config outside the domain: refused before a GPU is looked for
      return {"eval", "--space", x.rec->space, "--problem", x.rec->problem, "--config", "block_m=96", "--db", x.db, flag};
    if (o.cmd == "replay")
      return {"replay", "--db", x.db, "--campaign", "k", "--strategy", "random", "--seeds", "1", "--partial", flag};
    return {"serve", "--simulate", "--simulate-delay-ms", "0", "--gpus", "0", "--db", x.db, flag};
  };
  return c;
}

// One expression from the grammar (and what it is), all of it from `seed`.
std::string make_expression(std::uint64_t seed, std::string& what) {
  Rng r(seed);
  ExprGen g(r);
  std::string e;
  const std::size_t form = std::vector<std::size_t>{0, 0, 0, 1, 1, 1, 2, 2, 2, 3}[pick(r, 10)];
  if (form == 0) {
    const int depth = static_cast<int>(pick(r, std::vector<std::size_t>{2, 8, 40, 120, 300, 600, 2000}));
    e = g.boolean(depth), what = fmt::format("a random tree, spine {} deep", depth);
  } else if (form == 1) {
    const std::size_t n = pick(r, std::vector<std::size_t>{100, 255, 256, 257, 511, 512, 513, 1000, 5000, 100000,
                                                           1000000});
    e = g.shape(n), what = fmt::format("a hostile shape, n={}", n);
  } else if (form == 2) {
    e = g.mutate(g.boolean(static_cast<int>(pick(r, 30)))), what = "a random tree, mutated";
  } else {
    e = g.integer(static_cast<int>(pick(r, 6))), what = "an int where a bool is needed";
  }
  what += fmt::format(" ({} bytes)", e.size());
  return e;
}

// The plan file the plan cases mutate: a real plan, with the space's keys that yaml_mutation edits.
std::string plan_base(const std::string& plan_text) {
  return replace_once(plan_text + "description: x\nfamily: flash_fwd_mma\narchs: [sm_90]\n", "problems:",
                      "params:\n  block_m: [64, 128]\n  block_n: [1]\nproblems:");
}

// `count` cases; the descriptions come from running each mutation once here (on the same text, with
// the same seed, as the case will).
std::vector<Case> generate(Rng& r, std::size_t count, const std::string& space_text, const std::string& plan_text) {
  std::vector<Case> cases;
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t k = pick(r, 100);
    Case c;
    if (k < 36) {  // expressions: made again from the seed when the case runs (some are megabytes)
      const std::uint64_t seed = r();
      const bool stored = coin(r, 0.25), derived = coin(r, 0.2);
      std::string what;
      make_expression(seed, what);
      c = {"expressions", what, [seed, stored, derived](const Ctx& x) {
             std::string ignored;
             const std::string e = make_expression(seed, ignored);
             Rng cr(seed + 1);
             const std::string text =
                 derived ? replace_once(x.space_text, "\nconstraints:\n",
                                        "\n  hostile: " + yaml_quoted(e) + "\nconstraints:\n")  // the last derived
                         : replace_once(x.space_text, "constraints:\n", "constraints:\n  - " + yaml_quoted(e) + "\n");
             if (stored) {
               x.store_space(text);
               return stored_space_cmd(x, cr);
             }
             return space_cmd(x, x.write("space.yaml", text), cr);
           }, {}};
    } else if (k < 66) {  // search-space YAML, in a file or stored
      const std::uint64_t seed = r();
      const bool stored = coin(r, 0.3);
      std::string what;
      {
        Rng probe(seed);
        yaml_mutation(space_text, probe, what);
      }
      c = {"search-space YAML", what + (stored ? " (stored)" : ""), [seed, stored](const Ctx& x) {
             Rng cr(seed);
             std::string ignored;
             const std::string text = yaml_mutation(x.space_text, cr, ignored);
             if (stored) {
               x.store_space(text);
               return stored_space_cmd(x, cr);
             }
             return space_cmd(x, x.write("space.yaml", text), cr);
           }, {}};
    } else if (k < 74) {  // plan files and model configs
      const std::uint64_t seed = r();
      const bool plan = coin(r);
      std::string what;
      if (plan) {
        Rng probe(seed);
        yaml_mutation(plan_base(plan_text), probe, what);
        what = "plan: " + what;
      } else {
        what = "config.json: " + std::vector<std::string>{"nested 100 deep", "nested 100000 deep", "a non-UTF-8 name",
                                                          "a name with a newline", "NaN", "5 MiB", "a name 1 MiB long",
                                                          "a second value"}[seed % 8];
      }
      c = {"plans and model configs", what, [seed, plan](const Ctx& x) -> std::vector<std::string> {
             Rng cr(seed);
             if (plan) {
               std::string ignored;
               const std::string text = yaml_mutation(plan_base(x.plan_text), cr, ignored);
               return {"submit", x.write("plan.yaml", text), "--db", x.db};
             }
             std::string j = x.model_json;
             switch (seed % 8) {
               case 0: j = replace_once(j, "{", "{\"deep\": " + repeat("[", 100) + repeat("]", 100) + ", "); break;
               case 1: j = replace_once(j, "{", "{\"deep\": " + repeat("[", 100000) + repeat("]", 100000) + ", "); break;
               case 2: j = replace_once(j, "meta-llama/Meta-Llama-3-8B", "org/\xff\xfe"); break;
               case 3: j = replace_once(j, "meta-llama/Meta-Llama-3-8B", "org/a\\nb"); break;
               case 4: j = replace_once(j, "{", "{\"x\": NaN, "); break;
               case 5: j += std::string(5 << 20, ' '); break;
               case 6: j = replace_once(j, "meta-llama/Meta-Llama-3-8B", "org/" + repeat("m", 1 << 20)); break;
               default: j += "\n{}\n"; break;
             }
             return {"plan", "--model", x.write("config.json", j)};
           }, {}};
    } else if (k < 86) {  // problem specs
      std::string what;
      const std::string spec = problem_mutation(r, what);
      const std::size_t cmd = pick(r, 4);
      c = {"problem specs", what, [spec, cmd](const Ctx& x) -> std::vector<std::string> {
             switch (cmd) {
               case 0: return {"space", "--space", x.rec->space, "--problem", spec, "--count"};
               case 1: return {"best", "--db", x.db, "--problem", spec};
               case 2: return {"submit", "--problem", spec, "--space", x.rec->space, "--db", x.db};
               default:
                 return {"tune", "--space", x.rec->space, "--problem", spec, "--db", x.db, "--campaign", "hostile",
                         "--simulate-db", x.rec->db, "--simulate-campaign", x.rec->campaign, "--budget-evals", "3"};
             }
           }, {}};
    } else {
      c = numeric_case(r);
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

// Inputs that are not files: each through every reader of input files.
std::vector<Case> fixed_cases() {
  std::vector<Case> out;
  const std::vector<std::pair<std::string, std::string>> kinds = {
      {"a FIFO nobody writes", "fifo"}, {"/dev/zero", "/dev/zero"}, {"/dev/urandom", "/dev/urandom"},
      {"/dev/null", "/dev/null"},       {"a directory", "dir"},    {"a path with \\xff", "bad-utf8"},
      {"a path with a newline", "newline"}};
  for (const auto& [name, kind] : kinds) {
    auto path = [kind](const Ctx& x) {
      if (kind == "fifo") {
        const std::string p = x.file("fifo.yaml");
        if (::mkfifo(p.c_str(), 0600) != 0) throw std::runtime_error("mkfifo");
        return p;
      }
      if (kind == "dir") return x.dir.string();
      if (kind == "bad-utf8") return x.write("space-\xff.yaml", x.space_text);
      if (kind == "newline") return x.write("space\n.yaml", x.space_text);
      return kind;
    };
    out.push_back({"non-files", "tune --space " + name, [path](const Ctx& x) -> std::vector<std::string> {
                     return {"tune", "--space", path(x), "--problem", x.rec->problem, "--db", x.db, "--campaign",
                             "hostile", "--simulate-db", x.rec->db, "--simulate-campaign", x.rec->campaign,
                             "--budget-evals", "3"};
                   }, {}});
    out.push_back({"non-files", "submit --space " + name, [path](const Ctx& x) -> std::vector<std::string> {
                     return {"submit", "--problem", x.rec->problem, "--space", path(x), "--db", x.db};
                   }, {}});
    out.push_back({"non-files", "submit PLAN=" + name, [path](const Ctx& x) -> std::vector<std::string> {
                     return {"submit", path(x), "--db", x.db};
                   }, {}});
    out.push_back({"non-files", "plan --model " + name, [path](const Ctx& x) -> std::vector<std::string> {
                     return {"plan", "--model", path(x)};
                   }, {}});
    out.push_back({"non-files", "export --space " + name, [path](const Ctx& x) -> std::vector<std::string> {
                     x.store_space("");  // as a campaign from before schema 3: export needs --space
                     return {"export", "--db", x.db, "--campaign", "k", "--space", path(x), "-o", x.file("k.cu")};
                   }, {}});
  }
  // Campaign names: invalid UTF-8, control characters, C1 controls; and a valid non-ASCII one.
  for (const std::string& name : std::vector<std::string>{"\xff\xfe", "caf\xc3", "a\x85" "b", "\xc2\x85", "a\x7f",
                                                          "\xed\xa0\x80", "\xf4\x90\x80\x80", "caf\xc3\xa9"}) {
    out.push_back({"campaign names", "tune --campaign " + printable_line(name), [name](const Ctx& x) {
                     return std::vector<std::string>{
                         "tune", "--space", x.rec->space, "--problem", x.rec->problem, "--db", x.db, "--campaign",
                         name, "--simulate-db", x.rec->db, "--simulate-campaign", x.rec->campaign, "--budget-evals",
                         "3"};
                   }, {}});
  }
  return out;
}

struct Outcome {
  int rc = 0;
  bool timed_out = false, one_line = true, changed = false, json_ok = true;
  std::string line;
  double ms = 0;
};

std::size_t env_size(const char* name, std::size_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? static_cast<std::size_t>(std::stoull(v)) : fallback;
}

TEST(ReliabilityHostileInputs, GeneratedInputsNeverCrashHangChangeTheDatabaseOrFailSilently) {
  const std::size_t count = env_size("ATTNTUNE_HOSTILE_CASES", 600);
  const std::uint64_t seed = env_size("ATTNTUNE_HOSTILE_SEED", 28);
  const bool verbose = env_size("ATTNTUNE_HOSTILE_VERBOSE", 0) != 0;  // one line per case
  const double limit_s = 20;
  TempDir dir;
  const Recording rec(dir);
  const std::string pristine = dir.file("pristine.db");
  {
    const Ran made = run(rec.tune(pristine, "k", 0, {"--budget-evals", "30"}), dir.path());
    ASSERT_EQ(made.rc, 0) << made.err;
  }
  ASSERT_FALSE(fs::exists(pristine + "-wal"));
  const std::string pristine_bytes = read_bytes(pristine);
  const std::string space_text = read_bytes(rec.space);
  ASSERT_NE(space_text.find("\nconstraints:\n"), std::string::npos);
  ASSERT_NE(space_text.find("\nderived:\n"), std::string::npos);
  const std::string model_json = read_bytes(source_dir() + "/tests/data/models/llama3_8b.json");
  const std::string plan_text = "model: llama3_8b\nsource: llama3_8b.json\nproblems:\n  - {problem: '" + rec.problem +
                                "', regime: prefill}\n";

  Rng rng(seed);
  std::vector<Case> cases = generate(rng, count, space_text, plan_text);
  for (Case& c : fixed_cases()) cases.push_back(std::move(c));

  // Two at a time (the machine's two cores); each case in its own directory.
  std::vector<Outcome> out(cases.size());
  std::atomic<std::size_t> next{0};
  const auto started = Clock::now();
  auto worker = [&] {
    for (std::size_t i; (i = next++) < cases.size();) {
      const fs::path case_dir = dir.path() / fmt::format("c{:04}", i);
      Ctx x{case_dir, case_dir / "db", (case_dir / "db" / "attntune.db").string(), &rec, space_text, plan_text,
            model_json};
      fs::create_directories(x.db_dir);
      write_bytes(x.db, pristine_bytes);
      Outcome& o = out[i];
      std::vector<std::string> args;
      try {
        args = cases[i].args(x);
      } catch (const std::exception& e) {
        o.rc = -1, o.line = std::string("the generator failed: ") + e.what();
        continue;
      }
      const auto before = tree(x.db_dir);
      ProcOptions po;
      po.time_limit_s = limit_s;
      const Ran r = run(args, case_dir, po);
      o.rc = r.rc, o.timed_out = r.timed_out, o.ms = r.ms;
      o.changed = tree(x.db_dir) != before;
      const std::string& e = r.err;
      o.line = e.substr(0, e.find('\n'));
      if (r.rc != 0) o.one_line = count_lines(e) == 1 && e.rfind("attntune: error: ", 0) == 0;
      // Whatever was stored stays readable as JSON (invalid UTF-8 would break every JSON output).
      if (r.rc == 0 && o.changed) {
        const Ran j = run({"campaigns", "--db", x.db, "--format", "json"}, case_dir, po);
        o.json_ok = j.rc == 0;
        if (!o.json_ok) o.line = "campaigns --format json failed after it: " + j.err.substr(0, j.err.find('\n'));
      }
      fs::remove_all(case_dir);
    }
  };
  std::thread t1(worker), t2(worker);
  t1.join(), t2.join();
  const double wall = std::chrono::duration<double>(Clock::now() - started).count();

  struct Figures {
    std::size_t run = 0, ok = 0, refused = 0, failed = 0, env = 0, crashes = 0, hangs = 0, other_rc = 0,
                not_one_line = 0, db_changed_on_refusal = 0, nonfinite_accepted = 0, json_broken = 0;
  };
  std::map<std::string, Figures> per;
  Figures all;
  double slowest = 0;
  std::string slowest_what;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const Outcome& o = out[i];
    SCOPED_TRACE(fmt::format("case {} [{}] {}", i, c.cls, printable_line(c.what)));
    for (Figures* f : {&per[c.cls], &all}) {
      ++f->run;
      if (o.timed_out) ++f->hangs;
      else if (o.rc > 128) ++f->crashes;
      else if (o.rc == 0) ++f->ok;
      else if (o.rc == 1) ++f->failed;
      else if (o.rc == 2) ++f->refused;
      else if (o.rc == 3) ++f->env;
      else ++f->other_rc;
      if (!o.one_line) ++f->not_one_line;
      if (o.rc != 0 && o.changed) ++f->db_changed_on_refusal;
      if (o.rc == 0 && !c.nonfinite_accepted_is_bug.empty()) ++f->nonfinite_accepted;
      if (!o.json_ok) ++f->json_broken;
    }
    if (o.ms > slowest) slowest = o.ms, slowest_what = c.what;
    if (verbose)
      std::printf("%4zu %-24s rc=%d %6.0f ms  %-60s %s\n", i, c.cls.c_str(), o.rc, o.ms,
                  printable_line(c.what).substr(0, 60).c_str(), printable_line(o.line).substr(0, 160).c_str());
    EXPECT_FALSE(o.timed_out) << "hung (killed after " << limit_s << " s)";
    EXPECT_TRUE(o.rc >= 0 && o.rc <= 3) << "exit " << o.rc << (o.rc > 128 ? " (a signal)" : "") << ": " << o.line;
    EXPECT_TRUE(o.one_line) << "stderr is not one 'attntune: error:' line: " << o.line;
    EXPECT_FALSE(o.rc != 0 && o.changed) << "refused, yet the database's directory changed: " << o.line;
    EXPECT_TRUE(c.nonfinite_accepted_is_bug.empty() || o.rc != 0) << "a non-finite value was accepted";
    EXPECT_TRUE(o.json_ok) << o.line;
  }
  std::printf("%-24s %5s %4s %4s %4s %4s %7s %5s %8s %10s %9s %9s\n", "class", "run", "ok", "1", "2", "3", "crashes",
              "hangs", "other rc", "not 1 line", "db change", "nan took");
  auto row = [](const std::string& name, const Figures& f) {
    std::printf("%-24s %5zu %4zu %4zu %4zu %4zu %7zu %5zu %8zu %10zu %9zu %9zu\n", name.c_str(), f.run, f.ok, f.failed,
                f.refused, f.env, f.crashes, f.hangs, f.other_rc, f.not_one_line, f.db_changed_on_refusal,
                f.nonfinite_accepted);
  };
  for (const auto& [name, f] : per) row(name, f);
  row("all", all);
  std::printf("seed %llu: %zu cases generated (%zu random + %zu fixed), %zu run in %.1f s wall (2 at a time); slowest "
              "%.0f ms (%s); crashes %zu, hangs %zu, database changes on refusal %zu, broken JSON after %zu\n",
              static_cast<unsigned long long>(seed), cases.size(), count, cases.size() - count, all.run, wall, slowest,
              printable_line(slowest_what).substr(0, 60).c_str(), all.crashes, all.hangs, all.db_changed_on_refusal,
              all.json_broken);
  // Each class saw every kind of ending it should: some refused (2), and the classes whose inputs
  // can be good also ran (0), so the checks above covered both sides.
  EXPECT_GT(all.refused, all.run / 3);
  EXPECT_GT(all.ok, 0u);
}

}  // namespace
}  // namespace test_hostile_inputs
}  // namespace attntune::reliability
