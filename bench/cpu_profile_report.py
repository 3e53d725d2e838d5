#!/usr/bin/env python3
"""Per-op table of bench/cpu_profile.sh: perf's self samples grouped by op, ms per step, and each op's floor.

    python3 bench/cpu_profile_report.py OUT SHAPE...

For each shape, OUT/<shape>.perf.txt (perf report --no-children --sort symbol) gives every symbol's share of
the samples; symbols are grouped into ops by library and name (nlp::cpu::<op> of src/backend/cpu, OpenBLAS's
sgemm kernels and copies, libgomp, libm, libc's memset/memcpy, the kernel). ms per step = share x the median
step time (metrics.jsonl step_time_s, steps 3..N). Start-up (first touch of the arenas, weight
initialisation, data) is left out: bench/cpu_profile.sh passes perf report a time window that starts
after it (from the wall time and the logged step times).

Floors, measured here on this machine at the time of the report:
  GEMM   the step's dense FLOPs (6 x tokens x the matmul weights, the attention products
         counted under attention) at the OpenBLAS sgemm rate measured at the shape's main block GEMM
         [B*T, C] x [C, 4C] and at its LM head, 2 threads;
  others bytes each op must read and write once (listed below per op) at the measured memory bandwidth
         (numpy copies, bytes read + written: the better of one thread and 2 threads).
A floor is what the op would cost if it ran at the machine's limit; the ratio says how far it is.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_archive as ra  # noqa: E402  (OUT's raw files on disk or in OUT/raw.tar.xz)

import numpy as np

SHAPES = {  # L, C, NH, I (MLP width), V, B, T, kind
    "gpt2a": dict(L=4, C=128, NH=4, I=512, V=50257, B=4, T=64, kind="gpt2"),
    "gpt2b": dict(L=12, C=768, NH=12, I=3072, V=50257, B=2, T=256, kind="gpt2"),
    "bert": dict(L=4, C=256, NH=4, I=1024, V=30000, B=32, T=128, kind="bert"),
    "nsmc": dict(L=4, C=256, NH=4, I=1024, V=30000, B=32, T=None, kind="bert"),  # T: measured mean
}

# (op, pattern on the symbol), first match wins
GROUPS = [  # matched against "<dso> <symbol>"
    ("GEMM (OpenBLAS)", r"libopenblas|sgemm|cblas_"),
    ("matmul bias / copies", r"nlp::cpu::matmul"),
    ("attention", r"nlp::cpu::attention"),
    ("layernorm", r"nlp::cpu::layernorm"),
    ("gelu", r"nlp::cpu::gelu|nlp::cpu::tanh"),
    ("dropout", r"nlp::cpu::dropout|dropout_|uniform01"),
    ("cross-entropy", r"nlp::cpu::crossentropy|row_exp_sum"),
    ("AdamW", r"adamw"),
    ("gradient norm / sums", r"nlp::cpu::sum|sumsq|blocked_sum"),
    ("embedding", r"nlp::cpu::embedding"),
    ("residual add / accumulate / scale", r"nlp::cpu::(add|accumulate|scale)\b"),
    ("rows gather / scatter", r"nlp::cpu::rows"),
    ("libm exp / expm1 / tanh (softmax, GELU, cross-entropy)", r"libm\S* \S*(exp|tanh)"),
    ("initialisation (libm cos / log: normal draws)", r"libm\S* \S*(cos|sin|log)"),
    ("OpenMP waits and barriers", r"libgomp|gomp_|GOMP_"),
    ("memset / memcpy", r"memset|memcpy|memmove"),
    ("kernel (scheduling: waiting threads yield)", r"\[kernel"),
    ("HDF5 / data", r"libhdf5|H5"),
]


def parse_perf(path):
    """(share %, dso, symbol) per line of perf report --sort dso,symbol."""
    rows = []
    for line in ra.read_bytes(path).decode("utf-8", errors="replace").splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[[.k]\]\s+(.*?)(\s+-\s+-)?\s*$", line.rstrip())
        if m:
            rows.append((float(m.group(1)), m.group(2), m.group(3).strip()))
    return rows


def group(rows):
    out, unmatched = {}, {}
    for pct, dso, sym in rows:
        key = f"{dso} {sym}"
        name = next((g for g, pat in GROUPS if re.search(pat, key)), None)
        if name is None:
            name = "other"
            unmatched[key] = unmatched.get(key, 0) + pct
        out[name] = out.get(name, 0) + pct
    return out, sorted(unmatched.items(), key=lambda kv: -kv[1])[:6]


def step_stats(path, B):
    m = [json.loads(l) for l in ra.open_text(path) if l.strip()]
    m = [x for x in m if "step_time_s" in x and "split" not in x]
    steps = m[2:] if len(m) > 4 else m
    t = statistics.median(x["step_time_s"] for x in steps)
    positions = statistics.median(x["tokens_per_s"] * x["step_time_s"] for x in steps)
    return t, positions / B


# ---- machine rates ---------------------------------------------------------------------------------

def sgemm_rate(M, K, N, threads=2):
    lib = ctypes.CDLL("/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0")
    f = lib.cblas_sgemm
    f.restype = None
    f.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                       ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
    lib.openblas_set_num_threads(threads)
    a = np.random.rand(M, K).astype(np.float32)
    b = np.random.rand(N, K).astype(np.float32)
    c = np.zeros((M, N), np.float32)
    run = lambda: f(101, 111, 112, M, N, K, 1.0, a.ctypes.data, K, b.ctypes.data, K, 0.0, c.ctypes.data, N)
    for _ in range(2):
        run()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.4:
        run()
        n += 1
    return 2.0 * M * N * K * n / (time.perf_counter() - t0)


def bandwidth(threads=2):
    """Copy bandwidth (bytes read + written per second): the better of one thread copying 256 MiB and
    `threads` threads each copying its share (numpy releases the GIL in copyto)."""
    import threading
    n = (64 << 20) // threads
    pairs = [(np.ones(n, np.float32), np.empty(n, np.float32)) for _ in range(threads)]
    reps = 8

    def copy(a, b):
        for _ in range(reps):
            np.copyto(b, a)
    for a, b in pairs:
        np.copyto(b, a)
    workers = [threading.Thread(target=copy, args=p) for p in pairs]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    many = 2 * reps * sum(a.nbytes for a, _ in pairs) / (time.perf_counter() - t0)
    a, b = np.ones(64 << 20, np.float32), np.empty(64 << 20, np.float32)
    np.copyto(b, a)
    t0 = time.perf_counter()
    for _ in range(4):
        np.copyto(b, a)
    one = 2 * 4 * a.nbytes / (time.perf_counter() - t0)
    return max(one, many)


# ---- what each op must compute or move, per training step ----------------------------------------------

def work(s, T):
    L, C, NH, I, V, B = s["L"], s["C"], s["NH"], s["I"], s["V"], s["B"]
    BT = B * T
    P_block = L * (4 * C * C + 2 * C * I)  # qkv, proj, fc, fcproj
    head = C * V if s["kind"] == "gpt2" else 0  # GPT-2's tied LM head; BERT doc_cls: a [C,2] classifier
    params = L * (4 * C * C + 2 * C * I + 9 * C + I) + V * C + (1024 if s["kind"] == "gpt2" else 512) * C
    f = 4  # bytes per float
    w = {
        "GEMM (OpenBLAS)": ("flops", 6.0 * BT * P_block, 6.0 * BT * head),
        # QK^T and AV, forward (2) and backward (4), 2 FLOPs per multiply-add; causal not halved
        "attention": ("flops", 6.0 * 2 * 2 * B * T * T * C, 0.0),
        # fwd: read x, write y; bwd: read dy, x, write dx (+ dw, db, small); 2L+1 LayerNorms
        "layernorm": ("bytes", (2 * L + 1) * (2 + 3) * BT * C * f),
        # fwd read, write [BT, I]; bwd read x, dy, write dx
        "gelu": ("bytes", L * (2 + 3) * BT * I * f),
        # hidden dropouts (embeddings + 2 per layer) fwd read/write, bwd read/write; attention probs the same
        "dropout": ("bytes", ((2 * L + 1) * BT * C + L * B * NH * T * T) * 4 * f),
        # logits [BT, V]: forward reads them twice (max, sum), backward writes dlogits
        "cross-entropy": ("bytes", 3 * BT * V * f if s["kind"] == "gpt2" else 0),
        # AdamW: read param, grad, m, v; write param, m, v
        "AdamW": ("bytes", 7 * params * f),
        "gradient norm / sums": ("bytes", params * f),
        # zeroing the gradient arena once a step
        "memset / memcpy": ("bytes", params * f),
        # residual adds: fwd 2L reads 2 writes 1 [BT,C], bwd accumulates
        "residual add / accumulate / scale": ("bytes", 2 * L * 3 * 2 * BT * C * f),
    }
    return w, params


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir, shapes = argv[1], argv[2:]
    bw = bandwidth()
    lines = ["# CPU profile of nlptrain's training step (bench/cpu_profile.sh)", "",
             f"Measured on this machine for the floors: memory bandwidth {bw / 1e9:.1f} GB/s (numpy copies, "
             "read + write, the better of 1 and 2 threads); OpenBLAS sgemm rates per shape below (Debian openblas-openmp, 2 threads).", "",
             "ms/step = share of perf's self samples x the median step time; floor = the op's FLOPs at the "
             "measured sgemm rate, or its bytes (read and written once) at the bandwidth; x floor = ms/step / "
             "floor. Ops without a floor model show '-'. `other` lists its largest symbols.", ""]
    for s in shapes:
        perf = os.path.join(out_dir, f"{s}.perf.txt")
        if not ra.is_file(perf):
            continue
        sh = SHAPES[s]
        t, T_eff = step_stats(os.path.join(out_dir, f"{s}.metrics.jsonl"), sh["B"])
        T = sh["T"] or max(1, round(T_eff))
        BT = sh["B"] * T
        r_block = sgemm_rate(BT, sh["C"], sh["I"])
        r_head = sgemm_rate(BT, sh["C"], sh["V"]) if sh["kind"] == "gpt2" else r_block
        w, params = work(sh, T)
        grouped, other = group(parse_perf(perf))
        total = sum(grouped.values())
        model = ra.read_text(os.path.join(out_dir, f"{s}.model.txt")).strip() if ra.is_file(
            os.path.join(out_dir, f"{s}.model.txt")) else ""
        lines += [f"## {s}: B={sh['B']}, T={T}{' (mean trimmed length)' if sh['T'] is None else ''}, "
                  f"median step {1000 * t:.1f} ms", "", f"`{model}`", "",
                  f"sgemm rate: {r_block / 1e9:.0f} GFLOP/s at [{BT}, {sh['C']}] x [{sh['C']}, {sh['I']}]"
                  + (f", {r_head / 1e9:.0f} GFLOP/s at the LM head [{BT}, {sh['C']}] x [{sh['C']}, {sh['V']}]"
                     if sh["kind"] == "gpt2" else ""), "",
                  "| op | share % | ms/step | floor ms | x floor |", "|---|---:|---:|---:|---:|"]
        floor_sum = 0.0
        for name, pct in sorted(grouped.items(), key=lambda kv: -kv[1]):
            ms = pct / total * t * 1000
            floor = None
            if name in w:
                kind, *vals = w[name]
                if kind == "flops":
                    floor = 1000 * (vals[0] / r_block + (vals[1] / r_head if len(vals) > 1 else 0))
                else:
                    floor = 1000 * vals[0] / bw
            if floor:
                floor_sum += floor
            lines.append(f"| {name} | {pct / total * 100:.1f} | {ms:.1f} | "
                         f"{'-' if floor is None else f'{floor:.2f}'} | "
                         f"{'-' if not floor else f'{ms / floor:.1f}'} |")
        lines += ["", f"Sum of the floors: {floor_sum:.1f} ms of the {1000 * t:.1f} ms step "
                  f"({floor_sum / (1000 * t) * 100:.0f}%). Parameters: {params / 1e6:.2f}M.",
                  "`other`: " + ", ".join(f"{sym} {pct:.1f}%" for sym, pct in other), ""]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
