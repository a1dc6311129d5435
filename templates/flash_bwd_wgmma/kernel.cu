// flash_bwd_wgmma: attention backward (dQ, dK, dV) for Hopper (sm_90a) with wgmma: the algorithm of
// flash_bwd_mma (templates/flash_bwd_mma/kernel.cu: K and V resident a key block, the transposed
// score tile, dQ by fp32 reductions), its five matrix products a step as warpgroup MMAs
// (wgmma.mma_async m64nNk16) reading Q, dO, K, V and dS^T from 128-byte-swizzled shared memory by
// descriptor, P^T and dS^T from registers. Three kernels, launched in order by launch.h:
//   flash_bwd_preprocess  (templates/common/bwd_prepost.cuh) D = rowsum(dO * O), LSE * log2(e), dQ's
//                         fp32 accumulator zeroed;
//   flash_bwd_wgmma       one CTA per (block of kBlockN keys, KV head, batch), one warpgroup per 64
//                         keys (wgmma's M): it walks the query blocks of every query head of its KV
//                         head, dK and dV of its keys in registers;
//   flash_bwd_convert     (bwd_prepost.cuh) dQ = scale * accumulator, in the input dtype (bulk
//                         builds: from the fragment order, Traits::dq_offset).
//
// A step (one query block of one query head), per warpgroup w (keys 64w .. 64w + 63 of the block):
//   S^T  = K_w Q^T       wgmma SS, A = K (K-major), B = Q (K-major)          [64 x kBlockM]
//   dP^T = V_w dO^T      wgmma SS, A = V, B = dO                             [64 x kBlockM]
//   P^T = exp2(S^T * scale * log2(e) - LSE * log2(e)),  dS^T = P^T o (dP^T - D)   (registers)
//   dV_w += P^T dO       wgmma RS, A = P^T from registers, B = dO (N-major: head dims contiguous)
//   dK_w += dS^T Q       wgmma RS, A = dS^T, B = Q
//   dS^T -> shared memory (the block's keys x the step's queries), then, after a barrier,
//   dQ += dS K           wgmma SS with both operands transposed (dS^T and K as stored), each
//                        warpgroup a share of dQ's columns, added into the fp32 accumulator by
//                        red.global.add.v2.f32.
// Tiles come by cp.async, written in the 128-byte swizzle the descriptors read (and TMA would
// write): issued by every thread kStages - 1 steps ahead, a CTA barrier at each step's top; or
// (Traits::kProducer) by a producer warpgroup that publishes each stage on an mbarrier, the
// consumer warpgroups meeting only where dQ needs both's dS^T.
// Masked pairs (causal, window) have P = 0; rows past seqlen_q have LSE +inf and zero dO; keys past
// seqlen_k are zero rows whose dK/dV are not stored (and whose P is masked: exp2(-LSE) can overflow).
#include "../common/bwd_blocks.h"
#include "../common/bwd_params.h"
#include "../common/ptx_sm90.cuh"
#include "../flash_fwd_wgmma/args.h"   // wgmma_tile: descriptors and k-step offsets
#include "../flash_fwd_wgmma/wgmma.cuh"
#include "traits.cuh"
#include "wgmma_kn.cuh"  // head dim 256: dV's and dK's products with P^T and dS^T from shared memory

namespace att {

using T = Traits;

}  // namespace att

#include "../common/bwd_prepost.cuh"  // flash_bwd_preprocess, flash_bwd_convert

namespace att {

namespace bwd_wg {

// Byte offset of 16-byte chunk j of row `row` in a tile of kRows rows: column block j / 8 (64
// elements), rows of 128 bytes, the chunk XORed with row % 8 (the 128-byte swizzle).
template <int kRows>
__device__ __forceinline__ u32 tile_off(int row, int j) {
  return static_cast<u32>((j >> 3) * (kRows * T::kRowBytes) + row * T::kRowBytes + (((j & 7) ^ (row & 7)) << 4));
}

// cp.async of rows [row0, row0 + kRows) of a (rows, kHeadDim) slice into the tile at `tile` by
// kLoaders threads (this one is `tid` of them); rows at or past row_end, and the columns past the
// problem's head dim (Traits::kPadded), are zero-filled.
template <int kRows, int kLoaders>
__device__ __forceinline__ void load_rows(u32 tile, const elem_t* gmem, long long row_stride, int row0, int row_end,
                                          int tid) {
  constexpr int kChunks = T::kHeadDim / 8;
  static_assert((kRows * kChunks) % kLoaders == 0, "whole passes of the loading threads");
#pragma unroll
  for (int it = 0; it < kRows * kChunks / kLoaders; ++it) {
    const int idx = tid + it * kLoaders;
    const int row = idx / kChunks, c = idx % kChunks;
    const bool valid = row0 + row < row_end && (!T::kPadded || c * 8 < T::kHeadDimReal);
    const elem_t* src = valid ? gmem + (row0 + row) * row_stride + c * 8 : gmem;
    cp_async_16(tile + tile_off<kRows>(row, c), src, valid);
  }
}

// load_rows for the producer warpgroup's kLoaders threads, which have 24 registers: the thread
// keeps one chunk column (tid % kChunks) and steps down the rows kLoaders / kChunks at a time (a
// multiple of 8, so the swizzle's row % 8 stays put), one source pointer advanced a pass, not a
// pointer a copy.
template <int kRows, int kLoaders>
__device__ __forceinline__ void load_rows_lean(u32 tile, const elem_t* gmem, long long row_stride, int row0, int row_end,
                                               int tid) {
  constexpr int kChunks = T::kHeadDim / 8, kPass = kLoaders / kChunks;
  static_assert(kPass % 8 == 0 && kRows % kPass == 0, "whole passes of 8-row swizzle atoms");
  const int c = tid % kChunks, r = tid / kChunks;
  const u32 dst = tile + tile_off<kRows>(r, c);
  const elem_t* src = gmem + (row0 + r) * row_stride + c * 8;
  const int rows_left = row_end - row0 - r;
  const bool col_ok = !T::kPadded || c * 8 < T::kHeadDimReal;
#pragma unroll 1
  for (int it = 0; it < kRows / kPass; ++it) {
    const bool valid = col_ok && it * kPass < rows_left;
    cp_async_16(dst + it * kPass * T::kRowBytes, valid ? src : gmem, valid);
    src += kPass * row_stride;
  }
}

// A tile's rows by the kernel's loaders: the producer warpgroup's (lean) or every thread's.
template <int kRows, int kLoaders>
__device__ __forceinline__ void tile_rows(u32 tile, const elem_t* gmem, long long row_stride, int row0, int row_end,
                                          int tid) {
  if constexpr (T::kProducer) load_rows_lean<kRows, kLoaders>(tile, gmem, row_stride, row0, row_end, tid);
  else load_rows<kRows, kLoaders>(tile, gmem, row_stride, row0, row_end, tid);
}

// kBlockM floats (a 16-byte-aligned workspace row) into shared memory, by the loading threads
// lane0 .. lane0 + kBlockM / 4 (this one is `tid`).
__device__ __forceinline__ void load_floats(u32 dst, const float* src, int lane0, int tid) {
  const int t = tid - lane0;
  if (t >= 0 && t < T::kBlockM / 4) cp_async_16(dst + t * 16, src + t * 4, true);
}

// Orders this thread's shared-memory writes (st.shared, cp.async) before wgmma's reads of them
// (the async proxy); a barrier then makes every thread's visible.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void st_shared_u32(u32 addr, u32 v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// Four 8x8 matrices of 16-bit values into shared memory (stmatrix): register j of each thread is
// matrix j's row lane / 4, columns 2 (lane % 4) and + 1; lane l gives the address of matrix l / 8's
// row l % 8 (16 contiguous bytes).
__device__ __forceinline__ void stmatrix_x4(u32 addr, const u32 (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}

// Adds `bytes` of fp32 values from shared memory into global memory, by the TMA unit (a bulk
// reduction of this thread's bulk group), and commits the group.
__device__ __forceinline__ void bulk_reduce_add(float* dst, u32 src, int bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
               "cp.async.bulk.commit_group;\n" ::"l"(dst), "r"(src), "r"(bytes)
               : "memory");
}
// Waits until this thread's bulk groups have read their shared-memory sources.
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

// `bytes` (a multiple of 16) of contiguous global memory into shared memory (both 16-byte aligned) by
// the TMA unit, a 1-d bulk copy completing `bytes` on mbarrier `bar` (tma_loads: the LSE and D rows).
__device__ __forceinline__ void bulk_load_1d(u32 dst, const void* src, u32 bytes, u32 bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(dst), "l"(reinterpret_cast<u64>(src)), "r"(bytes), "r"(bar)
               : "memory");
}

__device__ __forceinline__ u64 desc(u32 addr, u32 lead, u32 stride) {
  return wgmma_tile::desc(addr, lead, stride, T::kRowBytes);
}

}  // namespace bwd_wg

