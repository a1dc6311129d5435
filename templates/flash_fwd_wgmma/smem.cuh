// ---- templates/flash_fwd_wgmma/smem.cuh: the kernel's shared memory by name (the layout's offsets
// are Traits', traits.cuh) and the K/V ring's stages.
#ifndef ATTNTUNE_FLASH_FWD_WGMMA_SMEM_CUH
#define ATTNTUNE_FLASH_FWD_WGMMA_SMEM_CUH

#include "../common/ptx_sm90.cuh"
#include "traits.cuh"

namespace att {

// Shared-memory addresses (shared window): the Q tile, the K and V rings (1024-byte aligned
// tiles), the barrier area.
struct Smem {
  u32 q, k, v, bars;
  u32 raw_k, raw_v;  // FP8 caches (Traits::kKvFp8): the staging buffers of K's and V's bytes
  __device__ u32 q_full() const { return bars + T::kBarQFull; }
  __device__ u32 k_full(int st) const { return bars + T::kBarKFull + 8 * st; }
  __device__ u32 v_full(int st) const { return bars + T::kBarVFull + 8 * st; }
  __device__ u32 k_empty(int st) const { return bars + T::kBarKEmpty + 8 * st; }
  __device__ u32 v_empty(int st) const { return bars + T::kBarVEmpty + 8 * st; }
  __device__ u32 q_empty() const { return bars + T::kBarQEmpty; }
  // Split tail or multicast (split_pieces): this CTA's piece k, the plain tiles' end, the query blocks.
  __device__ u32 piece(int k) const { return bars + T::kWordPieces + T::kPieceBytes * k; }
  __device__ u32 plain_end() const { return bars + T::kWordPlainEnd; }
  __device__ u32 m_blocks() const { return bars + T::kWordMBlocks; }
  // Dynamic tiles (Traits::kDynamicTiles): the producer's next work tile, written before that
  // tile's Q arrives on q_full (a plain arrive when it loads no Q).
  __device__ u32 sched() const { return bars + T::kWordSched; }
  // FP8 caches: the staging buffers' barriers (K's: v false; a use per K/V iteration, the phase its
  // parity) and the end word.
  __device__ u32 raw_full(bool v) const { return bars + (v ? T::kBarRawVFull : T::kBarRawKFull); }
  __device__ u32 raw_empty(bool v) const { return bars + (v ? T::kBarRawVEmpty : T::kBarRawKEmpty); }
  __device__ u32 raw_end() const { return bars + T::kWordRawEnd; }

  // The layout from the dynamic shared memory's start (aligned up to 1024 bytes).
  static __device__ Smem at(const unsigned char* smem_raw) {
    Smem sm;
    sm.q = (smem_addr(smem_raw) + 1023) & ~1023u;
    sm.k = sm.q + T::kOffK;
    sm.v = sm.q + T::kOffV;
    sm.bars = sm.q + T::kOffBars;
    sm.raw_k = sm.q + T::kOffRawK;
    sm.raw_v = sm.q + T::kOffRawV;
    return sm;
  }
};

// Ring stage and phase of K/V iteration `it`, counted over all the CTA's work tiles.
struct Slot {
  int stage;
  u32 phase;
  __device__ explicit Slot(int it) : stage(it % T::kStages), phase((it / T::kStages) & 1) {}
};

}  // namespace att

#endif  // ATTNTUNE_FLASH_FWD_WGMMA_SMEM_CUH
