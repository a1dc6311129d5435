// Host-side checks of the persistent grid that an exported file plans for a kernel in 2-CTA
// clusters (flash_fwd_wgmma's kv_multicast), compiled with that file included (nvcc -include
// FILE.cu): its kernel table, constants and launch plan are in this translation unit, so the code
// checked is the exported code (the family's launch plan, templates/flash_fwd_wgmma/launch.h, the
// same the tuner plans with). No GPU needed: no CUDA call is made.
// The file's first kernel must be persistent, block_m 128, in clusters of 2. Prints one line per
// failed check and "checks: N failed" last; exits 1 if any failed.
// (A .cu, so that tests/unit's glob of *.cpp leaves it out of attntune_tests.)
#include <cstddef>
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

attntune_plan::Call sizes(int batch, int heads, int seqlen) {
  attntune_plan::Call a = attntune_plan::empty_call();
  a.entry = attntune_plan::kEntryDense;
  a.batch = batch;
  a.heads_q = a.heads_kv = heads;
  a.seqlen_q = a.seqlen_k = seqlen;
  a.head_dim = 128;
  for (int i = 0; i < 3; ++i) a.q_stride[i] = a.k_stride[i] = a.v_stride[i] = a.o_stride[i] = 128;
  a.scale = 0.125f;
  return a;
}

// A device of `sms` SMs on which `clusters` clusters fit at once (0: unknown).
struct Fake {
  int sms, clusters;
};
attntune_plan::Device device(const Fake& f) {
  attntune_plan::Device d;
  d.sm_count = f.sms;
  d.ctx = &f;
  d.max_active_clusters = [](const void* ctx, int, unsigned, unsigned, unsigned, unsigned) {
    return static_cast<const Fake*>(ctx)->clusters;
  };
  return d;
}

}  // namespace

// The launch plan binds the kernel's arguments as the host's copies of its types: they must match
// the kernel's own (in its attntune_k0 namespace) byte for byte.
static_assert(sizeof(::AttnParams) == sizeof(attntune_k0::AttnParams), "AttnParams differ");
static_assert(sizeof(::att::TmaMaps) == sizeof(attntune_k0::att::TmaMaps), "TmaMaps differ");
static_assert(alignof(::att::TmaMaps) == alignof(attntune_k0::att::TmaMaps), "TmaMaps' alignment differs");
static_assert(offsetof(::att::TmaMaps, tile_count) == offsetof(attntune_k0::att::TmaMaps, tile_count), "TmaMaps differ");

int main() {
  using namespace attntune_export;
  const Kernel& k = kKernels[0];
  const LoadedConsts& loaded = loaded_consts();
  const attntune_plan::FlashFwdWgmmaLaunch& c =
      *reinterpret_cast<const attntune_plan::FlashFwdWgmmaLaunch*>(loaded.consts[0].bytes);
  if (loaded.failed || k.family != &attntune_plan::kFlashFwdWgmma || !c.persistent || c.block_m != 128 ||
      c.cluster != 2) {
    std::printf("FAIL kernel 0 is persistent=%d block_m=%d cluster=%d: expected a persistent 128-row "
                "flash_fwd_wgmma kernel in clusters of 2\nchecks: 1 failed\n",
                c.persistent, c.block_m, c.cluster);
    return 1;
  }
  const Fake h100 = {132, 64}, unknown = {132, 0}, odd_sms = {133, 0};
  auto ctas = [&](const attntune_plan::Call& call, const Fake& f) {
    attntune_plan::Plan plan;
    attntune_plan::Why why;
    if (k.family->plan(loaded.consts[0].bytes, call, device(f), &plan, &why)) {
      std::printf("FAIL the plan refused: %s\n", why.text);
      ++failed;
      return -1LL;
    }
    expect_eq("cluster of the launch", plan.launch[0].cluster, 2);
    return static_cast<long long>(plan.launch[0].grid[0]);
  };

  expect_eq("query blocks, s=4000", c.work_tiles(sizes(1, 1, 4000)), 32);
  expect_eq("query blocks, s=4100 (33 padded to 34)", c.work_tiles(sizes(1, 1, 4100)), 34);
  expect_eq("work tiles, b=4 h=16 s=4100", c.work_tiles(sizes(4, 16, 4100)), 34LL * 16 * 4);
  expect_eq("CTAs, 64 clusters fit at once", ctas(sizes(4, 16, 4100), h100), 128);
  expect_eq("CTAs, fitting clusters unknown", ctas(sizes(4, 16, 4100), unknown), 132);
  expect_eq("CTAs, 133 SMs", ctas(sizes(4, 16, 4100), odd_sms), 132);
  expect_eq("CTAs, one query block (a pair with its ghost)", ctas(sizes(1, 1, 100), h100), 2);

  // split_tail of the padded tiles: 16 heads x 34 blocks = 544 = 4 x 128 + 32, over 33 K/V tiles.
  const attntune_plan::Call a = sizes(1, 16, 4100);
  expect_eq("split tail tiles", c.tail_tiles(a, static_cast<unsigned>(ctas(a, h100))), 32);

  std::printf("checks: %d failed\n", failed);
  return failed ? 1 : 0;
}

#endif  // !defined(__CUDA_ARCH__)
