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

def test_decode_reads_hub_data_with_its_own_tokenizer(bpe_dir, tmp_path):
    """decode.py on a Hub-tokenized dataset finds the tokenizer through tokenizer_files (Hangul kept)."""
    src = tmp_path / "ko.txt"
    src.write_text("이 영화 정말 재미있다\n배우들의 연기가 좋다\n", encoding="utf-8")
    out = tmp_path / "ko.h5"
    run("make_dataset", "--tokenizer", bpe_dir, "--eos-between-lines", "--out", out, src)
    r = run("decode", out)
    text = r.stdout.decode("utf-8")
    assert "이 영화 정말 재미있다" in text and "배우들의 연기가 좋다" in text, text
    r = run("decode", "--tokenizer", bpe_dir, "--ids", ",".join(map(str, load(out)[0]["tokens"].tolist())))
    assert r.stdout.decode("utf-8") == text


def test_eos_between_lines(gpt2_dir, tmp_path):
    """--eos-between-lines: each line an example without its line ending, blank lines skipped, EOS
    between examples and between files; the same for the built-in gpt2 tokenizer; byte has no EOS."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes("좋은 영화\r\n\r\nbad movie\n".encode())
    b.write_text("last one", encoding="utf-8")
    tk = auto(gpt2_dir)
    enc = lambda t: tk(t)["input_ids"]
    want = enc("좋은 영화") + [50256] + enc("bad movie") + [50256] + enc("last one")
    for spec in (["--tokenizer", gpt2_dir], ["--tokenizer", "gpt2", "--vocab-dir", GPT2_VOCAB]):
        out = tmp_path / "o.h5"
        run("make_dataset", *spec, "--eos-between-lines", "--out", out, a, b)
        assert load(out)[0]["tokens"].tolist() == want, spec
    r = run("make_dataset", "--tokenizer", "byte", "--eos-between-lines", "--out", tmp_path / "x.h5", a, check=False)
    assert r.returncode != 0 and b"--eos-between-lines" in r.stderr and b"no EOS" in r.stderr


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


# ---- BERT tasks: prep_* as run_glue / run_ner / run_qa ---------------------------------------------------

def folder_of(which, wp_dir, bpe_dir):
    return wp_dir if which == "wp" else bpe_dir


def glue_ref(tk, a, b, T):
    enc = tk(a, b, truncation=True, max_length=T, padding="max_length") if b is not None else \
        tk(a, truncation=True, max_length=T, padding="max_length")
    ids = np.array(enc["input_ids"], dtype=np.int32)
    types = np.array(enc["token_type_ids"], dtype=np.int32) if "token_type_ids" in enc else None
    return ids, np.array(enc["attention_mask"], dtype=np.int32), types


def check_types(got, want, mask, pair):
    """token_type_ids: transformers returns them only when its class lists them (BERT: yes; a plain
    PreTrainedTokenizerFast in transformers 5: no); the tools always write the template's type ids."""
    if want is not None:
        assert (got == want).all()
    else:
        assert (got[mask == 0] == 0).all() and got.max() == (1 if pair else 0)


