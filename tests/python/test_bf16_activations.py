"""run.bf16_activations (activations and their gradients stored in bf16; docs/design.md, precision) end
to end on the CPU backend, the reference for the GPU's bf16 stores:
 - a GPT-2 run with bf16 activations tracks the same bf16-precision run with fp32 activations (every
   step's loss within 2e-2 relative; not bitwise: the stores round), says so in its first log line,
   and its memory plan's activations are smaller;
 - resumed from its step-6 checkpoint it continues bitwise onto the uninterrupted run (losses and the
   step-12 checkpoint: weights and AdamW moments), as fp32 and bf16 runs do;
 - a BERT doc_cls run (padding in the batches, dropout on) tracks fp32 activations the same way;
 - run.profile's account counts no operand cast of an activation (they are bf16 already): with the
   bf16 weight copy too, only the unfused head's fp32 dlogits are cast;
 - with train.precision = fp32 the option is refused before anything runs, naming both keys;
 - on the cpu backend summary.json has no "gpu_paths"; on cuda (skipped without a GPU) it has them for
   the timed steps, as the log's "paths" line after "done:" does, and every bias GEMM of the bf16 step
   ran the fused BIAS epilogue (none fell back)."""
import json
import shutil

import numpy as np
import pytest

import nlp_run as nr
from test_bf16_weights import TINY, assert_bitwise, checkpoint, losses

@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("bf16a")
    return [f"--data.train={nr.pattern_stream(d / 'train.h5', windows=128, seed=7)}"]


def close(a, b, rel):
    assert len(a) == len(b) and len(a) > 0
    for (s, x, _), (t, y, _) in zip(a, b):
        assert s == t and abs(x - y) <= rel * abs(y), (s, x, y)


def test_gpt2_tracks_fp32_activations_and_resumes_bitwise(data, tmp_path):
    common = data + TINY + ["--train.steps=12", "--checkpoint.interval=6", "--checkpoint.keep=5"]
    ref, new = tmp_path / "fp32acts", tmp_path / "bf16acts"
    nr.run(common + [f"--output.dir={ref}"])
    p = nr.run(common + [f"--output.dir={new}", "--run.bf16_activations=true"])
    assert "| precision bf16 (activations bf16) |" in p.stdout, p.stdout[:2000]
    close(losses(new), losses(ref), 2e-2)
    assert losses(new) != losses(ref)  # the bf16 stores did round something
    plan = {k: json.loads((o / "summary.json").read_text())["memory_plan"] for k, o in (("r", ref), ("n", new))}
    assert plan["n"]["activations_bytes"] < plan["r"]["activations_bytes"], plan

    cut = tmp_path / "cut"
    shutil.copytree(new, cut)
    (cut / "checkpoints" / "step_00000012.h5").unlink()
    (cut / "summary.json").unlink()
    lines = (cut / "metrics.jsonl").read_text().splitlines()
    (cut / "metrics.jsonl").write_text("".join(l + "\n" for l in lines if json.loads(l).get("step", 0) <= 6))
    nr.run(common + [f"--output.dir={cut}", "--run.bf16_activations=true", "--train.resume=true"])
    assert "resumed from" in (cut / "log.txt").read_text()
    assert losses(cut) == losses(new)
    assert_bitwise(checkpoint(cut, 12), checkpoint(new, 12))


def test_bert_doc_cls_tracks_fp32_activations(tmp_path):
    rng = np.random.default_rng(3)
    n, T = 64, 16
    ids = rng.integers(5, 60, size=(n, T))
    mask = np.ones((n, T), dtype=np.int32)
    for i in range(n):  # rows of different lengths: padding inside the batches
        mask[i, 8 + i % 8:] = 0
    ids = np.where(mask == 1, ids, 0)
    labels = (ids[:, 1] % 2).astype(np.int32)
    nr.write_rows(tmp_path / "cls.h5", ids, mask, labels)
    common = ["--model.type=bert", "--run.task=doc_cls", "--model.vocab_size=64", "--model.hidden_size=32",
              "--model.num_hidden_layers=2", "--model.num_attention_heads=2", "--model.intermediate_size=48",
              "--model.max_position_embeddings=32", "--model.num_labels=2", f"--data.train={tmp_path / 'cls.h5'}",
              "--train.steps=10", "--train.batch_size=8", "--train.lr=1e-3", "--run.threads=1",
              "--run.log_interval=1", "--train.precision=bf16", "--run.cpu_bf16=emulate"]
    ref, new = tmp_path / "fp32acts", tmp_path / "bf16acts"
    nr.run(common + [f"--output.dir={ref}"])
    nr.run(common + [f"--output.dir={new}", "--run.bf16_activations=true"])
    close(losses(new), losses(ref), 2e-2)
    assert losses(new) != losses(ref)


