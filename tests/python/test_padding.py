"""data.padding: `longest` (the default) runs each micro-batch at its longest row rounded up
to data.pad_multiple, `max_length` at the file's length; data.group_by_length batches examples of
similar length. On synthetic rows of random length well below the file's T (so trimming happens):

1. gradients mode, doc_cls / pair_cls / ner / mlm: loss, every gradient and the outputs at the kept
   positions of longest equal max_length's, and the trimmed outputs are shorter than the file's rows;
2. qa (the one exception: its start/end softmax spans the batch's positions): trimmed = max_length on
   a copy of the file cut to the trimmed length; its logits equal the padded run's at kept positions;
3. training with hidden and attention dropout on (doc_cls, mlm with dynamic masking): the per-step
   losses of longest equal max_length's (dropout and MLM masks are keyed by the file's row layout),
   summary.json's padding figures, and a different dropout seed changes the losses;
4. group_by_length: 1 rank x 8 = 2 ranks x 4, bitwise resume, and a smaller mean batch length;
5. real data (NSMC doc_cls, KLUE NER; skipped when ../shared/data is absent): predictions and eval
   metrics of longest equal max_length's;
6. eval.sort_by_length (evaluation and prediction longest first): the same predictions and metrics
   as the file's order, on 1 and 2 ranks, over the positions its order implies; eval.batches takes
   the same examples either way; on real data for doc_cls, pair_cls, ner and qa.
"""
import json
import math
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

import nlp_run as nr

V, NL, B, T = 100, 5, 8, 32  # vocabulary, labels, batch, the file's row length
PAD, CLS, SEP, MASK = 0, 2, 3, 4
LO, HI = 3, 20  # row lengths: at most 20 real tokens, so a batch trims to at most 24 < 32
MODEL = ["--model.type=bert", f"--model.vocab_size={V}", "--model.hidden_size=32",
         "--model.num_hidden_layers=2", "--model.num_attention_heads=2", "--model.intermediate_size=64",
         "--model.max_position_embeddings=64", f"--model.num_labels={NL}", "--run.threads=1"]
DROPOUT = ["--model.hidden_dropout_prob=0.1", "--model.attention_probs_dropout_prob=0.1"]
NO_DROPOUT = ["--model.hidden_dropout_prob=0", "--model.attention_probs_dropout_prob=0"]


def trimmed_len(lengths, multiple=1, file_len=T):
    """The length data.padding = longest runs a batch with these row lengths at (data.pad_multiple's
    default resolves to 1 on the cpu backend)."""
    return min(file_len, max(multiple, math.ceil(max(lengths) / multiple) * multiple))


