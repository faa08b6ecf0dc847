#!/usr/bin/env bash
# Start a Ray cluster across the nodes of the current SLURM allocation, run one command on it (the verl
# trainer), and stop what was started. Usage (inside sbatch/srun, as the backtest rule does on
# multi-node jobs):   ray_on_slurm.sh python -m verl.trainer.main_ppo <overrides...>
#
# Reads SLURM_JOB_NODELIST / SLURM_JOB_NUM_NODES (set by SLURM in every job) and, optionally,
# RAY_PORT (default 6379), GPUS_PER_NODE (default: SLURM_GPUS_ON_NODE, else 0), CPUS_PER_NODE
# (default: SLURM_CPUS_ON_NODE). The head runs on the first node of the allocation; every other
# node joins it through `srun --overlap`. The command runs on the head with RAY_ADDRESS set, so
# verl's ray.init() connects to this cluster instead of starting a private one.
set -euo pipefail

if [ $# -eq 0 ]; then
  echo "usage: $0 <command...>   (run inside a SLURM allocation)" >&2
  exit 2
fi
if [ -z "${SLURM_JOB_NODELIST:-}" ]; then
  echo "$0: SLURM_JOB_NODELIST is not set: not inside a SLURM allocation (run the command directly instead)" >&2
  exit 2
fi

RAY="${RAY:-ray}"
PORT="${RAY_PORT:-6379}"
GPUS="${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-0}}"
CPUS="${CPUS_PER_NODE:-${SLURM_CPUS_ON_NODE:-1}}"
mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
HEAD="${NODES[0]}"
HEAD_IP="$(srun --overlap --nodes=1 --ntasks=1 -w "$HEAD" hostname --ip-address | awk '{print $1}')"
export RAY_ADDRESS="${HEAD_IP}:${PORT}"
echo "ray_on_slurm: ${#NODES[@]} node(s), head ${HEAD} (${RAY_ADDRESS}), ${GPUS} GPU(s) and ${CPUS} CPU(s) per node" >&2

PIDS=()
cleanup() {
  for node in "${NODES[@]}"; do
    srun --overlap --nodes=1 --ntasks=1 -w "$node" "$RAY" stop --force >/dev/null 2>&1 || true
  done
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT

srun --overlap --nodes=1 --ntasks=1 -w "$HEAD" \
  "$RAY" start --head --node-ip-address="$HEAD_IP" --port="$PORT" --num-gpus="$GPUS" --num-cpus="$CPUS" --block &
PIDS+=($!)
sleep 5
for node in "${NODES[@]:1}"; do
  srun --overlap --nodes=1 --ntasks=1 -w "$node" \
    "$RAY" start --address="$RAY_ADDRESS" --num-gpus="$GPUS" --num-cpus="$CPUS" --block &
  PIDS+=($!)
done

# wait until every node has joined (at most ~5 minutes)
for _ in $(seq 1 60); do
  ALIVE="$(python -c 'import ray; ray.init(address="auto", logging_level="ERROR"); print(sum(n["Alive"] for n in ray.nodes()))' 2>/dev/null || echo 0)"
  [ "$ALIVE" -ge "${#NODES[@]}" ] && break
  sleep 5
done
if [ "${ALIVE:-0}" -lt "${#NODES[@]}" ]; then
  echo "ray_on_slurm: only ${ALIVE:-0} of ${#NODES[@]} nodes joined the Ray cluster" >&2
  exit 1
fi
"$@"
