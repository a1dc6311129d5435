// Running attention candidates on the GPU: inputs, the trusted reference, validation by
// FlashAttention-2's criterion and event timing (the builds launch through eval/loaded_build.hpp).
// Used by the GPU tests and the evaluator; knows nothing of the store or the search.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "cuda/driver.hpp"
#include "eval/loaded_build.hpp"
#include "families/family.hpp"
#include "templates/common/attn_params.h"
#include "templates/common/bwd_params.h"
#include "templates/common/kv_scales.h"
#include "templates/common/launch_plan.h"

namespace attntune {

enum class Layout { kBHSD, kBSHD };  // [batch, heads, seq, dim] or [batch, seq, heads, dim]
const char* layout_name(Layout l);

// Device tensors of one problem in one layout, last dim contiguous. A paged problem (page > 0)
// also has its KV cache as the kvcache entry point takes it: K and V in pages [num_pages, page,
// hkv, d] that a block table maps (shuffled, with spare pages: no sequence's pages lie in order),
// and each sequence's key count (`seqlens`, on the device as cache_seqlens). k and v then hold the
// same keys contiguously ([b, hkv, sk, d]): what the reference reads. Cache rows past a sequence's
// length hold NaN, as a stale cache may hold anything: they must never reach an output.
//
// A varlen problem (varlen > 0) is a packed batch, as attntune_attention_forward_varlen takes it:
// `seqlens` are the query rows of each sequence (empty: problem.q_lens(); given, their count is
// problem.b), each 0..s, with seqlens[i] + sk - s keys; q and o are [total_q, h, d], k and v [total_k, hkv, d] (kBSHD, the
// packed layout of flash_attn_varlen_func; kBHSD: head-major [h, total_q, d], the same rows through
// other strides), lse [h, total_q], and cu_seqlens_q/k the prefix sums on the device. kGuardRows
// rows of NaN follow q, k and v: a kernel that reads past the packed rows and lets it reach an
// output fails.
// A latent problem (latent=1: V is K's first dv columns) has no V buffer (v and v_pages stay empty):
// params() and call() pass V as K's pointer with K's strides (dense and paged), so that the
// reference, validation and timing all see the aliasing a latent build requires.
// An FP8 cache (kv_fp8: K and V FP8 e4m3, Q and O in the problem's dtype; not with varlen) holds
// one byte a K/V element in k, v and the pages (strides count elements, so bytes, as the call's do),
// and its dequantisation scales: k_descale / v_descale, [b, hkv] fp32 tables drawn in [0.25, 2]
// from fixed seeds (kv_descales; K's and V's differ, a latent problem's too), passed by params()
// (the reference's view, in variant) and call() with strides {hkv, 1}, or, with per_tensor_descale
// set, strides {0, 0}: one scale a tensor, each table's entry 0 (FlashAttention-3's descale_k/v
// expanded from one scale). FP8 problems need sm_89 or newer (Reference::fill refuses them below).
// An FP8 forward (qkv_fp8, `dtype=fp8`: dense, kBHSD) holds Q, K and V in e4m3 too (q, k, v one byte an
// element: the reference reads them), V also transposed as the kernels take it (vt: [b, hkv, dv,
// vt_ld] bytes, vt_ld = sk rounded up to 16, TMA's stride unit; the bytes past sk NaN), O in bf16,
// and Q's scales beside K's and V's (q_descale, [b, hkv], from kDescaleSeedQ; per_tensor_descale
// applies to all three). call() passes vt and the three tables.
// The backward pass (pass=bwd: dense, one head dim) also holds dout (dO: o's
// shape, in the dtype, drawn as q, k and v are) and its outputs dq, dk and dv (q's, k's and v's
// shapes: dk and dv have hkv heads), all in the layout; o and lse are then inputs, the forward of q,
// k and v as the fp32 reference computes it (Reference::fill: o rounded to the dtype, lse fp32, natural
// log, [b, h, s] contiguous), and poison_output poisons dq, dk and dv instead.
struct AttnBuffers {
  // seqlens: keys of each sequence of a paged problem (empty: sk each), query rows of each sequence
  // of a varlen problem (empty: its q_lens()); table_seed shuffles pages. contiguous_kv false: a
  // paged problem's pages alone, no contiguous K and V (see contiguous_kv below).
  AttnBuffers(const Problem& p, Layout layout, std::vector<int> seqlens = {}, std::uint64_t table_seed = 1,
              bool contiguous_kv = true);
  // Frees a paged problem's contiguous K and V (the pages keep the keys; Reference::fill then draws
  // straight into them): once its references are computed, nothing reads them.
  void drop_contiguous_kv();
  AttnParams params() const;  // the reference's view: pointers, strides, sizes, scale 1/sqrt(d)
  // An FP8 cache's scales as params() and call() pass them (the strides per per_tensor_descale); all
  // zero for a 16-bit cache. The reference's attn_reference_kv_fp8 takes them as its last argument.
  KvScales kv_scales() const;
  // The backward pass's view (pass=bwd): params() as fwd, dout, dq, dk, dv and their strides (the
  // workspaces null: the reference has none).
  BwdParams bwd_params() const;
  // The call of the problem's entry point on these tensors: attntune_attention_forward,
  // attntune_attention_forward_kvcache through the block table for a paged problem,
  // attntune_attention_forward_varlen (strides {0, head, row}, seqlen_q/k the longest sequence's,
  // total_q/k the packed rows) for a varlen problem, or attntune_attention_backward (kEntryBackward:
  // out and lse the forward's O and LSE, read; dout, dq, dk, dv and their strides) for the backward pass
  // (attntune_attention_backward_varlen, kEntryBackwardVarlen, with varlen's fields, for a varlen one).
  attntune_plan::Call call() const;
  const int* seqlens_device() const;  // null for a dense or varlen problem
  // Rows of the output and of lse: b * h * s, or h * total_q for a varlen problem.
  std::size_t out_rows() const;
  // Rows of K's (and dK's) heads: b * hkv * sk, or hkv * total_k for a varlen problem.
  std::size_t key_rows() const;
  static constexpr int kGuardRows = 256;  // varlen: NaN rows after the packed q, k and v
  Problem problem;
  Layout layout;
  std::vector<int> seqlens;
  int pages_per_seq = 0, num_pages = 0;
  // varlen: prefix sums of the query and key rows ([b + 1]), their totals and the longest sequence's.
  std::vector<int> cu_q, cu_k;
  long long total_q = 0, total_k = 0;
  int max_q = 0, max_k = 0;
  cuda::DeviceBuffer q, k, v, o, lse;
  cuda::DeviceBuffer k_pages, v_pages, block_table, cache_seqlens;  // paged problems only
  // A paged problem's keys in contiguous K and V too ([b, hkv, sk, d], what the reference reads;
  // Reference::fill draws them there and scatters them into the pages), or in the pages alone
  // (false: k and v empty, fill draws the same values straight into the pages; the entry point reads
  // only the pages). Timing inputs never need them; validation inputs only until their references
  // are computed. A decode of b=64, 32 KV heads, sk=32k, d=128 holds 34 GB of K and V: with both
  // copies in the validation and the timing inputs (137 GB) it failed on an 80 GB H100 (run 383).
  bool contiguous_kv = true;
  cuda::DeviceBuffer cu_seqlens_q, cu_seqlens_k;                     // varlen problems only
  // A problem with sinks: [h] fp32 logits (sink_logits), by head in turns: a random one in [-2, 10],
  // a very negative one (-1e4: no effect), a very large one (1e3: every row's output ~0, LSE 1e3).
  std::vector<float> sink_values;
  cuda::DeviceBuffer sinks;
  // An FP8 cache's scales (kv_fp8 problems only): [b, hkv] each, row-major, on the host and the device.
  std::vector<float> k_descale_values, v_descale_values;
  cuda::DeviceBuffer k_descale, v_descale;
  // false: one scale per (sequence, KV head), strides {hkv, 1} (what the worker validates and times
  // with); true: one scale per tensor, strides {0, 0} (entry 0 of each table). Read by params() and
  // call(); a ReferenceCache holds the form its references were computed with.
  bool per_tensor_descale = false;
  // FP8 V (an FP8 cache's or an FP8 forward's) drawn around this mean instead of 0 (tests: O's
  // running sum then grows with the keys, where an accumulator of reduced precision drifts; a
  // zero-mean V keeps it small). Read by Reference::fill.
  float v_mean = 0.f;
  // Bytes of one K/V element: 1 for an FP8 cache or an FP8 forward, else 2; Q's 1 for an FP8
  // forward, else 2; O's always 2.
  std::size_t kv_elem_bytes() const { return problem.kv_fp8 || problem.qkv_fp8 ? 1 : 2; }
  std::size_t q_elem_bytes() const { return problem.qkv_fp8 ? 1 : 2; }
  // An FP8 forward: V transposed (above), its row pitch in bytes, and Q's scales.
  cuda::DeviceBuffer vt;
  long long vt_ld = 0;
  std::vector<float> q_descale_values;
  cuda::DeviceBuffer q_descale;
  // Q's scale table and its {batch, head} strides as call() and the reference take them (null, {0, 0}
  // unless an FP8 forward).
  const float* q_scale_table(long long (&stride)[2]) const;
  // The backward pass's tensors (pass=bwd problems only): dO read, dQ, dK, dV written.
  cuda::DeviceBuffer dout, dq, dk, dv;
  // The forward's O (in the dtype, as o holds it) and LSE that Reference::fill computed for the inputs
  // of `forward_seed`, on the host: a later fill with that seed draws the same q, k and v and uploads
  // these rather than run the reference forward again (a candidate may have written over o and lse in
  // device memory, but not here).
  std::vector<std::uint16_t> forward_o;
  std::vector<float> forward_lse;
  std::optional<std::uint64_t> forward_seed;
};

// The dequantisation scales an FP8 cache is validated and timed with: n values uniform in [0.25, 2]
// from `seed` (AttnBuffers draws K's from kDescaleSeedK, V's from kDescaleSeedV). Not 1, so that a
// kernel that ignores them, or swaps K's and V's, or reads another sequence's or head's, fails.
std::vector<float> kv_descales(std::int64_t n, std::uint64_t seed);
constexpr std::uint64_t kDescaleSeedK = 0x6b64, kDescaleSeedV = 0x7664, kDescaleSeedQ = 0x7164;

// Whether a device of `arch` ("sm_80", "sm_90a") can validate and time `p`: an FP8 KV cache needs
// sm_89 or newer (its inputs are rounded to e4m3 by cvt.rn.satfinite.e4m3x2.f32). InputError with
// the reason otherwise.
void check_device_serves(const Problem& p, const std::string& arch);

// The sink logits a problem with sinks is validated and timed with (AttnBuffers::sink_values).
std::vector<float> sink_logits(std::int64_t heads, std::uint64_t seed);

// Keys per sequence for validating a paged problem: sk, 0, 1, an odd count and a random one in
// turn over the batch (sk alone for a batch of one).
std::vector<int> ragged_seqlens(const Problem& p, std::uint64_t seed);

// Query rows per sequence of the ragged batch a varlen problem is also validated on: seven
// sequences, 0, s (the longest), 1, an odd length, two random ones and 0 again; all but s at most
// min(s, 1531), so the batch stays small.
std::vector<int> varlen_ragged_lens(const Problem& p, std::uint64_t seed);

// The inputs a candidate is validated on for problem p: p itself; a paged problem with ragged
// lengths (ragged_seqlens) and, for a batch too small to hold every kind of length, a second
// batch of five sequences (0, 1, odd, all and a random count of keys; sk at most 1531); a varlen
// problem with its own lengths (packed, kBSHD), then a batch of varlen_ragged_lens. The backward pass:
// p, then (unless p's s and sk are both odd already) odd_lengths(p), so that the kernels' tails of
// query and key blocks are exercised.
std::vector<std::unique_ptr<AttnBuffers>> validation_inputs(const Problem& p, std::uint64_t seed);

// A small problem of odd lengths beside p (the backward pass's second validation input): one sequence,
// p's heads, head dim, dtype, causality and window; s odd and at most 1531 (p's when it is shorter, made
// odd), and sk odd on the same side of s as p's (equal, longer by up to 1024, or shorter but at least 1).
Problem odd_lengths(const Problem& p);

// One gradient of the backward pass against FA2's criterion (Verdict::grads).
struct GradVerdict {
  std::string name;    // dq | dk | dv
  std::string status;  // ok | wrong_result | nan_or_unwritten
  double max_abs_err = 0, err_bound = 0, lowp_err = 0;
  unsigned nonfinite = 0;
};

// FA2's criterion: max|out - ref32| <= 2 * max|lowp - ref32| + atol, every element written and
// finite, LSE within lse_tol of the reference's (and -inf exactly where no key is visible). The
// backward pass: the same for each of dQ, dK and dV (grads, in that order; no LSE), ok only when all
// three are; status, max_abs_err, err_bound, lowp_err are then the first failing gradient's (else the
// one nearest its bound) and nonfinite the three's sum.
struct Verdict {
  std::string status;  // ok | wrong_result | nan_or_unwritten
  double max_abs_err = 0, err_bound = 0, lowp_err = 0, lse_err = 0;
  // The LSE's bound: kLseTolerance, or for the FP8 forward (dtype=fp8, whose FP8 MMAs keep fewer bits
  // of Q.K^T's sums than fp32) FlashAttention-2's criterion on the LSE: 2 x the same-dtype reference's
  // LSE error (scores rounded to bf16) + kLseTolerance.
  double lse_bound = 0, lse_lowp_err = 0;
  unsigned nonfinite = 0, lse_mismatch = 0;
  std::vector<GradVerdict> grads;  // the backward pass only
  std::string detail() const;  // one line for logs; the backward pass: the failing gradients first, by name
};
double criterion_atol(DType t);
constexpr double kLseTolerance = 1e-3;

// The reference kernels (templates/reference/reference.cu), NVRTC-compiled for the device.
class Reference {
 public:
  explicit Reference(const std::string& arch);
  // Fresh normal random inputs (mean 0, std 1) from `seed`, the KV cache's pages scattered from
  // them; poisons o and lse with NaN. An FP8 cache's K and V are the same draws rounded to e4m3
  // (fill_normal_e4m3), its pages' rows past each length NaN bytes (K's 0x7F, V's 0xFF); InputError
  // (check_device_serves) on a device older than sm_89. The backward pass: q, k, v and dout drawn,
  // then o and lse the fp32 reference forward's of them (o rounded to the dtype; AttnBuffers keeps
  // them for the next fill of the seed), and dq, dk, dv poisoned.
  void fill(AttnBuffers& b, std::uint64_t seed) const;
  // NaN into what a candidate writes: o and lse, or the backward pass's dq, dk and dv.
  void poison_output(AttnBuffers& b) const;
  // Runs the fp32 and same-dtype references on b's inputs, then compares b's output with them.
  Verdict check(const AttnBuffers& b) const;
  // The reference output itself, (batch, heads, seq, dim) contiguous, and its LSE (for tests); for a
  // varlen problem (heads, total_q, dim) and (heads, total_q), as the packed LSE. The forward of the
  // inputs for a backward problem too.
  std::vector<float> output(const AttnBuffers& b, bool lowp, std::vector<float>* lse = nullptr) const;
  // The backward pass's reference gradients of b's inputs (tests): the fp32 or same-dtype forward, then
  // the backward on it; dq (b, h, s, d), dk (b, hkv, sk, d), dv (b, hkv, sk, dv), contiguous.
  struct Gradients {
    std::vector<float> dq, dk, dv;
  };
  Gradients gradients(const AttnBuffers& b, bool lowp) const;
  // The e4m3 conversions of the FP8 path (tests): floats rounded as fill rounds K and V (to nearest
  // even, saturated to +-448; InputError below sm_89), and bytes read as the reference reads them.
  std::vector<std::uint8_t> to_e4m3(const std::vector<float>& x) const;
  std::vector<float> from_e4m3(const std::vector<std::uint8_t>& x) const;

