"""Tests of the scaling-study pieces: tools/comm_fit.py (the alpha-beta fit of the
allreduce microbenchmark), tools/scaling_report --comm-fit (measured vs modelled efficiency),
jobscripts/scaling_sweep.sh --sizes / --global-batch (dry run), bench/allreduce_bench under mpirun,
and bench/scaling_study.sh end to end on a two-node SLURM started on this host (skipped, with the
reason, when SLURM cannot run here).

  python3 -m pytest -q -rs tests/python/test_scaling_study.py
"""
import csv
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SOURCE = Path(os.environ.get("NLPTRAIN_SOURCE_DIR") or Path(__file__).resolve().parents[2])
FIT_TOOL = SOURCE / "tools" / "comm_fit.py"
REPORT = SOURCE / "tools" / "scaling_report"
SWEEP = SOURCE / "jobscripts" / "scaling_sweep.sh"
STUDY = SOURCE / "bench" / "scaling_study.sh"

spec = importlib.util.spec_from_file_location("comm_fit", FIT_TOOL)
cf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cf)

ALPHA, BETA = 20e-6, 2.0e9  # 20 us per ring step, 2 GB/s
SIZES = [4 * 4 ** k for k in range(13)]  # 4 B .. 64 MiB


def ring(p, s, alpha=ALPHA, beta=BETA):
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * s / beta


def bench_doc(p, nodes, rpn, times, label=""):
    return {"tool": "allreduce_bench", "label": label, "world_size": p, "nodes": nodes,
            "ranks_per_node": rpn, "mpi_library": "test", "correct": True,
            "results": [{"bytes": s, "count": s // 4, "reps": 10, "median_s": t, "min_s": t * 0.9,
                         "mean_s": t * 1.1, "max_s": t * 2} for s, t in zip(SIZES, times)]}


def write(path: Path, obj):
    path.write_text(json.dumps(obj) + "\n")
    return path


