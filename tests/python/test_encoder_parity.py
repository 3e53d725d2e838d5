"""RoBERTa and ELECTRA (model.type = roberta | electra) with each head against Hugging Face
transformers on the same random weights and a padded batch (padding at the end, and attended pad
tokens in the middle): loss, outputs and every parameter gradient of nlptrain's gradients mode
against transformers in float64, relative error (norm-wise) at most 1e-4, as test_bert_parity.py.
ELECTRA with embedding_size != hidden_size (embeddings_project); RoBERTa's position ids (the running
count of non-pad tokens + padding_idx) checked directly through the rows of the position table
that get a gradient."""
import json

import h5py
import numpy as np
import pytest
import torch
import transformers

import nlp_run as nr
from test_bert_parity import B, NL, T, compare_with_transformers

COMMON = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=48, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# RoBERTa: klue/roberta-base's layout (type_vocab_size 1, pad 1, eps 1e-5, positions T + pad + 1)
ROBERTA = dict(COMMON, max_position_embeddings=T + 2, type_vocab_size=1, pad_token_id=1,
               layer_norm_eps=1e-5)
# ELECTRA: E != H, as KoELECTRA-small (128 -> 256)
ELECTRA = dict(COMMON, embedding_size=16, max_position_embeddings=24, type_vocab_size=2, pad_token_id=0,
               layer_norm_eps=1e-12)
FAMILIES = {
    "roberta": (transformers.RobertaConfig, ROBERTA, {
        "doc_cls": transformers.RobertaForSequenceClassification,
        "pair_cls": transformers.RobertaForSequenceClassification,
        "ner": transformers.RobertaForTokenClassification,
        "qa": transformers.RobertaForQuestionAnswering,
        "mlm": transformers.RobertaForMaskedLM}),
    "electra": (transformers.ElectraConfig, ELECTRA, {
        "doc_cls": transformers.ElectraForSequenceClassification,
        "pair_cls": transformers.ElectraForSequenceClassification,
        "ner": transformers.ElectraForTokenClassification,
        "qa": transformers.ElectraForQuestionAnswering}),
}
CASES = [(f, t) for f, (_, _, heads) in FAMILIES.items() for t in heads]
# tensors transformers ties or rebuilds (not weights of their own)
SKIP_KEYS = ("position_ids", "token_type_ids", "lm_head.decoder.weight", "lm_head.decoder.bias")
ATTRS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
         "max_position_embeddings", "type_vocab_size", "pad_token_id", "embedding_size")


def make_model(family, task, seed=11):
    config_cls, cfg, heads = FAMILIES[family]
    torch.manual_seed(seed)
    config = config_cls(num_labels=2 if task == "qa" else NL, attn_implementation="eager", **cfg)
    model = heads[task](config).double().eval()
    with torch.no_grad():  # non-trivial LayerNorm and bias values, the padding rows too
        for name, p in model.named_parameters():
            p.add_(0.1 * torch.randn_like(p))
            p.copy_(p.float().double())  # round to float32: both sides see the same weights
    return model


def write_weights(model, family, path):
    cfg = FAMILIES[family][1]
    with h5py.File(path, "w") as f:
        for k, v in model.state_dict().items():
            if any(k.endswith(s) for s in SKIP_KEYS):
                continue
            f.create_dataset(k, data=v.float().numpy())
        f.attrs["model_type"] = family
        for k in ATTRS:
            if k in cfg:
                f.attrs[k] = np.int64(cfg[k])
        f.attrs["layer_norm_eps"] = float(cfg["layer_norm_eps"])


