// ---- templates/export/launcher.cuh: the host side of an exported attntune file.
//
// `attntune export` appends this after the kernels and replaces each marker (a name between two
// pairs of at-signs) with integers, fixed identifiers (attntune_kN namespaces, the family's renamed
// entry points), the launch plans of the kernels' families (templates/<family>/launch.h, with the
// plan executor, templates/common/run_plan.h over the runtime, templates/export/run_plan.cuh,
// verbatim) and one C string literal of ASCII JSON
// with every quote, backslash and question mark escaped. Nothing else from the database reaches
// this code.
//
// One launcher for every family: argument checks, kernel selection, device checks, errors and
// provenance are here; how a call becomes launches (grids, workspaces, tensor maps, what only
// that launch refuses) is the family's launch plan, run by the same executor the tuner measured it
// with.
//
// The C entry points check everything the kernels assume before any CUDA call, and answer
// ATTNTUNE_UNSUPPORTED with a reason (attntune_last_error) rather than computing garbage:
//   - head_dim and is_causal: one of the kernels of this file was built for them;
//   - sizes: batch, heads, lengths >= 0, heads_q a multiple of heads_kv, grid limits;
//   - alignment: the kernels copy rows into shared memory 16 bytes at a time (cp.async, or TMA
//     whose tensor maps take 16-byte-aligned bases and strides), so q, k, v and out start on
//     16-byte boundaries and every stride is a multiple of 8 elements (of an FP8 cache's one-byte
//     elements, 16: whole 16 bytes either way);
//   - strides >= 0, and out's strides never make two outputs share an element;
//   - the cache's dtype (attntune_options.kv_dtype): a kernel runs calls of the cache dtype it was
//     built for only, and FP8 scales' pointers and strides are checked;
//   - softmax_scale finite and > 0 (the online softmax tracks the row maximum of the raw scores);
//   - what the kernel's launch plan adds (TMA: strides under 2^40 bytes, work tiles in an int);
//   - the device: the kernel has code for it and fits its shared memory and registers.
// attntune_attention_backward (the backward pass, kEntryBackward; and of a packed batch,
// attntune_attention_backward_varlen, kEntryBackwardVarlen, with the varlen checks too) checks the same of its eight tensors
// (q, k, v, out, dout read; dq, dk, dv written: three tensors, none with two positions sharing an
// element), softmax_lse 4-byte aligned, and takes of the options a window and `deterministic` only;
// backward kernels serve it alone.
// The element type cannot be checked through void pointers: it is the "dtype" of
// attntune_kernel_info() (and a kernel's problem's "kv_dtype" for an FP8 cache).

// Host code only: the device passes of nvcc need the kernels alone (and with -arch=sm_90a, the
// compute_90 PTX pass sees no arch-specific kernel: see the kernel's #if).
#if !defined(__CUDA_ARCH__)

#define ATTNTUNE_UNSUPPORTED 1000
// attntune_options.kv_dtype: the K/V cache's element type (docs/CONTRACT.md "FP8 KV caches").
#define ATTNTUNE_KV_DTYPE_Q 0     // q's dtype (fp16 or bf16), two bytes an element: every call before kv_dtype
#define ATTNTUNE_KV_FP8_E4M3 1    // FP8 e4m3, one byte an element, with dequantisation scales (k_descale, v_descale)
// attntune_options.qkv_dtype: q's, k's and v's element type (docs/CONTRACT.md "FP8 forward").
#define ATTNTUNE_QKV_16BIT 0      // the kernels' fp16 or bf16, two bytes an element: every call before qkv_dtype
#define ATTNTUNE_QKV_FP8_E4M3 1   // FP8 e4m3 q, k and v (v transposed), with q_descale, k_descale, v_descale; out bf16
#if defined(_WIN32)
#define ATTNTUNE_API __declspec(dllexport)
#else
#define ATTNTUNE_API __attribute__((visibility("default")))
#endif

// The extended entry points' options (docs/CONTRACT.md "variants"): the caller's declaration of this
// struct may be older (shorter) or newer (longer) than this file's; `size` says which. Fields past a
// caller's size take their defaults (all zero), a NULL pointer means every default (plain
// attention), and fields this file does not know must be zero (else ATTNTUNE_UNSUPPORTED: a newer
// option this library cannot honour). Later options are added at the end. Zero-initialised (memset,
// or an initialiser, which zeroes the padding after kv_dtype too), it is plain attention:
//   attntune_options o = {sizeof(attntune_options)};  o.window = 1; o.window_left = 4096; o.window_right = 0;
extern "C" {
typedef struct attntune_options {
  size_t size;          // sizeof(attntune_options) as the caller compiled it
  int window;           // 1: window_left/window_right apply; 0: no window
  int window_left;      // keys left of a query's (bottom-right aligned) diagonal it sees; -1: unbounded
  int window_right;     // keys right of it; -1: unbounded; with is_causal 0 or -1 (causal is right 0)
  float softcap;        // > 0: score = softcap * tanh(softmax_scale * q.k / softcap); 0: none
  const float* sinks;   // NULL, or [heads_q] fp32 logits (device) joining each row's softmax denominator
  int head_dim_v;       // V's and out's head dim where it is not head_dim (DeepSeek's MLA prefill: 128 beside
                        // head_dim 192); 0: head_dim. v and out are then [.., head_dim_v] through their strides
  int latent;           // 1: V is K's first head_dim_v columns, one buffer (MLA's latent cache): v is k with k's
                        // strides (else refused); attntune_select_kernel_ex then weighs latent kernels too. 0:
                        // no such statement (a call whose v is k is still served, by any kernel: the pointers say it)
  int kv_dtype;         // ATTNTUNE_KV_DTYPE_Q (0): k and v are q's dtype. ATTNTUNE_KV_FP8_E4M3 (1): k and v are FP8
                        // e4m3, one byte an element, their strides counting those elements (bytes: multiples of 16);
                        // q and out stay fp16/bf16. Only kernels built for the call's cache dtype run it
  const float* k_descale;  // FP8: K's dequantisation scales (FlashAttention-3's descale_k), [batch, heads_kv] fp32 on
  const float* v_descale;  // the device through the strides below; NULL: 1. V's likewise. Both NULL for kv_dtype 0
  long long k_descale_stride[2];  // {batch, head} in elements, 0 .. 2^31 - 1; {0, 0}: one scale for the tensor
  long long v_descale_stride[2];
  int deterministic;    // 1: the backward pass's gradients are bit-identical run to run (dQ's shares are added in a
                        // fixed order, at some cost in time; FlashAttention's deterministic=True); 0: they may differ in
                        // the last bits. The forward entry points accept it and need nothing of it: their kernels write
                        // each output by one fixed sequence of operations. A library before it refuses 1 (a byte past
                        // its struct set), so a caller that asks is never served nondeterministically
  int qkv_dtype;        // ATTNTUNE_QKV_16BIT (0): q, k, v (and out) in the kernels' fp16/bf16. ATTNTUNE_QKV_FP8_E4M3 (1):
                        // the FP8 forward (attntune_attention_forward_ex only): q, k and v FP8 e4m3, one byte an element,
                        // their strides counting those (multiples of 16), v TRANSPOSED: [batch, heads_kv, head_dim_v,
                        // seqlen_k] with the keys contiguous, v_strides {batch, head, value dim}; out bf16. Only kernels
                        // built for dtype=fp8 run it. k_descale/v_descale (above) hold K's and V's scales; kv_dtype stays 0
  const float* q_descale;         // FP8 forward: Q's scales (FlashAttention-3's descale_q), [batch, heads_kv] fp32 on the
  long long q_descale_stride[2];  // device through {batch, head} strides in elements ({0, 0}: one scale); NULL: 1
} attntune_options;
}

// The plan executor and the launch plans of this file's kernel families.
@@FAMILY_LAUNCHERS@@
namespace attntune_export {

using attntune_plan::Call;

// One tuned kernel build of this file: what it was built and tuned for, and how to launch it (its
// family's launch plan with the constants it was built with).
struct Kernel {
  const char* label;  // "d=128 bf16 causal=0, tuned for b=4,h=16,hkv=16,s=4096,sk=4096"
  const char* arch;   // what it was built and measured for: "sm_90", "sm_90a" (arch-specific)
  int head_dim, causal, bf16;
  int tuned_b, tuned_h, tuned_hkv, tuned_s, tuned_sk;
  int entries;  // the entry points it serves (Entry bits): its family's, varlen only for a varlen build
  int window, softcap, sinks;  // the variants it was built with: it serves calls with exactly these
  int head_dim_v;              // V's and O's head dim when built for another than head_dim, else 0
  int latent;                  // 1: built for a latent cache (V is k's first head_dim_v columns; its plan
                               // serves only calls with v = k, check_latent), else 0
  int kv_fp8;                  // 1: built for an FP8 e4m3 KV cache (ATT_KV_FP8): it serves calls with kv_dtype 1
                               // only; 0: a cache of q's dtype, calls with kv_dtype 0 only
  int qkv_fp8;                 // 1: built for the FP8 forward (ATT_QKV_FP8): it serves calls with qkv_dtype 1 only
  const attntune_plan::LaunchFamily* family;
  const attntune_plan::Define* defines;  // the #defines it was built with
  int define_count;
  const void* funcs[attntune_plan::kMaxKernels];  // its __global__ entry points, in the family's order
};

static thread_local char g_error[1024] = "";

#if defined(__GNUC__)
static int unsupported(const char* format, ...) __attribute__((format(printf, 1, 2)));
#endif
static int unsupported(const char* format, ...) {
  va_list ap;
  va_start(ap, format);
  std::vsnprintf(g_error, sizeof g_error, format, ap);
  va_end(ap);
  return ATTNTUNE_UNSUPPORTED;
}

static int cuda_failed(cudaError_t e, const char* call) {
  std::snprintf(g_error, sizeof g_error, "%s: %s (%s)", call, cudaGetErrorString(e), cudaGetErrorName(e));
  return static_cast<int>(e);
}

}  // namespace attntune_export

