// ---- templates/flash_decode/traits.cuh: every tunable of flash_decode and everything derived from
// it. The renderer defines the macros (block_n in YAML is BLOCK_N here and kBlockN below); the
// kernels read only Traits::k*. search_spaces/flash_decode.yaml's derived formulas must agree
// (the static_asserts at the end check threads and smem_bytes).
#ifndef ATTNTUNE_FLASH_DECODE_TRAITS_CUH
#define ATTNTUNE_FLASH_DECODE_TRAITS_CUH

namespace att {

struct Traits {
  // Problem fields baked into the kernel.
  static constexpr int kHeadDim = ATT_HEAD_DIM;  // Q's and K's
  // V's and O's: ATT_HEAD_DIM_V where the problem names another (`dv=N`: DeepSeek's MLA is 192 /
  // 128); the renderer defines it for such problems only, so every other build is as before.
#ifdef ATT_HEAD_DIM_V
  static constexpr int kHeadDimV = ATT_HEAD_DIM_V;
#else
  static constexpr int kHeadDimV = kHeadDim;
#endif
  static constexpr bool kSplitDims = kHeadDimV != kHeadDim;
  static constexpr bool kBf16 = ATT_DTYPE_BF16 != 0;
  static constexpr bool kCausal = ATT_CAUSAL != 0;
  // Variants (common/variants.cuh; the renderer defines ATT_WINDOW, ATT_SOFTCAP, ATT_SINKS only for
  // problems with them, so a plain build compiles none of their code). Their sizes and values are
  // run-time arguments (DecodeParams::variant).
  static constexpr bool kWindow = ATT_WINDOW != 0;
  static constexpr bool kSoftcap = ATT_SOFTCAP != 0;
  static constexpr bool kSinks = ATT_SINKS != 0;
  // An FP8 e4m3 KV cache (`kv_dtype=fp8`; the renderer defines ATT_KV_FP8 for such problems only).
  // Its rows of d (dv) bytes are loaded, stored and swizzled as rows of d / 2 (dv / 2) 16-bit
  // elements (kKDim, kVDim: every K/V tile, load and TMA box below counts those), the launch plan
  // handing the kernel the cache as such (strides halved); the scores' and P V's MMAs read the
  // bytes in their own order (kernel.cu, "FP8 caches") and convert them exactly to 16 bits.
#ifdef ATT_KV_FP8
  static constexpr bool kKvFp8 = ATT_KV_FP8 != 0;
#else
  static constexpr bool kKvFp8 = false;
#endif
  // FP8 caches: who converts the bytes (tunable fp8_convert; kernel.cu, "FP8 caches"). warp (the
  // default, the builds from before it): each warp converts what its MMAs read, in the MMAs' own
  // byte order (kFp8Direct). group: a key group's kWarpsM row warps convert its slice of each tile
  // once, in natural order, into a 16-bit stage (two tiles of d and dv elements a row, in
  // tile_bytes' layout, always swizzled), one barrier a tile, and score it as a 16-bit cache's
  // (fp16 MMAs).
#if defined(FP8_CONVERT) && defined(FP8_CONVERT_WARP) && defined(FP8_CONVERT_GROUP2)
  static constexpr bool kFp8Group = kKvFp8 && FP8_CONVERT != FP8_CONVERT_WARP;
  static constexpr int kStage16Bufs = FP8_CONVERT == FP8_CONVERT_GROUP2 ? 2 : 1;  // group2: two buffers
#else
  static constexpr bool kFp8Group = false;
  static constexpr int kStage16Bufs = 1;
#endif
  static constexpr bool kFp8Direct = kKvFp8 && !kFp8Group;
  // The MMAs' 16-bit type: bf16 for a bf16 problem's 16-bit cache; fp16 over an FP8 cache (its
  // values are exact in fp16, and a bf16 Q is made fp16 exactly: kernel.cu).
  static constexpr bool kMmaBf16 = kBf16 && !kKvFp8;

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
  static constexpr int kDTiles = kHeadDimV / 8;       // n8 tiles of O (V's dims)
  static constexpr int kDSteps = kHeadDim / 16;       // k16 steps of Q K^T
  // K's and V's rows in the tiles' 16-bit elements: the head dims, halved for an FP8 cache.
  static constexpr int kKDim = kKvFp8 ? kHeadDim / 2 : kHeadDim;
  static constexpr int kVDim = kKvFp8 ? kHeadDimV / 2 : kHeadDimV;
  static constexpr int kQChunks = kHeadDim / 8;       // 16-byte chunks per row of Q
  static constexpr int kChunks = kKDim / 8;           // ... of a K tile
  static constexpr int kChunksV = kHeadDimV / 8;      // ... of O
  static constexpr int kVTileChunks = kVDim / 8;      // ... of a V tile
  static constexpr int kQRowBytes = kHeadDim * 2;
  static constexpr int kRowBytes = kKDim * 2;         // a K tile's row
  static constexpr int kRowBytesV = kVDim * 2;        // a V tile's row
  // Shared-memory tiles (tile_bytes, below): kColBlocks column blocks of kBlockCols elements (64,
  // 32 or 16: args.h's decode_tile_cols), rows of kColBytes (128, 64 or 32 bytes) in kBlockChunks
  // 16-byte chunks (8, 4 or 2; 2^kBlockChunksLog2). K's follow kKDim (Q's d); V's (the *V ones) kVDim.
  static constexpr int kBlockCols = decode_tile_cols(kKDim);
  static constexpr int kColBlocks = kKDim / kBlockCols;
  static constexpr int kColBytes = kBlockCols * 2;
  static constexpr int kBlockChunks = kBlockCols / 8;
  static constexpr int kBlockChunksLog2 = decode_block_chunks_log2(kKDim);
  static constexpr int kBlockColsV = decode_tile_cols(kVDim);
  static constexpr int kColBlocksV = kVDim / kBlockColsV;
  static constexpr int kColBytesV = kBlockColsV * 2;
  static constexpr int kBlockChunksV = kBlockColsV / 8;
  static constexpr int kBlockChunksLog2V = decode_block_chunks_log2(kVDim);
  // Q's rows; with split dims (or an FP8 cache) padded to 1024 bytes, so that the ring after it
  // starts at a multiple of V's swizzle repeat as well as K's (d=48's 16 rows are 1536 bytes; dv=64's
  // repeat is 1024).
  static constexpr int kQBytes = kSplitDims || kKvFp8 ? (kBlockM * kQRowBytes + 1023) / 1024 * 1024 : kBlockM * kQRowBytes;
  static constexpr int kTileBytes = kBlockN * kRowBytes;    // one K tile
  static constexpr int kTileBytesV = kBlockN * kRowBytesV;  // one V tile
  static constexpr int kStageBytes = kTileBytes + kTileBytesV;
  static constexpr int kRingBytes = kStages * kStageBytes;
  // fp8_convert group(2): the 16-bit stage after the ring, kStage16Bufs buffers (two: a tile's
  // conversion may start while slower warps of the group still score the previous one) of a K and a
  // V tile, kHeadDim and kHeadDimV elements a row.
  static constexpr int kTile16Bytes = kBlockN * kHeadDim * 2;
  static constexpr int kTile16BytesV = kBlockN * kHeadDimV * 2;
  static constexpr int kStage16Bytes = kFp8Group ? kStage16Bufs * (kTile16Bytes + kTile16BytesV) : 0;
  // Epilogue (reuses Q and the ring): the key groups' merge buffer (kernel.cu, MergeBuf). Its
  // one-slot form needs kMergeBytes (O summed in fp32, every group's row maxima, the row sums, two
  // spare rows); the slot form, one O per key group, is used where Q and the ring hold it. Rows
  // of kOStride floats: 4 floats of padding spread a quad's 8 rows over the banks.
  static constexpr int kOStride = kHeadDimV + 4;
  static constexpr int kMergeBytes = kBlockM * kOStride * 4 + (kWarpsN + 3) * kBlockM * 4;
  static constexpr int kMaxSplits = kDecodeMaxSplits;  // the plan never splits more (split.h)
  static constexpr int kSmemBytes =
      kQBytes + kRingBytes + kStage16Bytes > kMergeBytes ? kQBytes + kRingBytes + kStage16Bytes : kMergeBytes;

