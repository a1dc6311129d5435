// Template families: how a (space, config, problem) becomes one self-contained CUDA source and a
// launch geometry. Values reach the source only as validated integers (ints, bools as 0/1, enum
// values as their index): the space has already checked every value against its domain.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "space/problem.hpp"
#include "space/search_space.hpp"

namespace attntune {

struct FamilyInfo {
  std::string name;         // "flash_fwd_mma": folder under templates/, the YAML's family:
  std::string main_file;    // embedded path of the kernel file
  std::string kernel_name;  // extern "C" entry point
};

// The family of a space; InputError naming the known ones for an unknown family.
const FamilyInfo& family_info(const std::string& name);
std::vector<std::string> known_families();

struct RenderedKernel {
  std::string source;       // flattened: no #include left
  std::string kernel_name;
  std::string source_hash;  // content_hash(source): the candidate's identity and cache key
};

// Problem fields that the kernel bakes in (head dim, dtype, causal) and the config as #defines,
// then the family's files with their #includes inlined. Sequence lengths, batch and heads stay
// run-time arguments, so one build serves every shape with the same d/dtype/causal.
RenderedKernel render_kernel(const SearchSpace& space, const Config& config, const Problem& problem,
                             const std::string& arch);

// #defines alone (for the export and tests): name value pairs, in order.
std::vector<std::pair<std::string, std::int64_t>> kernel_defines(const SearchSpace& space, const Config& config,
                                                                 const Problem& problem, const std::string& arch);

// An embedded file with its quoted #includes replaced by the embedded files they name (each once).
std::string flatten_includes(const std::string& embedded_path);

// Kernels that load through the tensor-memory accelerator (flash_fwd_wgmma) take, after
// AttnParams, tensor maps of Q, K and V that the launcher encodes for each problem
// (tuner/eval/attention_gpu.cpp): 4-d (head_dim, seqlen, heads, batch), box (64, rows), 128B swizzle.
struct TmaSpec {
  unsigned q_rows = 0, kv_rows = 0;  // box rows of Q's map and of K's and V's; 0: no tensor maps
  unsigned head_dim = 0;
  bool bf16 = false;
};

struct LaunchGeometry {
  unsigned grid[3] = {1, 1, 1};
  unsigned block = 0;
  unsigned smem_bytes = 0;  // dynamic shared memory
  TmaSpec tma;
  // The kernel loops over its grid's work tiles: launched as min(tiles, SM count) CTAs in x
  // (grid[0] * h * b tiles), one per SM, instead of (grid[0], h, b).
  bool persistent = false;
  // With persistent: the last partial round of work tiles is shared out by K/V iterations
  // (flash_fwd_wgmma's split_tail); the launcher passes a workspace of
  // split_workspace_floats(CTAs) floats and split_counters(tail tiles) zeroed ints.
  bool split_tail = false;
  // With persistent, causal (flash_fwd_wgmma with a producer warpgroup): the CTAs take their work
  // tiles from a counter; the launcher passes two zeroed ints (the kernel leaves them at zero).
  bool dynamic_tiles = false;
  unsigned consumer_warps = 0;  // for the workspace's size
  // With persistent: CTAs per cluster along x, the kernel's compiled-in __cluster_dims__ (2 with
  // flash_fwd_wgmma's kv_multicast: CTAs 2k and 2k+1 share each K/V TMA load); 1 otherwise. The
  // work tiles are then persistent_work_tiles(grid[0], h, b, cluster), the grid persistent_ctas(...).
  unsigned cluster = 1;
};
// Every field above travels to the worker (tuner/eval/protocol.cpp): a field added here must be
// added there and to Protocol.MessagesRoundTrip, and the size here updated.
static_assert(sizeof(TmaSpec) == 16 && sizeof(LaunchGeometry) == 48, "LaunchGeometry changed: update the protocol");

// The work tiles a persistent kernel walks: its `m_blocks` query blocks (ceil(seqlen_q / block_m),
// the geometry's grid[0]) rounded up to a multiple of `cluster`, times heads and batch. Padded so
// that the tiles a cluster takes together (2k and 2k+1) are always of one (head, batch), whose K
// and V they share; the kernel leaves the padding ("ghost") tiles idle. cluster 1: no padding.
unsigned long long persistent_work_tiles(unsigned long long m_blocks, unsigned long long heads,
                                         unsigned long long batch, unsigned cluster);
// The CTAs of a persistent grid over `tiles` work tiles (a multiple of `cluster`): one per tile, at
// most one per SM in whole clusters (sm_count rounded down to a multiple of cluster), and at most
// max_clusters clusters (how many fit on the device at once, cuOccupancyMaxActiveClusters; 0:
// unknown, the SMs alone bound it). A multiple of `cluster`, never 0 for tiles > 0.
unsigned persistent_ctas(unsigned long long tiles, unsigned sm_count, unsigned max_clusters, unsigned cluster);

// The stream-K tail of a persistent grid of `tiles` work tiles over `ctas` CTAs, each of
// `iterations` K/V iterations: how many tail tiles to split (0: none). Split only when the tail
// gives every CTA at least two iterations and the kernel's 32-bit share arithmetic cannot
// overflow (tail * iterations * ctas and tiles + 2 * ctas below 2^31).
unsigned split_tail_tiles(unsigned long long tiles, unsigned ctas, unsigned long long iterations);
// The workspace a split launch needs: per CTA two pieces, per consumer warp 32 lanes of
// head_dim / 2 + 4 floats (partial O, m, l); and one counter per tail tile and consumer warp.
std::size_t split_workspace_floats(unsigned ctas, unsigned consumer_warps, unsigned head_dim);
std::size_t split_counters(unsigned tail, unsigned consumer_warps);
// grid = (ceil(s / block_m), h, b); block and smem from the space's derived `threads` and
// `smem_bytes` (InputError if the space lacks them); tma, persistent and cluster for the TMA family
// (a config without kv_multicast, recorded before it existed, has none: cluster 1).
LaunchGeometry launch_geometry(const SearchSpace& space, const Config& config, const Problem& problem,
                               const std::string& arch);

// The arch to build a space's kernels for on a device whose compute capability is `device_arch`
// ("sm_90"): the device's own when the space lists it, else its arch-specific variant ("sm_90a":
// wgmma, setmaxnreg) when the space lists that, else the device's own (which the space refuses).
std::string space_arch_for_device(const SearchSpace& space, const std::string& device_arch);

// NVRTC options every build of a family uses (besides --gpu-architecture); part of the cache key.
std::vector<std::string> family_nvrtc_options(const FamilyInfo& family);

// A family that a test registers at run time, with its own rendering and launch geometry: the
// reliability suite's planted-fault family (tests/reliability/) maps each of its configs to a real
// flash_fwd_mma candidate or a faulty kernel of tests/data/faults/, so that faults go through the
// campaign machinery like any candidate. The product never registers one: known_families() and the
// families a YAML file can name are the built-in ones plus whatever the running process registered.
struct FamilyHooks {
  std::function<RenderedKernel(const SearchSpace&, const Config&, const Problem&, const std::string& arch)> render;
  std::function<LaunchGeometry(const SearchSpace&, const Config&, const Problem&, const std::string& arch)> geometry;
};
// logic_error if the name is taken or a hook is missing. Not thread-safe: register before any use.
void register_test_family(const FamilyInfo& info, FamilyHooks hooks);

// "block_n" -> "BLOCK_N"
std::string macro_name(const std::string& param);

}  // namespace attntune
