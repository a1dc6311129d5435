// The backward pass's reference (pass=bwd, issue 45) against a CPU float64 backward on small odd
// shapes: the reference judges every backward candidate, so it is itself judged by something simpler.
// Also the inputs a backward candidate gets (q, k, v, dO drawn; O and LSE the fp32 forward's; dQ, dK,
// dV poisoned), the call, the validation inputs, and FA2's criterion on each gradient.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "eval/attention_gpu.hpp"
#include "gpu_env.hpp"

namespace test_reference_backward {
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
  if (exp == 0x1f) return man ? NAN : (sign ? -INFINITY : INFINITY);
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

// fp32 to bf16 bits, round to nearest even (finite values).
std::uint16_t bf16_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<std::uint16_t>(u >> 16);
}

// The float64 forward and backward of a dense problem, from the inputs as the device holds them:
// o (b, h, s, dv) and lse (b, h, s), then dq (b, h, s, d), dk (b, hkv, sk, d), dv (b, hkv, sk, dv),
// contiguous. Masks as docs/CONTRACT.md says (bottom-right causal and windows).
struct Cpu {
  std::vector<double> o, lse, dq, dk, dv;
};

Cpu cpu_backward(const AttnBuffers& buf) {
  const Problem& p = buf.problem;
  const BwdParams bp = buf.bwd_params();
  const AttnParams& a = bp.fwd;
  const auto q = download(buf.q, p.dtype), k = download(buf.k, p.dtype), v = download(buf.v, p.dtype),
             d_o = download(buf.dout, p.dtype);
  const long long d = p.d, dvd = p.head_dim_v(), lq = p.s, lk = p.sk, g = p.h / p.hkv;
  const double scale = 1.0 / std::sqrt(double(d));
  Cpu c;
  c.o.assign(p.b * p.h * lq * dvd, 0.0);
  c.lse.assign(p.b * p.h * lq, 0.0);
  c.dq.assign(p.b * p.h * lq * d, 0.0);
  c.dk.assign(p.b * p.hkv * lk * d, 0.0);
  c.dv.assign(p.b * p.hkv * lk * dvd, 0.0);
  const long long diag = lk - lq, right = p.right_bound();
  for (long long b = 0; b < p.b; ++b)
    for (long long h = 0; h < p.h; ++h) {
      const long long hk = h / g;
      auto qe = [&](long long i, long long x) { return q[b * a.q_stride[0] + h * a.q_stride[1] + i * a.q_stride[2] + x]; };
      auto ke = [&](long long j, long long x) { return k[b * a.k_stride[0] + hk * a.k_stride[1] + j * a.k_stride[2] + x]; };
      auto ve = [&](long long j, long long x) { return v[b * a.v_stride[0] + hk * a.v_stride[1] + j * a.v_stride[2] + x]; };
      auto de = [&](long long i, long long x) {
        return d_o[b * bp.do_stride[0] + h * bp.do_stride[1] + i * bp.do_stride[2] + x];
      };
      for (long long i = 0; i < lq; ++i) {
        const long long hi = right < 0 ? lk : std::clamp<long long>(i + diag + right + 1, 0, lk);
        const long long lo = p.window_left < 0 ? 0 : std::clamp<long long>(i + diag - p.window_left, 0, lk);
        const long long row = (b * p.h + h) * lq + i;
        if (lo >= hi) {  // sees no key: O 0, LSE -inf, no gradient
          c.lse[row] = -INFINITY;
          continue;
        }
        std::vector<double> s(hi - lo), pj(hi - lo), dp(hi - lo);
        double mx = -INFINITY;
        for (long long j = lo; j < hi; ++j) {
          double acc = 0;
          for (long long x = 0; x < d; ++x) acc += qe(i, x) * ke(j, x);
          s[j - lo] = acc * scale;
          mx = std::max(mx, s[j - lo]);
        }
        double sum = 0;
        for (double x : s) sum += std::exp(x - mx);
        c.lse[row] = mx + std::log(sum);
        for (long long j = lo; j < hi; ++j) {
          pj[j - lo] = std::exp(s[j - lo] - mx) / sum;
          for (long long x = 0; x < dvd; ++x) c.o[row * dvd + x] += pj[j - lo] * ve(j, x);
        }
        double dsum = 0;
        for (long long x = 0; x < dvd; ++x) dsum += de(i, x) * c.o[row * dvd + x];
        for (long long j = lo; j < hi; ++j) {
          double acc = 0;
          for (long long x = 0; x < dvd; ++x) acc += de(i, x) * ve(j, x);
          const double ds = pj[j - lo] * (acc - dsum);
          const long long krow = (b * p.hkv + hk) * lk + j;
          for (long long x = 0; x < d; ++x) {
            c.dq[row * d + x] += scale * ds * ke(j, x);
            c.dk[krow * d + x] += scale * ds * qe(i, x);
          }
          for (long long x = 0; x < dvd; ++x) c.dv[krow * dvd + x] += pj[j - lo] * de(i, x);
        }
      }
    }
  return c;
}