def make_batch(family, task, rng):
    """A padded batch: row 1 and 2 padded at the end (pad ids, mask 0); attended pad ids (mask 1)
    in the middle of rows 0 and 1, which move RoBERTa's later positions back by one each."""
    pad = FAMILIES[family][1]["pad_token_id"]
    ids = rng.integers(2, COMMON["vocab_size"], size=(B, T)).astype(np.int32)
    mask = np.ones((B, T), dtype=np.int32)
    mask[1, 11:] = 0
    mask[2, 6:] = 0
    ids[mask == 0] = pad
    ids[0, [4, 9]] = pad
    ids[1, 2] = pad
    types = np.zeros((B, T), dtype=np.int32)
    if family == "electra":  # ELECTRA has BERT's two segments
        types[:, 8:] = 1
        types *= mask
    cols = dict(input_ids=ids, attention_mask=mask, token_type_ids=types)
    if task in ("doc_cls", "pair_cls"):
        cols["labels"] = rng.integers(0, NL, size=B).astype(np.int32)
    elif task == "ner":
        lab = rng.integers(0, NL, size=(B, T)).astype(np.int32)
        lab[mask == 0] = -100
        lab[:, 0] = -100
        lab[0, 3] = -100
        cols["labels"] = lab
    elif task == "qa":
        cols["start_positions"] = np.array([2, 5, 1], dtype=np.int32)
        cols["end_positions"] = np.array([4, 9, 5], dtype=np.int32)
    elif task == "mlm":
        lab = np.full((B, T), -100, dtype=np.int32)
        pick = (rng.random((B, T)) < 0.3) & (mask == 1) & (ids != pad)
        pick[:, 0] = True
        lab[pick] = ids[pick]
        ids[pick] = 3  # a <mask> id
        cols["labels"] = lab
    return cols


def run_gradients(tmp_path, family, task, cols, weights, extra=()):
    data = tmp_path / "d.h5"
    with h5py.File(data, "w") as f:
        for k, v in cols.items():
            f.create_dataset(k, data=v)
    out = tmp_path / "out"
    # model.type is left out: taken from the weights' model_type
    nr.run([f"--run.task={task}", "--run.mode=gradients", "--data.padding=max_length",
            f"--model.weights={weights}", f"--model.num_labels={NL}", f"--data.train={data}",
            f"--train.batch_size={B}", f"--output.dir={out}", "--run.threads=1",
            "--model.hidden_dropout_prob=0", "--model.attention_probs_dropout_prob=0", *extra])
    return out / "gradients.h5"


@pytest.mark.parametrize("family,task", CASES, ids=[f"{f}-{t}" for f, t in CASES])
def test_encoder_head_matches_transformers(family, task, tmp_path):
    model = make_model(family, task)
    weights = tmp_path / "w.h5"
    write_weights(model, family, weights)
    cols = make_batch(family, task, np.random.default_rng(5))
    grads = run_gradients(tmp_path, family, task, cols, weights)
    worst = compare_with_transformers(model, task, cols, grads)
    # the padding rows (word table; RoBERTa's position table) get no gradient from the lookup
    pad = FAMILIES[family][1]["pad_token_id"]
    base = model.base_model_prefix
    with h5py.File(grads) as g:
        if task != "mlm":  # (the tied decoder gives the word pad row its share)
            assert np.all(g[f"{base}.embeddings.word_embeddings.weight"][pad] == 0)
        if family == "roberta":
            assert np.all(g["roberta.embeddings.position_embeddings.weight"][pad] == 0)
    top = max(worst, key=worst.get)
    print(f"{family} {task}: max relative error {worst[top]:.2e} ({top}) over {len(worst)} tensors")
    assert worst[top] <= 1e-4, (top, worst[top])


def test_roberta_position_ids_match_transformers(tmp_path):
    """The rows of the position table that nlptrain's lookup reads are exactly the positions
    transformers' create_position_ids_from_input_ids gives the non-pad tokens (pad_token_id + the
    running count of non-pad tokens: two attended pads in row 0 move its later positions back by
    two), and their gradients equal transformers'."""
    model = make_model("roberta", "ner")
    weights = tmp_path / "w.h5"
    write_weights(model, "roberta", weights)
    cols = make_batch("roberta", "ner", np.random.default_rng(7))
    ids = torch.tensor(cols["input_ids"], dtype=torch.long)
    want = model.roberta.embeddings.create_position_ids_from_input_ids(ids, 1).numpy()
    assert (want[0, 10:] == np.arange(10, 16)).all()  # t + 2 without the pads at 4 and 9
    grads = run_gradients(tmp_path, "roberta", "ner", cols, weights)
    with h5py.File(grads) as g:
        gpos = g["roberta.embeddings.position_embeddings.weight"][()]
    used = np.flatnonzero(np.abs(gpos).sum(1) > 0)
    assert np.array_equal(used, np.unique(want[want != 1])), (used, np.unique(want))
    # and the gradients of those rows equal transformers'
    kwargs = {k: torch.tensor(v, dtype=torch.long) for k, v in cols.items()}
    model(**kwargs).loss.backward()
    ref = model.roberta.embeddings.position_embeddings.weight.grad.numpy()
    err = np.linalg.norm(gpos - ref) / np.linalg.norm(ref)
    assert err <= 1e-4, err


