#include "core/hash.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <fmt/format.h>

namespace attntune {
std::string content_hash(std::string_view data) {
  XXH128_hash_t h = XXH3_128bits(data.data(), data.size());
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}
}  // namespace attntune
