#!/usr/bin/env python3
"""The raw records of a bench/results/ folder in one archive, FOLDER/raw.tar.xz, and reading them back.

A results folder keeps plain what a reader opens first: every Markdown file (README.md, results.md,
write-ups) and every results.json and summary.txt at any depth, the folder's command.txt,
environment.txt and machine.txt, and images. Everything else (metrics.jsonl, logs, .time files,
INIs, tarballs, per-run JSON, profiles) is a raw record and lives in raw.tar.xz, under its path
relative to the folder, byte for byte.

  python3 bench/results_archive.py pack FOLDER...          move the raw records into FOLDER/raw.tar.xz
  python3 bench/results_archive.py list FOLDER             the archive's members and their sizes
  python3 bench/results_archive.py extract FOLDER [MEMBER...] [--to DIR]
                                                           unpack (all, or the members named) into DIR
                                                           (default FOLDER itself)
  python3 bench/results_archive.py cat FOLDER/MEMBER       one member to standard output
  python3 bench/results_archive.py relink DOC.md...        rewrite each Markdown link to a packed file
                                                           as a link to its archive, followed by
                                                           "(in raw.tar.xz: MEMBER)"

pack adds to an archive that exists (a member already there with other bytes is an error), writes the
new archive beside the old one and renames it into place, reads it back and compares every member with
its file before deleting any file: an interrupted pack leaves the folder as it was. The archive is
reproducible (members sorted, mtime 0, owner root, mode 0644; xz preset 9e).

The readers of raw records (bench/*_report.py, bench/precision_compare.py, ...) use the functions
below, which see a folder's plain files and its archive's members as one tree: open_text(path),
read_text(path), is_file(path), is_dir(path), iterdir(path), glob(pattern). A path that exists on
disk is read from disk (a folder being written by a benchmark has no archive yet).
"""
from __future__ import annotations

import argparse
import fnmatch
import io
import lzma
import os
import re
import sys
import tarfile
from pathlib import Path, PurePosixPath

ARCHIVE = "raw.tar.xz"
PLAIN_ANYWHERE = {"results.json", "summary.txt"}
PLAIN_TOP = {"command.txt", "environment.txt", "machine.txt"}
PLAIN_SUFFIXES = {".md", ".png", ".svg", ".jpg"}
XZ_PRESET = 9 | lzma.PRESET_EXTREME


def is_plain(rel: str) -> bool:
    """Whether the file at `rel` (relative to its results folder) stays plain."""
    p = PurePosixPath(rel)
    if p.name == ARCHIVE or p.suffix in PLAIN_SUFFIXES or p.name in PLAIN_ANYWHERE:
        return True
    return len(p.parts) == 1 and p.name in PLAIN_TOP


# ---- reading an archive ----------------------------------------------------------------------------
_cache: dict[str, tuple[float, dict[str, bytes]]] = {}


def members(archive: str | os.PathLike) -> dict[str, bytes]:
    """{relative path: bytes} of every regular file in `archive` (cached while the file is unchanged)."""
    a = os.path.abspath(archive)
    mtime = os.stat(a).st_mtime
    hit = _cache.get(a)
    if hit and hit[0] == mtime:
        return hit[1]
    out = {}
    with tarfile.open(a, "r:xz") as tf:
        for m in tf:
            if m.isfile():
                out[m.name] = tf.extractfile(m).read()
    _cache[a] = (mtime, out)
    return out


def _locate(path: str | os.PathLike):
    """(archive path, member name) for a path inside some ancestor's raw.tar.xz, else None."""
    p = Path(os.path.abspath(path))
    for anc in p.parents:
        arc = anc / ARCHIVE
        if arc.is_file():
            return arc, p.relative_to(anc).as_posix()
    return None


def read_bytes(path) -> bytes:
    if os.path.isfile(path):
        return Path(path).read_bytes()
    loc = _locate(path)
    if loc:
        data = members(loc[0]).get(loc[1])
        if data is not None:
            return data
    raise FileNotFoundError(f"{path}: no such file (nor in a {ARCHIVE} of a folder above it)")