 private:
  friend class ReferenceCache;
  // attn_reference, or attn_reference_kv_fp8 for an FP8 cache.
  const cuda::Function& reference_kernel(const Problem& p) const {
    return p.qkv_fp8 ? ref_qkv_fp8_ : p.kv_fp8 ? ref_fp8_ : ref_;
  }
  // One launch of it on b's inputs (its lengths and scales as b holds them): o, (rows, dv) fp32, and
  // lse, (rows), device addresses; lowp rounds as a same-dtype framework would.
  void launch_forward(const AttnBuffers& b, bool lowp, CUdeviceptr o, CUdeviceptr lse) const;
  // The backward pass's o and lse inputs: the fp32 reference forward of b's inputs (drawn from `seed`),
  // or b's host copy of it when b holds that seed's.
  void fill_forward(AttnBuffers& b, std::uint64_t seed) const;
  // The backward pass's references of b's inputs into dq, dk, dv (fp32, contiguous): the forward
  // (fp32 or same-dtype) into o and lse (the reference's own), D, then the gradients. o: (b, h, s, dv)
  // fp32, lse and dsum (b, h, s).
  void backward_reference(const AttnBuffers& b, bool lowp, cuda::DeviceBuffer& o, cuda::DeviceBuffer& lse,
                          cuda::DeviceBuffer& dsum, cuda::DeviceBuffer& dq, cuda::DeviceBuffer& dk,
                          cuda::DeviceBuffer& dv) const;
  std::string arch_;
  cuda::Module module_;
  cuda::Function fill_, ref_, compare_, scatter_, fill_pages_, fill_pages_e4m3_;
  cuda::Function fill_e4m3_, ref_fp8_, scatter_e4m3_, quantize_e4m3_, dequantize_e4m3_;
  cuda::Function ref_qkv_fp8_, transpose_e4m3_;  // the FP8 forward's
  cuda::Function bwd_rowdot_, bwd_dq_, bwd_dkdv_, compare_grad_, store_rounded_;
};

// The fp32 and same-dtype reference outputs of one set of inputs, computed once and then compared
// with any number of candidate outputs on those inputs (the evaluator's worker keeps one per
// problem). The naive reference is the slow part of a check; this runs it once per problem. The
// backward pass: dQ, dK and dV of both references (each from its own forward).
class ReferenceCache {
 public:
  // Runs both references on `inputs` (the fp32 one timed with events). With keep_host_copy, the
  // results are also kept in host memory for restore().
  ReferenceCache(const Reference& ref, const AttnBuffers& inputs, bool keep_host_copy = true);
  // Compares b's output with the cached results; b must hold the same problem and inputs.
  Verdict check(const AttnBuffers& b) const;
  // One launch of the fp32 reference kernel, in microseconds (a yardstick for deadlines); the backward
  // pass: its forward and backward kernels together.
  double reference_us() const { return reference_us_; }
  // Re-uploads the results from the host copy: after a candidate that may have written outside its
  // output (a failed check), so later candidates are not compared with what it scribbled.
  void restore();

