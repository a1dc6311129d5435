// Every tunable of flash_bwd_mma and everything derived from it. The renderer defines the macros
// (one spelling per tunable: block_m in YAML is BLOCK_M here and kBlockM below); the kernels read
// only Traits::k*.
#ifndef ATTNTUNE_FLASH_BWD_MMA_TRAITS_CUH
#define ATTNTUNE_FLASH_BWD_MMA_TRAITS_CUH

#include "../common/variants.cuh"  // ATT_WINDOW, ATT_SOFTCAP, ATT_SINKS (0 when the renderer left them out)

// Builds rendered before dkv_split (and the nvcc harness's) have one part.
#ifndef DKV_SPLIT
#define DKV_SPLIT 1
#endif

namespace att {

struct Traits {
  // Problem fields baked into the kernels.
  // The head dim the kernels compute over: the problem's (kHeadDimReal) zero-padded to 64, 128 or
  // 256 (the space's d_pad): the padded columns of Q, K, V and dO load as zeros, so S^T, dP^T and
  // the gradients' real columns are the unpadded ones, and the padded columns are not stored.
  static constexpr int kHeadDimReal = ATT_HEAD_DIM;
#if defined(D_PAD)
  static constexpr int kHeadDim = D_PAD;
#else
  static constexpr int kHeadDim = ATT_HEAD_DIM;
#endif
  static constexpr bool kPadded = kHeadDimReal != kHeadDim;
  static constexpr bool kBf16 = ATT_DTYPE_BF16 != 0;
  static constexpr bool kCausal = ATT_CAUSAL != 0;
  static constexpr bool kWindow = ATT_WINDOW != 0;  // a sliding window: its sides are run-time values
  static constexpr bool kSoftcap = ATT_SOFTCAP != 0;  // a logit soft-cap: its value is a run-time value

  // Tunables (search_spaces/flash_bwd_mma.yaml).
  static constexpr int kBlockM = BLOCK_M;      // query rows a step of the main loop (one Q/dO tile)
  static constexpr int kWarps = WARPS;         // warps a CTA; each owns kKeyTiles * 16 keys
  static constexpr int kKeyTiles = KEY_TILES;  // 16-key MMA row tiles a warp (its dK/dV rows)
  static constexpr int kStages = Q_STAGES;     // Q/dO tiles in a ring: kStages - 1 steps' loads ahead
  static constexpr int kMinBlocks = MIN_BLOCKS;  // __launch_bounds__ min blocks per SM (caps registers)
  // How dQ's share of a step is added into its fp32 accumulator on sm_90: pairs of floats (one
  // REDG.F32x2 each) or, after two shuffles between lane pairs, quads (one REDG.F32x4 each). Before
  // sm_90 atomicAdds either way (the space offers quad on sm_90 only).
  static constexpr bool kDqQuad = DQ_REDUCE == DQ_REDUCE_QUAD;
  // vec4: the accumulator keeps each 16-column group of a row in the order of the MMA's two 8-column
  // tiles' fragments (lane t's columns 2t, 2t + 1 of the first and of the second side by side), so
  // that a lane's four columns of a row are 16 consecutive bytes: one REDG.F32x4 a row and tile pair,
  // half pair's instructions, without quad's shuffles (sm_90; flash_bwd_convert reads it back
  // through dq_offset).
  static constexpr bool kDqVec4 = DQ_REDUCE == DQ_REDUCE_VEC4;
  // frag (every arch) and frag4 (sm_90): the accumulator keeps each 16-row, 8-column MMA tile of dQ
  // (128 floats) in the fragments' own order, so that what a warp adds at once is contiguous. frag:
  // element e of every lane's fragment is one run of 32 floats in lane order, so each of a tile's four
  // scalar atomicAdds a warp issues covers one 128-byte line (FlashAttention-2's dQaccum order; pair's
  // scalar adds touch 8 rows' 32 bytes each). frag4: a lane's four elements side by side, so the tile
  // is one REDG.F32x4 a lane over 512 contiguous bytes (vec4's covers 8 rows' 64 bytes).
#if defined(DQ_REDUCE_FRAG)  // values a space rendered before them did not define
  static constexpr bool kDqFrag = DQ_REDUCE == DQ_REDUCE_FRAG;
  static constexpr bool kDqFrag4 = DQ_REDUCE == DQ_REDUCE_FRAG4;
#else
  static constexpr bool kDqFrag = false;
  static constexpr bool kDqFrag4 = false;
#endif
  static constexpr bool kDqTileOrder = kDqFrag || kDqFrag4;
  static constexpr bool kDqFragmentOrder = kDqVec4 || kDqTileOrder;
  // Floats between columns col and col + 1 (even col) of a row in the accumulator (flash_bwd_convert
  // reads a pair at once where they are adjacent).
  static constexpr int kDqPairStride = kDqFrag ? 32 : 1;
  // dK's and dV's head dims in kDkvSplit parts, one a CTA: the CTAs of a key block's parts
  // (blockIdx.y % kDkvSplit) each recompute S^T and dP^T over every head dim and accumulate their
  // part of dK, dV and dQ (d=256: 128 fp32 values a thread, d=128's count, where all of them would
  // be 256; two of the five products twice, 7/5 of the FLOPs).
  static constexpr int kDkvSplit = DKV_SPLIT;
  // Warps in pairs (FlashAttention-2's split of dK and dV over keys and head dims): a pair owns
  // 2 * kKeyTiles 16-key tiles; each of its warps scores the pair's keys against half of a step's
  // queries (S^T and dP^T), writes P^T and dS^T to shared memory, and accumulates dK and dV of the
  // pair's keys over half of the head dims, reading P^T and dS^T of every query back from there.
  // Each warp then reads Q and dO fragments of half the queries (S^T, dP^T) and of half the head
  // dims (dV, dK) rather than all of them: a step's shared-memory reads fall by a fifth at d=128
  // (ncu, run 181: the unpaired layout is latency-bound on them), for one more 16-bit tile of
  // shared memory (P^T beside dS^T) and its stores.
#if defined(KV_PAIRS)  // a tunable with a default: a config recorded before it existed is a build without it
  static constexpr bool kPairs = KV_PAIRS != 0;
#else
  static constexpr bool kPairs = false;
#endif

