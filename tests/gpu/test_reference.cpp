// The reference kernels against a CPU float64 attention on small shapes: the reference is what
// every candidate is judged by, so it is itself judged by something simpler. An FP8 e4m3 KV cache
// too: its conversions code by code, its inputs, pages and scales, and the criterion it sets.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "eval/attention_gpu.hpp"
#include "gpu_env.hpp"

namespace test_reference {
using namespace attntune;

namespace {

double to_double(std::uint16_t x, DType t) {
  if (t == DType::kBf16) {
    std::uint32_t bits = static_cast<std::uint32_t>(x) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  const int sign = x >> 15, exp = (x >> 10) & 0x1f, man = x & 0x3ff;
  double v = exp == 0 ? std::ldexp(man, -24) : std::ldexp(1024 + man, exp - 25);
  return sign ? -v : v;
}

std::vector<double> download(const cuda::DeviceBuffer& b, DType t) {
  std::vector<std::uint16_t> raw(b.bytes() / 2);
  b.download(raw.data(), b.bytes());
  std::vector<double> out(raw.size());
  for (std::size_t i = 0; i < raw.size(); ++i) out[i] = to_double(raw[i], t);
  return out;
}

// One query row i of a sequence of lq rows and lk keys in float64, the variants applied as
// docs/CONTRACT.md says (bottom-right window, soft-cap before masking, a sink in the denominator):
// out (dv values: V's head dim) and the LSE. q(c), k(j, c), v(j, c) read the row's query and the sequence's keys.
template <class Q, class K, class V>
double attend_row(const Problem& p, int head, const float* sinks, long long i, long long lq, long long lk, Q q, K k,
                  V v, double* out) {
  const double scale = 1.0 / std::sqrt(double(p.d));
  const long long diag = lk - lq, right = p.right_bound();
  const long long hi = right < 0 ? lk : std::clamp<long long>(i + diag + right + 1, 0, lk);
  const long long lo = p.window_left < 0 ? 0 : std::clamp<long long>(i + diag - p.window_left, 0, lk);
  std::vector<double> s;
  double mx = -INFINITY;
  for (long long j = lo; j < hi; ++j) {
    double acc = 0;
    for (int c = 0; c < p.d; ++c) acc += q(c) * k(j, c);
    acc *= scale;
    if (p.softcapped()) acc = p.softcap * std::tanh(acc / p.softcap);
    s.push_back(acc);
    mx = std::max(mx, acc);
  }
  const double sink = sinks ? double(sinks[head]) : -INFINITY;
  const double m = std::max(mx, sink);
  double sum = std::isinf(sink) ? 0.0 : std::exp(sink - m);
  for (double x : s) sum += std::exp(x - m);
  const int dv = static_cast<int>(p.head_dim_v());
  for (int c = 0; c < dv; ++c) out[c] = 0;
  for (long long j = lo; j < hi; ++j) {
    const double pj = std::exp(s[static_cast<std::size_t>(j - lo)] - m) / sum;
    for (int c = 0; c < dv; ++c) out[c] += pj * v(j, c);
  }
  return sum > 0 ? m + std::log(sum) : -INFINITY;
}

// Plain float64 attention, output (b, h, s, d) contiguous. A latent problem's V is read from K's
// download through V's strides (which params() makes K's): the first dv columns of K's rows.
std::vector<double> cpu_attention(const AttnBuffers& buf, std::vector<double>* lse) {
  const Problem& p = buf.problem;
  const AttnParams a = buf.params();
  auto q = download(buf.q, p.dtype), k = download(buf.k, p.dtype);
  auto v = p.latent ? k : download(buf.v, p.dtype);
  std::vector<double> out(p.b * p.h * p.s * p.head_dim_v(), 0.0);
  lse->assign(p.b * p.h * p.s, 0.0);
  const float* sinks = p.sinks ? buf.sink_values.data() : nullptr;
  for (int b = 0; b < p.b; ++b)
    for (int h = 0; h < p.h; ++h)
      for (int i = 0; i < p.s; ++i) {
        const int hk = h / (p.h / p.hkv);
        const long long row = (static_cast<long long>(b) * p.h + h) * p.s + i;
        (*lse)[row] = attend_row(
            p, h, sinks, i, p.s, p.sk, [&](int c) { return q[b * a.q_stride[0] + h * a.q_stride[1] + i * a.q_stride[2] + c]; },
            [&](long long j, int c) { return k[b * a.k_stride[0] + hk * a.k_stride[1] + j * a.k_stride[2] + c]; },
            [&](long long j, int c) { return v[b * a.v_stride[0] + hk * a.v_stride[1] + j * a.v_stride[2] + c]; },
            &out[row * p.head_dim_v()]);
      }
  return out;
}

// The same for a varlen batch (packed tensors through cu_seqlens): output and LSE indexed
// (head, packed row), as the reference writes them.
std::vector<double> cpu_attention_varlen(const AttnBuffers& buf, std::vector<double>* lse) {
  const Problem& p = buf.problem;
  const AttnParams a = buf.params();
  auto q = download(buf.q, p.dtype), k = download(buf.k, p.dtype), v = download(buf.v, p.dtype);
  std::vector<double> out(static_cast<std::size_t>(p.h * buf.total_q * p.head_dim_v()), 0.0);
  lse->assign(static_cast<std::size_t>(p.h * buf.total_q), 0.0);
  const float* sinks = p.sinks ? buf.sink_values.data() : nullptr;
  for (std::size_t b = 0; b + 1 < buf.cu_q.size(); ++b) {
    const long long q0 = buf.cu_q[b], k0 = buf.cu_k[b];
    const long long lq = buf.cu_q[b + 1] - q0, lk = buf.cu_k[b + 1] - k0;
    for (int h = 0; h < p.h; ++h)
      for (long long i = 0; i < lq; ++i) {
        const int hk = h / (p.h / p.hkv);
        const long long row = h * buf.total_q + q0 + i;
        (*lse)[row] = attend_row(
            p, h, sinks, i, lq, lk, [&](int c) { return q[(q0 + i) * a.q_stride[2] + h * a.q_stride[1] + c]; },
            [&](long long j, int c) { return k[(k0 + j) * a.k_stride[2] + hk * a.k_stride[1] + c]; },
            [&](long long j, int c) { return v[(k0 + j) * a.v_stride[2] + hk * a.v_stride[1] + c]; },
            &out[row * p.head_dim_v()]);
      }
  }
  return out;
}

// ---- FP8 e4m3 (OCP "e4m3fn": bias 7, no infinities, S.1111.111 NaN) on the host -----------------

bool is_e4m3_nan(std::uint8_t x) { return (x & 0x7F) == 0x7F; }

// A byte's value, by the format's definition: (1 + m/8) * 2^(e - 7), subnormal m/8 * 2^-6.
double e4m3_to_double(std::uint8_t x) {
  const int e = (x >> 3) & 0xF, m = x & 0x7;
  if (is_e4m3_nan(x)) return NAN;
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (x & 0x80) ? -v : v;
}

std::vector<std::uint8_t> download_bytes(const cuda::DeviceBuffer& b) {
  std::vector<std::uint8_t> raw(b.bytes());
  b.download(raw.data(), raw.size());
  return raw;
}

std::vector<double> download_e4m3(const cuda::DeviceBuffer& b) {
  const auto raw = download_bytes(b);
  std::vector<double> out(raw.size());
  for (std::size_t i = 0; i < raw.size(); ++i) out[i] = e4m3_to_double(raw[i]);
  return out;
}

// An FP8 cache's scale of (sequence, KV head) as the buffers pass it: one per pair, or entry 0 of
// the table for the whole tensor.
double descale(const AttnBuffers& buf, const std::vector<float>& table, int b, int hk) {
  return buf.per_tensor_descale ? table.at(0) : table.at(static_cast<std::size_t>(b * buf.problem.hkv + hk));
}

// Float64 attention over an FP8 cache, output (b, h, s, dv) contiguous: Q from q, K and V as a
// candidate gets them (call(): the pages through the block table for a paged problem, so the
// scatter is checked too; a latent problem's V from K's bytes), each element its e4m3 value times its
// (sequence, KV head) scale, each sequence its own key count.
std::vector<double> cpu_attention_fp8(const AttnBuffers& buf, std::vector<double>* lse) {
  const Problem& p = buf.problem;
  const AttnParams a = buf.params();
  const attntune_plan::Call call = buf.call();
  const auto q = download(buf.q, p.dtype);
  const auto k = download_e4m3(p.paged() ? buf.k_pages : buf.k);
  const auto v = p.latent ? k : download_e4m3(p.paged() ? buf.v_pages : buf.v);
  std::vector<int> table;
  if (p.paged()) {
    table.resize(buf.block_table.bytes() / sizeof(int));
    buf.block_table.download(table.data(), buf.block_table.bytes());
  }
  // Key j of sequence b, head hk, column c: its element in the call's K (or V) through its strides.
  auto elem_at = [&](const long long* st, int b, int hk, long long j, int c) -> std::size_t {
    if (!p.paged()) return static_cast<std::size_t>(b * st[0] + hk * st[1] + j * st[2] + c);
    const long long page = table.at(static_cast<std::size_t>(b * buf.pages_per_seq + j / p.page));
    return static_cast<std::size_t>(page * st[0] + hk * st[1] + (j % p.page) * st[2] + c);
  };
  std::vector<double> out(p.b * p.h * p.s * p.head_dim_v(), 0.0);
  lse->assign(p.b * p.h * p.s, 0.0);
  const float* sinks = p.sinks ? buf.sink_values.data() : nullptr;
  for (int b = 0; b < p.b; ++b) {
    const long long lk = buf.seqlens.empty() ? p.sk : buf.seqlens[static_cast<std::size_t>(b)];
    for (int h = 0; h < p.h; ++h) {
      const int hk = h / (p.h / p.hkv);
      const double kd = descale(buf, buf.k_descale_values, b, hk), vd = descale(buf, buf.v_descale_values, b, hk);
      for (int i = 0; i < p.s; ++i) {
        const long long row = (static_cast<long long>(b) * p.h + h) * p.s + i;
        (*lse)[row] = attend_row(
            p, h, sinks, i, p.s, lk, [&](int c) { return q[b * a.q_stride[0] + h * a.q_stride[1] + i * a.q_stride[2] + c]; },
            [&](long long j, int c) { return k.at(elem_at(call.k_stride, b, hk, j, c)) * kd; },
            [&](long long j, int c) { return v.at(elem_at(call.v_stride, b, hk, j, c)) * vd; }, &out[row * p.head_dim_v()]);
      }
    }
  }
  return out;
}

// Compares the reference with the float64 one: fp32 within 2e-5, same-dtype worse but close.
// low_scale widens the same-dtype bound: an FP8 cache's scales (up to 2 each) make scores and
// values larger than the 16-bit inputs' and so their rounding errors.
void expect_matches(const Reference& ref, const AttnBuffers& buf, const std::vector<double>& want,
                    const std::vector<double>& lse64, const std::string& what, double low_scale = 1) {
  const Problem& p = buf.problem;
  std::vector<float> lse32;
  const auto got = ref.output(buf, false, &lse32);
  ASSERT_GE(got.size(), want.size()) << what;
  double err = 0, lse_err = 0;
  for (std::size_t i = 0; i < want.size(); ++i) err = std::max(err, std::abs(want[i] - got[i]));
  for (std::size_t i = 0; i < lse64.size(); ++i) {
    if (std::isinf(lse64[i])) {
      EXPECT_TRUE(std::isinf(lse32[i]) && lse32[i] < 0) << what << ": row " << i << " sees no key: LSE must be -inf";
    } else {
      // Relative past 1: a sink of 1e3 makes the LSE ~1e3, where an fp32 ulp is 6e-5.
      lse_err = std::max(lse_err, std::abs(lse64[i] - lse32[i]) / std::max(1.0, std::abs(lse64[i])));
    }
  }
  EXPECT_LT(err, 2e-5) << what;  // fp32 math on O(1) values over <= 300 keys, head dims up to 1024
  EXPECT_LT(lse_err, 2e-5) << what;
  // The same-dtype reference is worse than fp32 but still close: it is the criterion's yardstick.
  const auto low = ref.output(buf, true);
  double low_err = 0;
  for (std::size_t i = 0; i < want.size(); ++i) low_err = std::max(low_err, std::abs(want[i] - low[i]));
  EXPECT_GT(low_err, err) << what << ": rounding to " << dtype_name(p.dtype) << " must cost accuracy";
  EXPECT_LT(low_err, (p.dtype == DType::kBf16 ? 0.05 : 0.01) * low_scale) << what;
}

}  // namespace

class ReferenceVsCpu : public ::testing::TestWithParam<std::pair<const char*, Layout>> {};

TEST_P(ReferenceVsCpu, MatchesFloat64) {
  ATTNTUNE_REQUIRE_GPU();
  cuda::Context ctx(0);
  Reference ref(cuda::device_props(0).arch);
  const Problem p = Problem::parse(GetParam().first);
  AttnBuffers buf(p, GetParam().second);
  ref.fill(buf, 7);
  std::vector<double> lse64;
  const auto want = cpu_attention(buf, &lse64);
  expect_matches(ref, buf, want, lse64, GetParam().first);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ReferenceVsCpu,
    ::testing::Values(std::make_pair("b=1,h=2,s=37,d=64,dtype=bf16,causal=0", Layout::kBHSD),
                      std::make_pair("b=2,h=4,hkv=2,s=45,sk=70,d=128,dtype=fp16,causal=1", Layout::kBSHD),
                      std::make_pair("b=1,h=3,hkv=1,s=70,sk=33,d=64,dtype=bf16,causal=1", Layout::kBHSD),
                      std::make_pair("b=1,h=1,s=129,sk=300,d=256,dtype=fp16,causal=0", Layout::kBSHD),
                      // Variants: windows (causal and two-sided, bottom-right with sk != s), soft-caps,
                      // sinks (random, -1e4 and 1e3 by head) and all three.
                      std::make_pair("b=2,h=4,hkv=2,s=45,sk=70,d=64,dtype=bf16,causal=1,window=7", Layout::kBHSD),
                      std::make_pair("b=1,h=2,s=90,sk=60,d=128,dtype=fp16,causal=0,window=5,9", Layout::kBSHD),
                      std::make_pair("b=1,h=2,s=50,d=64,dtype=fp16,causal=0,window=-1,3", Layout::kBHSD),
                      std::make_pair("b=1,h=3,hkv=1,s=70,sk=80,d=64,dtype=bf16,causal=0,softcap=30", Layout::kBHSD),
                      std::make_pair("b=2,h=4,hkv=1,s=33,sk=40,d=128,dtype=fp16,causal=1,sinks=1", Layout::kBSHD),
                      std::make_pair("b=1,h=4,hkv=2,s=61,sk=95,d=64,dtype=bf16,causal=1,window=16,softcap=50,sinks=1",
                                     Layout::kBHSD),
                      // V's head dim other than Q's and K's (DeepSeek's MLA prefill: 192 / 128), and
                      // the other way round with a window and sinks.
                      std::make_pair("b=2,h=4,hkv=1,s=45,sk=70,d=192,dv=128,dtype=bf16,causal=1", Layout::kBSHD),
                      std::make_pair("b=1,h=2,s=60,sk=61,d=64,dv=256,dtype=fp16,causal=0,window=9,sinks=1",
                                     Layout::kBHSD),
                      // A latent cache (V is K's first dv columns, passed as k with k's strides): MLA
                      // decode's layout at 192 / 128, one KV head, both layouts.
                      std::make_pair("b=2,h=16,hkv=1,s=4,sk=70,d=192,dv=128,dtype=bf16,causal=1,latent=1",
                                     Layout::kBSHD),
                      std::make_pair("b=1,h=8,hkv=1,s=1,sk=300,d=256,dv=224,dtype=fp16,causal=0,latent=1",
                                     Layout::kBHSD),
                      // Head dims past 256, read in column blocks of 256: DeepSeek's latent cache
                      // (576 / 512: three blocks of Q and K, two of V), one head dim of 512, ragged
                      // blocks (320 / 288) with a window and sinks, and the largest (1024).
                      std::make_pair("b=2,h=16,hkv=1,s=4,sk=150,d=576,dv=512,dtype=bf16,causal=1,latent=1",
                                     Layout::kBSHD),
                      std::make_pair("b=1,h=2,s=40,sk=90,d=512,dtype=fp16,causal=0", Layout::kBHSD),
                      std::make_pair("b=1,h=4,hkv=2,s=33,sk=70,d=320,dv=288,dtype=bf16,causal=1,window=20,sinks=1",
                                     Layout::kBSHD),
                      std::make_pair("b=1,h=2,hkv=1,s=3,sk=40,d=1024,dv=1024,dtype=fp16,causal=1", Layout::kBHSD)),
    [](const auto& info) { return "shape" + std::to_string(info.index) + "_" + layout_name(info.param.second); });

// Varlen batches: ragged lengths with empty and one-row sequences (first, middle and last), GQA
// and MQA, causal (bottom-right per sequence, sk > s: every sequence has more keys than rows) and
// not, packed [total, heads, d] and head-major.
struct VarlenCase {
  const char* spec;
  std::vector<int> lens;  // query rows per sequence
  Layout layout;
};

void PrintTo(const VarlenCase& c, std::ostream* os) { *os << c.spec; }

class ReferenceVsCpuVarlen : public ::testing::TestWithParam<VarlenCase> {};

TEST_P(ReferenceVsCpuVarlen, MatchesFloat64) {
  ATTNTUNE_REQUIRE_GPU();
  cuda::Context ctx(0);
  Reference ref(cuda::device_props(0).arch);
  const VarlenCase& c = GetParam();
  const Problem p = Problem::parse(c.spec);
  AttnBuffers buf(p, c.layout, c.lens);
  ASSERT_EQ(buf.problem.b, static_cast<std::int64_t>(c.lens.size()));
  ref.fill(buf, 11);
  std::vector<double> lse64;
  const auto want = cpu_attention_varlen(buf, &lse64);
  ASSERT_EQ(want.size(), buf.out_rows() * static_cast<std::size_t>(p.head_dim_v()));
  expect_matches(ref, buf, want, lse64, c.spec);
  // The reference compared with itself passes the criterion; with the output left poisoned it
  // reports every element non-finite (the comparison covers exactly the packed rows).
  const Verdict poisoned = ref.check(buf);
  EXPECT_EQ(poisoned.status, "nan_or_unwritten") << poisoned.detail();
  EXPECT_EQ(poisoned.nonfinite, buf.out_rows() * static_cast<std::size_t>(p.head_dim_v()));
  EXPECT_EQ(poisoned.lse_mismatch, buf.out_rows());
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ReferenceVsCpuVarlen,
    ::testing::Values(VarlenCase{"b=6,h=4,hkv=2,s=70,sk=90,d=64,dtype=bf16,causal=1,varlen=1",
                                 {0, 70, 1, 33, 17, 0},
                                 Layout::kBSHD},
                      VarlenCase{"b=6,h=4,hkv=2,s=70,sk=70,d=64,dtype=fp16,causal=0,varlen=1",
                                 {5, 0, 1, 70, 0, 41},
                                 Layout::kBSHD},
                      VarlenCase{"b=5,h=3,hkv=1,s=129,sk=129,d=128,dtype=fp16,causal=1,varlen=1",
                                 {1, 129, 0, 65, 1},
                                 Layout::kBHSD},
                      VarlenCase{"b=4,h=2,s=40,sk=300,d=256,dtype=bf16,causal=0,varlen=1",
                                 {40, 0, 1, 23},
                                 Layout::kBSHD},
                      VarlenCase{"b=5,h=4,hkv=2,s=70,sk=90,d=64,dtype=bf16,causal=1,varlen=1,window=9,softcap=30,sinks=1",
                                 {0, 70, 1, 33, 17},
                                 Layout::kBSHD},
                      VarlenCase{"b=4,h=4,hkv=1,s=50,sk=60,d=192,dv=128,dtype=bf16,causal=1,varlen=1",
                                 {50, 0, 1, 29},
                                 Layout::kBSHD}),
    [](const auto& info) { return "varlen" + std::to_string(info.index) + "_" + layout_name(info.param.layout); });

// The drawn lengths of a varlen problem (its own inputs, as timed) and the ragged batch it is also
// validated on.
TEST(ReferenceVarlen, ValidationInputsAreTheDrawnAndTheRaggedBatch) {
  ATTNTUNE_REQUIRE_GPU();
  cuda::Context ctx(0);
  const Problem p = Problem::parse("b=3,h=2,s=200,sk=264,d=64,dtype=bf16,causal=1,varlen=50,lens_seed=3");
  auto inputs = validation_inputs(p, 5);
  ASSERT_EQ(inputs.size(), 2u);
  EXPECT_EQ(inputs[0]->seqlens, p.q_lens());
  EXPECT_EQ(inputs[0]->total_q, p.total_q());
  EXPECT_EQ(inputs[0]->total_k, p.total_k());
  EXPECT_EQ(inputs[1]->seqlens, varlen_ragged_lens(p, 5));
  const attntune_plan::Call c = inputs[1]->call();
  EXPECT_EQ(c.entry, attntune_plan::kEntryVarlen);
  EXPECT_EQ(c.batch, 7);
  EXPECT_EQ(c.seqlen_q, 200);
  EXPECT_EQ(c.seqlen_k, 264);
  EXPECT_EQ(c.total_q, inputs[1]->total_q);
  EXPECT_EQ(c.q_stride[0], 0);
  EXPECT_EQ(c.q_stride[1], 64);
  EXPECT_EQ(c.q_stride[2], 2 * 64);
  EXPECT_EQ(c.k_stride[2], 2 * 64);
  EXPECT_NE(c.cu_seqlens_q, nullptr);
  EXPECT_NE(c.cu_seqlens_k, nullptr);
}

// ---- FP8 e4m3 KV caches (kv_dtype=fp8) ------------------------------------------------------------

namespace {

// The device's compute capability as a number (89 for sm_89), for the FP8 tests' skip.
int device_arch_number() {
  const cuda::DeviceProps props = cuda::device_props(0);
  return props.cc_major * 10 + props.cc_minor;
}

#define ATTNTUNE_REQUIRE_SM89()                                                                    \
  do {                                                                                             \
    if (device_arch_number() < 89)                                                                 \
      GTEST_SKIP() << "FP8 e4m3 needs sm_89 or newer; this device is " << cuda::device_props(0).arch; \
  } while (0)

// A problem of `spec` with an FP8 cache (set directly: the spec key is parsed elsewhere).
Problem fp8_problem(const char* spec) {
  Problem p = Problem::parse(spec);
  p.kv_fp8 = true;
  return p;
}

// fp32 to bf16 bits, round to nearest even (finite values).
std::uint16_t bf16_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<std::uint16_t>(u >> 16);
}

// Writes a (b, h, s, dv) fp32 output and its LSE into buf's o (bf16, through o's strides) and lse,
// as a candidate would have written them.
void write_candidate(AttnBuffers& buf, const std::vector<float>& out, const std::vector<float>& lse) {
  const Problem& p = buf.problem;
  ASSERT_EQ(p.dtype, DType::kBf16);
  const AttnParams a = buf.params();
  std::vector<std::uint16_t> o(buf.o.bytes() / 2, 0xFFFF);
  const long long dv = p.head_dim_v();
  for (long long b = 0; b < p.b; ++b)
    for (long long h = 0; h < p.h; ++h)
      for (long long i = 0; i < p.s; ++i)
        for (long long c = 0; c < dv; ++c)
          o[static_cast<std::size_t>(b * a.o_stride[0] + h * a.o_stride[1] + i * a.o_stride[2] + c)] =
              bf16_bits(out[static_cast<std::size_t>(((b * p.h + h) * p.s + i) * dv + c)]);
  buf.o.upload(o.data(), o.size() * 2);
  buf.lse.upload(lse.data(), lse.size() * sizeof(float));
}

void upload_floats(cuda::DeviceBuffer& b, const std::vector<float>& x) { b.upload(x.data(), x.size() * sizeof(float)); }

}  // namespace

// Every e4m3 code but the two NaNs is a value the reference reads exactly (dequantize_e4m3, the
// reference's decoder) and that the fill's conversion (quantize_e4m3: cvt.rn.satfinite) maps back to
// the same code; the NaN codes read as NaN; values between codes round to nearest even, saturating.
TEST(ReferenceE4m3, EveryCodeConvertsExactly) {
  ATTNTUNE_REQUIRE_GPU();
  cuda::Context ctx(0);
  ATTNTUNE_REQUIRE_SM89();
  Reference ref(cuda::device_props(0).arch);
  std::vector<std::uint8_t> codes(256);
  for (int i = 0; i < 256; ++i) codes[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i);
  const std::vector<float> values = ref.from_e4m3(codes);
  ASSERT_EQ(values.size(), 256u);
  std::vector<float> finite;
  std::vector<std::uint8_t> finite_codes;
  for (int i = 0; i < 256; ++i) {
    const auto code = static_cast<std::uint8_t>(i);
    const float got = values[static_cast<std::size_t>(i)];
    if (is_e4m3_nan(code)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << i;
      continue;
    }
    const double want = e4m3_to_double(code);
    EXPECT_EQ(static_cast<double>(got), want) << "code " << i;
    EXPECT_EQ(std::signbit(got), (i & 0x80) != 0) << "code " << i << " (the sign of zero too)";
    finite.push_back(got);
    finite_codes.push_back(code);
  }
  EXPECT_EQ(finite.size(), 254u);
  // Anchors of the format: 1, the largest (448), the smallest normal and subnormal, -0.
  EXPECT_EQ(values[0x38], 1.0f);
  EXPECT_EQ(values[0x7E], 448.0f);
  EXPECT_EQ(values[0xFE], -448.0f);
  EXPECT_EQ(values[0x08], std::ldexp(1.0f, -6));
  EXPECT_EQ(values[0x01], std::ldexp(1.0f, -9));
  EXPECT_EQ(values[0x80], 0.0f);
  EXPECT_TRUE(std::signbit(values[0x80]));
  // Back: every exact value to its own code.
  const std::vector<std::uint8_t> back = ref.to_e4m3(finite);
  ASSERT_EQ(back.size(), finite_codes.size());
  for (std::size_t i = 0; i < back.size(); ++i)
    EXPECT_EQ(int(back[i]), int(finite_codes[i])) << "value " << finite[i];
  // Between codes: round to nearest, ties to even; past 448 saturated; NaN stays NaN.
  const float sub = std::ldexp(1.0f, -9);
  const std::vector<float> between = {std::ldexp(1.0f, -10), 0.75f * sub, 1.5f * sub, 1.0625f, 1.07f, 1.1875f,
                                      -1.0625f, 464.0f, 500.0f, 1e9f, -1e9f, NAN};
  const std::vector<int> want = {0x00, 0x01, 0x02, 0x38, 0x39, 0x3A, 0xB8, 0x7E, 0x7E, 0x7E, 0xFE, -1};
  const std::vector<std::uint8_t> rounded = ref.to_e4m3(between);
  for (std::size_t i = 0; i < between.size(); ++i) {
    if (want[i] < 0) {
      EXPECT_TRUE(is_e4m3_nan(rounded[i])) << "NaN gave " << int(rounded[i]);
    } else {
      EXPECT_EQ(int(rounded[i]), want[i]) << "value " << between[i];
    }
  }
}

// An FP8 problem's inputs: K and V one byte an element, the 16-bit problem's draws rounded to e4m3
// (Q the same bits as the 16-bit problem's), scales in [0.25, 2] by (sequence, KV head), K's and V's
// different, passed with strides {hkv, 1} or {0, 0}; a paged cache's pages the keys' bytes through
// the table and NaN bytes everywhere else.
TEST(ReferenceFp8, InputsPagesAndScales) {
  ATTNTUNE_REQUIRE_GPU();
  cuda::Context ctx(0);
  ATTNTUNE_REQUIRE_SM89();
  Reference ref(cuda::device_props(0).arch);
  const char* spec = "b=5,h=8,hkv=2,s=3,sk=77,d=128,dtype=fp16,causal=1,page=16";
  const Problem p = fp8_problem(spec);
  const std::vector<int> lens = ragged_seqlens(p, 3);
  AttnBuffers buf(p, Layout::kBHSD, lens, 3);
  AttnBuffers twin(Problem::parse(spec), Layout::kBHSD, lens, 3);  // the same problem, 16-bit
  ref.fill(buf, 9);
  ref.fill(twin, 9);
  const std::size_t keys = static_cast<std::size_t>(p.b * p.hkv * p.sk);
  EXPECT_EQ(buf.kv_elem_bytes(), 1u);
  EXPECT_EQ(buf.k.bytes(), keys * p.d);
  EXPECT_EQ(buf.v.bytes(), keys * p.d);
  EXPECT_EQ(buf.q.bytes(), twin.q.bytes());
  EXPECT_EQ(buf.k_pages.bytes() * 2, twin.k_pages.bytes());
  EXPECT_EQ(buf.v_pages.bytes() * 2, twin.v_pages.bytes());

  // Q: the same bits; K and V: the same draws, each within half an e4m3 step of the fp16 one.
  EXPECT_EQ(download_bytes(buf.q), download_bytes(twin.q));
  for (auto [fp8, wide] : {std::make_pair(&buf.k, &twin.k), std::make_pair(&buf.v, &twin.v)}) {
    const auto got = download_e4m3(*fp8), want = download(*wide, DType::kFp16);
    ASSERT_EQ(got.size(), want.size());
    double sum = 0, sum2 = 0;
    std::size_t off = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      sum += got[i];
      sum2 += got[i] * got[i];
      // e4m3 keeps 4 significant bits: half a step is 2^-4 of the value (2^-10 among subnormals).
      if (!(std::abs(got[i] - want[i]) <= std::abs(want[i]) / 16 + std::ldexp(1.0, -10))) ++off;
    }
    EXPECT_EQ(off, 0u) << "elements not the 16-bit draws rounded to e4m3";
    const double mean = sum / got.size(), sd = std::sqrt(sum2 / got.size() - mean * mean);
    EXPECT_LT(std::abs(mean), 0.02);
    EXPECT_NEAR(sd, 1.0, 0.03);
  }

