"""Shared code of the BERT task preprocessing tools (prep_doc_cls.py, prep_pair_cls.py, prep_ner.py,
prep_qa.py, prep_mlm.py).

Tokenizer
  BERT WordPiece through the HF `tokenizers` library (BertWordPieceTokenizer: BertNormalizer with
  clean_text and handle_chinese_chars, BertPreTokenizer, WordPiece with the '##' prefix) from a
  vocab.txt (one token per line, id = line number). Case: --lowercase/--no-lowercase; by default
  `do_lower_case` from a tokenizer_config.json or config.json beside the vocabulary, else lower-case
  exactly when the vocabulary has no upper-case token (kcbert-base: cased; bert-base-uncased:
  lower-cased). Accents are NEVER stripped unless --strip-accents is given: stripping decomposes
  text to NFD, which turns every Hangul syllable into jamo and makes Korean text all [UNK]. (HF's
  own bert-base-uncased strips accents; pass --strip-accents with that vocabulary to match it.)
  Offsets are character offsets into the original (un-normalised) text.

Hub tokenizers (--tokenizer PATH instead of --vocab; exactly one of them; tools/hub_tokenizer.py)
  A Hugging Face tokenizer folder or file (tokenizer.json, vocab.txt, vocab.json + merges.txt). Rows
  are made as transformers' fast tokenizers make them when HF's run_glue / run_ner / run_qa call
  them: the tokenizer's own special-token template (post-processor: [CLS] a [SEP] b [SEP] for BERT,
  <s> a </s></s> b </s> for RoBERTa, none for GPT-2), its own truncation (longest_first for pairs,
  only_second with stride for QA) and padding to T with its pad token (attention_mask 0,
  token_type_ids 0). The tokenizer needs a pad token. --lowercase / --strip-accents apply to a
  vocab.txt only. Special ids are those the tokenizer defines (cls_id/sep_id/... may be absent).

Single-segment models (RoBERTa: klue/roberta-base, roberta-base)
  When the config.json beside the tokenizer (or the vocabulary) has type_vocab_size = 1 (RoBERTa's
  token type table has one row), every token_type_ids value is written 0: klue/roberta-base ships a
  WordPiece tokenizer whose pair encoding gives the second segment type 1, which that model cannot
  look up (nlptrain refuses it, naming the row). The tool says so once, and the output records the
  root attribute type_vocab_size = 1.

Output (HDF5, written to a temporary file beside the target and renamed into place when complete;
with --split-eval both files appear or neither)
  input_ids, attention_mask, token_type_ids  int32 [N,T], T = --max-seq-len, padded with [PAD]
      (attention_mask 0, token_type_ids 0). Single: [CLS] a [SEP]; pair: [CLS] a [SEP] b [SEP] with
      token_type_ids 0 up to and including the first [SEP], 1 for b and the final [SEP].
  Root attributes: task, num_labels, id2label (JSON list of strings; label id = index; both absent
      with --no-labels unless --label-names is given), vocab_size, vocab (absolute path; --vocab),
      lowercase (0/1), strip_accents (0/1), max_seq_len, cls_id, sep_id, pad_id, mask_id, unk_id
      (bos_id, eos_id where a Hub tokenizer defines them), source (absolute input paths, one per
      line), num_examples, seed, split ("train"/"eval", only with --split-eval), has_labels (0/1),
      the tokenizer fingerprints tokenizer ("wordpiece" for --vocab, "hub" for --tokenizer),
      tokenizer_files, tokenizer_sha256, vocab_sha256 (tools/hub_tokenizer.py), and the tool's own.
  -100 in a label dataset means "no label here" (ignored by the loss), as in Hugging Face.

Splits (--split-eval F --eval-out FILE): the units (examples; NER sentences; QA articles) of the
input (after --limit) are permuted with numpy's legacy RandomState(--seed), whose stream is frozen
across numpy versions; the first round(F * units) go to the eval file, the rest to --out; both keep
file order. The same input, F and seed always give the same split.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import unicodedata
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nlptrain_data import DataError  # noqa: E402,F401  (re-exported for the tools)
import hub_tokenizer as ht  # noqa: E402
# The vocab.txt reader, re-exported: hub_tokenizer.py uses it too, from wordpiece_vocab.py, so that the
# two modules do not import each other.
from wordpiece_vocab import SPECIALS, default_lowercase, has_upper_case, read_vocab  # noqa: E402,F401

IGNORE = -100           # label value the loss ignores
NO_OFFSET = -1          # offset_mapping value of special and padding tokens
ROWS_PER_WRITE = 4096   # examples tokenized and appended to the HDF5 file at a time


# ---- vocabulary and tokenizer --------------------------------------------------------------------

class WordPiece:
    """BERT WordPiece tokenizer (HF `tokenizers`) plus the special ids."""

    def __init__(self, vocab_path: str, lowercase: Optional[bool] = None, strip_accents: bool = False):
        self.vocab_path = os.path.abspath(vocab_path)
        vocab = read_vocab(vocab_path)
        if lowercase is None:
            lowercase, self.lowercase_reason = default_lowercase(vocab_path, vocab)
        else:
            self.lowercase_reason = "--lowercase" if lowercase else "--no-lowercase"
        self.lowercase = bool(lowercase)
        self.strip_accents = bool(strip_accents)
        self.vocab = vocab
        self.vocab_size = len(vocab)
        self.cls_id, self.sep_id, self.pad_id, self.mask_id, self.unk_id = (vocab[s] for s in SPECIALS)
        try:
            from tokenizers import BertWordPieceTokenizer
        except ImportError:
            raise DataError("the WordPiece tokenizer needs the Python package 'tokenizers' "
                            "(pip install tokenizers)") from None
        # strip_accents must be an explicit False: None would follow `lowercase` (HF's default).
        self._tok = BertWordPieceTokenizer(dict(vocab), lowercase=self.lowercase,
                                           strip_accents=self.strip_accents, clean_text=True,
                                           handle_chinese_chars=True)

    def encode(self, texts: Sequence[str]):
        """Encodings (ids, offsets, tokens) of independent texts, without special tokens."""
        if not texts:
            return []
        return self._tok.encode_batch(list(texts), add_special_tokens=False)

    def ids(self, texts: Sequence[str]) -> List[List[int]]:
        return [e.ids for e in self.encode(texts)]

    is_hub = False

    def attrs(self) -> dict:
        return dict(vocab_size=self.vocab_size, vocab=self.vocab_path, lowercase=int(self.lowercase),
                    strip_accents=int(self.strip_accents), cls_id=self.cls_id, sep_id=self.sep_id,
                    pad_id=self.pad_id, mask_id=self.mask_id, unk_id=self.unk_id,
                    tokenizer="wordpiece", tokenizer_files=self.vocab_path,
                    tokenizer_sha256=ht.files_sha256([self.vocab_path]),
                    vocab_sha256=ht.vocab_sha256({i: t for t, i in self.vocab.items()}, self.vocab_size))


class HubRows:
    """A Hub tokenizer (hub_tokenizer.HubTokenizer) making rows as transformers' fast tokenizers do:
    the backend's own post-processor, truncation and overflow; padding to T with the pad token."""

    is_hub = True

    def __init__(self, tok):
        self.tok = tok
        if tok.pad_id < 0:
            raise DataError(f"tokenizer {tok.description} has no pad token (BERT-style rows are padded to "
                            f"--max-seq-len): set pad_token in its tokenizer_config.json")
        self.pad_id = tok.pad_id
        self.cls_id, self.sep_id, self.mask_id, self.unk_id = tok.cls_id, tok.sep_id, tok.mask_id, tok.unk_id
        self.vocab_size = tok.vocab_size
        self.lowercase = tok.lowercase if tok.lowercase is not None else False
        self.lowercase_reason = tok.lowercase_reason

    def encode(self, items, T: Optional[int], strategy: str = "longest_first", stride: int = 0,
               pretokenized: bool = False):
        """Encodings of texts, (a, b) pairs or word lists, with special tokens, truncated to T."""
        if not items:
            return []
        b = self.tok.backend
        if T is None:
            b.no_truncation()
        else:
            b.enable_truncation(T, stride=stride, strategy=strategy, direction="right")
        b.no_padding()
        try:
            return b.encode_batch(list(items), is_pretokenized=pretokenized, add_special_tokens=True)
        except Exception as e:  # the library raises plain Exception (e.g. a truncation error)
            raise DataError(f"tokenizer {self.tok.description}: {e}") from None
        finally:
            b.no_truncation()

    def ids(self, texts: Sequence[str]) -> List[List[int]]:
        """Without special tokens and truncation (counting and cutting)."""
        self.tok.backend.no_truncation()
        return self.tok.ids(texts, add_special_tokens=False)

    def attrs(self) -> dict:
        at = self.tok.attrs()
        at.pop("model_max_length", None)
        if self.tok.lowercase is not None:
            at["lowercase"] = int(self.tok.lowercase)
        return at


