#!/usr/bin/env python3
"""Generate text from text prompts with a GPT-2 of any Hugging Face tokenizer, in one command.

    python3 tools/generate_text.py INI WEIGHTS PROMPTS [--out DIR] [--tokenizer PATH] [-- nlptrain overrides]

PROMPTS: a text file, one prompt per line (or a JSONL file of {"prompt": ...}). The three steps it runs:

  1. tools/encode_prompts.py --tokenizer TOK PROMPTS --out DIR/prompts.jsonl
     TOK: --tokenizer, else the tokenizer the model was trained with (the weights' tokenizer_files
     attribute, which nlptrain copies from the training data and hf_import.py from a Hub folder);
  2. mpirun -np 1 build/nlptrain INI --run.mode=generate --generate.tokenizer=ids
         --generate.prompts_file=DIR/prompts.jsonl --generate.prompt= --model.weights=WEIGHTS
         --output.dir=DIR [overrides]        (sampling keys from the INI's [generate] or the overrides)
  3. tools/decode_generated.py --tokenizer TOK DIR/generated.jsonl

DIR then holds generated.jsonl (ids), generated_text.jsonl and generated.txt (text), and the text is
printed. DIR defaults to generate/ beside WEIGHTS. The binary is $NLPTRAIN_BIN, else build/nlptrain.
On a cluster: sbatch jobscripts/generate.sh with the same arguments.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from job_common import ROOT, Fail, parser, split_overrides, nlptrain, read_ini, ini_value, run, tokenizer_of  # noqa: E402

PROG = "generate_text.py"


def main(argv=None) -> int:
    argv, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    p = parser(PROG, __doc__)
    p.add_argument("ini", help="the job's INI file (model.type = gpt2)")
    p.add_argument("weights", help="the model (best.h5, a checkpoint, or an imported Hub GPT-2)")
    p.add_argument("prompts", help="text file, one prompt per line (or JSONL with \"prompt\")")
    p.add_argument("--out", help="output folder (default: generate/ beside WEIGHTS)")
    p.add_argument("--tokenizer", help="tokenizer folder or file (default: the one the model was trained with)")
    a = p.parse_args(argv)
    try:
        ini = read_ini(a.ini)
        if ini_value(ini, "model", "type", "gpt2") != "gpt2":
            raise Fail(f"'{a.ini}' has model.type = {ini_value(ini, 'model', 'type')}: generation needs gpt2")
        weights = Path(a.weights)
        if not weights.is_file():
            raise Fail(f"weights '{weights}' not found")
        if not Path(a.prompts).is_file():
            raise Fail(f"prompts file '{a.prompts}' not found")
        tok = a.tokenizer or tokenizer_of(weights)
        out = Path(a.out) if a.out else weights.parent / "generate"
        out.mkdir(parents=True, exist_ok=True)
        tools = ROOT / "tools"
        run(PROG, [sys.executable, str(tools / "encode_prompts.py"), "--tokenizer", tok, a.prompts,
                   "--out", str(out / "prompts.jsonl")])
        run(PROG, nlptrain(1, [a.ini, "--run.mode=generate", "--generate.tokenizer=ids",
                               f"--generate.prompts_file={out / 'prompts.jsonl'}", "--generate.prompt=",
                               f"--model.weights={weights}", f"--output.dir={out}"] + overrides))
        run(PROG, [sys.executable, str(tools / "decode_generated.py"), "--tokenizer", tok,
                   str(out / "generated.jsonl")])
        text = out / "generated.txt"
        if text.is_file():
            print(text.read_text(encoding="utf-8"))
        print(f"{PROG}: wrote {out / 'generated_text.jsonl'} and {text}")
        return 0
    except Fail as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