def max_rel(a, b):
    """max |a - b| / max(|a|, |b|) over a tensor (0 for two all-zero tensors)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    scale = max(np.abs(a).max(), np.abs(b).max()) if a.size else 0.0
    return 0.0 if scale == 0 else float(np.abs(a - b).max() / scale)


def rows(rng, n, file_len=T, lo=LO, hi=HI, pair=False):
    """n rows [CLS] tokens ... [SEP] of random length in [lo, hi], right-padded with [PAD] to
    file_len. pair: a second segment after a middle [SEP], token type 1. Returns (lengths, columns)."""
    lengths = rng.integers(lo, hi + 1, size=n)
    ids = rng.integers(5, V, size=(n, file_len)).astype(np.int32)
    mask = (np.arange(file_len)[None, :] < lengths[:, None]).astype(np.int32)
    types = np.zeros((n, file_len), dtype=np.int32)
    for i, L in enumerate(lengths):
        ids[i, 0] = CLS
        ids[i, L - 1] = SEP
        if pair and L >= 5:
            ids[i, L // 2] = SEP
            types[i, L // 2 + 1:L] = 1
    ids[mask == 0] = PAD
    return lengths, dict(input_ids=ids, attention_mask=mask, token_type_ids=types)


def task_data(task, rng, n=B, dynamic_mlm=False, **kw):
    """Synthetic data for `task` (the labels a task needs); dynamic_mlm: mlm without labels, with
    the special-id attributes dynamic masking needs."""
    lengths, cols = rows(rng, n, pair=task == "pair_cls", **kw)
    ids, mask = cols["input_ids"], cols["attention_mask"]
    attrs = {}
    if task in ("doc_cls", "pair_cls"):
        cols["labels"] = rng.integers(0, NL, size=n).astype(np.int32)
    elif task == "ner":
        lab = rng.integers(0, NL, size=ids.shape).astype(np.int32)
        lab[(mask == 0) | (ids == CLS) | (ids == SEP) | (rng.random(ids.shape) < 0.2)] = -100
        cols["labels"] = lab
    elif task == "mlm" and dynamic_mlm:
        attrs = dict(mask_id=MASK, cls_id=CLS, sep_id=SEP, pad_id=PAD)
    elif task == "mlm":
        pick = (rng.random(ids.shape) < 0.2) & (mask == 1) & (ids != CLS) & (ids != SEP)
        pick[:, 1] = True  # every row has a target (lengths >= 3: position 1 is an ordinary token)
        cols["labels"] = np.where(pick, ids, -100).astype(np.int32)
        ids[pick] = MASK
    elif task == "qa":  # an answer span inside the real tokens, between [CLS] and [SEP]
        start = np.array([rng.integers(1, L - 1) for L in lengths], dtype=np.int32)
        cols["start_positions"] = start
        cols["end_positions"] = np.array([s + rng.integers(0, L - 1 - s) for s, L in zip(start, lengths)],
                                         dtype=np.int32)
    return lengths, cols, attrs


def write(path, cols, attrs=None):
    with h5py.File(path, "w") as f:
        for k, v in cols.items():
            f.create_dataset(k, data=v)
        for k, v in (attrs or {}).items():
            f.attrs[k] = np.int64(v)
    return path


def summary(out):
    return json.loads((out / "summary.json").read_text())


def losses(out):
    return [r["loss"] for r in nr.metrics(out)[0]]


def gradients(task, data, out, padding, extra=()):
    """run.mode = gradients on the first B rows (no weights file: initialised from train.seed)."""
    nr.run(MODEL + [f"--run.task={task}", "--run.mode=gradients", f"--data.padding={padding}",
                    f"--data.train={data}", f"--train.batch_size={B}", f"--output.dir={out}",
                    "--train.seed=7", *extra])
    return nr.read_weights(out / "gradients.h5")


# Gradients that are zero in exact arithmetic because softmax is shift-invariant (q.b_k adds the same
# amount to every key of a query; the qa output bias adds the same amount to every position): both
# runs hold fp32 rounding noise (~1e-13 here), so they are bounded absolutely, not compared.
SHIFT_INVARIANT = ("attention.self.key.bias", "qa_outputs.bias")


def compare_gradients(got, want, report, what):
    """Loss and every parameter gradient of two gradients.h5 files: {name: max_rel} and the worst."""
    params = [k for k in want if k not in ("loss", "logits", "start_logits", "end_logits",
                                           "masked_positions")]
    assert set(got) == set(want)
    scale = max(float(np.abs(want[k]).max()) for k in params)
    worst = {"loss": abs(float(got["loss"]) - float(want["loss"])) / abs(float(want["loss"]))}
    for k in params:
        if k.endswith(SHIFT_INVARIANT):
            # 1e-6 of the largest gradient: noise passes, a real gradient (a key bias that sees the
            # padding, say) would not
            assert max(np.abs(got[k]).max(), np.abs(want[k]).max()) <= 1e-6 * scale, k
            continue
        worst[k] = max_rel(got[k], want[k])
    top = max(worst, key=worst.get)
    report(f"{what}: {len(params)} gradients, max relative difference {worst[top]:.2e} ({top})")
    return worst, top


@pytest.mark.parametrize("task", ["doc_cls", "pair_cls", "ner", "mlm"])
def test_gradients_longest_equals_max_length(task, tmp_path, report):
    lengths, cols, attrs = task_data(task, np.random.default_rng(20 + len(task)))
    data = write(tmp_path / "d.h5", cols, attrs)
    Tt = trimmed_len(lengths)
    assert Tt < T
    short = gradients(task, data, tmp_path / "longest", "longest")
    full = gradients(task, data, tmp_path / "max_length", "max_length")
    worst, top = compare_gradients(short, full, report, f"{task} longest (T'={Tt}) vs max_length (T={T})")
    for sub, want_len in (("longest", Tt), ("max_length", T)):  # the length each run computed
        with h5py.File(tmp_path / sub / "gradients.h5", "r") as f:
            assert int(f.attrs["batch_len"]) == want_len, sub
    # The cut positions are padding (attention_mask 0, no target): masked out of every key and every
    # loss, so the kept positions compute the same function; only the GEMM/reduction lengths differ
    # (on the CPU backend the results are typically bitwise equal). 1e-6 of a tensor's largest value
    # is ~10 fp32 ulps: a real difference (a key left unmasked, a shifted row) is orders larger.
    assert worst[top] <= 1e-6, (top, worst[top])

    if task in ("doc_cls", "pair_cls"):
        assert short["logits"].shape == full["logits"].shape == (B, NL)
        assert max_rel(short["logits"], full["logits"]) <= 1e-6
        # [B, num_labels] has no position axis: gradients.h5 cannot show the trimmed length, so check
        # that training trims this batch (data.shuffle = false: step 1 takes the same first B rows).
        out = tmp_path / "train1"
        nr.run(MODEL + NO_DROPOUT + [f"--run.task={task}", f"--data.train={data}", f"--output.dir={out}",
                                     f"--train.batch_size={B}", "--train.steps=1", "--data.shuffle=false",
                                     "--train.seed=7"])
        assert summary(out)["mean_batch_len"] == Tt
    elif task == "ner":
        assert short["logits"].shape == (B, Tt, NL) and full["logits"].shape == (B, T, NL)
        assert max_rel(short["logits"], full["logits"][:, :Tt]) <= 1e-6
    else:  # mlm: a logits row per labelled position; trimmed flat indices b*T'+t, padded b*T+t
        want = np.flatnonzero(cols["labels"].reshape(-1) != -100)
        assert np.array_equal(full["masked_positions"], want)
        assert np.array_equal(short["masked_positions"], want // T * Tt + want % T)
        assert max_rel(short["logits"], full["logits"]) <= 1e-6


def test_qa_trimmed_equals_max_length_on_cut_file(tmp_path, report):
    lengths, cols, _ = task_data("qa", np.random.default_rng(31))
    data = write(tmp_path / "d.h5", cols)
    Tt = trimmed_len(lengths)
    assert Tt < T
    cut = write(tmp_path / "cut.h5", {k: v[:, :Tt] if v.ndim == 2 else v for k, v in cols.items()})
    short = gradients("qa", data, tmp_path / "longest", "longest")
    on_cut = gradients("qa", cut, tmp_path / "cut", "max_length")
    padded = gradients("qa", data, tmp_path / "padded", "max_length")
    assert short["start_logits"].shape == short["end_logits"].shape == (B, Tt)
    # Same batch of Tt positions both ways (the cut file's rows are the trimmed rows): 1e-6 as in
    # test_gradients_longest_equals_max_length.
    worst, top = compare_gradients(short, on_cut, report, f"qa longest (T'={Tt}) vs max_length on the cut file")
    for k in ("start_logits", "end_logits"):
        worst[k] = max_rel(short[k], on_cut[k])
        # The encoder is exact under trimming (padding is masked as keys): the logits at the kept
        # positions equal the padded run's.
        worst[k + " vs padded"] = max_rel(short[k], padded[k][:, :Tt])
    top = max(worst, key=worst.get)
    report(f"qa: max relative difference incl. logits {worst[top]:.2e} ({top})")
    assert worst[top] <= 1e-6, (top, worst[top])
    # ... but the padded run's softmax also spans positions Tt..T-1 (as HF at that padding), so its
    # loss differs: the reason the reference is the cut file.
    rel = abs(float(short["loss"]) - float(padded["loss"])) / float(padded["loss"])
    report(f"qa: loss trimmed {float(short['loss']):.6f} vs padded {float(padded['loss']):.6f} ({rel:.1e})")
    assert rel > 1e-4


def train(task, data, out, padding, steps=4, extra=(), ranks=1):
    nr.run(MODEL + [f"--run.task={task}", f"--data.train={data}", f"--output.dir={out}",
                    f"--data.padding={padding}", f"--train.steps={steps}", *extra], ranks=ranks)
    return losses(out)


@pytest.mark.parametrize("task", ["doc_cls", "mlm"])
def test_training_with_dropout_longest_equals_max_length(task, tmp_path, report):
    n, bs, steps = 16, 4, 4
    lengths, cols, attrs = task_data(task, np.random.default_rng(40 + len(task)), n=n, dynamic_mlm=True)
    assert "labels" not in cols or task == "doc_cls"  # mlm: dynamic masking from the attributes
    data = write(tmp_path / "d.h5", cols, attrs)
    # Fixed weights (a 1-step checkpoint), so that train.seed below changes only the dropout masks
    # (and the MLM masks), not the initialisation; shuffle off: step s takes rows [s*bs, (s+1)*bs).
    init = tmp_path / "init"
    train(task, data, init, "max_length", steps=1, extra=["--checkpoint.interval=1", "--train.batch_size=4"])
    common = DROPOUT + [f"--model.weights={init / 'checkpoints' / 'step_00000001.h5'}",
                        f"--train.batch_size={bs}", "--data.shuffle=false", "--train.seed=5"]
    short = train(task, data, tmp_path / "longest", "longest", steps, common)
    full = train(task, data, tmp_path / "max_length", "max_length", steps, common)
    other = train(task, data, tmp_path / "seed6", "longest", steps, common + ["--train.seed=6"])
    assert len(short) == len(full) == steps
    worst = max(abs(a - b) / abs(b) for a, b in zip(short, full))
    moved = max(abs(a - b) / abs(b) for a, b in zip(other, full))
    report(f"{task} training with dropout: longest vs max_length max relative loss difference {worst:.2e}; "
           f"other dropout seed {moved:.2e}")
    # Every dropout mask (embeddings, blocks, attention probabilities, head) and MLM mask is drawn at
    # the (row, position) of the file's layout, so both runs drop the same units and mask the same
    # tokens; what remains is fp32 rounding of reductions of different lengths, amplified by 4 AdamW
    # steps (measured on the CPU backend: 0 for doc_cls, 1.1e-8 for mlm). 1e-6 is far below the
    # effect of the masks themselves: another dropout seed moves the losses by 4e-3 (doc_cls) and
    # 1.6e-2 (mlm) (asserted > 1e-3, so this comparison can fail).
    assert worst <= 1e-6, (short, full)
    assert moved > 1e-3, (other, full)

    # summary.json: batches of rows [s*bs, (s+1)*bs) at their trimmed length
    Ls = [lengths[s * bs:(s + 1) * bs] for s in range(steps)]
    real = sum(int(x.sum()) for x in Ls)
    lens = [trimmed_len(x) for x in Ls]
    s, f = summary(tmp_path / "longest"), summary(tmp_path / "max_length")
    assert (s["padding"], s["pad_multiple"], s["group_by_length"]) == ("longest", 1, False)  # auto on cpu
    assert f["padding"] == "max_length"
    assert s["mean_batch_len"] == pytest.approx(np.mean(lens), rel=1e-9) and s["mean_batch_len"] < T
    assert s["padding_fraction"] == pytest.approx(1 - real / (bs * sum(lens)), rel=1e-6)
    assert s["padding_fraction_untrimmed"] == pytest.approx(1 - real / (bs * T * steps), rel=1e-6)
    assert s["padding_fraction"] < s["padding_fraction_untrimmed"]
    assert f["mean_batch_len"] == T
    assert f["padding_fraction"] == f["padding_fraction_untrimmed"] == s["padding_fraction_untrimmed"]
    assert s["real_tokens_per_s"] > 0 and f["real_tokens_per_s"] > 0


@pytest.fixture(scope="module")
def spread(tmp_path_factory):
    """400 doc_cls rows of T = 64 with lengths 3..60: a wide spread for group_by_length (mega-batches
    of min(50, 400 / (4 x 8)) = 12 global batches of 8)."""
    path = tmp_path_factory.mktemp("spread") / "d.h5"
    _, cols, _ = task_data("doc_cls", np.random.default_rng(50), n=400, file_len=64, lo=3, hi=60)
    return write(path, cols)


GROUPED = ["--data.group_by_length=true", "--data.padding=longest"]


@pytest.mark.parametrize("order", ["longest_first", "shuffled"])
def test_group_by_length_one_rank_equals_two_ranks(spread, tmp_path, report, order):
    # Dropout off: its masks are drawn per rank and micro-batch row, so they differ between 1 x 8 and
    # 2 x 4 by design. The global batches are the same 8 examples either way (rank r takes positions
    # r, r+2, ... of a length-sorted global batch) and each rank trims its own half.
    args = MODEL + NO_DROPOUT + GROUPED + ["--run.task=doc_cls", f"--data.train={spread}", "--train.steps=5",
                                           f"--data.group_order={order}"]
    p = nr.run(args + ["--train.batch_size=8", f"--output.dir={tmp_path / 'one'}"])
    assert f"(data.group_order = {order})" in p.stdout, p.stdout
    one = losses(tmp_path / "one")
    nr.run(args + ["--train.batch_size=4", f"--output.dir={tmp_path / 'two'}"], ranks=2)
    two = losses(tmp_path / "two")
    worst = max(abs(a - b) / abs(b) for a, b in zip(two, one))
    report(f"group_by_length ({order}) 1x8 vs 2x4: max relative loss difference {worst:.2e}")
    # Same examples, same arithmetic except the order in which the two ranks' gradient sums are
    # added (and the trimmed lengths of the halves): fp32 rounding through 5 AdamW steps (~1e-7).
    assert len(one) == len(two) == 5 and worst <= 1e-5, (one, two)
    assert summary(tmp_path / "two")["group_by_length"] is True
    assert summary(tmp_path / "two")["group_order"] == order
    assert summary(tmp_path / "one")["group_order"] == order


def straight_and_resumed(args, tmp_path, resume_ranks):
    """6 steps on 2 ranks straight; 3 steps on 2 ranks then train.resume to 6 on `resume_ranks`.
    Returns the two output folders and the resumed run's log."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    nr.run(args + ["--train.steps=6", f"--output.dir={straight}"], ranks=2)
    nr.run(args + ["--train.steps=3", f"--output.dir={resumed}"], ranks=2)
    p = nr.run(args + ["--train.steps=6", "--train.resume=true", f"--output.dir={resumed}"], ranks=resume_ranks)
    return straight, resumed, p.stdout


