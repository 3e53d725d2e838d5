"""What users arriving with a Hugging Face model and a job need from the binary, on small
synthetic data (no shared data needed):

1. model.reinit_mismatched: a 2-label classifier checkpoint starts a 3-label task (a new head, named
   in the log); without it the error names the key;
2. predictions: per example the id, the label, its score and every class's probability, the text;
   unlabelled files (no `labels`) are predicted (the same labels as the labelled file, no metrics);
   NER without labels predicts every word's first sub-token (from word_ids);
3. train.epochs: the step count from the data, logged, and recorded in config.ini;
4. model.weights naming a Hub folder or a .safetensors file: an error naming tools/hf_import.py;
5. vocabularies: data and weights of different vocab_sha256, or a dataset vocab_size larger than the
   model's, are errors naming both; a smaller one is a warning; the weights nlptrain writes carry the
   training data's vocab_sha256;
6. generate.tokenizer = ids: prompt ids in, sample ids out, checked against the model's vocabulary;
7. configuration: config.ini holds the model as loaded, eval/predict/generate runs write their own
   config.<mode>.ini, keys of the other model type are errors, model.preset sets a shape.
"""
import json

import h5py
import numpy as np
import pytest

import nlp_run as nr

V, T = 120, 16
PAD, CLS, SEP = 0, 2, 3
BERT = ["--model.type=bert", f"--model.vocab_size={V}", "--model.hidden_size=32",
        "--model.num_hidden_layers=2", "--model.num_attention_heads=2", "--model.intermediate_size=64",
        "--model.max_position_embeddings=32", "--run.threads=1", "--train.batch_size=4"]
SHA_A, SHA_B = "a" * 64, "b" * 64


