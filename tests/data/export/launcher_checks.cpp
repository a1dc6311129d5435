// Host-side checks of an exported file's launcher, linked with it by nvcc (no GPU needed: every
// check below is answered before the launcher makes a CUDA call). Usage:
//   launcher_checks HEAD_DIM IS_CAUSAL
// with the head_dim and causal the export was built for. Prints one line per failed check and
// "checks: N failed" last; exits 1 if any failed. Prints the kernel info JSON on a line
// "info: {...}" for the caller to parse.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

extern "C" {
int attntune_attention_forward(const void* q, const void* k, const void* v, void* out, float* lse, int batch,
                               int heads_q, int heads_kv, int seqlen_q, int seqlen_k, int head_dim,
                               const long long* q_strides, const long long* k_strides, const long long* v_strides,
                               const long long* o_strides, float softmax_scale, int is_causal, cudaStream_t stream);
const char* attntune_kernel_info(void);
const char* attntune_last_error(void);
int attntune_select_kernel(int head_dim, int is_causal, int batch, int heads_q, int heads_kv, int seqlen_q,
                           int seqlen_k);
}

namespace {

int failed = 0;

// A call with valid arguments for [B, H, S, D] tensors; each check changes one thing.
struct Call {
  alignas(16) static char fake[64];  // never dereferenced: every call here fails before a launch
  const void* q = fake;
  const void* k = fake;
  const void* v = fake;
  void* out = fake;
  float* lse = nullptr;
  int batch = 2, heads_q = 8, heads_kv = 8, seqlen_q = 300, seqlen_k = 300, head_dim = 0;
  long long qs[3], ks[3], vs[3], os[3];
  float scale = 0.125f;
  int causal = 0;
  const long long* q_strides = qs;

