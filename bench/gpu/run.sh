#!/usr/bin/env bash
# One command for a whole GPU run, on a GPU node (no MPI, no HDF5, no network needed there):
#
#   bash bench/gpu/prepare.sh                        # here: build with CUDA, pack, make the data
#   # on the GPU node, with bench/gpu/stage copied beside the tree (docs/gpu.md gives the exact call):
#   bash bench/gpu/run.sh                            # there; writes everything under $OUT
#
# The default sections are the ones that decide GPT-2's GPU step (info tests e2e bench torch account),
# estimated at about 6.4 minutes (385 s); the script prints its estimate per section first and ends by
# DEADLINE (420 s) whatever happens: a section that would start too late is skipped (and says so), and
# every command's timeout is cut so that it ends FINISH_S (10 s) before DEADLINE, which leaves the
# time to pack the results. The other sections (faults resume comm finetune profile) run on request
# (SECTIONS). The e2e section's CPU reference runs start at once in the background, beside the tests
# and the GPU runs; they are done before anything is timed.
#
# Sections (SECTIONS, default "info tests e2e bench torch account"; in this order; each logs under $W
# and nothing stops the others):
#   info    nvidia-smi, driver/toolkit/PyTorch versions, the commit of the binaries
#   tests   the op tests. A test binary's run failed when its exit status is neither 0 nor 1, when
#           gtest's "[  PASSED  ]" summary line is missing (a crash: segfault, abort) or when it ran
#           past its timeout; every test of a failed run counts as failed. The tests verified on a GPU
#           (bench/gpu/verified_ops.txt) run in one process; every other (never-run) test of
#           test_ops_cuda runs in its own process, and the bf16 binary (test_cuda_bf16, or the three
#           older test_ops_cuda_bf16, test_gemm_cuda_bf16, test_attention_cudnn_bf16) one process per
#           suite, TEST_JOBS of them at a time beside the verified run: a sticky CUDA error stays in
#           the process that made it. Each fallback switch (NLPTRAIN_CUDA_*) is taken from the result
#           of its own tests only (bench/gpu/compare.py tests), and the run log says which and why
#   e2e     a small GPT-2 (BPE vocabulary) and a small BERT doc_cls, 100 steps each on cuda and on cpu
#           (fp32, native attention, dropout on): losses within 1e-4 relative over the first 20
#           steps and 1e-3 over 100 (bench/gpu/compare.py); then BERT trimmed, bf16 with cuDNN (at
#           the file's length and trimmed), and packed through cuDNN in its ragged and bias layouts;
#           then run.cuda_graph (GPT-2; packed BERT with fixed examples) bitwise against eager launches;
#           then bf16 activations (run.bf16_activations, GPT-2 and BERT) against the CPU's and against
#           fp32 activations (losses within 2e-2); then a small RoBERTa and a small ELECTRA doc_cls
#           (E2E_ENCODERS; inputs/roberta_small.ini, electra_small.ini: bert_small's shape on the
#           same NSMC data) on cuda against cpu, fp32 (as BERT's) and bf16 with cuDNN (within 2e-2); a
#           binary without model.type = roberta | electra: "not in this build", the rest goes on
#   bench   nlptrain: GPT-2 124M (T=1024) and BERT-base doc_cls (T=128, B=32) at each BENCH_PRECISIONS
#           (bf16), the verified path; then the new bf16 step (bf16 activations, bf16 weight copy,
#           fused padded head, cuBLASLt epilogues) as a ladder of rungs, most complete first:
#             all            epilogues all (less the kinds whose tests failed), native bf16 kernels, fused head
#             bias           epilogues bias
#             none           epilogues none
#             staged         bf16 activations staged through the fp32 kernels
#             no_fused_head  the LM head unfused (and unpadded)
#           a rung whose switches failed their tests is skipped, and so is one with the same switches
#           as a rung before it; each other is checked (RUNG_STEPS = 6 steps under run.sync_check, its
#           losses within 2e-2 of the verified bf16 run's, peak memory read) until one passes; that
#           one is timed at GPT2_BATCH and NEW_BATCHES (24 32) and accounted, and results.json names
#           it (with its env and switches) in every record of the new step; no rung passes: nothing of
#           the new step is timed, and the log says why for each rung
#   torch   PyTorch + transformers on the same data and shapes (TORCH_RUNS: torch.compile only by
#           default, bf16, the peer's fastest setting; eager runs on request)
#   account run.profile's per-op account (bytes and FLOPs from the shapes, floor at the bandwidth and
#           GEMM rate measured in the run, measured time, ratio) of GPT-2 124M bf16 (B=GPT2_BATCH,
#           T=1024): the verified path (12 steps), then run.bf16_weights (the persistent bf16 weight
#           copy) 4 steps under run.sync_check, losses bitwise against the verified run's, and 12
#           steps profiled (when its test passed and time is left); then the new bf16 step at the
#           rung that passed, 12 steps profiled; bench/gpu/account.py prints the accounts per op
#           family and the predicted step beside the measured one -> $OUT/profile.txt
#   resume  GPT-2 small on cuda: 20 steps straight vs 10 + resume to 20: losses and final checkpoint
#           bitwise equal (fp32, then bf16 with cuDNN's attention)
#   faults  two ranks on the GPU with rank 0 killed (SIGKILL) at step 5: the job ends within 30 s with
#           a message; GPT-2 124M at batch 4096: the memory plan refuses it before allocating
#   comm    2 ranks sharing the GPU through the packed mpirun (comm.gpu = staged, 1 MiB buckets
#           overlapped with the backward): GPT-2 small 20 steps with train.zero = 0 and 1 against 2 CPU
#           ranks (losses within 1e-4 relative; zero 1 against zero 0 within 1e-6); then (COMM_STAGES)
#           train.zero = 2, train.zero = 3, train.offload = optimizer with zero 1, 2 and 3, each
#           on cuda and on 2 CPU ranks: against its CPU twin (1e-4) and against cuda zero 0 (1e-6), a
#           verdict each; a stage or key this binary refuses (train.zero's range, an unknown
#           train.offload) is logged "not in this build" and skipped, the others go on. NCCL needs a
#           GPU per rank: not runnable on one GPU.
#   finetune  the GPU fine-tuning comparison: bench/finetune_speed.sh DEVICE=cuda on NSMC doc_cls (8000
#           reviews, T=128), BERT-base from scratch, bf16, batch 32, lr FT_LR (5e-5), FT_STEPS steps:
#           nlptrain packed (native attention; pack_batch = examples and = rows; FT_SETTINGS adds
#           length-grouped and packed through cuDNN), HF Trainer length-grouped with SDPA, eager and
#           torch.compile
#           -> $OUT/finetune_results.md (real tokens/s, time,
#           accuracy); at most FT_BUDGET seconds. Then the packed bf16 run (PROFILE_FINETUNE) again:
#           30 steps with run.profile (-> profile.txt); 8 of its steps under Nsight Compute: the
#           GPU's busy time per step against the step's wall time (bench/gpu/ncu_busy.py ->
#           profile.txt), i.e. how launch-bound it is (the bf16 cast A/B that stood here measured the
#           8-wide casts 1.32x the scalar ones, bitwise equal: bench/results/gpu-20261128-h200-248618f);
#           then run.cuda_graph's A/B: that step with pack_batch = rows and fixed examples, eager
#           against CUDA graphs (GRAPH_AB_STEPS steps, alternating twice; losses bitwise equal)
#   profile nlptrain with run.profile (per-op account) on the two benchmark models -> $OUT/profile.txt
# What comes back (8 files or fewer, each under 16 MiB): results.json (one record per benchmark
# and side, bench/gpu/collect.py, and the ladder's rungs), summary.txt (its table), run.log,
# test_ops_cuda.log (the verified op tests), tests.log (every other test process's log), profile.txt,
# finetune_results.md, and gpu-run.tar.gz with every log, metrics.jsonl and summary.json.
set -uo pipefail
cd "$(dirname "$0")"
here=$PWD
OUT=${OUT:-$here/out-gpu}
mkdir -p "$OUT"
W=$(mktemp -d "${TMPDIR:-/tmp}/gpurun.XXXXXX")
# (on request: faults resume comm finetune profile, e.g. SECTIONS="info faults resume comm finetune")
SECTIONS=${SECTIONS:-"info tests e2e bench torch account"}
FT_STEPS=${FT_STEPS:-300}
FT_BUDGET=${FT_BUDGET:-240}
# 5e-5: at 1e-4 bf16 BERT-base from scratch stayed at the majority class on both sides for some seeds
# (bench/results/gpu-20261128-h200-f7c000e); at 5e-5 both learned on two seeds
FT_LR=${FT_LR:-5e-5}
# (nlptrain's length-grouped and packed-cuDNN settings ran on the H200 on 2026-11-28: 13 and 11 ms a
# step against packed's 10; left out by default so that the step benchmarks' torch.compile runs fit)
# nlptrain-packedrows-bf16: data.pack_batch = rows (train.batch_size counts rows; about 32 examples a
# step and the same examples seen; its speed and accuracy matched pack_batch = examples on the H200 on
# 2026-11-28, bench/results/gpu-20261128-h200-f206848)
FT_SETTINGS=${FT_SETTINGS:-"nlptrain-packed-bf16 nlptrain-packedrows-bf16 hf-longest-group-bf16 hf-longest-group-compile-bf16"}
DEADLINE=${DEADLINE:-420}  # seconds of script; every command ends by DEADLINE - FINISH_S
FINISH_S=${FINISH_S:-10}   # what finish() needs to pack the results
TEST_JOBS=${TEST_JOBS:-3}  # test processes at a time beside the verified op tests' one
TEST_TIMEOUT=${TEST_TIMEOUT:-40}  # seconds for each never-run test process (the verified one: 150)
RUNG_STEPS=${RUNG_STEPS:-6}  # the ladder's check: steps under run.sync_check, losses against the verified run's
BENCH_PRECISIONS=${BENCH_PRECISIONS:-"bf16"}  # (fp32: no torch peer by default any more)
PROFILE_MODELS=${PROFILE_MODELS:-"gpt2_124m bert_base_doc_cls"}
PROFILE_PRECISION=${PROFILE_PRECISION:-bf16}
PROFILE_FINETUNE=${PROFILE_FINETUNE:-doc_cls_nlptrain-packed-bf16_s1234}  # a finetune run to profile (raw/<name>)
GPT2_BATCH=${GPT2_BATCH:-16}  # GPT-2 124M sequences per step (both sides); BERT-base: 32
TORCH_RUNS=${TORCH_RUNS:-"gpt2:compile:bf16 bert:compile:bf16"}  # (eager: add gpt2:eager:bf16 ...)
GRAPH_AB_STEPS=${GRAPH_AB_STEPS:-200}  # the run.cuda_graph A/B's steps (finetune section)
export PYTHONUNBUFFERED=1
t_start=$(date +%s)
NL="$here/stage/bin/run-on-device.sh $here/stage/bin/nlptrain"
elapsed() { echo $(( $(date +%s) - t_start )); }
log() { echo "[run.sh $(elapsed)s] $*" | tee -a "$W/run.log"; }
want() { [[ " $SECTIONS " == *" $1 "* ]]; }
# tmo SECONDS: a command's timeout, cut so that it ends FINISH_S before DEADLINE whenever it starts
# (at least 1 s: "timeout 0" would mean no limit); with "timeout -k 2", 2 s more for one that ignores
# SIGTERM
left() { echo $(( DEADLINE - FINISH_S - $(elapsed) )); }
tmo() {
  local l
  l=$(left)
  (( l < 1 )) && l=1
  echo $(( $1 < l ? $1 : l ))
}
in_time() {  # in_time NEED_SECONDS WHAT: enough time left before DEADLINE?
  if (( $(elapsed) + $1 > DEADLINE - FINISH_S )); then log "SKIPPED (deadline): $2"; return 1; fi
}

