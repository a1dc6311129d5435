#include "eval/attention_gpu.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iterator>
#include <memory>
#include <numeric>
#include <random>

#include <fmt/format.h>

#include "core/error.hpp"
#include "cuda/nvrtc.hpp"
#include "templates/common/dense_params.h"

namespace attntune {

namespace {

std::size_t rows_of(const Problem& p, bool kv) { return static_cast<std::size_t>(p.b) * (kv ? p.hkv : p.h) * (kv ? p.sk : p.s); }

void set_strides(long long* st, Layout layout, std::int64_t heads, std::int64_t len, std::int64_t d) {
  if (layout == Layout::kBHSD) {
    st[0] = heads * len * d; st[1] = len * d; st[2] = d;
  } else {
    st[0] = len * heads * d; st[1] = d; st[2] = heads * d;
  }
}

// attn_reference's grid: 8 query rows per CTA (of the longest sequence for a varlen batch: the
// CTAs past a shorter one's rows return at once), heads, sequences.
cuda::Dim3 reference_grid(const AttnBuffers& b) {
  const long long rows = b.problem.is_varlen() ? b.max_q : b.problem.s;
  return {static_cast<unsigned>(std::max(1LL, (rows + 7) / 8)), static_cast<unsigned>(b.problem.h),
          static_cast<unsigned>(b.problem.b)};
}

float as_float(unsigned bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// "sm_89" -> 89, "sm_90a" -> 90; 0 when it is no such name.
int arch_number(const std::string& arch) {
  if (arch.rfind("sm_", 0) != 0) return 0;
  int n = 0;
  for (std::size_t i = 3; i < arch.size() && arch[i] >= '0' && arch[i] <= '9'; ++i) n = n * 10 + (arch[i] - '0');
  return n;
}

// NaN in e4m3 (S.1111.111): what an FP8 cache's pages hold past each sequence's keys.
constexpr std::uint8_t kE4m3NanK = 0x7F, kE4m3NanV = 0xFF;

// The stream of draws of Q (0), K (1) or V (2) for inputs drawn from `seed` (Reference::fill).
unsigned long long stream_seed(std::uint64_t seed, int tensor) { return seed * 3 + tensor + 1; }

}  // namespace

const char* layout_name(Layout l) { return l == Layout::kBHSD ? "BHSD" : "BSHD"; }

std::vector<float> kv_descales(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> scale(0.25f, 2.f);
  std::vector<float> out(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)));
  for (float& x : out) x = scale(rng);
  return out;
}

void check_device_serves(const Problem& p, const std::string& arch) {
  if ((p.kv_fp8 || p.qkv_fp8) && arch_number(arch) < 89)
    throw InputError(fmt::format("{}: {} needs a GPU of compute capability 8.9 or newer (sm_89+: the e4m3 "
                                 "conversions); this device is {}",
                                 p.str(),
                                 p.qkv_fp8 ? "an FP8 forward (dtype=fp8)" : "an FP8 e4m3 KV cache (kv_dtype=fp8)",
                                 arch));
}

std::vector<float> sink_logits(std::int64_t heads, std::uint64_t seed) {
  std::mt19937_64 rng(seed * 7 + 11);
  std::uniform_real_distribution<float> moderate(-2.f, 10.f);
  std::vector<float> out;
  for (std::int64_t h = 0; h < heads; ++h) {
    switch (h % 4) {
      case 1: out.push_back(-1e4f); break;
      case 2: out.push_back(1e3f); break;
      default: out.push_back(moderate(rng)); break;
    }
  }
  return out;
}

