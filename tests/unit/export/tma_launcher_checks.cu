// Host-side checks of what the TMA launch plan (templates/flash_fwd_wgmma/launch.h) adds to an exported
// file's launcher, linked with a flash_fwd_wgmma export by nvcc (no GPU needed: every check is
// answered before a kernel could be launched). Beside tests/data/export/launcher_checks.cpp, which
// checks what every family shares. Usage:
//   tma_launcher_checks HEAD_DIM IS_CAUSAL
// Prints one line per failed check and "checks: N failed" last; exits 1 if any failed.
// (A .cu, so that tests/unit's glob of *.cpp leaves it out of attntune_tests.)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" {
int attntune_attention_forward(const void* q, const void* k, const void* v, void* out, float* lse, int batch,
                               int heads_q, int heads_kv, int seqlen_q, int seqlen_k, int head_dim,
                               const long long* q_strides, const long long* k_strides, const long long* v_strides,
                               const long long* o_strides, float softmax_scale, int is_causal, cudaStream_t stream);
const char* attntune_kernel_info(void);
const char* attntune_last_error(void);
}

namespace {

int failed = 0;

alignas(16) char fake[64];  // never dereferenced

// Valid arguments for [B, H, S, D] tensors of these sizes.
struct Call {
  const void* k = fake;
  const void* v = fake;
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal;
  long long qs[3], ks[3], vs[3], os[3];
  Call(int d, int c, int b = 2, int h = 8, int hkv = 8, int s = 300, int sk = 300)
      : batch(b), heads_q(h), heads_kv(hkv), seqlen_q(s), seqlen_k(sk), head_dim(d), causal(c) {
    qs[2] = os[2] = ks[2] = vs[2] = d;
    qs[1] = os[1] = static_cast<long long>(s) * d;
    qs[0] = os[0] = static_cast<long long>(h) * s * d;
    ks[1] = vs[1] = static_cast<long long>(sk) * d;
    ks[0] = vs[0] = static_cast<long long>(hkv) * sk * d;
  }
  int run() const {
    return attntune_attention_forward(fake, k, v, fake, nullptr, batch, heads_q, heads_kv, seqlen_q, seqlen_k,
                                      head_dim, qs, ks, vs, os, 0.125f, causal, nullptr);
  }
};

void expect_unsupported(const char* what, const Call& c, const char* reason_part) {
  const int rc = c.run();
  const char* why = attntune_last_error();
  if (rc != 1000 || !std::strstr(why, reason_part)) {
    std::printf("FAIL %s: returned %d, last error '%s' (expected 1000 and '%s')\n", what, rc, why, reason_part);
    ++failed;
  }
}

// Arguments TMA takes: with no GPU the call gets past every check to the CUDA runtime, which
// answers a cudaError_t (never ATTNTUNE_UNSUPPORTED).
void expect_accepted(const char* what, const Call& c) {
  const int rc = c.run();
  const char* why = attntune_last_error();
  if (rc == 0 || rc == 1000 || !std::strstr(why, "cuda")) {
    std::printf("FAIL %s: returned %d, '%s' (expected a cudaError_t from the runtime)\n", what, rc, why);
    ++failed;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s HEAD_DIM IS_CAUSAL\n", argv[0]);
    return 2;
  }
  const int d = std::atoi(argv[1]), causal = std::atoi(argv[2]);
  const long long two40 = 1LL << 40;  // bytes; a stride of 2^39 elements of 2 bytes reaches it

  if (!std::strstr(attntune_kernel_info(), "\"tma_box_rows\"")) {
    std::printf("FAIL kernel_info has no tma_box_rows: %s\n", attntune_kernel_info());
    ++failed;
  }
  { Call c(d, causal); c.qs[0] = two40 / 2; c.os[0] = two40 / 2; expect_unsupported("q batch stride of 2^40 bytes", c, "2^40 bytes"); }
  { Call c(d, causal); c.ks[1] = two40 / 2; expect_unsupported("k head stride of 2^40 bytes", c, "k_strides"); }
  { Call c(d, causal, 1, 8, 2, 1, 300); c.vs[2] = two40; expect_unsupported("v row stride of 2^41 bytes", c, "v_strides"); }
  // 65535 * 65535 one-row work tiles: more than the kernel numbers with an int.
  {
    Call c(d, causal, 65535, 65535, 65535, 1, 1);
    expect_unsupported("2^32 work tiles", c, "work tiles");
  }

  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    // A huge stride along a dimension of extent 1 is never stepped along: accepted.
    { Call c(d, causal, 1); c.qs[0] = c.os[0] = two40; expect_accepted("2^41-byte batch stride, batch 1", c); }
    // No keys: k and v may be NULL; q stands in for their tensor maps.
    { Call c(d, causal, 2, 8, 8, 300, 0); c.k = c.v = nullptr; expect_accepted("seqlen_k 0, NULL k and v", c); }
    // GQA, [B, S, H, D] strides, odd lengths, sk != s.
    {
      Call c(d, causal, 2, 8, 2, 333, 1001);
      c.qs[0] = c.os[0] = 333LL * 8 * d, c.qs[1] = c.os[1] = d, c.qs[2] = c.os[2] = 8LL * d;
      c.ks[0] = c.vs[0] = 1001LL * 2 * d, c.ks[1] = c.vs[1] = d, c.ks[2] = c.vs[2] = 2LL * d;
      expect_accepted("GQA [B,S,H,D] s=333 sk=1001", c);
    }
  } else {
    std::printf("a GPU is present: the checks that would launch on fake pointers are skipped\n");
  }
  std::printf("checks: %d failed\n", failed);
  return failed ? 1 : 0;
}
