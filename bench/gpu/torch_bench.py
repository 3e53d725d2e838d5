#!/usr/bin/env python3
"""The PyTorch + transformers peer of nlptrain's GPU training step, on the same GPU and data.

One optimizer step per batch, as nlptrain's trainer does it: forward with labels, backward,
clip_grad_norm_(1.0), AdamW (fused), zero_grad. Models are built from configs (random init):

  gpt2   GPT2LMHeadModel, 124M shape (12 layers, 768 wide, 12 heads, vocab 50257, 1024 positions),
         windows of --seq + 1 tokens cut in order from the nlptrain stream dataset (`tokens`),
         dropout off (as in the nlptrain benchmark INI and llm.c)
  bert   BertForSequenceClassification, BERT-base shape (12 layers, 768, 12 heads, FF 3072), the
         dataset's vocab_size and num_labels, rows of an nlptrain doc_cls file (input_ids,
         attention_mask, token_type_ids, labels), dropout 0.1 (HF defaults)

  --precision fp32   strict fp32 matmuls (torch.backends.cuda.matmul.allow_tf32 = False)
  --precision tf32   TF32 matmuls
  --precision bf16   torch.autocast(bfloat16) around forward and loss, fp32 master weights
  --mode eager | compile   (compile: torch.compile(model), default options)

Attention: attn_implementation = "sdpa" (PyTorch's flash / memory-efficient kernels).
Prints one line per step and a final JSON line: median step time of the timed steps, tokens/s,
sequences/s, peak allocated memory, and the losses of every step.

  python3 bench/gpu/torch_bench.py --model gpt2 --mode compile --precision bf16 --batch 16 \
      --seq 1024 --data stage/data/gpt2_train.h5 --steps 20 --warmup 5
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def gpt2_batches(path: str, B: int, T: int):
    import h5py
    import numpy as np
    with h5py.File(path, "r") as f:
        tokens = np.asarray(f["tokens"][:], dtype=np.int64)
    n = (len(tokens) - 1) // T
    i = 0
    while True:
        rows = []
        for _ in range(B):
            s = (i % n) * T
            rows.append(tokens[s:s + T])
            i += 1
        yield {"input_ids": np.stack(rows)}


def bert_batches(path: str, B: int):
    import h5py
    import numpy as np
    with h5py.File(path, "r") as f:
        cols = {k: np.asarray(f[k][:], dtype=np.int64)
                for k in ("input_ids", "attention_mask", "token_type_ids", "labels")}
        meta = {"vocab_size": int(f.attrs["vocab_size"]), "num_labels": int(f.attrs["num_labels"])}
    n = cols["input_ids"].shape[0]
    i = 0
    def gen():
        nonlocal i
        while True:
            idx = [(i + k) % n for k in range(B)]
            i += B
            yield {k: v[idx] for k, v in cols.items()}
    return meta, gen()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["gpt2", "bert"], required=True)
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="bf16")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--data", required=True, help="nlptrain HDF5 dataset (gpt2: stream; bert: doc_cls rows)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens here)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--device", default="cuda", help="cuda (the benchmark) or cpu (to check this script)")
    ap.add_argument("--small", action="store_true", help="2 layers, 64 wide (to check this script)")
    a = ap.parse_args()

    import numpy as np
    import torch
    import transformers

    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    shape = dict(layers=2, width=64, heads=2) if a.small else dict(layers=12, width=768, heads=12)
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = a.precision == "tf32"

    if a.model == "gpt2":
        cfg = transformers.GPT2Config(n_layer=shape["layers"], n_head=shape["heads"], n_embd=shape["width"], vocab_size=50257, n_positions=1024,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        cfg._attn_implementation = "sdpa"
        model = transformers.GPT2LMHeadModel(cfg)
        batches = gpt2_batches(a.data, a.batch, a.seq)
        num_labels = None
    else:
        meta, batches = bert_batches(a.data, a.batch)
        cfg = transformers.BertConfig(vocab_size=meta["vocab_size"], hidden_size=shape["width"],
                                      num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                                      intermediate_size=4 * shape["width"],
                                      max_position_embeddings=512, num_labels=meta["num_labels"])
        cfg._attn_implementation = "sdpa"
        model = transformers.BertForSequenceClassification(cfg)
        num_labels = meta["num_labels"]
    model.to(dev).train()
    params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.999), eps=1e-8, fused=True)
    fwd = torch.compile(model) if a.mode == "compile" else model
    amp = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=a.precision == "bf16")

    def step(batch):
        inputs = {k: torch.from_numpy(v).to(dev, non_blocking=True) for k, v in batch.items()}
        if a.model == "gpt2":
            inputs["labels"] = inputs["input_ids"]
        with amp:
            out = fwd(**inputs)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss

    times, losses = [], []
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for i in range(a.warmup + a.steps):
        batch = next(batches)
        sync()
        t0 = time.perf_counter()
        loss = step(batch)
        lv = float(loss.item())  # synchronises
        dt = time.perf_counter() - t0
        losses.append(lv)
        if i >= a.warmup:
            times.append(dt)
        if not a.quiet:
            print(f"step {i + 1:4d} loss {lv:.4f} {dt * 1e3:.1f} ms{' (warm-up)' if i < a.warmup else ''}", flush=True)
    med = statistics.median(times)
    T = a.seq
    res = {
        "system": f"torch-{a.mode}", "model": a.model, "precision": a.precision, "batch": a.batch, "seq": T,
        "parameters": params, "step_time_s": med, "step_time_min_s": min(times), "step_time_max_s": max(times),
        "timed_steps": len(times), "tokens_per_s": a.batch * T / med, "seqs_per_s": a.batch / med,
        "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else None,
        "losses": losses, "torch": torch.__version__, "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
    }
    if num_labels is not None:
        res["num_labels"] = num_labels
    print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
