#include "core/problem.hpp"
#include "core/text.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
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
constexpr double kMaxSoftcap = 1e6;

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

// The canonical window of a problem (problem.hpp): a causal problem keeps R = -1 (causal bounds
// it), a non-causal one with R = 0 becomes causal, and causal with R > 0 is refused.
template <class P>
void normalise_window(P& p) {
  if (p.causal && p.window_right > 0)
    throw InputError(fmt::format("problem: causal=1 with window={},{}: causal is a window whose right side is 0, so "
                                 "it sees no key right of the diagonal; give causal=0 with window={},{}, or R = 0",
                                 p.window_left, p.window_right, p.window_left, p.window_right));
  if (!p.causal && p.window_right == 0) {
    p.causal = true;  // FlashAttention: a window (L, 0) is causal attention within L keys
    p.window_right = -1;
  }
  if (p.causal) p.window_right = -1;
}

// Keys row x' (bottom-right aligned: x' = i + lk - lq) sees under a window (left, right; -1
// unbounded) among lk keys: [max(0, x' - left), min(lk - 1, x' + right)], or none.
std::int64_t keys_seen(std::int64_t x, std::int64_t lk, std::int64_t left, std::int64_t right) {
  const std::int64_t lo = left < 0 ? 0 : std::max<std::int64_t>(0, x - left);
  const std::int64_t hi = right < 0 ? lk - 1 : std::min<std::int64_t>(lk - 1, x + right);
  return std::max<std::int64_t>(0, hi - lo + 1);
}

// Visible (query, key) pairs of one sequence of lq queries and lk keys under a window (left,
// right; -1 unbounded; causal is right = 0), summed exactly in closed form: keys_seen is linear in
// x' between the points where a clamp starts or stops binding or the count reaches 0, so each
// stretch between those points is an arithmetic series (x' runs over [lk - lq, lk - 1]).
double window_pairs(std::int64_t lq, std::int64_t lk, std::int64_t left, std::int64_t right) {
  if (lq <= 0 || lk <= 0) return 0;
  const std::int64_t x0 = lk - lq, x1 = lk;  // [x0, x1)
  std::vector<std::int64_t> cut = {x0, x1};
  for (std::int64_t b : {left, lk - 1 - right, -right - 1, lk + left})
    for (std::int64_t c : {b, b + 1})
      if (c > x0 && c < x1) cut.push_back(c);
  std::sort(cut.begin(), cut.end());
  cut.erase(std::unique(cut.begin(), cut.end()), cut.end());
  double pairs = 0;
  for (std::size_t k = 0; k + 1 < cut.size(); ++k) {
    const std::int64_t a = cut[k], b = cut[k + 1] - 1;
    pairs += double(b - a + 1) * double(keys_seen(a, lk, left, right) + keys_seen(b, lk, left, right)) / 2;
  }
  return pairs;
}

