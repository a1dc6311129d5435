// Helpers for the store tests: scratch directories, whole-file snapshots, sample records.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>

#include "db/store.hpp"

namespace attntune::test {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "attntune-db-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  // ATTNTUNE_KEEP_TEMP=1 keeps the folder (to look at what a failing test wrote).
  ~TempDir() {
    if (const char* keep = std::getenv("ATTNTUNE_KEEP_TEMP"); keep && *keep && *keep != '0') return;
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
}

// A big-endian 32-bit field of the SQLite header (60: user_version, 68: application_id).
inline std::uint32_t header_u32(const std::string& path, int offset) {
  const std::string h = read_bytes(path);
  if (h.size() < 100) return 0;
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<std::uint8_t>(h[offset + i]);
  return v;
}

// Every file in a directory and its contents: "nothing changed" means this map is equal.
inline std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) files[e.path().filename().string()] = read_bytes(e.path().string());
  return files;
}

inline Problem problem(const std::string& spec = "b=4,h=16,s=4096,d=128,dtype=bf16,causal=1") {
  return Problem::parse(spec);
}

inline DeviceInfo h100() { return {"NVIDIA H100 80GB HBM3", "sm_90", "GPU-1111", 132, "550.54"}; }

inline CampaignSpec spec(const std::string& name, const Problem& p = problem()) {
  CampaignSpec s;
  s.name = name;
  s.problem = p;
  s.space_path = "search_spaces/flash_fwd_mma.yaml";
  s.space_hash = "0123456789abcdef0123456789abcdef";
  s.family = "flash_fwd_mma";
  s.strategy = "evo";
  s.seed = 7;
  s.budget_evals = 500;
  s.budget_seconds = 3600;
  return s;
}

inline Config config(std::int64_t block_m, std::int64_t block_n, bool swizzle = true) {
  return {{"block_m", block_m}, {"block_n", block_n}, {"swizzle", swizzle}, {"pipeline", std::string("cp_async")}};
}

inline EvalRecord ok_eval(double median_us, double tflops = 100, double err = 1e-3) {
  EvalRecord e;
  e.status = "ok";
  e.median_us = median_us;
  e.min_us = median_us * 0.98;
  e.max_us = median_us * 1.05;
  e.stdev_us = median_us * 0.01;
  e.tflops = tflops;
  e.max_abs_err = err;
  e.err_bound = 1e-2;
  e.count = 50;
  return e;
}

inline EvalRecord failed_eval(const std::string& status, const std::string& error) {
  EvalRecord e;
  e.status = status;
  e.error = error;
  return e;
}

// Runs a shell command; returns its exit status, stdout and stderr.
struct CommandResult {
  int status = -1;
  std::string out, err;
};

inline CommandResult run_shell(const std::string& command, const fs::path& scratch) {
  const std::string out = (scratch / "stdout.txt").string(), err = (scratch / "stderr.txt").string();
  CommandResult r;
  const int rc = std::system((command + " >'" + out + "' 2>'" + err + "'").c_str());
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = read_bytes(out);
  r.err = read_bytes(err);
  fs::remove(out);
  fs::remove(err);
  return r;
}

}  // namespace attntune::test
