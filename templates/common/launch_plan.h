// ---- templates/common/launch_plan.h: how a call of an attention entry point becomes launches.
//
// Every kernel family states its launch once, in templates/<family>/launch.h, as a LaunchFamily (at the
// end of this file): from the constants its kernels were built with (the #defines the renderer
// wrote) and one call of a C entry point (Call) to a Plan: the kernels to launch in order (grid,
// block, dynamic shared memory, cluster), the workspaces they need, the TMA tensor maps to encode,
// or a refusal with its reason. Then, for each launch, the kernel's arguments (bind).
//
// One executor runs plans and nothing else decides a launch: templates/common/run_plan.h, over the
// driver API in the tuner's worker (tuner/eval/loaded_build.cpp) and over the runtime API in the
// exported library and the nvcc harnesses (templates/export/run_plan.cuh). So a grid policy, a tile
// count or a tensor-map recipe exists in the family's launch.h only.
//
// Plain C++17 and header-only: no CUDA header, no exceptions, no allocation, so that g++ (the
// tuner), nvcc's host pass (exports, harnesses) and the export's text (flattened verbatim) all
// compile the same code.
#ifndef ATTNTUNE_LAUNCH_PLAN_H
#define ATTNTUNE_LAUNCH_PLAN_H

#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "kv_scales.h"

