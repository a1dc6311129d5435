// attntune's PyTorch ops: the tuned kernels of kernels.cu (an `attntune export`) as torch operators.
//
// Built by _build.py with torch.utils.cpp_extension (ninja) against the user's torch, as host code
// (the CUDA toolkit's headers, c10_cuda for the current stream; no CUDA runtime of its own), and
// linked to the kernels' shared library (kernels.cu built with nvcc, the contract's command line). Registered
// with TORCH_LIBRARY under ATTNTUNE_TORCH_NAMESPACE (default `attntune`; compare_sdpa.py loads
// several libraries side by side under namespaces of their own):
//
//   attention(q, k, v, scale, is_causal, return_lse, window_size, softcap, sinks, k_descale, v_descale,
//       deterministic, q_descale) -> (out, lse)   (deterministic: the forward ignores it; attention's
//       autograd hands it to attention_backward, as flash_attn_func(..., deterministic=) does;
//       q_descale: the FP8 forward's, below)
//       q [B, H, S, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv] (SDPA's layout; any strides with the
//       last dim contiguous, so [B, S, H, D] storage passes as a transposed view, no copy); out
//       [B, H, S, Dv]
//   attention_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, scale, is_causal, return_lse,
//       window_size, softcap, sinks, k_descale, v_descale)
//       q [B, S, H, D]; caches [B, Sk, Hkv, D] or pages [num_blocks, page_size, Hkv, D], v_cache's
//       last dim Dv (flash_attn_with_kvcache's layout); out [B, S, H, Dv]
//   attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
//       is_causal, return_lse, window_size, softcap, sinks, deterministic)
//       q [total_q, H, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv] (flash_attn_varlen_func's); out
//       [total_q, H, Dv], lse [H, total_q] (deterministic: as attention's, for attention_backward_varlen)
//   ..._into(..., out, lse, scale, is_causal, window_size, softcap, sinks[, k_descale, v_descale[,
//       q_descale]])   the same, writing into the caller's tensors
//   attention_backward(dout, q, k, v, out, lse, dlse, scale, is_causal, window_size, softcap, sinks,
//       deterministic) -> (dq, dk, dv, dsinks)   attention's backward pass, its autograd formula
//       (__init__.py): a kernel tuned for the backward (attntune_attention_backward) when one serves
//       the call and the forward's LSE was saved, else the gradients by explicit math (backward_into).
//       deterministic: bit-identical gradients run to run (attntune_options.deterministic; the
//       explicit math is deterministic already)
//   attention_backward_varlen(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
//       max_seqlen_k, dlse, scale, is_causal, window_size, softcap, sinks, deterministic)
//       -> (dq, dk, dv, dsinks)   attention_varlen's backward pass, the same over a packed batch: a kernel
//       tuned for it (attntune_attention_backward_varlen; a problem's varlen=N,pass=bwd), else the
//       explicit math per sequence (backward_varlen_into)
//   explain(entry, dtype, head_dim, is_causal, b, h, hkv, s, sk, window_size, softcap, sinks,
//       head_dim_v, latent, kv_dtype, deterministic) -> (kernel, reason)
//   coverage() -> str (JSON), reset_coverage(), set_policy(fallback, max_length_ratio), kernel_info()
//
// The variants are FlashAttention's arguments (docs/CONTRACT.md "Variants"): window_size (left,
// right), -1 an unbounded side, bottom-right aligned, is_causal being right 0 (so a window (L, 0) is
// causal); softcap C > 0, score = C * tanh(scale * q.k / C) before masking and softmax; sinks, a
// [heads_q] fp32 tensor of logits joining each row's softmax denominator (no value row; the LSE
// includes them). The kernels serve exactly the variants they were built with; the library's
// dispatcher (attntune_select_kernel_ex) never gives a windowed call a full-attention kernel.
//
// The value head dim Dv is v's last dim, as FlashAttention takes it (DeepSeek's MLA prefill: D 192,
// Dv 128): v must have k's shape but for it, and out has it. A call with Dv != D runs only a kernel
// built for both dims (attntune_options.head_dim_v = Dv; docs/CONTRACT.md "Value head dims"); with
// Dv == D it passes head_dim_v 0 and is the call it always was. The fallback takes any Dv.
//
// A latent cache (DeepSeek-V2/V3's MLA decode; docs/CONTRACT.md "Latent caches") is one buffer whose
// first Dv columns are V: the caller passes v = k[..., :Dv] (v_cache = k_cache[..., :512] over
// FlashMLA's [num_blocks, page_size, 1, 576] cache), a view with k's data pointer and every stride
// and a smaller last dim (latent_view). Such a call of attention or attention_kvcache is a latent
// problem (latent=1 in coverage, its spec and the raise policy's message): it passes k's pointer and
// strides as v and attntune_options.latent = 1, so the dispatcher weighs kernels built for a latent
// cache beside those over separate K and V. The fallback gathers the cache once and reads V as its
// view. (attention_varlen takes such a view as separate K and V: attntune tunes no varlen latent
// problem.)
//
// An FP8 KV cache (docs/CONTRACT.md "FP8 KV caches"; FlashAttention-3's call): k and v (k_cache and
// v_cache) of dtype float8_e4m3fn, both, with q and out fp16/bf16, and their dequantisation scales
// k_descale / v_descale: float32 [batch, heads_kv] (a value per sequence and KV head), or [1] / 0-d (one
// for the tensor), or None (1), on q's device. attention and attention_kvcache pass
// attntune_options.kv_dtype = 1 and the scales (their strides; {0, 0} for one), so only kernels built
// for an FP8 cache (a problem's kv_dtype=fp8) serve the call, and such a call is its own problem
// (kv_dtype=fp8 in coverage, its spec and the raise policy's message). The fallback dequantises the
// cache (k.float() * k_descale per sequence and KV head; V likewise) and runs the fp32 path
// (variant_into) over it: the scales are never dropped. attention_varlen takes no FP8 cache.
//
// The FP8 forward (docs/CONTRACT.md "FP8 forward"; FlashAttention-3's FP8 call): attention with q, k and
// v all float8_e4m3fn and q_descale beside k_descale / v_descale (the same shapes; query head h takes KV
// head h / (H / Hkv)'s), out bf16. It passes attntune_options.qkv_dtype = 1 and the scales, so only
// kernels built for dtype=fp8 serve it (dtype "fp8" in coverage, its spec and the raise policy's
// message). The kernels read V transposed ([B, Hkv, Dv, Sk], keys contiguous, rows of a multiple of 16
// bytes): a v whose strides already are so (vt.transpose(2, 3)) is passed in place, any other is copied
// transposed in the call (a byte copy on the stream). The fallback dequantises q, k and v and runs the
// fp32 path. attention_kvcache and attention_varlen take no FP8 queries.
//
// Each call is decided on the host from shapes alone (no device sync, so it is capturable in a CUDA
// graph): the library's own dispatcher names the kernel tuned for the nearest problem; the call
// falls back to PyTorch when no kernel serves it, when the nearest was tuned for the other regime
// (decode: seqlen_q <= 16; prefill), when its lengths are more than max_length_ratio off, or when
// the library refuses the arguments (ATTNTUNE_UNSUPPORTED, with its reason). The fallback computes
// the same semantics: scaled_dot_product_attention for plain calls, an explicit fp32 path for
// calls with variants (variant_into). With set_policy("raise", ...) such calls raise instead. Every
// decision is counted per shape: coverage() says what ran where, and what to tune next. A CUDA
// error raises; nothing is ever silently recomputed.
//
// Causal is bottom-right (FlashAttention's convention, the contract's): query i sees keys
// j <= i + Sk - S. For S == Sk that is SDPA's is_causal. A query row that sees no key outputs zeros
// and LSE -inf (with sinks: its sink's logit), in the kernels and in the fallback alike.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#ifndef ATTNTUNE_TORCH_NAMESPACE
#define ATTNTUNE_TORCH_NAMESPACE attntune
#endif
#define ATTNTUNE_STR2(x) #x
#define ATTNTUNE_STR(x) ATTNTUNE_STR2(x)

extern "C" {
int attntune_attention_forward(const void* q, const void* k, const void* v, void* out, float* lse, int batch,
                               int heads_q, int heads_kv, int seqlen_q, int seqlen_k, int head_dim,
                               const long long* q_strides, const long long* k_strides, const long long* v_strides,
                               const long long* o_strides, float softmax_scale, int is_causal, cudaStream_t stream);
int attntune_attention_forward_kvcache(const void* q, const void* k_cache, const void* v_cache, void* out, float* lse,
                                       const int* cache_seqlens, const int* block_table, int max_blocks_per_seq,
                                       int page_size, int batch, int heads_q, int heads_kv, int seqlen_q,
                                       int seqlen_k_max, int head_dim, const long long* q_strides,
                                       const long long* k_strides, const long long* v_strides,
                                       const long long* o_strides, float softmax_scale, int is_causal,
                                       cudaStream_t stream);
int attntune_attention_forward_varlen_packed(const void* q, const void* k, const void* v, void* out, float* lse,
                                             const int* cu_seqlens_q, const int* cu_seqlens_k, int batch,
                                             long long total_q, long long total_k, int max_seqlen_q,
                                             int max_seqlen_k, int heads_q, int heads_kv, int head_dim,
                                             const long long* q_strides, const long long* k_strides,
                                             const long long* v_strides, const long long* o_strides,
                                             float softmax_scale, int is_causal, cudaStream_t stream);
const char* attntune_kernel_info(void);
const char* attntune_last_error(void);
int attntune_select_kernel_entry(int entry, int head_dim, int is_causal, int batch, int heads_q, int heads_kv,
                                 int seqlen_q, int seqlen_k);
int attntune_kernel_problem(int index, int* problem, const char** label);

// The extended entry points' options (docs/CONTRACT.md "Variants"; the exported file defines the
// same struct): versioned by `size`, zero-initialised but size it is plain attention.
typedef struct attntune_options {
  size_t size;
  int window;          // 1: window_left/window_right apply
  int window_left;     // -1: unbounded
  int window_right;    // -1: unbounded; a causal call passes -1 (causal bounds it at 0)
  float softcap;       // > 0: score = softcap * tanh(softmax_scale * q.k / softcap); 0: none
  const float* sinks;  // NULL, or [heads_q] fp32 logits (device)
  int head_dim_v;      // V's and out's head dim where it is not head_dim; 0: head_dim (docs/CONTRACT.md
                       // "Value head dims"). An export before it refuses a nonzero one (a byte past its
                       // struct set), so only split calls depend on it.
  int latent;          // 1: V is K's first head_dim_v columns, v = k with k's strides (MLA's latent cache;
                       // docs/CONTRACT.md "Latent caches"): the dispatcher weighs latent kernels. Set only
                       // for latent calls, so only they depend on it.
  int kv_dtype;        // 1: k and v are FP8 e4m3 (their strides count bytes) dequantised by the scales below;
                       // 0: q's dtype (docs/CONTRACT.md "FP8 KV caches"). Set, with the scales, only for FP8
                       // calls, so only they depend on it (an export before it refuses them).
  const float* k_descale;  // [batch, heads_kv] fp32 (device) through k_descale_stride; NULL: 1
  const float* v_descale;
  long long k_descale_stride[2];  // {batch, head} in elements; {0, 0}: one scale
  long long v_descale_stride[2];
  int deterministic;   // 1: the backward's gradients bit-identical run to run (docs/CONTRACT.md "The backward
                       // pass"). Set only for backward calls that ask, so only they depend on it (an export
                       // before it refuses them, and they fall back to the explicit math, deterministic).
  int qkv_dtype;       // 1: the FP8 forward (docs/CONTRACT.md "FP8 forward"): q, k, v FP8 e4m3, v transposed
                       // ([b, hkv, dv, sk], keys contiguous), out bf16; k_descale/v_descale above and q_descale
                       // below hold the scales. Set only for FP8-forward calls (an export before it refuses them).
  const float* q_descale;         // [batch, heads_kv] fp32 (device) through q_descale_stride; NULL: 1
  long long q_descale_stride[2];  // {batch, head} in elements; {0, 0}: one scale
} attntune_options;

// The entry points with options, weak: a kernels file exported before the variants lacks them, and
// the ops still load it (compare_sdpa.py loads any export); its calls with a variant then fall
// back, saying why, and its plain calls run through the contract's entry points above.
__attribute__((weak)) int attntune_attention_forward_ex(
    const void* q, const void* k, const void* v, void* out, float* lse, int batch, int heads_q, int heads_kv,
    int seqlen_q, int seqlen_k, int head_dim, const long long* q_strides, const long long* k_strides,
    const long long* v_strides, const long long* o_strides, float softmax_scale, int is_causal,
    const attntune_options* opts, cudaStream_t stream);
__attribute__((weak)) int attntune_attention_forward_kvcache_ex(
    const void* q, const void* k_cache, const void* v_cache, void* out, float* lse, const int* cache_seqlens,
    const int* block_table, int max_blocks_per_seq, int page_size, int batch, int heads_q, int heads_kv,
    int seqlen_q, int seqlen_k_max, int head_dim, const long long* q_strides, const long long* k_strides,
    const long long* v_strides, const long long* o_strides, float softmax_scale, int is_causal,
    const attntune_options* opts, cudaStream_t stream);
__attribute__((weak)) int attntune_attention_forward_varlen_ex(
    const void* q, const void* k, const void* v, void* out, float* lse, const int* cu_seqlens_q,
    const int* cu_seqlens_k, int batch, long long total_q, long long total_k, int max_seqlen_q, int max_seqlen_k,
    int heads_q, int heads_kv, int head_dim, const long long* q_strides, const long long* k_strides,
    const long long* v_strides, const long long* o_strides, float softmax_scale, int is_causal,
    const attntune_options* opts, cudaStream_t stream);
__attribute__((weak)) int attntune_select_kernel_ex(int entry, int head_dim, int is_causal, int batch, int heads_q,
                                                    int heads_kv, int seqlen_q, int seqlen_k,
                                                    const attntune_options* opts);
// The backward pass (docs/CONTRACT.md "The backward pass"), weak: an export before it lacks it, and its
// dispatcher names no kernel for entry 8, so every backward call of such a library falls back.
__attribute__((weak)) int attntune_attention_backward_ex(
    const void* q, const void* k, const void* v, const void* out, const float* softmax_lse, const void* dout,
    void* dq, void* dk, void* dv, int batch, int heads_q, int heads_kv, int seqlen_q, int seqlen_k, int head_dim,
    const long long* q_strides, const long long* k_strides, const long long* v_strides, const long long* o_strides,
    const long long* do_strides, const long long* dq_strides, const long long* dk_strides,
    const long long* dv_strides, float softmax_scale, int is_causal, const attntune_options* opts,
    cudaStream_t stream);
// The backward pass of a packed batch (attntune_attention_forward_varlen's), weak likewise: an export
// before it lacks it (and its dispatcher names no kernel for entry 16). Strides {row, head}, two each;
// softmax_lse [heads_q, total_q] as the varlen forward writes it.
__attribute__((weak)) int attntune_attention_backward_varlen_ex(
    const void* q, const void* k, const void* v, const void* out, const float* softmax_lse, const void* dout,
    void* dq, void* dk, void* dv, const int* cu_seqlens_q, const int* cu_seqlens_k, int batch, long long total_q,
    long long total_k, int max_seqlen_q, int max_seqlen_k, int heads_q, int heads_kv, int head_dim,
    const long long* q_strides, const long long* k_strides, const long long* v_strides, const long long* o_strides,
    const long long* do_strides, const long long* dq_strides, const long long* dk_strides,
    const long long* dv_strides, float softmax_scale, int is_causal, const attntune_options* opts,
    cudaStream_t stream);
}

