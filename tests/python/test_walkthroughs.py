"""The README's job walkthroughs, run as written at a tiny size, so that the documentation cannot drift
from the program (issue 21).

Every ```sh block after a `<!-- walkthrough: NAME -->` marker in README.md is read from the README
itself and its commands are run in order, in one scratch folder holding `build/`, `tools/`, `inputs/`,
`jobscripts/` (links to the checkout), `data/` (the shared corpora) and the files a user brings
(`my_reviews.txt`, `my_pairs.txt`, `prompts.txt`). What changes, and only this:

- `hf download NAME --local-dir DIR` (no network here) makes DIR as the Hub would have it,
  from a tiny random model saved by transformers: BERT with the kcbert-base vocabulary (vocab.txt and
  tokenizer.json), a RoBERTa (klue/roberta-base's layout: one token type, a WordPiece tokenizer) and an
  ELECTRA discriminator (ElectraForPreTraining, embedding_size != hidden_size) with the same
  vocabulary, GPT-2 with the GPT-2 BPE, and a Korean GPT-2 folder with only config.json,
  model.safetensors and tokenizer.json (a byte-fallback BPE trained here on NSMC text);
- `hf download --repo-type dataset Salesforce/wikitext [--include GLOB] --local-dir DIR` makes the Hub's
  parquet layout (DIR/wikitext-2-raw-v1/{train,validation,test}-00000-of-00001.parquet with a `text`
  column, one row per line with its "\n" and an empty row before each heading, as the Hub's files have;
  wikitext-2-v1 beside it from the tokenised files unless --include leaves it out; README.md;
  .cache/huggingface/) from the shared WikiText-2, whose only raw split is the test split: the three
  splits are slices of it;
- nlptrain runs get tiny overrides (steps, batch, threads; a small shape for GPT-2 small from scratch);
- `bash tools/prep_task_data.sh` gets PREP_LIMIT (the first examples of each corpus);
- `sbatch ... jobscripts/X.sh INI ARGS` (job 7) runs the same INI and arguments on 2 CPU ranks.

Then the outputs each walkthrough promises are checked. Skipped, saying so, without ../shared/data.
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import nlp_run as nr

DATA = nr.shared_data()
README = nr.SOURCE_DIR / "README.md"
NEEDED = ["nsmc/nsmc_from_raw_train.tsv", "nsmc/nsmc_from_raw_test.tsv", "kornli/xnli.test.ko.tsv",
          "kornli/xnli.dev.ko.tsv", "klue-ner/klue-ner-v1.1_dev.tsv", "korquad/KorQuAD_v1.0_dev.json",
          "wikitext2/wiki.test.raw", "wikitext2/wiki.test.tokens.txt", "vocab/kcbert-base/vocab.txt",
          "vocab/gpt2/encoder.json"]


def walkthroughs():
    """{name: [command, ...]} from README.md: continuation lines joined, comments and blanks dropped."""
    text = README.read_text(encoding="utf-8")
    out = {}
    for m in re.finditer(r"<!-- walkthrough: (\w+) -->\s*```sh\n(.*?)```", text, re.S):
        body = m.group(2).replace("\\\n", " ")
        out[m.group(1)] = [l.strip() for l in body.splitlines() if l.strip() and not l.strip().startswith("#")]
    return out


# ---- the Hub folders a user would download ---------------------------------------------------------

def hub_bert(folder):
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast
    import torch
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30000, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=300)
    BertForMaskedLM(cfg).save_pretrained(folder)
    vocab = DATA / "vocab" / "kcbert-base" / "vocab.txt"
    tok = BertTokenizerFast(vocab=str(vocab), do_lower_case=False, model_max_length=300)
    assert len(tok) == 30000  # (transformers 5 ignores vocab_file=: a 5-token tokenizer)
    tok.save_pretrained(folder)
    shutil.copy(vocab, Path(folder) / "vocab.txt")  # the Hub folder has both


def kcbert_tokenizer(folder, max_len=300):
    from transformers import BertTokenizerFast
    vocab = DATA / "vocab" / "kcbert-base" / "vocab.txt"
    tok = BertTokenizerFast(vocab=str(vocab), do_lower_case=False, model_max_length=max_len)
    assert len(tok) == 30000
    tok.save_pretrained(folder)
    shutil.copy(vocab, Path(folder) / "vocab.txt")
    return tok


def hub_roberta(folder):
    """klue/roberta-base's layout: RobertaForMaskedLM, type_vocab_size 1, a BertTokenizer's files
    (whose pair encoding gives type 1), pad_token_id the tokenizer's [PAD]."""
    from transformers import RobertaConfig, RobertaForMaskedLM
    import torch
    torch.manual_seed(0)
    tok = kcbert_tokenizer(folder)
    cfg = RobertaConfig(vocab_size=30000, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=300 + tok.pad_token_id + 1,
                        type_vocab_size=1, pad_token_id=tok.pad_token_id, layer_norm_eps=1e-5,
                        bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
    RobertaForMaskedLM(cfg).save_pretrained(folder)


def hub_electra(folder):
    """beomi/KcELECTRA-base's layout (ElectraForPreTraining, a BertTokenizer), with embedding_size 16
    != hidden_size 32 (embeddings_project, as the small ELECTRAs)."""
    from transformers import ElectraConfig, ElectraForPreTraining
    import torch
    torch.manual_seed(0)
    tok = kcbert_tokenizer(folder)
    cfg = ElectraConfig(vocab_size=30000, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=300,
                        pad_token_id=tok.pad_token_id)
    ElectraForPreTraining(cfg).save_pretrained(folder)


def hub_gpt2(folder):
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast
    import torch
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=128)).save_pretrained(folder)
    vocab = json.loads((DATA / "vocab" / "gpt2" / "encoder.json").read_text(encoding="utf-8"))
    merges = [tuple(l.split(" ")) for l in
              (DATA / "vocab" / "gpt2" / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:] if l]
    tok = GPT2TokenizerFast(vocab=vocab, merges=merges)
    assert len(tok) == 50257
    tok.save_pretrained(folder)


