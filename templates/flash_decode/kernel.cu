// flash_decode: split-KV decode attention (seqlen_q 1..16) for sm_80..sm_90 using mma.sync.
//
// Work unit: (batch, kv head, row block). Its rows are the kv head's group of query heads times
// the queries (GQA packing: K and V are read once per kv head), padded to BLOCK_M (16-row MMA
// tiles). One CTA per (split, row block) x kv head x batch streams its share of the sequence's key
// tiles (BLOCK_N keys, contiguous or paged) through a ring of kStages stages by 16-byte cp.async
// (or, KV_LOAD tma on sm_90, by TMA boxes from one producer warp into an mbarrier ring);
// each warp scores a slice of every tile (mma.sync m16n8k16, fp32 accumulation, online softmax in
// registers with exp2) with its own running max, sum and O; the warps then merge through shared
// memory. One split: O and LSE are written. Several: the split's normalized partial O and LSE
// (fp32) go to a workspace and are merged by flash_decode_combine, or (combine: last_cta) by the
// last CTA of the unit to finish, found by a counter it resets.
//
// A sequence's key tiles are shared out evenly over the splits from its own length
// (cache_seqlens), so ragged batches keep every split busy; a split past the end of a short
// sequence writes an empty partial (O 0, LSE -inf). Rows that see no key output zeros and LSE
// -inf.
//
// Variants (README.md): a window build splits only the keys its unit's windows span and masks
// each row's window in the tiles that cross a bound; a soft-cap build caps each raw score before
// masking; a sinks build adds each head's sink where a row's output is made (the unsplit epilogue
// or the merge into the output), never to a piece.
#include "../common/fp8.cuh"
#include "../common/ptx_sm90.cuh"
#include "../common/variants.cuh"
#include "args.h"
#include "traits.cuh"

namespace att {

#ifndef DECODE_X_SKIP_MATH
#define DECODE_X_SKIP_MATH 0  // experiment (harness only): 1 consumers release tiles unscored, 2 QK^T only
#endif
#ifndef DECODE_X_SKIP_Q
#define DECODE_X_SKIP_Q 0  // experiment (harness only): consumers do not load Q
#endif
#ifndef DECODE_X_SKIP_EPI
#define DECODE_X_SKIP_EPI 0  // experiment (harness only): no merge, partial or combine after the loop
#endif

using T = Traits;

constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Waits for the threads that share this warp's tiles: the CTA, or the key group (warp tiles).
__device__ __forceinline__ void tile_sync(int wn) {
  if constexpr (!T::kWarpTiles) __syncthreads();
  else if constexpr (T::kWarpsM == 1) __syncwarp();
  else named_sync(T::kBarKeyGroup + wn, 32 * T::kWarpsM);
}

// ---- shared memory -------------------------------------------------------------------------------

// The dynamic shared memory: Q (kBlockM rows) at 0, then the ring of kStages stages, each a K tile
// then a V tile of kBlockN rows (every tile in tile_bytes' layout: K's rows of d elements, V's of
// dv); after the loop the merge buffer (MergeBuf) over both from 0.
struct Smem {
  static constexpr int kQ = 0;
  static constexpr int kRing = kQ + T::kQBytes;
  static constexpr int kV = T::kTileBytes;  // a stage's V tile, from its K tile
  // Stage `stage`'s K tile from the ring's start (the shared memory's + kRing).
  static __device__ __forceinline__ u32 k_tile(u32 ring, int stage) { return ring + stage * T::kStageBytes; }
  // A K or V tile is kColBlocks column blocks of kBlockN rows of kRow bytes (128, 64 or 32:
  // tile_bytes): chunk ch of row r at tile + (ch / kBlockChunks) * kColBlock + r * kRow + ((ch %
  // kBlockChunks) ^ swizzle) * 16.
  static constexpr int kRow = T::kColBytes;
  static constexpr int kColBlock = T::kBlockN * kRow;
  // V's tiles: the same with V's column blocks (dv's), kRowV bytes a row.
  static constexpr int kRowV = T::kColBytesV;
  static constexpr int kColBlockV = T::kBlockN * kRowV;
  static_assert(T::kColBlocks * kColBlock == T::kTileBytes && T::kColBlocksV * kColBlockV == T::kTileBytesV,
                "a tile is its column blocks");
  static_assert(kRing + T::kStages * T::kStageBytes <= T::kSmemBytes, "Q and the ring fit the shared memory");
  // fp8_convert group: the 16-bit stage after the ring, buffer i's K tile at k16(base, i), its V
  // tile kV16 after it; rows of kRow16 (kRow16V) bytes, tile_bytes<kHeadDim> (<kHeadDimV>).
  static constexpr int kStage16 = kRing + T::kRingBytes;
  static constexpr int kV16 = T::kTile16Bytes;
  static constexpr int kRow16 = decode_tile_cols(T::kHeadDim) * 2;
  static constexpr int kRow16V = decode_tile_cols(T::kHeadDimV) * 2;
  static __device__ __forceinline__ u32 k16(u32 ring, int buf) {
    return ring - kRing + kStage16 + buf * (T::kTile16Bytes + T::kTile16BytesV);
  }
  static_assert(kStage16 + T::kStage16Bytes <= T::kSmemBytes, "the 16-bit stage fits the shared memory");
  static_assert(!T::kFp8Group || (kStage16 % 1024 == 0 && T::kTile16Bytes % 1024 == 0 && T::kTile16BytesV % 128 == 0),
                "the 16-bit stage's tiles start at multiples of their swizzle's repeat");
  static_assert(T::kStageBytes == kV + T::kTileBytesV, "a stage is a K tile and a V tile");
  // The V slice of the key group whose K slice (the same keys: kw rows from the stage's K tile) is
  // at k_slice.
  static __device__ __forceinline__ u32 v_slice(u32 k_slice, int kw) {
    if constexpr (!T::kSplitDims) return k_slice + kV;
    else return k_slice + kV + kw * (kRowV - kRow);
  }
  // TMA's swizzle of kRow bytes repeats every 8 rows (1024, 512 or 256 bytes), from the shared
  // memory's address: every tile and column block starts at a multiple (the dynamic shared memory
  // is 1024-byte aligned). (Q: a multiple of 16 rows of d * 2 bytes, at least 512 bytes, and of
  // 1024 where d % 32 == 0.)
  static_assert(kRing % (8 * kRow) == 0 && T::kTileBytes % (8 * kRow) == 0 && kColBlock % (8 * kRow) == 0,
                "tiles and column blocks start at multiples of the swizzle's repeat (8 rows)");
  static_assert(kRing % (8 * kRowV) == 0 && kV % (8 * kRowV) == 0 && T::kStageBytes % (8 * kRowV) == 0 &&
                    kColBlockV % (8 * kRowV) == 0,
                "V's tiles and column blocks start at multiples of its swizzle's repeat (8 rows)");
};

// kv_load tma: the ring's mbarriers, 8 bytes each from `base` (a static __shared__ array of
// 2 * kStages): stage s's full barrier (the producer's transaction) at s, its empty barrier (the
// consumer warps' release) at kStages + s.
struct RingBars {
  static constexpr int kCount = 2 * T::kStages;
  u32 base;
  __device__ __forceinline__ u32 full(int stage) const { return base + 8 * stage; }
  __device__ __forceinline__ u32 empty(int stage) const { return base + 8 * (T::kStages + stage); }
};
static_assert(sizeof(unsigned long long) == 8, "an mbarrier is 8 bytes");

// j / page_size for 0 <= j < 2^31 (args.h: page_mul, page_shift).
__device__ __forceinline__ int page_index(int j, const DecodeParams& p) {
  return p.page_mul ? static_cast<int>(__umulhi(static_cast<unsigned>(j), p.page_mul) >> p.page_shift) : j;
}

// Keys of sequence b.
__device__ __forceinline__ int seq_len(const DecodeParams& p, int b) {
  return p.cache_seqlens ? min(max(__ldg(p.cache_seqlens + b), 0), p.seqlen_k) : p.seqlen_k;
}

// ---- per-warp state ------------------------------------------------------------------------------

// This warp's running max and sum (log2 units) and unnormalized O for its rows: tile wm * kMw + m,
// rows g and g + 8 (h = 0, 1).
struct Acc {
  float o[T::kMw][T::kDTiles][4];
  float m[T::kMw][2], l[T::kMw][2];
};

__device__ __forceinline__ void acc_reset(Acc& a) {
#pragma unroll
  for (int m = 0; m < T::kMw; ++m) {
#pragma unroll
    for (int d = 0; d < T::kDTiles; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e) a.o[m][d][e] = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      a.m[m][h] = neg_inf();
      a.l[m][h] = 0.f;
    }
  }
}

// Keys j < lim are visible to the thread's rows; keys below `unmasked` to every row of the CTA.
// Window builds (LimitsOf<true>): keys j >= beg only, and keys in [full_from, unmasked) to every
// row. (A type of its own: the window's fields in every build's Limits changed plain builds' SASS.)
template <bool kWindow>
struct LimitsOf {
  int lim[T::kMw][2];
  int unmasked;
};
template <>
struct LimitsOf<true> {
  int lim[T::kMw][2];
  int unmasked;
  int beg[T::kMw][2];
  int full_from;
};
using Limits = LimitsOf<T::kWindow>;

template <class Lim>
__device__ __forceinline__ void row_limits(Lim& L, const DecodeParams& p, int row0, int len, int wm, int g) {
  if constexpr (T::kWindow) {
    // Row r of the unit is query i = r % seqlen_q (padding rows past p.rows too: their outputs are
    // never stored), bottom-right aligned in its sequence of len keys (common/variants.cuh). The
    // bounds grow with i: row 0's end is the first, row seqlen_q - 1's beginning the last.
    const int diag = len - p.seqlen_q;
#pragma unroll
    for (int m = 0; m < T::kMw; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = (row0 + (wm * T::kMw + m) * 16 + g + 8 * h) % p.seqlen_q;
        L.beg[m][h] = key_begin<true>(i, diag, len, p.variant);
        L.lim[m][h] = key_end<T::kCausal, true>(i, diag, len, p.variant);
      }
    L.unmasked = key_end<T::kCausal, true>(0, diag, len, p.variant);
    L.full_from = key_begin<true>(p.seqlen_q - 1, diag, len, p.variant);
    return;
  }
#pragma unroll
  for (int m = 0; m < T::kMw; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rr = row0 + (wm * T::kMw + m) * 16 + g + 8 * h;
      // Bottom-right causal: query i sees keys j <= i + len - seqlen_q.
      L.lim[m][h] = (T::kCausal && rr < p.rows) ? len - p.seqlen_q + 1 + rr % p.seqlen_q : len;
    }
  L.unmasked = T::kCausal ? len - p.seqlen_q + 1 : len;
}