namespace {

constexpr int kUnsupported = 1000;
constexpr int kEntryDense = 1, kEntryKvcache = 2, kEntryVarlen = 4;
constexpr int kEntryBackward = 8;  // attention's backward pass (attention_backward; attntune_attention_backward)
// attention_varlen's backward pass (attention_backward_varlen; attntune_attention_backward_varlen)
constexpr int kEntryBackwardVarlen = 16;
constexpr int kDecodeMaxQ = 16;  // seqlen_q up to this is the decode regime (flash_decode's kDecodeMaxSeqlenQ)

const char* entry_name(int entry) {
  return entry == kEntryKvcache          ? "attention_kvcache"
         : entry == kEntryVarlen         ? "attention_varlen"
         : entry == kEntryBackward       ? "attention_backward"
         : entry == kEntryBackwardVarlen ? "attention_backward_varlen"
                                         : "attention";
}

// The backward pass's entries (attention_backward, attention_backward_varlen): problems with pass=bwd.
bool is_backward(int entry) { return entry == kEntryBackward || entry == kEntryBackwardVarlen; }

std::string fmt(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* format, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, format);
  std::vsnprintf(buf, sizeof buf, format, ap);
  va_end(ap);
  return buf;
}

// The shortest text that reads back as `v` ("30", "0.1"), as attntune's problem specs write numbers.
std::string shortest(double v) {
  char buf[40];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {  // an integer: no exponent ("30", not "3e+01")
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

// ------------------------------------------------------------------ variants

// A call's variants, normalised as the library and attntune's problem specs normalise them: a
// window (L, 0) without is_causal is causal within L keys, a causal call keeps right -1 (causal
// bounds it), (-1, -1) is no window.
struct Variants {
  int left = -1, right = -1;  // the window's sides; -1 unbounded
  double softcap = 0;         // > 0: the cap; 0: none
  bool sinks = false;
  bool windowed() const { return left >= 0 || right >= 0; }
  bool any() const { return windowed() || softcap > 0 || sinks; }
  bool operator<(const Variants& o) const {
    return std::tie(left, right, softcap, sinks) < std::tie(o.left, o.right, o.softcap, o.sinks);
  }
  // ",window=L[,R],softcap=C,sinks=1": the problem spec's variant keys (docs/CONTRACT.md), "" when plain.
  std::string spec() const {
    std::string s;
    if (windowed()) s += right >= 0 ? fmt(",window=%d,%d", left, right) : fmt(",window=%d", left);
    if (softcap > 0) s += ",softcap=" + shortest(softcap);
    if (sinks) s += ",sinks=1";
    return s;
  }
  // " with a sliding window (L, R), a logit soft-cap C, attention sinks" for messages; "" when plain.
  std::string words() const {
    std::string s;
    if (windowed()) s += fmt("a sliding window (%d, %d)", left, right);
    if (softcap > 0) s += (s.empty() ? "" : ", ") + fmt("a logit soft-cap %g", softcap);
    if (sinks) s += (s.empty() ? "" : ", ") + std::string("attention sinks");
    return s.empty() ? s : " with " + s;
  }
};

// ------------------------------------------------------------------ policy and coverage

struct Policy {
  bool raise = false;        // true: a call no kernel serves raises instead of falling back
  double max_ratio = 16.0;   // the nearest kernel's lengths may be this many times off
};
std::mutex g_mutex;
Policy g_policy;

// What a call is, for coverage: its entry point and problem (variants and the value head dim
// included: a windowed call is another problem than its plain shape, a (192, 128) call than a
// (192, 192) one). dv: V's and out's head dim, d for one head dim.
struct Shape {
  int entry, bf16, d, dv, causal, b, h, hkv, s, sk, paged;
  Variants v;
  // 1: a latent call (v is k's first dv columns, one buffer: latent_view), the spec's latent=1; else 0.
  int latent = 0;
  // 1: an FP8 e4m3 cache (k and v float8_e4m3fn; attntune_options.kv_dtype), the spec's kv_dtype=fp8.
  int kv_fp8 = 0;
  // 1: the FP8 forward (q, k and v float8_e4m3fn, out bf16; attntune_options.qkv_dtype), the spec's
  // dtype=fp8 (bf16 1: the library's dtype it matches is its out's).
  int qkv_fp8 = 0;
  // The value head dim where it is not d (attntune_options.head_dim_v, the spec's dv=N), else 0.
  int split_dv() const { return dv != d ? dv : 0; }
  // 1: a backward call that asks for bit-identical gradients (attntune_options.deterministic). Not
  // part of the problem (coverage, specs): the kernels tuned for it serve both kinds of call.
  int deterministic = 0;
  bool operator<(const Shape& o) const {
    return std::tie(entry, bf16, d, dv, causal, b, h, hkv, s, sk, paged, v, latent, kv_fp8, qkv_fp8) <
           std::tie(o.entry, o.bf16, o.d, o.dv, o.causal, o.b, o.h, o.hkv, o.s, o.sk, o.paged, o.v, o.latent,
                    o.kv_fp8, o.qkv_fp8);
  }
  // ",latent=1" for a latent call (the spec's key, after the variants), "" else; then ",kv_dtype=fp8"
  // for an FP8 cache (the spec's very end).
  std::string latent_spec() const { return std::string(latent ? ",latent=1" : "") + (kv_fp8 ? ",kv_dtype=fp8" : ""); }
};
struct Count {
  long long calls = 0;
  int kernel = -1;     // the kernel that served the last call; -1: fell back
  std::string reason;  // why the last call fell back
  std::string dtype;   // the tensors' dtype when neither fp16 nor bf16
  bool tunable = false;  // the fallback is for want of a tuned kernel (not a CPU tensor, a layout)
};
std::map<Shape, Count> g_coverage;

struct Decision {
  int kernel = -1;        // >= 0: run this kernel of the library
  std::string reason;     // else why not
  bool tunable = false;   // and tuning this problem would give it a kernel
};

// The library's dtype: that of its first kernel (an export holds one dtype).
int library_bf16() {
  int p[9];
  return attntune_kernel_problem(0, p, nullptr) == 0 ? p[7] : -1;
}

double off_by(double a, double b) {
  a = a > 0 ? a : 1;
  b = b > 0 ? b : 1;
  return a > b ? a / b : b / a;
}

// An FP8 cache's scales as attntune_options carries them: device pointers (null: 1) and {batch, head}
// strides in elements ({0, 0}: one scale for the tensor).
struct Descales {
  const float* k = nullptr;
  const float* v = nullptr;
  long long k_stride[2] = {0, 0}, v_stride[2] = {0, 0};
  const float* q = nullptr;  // the FP8 forward's Q scales
  long long q_stride[2] = {0, 0};
};

// The options struct of a call's variants, value head dim, latent cache and cache dtype
// (`c.split_dv()`: 0 for one head dim, so that an export before head_dim_v takes the call; latent 0
// but for latent calls, kv_dtype 0 and no scales but for FP8 calls, so that an export before them
// takes every other); `sinks` the device logits (or any non-null pointer, for the dispatcher, which
// reads only whether there are sinks); `ds` an FP8 call's scales.
attntune_options options_of(const Shape& c, const float* sinks, const Descales& ds = Descales()) {
  attntune_options o;
  std::memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.window = c.v.windowed() ? 1 : 0;
  o.window_left = c.v.left;
  o.window_right = c.v.right;
  o.softcap = static_cast<float>(c.v.softcap);
  o.sinks = c.v.sinks ? sinks : nullptr;
  o.head_dim_v = c.split_dv();
  o.latent = c.latent;
  o.kv_dtype = c.kv_fp8 ? 1 : 0;
  o.deterministic = c.deterministic;
  o.qkv_dtype = c.qkv_fp8 ? 1 : 0;
  if (c.kv_fp8 || c.qkv_fp8) {
    o.k_descale = ds.k;
    o.v_descale = ds.v;
    for (int i = 0; i < 2; ++i) {
      o.k_descale_stride[i] = ds.k_stride[i];
      o.v_descale_stride[i] = ds.v_stride[i];
    }
  }
  if (c.qkv_fp8) {
    o.q_descale = ds.q;
    for (int i = 0; i < 2; ++i) o.q_descale_stride[i] = ds.q_stride[i];
  }
  return o;
}

// The library's dispatcher for a call's shape, variants and value head dim: the kernel index, or -1
// (`why` says why when the library cannot take such calls at all).
int select_kernel(const Shape& c, std::string* why) {
  if (c.entry == kEntryBackward && (!attntune_attention_backward_ex || !attntune_select_kernel_ex)) {
    *why = "the library was exported before attntune served the backward pass (attntune_attention_backward): "
           "export it again";
    return -1;
  }
  if (c.entry == kEntryBackwardVarlen && (!attntune_attention_backward_varlen_ex || !attntune_select_kernel_ex)) {
    *why = "the library was exported before attntune served the backward pass of packed batches "
           "(attntune_attention_backward_varlen): export it again";
    return -1;
  }
  if (!attntune_select_kernel_ex) {
    if (c.split_dv()) {
      *why = "the library was exported before attntune served a value head dim other than head_dim: export it "
             "again";
      return -1;
    }
    if (c.v.any()) {
      *why = "the library was exported before attntune served variants (sliding windows, soft-cap, sinks): export "
             "it again";
      return -1;
    }
    if (c.kv_fp8) {
      *why = "the library was exported before attntune served FP8 KV caches: export it again";
      return -1;
    }
    if (c.qkv_fp8) {
      *why = "the library was exported before attntune served the FP8 forward (dtype=fp8): export it again";
      return -1;
    }
    return attntune_select_kernel_entry(c.entry, c.d, c.causal, c.b, c.h, c.hkv, c.s, c.sk);
  }
  // An export before head_dim_v refuses a split call's options (a byte past its struct is set): -1,
  // and rightly, since it holds no kernel for two head dims.
  static const float any_sinks = 0.0f;
  attntune_options o = options_of(c, &any_sinks);
  const int k = attntune_select_kernel_ex(c.entry, c.d, c.causal, c.b, c.h, c.hkv, c.s, c.sk, &o);
  if (k < 0 && c.deterministic) {
    // A kernel for the same call without the flag: the library cannot order dQ's additions (an
    // export before attntune_options.deterministic refuses its byte; or its kernels refuse it).
    o.deterministic = 0;
    if (attntune_select_kernel_ex(c.entry, c.d, c.causal, c.b, c.h, c.hkv, c.s, c.sk, &o) >= 0)
      *why = "no kernel of the library gives deterministic gradients (deterministic=True; an export before "
             "attntune_options.deterministic: export it again)";
    return -1;
  }
  if (k >= 0 || !c.latent) return k;
  // A latent call's options weigh every kernel the same call without them would (and latent ones
  // too), so -1 with them and a kernel without them is an export before `latent`, which refuses the
  // option's byte (its real call would too).
  o.latent = 0;
  if (attntune_select_kernel_ex(c.entry, c.d, c.causal, c.b, c.h, c.hkv, c.s, c.sk, &o) >= 0)
    *why = "the library was exported before attntune served latent caches (attntune_options.latent): export it "
           "again";
  return -1;
}

// " head_dim_v=N" for a call of two head dims, "" for one (messages).
std::string dv_words(const Shape& c) { return c.split_dv() ? fmt(" head_dim_v=%d", c.dv) : std::string(); }

// The decision for a call's shape, from the host alone (no device data).
Decision decide(const Shape& c, const std::string& dtype_name, double max_ratio) {
  Decision d;
  d.tunable = dtype_name.empty();
  if (!dtype_name.empty()) {
    d.reason = "dtype " + dtype_name + " (the kernels are fp16 or bf16)";
    return d;
  }
  const int lib = library_bf16();
  if (lib < 0) {
    d.reason = "the library holds no kernel";
    return d;
  }
  if (lib != c.bf16) {
    d.reason = fmt("dtype %s: the library was tuned for %s", c.bf16 ? "bf16" : "fp16", lib ? "bf16" : "fp16");
    return d;
  }
  std::string why;
  const int k = select_kernel(c, &why);
  if (k < 0) {
    d.reason = !why.empty() ? why
                            : fmt("no kernel of the library serves %s with head_dim=%d%s is_causal=%d",
                                  entry_name(c.entry), c.d, dv_words(c).c_str(), c.causal) +
                                  c.v.words() +
                                  (c.latent ? " over a latent cache (v is k's first head_dim_v columns)" : "") +
                                  (c.kv_fp8 ? " over an FP8 e4m3 cache (kv_dtype=fp8)" : "") +
                                  (c.qkv_fp8 ? " with FP8 e4m3 q, k and v (the FP8 forward, dtype=fp8)" : "");
    return d;
  }
  int p[9];
  const char* label = "";
  attntune_kernel_problem(k, p, &label);
  // The regimes are the forward's (flash_decode's few query rows against prefill); the backward's
  // kernels serve calls of any length (dense or packed), judged by the ratio below alone.
  const bool decode = c.s <= kDecodeMaxQ, tuned_decode = p[3] <= kDecodeMaxQ;
  if (!is_backward(c.entry) && decode != tuned_decode) {
    d.reason = fmt("the nearest kernel (%s) was tuned for %s (seqlen_q=%d); this call is %s (seqlen_q=%d)", label,
                   tuned_decode ? "decode" : "prefill", p[3], decode ? "decode" : "prefill", c.s);
    return d;
  }
  const double off = std::max(off_by(c.s, p[3]), off_by(c.sk, p[4]));
  if (off > max_ratio) {
    d.reason = fmt("the nearest kernel (%s) was tuned for seqlen_q=%d seqlen_k=%d: %.1fx off this call's "
                   "%d, %d (max_length_ratio %.3g)",
                   label, p[3], p[4], off, c.s, c.sk, max_ratio);
    return d;
  }
  d.kernel = k;
  return d;
}

void count(const Shape& c, int kernel, const std::string& reason, const std::string& dtype_name,
           bool tunable = false) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Count& n = g_coverage[c];
  ++n.calls;
  n.kernel = kernel;
  n.reason = reason;
  n.dtype = dtype_name;
  n.tunable = kernel < 0 && tunable;
}

// "" for fp16/bf16 tensors, else the dtype's name.
std::string other_dtype(const at::Tensor& q) {
  if (q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16) return "";
  return std::string(c10::toString(q.scalar_type()));
}

// other_dtype of a call: "" for an FP8 forward's float8_e4m3fn q too (its kernels are dtype=fp8's).
std::string call_dtype(const Shape& c, const at::Tensor& q) { return c.qkv_fp8 ? "" : other_dtype(q); }

Policy policy_now() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_policy;
}

// A call that does not run a kernel: counted with `reason`, then under the "raise" policy an
// error naming the problem; under "sdpa" the caller falls back.
void fall_back(const Shape& c, const at::Tensor& q, const std::string& reason, bool tunable) {
  count(c, -1, reason, call_dtype(c, q), tunable);
  if (policy_now().raise)
    TORCH_CHECK(false, fmt("attntune.%s: no tuned kernel for b=%d,h=%d,hkv=%d,s=%d,sk=%d,d=%d%s,causal=%d",
                           entry_name(c.entry), c.b, c.h, c.hkv, c.s, c.sk, c.d,
                           c.split_dv() ? fmt(",dv=%d", c.dv).c_str() : "", c.causal) +
                           c.v.spec() + c.latent_spec() + (c.qkv_fp8 ? ",dtype=fp8" : "") +
                           (is_backward(c.entry) ? ",pass=bwd" : "") + ": " +
                           reason + " (fallback policy 'raise'; attntune.set_policy(fallback='sdpa') falls back to " +
                           (is_backward(c.entry)
                                ? "PyTorch: the gradients by explicit math in fp32)"
                                : "PyTorch: scaled_dot_product_attention, or the explicit path for variants)"));
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') { o += '\\'; o += static_cast<char>(ch); }
    else if (ch < 0x20) o += fmt("\\u%04x", ch);
    else o += static_cast<char>(ch);
  }
  return o;
}

