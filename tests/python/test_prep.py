"""Tests of the BERT task preprocessing tools tools/prep_{doc_cls,pair_cls,ner,qa,mlm}.py
(run: python3 -m pytest -q -rs tests/python/test_prep.py).

Every test that reads the shared corpora (NLPTRAIN_SHARED_DATA, default <source>/../shared/data, i.e.
/work/shared/data) skips with "shared data absent: <path>" when they are missing. Reference
tokenizations come from the HF `tokenizers` library directly (its own pair truncation and
question/context overflow windows), not from tools/prep_common.py.
"""
import json
import os
from collections import Counter
import subprocess
import sys
from pathlib import Path

import pytest

np = pytest.importorskip("numpy", reason="NLPTRAIN_ALL_SKIPPED: numpy is not installed")
h5py = pytest.importorskip("h5py", reason="NLPTRAIN_ALL_SKIPPED: h5py is not installed")
tokenizers = pytest.importorskip("tokenizers", reason="NLPTRAIN_ALL_SKIPPED: tokenizers is not installed")

SOURCE = Path(os.environ.get("NLPTRAIN_SOURCE_DIR") or Path(__file__).resolve().parents[2])
TOOLS = SOURCE / "tools"
SHARED = Path(os.environ.get("NLPTRAIN_SHARED_DATA") or SOURCE.parent / "shared" / "data")
KCBERT = SHARED / "vocab" / "kcbert-base" / "vocab.txt"
UNCASED = SHARED / "vocab" / "bert-base-uncased" / "vocab.txt"
NSMC_TEST = SHARED / "nsmc" / "nsmc_from_raw_test.tsv"
KORNLI_DEV = SHARED / "kornli" / "xnli.dev.ko.tsv"
NER_DEV = SHARED / "klue-ner" / "klue-ner-v1.1_dev.tsv"
KORQUAD_DEV = SHARED / "korquad" / "KorQuAD_v1.0_dev.json"

TOOL_NAMES = ["prep_doc_cls", "prep_pair_cls", "prep_ner", "prep_qa", "prep_mlm"]

sys.path.insert(0, str(TOOLS))


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


def ref_tokenizer(vocab=KCBERT, lowercase=False):
    from tokenizers import BertWordPieceTokenizer

    return BertWordPieceTokenizer(str(vocab), lowercase=lowercase, strip_accents=False,
                                  clean_text=True, handle_chinese_chars=True)


def tsv_rows(path, limit):
    lines = Path(path).read_text(encoding="utf-8").split("\n")
    header = lines[0].split("\t")
    return header, [l.split("\t") for l in lines[1:limit + 1]]


def leftovers(folder):
    return sorted(p.name for p in Path(folder).iterdir() if p.name.endswith(".tmp"))


def check_rows(d, T, cls_id, sep_id, pad_id):
    """[CLS] first, [SEP] last of the unpadded part, mask 1 then 0, [PAD] under mask 0."""
    ids, mask = d["input_ids"], d["attention_mask"]
    assert ids.shape[1] == T and ids.dtype == np.int32 and mask.dtype == np.int32
    n = mask.sum(1)
    assert (ids[:, 0] == cls_id).all()
    assert (ids[np.arange(len(ids)), n - 1] == sep_id).all()
    assert (mask == (np.arange(T)[None, :] < n[:, None])).all()
    assert (ids[mask == 0] == pad_id).all()
    assert (ids[mask == 1] != pad_id).all()


# ---- every tool --------------------------------------------------------------------------------

@pytest.mark.parametrize("tool", TOOL_NAMES)
def test_help_exits_zero(tool):
    r = run(tool, "--help")
    assert r.returncode == 0
    assert b"usage:" in r.stdout and b"--vocab" in r.stdout and b"--max-seq-len" in r.stdout


@pytest.mark.parametrize("tool", TOOL_NAMES)
def test_missing_input_file(tool, tmp_path):
    need(KCBERT)
    missing = tmp_path / "no_such_input.txt"
    out = tmp_path / "o.h5"
    r = run(tool, "--vocab", KCBERT, "--input", missing, "--out", out, check=False)
    assert r.returncode != 0
    assert str(missing).encode() in r.stderr
    assert not out.exists() and leftovers(tmp_path) == []