namespace attntune_export {

// clang-format off
@@DEFINE_TABLES@@
static const Kernel kKernels[] = {
@@KERNEL_TABLE@@
};
// clang-format on
static const int kKernelCount = static_cast<int>(sizeof(kKernels) / sizeof(kKernels[0]));

static const char kInfo[] =
@@INFO_JSON@@;

// The arch list nvcc compiled this file for ("800,900"), for the message when a device has none.
#define ATTNTUNE_STR2(...) #__VA_ARGS__
#define ATTNTUNE_STR(...) ATTNTUNE_STR2(__VA_ARGS__)
#ifdef __CUDA_ARCH_LIST__
static const char kBuiltFor[] = ATTNTUNE_STR(__CUDA_ARCH_LIST__);
#else
static const char kBuiltFor[] = "unknown";
#endif

// Each kernel's constants, as its family's load() reads them from its defines: once, at the first
// call (a failure there is a bug of this file's maker, reported on every call).
struct LoadedConsts {
  attntune_plan::Consts consts[sizeof(kKernels) / sizeof(kKernels[0])];
  int failed;  // 1 + the index of the kernel whose constants did not load; 0: all loaded
  attntune_plan::Why why;
};
static const LoadedConsts& loaded_consts() {
  static const LoadedConsts loaded = [] {
    LoadedConsts l;
    std::memset(&l, 0, sizeof l);
    for (int i = 0; i < kKernelCount && !l.failed; ++i)
      if (kKernels[i].family->load(kKernels[i].defines, kKernels[i].define_count, l.consts[i].bytes, &l.why))
        l.failed = i + 1;
    return l;
  }();
  return loaded;
}

static bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Checks a tensor's 3 strides (in its elements, of `element_bytes` each: 2, or 1 for an FP8 cache);
// returns a reason or nullptr. Rows are copied 16 bytes at a time: every stride is whole 16 bytes.
static const char* check_strides(const long long* s, int element_bytes) {
  for (int i = 0; i < 3; ++i) {
    if (s[i] < 0) return "a stride is negative";
    if (s[i] * element_bytes % 16 != 0)
      return element_bytes == 1 ? "a stride is not a multiple of 16 elements (an FP8 cache's strides count bytes: "
                                  "16-byte rows)"
                                : "a stride is not a multiple of 8 elements (16-byte rows)";
  }
  return nullptr;
}

// out must not have two (batch, head, row) positions sharing an element: sorted by stride, each
// dimension of extent > 1 must step past everything the smaller ones span (a row spans head_dim).
static bool out_overlaps(const long long* s, int batch, int heads, int rows, int head_dim) {
  long long stride[3] = {s[0], s[1], s[2]}, extent[3] = {batch, heads, rows};
  for (int i = 0; i < 3; ++i)
    for (int j = i + 1; j < 3; ++j)
      if (stride[j] < stride[i]) {
        long long t = stride[i]; stride[i] = stride[j]; stride[j] = t;
        t = extent[i]; extent[i] = extent[j]; extent[j] = t;
      }
  long long span = head_dim;
  for (int i = 0; i < 3; ++i) {
    if (extent[i] <= 1) continue;
    if (stride[i] < span) return true;
    span = stride[i] * (extent[i] - 1) + span;
  }
  return false;
}

static double log_ratio(double a, double b) {
  const double r = std::log((a > 0 ? a : 1) / (b > 0 ? b : 1));
  return r < 0 ? -r : r;
}

// Whether kernel `index`'s family accepts `call`: its launch plan, dry, on a device of one SM
// (what a plan refuses there it refuses on any device). A flash_decode kernel refuses seqlen_q over
// 16, a TMA kernel strides past 2^40 bytes: the dispatcher passes over a kernel that would refuse.
static bool accepts(int index, const Call& call, attntune_plan::Why* why) {
  const LoadedConsts& loaded = loaded_consts();
  if (loaded.failed) return true;  // run() reports it, on every call
  attntune_plan::Device any_device;
  std::memset(&any_device, 0, sizeof any_device);
  any_device.sm_count = 1;
  attntune_plan::Plan dry;
  return kKernels[index].family->plan(loaded.consts[index].bytes, call, any_device, &dry, why) == 0;
}

// Whether kernel k was built for call a: its entry point, head dims, is_causal, variants and cache
// dtype (an FP8-cache kernel never reads a 16-bit cache, nor the reverse).
static bool built_for_call(const Kernel& k, const Call& a) {
  const attntune_plan::Variants v = attntune_plan::Variants::of(a);
  return (k.entries & a.entry) && k.head_dim == a.head_dim && k.head_dim_v == a.split_head_dim_v() &&
         k.causal == (a.causal ? 1 : 0) && k.window == v.window && k.softcap == v.softcap && k.sinks == v.sinks &&
         k.kv_fp8 == (a.kv_fp8 ? 1 : 0) && k.qkv_fp8 == (a.qkv_fp8 ? 1 : 0);
}

// The kernel for call `a` (of any entry point): among those whose family serves the entry point,
// built for its head_dim, is_causal and variants (a windowed call never runs a full-attention
// kernel, nor the reverse), and whose launch plan accepts it, the one tuned for the
// nearest sequence lengths (by ratio); ties go to the same GQA group size, then the nearest batch *
// heads, then the order of kernel_info's "kernels". The candidates are ranked first and planned in
// that order, so a call plans one kernel unless the nearest refuses. -1 if none accepts; then, if
// a kernel was built for the call, `refused` holds the nearest one's reason (else it is empty).
static int select_kernel(const Call& a, attntune_plan::Why* refused) {
  if (refused) refused->text[0] = 0;
  int order[sizeof(kKernels) / sizeof(kKernels[0])];
  double keys[sizeof(kKernels) / sizeof(kKernels[0])][3];
  int n = 0;
  for (int i = 0; i < kKernelCount; ++i) {
    const Kernel& k = kKernels[i];
    if (!built_for_call(k, a)) continue;
    const int group = a.heads_kv > 0 ? a.heads_q / a.heads_kv : 1, tuned_group = k.tuned_h / k.tuned_hkv;
    const double key[3] = {log_ratio(a.seqlen_q, k.tuned_s) + log_ratio(a.seqlen_k, k.tuned_sk),
                           group == tuned_group ? 0.0 : 1.0,
                           log_ratio(static_cast<double>(a.batch) * a.heads_q,
                                     static_cast<double>(k.tuned_b) * k.tuned_h)};
    // Insertion by key; equal keys keep the kernels' order.
    int at = n;
    while (at > 0) {
      const double* prev = keys[at - 1];
      bool before = false, after = false;
      for (int j = 0; j < 3 && !before && !after; ++j) {
        if (key[j] < prev[j] - 1e-12) before = true;
        else if (key[j] > prev[j] + 1e-12) after = true;
      }
      if (!before) break;
      order[at] = order[at - 1];
      for (int j = 0; j < 3; ++j) keys[at][j] = prev[j];
      --at;
    }
    order[at] = i;
    for (int j = 0; j < 3; ++j) keys[at][j] = key[j];
    ++n;
  }
  for (int c = 0; c < n; ++c) {
    attntune_plan::Why why;
    why.text[0] = 0;
    if (accepts(order[c], a, &why)) {
      if (refused) refused->text[0] = 0;
      return order[c];
    }
    if (c == 0 && refused)
      std::snprintf(refused->text, sizeof refused->text, "kernel %s: %s", kKernels[order[c]].label, why.text);
  }
  return -1;
}

// Whether some kernel of this file serves call `a`'s entry point and was built for its head_dim,
// is_causal and variants (whatever its plan says of the rest).
static bool built_for(const Call& a) {
  for (int i = 0; i < kKernelCount; ++i)
    if (built_for_call(kKernels[i], a)) return true;
  return false;
}

static const char* entry_name(int entry) {
  return entry == attntune_plan::kEntryKvcache    ? "attntune_attention_forward_kvcache"
         : entry == attntune_plan::kEntryVarlen   ? "attntune_attention_forward_varlen"
         : entry == attntune_plan::kEntryBackward ? "attntune_attention_backward"
         : entry == attntune_plan::kEntryBackwardVarlen ? "attntune_attention_backward_varlen"
                                                  : "attntune_attention_forward";
}

static int no_kernel(const Call& a, const attntune_plan::Why& refused) {
  if (refused.text[0]) return unsupported("%s", refused.text);
  const int entry = a.entry, head_dim = a.head_dim, is_causal = a.causal;
  char words[96], variants[140] = "";
  const attntune_plan::Variants v = attntune_plan::Variants::of(a);
  if (v.window || v.softcap || v.sinks) std::snprintf(variants, sizeof variants, " with %s", v.words(words, sizeof words));
  if (a.split_head_dim_v()) {  // the value head dim after the variants: " head_dim_v=128"
    const size_t used = std::strlen(variants);
    std::snprintf(variants + used, sizeof variants - used, " head_dim_v=%d", a.head_dim_v);
  }
  if (a.kv_fp8) {  // the cache dtype last: " kv_dtype=fp8"
    const size_t used = std::strlen(variants);
    std::snprintf(variants + used, sizeof variants - used, " kv_dtype=fp8");
  }
  if (a.qkv_fp8) {  // the FP8 forward: " dtype=fp8"
    const size_t used = std::strlen(variants);
    std::snprintf(variants + used, sizeof variants - used, " dtype=fp8");
  }
  char built[600] = "";
  size_t used = 0;
  for (int i = 0; i < kKernelCount && used + 1 < sizeof built; ++i) {
    const int n = std::snprintf(built + used, sizeof built - used, "%s%s (%s)", i ? "; " : "", kKernels[i].label,
                                kKernels[i].family->name);
    if (n < 0) break;
    used += static_cast<size_t>(n);
  }
  return unsupported("no kernel in this file for head_dim=%d is_causal=%d%s serves %s; it holds: %s", head_dim,
                     is_causal, variants, entry_name(entry), built);
}

// Per device and kernel: 1 once the device was checked.
static const int kMaxDevices = 64;
static std::atomic<int> g_ready[kMaxDevices][sizeof(kKernels) / sizeof(kKernels[0])];

// "sm_90a": code for that arch runs on compute capability 9.0 only (wgmma, setmaxnreg).
static bool arch_specific(const char* arch) {
  size_t n = 0;
  while (arch[n]) ++n;
  return n > 0 && arch[n - 1] == 'a';
}

// 90 for "sm_90a" (the table's archs are "sm_", digits and at most an "a").
static int arch_number(const char* arch) {
  int n = 0;
  for (const char* c = arch + 3; *c >= '0' && *c <= '9'; ++c) n = n * 10 + (*c - '0');
  return n;
}

// Checks that kernel `index`'s entry points have code for `device`.
static int prepare(int device, int index) {
  const Kernel& k = kKernels[index];
  if (device >= 0 && device < kMaxDevices && g_ready[device][index].load(std::memory_order_acquire)) return 0;
  int major = 0, minor = 0;
  cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (e != cudaSuccess) return cuda_failed(e, "cudaDeviceGetAttribute");
  if (arch_specific(k.arch) && major * 10 + minor != arch_number(k.arch))
    return unsupported("kernel %s is %s code, which runs only on GPUs of compute capability %d.%d; device %d is "
                       "sm_%d%d: export a kernel tuned for it",
                       k.label, k.arch, arch_number(k.arch) / 10, arch_number(k.arch) % 10, device, major, minor);
  for (int f = 0; f < k.family->kernels; ++f) {
    cudaFuncAttributes attr;
    e = cudaFuncGetAttributes(&attr, k.funcs[f]);
    if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction ||
        e == cudaErrorUnsupportedPtxVersion || e == cudaErrorInvalidPtx) {
      cudaGetLastError();  // ours, not the caller's: do not leave it behind
      if (arch_specific(k.arch))
        return unsupported(
            "kernel %s has no code for device %d (sm_%d%d): it uses %s-only instructions, so it runs only on "
            "that arch's GPUs, compiled with -arch=%s (this library: compute capabilities %s; %s)",
            k.label, device, major, minor, k.arch, k.arch, kBuiltFor, cudaGetErrorName(e));
      return unsupported(
          "kernel %s has no code for device %d (sm_%d%d): this library was compiled for compute "
          "capabilities %s; rebuild the .cu with -arch=sm_%d%d (%s)",
          k.label, device, major, minor, kBuiltFor, major, minor, cudaGetErrorName(e));
    }
    if (e != cudaSuccess) return cuda_failed(e, "cudaFuncGetAttributes");
  }
  if (device >= 0 && device < kMaxDevices) g_ready[device][index].store(1, std::memory_order_release);
  return 0;
}

