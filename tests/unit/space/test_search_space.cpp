// Search-space semantics: enumeration against an independent brute force, check(), derive(),
// parse_config() and problem support.
#include <gtest/gtest.h>

#include <chrono>
#include <set>

#include <fmt/format.h>

#include "core/error.hpp"
#include "space/search_space.hpp"
#include "tests/common/input_error.hpp"

namespace test_search_space {
using namespace attntune;

namespace {

const std::string kFlash = std::string(ATTNTUNE_SOURCE_DIR) + "/tests/data/spaces/flash_fwd_mma.yaml";

struct Limits {
  std::int64_t max_smem_per_block, max_threads_per_block, smem_per_sm;
};
Limits limits_of(const std::string& arch) {
  if (arch == "sm_80") return {166912, 1024, 167936};
  if (arch == "sm_90") return {232448, 1024, 233472};
  return {101376, 1024, 102400};  // sm_86, sm_89
}

// The valid configs of tests/data/spaces/flash_fwd_mma.yaml, by nested loops over the domains as
// the file declares them and its constraints restated in C++: no part of the DFS is reused.
std::vector<Config> brute_force(const Problem& p, const std::string& arch) {
  const Limits lim = limits_of(arch);
  const bool bf16 = p.dtype == DType::kBf16;
  std::vector<Config> out;
  for (std::int64_t block_m : {64, 128, 256})
    for (std::int64_t block_n = 32; block_n <= 256; block_n += 32)
      for (std::int64_t warps : {2, 4, 8, 16})
        for (std::int64_t kv_stages = 1; kv_stages <= 4; ++kv_stages)
          for (bool q_in_regs : {false, true})
            for (std::int64_t min_blocks : {1, 2})
              for (std::int64_t frag_prefetch = 0; frag_prefetch <= 2; ++frag_prefetch)
                for (bool lazy_rescale : {false, true})
                  for (std::string kv_schedule : {"interleaved", "blockwise"})
                    for (std::int64_t sub_n : {16, 32, 64, 128}) {
                      const bool blockwise = kv_schedule == "blockwise";
                      const std::int64_t smem = (block_m * p.d + 2 * kv_stages * block_n * p.d) * 2;
                      if (block_m % warps != 0 || (block_m / warps) % 16 != 0) continue;
                      if (block_m / warps / 16 > 4) continue;
                      if (block_n % 16 != 0 || block_n % sub_n != 0) continue;
                      if (!blockwise && sub_n != block_n) continue;
                      if (blockwise && kv_stages < 2) continue;
                      if (warps * 32 > lim.max_threads_per_block) continue;
                      if (smem > lim.max_smem_per_block || min_blocks * smem > lim.smem_per_sm) continue;
                      if (!bf16 && lazy_rescale && p.d > 128) continue;
                      out.push_back({{"block_m", block_m}, {"block_n", block_n}, {"warps", warps},
                                     {"kv_stages", kv_stages}, {"q_in_regs", q_in_regs}, {"min_blocks", min_blocks},
                                     {"frag_prefetch", frag_prefetch}, {"lazy_rescale", lazy_rescale},
                                     {"kv_schedule", kv_schedule}, {"sub_n", sub_n}});
                    }
  return out;
}

Problem problem(const std::string& spec) { return Problem::parse(spec); }

using attntune::testing::input_error_of;

}  // namespace

TEST(SearchSpace, EnumerationMatchesBruteForceInOrder) {
  const SearchSpace sp = SearchSpace::load(kFlash);
  EXPECT_EQ(sp.raw_size(), 73728u);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"b=4,h=16,s=4096,d=128,dtype=bf16,causal=1", "sm_90"},
      {"b=1,h=8,s=1024,d=64,dtype=fp16,causal=0", "sm_80"},
      {"b=2,h=8,s=512,d=256,dtype=fp16,causal=0", "sm_90"},
      {"b=2,h=8,s=512,d=256,dtype=bf16,causal=0", "sm_90"},
      {"b=2,h=32,hkv=8,s=2048,d=192,dtype=fp16,causal=1", "sm_86"},
  };
  for (const auto& [spec, arch] : cases) {
    SCOPED_TRACE(spec + " " + arch);
    const Problem p = problem(spec);
    const std::vector<Config> expected = brute_force(p, arch);
    ASSERT_FALSE(expected.empty());
    EXPECT_EQ(sp.count(p, arch), expected.size());
    EXPECT_EQ(sp.enumerate(p, arch), expected);  // same configs, same order
    PruneStats stats;
    std::uint64_t visited = 0;
    sp.for_each_valid(p, arch, [&](const Config&) { ++visited; }, &stats);
    EXPECT_EQ(visited, expected.size());
    EXPECT_EQ(stats.valid, expected.size());
    std::uint64_t rejected = 0;
    for (auto r : stats.rejected_by) rejected += r;
    EXPECT_EQ(stats.valid + rejected, sp.raw_size());
  }
}

