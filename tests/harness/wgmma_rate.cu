// Microbenchmark: the tensor-pipe rate of the wgmma shapes flash_fwd_wgmma issues, per SM, with
// one to three warpgroups per CTA issuing back to back (one CTA per SM, operands in shared memory
// or registers, values irrelevant). Prints FLOP per clock per SM (peak dense bf16: 4096).
// Build: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DATT_DTYPE_BF16=1 wgmma_rate.cu
#include <cstdio>
#include <cuda_runtime.h>
#include "../../templates/common/ptx_sm90.cuh"
#include "../../templates/flash_fwd_wgmma/wgmma.cuh"
using namespace att;

// MODE 0: SS m64nNk16 x steps; MODE 1: RS m64nNk16 x steps;
// MODE 2: the d=64 step: 4 SS m64n128k16 (Q.K^T) + 8 RS m64n64k16 (P.V) per round.
template <int N, int MODE>
__global__ void __launch_bounds__(384, 1) rate(int rounds, long long* cycles) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const u32 base = (smem_addr(smem) + 1023) & ~1023u;
  const u64 da = smem_desc_sw128(base, 16, 1024), db = smem_desc_sw128(base + 16384, 16, 1024);
  float acc[N / 2];
  float acc2[64];
  float acc3[32];
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.f;
  for (int i = 0; i < 64; ++i) acc2[i] = 0.f;
  for (int i = 0; i < 32; ++i) acc3[i] = 0.f;
  u32 a[4] = {threadIdx.x, threadIdx.x * 3u, 7u, 9u};
  __syncthreads();
  const long long t0 = clock64();
  for (int r = 0; r < rounds; ++r) {
    wgmma_fence();
    if constexpr (MODE == 0) {
#pragma unroll
      for (int k = 0; k < 8; ++k) Wgmma<N>::ss(acc, da + 2 * k, db + 2 * k, 1);
    } else if constexpr (MODE == 1) {
#pragma unroll
      for (int k = 0; k < 8; ++k) Wgmma<N>::rs(acc, a, db + 2 * k, 1);
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) Wgmma<128>::ss(acc2, da + 2 * k, db + 2 * k, 1);
#pragma unroll
      for (int k = 0; k < 8; ++k) Wgmma<64>::rs(acc3, a, db + 2 * k, 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
  }
  const long long t1 = clock64();
  float s = 0;
  for (int i = 0; i < N / 2; ++i) s += acc[i];
  for (int i = 0; i < 64; ++i) s += acc2[i];
  for (int i = 0; i < 32; ++i) s += acc3[i];
  if (s == 12345.f) cycles[1] = 1;
  if (threadIdx.x == 0 && blockIdx.x == 0) cycles[0] = t1 - t0;
}

template <int N, int MODE>
void run(const char* name, int wgs) {
  long long* d;
  cudaMalloc(&d, 16);
  const int rounds = 2000, smem = 64 * 1024;
  cudaFuncSetAttribute(rate<N, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  int sms;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  rate<N, MODE><<<sms, 128 * wgs, smem>>>(10, d);
  rate<N, MODE><<<sms, 128 * wgs, smem>>>(rounds, d);
  long long c;
  cudaMemcpy(&c, d, 8, cudaMemcpyDeviceToHost);
  const double flop = MODE == 2 ? 2.0 * 64 * 16 * (4 * 128 + 8 * 64) : 2.0 * 64 * N * 16 * 8;
  std::printf("RATE %-22s wgs=%d  %.0f FLOP/clk/SM (%s)\n", name, wgs, flop * rounds * wgs / c,
              cudaGetErrorString(cudaGetLastError()));
  cudaFree(d);
}

int main() {
  for (int w = 1; w <= 3; ++w) {
    run<64, 0>("SS m64n64k16", w);
    run<128, 0>("SS m64n128k16", w);
    run<192, 0>("SS m64n192k16", w);
    run<256, 0>("SS m64n256k16", w);
    run<64, 1>("RS m64n64k16", w);
    run<128, 1>("RS m64n128k16", w);
    run<64, 2>("d64 step 4xSS128+8xRS64", w);
  }
}
