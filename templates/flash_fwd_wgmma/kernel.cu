// flash_fwd_wgmma: FlashAttention-3-class forward attention for Hopper (sm_90a).
//
// One CTA owns kBlockM query rows of one (batch, head); 64 rows per consumer warpgroup (wgmma is
// m64). K and V tiles arrive by TMA (cp.async.bulk.tensor; column blocks swizzled over 128, 64 or
// 32 bytes as the head dim allows: args.h, wgmma_tile) into two rings of
// kStages shared-memory tiles, each stage guarded by a "full" mbarrier (TMA bytes landed) and an
// "empty" one (every consumer warp done reading). Per K/V tile j a consumer warpgroup runs
//   S = Q K_j^T           wgmma, A (Q) and B (K) from shared memory
//   P = online softmax(S)  in registers, fp32; O rescaled by the row max change
//   O += P V_j            wgmma, A (P, packed to 16 bit) from registers, B (V) N-major in smem
// Kv tiles go from the last to the first, so the masked ones (causal diagonal, sequence end)
// come first. Options (traits.cuh): a producer warpgroup with setmaxnreg, ping-pong of two
// consumer warpgroups, intra-warpgroup overlap of softmax(j) with P_{j-1} V_{j-1}, and K/V tiles
// multicast to a 2-CTA cluster.
#include "../common/attn_params.h"
#include "../common/ptx_sm90.cuh"
#include "args.h"
#include "epilogue.cuh"
#include "mainloop.cuh"
#include "scheduler.h"
#include "smem.cuh"
#include "traits.cuh"
#include "work_tiles.cuh"

namespace att {

// Grid: one CTA per work tile, (ceil(seqlen_q / block_m), heads_q, batch) (GQA-packed:
// (ceil(seqlen_q / pack_rows), heads_kv, batch), work_tiles.cuh); or persistent, any
// number of CTAs (the SM count): CTA c then takes work tiles c, c + CTAs, ... in turn, and the
// producer loads the next tile's Q and K/V while the consumers finish the current one.
// Block T::kThreads, dynamic smem T::kSmemBytes. With kKvMulticast the grid runs in clusters of
// two (the launcher makes it even) and the query blocks are padded to pairs.
#if KV_MULTICAST
#define ATT_CLUSTER_DIMS __cluster_dims__(2, 1, 1)
#else
#define ATT_CLUSTER_DIMS
#endif
extern "C" __global__ void __launch_bounds__(T::kThreads, 1) ATT_CLUSTER_DIMS
flash_fwd_wgmma(const AttnParams p, const __grid_constant__ TmaMaps maps) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const Smem sm = Smem::at(smem_raw);

