"""GPT-2 trained by nlptrain with the LM head fused with its loss (model.fused_head = on) and the
vocabulary 300 (not a multiple of 128) padded to 384 in the head's GEMMs (model.pad_vocab = 128),
against the same run unpadded and the unfused head, on the CPU:

1. padded against unpadded: every training and evaluation loss, every dataset of the checkpoint
   (weights and AdamW moments) and of the best-model file, and the tensors tools/hf_export.py writes
   from the checkpoint: identical in shape and content (bitwise); the embedding stays [300, C] and
   the exported config says vocab_size 300;
2. fused against unfused: the same losses within 1e-6 relative (the chunks only reorder the
   embedding gradient's sum), the same checkpoint shapes, and the memory plan's activations
   (summary.json) smaller by exactly the logits and their gradient less one chunk.
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nlp_run as nr

V, C, B, T, CHUNK = 300, 32, 3, 16, 20


def train(tmp: Path, name: str, fused: str, pad: str) -> Path:
    d = tmp / name
    d.mkdir()
    rng = np.random.default_rng(11)
    nr.write_stream(d / "train.h5", rng.integers(0, V, size=4000))
    nr.write_stream(d / "eval.h5", rng.integers(0, V, size=800))
    (d / "run.ini").write_text(f"""[run]
mode = train
task = clm
backend = cpu
threads = 2
log_interval = 1
[model]
type = gpt2
n_layer = 2
n_head = 4
n_embd = {C}
vocab_size = {V}
n_positions = 64
fused_head = {fused}
pad_vocab = {pad}
head_chunk = {CHUNK}
[data]
train = {d / "train.h5"}
eval = {d / "eval.h5"}
seq_len = {T}
[train]
steps = 6
batch_size = {B}
lr = 3e-3
seed = 5
[eval]
interval = 3
batches = 2
[checkpoint]
interval = 6
keep = 1
[output]
dir = {d / "out"}
""")
    nr.run([d / "run.ini"], ranks=1)
    return d / "out"


def losses(out: Path):
    train_rows, evals = nr.metrics(out)
    return [r["loss"] for r in train_rows] + [r["loss"] for r in evals]


def checkpoint(out: Path) -> Path:
    (ck,) = sorted((out / "checkpoints").glob("*.h5"))
    return ck


def activations(out: Path) -> int:
    """The memory plan's activation bytes (summary.json)."""
    return json.loads((out / "summary.json").read_text())["memory_plan"]["activations_bytes"]


def export(ck: Path, dest: Path) -> dict:
    tool = Path(nr.__file__).resolve().parents[2] / "tools" / "hf_export.py"
    p = subprocess.run([sys.executable, str(tool), str(ck), str(dest)], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    from safetensors.numpy import load_file
    return load_file(str(dest / "model.safetensors"))


def test_padded_vocabulary_changes_nothing_and_fused_head_matches_unfused(tmp_path, report):
    pytest.importorskip("safetensors")
    pad = train(tmp_path, "pad", "on", "128")
    nopad = train(tmp_path, "nopad", "on", "off")
    unfused = train(tmp_path, "unfused", "off", "off")
    assert "fused_head = on" in (pad / "config.ini").read_text()
    assert "pad_vocab = 128" in (pad / "config.ini").read_text()

    # 1. bitwise
    assert losses(pad) == losses(nopad)
    for a, b in ((checkpoint(pad), checkpoint(nopad)), (pad / "best.h5", nopad / "best.h5")):
        wa, wb = nr.read_weights(a), nr.read_weights(b)
        assert sorted(wa) == sorted(wb)
        for k in wa:
            assert np.asarray(wa[k]).shape == np.asarray(wb[k]).shape, k
            assert np.array_equal(wa[k], wb[k]), f"{a.name}: {k} differs"
        assert wa["transformer.wte.weight"].shape == (V, C)
    ea = export(checkpoint(pad), tmp_path / "export_pad")
    eb = export(checkpoint(nopad), tmp_path / "export_nopad")
    assert sorted(ea) == sorted(eb)
    for k in ea:
        assert ea[k].shape == eb[k].shape and np.array_equal(ea[k], eb[k]), k
    assert ea["transformer.wte.weight"].shape == (V, C)
    assert json.loads((tmp_path / "export_pad" / "config.json").read_text())["vocab_size"] == V

    # 2. fused against unfused
    lf, lu = losses(nopad), losses(unfused)
    assert len(lf) == len(lu) == 6 + 2
    worst = max(abs(x - y) / abs(y) for x, y in zip(lf, lu))
    assert worst <= 1e-6, (lf, lu)
    wf, wu = nr.read_weights(checkpoint(nopad)), nr.read_weights(checkpoint(unfused))
    assert {k: np.asarray(v).shape for k, v in wf.items()} == {k: np.asarray(v).shape for k, v in wu.items()}
    # the logits and their gradient [B*T, V] replaced by one chunk [CHUNK, Vp]
    assert activations(unfused) - activations(pad) == (2 * B * T * V - CHUNK * 384) * 4
    assert activations(unfused) - activations(nopad) == (2 * B * T * V - CHUNK * V) * 4
    plan = json.loads((pad / "summary.json").read_text())["memory_plan"]
    assert plan["lm_head_bytes"] == CHUNK * 384 * 4 and plan["lm_head_fused"] is True
    plan = json.loads((unfused / "summary.json").read_text())["memory_plan"]
    assert plan["lm_head_bytes"] == 2 * B * T * V * 4 and plan["lm_head_fused"] is False
    assert "fused LM head's chunk 0.0)" in (pad / "log.txt").read_text()
    report(f"\n[lm_head] fused vs unfused: max rel loss diff {worst:.2e} over {len(lf)} losses; "
           f"activations {activations(unfused)} -> {activations(pad)} bytes; "
           f"padded (V={V} -> 384) bitwise equal to unpadded: losses, checkpoint, best.h5, export")