// cp.async of the Q rows row0.. of unit (b, kvh) into q_smem (kBlockM rows, swizzled), zero past
// rows_here. All threads; no commit.
__device__ __forceinline__ void load_q(const DecodeParams& p, u32 q_smem, int b, int kvh, int row0, int rows_here,
                                       int tid) {
  const elem_t* qg = static_cast<const elem_t*>(p.q) + b * p.q_stride[0];
  for (int c = tid; c < T::kBlockM * T::kQChunks; c += T::kConsumerThreads) {
    const int r = c / T::kQChunks, ch = c - r * T::kQChunks;
    const bool valid = r < rows_here;
    const int rr = row0 + r, gq = rr / p.seqlen_q, i = rr - gq * p.seqlen_q;
    const elem_t* src = valid ? qg + (kvh * p.group + gq) * p.q_stride[1] + i * p.q_stride[2] + ch * 8
                              : static_cast<const elem_t*>(p.q);
    cp_async_16(q_smem + tile_bytes(r, ch, T::kBlockM, r & 7), src, valid);
  }
}

typedef u32 QFrags[T::kQInRegs ? T::kMw : 1][T::kQInRegs ? T::kDSteps : 1][4];

// ---- FP8 caches (ATT_KV_FP8) ---------------------------------------------------------------------
// The tiles hold e4m3 bytes, rows of d (dv) bytes seen as d / 2 16-bit elements (traits.cuh), and
// the MMAs stay 16-bit (m16n8k16, fp32 accumulation) over exactly converted values:
//  - Q K^T: a plain ldmatrix_x4 of a K tile gives a lane 4 consecutive bytes of a key (dims 4t..4t+3
//    of a k16 step, t = lane % 4), which become the B fragment's two registers (b0: dims 4t, 4t+1;
//    b1: 4t+2, 4t+3). The k16 step's dims are thus taken in another order than the MMA's (its k = 2t
//    + j is dim 4t + j, k = 2t + 8 + j is dim 4t + 2 + j), and Q's A fragments are read from shared
//    memory in that order (q_frags_fp8: 8 bytes, dims 4t..4t+3, of rows g and g + 8). A dot product
//    does not care in which order its terms come.
//  - P V: a transposing ldmatrix_x4 of a V tile gives a lane, of 16-bit column g of a key pair (2t,
//    2t + 1), 4 bytes: (key 2t, dim 2g), (2t, 2g + 1), (2t + 1, 2g), (2t + 1, 2g + 1); one prmt makes
//    them the keys' pair at dim 2g and at dim 2g + 1: the B fragments of two n8 tiles of O, whose
//    column n is dim 2n (the even tile) and 2n + 1 (the odd one) of the load's 16 dims. O's tiles
//    2c and 2c + 1 thus hold dims 16c + 2n and 16c + 2n + 1 (o_cols_fp8 puts them in order in the
//    merge). P and V's values are fp16 (an e4m3 byte converts to fp16 exactly in one cvt).
//  - Both products run in fp16, K too (one cvt a pair). A bf16 problem's Q is made fp16 exactly: the
//    CTA's largest |q| sets a power of two 2^e (q_exponent) such that q * 2^-e is at most 2^15, whose
//    fp16 holds every bf16 value down to 2^-29 of that largest one; 2^e joins K's scale. (Moving
//    K's bits into bf16 and one bf16x2 multiply, common/fp8.cuh, is exact too, and 2% slower:
//    run 174.)
//  - Dequantisation: K's scale multiplies the scores (with the softmax scale), V's the output.
// The conversions: common/fp8.cuh.
// Q's A fragment of k16 step ks for the FP8 K order (above): rows g and g + 8 of row tile `tile`,
// dims 16 ks + 4t .. + 3 (one 8-byte load each).
// A bf16 problem's Q as fp16 (above): each pair times qmul = 2^-e, exactly.
__device__ __forceinline__ u32 bf16x2_to_f16x2(u32 x, float qmul) {
  const float lo = __uint_as_float(x << 16) * qmul, hi = __uint_as_float(x & 0xffff0000u) * qmul;
  return pack2<false>(lo, hi);
}
__device__ __forceinline__ void q_frags_fp8(u32 (&qa)[4], u32 q_smem, int tile, int ks, int lane, float qmul) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = tile * 16 + g + 8 * h;
    const u32 at = q_smem + tile_bytes<T::kHeadDim>(r, 2 * ks + (t >> 1), T::kBlockM, r & 7) + (t & 1) * 8;
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(qa[h]), "=r"(qa[2 + h]) : "r"(at));
  }
  if constexpr (T::kBf16) {
#pragma unroll
    for (int e = 0; e < 4; ++e) qa[e] = bf16x2_to_f16x2(qa[e], qmul);
  }
}
// A bf16 problem over an FP8 cache: e such that the CTA's largest |q| times 2^-e lies in [2^14, 2^15)
// (0 for an all-zero Q; within [-100, 100], so that 2^e and 2^-e are normal floats). Every consumer
// warp reads the whole Q tile (padding rows are zeros) and gets the same e.
__device__ __forceinline__ int q_exponent(u32 q_smem, int lane) {
  u32 m = 0;
  for (int w = lane; w < T::kBlockM * T::kQRowBytes / 4; w += 32) {
    u32 x;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(x) : "r"(q_smem + 4 * w));
    m = max(m, max(x & 0x7fffu, (x >> 16) & 0x7fffu));  // bf16 magnitudes order as integers
  }
  m = __reduce_max_sync(0xffffffffu, m);
  if (m == 0) return 0;
  return min(max(static_cast<int>(m >> 7) - 127 - 14, -100), 100);
}

__device__ __forceinline__ void load_q_frags(QFrags& qf, u32 q_smem, int wm, int lane, float qmul = 1.f) {
  if constexpr (T::kQInRegs && T::kFp8Direct) {
#pragma unroll
    for (int m = 0; m < T::kMw; ++m)
#pragma unroll
      for (int ks = 0; ks < T::kDSteps; ++ks) q_frags_fp8(qf[m][ks], q_smem, wm * T::kMw + m, ks, lane, qmul);
  } else if constexpr (T::kQInRegs) {
#pragma unroll
    for (int m = 0; m < T::kMw; ++m)
#pragma unroll
      for (int ks = 0; ks < T::kDSteps; ++ks)
        ldmatrix_x4(q_smem + tile_bytes((wm * T::kMw + m) * 16 + (lane & 15), 2 * ks + (lane >> 4), T::kBlockM, lane & 7),
                    qf[m][ks][0],
                    qf[m][ks][1], qf[m][ks][2], qf[m][ks][3]);
  }
}

// fp8_convert group: key group wn's slice (its kWarpKeys rows) of a ring stage (K tile at k_ring, V
// tile Smem::kV after it; rows of kKDim and kVDim 16-bit elements, each 16-byte chunk 16 e4m3
// values; swizzled by row % 8 where swz, as the ring's loads wrote them) to the 16-bit stage buffer
// at k16 (V at Smem::kV16 after it): the same values exactly, in fp16, in natural order, rows
// swizzled by row % 8, so that process_tile reads them as a 16-bit cache's tile. Each of the group's
// threads (gt: its index in the group) converts 16-byte chunks in turn. V rows of keys outside
// [lo, len) (past the sequence; window builds, before the unit's first key) become zeros, whatever
// the ring held: P is 0 there, but 0 * NaN is NaN (K's are masked in the scores). key0: the tile's
// first key.
template <int kDim16, int kDimRing>
__device__ __forceinline__ void convert_rows(u32 ring, u32 dst, int r0, int gt, bool swz, int key0, int lo, int len,
                                             bool zero_outside) {
  constexpr int kGroupThreads = 32 * T::kWarpsM;
  constexpr int kRowChunks = kDim16 / 16;  // 16-byte FP8 chunks a row
  constexpr int kItems = T::kWarpKeys * kRowChunks;
  // Unrolled whole where one key group is the CTA (warps_n 1), else two chunks at a time: TMA builds
  // held to 168 registers spilled 8 bytes at 32 packed rows unrolled whole (every 64-key, 4-warp,
  // 2-CTA config) and 20 bytes at 64 rows two at a time (4 of 12 such), none the other way round
  // (ptxas sm_90, 2026-12-05).
  constexpr int kUnroll = T::kWarpsN == 1 ? 16 : 2;
#pragma unroll(kUnroll)
  for (int i = 0; i < (kItems + kGroupThreads - 1) / kGroupThreads; ++i) {
    const int c = gt + i * kGroupThreads;
    if (kItems % kGroupThreads != 0 && c >= kItems) break;
    const int r = r0 + c / kRowChunks, ch = c % kRowChunks;
    u32 x[4], h[8];
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
                 : "r"(ring + tile_bytes<kDimRing>(r, ch, T::kBlockN, swz ? (r & 7) : 0)));
#pragma unroll
    for (int w = 0; w < 4; ++w) e4m3x4_to_pairs<false>(x[w], h[2 * w], h[2 * w + 1]);
    if (zero_outside) {
      const int j = key0 + r;
      if (j >= len || j < lo)
#pragma unroll
        for (int w = 0; w < 8; ++w) h[w] = 0u;
    }
#pragma unroll
    for (int half = 0; half < 2; ++half)
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst + tile_bytes<kDim16>(r, 2 * ch + half, T::kBlockN, r & 7)),
                   "r"(h[4 * half]), "r"(h[4 * half + 1]), "r"(h[4 * half + 2]), "r"(h[4 * half + 3])
                   : "memory");
  }
}
__device__ __forceinline__ void convert_slice(u32 k_ring, u32 k16, int wn, int gt, bool swz, int key0, int lo,
                                              int len) {
  const int r0 = wn * T::kWarpKeys;
  convert_rows<T::kHeadDim, T::kKDim>(k_ring, k16, r0, gt, swz, key0, lo, len, false);
  convert_rows<T::kHeadDimV, T::kVDim>(k_ring + Smem::kV, k16 + Smem::kV16, r0, gt, swz, key0, lo, len, true);
}

