"""The messages a new user reads in the first hour, asserted as printed: a command-line key replacing
its alternative from the INI file, the warning for a warmup longer than the run, the memory plan's
batch advice, a missing data file named with its key once for 2 ranks without Open MPI's abort banner,
the pointer to config.ini instead of a configuration dump, unlabelled prediction without a loss, counts
as integers, the memory line of predict and generate, and summary.json's throughput fields agreeing
with the log's done line. Tiny models and datasets written here (QA from a slice of KorQuAD in the
shared corpora, skipped when absent)."""
import json
import re
import subprocess
import sys

import h5py
import numpy as np
import pytest

import nlp_run as nr

V = 64   # vocab_size of the tiny models
T = 16   # sequence length
N = 8    # examples per dataset

GPT = ["--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", f"--model.vocab_size={V}",
       f"--model.n_positions={T}", f"--data.seq_len={T}", "--run.threads=1", "--train.lr=1e-3"]


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "train.h5"
    nr.write_rows(path, np.random.default_rng(0).integers(0, V, size=(N, T)))
    return path


def ini(tmp_path, text):
    p = tmp_path / "job.ini"
    p.write_text(text)
    return p


def line_with(text, part):
    lines = [l for l in text.splitlines() if part in l]
    assert lines, f"no line with '{part}' in:\n{text}"
    return lines


def test_command_line_steps_replace_ini_epochs_with_one_line(tmp_path, data):
    job = ini(tmp_path, f"[data]\ntrain = {data}\n\n[train]\nepochs = 3\nbatch_size = 2\n")
    out = tmp_path / "out"
    p = nr.run([job] + GPT + ["--train.steps=2", f"--output.dir={out}"])
    expected = (f"train.steps = 2 (command line) replaces train.epochs = 3 (config file '{job}', line 5): "
                "the command line wins over the INI file")
    assert p.stdout.count(expected) == 1, p.stdout
    assert len(nr.metrics(out)[0]) == 2  # 2 steps, not 3 epochs of 4
    written = (out / "config.ini").read_text()
    assert "\nsteps = 2\n" in written and "\nepochs = 0\n" in written
    # both in the INI file: still an error naming both lines
    both = ini(tmp_path, f"[data]\ntrain = {data}\n\n[train]\nsteps = 2\nepochs = 3\n")
    p = nr.run([both] + GPT + [f"--output.dir={tmp_path / 'o2'}"], check=False)
    assert p.returncode != 0
    assert (f"train.epochs = 3 (config file '{both}', line 6) and train.steps = 2 (config file '{both}', line 5) "
            "are both set; give one of them") in p.stderr


def test_warmup_longer_than_the_run_warns(tmp_path, data):
    p = nr.run(GPT + [f"--data.train={data}", "--train.steps=3", "--train.warmup_steps=10",
                      "--train.batch_size=2", f"--output.dir={tmp_path / 'a'}"])
    [w] = line_with(p.stdout, "warning: train.warmup_steps")
    assert w == ("warning: train.warmup_steps = 10 (command line) >= train.steps = 3 (command line): the learning "
                 "rate rises linearly during all 3 steps and reaches 0.0003 (train.lr = 0.001 x 3/10) only at "
                 "the last step; the cosine schedule after the warmup never starts. Lower train.warmup_steps "
                 "below train.steps (HF's warmup_ratio 0.1 would be 0)")
    lrs = [r["lr"] for r in nr.metrics(tmp_path / "a")[0]]
    assert lrs == pytest.approx([1e-4, 2e-4, 3e-4], rel=1e-6)  # what the warning says
    # steps from train.epochs: 8 examples / batch 2 = 4 steps, known before training starts
    p = nr.run(GPT + [f"--data.train={data}", "--train.epochs=1", "--train.warmup_steps=4",
                      "--train.batch_size=2", f"--output.dir={tmp_path / 'b'}"])
    [w] = line_with(p.stdout, "warning: train.warmup_steps")
    assert "train.warmup_steps = 4 (command line) >= train.steps = 4 (from train.epochs)" in w
    assert "reaches 0.001 (train.lr) only at the last step" in w
    # below the steps: no warning
    p = nr.run(GPT + [f"--data.train={data}", "--train.steps=3", "--train.warmup_steps=2",
                      "--train.batch_size=2", f"--output.dir={tmp_path / 'c'}"])
    assert "warmup_steps" not in p.stdout


def memory_total(tmp_path, data, batch):
    out = tmp_path / f"plan{batch}"
    nr.run(GPT + [f"--data.train={data}", "--train.steps=2", f"--train.batch_size={batch}", f"--output.dir={out}"])
    return json.loads((out / "summary.json").read_text())["memory_plan"]["total_bytes"]


