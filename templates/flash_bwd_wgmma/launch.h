// ---- templates/flash_bwd_wgmma/launch.h: how a call of attntune_attention_backward becomes
// flash_bwd_wgmma's launches (the plan itself is both backward families': templates/common/bwd_launch.h;
// templates/common/launch_plan.h tells who runs it). Three kernels: flash_bwd_preprocess,
// flash_bwd_wgmma (grid (ceil(seqlen_k / BLOCK_N), heads_kv, batch), BLOCK_N / 64 warpgroups) and
// flash_bwd_convert (reading a bulk build's fragment-ordered accumulator through Traits::dq_offset).
#ifndef ATTNTUNE_FLASH_BWD_WGMMA_LAUNCH_H
#define ATTNTUNE_FLASH_BWD_WGMMA_LAUNCH_H

#include "../common/bwd_launch.h"

namespace attntune_plan {

struct FlashBwdWgmmaLaunch : BwdLaunch<FlashBwdWgmmaLaunch> {
  static constexpr const char* kName = "flash_bwd_wgmma";

  static int load(const Define* d, int n, FlashBwdWgmmaLaunch* c, Why* why) {
    return load_common(d, n, c, why) || define_int(d, n, "BLOCK_N", &c->block_n, why);
  }
};

inline constexpr LaunchFamily kFlashBwdWgmma =
    make_family<FlashBwdWgmmaLaunch>("flash_bwd_wgmma", kEntryBackward | kEntryBackwardVarlen, 3, "flash_bwd_preprocess", "flash_bwd_wgmma",
                                     "flash_bwd_convert");

}  // namespace attntune_plan

#endif  // ATTNTUNE_FLASH_BWD_WGMMA_LAUNCH_H
