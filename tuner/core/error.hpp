// Error types. Every failure below main() is an exception carrying the exit code the contract
// assigns it; main() has the one catch that prints "attntune: error: ..." (docs/CONTRACT.md).
#pragma once
#include <stdexcept>
#include <string>

namespace attntune {

enum class ExitCode : int { kOk = 0, kFailed = 1, kBadInput = 2, kEnvironment = 3 };

class Error : public std::runtime_error {
 public:
  Error(ExitCode code, const std::string& what) : std::runtime_error(what), code_(code) {}
  ExitCode code() const noexcept { return code_; }

 private:
  ExitCode code_;
};

// Bad arguments, YAML, problem specs, databases that are not ours or are newer (exit 2).
struct InputError : Error {
  explicit InputError(const std::string& what) : Error(ExitCode::kBadInput, what) {}
};
// Environment: no GPU, no driver, NVRTC missing (exit 3).
struct EnvError : Error {
  explicit EnvError(const std::string& what) : Error(ExitCode::kEnvironment, what) {}
};
// The work ran and failed, e.g. no valid config found (exit 1).
struct WorkError : Error {
  explicit WorkError(const std::string& what) : Error(ExitCode::kFailed, what) {}
};

// A position in an input file, for messages of the form "file:line:column: message".
struct SourcePos {
  std::string file;
  int line = 0;    // 1-based; 0 = unknown
  int column = 0;  // 1-based; 0 = unknown
  std::string str() const {
    if (line <= 0) return file;
    return file + ":" + std::to_string(line) + ":" + std::to_string(column);
  }
};

}  // namespace attntune
