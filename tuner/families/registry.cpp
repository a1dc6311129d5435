// The built-in kernel families: one line each (ARCHITECTURE.md, "Adding a family").
#include "families/family.hpp"

namespace attntune {

const Family& flash_fwd_mma_family();
const Family& flash_fwd_wgmma_family();
const Family& flash_decode_family();
const Family& flash_decode_wgmma_family();
const Family& flash_bwd_mma_family();
const Family& flash_bwd_wgmma_family();

const std::vector<const Family*>& builtin_families() {
  static const std::vector<const Family*> families = {
      &flash_fwd_mma_family(),
      &flash_fwd_wgmma_family(),
      &flash_decode_family(),
      &flash_decode_wgmma_family(),
      &flash_bwd_mma_family(),
      &flash_bwd_wgmma_family(),
  };
  return families;
}

}  // namespace attntune
