#!/usr/bin/env python3
"""Extractive QA data (SQuAD 1.1 / KorQuAD 1.0 JSON) -> nlptrain HDF5 features (task qa).

Input: SQuAD-format JSON, data[].paragraphs[].{context, qas[].{id, question, answers[].{text,
answer_start}}}. A question may have several gold answers: the first gives the training positions,
all are kept for evaluation. SQuAD 2.0's is_impossible questions (no answers) get start = end = 0.
An answer whose text is not found at answer_start in the context, or a malformed record, is an
error naming the file and the record (data[i].paragraphs[j].qas[k], id).

Windowing (as Hugging Face's run_qa.py): the question is tokenized and cut to --max-query-len
tokens; the context is tokenized with character offsets and cut into windows of
C = T - 3 - len(question) tokens that overlap by --doc-stride tokens (window k starts at token
k*(C - doc_stride); the last window ends at the context's end). Each window is one feature:
[CLS] question [SEP] window [SEP] [PAD]..., token_type_ids 0 for [CLS] question [SEP] and 1 for the
window and the final [SEP]. The gold answer (first answer, trimmed of leading/trailing whitespace)
maps to the first and last context tokens that overlap its characters; a window that does not
contain the whole answer gets start_positions = end_positions = 0 (the [CLS] token).
The text of a predicted span (s, e) is context[offset_mapping[s][0] : offset_mapping[e][1]].

Output, per feature [N]: input_ids, attention_mask, token_type_ids [N,T] int32;
  start_positions, end_positions [N] int32; offset_mapping [N,T,2] int32 (character offsets into the
  example's context for context tokens, -1 for question, special and padding tokens);
  example_index [N] int32 (the feature's example, an index into the per-example datasets).
Per example [E] (UTF-8 strings): example_id (the question id), question, context, answers (JSON list
  of all gold answer texts, as in the file). Attributes: see prep_common.py, task = qa, num_labels
  0, doc_stride, max_query_len, num_examples (E), num_features (N), num_articles.
--no-labels: answers are not needed (nor checked); start_positions / end_positions are not
written and `answers` holds empty lists ("[]").
With --tokenizer PATH the features are what HF run_qa.py's prepare_train_features makes:
tokenizer(question.lstrip(), context, truncation="only_second", max_length=T, stride=doc_stride,
return_overflowing_tokens=True, return_offsets_mapping=True, padding="max_length") with the
tokenizer's own template; the answer span is the first answer's answer_start .. + len(text)
(untrimmed, as run_qa), positions at the CLS token (index 0 when there is none) when a window does
not hold it. run_qa does not cut questions; here a question longer than --max-query-len tokens is cut
at the end of its max_query_len-th token (counted in the summary).
--limit N keeps the first N questions; --split-eval splits by article (all questions of an article,
hence every copy of its contexts, go to the same part).

Examples
  prep_qa.py --vocab data/vocab/kcbert-base/vocab.txt --input KorQuAD_v1.0_dev.json \\
      --out korquad_train.h5 --split-eval 0.2 --eval-out korquad_eval.h5
"""
from __future__ import annotations

import json
import os
import sys
from typing import List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prep_common as pc  # noqa: E402

PROG = "prep_qa.py"


class Example:
    __slots__ = ("qid", "question", "context_index", "answers", "span", "article", "raw_span")

    def __init__(self, qid, question, context_index, answers, span, article, raw_span=None):
        self.qid, self.question, self.context_index = qid, question, context_index
        self.answers, self.span, self.article = answers, span, article
        self.raw_span = raw_span  # the first answer's [answer_start, + len(text)), untrimmed


def _need(cond, path, where, what):
    if not cond:
        raise pc.DataError(f"{path}: {where}: {what}")


