#!/usr/bin/env bash
# Runs tests/torch/test_ops.py (`cpu`), test_ops_gpu.py (`gpu`) or test_train_compare.py (`train`: tools/
# train_compare.py on the CPU) with a Python that has torch:
# $ATTNTUNE_PYTHON, else the repository's .venv (tools/setup_torch.sh makes it), else python3. Exits 77
# (ctest: skipped) when none has torch, saying so.
#   tests/torch/run.sh cpu|gpu|train path/to/attntune
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$(dirname "$here")")
which=${1:?cpu, gpu or train}
export ATTNTUNE_BIN=${2:?the attntune binary}
py=""
for cand in "${ATTNTUNE_PYTHON:-}" "$root/.venv/bin/python" python3; do
  if [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import torch" >/dev/null 2>&1; then
    py=$cand
    break
  fi
done
if [ -z "$py" ]; then
  echo "SKIP: no Python with torch (tools/setup_torch.sh installs one in .venv; or set ATTNTUNE_PYTHON)"
  exit 77
fi
export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
case $which in
  cpu) exec "$py" "$here/test_ops.py" ;;
  gpu) exec "$py" "$here/test_ops_gpu.py" ;;
  train) exec "$py" "$here/test_train_compare.py" ;;
  *) echo "run.sh: cpu, gpu or train, not '$which'" >&2; exit 2 ;;
esac
