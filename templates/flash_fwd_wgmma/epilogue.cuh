// ---- templates/flash_fwd_wgmma/epilogue.cuh: a finished work tile's rows: O / l packed to the
// output dtype and LSE (epilogue_pack), stored at the start of the CTA's next tile
// (epilogue_store), and a split tail piece's partial result combined with its tile's others
// (split_combine).
#ifndef ATTNTUNE_FLASH_FWD_WGMMA_EPILOGUE_CUH
#define ATTNTUNE_FLASH_FWD_WGMMA_EPILOGUE_CUH

#include "../common/attn_params.h"
#include "args.h"
#include "scheduler.h"
#include "work_tiles.cuh"

namespace att {

// Quad (4 lanes) transpose: lane t's v[j] becomes lane j's former v[t]. Two butterfly stages,
// each exchanging two registers: 2x2 blocks over lanes t ^ 1, then the off-diagonal blocks over
// t ^ 2.
__device__ __forceinline__ void quad_transpose(u32 (&v)[4], int t) {
  const bool odd = t & 1, high = t & 2;
#pragma unroll
  for (int pr = 0; pr < 2; ++pr) {  // element 2pr + !odd goes to the partner
    const u32 got = __shfl_xor_sync(0xffffffffu, odd ? v[2 * pr] : v[2 * pr + 1], 1);
    if (odd) v[2 * pr] = got;
    else v[2 * pr + 1] = got;
  }
#pragma unroll
  for (int e = 0; e < 2; ++e) {  // block !high goes to the partner
    const u32 got = __shfl_xor_sync(0xffffffffu, high ? v[e] : v[2 + e], 2);
    if (high) v[e] = got;
    else v[2 + e] = got;
  }
}

// A finished work tile's rows of one consumer warpgroup, ready to store: O / l in the output
// dtype (this thread's 8-column chunks), LSE in natural log, and where they go.
struct OutRows {
  uint4 vec[2][T::kOutGroups];
  float lse[2];
  int row0, head, batch;  // this thread's first row, and row0 + 8
  int q0, len_q;          // varlen: the sequence's first packed row and its length
  int row1, head1;        // a GQA-packed build: the second row's query row and head (row0's: head)
};

// The epilogue's arithmetic: O / l packed to the output dtype for 16-byte stores. Thread t of a
// quad holds columns 8c + 2t, +1 of every 8-column chunk c; a 4x4 transpose over the quad hands
// it all 8 columns of chunk 4q + t. A quarter of the store instructions of 4-byte stores, and
// full 32-byte sectors (those took ~2 us of a 56 us work tile at s=4096, docs/log/WGMMA.md run 30).
// A head dim of 16 mod 32 (48, 80, 112, ...) ends in a group of two chunks: transposed with zeros
// for the missing two, so that threads 0 and 1 of the quad hold them (epilogue_store stores theirs).
// Sinks (Traits::kSinks): the head's logit (sink_a for the first row, sink_b for the second) joins
// each row's denominator (variants.cuh, sink_finish), and a row that saw no key outputs zeros with
// LSE = sink. ra, rb: the rows' query rows (1 << 30: not stored), ha, hb their heads; rb = ra + 8
// and hb = ha but in a GQA-packed build.
__device__ __forceinline__ void epilogue_pack(const float (&o)[T::kHeadDimV / 2], const float (&m)[2], float (&l)[2],
                                              float sink_a, float sink_b, int ra, int rb, int ha, int hb, int batch,
                                              OutRows& out) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    float inv;
    if constexpr (T::kSinks) {
      const SinkFinish f = sink_finish(m[h], l[h], h ? sink_b : sink_a);
      inv = f.o_scale;
      out.lse[h] = f.lse;
    } else {
      // A row whose max is still -inf saw no key: output 0, LSE -inf (its l may hold 2^-126 terms).
      const bool seen = m[h] != neg_inf();
      inv = seen ? rcp_approx(l[h]) : 0.f;  // no IEEE-division branch
      out.lse[h] = seen ? (m[h] + lg2(l[h])) * 0.6931471805599453f : neg_inf();
    }
#pragma unroll
    for (int q = 0; q < T::kOutGroups; ++q) {
      u32 v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (4 * q + j < T::kHeadDimV / 8)
          v[j] = pack2<T::kBf16>(o[4 * (4 * q + j) + 2 * h] * inv, o[4 * (4 * q + j) + 2 * h + 1] * inv);
        else
          v[j] = 0u;  // past the head dim (its last group of two chunks)
      }
      quad_transpose(v, t);
      out.vec[h][q] = make_uint4(v[0], v[1], v[2], v[3]);
    }
  }
  out.row0 = ra;
  out.head = ha;
  out.batch = batch;
  if constexpr (T::kPackGqa) {
    out.row1 = rb;
    out.head1 = hb;
  }
}