def run(cmd, check=True, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"{cmd} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


# ------------------------------------------------------------------------------------- the fit

def test_fit_recovers_alpha_beta(tmp_path):
    # +-5 % alternating noise: the relative least squares must land close to the truth
    noise = [1.05 if i % 2 else 0.95 for i in range(len(SIZES))]
    f2 = write(tmp_path / "a2.json", bench_doc(2, 2, 1, [ring(2, s) * n for s, n in zip(SIZES, noise)], "2x1"))
    f4 = write(tmp_path / "a4.json", bench_doc(4, 2, 2, [ring(4, s) * n for s, n in zip(SIZES, noise)]))
    out = tmp_path / "fit.json"
    r = run([sys.executable, FIT_TOOL, "--out", out, f2, f4])
    assert "INVALID" not in r.stderr
    doc = json.loads(out.read_text())
    assert doc["tool"] == "comm_fit" and doc["statistic"] == "median_s"
    labels = [f["label"] for f in doc["fits"]]
    assert labels == ["2x1", "2x2"]  # the file's label, else NxR
    for f in doc["fits"] + [doc["joint"]]:
        assert f["valid"] and not f["problems"]
        assert f["alpha_s"] == pytest.approx(ALPHA, rel=0.1), f
        assert f["beta_Bps"] == pytest.approx(BETA, rel=0.1), f
        assert f["max_rel_err"] < 0.12
    assert doc["joint"]["world_sizes"] == [2, 4]
    # exact data: exact fit, and the points carry model and error
    exact = cf.fit_files([dict(bench_doc(4, 1, 4, [ring(4, s) for s in SIZES]), source="x")])
    f = exact["fits"][0]
    assert f["alpha_s"] == pytest.approx(ALPHA, rel=1e-9) and f["beta_Bps"] == pytest.approx(BETA, rel=1e-9)
    p = f["points"][-1]
    assert p["bytes"] == SIZES[-1] and p["model_s"] == pytest.approx(ring(4, SIZES[-1]), rel=1e-9)


def test_fit_statistic_and_size_range(tmp_path):
    times = [ring(2, s) for s in SIZES]
    f2 = write(tmp_path / "a.json", bench_doc(2, 1, 2, times))
    doc = cf.fit_files([cf.load_bench(f2)], statistic="min_s", min_bytes=1024, max_bytes=1 << 20)
    f = doc["fits"][0]
    assert f["n_points"] == len([s for s in SIZES if 1024 <= s <= 1 << 20])
    # min_s = 0.9 T: both alpha and 1/beta scale by 0.9
    assert f["alpha_s"] == pytest.approx(0.9 * ALPHA, rel=1e-6)
    assert f["beta_Bps"] == pytest.approx(BETA / 0.9, rel=1e-6)
    # absolute weighting on exact data is exact too
    g = cf.fit_files([cf.load_bench(f2)], weighting="absolute")["fits"][0]
    assert g["alpha_s"] == pytest.approx(ALPHA, rel=1e-6)


def test_negative_alpha_is_reported_not_hidden(tmp_path):
    # large messages well described by S/beta, small ones faster than any positive latency allows:
    # the straight line through them crosses zero below S = 0
    times = [max(1e-7, 2 * 0.5 * s / BETA - 5e-5) for s in SIZES]
    f = write(tmp_path / "neg.json", bench_doc(2, 1, 2, times))
    out = tmp_path / "fit.json"
    r = run([sys.executable, FIT_TOOL, "--weighting", "absolute", "--out", out, f])
    doc = json.loads(out.read_text())
    fit = doc["fits"][0]
    assert fit["alpha_s"] < 0, fit["alpha_s"]  # written as fitted, not clamped
    assert fit["valid"] is False and "alpha is negative" in fit["problems"][0]
    assert "INVALID" in r.stderr and "not physically meaningful" in r.stderr
    # times that fall with the size: beta is flagged
    down = write(tmp_path / "down.json", bench_doc(2, 1, 2, [1e-3 - 1e-12 * s for s in SIZES]))
    bad = cf.fit_files([cf.load_bench(down)])["fits"][0]
    assert not bad["valid"] and any("beta" in p for p in bad["problems"])


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(correct=False), "wrong sums"),
    (lambda d: d.update(world_size=1), "world_size 1"),
    (lambda d: d.update(results=d["results"][:1]), "two sizes"),
    (lambda d: d["results"][3].update(median_s=-1), "median_s"),
    (lambda d: d.pop("nodes"), "'nodes'"),
])
def test_fit_bad_input(tmp_path, mutate, message):
    d = bench_doc(2, 1, 2, [ring(2, s) for s in SIZES])
    mutate(d)
    f = write(tmp_path / "bad.json", d)
    r = run([sys.executable, FIT_TOOL, f], check=False)
    assert r.returncode == 1 and message in r.stderr, r.stderr


def test_select_fit():
    doc = {"fits": [{"label": "2x1", "world_size": 2, "nodes": 2, "ranks_per_node": 1},
                    {"label": "1x2", "world_size": 2, "nodes": 1, "ranks_per_node": 2}],
           "joint": {"label": "joint"}}
    assert cf.select_fit(doc, 2, 1, 2)[0]["label"] == "1x2"
    assert cf.select_fit(doc, 2, 2, 1)[0]["label"] == "2x1"
    assert cf.select_fit(doc, 2, 4, 1)[0]["label"] == "2x1"  # same p, other placement
    assert cf.select_fit(doc, 8, 4, 2)[0]["label"] == "joint"
    assert cf.select_fit({"fits": [], "joint": None}, 8, 4, 2)[0] is None


# ------------------------------------------------------------------------- report with the fit

PARAMS, SEQ = 1_000_000, 16
S_BYTES = 4 * PARAMS


