// ---- templates/flash_decode_wgmma/launch.h: flash_decode_wgmma's launches are flash_decode's
// (../flash_decode/launch.h: units, the split count, the grid, the workspaces, K's and V's tensor
// maps and the combine kernel's grid), with what this family asks more of a call:
//   - (flash_decode's too) a latent build (ATT_LATENT: V is K's first head_dim_v columns, here read
//     from K's tiles) serves only calls whose V is K (check_latent);
//   - paged boxes (gcd(page_size, BLOCK_N) rows) hold whole 8-row swizzle atoms: wgmma reads the
//     tiles through 128-byte-swizzle descriptors, so the unswizzled boxes flash_decode takes for
//     odd pages do not serve here;
//   - TMA loads, 64 rows a CTA (the space's constants; load() checks them);
//   - multicast builds (MULTICAST) launch clusters of 2 along x, the two row blocks of a split
//     (adjacent in flash_decode's row-block-minor grid), so they serve calls of an even row-block
//     count only.
#ifndef ATTNTUNE_FLASH_DECODE_WGMMA_LAUNCH_H
#define ATTNTUNE_FLASH_DECODE_WGMMA_LAUNCH_H

#include "../common/launch_plan.h"
#include "../flash_decode/launch.h"

namespace attntune_plan {

struct FlashDecodeWgmmaLaunch : FlashDecodeLaunch {
  int multicast;  // MULTICAST: a unit's two row blocks in a cluster of 2 (TMA multicast of K/V)

  static int load(const Define* d, int n, FlashDecodeWgmmaLaunch* c, Why* why) {
    if (FlashDecodeLaunch::load(d, n, c, why)) return 1;
    c->multicast = static_cast<int>(define_or(d, n, "MULTICAST", 0));
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
    if (multicast) {
      const long long rows = c.heads_kv > 0 ? static_cast<long long>(c.heads_q / c.heads_kv) * c.seqlen_q : 0;
      if (ceil_div(rows, block_m) % 2 != 0)
        return refuse(why,
                      "flash_decode_wgmma (multicast) pairs a unit's row blocks in clusters of 2; the call's %lld "
                      "packed rows (heads_q / heads_kv * seqlen_q) make an odd number of %d-row blocks",
                      rows, block_m);
    }
    return 0;
  }

  int plan(const Call& call, const Device& device, Plan* p, Why* why) const {
    if (serves(call, why)) return 1;
    if (FlashDecodeLaunch::plan(call, device, p, why)) return 1;
    if (multicast && p->launches > 0) p->launch[0].cluster = 2;  // grid.x = splits * an even row-block count
    return 0;
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
