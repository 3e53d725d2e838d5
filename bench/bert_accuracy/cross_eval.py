#!/usr/bin/env python3
"""Cross-check: evaluate nlptrain's trained weights (best.h5, exported with tools/hf_export.py) with the HF
side's evaluation code (hf_trainer.evaluate), and compare with the metrics nlptrain logged itself.
  cross_eval.py --task T --h5 OUT/best.h5 --eval FILE.h5 --metrics OUT/metrics.jsonl [--threads 2]
Prints one JSON line: nlptrain's own eval record, the HF-code evaluation of the same weights, and the
differences. Agreement (up to fp32 noise / argmax ties) means nlptrain's forward, weight file and
metric code agree with transformers + this script's metric code."""
import argparse, json, os, subprocess, sys, tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import hf_trainer as H

p = argparse.ArgumentParser()
p.add_argument("--task", required=True); p.add_argument("--h5", required=True); p.add_argument("--eval", required=True)
p.add_argument("--metrics", required=True); p.add_argument("--threads", type=int, default=2); p.add_argument("--seed", type=int, default=1234)
a = p.parse_args()
torch.set_num_threads(a.threads)
import transformers
transformers.logging.set_verbosity_error()
d = tempfile.mkdtemp(prefix="xeval_")
out = os.path.join(d, "m")
subprocess.run([sys.executable, "tools/hf_export.py", a.h5, out], check=True, stdout=subprocess.DEVNULL)
cfg = json.load(open(os.path.join(out, "config.json")))
cls = getattr(transformers, cfg["architectures"][0])
model = cls.from_pretrained(out)
ds = H.H5Rows(a.eval, a.task)
res = H.evaluate(model, ds, a.task, 64, a.seed)
res.pop("_predictions", None)
nl = [json.loads(l) for l in open(a.metrics)]
nl = [r for r in nl if r.get("split") == "eval"][-1]
diff = {k: res[k] - nl[k] for k in res if k in nl and isinstance(res[k], (int, float))}
print(json.dumps({"task": a.task, "nlptrain_logged": nl, "hf_code_on_nlptrain_weights": res, "diff": diff}))