  const int m_blocks = sched::query_blocks(p.seqlen_q, tile_rows(maps), T::kCluster);
  // Varlen: the packed index space's tiles (launch.h), one CTA each or a persistent grid.
  const int tiles = T::kVarlen ? maps.varlen_tiles : m_blocks * tile_heads(p) * p.batch;
  const int ctas = gridDim.x * gridDim.y * gridDim.z;
  const int first_tile = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);

  if (threadIdx.x == 0) {
    mbar_init(sm.q_full(), 1);
    mbar_init(sm.q_empty(), T::kConsumerWgs * 4);  // one arrive per consumer warp
    if constexpr (T::kScheduleInSmem) split_pieces(p, maps, sm, first_tile, ctas, tiles, m_blocks);
    for (int st = 0; st < T::kStages; ++st) {
      // An FP8 cache's stages fill by the converters' warps (an arrive each), not by TMA (unless
      // it was converted before this kernel: maps.kv_dequantised).
      const bool converted = T::kKvFp8 && !maps.kv_dequantised;
      mbar_init(sm.k_full(st), converted ? T::kConverters / 32 : 1);
      mbar_init(sm.v_full(st), converted ? T::kConverters / 32 : 1);
      mbar_init(sm.k_empty(st), T::kConsumerWgs * 4 * T::kCluster);  // and the peer's warps (kKvMulticast)
      mbar_init(sm.v_empty(st), T::kConsumerWgs * 4 * T::kCluster);
    }
    if constexpr (T::kKvFp8) {
      for (int v = 0; v < 2; ++v) {
        mbar_init(sm.raw_full(v), 1);
        mbar_init(sm.raw_empty(v), T::kConverters / 32);
      }
      st_shared_s32(sm.raw_end(), 0);
    }
    mbar_init_fence();
  }
  __syncthreads();
  if constexpr (T::kKvMulticast) cluster_sync();  // the peer's barriers are ready for its copies and arrives

  // Producer side for one work tile: K/V iteration 0 (into a stage the previous tile freed),
  // then Q once the consumers are done with the previous tile's, then the other iterations
  // (all of them with a producer warpgroup; without, the first `stages` and the consumer loop
  // issues the rest).
  // A split tail piece loads only its iterations [w.lo, w.hi) (count = w.hi - w.lo with a producer).
  // Dynamic tiles: tile index `index` goes to the consumers before the Q load; with count 0 (a
  // tile without keys, or the end mark) q_full gets a plain arrive instead. Else index is unused.
  auto produce_tile = [&](const WorkTile& w, int it_base, u32 q_phase, int count, int index) {
    const int kv_head = T::kPackGqa ? w.head : w.head / p.q_per_kv;
    it_base -= w.lo;
    const bool loads = !T::kDynamicTiles || count > 0;  // the static schedules pass no empty tile
    const int kv_batch = T::kVarlen ? w.k0 : w.batch;  // varlen: the sequence's first key row
    const int len_k = T::kSeqLens ? w.len_k : p.seqlen_k;
    if (loads) produce(sm, maps, p, it_base, w.lo, w.kv_end_tile(), kv_head, kv_batch, len_k);
    mbar_wait(sm.q_empty(), q_phase ^ 1);
    if (T::kDynamicTiles) st_shared_s32(sm.sched(), index);
    if (loads) load_q(sm, maps, p, w.m_block, w.head, w.batch, T::kVarlen ? w.q0 : 0);
    else mbar_arrive(sm.q_full());
    for (int it = w.lo + 1; it < w.lo + count; ++it)
      produce(sm, maps, p, it_base, it, w.kv_end_tile(), kv_head, kv_batch, len_k);
  };
  // Dynamic tiles (causal, persistent, with a producer): after its first tile (the CTA's index)
  // the producer takes the next one from the counter once it has issued the current tile's last
  // load, so that the CTAs that finish first take the next longest tiles (without a counter:
  // round-robin). Every tile, those without keys and the end mark (an index >= tiles) included,
  // passes through q_full; the consumers read its index there.

  if constexpr (T::kWarpSpecialize) {
    const int wg = threadIdx.x / 128;
    if (wg == 0) {
      setmaxnreg_dec<T::kProducerRegs>();
      if (threadIdx.x == 0) {
        tma_prefetch_desc(&maps.q);
        tma_prefetch_desc(&maps.k);
        tma_prefetch_desc(&maps.v);
        int it_base = 0;
        u32 q_phase = 0;
        WorkTile w{};
        if constexpr (T::kDynamicTiles) {
          int* const counter = maps.tile_count;
          const int units = work_units(maps, tiles);  // the tiles, or with the causal split its pieces too
          for (int t = first_tile; t < units;) {
            w = unit_tile(p, maps, t, tiles, m_blocks);
            produce_tile(w, it_base, q_phase, w.hi - w.lo, t);
            q_phase ^= 1;
            it_base += w.hi - w.lo;
            // t back from shared memory: kept in a register through the loads, the producer spilled.
            t = counter ? ctas + atomicAdd(counter, 1) : ld_shared_s32(sm.sched()) + ctas;
          }
          produce_tile(w, it_base, q_phase, 0, units);  // the end mark
          if (T::kKvFp8 && !maps.kv_dequantised) raw_end_mark(sm, it_base);  // and the converters'
          // The last CTA to be done with the counter resets both for the next launch.
          if (counter) {
            __threadfence();
            if (atomicAdd(counter + 1, 1) == ctas - 1) {
              atomicExch(counter, 0);
              atomicExch(counter + 1, 0);
            }
          }
        } else {
          for (int next = first_tile; next_item(p, maps, sm, first_tile, ctas, tiles, m_blocks, next, w);) {
            if (w.n == 0) continue;
            produce_tile(w, it_base, q_phase, w.hi - w.lo, -1);
            it_base += w.hi - w.lo;
            q_phase ^= 1;
          }
          if (T::kKvFp8 && !maps.kv_dequantised) raw_end_mark(sm, it_base);
        }
      } else if (T::kKvFp8 && !maps.kv_dequantised && threadIdx.x >= 32) {
        convert_loop(sm, static_cast<int>(threadIdx.x) - 32);
      }
    } else {
      setmaxnreg_inc<T::kConsumerRegs>();
      const int cw = T::kWgUniform ? warp_uniform(wg - 1) : wg - 1;  // (traits.cuh: kWgUniform)
      if (T::kPingPong && cw == T::kConsumerWgs - 1)  // warpgroup 0 goes first
        named_bar_arrive(T::kNamedPingPong, T::kPingPongThreads);
      int it_base = 0, trace_k = 0;
      u32 q_phase = 0;
      OutRows out{};
      bool had = false;
      WorkTile w;
      for (int next = first_tile;;) {
        if constexpr (T::kDynamicTiles) {
          mbar_wait(sm.q_full(), q_phase);
          const int t = warp_uniform(ld_shared_s32(sm.sched()));
          if (t >= work_units(maps, tiles)) break;
          w = unit_tile(p, maps, t, tiles, m_blocks);
        } else if (!next_item(p, maps, sm, first_tile, ctas, tiles, m_blocks, next, w)) {
          break;
        }
        consume(p, sm, maps, cw, w, it_base, q_phase, out, had, trace_k++);
        if (T::kDynamicTiles && w.n == 0 && threadIdx.x % 32 == 0) mbar_arrive(sm.q_empty());  // its index read
        had = true;
        it_base += w.hi - w.lo;
        q_phase ^= T::kDynamicTiles || w.n > 0;
      }
      epilogue_store(p, out, had);
      if (T::kPingPong && cw == 0)  // the last warpgroup's final arrive
        named_bar_sync(T::kNamedPingPong, T::kPingPongThreads);
    }
  } else {
    int it_base = 0;
    u32 q_phase = 0;
    OutRows out{};
    bool had = false;
    WorkTile w;
    for (int next = first_tile; next_item(p, maps, sm, first_tile, ctas, tiles, m_blocks, next, w);) {
      if (threadIdx.x == 0 && w.n > 0) produce_tile(w, it_base, q_phase, min(w.n, T::kStages), -1);
      consume(p, sm, maps, T::kWgUniform ? warp_uniform(threadIdx.x / 128) : threadIdx.x / 128, w, it_base, q_phase, out,
              had);
      had = true;
      it_base += w.n;
      q_phase ^= w.n > 0;
    }
    epilogue_store(p, out, had);
  }
  if constexpr (T::kKvMulticast) cluster_sync();  // the peer may still arrive on this CTA's barriers
}

