// Property test: every valid config of the flash_fwd_mma space (d=64, 128 and 256) matches the
// reference on fresh random inputs, with a NaN-poisoned output, at shapes covering odd lengths,
// causal, GQA/MQA, sk != s and the [B,S,H,D] layout. dtype and causal alternate over the configs
// so every combination is covered without building each config four times.
// ATTNTUNE_PROPERTY_SAMPLE=N checks a fixed spread of N configs per head dim instead of all.
#include <cstdlib>
#include <map>

#include <fmt/format.h>

#include "eval/attention_gpu.hpp"
#include "eval/build_pool.hpp"
#include "gpu_env.hpp"
#include "tests/common/run_attntune.hpp"

using namespace attntune;

namespace {

struct Shape {
  const char* dims;  // b,h,hkv,s,sk
  Layout layout;
};
const Shape kShapes[] = {
    {"b=2,h=6,hkv=2,s=777,sk=1001", Layout::kBSHD},  // GQA, sk > s, odd lengths
    {"b=1,h=4,hkv=4,s=333,sk=129", Layout::kBHSD},   // sk < s: causal rows that see no key
    {"b=1,h=3,hkv=1,s=100,sk=300", Layout::kBSHD},   // MQA, s shorter than a block
    {"b=2,h=2,hkv=2,s=257,sk=257", Layout::kBHSD},   // one past a tile
};

void check_space(int d) {
  cuda::Context ctx(0);
  const auto props = cuda::device_props(0);
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/flash_fwd_mma.yaml");
  const std::string arch = props.arch;
  const Problem base = Problem::parse(fmt::format("b=1,h=1,s=128,d={},dtype=bf16,causal=0", d));
  std::vector<Config> configs = space.enumerate(base, arch);
  ASSERT_FALSE(configs.empty());
  if (const char* env = std::getenv("ATTNTUNE_PROPERTY_SAMPLE")) {
    const std::size_t n = std::strtoul(env, nullptr, 10), step = std::max<std::size_t>(1, configs.size() / std::max<std::size_t>(1, n));
    std::vector<Config> picked;
    for (std::size_t i = 0; i < configs.size() && picked.size() < n; i += step) picked.push_back(configs[i]);
    configs = picked;
  }
  // Builds through the pool the tuner uses (build-worker processes), all cores, ahead of the GPU.
  BuildPoolOptions pool_opts;
  pool_opts.nvrtc_options = family_nvrtc_options(family_info(space.family()));
  pool_opts.worker_argv = {attntune::testing::attntune_bin(), "build-worker"};
  BuildPool pool(pool_opts);
  std::map<std::uint64_t, Problem> variant_of;  // ticket -> the dtype/causal variant built
  for (std::size_t i = 0; i < configs.size(); ++i) {
    Problem p = base;
    p.dtype = i % 2 ? DType::kFp16 : DType::kBf16;
    p.causal = (i / 2) % 2;
    variant_of[pool.submit({configs[i], render_kernel(space, configs[i], p, arch), arch})] = p;
  }
  Reference ref(arch);
  int checked = 0, failures = 0;
  std::uint64_t seed = 1000;
  while (auto o = pool.next()) {
    EXPECT_EQ(o->build.status, "ok") << config_str(o->job.config) << "\n" << o->build.log;
    if (o->build.status != "ok") continue;
    const Problem& v = variant_of.at(o->ticket);
    for (const Shape& sh : kShapes) {
      Problem p = Problem::parse(fmt::format("{},d={},dtype={},causal={}", sh.dims, d, dtype_name(v.dtype), v.causal ? 1 : 0));
      LoadedKernel kernel(o->build.cubin, o->job.kernel.kernel_name, launch_geometry(space, o->job.config, p, arch));
      AttnBuffers buf(p, sh.layout);
      ref.fill(buf, ++seed);
      kernel.launch(buf);
      const Verdict verdict = ref.check(buf);
      ++checked;
      if (verdict.status != "ok") {
        ++failures;
        ADD_FAILURE() << config_str(o->job.config) << " on " << p.str() << " " << layout_name(sh.layout) << ": "
                      << verdict.detail();
      }
    }
  }
  std::printf("flash_fwd_mma d=%d: %zu configs, %d checks, %d failures\n", d, configs.size(), checked, failures);
}

}  // namespace

TEST(FlashFwdMmaProperty, AllConfigsD64) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(64);
}

TEST(FlashFwdMmaProperty, AllConfigsD128) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(128);
}

TEST(FlashFwdMmaProperty, AllConfigsD256) {
  ATTNTUNE_REQUIRE_GPU();
  check_space(256);
}
