#!/usr/bin/env python3
"""Reference values for tests/unit/test_metrics.cpp, computed by the reference implementations.

  * entity P/R/F1 and chunking: the `seqeval` package itself (seqeval.metrics.precision_score,
    recall_score, f1_score with their defaults: micro average, default non-strict mode,
    zero_division="warn" i.e. 0; seqeval.metrics.sequence_labeling.get_entities for the chunks);
  * SQuAD v1.1: a transcription of normalize_answer / f1_score / exact_match_score /
    metric_max_over_ground_truths of the official evaluate-v1.1.py
    (https://rajpurkar.github.io/SQuAD-explorer/);
  * KorQuAD 1.0: a transcription of the same functions of the official KorQuAD evaluate-v1.0.py
    (https://korquad.github.io/, "KorQuAD v1.0에 대한 공식 평가 스크립트"; copies read at
    github.com/nakjun/Llama-3.2-1B-Instruct-KorQuAD-Finetune/evaluate-v1.0.py and
    github.com/nojiyoon/korbert_finetuning/evaluate-v1.0.py, identical in these functions);
  * Python's str.lower() (what both official scripts use) for the lower-casing table.

Usage:
  metrics_reference.py < request.json > answers.txt   (exit 77 when seqeval is missing)
  metrics_reference.py --lower-table                   (prints the table of src/metrics/metrics.cpp)

request.json: {"entities": [[tag, ...], ...],
               "prf": [{"gold": [[tag, ...], ...], "pred": [[...], ...]}, ...],
               "squad": [{"pred": str, "golds": [str, ...]}, ...],
               "korquad": [{"pred": str, "golds": [str, ...]}, ...],
               "lower_all": bool}
answers.txt, one line per answer, fields separated by single spaces, strings as UTF-8 hex ("-" for
the empty string), floats as repr() (shortest round trip, so C++ strtod gives the same double):
  entities K N [TYPEHEX BEGIN END]*N        (END exclusive)
  prf K PRECISION RECALL F1 TP PREDICTED GOLD
  squad K NORMHEX EM F1
  korquad K NORMHEX EM F1
  lowerall CP HEX                            (every code point whose lower() differs from itself)
"""
import json
import re
import string
import sys
import warnings
from collections import Counter


def hexs(s):
    return s.encode("utf-8").hex() if s else "-"


# ---- SQuAD v1.1 official evaluation (transcribed) ------------------------------------------------
def squad_normalize(s):
    s = s.lower()
    punct = set(string.punctuation)
    s = "".join(ch for ch in s if ch not in punct)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def squad_f1_one(pred, gold):
    p = squad_normalize(pred).split()
    g = squad_normalize(gold).split()
    same = sum((Counter(p) & Counter(g)).values())
    if same == 0:
        return 0
    precision = 1.0 * same / len(p)
    recall = 1.0 * same / len(g)
    return (2 * precision * recall) / (precision + recall)


def squad_em_one(pred, gold):
    return squad_normalize(pred) == squad_normalize(gold)


# ---- KorQuAD 1.0 official evaluation (transcribed) -----------------------------------------------
KORQUAD_TO_SPACE = ["'", '"', "《", "》", "<", ">", "〈", "〉", "(", ")", "‘", "’"]


def korquad_normalize(s):
    for ch in KORQUAD_TO_SPACE:  # remove_(): each symbol becomes a space, before lower()
        s = s.replace(ch, " ")
    s = s.lower()
    punct = set(string.punctuation)
    s = "".join(ch for ch in s if ch not in punct)
    return " ".join(s.split())  # no article removal


def korquad_f1_one(pred, gold):
    p_chars = [c for tok in korquad_normalize(pred).split() for c in tok]
    g_chars = [c for tok in korquad_normalize(gold).split() for c in tok]
    same = sum((Counter(p_chars) & Counter(g_chars)).values())
    if same == 0:
        return 0
    precision = 1.0 * same / len(p_chars)
    recall = 1.0 * same / len(g_chars)
    return (2 * precision * recall) / (precision + recall)