def test_roberta_token_types_must_be_zero(tmp_path):
    """type_vocab_size 1: a token type 1 (a WordPiece pair encoding's second segment) is an error
    naming the tensor, the row and the rule, before any step."""
    model = make_model("roberta", "pair_cls")
    weights = tmp_path / "w.h5"
    write_weights(model, "roberta", weights)
    cols = make_batch("roberta", "pair_cls", np.random.default_rng(5))
    cols["token_type_ids"][1, 5:9] = 1
    data = tmp_path / "d.h5"
    with h5py.File(data, "w") as f:
        for k, v in cols.items():
            f.create_dataset(k, data=v)
    p = nr.run(["--run.task=pair_cls", f"--model.weights={weights}", f"--data.train={data}",
                "--train.steps=1", f"--train.batch_size={B}", f"--output.dir={tmp_path / 'out'}"], check=False)
    assert p.returncode != 0
    err = p.stdout + p.stderr
    assert "token_type_ids[row 1, pos 5] = 1" in err and "type_vocab_size 1" in err, err
    assert "model.type = roberta" in err and "every token type must be 0" in err, err


def test_roberta_position_beyond_the_table(tmp_path):
    """Rows longer than max_position_embeddings - pad_token_id - 1 (the positions start at
    pad_token_id + 1): an error naming the limit and its keys."""
    model = make_model("roberta", "doc_cls")
    weights = tmp_path / "w.h5"
    write_weights(model, "roberta", weights)
    with h5py.File(weights, "r+") as f:  # T = 16 rows, but only 15 positions
        del f["roberta.embeddings.position_embeddings.weight"]
        f.create_dataset("roberta.embeddings.position_embeddings.weight",
                         data=np.zeros((T + 1, COMMON["hidden_size"]), np.float32))
        f.attrs["max_position_embeddings"] = np.int64(T + 1)
    cols = make_batch("roberta", "doc_cls", np.random.default_rng(5))
    data = tmp_path / "d.h5"
    with h5py.File(data, "w") as f:
        for k, v in cols.items():
            f.create_dataset(k, data=v)
    p = nr.run(["--run.task=doc_cls", f"--model.weights={weights}", f"--data.train={data}",
                "--train.steps=1", f"--train.batch_size={B}", f"--output.dir={tmp_path / 'out'}"], check=False)
    assert p.returncode != 0
    err = p.stdout + p.stderr
    assert f"sequence length {T} exceeds the model's max_position_embeddings - pad_token_id - 1 = {T - 1}" in err, err


def test_electra_generator_refused(tmp_path):
    """An ELECTRA generator (ElectraForMaskedLM) given as model.weights: an error naming its tensor."""
    torch.manual_seed(3)
    config = transformers.ElectraConfig(**ELECTRA)
    gen = transformers.ElectraForMaskedLM(config)
    weights = tmp_path / "gen.h5"
    write_weights(gen, "electra", weights)
    cols = make_batch("electra", "doc_cls", np.random.default_rng(5))
    data = tmp_path / "d.h5"
    with h5py.File(data, "w") as f:
        for k, v in cols.items():
            f.create_dataset(k, data=v)
    p = nr.run(["--run.task=doc_cls", f"--model.weights={weights}", f"--data.train={data}",
                f"--model.num_labels={NL}", "--train.steps=1", f"--output.dir={tmp_path / 'out'}"], check=False)
    assert p.returncode != 0
    err = p.stdout + p.stderr
    assert "generator_lm_head.weight" in err and "ELECTRA generator" in err, err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_electra_mlm_refused(tmp_path):
    p = nr.run(["--model.type=electra", "--run.task=mlm", "--train.steps=1",
                f"--output.dir={tmp_path / 'out'}"], check=False)
    assert p.returncode != 0
    assert "run.task = mlm" in p.stdout + p.stderr and "electra" in p.stdout + p.stderr