// Runs `call` with kernel `index` (select_kernel's, whose plan accepted it): its device checked, its
// family's plan executed.
static int run(const Call& call, int index, cudaStream_t stream) {
  const LoadedConsts& loaded = loaded_consts();
  if (loaded.failed)
    return unsupported("kernel %s: its constants do not load (%s)", kKernels[loaded.failed - 1].label,
                       loaded.why.text);
  const Kernel& k = kKernels[index];
  attntune_plan::Why why;
  why.text[0] = 0;
  // select_kernel planned the call for a device of one SM (what a plan refuses, it refused there,
  // before any CUDA call); the executor plans again for the real device.
  int device = 0;
  const cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return cuda_failed(e, "cudaGetDevice");
  if (const int r = prepare(device, index)) return r;
  const int r = attntune_run::run_plan(*k.family, loaded.consts[index].bytes, k.funcs, call, stream, &why);
  if (r == attntune_run::kUnsupported) return unsupported("kernel %s: %s", k.label, why.text);
  if (r != 0) std::snprintf(g_error, sizeof g_error, "%s", why.text);
  return r;
}

// The checks every entry point shares, on q (and out, like q) and the sizes; 0 or unsupported.
static int check_common(const Call& a) {
  if (a.batch < 0 || a.heads_q < 0 || a.heads_kv < 0 || a.seqlen_q < 0 || a.seqlen_k < 0)
    return unsupported("negative size: batch=%d heads_q=%d heads_kv=%d seqlen_q=%d seqlen_k=%d", a.batch,
                       a.heads_q, a.heads_kv, a.seqlen_q, a.seqlen_k);
  if (a.causal != 0 && a.causal != 1) return unsupported("is_causal must be 0 or 1 (got %d)", a.causal);
  return 0;
}

// The grid's and the lengths' limits and the scale, which every entry point checks once a kernel
// serves the call (check_tensors, check_backward_tensors).
static int check_limits(const Call& a) {
  if (a.batch > 65535 || a.heads_q > 65535)
    return unsupported("batch (%d) and heads_q (%d) must be at most 65535 (grid limits)", a.batch, a.heads_q);
  if (a.seqlen_q > (1 << 30) || a.seqlen_k > (1 << 30))
    return unsupported("sequence lengths must be at most 2^30 (got seqlen_q=%d seqlen_k=%d)", a.seqlen_q,
                       a.seqlen_k);
  if (!(a.scale > 0.f && a.scale <= 3.402823466e+38f))
    return unsupported("softmax_scale must be finite and > 0 (got %g); the usual value is 1/sqrt(head_dim)",
                       static_cast<double>(a.scale));
  return 0;
}

// What every entry point checks once a kernel serves the call: heads, lengths, scale, pointers,
// alignment, strides, out without overlaps. `kv_rows` is what k's and v's strides index by row
// (the keys per sequence, or a page's rows).
static int check_tensors(const Call& a) {
  if (a.heads_q > 0 && (a.heads_kv <= 0 || a.heads_q % a.heads_kv != 0))
    return unsupported("heads_q (%d) must be a positive multiple of heads_kv (%d)", a.heads_q, a.heads_kv);
  if (const int r = check_limits(a)) return r;
  if (a.batch == 0 || a.heads_q == 0 || a.seqlen_q == 0) return 0;  // nothing to compute
  const bool has_keys = a.seqlen_k > 0;
  if (!a.q || !a.out || (has_keys && (!a.k || !a.v)))
    return unsupported("q, k, v and out must not be NULL (k and v may be NULL only when seqlen_k is 0)");
  if (!aligned16(a.q) || !aligned16(a.k) || !aligned16(a.v) || !aligned16(a.out))
    return unsupported("q, k, v and out must be 16-byte aligned (q=%p k=%p v=%p out=%p)", a.q, a.k, a.v, a.out);
  if (a.lse && reinterpret_cast<std::uintptr_t>(a.lse) % 4 != 0)
    return unsupported("lse must be 4-byte aligned (got %p)", static_cast<void*>(a.lse));
  // K's and V's elements are the cache's: one byte for an FP8 cache (their strides count bytes); an FP8
  // forward's q, k and v one byte each (v transposed: its strides are {batch, head, value dim}).
  const int kv_bytes = a.kv_fp8 || a.qkv_fp8 ? 1 : 2, q_bytes = a.qkv_fp8 ? 1 : 2;
  const struct {
    const char* name;
    const long long* stride;
    int element_bytes;
  } tensors[] = {{"q_strides", a.q_stride, q_bytes}, {"k_strides", a.k_stride, kv_bytes}, {"v_strides", a.v_stride, kv_bytes},
                 {"o_strides", a.o_stride, 2}};
  for (const auto& t : tensors)
    if (const char* why = check_strides(t.stride, t.element_bytes))
      return unsupported("%s {%lld, %lld, %lld}: %s", t.name, t.stride[0], t.stride[1], t.stride[2], why);
  // A packed batch's out is one sequence of its rows (all of them when the caller says how many).
  const bool packed = a.entry == attntune_plan::kEntryVarlen;
  const int out_batch = packed ? 1 : a.batch;
  const long long out_rows = packed && a.total_q > 0 ? a.total_q : a.seqlen_q;
  const int out_dim = a.value_head_dim();  // out's rows: head_dim_v wide
  if (out_rows <= 2147483647LL && out_overlaps(a.o_stride, out_batch, a.heads_q, static_cast<int>(out_rows), out_dim)) {
    if (packed)
      return unsupported("o_strides {row %lld, head %lld} make outputs overlap for heads_q=%d rows=%lld head_dim=%d",
                         a.o_stride[2], a.o_stride[1], a.heads_q, out_rows, out_dim);
    return unsupported("o_strides {%lld, %lld, %lld} make outputs overlap for batch=%d heads_q=%d seqlen_q=%d "
                       "head_dim=%d",
                       a.o_stride[0], a.o_stride[1], a.o_stride[2], a.batch, a.heads_q, a.seqlen_q, out_dim);
  }
  return 0;
}