def test_memory_plan_suggests_the_same_global_batch(tmp_path, data):
    t8, t4 = memory_total(tmp_path, data, 8), memory_total(tmp_path, data, 4)
    assert t8 > t4
    t7 = t8 - (t8 - t4) / 4  # the plan grows linearly with the batch
    limit_gb = (t8 + t7) / 2 / 1e9
    p = nr.run(GPT + [f"--data.train={data}", "--train.steps=2", "--train.batch_size=8",
                      f"--run.memory_limit_gb={limit_gb:.9f}", f"--output.dir={tmp_path / 'x'}"], check=False)
    assert p.returncode != 0
    assert "the memory plan does not fit" in p.stderr
    m = re.search(r"train\.batch_size = (\d+) with train\.grad_accum = (\d+) fits: (\d+) x (\d+) = (\d+) sequences "
                  r"per rank and step \(now 8 x 1 = 8(, the same)?; train\.batch_size up to (\d+) fits\)", p.stderr)
    assert m, p.stderr
    b, a, product, largest = int(m[1]), int(m[2]), int(m[5]), int(m[7])
    assert product == b * a and abs(product - 8) <= 1 and b <= largest
    assert largest == 7, p.stderr
    assert (b, a) == (4, 2) and m[6]  # 8 sequences kept exactly


