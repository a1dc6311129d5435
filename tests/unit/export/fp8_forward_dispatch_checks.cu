// Which kernel an exported all-best library runs for FP8-forward calls (q, k, v e4m3, v transposed,
// attntune_options.qkv_dtype 1) and for 16-bit ones, and what its extended entry points refuse, asked
// on the host with no GPU: tests/unit/export/test_export_fp8_forward.cpp compiles this with the
// exported file included (nvcc -include FILE.cu). The file holds a flash_fwd_wgmma FP8-forward kernel
// (tuned at s=16384) and a bf16 one (s=4096), both d=128, non-causal, 16 heads. The calls are at fake
// device addresses (a dry plan never reads them). Prints one line each:
//   fp8 INDEX                   the table's FP8-forward kernel (the last, where there are several)
//   NAME -> INDEX               the kernel select_kernel (calls) or attntune_select_kernel_ex (sizes) names
//   plain_refuses: WHY          the 16-bit kernel's plan on an FP8 call
//   fp8_refuses: WHY            the FP8 kernel's plan on a 16-bit call
//   NAME: RC WHY                an extended entry point's refusal (before any CUDA call)
// (A .cu, so that tests/unit's glob of *.cpp leaves it out of attntune_tests.)
#include <cstddef>
#include <cstdio>
#include <cstring>

#if !defined(__CUDA_ARCH__)

namespace {

const long long kBase = 1ll << 32;
alignas(16) const float kScales[64] = {0};  // never read: a dry plan or a refusal

// A dense call: b=1, h=16, d=128, [B,H,S,D]; FP8: q, k bytes, v transposed ([b, h, d, sk_pad], keys
// contiguous), out bf16.
attntune_plan::Call dense_call(bool fp8, int seqlen) {
  const int b = 1, h = 16, d = 128;
  attntune_plan::Call c = attntune_plan::empty_call();
  c.entry = attntune_plan::kEntryDense;
  c.q = reinterpret_cast<const void*>(kBase);
  c.k = reinterpret_cast<const void*>(kBase + (1ll << 30));
  c.v = reinterpret_cast<const void*>(kBase + (2ll << 30));
  c.out = reinterpret_cast<void*>(kBase + (3ll << 30));
  c.batch = b, c.heads_q = h, c.heads_kv = h, c.seqlen_q = seqlen, c.seqlen_k = seqlen, c.head_dim = d;
  const long long rows[3] = {1ll * h * seqlen * d, 1ll * seqlen * d, d};
  const long long pad = (seqlen + 15) / 16 * 16, vt[3] = {1ll * h * d * pad, 1ll * d * pad, pad};
  for (int i = 0; i < 3; ++i) {
    c.q_stride[i] = c.k_stride[i] = c.o_stride[i] = rows[i];
    c.v_stride[i] = fp8 ? vt[i] : rows[i];
  }
  c.scale = 0.088f;
  c.qkv_fp8 = fp8 ? 1 : 0;
  if (fp8) {
    c.q_descale = c.k_descale = c.v_descale = kScales;
    c.q_descale_stride[0] = c.k_descale_stride[0] = c.v_descale_stride[0] = h;
    c.q_descale_stride[1] = c.k_descale_stride[1] = c.v_descale_stride[1] = 1;
  }
  return c;
}

attntune_options fp8_options() {
  attntune_options o;
  std::memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.window_left = o.window_right = -1;
  o.qkv_dtype = ATTNTUNE_QKV_FP8_E4M3;
  o.q_descale = o.k_descale = o.v_descale = kScales;
  o.q_descale_stride[0] = o.k_descale_stride[0] = o.v_descale_stride[0] = 16;
  o.q_descale_stride[1] = o.k_descale_stride[1] = o.v_descale_stride[1] = 1;
  return o;
}

// The dense extended entry point with `c`'s tensors and options `o`.
int forward_ex(const attntune_plan::Call& c, const attntune_options* o) {
  return attntune_attention_forward_ex(c.q, c.k, c.v, c.out, nullptr, c.batch, c.heads_q, c.heads_kv, c.seqlen_q,
                                       c.seqlen_k, c.head_dim, c.q_stride, c.k_stride, c.v_stride, c.o_stride, c.scale,
                                       0, o, nullptr);
}

void refusal(const char* what, int rc) { std::printf("%s: %d %s\n", what, rc, attntune_last_error()); }

}  // namespace

