// Development harness for templates/flash_fwd_wgmma, independent of the tuner: nvcc-compiled for
// sm_90a with the tunables as -D flags. Per shape it builds the TMA tensor maps, checks the kernel
// against the reference kernels (fresh random inputs, NaN-poisoned output and LSE, FA2's
// criterion) and times it as the PyTorch peers are timed (CUDA graph of 20 launches, median of
// 30 replays). Usage: wgmma_harness "b,h,hkv,s,sk,layout[,time][;...]" [persistent]
//   layout 0 = [B,H,S,D], 1 = [B,S,H,D]; time 0 skips the timing (correctness-only shapes).
//   persistent 0: one CTA per work tile (default); 1: one CTA per SM; 2: each shape both ways.
// Built with -DATT_TRACE=1 (wgmma_build.sh: ATT_TRACE=1 in the -D field) a timed persistent shape
// also prints a TRACE line: where a work tile's cycles go (docs/log/WGMMA.md run 39).
// Built with ATT_WINDOW=1, ATT_SOFTCAP=1 or ATT_SINKS=1 (the -D field) every call has the variant:
// WGMMA_WINDOW=L[,R] (default 128; R -1, or the diagonal when causal), WGMMA_SOFTCAP=C (default 50),
// sinks drawn in [-2, 10] by head; TF counts the pairs the window lets a query see.
#include <cuda.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../../templates/flash_fwd_wgmma/kernel.cu"
#include "../../templates/flash_fwd_wgmma/launch.h"
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
  p.variant.window_left = p.variant.window_right = -1;  // the reference applies whatever p says
  return p;
}

// The runtime adapter of the export (run_plan.cuh), owning what it allocates: a harness call's
// workspaces are freed with it.
struct OwningApi : attntune_run::RuntimeApi {
  std::vector<void*> owned;
  int allocate(unsigned long long bytes, void** out, attntune_plan::Why* why) {
    const int r = RuntimeApi::allocate(bytes, out, why);
    if (r == 0) owned.push_back(*out);
    return r;
  }
  void release(void* p) {
    owned.erase(std::remove(owned.begin(), owned.end(), p), owned.end());
    RuntimeApi::release(p);
  }
  ~OwningApi() { for (void* p : owned) cudaFree(p); }
};

// " window=L,R softcap=C sinks" for the build's variants (empty for a plain build).
static std::string variant_words(const AttnParams& p) {
  char buf[96] = "";
  int n = 0;
  if (ATT_WINDOW) n += std::snprintf(buf + n, sizeof buf - n, " window=%d,%d", p.variant.window_left, p.variant.window_right);
  if (ATT_SOFTCAP) n += std::snprintf(buf + n, sizeof buf - n, " softcap=%g", p.variant.softcap);
  if (ATT_SINKS) std::snprintf(buf + n, sizeof buf - n, " sinks");
  return buf;
}

// The build's variants into p (the reference reads them there; PlannedCall passes them to the
// plan): the window and the cap from the environment, the sinks a device buffer of h logits.
static void set_variants(AttnParams& p, int h, float** sinks) {
  if (ATT_WINDOW) {
    const char* w = std::getenv("WGMMA_WINDOW");
    int left = 128, right = -1;
    if (w) std::sscanf(w, "%d,%d", &left, &right);
    p.variant.window_left = left;
    p.variant.window_right = ATT_CAUSAL ? -1 : right;
  }
  if (ATT_SOFTCAP) {
    p.variant.softcap = std::getenv("WGMMA_SOFTCAP") ? (float)std::atof(std::getenv("WGMMA_SOFTCAP")) : 50.f;
    p.variant.softcap_scale = p.scale / p.variant.softcap;
  }
  if (ATT_SINKS) {
    std::vector<float> host(h);
    for (int i = 0; i < h; ++i) host[i] = -2.f + 12.f * (float)((i * 2654435761u) % 1000) / 1000.f;
    if (!*sinks) CK(cudaMalloc(sinks, h * sizeof(float)));
    CK(cudaMemcpy(*sinks, host.data(), h * sizeof(float), cudaMemcpyHostToDevice));
    p.variant.sinks = *sinks;
  }
}

