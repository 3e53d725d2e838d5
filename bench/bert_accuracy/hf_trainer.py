#!/usr/bin/env python3
"""Hugging Face Trainer side of the nlptrain BERT accuracy comparison.

Reads the same HDF5 files as nlptrain (tools/prep_*.py output), trains with transformers.Trainer and
evaluates with the same metrics nlptrain reports, written to <out>/result.json.

  hf_trainer.py --task mlm --train mlm_train.h5 --eval mlm_eval.h5 --out DIR --steps 300 --batch 64 \
      --lr 5e-4 --warmup 30 [--hidden 256 --layers 4 --heads 4 --intermediate 1024 --max-pos 256]
  hf_trainer.py --task doc_cls --init DIR_OF_MLM/model --train ... --eval ... --out ... --steps ... --batch 32

--model-type roberta | electra (from scratch; bench/finetune_speed.sh MODEL=...): transformers' RobertaConfig /
ElectraConfig and the task's Roberta* / Electra* class in place of BERT's, the same shapes and dropout,
initializer_range 0.02 and layer_norm_eps 1e-12 (the configs' defaults, as nlptrain's); RoBERTa with
type_vocab_size 1 (the rows' token types must be 0: tools/prep_*.py --single-segment) and its positions
from pad_id + 1; ELECTRA with embedding_size = --embedding-size (default --hidden). The model's
parameter count is printed and written to result.json (parameters), to compare with nlptrain's.

Matching nlptrain: AdamW (betas 0.9/0.999, eps 1e-8) with Trainer's no-decay groups (biases,
LayerNorm weights), global-norm clipping 1.0, dropout 0.1, fp32, one process with
torch.set_num_threads(THREADS), no dataloader workers. The schedule is nlptrain's, not HF's stock
linear one: warmup multiplier (step+1)/warmup, then linear decay (N-step)/(N-warmup) (identical to HF
after warmup; HF's stock warmup is step/warmup, i.e. one step later). --hf-warmup uses the stock one.
MLM masking: 15% of the non-special, non-padding tokens, 80% [MASK] / 10% random token / 10% kept
(DataCollatorForLanguageModeling's rule, done here on the HDF5 ids with the file's cls/sep/pad/mask ids);
evaluation masks with a fixed seed, so every evaluation sees the same masked positions.

Padding (--padding): max_length (default) stacks every row at the file's length T, as before.
longest: __getitem__ returns each row cut to its real length (the position after its last
attention_mask 1), and the collator pads each batch to its longest row (rounded up to
--pad-multiple, at most T), as transformers.DataCollatorWithPadding does: input_ids with the file's
pad_id, attention_mask and token_type_ids with 0, token labels (ner) with -100; sequence labels and
qa start/end positions are stacked unchanged. MLM masks after padding (padding is never a target).
--group-by-length: Trainer's LengthGroupedSampler (group_by_length=True; in transformers >= 5
train_sampling_strategy="group_by_length"), which takes the lengths from len(item["input_ids"]):
the true lengths with --padding longest, all T with max_length. Evaluation always runs at the
file's length (the same predictions up to rounding; evaluation time is not training time).
result.json adds padding, group_by_length, pad_multiple, real_tokens (sum of attention_mask over the
trained batches), computed_tokens (positions run), real_tokens_per_s = real_tokens / train_s,
computed_tokens_per_s, mean_batch_len and padding_fraction (1 - real / computed).
"""
from __future__ import annotations

import argparse
import json
import statistics
import math
import os
import re
import string
import sys
import time
from collections import Counter