def is_bert_whitespace(c: str) -> bool:
    """The BERT tokenizer's whitespace: space, tab, newline, carriage return and category Zs."""
    return c in " \t\n\r" or unicodedata.category(c) == "Zs"


# ---- rows -----------------------------------------------------------------------------------------

def single_row(ids: Sequence[int], T: int, tok: WordPiece) -> Tuple[List[int], bool]:
    """[CLS] ids [SEP], ids cut to T-2 tokens. Returns (row without padding, truncated)."""
    keep = T - 2
    return [tok.cls_id, *ids[:keep], tok.sep_id], len(ids) > keep


def truncate_longest_first(a: Sequence[int], b: Sequence[int], budget: int) -> Tuple[int, int]:
    """Lengths (na, nb) after the `tokenizers` library's 'longest_first' truncation to
    na + nb <= budget: if cutting the longer one down to budget - shorter suffices, only the longer is
    cut; otherwise the shorter gets budget // 2 and the longer the rest (b counts as the longer on a
    tie). Same result as HF's fast tokenizers (the Rust code in tokenizers/src/utils/truncation.rs)."""
    na, nb = len(a), len(b)
    if na + nb <= budget:
        return na, nb
    swap = na > nb
    n1, n2 = (nb, na) if swap else (na, nb)  # n1 <= n2
    n2 = n1 if n1 > budget else max(n1, budget - n1)
    if n1 + n2 > budget:
        n1 = budget // 2
        n2 = n1 + budget % 2
    return (n2, n1) if swap else (n1, n2)


