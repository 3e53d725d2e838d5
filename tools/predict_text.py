#!/usr/bin/env python3
"""Predict labels (or entities) for a plain text file with a fine-tuned model, in one command.

    python3 tools/predict_text.py INI WEIGHTS TEXT_FILE [--out DIR] [--np N] [-- nlptrain overrides]

TEXT_FILE: one document per line (doc_cls, ner: a sentence per line) or one tab-separated pair per line
(pair_cls). INI is the job's input file (its run.task, and its data.train for the label names and the
row length); WEIGHTS a model it trained (best.h5 or a checkpoint). The two steps it runs:

  1. tools/prep_<task>.py --tokenizer TOK --input-format lines --no-labels --input TEXT_FILE
         --max-seq-len T --out DIR/input.h5
     TOK: --tokenizer, else the tokenizer the model was trained with (the weights' tokenizer_files
     attribute, which nlptrain copies from the training data); T: --max-seq-len, else the training
     data's max_seq_len attribute, else 128;
  2. mpirun -np N build/nlptrain INI --run.mode=predict --model.weights=WEIGHTS
         --data.eval=DIR/input.h5 --output.dir=DIR [overrides]

and DIR/predictions.jsonl then has one line per input line (see README.md, run.mode = predict).
DIR defaults to predict/ beside WEIGHTS. The binary is $NLPTRAIN_BIN, else build/nlptrain.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from job_common import ROOT, Fail, parser, split_overrides, h5_attr, ini_value, nlptrain, read_ini, run, tokenizer_of  # noqa: E402

PROG = "predict_text.py"
TASKS = ("doc_cls", "pair_cls", "ner")


def main(argv=None) -> int:
    argv, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    p = parser(PROG, __doc__)
    p.add_argument("ini", help="the job's INI file")
    p.add_argument("weights", help="the fine-tuned model (best.h5 or a checkpoint)")
    p.add_argument("text", help="text file: one document (pair_cls: one tab-separated pair) per line")
    p.add_argument("--out", help="output folder (default: predict/ beside WEIGHTS)")
    p.add_argument("--np", type=int, default=1, help="MPI ranks (default 1)")
    p.add_argument("--tokenizer", help="tokenizer folder or file (default: the one the model was trained with)")
    p.add_argument("--max-seq-len", type=int, help="row length (default: the training data's)")
    a = p.parse_args(argv)
    try:
        ini = read_ini(Path(a.ini))
        task = ini_value(ini, "run", "task", "clm")
        if task not in TASKS:
            raise Fail(f"run.task = {task} in '{a.ini}': predict_text.py predicts {', '.join(TASKS)} "
                       f"(qa: tools/prep_qa.py --no-labels, then run.mode = predict)")
        weights = Path(a.weights)
        if not weights.is_file():
            raise Fail(f"weights '{weights}' not found")
        kind = h5_attr(weights, "model_type")
        if kind and kind not in ("bert", "roberta", "electra"):
            raise Fail(f"weights '{weights}' are a {kind} model (model_type = {kind}), and run.task = {task} "
                       f"('{a.ini}') needs a BERT: give a BERT fine-tuned for {task} (the job's best.h5); "
                       f"text from a {kind}: tools/generate_text.py")
        if not Path(a.text).is_file():
            raise Fail(f"text file '{a.text}' not found")
        tok = a.tokenizer or tokenizer_of(weights)
        T = a.max_seq_len
        train = ini_value(ini, "data", "train")
        if T is None and train and Path(train).is_file():
            T = h5_attr(train, "max_seq_len")
        T = int(T) if T else 128
        out = Path(a.out) if a.out else weights.parent / "predict"
        out.mkdir(parents=True, exist_ok=True)
        data = out / "input.h5"
        prep = [sys.executable, str(ROOT / "tools" / f"prep_{task}.py"), "--tokenizer", tok, "--input-format", "lines",
                "--no-labels", "--input", a.text, "--max-seq-len", str(T), "--out", str(data), "--quiet"]
        if h5_attr(weights, "type_vocab_size") == 1:  # RoBERTa: one token type, also for pairs
            prep.append("--single-segment")
        run(PROG, prep)
        run(PROG, nlptrain(a.np, [a.ini, "--run.mode=predict", f"--model.weights={weights}", f"--data.eval={data}",
                                  f"--output.dir={out}"] + overrides))
        print(f"{PROG}: wrote {out / 'predictions.jsonl'}")
        return 0
    except Fail as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
