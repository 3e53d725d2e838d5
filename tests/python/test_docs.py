"""The documentation against the tree and the binary: every relative link (and its #anchor) and every
file path named in README.md and docs/*.md exists; every INI in inputs/ passes the binary's own
configuration check (`nlptrain INI --check`: parse and validate, no training); docs/configuration.md
is what tools/config_reference.py generates from the binary now. The binary's checks skip, saying so,
when there is no binary."""
import glob
import re
import subprocess
import sys
from pathlib import Path

import pytest

import nlp_run as nr

sys.path.insert(0, str(nr.SOURCE_DIR / "tools"))
import config_reference  # noqa: E402

SRC = nr.SOURCE_DIR
DOCS = [SRC / "README.md"] + sorted((SRC / "docs").glob("*.md"))
# Other documents whose links are checked too (the paths they name are relative to their folder).
LINKED = [SRC / "src/backend/cuda/README.md", SRC / "tests/fuzz/README.md", SRC / "jobscripts/README.md",
          SRC / "bench/README.md", SRC / "bench/results/README.md"]
# A path named in a document is checked when it starts with one of these (the tree's own folders);
# paths under runs/, build/, models/, data/ are what a user makes and are not checked.
TREE = ("src/", "tools/", "tests/", "bench/", "inputs/", "jobscripts/", "kernels/", "docs/", ".ci/")
# Made by a script, git-ignored: named in the documents, absent from a checkout.
GENERATED = ("bench/gpu/stage", "bench/gpu/out-gpu")
# A placeholder in a path (bench/results/gpu-DATE-GPU-COMMIT/, step_XXXXXXXX.h5, <name>): not a file.
PLACEHOLDER = re.compile(r"<|>|\.\.\.|\b(?!README\b|NOTES\b|RENAMES\b)[A-Z]{3,}\b")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`]+)`")  # may wrap onto the next line


def binary_or_skip():
    try:
        b = nr.binary()
    except FileNotFoundError as e:
        pytest.skip(f"no nlptrain binary ({e}): the binary's checks are skipped")
    if not Path(b).exists():
        pytest.skip(f"no nlptrain binary at {b}: the binary's checks are skipped")
    return b


