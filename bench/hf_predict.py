#!/usr/bin/env python3
"""Hugging Face side of bench/predict_speed.sh: transformers.Trainer.predict over an nlptrain doc_cls
HDF5 file (tools/prep_doc_cls.py output) with a model folder (tools/hf_export.py output), as a
practitioner predicts: the file's order, each batch padded to its longest row (the
DataCollatorWithPadding rule; bench/bert_accuracy/hf_trainer.py's H5Rows and PadCollator), eval batch
--batch, fp32 on the CPU with torch.set_num_threads(--threads), no dataloader workers.

  hf_predict.py --model DIR --data FILE.h5 --out result.json [--preds preds.npz --batch 32 --threads 2 --compile]

result.json: seconds (Trainer.predict alone, the model already loaded), examples, positions (the
padded positions computed: each batch at its longest row), real_tokens, loss, accuracy. --preds: an
.npz with labels (the argmax per example, in the file's order) and probs (the softmax), for the
agreement check.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "bert_accuracy"))
from hf_trainer import H5Rows, PadCollator  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="Hugging Face model folder (BertForSequenceClassification)")
    p.add_argument("--data", required=True, help="doc_cls HDF5 file")
    p.add_argument("--out", required=True, help="result.json")
    p.add_argument("--preds", help="labels and probabilities per example (.npz)")
    p.add_argument("--batch", type=int, default=32, help="per_device_eval_batch_size (default 32)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    p.add_argument("--compile", action="store_true", help="TrainingArguments(torch_compile=True)")
    a = p.parse_args(argv)

    from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments

    torch.set_num_threads(a.threads)
    model = AutoModelForSequenceClassification.from_pretrained(a.model)
    ds = H5Rows(a.data, "doc_cls", padding="longest")
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(output_dir=tmp, per_device_eval_batch_size=a.batch, use_cpu=True, report_to=[],
                                 dataloader_num_workers=0, disable_tqdm=True, torch_compile=a.compile)
        trainer = Trainer(model=model, args=args, data_collator=PadCollator(ds.pad_id, 1, ds.T))
        t0 = time.time()
        out = trainer.predict(ds)
        seconds = time.time() - t0
    logits = np.asarray(out.predictions, dtype=np.float64)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    labels = logits.argmax(axis=1)
    gold = ds.cols["labels"].numpy()
    lengths = ds.lengths.numpy()
    positions = sum(int(lengths[k:k + a.batch].max()) * len(lengths[k:k + a.batch])
                    for k in range(0, len(lengths), a.batch))
    res = dict(seconds=seconds, examples=int(len(labels)), positions=positions, real_tokens=int(lengths.sum()),
               loss=float(out.metrics.get("test_loss", float("nan"))), accuracy=float((labels == gold).mean()),
               batch=a.batch, threads=a.threads, compile=a.compile, torch=torch.__version__)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    if a.preds:
        np.savez(a.preds, labels=labels, probs=probs)
    print(f"hf_predict: {res['examples']} examples in {seconds:.1f} s ({res['examples'] / seconds:.0f} examples/s), "
          f"accuracy {res['accuracy']:.4f}, loss {res['loss']:.6f}")


if __name__ == "__main__":
    main()
