// ---- templates/flash_bwd_mma/launch.h: how a call of attntune_attention_backward becomes
// flash_bwd_mma's launches (the plan itself is both backward families': templates/common/bwd_launch.h;
// templates/common/launch_plan.h tells who runs it). Three kernels, each with BwdParams as its one argument:
//   0 flash_bwd_preprocess  grid (seqlen_q_rounded / BLOCK_M, heads_q, batch), THREADS threads;
//   1 flash_bwd_mma         grid (ceil(seqlen_k / block_n), heads_kv, batch), THREADS threads,
//                           SMEM_BYTES of dynamic shared memory (block_n = WARPS * 16 * KEY_TILES);
//   2 flash_bwd_convert     grid (ceil(seqlen_q / BLOCK_M), heads_q, batch), THREADS threads.
// Workspaces (none zeroed: the preprocessing kernel writes them every call): 0 dq_accum (fp32,
// [batch, heads_q, seqlen_q_rounded, head_dim]), 1 dpsum and 2 lse_log2 (fp32, [batch, heads_q,
// seqlen_q_rounded]); a deterministic call (Call::deterministic) also 3 dq_semaphore (int32,
// [batch, heads_q, seqlen_q_rounded / BLOCK_M]: the turns of the CTAs that add into each query
// block's dQ, kernel.cu), after those every call has, so that an index holds the same thing in
// every plan. seqlen_q_rounded is seqlen_q rounded up to BLOCK_M. A call without queries launches
// the main kernel only (dK = dV = 0), one without keys the other two (dQ = 0).
#ifndef ATTNTUNE_FLASH_BWD_MMA_LAUNCH_H
#define ATTNTUNE_FLASH_BWD_MMA_LAUNCH_H

#include "../common/bwd_launch.h"

namespace attntune_plan {

struct FlashBwdMmaLaunch : BwdLaunch<FlashBwdMmaLaunch> {
  static constexpr const char* kName = "flash_bwd_mma";

  static int load(const Define* d, int n, FlashBwdMmaLaunch* c, Why* why) {
    int warps = 0, key_tiles = 0;
    if (load_common(d, n, c, why) || define_int(d, n, "WARPS", &warps, why) ||
        define_int(d, n, "KEY_TILES", &key_tiles, why))
      return 1;
    c->block_n = warps * 16 * key_tiles;
    return 0;
  }
};

inline constexpr LaunchFamily kFlashBwdMma =
    make_family<FlashBwdMmaLaunch>("flash_bwd_mma", kEntryBackward | kEntryBackwardVarlen, 3, "flash_bwd_preprocess", "flash_bwd_mma",
                                   "flash_bwd_convert");

}  // namespace attntune_plan

#endif  // ATTNTUNE_FLASH_BWD_MMA_LAUNCH_H