  // Loads (args.h: decode_row_loads): the kLoadThreads threads of a load group copy kLoadRows rows
  // of each tile. cta: the whole CTA loads whole tiles; warp: each key group (kWarpsM warps) loads
  // its own kWarpKeys rows and waits on its own barrier. kRowLoads (d 32, 64, 128, 256): thread t
  // copies chunk t % kChunks of rows t / kChunks + pass * kRowsPerPass. Else block loads (d 48,
  // 80, 96, 112, 160, 192 ...): item t + pass * kLoadThreads of the group's kLoadItems, column
  // block by column block (decode_block_item), the last pass ragged where they do not fill it
  // (kLoadsRagged). A thread's passes visit kLookups rows (paged: the page lookups it keeps).
  static constexpr int kLoadThreads = kWarpTiles ? 32 * kWarpsM : kConsumerThreads;
  static constexpr int kLoadRows = kWarpTiles ? kWarpKeys : kBlockN;
  // (K's rows: kKDim elements, d's or, FP8, half.)
  static constexpr bool kRowLoads = decode_row_loads(kKDim, kLoadThreads);
  static constexpr int kRowsPerPass = kLoadThreads / kChunks;  // row loads
  static constexpr int kPasses = decode_load_passes(kKDim, kLoadThreads, kLoadRows);
  static constexpr int kLoadItems = kLoadRows * kChunks;
  static constexpr bool kLoadsRagged = kLoadItems % kLoadThreads != 0;
  static constexpr int kLookups = decode_load_lookups(kKDim, kLoadThreads, kLoadRows);
  // With split dims V's loads are their own (kernel.cu, LoaderOf<kVDim>): the same, over V's rows.
  static constexpr bool kRowLoadsV = decode_row_loads(kVDim, kLoadThreads);
  static constexpr int kRowsPerPassV = kLoadThreads / kVTileChunks;
  static constexpr int kLoadItemsV = kLoadRows * kVTileChunks;
  static constexpr bool kLoadsRaggedV = kLoadItemsV % kLoadThreads != 0;

