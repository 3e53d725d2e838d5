#!/usr/bin/env python3
"""Decode the token ids of nlptrain's generated.jsonl into text with any tokenizer.

Input: OUT_DIR/generated.jsonl as nlptrain writes it with generate.tokenizer = ids, one JSON object
per prompt:
    {"prompt": ..., "prompt_ids": [...], "sample_ids": [[...], ...], "settings": {...}}
("prompt" and "samples" may be absent). A sample is the continuation of its prompt; when a sample's
ids start with the prompt's ids they are taken as prompt + continuation. The text of a sample is the
decoding of prompt_ids + continuation ids together (so that a character split across the boundary
decodes whole), special tokens skipped unless --keep-special-tokens. When a record or its settings
carry a vocab_sha256 that differs from the tokenizer's, that is an error (wrong tokenizer).

Output (each written to a temporary file and renamed into place), in --out (a folder; default the
input's folder):
  generated_text.jsonl  one {"prompt": text, "samples": [text, ...]} per input line (prompt: the
                        record's "prompt" if present, else the decoded prompt_ids; samples: prompt
                        + continuation);
  generated.txt         the same for reading: each prompt, then each sample under a header.

Examples
  decode_generated.py --tokenizer models/ko-gpt2 run/generated.jsonl
  decode_generated.py --tokenizer models/ko-gpt2 run/generated.jsonl --out decoded/
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

PROG = "decode_generated.py"


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", metavar="GENERATED.jsonl", help="nlptrain's generated.jsonl")
    p.add_argument("--tokenizer", required=True, metavar="byte|gpt2|PATH",
                   help="byte, gpt2 (with --vocab-dir) or a Hugging Face tokenizer folder/file")
    p.add_argument("--vocab-dir", help="folder with encoder.json and vocab.bpe (gpt2)")
    p.add_argument("--out", metavar="DIR", help="output folder (default: the input's folder)")
    p.add_argument("--keep-special-tokens", action="store_true", help="keep special tokens in the text")
    return p.parse_args(argv)


def _ids(v, where):
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise nd.DataError(f"{where}: expected a list of integer token ids")
    return v


def decode_records(path: str, tok, skip_special: bool):
    if not os.path.isfile(path):
        raise nd.DataError(f"input file '{path}' not found")
    out = []
    for n, line in enumerate(nd.read_text_lines(path), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise nd.DataError(f"{where}: not valid JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise nd.DataError(f"{where}: expected a JSON object")
        settings = rec.get("settings") if isinstance(rec.get("settings"), dict) else {}
        for sha in (rec.get("vocab_sha256"), settings.get("vocab_sha256")):
            if isinstance(sha, str) and sha != tok.vocab_sha256:
                raise nd.DataError(f"{where}: vocab_sha256 {sha} differs from the tokenizer's {tok.vocab_sha256} "
                                   f"({tok.description}): decode with the tokenizer the model was trained with")
        p_ids = _ids(rec.get("prompt_ids", []), f"{where} prompt_ids")
        if "sample_ids" not in rec:
            raise nd.DataError(f"{where}: no \"sample_ids\" (run nlptrain with generate.tokenizer = ids)")
        samples = rec["sample_ids"]
        if not isinstance(samples, list):
            raise nd.DataError(f"{where}: \"sample_ids\" is not a list of id lists")
        try:
            prompt = rec["prompt"] if isinstance(rec.get("prompt"), str) else tok.decode(p_ids, skip_special)
            texts = []
            for k, s in enumerate(samples):
                s = _ids(s, f"{where} sample_ids[{k}]")
                full = s if p_ids and s[:len(p_ids)] == p_ids else p_ids + s
                texts.append(tok.decode(full, skip_special))
        except nd.DataError as e:
            raise nd.DataError(f"{where}: {e}") from None
        out.append({"prompt": prompt, "samples": texts})
    if not out:
        raise nd.DataError(f"input file '{path}' holds no records")
    return out


def readable(records) -> str:
    parts = []
    for i, r in enumerate(records, start=1):
        parts.append(f"=== prompt {i} ===\n{r['prompt']}\n")
        for k, s in enumerate(r["samples"], start=1):
            parts.append(f"--- sample {k} ---\n{s}\n")
    return "".join(parts)


def write_atomic(path: str, text: str):
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        old = os.umask(0)
        os.umask(old)
        os.chmod(tmp, 0o666 & ~old)
        return tmp
    except BaseException:
        os.remove(tmp)
        raise


def main(argv=None):
    a = parse_args(argv)
    temps = []
    try:
        if a.vocab_dir and a.tokenizer != "gpt2":
            raise nd.DataError(f"--vocab-dir applies to --tokenizer gpt2 only (got --tokenizer {a.tokenizer})")
        tok = ht.load(a.tokenizer, a.vocab_dir)
        records = decode_records(a.input, tok, not a.keep_special_tokens)
        out_dir = a.out or os.path.dirname(os.path.abspath(a.input))
        if not os.path.isdir(out_dir):
            raise nd.DataError(f"output folder '{out_dir}' does not exist")
        jl = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        files = [(os.path.join(out_dir, "generated_text.jsonl"), jl), (os.path.join(out_dir, "generated.txt"), readable(records))]
        for final, text in files:
            temps.append((write_atomic(final, text), final))
        for tmp, final in temps:
            os.replace(tmp, final)
        temps = []
        print(f"{PROG}: wrote {files[0][0]} and {files[1][0]}: {len(records)} prompts", file=sys.stderr)
        return 0
    except (nd.DataError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    finally:
        for tmp, _ in temps:
            try:
                os.remove(tmp)
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main())
