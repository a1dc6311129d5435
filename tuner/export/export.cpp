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

// How the launcher calls a family's entry point: its parameters after the rename (the launcher
// declares it with them), the launch part (templates/export/launch_*.cuh) and the function of it
// the kernel table names, with the template arguments it takes from the kernel's namespace.
struct LaunchKind {
  const char* params;       // the entry point's parameter list, in the kernel's namespace
  const char* part;         // embedded file
  const char* launch;       // "launch_plain<{ns}::AttnParams>" (fmt, {ns}: the kernel's namespace)
  const char* check;        // the part's extra checks, or "0"
};

// One AttnParams (flash_fwd_mma, and any family whose launch geometry has no tensor maps).
constexpr LaunchKind kPlainLaunch = {"const AttnParams p", "templates/export/launch_plain.cuh",
                                     "&launch_plain<{ns}::AttnParams>", "0"};
// AttnParams and the tensor maps of Q, K and V (flash_fwd_wgmma: templates/flash_fwd_wgmma/kernel.cu).
constexpr LaunchKind kTmaLaunch = {"const AttnParams p, const __grid_constant__ att::TmaMaps maps",
                                   "templates/export/launch_tma.cuh",
                                   "&launch_tma<{ns}::AttnParams, {ns}::att::TmaMaps>", "&check_tma"};

// The launch of a family's kernel, by its launch geometry: tensor maps mean the TMA family's
// signature (the one family that has them; another would need its own kind here).
const LaunchKind& launch_kind(const std::string& family, const LaunchGeometry& g) {
  if (g.tma.q_rows == 0) return kPlainLaunch;
  if (family != "flash_fwd_wgmma")
    throw InputError(fmt::format("export: family {} launches with TMA tensor maps, which export knows only for "
                                 "flash_fwd_wgmma",
                                 json_quoted(family)));
  return kTmaLaunch;
}

bool is_identifier(std::string_view s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

// "sm_90" -> 90, "sm_90a" -> 90; InputError for anything else (the arch reaches the build line).
int arch_number(const std::string& arch) {
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
  LaunchGeometry geometry;
  const LaunchKind* launch = nullptr;
  // What the tuner built the kernel for (space_arch_for_device): the result's arch, or its
  // arch-specific variant ("sm_90a") where the space lists that.
  std::string kernel_arch;
  // The space lists only arch-specific targets ("sm_90a"): the preprocessor condition under which
  // a device pass can hold the kernel ("defined(__CUDA_ARCH_FEAT_SM90_ALL)"); "" otherwise.
  std::string device_condition;
  std::int64_t block_m = 0;
  int source_index = 0;  // which distinct source (namespace attntune_kN)
};

struct Plan {
  std::vector<Prepared> items;
  std::vector<std::size_t> sources;  // items holding each distinct source, first use order
  std::string dtype, arch;
  int min_arch = 0;  // lowest arch every space supports, e.g. 80
  // Spaces that list only arch-specific targets ("sm_90a": wgmma, setmaxnreg): each such list,
  // one of whose archs the file must be compiled for.
  std::vector<std::vector<std::string>> specific_archs;
  std::vector<const LaunchKind*> launch_kinds;  // used by some kernel, first use order
};

bool is_arch_specific(const std::string& arch) { return !arch.empty() && arch.back() == 'a'; }

Plan plan(const std::vector<ExportItem>& items) {
  if (items.empty()) throw std::logic_error("export: no kernels");
  Plan p;
  std::map<std::string, int> by_hash;
  for (const ExportItem& it : items) {
    if (!it.space) throw std::logic_error("export: an item without its space");
    const BestRow& r = it.row;
    if (it.space->family() != r.family)
      throw InputError(fmt::format("export: the search space is for {}, the result for {}", json_quoted(it.space->family()),
                                   json_quoted(r.family)));
    arch_number(r.arch);
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
    prep.geometry = launch_geometry(*it.space, r.config, r.problem, build);
    prep.launch = &launch_kind(r.family, prep.geometry);
    if (std::find(p.launch_kinds.begin(), p.launch_kinds.end(), prep.launch) == p.launch_kinds.end())
      p.launch_kinds.push_back(prep.launch);
    prep.block_m = std::get<std::int64_t>(r.config.at("block_m"));
    if (!is_identifier(prep.kernel.kernel_name)) throw std::logic_error("export: kernel name is not an identifier");
    const auto [pos, fresh] = by_hash.emplace(prep.kernel.source_hash, static_cast<int>(by_hash.size()));
    prep.source_index = pos->second;
    p.items.push_back(std::move(prep));
    if (fresh) p.sources.push_back(p.items.size() - 1);
    // The file needs what every space needs: the highest of the spaces' lowest archs.
    int space_min = 0;
    bool all_specific = !it.space->archs().empty();
    std::vector<std::string> defined;  // the device passes that hold arch-specific code of the space
    for (const std::string& a : it.space->archs()) {
      const int n = arch_number(a);
      if (space_min == 0 || n < space_min) space_min = n;
      all_specific = all_specific && is_arch_specific(a);
      defined.push_back(fmt::format("defined(__CUDA_ARCH_FEAT_SM{}_ALL)", n));
    }
    p.min_arch = std::max(p.min_arch, space_min);
    if (all_specific) p.items.back().device_condition = fmt::format("{}", fmt::join(defined, " || "));
    if (all_specific && std::find(p.specific_archs.begin(), p.specific_archs.end(), it.space->archs()) ==
                            p.specific_archs.end())
      p.specific_archs.push_back(it.space->archs());
  }
  p.dtype = dtype_name(items.front().row.problem.dtype);
  p.arch = items.front().row.arch;
  for (const ExportItem& it : items) {
    if (dtype_name(it.row.problem.dtype) != p.dtype)
      throw InputError(
          "export: the kernels are of different dtypes (fp16 and bf16), but attntune_attention_forward has no "
          "dtype argument: export one file per dtype (--dtype)");
    if (it.row.arch != p.arch)
      throw InputError(fmt::format("export: the results were measured on different archs ({} and {}): export one file "
                                   "per arch (--arch)",
                                   json_quoted(p.arch), json_quoted(it.row.arch)));
  }
  return p;
}

nlohmann::ordered_json problem_json(const Problem& p) {
  const nlohmann::json j = p.json();
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const char* key : {"b", "h", "hkv", "s", "sk", "d", "dtype", "causal"}) out[key] = j.at(key);
  return out;
}

