// Host-side checks of the persistent grid that an exported file's launcher sizes for a kernel in
// 2-CTA clusters (flash_fwd_wgmma's kv_multicast), compiled with that file included
// (nvcc -include FILE.cu): its launcher's static functions are in this translation unit, so the
// code checked is the exported code, which repeats the tuner's rule (tuner/families/family.hpp:
// persistent_work_tiles, persistent_ctas, split_tail_tiles). No GPU needed: no CUDA call is made.
// The file's first kernel must be persistent, block_m 128, in clusters of 2. Prints one line per
// failed check and "checks: N failed" last; exits 1 if any failed.
// (A .cu, so that tests/unit's glob of *.cpp leaves it out of attntune_tests.)
#include <cstdio>

// The launcher is host code only; the device passes see the kernels alone.
#if !defined(__CUDA_ARCH__)

namespace {

int failed = 0;

void expect_eq(const char* what, long long got, long long want) {
  if (got != want) {
    std::printf("FAIL %s: %lld (expected %lld)\n", what, got, want);
    ++failed;
  }
}

attntune_export::Args sizes(int batch, int heads, int seqlen) {
  attntune_export::Args a = attntune_export::Args();
  a.batch = batch;
  a.heads_q = a.heads_kv = heads;
  a.seqlen_q = a.seqlen_k = seqlen;
  a.head_dim = 128;
  return a;
}

}  // namespace

int main() {
  using namespace attntune_export;
  const Kernel& k = kKernels[0];
  if (!k.persistent || k.block_m != 128 || k.cluster != 2) {
    std::printf("FAIL kernel 0 is persistent=%d block_m=%d cluster=%d: expected a persistent 128-row kernel in "
                "clusters of 2\nchecks: 1 failed\n",
                k.persistent, k.block_m, k.cluster);
    return 1;
  }
  const Device h100 = {0, 132, 64}, unknown = {0, 132, 0}, odd_sms = {0, 133, 0};

  expect_eq("query blocks, s=4000", query_blocks(k, sizes(4, 16, 4000)), 32);
  expect_eq("query blocks, s=4100 (33 padded to 34)", query_blocks(k, sizes(4, 16, 4100)), 34);
  expect_eq("work tiles, b=4 h=16 s=4100", work_tiles(k, sizes(4, 16, 4100)), 34LL * 16 * 4);
  expect_eq("CTAs, 64 clusters fit at once", persistent_ctas(k, sizes(4, 16, 4100), h100), 128);
  expect_eq("CTAs, fitting clusters unknown", persistent_ctas(k, sizes(4, 16, 4100), unknown), 132);
  expect_eq("CTAs, 133 SMs", persistent_ctas(k, sizes(4, 16, 4100), odd_sms), 132);
  expect_eq("CTAs, one query block (a pair with its ghost)", persistent_ctas(k, sizes(1, 1, 100), h100), 2);

  // split_tail of the padded tiles: 16 heads x 34 blocks = 544 = 4 x 128 + 32, over 33 K/V tiles.
  const Args a = sizes(1, 16, 4100);
  const int ctas = persistent_ctas(k, a, h100);
  expect_eq("split tail tiles", split_tail_tiles(work_tiles(k, a), ctas, 33), 32);

  std::printf("checks: %d failed\n", failed);
  return failed ? 1 : 0;
}

#endif  // !defined(__CUDA_ARCH__)