def test_missing_vocab(tmp_path):
    need(NSMC_TEST)
    missing = tmp_path / "vocab.txt"
    r = run("prep_doc_cls", "--vocab", missing, "--input", NSMC_TEST, "--out", tmp_path / "o.h5", check=False)
    assert r.returncode != 0 and str(missing).encode() in r.stderr
    assert not (tmp_path / "o.h5").exists()


def test_lowercase_default_and_hangul_survive(tmp_path):
    """kcbert-base (upper-case tokens, no do_lower_case) is cased; bert-base-uncased lower-cases.
    Forcing --lowercase on Korean must not strip accents (NFD would turn Hangul into jamo = [UNK])."""
    need(KCBERT, UNCASED, NSMC_TEST)
    _, at = load_run(tmp_path, "prep_doc_cls", "--input", NSMC_TEST, "--limit", 50)
    assert at["lowercase"] == 0 and at["strip_accents"] == 0
    src = tmp_path / "u.txt"
    src.write_text("Hello World\n", encoding="utf-8")
    out = tmp_path / "u.h5"
    run("prep_mlm", "--vocab", UNCASED, "--input", src, "--out", out)
    d, at = load(out)
    assert at["lowercase"] == 1
    assert list(d["input_ids"][0, :4]) == [101, 7592, 2088, 102]  # [CLS] hello world [SEP]
    out2 = tmp_path / "lc.h5"
    run("prep_doc_cls", "--vocab", KCBERT, "--lowercase", "--input", NSMC_TEST, "--limit", 200, "--out", out2)
    d2, at2 = load(out2)
    assert at2["lowercase"] == 1 and at2["strip_accents"] == 0
    real = d2["input_ids"][d2["attention_mask"] == 1]
    assert (real == at2["unk_id"]).mean() < 0.05  # with NFD it would be most of the Hangul tokens


def test_lowercase_rule_from_config_and_vocab(tmp_path):
    """do_lower_case in tokenizer_config.json/config.json wins; else lower-case iff no upper-case
    token (bracketed specials don't count); the flags override both."""
    import prep_common as pc

    v = tmp_path / "vocab.txt"
    v.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n", encoding="utf-8")
    assert pc.WordPiece(str(v)).lowercase is True
    v.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nHello\n", encoding="utf-8")
    assert pc.WordPiece(str(v)).lowercase is False
    (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": true}', encoding="utf-8")
    w = pc.WordPiece(str(v))
    assert w.lowercase is True and w.strip_accents is False and "tokenizer_config.json" in w.lowercase_reason
    assert pc.WordPiece(str(v), lowercase=False).lowercase is False
    v.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nx\n", encoding="utf-8")
    with pytest.raises(pc.DataError, match=r"\[MASK\]"):
        pc.WordPiece(str(v))


def test_longest_first_matches_tokenizers():
    """The closed-form pair truncation equals the library's for all small length combinations."""
    import prep_common as pc
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "a": 1, "b": 2}
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    for budget in (1, 2, 5, 8):
        t.enable_truncation(budget, strategy="longest_first")
        for na in range(0, 11):
            for nb in range(0, 11):
                e = t.encode(" ".join("a" * na), " ".join("b" * nb), add_special_tokens=False)
                want = (e.ids.count(1), e.ids.count(2))
                assert pc.truncate_longest_first([1] * na, [2] * nb, budget) == want, (budget, na, nb)


def load_run(tmp_path, tool, *args, name="out.h5"):
    out = tmp_path / name
    run(tool, "--vocab", KCBERT, *args, "--out", out)
    return load(out)


# ---- doc_cls ------------------------------------------------------------------------------------