std::string coverage_json() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::string j = "[";
  bool first = true;
  for (const auto& [c, n] : g_coverage) {
    j += first ? "" : ",";
    first = false;
    // "dv" only for two head dims, "latent" only for latent calls, "kv_dtype" only for FP8 caches, as
    // attntune's problems carry them.
    j += fmt("{\"entry\":\"%s\",\"dtype\":\"%s\",\"problem\":{\"b\":%d,\"h\":%d,\"hkv\":%d,\"s\":%d,\"sk\":%d,"
             "\"d\":%d,%s\"causal\":%d,\"paged\":%d,\"window\":[%d,%d],\"softcap\":%s,\"sinks\":%d%s%s},\"calls\":%lld,",
             entry_name(c.entry),
             n.dtype.empty() ? (c.qkv_fp8 ? "fp8" : c.bf16 ? "bf16" : "fp16") : json_escape(n.dtype).c_str(), c.b,
             c.h, c.hkv, c.s, c.sk, c.d, c.split_dv() ? fmt("\"dv\":%d,", c.dv).c_str() : "", c.causal, c.paged,
             c.v.left, c.v.right, shortest(c.v.softcap).c_str(), c.v.sinks ? 1 : 0, c.latent ? ",\"latent\":1" : "",
             c.kv_fp8 ? ",\"kv_dtype\":\"fp8\"" : "", n.calls);
    if (n.kernel >= 0) {
      int p[9];
      const char* label = "";
      attntune_kernel_problem(n.kernel, p, &label);
      j += fmt("\"kernel\":%d,\"label\":\"%s\",\"fallback\":null,\"tunable\":false}", n.kernel,
               json_escape(label).c_str());
    } else {
      j += "\"kernel\":null,\"label\":null,\"fallback\":\"" + json_escape(n.reason) + "\",\"tunable\":" +
           (n.tunable ? "true}" : "false}");
    }
  }
  return j + "]";
}

void reset_coverage() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_coverage.clear();
}

void set_policy(std::string fallback, double max_length_ratio) {
  TORCH_CHECK(fallback == "sdpa" || fallback == "raise",
              "attntune.set_policy: fallback must be 'sdpa' or 'raise' (got '" + fallback + "')");
  TORCH_CHECK(std::isfinite(max_length_ratio) && max_length_ratio >= 1.0,
              fmt("attntune.set_policy: max_length_ratio must be finite and >= 1 (got %g)", max_length_ratio));
  std::lock_guard<std::mutex> lock(g_mutex);
  g_policy.raise = fallback == "raise";
  g_policy.max_ratio = max_length_ratio;
}

std::string kernel_info() { return attntune_kernel_info(); }

// ------------------------------------------------------------------ argument checks

// Argument checks. The message is built only on failure and handed to TORCH_CHECK as one string:
// c10::str of several arguments streams them through std::ostringstream, and an ostream insert
// inside this library segfaulted on the GPU machine (torch 2.11, g++ 13, libstdc++ 6.0.33; the
// cause was not pinned down: docs/design/torch.md). Nothing here streams.
#define ATTNTUNE_CHECK(cond, entry, what) \
  TORCH_CHECK((cond), std::string("attntune.") + (entry) + ": " + std::string(what))

std::string dims(at::IntArrayRef d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

int as_int(int64_t v, const char* entry, const char* name) {
  ATTNTUNE_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(), entry, fmt("%s (%lld) out of range", name,
                                                                   static_cast<long long>(v)));
  return static_cast<int>(v);
}

double scale_of(std::optional<double> scale, int64_t d) {
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(d));
}

// The variants of a call from FlashAttention's arguments, checked and normalised (is_causal
// becomes true for a window (L, 0)). Python's _check_variants says the same in the same words.
Variants variants_of(const char* e, at::IntArrayRef window_size, double softcap, bool sinks, bool& is_causal) {
  ATTNTUNE_CHECK(window_size.size() == 2, e,
                 fmt("window_size must be (left, right) (got %d values)", static_cast<int>(window_size.size())));
  const int64_t left = window_size[0], right = window_size[1];
  ATTNTUNE_CHECK(left >= -1 && right >= -1 && left <= std::numeric_limits<int>::max() &&
                     right <= std::numeric_limits<int>::max(),
                 e, fmt("window_size (%lld, %lld): each side is -1 (unbounded) or a number of keys >= 0",
                        static_cast<long long>(left), static_cast<long long>(right)));
  ATTNTUNE_CHECK(!(is_causal && right > 0), e,
                 fmt("is_causal with window_size (%lld, %lld): causal attention sees no key right of the diagonal "
                     "(it is window_size (left, 0)); pass is_causal=False for a window reaching right of it",
                     static_cast<long long>(left), static_cast<long long>(right)));
  ATTNTUNE_CHECK(std::isfinite(softcap) && softcap >= 0 && softcap <= std::numeric_limits<float>::max(), e,
                 fmt("softcap %g: 0 (none) or a positive finite cap", softcap));
  Variants v;
  v.left = static_cast<int>(left);
  v.right = static_cast<int>(right);
  v.softcap = softcap;
  v.sinks = sinks;
  if (!is_causal && v.right == 0) is_causal = true;  // FlashAttention: (L, 0) is causal within L keys
  if (is_causal) v.right = -1;
  return v;
}

// The sinks tensor: [heads_q] float32 on q's device; returned contiguous (the kernels read a plain
// array), undefined when there is none.
at::Tensor sinks_of(const char* e, const std::optional<at::Tensor>& sinks, int64_t heads, const at::Tensor& q) {
  if (!sinks || !sinks->defined()) return at::Tensor();
  ATTNTUNE_CHECK(sinks->dim() == 1 && sinks->size(0) == heads, e,
                 "sinks must be [heads_q] (" + std::to_string(heads) + " logits, one per query head; got " +
                     dims(sinks->sizes()) + ")");
  ATTNTUNE_CHECK(sinks->scalar_type() == at::kFloat, e,
                 std::string("sinks must be float32 (got ") + c10::toString(sinks->scalar_type()) + ")");
  ATTNTUNE_CHECK(sinks->device() == q.device(), e, "sinks must be on q's device");
  return sinks->contiguous();
}

// A dtype as Python spells it (torch.float32 is "float32", where c10::toString says "Float"), so the ops'
// messages and the Python functions' read alike.
std::string py_dtype(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kFloat8_e4m3fn: return "float8_e4m3fn";
    case at::kFloat8_e5m2: return "float8_e5m2";
    case at::kFloat8_e4m3fnuz: return "float8_e4m3fnuz";
    case at::kFloat8_e5m2fnuz: return "float8_e5m2fnuz";
    default: return c10::toString(t);
  }
}

bool is_float8(at::ScalarType t) {
  return t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2 || t == at::kFloat8_e4m3fnuz || t == at::kFloat8_e5m2fnuz;
}

// The cache's dtype: 1 for an FP8 e4m3 cache (k and v float8_e4m3fn, q fp16 or bf16), 2 for the FP8
// forward (q too, where `fp8_queries`: attention's), else 0 with q, k and v of one dtype (`same`: the
// message that says so). kn, vn: the caches' names. Python's _check_kv says the same in the same words.
int kv_fp8_of(const char* e, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const char* kn,
              const char* vn, const char* same, bool fp8_queries = false) {
  const bool kf = is_float8(k.scalar_type()), vf = is_float8(v.scalar_type());
  if (!kf && !vf) {
    ATTNTUNE_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), e, same);
    return 0;
  }
  ATTNTUNE_CHECK(kf && vf, e,
                 fmt("%s and %s must both be float8_e4m3fn (an FP8 cache) or neither (%s ", kn, vn, kn) +
                     py_dtype(k.scalar_type()) + ", " + vn + " " + py_dtype(v.scalar_type()) + ")");
  ATTNTUNE_CHECK(k.scalar_type() == at::kFloat8_e4m3fn && v.scalar_type() == at::kFloat8_e4m3fn, e,
                 fmt("an FP8 cache is float8_e4m3fn (got %s ", kn) + py_dtype(k.scalar_type()) + ")");
  if (fp8_queries && q.scalar_type() == at::kFloat8_e4m3fn) return 2;
  ATTNTUNE_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16, e,
                 std::string("an FP8 (float8_e4m3fn) cache takes fp16 or bf16 queries (q is ") +
                     py_dtype(q.scalar_type()) +
                     (fp8_queries ? "): FP8 queries are float8_e4m3fn (the FP8 forward: q, k and v float8_e4m3fn)"
                                  : "): FP8 queries are not supported here (attention takes them: the FP8 forward)"));
  return 1;
}

// An FP8 cache's scale table (k_descale, v_descale; FlashAttention-3's descale_k/v): float32 on q's
// device, [batch, heads_kv] (read through its strides; a dim of size 1 gets 0) or [1] / 0-d (one scale:
// strides {0, 0}); the tensor, or undefined when not given (a scale of 1). Given for a cache of q's
// dtype: an error (scales dequantise an FP8 cache only; never silently ignored).
at::Tensor descale_of(const char* e, const char* name, const std::optional<at::Tensor>& t, int kv_fp8,
                      const at::Tensor& k, int64_t B, int64_t Hkv, const at::Tensor& q, long long* stride) {
  stride[0] = stride[1] = 0;
  if (!t || !t->defined()) return at::Tensor();
  ATTNTUNE_CHECK(kv_fp8, e,
                 fmt("%s dequantises an FP8 (float8_e4m3fn) cache; this cache is ", name) +
                     py_dtype(k.scalar_type()) + ": pass k_descale and v_descale with float8_e4m3fn caches only");
  ATTNTUNE_CHECK(t->scalar_type() == at::kFloat, e,
                 fmt("%s must be float32 (got ", name) + py_dtype(t->scalar_type()) + ")");
  ATTNTUNE_CHECK(t->device() == q.device(), e, fmt("%s must be on q's device", name));
  const bool one = t->dim() == 0 || (t->dim() == 1 && t->size(0) == 1);
  ATTNTUNE_CHECK(one || (t->dim() == 2 && t->size(0) == B && t->size(1) == Hkv), e,
                 fmt("%s must be [batch, heads_kv] ([%lld, %lld]: a scale per sequence and KV head), [1] or 0-d (one "
                     "scale; got ", name, static_cast<long long>(B), static_cast<long long>(Hkv)) +
                     dims(t->sizes()) + ")");
  if (!one)
    for (int i = 0; i < 2; ++i) {
      stride[i] = t->size(i) > 1 ? t->stride(i) : 0;
      ATTNTUNE_CHECK(stride[i] >= 0 && stride[i] <= std::numeric_limits<int>::max(), e,
                     fmt("%s's strides must be below 2^31 (got %lld)", name, static_cast<long long>(stride[i])));
    }
  return *t;
}

// An FP8 cache (float8_e4m3fn) in float32 times its scales per (sequence, KV head): `scale_shape` views
// the table ([B, Hkv] or one) against t's dims (dense [B, Hkv, Sk, D]: {B, Hkv, 1, 1}; a gathered
// cache [B, Sk, Hkv, D]: {B, 1, Hkv, 1}). The fallback's K and V, as the kernels read them.
at::Tensor dequantised(const at::Tensor& t, const at::Tensor& descale, at::IntArrayRef scale_shape) {
  at::Tensor f = t.to(at::kFloat);
  if (!descale.defined()) return f;
  const bool one = descale.numel() == 1;
  std::vector<int64_t> shape(scale_shape.begin(), scale_shape.end());
  if (one) std::fill(shape.begin(), shape.end(), 1);
  return f * descale.reshape(shape);
}

// The FP8 forward's q (float8_e4m3fn [B, H, S, D]) in float32 times its scales, one per (sequence, KV
// head) (q_descale [B, Hkv], query head h taking KV head h / (H / Hkv)'s) or one: the fallback's Q.
at::Tensor dequantised_q(const at::Tensor& q, const at::Tensor& descale, int64_t B, int64_t Hkv) {
  const int64_t H = q.size(1), S = q.size(2), D = q.size(3), G = Hkv > 0 ? H / Hkv : 1;
  // q's heads as [Hkv, G], the KV head's scale over its group: dequantised's per-(sequence, KV head) view.
  return dequantised(q.reshape({B, Hkv, G, S, D}), descale, {B, Hkv, 1, 1, 1}).reshape({B, H, S, D});
}

// Rows of `t` (pages: dim 0) at `idx`, for any dtype (index_select takes no FP8: its bytes are taken).
at::Tensor gather_pages(const at::Tensor& t, const at::Tensor& idx) {
  if (!is_float8(t.scalar_type())) return t.index_select(0, idx);
  return t.view(at::kByte).index_select(0, idx).view(t.scalar_type());
}

// head_dim_v: V's head dim, 0 (or head_dim) for one head dim. latent: V is K's first head_dim_v
// columns (a call whose v is a view k[..., :head_dim_v]; head_dim_v below head_dim). kv_dtype: "fp8"
// for an FP8 e4m3 cache; None, "" or q's dtype for a cache of q's dtype. deterministic: a backward
// call that asks for bit-identical gradients (entries 8 and 16 only).
std::tuple<int64_t, std::string> explain(int64_t entry, std::string dtype, int64_t d, bool causal, int64_t b,
                                         int64_t h, int64_t hkv, int64_t s, int64_t sk, at::IntArrayRef window_size,
                                         double softcap, bool sinks, int64_t head_dim_v, bool latent,
                                         std::optional<std::string> kv_dtype, bool deterministic) {
  TORCH_CHECK(entry == kEntryDense || entry == kEntryKvcache || entry == kEntryVarlen || entry == kEntryBackward ||
                  entry == kEntryBackwardVarlen,
              "attntune.explain: entry must be 1 (attention), 2 (kvcache), 4 (varlen), 8 (attention's backward) or 16 "
              "(attention_varlen's backward)");
  TORCH_CHECK(dtype == "fp16" || dtype == "bf16" || dtype == "fp8",
              "attntune.explain: dtype must be fp16, bf16 or fp8 (the FP8 forward: q, k and v float8_e4m3fn)");
  TORCH_CHECK(dtype != "fp8" || (entry == kEntryDense && !latent && (!kv_dtype || kv_dtype->empty())),
              "attntune.explain: dtype fp8 (the FP8 forward: q, k and v float8_e4m3fn, out bf16) is attention's "
              "(entry 1), over separate K and V, with kv_dtype None");
  TORCH_CHECK(head_dim_v >= 0 && head_dim_v <= std::numeric_limits<int>::max(),
              fmt("attntune.explain: head_dim_v must be 0 (head_dim) or V's head dim (got %lld)",
                  static_cast<long long>(head_dim_v)));
  TORCH_CHECK(!latent || (head_dim_v > 0 && head_dim_v < d),
              fmt("attntune.explain: latent (V is K's first head_dim_v columns) needs head_dim_v below head_dim (got "
                  "head_dim %lld, head_dim_v %lld)", static_cast<long long>(d), static_cast<long long>(head_dim_v)));
  TORCH_CHECK(!latent || (entry != kEntryVarlen && entry != kEntryBackwardVarlen),
              "attntune.explain: latent is for attention and attention_kvcache (attntune tunes no varlen latent "
              "problem; varlen calls whose v is k's view run as calls over separate K and V)");
  const std::string kv = kv_dtype ? *kv_dtype : "";
  TORCH_CHECK(kv.empty() || kv == "fp8" || kv == dtype,
              "attntune.explain: kv_dtype must be None (a cache of q's dtype), 'fp8' (an FP8 e4m3 cache) or the "
              "dtype, " + dtype + " (got '" + kv + "')");
  TORCH_CHECK(!is_backward(static_cast<int>(entry)) || (!latent && kv != "fp8"),
              "attntune.explain: the backward pass (entries 8 and 16) is attention's and attention_varlen's over "
              "separate K and V of q's dtype (no latent or FP8 cache: those calls are forward-only)");
  TORCH_CHECK(!deterministic || is_backward(static_cast<int>(entry)),
              "attntune.explain: deterministic is the backward pass's (entries 8 and 16): the forward kernels are "
              "deterministic already");
  TORCH_CHECK(kv != "fp8" || (entry != kEntryVarlen && entry != kEntryBackwardVarlen),
              "attntune.explain: kv_dtype 'fp8' is for attention and attention_kvcache (an FP8 cache is read by the "
              "dense and kvcache entry points only)");
  const Variants v = variants_of("explain", window_size, softcap, sinks, causal);
  Shape c{static_cast<int>(entry), dtype != "fp16", static_cast<int>(d),
          static_cast<int>(head_dim_v ? head_dim_v : d), causal ? 1 : 0, static_cast<int>(b),
          static_cast<int>(h), static_cast<int>(hkv), static_cast<int>(s), static_cast<int>(sk), 0, v};
  c.latent = latent ? 1 : 0;
  c.kv_fp8 = kv == "fp8" ? 1 : 0;
  c.qkv_fp8 = dtype == "fp8" ? 1 : 0;
  c.deterministic = deterministic ? 1 : 0;
  const Decision dec = decide(c, "", policy_now().max_ratio);
  return {dec.kernel, dec.reason};
}