  // Scales: [b, hkv] each, in [0.25, 2], not all alike, K's not V's; the same tables every time.
  ASSERT_EQ(buf.k_descale_values.size(), static_cast<std::size_t>(p.b * p.hkv));
  ASSERT_EQ(buf.v_descale_values.size(), buf.k_descale_values.size());
  EXPECT_EQ(buf.k_descale_values, kv_descales(p.b * p.hkv, kDescaleSeedK));
  EXPECT_EQ(buf.v_descale_values, kv_descales(p.b * p.hkv, kDescaleSeedV));
  EXPECT_NE(buf.k_descale_values, buf.v_descale_values);
  for (const auto* t : {&buf.k_descale_values, &buf.v_descale_values}) {
    for (float x : *t) {
      EXPECT_GE(x, 0.25f);
      EXPECT_LE(x, 2.0f);
    }
    EXPECT_NE(*std::min_element(t->begin(), t->end()), *std::max_element(t->begin(), t->end()));
  }
  std::vector<float> dev(buf.k_descale_values.size());
  buf.k_descale.download(dev.data(), dev.size() * sizeof(float));
  EXPECT_EQ(dev, buf.k_descale_values);
  buf.v_descale.download(dev.data(), dev.size() * sizeof(float));
  EXPECT_EQ(dev, buf.v_descale_values);

