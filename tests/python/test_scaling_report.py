"""Tests of tools/scaling_report and tools/scaling_model.py (python3 -m pytest -q -rs
tests/python/test_scaling_report.py).

Synthetic summaries check the numbers (speedup and efficiency recomputed here from the inputs), the
Markdown, the plots, the alpha-beta model against hand computations, mode detection and bad input.
test_real_runs trains a tiny GPT-2 on 1 and 2 MPI ranks and reports on the two summaries; it skips
when the binary (NLPTRAIN_BIN, else build-lead/nlptrain) or mpirun is absent.
"""
import csv
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import nlp_run as nr

np = pytest.importorskip("numpy", reason="NLPTRAIN_ALL_SKIPPED: numpy is not installed")
pytest.importorskip("matplotlib", reason="NLPTRAIN_ALL_SKIPPED: matplotlib is not installed")

SOURCE = Path(os.environ.get("NLPTRAIN_SOURCE_DIR") or Path(__file__).resolve().parents[2])
TOOL = SOURCE / "tools" / "scaling_report"
PNGS = ("throughput.png", "efficiency.png", "step_breakdown.png", "model.png")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PARAMS = 1_000_000
SEQ = 16


def load_model_module():
    spec = importlib.util.spec_from_file_location("scaling_model", SOURCE / "tools" / "scaling_model.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["scaling_model"] = mod
    spec.loader.exec_module(mod)
    return mod


sm = load_model_module()


def summary(nodes, rpn, batch, step, comm, data=0.0005, grad_accum=1, mfu=None, **over):
    ws = nodes * rpn
    tps = batch * grad_accum * SEQ * ws
    s = {"world_size": ws, "nodes": nodes, "ranks_per_node": rpn, "backend": "cpu",
         "device": "cpu: Test CPU", "model_type": "gpt2", "n_layer": 4, "n_embd": 64,
         "parameters": PARAMS, "batch_size_per_rank": batch, "grad_accum": grad_accum, "seq_len": SEQ,
         "tokens_per_step": tps, "timed_steps": 50, "step_time_s": step,
         "compute_s": step - comm - data, "comm_s": comm, "data_s": data,
         "tokens_per_s": tps / step, "flops_per_token": 6.0 * PARAMS,
         "achieved_tflops": tps / step * 6.0 * PARAMS / 1e12, "mfu": mfu, "completed": True}
    s.update(over)
    return s


# strong: global batch 512 tokens (32 sequences) on 2, 4, 8 ranks (2 per node)
STRONG = [summary(1, 2, 16, 0.100, 0.010, mfu=0.40), summary(2, 2, 8, 0.056, 0.012, mfu=0.36),
          summary(4, 2, 4, 0.034, 0.014, mfu=0.29)]
# weak: 4 sequences per rank on 2, 4, 8 ranks
WEAK = [summary(1, 2, 4, 0.0100, 0.001), summary(2, 2, 4, 0.0110, 0.002),
        summary(4, 2, 4, 0.0125, 0.0035)]


def write_sweep(root: Path, runs):
    """<root>/nodes_<k>/summary.json as the SLURM jobscript lays them out (written in reverse)."""
    for s in reversed(runs):
        d = root / f"nodes_{s['nodes']}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "summary.json").write_text(json.dumps(s) + "\n")
    return root


def report(*args, check=True):
    r = subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True,
                       timeout=300)
    if check and r.returncode != 0:
        raise AssertionError(f"scaling_report {' '.join(map(str, args))} failed ({r.returncode}):\n"
                             f"{r.stderr}")
    return r


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def md_rows(md_text, first_header_cell):
    """Data rows (lists of cells) of the Markdown table whose header starts with the given cell."""
    lines = md_text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f"| {first_header_cell} |"):
            rows = []
            for l in lines[i + 2:]:
                if not l.startswith("|"):
                    break
                rows.append([c.strip() for c in l.strip("|").split("|")])
            return rows
    raise AssertionError(f"no table with header '{first_header_cell}' in:\n{md_text}")


