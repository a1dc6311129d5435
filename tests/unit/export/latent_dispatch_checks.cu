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
//   refuses: WHY             the latent kernel's plan on the separate call
// (A .cu, so that tests/unit's glob of *.cpp leaves it out of attntune_tests.)
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
  if (latent >= 0) {
    why.text[0] = 0;
    const bool ok = attntune_export::accepts(latent, decode_call(false, false), &why);
    std::printf("refuses: %s\n", ok ? "(accepted)" : why.text);
  }
  return 0;
}

#endif  // !__CUDA_ARCH__
