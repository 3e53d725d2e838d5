"""Hub tokenizers in the data tools (tools/hub_tokenizer.py, make_dataset.py and prep_*.py with
--tokenizer PATH, --no-labels), the generation pair encode_prompts.py / decode_generated.py and the
tokenizer files of hf_export.py (run: python3 -m pytest -q -rs tests/python/test_hub_tokenizers.py).

The HDF5 files the tools write are compared with transformers' AutoTokenizer called the way HF's
example scripts call it (run_clm: tokenizer(line) per line of the datasets `text` loader; run_glue:
tokenizer(a, b, truncation=True, max_length=T, padding="max_length"); run_ner: is_split_into_words
and word_ids(); run_qa: only_second truncation with stride, overflow and offsets) on a few hundred
examples of NSMC, KorNLI, KLUE NER, KorQuAD and WikiText-2, for three tokenizers built here:
  gpt2  GPT-2 byte-level BPE (the shared encoder.json/vocab.bpe saved with GPT2TokenizerFast);
  bpe   a Metaspace BPE with byte fallback trained on NSMC text, saved as tokenizer.json +
        tokenizer_config.json only (loaded by transformers as PreTrainedTokenizerFast), with a
        <s> A </s> / <s> A </s> B </s> template;
  wp    kcbert-base's WordPiece saved with BertTokenizerFast (tokenizer.json) plus its vocab.txt.
Tests that need the shared corpora (NLPTRAIN_SHARED_DATA, default <source>/../shared/data) skip with
"shared data absent: <path>".
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

np = pytest.importorskip("numpy", reason="NLPTRAIN_ALL_SKIPPED: numpy is not installed")
h5py = pytest.importorskip("h5py", reason="NLPTRAIN_ALL_SKIPPED: h5py is not installed")
tokenizers = pytest.importorskip("tokenizers", reason="NLPTRAIN_ALL_SKIPPED: tokenizers is not installed")
transformers = pytest.importorskip("transformers", reason="NLPTRAIN_ALL_SKIPPED: transformers is not installed")

SOURCE = Path(os.environ.get("NLPTRAIN_SOURCE_DIR") or Path(__file__).resolve().parents[2])
TOOLS = SOURCE / "tools"
SHARED = Path(os.environ.get("NLPTRAIN_SHARED_DATA") or SOURCE.parent / "shared" / "data")
GPT2_VOCAB = SHARED / "vocab" / "gpt2"
KCBERT = SHARED / "vocab" / "kcbert-base" / "vocab.txt"
UNCASED = SHARED / "vocab" / "bert-base-uncased" / "vocab.txt"
NSMC = SHARED / "nsmc" / "nsmc_from_raw_test.tsv"
NSMC_TRAIN = SHARED / "nsmc" / "nsmc_from_raw_train.tsv"
KORNLI = SHARED / "kornli" / "xnli.dev.ko.tsv"
NER = SHARED / "klue-ner" / "klue-ner-v1.1_dev.tsv"
KORQUAD = SHARED / "korquad" / "KorQuAD_v1.0_dev.json"
WIKI = SHARED / "wikitext2" / "wiki.test.raw"

sys.path.insert(0, str(TOOLS))
import hub_tokenizer as ht  # noqa: E402


def need(*paths):
    for p in paths:
        if not Path(p).exists():
            pytest.skip(f"shared data absent: {p}")


def run(tool, *args, check=True):
    r = subprocess.run([sys.executable, str(TOOLS / f"{tool}.py"), *map(str, args)], capture_output=True)
    if check and r.returncode != 0:
        raise AssertionError(f"{tool} {' '.join(map(str, args))} failed ({r.returncode}):\n"
                             f"{r.stderr.decode(errors='replace')}")
    return r


def load(path):
    out = {}
    with h5py.File(path, "r") as f:
        for k, ds in f.items():
            out[k] = ds.asstr()[()] if ds.dtype.kind == "O" else ds[()]
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    return out, attrs


def auto(folder):
    transformers.logging.set_verbosity_error()
    return transformers.AutoTokenizer.from_pretrained(str(folder))


# ---- the three tokenizer folders ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    need(GPT2_VOCAB / "encoder.json", GPT2_VOCAB / "vocab.bpe")
    vocab = json.loads((GPT2_VOCAB / "encoder.json").read_text(encoding="utf-8"))
    merges = [tuple(l.split(" ")) for l in (GPT2_VOCAB / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:] if l]
    d = tmp_path_factory.mktemp("gpt2")
    transformers.GPT2TokenizerFast(vocab=vocab, merges=merges).save_pretrained(str(d))
    return d


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    """Metaspace BPE with byte fallback, trained on 4000 NSMC training reviews (vocabulary 3000)."""
    need(NSMC_TRAIN)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    with open(NSMC_TRAIN, encoding="utf-8") as f:
        f.readline()
        lines = [f.readline().split("\t")[1] for _ in range(4000)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    specials = ["<unk>", "<s>", "</s>", "<pad>", "<mask>"]
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=3000, special_tokens=specials + byte_tokens,
                                                       show_progress=False))
    spec = json.loads(tok.to_str())
    # the byte tokens are vocabulary entries for byte_fallback, not added (special) tokens
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] in specials]
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="\u2581",
                                                                               prepend_scheme="always")])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1",
        special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))])
    d = tmp_path_factory.mktemp("bpe")
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "pad_token": "<pad>", "cls_token": "<s>", "sep_token": "</s>",
        "mask_token": "<mask>", "model_max_length": 512}), encoding="utf-8")
    return d


@pytest.fixture(scope="module")
def wp_dir(tmp_path_factory):
    need(KCBERT)
    d = tmp_path_factory.mktemp("wp")
    transformers.BertTokenizerFast(vocab=str(KCBERT), do_lower_case=False).save_pretrained(str(d))
    shutil.copy(KCBERT, d / "vocab.txt")
    return d


def tsv(path, n):
    with open(path, encoding="utf-8") as f:
        header = f.readline().rstrip("\n").split("\t")
        return header, [f.readline().rstrip("\n").split("\t") for _ in range(n)]


# ---- loading, fingerprints, errors ---------------------------------------------------------------------

def test_fingerprints(wp_dir, gpt2_dir, tmp_path):
    need(UNCASED)
    by_json = ht.load(str(wp_dir))
    by_txt = ht.load(str(wp_dir / "vocab.txt"))
    plain = ht.load(str(KCBERT))  # the shared folder: vocab.txt + config.json
    assert by_json.files[0].endswith("tokenizer.json") and by_txt.files[0].endswith("vocab.txt")
    assert by_json.vocab_sha256 == by_txt.vocab_sha256 == plain.vocab_sha256
    assert by_json.tokenizer_sha256 != by_txt.tokenizer_sha256
    # the documented canonical form, computed from vocab.txt
    lines = KCBERT.read_text(encoding="utf-8").split("\n")[:30000]
    assert "\\" in lines  # a backslash token: written as two backslashes
    canon = "".join(f"{i}\t{t.replace(chr(92), chr(92) * 2)}\n" for i, t in enumerate(lines))
    assert plain.vocab_sha256 == hashlib.sha256(canon.encode()).hexdigest()
    # tokenizer_sha256 over the files in tokenizer_files order
    h = hashlib.sha256()
    for p in by_json.files:
        b = Path(p).read_bytes()
        h.update(f"{os.path.basename(p)}\n{len(b)}\n".encode() + b)
    assert by_json.tokenizer_sha256 == h.hexdigest()
    assert ht.load(str(UNCASED)).vocab_sha256 != plain.vocab_sha256
    assert ht.load("byte").vocab_sha256 == hashlib.sha256(b"byte:256").hexdigest()
    g = ht.load("gpt2", str(GPT2_VOCAB))
    assert g.vocab_sha256 == ht.load(str(gpt2_dir)).vocab_sha256 and g.vocab_size == 50257
    at = by_json.attrs()
    assert at["tokenizer"] == "hub" and at["vocab_size"] == 30000
    assert (at["cls_id"], at["sep_id"], at["pad_id"], at["unk_id"], at["mask_id"]) == (2, 3, 0, 1, 4)
    assert at["tokenizer_files"].split("\n") == [str(wp_dir / "tokenizer.json"), str(wp_dir / "tokenizer_config.json")]


def test_error_paths(tmp_path, wp_dir):
    empty = tmp_path / "empty_model"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    src = tmp_path / "a.txt"
    src.write_text("hello\n")
    out = tmp_path / "o.h5"
    r = run("make_dataset", "--tokenizer", empty, "--out", out, src, check=False)
    assert r.returncode == 1 and str(empty).encode() in r.stderr and b"tokenizer.json" in r.stderr
    assert b"vocab.txt" in r.stderr and not out.exists()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nope"}}')
    r = run("make_dataset", "--tokenizer", bad, "--out", out, src, check=False)
    assert r.returncode == 1 and str(bad / "tokenizer.json").encode() in r.stderr and not out.exists()
    (bad / "tokenizer.json").write_text('{"version": ')
    tsv_in = tmp_path / "a.tsv"
    tsv_in.write_text("id\tdocument\tlabel\n1\thello\t0\n")
    r = run("prep_doc_cls", "--tokenizer", bad, "--input", tsv_in, "--out", out, check=False)
    assert r.returncode == 1 and str(bad / "tokenizer.json").encode() in r.stderr and not out.exists()
    r = run("prep_doc_cls", "--tokenizer", wp_dir, "--vocab", wp_dir / "vocab.txt", "--input", tsv_in,
            "--out", out, check=False)
    assert r.returncode == 1 and b"exactly one of --vocab" in r.stderr
    r = run("prep_doc_cls", "--input", tsv_in, "--out", out, check=False)
    assert r.returncode == 1 and b"exactly one of --vocab" in r.stderr
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_metaspace_bpe_keeps_hangul_and_refuses_vocab_json_export(bpe_dir, tmp_path):
    need(NSMC)
    tok = ht.load(str(bpe_dir))
    _, rows = tsv(NSMC, 300)
    texts = [r[1] for r in rows]
    hangul = sum(1 for t in texts for c in t if "\uac00" <= c <= "\ud7a3")
    assert hangul > 1000
    for t in texts:
        assert tok.decode(tok.ids([t])[0]) == t
    # the same model as vocab.json + merges.txt (what drops Hangul as GPT-2 BPE) is refused
    spec = json.loads((bpe_dir / "tokenizer.json").read_text(encoding="utf-8"))
    d = tmp_path / "exported"
    d.mkdir()
    (d / "vocab.json").write_text(json.dumps(spec["model"]["vocab"]), encoding="utf-8")
    (d / "merges.txt").write_text("#version: 0.2\n" + "\n".join(
        m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]) + "\n", encoding="utf-8")
    with pytest.raises(ht.DataError, match="byte-level"):
        ht.load(str(d))


# ---- causal LM: make_dataset as run_clm ------------------------------------------------------------------

def run_clm_ids(tokenizer, path):
    """run_clm.py with a .txt file: datasets' text loader (text mode, keep_linebreaks=True), then
    tokenizer(examples["text"]) and concatenation."""
    with open(path, encoding="utf-8") as f:  # text mode: universal newlines
        text = f.read()
    lines = [l + "\n" for l in text.split("\n")[:-1]] + ([text.split("\n")[-1]] if not text.endswith("\n") else [])
    out = []
    for ids in tokenizer(lines)["input_ids"]:
        out += ids
    return out


@pytest.mark.parametrize("which", ["gpt2", "bpe"])
def test_clm_matches_run_clm(which, gpt2_dir, bpe_dir, tmp_path):
    need(WIKI, NSMC)
    folder = gpt2_dir if which == "gpt2" else bpe_dir
    wiki = tmp_path / "wiki.txt"
    with open(WIKI, "rb") as f:
        raw = b"".join(f.readline() for _ in range(400))
    assert b"\r\n" in raw
    wiki.write_bytes(raw + b"no newline at the end")
    ko = tmp_path / "ko.txt"
    _, rows = tsv(NSMC, 300)
    ko.write_text("\n".join(r[1] for r in rows) + "\n\n", encoding="utf-8")
    out = tmp_path / "clm.h5"
    run("make_dataset", "--tokenizer", folder, "--eos-between-files", "--out", out, wiki, ko)
    d, at = load(out)
    tk = auto(folder)
    expect = run_clm_ids(tk, wiki) + [tk.eos_token_id] + run_clm_ids(tk, ko)
    assert d["tokens"].tolist() == expect
    tok = ht.load(str(folder))
    assert at["tokenizer"] == "hub" and at["vocab_sha256"] == tok.vocab_sha256
    assert at["tokenizer_sha256"] == tok.tokenizer_sha256 and at["eos_id"] == tk.eos_token_id
    assert at["vocab_size"] == len(tk) and at["keep_cr"] == 0
    if which == "gpt2":
        assert 201 not in d["tokens"].tolist()  # 'č' = the CR byte
        assert at["vocab_size"] == 50257 and at["eos_id"] == 50256 and "pad_id" not in at
    else:
        assert at["bos_id"] == tk.bos_token_id and at["pad_id"] == tk.pad_token_id
        # tokenizer(line) adds the template's <s> ... </s> to every line, as run_clm gets it
        n_lines = raw.count(b"\n") + 1 + 300 + 1
        assert d["tokens"].tolist().count(tk.bos_token_id) == n_lines