def assert_resume_bitwise(flags, data, tmp_path):
    """doc_cls on `data` with dropout on and `flags`: 6 steps on 2 ranks straight equal 3 steps, a
    checkpoint, and a resume to 6 on 2 ranks, exactly. Constant lr: a 3-step run and the first 3
    steps of a 6-step run get the same learning rates."""
    args = MODEL + DROPOUT + flags + ["--run.task=doc_cls", f"--data.train={data}", "--train.batch_size=4",
                                      "--train.schedule=constant", "--train.warmup_steps=0",
                                      "--checkpoint.interval=3"]
    straight, resumed, log = straight_and_resumed(args, tmp_path, resume_ranks=2)
    assert "resumed from" in log
    steps = lambda out: [(r["step"], r["loss"]) for r in nr.metrics(out)[0]]
    assert steps(resumed) == steps(straight)  # exact: metrics.jsonl has 17 significant digits
    assert [s for s, _ in steps(straight)] == list(range(1, 7))


def test_group_by_length_resume_is_bitwise(spread, tmp_path):
    # the resumed run must regenerate the grouped order, the trimming and the dropout masks
    assert_resume_bitwise(GROUPED, spread, tmp_path)


def resumed_on_one_rank(flags, data, tmp_path, batch, accum):
    """doc_cls on `data` with `flags`, dropout off (its masks are per rank): 2 ranks x batch x accum for
    6 steps straight, and 3 steps, a checkpoint, then a resume to 6 on 1 rank. The batch shape is in
    the INI, as a job would have it, so that the resume plan may adjust it."""
    ini = tmp_path / "run.ini"
    ini.write_text(f"[train]\nbatch_size = {batch}\ngrad_accum = {accum}\n")
    args = [ini] + MODEL + NO_DROPOUT + flags + ["--run.task=doc_cls", f"--data.train={data}",
                                                 "--train.schedule=constant", "--train.warmup_steps=0",
                                                 "--checkpoint.interval=3"]
    return straight_and_resumed(args, tmp_path, resume_ranks=1)


