// The reference kernels against a CPU float64 attention on small shapes: the reference is what
// every candidate is judged by, so it is itself judged by something simpler.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "eval/attention_gpu.hpp"
#include "gpu_env.hpp"

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

// Compares the reference with the float64 one: fp32 within 2e-5, same-dtype worse but close.
void expect_matches(const Reference& ref, const AttnBuffers& buf, const std::vector<double>& want,
                    const std::vector<double>& lse64, const std::string& what) {
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
  EXPECT_LT(low_err, p.dtype == DType::kBf16 ? 0.05 : 0.01) << what;
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