@pytest.mark.parametrize("which", ["wp", "bpe"])
def test_doc_and_pair_cls_match_run_glue(which, wp_dir, bpe_dir, tmp_path):
    need(NSMC, KORNLI)
    folder = folder_of(which, wp_dir, bpe_dir)
    tk = auto(folder)
    T = 48  # short enough that some reviews and pairs are truncated
    out = tmp_path / "doc.h5"
    run("prep_doc_cls", "--tokenizer", folder, "--input", NSMC, "--limit", 300, "--max-seq-len", T, "--out", out)
    d, at = load(out)
    _, rows = tsv(NSMC, 300)
    ids, mask, types = glue_ref(tk, [r[1] for r in rows], None, T)
    assert (d["input_ids"] == ids).all() and (d["attention_mask"] == mask).all()
    check_types(d["token_type_ids"], types, mask, False)
    assert d["labels"].tolist() == [int(r[2]) for r in rows]
    assert d["example_id"].tolist() == [r[0] for r in rows] and d["text"].tolist() == [r[1] for r in rows]
    assert at["truncated"] > 0 and at["num_labels"] == 2 and at["has_labels"] == 1
    assert at["vocab_sha256"] == ht.load(str(folder)).vocab_sha256 and at["pad_id"] == tk.pad_token_id

    out = tmp_path / "pair.h5"
    run("prep_pair_cls", "--tokenizer", folder, "--input", KORNLI, "--limit", 300, "--max-seq-len", T, "--out", out)
    d, at = load(out)
    _, rows = tsv(KORNLI, 300)
    ids, mask, types = glue_ref(tk, [r[0] for r in rows], [r[1] for r in rows], T)
    assert (d["input_ids"] == ids).all() and (d["attention_mask"] == mask).all()
    check_types(d["token_type_ids"], types, mask, True)
    labels = ["entailment", "neutral", "contradiction"]
    assert d["labels"].tolist() == [labels.index(r[2]) for r in rows]
    assert d["text"].tolist() == [r[0] for r in rows] and d["text_pair"].tolist() == [r[1] for r in rows]
    assert d["example_id"][0] == f"{KORNLI.name}:2" and at["truncated"] > 0


def klue_sentences(path, n):
    """[(chars, tags)] of the first n sentences."""
    out, cur = [], None
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.startswith("##"):
            continue
        if line == "":
            if cur:
                out.append(cur)
                if len(out) == n:
                    break
            cur = None
            continue
        ch, tag = line.split("\t")
        cur = cur or ([], [])
        cur[0].append(ch)
        cur[1].append(tag)
    return out


@pytest.mark.parametrize("which", ["wp", "bpe"])
def test_ner_matches_run_ner(which, wp_dir, bpe_dir, tmp_path):
    need(NER)
    import prep_ner

    folder = folder_of(which, wp_dir, bpe_dir)
    tk = auto(folder)
    T = 48
    out = tmp_path / "ner.h5"
    run("prep_ner", "--tokenizer", folder, "--input", NER, "--limit", 300, "--max-seq-len", T, "--out", out)
    d, at = load(out)
    sents = klue_sentences(NER, 300)
    for i, (chars, tags) in enumerate(sents):
        text = "".join(chars)
        words, starts, pos = text.split(), [], 0
        for w in words:
            pos = text.index(w, pos)
            starts.append(pos)
            pos += len(w)
        word_labels = [prep_ner.LABEL2ID[tags[s]] for s in starts]
        enc = tk(words, is_split_into_words=True, truncation=True, max_length=T, padding="max_length")
        wids = enc.word_ids()
        labels, prev = [], None  # run_ner's tokenize_and_align_labels, label_all_tokens=False
        for w in wids:
            labels.append(-100 if w is None or w == prev else word_labels[w])
            prev = w
        assert d["input_ids"][i].tolist() == enc["input_ids"], i
        assert d["attention_mask"][i].tolist() == enc["attention_mask"], i
        assert d["labels"][i].tolist() == labels, i
        assert d["word_ids"][i].tolist() == [-1 if w is None else w for w in wids], i
        assert d["text"][i] == text
        # offsets are character offsets of the sentence
        for (s, e), w in zip(d["offset_mapping"][i].tolist(), wids):
            if w is not None and e > s:
                assert starts[w] <= s < e <= starts[w] + len(words[w])
    assert at["num_labels"] == 13 and at["truncated"] > 0