def test_doc_cls_labels_and_ids_match_tsv(tmp_path):
    need(KCBERT, NSMC_TEST)
    N = 400
    d, at = load_run(tmp_path, "prep_doc_cls", "--input", NSMC_TEST, "--limit", N, "--max-seq-len", 32)
    header, rows = tsv_rows(NSMC_TEST, N)
    assert header == ["id", "document", "label"]
    assert at["task"] == "doc_cls" and at["num_labels"] == 2
    assert json.loads(at["id2label"]) == ["negative", "positive"]
    assert (at["cls_id"], at["sep_id"], at["pad_id"], at["mask_id"], at["unk_id"]) == (2, 3, 0, 4, 1)
    assert at["vocab_size"] == 30000 and at["max_seq_len"] == 32
    assert d["labels"].dtype == np.int32 and list(d["labels"]) == [int(r[2]) for r in rows]
    check_rows(d, 32, 2, 3, 0)
    assert (d["token_type_ids"] == 0).all()
    ref = ref_tokenizer().encode_batch([r[1] for r in rows], add_special_tokens=False)
    trunc = 0
    for i, e in enumerate(ref):
        want = [2] + e.ids[:30] + [3]
        trunc += len(e.ids) > 30
        assert list(d["input_ids"][i, :len(want)]) == want
    assert at["truncated"] == trunc and trunc > 0


def test_doc_cls_bad_label_names_line_and_leaves_no_output(tmp_path):
    need(KCBERT, NSMC_TEST)
    src = tmp_path / "bad.tsv"
    lines = NSMC_TEST.read_text(encoding="utf-8").split("\n")[:6]
    lines[4] = "\t".join(lines[4].split("\t")[:2] + ["7"])
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "o.h5"
    out.write_bytes(b"previous contents")
    r = run("prep_doc_cls", "--vocab", KCBERT, "--input", src, "--out", out, check=False)
    assert r.returncode != 0
    assert f"{src}:5".encode() in r.stderr and b"'7'" in r.stderr
    assert out.read_bytes() == b"previous contents"  # untouched: outputs are replaced only when complete
    assert leftovers(tmp_path) == []
    # a line with the wrong number of fields
    src.write_text("id\tdocument\tlabel\n1\tgood\t1\n2\tno label field\n", encoding="utf-8")
    r = run("prep_doc_cls", "--vocab", KCBERT, "--input", src, "--out", tmp_path / "p.h5", check=False)
    assert r.returncode != 0 and f"{src}:3".encode() in r.stderr
    assert not (tmp_path / "p.h5").exists()


def test_split_deterministic_and_disjoint(tmp_path):
    need(KCBERT, NSMC_TEST)
    N = 500
    full, _ = load_run(tmp_path, "prep_doc_cls", "--input", NSMC_TEST, "--limit", N, name="full.h5")
    runs = []
    for k in range(2):
        tr, ev = tmp_path / f"tr{k}.h5", tmp_path / f"ev{k}.h5"
        r = run("prep_doc_cls", "--vocab", KCBERT, "--input", NSMC_TEST, "--limit", N, "--out", tr,
                "--split-eval", 0.2, "--eval-out", ev)
        assert b"(train)" in r.stdout and b"(eval)" in r.stdout
        runs.append((load(tr), load(ev)))
    (t0, ta), (e0, ea) = runs[0]
    (t1, _), (e1, _) = runs[1]
    for a, b in ((t0, t1), (e0, e1)):  # same seed -> identical files
        assert all(np.array_equal(a[k], b[k]) for k in a)
    assert ta["split"] == "train" and ea["split"] == "eval"
    assert len(e0["labels"]) == 100 and len(t0["labels"]) == 400
    # disjoint and complete: the rows of the two parts are exactly the rows of the unsplit file
    key = lambda d: sorted(tuple(r) + (int(l),) for r, l in zip(d["input_ids"], d["labels"]))
    assert key(t0) + key(e0) != [] and sorted(key(t0) + key(e0)) == key(full)
    # another seed gives another split
    tr, ev = tmp_path / "trs.h5", tmp_path / "evs.h5"
    run("prep_doc_cls", "--vocab", KCBERT, "--input", NSMC_TEST, "--limit", N, "--out", tr,
        "--split-eval", 0.2, "--eval-out", ev, "--seed", 7)
    assert not np.array_equal(load(ev)[0]["input_ids"], e0["input_ids"])


