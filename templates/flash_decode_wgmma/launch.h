// ---- templates/flash_decode_wgmma/launch.h: flash_decode_wgmma's launches are flash_decode's
// (../flash_decode/launch.h: units, the split count, the grid, the workspaces, K's and V's tensor
// maps and the combine kernel's grid), with what this family asks more of a call:
//   - (flash_decode's too) a latent build (ATT_LATENT: V is K's first head_dim_v columns, here read
//     from K's tiles) serves only calls whose V is K (check_latent);
//   - paged boxes (gcd(page_size, BLOCK_N) rows) hold whole 8-row swizzle atoms: wgmma reads the
//     tiles through 128-byte-swizzle descriptors, so the unswizzled boxes flash_decode takes for
//     odd pages do not serve here;
//   - TMA loads, one CTA a cluster, 64 rows a CTA (the space's constants; load() checks them).
#ifndef ATTNTUNE_FLASH_DECODE_WGMMA_LAUNCH_H
#define ATTNTUNE_FLASH_DECODE_WGMMA_LAUNCH_H

#include "../common/launch_plan.h"
#include "../flash_decode/launch.h"

namespace attntune_plan {

struct FlashDecodeWgmmaLaunch : FlashDecodeLaunch {
  static int load(const Define* d, int n, FlashDecodeWgmmaLaunch* c, Why* why) {
    if (FlashDecodeLaunch::load(d, n, c, why)) return 1;
    if (!c->kv_tma || c->cluster != 1 || c->block_m != 64)
      return refuse(why, "flash_decode_wgmma: kv_load tma, no cluster and BLOCK_M 64 only (the space's constants)");
    return 0;
  }

  // What this family asks of a call beyond flash_decode's shape(); 0, or 1 with the reason.
  int serves(const Call& c, Why* why) const {
    if (c.entry == kEntryKvcache && c.block_table && c.page_size >= 1 && decode_tma_rows(c, block_n) % 8 != 0)
      return refuse(why,
                    "flash_decode_wgmma: pages of %d keys make TMA boxes of %d rows; its wgmma reads whole 8-row "
                    "swizzle atoms: pages of a multiple of 8 keys (FlashMLA's are 64)",
                    c.page_size, decode_tma_rows(c, block_n));
    return 0;
  }

  int plan(const Call& call, const Device& device, Plan* p, Why* why) const {
    if (serves(call, why)) return 1;
    return FlashDecodeLaunch::plan(call, device, p, why);
  }

  int bind(const Call& c, const Plan& plan, const Resources& res, int launch, Args* args, Why* why) const {
    if (serves(c, why)) return 1;
    return FlashDecodeLaunch::bind(c, plan, res, launch, args, why);
  }
};

inline constexpr LaunchFamily kFlashDecodeWgmma =
    make_family<FlashDecodeWgmmaLaunch>("flash_decode_wgmma", kEntryDense | kEntryKvcache, 2, "flash_decode_wgmma",
                                        "flash_decode_wgmma_combine");

}  // namespace attntune_plan

#endif  // ATTNTUNE_FLASH_DECODE_WGMMA_LAUNCH_H
