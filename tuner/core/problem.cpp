#include "core/problem.hpp"
#include "core/text.hpp"

#include <algorithm>
#include <charconv>
#include <climits>
#include <limits>
#include <numeric>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"

namespace attntune {

namespace {

constexpr std::int64_t kMaxLen = std::int64_t{1} << 24;  // 16M tokens
constexpr std::int64_t kMaxDim = 1024;
constexpr std::int64_t kMaxPage = std::int64_t{1} << 20;
constexpr std::int64_t kMaxSeed = std::numeric_limits<std::int64_t>::max();

// Visible (query, key) pairs of one sequence of lq queries and lk keys; causal is bottom-right
// aligned: query i sees keys j <= i + lk - lq, clamped to [0, lk].
double visible_pairs(std::int64_t lq, std::int64_t lk, bool causal) {
  if (!causal) return double(lq) * double(lk);
  // Rows i >= i0 = max(0, lq - lk) see i + lk - lq + 1 keys (at most lk, reached at i = lq - 1);
  // earlier rows see none. The sum of the arithmetic series, exact in doubles below 2^53.
  const std::int64_t i0 = std::max<std::int64_t>(0, lq - lk);
  const std::int64_t rows = lq - i0;
  if (rows <= 0) return 0;
  const double first = double(i0 + lk - lq + 1), last = double(lk);
  return double(rows) * (first + last) / 2;
}

std::int64_t parse_int(const std::string& key, const std::string& text, std::int64_t lo,
                       std::int64_t hi) {
  std::int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size() || text.empty())
    throw InputError(fmt::format("problem: '{}={}': expected an integer", key, text));
  if (v < lo || v > hi)
    throw InputError(fmt::format("problem: '{}={}' is out of range [{}, {}]", key, text, lo, hi));
  return v;
}

}  // namespace

const char* dtype_name(DType t) { return t == DType::kFp16 ? "fp16" : "bf16"; }

Problem Problem::parse(const std::string& spec) {
  static const std::vector<std::string> kKeys = {"b",     "h",      "hkv",  "s",      "sk",       "d",
                                                 "dtype", "causal", "page", "varlen", "lens_seed"};
  static const std::vector<std::string> kRequired = {"b", "h", "s", "d", "dtype", "causal"};
  if (spec.empty())
    throw InputError("problem: empty spec (expected e.g. b=4,h=16,s=4096,d=128,dtype=bf16,causal=0)");
  check_stored_text(spec, "problem:");  // messages quote it, and one line of UTF-8 is all a spec can be
  Problem p;
  std::set<std::string> seen;
  std::size_t pos = 0;
  while (pos <= spec.size()) {
    std::size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    std::string item = spec.substr(pos, end - pos);
    pos = end + 1;
    std::size_t eq = item.find('=');
    if (item.empty() || eq == std::string::npos || eq == 0)
      throw InputError(fmt::format("problem: '{}' is not key=value", item));
    std::string key = item.substr(0, eq), val = item.substr(eq + 1);
    if (std::find(kKeys.begin(), kKeys.end(), key) == kKeys.end())
      throw InputError(fmt::format(
          "problem: unknown key '{}' (known: b, h, hkv, s, sk, d, dtype, causal, page, varlen, lens_seed)", key));
    if (!seen.insert(key).second) throw InputError(fmt::format("problem: key '{}' given twice", key));
    if (key == "b") p.b = parse_int(key, val, 1, 1 << 20);
    else if (key == "h") p.h = parse_int(key, val, 1, 1 << 16);
    else if (key == "hkv") p.hkv = parse_int(key, val, 1, 1 << 16);
    else if (key == "s") p.s = parse_int(key, val, 1, kMaxLen);
    else if (key == "sk") p.sk = parse_int(key, val, 1, kMaxLen);
    else if (key == "d") p.d = parse_int(key, val, 1, kMaxDim);
    else if (key == "page") p.page = parse_int(key, val, 0, kMaxPage);
    else if (key == "varlen") p.varlen = parse_int(key, val, 0, kMaxLen);
    else if (key == "lens_seed") p.lens_seed = parse_int(key, val, 0, kMaxSeed);
    else if (key == "dtype") {
      if (val == "fp16") p.dtype = DType::kFp16;
      else if (val == "bf16") p.dtype = DType::kBf16;
      else throw InputError(fmt::format("problem: 'dtype={}': expected fp16 or bf16", val));
    } else if (key == "causal") {
      if (val == "1" || val == "true") p.causal = true;
      else if (val == "0" || val == "false") p.causal = false;
      else throw InputError(fmt::format("problem: 'causal={}': expected 0 or 1", val));
    }
    if (end == spec.size()) break;
  }
  for (const auto& k : kRequired)
    if (!seen.count(k)) throw InputError(fmt::format("problem: missing key '{}' in '{}'", k, spec));
  if (!seen.count("hkv")) p.hkv = p.h;
  if (!seen.count("sk")) p.sk = p.s;
  if (p.h % p.hkv != 0)
    throw InputError(fmt::format("problem: h={} is not a multiple of hkv={}", p.h, p.hkv));
  if (seen.count("lens_seed") && !p.is_varlen())
    throw InputError(fmt::format("problem: lens_seed={} needs varlen=N (N > 0): it seeds a packed batch's lengths",
                                 p.lens_seed));
  if (p.is_varlen()) {
    if (p.varlen > p.s)
      throw InputError(fmt::format("problem: varlen={} is longer than s={}: lengths are drawn from varlen..s",
                                   p.varlen, p.s));
    if (p.paged())
      throw InputError(fmt::format("problem: varlen={} with page={}: a packed batch and a paged KV cache are "
                                   "different entry points (attntune_attention_forward_varlen, _kvcache)",
                                   p.varlen, p.page));
    if (p.sk < p.s)
      throw InputError(fmt::format("problem: varlen with sk={} < s={}: each sequence has its query length + sk - s "
                                   "keys, so varlen needs sk >= s",
                                   p.sk, p.s));
    if (p.b * p.sk > INT_MAX)
      throw InputError(fmt::format("problem: varlen with b*sk = {} rows: a packed batch holds at most {} rows "
                                   "(cu_seqlens are int)",
                                   p.b * p.sk, INT_MAX));
  }
  return p;
}

