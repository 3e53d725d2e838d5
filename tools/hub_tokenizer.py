"""Tokenizers from a Hugging Face model folder (or nlptrain's built-in `byte` / `gpt2`), for the data
tools (make_dataset.py, prep_*.py, encode_prompts.py, decode_generated.py, hf_export.py).

    tok = load(spec, vocab_dir=None)

spec
  byte   id = byte value, vocabulary 256, no special tokens (nlptrain_data.ByteTokenizer).
  gpt2   GPT-2 byte-level BPE from VOCAB_DIR/encoder.json + vocab.bpe (nlptrain_data.Gpt2Tokenizer;
         needs vocab_dir). EOS = BOS = <|endoftext|>.
  PATH   a folder, or a file inside one, holding (looked for in this order, first match wins):
           tokenizer.json               any HF `tokenizers` tokenizer, used exactly as saved
                                        (normaliser, pre-tokenizer, model, post-processor, decoder);
           vocab.json + merges.txt      GPT-2-style byte-level BPE (no special-token template);
           encoder.json + vocab.bpe     the same, OpenAI's file names;
           vocab.txt                    BERT WordPiece ([CLS] A [SEP] / [CLS] A [SEP] B [SEP]).
         A file argument picks that file (tokenizer.json, vocab.txt, vocab.json/encoder.json with
         its merges file beside it). A vocab.json that is not byte-level (no 'Ġ' token: e.g. a
         Metaspace/SentencePiece BPE exported without its tokenizer.json) is an error, because
         reading it as GPT-2 BPE silently drops every character outside its byte alphabet
         (all Hangul); give the tokenizer.json instead.

Special tokens (bos, eos, pad, cls, sep, unk, mask), as transformers resolves them:
  tokenizer_config.json `<name>_token`, overridden by special_tokens_map.json (a string or an
  {"content": ...} object); then, for a token still unknown: vocab.txt / a WordPiece tokenizer.json:
  [CLS] [SEP] [PAD] [MASK] [UNK] when in the vocabulary; byte-level BPE: <|endoftext|> as bos, eos
  and unk when in the vocabulary; finally the ids bos_token_id / eos_token_id / pad_token_id of a
  config.json beside the tokenizer. A named token that is not in the vocabulary is an error.
  model_max_length comes from tokenizer_config.json (ignored when >= 1e9, transformers' "no limit").

Case of a vocab.txt (ignored for tokenizer.json, whose normaliser decides): do_lower_case and
  strip_accents from tokenizer_config.json as transformers does (strip_accents null follows
  do_lower_case); without a tokenizer_config.json saying so, do_lower_case from config.json, else
  lower-case exactly when the vocabulary has no upper-case token, and never strip accents
  (transformers would default to do_lower_case=True, which strips accents and turns Hangul into
  [UNK]); the lowercase / strip_accents arguments override.

Fingerprints (recorded as HDF5 root attributes by every data tool; see attrs()):
  tokenizer_files   absolute paths of the files read, newline-separated, in this order: the model
                    file(s) (tokenizer.json | vocab.json, merges.txt | encoder.json, vocab.bpe |
                    vocab.txt), then tokenizer_config.json and special_tokens_map.json when present.
                    config.json is read for special ids but is not a tokenizer file. "" for byte.
  tokenizer_sha256  SHA-256 (hex) over the files in that order; each file contributes
                    "<basename>\\n<size in bytes>\\n" (UTF-8) followed by its bytes.
                    For byte: SHA-256 of "byte:256".
  vocab_sha256      SHA-256 (hex) of the canonical vocabulary: for every id 0 .. vocab_size-1 in
                    order, "<id>\\t<token>\\n" (UTF-8), added tokens included, an id without a token
                    as the empty string; in <token>, backslash, tab, newline and carriage return are
                    written as \\\\, \\t, \\n, \\r. The same vocabulary gives the same value whatever
                    file holds it (vocab.txt or tokenizer.json; encoder.json or a GPT-2
                    tokenizer.json). For byte: SHA-256 of "byte:256".
  tokenizer         "byte", "gpt2" or "hub" (a PATH).
  vocab_size        ids in the vocabulary, added tokens included (max id + 1).
  bos_id eos_id pad_id cls_id sep_id unk_id mask_id   where defined.
  model_max_length  where tokenizer_config.json gives one.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nlptrain_data as nd  # noqa: E402
from nlptrain_data import DataError  # noqa: E402,F401
import wordpiece_vocab as wv  # noqa: E402

SPECIAL_NAMES = ("bos", "eos", "pad", "cls", "sep", "unk", "mask")
MODEL_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe"), ("vocab.txt",))
CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")
BERT_SPECIALS = {"cls": "[CLS]", "sep": "[SEP]", "pad": "[PAD]", "mask": "[MASK]", "unk": "[UNK]"}
GPT2_EOS = nd.EOS_TOKEN
NO_LIMIT = 10 ** 9
BYTE_SHA = hashlib.sha256(b"byte:256").hexdigest()


# ---- fingerprints -----------------------------------------------------------------------------------

def files_sha256(paths: Sequence[str]) -> str:
    h = hashlib.sha256()
    for p in paths:
        try:
            with open(p, "rb") as f:
                data = f.read()
        except OSError as e:
            raise DataError(f"cannot read tokenizer file '{p}': {e.strerror}") from None
        h.update(f"{os.path.basename(p)}\n{len(data)}\n".encode("utf-8"))
        h.update(data)
    return h.hexdigest()


def _escape(tok: str) -> str:
    return tok.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def vocab_sha256(id_to_token: Dict[int, str], size: int) -> str:
    h = hashlib.sha256()
    for i in range(size):
        h.update(f"{i}\t{_escape(id_to_token.get(i, ''))}\n".encode("utf-8"))
    return h.hexdigest()


# ---- config files -----------------------------------------------------------------------------------

def _read_json(path: str):
    try:
        with open(path, "r", encoding="utf-8") as f:
            return json.load(f)
    except UnicodeDecodeError as e:
        raise DataError(f"'{path}' is not valid UTF-8 (byte offset {e.start})") from None
    except json.JSONDecodeError as e:
        raise DataError(f"'{path}' is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except OSError as e:
        raise DataError(f"cannot read '{path}': {e.strerror}") from None


def _token_text(v):
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]
    return None


def _find_model_files(path: str):
    """(folder, [model file paths], kind) for a PATH spec; DataError when nothing fits."""
    if not os.path.exists(path):
        raise DataError(f"tokenizer '{path}' not found (give byte, gpt2, or a folder or file with tokenizer.json, "
                        f"vocab.json + merges.txt, encoder.json + vocab.bpe or vocab.txt)")
    if os.path.isdir(path):
        folder = os.path.abspath(path)
        for names in MODEL_FILES:
            ps = [os.path.join(folder, n) for n in names]
            if all(os.path.isfile(p) for p in ps):
                return folder, ps, _kind_of(names[0])
        looked = ", ".join(" + ".join(n) for n in MODEL_FILES)
        raise DataError(f"tokenizer folder '{folder}' has no tokenizer files (looked for {looked})")
    p = os.path.abspath(path)
    folder, name = os.path.split(p)
    if name in ("vocab.json", "encoder.json"):
        merges = os.path.join(folder, "merges.txt" if name == "vocab.json" else "vocab.bpe")
        if not os.path.isfile(merges):
            raise DataError(f"tokenizer '{p}': its merges file '{merges}' not found")
        return folder, [p, merges], "bpe"
    if name.endswith(".txt"):
        return folder, [p], "wordpiece"
    if name.endswith(".json"):
        return folder, [p], "json"
    raise DataError(f"tokenizer file '{p}': unknown kind (expected tokenizer.json, vocab.json, encoder.json or vocab.txt)")


def _kind_of(first: str) -> str:
    return {"tokenizer.json": "json", "vocab.json": "bpe", "encoder.json": "bpe", "vocab.txt": "wordpiece"}[first]


# ---- the tokenizer ----------------------------------------------------------------------------------

class HubTokenizer:
    """A tokenizer with its special ids and fingerprints. `backend` is a tokenizers.Tokenizer
    (None for byte)."""

    def __init__(self):
        self.kind = "hub"
        self.backend = None
        self.files: List[str] = []
        self.folder: Optional[str] = None
        self.vocab_size = 0
        self.special: Dict[str, int] = {}
        self.special_tokens: Dict[str, str] = {}
        self.model_max_length: Optional[int] = None
        self.max_positions: Optional[int] = None
        self.lowercase: Optional[bool] = None
        self.lowercase_reason = "the tokenizer's normaliser"
        self.tokenizer_sha256 = BYTE_SHA
        self.vocab_sha256 = BYTE_SHA
        self.description = ""
        self._legacy = None  # nlptrain_data tokenizer for byte / gpt2

    # special ids: -1 where undefined
    def __getattr__(self, name):
        if name.endswith("_id") and name[:-3] in SPECIAL_NAMES:
            return self.__dict__.get("special", {}).get(name[:-3], -1)
        raise AttributeError(name)

    @property
    def name(self) -> str:
        return self.kind

    # ---- encoding
    def encode(self, text: str, pair: Optional[str] = None, add_special_tokens: bool = True):
        """A tokenizers.Encoding (ids, type_ids, offsets, word_ids, overflowing, ...)."""
        if self.backend is None:
            raise DataError("the byte tokenizer has no encodings with offsets")
        return self.backend.encode(text, pair, add_special_tokens=add_special_tokens)

    def encode_batch(self, items: Sequence, add_special_tokens: bool = True):
        """Encodings of texts or (text, pair) tuples, in parallel inside the library."""
        if not items:
            return []
        if self.backend is None:
            raise DataError("the byte tokenizer has no encodings with offsets")
        return self.backend.encode_batch(list(items), add_special_tokens=add_special_tokens)

    def ids(self, texts: Sequence[str], add_special_tokens: bool = False) -> List[List[int]]:
        if self.kind == "byte":
            return [list(t.encode("utf-8")) for t in texts]
        return [e.ids for e in self.encode_batch(texts, add_special_tokens)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ids (invalid UTF-8 from byte-level pieces becomes U+FFFD, as in transformers)."""
        n = self.vocab_size
        for i, t in enumerate(ids):
            if not 0 <= int(t) < n:
                raise DataError(f"token id {int(t)} at position {i} is outside [0, {n}) for tokenizer "
                                f"{self.description}")
        if self._legacy is not None:
            ids = [int(t) for t in ids]
            if skip_special_tokens and self.kind == "gpt2":
                ids = [t for t in ids if t != self.eos_id]
            return self._legacy.decode(ids).decode("utf-8", errors="replace")
        return self.backend.decode([int(t) for t in ids], skip_special_tokens=skip_special_tokens)

    # ---- truncation (the backend's own, as transformers uses it)
    def set_truncation(self, max_length: Optional[int], strategy: str = "longest_first", stride: int = 0):
        if max_length is None:
            self.backend.no_truncation()
        else:
            self.backend.enable_truncation(max_length, stride=stride, strategy=strategy, direction="right")

    def num_special_tokens(self, pair: bool) -> int:
        if self.backend is None:
            return 0
        return self.backend.num_special_tokens_to_add(pair)

    # ---- HDF5 attributes
    def attrs(self) -> dict:
        at = dict(tokenizer=self.kind, vocab_size=int(self.vocab_size), tokenizer_files="\n".join(self.files),
                  tokenizer_sha256=self.tokenizer_sha256, vocab_sha256=self.vocab_sha256)
        for k in SPECIAL_NAMES:
            if k in self.special:
                at[f"{k}_id"] = int(self.special[k])
        if self.model_max_length is not None:
            at["model_max_length"] = int(self.model_max_length)
        return at


