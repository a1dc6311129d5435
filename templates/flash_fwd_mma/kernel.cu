// flash_fwd_mma: FlashAttention-2-class forward attention for sm_80..sm_90 using mma.sync.
//
// One thread block computes kBlockM query rows of one (batch, head) against all visible keys.
// K/V tiles stream through a ring of shared-memory stages by 16-byte cp.async; scores S = Q.K^T
// and the output O += P.V use mma.sync m16n8k16 with fp32 accumulators; softmax is online, in
// registers, with exp2 and log2(e) folded into the scale; P never leaves registers (the MMA
// accumulator layout of two n8 tiles is the A-operand layout of one k16 step).
#include "../common/attn_params.h"
#include "../common/ptx.cuh"
#include "traits.cuh"

namespace att {

using T = Traits;

// Issues the cp.async copies of rows [row0, row0 + kRows) of a (rows, kHeadDim) tensor slice into
// a swizzled smem tile. Rows at or past row_end are zero-filled (they are masked or not stored).
template <int kRows>
__device__ __forceinline__ void load_tile(elem_t* smem, const elem_t* gmem, long long row_stride,
                                          int row0, int row_end) {
  constexpr int kChunks = kRows * T::kChunksPerRow;
  constexpr int kIters = (kChunks + T::kThreads - 1) / T::kThreads;
  const u32 base = smem_addr(smem);
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = threadIdx.x + it * T::kThreads;
    if (kChunks % T::kThreads == 0 || i < kChunks) {
      const int row = i / T::kChunksPerRow, chunk = i % T::kChunksPerRow;
      const bool valid = row0 + row < row_end;
      const elem_t* src = valid ? gmem + (row0 + row) * row_stride + chunk * 8 : gmem;
      cp_async_16(base + swizzled(row, chunk) * 2, src, valid);
    }
  }
}

