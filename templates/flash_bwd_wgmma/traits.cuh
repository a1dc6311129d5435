// Every tunable of flash_bwd_wgmma and everything derived from it. The renderer defines the macros
// (one spelling per tunable: block_n in YAML is BLOCK_N here and kBlockN below); the kernels read
// only Traits::k*.
#ifndef ATTNTUNE_FLASH_BWD_WGMMA_TRAITS_CUH
#define ATTNTUNE_FLASH_BWD_WGMMA_TRAITS_CUH

#include "../common/variants.cuh"  // ATT_WINDOW, ATT_SOFTCAP, ATT_SINKS (0 when the renderer left them out)

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

  // Tunables (search_spaces/flash_bwd_wgmma.yaml).
  static constexpr int kBlockN = BLOCK_N;   // keys a CTA: 64 per warpgroup (wgmma's M), dK/dV in its registers
  static constexpr int kBlockM = BLOCK_M;   // query rows a step of the main loop (one Q/dO tile)
  static constexpr int kStages = Q_STAGES;  // Q/dO tiles in a ring: kStages - 1 steps' loads ahead
  // How dQ's share of a step reaches its fp32 accumulator: each thread's red.global.add.v2.f32 of
  // its accumulator pairs into the row-major accumulator (red), or the warpgroup's share staged in
  // shared memory in the accumulator fragments' order and added by the TMA unit, one bulk reduction
  // (cp.reduce.async.bulk .add.f32) of 64 x kDqN floats, into an accumulator in that order (bulk:
  // the conversion kernel reads it back, dq_offset).
  static constexpr bool kDqBulk = DQ_REDUCE == DQ_REDUCE_BULK;
  // quad: each thread's red.global.add.v4.f32 of its accumulator quads (rows g and g + 8, two
  // columns each) into the fragment-ordered accumulator that bulk builds use: half red's
  // instructions, no shared memory.
  static constexpr bool kDqQuad = DQ_REDUCE == DQ_REDUCE_QUAD;
  // dQ's wgmma of step i left in flight and finished (the wait, the addition) in step i + 1 while
  // its S^T and dP^T run, instead of waited for at once; dS^T then has two buffers (the one being
  // written, the one step i - 1's dQ reads). One dQ unit a warpgroup only.
  static constexpr bool kDqDefer = DQ_DEFER != 0;
  // The order the CTAs take their key blocks in: 0, the grid's (key blocks fastest); g > 0, (batch,
  // KV head) pairs in groups of g, each group's key blocks from the first (causal: the longest
  // walk) to the last, so that the last wave is short walks (longest-processing-time first).
  static constexpr int kLongestFirst = LONGEST_FIRST;
  // A packed batch (varlen builds): g > 0, the CTAs in the order the preprocessing kernel sorts the
  // batch's (sequence, key block) pairs into, groups of g sequences in turn, each longest walk first
  // (bwd_prepost.cuh, build_cta_order; a call in the deterministic mode keeps the grid's order); 0,
  // the grid's order.
#if defined(VARLEN_LPT)  // a tunable with a default: a config recorded before it existed is a build without it
  static constexpr int kVarlenLpt = VARLEN_LPT;
#else
  static constexpr int kVarlenLpt = 0;
#endif
  // A producer warpgroup (warp specialisation): its 128 threads issue every load (K and V once, then
  // each step's Q, dO, LSE and D rows by cp.async into the ring) and publish a stage on its "full"
  // mbarrier once the loads have landed; the consumer warpgroups wait on that barrier alone (no CTA
  // barrier at a step's top, no loads' issue on their path) and release a stage on its "empty"
  // mbarrier once their products have read it. setmaxnreg moves the producer's registers to them.
  static constexpr bool kProducer = PRODUCER != 0;
  // Q's and dO's tiles by the TMA unit (a producer build; dense calls): one producer thread issues a
  // step's boxes (64 columns by kBlockM rows, zeros past seqlen_q and past the head dim) and the 1-d
  // bulk copies of its LSE and D rows, all completing on the stage's "full" mbarrier, in place of the
  // producer warpgroup's cp.async copies (16-byte chunks through the load/store unit, which the
  // consumers' shared-memory stores and fences share). K and V stay cp.async, once a CTA, published on
  // an mbarrier of their own. The maps are the kernel's second argument (BwdMaps, bwd_params.h).
#if defined(TMA_LOADS)  // a tunable with a default: a config recorded before it existed is a build without it
  static constexpr bool kTmaLoads = TMA_LOADS != 0;
#else
  static constexpr bool kTmaLoads = false;
#endif
  // FlashAttention-4's step order (a producer build, one dQ unit a warpgroup): dV issued alone as soon
  // as P^T is packed, dS^T stored and the consumers' barrier passed under it, dQ issued, dK issued
  // once dV is done, dQ's staging and reduction under dK; waits one group at a time instead of
  // draining the pipe before the barrier and before dQ's addition (kernel.cu).