AttnBuffers::AttnBuffers(const Problem& p, Layout l, std::vector<int> lens, std::uint64_t table_seed,
                         bool contiguous)
    : problem(p), layout(l), seqlens(std::move(lens)), contiguous_kv(contiguous) {
  if (!contiguous_kv && !p.paged())
    throw std::logic_error("AttnBuffers: only a paged problem's keys live in its pages alone (" + p.str() + ")");
  if (p.latent && (p.is_varlen() || !p.split_dims() || p.dv > p.d))
    throw std::logic_error("AttnBuffers: a latent problem needs dv < d and no varlen (" + p.str() + ")");
  if (p.kv_fp8 && p.is_varlen())
    throw std::logic_error("AttnBuffers: an FP8 KV cache with varlen (" + p.str() + ")");
  if (p.backward && (p.paged() || p.latent || p.kv_fp8 || p.split_dims()))
    throw std::logic_error("AttnBuffers: the backward pass of dense or packed tensors of one head dim only (" + p.str() +
                           ")");
  if (p.sinks) {
    sink_values = sink_logits(p.h, table_seed);
    sinks = cuda::DeviceBuffer(sink_values.size() * sizeof(float));
    sinks.upload(sink_values.data(), sink_values.size() * sizeof(float));
  }
  if (p.qkv_fp8 && (p.is_varlen() || p.paged() || p.latent || p.backward))
    throw std::logic_error("AttnBuffers: an FP8 forward of dense tensors only (" + p.str() + ")");
  if (p.qkv_fp8) {
    q_descale_values = kv_descales(p.b * p.hkv, kDescaleSeedQ);
    q_descale = cuda::DeviceBuffer(q_descale_values.size() * sizeof(float));
    q_descale.upload(q_descale_values.data(), q_descale_values.size() * sizeof(float));
  }
  if (p.kv_fp8 || p.qkv_fp8) {
    // [b, hkv] scales for K and for V (fixed seeds: the same tables for every candidate).
    k_descale_values = kv_descales(p.b * p.hkv, kDescaleSeedK);
    v_descale_values = kv_descales(p.b * p.hkv, kDescaleSeedV);
    k_descale = cuda::DeviceBuffer(k_descale_values.size() * sizeof(float));
    k_descale.upload(k_descale_values.data(), k_descale_values.size() * sizeof(float));
    v_descale = cuda::DeviceBuffer(v_descale_values.size() * sizeof(float));
    v_descale.upload(v_descale_values.data(), v_descale_values.size() * sizeof(float));
  }
  if (p.is_varlen()) {
    // A packed batch: prefix sums of the rows, then [total + guard, heads, d] tensors.
    // Lengths given make the batch: problem.b is their count.
    if (seqlens.empty()) seqlens = p.q_lens();
    if (seqlens.empty()) throw std::logic_error("AttnBuffers: a varlen batch of no sequences");
    problem.b = static_cast<std::int64_t>(seqlens.size());
    cu_q.assign(1, 0);
    cu_k.assign(1, 0);
    for (int len : seqlens) {
      if (len < 0 || len > p.s) throw std::logic_error("AttnBuffers: a varlen length outside 0..s");
      const int len_k = len + static_cast<int>(p.sk - p.s);  // varlen problems have sk >= s
      cu_q.push_back(cu_q.back() + len);
      cu_k.push_back(cu_k.back() + len_k);
      max_q = std::max(max_q, len);
      max_k = std::max(max_k, len_k);
    }
    total_q = cu_q.back();
    total_k = cu_k.back();
    const auto bytes = [&](long long rows, std::int64_t heads, std::int64_t d) {
      return static_cast<std::size_t>(rows + kGuardRows) * static_cast<std::size_t>(heads * d) * 2;
    };
    q = cuda::DeviceBuffer(bytes(total_q, p.h, p.d));
    k = cuda::DeviceBuffer(bytes(total_k, p.hkv, p.d));
    v = cuda::DeviceBuffer(bytes(total_k, p.hkv, p.head_dim_v()));
    o = cuda::DeviceBuffer(std::max<std::size_t>(out_rows(), 1) * p.head_dim_v() * 2);
    lse = cuda::DeviceBuffer(std::max<std::size_t>(out_rows(), 1) * sizeof(float));
    if (p.backward) {  // dO as O; dQ, dK, dV as Q, K, V (the packed rows and the guard rows)
      dout = cuda::DeviceBuffer(std::max<std::size_t>(out_rows(), 1) * p.head_dim_v() * 2);
      dq = cuda::DeviceBuffer(bytes(total_q, p.h, p.d));
      dk = cuda::DeviceBuffer(bytes(total_k, p.hkv, p.d));
      dv = cuda::DeviceBuffer(bytes(total_k, p.hkv, p.head_dim_v()));
    }
    cu_seqlens_q = cuda::DeviceBuffer(cu_q.size() * sizeof(int));
    cu_seqlens_q.upload(cu_q.data(), cu_q.size() * sizeof(int));
    cu_seqlens_k = cuda::DeviceBuffer(cu_k.size() * sizeof(int));
    cu_seqlens_k.upload(cu_k.data(), cu_k.size() * sizeof(int));
    return;
  }
  // K and V: kv_elem_bytes() an element (1: an FP8 cache); Q and O 16-bit.
  const std::size_t kv_bytes = kv_elem_bytes();
  q = cuda::DeviceBuffer(rows_of(p, false) * p.d * q_elem_bytes());
  if (p.qkv_fp8) {  // V^T, [b, hkv, dv, vt_ld]: the keys contiguous, each row padded to 16 bytes
    vt_ld = std::max<long long>(16, (p.sk + 15) / 16 * 16);
    vt = cuda::DeviceBuffer(static_cast<std::size_t>(p.b * p.hkv * p.head_dim_v()) * static_cast<std::size_t>(vt_ld));
  }
  if (contiguous_kv) {
    k = cuda::DeviceBuffer(rows_of(p, true) * p.d * kv_bytes);
    // A latent problem has no V of its own: V is K's first dv columns (params() and call() pass k).
    if (!p.latent) v = cuda::DeviceBuffer(rows_of(p, true) * p.head_dim_v() * kv_bytes);
  }
  o = cuda::DeviceBuffer(rows_of(p, false) * p.head_dim_v() * 2);
  lse = cuda::DeviceBuffer(rows_of(p, false) * sizeof(float));
  if (p.backward) {  // dO as O; dQ, dK, dV as Q, K, V (dense, 16-bit)
    dout = cuda::DeviceBuffer(rows_of(p, false) * p.head_dim_v() * 2);
    dq = cuda::DeviceBuffer(rows_of(p, false) * p.d * 2);
    dk = cuda::DeviceBuffer(rows_of(p, true) * p.d * 2);
    dv = cuda::DeviceBuffer(rows_of(p, true) * p.head_dim_v() * 2);
  }
  if (!p.paged()) {
    if (!seqlens.empty()) throw std::logic_error("AttnBuffers: per-sequence lengths of a dense problem");
    return;
  }
  if (seqlens.empty()) seqlens.assign(static_cast<std::size_t>(p.b), static_cast<int>(p.sk));
  if (seqlens.size() != static_cast<std::size_t>(p.b)) throw std::logic_error("AttnBuffers: one length per sequence");
  for (int len : seqlens)
    if (len < 0 || len > p.sk) throw std::logic_error("AttnBuffers: a length outside 0..sk");
  // Every sequence's pages, then a few spare ones, in a random order: the table maps no sequence's
  // pages to consecutive memory (a serving engine's cache after a while).
  pages_per_seq = static_cast<int>((p.sk + p.page - 1) / p.page);
  num_pages = static_cast<int>(p.b) * pages_per_seq + 3;
  std::vector<int> order(static_cast<std::size_t>(num_pages));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(table_seed);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int> table(static_cast<std::size_t>(p.b) * pages_per_seq);
  std::copy(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(table.size()), table.begin());
  const std::size_t page_rows = static_cast<std::size_t>(p.page) * p.hkv;
  k_pages = cuda::DeviceBuffer(num_pages * page_rows * p.d * kv_bytes);
  if (!p.latent) v_pages = cuda::DeviceBuffer(num_pages * page_rows * p.head_dim_v() * kv_bytes);
  block_table = cuda::DeviceBuffer(table.size() * sizeof(int));
  block_table.upload(table.data(), table.size() * sizeof(int));
  cache_seqlens = cuda::DeviceBuffer(seqlens.size() * sizeof(int));
  cache_seqlens.upload(seqlens.data(), seqlens.size() * sizeof(int));
}

void AttnBuffers::drop_contiguous_kv() {
  if (!problem.paged()) throw std::logic_error("AttnBuffers: a dense problem's K and V are its only copy");
  k = cuda::DeviceBuffer();
  v = cuda::DeviceBuffer();
  contiguous_kv = false;
}

AttnParams AttnBuffers::params() const {
  AttnParams a{};
  a.q = reinterpret_cast<const void*>(q.ptr());
  a.k = reinterpret_cast<const void*>(k.ptr());
  a.v = reinterpret_cast<const void*>(v.ptr());
  a.o = reinterpret_cast<void*>(o.ptr());
  a.lse = reinterpret_cast<float*>(lse.ptr());
  if (problem.is_varlen()) {
    // One sequence of total rows: stride[0] is unused (0), the rows through stride[2].
    set_strides(a.q_stride, layout, problem.h, total_q, problem.d);
    set_strides(a.k_stride, layout, problem.hkv, total_k, problem.d);
    set_strides(a.v_stride, layout, problem.hkv, total_k, problem.head_dim_v());
    set_strides(a.o_stride, layout, problem.h, total_q, problem.head_dim_v());
    a.q_stride[0] = a.k_stride[0] = a.v_stride[0] = a.o_stride[0] = 0;
    a.seqlen_q = max_q;
    a.seqlen_k = max_k;
    a.cu_seqlens_q = reinterpret_cast<const int*>(cu_seqlens_q.ptr());
    a.cu_seqlens_k = reinterpret_cast<const int*>(cu_seqlens_k.ptr());
  } else {
    set_strides(a.q_stride, layout, problem.h, problem.s, problem.d);
    set_strides(a.k_stride, layout, problem.hkv, problem.sk, problem.d);
    set_strides(a.v_stride, layout, problem.hkv, problem.sk, problem.head_dim_v());
    set_strides(a.o_stride, layout, problem.h, problem.s, problem.head_dim_v());
    a.seqlen_q = static_cast<int>(problem.s);
    a.seqlen_k = static_cast<int>(problem.sk);
  }
  if (problem.latent) {  // V is K's first dv columns: the same buffer, K's strides
    a.v = a.k;
    std::copy(std::begin(a.k_stride), std::end(a.k_stride), std::begin(a.v_stride));
  }
  a.batch = static_cast<int>(problem.b);
  a.heads_q = static_cast<int>(problem.h);
  a.heads_kv = static_cast<int>(problem.hkv);
  a.q_per_kv = static_cast<int>(problem.h / problem.hkv);
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(problem.d)));
  a.scale_log2 = static_cast<float>(a.scale * 1.4426950408889634);
  a.variant.window_left = static_cast<int>(problem.window_left);
  a.variant.window_right = static_cast<int>(problem.window_right);
  a.variant.softcap = static_cast<float>(problem.softcap);
  a.variant.softcap_scale = problem.softcapped() ? a.scale / a.variant.softcap : 0.f;
  a.variant.sinks = problem.sinks ? reinterpret_cast<const float*>(sinks.ptr()) : nullptr;
  return a;
}

