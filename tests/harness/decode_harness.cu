// Development harness for templates/flash_decode, independent of the tuner: nvcc-compiled per
// config with the tunables as -D flags (decode_build.sh writes them as the renderer would). Every
// launch goes through attntune_run::run_plan (templates/export/run_plan.cuh: the executor of
// templates/common/run_plan.h over the CUDA runtime) with a Call, so the family's plan and bind run
// exactly as in an export.
//
// Usage: decode_harness "NAME:b,h,hkv,s,sk[;...]" "MODES" [seconds] [checks]
//   MODES: comma list of dense (attntune_attention_forward, [b, h, s, d] tensors), kv (kvcache,
//   contiguous [b, sk, hkv, d] cache, q/out [b, s, h, d]) and pN (kvcache, pages of N keys,
//   [pages, N, hkv, d], a shuffled block table with unused pages).
//   seconds: timing samples per shape (default 1; 0 skips timing). checks: kv pairs checked per
//   run (default 6).
// Per shape and mode: correctness of a ragged run (kvcache: cache_seqlens cycling max, 0, 1, odd,
// max - 1; K/V past each length NaN-poisoned) and of the full-length run, against a host float64
// reference on a sample of (batch, kv head) pairs (every query head of the group, every query).
// Output and LSE are NaN-poisoned before each run and every element must be written. Tolerance:
// |out - ref| <= atol + rtol |ref| (bf16: 2^-9 + 2^-7 |ref|; fp16: 2^-11 + 2^-9 |ref|), |lse -
// ref| <= 1e-3 + 1e-5 |ref|; a row with no key must give exactly 0 and -inf. The inputs are
// multiples of 1/128 (exact in both dtypes) from a hash of each element's address, so the host
// regenerates them. Timing: a CUDA graph of 20 calls, replayed until `seconds` of samples, median
// per call; GB/s = (K + V + Q + O bytes) / time.
//
// Variants (issue 41): built with -DATT_WINDOW=1 / -DATT_SOFTCAP=1 / -DATT_SINKS=1 (EXTRA_DEFS of
// decode_build.sh), their values from the environment: DECODE_WINDOW="L" or "L,R" (-1 unbounded;
// a causal build's right side is the diagonal), DECODE_SOFTCAP=C, and for sinks the logits of
// sink_logit(h) (moderate ones, and -1e4 and 1e3 on a few heads). The reference applies them
// (FlashAttention's semantics, common/variants.cuh); with a window, K + V bytes count only the rows
// some query of each sequence sees (Problem::bytes), so GB/s compares with a plain kernel reading
// as many.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

// Per-CTA start and end times (globaltimer, ns) of the main kernel, for the "trace" line: when the
// CTAs start (launch ramp) and how unevenly they finish (tail).
__device__ unsigned long long g_trace[2 * 65536];
__device__ __forceinline__ unsigned long long trace_clock() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#define DECODE_TRACE(w)                                                                              \
  do {                                                                                               \
    if (threadIdx.x == 0) {                                                                          \
      const unsigned bid_ = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);          \
      if (bid_ < 65536) g_trace[2 * bid_ + (w)] = trace_clock();                                    \
    }                                                                                                \
  } while (0)

#include "../../templates/flash_decode/kernel.cu"
#include "../../templates/flash_decode/launch.h"
#include "../../templates/export/run_plan.cuh"

#define CK(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      std::printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__,        \
                  cudaGetErrorString(e_));                                                         \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

