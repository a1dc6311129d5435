// Child processes: the one place attntune starts one (posix_spawn). The build and GPU workers
// (eval/: pipes to their stdin and from their stdout, each in a process group of its own), the SVG
// converter of `report --png` (report/plot_file: its stderr kept for the message) and `serve`'s
// per-GPU workers (cli/cmd_serve: our stdio and process group, so a terminal's Ctrl-C reaches
// them as it reaches serve).
#pragma once
#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace attntune {

// How a child ended, as the parent saw it in waitpid.
struct ExitStatus {
  bool signaled = false;
  int value = 0;  // exit code, or the signal number when signaled
  bool ok() const { return !signaled && value == 0; }
  std::string str() const;  // "exited with status 4" | "killed by signal 11 (Segmentation fault)"
};

struct SpawnOptions {
  enum class Stdio {
    kPipe,     // a pipe to (stdin) or from (stdout, stderr) the parent
    kNull,     // /dev/null
    kInherit,  // the parent's
  };
  Stdio in = Stdio::kPipe, out = Stdio::kPipe, err = Stdio::kInherit;
  // A process group of its own (kill() then takes whatever it started too); else the parent's.
  bool own_group = true;
  // The file to run; empty: argv[0], looked up on PATH when it has no '/'.
  std::string program;
};

// A child process. It starts with the default signal dispositions and an empty signal mask. The
// destructor kills it (its group, when it has its own) and reaps it: no child outlives its owner,
// and none is left a zombie.
class Child {
 public:
  // Error (exit 1) when it cannot be started.
  static Child spawn(const std::vector<std::string>& argv, const SpawnOptions& options = SpawnOptions());
  Child() = default;
  ~Child();
  Child(Child&& o) noexcept;
  Child& operator=(Child&& o) noexcept;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  int stdin_fd() const { return in_; }  // -1 once closed, or when not a pipe
  int stdout_fd() const { return out_; }
  int stderr_fd() const { return err_; }
  void close_stdin();
  // Sends `sig` to the child alone.
  void signal(int sig) const;
  // SIGKILL to the child (and its group, when it has its own), then reap it. Closes the pipes.
  ExitStatus kill();
  // Waits up to `grace` for the child to exit by itself, then kills it. Closes the pipes.
  ExitStatus reap(std::chrono::milliseconds grace);
  // Waits for the child to exit, however long. Closes the pipes.
  ExitStatus wait();
  // Its status if it has exited (reaped, pipes closed), else nullopt.
  std::optional<ExitStatus> poll();

 private:
  ExitStatus reaped(int status);
  void close_fds() noexcept;
  void kill_noexcept() noexcept;
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1, err_ = -1;
  bool own_group_ = true;
};

// This executable's path (/proc/self/exe), to start workers from the binary that is running.
std::string self_exe();

}  // namespace attntune