TEST(SearchSpace, CheckAgreesWithEnumerationOnEveryRawPoint) {
  const SearchSpace sp = SearchSpace::load(kFlash);
  const Problem p = problem("b=1,h=8,s=1024,d=128,dtype=fp16,causal=0");
  const std::vector<Config> valid = brute_force(p, "sm_89");
  std::set<Config> valid_set(valid.begin(), valid.end());
  // Every point of the raw space: the Cartesian product of the declared domains.
  std::vector<std::size_t> idx(sp.params().size(), 0);
  std::uint64_t points = 0, accepted = 0;
  for (;;) {
    Config c;
    for (std::size_t i = 0; i < idx.size(); ++i) c[sp.params()[i].name] = sp.params()[i].values[idx[i]];
    const bool ok = !sp.check(c, p, "sm_89").has_value();
    ASSERT_EQ(ok, valid_set.count(c) == 1) << config_str(c);
    accepted += ok;
    ++points;
    std::size_t i = idx.size();
    while (i > 0 && ++idx[i - 1] == sp.params()[i - 1].values.size()) idx[--i] = 0;
    if (i == 0) break;
  }
  EXPECT_EQ(points, sp.raw_size());
  EXPECT_EQ(accepted, valid.size());
}

TEST(SearchSpace, CheckGivesTheFirstFailingReason) {
  const SearchSpace sp = SearchSpace::load(kFlash);
  const Problem p = problem("b=1,h=8,s=1024,d=128,dtype=fp16,causal=0");
  Config c = sp.parse_config(
      "block_m=128,block_n=64,warps=4,kv_stages=2,q_in_regs=true,min_blocks=1,frag_prefetch=1,"
      "lazy_rescale=false,kv_schedule=interleaved,sub_n=64");
  EXPECT_EQ(sp.check(c, p, "sm_90"), std::nullopt);
  Config bad = c;
  bad["warps"] = std::int64_t{16};  // 128 / 16 = 8 rows per warp
  EXPECT_EQ(sp.check(bad, p, "sm_90"), "each warp must own whole 16-row MMA tiles");
  bad = c;
  bad["block_m"] = std::int64_t{256};
  bad["warps"] = std::int64_t{2};  // 8 row tiles per warp; this constraint has no `why`
  EXPECT_EQ(sp.check(bad, p, "sm_90"), "m_tiles <= 4");
  bad = c;
  bad["block_n"] = std::int64_t{256};
  bad["kv_stages"] = std::int64_t{4};
  bad["sub_n"] = std::int64_t{128};
  // Fails sub_n == block_n (5th, reads sub_n: the last param) and shared memory (8th, reads
  // kv_stages: the 4th param). Enumeration would prune at kv_stages, so that is the reason.
  EXPECT_EQ(sp.check(bad, p, "sm_90"), "shared memory exceeds the per-block limit");
  bad["kv_stages"] = std::int64_t{1};
  EXPECT_EQ(sp.check(bad, p, "sm_90"), "interleaved needs sub_n == block_n");
  bad["kv_stages"] = std::int64_t{4};
  bad["sub_n"] = std::int64_t{256};
  EXPECT_EQ(sp.check(bad, p, "sm_90"), "sub_n=256 is not in the domain of sub_n (16, 32, 64, 128)");
  bad["sub_n"] = std::int64_t{128};
  bad["kv_schedule"] = std::string("blockwise");
  EXPECT_EQ(sp.check(bad, p, "sm_90"), "shared memory exceeds the per-block limit");
  bad = c;
  bad["lazy_rescale"] = true;
  EXPECT_EQ(sp.check(bad, p, "sm_90"), std::nullopt);
  EXPECT_EQ(sp.check(bad, problem("b=1,h=8,s=1024,d=256,dtype=fp16,causal=0"), "sm_90"),
            "dtype == 'bf16' || !lazy_rescale || d <= 128");
  bad = c;
  bad.erase("warps");
  EXPECT_EQ(sp.check(bad, p, "sm_90"), "missing parameter warps");
  bad = c;
  bad["wraps"] = std::int64_t{4};
  EXPECT_EQ(sp.check(bad, p, "sm_90"), "unknown parameter wraps");
  bad = c;
  bad["q_in_regs"] = std::int64_t{1};  // an int where the param is bool
  EXPECT_EQ(sp.check(bad, p, "sm_90"), "q_in_regs=1 is not in the domain of q_in_regs (false, true)");
}

