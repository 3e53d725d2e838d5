"""docs/configuration.md (linked from README.md) documents every configuration key with the binary's own
type and default, and README.md gives the test command that CI runs."""
import subprocess
import sys
from pathlib import Path

import nlp_run as nr

sys.path.insert(0, str(nr.SOURCE_DIR / "tools"))
import config_reference  # noqa: E402


def test_reference_lists_every_key_with_its_default():
    reference = (nr.SOURCE_DIR / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert "docs/configuration.md" in (nr.SOURCE_DIR / "README.md").read_text(encoding="utf-8")
    help_text = subprocess.run([nr.binary(), "--help"], capture_output=True, text=True, check=True).stdout
    rows = config_reference.parse_help(help_text)
    assert len(rows) > 40
    for key, typ, default, _ in rows:
        assert f"| `{key}` | {typ} | `{default}` |" in reference, f"docs/configuration.md is missing or stale for {key}"


def test_ci_runs_the_readme_test_command():
    readme = (nr.SOURCE_DIR / "README.md").read_text(encoding="utf-8")
    ci = (nr.SOURCE_DIR / ".ci" / "run").read_text(encoding="utf-8")
    assert "bash tools/run_tests.sh" in readme and "bash tools/run_tests.sh" in ci
