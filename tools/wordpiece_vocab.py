"""A BERT WordPiece vocabulary file (vocab.txt: one token per line, id = line number) and the case
its tokenizer takes by default. Shared by prep_common.py (the --vocab tokenizer of the prep_*.py tools)
and hub_tokenizer.py (a Hub folder holding a vocab.txt); it imports neither of them.

    vocab = read_vocab(path)                       # {token: id}; DataError on a bad file
    lowercase, why = default_lowercase(path, vocab)
"""
from __future__ import annotations

import json
import os
import sys
from typing import Dict, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nlptrain_data import DataError  # noqa: E402

SPECIALS = ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]")


def read_vocab(path: str) -> Dict[str, int]:
    """vocab.txt -> {token: line number}. Like HF: a trailing newline ends the last line; a token may
    not repeat (it would make the ids ambiguous)."""
    if not os.path.exists(path):
        raise DataError(f"vocabulary file '{path}' not found")
    if os.path.isdir(path):
        raise DataError(f"vocabulary '{path}' is a folder (give the vocab.txt file)")
    try:
        with open(path, "r", encoding="utf-8", newline="") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise DataError(f"vocabulary file '{path}' is not valid UTF-8 (byte offset {e.start})") from None
    except OSError as e:
        raise DataError(f"cannot read vocabulary file '{path}': {e.strerror}") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    vocab: Dict[str, int] = {}
    for i, line in enumerate(lines):
        tok = line.rstrip("\r")
        if tok in vocab:
            raise DataError(f"vocabulary file '{path}' line {i + 1}: token {tok!r} repeats line {vocab[tok] + 1}")
        vocab[tok] = i
    if not vocab:
        raise DataError(f"vocabulary file '{path}' is empty")
    missing = [s for s in SPECIALS if s not in vocab]
    if missing:
        raise DataError(f"vocabulary file '{path}' lacks the special token(s) {', '.join(missing)}")
    return vocab


def has_upper_case(vocab: Dict[str, int]) -> bool:
    """Whether a non-special token changes under lower-casing ([CLS] and other bracketed specials
    such as [unused0] are not counted)."""
    for tok in vocab:
        if len(tok) > 2 and tok[0] == "[" and tok[-1] == "]":
            continue
        if tok.lower() != tok:
            return True
    return False


def default_lowercase(vocab_path: str, vocab: Dict[str, int]) -> Tuple[bool, str]:
    """(lowercase, why) when neither --lowercase nor --no-lowercase is given."""
    folder = os.path.dirname(os.path.abspath(vocab_path))
    for name in ("tokenizer_config.json", "config.json"):
        p = os.path.join(folder, name)
        if os.path.isfile(p):
            try:
                with open(p, "r", encoding="utf-8") as f:
                    cfg = json.load(f)
            except (OSError, ValueError) as e:
                raise DataError(f"cannot read '{p}': {e}") from None
            if isinstance(cfg, dict) and isinstance(cfg.get("do_lower_case"), bool):
                return cfg["do_lower_case"], f"do_lower_case in {p}"
    up = has_upper_case(vocab)
    return (not up), ("the vocabulary has upper-case tokens" if up else "the vocabulary has no upper-case tokens")