# ---- pair_cls -----------------------------------------------------------------------------------

def test_pair_token_types_and_parity_with_tokenizers(tmp_path):
    need(KCBERT, KORNLI_DEV)
    N, T = 300, 40
    d, at = load_run(tmp_path, "prep_pair_cls", "--input", KORNLI_DEV, "--limit", N, "--max-seq-len", T)
    _, rows = tsv_rows(KORNLI_DEV, N)
    assert at["task"] == "pair_cls" and json.loads(at["id2label"]) == ["entailment", "neutral", "contradiction"]
    names = {"entailment": 0, "neutral": 1, "contradiction": 2}
    assert list(d["labels"]) == [names[r[2]] for r in rows]
    check_rows(d, T, 2, 3, 0)
    ids, tt, mask = d["input_ids"], d["token_type_ids"], d["attention_mask"]
    for i in range(N):
        seps = np.flatnonzero(ids[i] == 3)
        assert len(seps) == 2
        first, last = seps
        assert (tt[i, :first + 1] == 0).all()            # [CLS] a [SEP]
        assert (tt[i, first + 1:last + 1] == 1).all()    # b [SEP]
        assert (tt[i, last + 1:] == 0).all() and (mask[i, last + 1:] == 0).all()
    ref = ref_tokenizer()
    ref.enable_truncation(T, strategy="longest_first")
    ref.enable_padding(length=T, pad_id=0, pad_token="[PAD]")
    enc = ref.encode_batch([(r[0], r[1]) for r in rows])
    assert np.array_equal(ids, np.array([e.ids for e in enc]))
    assert np.array_equal(tt, np.array([e.type_ids for e in enc]))
    plain = ref_tokenizer()
    want_trunc = sum(len(a.ids) + len(b.ids) > T - 3 for a, b in zip(
        plain.encode_batch([r[0] for r in rows], add_special_tokens=False),
        plain.encode_batch([r[1] for r in rows], add_special_tokens=False)))
    assert at["truncated"] == want_trunc > 0


def test_pair_unknown_label_names_line(tmp_path):
    need(KCBERT)
    src = tmp_path / "nli.tsv"
    src.write_text("sentence1\tsentence2\tgold_label\n가\t나\tneutral\n다\t라\t-\n", encoding="utf-8")
    out = tmp_path / "o.h5"
    r = run("prep_pair_cls", "--vocab", KCBERT, "--input", src, "--out", out, check=False)
    assert r.returncode != 0
    assert f"{src}:3".encode() in r.stderr and b"unknown label '-'" in r.stderr
    assert not out.exists() and leftovers(tmp_path) == []


# ---- ner ----------------------------------------------------------------------------------------

def parse_ner_reference(path):
    """{sentence id: (text, char tags)} read independently of tools/prep_ner.py."""
    out, cur, sid = {}, None, None
    for line in Path(path).read_text(encoding="utf-8").split("\n"):
        if line.startswith("## klue"):
            sid = line[3:].split("\t")[0]
            cur = None
        elif line.startswith("##"):
            continue
        elif line == "":
            cur = None
        else:
            c, t = line.split("\t")
            if cur is None:
                cur = out[sid] = ([], [])
            cur[0].append(c)
            cur[1].append(t)
    return {k: ("".join(c), t) for k, (c, t) in out.items()}


def gold_entities(tags):
    out, cur = [], None
    for i, t in enumerate(list(tags) + ["O"]):
        if t.startswith("I-") and cur and cur[0] == t[2:]:
            cur[2] = i + 1
            continue
        if cur:
            out.append(tuple(cur))
            cur = None
        if t != "O":
            cur = [t[2:], i, i + 1]
    return out


# Observed on KLUE NER v1.1 dev (5,000 sentences, 14,257 gold entities) with the kcbert-base vocabulary:
NER_GOLD = 14257
NER_WORD_LEVEL = 13113   # gold entities whose (type, first word, last word) is decoded from the labels
NER_CHAR_EXACT = 5238    # ... whose exact character span is decoded (default labelling)
NER_CHAR_EXACT_ALL = 11861  # ... with --label-all-subtokens