def _finish_vocab(t: HubTokenizer) -> None:
    vocab = t.backend.get_vocab(with_added_tokens=True)
    inv = {i: s for s, i in vocab.items()}
    t.vocab_size = (max(inv) + 1) if inv else 0
    t.vocab_sha256 = vocab_sha256(inv, t.vocab_size)


def _wordpiece_backend(vocab_path: str, lowercase: bool, strip_accents: Optional[bool]):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = wv.read_vocab(vocab_path)
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=strip_accents, lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.add_special_tokens([s for s in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]") if s in vocab])
    return tok, vocab


def _bpe_backend(vocab_path: str, merges_path: str, add_prefix_space: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = _read_json(vocab_path)
    if not isinstance(vocab, dict) or not vocab:
        raise DataError(f"vocabulary '{vocab_path}' is not a non-empty JSON object")
    if "\u0120" not in vocab:
        raise DataError(f"vocabulary '{vocab_path}' is not a byte-level BPE (it has no 'Ġ' token): reading it with "
                        f"'{os.path.basename(merges_path)}' as GPT-2 BPE would silently drop every character "
                        f"outside its alphabet; give the tokenizer.json of this tokenizer instead")
    try:
        tok = Tokenizer(models.BPE.from_file(vocab_path, merges_path))
    except Exception as e:  # the library raises plain Exception for bad files
        raise DataError(f"cannot load BPE from '{vocab_path}' and '{merges_path}': {e}") from None
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B:1", special_tokens=[])
    if GPT2_EOS in vocab:
        tok.add_special_tokens([GPT2_EOS])
    return tok


def _load_path(path: str, lowercase: Optional[bool], strip_accents: Optional[bool]) -> HubTokenizer:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise DataError("Hub tokenizers need the Python package 'tokenizers' (pip install tokenizers)") from None
    folder, model_files, kind = _find_model_files(path)
    t = HubTokenizer()
    t.folder = folder
    cfg_paths = [os.path.join(folder, n) for n in CONFIG_FILES if os.path.isfile(os.path.join(folder, n))]
    tcfg = {}
    for p in cfg_paths:
        d = _read_json(p)
        if not isinstance(d, dict):
            raise DataError(f"'{p}' is not a JSON object")
        tcfg[os.path.basename(p)] = d
    model_cfg_path = os.path.join(folder, "config.json")
    mcfg = _read_json(model_cfg_path) if os.path.isfile(model_cfg_path) else {}
    if not isinstance(mcfg, dict):
        raise DataError(f"'{model_cfg_path}' is not a JSON object")
    tc = tcfg.get("tokenizer_config.json", {})

    if (lowercase is not None or strip_accents is not None) and kind != "wordpiece":
        raise DataError(f"--lowercase / --strip-accents apply to a vocab.txt only; '{model_files[0]}' carries "
                        f"its own normaliser")
    family = None
    if kind == "json":
        try:
            t.backend = Tokenizer.from_file(model_files[0])
        except Exception as e:
            raise DataError(f"cannot parse tokenizer file '{model_files[0]}': {e}") from None
        try:
            family = json.loads(t.backend.to_str()).get("model", {}).get("type")
        except ValueError:
            family = None
    elif kind == "bpe":
        t.backend = _bpe_backend(model_files[0], model_files[1], bool(tc.get("add_prefix_space", False)))
        family = "BPE"
    else:
        if lowercase is None:
            if isinstance(tc.get("do_lower_case"), bool):
                lowercase = tc["do_lower_case"]
                t.lowercase_reason = f"do_lower_case in {os.path.join(folder, 'tokenizer_config.json')}"
                if strip_accents is None:
                    sa = tc.get("strip_accents")
                    strip_accents = sa if isinstance(sa, bool) else None  # None follows lowercase
            else:
                lowercase, t.lowercase_reason = wv.default_lowercase(model_files[0], wv.read_vocab(model_files[0]))
        else:
            t.lowercase_reason = "--lowercase" if lowercase else "--no-lowercase"
        if strip_accents is None and not (isinstance(tc.get("do_lower_case"), bool)):
            strip_accents = False
        t.backend, _ = _wordpiece_backend(model_files[0], bool(lowercase), strip_accents)
        t.lowercase = bool(lowercase)
        family = "WordPiece"
    t.files = model_files + cfg_paths
    t.tokenizer_sha256 = files_sha256(t.files)
    _finish_vocab(t)

    # special tokens
    names: Dict[str, tuple] = {}
    for fname in CONFIG_FILES:
        d = tcfg.get(fname, {})
        for k in SPECIAL_NAMES:
            v = _token_text(d.get(f"{k}_token"))
            if v is not None:
                names[k] = (v, os.path.join(folder, fname))
    vocab = t.backend.get_vocab(with_added_tokens=True)
    if family == "WordPiece":
        for k, s in BERT_SPECIALS.items():
            if k not in names and s in vocab:
                names[k] = (s, "the BERT default")
    if family == "BPE" and GPT2_EOS in vocab and "Ġ" in vocab:
        for k in ("bos", "eos", "unk"):
            if k not in names:
                names[k] = (GPT2_EOS, "the GPT-2 default")
    for k, (s, where) in names.items():
        i = t.backend.token_to_id(s)
        if i is None:
            raise DataError(f"{k}_token {s!r} (from {where}) is not in the vocabulary of '{model_files[0]}'")
        t.special[k] = int(i)
        t.special_tokens[k] = s
    for k in ("bos", "eos", "pad"):
        v = mcfg.get(f"{k}_token_id")
        if k not in t.special and isinstance(v, int) and not isinstance(v, bool) and 0 <= v < t.vocab_size:
            t.special[k] = v
            t.special_tokens[k] = t.backend.id_to_token(v) or ""
    mml = tc.get("model_max_length")
    if isinstance(mml, (int, float)) and not isinstance(mml, bool) and 0 < mml < NO_LIMIT:
        t.model_max_length = int(mml)
    for key in ("max_position_embeddings", "n_positions"):
        if isinstance(mcfg.get(key), int):
            t.max_positions = mcfg[key]
            break
    t.description = f"'{path}'"
    return t


def load(spec: str, vocab_dir: Optional[str] = None, lowercase: Optional[bool] = None,
         strip_accents: Optional[bool] = None) -> HubTokenizer:
    """The tokenizer named by spec (byte, gpt2 or a PATH); DataError naming what is wrong."""
    if not spec:
        raise DataError("empty tokenizer name (give byte, gpt2 or a Hub folder)")
    if spec == "byte":
        t = HubTokenizer()
        t.kind = "byte"
        t._legacy = nd.ByteTokenizer()
        t.vocab_size = nd.BYTE_VOCAB
        t.description = "byte"
        return t
    if spec == "gpt2" and not os.path.exists(spec):
        legacy = nd.Gpt2Tokenizer(vocab_dir)
        t = HubTokenizer()
        t.kind = "gpt2"
        t._legacy = legacy
        t.backend = legacy._hf
        t.folder = legacy.vocab_dir
        t.files = [os.path.abspath(legacy.encoder_path), os.path.abspath(legacy.merges_path)]
        t.tokenizer_sha256 = files_sha256(t.files)
        vocab = _read_json(legacy.encoder_path)
        t.vocab_size = legacy.vocab_size
        t.vocab_sha256 = vocab_sha256({i: s for s, i in vocab.items()}, t.vocab_size)
        if legacy.eos_id >= 0:
            t.special = {"bos": legacy.eos_id, "eos": legacy.eos_id, "unk": legacy.eos_id}
        t.description = f"gpt2 ('{legacy.vocab_dir}')"
        return t
    return _load_path(spec, lowercase, strip_accents)
