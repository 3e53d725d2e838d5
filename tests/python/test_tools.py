"""Tests of tools/make_dataset.py and tools/decode.py (run: python3 -m pytest -q -rs tests/python/test_tools.py).

GPT-2 cases compare against the HF `tokenizers` library directly and skip when the shared data
(NLPTRAIN_SHARED_DATA, default <source>/../shared/data) or the library is absent.
"""
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

np = pytest.importorskip("numpy", reason="NLPTRAIN_ALL_SKIPPED: numpy is not installed")
h5py = pytest.importorskip("h5py", reason="NLPTRAIN_ALL_SKIPPED: h5py is not installed")

SOURCE = Path(os.environ.get("NLPTRAIN_SOURCE_DIR") or Path(__file__).resolve().parents[2])
TOOLS = SOURCE / "tools"
MAKE = TOOLS / "make_dataset.py"
DECODE = TOOLS / "decode.py"
SHARED = Path(os.environ.get("NLPTRAIN_SHARED_DATA") or SOURCE.parent / "shared" / "data")
VOCAB = SHARED / "vocab" / "gpt2"


def run(tool, *args, check=True):
    r = subprocess.run([sys.executable, str(tool), *map(str, args)], capture_output=True)
    if check and r.returncode != 0:
        raise AssertionError(f"{tool.name} {' '.join(map(str, args))} failed ({r.returncode}):\n"
                             f"{r.stderr.decode(errors='replace')}")
    return r


def make(*args, check=True):
    return run(MAKE, *args, check=check)


def read(path, name):
    with h5py.File(path, "r") as f:
        return f[name][()]


def attrs(path):
    with h5py.File(path, "r") as f:
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}


def need_gpt2():
    if not (VOCAB / "encoder.json").is_file() or not (VOCAB / "vocab.bpe").is_file():
        pytest.skip(f"shared data absent ({VOCAB})")
    pytest.importorskip("tokenizers", reason="python package 'tokenizers' is not installed")


@functools.lru_cache(maxsize=1)
def hf_tokenizer():
    from tokenizers import ByteLevelBPETokenizer

    return ByteLevelBPETokenizer(vocab=str(VOCAB / "encoder.json"), merges=str(VOCAB / "vocab.bpe"))


def hf_ids(text):
    """Reference ids from HF's own ByteLevelBPETokenizer (independent of tools/nlptrain_data.py)."""
    return hf_tokenizer().encode(text).ids


def hf_line_ids(text):
    """make_dataset.py's rule for a text file (run_clm's): each line, keeping its "\n", tokenized on
    its own by hf_ids, the ids concatenated."""
    lines = text.split("\n")
    return [t for line in [l + "\n" for l in lines[:-1]] + [lines[-1]] if line for t in hf_ids(line)]


def no_temp_files(folder):
    return [p.name for p in Path(folder).iterdir() if p.name.endswith(".tmp")]


# ---- help and bad input -----------------------------------------------------------------------

@pytest.mark.parametrize("tool", [MAKE, DECODE], ids=["make_dataset", "decode"])
def test_help_exits_zero(tool):
    r = run(tool, "--help")
    assert r.returncode == 0
    assert b"usage:" in r.stdout and b"--tokenizer" in r.stdout


def test_missing_input_file(tmp_path):
    missing = tmp_path / "no_such_corpus.txt"
    r = make("--tokenizer", "byte", "--out", tmp_path / "o.h5", missing, check=False)
    assert r.returncode != 0
    assert str(missing).encode() in r.stderr
    assert not (tmp_path / "o.h5").exists()


def test_unknown_tokenizer(tmp_path):
    src = tmp_path / "a.txt"
    src.write_text("hello")
    r = make("--tokenizer", "wordpiece", "--out", tmp_path / "o.h5", src, check=False)
    assert r.returncode != 0
    assert b"wordpiece" in r.stderr
    r = run(DECODE, "--tokenizer", "sentencepiece", "--ids", "1,2", check=False)
    assert r.returncode != 0 and b"sentencepiece" in r.stderr