 private:
  // check() of a backward problem: dq, dk and dv each by the criterion.
  Verdict check_gradients(const AttnBuffers& b) const;
  const Reference* ref_;
  Problem problem_;
  std::vector<int> seqlens_;
  bool per_tensor_descale_ = false;
  cuda::DeviceBuffer out32_, outlow_, lse32_, lselow_;  // lselow_: the FP8 forward's LSE bound
  mutable cuda::DeviceBuffer stats_;
  std::vector<float> host_out32_, host_outlow_, host_lse32_, host_lselow_;
  // The backward pass: dq, dk, dv of the fp32 and the same-dtype references, and their host copies.
  cuda::DeviceBuffer grad32_[3], gradlow_[3];
  std::vector<float> host_grad32_[3], host_gradlow_[3];
  double reference_us_ = 0;
};

// Inputs for time_kernel: one set of random inputs (from `seed`), built once per problem and
// reused by every candidate of it. One set, reused launch after launch, as the peers are timed:
// warm in L2 when they fit, as a model's freshly written q/k/v are.
class TimingInputs {
 public:
  TimingInputs(const Reference& ref, const Problem& p, std::uint64_t seed);
  const Problem& problem() const { return buffers_.problem; }
  const AttnBuffers& buffers() const { return buffers_; }

 private:
  AttnBuffers buffers_;
};

struct TimingStats {
  double median_us = 0, min_us = 0, max_us = 0, stdev_us = 0;
  int count = 0;
};
// Timed as PyTorch's peers are (tools/compare_sdpa.py, and the PyTorch peer timings): back-to-back
// launches captured in a CUDA graph (20, or fewer but >= ~1 ms of work), ~50 ms of warm-up
// replays, then samples, each one replay between two events divided by its launches, until their
// median is stable within 1% (at least 10 samples) or max_reps samples, for at least min_seconds
// and at most ~max_seconds. Timing inputs are random (from `seed`), never constants: constant
// inputs make every softmax row flat and would flatter lazy rescaling.
TimingStats time_kernel(const LoadedBuild& k, const Reference& ref, const Problem& p, std::uint64_t seed,
                        int max_reps = 200, double max_seconds = 2.0, double min_seconds = 0);
// The same on inputs prepared beforehand.
TimingStats time_kernel(const LoadedBuild& k, const TimingInputs& inputs, int max_reps = 200, double max_seconds = 2.0,
                        double min_seconds = 0);

}  // namespace attntune