  // The separate combine kernel: one (row, 4 columns) item a thread (split.h), over O's rows (dv).
  static constexpr int kCombineThreads = kDecodeCombineThreads;
  static constexpr int kCombineRows = decode_combine_rows(kHeadDimV);
  // Its pieces' loads unrolled 16 deep; 8 where dv is no power of 2: ptxas gives the combine kernel
  // 32 registers, and with a sink and items divided by d / 4 = 12, 20, 24 ... a row, 16 deep spilled
  // 4 bytes there (ptxas sm_90, 2026-11-28: at every such d of 48-240; 8 deep, at none).
  static constexpr int kCombineUnroll = (kHeadDimV & (kHeadDimV - 1)) == 0 ? 16 : 8;

  // Named barriers (bar.sync ids; 0 is __syncthreads): tile_share warp, key group wn waits on
  // kBarKeyGroup + wn with its kWarpsM warps; kv_load tma, the consumer warps on kBarConsumers
  // (never both: TMA loads whole tiles).
  static constexpr int kBarKeyGroup = 1;
  static constexpr int kBarConsumers = 1;
  // fp8_convert group: key group wn's warps wait on kBarConvert + wn for its converted slice.
  static constexpr int kBarConvert = 8;

  // (d=512 would need O's 16 x 512 fp32 accumulators of a row tile in one warp: 256 registers a
  // thread, more than there are.)
  static_assert(kHeadDim % 16 == 0 && kHeadDim >= 32 && kHeadDim <= 256,
                "head_dim: a multiple of 16 (the MMA's k16 steps) from 32 to 256");
  static_assert(kHeadDimV % 16 == 0 && kHeadDimV >= 32 && kHeadDimV <= 256,
                "head_dim_v: a multiple of 16 (P V's n8 tiles in pairs, ldmatrix_x4_trans) from 32 to 256");
  static_assert(kColBlocks * kBlockCols == kKDim && kBlockChunks == 1 << kBlockChunksLog2,
                "a row is whole column blocks of 2, 4 or 8 chunks");
  static_assert(!kKvFp8 || (kHeadDim % 32 == 0 && kHeadDimV % 32 == 0),
                "FP8 caches: head dims that are multiples of 32 (a K load covers two k16 steps, a V load 32 of O's columns)");
  static_assert(kColBlocksV * kBlockColsV == kVDim && kBlockChunksV == 1 << kBlockChunksLog2V,
                "a V row is whole column blocks of 2, 4 or 8 chunks");
  static_assert(kBlockM % 16 == 0 && kBlockM >= 16 && kBlockM <= 64, "block_m: 16, 32, 48 or 64 rows");
  static_assert(kWarps % kWarpsM == 0 && (kBlockM / 16) % kWarpsM == 0 && kMw >= 1 && kMw <= 2,
                "each warp owns 1 or 2 whole 16-row tiles");
  static_assert(kBlockN % kWarpsN == 0 && kWarpKeys % 16 == 0, "each warp scores whole 16-key steps");
  static_assert(!kRowLoads || (kRowsPerPass >= 1 && kLoadRows % kRowsPerPass == 0 && !kLoadsRagged),
                "row loads: a load pass covers whole rows, and the passes the tile");
  static_assert(!kRowLoadsV || (kRowsPerPassV >= 1 && kLoadRows % kRowsPerPassV == 0 && !kLoadsRaggedV),
                "V's row loads: a load pass covers whole rows, and the passes the tile");
  static_assert(kRowLoads || ((kLoadThreads & (kLoadThreads - 1)) == 0 && (kLoadRows & (kLoadRows - 1)) == 0),
                "block loads: a thread's rows repeat every kLookups passes (threads and rows powers of 2)");
#if defined(LOAD_PASSES) && defined(LOAD_LOOKUPS)  // the renderer's (tests/harness/decode_build.sh has none)
  static_assert(kPasses == LOAD_PASSES && kLookups == LOAD_LOOKUPS,
                "search space's load_passes or load_lookups disagrees with the kernel's loads");
#endif
  static_assert(kStages >= 2 && kStages <= 8, "2 to 8 stages");
  static_assert(kBarKeyGroup + kWarpsN - 1 <= 15, "named barriers 1..15");
  static_assert(!kFp8Group || (kWarpsM > 1 && kBarConvert + kWarpsN - 1 <= 15 && kBarKeyGroup + kWarpsN <= kBarConvert),
                "fp8_convert group: several row warps a key group, and its barriers past the others'");
  static_assert(kSmemBytes == SMEM_BYTES, "search space's smem_bytes disagrees with the kernel's layout");
  static_assert(kThreads == THREADS, "search space's threads disagrees with warps * 32 (+ 32: TMA producer)");
  static_assert(!kKvTma || !kWarpTiles, "TMA loads whole tiles (tile_share: cta)");
  static_assert(kCluster == 1 || kCluster == 2 || kCluster == 4 || kCluster == 8 || kCluster == 16,
                "cluster: 1, 2, 4, 8 or 16 CTAs");
  static_assert(!kClusterMerge || !kLastCta, "one split merge: cluster or last CTA");
};

// Shared-memory tiles of `rows` rows are stored as kColBlocks column blocks of (rows, kBlockCols
// elements), rows of kColBytes, whose 16-byte chunk index within the block is XORed with a
// function of `xr` = row % 8 (0: unswizzled, TMA boxes of fewer than 8 rows): the layout a TMA box
// of (kBlockCols, rows) lands in with the swizzle of kColBytes' span (args.h, decode_tile_bytes),
// so an ldmatrix phase's 8 rows and a cp.async phase's chunks hit 8 bank groups. Linear in row: a
// slice of rows from row0 is the tile's address + row0 * kColBytes.
// kDim: the tile's row elements, Q's head dim (the default), K's (Traits::kKDim: d, or d / 2 for an
// FP8 cache) or V's (Traits::kVDim).
template <int kDim = Traits::kHeadDim>
ATT_SPLIT_FN constexpr unsigned tile_bytes(int row, int chunk, int rows, int xr) {
  constexpr int kL = decode_block_chunks_log2(kDim), kB = decode_tile_cols(kDim) * 2;
  return static_cast<unsigned>((chunk >> kL) * rows * kB + row * kB + (((chunk & ((1 << kL) - 1)) ^ (xr >> (3 - kL))) << 4));
}
// The same as args.h's decode_tile_bytes (the layout the CPU tests hold to TMA's swizzle), checked
// at compile time over two swizzle repeats of rows, swizzled and not. (Not one function: computing
// it from the head dim inside the kernel changed d=64 builds' SASS.)
template <int kDim>
ATT_SPLIT_FN constexpr bool tile_bytes_agree() {
  for (int r = 0; r < 16; ++r)
    for (int ch = 0; ch < kDim / 8; ++ch)
      for (int xr = r & 7;; xr = 0) {
        if (tile_bytes<kDim>(r, ch, 16, xr) != decode_tile_bytes(r, ch, 16, xr, kDim)) return false;
        if (xr == 0) break;
      }
  return true;
}
static_assert(tile_bytes_agree<Traits::kHeadDim>() && tile_bytes_agree<Traits::kKDim>() &&
                  tile_bytes_agree<Traits::kVDim>(),
              "tile_bytes is args.h's decode_tile_bytes");

}  // namespace att

#endif  // ATTNTUNE_FLASH_DECODE_TRAITS_CUH
