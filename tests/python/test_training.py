"""Integration tests of the training driver: data parallelism (2 ranks = 1 rank with the global batch),
bitwise resume, generation with the KV cache against the full forward, bad input on 2 ranks, and a
short run on Tiny Shakespeare that must learn."""
import json
import shutil
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest

import nlp_run as nr

TINY = ["--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--model.vocab_size=64",
        "--model.n_positions=16", "--data.seq_len=16", "--run.threads=1", "--run.log_interval=1"]
NO_DROPOUT = ["--model.embd_pdrop=0", "--model.attn_pdrop=0", "--model.resid_pdrop=0"]


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    # A learnable stream: a noisy repeating pattern over 64 symbols, 96 windows of 16 + 1.
    return nr.pattern_stream(tmp_path_factory.mktemp("data") / "train.h5", windows=96, seed=7)


def rel(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def train_args(data, out, steps, extra=()):
    return TINY + [f"--data.train={data}", f"--output.dir={out}", f"--train.steps={steps}",
                   "--train.lr=3e-3", "--train.warmup_steps=2", "--train.schedule=linear",
                   "--train.weight_decay=0.1", "--train.clip=1.0"] + list(extra)


def test_two_ranks_equal_one_rank_with_global_batch(stream, tmp_path):
    common = NO_DROPOUT + ["--checkpoint.interval=5"]
    one = tmp_path / "one"
    two = tmp_path / "two"
    accum = tmp_path / "accum"
    nr.run(train_args(stream, one, 5, common + ["--train.batch_size=4"]), ranks=1)
    nr.run(train_args(stream, two, 5, common + ["--train.batch_size=2"]), ranks=2)
    # 1 rank, batch 2, 2 accumulation micro-steps: the same 4 examples per step.
    nr.run(train_args(stream, accum, 5, common + ["--train.batch_size=2", "--train.grad_accum=2"]),
           ranks=1)
    l1 = [r["loss"] for r in nr.metrics(one)[0]]
    l2 = [r["loss"] for r in nr.metrics(two)[0]]
    la = [r["loss"] for r in nr.metrics(accum)[0]]
    assert len(l1) == len(l2) == len(la) == 5
    assert rel(l2, l1) < 1e-6, (l1, l2)
    assert rel(la, l1) < 1e-6, (l1, la)
    w1 = nr.read_weights(one / "checkpoints" / "step_00000005.h5")
    for other in (two, accum):
        w2 = nr.read_weights(other / "checkpoints" / "step_00000005.h5")
        for k in w1:
            if k.startswith("optimizer/"):
                continue
            a, b = w2[k], w1[k]
            if k.endswith("attn.c_attn.bias"):
                # The key bias has an exactly zero gradient (softmax is invariant to q.b_k), so AdamW
                # turns fp32 rounding noise into steps of up to lr: bound it by lr * steps, and
                # compare the query and value parts tightly.
                C = a.shape[0] // 3
                assert np.abs(a[C:2 * C] - b[C:2 * C]).max() <= 3e-3 * 5, k
                a = np.concatenate([a[:C], a[2 * C:]])
                b = np.concatenate([b[:C], b[2 * C:]])
            assert rel(a, b) < 1e-5, (k, rel(a, b))


def test_resume_is_bitwise_identical(stream, tmp_path):
    # Dropout on: the resumed run must regenerate the same dropout masks and data order.
    args = ["--train.batch_size=3", "--checkpoint.interval=4", "--checkpoint.keep=5",
            "--model.embd_pdrop=0.1", "--model.attn_pdrop=0.1", "--model.resid_pdrop=0.1"]
    full = tmp_path / "full"
    nr.run(train_args(stream, full, 8, args), ranks=2)
    # Simulate a job killed after the step-4 checkpoint: keep only what existed then.
    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    (cut / "checkpoints" / "step_00000008.h5").unlink()
    lines = (cut / "metrics.jsonl").read_text().splitlines()
    kept = [l for l in lines if json.loads(l).get("step", 0) <= 4]
    (cut / "metrics.jsonl").write_text("\n".join(kept) + "\n")
    p = nr.run(train_args(stream, cut, 8, args + ["--train.resume=true"]), ranks=2)
    assert "resumed from" in p.stdout
    full_lines = (full / "metrics.jsonl").read_text().splitlines()
    cut_lines = (cut / "metrics.jsonl").read_text().splitlines()
    strip = lambda ls: [(json.loads(l)["step"], json.loads(l)["loss"]) for l in ls
                        if json.loads(l).get("split") is None]
    assert strip(cut_lines) == strip(full_lines)  # exact: 17 significant digits
    wf = nr.read_weights(full / "checkpoints" / "step_00000008.h5")
    wc = nr.read_weights(cut / "checkpoints" / "step_00000008.h5")
    assert wf.keys() == wc.keys()
    for k in wf:
        assert np.array_equal(wf[k], wc[k]), k


def test_generation_kv_cache_matches_full_forward(stream, tmp_path):
    out = tmp_path / "gen"
    nr.run(train_args(stream, out, 20, NO_DROPOUT + ["--train.batch_size=4",
                                                    "--checkpoint.interval=20"]), ranks=1)
    ckpt = out / "checkpoints" / "step_00000020.h5"
    # Greedy decoding (top_k=1) with the byte tokenizer: the text's bytes are the token ids.
    prompt = "\x07\x0e\x15"
    nr.run(TINY + [f"--model.weights={ckpt}", "--run.mode=generate", f"--output.dir={out}",
                   "--generate.tokenizer=byte", f"--generate.prompt={prompt}",
                   "--generate.max_new_tokens=12", "--generate.top_k=1"], ranks=1)
    ids = list((out / "generated.txt").read_bytes())
    assert ids[:3] == [7, 14, 21] and len(ids) == 15
    # The full forward (gradients mode) on the same sequence must predict each generated token.
    row = tmp_path / "row.h5"
    nr.write_rows(row, [ids + [0]])
    nr.run(TINY + [f"--model.weights={ckpt}", "--run.mode=gradients", "--data.padding=max_length", f"--data.train={row}",
                   f"--output.dir={tmp_path / 'g'}", "--train.batch_size=1"], ranks=1)
    with h5py.File(tmp_path / "g" / "gradients.h5") as f:
        logits = f["logits"][0]
    for t in range(2, 14):
        assert int(np.argmax(logits[t])) == ids[t + 1], t


BAD_CASES = ["missing_data", "unknown_key", "wrong_dtype", "token_out_of_range", "wrong_weight_shape",
             "bad_value"]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_fails_cleanly_on_two_ranks(case, stream, tmp_path):
    args = train_args(stream, tmp_path / "out", 3, ["--train.batch_size=2"])
    expect = []
    if case == "missing_data":
        missing = tmp_path / "nope.h5"
        args.append(f"--data.train={missing}")
        expect = [str(missing)]
    elif case == "unknown_key":
        ini = tmp_path / "bad.ini"
        ini.write_text("[train]\nsteps = 3\nlearning_rate = 0.1\n")
        args = [str(ini)] + args
        expect = ["learning_rate", str(ini)]
    elif case == "bad_value":
        args.append("--train.batch_size=zero")
        expect = ["train.batch_size", "zero"]
    elif case == "wrong_dtype":
        p = tmp_path / "i64.h5"
        with h5py.File(p, "w") as f:
            f.create_dataset("input_ids", data=np.zeros((8, 16), dtype=np.int64))
        args.append(f"--data.train={p}")
        expect = [str(p), "input_ids"]
    elif case == "token_out_of_range":
        p = tmp_path / "oob.h5"
        ids = np.zeros((8, 16), dtype=np.int32)
        ids[5, 3] = 64  # vocab_size is 64
        nr.write_rows(p, ids)
        args += [f"--data.train={p}", "--data.shuffle=false"]
        expect = [str(p), "64"]
    elif case == "wrong_weight_shape":
        good = tmp_path / "good"
        nr.run(train_args(stream, good, 1, ["--train.batch_size=2", "--checkpoint.interval=1"]))
        w = tmp_path / "w.h5"
        shutil.copy(good / "checkpoints" / "step_00000001.h5", w)
        with h5py.File(w, "a") as f:
            del f["transformer.ln_f.bias"]
            f.create_dataset("transformer.ln_f.bias", data=np.zeros(31, dtype=np.float32))
        args.append(f"--model.weights={w}")
        expect = [str(w), "transformer.ln_f.bias"]
    try:
        p = nr.run(args, ranks=2, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{case}: nlptrain hung on 2 ranks")
    assert p.returncode != 0, f"{case}: exit code 0\n{p.stdout}"
    for e in expect:
        assert e in p.stderr, f"{case}: '{e}' not in stderr:\n{p.stderr}"
    assert not list((tmp_path / "out").glob("checkpoints/*.h5")), "half-written checkpoint"


def test_tinyshakespeare_loss_falls(tmp_path):
    src = nr.shared_data() / "tinyshakespeare" / "input.txt"
    if not src.exists():
        pytest.skip(f"shared data absent: {src} (NLPTRAIN_SHARED_DATA)")
    data = np.frombuffer(src.read_bytes(), dtype=np.uint8).astype(np.int32)
    split = int(len(data) * 0.9)
    nr.write_stream(tmp_path / "train.h5", data[:split])
    nr.write_stream(tmp_path / "eval.h5", data[split:])
    out = tmp_path / "out"
    nr.run(["--model.n_layer=2", "--model.n_head=4", "--model.n_embd=64", "--model.vocab_size=256",
            "--model.n_positions=64", "--data.seq_len=64", f"--data.train={tmp_path / 'train.h5'}",
            f"--data.eval={tmp_path / 'eval.h5'}", "--eval.batches=16", f"--output.dir={out}",
            "--train.steps=600", "--train.batch_size=16", "--train.lr=3e-3", "--train.warmup_steps=30",
            "--model.embd_pdrop=0", "--model.attn_pdrop=0", "--model.resid_pdrop=0",
            "--run.log_interval=100"], ranks=2, timeout=900)
    train, evals = nr.metrics(out)
    assert train[0]["loss"] > 5.0  # uniform over 256 bytes is ln 256 = 5.55
    # Threshold: the unigram entropy of the text is about 3.3 nats; this run reached 2.10 on held-out
    # text (2026-11-21), a model that has learned character statistics and common words. 2.3 leaves
    # margin for thread-count and BLAS differences between machines.
    assert evals[-1]["loss"] < 2.3, evals
