// The planted-fault family of the reliability suite: a family this test process registers
// (families/family.hpp: register_test_family; the product never does) over planted_faults.yaml. A
// config {copy, kind, good} renders either a real flash_fwd_mma candidate (kind `good`) or one of the
// planted faulty kernels of tests/data/faults/ (tests/unit/eval/fault_kernels.hpp), each copy a
// distinct source and so a distinct build, launched (as flash_fwd_mma launches) so that it fails as
// intended.
// A campaign over this space goes through the real machinery (run_campaign, GpuRunner, BuildPool,
// Evaluator) like any other, and every candidate knows the status it must get.
#pragma once
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/hash.hpp"
#include "families/family.hpp"
#include "space/search_space.hpp"
#include "tests/unit/eval/fault_kernels.hpp"

namespace attntune::reliability {

struct PlantedKind {
  std::string kind;      // the enum value in planted_faults.yaml
  std::string file;      // under tests/data/faults/ ("" for good)
  std::string expected;  // the status the evaluator must give it
};

// Every kind of planted_faults.yaml, with the fault file and expected status from fault_kernels.hpp.
inline const std::vector<PlantedKind>& planted_kinds() {
  static const std::vector<PlantedKind> kinds = [] {
    std::map<std::string, std::string> expected;
    for (const auto* list : {&testing::fault_kernels(), &testing::campaign_fault_kernels()})
      for (const auto& f : *list) expected[f.file] = f.expected;
    const std::vector<std::pair<std::string, std::string>> files = {
        {"oob_write", "oob_write.cu"},           {"trap", "trap.cu"},
        {"endless_loop", "endless_loop.cu"},     {"wrong_values", "wrong_values.cu"},
        {"nan_output", "nan_output.cu"},         {"unwritten", "unwritten.cu"},
        {"smem_over_limit", "too_much_smem.cu"}, {"smem_over_with_static", "too_much_smem.cu"},
        {"compile_error", "compile_error.cu"},   {"compile_hang", "compile_hang.cu"},
        {"missing_entry", "missing_entry.cu"},
    };
    std::vector<PlantedKind> k = {{"good", "", "ok"}};
    for (const auto& [kind, file] : files) k.push_back({kind, file, expected.at(file)});
    return k;
  }();
  return kinds;
}

inline const PlantedKind& planted_kind(const Config& c) {
  const std::string& kind = std::get<std::string>(c.at("kind"));
  for (const PlantedKind& k : planted_kinds())
    if (k.kind == kind) return k;
  throw std::logic_error("unknown planted kind " + kind);
}

// What the hooks render from: set by setup_planted_family before a campaign runs.
struct PlantedSetup {
  std::string source_dir;
  const SearchSpace* flash_space = nullptr;  // search_spaces/flash_fwd_mma.yaml
  std::vector<Config> good_configs;          // 20 valid flash_fwd_mma configs, spread over the space
  long long max_smem_optin = 0;              // the device's per-block opt-in limit
  std::string fifo;                          // a FIFO nobody writes, for compile_hang.cu
};

inline PlantedSetup& planted_setup() {
  static PlantedSetup s;
  return s;
}

inline const Config& planted_good_config(const Config& c) {
  const PlantedSetup& s = planted_setup();
  const auto i = std::get<std::int64_t>(c.at("copy")) * 4 + std::get<std::int64_t>(c.at("good"));
  return s.good_configs.at(static_cast<std::size_t>(i));
}

inline RenderedKernel render_planted(const SearchSpace& space, const Config& c, const Problem& p, const std::string& arch) {
  if (auto why = space.check(c, p, arch)) throw InputError("planted_faults: " + config_str(c) + ": " + *why);
  const PlantedSetup& s = planted_setup();
  const PlantedKind& k = planted_kind(c);
  if (k.kind == "good") return render_kernel(*s.flash_space, planted_good_config(c), p, arch);
  // As tests/data/faults/README.md says: 64 rows per block, 128 threads; the shared memory that
  // makes too_much_smem.cu fail as intended.
  long long smem = 0;
  if (k.kind == "smem_over_limit") smem = s.max_smem_optin + 1024;  // alone too much
  if (k.kind == "smem_over_with_static") smem = s.max_smem_optin - 16384;  // fits alone, not with 32 KiB static
  std::string src = testing::render_fault(s.source_dir, k.file, p.d).source;
  const std::string include = "#include \"NEVER_WRITTEN_FIFO\"";
  if (auto at = src.find(include); at != std::string::npos) src.replace(at, include.size(), "#include \"" + s.fifo + "\"");
  src = fmt::format("// planted fault {}, copy {}\n", k.kind, std::get<std::int64_t>(c.at("copy"))) + src;
  return {src, "flash_fwd_mma", content_hash(src), testing::fault_launch(smem)};
}

// Fills the setup (20 good configs spread over the flash space for the problem and arch) and
// registers the family, once per process.
inline void setup_planted_family(const std::string& source_dir, const SearchSpace& flash_space, const Problem& p,
                                 const std::string& arch, long long max_smem_optin, const std::string& fifo) {
  PlantedSetup& s = planted_setup();
  s.source_dir = source_dir;
  s.flash_space = &flash_space;
  s.max_smem_optin = max_smem_optin;
  s.fifo = fifo;
  const std::vector<Config> all = flash_space.enumerate(p, arch);
  if (all.size() < 20) throw std::logic_error("fewer than 20 flash_fwd_mma configs");
  s.good_configs.clear();
  for (std::size_t i = 0; i < 20; ++i) s.good_configs.push_back(all[i * all.size() / 20]);
  static const bool registered = [] {
    register_test_family("planted_faults", render_planted);
    return true;
  }();
  (void)registered;
}

}  // namespace attntune::reliability
