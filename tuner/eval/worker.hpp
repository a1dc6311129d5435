// The processes candidates run in (protocol.hpp has the messages).
//
// `attntune worker --device N` (run_gpu_worker): owns device N's CUDA context. Says hello with the
// device, then serves prepare and eval requests until its stdin ends. Per problem it keeps the
// validation inputs, both reference outputs (computed once; ReferenceCache) and the timing inputs.
// Per candidate: load the module, check the launch fits the device (else `resources`), refill the
// validation inputs and poison the output with NaN, launch, synchronize, compare (ok | wrong_result
// | nan_or_unwritten, with the measured error), and only when it is correct time it on the other
// inputs (time_kernel). A sticky CUDA error (illegal address, trap, launch failure) poisons the
// context: it answers `crashed` and exits with kExitPoisoned; a kernel that never ends is the
// parent's to kill. Other driver errors give `launch_error`, or `resources` for launch limits.
//
// `attntune build-worker` (run_build_worker): one NVRTC compile, request on stdin, answer on stdout.
//
// Both return their process's exit code (0 when the parent closed the stream; 3 environment, after
// a `fatal` frame; kExitPoisoned) for main() to return. They take the protocol off fd `out_fd` and
// point fd 1 at stderr, so nothing printed by a library can corrupt the stream, and they ask the
// kernel to SIGKILL them when the parent dies.
#pragma once

namespace attntune {

constexpr int kExitPoisoned = 4;  // the worker answered `crashed`: its CUDA context is unusable

int run_gpu_worker(int device, int in_fd, int out_fd);
int run_build_worker(int in_fd, int out_fd);

}  // namespace attntune