namespace attntune_plan {

// The C entry points of docs/CONTRACT.md a family's kernels can serve (bits of LaunchFamily::entries).
enum Entry : int {
  kEntryDense = 1,    // attntune_attention_forward
  kEntryKvcache = 2,  // attntune_attention_forward_kvcache
  kEntryVarlen = 4,   // attntune_attention_forward_varlen
  kEntryBackward = 8, // attntune_attention_backward (issue 45: dQ, dK, dV of a dense call)
  kEntryBackwardVarlen = 16,  // attntune_attention_backward_varlen (dQ, dK, dV of a varlen call)
};

// One call of an entry point, as its C arguments arrived, after the launcher's shared checks
// (sizes, 16-byte alignment, strides in multiples of 8 elements, out without overlaps). Pointers
// are device pointers. Fields an entry point does not have are zero.
struct Call {
  int entry;  // Entry
  const void* q;
  const void* k;  // kvcache: the K cache (pages when block_table is set)
  const void* v;
  void* out;
  float* lse;  // null: not wanted
  int batch, heads_q, heads_kv, seqlen_q;
  int seqlen_k;  // dense: the keys of every sequence; kvcache: seqlen_k_max
  int head_dim;    // Q's and K's
  int head_dim_v;  // V's and O's; 0: head_dim (every call before `dv` existed, and empty_call's)
  // In elements, {batch, head, row}; kvcache with a block table: K's and V's are {page, head, row}.
  long long q_stride[3], k_stride[3], v_stride[3], o_stride[3];
  float scale;
  int causal;  // bottom-right aligned when seqlen_q != seqlen_k (per sequence for kvcache)
  // kvcache: keys of each sequence ([batch], device; null: seqlen_k each) and the page table
  // ([batch, max_blocks_per_seq] page indices, device; null: K and V contiguous per sequence).
  const int* cache_seqlens;
  const int* block_table;
  int max_blocks_per_seq, page_size;
  // varlen: [batch + 1] prefix sums (device); strides {0, head, row}; seqlen_q/seqlen_k are
  // max_seqlen_q/max_seqlen_k.
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  // varlen: the rows of the packed q/out and k/v (cu_seqlens_q[batch], cu_seqlens_k[batch]) when the
  // caller says them (attntune_attention_forward_varlen_packed, the PyTorch op); -1: not given (the
  // contract's entry point). A TMA tensor map needs them: its extent bounds every copy.
  long long total_q, total_k;
  // Attention variants (docs/CONTRACT.md; FlashAttention's semantics), from the extended entry
  // points' options, after normalise_variants. Window: query i of a sequence (bottom-right aligned,
  // i' = i + len_k - len_q) sees keys i' - window_left <= j <= i' + window_right; -1 is unbounded,
  // and both -1 (empty_call) is no window. Causal calls keep window_right -1 (causal bounds it).
  int window_left, window_right;
  float softcap;       // > 0: score = softcap * tanh(scale * q.k / softcap); 0: none
  const float* sinks;  // null: none; else [heads_q] fp32 logits (device) joining each row's denominator
  // The KV cache's dtype (docs/CONTRACT.md "FP8 KV caches"): 0, q's (fp16/bf16); 1, FP8 e4m3 (k and v
  // hold one byte an element, their strides count bytes). FP8: K's and V's dequantisation scales
  // (FlashAttention-3's descale_k/v: [batch, heads_kv] fp32, device, through {batch, head} strides in
  // elements; both strides 0: one scale for the tensor; null: 1).
  int kv_fp8;
  const float* k_descale;
  const float* v_descale;
  long long k_descale_stride[2], v_descale_stride[2];
  // The backward pass (kEntryBackward, attntune_attention_backward; issue 45; and
  // kEntryBackwardVarlen, attntune_attention_backward_varlen: the varlen fields above as the forward
  // varlen call's, total_q and total_k given, lse [heads_q, total_q], every tensor's strides {0,
  // head, row}). q, k, v are the
  // forward's inputs; out is the forward's O (read, not written) and lse its LSE ([batch, heads_q,
  // seqlen_q] fp32 contiguous, natural log, read; required). dout is dO (out's shape, its own
  // strides); dq, dk, dv are written (q's, k's and v's shapes, their own strides; with GQA dk and dv
  // are [batch, heads_kv, seqlen_k, head_dim]: each KV head's gradient summed over its query
  // heads). deterministic: 1 asks for bit-identical gradients run to run (no floating-point
  // atomics whose order varies). Zero for every forward call.
  const void* dout;
  void* dq;
  void* dk;
  void* dv;
  long long do_stride[3], dq_stride[3], dk_stride[3], dv_stride[3];
  int deterministic;
  // An FP8 forward (`dtype=fp8`; issue 42): q, k and v hold FP8 e4m3 (one byte an element, their
  // strides counting bytes), out the 16-bit dtype, and v is given transposed: v_stride is {batch,
  // head, value dim} with the keys contiguous (V^T, [batch, heads_kv, head_dim_v, seqlen_k]; FP8
  // wgmma reads both operands K-major). q_descale, FlashAttention-3's descale_q, as k_descale
  // (whose fields, with v_descale's, hold K's and V's scales). 0: 16-bit q, k, v.
  int qkv_fp8;
  const float* q_descale;
  long long q_descale_stride[2];
  bool windowed() const { return window_left >= 0 || window_right >= 0; }
  // V's and O's head dim where it is not head_dim, else 0 (as a build's ATT_HEAD_DIM_V reads).
  int split_head_dim_v() const { return head_dim_v != 0 && head_dim_v != head_dim ? head_dim_v : 0; }
  // V's and O's head dim.
  int value_head_dim() const { return head_dim_v != 0 ? head_dim_v : head_dim; }
};

inline Call empty_call() {
  Call c;
  std::memset(&c, 0, sizeof c);
  c.window_left = c.window_right = -1;
  return c;
}

// A reason, for a refusal or an error (the launcher's attntune_last_error()).
struct Why {
  char text[768];
};

#if defined(__GNUC__)
inline int refuse(Why* why, const char* format, ...) __attribute__((format(printf, 2, 3)));
#endif
// Fills `why` and returns 1: what plan and bind return for a call they cannot serve.
inline int refuse(Why* why, const char* format, ...) {
  if (why) {
    va_list ap;
    va_start(ap, format);
    std::vsnprintf(why->text, sizeof why->text, format, ap);
    va_end(ap);
  }
  return 1;
}

// A build's value head dim against a call's: build_dv is the build's ATT_HEAD_DIM_V (0: built for
// one head dim, V's and O's as Q's and K's); the call's head_dim_v is 0 or head_dim for one head
// dim. A build never reads V or writes O with another dim than it was compiled for.
inline int check_value_dim(const char* family, const Call& c, int build_dv, Why* why) {
  const int call_dv = c.split_head_dim_v();
  if (call_dv == build_dv) return 0;
  if (build_dv == 0)
    return refuse(why, "this %s kernel was built for one head dim (V's and O's as Q's and K's); the call has head_dim %d "
                  "and head_dim_v %d", family, c.head_dim, c.head_dim_v);
  return refuse(why, "this %s kernel was built for head_dim_v %d; the call has head_dim_v %d", family, build_dv,
                call_dv ? call_dv : c.head_dim);
}

// A latent build against a call: build_latent is the build's ATT_LATENT (0: absent; the renderer
// defines it for `latent=1` problems only: V is the first head_dim_v columns of K, one buffer, as
// DeepSeek's MLA decode reads its latent cache). Such a build serves only calls whose v is k with
// k's strides (its kernel may read each cache row once for both products); a build without it reads
// V through v and serves aliasing calls as any other. A NULL k aliases nothing: a call without keys
// (seqlen_k 0) may pass NULLs, but a call that has keys and no k, such as the export's size-only
// attntune_select_kernel_ex (separate K and V tensors), is refused: it never selects a latent build.
inline int check_latent(const char* family, const Call& c, int build_latent, Why* why) {
  if (!build_latent) return 0;
  if (!c.k ? c.seqlen_k > 0 : c.v != c.k)
    return refuse(why, "this %s kernel was built for a latent cache (V is the first head_dim_v columns of K): the "
                  "call's v must be its k (pass v = k with k's strides), and it is %s", family,
                  c.k ? "another buffer" : "not given");
  if (!c.k) return 0;  // no keys: nothing is read
  for (int i = 0; i < 3; ++i)
    if (c.v_stride[i] != c.k_stride[i])
      return refuse(why, "this %s kernel was built for a latent cache (V is the first head_dim_v columns of K): the "
                    "call's v is its k but with other strides (v {%lld, %lld, %lld}, k {%lld, %lld, %lld})", family,
                    c.v_stride[0], c.v_stride[1], c.v_stride[2], c.k_stride[0], c.k_stride[1], c.k_stride[2]);
  return 0;
}

// An FP8-cache build against a call: build_fp8 is the build's ATT_KV_FP8 (0: absent, a cache of q's
// dtype). A build reads its cache in the dtype it was compiled for only, so a call with the other
// is refused with the reason (the export's dispatcher then tries another kernel).
inline int check_kv_dtype(const char* family, const Call& c, int build_fp8, Why* why, int build_qkv_fp8 = 0) {
  // An FP8 forward's q, k, v (Call::qkv_fp8) against the build's.
  if ((c.qkv_fp8 != 0) != (build_qkv_fp8 != 0))
    return refuse(why, "this %s kernel was built for %s q, k and v; the call's are %s (tune a problem with dtype=%s)",
                  family, build_qkv_fp8 ? "FP8 e4m3" : "16-bit", c.qkv_fp8 ? "FP8 e4m3" : "16-bit",
                  c.qkv_fp8 ? "fp8" : "fp16 or bf16");
  if ((c.kv_fp8 != 0) == (build_fp8 != 0)) return 0;
  return refuse(why, "this %s kernel was built for a KV cache of %s; the call's cache is %s (tune a problem %s)",
                family, build_fp8 ? "FP8 e4m3" : "q's dtype", c.kv_fp8 ? "FP8 e4m3" : "q's dtype",
                c.kv_fp8 ? "with kv_dtype=fp8" : "without kv_dtype");
}

// What the executor tells a plan of the device the call runs on.
struct Device {
  int sm_count;
  // How many clusters of `cluster` CTAs of kernel `kernel` (with `block` threads and `smem` bytes
  // of dynamic shared memory) fit on the device at once, for a grid of `grid_x` CTAs; 0 when the
  // executor cannot say (the SMs alone bound a grid then). `ctx` is the executor's.
  int (*max_active_clusters)(const void* ctx, int kernel, unsigned grid_x, unsigned cluster, unsigned block,
                             unsigned smem);
  const void* ctx;
  int clusters(int kernel, unsigned grid_x, unsigned cluster, unsigned block, unsigned smem) const {
    return max_active_clusters ? max_active_clusters(ctx, kernel, grid_x, cluster, block, smem) : 0;
  }
};

constexpr int kMaxKernels = 4;      // entry points of one build
constexpr int kMaxLaunches = 4;     // kernels one call launches
constexpr int kMaxWorkspaces = 4;
constexpr int kMaxTensorMaps = 6;
constexpr int kTensorMapBytes = 128;  // sizeof(CUtensorMap)

// One TMA tensor map, as cuTensorMapEncodeTiled takes it. The rest of the recipe is the same for
// every map: no interleave, zeros past the tensor's ends; L2 promotion 256 bytes unless the map says.
struct TensorMap {
  const char* name;  // for messages: "q", "k", ...
  const void* base;
  // > 0: a map over workspace `workspace - 1` of the plan, `base` then being the byte offset into
  // it: the executor encodes it once the workspace is there, and not at all when an optional one
  // is left out (Resources::map null; the family's bind then does without it). 0: base is the address.
  int workspace;
  int rank;   // 1..5
  int bf16;   // element type: 1 bf16, 0 fp16 (2 bytes either way), kMapBytes (2) one byte (uint8: FP8 e4m3)
  int swizzle_bytes;  // TMA's swizzle span: 128, 64 or 32 bytes (box_cols * 2 at most), 0: none
  unsigned long long dims[5];     // elements, innermost first
  unsigned long long strides[4];  // bytes, of dims 1..rank-1
  unsigned box[5];                // elements per dim of one copy
  // TMA's L2 promotion in bytes (64, 128, 256; 0: 256, the default): how much L2 fetches around each
  // sector a box reads. flash_decode's K/V maps take 128 (launch.h says why).
  int l2_promotion;
};

// Device memory a plan's kernels share. A zeroed workspace is zero before its first use and every
// launch leaves it zero (counters the last user resets). An optional one the executor may fail to
// provide (Resources::workspace[i] null): the family's bind then launches without it, as correctly.
// The executor (run_plan.h) keeps a build's workspaces by index from call to call and zeroes a
// zeroed one only when it allocates it, so an index must hold the same thing in every plan of a
// build (whatever the call): a family that adds a workspace for some calls only puts it after those
// every call has.
struct Workspace {
  unsigned long long bytes;
  int zeroed;
  int optional;
};

struct Launch {
  int kernel;  // index into LaunchFamily::kernel_names
  unsigned grid[3];
  unsigned block;
  unsigned smem;     // dynamic shared memory, bytes
  unsigned cluster;  // CTAs per cluster along x, compiled into the kernel (__cluster_dims__); 1: none
};

struct Plan {
  int launches;
  Launch launch[kMaxLaunches];
  int workspaces;
  Workspace workspace[kMaxWorkspaces];
  int maps;
  TensorMap map[kMaxTensorMaps];
  // What a family's plan computed for its bind to use as it is (zeros unless the family says
  // otherwise): flash_fwd_wgmma's causal split, a simulation that the workspaces were sized by.
  int handoff[4];
};

inline Plan empty_plan() {
  Plan p;
  std::memset(&p, 0, sizeof p);
  return p;
}

// What the executor prepared for a plan: the encoded maps and the workspaces' device addresses.
struct Resources {
  const void* map[kMaxTensorMaps];  // kTensorMapBytes each, 64-byte aligned
  void* workspace[kMaxWorkspaces];  // null: an optional workspace the executor could not provide
};

// One launch's kernel arguments: each argument's bytes in `storage`, `ptr` pointing at each (the
// void** of cuLaunchKernel and cudaLaunchKernel).
struct Args {
  alignas(64) unsigned char storage[2048];
  void* ptr[8];
  int count;
  unsigned used;
  Args() : count(0), used(0) {}
  // Appends one argument (copied, at its alignment); false when it does not fit.
  template <class T>
  bool add(const T& value) {
    const unsigned align = alignof(T), at = (used + align - 1) / align * align;
    if (count >= 8 || at + sizeof(T) > sizeof storage) return false;
    std::memcpy(storage + at, &value, sizeof(T));
    ptr[count++] = storage + at;
    used = at + static_cast<unsigned>(sizeof(T));
    return true;
  }
};

// The constants a build was compiled with: the renderer's #defines (name, value), in any order.
struct Define {
  const char* name;
  long long value;
};

// The value of `name` among `defs` into *out; refuses (naming it) when it is missing.
inline int define_value(const Define* defs, int n, const char* name, long long* out, Why* why) {
  for (int i = 0; i < n; ++i)
    if (std::strcmp(defs[i].name, name) == 0) {
      *out = defs[i].value;
      return 0;
    }
  return refuse(why, "the build's constants lack %s", name);
}
// The same for a define that builds recorded before it existed lack: `absent` then.
inline long long define_or(const Define* defs, int n, const char* name, long long absent) {
  for (int i = 0; i < n; ++i)
    if (std::strcmp(defs[i].name, name) == 0) return defs[i].value;
  return absent;
}

// An int define into *out, through define_value.
inline int define_int(const Define* defs, int n, const char* name, int* out, Why* why) {
  long long v = 0;
  if (define_value(defs, n, name, &v, why)) return 1;
  *out = static_cast<int>(v);
  return 0;
}

// The one canonical form of a call's variants, as Problem keeps a problem's (tuner/core/problem.cpp):
// a window (L, 0) without is_causal is causal attention within L keys; a causal call keeps
// window_right -1. Refuses what FlashAttention refuses: sides below -1, is_causal with a window
// reaching right of the diagonal, a soft-cap that is negative or not finite.
inline int normalise_variants(Call* c, Why* why) {
  if (c->window_left < -1 || c->window_right < -1)
    return refuse(why, "window (%d, %d): each side is -1 (unbounded) or a key count >= 0", c->window_left,
                  c->window_right);
  if (c->causal && c->window_right > 0)
    return refuse(why,
                  "is_causal with window_right %d: causal attention sees no key right of the diagonal; pass "
                  "is_causal 0 for a window reaching right of it",
                  c->window_right);
  if (!(c->softcap >= 0.0f) || c->softcap > 3.0e38f)
    return refuse(why, "softcap %g: 0 (none) or a positive finite cap", static_cast<double>(c->softcap));
  if (!c->causal && c->window_right == 0) c->causal = 1;
  if (c->causal) c->window_right = -1;
  return 0;
}

// Which variants a build was compiled with (the renderer's ATT_WINDOW, ATT_SOFTCAP, ATT_SINKS,
// absent from every plain build): a build serves exactly the calls with its variants, so the
// export's dispatcher never runs a full-attention kernel for a windowed call, nor the reverse.
struct Variants {
  int window, softcap, sinks;
  static Variants load(const Define* d, int n) {
    return Variants{static_cast<int>(define_or(d, n, "ATT_WINDOW", 0)), static_cast<int>(define_or(d, n, "ATT_SOFTCAP", 0)),
                    static_cast<int>(define_or(d, n, "ATT_SINKS", 0))};
  }
  static Variants of(const Call& c) { return Variants{c.windowed() ? 1 : 0, c.softcap > 0 ? 1 : 0, c.sinks ? 1 : 0}; }
  bool operator==(const Variants& o) const { return window == o.window && softcap == o.softcap && sinks == o.sinks; }
  // "window, softcap, sinks" / "no variant", into `out`.
  const char* words(char* out, int size) const {
    std::snprintf(out, static_cast<size_t>(size), "%s%s%s%s%s%s", window ? "a sliding window" : "",
                  window && (softcap || sinks) ? ", " : "", softcap ? "a logit soft-cap" : "",
                  softcap && sinks ? ", " : "", sinks ? "attention sinks" : "",
                  window || softcap || sinks ? "" : "no variant (plain attention)");
    return out;
  }
};

// Refuses a call whose variants are not the build's (family names the kernel in the reason).
inline int check_variants(const char* family, const Variants& build, const Call& call, Why* why) {
  const Variants want = Variants::of(call);
  if (want == build) return 0;
  char built[96], asked[96];
  return refuse(why, "this %s kernel was built for %s; the call asks for %s (tune a problem with the call's variants)",
                family, build.words(built, sizeof built), want.words(asked, sizeof asked));
}

constexpr int kMaxConstsBytes = 256;  // a family's constants, as its load() fills them

// A kernel family's launch, type-erased so that one table (the export's) and one registry (the
// tuner's) hold families of different constants. Each family's launch.h defines its constants
// type C with
//   static int load(const Define* defs, int n, C* out, Why* why);
//   int plan(const Call& call, const Device& device, Plan* out, Why* why) const;
//   int bind(const Call& call, const Plan& plan, const Resources& res, int launch, Args* args, Why* why) const;
// and one LaunchFamily made by make_family<C>(...). All return 0, or 1 with the reason in `why`.
struct LaunchFamily {
  const char* name;  // the folder under templates/, the YAML's family:
  int entries;       // Entry bits its kernels serve
  int kernels;
  const char* kernel_names[kMaxKernels];  // the build's extern "C" entry points, in order
  int (*load)(const Define* defs, int n, void* consts, Why* why);
  int (*plan)(const void* consts, const Call& call, const Device& device, Plan* out, Why* why);
  int (*bind)(const void* consts, const Call& call, const Plan& plan, const Resources& res, int launch, Args* args,
              Why* why);
};

template <class C>
struct Erased {
  static_assert(sizeof(C) <= kMaxConstsBytes && alignof(C) <= 8, "a family's constants exceed kMaxConstsBytes");
  static int load(const Define* defs, int n, void* consts, Why* why) {
    return C::load(defs, n, static_cast<C*>(consts), why);
  }
  static int plan(const void* consts, const Call& call, const Device& device, Plan* out, Why* why) {
    *out = empty_plan();
    return static_cast<const C*>(consts)->plan(call, device, out, why);
  }
  static int bind(const void* consts, const Call& call, const Plan& plan, const Resources& res, int launch,
                  Args* args, Why* why) {
    return static_cast<const C*>(consts)->bind(call, plan, res, launch, args, why);
  }
};

template <class C>
constexpr LaunchFamily make_family(const char* name, int entries, int kernels, const char* k0, const char* k1 = nullptr,
                             const char* k2 = nullptr, const char* k3 = nullptr) {
  return LaunchFamily{name, entries, kernels, {k0, k1, k2, k3}, &Erased<C>::load, &Erased<C>::plan, &Erased<C>::bind};
}

// Storage for one family's constants (what load() fills).
struct Consts {
  alignas(8) unsigned char bytes[kMaxConstsBytes];
};

// ---- helpers the families share ------------------------------------------------------------------

inline long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

// Greatest common divisor of two non-negative ints (a box of rows that fits both a page and a tile).
inline int gcd_int(int a, int b) {
  while (b) {
    const int t = a % b;
    a = b;
    b = t;
  }
  return a;
}

// The fields every family's kernel arguments name alike (AttnParams, DecodeParams): the tensors,
// their strides, the sizes and the softmax scale (with scale * log2(e), for exp2), from a call.
template <class P>
void fill_tensor_args(const Call& c, P* p) {
  p->q = c.q;
  p->k = c.k;
  p->v = c.v;
  p->o = c.out;
  p->lse = c.lse;
  for (int i = 0; i < 3; ++i) {
    p->q_stride[i] = c.q_stride[i];
    p->k_stride[i] = c.k_stride[i];
    p->v_stride[i] = c.v_stride[i];
    p->o_stride[i] = c.o_stride[i];
  }
  p->batch = c.batch;
  p->heads_q = c.heads_q;
  p->heads_kv = c.heads_kv;
  p->seqlen_q = c.seqlen_q;
  p->seqlen_k = c.seqlen_k;
  p->scale = c.scale;
  p->scale_log2 = static_cast<float>(static_cast<double>(c.scale) * 1.4426950408889634);  // log2(e)
  // The variants (variant_params.h): a soft-capped score is scaled already, so exp2 takes log2(e).
  p->variant.window_left = c.window_left;
  p->variant.window_right = c.window_right;
  p->variant.softcap = c.softcap;
  p->variant.softcap_scale = c.softcap > 0 ? c.scale / c.softcap : 0.0f;
  p->variant.sinks = c.sinks;
  if (c.softcap > 0) p->scale_log2 = 1.4426950408889634f;
}

// An FP8 cache's scales from a call (kv_scales.h; all zero for a 16-bit cache). Int strides: a
// [batch, heads_kv] table has fewer than 2^31 entries, and the plans refuse strides past it.
inline void fill_kv_scales(const Call& c, KvScales* s) {
  std::memset(s, 0, sizeof *s);
  if (!c.kv_fp8 && !c.qkv_fp8) return;  // an FP8 forward's K and V scales are here too
  s->k_descale = c.k_descale;
  s->v_descale = c.v_descale;
  for (int i = 0; i < 2; ++i) {
    s->k_descale_stride[i] = static_cast<int>(c.k_descale_stride[i]);
    s->v_descale_stride[i] = static_cast<int>(c.v_descale_stride[i]);
  }
}

// page_size as a multiply-shift divisor (DecodeParams, AttnParams): j / page_size = umulhi(j, mul) >> shift for
// 0 <= j < 2^31 (mul = ceil(2^(31 + L) / page_size), shift = L - 1, L = ceil(log2(page_size)));
// page_size 1: mul 0 (the kernel takes j itself).
inline void page_divisor(int page_size, unsigned* mul, int* shift) {
  if (page_size <= 1) {
    *mul = 0;
    *shift = 0;
    return;
  }
  int l = 0;
  while ((1LL << l) < page_size) ++l;
  *mul = static_cast<unsigned>(((1ULL << (31 + l)) + static_cast<unsigned long long>(page_size) - 1) /
                               static_cast<unsigned long long>(page_size));
  *shift = l - 1;
}

// A 4-d tensor map of 2-byte elements: dims innermost first, the byte steps of dims 1..3 from
// `steps` (elements), box `box`. A dimension of extent 1 is never stepped along: its stride (which
// may be 0, or anything a framework left on a size-1 dimension) is replaced by one the encoder accepts.
// TensorMap::bf16's value for a map of bytes (an FP8 forward's q, k and v).
constexpr int kMapBytes = 2;

inline TensorMap tensor_map4(const char* name, const void* base, int bf16, int swizzle_bytes,
                             const unsigned long long (&dims)[4], const long long (&steps)[3],
                             const unsigned (&box)[4]) {
  TensorMap m;
  std::memset(&m, 0, sizeof m);
  m.name = name;
  m.base = base;
  m.rank = 4;
  m.bf16 = bf16;
  m.swizzle_bytes = swizzle_bytes;
  for (int i = 0; i < 4; ++i) {
    m.dims[i] = dims[i];
    m.box[i] = box[i];
  }
  const unsigned long long elem = bf16 == kMapBytes ? 1 : 2;
  for (int i = 0; i < 3; ++i)
    m.strides[i] = dims[i + 1] > 1 ? static_cast<unsigned long long>(steps[i]) * elem
                   : elem == 2    ? dims[0] * 2
                                  : (dims[0] + 15) / 16 * 16;  // unused (extent 1), but TMA's multiple of 16
  return m;
}

// One operand of [batch, heads, len, head_dim] with strides {batch, head, row} in elements: dims
// (head_dim, len, heads, batch), box (box_cols, rows, 1, 1).
inline TensorMap operand_map(const char* name, const void* base, const long long* stride, int len, int heads,
                             int batch, int head_dim, unsigned box_cols, unsigned rows, int bf16,
                             int swizzle_bytes = 128) {
  const unsigned long long dims[4] = {static_cast<unsigned long long>(head_dim), static_cast<unsigned long long>(len),
                                      static_cast<unsigned long long>(heads), static_cast<unsigned long long>(batch)};
  const long long steps[3] = {stride[2], stride[1], stride[0]};  // row, head, batch
  const unsigned box[4] = {box_cols, rows, 1, 1};
  return tensor_map4(name, base, bf16, swizzle_bytes, dims, steps, box);
}

// One operand of bytes ([batch, heads, len, head_dim], strides {batch, head, row} in bytes) whose
// tiles of `rows` rows load in two boxes of row pairs: dims (head_dim, 4, ceil(len / 4), heads, batch),
// the row split as r = b + 4u (b in 0..3 at one row's stride, u at four rows'), boxes of (box_cols,
// 2, rows / 4). The box at (c, 2h, u0) lands rows 4 (u0 + i) + 2h + e (i below rows / 4, e in 0..1) as
// its rows 2i + e: the tile's rows whose index has bit 1 equal to h, in pairs. TMA checks u against
// ceil(len / 4) and b against 4, so where len % 4 != 0 the last box reads up to 3 rows past the
// tensor; the caller refuses such lengths (flash_fwd_wgmma's k_perm).
inline TensorMap key_pairs_map(const char* name, const void* base, const long long* stride, long long len, int heads,
                               int batch, int head_dim, unsigned box_cols, unsigned rows, int swizzle_bytes) {
  TensorMap m;
  std::memset(&m, 0, sizeof m);
  m.name = name;
  m.base = base;
  m.rank = 5;
  m.bf16 = kMapBytes;
  m.swizzle_bytes = swizzle_bytes;
  const unsigned long long dims[5] = {static_cast<unsigned long long>(head_dim), 4,
                                      static_cast<unsigned long long>((len + 3) / 4),
                                      static_cast<unsigned long long>(heads), static_cast<unsigned long long>(batch)};
  const unsigned box[5] = {box_cols, 2, rows / 4, 1, 1};
  const unsigned long long pad = (static_cast<unsigned long long>(head_dim) + 15) / 16 * 16;
  const unsigned long long steps[4] = {static_cast<unsigned long long>(stride[2]),
                                       static_cast<unsigned long long>(stride[2]) * 4,
                                       static_cast<unsigned long long>(stride[1]),
                                       static_cast<unsigned long long>(stride[0])};
  for (int i = 0; i < 5; ++i) {
    m.dims[i] = dims[i];
    m.box[i] = box[i];
  }
  for (int i = 0; i < 4; ++i) m.strides[i] = dims[i + 1] > 1 || i == 0 ? steps[i] : pad;  // extent 1: unused
  return m;
}

// The same operand with its heads inside its rows: dims (head_dim, heads, len, batch), boxes of
// (box_cols, box_heads, rows), which land in shared memory as box_heads * rows rows, row r being
// row r / box_heads of head r % box_heads (a GQA-packed tile: flash_fwd_wgmma's pack_gqa).
inline TensorMap operand_map_heads_inner(const char* name, const void* base, const long long* stride, int len,
                                         int heads, int batch, int head_dim, unsigned box_cols, unsigned box_heads,
                                         unsigned rows, int bf16, int swizzle_bytes = 128) {
  const unsigned long long dims[4] = {static_cast<unsigned long long>(head_dim), static_cast<unsigned long long>(heads),
                                      static_cast<unsigned long long>(len), static_cast<unsigned long long>(batch)};
  const long long steps[3] = {stride[1], stride[2], stride[0]};  // head, row, batch
  const unsigned box[4] = {box_cols, box_heads, rows, 1};
  return tensor_map4(name, base, bf16, swizzle_bytes, dims, steps, box);
}

}  // namespace attntune_plan

#endif  // ATTNTUNE_LAUNCH_PLAN_H
