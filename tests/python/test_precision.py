"""train.precision on the CPU backend, end to end:
 - cpu::round_bf16 (src/backend/cpu/round.h, compiled here into a small harness with the project's C++
   compiler) gives the same bits as torch's float32 -> bfloat16 conversion on every bf16 pattern with
   several low halves and on a million random patterns (NaN: both NaN);
 - a small GPT-2 (2 layers, 128 wide) trained 100 steps on a synthetic Markov stream, and a BERT doc_cls
   model trained 100 steps on an NSMC slice (skipped, saying so, without the shared data): bf16 (and tf32
   for GPT-2) against fp32 on the same data and seed. The tolerance: the loss within 1e-2 (relative,
   mean of the last 10 steps) of fp32 after 100 steps; the losses must not be bitwise those of fp32 (the
   rounding is active); the log names the precision; precision = auto on the cpu is fp32, bitwise."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import nlp_run as nr

ROUND_HARNESS = r"""
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>
#include "backend/cpu/round.h"
int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* in = std::fopen(argv[1], "rb");
  if (!in) return 3;
  std::vector<uint32_t> v;
  uint32_t u;
  while (std::fread(&u, sizeof u, 1, in) == 1) v.push_back(u);
  std::fclose(in);
  for (auto& x : v) {
    float f;
    std::memcpy(&f, &x, sizeof f);
    f = nlp::cpu::round_bf16(f);
    std::memcpy(&x, &f, sizeof f);
  }
  FILE* out = std::fopen(argv[2], "wb");
  if (!out || std::fwrite(v.data(), sizeof(uint32_t), v.size(), out) != v.size()) return 4;
  return std::fclose(out) == 0 ? 0 : 5;
}
"""


def compiler():
    cxx = os.environ.get("NLPTRAIN_CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        pytest.skip("no C++ compiler to build the rounding harness (set NLPTRAIN_CXX)")
    return cxx


def test_round_bf16_matches_torch(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    exe = tmp_path / "round_bf16"
    (tmp_path / "h.cpp").write_text(ROUND_HARNESS)
    subprocess.run([compiler(), "-std=c++20", "-O2", f"-I{nr.SOURCE_DIR / 'src'}",
                    str(tmp_path / "h.cpp"), "-o", str(exe)], check=True)
    rng = np.random.default_rng(3)
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    lows = [0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF]
    x = np.concatenate([hi | np.uint32(lo) for lo in lows] +
                       [hi | rng.integers(0, 1 << 16, size=hi.size, dtype=np.uint32),
                        rng.integers(0, 1 << 32, size=1_000_000, dtype=np.uint32)])
    x.tofile(tmp_path / "in.bin")
    subprocess.run([str(exe), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], check=True)
    got = np.fromfile(tmp_path / "out.bin", dtype=np.uint32)
    assert got.size == x.size
    want = torch.from_numpy(x.view(np.float32)).to(torch.bfloat16).float().numpy().view(np.uint32)
    gf, wf = got.view(np.float32), want.view(np.float32)
    both_nan = np.isnan(gf) & np.isnan(wf)
    bad = ~both_nan & (got != want)
    assert not bad.any(), [(hex(a), hex(b), hex(c)) for a, b, c in
                           zip(x[bad][:10], got[bad][:10], want[bad][:10])]
    # The comparison covered what matters: ties, NaNs, infinities from overflow, subnormals.
    assert np.isnan(wf).sum() > 1000
    assert (np.isinf(wf) & np.isfinite(x.view(np.float32))).sum() > 0
    assert ((x & 0xFFFF) == 0x8000).sum() >= 1 << 16


# ---- training runs ----------------------------------------------------------------------------------

TOL = 1e-2  # bf16 loss within 1e-2 of fp32 after 100 steps


def losses(out):
    return np.array([r["loss"] for r in nr.metrics(out)[0]], dtype=np.float64)


def rel(a, b):
    return abs(a - b) / abs(b)


def compare(runs, report, name):
    """runs: precision -> (losses, stdout). Checks and reports each reduced precision against fp32."""
    ref = runs["fp32"][0]
    assert len(ref) == 100
    for prec, (l, stdout) in runs.items():
        assert f"| precision {prec} |" in stdout, stdout[:2000]
        if prec == "fp32":
            continue
        assert len(l) == 100
        last10 = rel(l[-10:].mean(), ref[-10:].mean())
        final = rel(l[-1], ref[-1])
        report(f"{name}: {prec} vs fp32 after 100 steps: final loss {l[-1]:.6f} vs {ref[-1]:.6f} "
               f"(rel {final:.2e}), mean of last 10 {l[-10:].mean():.6f} vs {ref[-10:].mean():.6f} "
               f"(rel {last10:.2e}); max rel over all steps {np.max(np.abs(l - ref) / ref):.2e}")
        assert last10 < TOL, (prec, last10)
        # The rounding is active: not one step's loss is fp32's, bitwise (step 1 included: the
        # forward pass already rounds).
        assert not np.any(l == ref), (prec, np.flatnonzero(l == ref))


@pytest.fixture(scope="module")
def markov_stream(tmp_path_factory):
    """A first-order Markov chain over 64 symbols with peaked transitions (Dirichlet 0.1): a GPT-2 learns
    it within 100 steps (conditional entropy about 2.4 nats against ln 64 = 4.16 for a uniform guess)."""
    rng = np.random.default_rng(11)
    V, n = 64, 64 * 8 * 110 + 1
    cum = np.cumsum(rng.dirichlet(np.full(V, 0.1), size=V), axis=1)
    u = rng.random(n)
    toks = np.zeros(n, dtype=np.int32)
    for i in range(1, n):
        toks[i] = min(np.searchsorted(cum[toks[i - 1]], u[i]), V - 1)
    path = tmp_path_factory.mktemp("markov") / "train.h5"
    nr.write_stream(path, toks)
    return path


def test_gpt2_bf16_and_tf32_track_fp32(markov_stream, tmp_path, report):
    common = ["--model.n_layer=2", "--model.n_head=4", "--model.n_embd=128", "--model.vocab_size=64",
              "--model.n_positions=64", "--data.seq_len=64", f"--data.train={markov_stream}",
              "--train.steps=100", "--train.batch_size=8", "--train.lr=3e-3", "--train.warmup_steps=10",
              "--run.threads=1", "--run.log_interval=50"]
    runs = {}
    for prec in ("fp32", "bf16", "tf32", "auto"):
        out = tmp_path / prec
        p = nr.run(common + [f"--output.dir={out}", f"--train.precision={prec}"])
        runs[prec] = (losses(out), p.stdout)
    # bf16 with run.cpu_bf16 = auto (the default): where the CPU has no bf16 arithmetic, the log says
    # that it is emulated and slower than fp32, and how to run fast
    bf16_out = runs["bf16"][1]
    emulated = "bf16: emulated" in bf16_out
    assert emulated or "bf16: native" in bf16_out, bf16_out[:3000]
    assert ("warning: train.precision = bf16 is emulated on this CPU" in bf16_out) == emulated, bf16_out[:3000]
    auto_losses, auto_stdout = runs.pop("auto")
    assert "| precision fp32 |" in auto_stdout  # auto = fp32 on the cpu backend ...
    assert np.array_equal(auto_losses, runs["fp32"][0])  # ... bitwise
    ref = runs["fp32"][0]
    assert ref[-10:].mean() < ref[0] - 1.0, ref  # it learns: the comparison is not at a fixed point
    compare(runs, report, "gpt2")


def test_bert_doc_cls_bf16_tracks_fp32(tmp_path, report):
    data = nr.shared_data()
    tsv, vocab = data / "nsmc" / "nsmc_from_raw_train.tsv", data / "vocab" / "kcbert-base" / "vocab.txt"
    for path in (tsv, vocab):
        if not path.exists():
            pytest.skip(f"shared data absent: {path} (NLPTRAIN_SHARED_DATA)")
    train = tmp_path / "train.h5"
    subprocess.run([sys.executable, str(nr.SOURCE_DIR / "tools" / "prep_doc_cls.py"), "--vocab",
                    str(vocab), "--quiet", "--input", str(tsv), "--limit", "2000", "--max-seq-len", "64",
                    "--out", str(train)], check=True)
    common = ["--model.type=bert", "--run.task=doc_cls", "--model.vocab_size=30000",
              "--model.hidden_size=128", "--model.num_hidden_layers=2", "--model.num_attention_heads=4",
              "--model.intermediate_size=256", "--model.max_position_embeddings=128",
              "--model.num_labels=0", f"--data.train={train}", "--train.steps=100",
              "--train.batch_size=8", "--train.lr=2e-3", "--train.warmup_steps=10", "--run.threads=1",
              "--run.log_interval=50"]
    runs = {}
    for prec in ("fp32", "bf16"):
        out = tmp_path / prec
        p = nr.run(common + [f"--output.dir={out}", f"--train.precision={prec}"], ranks=2)
        runs[prec] = (losses(out), p.stdout)
    ref = runs["fp32"][0]
    # It learns (chance is ln 2 = 0.693; this run reached 0.642, seeds 1 and 2 0.548 and 0.600): at
    # chance both precisions would agree trivially.
    assert ref[-10:].mean() < 0.67, ref
    # Measured (2026-11-23): mean of the last 10 within 1.9e-3 of fp32 at this seed, 1.5e-3 and 9.6e-4
    # at seeds 1 and 2. The agreement is a property of stable training, not a bound: at lr 3e-3, seed 1,
    # the bf16 and fp32 trajectories drifted apart to 4e-2.
    compare(runs, report, "bert doc_cls")


def test_gpt2_native_bf16_tracks_the_emulation(markov_stream, tmp_path, report):
    """run.cpu_bf16 = native (oneDNN on AMX-BF16 / AVX512-BF16) against emulate, the reference that the
    GPU's bf16 is compared with: the same operands rounded the same way, fp32 accumulation on both, so
    the first step's loss agrees to summation order and 100 steps stay within 1e-2. Skips,
    with nlptrain's own reason, where the CPU or the build has no native bf16."""
    common = ["--model.n_layer=2", "--model.n_head=4", "--model.n_embd=128", "--model.vocab_size=64",
              "--model.n_positions=64", "--data.seq_len=64", f"--data.train={markov_stream}",
              "--train.steps=100", "--train.batch_size=8", "--train.lr=3e-3", "--train.warmup_steps=10",
              "--run.threads=1", "--run.log_interval=50", "--train.precision=bf16"]
    p = nr.run(common + [f"--output.dir={tmp_path / 'native'}", "--run.cpu_bf16=native"], check=False)
    if p.returncode != 0:
        assert "run.cpu_bf16 = native" in p.stdout + p.stderr, p.stdout[-2000:] + p.stderr[-2000:]
        pytest.skip("no native bf16 here: " + (p.stdout + p.stderr).strip().splitlines()[-1])
    assert "bf16: native" in p.stdout, p.stdout[:3000]
    e = nr.run(common + [f"--output.dir={tmp_path / 'emulate'}", "--run.cpu_bf16=emulate"])
    assert "bf16: emulated" in e.stdout, e.stdout[:3000]
    # the default, auto: native only where the CPU has AMX-BF16, else emulated (AVX512-BF16 alone measured
    # slower than fp32); the log says which and why, and the run is bitwise the one it picked
    a = nr.run(common + [f"--output.dir={tmp_path / 'auto'}"])
    auto_native = "(run.cpu_bf16 = auto, native: the CPU has AMX-BF16" in a.stdout
    assert auto_native or "(run.cpu_bf16 = auto, emulated: the CPU has AVX512-BF16 but not AMX-BF16" in a.stdout, \
        a.stdout[:3000]
    assert ("bf16: native" in a.stdout) == auto_native, a.stdout[:3000]
    assert ("warning: train.precision = bf16 is emulated on this CPU" in a.stdout) != auto_native, a.stdout[:3000]
    ln, le, la = losses(tmp_path / "native"), losses(tmp_path / "emulate"), losses(tmp_path / "auto")
    assert np.array_equal(la, ln if auto_native else le)  # deterministic run to run
    first = rel(ln[0], le[0])
    last10 = rel(ln[-10:].mean(), le[-10:].mean())
    report(f"gpt2 bf16 native vs emulated: step 1 loss rel {first:.2e}, mean of last 10 rel {last10:.2e} "
           f"({ln[-10:].mean():.6f} vs {le[-10:].mean():.6f})")
    assert first < 1e-5, (ln[0], le[0])
    assert last10 < TOL, last10
    assert le[-10:].mean() < le[0] - 1.0  # it learned
