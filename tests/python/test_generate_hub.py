"""run.mode = generate with a Hugging Face GPT-2 folder (weights + vocab.json + merges.txt, as on the
Hub): the tokenizer is taken from the model's folder, prompts come from generate.prompts_file, and
greedy generation gives the same token ids as transformers' own generate() on the same weights."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import nlp_run as nr

VOCAB = nr.shared_data() / "vocab" / "gpt2"
PROMPTS = ["Hello, my dog is cute", "The quick brown fox", "  spaces\tand\nnewlines: 123 ünïcödé"]
NEW = 10

pytestmark = pytest.mark.skipif(
    not (VOCAB / "encoder.json").is_file() or not (VOCAB / "vocab.bpe").is_file(),
    reason=f"GPT-2 vocabulary not found in {VOCAB} (NLPTRAIN_SHARED_DATA): NLPTRAIN_ALL_SKIPPED")


@pytest.fixture(scope="module")
def hub_dir(tmp_path_factory):
    """A random GPT2LMHeadModel saved with save_pretrained, plus the real GPT-2 vocabulary under the
    Hub's file names, imported into nlptrain's layout beside it (model.h5)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    d = tmp_path_factory.mktemp("gpt2-hub")
    torch.manual_seed(0)
    # initializer_range 0.2: logits far enough apart that fp32 summation order cannot flip an argmax.
    cfg = GPT2Config(vocab_size=50257, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                     initializer_range=0.2)
    model = GPT2LMHeadModel(cfg).eval()
    model.save_pretrained(d)
    shutil.copy(VOCAB / "encoder.json", d / "vocab.json")
    shutil.copy(VOCAB / "vocab.bpe", d / "merges.txt")
    subprocess.run([sys.executable, str(nr.SOURCE_DIR / "tools" / "hf_import.py"), str(d), str(d / "model.h5")],
                   check=True, capture_output=True, text=True)
    return d


@pytest.fixture(scope="module")
def hf_reference(hub_dir):
    """Token ids of the prompts and of transformers' greedy continuations."""
    import torch
    from transformers import GPT2LMHeadModel, GPT2TokenizerFast
    tok = GPT2TokenizerFast.from_pretrained(hub_dir)  # reads vocab.json and merges.txt there
    assert len(tok) == 50257 and tok.eos_token_id == 50256
    model = GPT2LMHeadModel.from_pretrained(hub_dir).eval()
    out = []
    for p in PROMPTS:
        ids = tok(p)["input_ids"]
        with torch.no_grad():
            g = model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False,
                               pad_token_id=tok.eos_token_id)
        new = g[0, len(ids):].tolist()
        out.append((ids, new, tok.decode(new)))
    # Not a degenerate model: the continuations differ between prompts and within one.
    assert len({tuple(n) for _, n, _ in out}) == len(PROMPTS) and len(set(out[0][1])) > 1
    return out


def write_prompts(path, prompts):
    path.write_text("".join(json.dumps({"prompt": p, "id": str(i)}) + "\n" + ("\n" if i == 0 else "")
                            for i, p in enumerate(prompts)), encoding="utf-8")


