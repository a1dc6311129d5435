// The backward families' GPU checks, one for both (tests/gpu/test_flash_bwd_mma.cpp,
// test_flash_bwd_wgmma.cpp): a spread of a family's configs through the worker's validation (dQ, dK
// and dV each by FlashAttention-2's criterion against the reference's gradients, NaN-poisoned
// outputs) on the shapes below, and the deterministic mode (Call::deterministic): dQ, dK and dV the
// same bits run to run, on shapes of several key blocks (GQA, causal, windows), within the criterion.
#ifndef ATTNTUNE_TESTS_GPU_BWD_CHECKS_HPP
#define ATTNTUNE_TESTS_GPU_BWD_CHECKS_HPP

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "gpu_env.hpp"
#include "property_check.hpp"

namespace attntune::testing {

// The property shapes: GQA and MQA, odd lengths, sk > s, sk < s (causal rows that see no key: dQ =
// 0), one query or key row; windows one-sided (one wider than the keys) and two-sided.
inline const PropertyShape kBwdShapes[] = {
    {"b=2,h=6,hkv=2,s=777,sk=1001", Layout::kBSHD},  // GQA, sk > s, odd lengths
    {"b=1,h=4,hkv=4,s=333,sk=129", Layout::kBHSD},   // sk < s: causal rows that see no key
    {"b=1,h=3,hkv=1,s=100,sk=300", Layout::kBSHD},   // MQA, s shorter than a block
    {"b=2,h=2,hkv=2,s=257,sk=257", Layout::kBHSD},   // one past a tile
    {"b=1,h=2,hkv=1,s=1,sk=77", Layout::kBHSD},      // one query row
    {"b=1,h=2,hkv=2,s=77,sk=1", Layout::kBSHD},      // one key
};
inline const PropertyShape kBwdWindowShapes[] = {
    {"b=2,h=6,hkv=2,s=777,sk=1001,window=100", Layout::kBSHD},
    {"b=1,h=4,hkv=4,s=333,sk=129,window=17", Layout::kBHSD},
    {"b=1,h=4,hkv=2,s=1000,sk=1000,window=5000", Layout::kBSHD},
};
inline const PropertyShape kBwdTwoSidedShapes[] = {
    {"b=2,h=6,hkv=2,s=777,sk=1001,window=100,50", Layout::kBSHD},
    {"b=1,h=4,hkv=4,s=333,sk=129,window=-1,40", Layout::kBHSD},
};
// Sinks (a sink build serves sink calls only): AttnBuffers' logits by head (moderate; -1e4: none of
// the weight; 1e3: all of it) on GQA, MQA, rows that see no key (sk < s, causal: their LSE is the
// sink), one query row; and with a window.
inline const PropertyShape kBwdSinkShapes[] = {
    {"b=2,h=6,hkv=2,s=777,sk=1001,sinks=1", Layout::kBSHD},
    {"b=1,h=4,hkv=4,s=333,sk=129,sinks=1", Layout::kBHSD},
    {"b=1,h=3,hkv=1,s=100,sk=300,sinks=1", Layout::kBSHD},
    {"b=1,h=2,hkv=1,s=1,sk=77,sinks=1", Layout::kBHSD},
};
inline const PropertyShape kBwdWindowSinkShapes[] = {
    {"b=2,h=6,hkv=2,s=777,sk=1001,window=100,sinks=1", Layout::kBSHD},
    {"b=1,h=4,hkv=4,s=333,sk=129,window=17,sinks=1", Layout::kBHSD},
};
// Soft-caps (a soft-cap build serves every cap value): Gemma 2's 50, a tighter 5 (scores near the
// cap, where 1 - tanh^2 is small), GQA, MQA, rows that see no key, one query row; and with a window
// and sinks.
inline const PropertyShape kBwdSoftcapShapes[] = {
    {"b=2,h=6,hkv=2,s=777,sk=1001,softcap=50", Layout::kBSHD},
    {"b=1,h=4,hkv=4,s=333,sk=129,softcap=5", Layout::kBHSD},
    {"b=1,h=3,hkv=1,s=100,sk=300,softcap=50", Layout::kBSHD},
    {"b=1,h=2,hkv=1,s=1,sk=77,softcap=5", Layout::kBHSD},
};
inline const PropertyShape kBwdWindowSinkSoftcapShapes[] = {
    {"b=2,h=6,hkv=2,s=777,sk=1001,window=100,softcap=50,sinks=1", Layout::kBSHD},
    {"b=1,h=4,hkv=4,s=333,sk=129,window=17,softcap=5,sinks=1", Layout::kBHSD},
};

// Packed varlen batches (attntune_attention_backward_varlen; the builds of `varlen=1` problems):
// the worker's inputs (each problem's own lengths, drawn from varlen..s, then a ragged batch with
// empty, one-row, odd and longest sequences) and the ragged batch in the shape's layout: GQA with
// more keys than rows a sequence, one head a KV head (head-major packing), MQA; and with a window,
// sinks and a soft-cap.
inline const PropertyShape kBwdVarlenShapes[] = {
    {"b=5,h=6,hkv=2,s=777,sk=1001,varlen=1", Layout::kBSHD},
    {"b=4,h=4,hkv=4,s=333,sk=333,varlen=100", Layout::kBHSD},
    {"b=3,h=3,hkv=1,s=100,sk=300,varlen=1", Layout::kBSHD},
};
inline const PropertyShape kBwdVarlenVariantShapes[] = {
    {"b=5,h=6,hkv=2,s=777,sk=1001,varlen=1,window=100,softcap=50,sinks=1", Layout::kBSHD},
    {"b=3,h=4,hkv=1,s=300,sk=300,varlen=1,window=17,softcap=5,sinks=1", Layout::kBHSD},
};
// The sorted order of a packed batch's CTAs (varlen_lpt: bwd_prepost.cuh's build_cta_order): more
// sequences than a CTA has warps (the sort's warps loop), a sequence of more than 32 key blocks (its
// lanes loop) beside a short one, odd lengths with GQA; each with the worker's ragged batch too
// (empty and one-row sequences: no pairs, and pairs whose walk is empty).
inline const PropertyShape kBwdVarlenLptShapes[] = {
    {"b=40,h=4,hkv=2,s=300,sk=300,varlen=1", Layout::kBSHD},
    {"b=2,h=8,hkv=2,s=1024,sk=2500,varlen=1", Layout::kBHSD},
    {"b=5,h=6,hkv=2,s=777,sk=1001,varlen=1", Layout::kBSHD},
};

// A spread of `family`'s configs (`sample` per causal kind in `causals`; `window`: the problem's
// window suffix, "" for none) built for `arch`, each checked on `shapes` (pass=bwd).
inline void check_backward_spread(const char* family, const std::string& arch, int d, std::initializer_list<int> causals,
                                  const char* window, std::span<const PropertyShape> shapes, std::uint64_t seed,
                                  std::size_t sample = 8, const std::function<bool(const Config&)>& keep = {}) {
  cuda::Context ctx(0);
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/" + family + ".yaml");
  std::vector<Config> configs;
  std::vector<Problem> variants;
  for (int causal : causals) {
    const Problem p =
        Problem::parse(fmt::format("b=1,h=4,s=512,d={},dtype=bf16,causal={}{},pass=bwd", d, causal, window));
    ASSERT_TRUE(spread_configs(space, p, arch, property_sample(sample), configs, variants, keep)) << p.str();
  }
  PropertyRun run{family, d, arch, seed};
  run.extra = ",pass=bwd";
  check_configs(space, configs, variants, shapes, run);
}

// The bytes of the backward's outputs after the last call on `b`.
struct GradBits {
  std::vector<unsigned char> dq, dk, dv;
  bool operator==(const GradBits& o) const { return dq == o.dq && dk == o.dk && dv == o.dv; }
  std::string differs(const GradBits& o) const {  // which differ, for messages
    std::string w;
    for (const auto& [name, a, b] : {std::tuple{"dq", &dq, &o.dq}, std::tuple{"dk", &dk, &o.dk},
                                     std::tuple{"dv", &dv, &o.dv}})
      if (a->size() != b->size() || std::memcmp(a->data(), b->data(), a->size()) != 0) w += std::string(" ") + name;
    return w;
  }
};
inline GradBits grad_bits(const AttnBuffers& b) {
  auto get = [](const cuda::DeviceBuffer& x) {
    std::vector<unsigned char> h(x.bytes());
    x.download(h.data(), x.bytes());
    return h;
  };
  return {get(b.dq), get(b.dk), get(b.dv)};
}

// Shapes of several key blocks (64 to 256 keys a CTA: 4 to 40 a KV head) and query blocks, GQA
// groups whose CTAs walk every query head, s < sk and s > sk (bottom-right causal: rows that see no
// key). Windowed builds get the windows in `window` appended.
inline const char* const kDeterministicShapes[] = {
    "b=2,h=6,hkv=2,s=777,sk=1001",   // GQA 3, odd lengths
    "b=1,h=8,hkv=2,s=1024,sk=2500",  // GQA 4, sk > s
    "b=1,h=4,hkv=1,s=1531,sk=700",   // MQA, s > sk
};
// Packed varlen batches (the varlen kinds' builds): each problem's lengths drawn from varlen=1..s,
// GQA groups, sk > s (varlen needs sk >= s); their workspaces are one run of rows a head.
inline const char* const kDeterministicVarlenShapes[] = {
    "b=3,h=6,hkv=2,s=777,sk=1001,varlen=1",
    "b=2,h=8,hkv=2,s=1024,sk=2500,varlen=1",
};
// The call of another size between the second and third runs: a larger workspace of other layout,
// so that a semaphore left over (not zeroed) would let the third run's CTAs add out of turn.
inline const char* const kOtherShape = "b=3,h=4,hkv=4,s=300,sk=2222";

// The deterministic mode: each build on each shape runs the same backward call twice, then a call of
// another size, then the first again: the three runs' dQ, dK and dV are the same bits (memcmp), and
// each passes FlashAttention-2's criterion against the reference (outputs NaN-poisoned before each
// run). The same inputs without the mode are run twice too: their dK and dV must be the same bits
// (register sums), their dQ may differ (the atomics' order), and the count of pairs whose dQ did
// says whether these shapes would have caught a mode that did not order the additions. A spread of d=64 and d=128 builds, non-causal, causal, a causal window, a
// two-sided one and packed varlen batches causal and not (ATTNTUNE_PROPERTY_SAMPLE=N: N configs a kind, default 2; ATTNTUNE_TEST_PROGRESS=1: a
// line before each launch, to name a build that hangs). `also`: for each filter, one more config of
// each kind that it accepts (a family's newest paths, which an even spread may miss).
inline void check_determinism(cuda::Context& ctx, const char* family, const std::string& arch, std::uint64_t seed,
                              const std::vector<std::function<bool(const Config&)>>& also = {},
                              std::initializer_list<int> head_dims = {64, 128}) {
  const SearchSpace space = SearchSpace::load(source_dir() + "/search_spaces/" + family + ".yaml");
  std::vector<Config> configs;
  std::vector<Problem> variants;
  std::vector<std::string> windows;  // each config's window suffix for its shapes
  for (int d : head_dims)
    for (const char* kind :
         {"causal=0", "causal=1", "causal=1,window=100", "causal=0,window=100,50", "causal=1,varlen=1", "causal=0,varlen=1"}) {
      const Problem p = Problem::parse(fmt::format("b=1,h=4,s=512,d={},dtype=bf16,{},pass=bwd", d, kind));
      ASSERT_TRUE(attntune::testing::spread_configs(space, p, arch, attntune::testing::property_sample(2), configs,
                                                    variants))
          << p.str();
      for (const auto& keep : also) attntune::testing::spread_configs(space, p, arch, 1, configs, variants, keep);
      const std::string k = kind;
      const std::string w = k.find(",window") != std::string::npos   ? k.substr(k.find(",window"))
                            : k.find(",varlen") != std::string::npos ? k.substr(k.find(",varlen"))
                                                                     : std::string();
      windows.resize(configs.size(), w);
    }
  BuildPoolOptions pool_opts;
  pool_opts.nvrtc_options = family_nvrtc_options(family);
  pool_opts.worker_argv = {attntune::testing::attntune_bin(), "build-worker"};
  BuildPool pool(pool_opts);
  std::map<std::uint64_t, std::size_t> index_of;  // ticket -> configs[i]
  for (std::size_t i = 0; i < configs.size(); ++i)
    index_of[pool.submit({configs[i], render_kernel(space, configs[i], variants[i], arch), arch})] = i;
  const Reference ref(arch);
  const bool progress = std::getenv("ATTNTUNE_TEST_PROGRESS") != nullptr;
  int runs = 0, nondeterministic_differed = 0, nondeterministic_pairs = 0;
  while (auto o = pool.next()) {
    ASSERT_EQ(o->build.status, "ok") << config_str(o->job.config) << "\n" << o->build.log;
    const std::size_t i = index_of.at(o->ticket);
    const Problem& v = variants[i];
    const LoadedBuild kernel(o->build.cubin, o->job.kernel.launch);
    // A varlen build's shapes carry their own varlen=N (its suffix is the build's only).
    const bool varlen = v.is_varlen();
    auto problem = [&](const char* dims) {
      return Problem::parse(fmt::format("{},d={},dtype={},causal={}{},pass=bwd", dims, v.d, dtype_name(v.dtype),
                                        v.causal ? 1 : 0, varlen ? "" : windows[i].c_str()));
    };
    const std::string name = config_str(o->job.config);
    const std::span<const char* const> shapes =
        varlen ? std::span<const char* const>(kDeterministicVarlenShapes) : std::span<const char* const>(kDeterministicShapes);
    for (const char* dims : shapes) {
      const Problem p = problem(dims);
      ++seed;
      AttnBuffers buf(p, seed % 2 ? Layout::kBSHD : Layout::kBHSD, {}, seed);
      ref.fill(buf, seed);
      attntune_plan::Call call = buf.call();
      call.deterministic = 1;
      auto run = [&](const char* which) {
        ref.poison_output(buf);
        if (progress) std::fprintf(stderr, "[progress] %s on %s: %s\n", name.c_str(), p.str().c_str(), which);
        kernel.launch(call);
        ctx.synchronize();
        const Verdict verdict = ref.check(buf);
        EXPECT_EQ(verdict.status, "ok") << name << " on " << p.str() << ", " << which << ": " << verdict.detail();
        ++runs;
        return grad_bits(buf);
      };
      const GradBits first = run("deterministic, first run");
      const GradBits second = run("deterministic, second run");
      EXPECT_TRUE(second == first) << name << " on " << p.str() << ": the second run's" << second.differs(first)
                                   << " differ from the first's";
      {  // Another size between: its own workspaces' layout, its own turns.
        const Problem q = problem(varlen ? "b=4,h=4,hkv=4,s=300,sk=2222,varlen=1" : kOtherShape);
        AttnBuffers other(q, Layout::kBSHD, {}, seed + 1000);
        ref.fill(other, seed + 1000);
        attntune_plan::Call oc = other.call();
        oc.deterministic = 1;
        if (progress) std::fprintf(stderr, "[progress] %s on %s: deterministic, between\n", name.c_str(), q.str().c_str());
        kernel.launch(oc);
        ctx.synchronize();
        const Verdict verdict = ref.check(other);
        EXPECT_EQ(verdict.status, "ok") << name << " on " << q.str() << " (between): " << verdict.detail();
      }
      const GradBits third = run("deterministic, after another size");
      EXPECT_TRUE(third == first) << name << " on " << p.str() << ": the run after a call of another size has"
                                  << third.differs(first) << " differ from the first's";
      // For the record: the mode off, twice, on the same inputs. Its dK and dV are sums in registers
      // in a fixed order (the walk's, another than the mode's: their bits may differ from the mode's)
      // and must be the same bits run to run; its dQ may differ.
      call.deterministic = 0;
      const GradBits a = run("not deterministic"), b = run("not deterministic, again");
      ++nondeterministic_pairs;
      if (a.dq != b.dq) ++nondeterministic_differed;
      EXPECT_TRUE(a.dk == b.dk && a.dv == b.dv) << name << " on " << p.str()
                                                << ": without the mode, dK or dV differ run to run";
    }
  }
  std::printf("%s deterministic: %zu configs, %d runs; without the mode, %d of %d pairs of runs differed\n", family,
              configs.size(), runs, nondeterministic_differed, nondeterministic_pairs);
}

}  // namespace attntune::testing

#endif  // ATTNTUNE_TESTS_GPU_BWD_CHECKS_HPP
