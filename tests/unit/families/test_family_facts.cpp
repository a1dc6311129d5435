// What a family states in several places agrees (ARCHITECTURE.md, "Adding a family"): for every
// built-in family, its name is its launch plan's, its folder's and its YAML's; its plan symbol is
// the LaunchFamily its launch.h defines under that name; its kernel names are the extern "C" __global__
// functions of its kernel.cu, and its kernel_params (what the export declares them with) are their
// parameter lists; its files are embedded and their includes resolve. And the decode/prefill
// boundary of query rows is one number: flash_decode's kDecodeMaxSeqlenQ, which its launch plan
// refuses past, and which the spaces, the PyTorch ops, plan and the tools agree with. A newcomer whose
// facts disagree gets a failing test naming the disagreement.
#include <cctype>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "core/embedded.hpp"
#include "core/error.hpp"
#include "families/family.hpp"
#include "service/plan.hpp"
#include "space/search_space.hpp"
#include "templates/flash_decode/launch.h"
#include "templates/flash_fwd_mma/launch.h"
#include "tests/common/plan_call.hpp"

namespace test_family_facts {
using namespace attntune;

namespace {

std::string read_source(const std::string& path) {
  std::ifstream in(std::string(ATTNTUNE_SOURCE_DIR) + "/" + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The text without // comments (kernel sources hold no "//" inside strings).
std::string without_comments(const std::string& text) {
  std::string out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out += line.substr(0, line.find("//")) + "\n";
  return out;
}

// From `open` (a '(' of text) to its matching ')': what is between.
std::string balanced(const std::string& text, std::size_t open, std::size_t* end) {
  int depth = 0;
  for (std::size_t i = open; i < text.size(); ++i) {
    if (text[i] == '(') ++depth;
    if (text[i] == ')' && --depth == 0) {
      *end = i + 1;
      return text.substr(open + 1, i - open - 1);
    }
  }
  *end = text.size();
  return text.substr(open + 1);
}

struct KernelDef {
  std::string name, params;
};

// The extern "C" __global__ functions a kernel source defines, in order, with their parameter
// lists: `extern "C" __global__ void [__launch_bounds__(...)] [MACROS] name(params)`.
std::vector<KernelDef> global_kernels(const std::string& source) {
  const std::string text = without_comments(source);
  std::vector<KernelDef> out;
  const std::string mark = "extern \"C\" __global__ void";
  for (std::size_t at = text.find(mark); at != std::string::npos; at = text.find(mark, at + 1)) {
    std::size_t i = at + mark.size();
    for (;;) {
      while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
      std::size_t j = i;
      while (j < text.size() && (std::isalnum(static_cast<unsigned char>(text[j])) || text[j] == '_')) ++j;
      const std::string word = text.substr(i, j - i);
      std::size_t k = j;
      while (k < text.size() && std::isspace(static_cast<unsigned char>(text[k]))) ++k;
      if (word.empty()) break;
      if (k < text.size() && text[k] == '(') {
        std::size_t end = 0;
        const std::string inside = balanced(text, k, &end);
        if (word == "__launch_bounds__") {
          i = end;
          continue;
        }
        out.push_back({word, inside});
        break;
      }
      i = j;  // a macro without arguments (ATT_CLUSTER_DIMS)
    }
  }
  return out;
}

// A parameter list as types only, one spelling: namespace att:: dropped (the kernels are inside it,
// the export declares them outside), each parameter's name dropped, spaces collapsed.
std::vector<std::string> parameter_types(const std::string& params) {
  static const std::set<std::string> qualifiers = {"const", "volatile", "__grid_constant__", "__restrict__"};
  std::vector<std::string> out;
  std::string list = std::regex_replace(params, std::regex(R"(\batt::)"), "");
  std::stringstream ss(list);
  for (std::string p; std::getline(ss, p, ',');) {
    static const std::regex token(R"([A-Za-z_][A-Za-z0-9_:]*|\*|&)");
    std::vector<std::string> tokens;
    for (std::sregex_iterator it(p.begin(), p.end(), token), e; it != e; ++it)
      tokens.push_back(it->str());
    int names = 0;
    for (const std::string& t : tokens) names += !qualifiers.count(t) && t != "*" && t != "&";
    if (names >= 2)  // type and name: drop the name
      for (auto t = tokens.rbegin(); t != tokens.rend(); ++t)
        if (!qualifiers.count(*t) && *t != "*" && *t != "&") {
          tokens.erase(std::next(t).base());
          break;
        }
    out.push_back(fmt::format("{}", fmt::join(tokens, " ")));
  }
  return out;
}

// Every disagreement among a family's facts, one line each; empty when they agree.
std::vector<std::string> fact_errors(const Family& f) {
  std::vector<std::string> errors;
  auto fail = [&](std::string s) { errors.push_back(f.name + ": " + std::move(s)); };
  if (!f.plan) {
    fail("no launch plan");
    return errors;
  }
  const attntune_plan::LaunchFamily& plan = *f.plan;
  if (plan.name != f.name) fail(fmt::format("its launch plan is named {}", plan.name));
  const std::string folder = "templates/" + f.name + "/";
  if (f.main_file != folder + "kernel.cu") fail("main_file " + f.main_file + " is not " + folder + "kernel.cu");
  if (f.launch_file != folder + "launch.h") fail("launch_file " + f.launch_file + " is not " + folder + "launch.h");
  for (const std::string& file : {f.main_file, f.launch_file}) {
    if (!embedded_files().count(file)) {
      fail(file + " is not embedded");
      continue;
    }
    try {
      flatten_includes(file);
    } catch (const std::exception& e) {
      fail(file + ": an include does not resolve: " + e.what());
    }
  }
  if (errors.size()) return errors;

  // The plan symbol: "attntune_plan::kX", a LaunchFamily that launch.h makes under the family's name.
  const std::string ns = "attntune_plan::";
  if (f.plan_symbol.rfind(ns, 0) != 0) fail("plan_symbol " + f.plan_symbol + " is not in namespace attntune_plan");
  const std::string launch = without_comments(std::string(embedded_file(f.launch_file)));
  std::smatch m;
  const std::regex made("LaunchFamily\\s+" + f.plan_symbol.substr(std::min(ns.size(), f.plan_symbol.size())) +
                        "\\s*=\\s*make_family\\s*<[^>]*>\\s*\\(\\s*\"([^\"]*)\"");
  if (!std::regex_search(launch, m, made))
    fail(f.launch_file + " defines no LaunchFamily " + f.plan_symbol + " = make_family<...>(\"...\"");
  else if (m[1] != f.name)
    fail(fmt::format("{} makes {} under the name {}", f.launch_file, f.plan_symbol, m[1].str()));

  // Kernel names and signatures against the extern "C" __global__ functions of kernel.cu, its
  // includes inlined (what a build compiles).
  const std::vector<KernelDef> defs = global_kernels(flatten_includes(f.main_file));
  std::vector<std::string> defined, named;
  for (const KernelDef& d : defs) defined.push_back(d.name);
  for (int k = 0; k < plan.kernels; ++k) named.push_back(plan.kernel_names[k] ? plan.kernel_names[k] : "(null)");
  if (std::multiset<std::string>(defined.begin(), defined.end()) != std::multiset<std::string>(named.begin(), named.end()))
    fail(fmt::format("the plan's kernels are {}; {} defines {}", fmt::join(named, ", "), f.main_file,
                     fmt::join(defined, ", ")));
  if (f.kernel_params.size() != static_cast<std::size_t>(plan.kernels))
    fail(fmt::format("{} kernel_params for {} kernels", f.kernel_params.size(), plan.kernels));
  for (std::size_t k = 0; k < f.kernel_params.size() && k < named.size(); ++k)
    for (const KernelDef& d : defs)
      if (d.name == named[k] && parameter_types(d.params) != parameter_types(f.kernel_params[k]))
        fail(fmt::format("kernel_params of {} are ({}); {} defines it with ({})", d.name, f.kernel_params[k],
                         f.main_file, d.params));

  // Its space: search_spaces/<name>.yaml, embedded, for this family.
  const std::string yaml = "search_spaces/" + f.name + ".yaml";
  if (!embedded_files().count(yaml)) {
    fail(yaml + " is not embedded");
  } else {
    const SearchSpace space = SearchSpace::parse(std::string(embedded_file(yaml)), yaml);
    if (space.family() != f.name) fail(yaml + " says family: " + space.family());
  }
  return errors;
}

TEST(FamilyFacts, EveryBuiltInFamilysFactsAgree) {
  std::set<std::string> names;
  for (const Family* f : builtin_families()) {
    EXPECT_TRUE(names.insert(f->name).second) << f->name << " is registered twice";
    EXPECT_EQ(&builtin_family(f->name), f);
    const std::vector<std::string> errors = fact_errors(*f);
    EXPECT_TRUE(errors.empty()) << fmt::format("{}", fmt::join(errors, "\n"));
    // A README that says what the family is.
    EXPECT_FALSE(read_source("templates/" + f->name + "/README.md").empty()) << f->name << " has no README.md";
  }
  EXPECT_EQ(names.size(), 6u) << "a new family: add it to ARCHITECTURE.md's list, then raise this count";
}

TEST(FamilyFacts, TheCheckNamesEachDisagreement) {
  const Family& real = builtin_family("flash_decode");
  auto errors_of = [](const Family& f) { return fmt::format("{}", fmt::join(fact_errors(f), "\n")); };
  ASSERT_EQ(errors_of(real), "");

  Family f = real;
  f.kernel_params[1] = "const att::DecodeParams p";  // the combine kernel takes the maps too
  EXPECT_NE(errors_of(f).find("kernel_params of flash_decode_combine"), std::string::npos) << errors_of(f);

  f = real;
  f.kernel_params.pop_back();
  EXPECT_NE(errors_of(f).find("1 kernel_params for 2 kernels"), std::string::npos) << errors_of(f);

  f = real;
  f.plan_symbol = "attntune_plan::kFlashFwdMma";  // another family's plan
  EXPECT_NE(errors_of(f).find("defines no LaunchFamily attntune_plan::kFlashFwdMma"), std::string::npos) << errors_of(f);

  f = real;
  f.plan = &attntune_plan::kFlashFwdMma;
  EXPECT_NE(errors_of(f).find("its launch plan is named flash_fwd_mma"), std::string::npos) << errors_of(f);
  f.main_file = "templates/flash_decode/kernel.cuh";
  EXPECT_NE(errors_of(f).find("main_file templates/flash_decode/kernel.cuh is not"), std::string::npos)
      << errors_of(f);

  // A plan naming a kernel the source lacks.
  static constexpr attntune_plan::LaunchFamily renamed = attntune_plan::make_family<attntune_plan::FlashDecodeLaunch>(
      "flash_decode", attntune_plan::kEntryDense, 2, "flash_decode", "flash_decode_merge");
  f = real;
  f.plan = &renamed;
  EXPECT_NE(errors_of(f).find("the plan's kernels are flash_decode, flash_decode_merge"), std::string::npos)
      << errors_of(f);
}

TEST(FamilyFacts, ReadsKernelDefinitionsAsTheExportDeclaresThem) {
  const auto defs = global_kernels(
      "// extern \"C\" __global__ void commented(int)\n"
      "extern \"C\" __global__ void __launch_bounds__(T::kThreads, (1)) CLUSTER_DIMS\n"
      "    k0(const AttnParams p, const __grid_constant__ TmaMaps maps) {}\n"
      "extern \"C\" __global__ void k1(const att::AttnParams p, int* order) {}\n");
  ASSERT_EQ(defs.size(), 2u);
  EXPECT_EQ(defs[0].name, "k0");
  EXPECT_EQ(defs[1].name, "k1");
  EXPECT_EQ(parameter_types(defs[0].params),
            parameter_types("const AttnParams q, const __grid_constant__ att::TmaMaps m"));
  EXPECT_EQ(parameter_types(defs[1].params), (std::vector<std::string>{"const AttnParams", "int *"}));
  EXPECT_EQ(parameter_types("const __grid_constant__ DecodeMaps"), parameter_types("const __grid_constant__ DecodeMaps maps"));
  EXPECT_NE(parameter_types("const AttnParams p, int* order"), parameter_types("const AttnParams p, int order"));
}

// ---- the decode/prefill boundary -----------------------------------------------------------------

constexpr int kN = attntune_plan::kDecodeMaxSeqlenQ;

Problem paged(int s) { return Problem::parse(fmt::format("b=4,h=32,hkv=8,s={},sk=8192,d=128,dtype=bf16,causal=1,page=64", s)); }
Problem dense(int s) { return Problem::parse(fmt::format("b=4,h=32,hkv=8,s={},sk=8192,d=128,dtype=bf16,causal=1", s)); }

bool serves(const SearchSpace& space, const Problem& p, const std::string& arch) {
  try {
    space.check_problem(p, arch);
    return true;
  } catch (const InputError&) {
    return false;
  }
}

TEST(DecodeBoundary, FlashDecodesPlanAndSpaceTakeUpToTheBoundaryAndThePrefillSpacesPagedProblemsPastIt) {
  using attntune::testing::space_of;
  const SearchSpace decode = space_of("flash_decode"), mma = space_of("flash_fwd_mma"), wgmma = space_of("flash_fwd_wgmma");
  EXPECT_TRUE(serves(decode, dense(kN), "sm_90"));
  EXPECT_TRUE(serves(decode, paged(kN), "sm_90"));
  EXPECT_FALSE(serves(decode, dense(kN + 1), "sm_90"));
  EXPECT_FALSE(serves(decode, paged(kN + 1), "sm_90"));
  for (const auto& [space, arch] : {std::pair{&mma, "sm_90"}, std::pair{&wgmma, "sm_90a"}}) {
    EXPECT_FALSE(serves(*space, paged(kN), arch)) << space->family() << ": a paged problem of " << kN << " rows";
    EXPECT_TRUE(serves(*space, paged(kN + 1), arch)) << space->family() << ": chunked prefill of " << kN + 1 << " rows";
  }

  // The plan of a flash_decode build: kN rows planned, kN + 1 refused.
  const Config c = attntune::testing::first_config(decode, dense(kN), "sm_90", [](const Config&) { return true; });
  ASSERT_FALSE(c.empty());
  const RenderedKernel k = render_kernel(decode, c, dense(kN), "sm_90");
  const auto dev = attntune::testing::FakeDevice{}.device();
  std::string why;
  EXPECT_TRUE(plan_call(k.launch, attntune::testing::dense_call_of(dense(kN)), dev, &why)) << why;
  EXPECT_FALSE(plan_call(k.launch, attntune::testing::dense_call_of(dense(kN + 1)), dev, &why));
  EXPECT_NE(why.find(fmt::format("1..{}", kN)), std::string::npos) << why;
}

// The first match of `pattern`'s group 1 in a source file, as an int; -1 when it does not match.
int number_in(const std::string& path, const std::string& pattern) {
  std::smatch m;
  const std::string text = read_source(path);
  return std::regex_search(text, m, std::regex(pattern)) ? std::stoi(m[1]) : -1;
}

TEST(DecodeBoundary, TheOpsAndToolsSayTheSameNumber) {
  // The PyTorch package's regimes (templates/torch/: self-contained, so a copy of the number).
  EXPECT_EQ(number_in("templates/torch/attntune/_ops.cpp", R"(constexpr int kDecodeMaxQ = (\d+);)"), kN);
  EXPECT_EQ(number_in("templates/torch/attntune/__init__.py", R"(\nDECODE_MAX_SEQLEN_Q = (\d+)\n)"), kN);
  EXPECT_EQ(number_in("tools/compare_sdpa.py", R"(\nDECODE_MAX_S = (\d+) )"), kN);
  // plan --kv-dtype fp8's decode problems (the decode steps flash_decode reads an FP8 cache for).
  EXPECT_EQ(kPlanDecodeMaxQ, kN);
  // ... and each decides by its constant.
  const struct {
    const char* path;
    const char* use;
  } uses[] = {{"templates/torch/attntune/_ops.cpp", "<= kDecodeMaxQ"},
              {"templates/torch/attntune/__init__.py", "<= DECODE_MAX_SEQLEN_Q"},
              {"templates/torch/attntune/__init__.py", "> DECODE_MAX_SEQLEN_Q"},
              {"tools/compare_sdpa.py", "<= DECODE_MAX_S"}};
  for (const auto& u : uses)
    EXPECT_NE(read_source(u.path).find(u.use), std::string::npos) << u.path << " no longer compares " << u.use;
}

}  // namespace
}  // namespace test_family_facts
