// Malformed search spaces: each is rejected with file:line:column and a message naming the problem.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.hpp"
#include "space/search_space.hpp"

namespace test_search_space_load {
using namespace attntune;

namespace {

const std::string kBad = std::string(ATTNTUNE_SOURCE_DIR) + "/tests/data/spaces/bad/";

std::string load_error(const std::string& path) {
  try {
    SearchSpace::load(path);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(loaded without error)";
}

std::string parse_error(const std::string& yaml) {
  try {
    SearchSpace::parse(yaml, "inline.yaml");
  } catch (const InputError& e) {
    return e.what();
  }
  return "(parsed without error)";
}

struct BadCase {
  const char* file;
  const char* where;    // line:column
  const char* message;  // the whole message after "file:line:column: "
};

const BadCase kBadCases[] = {
    {"syntax.yaml", "3:14", "YAML: end of sequence flow not found"},
    {"unknown_top_key.yaml", "7:1",
     "top level: unknown key 'constraint' (did you mean 'constraints'?); expected one of: family, description, "
     "archs, device_limits, problem, params, derived, constraints"},
    {"missing_params.yaml", "1:1", "missing required key 'params'"},
    {"missing_family.yaml", "1:1", "missing required key 'family'"},
    {"duplicate_key.yaml", "8:3", "duplicate key 'block_m' (first at line 6)"},
    {"string_for_list.yaml", "2:8", "archs: expected a list like [a, b]"},
    {"empty_params.yaml", "5:9", "params: no parameters"},
    {"empty_values.yaml", "7:10", "params.warps: empty list"},
    {"range_min_gt_max.yaml", "6:20", "params.block_n.range: min 128 is greater than max 32"},
    {"range_bad_step.yaml", "6:37", "params.block_n.step: step must be positive, got 0"},
    {"non_integer.yaml", "6:17", "params.block_m: expected an integer, got '12x'"},
    {"quoted_integer.yaml", "4:31", "device_limits.sm_90.max_smem_per_block: expected an integer, got the string \"232448\""},
    {"bad_enum_value.yaml", "6:33", "params.kv_load.enum: 'Ahead' is not a valid value name (lowercase letters, digits and '_')"},
    {"bad_arch.yaml", "2:16", "archs: 'sm90' is not an arch of the form sm_NN or sm_NNa"},
    {"arch_without_limits.yaml", "3:1", "device_limits: no entry for sm_89 (every arch in archs needs its limits)"},
    {"limit_keys_differ.yaml", "5:39",
     "device_limits.sm_90: 'smem_per_block' is not a limit of sm_89; all archs must have the same keys "
     "(max_smem_per_block, smem_per_sm)"},
    {"unknown_param_key.yaml", "6:30",
     "params.kv_stages: unknown key 'stp' (did you mean 'step'?); expected one of: values, range, step, pow2, enum, doc, default"},
    {"reserved_name.yaml", "7:3", "params.hkv: 'hkv' is reserved: it is a problem field"},
    {"bad_dtype.yaml", "7:17", "problem.dtype: 'fp32' is not a dtype (fp16, bf16, fp8)"},
    // Expressions: the column is that of the offending token inside the YAML line.
    {"unknown_name.yaml", "10:16", "constraint: unknown name 'wraps' (did you mean 'warps'?)"},
    {"type_error.yaml", "9:17", "derived.rows: '+' needs int operands, got int and bool"},
    {"enum_typo.yaml", "8:22", "constraint: 'bf61' is not a value of dtype (fp16, bf16, fp8)"},
    {"quoted_parse_error.yaml", "8:39", "constraint: unexpected ')' after a complete expression"},
    {"folded_expr.yaml", "9:8", "constraint: unknown name 'max_smem_per_blok' (did you mean 'max_smem_per_block'?)"},
    {"block_scalar_expr.yaml", "10:7",
     "derived.tile: unknown function 'ceil_dv' (did you mean 'ceil_div'? known: min, max, ceil_div, is_pow2, log2)"},
    {"constraint_not_bool.yaml", "8:5", "constraint: must be a bool expression, got int"},
    {"derived_shadows_param.yaml", "8:3",
     "derived.block_m: 'block_m' is already a parameter (line 6); a derived name may not shadow it"},
    {"derived_forward_ref.yaml", "8:9",
     "derived.smem: 'tile' cannot be used here: a derived quantity may use params, problem fields, device limits "
     "and earlier derived names"},
    {"problem_constraint_uses_param.yaml", "6:21",
     "problem constraint: 'block_m' cannot be used here: problem constraints may use only problem fields "
     "(b, h, hkv, s, sk, d, dtype, causal, page, varlen, window, window_left, window_right, softcap, sinks, dv, latent, kv_fp8, bwd)"},
    {"yaml_tag.yaml", "9:5", "constraint: '!q_in_regs' was read as a YAML tag; quote the expression (or write 'not' for '!')"},
    {"unquoted_ternary.yaml", "8:26", "YAML: illegal map value (quote an expression that contains ': ', such as a ternary)"},
};

}  // namespace

TEST(SearchSpaceLoad, BadFilesNameFileLineColumnAndReason) {
  for (const BadCase& c : kBadCases) {
    SCOPED_TRACE(c.file);
    const std::string path = kBad + c.file;
    EXPECT_EQ(load_error(path), path + ":" + c.where + ": " + c.message);
  }
}

TEST(SearchSpaceLoad, EveryBadFileHasACase) {
  std::size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(kBad)) {
    ++files;
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(std::any_of(std::begin(kBadCases), std::end(kBadCases), [&](const BadCase& c) { return name == c.file; }))
        << name << " is not checked";
  }
  EXPECT_EQ(files, std::size(kBadCases));
}

TEST(SearchSpaceLoad, MissingFileAndDirectory) {
  EXPECT_EQ(load_error(kBad + "nope.yaml"), kBad + "nope.yaml: no such file");
  EXPECT_EQ(load_error(kBad), kBad + ": is a directory, not a search-space YAML file");
}

namespace {
// The smallest valid space; cases below append to or alter it.
const std::string kHead =
    "family: toy\n"
    "archs: [sm_90]\n"
    "device_limits:\n"
    "  sm_90: {max_smem_per_block: 232448}\n";
}  // namespace

TEST(SearchSpaceLoad, InlineCases) {
  EXPECT_EQ(parse_error(""), "inline.yaml:1:1: empty file; expected a mapping with family, archs, device_limits and params");
  EXPECT_EQ(parse_error("- a\n- b\n"),
            "inline.yaml:1:1: expected a mapping with family, archs, device_limits and params at the top level");
  EXPECT_EQ(parse_error("family: Flash-Fwd\narchs: [sm_90]\ndevice_limits: {sm_90: {}}\nparams: {x: [1]}\n"),
            "inline.yaml:1:9: family: 'Flash-Fwd' is not a valid name (a folder under templates/: lowercase letters, "
            "digits, '_')");
  // Duplicate keys are found at any depth.
  EXPECT_EQ(parse_error(kHead + "params:\n  block_n: {range: [32, 128], step: 32, step: 64}\n"),
            "inline.yaml:6:41: duplicate key 'step' (first at line 6)");
  EXPECT_EQ(parse_error(kHead + "params:\n  x: {pow2: [5, 7]}\n"), "inline.yaml:6:13: params.x.pow2: no power of two in [5, 7]");
  EXPECT_EQ(parse_error(kHead + "params:\n  x: {range: [1, 4], pow2: [1, 4]}\n"),
            "inline.yaml:6:22: params.x: both 'range' and 'pow2'; give one of values, range, pow2, enum");
  EXPECT_EQ(parse_error(kHead + "params:\n  x: {pow2: [1, 4], step: 2}\n"),
            "inline.yaml:6:21: params.x: 'step' applies only to 'range'");
  EXPECT_EQ(parse_error(kHead + "params:\n  x: {doc: nothing}\n"),
            "inline.yaml:6:6: params.x: expected one of: values, range, pow2, enum");
  EXPECT_EQ(parse_error(kHead + "params:\n  x: [64, 64]\n"), "inline.yaml:6:11: params.x: 64 is listed twice");
  EXPECT_EQ(parse_error(kHead + "params:\n  x: [true, 1]\n"), "inline.yaml:6:13: params.x: expected true or false, got '1'");
  EXPECT_EQ(parse_error(kHead + "params:\n  x: [fast, slow]\n"),
            "inline.yaml:6:7: params.x: expected an integer, got 'fast' (named values need {enum: [...]})");
  EXPECT_EQ(parse_error(kHead + "params:\n  x: integer\n"),
            "inline.yaml:6:6: params.x: expected a list [a, b], bool, or a mapping with one of values, range, pow2, enum");
  EXPECT_EQ(parse_error(kHead + "params:\n  Block_M: [1]\n"),
            "inline.yaml:6:3: params.Block_M: 'Block_M' is not a valid parameter name (lowercase letters, digits and "
            "'_', starting with a letter)");
  EXPECT_EQ(parse_error(kHead + "params:\n  max_smem_per_block: [1]\n"),
            "inline.yaml:6:3: params.max_smem_per_block: 'max_smem_per_block' is already a device limit (line 4)");
  EXPECT_EQ(parse_error(kHead + "params:\n  min: [1]\n"), "inline.yaml:6:3: params.min: 'min' is reserved: it is a function");
  EXPECT_EQ(parse_error(kHead + "params:\n  att_x: [1]\n"),
            "inline.yaml:6:3: params.att_x: 'att_x' is reserved: names starting with att_ are the kernel renderer's "
            "(ATT_HEAD_DIM, ...)");
  // Names and enum-value constants become macros: kv = b is KV_B, as is a param kv_b.
  EXPECT_EQ(parse_error(kHead + "params:\n  kv: {enum: [a, b]}\n  kv_b: [1]\n"),
            "inline.yaml:7:3: params.kv_b: 'kv_b' is already the constant for value b of kv (line 6); both would be "
            "the macro KV_B");
  EXPECT_EQ(parse_error(kHead + "params:\n  kv_b: [1]\n  kv: {enum: [a, b]}\n"),
            "inline.yaml:7:18: params.kv.enum: 'kv_b' is already a parameter (line 6); both would be the macro KV_B");
  EXPECT_EQ(parse_error(kHead + "params:\n  x: [1]\nderived:\n  x: 2\n"),
            "inline.yaml:8:3: derived.x: 'x' is already a parameter (line 6); a derived name may not shadow it");
  EXPECT_EQ(parse_error(kHead + "params:\n  x: [1]\nderived:\n  y: 2\n  y2: 3\n  y: 4\n"),
            "inline.yaml:10:3: duplicate key 'y' (first at line 8)");
  EXPECT_EQ(parse_error(kHead + "params:\n  x: [1]\nderived:\n  y: \"x > 0 ? 'a' : 'b'\"\n"),
            "inline.yaml:8:7: derived.y: a derived quantity must be int or bool, got string");
  EXPECT_EQ(parse_error(kHead + "params:\n  x: [1]\nderived:\n  y: {expr: x + 1, unit: bytes}\n"),
            "inline.yaml:8:20: derived.y: unknown key 'unit'; expected one of: expr, doc");
  EXPECT_EQ(parse_error(kHead + "params:\n  x: [1]\nconstraints:\n  - {why: because}\n"),
            "inline.yaml:8:5: constraint: missing 'expr'");
  EXPECT_EQ(parse_error(kHead + "params:\n  x: [1]\nconstraints: x > 0\n"),
            "inline.yaml:7:14: constraints: expected a list of expressions");
  // A doubled quote inside a single-quoted scalar is one character of the expression.
  EXPECT_EQ(parse_error(kHead + "params:\n  x: [1]\nconstraints:\n  - '''a'' == ''a'' && y'\n"),
            "inline.yaml:8:24: constraint: unknown name 'y'");
  EXPECT_EQ(parse_error(kHead + "params:\n  x: [1]\nconstraints:\n  - x + 1 > 2 * maxx(x, 1)\n"),
            "inline.yaml:8:17: constraint: unknown function 'maxx' (did you mean 'max'? known: min, max, ceil_div, "
            "is_pow2, log2)");
  EXPECT_EQ(parse_error("family: toy\narchs: [sm_90, sm_90]\ndevice_limits: {sm_90: {}}\nparams: {x: [1]}\n"),
            "inline.yaml:2:16: archs: 'sm_90' is listed twice");
  EXPECT_EQ(parse_error("family: toy\narchs: [sm_90]\ndevice_limits: {sm_90: {}, sm_80: {}}\nparams: {x: [1]}\n"),
            "inline.yaml:3:28: device_limits: 'sm_80' is not in archs (sm_90)");
  EXPECT_EQ(parse_error("family: toy\narchs: [sm_89, sm_90]\ndevice_limits:\n  sm_89: {la: 1, lb: 2}\n  sm_90: {la: 1}\n"
                        "params: {x: [1]}\n"),
            "inline.yaml:5:10: device_limits.sm_90: missing 'lb'; all archs must have the same keys as sm_89 (la, lb)");
  EXPECT_EQ(parse_error(kHead + "problem:\n  causal: [maybe]\nparams: {x: [1]}\n"),
            "inline.yaml:6:12: problem.causal: expected true, false, 1 or 0, got 'maybe'");
  EXPECT_EQ(parse_error(kHead + "problem:\n  d: [64, 64]\nparams: {x: [1]}\n"),
            "inline.yaml:6:11: problem.d: 64 is listed twice");
  EXPECT_EQ(parse_error(kHead + "problem:\n  seq: [64]\nparams: {x: [1]}\n"),
            "inline.yaml:6:3: problem: unknown key 'seq'; expected one of: b, h, hkv, s, sk, d, dtype, causal, page, varlen, window, window_left, window_right, softcap, sinks, dv, latent, kv_fp8, pass, constraints");
  EXPECT_EQ(parse_error(kHead + "params:\n  x: {range: [0, 2000000]}\n"),
            "inline.yaml:6:14: params.x.range: more than 1048576 values");
}

TEST(SearchSpaceLoad, ValidSpaceReadsEveryForm) {
  const SearchSpace sp = SearchSpace::parse(
      "family: toy\n"
      "description: a toy\n"
      "archs: [sm_89, sm_90a, sm_90]\n"
      "device_limits:\n"
      "  sm_89: {lim: 1}\n  sm_90a: {lim: 3}\n  sm_90: {lim: 2}\n"
      "problem:\n  d: [128, 64]\n  causal: [0]\n"
      "params:\n"
      "  a: [128, 64]\n"
      "  bb: {range: [1, 8], step: 3}\n"
      "  c: {pow2: [3, 40], doc: powers}\n"
      "  e: bool\n"
      "  f: [true]\n"
      "  g: {enum: [x, y_2]}\n"
      "  h2: {values: [5]}\n"
      "derived:\n  two_a: a * 2\n  big: {expr: two_a > 128, doc: large}\n"
      "constraints: []\n",
      "toy.yaml");
  EXPECT_EQ(sp.family(), "toy");
  EXPECT_EQ(sp.description(), "a toy");
  EXPECT_EQ(sp.path(), "toy.yaml");
  EXPECT_EQ(sp.hash().size(), 32u);
  EXPECT_EQ(sp.default_arch(), "sm_90a");
  ASSERT_EQ(sp.params().size(), 7u);
  EXPECT_EQ(sp.params()[0].values, (std::vector<Value>{std::int64_t{128}, std::int64_t{64}}));
  EXPECT_EQ(sp.params()[1].values, (std::vector<Value>{std::int64_t{1}, std::int64_t{4}, std::int64_t{7}}));
  EXPECT_EQ(sp.params()[2].values, (std::vector<Value>{std::int64_t{4}, std::int64_t{8}, std::int64_t{16}, std::int64_t{32}}));
  EXPECT_EQ(sp.params()[2].doc, "powers");
  EXPECT_EQ(sp.params()[3].kind, ParamKind::kBool);
  EXPECT_EQ(sp.params()[3].values, (std::vector<Value>{false, true}));
  EXPECT_EQ(sp.params()[4].values, (std::vector<Value>{true}));
  EXPECT_EQ(sp.params()[5].kind, ParamKind::kEnum);
  EXPECT_EQ(sp.params()[5].values, (std::vector<Value>{std::string("x"), std::string("y_2")}));
  EXPECT_EQ(sp.params()[6].values, (std::vector<Value>{std::int64_t{5}}));
  EXPECT_EQ(sp.raw_size(), 2u * 3 * 4 * 2 * 1 * 2 * 1);
  ASSERT_EQ(sp.derived().size(), 2u);
  EXPECT_EQ(sp.derived()[1].type, ExprType::kBool);
  EXPECT_EQ(sp.derived()[1].doc, "large");
  EXPECT_EQ(sp.device_limits("sm_90a"), (std::vector<std::pair<std::string, std::int64_t>>{{"lim", 3}}));
  // The two the file declares, then the variants it does not list (window, softcap, sinks: refused).
  EXPECT_EQ(sp.problem_support().size(), 5u);
  // The hash is of the bytes: a comment changes it.
  EXPECT_NE(SearchSpace::parse(kHead + "params: {x: [1]}\n", "a").hash(),
            SearchSpace::parse(kHead + "params: {x: [1]}\n# note\n", "a").hash());
}

// A param's `default:` is the value of a config that does not name it (one recorded before the
// param existed): check, derive, parse_config and the domain accept such a config as that value.
TEST(SearchSpaceLoad, ParamDefaultNamesConfigsRecordedBeforeIt) {
  const SearchSpace sp = SearchSpace::parse(kHead +
                                                "params:\n"
                                                "  a: [64, 128]\n"
                                                "  packed: {values: [false, true], default: false}\n"
                                                "  mode: {enum: [x, y], default: y, doc: a mode}\n"
                                                "  n: {range: [1, 3], default: 2}\n"
                                                "derived:\n  rows: \"packed ? a * 2 : a\"\n"
                                                "constraints:\n  - {expr: \"!packed || a == 64\", why: w}\n",
                                            "toy.yaml");
  ASSERT_EQ(sp.params().size(), 4u);
  EXPECT_FALSE(sp.params()[0].default_value);
  EXPECT_EQ(sp.params()[1].default_value, Value{false});
  EXPECT_EQ(sp.params()[2].default_value, Value{std::string("y")});
  EXPECT_EQ(sp.params()[2].doc, "a mode");
  EXPECT_EQ(sp.params()[3].default_value, Value{std::int64_t{2}});
  const Problem p = Problem::parse("b=1,h=1,s=128,d=64,dtype=bf16,causal=0");
  const std::string arch = sp.default_arch();
  // An old config (a alone): valid, and derived as packed=false.
  const Config old = {{"a", std::int64_t{128}}};
  EXPECT_EQ(sp.check(old, p, arch), std::nullopt);
  EXPECT_EQ(sp.derive(old, p, arch).front(), (std::pair<std::string, std::int64_t>{"rows", 128}));
  // A default is a value like any other: a config naming another is checked as ever.
  EXPECT_EQ(sp.check({{"a", std::int64_t{128}}, {"packed", true}}, p, arch), std::optional<std::string>("w"));
  // a has no default: a config without it is refused as before.
  EXPECT_EQ(sp.check({{"packed", false}}, p, arch), std::optional<std::string>("missing parameter a"));
  // parse_config fills the defaults in.
  EXPECT_EQ(sp.parse_config("a=64"),
            (Config{{"a", std::int64_t{64}}, {"packed", false}, {"mode", std::string("y")}, {"n", std::int64_t{2}}}));
  EXPECT_EQ(sp.parse_config("a=64,mode=x").at("mode"), Value{std::string("x")});
  // Enumerated configs name every param.
  for (const Config& c : sp.enumerate(p, arch)) EXPECT_EQ(c.size(), 4u);
  // A default must be a value of the domain, written as the domain's are.
  EXPECT_EQ(parse_error(kHead + "params:\n  x: {values: [1, 2], default: 5}\n"),
            "inline.yaml:6:32: params.x.default: default 5 is not in the domain (1, 2)");
  EXPECT_EQ(parse_error(kHead + "params:\n  x: {default: 1}\n"),
            "inline.yaml:6:6: params.x: expected one of: values, range, pow2, enum");
  EXPECT_EQ(SearchSpace::parse(kHead + "params:\n  x: {values: [false, true], default: 1}\n", "t").params()[0].default_value,
            Value{true});
}
}  // namespace test_search_space_load
