#!/usr/bin/env python3
"""What one GPU call carries: the tree (tracked files, and untracked ones git does not ignore) plus the
stage (bench/gpu/stage/, git-ignored, sent beside it), against the budget of docs/gpu.md:

  LIMIT   64 MiB   the most one call to the GPU node carries (tree and carried paths together)
  TARGET  50 MiB   what prepare.sh aims at, leaving room for what a run adds
  TREE    12 MiB   the tree's share (tests/python/test_travel_size.py checks the tracked tree in CI)
  STAGE   38 MiB   the stage's share: nlptrain, test_ops_cuda, test_cuda_bf16, device-libs.tar.xz, data

  python3 bench/gpu/travel_size.py [--stage DIR] [--tracked-only]

prints each part (the tree, then every binary and archive of stage/bin/, the data, the rest of the
stage) in MiB, the total against TARGET and LIMIT, and exits 1 when the total is over LIMIT (or, without
a stage, the tree alone over its share), 0 otherwise; over TARGET or a share it says so on stderr.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

MIB = 1 << 20
LIMIT = 64 * MIB
TARGET = 50 * MIB
TREE_SHARE = 12 * MIB
STAGE_SHARE = TARGET - TREE_SHARE
ROOT = Path(__file__).resolve().parents[2]


def tree_files(root: Path = ROOT, tracked_only: bool = False) -> list[str]:
    """The tree's files as a GPU call sees them: tracked, plus (unless tracked_only) untracked files
    that git does not ignore. Raises RuntimeError outside a git checkout."""
    args = ["git", "-C", str(root), "ls-files", "-z", "--cached"]
    if not tracked_only:
        args += ["--others", "--exclude-standard"]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"git ls-files in {root}: {p.stderr.strip()}")
    return sorted(set(f for f in p.stdout.split("\0") if f))


def tree_bytes(root: Path = ROOT, tracked_only: bool = False) -> int:
    """Bytes of the tree's files on disk (a symlink counts as itself; a deleted tracked file as 0)."""
    total = 0
    for f in tree_files(root, tracked_only):
        try:
            total += os.lstat(root / f).st_size
        except FileNotFoundError:
            pass
    return total


def dir_bytes(d: Path) -> int:
    return sum(p.lstat().st_size for p in d.rglob("*") if p.is_file() or p.is_symlink())


def stage_parts(stage: Path) -> list[tuple[str, int]]:
    """(label, bytes) for each file of stage/bin, the data folder and the rest of the stage."""
    parts, seen = [], 0
    b = stage / "bin"
    if b.is_dir():
        for p in sorted(b.iterdir()):
            n = dir_bytes(p) if p.is_dir() else p.lstat().st_size
            parts.append((f"stage/bin/{p.name}", n))
            seen += n
    d = stage / "data"
    if d.is_dir():
        n = dir_bytes(d)
        parts.append(("stage/data/", n))
        seen += n
    rest = dir_bytes(stage) - seen
    if rest:
        parts.append(("stage (other files)", rest))
    return parts


def mib(n: int) -> str:
    return f"{n / MIB:7.2f} MiB"


def report(tree: int, parts: list[tuple[str, int]], out=None) -> int:
    """Print the table; the exit status: 1 over LIMIT (or, without a stage, the tree over its share)."""
    out = out or sys.stdout
    stage = sum(n for _, n in parts)
    total = tree + stage
    print(f"travel: {'tree (git ls-files, untracked not ignored)':<46} {mib(tree)}   share {mib(TREE_SHARE)}",
          file=out)
    for label, n in parts:
        print(f"travel:   {label:<44} {mib(n)}", file=out)
    if parts:
        print(f"travel: {'stage':<46} {mib(stage)}   share {mib(STAGE_SHARE)}", file=out)
    print(f"travel: {'total':<46} {mib(total)}   target {mib(TARGET)}, limit {mib(LIMIT)}", file=out)
    status = 0
    if tree > TREE_SHARE:
        print(f"travel: the tree is over its share by {(tree - TREE_SHARE) / MIB:.2f} MiB (bench/results: pack new "
              "folders, python3 bench/results_archive.py pack FOLDER)", file=sys.stderr)
        status = 0 if parts else 1
    if parts and stage > STAGE_SHARE:
        print(f"travel: the stage is over its share by {(stage - STAGE_SHARE) / MIB:.2f} MiB", file=sys.stderr)
    if total > LIMIT:
        print(f"travel: {total / MIB:.2f} MiB is over the {LIMIT // MIB} MiB a GPU call carries: it cannot be sent",
              file=sys.stderr)
        status = 1
    elif total > TARGET:
        print(f"travel: {total / MIB:.2f} MiB fits the limit but is over the {TARGET // MIB} MiB target",
              file=sys.stderr)
    return status


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage", type=Path, help="the stage folder (default bench/gpu/stage when it exists)")
    ap.add_argument("--tracked-only", action="store_true", help="count tracked files only")
    a = ap.parse_args(argv)
    stage = a.stage or (ROOT / "bench/gpu/stage")
    if a.stage and not a.stage.is_dir():
        print(f"travel_size: {a.stage}: no such folder", file=sys.stderr)
        return 2
    try:
        tree = tree_bytes(ROOT, a.tracked_only)
    except RuntimeError as e:
        print(f"travel_size: {e}", file=sys.stderr)
        return 2
    return report(tree, stage_parts(stage) if stage.is_dir() else [])


if __name__ == "__main__":
    sys.exit(main())
