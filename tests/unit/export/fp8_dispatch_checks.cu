// Which kernel an exported all-best library runs for calls over an FP8 cache and over a 16-bit one, and
// what its extended entry points refuse, asked on the host with no GPU: tests/unit/export/test_export_fp8.cpp
// compiles this with the exported file included (nvcc -include FILE.cu), so that the dispatcher
// (attntune_export::select_kernel, which plans each candidate dry), the kernel table and
// attntune_options are the file's own. The file holds a flash_decode kernel over an FP8 cache (tuned
// at sk=2048) and one over a bf16 cache (sk=8192), both d=128, 32 query heads over 8 KV heads, pages of
// 16. The calls are decode steps of 16 sequences at fake device addresses (a dry plan never reads
// them). Prints one line each:
//   fp8 INDEX                   the table's FP8 kernel
//   NAME -> INDEX               the kernel select_kernel (calls) or attntune_select_kernel_ex (sizes) names
//   plain_refuses: WHY          the 16-bit kernel's plan on an FP8 call
//   fp8_refuses: WHY            the FP8 kernel's plan on a 16-bit call
//   NAME: RC WHY                an extended entry point's refusal (before any CUDA call)
//   NAME: past the checks       a valid call that reached the CUDA runtime (no GPU: a cudaError_t)
// With a GPU present the calls that would launch on fake pointers are skipped, saying so.
// (A .cu, so that tests/unit's glob of *.cpp leaves it out of attntune_tests.)
#include <cstddef>
#include <cstdio>
#include <cstring>

#if !defined(__CUDA_ARCH__)

namespace {

const long long kBase = 1ll << 32;
alignas(16) const float kScales[256] = {0};  // never read: a dry plan or a refusal

// A paged decode step: b=16, h=32, hkv=8, s=1, d=128, pages of 16 rows ([num_blocks, 16, 8, 128]);
// the cache's strides count its elements (bytes for FP8: the same numbers here).
attntune_plan::Call decode_call(bool fp8, int seqlen_k, int entry = attntune_plan::kEntryKvcache) {
  const int b = 16, h = 32, hkv = 8, d = 128, page = 16;
  attntune_plan::Call c = attntune_plan::empty_call();
  c.entry = entry;
  c.q = reinterpret_cast<const void*>(kBase);
  c.k = reinterpret_cast<const void*>(kBase + (1ll << 28));
  c.v = reinterpret_cast<const void*>(kBase + (2ll << 28));
  c.out = reinterpret_cast<void*>(kBase + (3ll << 28));
  c.batch = b, c.heads_q = h, c.heads_kv = hkv, c.seqlen_q = 1, c.seqlen_k = seqlen_k, c.head_dim = d;
  const long long q[3] = {1ll * h * d, d, 1ll * h * d}, o[3] = {1ll * h * d, d, 1ll * h * d};
  const long long paged[3] = {1ll * page * hkv * d, d, 1ll * hkv * d},
                  dense[3] = {1ll * hkv * seqlen_k * d, 1ll * seqlen_k * d, d};
  const bool kv = entry == attntune_plan::kEntryKvcache;
  for (int i = 0; i < 3; ++i) {
    c.q_stride[i] = q[i];
    c.k_stride[i] = c.v_stride[i] = kv ? paged[i] : dense[i];
    c.o_stride[i] = o[i];
  }
  if (kv) {
    c.block_table = reinterpret_cast<const int*>(kBase + (4ll << 28));
    c.cache_seqlens = reinterpret_cast<const int*>(kBase + (5ll << 28));
    c.page_size = page;
    c.max_blocks_per_seq = (seqlen_k + page - 1) / page;
  }
  c.scale = 0.088f;
  c.kv_fp8 = fp8 ? 1 : 0;
  if (fp8) {
    c.k_descale = c.v_descale = kScales;
    c.k_descale_stride[0] = c.v_descale_stride[0] = hkv;
    c.k_descale_stride[1] = c.v_descale_stride[1] = 1;
  }
  return c;
}

attntune_options fp8_options() {
  attntune_options o;
  std::memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.window_left = o.window_right = -1;
  o.kv_dtype = ATTNTUNE_KV_FP8_E4M3;
  o.k_descale = o.v_descale = kScales;
  o.k_descale_stride[0] = o.v_descale_stride[0] = 8;
  o.k_descale_stride[1] = o.v_descale_stride[1] = 1;
  return o;
}

// The kvcache entry point with `c`'s tensors and options `o`.
int kvcache_ex(const attntune_plan::Call& c, const attntune_options* o) {
  return attntune_attention_forward_kvcache_ex(c.q, c.k, c.v, c.out, nullptr, c.cache_seqlens, c.block_table,
                                               c.max_blocks_per_seq, c.page_size, c.batch, c.heads_q, c.heads_kv,
                                               c.seqlen_q, c.seqlen_k, c.head_dim, c.q_stride, c.k_stride, c.v_stride,
                                               c.o_stride, c.scale, 0, o, nullptr);
}

void refusal(const char* what, int rc) { std::printf("%s: %d %s\n", what, rc, attntune_last_error()); }

void reached(const char* what, int rc) {
  if (rc != 0 && rc != ATTNTUNE_UNSUPPORTED) std::printf("%s: past the checks\n", what);
  else std::printf("%s: returned %d (%s), expected a CUDA error\n", what, rc, attntune_last_error());
}

}  // namespace

