// The reference kernels against a CPU float64 attention on small shapes: the reference is what
// every candidate is judged by, so it is itself judged by something simpler.
#include <cmath>
#include <cstring>
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

// Plain float64 attention, output (b, h, s, d) contiguous.
std::vector<double> cpu_attention(const AttnBuffers& buf, std::vector<double>* lse) {
  const Problem& p = buf.problem;
  const AttnParams a = buf.params();
  auto q = download(buf.q, p.dtype), k = download(buf.k, p.dtype), v = download(buf.v, p.dtype);
  std::vector<double> out(p.b * p.h * p.s * p.d, 0.0);
  lse->assign(p.b * p.h * p.s, 0.0);
  const double scale = 1.0 / std::sqrt(double(p.d));
  for (int b = 0; b < p.b; ++b)
    for (int h = 0; h < p.h; ++h)
      for (int i = 0; i < p.s; ++i) {
        const int hk = h / (p.h / p.hkv);
        const long long limit = p.causal ? std::clamp<long long>(i + p.sk - p.s + 1, 0, p.sk) : p.sk;
        std::vector<double> s(limit);
        double mx = -INFINITY;
        for (long long j = 0; j < limit; ++j) {
          double acc = 0;
          for (int c = 0; c < p.d; ++c)
            acc += q[b * a.q_stride[0] + h * a.q_stride[1] + i * a.q_stride[2] + c] *
                   k[b * a.k_stride[0] + hk * a.k_stride[1] + j * a.k_stride[2] + c];
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (long long j = 0; j < limit; ++j) sum += std::exp(s[j] - mx);
        const long long row = (static_cast<long long>(b) * p.h + h) * p.s + i;
        (*lse)[row] = limit ? mx + std::log(sum) : -INFINITY;
        for (long long j = 0; j < limit; ++j) {
          const double pj = std::exp(s[j] - mx) / sum;
          for (int c = 0; c < p.d; ++c)
            out[row * p.d + c] += pj * v[b * a.v_stride[0] + hk * a.v_stride[1] + j * a.v_stride[2] + c];
        }
      }
  return out;
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
  std::vector<float> lse32;
  const auto want = cpu_attention(buf, &lse64);
  const auto got = ref.output(buf, false, &lse32);
  double err = 0, lse_err = 0;
  for (std::size_t i = 0; i < want.size(); ++i) err = std::max(err, std::abs(want[i] - got[i]));
  for (std::size_t i = 0; i < lse64.size(); ++i) {
    if (std::isinf(lse64[i])) {
      EXPECT_TRUE(std::isinf(lse32[i]) && lse32[i] < 0) << "row " << i << " sees no key: LSE must be -inf";
    } else {
      lse_err = std::max(lse_err, std::abs(lse64[i] - lse32[i]));
    }
  }
  EXPECT_LT(err, 2e-5) << GetParam().first;  // fp32 math on O(1) values over <= 300 keys
  EXPECT_LT(lse_err, 2e-5) << GetParam().first;
  // The same-dtype reference is worse than fp32 but still close: it is the criterion's yardstick.
  const auto low = ref.output(buf, true);
  double low_err = 0;
  for (std::size_t i = 0; i < want.size(); ++i) low_err = std::max(low_err, std::abs(want[i] - low[i]));
  EXPECT_GT(low_err, err) << "rounding to " << dtype_name(p.dtype) << " must cost accuracy";
  EXPECT_LT(low_err, p.dtype == DType::kBf16 ? 0.05 : 0.01);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ReferenceVsCpu,
    ::testing::Values(std::make_pair("b=1,h=2,s=37,d=64,dtype=bf16,causal=0", Layout::kBHSD),
                      std::make_pair("b=2,h=4,hkv=2,s=45,sk=70,d=128,dtype=fp16,causal=1", Layout::kBSHD),
                      std::make_pair("b=1,h=3,hkv=1,s=70,sk=33,d=64,dtype=bf16,causal=1", Layout::kBHSD),
                      std::make_pair("b=1,h=1,s=129,sk=300,d=256,dtype=fp16,causal=0", Layout::kBSHD)),
    [](const auto& info) { return "shape" + std::to_string(info.index) + "_" + layout_name(info.param.second); });
