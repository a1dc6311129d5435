#include "core/embedded.hpp"

#include <stdexcept>

namespace attntune {
std::string_view embedded_file(const std::string& path) {
  const auto& files = embedded_files();
  auto it = files.find(path);
  if (it == files.end()) throw std::logic_error("file not embedded in the binary: " + path);
  return it->second;
}
}  // namespace attntune