def hub_korean_gpt2(folder):
    """config.json, model.safetensors and tokenizer.json only (as skt/kogpt2-base-v2's folder is used)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
    import torch
    lines = (DATA / "nsmc" / "nsmc_from_raw_train.tsv").read_text(encoding="utf-8").splitlines()[1:3000]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    specials = ["</s>", "<unk>", "<pad>"] + [f"<0x{b:02X}>" for b in range(256)]
    tok.train_from_iterator((l.split("\t")[1] for l in lines), trainers.BpeTrainer(vocab_size=800, special_tokens=specials))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", bos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>")
    assert len(fast) == tok.get_vocab_size() > 300
    fast.save_pretrained(folder)
    for extra in ("vocab.json", "merges.txt", "special_tokens_map.json"):
        (Path(folder) / extra).unlink(missing_ok=True)
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(fast), n_layer=1, n_head=2, n_embd=32, n_positions=128,
                               bos_token_id=fast.eos_token_id, eos_token_id=fast.eos_token_id)).save_pretrained(folder)


HUB = {"beomi/kcbert-base": hub_bert, "gpt2": hub_gpt2, "skt/kogpt2-base-v2": hub_korean_gpt2,
       "klue/roberta-base": hub_roberta, "beomi/KcELECTRA-base": hub_electra}


def hub_rows(lines):
    """Lines of a WikiText file as the Hub's parquet rows: each with its "\n", "" before a heading."""
    rows = []
    for ln in lines:
        if not ln.strip():
            continue
        if ln.lstrip().startswith("= ") and rows:
            rows.append("")
        rows.append(ln + "\n")
    return rows


def hub_wikitext(folder, include=None):
    """Salesforce/wikitext's layout, two of its configurations (those `include` matches), from the shared
    WikiText-2 files."""
    import fnmatch
    import pyarrow as pa
    import pyarrow.parquet as pq
    raw = (DATA / "wikitext2" / "wiki.test.raw").read_text(encoding="utf-8").replace("\r\n", "\n").split("\n")
    tokens = (DATA / "wikitext2" / "wiki.test.tokens.txt").read_text(encoding="utf-8").split("\n")
    for config, lines in (("wikitext-2-raw-v1", raw), ("wikitext-2-v1", tokens)):
        rows = hub_rows(lines[:500])
        for split, part in (("train", rows[:330]), ("validation", rows[330:440]), ("test", rows[440:])):
            name = f"{config}/{split}-00000-of-00001.parquet"
            if include is None or fnmatch.fnmatch(name, include):
                (folder / config).mkdir(exist_ok=True)
                pq.write_table(pa.table({"text": part}), folder / name)
    (folder / "README.md").write_text("---\nconfigs:\n- config_name: wikitext-2-raw-v1\n---\n", encoding="utf-8")
    (folder / ".cache" / "huggingface").mkdir(parents=True)
    (folder / ".cache" / "huggingface" / ".gitignore").write_text("*\n", encoding="utf-8")