def test_missing_data_file_named_once_with_its_key_without_abort_banner(tmp_path):
    missing = tmp_path / "nope.h5"
    cmd = ["mpirun", "-np", "2", nr.binary()] + GPT + [f"--data.train={missing}", f"--output.dir={tmp_path / 'o'}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=nr.mpi_env())
    assert p.returncode != 0
    message = f"nlptrain: error: data.train = '{missing}' (command line): cannot open HDF5 file '{missing}': no such file"
    assert p.stderr.count(message) == 1, p.stderr
    assert p.stderr.count(str(missing)) == 2  # the one message, path twice; no other rank repeats it
    for banner in ("MPI_ABORT", "MPI_Abort", "ORTE_ERROR_LOG", "PRTE_ERROR_LOG"):
        assert banner not in p.stderr, p.stderr
    assert not (tmp_path / "o" / "log.txt").exists()
    # model.weights: named by its key too
    p = subprocess.run(["mpirun", "-np", "2", nr.binary()] + GPT +
                       [f"--data.train={missing}", f"--model.weights={tmp_path / 'w.h5'}"],
                       capture_output=True, text=True, timeout=60, env=nr.mpi_env())
    assert p.returncode != 0
    assert p.stderr.count(f"model.weights = '{tmp_path / 'w.h5'}' (command line): file not found") == 1, p.stderr
    assert "MPI_ABORT" not in p.stderr


def test_bad_value_in_data_named_once_with_its_key_without_abort_banner(tmp_path):
    bad = tmp_path / "bad.h5"
    ids = np.random.default_rng(0).integers(0, V, size=(N, T))
    ids[N - 1, 5] = V  # the last row: rank 1 checks it
    nr.write_rows(bad, ids)
    cmd = ["mpirun", "-np", "2", nr.binary()] + GPT + [f"--data.train={bad}", "--train.batch_size=2",
                                                       f"--output.dir={tmp_path / 'o'}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=nr.mpi_env())
    assert p.returncode != 0
    message = (f"nlptrain: error [rank 1 of 2]: data.train = '{bad}': file '{bad}': input_ids[row 7, pos 5] = {V} "
               f"is out of range for vocab_size {V}")
    assert p.stderr.count(message) == 1 and p.stderr.count("nlptrain: error") == 1, p.stderr
    for banner in ("MPI_ABORT", "MPI_Abort", "ORTE_ERROR_LOG", "PRTE_ERROR_LOG"):
        assert banner not in p.stderr, p.stderr
    assert "examples checked" not in p.stdout  # nothing claims the check passed
    assert not (tmp_path / "o" / "log.txt").exists()


def test_configuration_goes_to_config_ini_with_a_pointer(tmp_path, data):
    out = tmp_path / "out"
    p = nr.run(GPT + [f"--data.train={data}", "--train.steps=1", f"--output.dir={out}"])
    assert f"effective configuration written to {out}/config.ini" in p.stdout
    assert "[train]" not in p.stdout and "effective configuration:" not in p.stdout
    assert "[train]" in (out / "config.ini").read_text()
    assert len(p.stdout.splitlines()) < 30
    # the data check says what it does and how long it took
    assert f"data.train: reading and checking '{data}' ({N} examples of {T} tokens) ..." in p.stdout
    assert re.search(rf"data\.train: {N} examples checked in \d+\.\d s", p.stdout), p.stdout
    # run.verbose: the dump in the log as well
    p = nr.run(GPT + [f"--data.train={data}", "--train.steps=1", f"--output.dir={tmp_path / 'v'}",
                      "--run.verbose=true"])
    assert "effective configuration:" in p.stdout and "[train]" in p.stdout


def summary_and_done(tmp_path, data, ranks):
    out = tmp_path / f"s{ranks}"
    p = nr.run(GPT + [f"--data.train={data}", "--train.steps=4", "--train.batch_size=2", f"--output.dir={out}"],
               ranks=ranks)
    [done] = line_with(p.stdout, "done: ")
    return json.loads((out / "summary.json").read_text()), done


def test_summary_throughput_agrees_with_the_log(tmp_path, data):
    s, done = summary_and_done(tmp_path, data, 2)
    m = re.search(r"over the last (\d+) steps (\d+) padded tokens/s \(global batch at the file's length\), "
                  r"(\d+) computed tokens/s \(positions run\), (\d+) real tokens/s \(no padding\)", done)
    assert m, done
    assert int(m[1]) == s["timed_steps"] == 3
    for i, key in ((2, "padded_tokens_per_s"), (3, "computed_tokens_per_s"), (4, "real_tokens_per_s")):
        assert abs(int(m[i]) - s[key]) <= 1, (key, done, s[key])
    # padded = the global batch at the file's length over the mean step time; the old name stays
    assert s["padded_tokens_per_s"] == pytest.approx(s["tokens_per_step"] / s["step_time_s"], rel=1e-6)
    assert s["tokens_per_s"] == s["padded_tokens_per_s"]
    # full rows of a clm window: no padding, so the three agree
    assert s["computed_tokens_per_s"] == pytest.approx(s["padded_tokens_per_s"], rel=1e-6)
    assert s["real_tokens_per_s"] == pytest.approx(s["padded_tokens_per_s"], rel=1e-6)


def plan_weights_grads(stdout):
    m = re.search(r"memory plan per rank \(MiB\): weights ([\d.]+) \| gradients ([\d.]+) \| AdamW m\+v ([\d.]+)", stdout)
    assert m, stdout
    return float(m[1]), float(m[2]), float(m[3])


def test_generate_memory_line_counts_what_it_allocates(tmp_path, data):
    out = tmp_path / "g"
    p = nr.run(GPT + ["--run.mode=generate", "--generate.max_new_tokens=2", f"--output.dir={out}"])
    w, g, adamw = plan_weights_grads(p.stdout)
    assert adamw == 0
    m = re.search(r"memory per rank: weights\+grads \(no AdamW outside training\) ([\d.]+) MiB, "
                  rf"KV cache \(1 sequence, T={T}\) [\d.]+ MiB", p.stdout)
    assert m, p.stdout
    assert float(m[1]) == pytest.approx(w + g, abs=0.11)
    assert "weights+grads+AdamW" not in p.stdout
    assert f"| KV cache (1 sequence, T={T}) " in p.stdout  # the plan: the decoder, not train.batch_size x T
    # training: AdamW's m and v are counted
    p = nr.run(GPT + [f"--data.train={data}", "--train.steps=1", f"--output.dir={tmp_path / 't'}"])
    w, g, adamw = plan_weights_grads(p.stdout)
    m = re.search(r"memory per rank: weights\+grads\+AdamW ([\d.]+) MiB", p.stdout)
    assert m and adamw == pytest.approx(2 * w, abs=0.11)
    assert float(m[1]) == pytest.approx(w + g + adamw, abs=0.11)


DATA = nr.shared_data()
KORQUAD = DATA / "korquad" / "KorQuAD_v1.0_dev.json"
VOCAB = DATA / "vocab" / "kcbert-base" / "vocab.txt"
BERT = ["--model.type=bert", "--model.vocab_size=30000", "--model.hidden_size=32", "--model.num_hidden_layers=1",
        "--model.num_attention_heads=2", "--model.intermediate_size=64", "--model.max_position_embeddings=128",
        "--run.threads=1", "--run.task=qa", "--train.batch_size=4", "--run.mode=predict"]


def test_qa_predict_counts_questions_as_integers_and_unlabelled_has_no_loss(tmp_path):
    if not KORQUAD.exists() or not VOCAB.exists():
        pytest.skip(f"shared data absent: {KORQUAD} or {VOCAB} (NLPTRAIN_SHARED_DATA)")
    for name, extra in (("l", []), ("u", ["--no-labels"])):
        subprocess.run([sys.executable, str(nr.SOURCE_DIR / "tools" / "prep_qa.py"), "--vocab", str(VOCAB), "--quiet",
                        "--input", str(KORQUAD), "--limit", "20", "--max-seq-len", "128", "--doc-stride", "32",
                        "--out", str(tmp_path / f"{name}.h5")] + extra, check=True)
    with h5py.File(tmp_path / "l.h5") as f:
        questions = len(set(f["example_id"].asstr()[()]))
    p = nr.run(BERT + [f"--data.eval={tmp_path / 'l.h5'}", f"--output.dir={tmp_path / 'pl'}"], ranks=2)
    [line] = [l for l in p.stdout.splitlines() if l.startswith("predict | ")]
    assert f"| questions {questions} |" in line, line
    assert re.search(r"^predict \| loss [\d.]+ \|", line) and " loss terms" in line
    m = re.search(r"memory per rank: weights\+grads \(no AdamW outside training\) ([\d.]+) MiB", p.stdout)
    w, g, adamw = plan_weights_grads(p.stdout)
    assert m and adamw == 0 and float(m[1]) == pytest.approx(w + g, abs=0.11)
    p = nr.run(BERT + [f"--data.eval={tmp_path / 'u.h5'}", f"--output.dir={tmp_path / 'pu'}"], ranks=2)
    [line] = [l for l in p.stdout.splitlines() if l.startswith("predict | ")]
    assert line.startswith("predict | no labels: no loss | padding "), line
    assert "loss 0" not in line and "loss terms" not in line