// The keys some query of the sequence sees (their K/V rows are all a kernel must read).
std::int64_t keys_read(std::int64_t lq, std::int64_t lk, std::int64_t left, std::int64_t right) {
  if (lq <= 0 || lk <= 0) return 0;
  const std::int64_t lo = left < 0 ? 0 : std::max<std::int64_t>(0, lk - lq - left);
  const std::int64_t hi = right < 0 ? lk - 1 : std::min<std::int64_t>(lk - 1, lk - 1 + right);
  return std::max<std::int64_t>(0, hi - lo + 1);
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

// A latent problem (problem.hpp): V is the first dv columns of K, so it needs dv < d, and a packed
// batch is not a latent cache's entry point (MLA decode reads a paged or dense cache). `where` starts
// the message ("problem" or "problem JSON").
void check_latent(const Problem& p, const char* where) {
  if (!p.latent) return;
  if (!p.split_dims())
    throw InputError(fmt::format("{}: latent=1 needs a value head dim below d (dv=N, N < d={}): V is the first dv "
                                 "columns of K (DeepSeek's MLA decode: d=576,dv=512)",
                                 where, p.d));
  if (p.dv > p.d)
    throw InputError(fmt::format("{}: latent=1 with dv={} > d={}: V is the first dv columns of K, so dv must be "
                                 "below d",
                                 where, p.dv, p.d));
  if (p.is_varlen())
    throw InputError(fmt::format("{}: latent=1 with varlen={}: a latent cache is read by the dense and paged "
                                 "entry points only (MLA decode), not by a packed batch",
                                 where, p.varlen));
}

// An FP8 KV cache (problem.hpp): its dequantisation scales are per (sequence, KV head) of a cache, read
// by the dense and paged entry points; a packed batch has none yet. `where` as check_latent's.
void check_kv_fp8(const Problem& p, const char* where) {
  if (p.kv_fp8 && p.is_varlen())
    throw InputError(fmt::format("{}: kv_dtype=fp8 with varlen={}: an FP8 KV cache (scales per sequence and KV "
                                 "head) is read by the dense and paged entry points only, not by a packed batch",
                                 where, p.varlen));
}

// An FP8 forward (problem.hpp): the dense entry point's (its extended form takes the descales), so
// refused with a KV cache, a packed batch, a latent cache, an FP8 cache (already FP8) and the
// backward pass. `where` as check_latent's.
void check_qkv_fp8(const Problem& p, const char* where) {
  if (!p.qkv_fp8) return;
  auto refuse = [&](const std::string& what, const char* why) {
    throw InputError(fmt::format("{}: dtype=fp8 with {}: {}", where, what, why));
  };
  if (p.paged())
    refuse(fmt::format("page={}", p.page),
           "the FP8 forward is dense prefill (attntune_attention_forward_ex); for an FP8 KV cache under 16-bit "
           "queries give dtype=bf16,kv_dtype=fp8");
  if (p.is_varlen()) refuse(fmt::format("varlen={}", p.varlen), "the FP8 forward serves dense tensors, not packed batches, for now");
  if (p.latent) refuse("latent=1", "a latent cache is decode's (MLA), over 16-bit queries");
  if (p.kv_fp8) refuse("kv_dtype=fp8", "dtype=fp8 already makes K and V FP8 e4m3 (leave kv_dtype out)");
  if (p.backward) refuse("pass=bwd", "the backward pass is tuned in fp16 and bf16");
}

// The backward pass (problem.hpp): dense tensors and packed varlen batches of one head dim, with
// causal masks, windows, sinks (the kernels' P = exp(S - LSE) with the forward's LSE, which holds the
// sink; the sinks' own gradient is the ops' arithmetic) and soft-caps (dS times the cap's
// derivative), for now; the other entry points come in later steps of issue 45. `where` as
// check_latent's.
void check_backward(const Problem& p, const char* where) {
  if (!p.backward) return;
  auto refuse = [&](const std::string& what) {
    throw InputError(fmt::format("{}: pass=bwd with {}: the backward pass is tuned over dense tensors and packed "
                                 "varlen batches of one head dim (causal or not, windows, sinks and soft-caps too) "
                                 "for now; {} come in a later step",
                                 where, what,
                                 p.paged()        ? "paged KV caches"
                                 : p.latent       ? "latent caches"
                                 : p.kv_fp8       ? "FP8 KV caches"
                                                  : "value head dims other than d"));
  };
  if (p.paged()) refuse(fmt::format("page={}", p.page));
  if (p.latent) refuse("latent=1");
  if (p.kv_fp8) refuse("kv_dtype=fp8");
  if (p.split_dims()) refuse(fmt::format("dv={} (d={})", p.dv, p.d));
}

// `pass=` (problem.hpp): bwd is the backward pass (true), fwd the forward (false); anything else is
// refused with the accepted values. `where` starts the message.
bool read_pass(const std::string& val, const char* where) {
  if (val == "bwd") return true;
  if (val == "fwd") return false;
  if (val == "fwdbwd")
    throw InputError(fmt::format("{}: 'pass=fwdbwd' is the pair a training step runs, two problems (pass=fwd and "
                                 "pass=bwd): tune, submit, best and export take it; this takes one: give pass=fwd or "
                                 "pass=bwd",
                                 where));
  throw InputError(fmt::format("{}: 'pass={}': expected fwd (the forward pass) or bwd (the backward pass: dQ, dK "
                               "and dV)",
                               where, val));
}

// `kv_dtype=` (problem.hpp): fp8 is an FP8 e4m3 cache (true); q's dtype is a cache of q's dtype (false);
// the other 16-bit dtype is refused (a 16-bit cache is q's dtype), anything else with the accepted
// values. `where` starts the message ("problem" or "problem JSON").
bool read_kv_dtype(const std::string& val, DType dtype, const char* where) {
  if (val == "fp8") return true;
  if (val == dtype_name(dtype)) return false;
  if (val == "fp16" || val == "bf16")
    throw InputError(fmt::format("{}: 'kv_dtype={}' with dtype={}: a 16-bit KV cache is q's dtype (kv_dtype={}, or "
                                 "leave kv_dtype out); only kv_dtype=fp8 differs from it",
                                 where, val, dtype_name(dtype), dtype_name(dtype)));
  throw InputError(fmt::format("{}: 'kv_dtype={}': expected fp8 (an FP8 e4m3 cache) or the problem's dtype, {} (a "
                               "cache of q's dtype)",
                               where, val, dtype_name(dtype)));
}

}  // namespace