def test_group_by_length_resume_on_another_world_size(spread, tmp_path, report):
    # 2 ranks x batch 4 x accum 2, checkpoint at step 3, then resumed on 1 rank: the resume plan keeps
    # the global batch (1 x 4 x accum 4) and the length groups are whole optimizer steps, so steps 4-6
    # train on the same examples as the uninterrupted 2-rank run.
    straight, resumed, log = resumed_on_one_rank(GROUPED, spread, tmp_path, batch=4, accum=2)
    assert "global batch 16 kept: 1 rank x batch 4 x grad_accum 4" in log, log
    a, b = losses(straight), losses(resumed)
    worst = max(abs(x - y) / abs(y) for x, y in zip(a[3:], b[3:]))
    report(f"group_by_length resume 2 ranks -> 1 rank: max relative loss difference, steps 4-6 {worst:.2e}")
    # The same examples per step; only the summation order of the micro-batches and ranks differs.
    # Measured: 4.6e-9; with groups of world x B examples instead (the order then depends on the world
    # size) steps 4-6 train on other examples and differ by 4.2e-3.
    assert len(a) == len(b) == 6 and worst <= 1e-5, (a, b)


def test_group_by_length_shortens_batches(spread, tmp_path, report):
    args = MODEL + NO_DROPOUT + ["--run.task=doc_cls", f"--data.train={spread}", "--train.batch_size=8",
                                 "--train.steps=10", "--data.padding=longest"]
    nr.run(args + ["--data.group_by_length=true", f"--output.dir={tmp_path / 'grouped'}"])
    nr.run(args + ["--data.group_by_length=false", f"--output.dir={tmp_path / 'plain'}"])
    g, p = summary(tmp_path / "grouped"), summary(tmp_path / "plain")
    report(f"group_by_length: mean_batch_len {g['mean_batch_len']:.1f} (padding {g['padding_fraction']:.2f}) "
           f"vs {p['mean_batch_len']:.1f} (padding {p['padding_fraction']:.2f}) without, T = 64")
    assert g["group_by_length"] is True and p["group_by_length"] is False
    # Without grouping a batch of 8 lengths uniform in 3..60 nearly always holds one above 48 (its
    # batch runs at 56 or 64); grouped batches of similar lengths run at about the mean length + 4.
    assert g["mean_batch_len"] < 0.8 * p["mean_batch_len"], (g["mean_batch_len"], p["mean_batch_len"])
    assert g["padding_fraction"] < p["padding_fraction"]


