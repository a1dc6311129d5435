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
  // dK's and dV's head dims in kDkvSplit parts, one a CTA: the CTAs of a key block's parts
  // (blockIdx.y % kDkvSplit) each recompute S^T and dP^T over every head dim and accumulate their
  // part of dK, dV and dQ (d=256: 128 fp32 values a thread, d=128's count, where all of them would
  // be 256; two of the five products twice, 7/5 of the FLOPs).
  static constexpr int kDkvSplit = DKV_SPLIT;

  // Derived.
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockN = kWarps * 16 * kKeyTiles;  // keys a CTA (its dK/dV rows)
  static constexpr int kQTiles = kBlockM / 8;    // 8-query MMA tiles of S^T and dP^T
  static constexpr int kQSteps = kBlockM / 16;   // k16 steps over the queries (dV, dK)
  static constexpr int kDSteps = kHeadDim / 16;  // k16 steps over the head dim (S^T, dP^T)
  static constexpr int kAccDim = kHeadDim / kDkvSplit;  // the head dims of dK, dV and dQ a CTA writes
  static constexpr int kDTiles = kAccDim / 8;    // 8-dim output tiles of dK and dV
  static constexpr int kKSteps = kBlockN / 16;   // k16 steps over the keys (dQ)
  // dQ = dS K: warp w computes query rows 16 * (w % kDqRowTiles) .. + 16 and kDqCols of the head
  // dims from (w / kDqRowTiles) * kDqCols, then adds them into the fp32 accumulator.
  static constexpr int kDqRowTiles = kBlockM / 16;
  static constexpr int kDqGroups = kWarps / kDqRowTiles;
  static constexpr int kDqCols = kAccDim / kDqGroups;
  static constexpr int kDqTiles = kDqCols / 8;

  // Shared memory: K and V of the CTA's keys, kStages Q and dO tiles, dS^T (keys x queries, 16-bit),
  // and kStages rows of LSE * log2(e) and D = rowsum(dO * O) (fp32).
  static constexpr int kKElems = kBlockN * kHeadDim;
  static constexpr int kQElems = kBlockM * kHeadDim;
  static constexpr int kDsElems = kBlockN * kBlockM;
  static constexpr int kSmemBytes = (2 * kKElems + 2 * kStages * kQElems + kDsElems) * 2 + 2 * kStages * kBlockM * 4;

  static_assert(kHeadDimReal % 16 == 0 && kHeadDimReal <= kHeadDim && kHeadDimReal > kHeadDim / 2 - (kHeadDim == 64 ? 32 : 0),
                "the head dim is a multiple of 16, padded to the next of 64, 128 and 256");
  static_assert(kHeadDim == 64 || kHeadDim == 128 || (kHeadDim == 256 && kDkvSplit == 2),
                "flash_bwd_mma serves head dims 64 and 128, and 256 with dkv_split 2 (a warp keeps dK and dV of "
                "its keys over its part of the head dims in registers: 128 fp32 values a thread at d=128)");
  static_assert(kDkvSplit == 1 || (kDkvSplit == 2 && kAccDim % 64 == 0),
                "dkv_split 2 splits at a multiple of 64 head dims (the swizzle's span: a part is a byte offset)");
  static_assert(kBlockM == 32 || kBlockM == 64 || kBlockM == 128, "block_m is 32, 64 or 128");
  static_assert(kDqRowTiles <= kWarps && kWarps % kDqRowTiles == 0 && kDqCols % 16 == 0,
                "dQ's 16-row tiles must divide among the warps, in column groups of whole 16-dim pairs");
  static_assert(kKeyTiles >= 1 && kKeyTiles <= 2, "1 or 2 key tiles a warp");
  static_assert(kStages >= 2 && kStages <= 3, "2 or 3 Q/dO stages");
  static_assert(kSmemBytes == SMEM_BYTES, "search space's smem_bytes formula disagrees with the kernel's layout");
  static_assert(kThreads == THREADS, "search space's threads disagrees with warps * 32");
  // Sinks need nothing here: P = exp(S - LSE) with the forward's LSE, which holds the sink (the sinks'
  // gradient is the ops' arithmetic: docs/design/backward.md "Sinks"). A soft-cap recomputes the
  // capped score and multiplies dS by its derivative (bwd_prepost.cuh, bwd_prob).
};

}  // namespace att

#endif  // ATTNTUNE_FLASH_BWD_MMA_TRAITS_CUH
