#!/usr/bin/env python3
"""Decode token ids back to text, from an HDF5 dataset slice or a comma-separated list.

The decoded bytes are written unchanged (to stdout or --out), so byte-tokenizer data and slices that
split a multi-byte character come out exactly as stored.

Sources
  FILE.h5     a dataset written by make_dataset.py (or any nlptrain token file). --dataset picks the
              dataset (default: `tokens` if present, else `input_ids`); --start/--count select
              positions of a 1-D dataset or rows of a 2-D one. Rows are decoded one per line
              (--row-sep), leaving out positions whose attention_mask is 0 unless --keep-padding.
              The tokenizer defaults to the file's `tokenizer` attribute and, for gpt2, the vocabulary
              folder to its `vocab_dir` attribute when that folder exists.
  --ids LIST  ids such as "15496,11,995" (needs --tokenizer).
  Hub data (make_dataset.py --tokenizer PATH, the prep tools): decoded with that tokenizer, found
  through the file's tokenizer_files attribute (or --tokenizer PATH).

Examples
  decode.py train.h5 --start 0 --count 200
  decode.py --tokenizer gpt2 --vocab-dir data/vocab/gpt2 --ids 15496,11,995
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nlptrain_data as nd  # noqa: E402

PROG = "decode.py"


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("h5", nargs="?", metavar="FILE.h5", help="HDF5 token file")
    p.add_argument("--ids", metavar="LIST", help="comma-separated token ids instead of a file")
    p.add_argument("--tokenizer", metavar="byte|gpt2|PATH",
                   help="byte, gpt2, or a Hugging Face tokenizer folder or file (default: the file's "
                        "tokenizer attribute, and for Hub and WordPiece data the folder of its tokenizer_files)")
    p.add_argument("--vocab-dir", help="folder with encoder.json (gpt2)")
    p.add_argument("--dataset", help="dataset name (default tokens, else input_ids)")
    p.add_argument("--start", type=int, default=0, help="first position (1-D) or row (2-D) (default 0)")
    p.add_argument("--count", type=int, help="number of positions or rows (default: to the end)")
    p.add_argument("--keep-padding", action="store_true", help="2-D: also decode attention_mask 0 positions")
    p.add_argument("--row-sep", default="\\n", help="separator written after each row (default \\n; escapes allowed)")
    p.add_argument("--out", metavar="FILE", help="write to FILE instead of stdout")
    return p.parse_args(argv)


def parse_id_list(s):
    items = [x.strip() for x in s.split(",")]
    if len(items) > 1 and items[-1] == "":
        items.pop()  # trailing comma
    if items == [""]:
        return []
    ids = []
    for k, item in enumerate(items):
        try:
            ids.append(int(item))
        except ValueError:
            raise nd.DataError(f"--ids: '{item}' (item {k + 1}) is not an integer") from None
    return ids


def unescape(s):
    """Backslash escapes (\\n, \\t, ...) in an ASCII separator; other text is used as given."""
    return s.encode("ascii").decode("unicode_escape") if s.isascii() else s


def attr_str(v):
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


class HubDecoder:
    """A Hub tokenizer (tools/hub_tokenizer.py) with the byte tokenizers' decode: ids -> UTF-8 bytes."""

    def __init__(self, spec):
        import hub_tokenizer as ht
        self.tok = ht.load(spec)
        self.vocab_size = self.tok.vocab_size

    def decode(self, ids):
        return self.tok.decode([int(i) for i in ids]).encode("utf-8")


def load_decoder(kind, vocab_dir, files=""):
    """byte / gpt2 (nlptrain_data), else a Hub tokenizer: PATH, or for a file whose tokenizer attribute
    is hub / wordpiece the folder of its first tokenizer_files entry."""
    if kind in ("byte", "gpt2"):
        return nd.load_tokenizer(kind, vocab_dir, need_encoder=False)
    if kind in ("hub", "wordpiece"):
        first = files.splitlines()[0] if files else ""
        if not first or not os.path.exists(first):
            raise nd.DataError(f"the data's tokenizer ({kind}) is not here ('{first}'): pass --tokenizer PATH")
        kind = os.path.dirname(first)
    return HubDecoder(kind)


