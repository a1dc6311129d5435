// The property check both kernel families' GPU tests run: configs built through the pool the tuner
// uses (build-worker processes, all cores, ahead of the GPU), each in its own dtype/causal variant,
// then every build launched on each shape (fresh random inputs, NaN-poisoned output) and compared
// with the reference by FlashAttention-2's criterion. The caller holds the CUDA context.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "eval/attention_gpu.hpp"
#include "core/error.hpp"
#include "cuda/driver.hpp"
#include "eval/build_pool.hpp"
#include "families/family.hpp"
#include "tests/common/run_attntune.hpp"

namespace attntune::testing {

struct PropertyShape {
  // b,h,hkv,s,sk (and page=N: a paged KV cache, ragged lengths, shuffled pages; varlen=N: a
  // packed batch, validated as the worker validates it and on a ragged batch in `layout`)
  const char* dims;
  Layout layout;
};

struct PropertyRun {
  const char* label;      // printed with the counts: "flash_fwd_mma"
  int d = 0;
  std::string arch;       // the build target (sm_90a for the Hopper family)
  std::uint64_t seed = 0; // inputs use seed + 1, seed + 2, ...
  bool require_no_spills = false;
  bool without_workspaces = false;  // each check again with the plan's optional workspaces withheld
  int dv = 0;             // V's head dim when it is not d (`dv=N`)
  bool latent = false;    // `latent=1`: V is K's first dv columns (the buffers pass v = k)
  bool kv_fp8 = false;    // `kv_dtype=fp8`: an FP8 e4m3 cache with per-(sequence, KV head) scales
  bool per_tensor_descale = false;  // kv_fp8 (or dtype=fp8): one scale a tensor (strides 0) instead
  bool qkv_fp8 = false;   // `dtype=fp8`: the FP8 forward (Q, K, V e4m3, O bf16; the problems' dtype ignored)
  std::string extra = {};  // appended to every shape's spec (",pass=bwd": the backward pass)
  float v_mean = 0.f;     // kv_fp8 or qkv_fp8: V drawn around this mean (AttnBuffers::v_mean)
};

// The configs a property test samples per problem kind: ATTNTUNE_PROPERTY_SAMPLE, else `fallback`
// (0: every valid config).
inline std::size_t property_sample(std::size_t fallback = 6) {
  const char* env = std::getenv("ATTNTUNE_PROPERTY_SAMPLE");
  return env ? std::strtoul(env, nullptr, 10) : fallback;
}

// A spread of `n` configs of `space` for problem `kind` on `arch` (0 or more than there are: all),
// evenly over the valid ones that `keep` accepts (none given: every one), appended to `configs`
// with their problems in `variants`: `kind`, its dtype alternating bf16 and fp16 over all that
// `configs` holds where the space holds the config in both (else `kind`'s). False when no config
// qualifies.
inline bool spread_configs(const SearchSpace& space, const Problem& kind, const std::string& arch, std::size_t n,
                           std::vector<Config>& configs, std::vector<Problem>& variants,
                           const std::function<bool(const Config&)>& keep = {}) {
  std::vector<Config> all = space.enumerate(kind, arch);
  if (keep) std::erase_if(all, [&](const Config& c) { return !keep(c); });
  if (all.empty()) return false;
  const std::size_t m = n == 0 || n >= all.size() ? all.size() : n;
  for (std::size_t i = 0; i < m; ++i) {
    const Config& c = all[i * all.size() / m];
    Problem p = kind;
    if (!p.qkv_fp8) {  // an FP8 forward's O is bf16
      p.dtype = configs.size() % 2 ? DType::kFp16 : DType::kBf16;
      // A space may hold a config for one dtype and not the other (flash_decode's fp16 group
      // conversion spills where bf16's does not), or refuse the other dtype's problem outright
      // (flash_decode_wgmma's FP8 path takes bf16 queries only): then the config keeps `kind`'s dtype.
      bool keep_kind;
      try {
        keep_kind = space.check(c, p, arch).has_value();
      } catch (const InputError&) {  // check() refuses the problem itself
        keep_kind = true;
      }
      if (keep_kind) p.dtype = kind.dtype;
    }
    configs.push_back(c);
    variants.push_back(p);
  }
  return true;
}

// A paged problem's K and V as the reference reads them (contiguous, in the buffers' layout), NaN
// at every row at or past each sequence's keys (a latent problem's V is K's rows: K alone; an FP8
// cache's elements are bytes, its NaN 0x7F).
inline void poison_past_lengths(AttnBuffers& b) {
  const AttnParams a = b.params();
  const std::int64_t sk = b.problem.sk, hkv = b.problem.hkv;
  for (cuda::DeviceBuffer* buf : {&b.k, &b.v}) {
    const bool is_v = buf == &b.v;
    if (is_v && b.problem.latent) continue;
    const long long* st = is_v ? a.v_stride : a.k_stride;
    const std::int64_t d = is_v ? b.problem.head_dim_v() : b.problem.d;
    auto poison = [&](auto nan) {
      std::vector<decltype(nan)> host(buf->bytes() / sizeof nan);
      buf->download(host.data(), buf->bytes());
      for (std::int64_t i = 0; i < b.problem.b; ++i)
        for (std::int64_t h = 0; h < hkv; ++h)
          for (std::int64_t j = b.seqlens.empty() ? sk : b.seqlens[static_cast<std::size_t>(i)]; j < sk; ++j)
            std::fill_n(host.begin() + (i * st[0] + h * st[1] + j * st[2]), d, nan);
      buf->upload(host.data(), buf->bytes());
    };
    if (b.problem.kv_fp8) poison(std::uint8_t{0x7F});
    else poison(std::uint16_t{0xFFFF});
  }
}

// The kvcache call of a paged problem's buffers on the contiguous K/V (block_table NULL).
inline attntune_plan::Call contiguous_call(const AttnBuffers& b) {
  attntune_plan::Call c = b.call();
  const AttnParams a = b.params();
  c.k = a.k;
  c.v = a.v;
  for (int i = 0; i < 3; ++i) {
    c.k_stride[i] = a.k_stride[i];
    c.v_stride[i] = a.v_stride[i];
  }
  c.block_table = nullptr;
  c.max_blocks_per_seq = 0;
  c.page_size = 0;
  return c;
}

// variants[i] is the problem (its dtype and causal) configs[i] is built for.
inline void check_configs(const SearchSpace& space, const std::vector<Config>& configs,
                          const std::vector<Problem>& variants, std::span<const PropertyShape> shapes,
                          const PropertyRun& run) {
  BuildPoolOptions pool_opts;
  pool_opts.nvrtc_options = family_nvrtc_options(space.family());
  pool_opts.worker_argv = {attntune_bin(), "build-worker"};
  BuildPool pool(pool_opts);
  std::map<std::uint64_t, Problem> variant_of;  // ticket -> the dtype/causal variant built
  for (std::size_t i = 0; i < configs.size(); ++i)
    variant_of[pool.submit({configs[i], render_kernel(space, configs[i], variants[i], run.arch), run.arch})] = variants[i];
  Reference ref(cuda::device_props(0).arch);
  int checked = 0, failures = 0;
  // ATTNTUNE_TEST_PROGRESS=1: a line before each launch, to name a kernel that hangs.
  const bool progress = std::getenv("ATTNTUNE_TEST_PROGRESS") != nullptr;
  // ATTNTUNE_TEST_ERRORS=1: each check's errors and bounds, passed or not (how close a kernel runs).
  const bool errors = std::getenv("ATTNTUNE_TEST_ERRORS") != nullptr;
  std::uint64_t seed = run.seed;
  while (auto o = pool.next()) {
    EXPECT_EQ(o->build.status, "ok") << config_str(o->job.config) << "\n" << o->build.log;
    if (o->build.status != "ok") continue;
    if (run.require_no_spills) {
      EXPECT_EQ(o->build.spill_stores + o->build.spill_loads, 0) << config_str(o->job.config);
    }
    const Problem& v = variant_of.at(o->ticket);
    for (const PropertyShape& sh : shapes) {
      Problem p = Problem::parse(fmt::format("{},d={}{},dtype={},causal={}{}", sh.dims, run.d,
                                             run.dv ? fmt::format(",dv={}", run.dv) : std::string(),
                                             run.qkv_fp8 ? "fp8" : dtype_name(v.dtype), v.causal ? 1 : 0,
                                             std::string(run.latent ? ",latent=1" : "") +
                                                 (run.kv_fp8 ? ",kv_dtype=fp8" : "") + run.extra));
      const LoadedBuild kernel(o->build.cubin, o->job.kernel.launch);
      ++seed;
      // A varlen problem: the worker's inputs (its own lengths packed, then a ragged batch with
      // empty, one-row, odd and longest sequences), in the shape's layout too.
      std::vector<std::unique_ptr<AttnBuffers>> bufs;
      if (p.is_varlen()) {
        bufs = validation_inputs(p, seed);
        bufs.push_back(std::make_unique<AttnBuffers>(p, sh.layout, varlen_ragged_lens(p, seed + 7), seed));
      } else {
        bufs.push_back(
            std::make_unique<AttnBuffers>(p, sh.layout, p.paged() ? ragged_seqlens(p, seed) : std::vector<int>{}, seed));
      }
      for (auto& buf : bufs) {
        buf->per_tensor_descale = run.per_tensor_descale;
        buf->v_mean = run.v_mean;
        ref.fill(*buf, seed);
        if (progress)
          std::fprintf(stderr, "[progress] %s on %s\n", config_str(o->job.config).c_str(), p.str().c_str());
        auto check = [&](const attntune_plan::Call& call, const char* how, bool workspaces = true) {
          kernel.launch(call, nullptr, workspaces);
          const Verdict verdict = ref.check(*buf);
          ++checked;
          if (errors)
            std::printf("[errors] %s on %s%s: %s\n", config_str(o->job.config).c_str(), p.str().c_str(), how,
                        verdict.detail().c_str());
          if (verdict.status != "ok") {
            ++failures;
            ADD_FAILURE() << config_str(o->job.config) << " on " << p.str() << " " << layout_name(buf->layout) << how
                          << " (lengths " << fmt::format("{}", fmt::join(buf->seqlens, ",")) << "): "
                          << verdict.detail();
          }
        };
        check(buf->call(), "");
        if (run.without_workspaces) {
          // The plan's optional workspaces withheld (they could not be allocated): fewer splits,
          // still correct.
          ref.poison_output(*buf);
          check(buf->call(), " without workspaces", false);
        }
        if (p.paged()) {
          // The same cache contiguous (block_table NULL): K/V [b, hkv, sk, d] in the layout, NaN
          // past each sequence's keys (a cache holds anything there), the output poisoned again.
          poison_past_lengths(*buf);
          ref.poison_output(*buf);
          check(contiguous_call(*buf), " contiguous");
        }
      }
    }
  }
  std::printf("%s d=%d%s%s%s: %zu configs, %d checks, %d failures\n", run.label, run.d,
              run.dv ? fmt::format(" dv={}", run.dv).c_str() : "", run.latent ? " latent" : "",
              run.kv_fp8    ? (run.per_tensor_descale ? " kv fp8 (per-tensor scales)" : " kv fp8")
              : run.qkv_fp8 ? (run.per_tensor_descale ? " fp8 (per-tensor scales)" : " fp8")
                            : "",
              configs.size(),
              checked, failures);
}


// The attention variants a build is compiled with (`kind`: its causality and variants, their sizes
// and values being run-time arguments) and the shapes that carry the values: b,h,hkv,s,sk (page=N,
// varlen=N) and the variants' values.
struct VariantGroup {
  const char* kind;
  std::vector<PropertyShape> shapes;
};

// For each group in turn: a spread of `sample` configs (ATTNTUNE_PROPERTY_SAMPLE overrides it) of
// `family`'s space that `keep` accepts (none given: all), for the problem `base` ("{d}" for the head
// dim) with the group's kind, checked on the group's shapes; group g's inputs seeded from seed +
// 1000 g. The caller need not hold a CUDA context.
inline void check_variant_groups(const std::string& family, const char* label, const char* base,
                                 std::span<const VariantGroup> groups, int d, std::uint64_t seed, std::size_t sample,
                                 const std::function<bool(const Config&)>& keep = {}) {
  cuda::Context ctx(0);
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/" + family + ".yaml");
  // The build target: the device's arch, or the space's arch-specific form of it (sm_90a).
  const std::string arch = space_arch_for_device(space, cuda::device_props(0).arch);
  const std::size_t n = property_sample(sample);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const Problem kind = Problem::parse(fmt::format(fmt::runtime(base), fmt::arg("d", d)) + "," + groups[g].kind);
    std::vector<Config> configs;
    std::vector<Problem> variants;
    ASSERT_TRUE(spread_configs(space, kind, arch, n, configs, variants, keep)) << kind.str();
    SCOPED_TRACE(kind.str());
    check_configs(space, configs, variants, groups[g].shapes,
                  {label, d, arch, seed + 1000 * g, /*require_no_spills=*/false});
  }
}

}  // namespace attntune::testing
