"""Shared by the one-command job tools (predict_text.py, generate_text.py): errors, reading an INI the
way nlptrain does for the few keys they need, the tokenizer a weights file was trained with, and the
nlptrain command line."""
from __future__ import annotations

import configparser
import os
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Fail(Exception):
    """An error to print as `PROG: error: ...` with exit status 1."""


def split_overrides(argv):
    """(the tool's arguments, the nlptrain overrides after a '--')."""
    if "--" not in argv:
        return list(argv), []
    k = argv.index("--")
    return list(argv[:k]), list(argv[k + 1:])


def parser(prog, doc):
    """An argparse parser whose description and epilog are the tool's docstring."""
    import argparse
    return argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0], epilog=doc.split("\n", 2)[2],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def read_ini(path) -> configparser.ConfigParser:
    path = Path(path)
    if not path.is_file():
        raise Fail(f"INI file '{path}' not found")
    ini = configparser.ConfigParser(comment_prefixes=("#", ";"), interpolation=None)
    try:
        ini.read_string(path.read_text(encoding="utf-8"), source=str(path))
    except (configparser.Error, UnicodeDecodeError) as e:
        raise Fail(f"INI file '{path}': {e}") from None
    return ini


def ini_value(ini, section, key, default=""):
    v = ini.get(section, key, fallback=default).strip()
    return v[1:-1] if len(v) >= 2 and v[0] == v[-1] == '"' else v


def h5_attr(path, key):
    import h5py
    try:
        with h5py.File(path, "r") as f:
            v = f.attrs.get(key)
    except OSError as e:
        raise Fail(f"cannot read '{path}' as HDF5: {e}") from None
    return v.decode() if isinstance(v, bytes) else v


def tokenizer_of(weights) -> str:
    """The folder of the tokenizer that trained `weights` (its tokenizer_files attribute, which nlptrain
    copies from the training data and hf_import.py from the Hub folder)."""
    files = h5_attr(weights, "tokenizer_files")
    if not files:
        raise Fail(f"weights '{weights}' do not say which tokenizer trained them (no tokenizer_files "
                   f"attribute: data made before the tokenizer fingerprints); give --tokenizer PATH")
    first = Path(str(files).splitlines()[0])
    if not first.exists():
        raise Fail(f"the tokenizer of weights '{weights}', '{first}', does not exist here; give --tokenizer PATH")
    return str(first.parent)


def run(prog, cmd):
    """Run cmd (a list), echoing it; a failure is a Fail."""
    print(f"{prog}: $ {shlex.join(cmd)}", flush=True)
    if subprocess.run(cmd).returncode != 0:
        raise Fail(f"{Path(cmd[1] if cmd[0] != 'mpirun' else cmd[-1]).name} failed (see above)")


def nlptrain(ranks, args):
    """mpirun -np RANKS nlptrain ARGS: the binary is $NLPTRAIN_BIN, else build/nlptrain. One rank runs
    with --bind-to none: Open MPI would bind it to one core, and its threads (run.threads defaults to
    the CPUs of the process's affinity mask) then share that core; unbound, it keeps the CPUs this
    process was given (a SLURM job's allocation, or the whole machine)."""
    binary = os.environ.get("NLPTRAIN_BIN") or str(ROOT / "build" / "nlptrain")
    return (["mpirun", "-np", str(ranks)] + (["--bind-to", "none"] if ranks == 1 else [])
            + (["--allow-run-as-root"] if os.geteuid() == 0 else []) + [binary] + args)
