#!/usr/bin/env python3
"""nlptrain's INI keys for a DeepSpeed config and, optionally, the HF Trainer arguments it ran with.

    python3 tools/deepspeed_to_ini.py ds_config.json                          # print the INI lines
    python3 tools/deepspeed_to_ini.py ds_config.json --out zero.ini           # write them
    python3 tools/deepspeed_to_ini.py ds_config.json --ranks 8 --hf-args \\
        --per_device_train_batch_size 8 --learning_rate 5e-5 --bf16 --max_steps 1000
    python3 tools/deepspeed_to_ini.py ds_config.json --hf-args train_args.json   # or training_args.bin

Every setting of the config is accounted for: it becomes an nlptrain key (with a comment naming where
it came from), or it is named under "Not mapped" with the reason (no counterpart, or a value outside
nlptrain's range), or under "Nothing to map" when it changes nothing here (a feature switched off, a
DeepSpeed memory-layout option). The output is the [train], [comm] ... part of an input file: add the
[model] and [data] sections of the job, and run it on the ranks the comment names (mpirun -np N).

What maps (DeepSpeed -> nlptrain):
  zero_optimization.stage                   train.zero (0-3)
  zero_optimization.offload_optimizer       device cpu: train.offload = optimizer; none: train.offload = none
  zero_optimization.overlap_comm            comm.overlap
  zero_optimization.reduce_bucket_size      comm.bucket_mb: the same number of gradients per bucket, as
                                            nlptrain's fp32 gradients (elements x 4 bytes / 2^20)
  zero_optimization.stage3_prefetch_bucket_size
                                            train.zero_prefetch (stage 3): the transformer blocks whose
                                            parameters that many elements hold, at least 1 (a block holds
                                            12 h^2 + 13 h parameters; needs the hidden size h)
  train_micro_batch_size_per_gpu, gradient_accumulation_steps, train_batch_size
                                            train.batch_size (per rank), train.grad_accum; the ranks
                                            (train_batch_size = micro x accumulation x ranks) as a comment
  gradient_clipping                         train.clip
  bf16.enabled / fp16.enabled               train.precision = bf16, or fp32 when neither is on (tf32
                                            with HF --tf32); fp16 has no counterpart
  optimizer Adam / AdamW                    train.lr, train.beta1, train.beta2, train.adam_eps,
                                            train.weight_decay
  scheduler WarmupLR                        train.schedule = constant, train.warmup_steps, train.lr =
                                            warmup_max_lr (DeepSpeed's scheduler sets the lr)
  scheduler WarmupDecayLR                   train.schedule = linear, train.steps = total_num_steps,
                                            train.min_lr_ratio = warmup_min_lr / warmup_max_lr
  scheduler WarmupCosineLR                  train.schedule = cosine, train.min_lr_ratio = cos_min_ratio
HF Trainer arguments (--hf-args), used where the config says "auto" (as HF Trainer fills it: its
defaults where an argument is not given) and for what the config leaves to HF Trainer (its AdamW and
lr schedule when the config has no optimizer / scheduler section): per_device_train_batch_size,
gradient_accumulation_steps, learning_rate, weight_decay, adam_beta1/2, adam_epsilon, max_grad_norm,
lr_scheduler_type (linear, cosine, constant, constant_with_warmup, cosine_with_min_lr), warmup_steps
(a value below 1 is a ratio, like the older warmup_ratio: needs max_steps), num_train_epochs,
max_steps, seed, bf16, tf32, gradient_checkpointing, logging_steps, save_steps, eval_steps,
save_total_limit, output_dir, overwrite_output_dir, run_clm's block_size. A config value that is not
"auto" and differs from the HF argument (or its default) is an error, as HF Trainer refuses it.

Settings the config does not give are not printed: nlptrain's defaults apply to them (build/nlptrain
--help), and these are not always DeepSpeed's or HF's (the output lists the keys concerned).

--ranks N      the world size, to split train_batch_size into micro-batch and accumulation.
--hidden-size H  the model's hidden size, for "auto" bucket sizes (HF fills reduce_bucket_size = H^2,
               stage3_prefetch_bucket_size = 0.9 H^2) and the prefetch depth; by default taken from HF's
               --config_name / --model_name_or_path when it names a preset (gpt2, gpt2-medium, gpt2-large,
               gpt2-xl, bert-base-*, bert-large-*) or a folder with a config.json.
--json         print the mapping instead: {"keys": {key: value}, "sources": {key: where from}, "unmapped":
               [{"setting", "why"}], "nothing_to_map": [...], "defaults_apply": [keys], "ranks": N, "notes"}.
--hf-args ...  must come last: everything after it is HF's command line (run_clm's form, `--name value`,
               `--name=value`, a bare `--flag` meaning true), or one .json file of those arguments
               (run_clm's single-file form), or a training_args.bin that HF Trainer saved (needs torch).
Errors (unreadable or invalid JSON, a value of the wrong type, HF's mismatches) name the file and the
setting and exit 1; --out is written to a temporary file and renamed into place, never half-written.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_layout import ToolError, atomic_file, main_wrapper  # noqa: E402

PROG = "deepspeed_to_ini.py"

# HF TrainingArguments defaults of the arguments this tool reads (transformers 4.x and 5.x agree).
HF_DEFAULTS = {
    "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "learning_rate": 5e-5,
    "weight_decay": 0.0, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8, "max_grad_norm": 1.0,
    "lr_scheduler_type": "linear", "warmup_steps": 0, "warmup_ratio": 0.0, "num_train_epochs": 3.0,
    "max_steps": -1, "seed": 42, "bf16": False, "fp16": False, "bf16_full_eval": False,
    "fp16_full_eval": False, "tf32": None, "gradient_checkpointing": False, "optim": "adamw_torch",
    "lr_scheduler_kwargs": None, "logging_steps": 500, "save_steps": 500, "eval_steps": None,
    "save_total_limit": None, "output_dir": None, "overwrite_output_dir": False, "block_size": None,
}
HF_BOOL = {"bf16", "fp16", "bf16_full_eval", "fp16_full_eval", "tf32", "gradient_checkpointing",
           "overwrite_output_dir"}
HF_INT = {"per_device_train_batch_size", "gradient_accumulation_steps", "max_steps", "seed", "save_total_limit",
          "block_size"}
HF_FLOAT = {"learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm",
            "warmup_steps", "warmup_ratio", "num_train_epochs", "logging_steps", "save_steps", "eval_steps"}
# HF arguments read only to find the hidden size, or that describe the launch rather than training.
HF_MODEL = ("config_name", "model_name_or_path")
HF_NOTHING = {
    "deepspeed": "the DeepSpeed config itself (the positional argument of this tool)",
    "do_train": "nlptrain's run.mode = train (the default)",
    "local_rank": "set by the launcher; nlptrain's ranks come from mpirun",
}
# AdamW flavours of HF's --optim: the same update as nlptrain's AdamW.
HF_ADAMW = {"adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw_apex_fused", "adamw_torch_xla",
            "adamw_torch_npu_fused"}
HF_SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "constant",
                "constant_with_warmup": "constant", "cosine_with_min_lr": "cosine"}

# Hidden sizes of the names nlptrain has presets for (and HF's usual BERT names).
HIDDEN = {"gpt2": 768, "gpt2-medium": 1024, "gpt2-large": 1280, "gpt2-xl": 1600, "bert-base-uncased": 768,
          "bert-base-cased": 768, "bert-large-uncased": 1024, "bert-large-cased": 1024}

# nlptrain's keys this tool writes, with their type and range (their rows in src/config/config_keys.def).
SECTIONS = ("run", "data", "train", "comm", "eval", "checkpoint", "output")
RANGES = {
    "train.zero": ("int", 0, 3), "train.zero_prefetch": ("int", 1, None),
    "train.batch_size": ("int", 1, None), "train.grad_accum": ("int", 1, None),
    "train.steps": ("int", 1, None), "train.epochs": ("float>", 0, None),
    "train.lr": ("float>", 0, None), "train.min_lr_ratio": ("float", 0, 1),
    "train.warmup_steps": ("int", 0, None), "train.weight_decay": ("float", 0, None),
    "train.beta1": ("float[)", 0, 1), "train.beta2": ("float[)", 0, 1), "train.adam_eps": ("float>", 0, None),
    "train.clip": ("float", 0, None), "train.seed": ("int", 0, 2 ** 64 - 1),
    "comm.bucket_mb": ("float(]", 0, 4096), "data.seq_len": ("int", 0, None),
    "run.log_interval": ("int", 1, None), "checkpoint.interval": ("int", 0, None),
    "checkpoint.keep": ("int", 1, None), "eval.interval": ("int", 0, None),
}
CHOICES = {"train.offload": ("none", "optimizer"), "train.schedule": ("linear", "cosine", "constant"),
           "train.precision": ("fp32", "tf32", "bf16"), "train.recompute": ("none", "block")}
BOOLS = {"comm.overlap", "output.overwrite"}
STRINGS = {"output.dir"}
# The keys of each concept, listed at the end when the config leaves them to nlptrain's defaults.
CONCEPT_KEYS = ("train.zero", "train.batch_size", "train.grad_accum", "train.clip", "train.precision",
                "train.lr", "train.weight_decay", "train.beta1", "train.beta2", "train.adam_eps",
                "train.schedule", "train.warmup_steps")

# DeepSpeed settings with no counterpart, and why (the top level and zero_optimization).
NO_COUNTERPART = {
    "amp": "NVIDIA apex AMP: nlptrain's mixed precision is train.precision = bf16",
    "activation_checkpointing": "DeepSpeed's own checkpointing API (partitioned / CPU activations); "
                                "nlptrain's recomputation is train.recompute = block (HF --gradient_checkpointing)",
    "flops_profiler": "no profiler key of this kind; nlptrain's run.profile times the ops",
    "wall_clock_breakdown": "no counterpart; nlptrain's run.profile times the ops",
    "tensorboard": "nlptrain writes metrics.jsonl (tools/tensorboard_export.py converts it)",
    "wandb": "nlptrain writes metrics.jsonl; no logger integration",
    "csv_monitor": "nlptrain writes metrics.jsonl",
    "comms_logger": "no communication logger",
    "steps_per_print": "DeepSpeed's own progress print; nlptrain's log line follows run.log_interval "
                       "(HF --logging_steps)",
    "prescale_gradients": "nlptrain averages the gradients in fp32 after the sum; no pre-scaling",
    "gradient_predivide_factor": "nlptrain averages the gradients in fp32 after the sum; no pre-division",
    "communication_data_type": "nlptrain reduces the gradients in fp32; no other type",
    "sparse_gradients": "no sparse gradients",
    "checkpoint": "DeepSpeed's checkpoint tag and storage options; nlptrain's checkpoints are "
                  "checkpoint.interval / checkpoint.keep",
    "aio": "NVMe asynchronous I/O: nlptrain offloads to host memory only",
    "elasticity": "no elastic batch sizes",
    "autotuning": "no autotuner",
    "compression_training": "no compression training",
    "data_efficiency": "no curriculum or data sampling of DeepSpeed's",
    "curriculum_learning": "no curriculum learning",
    "sparse_attention": "no sparse attention",
    "pipeline": "no pipeline parallelism",
    "dump_state": "no counterpart",
    "memory_breakdown": "no counterpart; nlptrain --check prints the memory plan",
    "zero_allow_untested_optimizer": "no counterpart: nlptrain's optimizer is AdamW",
    "zero_force_ds_cpu_optimizer": "no counterpart: nlptrain's offloaded AdamW is its own host AdamW",
    "seq_parallel_communication_data_type": "no sequence parallelism",
}
ZERO_NO_COUNTERPART = {
    "allgather_bucket_size": "no bucket-size key for the all-gather of the updated parameters",
    "sub_group_size": "no optimizer sub-groups",
    "round_robin_gradients": "no counterpart",
    "stage3_max_live_parameters": "no limit on live gathered parameters other than train.zero_prefetch",
    "stage3_max_reuse_distance": "no reuse of gathered parameters by distance",
    "stage3_param_persistence_threshold": "no persistent small parameters: every block is gathered",
    "elastic_checkpoint": "no counterpart (nlptrain's checkpoints resume at any world size anyway)",
    "ignore_unused_parameters": "no counterpart",
    "zero_hpz_partition_size": "no hierarchical partitioning (ZeRO++)",
    "zero_quantized_weights": "no quantized weights (ZeRO++)",
    "zero_quantized_gradients": "no quantized gradients (ZeRO++)",
    "zero_quantized_nontrainable_weights": "no quantized weights (ZeRO++)",
    "mics_shard_size": "no MiCS sharding",
    "mics_hierarchical_params_gather": "no MiCS sharding",
    "memory_efficient_linear": "no counterpart",
    "offload_param": "nlptrain offloads the optimizer only (train.offload = optimizer); the parameters "
                     "stay on the device",
    "legacy_stage1": "no counterpart",
    "use_multi_rank_bucket_allreduce": "no counterpart",
    "pipeline_loading_checkpoint": "no counterpart",
    "override_module_apply": "no counterpart",
    "log_trace_cache_warnings": "no counterpart",
}
ZERO_NOTHING = {
    "contiguous_gradients": "a DeepSpeed memory-layout option: nlptrain's gradients are contiguous buffers",
    "stage3_gather_16bit_weights_on_model_save": "nlptrain's checkpoints hold the full weights at every "
                                                 "stage; tools/hf_export.py writes them",
    "stage3_gather_fp16_weights_on_model_save": "nlptrain's checkpoints hold the full weights at every "
                                                "stage; tools/hf_export.py writes them",
    "load_from_fp32_weights": "nlptrain's checkpoints keep the fp32 weights, which a resume loads",
}


def _dup_check(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError(f"duplicate key {k!r}")
        d[k] = v
    return d


def read_json(path: str, what: str):
    try:
        with open(path, "r", encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ToolError(f"{what} '{path}' not found") from None
    except IsADirectoryError:
        raise ToolError(f"{what} '{path}' is a folder (give the JSON file)") from None
    except UnicodeDecodeError as e:
        raise ToolError(f"{what} '{path}' is not UTF-8 text (byte offset {e.start})") from None
    except OSError as e:
        raise ToolError(f"cannot read {what} '{path}': {e.strerror}") from None
    try:
        obj = json.loads(text, object_pairs_hook=_dup_check)  # DeepSpeed refuses duplicate keys too
    except json.JSONDecodeError as e:
        raise ToolError(f"{what} '{path}' is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except ValueError as e:
        raise ToolError(f"{what} '{path}': {e}") from None
    if not isinstance(obj, dict):
        raise ToolError(f"{what} '{path}' is not a JSON object")
    return obj


def leaves(d, prefix=""):
    """Dotted paths of the non-dict values of a nested dict (a list is one value)."""
    for k, v in d.items():
        p = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            yield from leaves(v, p + ".")
        else:
            yield p


# ---- HF Trainer arguments -------------------------------------------------------------------------------

def _to_bool(name, v):
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("true", "1", "yes", "y", "t"):
        return True
    if s in ("false", "0", "no", "n", "f"):
        return False
    raise ToolError(f"HF argument --{name}: '{v}' is not a boolean (true/false)")


def _typed(name, v):
    if v is None:
        return None
    if name in HF_BOOL:
        return _to_bool(name, v)
    try:
        if name in HF_INT:
            if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
                raise ValueError
            return int(v) if not isinstance(v, str) else int(v.strip())
        if name in HF_FLOAT:
            if isinstance(v, bool):
                raise ValueError
            return float(v)
    except ValueError:
        what = "an integer" if name in HF_INT else "a number"
        raise ToolError(f"HF argument --{name}: '{v}' is not {what}") from None
    return v


def parse_hf_args(tokens):
    """{name: value} of the arguments given, names with '_' (HF also accepts '-')."""
    if len(tokens) == 1 and not tokens[0].startswith("-"):
        path = tokens[0]
        if path.endswith(".json"):
            given = read_json(path, "HF arguments file")
        elif path.endswith(".bin"):
            given = _training_args_bin(path)
        else:
            raise ToolError(f"--hf-args '{path}': give HF's arguments (--name value ...), a .json file of them "
                            f"or a training_args.bin")
        return {k.replace("-", "_"): _typed(k, v) for k, v in given.items()}
    out, i = {}, 0
    while i < len(tokens):
        t = tokens[i]
        if not t.startswith("--") or t == "--":
            raise ToolError(f"--hf-args: expected --name [value], got '{t}'")
        name, eq, val = t[2:].partition("=")
        name = name.replace("-", "_")
        if not eq:
            if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                val = tokens[i + 1]
                i += 1
            else:
                val = True  # a bare flag (HfArgumentParser's nargs='?', const=True)
        if name in out:
            raise ToolError(f"--hf-args: --{name} is given twice")
        out[name] = _typed(name, val)
        i += 1
    return out


def _training_args_bin(path):
    try:
        import torch
    except ImportError:
        raise ToolError(f"reading '{path}' needs torch (and transformers): pip install torch transformers, or give "
                        f"the arguments as --name value or a .json file") from None
    if not os.path.isfile(path):
        raise ToolError(f"HF arguments file '{path}' not found")
    try:
        obj = torch.load(path, weights_only=False)  # a pickled TrainingArguments: trust the file's author
    except Exception as e:  # unpickling raises many kinds
        raise ToolError(f"cannot read '{path}' as HF's training_args.bin: {e}") from None
    d = obj.to_dict() if hasattr(obj, "to_dict") else vars(obj)
    return {k: v for k, v in d.items() if k in HF_DEFAULTS and v is not None}


# ---- the mapping ------------------------------------------------------------------------------------------

def fmt(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if v == float(f"{v:.9g}") else f"{v:.9g}"
    return str(v)


class Mapper:
    def __init__(self, ds, ds_name, hf, ranks, hidden):
        self.ds, self.ds_name = ds, ds_name
        self.hf = hf                      # None: no --hf-args; else the arguments given
        self.ranks = ranks
        self.hidden = hidden
        self.keys = {}                    # nlptrain key -> value
        self.source = {}                  # nlptrain key -> comment
        self.unmapped = []                # (setting, why)
        self.nothing = []                 # (setting, why)
        self.notes = []                   # comment lines
        self.mismatches = []
        self.done = set()                 # DeepSpeed leaf paths accounted for
        self.hf_done = set()

    # -- bookkeeping
    def get(self, path, default=None):
        node = self.ds
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def has(self, path):
        return self.get(path, KeyError) is not KeyError

    def mark(self, path):
        """Count a setting (and everything under it) as accounted for."""
        self.done.add(path)
        v = self.get(path)
        if isinstance(v, dict):
            self.done.update(leaves(v, path + "."))

    def not_mapped(self, setting, why, path=None):
        self.unmapped.append((setting, why))
        if path:
            self.mark(path)

    def no_effect(self, setting, why, path=None):
        self.nothing.append((setting, why))
        if path:
            self.mark(path)

    def put(self, key, value, source):
        """Set an nlptrain key after checking it against the schema's type and range; False (and the
        setting named as not mapped) when the value is outside."""
        if value is None:  # an unresolved value: already named
            return False
        why = self.out_of_range(key, value)
        if why:
            self.unmapped.append((source, f"{key} = {fmt(value)} is outside nlptrain's range ({why})"))
            return False
        self.keys[key] = value
        self.source[key] = source
        return True

    @staticmethod
    def out_of_range(key, v):
        if key in CHOICES:
            return None if v in CHOICES[key] else "one of " + ", ".join(CHOICES[key])
        if key in BOOLS:
            return None if isinstance(v, bool) else "true or false"
        if key in STRINGS:
            return None if isinstance(v, str) and v.strip() else "a non-empty text"
        kind, lo, hi = RANGES[key]
        if kind == "int" and (not isinstance(v, int) or isinstance(v, bool)):
            return "an integer"
        ok_lo = v > lo if kind in ("float>", "float(]") else v >= lo
        ok_hi = hi is None or (v < hi if kind == "float[)" else v <= hi)
        if ok_lo and ok_hi:
            return None
        left = "(" if kind in ("float>", "float(]") else "["
        right = ")" if kind == "float[)" else "]"
        return f"{left}{lo}, {hi if hi is not None else 'inf'}{right}"

    # -- values
    def hfv(self, name):
        """An HF argument's value: given, else HF's default."""
        self.hf_done.add(name)
        return self.hf[name] if name in self.hf else HF_DEFAULTS[name]

    def hf_src(self, name):
        return f"HF --{name} {fmt(self.hfv(name))}" + ("" if name in self.hf else " (HF's default)")

    def num(self, path, hf_name=None, hf_value=None, integer=False, fill_only=False):
        """A number of the config (None when absent): 'auto' resolved from HF's arguments (None and named
        as not mapped without --hf-args), a non-auto value checked against HF's like HF Trainer does."""
        v = self.get(path)
        if v is None:
            return None, None
        src = f"ds {path} = {json.dumps(v)}"
        hf_val = hf_value if hf_value is not None else (self.hfv(hf_name) if hf_name and self.hf is not None else None)
        if v == "auto":
            if self.hf is None:
                self.not_mapped(path, "'auto' is filled in by HF Trainer from its arguments: give them with "
                                      "--hf-args", path)
                return None, None
            if hf_val is None:
                self.not_mapped(path, "'auto' that HF Trainer fills from the run (the model or the dataset size), "
                                      "which this tool does not know here", path)
                return None, None
            self.mark(path)
            return hf_val, src + (f" <- {self.hf_src(hf_name)}" if hf_name else f" <- {fmt(hf_val)}")
        ok = (isinstance(v, (int, float)) and not isinstance(v, bool)) or (isinstance(v, list) and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in v))
        if not ok or (integer and isinstance(v, float) and not v.is_integer()):
            raise ToolError(f"DeepSpeed config '{self.ds_name}': {path} = {json.dumps(v)} is not "
                            f"{'an integer' if integer else 'a number'} or \"auto\"")
        if self.hf is not None and hf_name and not fill_only and hf_val is not None and v != hf_val:
            self.mismatches.append(f"{path} = {json.dumps(v)} vs HF --{hf_name} = {json.dumps(hf_val)}"
                                   + ("" if hf_name in self.hf else " (HF's default)"))
        self.mark(path)
        return (int(v) if integer else v), src

    def flag(self, path, hf_value=None, hf_name=None):
        v = self.get(path)
        if v == "auto":
            if self.hf is None:
                self.not_mapped(path, "'auto' is filled in by HF Trainer from its arguments: give them with "
                                      "--hf-args", path)
                return None
            self.mark(path)
            return bool(hf_value)
        if not isinstance(v, bool):
            raise ToolError(f"DeepSpeed config '{self.ds_name}': {path} = {json.dumps(v)} is not true, false or "
                            f"\"auto\"")
        if self.hf is not None and hf_name and v != bool(hf_value):
            self.mismatches.append(f"{path} = {json.dumps(v)} vs HF --{hf_name} = {json.dumps(bool(hf_value))}")
        self.mark(path)
        return v

    # -- sections
    def run(self):
        self.zero()
        self.batch()
        self.clipping()
        self.precision()
        self.optimizer()
        self.scheduler()
        if self.hf is not None:
            self.hf_rest()
        self.other_top_level()
        for p in leaves(self.ds):
            if p not in self.done and not any(p.startswith(d + ".") for d in self.done):
                self.not_mapped(p, "not known to this tool: no counterpart in nlptrain that it knows of", p)
        if self.mismatches:
            raise ToolError("HF Trainer refuses these DeepSpeed values, which differ from its arguments (set them "
                            "to \"auto\" or change the argument):\n  " + "\n  ".join(self.mismatches))

    def zero(self):
        z = self.get("zero_optimization")
        if z is None:
            return
        if isinstance(z, bool):  # the old form: true = stage 1
            self.put("train.zero", int(z), f"ds zero_optimization = {json.dumps(z)} (the old form of stage 1 / 0)")
            self.mark("zero_optimization")
            return
        if not isinstance(z, dict):
            raise ToolError(f"DeepSpeed config '{self.ds_name}': zero_optimization is not a JSON object or a "
                            f"boolean")
        self.mark_if("zero_optimization")
        stage = 0
        if "stage" in z:
            stage, src = self.num("zero_optimization.stage", integer=True)
            self.put("train.zero", stage, src)
            stage = stage or 0
        # offload_optimizer (and the legacy stage-2 cpu_offload boolean)
        off = z.get("offload_optimizer")
        if isinstance(off, dict):
            dev = off.get("device", "none")
            p = "zero_optimization.offload_optimizer"
            if dev == "cpu":
                self.put("train.offload", "optimizer", f"ds {p}.device = \"cpu\"")
                self.done.add(p + ".device")
                for k in off:
                    if k == "pin_memory":
                        self.no_effect(f"{p}.pin_memory", "no key: nlptrain decides the host copy's pinning",
                                       f"{p}.pin_memory")
                    elif k == "ratio" and off[k] != 1:
                        self.not_mapped(f"{p}.ratio", "a partial offload: nlptrain offloads the whole optimizer "
                                        "shard (train.offload = optimizer)", f"{p}.ratio")
                    elif k == "ratio":
                        self.no_effect(f"{p}.ratio", "1: the whole shard, as nlptrain offloads it", f"{p}.ratio")
                    elif k in ("nvme_path", "buffer_count", "buffer_size", "pipeline", "pipeline_read",
                               "pipeline_write", "fast_init", "max_in_cpu"):
                        self.no_effect(f"{p}.{k}", "an NVMe / DeepSpeed CPU-optimizer option; nlptrain offloads "
                                       "to host memory with its own AdamW", f"{p}.{k}")
            elif dev == "nvme":
                self.not_mapped(p, "device nvme: nlptrain offloads to host memory only (train.offload = optimizer)",
                                p)
            elif dev in ("none", None):
                self.put("train.offload", "none", f"ds {p}.device = \"none\"")
                self.mark(p)
            else:
                raise ToolError(f"DeepSpeed config '{self.ds_name}': {p}.device = {json.dumps(dev)} is not cpu, "
                                f"nvme or none")
        elif off is not None:
            raise ToolError(f"DeepSpeed config '{self.ds_name}': zero_optimization.offload_optimizer is not a JSON "
                            f"object")
        if "cpu_offload" in z:
            v = self.flag("zero_optimization.cpu_offload")
            if v is not None and "train.offload" not in self.keys:
                self.put("train.offload", "optimizer" if v else "none",
                         f"ds zero_optimization.cpu_offload = {json.dumps(v)}")
        op = z.get("offload_param")
        if isinstance(op, dict) and op.get("device", "none") in ("none", None):
            self.no_effect("zero_optimization.offload_param", "device none: nothing offloaded",
                           "zero_optimization.offload_param")
        if "overlap_comm" in z:
            v = self.flag("zero_optimization.overlap_comm")
            if v is not None:
                self.put("comm.overlap", v, f"ds zero_optimization.overlap_comm = {json.dumps(v)}")
        h = self.hidden_size()
        if "reduce_bucket_size" in z:
            n, src = self.num("zero_optimization.reduce_bucket_size", hf_value=h * h if h else None,
                              fill_only=True)
            if n is not None:
                mb = float(f"{n * 4 / 2 ** 20:.6g}")
                self.put("comm.bucket_mb", mb, f"{src} elements, as fp32 gradients")
        for k, why in (("allgather_partitions", "nlptrain all-gathers the updated shards (true, DeepSpeed's "
                        "default); false (a broadcast per partition) has no counterpart"),
                       ("reduce_scatter", "nlptrain reduce-scatters the gradients at stages 1-3 (true, "
                        "DeepSpeed's default); false (an allreduce) has no counterpart")):
            if k in z:
                p = f"zero_optimization.{k}"
                if z[k] is True:
                    self.no_effect(p, why.split(";")[0], p)
                else:
                    self.not_mapped(p, why, p)
        if "stage3_prefetch_bucket_size" in z:
            p = "zero_optimization.stage3_prefetch_bucket_size"
            if stage != 3:
                self.no_effect(p, f"applies to stage 3 only (the config has stage {stage})", p)
            else:
                n, src = self.num(p, hf_value=int(0.9 * h * h) if h else None, fill_only=True)
                if n is not None:
                    if not h:
                        self.not_mapped(p, "the prefetch depth in blocks needs the model's hidden size: give "
                                           "--hidden-size (or HF --config_name)")
                    else:
                        block = 12 * h * h + 13 * h
                        depth = max(1, math.ceil(n / block))
                        self.put("train.zero_prefetch", depth,
                                 f"{src} elements / {block} per block (hidden size {h}), at least 1")
        for k in z:
            p = f"zero_optimization.{k}"
            if k in ZERO_NO_COUNTERPART and p not in self.done:
                self.not_mapped(p, ZERO_NO_COUNTERPART[k], p)
            elif k in ZERO_NOTHING and p not in self.done:
                self.no_effect(p, ZERO_NOTHING[k], p)

    def mark_if(self, path):
        if isinstance(self.get(path), dict) and not self.get(path):
            self.done.add(path)

    def hidden_size(self):
        if self.hidden:
            return self.hidden
        if self.hf:
            for name in HF_MODEL:
                v = self.hf.get(name)
                if not isinstance(v, str):
                    continue
                base = v.rstrip("/").rsplit("/", 1)[-1]  # a Hub id: openai-community/gpt2
                if not Path(v).is_dir() and base in HIDDEN:
                    return HIDDEN[base]
                cfg = Path(v) / "config.json"
                if cfg.is_file():
                    c = read_json(str(cfg), "model config")
                    for k in ("hidden_size", "n_embd"):
                        if isinstance(c.get(k), int):
                            return c[k]
        return None

    def batch(self):
        hf = self.hf is not None
        micro, src_m = self.num("train_micro_batch_size_per_gpu", "per_device_train_batch_size", integer=True)
        accum, src_a = self.num("gradient_accumulation_steps", "gradient_accumulation_steps", integer=True)
        # train_batch_size: HF fills ranks x per-device x accumulation (needs --ranks)
        tbs_raw = self.get("train_batch_size")
        tbs = None
        if tbs_raw == "auto" and hf:
            self.mark("train_batch_size")
            if self.ranks:
                tbs = self.ranks * self.hfv("per_device_train_batch_size") * self.hfv("gradient_accumulation_steps")
        elif tbs_raw is not None:
            calc = (self.ranks * self.hfv("per_device_train_batch_size") * self.hfv("gradient_accumulation_steps")
                    if hf and self.ranks else None)
            tbs, _ = self.num("train_batch_size", integer=True, hf_value=calc)
            if hf and calc is not None and tbs is not None and tbs != calc:
                self.mismatches.append(f"train_batch_size = {tbs} vs HF's {self.ranks} ranks x "
                                       f"--per_device_train_batch_size x --gradient_accumulation_steps = {calc}")
        if micro is None and accum is None and tbs_raw is None and hf:
            # Nothing in the config: HF Trainer (through accelerate) gives DeepSpeed its own batch sizes.
            micro, src_m = self.hfv("per_device_train_batch_size"), self.hf_src("per_device_train_batch_size")
            accum, src_a = self.hfv("gradient_accumulation_steps"), self.hf_src("gradient_accumulation_steps")
        for v, name in ((micro, "train_micro_batch_size_per_gpu"), (accum, "gradient_accumulation_steps"),
                        (tbs, "train_batch_size")):
            if v is not None and v < 1:
                raise ToolError(f"DeepSpeed config '{self.ds_name}': {name} = {v} must be >= 1")
        ranks = self.ranks
        if micro is not None and accum is not None:
            if tbs is not None:
                if tbs % (micro * accum):
                    raise ToolError(f"DeepSpeed config '{self.ds_name}': train_batch_size = {tbs} is not "
                                    f"train_micro_batch_size_per_gpu x gradient_accumulation_steps = {micro * accum} "
                                    f"x a number of ranks (DeepSpeed refuses it)")
                implied = tbs // (micro * accum)
                if ranks and ranks != implied:
                    raise ToolError(f"DeepSpeed config '{self.ds_name}': train_batch_size = {tbs} = {micro} x "
                                    f"{accum} x {implied} ranks, not --ranks {ranks} (DeepSpeed refuses it)")
                ranks = implied
        elif tbs is not None and (micro is not None or accum is not None):
            known = micro if micro is not None else accum
            if not ranks:
                given, missing = (("train_micro_batch_size_per_gpu", "gradient_accumulation_steps") if micro is not None
                                  else ("gradient_accumulation_steps", "train_micro_batch_size_per_gpu"))
                why = (f"DeepSpeed derives {missing} from train_batch_size = {tbs}, {given} = {known} and the world "
                       f"size: give --ranks")
                self.not_mapped("train_batch_size", why)
                self.not_mapped(given, why)
                micro = accum = None
            else:
                other, rem = divmod(tbs, known * ranks)
                if rem or other < 1:
                    raise ToolError(f"DeepSpeed config '{self.ds_name}': train_batch_size = {tbs} is not a "
                                    f"multiple of {known} x {ranks} ranks (DeepSpeed refuses it)")
                why = f"train_batch_size {tbs} / ({known} x {ranks} ranks)"
                if micro is None:
                    micro, src_m = other, why
                else:
                    accum, src_a = other, why
        elif tbs is not None:
            if not ranks:
                self.not_mapped("train_batch_size", "the micro-batch per rank is train_batch_size / the world "
                                                    "size: give --ranks")
            else:
                if tbs % ranks:
                    raise ToolError(f"DeepSpeed config '{self.ds_name}': train_batch_size = {tbs} is not a multiple "
                                    f"of {ranks} ranks (DeepSpeed refuses it)")
                micro, src_m = tbs // ranks, f"train_batch_size {tbs} / {ranks} ranks"
                accum, src_a = 1, "DeepSpeed's default with train_batch_size alone"
        elif micro is not None and accum is None:
            accum, src_a = 1, "DeepSpeed's default gradient_accumulation_steps"
        if micro is not None:
            self.put("train.batch_size", micro, src_m)
        if accum is not None and micro is not None:
            self.put("train.grad_accum", accum, src_a)
        elif accum is not None and tbs is None:
            self.not_mapped("gradient_accumulation_steps", "without a micro-batch or train_batch_size DeepSpeed "
                                                           "refuses the config")
        given = f"ds train_batch_size = {json.dumps(tbs_raw)}: " if tbs_raw is not None else ""
        if ranks and micro is not None and accum is not None:
            self.ranks = ranks
            self.notes.append(f"{given}run on {ranks} ranks (mpirun -np {ranks}): global batch {ranks} x {micro} x "
                              f"{accum} = {ranks * micro * accum}")
        elif tbs_raw == "auto" and hf:
            self.notes.append(f"{given}HF fills ranks x per-device batch x accumulation; the ranks are mpirun's -np")

    def clipping(self):
        if not self.has("gradient_clipping"):
            return
        v, src = self.num("gradient_clipping", "max_grad_norm")
        if v is not None:
            self.put("train.clip", float(v), src)

    def precision(self):
        hf = self.hf is not None
        fp16 = bf16 = False
        unknown = False  # an "auto" left unresolved (no --hf-args): the precision is not known
        bf16_section = None
        for sec in ("bf16", "bfloat16"):
            if isinstance(self.get(sec), dict):
                bf16_section = sec
                if "enabled" in self.get(sec):
                    v = self.flag(f"{sec}.enabled", hf and (self.hfv("bf16") or self.hfv("bf16_full_eval")),
                                  "bf16" if hf else None)
                    unknown |= v is None
                    bf16 = bf16 or bool(v)
                for k in self.get(sec):
                    if k != "enabled":
                        self.not_mapped(f"{sec}.{k}", "no counterpart (nlptrain's bf16 keeps fp32 weights, "
                                        "gradients and AdamW state)", f"{sec}.{k}")
        fp16_section = isinstance(self.get("fp16"), dict)
        if fp16_section and "enabled" in self.get("fp16"):
            v = self.flag("fp16.enabled", hf and (self.hfv("fp16") or self.hfv("fp16_full_eval")),
                          "fp16" if hf else None)
            unknown |= v is None
            fp16 = bool(v)
        elif not fp16_section and hf and (self.hfv("fp16") or self.hfv("fp16_full_eval")):
            fp16 = True  # accelerate adds {"fp16": {"enabled": true}} for HF --fp16
        if bf16_section is None and hf and (self.hfv("bf16") or self.hfv("bf16_full_eval")):
            bf16 = True  # accelerate adds {"bf16": {"enabled": true}} for HF --bf16
        for k in (self.get("fp16") if fp16_section else {}):
            p = f"fp16.{k}"
            if k == "enabled":
                continue
            if fp16:
                self.not_mapped(p, "fp16 loss scaling: nlptrain has no fp16, and its bf16 needs no loss scaling", p)
            elif unknown:
                self.not_mapped(p, "fp16 loss scaling (nlptrain has no fp16), for when fp16 is on", p)
            else:
                self.no_effect(p, "fp16 loss scaling, and fp16 is off", p)
        if fp16 and bf16:
            raise ToolError(f"DeepSpeed config '{self.ds_name}': fp16 and bf16 are both enabled (DeepSpeed refuses "
                            f"it)")
        if fp16:
            self.not_mapped("fp16.enabled" + ("" if fp16_section else " (HF --fp16)"),
                            "nlptrain has no fp16 arithmetic (train.precision: fp32, tf32, bf16); bf16 is the nearest "
                            "and needs no loss scaling")
        elif bf16:
            if bf16_section is None:
                src = "HF --bf16 (accelerate adds bf16.enabled = true to the DeepSpeed config)"
            else:
                src = f"ds {bf16_section}.enabled = {json.dumps(self.get(bf16_section + '.enabled'))}" + (
                    " <- HF --bf16" if hf and self.get(bf16_section + ".enabled") == "auto" else "")
            self.put("train.precision", "bf16", src)
        elif not unknown:
            tf32 = hf and bool(self.hfv("tf32"))
            self.put("train.precision", "tf32" if tf32 else "fp32",
                     "neither fp16 nor bf16 enabled: DeepSpeed trains in fp32" + (", HF --tf32" if tf32 else ""))
        if self.has("amp"):
            enabled = isinstance(self.get("amp"), dict) and self.get("amp").get("enabled") is True
            (self.not_mapped if enabled else self.no_effect)("amp", NO_COUNTERPART["amp"] if enabled
                                                             else "apex AMP, switched off", "amp")

    def optimizer(self):
        hf = self.hf is not None
        opt = self.get("optimizer")
        if opt is None:
            if hf:  # HF Trainer builds its own optimizer from its arguments
                optim = str(self.hfv("optim"))
                if optim not in HF_ADAMW:
                    self.not_mapped(f"HF --optim {optim}", "nlptrain's optimizer is AdamW only")
                    return
                for key, name in (("train.lr", "learning_rate"), ("train.weight_decay", "weight_decay"),
                                  ("train.beta1", "adam_beta1"), ("train.beta2", "adam_beta2"),
                                  ("train.adam_eps", "adam_epsilon")):
                    self.put(key, float(self.hfv(name)), self.hf_src(name))
            return
        if not isinstance(opt, dict):
            raise ToolError(f"DeepSpeed config '{self.ds_name}': optimizer is not a JSON object")
        kind = str(opt.get("type", ""))
        self.done.add("optimizer.type")
        params = opt.get("params", {}) or {}
        if not isinstance(params, dict):
            raise ToolError(f"DeepSpeed config '{self.ds_name}': optimizer.params is not a JSON object")
        if kind.lower() not in ("adam", "adamw"):
            self.not_mapped(f"optimizer.type = {kind}", "nlptrain's optimizer is AdamW only", "optimizer")
            return
        if kind.lower() == "adam" and params.get("adam_w_mode", True) is False:
            self.not_mapped("optimizer.params.adam_w_mode", "false: Adam with L2-coupled weight decay; nlptrain's "
                            "AdamW decouples it", "optimizer.params.adam_w_mode")
        elif "adam_w_mode" in params:
            self.no_effect("optimizer.params.adam_w_mode", "true: decoupled weight decay, as nlptrain's AdamW",
                           "optimizer.params.adam_w_mode")
        self.notes.append(f"ds optimizer.type = {kind}: nlptrain's AdamW (train.lr, beta1, beta2, adam_eps, "
                          f"weight_decay)")
        p = "optimizer.params."
        lr, src = self.num(p + "lr", "learning_rate")
        if lr is not None:
            self.put("train.lr", float(lr), src)
        betas, src = self.num(p + "betas", hf_value=[self.hfv("adam_beta1"), self.hfv("adam_beta2")] if hf else None)
        if betas is not None:
            if not isinstance(betas, list) or len(betas) != 2:
                raise ToolError(f"DeepSpeed config '{self.ds_name}': optimizer.params.betas is not a list of two "
                                f"numbers")
            if hf and self.get(p + "betas") != "auto" and betas != [self.hfv("adam_beta1"), self.hfv("adam_beta2")]:
                self.mismatches.append(f"optimizer.params.betas = {json.dumps(betas)} vs HF --adam_beta1 "
                                       f"--adam_beta2 = {json.dumps([self.hfv('adam_beta1'), self.hfv('adam_beta2')])}")
            self.put("train.beta1", float(betas[0]), src)
            self.put("train.beta2", float(betas[1]), src)
        eps, src = self.num(p + "eps", "adam_epsilon")
        if eps is not None:
            self.put("train.adam_eps", float(eps), src)
        wd, src = self.num(p + "weight_decay", "weight_decay")
        if wd is not None:
            self.put("train.weight_decay", float(wd), src)
            if wd > 0:
                self.not_mapped("optimizer.params.weight_decay (on biases and LayerNorm weights)",
                                "DeepSpeed's optimizer decays every parameter; nlptrain's AdamW, as HF Trainer's own, "
                                "exempts biases and LayerNorm weights")
        for k, v in params.items():
            q = p + k
            if q in self.done:
                continue
            if k == "torch_adam":
                self.no_effect(q, "which Adam kernel DeepSpeed runs: the same update", q)
            elif k == "amsgrad" and v is False or k == "bias_correction" and v is True:
                self.no_effect(q, "as nlptrain's AdamW", q)
            elif k in ("amsgrad", "bias_correction"):
                self.not_mapped(q, f"{k} = {json.dumps(v)}: nlptrain's AdamW is bias-corrected, without amsgrad", q)

    def scheduler(self):
        hf = self.hf is not None
        sch = self.get("scheduler")
        steps_from_ds = False
        if sch is None:
            if hf:
                self.hf_schedule()
            return
        if not isinstance(sch, dict):
            raise ToolError(f"DeepSpeed config '{self.ds_name}': scheduler is not a JSON object")
        kind = str(sch.get("type", ""))
        self.done.add("scheduler.type")
        params = sch.get("params", {}) or {}
        p = "scheduler.params."
        if kind not in ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR"):
            self.not_mapped(f"scheduler.type = {kind}", "nlptrain's schedules are a linear warmup, then "
                            "constant, linear or cosine (train.schedule)", "scheduler")
            return
        max_steps = self.hfv("max_steps") if hf else -1
        total = None
        if kind in ("WarmupDecayLR", "WarmupCosineLR") and "total_num_steps" in params:
            if params["total_num_steps"] == "auto" and hf:
                self.mark(p + "total_num_steps")
                if max_steps > 0:
                    total = max_steps
                # else: HF's steps come from num_train_epochs and the dataset: train.epochs below
            else:
                total, src = self.num(p + "total_num_steps", integer=True)
                if total is not None:
                    if hf and max_steps > 0 and total != max_steps:
                        self.mismatches.append(f"scheduler.params.total_num_steps = {total} vs HF's training steps "
                                               f"--max_steps = {max_steps}")
                    steps_from_ds = self.put("train.steps", total, src + " (the schedule's end)")
        self.hf_length(skip_steps=steps_from_ds)
        total = total or (self.keys.get("train.steps"))
        # warmup (DeepSpeed's default: 1000 steps)
        wn = params.get("warmup_num_steps")
        w = src = None
        if wn == "auto" and hf:
            self.mark(p + "warmup_num_steps")
            w = self.hf_warmup(total)
            if w is not None:
                w, src = max(1, w), (f"ds {p}warmup_num_steps = \"auto\" <- HF's warmup steps (at least 1, as HF "
                                     f"fills it)")
        elif wn is not None:
            w, src = self.num(p + "warmup_num_steps", integer=True)
            expect = self.hf_warmup(total, quiet=True) if hf and w is not None else None
            if expect is not None and w != max(1, expect):  # HF fills max(1, its warmup) and compares
                self.mismatches.append(f"scheduler.params.warmup_num_steps = {w} vs HF --warmup_steps = "
                                       f"{max(1, expect)}" + ("" if "warmup_steps" in self.hf else " (HF's default 0, "
                                                              "filled as 1)"))
        else:
            w, src = 1000, f"{kind}'s default warmup_num_steps"
        if w is not None:
            if kind != "WarmupCosineLR" and w < 2:  # WarmupLR takes max(2, warmup_num_steps)
                w, src = 2, src + " (DeepSpeed's WarmupLR warms up over at least 2 steps)"
            self.put("train.warmup_steps", w, src)
        wtype = params.get("warmup_type", "log")
        if wtype == "linear":
            self.no_effect(p + "warmup_type", "linear, as nlptrain's warmup", p + "warmup_type")
        else:
            self.not_mapped(p + "warmup_type" + ("" if "warmup_type" in params else " (DeepSpeed's default log)"),
                            f"{wtype}: nlptrain's warmup rises linearly (lr x (step + 1) / train.warmup_steps), "
                            f"DeepSpeed's log warmup as log(step + 1) / log(warmup_num_steps)", p + "warmup_type"
                            if "warmup_type" in params else None)
        if kind == "WarmupCosineLR":
            self.put("train.schedule", "cosine", f"ds scheduler.type = {kind}")
            cos, src = self.num(p + "cos_min_ratio") if "cos_min_ratio" in params else (0.0001, f"{kind}'s default "
                                                                                         f"cos_min_ratio")
            if cos is not None:
                self.put("train.min_lr_ratio", float(cos), src)
            wmr, _ = self.num(p + "warmup_min_ratio") if "warmup_min_ratio" in params else (0, None)
            if wmr:
                self.not_mapped(p + "warmup_min_ratio", "the warmup starts above 0; nlptrain's starts from 0")
            return
        self.put("train.schedule", "constant" if kind == "WarmupLR" else "linear", f"ds scheduler.type = {kind}")
        lo = hi = None
        if "warmup_max_lr" in params:
            hi, src = self.num(p + "warmup_max_lr", "learning_rate")
        else:
            hi, src = 0.001, f"{kind}'s default warmup_max_lr"
        if "warmup_min_lr" in params:
            lo, _ = self.num(p + "warmup_min_lr", hf_value=0, fill_only=True)
        else:
            lo = 0.0
        if hi is not None:
            if "train.lr" in self.keys:
                self.notes.append(f"{self.source['train.lr']}: replaced by the scheduler's warmup_max_lr {fmt(hi)}, "
                                  f"which sets the lr" + ("" if self.keys["train.lr"] == hi else
                                                          f" (not the optimizer's {fmt(self.keys['train.lr'])})"))
            self.keys.pop("train.lr", None)
            self.put("train.lr", float(hi), src + " (DeepSpeed's scheduler sets the lr)")
        if lo:
            self.not_mapped(p + "warmup_min_lr", f"{fmt(lo)}: the warmup starts there; nlptrain's warmup starts "
                            f"from 0" + (" (the decay's floor is train.min_lr_ratio)" if kind == "WarmupDecayLR"
                                         else ""))
        if kind == "WarmupDecayLR" and hi:
            self.put("train.min_lr_ratio", float(lo or 0) / float(hi), f"ds {p}warmup_min_lr / warmup_max_lr = "
                     f"{fmt(lo or 0)} / {fmt(hi)}: the decay's end")

    def hf_warmup(self, total, quiet=False):
        """HF's warmup steps (get_warmup_steps), or None (and, unless quiet, named as not mapped)."""
        ws = self.hfv("warmup_steps")
        ratio = self.hf.get("warmup_ratio") if "warmup_ratio" in self.hf else None
        if ratio is not None:
            self.hf_done.add("warmup_ratio")
        if ws >= 1:
            return int(ws)
        ratio = ws if ws > 0 else (ratio or 0)
        if ratio == 0:
            return 0
        if total:
            return math.ceil(total * ratio)
        if quiet:
            return None
        self.not_mapped(f"HF warmup ratio {fmt(ratio)}", "a ratio of the run's steps, which HF computes from the "
                        "dataset; give --max_steps, or set train.warmup_steps")
        return None

    def hf_length(self, skip_steps=False):
        """train.steps from HF --max_steps, else train.epochs from --num_train_epochs."""
        if self.hf is None or getattr(self, "_length_done", False):
            return
        self._length_done = True
        ms = self.hfv("max_steps")
        if skip_steps:
            self.hf_done.add("num_train_epochs")
            return
        if ms > 0:
            self.put("train.steps", ms, self.hf_src("max_steps"))
            self.hf_done.add("num_train_epochs")
        else:
            self.put("train.epochs", float(self.hfv("num_train_epochs")), self.hf_src("num_train_epochs"))

    def hf_schedule(self):
        kind = str(self.hfv("lr_scheduler_type"))
        self.hf_length()
        if kind not in HF_SCHEDULES:
            self.not_mapped(f"HF --lr_scheduler_type {kind}", "nlptrain's schedules are a linear warmup, then "
                            "constant, linear or cosine (train.schedule)")
            return
        self.put("train.schedule", HF_SCHEDULES[kind], self.hf_src("lr_scheduler_type"))
        if kind == "constant":
            self.put("train.warmup_steps", 0, "HF's constant schedule has no warmup")
            self.hf_done.update({"warmup_steps", "warmup_ratio"})
        else:
            w = self.hf_warmup(self.keys.get("train.steps"))
            if w is not None:
                self.put("train.warmup_steps", w, "HF --warmup_steps" + ("" if "warmup_steps" in self.hf else
                                                                         " (HF's default)"))
        if kind != "constant" and kind != "constant_with_warmup":
            ratio = 0.0
            if kind == "cosine_with_min_lr":
                kw = self.hfv("lr_scheduler_kwargs")
                if isinstance(kw, str):
                    try:
                        kw = json.loads(kw)
                    except ValueError:
                        raise ToolError(f"HF argument --lr_scheduler_kwargs: '{kw}' is not JSON") from None
                if not isinstance(kw, dict) or "min_lr_rate" not in kw:
                    self.not_mapped("HF --lr_scheduler_type cosine_with_min_lr", "needs --lr_scheduler_kwargs "
                                    "'{\"min_lr_rate\": r}' (min_lr in absolute terms has no counterpart)")
                    return
                ratio = float(kw["min_lr_rate"])
            self.put("train.min_lr_ratio", ratio, f"HF's {kind} schedule decays to {fmt(ratio)} x lr")

    def hf_rest(self):
        hf = self.hf
        self.hf_length()
        simple = (("seed", "train.seed"), ("block_size", "data.seq_len"), ("output_dir", "output.dir"),
                  ("save_total_limit", "checkpoint.keep"))
        for name, key in simple:
            if name in hf and hf[name] is not None:
                self.put(key, hf[name], self.hf_src(name))
        if "seed" not in hf:
            self.put("train.seed", HF_DEFAULTS["seed"], self.hf_src("seed"))
        if self.hfv("gradient_checkpointing"):
            self.put("train.recompute", "block", self.hf_src("gradient_checkpointing"))
        if "overwrite_output_dir" in hf:
            self.put("output.overwrite", bool(hf["overwrite_output_dir"]), self.hf_src("overwrite_output_dir"))
        for name, key in (("logging_steps", "run.log_interval"), ("save_steps", "checkpoint.interval"),
                          ("eval_steps", "eval.interval")):
            if name not in hf or hf[name] is None:
                continue
            self.hf_done.add(name)
            v = hf[name]
            if 0 < v < 1:
                self.not_mapped(f"HF --{name} {fmt(v)}", "a ratio of the run's steps: nlptrain's "
                                f"{key} counts steps")
            else:
                self.put(key, int(v), self.hf_src(name))
        for name in HF_MODEL:
            self.hf_done.add(name)
        for name in HF_DEFAULTS:
            if name in hf and name not in self.hf_done and name in ("bf16", "fp16", "bf16_full_eval",
                                                                     "fp16_full_eval", "tf32"):
                self.hf_done.add(name)
        for name in sorted(hf):
            if name in self.hf_done:
                continue
            if name in HF_NOTHING:
                self.no_effect(f"HF --{name}", HF_NOTHING[name])
            elif name in HF_DEFAULTS:
                self.no_effect(f"HF --{name}", "the DeepSpeed config's own setting replaces it under HF Trainer")
            else:
                self.not_mapped(f"HF --{name}", "not an argument this tool maps (README.md, 'HF Trainer and "
                                "DeepSpeed terms', lists the model and data counterparts)")

    def other_top_level(self):
        for k in self.ds:
            if k in self.done or any(d.startswith(k + ".") for d in self.done):
                continue
            v = self.ds[k]
            if k in NO_COUNTERPART:
                off = v is False or (isinstance(v, dict) and v.get("enabled") is False)
                if off:
                    self.no_effect(k, "switched off", k)
                else:
                    self.not_mapped(k, NO_COUNTERPART[k], k)

    # -- output
    def leftover_defaults(self):
        return [k for k in CONCEPT_KEYS if k not in self.keys]

    def ini(self, title):
        out = [f"# nlptrain keys for {title}, written by tools/deepspeed_to_ini.py.",
               "# Add the job's [model] and [data] sections (and [run] backend, task ...)."]
        out += [f"# {n}" for n in self.notes]
        for sec in SECTIONS:
            ks = [k for k in self.keys if k.split(".")[0] == sec]
            if not ks:
                continue
            out.append(f"\n[{sec}]")
            for k in ks:
                out.append(f"# {self.source[k]}")
                out.append(f"{k.split('.', 1)[1]} = {fmt(self.keys[k])}")
        if self.unmapped:
            out.append("\n# Not mapped (nlptrain has no counterpart, or the value is outside its range):")
            out += [f"#   {s}: {w}" for s, w in self.unmapped]
        if self.nothing:
            out.append("\n# Nothing to map (no effect, or nlptrain always does this):")
            out += [f"#   {s}: {w}" for s, w in self.nothing]
        left = self.leftover_defaults()
        if left:
            out.append("\n# Not set by the config, so nlptrain's defaults apply (build/nlptrain --help): "
                       + ", ".join(left))
        return "\n".join(out) + "\n"

    def as_json(self):
        return {"keys": {k: self.keys[k] for k in self.keys}, "sources": self.source,
                "unmapped": [{"setting": s, "why": w} for s, w in self.unmapped],
                "nothing_to_map": [{"setting": s, "why": w} for s, w in self.nothing],
                "defaults_apply": self.leftover_defaults(), "ranks": self.ranks, "notes": self.notes}


