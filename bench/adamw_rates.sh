#!/usr/bin/env bash
# AdamW time per parameter on this CPU, three optimizers in the same run on GPT-2's tensors:
#   host    nlptrain's host AdamW (train.offload = optimizer; src/train/host_adamw.cpp)
#   backend the CPU backend's adamw_update_spans (train.offload = none on the cpu backend)
#   torch   torch.optim.AdamW(fused=False, foreach=True) (bench/adamw_torch.py)
# host and backend run in one process (build/adamw_rates, which also checks that the two give the
# same bits); torch in its own; the two processes alternate ROUNDS times and the report quotes, per
# optimizer, the median over rounds of each round's median step [min-max], and the paired ratios
# host/backend and host/torch. A benchmark, not a test: it never fails on a number.
#
#   bash bench/adamw_rates.sh                       # GPT-2 124M's tensors, 2 threads, 3 rounds
#   SHAPE="24 1024 50257" bash bench/adamw_rates.sh # GPT-2 medium's (355M; 5.7 GB per process)
#
# Environment: ADAMW_BIN [build/adamw_rates]  PYTHON [python3]  SHAPE ["12 768 50257": n_layer n_embd
#              vocab]  THREADS [2]  STEPS [10]  ROUNDS [3]  RES [bench/results/adamw-rates-DATE-HW-COMMIT]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/result_dir.sh
BIN=${ADAMW_BIN:-build/adamw_rates}
PYTHON=${PYTHON:-python3}
read -r L C V <<<"${SHAPE:-12 768 50257}"
THREADS=${THREADS:-2}
STEPS=${STEPS:-10}
ROUNDS=${ROUNDS:-3}
RES=${RES:-$(result_dir adamw-rates)}
[ -x "$BIN" ] || { echo "adamw_rates.sh: no $BIN (build it: cmake --build build --target adamw_rates)" >&2; exit 2; }
mkdir -p "$RES"
export OMP_NUM_THREADS=$THREADS
{
  echo "date (UTC): $(date -u '+%F %T')"
  echo "commit: $(result_commit)"
  echo "host: $(hostname), cores: $(OMP_NUM_THREADS= nproc --all), memory: $(free -g | awk '/^Mem/{print $2}') GiB"
  LC_ALL=C lscpu | grep -E '^(Model name|CPU family|Model|Thread|Core|Socket)'
  echo "torch: $("$PYTHON" -c 'import torch; print(torch.__version__)')"
  echo "shape: n_layer $L n_embd $C vocab $V, threads $THREADS, timed steps $STEPS, rounds $ROUNDS"
  echo "commands: $BIN $L $C $V $THREADS $STEPS | $PYTHON bench/adamw_torch.py --n-layer $L --n-embd $C --vocab $V --threads $THREADS --steps $STEPS"
  echo "uptime before: $(uptime)"
} | tee "$RES/environment.txt"
: >"$RES/raw.txt"
for k in $(seq "$ROUNDS"); do
  echo "## round $k nlptrain (load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$RES/raw.txt"
  "$BIN" "$L" "$C" "$V" "$THREADS" "$STEPS" | tee -a "$RES/raw.txt"
  echo "## round $k torch (load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$RES/raw.txt"
  "$PYTHON" bench/adamw_torch.py --n-layer "$L" --n-embd "$C" --vocab "$V" --threads "$THREADS" \
    --steps "$STEPS" | tee -a "$RES/raw.txt"
done
echo "uptime after: $(uptime)" | tee -a "$RES/environment.txt"
"$PYTHON" - "$RES" <<'PY' | tee "$RES/results.md"
import os, re, statistics, sys
res = sys.argv[1]
raw = open(os.path.join(res, "raw.txt")).read()
rounds = re.split(r"^## round \d+ nlptrain.*$", raw, flags=re.M)[1:]
per = {"host": [], "backend": [], "torch": []}
for r in rounds:
    for name in per:
        m = re.search(rf"^{name} +ns/parameter median ([0-9.]+)", r, re.M)
        per[name].append(float(m.group(1)) if m else None)
def q(xs):
    xs = [x for x in xs if x is not None]
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}-{max(xs):.3f}]" if xs else "-"
def ratio(a, b):
    return q([x / y for x, y in zip(per[a], per[b]) if x is not None and y is not None])
print(f"# AdamW time per parameter: {os.path.basename(os.path.normpath(res))}\n")
print("```\n" + open(os.path.join(res, "environment.txt")).read().strip() + "\n```\n")
bit = re.findall(r"^bitwise host == backend.*: (\w+)$", raw, re.M)
print(f"Host AdamW bitwise equal to the backend's after 3 steps, every round: {'yes' if bit and all(b == 'yes' for b in bit) else 'NO'}\n")
print("Median over rounds of each round's median step (ns per parameter) [min-max]; ratios pair the "
      "rounds (torch runs in its own process right after nlptrain's in the same round).\n")
print("| optimizer | ns/parameter | host / this (paired) |")
print("|---|---|---|")
print(f"| nlptrain host AdamW (train.offload = optimizer) | {q(per['host'])} | 1 |")
print(f"| nlptrain CPU backend adamw_update_spans | {q(per['backend'])} | {ratio('host', 'backend')} |")
print(f"| torch.optim.AdamW(fused=False, foreach=True) | {q(per['torch'])} | {ratio('host', 'torch')} |")
PY
echo "results: $RES"