def read_text(path, encoding="utf-8") -> str:
    return read_bytes(path).decode(encoding)


def open_text(path, encoding="utf-8"):
    """A text stream over the file or archive member (iterate it line by line, like open())."""
    if os.path.isfile(path):
        return open(path, encoding=encoding)
    return io.StringIO(read_text(path, encoding))


def is_file(path) -> bool:
    if os.path.isfile(path):
        return True
    loc = _locate(path)
    return bool(loc) and loc[1] in members(loc[0])


def is_dir(path) -> bool:
    if os.path.isdir(path):
        return True
    loc = _locate(path)
    return bool(loc) and any(m.startswith(loc[1] + "/") for m in members(loc[0]))


def iterdir(path) -> list[Path]:
    """The names directly inside `path`, on disk and in the archive, as sorted paths under `path`."""
    names = set(os.listdir(path)) if os.path.isdir(path) else set()
    names.discard(ARCHIVE)  # the archive is seen through, not listed
    arc = Path(path) / ARCHIVE
    if arc.is_file():
        names |= {m.split("/", 1)[0] for m in members(arc)}
    else:
        loc = _locate(path)
        if loc:
            pre = loc[1] + "/"
            names |= {m[len(pre):].split("/", 1)[0] for m in members(loc[0]) if m.startswith(pre)}
    if not names and not is_dir(path):
        raise FileNotFoundError(f"{path}: no such folder (nor in a {ARCHIVE} of a folder above it)")
    return [Path(path) / n for n in sorted(names)]


def glob(pattern: str) -> list[str]:
    """Paths matching `pattern` (wildcards in the file name and folders below the archive's folder),
    on disk and in the archive of the nearest folder above the pattern's first wildcard."""
    import glob as _glob
    found = set(_glob.glob(pattern))
    parts = Path(pattern).parts
    fixed = [i for i, s in enumerate(parts) if any(c in s for c in "*?[")]
    base = Path(*parts[:fixed[0]]) if fixed else Path(pattern).parent
    for anc in [base, *base.parents]:
        arc = anc / ARCHIVE
        if arc.is_file():
            rel_pat = Path(os.path.abspath(pattern)).relative_to(os.path.abspath(anc)).as_posix()
            for m in members(arc):
                if fnmatch.fnmatchcase(m, rel_pat) and m.count("/") == rel_pat.count("/"):
                    found.add(os.path.join(str(anc), m))
            break
    return sorted(found)


# ---- packing --------------------------------------------------------------------------------------
def raw_files(folder: Path) -> list[str]:
    out = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for f in files:
            rel = (Path(root) / f).relative_to(folder).as_posix()
            if not is_plain(rel):
                out.append(rel)
    return sorted(out)


def _write_archive(dest: Path, content: dict[str, bytes]):
    with tarfile.open(dest, "w:xz", preset=XZ_PRESET, format=tarfile.PAX_FORMAT) as tf:
        for name in sorted(content):
            ti = tarfile.TarInfo(name)
            ti.size, ti.mtime, ti.mode, ti.uid, ti.gid, ti.uname, ti.gname = \
                len(content[name]), 0, 0o644, 0, 0, "root", "root"
            tf.addfile(ti, io.BytesIO(content[name]))