TEST(SearchSpace, DeriveComputesEveryQuantityInOrder) {
  const SearchSpace sp = SearchSpace::load(kFlash);
  const Config c = sp.parse_config(
      "block_m=128,block_n=64,warps=4,kv_stages=3,q_in_regs=true,min_blocks=1,frag_prefetch=1,"
      "lazy_rescale=false,kv_schedule=blockwise,sub_n=32");
  const auto d = sp.derive(c, problem("b=1,h=8,s=1024,d=128,dtype=fp16,causal=0"), "sm_90");
  const std::vector<std::pair<std::string, std::int64_t>> expected = {
      {"threads", 128}, {"warp_rows", 32}, {"m_tiles", 2}, {"smem_bytes", (128 * 128 + 2 * 3 * 64 * 128) * 2},
      {"blockwise", 1}};
  EXPECT_EQ(d, expected);
  // derive() does not require the constraints to hold, only a well-formed config.
  Config invalid = c;
  invalid["warps"] = std::int64_t{16};
  EXPECT_EQ(sp.derive(invalid, problem("b=1,h=8,s=1024,d=64,dtype=fp16,causal=0"), "sm_80")[1].second, 8);
  invalid.erase("warps");
  EXPECT_NE(input_error_of([&] { sp.derive(invalid, problem("b=1,h=8,s=1024,d=64,dtype=fp16,causal=0"), "sm_80"); })
                .find("missing parameter warps"),
            std::string::npos);
}

TEST(SearchSpace, ParseConfigIsStrict) {
  const SearchSpace sp = SearchSpace::load(kFlash);
  const std::string good =
      "block_m=128,block_n=64,warps=4,kv_stages=3,q_in_regs=1,min_blocks=1,frag_prefetch=1,"
      "lazy_rescale=false,kv_schedule=blockwise,sub_n=32";
  const Config c = sp.parse_config(good);
  EXPECT_EQ(c.at("q_in_regs"), Value(true));
  EXPECT_EQ(c.at("kv_schedule"), Value(std::string("blockwise")));
  EXPECT_EQ(sp.parse_config(config_str(c)), c);
  EXPECT_EQ(sp.parse_config(" block_m = 128, " + good.substr(12)), c);  // spaces around items are fine

  auto err = [&](const std::string& text) { return input_error_of([&] { sp.parse_config(text); }); };
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  EXPECT_EQ(err(""), "config: empty (expected block_m, block_n, warps, kv_stages, q_in_regs, min_blocks, "
                     "frag_prefetch, lazy_rescale, kv_schedule, sub_n)");
  EXPECT_EQ(err(replace("warps=4", "wraps=4")),
            "config: unknown parameter 'wraps' (did you mean 'warps'?) (parameters of flash_fwd_mma: block_m, block_n, "
            "warps, kv_stages, q_in_regs, min_blocks, frag_prefetch, lazy_rescale, kv_schedule, sub_n)");
  EXPECT_EQ(err(good + ",warps=8"), "config: parameter 'warps' given twice");
  EXPECT_EQ(err(replace("warps=4,", "")),
            "config: missing parameter 'warps' (parameters of flash_fwd_mma: block_m, block_n, warps, kv_stages, "
            "q_in_regs, min_blocks, frag_prefetch, lazy_rescale, kv_schedule, sub_n)");
  EXPECT_EQ(err(replace("block_m=128", "block_m=12x")), "config: 'block_m=12x': expected an integer");
  EXPECT_EQ(err(replace("block_m=128", "block_m=")), "config: 'block_m=': expected an integer");
  EXPECT_EQ(err(replace("block_m=128", "block_m=96")), "config: block_m=96 is not in the domain of block_m (64, 128, 256)");
  EXPECT_EQ(err(replace("q_in_regs=1", "q_in_regs=yes")), "config: 'q_in_regs=yes': expected true, false, 1 or 0");
  EXPECT_EQ(err(replace("kv_schedule=blockwise", "kv_schedule=blocked")),
            "config: kv_schedule=blocked is not in the domain of kv_schedule (interleaved, blockwise)");
  EXPECT_EQ(err(replace("warps=4", "warps")), "config: 'warps' is not name=value");
  EXPECT_EQ(err(good + ","), "config: '' is not name=value");
}