@pytest.mark.parametrize("task", ["doc_cls", "ner"])
def test_roberta_packed_equals_unpacked(task, tmp_path):
    """data.packing puts several examples in a row: RoBERTa's position ids restart in each example
    (pad_token_id + the count of its own non-pad tokens), so the packed batch's loss and every
    gradient equal the unpacked batch's (1e-5 relative), with an attended pad inside an example."""
    model = make_model("roberta", task)
    weights = tmp_path / "w.h5"
    write_weights(model, "roberta", weights)
    rng = np.random.default_rng(3)
    lengths = [5, 7, 4, 9]
    n = len(lengths)
    ids = rng.integers(2, COMMON["vocab_size"], size=(n, T)).astype(np.int32)
    mask = np.zeros((n, T), dtype=np.int32)
    for i, L in enumerate(lengths):
        mask[i, :L] = 1
    ids[mask == 0] = 1
    ids[1, 3] = 1  # attended pad
    cols = dict(input_ids=ids, attention_mask=mask, token_type_ids=np.zeros_like(ids))
    if task == "doc_cls":
        cols["labels"] = rng.integers(0, NL, size=n).astype(np.int32)
    else:
        lab = rng.integers(0, NL, size=(n, T)).astype(np.int32)
        lab[mask == 0] = -100
        cols["labels"] = lab
    data = tmp_path / "d.h5"
    with h5py.File(data, "w") as f:
        for k, v in cols.items():
            f.create_dataset(k, data=v)
    runs = {}
    for name, extra in (("plain", []), ("packed", ["--data.packing=true", "--data.pack_batch=examples"])):
        out = tmp_path / name
        nr.run([f"--run.task={task}", "--run.mode=gradients", "--data.padding=longest", f"--model.weights={weights}",
                f"--model.num_labels={NL}", f"--data.train={data}", f"--train.batch_size={n}",
                f"--output.dir={out}", "--run.threads=1", "--model.hidden_dropout_prob=0",
                "--model.attention_probs_dropout_prob=0", *extra])
        with h5py.File(out / "gradients.h5") as g:
            runs[name] = {k: g[k][()] for k in g if k == "loss" or k.startswith(("roberta.", "classifier."))}
            if name == "packed":  # several examples share a row (rows of batch_len positions)
                first, row_len = g["example_first"][()], int(g.attrs["batch_len"])
                assert len(set((first // row_len).tolist())) < n, (first, row_len)
    plain, packed = runs["plain"], runs["packed"]
    assert set(plain) == set(packed) and len(plain) > 30
    scale = max(float(np.abs(v).max()) for v in plain.values())
    worst = 0.0
    for k in plain:
        if k.endswith("attention.self.key.bias"):  # zero in exact arithmetic (softmax shift-invariance):
            assert np.abs(packed[k]).max() <= 1e-6 * scale, k  # rounding noise on both sides
            continue
        worst = max(worst, float(np.linalg.norm(packed[k] - plain[k]) / max(np.linalg.norm(plain[k]), 1e-30)))
    assert worst <= 1e-5, worst


def test_modes_from_scratch(tmp_path):
    """Every mode with a model made from the INI's keys: a RoBERTa pre-trained with mlm (checkpoint
    under transformers' names, lm_head.* and the tied decoder), evaluated; an ELECTRA with
    embedding_size != hidden_size trained on doc_cls, then predicting; the weights it writes say
    model_type electra and embedding_size, and load back (model.type from the weights)."""
    cols = make_batch("roberta", "mlm", np.random.default_rng(1))
    data = tmp_path / "mlm.h5"
    with h5py.File(data, "w") as f:
        for k, v in cols.items():
            f.create_dataset(k, data=v)
    shape = ["--model.vocab_size=120", "--model.hidden_size=32", "--model.num_hidden_layers=2",
             "--model.num_attention_heads=4", "--model.intermediate_size=48", "--run.threads=1",
             f"--train.batch_size={B}", "--train.steps=3", "--train.lr=1e-3"]
    out = tmp_path / "roberta"
    nr.run(["--model.type=roberta", "--run.task=mlm", "--model.pad_token_id=1", "--model.type_vocab_size=1",
            f"--model.max_position_embeddings={T + 2}", f"--data.train={data}", f"--data.eval={data}",
            f"--output.dir={out}", *shape])
    with h5py.File(out / "best.h5") as f:
        assert f.attrs["model_type"] == "roberta" and f.attrs["architectures"] == "RobertaForMaskedLM"
        assert "lm_head.dense.weight" in f and "roberta.embeddings.position_embeddings.weight" in f
        assert np.all(f["roberta.embeddings.position_embeddings.weight"][1] == 0)  # the padding row
    ev = tmp_path / "roberta_eval"
    nr.run(["--run.task=mlm", "--run.mode=eval", f"--model.weights={out / 'best.h5'}", f"--data.eval={data}",
            f"--output.dir={ev}", "--run.threads=1"])
    assert nr.metrics(ev)[1][-1]["loss"] > 0

    cols = make_batch("electra", "doc_cls", np.random.default_rng(2))
    data = tmp_path / "cls.h5"
    with h5py.File(data, "w") as f:
        for k, v in cols.items():
            f.create_dataset(k, data=v)
        f.attrs["num_labels"] = np.int64(NL)
    out = tmp_path / "electra"
    nr.run(["--model.type=electra", "--run.task=doc_cls", "--model.embedding_size=16", "--model.num_labels=0",
            f"--data.train={data}", f"--data.eval={data}", f"--output.dir={out}", *shape])
    with h5py.File(out / "best.h5") as f:
        assert f.attrs["model_type"] == "electra" and f.attrs["embedding_size"] == 16
        assert f["electra.embeddings_project.weight"].shape == (32, 16)
        assert f["classifier.out_proj.weight"].shape == (NL, 32)
    pr = tmp_path / "electra_predict"
    nr.run(["--run.task=doc_cls", "--run.mode=predict", f"--model.weights={out / 'best.h5'}", f"--data.eval={data}",
            f"--output.dir={pr}", "--run.threads=1"])
    rows = [json.loads(l) for l in (pr / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == B and all(len(r["probabilities"]) == NL for r in rows)


GPU_CASES = [("roberta", "doc_cls"), ("roberta", "mlm"), ("electra", "ner"), ("electra", "qa")]


@pytest.mark.parametrize("family,task", GPU_CASES, ids=[f"{f}-{t}" for f, t in GPU_CASES])
def test_cuda_encoder_matches_transformers(family, task, tmp_path, report):
    """The same comparison on the cuda backend (fp32, native attention; skipped without a GPU):
    RoBERTa's position ids (host-computed, uploaded) and ELECTRA's embeddings_project run there."""
    nr.cuda_device_or_skip(f"{family} {task} on the cuda backend is")
    model = make_model(family, task)
    weights = tmp_path / "w.h5"
    write_weights(model, family, weights)
    cols = make_batch(family, task, np.random.default_rng(5))
    grads = run_gradients(tmp_path, family, task, cols, weights,
                          extra=["--run.backend=cuda", "--train.precision=fp32", "--model.attention=native"])
    worst = compare_with_transformers(model, task, cols, grads)
    top = max(worst, key=worst.get)
    report(f"{family} {task} on cuda: max relative error {worst[top]:.2e} ({top})")
    assert worst[top] <= 1e-4, (top, worst[top])


def test_roberta_packed_training_equals_unpacked(tmp_path):
    """Training with dropout on (trainer's batches: positions counted at upload): the per-step losses of
    a packed run equal the unpacked run's (dropout masks are keyed by example and position)."""
    model = make_model("roberta", "doc_cls")
    weights = tmp_path / "w.h5"
    write_weights(model, "roberta", weights)
    rng = np.random.default_rng(4)
    n = 8
    ids = rng.integers(2, COMMON["vocab_size"], size=(n, T)).astype(np.int32)
    mask = np.zeros((n, T), dtype=np.int32)
    for i, L in enumerate(rng.integers(3, 8, size=n)):
        mask[i, :L] = 1
    ids[mask == 0] = 1
    ids[2, 1] = 1  # attended pad
    data = tmp_path / "d.h5"
    with h5py.File(data, "w") as f:
        for k, v in dict(input_ids=ids, attention_mask=mask, token_type_ids=np.zeros_like(ids),
                         labels=rng.integers(0, NL, size=n).astype(np.int32)).items():
            f.create_dataset(k, data=v)
    losses = {}
    for name, extra in (("plain", []), ("packed", ["--data.packing=true", "--data.pack_batch=examples"])):
        out = tmp_path / name
        nr.run(["--run.task=doc_cls", f"--model.weights={weights}", f"--model.num_labels={NL}",
                f"--data.train={data}", "--train.batch_size=4", "--train.steps=4", "--train.lr=1e-3",
                "--data.shuffle=false", "--model.hidden_dropout_prob=0.1", "--model.attention_probs_dropout_prob=0.1",
                "--run.log_interval=1", f"--output.dir={out}", "--run.threads=1", *extra])
        losses[name] = [r["loss"] for r in nr.metrics(out)[0]]
    assert len(losses["plain"]) == 4
    assert np.allclose(losses["packed"], losses["plain"], rtol=1e-5, atol=0), losses


INIT_CASES = [("roberta", "mlm"), ("roberta", "doc_cls"), ("electra", "doc_cls")]


@pytest.mark.parametrize("family,task", INIT_CASES, ids=[f"{f}-{t}" for f, t in INIT_CASES])
def test_from_scratch_init_follows_transformers(family, task, tmp_path):
    """A model made from the INI's keys starts as transformers' `_init_weights` makes the same config:
    every tensor transformers sets to ones (the norms' weights) or zeros (biases, the norms' biases) is
    so in nlptrain, and so are the padding rows transformers zeroes; every other tensor is
    N(0, initializer_range) (std within 15%, mean within 5 standard errors). nlptrain's weights are
    those of one step at lr 1e-12 (the initialisation moved by about 1e-12), as its checkpoint writes them."""
    config_cls, cfg, heads = FAMILIES[family]
    cfg = dict(cfg, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    torch.manual_seed(3)
    hf = heads[task](config_cls(num_labels=2 if task == "qa" else NL, **cfg)).state_dict()
    cols = make_batch(family, task, np.random.default_rng(4))
    data = tmp_path / "d.h5"
    with h5py.File(data, "w") as f:
        for k, v in cols.items():
            f.create_dataset(k, data=v)
    out = tmp_path / "out"
    args = [f"--model.type={family}", f"--run.task={task}", f"--data.train={data}", f"--data.eval={data}",
            f"--output.dir={out}", "--run.threads=1", f"--train.batch_size={B}", "--train.steps=1",
            "--train.lr=1e-12", "--train.warmup_steps=0"]
    args += [f"--model.{k}={cfg[k]}" for k in ATTRS if k in cfg]
    if task in ("doc_cls", "pair_cls", "ner"):
        args.append(f"--model.num_labels={NL}")
    nr.run(args)
    range_ = config_cls().initializer_range
    with h5py.File(out / "best.h5") as f:
        checked = 0
        for k, v in hf.items():
            if any(k.endswith(s) for s in SKIP_KEYS):
                continue
            assert k in f, f"{k}: not in nlptrain's weights"
            ours, theirs = f[k][()].astype(np.float64), v.double().numpy()
            assert ours.shape == theirs.shape, (k, ours.shape, theirs.shape)
            if np.all(theirs == 1) or np.all(theirs == 0):
                assert np.abs(ours - theirs).max() < 1e-6, f"{k}: transformers starts it at {theirs.flat[0]}"
                checked += 1
                continue
            zero_rows = [r for r in range(theirs.shape[0]) if theirs.ndim == 2 and np.all(theirs[r] == 0)]
            for r in zero_rows:  # padding_idx
                assert np.abs(ours[r]).max() < 1e-6, f"{k}: row {r} is zero in transformers"
            rest = np.delete(ours, zero_rows, axis=0).ravel() if zero_rows else ours.ravel()
            if rest.size >= 256:
                assert abs(rest.std() / range_ - 1) < 0.15, (k, rest.std())
                assert abs(rest.mean()) < 5 * range_ / np.sqrt(rest.size), (k, rest.mean())
            checked += 1
        assert checked >= 20, checked
