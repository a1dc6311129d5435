// One NVRTC build of a candidate (run inside build-worker processes by eval/build_pool) and the
// key it is cached under in the build cache (core/record_stores.hpp; the store's builds table): (source hash, arch, NVRTC version, options).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/records.hpp"
#include "families/family.hpp"

namespace attntune {

struct BuildJob {
  Config config;
  RenderedKernel kernel;
  std::string arch;
};

struct BuildOutcome {
  BuildJob job;
  BuildRecord build;      // status ok | compile_error | compile_timeout (BuildPool)
  bool cache_hit = false;
  std::uint64_t ticket = 0;  // BuildPool::submit's answer
};

// The cache key of a rendered kernel for an arch (options: the NVRTC flags, joined).
BuildKey build_key(const RenderedKernel& kernel, const std::string& arch, const std::vector<std::string>& options);

// One synchronous NVRTC build of a source (no cache): status ok with the cubin, or compile_error
// with NVRTC's log. Throws EnvError when NVRTC is missing. (What `attntune build-worker` runs.)
BuildRecord build_source(const std::string& source, const std::string& program_name, const std::string& arch,
                         const std::vector<std::string>& options);

// build_source of a rendered kernel, named after its entry point.
BuildRecord build_kernel(const RenderedKernel& kernel, const std::string& arch,
                         const std::vector<std::string>& options);


}  // namespace attntune
