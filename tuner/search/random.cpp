// random: uniform over the valid configs, without replacement, reproducible for a seed on every
// platform (search/rng.hpp). The baseline a search must beat; replay reports it next to each
// strategy.
#include "search/rng.hpp"
#include "search/strategies.hpp"
#include "search/valid_configs.hpp"

namespace attntune::search {

namespace {

class RandomSearch final : public Strategy {
 public:
  explicit RandomSearch(const StrategyContext& c) : valid_(*c.space, c.problem, c.arch), rng_(c.seed) {}

  std::vector<Config> propose(std::size_t n) override {
    std::vector<Config> out;
    while (out.size() < n && !valid_.all_seen()) {
      const std::size_t i = valid_.unseen(rng_.below(valid_.unseen_count()));
      valid_.mark_seen(i);
      out.push_back(valid_.config(i));
    }
    return out;
  }
  void observe(const Trial& t) override {
    if (auto i = valid_.find(t.config)) valid_.mark_seen(*i);
  }
  bool exhausted() const override { return valid_.all_seen(); }

 private:
  ValidConfigs valid_;
  Rng rng_;
};

}  // namespace

std::unique_ptr<Strategy> make_random(const StrategyContext& context) {
  return std::make_unique<RandomSearch>(context);
}

}  // namespace attntune::search
