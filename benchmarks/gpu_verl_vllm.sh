#!/usr/bin/env bash
# verl and vLLM on one lent GPU, in one loan (<= 12 minutes with the machine's start and the three transfer calls;
# docs/gpu-check.md): the pack built by scripts/gpu_pack.py must already lie in gpu_pack/ (earlier transfers carried
# its parts). Checks every part's sha256 against gpu_pack/manifest.json, unpacks them into a temporary prefix put
# first on PYTHONPATH, then runs, each step with its own time limit and none stopping the next (the pack carries
# vLLM, verl and the project's own dependencies, snakemake among them; the machine brings Python 3.12, torch,
# triton and the packages scripts/gpu_machine.py left to it):
#   imports  the machine's versions of what the pack left to it, then the project modules the manifest names,
#            vLLM and verl: each imports (cp312 wheels load only here)
#   (a) engine   vLLM's offline engine on a Qwen2 chat model built in code (random init): tokens/s
#   (b) rollout  the project's rollout=vllm player on it, scored by the sandboxed default harness reward
#   (c) verl     one verl main_ppo GRPO step through the project's trainer=verl (reward adapter + sandboxed worker)
#   (d) quick    experiment=quick with trainer=verl rollout=vllm through snakemake, if time is left
# The default STEPS (imports rollout verl) fit the default BUDGET_S; engine and quick wait for a later loan
# (STEPS="imports engine quick"). Writes $OUT/gpu_verl_vllm.json (what ran: times, exit codes, each step's JSON
# line) and each step's log.
#
#   OUT=/tmp/gpu bash benchmarks/gpu_verl_vllm.sh              # from the repository root
#   PY=python3 BUDGET_S=400 STEPS="imports engine quick" bash benchmarks/gpu_verl_vllm.sh
set -u
OUT=${OUT:-/tmp/gpu_verl_vllm}
PY=${PY:-python3}
PACK=${PACK:-gpu_pack}
BUDGET_S=${BUDGET_S:-450}            # the whole script; step (d) runs only with QUICK_MIN_S left
STEPS=${STEPS:-imports rollout verl}
IMPORTS_S=${IMPORTS_S:-45} ENGINE_S=${ENGINE_S:-90} ROLLOUT_S=${ROLLOUT_S:-100} VERL_S=${VERL_S:-240}
QUICK_MIN_S=${QUICK_MIN_S:-120}
mkdir -p "$OUT"
began=$SECONDS
PREFIX=$(mktemp -d /tmp/gpu_pack_prefix.XXXXXX)
WORK=$(mktemp -d /tmp/gpu_verl_vllm_work.XXXXXX)
: > "$OUT/steps.jsonl"

record() {  # record NAME RC WALL_S LOG: one JSON line, with the step's own last JSON line when it printed one
    "$PY" - "$@" >> "$OUT/steps.jsonl" <<'EOF'
import json, sys
name, rc, wall, log = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
result = None
try:
    for line in reversed(open(log, errors="replace").read().splitlines()):
        if line.startswith("{"):
            result = json.loads(line)
            break
except (OSError, ValueError):
    pass
print(json.dumps({"step": name, "rc": rc, "wall_s": wall, "timed_out": rc in (124, 137), "result": result}))
EOF
    tail -n 1 "$OUT/steps.jsonl"
}

step() {  # step NAME LIMIT_S COMMAND...: run with a time limit (never past the budget), log to $OUT/NAME.log
    local name=$1 limit=$2; shift 2
    if [[ " $STEPS " != *" $name "* ]]; then
        printf '{"step": "%s", "rc": null, "skipped": "not in STEPS"}\n' "$name" >> "$OUT/steps.jsonl"; return 0
    fi
    local left=$((BUDGET_S - (SECONDS - began) - 15))
    (( left < limit )) && limit=$left
    if (( limit < 20 )); then
        printf '{"step": "%s", "rc": null, "skipped": "no time left"}\n' "$name" >> "$OUT/steps.jsonl"; return 0
    fi
    local t0=$SECONDS
    STEP_LIMIT_S=$limit timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
    record "$name" "$?" "$((SECONDS - t0))" "$OUT/$name.log"
}

