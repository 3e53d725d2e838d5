"""data.packing: the examples of a micro-batch share rows of the file's length,
several to a row, with a segment id per token (attention stays within each example, positions
restart, each example keeps its own [CLS] pooling, labels or answer span). On synthetic rows of
random length well below the file's T (so several examples fit a row):

1. gradients mode, doc_cls / pair_cls / ner / mlm: loss and every gradient of the packed batch equal
   the unpacked batch's (data.padding = longest, itself checked against max_length and transformers)
   within 1e-5 relative, the packed batch has fewer rows than examples, and the outputs per example
   (doc_cls logits; ner logits at each example's positions) equal the unpacked ones; with
   data.padding = max_length the packed rows keep the file's length (one shape for every step);
2. qa: the packed loss and gradients equal the mean of each example run alone at its own length
   (its softmax spans the example's positions: a batch of one without padding);
3. training with hidden and attention dropout on (and mlm's dynamic masking): per-step losses of a
   packed run equal the unpacked run's (the masks are keyed by each token's example and position),
   summary.json reports packing, more than one example per row and less padding computed;
4. data parallel and resume: 1 rank x 8 equals 2 ranks x 4 (each rank packs its own micro-batch), and
   a packed run with dropout resumes bitwise on 2 ranks;
5. errors: a mask that is not ones-then-zeros stops with a message naming the key and the example;
6. on a GPU (skipped without one): the packed batch's gradients on the cuda backend (native
   attention) equal the cpu backend's;
7. on a GPU (skipped without one; ragged also before Hopper): packed rows through cuDNN's fused
   attention, in each of its two layouts, give the unpacked batch's gradients to bf16 rounding.
Items 3-5 pack train.batch_size examples per micro-batch (data.pack_batch = examples), whose steps
equal the unpacked run's step by step. data.pack_batch = rows (the default: train.batch_size counts
rows, each step takes the examples that fill them):
8. each step holds exactly the examples packed_sampler.h's first-fit over the order puts in it
   (computed here from the lengths), and the first step's loss and gradient norm equal the unpacked
   run of those examples, with dropout on;
9. 1 rank x 4 rows equals 2 ranks x 2 rows and 1 rank x 2 rows x accum 2 (the same examples make each
   step); resume is bitwise, and resuming on 1 rank what 2 ranks began keeps the steps;
10. train.epochs counts packed steps; a file too small for one step stops with a clear message;
11. data.pack_fixed_examples (every micro-batch's heads at rows x pack_max_per_row examples, the
    rest ignored: one shape at every step) trains as without it, with dropout, for doc_cls,
    pair_cls, qa and ner: the same examples per step, losses and gradient norms equal to rounding;
    on a GPU (skipped without one), cuda's fixed-examples steps equal the cpu's.
"""
import math
import subprocess

import h5py
import numpy as np
import pytest

import nlp_run as nr
from test_padding import (B, DROPOUT, MODEL, NL, NO_DROPOUT, SHIFT_INVARIANT, T, assert_resume_bitwise,  # noqa: F401
                          compare_gradients, gradients, losses, max_rel, resumed_on_one_rank, spread, summary, task_data,
                          write)

# Rows of 3..12 real tokens in rows of 32: about four examples fit a packed row.
SHORT = dict(lo=3, hi=12)


def packed_layout(out):
    """Each example's first flat position and length, and the packed rows' length."""
    with h5py.File(out / "gradients.h5", "r") as f:
        return np.asarray(f["example_first"]), np.asarray(f["example_length"]), int(f.attrs["batch_len"])


