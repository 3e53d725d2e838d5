#!/usr/bin/env python3
"""Sentence-pair classification data (KorNLI/XNLI-style TSV) -> nlptrain HDF5 (task pair_cls).

Input: a TSV file with a header line naming the columns (KorNLI: sentence1<TAB>sentence2<TAB>
gold_label); the columns are found by name (--first-column, --second-column, --label-column).
Labels are names: entailment = 0, neutral = 1, contradiction = 2 (id2label). Any other label (e.g.
SNLI's '-') is an error naming the file and line. No quoting: a field is everything between tabs.
KorNLI's dev and test files are converted by one call each.

Output: input_ids, attention_mask, token_type_ids [N,T] int32 laid out as
[CLS] sentence1 [SEP] sentence2 [SEP] [PAD]..., token_type_ids 0 for [CLS], sentence1 and the first
[SEP], 1 for sentence2 and the final [SEP], 0 on padding; labels [N] int32. Pairs longer than T-3
tokens are truncated longest-first, exactly as the HF `tokenizers` library does (the shorter side
keeps min(len, (T-3)//2) tokens at least; counted in the summary). Attributes: see prep_common.py,
task = pair_cls.

Examples
  prep_pair_cls.py --vocab data/vocab/kcbert-base/vocab.txt --input xnli.dev.ko.tsv --out kornli_dev.h5
  prep_pair_cls.py --vocab data/vocab/kcbert-base/vocab.txt --input xnli.test.ko.tsv --out kornli_test.h5
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prep_common as pc  # noqa: E402

PROG = "prep_pair_cls.py"
LABELS = ["entailment", "neutral", "contradiction"]


def parse_args(argv):
    p = pc.make_parser(PROG, __doc__)
    p.add_argument("--input", required=True, metavar="FILE.tsv", help="input TSV file with a header line")
    p.add_argument("--first-column", default="sentence1", help="first sentence column (default sentence1)")
    p.add_argument("--second-column", default="sentence2", help="second sentence column (default sentence2)")
    p.add_argument("--label-column", default="gold_label", help="label column (default gold_label)")
    pc.add_common_args(p, 128, "examples")
    return p.parse_args(argv)


def read_examples(a):
    rows = pc.read_tsv(a.input, [a.first_column, a.second_column, a.label_column])
    if a.limit is not None:
        rows = rows[:a.limit]
    if not rows:
        raise pc.DataError(f"{a.input}: no examples after the header line")
    ids = {name: i for i, name in enumerate(LABELS)}
    first, second, labels = [], [], []
    for line, (s1, s2, lab) in rows:
        v = ids.get(lab.strip())
        if v is None:
            raise pc.DataError(f"{a.input}:{line}: unknown label '{lab}' (expected one of {', '.join(LABELS)})")
        first.append(s1)
        second.append(s2)
        labels.append(v)
    return first, second, labels


def main(argv=None):
    a = parse_args(argv)

    def body(outs):
        pc.check_common(a, [a.input], min_seq_len=3)
        tok = pc.load_tokenizer(a, PROG)
        first, second, labels = read_examples(a)
        T = a.max_seq_len
        for split, idx, path in pc.parts(a, len(first)):
            w = outs.open(path)
            n_trunc = 0
            for chunk in pc.batched(idx):
                ia = tok.ids([first[i] for i in chunk])
                ib = tok.ids([second[i] for i in chunk])
                rows, types = [], []
                for x, y in zip(ia, ib):
                    r, t, cut = pc.pair_row(x, y, T, tok)
                    rows.append(r)
                    types.append(t)
                    n_trunc += cut
                w.append(**pc.row_arrays(rows, T, tok, types), labels=[labels[i] for i in chunk])
            at = pc.base_attrs(a, tok, "pair_cls", LABELS, [a.input])
            at.update(num_examples=len(idx), truncated=n_trunc)
            if split:
                at["split"] = split
            w.set_attrs(at)
            counts = [sum(1 for i in idx if labels[i] == k) for k in range(len(LABELS))]
            pc.say(a, f"{PROG}: wrote {path}: {len(idx)} pairs x {T} tokens"
                      f"{' (' + split + ')' if split else ''}, labels "
                      + ", ".join(f"{n}={c}" for n, c in zip(LABELS, counts))
                      + f"; truncated {n_trunc}; lowercase {int(tok.lowercase)} ({tok.lowercase_reason})")

    return pc.run_main(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
