"""bench/results_archive.py: each bench/results/ folder's raw records in its raw.tar.xz, and the readers
that see a packed folder as a fresh one.

- pack moves exactly the raw files (not README.md, results.md, results.json, summary.txt, command.txt,
  environment.txt, machine.txt, images) into the archive, byte for byte; extract and cat give them
  back; a conflicting member changes nothing; two packs of the same files are the same bytes;
- the committed tree: no raw file left plain in any results folder, every archive readable, every
  "(in raw.tar.xz: PATH)" of a Markdown file names a member of the archive its link points at;
- the report scripts give the same tables from a packed folder as from its unpacked copy.
"""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import nlp_run as nr

SRC = nr.SOURCE_DIR
sys.path.insert(0, str(SRC / "bench"))
import results_archive as ra  # noqa: E402

TOOL = [sys.executable, str(SRC / "bench" / "results_archive.py")]
RESULTS = SRC / "bench" / "results"


def run(*args, cwd=None):
    return subprocess.run(TOOL + [str(a) for a in args], capture_output=True, text=True, timeout=120, cwd=cwd)


def make_folder(root: Path) -> dict:
    files = {
        "README.md": "# a run\n", "results.md": "| x |\n", "results.json": "{}\n", "summary.txt": "s\n",
        "command.txt": "bash x.sh\n", "environment.txt": "env\n", "plot.png": "\x89PNG",
        "run.log": "line 1\nline 2\n", "raw/a_s1/metrics.jsonl": '{"step": 1, "loss": 2.5}\n',
        "raw/a_s1.time": '{"wall_s": 3}\n', "raw/a_s1/config.ini": "[train]\nsteps = 1\n",
        "sub/results.json": "[]\n", "sub/notes.md": "n\n", "sub/run.log": "sub log\n",
        "sub/command.txt": "not the folder's own: raw\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return files


RAW = {"run.log", "raw/a_s1/metrics.jsonl", "raw/a_s1.time", "raw/a_s1/config.ini", "sub/run.log", "sub/command.txt"}


def test_pack_list_extract_cat(tmp_path):
    d = tmp_path / "kind-20990101-cpu-abc1234"
    d.mkdir()
    files = make_folder(d)
    p = run("pack", d)
    assert p.returncode == 0, p.stderr
    assert f"{len(RAW)} files" in p.stdout
    left = {f.relative_to(d).as_posix() for f in d.rglob("*") if f.is_file()}
    assert left == (set(files) - RAW) | {"raw.tar.xz"}
    assert not (d / "raw").exists(), "a folder emptied by the pack stays behind"
    assert set(ra.members(d / "raw.tar.xz")) == RAW
    for rel in RAW:
        assert ra.read_text(d / rel) == files[rel]
    listing = run("list", d).stdout.split("\n")
    assert sorted(line.split()[1] for line in listing if line) == sorted(RAW)
    assert run("cat", d / "raw/a_s1/metrics.jsonl").stdout == files["raw/a_s1/metrics.jsonl"]
    bad = run("cat", d / "raw/nothing.log")
    assert bad.returncode != 0 and "raw/nothing.log" in bad.stderr
    out = tmp_path / "out"
    assert run("extract", d, "--to", out).returncode == 0
    assert {f.relative_to(out).as_posix() for f in out.rglob("*") if f.is_file()} == RAW
    assert (out / "sub/run.log").read_text() == files["sub/run.log"]
    one = tmp_path / "one"
    assert run("extract", d, "run.log", "--to", one).returncode == 0
    assert [f.name for f in one.iterdir()] == ["run.log"]
    p = run("extract", d, "absent.log", "--to", one)
    assert p.returncode != 0 and "absent.log" in p.stderr


def test_pack_adds_refuses_a_conflict_and_is_reproducible(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    make_folder(a)
    shutil.copytree(a, b)
    assert run("pack", a).returncode == 0 and run("pack", b).returncode == 0
    assert (a / "raw.tar.xz").read_bytes() == (b / "raw.tar.xz").read_bytes()
    # a new raw file joins the archive; the old members stay
    (a / "late.log").write_text("late\n")
    assert run("pack", a).returncode == 0
    assert set(ra.members(a / "raw.tar.xz")) == RAW | {"late.log"}
    # a file that differs from its member: an error, and the folder as it was
    (a / "run.log").write_text("edited\n")
    before = (a / "raw.tar.xz").read_bytes()
    p = run("pack", a)
    assert p.returncode != 0 and "run.log" in p.stderr
    assert (a / "run.log").read_text() == "edited\n" and (a / "raw.tar.xz").read_bytes() == before
    assert not list(a.glob(".raw.tar.xz*"))


def test_reader_functions_see_one_tree(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    files = make_folder(d)
    run("pack", d)
    assert ra.is_file(d / "raw/a_s1/metrics.jsonl") and ra.is_dir(d / "raw/a_s1") and ra.is_dir(d / "raw")
    assert not ra.is_file(d / "raw/a_s2/metrics.jsonl") and not ra.is_dir(d / "raw/a_s2")
    assert [p.name for p in ra.iterdir(d / "raw")] == ["a_s1", "a_s1.time"]
    assert [p.name for p in ra.iterdir(d)] == ["README.md", "command.txt", "environment.txt", "plot.png", "raw",
                                               "results.json", "results.md", "run.log", "sub", "summary.txt"]
    assert ra.glob(str(d / "raw" / "*.time")) == [str(d / "raw" / "a_s1.time")]
    assert ra.glob(str(d / "*" / "*.log")) == [str(d / "sub" / "run.log")]
    assert [line for line in ra.open_text(d / "run.log")] == ["line 1\n", "line 2\n"]
    # a file on disk wins over a member (a folder being written)
    (d / "run.log").write_text("on disk\n")
    assert ra.read_text(d / "run.log") == "on disk\n"
    with pytest.raises(FileNotFoundError, match="nothing.txt"):
        ra.read_text(d / "nothing.txt")


def tracked(*paths):
    p = subprocess.run(["git", "ls-files", "-z", *paths], cwd=SRC, capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"not a git checkout ({p.stderr.strip()}): the committed tree is not checked")
    return [f for f in p.stdout.split("\0") if f]


def test_no_raw_file_outside_an_archive():
    bad = []
    for f in tracked("bench/results"):
        parts = Path(f).parts
        if len(parts) < 4:  # bench/results/README.md, RENAMES.tsv
            continue
        rel = Path(*parts[3:]).as_posix()
        if not ra.is_plain(rel):
            bad.append(f)
    assert not bad, (f"{len(bad)} raw files of bench/results are not in their folder's raw.tar.xz (run "
                     f"python3 bench/results_archive.py pack FOLDER): " + ", ".join(bad[:10]))


def test_every_archive_reads_and_every_member_reference_resolves():
    arcs = [SRC / f for f in tracked("bench/results") if f.endswith("/" + ra.ARCHIVE)]
    assert arcs, "no raw.tar.xz under bench/results"
    for a in arcs:
        assert ra.members(a), f"{a}: empty"
    ref = re.compile(r"\]\(([^)\s]*" + re.escape(ra.ARCHIVE) + r")\) \(in " + re.escape(ra.ARCHIVE) + r": ([^)]+)\)")
    seen, bad = 0, []
    for f in tracked("*.md"):
        doc = SRC / f
        for target, member in ref.findall(doc.read_text(encoding="utf-8")):
            seen += 1
            arc = (doc.parent / target).resolve()
            if not arc.is_file() or member not in ra.members(arc):
                bad.append(f"{f}: {target} (in {ra.ARCHIVE}: {member})")
    assert seen, "no Markdown link names a member (docs/performance.md links the GEMM rates' raw files)"
    assert not bad, "references to archive members that do not exist:\n  " + "\n  ".join(bad)


def test_relink_points_links_at_the_archive(tmp_path):
    d = tmp_path / "res"
    d.mkdir()
    make_folder(d)
    run("pack", d)
    doc = tmp_path / "doc.md"
    doc.write_text("[log](res/run.log), [kept](res/README.md), [x](https://e/run.log)\n")
    assert run("relink", doc).returncode == 0
    assert doc.read_text() == ("[log](res/raw.tar.xz) (in raw.tar.xz: run.log), [kept](res/README.md), "
                               "[x](https://e/run.log)\n")


def packed_and_plain(tmp_path, folder):
    """(a copy of the committed folder as packed, the same with its archive unpacked in place)."""
    src = RESULTS / folder
    if not (src / ra.ARCHIVE).is_file():
        pytest.skip(f"{src}: no {ra.ARCHIVE}")
    packed, plain = tmp_path / "packed" / folder, tmp_path / "plain" / folder
    shutil.copytree(src, packed)
    shutil.copytree(src, plain)
    assert run("extract", plain).returncode == 0
    (plain / ra.ARCHIVE).unlink()
    return packed, plain


@pytest.mark.parametrize("script,folder,outputs", [
    ("precision_compare.py", "precision-check-20261128-epyc-zen4-47d2c95", ["results.md", "results.json"]),
    ("finetune_speed_report.py", "finetune-speed-20261128-epyc-zen3-bb68250-packedrows",
     ["results.md", "results.json"]),
    ("predict_speed_report.py", "predict-speed-20261128-epyc-zen3-d382a8b", []),
    ("bert_accuracy/report.py", "bert-accuracy-20261121-epyc-zen3-8a12a83", []),
])
def test_reports_read_a_packed_folder_as_an_unpacked_one(tmp_path, script, folder, outputs):
    packed, plain = packed_and_plain(tmp_path, folder)
    got = {}
    for name, d in (("packed", packed), ("plain", plain)):
        args = [sys.executable, str(SRC / "bench" / script), str(d)]
        if script == "predict_speed_report.py":
            args.append(str(tmp_path / "no-work"))
        p = subprocess.run(args, capture_output=True, text=True, timeout=120)
        assert p.returncode in (0, 1), f"{script} on the {name} copy: exit {p.returncode}\n{p.stderr[-2000:]}"
        got[name] = [p.stdout.replace(str(d), "RES")] + [(d / o).read_text().replace(str(d), "RES")
                                                         for o in outputs]
    assert got["packed"] == got["plain"]
    assert got["packed"][0].count("\n|") >= 2 or any(o.count("\n|") >= 2 for o in got["packed"][1:]), \
        f"{script}: no table rows: {got['packed'][0][:500]}"
