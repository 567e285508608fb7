#!/usr/bin/env bash
# UNTESTED (prepared without a machine that has a core per rank; run it there first, read its output
# before trusting it). The CPU end-to-end bench with one core per rank: PP=2 x EP=2 against
# ScheduleInterleaved1F1B (4 processes on 4 cores) and PP=1 x EP=2 against the plain loop with
# blocking All-to-All (2 processes on 2 cores). On such a machine the cores do not fight over the
# processes, so what Tessera's overlap hides shows as wall time. Each rank has one intra-op thread
# (bench/e2e_cpu.py's deterministic CPU mode); the job is confined to the first cores with taskset
# and the results are copied to $OUT (or bench/results/cores/ without one).
#
#     bash bench/e2e_cpu_cores.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-8}"
python="${PYTHON:-.venv/bin/python}"
out="${OUT:-bench/results/cores}"
mkdir -p "$out"
cores=$(nproc)
if [ "$cores" -lt 4 ]; then
  echo "this machine has $cores cores; the bench wants 4 (one per rank)" >&2
  exit 2
fi
export OMP_NUM_THREADS=1
plan="$out/plan_pp2_ep2.tsb"
"${TESSERA_COMPILE:-.venv/bin/tessera-compile}" examples/tiny_qwen3_next.py --hardware cpu --seq-len 64 --microbatches 4 \
  -o "$plan"
taskset -c 0-3 "$python" -m torch.distributed.run --standalone --nproc-per-node 4 bench/e2e_cpu.py \
  --plan "$plan" --steps "$steps" | tee "$out/e2e_cpu_pp2_ep2_cores.txt"
taskset -c 0-1 "$python" -m torch.distributed.run --standalone --nproc-per-node 2 bench/e2e_cpu.py \
  --pp 1 --ep 2 --steps "$steps" | tee "$out/e2e_cpu_pp1_ep2_cores.txt"
cp bench/results/e2e_cpu.json "$out/e2e_cpu_pp2_ep2_cores.json"
cp bench/results/e2e_cpu_pp1_ep2.json "$out/e2e_cpu_pp1_ep2_cores.json"
{ nproc; uptime; lscpu | grep -i "model name"; } > "$out/machine.txt"