def test_ner_labels_survive_alignment(tmp_path):
    """Every labelled token carries the tag of its first character; labelled = first sub-token of a
    whitespace word. Decoding the gold labels gives back entity spans:
      - in words: NER_WORD_LEVEL of NER_GOLD (92.1%). The rest are entities that the first-character
        rule cannot express: an entity starting inside a word after an O character ("딸(32)과",
        "'동북아 ..."), or two entities in one word;
      - in exact characters: NER_CHAR_EXACT (36.7%), because a Korean word is usually entity +
        particle ("경찰은" = OG "경찰" + "은") and a word-level label cannot say where inside the word
        the entity ends (the decoder extends it to the end of the word);
      - with --label-all-subtokens: NER_CHAR_EXACT_ALL (83.2%); the rest have an entity boundary
        inside a WordPiece token (e.g. "16" "##명을" for QT "16명").
    """
    need(KCBERT, NER_DEV)
    import prep_ner

    ref = parse_ner_reference(NER_DEV)
    d, at = load_run(tmp_path, "prep_ner", "--input", NER_DEV)
    id2label = json.loads(at["id2label"])
    assert id2label == ["O", "B-PS", "I-PS", "B-LC", "I-LC", "B-OG", "I-OG", "B-DT", "I-DT",
                        "B-TI", "I-TI", "B-QT", "I-QT"]
    assert at["task"] == "ner" and at["num_labels"] == 13 and at["truncated"] == 0
    T = at["max_seq_len"]
    assert len(d["text"]) == len(ref) == 5000
    check_rows(d, T, 2, 3, 0)
    lab, off, wid = d["labels"], d["offset_mapping"], d["word_ids"]
    assert off.shape == (5000, T, 2) and off.dtype == np.int32
    special = d["attention_mask"] == 0
    special[:, 0] = True
    special[np.arange(5000), d["attention_mask"].sum(1) - 1] = True
    assert (lab[special] == -100).all() and (off[special] == -1).all() and (wid[special] == -1).all()
    n_lab = word_lvl = char_exact = n_gold = 0
    real_pos = [np.flatnonzero(~sp).tolist() for sp in special]
    for i, (sid, text) in enumerate(zip(d["example_id"], d["text"])):
        rtext, tags = ref[sid]
        assert text == rtext
        gold = gold_entities(tags)
        assert json.loads(d["entities"][i]) == [list(g) for g in gold]
        lab_i, off_i, wid_i = lab[i].tolist(), off[i].tolist(), wid[i].tolist()
        word_no, w = [], -1  # whitespace-word number of each character
        for j, c in enumerate(text):
            w += c != " " and (j == 0 or text[j - 1] == " ")
            word_no.append(w)
        prev_word = -1
        for k in real_pos[i]:
            a, b = off_i[k]
            assert 0 <= a < b <= len(text) and text[a] != " "
            assert wid_i[k] == word_no[a]
            if wid_i[k] != prev_word:  # first sub-token of its word
                n_lab += 1
                assert id2label[lab_i[k]] == tags[a]  # the tag of the token's first character
            else:
                assert lab_i[k] == -100
            prev_word = wid_i[k]
        ents = prep_ner.decode_entities(lab_i, lab_i, off_i, text)
        char_exact += len(set(gold) & set(ents))
        # word level: (type, word of the first char, word of the last char), as multisets
        wof = prep_ner.word_index(text)
        pos = [k for k in real_pos[i] if lab_i[k] != -100]
        wents = Counter((t, wid_i[pos[a]], wid_i[pos[b - 1]])
                        for t, a, b in prep_ner.entities_from_tags([id2label[lab_i[k]] for k in pos]))
        word_lvl += sum((Counter((t, wof[a], wof[b - 1]) for t, a, b in gold) & wents).values())
        n_gold += len(gold)
    assert n_lab == int((lab != -100).sum())
    assert n_gold == NER_GOLD
    assert word_lvl == NER_WORD_LEVEL
    assert char_exact == NER_CHAR_EXACT

    d2, at2 = load_run(tmp_path, "prep_ner", "--input", NER_DEV, "--label-all-subtokens", name="all.h5")
    assert at2["label_all_subtokens"] == 1
    exact_all = 0
    for i, text in enumerate(d2["text"]):
        lab2 = d2["labels"][i]
        real = d2["attention_mask"][i] == 1
        real[0] = False
        real[real.sum()] = False  # the final [SEP]
        assert (lab2[1:-1][real[1:-1]] != -100).all()
        gold = gold_entities(ref[d2["example_id"][i]][1])
        exact_all += len(set(gold) & set(prep_ner.decode_entities(lab2, lab2, d2["offset_mapping"][i], text,
                                                                  label_all=True)))
    assert exact_all == NER_CHAR_EXACT_ALL


