// Every tunable of flash_fwd_wgmma and everything derived from it. The renderer (or the nvcc
// harness) defines the macros; one spelling per tunable: block_n in YAML is BLOCK_N here and
// kBlockN below. The kernel reads only Traits::k*.
#ifndef ATTNTUNE_FLASH_FWD_WGMMA_TRAITS_CUH
#define ATTNTUNE_FLASH_FWD_WGMMA_TRAITS_CUH

#include "../common/variants.cuh"
#include "args.h"
#include "scheduler.h"

namespace att {

struct Traits {
  // Problem fields baked into the kernel.
  static constexpr int kHeadDim = ATT_HEAD_DIM;  // Q's and K's
  // V's and O's (P.V's wgmma N): ATT_HEAD_DIM_V where the problem names another (`dv=N`: DeepSeek's
  // MLA prefill is 192 / 128); the renderer defines it for such problems only.
#ifdef ATT_HEAD_DIM_V
  static constexpr int kHeadDimV = ATT_HEAD_DIM_V;
#else
  static constexpr int kHeadDimV = kHeadDim;
#endif
  static constexpr bool kBf16 = ATT_DTYPE_BF16 != 0;
  static constexpr bool kCausal = ATT_CAUSAL != 0;
  // A packed batch of sequences of different lengths (attntune_attention_forward_varlen): work
  // tiles of the longest sequence's grid, each in its sequence's rows (TMA coordinates offset by
  // cu_seqlens; the tensor maps span the packed rows). The renderer defines ATT_VARLEN for
  // varlen problems only. One CTA per tile, or a persistent grid taking the tiles from a counter
  // (with a producer; no split tail, no multicast: the space says so).
#ifdef ATT_VARLEN
  static constexpr bool kVarlen = ATT_VARLEN != 0;
#else
  static constexpr bool kVarlen = false;
#endif
  // A KV cache (attntune_attention_forward_kvcache): each sequence's keys from cache_seqlens, K and
  // V through the page table (TMA boxes within a page) or contiguous, and the rows of a sequence's
  // last K/V tile past its keys zeroed in V (a cache holds anything there). The renderer defines
  // ATT_KVCACHE for paged problems only. Persistent grids take each tile's keys from its sequence
  // (work_tile); the split tail (equal tiles) and multicast (one CTA loading for two) are off.
#ifdef ATT_KVCACHE
  static constexpr bool kKvcache = ATT_KVCACHE != 0;
#else
  static constexpr bool kKvcache = false;
#endif
  // An FP8 e4m3 KV cache (`kv_dtype=fp8`, kvcache builds; the renderer defines ATT_KV_FP8 for such
  // problems only): the producer's TMA thread loads each K and V tile's bytes into a staging buffer
  // (a tile of head_dim / 2 16-bit elements a row, as the maps view the cache), and the producer
  // warpgroup's other three warps convert it, exactly, into the 16-bit stage the consumers read
  // (mainloop.cuh, convert_tile). K's scale joins the softmax scale, V's multiplies O.
#ifdef ATT_KV_FP8
  static constexpr bool kKvFp8 = ATT_KV_FP8 != 0;
#else
  static constexpr bool kKvFp8 = false;
#endif
  // An FP8 forward (`dtype=fp8`; the renderer defines ATT_QKV_FP8 for such problems only): Q, K and
  // V in e4m3, one byte an element, O in the 16-bit dtype (ATT_DTYPE_BF16). Both GEMMs are FP8 wgmma
  // (m64nNk32, e4m3 x e4m3 -> fp32), whose operands from shared memory are K-major only: V arrives
  // transposed (V^T: (batch, heads_kv, head_dim_v, keys), keys contiguous; launch.h), so its tile is
  // head_dim_v rows of block_n bytes. Q's and K's tiles are rows of head_dim bytes. Every tile is
  // laid out as the 16-bit tiles are, at half the columns (a row of d bytes is d / 2 16-bit
  // columns: the same swizzle spans, atoms and k-steps of 32 bytes). P goes to e4m3 A fragments
  // (mainloop.cuh, pack_p_e4m3); each tile's P.V accumulates into registers of its own and is
  // added to O in fp32 (two-level accumulation: Hopper's FP8 wgmma keeps too few bits of a long
  // running sum). Descales: Q's and K's join the softmax scale, V's multiplies O.
#ifdef ATT_QKV_FP8
  static constexpr bool kQkvFp8 = ATT_QKV_FP8 != 0;
#else
  static constexpr bool kQkvFp8 = false;
#endif
  // Work tiles carry their sequence's lengths (varlen, kvcache); else every sequence is AttnParams'.
  static constexpr bool kSeqLens = kVarlen || kKvcache;
  // Attention variants (docs/CONTRACT.md; the renderer defines ATT_WINDOW, ATT_SOFTCAP and ATT_SINKS
  // for problems with them only, variants.cuh makes them 0 otherwise): compile-time features of a
  // build, their sizes run-time arguments (AttnParams::variant). A window: each work tile visits the
  // K/V tiles its rows' windows reach (scheduler.h, window_tiles), masking those that cross a bound.
  // A soft-cap: c * tanh(q.k * scale / c) on the raw scores before the mask, tanh accurate (ex2 and
  // rcp) or tanh.approx (softcap_tanh). Sinks: the head's logit joins each row's normalisation in
  // the epilogue.
  static constexpr bool kWindow = ATT_WINDOW != 0;
  static constexpr bool kSoftcap = ATT_SOFTCAP != 0;
  static constexpr bool kSinks = ATT_SINKS != 0;
#if defined(SOFTCAP_TANH) && defined(SOFTCAP_TANH_APPROX)
  static constexpr bool kSoftcapApprox = SOFTCAP_TANH == SOFTCAP_TANH_APPROX;
#else
  static constexpr bool kSoftcapApprox = false;
#endif

