// SASS of a build's cubin for the tests that check what ptxas made of a template (no GPU): where
// cuobjdump is, and what the K/V loops that issue wgmmas hold.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "tests/common/run_attntune.hpp"  // testing::source_dir()

namespace attntune::testing {

// cuobjdump: $ATTNTUNE_CUOBJDUMP, on PATH, in $CUDA_HOME/bin, or triton's copy in the tree's .venv
// (tools/test.sh installs torch there), as tools/rehash_db.py looks for it. "" when none.
inline std::string find_cuobjdump() {
  namespace fs = std::filesystem;
  if (const char* e = std::getenv("ATTNTUNE_CUOBJDUMP"); e && *e) return e;
  std::vector<fs::path> cands;
  if (const char* path = std::getenv("PATH")) {
    std::string all = path;
    for (std::size_t at = 0; at <= all.size();) {
      const std::size_t end = std::min(all.find(':', at), all.size());
      if (end > at) cands.push_back(fs::path(all.substr(at, end - at)) / "cuobjdump");
      at = end + 1;
    }
  }
  cands.push_back(fs::path(std::getenv("CUDA_HOME") ? std::getenv("CUDA_HOME") : "/usr/local/cuda") / "bin" / "cuobjdump");
  std::error_code ec;
  const fs::path lib = fs::path(attntune::testing::source_dir()) / ".venv" / "lib";
  if (fs::is_directory(lib, ec))
    for (const auto& py : fs::directory_iterator(lib, ec))
      cands.push_back(py.path() / "site-packages" / "triton" / "backends" / "nvidia" / "bin" / "cuobjdump");
  for (const auto& c : cands)
    if (fs::exists(c, ec) && ::access(c.c_str(), X_OK) == 0) return c.string();
  return "";
}

// R2UR instructions in each innermost loop of a cubin's SASS that issues wgmmas (HGMMA, or QGMMA for
// FP8): a loop is a backward branch's span, innermost when it holds no other.
inline std::vector<int> r2ur_in_wgmma_loops(const std::string& cuobjdump, const std::string& cubin) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("attntune-sass-{}", ::getpid());
  fs::create_directories(dir);
  const fs::path bin = dir / "k.cubin", txt = dir / "k.sass";
  std::ofstream(bin, std::ios::binary) << cubin;
  const int rc = std::system(fmt::format("'{}' --dump-sass '{}' > '{}' 2>&1", cuobjdump, bin.string(), txt.string()).c_str());
  EXPECT_EQ(rc, 0) << "cuobjdump failed";
  std::ifstream in(txt);
  std::vector<std::pair<long, std::string>> ins;
  static const std::regex line(R"(^\s*/\*([0-9a-f]{4,})\*/\s+(.*?);)");
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (std::regex_search(l, m, line)) ins.emplace_back(std::stol(m[1].str(), nullptr, 16), m[2].str());
  }
  fs::remove_all(dir);
  static const std::regex bra(R"(BRA\S*\s+(?:.*?)0x([0-9a-f]+))");
  std::vector<std::pair<std::size_t, std::size_t>> loops;
  for (std::size_t i = 0; i < ins.size(); ++i) {
    std::smatch m;
    if (!std::regex_search(ins[i].second, m, bra)) continue;
    const long target = std::stol(m[1].str(), nullptr, 16);
    if (target >= ins[i].first) continue;
    for (std::size_t j = 0; j < i; ++j)
      if (ins[j].first == target) loops.emplace_back(j, i);
  }
  std::vector<int> counts;
  for (const auto& [b, e] : loops) {
    const bool inner = std::none_of(loops.begin(), loops.end(), [&, b = b, e = e](const auto& o) {
      return o != std::make_pair(b, e) && o.first >= b && o.second <= e;
    });
    int wgmma = 0, r2ur = 0;
    for (std::size_t k = b; k <= e; ++k) {
      wgmma += ins[k].second.find("GMMA") != std::string::npos;
      r2ur += ins[k].second.rfind("R2UR", 0) == 0;
    }
    if (inner && wgmma > 0) counts.push_back(r2ur);
  }
  return counts;
}

}  // namespace attntune::testing
