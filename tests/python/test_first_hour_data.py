"""Data as the Hugging Face Hub ships it, and the messages for a model or task mismatch.

- tools/make_dataset.py on parquet (written here with pyarrow), JSON Lines and CSV files with a named
  text column, and on a downloaded dataset folder (configurations, split files, `.cache/`): the ids
  are those of run_clm's procedure, implemented below from its description (each row of the text
  column through tokenizer(...), concatenated, cut into block_size blocks with the remainder dropped
  per map batch of 1000 rows), applied with transformers to the same text;
- tools/predict_text.py given GPT-2 weights, and the prep tools given a GPT-2 tokenizer or another
  task's data, name the mismatch.

The text is WikiText-2 (shared data), laid out as the Hub's Salesforce/wikitext parquet rows: one row
per line, with its "\\n", and an empty row between paragraphs. Skipped, saying so, without the shared
data, pyarrow or transformers.
"""
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

np = pytest.importorskip("numpy", reason="NLPTRAIN_ALL_SKIPPED: numpy is not installed")
h5py = pytest.importorskip("h5py", reason="NLPTRAIN_ALL_SKIPPED: h5py is not installed")

SOURCE = Path(os.environ.get("NLPTRAIN_SOURCE_DIR") or Path(__file__).resolve().parents[2])
TOOLS = SOURCE / "tools"
SHARED = Path(os.environ.get("NLPTRAIN_SHARED_DATA") or SOURCE.parent / "shared" / "data")
WIKI = SHARED / "wikitext2" / "wiki.test.raw"
GPT2_VOCAB = SHARED / "vocab" / "gpt2"
BERT_VOCAB = SHARED / "vocab" / "kcbert-base" / "vocab.txt"
BLOCK = 64


def tool(name, *args, check=True):
    r = subprocess.run([sys.executable, str(TOOLS / name), *map(str, args)], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"{name} {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr}")
    return r


def read(path, name):
    with h5py.File(path, "r") as f:
        return f[name][()]


def attr(path, name):
    with h5py.File(path, "r") as f:
        v = f.attrs[name]
    return v.decode() if isinstance(v, bytes) else v


# ---- inputs ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rows():
    """WikiText-2 as the Hub's parquet rows: 2,500 rows (so run_clm's 1000-row map batches matter)."""
    if not WIKI.is_file():
        pytest.skip(f"shared data absent: {WIKI} (NLPTRAIN_SHARED_DATA)")
    lines = WIKI.read_text(encoding="utf-8").replace("\r\n", "\n").split("\n")
    out = []
    for ln in lines:
        if not ln.strip():
            continue
        if ln.lstrip().startswith("= ") and out:
            out.append("")  # the Hub's rows: an empty row before each heading
        out.append(ln + "\n")
        if len(out) >= 2500:
            break
    out[7] = "Quotes \"inside\", commas, a tab\there and ünïcödé, 한국어 텍스트\n"
    return out


def write_parquet(path, texts, column="text"):
    pa = pytest.importorskip("pyarrow", reason="python package 'pyarrow' is not installed")
    import pyarrow.parquet as pq
    table = pa.table({"id": list(range(len(texts))), column: texts})
    pq.write_table(table, str(path), row_group_size=700)  # several row groups, as large Hub files have


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    """A Hub GPT-2 tokenizer folder (GPT-2's BPE, saved by transformers) with config.json."""
    if not (GPT2_VOCAB / "encoder.json").is_file():
        pytest.skip(f"shared data absent: {GPT2_VOCAB}")
    transformers = pytest.importorskip("transformers", reason="python package 'transformers' is not installed")
    d = tmp_path_factory.mktemp("gpt2")
    vocab = json.loads((GPT2_VOCAB / "encoder.json").read_text(encoding="utf-8"))
    merges = [tuple(l.split(" ")) for l in (GPT2_VOCAB / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:] if l]
    tok = transformers.GPT2TokenizerFast(vocab=vocab, merges=merges)
    assert len(tok) == 50257
    tok.save_pretrained(d)
    (d / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 50257}), encoding="utf-8")
    return d


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    """A Hub BERT tokenizer folder: its post-processor adds [CLS] ... [SEP] to every row."""
    if not BERT_VOCAB.is_file():
        pytest.skip(f"shared data absent: {BERT_VOCAB}")
    transformers = pytest.importorskip("transformers", reason="python package 'transformers' is not installed")
    d = tmp_path_factory.mktemp("bert")
    tok = transformers.BertTokenizerFast(vocab=str(BERT_VOCAB), do_lower_case=False)
    assert len(tok) == 30000
    tok.save_pretrained(d)
    return d


