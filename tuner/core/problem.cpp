#include "core/problem.hpp"
#include "core/text.hpp"

#include <algorithm>
#include <charconv>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"

namespace attntune {

namespace {

constexpr std::int64_t kMaxLen = std::int64_t{1} << 24;  // 16M tokens
constexpr std::int64_t kMaxDim = 1024;
constexpr std::int64_t kMaxPage = std::int64_t{1} << 20;

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
  static const std::vector<std::string> kKeys = {"b", "h", "hkv", "s", "sk", "d", "dtype", "causal", "page"};
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
      throw InputError(fmt::format("problem: unknown key '{}' (known: b, h, hkv, s, sk, d, dtype, causal, page)", key));
    if (!seen.insert(key).second) throw InputError(fmt::format("problem: key '{}' given twice", key));
    if (key == "b") p.b = parse_int(key, val, 1, 1 << 20);
    else if (key == "h") p.h = parse_int(key, val, 1, 1 << 16);
    else if (key == "hkv") p.hkv = parse_int(key, val, 1, 1 << 16);
    else if (key == "s") p.s = parse_int(key, val, 1, kMaxLen);
    else if (key == "sk") p.sk = parse_int(key, val, 1, kMaxLen);
    else if (key == "d") p.d = parse_int(key, val, 1, kMaxDim);
    else if (key == "page") p.page = parse_int(key, val, 0, kMaxPage);
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
  return p;
}

std::string Problem::str() const {
  std::string out = fmt::format("b={},h={},hkv={},s={},sk={},d={},dtype={},causal={}", b, h, hkv, s, sk, d,
                                dtype_name(dtype), causal ? 1 : 0);
  if (paged()) out += fmt::format(",page={}", page);  // dense problems read as they always did
  return out;
}

nlohmann::json Problem::json() const {
  nlohmann::json j = {{"b", b}, {"h", h}, {"hkv", hkv}, {"s", s}, {"sk", sk}, {"d", d},
                      {"dtype", dtype_name(dtype)}, {"causal", causal}};
  if (paged()) j["page"] = page;
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
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw InputError(std::string("problem JSON: ") + e.what());
  }
}

double Problem::flops() const {
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
  return 2.0 * double(d) * (2.0 * double(b) * double(hkv) * double(sk) + 2.0 * double(b) * double(h) * double(s));
}

}  // namespace attntune
