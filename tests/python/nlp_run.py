"""Helpers for the integration tests: locate the binary, write small datasets, run nlptrain under
mpirun with a time limit, read metrics.jsonl."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

SOURCE_DIR = Path(os.environ.get("NLPTRAIN_SOURCE_DIR", Path(__file__).resolve().parents[2]))


def binary() -> str:
    """The nlptrain binary: $NLPTRAIN_BIN (ctest sets it), else build/nlptrain. Raises, never skips."""
    b = os.environ.get("NLPTRAIN_BIN")
    if b:
        return b
    p = SOURCE_DIR / "build" / "nlptrain"
    if p.exists():
        return str(p)
    raise FileNotFoundError("nlptrain binary not found: set NLPTRAIN_BIN or build into build/ "
                            "(cmake -S . -B build && cmake --build build --target nlptrain)")


def shared_data() -> Path:
    return Path(os.environ.get("NLPTRAIN_SHARED_DATA", SOURCE_DIR.parent / "shared" / "data"))


def mpi_env(threads: int | None = 1) -> dict:
    """Environment for mpirun as root on one host; OMP_NUM_THREADS set unless threads is None."""
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_pml="ob1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run(args, ranks=1, timeout=600, check=True):
    """Run nlptrain with `args` on `ranks` MPI ranks; returns CompletedProcess (text)."""
    cmd = ["mpirun", "-np", str(ranks), binary()] + [str(a) for a in args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=mpi_env())
    if check and p.returncode != 0:
        raise AssertionError(f"nlptrain failed ({p.returncode}): {' '.join(cmd)}\n"
                             f"stdout:\n{p.stdout[-4000:]}\nstderr:\n{p.stderr[-4000:]}")
    return p


def cuda_device_or_skip(what):
    """pytest.skip, saying why and that `what` is skipped, unless nlptrain has the CUDA backend and
    nvidia-smi lists a GPU."""
    v = subprocess.run([binary(), "--version"], capture_output=True, text=True, env=mpi_env())
    if "not compiled" in v.stdout:
        pytest.skip(f"no CUDA device: nlptrain was built without the CUDA backend; {what} skipped")
    try:
        smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        ok = smi.returncode == 0 and "GPU" in smi.stdout
    except (FileNotFoundError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        pytest.skip(f"no CUDA device (nvidia-smi -L lists no GPU): {what} skipped")


def write_rows(path, ids, mask=None, labels=None):
    with h5py.File(path, "w") as f:
        f.create_dataset("input_ids", data=np.asarray(ids, dtype=np.int32))
        if mask is not None:
            f.create_dataset("attention_mask", data=np.asarray(mask, dtype=np.int32))
        if labels is not None:
            f.create_dataset("labels", data=np.asarray(labels, dtype=np.int32))


def write_stream(path, tokens):
    with h5py.File(path, "w") as f:
        f.create_dataset("tokens", data=np.asarray(tokens, dtype=np.int32))


def pattern_stream(path, windows, seed, mult=7, seq=16, vocab=64, noise=0.1):
    """A learnable token stream for tiny models: the repeating pattern i * mult % vocab with a fraction
    `noise` of the tokens replaced at random; `windows` windows of seq + 1 tokens. Returns path."""
    rng = np.random.default_rng(seed)
    base = np.tile(np.arange(vocab) * mult % vocab, windows * seq // vocab + 2)[: windows * seq + 1]
    toks = np.where(rng.random(base.shape) < noise, rng.integers(0, vocab, size=base.shape), base)
    write_stream(path, toks)
    return path


def metrics(out_dir):
    rows = [json.loads(l) for l in Path(out_dir, "metrics.jsonl").read_text().splitlines() if l]
    train = [r for r in rows if r.get("split") is None]
    evals = [r for r in rows if r.get("split") == "eval"]
    return train, evals


def read_weights(path):
    with h5py.File(path, "r") as f:
        out = {}
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
        return out


def damage_global_heap(path) -> int:
    """Sets the size of the free-space object of every global heap collection in the HDF5 file at
    `path` to 0 (the damage tests/fuzz/fuzz_h5file found: libhdf5 1.10 loops forever decoding such a
    collection, so reading any variable-length string in it, e.g. an attribute h5py wrote from a str,
    hung). Assumes 8-byte lengths (h5py's and nlptrain's files). Returns how many were damaged."""
    data = bytearray(Path(path).read_bytes())
    damaged, at = 0, data.find(b"GCOL\x01")
    while at >= 0:
        total = int.from_bytes(data[at + 8:at + 16], "little")
        off = at + 16
        while off + 16 <= at + total:
            idx = int.from_bytes(data[off:off + 2], "little")
            size = int.from_bytes(data[off + 8:off + 16], "little")
            if idx == 0:
                data[off + 8:off + 16] = bytes(8)
                damaged += 1
                break
            off += 16 + (size + 7) // 8 * 8
        at = data.find(b"GCOL\x01", at + 16)
    assert damaged > 0, f"{path}: no global heap collection with free space"
    Path(path).write_bytes(bytes(data))
    return damaged


def wait_for(pred, what="condition", timeout=60):
    """Polls pred() every 50 ms until it is true; fails naming `what` after `timeout` seconds."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