  // The query rows of a warp's share of dQ = dS K (16 or 32: one or two m16 tiles), the rest of the
  // step's rows going to other warps and the head dims shared out among the warps of the same rows.
  // 32 rows read each K fragment for two tiles and half as many head dims of K a warp
  // (FlashAttention-2's dQ split at d=128: 32 x 32 a warp).
#if defined(DQ_ROWS)  // a tunable with a default: a config recorded before it existed is a build without it
  static constexpr int kDqRows = DQ_ROWS;
#else
  static constexpr int kDqRows = 16;
#endif

  // The order the CTAs take their key blocks in: 0, the grid's (key blocks fastest); g > 0, (batch,
  // KV head) rows in groups of g, each group's key blocks from the first (causal: the longest walk)
  // to the last, so that the last wave is short walks (bwd_blocks.h, cta_block).
#if defined(LONGEST_FIRST)  // a tunable with a default: a config recorded before it existed is a build without it
  static constexpr int kLongestFirst = LONGEST_FIRST;
#else
  static constexpr int kLongestFirst = 0;
#endif
  // A packed batch (varlen builds): g > 0, the CTAs in the order the preprocessing kernel sorts the
  // batch's (sequence, key block) pairs into, groups of g sequences in turn, each longest walk first
  // (bwd_prepost.cuh, build_cta_order; a call in the deterministic mode keeps the grid's order); 0,
  // the grid's order.
#if defined(VARLEN_LPT)  // a tunable with a default: a config recorded before it existed is a build without it
  static constexpr int kVarlenLpt = VARLEN_LPT;
#else
  static constexpr int kVarlenLpt = 0;
#endif

  // Derived.
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockN = kWarps * 16 * kKeyTiles;  // keys a CTA (its dK/dV rows)
  static constexpr int kPairWays = kPairs ? 2 : 1;  // warps that share a set of keys
  static constexpr int kRowTiles = kKeyTiles * kPairWays;  // 16-key tiles of a warp's S^T and dK/dV rows
  static constexpr int kSQueries = kBlockM / kPairWays;    // the step's queries a warp scores
  static constexpr int kQTiles = kSQueries / 8;  // 8-query MMA tiles of a warp's S^T and dP^T
  static constexpr int kQSteps = kBlockM / 16;   // k16 steps over the queries (dV, dK)
  static constexpr int kDSteps = kHeadDim / 16;  // k16 steps over the head dim (S^T, dP^T)
  static constexpr int kAccDim = kHeadDim / kDkvSplit;  // the head dims of dK, dV and dQ a CTA writes
  static constexpr int kDkvDim = kAccDim / kPairWays;   // the head dims of dK and dV a warp accumulates
  static constexpr int kDTiles = kDkvDim / 8;    // 8-dim output tiles of a warp's dK and dV
  static constexpr int kKSteps = kBlockN / 16;   // k16 steps over the keys (dQ)
  // dQ = dS K: warp w computes query rows kDqRows * (w % kDqRowTiles) .. + kDqRows (kDqMTiles m16
  // tiles) and kDqCols of the head dims from (w / kDqRowTiles) * kDqCols, then adds them into the
  // fp32 accumulator.
  static constexpr int kDqMTiles = kDqRows / 16;
  static constexpr int kDqRowTiles = kBlockM / kDqRows;
  static constexpr int kDqGroups = kWarps / kDqRowTiles;
  static constexpr int kDqCols = kAccDim / kDqGroups;
  static constexpr int kDqTiles = kDqCols / 8;