import h5py
import numpy as np
import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", required=True, choices=["mlm", "doc_cls", "pair_cls", "ner", "qa"])
    p.add_argument("--train", required=True)
    p.add_argument("--eval", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--init", default="", help="folder of the saved MLM model (fine-tuning); empty = from scratch")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--batch", type=int, required=True, help="global batch (per_device_train_batch_size, 1 process)")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--hf-warmup", action="store_true", help="HF's stock linear schedule (warmup step/warmup)")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--eval-batch", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=1024)
    p.add_argument("--max-pos", type=int, default=256)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--model-type", choices=["bert", "roberta", "electra"], default="bert",
                   help="the from-scratch model's family: bert (BertConfig, default), roberta (RobertaConfig: "
                        "type_vocab_size 1, positions from pad_id + 1, so --max-pos must exceed the rows' length "
                        "+ pad_id; RobertaClassificationHead) or electra (ElectraConfig, the discriminator: "
                        "embeddings of width --embedding-size; ElectraClassificationHead)")
    p.add_argument("--type-vocab", type=int, default=0,
                   help="token types of the from-scratch model (0 = the family's: 2 for bert and electra, 1 for "
                        "roberta)")
    p.add_argument("--embedding-size", type=int, default=0,
                   help="electra: width of the embeddings (0 = --hidden: no embeddings_project)")
    p.add_argument("--log-steps", type=int, default=20)
    p.add_argument("--padding", choices=["max_length", "longest"], default="max_length",
                   help="max_length: every row at the file's length (default); longest: rows cut to their real "
                        "length, each batch padded to its longest row (DataCollatorWithPadding)")
    p.add_argument("--pad-multiple", type=int, default=1,
                   help="with --padding longest: round the batch length up to a multiple of this, at most the "
                        "file's length (DataCollatorWithPadding's pad_to_multiple_of; default 1 = off)")
    p.add_argument("--group-by-length", action="store_true",
                   help="Trainer's group_by_length (LengthGroupedSampler on len(item['input_ids']))")
    p.add_argument("--shuffle-groups", action="store_true",
                   help="with --group-by-length: shuffle the order of the optimizer steps' groups of the "
                        "epoch (what nlptrain's data.group_order = shuffled does) instead of LengthGroupedSampler's "
                        "order, where each mega-batch of min(50, examples / (4 x batch)) steps runs from its longest to its "
                        "shortest examples")
    p.add_argument("--torch-compile", action="store_true",
                   help="TrainingArguments(torch_compile=True): the model through torch.compile (inductor; on the "
                        "CPU it generates C++/OpenMP kernels), compile time included in train_s")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cpu (default; use_cpu=True, torch.set_num_threads(--threads)) or cuda (the Trainer's default "
                        "placement on GPU 0; attention through PyTorch's SDPA)")
    p.add_argument("--bf16", action="store_true",
                   help="TrainingArguments(bf16=True): the forward and backward under torch.autocast(cpu, bfloat16) "
                        "(oneDNN's bf16 kernels: AMX / AVX512-BF16 where the CPU has them), fp32 master weights")
    a = p.parse_args(argv)
    if a.shuffle_groups and not a.group_by_length:
        p.error("--shuffle-groups reorders the length groups of --group-by-length; give both")
    if a.embedding_size and a.model_type != "electra":
        p.error("--embedding-size is electra's (--model-type electra)")
    if a.init and a.model_type != "bert":
        p.error("--init loads a saved BERT (the MLM pre-training of bert_accuracy); --model-type is for "
                "from-scratch models")
    return a


# ---- data ----------------------------------------------------------------------------------------

class GroupShuffled(torch.utils.data.Sampler):
    """`inner`'s order cut into groups of `group` indices (an optimizer step's examples), whose order is
    shuffled per epoch (seeded); an incomplete last group stays last."""

    def __init__(self, inner, group, seed):
        self.inner, self.group, self.seed, self.epoch = inner, group, seed, 0

    def __len__(self):
        return len(self.inner)

    def __iter__(self):
        idx = list(iter(self.inner))
        n = len(idx) // self.group
        g = torch.Generator().manual_seed(self.seed * 1000003 + self.epoch)
        self.epoch += 1
        order = torch.randperm(n, generator=g).tolist()
        out = [i for k in order for i in idx[k * self.group:(k + 1) * self.group]]
        return iter(out + idx[n * self.group:])


class H5Rows(torch.utils.data.Dataset):
    """The model columns of one HDF5 file, in memory, as a list of dicts of tensors."""

    def __init__(self, path, task, padding="max_length"):
        self.padding = padding
        with h5py.File(path, "r") as f:
            self.attrs = {k: f.attrs[k] for k in f.attrs}
            cols = {"input_ids": "input_ids", "attention_mask": "attention_mask", "token_type_ids": "token_type_ids"}
            if task in ("doc_cls", "pair_cls", "ner"):
                cols["labels"] = "labels"
            if task == "qa":
                cols["start_positions"] = "start_positions"
                cols["end_positions"] = "end_positions"
            self.cols = {k: torch.from_numpy(f[v][()].astype(np.int64)) for k, v in cols.items()}
            self.extra = {}
            for k in ("offset_mapping", "example_index"):
                if k in f:
                    self.extra[k] = f[k][()]
            for k in ("context", "answers", "example_id"):
                if k in f:
                    self.extra[k] = [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in f[k][()]]
        self.n = self.cols["input_ids"].shape[0]
        self.T = self.cols["input_ids"].shape[1]
        self.pad_id = int(self.attrs["pad_id"])
        # real length of each row: the position after its last attention_mask 1 (>= 1)
        am = self.cols["attention_mask"]
        pos = torch.arange(1, self.T + 1).expand_as(am)
        self.lengths = (pos * (am != 0)).max(dim=1).values.clamp(min=1)
        self.row_cols = [k for k, v in self.cols.items() if v.dim() == 2]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.padding == "longest":
            L = int(self.lengths[i])
            return {k: (v[i, :L] if k in self.row_cols else v[i]) for k, v in self.cols.items()}
        return {k: v[i] for k, v in self.cols.items()}


