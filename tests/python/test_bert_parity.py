"""BERT with each head against Hugging Face transformers (BertForSequenceClassification,
BertForTokenClassification, BertForQuestionAnswering, BertForMaskedLM) on the same random weights and
batch: outputs, loss and every parameter gradient, relative error (norm-wise) at most 1e-4."""
import h5py
import numpy as np
import pytest
import torch
import transformers

import nlp_run as nr

CFG = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
           intermediate_size=48, max_position_embeddings=24, type_vocab_size=2,
           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=1e-12)
B, T, NL = 3, 16, 5
HEADS = {
    "doc_cls": transformers.BertForSequenceClassification,
    "pair_cls": transformers.BertForSequenceClassification,
    "ner": transformers.BertForTokenClassification,
    "qa": transformers.BertForQuestionAnswering,
    "mlm": transformers.BertForMaskedLM,
}
SKIP_KEYS = ("position_ids", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias")


def rel(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def make_model(task):
    torch.manual_seed(11)
    # BertForQuestionAnswering's qa_outputs has num_labels outputs: 2 (start, end)
    config = transformers.BertConfig(num_labels=2 if task == "qa" else NL,
                                     attn_implementation="eager", **CFG)
    model = HEADS[task](config).double().eval()
    with torch.no_grad():  # non-trivial LayerNorm and bias values
        for name, p in model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
        for name, p in model.named_parameters():  # round to float32: both sides see the same weights
            p.copy_(p.float().double())
    return model


def write_weights(model, path):
    with h5py.File(path, "w") as f:
        for k, v in model.state_dict().items():
            if any(s in k for s in SKIP_KEYS):
                continue
            f.create_dataset(k, data=v.float().numpy())
        f.attrs["model_type"] = "bert"
        for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            f.attrs[k] = np.int64(CFG[k])
        f.attrs["layer_norm_eps"] = float(CFG["layer_norm_eps"])


def make_batch(task, rng):
    ids = rng.integers(1, CFG["vocab_size"], size=(B, T)).astype(np.int32)
    mask = np.ones((B, T), dtype=np.int32)
    mask[1, 11:] = 0  # right padding
    mask[2, 6:] = 0
    types = np.zeros((B, T), dtype=np.int32)
    types[:, 8:] = 1
    types *= mask
    cols = dict(input_ids=ids, attention_mask=mask, token_type_ids=types)
    if task in ("doc_cls", "pair_cls"):
        cols["labels"] = rng.integers(0, NL, size=B).astype(np.int32)
    elif task == "ner":
        lab = rng.integers(0, NL, size=(B, T)).astype(np.int32)
        lab[mask == 0] = -100
        lab[:, 0] = -100
        lab[0, 3] = -100  # a continuation sub-token
        cols["labels"] = lab
    elif task == "qa":
        cols["start_positions"] = np.array([2, 5, 1], dtype=np.int32)
        cols["end_positions"] = np.array([4, 9, 5], dtype=np.int32)
    elif task == "mlm":
        lab = np.full((B, T), -100, dtype=np.int32)
        pick = (rng.random((B, T)) < 0.3) & (mask == 1)
        pick[:, 0] = True
        lab[pick] = ids[pick]
        ids[pick] = 3  # a [MASK] id
        cols["labels"] = lab
    return cols


def compare_with_transformers(model, task, cols, gradients_h5):
    """Run `model` (float64, eval) forward and backward on the batch `cols` and compare with what
    nlptrain's gradients mode wrote: loss (relative 1e-5), then {name: relative error} of the outputs
    and of every parameter gradient (asserted by the caller). nlptrain must have no extra parameter."""
    kwargs = {k: torch.tensor(v, dtype=torch.long) for k, v in cols.items()}
    res = model(**kwargs)
    res.loss.backward()
    worst = {}
    with h5py.File(gradients_h5) as g:
        assert abs(float(g["loss"][()]) - res.loss.item()) <= 1e-5 * abs(res.loss.item())
        if task == "qa":
            worst["start_logits"] = rel(g["start_logits"][()], res.start_logits.detach().numpy())
            worst["end_logits"] = rel(g["end_logits"][()], res.end_logits.detach().numpy())
        elif task == "mlm":
            # nlptrain scores the masked positions only (the loss needs no others): a row per
            # position listed in masked_positions, which must be exactly the labelled ones
            pos = g["masked_positions"][()]
            assert np.array_equal(pos, np.flatnonzero(cols["labels"].reshape(-1) != -100))
            full = res.logits.detach().numpy().reshape(-1, res.logits.shape[-1])
            worst["logits"] = rel(g["logits"][()], full[pos])
        else:
            worst["logits"] = rel(g["logits"][()], res.logits.detach().numpy())
        names = [n for n, _ in model.named_parameters()]
        scale = max(float(np.abs(p.grad.numpy()).max()) for _, p in model.named_parameters())
        for name, p in model.named_parameters():
            assert name in g, f"gradient of {name} missing"
            if np.abs(p.grad.numpy()).max() <= 1e-12 * scale:
                # Zero in exact arithmetic because softmax is shift-invariant (the attention key
                # bias; the QA output bias): both sides are rounding noise, so bound ours absolutely.
                assert np.abs(g[name][()]).max() <= 1e-6 * scale, name
                continue
            worst[name] = rel(g[name][()], p.grad.numpy())
        # nlptrain has no extra parameters
        ours = []
        g.visititems(lambda n, o: ours.append(n) if isinstance(o, h5py.Dataset) else None)
        extra = set(ours) - set(names) - {"loss", "logits", "start_logits", "end_logits",
                                          "masked_positions"}
        extra = {n for n in extra if not n.startswith("initialized/")}  # values, not gradients
        assert not extra, extra
    return worst


@pytest.mark.parametrize("task", list(HEADS))
def test_bert_head_matches_transformers(task, tmp_path):
    model = make_model(task)
    weights = tmp_path / "w.h5"
    write_weights(model, weights)
    cols = make_batch(task, np.random.default_rng(5))
    data = tmp_path / "d.h5"
    with h5py.File(data, "w") as f:
        for k, v in cols.items():
            f.create_dataset(k, data=v)
    out = tmp_path / "out"
    nr.run(["--model.type=bert", f"--run.task={task}", "--run.mode=gradients", "--data.padding=max_length",
            f"--model.weights={weights}", f"--model.num_labels={NL}", f"--data.train={data}",
            f"--train.batch_size={B}", f"--output.dir={out}", "--run.threads=1",
            "--model.hidden_dropout_prob=0", "--model.attention_probs_dropout_prob=0"])

    worst = compare_with_transformers(model, task, cols, out / "gradients.h5")
    top = max(worst, key=worst.get)
    print(f"{task}: max relative error {worst[top]:.2e} ({top})")
    assert worst[top] <= 1e-4, (top, worst[top])


def test_mlm_eval_metrics_match_transformers(tmp_path):
    """run.mode=eval for mlm on 2 ranks (each scores its shard of the masked positions): loss and
    masked-token accuracy equal transformers' on the same weights and labelled batch. Half of the
    labels are set to transformers' own argmax, so the accuracy is far from 0 and from 1."""
    model = make_model("mlm")
    weights = tmp_path / "w.h5"
    write_weights(model, weights)
    rng = np.random.default_rng(8)
    n = 6  # rows: 3 per rank
    cols = {k: np.concatenate([make_batch("mlm", rng)[k] for _ in range(n // B)]) for k in
            ("input_ids", "attention_mask", "token_type_ids", "labels")}
    inputs = {k: torch.tensor(cols[k], dtype=torch.long) for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        pred = model(**inputs).logits.argmax(-1).numpy()
    lab = cols["labels"]
    pos = np.argwhere(lab != -100)
    for k, (i, j) in enumerate(pos):
        if k % 2 == 0:
            lab[i, j] = pred[i, j]
    data = tmp_path / "d.h5"
    with h5py.File(data, "w") as f:
        for k, v in cols.items():
            f.create_dataset(k, data=v.astype(np.int32))
    with torch.no_grad():
        res = model(**inputs, labels=torch.tensor(lab, dtype=torch.long))
    want_acc = float((pred[lab != -100] == lab[lab != -100]).mean())
    out = tmp_path / "out"
    nr.run(["--model.type=bert", "--run.task=mlm", "--run.mode=eval", f"--model.weights={weights}",
            f"--data.eval={data}", "--train.batch_size=2", f"--output.dir={out}", "--run.threads=1"],
           ranks=2)
    ev = nr.metrics(out)[1][-1]
    assert ev["tokens"] == int((lab != -100).sum())
    assert abs(ev["loss"] - res.loss.item()) <= 1e-5 * res.loss.item(), (ev["loss"], res.loss.item())
    assert 0.3 < want_acc < 0.9 and abs(ev["accuracy"] - want_acc) <= 1e-9, (ev["accuracy"], want_acc)


PAD_CASES = [("doc_cls", 0), ("mlm", 0), ("ner", 7), ("qa", 0), ("doc_cls", None)]


@pytest.mark.parametrize("task,pad", PAD_CASES, ids=[f"{t}-pad{p}" for t, p in PAD_CASES])
def test_attended_pad_tokens(task, pad, tmp_path):
    """transformers builds the word embeddings with padding_idx = pad_token_id: the lookup adds no
    gradient to the [PAD] row, also where [PAD] tokens are attended (attention_mask 1). nlptrain
    must do the same; for mlm the tied decoder still gives that row a gradient. pad_token_id comes
    from the weights file's attribute (7 here for ner; -1 for a null pad_token_id, no padding_idx:
    then id 0 is an ordinary token), else the default 0."""
    torch.manual_seed(11)
    config = transformers.BertConfig(num_labels=2 if task == "qa" else NL, pad_token_id=pad,
                                     attn_implementation="eager", **CFG)
    model = HEADS[task](config).double().eval()
    assert model.bert.embeddings.word_embeddings.padding_idx == pad
    attr, pad = (-1, 0) if pad is None else (pad, pad)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.1 * torch.randn_like(p))  # the pad row too: not zero, so it matters in the forward
            p.copy_(p.float().double())
    weights = tmp_path / "w.h5"
    write_weights(model, weights)
    if attr != 0:
        with h5py.File(weights, "r+") as f:
            f.attrs["pad_token_id"] = np.int64(attr)
    cols = make_batch(task, np.random.default_rng(6))
    ids, mask = cols["input_ids"], cols["attention_mask"]
    ids[mask == 0] = pad  # padding carries the [PAD] id ...
    ids[0, [4, 9]] = pad  # ... and attended [PAD] tokens (mask 1)
    ids[1, 2] = pad
    ids[2, 1] = pad
    assert mask[0, 4] == mask[0, 9] == mask[1, 2] == mask[2, 1] == 1
    data = tmp_path / "d.h5"
    with h5py.File(data, "w") as f:
        for k, v in cols.items():
            f.create_dataset(k, data=v)
    out = tmp_path / "out"
    nr.run(["--model.type=bert", f"--run.task={task}", "--run.mode=gradients", "--data.padding=max_length", f"--model.weights={weights}",
            f"--model.num_labels={NL}", f"--data.train={data}", f"--train.batch_size={B}",
            f"--output.dir={out}", "--run.threads=1"])
    worst = compare_with_transformers(model, task, cols, out / "gradients.h5")
    name = "bert.embeddings.word_embeddings.weight"
    ref = model.bert.embeddings.word_embeddings.weight.grad.numpy()
    with h5py.File(out / "gradients.h5") as g:
        ours = g[name][()]
    if task == "mlm" or attr == -1:  # the decoder's share only; every share without padding_idx
        assert np.abs(ref[pad]).max() > 0
        worst["pad row"] = rel(ours[pad], ref[pad])
    else:
        assert np.all(ref[pad] == 0) and np.all(ours[pad] == 0), np.abs(ours[pad]).max()
    top = max(worst, key=worst.get)
    print(f"{task} with attended [PAD] = {attr}: max relative error {worst[top]:.2e} ({top})")
    assert worst[top] <= 1e-4, (top, worst[top])
