#!/usr/bin/env python3
"""Time per parameter of torch.optim.AdamW(fused=False, foreach=True) on the CPU, on GPT-2's tensors
(the same sizes and weight-decay split as bench/adamw_rates.cpp: weights 0.1, biases and LayerNorm 0).
Run by bench/adamw_rates.sh beside nlptrain's host and backend AdamW.

    python3 bench/adamw_torch.py [--n-layer 12] [--n-embd 768] [--vocab 50257] [--threads 2] [--steps 10]

Prints the median, min and max over the timed steps (after 2 untimed) of optimizer.step()'s wall time
divided by the parameter count, in ns/parameter, in the line format of adamw_rates.
"""
import argparse
import time

import torch


def gpt2_shapes(L, C, V):
    """(numel, weight_decay) of each GPT-2 tensor, in bench/adamw_rates.cpp's order."""
    s = [(V * C, 0.1), (1024 * C, 0.1)]
    for _ in range(L):
        s += [(C, 0.0), (C, 0.0), (3 * C * C, 0.1), (3 * C, 0.0), (C * C, 0.1), (C, 0.0),
              (C, 0.0), (C, 0.0), (4 * C * C, 0.1), (4 * C, 0.0), (4 * C * C, 0.1), (C, 0.0)]
    return s + [(C, 0.0), (C, 0.0)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--n-embd", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    shapes = gpt2_shapes(a.n_layer, a.n_embd, a.vocab)
    params = [torch.nn.Parameter(0.02 * torch.randn(n, generator=g)) for n, _ in shapes]
    for p in params:
        p.grad = 1e-3 * torch.randn(p.numel(), generator=g)
    decay = [p for p, (_, wd) in zip(params, shapes) if wd > 0]
    no_decay = [p for p, (_, wd) in zip(params, shapes) if wd == 0]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.999), eps=1e-8, fused=False, foreach=True)
    N = sum(n for n, _ in shapes)
    print(f"torch {torch.__version__}, parameters {N}, {len(shapes)} tensors, threads {a.threads}, "
          f"timed steps {a.steps}")
    ns = []
    with torch.no_grad():
        for t in range(a.steps + 2):
            t0 = time.perf_counter()
            opt.step()
            if t >= 2:
                ns.append((time.perf_counter() - t0) * 1e9 / N)
    ns.sort()
    print(f"torch    ns/parameter median {ns[len(ns) // 2]:.3f} min {ns[0]:.3f} max {ns[-1]:.3f}")


if __name__ == "__main__":
    main()