def run_qa_features(tk, questions, contexts, answers, T, stride):
    """run_qa.py's prepare_train_features (pad_on_right) with a fast tokenizer."""
    enc = tk([q.lstrip() for q in questions], contexts, truncation="only_second", max_length=T, stride=stride,
             return_overflowing_tokens=True, return_offsets_mapping=True, padding="max_length")
    starts, ends = [], []
    for i, offsets in enumerate(enc["offset_mapping"]):
        ids = enc["input_ids"][i]
        cls = ids.index(tk.cls_token_id) if tk.cls_token_id in ids else 0
        seq = enc.sequence_ids(i)
        ans = answers[enc["overflow_to_sample_mapping"][i]]
        sc = ans["answer_start"]
        ec = sc + len(ans["text"])
        a = 0
        while seq[a] != 1:
            a += 1
        b = len(ids) - 1
        while seq[b] != 1:
            b -= 1
        if not (offsets[a][0] <= sc and offsets[b][1] >= ec):
            starts.append(cls)
            ends.append(cls)
        else:
            while a < len(offsets) and offsets[a][0] <= sc:
                a += 1
            starts.append(a - 1)
            while offsets[b][1] >= ec:
                b -= 1
            ends.append(b + 1)
    return enc, starts, ends


@pytest.mark.parametrize("which", ["wp", "bpe"])
def test_qa_matches_run_qa(which, wp_dir, bpe_dir, tmp_path):
    need(KORQUAD)
    folder = folder_of(which, wp_dir, bpe_dir)
    tk = auto(folder)
    T, stride, n = 160, 48, 200
    out = tmp_path / "qa.h5"
    run("prep_qa", "--tokenizer", folder, "--input", KORQUAD, "--limit", n, "--max-seq-len", T,
        "--doc-stride", stride, "--max-query-len", 64, "--out", out)
    d, at = load(out)
    doc = json.loads(KORQUAD.read_text(encoding="utf-8"))
    qs, ctxs, answers = [], [], []
    for art in doc["data"]:
        for par in art["paragraphs"]:
            for qa in par["qas"]:
                if len(qs) < n:
                    qs.append(qa["question"])
                    ctxs.append(par["context"])
                    answers.append(qa["answers"][0])
    enc, starts, ends = run_qa_features(tk, qs, ctxs, answers, T, stride)
    assert d["input_ids"].tolist() == enc["input_ids"]
    assert d["attention_mask"].tolist() == enc["attention_mask"]
    if "token_type_ids" in enc:
        assert d["token_type_ids"].tolist() == enc["token_type_ids"]
    assert d["example_index"].tolist() == enc["overflow_to_sample_mapping"]
    assert d["start_positions"].tolist() == starts and d["end_positions"].tolist() == ends
    for i, offs in enumerate(enc["offset_mapping"]):
        seq = enc.sequence_ids(i)
        want = [list(o) if s == 1 else [-1, -1] for o, s in zip(offs, seq)]
        assert d["offset_mapping"][i].tolist() == want, i
    assert len(enc["input_ids"]) > n and at["num_features"] == len(enc["input_ids"])
    # the gold answer text is recovered from the token span wherever the window holds it
    hit = 0
    for i, (s, e) in enumerate(zip(starts, ends)):
        if e > s:
            k = enc["overflow_to_sample_mapping"][i]
            got = ctxs[k][d["offset_mapping"][i][s][0]:d["offset_mapping"][i][e][1]]
            hit += got.strip() == answers[k]["text"].strip()
    assert hit > 0.75 * n


def test_mlm_hub_equals_vocab(wp_dir, tmp_path):
    need(NSMC)
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    run("prep_mlm", "--tokenizer", wp_dir, "--tsv-column", "document", "--input", NSMC, "--limit", 300,
        "--max-seq-len", 64, "--out", a)
    run("prep_mlm", "--vocab", KCBERT, "--tsv-column", "document", "--input", NSMC, "--limit", 300,
        "--max-seq-len", 64, "--out", b)
    (da, aa), (db, ab) = load(a), load(b)
    for k in ("input_ids", "attention_mask", "token_type_ids"):
        assert (da[k] == db[k]).all(), k
    for k in ("cls_id", "sep_id", "pad_id", "mask_id", "unk_id", "vocab_sha256"):
        assert aa[k] == ab[k], k
    assert aa["tokenizer"] == "hub" and ab["tokenizer"] == "wordpiece"