#if defined(FA4_ORDER)  // a tunable with a default: a config recorded before it existed is a build without it
  static constexpr bool kFa4Order = FA4_ORDER != 0;
#else
  static constexpr bool kFa4Order = false;
#endif
  // With kFa4Order: S^T and dP^T in two wgmma groups, P^T computed once S^T is done while dP^T runs,
  // dS^T once dP^T is done (FA4 has 11 ex2 under dP^T).
#if defined(SDP_SPLIT)  // a tunable with a default: a config recorded before it existed is a build without it
  static constexpr bool kSdpSplit = SDP_SPLIT != 0;
#else
  static constexpr bool kSdpSplit = false;
#endif
  // The two consumer warpgroups skewed (a producer build, FlashAttention-3's forward ping-pong): they
  // take turns to issue their products, S^T and dP^T, then dV and dK, then dQ, warpgroup 0 first,
  // each turn passed on by a named barrier (kBarTurn + the warpgroup that waits). The tensor pipe
  // then runs one warpgroup's products while the other computes P^T and dS^T or stages its dQ,
  // instead of both waiting for theirs together. The turns also order dS^T: a warpgroup issues dQ
  // once the other has stored its dS^T (the turn after its dV and dK), so no consumers' barrier.
#if defined(WG_SKEW)  // a tunable with a default: a config recorded before it existed is a build without it
  static constexpr bool kWgSkew = WG_SKEW != 0;
#else
  static constexpr bool kWgSkew = false;
#endif
  // Head dim 256 (no producer): step i + kStages - 1's loads issued after step i's S^T and dP^T
  // (which read another stage), so that the products start right after the step's barrier and the
  // loads' address arithmetic and copies run under them; otherwise before them, as the step's first
  // work.
#if defined(LATE_LOADS)  // a tunable with a default: a config recorded before it existed is a build without it
  static constexpr bool kLateLoads = LATE_LOADS != 0;
#else
  static constexpr bool kLateLoads = false;