namespace {

constexpr int kD = ATT_HEAD_DIM;
constexpr bool kBf16 = ATT_DTYPE_BF16 != 0;
constexpr bool kCausal = ATT_CAUSAL != 0;

// The variants' run-time values (DECODE_WINDOW, DECODE_SOFTCAP; see the header).
struct VariantValues {
  int left = -1, right = -1;
  float softcap = 0.f;
};
VariantValues variant_values() {
  VariantValues v;
  if (const char* w = std::getenv("DECODE_WINDOW")) {
    if (std::sscanf(w, "%d,%d", &v.left, &v.right) < 1) {
      std::printf("bad DECODE_WINDOW '%s' (L or L,R)\n", w);
      std::exit(2);
    }
  }
  if (kCausal) v.right = -1;  // the diagonal bounds it (normalise_variants' form)
  if (const char* c = std::getenv("DECODE_SOFTCAP")) v.softcap = static_cast<float>(std::atof(c));
  if (ATT_WINDOW && v.left < 0 && v.right < 0) {
    std::printf("a window build needs DECODE_WINDOW=L[,R]\n");
    std::exit(2);
  }
  if (ATT_SOFTCAP && !(v.softcap > 0.f)) {
    std::printf("a soft-cap build needs DECODE_SOFTCAP=C > 0\n");
    std::exit(2);
  }
  return v;
}
const VariantValues kVariant = variant_values();

// Query head h's sink logit (sinks builds): mostly moderate, one head in 8 very negative (no
// effect) and one very large (the row's output ~0, LSE ~1e3).
float sink_logit(int h) { return h % 8 == 1 ? -1e4f : h % 8 == 2 ? 1e3f : static_cast<float>(h % 5) - 1.5f; }

// The keys row i of seqlen_q rows sees in a sequence of len keys: [begin, end) (bottom-right).
void row_keys(int i, int s, int len, int* begin, int* end) {
  const int diag = i + len - s;
  *begin = ATT_WINDOW && kVariant.left >= 0 ? std::min(len, std::max(0, diag - kVariant.left)) : 0;
  *end = kCausal ? std::min(len, std::max(0, diag + 1))
                 : (ATT_WINDOW && kVariant.right >= 0 ? std::min(len, std::max(0, diag + kVariant.right + 1)) : len);
}

__host__ __device__ inline uint32_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>(x ^ (x >> 31));
}
// Element `idx` of tensor `seed`: k / 128 * scale, k in [-128, 127] (exact in fp16 and bf16).
__host__ __device__ inline float value(uint32_t seed, uint64_t idx, float scale) {
  const int k = static_cast<int>(mix(idx * 0x100000001B3ull ^ (static_cast<uint64_t>(seed) << 40)) & 255) - 128;
  return static_cast<float>(k) * (scale / 128.f);
}
__host__ __device__ inline uint16_t to_bits(float f) {
  // f is exact in the 16-bit type (a multiple of 1/128 times a power of two, |k| <= 128).
  union {
    float f;
    uint32_t u;
  } cvt;
  cvt.f = f;
  const uint32_t u = cvt.u;
  if (kBf16) return static_cast<uint16_t>(u >> 16);
  // fp16 from an exactly representable float (normal range): rebias the exponent.
  if (f == 0.f) return static_cast<uint16_t>((u >> 16) & 0x8000);
  const uint32_t sign = (u >> 16) & 0x8000, exp = ((u >> 23) & 255) - 127 + 15, man = (u >> 13) & 0x3ff;
  return static_cast<uint16_t>(sign | (exp << 10) | man);
}
float from_bits(uint16_t b) {
  if (kBf16) {
    uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  const uint32_t sign = (b & 0x8000u) << 16, exp = (b >> 10) & 31, man = b & 0x3ff;
  uint32_t u;
  if (exp == 31) u = sign | 0x7f800000u | (man << 13);
  else if (exp == 0) {
    const float f = std::ldexp(static_cast<float>(man), -24);
    return (b & 0x8000u) ? -f : f;
  } else u = sign | ((exp - 15 + 127) << 23) | (man << 13);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

__global__ void fill_kernel(uint16_t* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = to_bits(value(seed, i, scale));
}
// K/V rows past each sequence's length become NaN: rows of `rows` x `heads` x d elements per
// `block` (a sequence when contiguous, a page when paged); valid[block] rows of it are in use.
__global__ void poison_kernel(uint16_t* p, size_t blocks, int rows, int heads, const int* valid) {
  const size_t per = size_t(rows) * heads * kD, n = blocks * per;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t blk = i / per;
    const int row = static_cast<int>((i % per) / (size_t(heads) * kD));
    if (row >= valid[blk]) p[i] = 0x7fff;  // NaN in both types
  }
}

uint16_t* device_tensor(size_t n, uint32_t seed, float scale) {
  uint16_t* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(n, 8) * 2));
  fill_kernel<<<1024, 256>>>(p, n, seed, scale);
  CK(cudaGetLastError());
  return p;
}

struct Shape {
  std::string name;
  int b, h, hkv, s, sk;
};

struct Mode {
  std::string name;
  int entry;      // kEntryDense or kEntryKvcache
  int page;       // 0: contiguous
};

