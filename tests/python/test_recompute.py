"""train.recompute = block (keep only each transformer block's input, rerun its forward just before its
backward) gives bitwise the same gradients, losses and weights as none, with dropout on; the log reports
the smaller activation memory. The memory plan: a run that would not fit run.memory_limit_gb stops
before allocating, naming the keys that would make it fit; the plan's estimate matches the measured
peak resident memory on the CPU."""
import json
import re
from pathlib import Path

import h5py
import numpy as np
import pytest

import nlp_run as nr

V, T, N = 64, 16, 8
GPT = ["--model.n_layer=3", "--model.n_head=2", "--model.n_embd=32", f"--model.vocab_size={V}",
       f"--model.n_positions={T}", f"--data.seq_len={T}", "--run.threads=1",
       "--model.embd_pdrop=0.2", "--model.attn_pdrop=0.2", "--model.resid_pdrop=0.2"]
BERT = ["--model.type=bert", f"--model.vocab_size={V}", "--model.hidden_size=32",
        "--model.num_hidden_layers=2", "--model.num_attention_heads=2", "--model.intermediate_size=64",
        f"--model.max_position_embeddings={T}", "--model.num_labels=3", "--run.threads=1",
        "--model.hidden_dropout_prob=0.2", "--model.attention_probs_dropout_prob=0.2"]