  // Tunables (search_spaces/flash_fwd_wgmma.yaml).
  static constexpr int kBlockM = BLOCK_M;    // query rows per CTA: 64 per consumer warpgroup
  static constexpr int kBlockN = BLOCK_N;    // keys per K/V tile (the N of Q.K^T, the K of P.V)
  static constexpr int kStages = STAGES;     // K and V each in a ring of kStages smem tiles
  // A producer warpgroup (one thread issues every TMA copy) beside the consumers, with
  // setmaxnreg moving registers to the consumers; off: consumer thread 0 issues the copies.
  static constexpr bool kWarpSpecialize = WARP_SPECIALIZE;
  // The consumer warpgroups take turns issuing their GEMMs (a ring of named barriers), so one's
  // softmax runs while the others' GEMMs keep the tensor cores busy.
  static constexpr bool kPingPong = PING_PONG;
  // Inside a warpgroup: Q.K_j^T and P_{j-1}.V_{j-1} issued together, softmax of block j runs
  // while P.V of block j-1 is on the tensor cores.
  static constexpr bool kIntraWgOverlap = INTRA_WG_OVERLAP;
  // Of every 4 eight-column chunks of S, how many take exp2 on the FMA pipe (a polynomial)
  // instead of MUFU's ex2, which is as busy as the tensor cores at d=64.
  static constexpr int kExp2Emu = EXP2_EMU;
  // Causal: (batch, head) pairs whose tiles are ordered together, longest first (work_tile).
  static constexpr int kHeadGroup = HEAD_GROUP;
  // A warpgroup whose first K/V tile (the sequence's ragged end, or its causal diagonal) holds
  // at most this many keys it can see computes that tile kNarrowN wide; 0: always kBlockN.
  static constexpr int kNarrowN = NARROW_N;
  // 0: every step moves each row's softmax base to its new max and rescales O. T > 0: a row's
  // base moves only when its max grows by more than T (log2 units, so P < 2^T), and a warp skips
  // O's rescale while none of its rows moved.
  static constexpr int kLazyRescale = LAZY_RESCALE;
  // FlashAttention-4's loop shape (the overlapped schedule): the tiles that need no mask run in a
  // loop of their own, with no mask test, and a row's sum starts from l * factor, so that ex2 of
  // the factor comes first and O's rescale interleaves with the scores' ex2 (mainloop.cuh).
  // A tunable with a default: a config recorded before it existed (its campaign's stored space has
  // no FA4_LOOP) is a build without it, as `export` renders it from that space.
#if defined(FA4_LOOP)
  static constexpr bool kFa4Loop = FA4_LOOP != 0;
#else
  static constexpr bool kFa4Loop = false;
#endif
  // The consumer warpgroup's index broadcast from lane 0 (shfl), so that ptxas sees it warp-uniform
  // and keeps what derives from it in uniform registers: Q's wgmma descriptors (one a k16 step of
  // Q.K^T, each warpgroup's rows start cw * 64 rows into Q) stay in URs through the K/V loop
  // instead of vector registers moved by R2UR before every Q.K^T wgmma (16 R2UR a tile at d=128,
  // on the wgmma issue path; FlashAttention-4's loop has none there). A tunable with a default, as
  // FA4_LOOP: a config recorded before it is a build without it.
#if defined(WG_UNIFORM)
  static constexpr bool kWgUniform = WG_UNIFORM != 0;
#else
  static constexpr bool kWgUniform = false;
#endif
  // A masked tile's visible keys as bits (FlashAttention-4's mask): for each of a thread's rows and
  // key parities, one word whose bit c says whether key 8c + 2t + e of the tile is in the row's
  // range, tested bit by bit, which ptxas turns into R2P (seven predicates an instruction) and FSEL,
  // where a compare a score (ISETP, and an IADD3 a column pair for its key) was (mainloop.cuh,
  // mask_tile / mask_window). Not with k_perm (its keys are not 8c + 2t + e). A tunable with a
  // default, as FA4_LOOP: a config recorded before it is a build without it.
#if defined(MASK_BITS)
  static constexpr bool kMaskBits = MASK_BITS != 0;
#else
  static constexpr bool kMaskBits = false;
#endif
  // An FP8 forward (two-level accumulation): O's rescale joins the addition of each tile's P.V (of
  // each chunk's, with pv_chunks: O's columns of that chunk), o = o * factor + ot, one FFMA an
  // element of O where the rescale's FMUL and the addition's FADD were two. O is written by no wgmma there (the tile's P.V has its own
  // accumulator), so its rescale can wait for that addition: in the overlapped schedule O stays at
  // the base of the tile whose P.V comes next, and that tile's factor is held until then. A tunable
  // with a default, as FA4_LOOP: a config recorded before it is a build without it.
#if defined(FOLD_FMA)
  static constexpr bool kFoldFma = FOLD_FMA != 0;
#else
  static constexpr bool kFoldFma = false;
#endif
  // Ping-pong's turn in the plain schedule as FlashAttention-3 takes it there (its schedule without
  // the intra-warpgroup overlap, hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp): a warpgroup's turn is its
  // P.V (issued and waited for; with pv_chunks every chunk and its addition) and its next Q.K^T's
  // issue, so that the tensor pipe sees the two back to back while the other warpgroup's softmax
  // runs under them. Off: the turn is Q.K^T's issue and completion, P.V outside any turn. One turn
  // more a work tile (the first Q.K^T's, the last P.V's), which a warpgroup that computes nothing
  // takes idle. A tunable with a default, as FA4_LOOP: a config recorded before it is a build without.
#if defined(PP_PV)
  static constexpr bool kPpPv = PP_PV != 0;
#else
  static constexpr bool kPpPv = false;
#endif
  // An FP8 forward: K's rows land permuted, the tile's key 16g + 4t + 2h + e (g its 16-key groups, t
  // in 0..3, h and e in 0..1) in shared-memory row h * block_n / 2 + 8g + 2t + e (two TMA boxes a tile
  // over a 5-d map that splits the keys in fours, launch_plan.h key_pairs_map), so that S's column
  // chunk c holds keys 16 (c % C) + 4t + 2 (c / C) + e (C = block_n / 16): the four keys of each 16
  // that FP8 wgmma's A operand wants of a thread are in chunks g and g + C, and P packs with
  // conversions alone (no shuffles: pack_p_e4m3). P.V sums over keys in any order, so V^T stays as it
  // is; the mask takes the same order. The narrow first tile (the first narrow_n columns) is not
  // written for it. A tunable with a default: a config recorded before it is a build without it.
#if defined(K_PERM)
  static constexpr bool kKPerm = K_PERM != 0;
#else
  static constexpr bool kKPerm = false;
#endif
  // Persistent non-causal grids with a producer: the last partial round of work tiles is shared
  // out by K/V iterations, an equal share per CTA (stream-K), when the launcher passes a
  // workspace (TmaMaps::split_tail > 0); pieces are combined by the last warp to arrive.
  static constexpr bool kSplitTail = SPLIT_TAIL && !kCausal && kWarpSpecialize;
  // Causal persistent grids (PERSISTENT: the launch geometry) with a producer: the producer
  // takes each next work tile from a global counter (TmaMaps::tile_count) when its CTA is nearly
  // done, in the longest-first order of work_tile, and hands it to the consumers through shared
  // memory (the launcher passes no counter: round-robin).
  // Varlen persistent grids take their tiles from the counter too (tiles of sequences of different
  // lengths, longest first when the launcher orders them).
  static constexpr bool kDynamicTiles = (kCausal || kVarlen) && kWarpSpecialize && PERSISTENT;
  // SPLIT_TAIL on such a causal grid (dense, no window, 16-bit inputs): the counter's last units are
  // pieces of the last work tiles (scheduler.h, CausalSplit), combined as the stream-K tail's are,
  // when the launcher passes the workspaces (TmaMaps::causal_split).
  static constexpr bool kSplitCausal = SPLIT_TAIL && kCausal && kDynamicTiles && !kVarlen;
  // Non-causal persistent grids with a producer: CTAs 2k and 2k+1 run as a cluster
  // (__cluster_dims__) on adjacent query blocks of one head, and the first loads every K/V tile
  // into both (TMA multicast): half the L2 reads per FLOP. The query blocks are padded to pairs
  // (an idle last block when their count is odd).
  static constexpr bool kKvMulticast = KV_MULTICAST;
  static_assert(!kVarlen || !(PERSISTENT) || (kWarpSpecialize && !(SPLIT_TAIL) && !(KV_MULTICAST)),
                "a persistent varlen build takes its tiles from a counter through the producer warpgroup, with no "
                "split tail or multicast (those index tiles of equal sequences)");
  static_assert(!kWindow || !(SPLIT_TAIL),
                "split_tail shares out tiles of equal K/V iterations; a window's tiles differ (at the sequence's "
                "ends, and by where the window meets the K/V tiles)");
  static_assert(!kKvcache || !(SPLIT_TAIL || KV_MULTICAST),
                "a kvcache build's tiles differ in keys per sequence (no split tail) and load pages one CTA at a "
                "time (no multicast)");
  // GQA packing (scheduler.h, pack_rows): a work tile's rows are TmaMaps::pack_rows query rows of
  // every query head of one KV head (heads_q / heads_kv, run time), loaded as one TMA box a column
  // block. A tunable with a default: a config recorded before it existed is a build without it.
#if defined(PACK_GQA)
  static constexpr bool kPackGqa = PACK_GQA != 0;
#else
  static constexpr bool kPackGqa = false;
#endif
  static_assert(!kPackGqa || !((SPLIT_TAIL && !kSplitCausal) || KV_MULTICAST),
                "pack_gqa: the stream-K tail and the cluster pairs index the tiles of unpacked heads (the causal "
                "split's pieces are of whatever tile the counter hands out)");
  // An FP8 forward's P.V in column chunks (pv_chunks): each tile's P.V is computed kPvCols value dims
  // at a time into ot, a chunk's accumulator, and each chunk is added to O in fp32 before the next
  // chunk's wgmma reuses ot (two-level accumulation kept, at kPvCols / 2 registers instead of dv / 2:
  // at dv=256, O and a whole tile's ot alone would take 256). 1: the whole tile at once, as before.
  // A tunable with a default: a config recorded before it existed is a build with 1.
#if defined(PV_CHUNKS)
  static constexpr int kPvChunks = PV_CHUNKS;
#else
  static constexpr int kPvChunks = 1;
#endif
  static constexpr int kPvCols = kHeadDimV / kPvChunks;  // value dims a chunk (P.V's wgmma N)
  // The chunks' accumulators (pv_buffers): 1, each chunk issued once the one before is added to O; 2,
  // the next chunk issued before the last one's add, so the tensor cores are not left waiting for it.
#if defined(PV_BUFFERS)
  static constexpr int kPvBuffers = PV_BUFFERS;
#else
  static constexpr int kPvBuffers = 1;
#endif
  static constexpr int kProducerRegs = PRODUCER_REGS;  // setmaxnreg.dec target (producer)
  static constexpr int kConsumerRegs = CONSUMER_REGS;  // setmaxnreg.inc target (consumers)