// One tile: S = Q K^T over this warp's kWarpKeys keys (first key kw0) of the tile at k_tile (the
// warp's rows of it), soft-cap, mask, online softmax, O += P V. xr: the K/V tiles' swizzle (lane %
// 8, or 0).
template <class Lim>
__device__ __forceinline__ void process_tile(Acc& a, const QFrags& qf, u32 q_smem, u32 k_tile, u32 v_tile, int kw0,
                                             const Lim& L, float scale_log2, const VariantParams& v, int wm, int lane,
                                             int xr, float kds = 1.f, float qmul = 1.f) {
  const int tq = lane & 3;
  float s[T::kMw][T::kKeyTiles][4];
#pragma unroll
  for (int m = 0; m < T::kMw; ++m)
#pragma unroll
    for (int nt = 0; nt < T::kKeyTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[m][nt][e] = 0.f;
  if constexpr (T::kFp8Direct) {
    // FP8 K (above): one ldmatrix_x4 is key tiles 2np, 2np + 1 of k16 steps ks, ks + 1.
#pragma unroll
    for (int ks = 0; ks < T::kDSteps; ks += 2) {
      u32 qa[2][T::kMw][4];
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int m = 0; m < T::kMw; ++m) {
          if constexpr (T::kQInRegs) {
#pragma unroll
            for (int e = 0; e < 4; ++e) qa[j][m][e] = qf[m][ks + j][e];
          } else {
            q_frags_fp8(qa[j][m], q_smem, wm * T::kMw + m, ks + j, lane, qmul);
          }
        }
#pragma unroll
      for (int np = 0; np < T::kKeyTiles / 2; ++np) {
        u32 r[4];
        ldmatrix_x4(k_tile + tile_bytes<T::kKDim>(np * 16 + (lane & 15), ks + (lane >> 4), T::kBlockN, xr), r[0], r[1],
                    r[2], r[3]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          u32 b0, b1;
          e4m3x4_to_pairs<false>(r[i], b0, b1);
#pragma unroll
          for (int m = 0; m < T::kMw; ++m) mma_16816<false>(s[m][2 * np + (i & 1)], qa[i >> 1][m], b0, b1);
        }
      }
    }
  } else {
#pragma unroll
  for (int ks = 0; ks < T::kDSteps; ++ks) {
    u32 qa[T::kMw][4];
#pragma unroll
    for (int m = 0; m < T::kMw; ++m) {
      if constexpr (T::kQInRegs) {
#pragma unroll
        for (int e = 0; e < 4; ++e) qa[m][e] = qf[m][ks][e];
      } else {
        ldmatrix_x4(q_smem + tile_bytes((wm * T::kMw + m) * 16 + (lane & 15), 2 * ks + (lane >> 4), T::kBlockM, lane & 7),
                    qa[m][0],
                    qa[m][1], qa[m][2], qa[m][3]);
      }
    }
#pragma unroll
    for (int np = 0; np < T::kKeyTiles / 2; ++np) {
      u32 b0, b1, b2, b3;
      ldmatrix_x4(k_tile + tile_bytes<T::kHeadDim>(np * 16 + (lane & 7) + ((lane >> 4) << 3), 2 * ks + ((lane >> 3) & 1), T::kBlockN, xr),
                  b0, b1, b2, b3);
#pragma unroll
      for (int m = 0; m < T::kMw; ++m) {
        mma_16816<T::kMmaBf16>(s[m][2 * np], qa[m], b0, b1);
        mma_16816<T::kMmaBf16>(s[m][2 * np + 1], qa[m], b2, b3);
      }
    }
  }
  }

#if DECODE_X_SKIP_MATH == 2
#pragma unroll
  for (int nt = 0; nt < T::kKeyTiles; ++nt) a.o[0][nt][0] += s[0][nt][0] + s[0][nt][1] + s[0][nt][2] + s[0][nt][3];
  return;
#endif
  // Scale to log2 units; mask keys past the sequence (and, causal, right of the diagonal; window
  // builds, outside each row's window). Only a tile that crosses a bound is masked per element.
  // Soft-cap builds cap the raw score first: c * tanh(q.k * scale / c) in log2 units is cap2 *
  // tanh(q.k * softcap_scale), cap2 = c * log2(e) (a soft-cap call's scale_log2 is log2(e)).
  bool full = kw0 + T::kWarpKeys <= L.unmasked;
  if constexpr (T::kWindow) full = full && kw0 >= L.full_from;
  const float cap2 = T::kSoftcap ? v.softcap * scale_log2 : 0.f;
#pragma unroll
  for (int m = 0; m < T::kMw; ++m)
#pragma unroll
    for (int nt = 0; nt < T::kKeyTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x;
        if constexpr (T::kKvFp8) {  // K's scale with the softmax's (loop-invariant products)
          if constexpr (T::kSoftcap) x = cap2 * tanh_accurate(s[m][nt][e] * (v.softcap_scale * kds));
          else x = s[m][nt][e] * (scale_log2 * kds);
        } else if constexpr (T::kSoftcap) {
          x = cap2 * tanh_accurate(s[m][nt][e] * v.softcap_scale);
        } else {
          x = s[m][nt][e] * scale_log2;
        }
        if constexpr (T::kWindow) {
          const int col = kw0 + nt * 8 + 2 * tq + (e & 1);
          if (!full && (col >= L.lim[m][e >> 1] || col < L.beg[m][e >> 1])) x = neg_inf();
        } else {
          if (!full && kw0 + nt * 8 + 2 * tq + (e & 1) >= L.lim[m][e >> 1]) x = neg_inf();
        }
        s[m][nt][e] = x;
      }

  // Online softmax; P to 16-bit A fragments (the accumulators of key tiles 2kk, 2kk+1 are the A
  // operand of k16 step kk).
  u32 pa[T::kMw][T::kKeySteps][4];
#pragma unroll
  for (int m = 0; m < T::kMw; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = a.m[m][h];
#pragma unroll
      for (int nt = 0; nt < T::kKeyTiles; ++nt) mx = fmaxf(mx, fmaxf(s[m][nt][2 * h], s[m][nt][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A row that has seen no key keeps max -inf: subtract 0 instead (exp2(-inf) = 0, no NaN).
      const float use = mx == neg_inf() ? 0.f : mx;
      const float alpha = ex2(a.m[m][h] - use);
      a.m[m][h] = mx;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < T::kKeyTiles; ++nt) {
        const float p0 = ex2(s[m][nt][2 * h] - use), p1 = ex2(s[m][nt][2 * h + 1] - use);
        sum += p0 + p1;
        pa[m][nt >> 1][(nt & 1) * 2 + h] = pack2<T::kBf16 && !T::kKvFp8>(p0, p1);  // FP8 V: fp16 MMAs
      }
      a.l[m][h] = a.l[m][h] * alpha + sum;
      if constexpr (T::kKvFp8) {
        // O rescaled only when some row's max moved (alpha is 1 exactly otherwise): past the first
        // tiles of a long sequence, rarely.
        if (__any_sync(0xffffffffu, alpha != 1.f)) {
#pragma unroll
          for (int d = 0; d < T::kDTiles; ++d) {
            a.o[m][d][2 * h] *= alpha;
            a.o[m][d][2 * h + 1] *= alpha;
          }
        }
      } else {
#pragma unroll
        for (int d = 0; d < T::kDTiles; ++d) {
          a.o[m][d][2 * h] *= alpha;
          a.o[m][d][2 * h + 1] *= alpha;
        }
      }
    }

  // O += P V.
  if constexpr (T::kFp8Direct) {
    // FP8 V (above): one transposing ldmatrix_x4 is keys kk * 16 .. + 15 of dims 32 dq .. + 31: O's
    // tiles 4dq (dims 32dq + 2n), 4dq + 1 (+ 2n + 1), 4dq + 2 (+ 16 + 2n), 4dq + 3 (+ 16 + 2n + 1).
#pragma unroll
    for (int kk = 0; kk < T::kKeySteps; ++kk)
#pragma unroll
      for (int dq = 0; dq < T::kDTiles / 4; ++dq) {
        u32 r[4];
        ldmatrix_x4_trans(v_tile + tile_bytes<T::kVDim>(kk * 16 + (lane & 15), 2 * dq + (lane >> 4), T::kBlockN, xr),
                          r[0], r[1], r[2], r[3]);
#pragma unroll
        for (int c = 0; c < 2; ++c) {  // r[2c]: keys 0..7, r[2c + 1]: keys 8..15 of dims 32dq + 16c ..
          u32 e0, o0, e1, o1;
          e4m3_key_pairs(r[2 * c], e0, o0);
          e4m3_key_pairs(r[2 * c + 1], e1, o1);
#pragma unroll
          for (int m = 0; m < T::kMw; ++m) {
            mma_16816<false>(a.o[m][4 * dq + 2 * c], pa[m][kk], e0, e1);
            mma_16816<false>(a.o[m][4 * dq + 2 * c + 1], pa[m][kk], o0, o1);
          }
        }
      }
    return;
  }
#pragma unroll
  for (int kk = 0; kk < T::kKeySteps; ++kk)
#pragma unroll
    for (int dp = 0; dp < T::kDTiles / 2; ++dp) {
      u32 b0, b1, b2, b3;
      ldmatrix_x4_trans(v_tile + tile_bytes<T::kHeadDimV>(kk * 16 + (lane & 15), 2 * dp + (lane >> 4), T::kBlockN, xr), b0,
                        b1, b2, b3);
#pragma unroll
      for (int m = 0; m < T::kMw; ++m) {
        mma_16816<T::kMmaBf16>(a.o[m][2 * dp], pa[m][kk], b0, b1);
        mma_16816<T::kMmaBf16>(a.o[m][2 * dp + 1], pa[m][kk], b2, b3);
      }
    }
}

// ---- epilogue ------------------------------------------------------------------------------------

// The key groups' merge, in shared memory over Q and the ring. Slots (where the ring holds them):
// each key group writes its own unnormalized O, max and sum to its slot, one barrier, and the
// stores read every slot, weighting each by exp2(its max - the row's max) / the row's sum. Else
// (the ring is smaller) one slot, to which the groups add their rescaled O in turn. Both orders
// are fixed: the output is the same bits call after call. (Shared-memory float atomics, the first
// form, cost ~7 us a CTA on an H100: docs/design/flash_decode.md.)
constexpr int kSlotBytes = T::kWarpsN * T::kBlockM * (T::kOStride + 2) * 4;
constexpr bool kSlotMerge = T::kWarpsN > 1 && kSlotBytes <= T::kQBytes + T::kRingBytes;
constexpr int kSlots = kSlotMerge ? T::kWarpsN : 1;
static_assert(kSlots * T::kBlockM * T::kOStride * 4 + (T::kWarpsN + kSlots) * T::kBlockM * 4 <= T::kSmemBytes,
              "the merge buffer fits the kernel's shared memory");

// o [kSlots][kBlockM][kOStride], m [kWarpsN][kBlockM] (each key group's row maxima, log2 units),
// l [kSlots][kBlockM].
struct MergeBuf {
  float* o;
  float* m;
  float* l;
  __device__ __forceinline__ explicit MergeBuf(float* base)
      : o(base), m(base + kSlots * T::kBlockM * T::kOStride), l(m + T::kWarpsN * T::kBlockM) {}
  // Row r's weights: slot w's O times f[w] summed is the normalized output; lse in natural log
  // (-inf and f = 0: the row saw no key). kSink: the row's head's sink logit (sink2, log2 units;
  // -inf: none) joins its softmax as one more term of value 0: 2^(sink2 - top) adds to the sum,
  // top = max(the row's max, sink2) (common/variants.cuh's sink_finish).
  struct Row {
    float f[kSlots];
    float lse;
  };
  template <bool kSink = false>
  __device__ __forceinline__ Row row(int r, float sink2 = 0.f) const {
    Row R;
    float mx = neg_inf();
#pragma unroll
    for (int w = 0; w < T::kWarpsN; ++w) mx = fmaxf(mx, m[w * T::kBlockM + r]);
    float top = mx;
    if constexpr (kSink) top = fmaxf(mx, sink2);
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kSlots; ++w) {
      const float mw = kSlotMerge ? m[w * T::kBlockM + r] : mx;
      R.f[w] = mw == neg_inf() ? 0.f : ex2(mw - top);
      sum = fmaf(l[w * T::kBlockM + r], R.f[w], sum);
    }
    if constexpr (kSink) sum += sink2 == neg_inf() ? 0.f : ex2(sink2 - top);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
#pragma unroll
    for (int w = 0; w < kSlots; ++w) R.f[w] *= inv;
    R.lse = sum > 0.f ? (top + lg2(sum)) * kLn2 : neg_inf();
    return R;
  }
  // Four normalized columns c .. c + 3 of row r.
  __device__ __forceinline__ float4 cols4(const Row& R, int r, int c) const {
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kSlots; ++w) {
      const float4 x = *reinterpret_cast<const float4*>(o + (w * T::kBlockM + r) * T::kOStride + c);
      v.x = fmaf(x.x, R.f[w], v.x);
      v.y = fmaf(x.y, R.f[w], v.y);
      v.z = fmaf(x.z, R.f[w], v.z);
      v.w = fmaf(x.w, R.f[w], v.w);
    }
    return v;
  }
};

