// SASS of a build's cubin for the tests that check what ptxas made of a template (no GPU): where
// cuobjdump is, and what the K/V loops that issue wgmmas hold.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
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

// R2UR instructions on the wgmma issue path of a cubin's SASS: between a batch's fence
// (WARPGROUP.ARRIVE) and its commit (the HGMMA, or QGMMA for FP8, marked gsb0), where each one is a
// descriptor moved from a vector register before the next wgmma can issue.
inline int r2ur_in_wgmma_batches(const std::string& cuobjdump, const std::string& cubin) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("attntune-sass-{}", ::getpid());
  fs::create_directories(dir);
  const fs::path bin = dir / "k.cubin", txt = dir / "k.sass";
  std::ofstream(bin, std::ios::binary) << cubin;
  const int rc = std::system(fmt::format("'{}' --dump-sass '{}' > '{}' 2>&1", cuobjdump, bin.string(), txt.string()).c_str());
  EXPECT_EQ(rc, 0) << "cuobjdump failed";
  std::ifstream in(txt);
  static const std::regex line(R"(^\s*/\*[0-9a-f]{4,}\*/\s+(.*?);)");
  int batches = 0, r2ur = 0;
  bool in_batch = false;
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (!std::regex_search(l, m, line)) continue;
    const std::string op = m[1].str();
    if (op.find("WARPGROUP.ARRIVE") != std::string::npos) {
      in_batch = true;
      ++batches;
    } else if (in_batch && op.find("R2UR") != std::string::npos) {
      ++r2ur;
    } else if (in_batch && op.find("GMMA") != std::string::npos && op.find("gsb0") != std::string::npos) {
      in_batch = false;
    }
  }
  fs::remove_all(dir);
  EXPECT_GT(batches, 0) << "no wgmma batch in the SASS";
  return r2ur;
}

}  // namespace attntune::testing