# per-row column -> padding value (input_ids: the file's pad_id)
PAD_VALUES = {"attention_mask": 0, "token_type_ids": 0, "labels": -100}


class PadCollator:
    """Pads a batch of rows of different lengths to the longest (rounded up to `multiple`, at most
    `max_len`), as transformers.DataCollatorWithPadding (padding='longest') does; 0-d columns
    (sequence labels, qa start/end positions) are stacked unchanged."""

    def __init__(self, pad_id, multiple=1, max_len=None):
        self.pad_id = pad_id
        self.multiple = max(1, multiple)
        self.max_len = max_len

    def __call__(self, rows):
        L = max(int(r["input_ids"].shape[0]) for r in rows)
        L = -(-L // self.multiple) * self.multiple
        if self.max_len:
            L = min(L, self.max_len)  # rows are at most the file's length
        out = {}
        for k in rows[0]:
            if rows[0][k].dim() == 0:
                out[k] = torch.stack([r[k] for r in rows])
                continue
            fill = self.pad_id if k == "input_ids" else PAD_VALUES.get(k, 0)
            t = torch.full((len(rows), L), fill, dtype=rows[0][k].dtype)
            for j, r in enumerate(rows):
                t[j, :r[k].shape[0]] = r[k]
            out[k] = t
        return out


class MlmCollator:
    """15% of the real tokens (not [CLS]/[SEP]/[PAD], attention_mask 1) become targets; of those
    80% -> [MASK], 10% -> random id, 10% unchanged (transformers.DataCollatorForLanguageModeling)."""

    def __init__(self, attrs, vocab_size, prob=0.15, generator=None, pad=None):
        self.pad = pad  # a PadCollator for rows of different lengths (--padding longest); None: stack
        self.special = [int(attrs["cls_id"]), int(attrs["sep_id"]), int(attrs["pad_id"])]
        self.mask_id = int(attrs["mask_id"])
        self.V = vocab_size
        self.prob = prob
        self.g = generator

    def __call__(self, rows):
        if self.pad is not None:
            b = self.pad(rows)
            ids, am, tt = b["input_ids"], b["attention_mask"], b["token_type_ids"]
        else:
            ids = torch.stack([r["input_ids"] for r in rows])
            am = torch.stack([r["attention_mask"] for r in rows])
            tt = torch.stack([r["token_type_ids"] for r in rows])
        labels = ids.clone()
        special = am == 0
        for s in self.special:
            special |= ids == s
        pm = torch.full(ids.shape, self.prob)
        pm.masked_fill_(special, 0.0)
        masked = torch.bernoulli(pm, generator=self.g).bool()
        labels[~masked] = -100
        repl = torch.bernoulli(torch.full(ids.shape, 0.8), generator=self.g).bool() & masked
        ids = ids.clone()
        ids[repl] = self.mask_id
        rnd = torch.bernoulli(torch.full(ids.shape, 0.5), generator=self.g).bool() & masked & ~repl
        ids[rnd] = torch.randint(self.V, ids.shape, dtype=torch.long, generator=self.g)[rnd]
        return {"input_ids": ids, "attention_mask": am, "token_type_ids": tt, "labels": labels}


def plain_collate(rows):
    return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}


# ---- metrics -------------------------------------------------------------------------------------

def squad_normalize(s):
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def squad_f1(pred, gold):
    p, g = squad_normalize(pred).split(), squad_normalize(gold).split()
    common = Counter(p) & Counter(g)
    same = sum(common.values())
    if same == 0:
        return 0.0
    pr, rc = same / len(p), same / len(g)
    return 2 * pr * rc / (pr + rc)


KORQUAD_REMOVE = "'\"《》<>〈〉()‘’"


def korquad_normalize(s):
    for c in KORQUAD_REMOVE:
        s = s.replace(c, " ")
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    return " ".join(s.split())


