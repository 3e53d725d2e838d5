#!/usr/bin/env python3
"""Document classification data (NSMC-style TSV) -> nlptrain HDF5 (task doc_cls).

Input: a TSV file with a header line naming the columns (NSMC: id<TAB>document<TAB>label), or a file
as the Hugging Face Hub ships datasets (.parquet, .jsonl/.json JSON Lines, .csv; ids FILE:ROW, rows
from 0; integer labels as they are); the
text column (--text-column, default document) and the label column (--label-column, default label)
are found by name. Labels are integers 0 .. num_labels-1; --label-names gives their names, in id
order (default negative,positive: NSMC's 0 = negative, 1 = positive). Any other label value is an
error naming the file and line. No quoting: a field is everything between two tabs.
Separate train and test files are converted by one call each. The example id is the --id-column
column (default id) when the header has it, else FILE:LINE.
--no-labels: the label column is not needed and no `labels` dataset is written (nor num_labels /
id2label unless --label-names is given). --input-format lines: a plain text file, one document per
line (blank lines skipped, ids FILE:LINE); implies --no-labels.

Output: input_ids, attention_mask, token_type_ids [N,T] int32 ([CLS] text [SEP], padded with [PAD];
token_type_ids all 0), labels [N] int32 (labelled input), example_id [N] and text [N] (UTF-8 strings).
Texts longer than T-2 tokens are cut at the end (counted in the summary). Empty texts give
[CLS] [SEP]. With --tokenizer PATH the row is what tokenizer(text, truncation=True,
max_length=T, padding="max_length") gives (HF run_glue). Attributes: see prep_common.py, task = doc_cls.

Examples
  prep_doc_cls.py --vocab data/vocab/kcbert-base/vocab.txt --input nsmc_from_raw_train.tsv --out nsmc_train.h5
  prep_doc_cls.py --vocab data/vocab/kcbert-base/vocab.txt --input nsmc_from_raw_test.tsv --out nsmc_test.h5
  prep_doc_cls.py --tokenizer models/kcbert-base --input reviews.txt --input-format lines --out predict.h5
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prep_common as pc  # noqa: E402

PROG = "prep_doc_cls.py"


def parse_args(argv):
    p = pc.make_parser(PROG, __doc__)
    p.add_argument("--input", required=True, metavar="FILE", help="input TSV file with a header line (or text file)")
    p.add_argument("--input-format", choices=["tsv", "lines"], default="tsv",
                   help="tsv (default) or lines: one document per line, no header (implies --no-labels)")
    p.add_argument("--text-column", default="document", help="text column name (default document)")
    p.add_argument("--label-column", default="label", help="label column name (default label)")
    p.add_argument("--id-column", default="id", help="example id column, used when present (default id)")
    p.add_argument("--label-names",
                   help="comma-separated label names in id order (default negative,positive; with "
                        "--no-labels only written when given)")
    pc.add_label_args(p, "the label column is")
    pc.add_common_args(p, 128, "examples")
    return p.parse_args(argv)


def read_examples(a, names):
    """(example ids, texts, labels or None)."""
    base = os.path.basename(a.input)
    read = pc.read_table if pc.is_table(a.input) else pc.read_tsv  # the Hub's parquet/JSON Lines/CSV files
    if a.input_format == "lines":
        rows = [(n, [t, None, None]) for n, (t,) in pc.read_plain_lines(a.input, 1)]
    elif a.no_labels:
        rows = [(n, [t, None, i]) for n, (t, i) in read(a.input, [a.text_column], [a.id_column])]
    else:
        rows = read(a.input, [a.text_column, a.label_column], [a.id_column])
    if a.limit is not None:
        rows = rows[:a.limit]
    if not rows:
        raise pc.DataError(f"{a.input}: no examples" + ("" if a.input_format == "lines" else " after the header line"))
    ids, texts, labels = [], [], []
    allowed = {str(i): i for i in range(len(names or []))}
    for line, (text, lab, eid) in rows:
        if not a.no_labels:
            v = allowed.get(lab.strip())
            if v is None:
                raise pc.DataError(f"{a.input}:{line}: label '{lab}' is not one of "
                                   f"{', '.join(allowed)} ({', '.join(names)})")
            labels.append(v)
        texts.append(text)
        ids.append(eid if eid is not None else f"{base}:{line}")
    return ids, texts, (None if a.no_labels else labels)


def main(argv=None):
    a = parse_args(argv)

    def body(outs):
        pc.check_common(a, [a.input])
        if a.input_format == "lines":
            a.no_labels = True
        names = pc.parse_label_names(a.label_names)
        if names is None and not a.no_labels:
            names = ["negative", "positive"]
        tok = pc.load_tokenizer(a, PROG)
        try:
            ex_ids, texts, labels = read_examples(a, names)
        except pc.DataError as e:
            raise pc.task_mismatch(a.input, "doc_cls", e) from None
        T = a.max_seq_len
        for split, idx, path in pc.parts(a, len(texts)):
            w = outs.open(path)
            n_trunc = n_empty = 0
            for chunk in pc.batched(idx):
                group = [texts[i] for i in chunk]
                if tok.is_hub:
                    encs = tok.encode(group, T)
                    n_trunc += sum(1 for e in encs if e.overflowing)
                    n_empty += sum(1 for t in group if not t.strip())
                    arrays = pc.pad_encodings(encs, T, tok.pad_id, tok.single_segment)
                else:
                    rows = []
                    for ids in tok.ids(group):
                        row, cut = pc.single_row(ids, T, tok)
                        rows.append(row)
                        n_trunc += cut
                        n_empty += not ids
                    arrays = pc.row_arrays(rows, T, tok)
                if labels is not None:
                    arrays["labels"] = [labels[i] for i in chunk]
                w.append(**arrays, example_id=[ex_ids[i] for i in chunk], text=group)
            at = pc.base_attrs(a, tok, "doc_cls", names, [a.input])
            at.update(num_examples=len(idx), truncated=n_trunc)
            if split:
                at["split"] = split
            w.set_attrs(at)
            counts = ("no labels" if labels is None else "labels " + ", ".join(
                f"{n}={sum(1 for i in idx if labels[i] == k)}" for k, n in enumerate(names)))
            pc.say(a, f"{PROG}: wrote {path}: {len(idx)} examples x {T} tokens"
                      f"{' (' + split + ')' if split else ''}, " + counts
                      + f"; truncated {n_trunc}, empty {n_empty}; lowercase {int(tok.lowercase)} ({tok.lowercase_reason})")

    return pc.run_main(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