// Varlen: where the rows go, the sequence's (after epilogue_pack).
__device__ __forceinline__ void epilogue_sequence(const WorkTile& w, OutRows& out) {
  if constexpr (T::kVarlen) {
    out.q0 = w.q0;
    out.len_q = w.len_q;
  }
}

// The epilogue's stores (all of them when `any`), predicated rather than branched over. With the
// packing at a tile's end and these at the next tile's start (before its Q wait), s=4k and s=16k
// ran 1-1.5% faster than the whole epilogue branched at the tile's end (docs/log/WGMMA.md run 32). Out rows and
// strides are 16-byte aligned (the launchers check).
__device__ __forceinline__ void epilogue_store(const AttnParams& p, const OutRows& out, bool any) {
  const int t = threadIdx.x % 4;
  // Where the rows go: O and LSE of (batch, head); varlen, the sequence's rows from its first
  // packed one in O [total_q, heads_q, d] and LSE [heads_q, total_q].
  elem_t* base;
  long long lse_row;  // LSE of the tile's row 0
  int rows;           // rows of the sequence: those at or past it are not stored
  // A GQA-packed build's two rows have heads of their own (OutRows::head1): `where` for each.
  auto where = [&](int head) {
    if constexpr (T::kVarlen) {
      base = static_cast<elem_t*>(p.o) + static_cast<long long>(out.q0) * p.o_stride[2] + head * p.o_stride[1];
      lse_row = static_cast<long long>(head) * (p.lse ? p.cu_seqlens_q[p.batch] : 0) + out.q0;
      rows = out.len_q;
    } else {
      base = static_cast<elem_t*>(p.o) + out.batch * p.o_stride[0] + head * p.o_stride[1];
      lse_row = (static_cast<long long>(out.batch) * p.heads_q + head) * p.seqlen_q;
      rows = p.seqlen_q;
    }
  };
  where(out.head);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if constexpr (T::kPackGqa) {
      if (h == 1) where(out.head1);
    }
    const int row = T::kPackGqa && h == 1 ? out.row1 : out.row0 + 8 * h;
    const bool in = any && row < rows;
    elem_t* orow = base + row * p.o_stride[2] + 8 * t;
#pragma unroll
    for (int q = 0; q < T::kOutGroups; ++q) {
      // Thread t holds columns 32q + 8t..+7: all of them in a whole group, t < 2 in a last half one.
      const bool cols = T::kHeadDimV % 32 == 0 || q < T::kHeadDimV / 32 || t < (T::kHeadDimV % 32) / 8;
      st_global_v4_if(orow + 32 * q, out.vec[h][q], in && cols);
    }
    st_global_f32_if(p.lse + lse_row + row, out.lse[h], in && p.lse && t == 0);
  }
}

// The last warp to arrive for its (tile, warp) of a split tile's `pieces` combines them, in piece
// order (deterministic), into o, m, l: the pieces are j0..j_last, slot_of(j) piece j's workspace
// slot, `at` a slot's values for this lane. Warps that arrive earlier get m = NaN (nothing to store). kEmptyPieces: a piece may
// hold rows that saw none of its keys (m = -inf: a causal diagonal's, or an empty piece); they
// weigh nothing, and a row no piece saw stays at m = -inf, l = 0 (no keys: zeros, LSE -inf).
template <bool kEmptyPieces, class At, class SlotOf>
__device__ __forceinline__ void merge_pieces(const At& at, const SlotOf& slot_of, int j0, int j_last, int* cnt,
                                             float (&o)[T::kHeadDimV / 2], float (&m)[2], float (&l)[2]) {
  constexpr int kM0 = sched::split_value_m(T::kHeadDimV, 0), kM1 = sched::split_value_m(T::kHeadDimV, 1);
  constexpr int kL0 = sched::split_value_l(T::kHeadDimV, 0), kL1 = sched::split_value_l(T::kHeadDimV, 1);
  const int lane = threadIdx.x % 32, pieces = j_last - j0 + 1;
  int old = 0;
  if (lane == 0) old = atomicAdd(cnt, 1);
  old = __shfl_sync(0xffffffffu, old, 0);
  if (old != pieces - 1) {
    m[0] = m[1] = __int_as_float(0x7fc00000);
    return;
  }
  if (lane == 0) *cnt = 0;  // for the next launch
  __threadfence();
  float mx[2] = {neg_inf(), neg_inf()};
  for (int j = j0; j <= j_last; ++j) {
    const float* q = at(slot_of(j));
    mx[0] = fmaxf(mx[0], __ldcg(q + kM0 * 32));
    mx[1] = fmaxf(mx[1], __ldcg(q + kM1 * 32));
  }
#pragma unroll
  for (int i = 0; i < T::kHeadDimV / 2; ++i) o[i] = 0.f;
  l[0] = l[1] = 0.f;
  for (int j = j0; j <= j_last; ++j) {
    const float* q = at(slot_of(j));
    float f0, f1;
    if constexpr (kEmptyPieces) {
      const float m0 = __ldcg(q + kM0 * 32), m1 = __ldcg(q + kM1 * 32);
      f0 = m0 == neg_inf() ? 0.f : ex2(m0 - mx[0]);
      f1 = m1 == neg_inf() ? 0.f : ex2(m1 - mx[1]);
    } else {
      f0 = ex2(__ldcg(q + kM0 * 32) - mx[0]);
      f1 = ex2(__ldcg(q + kM1 * 32) - mx[1]);
    }
    l[0] += __ldcg(q + kL0 * 32) * f0;
    l[1] += __ldcg(q + kL1 * 32) * f1;
#pragma unroll
    for (int i = 0; i < T::kHeadDimV / 2; ++i) o[i] += __ldcg(q + i * 32) * ((i & 2) ? f1 : f0);
  }
  m[0] = mx[0];
  m[1] = mx[1];
}