def pair_row(a: Sequence[int], b: Sequence[int], T: int, tok: WordPiece) -> Tuple[List[int], List[int], bool]:
    """[CLS] a [SEP] b [SEP] with longest-first truncation. Returns (ids, token types, truncated)."""
    na, nb = truncate_longest_first(a, b, T - 3)
    ids = [tok.cls_id, *a[:na], tok.sep_id, *b[:nb], tok.sep_id]
    types = [0] * (na + 2) + [1] * (nb + 1)
    return ids, types, (na, nb) != (len(a), len(b))


def pad_2d(rows: Sequence[Sequence[int]], T: int, value: int, dtype="int32"):
    import numpy as np

    out = np.full((len(rows), T), value, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def row_arrays(rows: Sequence[Sequence[int]], T: int, tok: WordPiece,
               types: Optional[Sequence[Sequence[int]]] = None) -> dict:
    """input_ids / attention_mask / token_type_ids [n,T] int32 for rows without padding."""
    import numpy as np

    ids = pad_2d(rows, T, tok.pad_id)
    mask = np.zeros_like(ids)
    for i, r in enumerate(rows):
        mask[i, :len(r)] = 1
    tt = pad_2d(types, T, 0) if types is not None and not getattr(tok, "single_segment", False) \
        else np.zeros_like(ids)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt}


# ---- input files ----------------------------------------------------------------------------------

def check_input(path: str) -> None:
    if not os.path.exists(path):
        raise DataError(f"input file '{path}' not found")
    if not os.path.isfile(path):
        raise DataError(f"input '{path}' is not a regular file")
    if not os.access(path, os.R_OK):
        raise DataError(f"input file '{path}' is not readable")