BwdParams AttnBuffers::bwd_params() const {
  BwdParams bp{};
  bp.fwd = params();
  bp.dout = reinterpret_cast<const void*>(dout.ptr());
  bp.dq = reinterpret_cast<void*>(dq.ptr());
  bp.dk = reinterpret_cast<void*>(dk.ptr());
  bp.dv = reinterpret_cast<void*>(dv.ptr());
  if (problem.is_varlen()) {  // the packed rows, stride[0] unused (0), as params()'
    set_strides(bp.do_stride, layout, problem.h, total_q, problem.head_dim_v());
    set_strides(bp.dq_stride, layout, problem.h, total_q, problem.d);
    set_strides(bp.dk_stride, layout, problem.hkv, total_k, problem.d);
    set_strides(bp.dv_stride, layout, problem.hkv, total_k, problem.head_dim_v());
    bp.do_stride[0] = bp.dq_stride[0] = bp.dk_stride[0] = bp.dv_stride[0] = 0;
    return bp;
  }
  set_strides(bp.do_stride, layout, problem.h, problem.s, problem.head_dim_v());
  set_strides(bp.dq_stride, layout, problem.h, problem.s, problem.d);
  set_strides(bp.dk_stride, layout, problem.hkv, problem.sk, problem.d);
  set_strides(bp.dv_stride, layout, problem.hkv, problem.sk, problem.head_dim_v());
  return bp;
}

// Every descale table's {batch, head} strides: {hkv, 1}, or {0, 0} with per_tensor_descale.
static void descale_strides(const AttnBuffers& b, int (&stride)[2]) {
  stride[0] = b.per_tensor_descale ? 0 : static_cast<int>(b.problem.hkv);
  stride[1] = b.per_tensor_descale ? 0 : 1;
}

const float* AttnBuffers::q_scale_table(long long (&stride)[2]) const {
  stride[0] = stride[1] = 0;
  if (!problem.qkv_fp8) return nullptr;
  int st[2];
  descale_strides(*this, st);
  stride[0] = st[0];
  stride[1] = st[1];
  return reinterpret_cast<const float*>(q_descale.ptr());
}

KvScales AttnBuffers::kv_scales() const {
  KvScales s{};
  if (!problem.kv_fp8 && !problem.qkv_fp8) return s;
  s.k_descale = reinterpret_cast<const float*>(k_descale.ptr());
  s.v_descale = reinterpret_cast<const float*>(v_descale.ptr());
  descale_strides(*this, s.k_descale_stride);
  descale_strides(*this, s.v_descale_stride);
  return s;
}

const int* AttnBuffers::seqlens_device() const {
  return problem.paged() ? reinterpret_cast<const int*>(cache_seqlens.ptr()) : nullptr;
}

std::size_t AttnBuffers::key_rows() const {
  return problem.is_varlen() ? static_cast<std::size_t>(problem.hkv) * static_cast<std::size_t>(total_k)
                             : static_cast<std::size_t>(problem.b * problem.hkv * problem.sk);
}

std::size_t AttnBuffers::out_rows() const {
  return problem.is_varlen() ? static_cast<std::size_t>(problem.h) * static_cast<std::size_t>(total_q)
                             : rows_of(problem, false);
}

attntune_plan::Call AttnBuffers::call() const {
  attntune_plan::Call c = attntune_plan::dense_call(params(), static_cast<int>(problem.d), problem.causal ? 1 : 0);
  c.head_dim_v = static_cast<int>(problem.head_dim_v());
  c.window_left = static_cast<int>(problem.window_left);
  c.window_right = static_cast<int>(problem.window_right);
  c.softcap = static_cast<float>(problem.softcap);
  c.sinks = problem.sinks ? reinterpret_cast<const float*>(sinks.ptr()) : nullptr;
  if (problem.kv_fp8 || problem.qkv_fp8) {
    // K and V in bytes: their strides (below, and dense_call's) count one-byte elements; their scales.
    const KvScales s = kv_scales();
    c.kv_fp8 = problem.kv_fp8 ? 1 : 0;
    c.k_descale = s.k_descale;
    c.v_descale = s.v_descale;
    for (int i = 0; i < 2; ++i) {
      c.k_descale_stride[i] = s.k_descale_stride[i];
      c.v_descale_stride[i] = s.v_descale_stride[i];
    }
  }
  if (problem.qkv_fp8) {
    // Q in bytes too, with its scales; V transposed: vt, strides {batch, head, value dim}.
    c.qkv_fp8 = 1;
    c.q_descale = q_scale_table(c.q_descale_stride);
    c.v = reinterpret_cast<const void*>(vt.ptr());
    c.v_stride[0] = problem.hkv * problem.head_dim_v() * vt_ld;
    c.v_stride[1] = problem.head_dim_v() * vt_ld;
    c.v_stride[2] = vt_ld;
    return c;
  }
  if (problem.backward) {
    // attntune_attention_backward(_varlen): out and lse (dense_call's) are the forward's O and LSE, read.
    const BwdParams bp = bwd_params();
    c.entry = attntune_plan::kEntryBackward;
    if (problem.is_varlen()) {  // params() already holds the packed strides and the longest lengths
      c.entry = attntune_plan::kEntryBackwardVarlen;
      c.cu_seqlens_q = reinterpret_cast<const int*>(cu_seqlens_q.ptr());
      c.cu_seqlens_k = reinterpret_cast<const int*>(cu_seqlens_k.ptr());
      c.total_q = total_q;
      c.total_k = total_k;
    }
    c.dout = bp.dout;
    c.dq = bp.dq;
    c.dk = bp.dk;
    c.dv = bp.dv;
    for (int i = 0; i < 3; ++i) {
      c.do_stride[i] = bp.do_stride[i];
      c.dq_stride[i] = bp.dq_stride[i];
      c.dk_stride[i] = bp.dk_stride[i];
      c.dv_stride[i] = bp.dv_stride[i];
    }
    return c;
  }
  if (problem.paged()) {
    c.entry = attntune_plan::kEntryKvcache;
    // Pages [num_pages, page, hkv, d] (V: dv): strides {page, head, row}.
    c.k = reinterpret_cast<const void*>(k_pages.ptr());
    c.v = reinterpret_cast<const void*>(v_pages.ptr());
    const long long dv = problem.head_dim_v(), k_row = problem.hkv * problem.d, v_row = problem.hkv * dv;
    c.k_stride[0] = problem.page * k_row;
    c.v_stride[0] = problem.page * v_row;
    c.k_stride[1] = problem.d;
    c.v_stride[1] = dv;
    c.k_stride[2] = k_row;
    c.v_stride[2] = v_row;
    c.cache_seqlens = seqlens_device();
    c.block_table = reinterpret_cast<const int*>(block_table.ptr());
    c.max_blocks_per_seq = pages_per_seq;
    c.page_size = static_cast<int>(problem.page);
    if (problem.latent) {  // one cache: V's pages are K's, read through K's strides
      c.v = c.k;
      std::copy(std::begin(c.k_stride), std::end(c.k_stride), std::begin(c.v_stride));
    }
  } else if (problem.is_varlen()) {
    // params() already holds the packed strides {0, head, row} and the longest lengths.
    c.entry = attntune_plan::kEntryVarlen;
    c.cu_seqlens_q = reinterpret_cast<const int*>(cu_seqlens_q.ptr());
    c.cu_seqlens_k = reinterpret_cast<const int*>(cu_seqlens_k.ptr());
    c.total_q = total_q;
    c.total_k = total_k;
  }
  return c;
}

