// flash_decode (templates/flash_decode/): split-KV decode attention, seqlen_q 1..16, GQA packed,
// contiguous or paged K/V, mma.sync (sm_80..sm_90). Its launch: templates/flash_decode/launch.h.
#include <fmt/format.h>

#include "families/family.hpp"
#include "templates/flash_decode/launch.h"

namespace attntune {

namespace {

attntune_plan::FlashDecodeLaunch decode_constants(const Defines& defines) {
  return launch_constants<attntune_plan::FlashDecodeLaunch>(defines, "flash_decode");
}

// The split merge, as the space's combine names it.
std::string decode_combine_name(const attntune_plan::FlashDecodeLaunch& c) {
  return c.cluster > 1 ? fmt::format("cluster{}", c.cluster) : c.last_cta ? "last_cta" : "kernel";
}

std::string describe_decode(const Defines& d) {
  const auto c = decode_constants(d);
  if (c.cluster > 1)
    return fmt::format(
        "grid ({} * ceil(heads_q / heads_kv * seqlen_q / {}), heads_kv, batch) in clusters of {}, {} threads, {} bytes "
        "of dynamic shared memory; the keys of each (sequence, kv head) split over the {} CTAs of one cluster, merged "
        "through distributed shared memory",
        c.cluster, c.block_m, c.cluster, c.threads, c.smem_bytes, c.cluster);
  return fmt::format(
      "grid (splits * ceil(heads_q / heads_kv * seqlen_q / {}), heads_kv, batch), {} threads, {} bytes of dynamic "
      "shared memory; the keys of each (sequence, kv head) split over CTAs by the SM count ({} per SM), the splits "
      "merged by {} (a workspace this file keeps per device and stream, allocated on a stream's first such call)",
      c.block_m, c.threads, c.smem_bytes, c.ctas_per_sm,
      c.last_cta ? "the last CTA of each (sequence, kv head)" : "a second kernel");
}

nlohmann::ordered_json decode_launch_json(const Defines& d) {
  const auto c = decode_constants(d);
  return {{"block_m", c.block_m},         {"block_n", c.block_n},
          {"threads", c.threads},         {"smem_bytes", c.smem_bytes},
          {"ctas_per_sm", c.ctas_per_sm}, {"combine", decode_combine_name(c)},
          {"kv_load", c.kv_tma ? "tma" : "cp_async"}};
}

}  // namespace

const Family& flash_decode_family() {
  static const Family f = [] {
    Family f;
    f.name = "flash_decode";
    f.main_file = "templates/flash_decode/kernel.cu";
    f.launch_file = "templates/flash_decode/launch.h";
    f.plan = &attntune_plan::kFlashDecode;
    f.plan_symbol = "attntune_plan::kFlashDecode";
    f.kernel_params = {"const att::DecodeParams p, const __grid_constant__ att::DecodeMaps maps",
                       "const att::DecodeParams p, const __grid_constant__ att::DecodeMaps maps"};
    f.tma = true;  // kv_load: tma builds take K/V tensor maps (the export needs CUDA 12)
    f.describe_launch = describe_decode;
    f.launch_json = decode_launch_json;
    return f;
  }();
  return f;
}

}  // namespace attntune
