"""Reading datasets in the forms the Hugging Face Hub ships them: the text column of parquet, JSON Lines
and CSV files, and a downloaded dataset folder (`hf download --repo-type dataset NAME --local-dir DIR`)
with its configurations and train/validation/test split files.

Files (the format follows the extension; anything else is a plain text file, read by the caller)
  .parquet         one example per row (pyarrow, read in record batches: memory does not grow with the file)
  .jsonl, .json    JSON Lines, one object per line (as the `datasets` json loader reads them); a .json
                   file that is one JSON array of objects is read too
  .csv             comma-separated with a header line (Python's csv module, RFC 4180 quoting)
The text of a row is the value of its text column (run_clm's --text_column_name; default `text`). A
missing column, a null or a non-string value is an error naming the file, the row and the column.

Folders
  A dataset folder holds data files, possibly under one folder per configuration
  (Salesforce/wikitext: wikitext-2-raw-v1/train-00000-of-00001.parquet, validation-..., test-...).
  `config` picks the configuration's folder (needed when there are several); a split's files are
  those whose path below it names the split as the `datasets` library recognises it: the split word
  (train; validation, valid, val, dev; test, eval) as a whole word of the path, between separators
  (- . _ space digits /), e.g. train-00000-of-00002.parquet, data/train.jsonl, wiki.valid.csv,
  train/0000.parquet. Shards are read in name order. Hidden folders (.cache/ of `hf download`) are skipped.
"""
from __future__ import annotations

import csv
import json
import os
import re
from typing import Iterator, List, Optional

from nlptrain_data import DataError

TABLE_EXT = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}
DATA_EXT = tuple(TABLE_EXT) + (".txt",)
SPLITS = {"train": ("train", "training"),
          "validation": ("validation", "valid", "val", "dev"),
          "test": ("test", "testing", "eval", "evaluation")}
_SEP = r"[-._ 0-9/]"


def table_format(path: str) -> Optional[str]:
    """parquet, json or csv for a table file, None for a plain text file."""
    return TABLE_EXT.get(os.path.splitext(path)[1].lower())


def _text(value, path: str, row: int, column: str) -> str:
    if isinstance(value, str):
        return value
    what = "null" if value is None else f"a {type(value).__name__} ({str(value)[:40]!r})"
    raise DataError(f"'{path}' row {row}: column '{column}' is {what}, not text")


def _no_column(path: str, column: str, columns, option: str = "--text-column") -> DataError:
    return DataError(f"'{path}' has no column '{column}' (its columns: {', '.join(map(str, columns)) or 'none'}); "
                     f"name the column with {option}")


def iter_texts(path: str, column: str, batch_rows: int = 4096) -> Iterator[str]:
    """The text column of a parquet, JSON Lines or CSV file, row by row (rows numbered from 0)."""
    try:
        yield from _iter_texts(path, column, batch_rows)
    except UnicodeDecodeError as e:
        raise DataError(f"'{path}' is not valid UTF-8 (byte offset {e.start})") from None


