// flash_fwd_mma: FlashAttention-2-class forward attention for sm_80..sm_90 using mma.sync.
//
// One thread block computes kBlockM query rows of one (batch, head) against all visible keys.
// K/V tiles stream through a ring of shared-memory stages by 16-byte cp.async; scores S = Q.K^T
// and the output O += P.V use mma.sync m16n8k16 with fp32 accumulators; softmax is online, in
// registers, with exp2 and log2(e) folded into the scale; P never leaves registers (the MMA
// accumulator layout of two n8 tiles is the A-operand layout of one k16 step).
#include "../common/attn_params.h"
#include "../common/ptx.cuh"
#include "tiles.h"
#include "traits.cuh"

namespace att {

using T = Traits;

// Compile-time loop: f.run<0>(), ..., f.run<N-1>(), so each step can name immediates. (Functors,
// not generic lambdas: NVRTC takes a generic lambda's operator() for a host function.)
template <int I, int N, class F>
__device__ __forceinline__ void unroll(F& f) {
  if constexpr (I < N) {
    f.template run<I>();
    unroll<I + 1, N>(f);
  }
}

// The cp.async passes of load_tile and load_tile_paged over a tile of kRows rows of kDim elements
// (Q's and K's head dim, or V's): tiles.h's CopyGeometry (panels of a row, rows a pass, immediate
// offsets).
template <int kRows, int kDim = T::kHeadDim>
using CopyPasses = mma_tiles::CopyGeometry<kDim, T::kThreads, kRows>;

// Pass f of load_tile: zero-filled past row_end when kChecked.
template <int kRows, bool kChecked, int kDim>
struct CopyRows {
  using S = CopyPasses<kRows, kDim>;
  u32 dst0, dst1;
  const elem_t* src;
  long long step;
  const elem_t* gmem;
  int row, row_end;
  template <int f>
  __device__ __forceinline__ void run() {
    constexpr int it = S::row_pass(f), pi = S::panel_pass(f);
    constexpr int kOff = S::off(f);
    const u32 dst = S::odd(f) ? dst1 : dst0;
    if (S::all_copy(f) || S::thread_tail(threadIdx.x)) {
      // (src itself: a local copy of it changed the row checks' code at d = 64, 128, 256)
      if constexpr (kChecked) {
        const bool valid = row + it * S::kRowsPerIter < row_end;
        cp_async_16_at<kOff>(dst, valid ? src + pi * S::kPanelElems : gmem, valid);
      } else {
        cp_async_16_at<kOff>(dst, src + pi * S::kPanelElems);
      }
    }
    if constexpr (pi == S::kPanelIters - 1) src += step;
  }
};

// Issues the cp.async copies of rows [row0, row0 + kRows) of a (rows, kHeadDim) tensor slice into
// the swizzled smem tile at byte address `tile`. Rows at or past row_end are zero-filled (they are
// masked or not stored); only a tile that crosses row_end pays for the row checks. Each thread
// copies its chunk of rows r + it * kRowsPerIter (CopyPasses; with one panel a pass, thread t
// copies chunk t % kChunksPerRow of rows t / kChunksPerRow + it * kRowsPerIter): one global
// pointer advanced by a uniform step (the panels at immediate offsets from it), and smem offsets
// that are immediates from dst0 or dst1 (row r + kRowsPerIter, used only when kRowsPerIter == 4).
template <int kRows, int kDim = T::kHeadDim>
__device__ __forceinline__ void load_tile(u32 tile, const elem_t* gmem, long long row_stride, int row0,
                                          int row_end) {
  using S = CopyPasses<kRows, kDim>;
  // One panel a pass: written out, so that it compiles as before panels (through a call it did not).
  const int r = S::kPanelsPerIter == 1 ? threadIdx.x / S::kChunks : S::thread_row(threadIdx.x);
  const int chunk = S::kPanelsPerIter == 1 ? threadIdx.x % S::kChunks : S::thread_chunk(threadIdx.x);
  const u32 dst0 = tile + swizzled<kDim>(r, chunk) * 2;
  const u32 dst1 = S::kRowsPerIter % 8 == 0 ? dst0 : tile + swizzled<kDim>(r + S::kRowsPerIter, chunk) * 2;
  const elem_t* src = gmem + (row0 + r) * row_stride + chunk * 8;
  const long long step = S::kRowsPerIter * row_stride;
  if (row0 + kRows <= row_end) {
    CopyRows<kRows, false, kDim> copy{dst0, dst1, src, step, gmem, row0 + r, row_end};
    unroll<0, S::kPasses>(copy);
  } else {
    CopyRows<kRows, true, kDim> copy{dst0, dst1, src, step, gmem, row0 + r, row_end};
    unroll<0, S::kPasses>(copy);
  }
}

// Pass f of load_tile_paged with one panel a pass (f is the row pass): row r + f * kRowsPerIter of
// the sequence's keys, through the page table (row j: row j % page_size of page table[j /
// page_size]), zero-filled past row_end.
template <int kRows, int kDim>
struct CopyPagedRows {
  using S = CopyPasses<kRows, kDim>;
  u32 dst0, dst1;
  const elem_t* base;  // the head's row 0 of page 0, this thread's chunk
  const AttnParams& p;
  const int* table;
  long long page_stride, row_stride;
  int row, row_end;
  template <int f>
  __device__ __forceinline__ void run() {
    constexpr int kOff = S::off(f);
    const u32 dst = S::odd(f) ? dst1 : dst0;
    const int j = row + f * S::kRowsPerIter;
    const bool valid = j < row_end;
    const elem_t* src = base;
    if (valid) {
      const int page = p.page_mul ? static_cast<int>(__umulhi(static_cast<unsigned>(j), p.page_mul) >> p.page_shift) : j;
      src += __ldg(table + page) * page_stride + (j - page * p.page_size) * row_stride;
    }
    if (S::all_copy(f) || S::thread_tail(threadIdx.x)) cp_async_16_at<kOff>(dst, src, valid);
  }
};
// ... with panels: a row is looked up in its first panel pass and kept for the others. (A struct
// of its own: the row's members in CopyPagedRows changed the code of one-panel builds.)
template <int kRows, int kDim>
struct CopyPagedPanels {
  using S = CopyPasses<kRows, kDim>;
  u32 dst0, dst1;
  const elem_t* base;
  const AttnParams& p;
  const int* table;
  long long page_stride, row_stride;
  int row, row_end;
  const elem_t* src;  // the row pass's row (base past row_end)
  bool valid;         // ... is a key
  template <int f>
  __device__ __forceinline__ void run() {
    constexpr int it = S::row_pass(f), pi = S::panel_pass(f);
    constexpr int kOff = S::off(f);
    const u32 dst = S::odd(f) ? dst1 : dst0;
    if constexpr (pi == 0) {
      const int j = row + it * S::kRowsPerIter;
      valid = j < row_end;
      src = base;
      if (valid) {
        const int page = p.page_mul ? static_cast<int>(__umulhi(static_cast<unsigned>(j), p.page_mul) >> p.page_shift) : j;
        src += __ldg(table + page) * page_stride + (j - page * p.page_size) * row_stride;
      }
    }
    if (S::all_copy(f) || S::thread_tail(threadIdx.x)) cp_async_16_at<kOff>(dst, src + pi * S::kPanelElems, valid);
  }
};

// load_tile over a paged sequence: rows [row0, row0 + kRows) of the keys whose pages `table`
// lists (the sequence's row of the block table), each looked up in it; rows at or past row_end
// zero-filled (a cache holds anything past a sequence's keys).
template <int kRows, int kDim = T::kHeadDim>
__device__ __forceinline__ void load_tile_paged(u32 tile, const elem_t* head_base, const AttnParams& p,
                                                const int* table, long long page_stride, long long row_stride,
                                                int row0, int row_end) {
  using S = CopyPasses<kRows, kDim>;
  // One panel a pass: written out, so that it compiles as before panels (through a call it did not).
  const int r = S::kPanelsPerIter == 1 ? threadIdx.x / S::kChunks : S::thread_row(threadIdx.x);
  const int chunk = S::kPanelsPerIter == 1 ? threadIdx.x % S::kChunks : S::thread_chunk(threadIdx.x);
  const u32 dst0 = tile + swizzled<kDim>(r, chunk) * 2;
  const u32 dst1 = S::kRowsPerIter % 8 == 0 ? dst0 : tile + swizzled<kDim>(r + S::kRowsPerIter, chunk) * 2;
  if constexpr (S::kPanelIters == 1) {
    CopyPagedRows<kRows, kDim> copy{dst0,       dst1,     head_base + chunk * 8, p, table, page_stride,
                                    row_stride, row0 + r, row_end};
    unroll<0, S::kPasses>(copy);
  } else {
    CopyPagedPanels<kRows, kDim> copy{dst0,       dst1,     head_base + chunk * 8, p,       table, page_stride,
                                      row_stride, row0 + r, row_end,               nullptr, false};
    unroll<0, S::kPasses>(copy);
  }
}

// Pass f of load_tile_packed: packed row r = row + it * kRowsPerIter is query row r / group of the
// group's query head r % group, looked up in the row's first panel pass and kept for the others;
// zero-filled at or past row_end (the sequence's packed rows).
template <int kRows, int kDim>
struct CopyPackedRows {
  using S = CopyPasses<kRows, kDim>;
  u32 dst0, dst1;
  const elem_t* base;  // the group's first query head, row 0, this thread's chunk
  long long row_stride, head_stride;
  int row, row_end, group;
  const elem_t* src;  // the row pass's row (base past row_end)
  bool valid;         // ... is one of the sequence's
  template <int f>
  __device__ __forceinline__ void run() {
    constexpr int it = S::row_pass(f), pi = S::panel_pass(f);
    constexpr int kOff = S::off(f);
    const u32 dst = S::odd(f) ? dst1 : dst0;
    if constexpr (pi == 0) {
      const int r = row + it * S::kRowsPerIter;
      valid = r < row_end;
      src = base;
      if (valid) {
        const int q_row = r / group;
        src += q_row * row_stride + (r - q_row * group) * head_stride;
      }
    }
    if (S::all_copy(f) || S::thread_tail(threadIdx.x)) cp_async_16_at<kOff>(dst, src + pi * S::kPanelElems, valid);
  }
};

// load_tile of GQA-packed rows (kPackGqa): packed rows [row0, row0 + kRows) of a query group whose
// first head's row 0 is `group_base`, each at its query row and head; rows at or past row_end
// zero-filled (they are not stored). Per row a division by the group size, once a CTA.
template <int kRows, int kDim = T::kHeadDim>
__device__ __forceinline__ void load_tile_packed(u32 tile, const elem_t* group_base, long long row_stride,
                                                 long long head_stride, int group, int row0, int row_end) {
  using S = CopyPasses<kRows, kDim>;
  const int r = S::thread_row(threadIdx.x);
  const int chunk = S::thread_chunk(threadIdx.x);
  const u32 dst0 = tile + swizzled<kDim>(r, chunk) * 2;
  const u32 dst1 = S::kRowsPerIter % 8 == 0 ? dst0 : tile + swizzled<kDim>(r + S::kRowsPerIter, chunk) * 2;
  CopyPackedRows<kRows, kDim> copy{dst0,    dst1,  group_base + chunk * 8, row_stride, head_stride, row0 + r,
                                   row_end, group, nullptr,                false};
  unroll<0, S::kPasses>(copy);
}

// Per-warp state and the four steps of one sub-tile of kSubN keys: scores, mask, softmax, P.V.
// Thread (lane) holds rows (m, h) = warp_row0 + m*16 + g + 8h of the block, g = lane/4, h in {0,1}.
//
// ldmatrix addresses (tiles.h, frag_offset and frag_xor): a 16-row x 16-dim fragment at tile row
// R (a multiple of 16) and head-dim step s starts, for this lane, at R * kRowBytes + (s /
// kSpanSteps) * kSpanBytes + (off ^ (s % kSpanSteps) * 32): the swizzle XORs only the chunk bits
// within a span (kSwizzleChunks chunks, kSpanSteps = kSwizzleChunks / 2 steps of 16 dims) with a
// function of row % 8 = lane % 8, and the chunk is 2 * s + half, so within a span step s is step
// 0's offset XOR (s % kSpanSteps) * 32. Tiles and rows start at multiples of kSpanBytes, so the XOR
// applies to the full address; everything else is an immediate. Per lane and tile that is one
// live register and one LOP3 per step 1..3 of a 128-byte span (d % 64 == 0), step 1 of a 64-byte
// span, none with 32-byte spans. Q and V fragments share a lane layout (rows lane % 16, chunk
// half lane / 16); K has its own (rows lane % 8 + 8 * (lane / 16), chunk half lane / 8 % 2).
// V's tiles (kHeadDimV: a value head dim other than Q's and K's) have their own row bytes and
// span: kDim picks them (the default is Q's and K's).
constexpr int kRowBytes = T::kHeadDim * 2;
constexpr int kRowBytesV = T::kHeadDimV * 2;
static_assert(kRowBytes % (T::kSwizzleChunks * 16) == 0, "tile rows must be whole swizzle spans");
template <int kRow, int kStep, int kDim = T::kHeadDim>
constexpr int kFragImm = mma_tiles::frag_offset(kDim, kRow, kStep);
template <int kStep, int kDim = T::kHeadDim>
__device__ __forceinline__ u32 span_addr(u32 addr0) {
  constexpr int x = mma_tiles::frag_xor(kDim, kStep);
  return x == 0 ? addr0 : addr0 ^ x;
}

struct WarpState {
  float acc_o[T::kMTiles][T::kDTiles][4];   // (M_TILE, D_TILE, frag) output accumulator
  float row_max[T::kMTiles][2];             // reference max of raw scores (stale when lazy)
  float row_sum[T::kMTiles][2];             // this thread's part of sum exp2(scaled s - max)
  u32 q_frag[T::kQInRegs ? T::kMTiles : 1][T::kQInRegs ? T::kDSteps : 1][4];  // (M_TILE, D_STEP, frag)
  u32 q_addr;  // smem byte address of this lane's step-0 row in this warp's Q rows
  u32 k_off;   // byte offset of this lane's step-0 row in a K tile
  u32 v_off;   // byte offset of this lane's step-0 row in a V tile
};

__device__ __forceinline__ void init_frag_addrs(WarpState& st, u32 sq, int warp_row0, int lane) {
  st.v_off = swizzled<T::kHeadDimV>(lane & 15, lane >> 4) * 2;
  st.k_off = swizzled((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1) * 2;
  // Q's lane layout is V's: one offset where their dims agree.
  const u32 q_off = T::kHeadDimV == T::kHeadDim ? st.v_off : swizzled(lane & 15, lane >> 4) * 2;
  st.q_addr = sq + warp_row0 * kRowBytes + q_off;
}

// A fragments of Q for head-dim step kDs, row tile kM (16x16 each, via ldmatrix.x4).
template <int kM, int kDs>
__device__ __forceinline__ void load_q_frag(const WarpState& st, u32 (&a)[4]) {
  ldmatrix_x4_at<kFragImm<kM * 16, kDs>>(span_addr<kDs>(st.q_addr), a[0], a[1], a[2], a[3]);
}
// ... of every row tile: a[m] for m in [kM, kMTiles).
template <int kDs, int kM = 0>
__device__ __forceinline__ void load_q_frags(const WarpState& st, u32 (&a)[T::kMTiles][4]) {
  if constexpr (kM < T::kMTiles) {
    load_q_frag<kM, kDs>(st, a[kM]);
    load_q_frags<kDs, kM + 1>(st, a);
  }
}
// q_in_regs: all of this warp's Q fragments, once.
struct LoadQRegs {
  WarpState& st;
  template <int ds>
  __device__ __forceinline__ void run() {
    u32 a[T::kMTiles][4];
    load_q_frags<ds>(st, a);
#pragma unroll
    for (int m = 0; m < T::kMTiles; ++m)
#pragma unroll
      for (int e = 0; e < 4; ++e) st.q_frag[m][ds][e] = a[m][e];
  }
};

// S = Q.K^T for the kSubN keys of the K tile at byte address k_tile.  acc_s: (M_TILE, N_TILE, frag)
// B fragments stream through a ring of kFragPrefetch + 1 slots, loaded kFragPrefetch MMA steps
// ahead of use; step f covers head-dim step f / kKeyPairs and key-tile pair f % kKeyPairs.
struct ScoreSteps {
  static constexpr int kKeyPairs = T::kSubTiles / 2;
  static constexpr int kSteps = T::kDSteps * kKeyPairs;
  static constexpr int kRing = T::kFragPrefetch + 1;
  static constexpr int kPrologue = T::kFragPrefetch < kSteps ? T::kFragPrefetch : kSteps;
  float (&acc_s)[T::kMTiles][T::kSubTiles][4];
  const WarpState& st;
  u32 k_addr;                                      // this lane's step-0 row in the K tile
  u32 kb[kRing][4];                                // (RING, frag) of K
  u32 qa[T::kQInRegs ? 1 : 2][T::kMTiles][4];      // (D_STEP % 2, M_TILE, frag) of Q from smem

  template <int f>
  __device__ __forceinline__ void load() {
    constexpr int ds = f / kKeyPairs, np = f % kKeyPairs;
    if constexpr (!T::kQInRegs && np == 0) load_q_frags<ds>(st, qa[ds & 1]);
    // Matrices (keys +0/+8) x (dims +0/+8): B operands of key tiles 2np and 2np+1.
    u32(&b)[4] = kb[f % kRing];
    ldmatrix_x4_at<kFragImm<np * 16, ds>>(span_addr<ds>(k_addr), b[0], b[1], b[2], b[3]);
  }
  struct Prologue {
    ScoreSteps& s;
    template <int f>
    __device__ __forceinline__ void run() { s.template load<f>(); }
  };
  template <int f>
  __device__ __forceinline__ void run() {
    constexpr int ds = f / kKeyPairs, np = f % kKeyPairs;
    if constexpr (f + T::kFragPrefetch < kSteps) load<f + T::kFragPrefetch>();
    const u32(&b)[4] = kb[f % kRing];
#pragma unroll
    for (int m = 0; m < T::kMTiles; ++m) {
      if constexpr (T::kQInRegs) {
        mma_16816<T::kBf16>(acc_s[m][2 * np], st.q_frag[m][ds], b[0], b[1]);
        mma_16816<T::kBf16>(acc_s[m][2 * np + 1], st.q_frag[m][ds], b[2], b[3]);
      } else {
        mma_16816<T::kBf16>(acc_s[m][2 * np], qa[ds & 1][m], b[0], b[1]);
        mma_16816<T::kBf16>(acc_s[m][2 * np + 1], qa[ds & 1][m], b[2], b[3]);
      }
    }
  }
};

__device__ __forceinline__ void compute_scores(float (&acc_s)[T::kMTiles][T::kSubTiles][4], const WarpState& st,
                                               u32 k_tile) {
#pragma unroll
  for (int m = 0; m < T::kMTiles; ++m)
#pragma unroll
    for (int n = 0; n < T::kSubTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[m][n][e] = 0.f;
  ScoreSteps steps{acc_s, st, k_tile + st.k_off};
  ScoreSteps::Prologue prologue{steps};
  unroll<0, ScoreSteps::kPrologue>(prologue);
  unroll<0, ScoreSteps::kSteps>(steps);
}

// Window builds: every key outside a row's window gets -inf. Key col is visible from row when
// lo <= col - row <= hi and col < seqlen_k (tiles.h, visible_offsets): col - row is this thread's
// first element's plus an immediate, so the mask needs no bound per row (variants.cuh's per-row
// key_begin and key_end, the same semantics, spilled 16 bytes at sm_89 d=128 128x32 with every
// variant, where this form fits in 255 registers).
__device__ __forceinline__ void mask_window(float (&acc_s)[T::kMTiles][T::kSubTiles][4], int row0, int n0,
                                            int seqlen_k, int diag, int lane, const VariantParams& v) {
  const int g = lane >> 2, tig = lane & 3;
  const mma_tiles::Offsets o = mma_tiles::visible_offsets<T::kCausal>(diag, v.window_left, v.window_right);
  const int offset0 = n0 + tig * 2 - row0 - g;  // col - row of element (m, n, e) = (0, 0, 0)
  const int cols = seqlen_k - n0 - tig * 2;     // its col's distance to seqlen_k
#pragma unroll
  for (int m = 0; m < T::kMTiles; ++m)
#pragma unroll
    for (int n = 0; n < T::kSubTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = n * 8 + (e & 1);                       // from n0 + tig * 2
        const int offset = offset0 + col - m * 16 - ((e >> 1) << 3);  // col - row
        if (offset < o.lo || offset > o.hi || col >= cols) acc_s[m][n][e] = neg_inf();
      }
}

// Keys at or past seqlen_k, and (causal) right of the diagonal, get -inf (window builds: outside
// each row's window, mask_window). row0: first block row of this warp in the sequence; n0: first
// key of the sub-tile.
__device__ __forceinline__ void mask_scores(float (&acc_s)[T::kMTiles][T::kSubTiles][4], int row0, int n0,
                                            int seqlen_k, int diag, int lane, const VariantParams& v) {
  if constexpr (T::kWindow) {
    mask_window(acc_s, row0, n0, seqlen_k, diag, lane, v);
    return;
  }
  const int g = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int m = 0; m < T::kMTiles; ++m)
#pragma unroll
    for (int n = 0; n < T::kSubTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = row0 + m * 16 + g + ((e >> 1) << 3);
        const int col = n0 + n * 8 + tig * 2 + (e & 1);
        const int limit = T::kCausal ? min(seqlen_k, row + diag + 1) : seqlen_k;
        if (col >= limit) acc_s[m][n][e] = neg_inf();
      }
}

// GQA-packed builds (kPackGqa): the rows of a tile are not consecutive queries (packed row r is
// query r / group), so each of this thread's rows gets its query position, one division a row and
// masked tile, and every key outside the row's visible range gets -inf: keys at or past seqlen_k,
// (causal) right of its diagonal, (window builds) outside its window. row0: this warp's first
// packed row in the sequence.
__device__ __forceinline__ void mask_packed(float (&acc_s)[T::kMTiles][T::kSubTiles][4], int row0, int group,
                                            int n0, int seqlen_k, int diag, int lane, const VariantParams& v) {
  const int g = lane >> 2, tig = lane & 3;
  const mma_tiles::Offsets o = mma_tiles::visible_offsets<T::kCausal>(
      diag, T::kWindow ? v.window_left : -1, T::kWindow ? v.window_right : -1);
#pragma unroll
  for (int m = 0; m < T::kMTiles; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int q_row = (row0 + m * 16 + g + 8 * h) / group;
#pragma unroll
      for (int n = 0; n < T::kSubTiles; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = n0 + n * 8 + tig * 2 + e;
          const int offset = col - q_row;
          if (col >= seqlen_k || offset < o.lo || offset > o.hi) acc_s[m][n][2 * h + e] = neg_inf();
        }
    }
}

// Soft-cap builds: each raw score s becomes tanh(x), x = s * softcap_scale (the cap c itself is in
// exp2_scale), before masking, which sets -inf after the cap. Two forms (traits.cuh picks one,
// kSoftcapNewton), both exact to ~3e-7 absolute (c * 3e-7 in the capped score):
//  - MUFU: tanh(x) = 1 - 2 / (2^(2x log2 e) + 1), one ex2 and one rcp.approx. No sign to keep:
//    the exp2 overflowing to inf gives 1, underflowing to 0 gives -1, so each score's chain holds
//    one value (variants.cuh's tanh_accurate keeps x for copysign: at sm_80 d=64 128x64 with Q in
//    registers that spilled 88 bytes where this form fits in 251 registers).
//  - Newton: tanh(|x|) = (1 - t) / (1 + t), t = 2^(-2|x| log2 e) in (0, 1], the reciprocal of 1 + t
//    in [1, 2] by three Newton steps from the linear minimax seed 24/17 - 8/17 y (relative error
//    <= 1/17, squared by each step), the sign put back: one MUFU op instead of two, ~6 more
//    instructions a score.
__device__ __forceinline__ float tanh_newton(float x2) {  // x2 = 2 x log2(e)
  const float t = ex2(-fabsf(x2));
  const float y = 1.f + t;
  float r = fmaf(y, -0.47058823529411764f, 1.4117647058823530f);
#pragma unroll
  for (int i = 0; i < 3; ++i) r = fmaf(r, fmaf(-y, r, 1.f), r);
  return copysignf(fmaf(2.f, r, -1.f), x2);  // (1 - t) / (1 + t) = 2 / (1 + t) - 1
}
__device__ __forceinline__ float tanh_mufu(float x2) {  // x2 = 2 x log2(e)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(ex2(x2) + 1.f));
  return fmaf(-2.f, r, 1.f);
}
// Two multiplies a score (by softcap_scale, then 2 log2(e)), not one by their product: the product
// would hold a register through the loop, and configs at their register cap (sm_80 d=64 128x64, 8
// warps, 2 CTAs an SM: 128) spilled 8 bytes for it.
__device__ __forceinline__ void softcap_scores(float (&acc_s)[T::kMTiles][T::kSubTiles][4], const VariantParams& v) {
#pragma unroll
  for (int m = 0; m < T::kMTiles; ++m)
#pragma unroll
    for (int n = 0; n < T::kSubTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x2 = acc_s[m][n][e] * v.softcap_scale * 2.8853900817779268f;  // 2 x log2(e)
        acc_s[m][n][e] = T::kSoftcapNewton ? tanh_newton(x2) : tanh_mufu(x2);
      }
}

// The scale of exp2: the softmax scale times log2(e), or, in soft-cap builds, whose scores are
// tanh(s * softcap_scale) (softcap_scores), the cap times log2(e).
__device__ __forceinline__ float exp2_scale(const AttnParams& p) {
  return T::kSoftcap ? p.variant.softcap * 1.4426950408889634f : p.scale_log2;
}

// Online softmax step: folds the sub-tile's scores into the running max and sum, rescales O, and
// returns P packed to 16 bits (the accumulator fragments of key tiles 2ns, 2ns+1 are exactly the
// A operand of k16 step ns), so the fp32 scores die before P.V.
__device__ __forceinline__ void softmax_step(WarpState& st, const float (&acc_s)[T::kMTiles][T::kSubTiles][4],
                                             u32 (&p_frag)[T::kMTiles][T::kSubSteps][4], float scale_log2) {
  float tile_max[T::kMTiles][2];
  bool grow = false;
#pragma unroll
  for (int m = 0; m < T::kMTiles; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = st.row_max[m][h];
#pragma unroll
      for (int n = 0; n < T::kSubTiles; ++n) mx = fmaxf(mx, fmaxf(acc_s[m][n][2 * h], acc_s[m][n][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      tile_max[m][h] = mx;
      // Lazy: keep the stale max while no row's max grew by more than 2^kLazyLog2 in exp2 units;
      // P then stays <= 2^kLazyLog2 and the result is exact (numerator and denominator share it).
      grow |= T::kLazyRescale ? (mx - st.row_max[m][h]) * scale_log2 > T::kLazyLog2 : true;
    }
  if (!T::kLazyRescale || __any_sync(0xffffffffu, grow)) {
#pragma unroll
    for (int m = 0; m < T::kMTiles; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float mx = tile_max[m][h];
        // A row that has seen no key keeps max -inf; exp2(-inf - 0) gives alpha 0, not NaN.
        const float alpha = ex2(st.row_max[m][h] * scale_log2 - (mx == neg_inf() ? 0.f : mx * scale_log2));
        st.row_max[m][h] = mx;
        st.row_sum[m][h] *= alpha;
#pragma unroll
        for (int d = 0; d < T::kDTiles; ++d) {
          st.acc_o[m][d][2 * h] *= alpha;
          st.acc_o[m][d][2 * h + 1] *= alpha;
        }
      }
  }
#pragma unroll
  for (int m = 0; m < T::kMTiles; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float max_scaled = st.row_max[m][h] == neg_inf() ? 0.f : st.row_max[m][h] * scale_log2;
      float sum;  // starts at the first pair: 0.f + x is not folded (it turns -0 into +0)
#pragma unroll
      for (int n = 0; n < T::kSubTiles; ++n) {
        const float p0 = ex2(fmaf(acc_s[m][n][2 * h], scale_log2, -max_scaled));
        const float p1 = ex2(fmaf(acc_s[m][n][2 * h + 1], scale_log2, -max_scaled));
        p_frag[m][n >> 1][(n & 1) * 2 + h] = pack2<T::kBf16>(p0, p1);
        sum = n == 0 ? p0 + p1 : sum + (p0 + p1);
      }
      st.row_sum[m][h] += sum;
    }
}

// O += P.V for the kSubN keys of the V tile at byte address v_tile; V's B operands come from a
// transposing ldmatrix through a ring like compute_scores'. Step f: key step f / kDimPairs, dim
// pair f % kDimPairs.
struct PvSteps {
  static constexpr int kDimPairs = T::kDTiles / 2;
  static constexpr int kSteps = T::kSubSteps * kDimPairs;
  static constexpr int kRing = T::kFragPrefetch + 1;
  static constexpr int kPrologue = T::kFragPrefetch < kSteps ? T::kFragPrefetch : kSteps;
  WarpState& st;
  const u32 (&p_frag)[T::kMTiles][T::kSubSteps][4];
  u32 v_addr;        // this lane's step-0 row in the V tile
  u32 vb[kRing][4];  // (RING, frag) of V

  template <int f>
  __device__ __forceinline__ void load() {
    constexpr int ns = f / kDimPairs, dp = f % kDimPairs;
    // Matrices (keys +0/+8) x (dims +0/+8), transposed: B operands of dim tiles 2dp, 2dp+1.
    u32(&b)[4] = vb[f % kRing];
    ldmatrix_x4_trans_at<kFragImm<ns * 16, dp, T::kHeadDimV>>(span_addr<dp, T::kHeadDimV>(v_addr), b[0], b[1], b[2],
                                                             b[3]);
  }
  struct Prologue {
    PvSteps& s;
    template <int f>
    __device__ __forceinline__ void run() { s.template load<f>(); }
  };
  template <int f>
  __device__ __forceinline__ void run() {
    constexpr int ns = f / kDimPairs, dp = f % kDimPairs;
    if constexpr (f + T::kFragPrefetch < kSteps) load<f + T::kFragPrefetch>();
    const u32(&b)[4] = vb[f % kRing];
#pragma unroll
    for (int m = 0; m < T::kMTiles; ++m) {
      mma_16816<T::kBf16>(st.acc_o[m][2 * dp], p_frag[m][ns], b[0], b[1]);
      mma_16816<T::kBf16>(st.acc_o[m][2 * dp + 1], p_frag[m][ns], b[2], b[3]);
    }
  }
};

__device__ __forceinline__ void accumulate_pv(WarpState& st, const u32 (&p_frag)[T::kMTiles][T::kSubSteps][4],
                                              u32 v_tile) {
  PvSteps steps{st, p_frag, v_tile + st.v_off};
  PvSteps::Prologue prologue{steps};
  unroll<0, PvSteps::kPrologue>(prologue);
  unroll<0, PvSteps::kSteps>(steps);
}

extern "C" __global__ void __launch_bounds__(T::kThreads, T::kMinBlocks)
flash_fwd_mma(const AttnParams p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // Byte addresses in shared memory.
  const u32 sq = smem_addr(smem_raw);                 // (kBlockM, kHeadDim)
  const u32 sk = sq + T::kQElems * 2;                 // (kStages, kBlockN, kHeadDim)
  const u32 sv = sk + T::kStages * T::kKElems * 2;    // (kStages, kBlockN, kHeadDimV)

  // GQA packing (kPackGqa): grid y is the KV head, and the CTA's rows are packed rows of its
  // `group` query heads (packed row r: query row r / group of head `head` + r % group), seqlen_q *
  // group of them a sequence; else grid y is the query head, group 1.
  const int group = T::kPackGqa ? p.q_per_kv : 1;
  const int head = T::kPackGqa ? static_cast<int>(blockIdx.y) * group : static_cast<int>(blockIdx.y);
  const int batch = blockIdx.z;
  const int kv_head = T::kPackGqa ? static_cast<int>(blockIdx.y) : head / p.q_per_kv;
  // The sequence this block's rows belong to: batch entry `batch`, or (varlen) the packed
  // sequence `batch`, rows [cu_seqlens[batch], cu_seqlens[batch + 1]) of q/o and k/v.
  const elem_t* q;
  const elem_t* k;
  const elem_t* v;
  elem_t* o;
  float* lse;
  int seqlen_q, seqlen_k, m_block;
  long long lse_head_stride;  // packed builds: from one query head's LSE row to the next
  // The sequence's bounds, its query blocks and which of them this CTA computes: tiles.h, the
  // launch plan's view too.
  if constexpr (T::kVarlen) {
    const mma_tiles::PackedSequence seq = mma_tiles::packed_sequence(p.cu_seqlens_q, p.cu_seqlens_k, batch);
    const int q0 = seq.q0, k0 = seq.k0;
    seqlen_q = seq.len_q;
    seqlen_k = seq.len_k;
    // The grid covers the longest sequence; this one may end before this block.
    const int m_blocks = mma_tiles::query_blocks(seqlen_q * group, T::kBlockM);
    if (static_cast<int>(blockIdx.x) >= m_blocks) return;
    m_block = mma_tiles::query_block<T::kCausal>(int(blockIdx.x), m_blocks);
    q = static_cast<const elem_t*>(p.q) + q0 * p.q_stride[2] + head * p.q_stride[1];
    k = static_cast<const elem_t*>(p.k) + k0 * p.k_stride[2] + kv_head * p.k_stride[1];
    v = static_cast<const elem_t*>(p.v) + k0 * p.v_stride[2] + kv_head * p.v_stride[1];
    o = static_cast<elem_t*>(p.o) + q0 * p.o_stride[2] + head * p.o_stride[1];
    // LSE [heads_q, total_q].
    lse_head_stride = T::kPackGqa ? p.cu_seqlens_q[p.batch] : 0;
    lse = p.lse ? p.lse + static_cast<long long>(head) * p.cu_seqlens_q[p.batch] + q0 : nullptr;
  } else {
    seqlen_q = p.seqlen_q;
    seqlen_k = p.seqlen_k;
    // Kvcache: the sequence's keys (cache_seqlens); with a page table k and v are the head's row 0
    // of page 0, each row looked up (load_tile_paged).
    const bool paged = T::kKvcache && p.block_table;
    if (T::kKvcache && p.cache_seqlens) seqlen_k = mma_tiles::cache_keys(p.seqlen_k, p.cache_seqlens[batch]);
    m_block = mma_tiles::query_block<T::kCausal>(int(blockIdx.x), int(gridDim.x));
    q = static_cast<const elem_t*>(p.q) + batch * p.q_stride[0] + head * p.q_stride[1];
    k = static_cast<const elem_t*>(p.k) + (paged ? 0 : batch * p.k_stride[0]) + kv_head * p.k_stride[1];
    v = static_cast<const elem_t*>(p.v) + (paged ? 0 : batch * p.v_stride[0]) + kv_head * p.v_stride[1];
    o = static_cast<elem_t*>(p.o) + batch * p.o_stride[0] + head * p.o_stride[1];
    lse_head_stride = p.seqlen_q;
    lse = p.lse ? p.lse + (static_cast<long long>(batch) * p.heads_q + head) * p.seqlen_q : nullptr;
  }
  const int m0 = m_block * T::kBlockM;
  // The block's rows in the sequence (packed builds: packed rows, seqlen_q * group of them), and
  // the query rows its rows and this warp's hold: [q_lo, q_hi) (packed: rows r..r_end hold queries
  // r / group..(r_end - 1) / group).
  const int rows_end = T::kPackGqa ? seqlen_q * group : seqlen_q;
  const int q_lo = T::kPackGqa ? m0 / group : m0;
  const int q_hi = T::kPackGqa ? (m0 + T::kBlockM - 1) / group + 1 : m0 + T::kBlockM;
  // Bottom-right causal alignment: query i sees keys j <= i + diag, diag = seqlen_k - seqlen_q.
  const int diag = seqlen_k - seqlen_q;
  // A window's sides (-1: unbounded), read by window builds only.
  const int window_left = T::kWindow ? p.variant.window_left : -1;
  const int window_right = T::kWindow ? p.variant.window_right : -1;
  // The K/V tiles holding the keys this block's rows see (tiles.h): n_blocks tiles from key
  // first_key on; a window's block skips every tile outside it.
  const mma_tiles::KeyRange keys =
      mma_tiles::block_keys<T::kCausal, T::kWindow>(q_lo, q_hi, seqlen_k, diag, window_left, window_right);
  const int n_blocks = mma_tiles::tile_count(keys, T::kBlockN);
  // From here on keys count from first_key: the K/V loop, the loads, the masks and the unmasked
  // ranges see the keys [first_key, seqlen_k) as keys [0, len_k) whose diagonal is diag_k, and the
  // contiguous K/V pointers start at first_key, so a window's loop runs as a plain build's from
  // tile 0 (no key offset to keep in a register through it: that register made d=256 configs at
  // 255 registers spill). No row of the block sees a key before first_key, so bounds clamped at 0
  // change nothing.
  // Paged loads look pages up by the absolute key: first_key + j * kBlockN.
  const int first_key = T::kWindow ? mma_tiles::first_tile(keys, T::kBlockN) * T::kBlockN : 0;
  const int len_k = seqlen_k - first_key;
  const int diag_k = diag - first_key;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, tig = lane & 3;
  const int warp_row0 = warp * T::kWarpRows;
  const int warp_q_lo = T::kPackGqa ? (m0 + warp_row0) / group : m0 + warp_row0;
  const int warp_q_hi = T::kPackGqa ? (m0 + warp_row0 + T::kWarpRows - 1) / group + 1 : m0 + warp_row0 + T::kWarpRows;
  // Window builds: the keys every row of this warp sees; a tile inside them is not masked.
  const mma_tiles::KeyRange unmasked = mma_tiles::unmasked_keys<T::kCausal, T::kWindow>(
      warp_q_lo, warp_q_hi, len_k, diag_k, window_left, window_right);

  WarpState st;
  init_frag_addrs(st, sq, warp_row0, lane);
#pragma unroll
  for (int m = 0; m < T::kMTiles; ++m) {
#pragma unroll
    for (int d = 0; d < T::kDTiles; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e) st.acc_o[m][d][e] = 0.f;
    st.row_max[m][0] = st.row_max[m][1] = neg_inf();
    st.row_sum[m][0] = st.row_sum[m][1] = 0.f;
  }

  const int* table = T::kKvcache && p.block_table ? p.block_table + static_cast<long long>(batch) * p.max_blocks_per_seq
                                                   : nullptr;
  if constexpr (T::kWindow) {
    if (!table) {  // contiguous K/V from first_key on
      k += first_key * p.k_stride[2];
      v += first_key * p.v_stride[2];
    }
  }
  auto load_k = [&](int j) {
    const u32 dst = sk + (j % T::kStages) * T::kKElems * 2;
    if constexpr (T::kKvcache) {
      if (table) {
        load_tile_paged<T::kBlockN>(dst, k, p, table, p.k_stride[0], p.k_stride[2], first_key + j * T::kBlockN,
                                    seqlen_k);
        return;
      }
    }
    load_tile<T::kBlockN>(dst, k, p.k_stride[2], j * T::kBlockN, len_k);
  };
  auto load_v = [&](int j) {
    const u32 dst = sv + (j % T::kStages) * T::kVElems * 2;
    if constexpr (T::kKvcache) {
      if (table) {
        load_tile_paged<T::kBlockN, T::kHeadDimV>(dst, v, p, table, p.v_stride[0], p.v_stride[2],
                                                  first_key + j * T::kBlockN, seqlen_k);
        return;
      }
    }
    load_tile<T::kBlockN, T::kHeadDimV>(dst, v, p.v_stride[2], j * T::kBlockN, len_k);
  };
  // Interleaved schedule: the stream is K_0, V_0, K_1, ... one cp.async group per tile, committed
  // even past the end (empty) so wait_group counts stay uniform. Blockwise: K_j and V_j form one
  // group. Either way the group of the first tile also carries Q.
  auto issue = [&](int t) {
    if constexpr (T::kBlockwise) {
      if (t < n_blocks) { load_k(t); load_v(t); }
    } else {
      if ((t >> 1) < n_blocks) { if ((t & 1) == 0) load_k(t >> 1); else load_v(t >> 1); }
    }
    cp_async_commit();
  };
  auto load_q_regs = [&]() {
    if constexpr (T::kQInRegs) {
      LoadQRegs load{st};
      unroll<0, T::kDSteps>(load);
    }
  };
  // Does key range [n0, n0 + n) need masking for any row of this warp?
  auto needs_mask = [&](int n0, int n) {
    if constexpr (T::kWindow) return n0 < unmasked.begin || n0 + n > unmasked.end;
    return n0 + n > len_k || (T::kCausal && n0 + n - 1 > warp_q_lo + diag_k);
  };
  auto mask = [&](float (&acc_s)[T::kMTiles][T::kSubTiles][4], int n0) {
    if constexpr (T::kPackGqa) mask_packed(acc_s, m0 + warp_row0, group, n0, len_k, diag_k, lane, p.variant);
    else mask_scores(acc_s, m0 + warp_row0, n0, len_k, diag_k, lane, p.variant);
  };

  if (n_blocks > 0) {
    // Q joins the first group.
    if constexpr (T::kPackGqa) load_tile_packed<T::kBlockM>(sq, q, p.q_stride[2], p.q_stride[1], group, m0, rows_end);
    else load_tile<T::kBlockM>(sq, q, p.q_stride[2], m0, seqlen_q);
#pragma unroll
    for (int t = 0; t < T::kLookahead; ++t) issue(t);
  }

  for (int j = 0; j < n_blocks; ++j) {
    const u32 k_base = sk + (j % T::kStages) * T::kKElems * 2;
    const u32 v_base = sv + (j % T::kStages) * T::kVElems * 2;
    const int n0 = j * T::kBlockN;
    if constexpr (T::kBlockwise) {
      // One group per block: block j (and Q) landed; after the barrier every warp is done with
      // block j-1, whose slot the issue below refills with block j + kLookahead.
      cp_async_wait<T::kLookahead - 1>();
      __syncthreads();
      issue(j + T::kLookahead);
      if (j == 0) load_q_regs();
      // Rolled on purpose: unrolled, ptxas hoists the next step's loads and spills (seen at
      // 128x64, 4 warps, sub_n 32: 56 bytes).
#pragma unroll 1
      for (int sub = 0; sub < T::kBlockN / T::kSubN; ++sub) {
        const int key0 = sub * T::kSubN;
        float acc_s[T::kMTiles][T::kSubTiles][4];
        compute_scores(acc_s, st, k_base + key0 * kRowBytes);
        if constexpr (T::kSoftcap) softcap_scores(acc_s, p.variant);  // before masking
        if (needs_mask(n0 + key0, T::kSubN)) mask(acc_s, n0 + key0);
        u32 p_frag[T::kMTiles][T::kSubSteps][4];
        softmax_step(st, acc_s, p_frag, exp2_scale(p));
        accumulate_pv(st, p_frag, v_base + key0 * kRowBytesV);
      }
    } else {
      // FlashAttention-2's order: V_j lands during Q.K_j^T, K_{j+kStages} during P.V_j.
      cp_async_wait<T::kLookahead - 1>();  // K_j (and Q) landed for this thread's copies
      __syncthreads();                     // ... and everyone's; V_{j-1}'s slot is free
      issue(2 * j + T::kLookahead);
      if (j == 0) load_q_regs();
      float acc_s[T::kMTiles][T::kSubTiles][4];
      compute_scores(acc_s, st, k_base);
      if constexpr (T::kSoftcap) softcap_scores(acc_s, p.variant);  // before masking
      if (needs_mask(n0, T::kBlockN)) mask(acc_s, n0);
      u32 p_frag[T::kMTiles][T::kSubSteps][4];
      softmax_step(st, acc_s, p_frag, exp2_scale(p));
      cp_async_wait<T::kLookahead - 1>();  // V_j landed
      __syncthreads();                     // ... for everyone; K_j's slot is free
      issue(2 * j + 1 + T::kLookahead);
      accumulate_pv(st, p_frag, v_base);
    }
  }
  cp_async_wait<0>();

  // Sinks: the head's logit joins each row's denominator (sink_finish).
  const float sink = T::kSinks && !T::kPackGqa ? p.variant.sinks[head] : 0.f;

  // Epilogue: finish the row sums across the 4 threads of a row, normalise, store.
#pragma unroll
  for (int m = 0; m < T::kMTiles; ++m) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = st.row_sum[m][h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      float inv;  // a row that saw no key outputs zeros
      float row_lse;
      if constexpr (T::kSinks) {
        // Packed builds: the sink of the row's head.
        const float row_sink = T::kPackGqa ? p.variant.sinks[head + (m0 + warp_row0 + m * 16 + g + 8 * h) % group] : sink;
        const SinkFinish f = sink_finish(st.row_max[m][h] * exp2_scale(p), sum, row_sink);
        inv = f.o_scale;
        row_lse = f.lse;
      } else {
        inv = sum > 0.f ? 1.f / sum : 0.f;
      }
      // The row (packed builds: its query row and head in the group).
      const int row = m0 + warp_row0 + m * 16 + g + 8 * h;
      const int q_row = T::kPackGqa ? row / group : row;
      const int in_group = T::kPackGqa ? row - q_row * group : 0;
      if (row < rows_end) {
        elem_t* orow = T::kPackGqa ? o + q_row * p.o_stride[2] + in_group * p.o_stride[1] : o + row * p.o_stride[2];
#pragma unroll
        for (int d = 0; d < T::kDTiles; ++d) {
          *reinterpret_cast<u32*>(orow + d * 8 + tig * 2) =
              pack2<T::kBf16>(st.acc_o[m][d][2 * h] * inv, st.acc_o[m][d][2 * h + 1] * inv);
        }
        if (lse && tig == 0) {
          // log(sum exp(scale*s)) = (scale_log2 * max + log2(sum)) * ln(2)
          if constexpr (!T::kSinks)
            row_lse = sum > 0.f ? (st.row_max[m][h] * exp2_scale(p) + lg2(sum)) * 0.6931471805599453f : neg_inf();
          if constexpr (T::kPackGqa) lse[q_row + in_group * lse_head_stride] = row_lse;
          else lse[row] = row_lse;
        }
      }
    }
  }
}

}  // namespace att