def prose(text):
    """The text outside fenced code blocks, and the code blocks' text, as two strings."""
    out, code, fenced = [], [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        (code if fenced else out).append(line)
    return "\n".join(out), "\n".join(code)


def slug(heading):
    """GitHub's anchor of a Markdown heading."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def anchors(md_text):
    seen, out = {}, set()
    for line in prose(md_text)[0].splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def rel(p: Path):
    return str(p.relative_to(SRC)) if p.is_relative_to(SRC) else str(p)


def broken_links(doc: Path, text: str):
    """Relative links of `text` (the file `doc`) whose file or #anchor does not exist."""
    bad = []
    for target in LINK.findall(prose(text)[0]):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            bad.append(f"{target}: no such file")
            continue
        if anchor and dest.suffix == ".md":
            if anchor not in anchors(dest.read_text(encoding="utf-8")):
                bad.append(f"{target}: no heading with anchor #{anchor} in {rel(dest)}")
    return bad


def named_paths(text: str):
    """Paths in the tree that `text` names: in `code spans`, and words of code blocks."""
    outside, code = prose(text)
    words = CODE_SPAN.findall(outside) + code.split()
    out = set()
    for w in words:
        for token in w.split():
            token = token.strip("\"'`,;:()[]").split("::")[0]
            if token.startswith("../") or not token.startswith(TREE):
                continue
            if PLACEHOLDER.search(token) or token.startswith(GENERATED):
                continue
            out.add(token)
    return out


def expand(token):
    """build/{a,b} -> build/a, build/b (one level of braces)."""
    m = re.match(r"^(.*?)\{([^{}]*)\}(.*)$", token)
    if not m:
        return [token]
    return [m.group(1) + part + m.group(3) for part in m.group(2).split(",")]


def missing_paths(text: str):
    bad = []
    for token in sorted(named_paths(text)):
        for p in expand(token):
            if any(c in p for c in "*?"):
                if not glob.glob(str(SRC / p)):
                    bad.append(f"{p}: no file matches")
            elif not (SRC / p).exists():
                bad.append(f"{p}: no such file or folder")
    return bad


def test_the_checkers_find_what_is_broken(tmp_path):
    """The checks below would fail on a broken document (so that their passing means something)."""
    doc = tmp_path / "x.md"
    text = ("# Top\n\n## A section\n\n[ok](#a-section) [bad anchor](#nowhere) [gone](nothing.md)\n"
            "`tools/no_such_tool.py` and `tools/config_reference.py`\n\n```sh\nbash tools/absent.sh\n```\n")
    doc.write_text(text, encoding="utf-8")
    assert broken_links(doc, text) == [f"#nowhere: no heading with anchor #nowhere in {rel(doc)}",
                                       "nothing.md: no such file"]
    assert missing_paths(text) == ["tools/absent.sh: no such file or folder",
                                   "tools/no_such_tool.py: no such file or folder"]
    assert anchors("# A b\n## A b\n```\n# not a heading\n```\n## `code` (x)\n") == {"a-b", "a-b-1", "code-x"}


@pytest.mark.parametrize("doc", DOCS + [p for p in LINKED if p.exists()], ids=lambda p: str(p.relative_to(SRC)))
def test_relative_links_resolve(doc):
    bad = broken_links(doc, doc.read_text(encoding="utf-8"))
    assert not bad, f"{doc.relative_to(SRC)}: broken links:\n  " + "\n  ".join(bad)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(SRC)))
def test_named_files_exist(doc):
    bad = missing_paths(doc.read_text(encoding="utf-8"))
    assert not bad, f"{doc.relative_to(SRC)}: names files that do not exist:\n  " + "\n  ".join(bad)


def test_readme_links_every_document():
    readme = (SRC / "README.md").read_text(encoding="utf-8")
    for doc in DOCS[1:]:
        assert f"docs/{doc.name}" in readme, f"README.md does not link docs/{doc.name}"


@pytest.mark.parametrize("ini", sorted((SRC / "inputs").glob("*.ini")), ids=lambda p: p.name)
def test_input_passes_the_binary_check(ini):
    b = binary_or_skip()
    p = subprocess.run([b, str(ini), "--check"], capture_output=True, text=True, timeout=60,
                       env=nr.mpi_env())
    # --check opens the INI's input files: without them (data not prepared, no model downloaded here)
    # it fails with 1, naming the missing file; a configuration error would be 2
    if p.returncode == 1 and ("file not found" in p.stderr or "cannot open HDF5 file" in p.stderr):
        assert p.stdout == "", p.stdout[:500]
        return
    assert p.returncode == 0, f"{ini.name} fails nlptrain --check ({p.returncode}):\n{p.stderr}"
    assert f"read from {ini}" in p.stdout and "[run]" in p.stdout, p.stdout[:500]


def test_check_refuses_a_bad_value(tmp_path):
    """--check is the run's own validation: a bad key fails it, naming the file, line and key."""
    b = binary_or_skip()
    ini = tmp_path / "bad.ini"
    ini.write_text("[train]\nsteps = many\n", encoding="utf-8")
    p = subprocess.run([b, str(ini), "--check"], capture_output=True, text=True, timeout=60, env=nr.mpi_env())
    assert p.returncode == 2 and "line 2" in p.stderr and "train.steps" in p.stderr, p.stderr
    assert p.stdout == ""


def test_configuration_reference_is_current():
    b = binary_or_skip()
    current = config_reference.generate(b)
    committed = (SRC / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == current, ("docs/configuration.md is stale: run "
                                  "python3 tools/config_reference.py --out docs/configuration.md")