  // Derived.
  static constexpr int kCluster = kKvMulticast ? 2 : 1;  // CTAs per cluster (x)
  // With a split or multicast the plain tiles' end and the query-block count live in shared memory
  // (split_pieces writes them, next_item reads them): kept in registers through the producer's
  // loop, they spilled its 24 registers.
  static constexpr bool kScheduleInSmem = kSplitTail || kKvMulticast;
  static constexpr int kConsumerWgs = kBlockM / 64;  // wgmma is m64: one warpgroup per 64 rows
  static constexpr int kConsumerThreads = kConsumerWgs * 128;
  static constexpr int kThreads = kConsumerThreads + (kWarpSpecialize ? 128 : 0);
  // Shared memory: every tile is [column block][row][kCols elements] (args.h, wgmma_tile::cols): rows of
  // kRowBytes swizzled by TMA over that span (128, 64 or 32 bytes: d % 64 == 0, d % 32 == 0, else),
  // in atoms of 8 rows (kAtomBytes); the wgmma descriptors take the same span. The first tile starts
  // 1024-aligned and every tile and column block at a multiple of the atom. Barriers after the tiles.
  // An FP8 forward's tiles in 16-bit columns: a row of d bytes is d / 2 of them (kQkvFp8, above).
  static constexpr int kHeadDimCols = kQkvFp8 ? kHeadDim / 2 : kHeadDim;
  static constexpr int kCols = wgmma_tile::cols(kHeadDimCols);  // 16-bit columns per column block (a TMA box's width)
  static constexpr int kRowBytes = 2 * kCols;             // = the swizzle span
  static constexpr int kAtomBytes = 8 * kRowBytes;        // the swizzle pattern's period: 8 rows
  static constexpr int kColBlocks = kHeadDimCols / kCols;  // swizzled column blocks per row
  // A column block's width in the tensor maps' elements (TMA coordinates): an FP8 forward's maps
  // are over bytes (launch.h), the others over 16-bit elements.
  static constexpr int kColCoord = kQkvFp8 ? kRowBytes : kCols;
  static constexpr int kKSteps = kHeadDimCols / 16;  // k-steps of Q.K^T (k16; FP8: k32, 32 bytes either way)
  static constexpr int kPKeys = kQkvFp8 ? 32 : 16;   // keys per k-step of P.V
  static constexpr int kPSteps = kBlockN / kPKeys;   // k-steps of P.V
  static constexpr int kNarrowW = kNarrowN > 0 ? kNarrowN : kBlockN;  // the narrow tile's width
  // The epilogue's 16-byte stores: a quad's 4 threads store 32 columns, so head_dim / 32 groups and,
  // when head_dim % 32 == 16, a last group of 16 columns that threads 0 and 1 store.
  static constexpr int kOutGroups = (kHeadDimV + 31) / 32;
  static constexpr int kQBytes = kBlockM * kHeadDimCols * 2;
  static constexpr int kKVBytes = kBlockN * kHeadDimCols * 2;  // one K stage (and V's when kHeadDimV == kHeadDim)
  static constexpr int kQColBlockBytes = kBlockM * kRowBytes;
  static constexpr int kKVColBlockBytes = kBlockN * kRowBytes;
  // V's tiles, laid out as K's at V's head dim: its own column blocks and span. An FP8 forward's V^T
  // tile: kHeadDimV rows of kBlockN bytes (kBlockN / 2 16-bit columns), K-major as K's.
  static constexpr int kVRowCols = kQkvFp8 ? kBlockN / 2 : kHeadDimV;  // a V tile row's 16-bit columns
  static constexpr int kVRows = kQkvFp8 ? kHeadDimV : kBlockN;         // its rows
  static constexpr int kColsV = wgmma_tile::cols(kVRowCols);
  static constexpr int kRowBytesV = 2 * kColsV;
  static constexpr int kAtomBytesV = 8 * kRowBytesV;
  static constexpr int kColBlocksV = kVRowCols / kColsV;
  static constexpr int kColCoordV = kQkvFp8 ? kRowBytesV : kColsV;  // in the map's elements (kColCoord)
  static constexpr int kVBytes = kVRows * kVRowCols * 2;  // one V stage
  static constexpr int kVColBlockBytes = kVRows * kRowBytesV;
  static constexpr int kOffK = kQBytes;
  static constexpr int kOffV = kOffK + kStages * kKVBytes;
  // FP8 caches: a staging buffer for K's bytes and one for V's (a tile of kBlockN rows of head_dim
  // bytes each, laid out as a 16-bit tile of head_dim / 2 columns: its own column blocks and swizzle
  // span), after the rings, each 1024-aligned. One each: two (the next tile's
  // load in flight during this one's conversion) made no gain, since the conversion itself, not its
  // loads, set the time (3663 us with one, 4067 with two and two chunks a converter step, b4 h32/8
  // s2048 sk10240, H200 2026-11-30), and left d=256 no config with two consumer warpgroups. Calls
  // with several query tiles a KV head convert before the kernel instead (launch.h, dequant_first).
  static constexpr int kColsRawK = wgmma_tile::cols(kHeadDim / 2), kColsRawV = wgmma_tile::cols(kHeadDimV / 2);
  static constexpr int kRowBytesRawK = 2 * kColsRawK, kRowBytesRawV = 2 * kColsRawV;
  static constexpr int kColBlocksRawK = kHeadDim / 2 / kColsRawK, kColBlocksRawV = kHeadDimV / 2 / kColsRawV;
  static constexpr int kRawKBytes = kKvFp8 ? (kBlockN * kHeadDim + 1023) / 1024 * 1024 : 0;
  static constexpr int kRawVBytes = kKvFp8 ? (kBlockN * kHeadDimV + 1023) / 1024 * 1024 : 0;
  static constexpr int kRawKColBlockBytes = kBlockN * kRowBytesRawK, kRawVColBlockBytes = kBlockN * kRowBytesRawV;
  static constexpr int kOffRawK = (kOffV + kStages * kVBytes + 1023) / 1024 * 1024;
  static constexpr int kOffRawV = kOffRawK + kRawKBytes;
  static constexpr int kOffBars = kKvFp8 ? kOffRawV + kRawVBytes : kOffV + kStages * kVBytes;
  static constexpr int kBarBytes = 256;
  static constexpr int kAlignSlack = 1024;  // dynamic smem is only 16-byte aligned
  static constexpr int kSmemBytes = kOffBars + kBarBytes + kAlignSlack;
  // The barrier area (kBarBytes from kOffBars; smem.cuh's Smem names each address). The mbarriers,
  // 8 bytes each: Q's full, each stage's K full and V full, K empty and V empty, Q's empty.
  static constexpr int kBarQFull = 0;
  static constexpr int kBarKFull = 8;  // + 8 * stage
  static constexpr int kBarVFull = kBarKFull + 8 * kStages;
  static constexpr int kBarKEmpty = kBarVFull + 8 * kStages;
  static constexpr int kBarVEmpty = kBarKEmpty + 8 * kStages;
  static constexpr int kBarQEmpty = kBarVEmpty + 8 * kStages;
  static constexpr int kBarsEnd = kBarQEmpty + 8;
  // Then the schedule's words. Split tail or multicast (kScheduleInSmem): the CTA's two pieces
  // (sched::SplitPiece: tail tile, first and end iteration), the plain tiles' end and the query
  // blocks, which split_pieces writes once and next_item reads. Dynamic tiles: the producer's next
  // work tile, written before that tile's Q arrives on q_full.
  static constexpr int kWordPieces = 128;
  static constexpr int kPieceBytes = 12, kPieceU = 0, kPieceLo = 4, kPieceHi = 8;
  static constexpr int kWordPlainEnd = kWordPieces + 2 * kPieceBytes;
  static constexpr int kWordMBlocks = kWordPlainEnd + 4;
  static constexpr int kWordSched = kWordMBlocks + 4;
  // FP8 caches: the staging buffers' mbarriers (K full, V full, K empty, V empty) and the end word
  // (the producer's last plain arrive on K's full barrier carries it: no more tiles).
  static constexpr int kBarRawKFull = 168, kBarRawVFull = 176, kBarRawKEmpty = 184, kBarRawVEmpty = 192;
  static constexpr int kWordRawEnd = 200;
  static_assert(kBarsEnd <= kWordPieces && kWordSched + 4 <= kBarRawKFull && kWordRawEnd + 4 <= kBarBytes,
                "the barrier area overflows");
  // The converters: the producer warpgroup's warps 1-3.
  static constexpr int kConverters = 96;
  static_assert(sizeof(sched::SplitPiece) == kPieceBytes, "a piece is three ints");
  // Named barriers (bar.sync ids; 0 is __syncthreads): ping-pong's ring, one per consumer
  // warpgroup (warpgroup cw issues its GEMMs between a sync on kNamedPingPong + cw and an arrive on
  // the next warpgroup's), then one per consumer warpgroup for itself (zero_v_tail).
  static constexpr int kNamedPingPong = 1;
  static constexpr int kNamedWarpgroup = kNamedPingPong + kConsumerWgs;
  static constexpr int kPingPongThreads = 256;  // a warpgroup syncs with the one before it
  static_assert(kNamedWarpgroup + kConsumerWgs <= 16, "16 named barriers");