// ---- the main loop ----------------------------------------------------------------------------
// grid (ceil(seqlen_k / kBlockN), heads_kv, batch), kThreads = 128 a warpgroup; the order the CTAs
// take its blocks in: Traits::kLongestFirst.
// Builds with TMA loads (Traits::kTmaLoads) take Q's and dO's tensor maps as a second argument.
#if defined(TMA_LOADS) && TMA_LOADS
#define ATT_BWD_MAPS_PARAM , const __grid_constant__ BwdMaps maps
#else
#define ATT_BWD_MAPS_PARAM
#endif
extern "C" __global__ void __launch_bounds__(T::kThreads, 1) flash_bwd_wgmma(const BwdParams p ATT_BWD_MAPS_PARAM) {
  using namespace bwd_wg;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const u32 raw = smem_addr(smem_raw);
  const u32 base = (raw + 1023) & ~1023u;
  const u32 s_k = base, s_v = base + T::kOffV, s_q = base + T::kOffQ, s_do = base + T::kOffDo, s_ds = base + T::kOffDs,
            s_p = base + T::kOffP;
  const float* lse_s = reinterpret_cast<const float*>(smem_raw + (base - raw) + T::kOffLse);
  const float* dp_s = reinterpret_cast<const float*>(smem_raw + (base - raw) + T::kOffDp);

  const AttnParams& f = p.fwd;
  // The CTA's key block, KV head and batch (bwd_prepost.cuh's bwd_cta: the grid's order, longest
  // first, or a packed batch's sorted order).
  bool none;
  const att_bwd::CtaBlock cta = bwd_cta<T>(p, &none);
  if (none) return;  // a slot past a packed batch's key blocks
  const int key_block = cta.key_block, hk = cta.y, b = cta.z;
  const int n0 = key_block * T::kBlockN;
  const BwdSeq seq = bwd_seq(p, b);  // bwd_prepost.cuh: the sequence's lengths and offsets
  const int len_q = seq.len_q, len_k = seq.len_k, diag = len_k - len_q;
  if (kBwdVarlen && n0 >= len_k) return;  // past the sequence's keys (the grid covers the longest)
  const int wg = warp_uniform(static_cast<int>(threadIdx.x) / 128);
  const int wi = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // The thread's accumulator rows: keys key_w and key_w + 8 of the block. Head dim 256 (kColSplit 2):
  // both warpgroups hold the block's 64 keys, warpgroup wg the step's queries q_w .. q_w + kSdpN - 1
  // in S^T and dP^T and the head dims col_w .. col_w + kDkvN - 1 of dK and dV.
  const int key_wg = T::kColSplit > 1 ? 0 : wg * 64;  // the warpgroup's first key of the block
  const int key_w = key_wg + wi * 16 + g;
  const int q_w = T::kColSplit > 1 ? wg * T::kSdpN : 0;
  const int col_w = T::kColSplit > 1 ? wg * T::kDkvN : 0;

  // The query rows that see any key of the block: causal and windows bound them.
  int row_begin, row_end, m_first, m_blocks;
  att_bwd::key_block_rows<T::kCausal, T::kWindow>(n0, T::kBlockN, len_q, diag, f.variant, &row_begin, &row_end);
  att_bwd::query_blocks(row_begin, row_end, T::kBlockM, &m_first, &m_blocks);
  const int steps = m_blocks * f.q_per_kv;  // (query head of the group, query block) pairs
  // A step's query head and first query row (bwd_blocks.h's walk: up, heads outer; down, query
  // blocks outer, in the deterministic mode): from a cursor each loop carries through its steps in
  // order (att_bwd::Walk, step_of; Traits::kWalkCursorLoads and kWalkCursorSteps), or by a divide a step (step_at).
  const att_bwd::Walk walk0 = att_bwd::walk_begin(p.deterministic, f.q_per_kv, m_first, m_blocks);
  auto step_of = [&](const att_bwd::Walk& w, int* head, int* m0) {
    int h, m;
    att_bwd::walk_at(w, &h, &m);
    *head = hk * f.q_per_kv + h;
    *m0 = m * T::kBlockM;
  };
  // (step_at is not step_of(walk_seek(walk0, i)): that form, the same values, builds other machine
  // code for the builds that keep the divide, whose timing is main's: tools/sass_diff.py, 2026-12-02.)
  auto step_at = [&](int i, int* head, int* m0) {
    int h, m;
    att_bwd::walk_step(i, p.deterministic, f.q_per_kv, m_first, m_blocks, &h, &m);
    *head = hk * f.q_per_kv + h;
    *m0 = m * T::kBlockM;
  };

  // The loads, by kLoaders threads (this one is `tid`): K and V of the block's keys once, then step
  // i's (query head, first row) Q, dO, LSE and D rows into stage i % kStages. The loaders are the producer
  // warpgroup's 128 threads, or without one every thread of the CTA.
  constexpr int kLoaders = T::kProducer ? 128 : T::kThreads;
  auto load_kv = [&](int tid) {
    tile_rows<T::kBlockN, kLoaders>(s_k, static_cast<const elem_t*>(f.k) + bwd_offset(f.k_stride, b, hk, seq.k0),
                                    f.k_stride[2], n0, len_k, tid);
    tile_rows<T::kBlockN, kLoaders>(s_v, static_cast<const elem_t*>(f.v) + bwd_offset(f.v_stride, b, hk, seq.k0),
                                    f.v_stride[2], n0, len_k, tid);
  };
  auto load_step = [&](int tid, int i, int head, int m0) {
    const int st = i % T::kStages;
    tile_rows<T::kBlockM, kLoaders>(s_q + st * T::kQBytes,
                                    static_cast<const elem_t*>(f.q) + bwd_offset(f.q_stride, b, head, seq.q0),
                                    f.q_stride[2], m0, len_q, tid);
    tile_rows<T::kBlockM, kLoaders>(s_do + st * T::kQBytes,
                                    static_cast<const elem_t*>(p.dout) + bwd_offset(p.do_stride, b, head, seq.q0),
                                    p.do_stride[2], m0, len_q, tid);
    const long long row_base = bwd_ws_row(p, seq, b, head) + m0;
    load_floats(base + T::kOffLse + st * T::kBlockM * 4, p.lse_log2 + row_base, 0, tid);
    load_floats(base + T::kOffDp + st * T::kBlockM * 4, p.dpsum + row_base, T::kBlockM / 4, tid);
  };
  // Without a producer every thread loads, kStages - 1 steps ahead (a cp.async group a step).
  // (T::kWalkCursorLoads: load_walk is at step i when issue(i) is called, for steps 0, 1, 2, ... in
  // order; otherwise step i is sought by a divide.)
  att_bwd::Walk load_walk = walk0;
  auto issue = [&](int i) {
    if (i < steps) {
      int head, m0;
      if constexpr (T::kWalkCursorLoads) {
        step_of(load_walk, &head, &m0);
        att_bwd::walk_next(load_walk);
      } else {
        step_at(i, &head, &m0);
      }
      load_step(static_cast<int>(threadIdx.x), i, head, m0);
    }
    cp_async_commit();
  };
  // With one (Traits::kProducer), stage st is published on full[st] (the kLoaders threads, each once
  // its loads have landed; with TMA loads the one issuing thread's expected bytes) and released on
  // empty[st] (each consumer warp once it is done with it). With TMA loads K and V are published on
  // kv_full.
  const u32 bar_full = base + T::kOffBar, bar_empty = bar_full + T::kStages * 8, bar_kv = bar_empty + T::kStages * 8;
  if constexpr (T::kProducer) {
    if (threadIdx.x == 0) {
#pragma unroll
      for (int st = 0; st < T::kStages; ++st) {
        mbar_init(bar_full + st * 8, T::kTmaLoads ? 1 : kLoaders);
        mbar_init(bar_empty + st * 8, T::kWarpgroups * 4);
      }
      if constexpr (T::kTmaLoads) mbar_init(bar_kv, kLoaders);
      mbar_init_fence();
    }
    __syncthreads();
    if (threadIdx.x >= T::kConsumerThreads) {
      if constexpr (T::kSetMaxNReg) setmaxnreg_dec<T::kProducerRegs>();
      const int tid = static_cast<int>(threadIdx.x) - T::kConsumerThreads;
      load_kv(tid);  // landed with step 0's loads (TMA loads: published on kv_full)
#if defined(TMA_LOADS) && TMA_LOADS
      cp_async_commit();
      cp_async_wait<0>();
      fence_async_smem();
      mbar_arrive(bar_kv);
      if (tid == 0) {
        // Step i's Q and dO boxes (column block c: 64 columns from 64c, kBlockM rows from m0, the
        // query head, the batch) and its LSE and D rows (workspace rows, 16-byte aligned: the query
        // block divides seqlen_q_rounded), on full[st] once step i - kStages has released the stage.
        constexpr u32 kBytes = 2 * T::kQBytes + 2 * T::kBlockM * 4;
        att_bwd::Walk w = walk0;
        for (int i = 0; i < steps; ++i, att_bwd::walk_next(w)) {
          const int st = i % T::kStages;
          if (i >= T::kStages) mbar_wait(bar_empty + st * 8, (i / T::kStages - 1) & 1);
          int head, m0;
          step_of(w, &head, &m0);
          const u32 full = bar_full + st * 8;
          mbar_arrive_expect_tx(full, kBytes);
#pragma unroll
          for (int c = 0; c < T::kDBlocks; ++c) {
            tma_load_4d(s_q + st * T::kQBytes + c * T::kQColBlockBytes, &maps.q, full, c * T::kCols, m0, head, b);
            tma_load_4d(s_do + st * T::kQBytes + c * T::kQColBlockBytes, &maps.dout, full, c * T::kCols, m0, head, b);
          }
          const long long row_base = bwd_ws_row(p, seq, b, head) + m0;
          bulk_load_1d(base + T::kOffLse + st * T::kBlockM * 4, p.lse_log2 + row_base, T::kBlockM * 4, full);
          bulk_load_1d(base + T::kOffDp + st * T::kBlockM * 4, p.dpsum + row_base, T::kBlockM * 4, full);
        }
      }
      return;
#endif
      // One step's loads in flight at a time, the ring ahead as far as the consumers let it: a step's
      // loads land in well under a step's products, and each is published the moment it has.
      att_bwd::Walk w = walk0;
      for (int i = 0; i < steps; ++i, att_bwd::walk_next(w)) {
        const int st = i % T::kStages;
        if (i >= T::kStages) mbar_wait(bar_empty + st * 8, (i / T::kStages - 1) & 1);  // step i - kStages done
        int head, m0;
        step_of(w, &head, &m0);
#if defined(ATT_BWD_ABLATE) && ATT_BWD_ABLATE == 3
        if (i < T::kStages)  // (harness builds only: the ring filled once, then no loads)
#endif
        load_step(tid, i, head, m0);
        cp_async_commit();
        cp_async_wait<0>();
        fence_async_smem();  // this thread's copies, before the consumers' wgmmas read them
        mbar_arrive(bar_full + st * 8);
      }
      cp_async_wait<0>();  // (K and V's copies, where the block has no step to wait for them)
      return;
    }
    if constexpr (T::kSetMaxNReg) setmaxnreg_inc<T::kConsumerRegs>();
    if constexpr (T::kTmaLoads) mbar_wait(bar_kv, 0);  // K and V landed (the producer fenced them)
  } else {
    load_kv(static_cast<int>(threadIdx.x));
    cp_async_commit();
#pragma unroll
    for (int i = 0; i < T::kStages - 1; ++i) issue(i);
  }

#if defined(ATT_BWD_ABLATE) && ATT_BWD_ABLATE == 8
  // (harness builds only: 7, and consumer warpgroup 1 starts ATT_BWD_SKEW_CYCLES later, so that the
  // two run out of phase when no barrier brings them together)
  if (threadIdx.x >= 128 && threadIdx.x < T::kConsumerThreads) {
    const long long t0 = clock64();
    while (clock64() - t0 < ATT_BWD_SKEW_CYCLES) {
    }
  }
#endif
  float acc_dk[T::kDkvN / 2], acc_dv[T::kDkvN / 2];
#pragma unroll
  for (int e = 0; e < T::kDkvN / 2; ++e) acc_dk[e] = acc_dv[e] = 0.f;

  // Descriptors: K and V K-major as S^T's and dP^T's A (the warpgroup's 64 rows); Q and dO
  // K-major as their B (N = the step's queries) and N-major as dK's and dV's B (N = head dims
  // across the column blocks: the leading offset steps a column block, the stride an atom).
  const u64 k_desc = desc(s_k + key_wg * T::kRowBytes, 16, T::kAtomBytes);
  const u64 v_desc = desc(s_v + key_wg * T::kRowBytes, 16, T::kAtomBytes);

  // dQ += dS K: unit u of the warpgroup is query group qg (64 rows: wgmma's M, dS^T's column block
  // qg, M-major) times kDqN head dims from cg * kDqN (K's column blocks, N-major); k-steps over the
  // block's keys. dq_issue starts it (one wgmma group); dq_finish, after the wait, adds it into the
  // accumulator.
  auto dq_issue = [&](int u, u32 ds_t, float (&acc_dq)[T::kDqN / 2]) {
    const int unit = wg * T::kDqUnits + u, qg = unit / T::kDqSplit, cg = unit % T::kDqSplit;
    const u64 a_desc = desc(ds_t + qg * T::kKColBlockBytes, T::kKColBlockBytes, T::kAtomBytes);
    const u64 b_desc = desc(s_k + (cg * T::kDqN / T::kCols) * T::kKColBlockBytes, T::kKColBlockBytes, T::kAtomBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < T::kBlockN / 16; ++kk) {
      const u64 off = (kk * 16 * T::kRowBytes) >> 4;
      Wgmma<T::kDqN>::ss_tt(acc_dq, a_desc + off, b_desc + off, kk > 0);
    }
    wgmma_commit();
  };
  auto dq_finish = [&](int u, int head, int m0, const float (&acc_dq)[T::kDqN / 2]) {
#if defined(ATT_BWD_ABLATE) && ATT_BWD_ABLATE == 2
    if (acc_dq[0] != 12345.f) return;
#endif
    const int unit = wg * T::kDqUnits + u, qg = unit / T::kDqSplit, cg = unit % T::kDqSplit;
    const long long row0 = bwd_ws_row(p, seq, b, head) + m0 + qg * 64;
    const int r = threadIdx.x % 128;
    // The deterministic mode (p.deterministic, uniform): the CTAs that add into this query block's
    // dQ take turns in key-block order (bwd_blocks.h, as flash_bwd_mma's), each of its units (a
    // warpgroup's columns) adding once a turn, so every element's sum is the same sequence of fp32
    // additions every run. The counter counts units: this one waits until all kUnits of every lower
    // CTA that walks the block have added. No deadlock: a CTA waits only for lower key blocks of its
    // (batch, KV head), launched before it (in either order) and so resident or done, which wait
    // only for lower ones in turn.
    // The additions are reductions then (red.v4 into the accumulator's own order for bulk builds:
    // a bulk reduction's completion is not a release the next CTA could acquire).
    constexpr int kUnits = T::kWarpgroups * T::kDqUnits;
    int* sem = nullptr;
    if (p.deterministic) {
      sem = p.dq_semaphore + (bwd_ws_row(p, seq, b, head) + m0) / T::kBlockM;
      if (r == 0) {
        const int turn = key_block -
                         att_bwd::first_key_block<T::kWindow>(m0, T::kBlockN, diag, f.variant.window_left);
        while (ld_acquire(sem) < turn * kUnits) {
        }
      }
      named_bar_sync(1 + wg, 128);
    }
    if (T::kDqBulk && !p.deterministic) {
      // Stage the unit in fragment order (float4 j4 of thread r at (j4 * 128 + r) * 16 bytes: a
      // warp's stores are 512 consecutive bytes), then one thread adds it, 64 * kDqN floats, to the
      // unit's place in the accumulator (Traits::dq_offset).
      const u32 stage = base + T::kOffDqStage + (wg * T::kDqUnits + u) * T::kDqStageBytes;
#if defined(ATT_BWD_ABLATE) && ATT_BWD_ABLATE == 5
      if (acc_dq[0] == 12345.f)  // (harness builds only: the bulk reduction of a stale staging)
#endif
#pragma unroll
      for (int j4 = 0; j4 < T::kDqN / 8; ++j4)
        asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(stage + (j4 * 128 + r) * 16),
                     "f"(acc_dq[4 * j4]), "f"(acc_dq[4 * j4 + 1]), "f"(acc_dq[4 * j4 + 2]), "f"(acc_dq[4 * j4 + 3])
                     : "memory");
      fence_async_smem();
      named_bar_sync(1 + wg, 128);
#if defined(ATT_BWD_ABLATE) && ATT_BWD_ABLATE == 4
      if (acc_dq[0] == 12345.f)  // (harness builds only: staged, not added)
#endif
      if (r == 0)
        bulk_reduce_add(p.dq_accum + (row0 - qg * 64) * T::kHeadDim + (qg * T::kDqSplit + cg) * 64 * T::kDqN, stage,
                        T::kDqStageBytes);
    } else if (T::kDqFragmentOrder) {
      float* unit_acc = p.dq_accum + (row0 - qg * 64) * T::kHeadDim + (qg * T::kDqSplit + cg) * 64 * T::kDqN;
#pragma unroll
      for (int j4 = 0; j4 < T::kDqN / 8; ++j4)
        add_quad(unit_acc + (j4 * 128 + r) * 4, acc_dq[4 * j4], acc_dq[4 * j4 + 1], acc_dq[4 * j4 + 2],
                 acc_dq[4 * j4 + 3]);
    } else {
      float* dq = p.dq_accum + (row0 + wi * 16 + g) * T::kHeadDim + cg * T::kDqN + 2 * t;
#pragma unroll
      for (int c = 0; c < T::kDqN / 8; ++c) {
        add_pair2(dq + c * 8, acc_dq[4 * c], acc_dq[4 * c + 1]);
        add_pair2(dq + 8 * T::kHeadDim + c * 8, acc_dq[4 * c + 2], acc_dq[4 * c + 3]);
      }
    }
    if (p.deterministic) {
      __threadfence();                  // this thread's additions performed before the turn passes on,
      named_bar_sync(1 + wg, 128);      // every thread's of the unit,
      if (r == 0) add_release(sem, 1);  // then one more unit of the turn done
    }
  };
  // Deferred dQ (Traits::kDqDefer): the step whose dQ is in flight, and its accumulators.
  float acc_dq_next[T::kDqN / 2];
  int dq_head = -1, dq_m0 = 0;

  att_bwd::Walk walk = walk0;
  for (int i = 0; i < steps; ++i, att_bwd::walk_next(walk)) {
    int head, m0;
    if constexpr (T::kWalkCursorSteps) step_of(walk, &head, &m0);
    else step_at(i, &head, &m0);
    const int st = i % T::kStages;
    const u32 q_t = s_q + st * T::kQBytes, do_t = s_do + st * T::kQBytes;
    if constexpr (T::kProducer) {
      mbar_wait(bar_full + st * 8, (i / T::kStages) & 1);  // step i's tiles landed (the producer fenced them)
    } else {
      // Step i's tiles complete and visible to wgmma, and every warpgroup past step i - 1 (its
      // wgmmas waited for), whose stage then takes step i + kStages - 1's loads.
      cp_async_wait<T::kStages - 2>();
      fence_async_smem();
      __syncthreads();
      if constexpr (!T::kLateLoads) issue(i + T::kStages - 1);
    }

    // S^T = K_w Q^T and dP^T = V_w dO^T.
    float acc_s[T::kSdpN / 2], acc_dp[T::kSdpN / 2];
    {
      // (Head dim 256: the warpgroup's kSdpN query rows, from a whole atom of the tiles.)
      const u64 q_desc = desc(q_t + q_w * T::kRowBytes, 16, T::kAtomBytes),
                do_desc = desc(do_t + q_w * T::kRowBytes, 16, T::kAtomBytes);
      // wg_skew: the turn after the other warpgroup's dQ of step i - 1 (warpgroup 0's first is free).
      if constexpr (T::kWgSkew) {
        if (wg == 1 || i > 0) named_bar_sync(T::kBarTurn + wg, T::kConsumerThreads);
      }
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < T::kHeadDim / 16; ++kk) {
        const u64 a_off = wgmma_tile::qk_step_bytes(kk, T::kCols, T::kKColBlockBytes) >> 4;
        const u64 b_off = wgmma_tile::qk_step_bytes(kk, T::kCols, T::kQColBlockBytes) >> 4;
        Wgmma<T::kSdpN>::ss(acc_s, k_desc + a_off, q_desc + b_off, kk > 0);
      }
      if constexpr (T::kSdpSplit) wgmma_commit();  // S^T's own group
#pragma unroll
      for (int kk = 0; kk < T::kHeadDim / 16; ++kk) {
        const u64 a_off = wgmma_tile::qk_step_bytes(kk, T::kCols, T::kKColBlockBytes) >> 4;
        const u64 b_off = wgmma_tile::qk_step_bytes(kk, T::kCols, T::kQColBlockBytes) >> 4;
        Wgmma<T::kSdpN>::ss(acc_dp, v_desc + a_off, do_desc + b_off, kk > 0);
      }
      wgmma_commit();
      if constexpr (T::kWgSkew) named_bar_arrive(T::kBarTurn + (wg ^ 1), T::kConsumerThreads);  // the other's turn
      // late_loads (head dim 256): the stage of step i - 1 (every thread is past it: the barrier
      // above) takes step i + kStages - 1's loads while S^T and dP^T run.
      if constexpr (T::kLateLoads) issue(i + T::kStages - 1);
      if constexpr (!T::kSdpSplit) wgmma_wait<0>();  // (kSdpSplit: waited for one at a time below)
      if constexpr (T::kDqDefer) {
        // Step i - 1's dQ (the group before S^T's and dP^T's), done with them. (Waiting for it alone,
        // wait_group 1, would leave S^T and dP^T running through its addition, but ptxas then
        // serialises the kernel's wgmmas: 417 against 460 TFLOP/s, run 196.)
        if (i > 0) {
          reg_fence(acc_dq_next);
          dq_finish(0, dq_head, dq_m0, acc_dq_next);
        }
      }
      if constexpr (!T::kSdpSplit) {
        reg_fence(acc_s);
        reg_fence(acc_dp);
      }
    }

    // P^T (in acc_s) and dS^T (in acc_dp): accumulator element 4c + e is key key_w + 8 (e / 2),
    // query q_w + 8c + 2t + e % 2 of the step. Masked only in a tile that crosses the diagonal, a
    // window's bound or the last keys.
    bool masked = n0 + T::kBlockN > len_k;
    if (T::kCausal) masked = masked || n0 + T::kBlockN - 1 > m0 + diag;
    if constexpr (T::kWindow) {
      if (f.variant.window_left >= 0) masked = masked || n0 < m0 + T::kBlockM - 1 + diag - f.variant.window_left;
      if (!T::kCausal && f.variant.window_right >= 0)
        masked = masked || n0 + T::kBlockN - 1 > m0 + diag + f.variant.window_right;
    }
    const float* lse_t = lse_s + st * T::kBlockM + q_w;
    const float* dp_t = dp_s + st * T::kBlockM + q_w;
    // P^T's element 4c + e zeroed in a masked tile where its key is out of its query's sight. A macro,
    // not a lambda: a lambda over the same test built other machine code (register allocation,
    // sass_diff), and both of sdp_split's ways share it.