def test_bad_options(tmp_path):
    src = tmp_path / "a.txt"
    src.write_text("hello world")
    out = tmp_path / "o.h5"
    cases = [
        (["--tokenizer", "gpt2"], b"--vocab-dir"),
        (["--tokenizer", "gpt2", "--vocab-dir", tmp_path / "novocab"], str(tmp_path / "novocab").encode()),
        (["--tokenizer", "gpt2", "--vocab-dir", tmp_path], str(tmp_path / "encoder.json").encode()),
        (["--tokenizer", "byte", "--layout", "rows"], b"--seq-len"),
        (["--tokenizer", "byte", "--layout", "rows", "--seq-len", "0"], b"--seq-len"),
        (["--tokenizer", "byte", "--pad"], b"--pad"),
        (["--tokenizer", "byte", "--val-fraction", "0.1"], b"--val-out"),
        (["--tokenizer", "byte", "--val-fraction", "1.5", "--val-out", tmp_path / "v.h5"], b"--val-fraction"),
        (["--tokenizer", "byte", "--eos-between-files"], b"EOS"),
        (["--tokenizer", "byte", "--layout", "rows", "--seq-len", "100"], b"fewer than --seq-len"),
    ]
    for extra, msg in cases:
        r = make(*extra, "--out", out, src, check=False)
        assert r.returncode != 0, extra
        assert msg in r.stderr, (extra, r.stderr)
        assert not out.exists(), extra
    assert no_temp_files(tmp_path) == []
    r = make("--tokenizer", "byte", "--out", tmp_path / "missing_dir" / "o.h5", src, check=False)
    assert r.returncode != 0 and b"missing_dir" in r.stderr
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    r = make("--tokenizer", "byte", "--out", out, empty, check=False)
    assert r.returncode != 0 and str(empty).encode() in r.stderr


def test_gpt2_invalid_utf8_names_file(tmp_path):
    need_gpt2()
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf\xe9 au lait")
    r = make("--tokenizer", "gpt2", "--vocab-dir", VOCAB, "--out", tmp_path / "o.h5", bad, check=False)
    assert r.returncode != 0
    assert str(bad).encode() in r.stderr and b"byte offset 3" in r.stderr
    assert not (tmp_path / "o.h5").exists() and no_temp_files(tmp_path) == []


# ---- byte tokenizer ---------------------------------------------------------------------------

def test_byte_stream_tokens_equal_bytes(tmp_path):
    data = "Hello, world!\nÜnïcödé 한국어 😀\n".encode() + bytes([0, 255, 128, 10])  # raw bytes are fine
    src = tmp_path / "a.txt"
    src.write_bytes(data)
    out = tmp_path / "byte.h5"
    make("--tokenizer", "byte", "--out", out, src)
    tokens = read(out, "tokens")
    assert tokens.dtype == np.int32 and tokens.ndim == 1
    assert tokens.tolist() == list(data)
    at = attrs(out)
    assert at["tokenizer"] == "byte" and at["vocab_size"] == 256
    assert at["num_tokens"] == len(data) and at["layout"] == "stream"
    assert str(src) in at["source"]
    with h5py.File(out, "r") as f:
        assert f["tokens"].chunks is not None and f["tokens"].maxshape == (None,)
    assert no_temp_files(tmp_path) == []