def cls_data(path, n, num_labels, seed, labelled=True, sha=SHA_A, vocab_size=V):
    """doc_cls rows [CLS] w... [SEP] with ids, texts and label names; returns path."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(4, T + 1, size=n)
    ids = rng.integers(5, V, size=(n, T)).astype(np.int32)
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.int32)
    for i, L in enumerate(lengths):
        ids[i, 0], ids[i, L - 1] = CLS, SEP
        ids[i, L:] = PAD
    labels = (ids[:, 1] % num_labels).astype(np.int32)  # learnable from the first word
    with h5py.File(path, "w") as f:
        f.create_dataset("input_ids", data=ids)
        f.create_dataset("attention_mask", data=mask)
        f.create_dataset("token_type_ids", data=np.zeros_like(ids))
        if labelled:
            f.create_dataset("labels", data=labels)
            f.attrs["num_labels"] = np.int64(num_labels)
            f.attrs["id2label"] = json.dumps([f"class{k}" for k in range(num_labels)])
        f.create_dataset("example_id", data=[f"ex-{i}".encode() for i in range(n)], dtype=h5py.string_dtype())
        f.create_dataset("text", data=[f"text {i}".encode() for i in range(n)], dtype=h5py.string_dtype())
        f.attrs["vocab_size"] = np.int64(vocab_size)
        if sha:
            f.attrs["vocab_sha256"] = sha
    return path


def ner_data(path, n, seed, labelled=True):
    """ner rows: words of 1-3 sub-tokens; the first sub-token of each word labelled, word_ids kept."""
    rng = np.random.default_rng(seed)
    ids = np.full((n, T), PAD, np.int32)
    mask = np.zeros((n, T), np.int32)
    labels = np.full((n, T), -100, np.int32)
    words = np.full((n, T), -1, np.int32)
    for i in range(n):
        t, w = 1, 0
        ids[i, 0] = CLS
        while t < T - 4:
            k = int(rng.integers(1, 4))
            ids[i, t:t + k] = rng.integers(5, V, size=k)
            words[i, t:t + k] = w
            labels[i, t] = ids[i, t] % 3
            t, w = t + k, w + 1
            if rng.random() < 0.2:
                break
        ids[i, t] = SEP
        mask[i, :t + 1] = 1
    with h5py.File(path, "w") as f:
        f.create_dataset("input_ids", data=ids)
        f.create_dataset("attention_mask", data=mask)
        f.create_dataset("token_type_ids", data=np.zeros_like(ids))
        f.create_dataset("word_ids", data=words)
        if labelled:
            f.create_dataset("labels", data=labels)
        f.attrs["num_labels"] = np.int64(3)
        f.attrs["id2label"] = json.dumps(["O", "B-PS", "I-PS"])
        f.attrs["vocab_size"] = np.int64(V)
    return path


def lines(path):
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


@pytest.fixture(scope="module")
def two_label_model(tmp_path_factory):
    """A doc_cls checkpoint with a 2-label head, trained on data of vocab_sha256 SHA_A."""
    d = tmp_path_factory.mktemp("two")
    data = cls_data(d / "train.h5", 32, 2, seed=1)
    out = d / "out"
    nr.run(BERT + ["--run.task=doc_cls", "--model.num_labels=0", f"--data.train={data}",
                   f"--output.dir={out}", "--train.steps=3", "--checkpoint.interval=3"])
    return out / "checkpoints" / "step_00000003.h5"


def test_weights_carry_the_data_vocabulary(two_label_model):
    with h5py.File(two_label_model) as f:
        assert f.attrs["vocab_sha256"] == SHA_A


def test_reinit_mismatched_starts_a_new_head(two_label_model, tmp_path):
    data = cls_data(tmp_path / "three.h5", 32, 3, seed=2)
    args = BERT + ["--run.task=doc_cls", "--model.num_labels=0", f"--model.weights={two_label_model}",
                   f"--data.train={data}", "--train.steps=2"]
    p = nr.run(args + [f"--output.dir={tmp_path / 'a'}"], check=False)
    assert p.returncode != 0
    assert "num_labels = 3" in p.stdout + p.stderr and "model.reinit_mismatched" in p.stdout + p.stderr
    p = nr.run(args + [f"--output.dir={tmp_path / 'b'}", "--model.reinit_mismatched=true"])
    assert "initialised anew (model.reinit_mismatched): classifier.weight ([2, 32] in the file, [3, 32]" in p.stdout
    assert "num_labels = 3" in p.stdout
    # the encoder still comes from the file: the run's best/last weights have a 3-label head
    cfg = (tmp_path / "b" / "config.ini").read_text()
    assert "num_labels = 3" in cfg


def test_predictions_with_ids_probabilities_and_unlabelled_input(two_label_model, tmp_path):
    labelled = cls_data(tmp_path / "l.h5", 21, 2, seed=3)
    unlabelled = cls_data(tmp_path / "u.h5", 21, 2, seed=3, labelled=False)
    base = BERT + ["--run.task=doc_cls", "--run.mode=predict", f"--model.weights={two_label_model}"]
    nr.run(base + [f"--data.eval={labelled}", f"--output.dir={tmp_path / 'l'}"], ranks=2)
    p = nr.run(base + [f"--data.eval={unlabelled}", f"--output.dir={tmp_path / 'u'}"], ranks=2)
    got_l, got_u = lines(tmp_path / "l" / "predictions.jsonl"), lines(tmp_path / "u" / "predictions.jsonl")
    assert [r["index"] for r in got_l] == list(range(21))
    for r in got_l:
        probs = np.array(r["probabilities"])
        assert probs.shape == (2,) and abs(probs.sum() - 1) < 1e-5
        assert r["label"] == int(np.argmax(probs)) and abs(r["score"] - probs.max()) < 1e-5
        assert r["id"] == f"ex-{r['index']}" and r["text"] == f"text {r['index']}"
        assert r["label_name"] == f"class{r['label']}"  # from the weights' id2label
    # the same examples without labels: the same predictions, and no accuracy
    assert [(r["label"], r["probabilities"]) for r in got_u] == [(r["label"], r["probabilities"]) for r in got_l]
    ev = nr.metrics(tmp_path / "u")[1][-1]
    assert "accuracy" not in ev
    eval_l = nr.metrics(tmp_path / "l")[1][-1]
    assert 0 <= eval_l["accuracy"] <= 1
    # predict never opens data.train (an INI's training file may live on another machine)
    nr.run(base + [f"--data.eval={unlabelled}", f"--output.dir={tmp_path / 'v'}",
                   f"--data.train={tmp_path / 'elsewhere' / 'train.h5'}"], ranks=2)
    assert lines(tmp_path / "v" / "predictions.jsonl") == got_u
    # predict keeps its own config file
    assert (tmp_path / "u" / "config.predict.ini").exists() and not (tmp_path / "u" / "config.ini").exists()
    assert "predictions.jsonl" in p.stdout


def test_ner_without_labels_predicts_first_subtokens(tmp_path):
    data = ner_data(tmp_path / "n.h5", 24, seed=4)
    out = tmp_path / "train"
    common = BERT + ["--run.task=ner", "--model.num_labels=0"]
    nr.run(common + [f"--data.train={data}", f"--output.dir={out}", "--train.steps=3", "--checkpoint.interval=3"])
    w = out / "checkpoints" / "step_00000003.h5"
    bare = ner_data(tmp_path / "bare.h5", 24, seed=4, labelled=False)
    nr.run(common + ["--run.mode=predict", f"--model.weights={w}", f"--data.eval={data}",
                     f"--output.dir={tmp_path / 'l'}"])
    nr.run(common + ["--run.mode=predict", f"--model.weights={w}", f"--data.eval={bare}",
                     f"--output.dir={tmp_path / 'u'}"])
    got_l, got_u = lines(tmp_path / "l" / "predictions.jsonl"), lines(tmp_path / "u" / "predictions.jsonl")
    assert got_l == got_u  # labels sit exactly on the first sub-tokens, so the positions agree
    assert any(r["entities"] for r in got_u)
    for r in got_u:
        for e in r["entities"]:
            assert 0 < e["score"] <= 1
    with h5py.File(bare, "a") as f:
        del f["word_ids"]
    p = nr.run(common + ["--run.mode=predict", f"--model.weights={w}", f"--data.eval={bare}",
                         f"--output.dir={tmp_path / 'x'}"], check=False)
    assert p.returncode != 0 and "word_ids" in p.stdout + p.stderr


def test_epochs_set_the_step_count(tmp_path):
    data = cls_data(tmp_path / "d.h5", 40, 2, seed=5)
    out = tmp_path / "out"
    # 40 examples / (2 ranks x 4 x grad_accum 1) = 5 steps an epoch; 1.5 epochs -> ceil(7.5) = 8
    p = nr.run(BERT + ["--run.task=doc_cls", "--model.num_labels=0", f"--data.train={data}",
                       f"--output.dir={out}", "--train.epochs=1.5"], ranks=2)
    assert "train.epochs = 1.5: 40 examples in data.train / global batch 8" in p.stdout
    assert "-> train.steps = 8" in p.stdout
    train, _ = nr.metrics(out)
    assert train[-1]["step"] == 8
    cfg = (out / "config.ini").read_text()
    assert "epochs = 1.5" in cfg and "# steps = 8   (from train.epochs)" in cfg


@pytest.mark.parametrize("what", ["folder", "safetensors"])
def test_hub_folder_as_weights_names_the_converter(what, tmp_path):
    hub = tmp_path / "my-bert"
    hub.mkdir()
    (hub / "config.json").write_text('{"model_type": "bert"}')
    (hub / "model.safetensors").write_bytes(b"\0" * 16)
    weights = hub if what == "folder" else hub / "model.safetensors"
    data = cls_data(tmp_path / "d.h5", 8, 2, seed=6)
    p = nr.run(BERT + ["--run.task=doc_cls", f"--model.weights={weights}", f"--data.train={data}",
                       f"--output.dir={tmp_path / 'o'}", "--train.steps=1"], check=False)
    err = p.stdout + p.stderr
    assert p.returncode != 0
    assert f"python3 tools/hf_import.py {hub} {hub}.h5" in err, err
    assert "Hugging Face model folder" in err


def test_vocabulary_mismatches(two_label_model, tmp_path):
    base = BERT + ["--run.task=doc_cls", "--model.num_labels=0", "--train.steps=1"]
    other = cls_data(tmp_path / "other.h5", 8, 2, seed=7, sha=SHA_B)
    # data of another tokenizer than the weights'
    p = nr.run(base + [f"--model.weights={two_label_model}", f"--data.train={other}",
                       f"--output.dir={tmp_path / 'a'}"], check=False)
    err = p.stdout + p.stderr
    assert p.returncode != 0 and "different vocabularies" in err
    assert "data.train" in err and "model.weights" in err and SHA_B[:12] in err and SHA_A[:12] in err
    # train and eval of different tokenizers
    same = cls_data(tmp_path / "same.h5", 8, 2, seed=7)
    p = nr.run(base + [f"--data.train={same}", f"--data.eval={other}", f"--output.dir={tmp_path / 'b'}"],
               check=False)
    assert p.returncode != 0 and "data.eval" in p.stdout + p.stderr
    # a dataset vocabulary larger than the model's: an error naming both sizes
    big = cls_data(tmp_path / "big.h5", 8, 2, seed=7, vocab_size=V + 5)
    p = nr.run(base + [f"--data.train={big}", f"--output.dir={tmp_path / 'c'}"], check=False)
    err = p.stdout + p.stderr
    assert p.returncode != 0 and f"vocab_size = {V + 5}" in err and f"vocab_size = {V}" in err
    # smaller: a warning, and the run goes on
    small = cls_data(tmp_path / "small.h5", 8, 2, seed=7, vocab_size=V - 20)
    p = nr.run(base + [f"--data.train={small}", f"--output.dir={tmp_path / 'd'}"])
    assert f"warning: data.train '{small}' has vocab_size = {V - 20}" in p.stdout
    assert "20 embedding rows are never used" in p.stdout


def test_generate_from_prompt_ids(tmp_path):
    stream = nr.pattern_stream(tmp_path / "s.h5", 24, seed=8)
    with h5py.File(stream, "a") as f:
        f.attrs["vocab_sha256"] = SHA_A
    model = ["--model.vocab_size=64", "--model.n_layer=1", "--model.n_head=2", "--model.n_embd=16",
             "--model.n_positions=32", "--data.seq_len=16", "--run.threads=1"]
    out = tmp_path / "train"
    nr.run(model + [f"--data.train={stream}", f"--output.dir={out}", "--train.steps=2",
                    "--checkpoint.interval=2", "--train.batch_size=2"])
    w = out / "checkpoints" / "step_00000002.h5"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "seven", "prompt_ids": [7, 14, 21], "vocab_sha256": SHA_A,
                                   "eos_id": 63}) + "\n" + json.dumps({"prompt_ids": [1]}) + "\n")
    gen = model + ["--run.mode=generate", f"--model.weights={w}", "--generate.tokenizer=ids",
                   f"--generate.prompts_file={prompts}", "--generate.max_new_tokens=5",
                   "--generate.num_samples=2"]
    p = nr.run(gen + [f"--output.dir={out}"])
    rows = lines(out / "generated.jsonl")
    assert [r["prompt_ids"] for r in rows] == [[7, 14, 21], [1]]
    assert rows[0]["prompt"] == "seven" and "samples" not in rows[0]
    for r in rows:
        assert len(r["sample_ids"]) == 2
        for ids in r["sample_ids"]:
            assert 1 <= len(ids) <= 5 and all(0 <= i < 64 for i in ids)
            assert all(i != 63 for i in ids[:-1])  # the end-of-text id ends a sample
    assert "tools/decode_generated.py" in p.stdout
    assert (out / "config.generate.ini").exists()
    assert "tokenizer = ids" not in (out / "config.ini").read_text()  # the training run's file is kept
    # another tokenizer's prompts, and ids outside the vocabulary
    prompts.write_text(json.dumps({"prompt_ids": [1], "vocab_sha256": SHA_B}) + "\n")
    p = nr.run(gen + [f"--output.dir={tmp_path / 'x'}"], check=False)
    assert p.returncode != 0 and "encode the prompts with the model's tokenizer" in p.stdout + p.stderr
    prompts.write_text(json.dumps({"prompt_ids": [1, 64]}) + "\n")
    p = nr.run(gen + [f"--output.dir={tmp_path / 'y'}"], check=False)
    assert p.returncode != 0 and "outside the model's vocabulary [0, 64)" in p.stdout + p.stderr


def test_config_ini_holds_the_loaded_shape_and_keys_of_the_other_type_fail(two_label_model, tmp_path):
    data = cls_data(tmp_path / "d.h5", 8, 2, seed=9)
    out = tmp_path / "out"
    # the INI shape is the default 256-wide BERT; the weights are 32 wide
    nr.run(["--model.type=bert", "--run.task=doc_cls", f"--model.vocab_size={V}", "--run.threads=1",
            f"--model.weights={two_label_model}", f"--data.train={data}", f"--output.dir={out}",
            "--train.steps=1", "--train.batch_size=4"])
    cfg = (out / "config.ini").read_text()
    assert "hidden_size = 32" in cfg and "num_hidden_layers = 2" in cfg and "num_labels = 2" in cfg
    assert "# n_layer = 4   (gpt2 only" in cfg
    p = nr.run(BERT + ["--run.task=doc_cls", f"--data.train={data}", f"--output.dir={tmp_path / 'x'}",
                       "--model.n_layer=3"], check=False)
    assert p.returncode != 0
    assert "model.n_layer = 3 (command line) applies only to model.type = gpt2" in p.stdout + p.stderr
    assert not (tmp_path / "x" / "config.ini").exists()


def test_preset_gpt2_shape_with_override(tmp_path):
    stream = nr.pattern_stream(tmp_path / "s.h5", 8, seed=10)
    p = nr.run(["--model.preset=gpt2", "--model.n_layer=1", "--model.n_embd=48", "--model.n_head=2",
                f"--data.train={stream}", "--data.seq_len=16", "--train.steps=1", "--train.batch_size=2",
                "--run.threads=1", f"--output.dir={tmp_path / 'o'}"])
    assert "model: gpt2, 1 layers, 2 heads, width 48, vocab 50257" in p.stdout
    cfg = (tmp_path / "o" / "config.ini").read_text()
    assert "preset = gpt2" in cfg and "n_positions = 1024" in cfg


def test_builtin_generation_tokenizer_must_be_the_models(tmp_path):
    """generate.tokenizer = gpt2 / byte against the weights' vocab_sha256: the gpt2 vocabulary's
    fingerprint computed by the binary equals the data tools' (tools/hub_tokenizer.py); another
    tokenizer is an error before anything is generated, and before training with samples."""
    import sys
    vocab = nr.shared_data() / "vocab" / "gpt2"
    if not (vocab / "encoder.json").exists():
        pytest.skip(f"shared data absent: {vocab} (NLPTRAIN_SHARED_DATA)")
    sys.path.insert(0, str(nr.SOURCE_DIR / "tools"))
    import hub_tokenizer as ht
    sha = ht.load("gpt2", str(vocab)).vocab_sha256
    stream = nr.pattern_stream(tmp_path / "s.h5", 24, seed=11)
    with h5py.File(stream, "a") as f:
        f.attrs["vocab_sha256"] = sha
    model = ["--model.n_layer=1", "--model.n_head=2", "--model.n_embd=16", "--model.n_positions=32",
             "--data.seq_len=16", "--run.threads=1"]
    out = tmp_path / "train"
    nr.run(model + [f"--data.train={stream}", f"--output.dir={out}", "--train.steps=1", "--checkpoint.interval=1",
                    "--train.batch_size=2"])
    w = out / "checkpoints" / "step_00000001.h5"
    gen = model + ["--run.mode=generate", f"--model.weights={w}", "--generate.max_new_tokens=3",
                   "--generate.prompt=Hello"]
    nr.run(gen + ["--generate.tokenizer=gpt2", f"--generate.vocab_dir={vocab}", f"--output.dir={tmp_path / 'g'}"])
    assert (tmp_path / "g" / "generated.txt").read_text().startswith("Hello")
    p = nr.run(gen + ["--generate.tokenizer=byte", f"--output.dir={tmp_path / 'b'}"], check=False)
    err = p.stdout + p.stderr
    assert p.returncode != 0 and "generate.tokenizer = byte has vocab_sha256" in err and sha[:12] in err
    p = nr.run(model + [f"--data.train={stream}", f"--output.dir={tmp_path / 't'}", "--train.steps=2",
                        "--train.sample_interval=1", "--generate.tokenizer=byte"], check=False)
    assert p.returncode != 0 and "use the model's tokenizer" in p.stdout + p.stderr
    assert not (tmp_path / "t" / "metrics.jsonl").exists()


def test_one_command_tools_name_what_is_missing(two_label_model, tmp_path):
    """predict_text.py / generate_text.py: weights that do not record their tokenizer, a task they do not
    predict, a missing input: an error naming it, exit status 1, nothing run."""
    import subprocess
    import sys
    ini = tmp_path / "job.ini"
    ini.write_text("[run]\ntask = doc_cls\n[model]\ntype = bert\n")
    text = tmp_path / "t.txt"
    text.write_text("a review\n")

    def tool(name, *args):
        return subprocess.run([sys.executable, str(nr.SOURCE_DIR / "tools" / name), *map(str, args)],
                              capture_output=True, text=True)
    r = tool("predict_text.py", ini, two_label_model, text, "--out", tmp_path / "o")
    assert r.returncode == 1 and "no tokenizer_files attribute" in r.stderr and "--tokenizer PATH" in r.stderr
    assert not (tmp_path / "o" / "predictions.jsonl").exists()
    r = tool("predict_text.py", ini, two_label_model, tmp_path / "none.txt")
    assert r.returncode == 1 and "none.txt' not found" in r.stderr
    ini.write_text("[run]\ntask = qa\n[model]\ntype = bert\n")
    r = tool("predict_text.py", ini, two_label_model, text)
    assert r.returncode == 1 and "run.task = qa" in r.stderr
    r = tool("generate_text.py", ini, two_label_model, text)
    assert r.returncode == 1 and "model.type = bert" in r.stderr