#define ATT_BWD_MASK_PV(pv, c, e)                                                                   \
  if (masked) {                                                                                     \
    const int key = n0 + key_w + ((e) >> 1) * 8;                                                    \
    const int row = m0 + q_w + (c) * 8 + 2 * t + ((e) & 1);                                         \
    const int off = key - row; /* visible when lo <= off <= hi */                                   \
    bool visible = key < len_k;                                                                     \
    if (T::kCausal) visible = visible && off <= diag;                                               \
    if constexpr (T::kWindow) {                                                                     \
      if (f.variant.window_left >= 0) visible = visible && off >= diag - f.variant.window_left;     \
      if (!T::kCausal && f.variant.window_right >= 0) visible = visible && off <= diag + f.variant.window_right; \
    }                                                                                               \
    pv = visible ? pv : 0.f;                                                                        \
  }
    if constexpr (T::kSdpSplit) {
      // P^T once S^T is done (dP^T still running), then dS^T. (LSE and D read into arrays ahead of
      // the waits spilled 16 bytes at q_stages 2.)
      wgmma_wait<1>();  // S^T
      reg_fence(acc_s);
#if defined(ATT_BWD_ABLATE) && ATT_BWD_ABLATE == 6
      if (acc_s[0] == 12345.f)  // (harness builds only: no P^T arithmetic)
#endif
#pragma unroll
      for (int c = 0; c < T::kSdpN / 8; ++c) {
        const float2 lse2 = *reinterpret_cast<const float2*>(lse_t + c * 8 + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float dcap;
          float pv = bwd_prob<false>(acc_s[4 * c + e], (e & 1) ? lse2.y : lse2.x, f, dcap);
          ATT_BWD_MASK_PV(pv, c, e);
          acc_s[4 * c + e] = pv;
        }
      }
      // (ptxas places dP^T's wait after ~3 of the 32 ex2s, here and with each way of the mask in a
      // branch of its own alike: CUDA 13.0, 2026-11-30.)
      wgmma_wait<0>();  // dP^T
      reg_fence(acc_dp);
#if defined(ATT_BWD_ABLATE) && ATT_BWD_ABLATE == 6
      if (acc_dp[0] == 12345.f)  // (harness builds only: no dS^T arithmetic)
#endif
#pragma unroll
      for (int c = 0; c < T::kSdpN / 8; ++c) {
        const float2 dp2 = *reinterpret_cast<const float2*>(dp_t + c * 8 + 2 * t);  // (an array of them spilled)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dp[4 * c + e] = acc_s[4 * c + e] * (acc_dp[4 * c + e] - ((e & 1) ? dp2.y : dp2.x));
      }
    } else