// One call launched as every executor launches it: the family's plan (templates/flash_fwd_wgmma/
// launch.h: grid, tensor maps, workspaces) prepared once by the executor (templates/common/
// run_plan.h), then launched as often as the harness likes. Each call has an executor of its own:
// the harness varies the build's constants (persistence, the split tail), whose workspaces differ,
// and it reads the counters the kernel must leave at zero in them.
struct PlannedCall {
  attntune_plan::FlashFwdWgmmaLaunch c;
  attntune_plan::Call call;
  const void* funcs[2] = {reinterpret_cast<const void*>(&att::flash_fwd_wgmma),
                          reinterpret_cast<const void*>(&att::flash_fwd_wgmma_varlen_order)};
  std::unique_ptr<attntune_plan::Executor<OwningApi, 2, 4>> exec{new attntune_plan::Executor<OwningApi, 2, 4>()};
  attntune_plan::Prepared prepared;
  const attntune_plan::Plan& plan = prepared.plan;
  attntune_plan::Args args;  // launch 0's, to read its TmaMaps

  PlannedCall(const attntune_plan::FlashFwdWgmmaLaunch& consts, const AttnParams& p, int d, int causal)
      : c(consts), call(attntune_plan::dense_call(p, d, causal)) {
    call.window_left = p.variant.window_left;
    call.window_right = p.variant.window_right;
    call.softcap = p.variant.softcap;
    call.sinks = p.variant.sinks;
    attntune_plan::Why why;
    if (const int r = exec->prepare(attntune_plan::kFlashFwdWgmma, &c, funcs, call, nullptr, &prepared, &why)) {
      std::printf("prepare (%d): %s\n", r, why.text);
      std::exit(1);
    }
    if (attntune_plan::kFlashFwdWgmma.bind(&c, call, plan, prepared.res, 0, &args, &why)) {
      std::printf("bind: %s\n", why.text);
      std::exit(1);
    }
  }
  const att::TmaMaps& maps_arg() const { return *static_cast<const att::TmaMaps*>(args.ptr[1]); }
  void launch(cudaStream_t stream = nullptr) {
    attntune_plan::Why why;
    if (const int r = exec->launch(attntune_plan::kFlashFwdWgmma, &c, funcs, call, prepared, stream, &why)) {
      std::printf("launch (%d): %s\n", r, why.text);
      std::exit(1);
    }
  }
};

