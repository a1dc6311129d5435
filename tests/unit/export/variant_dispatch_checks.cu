// Which kernel an exported all-best library runs for calls with variants, asked on the host with
// no GPU (attntune_select_kernel_ex plans dry): tests/unit/export/test_export_plan_variants.cpp
// compiles this with the exported file included (nvcc -include FILE.cu), so that attntune_options
// and the entry points are the file's own. Usage:
//   variant_dispatch_checks CALL...
//   CALL = entry,batch,heads_q,heads_kv,seqlen_q,seqlen_k,head_dim,window_left,softcap,sinks
// (entry 1 dense, 2 kvcache, 4 varlen; window_left -1: no window, else a causal window of that many
// keys left of the diagonal; softcap 0: none; sinks 0 or 1). Prints "CALL -> INDEX" for each (-1:
// no kernel serves it) and exits 0, or 2 on a malformed CALL.
// (A .cu, so that tests/unit's glob of *.cpp leaves it out of attntune_tests.)
#include <cstdio>
#include <cstdlib>
#include <cstring>

// The launcher is host code only; the device passes see the kernels alone.
#if !defined(__CUDA_ARCH__)

int main(int argc, char** argv) {
  alignas(16) static float sinks[1024];  // never read: a dry plan only checks the pointer
  for (int i = 1; i < argc; ++i) {
    int entry = 0, batch = 0, heads_q = 0, heads_kv = 0, seqlen_q = 0, seqlen_k = 0, head_dim = 0, window_left = 0,
        with_sinks = 0;
    float softcap = 0;
    if (std::sscanf(argv[i], "%d,%d,%d,%d,%d,%d,%d,%d,%f,%d", &entry, &batch, &heads_q, &heads_kv, &seqlen_q,
                    &seqlen_k, &head_dim, &window_left, &softcap, &with_sinks) != 10) {
      std::fprintf(stderr, "malformed call '%s'\n", argv[i]);
      return 2;
    }
    attntune_options o;
    std::memset(&o, 0, sizeof o);
    o.size = sizeof o;
    o.window = window_left >= 0 ? 1 : 0;
    o.window_left = window_left;
    o.window_right = window_left >= 0 ? 0 : -1;
    o.softcap = softcap;
    o.sinks = with_sinks ? sinks : nullptr;
    const int k = attntune_select_kernel_ex(entry, head_dim, 1, batch, heads_q, heads_kv, seqlen_q, seqlen_k, &o);
    std::printf("%s -> %d\n", argv[i], k);
  }
  return 0;
}

#endif  // !__CUDA_ARCH__