// A split tail piece: this warp's partial O, m and l to its workspace slot (scheduler.h's layout);
// the warp that arrives last for its (tile, warp) combines every piece, in piece order
// (deterministic), into o, m, l. The others get m = NaN: nothing to store.
__device__ __forceinline__ void split_combine(const TmaMaps& maps, const WorkTile& w, int cw, float (&o)[T::kHeadDimV / 2],
                                              float (&m)[2], float (&l)[2]) {
  constexpr int kVals = sched::split_values(T::kHeadDimV), kWarps = T::kConsumerWgs * 4;
  constexpr int kM0 = sched::split_value_m(T::kHeadDimV, 0), kM1 = sched::split_value_m(T::kHeadDimV, 1);
  constexpr int kL0 = sched::split_value_l(T::kHeadDimV, 0), kL1 = sched::split_value_l(T::kHeadDimV, 1);
  const int lane = threadIdx.x % 32, warp = cw * 4 + (threadIdx.x / 32) % 4;
  auto at = [&](int slot) { return maps.split_ws + (static_cast<long long>(slot) * kWarps + warp) * kVals * 32 + lane; };
  float* mine = at(w.slot);
#pragma unroll
  for (int i = 0; i < T::kHeadDimV / 2; ++i) mine[i * 32] = o[i];
  mine[kM0 * 32] = m[0];
  mine[kM1 * 32] = m[1];
  mine[kL0 * 32] = l[0];
  mine[kL1 * 32] = l[1];
  __threadfence();
  __syncwarp();
  int* cnt = maps.split_count + w.u * kWarps + warp;
  if constexpr (T::kSplitCausal) {
    // The causal split: split tile w.u's pieces hold its slots first_slot.. in piece order.
    const sched::UnitPiece k = sched::causal_split_tile(w.u, maps.causal_split);
    merge_pieces<true>(at, [](int j) { return j; }, k.first_slot, k.first_slot + k.pieces - 1, cnt, o, m, l);
  } else {
    // In clusters (split_pieces): tail cluster v, rank `rank` in it, of G clusters.
    const int n = w.n, total = maps.split_tail / T::kCluster * n;
    const int G = gridDim.x * gridDim.y * gridDim.z / T::kCluster;
    const int v = w.u / T::kCluster, rank = w.u % T::kCluster;
    // The clusters whose shares meet this tile: g_first holds iteration v*n, g_last (v+1)*n - 1.
    const int g_first = sched::tail_owner(v * n, total, G), g_last = sched::tail_owner((v + 1) * n - 1, total, G);
    // Cluster g's piece of this tile is its CTA of this rank's first piece when g's share starts
    // in tail cluster v, else its second. Every piece's rows saw keys (no mask empties one).
    auto slot_of = [&](int g) {
      return sched::split_slot(g * T::kCluster + rank, sched::tail_begin(total, g, G) / n == v ? 0 : 1);
    };
    merge_pieces<false>(at, slot_of, g_first, g_last, cnt, o, m, l);
  }
}

}  // namespace att

#endif  // ATTNTUNE_FLASH_FWD_WGMMA_EPILOGUE_CUH
