// Kernel families: how a (space, config, problem) becomes one self-contained CUDA source, and how
// its builds launch. A family is one folder under templates/ (kernel.cu, traits, launch.h: its
// launch plan, templates/common/launch_plan.h), one file here (its Family: files, entry points,
// how the export names and describes its launch), one line in registry.cpp and one space YAML.
// Nothing outside those asks which family it holds (ARCHITECTURE.md, "Adding a family").
//
// Values reach the source only as validated integers (ints, bools as 0/1, enum values as their
// index): the space has already checked every value against its domain.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "core/problem.hpp"
#include "space/search_space.hpp"
#include "templates/common/launch_plan.h"

namespace attntune {

// The #defines a build was compiled with, in order: its constants.
using Defines = std::vector<std::pair<std::string, std::int64_t>>;

// How a build launches: the launch plan of a built-in family and the constants it reads. A test
// family's faulty kernels launch as a built-in family does (tests/reliability/).
struct LaunchSpec {
  std::string plan;  // a built-in family's name
  Defines defines;
};

// A built-in kernel family.
struct Family {
  std::string name;          // folder under templates/, the YAML's family:
  std::string main_file;     // embedded path of the kernel file
  std::string launch_file;   // embedded path of its launch plan (templates/<name>/launch.h)
  const attntune_plan::LaunchFamily* plan = nullptr;  // the launch plan launch_file defines
  std::string plan_symbol;   // its C++ name there, for the export's kernel table
  // Each entry point's parameter list (the export declares each kernel with it).
  std::vector<std::string> kernel_params;
  bool tma = false;          // loads through TMA tensor maps: the export needs CUDA 12
  // One build per entry point (the prefill families): a paged problem's build (ATT_KVCACHE) serves
  // attntune_attention_forward_kvcache only, a varlen problem's (ATT_VARLEN) the varlen entry points
  // only, and a dense problem's attntune_attention_forward only. Otherwise (flash_decode) one build
  // serves every entry point of the family's, a varlen one aside.
  bool build_per_entry = false;
  std::vector<std::string> nvrtc_options = {"-std=c++17"};  // besides --gpu-architecture; part of the cache key
  // What the export's header says of a build's launch, and its "launch" JSON, from its constants.
  std::function<std::string(const Defines&)> describe_launch;
  std::function<nlohmann::ordered_json(const Defines&)> launch_json;
  // The calls of its problem's shape that a config's launch refuses because of a tunable, said as a
  // phrase ("" where no tunable narrows them; unset: none does): flash_fwd_wgmma's k_perm serves key
  // counts of fours only. `export` follows such a kernel with its problem's best result that serves
  // them (select.cpp, add_companions), so that the dispatcher falls through to it.
  std::function<std::string(const Config&)> narrowed_calls;
  // Configs a tunable or two from `config` (of `space`, for `problem` on `arch`) that this family's
  // launch plan predicts run the problem sooner on a device of `sm_count` SMs (unset or empty:
  // none). A warm start tries them right after the config they come from (service::add_warm_starts):
  // a neighbour's tuned configs say nothing of what only this problem's shape pays for, and a
  // campaign's first evaluations are the warm start's. flash_fwd_wgmma: the causal split where its
  // plan splits.
  std::function<std::vector<Config>(const SearchSpace& space, const Config& config, const Problem& problem,
                                    const std::string& arch, int sm_count)>
      plan_moves;
};

// The built-in families (registry.cpp), in registration order.
const std::vector<const Family*>& builtin_families();

// The built-in family `name`; InputError naming the known ones for any other.
const Family& builtin_family(const std::string& name);

// Every family a YAML file can name: the built-in ones and whatever a test registered.
std::vector<std::string> known_families();
// InputError naming the known families unless `name` is one.
void check_family(const std::string& name);

// The entry point (attntune_plan::Entry bit) of problem p: kEntryBackward for the backward pass
// (pass=bwd; kEntryBackwardVarlen with varlen), else kEntryKvcache for a paged problem, kEntryVarlen for a packed batch, kEntryDense.
int problem_entry(const Problem& p);

// InputError unless family `name` serves p's entry point (a paged problem: the kvcache entry; a
// dense one: attntune_attention_forward; the backward pass: attntune_attention_backward), naming the
// families that do. Test families serve all.
void check_family_serves(const std::string& name, const Problem& p);

// The entry points (attntune_plan::Entry bits) a build of `family` for problem p serves: a backward
// problem's build the backward entry alone, a forward problem's never it.
int served_entries(const Family& family, const Problem& p);

// A family's NVRTC options (a test family's: those of the family it launches as).
std::vector<std::string> family_nvrtc_options(const std::string& name);

struct RenderedKernel {
  std::string source;       // flattened: no #include left
  std::string kernel_name;  // the first entry point (NVRTC names the program after it)
  std::string source_hash;  // content_hash(source): the candidate's identity and cache key
  LaunchSpec launch = {};
};

// Problem fields that the kernel bakes in (head dim, dtype, causal) and the config as #defines,
// then the family's files with their #includes inlined. Sequence lengths, batch and heads stay
// run-time arguments, so one build serves every shape with the same d/dtype/causal.
RenderedKernel render_kernel(const SearchSpace& space, const Config& config, const Problem& problem,
                             const std::string& arch);

// #defines alone (for the export and tests): name value pairs, in order.
Defines kernel_defines(const SearchSpace& space, const Config& config, const Problem& problem, const std::string& arch);

// A define's value; std::logic_error when absent (the space derives what its family needs).
std::int64_t define_value(const Defines& defines, const std::string& name);

// An embedded file with its quoted #includes replaced by the embedded files they name (each once).
std::string flatten_includes(const std::string& embedded_path);

// A launch spec's constants as the launch plans read them (names point into `defines`).
std::vector<attntune_plan::Define> plan_defines(const Defines& defines);

// A family's launch constants (its launch.h's type C) read from a build's defines, for what the
// family's file says of a build; std::logic_error when they do not load (a space that does not
// derive what its family needs).
template <class C>
C launch_constants(const Defines& defines, const char* family) {
  const auto defs = plan_defines(defines);
  C c{};
  attntune_plan::Why why;
  if (C::load(defs.data(), static_cast<int>(defs.size()), &c, &why))
    throw std::logic_error(std::string(family) + ": " + why.text);
  return c;
}

// The dense call (attntune_attention_forward) of problem p's shape: [B, H, S, D] tensors one after
// another from the fake address `base` (never dereferenced, 256-byte aligned), scale 1/8. For plans
// made without a call's tensors: a warm start's predictions (Family::plan_moves) and the tests.
attntune_plan::Call problem_dense_call(const Problem& p, long long base = 1ll << 32);

// The plan of one call for a build (its family's launch plan with its constants) on `device`, host
// side only (tests, tools): nullopt with the reason in `why` when the family refuses the call.
std::optional<attntune_plan::Plan> plan_call(const LaunchSpec& spec, const attntune_plan::Call& call,
                                             const attntune_plan::Device& device, std::string* why = nullptr);

// The arch to build a space's kernels for on a device whose compute capability is `device_arch`
// ("sm_90"): the device's own when the space lists it, else its arch-specific variant ("sm_90a":
// wgmma, setmaxnreg) when the space lists that, else the device's own (which the space refuses).
// The device arch of an arch-specific target: "sm_90a" -> "sm_90"; others unchanged. Results of
// one GPU are filed under both (a family built for sm_90a, another for sm_90).
std::string base_arch(const std::string& arch);
std::string space_arch_for_device(const SearchSpace& space, const std::string& device_arch);

// A family that a test registers at run time, with its own rendering: the reliability suite's
// planted-fault family (tests/reliability/) maps each of its configs to a real flash_fwd_mma
// candidate or a faulty kernel of tests/data/faults/ (launched as flash_fwd_mma launches), so that
// faults go through the campaign machinery like any candidate. The product never registers one.
using RenderHook = std::function<RenderedKernel(const SearchSpace&, const Config&, const Problem&, const std::string&)>;
// logic_error if the name is taken or the hook is missing. Not thread-safe: register before any use.
void register_test_family(const std::string& name, RenderHook render);

// "block_n" -> "BLOCK_N"
std::string macro_name(const std::string& param);

}  // namespace attntune