  // Where the accumulator keeps (row, col) of a (batch, head)'s rows from row_base (the conversion
  // kernel's reads, bwd_prepost.cuh). vec4: column 16 j + 8 h + 2 t + e of a row at 16 j + 4 t + 2 h + e.
  // frag, frag4: the 16-row block's 8-column tile (col / 8) at 128 (col / 8) floats, in it the MMA
  // fragment's lane g * 4 + t (row g or g + 8, columns 2t, 2t + 1) and element e (row half * 2 +
  // column parity): e * 32 + lane (frag) or lane * 4 + e (frag4). (row_base + row) / 16 blocks are
  // whole: a run of the workspaces starts at a multiple of block_m.
  static __device__ __forceinline__ long long dq_offset(long long row_base, int row, int col) {
    if constexpr (kDqTileOrder) {
      const long long r = row_base + row;
      const int lane = static_cast<int>(r & 7) * 4 + ((col & 7) >> 1), e = static_cast<int>((r >> 3) & 1) * 2 + (col & 1);
      return (r & ~15LL) * kHeadDim + (col & ~7) * 16 + (kDqFrag ? e * 32 + lane : lane * 4 + e);
    } else {
      return (row_base + row) * kHeadDim + (col & ~15) + 4 * ((col & 7) >> 1) + 2 * ((col >> 3) & 1) + (col & 1);
    }
  }

  // Shared memory: K and V of the CTA's keys, kStages Q and dO tiles, dS^T (keys x queries, 16-bit),
  // with kPairs P^T beside it, and kStages rows of LSE * log2(e) and D = rowsum(dO * O) (fp32).
  static constexpr int kKElems = kBlockN * kHeadDim;
  static constexpr int kQElems = kBlockM * kHeadDim;
  static constexpr int kDsElems = kBlockN * kBlockM;
  static constexpr int kSmemBytes =
      (2 * kKElems + 2 * kStages * kQElems + kPairWays * kDsElems) * 2 + 2 * kStages * kBlockM * 4;

  static_assert(kHeadDimReal % 16 == 0 && kHeadDimReal <= kHeadDim && kHeadDimReal > kHeadDim / 2 - (kHeadDim == 64 ? 32 : 0),
                "the head dim is a multiple of 16, padded to the next of 64, 128 and 256");
  static_assert(kHeadDim == 64 || kHeadDim == 128 || (kHeadDim == 256 && kDkvSplit == 2),
                "flash_bwd_mma serves head dims 64 and 128, and 256 with dkv_split 2 (a warp keeps dK and dV of "
                "its keys over its part of the head dims in registers: 128 fp32 values a thread at d=128)");
  static_assert(kDkvSplit == 1 || (kDkvSplit == 2 && kAccDim % 64 == 0),
                "dkv_split 2 splits at a multiple of 64 head dims (the swizzle's span: a part is a byte offset)");
  static_assert(kBlockM == 32 || kBlockM == 64 || kBlockM == 128, "block_m is 32, 64 or 128");
  static_assert((kDqRows == 16 || kDqRows == 32) && kBlockM % kDqRows == 0, "dq_rows is 16 or 32, at most block_m");
  static_assert(kDqRowTiles <= kWarps && kWarps % kDqRowTiles == 0 && kDqCols % 16 == 0,
                "dQ's 16-row tiles must divide among the warps, in column groups of whole 16-dim pairs");
  static_assert(kKeyTiles >= 1 && kKeyTiles <= 2, "1 or 2 key tiles a warp");
  static_assert(!kPairs || (kWarps % 2 == 0 && kSQueries % 16 == 0 && kDkvDim % 16 == 0),
                "kv_pairs: warps in pairs, each scoring whole 16-query pairs of tiles and accumulating whole 16-dim "
                "pairs of dK and dV");
  static_assert(kStages >= 2 && kStages <= 3, "2 or 3 Q/dO stages");
  static_assert(kVarlenLpt >= 0, "varlen_lpt is a group of sequences, or 0");
  static_assert(kLongestFirst >= 0, "longest_first is a group of (batch, KV head) rows, or 0");
  static_assert(kSmemBytes == SMEM_BYTES, "search space's smem_bytes formula disagrees with the kernel's layout");
  static_assert(kThreads == THREADS, "search space's threads disagrees with warps * 32");
  // Sinks need nothing here: P = exp(S - LSE) with the forward's LSE, which holds the sink (the sinks'
  // gradient is the ops' arithmetic: docs/design/backward.md "Sinks"). A soft-cap recomputes the
  // capped score and multiplies dS by its derivative (bwd_prepost.cuh, bwd_prob).
};

}  // namespace att

#endif  // ATTNTUNE_FLASH_BWD_MMA_TRAITS_CUH