HUB_DATASETS = {"Salesforce/wikitext": hub_wikitext}


def hf_download(args, work):
    """`hf download [--repo-type dataset] [--include GLOB] NAME --local-dir DIR`: DIR as the Hub would fill it."""
    rest, opts = args[2:], {}
    names = []
    while rest:
        a = rest.pop(0)
        if a.startswith("--"):
            opts[a] = rest.pop(0)
        else:
            names.append(a)
    assert len(names) == 1 and set(opts) <= {"--local-dir", "--repo-type", "--include"}, args
    folder = work / opts["--local-dir"]
    folder.mkdir(parents=True, exist_ok=True)
    if opts.get("--repo-type") == "dataset":
        HUB_DATASETS[names[0]](folder, opts.get("--include"))
    else:
        assert "--include" not in opts, args
        HUB[names[0]](folder)


# ---- the scratch folder ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def work(tmp_path_factory):
    missing = [p for p in NEEDED if not (DATA / p).exists()]
    if missing:
        pytest.skip(f"shared data absent: {DATA / missing[0]} (NLPTRAIN_SHARED_DATA)")
    w = tmp_path_factory.mktemp("walk")
    (w / "build").mkdir()
    (w / "build" / "nlptrain").symlink_to(nr.binary())
    for d in ("tools", "inputs", "jobscripts"):
        (w / d).symlink_to(nr.SOURCE_DIR / d)
    (w / "data").mkdir()
    for d in ("nsmc", "kornli", "klue-ner", "korquad", "wikitext2"):
        (w / "data" / d).symlink_to(DATA / d)
    test = (DATA / "nsmc" / "nsmc_from_raw_test.tsv").read_text(encoding="utf-8").splitlines()[1:21]
    (w / "my_reviews.txt").write_text("".join(l.split("\t")[1] + "\n" for l in test), encoding="utf-8")
    nli = (DATA / "kornli" / "xnli.dev.ko.tsv").read_text(encoding="utf-8").splitlines()[1:21]
    (w / "my_pairs.txt").write_text("".join("\t".join(l.split("\t")[:2]) + "\n" for l in nli), encoding="utf-8")
    (w / "prompts.txt").write_text("이 영화 정말\n배우들의 연기가\n", encoding="utf-8")
    (w / "models").mkdir()
    return w


# ---- running a command as the walkthrough has it, at a tiny size --------------------------------------

def ini_of(args):
    return next((a for a in args if a.endswith(".ini")), None)


def tiny(args, work):
    """Overrides that keep an nlptrain run tiny; the walkthrough's own arguments stay."""
    text = (work / ini_of(args)).read_text() if ini_of(args) else ""
    joined = " ".join(args)
    extra = ["--run.threads=1", "--run.log_interval=1", "--eval.batches=2"]
    mode = re.search(r"--run\.mode=(\w+)", joined)
    if mode and mode.group(1) == "generate":
        return extra + ["--generate.max_new_tokens=4", "--generate.num_samples=1"]
    if mode:
        return extra
    extra += ["--eval.interval=0", "--train.batch_size=2"]
    extra += ["--train.epochs=0.0001"] if re.search(r"^epochs\s*=", text, re.M) else ["--train.steps=2"]
    if re.search(r"^task\s*=\s*clm", text, re.M):
        extra += ["--data.seq_len=32"]
        if "--model.weights" not in joined and not re.search(r"^weights\s*=", text, re.M):
            extra += ["--model.n_layer=1", "--model.n_head=2", "--model.n_embd=32"]  # GPT-2 small is 124M
    return extra


