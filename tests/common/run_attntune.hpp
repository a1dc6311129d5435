// Runs the built `attntune` binary (ATTNTUNE_BIN) for end-to-end command tests.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace attntune::testing {

// Where a build carried to another machine has its `attntune` when $ATTNTUNE_BIN is not set:
// `built` (the path these tests were built with) where it exists, else an `attntune` beside the
// test binary `exe` (a carried folder of both) or one folder up (the build tree's tests/), else
// `built`, so that the error names the path the tests were built with. (Session 93: a GPU call that
// carried both binaries but left $ATTNTUNE_BIN unset lost three GPU tests to "cannot start".)
inline std::string carried_attntune(const std::string& built, const std::filesystem::path& exe) {
  std::error_code ec;
  if (std::filesystem::exists(built, ec)) return built;
  for (const std::filesystem::path& dir : {exe.parent_path(), exe.parent_path().parent_path()}) {
    const std::filesystem::path beside = dir / "attntune";
    if (!dir.empty() && std::filesystem::is_regular_file(beside, ec)) return beside.string();
  }
  return built;
}

// The binary under test: $ATTNTUNE_BIN when set (a build carried to another machine), else the
// one these tests were built with, else one carried beside them (carried_attntune).
inline std::string attntune_bin() {
  const char* env = std::getenv("ATTNTUNE_BIN");
  if (env && *env) return env;
  std::error_code ec;
  return carried_attntune(ATTNTUNE_BIN, std::filesystem::read_symlink("/proc/self/exe", ec));
}

// The repository root: $ATTNTUNE_SOURCE_DIR when set (a build carried to another machine), else
// where the tests were built from.
inline std::string source_dir() {
  const char* env = std::getenv("ATTNTUNE_SOURCE_DIR");
  return env && *env ? env : ATTNTUNE_SOURCE_DIR;
}

// How many configs an NVRTC build test compiles per problem (or per what it says):
// $ATTNTUNE_BUILD_SAMPLE when set (0 meaning what each test says: often all), else `fallback`.
inline std::size_t build_sample(std::size_t fallback) {
  const char* env = std::getenv("ATTNTUNE_BUILD_SAMPLE");
  return env ? std::strtoul(env, nullptr, 10) : fallback;
}

// A command's output split at newlines (a final newline ends the last line; no empty line after it).
inline std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

struct Outcome {
  int rc = -1;      // exit code; -1 if it did not exit normally
  std::string out;  // stdout
  std::string err;  // stderr
};

// `attntune ARGS` through the shell (ARGS may carry redirections or env assignments before it).
inline Outcome run_attntune(const std::string& args) {
  static std::atomic<int> counter{0};
  const std::string err_file = (std::filesystem::temp_directory_path() /
                                ("attntune_test_" + std::to_string(::getpid()) + "_" +
                                 std::to_string(counter++) + ".err")).string();
  Outcome r;
  FILE* p = ::popen((attntune_bin() + " " + args + " 2>" + err_file).c_str(), "r");
  if (!p) return r;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream e(err_file);
  std::stringstream ss;
  ss << e.rdbuf();
  r.err = ss.str();
  std::filesystem::remove(err_file);
  return r;
}

}  // namespace attntune::testing