def read_lines(path: str) -> List[str]:
    """Lines of a UTF-8 file without their line ends (\\n or \\r\\n); a leading BOM is dropped.
    Invalid UTF-8 is a DataError naming the file and line."""
    check_input(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise DataError(f"cannot read input file '{path}': {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise DataError(f"{path}:{line}: not valid UTF-8 (byte offset {e.start})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def read_tsv(path: str, columns: Sequence[str], optional: Sequence[str] = ()) -> List[Tuple[int, List[str]]]:
    """Rows of a TSV file with a header line, as (line number, [values of `columns`, then of the
    `optional` columns (None for one the header lacks)]).
    No quoting: a field is everything between tabs. Blank lines are skipped; a line with a different
    number of fields than the header is a DataError naming file and line."""
    lines = read_lines(path)
    if not lines:
        raise DataError(f"{path}: the file is empty (expected a header line with {', '.join(columns)})")
    header = lines[0].split("\t")
    idx = []
    for c in columns:
        if c not in header:
            raise DataError(f"{path}:1: the header has no column '{c}' (columns: {', '.join(header)})")
        idx.append(header.index(c))
    idx += [header.index(c) if c in header else None for c in optional]
    out = []
    for n, line in enumerate(lines[1:], start=2):
        if line.strip() == "":
            continue
        fields = line.split("\t")
        if len(fields) != len(header):
            raise DataError(f"{path}:{n}: expected {len(header)} tab-separated fields "
                            f"({', '.join(header)}), got {len(fields)}")
        out.append((n, [fields[i] if i is not None else None for i in idx]))
    return out


def read_table(path: str, columns: Sequence[str], optional: Sequence[str] = ()) -> List[Tuple[int, List[Optional[str]]]]:
    """Rows of a Hub table file (parquet, JSON Lines or CSV: tools/hub_datasets.py) in read_tsv's form:
    (row number from 0, [values of `columns`, then of `optional`]). Integer values (labels) become their
    digits; a null or any other type in a column is a DataError naming the file, row and column."""
    import hub_datasets as hd
    names = list(columns) + list(optional)
    out = []
    for r, vals in hd.read_columns(path, columns, optional):
        row = []
        for c, v in zip(names, vals):
            if v is None and c in optional:
                row.append(None)
            elif isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)):
                row.append(str(v))
            else:
                raise DataError(f"'{path}' row {r}: column '{c}' is "
                                f"{'null' if v is None else 'a ' + type(v).__name__}, not text or an integer")
        out.append((r, row))
    return out


def is_table(path: str) -> bool:
    """A Hub table file (.parquet, .jsonl, .json, .csv), read by its column names."""
    import hub_datasets as hd
    return hd.table_format(path) is not None


def read_plain_lines(path: str, fields: int) -> List[Tuple[int, List[str]]]:
    """(line number, [the `fields` tab-separated fields]) of each non-blank line of a text file
    (--input-format lines: one document, or one tab-separated pair, per line; no header)."""
    out = []
    for n, line in enumerate(read_lines(path), start=1):
        if line.strip() == "":
            continue
        parts = line.split("\t") if fields > 1 else [line]
        if len(parts) != fields:
            raise DataError(f"{path}:{n}: expected {fields} tab-separated fields, got {len(parts)}")
        out.append((n, parts))
    return out


TASK_INPUTS = {"doc_cls": "a TSV with a document column", "pair_cls": "a TSV with sentence1 and sentence2 columns",
               "ner": "char<TAB>tag lines with BIO tags", "qa": "SQuAD/KorQuAD JSON with data[].paragraphs"}


def sniff_task(path: str) -> Optional[str]:
    """The task whose input a file clearly is (by its first 64 KiB), or None."""
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            head = f.read(1 << 16).lstrip("\ufeff \t\r\n")
    except OSError:
        return None
    if head.startswith("{"):
        return "qa" if '"paragraphs"' in head else None
    lines = [ln.rstrip("\r") for ln in head.split("\n")]
    header = lines[0].split("\t")
    if "sentence1" in header and "sentence2" in header:
        return "pair_cls"
    if "document" in header:
        return "doc_cls"
    body = [ln for ln in lines[:-1] if ln.strip() and not ln.startswith("##")][:50]
    import re
    if body and all(len(ln.split("\t")) == 2 and re.fullmatch(r"O|[BI]-[A-Za-z_]+", ln.split("\t")[1])
                    for ln in body):
        return "ner"
    return None