def test_account_casts_no_activation(data, tmp_path):
    out = tmp_path / "prof"
    run = nr.run(data + TINY + ["--train.steps=4", f"--output.dir={out}", "--run.profile=true",
                                "--run.bf16_activations=true", "--run.bf16_weights=true"])
    summary = json.loads((out / "summary.json").read_text())
    # the cpu backend keeps no path counts: no "gpu_paths" in summary.json or the account, no "paths" line
    assert "gpu_paths" not in summary and "gpu_paths" not in summary["profile"], sorted(summary)
    assert "done:" in run.stdout and "paths:" not in run.stdout, run.stdout[-2000:]
    p = summary["profile"]
    ops = {o["label"]: o for o in p["ops"]}
    assert "gemm blocks (forward)" in ops and "gemm lm head (forward)" in ops, sorted(ops)
    # (a label may still carry time: the CPU rounds its operand copies whatever they hold, a no-op on
    # bf16 values; the account counts the bytes a cast must move, none here)
    for k in ("cast: gemm blocks (forward)", "cast: gemm blocks (backward)", "cast: gemm lm head (forward)"):
        assert ops.get(k, {}).get("bytes", 0) == 0, (k, ops.get(k))
    # the unfused head's fp32 dlogits are still cast for its backward GEMMs: 32 x 64 elements, 6 bytes
    assert ops["cast: gemm lm head (backward)"]["bytes"] == 32 * 64 * 6, ops["cast: gemm lm head (backward)"]
    # the blocks' forward GEMMs read bf16 activations and write bf16: 2 bytes an activation element
    fam = {f["family"]: f for f in p["families"]}
    assert fam["gemm (blocks)"]["bytes"] > 0


def test_needs_bf16_precision(data, tmp_path):
    p = nr.run(data + TINY + ["--train.precision=fp32", "--run.bf16_activations=true",
                              f"--output.dir={tmp_path / 'x'}"], check=False)
    assert p.returncode != 0
    err = p.stdout + p.stderr
    assert "run.bf16_activations" in err and "train.precision" in err, err[-2000:]
    assert not (tmp_path / "x" / "metrics.jsonl").exists()


def test_cuda_run_reports_gpu_paths(data, tmp_path):
    nr.cuda_device_or_skip("the path counts of a cuda run are")
    out = tmp_path / "cuda"
    run = nr.run(data + TINY + ["--train.steps=3", f"--output.dir={out}", "--run.backend=cuda",
                                "--run.bf16_activations=true", "--run.bf16_weights=true",
                                "--model.attention=native"])
    p = json.loads((out / "summary.json").read_text())["gpu_paths"]
    kinds = {"bias", "gelu_aux", "dgelu", "bgrad"}
    assert set(p) == {"gemm_fused", "gemm_fallback", "staged_ops", "casts"}, p
    assert set(p["gemm_fused"]) == kinds and set(p["gemm_fallback"]) == kinds, p
    assert set(p["casts"]) == {"fp32_to_bf16", "bf16_to_fp32"}, p
    # 2 timed steps, 2 blocks: qkv, proj, fc and fcp each with a bias, in the forward
    assert p["gemm_fused"]["bias"] >= 2 * 2 * 4 and p["gemm_fallback"]["bias"] == 0, p
    line = [l for l in run.stdout.splitlines() if "paths: over the last 2 steps, gemm fused (" in l]
    assert len(line) == 1, run.stdout[-3000:]
    assert f"gemm fused (bias {p['gemm_fused']['bias']}," in line[0], (line, p)
