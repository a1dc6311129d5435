// flash_fwd_wgmma (templates/flash_fwd_wgmma/): FA3-class forward attention for Hopper (sm_90a):
// TMA, wgmma, warp specialisation. Its launch: templates/flash_fwd_wgmma/launch.h.
#include <fmt/format.h>

#include "families/family.hpp"
#include "templates/flash_fwd_wgmma/launch.h"

namespace attntune {

namespace {

attntune_plan::FlashFwdWgmmaLaunch fwd_wgmma_constants(const Defines& defines) {
  return launch_constants<attntune_plan::FlashFwdWgmmaLaunch>(defines, "flash_fwd_wgmma");
}

std::string describe_fwd_wgmma(const Defines& d) {
  const auto c = fwd_wgmma_constants(d);
  const std::string tiles =
      c.cluster > 1
          ? fmt::format("(ceil(seqlen_q / {}) rounded up to a multiple of {}, heads_q, batch)", c.block_m, c.cluster)
          : fmt::format("(ceil(seqlen_q / {}), heads_q, batch)", c.block_m);
  std::string s = c.persistent ? fmt::format("persistent grid: min(work tiles {}, SMs) CTAs", tiles)
                               : fmt::format("grid {}", tiles);
  if (c.cluster > 1)
    s += fmt::format(" in {}-CTA clusters sharing each K/V load (TMA multicast), as many as fit on the device at once",
                     c.cluster);
  s += fmt::format(", {} threads, {} bytes of dynamic shared memory", c.threads, c.smem_bytes);
  // A box is one column block of the tiles (64, 32 or 16 columns as the head dim allows: args.h).
  const int cols = att::wgmma_tile::cols(c.head_dim);
  s += fmt::format(", TMA tensor maps with boxes of {} x {} (q) and {} x {} (k, v)", cols, c.block_m, cols, c.block_n);
  if (cols != 64) s += fmt::format(" swizzled over {} bytes", att::wgmma_tile::swizzle_bytes(c.head_dim));
  if (c.split_tail)
    s += "; the last partial round of work tiles shared out by K/V iterations (a workspace this file keeps per "
         "device and stream, allocated on a stream's first such call)";
  if (c.dynamic_tiles)
    s += "; work tiles taken from a counter, longest first (two ints this file keeps per device and stream, "
         "allocated on a stream's first such call)";
  return s;
}

nlohmann::ordered_json fwd_wgmma_launch_json(const Defines& d) {
  const auto c = fwd_wgmma_constants(d);
  nlohmann::ordered_json j = {{"block_m", c.block_m},
                              {"threads", c.threads},
                              {"smem_bytes", c.smem_bytes},
                              {"persistent", c.persistent != 0},
                              {"tma_box_rows", {{"q", c.block_m}, {"kv", c.block_n}}}};
  if (c.cluster > 1) j["cluster"] = c.cluster;
  return j;
}

// The causal split's move: `from` with split_tail on (and the 40 producer registers the space asks
// for it) where the space offers that for the problem and the build's launch plan, on sm_count SMs,
// splits the problem's last round of tiles (launch.h, causal_split: only where that ends the CTAs at
// least 2% sooner; the band it hands to bind). The shipped database's and a neighbour's configs
// cannot carry it: whether it pays is the shape's tile count against the SMs.
std::vector<Config> fwd_wgmma_plan_moves(const SearchSpace& space, const Config& from, const Problem& p,
                                         const std::string& arch, int sm_count) {
  if (!p.causal || sm_count < 2) return {};
  Config v = space.complete(from);
  const auto split = v.find("split_tail");
  if (split == v.end() || !v.count("producer_regs") || std::get<bool>(split->second)) return {};
  v["split_tail"] = true;
  v["producer_regs"] = std::int64_t{40};
  if (space.check(v, p, arch)) return {};  // not offered for this problem (or not from this config)
  // The split this build's launch would make of the problem's call on such a device.
  const LaunchSpec spec{"flash_fwd_wgmma", kernel_defines(space, v, p, arch)};
  attntune_plan::Device device{};
  device.sm_count = sm_count;
  const std::optional<attntune_plan::Plan> plan = plan_call(spec, problem_dense_call(p), device);
  if (!plan || plan->handoff[0] + plan->handoff[2] == 0) return {};  // handoff: {s1, p1, s2, p2}
  return {v};
}

}  // namespace

const Family& flash_fwd_wgmma_family() {
  static const Family f = [] {
    Family f;
    f.name = "flash_fwd_wgmma";
    f.main_file = "templates/flash_fwd_wgmma/kernel.cu";
    f.launch_file = "templates/flash_fwd_wgmma/launch.h";
    f.plan = &attntune_plan::kFlashFwdWgmma;
    f.plan_symbol = "attntune_plan::kFlashFwdWgmma";
    f.build_per_entry = true;
    f.kernel_params = {"const AttnParams p, const __grid_constant__ att::TmaMaps maps", "const AttnParams p, int* order",
                       "const AttnParams p, unsigned char* ws"};
    f.tma = true;
    f.describe_launch = describe_fwd_wgmma;
    f.launch_json = fwd_wgmma_launch_json;
    // k_perm: K's rows load in fours, and the launch refuses a seqlen_k that is not a multiple of 4
    // (templates/flash_fwd_wgmma/launch.h; docs/design/flash_fwd_wgmma.md).
    f.narrowed_calls = [](const Config& c) -> std::string {
      const auto it = c.find("k_perm");
      return it != c.end() && std::get<bool>(it->second) ? "seqlen_k not a multiple of 4 (k_perm)" : "";
    };
    f.plan_moves = fwd_wgmma_plan_moves;
    return f;
  }();
  return f;
}

}  // namespace attntune