def task_mismatch(path: str, task: str, err: Exception) -> Exception:
    """For an input that failed to read: a DataError naming the task it is data of when that is another
    task's, else err itself."""
    other = sniff_task(path)
    if other is None or other == task:
        return err
    why = str(err)
    why = why if len(why) <= 200 else why[:200] + " ..."
    return DataError(f"'{path}' is {other} data ({TASK_INPUTS[other]}), not {task} data: use "
                     f"tools/prep_{other}.py (reading it as {task} data: {why})")


# ---- splits ---------------------------------------------------------------------------------------

def split_units(n: int, fraction: float, seed: int) -> Tuple[List[int], List[int]]:
    """(train unit indices, eval unit indices), each in increasing order."""
    import numpy as np

    k = int(round(fraction * n))
    if k == 0 or k == n:
        raise DataError(f"--split-eval {fraction} of {n} unit(s) leaves an empty "
                        f"{'eval' if k == 0 else 'train'} part")
    perm = np.random.RandomState(seed).permutation(n)
    ev = sorted(int(i) for i in perm[:k])
    tr = sorted(int(i) for i in perm[k:])
    return tr, ev


# ---- command line ---------------------------------------------------------------------------------

def add_common_args(p: argparse.ArgumentParser, max_seq_len: int = 128, split_unit: str = "examples",
                    limit_unit: str = "examples") -> None:
    p.add_argument("--vocab", metavar="VOCAB.txt", help="WordPiece vocabulary (one token per line); or --tokenizer")
    p.add_argument("--tokenizer", metavar="PATH",
                   help="a Hugging Face tokenizer folder or file (tokenizer.json preferred, vocab.txt, "
                        "vocab.json + merges.txt) instead of --vocab: special tokens, truncation and "
                        "padding as transformers' run_glue/run_ner/run_qa get them")
    p.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=None,
                   help="lower-case the text (default: do_lower_case from a config.json/tokenizer_config.json "
                        "beside the vocabulary, else only when the vocabulary has no upper-case tokens)")
    p.add_argument("--strip-accents", action="store_true",
                   help="strip accents (NFD + drop marks). Off by default: it destroys Hangul")
    p.add_argument("--single-segment", action="store_true",
                   help="write every token_type_ids 0, for a model with one token type (RoBERTa: type_vocab_size "
                        "= 1); default: when the config.json beside the tokenizer says type_vocab_size = 1")
    p.add_argument("--max-seq-len", type=int, default=max_seq_len, metavar="T",
                   help=f"row length T including [CLS]/[SEP] (default {max_seq_len})")
    p.add_argument("--out", required=True, metavar="FILE.h5", help="output HDF5 file (the train part with --split-eval)")
    p.add_argument("--limit", type=int, metavar="N", help=f"use only the first N {limit_unit} of the input")
    p.add_argument("--seed", type=int, default=1234, help="seed of --split-eval (default 1234)")
    p.add_argument("--split-eval", type=float, metavar="F",
                   help=f"move a seeded random fraction F (0 < F < 1) of the {split_unit} to --eval-out")
    p.add_argument("--eval-out", metavar="FILE.h5", help="eval output file (with --split-eval)")
    p.add_argument("--quiet", action="store_true", help="no summary on stdout")


def make_parser(prog: str, doc: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0],
                                   epilog=doc.split("\n", 2)[2] if doc.count("\n") >= 2 else None,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def add_label_args(p: argparse.ArgumentParser, what: str = "labels") -> None:
    p.add_argument("--no-labels", action="store_true",
                   help=f"unlabelled input (for prediction): {what} not required, no labels datasets "
                        f"written, no num_labels/id2label attributes unless --label-names is given")