nlohmann::ordered_json launch_json(const Prepared& p) {
  nlohmann::ordered_json j = {
      {"block_m", p.block_m}, {"threads", p.geometry.block}, {"smem_bytes", p.geometry.smem_bytes}};
  const TmaSpec& t = p.geometry.tma;
  if (t.q_rows != 0 || p.geometry.persistent) j["persistent"] = p.geometry.persistent;
  if (t.q_rows != 0) j["tma_box_rows"] = {{"q", t.q_rows}, {"kv", t.kv_rows}};
  if (p.geometry.cluster > 1) j["cluster"] = p.geometry.cluster;
  return j;
}

// What the header says of a kernel's launch.
std::string launch_text(const Prepared& p) {
  const unsigned c = p.geometry.cluster;
  const std::string tiles =
      c > 1 ? fmt::format("(ceil(seqlen_q / {}) rounded up to a multiple of {}, heads_q, batch)", p.block_m, c)
            : fmt::format("(ceil(seqlen_q / {}), heads_q, batch)", p.block_m);
  std::string s = p.geometry.persistent
                      ? fmt::format("persistent grid: min(work tiles {}, SMs) CTAs", tiles)
                      : fmt::format("grid {}", tiles);
  if (c > 1)
    s += fmt::format(" in {}-CTA clusters sharing each K/V load (TMA multicast), as many as fit on the device at once",
                     c);
  s += fmt::format(", {} threads, {} bytes of dynamic shared memory", p.geometry.block, p.geometry.smem_bytes);
  const TmaSpec& t = p.geometry.tma;
  if (t.q_rows != 0)
    s += fmt::format(", TMA tensor maps with boxes of 64 x {} (q) and 64 x {} (k, v)", t.q_rows, t.kv_rows);
  if (p.geometry.split_tail)
    s += "; the last partial round of work tiles shared out by K/V iterations (a workspace this file keeps per "
         "device and stream, allocated on a stream's first such call)";
  if (p.geometry.dynamic_tiles)
    s += "; work tiles taken from a counter, longest first (two ints this file keeps per device and stream, "
         "allocated on a stream's first such call)";
  return s;
}

