// The backward families' Family entries (flash_bwd_mma, flash_bwd_wgmma), once: both take BwdParams in
// their three kernels and share templates/common/bwd_launch.h's plan, so their launch description
// and JSON read the same constants.
#pragma once

#include <fmt/format.h>

#include "families/family.hpp"

namespace attntune {

// Launch: the family's launch struct (a BwdLaunch); warpgroups: its description counts them.
template <class Launch>
Family backward_family(const char* name, const attntune_plan::LaunchFamily* plan, const char* plan_symbol,
                       bool warpgroups) {
  Family f;
  f.name = name;
  f.main_file = fmt::format("templates/{}/kernel.cu", name);
  f.launch_file = fmt::format("templates/{}/launch.h", name);
  f.plan = plan;
  f.plan_symbol = plan_symbol;
  f.kernel_params = {"const BwdParams p", "const BwdParams p", "const BwdParams p"};
  const std::string family = name;
  f.describe_launch = [family, warpgroups](const Defines& d) {
    const auto c = launch_constants<Launch>(d, family.c_str());
    const std::string threads =
        warpgroups ? fmt::format("{} threads ({} warpgroups)", c.threads, c.threads / 128) : fmt::format("{} threads", c.threads);
    return fmt::format(
        "three kernels: preprocessing, grid (ceil(seqlen_q / {0}), heads_q, batch); the main loop, grid "
        "(ceil(seqlen_k / {1}), heads_kv, batch), {2}, {3} bytes of dynamic shared memory; dQ's conversion, "
        "grid (ceil(seqlen_q / {0}), heads_q, batch); three fp32 workspaces of ceil(seqlen_q / {0}) * {0} rows a "
        "(batch, head) that this file keeps per device and stream (a deterministic call also an int32 counter a "
        "query block of {0} rows: the order in which the key blocks add their share of its dQ)",
        c.block_m, c.block_n, threads, c.smem_bytes);
  };
  f.launch_json = [family](const Defines& d) {
    const auto c = launch_constants<Launch>(d, family.c_str());
    return nlohmann::ordered_json{
        {"block_m", c.block_m}, {"block_n", c.block_n}, {"threads", c.threads}, {"smem_bytes", c.smem_bytes}};
  };
  return f;
}

}  // namespace attntune
