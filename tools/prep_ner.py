#!/usr/bin/env python3
"""Named entity recognition data (KLUE NER character-level TSV) -> nlptrain HDF5 (task ner).

Input (KLUE NER v1.1): one `char<TAB>tag` line per character of a sentence, a blank line between
sentences; a space of the sentence is a line holding one space character (tag O, or I-X inside an
entity such as "매주 일요일"). Lines starting with '##' are comments; the last comment line of the
form `## <sentence id><TAB><sentence with <entity:TYPE> markup>` (an id without spaces) before a
sentence gives its id (a sentence without one gets FILE:LINE). Tags: O, B-X, I-X for the 6 types X in
PS LC OG DT TI QT; anything else, or a character field that is not exactly one character, is an
error naming the file and line. The sentence text is the concatenation of its characters (checked
against the markup line: mismatches are counted in the summary).

--no-labels: the tag field may be absent (`char` alone on a line; a tag given is ignored); no
labels or entities datasets are written (nor num_labels / id2label unless --label-names is given).
--input-format lines: a plain text file, one sentence per line (blank lines skipped, ids
FILE:LINE); implies --no-labels.

With --tokenizer PATH the sentence is given to the tokenizer as its words, as HF run_ner.py does:
tokenizer(words, is_split_into_words=True, truncation=True, max_length=T, padding="max_length");
word_ids() and the labels (first sub-token of each word) come from that encoding; offsets are
turned into character offsets of the sentence.

Labelling (the Hugging Face token-classification convention)
  The text is tokenized with character offsets. A word is a maximal run of non-whitespace
  characters. The FIRST sub-token of each word carries the tag of the word's first character
  (its label id); the later sub-tokens of the word, [CLS], [SEP] and padding get -100 (ignored).
  First-character rule: a word such as "딸(32)과" (tags O O B-QT I-QT O O) is labelled by its
  first character only, so it is O and the entity "32" inside it cannot be predicted; likewise
  an entity that starts inside a word after an O character. Tags are copied unchanged: a word
  that starts inside an entity begun in an earlier word gets I-X.
  --label-all-subtokens instead labels EVERY sub-token with the tag of its first character
  (then only special and padding tokens get -100).
  Sentences longer than T-2 tokens are cut at the end (counted in the summary).

Turning predictions back into entities with character spans (decode_entities() below):
  read the tags at the labelled positions (labels != -100) in order; group them into entities the
  seqeval way (B-X starts one, I-X continues one of the same type, else starts one; O ends it);
  an entity runs from offset_mapping[first][0] to the end of the word of its last position
  (with --label-all-subtokens: to offset_mapping[last][1]).

Output
  input_ids, attention_mask, token_type_ids [N,T] int32 ([CLS] sentence [SEP], types 0);
  labels [N,T] int32 (id2label index, -100 = no label);
  offset_mapping [N,T,2] int32: character [start, end) of each token in `text`, -1 for
      [CLS]/[SEP]/padding; word_ids [N,T] int32: index of the token's word in the sentence, -1
      for special/padding tokens;
  text [N], example_id [N] (UTF-8 strings): the sentence and its id (always written);
  entities [N] (UTF-8 JSON strings): the gold entities as [[type, start, end], ...] char spans.
  id2label = O, B-PS, I-PS, B-LC, I-LC, B-OG, I-OG, B-DT, I-DT, B-TI, I-TI, B-QT, I-QT.
  Attributes: see prep_common.py, task = ner, label_all_subtokens (0/1).

Examples
  prep_ner.py --vocab data/vocab/kcbert-base/vocab.txt --input klue-ner-v1.1_dev.tsv \\
      --out ner_train.h5 --split-eval 0.2 --eval-out ner_eval.h5
"""
from __future__ import annotations

import json
import os
import re
import sys
from typing import List, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prep_common as pc  # noqa: E402