def parse_squad(path: str, limit: Optional[int], no_labels: bool = False) -> Tuple[List[Example], List[str], int]:
    """(examples, contexts, number of articles) of a SQuAD-format file; stops after `limit` questions."""
    pc.check_input(path)
    try:
        with open(path, "r", encoding="utf-8") as f:
            doc = json.load(f)
    except UnicodeDecodeError as e:
        raise pc.DataError(f"{path}: not valid UTF-8 (byte offset {e.start})") from None
    except json.JSONDecodeError as e:
        raise pc.DataError(f"{path}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno})") from None
    except OSError as e:
        raise pc.DataError(f"cannot read input file '{path}': {e.strerror}") from None
    _need(isinstance(doc, dict) and isinstance(doc.get("data"), list), path, "top level",
          "expected an object with a 'data' list (SQuAD format)")
    examples: List[Example] = []
    contexts: List[str] = []
    seen = set()
    n_articles = 0
    for i, art in enumerate(doc["data"]):
        where = f"data[{i}]"
        _need(isinstance(art, dict) and isinstance(art.get("paragraphs"), list), path, where,
              "expected an object with a 'paragraphs' list")
        used = False
        for j, par in enumerate(art["paragraphs"]):
            w2 = f"{where}.paragraphs[{j}]"
            _need(isinstance(par, dict) and isinstance(par.get("context"), str) and isinstance(par.get("qas"), list),
                  path, w2, "expected an object with a 'context' string and a 'qas' list")
            ctx = par["context"]
            ci = None
            for k, qa in enumerate(par["qas"]):
                if limit is not None and len(examples) >= limit:
                    return examples, contexts, n_articles
                w3 = f"{w2}.qas[{k}]"
                _need(isinstance(qa, dict) and isinstance(qa.get("question"), str), path, w3,
                      "expected an object with a 'question' string")
                qid = str(qa.get("id", ""))
                _need(qid != "", path, w3, "missing 'id'")
                w3 = f"{w3} (id {qid})"
                _need(qid not in seen, path, w3, "the id repeats an earlier question's")
                seen.add(qid)
                answers = [] if no_labels else qa.get("answers", [])
                _need(isinstance(answers, list), path, w3, "'answers' is not a list")
                texts = []
                for m, ans in enumerate(answers):
                    _need(isinstance(ans, dict) and isinstance(ans.get("text"), str)
                          and isinstance(ans.get("answer_start"), int), path, f"{w3} answers[{m}]",
                          "expected {text: string, answer_start: integer}")
                    s, t = ans["answer_start"], ans["text"]
                    _need(0 <= s and ctx[s:s + len(t)] == t, path, f"{w3} answers[{m}]",
                          f"answer text {t!r} is not at answer_start {s} of the context")
                    texts.append(t)
                span = raw = None
                if no_labels:
                    pass
                elif answers:
                    s, t = answers[0]["answer_start"], answers[0]["text"]
                    lead = len(t) - len(t.lstrip())
                    trail = len(t) - len(t.rstrip())
                    _need(t.strip() != "", path, f"{w3} answers[0]", "the answer text is empty or only whitespace")
                    span = (s + lead, s + len(t) - trail)
                    raw = (s, s + len(t))
                else:
                    _need(bool(qa.get("is_impossible", False)), path, w3,
                          "no answers (and not marked is_impossible)")
                if ci is None:
                    ci = len(contexts)
                    contexts.append(ctx)
                if not used:
                    used = True
                    n_articles += 1
                examples.append(Example(qid, qa["question"], ci, texts, span, n_articles - 1, raw))
    return examples, contexts, n_articles


