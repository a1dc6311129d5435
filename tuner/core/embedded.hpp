// Files compiled into the binary (cmake/embed_files.cmake): kernel templates and SQL schema,
// keyed by their path relative to the repository root ("templates/flash_fwd_mma/kernel.cuh").
#pragma once
#include <map>
#include <string>
#include <string_view>

namespace attntune {
const std::map<std::string, std::string_view>& embedded_files();
// The file's contents; throws std::logic_error if it was not embedded (a build defect).
std::string_view embedded_file(const std::string& path);
}  // namespace attntune
