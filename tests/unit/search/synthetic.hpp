// Synthetic landscapes for the search tests: a space enumerated for a problem and arch, and a made-up
// but plausible result for each valid config, so strategies and replay run without a database.
//
// Time is base * exp(sum of effects): per parameter a bowl along the declared order (its minimum at
// a random position, its depth large for the first parameters, small for the flags, as tile sizes
// matter more than prefetch distance on a GPU), a few random pairwise interactions, and +-0.5%
// noise; configs whose shared memory exceeds a threshold fail with `resources`, and a sprinkle fail
// with `compile_error`. A landscape is a pure function of its seed.
#pragma once
#include <cmath>
#include <cstdlib>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "db/store.hpp"
#include "search/replay.hpp"
#include "search/rng.hpp"
#include "search/strategy.hpp"
#include "space/search_space.hpp"

namespace attntune::test {

inline std::string source_path(const std::string& relative) {
  const char* env = std::getenv("ATTNTUNE_SOURCE_DIR");
  return std::string(env && *env ? env : ATTNTUNE_SOURCE_DIR) + "/" + relative;
}

inline std::uint64_t fnv1a(const std::string& s) {  // std::hash differs between libraries
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

inline const SearchSpace& flash_space() {
  static const SearchSpace space = SearchSpace::load(source_path("search_spaces/flash_fwd_mma.yaml"));
  return space;
}

struct SyntheticOptions {
  std::uint64_t seed = 1;
  std::string problem = "b=4,h=16,s=4096,d=128,dtype=bf16,causal=0";
  std::string arch = "sm_90";
  std::int64_t resources_above_smem = 160 * 1024;  // smem_bytes above this fail with `resources`; 0: none
  double compile_error_fraction = 0.03;
  double minor_scale = 0.15;  // effect of the parameters after the first four, relative to those
  // A parameter value that always fails with `fail_status` ("" for none): a planted bad region.
  std::string fail_param, fail_value, fail_status = "resources";
};

struct Synthetic {
  const SearchSpace* space = nullptr;
  Problem problem;
  std::string arch;
  std::map<std::string, EvalRecord> results;  // config_str -> result, every valid config

  search::Landscape landscape() const {
    return {space, problem, arch, [this](const Config& c) {
              auto it = results.find(config_str(c));
              return it == results.end() ? nullptr : &it->second;
            }};
  }
  double optimum() const {
    double best = 1e300;
    for (const auto& [k, r] : results)
      if (r.status == "ok") best = std::min(best, *r.median_us);
    return best;
  }
  std::size_t within(double pct) const {  // ok configs within pct% of the optimum
    const double target = optimum() * (1 + pct / 100);
    std::size_t n = 0;
    for (const auto& [k, r] : results) n += r.status == "ok" && *r.median_us <= target;
    return n;
  }
};

inline Synthetic make_synthetic(const SyntheticOptions& o, const SearchSpace& space = flash_space()) {
  Synthetic s{&space, Problem::parse(o.problem), o.arch, {}};
  search::Rng rng(o.seed * 0x9E3779B97F4A7C15ull + 17);
  const auto& params = space.params();
  const std::size_t n = params.size();
  // Per parameter: bowl centre (in [0, 1] along the domain) and depth; deeper for earlier params.
  std::vector<double> centre(n), depth(n);
  for (std::size_t p = 0; p < n; ++p) {
    centre[p] = rng.uniform();
    depth[p] = (0.05 + 0.35 * rng.uniform()) * (p < 4 ? 1.0 : o.minor_scale);
  }
  struct Pair {
    std::size_t a, b;
    double w;
  };
  std::vector<Pair> pairs;
  for (int k = 0; k < 4; ++k) {
    const std::size_t a = rng.below(n), b = rng.below(n);
    if (a != b) pairs.push_back({a, b, (rng.uniform() - 0.5) * 0.3});
  }
  auto position = [&](const Config& c, std::size_t p) {
    const auto& vals = params[p].values;
    const auto idx = std::find(vals.begin(), vals.end(), c.at(params[p].name)) - vals.begin();
    return vals.size() < 2 ? 0.0 : static_cast<double>(idx) / static_cast<double>(vals.size() - 1);
  };
  space.for_each_valid(s.problem, s.arch, [&](const Config& c) {
    EvalRecord r;
    search::Rng noise(fnv1a(config_str(c)) ^ o.seed);
    std::int64_t smem = 0;
    for (const auto& [name, v] : space.derive(c, s.problem, s.arch))
      if (name == "smem_bytes") smem = v;
    const auto fv = c.find(o.fail_param);
    if (!o.fail_param.empty() && fv != c.end() && value_str(fv->second) == o.fail_value) {
      r.status = o.fail_status;
    } else if (o.resources_above_smem && smem > o.resources_above_smem) {
      r.status = "resources";
    } else if (noise.uniform() < o.compile_error_fraction) {
      r.status = "compile_error";
    } else {
      double e = 0;
      for (std::size_t p = 0; p < n; ++p) e += depth[p] * std::pow(position(c, p) - centre[p], 2) * 4;
      for (const Pair& q : pairs) e += q.w * (position(c, q.a) - 0.5) * (position(c, q.b) - 0.5) * 4;
      e += (noise.uniform() - 0.5) * 0.01;
      r.status = "ok";
      r.median_us = 1000 * std::exp(e);
      r.tflops = 100;
      r.max_abs_err = 1e-3;
      r.count = 30;
    }
    s.results.emplace(config_str(c), r);
  });
  return s;
}

}  // namespace attntune::test

namespace attntune::test {

// The default synthetic landscape, built once per test binary.
inline const Synthetic& landscape() {
  static const Synthetic s = make_synthetic({});
  return s;
}

// Configs as their canonical strings, for comparing proposal lists.
inline std::vector<std::string> strs(const std::vector<Config>& v) {
  std::vector<std::string> out;
  for (const Config& c : v) out.push_back(config_str(c));
  return out;
}

inline search::StrategyContext context_of(const Synthetic& s, std::uint64_t seed, std::vector<Config> warm = {}) {
  return {s.space, s.problem, s.arch, seed, std::move(warm)};
}

// Runs a strategy against a landscape as tune would, `pipeline` proposals in flight, until it has
// nothing more to propose or `limit` evaluations; returns every proposal in order.
inline std::vector<Config> drive(search::Strategy& strategy, const Synthetic& s, std::size_t pipeline = 8,
                                 std::size_t limit = static_cast<std::size_t>(-1)) {
  std::vector<Config> proposed;
  std::deque<Config> in_flight;
  for (std::size_t evals = 0; evals < limit; ++evals) {
    if (in_flight.size() < pipeline)
      for (Config& c : strategy.propose(pipeline - in_flight.size())) {
        proposed.push_back(c);
        in_flight.push_back(std::move(c));
      }
    if (in_flight.empty()) break;
    const Config c = in_flight.front();
    in_flight.pop_front();
    const EvalRecord& r = s.results.at(config_str(c));
    strategy.observe({c, r.status, r.status == "ok" ? r.median_us : std::nullopt});
  }
  return proposed;
}

}  // namespace attntune::test