# ---- run_clm's procedure, from its description ------------------------------------------------------

def run_clm_tokens(folder, texts):
    """tokenize_function: tokenizer(examples[text_column_name]) on every row, each row on its own."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(folder))
    return [tok(texts[i:i + 1000])["input_ids"] for i in range(0, len(texts), 1000)]


def run_clm_blocks(folder, texts, block_size=BLOCK):
    """group_texts under datasets' map(batched=True, batch_size=1000): per batch, concatenate, keep
    len // block_size * block_size tokens, cut into blocks."""
    out = []
    for batch in run_clm_tokens(folder, texts):
        cat = [t for ids in batch for t in ids]
        total = len(cat) // block_size * block_size
        out += [cat[i:i + block_size] for i in range(0, total, block_size)]
    return np.array(out, dtype=np.int32)


def run_clm_stream(folder, texts):
    return np.array([t for batch in run_clm_tokens(folder, texts) for ids in batch for t in ids], dtype=np.int32)


# ---- make_dataset.py on the Hub's files ------------------------------------------------------------

@pytest.mark.parametrize("tok_name", ["gpt2", "bert"])
def test_parquet_rows_are_run_clm_blocks(tok_name, rows, gpt2_folder, bert_folder, tmp_path):
    folder = gpt2_folder if tok_name == "gpt2" else bert_folder
    pq_path = tmp_path / "train-00000-of-00001.parquet"
    write_parquet(pq_path, rows)
    ref = run_clm_blocks(folder, rows)
    out = tmp_path / "blocks.h5"
    r = tool("make_dataset.py", "--tokenizer", folder, "--layout", "rows", "--seq-len", BLOCK,
             "--group-rows", 1000, "--out", out, pq_path)
    got = read(out, "input_ids")
    assert got.shape == ref.shape and np.array_equal(got, ref), (got.shape, ref.shape)
    dropped = len(run_clm_stream(folder, rows)) - ref.size
    assert dropped > 0
    assert f"{dropped} tokens dropped at the ends of 3 groups" in r.stderr
    # the stream layout: every token of run_clm's tokenisation, in order
    tool("make_dataset.py", "--tokenizer", folder, "--out", tmp_path / "stream.h5", pq_path)
    stream = read(tmp_path / "stream.h5", "tokens")
    assert np.array_equal(stream, run_clm_stream(folder, rows))
    assert attr(tmp_path / "stream.h5", "text_column") == "text"
    # without --group-rows: one concatenation; the first 1000 rows' blocks are run_clm's
    tool("make_dataset.py", "--tokenizer", folder, "--layout", "rows", "--seq-len", BLOCK, "--out",
         tmp_path / "whole.h5", pq_path)
    whole = read(tmp_path / "whole.h5", "input_ids")
    first = run_clm_blocks(folder, rows[:1000])
    assert np.array_equal(whole[:len(first)], first)
    assert len(whole) == len(run_clm_stream(folder, rows)) // BLOCK >= len(ref)
    if len(run_clm_stream(folder, rows[:1000])) % BLOCK:  # run_clm drops the first group's remainder: a shift
        assert not np.array_equal(whole[len(first):len(ref)], ref[len(first):])
    if tok_name == "bert":  # the post-processor's [CLS] ... [SEP] on every row, as tokenizer(row) gives
        assert stream[0] == 2 and (stream == 3).sum() == len(rows)