nlohmann::ordered_json item_json(const Prepared& p) {
  const BestRow& r = p.item->row;
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  for (const auto& [k, v] : r.config) std::visit([&](const auto& x) { config[k] = x; }, v);
  return {{"template", r.family},
          {"config", config},
          {"problem", problem_json(r.problem)},
          {"gpu", r.gpu},
          {"arch", r.arch},
          {"median_us", r.median_us},
          {"tflops", r.tflops},
          {"max_abs_err", r.max_abs_err},
          {"campaign", r.campaign},
          {"evaluated_at", r.evaluated_at},
          {"source_hash", p.kernel.source_hash},
          {"launch", launch_json(p)}};
}

nlohmann::ordered_json info(const Plan& plan, ExportMode mode) {
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
  line("launch", launch_text(p));
  return out;
}

// The -arch of the build line: the arch the results were measured on, its arch-specific variant
// ("sm_90a") where a space lists only such targets.
std::string build_arch(const Plan& plan) {
  if (plan.specific_archs.empty() || is_arch_specific(plan.arch)) return plan.arch;
  const std::vector<std::string>& archs = plan.specific_archs.front();
  const std::string same = plan.arch + "a";
  return std::find(archs.begin(), archs.end(), same) != archs.end() ? same : archs.front();
}

std::string header(const Plan& plan, ExportMode mode) {
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
  if (std::find(plan.launch_kinds.begin(), plan.launch_kinds.end(), &kTmaLaunch) != plan.launch_kinds.end())
    h += "// Q, K and V are loaded through TMA tensor maps, encoded for each call with cuTensorMapEncodeTiled,\n"
         "// which the CUDA runtime hands over (cudaGetDriverEntryPoint): no -lcuda; CUDA 12.0 or newer.\n//\n";
  h += fmt::format(
      "// Element type: {} for q, k, v and out (not checked: the launcher sees void pointers). Tensors are\n"
      "// [batch, heads, seqlen, head_dim] with strides in elements {{batch, head, row}} and the last dim\n"
      "// contiguous, so [B,H,S,D] and [B,S,H,D] both work without copies; q, k, v and out 16-byte aligned,\n"
      "// strides multiples of 8 elements; lse NULL or [batch, heads_q, seqlen_q] fp32 (natural log).\n//\n",
      plan.dtype);
  h += "// C entry points (extern \"C\", at the end of this file):\n"
       "//   int attntune_attention_forward(q, k, v, out, lse, batch, heads_q, heads_kv, seqlen_q, seqlen_k,\n"
       "//       head_dim, q_strides, k_strides, v_strides, o_strides, softmax_scale, is_causal, stream)\n"
       "//     -> 0, ATTNTUNE_UNSUPPORTED (1000) with the reason in attntune_last_error(), or a cudaError_t\n"
       "//   const char* attntune_kernel_info(void)   this provenance as JSON\n"
       "//   const char* attntune_last_error(void)    reason for the last nonzero return (per thread)\n"
       "//   int attntune_select_kernel(head_dim, is_causal, batch, heads_q, heads_kv, seqlen_q, seqlen_k)\n"
       "//     -> index in kernel_info's \"kernels\" of the kernel those sizes run, or -1\n//\n";
  if (mode == ExportMode::kAllBest)
    h += "// Dispatch: the kernels built for head_dim and is_causal; of those, the one tuned for the nearest\n"
         "// sequence lengths (by ratio), then the same GQA group size, then the nearest batch * heads.\n//\n";
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
  const std::string& name = p.kernel.kernel_name;
  std::string s;
  s += fmt::format(
      "\n// ==== {ns}: the kernel source the tuner measured (source_hash {hash}), verbatim. The\n"
      "// namespace and the #define of its entry point let several kernels share this file: each has\n"
      "// its own types and a unique extern \"C\" name ({ns}_{name}).\n",
      fmt::arg("ns", ns), fmt::arg("hash", p.kernel.source_hash), fmt::arg("name", name));
  s += fmt::format("namespace {} {{\n", ns);
  if (!p.device_condition.empty())
    s += fmt::format(
        "// Arch-specific code only: `nvcc -arch={arch}` also compiles PTX for the arch without the suffix,\n"
        "// for forward compatibility, and no such PTX can hold this kernel's instructions. Those device\n"
        "// passes leave it out; the launcher refuses a GPU whose code lacks it.\n"
        "#if !defined(__CUDA_ARCH__) || {cond}\n",
        fmt::arg("arch", p.kernel_arch), fmt::arg("cond", p.device_condition));
  s += fmt::format("#define {} {}_{}\n", name, ns, name);
  s += p.kernel.source;
  if (!s.empty() && s.back() != '\n') s += '\n';
  // The entry point may sit in a namespace of the family's (att::): declare it here too, where the
  // launcher looks (a C-linkage name is one function whichever namespace declares it), with the
  // family's kernel signature (AttnParams of templates/common/attn_params.h, then what the family's
  // launch kind adds).
  s += fmt::format("#undef {name}\nextern \"C\" __global__ void {ns}_{name}({params});\n",
                   fmt::arg("name", name), fmt::arg("ns", ns), fmt::arg("params", p.launch->params));
  if (!p.device_condition.empty()) s += "#endif\n";
  s += fmt::format("}}  // namespace {}\n", ns);
  for (const std::string& m : defined_macros(p.kernel.source))
    if (m != name) s += fmt::format("#undef {}\n", m);
  return s;
}