int main() {
  int fp8 = -1, plain = -1;
  for (int i = 0; i < attntune_export::kKernelCount; ++i)
    (attntune_export::kKernels[i].qkv_fp8 ? fp8 : plain) = i;
  std::printf("fp8 %d\n", fp8);
  attntune_plan::Why why;
  std::printf("fp8_near -> %d\n", attntune_export::select_kernel(dense_call(true, 16384), &why));
  std::printf("fp8_far -> %d\n", attntune_export::select_kernel(dense_call(true, 4096), &why));
  // A key count that is not a multiple of 4: a k_perm kernel refuses it, its companion serves it.
  std::printf("fp8_ragged -> %d\n", attntune_export::select_kernel(dense_call(true, 16383), &why));
  std::printf("bf16_near_fp8 -> %d\n", attntune_export::select_kernel(dense_call(false, 16384), &why));
  std::printf("bf16_far -> %d\n", attntune_export::select_kernel(dense_call(false, 4096), &why));

  // Sizes only (entry 1: the dense entry point).
  attntune_options o = fp8_options();
  std::printf("sizes_fp8 -> %d\n", attntune_select_kernel_ex(1, 128, 0, 1, 16, 16, 4096, 4096, &o));
  std::printf("sizes_null -> %d\n", attntune_select_kernel_ex(1, 128, 0, 1, 16, 16, 16384, 16384, nullptr));
  attntune_options old = o;
  old.size = offsetof(attntune_options, qkv_dtype);  // a caller before qkv_dtype
  old.q_descale = old.k_descale = old.v_descale = nullptr;
  std::memset(old.k_descale_stride, 0, sizeof old.k_descale_stride);
  std::memset(old.v_descale_stride, 0, sizeof old.v_descale_stride);
  std::printf("sizes_old_options -> %d\n", attntune_select_kernel_ex(1, 128, 0, 1, 16, 16, 16384, 16384, &old));

  // The plans of each kernel on the other dtype.
  why.text[0] = 0;
  if (plain >= 0)
    std::printf("plain_refuses: %s\n",
                attntune_export::accepts(plain, dense_call(true, 16384), &why) ? "(accepted)" : why.text);
  why.text[0] = 0;
  if (fp8 >= 0)
    std::printf("fp8_refuses: %s\n",
                attntune_export::accepts(fp8, dense_call(false, 4096), &why) ? "(accepted)" : why.text);

  // The options' and strides' refusals, through the real entry point (before any CUDA call).
  const attntune_plan::Call c = dense_call(true, 4096);
  {
    attntune_options x = fp8_options();
    x.qkv_dtype = 2;
    refusal("qkv_dtype_2", forward_ex(c, &x));
  }
  {
    attntune_options x = fp8_options();
    x.kv_dtype = ATTNTUNE_KV_FP8_E4M3;
    refusal("qkv_and_kv_dtype", forward_ex(c, &x));
  }
  {
    attntune_options x = fp8_options();
    x.qkv_dtype = ATTNTUNE_QKV_16BIT;
    x.k_descale = x.v_descale = nullptr;
    std::memset(x.k_descale_stride, 0, sizeof x.k_descale_stride);
    std::memset(x.v_descale_stride, 0, sizeof x.v_descale_stride);
    refusal("q_descale_16bit", forward_ex(c, &x));
  }
  {
    attntune_options x = fp8_options();
    x.q_descale = reinterpret_cast<const float*>(reinterpret_cast<const char*>(kScales) + 2);
    refusal("q_descale_misaligned", forward_ex(c, &x));
  }
  {
    attntune_options x = fp8_options();
    x.q_descale_stride[1] = -1;
    refusal("q_descale_stride_negative", forward_ex(c, &x));
  }
  {
    attntune_plan::Call d = c;
    d.q_stride[2] = 136;  // rows of 136 bytes: not a multiple of 16
    attntune_options x = fp8_options();
    refusal("q_stride_odd", forward_ex(d, &x));
  }
  {
    attntune_options x = fp8_options();
    const attntune_plan::Call k = dense_call(true, 4096);
    const int cache_seqlens_dummy = 0;
    (void)cache_seqlens_dummy;
    refusal("qkv_on_kvcache",
            attntune_attention_forward_kvcache_ex(k.q, k.k, k.v, k.out, nullptr, nullptr, nullptr, 0, 0, k.batch,
                                                  k.heads_q, k.heads_kv, k.seqlen_q, k.seqlen_k, k.head_dim,
                                                  k.q_stride, k.k_stride, k.v_stride, k.o_stride, k.scale, 0, &x,
                                                  nullptr));
  }
  {
    // A d=64 FP8 call: no kernel of the file serves it, and the message says dtype=fp8.
    attntune_plan::Call d = dense_call(true, 4096);
    d.head_dim = 64;
    attntune_options x = fp8_options();
    refusal("no_fp8_kernel_d64", forward_ex(d, &x));
  }
  return 0;
}

#endif