#pragma unroll
    for (int c = 0; c < T::kSdpN / 8; ++c) {
      const float2 lse2 = *reinterpret_cast<const float2*>(lse_t + c * 8 + 2 * t);
      const float2 dp2 = *reinterpret_cast<const float2*>(dp_t + c * 8 + 2 * t);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float lse = (e & 1) ? lse2.y : lse2.x, dsum = (e & 1) ? dp2.y : dp2.x;
        float dcap;
        float pv = bwd_prob<T::kSoftcap>(acc_s[4 * c + e], lse, f, dcap);
        ATT_BWD_MASK_PV(pv, c, e);
        acc_s[4 * c + e] = pv;
        acc_dp[4 * c + e] = pv * (acc_dp[4 * c + e] - dsum) * dcap;  // dcap 1 without a soft-cap
      }
    }

#undef ATT_BWD_MASK_PV

    // P^T and dS^T as wgmma A fragments (k-step kk: queries 16kk .. 16kk + 15, the accumulator's
    // 8-column chunks 2kk and 2kk + 1), in the dtype.
    u32 ap[T::kSdpN / 16][4], ads[T::kSdpN / 16][4];
#pragma unroll
    for (int kk = 0; kk < T::kSdpN / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        ap[kk][r] = pack2<T::kBf16>(acc_s[8 * kk + 2 * r], acc_s[8 * kk + 2 * r + 1]);
        ads[kk][r] = pack2<T::kBf16>(acc_dp[8 * kk + 2 * r], acc_dp[8 * kk + 2 * r + 1]);
      }

    // A tile of P^T or dS^T to shared memory, [query block of 64][key][64 queries] swizzled, by one
    // stmatrix of four 8x8 matrices a k-step (the accumulator's fragment is stmatrix's): a[kk][0]
    // and a[kk][2] are key key_w, a[kk][1] and a[kk][3] key key_w + 8; a[kk][0], a[kk][1] queries
    // q_w + 16kk + 2t (+1), a[kk][2], a[kk][3] 8 further. Lane l gives the row address of matrix
    // l / 8, row l % 8: key key_s (the warp's 16 keys, + 8 for matrices 1 and 3) and the 16-byte
    // chunk of queries q_w + 16kk + 8 (l / 16). A k-step moves the chunk by 2 (bits 1-2 of its index,
    // clear in the lane's base: q_w is 0 or, at head dim 256, 32 with kSdpN 32), so the swizzle's XOR
    // is the base's XOR (kk & 3) << 5, and every 64 queries a column block further.
    static_assert(T::kColSplit == 1 || T::kSdpN <= 32, "the chunk's k-step bits are clear in the base");
    auto store_t = [&](u32 tile, const u32 (&a)[T::kSdpN / 16][4]) {
      if constexpr (T::kStoreStmatrix) {
        // (From threadIdx.x here: a base held across the loop cost a register, and spills. The
        // consumers are threads 0 .. kConsumerThreads - 1: key_s = key_wg + wi * 16 + lane % 16.)
        const u32 x = threadIdx.x;
        const u32 key_s = ((x >> 1) & (T::kColSplit > 1 ? 0x30u : ~15u)) | (x & 15);
        const u32 st_base = key_s * T::kRowBytes + (((((q_w & 63) >> 3) + ((x >> 4) & 1)) ^ (x & 7)) << 4);
#pragma unroll
        for (int kk = 0; kk < T::kSdpN / 16; ++kk)
          stmatrix_x4(tile + ((st_base ^ ((kk & 3) << 5)) + (kk >> 2) * T::kKColBlockBytes), a[kk]);
      } else {  // a soft-cap, red or deferred dQ: 32-bit stores (Traits::kStoreStmatrix)
#pragma unroll
        for (int kk = 0; kk < T::kSdpN / 16; ++kk)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int key = key_w + (r & 1) * 8, q = q_w + kk * 16 + (r >> 1) * 8 + 2 * t;
            st_shared_u32(tile + (q >> 6) * T::kKColBlockBytes + key * T::kRowBytes +
                              ((((q & 63) >> 3) ^ (key & 7)) << 4) + (q & 7) * 2,
                          a[kk][r]);
          }
      }
    };
    // dS^T's buffer (two: buffer i % 2, the other one still read by step i - 1's dQ, deferred, or
    // by the other warpgroup's, where no CTA barrier at the step's top waits for it).
    const u32 ds_t = s_ds + (T::kTwoDs ? (i & 1) * T::kDsBytes : 0);

    if constexpr (T::kColSplit > 1) {
      // Head dim 256: P^T and dS^T of both warpgroups' queries through shared memory, then each
      // warpgroup's half of the head dims: dV += P^T dO and dK += dS^T Q with A K-major (keys x
      // queries, as stored) and B N-major, and dQ += dS K (its half of dQ's columns) in the same
      // wait. The barrier at the next step's top keeps P^T and dS^T until every warpgroup's wgmmas
      // have read them.
      store_t(s_p, ap);
      store_t(ds_t, ads);
      fence_async_smem();
      __syncthreads();  // P^T and dS^T complete
      auto dkv_issue = [&] {
        const u64 p_desc = desc(s_p, 16, T::kAtomBytes), ds_desc = desc(ds_t, 16, T::kAtomBytes);
        const u64 do_mn = desc(do_t + col_w / T::kCols * T::kQColBlockBytes, T::kQColBlockBytes, T::kAtomBytes);
        const u64 q_mn = desc(q_t + col_w / T::kCols * T::kQColBlockBytes, T::kQColBlockBytes, T::kAtomBytes);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < T::kBlockM / 16; ++kk)
          WgmmaKN<T::kDkvN>::ss(acc_dv, p_desc + (wgmma_tile::qk_step_bytes(kk, T::kCols, T::kKColBlockBytes) >> 4),
                                do_mn + ((kk * 16 * T::kRowBytes) >> 4), 1);
#pragma unroll
        for (int kk = 0; kk < T::kBlockM / 16; ++kk)
          WgmmaKN<T::kDkvN>::ss(acc_dk, ds_desc + (wgmma_tile::qk_step_bytes(kk, T::kCols, T::kKColBlockBytes) >> 4),
                                q_mn + ((kk * 16 * T::kRowBytes) >> 4), 1);
        wgmma_commit();
      };