// Writes the key groups' O, maxima and sums to the merge buffer. Starts and ends with a
// __syncthreads: the ring may be in use before, and the buffer is complete after.
__device__ __forceinline__ void merge_warps(Acc& a, const MergeBuf& buf, int wm, int wn, int lane, int tid) {
  const int g = lane >> 2, tq = lane & 3;
  const bool consumer = tid < T::kConsumerThreads;  // not the TMA producer warp
  __syncthreads();
#pragma unroll
  for (int m = 0; m < T::kMw; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (!consumer) break;
      a.l[m][h] += __shfl_xor_sync(0xffffffffu, a.l[m][h], 1);
      a.l[m][h] += __shfl_xor_sync(0xffffffffu, a.l[m][h], 2);
      const int r = (wm * T::kMw + m) * 16 + g + 8 * h;
      if (tq == 0) buf.m[wn * T::kBlockM + r] = a.m[m][h];
      if (kSlotMerge) {
        if constexpr (T::kFp8Direct) {  // O's columns in the FP8 V order (process_tile): 4 in a row a tile pair
          float* orow = buf.o + (wn * T::kBlockM + r) * T::kOStride + 4 * tq;
#pragma unroll
          for (int c = 0; c < T::kDTiles / 2; ++c)
            *reinterpret_cast<float4*>(orow + c * 16) =
                make_float4(a.o[m][2 * c][2 * h], a.o[m][2 * c + 1][2 * h], a.o[m][2 * c][2 * h + 1],
                            a.o[m][2 * c + 1][2 * h + 1]);
        } else {
        float* orow = buf.o + (wn * T::kBlockM + r) * T::kOStride + 2 * tq;
#pragma unroll
        for (int d = 0; d < T::kDTiles; ++d)
          *reinterpret_cast<float2*>(orow + d * 8) = make_float2(a.o[m][d][2 * h], a.o[m][d][2 * h + 1]);
        }
        if (tq == 0) buf.l[wn * T::kBlockM + r] = a.l[m][h];
      }
    }
  __syncthreads();
  if constexpr (!kSlotMerge) {
    // One slot: each key group in turn adds its O and sum, rescaled to the row's common max.
    float f[T::kMw][2];
#pragma unroll
    for (int m = 0; m < T::kMw; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = (wm * T::kMw + m) * 16 + g + 8 * h;
        float mx = neg_inf();
#pragma unroll
        for (int w = 0; w < T::kWarpsN; ++w) mx = fmaxf(mx, buf.m[w * T::kBlockM + r]);
        f[m][h] = a.m[m][h] == neg_inf() ? 0.f : ex2(a.m[m][h] - mx);
      }
#pragma unroll 1
    for (int w = 0; w < T::kWarpsN; ++w) {
      if (consumer && wn == w) {
#pragma unroll
        for (int m = 0; m < T::kMw; ++m)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = (wm * T::kMw + m) * 16 + g + 8 * h;
            if constexpr (T::kFp8Direct) {  // the FP8 V order, as above
              float* orow = buf.o + r * T::kOStride + 4 * tq;
#pragma unroll
              for (int c = 0; c < T::kDTiles / 2; ++c) {
                float4 v = make_float4(a.o[m][2 * c][2 * h] * f[m][h], a.o[m][2 * c + 1][2 * h] * f[m][h],
                                       a.o[m][2 * c][2 * h + 1] * f[m][h], a.o[m][2 * c + 1][2 * h + 1] * f[m][h]);
                if (w > 0) {
                  const float4 old = *reinterpret_cast<const float4*>(orow + c * 16);
                  v.x += old.x;
                  v.y += old.y;
                  v.z += old.z;
                  v.w += old.w;
                }
                *reinterpret_cast<float4*>(orow + c * 16) = v;
              }
            } else {
              float* orow = buf.o + r * T::kOStride + 2 * tq;
#pragma unroll
              for (int d = 0; d < T::kDTiles; ++d) {
                float2 v = make_float2(a.o[m][d][2 * h] * f[m][h], a.o[m][d][2 * h + 1] * f[m][h]);
                if (w > 0) {
                  const float2 old = *reinterpret_cast<const float2*>(orow + d * 8);
                  v.x += old.x;
                  v.y += old.y;
                }
                *reinterpret_cast<float2*>(orow + d * 8) = v;
              }
            }
            if (tq == 0) buf.l[r] = (w > 0 ? buf.l[r] : 0.f) + a.l[m][h] * f[m][h];
          }
      }
      __syncthreads();
    }
  }
}

// Query head `head`'s sink logit in log2 units (sinks builds).
__device__ __forceinline__ float sink_log2(const DecodeParams& p, int head) {
  return __ldg(p.variant.sinks + head) * kLog2e;
}

// Row r's weights for the output (not a piece): with sinks, its head's sink joins the row's
// softmax here, once (a piece of a split never includes it).
__device__ __forceinline__ MergeBuf::Row final_row(const DecodeParams& p, const MergeBuf& buf, int kvh, int row0,
                                                   int r) {
  if constexpr (T::kSinks) return buf.row<true>(r, sink_log2(p, kvh * p.group + (row0 + r) / p.seqlen_q));
  else return buf.row(r);
}

// O and LSE of the unit's rows row0 .. row0 + rows_here - 1 from a merged buffer.
__device__ __forceinline__ void store_final(const DecodeParams& p, const MergeBuf& buf, int b, int kvh, int row0,
                                            int rows_here, int tid) {
  for (int c = tid; c < rows_here * T::kChunksV; c += T::kThreads) {
    const int r = c / T::kChunksV, ch = c - r * T::kChunksV;
    const MergeBuf::Row R = final_row(p, buf, kvh, row0, r);
    const float4 lo = buf.cols4(R, r, ch * 8), hi = buf.cols4(R, r, ch * 8 + 4);
    uint4 out;
    out.x = pack2<T::kBf16>(lo.x, lo.y);
    out.y = pack2<T::kBf16>(lo.z, lo.w);
    out.z = pack2<T::kBf16>(hi.x, hi.y);
    out.w = pack2<T::kBf16>(hi.z, hi.w);
    const int rr = row0 + r, gq = rr / p.seqlen_q, i = rr - gq * p.seqlen_q;
    elem_t* dst = static_cast<elem_t*>(p.o) + b * p.o_stride[0] + (kvh * p.group + gq) * p.o_stride[1] +
                  i * p.o_stride[2] + ch * 8;
    *reinterpret_cast<uint4*>(dst) = out;
  }
  if (p.lse) {
    const int r_base = (b * p.heads_q + kvh * p.group) * p.seqlen_q + row0;
    for (int r = tid; r < rows_here; r += T::kThreads) p.lse[r_base + r] = final_row(p, buf, kvh, row0, r).lse;
  }
}

