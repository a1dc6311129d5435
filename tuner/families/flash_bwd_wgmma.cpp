// flash_bwd_wgmma (templates/flash_bwd_wgmma/): attention backward (dQ, dK, dV) with wgmma for
// Hopper (sm_90a); the `pass=bwd` problems. Its launch: templates/flash_bwd_wgmma/launch.h.
#include <fmt/format.h>

#include "families/family.hpp"
#include "templates/flash_bwd_wgmma/launch.h"

namespace attntune {

namespace {

attntune_plan::FlashBwdWgmmaLaunch constants(const Defines& defines) {
  return launch_constants<attntune_plan::FlashBwdWgmmaLaunch>(defines, "flash_bwd_wgmma");
}

}  // namespace

const Family& flash_bwd_wgmma_family() {
  static const Family f = [] {
    Family f;
    f.name = "flash_bwd_wgmma";
    f.main_file = "templates/flash_bwd_wgmma/kernel.cu";
    f.launch_file = "templates/flash_bwd_wgmma/launch.h";
    f.plan = &attntune_plan::kFlashBwdWgmma;
    f.plan_symbol = "attntune_plan::kFlashBwdWgmma";
    f.kernel_params = {"const BwdParams p", "const BwdParams p", "const BwdParams p"};
    f.describe_launch = [](const Defines& d) {
      const auto c = constants(d);
      return fmt::format(
          "three kernels: preprocessing, grid (ceil(seqlen_q / {0}), heads_q, batch); the main loop, grid "
          "(ceil(seqlen_k / {1}), heads_kv, batch), {2} threads ({3} warpgroups), {4} bytes of dynamic shared memory; "
          "dQ's conversion, grid (ceil(seqlen_q / {0}), heads_q, batch); three fp32 workspaces of ceil(seqlen_q / {0}) "
          "* {0} rows a (batch, head) that this file keeps per device and stream",
          c.block_m, c.block_n, c.threads, c.threads / 128, c.smem_bytes);
    };
    f.launch_json = [](const Defines& d) {
      const auto c = constants(d);
      return nlohmann::ordered_json{
          {"block_m", c.block_m}, {"block_n", c.block_n}, {"threads", c.threads}, {"smem_bytes", c.smem_bytes}};
    };
    return f;
  }();
  return f;
}

}  // namespace attntune
