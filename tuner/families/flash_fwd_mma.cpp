// flash_fwd_mma (templates/flash_fwd_mma/): FA2-class forward attention with mma.sync, sm_80..sm_90.
// Its launch: templates/flash_fwd_mma/launch.h.
#include <fmt/format.h>

#include "families/family.hpp"
#include "templates/flash_fwd_mma/launch.h"

namespace attntune {

namespace {

attntune_plan::FlashFwdMmaLaunch fwd_mma_constants(const Defines& defines) {
  return launch_constants<attntune_plan::FlashFwdMmaLaunch>(defines, "flash_fwd_mma");
}

}  // namespace

const Family& flash_fwd_mma_family() {
  static const Family f = [] {
    Family f;
    f.name = "flash_fwd_mma";
    f.main_file = "templates/flash_fwd_mma/kernel.cu";
    f.launch_file = "templates/flash_fwd_mma/launch.h";
    f.plan = &attntune_plan::kFlashFwdMma;
    f.plan_symbol = "attntune_plan::kFlashFwdMma";
    f.build_per_entry = true;
    f.kernel_params = {"const AttnParams p"};
    f.describe_launch = [](const Defines& d) {
      const auto c = fwd_mma_constants(d);
      return fmt::format("grid (ceil(seqlen_q / {}), heads_q, batch), {} threads, {} bytes of dynamic shared memory",
                         c.block_m, c.threads, c.smem_bytes);
    };
    f.launch_json = [](const Defines& d) {
      const auto c = fwd_mma_constants(d);
      return nlohmann::ordered_json{{"block_m", c.block_m}, {"threads", c.threads}, {"smem_bytes", c.smem_bytes}};
    };
    return f;
  }();
  return f;
}

}  // namespace attntune