// A merged buffer's rows as a partial: normalized O to po (rows of kHeadDimV floats), LSE to pl.
__device__ __forceinline__ void store_piece(const MergeBuf& buf, float* po, float* pl, int rows_here, int tid) {
  constexpr int kQuads = T::kHeadDimV / 4;
  for (int c = tid; c < rows_here * kQuads; c += T::kThreads) {
    const int r = c / kQuads, c4 = c - r * kQuads;
    __stcg(reinterpret_cast<float4*>(po + r * T::kHeadDimV + c4 * 4), buf.cols4(buf.row(r), r, c4 * 4));
  }
  for (int r = tid; r < rows_here; r += T::kThreads) __stcg(pl + r, buf.row(r).lse);
}

// combine: clusterN: a merged buffer's rows as this split's piece, in place: normalized O over slot
// 0's rows (each (row, 4 columns) item is read and written by one thread only; the maxima and sums
// read by row() are not written), LSE to lse.
__device__ __forceinline__ void piece_in_place(const MergeBuf& buf, float* lse, int rows_here, int tid) {
  constexpr int kQuads = T::kHeadDimV / 4;
  for (int c = tid; c < rows_here * kQuads; c += T::kThreads) {
    const int r = c / kQuads, c4 = c - r * kQuads;
    const MergeBuf::Row R = buf.row(r);
    const float4 v = buf.cols4(R, r, c4 * 4);
    *reinterpret_cast<float4*>(buf.o + r * T::kOStride + c4 * 4) = v;
    if (c4 == 0) lse[r] = R.lse;
  }
}

// The pieces to merge: piece k's rows from global row r0, in the workspace (L2; split.h's layout).
struct SplitPieces {
  const DecodeParams& p;
  int r0;
  __device__ __forceinline__ const float* o(int k) const { return p.part_o + piece_o(k, r0, p.rows_total, T::kHeadDimV); }
  __device__ __forceinline__ float lse(int k, int r) const {
    return __ldcg(p.part_lse + piece_lse(k, r0, p.rows_total) + r);
  }
  __device__ __forceinline__ float4 o4(int k, int r, int c4) const {
    return __ldcg(reinterpret_cast<const float4*>(o(k) + r * T::kHeadDimV + c4 * 4));
  }
};

// combine: clusterN: split k's piece in the shared memory of cluster CTA k, at the same offsets in
// every CTA: normalized O rows of kOStride floats at o_at (the merge buffer's slot 0), LSE at lse_at.
struct ClusterPieces {
  u32 o_at, lse_at;
  __device__ __forceinline__ float lse(int k, int r) const;
  __device__ __forceinline__ float4 o4(int k, int r, int c4) const;
};
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ float ClusterPieces::lse(int k, int r) const { return ld_dsmem_f32(lse_at + 4 * r, k); }
__device__ __forceinline__ float4 ClusterPieces::o4(int k, int r, int c4) const {
  return ld_dsmem_f32x4(o_at + (r * T::kOStride + c4 * 4) * 4, k);
}
#else
__device__ __forceinline__ float ClusterPieces::lse(int, int) const { return 0.f; }  // sm_90 only (the space)
__device__ __forceinline__ float4 ClusterPieces::o4(int, int, int) const { return make_float4(0.f, 0.f, 0.f, 0.f); }
#endif

// Where a merge goes: the output (O in the call's dtype and layout, LSE if asked; kFinal: the
// sinks join here) ...
struct OutSink {
  static constexpr bool kFinal = true;
  __device__ __forceinline__ void put(const DecodeParams& p, int row, int, int c4, float4 v, float lse) const {
    if (c4 == 0 && p.lse) p.lse[row] = lse;
    const int bh = row / p.seqlen_q, i = row - bh * p.seqlen_q;
    const int b = bh / p.heads_q, hq = bh - b * p.heads_q;
    elem_t* dst = static_cast<elem_t*>(p.o) + b * p.o_stride[0] + hq * p.o_stride[1] + i * p.o_stride[2] + c4 * 4;
    uint2 out;
    out.x = pack2<T::kBf16>(v.x, v.y);
    out.y = pack2<T::kBf16>(v.z, v.w);
    *reinterpret_cast<uint2*>(dst) = out;
  }
};
// ... or a piece of the workspace (normalized fp32 rows of kHeadDimV at po, LSE at pl, from the
// merge's first row): combine clusterN with several clusters a unit.
struct PieceSink {
  static constexpr bool kFinal = false;
  float* po;
  float* pl;
  __device__ __forceinline__ void put(const DecodeParams&, int, int r, int c4, float4 v, float lse) const {
    if (c4 == 0) __stcg(pl + r, lse);
    __stcg(reinterpret_cast<float4*>(po + r * T::kHeadDimV + c4 * 4), v);
  }
};

