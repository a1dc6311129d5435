// The exported kernel file (docs/CONTRACT.md "The exported kernel"): one self-contained .cu holding the
// kernel sources the tuner measured, verbatim, and a host launcher with the C entry points
// attntune_attention_forward, _kvcache, _varlen (and the additions docs/CONTRACT.md lists),
// attntune_kernel_info and attntune_last_error.
//
// Layout of the file: a provenance comment; templates/export/prologue.cuh (CUDA runtime and C++
// standard headers only); each distinct kernel source as render_kernel wrote it, wrapped in its own
// namespace attntune_kN with its entry points renamed by #defines (so several kernels can share a
// translation unit; macros they define are #undef'd after each) and declared with the family's
// kernel_params; templates/export/launcher.cuh with the dispatch table, each kernel's constants
// (the renderer's #defines) and the provenance JSON filled in, and in it the plan executor
// (templates/export/run_plan.cuh: templates/common/run_plan.h over the CUDA runtime) and the
// launch plan (templates/<family>/launch.h) of each family the file holds, their includes inlined.
//
// Kernels of a space that lists only arch-specific targets (flash_fwd_wgmma: sm_90a) sit inside
// `#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)`: nvcc -arch=sm_90a also
// compiles compute_90 PTX, which cannot hold their instructions. The launcher is host code only.
//
// Only validated values reach code: integers, the family's identifiers and namespace names we make.
// Strings from the database (campaign, GPU, config, timestamps) appear only JSON-escaped and ASCII,
// inside // comments and inside one C string literal whose \ " ? are escaped.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/records.hpp"
#include "space/search_space.hpp"

namespace attntune {

// One kernel to export: what was measured, and the search space it was tuned in (to render it).
struct ExportItem {
  BestRow row;
  std::shared_ptr<const SearchSpace> space;
  // Where the result came from when it is not the database exported from: "shipped database
  // attntune-shipped.db" (docs/design/shipped_db.md). The provenance then says so (`source`, in the
  // comment and in attntune_kernel_info()'s kernel); empty: the database, and no such field.
  std::string source = {};
  // A companion: the calls the item before it refuses (its family's narrowed_calls), which this one
  // serves; empty for an item the query selected.
  std::string companion_for = {};
};

enum class ExportMode {
  kSingle,   // one kernel: the launcher accepts only its head_dim and causal
  kAllBest,  // the best kernel of each problem; dispatch by head_dim, causal, nearest lengths
};

// The .cu text. InputError for items of different dtypes (the C entry point has no dtype argument)
// or a config its space rejects; std::logic_error for no items.
std::string export_source(const std::vector<ExportItem>& items, ExportMode mode);

// What attntune_kernel_info() returns: {"format", "mode", "dtype", "attntune_version", [single: the
// kernel's fields], "kernels": [{"template", "config", "problem", "gpu", "arch", "median_us",
// "tflops", "max_abs_err", "campaign", "evaluated_at", "source_hash", "launch"[, "source"]}]}.
nlohmann::ordered_json export_info(const std::vector<ExportItem>& items, ExportMode mode);

// A JSON string literal of s, ASCII only (invalid UTF-8 becomes U+FFFD): safe as the value on a //
// comment line (no newline, never ends in a backslash).
std::string json_quoted(std::string_view s);
// Printable ASCII text as one or more adjacent C string literals ("..." "..."), each on its own
// line after `indent`, with \ " and ? escaped (no escape sequence, trigraph or newline leaks).
// std::logic_error for any other byte.
std::string c_string_literal(std::string_view ascii, std::string_view indent = "    ");

}  // namespace attntune