# The estimate of each section (seconds; the H200's times of 2026-11-28 where a section ran then, else
# the sum of its runs' estimates), printed first for the sections asked for
# (e2e: 55 s on the H200, and 8 s for the encoders' 4 runs on cuda, whose CPU references run in the
# background behind the tests; comm: 25 s on the H200 for zero 0 and 1, and about 10 s a stage for the
# 4 more, cuda and cpu)
declare -A EST=([info]=12 [tests]=60 [e2e]=63 [bench]=80 [torch]=125 [account]=45
                [faults]=20 [resume]=30 [comm]=75 [finetune]=300 [profile]=20)
declare -A EST_WHAT=([info]="nvidia-smi, versions"
                     [tests]="verified op tests; never-run tests, a process each"
                     [e2e]="small GPT-2, BERT, RoBERTa, ELECTRA, cuda against cpu"
                     [bench]="verified GPT-2 and BERT steps; the new step's ladder; the rung timed at 3 batches"
                     [torch]="torch.compile GPT-2 and BERT"
                     [account]="run.profile of the verified and the new step"
                     [faults]="a rank killed; a batch beyond memory" [resume]="20 steps vs 10 + 10, fp32 and bf16"
                     [comm]="2 ranks on one GPU against 2 CPU ranks, ZeRO 0-3, offload" [finetune]="NSMC fine-tuning comparison, ncu, graph A/B"
                     [profile]="run.profile of the two benchmark models")
estimate() {
  local total=0 s
  log "estimate (seconds), in the order they run:"
  for s in info tests e2e bench torch account resume faults comm finetune profile; do
    want $s || continue
    log "$(printf '  %-9s %4d  %s' "$s" "${EST[$s]}" "${EST_WHAT[$s]}")"
    total=$(( total + ${EST[$s]} ))
  done
  log "$(printf '  %-9s %4d  of DEADLINE %d s (commands end by %d s)' total $total "$DEADLINE" $(( DEADLINE - FINISH_S )))"
  (( total > DEADLINE - FINISH_S )) && log "estimate: over the deadline: the last sections will be skipped"
}

# mem_watch NAME CMD...: run CMD while sampling the GPU's used memory (nvidia-smi, every 100 ms);
# the peak (MiB, the whole device, CUDA context included) goes to $W/mem/NAME.
mkdir -p "$W/mem"
mem_watch() {
  local name=$1
  shift
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$W/mem/$name.trace" 2>/dev/null &
  local smi=$!
  "$@"
  local rc=$?
  kill $smi 2>/dev/null
  wait $smi 2>/dev/null
  sort -n "$W/mem/$name.trace" | tail -1 > "$W/mem/$name"
  return $rc
}

# results.json, summary.txt and the log archive under $OUT after every section, so that a run
# stopped from outside still brings back what it measured (past the commands' end, finish() does it)
snapshot() {
  (( $(left) >= 1 )) || return 0
  python3 "$here/collect.py" --work "$W" --commit-file "$here/stage/commit.txt" --out "$OUT/results.json" \
      > "$OUT/summary.txt" 2> "$W/collect.err" || true
  cp "$W/run.log" "$OUT/run.log" 2>/dev/null
  tar -czf "$OUT/gpu-run.tar.gz" -C "$W" --exclude='*.h5' --exclude='*.trace' . 2>/dev/null
}