const char* dtype_name(DType t) { return t == DType::kFp16 ? "fp16" : "bf16"; }

const char* Problem::dtype_spec() const { return qkv_fp8 ? "fp8" : dtype_name(dtype); }

Problem Problem::parse(const std::string& spec) {
  static const std::vector<std::string> kKeys = {"b",    "h",      "hkv",       "s",      "sk",
                                                 "d",    "dtype",  "causal",    "page",   "varlen",
                                                 "lens_seed", "window", "softcap", "sinks", "dv",
                                                 "latent", "kv_dtype", "pass"};
  static const std::vector<std::string> kRequired = {"b", "h", "s", "d", "dtype", "causal"};
  if (spec.empty())
    throw InputError("problem: empty spec (expected e.g. b=4,h=16,s=4096,d=128,dtype=bf16,causal=0)");
  check_stored_text(spec, "problem:");  // messages quote it, and one line of UTF-8 is all a spec can be
  std::vector<std::string> items;
  for (std::size_t pos = 0;;) {
    const std::size_t end = std::min(spec.find(',', pos), spec.size());
    items.push_back(spec.substr(pos, end - pos));
    if (end == spec.size()) break;
    pos = end + 1;
  }
  Problem p;
  std::set<std::string> seen;
  std::string kv_dtype;  // read once dtype is known (the keys come in any order)
  for (std::size_t n = 0; n < items.size(); ++n) {
    const std::string& item = items[n];
    std::size_t eq = item.find('=');
    if (item.empty() || eq == std::string::npos || eq == 0)
      throw InputError(fmt::format("problem: '{}' is not key=value", item));
    std::string key = item.substr(0, eq), val = item.substr(eq + 1);
    if (std::find(kKeys.begin(), kKeys.end(), key) == kKeys.end())
      throw InputError(fmt::format("problem: unknown key '{}' (known: {})", key, fmt::join(kKeys, ", ")));
    if (!seen.insert(key).second) throw InputError(fmt::format("problem: key '{}' given twice", key));
    if (key == "b") p.b = parse_int(key, val, 1, 1 << 20);
    else if (key == "h") p.h = parse_int(key, val, 1, 1 << 16);
    else if (key == "hkv") p.hkv = parse_int(key, val, 1, 1 << 16);
    else if (key == "s") p.s = parse_int(key, val, 1, kMaxLen);
    else if (key == "sk") p.sk = parse_int(key, val, 1, kMaxLen);
    else if (key == "d") p.d = parse_int(key, val, 1, kMaxDim);
    else if (key == "dv") p.dv = parse_int(key, val, 1, kMaxDim);
    else if (key == "page") p.page = parse_int(key, val, 0, kMaxPage);
    else if (key == "varlen") p.varlen = parse_int(key, val, 0, kMaxLen);
    else if (key == "lens_seed") p.lens_seed = parse_int(key, val, 0, kMaxSeed);
    else if (key == "window") {
      // window=L or window=L,R: the item after it is R when it is a bare integer (no '=').
      p.window_left = parse_int("window", val, -1, kMaxLen);
      if (n + 1 < items.size() && items[n + 1].find('=') == std::string::npos) {
        p.window_right = parse_int("window", items[n + 1], -1, kMaxLen);
        ++n;
      }
    } else if (key == "softcap") {
      double c = 0;
      const auto [ptr, ec] = std::from_chars(val.data(), val.data() + val.size(), c);
      if (ec != std::errc() || ptr != val.data() + val.size() || val.empty() || !std::isfinite(c))
        throw InputError(fmt::format("problem: 'softcap={}': expected a number (0: none)", val));
      if (c < 0 || c > kMaxSoftcap)
        throw InputError(fmt::format("problem: 'softcap={}' is out of range [0, {}]", val, kMaxSoftcap));
      p.softcap = c;
    } else if (key == "sinks") {
      if (val == "1" || val == "true") p.sinks = true;
      else if (val == "0" || val == "false") p.sinks = false;
      else throw InputError(fmt::format("problem: 'sinks={}': expected 0 or 1", val));
    } else if (key == "latent") {
      if (val == "1" || val == "true") p.latent = true;
      else if (val == "0" || val == "false") p.latent = false;
      else throw InputError(fmt::format("problem: 'latent={}': expected 0 or 1", val));
    } else if (key == "kv_dtype") {
      kv_dtype = val;
    } else if (key == "pass") {
      p.backward = read_pass(val, "problem");
    } else if (key == "dtype") {
      if (val == "fp16") p.dtype = DType::kFp16;
      else if (val == "bf16") p.dtype = DType::kBf16;
      else if (val == "fp8") p.dtype = DType::kBf16, p.qkv_fp8 = true;  // O's dtype; Q, K, V e4m3
      else throw InputError(fmt::format("problem: 'dtype={}': expected fp16, bf16 or fp8 (e4m3 Q, K, V; bf16 O)", val));
    } else if (key == "causal") {
      if (val == "1" || val == "true") p.causal = true;
      else if (val == "0" || val == "false") p.causal = false;
      else throw InputError(fmt::format("problem: 'causal={}': expected 0 or 1", val));
    }
  }
  for (const auto& k : kRequired)
    if (!seen.count(k)) throw InputError(fmt::format("problem: missing key '{}' in '{}'", k, spec));
  if (seen.count("kv_dtype")) {
    if (p.qkv_fp8)
      throw InputError(fmt::format("problem: kv_dtype={} with dtype=fp8: dtype=fp8 makes Q, K and V FP8 e4m3 "
                                   "already (leave kv_dtype out)",
                                   kv_dtype));
    p.kv_fp8 = read_kv_dtype(kv_dtype, p.dtype, "problem");
  }
  if (!seen.count("hkv")) p.hkv = p.h;
  if (!seen.count("sk")) p.sk = p.s;
  if (p.dv == p.d) p.dv = 0;  // one head dim, one form
  if (p.h % p.hkv != 0)
    throw InputError(fmt::format("problem: h={} is not a multiple of hkv={}", p.h, p.hkv));
  if (seen.count("lens_seed") && !p.is_varlen())
    throw InputError(fmt::format("problem: lens_seed={} needs varlen=N (N > 0): it seeds a packed batch's lengths",
                                 p.lens_seed));
  normalise_window(p);
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
  check_latent(p, "problem");
  check_kv_fp8(p, "problem");
  check_qkv_fp8(p, "problem");
  check_backward(p, "problem");
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

std::vector<Problem> Problem::parse_passes(const std::string& spec) {
  // The spec's keys as parse() reads them; only `pass=fwdbwd` is rewritten (once per pass).
  std::vector<std::string> keys;
  std::size_t start = 0;
  int fwdbwd = -1;
  for (;;) {
    const std::size_t comma = spec.find(',', start);
    std::string item = spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item == "pass=fwdbwd") fwdbwd = static_cast<int>(keys.size());
    keys.push_back(std::move(item));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (fwdbwd < 0) return {parse(spec)};
  std::vector<Problem> out;
  for (const char* pass : {"fwd", "bwd"}) {
    keys[static_cast<std::size_t>(fwdbwd)] = std::string("pass=") + pass;
    std::string one;
    for (std::size_t i = 0; i < keys.size(); ++i) one += (i ? "," : "") + keys[i];
    try {
      out.push_back(parse(one));
    } catch (const InputError& e) {
      throw InputError(fmt::format("pass=fwdbwd: its {} pass: {}", pass == std::string("fwd") ? "forward" : "backward",
                                   e.what()));
    }
  }
  return out;
}

std::string Problem::str() const {
  std::string out = fmt::format("b={},h={},hkv={},s={},sk={},d={}", b, h, hkv, s, sk, d);
  if (split_dims()) out += fmt::format(",dv={}", dv);  // one head dim reads as it always did
  out += fmt::format(",dtype={},causal={}", dtype_spec(), causal ? 1 : 0);
  if (paged()) out += fmt::format(",page={}", page);  // dense problems read as they always did
  if (is_varlen()) {
    out += fmt::format(",varlen={}", varlen);
    if (lens_seed != 0) out += fmt::format(",lens_seed={}", lens_seed);
  }
  // The variants, then latent=1, kv_dtype=fp8, pass=bwd (dtype=fp8 is said above, where the dtype goes).
  Problem tail_of = *this;
  tail_of.qkv_fp8 = false;
  const std::string tail = tail_of.variants_column();
  if (!tail.empty()) out += "," + tail;
  return out;
}

std::string Problem::variants_column() const {
  std::string out = variant_spec();
  auto add = [&](const char* item) { out += (out.empty() ? "" : ",") + std::string(item); };
  if (latent) add("latent=1");
  if (kv_fp8) add("kv_dtype=fp8");
  if (qkv_fp8) add("dtype=fp8");  // the dtype column holds O's, bf16
  if (backward) add("pass=bwd");
  return out;
}

void Problem::set_variants_column(const std::string& text) {
  // Takes `item` off the end of rest when it is the last item (whole); says whether it did.
  auto take_last = [](std::string& rest, const std::string& item) {
    if (rest.size() < item.size() || rest.compare(rest.size() - item.size(), item.size(), item) != 0) return false;
    if (rest.size() != item.size() && rest[rest.size() - item.size() - 1] != ',') return false;
    rest.resize(rest.size() == item.size() ? 0 : rest.size() - item.size() - 1);
    return true;
  };
  std::string rest = text;
  backward = take_last(rest, "pass=bwd");  // the very end, then dtype, kv_dtype and latent before it
  qkv_fp8 = take_last(rest, "dtype=fp8");
  kv_fp8 = take_last(rest, "kv_dtype=fp8");
  latent = take_last(rest, "latent=1");
  set_variants(rest);
}

std::string Problem::variant_spec() const {
  std::string out;
  if (windowed()) {
    out += fmt::format(",window={}", window_left);
    if (window_right >= 0) out += fmt::format(",{}", window_right);
  }
  if (softcapped()) out += fmt::format(",softcap={}", softcap);
  if (sinks) out += ",sinks=1";
  return out.empty() ? out : out.substr(1);
}

void Problem::set_variants(const std::string& spec) {
  window_left = window_right = -1;
  softcap = 0;
  sinks = false;
  if (spec.empty()) return;
  // Variants only: a problem key that is not one (latent, kv_dtype, pass out of place) is no variants text.
  for (std::size_t pos = 0; pos <= spec.size();) {
    const std::size_t end = std::min(spec.find(',', pos), spec.size());
    const std::string item = spec.substr(pos, end - pos);
    const std::size_t eq = item.find('=');
    if (eq != std::string::npos && item.substr(0, eq) != "window" && item.substr(0, eq) != "softcap" &&
        item.substr(0, eq) != "sinks")
      throw InputError(fmt::format("problem: variants '{}': '{}' is not a variant (window, softcap, sinks)", spec,
                                   item.substr(0, eq)));
    pos = end + 1;
  }
  // The variants alone, parsed as a spec's tail (one parser, one set of checks).
  const Problem v = parse(fmt::format("b=1,h=1,s=1,d=1,dtype=fp16,causal={},{}", causal ? 1 : 0, spec));
  window_left = v.window_left;
  window_right = v.window_right;
  softcap = v.softcap;
  sinks = v.sinks;
  causal = v.causal;
}

std::string Problem::variant_words() const {
  std::string out;
  auto add = [&](const std::string& w) { out += (out.empty() ? "" : " ") + w; };
  if (windowed()) add(fmt::format("window={},{}", window_left, right_bound()));
  if (softcapped()) add(fmt::format("softcap={}", softcap));
  if (sinks) add("sinks");
  return out;
}

nlohmann::json Problem::json() const {
  nlohmann::json j = {{"b", b}, {"h", h}, {"hkv", hkv}, {"s", s}, {"sk", sk}, {"d", d},
                      {"dtype", dtype_spec()}, {"causal", causal}};
  if (split_dims()) j["dv"] = dv;
  if (paged()) j["page"] = page;
  if (is_varlen()) {  // only here: every other problem's JSON is what it always was
    j["varlen"] = varlen;
    j["lens_seed"] = lens_seed;
  }
  if (windowed()) j["window"] = {window_left, window_right};
  if (softcapped()) j["softcap"] = softcap;
  if (sinks) j["sinks"] = true;
  if (latent) j["latent"] = true;
  if (kv_fp8) j["kv_dtype"] = "fp8";
  if (backward) j["pass"] = "bwd";
  return j;
}

nlohmann::ordered_json Problem::ordered_json() const {
  const nlohmann::json j = json();
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const char* key : {"b", "h", "hkv", "s", "sk", "d", "dv", "dtype", "causal", "page", "varlen", "lens_seed",
                          "window", "softcap", "sinks", "latent", "kv_dtype", "pass"})
    if (j.contains(key)) out[key] = j.at(key);
  return out;
}

