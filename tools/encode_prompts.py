#!/usr/bin/env python3
"""Encode generation prompts with any tokenizer, for nlptrain's generation with token ids.

The nlptrain binary knows only its built-in byte and gpt2 tokenizers; with any other tokenizer it
takes prompts as ids (generate.tokenizer = ids) and writes ids back (see decode_generated.py).

Input: a text file, one prompt per line (line ending removed; blank lines skipped; CRLF read as
LF), or a JSONL file (name ending in .jsonl, or --format jsonl): one JSON object per line with a
string "prompt" (blank lines skipped).

Output (--out FILE.jsonl, written to a temporary file and renamed into place): one JSON object per
prompt, in input order:
    {"prompt": "<text>", "prompt_ids": [id, ...], "vocab_sha256": "<hex>", "eos_id": <id>}
prompt_ids are tokenizer(prompt) as transformers gives it, with the special tokens the tokenizer's
template puts BEFORE the text (e.g. a BOS); the ones it appends after the text (EOS, SEP) are
dropped, because generation continues the prompt. --no-special-tokens adds none. vocab_sha256 is
the tokenizer's vocabulary fingerprint (tools/hub_tokenizer.py), which nlptrain compares with the
weights' own; eos_id (when the tokenizer has an end-of-text token) ends a sample when generated.

Examples
  encode_prompts.py --tokenizer models/ko-gpt2 prompts.txt --out prompts.jsonl
  encode_prompts.py --tokenizer gpt2 --vocab-dir data/vocab/gpt2 prompts.jsonl --out ids.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hub_tokenizer as ht  # noqa: E402
import nlptrain_data as nd  # noqa: E402

PROG = "encode_prompts.py"


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", metavar="PROMPTS", help="text file (one prompt per line) or JSONL with \"prompt\"")
    p.add_argument("--tokenizer", required=True, metavar="byte|gpt2|PATH",
                   help="byte, gpt2 (with --vocab-dir) or a Hugging Face tokenizer folder/file")
    p.add_argument("--vocab-dir", help="folder with encoder.json and vocab.bpe (gpt2)")
    p.add_argument("--out", required=True, metavar="FILE.jsonl", help="output JSONL file")
    p.add_argument("--format", choices=["auto", "lines", "jsonl"], default="auto",
                   help="input format (default auto: jsonl for a .jsonl name, else lines)")
    p.add_argument("--no-special-tokens", action="store_true", help="add no special tokens to the prompts")
    return p.parse_args(argv)


def read_prompts(path: str, fmt: str):
    if fmt == "auto":
        fmt = "jsonl" if path.endswith(".jsonl") else "lines"
    if not os.path.isfile(path):
        raise nd.DataError(f"prompt file '{path}' not found")
    out = []
    for n, line in enumerate(nd.read_text_lines(path), start=1):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        if fmt == "lines":
            out.append(line)
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise nd.DataError(f"{path}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise nd.DataError(f"{path}:{n}: expected an object with a string \"prompt\"")
        out.append(obj["prompt"])
    if not out:
        raise nd.DataError(f"prompt file '{path}' holds no prompts")
    return out


def prompt_ids(tok, text: str, specials: bool):
    if tok.kind == "byte":
        return list(text.encode("utf-8"))
    if not specials or tok.kind == "gpt2":
        return tok.ids([text])[0]
    enc = tok.encode(text, add_special_tokens=True)
    ids, mask = list(enc.ids), list(enc.special_tokens_mask)
    while ids and mask[-1] == 1 and any(m == 0 for m in mask):  # the template's trailing EOS/SEP
        ids.pop()
        mask.pop()
    return ids


def main(argv=None):
    a = parse_args(argv)
    tmp = None
    try:
        if a.vocab_dir and a.tokenizer != "gpt2":
            raise nd.DataError(f"--vocab-dir applies to --tokenizer gpt2 only (got --tokenizer {a.tokenizer})")
        tok = ht.load(a.tokenizer, a.vocab_dir)
        prompts = read_prompts(a.input, a.format)
        d = os.path.dirname(os.path.abspath(a.out))
        if not os.path.isdir(d):
            raise nd.DataError(f"output folder '{d}' (for '{a.out}') does not exist")
        fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(a.out) + ".", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for p in prompts:
                rec = {"prompt": p, "prompt_ids": prompt_ids(tok, p, not a.no_special_tokens),
                       "vocab_sha256": tok.vocab_sha256}
                if tok.eos_id >= 0:
                    rec["eos_id"] = tok.eos_id
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        old = os.umask(0)
        os.umask(old)
        os.chmod(tmp, 0o666 & ~old)
        os.replace(tmp, a.out)
        tmp = None
        print(f"{PROG}: wrote {a.out}: {len(prompts)} prompts, tokenizer {tok.description}", file=sys.stderr)
        return 0
    except (nd.DataError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    finally:
        if tmp:
            try:
                os.remove(tmp)
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main())