int main() {
  int fp8 = -1, plain = -1;
  for (int i = 0; i < attntune_export::kKernelCount; ++i)
    (attntune_export::kKernels[i].kv_fp8 ? fp8 : plain) = i;
  std::printf("fp8 %d\n", fp8);
  attntune_plan::Why why;
  std::printf("fp8_near -> %d\n", attntune_export::select_kernel(decode_call(true, 2048), &why));
  std::printf("fp8_far -> %d\n", attntune_export::select_kernel(decode_call(true, 8192), &why));
  std::printf("bf16_near_fp8 -> %d\n", attntune_export::select_kernel(decode_call(false, 2048), &why));
  std::printf("bf16_far -> %d\n", attntune_export::select_kernel(decode_call(false, 8192), &why));
  std::printf("fp8_dense -> %d\n",
              attntune_export::select_kernel(decode_call(true, 2048, attntune_plan::kEntryDense), &why));

  // Sizes only.
  attntune_options o = fp8_options();
  std::printf("sizes_fp8 -> %d\n", attntune_select_kernel_ex(2, 128, 0, 16, 32, 8, 1, 8192, &o));
  std::printf("sizes_fp8_dense -> %d\n", attntune_select_kernel_ex(1, 128, 0, 16, 32, 8, 1, 8192, &o));
  std::printf("sizes_fp8_varlen -> %d\n", attntune_select_kernel_ex(4, 128, 0, 16, 32, 8, 1, 8192, &o));
  attntune_options plain_o;
  std::memset(&plain_o, 0, sizeof plain_o);
  plain_o.size = sizeof plain_o;
  plain_o.window_left = plain_o.window_right = -1;
  std::printf("sizes_bf16 -> %d\n", attntune_select_kernel_ex(2, 128, 0, 16, 32, 8, 1, 2048, &plain_o));
  std::printf("sizes_null -> %d\n", attntune_select_kernel_ex(2, 128, 0, 16, 32, 8, 1, 2048, nullptr));
  attntune_options old = o;
  old.size = offsetof(attntune_options, kv_dtype);  // a caller before kv_dtype: the bytes past it are not its own
  old.k_descale = old.v_descale = nullptr;
  std::printf("sizes_old_options -> %d\n", attntune_select_kernel_ex(2, 128, 0, 16, 32, 8, 1, 2048, &old));
  std::printf("sizes_entry -> %d\n", attntune_select_kernel_entry(2, 128, 0, 16, 32, 8, 1, 2048));
  attntune_options bad = o;
  bad.kv_dtype = 2;
  std::printf("sizes_bad_kv_dtype -> %d\n", attntune_select_kernel_ex(2, 128, 0, 16, 32, 8, 1, 2048, &bad));

  // The plans of each kernel on the other cache dtype.
  why.text[0] = 0;
  if (plain >= 0)
    std::printf("plain_refuses: %s\n",
                attntune_export::accepts(plain, decode_call(true, 8192), &why) ? "(accepted)" : why.text);
  why.text[0] = 0;
  if (fp8 >= 0)
    std::printf("fp8_refuses: %s\n",
                attntune_export::accepts(fp8, decode_call(false, 2048), &why) ? "(accepted)" : why.text);

  // The options' and strides' refusals, through the real entry point (before any CUDA call).
  const attntune_plan::Call c = decode_call(true, 2048);
  {
    attntune_options x = fp8_options();
    x.kv_dtype = 2;
    refusal("kv_dtype_2", kvcache_ex(c, &x));
  }
  {
    attntune_options x = fp8_options();
    x.v_descale = reinterpret_cast<const float*>(reinterpret_cast<const char*>(kScales) + 2);
    refusal("descale_misaligned", kvcache_ex(c, &x));
  }
  {
    attntune_options x = fp8_options();
    x.k_descale_stride[0] = -1;
    refusal("descale_stride_negative", kvcache_ex(c, &x));
  }
  {
    attntune_options x = fp8_options();
    x.v_descale_stride[0] = 2147483648LL;
    refusal("descale_stride_2p31", kvcache_ex(c, &x));
  }
  {
    attntune_options x = fp8_options();
    x.kv_dtype = ATTNTUNE_KV_DTYPE_Q;
    x.k_descale_stride[0] = x.k_descale_stride[1] = x.v_descale_stride[0] = x.v_descale_stride[1] = 0;
    x.v_descale = nullptr;
    refusal("descales_without_fp8", kvcache_ex(c, &x));
  }
  {
    attntune_options x = fp8_options();
    x.kv_dtype = ATTNTUNE_KV_DTYPE_Q;
    x.k_descale = x.v_descale = nullptr;
    refusal("descale_strides_without_fp8", kvcache_ex(c, &x));
  }
  attntune_plan::Call odd = c;
  odd.k_stride[1] = 136;  // 8 elements of 16 bits are 16 bytes; 136 FP8 bytes are not whole 16-byte chunks
  {
    attntune_options x = fp8_options();
    refusal("fp8_stride_8_bytes", kvcache_ex(odd, &x));
  }
  {
    attntune_options x = fp8_options();
    attntune_plan::Call d64 = c;
    d64.head_dim = 64;
    refusal("fp8_no_kernel", kvcache_ex(d64, &x));
  }
  {
    attntune_options x = fp8_options();
    const long long st[2] = {1024, 128};
    static const int cu[17] = {0};
    refusal("fp8_varlen", attntune_attention_forward_varlen_ex(c.q, c.k, c.v, c.out, nullptr, cu, cu, 16, 16, 16, 1, 1,
                                                               32, 8, 128, st, st, st, st, 0.088f, 0, &x, nullptr));
  }

  // Valid calls reach the CUDA runtime; on a GPU they would launch on fake pointers: skipped.
  int gpus = 0;
  const bool gpu = cudaGetDeviceCount(&gpus) == cudaSuccess && gpus > 0;
  cudaGetLastError();
  if (gpu) {
    std::printf("a GPU is present: the checks that would launch on fake pointers are skipped\n");
  } else {
    attntune_options x = fp8_options();
    reached("fp8_valid", kvcache_ex(c, &x));
    x.k_descale_stride[0] = x.k_descale_stride[1] = x.v_descale_stride[0] = x.v_descale_stride[1] = 0;
    reached("fp8_per_tensor", kvcache_ex(c, &x));
    attntune_plan::Call wide = decode_call(false, 8192);
    wide.k_stride[1] = 136;
    reached("bf16_stride_8_elements", kvcache_ex(wide, nullptr));
  }
  return 0;
}

#endif  // !__CUDA_ARCH__
