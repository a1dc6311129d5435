// SASS of a build's cubin for the tests that check what ptxas made of a template (no GPU): where
// cuobjdump is, its instructions, what the K/V loops that issue wgmmas hold, and a tunable's builds
// with and without it.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "eval/build_pool.hpp"
#include "families/family.hpp"
#include "tests/common/run_attntune.hpp"  // testing::source_dir(), attntune_bin()

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

// The instructions of a cubin's SASS (cuobjdump --dump-sass), each as its text without the address
// and the encoding: "R2UR UR4, R2", "@!P0 BRA 0x1c0".
inline std::vector<std::string> sass_instructions(const std::string& cuobjdump, const std::string& cubin) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("attntune-sass-{}", ::getpid());
  fs::create_directories(dir);
  const fs::path bin = dir / "k.cubin", txt = dir / "k.sass";
  std::ofstream(bin, std::ios::binary) << cubin;
  const int rc = std::system(fmt::format("'{}' --dump-sass '{}' > '{}' 2>&1", cuobjdump, bin.string(), txt.string()).c_str());
  EXPECT_EQ(rc, 0) << "cuobjdump failed";
  std::ifstream in(txt);
  static const std::regex line(R"(^\s*/\*[0-9a-f]{4,}\*/\s+(.*?);)");
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (std::regex_search(l, m, line)) out.push_back(m[1].str());
  }
  fs::remove_all(dir);
  return out;
}

// R2UR instructions on the wgmma issue path of a cubin's SASS: between a batch's fence
// (WARPGROUP.ARRIVE) and its commit (the HGMMA, or QGMMA for FP8, marked gsb0), where each one is a
// descriptor moved from a vector register before the next wgmma can issue.
inline int r2ur_in_wgmma_batches(const std::string& cuobjdump, const std::string& cubin) {
  int batches = 0, r2ur = 0;
  bool in_batch = false;
  for (const std::string& op : sass_instructions(cuobjdump, cubin)) {
    if (op.find("WARPGROUP.ARRIVE") != std::string::npos) {
      in_batch = true;
      ++batches;
    } else if (in_batch && op.find("R2UR") != std::string::npos) {
      ++r2ur;
    } else if (in_batch && op.find("GMMA") != std::string::npos && op.find("gsb0") != std::string::npos) {
      in_batch = false;
    }
  }
  EXPECT_GT(batches, 0) << "no wgmma batch in the SASS";
  return r2ur;
}

// Named-barrier arrives (BAR.ARV) issued while a wgmma batch is in flight: after a batch's commit
// (the HGMMA or QGMMA marked gsb0) and before the wait for it (WARPGROUP.DEPBAR). Ping-pong hands its
// turn on there when the turn ends with a GEMM's issue, not its completion.
inline int bar_arrives_under_wgmma(const std::string& cuobjdump, const std::string& cubin) {
  int arrives = 0;
  bool in_flight = false;
  for (const std::string& op : sass_instructions(cuobjdump, cubin)) {
    if (op.find("GMMA") != std::string::npos && op.find("gsb0") != std::string::npos) in_flight = true;
    else if (op.find("WARPGROUP.DEPBAR") != std::string::npos) in_flight = false;
    else if (in_flight && op.find("BAR.ARV") != std::string::npos) ++arrives;
  }
  return arrives;
}

// Instructions of a cubin's SASS whose opcode (after an optional predicate, @P0 or @!UP1) is `op` or
// starts with `op.`: FMUL counts FMUL and FMUL.FTZ, not FMUL2 or FMNMX.
inline int sass_op_count(const std::string& cuobjdump, const std::string& cubin, const std::string& op) {
  static const std::regex opcode(R"(^(?:@!?U?P[0-9T]\s+)?([A-Z0-9_.]+))");
  int n = 0;
  for (const std::string& ins : sass_instructions(cuobjdump, cubin)) {
    std::smatch m;
    if (!std::regex_search(ins, m, opcode)) continue;
    const std::string code = m[1].str();
    n += code == op || code.rfind(op + ".", 0) == 0;
  }
  return n;
}

// The build tests of a tunable flag: each (problem spec, config) of `jobs` built for `arch` with the
// flag false and true, each checked to build ok, without spills or serialised wgmmas (C751x); the
// cubins by "spec config" and the flag's value.
inline std::map<std::string, std::map<bool, std::string>> clean_builds_off_and_on(
    const SearchSpace& space, const std::string& arch,
    const std::vector<std::pair<std::string, std::string>>& jobs, const std::string& flag) {
  BuildPoolOptions pool_opts;
  pool_opts.nvrtc_options = family_nvrtc_options(space.family());
  pool_opts.worker_argv = {attntune_bin(), "build-worker"};
  BuildPool pool(pool_opts);
  std::map<std::uint64_t, std::pair<std::string, bool>> job_of;  // ticket -> (name, flag)
  for (const auto& [spec, cfg] : jobs) {
    const Problem p = Problem::parse(spec);
    for (const bool on : {false, true}) {
      const Config c = space.parse_config(fmt::format("{},{}={}", cfg, flag, on));
      const std::optional<std::string> why = space.check(c, p, arch);
      EXPECT_EQ(why, std::nullopt) << spec << " " << config_str(c);
      if (why) continue;
      job_of[pool.submit({c, render_kernel(space, c, p, arch), arch})] = {spec + " " + cfg, on};
    }
  }
  std::map<std::string, std::map<bool, std::string>> cubins;
  while (auto o = pool.next()) {
    EXPECT_EQ(o->build.status, "ok") << config_str(o->job.config) << "\n" << o->build.log;
    if (o->build.status != "ok") continue;
    EXPECT_EQ(o->build.spill_stores + o->build.spill_loads, 0) << config_str(o->job.config);
    EXPECT_EQ(o->build.log.find("C751"), std::string::npos) << "wgmma serialised: " << o->build.log;
    const auto& [name, on] = job_of.at(o->ticket);
    cubins[name][on] = o->build.cubin;
  }
  return cubins;
}

// What a SASS test says when it skips its SASS half (sass_counts_off_and_on found no cuobjdump).
inline constexpr const char* kNoSassHalf = "builds clean; no cuobjdump for the SASS half (ATTNTUNE_CUOBJDUMP, PATH, .venv)";

// The SASS test of a tunable flag: each (spec, config) of `jobs` built off and on
// (clean_builds_off_and_on, which checks the builds), then `count` of each cubin's SASS, printed as
// "spec config: WHAT off -> on"; (off, on) by "spec config". nullopt when no cuobjdump is found: the
// caller skips the SASS half, saying so.
inline std::optional<std::map<std::string, std::pair<int, int>>> sass_counts_off_and_on(
    const SearchSpace& space, const std::string& arch, const std::vector<std::pair<std::string, std::string>>& jobs,
    const std::string& flag, const std::string& what,
    const std::function<int(const std::string& cuobjdump, const std::string& cubin)>& count) {
  const auto cubins = clean_builds_off_and_on(space, arch, jobs, flag);
  EXPECT_EQ(cubins.size(), jobs.size());
  const std::string cuobjdump = find_cuobjdump();
  if (cuobjdump.empty()) return std::nullopt;
  std::map<std::string, std::pair<int, int>> out;
  for (const auto& [name, by] : cubins) {
    const std::pair<int, int> n{count(cuobjdump, by.at(false)), count(cuobjdump, by.at(true))};
    std::printf("%s: %s %d -> %d\n", name.c_str(), what.c_str(), n.first, n.second);
    out[name] = n;
  }
  return out;
}

}  // namespace attntune::testing