def decode_h5(a):
    import h5py
    import numpy as np

    path = a.h5
    if not os.path.exists(path):
        raise nd.DataError(f"input file '{path}' not found")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise nd.DataError(f"cannot open HDF5 file '{path}': {e}") from None
    with f:
        kind = a.tokenizer or (attr_str(f.attrs["tokenizer"]) if "tokenizer" in f.attrs else None)
        if kind is None:
            raise nd.DataError(f"'{path}' has no 'tokenizer' attribute: pass --tokenizer")
        vocab_dir = a.vocab_dir
        if kind == "gpt2" and not vocab_dir and "vocab_dir" in f.attrs:
            cand = attr_str(f.attrs["vocab_dir"])
            if os.path.isdir(cand):
                vocab_dir = cand
        files = attr_str(f.attrs["tokenizer_files"]) if "tokenizer_files" in f.attrs else ""
        tok = load_decoder(kind, vocab_dir, files)
        if "vocab_size" in f.attrs and int(f.attrs["vocab_size"]) != tok.vocab_size:
            raise nd.DataError(f"'{path}' has vocab_size {int(f.attrs['vocab_size'])} but the {kind} "
                               f"tokenizer has {tok.vocab_size}")
        name = a.dataset or ("tokens" if "tokens" in f else "input_ids" if "input_ids" in f else None)
        if name is None or name not in f or not isinstance(f[name], h5py.Dataset):
            have = []
            f.visititems(lambda n, o: have.append(n) if isinstance(o, h5py.Dataset) else None)
            raise nd.DataError(f"'{path}' has no dataset '{name or 'tokens/input_ids'}' (datasets: {', '.join(have) or 'none'})")
        ds = f[name]
        if ds.ndim not in (1, 2) or ds.dtype.kind not in "iu":
            raise nd.DataError(f"'{path}': dataset '{name}' is {ds.ndim}-D {ds.dtype}, expected 1-D or 2-D integers")
        n = ds.shape[0]
        if not 0 <= a.start <= n:
            raise nd.DataError(f"--start {a.start} is outside [0, {n}] for '{name}' in '{path}'")
        if a.count is not None and a.count < 0:
            raise nd.DataError(f"--count must be >= 0, got {a.count}")
        stop = n if a.count is None else min(n, a.start + a.count)
        if ds.ndim == 1:
            yield tok.decode(np.asarray(ds[a.start:stop]))
            return
        sep = unescape(a.row_sep).encode("utf-8")
        mask = f["attention_mask"] if ("attention_mask" in f and not a.keep_padding
                                       and f["attention_mask"].shape == ds.shape) else None
        step = 1024
        for r0 in range(a.start, stop, step):
            r1 = min(stop, r0 + step)
            rows = np.asarray(ds[r0:r1])
            m = np.asarray(mask[r0:r1]) if mask is not None else None
            for i in range(rows.shape[0]):
                ids = rows[i] if m is None else rows[i][m[i] != 0]
                try:
                    yield tok.decode(ids) + sep
                except nd.DataError as e:
                    raise nd.DataError(f"'{path}' {name} row {r0 + i}: {e}") from None


def main(argv=None):
    a = parse_args(argv)
    try:
        if (a.h5 is None) == (a.ids is None):
            raise nd.DataError("give either FILE.h5 or --ids LIST")
        if a.ids is not None:
            if not a.tokenizer:
                raise nd.DataError("--ids needs --tokenizer")
            tok = load_decoder(a.tokenizer, a.vocab_dir)
            pieces = [tok.decode(parse_id_list(a.ids))]
        else:
            pieces = decode_h5(a)
        if a.out:
            d = os.path.dirname(os.path.abspath(a.out))
            if not os.path.isdir(d):
                raise nd.DataError(f"output folder '{d}' does not exist")
            with open(a.out, "wb") as out:
                for p in pieces:
                    out.write(p)
        else:
            for p in pieces:
                sys.stdout.buffer.write(p)
            sys.stdout.buffer.flush()
        return 0
    except nd.DataError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except OSError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
