#!/usr/bin/env bash
# Idempotent install into ./.venv (README "Quick start").
#   bash scripts/install.sh           the package and what the default run needs
#   bash scripts/install.sh --tests   also the extras the test suite exercises: dev (pytest, linters), verl (the
#                                     verl backend's contract tests), slurm (the executor plugin), tracking
# EXTRAS=a,b overrides the extras either way. torch goes in first, by exact version, because every later
# requirement accepts the torch that is already there:
#   - on a machine whose pip finds a local CPU wheel of torch 2.13.0 (this project's CI machines), that wheel;
#   - on the standard PyPI index on Linux, the CUDA build (several GB): right for a GPU machine. For a CPU-only
#     machine set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu to take the CPU build instead.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
extras="${EXTRAS:-}"
for arg in "$@"; do
  case "$arg" in
    --tests) extras="${EXTRAS:-dev,verl,slurm,tracking}" ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument '$arg' (known: --tests, --help)" >&2; exit 2 ;;
  esac
done
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# pip byte-compiles every installed module on one core; compileall then does the same files on every core
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  .venv/bin/pip install --quiet --no-compile torch==2.13.0 --index-url "$TORCH_INDEX_URL"
else
  .venv/bin/pip install --quiet --no-compile torch==2.13.0
fi
.venv/bin/pip install --quiet --no-compile -e ".${extras:+[$extras]}"
.venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
  > /dev/null 2>&1 || true  # a module that does not compile is one pip would have skipped too
echo "installed: $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'), evotrainer${extras:+ with [$extras]}"
