#include "export/export.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "core/embedded.hpp"
#include "core/error.hpp"
#include "families/family.hpp"

namespace attntune {

namespace {

constexpr const char* kFormat = "attntune-export/1";
constexpr const char* kPrologue = "templates/export/prologue.cuh";
constexpr const char* kLauncher = "templates/export/launcher.cuh";

constexpr const char* kRunPlan = "templates/export/run_plan.cuh";

// The C entry points of docs/CONTRACT.md, by the launch-plan bit of the families that serve them.
const std::pair<int, const char*> kEntryPoints[] = {
    {attntune_plan::kEntryDense, "attntune_attention_forward"},
    {attntune_plan::kEntryKvcache, "attntune_attention_forward_kvcache"},
    {attntune_plan::kEntryVarlen, "attntune_attention_forward_varlen"},
    {attntune_plan::kEntryBackward, "attntune_attention_backward"},
    {attntune_plan::kEntryBackwardVarlen, "attntune_attention_backward_varlen"},
};


bool is_identifier(std::string_view s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

// "sm_90" -> 90, "sm_90a" -> 90; InputError for anything else (the arch reaches the build line).
int checked_arch_number(const std::string& arch) {
  std::size_t i = 3;
  int n = 0;
  if (arch.rfind("sm_", 0) != 0) i = arch.size() + 1;
  for (; i < arch.size() && std::isdigit(static_cast<unsigned char>(arch[i])) && n < 10000; ++i) n = n * 10 + (arch[i] - '0');
  const bool suffix_ok = i == arch.size() || (i + 1 == arch.size() && arch[i] == 'a');
  if (n < 10 || !suffix_ok) throw InputError(fmt::format("export: {} is not an arch of the form sm_90", json_quoted(arch)));
  return n;
}

// Replaces every @@NAME@@ of an embedded template with its value; every value must be used.
std::string fill(std::string_view tmpl, const std::map<std::string, std::string>& values) {
  std::string out;
  std::set<std::string> used;
  std::size_t pos = 0;
  for (;;) {
    const std::size_t a = tmpl.find("@@", pos);
    if (a == std::string_view::npos) break;
    const std::size_t b = tmpl.find("@@", a + 2);
    if (b == std::string_view::npos) throw std::logic_error("export template: unterminated @@ marker");
    const std::string name(tmpl.substr(a + 2, b - a - 2));
    const auto it = values.find(name);
    if (it == values.end()) throw std::logic_error("export template: no value for @@" + name + "@@");
    out.append(tmpl.substr(pos, a - pos));
    out += it->second;
    used.insert(name);
    pos = b + 2;
  }
  out.append(tmpl.substr(pos));
  if (used.size() != values.size()) throw std::logic_error("export template: a value has no @@ marker");
  return out;
}

// Names of the macros a source #defines, in order, each once (to #undef them after it).
std::vector<std::string> defined_macros(const std::string& source) {
  std::vector<std::string> names;
  std::set<std::string> seen;
  std::istringstream in(source);
  std::string line;
  while (std::getline(in, line)) {
    std::size_t i = line.find_first_not_of(" \t");
    if (i == std::string::npos || line[i] != '#') continue;
    i = line.find_first_not_of(" \t", i + 1);
    if (i == std::string::npos || line.compare(i, 6, "define") != 0) continue;
    i = line.find_first_not_of(" \t", i + 6);
    if (i == std::string::npos) continue;
    std::size_t j = i;
    while (j < line.size() && (std::isalnum(static_cast<unsigned char>(line[j])) || line[j] == '_')) ++j;
    const std::string name = line.substr(i, j - i);
    if (is_identifier(name) && seen.insert(name).second) names.push_back(name);
  }
  return names;
}

// An item rendered: the source the tuner measured and how to launch it.
struct Prepared {
  const ExportItem* item = nullptr;
  RenderedKernel kernel;
  const Family* family = nullptr;
  // What the tuner built the kernel for (space_arch_for_device): the result's arch, or its
  // arch-specific variant ("sm_90a") where the space lists that.
  std::string kernel_arch;
  // The space lists only arch-specific targets ("sm_90a"): the preprocessor condition under which
  // a device pass can hold the kernel ("defined(__CUDA_ARCH_FEAT_SM90_ALL)"); "" otherwise.
  std::string device_condition;
  int source_index = 0;  // which distinct source (namespace attntune_kN)
};

// Whether an item's kernel computes the backward pass: its build serves attntune_attention_backward
// or _varlen (a `pass=bwd` problem's), and no forward entry point.
bool is_backward(const Prepared& p) {
  return (served_entries(*p.family, p.item->row.problem) &
          (attntune_plan::kEntryBackward | attntune_plan::kEntryBackwardVarlen)) != 0;
}

struct LibraryPlan {  // the library a set of export items becomes (not attntune_plan::Plan, one launch's plan)
  std::vector<Prepared> items;
  std::vector<std::size_t> sources;  // items holding each distinct source, first use order
  std::string dtype, arch;
  int min_arch = 0;  // lowest arch every space supports, e.g. 80
  // Spaces that list only arch-specific targets ("sm_90a": wgmma, setmaxnreg): each such list,
  // one of whose archs the file must be compiled for.
  std::vector<std::vector<std::string>> specific_archs;
  std::vector<const Family*> families;  // used by some kernel, first use order
};

bool is_arch_specific(const std::string& arch) { return !arch.empty() && arch.back() == 'a'; }

constexpr int kFp8MinArch = 89;  // the first arch that converts e4m3 (cvt.rn.f16x2.e4m3x2)

// Whether the space's device limits for `arch` let it convert FP8 (its `fp8` limit; a space that names
// none: yes).
bool has_fp8(const SearchSpace& space, const std::string& arch) {
  for (const auto& [name, value] : space.device_limits(arch))
    if (name == "fp8") return value != 0;
  return true;
}

LibraryPlan plan(const std::vector<ExportItem>& items) {
  if (items.empty()) throw std::logic_error("export: no kernels");
  LibraryPlan p;
  std::map<std::string, int> by_hash;
  for (const ExportItem& it : items) {
    if (!it.space) throw std::logic_error("export: an item without its space");
    const BestRow& r = it.row;
    if (it.space->family() != r.family)
      throw InputError(fmt::format("export: the search space is for {}, the result for {}", json_quoted(it.space->family()),
                                   json_quoted(r.family)));
    checked_arch_number(r.arch);
    // What the tuner built the kernel for: the device's arch, or its arch-specific variant where the
    // space lists only that (a campaign of several templates files results under one arch, sm_90,
    // while it builds flash_fwd_wgmma for sm_90a).
    const std::string build = space_arch_for_device(*it.space, r.arch);
    Prepared prep;
    prep.item = &it;
    prep.kernel_arch = build;
    prep.kernel = render_kernel(*it.space, r.config, r.problem, build);
    // The file must hold the kernel that was measured: a template edited since renders another
    // source, whose speed and correctness nobody has seen.
    if (!r.source_hash.empty() && r.source_hash != prep.kernel.source_hash)
      throw WorkError(fmt::format(
          "export: the kernel template has changed since campaign {} measured {} (source {} then, {} now); tune "
          "that problem again in a new campaign (`attntune tune --campaign NEW_NAME ...`) and export from it",
          json_quoted(r.campaign), config_str(r.config), r.source_hash.substr(0, 12),
          prep.kernel.source_hash.substr(0, 12)));
    prep.family = &builtin_family(prep.kernel.launch.plan);
    if (std::find(p.families.begin(), p.families.end(), prep.family) == p.families.end())
      p.families.push_back(prep.family);
    for (int k = 0; k < prep.family->plan->kernels; ++k)
      if (!is_identifier(prep.family->plan->kernel_names[k]))
        throw std::logic_error("export: kernel name is not an identifier");
    const auto [pos, fresh] = by_hash.emplace(prep.kernel.source_hash, static_cast<int>(by_hash.size()));
    prep.source_index = pos->second;
    p.items.push_back(std::move(prep));
    if (fresh) p.sources.push_back(p.items.size() - 1);
    // The file needs what every space needs: the highest of the spaces' lowest archs.
    int space_min = 0;
    bool all_specific = !it.space->archs().empty();
    std::vector<std::string> defined;  // the device passes that hold arch-specific code of the space
    for (const std::string& a : it.space->archs()) {
      const int n = checked_arch_number(a);
      all_specific = all_specific && is_arch_specific(a);
      defined.push_back(fmt::format("defined(__CUDA_ARCH_FEAT_SM{}_ALL)", n));
      // An FP8-cache kernel converts e4m3 (sm_89 and newer): only the archs whose limits say fp8
      // (every arch of a space that names no such limit, 89 at least) hold it. Its file then refuses
      // older targets at compile time, rather than build a kernel that would read its cache as zeros.
      if (r.problem.kv_fp8 && (n < kFp8MinArch || !has_fp8(*it.space, a))) continue;
      if (space_min == 0 || n < space_min) space_min = n;
    }
    if (r.problem.kv_fp8) space_min = std::max(space_min, kFp8MinArch);
    p.min_arch = std::max(p.min_arch, space_min);
    if (all_specific) p.items.back().device_condition = fmt::format("{}", fmt::join(defined, " || "));
    if (all_specific && std::find(p.specific_archs.begin(), p.specific_archs.end(), it.space->archs()) ==
                            p.specific_archs.end())
      p.specific_archs.push_back(it.space->archs());
  }
  p.dtype = dtype_name(items.front().row.problem.dtype);
  // One device arch: results filed under sm_90 (flash_fwd_mma, flash_decode) and sm_90a (a
  // flash_fwd_wgmma result) are of one GPU, and one file built for sm_90a holds them all (the
  // arch-specific kernels under their device condition).
  p.arch = base_arch(items.front().row.arch);
  for (const ExportItem& it : items) {
    if (dtype_name(it.row.problem.dtype) != p.dtype)
      throw InputError(
          "export: the kernels are of different dtypes (fp16 and bf16), but attntune_attention_forward has no "
          "dtype argument: export one file per dtype (--dtype)");
    if (base_arch(it.row.arch) != p.arch)
      throw InputError(fmt::format("export: the results were measured on different archs ({} and {}): export one file "
                                   "per arch (--arch)",
                                   json_quoted(p.arch), json_quoted(it.row.arch)));
  }
  return p;
}

// A kernel's problem says its entry point (page: kvcache; varlen: the varlen entries) and the
// variants it was built with (it serves exactly those), as its spec does.
nlohmann::ordered_json problem_json(const Problem& p) { return p.ordered_json(); }

// The variants a kernel was built with, by name ("window", "softcap", "sinks"; [] when plain).
nlohmann::ordered_json variants_json(const Problem& p) {
  nlohmann::ordered_json v = nlohmann::ordered_json::array();
  if (p.windowed()) v.push_back("window");
  if (p.softcapped()) v.push_back("softcap");
  if (p.sinks) v.push_back("sinks");
  return v;
}

nlohmann::ordered_json item_json(const Prepared& p) {
  const BestRow& r = p.item->row;
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  for (const auto& [k, v] : r.config) std::visit([&](const auto& x) { config[k] = x; }, v);
  nlohmann::ordered_json j = {{"template", r.family},
          {"config", config},
          {"problem", problem_json(r.problem)},
          {"variants", variants_json(r.problem)},
          {"gpu", r.gpu},
          {"arch", r.arch},
          {"median_us", r.median_us},
          {"tflops", r.tflops},
          {"max_abs_err", r.max_abs_err},
          {"campaign", r.campaign},
          {"evaluated_at", r.evaluated_at},
          {"source_hash", p.kernel.source_hash},
          {"launch", p.family->launch_json(p.kernel.launch.defines)}};
  if (!p.item->source.empty()) j["source"] = p.item->source;
  if (!p.item->companion_for.empty()) j["companion_for"] = p.item->companion_for;
  return j;
}

nlohmann::ordered_json info(const LibraryPlan& plan, ExportMode mode) {
  nlohmann::ordered_json j = {{"format", kFormat},
                              {"mode", mode == ExportMode::kSingle ? "single" : "all-best"},
                              {"dtype", plan.dtype},
                              {"arch", plan.arch},
                              {"attntune_version", ATTNTUNE_VERSION}};
  if (mode == ExportMode::kSingle) {
    const nlohmann::ordered_json only = item_json(plan.items.front());
    for (const auto& [k, v] : only.items()) j[k] = v;
  }
  nlohmann::ordered_json kernels = nlohmann::ordered_json::array();
  for (const Prepared& p : plan.items) kernels.push_back(item_json(p));
  j["kernels"] = std::move(kernels);
  // Every entry point this file implements, and for each the problems its kernels were tuned for
  // (an entry point no kernel serves answers ATTNTUNE_UNSUPPORTED).
  nlohmann::ordered_json entries = nlohmann::ordered_json::object();
  for (const auto& [bit, name] : kEntryPoints) {
    nlohmann::ordered_json problems = nlohmann::ordered_json::array();
    for (const Prepared& p : plan.items)
      if (served_entries(*p.family, p.item->row.problem) & bit) problems.push_back(p.item->row.problem.str());
    if (!problems.empty()) entries[name] = std::move(problems);
  }
  j["entry_points"] = std::move(entries);
  return j;
}

std::string dump_ascii(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', true, nlohmann::ordered_json::error_handler_t::replace);
}

std::string number(double v) { return fmt::format("{:.6g}", v); }

std::string provenance_lines(const Prepared& p) {
  const BestRow& r = p.item->row;
  std::string out;
  auto line = [&](const char* key, const std::string& value) { out += fmt::format("//   {:<13} {}\n", key, value); };
  line("template", json_quoted(r.family));
  line("config", json_quoted(config_str(r.config)));
  line("problem", json_quoted(r.problem.str()));
  line("gpu", json_quoted(r.gpu));
  line("arch", json_quoted(r.arch));
  line("median_us", number(r.median_us));
  line("tflops", number(r.tflops));
  line("max_abs_err", number(r.max_abs_err));
  line("campaign", json_quoted(r.campaign));
  line("evaluated_at", json_quoted(r.evaluated_at));
  line("source_hash", json_quoted(p.kernel.source_hash));
  line("launch", p.family->describe_launch(p.kernel.launch.defines));
  if (!p.item->source.empty()) line("source", json_quoted(p.item->source));
  if (!p.item->companion_for.empty())
    line("companion_for", json_quoted(p.item->companion_for + ": the calls the kernel before it refuses"));
  return out;
}

// The -arch of the build line: the arch the results were measured on, its arch-specific variant
// ("sm_90a") where a space lists only such targets.
std::string build_arch(const LibraryPlan& plan) {
  if (plan.specific_archs.empty() || is_arch_specific(plan.arch)) return plan.arch;
  const std::vector<std::string>& archs = plan.specific_archs.front();
  const std::string same = plan.arch + "a";
  return std::find(archs.begin(), archs.end(), same) != archs.end() ? same : archs.front();
}

std::string header(const LibraryPlan& plan, ExportMode mode) {
  const std::string arch = build_arch(plan);
  std::string h;
  h += fmt::format("// attntune export: {} tuned attention kernel{} and a host launcher, in one self-contained file.\n",
                   plan.items.size(), plan.items.size() == 1 ? "" : "s");
  h += fmt::format("// Made by attntune {} (`attntune export{}`); re-export rather than edit.\n", ATTNTUNE_VERSION,
                   mode == ExportMode::kAllBest ? " --all-best" : "");
  if (plan.specific_archs.empty()) {
    h += "//\n// Build (the CUDA toolkit is all it needs; -arch is your GPU's):\n";
    h += fmt::format("//   nvcc -std=c++17 -arch={} -Xcompiler -fPIC -shared FILE.cu -o libattn.so\n//\n", arch);
  } else {
    h += "//\n// Build (the CUDA toolkit is all it needs):\n";
    h += fmt::format("//   nvcc -std=c++17 -arch={} -Xcompiler -fPIC -shared FILE.cu -o libattn.so\n", arch);
    h += fmt::format(
        "// -arch={0} exactly: the kernels use instructions that only arch-specific {0} code has (wgmma,\n"
        "// setmaxnreg), so they run on GPUs of that compute capability only. Built for other targets alone,\n"
        "// the link fails (undefined reference to the kernel); built for several, GPUs without {0} code\n"
        "// are refused at run time (ATTNTUNE_UNSUPPORTED, and attntune_last_error() says why).\n//\n",
        arch);
  }
  if (std::any_of(plan.families.begin(), plan.families.end(), [](const Family* f) { return f->tma; }))
    h += "// Q, K and V are loaded through TMA tensor maps, encoded for each call with cuTensorMapEncodeTiled,\n"
         "// which the CUDA runtime hands over (cudaGetDriverEntryPoint): no -lcuda; CUDA 12.0 or newer.\n//\n";
  h += fmt::format(
      "// Element type: {} for q, k, v and out (not checked: the launcher sees void pointers). Tensors are\n"
      "// [batch, heads, seqlen, head_dim] with strides in elements {{batch, head, row}} and the last dim\n"
      "// contiguous, so [B,H,S,D] and [B,S,H,D] both work without copies; q, k, v and out 16-byte aligned,\n"
      "// strides multiples of 8 elements; lse NULL or [batch, heads_q, seqlen_q] fp32 (natural log).\n//\n",
      plan.dtype);
  // Only a file with a latent kernel says how it is called (every other file's text is as before).
  if (std::any_of(plan.items.begin(), plan.items.end(), [](const Prepared& p) { return p.item->row.problem.latent; }))
    h += "// Latent kernels (label \"latent\"; multi-head latent attention's decode): V is the first head_dim_v\n"
         "// columns of K, one buffer. Call them with v = k and v_strides = k_strides (k_cache and v_cache the\n"
         "// same pages for _kvcache) and attntune_options.head_dim_v (512 for DeepSeek-V2/V3's cache of 576);\n"
         "// a call whose v is another buffer is served by another kernel or refused, with the reason.\n"
         "// attntune_options.latent = 1 says that v is k: attntune_select_kernel_ex then weighs latent kernels\n"
         "// for its sizes, and an _ex call with it whose v is not k (or v_strides not k_strides) is refused.\n//\n";
  // Only a file with an FP8-cache kernel says how it is called (every other file's text is as before).
  if (std::any_of(plan.items.begin(), plan.items.end(), [](const Prepared& p) { return p.item->row.problem.kv_fp8; }))
    h += "// FP8 KV caches (label \"kv_dtype=fp8\"): k and v (k_cache and v_cache) hold FP8 e4m3, one byte an\n"
         "// element, their strides counting those bytes (multiples of 16); q and out stay " + plan.dtype + ". Call them\n"
         "// through the _ex entry points with attntune_options.kv_dtype = ATTNTUNE_KV_FP8_E4M3 (1) and the\n"
         "// dequantisation scales k_descale / v_descale (FlashAttention-3's descale_k/v: [batch, heads_kv] fp32\n"
         "// on the device, read through k/v_descale_stride {batch, head} in elements; {0, 0}: one scale for the\n"
         "// tensor; NULL: 1). Calls without kv_dtype 1 (the contract's entry points) are a cache of q's dtype\n"
         "// and never run them, nor do FP8 calls run another kernel. They convert e4m3 on the device: -arch\n"
         "// sm_89 or newer.\n//\n";
  // Only a file with an FP8 forward kernel says how it is called (every other file's text is as before).
  if (std::any_of(plan.items.begin(), plan.items.end(), [](const Prepared& p) { return p.item->row.problem.qkv_fp8; }))
    h += "// The FP8 forward (label \"dtype=fp8\"): q, k and v hold FP8 e4m3, one byte an element, their\n"
         "// strides counting those bytes (multiples of 16), and v is TRANSPOSED: [batch, heads_kv, head_dim_v,\n"
         "// seqlen_k], the keys contiguous, v_strides {batch, head, value dim}; out is bf16. Call it through\n"
         "// attntune_attention_forward_ex with attntune_options.qkv_dtype = ATTNTUNE_QKV_FP8_E4M3 (1) and the\n"
         "// dequantisation scales q_descale, k_descale, v_descale (FlashAttention-3's descale_q/k/v: [batch,\n"
         "// heads_kv] fp32 on the device through {batch, head} strides in elements; {0, 0}: one scale; NULL: 1).\n"
         "// Calls without qkv_dtype 1 never run it, nor do FP8 calls run another kernel. sm_90a only.\n//\n";
  // Only a file with a backward kernel says how it is called (every other file's text is as before).
  if (std::any_of(plan.items.begin(), plan.items.end(), [](const Prepared& p) { return is_backward(p); }))
    h += "// Backward kernels (label \"pass=bwd\"; tuned on a problem with pass=bwd) serve\n"
         "// attntune_attention_backward only: dq, dk and dv of a call of attntune_attention_forward, given\n"
         "// its q, k, v, its out and its softmax_lse ([batch, heads_q, seqlen_q] fp32, contiguous: the\n"
         "// forward's lse, which the forward must be asked for), and dout (out's shape). dq, dk, dv have\n"
         "// q's, k's and v's shapes (with GQA each KV head's gradient is summed over its query heads), any\n"
         "// strides as the other tensors take them, and are overwritten. Forward kernels never serve it.\n"
         "// Those tuned on a packed batch (varlen=N) serve attntune_attention_backward_varlen alone: the\n"
         "// same for a call of attntune_attention_forward_varlen (softmax_lse [heads_q, total_q]).\n//\n";
  h += "// C entry points (extern \"C\", at the end of this file):\n"
       "//   int attntune_attention_forward(q, k, v, out, lse, batch, heads_q, heads_kv, seqlen_q, seqlen_k,\n"
       "//       head_dim, q_strides, k_strides, v_strides, o_strides, softmax_scale, is_causal, stream)\n"
       "//     -> 0, ATTNTUNE_UNSUPPORTED (1000) with the reason in attntune_last_error(), or a cudaError_t\n"
       "//   int attntune_attention_forward_kvcache(q, k_cache, v_cache, out, lse, cache_seqlens, block_table,\n"
       "//       max_blocks_per_seq, page_size, batch, heads_q, heads_kv, seqlen_q, seqlen_k_max, head_dim,\n"
       "//       q_strides, k_strides, v_strides, o_strides, softmax_scale, is_causal, stream)\n"
       "//   int attntune_attention_forward_varlen(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, batch,\n"
       "//       max_seqlen_q, max_seqlen_k, heads_q, heads_kv, head_dim, q_strides, k_strides, v_strides,\n"
       "//       o_strides, softmax_scale, is_causal, stream)\n"
       "//   int attntune_attention_forward_varlen_packed(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, batch,\n"
       "//       total_q, total_k, max_seqlen_q, ...)   the same with the packed tensors' rows (long long),\n"
       "//     which kernels reading through TMA tensor maps need\n"
       "//     the same returns; an entry point that none of this file's kernels serves (kernel_info's\n"
       "//     \"entry_points\" lists those that some do) answers ATTNTUNE_UNSUPPORTED, saying so\n"
       "//   int attntune_attention_backward(q, k, v, out, softmax_lse, dout, dq, dk, dv, batch, heads_q,\n"
       "//       heads_kv, seqlen_q, seqlen_k, head_dim, q_strides, k_strides, v_strides, o_strides,\n"
       "//       do_strides, dq_strides, dk_strides, dv_strides, softmax_scale, is_causal, stream)\n"
       "//     the backward pass of attntune_attention_forward: dq, dk, dv from its inputs, its out and its\n"
       "//     softmax_lse (read), and dout; the same returns\n"
       "//   int attntune_attention_backward_varlen(q, k, v, out, softmax_lse, dout, dq, dk, dv, cu_seqlens_q,\n"
       "//       cu_seqlens_k, batch, total_q, total_k, max_seqlen_q, max_seqlen_k, heads_q, heads_kv,\n"
       "//       head_dim, q/k/v/o/do/dq/dk/dv_strides ({row, head}), softmax_scale, is_causal, stream)\n"
       "//     the same for attntune_attention_forward_varlen's packed tensors\n"
       "//   int attntune_attention_forward_ex(..., is_causal, const attntune_options* opts, stream), and\n"
       "//     attntune_attention_forward_kvcache_ex, attntune_attention_forward_varlen_ex (the _packed\n"
       "//     arguments): the same with options (struct attntune_options below: sliding window, soft-cap,\n"
       "//     sinks; versioned by its size field; NULL is plain attention). A kernel serves exactly the\n"
       "//     variants it was built with (kernel_info's \"variants\"); a call with others is refused.\n"
       "//     attntune_attention_backward_ex(..., is_causal, opts, stream): its options (a window)\n"
       "//     and attntune_attention_backward_varlen_ex the same\n"
       "//   const char* attntune_kernel_info(void)   this provenance as JSON\n"
       "//   const char* attntune_last_error(void)    reason for the last nonzero return (per thread)\n"
       "//   int attntune_select_kernel(head_dim, is_causal, batch, heads_q, heads_kv, seqlen_q, seqlen_k)\n"
       "//     -> index in kernel_info's \"kernels\" of the kernel those sizes run, or -1\n"
       "//   int attntune_select_kernel_entry(entry, head_dim, is_causal, batch, heads_q, heads_kv, seqlen_q,\n"
       "//       seqlen_k)   the same for entry point 1 (forward), 2 (kvcache), 4 (varlen), 8 (backward)\n"
       "//     or 16 (backward of a packed batch)\n"
       "//   int attntune_kernel_problem(index, int problem[9], const char** label)   what kernel `index`\n"
       "//     was tuned for: {b, h, hkv, s, sk, d, causal, bf16, entry bits}; 0, or -1 out of range\n"
       "//   int attntune_kernel_variants(index, int variants[3])   its {window, softcap, sinks} (0 or 1)\n"
       "//   int attntune_select_kernel_ex(entry, head_dim, is_causal, batch, heads_q, heads_kv, seqlen_q,\n"
       "//       seqlen_k, const attntune_options* opts)   attntune_select_kernel_entry for a call with options\n//\n";
  if (mode == ExportMode::kAllBest)
    h += "// Dispatch: the kernels of the call's entry point (a backward call runs backward kernels only, a\n"
         "// forward call never them) built for head_dim, is_causal and the call's variants (a windowed call\n"
         "// never runs a full-attention kernel) whose launch plan accepts the call (a decode kernel takes\n"
         "// only decoding's few query rows); of those, the one tuned for the nearest sequence lengths (by\n"
         "// ratio), then the same GQA group size, then the nearest batch * heads.\n//\n";
  for (std::size_t i = 0; i < plan.items.size(); ++i) {
    h += fmt::format("// Kernel {} (source attntune_k{}), as the tuner measured it:\n", i, plan.items[i].source_index);
    h += provenance_lines(plan.items[i]);
  }
  return h;
}

// One kernel source, verbatim, in its own namespace with its entry point renamed; the macros it
// defines (config, include guards) are #undef'd after it so the next kernel starts clean.
std::string wrapped_source(const Prepared& p) {
  const std::string ns = fmt::format("attntune_k{}", p.source_index);
  const attntune_plan::LaunchFamily& plan = *p.family->plan;
  std::string s;
  s += fmt::format(
      "\n// ==== {ns}: the kernel source the tuner measured (source_hash {hash}), verbatim. The\n"
      "// namespace and the #define of each entry point let several kernels share this file: each has\n"
      "// its own types and unique extern \"C\" names ({ns}_<entry point>).\n",
      fmt::arg("ns", ns), fmt::arg("hash", p.kernel.source_hash));
  s += fmt::format("namespace {} {{\n", ns);
  if (!p.device_condition.empty())
    s += fmt::format(
        "// Arch-specific code only: `nvcc -arch={arch}` also compiles PTX for the arch without the suffix,\n"
        "// for forward compatibility, and no such PTX can hold this kernel's instructions. Those device\n"
        "// passes leave it out; the launcher refuses a GPU whose code lacks it.\n"
        "#if !defined(__CUDA_ARCH__) || {cond}\n",
        fmt::arg("arch", p.kernel_arch), fmt::arg("cond", p.device_condition));
  for (int k = 0; k < plan.kernels; ++k) s += fmt::format("#define {0} {1}_{0}\n", plan.kernel_names[k], ns);
  s += p.kernel.source;
  if (!s.empty() && s.back() != '\n') s += '\n';
  // The entry points may sit in a namespace of the family's (att::): declare them here too, where
  // the launcher looks (a C-linkage name is one function whichever namespace declares it), with
  // the family's kernel signatures.
  for (int k = 0; k < plan.kernels; ++k)
    s += fmt::format("#undef {name}\nextern \"C\" __global__ void {ns}_{name}({params});\n",
                     fmt::arg("name", plan.kernel_names[k]), fmt::arg("ns", ns),
                     fmt::arg("params", p.family->kernel_params.at(static_cast<std::size_t>(k))));
  if (!p.device_condition.empty()) s += "#endif\n";
  s += fmt::format("}}  // namespace {}\n", ns);
  std::set<std::string> entry_points;
  for (int k = 0; k < plan.kernels; ++k) entry_points.insert(plan.kernel_names[k]);
  for (const std::string& m : defined_macros(p.kernel.source))
    if (!entry_points.count(m)) s += fmt::format("#undef {}\n", m);
  return s;
}

// Each distinct source's constants, as its family's launch plan reads them.
std::string define_tables(const LibraryPlan& plan) {
  std::string out;
  for (std::size_t i : plan.sources) {
    const Prepared& p = plan.items[i];
    out += fmt::format("static const attntune_plan::Define kDefines_k{}[] = {{\n", p.source_index);
    for (const auto& [name, value] : p.kernel.launch.defines) {
      if (!is_identifier(name)) throw std::logic_error("export: a define is not an identifier");
      out += fmt::format("    {{\"{}\", {}LL}},\n", name, value);
    }
    out += "};\n";
  }
  return out;
}

std::string kernel_table(const LibraryPlan& plan) {
  std::string rows;
  for (const Prepared& p : plan.items) {
    const Problem& pr = p.item->row.problem;
    const std::string ns = fmt::format("attntune_k{}", p.source_index);
    // The label holds only integers and fixed names: it is C code, not a string from the database.
    std::string label = fmt::format("d={} {} causal={}, tuned for b={},h={},hkv={},s={},sk={}", pr.d,
                                    dtype_name(pr.dtype), pr.causal ? 1 : 0, pr.b, pr.h, pr.hkv, pr.s, pr.sk);
    if (pr.is_varlen()) label += fmt::format(",varlen={}", pr.varlen);
    if (pr.paged()) label += fmt::format(",page={}", pr.page);
    // Its variants: what it serves (integers and fixed words only, as the rest of the label).
    if (pr.windowed()) label += fmt::format(" window={},{}", pr.window_left, pr.right_bound());
    if (pr.softcapped()) label += " softcap";
    if (pr.sinks) label += " sinks";
    if (pr.split_dims()) label += fmt::format(" dv={}", pr.dv);
    if (pr.latent) label += " latent";  // serves only calls with v = k (its plan's check_latent)
    if (pr.kv_fp8) label += " kv_dtype=fp8";  // serves only calls with attntune_options.kv_dtype 1
    if (pr.qkv_fp8) label += " dtype=fp8";    // serves only calls with attntune_options.qkv_dtype 1
    if (is_backward(p)) label += " pass=bwd";  // serves attntune_attention_backward only
    std::vector<std::string> funcs;
    for (int k = 0; k < p.family->plan->kernels; ++k)
      funcs.push_back(fmt::format("reinterpret_cast<const void*>(&{0}::{0}_{1})", ns, p.family->plan->kernel_names[k]));
    // The arch passed arch_number: "sm_", digits and at most an "a".
    rows += fmt::format(
        "    {{\"{label}\", \"{arch}\", {d}, {causal}, {bf16}, {b}, {h}, {hkv}, {s}, {sk}, {entries}, {window}, "
        "{softcap}, {sinks}, {dv}, {latent}, {kv_fp8}, {qkv_fp8},\n"
        "     &{plan}, kDefines_k{index}, static_cast<int>(sizeof kDefines_k{index} / sizeof kDefines_k{index}[0]),\n"
        "     {{{funcs}}}}},\n",
        fmt::arg("label", label), fmt::arg("arch", p.kernel_arch), fmt::arg("d", pr.d),
        fmt::arg("causal", pr.causal ? 1 : 0), fmt::arg("bf16", pr.dtype == DType::kBf16 ? 1 : 0),
        fmt::arg("b", pr.b), fmt::arg("h", pr.h), fmt::arg("hkv", pr.hkv), fmt::arg("s", pr.s), fmt::arg("sk", pr.sk),
        fmt::arg("entries", served_entries(*p.family, pr)), fmt::arg("window", pr.windowed() ? 1 : 0),
        fmt::arg("softcap", pr.softcapped() ? 1 : 0), fmt::arg("sinks", pr.sinks ? 1 : 0),
        fmt::arg("dv", pr.split_dims() ? pr.dv : 0), fmt::arg("latent", pr.latent ? 1 : 0), fmt::arg("kv_fp8", pr.kv_fp8 ? 1 : 0),
        fmt::arg("qkv_fp8", pr.qkv_fp8 ? 1 : 0),
        fmt::arg("plan", p.family->plan_symbol), fmt::arg("index", p.source_index),
        fmt::arg("funcs", fmt::join(funcs, ", ")));
  }
  if (!rows.empty()) rows.pop_back();  // the template puts the newline
  return rows;
}

}  // namespace

std::string json_quoted(std::string_view s) {
  return nlohmann::json(std::string(s)).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
}

std::string c_string_literal(std::string_view ascii, std::string_view indent) {
  constexpr std::size_t kChunk = 96;
  std::string out;
  for (std::size_t i = 0; i < ascii.size() || i == 0; i += kChunk) {
    if (i > 0) out += '\n';
    out += indent;
    out += '"';
    for (char c : ascii.substr(i, kChunk)) {
      if (c < 0x20 || c > 0x7e) throw std::logic_error("c_string_literal: not printable ASCII");
      if (c == '\\' || c == '"' || c == '?') out += '\\';
      out += c;
    }
    out += '"';
    if (ascii.empty()) break;
  }
  return out;
}

nlohmann::ordered_json export_info(const std::vector<ExportItem>& items, ExportMode mode) {
  return info(plan(items), mode);
}

std::string export_source(const std::vector<ExportItem>& items, ExportMode mode) {
  const LibraryPlan p = plan(items);
  std::string out = header(p, mode);
  out += "\n";
  out += fill(embedded_file(kPrologue), {{"MIN_ARCH", std::to_string(p.min_arch * 10)},
                                         {"MIN_ARCH_DOTTED", fmt::format("{}.{}", p.min_arch / 10, p.min_arch % 10)},
                                         {"MIN_ARCH_FLAG", p.specific_archs.empty()
                                                               ? fmt::format("sm_{} or higher", p.min_arch)
                                                               : build_arch(p)}});
  for (std::size_t i : p.sources) out += wrapped_source(p.items[i]);
  out += "\n";
  // The plan executor, then each family's launch plan, their includes inlined (the kernels' own
  // copies were #undef'd with the rest of their macros, so these stand at global scope).
  std::string parts = flatten_includes(kRunPlan);
  if (std::any_of(p.families.begin(), p.families.end(), [](const Family* f) { return f->tma; }))
    parts += "#if !defined(CUDART_VERSION) || CUDART_VERSION < 12000\n"
             "#error \"attntune: this file's kernels load through TMA tensor maps: it needs CUDA 12.0 or newer\"\n"
             "#endif\n";
  for (const Family* f : p.families) parts += flatten_includes(f->launch_file);
  out += fill(embedded_file(kLauncher), {{"KERNEL_TABLE", kernel_table(p)},
                                         {"DEFINE_TABLES", define_tables(p)},
                                         {"FAMILY_LAUNCHERS", parts},
                                         {"INFO_JSON", c_string_literal(dump_ascii(info(p, mode)))}});
  return out;
}

}  // namespace attntune