int main(int argc, char** argv) {
  if (argc < 2) { std::printf("usage: %s \"b,h,hkv,s,sk,layout[,time][;...]\"\n", argv[0]); return 2; }
  const int d = ATT_HEAD_DIM, bf16 = ATT_DTYPE_BF16, causal = ATT_CAUSAL;
  typedef att::Traits T;
  constexpr int kSmem = T::kSmemBytes;
  // The build's constants as the renderer would pass them: the macros this harness was built with.
  const attntune_plan::Define defines[] = {
      {"ATT_HEAD_DIM", ATT_HEAD_DIM}, {"ATT_DTYPE_BF16", ATT_DTYPE_BF16}, {"ATT_CAUSAL", ATT_CAUSAL},
      {"BLOCK_M", BLOCK_M}, {"BLOCK_N", BLOCK_N}, {"THREADS", T::kThreads}, {"SMEM_BYTES", kSmem},
      {"PERSISTENT", PERSISTENT}, {"WARP_SPECIALIZE", WARP_SPECIALIZE}, {"SPLIT_TAIL", SPLIT_TAIL},
      {"KV_MULTICAST", KV_MULTICAST}, {"ATT_WINDOW", ATT_WINDOW}, {"ATT_SOFTCAP", ATT_SOFTCAP},
      {"ATT_SINKS", ATT_SINKS}};
  attntune_plan::FlashFwdWgmmaLaunch built;
  attntune_plan::Why why;
  if (attntune_plan::FlashFwdWgmmaLaunch::load(defines, sizeof defines / sizeof defines[0], &built, &why)) {
    std::printf("constants: %s\n", why.text);
    return 1;
  }
  CK(cudaFuncSetAttribute(att::flash_fwd_wgmma, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  cudaFuncAttributes fa; CK(cudaFuncGetAttributes(&fa, att::flash_fwd_wgmma));
  const int persistent_mode = argc > 2 ? std::atoi(argv[2]) : 0;
  int fails = 0;
  std::vector<std::string> shapes;
  for (char* tok = std::strtok(argv[1], ";"); tok; tok = std::strtok(nullptr, ";")) shapes.push_back(tok);
  // kv_multicast builds run persistent only (their clusters pair a persistent grid's CTAs).
  for (int persistent = persistent_mode == 1 || T::kKvMulticast; persistent <= (persistent_mode >= 1 || T::kKvMulticast); ++persistent)
  for (const std::string& shape : shapes) {
    const char* tok = shape.c_str();
    int b, h, hkv, s, sk, layout, timed = 1;
    if (std::sscanf(tok, "%d,%d,%d,%d,%d,%d,%d", &b, &h, &hkv, &s, &sk, &layout, &timed) < 6) { std::printf("bad spec %s\n", tok); return 2; }
    size_t nq = (size_t)b * h * s * d, nk = (size_t)b * hkv * sk * d;
    unsigned short *q, *k, *v, *o; float *lse, *r32, *rlow, *lse32, *lselow; unsigned *stats;
    CK(cudaMalloc(&q, nq * 2)); CK(cudaMalloc(&k, nk * 2)); CK(cudaMalloc(&v, nk * 2)); CK(cudaMalloc(&o, nq * 2));
    CK(cudaMalloc(&lse, (size_t)b * h * s * 4)); CK(cudaMalloc(&r32, nq * 4)); CK(cudaMalloc(&rlow, nq * 4));
    CK(cudaMalloc(&lse32, (size_t)b * h * s * 4)); CK(cudaMalloc(&lselow, (size_t)b * h * s * 4)); CK(cudaMalloc(&stats, 32));
    static unsigned long long seed = 1;
    att_ref::fill_normal<<<1024, 256>>>(q, nq, seed++ * 11, bf16);
    att_ref::fill_normal<<<1024, 256>>>(k, nk, seed++ * 22, bf16);
    att_ref::fill_normal<<<1024, 256>>>(v, nk, seed++ * 33, bf16);
    CK(cudaMemset(o, 0xff, nq * 2)); CK(cudaMemset(lse, 0xff, (size_t)b * h * s * 4)); CK(cudaMemset(stats, 0, 32));
    AttnParams p = make(q, k, v, o, lse, b, h, hkv, s, sk, d, layout);
    float* sinks = nullptr;
    set_variants(p, h, &sinks);
    // The launch the tuner would make for this build, with this loop's persistence. Causal
    // persistent with a producer takes tiles from a counter (WGMMA_STATIC=1: round-robin);
    // split_tail builds share out the last partial round (WGMMA_SPLIT=0: not).
    attntune_plan::FlashFwdWgmmaLaunch consts = built;
    consts.persistent = persistent;
    consts.dynamic_tiles = persistent && T::kDynamicTiles && !(std::getenv("WGMMA_STATIC") && std::atoi(std::getenv("WGMMA_STATIC")) > 0);
    consts.split_tail = persistent && T::kSplitTail && !(std::getenv("WGMMA_SPLIT") && std::atoi(std::getenv("WGMMA_SPLIT")) == 0);
    consts.cluster = persistent ? built.cluster : 1;
    PlannedCall run(consts, p, d, causal);
    const att::TmaMaps& maps = run.maps_arg();
    if (maps.split_tail > 0 && std::getenv("WGMMA_SPLIT_LOG"))
      std::printf("split: %d tail tiles over %u CTAs\n", maps.split_tail, run.plan.launch[0].grid[0]);
    // WGMMA_BURN=seconds: no reference (the check fails by design); after the timing, the kernel
    // runs back to back that long between MARK lines, for power and clock sampling.
    const char* burn = std::getenv("WGMMA_BURN");
    dim3 rg((s + 7) / 8, h, b);
    if (!burn) {
      att_ref::attn_reference<<<rg, 256>>>(p, d, bf16, causal, 0, r32, lse32, nullptr);
      att_ref::attn_reference<<<rg, 256>>>(p, d, bf16, causal, 1, rlow, lselow, nullptr);
    }
    run.launch();
    att_ref::compare_outputs<<<256, dim3(32, 8)>>>(p, d, bf16, r32, rlow, lse32, stats, stats + 4);
    CK(cudaDeviceSynchronize());
    unsigned hs[8]; CK(cudaMemcpy(hs, stats, 32, cudaMemcpyDeviceToHost));
    float e_out, e_low, e_lse; std::memcpy(&e_out, &hs[0], 4); std::memcpy(&e_low, &hs[1], 4); std::memcpy(&e_lse, &hs[2], 4);
    const float atol = bf16 ? 1.0f / 512 : 1.0f / 4096;
    bool ok = hs[4] == 0 && hs[5] == 0 && e_out <= 2 * e_low + atol && e_lse < 1e-3f;
    fails += !ok;
    float us = 0, tf = 0;
    if (timed) {
      cudaStream_t stream; CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      for (int i = 0; i < 3; ++i) run.launch(stream);
      cudaGraph_t graph; cudaGraphExec_t exec;
      CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      for (int i = 0; i < 20; ++i) run.launch(stream);
      CK(cudaStreamEndCapture(stream, &graph));
      CK(cudaGraphInstantiate(&exec, graph, 0));
      for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(exec, stream));
      cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
      std::vector<float> ts;
      for (int i = 0; i < 30; ++i) {
        CK(cudaEventRecord(e0, stream)); CK(cudaGraphLaunch(exec, stream)); CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1)); float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); ts.push_back(ms / 20);
      }
      if (burn) {
        const auto now = [] { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); };
        const char* mark = std::getenv("WGMMA_MARK") ? std::getenv("WGMMA_MARK") : "ours";
        const double seconds = std::atof(burn), t0 = now();
        std::printf("MARK %s start %.3f\n", mark, t0);
        int graphs = 0;
        while (now() - t0 < seconds) {
          for (int i = 0; i < 10; ++i) CK(cudaGraphLaunch(exec, stream));
          CK(cudaStreamSynchronize(stream));
          graphs += 10;
        }
        const double t1 = now();
        std::printf("MARK %s end %.3f calls=%d us_per_call=%.1f\n", mark, t1, graphs * 20, (t1 - t0) / (graphs * 20) * 1e6);
      }
      std::sort(ts.begin(), ts.end());
      CK(cudaGraphExecDestroy(exec)); CK(cudaGraphDestroy(graph)); CK(cudaStreamDestroy(stream));
      CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1));
      const int left = p.variant.window_left, right = causal ? 0 : p.variant.window_right;
      double pairs = 0;
      for (int i = 0; i < s; ++i) {
        const int last = right >= 0 ? std::clamp(i + sk - s + right + 1, 0, sk) : sk;
        const int first = left >= 0 ? std::clamp(i + sk - s - left, 0, sk) : 0;
        pairs += std::max(0, last - first);
      }
      us = ts[15] * 1e3f;
      tf = (float)(4.0 * b * h * d * pairs / (ts[15] * 1e-3) / 1e12);
    }
    std::printf("WGMMA P=%d BM=%d BN=%d ST=%d WS=%d PP=%d OV=%d EMU=%d HG=%d NN=%d LR=%d regs=%d/%d/%d | b=%d h=%d hkv=%d s=%d sk=%d L=%d d=%d %s%s%s | err=%.3g low=%.3g lse=%.2g nf=%u lsebad=%u %s | %.1f us %.1f TF\n",
                persistent, BLOCK_M, BLOCK_N, STAGES, WARP_SPECIALIZE, PING_PONG, INTRA_WG_OVERLAP, EXP2_EMU, HEAD_GROUP, NARROW_N, LAZY_RESCALE, fa.numRegs, PRODUCER_REGS, CONSUMER_REGS,
                b, h, hkv, s, sk, layout, d, bf16 ? "bf16" : "fp16", causal ? " causal" : "", variant_words(p).c_str(), e_out, e_low, e_lse, hs[4], hs[5],
                ok ? "PASS" : "FAIL", us, tf);
    if ((maps.split_tail > 0 || maps.tile_count) && !burn) {  // the last launch's output, after the counters' reuse
      CK(cudaDeviceSynchronize());
      CK(cudaMemset(stats, 0, 32));
      att_ref::compare_outputs<<<256, dim3(32, 8)>>>(p, d, bf16, r32, rlow, lse32, stats, stats + 4);
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(hs, stats, 32, cudaMemcpyDeviceToHost));
      std::memcpy(&e_out, &hs[0], 4); std::memcpy(&e_low, &hs[1], 4); std::memcpy(&e_lse, &hs[2], 4);
      bool ok2 = hs[4] == 0 && hs[5] == 0 && e_out <= 2 * e_low + atol && e_lse < 1e-3f;
      int tc[2] = {0, 0};  // the dynamic tile counters: every launch leaves them at zero
      if (maps.tile_count) CK(cudaMemcpy(tc, maps.tile_count, sizeof tc, cudaMemcpyDeviceToHost));
      ok2 = ok2 && tc[0] == 0 && tc[1] == 0;
      fails += !ok2;
      std::printf("%s tail=%d counters=%d,%d err=%.3g low=%.3g lse=%.2g %s\n", maps.tile_count ? "DYNCHECK" : "SPLITCHECK",
                  maps.split_tail, tc[0], tc[1], e_out, e_low, e_lse, ok2 ? "PASS" : "FAIL");
    }