DATA = nr.shared_data()
VOCAB = DATA / "vocab" / "kcbert-base" / "vocab.txt"
REAL = [("doc_cls", "prep_doc_cls.py", DATA / "nsmc" / "nsmc_from_raw_test.tsv", 200),
        ("ner", "prep_ner.py", DATA / "klue-ner" / "klue-ner-v1.1_dev.tsv", 100)]


def same_predictions(a, b, tol=1e-5):
    """Predictions are equal: labels, entities, spans, ids and texts exactly; the probabilities and
    scores (softmaxes of logits that round differently over B*T' rows than over B*T, ~1e-7 relative)
    within tol. Returns True, or raises naming the first difference."""
    def walk(x, y, where):
        if isinstance(x, float) or isinstance(y, float):
            assert abs(x - y) <= tol, f"{where}: {x} vs {y}"
        elif isinstance(x, dict):
            assert isinstance(y, dict) and x.keys() == y.keys(), f"{where}: keys {list(x)} vs {list(y)}"
            for k in x:
                walk(x[k], y[k], f"{where}.{k}")
        elif isinstance(x, list):
            assert isinstance(y, list) and len(x) == len(y), f"{where}: lengths differ"
            for i, (u, v) in enumerate(zip(x, y)):
                walk(u, v, f"{where}[{i}]")
        else:
            assert x == y, f"{where}: {x!r} vs {y!r}"
    walk(a, b, "predictions")
    return True


