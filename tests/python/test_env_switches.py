"""Every NLPTRAIN_ environment variable that src/ reads (with getenv, or through the CUDA backend's
env_first(name, first, second) helper, which calls getenv on its first argument) is a row of tools/env_switches.py (the
table docs/configuration.md renders), and every NLPTRAIN_ row of it is read in src/."""
import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(SRC / "tools"))
import env_switches  # noqa: E402

# std::getenv("NLPTRAIN_X") or env_first("NLPTRAIN_X", ...)
GETENV = re.compile(r'\b(?:getenv|env_first)\(\s*"(NLPTRAIN_[A-Z0-9_]+)"')


def read_in_src():
    names = set()
    for p in (SRC / "src").rglob("*"):
        if p.suffix in (".cpp", ".h", ".cu", ".cuh"):
            names |= set(GETENV.findall(p.read_text(encoding="utf-8", errors="replace")))
    return names


def test_every_getenv_is_in_the_table_and_back():
    read = read_in_src()
    listed = {row[0] for row in env_switches.SWITCHES if row[0].startswith("NLPTRAIN_")}
    assert read, "no getenv(\"NLPTRAIN_...\") found in src/: the pattern no longer matches the code"
    assert not read - listed, f"read in src/ but not in tools/env_switches.py: {sorted(read - listed)}"
    assert not listed - read, f"in tools/env_switches.py but not read in src/: {sorted(listed - read)}"


def test_the_reference_renders_the_table():
    doc = (SRC / "docs/configuration.md").read_text(encoding="utf-8")
    assert env_switches.table() in doc, "docs/configuration.md lacks the environment table: regenerate it"