Problem Problem::from_json(const nlohmann::json& j) {
  try {
    Problem p;
    p.b = j.at("b"); p.h = j.at("h"); p.hkv = j.at("hkv"); p.s = j.at("s"); p.sk = j.at("sk");
    p.d = j.at("d");
    p.dv = j.value("dv", std::int64_t{0});
    if (p.d < 1 || p.d > kMaxDim || p.dv < 0 || p.dv > kMaxDim)
      throw InputError(fmt::format("problem JSON: head dims must be 1..{}", kMaxDim));
    if (p.dv == p.d) p.dv = 0;
    const std::string dt = j.at("dtype");
    if (dt != "fp16" && dt != "bf16" && dt != "fp8") throw InputError("problem JSON: bad dtype '" + dt + "'");
    p.dtype = dt == "fp16" ? DType::kFp16 : DType::kBf16;  // fp8: O is bf16
    p.qkv_fp8 = dt == "fp8";
    p.causal = j.at("causal").is_boolean() ? j.at("causal").get<bool>() : j.at("causal").get<int>() != 0;
    p.page = j.value("page", std::int64_t{0});
    if (p.page < 0) throw InputError("problem JSON: negative page");
    p.varlen = j.value("varlen", std::int64_t{0});
    p.lens_seed = j.value("lens_seed", std::int64_t{0});
    if (p.varlen < 0 || p.lens_seed < 0) throw InputError("problem JSON: negative varlen or lens_seed");
    if (p.varlen > p.s) throw InputError("problem JSON: varlen longer than s");
    if (p.varlen > 0 && p.sk < p.s) throw InputError("problem JSON: varlen with sk < s");
    if (p.varlen > 0 && p.page > 0) throw InputError("problem JSON: varlen with page");
    if (j.contains("window")) {
      const auto& w = j.at("window");
      if (!w.is_array() || w.size() != 2) throw InputError("problem JSON: window must be [left, right]");
      p.window_left = w.at(0).get<std::int64_t>();
      p.window_right = w.at(1).get<std::int64_t>();
      if (p.window_left < -1 || p.window_right < -1 || p.window_left > kMaxLen || p.window_right > kMaxLen)
        throw InputError("problem JSON: window sides must be -1 (unbounded) or 0..2^24");
    }
    p.softcap = j.value("softcap", 0.0);
    if (!std::isfinite(p.softcap) || p.softcap < 0 || p.softcap > kMaxSoftcap)
      throw InputError("problem JSON: softcap must be 0 (none) or a positive finite number");
    p.sinks = j.value("sinks", false);
    p.latent = j.value("latent", false);
    if (j.contains("kv_dtype")) {
      if (!j.at("kv_dtype").is_string()) throw InputError("problem JSON: kv_dtype must be a string (\"fp8\")");
      if (p.qkv_fp8) throw InputError("problem JSON: kv_dtype with dtype fp8 (Q, K and V are FP8 already)");
      p.kv_fp8 = read_kv_dtype(j.at("kv_dtype").get<std::string>(), p.dtype, "problem JSON");
    }
    if (j.contains("pass")) {
      if (!j.at("pass").is_string()) throw InputError("problem JSON: pass must be a string (\"fwd\" or \"bwd\")");
      p.backward = read_pass(j.at("pass").get<std::string>(), "problem JSON");
    }
    normalise_window(p);
    check_latent(p, "problem JSON");
    check_kv_fp8(p, "problem JSON");
    check_qkv_fp8(p, "problem JSON");
    check_backward(p, "problem JSON");
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw InputError(std::string("problem JSON: ") + e.what());
  }
}