  // The call and the reference's view: FP8, the tables, strides {hkv, 1}; per tensor {0, 0}.
  for (bool per_tensor : {false, true}) {
    buf.per_tensor_descale = per_tensor;
    const attntune_plan::Call c = buf.call();
    const KvScales a = buf.kv_scales();
    EXPECT_EQ(c.kv_fp8, 1);
    EXPECT_EQ(c.k_descale, reinterpret_cast<const float*>(buf.k_descale.ptr()));
    EXPECT_EQ(c.v_descale, reinterpret_cast<const float*>(buf.v_descale.ptr()));
    EXPECT_EQ(a.k_descale, c.k_descale);
    EXPECT_EQ(a.v_descale, c.v_descale);
    for (int i = 0; i < 2; ++i) {
      const long long want = per_tensor ? 0 : (i == 0 ? p.hkv : 1);
      EXPECT_EQ(c.k_descale_stride[i], want);
      EXPECT_EQ(c.v_descale_stride[i], want);
      EXPECT_EQ(a.k_descale_stride[i], want);
      EXPECT_EQ(a.v_descale_stride[i], want);
    }
    // Byte strides: pages [num_pages, page, hkv, d].
    EXPECT_EQ(c.k_stride[0], p.page * p.hkv * p.d);
    EXPECT_EQ(c.k_stride[1], p.d);
    EXPECT_EQ(c.k_stride[2], p.hkv * p.d);
  }
  buf.per_tensor_descale = false;
  // A 16-bit problem's call has no FP8 cache.
  EXPECT_EQ(twin.call().kv_fp8, 0);
  EXPECT_EQ(twin.call().k_descale, nullptr);