def run_line(line, work, report):
    args = shlex.split(line)
    env = nr.mpi_env(threads=1)
    if args[:2] == ["hf", "download"]:
        report(f"$ {line}  (a stand-in for the Hub's files)")
        hf_download(args, work)
        return
    if args[0] == "sbatch":
        script = next(i for i, a in enumerate(args) if a.startswith("jobscripts/"))
        assert (work / args[script]).exists(), args[script]
        rest = args[script + 1:]
        if args[script] == "jobscripts/generate.sh":  # runs as is outside SLURM
            args = ["bash", args[script]] + rest + ([] if "--" in rest else ["--"]) + [
                "--run.backend=cpu", "--run.threads=1", "--generate.max_new_tokens=4", "--generate.num_samples=1"]
        else:  # job 7 on 2 CPU ranks: the jobscript's INI and arguments. Its GPU and CPU lines are
            # alternatives writing one results dir: each starts afresh there, as a first sbatch would
            # into a folder of its own (a new run refuses another run's folder).
            args = ["mpirun", "-np", "2", "build/nlptrain"] + rest + ["--run.backend=cpu", "--train.precision=fp32",
                                                                      "--output.overwrite=true"]
    if "build/nlptrain" in args:
        args = args + tiny(args, work)
    if args[:2] == ["bash", "tools/prep_task_data.sh"]:
        env["PREP_LIMIT"] = "200"
    report(f"$ {' '.join(args)}")
    cmd = " ".join(shlex.quote(a) for a in args) if "|" not in line and ">" not in line and "&&" not in line else line
    p = subprocess.run(cmd, shell=True, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, f"{line}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"


ORDER = ["doc_cls", "pair_cls", "ner", "qa", "encoders", "clm", "gen", "zero"]


def test_readme_has_every_walkthrough():
    assert list(walkthroughs()) == ORDER


@pytest.mark.parametrize("name", ORDER)
def test_walkthrough(name, work, report):
    for line in walkthroughs()[name]:
        run_line(line, work, report)
    check = CHECKS.get(name)
    if check:
        check(work)


# ---- what each walkthrough promises ---------------------------------------------------------------

def jsonl(path):
    return [json.loads(l) for l in Path(path).read_text(encoding="utf-8").splitlines() if l.strip()]


def check_exported(folder, auto, source):
    """The export loads with AutoTokenizer and the AutoModel class, and its tokenizer is the source
    model folder's (the same ids for real text)."""
    from transformers import AutoTokenizer
    import transformers
    tok, ref = AutoTokenizer.from_pretrained(folder), AutoTokenizer.from_pretrained(source)
    model = getattr(transformers, auto).from_pretrained(folder)
    assert len(tok) == len(ref) <= model.config.vocab_size
    text = "이 영화 정말 재미있어요. The movie was great!"
    assert tok(text)["input_ids"] == ref(text)["input_ids"]


def same_as_exported(folder, rows, texts, pairs=None, T=128):
    """nlptrain's probabilities for the user's texts equal what transformers computes with the exported
    folder alone (its tokenizer, as run_glue calls it, and its model): tokenizer, weights and head
    travel together."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    import torch
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    enc = tok(texts, pairs, truncation=True, max_length=T, padding=True, return_tensors="pt")
    with torch.no_grad():
        probs = torch.softmax(model(**enc).logits.double(), dim=-1).numpy()
    labels = model.config.id2label
    for r in rows:
        p = probs[r["index"]]
        assert max(abs(a - b) for a, b in zip(r["probabilities"], p)) < 2e-5, (r, p)
        assert labels[int(p.argmax())] == r["label_name"]


def check_doc_cls(w):
    rows = jsonl(w / "runs/doc_cls_nsmc/predict/predictions.jsonl")
    reviews = (w / "my_reviews.txt").read_text(encoding="utf-8").splitlines()
    assert len(rows) == len(reviews)
    for r in rows:
        assert abs(sum(r["probabilities"]) - 1) < 1e-5 and r["label_name"] in ("negative", "positive")
        assert r["text"] == reviews[r["index"]]
    check_exported(w / "runs/doc_cls_nsmc/hf", "AutoModelForSequenceClassification", w / "models/kcbert-base")
    same_as_exported(w / "runs/doc_cls_nsmc/hf", rows, reviews)


def check_pair_cls(w):
    rows = jsonl(w / "runs/pair_cls_kornli/predict/predictions.jsonl")
    assert len(rows) == 20 and all(len(r["probabilities"]) == 3 for r in rows)
    check_exported(w / "runs/pair_cls_kornli/hf", "AutoModelForSequenceClassification", w / "models/kcbert-base")
    pairs = [l.split("\t") for l in (w / "my_pairs.txt").read_text(encoding="utf-8").splitlines()]
    same_as_exported(w / "runs/pair_cls_kornli/hf", rows, [a for a, _ in pairs], [b for _, b in pairs])


def check_ner(w):
    rows = jsonl(w / "runs/ner_klue/predict/predictions.jsonl")
    assert rows and all("entities" in r for r in rows)
    check_exported(w / "runs/ner_klue/hf", "AutoModelForTokenClassification", w / "models/kcbert-base")


def check_qa(w):
    preds = json.loads((w / "runs/qa_korquad/predict/predictions.json").read_text(encoding="utf-8"))
    spans = jsonl(w / "runs/qa_korquad/predict/predictions.jsonl")
    assert preds and {s["id"] for s in spans} == set(preds)
    check_exported(w / "runs/qa_korquad/hf", "AutoModelForQuestionAnswering", w / "models/kcbert-base")


def check_encoders(w):
    """Each of jobs 1-4 ran with each encoder (the log names it), the data had RoBERTa's single token
    type, and the exports load with the task's class and the source folder's tokenizer."""
    import h5py
    for family in ("roberta", "electra"):
        for run in ("doc_cls_nsmc", "pair_cls_kornli", "ner_klue", "qa_korquad"):
            log = (w / f"runs/{run}_{family}/log.txt").read_text()
            assert f"model: {family}, 2 layers" in log, (run, family)
            assert (w / f"runs/{run}_{family}/best.h5").is_file()
    with h5py.File(w / "runs/doc_cls_nsmc_roberta/best.h5", "r") as f:
        assert f.attrs["model_type"] == "roberta" and "classifier.out_proj.weight" in f
    with h5py.File(w / "runs/data/kornli_train.h5", "r") as f:  # the last prep: ELECTRA's two types
        assert f["token_type_ids"][()].max() == 1
    check_exported(w / "runs/doc_cls_nsmc_roberta/hf", "AutoModelForSequenceClassification",
                   w / "models/klue-roberta-base")
    check_exported(w / "runs/ner_klue_electra/hf", "AutoModelForTokenClassification", w / "models/kcelectra-base")
    rows = jsonl(w / "runs/pair_cls_kornli_roberta/predict/predictions.jsonl")
    assert len(rows) == 20 and all(len(r["probabilities"]) == 3 for r in rows)
    with h5py.File(w / "runs/pair_cls_kornli_roberta/predict/input.h5", "r") as f:  # pairs, one token type
        assert f["token_type_ids"][()].max() == 0 and f.attrs["type_vocab_size"] == 1
    rows = jsonl(w / "runs/doc_cls_nsmc_electra/predict/predictions.jsonl")
    reviews = (w / "my_reviews.txt").read_text(encoding="utf-8").splitlines()
    same_as_exported(w / "runs/doc_cls_nsmc_electra/hf", rows, reviews)


def check_clm(w):
    import h5py
    for name, split in (("train", "train"), ("valid", "validation")):
        with h5py.File(w / f"runs/data/wikitext2_{name}.h5", "r") as f:  # the Hub's parquet file of the split
            assert f.attrs["source"] == str(w / f"datasets/wikitext/wikitext-2-raw-v1/{split}-00000-of-00001.parquet")
            assert f.attrs["text_column"] == "text" and f.attrs["num_tokens"] > 1000
    ev = nr.metrics(w / "runs/clm_wikitext2")[1][-1]
    assert ev["perplexity"] > 1
    check_exported(w / "runs/clm_wikitext2_ft/hf", "AutoModelForCausalLM", w / "models/gpt2")


def check_gen(w):
    prompts = (w / "prompts.txt").read_text(encoding="utf-8").splitlines()
    for out in ("runs/gen_nsmc/generate", "runs/gen_nsmc/generate_job"):
        rows = jsonl(w / out / "generated_text.jsonl")
        assert [r["prompt"] for r in rows] == prompts
        for r in rows:
            assert r["samples"] and all(s.startswith(r["prompt"]) for s in r["samples"])
        assert (w / out / "generated.txt").read_text(encoding="utf-8").count(prompts[0]) >= 1


def check_zero(w):
    # the job's lines write one results dir, each afresh: the last one, ZeRO-3, is the run left there
    log = (w / "runs/clm_zero_multinode/log.txt").read_text()
    assert "ZeRO-3" in log, log[-2000:]


CHECKS = {"doc_cls": check_doc_cls, "pair_cls": check_pair_cls, "ner": check_ner, "qa": check_qa,
          "encoders": check_encoders,
          "clm": check_clm, "gen": check_gen, "zero": check_zero}