def test_jsonl_json_and_csv_give_the_parquet_ids(rows, gpt2_folder, tmp_path):
    write_parquet(tmp_path / "t.parquet", rows, column="content")
    with open(tmp_path / "t.jsonl", "w", encoding="utf-8") as f:
        for i, t in enumerate(rows):
            f.write(json.dumps({"id": i, "content": t}, ensure_ascii=i % 2 == 0) + "\n")
    (tmp_path / "t.json").write_text(json.dumps([{"content": t} for t in rows]), encoding="utf-8")
    with open(tmp_path / "t.csv", "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "content"])
        w.writerows([i, t] for i, t in enumerate(rows))
    ref = run_clm_stream(gpt2_folder, rows)
    for name in ("t.parquet", "t.jsonl", "t.json", "t.csv"):
        out = tmp_path / (name + ".h5")
        tool("make_dataset.py", "--tokenizer", gpt2_folder, "--text-column", "content", "--out", out, tmp_path / name)
        assert np.array_equal(read(out, "tokens"), ref), name
    # the default column is `text`, and a missing one is named with the columns the file has
    r = tool("make_dataset.py", "--tokenizer", gpt2_folder, "--out", tmp_path / "x.h5", tmp_path / "t.parquet", check=False)
    assert r.returncode == 1
    assert f"'{tmp_path / 't.parquet'}' has no column 'text' (its columns: id, content); name the column " \
           f"with --text-column" in r.stderr
    r = tool("make_dataset.py", "--tokenizer", gpt2_folder, "--out", tmp_path / "x.h5", tmp_path / "t.csv", check=False)
    assert "has no column 'text' (its columns: id, content)" in r.stderr
    assert not (tmp_path / "x.h5").exists() and not list(tmp_path.glob(".x.h5.*"))


def write_all_forms(d, texts):
    """The same text as a .txt file (the rows concatenated: one line per row) and as parquet, JSON Lines
    and CSV rows (column text)."""
    (d / "t.txt").write_text("".join(texts), encoding="utf-8", newline="")
    write_parquet(d / "t.parquet", texts)
    with open(d / "t.jsonl", "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    with open(d / "t.csv", "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text"])
        w.writerows([t] for t in texts)
    return [d / n for n in ("t.txt", "t.parquet", "t.jsonl", "t.csv")]


@pytest.mark.parametrize("tok_name", ["gpt2-folder", "bert-folder", "gpt2", "byte"])
def test_txt_parquet_jsonl_and_csv_of_the_same_text_give_the_same_ids(tok_name, rows, gpt2_folder, bert_folder,
                                                                      tmp_path):
    """One rule for every input: a .txt line (with its "\n") is an example as a row is, each tokenized on
    its own: the ids of run_clm on that .txt file (its text loader) and on the rows. The text is the first
    1,200 lines of WikiText-2 with two blank lines before each heading, one row per line with its "\n"."""
    texts = []
    for line in WIKI.read_text(encoding="utf-8").splitlines(keepends=True)[:1200]:
        texts += ["\n", "\n", line] if line.lstrip().startswith("= ") and texts else [line]
    assert all(t.endswith("\n") and "\n" not in t[:-1] for t in texts) and rows
    spec = {"gpt2-folder": [gpt2_folder], "bert-folder": [bert_folder], "gpt2": ["gpt2", "--vocab-dir", GPT2_VOCAB],
            "byte": ["byte"]}[tok_name]
    ids = {}
    for path in write_all_forms(tmp_path, texts):
        out = tmp_path / (path.name + ".h5")
        tool("make_dataset.py", "--tokenizer", *spec, "--out", out, path)
        ids[path.suffix] = read(out, "tokens")
    for suffix in (".parquet", ".jsonl", ".csv"):
        assert np.array_equal(ids[suffix], ids[".txt"]), suffix
    if tok_name == "byte":
        assert bytes(ids[".txt"].astype(np.uint8)) == "".join(texts).encode("utf-8")
        return
    folder = bert_folder if tok_name == "bert-folder" else gpt2_folder
    assert np.array_equal(ids[".txt"], run_clm_stream(folder, texts))
    if tok_name != "bert-folder":  # line by line is not the file as one text
        from transformers import AutoTokenizer
        whole = AutoTokenizer.from_pretrained(str(gpt2_folder))("".join(texts))["input_ids"]
        assert len(whole) < len(ids[".txt"])  # one text merges the blank lines' "\n"s


def test_an_empty_tokenizer_is_named_not_the_data(rows, tmp_path):
    """A tokenizer.json whose vocabulary is empty gives no ids for any text: the message says the
    tokenizer produced no tokens, naming it, and does not say the inputs have no text."""
    tokenizers = pytest.importorskip("tokenizers", reason="python package 'tokenizers' is not installed")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab={}, merges=[]))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel()
    folder = tmp_path / "empty-tok"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    texts = [t for t in rows if t][:200]
    for path in write_all_forms(tmp_path, texts)[:2]:
        r = tool("make_dataset.py", "--tokenizer", folder, "--out", tmp_path / "x.h5", path, check=False)
        assert r.returncode == 1
        chars = sum(len(t) for t in texts)
        assert (f"make_dataset.py: error: the tokenizer '{folder}' produced no tokens from {chars} characters of "
                f"text in '{path}' (its vocabulary has 0 tokens): the tokenizer, not the data, is at fault") in r.stderr
        assert "contain no text" not in r.stderr
        assert not (tmp_path / "x.h5").exists() and not list(tmp_path.glob(".x.h5.*"))
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")  # no text at all: the inputs are named
    r = tool("make_dataset.py", "--tokenizer", folder, "--out", tmp_path / "x.h5", tmp_path / "empty.txt", check=False)
    assert r.returncode == 1 and f"the inputs contain no text (0 tokens): '{tmp_path / 'empty.txt'}'" in r.stderr