// ---- the order of a varlen call's work tiles (launch.h: the launch before the main kernel) ----
// One CTA of kVarlenOrderThreads threads, thread i for sequence i: its rank by key count
// (descending; ties by index, so the order is deterministic), the sequences in that order into
// order[0, batch), and each one's first work tile, the exclusive prefix sum of the tile counts
// (ceil(len_q / kBlockM) * heads_q) in that order, into order[batch, 2 * batch + 1). Every build
// has this entry point (a family's kernels are the same in every build); it does something in a
// varlen build only, and the plan launches it only there, for at most kVarlenOrderThreads
// sequences.
extern "C" __global__ void __launch_bounds__(kVarlenOrderThreads)
flash_fwd_wgmma_varlen_order(const AttnParams p, int* order) {
  if constexpr (T::kVarlen) {
    __shared__ int keys[kVarlenOrderThreads], scan[kVarlenOrderThreads];
    const int i = threadIdx.x, n = p.batch;
    if (!order || n < 1 || n > kVarlenOrderThreads) return;
    const int key = i < n ? p.cu_seqlens_k[i + 1] - p.cu_seqlens_k[i] : 0;
    // A GQA-packed build's tiles: pack_rows query rows of a KV head's group (scheduler.h).
    const int rows = T::kPackGqa ? sched::pack_rows(T::kBlockM, p.q_per_kv) : T::kBlockM;
    const int heads = T::kPackGqa ? p.heads_kv : p.heads_q;
    const int tiles = i < n ? (p.cu_seqlens_q[i + 1] - p.cu_seqlens_q[i] + rows - 1) / rows * heads : 0;
    keys[i] = key;
    scan[i] = 0;
    __syncthreads();
    int rank = 0;
    if (i < n)
      for (int j = 0; j < n; ++j) rank += keys[j] > key || (keys[j] == key && j < i);
    __syncthreads();
    if (i < n) {
      order[rank] = i;
      scan[rank] = tiles;
    }
    __syncthreads();
    for (int off = 1; off < kVarlenOrderThreads; off <<= 1) {  // inclusive scan (Hillis-Steele)
      const int v = i >= off ? scan[i - off] : 0;
      __syncthreads();
      scan[i] += v;
      __syncthreads();
    }
    if (i < n) order[n + i] = i == 0 ? 0 : scan[i - 1];
    if (i == 0) order[2 * n] = scan[n - 1];
  }
}

