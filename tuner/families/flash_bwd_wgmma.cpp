// flash_bwd_wgmma (templates/flash_bwd_wgmma/): attention backward (dQ, dK, dV) with wgmma for
// Hopper (sm_90a); the `pass=bwd` problems. Its launch: templates/flash_bwd_wgmma/launch.h.
#include "families/backward_family.hpp"
#include "templates/flash_bwd_wgmma/launch.h"

namespace attntune {

const Family& flash_bwd_wgmma_family() {
  static const Family f = backward_family<attntune_plan::FlashBwdWgmmaLaunch>(
      "flash_bwd_wgmma", &attntune_plan::kFlashBwdWgmma, "attntune_plan::kFlashBwdWgmma", /*warpgroups=*/true);
  return f;
}

}  // namespace attntune