def summary(nodes, rpn, batch, step, comm, overlap, min_step=None, data=0.0):
    ws = nodes * rpn
    tps = batch * SEQ * ws
    return {"world_size": ws, "nodes": nodes, "ranks_per_node": rpn, "backend": "cpu",
            "device": "cpu: Test", "model_type": "gpt2", "n_layer": 2, "n_embd": 64,
            "parameters": PARAMS, "batch_size_per_rank": batch, "grad_accum": 1, "seq_len": SEQ,
            "tokens_per_step": tps, "timed_steps": 10, "step_time_s": step,
            "compute_s": step - comm - data, "comm_s": comm,
            "comm_s_min_step": comm if min_step is None else min_step, "comm_overlap": overlap,
            "data_s": data, "tokens_per_s": tps / step, "mfu": None, "completed": True}


def fit_doc(tmp_path, alpha=ALPHA, beta=BETA):
    f2 = write(tmp_path / "b2.json", bench_doc(2, 2, 1, [ring(2, s, alpha, beta) for s in SIZES]))
    f4 = write(tmp_path / "b4.json", bench_doc(4, 2, 2, [ring(4, s, alpha, beta) for s in SIZES]))
    out = tmp_path / "fit.json"
    run([sys.executable, FIT_TOOL, "--out", out, f2, f4])
    return out


def sweep(root: Path, runs):
    for s in runs:
        d = root / f"nodes_{s['nodes']}x{s['ranks_per_node']}"
        d.mkdir(parents=True)
        write(d / "summary.json", s)
    return root


def test_report_with_fit_strong(tmp_path):
    fit = fit_doc(tmp_path)
    t1 = 0.400
    c2, c4 = ring(2, S_BYTES), ring(4, S_BYTES)
    runs = [summary(1, 1, 8, t1, 0.0, False),
            summary(2, 1, 4, 0.215, 0.012, False, min_step=0.010),                # blocking
            summary(2, 2, 2, 0.260, 0.020, True, min_step=0.25 * c4)]             # overlapped
    out = tmp_path / "rep"
    r = run([sys.executable, REPORT, "--comm-fit", fit, "--cores", "2", "--out", out,
             sweep(tmp_path / "sw", runs)])
    assert "Measured vs modelled" in r.stdout
    rows = list(csv.DictReader(open(out / "fit_model.csv")))
    assert [int(x["world_size"]) for x in rows] == [1, 2, 4]
    r1, r2, r4 = rows
    assert float(r1["allreduce_model_s"]) == 0 and float(r1["efficiency_model"]) == pytest.approx(1.0)
    # 2 ranks, blocking: c from the 2x1 fit, f = 0
    assert r2["fit_label"] == "2x1" and r2["comm_overlap"] == "false"
    assert float(r2["allreduce_model_s"]) == pytest.approx(c2, rel=1e-6)
    assert float(r2["overlap_fraction"]) == 0
    tc2 = t1 / 2
    assert float(r2["efficiency_model"]) == pytest.approx(tc2 / (tc2 + c2), rel=1e-6)
    assert float(r2["efficiency_measured"]) == pytest.approx(t1 / (2 * 0.215), rel=1e-9)
    # 4 ranks, overlapped, exposed = 1/4 of the model: f = 0.75
    assert r4["fit_label"] == "2x2" and r4["comm_overlap"] == "true"
    assert float(r4["overlap_fraction"]) == pytest.approx(0.75, rel=1e-6)
    tc4 = t1 / 4
    assert float(r4["efficiency_model_no_overlap"]) == pytest.approx(tc4 / (tc4 + c4), rel=1e-6)
    assert float(r4["efficiency_model"]) == pytest.approx(tc4 / (tc4 + 0.25 * c4), rel=1e-6)
    # --cores 2: 4 ranks compute twice as slowly
    assert float(r4["efficiency_model_cores"]) == pytest.approx(tc4 / (2 * tc4 + 0.25 * c4), rel=1e-6)
    assert float(r4["compute_ratio"]) == pytest.approx((0.260 - 0.020) / tc4, rel=1e-6)
    md = (out / "scaling.md").read_text()
    assert "## Measured vs modelled efficiency" in md and "alpha = 20 us, beta = 2 GB/s" in md
    assert "model, overlap f, 2 cores" in md and "INVALID" not in md
    # the model table uses the measured fit, up to 16 ranks by default (strong: 8 sequences)
    model = list(csv.DictReader(open(out / "model.csv")))
    assert [int(x["p"]) for x in model] == [1, 2, 4, 8]
    assert float(model[1]["allreduce_s"]) == pytest.approx(c2, rel=1e-6)


