#!/usr/bin/env bash
# Idempotent install into ./.venv. torch goes in first, by exact version: on these machines
# torch==2.13.0 resolves to a local CPU wheel, while an unpinned torch pulls GBs of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/pip install --quiet torch==2.13.0
# EXTRAS: dev (tests), verl (the verl backend and its contract tests), slurm (executor plugin), tracking
# (TensorBoard, wandb and MLflow loggers: docs/tracking.md).
.venv/bin/pip install --quiet -e ".[${EXTRAS:-dev,verl,slurm,tracking}]"