std::vector<int> ragged_seqlens(const Problem& p, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int sk = static_cast<int>(p.sk);
  std::vector<int> lens;
  for (std::int64_t i = 0; i < p.b; ++i) {
    switch (i % 5) {
      case 0: lens.push_back(sk); break;
      case 1: lens.push_back(0); break;
      case 2: lens.push_back(std::min(sk, 1)); break;
      case 3: lens.push_back(std::min(sk, (sk / 2) | 1)); break;
      default: lens.push_back(static_cast<int>(rng() % static_cast<std::uint64_t>(sk)) + 1); break;
    }
  }
  return lens;
}

std::vector<int> varlen_ragged_lens(const Problem& p, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int s = static_cast<int>(p.s), cap = std::min(s, 1531);
  auto random = [&] { return static_cast<int>(rng() % static_cast<std::uint64_t>(cap)) + 1; };
  const int r1 = random(), r2 = random();
  return {0, s, std::min(s, 1), std::min(cap, (cap / 2) | 1), r1, r2, 0};
}

Problem odd_lengths(const Problem& p) {
  constexpr std::int64_t kMaxRows = 1531, kMaxExtraKeys = 1024;
  Problem q = p;
  q.b = 1;
  q.s = std::min(p.s, kMaxRows) | 1;
  const std::int64_t diff = p.sk - p.s;  // the keys' side of s, kept
  q.sk = q.s + std::clamp(diff, -(q.s - 1), kMaxExtraKeys);
  if (q.sk % 2 == 0) q.sk += diff > 0 ? 1 : -1;  // diff != 0 here: q.s is odd
  return q;
}

std::vector<std::unique_ptr<AttnBuffers>> validation_inputs(const Problem& p, std::uint64_t seed) {
  std::vector<std::unique_ptr<AttnBuffers>> out;
  if (p.backward && p.is_varlen()) {
    // The packed batch, then ragged lengths (empty sequences, one row, odd tails), as the forward's.
    out.push_back(std::make_unique<AttnBuffers>(p, Layout::kBSHD));
    std::vector<int> lens = varlen_ragged_lens(p, seed);
    Problem q = p;
    q.b = static_cast<std::int64_t>(lens.size());
    out.push_back(std::make_unique<AttnBuffers>(q, Layout::kBSHD, std::move(lens)));
    return out;
  }
  if (p.backward) {
    // The problem, then odd lengths (tails of every block size) unless it has them already.
    out.push_back(std::make_unique<AttnBuffers>(p, Layout::kBHSD));
    if (p.s % 2 == 0 || p.sk % 2 == 0) out.push_back(std::make_unique<AttnBuffers>(odd_lengths(p), Layout::kBHSD));
    return out;
  }
  if (p.is_varlen()) {
    out.push_back(std::make_unique<AttnBuffers>(p, Layout::kBSHD));
    std::vector<int> lens = varlen_ragged_lens(p, seed);
    Problem q = p;
    q.b = static_cast<std::int64_t>(lens.size());
    out.push_back(std::make_unique<AttnBuffers>(q, Layout::kBSHD, std::move(lens)));
    return out;
  }
  if (!p.paged()) {
    out.push_back(std::make_unique<AttnBuffers>(p, Layout::kBHSD));
    return out;
  }
  out.push_back(std::make_unique<AttnBuffers>(p, Layout::kBHSD, ragged_seqlens(p, seed), seed));
  if (p.b < 5) {
    Problem q = p;
    q.b = 5;
    q.sk = std::min<std::int64_t>(p.sk, 1531);
    out.push_back(std::make_unique<AttnBuffers>(q, Layout::kBHSD, ragged_seqlens(q, seed + 1), seed + 1));
  }
  return out;
}

double criterion_atol(DType t) {
  // FA3's test tolerance: twice the rounding error of the dtype near 0.3 (outputs are O(1)).
  return t == DType::kBf16 ? 1.0 / 512 : 1.0 / 4096;
}

std::string Verdict::detail() const {
  if (!grads.empty()) {
    // The backward pass: each gradient's figures, the failing ones first.
    std::string out = status + ":";
    for (const bool failing : {true, false})
      for (const GradVerdict& g : grads) {
        if ((g.status != "ok") != failing) continue;
        out += fmt::format(" {} {}: max|{}-ref|={:.3g} bound={:.3g} (2 x same-dtype error {:.3g} + atol), {} "
                           "non-finite;",
                           g.name, g.status, g.name, g.max_abs_err, g.err_bound, g.lowp_err, g.nonfinite);
      }
    out.pop_back();
    return out;
  }
  // The FP8 forward's LSE bound is its own (2 x the same-dtype LSE error + tolerance): said beside it.
  const std::string lse_bound_words =
      lse_lowp_err > 0 ? fmt::format(" (bound {:.3g}: 2 x same-dtype LSE error {:.3g} + tolerance)", lse_bound, lse_lowp_err)
                       : std::string();
  return fmt::format("{}: max|out-ref|={:.3g} bound={:.3g} (2 x same-dtype error {:.3g} + atol), lse error {:.3g}{}, "
                     "{} non-finite outputs, {} LSE mismatches",
                     status, max_abs_err, err_bound, lowp_err, lse_err, lse_bound_words, nonfinite, lse_mismatch);
}

Reference::Reference(const std::string& arch) : arch_(arch) {
  cuda::CompileOptions opts;
  opts.arch = arch;
  opts.extra = {"-std=c++17"};
  auto out = cuda::nvrtc_compile(flatten_includes("templates/reference/reference.cu"), "reference.cu", opts);
  if (!out.ok) throw std::logic_error("the reference kernels do not compile:\n" + out.log);
  module_ = cuda::Module(out.cubin);
  fill_ = module_.function("fill_normal");
  ref_ = module_.function("attn_reference");
  compare_ = module_.function("compare_outputs");
  scatter_ = module_.function("scatter_pages");
  fill_pages_ = module_.function("fill_pages_normal");
  fill_pages_e4m3_ = module_.function("fill_pages_normal_e4m3");
  // The FP8 cache's (templates/reference/reference.cu's header).
  fill_e4m3_ = module_.function("fill_normal_e4m3");
  ref_fp8_ = module_.function("attn_reference_kv_fp8");
  ref_qkv_fp8_ = module_.function("attn_reference_qkv_fp8");
  transpose_e4m3_ = module_.function("transpose_e4m3");
  scatter_e4m3_ = module_.function("scatter_pages_e4m3");
  quantize_e4m3_ = module_.function("quantize_e4m3");
  dequantize_e4m3_ = module_.function("dequantize_e4m3");
  // The backward pass's (the header's second part).
  bwd_rowdot_ = module_.function("attn_bwd_rowdot");
  bwd_dq_ = module_.function("attn_reference_bwd_dq");
  bwd_dkdv_ = module_.function("attn_reference_bwd_dkdv");
  compare_grad_ = module_.function("compare_grad");
  store_rounded_ = module_.function("store_rounded");
}

