#!/usr/bin/env bash
# Sanitizer build: a tiny GPT-2 trained on 2 ranks of the CPU backend through mpirun (gradient
# allreduce, evaluation, checkpoints, a generated sample), then resumed from its checkpoint for two
# more steps. Run by ctest in a -DNLPTRAIN_SANITIZE build (label "sanitize") with $NLPTRAIN_BIN set to
# the instrumented nlptrain and ASAN_OPTIONS/UBSAN_OPTIONS/LSAN_OPTIONS from tests/CMakeLists.txt;
# any sanitizer report makes a rank exit non-zero, and so this test fail.
set -euo pipefail
: "${NLPTRAIN_BIN:?set NLPTRAIN_BIN to the sanitizer-built nlptrain}"
src=${NLPTRAIN_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
work=$(mktemp -d /tmp/nlptrain-san-XXXXXX)
trap 'rm -rf "$work"' EXIT
python3 "$src/tools/make_dataset.py" --tokenizer byte --layout stream --val-fraction 0.2 --quiet \
  --out "$work/train.h5" --val-out "$work/eval.h5" "$src/README.md"

# Open MPI unloads its components in MPI_Finalize, before LeakSanitizer looks: keep them mapped
# (keep_dlopen.c). The shim is preloaded ahead of libasan, hence verify_asan_link_order=0; the slow
# unwinder gives full allocation stacks through libc/Open MPI code built without frame pointers, so
# that lsan.supp matches by library and nothing of nlptrain's is hidden.
: "${NLPTRAIN_KEEP_DLOPEN:?set NLPTRAIN_KEEP_DLOPEN to the built keep_dlopen library}"
export LD_PRELOAD=$NLPTRAIN_KEEP_DLOPEN${LD_PRELOAD:+:$LD_PRELOAD}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}:verify_asan_link_order=0:fast_unwind_on_malloc=0

run() {
  mpirun -np 2 --oversubscribe -x LD_PRELOAD -x ASAN_OPTIONS -x UBSAN_OPTIONS -x LSAN_OPTIONS -x OMP_NUM_THREADS \
    "$NLPTRAIN_BIN" \
    --data.train="$work/train.h5" --data.eval="$work/eval.h5" --output.dir="$work/out" \
    --model.n_layer=2 --model.n_head=2 --model.n_embd=32 --model.vocab_size=256 --model.n_positions=32 \
    --data.seq_len=32 --train.batch_size=2 --train.lr=1e-3 --train.warmup_steps=1 \
    --eval.interval=2 --eval.batches=2 --checkpoint.interval=2 --train.sample_interval=4 \
    --generate.max_new_tokens=8 --run.threads=1 "$@"
}
run --train.steps=4
test -f "$work/out/checkpoints/step_00000004.h5" || { echo "no checkpoint at step 4"; exit 1; }
run --train.steps=6 --train.resume=true
n=$(grep -c '"loss"' "$work/out/metrics.jsonl")
# 4 + 2 step records plus the evaluation records
[ "$n" -ge 6 ] || { echo "metrics.jsonl has $n loss records, expected >= 6"; cat "$work/out/metrics.jsonl"; exit 1; }
grep -q '"step":6' "$work/out/metrics.jsonl" || { echo "resumed run did not reach step 6"; exit 1; }
echo "sanitized 2-rank training and resume: ok"
