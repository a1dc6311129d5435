"""Builds an attntune export into PyTorch ops, on the user's machine.

Two steps, each cached by the hash of what goes into it:
  1. kernels.cu -> libattntune_kernels_<hash>.so with nvcc, the contract's command line
     (nvcc -std=c++17 -arch=ARCH -Xcompiler -fPIC -shared); ARCH is the arch-specific target the
     file's header asks for (sm_90a for Hopper kernels), else this GPU's, else $ATTNTUNE_ARCH, else
     the arch the file's kernels were tuned on.
  2. _ops.cpp -> the op library, with torch.utils.cpp_extension.load (ninja), linked to (1), loaded
     with torch.ops.load_library: its TORCH_LIBRARY registers the ops under `namespace`.

The cache is $ATTNTUNE_TORCH_CACHE, else ~/.cache/attntune/torch; one directory per hash, built under
a file lock so that two processes never build into one directory at once.
"""
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))


def _log(verbose, msg):
    if verbose:
        print(f"attntune: {msg}", file=sys.stderr, flush=True)


def find_nvcc():
    for cand in (os.environ.get("CUDACXX"),
                 os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"),
                 shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and os.path.exists(cand):
            return cand
    raise RuntimeError("attntune: nvcc not found (set $CUDACXX or $CUDA_HOME, or put nvcc on PATH): it builds "
                       "the tuned kernels")


def header_arch(cu):
    """The -arch of the export's build line (`//   nvcc -std=c++17 -arch=sm_90a ...`), or None."""
    with open(cu, errors="replace") as f:
        for line in f:
            if not line.startswith("//"):
                break
            m = re.search(r"nvcc -std=c\+\+17 -arch=(sm_\d+a?)", line)
            if m:
                return m.group(1)
    return None


def tuned_archs(cu):
    """The archs the kernels of `cu` were measured on (its provenance header), e.g. ["sm_90"]."""
    archs = []
    with open(cu, errors="replace") as f:
        for line in f:
            if not line.startswith("//"):
                break
            m = re.match(r'//\s+arch\s+"(sm_\d+a?)"', line)
            if m and m.group(1) not in archs:
                archs.append(m.group(1))
    return archs


def build_arch(cu):
    need = header_arch(cu)
    if need and need.endswith("a"):
        return need  # arch-specific code (wgmma): exactly this target
    env = os.environ.get("ATTNTUNE_ARCH")
    if env:
        return env
    try:
        import torch
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return f"sm_{major}{minor}"
    except Exception:  # noqa: BLE001 - no GPU here: the arch of the header
        pass
    if need:
        return need
    archs = tuned_archs(cu)
    return archs[0].rstrip("a") if archs else "sm_80"


def _hash(*parts):
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def cache_root():
    return os.environ.get("ATTNTUNE_TORCH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "attntune",
                                                                   "torch")


class _Lock:
    def __init__(self, path):
        self.path = path

    def __enter__(self):
        self.f = open(self.path, "w")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


# Added to the contract's command line: bind the library's references to its own definitions. The
# kernels link the CUDA runtime statically; torch.ops.load_library opens the ops (and so this
# library, their dependency) with RTLD_GLOBAL, and without -Bsymbolic the runtime calls inside this
# library resolve to torch's libcudart instead of its own, whose state never saw our fat binary.
KERNEL_LINK_FLAGS = os.environ.get("ATTNTUNE_KERNEL_LINK_FLAGS", "-Xlinker -Bsymbolic").split()
# Extra compiler flags for the ops (-g to debug them).
OPS_CFLAGS = os.environ.get("ATTNTUNE_OPS_CFLAGS", "").split()


def build_kernels(cu, arch, out_dir, verbose):
    """kernels.cu -> the shared library (cached); returns its path."""
    with open(cu, "rb") as f:
        source = f.read()
    tag = _hash(source, arch, *KERNEL_LINK_FLAGS)
    lib = os.path.join(out_dir, f"libattntune_kernels_{tag}.so")
    if os.path.exists(lib):
        return lib
    nvcc = find_nvcc()
    tmp = lib + f".tmp{os.getpid()}"
    cmd = [nvcc, "-std=c++17", f"-arch={arch}", "-Xcompiler", "-fPIC", "-shared", *KERNEL_LINK_FLAGS, cu, "-o", tmp]
    _log(verbose, f"building the tuned kernels for {arch} (nvcc; a few minutes for many Hopper kernels): "
                  f"{' '.join(cmd)}")
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"attntune: building the kernels failed ({' '.join(cmd)}):\n{r.stdout}{r.stderr}")
    os.replace(tmp, lib)
    _log(verbose, f"built {lib} in {time.time() - t0:.0f} s")
    return lib


