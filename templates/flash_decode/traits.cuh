// ---- templates/flash_decode/traits.cuh: every tunable of flash_decode and everything derived from
// it. The renderer defines the macros (block_n in YAML is BLOCK_N here and kBlockN below); the
// kernels read only Traits::k*. search_spaces/flash_decode.yaml's derived formulas must agree
// (the static_asserts at the end check threads and smem_bytes).
#ifndef ATTNTUNE_FLASH_DECODE_TRAITS_CUH
#define ATTNTUNE_FLASH_DECODE_TRAITS_CUH

namespace att {

struct Traits {
  // Problem fields baked into the kernel.
  static constexpr int kHeadDim = ATT_HEAD_DIM;
  static constexpr bool kBf16 = ATT_DTYPE_BF16 != 0;
  static constexpr bool kCausal = ATT_CAUSAL != 0;
  // Variants (common/variants.cuh; the renderer defines ATT_WINDOW, ATT_SOFTCAP, ATT_SINKS only for
  // problems with them, so a plain build compiles none of their code). Their sizes and values are
  // run-time arguments (DecodeParams::variant).
  static constexpr bool kWindow = ATT_WINDOW != 0;
  static constexpr bool kSoftcap = ATT_SOFTCAP != 0;
  static constexpr bool kSinks = ATT_SINKS != 0;

  // Tunables (search_spaces/flash_decode.yaml).
  static constexpr int kBlockM = BLOCK_M;        // packed rows (query heads x queries) per CTA (derived)
  static constexpr int kBlockN = BLOCK_N;        // keys per K/V tile (one ring stage)
  static constexpr int kWarps = WARPS;           // warps per CTA
  static constexpr int kWarpsM = WARPS_M;        // warps splitting the rows; WARPS / WARPS_M split the keys
  static constexpr bool kWarpTiles = TILE_SHARE == TILE_SHARE_WARP;  // each key group loads its own slice
  static constexpr int kStages = STAGES;         // ring depth (tiles in flight: kStages - 1)
  static constexpr int kCtasPerSm = CTAS_PER_SM; // __launch_bounds__ minimum, and the plan's slots per SM
  static constexpr bool kQInRegs = Q_IN_REGS != 0;
  static constexpr bool kLastCta = COMBINE == COMBINE_LAST_CTA;  // split merge: last CTA, else a 2nd kernel
  // combine: clusterN (sm_90): a unit's splits are the kCluster CTAs of one cluster, merged through
  // distributed shared memory (no workspace, no second kernel, no counter); else 1.
  static constexpr int kCluster = CLUSTER;
  static constexpr bool kClusterMerge = kCluster > 1;
  // K/V loads: cp.async by every thread (sm_80+), or TMA boxes issued by one extra producer warp into
  // an mbarrier ring (sm_90; the space offers it there only).
  static constexpr bool kKvTma = KV_LOAD == KV_LOAD_TMA;

  // Derived.
  static constexpr int kConsumerThreads = kWarps * 32;  // the warps that score tiles
  static constexpr int kThreads = kConsumerThreads + (kKvTma ? 32 : 0);  // + the TMA producer warp
  static constexpr int kWarpsN = kWarps / kWarpsM;     // key groups
  static constexpr int kWarpKeys = kBlockN / kWarpsN;  // keys of a tile one warp scores
  static constexpr int kMw = kBlockM / 16 / kWarpsM;   // 16-row MMA tiles per warp
  static constexpr int kKeyTiles = kWarpKeys / 8;      // n8 score tiles per warp and tile
  static constexpr int kKeySteps = kWarpKeys / 16;     // k16 steps of P.V
  static constexpr int kDTiles = kHeadDim / 8;
  static constexpr int kDSteps = kHeadDim / 16;
  static constexpr int kChunks = kHeadDim / 8;         // 16-byte chunks per row
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr int kQBytes = kBlockM * kRowBytes;
  static constexpr int kTileBytes = kBlockN * kRowBytes;  // one K or V tile
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kRingBytes = kStages * kStageBytes;
  // Epilogue (reuses Q and the ring): the key groups' merge buffer (kernel.cu, MergeBuf). Its
  // one-slot form needs kMergeBytes (O summed in fp32, every group's row maxima, the row sums, two
  // spare rows); the slot form, one O per key group, is used where Q and the ring hold it. Rows
  // of kOStride floats: 4 floats of padding spread a quad's 8 rows over the banks.
  static constexpr int kOStride = kHeadDim + 4;
  static constexpr int kMergeBytes = kBlockM * kOStride * 4 + (kWarpsN + 3) * kBlockM * 4;
  static constexpr int kMaxSplits = kDecodeMaxSplits;  // the plan never splits more (split.h)
  static constexpr int kSmemBytes = kQBytes + kRingBytes > kMergeBytes ? kQBytes + kRingBytes : kMergeBytes;

