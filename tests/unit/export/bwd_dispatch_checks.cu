// Which kernel an exported all-best library of forward and backward kernels runs for each entry point,
// and what attntune_attention_backward(_ex) and _varlen(_ex) refuse, asked on the host with no GPU:
// tests/unit/export/test_export_bwd.cpp compiles this with the exported file included (nvcc -include
// FILE.cu, PTX only), so that the dispatcher (attntune_export::select_kernel, which plans each
// candidate dry), the kernel table and attntune_options are the file's own. The file holds flash_fwd_mma
// and flash_bwd_mma kernels (test_export_bwd.cpp's Fixture). Prints one line each:
//   NAME -> INDEX               the kernel select_kernel (calls) or attntune_select_kernel_ex (sizes) names
//   NAME: RC WHY                an entry point's refusal (before any CUDA call)
//   NAME: 0                     an entry point with nothing to compute
//   NAME: past the checks       a valid call that reached the CUDA runtime (no GPU: a cudaError_t)
// With a GPU present the calls that would launch on fake pointers are skipped, saying so.
// (A .cu, so that tests/unit's glob of *.cpp leaves it out of attntune_tests.)
#include <cstddef>
#include <cstdio>
#include <cstring>

#if !defined(__CUDA_ARCH__)

namespace {

const long long kBase = 1ll << 32;

// A backward call at fake device addresses, [B, H, S, D] contiguous tensors.
struct Bwd {
  const void *q, *k, *v, *out, *dout;
  const float* lse;
  void *dq, *dk, *dv;
  int b, h, hkv, s, sk, d, causal;
  float scale;
  long long qs[3], ks[3], vs[3], os[3], dos[3], dqs[3], dks[3], dvs[3];
};

Bwd bwd_call(int b, int h, int hkv, int s, int sk, int d, int causal) {
  Bwd c;
  std::memset(&c, 0, sizeof c);
  c.q = reinterpret_cast<const void*>(kBase);
  c.k = reinterpret_cast<const void*>(kBase + (1ll << 28));
  c.v = reinterpret_cast<const void*>(kBase + (2ll << 28));
  c.out = reinterpret_cast<const void*>(kBase + (3ll << 28));
  c.lse = reinterpret_cast<const float*>(kBase + (4ll << 28));
  c.dout = reinterpret_cast<const void*>(kBase + (5ll << 28));
  c.dq = reinterpret_cast<void*>(kBase + (6ll << 28));
  c.dk = reinterpret_cast<void*>(kBase + (7ll << 28));
  c.dv = reinterpret_cast<void*>(kBase + (8ll << 28));
  c.b = b, c.h = h, c.hkv = hkv, c.s = s, c.sk = sk, c.d = d, c.causal = causal;
  c.scale = 0.088f;
  const long long q[3] = {1ll * h * s * d, 1ll * s * d, d}, kv[3] = {1ll * hkv * sk * d, 1ll * sk * d, d};
  for (int i = 0; i < 3; ++i) {
    c.qs[i] = c.os[i] = c.dos[i] = c.dqs[i] = q[i];
    c.ks[i] = c.vs[i] = c.dks[i] = c.dvs[i] = kv[i];
  }
  return c;
}

int backward(const Bwd& c, const attntune_options* o) {
  return attntune_attention_backward_ex(c.q, c.k, c.v, c.out, c.lse, c.dout, c.dq, c.dk, c.dv, c.b, c.h, c.hkv, c.s,
                                        c.sk, c.d, c.qs, c.ks, c.vs, c.os, c.dos, c.dqs, c.dks, c.dvs, c.scale,
                                        c.causal, o, nullptr);
}

// The same tensors packed ([total, heads, d], 2 strides {row, head}) for
// attntune_attention_backward_varlen(_ex): `b` sequences of up to s rows (sk keys), total_q and
// total_k rows, prefix sums at fake device addresses.
int backward_varlen(const Bwd& c, long long total_q, long long total_k, const attntune_options* o,
                    const int* cu_q = reinterpret_cast<const int*>(kBase + (9ll << 28)),
                    const int* cu_k = reinterpret_cast<const int*>(kBase + (10ll << 28)), long long dk_row = -1) {
  const long long q2[2] = {1ll * c.h * c.d, c.d}, kv2[2] = {1ll * c.hkv * c.d, c.d},
                  dk2[2] = {dk_row < 0 ? 1ll * c.hkv * c.d : dk_row, c.d};
  return attntune_attention_backward_varlen_ex(c.q, c.k, c.v, c.out, c.lse, c.dout, c.dq, c.dk, c.dv, cu_q, cu_k, c.b,
                                               total_q, total_k, c.s, c.sk, c.h, c.hkv, c.d, q2, kv2, kv2, q2, q2, q2,
                                               dk2, kv2, c.scale, c.causal, o, nullptr);
}

attntune_options options() {
  attntune_options o;
  std::memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.window_left = o.window_right = -1;
  return o;
}

attntune_options window(int left) {
  attntune_options o = options();
  o.window = 1;
  o.window_left = left;
  o.window_right = 0;
  return o;
}

// The dispatcher's choice for a call of `entry` (1 forward, 8 backward) with these sizes.
int chosen(int entry, int b, int h, int hkv, int s, int sk, int d, int causal, int window_left = -1,
           int deterministic = 0) {
  attntune_plan::Call c = attntune_plan::empty_call();
  c.entry = entry;
  const Bwd t = bwd_call(b, h, hkv, s, sk, d, causal);
  c.q = t.q, c.k = t.k, c.v = t.v, c.out = const_cast<void*>(t.out), c.lse = const_cast<float*>(t.lse);
  c.batch = b, c.heads_q = h, c.heads_kv = hkv, c.seqlen_q = s, c.seqlen_k = sk, c.head_dim = d, c.causal = causal;
  c.scale = t.scale;
  for (int i = 0; i < 3; ++i) c.q_stride[i] = t.qs[i], c.k_stride[i] = t.ks[i], c.v_stride[i] = t.vs[i], c.o_stride[i] = t.os[i];
  if (window_left >= 0) c.window_left = window_left, c.window_right = -1;
  c.deterministic = deterministic;
  if (entry == attntune_plan::kEntryBackward || entry == attntune_plan::kEntryBackwardVarlen) {
    c.dout = t.dout, c.dq = t.dq, c.dk = t.dk, c.dv = t.dv;
    for (int i = 0; i < 3; ++i)
      c.do_stride[i] = t.dos[i], c.dq_stride[i] = t.dqs[i], c.dk_stride[i] = t.dks[i], c.dv_stride[i] = t.dvs[i];
  }
  if (entry == attntune_plan::kEntryBackwardVarlen) {  // packed: strides {0, head, row}, b * s rows
    const long long q3[3] = {0, d, 1ll * h * d}, kv3[3] = {0, d, 1ll * hkv * d};
    for (int i = 0; i < 3; ++i) {
      c.q_stride[i] = c.o_stride[i] = c.do_stride[i] = c.dq_stride[i] = q3[i];
      c.k_stride[i] = c.v_stride[i] = c.dk_stride[i] = c.dv_stride[i] = kv3[i];
    }
    c.cu_seqlens_q = reinterpret_cast<const int*>(kBase + (9ll << 28));
    c.cu_seqlens_k = reinterpret_cast<const int*>(kBase + (10ll << 28));
    c.total_q = 1ll * b * s;
    c.total_k = 1ll * b * sk;
  }
  attntune_plan::Why why;
  return attntune_export::select_kernel(c, &why);
}

void refusal(const char* what, int rc) { std::printf("%s: %d %s\n", what, rc, attntune_last_error()); }

void reached(const char* what, int rc) {
  if (rc != 0 && rc != ATTNTUNE_UNSUPPORTED) std::printf("%s: past the checks\n", what);
  else std::printf("%s: returned %d (%s), expected a CUDA error\n", what, rc, attntune_last_error());
}

}  // namespace