// Why the kernels cannot take these tensors as they are ("" if they can): not CUDA, on two devices,
// the last dim strided.
std::string layout_problem(std::initializer_list<const at::Tensor*> ts) {
  const at::Tensor& first = **ts.begin();
  for (const at::Tensor* t : ts) {
    if (!t->defined()) continue;
    if (!t->is_cuda()) return std::string("tensors on ") + c10::DeviceTypeName(t->device().type(), true);
    if (t->device() != first.device()) return "tensors on several devices";
    if (t->dim() > 0 && t->size(-1) > 1 && t->stride(-1) != 1) return "the last dim is not contiguous";
  }
  return "";
}

// q's sizes with the last (the head dim) `dv`: out's shape.
std::vector<int64_t> sizes_with_dv(const at::Tensor& q, int64_t dv) {
  std::vector<int64_t> s(q.sizes().begin(), q.sizes().end());
  if (!s.empty()) s.back() = dv;
  return s;
}

// v's last dim, the value head dim, after checking that v has k's shape but for it
// (FlashAttention's rule: only the head dim may differ) and that it is not 0 beside a nonzero
// head_dim. kn, vn: the tensors' names ("k", "v"; "k_cache", "v_cache").
int64_t value_dim(const at::Tensor& k, const at::Tensor& v, const char* entry, const char* kn, const char* vn) {
  bool same = k.dim() == v.dim() && k.dim() > 0;
  for (int64_t i = 0; same && i + 1 < k.dim(); ++i) same = k.size(i) == v.size(i);
  ATTNTUNE_CHECK(same, entry,
                 fmt("%s must have %s's shape but for its last dim (the value head dim, which may differ from the "
                     "query/key head dim): %s ",
                     vn, kn, kn) +
                     dims(k.sizes()) + ", " + vn + " " + dims(v.sizes()));
  const int64_t dv = v.size(-1);
  ATTNTUNE_CHECK(dv > 0 || k.size(-1) == 0, entry,
                 fmt("%s's last dim (the value head dim) is 0: it must be at least 1 (%s ", vn, kn) +
                     dims(k.sizes()) + ", " + vn + " " + dims(v.sizes()) + ")");
  return dv;
}

// Whether v is k's first v.size(-1) columns, one buffer (an MLA latent cache passed as
// v = k[..., :Dv], FlashMLA's kv_cache and its head_dim_v): the same data pointer, dtype, device and
// every stride, v's last dim below k's, and keys to read (an empty k aliases nothing worth saying).
// Such a call is a latent problem (latent=1): it passes attntune_options.latent, and k as v.
bool latent_view(const at::Tensor& k, const at::Tensor& v) {
  if (!k.defined() || !v.defined() || k.dim() != v.dim() || k.dim() == 0 || k.numel() == 0) return false;
  if (v.size(-1) < 1 || v.size(-1) >= k.size(-1)) return false;
  if (k.scalar_type() != v.scalar_type() || k.device() != v.device() || k.data_ptr() != v.data_ptr()) return false;
  for (int64_t i = 0; i < k.dim(); ++i)
    if (k.stride(i) != v.stride(i)) return false;
  return true;
}

// q's last dim against k's: the query/key head dim.
void check_qk_dim(const at::Tensor& q, const at::Tensor& k, const char* entry, const char* kn) {
  ATTNTUNE_CHECK(q.size(-1) == k.size(-1), entry,
                 fmt("q and %s must have the same head_dim (the last dim; only v's may differ): q ", kn) +
                     dims(q.sizes()) + ", " + kn + " " + dims(k.sizes()));
}

// out: q's shape with the value head dim last (q's shape when there is one head dim).
void check_out(const at::Tensor& out, const at::Tensor& like, int64_t dv, const char* entry, bool fp8_forward = false) {
  const std::vector<int64_t> want = sizes_with_dv(like, dv);
  ATTNTUNE_CHECK(out.sizes() == at::IntArrayRef(want), entry,
                 dv == like.size(-1) ? "out must have q's shape (" + dims(want) + "; got " + dims(out.sizes()) + ")"
                                     : "out must have q's shape with v's head dim last (" + dims(want) + "; got " +
                                           dims(out.sizes()) + ")");
  if (fp8_forward) {
    ATTNTUNE_CHECK(out.scalar_type() == at::kBFloat16, entry, "out must be bfloat16 (the FP8 forward's output)");
  } else {
    ATTNTUNE_CHECK(out.scalar_type() == like.scalar_type(), entry, "out must have q's dtype");
  }
  ATTNTUNE_CHECK(out.device() == like.device(), entry, "out must be on q's device");
}

// The ops' own out: like q (empty_like: its strides' order), with v's last dim. With one head dim
// exactly empty_like(q); with two, q's dims in the order of its strides (largest first, ties in dim
// order; the head dim innermost), so [B, S, H, D] storage seen as [B, H, S, D] gives [B, S, H, Dv]
// storage. The fake implementations (__init__.py's _out_like) allocate the same strides.
at::Tensor out_like(const at::Tensor& q, const at::Tensor& v) {
  // The FP8 forward's (float8_e4m3fn q) out is bf16, else q's dtype.
  const auto opts = q.options().dtype(q.scalar_type() == at::kFloat8_e4m3fn ? at::kBFloat16 : q.scalar_type());
  if (q.dim() == 0 || v.dim() == 0 || v.size(-1) == q.size(-1)) return at::empty_like(q, opts);
  const int64_t n = q.dim();
  std::vector<int64_t> order(n - 1);
  for (int64_t i = 0; i + 1 < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return q.stride(a) > q.stride(b); });
  order.push_back(n - 1);
  std::vector<int64_t> sizes(n), inverse(n);
  for (int64_t i = 0; i < n; ++i) {
    sizes[i] = order[i] == n - 1 ? v.size(-1) : q.size(order[i]);
    inverse[order[i]] = i;
  }
  return at::empty(sizes, opts).permute(inverse);
}

void check_lse(const std::optional<at::Tensor>& lse, at::IntArrayRef shape, const at::Tensor& q, const char* entry) {
  if (!lse) return;
  ATTNTUNE_CHECK(lse->sizes() == shape, entry, "lse has the wrong shape (" + dims(lse->sizes()) + ", expected " +
                                                   dims(shape) + ")");
  ATTNTUNE_CHECK(lse->scalar_type() == at::kFloat, entry, "lse must be float32");
  ATTNTUNE_CHECK(lse->is_contiguous(), entry, "lse must be contiguous");
  ATTNTUNE_CHECK(lse->device() == q.device(), entry, "lse must be on q's device");
}

void raise_cuda(int r, const char* entry) {
  TORCH_CHECK(false, fmt("attntune.%s: the kernel failed with CUDA error %d: %s", entry, r, attntune_last_error()));
}

// The one path of every entry point: decide from the shapes (route), run the library's kernel on
// the current stream through `kernel` (it returns the C entry point's code), and say whether it
// ran. false: the call falls back, counted with the reason (a refusal's is the library's own); a
// CUDA error raises; under the "raise" policy a fallback raises.
template <class Kernel>
bool ran_kernel(const char* e, const Shape& c, const at::Tensor& q, std::initializer_list<const at::Tensor*> tensors,
                Kernel kernel) {
  const std::string why_not = layout_problem(tensors);  // a CPU tensor, a layout the kernels cannot read
  if (!why_not.empty()) {
    fall_back(c, q, why_not, false);
    return false;
  }
  const Decision d = decide(c, call_dtype(c, q), policy_now().max_ratio);
  if (d.kernel < 0) {
    fall_back(c, q, d.reason, d.tunable);
    return false;
  }
  c10::cuda::CUDAGuard guard(q.device());
  const int r = kernel(c10::cuda::getCurrentCUDAStream().stream());
  if (r == 0) {
    count(c, d.kernel, "", "");
    return true;
  }
  if (r != kUnsupported) raise_cuda(r, e);
  fall_back(c, q, std::string("the library refused the call: ") + attntune_last_error(), false);
  return false;
}

// ------------------------------------------------------------------ the fallback

// Attention of q [B, H, S, D] over k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv] with `visible` (bool,
// broadcastable to [B, 1, S, Sk]; undefined: all keys, or causal bottom-right when `causal`), by
// SDPA (which takes Dv != D: its math and memory-efficient backends do, its flash one declines and
// SDPA picks another); rows that see no key are zero and their LSE -inf. Writes out [B, H, S, Dv]
// and, if given, lse [B, H, S]. For calls without variants.
void sdpa_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor visible, bool causal,
               double scale, at::Tensor& out, const std::optional<at::Tensor>& lse) {
  const int64_t S = q.size(2), Sk = k.size(2), H = q.size(1), Hkv = k.size(1);
  if (q.numel() == 0) return;
  if (Sk == 0) {
    out.zero_();
    if (lse) lse->fill_(-std::numeric_limits<float>::infinity());
    return;
  }
  if (causal && !visible.defined() && S != Sk) {
    auto opts = q.options().dtype(at::kLong);
    visible = (at::arange(Sk, opts).view({1, Sk}) <= at::arange(S, opts).view({S, 1}) + (Sk - S)).view({1, 1, S, Sk});
  }
  const bool flag = causal && !visible.defined();  // S == Sk: SDPA's own causal
  if (lse && q.is_cuda() && !visible.defined() && (q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16) &&
      q.size(3) % 8 == 0 && q.size(3) <= 256 && v.size(3) == q.size(3)) {
    // Autograd asks every forward for the LSE: SDPA's flash kernel (FlashAttention-2) returns it with
    // the output in one pass, where the explicit fp32 scores below cost several times the attention.
    // Its K/V heads must be Q's (repeated for GQA). A refusal (the arch, a stride) takes the general path.
    try {
      const at::Tensor kr = H != Hkv ? k.repeat_interleave(H / Hkv, 1) : k;
      const at::Tensor vr = H != Hkv ? v.repeat_interleave(H / Hkv, 1) : v;
      const auto res = at::_scaled_dot_product_flash_attention(q, kr, vr, 0.0, flag, false, scale);
      out.copy_(std::get<0>(res));
      lse->copy_(std::get<1>(res));
      return;
    } catch (const c10::Error&) {
    }
  }
  std::optional<at::Tensor> mask;
  if (visible.defined()) mask = visible;
  at::Tensor o = at::scaled_dot_product_attention(q, k, v, mask, 0.0, flag, scale, /*enable_gqa=*/H != Hkv);
  if (visible.defined()) {
    const at::Tensor any = visible.any(-1, /*keepdim=*/true);  // [B or 1, 1, S, 1]
    o = at::where(any, o, at::zeros({}, o.options()));
  }
  out.copy_(o);
  if (lse) {
    // The LSE in fp32 by chunks of query rows (a chunk's scores under 2^25 values, as variant_into's):
    // autograd asks every forward for it, long sequences included.
    const at::Tensor kk = (H != Hkv ? k.repeat_interleave(H / Hkv, 1) : k).to(at::kFloat).transpose(-2, -1);
    if (flag)
      visible = at::ones({S, Sk}, q.options().dtype(at::kBool)).tril();
    const int64_t B = q.size(0);
    const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(S, (int64_t{1} << 25) / std::max<int64_t>(1, B * H * Sk)));
    for (int64_t r0 = 0; r0 < S; r0 += rows) {
      const int64_t n = std::min(rows, S - r0);
      at::Tensor scores = at::matmul(q.narrow(2, r0, n).to(at::kFloat), kk) * scale;
      if (visible.defined()) {
        const at::Tensor vis = visible.dim() >= 2 && visible.size(-2) == S ? visible.narrow(-2, r0, n) : visible;
        scores.masked_fill_(vis.logical_not(), -std::numeric_limits<float>::infinity());
      }
      lse->narrow(2, r0, n).copy_(at::logsumexp(scores, -1));
    }
  }
}

// The fallback of calls with variants: attention of q [B, H, S, D] over k [B, Hkv, Sk, D] and v
// [B, Hkv, Sk, Dv] with the window, the soft-cap and the sinks, in fp32 (fp64 for fp64 inputs) by
// explicit matmuls (SDPA takes neither a score
// transform nor a sink; FlexAttention, which takes both, is Python and needs torch.compile to be
// fast, and this runs inside the C++ operator: docs/design/torch.md). Per chunk of query rows:
// S = Q K^T * scale -> softcap * tanh(S / softcap) -> the window, causal and length masks (-inf)
// -> softmax -> P V, with the LSE; then the sinks through the LSE: out * sigmoid(lse - sink) and
// lse' = logaddexp(lse, sink) (exactly the sink in the softmax's denominator). A row that sees no
// key gives zeros and LSE -inf, or its sink's logit. len_q / len_k: [B] int64, each sequence's query
// rows and keys (rows bottom-right aligned per sequence; keys past len_k are masked, and zeroed:
// a stale cache may hold NaN there), or undefined (S and Sk). Writes out ([B, H, S, Dv], any
// strides) and, if given, lse [B, H, S]. Everything is on q's device with shapes from the host: no sync, so it
// can be captured in a CUDA graph.
void variant_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& len_q,
                  const at::Tensor& len_k, bool causal, const Variants& var, const at::Tensor& sinks, double scale,
                  at::Tensor& out, const std::optional<at::Tensor>& lse) {
  const int64_t B = q.size(0), H = q.size(1), S = q.size(2), D = q.size(3), Hkv = k.size(1), Sk = k.size(2);
  const int64_t Dv = v.size(3);
  if (q.numel() == 0) return;
  const int64_t G = Hkv > 0 ? H / Hkv : 1;  // query heads per K/V head: head h reads K/V head h / G
  // fp32, or fp64 for fp64 inputs (so that torch.autograd.gradcheck can differentiate it numerically).
  const at::ScalarType ct = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto f32 = q.options().dtype(ct), i64 = q.options().dtype(at::kLong);
  const float inf = std::numeric_limits<float>::infinity();
  at::Tensor kf = k.to(ct), vf = v.to(ct);
  at::Tensor lk5, diag5;  // [B, 1, 1, 1, 1]: each sequence's keys, and its diagonal len_k - len_q
  if (len_k.defined()) {
    lk5 = len_k.view({B, 1, 1, 1, 1});
    const at::Tensor stale = (at::arange(Sk, i64).view({1, 1, Sk, 1}) >= len_k.view({B, 1, 1, 1}));
    kf = kf.masked_fill(stale, 0.0);
    vf = vf.masked_fill(stale, 0.0);
  }
  if (len_q.defined() || len_k.defined())
    diag5 = ((len_k.defined() ? len_k : at::full({B}, Sk, i64)) - (len_q.defined() ? len_q : at::full({B}, S, i64)))
                .view({B, 1, 1, 1, 1});
  const int64_t right = causal ? 0 : var.right;  // the window's right side as applied
  const at::Tensor sink5 = sinks.defined() ? sinks.view({1, Hkv, G, 1, 1}) : at::Tensor();
  // Rows per chunk: the scores of a chunk stay under 2^25 fp32 values (128 MiB).
  const int64_t budget = int64_t{1} << 25;
  const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(S, budget / std::max<int64_t>(1, B * H * std::max<int64_t>(Sk, 1))));
  for (int64_t r0 = 0; r0 < S; r0 += rows) {
    const int64_t n = std::min(rows, S - r0);
    // The keys the chunk's rows can see: with the lengths on the host (the dense entry) the
    // window narrows them, so the work follows the window; else all, masked per sequence.
    int64_t j0 = 0, j1 = Sk;
    if (!diag5.defined()) {
      const int64_t diag = Sk - S;
      if (var.left >= 0) j0 = std::max<int64_t>(0, r0 + diag - var.left);
      if (right >= 0) j1 = std::min<int64_t>(Sk, r0 + n - 1 + diag + right + 1);
    }
    at::Tensor o, l;  // [B, Hkv, G, n, Dv] and the LSE [B, Hkv, G, n, 1], fp32
    if (j1 <= j0) {
      o = at::zeros({B, Hkv, G, n, Dv}, f32);
      l = at::full({B, Hkv, G, n, 1}, -inf, f32);
    } else {
      const int64_t m = j1 - j0;
      const at::Tensor qc = q.narrow(2, r0, n).to(ct).reshape({B, Hkv, G * n, D});
      at::Tensor s = at::matmul(qc, kf.narrow(2, j0, m).transpose(-2, -1)).mul_(scale).view({B, Hkv, G, n, m});
      if (var.softcap > 0) s.div_(var.softcap).tanh_().mul_(var.softcap);
      const at::Tensor i = at::arange(r0, r0 + n, i64).view({n, 1}), j = at::arange(j0, j1, i64).view({1, m});
      const at::Tensor row = diag5.defined() ? i + diag5 : i + (Sk - S);  // the row's diagonal key
      at::Tensor visible;  // broadcastable to [B, Hkv, G, n, m]; undefined: every key
      auto also = [&](const at::Tensor& t) { visible = visible.defined() ? visible.logical_and(t) : t; };
      if (lk5.defined()) also(j < lk5);
      if (var.left >= 0) also(j >= row - var.left);
      if (right >= 0) also(j <= row + right);
      if (visible.defined()) s.masked_fill_(visible.logical_not(), -inf);
      at::Tensor mx = std::get<0>(s.max(-1, /*keepdim=*/true));
      mx = at::where(at::isneginf(mx), at::zeros_like(mx), mx);  // a row without keys: exp(-inf) = 0
      s.sub_(mx).exp_();
      l = s.sum(at::IntArrayRef{-1}, /*keepdim=*/true);
      o = at::matmul(s.view({B, Hkv, G * n, m}), vf.narrow(2, j0, m)).view({B, Hkv, G, n, Dv});
      o = at::where(l > 0, o / l, at::zeros({}, f32));
      l = l.log_().add_(mx);  // -inf where no key is seen
    }
    if (sink5.defined()) {
      o = o * at::sigmoid(l - sink5);
      l = at::logaddexp(l, sink5.expand_as(l));
    }
    out.narrow(2, r0, n).copy_(o.view({B, H, n, Dv}));
    if (lse) lse->narrow(2, r0, n).copy_(l.view({B, H, n}));
  }
}