def test_report_with_fit_weak_and_invalid_fit(tmp_path):
    fit = fit_doc(tmp_path)
    doc = json.loads(fit.read_text())
    doc["fits"][1].update(alpha_s=-1e-6, valid=False, problems=["alpha is negative (-1e-06 s)"])
    write(fit, doc)
    runs = [summary(1, 1, 4, 0.2, 0.0, False), summary(2, 1, 4, 0.21, 0.01, True),
            summary(2, 2, 4, 0.45, 0.05, True)]
    out = tmp_path / "rep"
    r = run([sys.executable, REPORT, "--comm-fit", fit, "--out", out, sweep(tmp_path / "sw", runs)])
    assert "weak scaling" in r.stdout
    assert "INVALID" in r.stderr
    md = (out / "scaling.md").read_text()
    assert "INVALID" in md and "alpha is negative" in md
    rows = list(csv.DictReader(open(out / "fit_model.csv")))
    assert rows[2]["fit_valid"] == "false" and rows[1]["fit_valid"] == "true"
    # weak: t_c the same at every p; measured efficiency = per-rank throughput ratio
    assert float(rows[2]["t_compute_s"]) == pytest.approx(0.2)
    assert float(rows[2]["efficiency_measured"]) == pytest.approx(0.2 / 0.45, rel=1e-9)
    assert rows[2]["efficiency_model_cores"] == ""  # no --cores


def test_report_without_fit_unchanged(tmp_path):
    runs = [summary(1, 1, 4, 0.2, 0.0, False), summary(2, 1, 4, 0.21, 0.01, True)]
    out = tmp_path / "rep"
    run([sys.executable, REPORT, "--out", out, sweep(tmp_path / "sw", runs)])
    assert not (out / "fit_model.csv").exists()
    md = (out / "scaling.md").read_text()
    assert "Measured vs modelled" not in md and "efficiency (hierarchical)" in md
    model = list(csv.DictReader(open(out / "model.csv")))
    assert int(model[-1]["p"]) == 1024  # the GPU-cluster model's default range


def test_report_fit_errors(tmp_path):
    runs = sweep(tmp_path / "sw", [summary(1, 1, 4, 0.2, 0.0, False), summary(2, 1, 4, 0.21, 0.01, False)])
    r = run([sys.executable, REPORT, "--cores", "2", "--out", tmp_path / "o", runs], check=False)
    assert r.returncode != 0 and "--cores needs --comm-fit" in r.stderr
    bad = write(tmp_path / "bad.json", {"tool": "something else"})
    r = run([sys.executable, REPORT, "--comm-fit", bad, "--out", tmp_path / "o", runs], check=False)
    assert r.returncode == 1 and "not a comm_fit file" in r.stderr


# ---------------------------------------------------------------------------- sweep (dry run)