# the pack: checksums, then unpack (a wrong or missing part stops here: nothing after it could run)
t0=$SECONDS
"$PY" - "$PACK" > "$OUT/unpack.log" 2>&1 <<'EOF'
import hashlib, json, sys
from pathlib import Path
pack = Path(sys.argv[1])
manifest = json.loads((pack / "manifest.json").read_text())
bad = []
for part in manifest["parts"]:
    path = pack / part["file"]
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None
    if digest != part["sha256"]:
        bad.append(f"{part['file']}: {'missing' if digest is None else 'sha256 differs'}")
print(json.dumps({"parts": [p["file"] for p in manifest["parts"]], "bad": bad}))
sys.exit(1 if bad else 0)
EOF
rc=$?
if [ "$rc" -eq 0 ]; then
    for part in $("$PY" -c "import json; print(' '.join(p['file'] for p in json.load(open('$PACK/manifest.json'))['parts']))"); do
        tar -xJf "$PACK/$part" -C "$PREFIX" >> "$OUT/unpack.log" 2>&1 || rc=$?
    done
fi
record unpack "$rc" "$((SECONDS - t0))" "$OUT/unpack.log"
export PYTHONPATH="$PREFIX:$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false VLLM_NO_USAGE_STATS=1 RAY_USAGE_STATS_ENABLED=0 RAY_TMPDIR=/tmp/ray
export PATH="$PREFIX/bin:$PATH"

"$PY" - > "$OUT/device.json" 2>&1 <<'EOF'
import importlib.metadata as md, json, platform, torch
names = ("vllm", "verl", "ray", "transformers", "tokenizers", "hydra-core", "tensordict", "numpy", "triton",
         "snakemake", "pandas", "pyarrow", "scipy", "matplotlib", "math-verify")
versions = {}
for name in names:
    try:
        versions[name] = md.version(name)
    except md.PackageNotFoundError:
        versions[name] = None
print(json.dumps({"torch": torch.__version__, "cuda": torch.cuda.is_available(), "python": platform.python_version(),
                  "glibc": platform.libc_ver()[1],
                  "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None} | versions))
EOF

HELPER=(env PYTHONPATH="$PWD/benchmarks:$PYTHONPATH" "$PY" benchmarks/gpu_verl_vllm.py)
step imports "$IMPORTS_S" "${HELPER[@]}" imports "$PACK/manifest.json"
case " $STEPS " in  # the model only for the steps that serve it
    *" engine "*|*" rollout "*|*" verl "*) "${HELPER[@]}" model "$WORK/policy" > "$OUT/model.log" 2>&1 ;;
esac
step engine "$ENGINE_S" "${HELPER[@]}" engine "$WORK/policy"
step rollout "$ROLLOUT_S" "${HELPER[@]}" rollout "$WORK/policy" "$WORK/rollout"
step verl "$VERL_S" "${HELPER[@]}" verl "$WORK/policy" "$WORK/verl"
# (d) only with QUICK_MIN_S left: the whole quick experiment rarely fits; what it reached is in its log. snakemake
# is the pack's (python -m snakemake from the prefix on PYTHONPATH), so are the stages' dependencies
if [[ " $STEPS " != *" quick "* ]]; then
    printf '{"step": "quick", "rc": null, "skipped": "not in STEPS"}\n' >> "$OUT/steps.jsonl"
elif (( BUDGET_S - (SECONDS - began) - 15 >= QUICK_MIN_S )); then
    step quick "$QUICK_MIN_S" "$PY" -m snakemake --cores "$(nproc)" --directory "$PWD" --config \
        "results_dir=$WORK/results" experiment=quick trainer=verl rollout=vllm trainer__device=cuda \
        sandbox__isolation=process run=gpu_verl_vllm
else
    printf '{"step": "quick", "rc": null, "skipped": "less than %s s left"}\n' "$QUICK_MIN_S" >> "$OUT/steps.jsonl"
fi

"$PY" - "$OUT" "$((SECONDS - began))" > "$OUT/gpu_verl_vllm.json" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
try:
    device = json.loads((out / "device.json").read_text().strip().splitlines()[-1])
except (OSError, ValueError, IndexError):
    device = None
steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines() if line.strip()]
print(json.dumps({"command": "bash benchmarks/gpu_verl_vllm.sh", "wall_s": int(sys.argv[2]), "device": device,
                  "steps": steps}, indent=2))
EOF
cat "$OUT/gpu_verl_vllm.json"
rm -rf "$PREFIX"