const attntune_plan::Define kDefines[] = {
    {"ATT_HEAD_DIM", ATT_HEAD_DIM}, {"ATT_DTYPE_BF16", ATT_DTYPE_BF16}, {"ATT_CAUSAL", ATT_CAUSAL},
    {"ATT_WINDOW", ATT_WINDOW},     {"ATT_SOFTCAP", ATT_SOFTCAP},       {"ATT_SINKS", ATT_SINKS},
    {"BLOCK_M", BLOCK_M},           {"BLOCK_N", BLOCK_N},               {"THREADS", THREADS},
    {"SMEM_BYTES", SMEM_BYTES},     {"CTAS_PER_SM", CTAS_PER_SM},       {"COMBINE", COMBINE},
    {"COMBINE_KERNEL", COMBINE_KERNEL}, {"COMBINE_LAST_CTA", COMBINE_LAST_CTA},
    {"KV_LOAD", KV_LOAD},           {"KV_LOAD_CP_ASYNC", KV_LOAD_CP_ASYNC}, {"KV_LOAD_TMA", KV_LOAD_TMA},
    {"CLUSTER", CLUSTER},
};

// One problem instance on the device.
struct Problem {
  Shape sh;
  Mode mode;
  uint16_t *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float* lse = nullptr;
  float* d_sinks = nullptr;
  int* d_lens = nullptr;
  int* d_table = nullptr;
  int* d_valid = nullptr;
  std::vector<int> lens, table;
  long long qs[3], ks[3], os[3];
  size_t k_elems = 0, q_elems = 0;
  int mbps = 0, pages = 0;

  void free_all() {
    for (void* p : {(void*)q, (void*)k, (void*)v, (void*)o, (void*)lse, (void*)d_sinks, (void*)d_lens, (void*)d_table,
                    (void*)d_valid})
      if (p) cudaFree(p);
  }
};

void setup(Problem& P, const Shape& sh, const Mode& m, uint32_t seed) {
  P.sh = sh;
  P.mode = m;
  const long long b = sh.b, h = sh.h, hkv = sh.hkv, s = sh.s, sk = sh.sk;
  P.q_elems = size_t(b * h * s * kD);
  if (m.entry == attntune_plan::kEntryDense) {
    // [b, h, s, d] and [b, hkv, sk, d]
    P.qs[0] = h * s * kD, P.qs[1] = s * kD, P.qs[2] = kD;
    P.ks[0] = hkv * sk * kD, P.ks[1] = sk * kD, P.ks[2] = kD;
    P.k_elems = size_t(b * hkv * sk * kD);
  } else {
    // q/out [b, s, h, d]; cache [b, sk, hkv, d] or pages [pages, page, hkv, d]
    P.qs[0] = s * h * kD, P.qs[1] = kD, P.qs[2] = h * kD;
    if (m.page == 0) {
      P.ks[0] = sk * hkv * kD, P.ks[1] = kD, P.ks[2] = hkv * kD;
      P.k_elems = size_t(b * sk * hkv * kD);
    } else {
      P.mbps = static_cast<int>((sk + m.page - 1) / m.page);
      P.pages = static_cast<int>(b * P.mbps + 7);
      P.ks[0] = (long long)m.page * hkv * kD, P.ks[1] = kD, P.ks[2] = hkv * kD;
      P.k_elems = size_t(P.pages) * m.page * hkv * kD;
      std::vector<int> perm(P.pages);
      std::iota(perm.begin(), perm.end(), 0);
      std::mt19937 rng(seed);
      // DECODE_TABLE_IDENTITY=1: pages in order (a paged cache laid out as the contiguous one),
      // to tell the cost of scattered pages from the cost of the paged path.
      if (!std::getenv("DECODE_TABLE_IDENTITY")) std::shuffle(perm.begin(), perm.end(), rng);
      P.table.assign(perm.begin(), perm.begin() + b * P.mbps);
      CK(cudaMalloc(&P.d_table, P.table.size() * 4));
      CK(cudaMemcpy(P.d_table, P.table.data(), P.table.size() * 4, cudaMemcpyHostToDevice));
    }
  }
  std::memcpy(P.os, P.qs, sizeof P.qs);
  P.q = device_tensor(P.q_elems, seed * 4 + 1, 2.f);
  P.k = device_tensor(P.k_elems, seed * 4 + 2, 1.f);
  P.v = device_tensor(P.k_elems, seed * 4 + 3, 1.f);
  CK(cudaMalloc(&P.o, P.q_elems * 2));
  CK(cudaMalloc(&P.lse, std::max<size_t>(b * h * s, 1) * 4));
  CK(cudaMalloc(&P.d_lens, b * 4));
  if (ATT_SINKS) {
    std::vector<float> sinks(sh.h);
    for (int i = 0; i < sh.h; ++i) sinks[i] = sink_logit(i);
    CK(cudaMalloc(&P.d_sinks, sinks.size() * 4));
    CK(cudaMemcpy(P.d_sinks, sinks.data(), sinks.size() * 4, cudaMemcpyHostToDevice));
  }
  CK(cudaDeviceSynchronize());  // the fills ran on the legacy stream; the calls run on another
}