finish() {
  log "packing logs"
  python3 "$here/collect.py" --work "$W" --commit-file "$here/stage/commit.txt" --out "$OUT/results.json" \
      > "$OUT/summary.txt" 2> "$W/collect.err" || echo "collect.py failed: $(tail -3 "$W/collect.err")" >> "$OUT/summary.txt"
  cp "$W/run.log" "$OUT/run.log" 2>/dev/null
  # every log and metrics file, no checkpoints (the archive stays under 16 MiB)
  tar -czf "$OUT/gpu-run.tar.gz" -C "$W" --exclude='*.h5' --exclude='*.trace' . 2>/dev/null
  cp "$W/tests/test_ops_cuda.log" "$OUT/" 2>/dev/null
  # every other test process's log, one after the other
  for f in "$W"/tests/*.log; do
    [[ -f $f && $f != "$W/tests/test_ops_cuda.log" ]] || continue
    echo "==== $(basename "$f" .log) (exit $(cat "${f%.log}.rc" 2>/dev/null))"
    cat "$f"
  done > "$OUT/tests.log" 2>/dev/null
  [[ -s $OUT/tests.log ]] || rm -f "$OUT/tests.log"
  cat "$OUT/summary.txt"
}
trap finish EXIT

log "sections: $SECTIONS | deadline ${DEADLINE}s | work $W"
estimate
cat stage/commit.txt > "$W/commit.txt"

# not_in_build LOG KEYS: the line of LOG in which nlptrain refused one of KEYS (a regex of key names)
# as unknown or outside its range (a binary built before that key or value existed), or as a value
# that has run on the cpu backend only (a binary that refuses train.zero = 3 on cuda); nothing, and status 1, when
# it did not (the first error only: two ranks' may share a line)
not_in_build() {
  grep -m1 -E "nlptrain: error: .*(unknown (key|option) '(--)?($2)'|($2) = '[^']*': must be|($2) = [^ ]+ \([^)]*\) has run on the cpu backend only)" "$1" 2>/dev/null \
      | awk -F 'nlptrain: error: ' '{ print FS $2 }' | grep .
}
# check_record SECTION CHECK VERDICT DETAIL: one check's verdict (pass, fail, not_in_build) ->
# $W/checks.jsonl (results.json's "checks", collect.py)
check_record() {
  python3 -c 'import json, sys; print(json.dumps(dict(zip(("section", "check", "verdict", "detail"), sys.argv[1:]))))' \
      "$@" >> "$W/checks.jsonl"
}
# compare_losses SECTION LABEL REF_DIR TEST_DIR LOG WITHIN...: compare.py losses of two runs, its lines
# to LOG and run.log, the verdict to checks.jsonl; a run that this build refused
# (REF_DIR.not_in_build, written where its run was refused): "not in this build", no comparison
compare_losses() {
  local section=$1 label=$2 ref=$3 test=$4 clog=$5 out d
  shift 5
  for d in "$ref" "$test"; do
    if [[ -f $d.not_in_build ]]; then
      log "$label: not in this build ($(basename "$d"): $(cat "$d.not_in_build")): skipped"
      echo "$label: not in this build ($(basename "$d"))" >> "$clog"
      check_record "$section" "$label" not_in_build "$(cat "$d.not_in_build")"
      return
    fi
  done
  out=$(python3 compare.py losses "$ref/metrics.jsonl" "$test/metrics.jsonl" "$@" 2>&1)
  sed "s/^/$label: /" <<< "$out" | tee -a "$clog" | tee -a "$W/run.log"
  if grep -q '^FAIL' <<< "$out" || ! grep -q '^PASS' <<< "$out"; then
    check_record "$section" "$label" fail "$(paste -sd';' <<< "$out")"
  else
    check_record "$section" "$label" pass "$(paste -sd';' <<< "$out")"
  fi
}

# e2e_run NAME BACKEND INI ARGS...: one run of E2E_STEPS steps (100; fewer only for the CPU-only
# check of this script, tests/python/test_gpu_script.py) into $W/e2e/NAME (log $W/e2e_NAME.log)
E2E_STEPS=${E2E_STEPS:-100}
e2e_run() {
  local name=$1 be=$2 ini=$3
  shift 3
  (( $(left) >= 2 )) || { log "SKIPPED (deadline): e2e $name"; return; }
  timeout $(tmo 240) $NL "inputs/$ini.ini" --run.backend=$be --run.threads=$E2E_THREADS --train.steps=$E2E_STEPS "$@" \
      --output.dir="$W/e2e/$name" > "$W/e2e_$name.log" 2>&1
  local rc=$? why
  # the encoders beside BERT (model.type = roberta | electra): a binary without them refuses the INI
  if why=$(not_in_build "$W/e2e_$name.log" 'model\.(type|embedding_size)'); then
    mkdir -p "$W/e2e"
    echo "$why" > "$W/e2e/$name.not_in_build"
    log "e2e $name: not in this build: skipped | $why"
    return
  fi
  log "e2e $name: exit $rc | $(grep -E "^step +$E2E_STEPS/" "$W/e2e/$name/log.txt" 2>/dev/null | head -1)"
  [[ -f "$W/e2e/$name/log.txt" ]] || tail -3 "$W/e2e_$name.log" | sed "s/^/  $name: /" | tee -a "$W/run.log"
}
e2e_compare() {  # e2e_compare LABEL REF TEST WITHIN...: losses of two runs (compare.py)
  local label=$1 ref=$2 test=$3
  shift 3
  compare_losses e2e "$label" "$W/e2e/$ref" "$W/e2e/$test" "$W/e2e_compare.log" "$@"
}
TRIM=(--data.padding=longest --data.pad_multiple=64 --run.sync_check=true)
# bf16 with the fused (cuDNN) attention against the CPU's bf16 emulation (which keeps attention in
# fp32): attention dropout off, since cuDNN draws its own mask
BF16=(--train.precision=bf16 --run.cpu_bf16=emulate --model.attention=auto)
ROWS=(--data.packing=true --data.pack_batch=rows)
declare -A NO_ATTN_DROPOUT=([gpt2_small]=--model.attn_pdrop=0 [bert_small]=--model.attention_probs_dropout_prob=0)
# the encoders beside BERT in the e2e section (model.type = roberta | electra; inputs/NAME.ini), whose
# attention dropout has BERT's key
E2E_ENCODERS=${E2E_ENCODERS:-"roberta_small electra_small"}
ENC_NO_ATTN_DROPOUT=--model.attention_probs_dropout_prob=0
E2E_THREADS=$(nproc)
# the CPU references, in the background from the start, on all but two cores (the GPU runs' and the
# tests' host threads)
if want e2e; then
  (
    E2E_THREADS=$(( $(nproc) > 4 ? $(nproc) - 2 : $(nproc) ))
    for m in gpt2_small bert_small; do e2e_run ${m}_cpu cpu $m; done
    e2e_run bert_small_trim_cpu cpu bert_small "${TRIM[@]}"
    for m in bert_small gpt2_small; do e2e_run ${m}_bf16_cpu cpu $m "${BF16[@]}" "${NO_ATTN_DROPOUT[$m]}"; done
    # bf16 activations (run.bf16_activations): the CPU rounds at the GPU's bf16 stores
    for m in gpt2_small bert_small; do
      e2e_run ${m}_bf16act_cpu cpu $m "${BF16[@]}" "${NO_ATTN_DROPOUT[$m]}" --run.bf16_activations=true
    done
    # packed steps (data.pack_batch = rows: 8 rows of 128, about 50 NSMC examples a step)
    e2e_run bert_small_rows_cpu cpu bert_small "${ROWS[@]}"
    e2e_run bert_small_rows_bf16_cpu cpu bert_small "${ROWS[@]}" "${BF16[@]}" "${NO_ATTN_DROPOUT[bert_small]}"
    # the encoders beside BERT, last (a binary without them refuses each at once: not in this build)
    for m in $E2E_ENCODERS; do
      e2e_run ${m}_cpu cpu $m
      e2e_run ${m}_bf16_cpu cpu $m "${BF16[@]}" "${NO_ATTN_DROPOUT[$m]:-$ENC_NO_ATTN_DROPOUT}"
    done
  ) &
  cpu_refs=$!
fi

if want info; then
  {
    date -u +"%Y-%m-%dT%H:%M:%SZ"
    nvidia-smi
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv
    nvcc --version 2>/dev/null | tail -2
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'transformers', transformers.__version__)"
    nproc; free -g | head -2
    "$here/stage/bin/run-on-device.sh" --check "$here/stage/bin/nlptrain" "$here"/stage/bin/test_*
    $NL --version
  } > "$W/info.log" 2>&1
  nvidia-smi --query-gpu=name --format=csv,noheader | head -1 > "$W/device_name"
  log "info: $(cat "$W/device_name")"
fi

snapshot
# The op tests. Verified on a GPU: the tests of test_ops_cuda named in VERIFIED_OPS (one a line; the
# H200's run at 248618f passed them); those run in one process, the others excluded by a negative
# filter. Never run on a GPU: every other test that test_ops_cuda lists, each in its own process (a
# test added since, the fused head's among them, cannot fail a verified one with a sticky error), and
# the bf16 binary's suites, each suite in its own process; TEST_JOBS at a time beside the verified run.
# A process that crashes, hangs or prints no gtest summary fails every test it ran or would have run
# (compare.py tests).
VERIFIED_OPS=${VERIFIED_OPS:-$here/verified_ops.txt}
TD=$W/tests
mkdir -p "$TD"
LAUNCH="$here/stage/bin/run-on-device.sh"
# the bf16 tests: one binary, or the three it replaced on an older stage
if [[ -e $here/stage/bin/test_cuda_bf16 ]]; then BF16_BINS=(test_cuda_bf16)
else BF16_BINS=(); for t in test_ops_cuda_bf16 test_gemm_cuda_bf16 test_attention_cudnn_bf16; do
  [[ -e $here/stage/bin/$t ]] && BF16_BINS+=("$t"); done; fi
# gtest_list BIN FILTER LIST: the binary's tests under a filter (Suite.Name, one a line) -> $TD/LIST.list
gtest_list() {
  local b=$1 f=$2 l=$3
  timeout -k 2 $(tmo 30) "$LAUNCH" "$here/stage/bin/$b" --gtest_list_tests --gtest_filter="$f" > "$TD/$l.listing" 2>&1
  awk '/^[A-Za-z_][A-Za-z0-9_\/]*\.( |$)/ { s = $1; next } s != "" && /^  [A-Za-z_]/ { print s $1 }' \
      "$TD/$l.listing" > "$TD/$l.list"
  [[ -s $TD/$l.list ]] || log "tests: $b lists no tests under $f: $(tail -2 "$TD/$l.listing" | tr '\n' ' ')"
}
# gtest_proc NAME SECONDS BIN ARGS...: one process of a test binary -> $TD/NAME.log and .rc, and a
# line in the log: crashed, timed out, without summary, or the summary
gtest_proc() {
  local name=$1 t b=$3 rc why
  t=$(tmo $2)
  shift 3
  timeout -k 2 "$t" "$LAUNCH" "$here/stage/bin/$b" --gtest_color=no "$@" > "$TD/$name.log" 2>&1
  rc=$?
  echo $rc > "$TD/$name.rc"
  if (( rc == 124 || rc == 137 )); then why="FAILED: timed out after ${t} s"
  elif (( rc > 128 )); then why="FAILED: crashed (signal $(( rc - 128 ))$(kill -l $(( rc - 128 )) 2>/dev/null | sed 's/^/ SIG/'))"
  elif (( rc > 1 )); then why="FAILED: exit $rc"
  elif ! grep -qE '^\[  PASSED  \]' "$TD/$name.log"; then why="FAILED: exit $rc without gtest's summary line"
  else why="exit $rc | $(grep -E '^\[  (PASSED|FAILED|SKIPPED)  \] [0-9]+ tests?' "$TD/$name.log" | tr '\n' ' ')"; fi
  log "tests $name: $why"
  grep -E '^\[  FAILED  \] [A-Za-z]' "$TD/$name.log" | grep -v ' listed below' | head -10 | sed "s/^/  $name: /" \
      | tee -a "$W/run.log"
}
# tests_pass PATTERN [OLD_PATTERN]: did every test of a gtest pattern pass? The verdict line of
# compare.py tests (all of them at once, after the tests: $TD/verdicts.txt) goes to the log;
# OLD_PATTERN: the tests of an older stage, when the stage has none of PATTERN
TESTS_PATTERNS=('CudaOps.FusedResidualLayerNorm*' 'CudaOps.Bf16OperandCastsRoundAsTheHost'
  'CudaOps.CapturedOpsReplayWithTheirSlotValues' 'CudaOps.SegmentCrossEntropy*' 'CudaOps.LmHeadBf16Dlogits*:CudaOps.LmHeadBf16Kernel*'
  'CudaOps.LmHeadOnlineSoftmax*' 'CudaOps.LmHeadBf16WteAndOnlineSoftmax*'
  'CudaOps.LmHeadCrossEntropyMatchesCpu:*FusedHead*' 'CudaOps.Bf16WeightCopy*' 'CudaOps.AccountTimesGemmsAndCastsApart'
  'CudaBf16Kernels.*:CudaBf16Backend.*' 'GemmBf16Plain.*' 'GemmBf16.*'
  'GemmBf16Reference.*:GemmBf16Backward.*:CudaBackendBf16Views.*' 'CudnnBf16.*:CudnnBf16Sizes.*'
  'GemmEpiloguesEnv.*' 'GemmBf16EpilogueBias.*' 'GemmBf16EpilogueGeluAux.*' 'GemmBf16EpilogueDgelu.*'
  'GemmBf16EpilogueBgrad.*')
tests_pass() {
  local line
  line=$(grep -F -m1 -e "PASS tests $1: " -e "FAIL tests $1: " "$TD/verdicts.txt" 2>/dev/null)
  if [[ -n ${2:-} && ( -z $line || $line == *": no test of this name"* ) ]]; then
    tests_pass "$2"
    return
  fi
  [[ -n $line ]] || line="FAIL tests $1: no verdict (not in TESTS_PATTERNS)"
  echo "tests: $line" >> "$W/run.log"
  [[ $line == PASS* ]]
}
# what the ladder (bench) may use: set from the tests below; without the tests section, all
FUSED_HEAD_OK=1 BF16W_OK=1
EPI_OK=(bias gelu_aux dgelu bgrad)
declare -A EPI_SUITE=([bias]=GemmBf16EpilogueBias [gelu_aux]=GemmBf16EpilogueGeluAux
                      [dgelu]=GemmBf16EpilogueDgelu [bgrad]=GemmBf16EpilogueBgrad)
if want tests && in_time 15 "tests"; then
  gtest_list test_ops_cuda '*' test_ops_cuda
  if [[ -f $VERIFIED_OPS ]]; then
    grep -vxF -f <(grep -v '^#' "$VERIFIED_OPS") "$TD/test_ops_cuda.list" > "$TD/never_run_ops.list"
  else
    log "tests: no $VERIFIED_OPS: every test of test_ops_cuda runs in its own process"
    cp "$TD/test_ops_cuda.list" "$TD/never_run_ops.list"
  fi
  log "tests: test_ops_cuda lists $(wc -l < "$TD/test_ops_cuda.list") tests, $(wc -l < "$TD/never_run_ops.list") of them never run on a GPU (a process each): $(paste -sd' ' "$TD/never_run_ops.list" | cut -c1-400)"
  gtest_proc test_ops_cuda 150 test_ops_cuda --gtest_filter="-$(paste -sd: "$TD/never_run_ops.list")" &
  verified=$!
  (
    jobs_=()
    while read -r t; do jobs_+=("test_ops_cuda--$t test_ops_cuda $t"); done < "$TD/never_run_ops.list"
    for b in "${BF16_BINS[@]}"; do
      gtest_list "$b" '*' "$b"
      for suite in $(sed 's/\..*//' "$TD/$b.list" | awk '!seen[$0]++'); do jobs_+=("$b--$suite $b $suite.*"); done
    done
    for j in "${jobs_[@]}"; do
      read -r name b f <<< "$j"
      while (( $(jobs -rp | wc -l) >= TEST_JOBS )); do wait -n; done
      gtest_proc "$name" "$TEST_TIMEOUT" "$b" --gtest_filter="$f" &
    done
    wait
  )
  wait $verified
  python3 compare.py tests "$TD" "${TESTS_PATTERNS[@]}" > "$TD/verdicts.txt" 2>&1
  # each fallback from its own tests: the fused residual/layer-norm kernels (verified): the separate ops
  if ! tests_pass 'CudaOps.FusedResidualLayerNorm*'; then
    export NLPTRAIN_CUDA_FUSED_LN=0
    log "tests: the fused layer norm did not pass its test: NLPTRAIN_CUDA_FUSED_LN=0 for the rest of the run"
  fi
  # the 8-wide bf16 operand casts (verified on the H200 on 2026-11-28): the scalar kernel
  if ! tests_pass 'CudaOps.Bf16OperandCastsRoundAsTheHost'; then
    export NLPTRAIN_CUDA_BF16_CAST=scalar
    log "tests: the vector bf16 casts did not pass their test: NLPTRAIN_CUDA_BF16_CAST=scalar for the rest of the run"
  fi
  # the recording of run.cuda_graph: its runs below go ahead even if its op test fails, since a
  # recording that fails falls back to eager launches (its log says why) and the bitwise comparisons
  # catch a replay that runs wrong: one run then shows how far it works
  tests_pass 'CudaOps.CapturedOpsReplayWithTheirSlotValues' ||
    log "tests: the CUDA graph recording did not pass its op test: the run.cuda_graph runs below still run, for their logs"
  # the segment cross-entropy kernel (packed qa): the row op per example
  if ! tests_pass 'CudaOps.SegmentCrossEntropy*'; then
    export NLPTRAIN_CUDA_SEGMENT_CE=rows
    log "tests: the segment cross-entropy did not pass its test: NLPTRAIN_CUDA_SEGMENT_CE=rows for the rest of the run"
  fi
  # the fused LM head's bf16 dlogits: the fp32 dlogits and the GEMM's cast
  if ! tests_pass 'CudaOps.LmHeadBf16Dlogits*:CudaOps.LmHeadBf16Kernel*' 'CudaOps.LmHeadBf16*'; then
    export NLPTRAIN_CUDA_HEAD_DLOGITS=fp32
    log "tests: the fused head's bf16 dlogits did not pass their tests: NLPTRAIN_CUDA_HEAD_DLOGITS=fp32 for the rest of the run"
  fi
  # the head's one-pass (online) max and sum: the two-pass loss kernel
  if ! tests_pass 'CudaOps.LmHeadOnlineSoftmax*'; then
    export NLPTRAIN_CUDA_HEAD_SOFTMAX=twopass
    log "tests: the head's one-pass softmax did not pass its test: NLPTRAIN_CUDA_HEAD_SOFTMAX=twopass for the rest of the run"
  fi
  # the padded head's one bf16 wte copy (with the one-pass softmax): the fp32 padded copy, cast by each GEMM
  if ! tests_pass 'CudaOps.LmHeadBf16WteAndOnlineSoftmax*'; then
    export NLPTRAIN_CUDA_HEAD_WTE=fp32 NLPTRAIN_CUDA_HEAD_SOFTMAX=twopass
    log "tests: the head's bf16 wte copy did not pass its test: NLPTRAIN_CUDA_HEAD_WTE=fp32 and NLPTRAIN_CUDA_HEAD_SOFTMAX=twopass for the rest of the run"
  fi
  # the fused LM head itself (its fp32 dlogits): the ladder's rungs with the fused head are skipped
  if ! tests_pass 'CudaOps.LmHeadCrossEntropyMatchesCpu:*FusedHead*'; then
    FUSED_HEAD_OK=0
    log "tests: the fused LM head did not pass its tests: the new step's rungs with it are skipped"
  fi
  # the persistent bf16 weight copy: the ladder runs without it (run.bf16_weights = false)
  if ! tests_pass 'CudaOps.Bf16WeightCopy*'; then
    BF16W_OK=0
    log "tests: the bf16 weight copy did not pass its test: the new step runs with run.bf16_weights = false"
  fi
  tests_pass 'CudaOps.AccountTimesGemmsAndCastsApart' ||
    log "tests: the account's timing did not pass its test: the account section's times are not to be trusted"
  # bf16 activations: the native bf16 kernels, the plain typed GEMM and its reference, the backend's
  # bf16 views and cuDNN's bf16-I/O attention; any of them failed: staged through the fp32 kernels
  # (NLPTRAIN_CUDA_BF16_ACTS=staged) for the rest of the run
  staged_why=()
  tests_pass 'CudaBf16Kernels.*:CudaBf16Backend.*' || staged_why+=("native bf16 kernels")
  tests_pass 'GemmBf16Plain.*' 'GemmBf16.*' || staged_why+=("plain typed GEMM")
  tests_pass 'GemmBf16Reference.*:GemmBf16Backward.*:CudaBackendBf16Views.*' || staged_why+=("typed GEMM backward and views")
  tests_pass 'CudnnBf16.*:CudnnBf16Sizes.*' || staged_why+=("cuDNN bf16-I/O attention")
  if (( ${#staged_why[@]} )); then
    export NLPTRAIN_CUDA_BF16_ACTS=staged
    log "tests: did not pass: $(IFS=,; echo "${staged_why[*]}"): NLPTRAIN_CUDA_BF16_ACTS=staged for the rest of the run"
  fi
  # the cuBLASLt epilogues, each kind from its own suite (an older stage: the one GemmBf16 suite for
  # all); the environment's parsing of them from GemmEpiloguesEnv; a kind that failed is left out of
  # the ladder's first rung, and bias (the default) failing turns them off for the rest of the run
  env_ok=1
  tests_pass 'GemmEpiloguesEnv.*' || env_ok=0
  EPI_OK=()
  for kind in bias gelu_aux dgelu bgrad; do
    tests_pass "${EPI_SUITE[$kind]}.*" 'GemmBf16.*' && (( env_ok )) && EPI_OK+=("$kind")
  done
  log "tests: cuBLASLt epilogue kinds that passed their tests: ${EPI_OK[*]:-none}"
  if [[ " ${EPI_OK[*]} " != *" bias "* ]]; then
    export NLPTRAIN_CUDA_GEMM_EPILOGUES=none
    log "tests: the bias epilogue did not pass its tests: NLPTRAIN_CUDA_GEMM_EPILOGUES=none for the rest of the run"
  fi
fi

snapshot
if want e2e && in_time 45 "e2e"; then
  E2E_THREADS=2
  for m in gpt2_small bert_small; do e2e_run ${m}_cuda cuda $m; done
  # Passed on one H200 (2026-11-28): batches trimmed to their longest row (multiple of 64) with length
  # grouping, after the verified fixed-length path above, under run.sync_check so that a fault names
  # its op. The same losses as the padded run on each backend (dropout keyed by the untrimmed layout),
  # and cuda equal to cpu.
  e2e_run bert_small_trim_cuda cuda bert_small "${TRIM[@]}"
  for m in gpt2_small bert_small; do
    e2e_run ${m}_bf16_cuda cuda $m "${BF16[@]}" "${NO_ATTN_DROPOUT[$m]}"
    grep -h "attention" "$W/e2e/${m}_bf16_cuda/log.txt" 2>/dev/null | head -3 | tee -a "$W/run.log"
  done
  # cuDNN's attention at two batch lengths (64 and 128; one support decision per head shape, graphs
  # per length and variant), against the padded bf16 CPU run; the graphs' count and host time
  e2e_run bert_small_trim_bf16_cuda cuda bert_small "${TRIM[@]}" "${BF16[@]}" "${NO_ATTN_DROPOUT[bert_small]}"
  grep -h "cuDNN attention:" "$W/e2e_bert_small_trim_bf16_cuda.log" 2>/dev/null | tee -a "$W/run.log"
  # Passed on one H200 (2026-11-28): packed rows of the file's length through cuDNN, in each layout
  # (ragged: every example its own cuDNN sequence, one graph for the run; bias: block-diagonal), under
  # run.sync_check, against the unpacked bf16 CPU run (hidden dropout keyed per example, so the
  # same masks; attention dropout off)
  for layout in ragged bias; do
    NLPTRAIN_CUDNN_PACKED=$layout e2e_run bert_small_packed_${layout}_cuda cuda bert_small \
        --train.precision=bf16 --model.attention=cudnn --model.attention_probs_dropout_prob=0 \
        --data.packing=true --data.pack_batch=examples --run.sync_check=true
    grep -h "cuDNN\|ragged" "$W/e2e_bert_small_packed_${layout}_cuda.log" 2>/dev/null | head -3 | tee -a "$W/run.log"
  done
  # Packed steps (data.pack_batch = rows; first run on the H200 on 2026-11-28), fp32 with the native attention, and
  # bf16 through cuDNN (the block-diagonal bias over the run's one 8 x 128 shape: one graph), against
  # the CPU's packed steps (the same plan: the same examples in the same rows)
  e2e_run bert_small_rows_cuda cuda bert_small "${ROWS[@]}" --run.sync_check=true
  e2e_run bert_small_rows_bf16_cuda cuda bert_small "${ROWS[@]}" --train.precision=bf16 --model.attention=cudnn \
      --model.attention_probs_dropout_prob=0 --run.sync_check=true
  grep -h "cuDNN attention:" "$W/e2e_bert_small_rows_bf16_cuda.log" 2>/dev/null | tee -a "$W/run.log"
  # Not yet run on a GPU: the same with data.pack_fixed_examples (the heads at 8 x 16 examples every
  # micro-batch, the ones after the real examples ignored): the same losses as the CPU's packed steps
  e2e_run bert_small_rows_fixed_bf16_cuda cuda bert_small "${ROWS[@]}" --data.pack_fixed_examples=true \
      --train.precision=bf16 --model.attention=cudnn --model.attention_probs_dropout_prob=0 --run.sync_check=true
  # Not yet run on a GPU: run.cuda_graph (each training micro-batch replayed as one CUDA graph with its
  # own seeds and loss scale): bitwise the eager launches of the same runs above (GPT-2 fp32, the native
  # attention's dropout on; packed BERT with fixed examples through cuDNN)
  e2e_run gpt2_small_graph_cuda cuda gpt2_small --run.cuda_graph=true
  e2e_run bert_small_rows_fixed_graph_bf16_cuda cuda bert_small "${ROWS[@]}" --data.pack_fixed_examples=true \
      --train.precision=bf16 --model.attention=cudnn --model.attention_probs_dropout_prob=0 --run.cuda_graph=true
  grep -h "run.cuda_graph" "$W/e2e/gpt2_small_graph_cuda/log.txt" \
      "$W/e2e/bert_small_rows_fixed_graph_bf16_cuda/log.txt" 2>/dev/null | tee -a "$W/run.log"
  # Not yet run on a GPU: bf16 activations (run.bf16_activations; the native bf16 kernels, cuDNN's
  # bf16-I/O attention and the typed GEMMs, or the staged ops when the tests above failed), under
  # run.sync_check, against the CPU's bf16-activation run and against the fp32-activation bf16 run
  for m in gpt2_small bert_small; do
    e2e_run ${m}_bf16act_cuda cuda $m "${BF16[@]}" "${NO_ATTN_DROPOUT[$m]}" --run.bf16_activations=true \
        --run.sync_check=true
  done
  # Not yet run on a GPU: the encoders beside BERT on BERT's block (model.type = roberta: its position
  # ids from pad_token_id + 1, no pooler, its classification head; electra: embeddings of width 64
  # projected to 128, its head), fp32 with the native attention, then bf16 with cuDNN's attention
  # (model.attention = auto), each against the same run on the CPU; a binary without them: "not in
  # this build", the other checks go on
  for m in $E2E_ENCODERS; do
    e2e_run ${m}_cuda cuda $m
    e2e_run ${m}_bf16_cuda cuda $m "${BF16[@]}" "${NO_ATTN_DROPOUT[$m]:-$ENC_NO_ATTN_DROPOUT}"
    grep -h "attention" "$W/e2e/${m}_bf16_cuda/log.txt" 2>/dev/null | head -3 | tee -a "$W/run.log"
  done
  log "e2e: waiting for the CPU references"
  wait $cpu_refs
  for m in gpt2_small bert_small; do
    e2e_compare "$m cuda vs cpu" ${m}_cpu ${m}_cuda --within 20:1e-4 --within 100:1e-3
  done
  e2e_compare "trimmed cuda vs padded cpu" bert_small_cpu bert_small_trim_cuda --within 20:1e-4 --within 100:1e-3
  e2e_compare "trimmed cuda vs trimmed cpu" bert_small_trim_cpu bert_small_trim_cuda --within 20:1e-4 --within 100:1e-3
  for m in gpt2_small bert_small; do
    e2e_compare "$m bf16 cuda vs cpu" ${m}_bf16_cpu ${m}_bf16_cuda --within 100:2e-2
  done
  for m in gpt2_small bert_small; do
    e2e_compare "$m bf16 activations cuda vs cpu" ${m}_bf16act_cpu ${m}_bf16act_cuda --within 100:2e-2
    e2e_compare "$m bf16 activations vs fp32 activations, cuda" ${m}_bf16_cuda ${m}_bf16act_cuda --within 100:2e-2
  done
  e2e_compare "trimmed bf16 cuda (cuDNN) vs padded bf16 cpu" bert_small_bf16_cpu bert_small_trim_bf16_cuda \
      --within 100:2e-2
  for layout in ragged bias; do
    e2e_compare "packed ($layout) cuda vs unpacked cpu, bf16" bert_small_bf16_cpu bert_small_packed_${layout}_cuda \
        --within 100:2e-2
  done
  e2e_compare "packed steps (rows) cuda vs cpu" bert_small_rows_cpu bert_small_rows_cuda --within 20:1e-4 --within 100:1e-3
  e2e_compare "packed steps (rows) bf16 cuda (cuDNN) vs cpu" bert_small_rows_bf16_cpu bert_small_rows_bf16_cuda \
      --within 100:2e-2
  e2e_compare "packed steps (rows), fixed examples, bf16 cuda (cuDNN) vs cpu" bert_small_rows_bf16_cpu \
      bert_small_rows_fixed_bf16_cuda --within 100:2e-2
  e2e_compare "gpt2 cuda graphs vs eager launches (bitwise)" gpt2_small_cuda gpt2_small_graph_cuda --within 100:0
  e2e_compare "packed steps, fixed examples, bf16: cuda graphs vs eager launches (bitwise)" \
      bert_small_rows_fixed_bf16_cuda bert_small_rows_fixed_graph_bf16_cuda --within 100:0
  for m in $E2E_ENCODERS; do
    e2e_compare "$m cuda vs cpu" ${m}_cpu ${m}_cuda --within 20:1e-4 --within 100:1e-3
    e2e_compare "$m bf16 cuda (cuDNN) vs cpu" ${m}_bf16_cpu ${m}_bf16_cuda --within 100:2e-2
  done
fi

snapshot
# nothing is timed while the CPU references run
[[ -n ${cpu_refs:-} ]] && wait "$cpu_refs" 2>/dev/null
if want bench; then
  for prec in $BENCH_PRECISIONS; do
    for m in gpt2_124m bert_base_doc_cls; do
      in_time 20 "bench $m $prec" || continue
      name="nlptrain_${m}_${prec}"
      extra=()
      [[ $m == gpt2_124m ]] && extra=(--train.batch_size=$GPT2_BATCH)
      mem_watch "$name" timeout $(tmo 240) $NL "inputs/$m.ini" --train.precision=$prec "${extra[@]}" \
          --output.dir="$W/bench/$name" > "$W/$name.log" 2>&1
      log "bench $name: exit $? | $(grep -E '^done:' "$W/bench/$name/log.txt" 2>/dev/null) | peak $(cat "$W/mem/$name" 2>/dev/null) MiB"
      [[ -f "$W/bench/$name/log.txt" ]] || tail -5 "$W/$name.log" | tee -a "$W/run.log"
    done
  done
fi

# Not yet run on a GPU: the new bf16 step of GPT-2 124M (bf16 activations, the persistent bf16
# weights, the fused and padded LM head, the cuBLASLt epilogues) as a ladder of rungs, most complete
# first. A rung is skipped when a switch of it failed its tests (above) or when its switches are those
# of a rung before it; else it is checked: RUNG_STEPS steps under run.sync_check (a fault names its op)
# at GPT2_BATCH, exit 0 and losses within 2e-2 of the verified bf16 run's (bench/gpu/compare.py), the
# peak memory read. The first rung that passes is timed at GPT2_BATCH and NEW_BATCHES (each side at its
# fastest batch that fits: the memory plan refuses what does not fit before allocating) and accounted
# (account section); none passes: nothing of the new step is timed. $W/ladder/ladder.jsonl holds each
# rung's result, $W/ladder/chosen.json the one timed (collect.py puts both into results.json).
NEW_BATCHES=${NEW_BATCHES:-"24 32"}
RUNG=() RUNG_ENV=() RUNG_ARGS=()  # the rung that passed: name, env, nlptrain switches
# rung_record FILE NAME INDEX STATUS WHY PEAK_MIB ENV ARGS: one JSON object (a line) into FILE
rung_record() {
  python3 - "$@" <<'PY'
import json, sys
f, name, index, status, why, peak, env, args = sys.argv[1:9]
rec = {"rung": name, "index": int(index), "check": status, "why": why,
       "peak_mem_mib": float(peak) if peak.strip().replace(".", "", 1).isdigit() else None,
       "env": dict(kv.split("=", 1) for kv in env.split()), "args": args.split()}
with open(f, "a") as out:
    out.write(json.dumps(rec) + "\n")
PY
}
if want bench && in_time 30 "the new bf16 step's ladder"; then
  L=$W/ladder
  mkdir -p "$L"
  epi_all=$( (( ${#EPI_OK[@]} == 4 )) && echo all || { (IFS=,; echo "${EPI_OK[*]}"); } )
  [[ -n $epi_all ]] || epi_all=none
  acts_global=${NLPTRAIN_CUDA_BF16_ACTS:-native}
  bf16w=$( (( BF16W_OK )) && echo true || echo false)
  # name | epilogues | bf16 activations | fused (and padded) head
  rungs=("all|$epi_all|native|on" "bias|bias|native|on" "none|none|native|on" "staged|none|staged|on"
         "no_fused_head|none|staged|off")
  declare -A seen=()
  i=0 cut=
  for r in "${rungs[@]}"; do
    i=$(( i + 1 ))
    IFS='|' read -r rname epi acts head <<< "$r"
    [[ $acts_global == staged ]] && acts=staged
    renv=(NLPTRAIN_CUDA_GEMM_EPILOGUES=$epi)
    [[ $acts == staged ]] && renv+=(NLPTRAIN_CUDA_BF16_ACTS=staged)
    rargs=(--train.precision=bf16 --run.bf16_activations=true --run.bf16_weights=$bf16w)
    if [[ $head == on ]]; then rargs+=(--model.fused_head=on --model.pad_vocab=128)
    else rargs+=(--model.fused_head=off --model.pad_vocab=off); fi
    why=""
    if [[ $head == on ]] && (( ! FUSED_HEAD_OK )); then why="the fused head failed its tests"; fi
    for k in ${epi//,/ }; do
      [[ $k == all || $k == none || " ${EPI_OK[*]} " == *" $k "* ]] || why="the $k epilogue failed its tests"
    done
    key="${renv[*]} ${rargs[*]}"
    [[ -z $why && -n ${seen[$key]:-} ]] && why="the switches of rung ${seen[$key]}"
    if [[ -n $why ]]; then
      log "ladder rung $i $rname: skipped ($why)"
      rung_record "$L/ladder.jsonl" "$rname" $i skipped "$why" "" "${renv[*]}" "${rargs[*]}"
      continue
    fi
    seen[$key]="$i $rname"
    in_time 20 "ladder rung $i $rname" || { cut=$i; break; }
    name=rung${i}_$rname
    mem_watch "$name" env "${renv[@]}" timeout -k 2 $(tmo 45) $NL inputs/gpt2_124m.ini "${rargs[@]}" \
        --train.batch_size=$GPT2_BATCH --train.steps=$RUNG_STEPS --run.sync_check=true --output.dir="$L/$name" \
        > "$W/ladder_$name.log" 2>&1
    rc=$?
    peak=$(cat "$W/mem/$name" 2>/dev/null)
    cmp=$(python3 compare.py losses "$W/bench/nlptrain_gpt2_124m_bf16/metrics.jsonl" "$L/$name/metrics.jsonl" \
        --within $RUNG_STEPS:2e-2 2>&1)
    crc=$?
    if (( rc == 124 || rc == 137 )); then why="timed out"
    elif (( rc > 128 )); then why="crashed (signal $(( rc - 128 )))"
    elif (( rc != 0 )); then
      why="exit $rc: $(grep -h -m1 -E 'nlptrain: error|error:|sync_check' "$W/ladder_$name.log" "$L/$name/log.txt" 2>/dev/null | head -1 | cut -c1-200)"
      [[ $why == "exit $rc: " ]] && why="exit $rc: $(tail -1 "$W/ladder_$name.log" | cut -c1-200)"
    elif (( crc != 0 )); then why="losses: $(echo "$cmp" | head -1)"
    fi
    if [[ -z $why ]]; then
      log "ladder rung $i $rname (${renv[*]} ${rargs[*]}): PASS | $cmp | peak ${peak:-unread} MiB"
      rung_record "$L/ladder.jsonl" "$rname" $i pass "$cmp" "${peak:-}" "${renv[*]}" "${rargs[*]}"
      rung_record "$L/chosen.json" "$rname" $i pass "$cmp" "${peak:-}" "${renv[*]}" "${rargs[*]}"
      RUNG=("$i" "$rname") RUNG_ENV=("${renv[@]}") RUNG_ARGS=("${rargs[@]}")
      break
    fi
    log "ladder rung $i $rname (${renv[*]} ${rargs[*]}): FAIL | $why | peak ${peak:-unread} MiB"
    rung_record "$L/ladder.jsonl" "$rname" $i fail "$why" "${peak:-}" "${renv[*]}" "${rargs[*]}"
  done
  if (( ! ${#RUNG[@]} )) && [[ -n $cut ]]; then
    log "ladder: no rung passed its check before the deadline (rung $cut and after not checked): the new bf16 step is not timed"
  elif (( ! ${#RUNG[@]} )); then
    log "ladder: no rung passed its check: the new bf16 step is not timed (each rung's reason above)"
  else
    log "ladder: rung ${RUNG[0]} ${RUNG[1]} passed: timed at B = $GPT2_BATCH $NEW_BATCHES"
    for nb in $GPT2_BATCH $NEW_BATCHES; do
      in_time 20 "new step (rung ${RUNG[1]}) B=$nb" || break
      name=nlptrain_gpt2_124m_bf16_new_b$nb  # (collect.py: a record of its own, with the rung)
      mem_watch "$name" env "${RUNG_ENV[@]}" timeout -k 2 $(tmo 60) $NL inputs/gpt2_124m.ini "${RUNG_ARGS[@]}" \
          --train.batch_size=$nb --output.dir="$W/bench/$name" > "$W/$name.log" 2>&1
      log "bench $name (rung ${RUNG[1]}): exit $? | $(grep -E '^done:' "$W/bench/$name/log.txt" 2>/dev/null) | peak $(cat "$W/mem/$name" 2>/dev/null) MiB"
      grep -h -m1 -E '^ *paths:' "$W/bench/$name/log.txt" 2>/dev/null | tee -a "$W/run.log"
      grep -h "memory plan" "$W/bench/$name/log.txt" "$W/$name.log" 2>/dev/null | head -1 | tee -a "$W/run.log"
    done
  fi
fi

snapshot
if want torch; then
  for r in $TORCH_RUNS; do
    IFS=: read -r model mode prec <<< "$r"
    need=35
    [[ $mode == compile ]] && need=75  # (50-56 s on the H200)
    in_time $need "torch $r" || continue
    if [[ $model == gpt2 ]]; then args=(--batch $GPT2_BATCH --seq 1024 --data stage/data/gpt2_train.h5)
    else args=(--batch 32 --seq 128 --data stage/data/nsmc_train.h5); fi
    warm=3
    [[ $mode == compile ]] && warm=5
    name="torch_${model}_${mode}_${prec}"
    mem_watch "$name" timeout $(tmo 300) python3 torch_bench.py --model $model --mode $mode --precision $prec \
        "${args[@]}" --steps 20 --warmup $warm > "$W/$name.log" 2>&1
    log "torch $name: exit $? | $(grep -o '"tokens_per_s": [0-9.]*' "$W/$name.log") | peak $(cat "$W/mem/$name" 2>/dev/null) MiB"
    snapshot
  done
fi

snapshot
if want account && in_time 25 "account"; then
  acct=(inputs/gpt2_124m.ini --train.precision=bf16 --train.batch_size=$GPT2_BATCH)
  accounts=(verified="$W/account/verified/summary.json")
  timeout -k 2 $(tmo 60) $NL "${acct[@]}" --train.steps=12 --run.profile=true --output.dir="$W/account/verified" \
      > "$W/account_verified.log" 2>&1
  log "account verified: exit $? | $(grep -E '^done:' "$W/account/verified/log.txt" 2>/dev/null)"
  # the new bf16 step at the rung that passed the ladder (none passed: not accounted)
  if (( ${#RUNG[@]} )) && in_time 15 "account new bf16 step"; then
    env "${RUNG_ENV[@]}" timeout -k 2 $(tmo 60) $NL "${acct[@]}" "${RUNG_ARGS[@]}" --train.steps=12 \
        --run.profile=true --output.dir="$W/account/new" > "$W/account_new.log" 2>&1
    log "account new bf16 step (rung ${RUNG[1]}: ${RUNG_ENV[*]} ${RUNG_ARGS[*]}): exit $? | $(grep -E '^done:' "$W/account/new/log.txt" 2>/dev/null)"
    grep -h -m1 -E '^ *paths:' "$W/account/new/log.txt" 2>/dev/null | tee -a "$W/run.log"
    accounts+=(new="$W/account/new/summary.json")
  elif (( ! ${#RUNG[@]} )); then
    log "account: no rung of the new bf16 step passed its check: the new step is not accounted"
  fi
  # run.bf16_weights alone (the persistent bf16 weight copy; after the new step, whose rungs include it)
  if (( BF16W_OK )) && in_time 25 "account run.bf16_weights"; then
    timeout -k 2 $(tmo 60) $NL "${acct[@]}" --train.steps=4 --run.bf16_weights=true --run.sync_check=true \
        --output.dir="$W/account/bf16_weights_check" > "$W/account_bf16_weights_check.log" 2>&1
    log "account run.bf16_weights under run.sync_check: exit $?"
    python3 compare.py losses "$W/account/verified/metrics.jsonl" "$W/account/bf16_weights_check/metrics.jsonl" \
        --within 4:0 2>&1 | sed 's/^/account run.bf16_weights: /' | tee -a "$W/run.log"
    timeout -k 2 $(tmo 60) $NL "${acct[@]}" --train.steps=12 --run.profile=true --run.bf16_weights=true \
        --output.dir="$W/account/bf16_weights" > "$W/account_bf16_weights.log" 2>&1
    log "account run.bf16_weights: exit $? | $(grep -E '^done:' "$W/account/bf16_weights/log.txt" 2>/dev/null)"
    accounts+=(bf16_weights="$W/account/bf16_weights/summary.json")
  fi
  for r in verified new bf16_weights; do
    [[ -f $W/account/$r/log.txt ]] || continue
    { echo "== account gpt2_124m bf16 ($r)"; sed -n '/profile account (run.profile)/,/predicted step/p' \
        "$W/account/$r/log.txt"; } >> "$OUT/profile.txt" 2>/dev/null
  done
  python3 account.py "${accounts[@]}" 2>&1 | tee -a "$W/run.log" >> "$OUT/profile.txt"
fi

snapshot
if want resume && in_time 60 "resume"; then
  R=$W/resume
  timeout $(tmo 120) $NL inputs/gpt2_small.ini --run.backend=cuda --train.steps=20 --checkpoint.interval=10 \
      --output.dir="$R/straight" > "$W/resume_straight.log" 2>&1
  timeout $(tmo 120) $NL inputs/gpt2_small.ini --run.backend=cuda --train.steps=10 --checkpoint.interval=10 \
      --output.dir="$R/resumed" > "$W/resume_first.log" 2>&1
  timeout $(tmo 120) $NL inputs/gpt2_small.ini --run.backend=cuda --train.steps=20 --checkpoint.interval=10 \
      --train.resume=true --output.dir="$R/resumed" > "$W/resume_second.log" 2>&1
  python3 compare.py resume "$R/straight" "$R/resumed" --step 20 2>&1 | tee "$W/resume_compare.log" | tee -a "$W/run.log"
  # again in bf16 with the fused attention (cuDNN's deterministic backward) and its dropout on
  for part in "straight 20" "resumed16 10" "resumed16 20"; do
    read -r dir steps <<< "$part"
    r=()
    [[ $dir == resumed16 && $steps == 20 ]] && r=(--train.resume=true)
    timeout $(tmo 120) $NL inputs/gpt2_small.ini --run.backend=cuda --train.precision=bf16 --model.attention=auto \
        --train.steps=$steps --checkpoint.interval=10 "${r[@]}" --output.dir="$R/bf16_$dir" \
        > "$W/resume_bf16_${dir}_$steps.log" 2>&1
  done
  python3 compare.py resume "$R/bf16_straight" "$R/bf16_resumed16" --step 20 2>&1 | sed 's/^/bf16 /' \
      | tee "$W/resume_bf16_compare.log" | tee -a "$W/run.log"
fi

snapshot
# Two faults on the GPU, each a few seconds: (1) two ranks sharing the GPU (comm.gpu = staged), rank 0
# killed with SIGKILL after step 5 (debug.kill_at_step): the job must end within 30 s with a message
# naming the dead rank, no rank left waiting; (2) GPT-2 124M at a batch far beyond the GPU's memory:
# the memory plan must refuse it before allocating, naming the sizes and the keys that would fit.
if want faults && in_time 45 "faults"; then
  F=$W/faults
  MPIRUN="$here/stage/bin/run-on-device.sh mpirun -np 2 --oversubscribe --bind-to none"
  t0=$SECONDS
  timeout $(tmo 60) $MPIRUN "$here/stage/bin/nlptrain" inputs/gpt2_small.ini --run.backend=cuda \
      --comm.gpu=staged --train.steps=50 --debug.kill_at_step=5 --checkpoint.interval=0 \
      --output.dir="$F/kill" > "$W/faults_kill.log" 2>&1
  rc=$?
  log "faults kill -9 of rank 0 at step 5 (2 ranks): exit $rc after $((SECONDS - t0)) s (must end within 30 s, non-zero) | $(grep -m1 -iE 'exited on signal|killed|nlptrain: error' "$W/faults_kill.log")"
  t0=$SECONDS
  timeout $(tmo 60) $NL inputs/gpt2_124m.ini --train.precision=bf16 --train.batch_size=4096 \
      --output.dir="$F/too_big" > "$W/faults_too_big.log" 2>&1
  rc=$?
  log "faults batch 4096 x 1024 of GPT-2 124M: exit $rc after $((SECONDS - t0)) s (must be refused before allocating) | $(grep -m1 -o 'the memory plan does not fit: [0-9]* MiB per rank' "$W/faults_too_big.log")"
  [[ -f "$F/too_big/metrics.jsonl" ]] && log "faults too_big: metrics.jsonl written: the plan did not stop it"
fi

snapshot
# comm_run NAME BACKEND ARGS...: 2 ranks of GPT-2 small sharing the GPU (or 2 CPU ranks), COMM_STEPS
# steps -> $C/NAME (log $W/comm_NAME.log); status 2 when this build refuses a key of the ZeRO stages
# (train.zero's value, train.offload, train.zero_prefetch): $C/NAME.not_in_build says which
COMM_STEPS=${COMM_STEPS:-20}
comm_run() {
  local name=$1 be=$2 rc why
  shift 2
  (( $(left) >= 2 )) || { log "SKIPPED (deadline): comm $name"; return 1; }
  timeout $(tmo 150) $MPIRUN "$here/stage/bin/nlptrain" inputs/gpt2_small.ini --run.backend=$be \
      --run.threads=$(( $(nproc) / 2 )) --comm.gpu=staged --comm.bucket_mb=1 --train.steps=$COMM_STEPS "$@" \
      --checkpoint.interval=0 --output.dir="$C/$name" > "$W/comm_$name.log" 2>&1
  rc=$?
  if why=$(not_in_build "$W/comm_$name.log" 'train\.(zero|offload|zero_prefetch)'); then
    mkdir -p "$C"
    echo "$why" > "$C/$name.not_in_build"
    log "comm 2 ranks $be staged $*: not in this build: skipped | $why"
    return 2
  fi
  log "comm 2 ranks $be staged $*: exit $rc | $(grep -E "^step +$COMM_STEPS/" "$C/$name/log.txt" 2>/dev/null | head -1)"
  [[ -f "$C/$name/log.txt" ]] || tail -5 "$W/comm_$name.log" | tee -a "$W/run.log"
  return 0
}
# the ZeRO stages and the optimizer offload beyond zero 0 and 1: each on cuda, then (when this build
# takes it) on 2 CPU ranks; each against its CPU twin (1e-4 relative) and against cuda zero 0 (1e-6,
# as zero 1): a verdict each. NAME ARGS
COMM_STAGES=${COMM_STAGES:-"zero2:--train.zero=2 zero3:--train.zero=3 zero1_offload:--train.zero=1,--train.offload=optimizer zero2_offload:--train.zero=2,--train.offload=optimizer zero3_offload:--train.zero=3,--train.offload=optimizer"}
if want comm && in_time 70 "comm"; then
  C=$W/comm
  MPIRUN="$here/stage/bin/run-on-device.sh mpirun -np 2 --oversubscribe --bind-to none"
  for run in "cuda 0" "cuda 1" "cpu 0"; do
    read -r be z <<< "$run"
    comm_run ${be}_zero$z $be --train.zero=$z
  done
  grep -h "optimizer:" "$C/cuda_zero1/log.txt" 2>/dev/null | tee -a "$W/run.log"
  compare_losses comm "comm cpu vs cuda" "$C/cpu_zero0" "$C/cuda_zero0" "$W/comm_compare.log" --within $COMM_STEPS:1e-4
  compare_losses comm "comm zero 0 vs 1" "$C/cuda_zero0" "$C/cuda_zero1" "$W/comm_compare.log" --within $COMM_STEPS:1e-6
  for st in $COMM_STAGES; do
    name=${st%%:*}
    IFS=, read -r -a sargs <<< "${st#*:}"
    in_time 15 "comm $name" || continue
    comm_run cuda_$name cuda "${sargs[@]}"
    # refused (not in this build): its CPU twin would be too, and its comparisons say so
    [[ -f $C/cuda_$name.not_in_build ]] || comm_run cpu_$name cpu "${sargs[@]}"
    grep -h "optimizer:" "$C/cuda_$name/log.txt" 2>/dev/null | head -1 | tee -a "$W/run.log"
    compare_losses comm "comm $name cpu vs cuda" "$C/cpu_$name" "$C/cuda_$name" "$W/comm_compare.log" \
        --within $COMM_STEPS:1e-4
    compare_losses comm "comm $name vs zero 0, cuda" "$C/cuda_zero0" "$C/cuda_$name" "$W/comm_compare.log" \
        --within $COMM_STEPS:1e-6
  done
fi
snapshot
if want finetune && in_time 150 "finetune"; then
  # data made by prepare.sh (the device has no tokenizer data); finetune_speed.sh reuses it (same key)
  mkdir -p "$W/ftwork/data" && cp -r stage/data/ft/doc_cls "$W/ftwork/data/"
  DEVICE=cuda TASKS=doc_cls STEPS=$FT_STEPS LR=$FT_LR BATCH=32 THREADS=4 SETTINGS="$FT_SETTINGS" \
      HIDDEN=768 LAYERS=12 HEADS=12 INTER=3072 MAXPOS=512 WORK="$W/ftwork" RES="$W/finetune" \
      LAUNCH="$here/stage/bin/run-on-device.sh" NLPTRAIN_BIN="$here/stage/bin/nlptrain" \
      timeout $(tmo $FT_BUDGET) bash ../finetune_speed.sh > "$W/finetune.log" 2>&1
  rc=$?
  # stopped at its budget: the table of the runs that finished
  [[ -f "$W/finetune/results.md" ]] || (cd ../.. && python3 bench/finetune_speed_report.py "$W/finetune") \
      >> "$W/finetune.log" 2>&1
  cp "$W/finetune/results.md" "$OUT/finetune_results.md" 2>/dev/null
  log "finetune: exit $rc | $(grep -l '"rc": 0' "$W"/finetune/raw/*.time 2>/dev/null | wc -l) of $(ls "$W"/finetune/raw/*.time 2>/dev/null | wc -l) runs ok"
  sed -n '/^| setup/,/^$/p' "$W/finetune/results.md" 2>/dev/null | tee -a "$W/run.log"
  # where the fine-tuning comparison's step spends its GPU time: the packed run again from its effective config,
  # 30 steps with run.profile -> profile.txt (first, before the benchmark models' profiles)
  # (FT_PROFILE_INI: another INI in its place, for the CPU-only check of this script, where the
  # finetune runs stop at the device check before they write their config.ini)
  ftp=${FT_PROFILE_INI:-$W/finetune/raw/$PROFILE_FINETUNE/config.ini}
  if [[ -f $ftp ]] && in_time 30 "profile $PROFILE_FINETUNE"; then
    timeout $(tmo 60) $NL "$ftp" --train.steps=30 --run.profile=true --output.dir="$W/profile_finetune" \
        > "$W/profile_finetune.log" 2>&1
    log "profile $PROFILE_FINETUNE: exit $?"
    { echo "== profile $PROFILE_FINETUNE (30 steps)"; sed -n '/profile account (run.profile)/,/predicted step/p' \
        "$W/profile_finetune/log.txt"; } >> "$OUT/profile.txt" 2>/dev/null
  fi
  # (before the A/B below: if the deadline allows only one, this decides what to build next)
  # how much of that step the GPU is busy: every kernel's duration under Nsight Compute (one metric
  # that needs no replay; caches and clocks left alone), cut into steps at the AdamW kernel, against
  # the wall time of the same steps in the finetune run (the same seed: the same batches). busy/wall
  # well under 1: the step waits on the host's launches, which CUDA graphs would remove.
  NCU=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)}
  if [[ -f $ftp && -z $NCU ]]; then
    log "ncu busy: no ncu on this machine"
  elif [[ -f $ftp ]] && in_time 60 "ncu busy"; then
    # (at most 6000 kernels: about 8 BERT-base steps; a step cut short at the end is not counted)
    timeout $(tmo 90) "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum \
        --launch-count 6000 --csv --page details --target-processes all --log-file "$W/ncu_busy.csv" \
        $NL "$ftp" --train.steps=8 --data.eval= --output.dir="$W/ncu_busy" > "$W/ncu_busy.log" 2>&1
    log "ncu busy: exit $?"
    { echo "== ncu busy: $PROFILE_FINETUNE, 8 steps"; python3 ncu_busy.py --csv "$W/ncu_busy.csv" \
        --metrics "$(dirname "$ftp")/metrics.jsonl" --skip 2 2>&1; } | tee -a "$W/run.log" >> "$OUT/profile.txt"
  fi
  # run.cuda_graph A/B (not yet run on a GPU; it runs even when its op test failed): the packed bf16 step as
  # the fine-tuning comparison runs it (data.pack_batch = rows, 5 rows of 128: about 32 NSMC examples) with
  # data.pack_fixed_examples (one shape: every micro-batch after the second replays), eager launches
  # against graphs, GRAPH_AB_STEPS steps each, alternating twice: done lines (real tokens/s) and the
  # losses, which must be bitwise equal
  if [[ -f $ftp ]] && in_time 60 "graph A/B"; then
    for round in 1 2; do
      for g in false true; do
        timeout $(tmo 60) $NL "$ftp" --train.steps=$GRAPH_AB_STEPS --train.epochs=0 --data.eval= --data.packing=true \
            --data.pack_batch=rows --train.batch_size=5 --data.pack_fixed_examples=true --run.cuda_graph=$g \
            --output.dir="$W/graph_ab/${g}_$round" > "$W/graph_ab_${g}_$round.log" 2>&1
        log "graph A/B run.cuda_graph=$g, round $round: exit $? | $(grep -E '^done:' "$W/graph_ab/${g}_$round/log.txt" 2>/dev/null | head -1)"
        grep -h "run.cuda_graph: of this" "$W/graph_ab/${g}_$round/log.txt" 2>/dev/null | tee -a "$W/run.log"
      done
    done
    python3 compare.py losses "$W/graph_ab/false_1/metrics.jsonl" "$W/graph_ab/true_1/metrics.jsonl" \
        --within "$GRAPH_AB_STEPS:0" 2>&1 | sed 's/^/graph A\/B: /' | tee -a "$W/run.log"
    # the steady step (after the first 20: recordings and cuDNN graph builds left out), each run
    python3 compare.py steps eager_1="$W/graph_ab/false_1" graphs_1="$W/graph_ab/true_1" \
        eager_2="$W/graph_ab/false_2" graphs_2="$W/graph_ab/true_2" --skip 20 2>&1 \
        | sed 's/^/graph A\/B: /' | tee -a "$W/run.log"
  fi
fi


snapshot
if want profile; then
  for m in $PROFILE_MODELS; do
    in_time 40 "profile $m" || continue
    name="profile_${m}_${PROFILE_PRECISION}"
    extra=()
    [[ $m == gpt2_124m ]] && extra=(--train.batch_size=$GPT2_BATCH)
    timeout $(tmo 120) $NL "inputs/$m.ini" --train.precision=$PROFILE_PRECISION --train.steps=12 --run.profile=true "${extra[@]}" \
        --output.dir="$W/$name" > "$W/$name.log" 2>&1
    log "profile $name: exit $?"
    { echo "== $name"; sed -n '/profile account (run.profile)/,/predicted step/p' "$W/$name/log.txt"; } >> "$OUT/profile.txt" 2>/dev/null
  done
fi

log "done"