def test_ner_split_by_sentence_and_bad_tag(tmp_path):
    need(KCBERT, NER_DEV)
    tr, ev = tmp_path / "tr.h5", tmp_path / "ev.h5"
    run("prep_ner", "--vocab", KCBERT, "--input", NER_DEV, "--limit", 400, "--out", tr,
        "--split-eval", 0.25, "--eval-out", ev)
    a, _ = load(tr)
    b, _ = load(ev)
    ids_a, ids_b = set(a["example_id"]), set(b["example_id"])
    assert len(ids_a) == 300 and len(ids_b) == 100 and not ids_a & ids_b
    ref_ids = list(parse_ner_reference(NER_DEV))[:400]
    assert ids_a | ids_b == set(ref_ids)
    bad = tmp_path / "bad.tsv"
    bad.write_text("## s1\t<가:PS>나\n가\tB-PS\n나\tO\n\n## s2\t다\n다\tB-XX\n", encoding="utf-8")
    r = run("prep_ner", "--vocab", KCBERT, "--input", bad, "--out", tmp_path / "o.h5", check=False)
    assert r.returncode != 0 and f"{bad}:6".encode() in r.stderr and b"B-XX" in r.stderr
    assert not (tmp_path / "o.h5").exists() and leftovers(tmp_path) == []


# ---- qa -----------------------------------------------------------------------------------------

# Observed on KorQuAD 1.0 dev (5,774 questions, one gold answer each) with kcbert-base, T=384,
# doc stride 128, max query 64:
QA_FEATURES = 6697
QA_FIT = 5774        # questions whose answer lies entirely inside at least one window (all of them)
QA_EXACT = 4511      # ... recovered exactly from the token span
QA_MISALIGNED = 1263  # ... whose answer starts or ends inside a WordPiece token (see the test)


