// Hidden subcommands: the processes the tuner runs candidates in (tuner/eval/worker.hpp). They
// talk framed messages over stdin/stdout (tuner/eval/protocol.hpp) and are not meant for people.
#include <unistd.h>

#include "cli/command.hpp"
#include "core/error.hpp"
#include "eval/worker.hpp"

namespace attntune::cli::cmd_worker {
namespace {

int run_worker(const std::vector<std::string>& args) {
  po::options_description opts("options");
  int device = 0;
  opts.add_options()("device", po::value(&device), "CUDA device ordinal (default 0)");
  po::variables_map vm;
  if (parse_args("worker", "GPU worker: evaluates candidates sent on stdin (internal)", opts, args, vm)) return 0;
  if (device < 0) throw InputError("worker: --device must not be negative");
  return run_gpu_worker(device, STDIN_FILENO, STDOUT_FILENO);
}

int run_build(const std::vector<std::string>& args) {
  po::options_description opts("options");
  po::variables_map vm;
  if (parse_args("build-worker", "build worker: one NVRTC compile from stdin (internal)", opts, args, vm)) return 0;
  return run_build_worker(STDIN_FILENO, STDOUT_FILENO);
}

const bool registered_worker =
    register_command({"worker", "GPU worker process (internal)", true, run_worker});
const bool registered_build =
    register_command({"build-worker", "NVRTC build worker process (internal)", true, run_build});

}  // namespace
}  // namespace attntune::cli::cmd_worker
