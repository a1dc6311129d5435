// Development harness for templates/flash_fwd_mma, independent of the tuner: nvcc-compiled with
// the tunables as -D flags, it checks the kernel against the reference kernels on a list of
// shapes (fresh random inputs, NaN-poisoned output, FA2's criterion) and times it with events.
// Usage: mma_harness b,h,hkv,s,sk,layout[,left,right,softcap,sinks][;...]   (layout 0 = [B,H,S,D],
// 1 = [B,S,H,D]; a build with -DATT_WINDOW=1 / -DATT_SOFTCAP=1 / -DATT_SINKS=1 takes the window's
// sides (-1 unbounded), the cap and sinks (1: logits -2..10 by head) from the optional fields;
// TF/s counts the pairs the window lets a query see).
#include <cuda_runtime.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../../templates/flash_fwd_mma/kernel.cu"
#include "../../templates/flash_fwd_mma/launch.h"
#include "../../templates/export/run_plan.cuh"
#include "../../templates/reference/reference.cu"

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { std::printf("CUDA %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); std::exit(1); } } while (0)

static AttnParams make(void* q, void* k, void* v, void* o, float* lse, int b, int h, int hkv, int s, int sk, int d, int layout) {
  AttnParams p{};
  p.q = q; p.k = k; p.v = v; p.o = o; p.lse = lse;
  auto st = [&](long long* x, int heads, int len) {
    if (layout == 0) { x[0] = (long long)heads * len * d; x[1] = (long long)len * d; x[2] = d; }
    else { x[0] = (long long)len * heads * d; x[1] = d; x[2] = (long long)heads * d; }
  };
  st(p.q_stride, h, s); st(p.k_stride, hkv, sk); st(p.v_stride, hkv, sk); st(p.o_stride, h, s);
  p.batch = b; p.heads_q = h; p.heads_kv = hkv; p.seqlen_q = s; p.seqlen_k = sk; p.q_per_kv = h / hkv;
  p.scale = 1.f / std::sqrt((float)d); p.scale_log2 = p.scale * 1.4426950408889634f;
  return p;
}

// The dense call of p, launched as every executor launches it: flash_fwd_mma's launch plan
// (templates/flash_fwd_mma/launch.h) through run_plan.cuh, with this build's constants.
static void launch(const AttnParams& p, int d, int causal, cudaStream_t stream) {
  static const attntune_plan::Define defines[] = {{"BLOCK_M", BLOCK_M},
                                                  {"THREADS", att::Traits::kThreads},
                                                  {"SMEM_BYTES", att::Traits::kSmemBytes},
                                                  {"ATT_WINDOW", ATT_WINDOW},
                                                  {"ATT_SOFTCAP", ATT_SOFTCAP},
                                                  {"ATT_SINKS", ATT_SINKS}};
  static attntune_plan::Consts consts;
  static const int loaded = attntune_plan::kFlashFwdMma.load(defines, 6, consts.bytes, nullptr);
  attntune_plan::Call c = attntune_plan::dense_call(p, d, causal);
  c.window_left = p.variant.window_left;
  c.window_right = p.variant.window_right;
  c.softcap = p.variant.softcap;
  c.sinks = p.variant.sinks;
  const void* funcs[] = {reinterpret_cast<const void*>(&att::flash_fwd_mma)};
  attntune_plan::Why why;
  if (loaded || attntune_run::run_plan(attntune_plan::kFlashFwdMma, consts.bytes, funcs, c, stream, &why)) {
    std::printf("launch: %s\n", loaded ? "the constants do not load" : why.text);
    std::exit(1);
  }
}

int main(int argc, char** argv) {
  const int d = ATT_HEAD_DIM, bf16 = ATT_DTYPE_BF16, causal = ATT_CAUSAL;
  constexpr int kSmem = att::Traits::kSmemBytes;
  CK(cudaFuncSetAttribute(att::flash_fwd_mma, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  cudaFuncAttributes fa; CK(cudaFuncGetAttributes(&fa, att::flash_fwd_mma));
  int occ = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, att::flash_fwd_mma, att::Traits::kThreads, kSmem));
  char* spec = argv[1];
  for (char* tok = std::strtok(spec, ";"); tok; tok = std::strtok(nullptr, ";")) {
    int b, h, hkv, s, sk, layout, left = -1, right = -1, with_sinks = 0;
    float softcap = 0.f;
    std::sscanf(tok, "%d,%d,%d,%d,%d,%d,%d,%d,%f,%d", &b, &h, &hkv, &s, &sk, &layout, &left, &right, &softcap, &with_sinks);
    if (causal) right = -1;  // causal bounds the right side
    size_t nq = (size_t)b * h * s * d, nk = (size_t)b * hkv * sk * d;
    unsigned short *q, *k, *v, *o; float *lse, *r32, *rlow, *lse32, *lselow; unsigned *stats;
    CK(cudaMalloc(&q, nq * 2)); CK(cudaMalloc(&k, nk * 2)); CK(cudaMalloc(&v, nk * 2)); CK(cudaMalloc(&o, nq * 2));
    CK(cudaMalloc(&lse, (size_t)b * h * s * 4)); CK(cudaMalloc(&r32, nq * 4)); CK(cudaMalloc(&rlow, nq * 4));
    CK(cudaMalloc(&lse32, (size_t)b * h * s * 4)); CK(cudaMalloc(&lselow, (size_t)b * h * s * 4)); CK(cudaMalloc(&stats, 32));
    att_ref::fill_normal<<<1024, 256>>>(q, nq, 11, bf16);
    att_ref::fill_normal<<<1024, 256>>>(k, nk, 22, bf16);
    att_ref::fill_normal<<<1024, 256>>>(v, nk, 33, bf16);
    CK(cudaMemset(o, 0xff, nq * 2)); CK(cudaMemset(lse, 0xff, (size_t)b * h * s * 4)); CK(cudaMemset(stats, 0, 32));
    AttnParams p = make(q, k, v, o, lse, b, h, hkv, s, sk, d, layout);
    p.variant.window_left = left;
    p.variant.window_right = right;
    p.variant.softcap = softcap;
    p.variant.softcap_scale = softcap > 0.f ? p.scale / softcap : 0.f;
    if (softcap > 0.f) p.scale_log2 = 1.4426950408889634f;  // as fill_tensor_args: capped scores are scaled
    float* sinks = nullptr;
    if (with_sinks) {
      std::vector<float> host(h);
      for (int i = 0; i < h; ++i) host[i] = -2.f + 12.f * ((i * 37) % 101) / 100.f;
      CK(cudaMalloc(&sinks, h * 4));
      CK(cudaMemcpy(sinks, host.data(), h * 4, cudaMemcpyHostToDevice));
    }
    p.variant.sinks = sinks;
    dim3 rg((s + 7) / 8, h, b);
    att_ref::attn_reference<<<rg, 256>>>(p, d, bf16, causal, 0, r32, lse32, nullptr);
    att_ref::attn_reference<<<rg, 256>>>(p, d, bf16, causal, 1, rlow, lselow, nullptr);
    launch(p, d, causal, nullptr);
    att_ref::compare_outputs<<<256, dim3(32, 8)>>>(p, d, bf16, r32, rlow, lse32, stats, stats + 4);
    CK(cudaDeviceSynchronize());
    unsigned hs[8]; CK(cudaMemcpy(hs, stats, 32, cudaMemcpyDeviceToHost));
    float e_out, e_low, e_lse; std::memcpy(&e_out, &hs[0], 4); std::memcpy(&e_low, &hs[1], 4); std::memcpy(&e_lse, &hs[2], 4);
    const float atol = bf16 ? 1.0f / 512 : 1.0f / 4096;
    bool ok = hs[4] == 0 && hs[5] == 0 && e_out <= 2 * e_low + atol && e_lse < 1e-3f;
    // Timing as the PyTorch peers are timed (their timing script): a CUDA graph of 20
    // launches, median of 30 replays, divided by 20.
    cudaStream_t stream; CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (int i = 0; i < 3; ++i) launch(p, d, causal, stream);
    cudaGraph_t graph; cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < 20; ++i) launch(p, d, causal, stream);
    CK(cudaStreamEndCapture(stream, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(exec, stream));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    std::vector<float> ts;
    for (int i = 0; i < 30; ++i) {
      CK(cudaEventRecord(e0, stream)); CK(cudaGraphLaunch(exec, stream)); CK(cudaEventRecord(e1, stream));
      CK(cudaEventSynchronize(e1)); float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); ts.push_back(ms / 20);
    }
    std::sort(ts.begin(), ts.end());
    CK(cudaGraphExecDestroy(exec)); CK(cudaGraphDestroy(graph)); CK(cudaStreamDestroy(stream));
    double pairs = 0;
    for (int i = 0; i < s; ++i) {
      const int r = i + sk - s;  // bottom-right aligned
      const int hi = causal ? r + 1 : right >= 0 ? r + right + 1 : sk, lo = left >= 0 ? r - left : 0;
      pairs += std::max(0, std::min(hi, sk) - std::max(lo, 0));
    }
    double tf = 4.0 * b * h * d * pairs / (ts[15] * 1e-3) / 1e12;
    std::printf("BM=%d BN=%d W=%d ST=%d QR=%d MB=%d FP=%d LR=%d SC=%d SUB=%d regs=%d occ=%d | b=%d h=%d hkv=%d s=%d sk=%d L=%d d=%d %s%s window=%d,%d softcap=%g sinks=%d | err=%.3g low=%.3g lse=%.2g nf=%u lsebad=%u %s | %.1f us %.1f TF\n",
                BLOCK_M, BLOCK_N, WARPS, KV_STAGES, Q_IN_REGS, MIN_BLOCKS, FRAG_PREFETCH, LAZY_RESCALE, KV_SCHEDULE, SUB_N, fa.numRegs, occ, b, h, hkv, s, sk, layout, d,
                bf16 ? "bf16" : "fp16", causal ? " causal" : "", left, right, softcap, with_sinks, e_out, e_low, e_lse, hs[4], hs[5], ok ? "PASS" : "FAIL", ts[15] * 1e3, tf);
    cudaFree(sinks);
    cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(o); cudaFree(lse); cudaFree(r32); cudaFree(rlow); cudaFree(lse32); cudaFree(lselow); cudaFree(stats);
  }
  return 0;
}