  // Loads: the threads of a load group copy kLoadRows rows of each tile, chunk t % kChunks of rows
  // t / kChunks + pass * kRowsPerPass. cta: the whole CTA loads whole tiles; warp: each key group
  // (kWarpsM warps) loads its own kWarpKeys rows and waits on its own barrier.
  static constexpr int kLoadThreads = kWarpTiles ? 32 * kWarpsM : kConsumerThreads;
  static constexpr int kLoadRows = kWarpTiles ? kWarpKeys : kBlockN;
  static constexpr int kRowsPerPass = kLoadThreads / kChunks;
  static constexpr int kPasses = kLoadRows / kRowsPerPass;

  // The separate combine kernel: one (row, 4 columns) item a thread (split.h).
  static constexpr int kCombineThreads = kDecodeCombineThreads;
  static constexpr int kCombineRows = decode_combine_rows(kHeadDim);

  // Named barriers (bar.sync ids; 0 is __syncthreads): tile_share warp, key group wn waits on
  // kBarKeyGroup + wn with its kWarpsM warps; kv_load tma, the consumer warps on kBarConsumers
  // (never both: TMA loads whole tiles).
  static constexpr int kBarKeyGroup = 1;
  static constexpr int kBarConsumers = 1;

  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head_dim 64, 128 or 256");
  static_assert(kBlockM % 16 == 0 && kBlockM >= 16 && kBlockM <= 64, "block_m: 16, 32, 48 or 64 rows");
  static_assert(kWarps % kWarpsM == 0 && (kBlockM / 16) % kWarpsM == 0 && kMw >= 1 && kMw <= 2,
                "each warp owns 1 or 2 whole 16-row tiles");
  static_assert(kBlockN % kWarpsN == 0 && kWarpKeys % 16 == 0, "each warp scores whole 16-key steps");
  static_assert(kLoadThreads % kChunks == 0 && kRowsPerPass >= 1 && kLoadRows % kRowsPerPass == 0,
                "a load pass covers whole rows, and the passes the tile");
  static_assert(kStages >= 2 && kStages <= 8, "2 to 8 stages");
  static_assert(kBarKeyGroup + kWarpsN - 1 <= 15, "named barriers 1..15");
  static_assert(kSmemBytes == SMEM_BYTES, "search space's smem_bytes disagrees with the kernel's layout");
  static_assert(kThreads == THREADS, "search space's threads disagrees with warps * 32 (+ 32: TMA producer)");
  static_assert(!kKvTma || !kWarpTiles, "TMA loads whole tiles (tile_share: cta)");
  static_assert(kCluster == 1 || kCluster == 2 || kCluster == 4 || kCluster == 8 || kCluster == 16,
                "cluster: 1, 2, 4, 8 or 16 CTAs");
  static_assert(!kClusterMerge || !kLastCta, "one split merge: cluster or last CTA");
};

// Shared-memory tiles of `rows` rows are stored as kHeadDim / 64 column blocks of (rows, 64
// elements), each row 128 bytes, whose 16-byte chunk index is XORed with `xr` = row % 8 (TMA's
// 128-byte swizzle, the layout a box of (64, rows) lands in), so an ldmatrix phase's 8 rows and a
// cp.async phase's chunks hit 8 bank groups; xr = 0: unswizzled (TMA boxes of fewer than 8 rows).
// Linear in row: a slice of rows from row0 is the tile's address + row0 * 128.
__device__ __forceinline__ unsigned tile_bytes(int row, int chunk, int rows, int xr) {
  return static_cast<unsigned>((chunk >> 3) * rows * 128 + row * 128 + (((chunk & 7) ^ xr) << 4));
}

}  // namespace att

#endif  // ATTNTUNE_FLASH_DECODE_TRAITS_CUH