PROG = "prep_ner.py"
TYPES = ["PS", "LC", "OG", "DT", "TI", "QT"]
ID2LABEL = ["O"] + [f"{p}-{t}" for t in TYPES for p in ("B", "I")]
LABEL2ID = {l: i for i, l in enumerate(ID2LABEL)}
MARKUP = re.compile(r"<([^<>]*?):(" + "|".join(TYPES) + r")>")


class Sentence:
    __slots__ = ("sid", "chars", "tags", "line", "marked")

    def __init__(self, sid, line, marked):
        self.sid, self.line, self.marked = sid, line, marked
        self.chars: List[str] = []
        self.tags: List[str] = []

    @property
    def text(self) -> str:
        return "".join(self.chars)


def parse_lines(path: str) -> List[Sentence]:
    """--input-format lines: one unlabelled sentence per non-blank line."""
    base = os.path.basename(path)
    out = []
    for n, (line,) in pc.read_plain_lines(path, 1):
        s = Sentence(f"{base}:{n}", n, None)
        s.chars = list(line)
        s.tags = ["O"] * len(line)
        out.append(s)
    return out


def parse_klue_ner(path: str, no_labels: bool = False) -> List[Sentence]:
    lines = pc.read_lines(path)
    sents: List[Sentence] = []
    cur = None
    header = None  # (id, marked) of the last '##' line with a tab
    base = os.path.basename(path)
    for n, line in enumerate(lines, start=1):
        if line.startswith("##"):
            body = line[2:].lstrip(" ")
            sid, tab, marked = body.partition("\t")
            if tab and sid.strip() and not any(pc.is_bert_whitespace(c) for c in sid.strip()):
                header = (sid.strip(), marked)
            continue
        if line == "":
            cur = None
            continue
        fields = line.split("\t")
        if no_labels and len(fields) == 1:
            fields.append("O")
        elif no_labels and len(fields) == 2:
            fields[1] = "O"
        if len(fields) != 2:
            raise pc.DataError(f"{path}:{n}: expected 'char<TAB>tag', got {len(fields)} tab-separated field(s)")
        ch, tag = fields
        if len(ch) != 1:
            raise pc.DataError(f"{path}:{n}: the character field {ch!r} is not exactly one character")
        if tag not in LABEL2ID:
            raise pc.DataError(f"{path}:{n}: unknown tag '{tag}' (expected O, B-X or I-X with X in {' '.join(TYPES)})")
        if cur is None:
            sid, marked = header if header else (f"{base}:{n}", None)
            header = None
            cur = Sentence(sid, n, marked)
            sents.append(cur)
        cur.chars.append(ch)
        cur.tags.append(tag)
    return sents


def entities_from_tags(tags: Sequence[str]) -> List[Tuple[str, int, int]]:
    """[(type, begin, end)] of a BIO tag sequence, seqeval's default (non-strict) way: B-X starts an
    entity, I-X continues an entity of type X and starts one otherwise, O ends it."""
    out = []
    cur = None
    for i, tag in enumerate(list(tags) + ["O"]):
        if tag.startswith("I-") and cur is not None and cur[0] == tag[2:]:
            cur[2] = i + 1
            continue
        if cur is not None:
            out.append(tuple(cur))
            cur = None
        if tag != "O":
            cur = [tag[2:], i, i + 1]
    return out


def word_index(text: str) -> List[int]:
    """Word number of each character (-1 for whitespace); words are maximal non-whitespace runs."""
    out, w, prev_ws = [], -1, True
    for c in text:
        if pc.is_bert_whitespace(c):
            out.append(-1)
            prev_ws = True
        else:
            if prev_ws:
                w += 1
            out.append(w)
            prev_ws = False
    return out


def word_end(text: str, pos: int) -> int:
    """End of the word containing character pos."""
    e = pos
    while e < len(text) and not pc.is_bert_whitespace(text[e]):
        e += 1
    return e


