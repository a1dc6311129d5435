// Content hashes (cache keys for rendered sources, search-space files): XXH3-128 from Debian's
// libxxhash-dev, used header-only so the static GPU-machine build needs no extra library.
#pragma once
#include <string>
#include <string_view>

namespace attntune {
std::string content_hash(std::string_view data);  // 32 lowercase hex digits
}  // namespace attntune
