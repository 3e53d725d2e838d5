#!/bin/bash
# 4-layer GPT-2 (n_embd 256, 4 heads, vocab 4096, T 128, batch 8), 1 rank, 1 thread, 6 steps
set -e
python3 -c "
import numpy as np,h5py
with h5py.File('/tmp/rc_bench.h5','w') as f: f.create_dataset('tokens',data=np.random.default_rng(1).integers(0,4096,size=8*128*8+1).astype(np.int32))"
for r in none block; do
  rm -rf /tmp/rc_bench_$r
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMP_NUM_THREADS=1 \
  mpirun -np 1 build/nlptrain --model.n_layer=4 --model.n_head=4 --model.n_embd=256 --model.vocab_size=4096 \
    --model.n_positions=128 --data.seq_len=128 --data.train=/tmp/rc_bench.h5 --train.batch_size=8 \
    --train.steps=6 --run.threads=1 --checkpoint.interval=0 --train.recompute=$r --output.dir=/tmp/rc_bench_$r > /tmp/rc_bench_$r.log 2>&1
  python3 -c "import json; s=json.load(open('/tmp/rc_bench_$r/summary.json')); print('$r', 'step_time_s %.4f'%s['step_time_s'], 'timed_steps', s['timed_steps'], 'activations MiB %.1f'%(s['memory_plan']['activations_bytes']/2**20), 'plan MiB %.1f'%(s['memory_plan']['total_bytes']/2**20), 'peak_rss MiB %.1f'%(s['peak_rss_bytes']/2**20))"
done