// ------------------------------------------------------------------ attention (dense)

void attention_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor out,
                    std::optional<at::Tensor> lse, std::optional<double> scale, bool is_causal,
                    at::IntArrayRef window_size, double softcap, const std::optional<at::Tensor>& sinks,
                    const std::optional<at::Tensor>& k_descale, const std::optional<at::Tensor>& v_descale,
                    const std::optional<at::Tensor>& q_descale) {
  const char* e = "attention";
  ATTNTUNE_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, e,
                 "q, k and v must be 4-d: [batch, heads, seqlen, head_dim] (v's last dim: the value head dim)");
  const int64_t B = q.size(0), H = q.size(1), S = q.size(2), D = q.size(3), Hkv = k.size(1), Sk = k.size(2);
  ATTNTUNE_CHECK(k.size(0) == B, e, "q, k and v must have the same batch");
  const int64_t Dv = value_dim(k, v, e, "k", "v");
  check_qk_dim(q, k, e, "k");
  ATTNTUNE_CHECK(Hkv > 0 ? H % Hkv == 0 : H == 0, e, fmt("heads of q (%lld) must be a multiple of k's (%lld)",
                                                static_cast<long long>(H), static_cast<long long>(Hkv)));
  const int fp8 = kv_fp8_of(e, q, k, v, "k", "v", "q, k and v must share a dtype", /*fp8_queries=*/true);
  const int kv_fp8 = fp8 == 1, qkv_fp8 = fp8 == 2;  // an FP8 cache, or the FP8 forward
  check_out(out, q, Dv, e, qkv_fp8);
  check_lse(lse, {B, H, S}, q, e);
  const Variants var = variants_of(e, window_size, softcap, sinks.has_value() && sinks->defined(), is_causal);
  const at::Tensor sk_logits = sinks_of(e, sinks, H, q);
  Descales ds;
  const at::Tensor kd = descale_of(e, "k_descale", k_descale, fp8, k, B, Hkv, q, ds.k_stride),
                   vd = descale_of(e, "v_descale", v_descale, fp8, k, B, Hkv, q, ds.v_stride);
  ATTNTUNE_CHECK(qkv_fp8 || !q_descale || !q_descale->defined(), e,
                 "q_descale dequantises the FP8 forward's q (q, k and v float8_e4m3fn); q is " +
                     py_dtype(q.scalar_type()));
  const at::Tensor qd = descale_of(e, "q_descale", q_descale, fp8, k, B, Hkv, q, ds.q_stride);
  ds.k = kd.defined() ? kd.data_ptr<float>() : nullptr;
  ds.v = vd.defined() ? vd.data_ptr<float>() : nullptr;
  ds.q = qd.defined() ? qd.data_ptr<float>() : nullptr;
  const double sc = scale_of(scale, D);
  Shape c{kEntryDense, qkv_fp8 || q.scalar_type() == at::kBFloat16, as_int(D, e, "head_dim"), as_int(Dv, e, "head_dim_v"),
          is_causal ? 1 : 0, as_int(B, e, "batch"), as_int(H, e, "heads"), as_int(Hkv, e, "heads_kv"),
          as_int(S, e, "seqlen_q"), as_int(Sk, e, "seqlen_k"), 0, var};
  c.latent = !qkv_fp8 && latent_view(k, v) ? 1 : 0;  // v = k[..., :Dv]: one buffer, passed as k (its pointer and strides)
  c.kv_fp8 = kv_fp8;
  c.qkv_fp8 = qkv_fp8;
  // The FP8 forward reads V transposed, [B, Hkv, Dv, Sk] with the keys contiguous (docs/CONTRACT.md "FP8
  // forward"): a v whose own strides are so ([B, Hkv, Sk, Dv] seen over such storage: v = vt.transpose(2,
  // 3), each row's stride a multiple of 16 bytes) is read in place; any other is copied so, in the call.
  // Its layout is checked here, not by layout_problem (its last dim is the strided one): a 1-element view
  // stands in for v's device.
  const bool v_transposed = qkv_fp8 && v.stride(2) == 1 && v.stride(3) % 16 == 0 && v.stride(0) % 16 == 0 &&
                            v.stride(1) % 16 == 0;
  const at::Tensor v_where = qkv_fp8 && v.numel() > 0 ? v.as_strided({1}, {1}) : v;
  const bool ran = ran_kernel(e, c, q, {&q, &k, &v_where, &out, &sk_logits}, [&](cudaStream_t stream) {
    const long long qs[3] = {q.stride(0), q.stride(1), q.stride(2)}, ks[3] = {k.stride(0), k.stride(1), k.stride(2)},
                    os[3] = {out.stride(0), out.stride(1), out.stride(2)};
    long long vs[3] = {v.stride(0), v.stride(1), v.stride(2)};
    const void* vp = c.latent ? k.data_ptr() : v.data_ptr();
    at::Tensor vt;  // the FP8 forward's transposed copy of v (rows padded to 16 bytes), when v is not one
    if (qkv_fp8 && v_transposed) {
      vs[2] = v.stride(3);  // {batch, head, value dim}
    } else if (qkv_fp8) {
      vt = at::empty({B, Hkv, Dv, (Sk + 15) / 16 * 16}, v.options());
      if (Sk > 0) vt.view(at::kByte).narrow(3, 0, Sk).copy_(v.view(at::kByte).transpose(2, 3));
      for (int i = 0; i < 3; ++i) vs[i] = vt.stride(i);
      vp = vt.data_ptr();
    }
    float* l = lse ? lse->data_ptr<float>() : nullptr;
    if (!attntune_attention_forward_ex)  // an export before the variants: plain one-dim calls only reach here
      return attntune_attention_forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), l, c.b, c.h, c.hkv,
                                        c.s, c.sk, c.d, qs, ks, vs, os, static_cast<float>(sc), c.causal, stream);
    const attntune_options o = options_of(c, sk_logits.defined() ? sk_logits.data_ptr<float>() : nullptr, ds);
    return attntune_attention_forward_ex(q.data_ptr(), k.data_ptr(), vp, out.data_ptr(), l, c.b, c.h, c.hkv, c.s,
                                         c.sk, c.d, qs, ks, c.latent ? ks : vs, os, static_cast<float>(sc), c.causal,
                                         &o, stream);
  });
  if (ran) return;
  if (qkv_fp8)  // q, k and v dequantised as the kernels read them, through the fp32 path; out bf16
    variant_into(dequantised_q(q, qd, B, Hkv), dequantised(k, kd, {B, Hkv, 1, 1}), dequantised(v, vd, {B, Hkv, 1, 1}),
                 at::Tensor(), at::Tensor(), is_causal, var, sk_logits, sc, out, lse);
  else if (kv_fp8)  // the cache dequantised as the kernels read it, through the fp32 path (SDPA takes no FP8)
    variant_into(q, dequantised(k, kd, {B, Hkv, 1, 1}), dequantised(v, vd, {B, Hkv, 1, 1}), at::Tensor(),
                 at::Tensor(), is_causal, var, sk_logits, sc, out, lse);
  else if (var.any())
    variant_into(q, k, v, at::Tensor(), at::Tensor(), is_causal, var, sk_logits, sc, out, lse);
  else
    sdpa_into(q, k, v, at::Tensor(), is_causal, sc, out, lse);
}

// `deterministic` is not the forward's (its kernels are deterministic): the op carries it so that its
// autograd formula (__init__.py) can hand it to attention_backward, as flash_attn_func's does.
std::tuple<at::Tensor, at::Tensor> attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             std::optional<double> scale, bool is_causal, bool return_lse,
                                             at::IntArrayRef window_size, double softcap,
                                             const std::optional<at::Tensor>& sinks,
                                             const std::optional<at::Tensor>& k_descale,
                                             const std::optional<at::Tensor>& v_descale, bool /*deterministic*/,
                                             const std::optional<at::Tensor>& q_descale) {
  at::Tensor out = out_like(q, v);
  at::Tensor lse = return_lse && q.dim() == 4 ? at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat))
                                              : at::empty({0}, q.options().dtype(at::kFloat));
  attention_into(q, k, v, out, return_lse ? std::optional<at::Tensor>(lse) : std::nullopt, scale, is_causal,
                 window_size, softcap, sinks, k_descale, v_descale, q_descale);
  return {out, lse};
}

// ------------------------------------------------------------------ the backward pass (dense attention)

// The gradients by PyTorch, for calls no kernel serves: dq, dk, dv (and dsinks, [H], when `sinks` is
// defined) of attention of q [B, H, S, D] over k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv] with the variants,
// given dout [B, H, S, Dv] and, if defined, dlse [B, H, S] (a gradient of the forward's LSE). Explicit
// math in float32 (float64 for float64 inputs), chunks of query rows as variant_into, recomputing the
// softmax rather than trusting a saved LSE, so it is the exact gradient of the fallback's forward:
//   s = scale * q.k (soft-capped: C tanh(s / C)), masked; P = exp(s - lse) with the sink in the
//   denominator; dP = dO V^T; D_i = sum_j P_ij dP_ij - dlse_i; dS = P (dP - D), times 1 - tanh^2
//   under a soft-cap; dQ = scale dS K, dK = scale dS^T Q and dV = P^T dO, each K/V head summed over its
//   query heads; dsink_h = -sum_i P_sink_i D_i.
// A row that sees no key (and has no sink) has P = 0 and contributes nothing. len_q / len_k: [B] int64,
// each sequence's query rows and keys (a packed batch padded to its longest, backward_varlen_into: rows
// bottom-right aligned per sequence, keys past len_k masked and zeroed), or undefined (S and Sk); the
// rows past len_q must come with zero dout and dlse (they then contribute nothing). No device sync:
// shapes come from the host, so it can be captured in a CUDA graph.
void backward_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dout,
                   const at::Tensor& dlse, bool causal, const Variants& var, const at::Tensor& sinks, double scale,
                   at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, at::Tensor& dsinks,
                   const at::Tensor& len_q = at::Tensor(), const at::Tensor& len_k = at::Tensor()) {
  const int64_t B = q.size(0), H = q.size(1), S = q.size(2), D = q.size(3), Hkv = k.size(1), Sk = k.size(2);
  const int64_t Dv = v.size(3);
  const at::ScalarType ct = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto copts = q.options().dtype(ct), i64 = q.options().dtype(at::kLong);
  const int64_t G = Hkv > 0 ? H / Hkv : 1;
  at::Tensor dk_acc = at::zeros({B, Hkv, Sk, D}, copts), dv_acc = at::zeros({B, Hkv, Sk, Dv}, copts);
  at::Tensor ds_acc = sinks.defined() ? at::zeros({Hkv, G}, copts) : at::Tensor();
  if (q.numel() == 0 || Sk == 0 || H == 0) {
    dq.zero_();
    dk.zero_();
    dv.zero_();
    if (dsinks.numel()) dsinks.zero_();
    if (sinks.defined() && q.numel() > 0 && Sk == 0 && H > 0) {
      // No keys: every row's weight is its sink's (P_sink = 1): dsink_h = -sum_i D_i, D_i = dO_i . 0 - dlse_i.
      if (dlse.defined()) dsinks.copy_(dlse.to(ct).sum(at::IntArrayRef{0, 2}));
    }
    return;
  }
  at::Tensor kf = k.to(ct), vf = v.to(ct);
  at::Tensor lk5, diag5;  // [B, 1, 1, 1, 1]: each sequence's keys, and its diagonal len_k - len_q
  if (len_k.defined()) {
    // Keys past a sequence's length (another sequence's, or anything): masked, and zeroed, so that no
    // NaN there reaches dP (0 * NaN is NaN).
    lk5 = len_k.view({B, 1, 1, 1, 1});
    const at::Tensor stale = at::arange(Sk, i64).view({1, 1, Sk, 1}) >= len_k.view({B, 1, 1, 1});
    kf = kf.masked_fill(stale, 0.0);
    vf = vf.masked_fill(stale, 0.0);
    diag5 = (len_k - (len_q.defined() ? len_q : at::full({B}, S, i64))).view({B, 1, 1, 1, 1});
  }
  const float inf = std::numeric_limits<float>::infinity();
  const int64_t right = causal ? 0 : var.right;
  const at::Tensor sink5 = sinks.defined() ? sinks.to(ct).view({1, Hkv, G, 1, 1}) : at::Tensor();
  // Rows per chunk: a chunk's score-sized tensors (s, P, dP, dS) stay under 2^24 values each.
  const int64_t budget = int64_t{1} << 24;
  const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(S, budget / std::max<int64_t>(1, B * H * Sk)));
  const int64_t diag = Sk - S;
  for (int64_t r0 = 0; r0 < S; r0 += rows) {
    const int64_t n = std::min(rows, S - r0);
    int64_t j0 = 0, j1 = Sk;  // the keys the chunk's rows can see (per-sequence lengths: all, masked)
    if (!diag5.defined()) {
      if (var.left >= 0) j0 = std::max<int64_t>(0, r0 + diag - var.left);
      if (right >= 0) j1 = std::min<int64_t>(Sk, r0 + n - 1 + diag + right + 1);
    }
    at::Tensor go = dout.narrow(2, r0, n).to(ct).reshape({B, Hkv, G * n, Dv});
    at::Tensor dl = dlse.defined() ? dlse.narrow(2, r0, n).to(ct).reshape({B, Hkv, G, n, 1}) : at::Tensor();
    if (j1 <= j0) {  // no row of the chunk sees a key
      dq.narrow(2, r0, n).zero_();
      if (ds_acc.defined() && dl.defined()) ds_acc.add_(dl.sum(at::IntArrayRef{0, 3, 4}));  // P_sink = 1, D = -dlse
      continue;
    }
    const int64_t m = j1 - j0;
    const at::Tensor kc = kf.narrow(2, j0, m), vc = vf.narrow(2, j0, m);
    const at::Tensor qc = q.narrow(2, r0, n).to(ct).reshape({B, Hkv, G * n, D});
    at::Tensor s = at::matmul(qc, kc.transpose(-2, -1)).mul_(scale).view({B, Hkv, G, n, m});
    at::Tensor t;  // tanh(s / C) under a soft-cap
    if (var.softcap > 0) {
      t = s.div(var.softcap).tanh_();
      s = t * var.softcap;
    }
    const at::Tensor i = at::arange(r0, r0 + n, i64).view({n, 1}), j = at::arange(j0, j1, i64).view({1, m});
    const at::Tensor row = diag5.defined() ? i + diag5 : i + diag;  // the row's diagonal key
    at::Tensor visible;
    auto also = [&](const at::Tensor& x) { visible = visible.defined() ? visible.logical_and(x) : x; };
    if (lk5.defined()) also(j < lk5);
    if (var.left >= 0) also(j >= row - var.left);
    if (right >= 0) also(j <= row + right);
    if (visible.defined()) s.masked_fill_(visible.logical_not(), -inf);
    at::Tensor mx = std::get<0>(s.max(-1, /*keepdim=*/true));
    if (sink5.defined()) mx = at::maximum(mx, sink5.expand_as(mx));
    mx = at::where(at::isneginf(mx), at::zeros_like(mx), mx);
    at::Tensor p = (s - mx).exp_();
    at::Tensor l = p.sum(at::IntArrayRef{-1}, /*keepdim=*/true);
    at::Tensor psink;
    if (sink5.defined()) {
      psink = (sink5 - mx).exp();
      l = l + psink;
    }
    const at::Tensor linv = at::where(l > 0, l.reciprocal(), at::zeros({}, copts));
    p.mul_(linv);
    const at::Tensor dp = at::matmul(go, vc.transpose(-2, -1)).view({B, Hkv, G, n, m});
    at::Tensor dd = (p * dp).sum(at::IntArrayRef{-1}, /*keepdim=*/true);  // D_i = dO_i . o_i
    if (dl.defined()) dd = dd - dl;
    at::Tensor ds = p * (dp - dd);
    if (t.defined()) ds.mul_(1 - t * t);
    const at::Tensor ds3 = ds.view({B, Hkv, G * n, m}), p3 = p.view({B, Hkv, G * n, m});
    dq.narrow(2, r0, n).copy_(at::matmul(ds3, kc).mul_(scale).view({B, H, n, D}));
    dk_acc.narrow(2, j0, m).add_(at::matmul(ds3.transpose(-2, -1), qc).mul_(scale));
    dv_acc.narrow(2, j0, m).add_(at::matmul(p3.transpose(-2, -1), go));
    if (ds_acc.defined()) ds_acc.sub_((psink * linv * dd).sum(at::IntArrayRef{0, 3, 4}));
  }
  dk.copy_(dk_acc);
  dv.copy_(dv_acc);
  if (ds_acc.defined()) dsinks.copy_(ds_acc.view({H}));
}