def test_greedy_matches_transformers_with_tokenizer_from_model_folder(hub_dir, hf_reference, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, PROMPTS)  # includes a blank line (skipped) and an extra "id" field
    out = tmp_path / "out"
    p = nr.run([f"--model.weights={hub_dir / 'model.h5'}", "--run.mode=generate", "--generate.tokenizer=gpt2",
                f"--generate.prompts_file={prompts}", "--generate.top_k=1",
                f"--generate.max_new_tokens={NEW}", f"--output.dir={out}", "--run.threads=1"])
    log = p.stdout + p.stderr
    assert f"'{hub_dir / 'vocab.json'}'" in log and f"'{hub_dir / 'merges.txt'}'" in log, log[-3000:]
    lines = (out / "generated.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(PROMPTS)
    assert not (out / "generated.txt").exists()
    for line, prompt, (ids, new, text) in zip(lines, PROMPTS, hf_reference):
        rec = json.loads(line)
        assert rec["prompt"] == prompt
        assert rec["prompt_ids"] == ids
        assert rec["sample_ids"] == [new], (prompt, rec["sample_ids"], new)
        assert rec["samples"] == [text]
        assert rec["settings"] == {"max_new_tokens": NEW, "temperature": 1, "top_k": 1, "top_p": 1,
                                   "seed": 42, "num_samples": 1, "tokenizer": "gpt2"}


def test_ini_prompt_and_several_samples(hub_dir, hf_reference, tmp_path):
    """A prompt from the INI also gives one JSON line (and generated.txt), with num_samples samples."""
    out = tmp_path / "out"
    ini = tmp_path / "gen.ini"
    ini.write_text(f"[run]\nmode = generate\nthreads = 1\n[model]\nweights = {hub_dir / 'model.h5'}\n"
                   f"[generate]\ntokenizer = gpt2\nprompt = \"{PROMPTS[0]}\"\ntop_k = 1\n"
                   f"max_new_tokens = {NEW}\nnum_samples = 2\n[output]\ndir = {out}\n")
    nr.run([ini])
    lines = (out / "generated.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1
    rec = json.loads(lines[0])
    ids, new, text = hf_reference[0]
    assert rec["prompt"] == PROMPTS[0] and rec["sample_ids"] == [new, new]
    assert (out / "generated.txt").read_text(encoding="utf-8").startswith(PROMPTS[0] + text)


def test_explicit_vocab_dir_wins(hub_dir, tmp_path):
    """A model folder whose vocab.json is broken: without generate.vocab_dir the run fails naming that
    file; with generate.vocab_dir it uses (and logs) the files there instead."""
    d = tmp_path / "model"
    d.mkdir()
    shutil.copy(hub_dir / "model.h5", d / "model.h5")
    (d / "vocab.json").write_text("{not json")
    shutil.copy(hub_dir / "merges.txt", d / "merges.txt")
    base = [f"--model.weights={d / 'model.h5'}", "--run.mode=generate", "--generate.tokenizer=gpt2",
            "--generate.max_new_tokens=3", "--run.threads=1", f"--output.dir={tmp_path / 'out'}"]
    p = nr.run(base, check=False)
    assert p.returncode != 0 and str(d / "vocab.json") in p.stderr + p.stdout
    p = nr.run(base + [f"--generate.vocab_dir={VOCAB}"])
    log = p.stdout + p.stderr
    assert f"'{VOCAB / 'encoder.json'}'" in log and f"'{VOCAB / 'vocab.bpe'}'" in log
    assert str(d / "vocab.json") not in log


@pytest.mark.parametrize("ranks", [1, 2])
def test_no_tokenizer_files_is_an_error_on_every_rank(hub_dir, tmp_path, ranks):
    d = tmp_path / "bare"
    d.mkdir()
    shutil.copy(hub_dir / "model.h5", d / "model.h5")
    p = nr.run([f"--model.weights={d / 'model.h5'}", "--run.mode=generate", "--generate.tokenizer=gpt2",
                f"--output.dir={tmp_path / 'out'}"], ranks=ranks, check=False)
    err = p.stdout + p.stderr
    assert p.returncode != 0
    assert "generate.vocab_dir" in err and f"'{d}'" in err and "vocab.json" in err


def test_prompts_file_errors(hub_dir, tmp_path):
    base = [f"--model.weights={hub_dir / 'model.h5'}", "--run.mode=generate", "--generate.tokenizer=gpt2",
            "--run.threads=1", f"--output.dir={tmp_path / 'out'}", "--generate.max_new_tokens=2"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"text": "b"}\n')
    p = nr.run(base + [f"--generate.prompts_file={bad}"], check=False)
    assert p.returncode != 0 and f"'{bad}' line 2" in p.stderr and '"prompt"' in p.stderr
    bad.write_text('{"prompt": "a"}\n\n{"prompt": 3}\n')
    p = nr.run(base + [f"--generate.prompts_file={bad}"], check=False)
    assert p.returncode != 0 and f"'{bad}' line 3" in p.stderr
    bad.write_text("\n")
    p = nr.run(base + [f"--generate.prompts_file={bad}"], check=False)
    assert p.returncode != 0 and "no prompts" in p.stderr
    missing = tmp_path / "missing.jsonl"
    p = nr.run(base + [f"--generate.prompts_file={missing}"], check=False)
    assert p.returncode != 0 and str(missing) in p.stderr and "generate.prompts_file" in p.stderr
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "a"}\n')
    p = nr.run(base + [f"--generate.prompts_file={good}", "--generate.prompt=b"], check=False)
    assert p.returncode != 0 and "generate.prompt" in p.stderr and "generate.prompts_file" in p.stderr