def real_data_model(task, tool, source, prep_args, tmp_path):
    """A slice of a shared corpus prepared by tools/<tool> at T = 128 (skipped when absent), and the
    arguments of a tiny BERT for `task` on it with the weights of 3 training steps: initializer_range
    0.1 (not 0.02) and a small lr, so that the predictions vary from row to row (at 0.02 this narrow
    model gives every NSMC row the same class) and comparing them means something. Returns (the
    file, the arguments)."""
    for need in (source, VOCAB):
        if not need.exists():
            pytest.skip(f"shared data absent: {need} (NLPTRAIN_SHARED_DATA)")
    data = tmp_path / "d.h5"
    subprocess.run([sys.executable, str(nr.SOURCE_DIR / "tools" / tool), "--vocab", str(VOCAB), "--quiet",
                    "--input", str(source), "--max-seq-len", "128", "--out", str(data), *prep_args], check=True)
    args = ["--model.type=bert", "--model.vocab_size=30000", "--model.hidden_size=32",
            "--model.num_hidden_layers=2", "--model.num_attention_heads=2", "--model.intermediate_size=64",
            "--model.max_position_embeddings=128", "--model.num_labels=0", "--run.threads=1",
            "--model.initializer_range=0.1", f"--run.task={task}", f"--data.train={data}",
            f"--data.eval={data}", "--train.batch_size=8"]
    nr.run(args + ["--train.steps=3", "--checkpoint.interval=3", "--train.lr=1e-3",
                   f"--output.dir={tmp_path / 'train'}"])
    return data, args + [f"--model.weights={tmp_path / 'train' / 'checkpoints' / 'step_00000003.h5'}"]


