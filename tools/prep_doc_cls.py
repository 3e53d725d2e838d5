#!/usr/bin/env python3
"""Document classification data (NSMC-style TSV) -> nlptrain HDF5 (task doc_cls).

Input: a TSV file with a header line naming the columns (NSMC: id<TAB>document<TAB>label); the
text column (--text-column, default document) and the label column (--label-column, default label)
are found by name. Labels are integers 0 .. num_labels-1; --label-names gives their names, in id
order (default negative,positive: NSMC's 0 = negative, 1 = positive). Any other label value is an
error naming the file and line. No quoting: a field is everything between two tabs.
Separate train and test files are converted by one call each.

Output: input_ids, attention_mask, token_type_ids [N,T] int32 ([CLS] text [SEP], padded with [PAD];
token_type_ids all 0), labels [N] int32. Texts longer than T-2 tokens are cut at the end (counted in
the summary). Empty texts give [CLS] [SEP]. Attributes: see prep_common.py, task = doc_cls.

Examples
  prep_doc_cls.py --vocab data/vocab/kcbert-base/vocab.txt --input nsmc_from_raw_train.tsv --out nsmc_train.h5
  prep_doc_cls.py --vocab data/vocab/kcbert-base/vocab.txt --input nsmc_from_raw_test.tsv --out nsmc_test.h5
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prep_common as pc  # noqa: E402

PROG = "prep_doc_cls.py"


def parse_args(argv):
    p = pc.make_parser(PROG, __doc__)
    p.add_argument("--input", required=True, metavar="FILE.tsv", help="input TSV file with a header line")
    p.add_argument("--text-column", default="document", help="text column name (default document)")
    p.add_argument("--label-column", default="label", help="label column name (default label)")
    p.add_argument("--label-names", default="negative,positive",
                   help="comma-separated label names in id order (default negative,positive)")
    pc.add_common_args(p, 128, "examples")
    return p.parse_args(argv)


def read_examples(a, names):
    rows = pc.read_tsv(a.input, [a.text_column, a.label_column])
    if a.limit is not None:
        rows = rows[:a.limit]
    if not rows:
        raise pc.DataError(f"{a.input}: no examples after the header line")
    texts, labels = [], []
    allowed = {str(i): i for i in range(len(names))}
    for line, (text, lab) in rows:
        v = allowed.get(lab.strip())
        if v is None:
            raise pc.DataError(f"{a.input}:{line}: label '{lab}' is not one of "
                               f"{', '.join(allowed)} ({', '.join(names)})")
        texts.append(text)
        labels.append(v)
    return texts, labels


def main(argv=None):
    a = parse_args(argv)

    def body(outs):
        pc.check_common(a, [a.input])
        names = [x.strip() for x in a.label_names.split(",")]
        if len(names) < 2 or any(not x for x in names) or len(set(names)) != len(names):
            raise pc.DataError(f"--label-names '{a.label_names}': need at least two distinct, non-empty names")
        tok = pc.load_tokenizer(a, PROG)
        texts, labels = read_examples(a, names)
        T = a.max_seq_len
        for split, idx, path in pc.parts(a, len(texts)):
            w = outs.open(path)
            n_trunc = n_empty = 0
            for chunk in pc.batched(idx):
                rows = []
                for ids in tok.ids([texts[i] for i in chunk]):
                    row, cut = pc.single_row(ids, T, tok)
                    rows.append(row)
                    n_trunc += cut
                    n_empty += not ids
                w.append(**pc.row_arrays(rows, T, tok), labels=[labels[i] for i in chunk])
            at = pc.base_attrs(a, tok, "doc_cls", names, [a.input])
            at.update(num_examples=len(idx), truncated=n_trunc)
            if split:
                at["split"] = split
            w.set_attrs(at)
            counts = [sum(1 for i in idx if labels[i] == k) for k in range(len(names))]
            pc.say(a, f"{PROG}: wrote {path}: {len(idx)} examples x {T} tokens"
                      f"{' (' + split + ')' if split else ''}, labels "
                      + ", ".join(f"{n}={c}" for n, c in zip(names, counts))
                      + f"; truncated {n_trunc}, empty {n_empty}; lowercase {int(tok.lowercase)} ({tok.lowercase_reason})")

    return pc.run_main(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