# ---- unlabelled input ---------------------------------------------------------------------------------

def test_no_labels_and_plain_lines(wp_dir, tmp_path):
    need(NSMC, KORNLI, NER, KORQUAD)
    out = tmp_path / "o.h5"
    run("prep_doc_cls", "--tokenizer", wp_dir, "--input", NSMC, "--limit", 20, "--no-labels", "--out", out)
    d, at = load(out)
    assert "labels" not in d and "num_labels" not in at and "id2label" not in at and at["has_labels"] == 0
    _, rows = tsv(NSMC, 20)
    assert d["example_id"].tolist() == [r[0] for r in rows]
    # the same rows as the labelled run
    lab = tmp_path / "l.h5"
    run("prep_doc_cls", "--tokenizer", wp_dir, "--input", NSMC, "--limit", 20, "--out", lab)
    assert (load(lab)[0]["input_ids"] == d["input_ids"]).all()
    run("prep_doc_cls", "--vocab", KCBERT, "--input", NSMC, "--limit", 20, "--no-labels",
        "--label-names", "neg,pos", "--out", out)
    d, at = load(out)
    assert "labels" not in d and at["id2label"] == '["neg", "pos"]' and at["num_labels"] == 2

    lines = tmp_path / "docs.txt"
    lines.write_text("정말 재미있는 영화\n\n최악이에요\r\n", encoding="utf-8")
    run("prep_doc_cls", "--tokenizer", wp_dir, "--input", lines, "--input-format", "lines", "--out", out)
    d, at = load(out)
    assert d["text"].tolist() == ["정말 재미있는 영화", "최악이에요"]
    assert d["example_id"].tolist() == ["docs.txt:1", "docs.txt:3"] and "labels" not in d
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("하늘이 맑다\t날씨가 좋다\n", encoding="utf-8")
    run("prep_pair_cls", "--tokenizer", wp_dir, "--input", pairs, "--input-format", "lines", "--out", out)
    d, at = load(out)
    assert d["text_pair"].tolist() == ["날씨가 좋다"] and d["token_type_ids"].max() == 1 and "labels" not in d
    bad = tmp_path / "bad.txt"
    bad.write_text("only one field\n", encoding="utf-8")
    r = run("prep_pair_cls", "--tokenizer", wp_dir, "--input", bad, "--input-format", "lines", "--out", out,
            check=False)
    assert r.returncode == 1 and f"{bad}:1".encode() in r.stderr
    # KorNLI without its label column
    nolab = tmp_path / "nli.tsv"
    header, rows = tsv(KORNLI, 5)
    nolab.write_text("sentence1\tsentence2\n" + "".join(f"{r[0]}\t{r[1]}\n" for r in rows), encoding="utf-8")
    run("prep_pair_cls", "--vocab", KCBERT, "--input", nolab, "--no-labels", "--out", out)
    assert load(out)[0]["text"].tolist() == [r[0] for r in rows]

    run("prep_ner", "--tokenizer", wp_dir, "--input", lines, "--input-format", "lines", "--out", out)
    d, at = load(out)
    assert "labels" not in d and "entities" not in d and d["word_ids"].shape == d["input_ids"].shape
    assert d["word_ids"][0].max() == 2 and "num_labels" not in at
    run("prep_ner", "--tokenizer", wp_dir, "--input", NER, "--limit", 10, "--no-labels", "--out", out)
    d, at = load(out)
    assert "labels" not in d and len(d["text"]) == 10

    # KorQuAD questions without answers
    doc = json.loads(KORQUAD.read_text(encoding="utf-8"))
    for art in doc["data"]:
        for par in art["paragraphs"]:
            for qa in par["qas"]:
                del qa["answers"]
    qfile = tmp_path / "q.json"
    qfile.write_text(json.dumps({"data": doc["data"][:1]}, ensure_ascii=False), encoding="utf-8")
    run("prep_qa", "--tokenizer", wp_dir, "--input", qfile, "--limit", 8, "--no-labels", "--out", out)
    d, at = load(out)
    assert "start_positions" not in d and "end_positions" not in d
    assert d["answers"].tolist() == ["[]"] * 8 and len(d["example_id"]) == 8
    assert d["offset_mapping"].shape == d["input_ids"].shape + (2,)
    r = run("prep_qa", "--tokenizer", wp_dir, "--input", qfile, "--limit", 8, "--out", out, check=False)
    assert r.returncode == 1 and b"no answers" in r.stderr


