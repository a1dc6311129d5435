// Inside the Store: the reliability suite's hook for landing a kill inside a write transaction
// (tests/reliability/, docs/RELIABILITY.md). With ATTNTUNE_TEST_COMMIT_DELAY_MS=N set, a write
// transaction of a kind ATTNTUNE_TEST_HOLD lists holds itself open N ms once written, saying so on
// stderr ("attntune: test hook: WHAT written, commit in N ms (pid P)"), then commits. The kinds:
// evaluation (record_evaluation), final (put_final: the final re-timing's rows and the ranking),
// open (open_campaign), claim (claim_job), release (release_job), submit (submit_job), merge
// (merge_from); ATTNTUNE_TEST_HOLD unset: evaluation and final. Unset delay (the product's normal
// state): nothing.
#pragma once
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>

namespace attntune::test_hook {

// N when transactions of kind `what` are held, else 0.
inline int hold_ms(std::string_view what) {
  static const int ms = [] {
    const char* v = std::getenv("ATTNTUNE_TEST_COMMIT_DELAY_MS");
    return v && *v ? std::max(0, std::atoi(v)) : 0;
  }();
  if (ms <= 0) return 0;
  static const std::string kinds = [] {
    const char* v = std::getenv("ATTNTUNE_TEST_HOLD");
    return "," + std::string(v && *v ? v : "evaluation,final") + ",";
  }();
  return kinds.find("," + std::string(what) + ",") == std::string::npos ? 0 : ms;
}

// Says what is written ("evaluation 3 of campaign 1", "claim of campaign 'x'") and holds.
inline void hold(std::string_view what, const std::string& written) {
  const int ms = hold_ms(what);
  if (ms <= 0) return;
  std::fprintf(stderr, "attntune: test hook: %s written, commit in %d ms (pid %d)\n", written.c_str(), ms,
               static_cast<int>(::getpid()));
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

}  // namespace attntune::test_hook
