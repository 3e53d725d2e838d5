#!/usr/bin/env python3
"""The same bits before and after a change that must not change behaviour (a refactor, a file split):
short CPU trainings of GPT-2, BERT, RoBERTa and ELECTRA through every switch the CPU backend has
(precision, bf16 kernels and copies, GEMM libraries, recompute, accumulation and clipping, the fused
head, padding, length grouping, packing, 2 ranks with ZeRO 0-3, prefetch and optimizer offload),
each recorded as every step's loss and gradient norm (metrics.jsonl's 17 digits) and a SHA-256 of every
tensor of the final checkpoint (weights and AdamW moments).

  python3 tools/bitwise_runs.py run BINARY OUTDIR [--cases REGEX]   # -> OUTDIR/record.json
  python3 tools/bitwise_runs.py compare BEFORE.json AFTER.json        # exit 1 unless every case is equal

Build the binary of the commit before the change, record with it, record with the new one, compare.
The encoder cases need the shared corpora (NLPTRAIN_SHARED_DATA, else ../shared/data beside the
checkout); without them only the GPT-2 cases run, and the record says so.
"""
import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

SRC = Path(__file__).resolve().parents[1]
SH = Path(os.environ.get("NLPTRAIN_SHARED_DATA") or SRC.parent / "shared" / "data")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_pml="ob1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")
VOCAB = SH / "vocab" / "kcbert-base" / "vocab.txt"