TRAIN = ["--train.steps=3", "--train.batch_size=2", "--train.lr=1e-3", "--data.shuffle=false",
         "--checkpoint.interval=3"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(3)
    gpt = d / "stream.h5"
    nr.write_stream(gpt, rng.integers(0, V, size=N * T + 1))
    bert = d / "cls.h5"
    mask = np.ones((N, T), np.int32)
    mask[::2, T - 5:] = 0  # padded rows: the attention mask matters
    nr.write_rows(bert, rng.integers(1, V, size=(N, T)), mask=mask, labels=rng.integers(0, 3, size=N))
    return {"gpt2": (GPT + [f"--data.train={gpt}"]), "bert": (BERT + ["--run.task=doc_cls", f"--data.train={bert}"])}


def h5_all(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out


def assert_bitwise(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        assert x.dtype == y.dtype and x.shape == y.shape, k
        assert x.tobytes() == y.tobytes(), f"{k} differs"


def activation_mib(out):
    line = next(l for l in Path(out, "log.txt").read_text().splitlines() if "activations (" in l)
    return float(re.search(r"activations \([^)]*\) ([0-9.]+) MiB", line).group(1))


@pytest.mark.parametrize("model", ["gpt2", "bert"])
def test_gradients_bitwise_and_activation_memory(data, model, tmp_path):
    outs = {}
    for r in ("none", "block"):
        outs[r] = tmp_path / r
        nr.run(data[model] + ["--run.mode=gradients", "--data.padding=max_length", "--train.batch_size=4", f"--train.recompute={r}",
                              f"--output.dir={outs[r]}"], timeout=120)
    assert_bitwise(h5_all(outs["none"] / "gradients.h5"), h5_all(outs["block"] / "gradients.h5"))
    a_none, a_block = activation_mib(outs["none"]), activation_mib(outs["block"])
    assert a_block < 0.8 * a_none, (a_none, a_block)


@pytest.mark.parametrize("model", ["gpt2", "bert"])
def test_training_with_dropout_bitwise(data, model, tmp_path):
    outs = {}
    for r in ("none", "block"):
        outs[r] = tmp_path / r
        nr.run(data[model] + TRAIN + [f"--train.recompute={r}", f"--output.dir={outs[r]}"], timeout=120)
    losses = {r: [m["loss"] for m in nr.metrics(o)[0]] for r, o in outs.items()}
    assert len(losses["none"]) == 3 and losses["none"] == losses["block"], losses
    ck = "checkpoints/step_00000003.h5"
    assert_bitwise(h5_all(outs["none"] / ck), h5_all(outs["block"] / ck))


def test_memory_limit_refused_on_every_rank_before_output(data, tmp_path):
    out = tmp_path / "out"
    p = nr.run(data["gpt2"] + TRAIN + ["--run.memory_limit_gb=0.0005", f"--output.dir={out}"], ranks=2,
               check=False, timeout=60)
    assert p.returncode != 0
    err = p.stderr
    # every rank is over the limit: printed once (comm/agree.h), every rank exits through MPI_Finalize
    assert err.count("nlptrain: error: the memory plan does not fit") == 1 and err.count("nlptrain: error") == 1, err
    assert "MPI_ABORT" not in err, err
    for key in ("train.batch_size", "train.grad_accum", "train.recompute", "train.zero", "run.memory_limit_gb"):
        assert key in err, err
    assert "train.zero = 1 needs" in err and "AdamW state / 2" in err, err  # two ranks: ZeRO-1 halves it
    assert not out.exists()  # the folder the run created is removed


def peak_and_plan(data_args, out, extra, ranks=1):
    nr.run(data_args + ["--train.steps=2", "--data.shuffle=false", "--checkpoint.interval=0",
                        f"--output.dir={out}"] + extra, ranks=ranks, timeout=300)
    s = json.loads(Path(out, "summary.json").read_text())
    return s["peak_rss_bytes"], s["memory_plan"]["total_bytes"]


def test_plan_matches_peak_rss(tmp_path):
    """The plan against getrusage's ru_maxrss (summary.json's peak_rss_bytes) on the CPU. The process
    itself (MPI, OpenBLAS buffers, HDF5, the binary) takes tens of MiB that the plan does not count, so
    a tiny run's peak and plan are subtracted from a ~200 MiB run's: (peak - peak_tiny) must be within
    15% of (plan - plan_tiny), with and without recomputation, and on 2 ranks with and without ZeRO-1
    (rank 0's peak; the optimizer state of train.zero = 1 is half) and with the gradient summed at
    once or in small buckets."""
    rng = np.random.default_rng(5)
    stream = tmp_path / "s.h5"
    nr.write_stream(stream, rng.integers(0, 64, size=8 * 128 * 2 + 1))
    base = [f"--data.train={stream}", "--run.threads=1", "--model.n_positions=128", "--data.seq_len=128"]
    tiny = base + ["--model.n_layer=1", "--model.n_head=1", "--model.n_embd=8", "--model.vocab_size=64",
                   "--train.batch_size=1"]
    big = base + ["--model.n_layer=4", "--model.n_head=4", "--model.n_embd=256", "--model.vocab_size=4096",
                  "--train.batch_size=8"]
    p0, e0 = peak_and_plan(tiny, tmp_path / "tiny", [])
    for r in ("none", "block"):
        p, e = peak_and_plan(big, tmp_path / r, [f"--train.recompute={r}"])
        measured, planned = p - p0, e - e0
        print(f"recompute {r}: peak {p / 2**20:.1f} MiB, plan {e / 2**20:.1f} MiB; tiny run peak "
              f"{p0 / 2**20:.1f}, plan {e0 / 2**20:.1f}; difference measured {measured / 2**20:.1f} vs "
              f"planned {planned / 2**20:.1f} MiB")
        assert abs(measured - planned) <= 0.15 * planned, (r, measured / 2**20, planned / 2**20, p0 / 2**20)
    p0, e0 = peak_and_plan(tiny, tmp_path / "tiny2", [], ranks=2)
    # The ~17 MiB gradient as one blocking collective (MPI's buffers up to the arena), as one bucket
    # (the default 25 MiB), and in 1 MiB buckets during the backward (about one bucket's buffers).
    for name, keys in (("zero0_blocking", ["--train.zero=0", "--comm.overlap=false"]),
                       ("zero0", ["--train.zero=0"]),
                       ("zero1", ["--train.zero=1"]),
                       ("zero1_buckets", ["--train.zero=1", "--comm.bucket_mb=1"])):
        p, e = peak_and_plan(big, tmp_path / name, keys, ranks=2)
        measured, planned = p - p0, e - e0
        print(f"2 ranks, {name}: peak {p / 2**20:.1f} MiB, plan {e / 2**20:.1f} MiB; tiny run peak "
              f"{p0 / 2**20:.1f}, plan {e0 / 2**20:.1f}; difference measured {measured / 2**20:.1f} vs "
              f"planned {planned / 2**20:.1f} MiB")
        assert abs(measured - planned) <= 0.15 * planned, (name, measured / 2**20, planned / 2**20, p0 / 2**20)
