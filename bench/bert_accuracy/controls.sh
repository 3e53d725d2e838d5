#!/usr/bin/env bash
# Controls for doc_cls (run after run.sh): nlptrain fine-tuned (a) from scratch (no MLM encoder) and (b) from
# the HF side's MLM encoder (tools/hf_import.py); HF fine-tuned (c) from nlptrain's MLM encoder
# (tools/hf_export.py); HF (d) from scratch. Same settings as run.sh's doc_cls. Outputs in $RES/control_*.
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=${WORK:-bench/bert_accuracy/work}; RES=${RES:-$(. bench/result_dir.sh && result_dir bert-accuracy)}
BIN=${NLPTRAIN_BIN:-build-acc/nlptrain}; D=$WORK/data; S=$WORK/swap
FT_STEPS=${FT_STEPS:-100}; FT_LR=${FT_LR:-1e-3}; W=$((FT_STEPS / 10))
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMP_NUM_THREADS=1
mkdir -p "$S" "$RES"
[ -f $S/hf_mlm.h5 ] || python3 tools/hf_import.py $WORK/hf/mlm/model $S/hf_mlm.h5
[ -d $S/nl_mlm_hf ] || python3 tools/hf_export.py $WORK/nlptrain/mlm/best.h5 $S/nl_mlm_hf
common=(--data.train=$D/nsmc_train.h5 --data.eval=$D/nsmc_eval.h5 --train.steps=$FT_STEPS --train.batch_size=16
        --train.lr=$FT_LR --train.warmup_steps=$W --train.seed=1234 --eval.interval=0 --checkpoint.interval=0
        --run.threads=1 --run.log_interval=10)
for c in ${CONTROLS:-scratch hfenc nlenc_hf hf_scratch}; do
  case $c in
    scratch) rm -rf $WORK/control_scratch  # a rerun starts afresh (nlptrain refuses a folder of another run)
             mpirun -np 2 "$BIN" inputs/doc_cls_nsmc.ini --model.weights= --model.vocab_size=30000 --model.hidden_size=128 \
               --model.num_hidden_layers=2 --model.num_attention_heads=4 --model.intermediate_size=512 \
               --model.max_position_embeddings=256 "${common[@]}" --output.dir=$WORK/control_scratch > $RES/control_nl_scratch.log 2>&1
             cp $WORK/control_scratch/metrics.jsonl $RES/control_nl_scratch.metrics.jsonl ;;
    hfenc)   rm -rf $WORK/control_hfenc
             mpirun -np 2 "$BIN" inputs/doc_cls_nsmc.ini --model.weights=$S/hf_mlm.h5 "${common[@]}" \
               --output.dir=$WORK/control_hfenc > $RES/control_nl_from_hf_encoder.log 2>&1
             cp $WORK/control_hfenc/metrics.jsonl $RES/control_nl_from_hf_encoder.metrics.jsonl ;;
    nlenc_hf) python3 bench/bert_accuracy/hf_trainer.py --task doc_cls --init $S/nl_mlm_hf --train $D/nsmc_train.h5 \
               --eval $D/nsmc_eval.h5 --out $WORK/control_hf_from_nl --steps $FT_STEPS --batch 32 --lr $FT_LR --warmup $W \
               --seed 1234 --threads 2 --log-steps 10 > $RES/control_hf_from_nl_encoder.log 2>&1
             cp $WORK/control_hf_from_nl/result.json $RES/control_hf_from_nl_encoder.result.json ;;
    hf_scratch) python3 bench/bert_accuracy/hf_trainer.py --task doc_cls --train $D/nsmc_train.h5 \
               --eval $D/nsmc_eval.h5 --out $WORK/control_hf_scratch --steps $FT_STEPS --batch 32 --lr $FT_LR --warmup $W \
               --seed 1234 --threads 2 --log-steps 10 --hidden 128 --layers 2 --heads 4 --intermediate 512 \
               > $RES/control_hf_scratch.log 2>&1
             cp $WORK/control_hf_scratch/result.json $RES/control_hf_scratch.result.json ;;
  esac
done