@pytest.mark.parametrize("task", ["doc_cls", "pair_cls", "ner", "mlm"])
def test_packed_gradients_equal_unpacked(task, tmp_path, report):
    lengths, cols, attrs = task_data(task, np.random.default_rng(60 + len(task)), **SHORT)
    data = write(tmp_path / "d.h5", cols, attrs)
    packed = gradients(task, data, tmp_path / "packed", "longest", extra=["--data.packing=true"])
    plain = gradients(task, data, tmp_path / "plain", "longest")
    for k in ("example_first", "example_length"):
        packed.pop(k)
    first, length, row_len = packed_layout(tmp_path / "packed")
    assert np.array_equal(length, lengths)  # each example keeps its own positions
    assert max(lengths) <= row_len <= T
    rows = len(set((first // row_len).tolist()))
    assert rows < B, f"{B} examples of {lengths.tolist()} tokens packed into {rows} rows of {T}"
    want_masked = packed.pop("masked_positions", None)
    plain.pop("masked_positions", None)
    # Logits are per row for ner/mlm (not comparable as tensors); compared per example below.
    out_p = {k: packed.pop(k) for k in ("logits",) if k in packed}
    out_u = {k: plain.pop(k) for k in ("logits",) if k in plain}
    worst, top = compare_gradients(packed, plain, report,
                                   f"{task} packed ({B} examples in {rows} rows) vs unpacked")
    # The same sums of the same terms in another order (rows of other lengths, other GEMM shapes):
    # fp32 rounding, ~1e-7; a leak across examples or a wrong position id is orders larger.
    assert worst[top] <= 1e-5, (top, worst[top])
    if task in ("doc_cls", "pair_cls"):
        assert out_p["logits"].shape == (B, NL)
        assert max_rel(out_p["logits"], out_u["logits"]) <= 1e-5
    elif task == "ner":  # packed [rows, T, NL]: example e at row first // T, offset first % T
        lp = out_p["logits"].reshape(-1, NL)
        Tt = out_u["logits"].shape[1]
        for e in range(B):
            got = lp[first[e]:first[e] + length[e]]
            want = out_u["logits"][e, :length[e]]
            assert max_rel(got, want) <= 1e-5, e
            assert length[e] <= Tt
    else:  # mlm: every masked position kept, one logits row each
        assert len(want_masked) == int((cols["labels"] != -100).sum())


def test_packing_with_max_length_keeps_the_file_row_length(tmp_path, report):
    lengths, cols, attrs = task_data("ner", np.random.default_rng(65), **SHORT)
    data = write(tmp_path / "d.h5", cols, attrs)
    fixed = gradients("ner", data, tmp_path / "fixed", "max_length", extra=["--data.packing=true"])
    plain = gradients("ner", data, tmp_path / "plain", "max_length")
    first, length, row_len = packed_layout(tmp_path / "fixed")
    assert row_len == T  # one shape for every step
    rows = len(set((first // T).tolist()))
    assert fixed["logits"].shape == (rows, T, NL) and rows < B
    for k in ("example_first", "example_length", "logits"):
        fixed.pop(k)
    plain.pop("logits")
    worst, top = compare_gradients(fixed, plain, report, f"ner packed into {rows} rows of {T} vs max_length")
    assert worst[top] <= 1e-5, (top, worst[top])


def test_qa_packed_equals_each_example_alone(tmp_path, report):
    lengths, cols, _ = task_data("qa", np.random.default_rng(71), **SHORT)
    data = write(tmp_path / "d.h5", cols)
    packed = gradients("qa", data, tmp_path / "packed", "longest", extra=["--data.packing=true"])
    for k in ("example_first", "example_length", "start_logits", "end_logits"):
        packed.pop(k)
    # Each example alone: a file of one row cut to its length, batch 1 (the loss is that example's).
    total = None
    for e in range(B):
        one = write(tmp_path / f"e{e}.h5",
                    {k: v[e:e + 1, :lengths[e]] if v.ndim == 2 else v[e:e + 1] for k, v in cols.items()})
        nr.run(MODEL + ["--run.task=qa", "--run.mode=gradients", f"--data.train={one}",
                        "--train.batch_size=1", f"--output.dir={tmp_path / f'o{e}'}", "--train.seed=7"])
        g = nr.read_weights(tmp_path / f"o{e}" / "gradients.h5")
        g = {k: v for k, v in g.items() if k not in ("start_logits", "end_logits")}
        total = g if total is None else {k: total[k] + g[k] for k in g}
    mean = {k: v / B for k, v in total.items()}
    # The last LayerNorm's bias reaches the loss only through the start/end logits, whose softmax
    # gradient sums to zero over each example's positions: zero in exact arithmetic, fp32 noise
    # (~1e-10) in both runs, so bounded absolutely as test_padding's SHIFT_INVARIANT gradients are.
    last_ln = "bert.encoder.layer.1.output.LayerNorm.bias"
    scale = max(float(np.abs(v).max()) for k, v in mean.items() if k != "loss")
    assert max(np.abs(packed.pop(last_ln)).max(), np.abs(mean.pop(last_ln)).max()) <= 1e-6 * scale
    worst, top = compare_gradients(packed, mean, report, "qa packed vs the mean of each example alone")
    assert worst[top] <= 1e-5, (top, worst[top])


# train.batch_size examples per micro-batch, packed into as few rows as they need
EXAMPLES = ["--data.packing=true", "--data.pack_batch=examples"]


def train(task, data, out, extra=(), steps=3):
    nr.run(MODEL + DROPOUT + [f"--run.task={task}", f"--data.train={data}", f"--output.dir={out}",
                              f"--train.batch_size={B}", f"--train.steps={steps}", "--train.seed=7",
                              "--train.lr=1e-3", *extra])


@pytest.mark.parametrize("task", ["doc_cls", "ner", "mlm"])
def test_packed_training_equals_unpacked_with_dropout(task, tmp_path, report):
    # hidden and attention dropout on (and mlm's dynamic masking): the masks are keyed by each token's
    # (example, position) in the padded batch, so packed and unpacked runs draw the same ones
    _, cols, attrs = task_data(task, np.random.default_rng(80 + len(task)), n=4 * B, dynamic_mlm=True,
                               **SHORT)
    data = write(tmp_path / "d.h5", cols, attrs)
    train(task, data, tmp_path / "packed", EXAMPLES)
    train(task, data, tmp_path / "plain")
    train(task, data, tmp_path / "seed", EXAMPLES + ["--train.seed=8"])
    lp, lu, ls = losses(tmp_path / "packed"), losses(tmp_path / "plain"), losses(tmp_path / "seed")
    worst = max(abs(a - b) / abs(b) for a, b in zip(lp, lu))
    sp, su = summary(tmp_path / "packed"), summary(tmp_path / "plain")
    report(f"{task} training with dropout, 3 steps: packed vs unpacked max relative loss difference "
           f"{worst:.1e}; {sp['mean_examples_per_row']:.2f} examples per row, padding computed "
           f"{sp['padding_fraction']:.2f} vs {su['padding_fraction']:.2f}")
    assert len(lp) == len(lu) == 3
    # After updates the parameters carry step 1's rounding difference (AdamW normalises each
    # gradient element, so a 1e-7 difference can move a near-zero element's update): 1e-5 still
    # separates rounding from other dropout masks (another seed) or a wrong packing, which change
    # the loss in the first digits.
    assert worst <= 1e-5, (lp, lu)
    assert max(abs(a - b) / abs(b) for a, b in zip(ls, lp)) > 1e-3  # the masks matter
    assert sp["packing"] is True and su["packing"] is False
    assert sp["mean_examples_per_row"] > 1.5 and su["mean_examples_per_row"] == 1.0
    assert sp["padding_fraction"] < su["padding_fraction"]


PACKED = EXAMPLES + ["--data.padding=longest"]


def test_packed_one_rank_equals_two_ranks(spread, tmp_path, report):
    # dropout on: its masks are keyed by each token's (micro-batch row, position) in the padded layout,
    # and 1 x 8 and 2 x 4 number the rows differently, so dropout would differ by design; off here
    args = MODEL + NO_DROPOUT + PACKED + ["--run.task=doc_cls", f"--data.train={spread}", "--train.steps=5"]
    nr.run(args + ["--train.batch_size=8", f"--output.dir={tmp_path / 'one'}"])
    nr.run(args + ["--train.batch_size=4", f"--output.dir={tmp_path / 'two'}"], ranks=2)
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    worst = max(abs(a - b) / abs(b) for a, b in zip(two, one))
    report(f"packed 1x8 vs 2x4: max relative loss difference {worst:.2e}")
    assert len(one) == len(two) == 5 and worst <= 1e-5, (one, two)
    assert summary(tmp_path / "two")["mean_examples_per_row"] > 1.0


def test_packed_resume_is_bitwise(spread, tmp_path):
    # the resumed run must pack the same rows and draw the same (example, position) dropout masks
    assert_resume_bitwise(PACKED, spread, tmp_path)


def test_packing_errors(tmp_path):
    _, cols, _ = task_data("doc_cls", np.random.default_rng(90), **SHORT)
    cols["attention_mask"][3, 1] = 0  # a hole before the row's last real token
    data = write(tmp_path / "d.h5", cols)
    p = nr.run(MODEL + NO_DROPOUT + ["--run.task=doc_cls", f"--data.train={data}", "--train.steps=1",
                                     f"--train.batch_size={B}", *EXAMPLES, "--data.shuffle=false",
                                     f"--output.dir={tmp_path / 'hole'}"], check=False)
    assert p.returncode != 0
    assert "data.packing: example 3 of the batch has padding at position 1" in p.stdout + p.stderr


@pytest.mark.parametrize("task", ["doc_cls", "ner", "qa"])
def test_cuda_packed_gradients_equal_cpu_unpacked(task, tmp_path, report):
    nr.cuda_device_or_skip("packed rows on the cuda backend are")
    lengths, cols, attrs = task_data(task, np.random.default_rng(95 + len(task)), **SHORT)
    data = write(tmp_path / "d.h5", cols, attrs)
    gpu = gradients(task, data, tmp_path / "gpu", "longest",
                    extra=["--data.packing=true", "--run.backend=cuda", "--train.precision=fp32"])
    cpu = gradients(task, data, tmp_path / "cpu", "longest", extra=["--data.packing=true"])
    for g in (gpu, cpu):
        for k in ("example_first", "example_length", "logits", "start_logits", "end_logits"):
            g.pop(k, None)
    if task == "qa":  # zero in exact arithmetic (test_qa_packed_equals_each_example_alone)
        last_ln = "bert.encoder.layer.1.output.LayerNorm.bias"
        gpu.pop(last_ln), cpu.pop(last_ln)
    worst, top = compare_gradients(gpu, cpu, report, f"{task} packed, cuda (native attention) vs cpu")
    # fp32 on both backends, other summation orders (GEMM tiling, reductions): 1e-4
    assert worst[top] <= 1e-4, (top, worst[top])


@pytest.mark.parametrize("layout", ["ragged", "bias"])
@pytest.mark.parametrize("task", ["doc_cls", "qa"])
def test_cuda_cudnn_packed_gradients_near_unpacked(task, layout, tmp_path, report, monkeypatch):
    """Packed rows through cuDNN's fused attention (bf16), in the layout NLPTRAIN_CUDNN_PACKED forces
    (src/backend/cuda/attention_cudnn.h), against the same backend on the unpacked batch. Head size
    64 (cuDNN's SDPA does not take the 16 of MODEL). Both runs are bf16, with different GEMM and
    attention shapes, so they agree to bf16 rounding, not bitwise; a wrong offset, length or mask
    gives errors of order 1."""
    nr.cuda_device_or_skip(f"cuDNN attention on packed rows ({layout}) is")
    if layout == "ragged":
        smi = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        cap = smi.stdout.split()[0] if smi.returncode == 0 and smi.stdout.split() else "?"
        if not cap.replace(".", "").isdigit() or float(cap) < 9.0:
            pytest.skip(f"cuDNN's ragged (THD) attention needs Hopper or later (compute capability {cap})")
    monkeypatch.setenv("NLPTRAIN_CUDNN_PACKED", layout)
    lengths, cols, attrs = task_data(task, np.random.default_rng(97 + len(task)), **SHORT)
    data = write(tmp_path / "d.h5", cols, attrs)
    wide = {"--model.hidden_size": "128", "--model.intermediate_size": "256"}
    model = [a if a.split("=")[0] not in wide else f"{a.split('=')[0]}={wide[a.split('=')[0]]}"
             for a in MODEL]
    cuda = ["--run.backend=cuda", "--train.precision=bf16", "--model.attention=cudnn"]
    runs = {}
    for name, extra in (("packed", ["--data.packing=true"]), ("unpacked", [])):
        out = tmp_path / name
        p = nr.run(model + NO_DROPOUT + [f"--run.task={task}", "--run.mode=gradients",
                                         "--data.padding=longest", f"--data.train={data}",
                                         f"--train.batch_size={B}", f"--output.dir={out}",
                                         "--train.seed=7", *cuda, *extra])
        assert "does not support" not in p.stderr, p.stderr  # cuDNN ran the shapes
        assert "ragged layout does not build" not in p.stderr, p.stderr
        runs[name] = nr.read_weights(out / "gradients.h5")
    first, _, row_len = packed_layout(tmp_path / "packed")
    assert len(first) > int(first.max()) // row_len + 1, "more examples than rows, or nothing is packed"
    for g in runs.values():
        for k in [k for k in g if k.endswith(SHIFT_INVARIANT)] + [
                "example_first", "example_length", "logits", "start_logits", "end_logits",
                "bert.encoder.layer.1.output.LayerNorm.bias"]:
            g.pop(k, None)  # bf16 noise where the exact gradient is 0 (see the cpu tests above)
    worst, top = compare_gradients(runs["packed"], runs["unpacked"], report,
                                   f"{task} packed ({layout}) vs unpacked, cuda bf16 + cuDNN attention")
    assert worst[top] <= 5e-2, (top, worst[top])


# ---- data.pack_batch = rows ------------------------------------------------------------------------

ROWS = ["--data.packing=true", "--data.pack_batch=rows"]


def planned_steps(lengths, file_len, rows, max_per_row=16):
    """packed_sampler.h's steps of an unshuffled epoch, from its definition: each example in turn to
    the first row with room and fewer than max_per_row examples; a step ends at the first example
    that fits in none. Returns the examples of each complete step, as [first, end) of the file."""
    steps, i, n = [], 0, len(lengths)
    while True:
        fill, count, first = [0] * rows, [0] * rows, i
        while i < n:
            r = next((r for r in range(rows) if fill[r] + lengths[i] <= file_len and count[r] < max_per_row), None)
            if r is None:
                break
            fill[r] += lengths[i]
            count[r] += 1
            i += 1
        if i == n:
            return steps
        steps.append((first, i))


def test_rows_steps_hold_the_planned_examples(tmp_path, report):
    # 300 doc_cls rows of 3..12 tokens in rows of 32, 4 rows a step: about 14 examples a step
    lengths, cols, _ = task_data("doc_cls", np.random.default_rng(100), n=300, **SHORT)
    data = write(tmp_path / "d.h5", cols)
    common = MODEL + DROPOUT + ["--run.task=doc_cls", f"--data.train={data}", "--data.shuffle=false",
                                "--train.seed=7", "--train.lr=1e-3"]
    p = nr.run(common + ROWS + ["--train.batch_size=4", "--train.steps=6", f"--output.dir={tmp_path / 'rows'}"])
    plan = planned_steps([int(x) for x in lengths], T, 4)
    got = [r["examples"] for r in nr.metrics(tmp_path / "rows")[0]]
    want = [e - b for b, e in plan[:6]]
    report(f"rows: examples per step {got}, planned {want}")
    assert got == want
    assert f"the first epoch: {len(plan)} steps" in p.stdout, p.stdout
    s = summary(tmp_path / "rows")
    assert s["packing"] is True and s["mean_examples_per_row"] == pytest.approx(sum(want) / (6 * 4))
    # step 1 (before any update) equals the unpacked run of its examples, dropout masks included
    n1 = want[0]
    nr.run(common + ["--data.padding=longest", f"--train.batch_size={n1}", "--train.steps=1",
                     f"--output.dir={tmp_path / 'plain'}"])
    r_rows, r_plain = nr.metrics(tmp_path / "rows")[0][0], nr.metrics(tmp_path / "plain")[0][0]
    for k in ("loss", "grad_norm"):
        rel = abs(r_rows[k] - r_plain[k]) / abs(r_plain[k])
        report(f"rows step 1 vs the unpacked batch of its {n1} examples: {k} relative difference {rel:.1e}")
        assert rel <= 1e-5, (k, r_rows[k], r_plain[k])
    # another batch of examples (one more) is not that step: the comparison can fail
    nr.run(common + ["--data.padding=longest", f"--train.batch_size={n1 + 1}", "--train.steps=1",
                     f"--output.dir={tmp_path / 'more'}"])
    assert abs(nr.metrics(tmp_path / "more")[0][0]["loss"] - r_rows["loss"]) > 1e-5 * abs(r_rows["loss"])


def test_rows_split_over_ranks_and_micro_batches(spread, tmp_path, report):
    # dropout off: its masks are drawn per rank and micro-batch (as unpacked)
    args = MODEL + NO_DROPOUT + ROWS + ["--run.task=doc_cls", f"--data.train={spread}", "--train.steps=5"]
    nr.run(args + ["--train.batch_size=4", f"--output.dir={tmp_path / 'one'}"])
    nr.run(args + ["--train.batch_size=2", f"--output.dir={tmp_path / 'two'}"], ranks=2)
    nr.run(args + ["--train.batch_size=2", "--train.grad_accum=2", f"--output.dir={tmp_path / 'accum'}"])
    one = nr.metrics(tmp_path / "one")[0]
    for name in ("two", "accum"):
        other = nr.metrics(tmp_path / name)[0]
        assert [r["examples"] for r in other] == [r["examples"] for r in one]
        worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(other, one))
        report(f"rows 1 x 4 vs {name}: max relative loss difference {worst:.2e}")
        assert len(other) == 5 and worst <= 1e-5


def test_rows_resume_is_bitwise(spread, tmp_path):
    assert_resume_bitwise(ROWS, spread, tmp_path)


def test_rows_resume_on_another_world_size(spread, tmp_path, report):
    # 2 ranks x 2 rows x accum 2, checkpoint at step 3, resumed on 1 rank: the plan keeps the 8 rows
    # a step (1 x 2 x accum 4), so steps 4-6 take the examples the uninterrupted run took
    straight, resumed, log = resumed_on_one_rank(ROWS, spread, tmp_path, batch=2, accum=2)
    assert "packed rows per step 8 kept: 1 rank x 2 rows x grad_accum 4" in log, log
    assert "data position: packed step 3" in log, log
    a, b = nr.metrics(straight)[0], nr.metrics(resumed)[0]
    assert [r["examples"] for r in a] == [r["examples"] for r in b]
    worst = max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(a[3:], b[3:]))
    report(f"rows resume 2 ranks -> 1 rank: max relative loss difference, steps 4-6 {worst:.2e}")
    assert len(a) == len(b) == 6 and worst <= 1e-5


def test_resume_with_the_other_pack_batch_warns(spread, tmp_path):
    args = MODEL + NO_DROPOUT + ["--run.task=doc_cls", f"--data.train={spread}", "--train.batch_size=4",
                                 "--checkpoint.interval=2", f"--output.dir={tmp_path / 'run'}"]
    nr.run(args + ROWS + ["--train.steps=2"])
    p = nr.run(args + EXAMPLES + ["--train.steps=4", "--train.resume=true"])
    assert "warning: the checkpoint's data position (micro-batch 2) counts packed steps" in p.stdout, p.stdout
    assert any("counts packed steps" in w for w in summary(tmp_path / "run")["warnings"])
    p = nr.run(args + ROWS + ["--train.steps=6", "--train.resume=true"])  # written by the examples run
    assert "counts micro-batches of train.batch_size examples, this run's packed steps" in p.stdout, p.stdout


def test_rows_epochs_and_too_small_a_file(spread, tmp_path):
    args = MODEL + NO_DROPOUT + ROWS + ["--run.task=doc_cls", f"--data.train={spread}", "--data.shuffle=false"]
    p = nr.run(args + ["--train.batch_size=4", "--train.epochs=0.5", f"--output.dir={tmp_path / 'ep'}"])
    with h5py.File(spread, "r") as f:
        lengths = [int(x) for x in f["attention_mask"][()].sum(axis=1)]
    steps = len(planned_steps(lengths, 64, 4))
    assert f"make {steps} packed steps of 4 rows in the first epoch" in p.stdout, p.stdout
    assert len(nr.metrics(tmp_path / "ep")[0]) == math.ceil(0.5 * steps)
    # 400 examples of 3..60 tokens (about 12,400) do not fill 256 rows of 64 (16,384)
    p = nr.run(args + ["--train.batch_size=256", "--train.steps=1", f"--output.dir={tmp_path / 'big'}"], check=False)
    assert p.returncode != 0
    assert "do not fill one step of 256 packed rows of 64 tokens" in p.stdout + p.stderr


@pytest.mark.parametrize("task", ["doc_cls", "pair_cls", "qa", "ner"])
def test_rows_with_fixed_examples_train_as_without(task, tmp_path, report):
    # 4 rows of 32 a micro-batch, about 14 real examples: the heads run 4 x 16 = 64, the 50 others
    # ignored (their loss and gradient 0, not counted in the mean)
    _, cols, attrs = task_data(task, np.random.default_rng(120 + len(task)), n=200, **SHORT)
    data = write(tmp_path / "d.h5", cols, attrs)
    common = ROWS + ["--train.batch_size=4", "--train.steps=4"]
    train(task, data, tmp_path / "plain", common, steps=4)
    p = nr.run(MODEL + DROPOUT + [f"--run.task={task}", f"--data.train={data}", f"--output.dir={tmp_path / 'fixed'}",
                                  "--train.seed=7", "--train.lr=1e-3", *common, "--data.pack_fixed_examples=true"])
    assert "the heads run 4 x 16 examples per micro-batch (data.pack_fixed_examples)" in p.stdout, p.stdout
    a, b = nr.metrics(tmp_path / "fixed")[0], nr.metrics(tmp_path / "plain")[0]
    assert len(a) == len(b) == 4
    assert [r["examples"] for r in a] == [r["examples"] for r in b]
    first = {k: abs(a[0][k] - b[0][k]) / abs(b[0][k]) for k in ("loss", "grad_norm")}
    worst = max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(a, b))
    report(f"{task} rows, fixed examples vs not: step 1 loss {first['loss']:.1e}, grad norm "
           f"{first['grad_norm']:.1e}; 4 steps max relative loss difference {worst:.1e}")
    # step 1 differs by the heads' GEMM rounding at another row count at most; later steps also
    # carry it through AdamW (as test_packed_training_equals_unpacked_with_dropout)
    assert first["loss"] <= 1e-6 and first["grad_norm"] <= 1e-6, first
    assert worst <= 1e-5, (a, b)


@pytest.mark.parametrize("task", ["doc_cls", "qa"])
def test_cuda_rows_with_fixed_examples_equal_cpu(task, tmp_path, report):
    nr.cuda_device_or_skip("packed steps with data.pack_fixed_examples on the cuda backend are")
    _, cols, attrs = task_data(task, np.random.default_rng(130 + len(task)), n=200, **SHORT)
    data = write(tmp_path / "d.h5", cols, attrs)
    fixed = ROWS + ["--train.batch_size=4", "--data.pack_fixed_examples=true", "--train.precision=fp32"]
    train(task, data, tmp_path / "cpu", fixed, steps=4)
    train(task, data, tmp_path / "gpu", fixed + ["--run.backend=cuda", "--run.sync_check=true"], steps=4)
    a, b = nr.metrics(tmp_path / "gpu")[0], nr.metrics(tmp_path / "cpu")[0]
    assert [r["examples"] for r in a] == [r["examples"] for r in b]
    worst = max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(a, b))
    report(f"{task} rows with fixed examples, 4 steps, cuda vs cpu fp32: max relative loss difference {worst:.1e}")
    # fp32 on both, other summation orders (as test_cuda_packed_gradients_equal_cpu_unpacked)
    assert len(a) == 4 and worst <= 1e-4, (a, b)