def label_sentence(sent: Sentence, enc, T: int, tok, label_all: bool):
    """(ids row, labels row, offsets row, word_ids row, truncated); rows are unpadded."""
    text = sent.text
    wid = word_index(text)
    keep = T - 2
    offs = enc.offsets[:keep]
    ids = [tok.cls_id, *enc.ids[:keep], tok.sep_id]
    labels = [pc.IGNORE]
    offsets = [(pc.NO_OFFSET, pc.NO_OFFSET)]
    words = [-1]
    last_word = -1
    for (a, b) in offs:
        w = wid[a]
        if label_all or w != last_word:
            labels.append(LABEL2ID[sent.tags[a]])
        else:
            labels.append(pc.IGNORE)
        last_word = w
        offsets.append((a, b))
        words.append(w)
    labels.append(pc.IGNORE)
    offsets.append((pc.NO_OFFSET, pc.NO_OFFSET))
    words.append(-1)
    return ids, labels, offsets, words, len(enc.ids) > keep


def words_of(text: str) -> List[Tuple[int, int]]:
    """[start, end) of each word (maximal run of non-whitespace characters)."""
    out, start = [], None
    for i, c in enumerate(text):
        if pc.is_bert_whitespace(c):
            if start is not None:
                out.append((start, i))
                start = None
        elif start is None:
            start = i
    if start is not None:
        out.append((start, len(text)))
    return out


def label_sentence_hub(sent: Sentence, enc, spans, label_all: bool):
    """(labels row, offsets row, word_ids row) of a backend encoding of the sentence's words."""
    labels, offsets, words = [], [], []
    prev = None
    for wid, (a, b) in zip(enc.word_ids, enc.offsets):
        if wid is None:
            labels.append(pc.IGNORE)
            offsets.append((pc.NO_OFFSET, pc.NO_OFFSET))
            words.append(-1)
            prev = None
            continue
        w0 = spans[wid][0]
        start, end = w0 + a, w0 + b
        if wid != prev:
            labels.append(LABEL2ID[sent.tags[w0]])
        elif label_all:
            labels.append(LABEL2ID[sent.tags[start if start < end else w0]])
        else:
            labels.append(pc.IGNORE)
        prev = wid
        offsets.append((start, end))
        words.append(wid)
    return labels, offsets, words


def decode_entities(tag_ids: Sequence[int], labels: Sequence[int], offsets, text: str,
                    label_all: bool = False, id2label: Sequence[str] = ID2LABEL) -> List[Tuple[str, int, int]]:
    """Entities with character spans [(type, start, end)] from per-position tag ids (predictions or
    gold), read only where labels != -100. See the module help for the rule."""
    pos = [k for k, l in enumerate(labels) if l != pc.IGNORE]
    tags = [id2label[int(tag_ids[k])] for k in pos]
    out = []
    for typ, i, j in entities_from_tags(tags):
        first, last = pos[i], pos[j - 1]
        start = int(offsets[first][0])
        end = int(offsets[last][1]) if label_all else word_end(text, int(offsets[last][0]))
        out.append((typ, start, end))
    return out


def parse_args(argv):
    p = pc.make_parser(PROG, __doc__)
    p.add_argument("--input", required=True, metavar="FILE", help="KLUE NER character-level TSV file (or text file)")
    p.add_argument("--input-format", choices=["klue", "lines"], default="klue",
                   help="klue (default) or lines: one sentence per line (implies --no-labels)")
    p.add_argument("--label-names", help="comma-separated tag names in id order to record as id2label with "
                                         "--no-labels (the labelled default is O, B-PS, I-PS, ...)")
    pc.add_label_args(p, "tags are")
    p.add_argument("--label-all-subtokens", action="store_true",
                   help="label every sub-token with its first character's tag (default: first sub-token of each word)")
    pc.add_common_args(p, 128, "sentences", "sentences")
    return p.parse_args(argv)


