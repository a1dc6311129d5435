// Every tunable of flash_fwd_mma and everything derived from it. The renderer defines the macros
// (one spelling per tunable: block_n in YAML is BLOCK_N here and kBlockN below); the kernel reads
// only Traits::k*.
#ifndef ATTNTUNE_FLASH_FWD_MMA_TRAITS_CUH
#define ATTNTUNE_FLASH_FWD_MMA_TRAITS_CUH

namespace att {

struct Traits {
  // Problem fields baked into the kernel.
  static constexpr int kHeadDim = ATT_HEAD_DIM;
  static constexpr bool kBf16 = ATT_DTYPE_BF16 != 0;
  static constexpr bool kCausal = ATT_CAUSAL != 0;

  // Tunables (search_spaces/flash_fwd_mma.yaml).
  static constexpr int kBlockM = BLOCK_M;      // query rows per thread block
  static constexpr int kBlockN = BLOCK_N;      // keys per K/V tile
  static constexpr int kWarps = WARPS;         // warps per block; each owns kBlockM/kWarps rows
  static constexpr int kStages = KV_STAGES;    // K and V tiles each in a ring of kStages buffers
  static constexpr bool kQInRegs = Q_IN_REGS;  // Q fragments loaded once vs. re-read per tile
  static constexpr int kMinBlocks = MIN_BLOCKS;  // __launch_bounds__ min blocks per SM

  // Derived.
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpRows = kBlockM / kWarps;
  static constexpr int kMTiles = kWarpRows / 16;   // 16-row MMA tiles per warp
  static constexpr int kNTiles = kBlockN / 8;      // 8-key MMA tiles per K/V tile
  static constexpr int kDTiles = kHeadDim / 8;     // 8-wide output tiles
  static constexpr int kDSteps = kHeadDim / 16;    // k16 steps of Q.K^T
  static constexpr int kNSteps = kBlockN / 16;     // k16 steps of P.V
  static constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks per smem row
  // Tiles in flight ahead of the one being consumed, counting K and V tiles alike. With one
  // stage this is FlashAttention-2's schedule: V_j loads during Q.K_j^T, K_{j+1} during P.V_j.
  static constexpr int kLookahead = 2 * kStages - 1;
  static constexpr int kQElems = kBlockM * kHeadDim;
  static constexpr int kKVElems = kBlockN * kHeadDim;  // one K or V stage
  static constexpr int kSmemBytes = (kQElems + 2 * kStages * kKVElems) * 2;

  static_assert(kWarpRows * kWarps == kBlockM && kWarpRows % 16 == 0,
                "each warp must own a whole number of 16-row MMA tiles");
  static_assert(kMTiles >= 1 && kMTiles <= 4, "1 to 4 MMA row tiles per warp");
  static_assert(kBlockN % 16 == 0, "block_n must be a multiple of 16 (the P.V k-step)");
  static_assert(kHeadDim % 64 == 0 && kHeadDim <= 256,
                "the XOR swizzle spans 8 16-byte chunks: head_dim must be 64, 128, 192 or 256");
  static_assert(kStages >= 1 && kStages <= 4, "1 to 4 K/V stages");
  static_assert(kSmemBytes == SMEM_BYTES,
                "search space's smem_bytes formula disagrees with the kernel's layout");
  static_assert(kThreads == THREADS, "search space's threads disagrees with warps * 32");
};

// Shared-memory tiles are row-major (rows, kHeadDim) of 16-bit values, stored in 16-byte chunks
// whose index is XORed with (row % 8): the 8 rows an ldmatrix phase reads, and the 8 chunks a
// cp.async phase writes, land in 8 different bank groups.
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * Traits::kHeadDim + ((chunk ^ (row & 7)) << 3);
}

}  // namespace att

#endif
