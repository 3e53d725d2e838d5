"""Shared helpers for nlptrain's data tools (make_dataset.py, decode.py).

Tokenizers (the same two as the C++ trainer, src/text/tokenizer.h):
  byte  id = byte value, vocab 256, no EOS.
  gpt2  GPT-2 byte-level BPE from VOCAB_DIR/encoder.json (or vocab.json) and VOCAB_DIR/vocab.bpe
        (or merges.txt). Encoding uses the HF `tokenizers` library (models.BPE +
        pre_tokenizers.ByteLevel(add_prefix_space=False)); decoding maps ids back to raw bytes
        through the inverse GPT-2 bytes-to-unicode map, so it needs only encoder.json and returns
        the exact bytes (possibly invalid UTF-8 for a slice that splits a character).
"""
from __future__ import annotations

import codecs
import json
import os
import re
import unicodedata
from typing import Iterator, List, Optional, Sequence

BYTE_VOCAB = 256
EOS_TOKEN = "<|endoftext|>"


class DataError(Exception):
    """A user-facing error (bad input file, option or vocabulary); the message names the culprit."""


# ---- GPT-2 bytes <-> unicode ---------------------------------------------------------------------

def bytes_to_unicode() -> dict:
    """GPT-2's reversible map byte -> printable character: the printable Latin-1 bytes map to
    themselves, the 68 others to U+0100.. in increasing byte order (space -> 'Ġ')."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0x100))
    out, nxt = {}, 256
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(nxt)
            nxt += 1
    return out


def gpt2_files(vocab_dir: Optional[str]) -> tuple:
    """(encoder.json path, merges path) in vocab_dir; DataError naming the missing path."""
    if not vocab_dir:
        raise DataError("the gpt2 tokenizer needs --vocab-dir (a folder with encoder.json and vocab.bpe)")
    if not os.path.isdir(vocab_dir):
        raise DataError(f"vocabulary folder '{vocab_dir}' not found")
    found = []
    for names in (("encoder.json", "vocab.json"), ("vocab.bpe", "merges.txt")):
        paths = [os.path.join(vocab_dir, n) for n in names]
        hit = next((p for p in paths if os.path.isfile(p)), None)
        if hit is None:
            raise DataError(f"vocabulary file '{paths[0]}' not found (nor '{paths[1]}')")
        found.append(hit)
    return tuple(found)


# ---- tokenizers --------------------------------------------------------------------------------

class ByteTokenizer:
    name = "byte"
    vocab_size = BYTE_VOCAB
    eos_id = -1
    vocab_dir = None

    def encode_bytes(self, data: bytes) -> List[int]:
        return list(data)

    def decode(self, ids: Sequence[int]) -> bytes:
        for i, t in enumerate(ids):
            if not 0 <= int(t) < BYTE_VOCAB:
                raise DataError(f"token id {int(t)} at position {i} is outside [0, 256) for the byte tokenizer")
        return bytes(int(t) for t in ids)


class Gpt2Tokenizer:
    name = "gpt2"

    def __init__(self, vocab_dir: Optional[str], need_encoder: bool = True):
        self.vocab_dir = os.path.abspath(vocab_dir) if vocab_dir else vocab_dir
        self.encoder_path, self.merges_path = gpt2_files(vocab_dir)
        try:
            with open(self.encoder_path, "r", encoding="utf-8") as f:
                vocab = json.load(f)
        except (OSError, ValueError) as e:
            raise DataError(f"cannot read vocabulary '{self.encoder_path}': {e}") from None
        if not isinstance(vocab, dict) or not vocab:
            raise DataError(f"vocabulary '{self.encoder_path}' is not a non-empty JSON object")
        n = len(vocab)
        if sorted(vocab.values()) != list(range(n)):
            raise DataError(f"vocabulary '{self.encoder_path}': ids are not exactly 0..{n - 1}")
        self.vocab_size = n
        self.eos_id = vocab.get(EOS_TOKEN, -1)
        inv = {c: b for b, c in bytes_to_unicode().items()}
        self._bytes = [b""] * n
        for tok, i in vocab.items():
            try:
                self._bytes[i] = bytes(inv[c] for c in tok)
            except KeyError:  # like the HF ByteLevel decoder: unmapped characters stay as UTF-8
                self._bytes[i] = tok.encode("utf-8")
        self._hf = None
        if need_encoder:
            self._hf = self._load_hf()

    def _load_hf(self):
        try:
            from tokenizers import Tokenizer, decoders, models, pre_tokenizers
        except ImportError:
            raise DataError("the gpt2 tokenizer needs the Python package 'tokenizers' (pip install tokenizers)") from None
        try:
            tok = Tokenizer(models.BPE.from_file(self.encoder_path, self.merges_path))
        except Exception as e:  # the library raises plain Exception for bad files
            raise DataError(f"cannot load GPT-2 BPE from '{self.encoder_path}' and '{self.merges_path}': {e}") from None
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        return tok

    def encode_texts(self, texts: Sequence[str]) -> List[List[int]]:
        """Encode independent texts (in parallel inside the library)."""
        fast = getattr(self._hf, "encode_batch_fast", None) or self._hf.encode_batch
        return [e.ids for e in fast(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> bytes:
        out = []
        for i, t in enumerate(ids):
            t = int(t)
            if not 0 <= t < self.vocab_size:
                raise DataError(f"token id {t} at position {i} is outside [0, {self.vocab_size}) for the gpt2 tokenizer")
            out.append(self._bytes[t])
        return b"".join(out)


def load_tokenizer(kind: str, vocab_dir: Optional[str], need_encoder: bool = True):
    if kind == "byte":
        return ByteTokenizer()
    if kind == "gpt2":
        return Gpt2Tokenizer(vocab_dir, need_encoder=need_encoder)
    raise DataError(f"unknown tokenizer '{kind}' (expected 'byte' or 'gpt2')")


# ---- reading text in pieces that tokenize exactly like the whole file --------------------------

# A position p is a safe place to cut text for GPT-2 encoding when text[p-1] is a letter or number
# (General_Category L or N) and text[p] is ASCII whitespace: every pre-tokenizer match that contains
# text[p-1] ends at p, and matches never look behind, so encode(a + b) == encode(a) + encode(b).
# (Python's Unicode data may be older than the tokenizer's; anything it calls L/N the tokenizer does
# too, so the test only errs on the side of not cutting.)
_CUT = re.compile(r"[^\W_](?=[ \t\r\n])")


def last_safe_cut(s: str) -> int:
    """Largest safe cut position in s (0 < p < len(s)), or 0 if there is none."""
    hi = len(s)
    window = 1 << 14
    while hi > 0:
        lo = max(0, hi - window)
        best = 0
        for m in _CUT.finditer(s, lo, min(len(s), hi + 1)):
            if unicodedata.category(m.group())[0] in "LN":
                best = m.end()
        if best:
            return best
        hi = lo
        window *= 4
    return 0


def lf_text(s: str) -> str:
    """CRLF and lone CR line endings as LF (Python's universal newlines, as a file opened in text
    mode reads them)."""
    return s.replace("\r\n", "\n").replace("\r", "\n") if "\r" in s else s


def read_text_pieces(path: str, piece_chars: int = 1 << 18, block_bytes: int = 1 << 22,
                     keep_cr: bool = True) -> Iterator[str]:
    """Yield the UTF-8 text of `path` in consecutive pieces of about piece_chars characters, cut only
    at safe positions (see last_safe_cut), without holding the whole file in memory.
    Invalid UTF-8 is a DataError naming the file and byte offset. Unless keep_cr, CRLF and CR line
    endings come out as LF (a safe cut never falls between CR and LF: it follows a letter)."""
    for piece in _read_text_pieces(path, piece_chars, block_bytes):
        yield piece if keep_cr else lf_text(piece)


def _read_text_pieces(path: str, piece_chars: int, block_bytes: int) -> Iterator[str]:
    dec = codecs.getincrementaldecoder("utf-8")("strict")
    buf = ""
    fed = 0
    try:
        f = open(path, "rb")
    except OSError as e:
        raise DataError(f"cannot open input file '{path}': {e.strerror}") from None
    with f:
        while True:
            try:
                block = f.read(block_bytes)
            except OSError as e:
                raise DataError(f"cannot read input file '{path}': {e.strerror}") from None
            final = not block
            pending = len(dec.getstate()[0])
            try:
                buf += dec.decode(block, final)
            except UnicodeDecodeError as e:
                raise DataError(f"input file '{path}' is not valid UTF-8 (byte offset {fed - pending + e.start})") from None
            fed += len(block)
            while len(buf) >= 2 * piece_chars or (final and buf):
                if final and len(buf) < 2 * piece_chars:
                    yield buf
                    buf = ""
                    break
                cut = last_safe_cut(buf[: piece_chars + 1])
                if cut == 0:
                    cut = last_safe_cut(buf)
                if cut == 0:
                    if final:
                        yield buf
                        buf = ""
                    break  # no safe cut yet: read more
                yield buf[:cut]
                buf = buf[cut:]
            if final:
                return


def read_byte_blocks(path: str, block_bytes: int = 1 << 22, keep_cr: bool = True) -> Iterator[bytes]:
    """The bytes of `path` in blocks; unless keep_cr, CRLF and lone CR bytes become LF."""
    if keep_cr:
        yield from _read_byte_blocks(path, block_bytes)
        return
    carry = b""
    for block in _read_byte_blocks(path, block_bytes):
        block = carry + block
        carry = b""
        if block.endswith(b"\r"):  # may be the first half of a CRLF split across blocks
            block, carry = block[:-1], b"\r"
        yield block.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    if carry:
        yield b"\n"


def read_text_lines(path: str, keep_cr: bool = False, block_bytes: int = 1 << 22) -> Iterator[str]:
    """The lines of a UTF-8 file as Hugging Face datasets' `text` loader yields them with
    keep_linebreaks=True (what run_clm.py uses): the file read in text mode (CRLF and CR become LF,
    unless keep_cr), split on LF only, each line keeping its LF; a blank line is "\n"; a last line
    without LF is kept. Invalid UTF-8 is a DataError naming the file and byte offset."""
    dec = codecs.getincrementaldecoder("utf-8")("strict")
    fed = 0
    rest = ""
    blocks = _read_byte_blocks(path, block_bytes)
    while True:
        block = next(blocks, None)
        final = block is None
        pending = len(dec.getstate()[0])
        try:
            text = dec.decode(block or b"", final)
        except UnicodeDecodeError as e:
            raise DataError(f"input file '{path}' is not valid UTF-8 (byte offset {fed - pending + e.start})") from None
        fed += len(block or b"")
        text = rest + text
        if not keep_cr:
            hold = text.endswith("\r") and not final  # maybe the first half of a CRLF
            text = lf_text(text[:-1] if hold else text) + ("\r" if hold else "")
        cut = len(text) if final else text.rfind("\n") + 1
        rest = text[cut:]
        if cut:
            yield from _split_lf(text[:cut])
        if final:
            return


def _split_lf(text: str) -> List[str]:
    """Split on LF only (str.splitlines would also split on VT, FF, U+2028, ...), keeping the LFs."""
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def _read_byte_blocks(path: str, block_bytes: int = 1 << 22) -> Iterator[bytes]:
    try:
        f = open(path, "rb")
    except OSError as e:
        raise DataError(f"cannot open input file '{path}': {e.strerror}") from None
    with f:
        while True:
            try:
                block = f.read(block_bytes)
            except OSError as e:
                raise DataError(f"cannot read input file '{path}': {e.strerror}") from None
            if not block:
                return
            yield block
