// Development harness for the backward families, independent of the tuner: templates/flash_bwd_mma
// (tests/harness/bwd_build.sh), or templates/flash_bwd_wgmma with -DBWD_WGMMA
// (tests/harness/bwd_wgmma_build.sh). nvcc-compiled into a shared library with the tunables as -D
// flags, whose one C function
// runs a backward call through the family's launch plan and run_plan.cuh, as the exported library
// does. tests/harness/bwd_check.py loads it with ctypes and checks it against PyTorch's float64
// autograd (FlashAttention-2's criterion, NaN-poisoned outputs) and times it beside SDPA's backward.
#include <cuda_runtime.h>

#if defined(BWD_WGMMA)
#include "../../templates/flash_bwd_wgmma/kernel.cu"
#include "../../templates/flash_bwd_wgmma/launch.h"
#define BWD_FAMILY attntune_plan::kFlashBwdWgmma
#define BWD_MAIN att::flash_bwd_wgmma
#else
#include "../../templates/flash_bwd_mma/kernel.cu"
#include "../../templates/flash_bwd_mma/launch.h"
#define BWD_FAMILY attntune_plan::kFlashBwdMma
#define BWD_MAIN att::flash_bwd_mma
#endif
#include "../../templates/export/run_plan.cuh"

// Tensors [batch, seq, heads, dim] (layout 1, FlashAttention's) or [batch, heads, seq, dim]
// (layout 0), contiguous; lse [batch, heads_q, seqlen_q]. deterministic: 1, the deterministic mode
// (Call::deterministic: dQ's shares added in key-block order, bit-identical gradients). Returns 0, or
// prints the reason and returns 1.
extern "C" int bwd_run_ex(const void* q, const void* k, const void* v, const void* o, const float* lse,
                          const void* dout, void* dq, void* dk, void* dv, int b, int h, int hkv, int s, int sk,
                          int layout, int window_left, int window_right, int deterministic, void* stream) {
  const int d = ATT_HEAD_DIM;
  static const attntune_plan::Define defines[] = {
      {"ATT_HEAD_DIM", ATT_HEAD_DIM}, {"ATT_CAUSAL", ATT_CAUSAL}, {"BLOCK_M", BLOCK_M},
      {"THREADS", att::Traits::kThreads}, {"SMEM_BYTES", att::Traits::kSmemBytes}, {"ATT_WINDOW", ATT_WINDOW},
      {"D_PAD", att::Traits::kHeadDim}, {"ATT_DTYPE_BF16", ATT_DTYPE_BF16},
#if defined(TMA_LOADS)
      {"TMA_LOADS", TMA_LOADS},
#endif
#if defined(BWD_WGMMA)
      {"BLOCK_N", BLOCK_N},
#else
      {"WARPS", WARPS}, {"KEY_TILES", KEY_TILES},
#endif
  };
  static attntune_plan::Consts consts;
  static const int loaded =
      BWD_FAMILY.load(defines, static_cast<int>(sizeof defines / sizeof defines[0]), consts.bytes, nullptr);
  attntune_plan::Call c = attntune_plan::empty_call();
  c.entry = attntune_plan::kEntryBackward;
  auto strides = [&](long long* x, int heads, int len) {
    if (layout == 0) { x[0] = (long long)heads * len * d; x[1] = (long long)len * d; x[2] = d; }
    else { x[0] = (long long)len * heads * d; x[1] = d; x[2] = (long long)heads * d; }
  };
  c.q = q; c.k = k; c.v = v; c.out = const_cast<void*>(o); c.lse = const_cast<float*>(lse);
  c.dout = dout; c.dq = dq; c.dk = dk; c.dv = dv;
  strides(c.q_stride, h, s); strides(c.o_stride, h, s); strides(c.do_stride, h, s); strides(c.dq_stride, h, s);
  strides(c.k_stride, hkv, sk); strides(c.v_stride, hkv, sk); strides(c.dk_stride, hkv, sk); strides(c.dv_stride, hkv, sk);
  c.batch = b; c.heads_q = h; c.heads_kv = hkv; c.seqlen_q = s; c.seqlen_k = sk; c.head_dim = d;
  c.scale = 1.f / sqrtf((float)d);
  c.causal = ATT_CAUSAL;
  c.window_left = window_left; c.window_right = window_right;
  c.deterministic = deterministic;
  attntune_plan::Why why;
  if (!loaded && attntune_plan::normalise_variants(&c, &why) == 0) {
    const void* funcs[] = {reinterpret_cast<const void*>(&att::flash_bwd_preprocess),
                           reinterpret_cast<const void*>(&BWD_MAIN),
                           reinterpret_cast<const void*>(&att::flash_bwd_convert)};
    if (attntune_run::run_plan(BWD_FAMILY, consts.bytes, funcs, c,
                               static_cast<cudaStream_t>(stream), &why) == 0)
      return 0;
  }
  std::printf("bwd_run: %s\n", loaded ? "the constants do not load" : why.text);
  return 1;
}

// bwd_run_ex without the deterministic mode (the harness's first entry point, as before it).
extern "C" int bwd_run(const void* q, const void* k, const void* v, const void* o, const float* lse, const void* dout,
                       void* dq, void* dk, void* dv, int b, int h, int hkv, int s, int sk, int layout, int window_left,
                       int window_right, void* stream) {
  return bwd_run_ex(q, k, v, o, lse, dout, dq, dk, dv, b, h, hkv, s, sk, layout, window_left, window_right, 0, stream);
}

// The build's registers, spills and smem, for the check's table.
extern "C" int bwd_attrs(int* regs, int* local_bytes, int* smem) {
  cudaFuncAttributes fa;
  if (cudaFuncGetAttributes(&fa, BWD_MAIN) != cudaSuccess) return 1;
  *regs = fa.numRegs;
  *local_bytes = (int)fa.localSizeBytes;
  *smem = att::Traits::kSmemBytes;
  return 0;
}