#if defined(ATT_BWD_ABLATE) && ATT_BWD_ABLATE == 1
      dkv_issue();
      wgmma_wait<0>();
      continue;  // (harness builds only: dQ left out, for timing where the step's time goes)
#endif
      // dQ first, so that its additions run while dV's and dK's wgmmas do (run 220: +7% against dQ
      // last; the additions are what the step waits for: without them 450 TFLOP/s against 261, run
      // 218, which is why quad's red.v4 halves red's instructions here, +22%, run 219).
      float acc_dq[T::kDqN / 2];
      dq_issue(0, ds_t, acc_dq);
      dkv_issue();
      wgmma_wait<1>();
      reg_fence(acc_dq);
      dq_finish(0, head, m0, acc_dq);
      wgmma_wait<0>();
      reg_fence(acc_dv);
      reg_fence(acc_dk);
      continue;
    }

    if constexpr (T::kFa4Order) {
      // FA4's order: each product waited for alone, the barrier and dQ's addition under the others.
      // Groups in flight: dV; then dV, dQ; dQ, dK; dK.
      const u64 do_mn = desc(do_t, T::kQColBlockBytes, T::kAtomBytes), q_mn = desc(q_t, T::kQColBlockBytes, T::kAtomBytes);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < T::kBlockM / 16; ++kk)
        Wgmma<T::kDkvN>::rs(acc_dv, ap[kk], do_mn + ((kk * 16 * T::kRowBytes) >> 4), 1);
      wgmma_commit();
      store_t(ds_t, ads);  // dS^T while dV runs
      fence_async_smem();
      if (T::kDqBulk && threadIdx.x % 128 == 0) bulk_wait_read();  // the dQ staging's last bulk read
