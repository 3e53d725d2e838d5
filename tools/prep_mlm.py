#!/usr/bin/env python3
"""Plain text -> nlptrain HDF5 rows for masked-LM training (task mlm; no masking here: nlptrain
masks dynamically at training time).

Input: one or more UTF-8 text files, one document per line (blank lines are skipped), or with
--tsv-column NAME the NAME column of TSV files with a header line (e.g. NSMC's `document`).
--limit N keeps the first N documents (over all inputs, in order).

Packing (greedy, in document order): each row is [CLS] doc [SEP] doc [SEP] ... [PAD]...: documents
are appended, each followed by [SEP], while they fit in T tokens; a document that does not fit in
the rest of the row starts a new row. A document longer than T-2 tokens is cut into pieces of
T-2 tokens, each starting a new row as [CLS] piece [SEP] (the last piece may be followed by more
documents). Documents that tokenize to nothing are skipped.

With --tokenizer PATH the documents are tokenized without special tokens and packed the same way
with the tokenizer's cls, sep, pad and mask tokens (all four needed).

Output: input_ids, attention_mask, token_type_ids [N,T] int32 (token_type_ids all 0; padding
[PAD] under attention_mask 0). No `labels` dataset. Attributes: see prep_common.py, task = mlm,
num_labels 0, num_documents, num_tokens (non-padding tokens, [CLS]/[SEP] included).
--split-eval splits by document, before packing.

Examples
  prep_mlm.py --vocab data/vocab/kcbert-base/vocab.txt --tsv-column document \\
      --input nsmc_from_raw_train.tsv --out mlm_train.h5 --split-eval 0.01 --eval-out mlm_eval.h5
"""
from __future__ import annotations

import os
import sys
from typing import List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prep_common as pc  # noqa: E402

PROG = "prep_mlm.py"


def parse_args(argv):
    p = pc.make_parser(PROG, __doc__)
    p.add_argument("--input", required=True, nargs="+", metavar="FILE", help="input text or TSV file(s)")
    p.add_argument("--tsv-column", metavar="NAME", help="read this column of TSV files with a header line")
    pc.add_common_args(p, 128, "documents", "documents")
    return p.parse_args(argv)


def read_documents(a) -> List[str]:
    docs: List[str] = []
    for path in a.input:
        if a.tsv_column:
            docs.extend(v[0] for _, v in pc.read_tsv(path, [a.tsv_column]) if v[0].strip())
        else:
            docs.extend(line for line in pc.read_lines(path) if line.strip())
        if a.limit is not None and len(docs) >= a.limit:
            return docs[:a.limit]
    return docs


class Packer:
    """Greedy packing of token lists into rows of at most T tokens."""

    def __init__(self, T: int, tok):
        self.T, self.tok = T, tok
        self.cur: List[int] = []
        self.rows: List[List[int]] = []
        self.split_docs = 0

    def add(self, ids: List[int]) -> None:
        T, tok = self.T, self.tok
        if not ids:
            return
        if self.cur and len(self.cur) + len(ids) + 1 <= T:
            self.cur += ids + [tok.sep_id]
            return
        self.flush()
        if len(ids) + 2 > T:
            self.split_docs += 1
            step = T - 2
            pieces = [ids[i:i + step] for i in range(0, len(ids), step)]
            for p in pieces[:-1]:
                self.rows.append([tok.cls_id, *p, tok.sep_id])
            ids = pieces[-1]
        self.cur = [tok.cls_id, *ids, tok.sep_id]

    def flush(self) -> None:
        if self.cur:
            self.rows.append(self.cur)
            self.cur = []

    def take(self) -> List[List[int]]:
        out, self.rows = self.rows, []
        return out


def main(argv=None):
    a = parse_args(argv)

    def body(outs):
        pc.check_common(a, a.input, min_seq_len=3)
        tok = pc.load_tokenizer(a, PROG)
        if tok.is_hub:
            missing = [n for n in ("cls", "sep", "mask") if getattr(tok, n + "_id") < 0]
            if missing:
                raise pc.DataError(f"tokenizer {tok.tok.description} has no {', '.join(n + '_token' for n in missing)}: "
                                   f"masked-LM rows need cls, sep and mask tokens")
        docs = read_documents(a)
        if not docs:
            raise pc.DataError("the inputs contain no documents: " + ", ".join(f"'{p}'" for p in a.input))
        T = a.max_seq_len
        for split, idx, path in pc.parts(a, len(docs)):
            w = outs.open(path)
            pk = Packer(T, tok)
            n_rows = n_tok = n_empty = 0

            def emit(rows):
                nonlocal n_rows, n_tok
                if rows:
                    w.append(**pc.row_arrays(rows, T, tok))
                    n_rows += len(rows)
                    n_tok += sum(len(r) for r in rows)

            for chunk in pc.batched(idx, 8192):
                for ids in tok.ids([docs[i] for i in chunk]):
                    n_empty += not ids
                    pk.add(ids)
                emit(pk.take())
            pk.flush()
            emit(pk.take())
            if n_rows == 0:
                raise pc.DataError(f"no tokens in the {split or 'output'} documents")
            at = pc.base_attrs(a, tok, "mlm", [], a.input)
            at.update(num_examples=n_rows, num_documents=len(idx) - n_empty, num_tokens=n_tok,
                      truncated=pk.split_docs)
            if split:
                at["split"] = split
            w.set_attrs(at)
            pc.say(a, f"{PROG}: wrote {path}: {len(idx) - n_empty} documents -> {n_rows} rows x {T}"
                      f"{' (' + split + ')' if split else ''}, {n_tok} tokens ({100.0 * n_tok / (n_rows * T):.1f}% "
                      f"of positions); {pk.split_docs} documents longer than a row were split across rows"
                      f"{f', {n_empty} empty documents skipped' if n_empty else ''}; lowercase "
                      f"{int(tok.lowercase)} ({tok.lowercase_reason})")

    return pc.run_main(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