TEST(SearchSpace, ProblemSupportAndArchs) {
  const SearchSpace sp = SearchSpace::load(kFlash);
  EXPECT_EQ(sp.default_arch(), "sm_90");
  EXPECT_EQ(sp.archs(), (std::vector<std::string>{"sm_80", "sm_86", "sm_89", "sm_90"}));
  auto err = [&](const std::string& spec, const std::string& arch) {
    return input_error_of([&] { sp.check_problem(problem(spec), arch); });
  };
  EXPECT_EQ(err("b=1,h=8,s=1024,d=128,dtype=fp16,causal=0", "sm_90"), "(no error)");
  EXPECT_EQ(err("b=1,h=8,s=1024,d=96,dtype=fp16,causal=0", "sm_90"),
            "flash_fwd_mma does not support d=96 (supported: 64, 128, 192, 256)");
  EXPECT_EQ(err("b=1,h=8,s=1024,d=128,dtype=fp16,causal=0", "sm_75"),
            "flash_fwd_mma does not support arch sm_75 (supported: sm_80, sm_86, sm_89, sm_90)");
  EXPECT_EQ(err("b=1,h=8,s=1024,sk=512,d=128,dtype=fp16,causal=1", "sm_90"),
            "flash_fwd_mma does not support the problem b=1,h=8,hkv=8,s=1024,sk=512,d=128,dtype=fp16,causal=1: "
            "causal attention needs at least as many keys as queries");
  EXPECT_EQ(err("b=1,h=8,s=1024,sk=512,d=128,dtype=fp16,causal=0", "sm_90"), "(no error)");
  // enumerate(), count() and check() refuse unsupported problems the same way.
  const Problem d96 = problem("b=1,h=8,s=1024,d=96,dtype=fp16,causal=0");
  EXPECT_THROW(sp.enumerate(d96, "sm_90"), InputError);
  EXPECT_THROW(sp.count(d96, "sm_90"), InputError);
  EXPECT_THROW(sp.check(Config{}, d96, "sm_90"), InputError);

  const SearchSpace dt = SearchSpace::parse(
      "family: toy\narchs: [sm_90]\ndevice_limits: {sm_90: {}}\n"
      "problem: {dtype: [bf16], causal: [false]}\nparams: {x: [1]}\n", "toy.yaml");
  EXPECT_EQ(input_error_of([&] { dt.check_problem(problem("b=1,h=1,s=1,d=64,dtype=fp16,causal=0"), "sm_90"); }),
            "toy does not support dtype=fp16 (supported: bf16)");
  EXPECT_EQ(input_error_of([&] { dt.check_problem(problem("b=1,h=1,s=1,d=64,dtype=bf16,causal=1"), "sm_90"); }),
            "toy does not support causal=1 (supported: 0)");
}

TEST(SearchSpace, ConstraintsOnProblemAndLimitsOnlyGateTheWholeSpace) {
  const SearchSpace sp = SearchSpace::parse(
      "family: toy\narchs: [sm_89, sm_90]\ndevice_limits: {sm_89: {big: 0}, sm_90: {big: 1}}\n"
      "params:\n  x: {range: [1, 10]}\n  y: [3, 1, 2]\n"
      "constraints:\n  - big == 1 || d <= 64\n  - x % y == 0\n",
      "toy.yaml");
  const Problem d128 = problem("b=1,h=1,s=1,d=128,dtype=fp16,causal=0");
  EXPECT_EQ(sp.count(d128, "sm_89"), 0u);
  // x % y == 0 over x in 1..10 and y in {3, 1, 2}: 3 + 10 + 5 configs, in declared order of y.
  const auto configs = sp.enumerate(d128, "sm_90");
  ASSERT_EQ(configs.size(), 18u);
  EXPECT_EQ(config_str(configs[0]), "x=1,y=1");
  EXPECT_EQ(config_str(configs[1]), "x=2,y=1");
  EXPECT_EQ(config_str(configs[2]), "x=2,y=2");
  EXPECT_EQ(config_str(configs[3]), "x=3,y=3");
  EXPECT_EQ(config_str(configs[4]), "x=3,y=1");
  PruneStats stats;
  sp.for_each_valid(d128, "sm_89", [](const Config&) {}, &stats);
  EXPECT_EQ(stats.rejected_by, (std::vector<std::uint64_t>{30, 0}));  // the whole space, at the root
}

