"""What a GPU call carries (bench/gpu/travel_size.py, printed by bench/gpu/prepare.sh): the tracked tree
stays within its share of the budget (12 of the 50 MiB target, 64 MiB limit), so that the stage has
room; and the size report itself fails over the limit and counts what it is given."""
import subprocess
import sys

import pytest

import nlp_run as nr

sys.path.insert(0, str(nr.SOURCE_DIR / "bench" / "gpu"))
import travel_size as ts  # noqa: E402

MIB = 1 << 20


def test_the_tracked_tree_is_within_its_share():
    try:
        n = ts.tree_bytes(nr.SOURCE_DIR, tracked_only=True)
    except RuntimeError as e:
        pytest.skip(f"not a git checkout: {e}")
    assert n > MIB, f"the tracked tree counts {n} bytes: git ls-files found almost nothing"
    assert n <= ts.TREE_SHARE, (
        f"the tracked tree is {n / MIB:.2f} MiB, over its {ts.TREE_SHARE // MIB} MiB share of what a GPU call "
        f"carries (docs/gpu.md): pack new bench/results folders (python3 bench/results_archive.py pack FOLDER) "
        f"or move large files out of the tree")


def test_the_budget_adds_up():
    assert ts.TREE_SHARE + ts.STAGE_SHARE == ts.TARGET <= ts.LIMIT == 64 * MIB


def fake_stage(root, sizes):
    for rel, n in sizes.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"\0" * n)


def test_stage_parts_and_the_exit_status(tmp_path, capsys):
    stage = tmp_path / "stage"
    fake_stage(stage, {"bin/nlptrain": 3 * MIB, "bin/test_cuda_bf16": 2 * MIB, "bin/device-libs.tar.xz": 5 * MIB,
                       "data/a.h5": MIB, "data/ft/doc_cls/b.h5": MIB, "commit.txt": 41})
    parts = dict(ts.stage_parts(stage))
    assert parts == {"stage/bin/device-libs.tar.xz": 5 * MIB, "stage/bin/nlptrain": 3 * MIB,
                     "stage/bin/test_cuda_bf16": 2 * MIB, "stage/data/": 2 * MIB, "stage (other files)": 41}
    assert ts.report(9 * MIB, list(parts.items())) == 0
    out = capsys.readouterr()
    assert "stage/bin/nlptrain" in out.out and "21.00 MiB" in out.out and out.err == ""
    # over the target: said, not failed; over the limit: failed
    assert ts.report(9 * MIB, [("stage/bin/nlptrain", 42 * MIB)]) == 0
    assert "over the 50 MiB target" in capsys.readouterr().err
    assert ts.report(9 * MIB, [("stage/bin/nlptrain", 56 * MIB)]) == 1
    assert "cannot be sent" in capsys.readouterr().err
    # the tree alone (no stage, as in CI): over its share fails
    assert ts.report(ts.TREE_SHARE + 1, []) == 1
    assert ts.report(ts.TREE_SHARE, []) == 0


def test_the_command_line(tmp_path):
    stage = tmp_path / "stage"
    fake_stage(stage, {"bin/nlptrain": 70 * MIB})
    p = subprocess.run([sys.executable, str(nr.SOURCE_DIR / "bench/gpu/travel_size.py"), "--stage", str(stage)],
                       capture_output=True, text=True, timeout=60)
    if "not a git" in p.stderr or "git ls-files" in p.stderr:
        pytest.skip(p.stderr)
    assert p.returncode == 1 and "stage/bin/nlptrain" in p.stdout and "cannot be sent" in p.stderr, p
    p = subprocess.run([sys.executable, str(nr.SOURCE_DIR / "bench/gpu/travel_size.py"), "--stage",
                        str(tmp_path / "none")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "none: no such folder" in p.stderr
