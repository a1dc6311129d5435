// A runner with no GPU and no recording: each config's time comes from a fixed pseudo-random
// landscape (a factor per parameter value and a small one per config, all hashed from the
// problem, so every problem has its own optimum and neighbouring problems share none), and about
// one config in seven fails as a real one would (resources, compile_error, wrong_result). Each
// candidate takes `delay` of wall time. `serve --simulate` runs whole queues with it: the service's
// tests (workers killed mid-campaign, leases taken over, the Slurm array) and a rehearsal of a plan
// on a machine without a GPU. Kernels are rendered for real (the candidates' source hashes are the
// real ones); nothing is compiled.
#pragma once
#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "search/runner.hpp"
#include "space/search_space.hpp"

namespace attntune::search {

class SyntheticRunner : public Runner {
 public:
  // `spaces` sorted by family; several: configs come tagged with their family. `ordinal` names
  // the simulated GPU ("simulated GPU 0", uuid "SIM-<host>-0").
  SyntheticRunner(const std::vector<const SearchSpace*>& spaces, const Problem& problem, int ordinal,
                  std::chrono::milliseconds delay, const std::atomic<bool>* cancel);
  // What a simulated device is, before a runner exists (serve asks before claiming).
  static DeviceInfo device_info(int ordinal);
  const DeviceInfo& device() override { return device_; }
  std::string arch_for(const std::string& family) override;
  std::size_t capacity() const override { return 4; }
  std::size_t outstanding() const override { return queue_.size(); }
  void submit(const Config& config) override { queue_.push_back(config); }
  std::optional<RunResult> next() override;

 private:
  std::map<std::string, const SearchSpace*> spaces_;  // by family
  bool tagged_;
  Problem problem_;
  std::chrono::milliseconds delay_;
  const std::atomic<bool>* cancel_;
  DeviceInfo device_;
  std::deque<Config> queue_;
};

}  // namespace attntune::search
