"""The RoBERTa and ELECTRA checkpoint forms users find on the Hub, imported with tools/hf_import.py
and run by nlptrain (gradients mode, model.type from the weights) for every task of the family,
against from_pretrained of the same folder in float64: loss, outputs and every gradient
(norm-wise relative error <= 1e-4, as test_hf_forms.py does for BERT). The tensors nlptrain
initialises must be from_pretrained's missing_keys, those it reports unused its unexpected_keys
(ElectraForPreTraining's discriminator_predictions.*, a base model's pooler, another task's head).

Then the round trip: import -> train 20 steps -> hf_export -> from_pretrained with the task's class
gives nlptrain's logits; and hf_import refuses model types nlptrain cannot run (naming the supported
ones) and ELECTRA generators.

Forms (saved by transformers from small random configs, no download):
  RobertaModel, RobertaFor{SequenceClassification,TokenClassification,QuestionAnswering,MaskedLM},
  ElectraModel, ElectraForPreTraining, ElectraFor{SequenceClassification,TokenClassification,
  QuestionAnswering}, ELECTRA with embedding_size != hidden_size.
"""
from __future__ import annotations

import json
import re
import sys

import h5py
import numpy as np
import pytest
import torch
import transformers

import nlp_run as nr
import test_bert_parity as P
import test_encoder_parity as EP

sys.path.insert(0, str(nr.SOURCE_DIR / "tools"))
import hf_export  # noqa: E402
import hf_import  # noqa: E402

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()

TOL = 1e-4
NL = P.NL
FORMS = {
    "roberta": ["RobertaModel", "RobertaForSequenceClassification", "RobertaForTokenClassification",
                "RobertaForQuestionAnswering", "RobertaForMaskedLM"],
    "electra": ["ElectraModel", "ElectraForPreTraining", "ElectraForSequenceClassification",
                "ElectraForTokenClassification", "ElectraForQuestionAnswering"],
}
CASES = [(fam, form, task) for fam, forms in FORMS.items() for form in forms
         for task in EP.FAMILIES[fam][2] if task != "pair_cls"]  # pair_cls: doc_cls's model
TIED = ("lm_head.decoder.",)  # tied to the word embeddings / lm_head.bias


def form_model(family, form, seed=3):
    config_cls, cfg, _ = EP.FAMILIES[family]
    torch.manual_seed(seed)
    config = config_cls(num_labels=2 if form.endswith("QuestionAnswering") else NL,
                        attn_implementation="eager", **cfg)
    model = getattr(transformers, form)(config)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
            p.copy_(p.float())
    return model.eval()


_CACHE: dict = {}


def imported(tmp_factory, family, form):
    if form not in _CACHE:
        root = tmp_factory.mktemp(form)
        form_model(family, form).save_pretrained(root / "src")
        h5 = root / "weights.h5"
        hf_import.main([str(root / "src"), str(h5), "--quiet"])
        _CACHE[form] = (root / "src", h5)
    return _CACHE[form]


def log_list(stdout: str, what: str) -> set[str]:
    return set(re.findall(rf"model: {what}: (\S+)", stdout))


@pytest.mark.parametrize("family,form,task", CASES, ids=["-".join(c) for c in CASES])
def test_encoder_form(tmp_path, tmp_path_factory, report, family, form, task):
    src, h5 = imported(tmp_path_factory, family, form)
    cols = EP.make_batch(family, task, np.random.default_rng(5))
    file_classifier = (form.endswith("SequenceClassification") and task == "doc_cls") or \
                      (form.endswith("TokenClassification") and task == "ner")
    labels = [] if task in ("qa", "mlm") or file_classifier else [f"--model.num_labels={NL}"]
    data = tmp_path / "d.h5"
    with h5py.File(data, "w") as f:
        for k, v in cols.items():
            f.create_dataset(k, data=v)
    out = tmp_path / "out"
    p = nr.run([f"--run.task={task}", "--run.mode=gradients", "--data.padding=max_length",
                f"--model.weights={h5}", f"--data.train={data}", f"--train.batch_size={P.B}",
                f"--output.dir={out}", "--run.threads=1", *labels])
    cls = EP.FAMILIES[family][2][task]
    model, info = cls.from_pretrained(str(src), output_loading_info=True, dtype=torch.float64,
                                      attn_implementation="eager", num_labels=2 if task == "qa" else NL)
    model.eval()
    missing = {k for k in info["missing_keys"] if not k.startswith(TIED)}
    unexpected = {k for k in info["unexpected_keys"] if not k.startswith(TIED)}
    grads = out / "gradients.h5"
    with h5py.File(grads) as g:
        init = {k: g["initialized"][k][()] for k in g["initialized"]} if "initialized" in g else {}
    assert set(init) == missing, (sorted(init), sorted(missing))
    assert log_list(p.stdout, r"new tensor, not in the weights file \(initialised\)") == missing
    assert log_list(p.stdout, "unused tensor in the weights file") == unexpected, p.stdout
    if form.endswith("Model"):
        assert "read as a base-model checkpoint" in p.stdout
    params = dict(model.named_parameters())
    with torch.no_grad():
        for k, v in init.items():
            params[k].copy_(torch.from_numpy(v).to(torch.float64))
    worst = P.compare_with_transformers(model, task, cols, grads)
    top = max(worst, key=worst.get)
    report(f"\n[hf_encoder_forms] {form} -> {task}: initialised {len(init)}, unused {len(unexpected)}, "
           f"max rel err {worst[top]:.2e} ({top})")
    assert worst[top] <= TOL, (top, worst[top])