def clm_stream(path, windows=96, seq=32, vocab=64, seed=1):
    """A learnable stream for a tiny GPT-2: i * 7 % vocab with a tenth of the tokens random."""
    rng = np.random.default_rng(seed)
    base = np.tile(np.arange(vocab) * 7 % vocab, windows * seq // vocab + 2)[: windows * seq + 1]
    toks = np.where(rng.random(base.shape) < 0.1, rng.integers(0, vocab, size=base.shape), base)
    with h5py.File(path, "w") as f:
        f.create_dataset("tokens", data=toks.astype(np.int32))


def data(d):
    """The inputs in d: the GPT-2 stream always, the encoders' files when the shared corpora are here."""
    d.mkdir(parents=True, exist_ok=True)
    if not (d / "clm.h5").exists():
        clm_stream(d / "clm.h5")
    if not VOCAB.exists():
        return False
    def prep(tool, inp, out, *a):
        if not (d / out).exists():
            subprocess.run([sys.executable, str(SRC / "tools" / tool), "--vocab", str(VOCAB), "--quiet",
                            "--input", str(inp), "--out", str(d / out), *map(str, a)], check=True)
    prep("prep_doc_cls.py", SH / "nsmc" / "nsmc_from_raw_test.tsv", "doc.h5", "--limit", 256, "--max-seq-len", 48)
    prep("prep_pair_cls.py", SH / "kornli" / "xnli.dev.ko.tsv", "pair.h5", "--limit", 128, "--max-seq-len", 64)
    prep("prep_ner.py", SH / "klue-ner" / "klue-ner-v1.1_dev.tsv", "ner.h5", "--limit", 96, "--max-seq-len", 64)
    prep("prep_qa.py", SH / "korquad" / "KorQuAD_v1.0_dev.json", "qa.h5", "--limit", 24, "--max-seq-len", 128, "--doc-stride", 32)
    prep("prep_mlm.py", SH / "nsmc" / "nsmc_from_raw_test.tsv", "mlm.h5", "--tsv-column", "document", "--limit", 256, "--max-seq-len", 48)
    return True

GPT = ["--model.vocab_size=64", "--model.n_positions=64", "--model.n_embd=32", "--model.n_layer=2",
       "--model.n_head=2", "--data.train=D/clm.h5", "--data.seq_len=32", "--train.batch_size=4"]
ENC = ["--model.vocab_size=30000", "--model.hidden_size=32", "--model.num_hidden_layers=2",
       "--model.num_attention_heads=2", "--model.intermediate_size=64", "--model.max_position_embeddings=128",
       "--model.num_labels=0", "--train.batch_size=8"]
def enc(t, task, f, *x): return [f"--model.type={t}", f"--run.task={task}", f"--data.train=D/{f}", *ENC, *x]
CASES = {  # name: (ranks, args)
    "gpt2": (1, GPT), "gpt2_bf16": (1, GPT + ["--train.precision=bf16"]),
    "gpt2_bf16_native": (1, GPT + ["--train.precision=bf16", "--run.cpu_bf16=native"]),
    "gpt2_bf16_weights_act": (1, GPT + ["--train.precision=bf16", "--run.bf16_weights=true", "--run.bf16_activations=true"]),
    "gpt2_openblas": (1, GPT + ["--run.cpu_gemm=openblas"]), "gpt2_onednn": (1, GPT + ["--run.cpu_gemm=onednn"]),
    "gpt2_recompute": (1, GPT + ["--train.recompute=block"]), "gpt2_accum": (1, GPT + ["--train.grad_accum=2", "--train.clip=0.5"]),
    "gpt2_fused_off": (1, GPT + ["--model.fused_head=off"]), "gpt2_fused_on_chunk": (1, GPT + ["--model.fused_head=on", "--model.head_chunk=8"]),
    "gpt2_padvocab": (1, GPT + ["--model.pad_vocab=128"]), "gpt2_linear": (1, GPT + ["--train.schedule=linear", "--train.warmup_steps=2"]),
    "gpt2_threads2": (1, GPT + ["--run.threads=2"]),
    "gpt2_r2": (2, GPT), "gpt2_r2_nooverlap": (2, GPT + ["--comm.overlap=false"]),
    "gpt2_r2_z1": (2, GPT + ["--train.zero=1"]), "gpt2_r2_z2": (2, GPT + ["--train.zero=2", "--comm.bucket_mb=0.01"]),
    "gpt2_r2_z3": (2, GPT + ["--train.zero=3"]), "gpt2_r2_z3_pf2": (2, GPT + ["--train.zero=3", "--train.zero_prefetch=2"]),
    "gpt2_r2_z2_off": (2, GPT + ["--train.zero=2", "--train.offload=optimizer"]),
    "gpt2_r2_z1_off_bf16": (2, GPT + ["--train.zero=1", "--train.offload=optimizer", "--train.precision=bf16"]),
    "bert_doc": (1, enc("bert", "doc_cls", "doc.h5")),
    "bert_doc_maxlen": (1, enc("bert", "doc_cls", "doc.h5", "--data.padding=max_length")),
    "bert_doc_group": (1, enc("bert", "doc_cls", "doc.h5", "--data.group_by_length=true", "--data.group_order=shuffled")),
    "bert_doc_pack_rows": (1, enc("bert", "doc_cls", "doc.h5", "--data.packing=true", "--data.pack_batch=rows", "--data.pack_fixed_examples=true")),
    "bert_doc_pack_ex": (1, enc("bert", "doc_cls", "doc.h5", "--data.packing=true", "--data.pack_batch=examples")),
    "bert_doc_bf16": (1, enc("bert", "doc_cls", "doc.h5", "--train.precision=bf16")),
    "bert_doc_recompute": (1, enc("bert", "doc_cls", "doc.h5", "--train.recompute=block")),
    "bert_pair_r2_z2": (2, enc("bert", "pair_cls", "pair.h5", "--train.zero=2")),
    "bert_pair_r2_z3": (2, enc("bert", "pair_cls", "pair.h5", "--train.zero=3")),
    "bert_ner": (1, enc("bert", "ner", "ner.h5")), "bert_qa": (1, enc("bert", "qa", "qa.h5")),
    "bert_mlm": (1, enc("bert", "mlm", "mlm.h5")),
    "roberta_doc": (1, enc("roberta", "doc_cls", "doc.h5", "--model.type_vocab_size=1", "--model.pad_token_id=0")),
    "roberta_mlm": (1, enc("roberta", "mlm", "mlm.h5", "--model.type_vocab_size=1", "--model.pad_token_id=0")),
    "electra_ner": (1, enc("electra", "ner", "ner.h5", "--model.embedding_size=16")),
    "electra_qa_r2": (2, enc("electra", "qa", "qa.h5")),
}
STEPS = 6

def tensor_hashes(p):
    out = {}
    with h5py.File(p) as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = hashlib.sha256(np.ascontiguousarray(obj[()]).tobytes()).hexdigest()[:16]
        f.visititems(visit)
    return out

def run(binary, outdir, cases):
    outdir = Path(outdir)
    d = outdir / "data"
    encoders = data(d)
    rec = {}
    for name, (ranks, args) in CASES.items():
        if not re.search(cases, name):
            continue
        if not encoders and not name.startswith("gpt2"):
            print(f"{name}: skipped (no shared corpora at {SH})")
            continue
        o = outdir / name
        a = [x.replace("D/", f"{d}/") for x in args] + [f"--train.steps={STEPS}", f"--checkpoint.interval={STEPS}",
             "--run.threads=1" if not any(x.startswith("--run.threads") for x in args) else "", f"--output.dir={o}",
             "--output.overwrite=true"]
        a = [x for x in a if x]
        p = subprocess.run(["mpirun", "-np", str(ranks), "--bind-to", "none", binary, *a], env=ENV,
                           capture_output=True, text=True, timeout=600)
        if p.returncode:
            rec[name] = {"rc": p.returncode, "err": (p.stdout + p.stderr)[-600:]}
            print(f"{name}: rc {p.returncode}: {(p.stdout + p.stderr)[-300:]}"); continue
        rows = [json.loads(l) for l in (o / "metrics.jsonl").read_text().splitlines() if l]
        tr = [(r["step"], r["loss"], r.get("grad_norm")) for r in rows if r.get("split") is None]
        cks = sorted((o / "checkpoints").glob("step_*.h5"))
        rec[name] = {"rc": 0, "steps": tr, "weights": tensor_hashes(cks[-1]) if cks else {}}
        print(f"{name}: {len(tr)} steps, last loss {tr[-1][1] if tr else None}, {len(rec[name]['weights'])} tensors")
    (outdir / "record.json").write_text(json.dumps(rec, indent=1))

def compare(a, b):
    A, B = json.loads(Path(a).read_text()), json.loads(Path(b).read_text()); bad = 0
    for k in sorted(set(A) | set(B)):
        x, y = A.get(k), B.get(k)
        if x is None or y is None: print(f"{k}: only in {'B' if x is None else 'A'}"); bad += 1; continue
        if x["rc"] or y["rc"]: print(f"{k}: rc {x['rc']} vs {y['rc']}"); bad += 1; continue
        same = x["steps"] == y["steps"] and x["weights"] == y["weights"]
        print(f"{k}: {'bitwise equal' if same else 'DIFFERENT'} ({len(x['steps'])} steps' loss and grad norm, {len(x['weights'])} checkpoint tensors)")
        bad += not same
    print(f"{len(set(A)|set(B)) - bad} of {len(set(A)|set(B))} cases bitwise equal"); return bad

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="record every case with BINARY in OUTDIR/record.json")
    r.add_argument("binary")
    r.add_argument("outdir")
    r.add_argument("--cases", default="", help="a regular expression: only the cases it matches")
    c = sub.add_parser("compare", help="compare two records; exit 1 unless every case is bitwise equal")
    c.add_argument("before")
    c.add_argument("after")
    a = p.parse_args(argv)
    if a.cmd == "run":
        run(a.binary, a.outdir, a.cases)
        return 0
    return 1 if compare(a.before, a.after) else 0


if __name__ == "__main__":
    sys.exit(main())