def korquad_em_one(pred, gold):
    return korquad_normalize(pred) == korquad_normalize(gold)


def max_over_golds(fn, pred, golds):
    return max(fn(pred, g) for g in golds)


# ---- lower-casing table --------------------------------------------------------------------------
def lower_runs():
    """Runs (first, count, stride, delta) of code points c with len(c.lower()) == 1 != c."""
    single = []
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        low = chr(cp).lower()
        if low != chr(cp) and len(low) == 1:
            single.append((cp, ord(low) - cp))
    runs, i = [], 0
    while i < len(single):
        first, delta = single[i]
        best_n, best_stride = 1, 1
        for stride in (1, 2):
            n = 1
            while (i + n < len(single) and single[i + n][0] == first + n * stride
                   and single[i + n][1] == delta):
                n += 1
            if n > best_n:
                best_n, best_stride = n, stride
        runs.append((first, best_n, best_stride, delta))
        i += best_n
    return runs


def print_lower_table():
    import unicodedata
    print("// %d runs, Unicode %s (Python %d.%d)" % (len(lower_runs()), unicodedata.unidata_version,
                                                     sys.version_info[0], sys.version_info[1]))
    items = ["{0x%X, %d, %d, %d}" % r for r in lower_runs()]
    line = "   "
    for it in items:
        if len(line) + len(it) + 2 > 100:
            print(line)
            line = "   "
        line += " " + it + ","
    print(line)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--lower-table":
        print_lower_table()
        return 0
    req = json.load(sys.stdin)
    out = []
    if req.get("entities") or req.get("prf"):
        try:
            from seqeval.metrics import f1_score, precision_score, recall_score
            from seqeval.metrics.sequence_labeling import get_entities
        except ImportError:
            print("seqeval is not installed", file=sys.stderr)
            return 77
        warnings.simplefilter("ignore")  # UndefinedMetricWarning, "seems not to be NE tag"
        for k, tags in enumerate(req.get("entities", [])):
            chunks = get_entities(list(tags))
            out.append("entities %d %d%s" % (k, len(chunks), "".join(
                " %s %d %d" % (hexs(t), b, e + 1) for t, b, e in chunks)))
        for k, case in enumerate(req.get("prf", [])):
            gold = [list(s) for s in case["gold"]]
            pred = [list(s) for s in case["pred"]]
            p = precision_score(gold, pred)
            r = recall_score(gold, pred)
            f = f1_score(gold, pred)
            # Counts as seqeval's extract_tp_actual_correct forms them (nested lists are flattened
            # with an "O" after every sentence, so positions are unique over the corpus).
            g = set(get_entities(gold))
            q = set(get_entities(pred))
            out.append("prf %d %r %r %r %d %d %d" % (k, float(p), float(r), float(f), len(g & q),
                                                      len(q), len(g)))
    for k, case in enumerate(req.get("squad", [])):
        em = max_over_golds(squad_em_one, case["pred"], case["golds"])
        f1 = max_over_golds(squad_f1_one, case["pred"], case["golds"])
        out.append("squad %d %s %r %r" % (k, hexs(squad_normalize(case["pred"])), float(em),
                                          float(f1)))
    for k, case in enumerate(req.get("korquad", [])):
        em = max_over_golds(korquad_em_one, case["pred"], case["golds"])
        f1 = max_over_golds(korquad_f1_one, case["pred"], case["golds"])
        out.append("korquad %d %s %r %r" % (k, hexs(korquad_normalize(case["pred"])), float(em),
                                            float(f1)))
    if req.get("lower_all"):
        for cp in range(0x110000):
            if 0xD800 <= cp < 0xE000:
                continue
            low = chr(cp).lower()
            if low != chr(cp):
                out.append("lowerall %d %s" % (cp, hexs(low)))
    sys.stdout.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