// What the varlen entry points add: the prefix sums, and the packed rows when given.
static int check_packing(const Call& a) {
  if (!a.cu_seqlens_q || !a.cu_seqlens_k) return unsupported("cu_seqlens_q and cu_seqlens_k must not be NULL");
  if (reinterpret_cast<std::uintptr_t>(a.cu_seqlens_q) % 4 != 0 ||
      reinterpret_cast<std::uintptr_t>(a.cu_seqlens_k) % 4 != 0)
    return unsupported("cu_seqlens_q and cu_seqlens_k must be 4-byte aligned (got %p, %p)",
                       static_cast<const void*>(a.cu_seqlens_q), static_cast<const void*>(a.cu_seqlens_k));
  return 0;
}

// What the kvcache entry point adds: its page table and lengths.
static int check_cache(const Call& a) {
  if (a.cache_seqlens && reinterpret_cast<std::uintptr_t>(a.cache_seqlens) % 4 != 0)
    return unsupported("cache_seqlens must be 4-byte aligned (got %p)", static_cast<const void*>(a.cache_seqlens));
  if (!a.block_table) return 0;
  if (reinterpret_cast<std::uintptr_t>(a.block_table) % 4 != 0)
    return unsupported("block_table must be 4-byte aligned (got %p)", static_cast<const void*>(a.block_table));
  if (a.page_size < 1) return unsupported("page_size must be 1 or more with a block_table (got %d)", a.page_size);
  if (a.max_blocks_per_seq < 1 ||
      static_cast<long long>(a.max_blocks_per_seq) * a.page_size < static_cast<long long>(a.seqlen_k))
    return unsupported("max_blocks_per_seq (%d) pages of %d rows cannot hold seqlen_k_max (%d) keys",
                       a.max_blocks_per_seq, a.page_size, a.seqlen_k);
  return 0;
}

// What the variants add: a canonical window (a window (L, 0) is causal), a valid soft-cap, an
// aligned sink array.
static int check_variants(Call* a) {
  attntune_plan::Why why;
  if (attntune_plan::normalise_variants(a, &why)) return unsupported("%s", why.text);
  if (a->sinks && reinterpret_cast<std::uintptr_t>(a->sinks) % 4 != 0)
    return unsupported("sinks must be 4-byte aligned (got %p)", static_cast<const void*>(a->sinks));
  return 0;
}

static int forward(Call a, cudaStream_t stream) {
  // Sizes first: a zero-sized tensor may come with a NULL pointer.
  if (const int r = check_common(a)) return r;
  if (const int r = check_variants(&a)) return r;
  attntune_plan::Why refused;
  refused.text[0] = 0;
  if (!built_for(a)) return no_kernel(a, refused);
  if (const int r = check_tensors(a)) return r;
  if (a.entry == attntune_plan::kEntryKvcache)
    if (const int r = check_cache(a)) return r;
  if (a.entry == attntune_plan::kEntryVarlen)
    if (const int r = check_packing(a)) return r;
  if (a.batch == 0 || a.heads_q == 0 || a.seqlen_q == 0) return 0;  // nothing to compute
  if (a.entry == attntune_plan::kEntryVarlen && a.total_q == 0) return 0;  // every sequence empty
  const int index = select_kernel(a, &refused);
  if (index < 0) return no_kernel(a, refused);
  return run(a, index, stream);
}

// The call's common arguments.
static Call make_call(int entry, const void* q, const void* k, const void* v, void* out, float* lse, int batch,
                      int heads_q, int heads_kv, int seqlen_q, int seqlen_k, int head_dim, const long long* q_strides,
                      const long long* k_strides, const long long* v_strides, const long long* o_strides,
                      float softmax_scale, int is_causal) {
  Call a = attntune_plan::empty_call();
  a.entry = entry;
  a.q = q;
  a.k = k;
  a.v = v;
  a.out = out;
  a.lse = lse;
  a.batch = batch;
  a.heads_q = heads_q;
  a.heads_kv = heads_kv;
  a.seqlen_q = seqlen_q;
  a.seqlen_k = seqlen_k;
  a.head_dim = head_dim;
  for (int i = 0; i < 3; ++i) {
    a.q_stride[i] = q_strides[i];
    a.k_stride[i] = k_strides[i];
    a.v_stride[i] = v_strides[i];
    a.o_stride[i] = o_strides[i];
  }
  a.scale = softmax_scale;
  a.causal = is_causal;
  return a;
}

// The extended entry points' options into the call (attntune_options): 0, or unsupported. `latent`
// (if given) receives the options' latent (0 or 1): a statement about the call's pointers, which the
// real entry points check (check_latent_option) and the size-only selector acts on.
static int apply_options(Call* a, const attntune_options* opts, int* latent = nullptr) {
  if (latent) *latent = 0;
  if (!opts) return 0;  // every default: plain attention
  const size_t kMostBytes = 4096;  // a larger size is not a struct of ours
  if (opts->size < sizeof(size_t) || opts->size > kMostBytes)
    return unsupported("attntune_options: size %llu is not sizeof(attntune_options) of any attntune version (set it "
                       "to sizeof(attntune_options); this library's is %llu)",
                       static_cast<unsigned long long>(opts->size), static_cast<unsigned long long>(sizeof(attntune_options)));
  attntune_options o;
  std::memset(&o, 0, sizeof o);
  std::memcpy(&o, opts, opts->size < sizeof o ? opts->size : sizeof o);
  // A newer caller's fields past ours must be at their defaults (zero): an option this file cannot
  // honour is refused, never ignored.
  const unsigned char* bytes = reinterpret_cast<const unsigned char*>(opts);
  for (size_t i = sizeof o; i < opts->size; ++i)
    if (bytes[i] != 0)
      return unsupported("attntune_options: byte %llu of the caller's %llu-byte options is set, and this library "
                         "knows only the first %llu (an option of a newer attntune): export the kernels again with it",
                         static_cast<unsigned long long>(i), static_cast<unsigned long long>(opts->size),
                         static_cast<unsigned long long>(sizeof o));
  if (o.window != 0 && o.window != 1) return unsupported("attntune_options: window must be 0 or 1 (got %d)", o.window);
  if (o.deterministic != 0 && o.deterministic != 1)
    return unsupported("attntune_options: deterministic must be 0 or 1 (got %d)", o.deterministic);
  if (o.head_dim_v < 0) return unsupported("attntune_options: head_dim_v must be 0 (head_dim) or positive (got %d)", o.head_dim_v);
  if (o.latent != 0 && o.latent != 1)
    return unsupported("attntune_options: latent must be 0 or 1 (got %d)", o.latent);
  if (o.latent && o.head_dim_v > a->head_dim)
    return unsupported("attntune_options: latent says V is K's first head_dim_v columns, and head_dim_v (%d) is over "
                       "head_dim (%d)", o.head_dim_v, a->head_dim);
  if (o.kv_dtype != ATTNTUNE_KV_DTYPE_Q && o.kv_dtype != ATTNTUNE_KV_FP8_E4M3)
    return unsupported("attntune_options: kv_dtype must be 0 (ATTNTUNE_KV_DTYPE_Q: the cache is q's dtype) or 1 "
                       "(ATTNTUNE_KV_FP8_E4M3: an FP8 e4m3 cache) (got %d)", o.kv_dtype);
  if (o.qkv_dtype != ATTNTUNE_QKV_16BIT && o.qkv_dtype != ATTNTUNE_QKV_FP8_E4M3)
    return unsupported("attntune_options: qkv_dtype must be 0 (ATTNTUNE_QKV_16BIT) or 1 (ATTNTUNE_QKV_FP8_E4M3: the FP8 "
                       "forward) (got %d)", o.qkv_dtype);
  const bool qkv_fp8 = o.qkv_dtype == ATTNTUNE_QKV_FP8_E4M3;
  if (qkv_fp8 && o.kv_dtype != ATTNTUNE_KV_DTYPE_Q)
    return unsupported("attntune_options: qkv_dtype 1 (the FP8 forward) makes k and v FP8 e4m3 already: leave kv_dtype 0");
  if (qkv_fp8 && a->entry != attntune_plan::kEntryDense)
    return unsupported("attntune_options: qkv_dtype 1 (the FP8 forward) is served by attntune_attention_forward_ex "
                       "only, over dense q, k and v");
  if (!qkv_fp8 && (o.q_descale || o.q_descale_stride[0] || o.q_descale_stride[1]))
    return unsupported("attntune_options: q_descale (and its strides) dequantises the FP8 forward's q, and qkv_dtype "
                       "is 0: set qkv_dtype 1 (ATTNTUNE_QKV_FP8_E4M3), or leave it NULL (strides 0)");
  if (reinterpret_cast<std::uintptr_t>(o.q_descale) % 4 != 0)
    return unsupported("attntune_options: q_descale must be a 4-byte aligned fp32 array (got %p)",
                       static_cast<const void*>(o.q_descale));
  for (int i = 0; i < 2; ++i)
    if (o.q_descale_stride[i] < 0 || o.q_descale_stride[i] > 2147483647LL)
      return unsupported("attntune_options: q_descale_stride {%lld, %lld}: {batch, head} in elements, 0 .. 2^31 - 1",
                         o.q_descale_stride[0], o.q_descale_stride[1]);
  const bool descale_strides = o.k_descale_stride[0] || o.k_descale_stride[1] || o.v_descale_stride[0] ||
                               o.v_descale_stride[1];
  if (o.kv_dtype != ATTNTUNE_KV_FP8_E4M3 && !qkv_fp8 && (o.k_descale || o.v_descale || descale_strides))
    return unsupported("attntune_options: k_descale and v_descale (and their strides) dequantise an FP8 cache, and "
                       "kv_dtype is 0 (a cache of q's dtype): set kv_dtype 1 (ATTNTUNE_KV_FP8_E4M3) for an FP8 cache, "
                       "or leave them NULL (strides 0)");
  if (reinterpret_cast<std::uintptr_t>(o.k_descale) % 4 != 0 || reinterpret_cast<std::uintptr_t>(o.v_descale) % 4 != 0)
    return unsupported("attntune_options: k_descale and v_descale must be 4-byte aligned fp32 arrays (got %p, %p)",
                       static_cast<const void*>(o.k_descale), static_cast<const void*>(o.v_descale));
  for (int i = 0; i < 2; ++i)
    if (o.k_descale_stride[i] < 0 || o.k_descale_stride[i] > 2147483647LL || o.v_descale_stride[i] < 0 ||
        o.v_descale_stride[i] > 2147483647LL)
      return unsupported("attntune_options: descale strides are {batch, head} in elements, 0 .. 2^31 - 1 "
                         "(k_descale_stride {%lld, %lld}, v_descale_stride {%lld, %lld})",
                         o.k_descale_stride[0], o.k_descale_stride[1], o.v_descale_stride[0], o.v_descale_stride[1]);
  a->head_dim_v = o.head_dim_v;
  if (latent) *latent = o.latent;
  a->kv_fp8 = o.kv_dtype == ATTNTUNE_KV_FP8_E4M3 ? 1 : 0;
  a->qkv_fp8 = qkv_fp8 ? 1 : 0;
  a->q_descale = o.q_descale;
  a->q_descale_stride[0] = o.q_descale_stride[0];
  a->q_descale_stride[1] = o.q_descale_stride[1];
  a->k_descale = o.k_descale;
  a->v_descale = o.v_descale;
  for (int i = 0; i < 2; ++i) {
    a->k_descale_stride[i] = o.k_descale_stride[i];
    a->v_descale_stride[i] = o.v_descale_stride[i];
  }
  a->window_left = o.window ? o.window_left : -1;
  a->window_right = o.window ? o.window_right : -1;
  a->softcap = o.softcap;
  a->sinks = o.sinks;
  // The backward's kernels read it (their launch plans); the forward's are deterministic whatever it says.
  a->deterministic =
      a->entry == attntune_plan::kEntryBackward || a->entry == attntune_plan::kEntryBackwardVarlen ? o.deterministic : 0;
  return 0;
}

