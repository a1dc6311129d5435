// A runner that answers from a recorded campaign (RecordedCampaign) after an optional delay per
// candidate, as if a GPU had evaluated it. `tune --simulate-db/--simulate-campaign` uses it: the
// kill-and-resume tests run whole campaigns with no GPU, and a strategy can be tried on a real
// landscape. A config the recording lacks is an InputError (the recording must cover the space).
#pragma once
#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "search/recorded.hpp"
#include "search/runner.hpp"

namespace attntune::search {

class SimulatedRunner : public Runner {
 public:
  // `cancel`, when set and true, abandons the candidate being "evaluated".
  SimulatedRunner(const RecordedCampaign& recording, std::chrono::milliseconds delay, std::size_t capacity,
                  const std::atomic<bool>* cancel);
  // Several families (tune --space A --space B): one recording per family (InputError for two of
  // one family), configs tagged with their family (search/multi_family.hpp); each family's results
  // are filed under its recording's arch, and device() is the first recording's (by family name).
  SimulatedRunner(const std::vector<const RecordedCampaign*>& recordings, std::chrono::milliseconds delay,
                  std::size_t capacity, const std::atomic<bool>* cancel);
  const DeviceInfo& device() override { return device_; }
  std::string arch_for(const std::string& family) override;
  std::size_t capacity() const override { return capacity_; }
  std::size_t outstanding() const override { return queue_.size(); }
  void submit(const Config& config) override;
  std::optional<RunResult> next() override;

 private:
  std::map<std::string, const RecordedCampaign*> recordings_;  // by family
  bool tagged_ = false;
  std::chrono::milliseconds delay_;
  std::size_t capacity_;
  const std::atomic<bool>* cancel_;
  DeviceInfo device_;
  std::deque<Config> queue_;
};

}  // namespace attntune::search