#if ATT_TRACE
    // -DATT_TRACE=1: one more launch, then where each warpgroup's work tiles spend their cycles
    // (kernel.cu: att_trace), means over the tiles that compute n_max iterations and are not a
    // CTA's first or last traced tile.
    if (timed && persistent) {
      static long long tr[att::kTraceCtas][att::kTraceWgs][att::kTraceTiles][att::kTraceEvents];
      std::memset(tr, 0, sizeof tr);
      CK(cudaMemcpyToSymbol(att::att_trace, tr, sizeof tr));
      run.launch();
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpyFromSymbol(tr, att::att_trace, sizeof tr));
      long long n_max = 0;
      for (auto& c : tr) for (auto& w : c) for (auto& t : w) n_max = std::max(n_max, t[6]);
      double sum[7] = {0}, cnt = 0, ns = 0;
      const unsigned ctas = std::min<unsigned>(run.plan.launch[0].grid[0], att::kTraceCtas);
      for (unsigned c = 0; c < ctas; ++c)
        for (int w = 0; w < T::kConsumerWgs && w < att::kTraceWgs; ++w)
          for (int k = 1; k + 1 < att::kTraceTiles; ++k) {
            const long long* e = tr[c][w][k];
            const long long* nx = tr[c][w][k + 1];
            if (e[6] != n_max || nx[0] == 0 || e[5] == 0) continue;
            sum[0] += nx[0] - e[0];  // the tile's cycle, entry to the next entry
            sum[1] += e[1] - e[0];   // the previous tile's stores and the Q wait
            sum[2] += e[2] - e[1];   // the first S and its softmax
            sum[3] += e[3] - e[2];   // the n-1 overlapped steps
            sum[4] += e[4] - e[3];   // the last P.V
            sum[5] += e[5] - e[4];   // the epilogue's packing
            sum[6] += nx[0] - e[5];  // to the next tile's entry
            cnt += 1;
            ns += nx[7] - e[7];
          }
      if (cnt > 0) {
        const double mhz = sum[0] / ns * 1e3, steps = n_max - 1;
        std::printf("TRACE n=%lld tiles=%.0f MHz=%.0f cycle=%.0f | entry-Q %.0f | first S+softmax %.0f | steps %.0f (%.1f each) | "
                    "last PV %.0f | pack %.0f | to next %.0f | outside the steps %.0f = %.2f steps = %.1f%%\n",
                    n_max, cnt, mhz, sum[0] / cnt, sum[1] / cnt, sum[2] / cnt, sum[3] / cnt, sum[3] / cnt / steps, sum[4] / cnt,
                    sum[5] / cnt, sum[6] / cnt, (sum[0] - sum[3]) / cnt, (sum[0] - sum[3]) / sum[3] * steps,
                    100 * (sum[0] - sum[3]) / sum[0]);
      }
    }
#endif
    std::fflush(stdout);
    cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(o); cudaFree(lse); cudaFree(r32); cudaFree(rlow); cudaFree(lse32); cudaFree(lselow); cudaFree(stats);
    if (sinks) cudaFree(sinks);
  }
  return fails ? 1 : 0;
}