def _plan(cu, namespace, arch):
    """Where the build of `cu` under `namespace` goes: (cu, arch, ops source, cache directory)."""
    import torch
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", namespace):
        raise ValueError(f"attntune: namespace must be an identifier (got {namespace!r})")
    cu = os.path.abspath(cu)
    if not os.path.isfile(cu):
        raise FileNotFoundError(f"attntune: no kernels file {cu} (write one with `attntune export --torch DIR`)")
    arch = arch or build_arch(cu)
    ops_cpp = os.path.join(_HERE, "_ops.cpp")
    with open(cu, "rb") as f:
        cu_bytes = f.read()
    with open(ops_cpp, "rb") as f:
        ops_bytes = f.read()
    tag = _hash(cu_bytes, ops_bytes, arch, namespace, torch.__version__, sys.version_info[:2], *OPS_CFLAGS)
    return cu, arch, ops_cpp, os.path.join(cache_root(), tag)


def prepare(cu, namespace="attntune", arch=None, verbose=True):
    """Step 1 alone (nvcc; safe in threads, for building several exports at once); returns the
    kernels' library."""
    cu, arch, _, out_dir = _plan(cu, namespace, arch)
    os.makedirs(out_dir, exist_ok=True)
    with _Lock(os.path.join(out_dir, "build.lock")):
        return build_kernels(cu, arch, out_dir, verbose)


def load(cu, namespace="attntune", arch=None, verbose=True):
    """Builds (or finds in the cache) the kernels of `cu` and the ops, loads them, and returns the op
    namespace (torch.ops.<namespace>) and the kernels' shared library's path."""
    import torch
    import torch.utils.cpp_extension as ce

    if torch.version.cuda is None:
        raise RuntimeError(f"attntune: this torch ({torch.__version__}) was built without CUDA: the tuned kernels run "
                           "on CUDA tensors, through torch's CUDA runtime (install a CUDA build of torch)")
    cu, arch, ops_cpp, out_dir = _plan(cu, namespace, arch)
    tag = os.path.basename(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    with _Lock(os.path.join(out_dir, "build.lock")):
        lib = build_kernels(cu, arch, out_dir, verbose)
        name = f"attntune_ops_{namespace}_{tag}"
        t0 = time.time()
        done = os.path.join(out_dir, "ops", f"{name}.so")
        if not os.path.exists(done):
            _log(verbose, f"building the PyTorch ops ({namespace}) with torch.utils.cpp_extension")
        os.makedirs(os.path.join(out_dir, "ops"), exist_ok=True)
        # Host code only: the toolkit's headers (cudaStream_t) and torch's c10_cuda (the current
        # stream, the device guard), no CUDA runtime of its own and no nvcc step, so torch's
        # CUDA version need not match the toolkit's.
        cuda_include = os.path.join(os.path.dirname(os.path.dirname(find_nvcc())), "include")
        ce.load(name=name, sources=[ops_cpp], build_directory=os.path.join(out_dir, "ops"),
                extra_cflags=["-O2", f"-DATTNTUNE_TORCH_NAMESPACE={namespace}", *OPS_CFLAGS],
                extra_include_paths=[cuda_include],
                extra_ldflags=[lib, f"-Wl,-rpath,{out_dir}", "-lc10_cuda"], with_cuda=False,
                is_python_module=False, verbose=False)
        if time.time() - t0 > 5:
            _log(verbose, f"built the ops in {time.time() - t0:.0f} s")
    return getattr(torch.ops, namespace), lib