// A tensor the kernels take as it is (16-byte aligned, the last dim contiguous, strides of whole 16
// bytes), else a contiguous copy: dout comes from autograd (sum()'s is an expanded tensor of stride 0).
at::Tensor kernel_layout(const at::Tensor& t) {
  bool ok = reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0 && (t.size(-1) <= 1 || t.stride(-1) == 1);
  for (int64_t i = 0; ok && i + 1 < t.dim(); ++i) ok = t.stride(i) % 8 == 0;
  return ok ? t : t.contiguous();
}

// The backward of `attention` (its autograd formula, __init__.py): dq, dk, dv and dsinks ([H] float32,
// [0] without sinks) from the forward's inputs, its out and lse ([B, H, S] float32; [0]: not saved), and
// the gradients dout (out's shape) and dlse (None: the LSE was not used). A kernel of the library
// serves it (attntune_attention_backward) when one was tuned for its problem (pass=bwd) and the LSE was
// saved and not used; else the fallback (backward_into), counted in coverage as the forward is.
// deterministic: bit-identical gradients run to run, FlashAttention's deterministic=True: the kernel
// is asked for them (attntune_options.deterministic) and one that cannot give them is not chosen; the
// fallback's explicit math gives them whatever the flag.
// The sinks' gradient after a kernel gave dq, dk and dv (its P = exp(S - lse) with the forward's LSE,
// which holds the sink): dsink_h = -sum_{rows i} P_sink_i D_i, P_sink = exp(sink_h - lse_i) and
// D_i = dO_i . O_i in float32 (the kernels' D). dout and out are viewed so that their leading dims are
// the LSE's (the head at `head_axis`, the head dim last); written into dsinks [H].
void sinks_grad(const at::Tensor& dout, const at::Tensor& out, const at::Tensor& lse, const at::Tensor& logits,
                int64_t head_axis, at::Tensor& dsinks) {
  const at::Tensor d = (dout.to(at::kFloat) * out.to(at::kFloat)).sum(-1);  // lse's shape
  std::vector<int64_t> shape(static_cast<std::size_t>(lse.dim()), 1), rows;
  shape[static_cast<std::size_t>(head_axis)] = logits.numel();
  for (int64_t a = 0; a < lse.dim(); ++a)
    if (a != head_axis) rows.push_back(a);
  const at::Tensor psink = (logits.to(at::kFloat).view(shape) - lse).exp();
  dsinks.copy_((psink * d).sum(rows).neg());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const std::optional<at::Tensor>& dlse, std::optional<double> scale, bool is_causal,
    at::IntArrayRef window_size, double softcap, const std::optional<at::Tensor>& sinks, bool deterministic) {
  const char* e = "attention_backward";
  ATTNTUNE_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, e,
                 "q, k and v must be 4-d: [batch, heads, seqlen, head_dim] (v's last dim: the value head dim)");
  const int64_t B = q.size(0), H = q.size(1), S = q.size(2), D = q.size(3), Hkv = k.size(1), Sk = k.size(2);
  ATTNTUNE_CHECK(k.size(0) == B, e, "q, k and v must have the same batch");
  const int64_t Dv = value_dim(k, v, e, "k", "v");
  check_qk_dim(q, k, e, "k");
  ATTNTUNE_CHECK(Hkv > 0 ? H % Hkv == 0 : H == 0, e, fmt("heads of q (%lld) must be a multiple of k's (%lld)",
                                                         static_cast<long long>(H), static_cast<long long>(Hkv)));
  ATTNTUNE_CHECK(!is_float8(k.scalar_type()) && !is_float8(v.scalar_type()), e,
                 "attention over an FP8 (float8_e4m3fn) cache is forward-only: it has no backward pass");
  ATTNTUNE_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), e,
                 "q, k and v must share a dtype");
  check_out(out, q, Dv, e);
  ATTNTUNE_CHECK(dout.sizes() == out.sizes(), e,
                 "dout must have out's shape (" + dims(out.sizes()) + "; got " + dims(dout.sizes()) + ")");
  ATTNTUNE_CHECK(dout.scalar_type() == q.scalar_type() && dout.device() == q.device(), e,
                 "dout must have q's dtype and device");
  const bool have_lse = lse.numel() > 0;
  if (have_lse) check_lse(lse, {B, H, S}, q, e);
  at::Tensor dl;
  if (dlse && dlse->defined() && dlse->numel() > 0) {
    ATTNTUNE_CHECK(dlse->sizes() == at::IntArrayRef({B, H, S}) && dlse->device() == q.device(), e,
                   "dlse must be [batch, heads, seqlen_q] (" + dims({B, H, S}) + "; got " + dims(dlse->sizes()) +
                       ") on q's device");
    dl = *dlse;
  }
  const Variants var = variants_of(e, window_size, softcap, sinks.has_value() && sinks->defined(), is_causal);
  const at::Tensor sk_logits = sinks_of(e, sinks, H, q);
  const double sc = scale_of(scale, D);
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  at::Tensor dsinks = at::empty({sk_logits.defined() ? H : 0}, q.options().dtype(at::kFloat));
  Shape c{kEntryBackward, q.scalar_type() == at::kBFloat16, as_int(D, e, "head_dim"), as_int(Dv, e, "head_dim_v"),
          is_causal ? 1 : 0, as_int(B, e, "batch"), as_int(H, e, "heads"), as_int(Hkv, e, "heads_kv"),
          as_int(S, e, "seqlen_q"), as_int(Sk, e, "seqlen_k"), 0, var};
  c.deterministic = deterministic ? 1 : 0;
  const at::Tensor g = dout.numel() ? kernel_layout(dout) : dout;
  bool ran = false;
  if (!have_lse && q.numel() > 0) {
    fall_back(c, q, "the forward's LSE was not saved (torch.ops." ATTNTUNE_STR(ATTNTUNE_TORCH_NAMESPACE)
                    ".attention called with return_lse=False under autograd; attntune.attention asks for it)",
              false);
  } else if (dl.defined()) {
    fall_back(c, q, "the forward's LSE has a gradient (return_lse=True and the LSE used): the kernels take dout "
                    "alone", false);
  } else {
    ran = ran_kernel(e, c, q, {&q, &k, &v, &out, &g, &lse, &sk_logits}, [&](cudaStream_t stream) {
      auto st = [](const at::Tensor& t, long long* x) {
        for (int i = 0; i < 3; ++i) x[i] = t.stride(i);
      };
      long long qs[3], ks[3], vs[3], os[3], gs[3], dqs[3], dks[3], dvs[3];
      st(q, qs), st(k, ks), st(v, vs), st(out, os), st(g, gs), st(dq, dqs), st(dk, dks), st(dv, dvs);
      // The sinks' logits as the forward's call passed them: a sink build serves calls that name
      // them (its kernels read the LSE, which holds them, not the logits).
      const attntune_options o = options_of(c, sk_logits.defined() ? sk_logits.data_ptr<float>() : nullptr);
      return attntune_attention_backward_ex(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                            lse.data_ptr<float>(), g.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                                            dv.data_ptr(), c.b, c.h, c.hkv, c.s, c.sk, c.d, qs, ks, vs, os, gs, dqs,
                                            dks, dvs, static_cast<float>(sc), c.causal, &o, stream);
    });
  }
  if (!ran) {
    backward_into(q, k, v, g, dl, is_causal, var, sk_logits, sc, dq, dk, dv, dsinks);
  } else if (dsinks.numel() > 0) {
    // The kernel gave dq, dk and dv (its P = exp(S - lse) with the forward's LSE, which holds the
    // sink); the sinks' own gradient is the ops' (sinks_grad): D = dO . O over [B, H, S], as the LSE.
    sinks_grad(dout, out, lse, sk_logits, 1, dsinks);
  }
  return {dq, dk, dv, dsinks};
}

// ------------------------------------------------------------------ attention over a KV cache