void Reference::fill(AttnBuffers& b, std::uint64_t seed) const {
  check_device_serves(b.problem, arch_);
  int bf16 = b.problem.dtype == DType::kBf16;
  cuda::DeviceBuffer* bufs[3] = {&b.q, &b.k, &b.v};
  // A latent problem's V is K; a paged problem without contiguous K and V draws them into its pages
  // (below).
  for (int i = 0; i < (!b.contiguous_kv ? 1 : b.problem.latent ? 2 : 3); ++i) {
    CUdeviceptr ptr = bufs[i]->ptr();
    if ((i > 0 && b.problem.kv_fp8) || b.problem.qkv_fp8) {
      // An FP8 cache's K or V (an FP8 forward's Q too): the draws a 16-bit one would hold, rounded to
      // e4m3 (no varlen here).
      long long n = static_cast<long long>(bufs[i]->bytes());
      unsigned long long s = stream_seed(seed, i);
      float mean = i == 2 ? b.v_mean : 0.f;
      void* args[] = {&ptr, &n, &s, &mean};
      cuda::launch(fill_e4m3_, {1024, 1, 1}, {256, 1, 1}, 0, nullptr, args);
      continue;
    }
    long long n = static_cast<long long>(bufs[i]->bytes() / 2);
    if (b.problem.is_varlen()) {
      // The packed rows; the guard rows after them NaN.
      bufs[i]->fill_u16(0xFFFF);
      n -= static_cast<long long>(AttnBuffers::kGuardRows) * (i == 0 ? b.problem.h : b.problem.hkv) *
           (i == 2 ? b.problem.head_dim_v() : b.problem.d);
    }
    unsigned long long s = stream_seed(seed, i);
    void* args[] = {&ptr, &n, &s, &bf16};
    cuda::launch(fill_, {1024, 1, 1}, {256, 1, 1}, 0, nullptr, args);
  }
  if (b.problem.qkv_fp8) {
    // V as the kernels read it, transposed; the bytes past each row's keys NaN (never read).
    b.vt.fill_u8(kE4m3NanK);
    const AttnParams a = b.params();
    CUdeviceptr src = b.v.ptr(), dst = b.vt.ptr();
    long long s0 = a.v_stride[0], s1 = a.v_stride[1], s2 = a.v_stride[2];
    int batch = static_cast<int>(b.problem.b), heads = static_cast<int>(b.problem.hkv),
        rows = static_cast<int>(b.problem.sk), dim = static_cast<int>(b.problem.head_dim_v()),
        ld = static_cast<int>(b.vt_ld);
    void* args[] = {&src, &s0, &s1, &s2, &dst, &batch, &heads, &rows, &dim, &ld};
    cuda::launch(transpose_e4m3_, {1024, 1, 1}, {256, 1, 1}, 0, nullptr, args);
  }
  if (b.problem.backward) {
    // dO: its own stream of draws (a tag, not seed * 3 + 4, which is the next seed's q).
    CUdeviceptr ptr = b.dout.ptr();
    long long n = static_cast<long long>(b.dout.bytes() / 2);
    unsigned long long s = seed ^ 0x644f644f644f644full;
    void* args[] = {&ptr, &n, &s, &bf16};
    cuda::launch(fill_, {1024, 1, 1}, {256, 1, 1}, 0, nullptr, args);
    fill_forward(b, seed);
  }
  if (b.problem.paged()) {
    // The pages: NaN, then every sequence's keys scattered through its table. An FP8 cache's NaN is
    // a byte, both of e4m3's (K's pages 0x7F, V's 0xFF).
    if (b.problem.kv_fp8) {
      b.k_pages.fill_u8(kE4m3NanK);
      if (!b.problem.latent) b.v_pages.fill_u8(kE4m3NanV);
    } else {
      b.k_pages.fill_u16(0xFFFF);
      if (!b.problem.latent) b.v_pages.fill_u16(0xFFFF);
    }
    const AttnParams a = b.params();
    CUdeviceptr kp = b.k_pages.ptr(), vp = b.v_pages.ptr(), table = b.block_table.ptr(), lens = b.cache_seqlens.ptr();
    // A latent cache scatters K alone (dv 0: no V pages; V is read from K's).
    int page = static_cast<int>(b.problem.page), pages_per_seq = b.pages_per_seq, d = static_cast<int>(b.problem.d),
        dv = b.problem.latent ? 0 : static_cast<int>(b.problem.head_dim_v());
    if (b.contiguous_kv) {
      void* args[] = {const_cast<AttnParams*>(&a), &d, &dv, &kp, &vp, &table, &lens, &page, &pages_per_seq};
      cuda::launch(b.problem.kv_fp8 ? scatter_e4m3_ : scatter_, {1024, 1, 1}, {256, 1, 1}, 0, nullptr, args);
    } else {
      // The same values, drawn where they go: K's and V's streams as the loop above draws them.
      unsigned long long seed_k = stream_seed(seed, 1), seed_v = stream_seed(seed, 2);
      float v_mean = b.v_mean;
      void* last = b.problem.kv_fp8 ? static_cast<void*>(&v_mean) : static_cast<void*>(&bf16);
      void* args[] = {const_cast<AttnParams*>(&a), &d, &dv, &kp, &vp, &table, &lens, &page, &pages_per_seq,
                      &seed_k, &seed_v, last};
      cuda::launch(b.problem.kv_fp8 ? fill_pages_e4m3_ : fill_pages_, {1024, 1, 1}, {256, 1, 1}, 0, nullptr, args);
    }
  }
  poison_output(b);
}

void Reference::poison_output(AttnBuffers& b) const {
  if (b.problem.backward) {  // o and lse are inputs: the gradients are what a candidate writes
    b.dq.fill_u16(0xFFFF);
    b.dk.fill_u16(0xFFFF);
    b.dv.fill_u16(0xFFFF);
    return;
  }
  b.o.fill_u16(0xFFFF);   // NaN in fp16 and bf16
  b.lse.fill_u32(0x7FC00000u);  // NaN
}