def korquad_f1(pred, gold):
    p = [c for t in korquad_normalize(pred).split() for c in t]
    g = [c for t in korquad_normalize(gold).split() for c in t]
    common = Counter(p) & Counter(g)
    same = sum(common.values())
    if same == 0:
        return 0.0
    pr, rc = same / len(p), same / len(g)
    return 2 * pr * rc / (pr + rc)


def qa_metrics(ds, start_logits, end_logits, max_answer=30):
    off = ds.extra["offset_mapping"]
    exi = ds.extra["example_index"]
    ctx, ans, ids = ds.extra["context"], ds.extra["answers"], ds.extra["example_id"]
    E = len(ctx)
    best = [-math.inf] * E
    best_span = [None] * E
    for f in range(len(exi)):
        o = off[f]
        inside = o[:, 0] >= 0
        s = start_logits[f].astype(np.float64)
        e = end_logits[f].astype(np.float64)
        T = len(s)
        # score[i, j] = s[i] + e[j] for i <= j < i + max_answer, both inside the context
        sc = s[:, None] + e[None, :]
        ii, jj = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
        ok = (jj >= ii) & (jj < ii + max_answer) & inside[:, None] & inside[None, :]
        if not ok.any():
            continue
        sc = np.where(ok, sc, -np.inf)
        k = int(np.argmax(sc))
        i, j = divmod(k, T)
        if sc[i, j] > best[exi[f]]:
            best[exi[f]] = sc[i, j]
            best_span[exi[f]] = (int(o[i, 0]), int(o[j, 1]))
    em = f1 = kem = kf1 = 0.0
    n = 0
    preds = {}
    for e in range(E):
        if best_span[e] is None:
            continue
        text = ctx[e][best_span[e][0]:best_span[e][1]]
        golds = json.loads(ans[e])
        preds[ids[e]] = text
        em += max(float(squad_normalize(text) == squad_normalize(g)) for g in golds)
        f1 += max(squad_f1(text, g) for g in golds)
        kem += max(float(korquad_normalize(text) == korquad_normalize(g)) for g in golds)
        kf1 += max(korquad_f1(text, g) for g in golds)
        n += 1
    c = max(n, 1)
    return {"exact_match": 100 * em / c, "f1": 100 * f1 / c, "korquad_exact_match": 100 * kem / c,
            "korquad_f1": 100 * kf1 / c, "questions": n}, preds


@torch.no_grad()
def evaluate(model, ds, task, batch, seed):
    model.eval()
    dev = next(model.parameters()).device
    id2label = json.loads(ds.attrs.get("id2label", "[]"))
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(seed + 0xE7A1)
    coll = MlmCollator(ds.attrs, V, generator=g) if task == "mlm" else plain_collate
    loss_sum = 0.0
    loss_n = 0
    correct = total = 0
    gold_seqs, pred_seqs = [], []
    starts, ends = [], []
    for a in range(0, len(ds), batch):
        b = coll([ds[i] for i in range(a, min(len(ds), a + batch))])
        out = model(**{k: v.to(dev) for k, v in b.items()})
        if dev.type != "cpu":  # the metrics below read the outputs on the host
            out = type(out)(**{k: (v.float().cpu() if torch.is_tensor(v) else v) for k, v in out.items()})
        if task == "mlm":
            lab = b["labels"]
            n = int((lab != -100).sum())
            loss_sum += float(out.loss) * n
            loss_n += n
            pred = out.logits.argmax(-1)
            correct += int(((pred == lab) & (lab != -100)).sum())
            total += n
        elif task in ("doc_cls", "pair_cls"):
            n = b["labels"].shape[0]
            loss_sum += float(out.loss) * n
            loss_n += n
            correct += int((out.logits.argmax(-1) == b["labels"]).sum())
            total += n
        elif task == "ner":
            lab = b["labels"]
            n = int((lab != -100).sum())
            loss_sum += float(out.loss) * n
            loss_n += n
            pred = out.logits.argmax(-1)
            for r in range(lab.shape[0]):
                keep = lab[r] != -100
                gs = [id2label[int(x)] for x in lab[r][keep]]
                if gs:
                    gold_seqs.append(gs)
                    pred_seqs.append([id2label[int(x)] for x in pred[r][keep]])
        else:  # qa
            n = b["input_ids"].shape[0]
            loss_sum += float(out.loss) * n
            loss_n += n
            starts.append(out.start_logits.numpy())
            ends.append(out.end_logits.numpy())
    loss = loss_sum / max(loss_n, 1)
    res = {"loss": loss}
    if task == "mlm":
        res.update(accuracy=correct / max(total, 1), perplexity=math.exp(loss), masked_tokens=total)
    elif task in ("doc_cls", "pair_cls"):
        res.update(accuracy=correct / max(total, 1), examples=total)
    elif task == "ner":
        from seqeval.metrics import f1_score, precision_score, recall_score  # ner only (not on every machine)

        res.update(precision=precision_score(gold_seqs, pred_seqs), recall=recall_score(gold_seqs, pred_seqs),
                   f1=f1_score(gold_seqs, pred_seqs), sentences=len(gold_seqs))
    else:
        m, preds = qa_metrics(ds, np.concatenate(starts), np.concatenate(ends))
        res.update(m)
        res["_predictions"] = preds
    return res