// Merges `count` pieces of the global rows r0 .. r0 + nrows - 1 (piece k's row r: o4(k, r, c4),
// lse(k, r)) into `sink` (O and LSE, or a piece): one pass, each thread a (row, 4 columns) item
// with an online max over the pieces, so its loads of 16 pieces are in flight together (one
// round trip, no barrier). The weight of piece k is exp(lse_k - max); no piece with a key (every
// lse -inf): zeros and -inf. Into the output (Sink::kFinal) of a sinks build, the row's head's
// sink is one more piece, LSE s_h and O = 0 (so it joins each row once: a piece never has it).
// kUnroll: the pieces' loads unrolled (flash_decode_combine: T::kCombineUnroll).
template <class Pieces, class Sink = OutSink, int kUnroll = 16>
__device__ __forceinline__ void combine_rows(const DecodeParams& p, int r0, int nrows, const Pieces& pieces, int count,
                                             int tid, int nthreads, const Sink& sink = Sink{}) {
  constexpr int kQuads = T::kHeadDimV / 4;
  for (int it = tid; it < nrows * kQuads; it += nthreads) {
    const int r = it / kQuads, c4 = it - r * kQuads, row = r0 + r;
    float mx = neg_inf(), sum = 0.f, a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
    if constexpr (T::kSinks && Sink::kFinal) {
      mx = sink_log2(p, (row / p.seqlen_q) % p.heads_q);
      sum = mx == neg_inf() ? 0.f : 1.f;
    }
#pragma unroll kUnroll
    for (int k = 0; k < count; ++k) {
      const float v = pieces.lse(k, r) * kLog2e;
      const float4 x = pieces.o4(k, r, c4);
      const float mn = fmaxf(mx, v);
      const float f = mn == neg_inf() ? 1.f : ex2(mx - mn);
      const float w = v == neg_inf() ? 0.f : ex2(v - mn);
      mx = mn;
      sum = fmaf(sum, f, w);
      a0 = fmaf(w, x.x, a0 * f);
      a1 = fmaf(w, x.y, a1 * f);
      a2 = fmaf(w, x.z, a2 * f);
      a3 = fmaf(w, x.w, a3 * f);
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    sink.put(p, row, r, c4, make_float4(a0 * inv, a1 * inv, a2 * inv, a3 * inv),
             sum > 0.f ? (mx + lg2(sum)) * kLn2 : neg_inf());
  }
}

// ---- K/V loads -----------------------------------------------------------------------------------

// The cp.async loads of a tile of kDim-element rows (args.h): Q's and K's head dim, or V's. The
// same as traits.cuh's kRowLoads ... kLookups where kDim is kHeadDim.
template <int kDim>
struct LoadGeometry {
  static constexpr int kChunks = kDim / 8;
  static constexpr bool kRowLoads = decode_row_loads(kDim, T::kLoadThreads);
  static constexpr int kRowsPerPass = T::kLoadThreads / kChunks;
  static constexpr int kPasses = decode_load_passes(kDim, T::kLoadThreads, T::kLoadRows);
  static constexpr int kLoadItems = T::kLoadRows * kChunks;
  static constexpr bool kLoadsRagged = kLoadItems % T::kLoadThreads != 0;
  static constexpr int kLookups = decode_load_lookups(kDim, T::kLoadThreads, T::kLoadRows);
};

// This thread's share of a tile's loads (traits.cuh, args.h: row or block loads) of rows of kDim
// elements. Row loads: chunk l_ch of tile rows l_row + pass * kRowsPerPass. Block loads: item l_ch
// + pass * kLoadThreads of the group's rows from l_row (decode_block_item: its row and chunk),
// whose row is that of pass % kLookups. Paged, the page and row in page of each of the kLookups
// rows, looked up a tile ahead so the table's latency hides behind a tile of compute. One loader
// copies K and V rows where they have one head dim; with split dims K's and V's have their own
// (SplitLoader).
template <int kDim>
struct LoaderOf {
  using G = LoadGeometry<kDim>;
  int l_row, l_ch;
  int pg[G::kLookups], pr[G::kLookups];

  __device__ __forceinline__ void init(int lt, int wn) {
    if constexpr (G::kRowLoads) {
      l_row = (T::kWarpTiles ? wn * T::kWarpKeys : 0) + lt / G::kChunks;
      l_ch = lt % G::kChunks;
    } else {
      l_row = T::kWarpTiles ? wn * T::kWarpKeys : 0;
      l_ch = lt;
    }
#pragma unroll
    for (int i = 0; i < G::kLookups; ++i) pg[i] = pr[i] = 0;
  }
  // Block loads: the tile row and the chunk of pass i.
  __device__ __forceinline__ int block_row(int i) const {
    return l_row + decode_block_item_row(l_ch + i * T::kLoadThreads, T::kLoadRows, kDim);
  }
  __device__ __forceinline__ int block_chunk(int i) const {
    return decode_block_item_chunk(l_ch + i * T::kLoadThreads, T::kLoadRows, kDim);
  }
  // Paged: the pages of tile `tile` of sequence b (len keys; window builds, the unit's keys from kb:
  // no block-table entry of a page wholly before the window is read, as a cache may have let
  // those pages go).
  __device__ __forceinline__ void lookup(const DecodeParams& p, int b, int tile, int len, int kb) {
    const int* bt = p.block_table + static_cast<long long>(b) * p.max_blocks_per_seq;
#pragma unroll
    for (int i = 0; i < G::kLookups; ++i) {
      int j;
      if constexpr (G::kRowLoads) j = tile * T::kBlockN + l_row + i * G::kRowsPerPass;
      else j = tile * T::kBlockN + block_row(i);
      bool in = j < len;
      if constexpr (T::kWindow) in = in && j >= kb;
      if (in) {
        const int page = page_index(j, p);
        pg[i] = __ldg(bt + page);
        pr[i] = j - page * p.page_size;
      }
    }
  }
  // K rows (kK) and V rows (kV) of tile `tile` of (b, kvh) into the stage at sk (K) and sk +
  // Smem::kV (V); rows at or past len (window builds: before kb, the unit's first key) are
  // zero-filled, never read. Paged: after lookup(b, tile).
  template <bool kK = true, bool kV = true>
  __device__ __forceinline__ void issue(const DecodeParams& p, bool paged, int b, int kvh, int tile, int len, int kb,
                                        u32 sk) const {
    const u32 sv = sk + Smem::kV;
    const elem_t* kg =
        static_cast<const elem_t*>(p.k) + kvh * p.k_stride[1] + (paged ? 0 : b * p.k_stride[0]) + l_ch * 8;
    const elem_t* vg =
        static_cast<const elem_t*>(p.v) + kvh * p.v_stride[1] + (paged ? 0 : b * p.v_stride[0]) + l_ch * 8;
#pragma unroll
    for (int i = 0; i < G::kPasses; ++i) {
      if constexpr (G::kLoadsRagged)
        if (l_ch + i * T::kLoadThreads >= G::kLoadItems) break;  // the last pass's items past the rows' blocks
      const int li = G::kRowLoads ? i : i % G::kLookups;  // the lookup (row) of pass i
      const int row = G::kRowLoads ? l_row + i * G::kRowsPerPass : block_row(i), j = tile * T::kBlockN + row;
      const int ch = G::kRowLoads ? l_ch : block_chunk(i);
      bool valid = j < len;
      if constexpr (T::kWindow) valid = valid && j >= kb;
      long long ko, vo;
      if (paged) {
        ko = pg[li] * p.k_stride[0] + pr[li] * p.k_stride[2];
        vo = pg[li] * p.v_stride[0] + pr[li] * p.v_stride[2];
      } else {
        ko = j * p.k_stride[2];
        vo = j * p.v_stride[2];
      }
      if constexpr (!G::kRowLoads) {  // the pass's chunk (kg and vg are at chunk l_ch)
        ko += (ch - l_ch) * 8;
        vo += (ch - l_ch) * 8;
      }
      const u32 at = tile_bytes<kDim>(row, ch, T::kBlockN, row & 7);
      if constexpr (kK) cp_async_16(sk + at, valid ? kg + ko : kg, valid);
      if constexpr (kV) cp_async_16(sv + at, valid ? vg + vo : vg, valid);
    }
  }
};

// Split dims: K's rows (d) and V's (dv) are copied by loaders of their own, each thread its share of
// each (other rows and chunks; paged, lookups of their own). (One head dim: LoaderOf<kHeadDim>
// copies both, each thread the same rows and chunks of K and V. Rows of kKDim and kVDim elements:
// an FP8 cache's rows are half as many 16-bit elements, traits.cuh.)
struct SplitLoader {
  LoaderOf<T::kKDim> k;
  LoaderOf<T::kVDim> v;
  __device__ __forceinline__ void init(int lt, int wn) {
    k.init(lt, wn);
    v.init(lt, wn);
  }
  __device__ __forceinline__ void lookup(const DecodeParams& p, int b, int tile, int len, int kb) {
    k.lookup(p, b, tile, len, kb);
    v.lookup(p, b, tile, len, kb);
  }
  __device__ __forceinline__ void issue(const DecodeParams& p, bool paged, int b, int kvh, int tile, int len, int kb,
                                        u32 sk) const {
    k.issue<true, false>(p, paged, b, kvh, tile, len, kb, sk);
    v.issue<false, true>(p, paged, b, kvh, tile, len, kb, sk);
  }
};
template <bool kSplit>
struct LoaderPick {
  using type = LoaderOf<T::kKDim>;
};
template <>
struct LoaderPick<true> {
  using type = SplitLoader;
};
using Loader = LoaderPick<T::kSplitDims>::type;

// ---- TMA K/V loads (KV_LOAD tma, sm_90) ---------------------------------------------------------

#ifndef KV_EVICT_FIRST
#define KV_EVICT_FIRST 0  // experiment: L2 evict_first hint on the K/V boxes (README: measured)
#endif

// One K/V box (tma_load_4d), with an L2 evict_first policy when KV_EVICT_FIRST.
__device__ __forceinline__ void kv_box(u32 dst, const TmaDesc* desc, u32 bar, int c0, int c1, int c2, int c3,
                                       u64 policy) {
#if KV_EVICT_FIRST
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3, "
      "%4, %5}], [%6], %7;\n" ::"r"(dst),
      "l"(reinterpret_cast<u64>(desc)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar), "l"(policy)
      : "memory");
#else
  (void)policy;
  tma_load_4d(dst, desc, bar, c0, c1, c2, c3);
#endif
}

// The producer warp: the CTA's tiles of (b, kvh) into the ring, tile t (the CTA's t-th) into stage
// t % kStages once its consumers released it (empty barrier, kWarps arrivals), its tile index in
// tags[stage], completing full[stage] by the bytes issued; then a tag of -1 (no bytes) ends the
// consumers' loop. The CTA's tiles: t_begin .. t_begin + n - 1 (its split's share). (Splits that
// claimed chunks of their unit's tiles dynamically, so that a unit's CTAs end together, measured
// no faster: README.md.) Contiguous: one box of (64, kBlockN) rows
// per column block of K and of V (rows past seqlen_k zero-filled by TMA). Paged: boxes of
// p.tma_rows rows (within a page), each lane looking up the pages of its boxes; boxes wholly past
// len are not issued, nor (window builds) those wholly before the unit's first key kb, whose pages
// a cache may have let go (the consumers zero what the sequence and the window do not cover).
__device__ __forceinline__ void tma_producer(const DecodeParams& p, const DecodeMaps& maps, u32 s_ring, RingBars bars,
                                             int* tags, int b, int kvh, int t_begin, int n, int len, int kb,
                                             int lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kColBlocks = T::kColBlocks;
  const bool paged = p.block_table != nullptr;
  const int* bt = paged ? p.block_table + static_cast<long long>(b) * p.max_blocks_per_seq : nullptr;
  const int rows = p.tma_rows;
  u64 policy = 0;
#if KV_EVICT_FIRST
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
#endif
  int t = 0;
  for (int tile = t_begin; tile < t_begin + n; ++tile, ++t) {
    const int stage = t % T::kStages, round = t / T::kStages;
    const int j0 = tile * T::kBlockN;
    const int here = min(T::kBlockN, len - j0);  // keys of the tile in the sequence (>= 1)
    const int issued = paged ? (here + rows - 1) / rows : 1;
    int skip = 0;  // paged, window builds: the boxes wholly before kb
    if constexpr (T::kWindow) skip = paged && kb > j0 ? (kb - j0) / rows : 0;
    // This lane's first box's page, looked up before the wait so the table's latency overlaps it.
    int pg0 = 0, pr0 = 0;
    if (paged && skip + lane < issued) {
      const int j = j0 + (skip + lane) * rows, page = page_index(j, p);
      pg0 = __ldg(bt + page);
      pr0 = j - page * p.page_size;
    }
    if (round > 0) mbar_wait(bars.empty(stage), (round - 1) & 1);
    if (lane == 0) tags[stage] = tile;  // published by the arrive below (release)
    __syncwarp();
    const u32 full = bars.full(stage);
    const u32 sk = Smem::k_tile(s_ring, stage), sv = sk + Smem::kV;
    // Box x of column block c lands at its rows x * rows of the tile's column block c (TMA swizzles
    // the rows inside the box).
    // Split dims: K's column blocks (d's), then V's (dv's, boxes of their width).
    if (!paged) {
      if (lane == 0) {
        mbar_arrive_expect_tx(full, T::kStageBytes);
        if constexpr (!T::kSplitDims) {
#pragma unroll
          for (int c = 0; c < kColBlocks; ++c) {
            kv_box(sk + c * Smem::kColBlock, &maps.k, full, c * T::kBlockCols, j0, kvh, b, policy);
            kv_box(sv + c * Smem::kColBlock, &maps.v, full, c * T::kBlockCols, j0, kvh, b, policy);
          }
        } else {
#pragma unroll
          for (int c = 0; c < kColBlocks; ++c)
            kv_box(sk + c * Smem::kColBlock, &maps.k, full, c * T::kBlockCols, j0, kvh, b, policy);
#pragma unroll
          for (int c = 0; c < T::kColBlocksV; ++c)
            kv_box(sv + c * Smem::kColBlockV, &maps.v, full, c * T::kBlockColsV, j0, kvh, b, policy);
        }
      }
    } else {
      if (lane == 0)
        mbar_arrive_expect_tx(full, T::kSplitDims
                                        ? static_cast<u32>((issued - skip) * rows * (T::kRowBytes + T::kRowBytesV))
                                        : static_cast<u32>((issued - skip) * rows * T::kRowBytes * 2));
      __syncwarp();
      for (int x = skip + lane; x < issued; x += 32) {
        int pg = pg0, pr = pr0;
        if (x != skip + lane) {
          const int j = j0 + x * rows, page = page_index(j, p);
          pg = __ldg(bt + page);
          pr = j - page * p.page_size;
        }
        if constexpr (!T::kSplitDims) {
#pragma unroll
          for (int c = 0; c < kColBlocks; ++c) {
            kv_box(sk + c * Smem::kColBlock + x * rows * Smem::kRow, &maps.k, full, c * T::kBlockCols, pr, kvh, pg,
                   policy);
            kv_box(sv + c * Smem::kColBlock + x * rows * Smem::kRow, &maps.v, full, c * T::kBlockCols, pr, kvh, pg,
                   policy);
          }
        } else {
#pragma unroll
          for (int c = 0; c < kColBlocks; ++c)
            kv_box(sk + c * Smem::kColBlock + x * rows * Smem::kRow, &maps.k, full, c * T::kBlockCols, pr, kvh, pg,
                   policy);
#pragma unroll
          for (int c = 0; c < T::kColBlocksV; ++c)
            kv_box(sv + c * Smem::kColBlockV + x * rows * Smem::kRowV, &maps.v, full, c * T::kBlockColsV, pr, kvh, pg,
                   policy);
        }
      }
    }
  }
  // The end: a tag of -1 in the next stage, a plain arrival (no bytes).
  const int stage = t % T::kStages, round = t / T::kStages;
  if (round > 0) mbar_wait(bars.empty(stage), (round - 1) & 1);
  if (lane == 0) {
    tags[stage] = -1;
    mbar_arrive(bars.full(stage));
  }
#endif
}