void Reference::fill_forward(AttnBuffers& b, std::uint64_t seed) const {
  const Problem& p = b.problem;
  const std::size_t rows = b.out_rows(), dv_elems = static_cast<std::size_t>(p.head_dim_v());
  if (!b.forward_seed || *b.forward_seed != seed) {
    // The fp32 reference forward of the inputs just drawn (its LSE straight into lse: [b, h, s]
    // contiguous, as the call reads it), O rounded to the dtype through o's strides; both kept.
    cuda::DeviceBuffer out(std::max<std::size_t>(rows, 1) * dv_elems * 4);
    CUdeviceptr o32 = out.ptr();
    launch_forward(b, false, o32, b.lse.ptr());
    const AttnParams a = b.params();
    int dv = static_cast<int>(dv_elems), bf16 = p.dtype == DType::kBf16;
    CUdeviceptr dst = b.o.ptr();
    long long sb = a.o_stride[0], sh = a.o_stride[1], sr = a.o_stride[2];
    int batch = static_cast<int>(p.b), heads = static_cast<int>(p.h), len = static_cast<int>(p.s);
    if (p.is_varlen()) {  // the packed rows as one sequence ([heads, total_q] as the reference writes them)
      batch = 1;
      len = static_cast<int>(b.total_q);
      sb = 0;
    }
    void* sargs[] = {&o32, &dst, &sb, &sh, &sr, &batch, &heads, &len, &dv, &bf16};
    cuda::launch(store_rounded_, {1024, 1, 1}, {256, 1, 1}, 0, nullptr, sargs);
    b.forward_o.resize(b.o.bytes() / 2);
    b.forward_lse.resize(rows);
    b.o.download(b.forward_o.data(), b.o.bytes());
    b.lse.download(b.forward_lse.data(), rows * sizeof(float));
    b.forward_seed = seed;
    return;
  }
  b.o.upload(b.forward_o.data(), b.forward_o.size() * 2);
  b.lse.upload(b.forward_lse.data(), b.forward_lse.size() * sizeof(float));
}

void Reference::launch_forward(const AttnBuffers& b, bool lowp_flag, CUdeviceptr o, CUdeviceptr l) const {
  const Problem& p = b.problem;
  AttnParams a = b.params();
  int d = static_cast<int>(p.d), dv = static_cast<int>(p.head_dim_v()), bf16 = p.dtype == DType::kBf16,
      causal = p.causal, lowp = lowp_flag;
  CUdeviceptr lens = reinterpret_cast<CUdeviceptr>(b.seqlens_device());
  KvScales kv = b.kv_scales();
  long long qs[2];
  const float* q_scale = b.q_scale_table(qs);
  int qs0 = static_cast<int>(qs[0]), qs1 = static_cast<int>(qs[1]);
  // kv: attn_reference_kv_fp8's and attn_reference_qkv_fp8's only; q_scale, qs0, qs1 the latter's.
  void* args[] = {&a, &d, &dv, &bf16, &causal, &lowp, &o, &l, &lens, &kv, &q_scale, &qs0, &qs1};
  cuda::launch(reference_kernel(p), reference_grid(b), {256, 1, 1}, 0, nullptr, args);
}

std::vector<float> Reference::output(const AttnBuffers& b, bool lowp_flag, std::vector<float>* lse) const {
  const Problem& p = b.problem;
  const std::size_t rows = b.out_rows();
  const std::size_t dv_elems = static_cast<std::size_t>(p.head_dim_v());
  cuda::DeviceBuffer out(std::max<std::size_t>(rows, 1) * dv_elems * 4), lse_buf(std::max<std::size_t>(rows, 1) * 4);
  launch_forward(b, lowp_flag, out.ptr(), lse_buf.ptr());
  std::vector<float> host(rows * dv_elems);
  out.download(host.data(), host.size() * 4);
  if (lse) {
    lse->resize(rows);
    lse_buf.download(lse->data(), rows * 4);
  }
  return host;
}

void Reference::backward_reference(const AttnBuffers& b, bool lowp_flag, cuda::DeviceBuffer& o, cuda::DeviceBuffer& lse,
                                   cuda::DeviceBuffer& dsum, cuda::DeviceBuffer& dq, cuda::DeviceBuffer& dk,
                                   cuda::DeviceBuffer& dv) const {
  const Problem& p = b.problem;
  if (!p.backward) throw std::logic_error("Reference::backward_reference of a forward problem (" + p.str() + ")");
  const std::size_t rows_q = b.out_rows(), rows_k = b.key_rows();
  const std::size_t d_elems = static_cast<std::size_t>(p.d), dv_elems = static_cast<std::size_t>(p.head_dim_v());
  auto sized = [](cuda::DeviceBuffer& buf, std::size_t bytes) {
    if (buf.bytes() != std::max<std::size_t>(bytes, 4)) buf = cuda::DeviceBuffer(std::max<std::size_t>(bytes, 4));
  };
  sized(o, rows_q * dv_elems * 4);
  sized(lse, rows_q * 4);
  sized(dsum, rows_q * 4);
  sized(dq, rows_q * d_elems * 4);
  sized(dk, rows_k * d_elems * 4);
  sized(dv, rows_k * dv_elems * 4);
  // The reference's own forward of the inputs (never the candidate's o and lse inputs).
  CUdeviceptr op = o.ptr(), lp = lse.ptr();
  launch_forward(b, lowp_flag, op, lp);
  int d = static_cast<int>(d_elems), dvi = static_cast<int>(dv_elems), bf16 = p.dtype == DType::kBf16,
      causal = p.causal, lowp = lowp_flag;
  BwdParams bp = b.bwd_params();
  CUdeviceptr ds = dsum.ptr(), dqp = dq.ptr(), dkp = dk.ptr(), dvp = dv.ptr();
  void* rargs[] = {&bp, &dvi, &bf16, &op, &ds};
  cuda::launch(bwd_rowdot_, reference_grid(b), {256, 1, 1}, 0, nullptr, rargs);
  void* qargs[] = {&bp, &d, &dvi, &bf16, &causal, &lowp, &lp, &ds, &dqp};
  cuda::launch(bwd_dq_, reference_grid(b), {256, 1, 1}, 0, nullptr, qargs);
  void* kargs[] = {&bp, &d, &dvi, &bf16, &causal, &lowp, &lp, &ds, &dkp, &dvp};
  const std::int64_t keys = p.is_varlen() ? b.max_k : p.sk;  // varlen: the longest sequence's
  const cuda::Dim3 kv_grid = {static_cast<unsigned>(std::max<std::int64_t>(1, (keys + 7) / 8)),
                              static_cast<unsigned>(p.hkv), static_cast<unsigned>(p.b)};
  cuda::launch(bwd_dkdv_, kv_grid, {256, 1, 1}, 0, nullptr, kargs);
}

Reference::Gradients Reference::gradients(const AttnBuffers& b, bool lowp) const {
  cuda::DeviceBuffer o, lse, dsum, dq, dk, dv;
  backward_reference(b, lowp, o, lse, dsum, dq, dk, dv);
  const Problem& p = b.problem;
  Gradients g;
  g.dq.resize(b.out_rows() * static_cast<std::size_t>(p.d));
  g.dk.resize(b.key_rows() * static_cast<std::size_t>(p.d));
  g.dv.resize(b.key_rows() * static_cast<std::size_t>(p.head_dim_v()));
  dq.download(g.dq.data(), g.dq.size() * 4);
  dk.download(g.dk.data(), g.dk.size() * 4);
  dv.download(g.dv.data(), g.dv.size() * 4);
  return g;
}