// A real call whose options say latent (V is K's first head_dim_v columns, one buffer): v must be k,
// with k's strides. A caller that says so and passes another v has lost track of its cache: refused,
// never run as separate K and V. (NULL k and v, a call without keys, alias trivially.)
static int check_latent_option(const Call& a) {
  if (a.v != a.k)
    return unsupported("attntune_options.latent is 1 (V is K's first head_dim_v columns, one buffer), but v (%p) is "
                       "not k (%p): pass v = k with v_strides = k_strides, or latent 0 for separate K and V",
                       a.v, a.k);
  for (int i = 0; i < 3; ++i)
    if (a.v_stride[i] != a.k_stride[i])
      return unsupported("attntune_options.latent is 1 (V is K's first head_dim_v columns, one buffer), but "
                         "v_strides {%lld, %lld, %lld} are not k_strides {%lld, %lld, %lld}: pass k's strides as v's",
                         a.v_stride[0], a.v_stride[1], a.v_stride[2], a.k_stride[0], a.k_stride[1], a.k_stride[2]);
  return 0;
}

// A packed tensor's {row, head} strides (the varlen entry points' two) as a Call's {batch, head, row}:
// the batch dimension is the packing (cu_seqlens), its stride 0.
struct PackedStrides {
  long long s[3];
  explicit PackedStrides(const long long* row_head) : s{0, row_head[1], row_head[0]} {}
};

// What every packed call carries beside its tensors: the prefix sums and the packed rows.
static void set_packing(Call* a, const int* cu_seqlens_q, const int* cu_seqlens_k, long long total_q,
                        long long total_k) {
  a->cu_seqlens_q = cu_seqlens_q;
  a->cu_seqlens_k = cu_seqlens_k;
  a->total_q = total_q;
  a->total_k = total_k;
}

// Both varlen entry points: the rows of the packed tensors, or -1 when not given.
static int varlen(const void* q, const void* k, const void* v, void* out, float* lse, const int* cu_seqlens_q,
                  const int* cu_seqlens_k, int batch, long long total_q, long long total_k, int max_seqlen_q,
                  int max_seqlen_k, int heads_q, int heads_kv, int head_dim, const long long* q_strides,
                  const long long* k_strides, const long long* v_strides, const long long* o_strides,
                  float softmax_scale, int is_causal, const attntune_options* opts, cudaStream_t stream) {
  if (!q_strides || !k_strides || !v_strides || !o_strides)
    return unsupported("q_strides, k_strides, v_strides and o_strides must not be NULL (2 strides each)");
  Call a = make_call(attntune_plan::kEntryVarlen, q, k, v, out, lse, batch, heads_q, heads_kv, max_seqlen_q,
                     max_seqlen_k, head_dim, PackedStrides(q_strides).s, PackedStrides(k_strides).s,
                     PackedStrides(v_strides).s, PackedStrides(o_strides).s, softmax_scale, is_causal);
  set_packing(&a, cu_seqlens_q, cu_seqlens_k, total_q, total_k);
  int latent = 0;
  if (const int r = apply_options(&a, opts, &latent)) return r;
  if (latent)
    if (const int r = check_latent_option(a)) return r;
  return forward(a, stream);
}

// ---- the backward pass (attntune_attention_backward; docs/CONTRACT.md "The backward pass")

// What the backward entry points take of attntune_options: windows, soft-caps, sinks (the logits the
// forward took: a sink kernel reads the LSE, which holds them; the caller computes the sinks' own
// gradient, -sum_i exp(sink - lse_i) dout_i . out_i, as the attntune ops do) and `deterministic`
// (the call's Call::deterministic: a kernel whose plan refuses it is not chosen), each served by the
// kernels built for it. The other options have no backward kernel family yet, and are refused with
// the reason rather than run as plain attention.
static int check_backward_options(const Call& a, int latent) {
  const char* what = a.split_head_dim_v()                                 ? "head_dim_v (a value head dim other than head_dim)"
                     : latent                                               ? "latent (a latent cache)"
                     : a.kv_fp8 || a.k_descale || a.v_descale               ? "kv_dtype (an FP8 KV cache)"
                     : a.qkv_fp8 || a.q_descale                             ? "qkv_dtype (the FP8 forward)"
                                                                            : nullptr;
  if (!what) return 0;
  return unsupported("%s_ex: attntune_options.%s: the backward pass serves plain attention, sliding windows, soft-caps "
                     "and sinks for now; no kernel family computes these gradients yet (compute them with PyTorch: the "
                     "attntune ops fall back so)", entry_name(a.entry), what);
}

// A placeholder for a pointer the caller may leave NULL (a tensor without elements), which a launch
// plan asks to be set but no kernel of the call reads.
alignas(16) static unsigned char kNothing[16];