#endif

  // Derived.
  // Head dim 256 splits the head dims between two warpgroups of the same 64 keys (kColSplit 2): dK
  // and dV over all 256 dims would be 256 fp32 registers a thread. Each warpgroup scores half the
  // step's queries (S^T and dP^T over all 256 dims, N = kBlockM / 2), P^T and dS^T go to shared
  // memory, and each accumulates its half of dK's, dV's and dQ's head dims with both operands from
  // shared memory (WgmmaKN): no product computed twice (flash_bwd_mma's dkv_split recomputes two).
  static constexpr int kColSplit = kHeadDim == 256 ? 2 : 1;
  // A step's (query head, query block) from a cursor carried through the loops (att_bwd::Walk) in
  // producer builds and at head dim 256, where it was measured faster than a divide a step (+2.2-4.2%,
  // H200 runs 314-316); builds without a producer at head dims up to 128 divide (walk_step), as they
  // did: there the cursor ran 2-3% slower (the deferred dQ's causal picks, runs 314-315). The loads'
  // loop (kWalkCursorLoads) and the consumers' (kWalkCursorSteps) apart: consumers of 128-row steps
  // (d <= 64: S^T and dP^T of 128 queries) take the cursor only in two consumer warpgroups (240
  // registers each) with dQ's bulk reductions and no skew. With red dQ its two registers spilled
  // 100-108 bytes where the divide spilled none, with wg_skew 16 (ptxas, CUDA 13.0, 2026-12-02), and
  // one warpgroup's 255 (block_n 64) 8-24 bytes more than the divide in packed causal builds
  // (2026-12-03); two warpgroups with bulk dQ build as clean as with the divide.
  static constexpr bool kWalkCursorSteps =
      (kProducer && (kBlockM / kColSplit <= 64 || (kDqBulk && !kWgSkew && kBlockN == 128))) ||
      kColSplit > 1;
  static constexpr bool kWalkCursorLoads = kProducer || kColSplit > 1;
  static constexpr int kWarpgroups = kBlockN / 64 * kColSplit;  // the consumers (the products)
  static constexpr int kConsumerThreads = kWarpgroups * 128;
  static constexpr int kThreads = kConsumerThreads + (kProducer ? 128 : 0);  // the producer warpgroup last
  // setmaxnreg targets with two consumer warpgroups: 128 * (24 + 2 * 240) of the SM's 65536
  // registers. With one (256 threads) every thread has 255 already, and none is moved.
  static constexpr bool kSetMaxNReg = kProducer && kWarpgroups > 1;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  // Named barriers: 0 is __syncthreads, 1 + wg a consumer warpgroup's own (dQ's staging, the turns),
  // kBarConsumers the consumer warpgroups' (dS^T complete) where a producer keeps out of __syncthreads.
  static constexpr int kBarConsumers = 1 + kWarpgroups;
  // kWgSkew: warpgroup wg waits for its turn on kBarTurn + wg (bar.sync), and passes the turn on by
  // arriving on the other's (bar.arrive), both of all the consumers' threads.
  static constexpr int kBarTurn = kBarConsumers + 1;
  static constexpr int kDkvN = kHeadDim / kColSplit;  // dK's and dV's head dims a warpgroup holds
  static constexpr int kSdpN = kBlockM / kColSplit;   // the step's queries a warpgroup scores
  // Tiles in shared memory are [column block][row][64 elements], rows of 128 bytes swizzled in
  // 16-byte chunks (chunk ^ row % 8, TMA's and wgmma's 128-byte swizzle), in atoms of 8 rows: Q,
  // dO (rows: queries, column blocks: head dims), K, V (keys, head dims) and dS^T (keys, queries).
  static constexpr int kCols = 64;
  static constexpr int kRowBytes = 128;
  static constexpr int kAtomBytes = 1024;
  static constexpr int kDBlocks = kHeadDim / kCols;  // column blocks of a head-dim row
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKBytes = kBlockN * kHeadDim * 2;
  static constexpr int kQColBlockBytes = kBlockM * kRowBytes;
  static constexpr int kKColBlockBytes = kBlockN * kRowBytes;
  // P^T and dS^T tiles stored by stmatrix (four a 64-query k-step group, from the fragments as
  // they are) rather than 16 32-bit stores and their addresses: +1.1-2.8% at b1 h16 s16k d=128, +3.1% at
  // d=64 s8k, +0.8-1.0% causal (H200, runs 361-362). Not beside a soft-cap, dQ's red reductions or
  // the deferred dQ, where stmatrix's aligned register quads spilled 4-36 bytes more (the soft-cap's
  // builds without setmaxnreg, red's and the deferred dQ's at 255 or 240 registers, the latter with
  // windows; NVRTC, CUDA 13.0, 2026-12-04). Producer builds without TMA under a window spill 4 bytes
  // more and still gain (+0.3-2.2%, run 363).
  static constexpr bool kStoreStmatrix = !kSoftcap && !kDqDefer && (kDqBulk || kDqQuad);
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;  // one dS^T buffer
  // dQ = dS K: (kBlockM / 64) query groups of 64 (wgmma's M) times kHeadDim / kDqN column groups,
  // shared out over the warpgroups (kDqUnits each).
  static constexpr int kQGroups = kBlockM / 64;
  static constexpr int kDqSplit = kWarpgroups / kQGroups > 1 ? kWarpgroups / kQGroups : 1;
  static constexpr int kDqN = kHeadDim / kDqSplit;
  static constexpr int kDqUnits = kQGroups * kDqSplit / kWarpgroups;

  // Shared memory from a 1024-byte aligned start: K, V, kStages Q and dO tiles, dS^T, then kStages
  // rows of LSE * log2(e) and of D = rowsum(dO * O) (fp32); 1024 bytes of slack for the alignment.
  static constexpr int kOffV = kKBytes;
  static constexpr int kOffQ = 2 * kKBytes;
  static constexpr int kOffDo = kOffQ + kStages * kQBytes;
  static constexpr int kOffDs = kOffDo + kStages * kQBytes;
  // Head dim 256: P^T beside dS^T (the other warpgroup's queries are read from there).
  static constexpr bool kTwoDs = kDqDefer || kProducer;  // two dS^T buffers (kernel.cu: ds_t)
  static constexpr int kOffP = kOffDs + (kTwoDs ? 2 : 1) * kDsBytes;
  static constexpr int kOffLse = kOffP + (kColSplit > 1 ? kDsBytes : 0);
  static constexpr int kOffDp = kOffLse + kStages * kBlockM * 4;
  // Bulk dQ: one staging area a unit, 64 x kDqN floats in fragment order.
  static constexpr int kDqStageBytes = 64 * kDqN * 4;
  static constexpr int kOffDqStage = kOffDp + kStages * kBlockM * 4;
  // Where the accumulator keeps (row, col) of a (batch, head)'s rows from row_base (the conversion
  // kernel's reads, bwd_prepost.cuh): row-major (red), or (bulk, quad) in blocks of kBlockM rows, each
  // kQGroups x kDqSplit units of 64 rows x kDqN columns in the order the main kernel's threads stage
  // their accumulators: float4 j4 of thread r at j4 * 128 + r.
  static constexpr bool kDqFragmentOrder = kDqBulk || kDqQuad;
  static __device__ __forceinline__ long long dq_offset(long long row_base, int row, int col) {
    const int m0 = row / kBlockM * kBlockM, rr = row - m0;
    const int qg = rr / 64, r = rr % 64, cg = col / kDqN, cc = col % kDqN;
    // Element j = 4c + 2h + e of thread (warp wi, lane 4g + t): row 16wi + 8h + g, column 8c + 2t + e.
    const int wi = r / 16, h = (r / 8) % 2, g = r % 8, c = cc / 8, t = (cc % 8) / 2, e = cc % 2;
    const int j = 4 * c + 2 * h + e, thread = wi * 32 + g * 4 + t;
    return (row_base + m0) * kHeadDim + (qg * kDqSplit + cg) * 64 * kDqN + ((j / 4) * 128 + thread) * 4 + j % 4;
  }
  // The producer's mbarriers: kStages "full" then kStages "empty" (8 bytes each), then with TMA
  // loads K's and V's (kv_full).
  static constexpr int kOffBar = kOffDqStage + (kDqBulk ? kWarpgroups * kDqUnits * kDqStageBytes : 0);
  static constexpr int kSmemBytes = kOffBar + (kProducer ? 2 * kStages * 8 : 0) + (kTmaLoads ? 8 : 0) + 1024;

  static_assert(kHeadDimReal % 16 == 0 && kHeadDimReal <= kHeadDim && kHeadDimReal > kHeadDim / 2 - (kHeadDim == 64 ? 32 : 0),
                "the head dim is a multiple of 16, padded to the next of 64, 128 and 256");
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256,
                "flash_bwd_wgmma serves head dims 64 and 128 (a warpgroup keeps dK and dV of its 64 keys over every "
                "head dim in registers) and 256 (two warpgroups a half each)");
  static_assert(kColSplit == 1 || (kBlockN == 64 && kBlockM == 64 && !kDqBulk && !kDqDefer),
                "head dim 256: 64 keys and 64-row steps (K, V, two Q/dO stages, P^T and dS^T take 210 KB), dQ by red "
                "or quad (no room for bulk's staging) and not deferred");
  static_assert(kBlockN == 64 || kBlockN == 128, "block_n is 64 or 128 (one or two warpgroups)");
  static_assert(kBlockM == 64 || kBlockM == 128, "block_m is 64 or 128");
  static_assert(kDqN % 64 == 0 && kDqUnits >= 1 && kDqUnits * kWarpgroups == kQGroups * kDqSplit,
                "dQ's column groups must be whole 64-column blocks of K, one or more a warpgroup");
  static_assert(kStages >= 2 && kStages <= 3, "2 or 3 Q/dO stages");
  static_assert(!kDqDefer || kDqUnits == 1, "a deferred dQ is one unit a warpgroup");
  static_assert(kVarlenLpt >= 0, "varlen_lpt is a group of sequences, or 0");
  static_assert(kLongestFirst >= 0, "longest_first is a group of (batch, KV head) pairs, or 0");
  static_assert(!kProducer || kColSplit == 1, "a producer warpgroup at head dims up to 128");
  static_assert(!kTmaLoads || kProducer, "tma_loads: the producer warpgroup issues them");
  static_assert(!kFa4Order || (kProducer && kDqUnits == 1 && !kDqDefer), "fa4_order: a producer build, one dQ unit a warpgroup");
  static_assert(!kSdpSplit || (kFa4Order && !kSoftcap && kColSplit == 1), "sdp_split: with fa4_order, no soft-cap");
  static_assert(!kLateLoads || (!kProducer && kColSplit > 1), "late_loads: head dim 256 (its builds have no producer)");
  static_assert(!kWgSkew || (kProducer && kWarpgroups == 2 && kColSplit == 1 && kDqUnits == 1 && !kFa4Order && !kDqDefer),
                "wg_skew: a producer build of two consumer warpgroups, one dQ unit each, the step's own order");
  static_assert(kBarTurn + 1 < 16, "16 named barriers");
  static_assert(!kProducer || 128 * (kProducerRegs + kWarpgroups * kConsumerRegs) <= 65536,
                "setmaxnreg's targets exceed the SM's registers");
  static_assert(kSmemBytes == SMEM_BYTES, "search space's smem_bytes formula disagrees with the kernel's layout");
  static_assert(kThreads == THREADS, "search space's threads disagrees with (warpgroups + producer) * 128");
  // Sinks need nothing here: P = exp(S - LSE) with the forward's LSE, which holds the sink (the sinks'
  // gradient is the ops' arithmetic: docs/design/backward.md "Sinks"). A soft-cap recomputes the
  // capped score and multiplies dS by its derivative (bwd_prepost.cuh, bwd_prob).
};

}  // namespace att

#endif  // ATTNTUNE_FLASH_BWD_WGMMA_TRAITS_CUH
