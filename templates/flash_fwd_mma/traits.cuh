// Every tunable of flash_fwd_mma and everything derived from it. The renderer defines the macros
// (one spelling per tunable: block_n in YAML is BLOCK_N here and kBlockN below); the kernel reads
// only Traits::k*.
#ifndef ATTNTUNE_FLASH_FWD_MMA_TRAITS_CUH
#define ATTNTUNE_FLASH_FWD_MMA_TRAITS_CUH

#include "../common/variants.cuh"  // ATT_WINDOW, ATT_SOFTCAP, ATT_SINKS (0 when the renderer left them out)
#include "tiles.h"                  // the smem tiles' swizzle and copy passes

namespace att {

struct Traits {
  // Problem fields baked into the kernel.
  static constexpr int kHeadDim = ATT_HEAD_DIM;  // Q's and K's
  // V's and O's: ATT_HEAD_DIM_V where the problem names another (`dv=N`: DeepSeek's MLA prefill is
  // 192 / 128); the renderer defines it for such problems only.
#ifdef ATT_HEAD_DIM_V
  static constexpr int kHeadDimV = ATT_HEAD_DIM_V;
#else
  static constexpr int kHeadDimV = kHeadDim;
#endif
  static constexpr bool kBf16 = ATT_DTYPE_BF16 != 0;
  static constexpr bool kCausal = ATT_CAUSAL != 0;
  // A packed batch of sequences of different lengths (attntune_attention_forward_varlen); the
  // renderer defines ATT_VARLEN for varlen problems only.
#ifdef ATT_VARLEN
  static constexpr bool kVarlen = ATT_VARLEN != 0;
#else
  static constexpr bool kVarlen = false;
#endif
  // A KV cache (attntune_attention_forward_kvcache): each sequence's keys from cache_seqlens, K and
  // V rows through the page table or contiguous; the renderer defines ATT_KVCACHE for paged
  // problems only.
#ifdef ATT_KVCACHE
  static constexpr bool kKvcache = ATT_KVCACHE != 0;
#else
  static constexpr bool kKvcache = false;
#endif
  // Attention variants (templates/common/variants.cuh), rendered for problems with them only, so
  // that a plain build compiles to the code it always did: a sliding window (its sides are run-time
  // arguments), a logit soft-cap (its cap too), attention sinks (a logit per query head).
  static constexpr bool kWindow = ATT_WINDOW != 0;
  static constexpr bool kSoftcap = ATT_SOFTCAP != 0;
  static constexpr bool kSinks = ATT_SINKS != 0;

  // Tunables (search_spaces/flash_fwd_mma.yaml).
  static constexpr int kBlockM = BLOCK_M;      // query rows per thread block
  static constexpr int kBlockN = BLOCK_N;      // keys per K/V tile
  static constexpr int kWarps = WARPS;         // warps per block; each owns kBlockM/kWarps rows
  static constexpr int kStages = KV_STAGES;    // K and V tiles each in a ring of kStages buffers
  static constexpr bool kQInRegs = Q_IN_REGS;  // Q fragments loaded once vs. re-read per tile
  static constexpr int kMinBlocks = MIN_BLOCKS;  // __launch_bounds__ min blocks per SM
  static constexpr int kFragPrefetch = FRAG_PREFETCH;  // MMA steps an ldmatrix runs ahead of use
  static constexpr bool kLazyRescale = LAZY_RESCALE;   // rescale O only when a row max grows a lot
  static constexpr float kLazyLog2 = 8.f;               // ... by more than 2^8: P <= 256 fits fp16/bf16
  // interleaved: K and V tiles are separate cp.async groups, FlashAttention-2's order.
  // blockwise: K_j and V_j are one group, one barrier per block, and the block is processed in
  // softmax steps of kSubN keys (fewer barriers per key without more score registers).
  static constexpr bool kBlockwise = KV_SCHEDULE == KV_SCHEDULE_BLOCKWISE;
  static constexpr int kSubN = SUB_N;
  // GQA packing: a CTA's rows are the packed rows of one KV head's query heads (packed row r is
  // query row r / G of the group's query head r % G, G = q_per_kv), so a short query sequence
  // fills a tile with the group's heads instead of leaving it part empty, and K/V are read once
  // for them (FlashAttention-3's and -4's pack_gqa). A tunable with a default: a config recorded
  // before it existed (no PACK_GQA) is a build without it.
#if defined(PACK_GQA)
  static constexpr bool kPackGqa = PACK_GQA != 0;
#else
  static constexpr bool kPackGqa = false;
#endif
  // The soft-cap's tanh (kernel.cu, softcap_scores): by MUFU (an ex2 and an rcp a score: with the
  // softmax's ex2, three MUFU ops where a plain build has one) or, with ATT_SOFTCAP_NEWTON=1, its
  // reciprocal by Newton steps on the FMA pipe (two MUFU ops, ~6 more instructions and a live sign
  // a score). Predicted from the pipes' rates per SM sub-partition (an m16n8k16 every 8 cycles, a
  // warp's MUFU op every 8, a warp's instruction issued every cycle, an FP32 op every cycle on
  // sm_86+ and every 2 on sm_80): at d=64 on sm_90 the MUFU form is MUFU-bound (~1.5x the plain
  // loop) and Newton issue-bound (~1.35x); on sm_80 Newton is FP32-bound and slower; from d=128
  // on the MMAs hide either. But Newton's live sign costs registers (sm_90 d=64 128x64 with Q in
  // registers: 28 bytes spilled where the MUFU form spills none), so the MUFU form is the default
  // until the harness measures Newton where it is predicted to win (README).
#if defined(ATT_SOFTCAP_NEWTON)
  static constexpr bool kSoftcapNewton = ATT_SOFTCAP_NEWTON != 0;
#else
  static constexpr bool kSoftcapNewton = false;
#endif

