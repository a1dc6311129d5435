// How many proposals `tune` keeps in flight on a GPU: enough NVRTC builds running that the GPU
// never waits for one, and no more, because every proposal in flight is made without the results
// still to come (docs/log/PERFORMANCE.md, search efficiency: at 18 in flight evo is no better than
// random search on the causal landscape; at 8 it is 1.24x).
//
// By Little's law, builds that take B seconds each deliver one per E seconds (a GPU evaluation)
// when B / E of them run at once; one more is on the GPU and one waits ready: ceil(B / E) + 2.
// Until both times are measured the depth is the most the build pool can use (jobs + 2).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <deque>
#include <numeric>

namespace attntune {

class PipelineDepth {
 public:
  explicit PipelineDepth(int jobs) : max_(static_cast<std::size_t>(std::max(2, jobs + 2))) {}

  // Wall time of one NVRTC build that ran (not a cache hit), and of one GPU evaluation.
  void build_done(double ms) { add(builds_, ms); }
  void evaluation_done(double ms) { add(evals_, ms); }

  std::size_t value() const {
    if (builds_.size() < kMinSamples || evals_.size() < kMinSamples) return max_;
    const double ratio = mean(builds_) / std::max(mean(evals_), 1e-3);
    const double want = std::ceil(ratio) + 2;
    return want >= static_cast<double>(max_) ? max_ : std::max<std::size_t>(2, static_cast<std::size_t>(want));
  }
  std::size_t max() const { return max_; }

 private:
  static constexpr std::size_t kMinSamples = 3, kWindow = 16;  // the recent past: builds slow down as the pool fills
  static void add(std::deque<double>& d, double ms) {
    if (!(ms >= 0) || !std::isfinite(ms)) return;
    d.push_back(ms);
    if (d.size() > kWindow) d.pop_front();
  }
  static double mean(const std::deque<double>& d) { return std::accumulate(d.begin(), d.end(), 0.0) / d.size(); }

  std::size_t max_;
  std::deque<double> builds_, evals_;
};

}  // namespace attntune