extern "C" __global__ void __launch_bounds__(T::kThreads, T::kMinBlocks)
flash_fwd_mma(const AttnParams p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  elem_t* sQ = reinterpret_cast<elem_t*>(smem_raw);  // (kBlockM, kHeadDim)
  elem_t* sK = sQ + T::kQElems;                       // (kStages, kBlockN, kHeadDim)
  elem_t* sV = sK + T::kStages * T::kKVElems;         // (kStages, kBlockN, kHeadDim)

  // Causal blocks with more rows see more keys: launch them first so the tail is short.
  const int m_block = T::kCausal ? int(gridDim.x - 1 - blockIdx.x) : int(blockIdx.x);
  const int head = blockIdx.y, batch = blockIdx.z;
  const int kv_head = head / p.q_per_kv;
  const int m0 = m_block * T::kBlockM;
  // Bottom-right causal alignment: query i sees keys j <= i + diag, diag = seqlen_k - seqlen_q.
  const int diag = p.seqlen_k - p.seqlen_q;
  const int n_end = T::kCausal ? min(p.seqlen_k, m0 + T::kBlockM + diag) : p.seqlen_k;
  const int n_blocks = n_end > 0 ? (n_end + T::kBlockN - 1) / T::kBlockN : 0;

  const elem_t* q = static_cast<const elem_t*>(p.q) + batch * p.q_stride[0] + head * p.q_stride[1];
  const elem_t* k = static_cast<const elem_t*>(p.k) + batch * p.k_stride[0] + kv_head * p.k_stride[1];
  const elem_t* v = static_cast<const elem_t*>(p.v) + batch * p.v_stride[0] + kv_head * p.v_stride[1];
  elem_t* o = static_cast<elem_t*>(p.o) + batch * p.o_stride[0] + head * p.o_stride[1];
  float* lse = p.lse ? p.lse + (static_cast<long long>(batch) * p.heads_q + head) * p.seqlen_q : nullptr;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, tig = lane & 3;  // MMA fragment coordinates: row group, thread in group
  const int warp_row0 = warp * T::kWarpRows;

  // Per thread: rows (m, h) = warp_row0 + m*16 + g + 8h of the block, h in {0, 1}.
  float acc_o[T::kMTiles][T::kDTiles][4];  // (M_TILE, D_TILE, frag)
  float row_max[T::kMTiles][2];            // running max of raw scores
  float row_sum[T::kMTiles][2];            // running sum of this thread's exp terms
#pragma unroll
  for (int m = 0; m < T::kMTiles; ++m) {
#pragma unroll
    for (int d = 0; d < T::kDTiles; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[m][d][e] = 0.f;
    row_max[m][0] = row_max[m][1] = neg_inf();
    row_sum[m][0] = row_sum[m][1] = 0.f;
  }

  // Tile t of the stream: K_{t/2} for even t, V_{t/2} for odd t. Every call commits one group,
  // empty past the end, so cp.async.wait_group counts stay uniform.
  auto issue_tile = [&](int t) {
    const int j = t >> 1;
    if (j < n_blocks) {
      const int slot = j % T::kStages;
      if ((t & 1) == 0)
        load_tile<T::kBlockN>(sK + slot * T::kKVElems, k, p.k_stride[2], j * T::kBlockN, p.seqlen_k);
      else
        load_tile<T::kBlockN>(sV + slot * T::kKVElems, v, p.v_stride[2], j * T::kBlockN, p.seqlen_k);
    }
    cp_async_commit();
  };

  if (n_blocks > 0) {
    load_tile<T::kBlockM>(sQ, q, p.q_stride[2], m0, p.seqlen_q);  // joins K_0's group
#pragma unroll
    for (int t = 0; t < T::kLookahead; ++t) issue_tile(t);
  }

  u32 q_frag[T::kQInRegs ? T::kMTiles : 1][T::kQInRegs ? T::kDSteps : 1][4];  // (M_TILE, D_STEP, frag)
  // A-operand (16x16) ldmatrix address of this lane: rows lane%16, column half lane/16.
  auto q_frag_addr = [&](int m, int ds) {
    const int row = warp_row0 + m * 16 + (lane & 15);
    return smem_addr(sQ) + swizzled(row, ds * 2 + (lane >> 4)) * 2;
  };

  for (int j = 0; j < n_blocks; ++j) {
    const int slot = j % T::kStages;
    const int n0 = j * T::kBlockN;
    cp_async_wait<T::kLookahead - 1>();  // K_j (and Q) landed for this thread's copies
    __syncthreads();                     // ... and everyone's; V_{j-1} slot is free
    issue_tile(2 * j + T::kLookahead);

    if (T::kQInRegs && j == 0) {
#pragma unroll
      for (int m = 0; m < T::kMTiles; ++m)
#pragma unroll
        for (int ds = 0; ds < T::kDSteps; ++ds)
          ldmatrix_x4(q_frag_addr(m, ds), q_frag[m][ds][0], q_frag[m][ds][1], q_frag[m][ds][2], q_frag[m][ds][3]);
    }

    // S = Q.K_j^T  (M_TILE, N_TILE, frag)
    float acc_s[T::kMTiles][T::kNTiles][4];
#pragma unroll
    for (int m = 0; m < T::kMTiles; ++m)
#pragma unroll
      for (int n = 0; n < T::kNTiles; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[m][n][e] = 0.f;

    const u32 k_base = smem_addr(sK + slot * T::kKVElems);
#pragma unroll
    for (int ds = 0; ds < T::kDSteps; ++ds) {
      u32 a[T::kMTiles][4];
#pragma unroll
      for (int m = 0; m < T::kMTiles; ++m) {
        if (T::kQInRegs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) a[m][e] = q_frag[T::kQInRegs ? m : 0][T::kQInRegs ? ds : 0][e];
        } else {
          ldmatrix_x4(q_frag_addr(m, ds), a[m][0], a[m][1], a[m][2], a[m][3]);
        }
      }
#pragma unroll
      for (int np = 0; np < T::kNTiles / 2; ++np) {
        // B operands of key tiles 2np and 2np+1: matrices (keys +0/+8) x (dims +0/+8).
        const int row = np * 16 + (lane & 7) + ((lane >> 4) << 3);
        const int chunk = ds * 2 + ((lane >> 3) & 1);
        u32 b0, b1, b2, b3;
        ldmatrix_x4(k_base + swizzled(row, chunk) * 2, b0, b1, b2, b3);
#pragma unroll
        for (int m = 0; m < T::kMTiles; ++m) {
          mma_16816<T::kBf16>(acc_s[m][2 * np], a[m], b0, b1);
          mma_16816<T::kBf16>(acc_s[m][2 * np + 1], a[m], b2, b3);
        }
      }
    }

    // Mask keys past seqlen_k, and (causal) keys right of the diagonal. Only tiles that reach
    // either boundary pay for it.
    const bool need_mask = n0 + T::kBlockN > p.seqlen_k ||
                           (T::kCausal && n0 + T::kBlockN - 1 > m0 + warp_row0 + diag);
    if (need_mask) {
#pragma unroll
      for (int m = 0; m < T::kMTiles; ++m)
#pragma unroll
        for (int n = 0; n < T::kNTiles; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = m0 + warp_row0 + m * 16 + g + ((e >> 1) << 3);
            const int col = n0 + n * 8 + tig * 2 + (e & 1);
            const int limit = T::kCausal ? min(p.seqlen_k, row + diag + 1) : p.seqlen_k;
            if (col >= limit) acc_s[m][n][e] = neg_inf();
          }
    }

    // Online softmax. Row max over this thread's values, then over the 4 threads of the row.
#pragma unroll
    for (int m = 0; m < T::kMTiles; ++m) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = row_max[m][h];
#pragma unroll
        for (int n = 0; n < T::kNTiles; ++n) mx = fmaxf(mx, fmaxf(acc_s[m][n][2 * h], acc_s[m][n][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // A row that has seen no key yet keeps max -inf; subtract 0 then so exp2 gives 0, not NaN.
        const float max_scaled = mx == neg_inf() ? 0.f : mx * p.scale_log2;
        const float alpha = ex2(row_max[m][h] * p.scale_log2 - max_scaled);
        row_max[m][h] = mx;
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < T::kNTiles; ++n) {
          const float p0 = ex2(fmaf(acc_s[m][n][2 * h], p.scale_log2, -max_scaled));
          const float p1 = ex2(fmaf(acc_s[m][n][2 * h + 1], p.scale_log2, -max_scaled));
          acc_s[m][n][2 * h] = p0;
          acc_s[m][n][2 * h + 1] = p1;
          sum += p0 + p1;
        }
        row_sum[m][h] = row_sum[m][h] * alpha + sum;
#pragma unroll
        for (int d = 0; d < T::kDTiles; ++d) {
          acc_o[m][d][2 * h] *= alpha;
          acc_o[m][d][2 * h + 1] *= alpha;
        }
      }
    }

    cp_async_wait<T::kLookahead - 1>();  // V_j landed
    __syncthreads();                     // ... for everyone; K_j slot is free
    issue_tile(2 * j + 1 + T::kLookahead);

    // O += P.V_j. P's accumulator fragments of key tiles 2ns and 2ns+1 form the A operand of k16
    // step ns; V's B operands come from a transposing ldmatrix.
    const u32 v_base = smem_addr(sV + slot * T::kKVElems);
#pragma unroll
    for (int ns = 0; ns < T::kNSteps; ++ns) {
      u32 a[T::kMTiles][4];
#pragma unroll
      for (int m = 0; m < T::kMTiles; ++m) {
        a[m][0] = pack2<T::kBf16>(acc_s[m][2 * ns][0], acc_s[m][2 * ns][1]);
        a[m][1] = pack2<T::kBf16>(acc_s[m][2 * ns][2], acc_s[m][2 * ns][3]);
        a[m][2] = pack2<T::kBf16>(acc_s[m][2 * ns + 1][0], acc_s[m][2 * ns + 1][1]);
        a[m][3] = pack2<T::kBf16>(acc_s[m][2 * ns + 1][2], acc_s[m][2 * ns + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < T::kDTiles / 2; ++dp) {
        // Matrices (keys +0/+8) x (dims +0/+8), transposed: B operands of dim tiles 2dp, 2dp+1.
        const int row = ns * 16 + (lane & 15);
        const int chunk = dp * 2 + (lane >> 4);
        u32 b0, b1, b2, b3;
        ldmatrix_x4_trans(v_base + swizzled(row, chunk) * 2, b0, b1, b2, b3);
#pragma unroll
        for (int m = 0; m < T::kMTiles; ++m) {
          mma_16816<T::kBf16>(acc_o[m][2 * dp], a[m], b0, b1);
          mma_16816<T::kBf16>(acc_o[m][2 * dp + 1], a[m], b2, b3);
        }
      }
    }
  }
  cp_async_wait<0>();

  // Epilogue: finish the row sums across the 4 threads of a row, normalise, store.
#pragma unroll
  for (int m = 0; m < T::kMTiles; ++m) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = row_sum[m][h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum > 0.f ? 1.f / sum : 0.f;  // a row that saw no key outputs zeros
      const int row = m0 + warp_row0 + m * 16 + g + 8 * h;
      if (row < p.seqlen_q) {
        elem_t* orow = o + row * p.o_stride[2];
#pragma unroll
        for (int d = 0; d < T::kDTiles; ++d) {
          *reinterpret_cast<u32*>(orow + d * 8 + tig * 2) =
              pack2<T::kBf16>(acc_o[m][d][2 * h] * inv, acc_o[m][d][2 * h + 1] * inv);
        }
        if (lse && tig == 0) {
          // log(sum(exp(scale*s))) = (scale_log2*max + log2(sum)) * ln(2)
          lse[row] = sum > 0.f ? (row_max[m][h] * p.scale_log2 + lg2(sum)) * 0.6931471805599453f
                               : neg_inf();
        }
      }
    }
  }
}

}  // namespace att
