// The strategy seam: how a search decides what to evaluate next. A strategy sees the search space,
// the problem and the results of what was evaluated, nothing else: no CUDA, no SQLite. `tune` feeds
// it from the GPU (eval/), `replay` from a recorded campaign, and both the same way:
//
//   auto s = make_strategy("evo", ctx);
//   for (const Trial& t : recorded) s->observe(t);   // a resumed campaign: what is known already
//   while (...) { for (Config& c : s->propose(k)) submit(c); ... s->observe(result); }
//
// Proposals may run ahead of results (tune keeps the compile pool busy), so a strategy must accept
// propose() while earlier proposals are still unobserved, and observe() results in any order.
// Determinism: the same context (seed included) and the same sequence of propose/observe calls give
// the same proposals.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/problem.hpp"
#include "space/search_space.hpp"

namespace attntune::search {

// What a strategy learns of one evaluated config.
struct Trial {
  Config config;
  std::string status;             // ok | compile_error | compile_timeout | resources | launch_error |
                                  // crashed | timeout | wrong_result | nan_or_unwritten
  std::optional<double> time_us;  // the median, when ok
};

struct StrategyContext {
  const SearchSpace* space = nullptr;  // outlives the strategy
  Problem problem;
  std::string arch;
  std::uint64_t seed = 1;
  // Good configs of the nearest problem already tuned (best first; may be empty or hold configs
  // invalid here): a strategy that can use a head start (evo) seeds its first population with them.
  // tune and replay both fill it with search::warm_start_configs (warm_start.hpp).
  std::vector<Config> warm_start;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  // Up to n valid configs to evaluate next, none proposed or observed before. Fewer, or none, when
  // it has nothing to propose now; exhausted() says whether it ever will again.
  virtual std::vector<Config> propose(std::size_t n) = 0;
  // The result of a config: one it proposed, or (on resume) one recorded before it was made.
  virtual void observe(const Trial& trial) = 0;
  // True when every valid config has been proposed or observed.
  virtual bool exhausted() const = 0;
};

std::vector<std::string> strategy_names();  // evo, random, exhaustive
// InputError naming the known strategies for an unknown name.
std::unique_ptr<Strategy> make_strategy(const std::string& name, const StrategyContext& context);

}  // namespace attntune::search