def pack(folder: Path) -> tuple[int, int, int]:
    """Move `folder`'s raw records into folder/raw.tar.xz: (files packed, bytes packed, archive bytes)."""
    if not folder.is_dir():
        raise SystemExit(f"results_archive: {folder}: not a folder")
    arc = folder / ARCHIVE
    rels = raw_files(folder)
    for rel in rels:
        if (folder / rel).is_symlink() or not (folder / rel).is_file():
            raise SystemExit(f"results_archive: {folder / rel}: not a regular file; refusing to pack it")
    content = dict(members(arc)) if arc.is_file() else {}
    for rel in rels:
        data = (folder / rel).read_bytes()
        if rel in content and content[rel] != data:
            raise SystemExit(f"results_archive: {folder / rel} differs from the member of that name in {arc}; "
                             "nothing changed")
        content[rel] = data
    if not rels:
        return 0, 0, arc.stat().st_size if arc.is_file() else 0
    tmp = folder / f".{ARCHIVE}.tmp"
    try:
        _write_archive(tmp, content)
        _cache.pop(os.path.abspath(tmp), None)
        if members(tmp) != content:
            raise SystemExit(f"results_archive: {tmp}: reads back different bytes; nothing changed")
        os.replace(tmp, arc)
    finally:
        _cache.pop(os.path.abspath(tmp), None)
        if tmp.exists():
            tmp.unlink()
    for rel in rels:
        (folder / rel).unlink()
    # folders left empty by the move go too
    for root, dirs, files in os.walk(folder, topdown=False):
        if Path(root) != folder and not os.listdir(root):
            os.rmdir(root)
    return len(rels), sum(len(content[r]) for r in rels), arc.stat().st_size


def extract(folder: Path, names: list[str], to: Path):
    arc = folder / ARCHIVE
    if not arc.is_file():
        raise SystemExit(f"results_archive: {arc}: no such archive")
    content = members(arc)
    missing = [n for n in names if n not in content]
    if missing:
        raise SystemExit(f"results_archive: not in {arc}: {', '.join(missing)}")
    for name in names or sorted(content):
        if PurePosixPath(name).is_absolute() or ".." in PurePosixPath(name).parts:
            raise SystemExit(f"results_archive: {arc}: member {name!r} leaves the folder; refusing")
        dest = to / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(content[name])
        print(dest)


LINK = re.compile(r"(!?\[[^\]]*\])\(([^)\s#]+)(#[^)\s]*)?\)")


def relink_text(doc: Path, text: str) -> tuple[str, int]:
    """`text` (the Markdown file `doc`) with links to archived members pointing at their archive."""
    n = 0

    def sub(m):
        nonlocal n
        target = m.group(2)
        if re.match(r"^[a-z]+:", target):
            return m.group(0)
        dest = doc.parent / target
        if dest.exists():
            return m.group(0)
        loc = _locate(dest)
        if not loc or loc[1] not in members(loc[0]):
            return m.group(0)
        n += 1
        arc = os.path.relpath(loc[0], doc.parent)
        return f"{m.group(1)}({arc}) (in {ARCHIVE}: {loc[1]})"

    return LINK.sub(sub, text), n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("folders", nargs="+", type=Path)
    p = sub.add_parser("list")
    p.add_argument("folder", type=Path)
    p = sub.add_parser("extract")
    p.add_argument("folder", type=Path)
    p.add_argument("members", nargs="*")
    p.add_argument("--to", type=Path)
    p = sub.add_parser("cat")
    p.add_argument("path")
    p = sub.add_parser("relink")
    p.add_argument("docs", nargs="+", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "pack":
        for f in a.folders:
            n, raw, size = pack(f)
            print(f"{f}: {n} files ({raw} bytes) packed; {ARCHIVE} {size} bytes")
    elif a.cmd == "list":
        arc = a.folder / ARCHIVE
        if not arc.is_file():
            raise SystemExit(f"results_archive: {arc}: no such archive")
        for name, data in sorted(members(arc).items()):
            print(f"{len(data):>10}  {name}")
    elif a.cmd == "extract":
        extract(a.folder, a.members, a.to or a.folder)
    elif a.cmd == "relink":
        for doc in a.docs:
            text, n = relink_text(doc, doc.read_text(encoding="utf-8"))
            if n:
                doc.write_text(text, encoding="utf-8")
                print(f"{doc}: {n} links now point at their {ARCHIVE}")
    else:
        try:
            sys.stdout.buffer.write(read_bytes(a.path))
        except FileNotFoundError as e:
            raise SystemExit(f"results_archive: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
