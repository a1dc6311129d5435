// The strategies' random numbers, identical on every platform: std::mt19937_64 is specified bit
// for bit by the standard, the distributions are not, so the draws are written here.
#pragma once
#include <cstdint>
#include <random>

namespace attntune::search {

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : gen_(seed) {}
  // Uniform in [0, n); n > 0. Rejects the low 2^64 mod n draws so every value is equally likely.
  std::uint64_t below(std::uint64_t n) {
    const std::uint64_t reject_under = (0 - n) % n;
    for (;;) {
      const std::uint64_t r = gen_();
      if (r >= reject_under) return r % n;
    }
  }
  double uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }  // [0, 1)
  bool chance(double p) { return uniform() < p; }

 private:
  std::mt19937_64 gen_;
};

}  // namespace attntune::search