def check_pngs(out: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.image as mpimg

    for name in PNGS:
        p = out / name
        assert p.is_file(), f"{name} missing"
        data = p.read_bytes()
        assert data[:8] == PNG_MAGIC, f"{name} is not a PNG"
        assert len(data) > 10_000, f"{name} is suspiciously small ({len(data)} bytes)"
        img = mpimg.imread(p)
        assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 300, img.shape
        assert float(img[..., :3].std()) > 0.01, f"{name} looks blank"


def no_temp_files(out: Path):
    left = [p.name for p in out.rglob("*") if p.name.startswith(".") or p.name.endswith(".tmp")]
    assert not left, f"temporary files left behind: {left}"


# ------------------------------------------------------------------------------------ synthetic

def test_help():
    r = report("--help")
    assert "--max-gpus" in r.stdout and "strong" in r.stdout and "ring" in r.stdout


def test_strong_sweep(tmp_path):
    sweep = write_sweep(tmp_path / "sweep", STRONG)
    out = tmp_path / "out"
    r = report("--out", out, sweep)
    assert "strong scaling (auto-detected" in r.stdout

    rows = read_csv(out / "scaling.csv")
    assert [int(r["nodes"]) for r in rows] == [1, 2, 4]
    assert [int(r["world_size"]) for r in rows] == [2, 4, 8]
    t1, n1 = STRONG[0]["step_time_s"], STRONG[0]["world_size"]
    for row, s in zip(rows, STRONG):
        speedup = t1 / s["step_time_s"]  # same global batch: throughput ratio = time ratio
        eff = t1 * n1 / (s["step_time_s"] * s["world_size"])
        assert float(row["speedup"]) == pytest.approx(speedup, rel=1e-9)
        assert float(row["efficiency"]) == pytest.approx(eff, rel=1e-9)
        for k in ("tokens_per_s", "step_time_s", "compute_s", "comm_s", "data_s", "mfu"):
            assert float(row[k]) == pytest.approx(s[k], rel=1e-12)
        assert int(row["ranks_per_node"]) == 2
    assert float(rows[2]["efficiency"]) == pytest.approx(0.1 * 2 / (0.034 * 8))

    md = (out / "scaling.md").read_text()
    assert "strong scaling" in md and "cpu: Test CPU" in md and "gpt2" in md
    assert "1,000,000 parameters" in md and "backend `cpu`" in md
    table = md_rows(md, "nodes")
    assert len(table) == 3
    for cells, s, row in zip(table, STRONG, rows):
        assert cells[0] == str(s["nodes"]) and cells[1] == str(s["world_size"])
        assert cells[4] == f"{s['step_time_s'] * 1e3:.3f}"
        assert cells[6] == f"{s['comm_s'] * 1e3:.3f}"
        assert cells[8] == f"{float(row['speedup']):.3f}"
        assert cells[9] == f"{float(row['efficiency']):.3f}"
        assert cells[10] == f"{s['mfu']:.3f}"
    # the tables printed to stdout are the ones in scaling.md
    assert md_rows(r.stdout, "nodes") == table
    assert md_rows(r.stdout, "GPUs") == md_rows(md, "GPUs")
    check_pngs(out)
    no_temp_files(out)


def test_weak_sweep(tmp_path):
    out = tmp_path / "out"
    files = [write_sweep(tmp_path / "sweep", WEAK) / f"nodes_{k}" / "summary.json" for k in (4, 1, 2)]
    r = report("--out", out, *files)
    assert "weak scaling (auto-detected" in r.stdout
    rows = read_csv(out / "scaling.csv")
    assert [int(r["nodes"]) for r in rows] == [1, 2, 4]
    s0 = WEAK[0]
    for row, s in zip(rows, WEAK):
        per_rank = (s["tokens_per_s"] / s["world_size"]) / (s0["tokens_per_s"] / s0["world_size"])
        assert float(row["efficiency"]) == pytest.approx(per_rank, rel=1e-9)
        assert float(row["speedup"]) == pytest.approx(s["tokens_per_s"] / s0["tokens_per_s"], rel=1e-9)
        assert row["mfu"] == ""
    # constant per-rank work: efficiency = T_1 / T_N
    assert float(rows[2]["efficiency"]) == pytest.approx(0.0100 / 0.0125)
    md = (out / "scaling.md").read_text()
    assert "weak scaling" in md and len(md_rows(md, "nodes")) == 3
    assert md_rows(md, "nodes")[0][10] == "-"  # mfu null
    check_pngs(out)
    no_temp_files(out)


def test_mode_detection_and_override(tmp_path):
    strong = write_sweep(tmp_path / "strong", STRONG)
    weak = write_sweep(tmp_path / "weak", WEAK)
    assert "strong scaling (--mode strong)" in report("--out", tmp_path / "o1", "--mode", "strong", strong).stdout
    assert "weak scaling (--mode weak)" in report("--out", tmp_path / "o2", "--mode", "weak", weak).stdout
    # a weak sweep is not a strong one, and the other way round
    r = report("--out", tmp_path / "o3", "--mode", "strong", weak, check=False)
    assert r.returncode != 0 and "tokens_per_step" in r.stderr
    r = report("--out", tmp_path / "o4", "--mode", "weak", strong, check=False)
    assert r.returncode != 0 and "batch_size_per_rank" in r.stderr
    # neither kind: global and per-rank batches both vary
    mixed = [STRONG[0], summary(2, 2, 6, 0.05, 0.01)]
    r = report("--out", tmp_path / "o5", write_sweep(tmp_path / "mixed", mixed), check=False)
    assert r.returncode != 0 and "cannot tell the scaling kind" in r.stderr
    # a single run: both kinds agree, reported (and modelled) as weak
    r = report("--out", tmp_path / "o6", strong / "nodes_1" / "summary.json")
    assert "weak scaling (auto: all runs have one world size" in r.stdout
    assert len(read_csv(tmp_path / "o6" / "scaling.csv")) == 1


def test_groups_by_configuration(tmp_path):
    other = [dict(s, n_layer=8, parameters=2 * PARAMS) for s in WEAK]
    a = write_sweep(tmp_path / "a", WEAK)
    b = write_sweep(tmp_path / "b", other)
    out = tmp_path / "out"
    report("--out", out, a, b)
    subdirs = sorted(p.name for p in out.iterdir())
    assert subdirs == [f"gpt2_L4_E64_P{PARAMS}_cpu_T{SEQ}", f"gpt2_L8_E64_P{2 * PARAMS}_cpu_T{SEQ}"]
    for d in subdirs:
        assert len(read_csv(out / d / "scaling.csv")) == 3


# ---------------------------------------------------------------------------------------- model

def test_model_formula_by_hand():
    net = sm.Network.from_options(latency_us=2.0, intra_GBps=300.0, link_gbps=200.0, links_per_node=4)
    assert net.node_Bps == pytest.approx(100e9) and net.intra_Bps == pytest.approx(300e9)
    S, a = 4.0 * 124_439_808, 2e-6  # GPT-2 small, fp32 gradients
    # one rank: nothing to reduce
    assert sm.allreduce_s(1, 1, S, net, "flat") == 0.0
    assert sm.allreduce_s(1, 1, S, net, "hierarchical") == 0.0
    # one node of 8: both are the ring over NVLink
    intra8 = 2 * 7 * a + 2 * 7 / 8 * S / 300e9
    assert sm.allreduce_s(1, 8, S, net, "flat") == pytest.approx(intra8, rel=1e-12)
    assert sm.allreduce_s(1, 8, S, net, "hierarchical") == pytest.approx(intra8, rel=1e-12)
    # p = 32 on 4 nodes of 8: flat ring, each rank gets 100/8 GB/s of the node's network
    assert sm.allreduce_s(4, 8, S, net, "flat") == pytest.approx(2 * 31 * a + 2 * 31 / 32 * S / 12.5e9, rel=1e-12)
    # hierarchical: ring in the node + ring over the 4 nodes at the full node bandwidth
    assert sm.allreduce_s(4, 8, S, net, "hierarchical") == pytest.approx(
        2 * 7 * a + 2 * 7 / 8 * S / 300e9 + 2 * 3 * a + 2 * 3 / 4 * S / 100e9, rel=1e-12)
    # p = 1024 (128 nodes): about 2 S / B_node = 9.95 ms across nodes
    h = sm.allreduce_s(128, 8, S, net, "hierarchical")
    assert h == pytest.approx(intra8 + 2 * 127 * a + 2 * 127 / 128 * S / 100e9, rel=1e-12)
    assert 0.0095 < h - intra8 < 0.0105
    assert sm.rank_counts(1024, 8) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert sm.rank_counts(100, 6) == [1, 2, 4, 6, 12, 24, 48, 96]
    assert sm.topology(4, 8) == (1, 4) and sm.topology(64, 8) == (8, 8)
    # step time and efficiency, with and without overlap
    pr = sm.predict(32, 4, 8, t_compute=0.2, p0=8, mode="weak", nbytes=S, net=net)
    comm = sm.allreduce_s(4, 8, S, net)
    assert pr.step_s == pytest.approx(0.2 + comm) and pr.efficiency == pytest.approx(0.2 / (0.2 + comm))
    pr = sm.predict(32, 4, 8, t_compute=0.2, p0=8, mode="weak", nbytes=S, net=net, overlap=0.5)
    assert pr.step_s == pytest.approx(0.2 + 0.5 * comm)
    pr = sm.predict(32, 4, 8, t_compute=0.2, p0=8, mode="strong", nbytes=S, net=net)
    assert pr.compute_s == pytest.approx(0.05)  # 0.2 s on 8 ranks -> 0.05 s on 32
    assert pr.efficiency == pytest.approx((0.2 * 8) / (32 * (0.05 + comm)))
    # overlap can hide at most the compute time
    pr = sm.predict(32, 4, 8, t_compute=1e-6, p0=8, mode="weak", nbytes=S, net=net, overlap=1.0)
    assert pr.step_s == pytest.approx(comm)


def test_model_in_report(tmp_path):
    """model.csv rows of the tool against a hand computation, weak and strong, with options."""
    out = tmp_path / "weak"
    r = report("--out", out, "--link-gbps", 100, "--links-per-node", 2, "--latency-us", 5,
               "--gpus-per-node", 4, "--intra-GBps", 150, "--max-gpus", 64, "--overlap", 0.25,
               write_sweep(tmp_path / "w", WEAK))
    rows = {int(r["p"]): r for r in read_csv(out / "model.csv")}
    assert sorted(rows) == [1, 2, 4, 8, 16, 32, 64]
    S, a, b_intra, b_node = 4.0 * PARAMS, 5e-6, 150e9, 2 * 100e9 / 8
    t_c = WEAK[0]["compute_s"] + WEAK[0]["data_s"]
    for p, nodes in ((4, 1), (16, 4), (64, 16)):
        comm = 2 * 3 * a + 2 * 3 / 4 * S / b_intra
        if nodes > 1:
            comm += 2 * (nodes - 1) * a + 2 * (nodes - 1) / nodes * S / b_node
        step = t_c + 0.75 * comm
        assert int(rows[p]["nodes"]) == nodes
        assert float(rows[p]["allreduce_s"]) == pytest.approx(comm, rel=1e-9)
        assert float(rows[p]["step_s"]) == pytest.approx(step, rel=1e-9)
        assert float(rows[p]["efficiency"]) == pytest.approx(t_c / step, rel=1e-9)
    flat16 = 2 * 15 * a + 2 * 15 / 16 * S / (b_node / 4)
    assert float(rows[16]["efficiency_flat"]) == pytest.approx(t_c / (t_c + 0.75 * flat16), rel=1e-9)
    # measured points beside the model, on its basis: t_compute / step time
    assert float(rows[4]["measured_efficiency"]) == pytest.approx(t_c / WEAK[1]["step_time_s"])
    assert rows[16]["measured_efficiency"] == ""
    assert "efficiency (hierarchical)" in r.stdout and "| 64 | 16 | 4 |" in r.stdout

    # strong: per-rank compute shrinks as p0/p; 32 sequences limit the predictions to 32 ranks
    out = tmp_path / "strong"
    r = report("--out", out, write_sweep(tmp_path / "s", STRONG))
    rows = {int(r["p"]): r for r in read_csv(out / "model.csv")}
    assert sorted(rows) == [1, 2, 4, 8, 16, 32]
    assert "cannot be split over more than 32 ranks" in r.stdout
    S, a = 4.0 * PARAMS, 2e-6
    t_c = (STRONG[0]["compute_s"] + STRONG[0]["data_s"]) * 2 / 16
    comm = 2 * 7 * a + 2 * 7 / 8 * S / 300e9 + 2 * 1 * a + 2 * 1 / 2 * S / 100e9
    assert float(rows[16]["efficiency"]) == pytest.approx(t_c / (t_c + comm), rel=1e-9)
    assert (out / "model.png").stat().st_size > 10_000


# ------------------------------------------------------------------------------------ bad input

def test_missing_key(tmp_path):
    sweep = write_sweep(tmp_path / "sweep", STRONG)
    bad = sweep / "nodes_2" / "summary.json"
    s = json.loads(bad.read_text())
    del s["comm_s"]
    bad.write_text(json.dumps(s))
    out = tmp_path / "out"
    r = report("--out", out, sweep, check=False)
    assert r.returncode != 0
    assert str(bad) in r.stderr and "comm_s" in r.stderr
    assert not out.exists()


def test_bad_json(tmp_path):
    sweep = write_sweep(tmp_path / "sweep", WEAK)
    bad = sweep / "nodes_4" / "summary.json"
    bad.write_text('{"world_size": 8, "nodes": ')
    r = report("--out", tmp_path / "out", sweep, check=False)
    assert r.returncode != 0 and str(bad) in r.stderr and "invalid JSON" in r.stderr
    bad.write_text("[1, 2]")
    r = report("--out", tmp_path / "out", sweep, check=False)
    assert r.returncode != 0 and str(bad) in r.stderr
    bad.write_text(json.dumps(dict(WEAK[2], step_time_s="fast")))
    r = report("--out", tmp_path / "out", sweep, check=False)
    assert r.returncode != 0 and str(bad) in r.stderr and "step_time_s" in r.stderr


def test_no_files(tmp_path):
    empty = tmp_path / "empty"
    (empty / "nodes_1").mkdir(parents=True)
    r = report("--out", tmp_path / "out", empty, check=False)
    assert r.returncode != 0 and str(empty) in r.stderr and "no summary.json" in r.stderr
    r = report("--out", tmp_path / "out", tmp_path / "nowhere", check=False)
    assert r.returncode != 0 and "nowhere" in r.stderr
    r = report("--out", tmp_path / "out", check=False)  # no paths at all
    assert r.returncode != 0
    assert not (tmp_path / "out").exists()


def test_duplicate_and_unmeasured_runs(tmp_path):
    sweep = write_sweep(tmp_path / "sweep", WEAK)
    dup = sweep / "nodes_2_retry" / "summary.json"
    dup.parent.mkdir()
    shutil.copy(sweep / "nodes_2" / "summary.json", dup)
    r = report("--out", tmp_path / "out", sweep, check=False)
    assert r.returncode != 0 and str(dup) in r.stderr and "nodes_2/summary.json" in r.stderr
    dup.write_text(json.dumps(dict(WEAK[1], nodes=3, world_size=6, timed_steps=0, step_time_s=0.0)))
    r = report("--out", tmp_path / "out", sweep, check=False)
    assert r.returncode != 0 and str(dup) in r.stderr and "no timed steps" in r.stderr


# ------------------------------------------------------------------------------------ real runs

def nlptrain_binary():
    try:
        b = Path(nr.binary())
    except FileNotFoundError:
        return None
    return b if b.is_file() and os.access(b, os.X_OK) else None


def test_real_runs(tmp_path):
    binary = nlptrain_binary()
    if binary is None:
        pytest.skip("nlptrain binary not found (set NLPTRAIN_BIN)")
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found")
    h5py = pytest.importorskip("h5py")
    data = tmp_path / "tokens.h5"
    with h5py.File(data, "w") as f:
        f.create_dataset("tokens", data=np.random.default_rng(0).integers(0, 64, 5000).astype(np.int32))
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_pml="ob1", OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")
    dirs = []
    for n in (1, 2):
        d = tmp_path / f"np{n}"
        cmd = ["mpirun", "-np", str(n), str(binary), "--model.n_layer=2", "--model.n_head=2",
               "--model.n_embd=32", "--model.vocab_size=64", "--model.n_positions=16",
               "--data.seq_len=16", "--train.steps=20", "--train.batch_size=4", "--run.threads=1",
               f"--data.train={data}", f"--output.dir={d}"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        assert p.returncode == 0, f"{' '.join(cmd)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        assert (d / "summary.json").is_file()
        dirs.append(d)
    out = tmp_path / "report"
    r = report("--out", out, *dirs)
    assert "weak scaling" in r.stdout  # 4 x 16 tokens per rank on 1 and 2 ranks
    table = md_rows((out / "scaling.md").read_text(), "nodes")
    assert len(table) == 2 and [c[1] for c in table] == ["1", "2"]
    rows = read_csv(out / "scaling.csv")
    assert [int(r["world_size"]) for r in rows] == [1, 2]
    assert float(rows[0]["efficiency"]) == 1.0 and float(rows[1]["efficiency"]) > 0
    check_pngs(out)
    no_temp_files(out)