// max|got - want| / max(1e-3, max|want|): errors relative to the tensor's scale (gradients of different
// shapes differ by orders of magnitude), over want's elements.
template <class T>
double rel_err(const std::vector<T>& got, const std::vector<double>& want) {
  double err = 0, scale = 1e-3;
  for (std::size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(double(got.at(i)) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}

class ReferenceBackwardVsCpu : public ::testing::TestWithParam<std::pair<const char*, Layout>> {};

TEST_P(ReferenceBackwardVsCpu, MatchesFloat64) {
  ATTNTUNE_REQUIRE_GPU();
  cuda::Context ctx(0);
  Reference ref(cuda::device_props(0).arch);
  const char* spec = GetParam().first;
  const Problem p = Problem::parse(spec);
  ASSERT_TRUE(p.backward);
  AttnBuffers buf(p, GetParam().second);
  ref.fill(buf, 7);
  const Cpu want = cpu_backward(buf);
  // The inputs O and LSE: the forward of q, k and v (O rounded to the dtype, LSE fp32).
  const auto o = download(buf.o, p.dtype);
  std::vector<float> lse(buf.lse.bytes() / 4);
  buf.lse.download(lse.data(), buf.lse.bytes());
  const AttnParams a = buf.params();
  double o_err = 0, o_scale = 0, lse_err = 0;
  for (long long b = 0; b < p.b; ++b)
    for (long long h = 0; h < p.h; ++h)
      for (long long i = 0; i < p.s; ++i) {
        const long long row = (b * p.h + h) * p.s + i;
        if (std::isinf(want.lse[row])) {
          EXPECT_TRUE(std::isinf(lse[row]) && lse[row] < 0) << spec << ": row " << row << " sees no key";
        } else {
          lse_err = std::max(lse_err, std::abs(want.lse[row] - lse[row]));
        }
        for (long long x = 0; x < p.head_dim_v(); ++x) {
          const double w = want.o[row * p.head_dim_v() + x];
          o_err = std::max(o_err, std::abs(o[b * a.o_stride[0] + h * a.o_stride[1] + i * a.o_stride[2] + x] - w));
          o_scale = std::max(o_scale, std::abs(w));
        }
      }
  EXPECT_LT(lse_err, 2e-5) << spec;
  EXPECT_LE(o_err, o_scale * (p.dtype == DType::kBf16 ? 1.0 / 256 : 1.0 / 2048) + 1e-5) << spec;  // half an ulp
  // The gradients, fp32 and same-dtype; deterministic.
  const Reference::Gradients g32 = ref.gradients(buf, false), glow = ref.gradients(buf, true);
  const std::pair<const char*, std::pair<const std::vector<float>*, const std::vector<double>*>> grads[] = {
      {"dq", {&g32.dq, &want.dq}}, {"dk", {&g32.dk, &want.dk}}, {"dv", {&g32.dv, &want.dv}}};
  const std::vector<float>* lows[] = {&glow.dq, &glow.dk, &glow.dv};
  for (int t = 0; t < 3; ++t) {
    const auto& [name, pair] = grads[t];
    ASSERT_EQ(pair.first->size(), pair.second->size()) << spec << " " << name;
    const double err = rel_err(*pair.first, *pair.second);
    EXPECT_LT(err, 1e-4) << spec << " " << name;  // fp32 math, sums over <= 300 keys and rows
    const double low = rel_err(*lows[t], *pair.second);
    EXPECT_GT(low, err) << spec << " " << name << ": rounding to " << dtype_name(p.dtype) << " must cost accuracy";
    EXPECT_LT(low, p.dtype == DType::kBf16 ? 0.2 : 0.05) << spec << " " << name;
  }
  const Reference::Gradients again = ref.gradients(buf, false);
  EXPECT_EQ(again.dq, g32.dq) << spec;
  EXPECT_EQ(again.dk, g32.dk) << spec;
  EXPECT_EQ(again.dv, g32.dv) << spec;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ReferenceBackwardVsCpu,
    ::testing::Values(std::make_pair("b=1,h=2,s=37,d=64,dtype=bf16,causal=0,pass=bwd", Layout::kBHSD),
                      // GQA, causal bottom-right with s < sk; MQA with s > sk (the first rows see no key).
                      std::make_pair("b=2,h=4,hkv=2,s=45,sk=70,d=128,dtype=fp16,causal=1,pass=bwd", Layout::kBSHD),
                      std::make_pair("b=1,h=3,hkv=1,s=70,sk=33,d=64,dtype=bf16,causal=1,pass=bwd", Layout::kBHSD),
                      std::make_pair("b=1,h=2,s=129,sk=300,d=256,dtype=fp16,causal=0,pass=bwd", Layout::kBSHD),
                      // Windows: causal within 7 keys, two-sided with sk < s, and a long one over chunks
                      // of query rows that no key of a CTA sees (skipped).
                      std::make_pair("b=2,h=4,hkv=2,s=45,sk=70,d=64,dtype=bf16,causal=1,window=7,pass=bwd",
                                     Layout::kBHSD),
                      std::make_pair("b=1,h=2,s=90,sk=60,d=128,dtype=fp16,causal=0,window=5,9,pass=bwd",
                                     Layout::kBSHD),
                      std::make_pair("b=1,h=4,hkv=1,s=200,sk=151,d=64,dtype=bf16,causal=1,window=20,pass=bwd",
                                     Layout::kBHSD),
                      // A head dim of two column blocks (256 + 64).
                      std::make_pair("b=1,h=2,hkv=1,s=33,sk=41,d=320,dtype=bf16,causal=1,pass=bwd", Layout::kBHSD)),
    [](const auto& info) { return "shape" + std::to_string(info.index) + "_" + layout_name(info.param.second); });

// Writes fp32 gradients (contiguous) into buf's dq, dk, dv (bf16, through their strides), as a
// candidate would have written them.
void write_gradients(AttnBuffers& buf, const Reference::Gradients& g) {
  const Problem& p = buf.problem;
  ASSERT_EQ(p.dtype, DType::kBf16);
  const BwdParams bp = buf.bwd_params();
  auto put = [&](cuda::DeviceBuffer& dst, const std::vector<float>& src, const long long* st, long long heads,
                 long long len, long long dim) {
    std::vector<std::uint16_t> x(dst.bytes() / 2, 0xFFFF);
    for (long long b = 0; b < p.b; ++b)
      for (long long h = 0; h < heads; ++h)
        for (long long i = 0; i < len; ++i)
          for (long long c = 0; c < dim; ++c)
            x.at(static_cast<std::size_t>(b * st[0] + h * st[1] + i * st[2] + c)) =
                bf16_bits(src.at(static_cast<std::size_t>(((b * heads + h) * len + i) * dim + c)));
    dst.upload(x.data(), x.size() * 2);
  };
  put(buf.dq, g.dq, bp.dq_stride, p.h, p.s, p.d);
  put(buf.dk, g.dk, bp.dk_stride, p.hkv, p.sk, p.d);
  put(buf.dv, g.dv, bp.dv_stride, p.hkv, p.sk, p.head_dim_v());
}

// FA2's criterion on each gradient: the reference's own gradients pass, poisoned ones are non-finite
// (every element), and one gradient made wrong fails naming it, whichever it is.
TEST(ReferenceBackward, TheCriterionJudgesEachGradient) {
  ATTNTUNE_REQUIRE_GPU();
  cuda::Context ctx(0);
  Reference ref(cuda::device_props(0).arch);
  const Problem p = Problem::parse("b=2,h=4,hkv=2,s=77,sk=101,d=64,dtype=bf16,causal=1,pass=bwd");
  for (const Layout layout : {Layout::kBHSD, Layout::kBSHD}) {
    AttnBuffers buf(p, layout);
    ref.fill(buf, 3);
    ReferenceCache cache(ref, buf);
    EXPECT_GT(cache.reference_us(), 0);
    // Poisoned by fill: every element of all three.
    const Verdict poisoned = cache.check(buf);
    EXPECT_EQ(poisoned.status, "nan_or_unwritten") << poisoned.detail();
    ASSERT_EQ(poisoned.grads.size(), 3u);
    EXPECT_EQ(poisoned.nonfinite, static_cast<unsigned>((p.h * p.s + 2 * p.hkv * p.sk) * p.d * p.b));
    for (const GradVerdict& g : poisoned.grads) EXPECT_EQ(g.status, "nan_or_unwritten") << g.name;
    // The fp32 reference's gradients rounded to bf16: within the bound (rounding is what the same-dtype
    // reference does too).
    const Reference::Gradients g32 = ref.gradients(buf, false);
    write_gradients(buf, g32);
    const Verdict ok = cache.check(buf);
    EXPECT_EQ(ok.status, "ok") << ok.detail();
    EXPECT_EQ(ok.grads[0].name, "dq");
    EXPECT_EQ(ok.grads[1].name, "dk");
    EXPECT_EQ(ok.grads[2].name, "dv");
    for (const GradVerdict& g : ok.grads) {
      EXPECT_GT(g.lowp_err, 0) << g.name;
      EXPECT_LE(g.max_abs_err, g.err_bound) << g.name;
    }
    // One gradient wrong (a sign), the others right: that one fails, by name.
    for (int t = 0; t < 3; ++t) {
      Reference::Gradients bad = g32;
      std::vector<float>& x = t == 0 ? bad.dq : t == 1 ? bad.dk : bad.dv;
      for (float& e : x) e = -e;
      write_gradients(buf, bad);
      const Verdict v = cache.check(buf);
      const char* name = t == 0 ? "dq" : t == 1 ? "dk" : "dv";
      EXPECT_EQ(v.status, "wrong_result") << v.detail();
      EXPECT_EQ(v.grads[t].status, "wrong_result") << name;
      EXPECT_EQ(v.max_abs_err, v.grads[t].max_abs_err) << name;
      EXPECT_EQ(v.detail().rfind(std::string("wrong_result: ") + name + " wrong_result: max|" + name + "-ref|=", 0), 0u)
          << v.detail();
      for (int u = 0; u < 3; ++u) {
        if (u != t) {
          EXPECT_EQ(v.grads[u].status, "ok") << name;
        }
      }
    }
    // One element left unwritten (NaN) in dv alone.
    write_gradients(buf, g32);
    const std::uint16_t nan = 0xFFFF;
    buf.dv.upload(&nan, 2, 0);
    const Verdict unwritten = cache.check(buf);
    EXPECT_EQ(unwritten.status, "nan_or_unwritten") << unwritten.detail();
    EXPECT_EQ(unwritten.nonfinite, 1u);
    EXPECT_EQ(unwritten.grads[2].status, "nan_or_unwritten");
    // The cached references survive a restore.
    cache.restore();
    write_gradients(buf, g32);
    EXPECT_EQ(cache.check(buf).status, "ok");
    // Reference::check is the same comparison, with its own references.
    EXPECT_EQ(ref.check(buf).status, "ok");
  }
}

// What a backward candidate is given: fresh q, k, v and dO, O and LSE as the forward of them (the same
// again for the same seed, without the forward: from the host copy, even after a candidate wrote over
// them), and dQ, dK, dV poisoned; the call of attntune_attention_backward on them.
TEST(ReferenceBackward, InputsAndTheCall) {
  ATTNTUNE_REQUIRE_GPU();
  cuda::Context ctx(0);
  Reference ref(cuda::device_props(0).arch);
  const Problem p = Problem::parse("b=2,h=4,hkv=2,s=64,sk=96,d=128,dtype=fp16,causal=1,window=33,pass=bwd");
  AttnBuffers buf(p, Layout::kBHSD);
  ref.fill(buf, 5);
  const auto o1 = download(buf.o, p.dtype), dout1 = download(buf.dout, p.dtype), q1 = download(buf.q, p.dtype);
  std::vector<float> lse1(buf.lse.bytes() / 4);
  buf.lse.download(lse1.data(), buf.lse.bytes());
  // dO is a draw of its own, neither q's nor the next seed's q.
  EXPECT_NE(dout1, q1);
  for (cuda::DeviceBuffer* g : {&buf.dq, &buf.dk, &buf.dv})
    for (double x : download(*g, p.dtype)) ASSERT_TRUE(std::isnan(x));
  // A candidate that scribbled over its inputs: the next fill of the seed puts them back.
  buf.o.fill_u16(0x3C00);
  buf.lse.fill_u32(0);
  buf.dq.fill_u16(0);
  ref.fill(buf, 5);
  EXPECT_EQ(download(buf.o, p.dtype), o1);
  std::vector<float> lse2(buf.lse.bytes() / 4);
  buf.lse.download(lse2.data(), buf.lse.bytes());
  EXPECT_EQ(lse2, lse1);
  for (double x : download(buf.dq, p.dtype)) ASSERT_TRUE(std::isnan(x));
  // Another seed: other inputs, their own forward.
  ref.fill(buf, 6);
  EXPECT_NE(download(buf.o, p.dtype), o1);
  EXPECT_NE(download(buf.dout, p.dtype), dout1);
  AttnBuffers next(p, Layout::kBHSD);
  ref.fill(next, 6);
  EXPECT_EQ(download(next.o, p.dtype), download(buf.o, p.dtype));
  EXPECT_NE(download(next.q, p.dtype), dout1);  // seed 6's q is not seed 5's dO

  const attntune_plan::Call c = buf.call();
  EXPECT_EQ(c.entry, attntune_plan::kEntryBackward);
  EXPECT_EQ(c.out, reinterpret_cast<void*>(buf.o.ptr()));
  EXPECT_EQ(c.lse, reinterpret_cast<float*>(buf.lse.ptr()));
  EXPECT_EQ(c.dout, reinterpret_cast<const void*>(buf.dout.ptr()));
  EXPECT_EQ(c.dq, reinterpret_cast<void*>(buf.dq.ptr()));
  EXPECT_EQ(c.dk, reinterpret_cast<void*>(buf.dk.ptr()));
  EXPECT_EQ(c.dv, reinterpret_cast<void*>(buf.dv.ptr()));
  const long long q_st[3] = {4 * 64 * 128, 64 * 128, 128}, k_st[3] = {2 * 96 * 128, 96 * 128, 128};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(c.do_stride[i], q_st[i]);
    EXPECT_EQ(c.dq_stride[i], q_st[i]);
    EXPECT_EQ(c.o_stride[i], q_st[i]);
    EXPECT_EQ(c.dk_stride[i], k_st[i]);
    EXPECT_EQ(c.dv_stride[i], k_st[i]);
  }
  EXPECT_EQ(c.batch, 2);
  EXPECT_EQ(c.heads_q, 4);
  EXPECT_EQ(c.heads_kv, 2);
  EXPECT_EQ(c.seqlen_q, 64);
  EXPECT_EQ(c.seqlen_k, 96);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.causal, 1);
  EXPECT_EQ(c.window_left, 33);
  EXPECT_EQ(c.window_right, -1);
  EXPECT_EQ(c.deterministic, 0);
  EXPECT_FLOAT_EQ(c.scale, static_cast<float>(1 / std::sqrt(128.0)));
}

// The problem, then one sequence of odd lengths (the kernels' tails), unless the problem's lengths are
// odd already.
TEST(ReferenceBackward, ValidationInputsAddOddLengths) {
  ATTNTUNE_REQUIRE_GPU();
  cuda::Context ctx(0);
  const Problem p = Problem::parse("b=2,h=8,hkv=2,s=4096,sk=8192,d=128,dtype=bf16,causal=1,window=511,pass=bwd");
  auto inputs = validation_inputs(p, 5);
  ASSERT_EQ(inputs.size(), 2u);
  EXPECT_EQ(inputs[0]->problem, p);
  EXPECT_EQ(inputs[0]->layout, Layout::kBHSD);
  EXPECT_EQ(inputs[1]->problem, odd_lengths(p));
  EXPECT_EQ(inputs[1]->problem.str(), "b=1,h=8,hkv=2,s=1531,sk=2555,d=128,dtype=bf16,causal=1,window=511,pass=bwd");
  EXPECT_EQ(validation_inputs(Problem::parse("b=1,h=2,s=37,sk=41,d=64,dtype=bf16,causal=0,pass=bwd"), 5).size(), 1u);
}

}  // namespace
}  // namespace test_reference_backward