std::vector<int> Problem::q_lens() const {
  std::vector<int> lens;
  if (!is_varlen()) return lens;
  lens.reserve(static_cast<std::size_t>(b));
  const std::uint64_t span = static_cast<std::uint64_t>(s - varlen + 1);
  std::uint64_t state = static_cast<std::uint64_t>(lens_seed);
  for (std::int64_t i = 0; i < b; ++i) {
    state += 0x9e3779b97f4a7c15ull;  // splitmix64
    std::uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    lens.push_back(static_cast<int>(varlen + static_cast<std::int64_t>(z % span)));
  }
  return lens;
}

std::vector<int> Problem::k_lens() const {
  std::vector<int> lens = q_lens();
  for (int& l : lens) l += static_cast<int>(sk - s);
  return lens;
}

std::int64_t Problem::total_q() const {
  if (!is_varlen()) return b * s;
  const std::vector<int> lens = q_lens();
  return std::accumulate(lens.begin(), lens.end(), std::int64_t{0});
}

std::int64_t Problem::total_k() const {
  if (!is_varlen()) return b * sk;
  return total_q() + b * (sk - s);
}

std::string Problem::str() const {
  std::string out = fmt::format("b={},h={},hkv={},s={},sk={},d={},dtype={},causal={}", b, h, hkv, s, sk, d,
                                dtype_name(dtype), causal ? 1 : 0);
  if (paged()) out += fmt::format(",page={}", page);  // dense problems read as they always did
  if (is_varlen()) {
    out += fmt::format(",varlen={}", varlen);
    if (lens_seed != 0) out += fmt::format(",lens_seed={}", lens_seed);
  }
  return out;
}

nlohmann::json Problem::json() const {
  nlohmann::json j = {{"b", b}, {"h", h}, {"hkv", hkv}, {"s", s}, {"sk", sk}, {"d", d},
                      {"dtype", dtype_name(dtype)}, {"causal", causal}};
  if (paged()) j["page"] = page;
  if (is_varlen()) {  // only here: every other problem's JSON is what it always was
    j["varlen"] = varlen;
    j["lens_seed"] = lens_seed;
  }
  return j;
}

Problem Problem::from_json(const nlohmann::json& j) {
  try {
    Problem p;
    p.b = j.at("b"); p.h = j.at("h"); p.hkv = j.at("hkv"); p.s = j.at("s"); p.sk = j.at("sk");
    p.d = j.at("d");
    const std::string dt = j.at("dtype");
    if (dt != "fp16" && dt != "bf16") throw InputError("problem JSON: bad dtype '" + dt + "'");
    p.dtype = dt == "fp16" ? DType::kFp16 : DType::kBf16;
    p.causal = j.at("causal").is_boolean() ? j.at("causal").get<bool>() : j.at("causal").get<int>() != 0;
    p.page = j.value("page", std::int64_t{0});
    if (p.page < 0) throw InputError("problem JSON: negative page");
    p.varlen = j.value("varlen", std::int64_t{0});
    p.lens_seed = j.value("lens_seed", std::int64_t{0});
    if (p.varlen < 0 || p.lens_seed < 0) throw InputError("problem JSON: negative varlen or lens_seed");
    if (p.varlen > p.s) throw InputError("problem JSON: varlen longer than s");
    if (p.varlen > 0 && p.sk < p.s) throw InputError("problem JSON: varlen with sk < s");
    if (p.varlen > 0 && p.page > 0) throw InputError("problem JSON: varlen with page");
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw InputError(std::string("problem JSON: ") + e.what());
  }
}

double Problem::flops() const {
  if (is_varlen()) {
    // The sum over the batch's sequences, each bottom-right aligned on its own.
    double pairs = 0;
    for (int lq : q_lens()) pairs += visible_pairs(lq, lq + sk - s, causal);
    return 4.0 * double(h) * double(d) * pairs;
  }
  double pairs = 0;
  if (!causal) {
    pairs = double(s) * double(sk);
  } else {
    // Query i sees keys j <= i + sk - s (bottom-right aligned), clamped to [0, sk].
    for (std::int64_t i = 0; i < s; ++i) pairs += double(std::clamp<std::int64_t>(i + sk - s + 1, 0, sk));
  }
  return 4.0 * double(b) * double(h) * double(d) * pairs;
}

double Problem::bytes() const {
  // The packed tensors of a varlen batch: its rows, not b times the longest.
  if (is_varlen())
    return 2.0 * double(d) * (2.0 * double(hkv) * double(total_k()) + 2.0 * double(h) * double(total_q()));
  return 2.0 * double(d) * (2.0 * double(b) * double(hkv) * double(sk) + 2.0 * double(b) * double(h) * double(s));
}

}  // namespace attntune