// The unit's workspace pieces (`pieces` of them, each CTA's or cluster's, already stored and
// fenced by every thread that wrote them, the CTA synchronized) merged by the CTA whose arrival at
// the unit's counter is the last; it resets the counter for the next launch (threadFenceReduction's
// pattern).
__device__ __forceinline__ void merge_if_last(const DecodeParams& p, int b, int kvh, int rb, int pieces, int r_base,
                                              int rows_here, int tid) {
  __shared__ int s_last;
  if (tid == 0) {
    int* counter = p.counters + unit_counter(b, kvh, rb, p.heads_kv, p.row_blocks);
    s_last = atomicAdd(counter, 1) == pieces - 1;
    if (s_last) *counter = 0;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  combine_rows(p, r_base, rows_here, SplitPieces{p, r_base}, pieces, tid, T::kThreads);
}

// ---- the main kernel ----------------------------------------------------------------------------

// FP8 caches of bf16 problems: Q's power of two (q_exponent) once Q is in shared memory: qmul = 2^-e,
// and 2^e joins K's scale (kds). Nothing otherwise.
__device__ __forceinline__ void q_fp16(u32 s_q, int lane, float& kds, float& qmul) {
  if constexpr (T::kKvFp8 && T::kBf16) {
    const int e = q_exponent(s_q, lane);
    qmul = __int_as_float((127 - e) << 23);
    kds *= __int_as_float((127 + e) << 23);
  }
}

// fp8_convert group, bf16 problems: Q rewritten in shared memory as fp16 times qmul (exact: q_fp16),
// which the 16-bit path's ldmatrix then reads as the fp16 MMAs' A operand; qmul becomes 1. Between
// two syncs of every consumer (q_exponent reads the whole tile; every warp reads every row after).
template <class Sync>
__device__ __forceinline__ void q_rewrite_fp16(u32 s_q, float& qmul, int tid, Sync sync) {
  if constexpr (T::kFp8Group && T::kBf16) {
    sync();
    for (int w = tid; w < T::kBlockM * T::kQRowBytes / 16; w += T::kConsumerThreads) {
      u32 x[4];
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
                   : "r"(s_q + 16 * w));
#pragma unroll
      for (int e = 0; e < 4; ++e) x[e] = bf16x2_to_f16x2(x[e], qmul);
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(s_q + 16 * w), "r"(x[0]), "r"(x[1]), "r"(x[2]),
                   "r"(x[3])
                   : "memory");
    }
    sync();
    qmul = 1.f;
  }
}