std::vector<std::uint8_t> Reference::to_e4m3(const std::vector<float>& x) const {
  if (arch_number(arch_) < 89)
    throw InputError(fmt::format("the e4m3 conversion needs sm_89 or newer; this device is {}", arch_));
  std::vector<std::uint8_t> out(x.size());
  if (x.empty()) return out;
  cuda::DeviceBuffer in(x.size() * sizeof(float)), bytes(x.size());
  in.upload(x.data(), x.size() * sizeof(float));
  CUdeviceptr src = in.ptr(), dst = bytes.ptr();
  long long n = static_cast<long long>(x.size());
  void* args[] = {&src, &dst, &n};
  cuda::launch(quantize_e4m3_, {64, 1, 1}, {256, 1, 1}, 0, nullptr, args);
  bytes.download(out.data(), out.size());
  return out;
}

std::vector<float> Reference::from_e4m3(const std::vector<std::uint8_t>& x) const {
  std::vector<float> out(x.size());
  if (x.empty()) return out;
  cuda::DeviceBuffer bytes(x.size()), values(x.size() * sizeof(float));
  bytes.upload(x.data(), x.size());
  CUdeviceptr src = bytes.ptr(), dst = values.ptr();
  long long n = static_cast<long long>(x.size());
  void* args[] = {&src, &dst, &n};
  cuda::launch(dequantize_e4m3_, {64, 1, 1}, {256, 1, 1}, 0, nullptr, args);
  values.download(out.data(), out.size() * sizeof(float));
  return out;
}

Verdict Reference::check(const AttnBuffers& b) const { return ReferenceCache(*this, b, false).check(b); }

ReferenceCache::ReferenceCache(const Reference& ref, const AttnBuffers& b, bool keep_host_copy)
    : ref_(&ref), problem_(b.problem), seqlens_(b.seqlens), per_tensor_descale_(b.per_tensor_descale) {
  const Problem& p = b.problem;
  stats_ = cuda::DeviceBuffer(32);
  if (p.backward) {
    // Each reference from its own forward (fp32, then same-dtype), the fp32 one timed.
    cuda::DeviceBuffer o, lse, dsum;
    cuda::Event start, stop, done;
    start.record();
    ref.backward_reference(b, false, o, lse, dsum, grad32_[0], grad32_[1], grad32_[2]);
    stop.record();
    ref.backward_reference(b, true, o, lse, dsum, gradlow_[0], gradlow_[1], gradlow_[2]);
    done.record();
    done.synchronize();  // before o, lse and dsum go
    reference_us_ = cuda::elapsed_ms(start, stop) * 1000.0;
    if (keep_host_copy)
      for (int t = 0; t < 3; ++t) {
        host_grad32_[t].resize(grad32_[t].bytes() / 4);
        host_gradlow_[t].resize(gradlow_[t].bytes() / 4);
        grad32_[t].download(host_grad32_[t].data(), grad32_[t].bytes());
        gradlow_[t].download(host_gradlow_[t].data(), gradlow_[t].bytes());
      }
    return;
  }
  const std::size_t alloc_rows = std::max<std::size_t>(b.out_rows(), 1);
  const std::size_t dv_elems = static_cast<std::size_t>(p.head_dim_v());
  out32_ = cuda::DeviceBuffer(alloc_rows * dv_elems * 4);
  outlow_ = cuda::DeviceBuffer(alloc_rows * dv_elems * 4);
  lse32_ = cuda::DeviceBuffer(alloc_rows * 4);
  lselow_ = cuda::DeviceBuffer(alloc_rows * 4);
  cuda::Event start, stop;
  for (int lowp = 0; lowp < 2; ++lowp) {
    if (!lowp) start.record();
    ref.launch_forward(b, lowp, lowp ? outlow_.ptr() : out32_.ptr(), lowp ? lselow_.ptr() : lse32_.ptr());
    if (!lowp) stop.record();
  }
  stop.synchronize();
  reference_us_ = cuda::elapsed_ms(start, stop) * 1000.0;
  if (keep_host_copy) {
    host_out32_.resize(alloc_rows * dv_elems);
    host_outlow_.resize(alloc_rows * dv_elems);
    host_lse32_.resize(alloc_rows);
    host_lselow_.resize(alloc_rows);
    lselow_.download(host_lselow_.data(), host_lselow_.size() * 4);
    out32_.download(host_out32_.data(), host_out32_.size() * 4);
    outlow_.download(host_outlow_.data(), host_outlow_.size() * 4);
    lse32_.download(host_lse32_.data(), host_lse32_.size() * 4);
  }
}

void ReferenceCache::restore() {
  if (problem_.backward) {
    if (host_grad32_[0].empty()) throw std::logic_error("ReferenceCache::restore without a host copy");
    for (int t = 0; t < 3; ++t) {
      grad32_[t].upload(host_grad32_[t].data(), host_grad32_[t].size() * 4);
      gradlow_[t].upload(host_gradlow_[t].data(), host_gradlow_[t].size() * 4);
    }
    return;
  }
  if (host_out32_.empty()) throw std::logic_error("ReferenceCache::restore without a host copy");
  out32_.upload(host_out32_.data(), host_out32_.size() * 4);
  outlow_.upload(host_outlow_.data(), host_outlow_.size() * 4);
  lse32_.upload(host_lse32_.data(), host_lse32_.size() * 4);
  lselow_.upload(host_lselow_.data(), host_lselow_.size() * 4);
}

Verdict ReferenceCache::check(const AttnBuffers& b) const {
  const Problem& p = b.problem;
  if (!(p == problem_) || b.seqlens != seqlens_ ||
      ((p.kv_fp8 || p.qkv_fp8) && b.per_tensor_descale != per_tensor_descale_))
    throw std::logic_error(fmt::format("ReferenceCache for {} asked to check {}{}", problem_.str(), p.str(),
                                       !(p == problem_)          ? ""
                                       : b.seqlens != seqlens_ ? " with other lengths"
                                                               : " with the other form of descales"));
  if (p.backward) return check_gradients(b);
  AttnParams a = b.params();
  int d = static_cast<int>(p.head_dim_v()), bf16 = p.dtype == DType::kBf16;  // O's columns
  CUdeviceptr o32 = out32_.ptr(), olow = outlow_.ptr(), l32 = lse32_.ptr(), st = stats_.ptr();
  CUdeviceptr counts = st + 16;
  // The FP8 forward's LSE is bounded by the same-dtype reference's error (Verdict::lse_bound).
  CUdeviceptr llow = p.qkv_fp8 ? lselow_.ptr() : CUdeviceptr{0};
  stats_.fill_u32(0);
  void* cargs[] = {&a, &d, &bf16, &o32, &olow, &l32, &st, &counts, &llow};
  cuda::launch(ref_->compare_, {256, 1, 1}, {32, 8, 1}, 0, nullptr, cargs);
  unsigned host[8];
  stats_.download(host, sizeof host);
  Verdict v;
  v.max_abs_err = as_float(host[0]);
  v.lowp_err = as_float(host[1]);
  v.lse_err = as_float(host[2]);
  v.lse_lowp_err = p.qkv_fp8 ? as_float(host[3]) : 0.0;
  v.lse_bound = p.qkv_fp8 ? 2 * v.lse_lowp_err + kLseTolerance : kLseTolerance;
  v.nonfinite = host[4];
  v.lse_mismatch = host[5];
  v.err_bound = 2 * v.lowp_err + criterion_atol(p.dtype);
  if (v.nonfinite) v.status = "nan_or_unwritten";
  else if (v.max_abs_err > v.err_bound || v.lse_mismatch || v.lse_err > v.lse_bound) v.status = "wrong_result";
  else v.status = "ok";
  return v;
}