// Sets the sequence lengths (kvcache) and poisons K/V past them.
void set_lens(Problem& P, const std::vector<int>& lens) {
  P.lens = lens;
  if (P.mode.entry == attntune_plan::kEntryDense) return;
  CK(cudaMemcpy(P.d_lens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
}

// Refills K and V (undoing an earlier poisoning), then poisons what lies past the lengths.
void poison(Problem& P, uint32_t seed) {
  if (P.mode.entry == attntune_plan::kEntryDense) return;
  const int b = P.sh.b;
  fill_kernel<<<1024, 256>>>(P.k, P.k_elems, seed * 4 + 2, 1.f);
  fill_kernel<<<1024, 256>>>(P.v, P.k_elems, seed * 4 + 3, 1.f);
  std::vector<int> valid;
  int rows, blocks;
  if (P.mode.page == 0) {
    rows = P.sh.sk;
    blocks = b;
    valid = P.lens;
  } else {
    rows = P.mode.page;
    blocks = P.pages;
    valid.assign(P.pages, 0);
    for (int bb = 0; bb < b; ++bb)
      for (int j = 0; j < P.mbps; ++j)
        valid[P.table[size_t(bb) * P.mbps + j]] = std::min(std::max(P.lens[bb] - j * P.mode.page, 0), P.mode.page);
  }
  if (P.d_valid) cudaFree(P.d_valid);
  CK(cudaMalloc(&P.d_valid, valid.size() * 4));
  CK(cudaMemcpy(P.d_valid, valid.data(), valid.size() * 4, cudaMemcpyHostToDevice));
  poison_kernel<<<1024, 256>>>(P.k, blocks, rows, P.sh.hkv, P.d_valid);
  poison_kernel<<<1024, 256>>>(P.v, blocks, rows, P.sh.hkv, P.d_valid);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
}

attntune_plan::Call make_call(const Problem& P) {
  attntune_plan::Call c = attntune_plan::empty_call();
  c.entry = P.mode.entry;
  c.q = P.q;
  c.k = P.k;
  c.v = P.v;
  c.out = P.o;
  c.lse = P.lse;
  c.batch = P.sh.b;
  c.heads_q = P.sh.h;
  c.heads_kv = P.sh.hkv;
  c.seqlen_q = P.sh.s;
  c.seqlen_k = P.sh.sk;
  c.head_dim = kD;
  for (int i = 0; i < 3; ++i) {
    c.q_stride[i] = P.qs[i];
    c.k_stride[i] = P.ks[i];
    c.v_stride[i] = P.ks[i];
    c.o_stride[i] = P.os[i];
  }
  c.scale = 1.f / std::sqrt(static_cast<float>(kD));
  c.causal = kCausal;
  if (ATT_WINDOW) {
    c.window_left = kVariant.left;
    c.window_right = kVariant.right;
  }
  if (ATT_SOFTCAP) c.softcap = kVariant.softcap;
  if (ATT_SINKS) c.sinks = P.d_sinks;
  if (P.mode.entry == attntune_plan::kEntryKvcache) {
    c.cache_seqlens = P.d_lens;
    if (P.mode.page) {
      c.block_table = P.d_table;
      c.max_blocks_per_seq = P.mbps;
      c.page_size = P.mode.page;
    }
  }
  return c;
}

struct Runner {
  attntune_plan::Consts consts;
  const void* funcs[2];
  Runner() {
    attntune_plan::Why why;
    if (attntune_plan::kFlashDecode.load(kDefines, sizeof kDefines / sizeof kDefines[0], consts.bytes, &why)) {
      std::printf("load: %s\n", why.text);
      std::exit(1);
    }
    funcs[0] = reinterpret_cast<const void*>(&att::flash_decode);
    funcs[1] = reinterpret_cast<const void*>(&att::flash_decode_combine);
  }
  int run(const attntune_plan::Call& c, cudaStream_t stream, bool quiet = false) const {
    attntune_plan::Why why;
    why.text[0] = 0;
    const int r = attntune_run::run_plan(attntune_plan::kFlashDecode, consts.bytes, funcs, c, stream, &why);
    if (r && !quiet) std::printf("run_plan: %d: %s\n", r, why.text);
    return r;
  }
  int splits(const attntune_plan::Call& c) const {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    attntune_plan::Device dev{sms, nullptr, nullptr};
    attntune_plan::Plan plan;
    attntune_plan::Why why;
    if (attntune_plan::kFlashDecode.plan(consts.bytes, c, dev, &plan, &why) || plan.launches == 0) return 0;
    const int group = c.heads_q / c.heads_kv, rows = group * c.seqlen_q;
    const int rb = (rows + BLOCK_M - 1) / BLOCK_M;
    return static_cast<int>(plan.launch[0].grid[0] / rb);
  }
};

struct Check {
  double max_err = 0, max_lse_err = 0;
  long long bad = 0, nan = 0, checked = 0;
};

// Host float64 reference for kv pair (bb, kvh): every query head of the group, every query.
void check_pair(const Problem& P, int bb, int kvh, const std::vector<uint16_t>& out, const std::vector<float>& lse,
                uint32_t seed, Check* res) {
  const int sk = P.sh.sk, s = P.sh.s, group = P.sh.h / P.sh.hkv;
  const int len = P.mode.entry == attntune_plan::kEntryDense ? sk : P.lens[bb];
  std::vector<float> K(size_t(std::max(len, 1)) * kD), V(K.size());
  for (int j = 0; j < len; ++j) {
    long long base;
    if (P.mode.page) {
      const int page = P.table[size_t(bb) * P.mbps + j / P.mode.page];
      base = page * P.ks[0] + kvh * P.ks[1] + (j % P.mode.page) * P.ks[2];
    } else {
      base = bb * P.ks[0] + kvh * P.ks[1] + j * P.ks[2];
    }
    for (int c = 0; c < kD; ++c) {
      K[size_t(j) * kD + c] = value(seed * 4 + 2, uint64_t(base + c), 1.f);
      V[size_t(j) * kD + c] = value(seed * 4 + 3, uint64_t(base + c), 1.f);
    }
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(kD));
  const double atol = kBf16 ? 1.0 / 512 : 1.0 / 2048, rtol = kBf16 ? 1.0 / 128 : 1.0 / 512;
  std::vector<double> sc(std::max(len, 1));
  for (int g = 0; g < group; ++g) {
    const int hq = kvh * group + g;
    for (int i = 0; i < s; ++i) {
      const long long qb = bb * P.qs[0] + hq * P.qs[1] + i * P.qs[2];
      double qv[kD];
      for (int c = 0; c < kD; ++c) qv[c] = value(seed * 4 + 1, uint64_t(qb + c), 2.f);
      int first = 0, lim = 0;
      row_keys(i, s, len, &first, &lim);
      const bool none = first >= lim;  // the row sees no key
      double mx = -INFINITY;
      for (int j = first; j < lim; ++j) {
        double a = 0;
        for (int c = 0; c < kD; ++c) a += qv[c] * K[size_t(j) * kD + c];
        sc[j] = a * scale;
        if (ATT_SOFTCAP) sc[j] = kVariant.softcap * std::tanh(sc[j] / kVariant.softcap);
        mx = std::max(mx, sc[j]);
      }
      // A sink joins the denominator as exp(s_h - m), no value row.
      const double sink = ATT_SINKS ? sink_logit(hq) : -INFINITY;
      if (ATT_SINKS) mx = std::max(mx, sink);
      double sum = ATT_SINKS ? std::exp(sink - mx) : 0.0, ref[kD] = {};
      for (int j = first; j < lim; ++j) {
        const double p = std::exp(sc[j] - mx);
        sum += p;
        for (int c = 0; c < kD; ++c) ref[c] += p * V[size_t(j) * kD + c];
      }
      const long long ob = bb * P.os[0] + hq * P.os[1] + i * P.os[2];
      const size_t lrow = (size_t(bb) * P.sh.h + hq) * s + i;
      const bool lse_inf = none && !ATT_SINKS;  // LSE -inf: no key and no sink
      const double ref_lse = lse_inf ? -INFINITY : mx + std::log(sum);
      const float got_lse = lse[lrow];
      if (std::isnan(got_lse)) ++res->nan;
      if (lse_inf) {
        if (!(std::isinf(got_lse) && got_lse < 0)) ++res->bad;
      } else {
        const double e = std::fabs(got_lse - ref_lse);
        res->max_lse_err = std::max(res->max_lse_err, e);
        if (!(e <= 1e-3 + 1e-5 * std::fabs(ref_lse))) ++res->bad;
      }
      for (int c = 0; c < kD; ++c) {
        const double r = none ? 0.0 : ref[c] / sum;
        const float got = from_bits(out[size_t(ob) + c]);
        ++res->checked;
        if (std::isnan(got)) {
          ++res->nan;
          ++res->bad;
          continue;
        }
        const double e = std::fabs(got - r);
        res->max_err = std::max(res->max_err, e);
        if (none ? got != 0.f : !(e <= atol + rtol * std::fabs(r))) ++res->bad;
      }
    }
  }
}

// Runs once on poisoned outputs and checks: every element written, a sample of pairs right.
Check run_and_check(const Runner& R, Problem& P, int npairs, uint32_t seed, cudaStream_t stream, bool* ok) {
  Check res;
  CK(cudaMemsetAsync(P.o, 0xff, P.q_elems * 2, stream));
  CK(cudaMemsetAsync(P.lse, 0xff, size_t(P.sh.b) * P.sh.h * P.sh.s * 4, stream));
  if (R.run(make_call(P), stream)) {
    *ok = false;
    res.bad = -1;
    return res;
  }
  CK(cudaStreamSynchronize(stream));
  CK(cudaGetLastError());
  std::vector<uint16_t> out(P.q_elems);
  std::vector<float> lse(size_t(P.sh.b) * P.sh.h * P.sh.s);
  CK(cudaMemcpy(out.data(), P.o, out.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(lse.data(), P.lse, lse.size() * 4, cudaMemcpyDeviceToHost));
  // Every element written (NaN poison gone), except LSE -inf and NaN checks below.
  long long nan_out = 0, nan_lse = 0;
  for (uint16_t x : out) nan_out += std::isnan(from_bits(x));
  for (float x : lse) nan_lse += std::isnan(x);
  // Sampled pairs: the first 5 batches (the ragged pattern), the last, random ones.
  std::vector<std::pair<int, int>> pairs;
  std::mt19937 rng(seed * 7 + 3);
  for (int i = 0; i < npairs; ++i) {
    int bb = i < 5 ? std::min(i, P.sh.b - 1) : static_cast<int>(rng() % P.sh.b);
    if (i == npairs - 1) bb = P.sh.b - 1;
    const int kvh = i == 0 ? 0 : (i == 1 ? P.sh.hkv - 1 : static_cast<int>(rng() % P.sh.hkv));
    pairs.push_back({bb, kvh});
  }
  std::sort(pairs.begin(), pairs.end());
  pairs.erase(std::unique(pairs.begin(), pairs.end()), pairs.end());
  std::vector<Check> parts(pairs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < pairs.size(); ++i)
    threads.emplace_back(check_pair, std::cref(P), pairs[i].first, pairs[i].second, std::cref(out), std::cref(lse),
                         seed, &parts[i]);
  for (auto& t : threads) t.join();
  for (const Check& c : parts) {
    res.max_err = std::max(res.max_err, c.max_err);
    res.max_lse_err = std::max(res.max_lse_err, c.max_lse_err);
    res.bad += c.bad;
    res.nan += c.nan;
    res.checked += c.checked;
  }
  res.nan += nan_out + nan_lse;
  if (nan_out + nan_lse) res.bad += nan_out + nan_lse;
  *ok = *ok && res.bad == 0;
  return res;
}

double time_graph(const Runner& R, const Problem& P, double seconds, cudaStream_t stream) {
  const attntune_plan::Call c = make_call(P);
  if (R.run(c, stream)) return -1;  // allocates the workspaces outside the capture
  CK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  constexpr int kCalls = 20;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kCalls; ++i)
    if (R.run(c, stream)) {
      cudaStreamEndCapture(stream, &graph);
      return -1;
    }
  CK(cudaStreamEndCapture(stream, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaGraphLaunch(exec, stream));  // warm-up
  CK(cudaStreamSynchronize(stream));
  std::vector<double> samples;
  double total = 0;
  while (total < seconds || samples.size() < 5) {
    CK(cudaEventRecord(e0, stream));
    CK(cudaGraphLaunch(exec, stream));
    CK(cudaEventRecord(e1, stream));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    samples.push_back(ms * 1e3 / kCalls);
    total += ms * 1e-3;
    if (samples.size() > 200000) break;
  }
  std::sort(samples.begin(), samples.end());
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return samples[samples.size() / 2];
}

// One call with the trace on: CTA count, last start, and the 10th/50th/90th percentile and last end
// (us after the first start).
void trace_line(const Runner& R, const Problem& P, cudaStream_t stream) {
  static std::vector<unsigned long long> zeros(2 * 65536, 0ull);
  CK(cudaMemcpyToSymbol(g_trace, zeros.data(), zeros.size() * 8));
  if (R.run(make_call(P), stream, true)) return;
  CK(cudaStreamSynchronize(stream));
  std::vector<unsigned long long> tr(2 * 65536);
  CK(cudaMemcpyFromSymbol(tr.data(), g_trace, tr.size() * 8));
  std::vector<double> st, en;
  for (int i = 0; i < 65536; ++i)
    if (tr[2 * i] && tr[2 * i + 1]) {
      st.push_back(double(tr[2 * i]));
      en.push_back(double(tr[2 * i + 1]));
    }
  if (st.empty()) return;
  const double t0 = *std::min_element(st.begin(), st.end());
  std::sort(en.begin(), en.end());
  auto q = [&](double f) { return (en[std::min(en.size() - 1, size_t(f * en.size()))] - t0) * 1e-3; };
  std::printf("   trace %s %s: %zu CTAs, last start %.2f us, end p10 %.2f p50 %.2f p90 %.2f max %.2f us\n",
              P.sh.name.c_str(), P.mode.name.c_str(), st.size(),
              (*std::max_element(st.begin(), st.end()) - t0) * 1e-3, q(0.1), q(0.5), q(0.9), (en.back() - t0) * 1e-3);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::printf("usage: %s \"NAME:b,h,hkv,s,sk[;...]\" \"dense,kv,p16,...\" [seconds] [checks]\n", argv[0]);
    return 2;
  }
  std::vector<Shape> shapes;
  {
    std::string all = argv[1];
    size_t at = 0;
    while (at <= all.size()) {
      const size_t end = std::min(all.find(';', at), all.size());
      const std::string tok = all.substr(at, end - at);
      at = end + 1;
      if (tok.empty()) continue;
      Shape s;
      const size_t colon = tok.find(':');
      s.name = colon == std::string::npos ? tok : tok.substr(0, colon);
      if (std::sscanf(tok.c_str() + (colon == std::string::npos ? 0 : colon + 1), "%d,%d,%d,%d,%d", &s.b, &s.h, &s.hkv,
                      &s.s, &s.sk) != 5) {
        std::printf("bad shape '%s'\n", tok.c_str());
        return 2;
      }
      shapes.push_back(s);
    }
  }
  std::vector<Mode> modes;
  {
    std::string all = argv[2];
    size_t at = 0;
    while (at <= all.size()) {
      const size_t end = std::min(all.find(',', at), all.size());
      const std::string tok = all.substr(at, end - at);
      at = end + 1;
      if (tok.empty()) continue;
      if (tok == "dense") modes.push_back({tok, attntune_plan::kEntryDense, 0});
      else if (tok == "kv") modes.push_back({tok, attntune_plan::kEntryKvcache, 0});
      else if (tok[0] == 'p') modes.push_back({tok, attntune_plan::kEntryKvcache, std::atoi(tok.c_str() + 1)});
      else {
        std::printf("bad mode '%s'\n", tok.c_str());
        return 2;
      }
    }
  }
  const double seconds = argc > 3 ? std::atof(argv[3]) : 1.0;
  const int checks = argc > 4 ? std::atoi(argv[4]) : 6;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Runner R;
  cudaFuncAttributes fa;
  CK(cudaFuncGetAttributes(&fa, att::flash_decode));
  std::printf("# %s, %d SMs | config %s | d=%d %s causal=%d | regs %d, local %zu B, smem %d B\n", prop.name,
              prop.multiProcessorCount, CONFIG_NAME, kD, kBf16 ? "bf16" : "fp16", kCausal ? 1 : 0, fa.numRegs,
              fa.localSizeBytes, SMEM_BYTES);
  if (ATT_WINDOW || ATT_SOFTCAP || ATT_SINKS)
    std::printf("# variants: window %d,%d softcap %g sinks %d\n", ATT_WINDOW ? kVariant.left : -1,
                ATT_WINDOW ? kVariant.right : -1, ATT_SOFTCAP ? kVariant.softcap : 0.0, ATT_SINKS);
  if (CLUSTER > 1) {
    // How many clusters fit at once (the plan refuses none); a grid of more runs in waves.
    attntune_plan::Why why;
    if (attntune_run::executor().allow_launch(0, reinterpret_cast<const void*>(att::flash_decode), SMEM_BYTES, CLUSTER,
                                              &why))
      std::printf("# allow_launch: %s\n", why.text);
    cudaLaunchConfig_t cfg = cudaLaunchConfig_t();
    cfg.gridDim = dim3(CLUSTER, 1, 1);
    cfg.blockDim = dim3(THREADS, 1, 1);
    cfg.dynamicSmemBytes = SMEM_BYTES;
    int n = 0;
    CK(cudaOccupancyMaxActiveClusters(&n, att::flash_decode, &cfg));
    std::printf("# clusters of %d: %d fit at once\n", CLUSTER, n);
  }
  bool all_ok = true;
  uint32_t seed = 11;
  for (const Shape& sh : shapes)
    for (const Mode& m : modes) {
      ++seed;
      Problem P;
      setup(P, sh, m, seed);
      bool ok = true;
      Check ragged;
      if (m.entry == attntune_plan::kEntryKvcache) {
        std::vector<int> lens(sh.b);
        const int pattern[5] = {sh.sk, 0, 1, std::max(0, std::min(sh.sk, (sh.sk * 2 / 3) | 1)), std::max(0, sh.sk - 1)};
        for (int i = 0; i < sh.b; ++i) lens[i] = pattern[i % 5];
        if (sh.b == 1) lens[0] = pattern[3];
        set_lens(P, lens);
        poison(P, seed);
        ragged = run_and_check(R, P, checks, seed, stream, &ok);
      }
      set_lens(P, std::vector<int>(sh.b, sh.sk));
      poison(P, seed);
      Check full = run_and_check(R, P, checks, seed, stream, &ok);
      const int splits = R.splits(make_call(P));
      double us = -1, gbs = 0;
      if (seconds > 0) {
        us = time_graph(R, P, seconds, stream);
        // K/V rows some query sees (all of them without a window), Q read and O written.
        int first = 0, end = 0;
        row_keys(0, sh.s, sh.sk, &first, &end);
        const double kv_rows = ATT_WINDOW ? sh.sk - first : sh.sk;
        const double bytes = 2.0 * sh.b * sh.hkv * kv_rows * kD * 2 + 2.0 * P.q_elems * 2;
        gbs = us > 0 ? bytes / (us * 1e-6) / 1e9 : 0;
      }
      all_ok = all_ok && ok;
      std::printf("%-14s %-5s splits %3d | err %.2e lse %.1e | ragged err %.2e lse %.1e | bad %lld nan %lld | %9.2f us %7.0f GB/s %s\n",
                  sh.name.c_str(), m.name.c_str(), splits, full.max_err, full.max_lse_err, ragged.max_err,
                  ragged.max_lse_err, full.bad + ragged.bad, full.nan + ragged.nan, us, gbs, ok ? "OK" : "FAIL");
      if (seconds > 0 && std::getenv("DECODE_TRACE_ON")) trace_line(R, P, stream);
      std::fflush(stdout);
      P.free_all();
    }
  std::printf("# %s %s\n", CONFIG_NAME, all_ok ? "ALL OK" : "FAILURES");
  return all_ok ? 0 : 1;
}
