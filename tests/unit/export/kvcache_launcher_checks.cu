// Host-side checks of an exported file's serving entry points, linked with a flash_decode export
// (d=128, non-causal) by nvcc. No GPU needed: every refusal below is answered before a CUDA call;
// the valid calls get past every check to the CUDA runtime, which (without a GPU) answers a
// cudaError_t, never ATTNTUNE_UNSUPPORTED. Prints one line per failed check and
// "checks: N failed" last; exits 1 if any failed.
// (A .cu, so that tests/unit's glob of *.cpp leaves it out of attntune_tests.)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

extern "C" {
int attntune_attention_forward_kvcache(const void* q, const void* k_cache, const void* v_cache, void* out, float* lse,
                                       const int* cache_seqlens, const int* block_table, int max_blocks_per_seq,
                                       int page_size, int batch, int heads_q, int heads_kv, int seqlen_q,
                                       int seqlen_k_max, int head_dim, const long long* q_strides,
                                       const long long* k_strides, const long long* v_strides,
                                       const long long* o_strides, float softmax_scale, int is_causal,
                                       cudaStream_t stream);
int attntune_attention_forward_varlen(const void* q, const void* k, const void* v, void* out, float* lse,
                                      const int* cu_seqlens_q, const int* cu_seqlens_k, int batch, int max_seqlen_q,
                                      int max_seqlen_k, int heads_q, int heads_kv, int head_dim,
                                      const long long* q_strides, const long long* k_strides,
                                      const long long* v_strides, const long long* o_strides, float softmax_scale,
                                      int is_causal, cudaStream_t stream);
const char* attntune_last_error(void);
}

namespace {

int failed = 0;
alignas(16) char fake[64];  // never dereferenced

// A decode call on a paged cache: 4 sequences, 32 query heads over 8 kv heads, pages of 16.
struct Call {
  const int* lens = reinterpret_cast<const int*>(fake);
  const int* table = reinterpret_cast<const int*>(fake);
  int max_blocks = 256, page = 16, batch = 4, heads_q = 32, heads_kv = 8, seqlen_q = 1, seqlen_k = 4096, d = 128;
  int causal = 0;
  long long qs[3] = {32 * 128, 128, 32 * 128}, ks[3] = {16 * 8 * 128, 128, 8 * 128}, os[3] = {32 * 128, 128, 32 * 128};
  int run() const {
    return attntune_attention_forward_kvcache(fake, fake, fake, fake, nullptr, lens, table, max_blocks, page, batch,
                                              heads_q, heads_kv, seqlen_q, seqlen_k, d, qs, ks, ks, os, 0.088f, causal,
                                              nullptr);
  }
};

void expect(const char* what, int rc, bool want_unsupported, const char* reason_part) {
  const char* why = attntune_last_error();
  const bool ok = want_unsupported ? rc == 1000 && std::strstr(why, reason_part) : rc != 0 && rc != 1000;
  if (!ok) {
    std::printf("FAIL %s: returned %d, last error '%s' (expected %s '%s')\n", what, rc, why,
                want_unsupported ? "1000 and" : "a cudaError_t, not 1000:", reason_part);
    ++failed;
  }
}

}  // namespace

int main() {
  int gpus = 0;
  const bool gpu = cudaGetDeviceCount(&gpus) == cudaSuccess && gpus > 0;
  cudaGetLastError();
  { Call c; c.seqlen_q = 17; expect("seqlen_q 17", c.run(), true, "seqlen_q"); }
  { Call c; c.d = 64; expect("head_dim 64", c.run(), true, "no kernel in this file for head_dim=64"); }
  { Call c; c.page = 0; expect("page_size 0 with a table", c.run(), true, "page_size"); }
  { Call c; c.max_blocks = 10; expect("too few pages per sequence", c.run(), true, "max_blocks_per_seq"); }
  { Call c; c.table = reinterpret_cast<const int*>(fake + 2); expect("misaligned table", c.run(), true, "block_table"); }
  { Call c; c.heads_q = 30; expect("heads_q not a multiple", c.run(), true, "multiple of heads_kv"); }
  { Call c; c.ks[2] = 100; expect("stride not a multiple of 8", c.run(), true, "k_strides"); }
  { Call c; c.batch = 0; expect("empty batch: nothing to do", c.run() == 0 ? 1000 : c.run(), true, ""); }
  {
    const long long st[2] = {32 * 128, 128};
    const int rc = attntune_attention_forward_varlen(fake, fake, fake, fake, nullptr, nullptr, nullptr, 2, 100, 100, 32,
                                                     8, 128, st, st, st, st, 0.088f, 0, nullptr);
    expect("varlen", rc, true, "serves attntune_attention_forward_varlen");
  }
  if (!gpu) {
    { Call c; expect("valid, paged", c.run(), false, ""); }
    { Call c; c.table = nullptr; c.ks[0] = 8LL * 4096 * 128; c.ks[1] = 4096 * 128; c.ks[2] = 128;
      expect("valid, contiguous cache", c.run(), false, ""); }
    { Call c; c.lens = nullptr; expect("valid, no lengths", c.run(), false, ""); }
  } else {
    std::printf("a GPU is present: the checks that would launch on fake pointers are skipped\n");
  }
  std::printf("checks: %d failed\n", failed);
  return failed ? 1 : 0;
}