def test_qa_answers_recovered_from_token_spans(tmp_path):
    """For every feature whose window holds the answer, context[offset[start][0]:offset[end][1]] is
    the answer (whitespace-trimmed, as HF/SQuAD normalisation does: 3 dev answers carry spaces).
    QA_MISALIGNED answers cannot be exact: their first or last character is in the middle of a
    WordPiece token, almost always a noun fused with its particle ("임수경" in "임", "##수", "##경을";
    "시위" in "시위를"), so the smallest token span covering the answer also covers the particle.
    The test checks that this is so for every one of them, and that every aligned answer is exact.
    (This caps exact match at QA_EXACT/QA_FIT = 78.1% for this vocabulary; published KcBERT-base
    KorQuAD dev is EM 60.3 / F1 84.4.)"""
    need(KCBERT, KORQUAD_DEV)
    d, at = load_run(tmp_path, "prep_qa", "--input", KORQUAD_DEV)
    assert at["task"] == "qa" and at["max_seq_len"] == 384 and at["doc_stride"] == 128
    assert at["num_examples"] == 5774 and at["num_articles"] == 140 and at["num_features"] == QA_FEATURES
    ctx, answers, exi = d["context"], [json.loads(x) for x in d["answers"]], d["example_index"]
    st, en, off, tt = d["start_positions"], d["end_positions"], d["offset_mapping"], d["token_type_ids"]
    assert len(st) == QA_FEATURES and len(d["example_id"]) == 5774
    check_rows(d, 384, 2, 3, 0)
    assert ((off[..., 0] >= 0) == (tt == 1) & (d["input_ids"] != 3)).all()  # context tokens only
    src = json.loads(KORQUAD_DEV.read_text(encoding="utf-8"))
    starts = {qa["id"]: qa["answers"][0]["answer_start"]
              for art in src["data"] for p in art["paragraphs"] for qa in p["qas"]}
    fit, exact, misaligned = set(), set(), set()
    for i in range(len(st)):
        e = exi[i]
        t = answers[e][0]
        a0 = starts[d["example_id"][e]] + len(t) - len(t.lstrip())
        a1 = starts[d["example_id"][e]] + len(t.rstrip())
        cs = np.flatnonzero(off[i, :, 0] >= 0)
        inside = off[i, cs[0], 0] <= a0 and off[i, cs[-1], 1] >= a1
        if st[i] == 0:
            assert en[i] == 0 and not inside
            continue
        assert inside and cs[0] <= st[i] <= en[i] <= cs[-1]
        fit.add(e)
        span = ctx[e][off[i, st[i], 0]:off[i, en[i], 1]]
        aligned = a0 in set(off[i, cs, 0]) and a1 in set(off[i, cs, 1])
        if span == t.strip():
            exact.add(e)
            assert aligned
        else:
            misaligned.add(e)
            assert not aligned and t.strip() in span  # the covering span, a bit longer
    assert exact.isdisjoint(misaligned)
    assert len(fit) == QA_FIT and len(exact) == QA_EXACT and len(misaligned) == QA_MISALIGNED


def test_qa_windows_match_tokenizers_overflow(tmp_path):
    """Features equal the `tokenizers` library's own only_second truncation with stride 128
    (HF run_qa.py's windowing) on the first 300 questions."""
    need(KCBERT, KORQUAD_DEV)
    d, _ = load_run(tmp_path, "prep_qa", "--input", KORQUAD_DEV, "--limit", 300)
    ref = ref_tokenizer()
    ref.enable_truncation(384, stride=128, strategy="only_second")
    ref.enable_padding(length=384, pad_id=0, pad_token="[PAD]")
    feats = []
    for i, e in enumerate(ref.encode_batch([(q.lstrip(), c) for q, c in zip(d["question"], d["context"])])):
        feats += [(i, x) for x in [e] + e.overflowing]
    assert len(feats) == len(d["input_ids"]) > 300
    assert list(d["example_index"]) == [i for i, _ in feats]
    assert np.array_equal(d["input_ids"], np.array([x.ids for _, x in feats]))
    assert np.array_equal(d["token_type_ids"], np.array([x.type_ids for _, x in feats]))
    seq = np.array([[s if s is not None else -1 for s in x.sequence_ids] for _, x in feats])
    want = np.where((seq == 1)[..., None], np.array([x.offsets for _, x in feats]), -1)
    assert np.array_equal(d["offset_mapping"], want)


def test_qa_split_by_article(tmp_path):
    need(KCBERT, KORQUAD_DEV)
    outs = []
    for k in range(2):
        tr, ev = tmp_path / f"tr{k}.h5", tmp_path / f"ev{k}.h5"
        run("prep_qa", "--vocab", KCBERT, "--input", KORQUAD_DEV, "--limit", 600, "--out", tr,
            "--split-eval", 0.3, "--eval-out", ev)
        outs.append((load(tr), load(ev)))
    (a, aa), (b, ba) = outs[0]
    assert all(np.array_equal(a[k], outs[1][0][0][k]) for k in a)
    assert all(np.array_equal(b[k], outs[1][1][0][k]) for k in b)
    src = json.loads(KORQUAD_DEV.read_text(encoding="utf-8"))
    art_of = [i for i, art in enumerate(src["data"]) for p in art["paragraphs"] for _ in p["qas"]][:600]
    n_art = len(set(art_of))
    assert aa["num_articles"] + ba["num_articles"] == n_art and ba["num_articles"] == round(0.3 * n_art)
    assert not set(a["example_id"]) & set(b["example_id"])
    assert len(a["example_id"]) + len(b["example_id"]) == 600
    assert not set(a["context"]) & set(b["context"])  # no context leaks across the split
    assert a["example_index"].max() == len(a["example_id"]) - 1 and b["example_index"].max() == len(b["example_id"]) - 1


