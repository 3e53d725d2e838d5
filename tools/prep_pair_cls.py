#!/usr/bin/env python3
"""Sentence-pair classification data (KorNLI/XNLI-style TSV) -> nlptrain HDF5 (task pair_cls).

Input: a TSV file with a header line naming the columns (KorNLI: sentence1<TAB>sentence2<TAB>
gold_label), or a file as the Hugging Face Hub ships datasets (.parquet, .jsonl/.json JSON Lines, .csv;
ids FILE:ROW, rows from 0); the columns are found by name (--first-column, --second-column, --label-column;
KLUE NLI's Hub files: --first-column premise --second-column hypothesis).
Labels are names: entailment = 0, neutral = 1, contradiction = 2 (id2label); in a Hub file an integer
label is the id itself. Any other label (e.g.
SNLI's '-') is an error naming the file and line. No quoting: a field is everything between tabs.
KorNLI's dev and test files are converted by one call each. The example id is the --id-column column
(default id) when the header has it, else FILE:LINE.
--no-labels: the label column is not needed and no `labels` dataset is written (nor num_labels /
id2label unless --label-names is given). --input-format lines: a plain text file, one
tab-separated pair per line (blank lines skipped, ids FILE:LINE); implies --no-labels.

Output: input_ids, attention_mask, token_type_ids [N,T] int32 laid out as
[CLS] sentence1 [SEP] sentence2 [SEP] [PAD]..., token_type_ids 0 for [CLS], sentence1 and the first
[SEP], 1 for sentence2 and the final [SEP], 0 on padding; labels [N] int32. Pairs longer than T-3
tokens are truncated longest-first, exactly as the HF `tokenizers` library does (the shorter side
keeps min(len, (T-3)//2) tokens at least; counted in the summary). Also example_id, text and
text_pair [N] (UTF-8 strings). With --tokenizer PATH a row is what tokenizer(a, b, truncation=True,
max_length=T, padding="max_length") gives (HF run_glue). Attributes: see prep_common.py,
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
    p.add_argument("--input", required=True, metavar="FILE", help="input TSV file with a header line (or text file)")
    p.add_argument("--input-format", choices=["tsv", "lines"], default="tsv",
                   help="tsv (default) or lines: one tab-separated pair per line, no header (implies --no-labels)")
    p.add_argument("--first-column", default="sentence1", help="first sentence column (default sentence1)")
    p.add_argument("--second-column", default="sentence2", help="second sentence column (default sentence2)")
    p.add_argument("--label-column", default="gold_label", help="label column (default gold_label)")
    p.add_argument("--id-column", default="id", help="example id column, used when present (default id)")
    p.add_argument("--label-names",
                   help="comma-separated label names in id order, as they appear in the label column "
                        "(default entailment,neutral,contradiction; with --no-labels only written when given)")
    pc.add_label_args(p, "the label column is")
    pc.add_common_args(p, 128, "examples")
    return p.parse_args(argv)


def read_examples(a, names):
    """(example ids, first texts, second texts, labels or None)."""
    base = os.path.basename(a.input)
    table = pc.is_table(a.input)
    read = pc.read_table if table else pc.read_tsv  # the Hub's parquet/JSON Lines/CSV files
    if a.input_format == "lines":
        rows = [(n, [x, y, None, None]) for n, (x, y) in pc.read_plain_lines(a.input, 2)]
    elif a.no_labels:
        rows = [(n, [x, y, None, i]) for n, (x, y, i) in
                read(a.input, [a.first_column, a.second_column], [a.id_column])]
    else:
        rows = read(a.input, [a.first_column, a.second_column, a.label_column], [a.id_column])
    if a.limit is not None:
        rows = rows[:a.limit]
    if not rows:
        raise pc.DataError(f"{a.input}: no examples" + ("" if a.input_format == "lines" else " after the header line"))
    ids = {name: i for i, name in enumerate(names or [])}
    ex_ids, first, second, labels = [], [], [], []
    for line, (s1, s2, lab, eid) in rows:
        if not a.no_labels:
            v = ids.get(lab.strip())
            if v is None and table and lab.strip().isdigit() and int(lab) < len(names):
                v = int(lab)  # the Hub's integer class labels, in id order
            if v is None:
                raise pc.DataError(f"{a.input}:{line}: unknown label '{lab}' (expected one of {', '.join(names)})")
            labels.append(v)
        first.append(s1)
        second.append(s2)
        ex_ids.append(eid if eid is not None else f"{base}:{line}")
    return ex_ids, first, second, (None if a.no_labels else labels)


def main(argv=None):
    a = parse_args(argv)

    def body(outs):
        pc.check_common(a, [a.input], min_seq_len=3)
        if a.input_format == "lines":
            a.no_labels = True
        names = pc.parse_label_names(a.label_names)
        if names is None and not a.no_labels:
            names = LABELS
        tok = pc.load_tokenizer(a, PROG)
        try:
            ex_ids, first, second, labels = read_examples(a, names)
        except pc.DataError as e:
            raise pc.task_mismatch(a.input, "pair_cls", e) from None
        T = a.max_seq_len
        for split, idx, path in pc.parts(a, len(first)):
            w = outs.open(path)
            n_trunc = 0
            for chunk in pc.batched(idx):
                ta, tb = [first[i] for i in chunk], [second[i] for i in chunk]
                if tok.is_hub:
                    encs = tok.encode(list(zip(ta, tb)), T)
                    n_trunc += sum(1 for e in encs if e.overflowing)
                    arrays = pc.pad_encodings(encs, T, tok.pad_id, tok.single_segment)
                else:
                    rows, types = [], []
                    for x, y in zip(tok.ids(ta), tok.ids(tb)):
                        r, t, cut = pc.pair_row(x, y, T, tok)
                        rows.append(r)
                        types.append(t)
                        n_trunc += cut
                    arrays = pc.row_arrays(rows, T, tok, types)
                if labels is not None:
                    arrays["labels"] = [labels[i] for i in chunk]
                w.append(**arrays, example_id=[ex_ids[i] for i in chunk], text=ta, text_pair=tb)
            at = pc.base_attrs(a, tok, "pair_cls", names, [a.input])
            at.update(num_examples=len(idx), truncated=n_trunc)
            if split:
                at["split"] = split
            w.set_attrs(at)
            counts = ("no labels" if labels is None else "labels " + ", ".join(
                f"{n}={sum(1 for i in idx if labels[i] == k)}" for k, n in enumerate(names)))
            pc.say(a, f"{PROG}: wrote {path}: {len(idx)} pairs x {T} tokens"
                      f"{' (' + split + ')' if split else ''}, " + counts
                      + f"; truncated {n_trunc}; lowercase {int(tok.lowercase)} ({tok.lowercase_reason})")

    return pc.run_main(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