  Call(int d, int c) : head_dim(d), causal(c) { bhsd(); }
  void bhsd() {
    const long long row = head_dim, head = seqlen_q * row, b = heads_q * head;
    const long long kv_head = static_cast<long long>(seqlen_k) * head_dim, kv_b = heads_kv * kv_head;
    qs[0] = os[0] = b, qs[1] = os[1] = head, qs[2] = os[2] = row;
    ks[0] = vs[0] = kv_b, ks[1] = vs[1] = kv_head, ks[2] = vs[2] = head_dim;
  }
  int run() const {
    return attntune_attention_forward(q, k, v, out, lse, batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim,
                                      q_strides, ks, vs, os, scale, causal, nullptr);
  }
};
alignas(16) char Call::fake[64];

void expect_unsupported(const char* what, const Call& c, const char* reason_part) {
  const int rc = c.run();
  const char* why = attntune_last_error();
  if (rc != 1000 || !why || !std::strstr(why, reason_part)) {
    std::printf("FAIL %s: returned %d, last error '%s' (expected 1000 and '%s')\n", what, rc, why ? why : "(null)",
                reason_part);
    ++failed;
  }
}

void expect(const char* what, bool ok) {
  if (!ok) {
    std::printf("FAIL %s\n", what);
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
  const int other_d = d == 64 ? 128 : 64;

  expect("kernel_info is JSON", attntune_kernel_info() && attntune_kernel_info()[0] == '{');
  std::printf("info: %s\n", attntune_kernel_info());
  expect("select_kernel picks kernel 0", attntune_select_kernel(d, causal, 2, 8, 8, 300, 300) == 0);
  expect("select_kernel: other head_dim", attntune_select_kernel(other_d, causal, 2, 8, 8, 300, 300) == -1);
  expect("select_kernel: other causal", attntune_select_kernel(d, 1 - causal, 2, 8, 8, 300, 300) == -1);
  expect("last_error starts empty", std::strcmp(attntune_last_error(), "") == 0);

  { Call c(d, causal); c.head_dim = other_d; expect_unsupported("wrong head_dim", c, "no kernel in this file for head_dim"); }
  { Call c(d, causal); c.head_dim = other_d; c.run(); expect("reason names what the file holds", std::strstr(attntune_last_error(), "it holds: d=") != nullptr); }
  { Call c(d, causal); c.causal = 1 - causal; expect_unsupported("wrong causal", c, "is_causal="); }
  { Call c(d, causal); c.causal = 2; expect_unsupported("is_causal 2", c, "is_causal must be 0 or 1"); }
  { Call c(d, causal); c.batch = -1; expect_unsupported("negative batch", c, "negative size"); }
  { Call c(d, causal); c.seqlen_k = -5; expect_unsupported("negative seqlen_k", c, "negative size"); }
  { Call c(d, causal); c.heads_q = 6; c.heads_kv = 4; expect_unsupported("heads_q % heads_kv", c, "multiple of heads_kv"); }
  { Call c(d, causal); c.heads_kv = 0; expect_unsupported("heads_kv 0", c, "multiple of heads_kv"); }
  { Call c(d, causal); c.batch = 70000; expect_unsupported("batch over the grid limit", c, "at most 65535"); }
  { Call c(d, causal); c.q = nullptr; expect_unsupported("NULL q", c, "must not be NULL"); }
  { Call c(d, causal); c.out = nullptr; expect_unsupported("NULL out", c, "must not be NULL"); }
  { Call c(d, causal); c.q_strides = nullptr; expect_unsupported("NULL q_strides", c, "o_strides must not be NULL"); }
  { Call c(d, causal); c.q = Call::fake + 2; expect_unsupported("misaligned q", c, "16-byte aligned"); }
  { Call c(d, causal); c.v = Call::fake + 8; expect_unsupported("misaligned v", c, "16-byte aligned"); }
  { Call c(d, causal); c.out = Call::fake + 4; expect_unsupported("misaligned out", c, "16-byte aligned"); }
  { Call c(d, causal); c.lse = reinterpret_cast<float*>(Call::fake + 2); expect_unsupported("misaligned lse", c, "lse must be 4-byte aligned"); }
  { Call c(d, causal); c.qs[2] = d + 4; expect_unsupported("q row stride not a multiple of 8", c, "q_strides"); }
  { Call c(d, causal); c.ks[1] = 12; expect_unsupported("k head stride not a multiple of 8", c, "multiple of 8 elements"); }
  { Call c(d, causal); c.os[0] = -c.os[0]; expect_unsupported("negative stride", c, "negative"); }
  { Call c(d, causal); c.os[0] = 0; expect_unsupported("out batches overlap", c, "make outputs overlap"); }
  { Call c(d, causal); c.os[2] = d / 2; expect_unsupported("out rows overlap", c, "make outputs overlap"); }
  { Call c(d, causal); c.scale = 0.f; expect_unsupported("scale 0", c, "softmax_scale must be finite and > 0"); }
  { Call c(d, causal); c.scale = -0.125f; expect_unsupported("negative scale", c, "softmax_scale"); }
  { Call c(d, causal); c.scale = std::nanf(""); expect_unsupported("NaN scale", c, "softmax_scale"); }
  { Call c(d, causal); c.scale = INFINITY; expect_unsupported("inf scale", c, "softmax_scale"); }

  // The reason is per thread: another thread has not seen this one's failure.
  std::string other;
  std::thread([&] { other = attntune_last_error(); }).join();
  expect("last_error is thread-local", other.empty() && std::strlen(attntune_last_error()) > 0);

  // Empty problems: nothing to compute, and NULL pointers are allowed for empty tensors.
  { Call c(d, causal); c.batch = 0; c.q = c.k = c.v = nullptr; c.out = nullptr; expect("batch 0 returns 0", c.run() == 0); }
  { Call c(d, causal); c.seqlen_q = 0; expect("seqlen_q 0 returns 0", c.run() == 0); }

  // Valid arguments, including [B, S, H, D] strides and GQA, pass validation and reach the CUDA
  // runtime: without a GPU that answers a cudaError_t, never ATTNTUNE_UNSUPPORTED. (With a GPU the
  // fake pointers would be launched on, so these run only where there is none.)
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    Call bshd(d, causal);
    bshd.heads_kv = 2;
    bshd.bhsd();
    const long long h = bshd.heads_q, hk = bshd.heads_kv;
    bshd.qs[0] = bshd.os[0] = bshd.seqlen_q * h * d, bshd.qs[1] = bshd.os[1] = d, bshd.qs[2] = bshd.os[2] = h * d;
    bshd.ks[0] = bshd.vs[0] = bshd.seqlen_k * hk * d, bshd.ks[1] = bshd.vs[1] = d, bshd.ks[2] = bshd.vs[2] = hk * d;
    const Call plain(d, causal);
    for (const Call* c : {static_cast<const Call*>(&plain), static_cast<const Call*>(&bshd)}) {
      const int rc = c->run();
      std::printf("valid arguments, no GPU: returned %d, '%s'\n", rc, attntune_last_error());
      if (rc == 0 || rc == 1000 || !std::strstr(attntune_last_error(), "cuda")) {
        std::printf("FAIL valid arguments: returned %d, '%s' (expected a cudaError_t)\n", rc,
                    attntune_last_error());
        ++failed;
      }
    }
  } else {
    std::printf("note: a GPU is present; the no-driver path was not exercised\n");
  }

  std::printf("checks: %d failed\n", failed);
  return failed ? 1 : 0;
}