  // The pages: key j < len of sequence b at row j % page of page table[b][j / page], the same bytes
  // as k / v; every other byte a NaN (K's 0x7F, V's 0xFF).
  std::vector<int> table(buf.block_table.bytes() / sizeof(int));
  buf.block_table.download(table.data(), buf.block_table.bytes());
  const AttnParams a = buf.params();
  const attntune_plan::Call c = buf.call();
  for (int t = 0; t < 2; ++t) {
    const auto dense = download_bytes(t ? buf.v : buf.k), pages = download_bytes(t ? buf.v_pages : buf.k_pages);
    const long long* st = t ? a.v_stride : a.k_stride;
    const long long* pst = t ? c.v_stride : c.k_stride;
    std::vector<bool> used(pages.size(), false);
    std::size_t wrong = 0;
    for (int b = 0; b < p.b; ++b)
      for (int hk = 0; hk < p.hkv; ++hk)
        for (long long j = 0; j < lens[static_cast<std::size_t>(b)]; ++j)
          for (int col = 0; col < p.d; ++col) {
            const long long page = table[static_cast<std::size_t>(b * buf.pages_per_seq + j / p.page)];
            const auto at = static_cast<std::size_t>(page * pst[0] + hk * pst[1] + (j % p.page) * pst[2] + col);
            used.at(at) = true;
            if (pages.at(at) != dense.at(static_cast<std::size_t>(b * st[0] + hk * st[1] + j * st[2] + col))) ++wrong;
          }
    EXPECT_EQ(wrong, 0u) << (t ? "V" : "K") << " pages";
    std::size_t not_nan = 0;
    for (std::size_t i = 0; i < pages.size(); ++i)
      if (!used[i] && pages[i] != (t ? 0xFF : 0x7F)) ++not_nan;
    EXPECT_EQ(not_nan, 0u) << (t ? "V" : "K") << " pages past the lengths";
  }
}

