// flash_decode_wgmma (templates/flash_decode_wgmma/): split-KV decode for head dims 512 and 576 on
// sm_90a (multi-head latent attention over its latent cache; 512-dim heads), two wgmma consumer
// warpgroups and a TMA producer warp. Its launch is flash_decode's with a few more checks:
// templates/flash_decode_wgmma/launch.h.
#include <fmt/format.h>

#include "families/family.hpp"
#include "templates/flash_decode_wgmma/launch.h"

namespace attntune {

namespace {

attntune_plan::FlashDecodeWgmmaLaunch decode_wgmma_constants(const Defines& defines) {
  return launch_constants<attntune_plan::FlashDecodeWgmmaLaunch>(defines, "flash_decode_wgmma");
}

std::string describe_decode_wgmma(const Defines& d) {
  const auto c = decode_wgmma_constants(d);
  return fmt::format(
      "grid (splits * ceil(heads_q / heads_kv * seqlen_q / {}), heads_kv, batch), {} threads ({}, a TMA producer "
      "warp), {} bytes of dynamic shared memory; the keys of each (sequence, kv head) split over CTAs by the SM "
      "count, the splits merged by {} (a workspace this file keeps per device and stream){}{}",
      c.block_m, c.threads,
      c.kv_fp8 ? "one consumer warpgroup whose FP8 wgmma read the e4m3 cache as it lies" : "two consumer warpgroups",
      c.smem_bytes, c.last_cta ? "the last CTA of each (sequence, kv head)" : "a second kernel",
      c.latent ? "; a latent cache: V is K's first head_dim_v columns (pass v = k)" : "",
      c.multicast ? "; a split's two row blocks run as a cluster of 2 sharing each K tile's load (TMA multicast): calls "
                    "of an even number of 64-row blocks"
                  : "");
}

nlohmann::ordered_json decode_wgmma_launch_json(const Defines& d) {
  const auto c = decode_wgmma_constants(d);
  return {{"block_m", c.block_m},
          {"block_n", c.block_n},
          {"threads", c.threads},
          {"smem_bytes", c.smem_bytes},
          {"combine", c.last_cta ? "last_cta" : "kernel"},
          {"kv_load", "tma"},
          {"latent", c.latent != 0},
          {"kv_fp8", c.kv_fp8 != 0},
          {"multicast", c.multicast != 0}};
}

}  // namespace

const Family& flash_decode_wgmma_family() {
  static const Family f = [] {
    Family f;
    f.name = "flash_decode_wgmma";
    f.main_file = "templates/flash_decode_wgmma/kernel.cu";
    f.launch_file = "templates/flash_decode_wgmma/launch.h";
    f.plan = &attntune_plan::kFlashDecodeWgmma;
    f.plan_symbol = "attntune_plan::kFlashDecodeWgmma";
    f.kernel_params = {"const att::DecodeParams p, const __grid_constant__ att::DecodeMaps maps",
                       "const att::DecodeParams p, const __grid_constant__ att::DecodeMaps maps"};
    f.tma = true;
    f.describe_launch = describe_decode_wgmma;
    f.launch_json = decode_wgmma_launch_json;
    return f;
  }();
  return f;
}

}  // namespace attntune