#if defined(ATT_BWD_ABLATE) && (ATT_BWD_ABLATE == 7 || ATT_BWD_ABLATE == 8)
      named_bar_sync(1 + wg, 128);  // (harness builds only: no consumers' barrier, each warpgroup's own)
#else
      named_bar_sync(T::kBarConsumers, T::kConsumerThreads);      // every warpgroup's dS^T complete
#endif
      float acc_dq[T::kDqN / 2];
      dq_issue(0, ds_t, acc_dq);
      wgmma_wait<1>();  // dV
      reg_fence(acc_dv);
      reg_fence(ap);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < T::kBlockM / 16; ++kk)
        Wgmma<T::kDkvN>::rs(acc_dk, ads[kk], q_mn + ((kk * 16 * T::kRowBytes) >> 4), 1);
      wgmma_commit();
      wgmma_wait<1>();  // dQ
      reg_fence(acc_dq);
      dq_finish(0, head, m0, acc_dq);  // staged and added while dK runs
      wgmma_wait<0>();  // dK
      reg_fence(acc_dk);
      reg_fence(ads);
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_empty + st * 8);  // this warp is done with the stage
      continue;
    }

    // dV += P^T dO, dK += dS^T Q (scaled at the end), P^T and dS^T from registers: k-step kk is 16
    // query rows of the N-major tiles. One wgmma group (the plain step's, and the skewed step's turn).
    auto dkv_issue_rs = [&] {
      const u64 do_mn = desc(do_t, T::kQColBlockBytes, T::kAtomBytes), q_mn = desc(q_t, T::kQColBlockBytes, T::kAtomBytes);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < T::kBlockM / 16; ++kk)
        Wgmma<T::kDkvN>::rs(acc_dv, ap[kk], do_mn + ((kk * 16 * T::kRowBytes) >> 4), 1);