// ---- an FP8 cache converted once, before the main kernel (launch.h: launch 0) ----
// A call with several query tiles a KV head would have each tile's producer warps convert every
// K/V tile it reads again (the whole cache once per query tile: 0.61x the bf16 cache's time at
// b4 h32/8 s2048 sk10240, H200 2026-11-30). This kernel converts the keys each sequence has
// (cache_seqlens; through the page table) once, exactly (common/fp8.cuh), into a 16-bit copy in the
// plan's workspace, K [batch][heads_kv][seqlen_k][head_dim] then V (args.h, kv_dequant_v_offset),
// unscaled: the main kernel reads it as a contiguous cache and applies the scales as before. Rows
// past a sequence's keys are not written (the main kernel masks them). Grid (ceil(seqlen_k *
// heads_kv * chunks / kKvDequantThreads), batch), a thread per 16 bytes of a cache row (the row's
// K chunks, then its V chunks). Every build has this entry point; it does something in an FP8
// build only, and only with its workspace.
extern "C" __global__ void __launch_bounds__(kKvDequantThreads)
flash_fwd_wgmma_kv_dequant(const AttnParams p, unsigned char* ws) {
  if constexpr (T::kKvFp8) {
    if (!ws) return;
    constexpr int kKChunks = T::kHeadDim / 16, kChunks = kKChunks + T::kHeadDimV / 16;
    const int b = blockIdx.y;
    const long long idx = static_cast<long long>(blockIdx.x) * kKvDequantThreads + threadIdx.x;
    const int c = static_cast<int>(idx % kChunks);
    const long long rest = idx / kChunks;
    const int h = static_cast<int>(rest % p.heads_kv);
    const long long j = rest / p.heads_kv;
    const int len = p.cache_seqlens ? min(max(__ldg(p.cache_seqlens + b), 0), p.seqlen_k) : p.seqlen_k;
    if (j >= len) return;
    const bool v = c >= kKChunks;
    const int cc = v ? c - kKChunks : c;
    const long long* stride = v ? p.v_stride : p.k_stride;  // bytes (an FP8 element is one)
    long long row;
    if (p.block_table) {
      const int page = static_cast<int>(j / p.page_size);
      row = static_cast<long long>(__ldg(p.block_table + static_cast<long long>(b) * p.max_blocks_per_seq + page)) *
                stride[0] +
            (j - static_cast<long long>(page) * p.page_size) * stride[2];
    } else {
      row = static_cast<long long>(b) * stride[0] + j * stride[2];
    }
    const unsigned char* src = static_cast<const unsigned char*>(v ? p.v : p.k) + row + h * stride[1] + cc * 16;
    u32 x[4], y[8];
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
                 : "l"(src));
#pragma unroll
    for (int i = 0; i < 4; ++i) e4m3x4_to_pairs<T::kBf16>(x[i], y[2 * i], y[2 * i + 1]);
    const int dim = v ? T::kHeadDimV : T::kHeadDim;
    unsigned char* dst = ws + (v ? kv_dequant_v_offset(p.batch, p.heads_kv, p.seqlen_k, T::kHeadDim) : 0) +
                         ((static_cast<long long>(b) * p.heads_kv + h) * p.seqlen_k + j) * dim * 2 + cc * 32;
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "r"(y[0]), "r"(y[1]), "r"(y[2]), "r"(y[3])
                 : "memory");
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst + 16), "r"(y[4]), "r"(y[5]), "r"(y[6]),
                 "r"(y[7])
                 : "memory");
  }
}

}  // namespace att