def features(ex: Example, q_ids, ctx_enc, T: int, stride: int, tok):
    """Feature rows of one example: list of (ids, types, offsets, start, end)."""
    ctx_ids, ctx_off = ctx_enc.ids, ctx_enc.offsets
    n = len(ctx_ids)
    C = T - 3 - len(q_ids)
    windows = []
    s = 0
    while True:
        e = min(s + C, n)
        windows.append((s, e))
        if e >= n:
            break
        s += C - stride
    head = [tok.cls_id, *q_ids, tok.sep_id]
    out = []
    for s, e in windows:
        ids = head + ctx_ids[s:e] + [tok.sep_id]
        types = [0] * len(head) + [1] * (e - s + 1)
        offs = [(pc.NO_OFFSET, pc.NO_OFFSET)] * len(head) + list(ctx_off[s:e]) + [(pc.NO_OFFSET, pc.NO_OFFSET)]
        start = end = 0
        if ex.span is not None and e > s:
            sc, ec = ex.span
            if ctx_off[s][0] <= sc and ctx_off[e - 1][1] >= ec:
                k = s
                while k < e and ctx_off[k][0] <= sc:
                    k += 1
                start = len(head) + (k - 1 - s)
                k = e - 1
                while k >= s and ctx_off[k][1] >= ec:
                    k -= 1
                end = len(head) + (k + 1 - s)
        out.append((ids, types, offs, start, end))
    return out


def hub_features(group, contexts, T: int, stride: int, max_query_len: int, tok):
    """Features of examples as run_qa's prepare_train_features makes them with a fast tokenizer:
    ([(example k in group, encoding, offsets row, start, end)], questions cut)."""
    questions = [ex.question.lstrip() for ex in group]
    n_qcut = 0
    for i, e in enumerate(tok.tok.encode_batch(questions, add_special_tokens=False)):
        if len(e.ids) > max_query_len:
            questions[i] = questions[i][:e.offsets[max_query_len - 1][1]]
            n_qcut += 1
    encs = tok.encode([(q, contexts[ex.context_index]) for q, ex in zip(questions, group)], T,
                      strategy="only_second", stride=stride)
    out = []
    for k, (ex, enc) in enumerate(zip(group, encs)):
        for f in [enc] + list(enc.overflowing):
            ids, seq, offs = f.ids, f.sequence_ids, f.offsets
            cls = ids.index(tok.cls_id) if tok.cls_id in ids else 0
            row = [o if sq == 1 else (pc.NO_OFFSET, pc.NO_OFFSET) for o, sq in zip(offs, seq)]
            start = end = cls
            if ex.raw_span is not None:
                sc, ec = ex.raw_span
                a = 0
                while seq[a] != 1:
                    a += 1
                b = len(ids) - 1
                while seq[b] != 1:
                    b -= 1
                if offs[a][0] <= sc and offs[b][1] >= ec:
                    while a < len(offs) and offs[a][0] <= sc:
                        a += 1
                    start = a - 1
                    while offs[b][1] >= ec:
                        b -= 1
                    end = b + 1
            out.append((k, f, row, start, end))
    return out, n_qcut


def parse_args(argv):
    p = pc.make_parser(PROG, __doc__)
    p.add_argument("--input", required=True, metavar="FILE.json", help="SQuAD/KorQuAD-format JSON file")
    p.add_argument("--doc-stride", type=int, default=128, help="overlap of consecutive windows in tokens (default 128)")
    p.add_argument("--max-query-len", type=int, default=64, help="question tokens kept (default 64)")
    pc.add_label_args(p, "answers are")
    pc.add_common_args(p, 384, "articles", "questions")
    return p.parse_args(argv)