def main(argv=None):
    a = parse_args(argv)

    def body(outs):
        pc.check_common(a, [a.input])
        if a.input_format == "lines":
            a.no_labels = True
        names = pc.parse_label_names(a.label_names, min_n=1)
        if not a.no_labels:
            if names is not None and names != ID2LABEL:
                raise pc.DataError(f"--label-names applies to --no-labels only (labelled input uses {','.join(ID2LABEL)})")
            names = ID2LABEL
        tok = pc.load_tokenizer(a, PROG)
        try:
            sents = parse_lines(a.input) if a.input_format == "lines" else parse_klue_ner(a.input, a.no_labels)
        except pc.DataError as e:
            raise pc.task_mismatch(a.input, "ner", e) from None
        if a.limit is not None:
            sents = sents[:a.limit]
        if not sents:
            raise pc.DataError(f"{a.input}: no sentences")
        mismatch = sum(1 for s in sents if s.marked is not None and MARKUP.sub(r"\1", s.marked) != s.text)
        T = a.max_seq_len
        for split, idx, path in pc.parts(a, len(sents)):
            w = outs.open(path)
            n_trunc = n_ent = n_lab = 0
            for chunk in pc.batched(idx):
                group = [sents[i] for i in chunk]
                rows, labs, offs, wids = [], [], [], []
                if tok.is_hub:
                    spans = [words_of(s.text) for s in group]
                    encs = tok.encode([[s.text[x:y] for x, y in sp] for s, sp in zip(group, spans)], T,
                                      pretokenized=True)
                    for s, e, sp in zip(group, encs, spans):
                        l, o, wd = label_sentence_hub(s, e, sp, a.label_all_subtokens)
                        labs.append(l)
                        offs.append(o)
                        wids.append(wd)
                        n_trunc += bool(e.overflowing)
                        n_lab += sum(1 for x in l if x != pc.IGNORE)
                    arrays = pc.pad_encodings(encs, T, tok.pad_id, tok.single_segment)
                else:
                    encs = tok.encode([s.text for s in group])
                    for s, e in zip(group, encs):
                        r, l, o, wd, cut = label_sentence(s, e, T, tok, a.label_all_subtokens)
                        rows.append(r)
                        labs.append(l)
                        offs.append(o)
                        wids.append(wd)
                        n_trunc += cut
                        n_lab += sum(1 for x in l if x != pc.IGNORE)
                    arrays = pc.row_arrays(rows, T, tok)
                import numpy as np

                off = np.full((len(group), T, 2), pc.NO_OFFSET, dtype=np.int32)
                for i, o in enumerate(offs):
                    off[i, :len(o)] = o
                if not a.no_labels:
                    ents = [entities_from_tags(s.tags) for s in group]
                    n_ent += sum(len(x) for x in ents)
                    arrays["labels"] = pc.pad_2d(labs, T, pc.IGNORE)
                    arrays["entities"] = [json.dumps([list(x) for x in e], ensure_ascii=False) for e in ents]
                w.append(**arrays,
                         offset_mapping=off,
                         word_ids=pc.pad_2d(wids, T, -1),
                         text=[s.text for s in group],
                         example_id=[s.sid for s in group])
            at = pc.base_attrs(a, tok, "ner", names, [a.input])
            at.update(num_examples=len(idx), truncated=n_trunc, label_all_subtokens=int(a.label_all_subtokens))
            if split:
                at["split"] = split
            w.set_attrs(at)
            pc.say(a, f"{PROG}: wrote {path}: {len(idx)} sentences x {T} tokens"
                      f"{' (' + split + ')' if split else ''}, {n_ent} gold entities, {n_lab} labelled tokens; "
                      f"truncated {n_trunc}; lowercase {int(tok.lowercase)} ({tok.lowercase_reason})")
        if mismatch:
            pc.say(a, f"{PROG}: warning: {mismatch} sentence(s) differ from their '##' markup line")

    return pc.run_main(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
