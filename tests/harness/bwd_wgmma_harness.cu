// Development harness for templates/flash_bwd_wgmma, as bwd_harness.cu is for flash_bwd_mma (the same
// C functions, so tests/harness/bwd_check.py loads either): nvcc-compiled into a shared library with
// the tunables as -D flags (tests/harness/bwd_wgmma_build.sh).
#include <cuda_runtime.h>

#include "../../templates/flash_bwd_wgmma/kernel.cu"
#include "../../templates/flash_bwd_wgmma/launch.h"
#include "../../templates/export/run_plan.cuh"

extern "C" int bwd_run(const void* q, const void* k, const void* v, const void* o, const float* lse, const void* dout,
                       void* dq, void* dk, void* dv, int b, int h, int hkv, int s, int sk, int layout, int window_left,
                       int window_right, void* stream) {
  const int d = ATT_HEAD_DIM;
  static const attntune_plan::Define defines[] = {
      {"ATT_HEAD_DIM", ATT_HEAD_DIM}, {"ATT_CAUSAL", ATT_CAUSAL}, {"BLOCK_M", BLOCK_M},
      {"BLOCK_N", BLOCK_N},           {"THREADS", att::Traits::kThreads}, {"SMEM_BYTES", att::Traits::kSmemBytes},
      {"ATT_WINDOW", ATT_WINDOW}};
  static attntune_plan::Consts consts;
  static const int loaded = attntune_plan::kFlashBwdWgmma.load(defines, 7, consts.bytes, nullptr);
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
  attntune_plan::Why why;
  if (!loaded && attntune_plan::normalise_variants(&c, &why) == 0) {
    const void* funcs[] = {reinterpret_cast<const void*>(&att::flash_bwd_preprocess),
                           reinterpret_cast<const void*>(&att::flash_bwd_wgmma),
                           reinterpret_cast<const void*>(&att::flash_bwd_convert)};
    if (attntune_run::run_plan(attntune_plan::kFlashBwdWgmma, consts.bytes, funcs, c,
                               static_cast<cudaStream_t>(stream), &why) == 0)
      return 0;
  }
  std::printf("bwd_run: %s\n", loaded ? "the constants do not load" : why.text);
  return 1;
}

extern "C" int bwd_attrs(int* regs, int* local_bytes, int* smem) {
  cudaFuncAttributes fa;
  if (cudaFuncGetAttributes(&fa, att::flash_bwd_wgmma) != cudaSuccess) return 1;
  *regs = fa.numRegs;
  *local_bytes = (int)fa.localSizeBytes;
  *smem = att::Traits::kSmemBytes;
  return 0;
}