double Problem::flops() const {
  // The backward pass: FlashAttention's 2.5x of the forward's (five products of the score matrix's
  // size, QK^T, dO V^T, dS K, dS^T Q and P^T dO, against the forward's two).
  if (backward) {
    Problem fwd = *this;
    fwd.backward = false;
    return 2.5 * fwd.flops();
  }
  if (is_varlen()) {
    // The sum over the batch's sequences, each bottom-right aligned on its own.
    double pairs = 0;
    for (int lq : q_lens())
      pairs += windowed() ? window_pairs(lq, lq + sk - s, window_left, right_bound()) : visible_pairs(lq, lq + sk - s, causal);
    return 2.0 * double(h) * double(d + head_dim_v()) * pairs;
  }
  if (windowed()) return 2.0 * double(b) * double(h) * double(d + head_dim_v()) * window_pairs(s, sk, window_left, right_bound());
  double pairs = 0;
  if (!causal) {
    pairs = double(s) * double(sk);
  } else {
    // Query i sees keys j <= i + sk - s (bottom-right aligned), clamped to [0, sk].
    for (std::int64_t i = 0; i < s; ++i) pairs += double(std::clamp<std::int64_t>(i + sk - s + 1, 0, sk));
  }
  return 2.0 * double(b) * double(h) * double(d + head_dim_v()) * pairs;
}