@pytest.mark.parametrize("task,tool,source,limit", REAL, ids=[r[0] for r in REAL])
def test_real_data_predict_longest_equals_max_length(task, tool, source, limit, tmp_path, report):
    data, args = real_data_model(task, tool, source, ["--limit", str(limit)], tmp_path)
    with h5py.File(data) as f:
        lengths = f["attention_mask"][()].sum(axis=1)
    assert lengths.max() < 128  # the rows are shorter than the file's: there is padding to trim
    runs = {}
    for padding in ("longest", "max_length"):
        out = tmp_path / padding
        nr.run(args + ["--run.mode=predict", f"--data.padding={padding}", f"--output.dir={out}"])
        runs[padding] = ((out / "predictions.jsonl").read_text(), nr.metrics(out)[1][-1])
    (p_short, ev_short), (p_full, ev_full) = runs["longest"], runs["max_length"]
    report(f"{task} predict on {len(lengths)} rows (mean length {lengths.mean():.1f} of 128): "
           f"longest {ev_short} | max_length {ev_full}")
    pred = [json.loads(line) for line in p_short.splitlines()]
    assert p_short and same_predictions(pred, [json.loads(line) for line in p_full.splitlines()])
    assert len(pred) == len(lengths)
    if task == "doc_cls":  # measured 150 / 50
        assert min(sum(r["label"] == k for r in pred) for k in (0, 1)) >= 20, "predictions all one class"
    else:  # measured 1217 entities
        assert sum(len(r["entities"]) for r in pred) >= 100, "hardly any entities predicted"
    # Predictions are argmaxes and the metrics (accuracy; precision/recall/f1) and counts derive from
    # them: exactly equal. The loss (17 significant digits) is the same sum of per-token losses, but
    # the GEMMs over B*T' rows instead of B*T round differently (~1e-7 relative in the logits, see
    # test_gradients_longest_equals_max_length): measured 3.5e-9 relative for doc_cls, 1.1e-9 for ner.
    loss_short, loss_full = ev_short.pop("loss"), ev_full.pop("loss")
    # padding_fraction is of the positions each computed: smaller when trimmed (and longest first)
    assert ev_short.pop("padding_fraction") < ev_full.pop("padding_fraction")
    assert ev_short == ev_full
    assert abs(loss_short - loss_full) <= 1e-6 * abs(loss_full), (loss_short, loss_full)


# ---- 6. eval.sort_by_length ------------------------------------------------------------------------

def mask_lengths(path):
    """One past each row's last attention_mask 1 (TokenDataset::lengths)."""
    with h5py.File(path) as f:
        m = f["attention_mask"][()]
    return np.where(m.any(axis=1), m.shape[1] - np.argmax(m[:, ::-1], axis=1), 0)


def eval_positions(lengths, bs, longest_first, file_len):
    """Positions one rank computes evaluating these examples (rows of file_len) in batches of bs, each
    batch at its longest row (data.pad_multiple 1): in the file's order, or longest first with ties in
    the file's order (std::stable_sort, as Python's sorted)."""
    L = [int(x) for x in lengths]
    if longest_first:
        L = sorted(L, reverse=True)
    return sum(trimmed_len(L[k:k + bs], 1, file_len) * len(L[k:k + bs]) for k in range(0, len(L), bs))


def predict_both_orders(args, out, ranks=1, mode="predict", extra=()):
    """run.mode = `mode` with eval.sort_by_length true and false: {sorted: (log, eval record, rows)}."""
    runs = {}
    for srt in (True, False):
        o = out / f"sort_{srt}"
        p = nr.run(args + [f"--run.mode={mode}", f"--eval.sort_by_length={str(srt).lower()}",
                           f"--output.dir={o}", *extra], ranks=ranks)
        preds = o / "predictions.jsonl"
        rows = [json.loads(line) for line in preds.read_text().splitlines()] if preds.exists() else None
        runs[srt] = (p.stdout, nr.metrics(o)[1][-1], rows)
    return runs