def main(argv=None):
    a = parse_args(argv)

    def body(outs):
        import numpy as np

        pc.check_common(a, [a.input])
        if a.max_query_len < 1:
            raise pc.DataError(f"--max-query-len must be >= 1, got {a.max_query_len}")
        if a.doc_stride < 0:
            raise pc.DataError(f"--doc-stride must be >= 0, got {a.doc_stride}")
        if a.max_seq_len - 3 - a.max_query_len <= a.doc_stride:
            raise pc.DataError(f"--max-seq-len {a.max_seq_len} leaves {a.max_seq_len - 3 - a.max_query_len} context "
                               f"tokens after a {a.max_query_len}-token question, not more than --doc-stride {a.doc_stride}")
        tok = pc.load_tokenizer(a, PROG)
        try:
            examples, contexts, n_articles = parse_squad(a.input, a.limit, a.no_labels)
        except pc.DataError as e:
            raise pc.task_mismatch(a.input, "qa", e) from None
        if not examples:
            raise pc.DataError(f"{a.input}: no questions")
        T = a.max_seq_len
        ctx_enc = None if tok.is_hub else tok.encode(contexts)
        for split, art_idx, path in pc.parts(a, n_articles):
            arts = set(art_idx)
            idx = [i for i, ex in enumerate(examples) if ex.article in arts]
            w = outs.open(path)
            n_feat = n_multi = n_qcut = n_found = n_has = 0
            for e0, chunk in enumerate(pc.batched(idx, 1024)):
                group = [examples[i] for i in chunk]
                rows, types, offs, starts, ends, exi = [], [], [], [], [], []
                if tok.is_hub:
                    feats, cut = hub_features(group, contexts, T, a.doc_stride, a.max_query_len, tok)
                    n_qcut += cut
                    per = [0] * len(group)
                    found = set()
                    for k, f, row, s, e in feats:
                        per[k] += 1
                        if s != e or s != (f.ids.index(tok.cls_id) if tok.cls_id in f.ids else 0):
                            found.add(k)
                        offs.append(row)
                        starts.append(s)
                        ends.append(e)
                        exi.append(e0 * 1024 + k)
                    n_multi += sum(1 for c in per if c > 1)
                    n_found += len(found)
                    n_has += sum(1 for ex in group if ex.raw_span is not None)
                    encs = [f for _, f, _, _, _ in feats]
                    arrays = pc.pad_encodings(encs, T, tok.pad_id, tok.single_segment)
                    rows = encs
                q_encs = [] if tok.is_hub else tok.ids([ex.question.lstrip() for ex in group])
                for k, (ex, q) in enumerate(zip(group, q_encs)):
                    n_qcut += len(q) > a.max_query_len
                    feats = features(ex, q[:a.max_query_len], ctx_enc[ex.context_index], T, a.doc_stride, tok)
                    n_multi += len(feats) > 1
                    n_has += ex.span is not None
                    n_found += any(f[3] > 0 for f in feats)
                    for ids, ty, of, s, e in feats:
                        rows.append(ids)
                        types.append(ty)
                        offs.append(of)
                        starts.append(s)
                        ends.append(e)
                        exi.append(e0 * 1024 + k)
                off = np.full((len(rows), T, 2), pc.NO_OFFSET, dtype=np.int32)
                for i, o in enumerate(offs):
                    off[i, :len(o)] = o
                if not tok.is_hub:
                    arrays = pc.row_arrays(rows, T, tok, types)
                if not a.no_labels:
                    arrays.update(start_positions=starts, end_positions=ends)
                w.append(**arrays, offset_mapping=off, example_index=exi)
                w.append(example_id=[ex.qid for ex in group], question=[ex.question for ex in group],
                         context=[contexts[ex.context_index] for ex in group],
                         answers=[json.dumps(ex.answers, ensure_ascii=False) for ex in group])
                n_feat += len(rows)
            at = pc.base_attrs(a, tok, "qa", [], [a.input])
            at.update(num_examples=len(idx), num_features=n_feat, num_articles=len(arts),
                      doc_stride=a.doc_stride, max_query_len=a.max_query_len,
                      truncated=n_multi, truncated_questions=n_qcut)
            if split:
                at["split"] = split
            w.set_attrs(at)
            pc.say(a, f"{PROG}: wrote {path}: {len(idx)} questions ({len(arts)} articles) -> {n_feat} features x {T}"
                      f"{' (' + split + ')' if split else ''}; {n_multi} questions span several windows (context "
                      f"longer than one window), {n_qcut} questions cut to {a.max_query_len} tokens; "
                      f"{n_found} of {n_has} answers inside at least one window; lowercase {int(tok.lowercase)} "
                      f"({tok.lowercase_reason})")

    return pc.run_main(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
