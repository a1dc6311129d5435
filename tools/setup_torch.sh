#!/usr/bin/env bash
# A real torch for the PyTorch package's tests (tests/torch/, docs/design/torch.md): PyPI's wheel in
# the repository's .venv, about 5 GB with its CUDA libraries, a minute or two. tools/test.sh runs
# it; the main job (tools/run.sh) does not need it. ATTNTUNE_NO_TORCH=1 skips it. Where PyPI cannot
# be reached it says so and goes on: the torch tests then report as skipped.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[ -n "${ATTNTUNE_NO_TORCH:-}" ] && exit 0
"$root/.venv/bin/python" -c "import torch" >/dev/null 2>&1 && exit 0
echo "attntune setup: installing torch into $root/.venv (tests/torch; ATTNTUNE_NO_TORCH=1 skips)"
if python3 -m venv "$root/.venv" && \
   "$root/.venv/bin/pip" install -q --disable-pip-version-check "torch==2.15.0" ninja numpy; then
  exit 0
fi
echo "attntune setup: WARNING: could not install torch into $root/.venv; the PyTorch package's tests" \
     "(tests/torch) will be skipped" >&2
exit 0