// The backward's checks once a kernel serves the call: heads, lengths, scale, pointers, alignment,
// strides of all eight tensors, the written gradients without overlaps and apart.
static int check_backward_tensors(const Call& a) {
  if ((a.heads_q > 0 || a.heads_kv > 0) && (a.heads_q <= 0 || a.heads_kv <= 0 || a.heads_q % a.heads_kv != 0))
    return unsupported("heads_q (%d) must be a positive multiple of heads_kv (%d)", a.heads_q, a.heads_kv);
  if (const int r = check_limits(a)) return r;
  if (a.batch == 0 || a.heads_q == 0) return 0;  // no gradient element: nothing to compute
  const bool has_q = a.seqlen_q > 0, has_k = a.seqlen_k > 0;
  if (has_q && (!a.q || !a.out || !a.lse || !a.dout || !a.dq))
    return unsupported("q, out, softmax_lse, dout and dq must not be NULL (they may be NULL only when seqlen_q is 0)");
  if (has_k && (!a.k || !a.v || !a.dk || !a.dv))
    return unsupported("k, v, dk and dv must not be NULL (they may be NULL only when seqlen_k is 0)");
  if (!aligned16(a.q) || !aligned16(a.k) || !aligned16(a.v) || !aligned16(a.out) || !aligned16(a.dout) ||
      !aligned16(a.dq) || !aligned16(a.dk) || !aligned16(a.dv))
    return unsupported("q, k, v, out, dout, dq, dk and dv must be 16-byte aligned (q=%p k=%p v=%p out=%p dout=%p "
                       "dq=%p dk=%p dv=%p)", a.q, a.k, a.v, a.out, a.dout, a.dq, a.dk, a.dv);
  if (reinterpret_cast<std::uintptr_t>(a.lse) % 4 != 0)
    return unsupported("softmax_lse must be 4-byte aligned (got %p)", static_cast<void*>(a.lse));
  const struct {
    const char* name;
    const long long* stride;
  } tensors[] = {{"q_strides", a.q_stride},   {"k_strides", a.k_stride},   {"v_strides", a.v_stride},
                 {"o_strides", a.o_stride},   {"do_strides", a.do_stride}, {"dq_strides", a.dq_stride},
                 {"dk_strides", a.dk_stride}, {"dv_strides", a.dv_stride}};
  for (const auto& t : tensors)
    if (const char* why = check_strides(t.stride, 2))
      return unsupported("%s {%lld, %lld, %lld}: %s", t.name, t.stride[0], t.stride[1], t.stride[2], why);
  // The gradients are written: none may have two positions sharing an element, nor share its start
  // with another (dq, dk and dv are three tensors). A packed batch's are one sequence of its rows.
  const bool packed = a.entry == attntune_plan::kEntryBackwardVarlen;
  const long long rows_q = packed ? a.total_q : a.seqlen_q, rows_k = packed ? a.total_k : a.seqlen_k;
  if (rows_q > 2147483647LL || rows_k > 2147483647LL)
    return unsupported("total_q (%lld) and total_k (%lld) must be at most 2^31 - 1", rows_q, rows_k);
  const struct {
    const char* name;
    const long long* stride;
    int heads, rows;
    const void* ptr;
  } written[] = {{"dq_strides", a.dq_stride, a.heads_q, static_cast<int>(rows_q), a.dq},
                 {"dk_strides", a.dk_stride, a.heads_kv, static_cast<int>(rows_k), a.dk},
                 {"dv_strides", a.dv_stride, a.heads_kv, static_cast<int>(rows_k), a.dv}};
  for (const auto& t : written)
    if (t.rows > 0 && out_overlaps(t.stride, packed ? 1 : a.batch, t.heads, t.rows, a.head_dim)) {
      if (packed)
        return unsupported("%s {row %lld, head %lld} make gradients overlap for heads=%d rows=%d head_dim=%d", t.name,
                           t.stride[2], t.stride[1], t.heads, t.rows, a.head_dim);
      return unsupported("%s {%lld, %lld, %lld} make gradients overlap for batch=%d heads=%d rows=%d head_dim=%d",
                         t.name, t.stride[0], t.stride[1], t.stride[2], a.batch, t.heads, t.rows, a.head_dim);
    }
  if ((has_q && has_k && (a.dq == a.dk || a.dq == a.dv)) || (has_k && a.dk == a.dv))
    return unsupported("dq, dk and dv must be three tensors (dq=%p dk=%p dv=%p)", a.dq, a.dk, a.dv);
  return 0;
}

static int backward(Call a, int latent, cudaStream_t stream) {
  if (const int r = check_backward_options(a, latent)) return r;
  // Sizes first: a zero-sized tensor may come with a NULL pointer.
  if (const int r = check_common(a)) return r;
  if (const int r = check_variants(&a)) return r;
  attntune_plan::Why refused;
  refused.text[0] = 0;
  if (!built_for(a)) return no_kernel(a, refused);
  if (const int r = check_backward_tensors(a)) return r;
  if (a.entry == attntune_plan::kEntryBackwardVarlen)
    if (const int r = check_packing(a)) return r;
  if (a.batch == 0 || a.heads_q == 0 || (a.seqlen_q == 0 && a.seqlen_k == 0)) return 0;  // no gradient element
  // An empty side's tensors may be NULL; the plan asks every pointer to be set and launches no
  // kernel that reads them (seqlen_q 0: dK = dV = 0 only; seqlen_k 0: dQ = 0 only).
  if (a.seqlen_q == 0) {
    if (!a.q) a.q = kNothing;
    if (!a.out) a.out = kNothing;
    if (!a.lse) a.lse = reinterpret_cast<float*>(kNothing);
    if (!a.dout) a.dout = kNothing;
    if (!a.dq) a.dq = kNothing;
  }
  if (a.seqlen_k == 0) {
    if (!a.k) a.k = kNothing;
    if (!a.v) a.v = kNothing;
    if (!a.dk) a.dk = kNothing;
    if (!a.dv) a.dv = kNothing;
  }
  const int index = select_kernel(a, &refused);
  if (index < 0) return no_kernel(a, refused);
  return run(a, index, stream);
}

// The backward call's arguments (beside the forward's, which make_call takes).
static void set_backward(Call* a, const void* dout, void* dq, void* dk, void* dv, const long long* do_strides,
                         const long long* dq_strides, const long long* dk_strides, const long long* dv_strides) {
  a->dout = dout;
  a->dq = dq;
  a->dk = dk;
  a->dv = dv;
  for (int i = 0; i < 3; ++i) {
    a->do_stride[i] = do_strides[i];
    a->dq_stride[i] = dq_strides[i];
    a->dk_stride[i] = dk_strides[i];
    a->dv_stride[i] = dv_strides[i];
  }
}

}  // namespace attntune_export