#pragma unroll
      for (int kk = 0; kk < T::kBlockM / 16; ++kk)
        Wgmma<T::kDkvN>::rs(acc_dk, ads[kk], q_mn + ((kk * 16 * T::kRowBytes) >> 4), 1);
      wgmma_commit();
    };

    if constexpr (T::kWgSkew) {
      // The skewed step: dV and dK in this warpgroup's turn (after the other's S^T and dP^T), dS^T
      // stored while they run and the turn passed on; dQ in the next turn, which the other gives
      // once its dV and dK are issued and its dS^T stored (so dQ reads both); then one wait for the
      // three. On the tensor pipe: S^T, dP^T of warpgroup 0, of 1, dV, dK of 0, of 1, dQ of 0, of 1,
      // and while one's run the other computes P^T and dS^T (or stages its dQ). The turns order the
      // dS^T buffers too: a warpgroup stores step i + 1's after the other has issued its S^T and dP^T
      // of step i + 1, so after it waited for its dQ of step i.
      named_bar_sync(T::kBarTurn + wg, T::kConsumerThreads);  // the other's S^T and dP^T issued
      dkv_issue_rs();
      store_t(ds_t, ads);
      fence_async_smem();
      named_bar_arrive(T::kBarTurn + (wg ^ 1), T::kConsumerThreads);  // dV, dK issued and dS^T stored
      if (T::kDqBulk && threadIdx.x % 128 == 0) bulk_wait_read();     // the dQ staging's last bulk read
      named_bar_sync(T::kBarTurn + wg, T::kConsumerThreads);  // the other's dV, dK issued and its dS^T stored
      float acc_dq[T::kDqN / 2];
      dq_issue(0, ds_t, acc_dq);
      // The other's S^T and dP^T of step i + 1 next (none after the last step: no arrival left over).
      if (wg == 0 || i + 1 < steps) named_bar_arrive(T::kBarTurn + (wg ^ 1), T::kConsumerThreads);
      wgmma_wait<0>();
      reg_fence(acc_dv);
      reg_fence(acc_dk);
      reg_fence(ap);
      reg_fence(ads);
      reg_fence(acc_dq);
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_empty + st * 8);  // this warp is done with the stage
      dq_finish(0, head, m0, acc_dq);
      continue;
    }

    dkv_issue_rs();

    // dS^T to shared memory while they run.
    store_t(ds_t, ads);
    fence_async_smem();
    if (T::kDqBulk && threadIdx.x % 128 == 0) bulk_wait_read();  // the dQ staging's last bulk read
    wgmma_wait<0>();
    reg_fence(acc_dv);
    reg_fence(acc_dk);
    reg_fence(ap);
    reg_fence(ads);
    if constexpr (T::kProducer) {
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_empty + st * 8);  // this warp is done with the stage
      named_bar_sync(T::kBarConsumers, T::kConsumerThreads);  // dS^T complete
    } else {
      __syncthreads();  // dS^T complete
    }