// The reference over an FP8 cache against the float64 one: odd lengths, dense and paged through a
// block table (ragged lengths: 0, 1, odd, full), GQA and MQA, the variants, a latent cache, scales
// by (sequence, KV head) and per tensor.
struct Fp8Case {
  const char* spec;
  Layout layout;
  bool per_tensor;
};

void PrintTo(const Fp8Case& c, std::ostream* os) { *os << c.spec << (c.per_tensor ? " per-tensor" : " per-head"); }

class ReferenceVsCpuFp8 : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(ReferenceVsCpuFp8, MatchesFloat64) {
  ATTNTUNE_REQUIRE_GPU();
  cuda::Context ctx(0);
  ATTNTUNE_REQUIRE_SM89();
  Reference ref(cuda::device_props(0).arch);
  const Fp8Case& c = GetParam();
  const Problem p = fp8_problem(c.spec);
  AttnBuffers buf(p, c.layout, p.paged() ? ragged_seqlens(p, 5) : std::vector<int>{}, 5);
  buf.per_tensor_descale = c.per_tensor;
  ref.fill(buf, 13);
  std::vector<double> lse64;
  const auto want = cpu_attention_fp8(buf, &lse64);
  const auto largest = [](const std::vector<float>& t) { return double(*std::max_element(t.begin(), t.end())); };
  expect_matches(ref, buf, want, lse64, c.spec,
                 std::max(1.0, largest(buf.k_descale_values) * largest(buf.v_descale_values)));
  // The scales count: the same inputs read with the other form give another output.
  std::vector<float> other_lse;
  buf.per_tensor_descale = !c.per_tensor;
  const auto other = ref.output(buf, false, &other_lse);
  buf.per_tensor_descale = c.per_tensor;
  double diff = 0;
  for (std::size_t i = 0; i < want.size(); ++i) diff = std::max(diff, std::abs(want[i] - other[i]));
  EXPECT_GT(diff, 1e-3) << "per-tensor and per-head scales give the same output";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ReferenceVsCpuFp8,
    ::testing::Values(Fp8Case{"b=2,h=4,hkv=2,s=37,sk=71,d=128,dtype=bf16,causal=1", Layout::kBHSD, false},
                      Fp8Case{"b=3,h=3,hkv=1,s=45,sk=33,d=64,dtype=fp16,causal=0", Layout::kBSHD, true},
                      Fp8Case{"b=2,h=4,hkv=2,s=61,sk=95,d=64,dtype=fp16,causal=1,window=16,softcap=50,sinks=1",
                              Layout::kBHSD, false},
                      Fp8Case{"b=1,h=2,s=40,sk=90,d=256,dv=128,dtype=bf16,causal=0", Layout::kBSHD, false},
                      // Paged, through the block table: decode (s=1), a few query rows, pages that a
                      // sequence's keys do not fill, per (sequence, head) and per tensor.
                      Fp8Case{"b=5,h=8,hkv=2,s=1,sk=77,d=128,dtype=bf16,causal=1,page=16", Layout::kBHSD, false},
                      Fp8Case{"b=5,h=8,hkv=2,s=1,sk=77,d=128,dtype=bf16,causal=1,page=16", Layout::kBHSD, true},
                      Fp8Case{"b=6,h=6,hkv=3,s=5,sk=131,d=64,dtype=fp16,causal=1,page=7", Layout::kBSHD, false},
                      Fp8Case{"b=5,h=4,hkv=1,s=3,sk=57,d=256,dtype=fp16,causal=0,page=64", Layout::kBSHD, true},
                      // A latent cache (V is K's first dv columns, K's bytes, V's own scales), paged.
                      Fp8Case{"b=5,h=16,hkv=1,s=2,sk=150,d=576,dv=512,dtype=bf16,causal=1,latent=1,page=64",
                              Layout::kBSHD, false}),
    [](const auto& info) {
      return "fp8_" + std::to_string(info.index) + "_" + layout_name(info.param.layout) +
             (info.param.per_tensor ? "_per_tensor" : "_per_head");
    });