# ---- generation with ids: encode_prompts.py / decode_generated.py ----------------------------------------

@pytest.mark.parametrize("which", ["gpt2", "bpe"])
def test_prompt_ids_round_trip(which, gpt2_dir, bpe_dir, tmp_path):
    folder = gpt2_dir if which == "gpt2" else bpe_dir
    tok = ht.load(str(folder))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("이 영화 정말\r\n\nThe meaning of life is\n", encoding="utf-8")
    enc = tmp_path / "prompts.jsonl"
    run("encode_prompts", "--tokenizer", folder, prompts, "--out", enc)
    recs = [json.loads(l) for l in enc.read_text(encoding="utf-8").splitlines()]
    assert [r["prompt"] for r in recs] == ["이 영화 정말", "The meaning of life is"]
    tk = auto(folder)
    for r in recs:
        assert r["vocab_sha256"] == tok.vocab_sha256
        assert r["eos_id"] == tk.eos_token_id  # the end-of-text id that ends a generated sample
        want = tk(r["prompt"])["input_ids"]
        if which == "bpe":  # the template's leading <s> stays, its trailing </s> goes
            assert want[0] == tk.bos_token_id and want[-1] == tk.eos_token_id
            want = want[:-1]
        assert r["prompt_ids"] == want
    # a hand-written generated.jsonl as nlptrain writes it with generate.tokenizer = ids
    cont = [tk(" 재미있다 😀")["input_ids"], tk(" 42")["input_ids"]]
    if which == "bpe":
        cont = [c[1:-1] for c in cont]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lines = [{"prompt_ids": recs[0]["prompt_ids"], "sample_ids": [cont[0], recs[0]["prompt_ids"] + cont[1]],
              "settings": {"temperature": 1.0, "vocab_sha256": tok.vocab_sha256}},
             {"prompt": recs[1]["prompt"], "prompt_ids": recs[1]["prompt_ids"], "sample_ids": [cont[1]],
              "settings": {}}]
    gen = run_dir / "generated.jsonl"
    gen.write_text("".join(json.dumps(l) + "\n" for l in lines), encoding="utf-8")
    run("decode_generated", "--tokenizer", folder, gen)
    out = [json.loads(l) for l in (run_dir / "generated_text.jsonl").read_text(encoding="utf-8").splitlines()]
    assert out[0]["prompt"] == "이 영화 정말"
    assert out[0]["samples"] == ["이 영화 정말 재미있다 😀", "이 영화 정말 42"]
    assert out[1] == {"prompt": "The meaning of life is", "samples": ["The meaning of life is 42"]}
    txt = (run_dir / "generated.txt").read_text(encoding="utf-8")
    assert "=== prompt 2 ===\nThe meaning of life is\n--- sample 1 ---\nThe meaning of life is 42\n" in txt
    # the wrong tokenizer, an id outside the vocabulary
    lines[0]["settings"]["vocab_sha256"] = "0" * 64
    gen.write_text(json.dumps(lines[0]) + "\n", encoding="utf-8")
    r = run("decode_generated", "--tokenizer", folder, gen, "--out", tmp_path, check=False)
    assert r.returncode == 1 and b"vocab_sha256" in r.stderr and f"{gen}:1".encode() in r.stderr
    gen.write_text(json.dumps({"prompt_ids": [1], "sample_ids": [[10 ** 6]]}) + "\n", encoding="utf-8")
    r = run("decode_generated", "--tokenizer", folder, gen, "--out", tmp_path, check=False)
    assert r.returncode == 1 and b"1000000" in r.stderr
    assert not (tmp_path / "generated_text.jsonl").exists()