def test_byte_multiple_files_in_order(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(b"first file\n")
    b.write_bytes(b"second")
    out = tmp_path / "ab.h5"
    make("--tokenizer", "byte", "--out", out, a, b)
    assert bytes(read(out, "tokens").astype(np.uint8)) == b"first file\nsecond"
    assert attrs(out)["source"].split("\n") == [str(a), str(b)]


# ---- rows layout ------------------------------------------------------------------------------

def test_rows_layout_shapes_and_padding(tmp_path):
    data = bytes(range(97, 97 + 23))  # 23 tokens
    src = tmp_path / "a.txt"
    src.write_bytes(data)

    out = tmp_path / "rows.h5"
    make("--tokenizer", "byte", "--layout", "rows", "--seq-len", 5, "--out", out, src)
    ids, mask = read(out, "input_ids"), read(out, "attention_mask")
    assert ids.shape == (4, 5) and mask.shape == (4, 5) and ids.dtype == np.int32 and mask.dtype == np.int32
    assert ids.reshape(-1).tolist() == list(data[:20]) and mask.min() == 1
    with h5py.File(out, "r") as f:
        assert "labels" not in f
    at = attrs(out)
    assert at["layout"] == "rows" and at["seq_len"] == 5 and at["num_rows"] == 4 and at["num_tokens"] == 20

    padded = tmp_path / "rows_pad.h5"
    make("--tokenizer", "byte", "--layout", "rows", "--seq-len", 5, "--pad", "--out", padded, src)
    ids, mask, labels = read(padded, "input_ids"), read(padded, "attention_mask"), read(padded, "labels")
    assert ids.shape == mask.shape == labels.shape == (5, 5)
    assert mask[:4].min() == 1 and mask[4].tolist() == [1, 1, 1, 0, 0]
    assert ids[4].tolist() == [data[20], data[21], data[22], 0, 0]  # byte pad id 0
    assert labels[4].tolist() == [data[20], data[21], data[22], -100, -100]
    assert (labels[:4] == ids[:4]).all()
    assert attrs(padded)["num_tokens"] == 23

    # exact multiple: --pad adds no row
    exact = tmp_path / "exact.txt"
    exact.write_bytes(data[:20])
    out3 = tmp_path / "rows_exact.h5"
    make("--tokenizer", "byte", "--layout", "rows", "--seq-len", 5, "--pad", "--out", out3, exact)
    assert read(out3, "input_ids").shape == (4, 5) and read(out3, "attention_mask").min() == 1


def test_rows_gpt2_pad_is_eos(tmp_path):
    need_gpt2()
    src = tmp_path / "a.txt"
    src.write_text("Hello world, this is a short text.")
    out = tmp_path / "rows.h5"
    make("--tokenizer", "gpt2", "--vocab-dir", VOCAB, "--layout", "rows", "--seq-len", 4, "--pad", "--out", out, src)
    ref = hf_line_ids(src.read_text())
    ids, mask, labels = read(out, "input_ids"), read(out, "attention_mask"), read(out, "labels")
    n = len(ref)
    assert ids.shape == (-(-n // 4), 4)
    assert ids.reshape(-1)[:n].tolist() == ref
    assert (ids.reshape(-1)[n:] == 50256).all() and (labels.reshape(-1)[n:] == -100).all()
    assert mask.sum() == n


# ---- validation split -------------------------------------------------------------------------

def test_val_split_sizes_add_up(tmp_path):
    data = bytes((i * 7 + 3) % 256 for i in range(10007))
    src = tmp_path / "a.txt"
    src.write_bytes(data)
    tr, va = tmp_path / "train.h5", tmp_path / "val.h5"
    make("--tokenizer", "byte", "--keep-cr", "--out", tr, "--val-fraction", 0.1, "--val-out", va, src)
    t, v = read(tr, "tokens"), read(va, "tokens")
    assert len(t) + len(v) == len(data)
    assert len(v) == round(0.1 * len(data))
    assert np.concatenate([t, v]).tolist() == list(data)  # contiguous tail
    assert attrs(tr)["split"] == "train" and attrs(va)["split"] == "val"
    assert attrs(tr)["num_tokens"] == len(t) and attrs(va)["num_tokens"] == len(v)
    # deterministic
    tr2, va2 = tmp_path / "train2.h5", tmp_path / "val2.h5"
    make("--tokenizer", "byte", "--keep-cr", "--out", tr2, "--val-fraction", 0.1, "--val-out", va2, src)
    assert (read(tr2, "tokens") == t).all() and (read(va2, "tokens") == v).all()

    # rows: each part is cut into rows separately
    rtr, rva = tmp_path / "rtrain.h5", tmp_path / "rval.h5"
    make("--tokenizer", "byte", "--keep-cr", "--layout", "rows", "--seq-len", 64, "--out", rtr,
         "--val-fraction", 0.25, "--val-out", rva, src)
    n_val = round(0.25 * len(data))
    assert read(rtr, "input_ids").shape == ((len(data) - n_val) // 64, 64)
    assert read(rva, "input_ids").shape == (n_val // 64, 64)
    assert read(rva, "input_ids")[0].tolist() == list(data[len(data) - n_val:len(data) - n_val + 64])
    assert no_temp_files(tmp_path) == []


# ---- GPT-2 against HF tokenizers --------------------------------------------------------------

def test_gpt2_tinyshakespeare_matches_hf(tmp_path):
    need_gpt2()
    path = SHARED / "tinyshakespeare" / "input.txt"
    if not path.is_file():
        pytest.skip(f"shared data absent ({path})")
    text = path.read_text(encoding="utf-8")[:50000]
    src = tmp_path / "ts.txt"
    src.write_text(text, encoding="utf-8", newline="")
    ref = hf_line_ids(text)
    out = tmp_path / "ts.h5"
    make("--tokenizer", "gpt2", "--vocab-dir", VOCAB, "--out", out, src)
    assert read(out, "tokens").tolist() == ref
    at = attrs(out)
    assert at["tokenizer"] == "gpt2" and at["vocab_size"] == 50257 and at["num_tokens"] == len(ref)
    assert at["eos_id"] == 50256


def test_gpt2_korean_and_crlf_lines_match_hf(tmp_path):
    need_gpt2()
    nsmc = SHARED / "nsmc" / "nsmc_from_raw_test.tsv"
    wiki = SHARED / "wikitext2" / "wiki.test.raw"
    if not nsmc.is_file() or not wiki.is_file():
        pytest.skip("shared data absent (nsmc, wikitext2)")
    with open(nsmc, encoding="utf-8", newline="") as f:
        korean = "".join(f.readline() for _ in range(300))
    with open(wiki, encoding="utf-8", newline="") as f:
        crlf = f.read(30000)
    a, b = tmp_path / "ko.txt", tmp_path / "wiki.txt"
    a.write_text(korean, encoding="utf-8", newline="")
    b.write_text(crlf, encoding="utf-8", newline="")
    out = tmp_path / "mix.h5"
    make("--tokenizer", "gpt2", "--vocab-dir", VOCAB, "--eos-between-files",
         "--out", out, a, b)
    # CRLF is read as LF by default (as a file opened in text mode), kept with --keep-cr
    lf = crlf.replace("\r\n", "\n").replace("\r", "\n")
    assert "\r" in crlf and 198 not in hf_ids("\r")
    assert read(out, "tokens").tolist() == hf_line_ids(korean) + [50256] + hf_line_ids(lf)
    assert attrs(out)["keep_cr"] == 0
    make("--tokenizer", "gpt2", "--vocab-dir", VOCAB, "--eos-between-files",
         "--keep-cr", "--out", out, a, b)
    assert read(out, "tokens").tolist() == hf_line_ids(korean) + [50256] + hf_line_ids(crlf)
    assert attrs(out)["keep_cr"] == 1


def test_byte_cr_normalised_unless_keep_cr(tmp_path):
    src = tmp_path / "a.txt"
    src.write_bytes(b"a\r\nb\rc\n\r")
    out = tmp_path / "o.h5"
    make("--tokenizer", "byte", "--out", out, src, "--val-fraction", 0.5, "--val-out", tmp_path / "v.h5")
    assert bytes(np.concatenate([read(out, "tokens"), read(tmp_path / "v.h5", "tokens")]).astype(np.uint8)) \
        == b"a\nb\nc\n\n"
    make("--tokenizer", "byte", "--keep-cr", "--out", out, src)
    assert bytes(read(out, "tokens").astype(np.uint8)) == b"a\r\nb\rc\n\r"


# ---- decode -----------------------------------------------------------------------------------

def test_decode_round_trip_byte(tmp_path):
    data = "line one\nÜnïcödé 😀\n".encode() + b"\xff\xfe raw"
    src = tmp_path / "a.txt"
    src.write_bytes(data)
    out = tmp_path / "b.h5"
    make("--tokenizer", "byte", "--out", out, src)
    assert run(DECODE, out).stdout == data
    assert run(DECODE, out, "--start", 5, "--count", 3).stdout == data[5:8]
    dec = tmp_path / "dec.bin"
    run(DECODE, out, "--out", dec)
    assert dec.read_bytes() == data
    assert run(DECODE, "--tokenizer", "byte", "--ids", "104,105, 10").stdout == b"hi\n"
    # rows: padding positions are left out, one row per line
    rows = tmp_path / "rows.h5"
    make("--tokenizer", "byte", "--layout", "rows", "--seq-len", 4, "--pad", "--out", rows, src)
    lines = run(DECODE, rows, "--row-sep", "\\n").stdout
    assert lines.replace(b"\n", b"") == data.replace(b"\n", b"")  # data's own newlines plus separators
    assert len(run(DECODE, rows, "--keep-padding", "--row-sep", "").stdout) == read(rows, "input_ids").size


def test_decode_bad_input(tmp_path):
    missing = tmp_path / "nothing.h5"
    r = run(DECODE, missing, check=False)
    assert r.returncode != 0 and str(missing).encode() in r.stderr
    r = run(DECODE, "--tokenizer", "byte", "--ids", "65,256", check=False)
    assert r.returncode != 0 and b"256" in r.stderr
    r = run(DECODE, "--tokenizer", "byte", "--ids", "65,x", check=False)
    assert r.returncode != 0 and b"'x'" in r.stderr
    r = run(DECODE, "--ids", "1,2", check=False)
    assert r.returncode != 0 and b"--tokenizer" in r.stderr
    src = tmp_path / "a.txt"
    src.write_bytes(b"abc")
    out = tmp_path / "b.h5"
    make("--tokenizer", "byte", "--out", out, src)
    r = run(DECODE, out, "--dataset", "nope", check=False)
    assert r.returncode != 0 and b"nope" in r.stderr and b"tokens" in r.stderr


def test_decode_round_trip_gpt2(tmp_path):
    need_gpt2()
    text = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
            "I'll say 2026-11-21 3.14  café 😀 한국어 텍스트\r\n  trailing  ")
    src = tmp_path / "a.txt"
    src.write_text(text, encoding="utf-8", newline="")
    out = tmp_path / "g.h5"
    make("--tokenizer", "gpt2", "--vocab-dir", VOCAB, "--out", out, src, src, "--eos-between-files", "--keep-cr")
    tokens = read(out, "tokens")
    assert tokens.tolist() == hf_line_ids(text) + [50256] + hf_line_ids(text)
    # tokenizer and vocabulary folder come from the file's attributes
    assert run(DECODE, out).stdout.decode("utf-8") == text + "<|endoftext|>" + text
    assert run(DECODE, out, "--vocab-dir", VOCAB).stdout.decode("utf-8") == text + "<|endoftext|>" + text
    r = run(DECODE, "--tokenizer", "gpt2", "--vocab-dir", VOCAB, "--ids", "15496,11,995")
    assert r.stdout == b"Hello, world"
    r = run(DECODE, "--tokenizer", "gpt2", "--vocab-dir", VOCAB, "--ids", "50257", check=False)
    assert r.returncode != 0 and b"50257" in r.stderr
