#!/usr/bin/env python3
"""The PyTorch peer of nlptrain's CPU training step: Hugging Face transformers GPT2LMHeadModel (or, with
--model bert, BertForSequenceClassification: nlptrain's doc_cls) on the CPU, one AdamW step per batch
(forward with labels, backward, clip_grad_norm_(1.0), optimizer.step()), dropout off, a fixed number of
torch threads.

  python3 bench/torch_gpt2_step.py --n-layer 4 --n-head 4 --n-embd 128 --batch 4 --seq 64 \
      --steps 10 --warmup 2 --data runs/bench/tokens_T64.h5

Prints one line per step (time) and a final JSON line with the median ms/step of the timed steps.
The batches are read in order from the HDF5 dataset (2-D input_ids) that nlptrain trains on, so
both sides see the same tokens; without --data, random tokens are used.

  python3 bench/torch_gpt2_step.py --write-data PATH --rows N --seq T --vocab V [--seed S]

writes such a dataset (input_ids [N,T] int32, uniform random tokens) and exits.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def write_data(path: str, rows: int, seq: int, vocab: int, seed: int, labels: bool = False) -> None:
    """input_ids [rows, seq] (uniform random tokens); with labels (the BERT doc_cls shape) also
    attention_mask (all ones: every position real) and labels [rows] in {0, 1}."""
    import h5py
    import numpy as np
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        f.create_dataset("input_ids", data=rng.integers(0, vocab, size=(rows, seq), dtype=np.int32))
        if labels:
            f.create_dataset("attention_mask", data=np.ones((rows, seq), dtype=np.int32))
            f.create_dataset("labels", data=rng.integers(0, 2, size=rows, dtype=np.int32))
    print(f"wrote {path}: input_ids [{rows}, {seq}] int32, vocab {vocab}, seed {seed}"
          + (", attention_mask, labels" if labels else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["gpt2", "bert"], default="gpt2",
                    help="gpt2: GPT2LMHeadModel (clm); bert: BertForSequenceClassification, 2 labels (doc_cls); "
                         "--n-layer/--n-head/--n-embd/--vocab/--n-positions give its shape, intermediate 4 x n_embd")
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--n-positions", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10, help="timed steps (after --warmup)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--attn", default="sdpa", help="attn_implementation: sdpa (the default) or eager")
    ap.add_argument("--mode", choices=["eager", "compile", "bf16"], default="eager",
                    help="eager fp32 (default); compile: torch.compile(model) (inductor, its C++/OpenMP CPU "
                         "kernels; compilation happens in the warm-up steps, at least 3); bf16: eager under "
                         "torch.autocast('cpu', bfloat16)")
    ap.add_argument("--data", help="HDF5 with input_ids [N,T] (read in order, wrapping)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write-data", metavar="PATH", help="write a random-token dataset and exit")
    ap.add_argument("--rows", type=int, default=64, help="rows for --write-data")
    ap.add_argument("--quiet", action="store_true", help="only the final JSON line")
    a = ap.parse_args()

    if a.write_data:
        write_data(a.write_data, a.rows, a.seq, a.vocab, a.seed, labels=a.model == "bert")
        return 0

    import numpy as np
    import torch
    import transformers
    from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    if a.model == "bert":
        cfg = BertConfig(num_hidden_layers=a.n_layer, num_attention_heads=a.n_head, hidden_size=a.n_embd,
                         intermediate_size=4 * a.n_embd, vocab_size=a.vocab, max_position_embeddings=a.n_positions,
                         type_vocab_size=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                         num_labels=2, attn_implementation=a.attn)
        model = BertForSequenceClassification(cfg).to(torch.float32)
    else:
        cfg = GPT2Config(n_layer=a.n_layer, n_head=a.n_head, n_embd=a.n_embd, vocab_size=a.vocab,
                         n_positions=a.n_positions, n_ctx=a.n_positions, embd_pdrop=0.0, attn_pdrop=0.0,
                         resid_pdrop=0.0, bos_token_id=0, eos_token_id=0, tie_word_embeddings=True,
                         attn_implementation=a.attn)
        model = GPT2LMHeadModel(cfg).to(torch.float32)
    a.attn = model.config._attn_implementation
    fwd = model
    if a.mode == "compile":
        fwd = torch.compile(model)
        a.warmup = max(a.warmup, 3)  # the first steps compile (forward, backward, recompiles)
    import contextlib
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if a.mode == "bf16" else contextlib.nullcontext
    model.train()  # dropout probabilities are 0: train mode changes nothing but is what a trainer runs
    # HF Trainer parameter groups: no decay on biases and LayerNorm weights
    decay = {n for n, _ in model.named_parameters()
             if not (n.endswith(".bias") or ".ln_" in n or "LayerNorm" in n)}
    params = dict(model.named_parameters())
    opt = torch.optim.AdamW(
        [{"params": [p for n, p in params.items() if n in decay], "weight_decay": a.weight_decay},
         {"params": [p for n, p in params.items() if n not in decay], "weight_decay": 0.0}], lr=a.lr)

    if a.data:
        import h5py
        with h5py.File(a.data, "r") as f:
            data = f["input_ids"][()].astype(np.int64)
            labels = f["labels"][()].astype(np.int64) if "labels" in f else None
        if data.shape[1] != a.seq:
            print(f"--seq {a.seq} but {a.data} has rows of {data.shape[1]}", file=sys.stderr)
            return 2
    else:
        data = np.random.default_rng(a.seed).integers(0, a.vocab, size=(a.batch * 8, a.seq))
        labels = np.random.default_rng(a.seed).integers(0, 2, size=a.batch * 8)
    if a.model == "bert" and labels is None:
        print(f"{a.data}: no labels dataset (write it with --model bert --write-data)", file=sys.stderr)
        return 2
    n = data.shape[0]
    if n < a.batch:
        print(f"{a.data}: {n} rows, fewer than --batch {a.batch}", file=sys.stderr)
        return 2
    nbatches = n // a.batch

    nparams = sum(p.numel() for p in model.parameters())
    if not a.quiet:
        print(f"torch {torch.__version__} | transformers {transformers.__version__} | threads "
              f"{torch.get_num_threads()} | attn {a.attn} | mode {a.mode} | {'BERT doc_cls' if a.model == 'bert' else 'GPT-2'} {a.n_layer} layers, {a.n_head} heads, "
              f"{a.n_embd} embd, vocab {a.vocab} | {nparams / 1e6:.2f}M params | B={a.batch} T={a.seq}",
              flush=True)

    times = []
    for step in range(a.warmup + a.steps):
        k = step % nbatches
        ids = torch.from_numpy(data[k * a.batch:(k + 1) * a.batch])
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast():
            if a.model == "bert":
                y = torch.from_numpy(labels[k * a.batch:(k + 1) * a.batch])
                loss = fwd(input_ids=ids, attention_mask=torch.ones_like(ids), labels=y).loss
            else:
                loss = fwd(input_ids=ids, labels=ids).loss
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        dt = time.perf_counter() - t0
        if step >= a.warmup:
            times.append(dt)
        if not a.quiet:
            print(f"step {step + 1} | loss {loss.item():.4f} | grad norm {norm.item():.4f} | "
                  f"{dt * 1e3:.1f} ms{' (warmup)' if step < a.warmup else ''}", flush=True)
    res = {"impl": "torch", "model": a.model, "torch": torch.__version__, "transformers": transformers.__version__,
           "threads": torch.get_num_threads(), "attn": a.attn, "mode": a.mode, "warmup": a.warmup, "n_layer": a.n_layer, "n_head": a.n_head,
           "n_embd": a.n_embd, "vocab": a.vocab, "batch": a.batch, "seq": a.seq, "params": nparams,
           "timed_steps": len(times),
           "median_ms": statistics.median(times) * 1e3 if times else None,
           "min_ms": min(times) * 1e3 if times else None,
           "max_ms": max(times) * 1e3 if times else None,
           "times_ms": [round(t * 1e3, 3) for t in times]}
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