TEST(SearchSpace, RuntimeErrorsDuringEnumerationNameFileAndExpression) {
  const SearchSpace sp = SearchSpace::parse(
      "family: toy\narchs: [sm_90]\ndevice_limits: {sm_90: {}}\n"
      "params:\n  x: [0, 1, 2]\n  y: [1, 2]\n"
      "derived:\n  q: y / x\n"
      "constraints:\n  - x > 0 || y > 1\n  - q >= 1\n",
      "toy.yaml");
  // x = 0, y = 1 is rejected by the first constraint before q is computed; x = 0, y = 2 is not.
  EXPECT_EQ(input_error_of([&] { sp.count(problem("b=1,h=1,s=1,d=64,dtype=fp16,causal=0"), "sm_90"); }),
            "toy.yaml:8:6: derived.q 'y / x': division by zero");
}

TEST(SearchSpace, ConstraintsRunAsSoonAsTheirParamsAreBound) {
  // q >= 1 is declared first but needs y; x > 0 needs only x, so it runs first and cuts the x = 0
  // subtree before q = y / x is ever computed, in enumeration and in check() alike.
  const SearchSpace sp = SearchSpace::parse(
      "family: toy\narchs: [sm_90]\ndevice_limits: {sm_90: {}}\n"
      "params:\n  x: [0, 1, 2]\n  y: [1, 2, 4]\n"
      "derived:\n  q: y / x\n"
      "constraints:\n  - q >= 1\n  - {expr: x > 0, why: x must be positive}\n",
      "toy.yaml");
  const Problem p = problem("b=1,h=1,s=1,d=64,dtype=fp16,causal=0");
  EXPECT_EQ(sp.count(p, "sm_90"), 5u);  // (1,1) (1,2) (1,4) (2,2) (2,4)
  EXPECT_EQ(sp.check({{"x", std::int64_t{0}}, {"y", std::int64_t{1}}}, p, "sm_90"), "x must be positive");
  EXPECT_EQ(sp.check({{"x", std::int64_t{2}}, {"y", std::int64_t{1}}}, p, "sm_90"), "q >= 1");
  PruneStats stats;
  sp.for_each_valid(p, "sm_90", [](const Config&) {}, &stats);
  EXPECT_EQ(stats.rejected_by, (std::vector<std::uint64_t>{1, 3}));
  // derive() computes everything it is asked for, so there the division fails.
  EXPECT_EQ(input_error_of([&] { sp.derive({{"x", std::int64_t{0}}, {"y", std::int64_t{1}}}, p, "sm_90"); }),
            "toy.yaml:8:6: derived.q 'y / x': division by zero");
}

// A space of 4^10 = 1,048,576 raw points whose constraints bind early; counted against nested loops.
TEST(SearchSpace, LargeSpaceEnumeratesFastWithEarlyPruning) {
  std::string yaml = "family: big\narchs: [sm_90]\ndevice_limits: {sm_90: {cap: 24}}\nparams:\n";
  for (char p = 'a'; p <= 'j'; ++p) yaml += fmt::format("  p{}: [1, 2, 3, 4]\n", p);
  yaml +=
      "constraints:\n"
      "  - pa <= pb\n"
      "  - pa + pb + pc + pd <= 10\n"
      "  - (pe * pf) % 2 == 0\n"
      "  - pa + pb + pc + pd + pe + pf + pg + ph + pi + pj <= cap\n"
      "  - pj != pi || pj == 1\n";
  const SearchSpace sp = SearchSpace::parse(yaml, "big.yaml");
  EXPECT_EQ(sp.raw_size(), 1048576u);
  std::uint64_t expected = 0;
  for (int a = 1; a <= 4; ++a) for (int b = 1; b <= 4; ++b) for (int c = 1; c <= 4; ++c)
  for (int d = 1; d <= 4; ++d) for (int e = 1; e <= 4; ++e) for (int f = 1; f <= 4; ++f)
  for (int g = 1; g <= 4; ++g) for (int h = 1; h <= 4; ++h) for (int i = 1; i <= 4; ++i)
  for (int j = 1; j <= 4; ++j) {
    if (a > b || a + b + c + d > 10 || (e * f) % 2 != 0) continue;
    if (a + b + c + d + e + f + g + h + i + j > 24 || (j == i && j != 1)) continue;
    ++expected;
  }
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(sp.count(problem("b=1,h=1,s=1,d=64,dtype=fp16,causal=0"), "sm_90"), expected);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  RecordProperty("count_seconds", std::to_string(seconds));
  EXPECT_LT(seconds, 5.0) << "counting 2^20 raw points should take well under a second";
}
}  // namespace test_search_space