  // Derived.
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpRows = kBlockM / kWarps;
  static constexpr int kMTiles = kWarpRows / 16;   // 16-row MMA tiles per warp
  static constexpr int kNTiles = kBlockN / 8;      // 8-key MMA tiles per K/V tile
  static constexpr int kSubTiles = kSubN / 8;      // 8-key MMA tiles per softmax step
  static constexpr int kSubSteps = kSubN / 16;     // k16 steps of P.V per softmax step
  static constexpr int kDTiles = kHeadDimV / 8;    // 8-wide output tiles (O's and V's dims)
  static constexpr int kDSteps = kHeadDim / 16;    // k16 steps of Q.K^T
  static constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks per smem row of Q and K
  // The XOR swizzle's span in 16-byte chunks (tiles.h): the largest of 8, 4, 2 that divides a
  // row (d = 64, 128, 192, 256: 8, as ever; 32, 96, 160, 224: 4; 48, 80, 112, ...: 2).
  static constexpr int kSwizzleChunks = mma_tiles::swizzle_chunks(kHeadDim);
  // Tiles in flight ahead of the one being consumed, counting K and V tiles alike. With one
  // stage this is FlashAttention-2's schedule: V_j loads during Q.K_j^T, K_{j+1} during P.V_j.
  // Blockwise: blocks in flight ahead of the one consumed.
  static constexpr int kLookahead = kBlockwise ? kStages - 1 : 2 * kStages - 1;
  static constexpr int kQElems = kBlockM * kHeadDim;
  static constexpr int kKElems = kBlockN * kHeadDim;   // one K stage
  static constexpr int kVElems = kBlockN * kHeadDimV;  // one V stage
  static constexpr int kSmemBytes = (kQElems + kStages * (kKElems + kVElems)) * 2;

  static_assert(kWarpRows * kWarps == kBlockM && kWarpRows % 16 == 0,
                "each warp must own a whole number of 16-row MMA tiles");
  static_assert(kMTiles >= 1 && kMTiles <= 4, "1 to 4 MMA row tiles per warp");
  static_assert(kBlockN % 16 == 0, "block_n must be a multiple of 16 (the P.V k-step)");
  static_assert(kSubN % 16 == 0 && kBlockN % kSubN == 0, "sub_n must divide block_n in k16 steps");
  static_assert(kBlockwise || kSubN == kBlockN,
                "interleaved refills K_j's slot right after Q.K_j^T: it needs sub_n == block_n");
  static_assert(!kBlockwise || kStages >= 2, "blockwise needs 2+ stages to overlap loads with compute");
  static_assert(kHeadDim % 16 == 0 && kHeadDim >= 32 && kHeadDim <= 256,
                "head_dim must be a multiple of 16 (the MMA k-step and two-chunk swizzle spans) from 32 to 256");
  static_assert(kHeadDimV % 16 == 0 && kHeadDimV >= 32 && kHeadDimV <= 256,
                "head_dim_v must be a multiple of 16 (dim pairs of P.V's output tiles, two-chunk spans) from 32 to 256");
  static_assert(kStages >= 1 && kStages <= 4, "1 to 4 K/V stages");
  static_assert(kFragPrefetch >= 0 && kFragPrefetch <= 2, "fragment prefetch distance 0 to 2");
  static_assert(kSmemBytes == SMEM_BYTES,
                "search space's smem_bytes formula disagrees with the kernel's layout");
  static_assert(kThreads == THREADS, "search space's threads disagrees with warps * 32");
};

// Shared-memory tiles are row-major (rows, kDim) of 16-bit values in 16-byte chunks, each chunk's
// index XORed within a span of swizzle_chunks(kDim) chunks by a pattern of period 8 rows
// (tiles.h): the 8 rows an ldmatrix phase reads, and the 8 chunks a quarter-warp's cp.async
// copies write, land in 8 different bank groups. The element offset of chunk `chunk` of `row`.
// kDim: Q's and K's head dim, or V's (kHeadDimV) for V tiles.
template <int kDim = Traits::kHeadDim>
__device__ __forceinline__ int swizzled(int row, int chunk) { return mma_tiles::swizzled<kDim>(row, chunk); }

}  // namespace att

#endif
