// Which kernel an exported all-best library runs for MLA decode calls over a latent cache (v = k) and
// over separate K and V, asked on the host with no GPU: tests/unit/export/test_export_latent.cpp
// compiles this with the exported file included (nvcc -include FILE.cu), so that the dispatcher
// (attntune_export::select_kernel, which plans each candidate dry) and the kernel table are the
// file's own. The calls are dense decode steps of 16 sequences, 16 query heads and one KV head at
// head dims 192 / 128, at fake device addresses (a dry plan never reads them). Prints one line each:
//   latent INDEX             the table's latent kernel
//   alias -> INDEX           v = k with k's strides
//   separate -> INDEX        v another buffer of rows of 128
//   alias_strides -> INDEX   v = k through strides of rows of 128
//   sizes -> INDEX           attntune_select_kernel_ex (sizes only: separate K and V)
//   sizes_latent -> INDEX    the same with attntune_options.latent = 1 (one cache: latent kernels weighed)
//   sizes_latent_far -> INDEX  latent = 1 at lengths nearest the build over separate K and V (it serves it)
//   sizes_old_options -> INDEX  latent = 1 in a struct whose size ends before `latent` (a caller before it)
//   refuses: WHY             the latent kernel's plan on the separate call
//   ex_separate: RC WHY      attntune_attention_forward_ex with latent = 1 and another v (refused before any
//                            CUDA call)
//   ex_strides: RC WHY       ... with v = k but v's own strides
//   kvcache_ex_separate: RC WHY  attntune_attention_forward_kvcache_ex with latent = 1 and another v_cache
// (A .cu, so that tests/unit's glob of *.cpp leaves it out of attntune_tests.)
#include <cstddef>
#include <cstdio>
#include <cstring>

#if !defined(__CUDA_ARCH__)

namespace {

attntune_plan::Call decode_call(bool alias, bool k_strides) {
  const int b = 16, h = 16, hkv = 1, sk = 4096, d = 192, dv = 128;
  const long long base = 1ll << 32;
  attntune_plan::Call c = attntune_plan::empty_call();
  c.entry = attntune_plan::kEntryDense;
  c.q = reinterpret_cast<const void*>(base);
  c.k = reinterpret_cast<const void*>(base + (1ll << 28));
  c.v = alias ? c.k : reinterpret_cast<const void*>(base + (2ll << 28));
  c.out = reinterpret_cast<void*>(base + (3ll << 28));
  c.batch = b, c.heads_q = h, c.heads_kv = hkv, c.seqlen_q = 1, c.seqlen_k = sk, c.head_dim = d, c.head_dim_v = dv;
  const long long q[3] = {1ll * h * d, d, d}, k[3] = {1ll * hkv * sk * d, 1ll * sk * d, d},
                  v[3] = {1ll * hkv * sk * dv, 1ll * sk * dv, dv}, o[3] = {1ll * h * dv, dv, dv};
  for (int i = 0; i < 3; ++i) {
    c.q_stride[i] = q[i];
    c.k_stride[i] = k[i];
    c.v_stride[i] = k_strides ? k[i] : v[i];
    c.o_stride[i] = o[i];
  }
  c.scale = 0.07f;
  return c;
}

}  // namespace

int main() {
  int latent = -1;
  for (int i = 0; i < attntune_export::kKernelCount; ++i)
    if (attntune_export::kKernels[i].latent) latent = i;
  std::printf("latent %d\n", latent);
  attntune_plan::Why why;
  std::printf("alias -> %d\n", attntune_export::select_kernel(decode_call(true, true), &why));
  std::printf("separate -> %d\n", attntune_export::select_kernel(decode_call(false, false), &why));
  std::printf("alias_strides -> %d\n", attntune_export::select_kernel(decode_call(true, false), &why));
  attntune_options o;
  std::memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.window_left = o.window_right = -1;
  o.head_dim_v = 128;
  std::printf("sizes -> %d\n", attntune_select_kernel_ex(1, 192, 0, 16, 16, 1, 1, 4096, &o));
  o.latent = 1;
  std::printf("sizes_latent -> %d\n", attntune_select_kernel_ex(1, 192, 0, 16, 16, 1, 1, 4096, &o));
  std::printf("sizes_latent_far -> %d\n", attntune_select_kernel_ex(1, 192, 0, 16, 16, 1, 1, 16384, &o));
  attntune_options old = o;
  old.size = offsetof(attntune_options, latent);  // the bytes past it are not the caller's: ignored
  std::printf("sizes_old_options -> %d\n", attntune_select_kernel_ex(1, 192, 0, 16, 16, 1, 1, 4096, &old));
  // Real calls that say latent and do not alias: refused with the reason, before any CUDA call (no
  // GPU here).
  {
    const attntune_plan::Call c = decode_call(false, false);
    const int r = attntune_attention_forward_ex(c.q, c.k, c.v, c.out, nullptr, c.batch, c.heads_q, c.heads_kv,
                                                c.seqlen_q, c.seqlen_k, c.head_dim, c.q_stride, c.k_stride,
                                                c.v_stride, c.o_stride, c.scale, 0, &o, nullptr);
    std::printf("ex_separate: %d %s\n", r, attntune_last_error());
    const attntune_plan::Call a = decode_call(true, false);
    const int s = attntune_attention_forward_ex(a.q, a.k, a.v, a.out, nullptr, a.batch, a.heads_q, a.heads_kv,
                                                a.seqlen_q, a.seqlen_k, a.head_dim, a.q_stride, a.k_stride,
                                                a.v_stride, a.o_stride, a.scale, 0, &o, nullptr);
    std::printf("ex_strides: %d %s\n", s, attntune_last_error());
    const int t = attntune_attention_forward_kvcache_ex(c.q, c.k, c.v, c.out, nullptr, nullptr, nullptr, 0, 0,
                                                        c.batch, c.heads_q, c.heads_kv, c.seqlen_q, c.seqlen_k,
                                                        c.head_dim, c.q_stride, c.k_stride, c.v_stride, c.o_stride,
                                                        c.scale, 0, &o, nullptr);
    std::printf("kvcache_ex_separate: %d %s\n", t, attntune_last_error());
  }
  if (latent >= 0) {
    why.text[0] = 0;
    const bool ok = attntune_export::accepts(latent, decode_call(false, false), &why);
    std::printf("refuses: %s\n", ok ? "(accepted)" : why.text);
  }
  return 0;
}

#endif  // !__CUDA_ARCH__