Verdict ReferenceCache::check_gradients(const AttnBuffers& b) const {
  const Problem& p = b.problem;
  const BwdParams bp = b.bwd_params();
  struct Tensor {
    const char* name;
    const void* ptr;
    const long long* stride;
    std::int64_t heads, len, dim;
  };
  const Tensor tensors[3] = {{"dq", bp.dq, bp.dq_stride, p.h, p.s, p.d},
                             {"dk", bp.dk, bp.dk_stride, p.hkv, p.sk, p.d},
                             {"dv", bp.dv, bp.dv_stride, p.hkv, p.sk, p.head_dim_v()}};
  Verdict v;
  const GradVerdict* worst = nullptr;  // the first failing, else the nearest its bound
  for (int t = 0; t < 3; ++t) {
    const Tensor& x = tensors[t];
    CUdeviceptr xp = reinterpret_cast<CUdeviceptr>(x.ptr), r32 = grad32_[t].ptr(), rlow = gradlow_[t].ptr(),
                st = stats_.ptr(), counts = st + 16;
    long long sb = x.stride[0], sh = x.stride[1], sr = x.stride[2];
    int batch = static_cast<int>(p.b), heads = static_cast<int>(x.heads), len = static_cast<int>(x.len),
        dim = static_cast<int>(x.dim), bf16 = p.dtype == DType::kBf16;
    if (p.is_varlen()) {  // the packed rows as one sequence, as the references hold them ([heads, total])
      batch = 1;
      len = static_cast<int>(t == 0 ? b.total_q : b.total_k);
      sb = 0;
    }
    stats_.fill_u32(0);
    void* args[] = {&xp, &sb, &sh, &sr, &batch, &heads, &len, &dim, &bf16, &r32, &rlow, &st, &counts};
    cuda::launch(ref_->compare_grad_, {256, 1, 1}, {32, 8, 1}, 0, nullptr, args);
    unsigned host[8];
    stats_.download(host, sizeof host);
    GradVerdict g;
    g.name = x.name;
    g.max_abs_err = as_float(host[0]);
    g.lowp_err = as_float(host[1]);
    g.nonfinite = host[4];
    g.err_bound = 2 * g.lowp_err + criterion_atol(p.dtype);
    g.status = g.nonfinite ? "nan_or_unwritten" : g.max_abs_err > g.err_bound ? "wrong_result" : "ok";
    v.nonfinite += g.nonfinite;
    v.grads.push_back(g);
  }
  // The verdict's figures: the first gradient with non-finite elements (as a forward's non-finite output
  // outranks a wrong one), else the first wrong one, else the one nearest its bound.
  for (const char* status : {"nan_or_unwritten", "wrong_result"})
    for (const GradVerdict& g : v.grads)
      if (!worst && g.status == status) worst = &g;
  if (!worst)
    for (const GradVerdict& g : v.grads)
      if (!worst || g.max_abs_err / g.err_bound > worst->max_abs_err / worst->err_bound) worst = &g;
  v.status = worst->status;
  v.max_abs_err = worst->max_abs_err;
  v.err_bound = worst->err_bound;
  v.lowp_err = worst->lowp_err;
  return v;
}

// A varlen batch in its packed layout ([total, heads, d]), the problem's own lengths.
TimingInputs::TimingInputs(const Reference& ref, const Problem& p, std::uint64_t seed)
    : buffers_(p, p.is_varlen() ? Layout::kBSHD : Layout::kBHSD, {}, 1, /*contiguous_kv=*/!p.paged()) {
  ref.fill(buffers_, seed);
}

TimingStats time_kernel(const LoadedBuild& k, const Reference& ref, const Problem& p, std::uint64_t seed, int max_reps,
                        double max_seconds, double min_seconds) {
  return time_kernel(k, TimingInputs(ref, p, seed), max_reps, max_seconds, min_seconds);
}

TimingStats time_kernel(const LoadedBuild& k, const TimingInputs& inputs, int max_reps, double max_seconds,
                        double min_seconds) {
  // Timed as PyTorch's peers and tools/compare_sdpa.py time a kernel, so the tuner's numbers, the
  // exported kernel's and SDPA's compare: launches captured in one CUDA graph; a sample is one
  // replay between two events, divided by the launches in it; replays first for ~50 ms, so the
  // clocks settle where they stay under back-to-back load. No CPU work between launches: launched
  // one by one from the host, a 5 µs kernel measured its launch cost (15-20% slower than the same
  // kernel exported and timed by graph replay, H100 2026-11-22), and synchronised launches let
  // the GPU boost between them. The peers capture 20 calls; a long kernel gets fewer (at least 2,
  // a replay >= ~1 ms), which amortises the replay's own few µs as well and keeps a candidate's
  // timing short.
  constexpr int kMaxGraphCalls = 20;   // compare_sdpa.py --calls, the PyTorch peers' default
  constexpr double kWarmUpUs = 50e3;
  const attntune_plan::Call call = inputs.buffers().call();
  cuda::Stream stream;
  cuda::Event start, stop;
  // Launch errors (bad geometry, too much shared memory) show here, before any capture.
  k.launch(call, stream.get());
  start.record(stream.get());
  for (int i = 0; i < 3; ++i) k.launch(call, stream.get());
  stop.record(stream.get());
  stop.synchronize();
  const double one_us = std::max(1e-3, cuda::elapsed_ms(start, stop) * 1000.0 / 3);
  const int calls = static_cast<int>(std::clamp(std::ceil(1000.0 / one_us), 2.0, double(kMaxGraphCalls)));
  const cuda::Graph graph(stream.get(), [&] {
    for (int i = 0; i < calls; ++i) k.launch(call, stream.get());
  });
  const int warm_replays = static_cast<int>(std::clamp(std::ceil(kWarmUpUs / (one_us * calls)), 3.0, 1000.0));
  for (int i = 0; i < warm_replays; ++i) graph.launch(stream.get());
  stream.synchronize();

  std::vector<double> times;
  const auto t0 = std::chrono::steady_clock::now();
  double last_median = -1;
  for (;;) {
    for (int r = 0; r < 5; ++r) {
      start.record(stream.get());
      graph.launch(stream.get());
      stop.record(stream.get());
      stop.synchronize();
      times.push_back(cuda::elapsed_ms(start, stop) * 1000.0 / calls);
    }
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const bool stable = times.size() >= 10 && last_median > 0 && std::abs(median - last_median) <= 0.01 * median;
    // max_seconds bounds it all; below min_seconds it goes on whatever the samples say.
    if (elapsed > max_seconds) break;
    if (elapsed >= min_seconds && (stable || static_cast<int>(times.size()) >= max_reps)) break;
    last_median = median;
  }
  std::sort(times.begin(), times.end());
  TimingStats st;
  st.count = static_cast<int>(times.size());
  st.median_us = times[times.size() / 2];
  st.min_us = times.front();
  st.max_us = times.back();
  double mean = 0;
  for (double t : times) mean += t;
  mean /= times.size();
  double var = 0;
  for (double t : times) var += (t - mean) * (t - mean);
  st.stdev_us = std::sqrt(var / times.size());
  return st;
}

}  // namespace attntune