__device__ __forceinline__ void decode_split(const DecodeParams& p, const DecodeMaps& maps, unsigned char* smem) {
  __shared__ float s_lse[T::kClusterMerge ? T::kBlockM : 1];  // clusterN: this split's piece's LSE
  __shared__ __align__(8) unsigned long long s_bars[T::kKvTma ? RingBars::kCount : 1];  // TMA: full, empty
  __shared__ int s_tags[T::kKvTma ? T::kStages : 1];  // TMA: each stage's tile (-1: no more)
  const u32 s_q = smem_addr(smem) + Smem::kQ;
  const u32 s_ring = s_q - Smem::kQ + Smem::kRing;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp % T::kWarpsM, wn = warp / T::kWarpsM;  // row group, key group
  // This CTA's split and row block (split.h; clusterN: from the grid's split count, and bind may
  // ask for fewer: the clusters past them exit).
  const SplitCta cta = split_cta<T::kClusterMerge>(blockIdx.x, gridDim.x, p.row_blocks);
  const int split = cta.split, rb = cta.rb;
  if (split >= p.num_splits) return;  // launched without its workspace: split 0 does it all
  const int kvh = blockIdx.y, b = blockIdx.z;

  const int len = seq_len(p, b);
  // The unit's keys [kb, len) and this CTA's share of their tiles (split.h): every key but in
  // window builds, whose splits share only what the rows' windows span, as evenly as it goes.
  int kb = 0;
  TileShare share;
  if constexpr (T::kWindow) {
    kb = unit_first_key(len, p.seqlen_q, p.variant.window_left);
    share = split_tiles_even(unit_tiles(kb, len, T::kBlockN), p.num_splits, split);
  } else {
    share = split_tiles(unit_tiles(0, len, T::kBlockN), p.num_splits, split);
  }
  const int t_begin = share.begin, n = share.n;
  const int row0 = rb * T::kBlockM;
  const int rows_here = min(T::kBlockM, p.rows - row0);
  const bool paged = p.block_table != nullptr;

  // FP8 caches: this unit's (sequence, KV head) dequantisation scales (1 without a table).
  float kds = 1.f, vds = 1.f;
  if constexpr (T::kKvFp8) {
    const KvScales& s = p.kv;
    if (s.k_descale) kds = __ldg(s.k_descale + b * s.k_descale_stride[0] + kvh * s.k_descale_stride[1]);
    if (s.v_descale) vds = __ldg(s.v_descale + b * s.v_descale_stride[0] + kvh * s.v_descale_stride[1]);
  }
  (void)vds;
  float qmul = 1.f;  // FP8 caches, bf16 problems: Q's factor 2^-e (q_exponent), 2^e joining kds

  Acc acc;
  acc_reset(acc);
  Limits lim;
  row_limits(lim, p, row0, len, wm, lane >> 2);
  QFrags qf;

  if constexpr (T::kKvTma) {
    const RingBars bars{smem_addr(s_bars)};
    if (tid == 0) {
      for (int i = 0; i < T::kStages; ++i) {
        mbar_init(bars.full(i), 1);
        mbar_init(bars.empty(i), T::kWarps);
      }
      mbar_init_fence();
    }
    __syncthreads();
    if (warp == T::kWarps) {
      tma_producer(p, maps, s_ring, bars, s_tags, b, kvh, t_begin, n, len, kb, lane);
    } else {
      if (!DECODE_X_SKIP_Q) {
        load_q(p, s_q, b, kvh, row0, rows_here, tid);
        cp_async_commit();
        cp_async_wait<0>();
        named_sync(T::kBarConsumers, T::kConsumerThreads);
        q_fp16(s_q, lane, kds, qmul);
        q_rewrite_fp16(s_q, qmul, tid, [] { named_sync(T::kBarConsumers, T::kConsumerThreads); });
        load_q_frags(qf, s_q, wm, lane, qmul);
      }
      const int xr = p.tma_swizzle ? (lane & 7) : 0;
      for (int t = 0;; ++t) {
        const int stage = t % T::kStages;
        mbar_wait(bars.full(stage), (t / T::kStages) & 1);
        const int tile = *static_cast<volatile int*>(s_tags + stage);
        if (tile < 0) break;
        if constexpr (T::kFp8Group) {
          // Convert the group's slice once, release the stage, wait for the group, score the 16-bit
          // copy (rows outside the sequence or window zeroed by the conversion).
          const u32 k16 = Smem::k16(s_ring, T::kStage16Bufs == 2 ? t & 1 : 0);
          convert_slice(Smem::k_tile(s_ring, stage), k16, wn, wm * 32 + lane, p.tma_swizzle != 0, tile * T::kBlockN,
                        kb, len);
          __syncwarp();
          if (lane == 0) mbar_arrive(bars.empty(stage));
          named_sync(T::kBarConvert + wn, 32 * T::kWarpsM);
          if (DECODE_X_SKIP_MATH != 1)
            process_tile(acc, qf, s_q, k16 + wn * T::kWarpKeys * Smem::kRow16,
                         k16 + Smem::kV16 + wn * T::kWarpKeys * Smem::kRow16V, tile * T::kBlockN + wn * T::kWarpKeys,
                         lim, p.scale_log2, p.variant, wm, lane, lane & 7, kds, qmul);
          // One buffer: the group has read it before anyone converts the next tile into it.
          if constexpr (T::kStage16Bufs == 1) named_sync(T::kBarConvert + wn, 32 * T::kWarpsM);
          continue;
        }
        const u32 k_tile = Smem::k_tile(s_ring, stage) + wn * T::kWarpKeys * Smem::kRow;  // this warp's key slice
        const int kw0 = tile * T::kBlockN + wn * T::kWarpKeys;
        // Keys of this warp's slice past the sequence: their V rows may hold anything (rows the
        // boxes did not cover, or K/V past len): zero them (P is 0 there, but 0 * NaN is NaN).
        const int past = kw0 + T::kWarpKeys - len;
        if (past > 0) {
          const int first = max(0, T::kWarpKeys - past);
          for (int c = lane; c < (T::kWarpKeys - first) * T::kVTileChunks; c += 32) {
            const int r = first + c / T::kVTileChunks, ch = c % T::kVTileChunks;
            asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(Smem::v_slice(k_tile, wn * T::kWarpKeys) + (ch >> T::kBlockChunksLog2V) * Smem::kColBlockV + r * Smem::kRowV + ((ch & (T::kBlockChunksV - 1)) << 4)),
                         "r"(0)
                         : "memory");
          }
          __syncwarp();
        }
        // Window builds: the slice's keys before the unit's first: their boxes were not issued
        // (paged) or hold keys no row sees, whatever they are: zero their V rows too.
        int before = 0;
        if constexpr (T::kWindow) {
          before = min(kb - kw0, T::kWarpKeys);
          if (before > 0) {
            for (int c = lane; c < before * T::kVTileChunks; c += 32) {
              const int r = c / T::kVTileChunks, ch = c % T::kVTileChunks;
              asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(Smem::v_slice(k_tile, wn * T::kWarpKeys) + (ch >> T::kBlockChunksLog2V) * Smem::kColBlockV + r * Smem::kRowV + ((ch & (T::kBlockChunksV - 1)) << 4)),
                           "r"(0)
                           : "memory");
            }
            __syncwarp();
          }
        }
        if (DECODE_X_SKIP_MATH != 1)
          process_tile(acc, qf, s_q, k_tile, Smem::v_slice(k_tile, wn * T::kWarpKeys), kw0, lim, p.scale_log2, p.variant,
                       wm, lane, xr, kds, qmul);
        // The generic-proxy zeros before TMA's next writes to the stage.
        if (past > 0 || before > 0) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncwarp();
        if (lane == 0) mbar_arrive(bars.empty(stage));
      }
    }
  } else {
    load_q(p, s_q, b, kvh, row0, rows_here, tid);
    cp_async_commit();  // Q: a group of its own

    Loader ld;
    ld.init(T::kWarpTiles ? tid - wn * T::kWarpsM * 32 : tid, wn);
    if (paged && n > 0) ld.lookup(p, b, t_begin, len, kb);
#pragma unroll
    for (int s = 0; s < T::kStages - 1; ++s) {
      if (s < n) {
        ld.issue(p, paged, b, kvh, t_begin + s, len, kb, Smem::k_tile(s_ring, s));
        if (paged && s + 1 < n) ld.lookup(p, b, t_begin + s + 1, len, kb);
      }
      cp_async_commit();
    }

    cp_async_wait<T::kStages - 1>();  // Q landed (this thread's copies) ...
    __syncthreads();                  // ... and everyone's
    q_fp16(s_q, lane, kds, qmul);
    q_rewrite_fp16(s_q, qmul, tid, [] { __syncthreads(); });
    load_q_frags(qf, s_q, wm, lane, qmul);

    int slot = 0, slot_issue = T::kStages - 1;
    for (int t = 0; t < n; ++t) {
      cp_async_wait<T::kStages - 2>();  // tile t landed (this thread's copies) ...
      tile_sync(wn);                    // ... and the group's; slot (t - 1) % kStages is free
      if (t + T::kStages - 1 < n) {
        ld.issue(p, paged, b, kvh, t_begin + t + T::kStages - 1, len, kb, Smem::k_tile(s_ring, slot_issue));
        if (paged && t + T::kStages < n) ld.lookup(p, b, t_begin + t + T::kStages, len, kb);
      }
      cp_async_commit();
      if constexpr (T::kFp8Group) {  // the group's slice converted once, as in the TMA loop above
        // (One buffer: the next iteration's tile_sync waits for the group's reads of it.)
        const u32 k16 = Smem::k16(s_ring, T::kStage16Bufs == 2 ? t & 1 : 0);
        convert_slice(Smem::k_tile(s_ring, slot), k16, wn, wm * 32 + lane, true, (t_begin + t) * T::kBlockN, kb, len);
        named_sync(T::kBarConvert + wn, 32 * T::kWarpsM);
        process_tile(acc, qf, s_q, k16 + wn * T::kWarpKeys * Smem::kRow16,
                     k16 + Smem::kV16 + wn * T::kWarpKeys * Smem::kRow16V,
                     (t_begin + t) * T::kBlockN + wn * T::kWarpKeys, lim, p.scale_log2, p.variant, wm, lane, lane & 7,
                     kds, qmul);
      } else {
      const u32 k_tile = Smem::k_tile(s_ring, slot) + wn * T::kWarpKeys * Smem::kRow;  // this warp's key slice
      process_tile(acc, qf, s_q, k_tile, Smem::v_slice(k_tile, wn * T::kWarpKeys),
                   (t_begin + t) * T::kBlockN + wn * T::kWarpKeys, lim,
                   p.scale_log2, p.variant, wm, lane, lane & 7, kds, qmul);
      }
      slot = slot + 1 == T::kStages ? 0 : slot + 1;
      slot_issue = slot_issue + 1 == T::kStages ? 0 : slot_issue + 1;
    }
    cp_async_wait<0>();
  }

  // Merge the key groups in the ring (free once every copy has landed: the consumers waited on
  // every tile the producer issued).
  if (DECODE_X_SKIP_EPI) {
    float sink = acc.l[0][0] + acc.m[0][1];
#pragma unroll
    for (int d = 0; d < T::kDTiles; ++d) sink += acc.o[0][d][0] + acc.o[0][d][1] + acc.o[0][d][2] + acc.o[0][d][3];
    if (sink == 1234.5f) p.lse[0] = sink;
    return;
  }
  if constexpr (T::kKvFp8) {  // V's scale: O is linear in V
#pragma unroll
    for (int m = 0; m < T::kMw; ++m)
#pragma unroll
      for (int d = 0; d < T::kDTiles; ++d)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc.o[m][d][e] *= vds;
  }
  const MergeBuf buf(reinterpret_cast<float*>(smem));
  merge_warps(acc, buf, wm, wn, lane, tid);
  // Global row id of the unit's row row0 (lse's index; a unit's rows are contiguous).
  const int r_base = (b * p.heads_q + kvh * p.group) * p.seqlen_q + row0;
  if constexpr (T::kClusterMerge) {
    // Each split's piece in its own shared memory; then the cluster's threads, kCluster * kThreads,
    // merge the unit's rows reading the pieces remotely (item it of the rows goes to CTA it %
    // kCluster); the second sync keeps every CTA's memory until the last remote read. One cluster
    // a unit: the merge is the output. Several: it is the cluster's piece (workspace slot `group`),
    // and the last cluster of the unit to finish merges the pieces, as combine: last_cta does.
    piece_in_place(buf, s_lse, rows_here, tid);
    cluster_sync_acq_rel();
    const int rank = split_rank(split, T::kCluster), group = split_piece(split, T::kCluster),
              groups = split_pieces(p.num_splits, T::kCluster);
    const ClusterPieces pieces{smem_addr(buf.o), smem_addr(s_lse)};
    if (groups == 1) {
      combine_rows(p, r_base, rows_here, pieces, T::kCluster, tid * T::kCluster + rank, T::kThreads * T::kCluster);
      cluster_sync_acq_rel();
      return;
    }
    combine_rows(p, r_base, rows_here, pieces, T::kCluster, tid * T::kCluster + rank, T::kThreads * T::kCluster,
                 PieceSink{p.part_o + piece_o(group, r_base, p.rows_total, T::kHeadDimV),
                           p.part_lse + piece_lse(group, r_base, p.rows_total)});
    __threadfence();         // this thread's part of the piece, before the cluster's arrival ...
    cluster_sync_acq_rel();  // ... and every remote read done: the other CTAs may exit
    if (rank == 0) merge_if_last(p, b, kvh, rb, groups, r_base, rows_here, tid);
    return;
  }
  if (p.num_splits == 1) {
    store_final(p, buf, b, kvh, row0, rows_here, tid);
    return;
  }
  store_piece(buf, p.part_o + piece_o(split_piece(split, T::kCluster), r_base, p.rows_total, T::kHeadDimV),
              p.part_lse + piece_lse(split_piece(split, T::kCluster), r_base, p.rows_total), rows_here, tid);
  if constexpr (T::kLastCta) {
    __threadfence();
    __syncthreads();
    merge_if_last(p, b, kvh, rb, p.num_splits, r_base, rows_here, tid);
  }
}

// combine: clusterN: the grid in clusters of kCluster CTAs along x (the plan's grid.x is a multiple).
#if CLUSTER > 1 && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900)
#define ATT_DECODE_CLUSTER_DIMS __cluster_dims__(CLUSTER, 1, 1)
#else
#define ATT_DECODE_CLUSTER_DIMS
#endif
extern "C" __global__ void __launch_bounds__(T::kThreads, T::kCtasPerSm) ATT_DECODE_CLUSTER_DIMS
    flash_decode(const DecodeParams p, const __grid_constant__ DecodeMaps maps) {
  extern __shared__ __align__(1024) unsigned char smem[];
#ifdef DECODE_TRACE
  DECODE_TRACE(0);
#endif
  decode_split(p, maps, smem);
#ifdef DECODE_TRACE
  DECODE_TRACE(1);
#endif
}

// Merges the splits' partials (combine: kernel): kCombineRows global rows per
// CTA, one (row, 4 columns) item per thread.
extern "C" __global__ void __launch_bounds__(T::kCombineThreads)
    flash_decode_combine(const DecodeParams p, const __grid_constant__ DecodeMaps) {
  if (p.num_splits <= 1) return;  // the main kernel wrote o
  const int r0 = blockIdx.x * T::kCombineRows;
  const int nrows = min(T::kCombineRows, p.rows_total - r0);
  if (nrows <= 0) return;
  combine_rows<SplitPieces, OutSink, T::kCombineUnroll>(p, r0, nrows, SplitPieces{p, r0}, p.num_splits, threadIdx.x,
                                                        T::kCombineThreads);
}

}  // namespace att