def test_sweep_sizes_and_global_batch_dry_run(tmp_path):
    r = run(["bash", SWEEP, "--dry-run", "--sizes", "1x1 2x1 2x2", "--global-batch", "8", "--serial",
             "--sbatch", "--exclusive", "--out", tmp_path / "sw", "my.ini", "--train.steps=3"])
    lines = [l for l in r.stdout.splitlines() if "dry-run" in l]
    assert len(lines) == 3
    for line, (n, rpn, bs) in zip(lines, [(1, 1, 8), (2, 1, 4), (2, 2, 2)]):
        assert line.startswith(f"nodes={n} ranks_per_node={rpn} dry-run:")
        assert f"--nodes={n} " in line and f"--ntasks-per-node={rpn} " in line
        assert f"--train.batch_size={bs} " in line and f"nodes_{n}x{rpn} " not in line
        assert line.endswith(f"--output.dir={tmp_path}/sw/nodes_{n}x{rpn}")
        assert "--exclusive" in line
    assert "--dependency" not in lines[0] and "--dependency=afterany:" in lines[1]
    # weak (no --global-batch): no batch size added; the old node-count form is unchanged
    r = run(["bash", SWEEP, "--dry-run", "--max-nodes", "2", "--ntasks-per-node", "2", "--out",
             tmp_path / "w", "my.ini"])
    assert "--train.batch_size" not in r.stdout and "nodes=2 dry-run:" in r.stdout
    assert f"--output.dir={tmp_path}/w/nodes_2" in r.stdout and "--job-name=nlptrain-sweep-n2" in r.stdout


@pytest.mark.parametrize("args, message", [
    (["--sizes", "1x1 2x3", "--global-batch", "8"], "not divisible by the 6 ranks"),
    (["--sizes", "1x1 2by2"], "is not NODESxRANKS_PER_NODE"),
    (["--sizes", "1x1", "--max-nodes", "2"], "replaces --max-nodes"),
    (["--sizes", "1x1 1x1"], "twice"),
    (["--sizes", "1x1", "--global-batch", "4", "--train.batch_size=2"], "do not pass --train.batch_size"),
    (["--max-nodes", "2", "--global-batch", "4"], "needs the ranks of every job"),
])
def test_sweep_bad_arguments(tmp_path, args, message):
    opts = [a for a in args if not a.startswith("--train.")]
    over = [a for a in args if a.startswith("--train.")]
    r = run(["bash", SWEEP, "--dry-run", "--out", tmp_path / "sw", *opts, "my.ini", *over], check=False)
    assert r.returncode == 1 and message in r.stderr, r.stderr


# ------------------------------------------------------------------- the benchmark under mpirun

def bench_binary():
    b = os.environ.get("NLPTRAIN_ALLREDUCE_BENCH")
    if b and Path(b).is_file():
        return Path(b)
    for cand in (SOURCE / "build" / "allreduce_bench",):
        if cand.is_file():
            return cand
    return None


def test_allreduce_bench_and_fit(tmp_path):
    b = bench_binary()
    if b is None or shutil.which("mpirun") is None:
        pytest.skip("allreduce_bench (NLPTRAIN_ALLREDUCE_BENCH or build/allreduce_bench) or mpirun not found")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    out = tmp_path / "ar.json"
    r = run(["mpirun", "-np", "2", b, "--max-bytes", "64K", "--factor", "4", "--min-time", "0",
             "--min-reps", "3", "--warmup", "1", "--label", "t", "--out", out], env=env)
    assert "wrote" in r.stdout
    d = json.loads(out.read_text())
    assert d["world_size"] == 2 and d["correct"] is True and d["label"] == "t"
    assert [x["bytes"] for x in d["results"]] == [4 * 4 ** k for k in range(8)]  # 4 B .. 64 KiB
    assert all(x["reps"] >= 3 and 0 < x["min_s"] <= x["median_s"] <= x["max_s"] for x in d["results"])
    fit = cf.fit_files([cf.load_bench(out)])
    assert math.isfinite(fit["fits"][0]["alpha_s"])  # valid or not depends on the machine's noise
    r = run(["mpirun", "-np", "2", b, "--max-bytes", "2"], env=env, check=False)
    assert r.returncode != 0 and "--min-bytes <= --max-bytes" in r.stderr
    # the other gradient paths: MPI_Iallreduce, and ZeRO's reduce-scatter + all-gather on 3 ranks
    # (uneven ranges); each checks its sums
    outs = []
    for np_, extra in ((2, ["--nonblocking"]), (3, ["--collective", "reduce_scatter_allgather"]),
                       (3, ["--collective", "reduce_scatter_allgather", "--nonblocking"])):
        o = tmp_path / f"k{len(outs)}.json"
        run(["mpirun", "-np", str(np_), b, "--max-bytes", "4K", "--factor", "16", "--min-time", "0",
             "--min-reps", "2", *extra, "--out", o], env=env)
        d = json.loads(o.read_text())
        assert d["correct"] is True and d["world_size"] == np_
        outs.append(d)
    assert outs[0]["collective"] == "allreduce" and outs[0]["nonblocking"] is True
    assert "MPI_Iallreduce" in outs[0]["call"]
    assert outs[2]["collective"] == "reduce_scatter_allgather" and "MPI_Iallgatherv" in outs[2]["call"]
    # one fit per collective: mixing them is refused
    with pytest.raises(cf.FitError, match="different collectives"):
        cf.fit_files([cf.load_bench(out), cf.load_bench(tmp_path / "k0.json")])
    assert cf.fit_files([cf.load_bench(tmp_path / "k2.json")])["nonblocking"] is True


