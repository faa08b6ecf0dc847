#!/usr/bin/env bash
# Whole workflows on one GPU: the CUDA tests, then `experiment=quick` end to end with the tiny policy and with
# policy=hf (a Qwen2-architecture chat model built in code and saved as an ordinary HF directory, nothing
# downloaded), each with trainer.device=cuda. Prints one JSON line per step (wall seconds, exit code, the run's
# summary numbers) and writes the logs and summaries to $OUT (default /tmp/gpu_workflow).
#
#   OUT=/tmp/gpu bash benchmarks/gpu_workflow.sh             # from the repository root
#   PY=.venv/bin/python CORES=16 bash benchmarks/gpu_workflow.sh
#
# The sandbox runs as plain processes by default (ISOLATION=process; ISOLATION=os or auto for bubblewrap).
# Each step has its own time limit (STEP_S, default 170 s);
# STEPS names the steps to run (default: all three).
set -u
OUT=${OUT:-/tmp/gpu_workflow}
PY=${PY:-python3}
CORES=${CORES:-16}
STEP_S=${STEP_S:-170}
ISOLATION=${ISOLATION:-process}  # sandbox.isolation: process | os | auto
STEPS=${STEPS:-cuda_tests quick_tiny quick_hf}  # which of the three steps to run
RESULTS=${RESULTS:-/tmp/gpu_workflow_results}
mkdir -p "$OUT" "$RESULTS"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

step() {  # step NAME COMMAND...: run with a time limit, log to $OUT/NAME.log, print a JSON line
    local name=$1; shift
    [[ " $STEPS " == *" $name "* ]] || return 0
    local t0=$SECONDS
    timeout "$STEP_S" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    printf '{"step": "%s", "rc": %d, "wall_s": %d}\n' "$name" "$rc" "$((SECONDS - t0))" | tee -a "$OUT/steps.jsonl"
    tail -n 5 "$OUT/$name.log"
}

summarise() {  # summarise RUN: the run's summary.json numbers on one line, copied to $OUT
    local summary="$RESULTS/$1/summary.json"
    [ -f "$summary" ] || { echo "{\"run\": \"$1\", \"summary\": null}"; return; }
    cp "$summary" "$OUT/$1-summary.json"
    "$PY" - "$summary" "$1" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
keys = ("evolved_test_accuracy", "baseline_test_accuracy", "baseline_search_test_accuracy", "returned_share")
print(json.dumps({"run": sys.argv[2]} | {k: s.get(k) for k in keys}))
EOF
}

"$PY" - <<'EOF' | tee "$OUT/device.json"
import json, torch, transformers
print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                  "cuda": torch.cuda.is_available(),
                  "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))
EOF

step cuda_tests "$PY" -m pytest -q -p no:cacheprovider tests/backends/test_gpu_path.py

SNAKE=("$PY" -m snakemake --cores "$CORES" --directory "$PWD" --config "results_dir=$RESULTS" experiment=quick
       trainer__device=cuda "sandbox__isolation=$ISOLATION")
step quick_tiny "${SNAKE[@]}" run=gpu_tiny
summarise gpu_tiny

HF_DIR="$RESULTS/qwen2_policy"
"$PY" -c "import sys; sys.path.insert(0, 'tests'); from pathlib import Path; from hf_fixtures import build_qwen2_dir; \
build_qwen2_dir(Path('$HF_DIR'))" > "$OUT/build_hf.log" 2>&1
step quick_hf "${SNAKE[@]}" run=gpu_hf policy=hf "policy__path=$HF_DIR" policy__sft__max_steps=150 policy__sft__lr=1e-3 \
     harness__recipe__lr=1e-4
summarise gpu_hf