def check_common(a, inputs: Sequence[str], min_seq_len: int = 3) -> None:
    if bool(a.vocab) == bool(a.tokenizer):
        raise DataError("give exactly one of --vocab VOCAB.txt and --tokenizer PATH"
                        + (f" (got both: '{a.vocab}' and '{a.tokenizer}')" if a.vocab else ""))
    for path in inputs:
        check_input(path)
    if a.max_seq_len < min_seq_len:
        raise DataError(f"--max-seq-len must be >= {min_seq_len}, got {a.max_seq_len}")
    if not 0 <= a.seed < 2 ** 32:
        raise DataError(f"--seed must be in [0, 2^32), got {a.seed}")
    if a.limit is not None and a.limit < 1:
        raise DataError(f"--limit must be >= 1, got {a.limit}")
    if a.split_eval is not None:
        if not 0.0 < a.split_eval < 1.0:
            raise DataError(f"--split-eval must be in (0, 1), got {a.split_eval}")
        if not a.eval_out:
            raise DataError("--split-eval needs --eval-out")
    elif a.eval_out:
        raise DataError("--eval-out needs --split-eval")
    outs = [a.out] + ([a.eval_out] if a.eval_out else [])
    if a.eval_out and os.path.abspath(a.eval_out) == os.path.abspath(a.out):
        raise DataError("--eval-out must differ from --out")
    for o in outs:
        d = os.path.dirname(os.path.abspath(o))
        if not os.path.isdir(d):
            raise DataError(f"output folder '{d}' (for '{o}') does not exist")
        if os.path.isdir(o):
            raise DataError(f"output '{o}' is a folder")
        if any(os.path.abspath(o) == os.path.abspath(i) for i in inputs):
            raise DataError(f"output '{o}' is also an input")


# Hub model types that generate text (decoder-only): their tokenizers have no [CLS]/[SEP] or pad token.
DECODER_TYPES = ("gpt2", "gpt_neo", "gptj", "gpt_neox", "gpt_bigcode", "llama", "mistral", "mixtral", "opt",
                 "bloom", "falcon", "qwen2", "gemma", "gemma2", "phi", "phi3")


def model_type_beside(path: str) -> Optional[str]:
    """model_type of the config.json in a tokenizer's folder (or beside a tokenizer file), if any."""
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    try:
        with open(os.path.join(folder, "config.json"), "r", encoding="utf-8") as f:
            v = json.load(f).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return v if isinstance(v, str) else None


def check_encoder_tokenizer(hub, spec: str, prog: str) -> None:
    """A decoder-only model's tokenizer (GPT-2 and the like) given to a BERT task tool: say so, by name."""
    prog = prog or "prep"
    task = prog[len("prep_"):-len(".py")] if prog.startswith("prep_") and prog.endswith(".py") else "BERT"
    mt = model_type_beside(spec)
    if mt in DECODER_TYPES:
        raise DataError(f"--tokenizer {spec}: the folder is a {mt} model (config.json model_type = {mt}), which "
                        f"generates text; {prog} makes {task} rows for a BERT-style encoder ([CLS] text [SEP]). "
                        f"Give a BERT's folder (e.g. beomi/kcbert-base); text for a GPT-2 goes through "
                        f"tools/make_dataset.py")
    if mt is None and hub.cls_id < 0 and hub.sep_id < 0 and hub.pad_id < 0:
        raise DataError(f"--tokenizer {spec}: a GPT-2-style tokenizer (no [CLS], [SEP] or pad token), as text "
                        f"generators have; {prog} makes {task} rows for a BERT-style encoder: give a BERT's "
                        f"tokenizer; text for a GPT-2 goes through tools/make_dataset.py")