// The criterion over an FP8 cache fails a kernel that ignores the scales, swaps K's and V's, or
// reads them in the other form, and passes one that computes the reference's values.
TEST(ReferenceFp8, CriterionFailsWhatIgnoresTheScales) {
  ATTNTUNE_REQUIRE_GPU();
  cuda::Context ctx(0);
  ATTNTUNE_REQUIRE_SM89();
  Reference ref(cuda::device_props(0).arch);
  const Problem p = fp8_problem("b=5,h=8,hkv=2,s=2,sk=300,d=128,dtype=bf16,causal=1,page=32");
  AttnBuffers buf(p, Layout::kBHSD, ragged_seqlens(p, 7), 7);
  ref.fill(buf, 21);
  const ReferenceCache cache(ref, buf);
  const std::vector<float> k_scales = buf.k_descale_values, v_scales = buf.v_descale_values;
  // The fp32 reference's output and LSE on buf with the given tables (or form), the tables then
  // restored, written as a candidate's output.
  auto candidate = [&](const std::vector<float>& ks, const std::vector<float>& vs, bool per_tensor) {
    upload_floats(buf.k_descale, ks);
    upload_floats(buf.v_descale, vs);
    buf.per_tensor_descale = per_tensor;
    std::vector<float> lse;
    const auto out = ref.output(buf, false, &lse);
    upload_floats(buf.k_descale, k_scales);
    upload_floats(buf.v_descale, v_scales);
    buf.per_tensor_descale = false;
    write_candidate(buf, out, lse);
  };
  candidate(k_scales, v_scales, false);
  Verdict v = cache.check(buf);
  EXPECT_EQ(v.status, "ok") << v.detail();
  const std::vector<float> ones(k_scales.size(), 1.0f);
  const struct {
    const char* what;
    std::vector<float> ks, vs;
    bool per_tensor;
  } wrong[] = {{"scales ignored", ones, ones, false},
               {"K's scale ignored", ones, v_scales, false},
               {"V's scale ignored", k_scales, ones, false},
               {"K's and V's swapped", v_scales, k_scales, false},
               {"one scale per tensor", k_scales, v_scales, true}};
  for (const auto& w : wrong) {
    candidate(w.ks, w.vs, w.per_tensor);
    v = cache.check(buf);
    EXPECT_EQ(v.status, "wrong_result") << w.what << ": " << v.detail();
  }
  // A cache built for per-head scales refuses inputs read per tensor.
  buf.per_tensor_descale = true;
  EXPECT_THROW(cache.check(buf), std::logic_error);
}

