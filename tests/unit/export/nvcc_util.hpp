// What the export tests share (CPU tests here, tests/gpu/test_export_wgmma.cpp): finding nvcc,
// running a shell command for its status and output, quoting, the build lines of an exported library
// and of a host program linked against it, reading an exported file's info JSON.
#pragma once
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace attntune::test {

inline std::string shq(const std::string& s) { return "'" + s + "'"; }

// $CUDACXX, $CUDA_HOME/bin/nvcc, nvcc on PATH, /usr/local/cuda/bin/nvcc; "" if none.
inline std::string find_nvcc() {
  namespace fs = std::filesystem;
  for (const char* var : {"CUDACXX", "CUDA_HOME", "CUDA_PATH"}) {
    const char* v = std::getenv(var);
    if (!v || !*v) continue;
    const fs::path p = std::string(var) == "CUDACXX" ? fs::path(v) : fs::path(v) / "bin" / "nvcc";
    if (fs::exists(p)) return p.string();
  }
  if (const char* path = std::getenv("PATH")) {
    std::string dirs = path;
    for (std::size_t pos = 0; pos <= dirs.size();) {
      const std::size_t end = std::min(dirs.find(':', pos), dirs.size());
      const fs::path p = fs::path(dirs.substr(pos, end - pos)) / "nvcc";
      if (end > pos && fs::exists(p)) return p.string();
      pos = end + 1;
    }
  }
  return fs::exists("/usr/local/cuda/bin/nvcc") ? "/usr/local/cuda/bin/nvcc" : "";
}

struct Shell {
  int status = -1;
  std::string output;  // stdout and stderr
};

inline Shell sh(const std::string& command) {
  Shell r;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// docs/CONTRACT.md's build line for an exported file, with -arch=ARCH ("sm_90a" for flash_fwd_wgmma).
inline std::string nvcc_shared_command(const std::string& nvcc, const std::string& arch, const std::string& cu,
                                       const std::string& lib) {
  return shq(nvcc) + " -std=c++17 -arch=" + arch + " -Xcompiler -fPIC -shared " + shq(cu) + " -o " + shq(lib);
}

// g++'s line for a host program `src` linked against lib<lib>.so in `dir` (found there at run time
// too, by rpath) into `exe`.
inline std::string host_link_command(const std::string& src, const std::string& dir, const std::string& lib,
                                     const std::string& exe) {
  return "g++ -std=c++17 " + shq(src) + " -L" + shq(dir) + " -l" + lib + " -Wl,-rpath," + shq(dir) + " -o " + shq(exe);
}

// The JSON of attntune_kernel_info(), read back from the C string literal of an exported file.
inline nlohmann::json info_from_source(const std::string& cu) {
  const std::size_t start = cu.find("static const char kInfo[] =");
  EXPECT_NE(start, std::string::npos);
  const std::size_t end = cu.find(";\n", start);
  std::string json;
  bool in = false;
  for (std::size_t i = cu.find('=', start) + 1; i < end; ++i) {
    const char c = cu[i];
    if (!in) {
      if (c == '"') in = true;
      continue;
    }
    if (c == '\\') {
      json += cu[++i];  // only \\ \" \? are emitted
    } else if (c == '"') {
      in = false;
    } else {
      json += c;
    }
  }
  return nlohmann::json::parse(json);
}

}  // namespace attntune::test