def type_vocab_beside(path: str) -> Optional[int]:
    """type_vocab_size of the config.json in a tokenizer's folder (or beside a tokenizer or
    vocabulary file), if any."""
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    try:
        with open(os.path.join(folder, "config.json"), "r", encoding="utf-8") as f:
            v = json.load(f).get("type_vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return v if isinstance(v, int) else None


def mark_single_segment(tok, path: str, prog: str, a_single=None):
    """tok.single_segment: the model beside the tokenizer has one token type (type_vocab_size = 1,
    RoBERTa): every token_type_ids value is then written 0, said once here."""
    beside = type_vocab_beside(path) == 1
    tok.single_segment = beside or bool(getattr(a_single, "single_segment", False))
    if tok.single_segment:
        why = (f"the model in '{path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))}' has "
               f"type_vocab_size = 1 (RoBERTa)") if beside else "--single-segment"
        print(f"{prog or 'prep'}: note: {why}: token_type_ids are all 0, also for a pair's second segment",
              file=sys.stderr)
    return tok


def load_tokenizer(a, prog: str = ""):
    """WordPiece for --vocab, HubRows for --tokenizer (single_segment set: mark_single_segment)."""
    tok = _load_tokenizer(a, prog)
    return mark_single_segment(tok, a.tokenizer or a.vocab, prog, a)


def _load_tokenizer(a, prog: str = ""):
    if a.tokenizer:
        hub = ht.load(a.tokenizer, lowercase=a.lowercase, strip_accents=True if a.strip_accents else None)
        if hub.kind != "hub":
            raise DataError(f"--tokenizer {a.tokenizer}: the BERT tools need a tokenizer folder or file, "
                            f"not the built-in '{hub.kind}'")
        check_encoder_tokenizer(hub, a.tokenizer, prog)
        tok = HubRows(hub)
        for what, limit in (("model_max_length", hub.model_max_length), ("max_position_embeddings", hub.max_positions)):
            if limit is not None and a.max_seq_len > limit:
                print(f"{prog or 'prep'}: warning: --max-seq-len {a.max_seq_len} exceeds {what} {limit} of "
                      f"'{hub.folder}'", file=sys.stderr)
        return tok
    tok = WordPiece(a.vocab, lowercase=a.lowercase, strip_accents=a.strip_accents)
    limit = max_positions(a.vocab)
    if limit is not None and a.max_seq_len > limit:
        print(f"{prog or 'prep'}: warning: --max-seq-len {a.max_seq_len} exceeds max_position_embeddings {limit} "
              f"of the model config beside the vocabulary", file=sys.stderr)
    return tok


def max_positions(vocab_path: str) -> Optional[int]:
    """max_position_embeddings of a config.json beside the vocabulary, if any."""
    p = os.path.join(os.path.dirname(os.path.abspath(vocab_path)), "config.json")
    try:
        with open(p, "r", encoding="utf-8") as f:
            v = json.load(f).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    return v if isinstance(v, int) else None


# ---- HDF5 output ----------------------------------------------------------------------------------

def _umask_mode() -> int:
    old = os.umask(0)
    os.umask(old)
    return 0o666 & ~old


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


class H5Writer:
    """Appends rows to resizable, chunked datasets of one temporary HDF5 file. Datasets are created
    on first append: int arrays as int32, lists of str as variable-length UTF-8 strings."""

    def __init__(self, final_path: str):
        import h5py

        self.final = final_path
        d = os.path.dirname(os.path.abspath(final_path))
        fd, self.tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(final_path) + ".", suffix=".tmp")
        os.close(fd)
        self.f = h5py.File(self.tmp, "w")
        self.sizes: Dict[str, int] = {}

    def append(self, **cols) -> None:
        import h5py
        import numpy as np

        for name, val in cols.items():
            if len(val) == 0:
                continue
            if isinstance(val, list) and isinstance(val[0], str):
                arr = np.array(val, dtype=object)
                dt, shape_tail, chunk_rows = h5py.string_dtype("utf-8"), (), 1024
            else:
                arr = np.asarray(val)
                if arr.dtype.kind not in "iub":
                    raise TypeError(f"dataset {name}: unsupported dtype {arr.dtype}")
                arr = arr.astype(np.int32)
                dt, shape_tail = np.int32, arr.shape[1:]
                per_row = int(np.prod(shape_tail)) if shape_tail else 1
                chunk_rows = max(1, min(1024, (1 << 16) // per_row))
            if name not in self.f:
                self.f.create_dataset(name, shape=(0,) + tuple(shape_tail), maxshape=(None,) + tuple(shape_tail),
                                      dtype=dt, chunks=(chunk_rows,) + tuple(shape_tail))
                self.sizes[name] = 0
            ds = self.f[name]
            n0 = self.sizes[name]
            n1 = n0 + len(arr)
            if len(arr):
                ds.resize((n1,) + tuple(ds.shape[1:]))
                ds[n0:n1] = arr
            self.sizes[name] = n1

    def set_attrs(self, attrs: dict) -> None:
        import numpy as np

        for k, v in attrs.items():
            if isinstance(v, bool):
                v = np.int64(int(v))
            elif isinstance(v, int):
                v = np.int64(v)
            elif isinstance(v, float):
                v = np.float64(v)
            self.f.attrs[k] = v

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None


class Outputs:
    """The output files of one run: all are renamed into place by commit(), or none (abort())."""

    def __init__(self):
        self.writers: List[H5Writer] = []

    def open(self, path: str) -> H5Writer:
        w = H5Writer(path)
        self.writers.append(w)
        return w

    def commit(self) -> None:
        for w in self.writers:
            w.close()
        mode = _umask_mode()
        for w in self.writers:
            os.chmod(w.tmp, mode)
        for w in self.writers:
            os.replace(w.tmp, w.final)
            w.tmp = None
        self.writers = []

    def abort(self) -> None:
        for w in self.writers:
            try:
                w.close()
            except Exception:
                pass
            if w.tmp:
                _remove(w.tmp)
        self.writers = []


def base_attrs(a, tok, task: str, id2label: Optional[Sequence[str]], sources: Iterable[str]) -> dict:
    """id2label None (unlabelled input without --label-names): no num_labels / id2label."""
    at = dict(task=task, max_seq_len=a.max_seq_len, source="\n".join(os.path.abspath(s) for s in sources),
              seed=a.seed)
    if id2label is not None:
        at.update(num_labels=len(id2label), id2label=json.dumps(list(id2label), ensure_ascii=False))
    if hasattr(a, "no_labels"):
        at["has_labels"] = int(not a.no_labels)
    at.update(tok.attrs())
    if getattr(tok, "single_segment", False):
        at["type_vocab_size"] = 1
    return at


def pad_encodings(encs, T: int, pad_id: int, single_segment: bool = False) -> dict:
    """input_ids / attention_mask / token_type_ids [n,T] of backend encodings (unpadded), padded
    after the tokens as transformers' padding="max_length" does; single_segment: types all 0."""
    rows = [e.ids for e in encs]
    types = [[0] * len(e.ids) if single_segment else e.type_ids for e in encs]
    import numpy as np

    ids = pad_2d(rows, T, pad_id)
    mask = np.zeros_like(ids)
    for i, r in enumerate(rows):
        mask[i, :len(r)] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": pad_2d(types, T, 0)}


def parse_label_names(value: Optional[str], opt: str = "--label-names", min_n: int = 2) -> Optional[List[str]]:
    if value is None:
        return None
    names = [x.strip() for x in value.split(",")]
    if len(names) < min_n or any(not x for x in names) or len(set(names)) != len(names):
        raise DataError(f"{opt} '{value}': need at least {min_n} distinct, non-empty names")
    return names


def parts(a, n_units: int):
    """[(split name or None, unit indices, output path)] for this run."""
    if a.split_eval is None:
        return [(None, list(range(n_units)), a.out)]
    tr, ev = split_units(n_units, a.split_eval, a.seed)
    return [("train", tr, a.out), ("eval", ev, a.eval_out)]


def batched(seq: Sequence, n: int = ROWS_PER_WRITE):
    for i in range(0, len(seq), n):
        yield seq[i:i + n]


def run_main(prog: str, body, argv=None) -> int:
    """Run body(outputs) with the standard error handling: DataError/OSError -> message naming the
    culprit on stderr and exit 1, with every temporary output removed."""
    outs = Outputs()
    try:
        body(outs)
        outs.commit()
        return 0
    except DataError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    finally:
        outs.abort()


def say(a, msg: str) -> None:
    if not a.quiet:
        print(msg, flush=True)