void attention_kvcache_into(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const std::optional<at::Tensor>& cache_seqlens, const std::optional<at::Tensor>& block_table,
                            at::Tensor out, std::optional<at::Tensor> lse, std::optional<double> scale,
                            bool is_causal, at::IntArrayRef window_size, double softcap,
                            const std::optional<at::Tensor>& sinks, const std::optional<at::Tensor>& k_descale,
                            const std::optional<at::Tensor>& v_descale) {
  const char* e = "attention_kvcache";
  ATTNTUNE_CHECK(q.dim() == 4, e, "q must be 4-d: [batch, seqlen_q, heads, head_dim]");
  ATTNTUNE_CHECK(k_cache.dim() == 4 && v_cache.dim() == 4, e,
        "k_cache and v_cache must be 4-d: [batch, seqlen_k, heads_kv, head_dim], or pages [num_blocks, page_size, "
        "heads_kv, head_dim] with a block_table (v_cache's last dim: the value head dim)");
  const int64_t Dv = value_dim(k_cache, v_cache, e, "k_cache", "v_cache");
  const int kv_fp8 = kv_fp8_of(e, q, k_cache, v_cache, "k_cache", "v_cache", "q and the caches must share a dtype");
  const int64_t B = q.size(0), S = q.size(1), H = q.size(2), D = q.size(3), Hkv = k_cache.size(2);
  check_qk_dim(q, k_cache, e, "k_cache");
  ATTNTUNE_CHECK(Hkv > 0 ? H % Hkv == 0 : H == 0, e, "heads of q must be a multiple of the caches'");
  const bool paged = block_table.has_value();
  int64_t Sk = k_cache.size(1), page = 0, max_blocks = 0;
  at::Tensor table, lens;
  if (paged) {
    ATTNTUNE_CHECK(block_table->dim() == 2 && block_table->size(0) == B, e, "block_table must be [batch, max_blocks_per_seq]");
    ATTNTUNE_CHECK(block_table->scalar_type() == at::kInt || block_table->scalar_type() == at::kLong, e,
          "block_table must be int32 (or int64)");
    ATTNTUNE_CHECK(block_table->device() == q.device(), e, "block_table must be on q's device");
    table = block_table->to(at::kInt).contiguous();
    page = k_cache.size(1);
    max_blocks = table.size(1);
    Sk = page * max_blocks;
  } else {
    ATTNTUNE_CHECK(k_cache.size(0) == B, e, "a contiguous cache must have q's batch");
  }
  if (cache_seqlens) {
    ATTNTUNE_CHECK(cache_seqlens->dim() == 1 && cache_seqlens->size(0) == B, e, "cache_seqlens must be [batch]");
    ATTNTUNE_CHECK(cache_seqlens->scalar_type() == at::kInt || cache_seqlens->scalar_type() == at::kLong, e,
          "cache_seqlens must be int32 (or int64)");
    ATTNTUNE_CHECK(cache_seqlens->device() == q.device(), e, "cache_seqlens must be on q's device");
    lens = cache_seqlens->to(at::kInt).contiguous();
  }
  check_out(out, q, Dv, e);
  check_lse(lse, {B, H, S}, q, e);
  const Variants var = variants_of(e, window_size, softcap, sinks.has_value() && sinks->defined(), is_causal);
  const at::Tensor sk_logits = sinks_of(e, sinks, H, q);
  Descales ds;  // per sequence (q's batch) and KV head, as FlashAttention-3's
  const at::Tensor kd = descale_of(e, "k_descale", k_descale, kv_fp8, k_cache, B, Hkv, q, ds.k_stride),
                   vd = descale_of(e, "v_descale", v_descale, kv_fp8, k_cache, B, Hkv, q, ds.v_stride);
  ds.k = kd.defined() ? kd.data_ptr<float>() : nullptr;
  ds.v = vd.defined() ? vd.data_ptr<float>() : nullptr;
  const double sc = scale_of(scale, D);
  Shape c{kEntryKvcache, q.scalar_type() == at::kBFloat16, as_int(D, e, "head_dim"),
          as_int(Dv, e, "head_dim_v"), is_causal ? 1 : 0, as_int(B, e, "batch"), as_int(H, e, "heads"),
          as_int(Hkv, e, "heads_kv"), as_int(S, e, "seqlen_q"), as_int(Sk, e, "seqlen_k"),
          paged ? as_int(page, e, "page_size") : 0, var};
  // v_cache = k_cache[..., :Dv] (FlashMLA's one latent cache): passed as k_cache, pointer and strides.
  c.latent = latent_view(k_cache, v_cache) ? 1 : 0;
  c.kv_fp8 = kv_fp8;
  const bool ran = ran_kernel(e, c, q, {&q, &k_cache, &v_cache, &out, &sk_logits}, [&](cudaStream_t stream) {
    // q/out [B, S, H, D]: {batch, head, row} = strides 0, 2, 1; caches likewise ({block, head, row} paged).
    const long long qs[3] = {q.stride(0), q.stride(2), q.stride(1)},
                    ks[3] = {k_cache.stride(0), k_cache.stride(2), k_cache.stride(1)},
                    vs[3] = {v_cache.stride(0), v_cache.stride(2), v_cache.stride(1)},
                    os[3] = {out.stride(0), out.stride(2), out.stride(1)};
    float* l = lse ? lse->data_ptr<float>() : nullptr;
    const int* n = lens.defined() ? lens.data_ptr<int>() : nullptr;
    const int* t = paged ? table.data_ptr<int>() : nullptr;
    const void* vp = c.latent ? k_cache.data_ptr() : v_cache.data_ptr();
    if (!attntune_attention_forward_kvcache_ex)  // an export before the variants: plain one-dim calls only
      return attntune_attention_forward_kvcache(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(),
                                                l, n, t, static_cast<int>(max_blocks), static_cast<int>(page), c.b,
                                                c.h, c.hkv, c.s, c.sk, c.d, qs, ks, vs, os, static_cast<float>(sc),
                                                c.causal, stream);
    const attntune_options o = options_of(c, sk_logits.defined() ? sk_logits.data_ptr<float>() : nullptr, ds);
    return attntune_attention_forward_kvcache_ex(q.data_ptr(), k_cache.data_ptr(), vp, out.data_ptr(), l, n, t,
                                                 static_cast<int>(max_blocks), static_cast<int>(page), c.b, c.h,
                                                 c.hkv, c.s, c.sk, c.d, qs, ks, c.latent ? ks : vs, os,
                                                 static_cast<float>(sc), c.causal, &o, stream);
  });
  if (ran) return;
  if (q.numel() == 0) return;
  // The fallback: gather the pages (no sync), mask each sequence's keys. A latent cache is gathered
  // once: V is the gathered K's first Dv columns (a strided view, which SDPA and the fp32 path take).
  at::Tensor kc = k_cache, vc = v_cache;
  if (paged) {
    const at::Tensor idx = table.to(at::kLong).clamp(0, std::max<int64_t>(k_cache.size(0) - 1, 0)).flatten();
    kc = gather_pages(k_cache, idx).view({B, Sk, Hkv, D});
    vc = c.latent ? kc.narrow(3, 0, Dv) : gather_pages(v_cache, idx).view({B, Sk, Hkv, Dv});
  }
  at::Tensor out_h = out.transpose(1, 2);
  if (kv_fp8) {
    // The gathered cache dequantised per (sequence, KV head) as the kernels read it (a latent cache's
    // V is its view, scaled by V's table), then the fp32 path, which masks (and zeroes: NaN bytes of
    // a stale cache) each sequence's keys past its length.
    variant_into(q.transpose(1, 2), dequantised(kc, kd, {B, 1, Hkv, 1}).transpose(1, 2),
                 dequantised(vc, vd, {B, 1, Hkv, 1}).transpose(1, 2), at::Tensor(),
                 lens.defined() ? lens.to(at::kLong) : at::Tensor(), is_causal, var, sk_logits, sc, out_h, lse);
    return;
  }
  if (var.any()) {
    variant_into(q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2), at::Tensor(),
                 lens.defined() ? lens.to(at::kLong) : at::Tensor(), is_causal, var, sk_logits, sc, out_h, lse);
    return;
  }
  auto lopts = q.options().dtype(at::kLong);
  const at::Tensor n = lens.defined() ? lens.to(at::kLong).view({B, 1, 1}) : at::full({B, 1, 1}, Sk, lopts);
  const at::Tensor j = at::arange(Sk, lopts).view({1, 1, Sk}), i = at::arange(S, lopts).view({1, S, 1});
  if (lens.defined()) {
    // Keys past a sequence's length may hold anything (a stale cache, NaN; a page the table does not
    // use): SDPA multiplies them by their zero weight, and 0 * NaN is NaN.
    const at::Tensor stale = (j >= n).view({B, Sk, 1, 1});
    kc = kc.masked_fill(stale, 0.0);
    vc = c.latent ? kc.narrow(3, 0, Dv) : vc.masked_fill(stale, 0.0);
  }
  at::Tensor visible = j < n;
  if (is_causal) visible = visible & (j <= i + n - S);
  visible = visible.expand({B, S, Sk}).unsqueeze(1);
  sdpa_into(q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2), visible, is_causal, sc, out_h, lse);
}

std::tuple<at::Tensor, at::Tensor> attention_kvcache(const at::Tensor& q, const at::Tensor& k_cache,
                                                     const at::Tensor& v_cache,
                                                     const std::optional<at::Tensor>& cache_seqlens,
                                                     const std::optional<at::Tensor>& block_table,
                                                     std::optional<double> scale, bool is_causal, bool return_lse,
                                                     at::IntArrayRef window_size, double softcap,
                                                     const std::optional<at::Tensor>& sinks,
                                                     const std::optional<at::Tensor>& k_descale,
                                                     const std::optional<at::Tensor>& v_descale) {
  at::Tensor out = out_like(q, v_cache);
  at::Tensor lse = return_lse && q.dim() == 4 ? at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat))
                                              : at::empty({0}, q.options().dtype(at::kFloat));
  attention_kvcache_into(q, k_cache, v_cache, cache_seqlens, block_table, out,
                         return_lse ? std::optional<at::Tensor>(lse) : std::nullopt, scale, is_causal, window_size,
                         softcap, sinks, k_descale, v_descale);
  return {out, lse};
}

// ------------------------------------------------------------------ variable-length packed batches

void attention_varlen_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                           int64_t max_seqlen_k, at::Tensor out, std::optional<at::Tensor> lse,
                           std::optional<double> scale, bool is_causal, at::IntArrayRef window_size, double softcap,
                           const std::optional<at::Tensor>& sinks) {
  const char* e = "attention_varlen";
  ATTNTUNE_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, e,
                 "q, k and v must be 3-d: [total, heads, head_dim] (v's last dim: the value head dim)");
  const int64_t Dv = value_dim(k, v, e, "k", "v");
  ATTNTUNE_CHECK(!is_float8(k.scalar_type()) && !is_float8(v.scalar_type()), e,
                 "FP8 caches are read by attention and attention_kvcache only (no varlen problem has one): k and v "
                 "must be q's dtype here");
  ATTNTUNE_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), e, "q, k and v must share a dtype");
  ATTNTUNE_CHECK(cu_seqlens_q.dim() == 1 && cu_seqlens_k.dim() == 1 && cu_seqlens_q.size(0) == cu_seqlens_k.size(0) &&
            cu_seqlens_q.size(0) >= 1,
        e, "cu_seqlens_q and cu_seqlens_k must be [batch + 1]");
  for (const at::Tensor* t : {&cu_seqlens_q, &cu_seqlens_k}) {
    ATTNTUNE_CHECK(t->scalar_type() == at::kInt || t->scalar_type() == at::kLong, e, "cu_seqlens must be int32 (or int64)");
    ATTNTUNE_CHECK(t->device() == q.device(), e, "cu_seqlens must be on q's device");
  }
  const int64_t Tq = q.size(0), H = q.size(1), D = q.size(2), Tk = k.size(0), Hkv = k.size(1);
  const int64_t B = cu_seqlens_q.size(0) - 1;
  check_qk_dim(q, k, e, "k");
  ATTNTUNE_CHECK(Hkv > 0 ? H % Hkv == 0 : H == 0, e, "heads of q must be a multiple of k's");
  ATTNTUNE_CHECK(max_seqlen_q >= 0 && max_seqlen_k >= 0, e, "max_seqlen_q and max_seqlen_k must be >= 0");
  check_out(out, q, Dv, e);
  check_lse(lse, {H, Tq}, q, e);
  const Variants var = variants_of(e, window_size, softcap, sinks.has_value() && sinks->defined(), is_causal);
  const at::Tensor sk_logits = sinks_of(e, sinks, H, q);
  const double sc = scale_of(scale, D);
  const Shape c{kEntryVarlen, q.scalar_type() == at::kBFloat16, as_int(D, e, "head_dim"), as_int(Dv, e, "head_dim_v"),
                is_causal ? 1 : 0, as_int(B, e, "batch"), as_int(H, e, "heads"), as_int(Hkv, e, "heads_kv"),
                as_int(max_seqlen_q, e, "max_seqlen_q"), as_int(max_seqlen_k, e, "max_seqlen_k"), 0, var};
  const at::Tensor cq = cu_seqlens_q.to(at::kInt).contiguous(), ck = cu_seqlens_k.to(at::kInt).contiguous();
  const bool ran = ran_kernel(e, c, q, {&q, &k, &v, &out, &sk_logits}, [&](cudaStream_t stream) {
    const long long qs[2] = {q.stride(0), q.stride(1)}, ks[2] = {k.stride(0), k.stride(1)},
                    vs[2] = {v.stride(0), v.stride(1)}, os[2] = {out.stride(0), out.stride(1)};
    float* l = lse ? lse->data_ptr<float>() : nullptr;
    // The packed rows from the tensors' shapes: kernels reading through TMA tensor maps need them.
    if (!attntune_attention_forward_varlen_ex)  // an export before the variants: plain one-dim calls only
      return attntune_attention_forward_varlen_packed(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), l,
                                                      cq.data_ptr<int>(), ck.data_ptr<int>(), c.b, Tq, Tk, c.s, c.sk,
                                                      c.h, c.hkv, c.d, qs, ks, vs, os, static_cast<float>(sc),
                                                      c.causal, stream);
    const attntune_options o = options_of(c, sk_logits.defined() ? sk_logits.data_ptr<float>() : nullptr);
    return attntune_attention_forward_varlen_ex(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), l,
                                                cq.data_ptr<int>(), ck.data_ptr<int>(), c.b, Tq, Tk, c.s, c.sk, c.h,
                                                c.hkv, c.d, qs, ks, vs, os, static_cast<float>(sc), c.causal, &o,
                                                stream);
  });
  if (ran) return;
  if (Tq == 0 || B == 0) return;
  // The fallback: pad each sequence to max_seqlen (gathers, no sync), attend, gather back.
  auto lopts = q.options().dtype(at::kLong);
  const at::Tensor cq64 = cq.to(at::kLong), ck64 = ck.to(at::kLong);
  const at::Tensor start_q = cq64.narrow(0, 0, B), start_k = ck64.narrow(0, 0, B);
  const at::Tensor len_q = cq64.narrow(0, 1, B) - start_q, len_k = ck64.narrow(0, 1, B) - start_k;
  const int64_t Sq = std::max<int64_t>(max_seqlen_q, 1), Sk = std::max<int64_t>(max_seqlen_k, 1);
  const at::Tensor iq = (start_q.view({B, 1}) + at::arange(Sq, lopts).view({1, Sq})).clamp(0, std::max<int64_t>(Tq - 1, 0));
  const at::Tensor ik = (start_k.view({B, 1}) + at::arange(Sk, lopts).view({1, Sk})).clamp(0, std::max<int64_t>(Tk - 1, 0));
  const at::Tensor qp = q.index_select(0, iq.flatten()).view({B, Sq, H, D}).transpose(1, 2);
  at::Tensor kp, vp;
  if (Tk > 0) {
    kp = k.index_select(0, ik.flatten()).view({B, Sk, Hkv, D}).transpose(1, 2);
    vp = v.index_select(0, ik.flatten()).view({B, Sk, Hkv, Dv}).transpose(1, 2);
  } else {
    kp = at::zeros({B, Hkv, Sk, D}, q.options());
    vp = at::zeros({B, Hkv, Sk, Dv}, q.options());
  }
  at::Tensor op = at::empty({B, H, Sq, Dv}, q.options());
  std::optional<at::Tensor> lp;
  if (lse) lp = at::empty({B, H, Sq}, q.options().dtype(at::kFloat));
  if (var.any()) {
    variant_into(qp, kp, vp, len_q, len_k, is_causal, var, sk_logits, sc, op, lp);
  } else {
    const at::Tensor j = at::arange(Sk, lopts).view({1, 1, Sk}), i = at::arange(Sq, lopts).view({1, Sq, 1});
    at::Tensor visible = j < len_k.view({B, 1, 1});
    if (is_causal) visible = visible & (j <= i + len_k.view({B, 1, 1}) - len_q.view({B, 1, 1}));
    visible = visible.expand({B, Sq, Sk}).unsqueeze(1);
    sdpa_into(qp, kp, vp, visible, is_causal, sc, op, lp);
  }
  // Token t of the packing is row t - cu_seqlens_q[seq] of sequence seq.
  const at::Tensor t = at::arange(Tq, lopts);
  const at::Tensor seq = at::searchsorted(cq64.narrow(0, 1, B), t, /*out_int32=*/false, /*right=*/true);
  const at::Tensor row = t - start_q.index_select(0, seq.clamp_max(B - 1));
  const at::Tensor seqc = seq.clamp_max(B - 1), rowc = row.clamp(0, Sq - 1);
  out.copy_(op.permute({0, 2, 1, 3}).index({seqc, rowc}));
  if (lse) lse->copy_(lp->permute({0, 2, 1}).index({seqc, rowc}).t());
}

// `deterministic`, as attention's: not the forward's; its autograd formula (__init__.py) hands it to
// attention_backward_varlen.
std::tuple<at::Tensor, at::Tensor> attention_varlen(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                    const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                                    int64_t max_seqlen_q, int64_t max_seqlen_k,
                                                    std::optional<double> scale, bool is_causal, bool return_lse,
                                                    at::IntArrayRef window_size, double softcap,
                                                    const std::optional<at::Tensor>& sinks, bool /*deterministic*/) {
  at::Tensor out = out_like(q, v);
  at::Tensor lse = return_lse && q.dim() == 3 ? at::empty({q.size(1), q.size(0)}, q.options().dtype(at::kFloat))
                                              : at::empty({0}, q.options().dtype(at::kFloat));
  attention_varlen_into(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out,
                        return_lse ? std::optional<at::Tensor>(lse) : std::nullopt, scale, is_causal, window_size,
                        softcap, sinks);
  return {out, lse};
}

// ------------------------------------------------------------------ the backward pass (packed batches)