def test_bad_rows_are_named(gpt2_folder, tmp_path):
    write_parquet(tmp_path / "n.parquet", ["a\n", None, "b\n"])
    r = tool("make_dataset.py", "--tokenizer", gpt2_folder, "--out", tmp_path / "x.h5", tmp_path / "n.parquet", check=False)
    assert r.returncode == 1 and f"'{tmp_path / 'n.parquet'}' row 1: column 'text' is null, not text" in r.stderr
    (tmp_path / "n.jsonl").write_text('{"text": "a"}\n{"text": 3}\n', encoding="utf-8")
    r = tool("make_dataset.py", "--tokenizer", gpt2_folder, "--out", tmp_path / "x.h5", tmp_path / "n.jsonl", check=False)
    assert r.returncode == 1 and "row 1: column 'text' is a int ('3'), not text" in r.stderr
    r = tool("make_dataset.py", "--tokenizer", gpt2_folder, "--text-column", "body", "--out", tmp_path / "x.h5",
             WIKI, check=False)
    assert r.returncode == 1 and "--text-column applies to parquet, JSON Lines and CSV inputs" in r.stderr
    assert not (tmp_path / "x.h5").exists()


@pytest.fixture(scope="module")
def hub_folder(tmp_path_factory, rows):
    """What `hf download --repo-type dataset Salesforce/wikitext --local-dir DIR` leaves: one folder per
    configuration with train/validation/test parquet files, README.md, and .cache/huggingface/."""
    d = tmp_path_factory.mktemp("wikitext")
    parts = {"train": rows[:1500], "validation": rows[1500:2000], "test": rows[2000:]}
    for config in ("wikitext-2-raw-v1", "wikitext-2-v1"):
        (d / config).mkdir()
        for split, texts in parts.items():
            write_parquet(d / config / f"{split}-00000-of-00001.parquet",
                          texts if config.endswith("raw-v1") else [t.upper() for t in texts])
    (d / "README.md").write_text("---\nconfigs: ...\n---\n", encoding="utf-8")
    (d / ".cache" / "huggingface" / "download" / "wikitext-2-raw-v1").mkdir(parents=True)
    (d / ".cache" / "huggingface" / "download" / "wikitext-2-raw-v1" / "train-00000-of-00001.parquet.metadata").write_text("x")
    return d, parts