  static_assert(kHeadDim % 16 == 0 && kHeadDim >= 32 && kHeadDim <= 256,
                "head_dim: a multiple of 16 (Q.K^T's k-step) in [32, 256] (P.V's wgmma N)");
  static_assert(kHeadDimV % 16 == 0 && kHeadDimV >= 32 && kHeadDimV <= 256,
                "head_dim_v: a multiple of 16 in [32, 256] (P.V's wgmma N, the epilogue's 16-column chunks)");
  static_assert(kRowBytes == 128 || kRowBytes == 64 || kRowBytes == 32, "a TMA / wgmma swizzle span");
  static_assert(kRowBytesV == 128 || kRowBytesV == 64 || kRowBytesV == 32, "a TMA / wgmma swizzle span");
  static_assert(kVColBlockBytes % kAtomBytesV == 0 && (kOffV % 1024) % kAtomBytesV == 0,
                "V's tiles and column blocks start at whole swizzle atoms");
  static_assert(kQColBlockBytes % kAtomBytes == 0 && kKVColBlockBytes % kAtomBytes == 0 && 1024 % kAtomBytes == 0,
                "tiles and column blocks start at whole swizzle atoms");
  static_assert(kBlockM % 64 == 0 && kConsumerWgs >= 1 && kConsumerWgs <= 3, "block_m 64, 128 or 192");
  static_assert(kBlockN % 16 == 0 && kBlockN >= 64 && kBlockN <= 256,
                "block_n: a multiple of 16 (the P.V k-step) in [64, 256] (the wgmma N range)");
  static_assert(kStages >= 1 && kStages <= 4, "1 to 4 K/V stages");
  static_assert(kExp2Emu >= 0 && kExp2Emu <= 4, "exp2_emu counts chunks of every 4");
  static_assert(kNarrowN == 0 || (kNarrowN % 16 == 0 && kNarrowN >= 64 && kNarrowN < kBlockN),
                "narrow_n: 0, or a multiple of 16 in [64, block_n)");
  static_assert(kLazyRescale >= 0 && kLazyRescale <= 8, "lazy_rescale: 0 (off) to 8 (P below 256)");
  static_assert(kHeadGroup >= 1, "head_group: at least one (batch, head) per group");
  static_assert(!kPingPong || kConsumerWgs >= 2, "ping-pong needs two or more consumer warpgroups");
  static_assert(kWarpSpecialize || (!kPingPong && !kIntraWgOverlap),
                "without a producer warpgroup only the plain schedule is written");
  static_assert(kProducerRegs % 8 == 0 && kConsumerRegs % 8 == 0 && kProducerRegs >= 24 && kConsumerRegs <= 256,
                "setmaxnreg takes multiples of 8 in [24, 256]");
  static_assert(!kWarpSpecialize || 128 * (kProducerRegs + kConsumerWgs * kConsumerRegs) <= 65536,
                "the register split exceeds the register file");
  static_assert(!kKvMulticast || (!kCausal && kWarpSpecialize && PERSISTENT),
                "kv_multicast: non-causal persistent grids with a producer");
  static_assert(!kKvFp8 || (kKvcache && kWarpSpecialize && kHeadDim % 32 == 0 && kHeadDimV % 32 == 0 &&
                             kProducerRegs >= 40 && !kKvMulticast && !kSplitTail && !kSoftcap),
                "an FP8 cache: kvcache builds with a producer warpgroup (its warps convert the tiles, at 40 "
                "registers or more), no soft-cap, head dims multiples of 32 (a staging row of d bytes is a 16-bit row of d / 2 "
                "elements, a multiple of 16)");
  static_assert(!kQkvFp8 || (!kKvcache && !kVarlen && !kKvFp8 && !kPackGqa && !kSoftcap && kLazyRescale == 0 &&
                             kHeadDim % 32 == 0 && kBlockN % 32 == 0 && kBf16),
                "an FP8 forward: dense tensors (no KV cache, varlen, GQA packing), no soft-cap or lazy rescale, head "
                "dims and block_n multiples of 32 (k32 steps), bf16 output");
  static_assert(!kPpPv || (kPingPong && !kIntraWgOverlap),
                "pp_pv: ping-pong's turn around P.V and the next Q.K^T, in the plain schedule");
  static_assert(!kFoldFma || kQkvFp8, "fold_fma: the FP8 forward's tile accumulator (whole, or in pv_chunks)");
  static_assert(!kKPerm || (kQkvFp8 && !kKvMulticast && kNarrowN == 0 && kBlockN % 32 == 0),
                "k_perm: the FP8 forward's K tiles in two TMA boxes of key pairs, without multicast pairs or a narrow "
                "first tile");
  static_assert(kPvChunks == 1 || (kQkvFp8 && kPvChunks >= 2 && kPvChunks <= 4 && kHeadDimV % (32 * kPvChunks) == 0),
                "pv_chunks: an FP8 forward's P.V in 2 to 4 column chunks of a multiple of 32 value dims (FP8 wgmma's "
                "N; V^T's rows from chunk * kPvCols on start at whole swizzle atoms)");
  static_assert(kPvBuffers == 1 || (kPvBuffers == 2 && kPvChunks > 2),
                "pv_buffers: 1, or 2 with more than two chunks (two halves' accumulators are a whole tile's)");
  static_assert(kSmemBytes == SMEM_BYTES, "search space's smem_bytes disagrees with the kernel's layout");
  static_assert(kThreads == THREADS, "search space's threads disagrees with the kernel's");
};
// The kernel's files' short name for it.
typedef Traits T;

}  // namespace att

#endif