#if defined(ATT_BWD_ABLATE) && ATT_BWD_ABLATE == 1
    continue;  // (harness builds only: dQ left out, for timing where the step's time goes)
#endif
    if constexpr (T::kDqDefer) {
      // Issued now, finished in step i + 1 after its S^T and dP^T (or after the loop): the MMA runs
      // through the barrier, the loads' issue and the next products' issue (run 196: +7.8%).
      dq_issue(0, ds_t, acc_dq_next);
      dq_head = head;
      dq_m0 = m0;
    } else {
#pragma unroll
      for (int u = 0; u < T::kDqUnits; ++u) {
        float acc_dq[T::kDqN / 2];
        dq_issue(u, ds_t, acc_dq);
        wgmma_wait<0>();
        reg_fence(acc_dq);
        dq_finish(u, head, m0, acc_dq);
      }
    }
  }
  if constexpr (T::kDqDefer) {
#if defined(ATT_BWD_ABLATE) && ATT_BWD_ABLATE == 1
    const bool issued = dq_head >= 0;  // (the ablation issued no dQ)
#else
    constexpr bool issued = true;
#endif
    if (steps > 0 && issued) {
      wgmma_wait<0>();
      reg_fence(acc_dq_next);
      dq_finish(0, dq_head, dq_m0, acc_dq_next);
    }
  }

  if (T::kDqBulk && threadIdx.x % 128 == 0) bulk_wait_read();  // the staging outlives its reads

  // dK (scaled) and dV of the block's keys, in the dtype: element 4c + e is key key_w + 8 (e / 2),
  // head dims 8c + 2t (+1).
  elem_t* dk = static_cast<elem_t*>(p.dk) + bwd_offset(p.dk_stride, b, hk, seq.k0);
  elem_t* dv = static_cast<elem_t*>(p.dv) + bwd_offset(p.dv_stride, b, hk, seq.k0);
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    const int key = n0 + key_w + h2 * 8;
    if (key < len_k) {
#pragma unroll
      for (int c = 0; c < T::kDkvN / 8; ++c) {
        const int col = col_w + c * 8 + 2 * t;
        if (T::kPadded && col >= T::kHeadDimReal) continue;  // a padded column
        *reinterpret_cast<u32*>(dk + key * p.dk_stride[2] + col) =
            pack2<T::kBf16>(acc_dk[4 * c + 2 * h2] * f.scale, acc_dk[4 * c + 2 * h2 + 1] * f.scale);
        *reinterpret_cast<u32*>(dv + key * p.dv_stride[2] + col) =
            pack2<T::kBf16>(acc_dv[4 * c + 2 * h2], acc_dv[4 * c + 2 * h2 + 1]);
      }
    }
  }
}

}  // namespace att