def test_dataset_folder_with_config_and_splits(hub_folder, gpt2_folder, tmp_path):
    d, parts = hub_folder
    for split in ("train", "validation", "test"):
        out = tmp_path / f"{split}.h5"
        tool("make_dataset.py", "--tokenizer", gpt2_folder, "--config", "wikitext-2-raw-v1", "--split", split,
             "--out", out, d)
        assert np.array_equal(read(out, "tokens"), run_clm_stream(gpt2_folder, parts[split])), split
        assert attr(out, "source") == str(d / "wikitext-2-raw-v1" / f"{split}-00000-of-00001.parquet")
    # several configurations and none chosen; an unknown one; an unknown split; --split on a file
    r = tool("make_dataset.py", "--tokenizer", gpt2_folder, "--out", tmp_path / "x.h5", d, check=False)
    assert r.returncode == 1 and (f"dataset folder '{d}' has several configurations: wikitext-2-raw-v1, wikitext-2-v1; "
                                  f"choose one with --config NAME") in r.stderr
    r = tool("make_dataset.py", "--tokenizer", gpt2_folder, "--config", "wikitext-103-raw-v1", "--out",
             tmp_path / "x.h5", d, check=False)
    assert r.returncode == 1 and ("has no configuration 'wikitext-103-raw-v1' (it has: wikitext-2-raw-v1, "
                                  "wikitext-2-v1)") in r.stderr
    r = tool("make_dataset.py", "--tokenizer", gpt2_folder, "--config", "wikitext-2-raw-v1", "--split", "dev2",
             "--out", tmp_path / "x.h5", d, check=False)
    assert r.returncode == 1 and "--split dev2: give train, validation or test" in r.stderr
    r = tool("make_dataset.py", "--tokenizer", gpt2_folder, "--split", "train", "--out", tmp_path / "x.h5",
             d / "wikitext-2-raw-v1" / "train-00000-of-00001.parquet", check=False)
    assert r.returncode == 1 and "--split applies to a dataset folder" in r.stderr
    assert not (tmp_path / "x.h5").exists()


def test_dataset_folder_split_names(gpt2_folder, tmp_path):
    """Shards in name order; `valid`/`dev` name the validation split; a missing split lists the found ones."""
    d = tmp_path / "ds"
    (d / "data").mkdir(parents=True)
    texts = [f"row {i} of shard {k}\n" for k in range(3) for i in range(5)]
    for k in range(3):
        with open(d / "data" / f"train-0000{k}-of-00003.jsonl", "w", encoding="utf-8") as f:
            for t in texts[5 * k:5 * k + 5]:
                f.write(json.dumps({"text": t}) + "\n")
    (d / "data" / "dev.csv").write_text("text\nhello\n", encoding="utf-8")
    tool("make_dataset.py", "--tokenizer", gpt2_folder, "--out", tmp_path / "tr.h5", d)  # --split train by default
    assert np.array_equal(read(tmp_path / "tr.h5", "tokens"), run_clm_stream(gpt2_folder, texts))
    tool("make_dataset.py", "--tokenizer", gpt2_folder, "--split", "validation", "--out", tmp_path / "va.h5", d)
    assert np.array_equal(read(tmp_path / "va.h5", "tokens"), run_clm_stream(gpt2_folder, ["hello"]))
    r = tool("make_dataset.py", "--tokenizer", gpt2_folder, "--split", "test", "--out", tmp_path / "x.h5", d, check=False)
    assert r.returncode == 1 and f"dataset folder '{d}' has no test split (splits found: train, validation)" in r.stderr