// The gradients by PyTorch of a packed batch (attention_backward_varlen's fallback): each sequence padded
// to the longest (gathers, as attention_varlen_into's fallback), the padded rows' dout and dlse zero and
// their q zeroed (whatever the packing holds there), backward_into over the padded batch with each
// sequence's lengths (rows bottom-right aligned per sequence, keys past its length masked), then the
// gradients gathered back to the packed rows; rows of no sequence (before cu_seqlens[0] or past
// cu_seqlens[batch]) get zeros. g: dout [Tq, H, Dv]; dl: dlse [H, Tq] or undefined. No device sync.
void backward_varlen_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                          const at::Tensor& dl, const at::Tensor& cq, const at::Tensor& ck, int64_t max_seqlen_q,
                          int64_t max_seqlen_k, bool causal, const Variants& var, const at::Tensor& sinks,
                          double scale, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, at::Tensor& dsinks) {
  const int64_t Tq = q.size(0), H = q.size(1), D = q.size(2), Tk = k.size(0), Hkv = k.size(1), Dv = v.size(2);
  const int64_t B = cq.size(0) - 1;
  if (B == 0 || Tq == 0 || H == 0) {  // no query row of any sequence: no gradient
    dq.zero_();
    dk.zero_();
    dv.zero_();
    if (dsinks.numel()) dsinks.zero_();
    return;
  }
  auto lopts = q.options().dtype(at::kLong);
  const at::Tensor cq64 = cq.to(at::kLong), ck64 = ck.to(at::kLong);
  const at::Tensor start_q = cq64.narrow(0, 0, B), start_k = ck64.narrow(0, 0, B);
  const at::Tensor len_q = cq64.narrow(0, 1, B) - start_q, len_k = ck64.narrow(0, 1, B) - start_k;
  const int64_t Sq = std::max<int64_t>(max_seqlen_q, 1), Sk = std::max<int64_t>(max_seqlen_k, 1);
  const at::Tensor iq = (start_q.view({B, 1}) + at::arange(Sq, lopts).view({1, Sq})).clamp(0, Tq - 1).flatten();
  const at::Tensor pad_q = (at::arange(Sq, lopts).view({1, Sq}) >= len_q.view({B, 1})).view({B, 1, Sq, 1});
  const at::Tensor qp = q.index_select(0, iq).view({B, Sq, H, D}).transpose(1, 2).masked_fill(pad_q, 0.0);
  const at::Tensor gp = g.index_select(0, iq).view({B, Sq, H, Dv}).transpose(1, 2).masked_fill(pad_q, 0.0);
  at::Tensor dlp;  // [B, H, Sq]
  if (dl.defined())
    dlp = dl.index_select(1, iq).view({H, B, Sq}).permute({1, 0, 2}).masked_fill(pad_q.view({B, 1, Sq}), 0.0);
  at::Tensor kp, vp;
  if (Tk > 0) {
    const at::Tensor ik = (start_k.view({B, 1}) + at::arange(Sk, lopts).view({1, Sk})).clamp(0, Tk - 1).flatten();
    kp = k.index_select(0, ik).view({B, Sk, Hkv, D}).transpose(1, 2);
    vp = v.index_select(0, ik).view({B, Sk, Hkv, Dv}).transpose(1, 2);
  } else {
    kp = at::zeros({B, Hkv, Sk, D}, q.options());
    vp = at::zeros({B, Hkv, Sk, Dv}, q.options());
  }
  at::Tensor dqp = at::empty({B, H, Sq, D}, q.options()), dkp = at::empty({B, Hkv, Sk, D}, q.options()),
             dvp = at::empty({B, Hkv, Sk, Dv}, q.options());
  backward_into(qp, kp, vp, gp, dlp, causal, var, sinks, scale, dqp, dkp, dvp, dsinks, len_q, len_k);
  // Packed row t is row t - cu_seqlens[seq] of sequence seq (searchsorted), or of none.
  auto back = [&](const at::Tensor& padded, at::Tensor& packed, const at::Tensor& cu, const at::Tensor& start,
                  int64_t rows_padded) {
    const int64_t T = packed.size(0);
    if (T == 0) return;
    const at::Tensor t = at::arange(T, lopts);
    const at::Tensor seq = at::searchsorted(cu.narrow(0, 1, B), t, /*out_int32=*/false, /*right=*/true);
    const at::Tensor seqc = seq.clamp_max(B - 1);
    const at::Tensor row = t - start.index_select(0, seqc);
    const at::Tensor valid = (seq < B).logical_and(row >= 0).logical_and(row < rows_padded);
    const at::Tensor got = padded.permute({0, 2, 1, 3}).index({seqc, row.clamp(0, rows_padded - 1)});
    packed.copy_(at::where(valid.view({T, 1, 1}), got, at::zeros({}, got.options())));
  };
  back(dqp, dq, cq64, start_q, Sq);
  back(dkp, dk, ck64, start_k, Sk);
  back(dvp, dv, ck64, start_k, Sk);
}

// The backward of `attention_varlen` (its autograd formula, __init__.py), as attention_backward's over a
// packed batch: dq [total_q, H, D], dk, dv [total_k, Hkv, D / Dv] and dsinks ([H] float32, [0] without
// sinks) from the forward's inputs, its out and lse ([H, total_q] float32, the varlen forward's; [0]:
// not saved), dout (out's shape) and dlse (None: the LSE was not used). A kernel of the library serves
// it (attntune_attention_backward_varlen; total_q = q.size(0), total_k = k.size(0): the packing's rows,
// cu_seqlens[batch] in flash_attn_varlen_func's packing) when one was tuned for its problem
// (varlen=N,pass=bwd) and the LSE was saved and not used; else the fallback (backward_varlen_into),
// counted in coverage under attention_backward_varlen. deterministic: as attention_backward's.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward_varlen(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, const std::optional<at::Tensor>& dlse, std::optional<double> scale, bool is_causal,
    at::IntArrayRef window_size, double softcap, const std::optional<at::Tensor>& sinks, bool deterministic) {
  const char* e = "attention_backward_varlen";
  ATTNTUNE_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, e,
                 "q, k and v must be 3-d: [total, heads, head_dim] (v's last dim: the value head dim)");
  const int64_t Dv = value_dim(k, v, e, "k", "v");
  ATTNTUNE_CHECK(!is_float8(k.scalar_type()) && !is_float8(v.scalar_type()), e,
                 "FP8 caches are read by attention and attention_kvcache only (no varlen problem has one): k and v "
                 "must be q's dtype here");
  ATTNTUNE_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), e,
                 "q, k and v must share a dtype");
  ATTNTUNE_CHECK(cu_seqlens_q.dim() == 1 && cu_seqlens_k.dim() == 1 && cu_seqlens_q.size(0) == cu_seqlens_k.size(0) &&
                     cu_seqlens_q.size(0) >= 1,
                 e, "cu_seqlens_q and cu_seqlens_k must be [batch + 1]");
  for (const at::Tensor* t : {&cu_seqlens_q, &cu_seqlens_k}) {
    ATTNTUNE_CHECK(t->scalar_type() == at::kInt || t->scalar_type() == at::kLong, e,
                   "cu_seqlens must be int32 (or int64)");
    ATTNTUNE_CHECK(t->device() == q.device(), e, "cu_seqlens must be on q's device");
  }
  const int64_t Tq = q.size(0), H = q.size(1), D = q.size(2), Tk = k.size(0), Hkv = k.size(1);
  const int64_t B = cu_seqlens_q.size(0) - 1;
  check_qk_dim(q, k, e, "k");
  ATTNTUNE_CHECK(Hkv > 0 ? H % Hkv == 0 : H == 0, e, fmt("heads of q (%lld) must be a multiple of k's (%lld)",
                                                         static_cast<long long>(H), static_cast<long long>(Hkv)));
  ATTNTUNE_CHECK(max_seqlen_q >= 0 && max_seqlen_k >= 0, e, "max_seqlen_q and max_seqlen_k must be >= 0");
  check_out(out, q, Dv, e);
  ATTNTUNE_CHECK(dout.sizes() == out.sizes(), e,
                 "dout must have out's shape (" + dims(out.sizes()) + "; got " + dims(dout.sizes()) + ")");
  ATTNTUNE_CHECK(dout.scalar_type() == q.scalar_type() && dout.device() == q.device(), e,
                 "dout must have q's dtype and device");
  const bool have_lse = lse.numel() > 0;
  if (have_lse) check_lse(lse, {H, Tq}, q, e);
  at::Tensor dl;
  if (dlse && dlse->defined() && dlse->numel() > 0) {
    ATTNTUNE_CHECK(dlse->sizes() == at::IntArrayRef({H, Tq}) && dlse->device() == q.device(), e,
                   "dlse must be [heads, total_q] (" + dims({H, Tq}) + "; got " + dims(dlse->sizes()) +
                       ") on q's device");
    dl = *dlse;
  }
  const Variants var = variants_of(e, window_size, softcap, sinks.has_value() && sinks->defined(), is_causal);
  const at::Tensor sk_logits = sinks_of(e, sinks, H, q);
  const double sc = scale_of(scale, D);
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  at::Tensor dsinks = at::empty({sk_logits.defined() ? H : 0}, q.options().dtype(at::kFloat));
  Shape c{kEntryBackwardVarlen, q.scalar_type() == at::kBFloat16, as_int(D, e, "head_dim"),
          as_int(Dv, e, "head_dim_v"), is_causal ? 1 : 0, as_int(B, e, "batch"), as_int(H, e, "heads"),
          as_int(Hkv, e, "heads_kv"), as_int(max_seqlen_q, e, "max_seqlen_q"),
          as_int(max_seqlen_k, e, "max_seqlen_k"), 0, var};
  c.deterministic = deterministic ? 1 : 0;
  const at::Tensor cq = cu_seqlens_q.to(at::kInt).contiguous(), ck = cu_seqlens_k.to(at::kInt).contiguous();
  const at::Tensor g = dout.numel() ? kernel_layout(dout) : dout;
  bool ran = false;
  if (!have_lse && q.numel() > 0) {
    fall_back(c, q, "the forward's LSE was not saved (torch.ops." ATTNTUNE_STR(ATTNTUNE_TORCH_NAMESPACE)
                    ".attention_varlen called with return_lse=False under autograd; attntune.attention_varlen asks "
                    "for it)",
              false);
  } else if (dl.defined()) {
    fall_back(c, q, "the forward's LSE has a gradient (return_lse=True and the LSE used): the kernels take dout "
                    "alone", false);
  } else {
    ran = ran_kernel(e, c, q, {&q, &k, &v, &out, &g, &lse, &sk_logits, &cq, &ck}, [&](cudaStream_t stream) {
      auto st = [](const at::Tensor& t, long long* x) {  // {row, head}
        for (int i = 0; i < 2; ++i) x[i] = t.stride(i);
      };
      long long qs[2], ks[2], vs[2], os[2], gs[2], dqs[2], dks[2], dvs[2];
      st(q, qs), st(k, ks), st(v, vs), st(out, os), st(g, gs), st(dq, dqs), st(dk, dks), st(dv, dvs);
      // The sinks' logits as the forward's call passed them (attention_backward's note).
      const attntune_options o = options_of(c, sk_logits.defined() ? sk_logits.data_ptr<float>() : nullptr);
      return attntune_attention_backward_varlen_ex(
          q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr<float>(), g.data_ptr(),
          dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), cq.data_ptr<int>(), ck.data_ptr<int>(), c.b, Tq, Tk, c.s,
          c.sk, c.h, c.hkv, c.d, qs, ks, vs, os, gs, dqs, dks, dvs, static_cast<float>(sc), c.causal, &o, stream);
    });
  }
  if (!ran) {
    backward_varlen_into(q, k, v, g, dl, cq, ck, max_seqlen_q, max_seqlen_k, is_causal, var, sk_logits, sc, dq, dk,
                         dv, dsinks);
  } else if (dsinks.numel() > 0) {
    // The sinks' own gradient, as attention_backward's, over the packed rows: D = dO . O is
    // [total_q, H], the LSE [H, total_q].
    sinks_grad(dout.transpose(0, 1), out.transpose(0, 1), lse, sk_logits, 0, dsinks);
  }
  return {dq, dk, dv, dsinks};
}

}  // namespace

// The variants' arguments come last, with FlashAttention's defaults, so that calls written before
// them (positional included) mean what they meant. `window_size` is int[2]: a bare int would be
// taken as (n, n), so the Python functions insist on a pair.
#define ATTNTUNE_VARIANT_ARGS "int[2] window_size=[-1, -1], float softcap=0.0, Tensor? sinks=None"
// An FP8 cache's scales (FlashAttention-3's descale_k/v), after the variants (attention and
// attention_kvcache, and their _into forms).
#define ATTNTUNE_DESCALE_ARGS ", Tensor? k_descale=None, Tensor? v_descale=None"

TORCH_LIBRARY(ATTNTUNE_TORCH_NAMESPACE, m) {
  // deterministic (last, defaulted: earlier calls mean what they did): for attention's backward (and
  // attention_varlen's).
  // q_descale (last, defaulted): the FP8 forward's Q scales (q, k and v float8_e4m3fn; out bf16).
  m.def("attention(Tensor q, Tensor k, Tensor v, float? scale=None, bool is_causal=False, bool return_lse=False, "
        ATTNTUNE_VARIANT_ARGS ATTNTUNE_DESCALE_ARGS ", bool deterministic=False, Tensor? q_descale=None) -> "
        "(Tensor, Tensor)");
  m.def("attention_into(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!)? lse, float? scale=None, "
        "bool is_causal=False, " ATTNTUNE_VARIANT_ARGS ATTNTUNE_DESCALE_ARGS ", Tensor? q_descale=None) -> ()");
  m.def("attention_kvcache(Tensor q, Tensor k_cache, Tensor v_cache, Tensor? cache_seqlens=None, "
        "Tensor? block_table=None, float? scale=None, bool is_causal=False, bool return_lse=False, "
        ATTNTUNE_VARIANT_ARGS ATTNTUNE_DESCALE_ARGS ") -> (Tensor, Tensor)");
  m.def("attention_kvcache_into(Tensor q, Tensor k_cache, Tensor v_cache, Tensor? cache_seqlens, Tensor? block_table, "
        "Tensor(a!) out, Tensor(b!)? lse, float? scale=None, bool is_causal=False, " ATTNTUNE_VARIANT_ARGS
        ATTNTUNE_DESCALE_ARGS ") -> ()");
  m.def("attention_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
        "int max_seqlen_k, float? scale=None, bool is_causal=False, bool return_lse=False, " ATTNTUNE_VARIANT_ARGS
        ", bool deterministic=False) -> (Tensor, Tensor)");
  m.def("attention_varlen_into(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
        "int max_seqlen_q, int max_seqlen_k, Tensor(a!) out, Tensor(b!)? lse, float? scale=None, "
        "bool is_causal=False, " ATTNTUNE_VARIANT_ARGS ") -> ()");
  // attention's backward pass (its autograd formula; docs/CONTRACT.md "The backward pass"): dq, dk, dv,
  // dsinks ([heads] float32; [0] without sinks) from the forward's inputs, out and lse ([0]: not saved),
  // dout and dlse (None: the LSE's gradient is not wanted); deterministic: bit-identical gradients.
  m.def("attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? dlse=None, "
        "float? scale=None, bool is_causal=False, " ATTNTUNE_VARIANT_ARGS ", bool deterministic=False) -> "
        "(Tensor, Tensor, Tensor, Tensor)");
  // attention_varlen's backward pass, the same over a packed batch: the forward's cu_seqlens and maximum
  // lengths after its lse ([heads, total_q] float32; [0]: not saved), then attention_backward's arguments.
  m.def("attention_backward_varlen(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
        "Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, Tensor? dlse=None, "
        "float? scale=None, bool is_causal=False, " ATTNTUNE_VARIANT_ARGS ", bool deterministic=False) -> "
        "(Tensor, Tensor, Tensor, Tensor)");
  m.def("explain(int entry, str dtype, int head_dim, bool is_causal, int b, int h, int hkv, int s, int sk, "
        "int[2] window_size=[-1, -1], float softcap=0.0, bool sinks=False, int head_dim_v=0, bool latent=False, "
        "str? kv_dtype=None, bool deterministic=False) -> (int, str)",
        &explain);
  m.def("coverage() -> str", &coverage_json);
  m.def("reset_coverage() -> ()", &reset_coverage);
  m.def("set_policy(str fallback, float max_length_ratio) -> ()", &set_policy);
  m.def("kernel_info() -> str", &kernel_info);
}

// The same functions for CUDA and CPU tensors: CPU calls (and any the kernels cannot take) fall back.
namespace {
void impl_tensor_ops(torch::Library& m) {
  m.impl("attention", &attention);
  m.impl("attention_into", &attention_into);
  m.impl("attention_kvcache", &attention_kvcache);
  m.impl("attention_kvcache_into", &attention_kvcache_into);
  m.impl("attention_varlen", &attention_varlen);
  m.impl("attention_varlen_into", &attention_varlen_into);
  m.impl("attention_backward", &attention_backward);
  m.impl("attention_backward_varlen", &attention_backward_varlen);
}
}  // namespace
TORCH_LIBRARY_IMPL(ATTNTUNE_TORCH_NAMESPACE, CUDA, m) { impl_tensor_ops(m); }
TORCH_LIBRARY_IMPL(ATTNTUNE_TORCH_NAMESPACE, CPU, m) { impl_tensor_ops(m); }
