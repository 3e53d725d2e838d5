"""The memory plan per ZeRO stage, recompute and offload (train/memory_plan.h): `nlptrain --check` on
4 ranks prints, for the GPT-2 XL preset with run.memory_limit_gb = 32, the weights, gradients,
optimizer state (device and host), activations and total per rank of every train.zero / recompute /
offload setting (stage 3 on the cpu backend) and marks what fits; the model-state columns equal the sizes computed here from the
architecture (the parameter count of GPT-2 XL; the 16-float alignment of each tensor is below 0.01%).
A run whose plan does not fit stops before allocating and names the smallest setting that fits."""
import re

import pytest

import nlp_run as nr

MIB = 1024 * 1024
ROW = re.compile(r"^#\s+(train\.zero = \d[^\d]*?)\s+((?:\d+\.\d\s+){7})(yes \(smallest\)|yes|no)\s*$")


def table(stdout):
    rows = {}
    for line in stdout.splitlines():
        m = ROW.match(line)
        if m:
            rows[m.group(1).strip()] = ([float(x) for x in m.group(2).split()], m.group(3))
    return rows


def gpt2_counts(V, C, L, npos):
    block = 12 * C * C + 13 * C  # ln1, c_attn, c_proj, ln2, c_fc, c_proj (weights and biases)
    resident = V * C + npos * C + 2 * C  # wte (tied head), wpe, ln_f
    return resident + L * block, resident, block


def test_check_prints_the_plan_per_stage_for_gpt2_xl_on_4_ranks(tmp_path):
    # --check opens the data's header: a small token stream of 1024-token windows
    data = nr.pattern_stream(tmp_path / "x.h5", windows=8, seed=1, seq=1024)
    ini = tmp_path / "xl.ini"
    ini.write_text(f"[model]\npreset = gpt2-xl\n[data]\ntrain = {data}\nseq_len = 1024\n[train]\nbatch_size = 1\n"
                   "[run]\nmemory_limit_gb = 32\n")
    p = nr.run(["--check", ini], ranks=4, timeout=120)
    rows = table(p.stdout)
    assert len(rows) == 16, p.stdout[-3000:]  # stages 0-3, each without and with recompute, offload, both
    P, resident, block = gpt2_counts(50257, 1600, 48, 1024)
    assert P == 1557611200  # GPT-2 XL (HF's count, tied head)
    N = 4
    close = lambda got, want: abs(got * MIB - want) <= 1e-4 * want + 0.05 * MIB
    for keys, (v, fits) in rows.items():
        weights, grads, opt, host, acts, workspace, total = v
        z = int(keys.split("train.zero = ")[1][0])
        offload = "offload" in keys
        shard = P / (N if z >= 1 else 1)
        # stage 3: the parameter shard, the resident tensors and 1 + train.zero_prefetch (default 1) block
        # buffers (train/param_shards.h)
        assert close(weights, 4 * P if z < 3 else 4 * (P / N + resident + 2 * block)), (keys, weights)
        # stage 3: the gradients of wte and wpe in their weights' buffers, ln_f's on its own
        grads_resident = resident if z < 3 else 2 * 1600
        assert close(grads, 4 * P if z < 2 else 4 * (P / N + grads_resident + 2 * block)), (keys, grads)
        assert close(opt, 0 if offload else 8 * shard), (keys, opt)
        assert close(host, 16 * shard if offload else 0), (keys, host)
        assert abs(total - (weights + grads + opt + host + acts + workspace)) <= 0.3, keys
        assert (fits != "no") == (total * MIB <= 32e9), (keys, total, fits)
        if "recompute" in keys:
            assert acts < rows[keys.replace(", train.recompute = block", "")][0][4] / 3, keys
    # the first row that fits is named
    first = next(k for k, (v, f) in rows.items() if f != "no")
    assert rows[first][1] == "yes (smallest)"
    assert f"smallest setting that fits 30518 MiB: {first}" in p.stdout
    # ZeRO-2's gradients are about 1/N of the arena plus the embeddings and two blocks
    assert rows["train.zero = 2"][0][1] < rows["train.zero = 1"][0][1] / 2.5
    # ZeRO-3's weights likewise
    assert rows["train.zero = 3"][0][0] < rows["train.zero = 2"][0][0] / 2.5


def test_a_plan_that_does_not_fit_names_the_smallest_stage_that_does(tmp_path):
    data = nr.pattern_stream(tmp_path / "train.h5", windows=64, seed=3)
    common = ["--model.preset=gpt2", "--data.seq_len=16", f"--data.train={data}", "--train.batch_size=1",
              "--run.threads=1", "--train.steps=1"]
    p = nr.run(["--check"] + common + ["--run.memory_limit_gb=100"], ranks=2, timeout=120)
    rows = table(p.stdout)
    z1, z2 = rows["train.zero = 1"][0][6], rows["train.zero = 2"][0][6]
    assert z2 < z1 < rows["train.zero = 0"][0][6]
    limit_gb = (z1 + z2) / 2 * MIB / 1e9  # ZeRO-2 fits, ZeRO-1 does not
    out = tmp_path / "out"
    p = nr.run(common + [f"--run.memory_limit_gb={limit_gb:.4f}", f"--output.dir={out}"], ranks=2, timeout=120,
               check=False)
    assert p.returncode != 0
    assert "the memory plan does not fit" in p.stderr, p.stderr[-3000:]
    assert "the smallest train.zero / train.recompute / train.offload setting that fits: train.zero = 2 (" in p.stderr, \
        p.stderr[-3000:]
    assert not (out / "checkpoints").exists()