# ---- a model type or task that does not fit ----------------------------------------------------------

def test_prep_tools_name_a_gpt2_tokenizer(gpt2_folder, tmp_path):
    if not (SHARED / "nsmc" / "nsmc_from_raw_test.tsv").is_file():
        pytest.skip("shared data absent: nsmc")
    r = tool("prep_doc_cls.py", "--tokenizer", gpt2_folder, "--input", SHARED / "nsmc" / "nsmc_from_raw_test.tsv",
             "--out", tmp_path / "x.h5", check=False)
    assert r.returncode == 1
    assert (f"prep_doc_cls.py: error: --tokenizer {gpt2_folder}: the folder is a gpt2 model (config.json "
            f"model_type = gpt2), which generates text; prep_doc_cls.py makes doc_cls rows for a BERT-style "
            f"encoder ([CLS] text [SEP])") in r.stderr
    assert "pad token" not in r.stderr
    alone = tmp_path / "tok"
    alone.mkdir()
    (alone / "tokenizer.json").write_bytes((gpt2_folder / "tokenizer.json").read_bytes())
    r = tool("prep_pair_cls.py", "--tokenizer", alone, "--input", SHARED / "kornli" / "xnli.dev.ko.tsv",
             "--out", tmp_path / "x.h5", check=False)
    assert r.returncode == 1 and (f"--tokenizer {alone}: a GPT-2-style tokenizer (no [CLS], [SEP] or pad token), "
                                  f"as text generators have; prep_pair_cls.py makes pair_cls rows") in r.stderr
    assert not (tmp_path / "x.h5").exists()


@pytest.mark.parametrize("prog,data,other", [
    ("prep_doc_cls.py", "kornli/xnli.dev.ko.tsv", "pair_cls"),
    ("prep_pair_cls.py", "nsmc/nsmc_from_raw_test.tsv", "doc_cls"),
    ("prep_ner.py", "nsmc/nsmc_from_raw_test.tsv", "doc_cls"),
    ("prep_qa.py", "klue-ner/klue-ner-v1.1_dev.tsv", "ner"),
    ("prep_doc_cls.py", "korquad/KorQuAD_v1.0_dev.json", "qa")])
def test_prep_tools_name_another_tasks_data(prog, data, other, tmp_path):
    path = SHARED / data
    if not path.is_file() or not BERT_VOCAB.is_file():
        pytest.skip(f"shared data absent: {path}")
    r = tool(prog, "--vocab", BERT_VOCAB, "--input", path, "--out", tmp_path / "x.h5", check=False)
    task = prog[len("prep_"):-3]
    assert r.returncode == 1
    assert f"error: '{path}' is {other} data (" in r.stderr
    assert f"), not {task} data: use tools/prep_{other}.py (reading it as {task} data: " in r.stderr
    assert len(r.stderr) < 800  # the nested reason is cut, not a page of JSON
    assert not (tmp_path / "x.h5").exists()


def test_predict_text_names_gpt2_weights(tmp_path):
    weights = tmp_path / "gpt2.h5"
    with h5py.File(weights, "w") as f:  # the root attribute every nlptrain and hf_import.py weights file has
        f.attrs["model_type"] = "gpt2"
        f.create_dataset("wte", data=np.zeros((4, 2), np.float32))
    text = tmp_path / "reviews.txt"
    text.write_text("좋아요\n", encoding="utf-8")
    r = subprocess.run([sys.executable, str(TOOLS / "predict_text.py"), str(SOURCE / "inputs" / "doc_cls_nsmc.ini"),
                        str(weights), str(text)], capture_output=True, text=True)
    assert r.returncode == 1
    assert (f"predict_text.py: error: weights '{weights}' are a gpt2 model (model_type = gpt2), and run.task = "
            f"doc_cls ('{SOURCE / 'inputs' / 'doc_cls_nsmc.ini'}') needs a BERT") in r.stderr
    assert "pad" not in r.stderr and not (tmp_path / "predict").exists()


