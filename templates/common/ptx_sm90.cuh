// Hopper (sm_90 / sm_90a) PTX wrappers: mbarriers, the tensor-memory accelerator (TMA), wgmma
// bookkeeping, named barriers, register reallocation and clusters. Header-free like ptx.cuh, so NVRTC
// compiles it with no include path. An addition: nothing in flash_fwd_mma includes it.
#ifndef ATTNTUNE_PTX_SM90_CUH
#define ATTNTUNE_PTX_SM90_CUH

#include "ptx.cuh"
#include "tma_desc.h"

namespace att {

typedef unsigned long long u64;

// ---- mbarriers (shared::cta, 64-bit) ----
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
// Makes the initialised barriers visible to the other threads and to the async proxy (TMA).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrives and announces `bytes` of transactions (TMA copies) that complete the phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Waits until the phase with parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  u32 done;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }\n"
        : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}

// The same value in every lane, and the compiler told so: a broadcast from lane 0 lets it keep
// what derives from v (loop bounds, ring stages, smem descriptors) in uniform registers and
// branches, as it does for blockIdx-derived values. A value derived from threadIdx or read from
// shared memory is per-thread to ptxas: every wgmma descriptor derived from it was moved to
// uniform registers before each wgmma, and the loops became divergent (-3% to -4.5%,
// docs/log/WGMMA.md run 8).
__device__ __forceinline__ int warp_uniform(int v) { return __shfl_sync(0xffffffffu, v, 0); }

// Stores that a predicate turns off: no branch, so no divergent path for the warp to reconverge.
__device__ __forceinline__ void st_global_v4_if(void* ptr, uint4 v, bool on) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n @p st.global.v4.b32 [%0], {%1, %2, %3, %4};\n}\n"
               ::"l"(ptr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"((int)on) : "memory");
}
__device__ __forceinline__ void st_global_f32_if(float* ptr, float v, bool on) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p st.global.f32 [%0], %1;\n}\n"
               ::"l"(ptr), "f"(v), "r"((int)on) : "memory");
}

// A 32-bit word of shared memory at a shared-window address.
__device__ __forceinline__ void st_shared_s32(u32 addr, int v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ int ld_shared_s32(u32 addr) {
  int v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

// 1/x to about 1 ulp, without the IEEE division's slow-path branch.
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- TMA ----
__device__ __forceinline__ void tma_prefetch_desc(const TmaDesc* desc) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(desc)) : "memory");
}
// One box of a 4-d tensor map into shared memory; completes `bytes` on mbarrier `bar`.
// Coordinates are in elements, innermost first; out-of-bounds elements are filled with zeros.
__device__ __forceinline__ void tma_load_4d(u32 dst, const TmaDesc* desc, u32 bar, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
      ::"r"(dst), "l"(reinterpret_cast<u64>(desc)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// The same over a 5-d map (flash_fwd_wgmma's k_perm: K's rows in pairs, launch_plan.h key_pairs_map).
__device__ __forceinline__ void tma_load_5d(u32 dst, const TmaDesc* desc, u32 bar, int c0, int c1, int c2, int c3,
                                            int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n"
      ::"r"(dst), "l"(reinterpret_cast<u64>(desc)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar)
      : "memory");
}

// ---- clusters (sm_90): TMA multicast, remote mbarrier arrives ----
// This CTA's rank in its cluster.
__device__ __forceinline__ u32 cluster_ctarank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of every CTA of the cluster waits for all the others: so that no CTA's remote
// arrive or multicast copy comes before its peer initialised the barriers (which
// fence.mbarrier_init.release.cluster publishes), and no CTA exits while its peer may still target
// its shared memory. Relaxed: with .release it cost a MEMBAR.ALL.GPU, and the order of other
// memory operations is the kernel's business (__syncthreads).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
}
// Every thread of every CTA of the cluster waits for all the others, and each CTA's shared-memory
// writes before it are visible to the others' reads after it (the barrier's default .release /
// .acquire): for data exchanged through distributed shared memory.
__device__ __forceinline__ void cluster_sync_acq_rel() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Loads from shared-memory offset `addr` of cluster CTA `cta` (mapa + ld.shared::cluster). Volatile
// with a memory clobber: the compiler must not hoist them above the cluster barrier.
__device__ __forceinline__ float ld_dsmem_f32(u32 addr, u32 cta) {
  float v;
  asm volatile("{\n .reg .b32 ra;\n mapa.shared::cluster.u32 ra, %1, %2;\n ld.shared::cluster.f32 %0, [ra];\n}\n"
               : "=f"(v)
               : "r"(addr), "r"(cta)
               : "memory");
  return v;
}
__device__ __forceinline__ float4 ld_dsmem_f32x4(u32 addr, u32 cta) {
  float4 v;
  asm volatile(
      "{\n .reg .b32 ra;\n mapa.shared::cluster.u32 ra, %4, %5;\n ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [ra];\n}\n"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
      : "r"(addr), "r"(cta)
      : "memory");
  return v;
}
// Arrives on the mbarrier at shared-memory offset `bar` of cluster CTA `cta` (mapa). The default
// .release.cta semantics, as CUTLASS's ClusterBarrier: .release.cluster made every arrive a
// cluster-wide fence and halved the kernel's speed (docs/log/WGMMA.md run 10).
__device__ __forceinline__ void mbar_arrive_cluster(u32 bar, u32 cta) {
  asm volatile("{\n .reg .b32 ra;\n mapa.shared::cluster.u32 ra, %0, %1;\n mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n"
               ::"r"(bar), "r"(cta) : "memory");
}
// tma_load_4d into the same shared-memory offset of every CTA in `cta_mask`, completing `bytes`
// on the mbarrier at offset `bar` of each.
__device__ __forceinline__ void tma_load_4d_multicast(u32 dst, const TmaDesc* desc, u32 bar, unsigned short cta_mask,
                                                      int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n"
      ::"r"(dst), "l"(reinterpret_cast<u64>(desc)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar), "h"(cta_mask)
      : "memory");
}

// ---- wgmma bookkeeping (sm_90a) ----
// Orders register writes by ordinary instructions before the wgmma that reads them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups of this warpgroup are still in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of accumulator registers across a wgmma wait
// or issue: the registers are "modified" here, in program order with the volatile asm around.
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void reg_fence(u32 (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// Shared-memory matrix descriptor for wgmma with the 128-byte swizzle (the layout TMA writes
// with CU_TENSOR_MAP_SWIZZLE_128B): start address, leading and stride byte offsets (>> 4),
// swizzle mode 1 (128B) in bits 62-63. Tiles must start 1024-byte aligned.
__device__ __forceinline__ u64 smem_desc_sw128(u32 addr, u32 lead_bytes, u32 stride_bytes) {
  return static_cast<u64>((addr & 0x3FFFF) >> 4) | (static_cast<u64>(lead_bytes >> 4) << 16) |
         (static_cast<u64>(stride_bytes >> 4) << 32) | (1ull << 62);
}

// ---- named barriers and register reallocation ----
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace att

#endif