def model_classes(model_type, task):
    """(config class, model class) of transformers for a family and task (electra: the discriminator's
    heads; it has no masked-LM head)."""
    import transformers as tf

    name = {"bert": "Bert", "roberta": "Roberta", "electra": "Electra"}[model_type]
    head = {"mlm": "ForMaskedLM", "doc_cls": "ForSequenceClassification", "pair_cls": "ForSequenceClassification",
            "ner": "ForTokenClassification", "qa": "ForQuestionAnswering"}[task]
    if model_type == "electra" and task == "mlm":
        raise SystemExit("hf_trainer: --model-type electra has no mlm head (the discriminator); use bert or roberta")
    return getattr(tf, name + "Config"), getattr(tf, name + head)


def main(argv=None):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    import transformers
    from transformers import Trainer, TrainingArguments

    transformers.logging.set_verbosity_error()
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    train = H5Rows(a.train, a.task, padding=a.padding)
    evds = H5Rows(a.eval, a.task)
    transformers.set_seed(a.seed)
    config_cls, cls = model_classes(a.model_type, a.task)
    kw = {}
    if a.task in ("doc_cls", "pair_cls", "ner"):
        kw["num_labels"] = int(train.attrs["num_labels"])
    if a.init:
        model = cls.from_pretrained(a.init, hidden_dropout_prob=a.dropout, attention_probs_dropout_prob=a.dropout, **kw)
    else:
        fam = {}
        if a.model_type == "electra":
            fam["embedding_size"] = a.embedding_size or a.hidden
        cfg = config_cls(vocab_size=int(train.attrs["vocab_size"]), hidden_size=a.hidden, num_hidden_layers=a.layers,
                         num_attention_heads=a.heads, intermediate_size=a.intermediate, max_position_embeddings=a.max_pos,
                         type_vocab_size=a.type_vocab or (1 if a.model_type == "roberta" else 2), hidden_act="gelu",
                         hidden_dropout_prob=a.dropout, attention_probs_dropout_prob=a.dropout,
                         pad_token_id=int(train.attrs["pad_id"]), **fam, **kw)
        model = cls(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"hf_trainer: {type(model).__name__} ({a.model_type}), {n_params} parameters", flush=True)
    if a.padding == "longest":
        pad = PadCollator(train.pad_id, a.pad_multiple, train.T)
        collator = MlmCollator(train.attrs, model.config.vocab_size, pad=pad) if a.task == "mlm" else pad
    else:
        collator = MlmCollator(train.attrs, model.config.vocab_size) if a.task == "mlm" else plain_collate

    W, N = a.warmup, a.steps

    def lam(step):  # nlptrain's schedule (src/train/schedule.cpp), as a multiplier of the peak lr
        if W > 0 and step < W:
            return (step + 1) / W if not a.hf_warmup else step / W
        return max(0.0, (N - step) / max(1, N - W))

    counts = {"real": 0, "computed": 0, "batches": 0, "rows": 0}
    real_sums = []  # per step sum(attention_mask): a tensor, so that a GPU run does not synchronise each step
    step_ends = []  # time.perf_counter() after each training step (forward + backward; the optimizer
                    # step of step k falls between the ends of k and k+1); on a GPU a CUDA event recorded
                    # there instead: the host runs ahead of the device, so its clock times the launches

    class T(Trainer):
        def training_step(self, model, inputs, *args, **kwargs):
            am = inputs["attention_mask"]
            real_sums.append(am.sum())
            counts["computed"] += am.numel()
            counts["batches"] += 1
            counts["rows"] += am.shape[0]
            loss = super().training_step(model, inputs, *args, **kwargs)
            if a.device == "cuda":
                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
                step_ends.append(ev)
            else:
                step_ends.append(time.perf_counter())
            return loss

        def _get_train_sampler(self, *args, **kwargs):
            sampler = super()._get_train_sampler(*args, **kwargs)
            return GroupShuffled(sampler, a.batch, a.seed) if a.shuffle_groups and sampler is not None else sampler

        def create_scheduler(self, num_training_steps, optimizer=None):
            if self.lr_scheduler is None:
                self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer, lam)
            return self.lr_scheduler

    sampling = {}
    if a.group_by_length:
        import dataclasses
        names = {f.name for f in dataclasses.fields(TrainingArguments)}
        sampling = ({"group_by_length": True} if "group_by_length" in names
                    else {"train_sampling_strategy": "group_by_length"})
    args = TrainingArguments(
        output_dir=os.path.join(a.out, "trainer"), max_steps=a.steps, per_device_train_batch_size=a.batch // a.grad_accum,
        gradient_accumulation_steps=a.grad_accum, learning_rate=a.lr, weight_decay=a.weight_decay,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0, lr_scheduler_type="linear",
        warmup_steps=0, seed=a.seed, data_seed=a.seed, logging_steps=a.log_steps, save_strategy="no",
        eval_strategy="no", report_to=[], dataloader_num_workers=0, dataloader_pin_memory=a.device == "cuda", use_cpu=a.device == "cpu",
        remove_unused_columns=False, fp16=False, bf16=a.bf16, disable_tqdm=True, torch_compile=a.torch_compile,
        **sampling)
    trainer = T(model=model, args=args, train_dataset=train, data_collator=collator)
    t_train0 = time.time()
    tr = trainer.train()
    if a.device == "cuda":
        torch.cuda.synchronize()
    t_train = time.time() - t_train0
    counts["real"] = int(sum(int(x) for x in real_sums))
    t_ev0 = time.time()
    res = evaluate(model, evds, a.task, a.eval_batch, a.seed)
    t_eval = time.time() - t_ev0
    preds = res.pop("_predictions", None)
    if preds is not None:
        with open(os.path.join(a.out, "predictions.json"), "w") as f:
            json.dump(preds, f, ensure_ascii=False, indent=0)
    if a.task == "mlm":
        model.save_pretrained(os.path.join(a.out, "model"))
    with open(os.path.join(a.out, "log_history.jsonl"), "w") as f:
        for r in trainer.state.log_history:
            f.write(json.dumps(r) + "\n")
    out = {"task": a.task, "model_type": a.model_type, "model_class": type(model).__name__, "parameters": n_params,
           "max_position_embeddings": model.config.max_position_embeddings,
           "type_vocab_size": model.config.type_vocab_size, "eval": res, "steps": a.steps, "global_batch": a.batch, "lr": a.lr, "warmup": a.warmup,
           "train_s": t_train, "eval_s": t_eval, "wall_s": time.time() - t0, "threads": a.threads,
           "train_loss": tr.training_loss, "transformers": transformers.__version__, "torch": torch.__version__,
           "device": a.device if a.device == "cpu" else torch.cuda.get_device_name(0),
           "attn_implementation": getattr(model.config, "_attn_implementation", None)}
    # steady state: the median step after the first 20 (torch.compile's compilations and recompilations
    # for new batch lengths happen mostly in the first steps)
    if a.device == "cuda":  # synchronised after train(): every event has completed
        gaps = [a_.elapsed_time(b) / 1000.0 for a_, b in zip(step_ends, step_ends[1:])]
    else:
        gaps = [b - a_ for a_, b in zip(step_ends, step_ends[1:])]
    out.update(torch_compile=a.torch_compile, bf16=a.bf16,
               median_step_s_after_20=statistics.median(gaps[20:]) if len(gaps) > 20 else None)
    out.update(padding=a.padding, group_by_length=a.group_by_length, shuffle_groups=a.shuffle_groups, pad_multiple=a.pad_multiple,
               file_seq_len=train.T, trained_batches=counts["batches"], trained_rows=counts["rows"],
               real_tokens=counts["real"], computed_tokens=counts["computed"],
               real_tokens_per_s=counts["real"] / t_train,
               computed_tokens_per_s=counts["computed"] / t_train,
               mean_batch_len=counts["computed"] / max(1, counts["rows"]),
               padding_fraction=1 - counts["real"] / max(1, counts["computed"]))
    with open(os.path.join(a.out, "result.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