# ---- the task tools on the Hub's files -------------------------------------------------------------

def test_prep_tools_read_hub_files_as_their_tsv(tmp_path):
    """prep_doc_cls.py and prep_pair_cls.py on parquet and JSON Lines files (NSMC's columns with integer
    labels; KLUE NLI's premise/hypothesis with integer labels) give the rows and labels of the TSV."""
    nsmc, nli = SHARED / "nsmc" / "nsmc_from_raw_test.tsv", SHARED / "kornli" / "xnli.dev.ko.tsv"
    if not nsmc.is_file() or not nli.is_file() or not BERT_VOCAB.is_file():
        pytest.skip("shared data absent (nsmc, kornli, kcbert-base vocabulary)")
    lines = nsmc.read_text(encoding="utf-8").splitlines()[1:61]
    recs = [dict(id=l.split("\t")[0], document=l.split("\t")[1], label=int(l.split("\t")[2])) for l in lines]
    pa = pytest.importorskip("pyarrow", reason="python package 'pyarrow' is not installed")
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"id": [r["id"] for r in recs], "document": [r["document"] for r in recs],
                             "label": [r["label"] for r in recs]}), str(tmp_path / "nsmc.parquet"))
    with open(tmp_path / "nsmc.jsonl", "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    (tmp_path / "nsmc.tsv").write_text("id\tdocument\tlabel\n" + "".join(l + "\n" for l in lines), encoding="utf-8")
    tool("prep_doc_cls.py", "--vocab", BERT_VOCAB, "--input", tmp_path / "nsmc.tsv", "--out", tmp_path / "ref.h5")
    for name in ("nsmc.parquet", "nsmc.jsonl"):
        out = tmp_path / (name + ".h5")
        tool("prep_doc_cls.py", "--vocab", BERT_VOCAB, "--input", tmp_path / name, "--out", out)
        for ds in ("input_ids", "attention_mask", "labels", "example_id"):
            assert np.array_equal(read(out, ds), read(tmp_path / "ref.h5", ds)), (name, ds)
    r = tool("prep_doc_cls.py", "--vocab", BERT_VOCAB, "--input", tmp_path / "nsmc.parquet", "--label-column", "y",
             "--out", tmp_path / "x.h5", check=False)
    assert r.returncode == 1 and ("has no column 'y' (its columns: id, document, label); name the column with "
                                  "the --*-column options") in r.stderr
    names = ["entailment", "neutral", "contradiction"]
    pairs = [l.split("\t") for l in nli.read_text(encoding="utf-8").splitlines()[1:61]]
    pq.write_table(pa.table({"premise": [p[0] for p in pairs], "hypothesis": [p[1] for p in pairs],
                             "label": [names.index(p[2]) for p in pairs]}), str(tmp_path / "nli.parquet"))
    tool("prep_pair_cls.py", "--vocab", BERT_VOCAB, "--input", nli, "--limit", 60, "--out", tmp_path / "nref.h5")
    tool("prep_pair_cls.py", "--vocab", BERT_VOCAB, "--input", tmp_path / "nli.parquet", "--first-column", "premise",
         "--second-column", "hypothesis", "--label-column", "label", "--out", tmp_path / "nli.h5")
    for ds in ("input_ids", "token_type_ids", "labels"):
        assert np.array_equal(read(tmp_path / "nli.h5", ds), read(tmp_path / "nref.h5", ds)), ds
    assert not (tmp_path / "x.h5").exists()