std::string kernel_table(const Plan& plan) {
  std::string rows;
  for (const Prepared& p : plan.items) {
    const Problem& pr = p.item->row.problem;
    const std::string ns = fmt::format("attntune_k{}", p.source_index);
    // The label holds only integers and fixed names: it is C code, not a string from the database.
    const std::string label = fmt::format("d={} {} causal={}, tuned for b={},h={},hkv={},s={},sk={}", pr.d,
                                          dtype_name(pr.dtype), pr.causal ? 1 : 0, pr.b, pr.h, pr.hkv, pr.s, pr.sk);
    // The arch passed arch_number: "sm_", digits and at most an "a".
    rows += fmt::format(
        "    {{\"{label}\", \"{arch}\", {d}, {causal}, {bf16}, {b}, {h}, {hkv}, {s}, {sk}, {block_m}, {threads}, "
        "{smem}, {persistent}, {q_rows}, {kv_rows}, {split}, {cluster},\n"
        "     reinterpret_cast<const void*>(&{ns}::{ns}_{name}), {check}, {launch}}},\n",
        fmt::arg("label", label), fmt::arg("arch", p.kernel_arch), fmt::arg("d", pr.d),
        fmt::arg("causal", pr.causal ? 1 : 0), fmt::arg("bf16", pr.dtype == DType::kBf16 ? 1 : 0),
        fmt::arg("b", pr.b), fmt::arg("h", pr.h), fmt::arg("hkv", pr.hkv), fmt::arg("s", pr.s), fmt::arg("sk", pr.sk),
        fmt::arg("block_m", p.block_m), fmt::arg("threads", p.geometry.block), fmt::arg("smem", p.geometry.smem_bytes),
        fmt::arg("persistent", p.geometry.persistent ? 1 : 0), fmt::arg("q_rows", p.geometry.tma.q_rows),
        fmt::arg("kv_rows", p.geometry.tma.kv_rows), fmt::arg("split", p.geometry.split_tail ? 1 : 0),
        fmt::arg("cluster", p.geometry.cluster), fmt::arg("ns", ns), fmt::arg("name", p.kernel.kernel_name),
        fmt::arg("check", p.launch->check),
        fmt::arg("launch", fmt::format(fmt::runtime(p.launch->launch), fmt::arg("ns", ns))));
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
  const Plan p = plan(items);
  std::string out = header(p, mode);
  out += "\n";
  out += fill(embedded_file(kPrologue), {{"MIN_ARCH", std::to_string(p.min_arch * 10)},
                                         {"MIN_ARCH_DOTTED", fmt::format("{}.{}", p.min_arch / 10, p.min_arch % 10)},
                                         {"MIN_ARCH_FLAG", p.specific_archs.empty()
                                                               ? fmt::format("sm_{} or higher", p.min_arch)
                                                               : build_arch(p)}});
  for (std::size_t i : p.sources) out += wrapped_source(p.items[i]);
  out += "\n";
  std::string parts;
  for (const LaunchKind* k : p.launch_kinds) parts += embedded_file(k->part);
  out += fill(embedded_file(kLauncher), {{"KERNEL_TABLE", kernel_table(p)},
                                         {"FAMILY_LAUNCHERS", parts},
                                         {"INFO_JSON", c_string_literal(dump_ascii(info(p, mode)))}});
  return out;
}

}  // namespace attntune
