"""tools/bitwise_runs.py, the before/after check of behaviour-preserving changes: every case it records
runs with today's binary (so the tool cannot rot into refusals), two records of the same binary compare
equal, and a record that differs in one loss or one tensor is reported and exits 1."""
import json
import subprocess
import sys

import nlp_run as nr

TOOL = nr.SOURCE_DIR / "tools" / "bitwise_runs.py"


def tool(*args, check=True):
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], env=nr.mpi_env(),
                          capture_output=True, text=True, check=check, timeout=900)


def test_every_case_runs_and_a_rerun_is_bitwise_equal(tmp_path):
    tool("run", nr.binary(), tmp_path / "a")
    rec = json.loads((tmp_path / "a" / "record.json").read_text())
    assert rec, "no case recorded"
    bad = {k: v.get("err") for k, v in rec.items() if v["rc"]}
    assert not bad, bad
    assert all(len(v["steps"]) == 6 and v["weights"] for v in rec.values())
    tool("run", nr.binary(), tmp_path / "b", "--cases", "^gpt2$|^gpt2_r2_z3$|^bert_doc$")
    b = json.loads((tmp_path / "b" / "record.json").read_text())
    assert len(b) >= 2
    sub = {k: rec[k] for k in b}
    (tmp_path / "a_sub.json").write_text(json.dumps(sub))
    p = tool("compare", tmp_path / "a_sub.json", tmp_path / "b" / "record.json")
    assert f"{len(b)} of {len(b)} cases bitwise equal" in p.stdout

    changed = json.loads(json.dumps(sub))
    step, loss, norm = changed["gpt2"]["steps"][3]
    changed["gpt2"]["steps"][3] = [step, loss + 1e-15, norm]
    first = sorted(changed["gpt2_r2_z3"]["weights"])[0]
    changed["gpt2_r2_z3"]["weights"][first] = "0" * 16
    (tmp_path / "changed.json").write_text(json.dumps(changed))
    p = tool("compare", tmp_path / "a_sub.json", tmp_path / "changed.json", check=False)
    assert p.returncode == 1
    assert "gpt2: DIFFERENT" in p.stdout and "gpt2_r2_z3: DIFFERENT" in p.stdout
