// exhaustive: every valid config once, in the space's enumeration order (SearchSpace::enumerate),
// skipping those already observed (a resumed campaign). The reference the other strategies are
// measured against, and how recorded campaigns for replay are made.
#include "search/strategies.hpp"
#include "search/valid_configs.hpp"

namespace attntune::search {

namespace {

class Exhaustive final : public Strategy {
 public:
  explicit Exhaustive(const StrategyContext& c) : valid_(*c.space, c.problem, c.arch) {}

  std::vector<Config> propose(std::size_t n) override {
    std::vector<Config> out;
    for (; out.size() < n && next_ < valid_.size(); ++next_) {
      if (valid_.seen(next_)) continue;
      valid_.mark_seen(next_);
      out.push_back(valid_.config(next_));
    }
    return out;
  }
  void observe(const Trial& t) override {
    if (auto i = valid_.find(t.config)) valid_.mark_seen(*i);
  }
  bool exhausted() const override { return valid_.all_seen(); }

 private:
  ValidConfigs valid_;
  std::size_t next_ = 0;
};

}  // namespace

std::unique_ptr<Strategy> make_exhaustive(const StrategyContext& context) {
  return std::make_unique<Exhaustive>(context);
}

}  // namespace attntune::search