double Problem::bytes() const {
  // The packed tensors of a varlen batch: its rows, not b times the longest.
  if (is_varlen()) {
    double keys = double(total_k());
    if (windowed()) {
      keys = 0;
      for (int lq : q_lens()) keys += double(keys_read(lq, lq + sk - s, window_left, right_bound()));
    }
    if (backward) {  // as the dense backward's below, over the packed rows
      const double rows_q = double(h) * double(total_q());
      return 2.0 * rows_q * double(d + 2 * head_dim_v() + d) + 4.0 * rows_q +
             2.0 * double(hkv) * (keys + double(total_k())) * double(d + head_dim_v());
    }
    return 2.0 * double(d + head_dim_v()) * (double(hkv) * keys + double(h) * double(total_q()));
  }
  const double keys = windowed() ? double(keys_read(s, sk, window_left, right_bound())) : double(sk);
  if (backward) {  // dense, 16-bit, one head dim (parse refuses the rest): problem.hpp says what moves
    const double rows_q = double(b) * double(h) * double(s);
    return 2.0 * rows_q * double(d + 2 * head_dim_v() + d) + 4.0 * rows_q +  // Q, O, dO, dQ; the LSE
           2.0 * double(b) * double(hkv) * (keys + double(sk)) * double(d + head_dim_v());  // K, V; dK, dV
  }
  if (qkv_fp8)  // Q, K and V one byte an element, O two
    return double(b) * double(hkv) * keys * double(d + head_dim_v()) + double(b) * double(h) * double(s) * double(d) +
           2.0 * double(b) * double(h) * double(s) * double(head_dim_v());
  if (kv_fp8)  // K and V one byte an element (a latent cache once, at d), Q and O two
    return double(b) * double(hkv) * keys * double(latent ? d : d + head_dim_v()) +
           2.0 * double(b) * double(h) * double(s) * double(d + head_dim_v());
  if (latent)  // one cache row of d a key serves both products (V is K's first dv columns)
    return 2.0 * (double(b) * double(hkv) * keys * double(d) + double(b) * double(h) * double(s) * double(d + dv));
  return 2.0 * double(d + head_dim_v()) * (double(b) * double(hkv) * keys + double(b) * double(h) * double(s));
}

}  // namespace attntune
