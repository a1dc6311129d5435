// flash_bwd_wgmma (templates/flash_bwd_wgmma/): attention backward (dQ, dK, dV) with wgmma for
// Hopper (sm_90a); the `pass=bwd` problems. Its launch: templates/flash_bwd_wgmma/launch.h.
#include "families/backward_family.hpp"
#include "templates/flash_bwd_wgmma/launch.h"

namespace attntune {

const Family& flash_bwd_wgmma_family() {
  static const Family f = [] {
    Family f = backward_family<attntune_plan::FlashBwdWgmmaLaunch>(
        "flash_bwd_wgmma", &attntune_plan::kFlashBwdWgmma, "attntune_plan::kFlashBwdWgmma", /*warpgroups=*/true);
    // The main kernel's signature is the build's: tma_loads builds take Q's and dO's tensor maps as a
    // second argument (kernel.cu's ATT_BWD_MAPS_PARAM, which the export's declaration expands in the
    // build's own source), and the export then needs CUDA 12.
    f.kernel_params[1] = "const BwdParams p ATT_BWD_MAPS_PARAM";
    f.tma = true;
    return f;
  }();
  return f;
}

}  // namespace attntune