int main() {
  // Calls (select_kernel, what every entry point runs): each entry point its own kernels.
  std::printf("fwd_d128_causal -> %d\n", chosen(1, 2, 8, 2, 1024, 1024, 128, 1));
  std::printf("bwd_d128_causal -> %d\n", chosen(8, 2, 8, 2, 1024, 1024, 128, 1));
  std::printf("bwd_d128_causal_long -> %d\n", chosen(8, 1, 16, 16, 8192, 8192, 128, 1));
  std::printf("bwd_d128_full -> %d\n", chosen(8, 2, 8, 2, 1024, 1024, 128, 0));
  std::printf("bwd_d64_window -> %d\n", chosen(8, 1, 8, 8, 2048, 2048, 64, 1, 255));
  std::printf("bwd_d64_no_window -> %d\n", chosen(8, 1, 8, 8, 2048, 2048, 64, 1));
  // A packed batch's backward runs the varlen backward kernel, and a dense one never it.
  std::printf("bwd_varlen_d128_causal -> %d\n", chosen(16, 4, 8, 2, 1024, 1024, 128, 1));
  std::printf("bwd_varlen_d128_full -> %d\n", chosen(16, 4, 8, 2, 1024, 1024, 128, 0));
  std::printf("bwd_varlen_d128_causal_deterministic -> %d\n", chosen(16, 4, 8, 2, 1024, 1024, 128, 1, -1, 1));
  std::printf("fwd_d64_window -> %d\n", chosen(1, 1, 8, 8, 2048, 2048, 64, 1, 255));
  // Deterministic backward calls: flash_bwd_mma's plans serve them (their semaphore workspace).
  std::printf("bwd_d128_causal_deterministic -> %d\n", chosen(8, 2, 8, 2, 1024, 1024, 128, 1, -1, 1));
  std::printf("bwd_d64_window_deterministic -> %d\n", chosen(8, 1, 8, 8, 2048, 2048, 64, 1, 255, 1));

  // Sizes only.
  std::printf("sizes_bwd -> %d\n", attntune_select_kernel_ex(8, 128, 1, 2, 8, 2, 1000, 1000, nullptr));
  std::printf("sizes_bwd_entry -> %d\n", attntune_select_kernel_entry(8, 128, 1, 2, 8, 2, 1000, 1000));
  std::printf("sizes_fwd -> %d\n", attntune_select_kernel_ex(1, 128, 1, 2, 8, 2, 1000, 1000, nullptr));
  attntune_options o = window(300);
  std::printf("sizes_bwd_window -> %d\n", attntune_select_kernel_ex(8, 64, 1, 1, 8, 8, 2048, 2048, &o));
  o = options();
  o.softcap = 30.0f;
  std::printf("sizes_bwd_softcap -> %d\n", attntune_select_kernel_ex(8, 128, 1, 2, 8, 2, 1000, 1000, &o));
  o = options();
  o.head_dim_v = 64;
  std::printf("sizes_bwd_dv -> %d\n", attntune_select_kernel_ex(8, 128, 1, 2, 8, 2, 1000, 1000, &o));
  std::printf("sizes_bwd_d96 -> %d\n", attntune_select_kernel_ex(8, 96, 1, 2, 8, 2, 1000, 1000, nullptr));
  std::printf("sizes_entry_16 -> %d\n", attntune_select_kernel_ex(16, 128, 1, 2, 8, 2, 1000, 1000, nullptr));
  std::printf("sizes_entry_16_full -> %d\n", attntune_select_kernel_ex(16, 128, 0, 2, 8, 2, 1000, 1000, nullptr));
  std::printf("sizes_entry_32 -> %d\n", attntune_select_kernel_ex(32, 128, 1, 2, 8, 2, 1000, 1000, nullptr));
  // attntune_options.deterministic: the backward's kernels serve it, the forward's take it (they are
  // deterministic already); another value than 0 and 1 answers -1.
  o = options();
  o.deterministic = 1;
  std::printf("sizes_bwd_deterministic -> %d\n", attntune_select_kernel_ex(8, 128, 1, 2, 8, 2, 1000, 1000, &o));
  std::printf("sizes_fwd_deterministic -> %d\n", attntune_select_kernel_ex(1, 128, 1, 2, 8, 2, 1000, 1000, &o));
  o = window(300);
  o.deterministic = 1;
  std::printf("sizes_bwd_window_deterministic -> %d\n", attntune_select_kernel_ex(8, 64, 1, 1, 8, 8, 2048, 2048, &o));
  o = options();
  o.deterministic = 2;
  std::printf("sizes_bwd_deterministic_2 -> %d\n", attntune_select_kernel_ex(8, 128, 1, 2, 8, 2, 1000, 1000, &o));
  // A caller compiled before `deterministic` (its size ends before it): the bytes past it are not its
  // own, never read (the call is the default, not deterministic).
  o = options();
  o.deterministic = 7;
  o.size = offsetof(attntune_options, deterministic);
  std::printf("sizes_bwd_before_deterministic -> %d\n", attntune_select_kernel_ex(8, 128, 1, 2, 8, 2, 1000, 1000, &o));

  // Refusals, before any CUDA call.
  const Bwd ok = bwd_call(2, 8, 2, 1000, 1000, 128, 1);
  Bwd c = ok;
  refusal("null_strides", attntune_attention_backward(c.q, c.k, c.v, c.out, c.lse, c.dout, c.dq, c.dk, c.dv, c.b, c.h,
                                                      c.hkv, c.s, c.sk, c.d, c.qs, c.ks, c.vs, c.os, nullptr, c.dqs,
                                                      c.dks, c.dvs, c.scale, c.causal, nullptr));
  c = ok, c.s = -1;
  refusal("negative_size", backward(c, nullptr));
  c = ok, c.causal = 2;
  refusal("causal_2", backward(c, nullptr));
  c = ok, c.d = 64;
  refusal("no_kernel_d64", backward(c, nullptr));
  c = ok, c.causal = 0, c.d = 64;
  refusal("no_kernel_d64_full", backward(c, nullptr));
  c = ok, c.h = 7;
  refusal("heads", backward(c, nullptr));
  c = ok, c.scale = 0.f;
  refusal("scale", backward(c, nullptr));
  c = ok, c.dout = nullptr;
  refusal("null_dout", backward(c, nullptr));
  c = ok, c.dk = nullptr;
  refusal("null_dk", backward(c, nullptr));
  c = ok, c.dq = reinterpret_cast<void*>(kBase + (6ll << 28) + 8);
  refusal("misaligned_dq", backward(c, nullptr));
  c = ok, c.lse = reinterpret_cast<const float*>(kBase + (4ll << 28) + 2);
  refusal("misaligned_lse", backward(c, nullptr));
  c = ok, c.dos[2] = 132;
  refusal("do_stride_132", backward(c, nullptr));
  c = ok, c.dks[1] = 64;  // rows of 128 elements 64 apart: two rows share elements
  refusal("dk_overlaps", backward(c, nullptr));
  c = ok, c.dv = c.dk;
  refusal("dv_is_dk", backward(c, nullptr));
  o = options();
  o.softcap = 30.0f;
  refusal("opt_softcap", backward(ok, &o));
  alignas(16) static float sinks[8];
  o = options();
  o.sinks = sinks;
  refusal("opt_sinks", backward(ok, &o));
  o = options();
  o.head_dim_v = 64;
  refusal("opt_head_dim_v", backward(ok, &o));
  o = options();
  o.latent = 1;
  refusal("opt_latent", backward(ok, &o));
  o = options();
  o.kv_dtype = ATTNTUNE_KV_FP8_E4M3;
  refusal("opt_kv_dtype", backward(ok, &o));
  o = window(255);
  c = bwd_call(1, 8, 8, 2048, 2048, 128, 1);
  refusal("window_no_kernel", backward(c, &o));
  o = options();
  o.deterministic = 2;
  refusal("opt_deterministic_2", backward(ok, &o));
  {  // A newer caller's option past this file's struct, set: refused, never ignored.
    struct Newer {
      attntune_options o;
      int later;
    } n;
    std::memset(&n, 0, sizeof n);
    n.o = options();
    n.o.size = sizeof n;
    n.o.deterministic = 1;
    n.later = 1;
    refusal("opt_newer_than_deterministic", backward(ok, &n.o));
  }
  // attntune_attention_backward_varlen's own refusals, before any CUDA call.
  const Bwd vl = bwd_call(4, 8, 2, 1024, 1024, 128, 1);
  {
    const long long q2[2] = {1ll * vl.h * vl.d, vl.d};
    refusal("varlen_null_strides",
            attntune_attention_backward_varlen(vl.q, vl.k, vl.v, vl.out, vl.lse, vl.dout, vl.dq, vl.dk, vl.dv,
                                               reinterpret_cast<const int*>(kBase + (9ll << 28)),
                                               reinterpret_cast<const int*>(kBase + (10ll << 28)), vl.b, 3000, 3000,
                                               vl.s, vl.sk, vl.h, vl.hkv, vl.d, q2, q2, q2, q2, q2, q2, nullptr, q2,
                                               vl.scale, vl.causal, nullptr));
  }
  refusal("varlen_negative_total", backward_varlen(vl, -1, 3000, nullptr));
  refusal("varlen_null_cu", backward_varlen(vl, 3000, 3000, nullptr, nullptr));
  refusal("varlen_misaligned_cu",
          backward_varlen(vl, 3000, 3000, nullptr, reinterpret_cast<const int*>(kBase + (9ll << 28) + 2)));
  refusal("varlen_dk_overlaps", backward_varlen(vl, 3000, 3000, nullptr, reinterpret_cast<const int*>(kBase + (9ll << 28)),
                                                reinterpret_cast<const int*>(kBase + (10ll << 28)), 64));
  {
    Bwd c64 = bwd_call(4, 8, 2, 1024, 1024, 64, 1);
    refusal("varlen_no_kernel_d64", backward_varlen(c64, 3000, 3000, nullptr));
  }
  o = options();
  o.head_dim_v = 64;
  refusal("varlen_opt_head_dim_v", backward_varlen(vl, 3000, 3000, &o));

  // The forward's entry point never runs a backward kernel: a d=64 windowed forward has none here.
  {
    o = window(255);
    const Bwd f = bwd_call(1, 8, 8, 2048, 2048, 64, 1);
    refusal("fwd_window_d64", attntune_attention_forward_ex(f.q, f.k, f.v, const_cast<void*>(f.out), nullptr, f.b,
                                                            f.h, f.hkv, f.s, f.sk, f.d, f.qs, f.ks, f.vs, f.os,
                                                            f.scale, f.causal, &o, nullptr));
  }

  // Nothing to compute: 0 before any CUDA call, NULL pointers welcome.
  c = ok, c.b = 0, c.q = c.k = c.v = c.out = c.dout = nullptr, c.lse = nullptr, c.dq = c.dk = c.dv = nullptr;
  std::printf("batch_0: %d\n", backward(c, nullptr));
  c = ok, c.s = 0, c.sk = 0, c.q = c.k = c.v = c.out = c.dout = nullptr, c.lse = nullptr, c.dq = c.dk = c.dv = nullptr;
  std::printf("lengths_0: %d\n", backward(c, nullptr));

  // Calls past every check reach the CUDA runtime (no GPU here: a cudaError_t, never 1000).
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) {
    std::printf("a GPU is present: the calls on fake pointers are skipped\n");
    return 0;
  }
  cudaGetLastError();
  reached("valid", backward(ok, nullptr));
  o = window(255);
  reached("valid_window", backward(bwd_call(1, 8, 8, 2048, 2048, 64, 1), &o));
  o = options();
  o.deterministic = 1;
  reached("valid_deterministic", backward(ok, &o));
  o = window(255);
  o.deterministic = 1;
  reached("valid_window_deterministic", backward(bwd_call(1, 8, 8, 2048, 2048, 64, 1), &o));
  c = ok, c.sk = 0, c.k = c.v = nullptr, c.dk = c.dv = nullptr;  // dQ = 0 only: k, v, dk, dv may be NULL
  reached("no_keys", backward(c, nullptr));
  c = ok, c.s = 0, c.q = c.out = c.dout = nullptr, c.lse = nullptr, c.dq = nullptr;  // dK = dV = 0 only
  reached("no_queries", backward(c, nullptr));
  c = ok;
  for (int i = 0; i < 3; ++i) {  // [B, S, H, D] views: strides {S*H*D, D, H*D}
    c.qs[0] = c.os[0] = c.dos[0] = c.dqs[0] = 1ll * c.s * c.h * c.d;
    c.qs[1] = c.os[1] = c.dos[1] = c.dqs[1] = c.d;
    c.qs[2] = c.os[2] = c.dos[2] = c.dqs[2] = 1ll * c.h * c.d;
  }
  reached("bshd", backward(c, nullptr));
  reached("varlen_valid", backward_varlen(vl, 3000, 3100, nullptr));
  o = options();
  o.deterministic = 1;
  reached("varlen_valid_deterministic", backward_varlen(vl, 3000, 3100, &o));
  reached("varlen_no_queries", backward_varlen(vl, 0, 3100, nullptr));
  return 0;
}

#endif  // !__CUDA_ARCH__
