// flash_bwd_mma (templates/flash_bwd_mma/): FA2-class attention backward (dQ, dK, dV) with
// mma.sync, sm_80..sm_90; the `pass=bwd` problems. Its launch: templates/flash_bwd_mma/launch.h.
#include "families/backward_family.hpp"
#include "templates/flash_bwd_mma/launch.h"

namespace attntune {

const Family& flash_bwd_mma_family() {
  static const Family f = backward_family<attntune_plan::FlashBwdMmaLaunch>(
      "flash_bwd_mma", &attntune_plan::kFlashBwdMma, "attntune_plan::kFlashBwdMma", /*warpgroups=*/false);
  return f;
}

}  // namespace attntune