# ---- hf_export copies the tokenizer ------------------------------------------------------------------------

def test_export_carries_tokenizer_and_logits(wp_dir, gpt2_dir, tmp_path):
    need(NSMC)
    import torch

    torch.manual_seed(0)
    _, rows = tsv(NSMC, 8)
    texts = [r[1] for r in rows]
    # BERT sequence classification with the kcbert WordPiece
    src = tmp_path / "bert_src"
    cfg = transformers.BertConfig(vocab_size=30000, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=128, num_labels=2,
                                  id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
    model = transformers.BertForSequenceClassification(cfg).eval()
    model.save_pretrained(str(src))
    auto(wp_dir).save_pretrained(str(src))
    shutil.copy(wp_dir / "vocab.txt", src / "vocab.txt")
    h5 = tmp_path / "bert.h5"
    run("hf_import", src, h5)
    _, at = load(h5)
    tok = ht.load(str(src))
    assert at["vocab_sha256"] == tok.vocab_sha256 and at["tokenizer_vocab_size"] == 30000
    assert at["tokenizer_files"].split("\n") == tok.files and at["tokenizer_sha256"] == tok.tokenizer_sha256
    out = tmp_path / "bert_export"
    run("hf_export", h5, out)
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    cfg_out = json.loads((out / "config.json").read_text())
    assert cfg_out["pad_token_id"] == 0 and cfg_out["id2label"] == {"0": "negative", "1": "positive"}
    assert "vocab_sha256" not in cfg_out and "tokenizer_files" not in cfg_out
    tk0, tk1 = auto(src), auto(out)
    m1 = transformers.AutoModelForSequenceClassification.from_pretrained(str(out)).eval()
    e0 = tk0(texts, padding=True, return_tensors="pt")
    e1 = tk1(texts, padding=True, return_tensors="pt")
    assert torch.equal(e0["input_ids"], e1["input_ids"]) and len(tk1) == 30000
    with torch.no_grad():
        assert torch.allclose(model(**e0).logits, m1(**e1).logits, atol=1e-5, rtol=0)

    # GPT-2 with the GPT-2 BPE, exported from a file without tokenizer attributes: --tokenizer, then none
    src = tmp_path / "gpt_src"
    gcfg = transformers.GPT2Config(vocab_size=50257, n_embd=32, n_layer=2, n_head=2, n_positions=64)
    gmodel = transformers.GPT2LMHeadModel(gcfg).eval()
    gmodel.save_pretrained(str(src))
    h5 = tmp_path / "gpt.h5"
    r = run("hf_import", src, h5)
    assert b"no tokenizer files" in r.stderr
    with h5py.File(h5, "a") as f:  # as an nlptrain checkpoint written without --config: no hf_config_json
        del f.attrs["hf_config_json"]
        for k in ("bos_token_id", "eos_token_id"):
            if k in f.attrs:
                del f.attrs[k]
    out = tmp_path / "gpt_export"
    run("hf_export", h5, out, "--tokenizer", gpt2_dir)
    cfg_out = json.loads((out / "config.json").read_text())
    assert cfg_out["bos_token_id"] == 50256 and cfg_out["eos_token_id"] == 50256
    tk = auto(out)
    assert len(tk) == 50257 and tk.eos_token_id == 50256
    m1 = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    ids = torch.tensor([tk(texts[0])["input_ids"][:60]])
    with torch.no_grad():
        assert torch.allclose(gmodel(ids).logits, m1(ids).logits, atol=1e-5, rtol=0)
    r = run("hf_export", h5, tmp_path / "no_tok")
    assert b"warning" in r.stderr and b"NO tokenizer" in r.stderr and b"--tokenizer" in r.stderr