def test_eval_sorted_by_length_equals_file_order(spread, tmp_path, report):
    lengths = mask_lengths(spread)
    bs = 8
    args = MODEL + NO_DROPOUT + ["--run.task=doc_cls", f"--data.train={spread}", f"--data.eval={spread}",
                                 f"--train.batch_size={bs}", "--model.initializer_range=0.5"]
    nr.run(args + ["--train.steps=2", "--checkpoint.interval=2", "--train.lr=1e-3",
                   f"--output.dir={tmp_path / 'train'}"])
    args.append(f"--model.weights={tmp_path / 'train' / 'checkpoints' / 'step_00000002.h5'}")
    runs = predict_both_orders(args, tmp_path / "one")
    (log_s, ev_s, rows_s), (log_f, ev_f, rows_f) = runs[True], runs[False]
    assert "longest first (eval.sort_by_length)" in log_s and "longest first" not in log_f
    assert len(rows_s) == len(lengths) and same_predictions(rows_s, rows_f)
    assert len({r["label"] for r in rows_s}) >= 2, "predictions all one class: the comparison means little"
    # The positions each order computes, and so its padding fraction, follow from the lengths alone:
    # a run that does not sort fails the first line (one that sorts shortest first computes the same
    # positions here, 400 being a multiple of 8: the direction is not what this checks).
    real = int(lengths.sum())
    pos_s, pos_f = eval_positions(lengths, bs, True, 64), eval_positions(lengths, bs, False, 64)
    assert ev_s["padding_fraction"] == pytest.approx(1 - real / pos_s, rel=1e-6)
    assert ev_f["padding_fraction"] == pytest.approx(1 - real / pos_f, rel=1e-6)
    assert pos_s < 0.75 * pos_f
    report(f"eval.sort_by_length on 400 rows of lengths 3..60 (T = 64), batch 8: {pos_s} positions "
           f"computed longest first against {pos_f} in the file's order; predictions equal")
    # The same per-example results summed in another order: the metrics exactly, the loss to rounding.
    loss_s, loss_f = ev_s.pop("loss"), ev_f.pop("loss")
    ev_s.pop("padding_fraction"), ev_f.pop("padding_fraction")
    assert ev_s == ev_f and abs(loss_s - loss_f) <= 1e-6 * abs(loss_f), (ev_s, ev_f, loss_s, loss_f)

    # 2 ranks: each sorts its own examples (r, r + 2, ...); the predictions are those of one rank
    two = predict_both_orders(args, tmp_path / "two", ranks=2)
    assert same_predictions(two[True][2], rows_s) and same_predictions(two[False][2], rows_s)
    halves = [lengths[r::2] for r in range(2)]
    assert two[True][1]["padding_fraction"] == pytest.approx(
        1 - real / sum(eval_positions(h, bs, True, 64) for h in halves), rel=1e-6)

    # eval.batches = 3: the first 24 examples of the file's order in either order (so the two agree),
    # sorted after the cut (the 24 longest examples would compute far more positions)
    part = predict_both_orders(args, tmp_path / "part", mode="eval", extra=["--eval.batches=3"])
    (_, ps, _), (_, pf, _) = part[True], part[False]
    assert ps["tokens"] == pf["tokens"] == 24 and ps["accuracy"] == pf["accuracy"]
    assert abs(ps["loss"] - pf["loss"]) <= 1e-6 * abs(pf["loss"])
    assert ps["padding_fraction"] == pytest.approx(
        1 - int(lengths[:24].sum()) / eval_positions(lengths[:24], bs, True, 64), rel=1e-6)


REAL_ORDER = [("doc_cls", "prep_doc_cls.py", DATA / "nsmc" / "nsmc_from_raw_test.tsv", ["--limit", "160"]),
              ("pair_cls", "prep_pair_cls.py", DATA / "kornli" / "xnli.dev.ko.tsv", ["--limit", "160"]),
              ("ner", "prep_ner.py", DATA / "klue-ner" / "klue-ner-v1.1_dev.tsv", ["--limit", "120"]),
              ("qa", "prep_qa.py", DATA / "korquad" / "KorQuAD_v1.0_dev.json",
               ["--limit", "60", "--doc-stride", "32"])]


@pytest.mark.parametrize("task,tool,source,extra", REAL_ORDER, ids=[r[0] for r in REAL_ORDER])
def test_real_data_eval_sorted_by_length_equals_file_order(task, tool, source, extra, tmp_path, report):
    data, args = real_data_model(task, tool, source, extra, tmp_path)
    lengths = mask_lengths(data)
    runs = predict_both_orders(args, tmp_path)
    (_, ev_s, rows_s), (_, ev_f, rows_f) = runs[True], runs[False]
    assert same_predictions(rows_s, rows_f)
    if task == "qa":  # the SQuAD-format answers as well (text per question id)
        answers = [json.loads((tmp_path / f"sort_{s}" / "predictions.json").read_text()) for s in (True, False)]
        assert answers[0] == answers[1] and len(answers[0]) > 0
    pf_s, pf_f = ev_s.pop("padding_fraction"), ev_f.pop("padding_fraction")
    real = int(lengths.sum())
    # qa's positions also cover answers and targets past the mask (trim_to_longest): not checked there
    if task != "qa":
        assert pf_s == pytest.approx(1 - real / eval_positions(lengths, 8, True, 128), rel=1e-6)
    assert pf_s < pf_f  # measured 0.08 against 0.55 (doc_cls) down to 0.014 against 0.097 (qa)
    loss_s, loss_f = ev_s.pop("loss"), ev_f.pop("loss")
    report(f"{task}: eval longest first, padding {pf_s:.3f} of the computed positions against {pf_f:.3f} "
           f"in the file's order ({len(lengths)} rows, mean length {lengths.mean():.1f}); loss {loss_s:.6f} "
           f"against {loss_f:.6f}; {ev_s}")
    assert ev_s == ev_f, (ev_s, ev_f)
    # qa's start/end softmax spans its batch's positions (as HF's per-batch padding does), so its loss
    # moves with the batch's length (measured 4.95 against 5.03 here); the predictions do not
    if task != "qa":
        assert abs(loss_s - loss_f) <= 1e-6 * abs(loss_f), (loss_s, loss_f)
