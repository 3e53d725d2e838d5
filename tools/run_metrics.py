"""Reading nlptrain's <run dir>/metrics.jsonl, shared by tools/tensorboard_export.py and
tools/plot_run.py.

metrics.jsonl holds one JSON object per line:
  train step:  {"step":N,"loss":..,"lr":..,"grad_norm":..,"tokens_per_s":..,"computed_tokens_per_s":..,
                "real_tokens_per_s":..,"step_time_s":..}   (tokens_per_s = computed_tokens_per_s: the
                positions run; real_tokens_per_s: attention mask 1)
  evaluation:  {"step":N,"split":"eval","loss":..,"perplexity":..,<task metrics>}
  eval mode:   {"split":"eval","loss":..,...,"tokens":..}   (no step: not a curve, skipped)

A resumed run (train.resume = true) appends the steps after its checkpoint again, so a step can
appear more than once: the last record of a (split, step) wins (a resumed run recomputes those
steps bitwise the same). A line that is still being written (no final newline yet) is held back
until it is complete, or at the end of a finished file used when it parses.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

METRICS_FILE = "metrics.jsonl"


class MetricsError(Exception):
    """Bad input: the message names the file (and line)."""


def split_of(rec: dict) -> str:
    s = rec.get("split")
    return "train" if s is None else str(s)


def scalars(rec: dict) -> dict[str, float]:
    """The numeric fields of a record except step (bools and strings are not scalars)."""
    out = {}
    for k, v in rec.items():
        if k in ("step", "split") or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        out[k] = float(v)
    return out


def parse_line(line: str, path: Path, lineno: int) -> dict | None:
    """One line -> record, or None for a blank line. Bad JSON is a MetricsError naming file:line."""
    if not line.strip():
        return None
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise MetricsError(f"{path}:{lineno}: not a JSON object ({e.msg} at column {e.colno})") from None
    if not isinstance(rec, dict):
        raise MetricsError(f"{path}:{lineno}: not a JSON object")
    step = rec.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise MetricsError(f"{path}:{lineno}: \"step\" is {step!r}, not an integer")
    return rec


class Tail:
    """Incremental reader of a growing metrics.jsonl: read() returns the records of the lines
    completed since the last call. Notices when the file was replaced or truncated (a fresh run in
    the same output.dir): then `restarted` is set and reading starts again from the top."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.offset = 0
        self.lineno = 0
        self.partial = b""
        self.ino = None
        self.restarted = False

    def read(self, final: bool = False) -> list[dict]:
        """final=True: the writer is done, so a last line without a newline is used if it parses
        (else dropped as cut off)."""
        self.restarted = False
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return []
        if self.ino is not None and (st.st_ino != self.ino or st.st_size < self.offset):
            self.offset, self.lineno, self.partial, self.restarted = 0, 0, b"", True
        self.ino = st.st_ino
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()  # b"" when data ended with a newline
        out = []
        for raw in lines:
            self.lineno += 1
            rec = parse_line(raw.decode("utf-8", errors="replace"), self.path, self.lineno)
            if rec is not None:
                out.append(rec)
        if final and self.partial.strip():
            try:
                rec = parse_line(self.partial.decode("utf-8", errors="replace"), self.path,
                                 self.lineno + 1)
            except MetricsError:
                rec = None  # cut off mid-line (the job was killed while writing it)
            if rec is not None:
                out.append(rec)
            self.partial = b""
        return out


def metrics_path(run_dir) -> Path:
    run_dir = Path(run_dir)
    if run_dir.is_file() and run_dir.name.endswith(".jsonl"):
        return run_dir
    if not run_dir.exists():
        raise MetricsError(f"run directory '{run_dir}' not found")
    p = run_dir / METRICS_FILE
    if not p.is_file():
        raise MetricsError(f"'{p}' not found (nlptrain writes {METRICS_FILE} in output.dir during training)")
    return p


def load(run_dir) -> dict[str, dict[int, dict[str, float]]]:
    """{split: {step: {name: value}}} of a run, steps in increasing order, the last record of each
    (split, step) kept. MetricsError when the file is missing or holds no stepped records."""
    path = metrics_path(run_dir)
    recs = Tail(path).read(final=True)
    out = dedupe(recs)
    if not out:
        raise MetricsError(f"'{path}' holds no training or evaluation records with a step")
    return out


def dedupe(recs) -> dict[str, dict[int, dict[str, float]]]:
    out: dict[str, dict[int, dict[str, float]]] = {}
    for r in recs:
        if r.get("step") is None:
            continue
        out.setdefault(split_of(r), {})[r["step"]] = scalars(r)
    return {s: dict(sorted(d.items())) for s, d in out.items()}


def finite(v: float) -> bool:
    return math.isfinite(v)