ROUND_TRIPS = [("roberta", "RobertaModel", "doc_cls"), ("roberta", "RobertaForMaskedLM", "mlm"),
               ("electra", "ElectraForPreTraining", "ner"), ("electra", "ElectraModel", "qa")]


@pytest.mark.parametrize("family,form,task", ROUND_TRIPS, ids=["-".join(c) for c in ROUND_TRIPS])
def test_train_export_from_pretrained(tmp_path, tmp_path_factory, report, family, form, task):
    """import -> 20 training steps -> hf_export of the last checkpoint -> from_pretrained with the
    task's class: no missing or unexpected key, and the logits nlptrain computes on the checkpoint."""
    src, h5 = imported(tmp_path_factory, family, form)
    rng = np.random.default_rng(9)
    cols = {k: np.concatenate([EP.make_batch(family, task, rng)[k] for _ in range(2)])
            for k in EP.make_batch(family, task, np.random.default_rng(0))}
    data = tmp_path / "d.h5"
    with h5py.File(data, "w") as f:
        for k, v in cols.items():
            f.create_dataset(k, data=v)
        f.attrs["num_labels"] = np.int64(NL)
    run = tmp_path / "run"
    labels = [f"--model.num_labels={NL}"] if task in ("doc_cls", "ner") else []
    nr.run([f"--run.task={task}", f"--model.weights={h5}", f"--data.train={data}", "--train.steps=20",
            "--checkpoint.interval=20", "--train.batch_size=3", "--train.lr=1e-3", "--run.threads=1",
            f"--output.dir={run}", *labels])
    ckpt = run / "checkpoints" / "step_00000020.h5"
    name = "encoder.layer.1.output.dense.weight"
    with h5py.File(ckpt) as c, h5py.File(h5) as w:  # trained: the weights moved
        before = w[name if name in w else f"{family}.{name}"][()]
        assert not np.allclose(c[f"{family}.{name}"][()], before, rtol=0, atol=1e-6)
    out = tmp_path / "export"
    hf_export.main([str(ckpt), str(out), "--no-tokenizer", "--quiet"])
    config = json.loads((out / "config.json").read_text())
    cls = EP.FAMILIES[family][2][task]
    assert config["model_type"] == family and config["architectures"] == [cls.__name__], config
    model, info = cls.from_pretrained(str(out), output_loading_info=True, dtype=torch.float64,
                                      attn_implementation="eager")
    assert not info["missing_keys"] and not [k for k in info["unexpected_keys"] if not k.startswith(TIED)], info
    model.eval()
    one = {k: v[:P.B] for k, v in cols.items()}
    with h5py.File(data, "w") as f:
        for k, v in one.items():
            f.create_dataset(k, data=v)
    g = tmp_path / "grad"
    nr.run([f"--run.task={task}", "--run.mode=gradients", "--data.padding=max_length", f"--model.weights={ckpt}",
            f"--data.train={data}", f"--train.batch_size={P.B}", f"--output.dir={g}", "--run.threads=1",
            "--model.hidden_dropout_prob=0", "--model.attention_probs_dropout_prob=0", *labels])
    worst = P.compare_with_transformers(model, task, one, g / "gradients.h5")
    out_keys = [k for k in worst if k.endswith("logits")]
    report(f"\n[hf_encoder_forms] {form} {task} trained 20 steps, exported: logits rel err "
           f"{max(worst[k] for k in out_keys):.2e}, max over gradients {max(worst.values()):.2e}")
    assert max(worst.values()) <= TOL, worst


def test_import_refuses_unsupported_model_type(tmp_path, capsys):
    """issue 56 item 8: a model type nlptrain cannot run is refused at import, naming the supported
    types (and their checkpoint forms); nothing is written."""
    config = transformers.DistilBertConfig(vocab_size=50, dim=16, n_layers=1, n_heads=2, hidden_dim=32,
                                           max_position_embeddings=16)
    src = tmp_path / "distil"
    transformers.DistilBertModel(config).save_pretrained(src)
    out = tmp_path / "out.h5"
    assert hf_import.main_wrapper(hf_import.TOOL, hf_import.main, [str(src), str(out)]) == 1
    err = capsys.readouterr().err
    assert "model_type = 'distilbert'" in err and "cannot run" in err, err
    for t in ("gpt2", "bert", "roberta", "electra", "RobertaForMaskedLM", "ElectraForPreTraining"):
        assert t in err, (t, err)
    assert not out.exists() and not list(tmp_path.glob("*.tmp*"))


def test_import_refuses_electra_generator(tmp_path, capsys):
    """ElectraForMaskedLM (the generator) given as the discriminator: refused, naming the tensor."""
    src = tmp_path / "gen"
    torch.manual_seed(0)
    transformers.ElectraForMaskedLM(transformers.ElectraConfig(**EP.ELECTRA)).save_pretrained(src)
    out = tmp_path / "out.h5"
    assert hf_import.main_wrapper(hf_import.TOOL, hf_import.main, [str(src), str(out)]) == 1
    err = capsys.readouterr().err
    assert "ELECTRA generator" in err and ("generator_lm_head." in err or "generator_predictions." in err), err
    assert not out.exists()


def test_electra_pretraining_head_reported_unused(tmp_path_factory, capsys):
    """ElectraForPreTraining: its discriminator_predictions.* are kept and said to be unused."""
    root = tmp_path_factory.mktemp("disc")
    form_model("electra", "ElectraForPreTraining").save_pretrained(root / "src")
    hf_import.main([str(root / "src"), str(root / "w.h5")])
    assert "discriminator_predictions" in capsys.readouterr().err