def _iter_texts(path: str, column: str, batch_rows: int) -> Iterator[str]:
    fmt = table_format(path)
    if fmt == "parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DataError(f"reading '{path}' needs the Python package pyarrow (pip install pyarrow)") from None
        try:
            pf = pq.ParquetFile(path)
        except Exception as e:  # pyarrow raises ArrowInvalid and others for a file that is not parquet
            raise DataError(f"cannot read '{path}' as parquet: {e}") from None
        names = pf.schema_arrow.names
        if column not in names:
            raise _no_column(path, column, names)
        row = 0
        for batch in pf.iter_batches(batch_size=batch_rows, columns=[column]):
            for v in batch.column(0).to_pylist():
                yield _text(v, path, row, column)
                row += 1
    elif fmt == "json":
        yield from _iter_json(path, column)
    elif fmt == "csv":
        with open(path, "r", encoding="utf-8", newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise DataError(f"'{path}' is empty (expected a header line naming the columns)")
            if header and header[0].startswith("\ufeff"):
                header[0] = header[0][1:]
            if column not in header:
                raise _no_column(path, column, header)
            k = header.index(column)
            for row, fields in enumerate(reader):
                if len(fields) != len(header):
                    raise DataError(f"'{path}' row {row} (line {reader.line_num}): {len(fields)} fields, "
                                    f"the header has {len(header)}")
                yield fields[k]
    else:
        raise DataError(f"'{path}' is not a parquet, JSON Lines or CSV file")


def _iter_json(path: str, column: str) -> Iterator[str]:
    with open(path, "r", encoding="utf-8") as f:
        head = f.read(4096).lstrip("\ufeff \t\r\n")
        f.seek(0)
        if head.startswith("["):  # one JSON array of objects
            try:
                rows = json.load(f)
            except ValueError as e:
                raise DataError(f"'{path}' is not valid JSON: {e}") from None
            lines = ((i, r) for i, r in enumerate(rows))
        else:
            def parsed():
                for n, line in enumerate(f, start=1):
                    if line.strip():
                        try:
                            yield n, json.loads(line)
                        except ValueError as e:
                            raise DataError(f"'{path}' line {n}: not a JSON object ({e})") from None
            lines = parsed()
        row = 0
        for _, obj in lines:
            if not isinstance(obj, dict):
                raise DataError(f"'{path}' row {row}: a {type(obj).__name__}, not a JSON object with a '{column}' field")
            if column not in obj:
                if row == 0:
                    raise _no_column(path, column, obj.keys())
                raise DataError(f"'{path}' row {row}: no '{column}' field")
            yield _text(obj[column], path, row, column)
            row += 1


# ---- dataset folders ------------------------------------------------------------------------------

def _data_files(root: str) -> List[str]:
    """Data files below root (relative paths, '/'-separated), hidden folders and files skipped."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith("."))
        for name in files:
            if not name.startswith(".") and name.lower().endswith(DATA_EXT):
                out.append(os.path.relpath(os.path.join(d, name), root).replace(os.sep, "/"))
    return sorted(out)


def split_of(rel: str) -> Optional[str]:
    """The split a data file's relative path names, or None."""
    stem = rel.lower()
    for split, words in SPLITS.items():
        for w in words:
            if re.search(rf"(?:^|{_SEP}){w}(?:{_SEP}|\.[a-z]+$|$)", stem):
                return split
    return None


def configs(folder: str) -> List[str]:
    """The folder's configurations: its sub-folders that hold data files of some split."""
    return sorted({f.split("/")[0] for f in _data_files(folder) if "/" in f and split_of(f.split("/", 1)[1])})


def split_files(folder: str, split: str, config: Optional[str] = None) -> List[str]:
    """The data files of `split` in a downloaded dataset folder (a configuration's, with `config`)."""
    name = {w: s for s, ws in SPLITS.items() for w in ws}.get(split.lower())
    if name is None:
        raise DataError(f"--split {split}: give train, validation or test")
    root = folder
    if config:
        root = os.path.join(folder, config)
        if not os.path.isdir(root):
            have = configs(folder)
            raise DataError(f"dataset folder '{folder}' has no configuration '{config}'"
                            + (f" (it has: {', '.join(have)})" if have else " (it has no configuration folders)"))
    files = _data_files(root)
    if not files:
        raise DataError(f"dataset folder '{root}' holds no data files ({', '.join(DATA_EXT)})")
    mine = [f for f in files if split_of(f) == name]
    if not config:
        tops = sorted({f.split("/")[0] for f in mine if "/" in f})
        if len(tops) > 1 and all("/" in f for f in mine):
            raise DataError(f"dataset folder '{folder}' has several configurations: {', '.join(tops)}; "
                            f"choose one with --config NAME")
    if not mine:
        found = sorted({s for s in map(split_of, files) if s})
        raise DataError(f"dataset folder '{root}' has no {name} split"
                        + (f" (splits found: {', '.join(found)})" if found else
                           f" (no file names a split: {', '.join(files[:5])})"))
    kinds = sorted({os.path.splitext(f)[1].lower() for f in mine})
    if len(kinds) > 1:
        raise DataError(f"dataset folder '{root}': the {name} split has files of several formats "
                        f"({', '.join(kinds)}); give the files themselves")
    return [os.path.join(root, f) for f in mine]


COLUMN_OPTIONS = "the --*-column options"


def read_columns(path: str, columns, optional=()) -> list:
    """[(row, [values of `columns`, then of `optional` (None where the file lacks the column)])] of a
    parquet, JSON Lines or CSV file, for the task tools: a missing required column is an error naming
    the file and the columns it has. Values are as stored (int labels stay int; CSV gives strings)."""
    fmt = table_format(path)
    want = list(columns) + list(optional)
    if fmt == "parquet":
        try:
            import pyarrow.parquet as pq
            pf = pq.ParquetFile(path)
        except ImportError:
            raise DataError(f"reading '{path}' needs the Python package pyarrow (pip install pyarrow)") from None
        except Exception as e:
            raise DataError(f"cannot read '{path}' as parquet: {e}") from None
        names = pf.schema_arrow.names
        for c in columns:
            if c not in names:
                raise _no_column(path, c, names, COLUMN_OPTIONS)
        have = [c for c in want if c in names]
        cols = {c: [] for c in have}
        for batch in pf.iter_batches(batch_size=4096, columns=have):
            for c, arr in zip(have, batch.columns):
                cols[c].extend(arr.to_pylist())
        n = len(cols[have[0]]) if have else 0
        return [(r, [cols[c][r] if c in cols else None for c in want]) for r in range(n)]
    if fmt == "csv":
        with open(path, "r", encoding="utf-8", newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None) or []
            if header and header[0].startswith("\ufeff"):
                header[0] = header[0][1:]
            for c in columns:
                if c not in header:
                    raise _no_column(path, c, header, COLUMN_OPTIONS)
            idx = [header.index(c) if c in header else None for c in want]
            out = []
            for r, fields in enumerate(reader):
                if len(fields) != len(header):
                    raise DataError(f"'{path}' row {r} (line {reader.line_num}): {len(fields)} fields, "
                                    f"the header has {len(header)}")
                out.append((r, [fields[i] if i is not None else None for i in idx]))
            return out
    if fmt == "json":
        out = []
        with open(path, "r", encoding="utf-8") as f:
            head = f.read(4096).lstrip("\ufeff \t\r\n")
            f.seek(0)
            try:
                objs = json.load(f) if head.startswith("[") else [json.loads(l) for l in f if l.strip()]
            except ValueError as e:
                raise DataError(f"'{path}' is not JSON Lines (one object per line): {e}") from None
        for r, obj in enumerate(objs):
            if not isinstance(obj, dict):
                raise DataError(f"'{path}' row {r}: a {type(obj).__name__}, not a JSON object")
            for c in columns:
                if c not in obj:
                    raise (_no_column(path, c, obj.keys(), COLUMN_OPTIONS) if r == 0 else
                           DataError(f"'{path}' row {r}: no '{c}' field"))
            out.append((r, [obj.get(c) for c in want]))
        return out
    raise DataError(f"'{path}' is not a parquet, JSON Lines or CSV file")