def convert(ds_path, hf_tokens=None, ranks=None, hidden=None):
    """The Mapper of a DeepSpeed config file (and HF argument tokens, or None)."""
    ds = read_json(ds_path, "DeepSpeed config")
    hf = parse_hf_args(hf_tokens) if hf_tokens is not None else None
    if ranks is not None and ranks < 1:
        raise ToolError(f"--ranks must be >= 1, got {ranks}")
    if hidden is not None and hidden < 1:
        raise ToolError(f"--hidden-size must be >= 1, got {hidden}")
    m = Mapper(ds, ds_path, hf, ranks, hidden)
    m.run()
    return m


def main(argv=None):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ds_config", help="DeepSpeed config JSON file")
    p.add_argument("--out", help="write the INI here (atomically) instead of printing it")
    p.add_argument("--ranks", type=int, help="world size, to split train_batch_size")
    p.add_argument("--hidden-size", type=int, help="the model's hidden size, for 'auto' bucket sizes")
    p.add_argument("--json", action="store_true", help="print the mapping as JSON")
    p.add_argument("--hf-args", nargs=argparse.REMAINDER, default=None,
                   help="HF Trainer's arguments (last on the line), or a .json / training_args.bin file of them")
    a = p.parse_args(argv)
    if a.hf_args is not None and not a.hf_args:
        raise ToolError("--hf-args needs HF's arguments after it (or a .json file of them)")
    m = convert(a.ds_config, a.hf_args, a.ranks, a.hidden_size)
    title = f"DeepSpeed config '{a.ds_config}'" + (" and HF Trainer arguments" if a.hf_args is not None else "")
    text = json.dumps(m.as_json(), indent=1) + "\n" if a.json else m.ini(title)
    if a.out:
        with atomic_file(Path(a.out), "INI") as tmp:
            tmp.write_text(text, encoding="utf-8")
        for s, w in m.unmapped:
            print(f"{PROG}: not mapped: {s}: {w}", file=sys.stderr)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    sys.exit(main_wrapper(PROG, main))