// A paged problem's pages drawn straight into (AttnBuffers::contiguous_kv false: timing inputs, and
// validation inputs once their references are computed) hold what fill then scatter_pages writes,
// bit for bit: the keys of each sequence, NaN past its length and in the spare pages. A 16-bit
// cache, a latent one (K's pages alone) and an FP8 one (V around a mean).
TEST(ReferencePages, DrawnIntoThePagesAsFillThenScatterWould) {
  ATTNTUNE_REQUIRE_GPU();
  cuda::Context ctx(0);
  Reference ref(cuda::device_props(0).arch);
  struct Case {
    const char* spec;
    bool fp8;
  };
  for (const Case& c : {Case{"b=5,h=8,hkv=2,s=1,sk=77,d=128,dtype=bf16,causal=1,page=16", false},
                        Case{"b=3,h=4,hkv=4,s=3,sk=300,d=64,dtype=fp16,causal=1,page=64", false},
                        Case{"b=2,h=16,hkv=1,s=1,sk=129,d=576,dv=512,dtype=bf16,causal=1,page=64,latent=1", false},
                        Case{"b=5,h=8,hkv=2,s=4,sk=200,d=128,dtype=bf16,causal=1,page=16", true}}) {
    SCOPED_TRACE(std::string(c.spec) + (c.fp8 ? " fp8" : ""));
    if (c.fp8 && device_arch_number() < 89) continue;
    const Problem p = c.fp8 ? fp8_problem(c.spec) : Problem::parse(c.spec);
    const std::vector<int> lens = ragged_seqlens(p, 3);
    AttnBuffers scattered(p, Layout::kBHSD, lens, 3);
    AttnBuffers drawn(p, Layout::kBHSD, lens, 3, /*contiguous_kv=*/false);
    EXPECT_EQ(drawn.k.bytes(), 0u);
    EXPECT_EQ(drawn.v.bytes(), 0u);
    scattered.v_mean = drawn.v_mean = c.fp8 ? 0.75f : 0.f;
    ref.fill(scattered, 9);
    ref.fill(drawn, 9);
    EXPECT_EQ(download_bytes(drawn.q), download_bytes(scattered.q));
    EXPECT_EQ(download_bytes(drawn.k_pages), download_bytes(scattered.k_pages));
    if (!p.latent) {
      EXPECT_EQ(download_bytes(drawn.v_pages), download_bytes(scattered.v_pages));
    }
    // Another seed's draws differ; dropping the contiguous copy after a fill draws them alike.
    const auto seed9 = download_bytes(drawn.k_pages);
    scattered.drop_contiguous_kv();
    EXPECT_FALSE(scattered.contiguous_kv);
    ref.fill(scattered, 10);
    ref.fill(drawn, 10);
    EXPECT_EQ(download_bytes(drawn.k_pages), download_bytes(scattered.k_pages));
    EXPECT_NE(download_bytes(drawn.k_pages), seed9);
  }
  // A dense problem's K and V are its only copy.
  AttnBuffers dense(Problem::parse("b=1,h=2,s=5,d=64,dtype=bf16,causal=0"), Layout::kBHSD);
  EXPECT_THROW(dense.drop_contiguous_kv(), std::logic_error);
  EXPECT_THROW(AttnBuffers(Problem::parse("b=1,h=2,s=5,d=64,dtype=bf16,causal=0"), Layout::kBHSD, {}, 1, false),
               std::logic_error);
}
}  // namespace test_reference