def test_qa_bad_answer_names_record(tmp_path):
    need(KCBERT)
    src = tmp_path / "q.json"
    src.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [{"context": "서울은 수도다.", "qas": [
        {"id": "q1", "question": "수도는?", "answers": [{"text": "서울", "answer_start": 0}]},
        {"id": "q2", "question": "무엇?", "answers": [{"text": "부산", "answer_start": 0}]}]}]}]},
        ensure_ascii=False), encoding="utf-8")
    r = run("prep_qa", "--vocab", KCBERT, "--input", src, "--out", tmp_path / "o.h5", check=False)
    assert r.returncode != 0 and str(src).encode() in r.stderr and b"q2" in r.stderr
    assert b"data[0].paragraphs[0].qas[1]" in r.stderr
    assert not (tmp_path / "o.h5").exists() and leftovers(tmp_path) == []


# ---- mlm ----------------------------------------------------------------------------------------

def test_mlm_rows_well_formed(tmp_path):
    need(KCBERT, NSMC_TEST)
    N, T = 3000, 48
    d, at = load_run(tmp_path, "prep_mlm", "--input", NSMC_TEST, "--tsv-column", "document",
                     "--limit", N, "--max-seq-len", T)
    assert "labels" not in d and at["task"] == "mlm" and at["num_labels"] == 0
    check_rows(d, T, 2, 3, 0)
    assert (d["token_type_ids"] == 0).all()
    ids, mask = d["input_ids"], d["attention_mask"]
    assert at["num_tokens"] == mask.sum()
    _, rows = tsv_rows(NSMC_TEST, N)
    ref = [e.ids for e in ref_tokenizer().encode_batch([r[1] for r in rows], add_special_tokens=False)]
    stream = [t for r in ids for t in r[r != 0] if t not in (2, 3)]
    assert stream == [t for e in ref for t in e]  # every token, in order, none lost or added
    assert (ids == 4).sum() == 0  # no masking here
    # greedy: the next row's first segment would not have fitted in this row
    n = mask.sum(1)
    for r in range(len(ids) - 1):
        seps = np.flatnonzero(ids[r + 1] == 3)
        first_seg = seps[0]  # [CLS] + tokens up to its first [SEP] (exclusive)
        assert n[r] + first_seg > T
    assert at["truncated"] == sum(len(e) > T - 2 for e in ref) > 0
    assert at["num_documents"] == N


def test_mlm_plain_text_and_split(tmp_path):
    need(KCBERT)
    src = tmp_path / "docs.txt"
    src.write_text("".join(f"문서 번호 {i} 입니다.\n\n" for i in range(100)), encoding="utf-8")
    tr, ev = tmp_path / "tr.h5", tmp_path / "ev.h5"
    run("prep_mlm", "--vocab", KCBERT, "--input", src, "--out", tr, "--split-eval", 0.1, "--eval-out", ev,
        "--max-seq-len", 32)
    a, aa = load(tr)
    b, ba = load(ev)
    assert aa["num_documents"] == 90 and ba["num_documents"] == 10
    tok = ref_tokenizer()

    def documents(d):
        out = []
        for r, m in zip(d["input_ids"], d["attention_mask"]):
            body = r[1:m.sum()]  # after [CLS], up to and including the last [SEP]
            cuts = np.flatnonzero(body == 3)
            out += [tok.decode([int(t) for t in seg]) for seg in np.split(body, cuts + 1)[:-1]]
        return [s.replace("[SEP]", "").strip() for s in out]

    da, db = documents(a), documents(b)
    assert len(da) == 90 and len(db) == 10
    assert set(da) | set(db) == {tok.decode(tok.encode(f"문서 번호 {i} 입니다.").ids[1:-1]) for i in range(100)}
    assert not set(da) & set(db)
