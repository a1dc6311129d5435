// flash_bwd_mma (templates/flash_bwd_mma/): FA2-class attention backward (dQ, dK, dV) with
// mma.sync, sm_80..sm_90; the `pass=bwd` problems. Its launch: templates/flash_bwd_mma/launch.h.
#include <fmt/format.h>

#include "families/family.hpp"
#include "templates/flash_bwd_mma/launch.h"

namespace attntune {

namespace {

attntune_plan::FlashBwdMmaLaunch constants(const Defines& defines) {
  return launch_constants<attntune_plan::FlashBwdMmaLaunch>(defines, "flash_bwd_mma");
}

}  // namespace

const Family& flash_bwd_mma_family() {
  static const Family f = [] {
    Family f;
    f.name = "flash_bwd_mma";
    f.main_file = "templates/flash_bwd_mma/kernel.cu";
    f.launch_file = "templates/flash_bwd_mma/launch.h";
    f.plan = &attntune_plan::kFlashBwdMma;
    f.plan_symbol = "attntune_plan::kFlashBwdMma";
    f.kernel_params = {"const BwdParams p", "const BwdParams p", "const BwdParams p"};
    f.describe_launch = [](const Defines& d) {
      const auto c = constants(d);
      return fmt::format(
          "three kernels: preprocessing, grid (ceil(seqlen_q / {0}), heads_q, batch); the main loop, grid "
          "(ceil(seqlen_k / {1}), heads_kv, batch), {2} threads, {3} bytes of dynamic shared memory; dQ's conversion, "
          "grid (ceil(seqlen_q / {0}), heads_q, batch); three fp32 workspaces of ceil(seqlen_q / {0}) * {0} rows a "
          "(batch, head) that this file keeps per device and stream (a deterministic call also an int32 counter a "
          "query block of {0} rows: the order in which the key blocks add their share of its dQ)",
          c.block_m, c.block_n, c.threads, c.smem_bytes);
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