# --------------------------------------------------------------- the whole study, on real SLURM

def test_study_on_slurm(tmp_path):
    need = ["sbatch", "squeue", "scontrol", "sinfo", "srun", "mpirun", "rsync"]
    missing = [c for c in need if shutil.which(c) is None]
    missing += [c for c in ("slurmctld", "slurmd", "munged")
                if shutil.which(c) is None and not Path(f"/usr/sbin/{c}").exists()]
    if missing:
        pytest.skip(f"SLURM study smoke test: {', '.join(missing)} not installed "
                    "(tools/install_deps.sh installs slurmd slurmctld slurm-client munge)")
    binary = Path(os.environ.get("NLPTRAIN_BIN") or SOURCE / "build" / "nlptrain")
    b = bench_binary()
    if not binary.is_file() or b is None:
        pytest.skip("nlptrain or allreduce_bench not built")
    cl = tmp_path / "cluster"
    r = run(["bash", SOURCE / "tests" / "slurm" / "start_cluster.sh", cl], check=False)
    if r.returncode == 77:
        pytest.skip(f"SLURM cannot run on this machine: {r.stderr.strip()[-300:]}")
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        env = dict(os.environ, SLURM_CONF=str(cl / "etc" / "slurm.conf"), NLPTRAIN_BIN=str(binary),
                   ALLREDUCE_BENCH=str(b), WORK=str(tmp_path / "work"), RESULTS=str(tmp_path / "results"),
                   SIZES="1x1 2x1", MODES="weak", OVERLAP="true", ZERO="0", STEPS="3", LAYERS="1",
                   WIDTH="32", HEADS="2", SEQ="32", RANK_BATCH="2", BENCH_MAX_BYTES="4K",
                   BENCH_MIN_TIME="0", BENCH_MIN_REPS="3")
        env.pop("OMP_NUM_THREADS", None)
        r = run(["bash", STUDY], env=env, check=False)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        res = tmp_path / "results"
        assert (res / "study.md").is_file() and (res / "bench" / "fit_allreduce.json").is_file()
        # comm.overlap = true runs are modelled with the MPI_Iallreduce fit
        assert json.loads((res / "bench" / "fit_iallreduce.json").read_text())["nonblocking"] is True
        v = res / "weak-overlap_true-zero_0"
        rows = list(csv.DictReader(open(v / "fit_model.csv")))
        assert [(int(x["world_size"]), int(x["nodes"])) for x in rows] == [(1, 1), (2, 2)]
        s2 = json.loads((v / "nodes_2x1" / "summary.json").read_text())
        assert s2["world_size"] == 2 and s2["nodes"] == 2 and s2["comm_overlap"] is True
        assert "| weak-overlap_true-zero_0 | iallreduce | 2 | 2x1 |" in (res / "study.md").read_text()
        assert "nproc: " in (res / "machine.txt").read_text()
        assert "scaling_sweep.sh" in (res / "commands.txt").read_text()
    finally:
        run(["bash", SOURCE / "tests" / "slurm" / "stop_cluster.sh", cl], check=False)