extern "C" {

// The extended entry points (defined below), which the contract's call with NULL options.
ATTNTUNE_API int attntune_attention_forward_ex(const void*, const void*, const void*, void*, float*, int, int, int, int,
                                               int, int, const long long*, const long long*, const long long*,
                                               const long long*, float, int, const attntune_options*, cudaStream_t);
ATTNTUNE_API int attntune_attention_forward_kvcache_ex(const void*, const void*, const void*, void*, float*, const int*,
                                                       const int*, int, int, int, int, int, int, int, int,
                                                       const long long*, const long long*, const long long*,
                                                       const long long*, float, int, const attntune_options*,
                                                       cudaStream_t);

// Returns 0 on success, ATTNTUNE_UNSUPPORTED (1000) when the arguments do not match what this file
// was compiled for (dtype, head_dim, causal, alignment), or a cudaError_t value.
ATTNTUNE_API int attntune_attention_forward(
    const void* q, const void* k, const void* v, void* out, float* lse, int batch, int heads_q, int heads_kv,
    int seqlen_q, int seqlen_k, int head_dim, const long long* q_strides, const long long* k_strides,
    const long long* v_strides, const long long* o_strides, float softmax_scale, int is_causal,
    cudaStream_t stream) {
  return attntune_attention_forward_ex(q, k, v, out, lse, batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim,
                                       q_strides, k_strides, v_strides, o_strides, softmax_scale, is_causal, nullptr,
                                       stream);
}

// attntune_attention_forward with options (attntune_options: sliding windows, soft-cap, sinks; NULL:
// plain attention): docs/CONTRACT.md.
ATTNTUNE_API int attntune_attention_forward_ex(
    const void* q, const void* k, const void* v, void* out, float* lse, int batch, int heads_q, int heads_kv,
    int seqlen_q, int seqlen_k, int head_dim, const long long* q_strides, const long long* k_strides,
    const long long* v_strides, const long long* o_strides, float softmax_scale, int is_causal,
    const attntune_options* opts, cudaStream_t stream) {
  using namespace attntune_export;
  if (!q_strides || !k_strides || !v_strides || !o_strides)
    return unsupported("q_strides, k_strides, v_strides and o_strides must not be NULL (3 strides each)");
  Call a = make_call(attntune_plan::kEntryDense, q, k, v, out, lse, batch, heads_q, heads_kv, seqlen_q, seqlen_k,
                     head_dim, q_strides, k_strides, v_strides, o_strides, softmax_scale, is_causal);
  int latent = 0;
  if (const int r = apply_options(&a, opts, &latent)) return r;
  if (latent)
    if (const int r = check_latent_option(a)) return r;
  return forward(a, stream);
}

// Attention over a KV cache, paged (block_table) or contiguous (block_table NULL), with
// per-sequence key counts (cache_seqlens, NULL: seqlen_k_max each): docs/CONTRACT.md.
ATTNTUNE_API int attntune_attention_forward_kvcache(
    const void* q, const void* k_cache, const void* v_cache, void* out, float* lse, const int* cache_seqlens,
    const int* block_table, int max_blocks_per_seq, int page_size, int batch, int heads_q, int heads_kv,
    int seqlen_q, int seqlen_k_max, int head_dim, const long long* q_strides, const long long* k_strides,
    const long long* v_strides, const long long* o_strides, float softmax_scale, int is_causal,
    cudaStream_t stream) {
  return attntune_attention_forward_kvcache_ex(q, k_cache, v_cache, out, lse, cache_seqlens, block_table,
                                               max_blocks_per_seq, page_size, batch, heads_q, heads_kv, seqlen_q,
                                               seqlen_k_max, head_dim, q_strides, k_strides, v_strides, o_strides,
                                               softmax_scale, is_causal, nullptr, stream);
}

// attntune_attention_forward_kvcache with options (attntune_options; NULL: plain attention).
ATTNTUNE_API int attntune_attention_forward_kvcache_ex(
    const void* q, const void* k_cache, const void* v_cache, void* out, float* lse, const int* cache_seqlens,
    const int* block_table, int max_blocks_per_seq, int page_size, int batch, int heads_q, int heads_kv,
    int seqlen_q, int seqlen_k_max, int head_dim, const long long* q_strides, const long long* k_strides,
    const long long* v_strides, const long long* o_strides, float softmax_scale, int is_causal,
    const attntune_options* opts, cudaStream_t stream) {
  using namespace attntune_export;
  if (!q_strides || !k_strides || !v_strides || !o_strides)
    return unsupported("q_strides, k_strides, v_strides and o_strides must not be NULL (3 strides each)");
  Call a = make_call(attntune_plan::kEntryKvcache, q, k_cache, v_cache, out, lse, batch, heads_q, heads_kv, seqlen_q,
                     seqlen_k_max, head_dim, q_strides, k_strides, v_strides, o_strides, softmax_scale, is_causal);
  a.cache_seqlens = cache_seqlens;
  a.block_table = block_table;
  a.max_blocks_per_seq = max_blocks_per_seq;
  a.page_size = page_size;
  int latent = 0;
  if (const int r = apply_options(&a, opts, &latent)) return r;
  if (latent)
    if (const int r = check_latent_option(a)) return r;
  return forward(a, stream);
}

// Added to the contract's varlen entry point: the same call with the rows of the packed q/out
// (total_q = cu_seqlens_q[batch]) and k/v (total_k = cu_seqlens_k[batch]), which the caller knows
// from its tensors' shapes and the library cannot read without a sync. Kernels that read through
// TMA tensor maps (flash_fwd_wgmma) need them. total_q 0: every sequence is empty, nothing to
// compute. (The contract's entry point passes them as not given, and only the others serve it.)
ATTNTUNE_API int attntune_attention_forward_varlen_packed(
    const void* q, const void* k, const void* v, void* out, float* lse, const int* cu_seqlens_q,
    const int* cu_seqlens_k, int batch, long long total_q, long long total_k, int max_seqlen_q, int max_seqlen_k,
    int heads_q, int heads_kv, int head_dim, const long long* q_strides, const long long* k_strides,
    const long long* v_strides, const long long* o_strides, float softmax_scale, int is_causal,
    cudaStream_t stream) {
  using namespace attntune_export;
  if (total_q < 0 || total_k < 0)
    return unsupported("total_q (%lld) and total_k (%lld) must not be negative", total_q, total_k);
  return varlen(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, batch, total_q, total_k, max_seqlen_q, max_seqlen_k,
                heads_q, heads_kv, head_dim, q_strides, k_strides, v_strides, o_strides, softmax_scale, is_causal,
                nullptr, stream);
}

// attntune_attention_forward_varlen_packed with options (attntune_options; NULL: plain attention).
// total_q and total_k may be -1 (not given) as in attntune_attention_forward_varlen, for kernels
// that do not read through TMA tensor maps.
ATTNTUNE_API int attntune_attention_forward_varlen_ex(
    const void* q, const void* k, const void* v, void* out, float* lse, const int* cu_seqlens_q,
    const int* cu_seqlens_k, int batch, long long total_q, long long total_k, int max_seqlen_q, int max_seqlen_k,
    int heads_q, int heads_kv, int head_dim, const long long* q_strides, const long long* k_strides,
    const long long* v_strides, const long long* o_strides, float softmax_scale, int is_causal,
    const attntune_options* opts, cudaStream_t stream) {
  using namespace attntune_export;
  if (total_q < -1 || total_k < -1)
    return unsupported("total_q (%lld) and total_k (%lld) must be -1 (not given) or the packed rows", total_q,
                       total_k);
  return varlen(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, batch, total_q, total_k, max_seqlen_q, max_seqlen_k,
                heads_q, heads_kv, head_dim, q_strides, k_strides, v_strides, o_strides, softmax_scale, is_causal,
                opts, stream);
}

// Variable-length packed batches: docs/CONTRACT.md. Served by the kernels of families that
// implement it; a file without one answers ATTNTUNE_UNSUPPORTED, saying so.
ATTNTUNE_API int attntune_attention_forward_varlen(
    const void* q, const void* k, const void* v, void* out, float* lse, const int* cu_seqlens_q,
    const int* cu_seqlens_k, int batch, int max_seqlen_q, int max_seqlen_k, int heads_q, int heads_kv, int head_dim,
    const long long* q_strides, const long long* k_strides, const long long* v_strides, const long long* o_strides,
    float softmax_scale, int is_causal, cudaStream_t stream) {
  return attntune_export::varlen(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, batch, -1, -1, max_seqlen_q,
                                 max_seqlen_k, heads_q, heads_kv, head_dim, q_strides, k_strides, v_strides, o_strides,
                                 softmax_scale, is_causal, nullptr, stream);
}

// The backward pass of attntune_attention_forward (docs/CONTRACT.md "The backward pass"): dQ, dK
// and dV from the forward's inputs, its output `out` and its softmax_lse (read), and dout. Defined
// below with its options; the same returns.
ATTNTUNE_API int attntune_attention_backward_ex(
    const void* q, const void* k, const void* v, const void* out, const float* softmax_lse, const void* dout,
    void* dq, void* dk, void* dv, int batch, int heads_q, int heads_kv, int seqlen_q, int seqlen_k, int head_dim,
    const long long* q_strides, const long long* k_strides, const long long* v_strides, const long long* o_strides,
    const long long* do_strides, const long long* dq_strides, const long long* dk_strides,
    const long long* dv_strides, float softmax_scale, int is_causal, const attntune_options* opts,
    cudaStream_t stream);

ATTNTUNE_API int attntune_attention_backward(
    const void* q, const void* k, const void* v, const void* out, const float* softmax_lse, const void* dout,
    void* dq, void* dk, void* dv, int batch, int heads_q, int heads_kv, int seqlen_q, int seqlen_k, int head_dim,
    const long long* q_strides, const long long* k_strides, const long long* v_strides, const long long* o_strides,
    const long long* do_strides, const long long* dq_strides, const long long* dk_strides,
    const long long* dv_strides, float softmax_scale, int is_causal, cudaStream_t stream) {
  return attntune_attention_backward_ex(q, k, v, out, softmax_lse, dout, dq, dk, dv, batch, heads_q, heads_kv,
                                        seqlen_q, seqlen_k, head_dim, q_strides, k_strides, v_strides, o_strides,
                                        do_strides, dq_strides, dk_strides, dv_strides, softmax_scale, is_causal,
                                        nullptr, stream);
}

// attntune_attention_backward with options (attntune_options: a sliding window, a soft-cap, sinks,
// deterministic gradients; the other options are refused with the reason for now; NULL: plain
// attention, gradients that may differ in the last bits run to run).
ATTNTUNE_API int attntune_attention_backward_ex(
    const void* q, const void* k, const void* v, const void* out, const float* softmax_lse, const void* dout,
    void* dq, void* dk, void* dv, int batch, int heads_q, int heads_kv, int seqlen_q, int seqlen_k, int head_dim,
    const long long* q_strides, const long long* k_strides, const long long* v_strides, const long long* o_strides,
    const long long* do_strides, const long long* dq_strides, const long long* dk_strides,
    const long long* dv_strides, float softmax_scale, int is_causal, const attntune_options* opts,
    cudaStream_t stream) {
  using namespace attntune_export;
  if (!q_strides || !k_strides || !v_strides || !o_strides || !do_strides || !dq_strides || !dk_strides || !dv_strides)
    return unsupported("q_strides, k_strides, v_strides, o_strides, do_strides, dq_strides, dk_strides and dv_strides "
                       "must not be NULL (3 strides each)");
  // out and softmax_lse are read only; the call's fields are the forward's (non-const) pointers.
  Call a = make_call(attntune_plan::kEntryBackward, q, k, v, const_cast<void*>(out), const_cast<float*>(softmax_lse),
                     batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, q_strides, k_strides, v_strides,
                     o_strides, softmax_scale, is_causal);
  set_backward(&a, dout, dq, dk, dv, do_strides, dq_strides, dk_strides, dv_strides);
  int latent = 0;
  if (const int r = apply_options(&a, opts, &latent)) return r;
  return backward(a, latent, stream);
}

// The backward pass of attntune_attention_forward_varlen (docs/CONTRACT.md "The backward pass of a
// packed batch"): dQ, dK and dV of packed q [total_q, heads_q, head_dim], k and v [total_k, heads_kv,
// head_dim], from the forward's output `out` and its softmax_lse ([heads_q, total_q] fp32, as the
// varlen forward writes it; read) and dout (out's shape). Strides {row, head} in elements, two each
// (the last dim contiguous), as the varlen forward takes them; total_q and total_k the packed rows
// (cu_seqlens_q[batch] and cu_seqlens_k[batch], which the caller knows from its tensors' shapes),
// max_seqlen_q and max_seqlen_k the longest sequence's. Causal is bottom-right per sequence. The
// same returns, checks and workspaces as attntune_attention_backward; backward kernels built for
// packed batches serve it alone.
ATTNTUNE_API int attntune_attention_backward_varlen_ex(
    const void* q, const void* k, const void* v, const void* out, const float* softmax_lse, const void* dout,
    void* dq, void* dk, void* dv, const int* cu_seqlens_q, const int* cu_seqlens_k, int batch, long long total_q,
    long long total_k, int max_seqlen_q, int max_seqlen_k, int heads_q, int heads_kv, int head_dim,
    const long long* q_strides, const long long* k_strides, const long long* v_strides, const long long* o_strides,
    const long long* do_strides, const long long* dq_strides, const long long* dk_strides,
    const long long* dv_strides, float softmax_scale, int is_causal, const attntune_options* opts,
    cudaStream_t stream) {
  using namespace attntune_export;
  if (!q_strides || !k_strides || !v_strides || !o_strides || !do_strides || !dq_strides || !dk_strides || !dv_strides)
    return unsupported("q_strides, k_strides, v_strides, o_strides, do_strides, dq_strides, dk_strides and dv_strides "
                       "must not be NULL (2 strides each: {row, head})");
  if (total_q < 0 || total_k < 0)
    return unsupported("total_q (%lld) and total_k (%lld) must not be negative: the packed rows (cu_seqlens_q[batch], "
                       "cu_seqlens_k[batch])", total_q, total_k);
  Call a = make_call(attntune_plan::kEntryBackwardVarlen, q, k, v, const_cast<void*>(out),
                     const_cast<float*>(softmax_lse), batch, heads_q, heads_kv, max_seqlen_q, max_seqlen_k, head_dim,
                     PackedStrides(q_strides).s, PackedStrides(k_strides).s, PackedStrides(v_strides).s,
                     PackedStrides(o_strides).s, softmax_scale, is_causal);
  set_backward(&a, dout, dq, dk, dv, PackedStrides(do_strides).s, PackedStrides(dq_strides).s,
               PackedStrides(dk_strides).s, PackedStrides(dv_strides).s);
  set_packing(&a, cu_seqlens_q, cu_seqlens_k, total_q, total_k);
  int latent = 0;
  if (const int r = apply_options(&a, opts, &latent)) return r;
  return backward(a, latent, stream);
}

ATTNTUNE_API int attntune_attention_backward_varlen(
    const void* q, const void* k, const void* v, const void* out, const float* softmax_lse, const void* dout,
    void* dq, void* dk, void* dv, const int* cu_seqlens_q, const int* cu_seqlens_k, int batch, long long total_q,
    long long total_k, int max_seqlen_q, int max_seqlen_k, int heads_q, int heads_kv, int head_dim,
    const long long* q_strides, const long long* k_strides, const long long* v_strides, const long long* o_strides,
    const long long* do_strides, const long long* dq_strides, const long long* dk_strides,
    const long long* dv_strides, float softmax_scale, int is_causal, cudaStream_t stream) {
  return attntune_attention_backward_varlen_ex(q, k, v, out, softmax_lse, dout, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                                               batch, total_q, total_k, max_seqlen_q, max_seqlen_k, heads_q, heads_kv,
                                               head_dim, q_strides, k_strides, v_strides, o_strides, do_strides,
                                               dq_strides, dk_strides, dv_strides, softmax_scale, is_causal, nullptr,
                                               stream);
}

// The variants kernel `index` was built with (it serves calls with exactly these), into
// variants[3]: {window, softcap, sinks}, each 0 or 1. 0, or -1 for an index out of range.
ATTNTUNE_API int attntune_kernel_variants(int index, int* variants) {
  using namespace attntune_export;
  if (index < 0 || index >= kKernelCount || !variants) return -1;
  variants[0] = kKernels[index].window;
  variants[1] = kKernels[index].softcap;
  variants[2] = kKernels[index].sinks;
  return 0;
}

// JSON: how this file was made (template, config, problem, GPU, arch, measured time, campaign, date).
ATTNTUNE_API const char* attntune_kernel_info(void) { return attntune_export::kInfo; }

// The reason for the last nonzero return of an entry point on this thread.
ATTNTUNE_API const char* attntune_last_error(void) { return attntune_export::g_error; }

// Added for the PyTorch ops (templates/torch/): the same choice for any entry point (1:
// attntune_attention_forward, 2: _kvcache, 4: _varlen, 8: attntune_attention_backward), -1 if none of
// this file's kernels serves it.
ATTNTUNE_API int attntune_select_kernel_ex(int entry, int head_dim, int is_causal, int batch, int heads_q,
                                           int heads_kv, int seqlen_q, int seqlen_k, const attntune_options* opts);
ATTNTUNE_API int attntune_select_kernel_entry(int entry, int head_dim, int is_causal, int batch, int heads_q,
                                              int heads_kv, int seqlen_q, int seqlen_k) {
  return attntune_select_kernel_ex(entry, head_dim, is_causal, batch, heads_q, heads_kv, seqlen_q, seqlen_k, nullptr);
}

// The same choice for a call with options (attntune_options: the variants, the value head dim, the
// cache dtype; NULL: plain attention over a cache of q's dtype): -1 if none of this file's kernels
// serves it (or the options are not valid). kv_dtype 1 weighs the FP8-cache kernels only (the
// strides the sizes make count the cache's one-byte elements), 0 never them. The sizes describe
// separate K and V (NULL pointers: a latent kernel's plan refuses them), unless the options say
// latent: then k and v are one (fake, never read) cache with K's strides for V, as the real call
// will pass them, so latent kernels are weighed beside those over separate K and V (which read V
// through the aliasing pointer and serve the call too). Entry 8 (the backward pass) sizes a call whose
// eight tensors are contiguous [B, H, S, D] (fake, never read), weighing the backward kernels only; its
// options are the backward's (a window, deterministic; the others answer -1). Entry 16 (the backward
// of a packed batch) the same over packed tensors of `batch` sequences of seqlen_q rows, as entry 4.
ATTNTUNE_API int attntune_select_kernel_ex(int entry, int head_dim, int is_causal, int batch, int heads_q,
                                           int heads_kv, int seqlen_q, int seqlen_k, const attntune_options* opts) {
  if (is_causal != 0 && is_causal != 1) return -1;
  if (entry != attntune_plan::kEntryDense && entry != attntune_plan::kEntryKvcache &&
      entry != attntune_plan::kEntryVarlen && entry != attntune_plan::kEntryBackward &&
      entry != attntune_plan::kEntryBackwardVarlen)
    return -1;
  if (batch < 0 || heads_q < 0 || heads_kv < 0 || seqlen_q < 0 || seqlen_k < 0 || head_dim <= 0) return -1;
  // The call these sizes make, on contiguous [B, H, S, D] tensors (kvcache: a contiguous cache).
  const long long q_str[3] = {static_cast<long long>(heads_q) * seqlen_q * head_dim,
                              static_cast<long long>(seqlen_q) * head_dim, head_dim},
                  kv_str[3] = {static_cast<long long>(heads_kv) * seqlen_k * head_dim,
                               static_cast<long long>(seqlen_k) * head_dim, head_dim};
  // Varlen: a packed batch of `batch` sequences of seqlen_q rows ({0, head, row} strides), its rows
  // given (as the PyTorch op gives them).
  const long long packed_q[3] = {0, head_dim, static_cast<long long>(heads_q) * head_dim},
                  packed_kv[3] = {0, head_dim, static_cast<long long>(heads_kv) * head_dim};
  const bool packed = entry == attntune_plan::kEntryVarlen || entry == attntune_plan::kEntryBackwardVarlen;
  const bool backward = entry == attntune_plan::kEntryBackward || entry == attntune_plan::kEntryBackwardVarlen;
  attntune_plan::Call a = attntune_export::make_call(
      entry, nullptr, nullptr, nullptr, nullptr, nullptr, batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim,
      packed ? packed_q : q_str, packed ? packed_kv : kv_str, packed ? packed_kv : kv_str, packed ? packed_q : q_str,
      1.0f, is_causal);
  static const int kPrefixSums[1] = {0};  // stands in for cu_seqlens: a plan never reads them
  if (packed)
    attntune_export::set_packing(&a, kPrefixSums, kPrefixSums, static_cast<long long>(batch) * seqlen_q,
                                 static_cast<long long>(batch) * seqlen_k);
  int latent = 0;
  if (attntune_export::apply_options(&a, opts, &latent)) return -1;
  if (backward) {
    // The backward's own tensors on the same contiguous (or packed) layouts (fake, never read: a plan
    // only asks that they be set), and its options' refusals.
    if (attntune_export::check_backward_options(a, latent)) return -1;
    void* any = attntune_export::kNothing;
    a.q = a.k = a.v = any;
    a.out = any;
    a.lse = static_cast<float*>(any);
    attntune_export::set_backward(&a, any, any, any, any, packed ? packed_q : q_str, packed ? packed_q : q_str,
                                  packed ? packed_kv : kv_str, packed ? packed_kv : kv_str);
  }
  if (latent) {
    alignas(16) static const unsigned char kCache[16] = {0};  // stands in for the cache: a plan never reads it
    a.k = a.v = kCache;
    for (int i = 0; i < 3; ++i) a.v_stride[i] = a.k_stride[i];
  }
  attntune_plan::Why why;
  if (attntune_plan::normalise_variants(&a, &why)) return -1;
  return attntune_export::select_kernel(a, nullptr);
}

// Added to the contract's three: the index in attntune_kernel_info()'s "kernels" of the kernel a
// call of attntune_attention_forward with these sizes (on contiguous tensors) would run, or -1 if
// none of this file's kernels serves them.
ATTNTUNE_API int attntune_select_kernel(int head_dim, int is_causal, int batch, int heads_q, int heads_kv,
                                        int seqlen_q, int seqlen_k) {
  return attntune_select_kernel_entry(attntune_plan::kEntryDense, head_dim, is_causal, batch, heads_q, heads_kv,
                                      seqlen_q, seqlen_k);
}

// What kernel `index` was built and tuned for, into problem[9]: {batch, heads_q, heads_kv, seqlen_q,
// seqlen_k, head_dim, is_causal, is_bf16, entry points (the bits above)}; and its label. 0, or -1 for
// an index out of range.
ATTNTUNE_API int attntune_kernel_problem(int index, int* problem, const char** label) {
  using namespace attntune_export;
  if (index < 0 || index >= kKernelCount || !problem) return -1;
  const Kernel& k = kKernels[index];
  const int p[9] = {k.tuned_b, k.tuned_h, k.tuned_hkv, k.tuned_s, k.tuned_sk,
                    k.head_dim, k.causal, k.bf16, k.entries};
  for (int i = 0; i < 9; ++i) problem[i] = p[i];
  if (label) *label = k.label;
  return 0;
}

}  // extern "C"

#endif  // !defined(__CUDA_ARCH__)

#if defined(__GNUC__)
#pragma GCC visibility pop  // pushed by the prologue
#endif
