"""tools/deepspeed_to_ini.py on the DeepSpeed configs users have: those of DeepSpeed's documentation (the
ZeRO tutorial's stage 2, ZeRO-Offload, ZeRO-Infinity's stage 3, the getting-started config) and of HF's
DeepSpeed integration (its ZeRO-2 and ZeRO-3 examples, run with run_clm's arguments), written out below.
Every mapped key is checked against the value the config means, every setting of a config is accounted
for (mapped, named as not mapped, or named as nothing to map), and the INI the tool prints passes
`nlptrain --check` (the binary's own validation of keys, types and ranges)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nlp_run as nr

SOURCE = Path(os.environ.get("NLPTRAIN_SOURCE_DIR") or Path(__file__).resolve().parents[2])
TOOL = SOURCE / "tools" / "deepspeed_to_ini.py"
sys.path.insert(0, str(SOURCE / "tools"))
import deepspeed_to_ini as dti  # noqa: E402
import config_reference  # noqa: E402

# ---- the configs ------------------------------------------------------------------------------------------

# DeepSpeed's ZeRO tutorial, stage 1 (training a 1.5B-parameter GPT-2 with Megatron-LM).
DS_ZERO1 = {"zero_optimization": {"stage": 1, "reduce_bucket_size": 5e8}}
# DeepSpeed's ZeRO tutorial, stage 2 (training a 10B-parameter GPT-2 with Megatron-LM).
DS_ZERO2 = {"zero_optimization": {"stage": 2, "contiguous_gradients": True, "overlap_comm": True,
                                  "reduce_scatter": True, "reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8}}
# DeepSpeed's ZeRO-Offload tutorial.
DS_OFFLOAD = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
                                    "contiguous_gradients": True, "overlap_comm": True}}
# DeepSpeed's ZeRO tutorial, stage 3 with ZeRO-Infinity's offload to the CPU.
DS_ZERO3 = {"zero_optimization": {"stage": 3, "contiguous_gradients": True, "stage3_max_live_parameters": 1e9,
                                  "stage3_max_reuse_distance": 1e9, "stage3_prefetch_bucket_size": 1e7,
                                  "stage3_param_persistence_threshold": 1e5, "reduce_bucket_size": 1e7,
                                  "sub_group_size": 1e9, "offload_optimizer": {"device": "cpu"},
                                  "offload_param": {"device": "cpu"}}}
# DeepSpeed's getting-started config (the old boolean form of ZeRO stage 1).
DS_GETTING_STARTED = {"train_batch_size": 8, "gradient_accumulation_steps": 1,
                      "optimizer": {"type": "Adam", "params": {"lr": 0.00015}},
                      "fp16": {"enabled": True}, "zero_optimization": True}

_HF_FP16 = {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
            "hysteresis": 2, "min_loss_scale": 1}
_HF_OPT = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}
_HF_SCHED = {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                            "warmup_num_steps": "auto"}}
_HF_TAIL = {"gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
            "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False}
# HF's DeepSpeed integration, "ZeRO-2 Example" (ds_config_zero2.json).
HF_ZERO2 = {"fp16": _HF_FP16, "optimizer": _HF_OPT, "scheduler": _HF_SCHED,
            "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                                  "allgather_partitions": True, "allgather_bucket_size": 2e8, "overlap_comm": True,
                                  "reduce_scatter": True, "reduce_bucket_size": 2e8, "contiguous_gradients": True},
            **_HF_TAIL}
# HF's DeepSpeed integration, "ZeRO-3 Example" (ds_config_zero3.json).
HF_ZERO3 = {"fp16": _HF_FP16, "optimizer": _HF_OPT, "scheduler": _HF_SCHED,
            "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                                  "offload_param": {"device": "cpu", "pin_memory": True}, "overlap_comm": True,
                                  "contiguous_gradients": True, "sub_group_size": 1e9, "reduce_bucket_size": "auto",
                                  "stage3_prefetch_bucket_size": "auto",
                                  "stage3_param_persistence_threshold": "auto",
                                  "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                                  "stage3_gather_16bit_weights_on_model_save": True},
            **_HF_TAIL}
# run_clm's README command with DeepSpeed (deepspeed --num_gpus 4 run_clm.py ... --deepspeed ds_config.json),
# bf16 and a fixed length.
RUN_CLM = ["--model_name_or_path", "gpt2", "--dataset_name", "wikitext", "--dataset_config_name",
           "wikitext-2-raw-v1", "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8",
           "--do_train", "--do_eval", "--output_dir", "/tmp/test-clm", "--deepspeed", "ds_config.json", "--bf16",
           "--learning_rate", "5e-5", "--max_steps", "1000", "--warmup_steps", "100", "--gradient_accumulation_steps",
           "2"]

AUTO = "'auto' is filled in by HF Trainer"
PENDING = {"train.zero_prefetch", "train.offload"}  # keys of ZeRO-2/3 and offload (issue 53 items 1-3)


def convert(cfg, tmp_path, hf=None, ranks=None, hidden=None):
    p = tmp_path / "ds_config.json"
    p.write_text(json.dumps(cfg), encoding="utf-8")
    return dti.convert(str(p), hf, ranks, hidden)


def named(entries):
    return {s for s, _ in entries}


def assert_accounted(cfg, m):
    """Every setting of the config is mapped (its path in a key's source), or named."""
    sources = " ".join(list(m.source.values()) + m.notes)
    names = named(m.unmapped) | named(m.nothing)
    for leaf in dti.leaves(cfg):
        parents = [leaf.rsplit(".", i)[0] for i in range(leaf.count(".") + 1)]
        ok = any(f"ds {p} " in sources + " " or any(n.startswith(p) for n in names) for p in parents)
        assert ok, f"setting {leaf} is neither mapped nor named: keys {m.source}, named {sorted(names)}"


def run_tool(*args, check=True):
    r = subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, timeout=60)
    if check and r.returncode != 0:
        raise AssertionError(f"deepspeed_to_ini.py {args} failed ({r.returncode}):\n{r.stderr}")
    return r


# ---- DeepSpeed's documentation ---------------------------------------------------------------------------

def test_deepspeed_zero1_tutorial(tmp_path):
    m = convert(DS_ZERO1, tmp_path)
    assert m.keys == {"train.zero": 1, "comm.bucket_mb": 1907.35, "train.precision": "fp32"}
    assert m.unmapped == [] and m.nothing == []
    assert_accounted(DS_ZERO1, m)


def test_deepspeed_zero2_tutorial(tmp_path):
    m = convert(DS_ZERO2, tmp_path)
    assert m.keys == {"train.zero": 2, "comm.overlap": True, "comm.bucket_mb": 1907.35, "train.precision": "fp32"}
    assert 5e8 * 4 / 2 ** 20 == pytest.approx(1907.35, rel=1e-6)  # the same gradients per bucket, as fp32
    assert named(m.unmapped) == {"zero_optimization.allgather_bucket_size"}
    assert named(m.nothing) == {"zero_optimization.contiguous_gradients", "zero_optimization.reduce_scatter"}
    assert_accounted(DS_ZERO2, m)
    assert "train.batch_size" in m.leftover_defaults() and "train.zero" not in m.leftover_defaults()


def test_deepspeed_offload_tutorial(tmp_path):
    m = convert(DS_OFFLOAD, tmp_path)
    assert m.keys == {"train.zero": 2, "train.offload": "optimizer", "comm.overlap": True, "train.precision": "fp32"}
    assert m.unmapped == []
    assert_accounted(DS_OFFLOAD, m)


def test_deepspeed_zero3_infinity_tutorial(tmp_path):
    m = convert(DS_ZERO3, tmp_path)
    assert m.keys == {"train.zero": 3, "train.offload": "optimizer", "comm.bucket_mb": 38.147,
                      "train.precision": "fp32"}
    assert named(m.unmapped) == {
        "zero_optimization.offload_param", "zero_optimization.stage3_max_live_parameters",
        "zero_optimization.stage3_max_reuse_distance", "zero_optimization.stage3_param_persistence_threshold",
        "zero_optimization.sub_group_size", "zero_optimization.stage3_prefetch_bucket_size"}
    why = dict(m.unmapped)
    assert "--hidden-size" in why["zero_optimization.stage3_prefetch_bucket_size"]
    assert "optimizer only" in why["zero_optimization.offload_param"]
    assert_accounted(DS_ZERO3, m)
    # With the hidden size: 1e7 elements prefetched are 2 blocks of GPT-2 small (12 h^2 + 13 h = 7,087,872).
    m = convert(DS_ZERO3, tmp_path, hidden=768)
    assert m.keys["train.zero_prefetch"] == 2
    assert "zero_optimization.stage3_prefetch_bucket_size" not in named(m.unmapped)
    assert convert(DS_ZERO3, tmp_path, hidden=1600).keys["train.zero_prefetch"] == 1  # GPT-2 XL: 30.7M a block


def test_deepspeed_getting_started(tmp_path):
    m = convert(DS_GETTING_STARTED, tmp_path)
    # train_batch_size 8 with accumulation 1: the micro-batch is 8 / ranks, unknown without --ranks.
    assert m.keys == {"train.zero": 1, "train.lr": 0.00015}
    why = dict(m.unmapped)
    assert "--ranks" in why["train_batch_size"] and "--ranks" in why["gradient_accumulation_steps"]
    assert "no fp16" in why["fp16.enabled"]
    assert_accounted(DS_GETTING_STARTED, m)
    m = convert(DS_GETTING_STARTED, tmp_path, ranks=2)
    assert m.keys["train.batch_size"] == 4 and m.keys["train.grad_accum"] == 1 and m.ranks == 2
    assert any("mpirun -np 2" in n for n in m.notes)
    with pytest.raises(dti.ToolError, match="is not a multiple of 1 x 3 ranks"):
        convert(DS_GETTING_STARTED, tmp_path, ranks=3)


def test_deepspeed_schedulers(tmp_path):
    base = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "gradient_clipping": 0.5,
            "bf16": {"enabled": True},
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-6,
                                                      "weight_decay": 0.1}}}
    decay = dict(base, scheduler={"type": "WarmupDecayLR", "params": {
        "total_num_steps": 2000, "warmup_min_lr": 3e-5, "warmup_max_lr": 3e-4, "warmup_num_steps": 100,
        "warmup_type": "linear"}})
    m = convert(decay, tmp_path)
    assert m.keys == {"train.batch_size": 4, "train.grad_accum": 2, "train.clip": 0.5, "train.precision": "bf16",
                      "train.beta1": 0.9, "train.beta2": 0.95, "train.adam_eps": 1e-6, "train.weight_decay": 0.1,
                      "train.steps": 2000, "train.warmup_steps": 100, "train.schedule": "linear",
                      "train.lr": 3e-4, "train.min_lr_ratio": pytest.approx(0.1)}
    # The warmup starts at warmup_min_lr (nlptrain's from 0); the weight decay of DeepSpeed's optimizer
    # reaches the biases and LayerNorm weights (nlptrain's, as HF's, does not).
    assert named(m.unmapped) == {"scheduler.params.warmup_min_lr",
                                 "optimizer.params.weight_decay (on biases and LayerNorm weights)"}
    assert "scheduler.params.warmup_type" in named(m.nothing)
    assert_accounted(decay, m)
    # WarmupLR: the default warmup is DeepSpeed's log warmup, named; the scheduler sets the lr.
    wl = dict(base, scheduler={"type": "WarmupLR", "params": {"warmup_max_lr": 1e-3, "warmup_num_steps": 50}})
    m = convert(wl, tmp_path)
    assert (m.keys["train.schedule"], m.keys["train.lr"], m.keys["train.warmup_steps"]) == ("constant", 1e-3, 50)
    assert "scheduler.params.warmup_type (DeepSpeed's default log)" in named(m.unmapped)
    assert any("warmup_max_lr 0.001" in n and "not the optimizer's 0.0003" in n for n in m.notes)
    cos = dict(base, scheduler={"type": "WarmupCosineLR", "params": {
        "total_num_steps": 500, "warmup_num_steps": 20, "cos_min_ratio": 0.05, "warmup_type": "linear"}})
    m = convert(cos, tmp_path)
    assert (m.keys["train.schedule"], m.keys["train.min_lr_ratio"], m.keys["train.lr"], m.keys["train.steps"]) == \
        ("cosine", 0.05, 3e-4, 500)
    one = dict(base, scheduler={"type": "OneCycle", "params": {"cycle_min_lr": 1e-5, "cycle_max_lr": 1e-3}})
    m = convert(one, tmp_path)
    assert "scheduler.type = OneCycle" in named(m.unmapped) and "train.schedule" not in m.keys
    assert_accounted(one, m)


def test_optimizers_other_than_adamw(tmp_path):
    m = convert({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "Lamb", "params": {"lr": 1e-3}}},
                tmp_path)
    assert "optimizer.type = Lamb" in named(m.unmapped) and "train.lr" not in m.keys
    m = convert({"train_micro_batch_size_per_gpu": 2, "optimizer": {
        "type": "Adam", "params": {"lr": 1e-3, "adam_w_mode": False, "weight_decay": 0.01, "torch_adam": True}}},
        tmp_path)
    assert "optimizer.params.adam_w_mode" in named(m.unmapped)
    assert "optimizer.params.torch_adam" in named(m.nothing)


def test_offload_devices_and_legacy_keys(tmp_path):
    m = convert({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"},
                                       "offload_param": {"device": "nvme"}}, "aio": {"block_size": 1048576}},
                tmp_path)
    assert "train.offload" not in m.keys
    assert {"zero_optimization.offload_optimizer", "zero_optimization.offload_param", "aio"} <= named(m.unmapped)
    m = convert({"zero_optimization": {"stage": 2, "cpu_offload": True}}, tmp_path)
    assert m.keys["train.offload"] == "optimizer"
    # stage3_prefetch_bucket_size at stage 2 has nothing to act on
    m = convert({"zero_optimization": {"stage": 2, "stage3_prefetch_bucket_size": 5e7}}, tmp_path, hidden=768)
    assert "train.zero_prefetch" not in m.keys and "zero_optimization.stage3_prefetch_bucket_size" in named(m.nothing)


def test_values_outside_nlptrain_ranges_are_named(tmp_path):
    m = convert({"zero_optimization": {"stage": 2, "reduce_bucket_size": 5e9}, "gradient_clipping": -1}, tmp_path)
    assert "comm.bucket_mb" not in m.keys and "train.clip" not in m.keys
    text = " ".join(w for _, w in m.unmapped)
    assert "comm.bucket_mb = 19073.5 is outside nlptrain's range ((0, 4096])" in text
    assert "train.clip = -1.0 is outside nlptrain's range" in text


def test_unknown_settings_are_named(tmp_path):
    m = convert({"train_micro_batch_size_per_gpu": 1, "made_up": {"x": 1},
                 "zero_optimization": {"stage": 1, "new_option": 3}}, tmp_path)
    assert {"made_up.x", "zero_optimization.new_option"} <= named(m.unmapped)


# ---- HF's DeepSpeed integration -------------------------------------------------------------------------

def test_hf_zero2_without_hf_arguments_names_every_auto(tmp_path):
    m = convert(HF_ZERO2, tmp_path)
    autos = {s for s, w in m.unmapped if w.startswith(AUTO)}
    assert autos == {"train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
                     "gradient_clipping", "fp16.enabled", "optimizer.params.lr", "optimizer.params.betas",
                     "optimizer.params.eps", "optimizer.params.weight_decay", "scheduler.params.warmup_min_lr",
                     "scheduler.params.warmup_max_lr", "scheduler.params.warmup_num_steps"}
    # fp16 "auto" leaves the precision unknown: no train.precision line.
    assert m.keys == {"train.zero": 2, "train.offload": "optimizer", "comm.overlap": True,
                      "comm.bucket_mb": 762.939, "train.schedule": "constant"}
    assert "train.precision" in m.leftover_defaults()
    assert_accounted(HF_ZERO2, m)


def test_hf_zero2_with_run_clm_arguments(tmp_path):
    m = convert(HF_ZERO2, tmp_path, hf=RUN_CLM, ranks=4)
    assert m.keys == {
        "train.zero": 2, "train.offload": "optimizer", "comm.overlap": True, "comm.bucket_mb": 762.939,
        "train.batch_size": 8, "train.grad_accum": 2, "train.clip": 1.0,     # HF's default max_grad_norm
        "train.precision": "bf16",                                            # fp16 "auto" is off: --bf16
        "train.lr": 5e-5, "train.beta1": 0.9, "train.beta2": 0.999, "train.adam_eps": 1e-8,
        "train.weight_decay": 0.0, "train.steps": 1000, "train.warmup_steps": 100, "train.schedule": "constant",
        "train.seed": 42, "output.dir": "/tmp/test-clm"}
    assert m.ranks == 4 and any("4 x 8 x 2 = 64" in n for n in m.notes)
    assert named(m.unmapped) == {
        "zero_optimization.allgather_bucket_size", "scheduler.params.warmup_type (DeepSpeed's default log)",
        "steps_per_print", "HF --dataset_name", "HF --dataset_config_name", "HF --per_device_eval_batch_size",
        "HF --do_eval"}
    assert {"fp16.loss_scale", "HF --deepspeed", "HF --do_train", "wall_clock_breakdown"} <= named(m.nothing)
    assert_accounted(HF_ZERO2, m)
    assert m.leftover_defaults() == []


def test_hf_zero3_with_run_clm_arguments(tmp_path):
    m = convert(HF_ZERO3, tmp_path, hf=RUN_CLM)
    # "auto" bucket sizes from GPT-2's hidden size 768 (--model_name_or_path gpt2), as HF fills them.
    assert m.keys["comm.bucket_mb"] == pytest.approx(768 * 768 * 4 / 2 ** 20)
    assert m.keys["train.zero_prefetch"] == 1        # 0.9 x 768^2 elements: less than one block
    assert m.keys["train.zero"] == 3 and m.keys["train.offload"] == "optimizer"
    assert "zero_optimization.stage3_param_persistence_threshold" in named(m.unmapped)
    assert "zero_optimization.stage3_gather_16bit_weights_on_model_save" in named(m.nothing)
    assert m.ranks is None  # train_batch_size "auto" without --ranks: no world size to name
    assert_accounted(HF_ZERO3, m)
    # A Hub id names the preset too: GPT-2 medium's hidden size 1024, 4 MiB of fp32 gradients a bucket.
    hub = [a if a != "gpt2" else "openai-community/gpt2-medium" for a in RUN_CLM]
    assert convert(HF_ZERO3, tmp_path, hf=hub).keys["comm.bucket_mb"] == 4.0
    # A model folder's config.json gives it as well (n_embd for GPT-2, hidden_size for BERT).
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"model_type": "bert", "hidden_size": 256}', encoding="utf-8")
    local = [a if a != "gpt2" else str(tmp_path / "model") for a in RUN_CLM]
    assert convert(HF_ZERO3, tmp_path, hf=local).keys["comm.bucket_mb"] == 0.25


def test_hf_warmup_ratio_and_epochs(tmp_path):
    cfg = dict(HF_ZERO2)
    args = ["--num_train_epochs", "2", "--warmup_steps", "0.1"]
    m = convert(cfg, tmp_path, hf=args)
    assert m.keys["train.epochs"] == 2.0 and "train.steps" not in m.keys
    assert "train.warmup_steps" not in m.keys and "HF warmup ratio 0.1" in named(m.unmapped)
    m = convert(cfg, tmp_path, hf=["--max_steps", "300", "--warmup_ratio", "0.1"])
    assert m.keys["train.warmup_steps"] == 30 and m.keys["train.steps"] == 300


def test_hf_trainer_own_optimizer_and_schedule(tmp_path):
    """A config without optimizer and scheduler sections: HF Trainer's own AdamW and schedule."""
    cfg = {"zero_optimization": {"stage": 1}, "bf16": {"enabled": "auto"}, **_HF_TAIL}
    del cfg["steps_per_print"], cfg["wall_clock_breakdown"]
    m = convert(cfg, tmp_path, hf=["--lr_scheduler_type", "cosine", "--learning_rate", "3e-4",
                                   "--weight_decay", "0.1", "--warmup_steps", "20", "--max_steps", "200",
                                   "--gradient_checkpointing", "--seed=7", "--block_size", "512"])
    assert m.keys == {"train.zero": 1, "train.batch_size": 8, "train.grad_accum": 1, "train.clip": 1.0,
                      "train.precision": "fp32", "train.lr": 3e-4, "train.weight_decay": 0.1, "train.beta1": 0.9,
                      "train.beta2": 0.999, "train.adam_eps": 1e-8, "train.steps": 200, "train.schedule": "cosine",
                      "train.warmup_steps": 20, "train.min_lr_ratio": 0.0, "train.seed": 7,
                      "data.seq_len": 512, "train.recompute": "block"}
    assert m.unmapped == []
    m = convert(cfg, tmp_path, hf=["--optim", "adafactor"])
    assert "HF --optim adafactor" in named(m.unmapped)
    m = convert(cfg, tmp_path, hf=["--lr_scheduler_type", "polynomial"])
    assert "HF --lr_scheduler_type polynomial" in named(m.unmapped)


def test_hf_mismatch_is_refused_like_hf_trainer(tmp_path):
    cfg = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 3e-5}}}
    with pytest.raises(dti.ToolError) as e:
        convert(cfg, tmp_path, hf=["--learning_rate", "1e-4"])
    msg = str(e.value)
    assert "optimizer.params.lr = 3e-05 vs HF --learning_rate = 0.0001" in msg
    assert "train_micro_batch_size_per_gpu = 4 vs HF --per_device_train_batch_size = 8 (HF's default)" in msg


def test_hf_mismatch_of_the_schedule(tmp_path):
    cfg = {"train_micro_batch_size_per_gpu": "auto", "scheduler": {"type": "WarmupDecayLR", "params": {
        "warmup_num_steps": 100, "total_num_steps": 1000, "warmup_max_lr": "auto", "warmup_type": "linear"}}}
    with pytest.raises(dti.ToolError) as e:
        convert(cfg, tmp_path, hf=["--max_steps", "500"])
    assert "total_num_steps = 1000 vs HF's training steps --max_steps = 500" in str(e.value)
    assert "warmup_num_steps = 100 vs HF --warmup_steps = 1 (HF's default 0, filled as 1)" in str(e.value)
    m = convert(cfg, tmp_path, hf=["--max_steps", "1000", "--warmup_steps", "0.1"])
    assert (m.keys["train.steps"], m.keys["train.warmup_steps"], m.keys["train.schedule"]) == (1000, 100, "linear")


def test_hf_arguments_file(tmp_path):
    f = tmp_path / "args.json"
    f.write_text(json.dumps({"per_device_train_batch_size": 2, "learning_rate": 1e-4, "bf16": True,
                             "max_steps": 10}), encoding="utf-8")
    m = convert(HF_ZERO2, tmp_path, hf=[str(f)])
    assert (m.keys["train.batch_size"], m.keys["train.lr"], m.keys["train.precision"], m.keys["train.steps"]) == \
        (2, 1e-4, "bf16", 10)


def test_training_args_bin(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed: training_args.bin is not read")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "o"), per_device_train_batch_size=3,
                                          learning_rate=2e-4, max_steps=50, warmup_steps=5, report_to=[])
    torch.save(args, tmp_path / "training_args.bin")
    m = convert(HF_ZERO2, tmp_path, hf=[str(tmp_path / "training_args.bin")])
    assert (m.keys["train.batch_size"], m.keys["train.lr"], m.keys["train.steps"], m.keys["train.warmup_steps"]) \
        == (3, 2e-4, 50, 5)


# ---- the command line and bad input -----------------------------------------------------------------------

def test_cli_out_and_stdout_agree(tmp_path):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps(HF_ZERO2), encoding="utf-8")
    out = tmp_path / "zero2.ini"
    r = run_tool(cfg, "--out", out, "--ranks", "2", "--hf-args", *RUN_CLM)
    assert "not mapped: steps_per_print" in r.stderr
    printed = run_tool(cfg, "--ranks", "2", "--hf-args", *RUN_CLM).stdout
    assert out.read_text(encoding="utf-8") == printed
    assert "\n[train]\n" in printed and "\nzero = 2\n" in printed and "# Not mapped" in printed
    j = json.loads(run_tool(cfg, "--json", "--ranks", "2", "--hf-args", *RUN_CLM).stdout)
    assert j["keys"]["train.grad_accum"] == 2 and j["ranks"] == 2


@pytest.mark.parametrize("text,expect", [
    ('{"zero_optimization": {"stage": 2,}}', "is not valid JSON (line 1, column"),
    ('{"zero_optimization": {"stage": "two"}}', 'zero_optimization.stage = "two" is not an integer'),
    ('{"train_batch_size": 8, "train_batch_size": 16}', "duplicate key 'train_batch_size'"),
    ('[1, 2]', "is not a JSON object"),
    ('{"fp16": {"enabled": true}, "bf16": {"enabled": true}}', "fp16 and bf16 are both enabled"),
    ('{"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1}',
     "train_batch_size = 10 is not"),
])
def test_bad_config_is_an_error_and_writes_nothing(tmp_path, text, expect):
    cfg = tmp_path / "ds.json"
    cfg.write_text(text, encoding="utf-8")
    out = tmp_path / "out.ini"
    r = run_tool(cfg, "--out", out, check=False)
    assert r.returncode == 1 and expect in r.stderr and str(cfg) in r.stderr, r.stderr
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["ds.json"]


def test_missing_file_and_bad_hf_argument(tmp_path):
    r = run_tool(tmp_path / "nope.json", check=False)
    assert r.returncode == 1 and "not found" in r.stderr and "nope.json" in r.stderr
    cfg = tmp_path / "ds.json"
    cfg.write_text("{}", encoding="utf-8")
    r = run_tool(cfg, "--hf-args", "--learning_rate", "fast", check=False)
    assert r.returncode == 1 and "--learning_rate: 'fast' is not a number" in r.stderr


# ---- against nlptrain's schema ---------------------------------------------------------------------------

def binary_or_skip():
    try:
        b = nr.binary()
    except FileNotFoundError as e:
        pytest.skip(f"no nlptrain binary ({e}): the --check of the tool's output is skipped")
    return b


def schema(b):
    p = subprocess.run([b, "--help"], capture_output=True, text=True, timeout=60, env=nr.mpi_env())
    return {k: meaning for k, _, _, meaning in config_reference.parse_help(p.stdout)}


def test_every_key_the_tool_writes_is_in_the_schema():
    keys = schema(binary_or_skip())
    written = set(dti.RANGES) | set(dti.CHOICES) | dti.BOOLS | dti.STRINGS
    missing = sorted(k for k in written - set(keys) if k not in PENDING)
    assert not missing, f"deepspeed_to_ini.py writes keys nlptrain does not have: {missing}"


CHECKED = [("ds_zero1", DS_ZERO1, [], None), ("ds_zero2", DS_ZERO2, [], None), ("ds_offload", DS_OFFLOAD, [], None),
           ("ds_zero3", DS_ZERO3, ["--hidden-size", "768"], None),
           ("ds_getting_started", DS_GETTING_STARTED, ["--ranks", "2"], None),
           ("hf_zero2_run_clm", HF_ZERO2, ["--ranks", "4"], RUN_CLM),
           ("hf_zero3_run_clm", HF_ZERO3, [], RUN_CLM)]


@pytest.mark.parametrize("name,cfg,args,hf", CHECKED, ids=[c[0] for c in CHECKED])
def test_output_passes_nlptrain_check(tmp_path, report, name, cfg, args, hf):
    """The printed INI is valid for the binary. Where the binary predates ZeRO-2/3 and offload (no
    train.offload / train.zero_prefetch key, train.zero up to 1), those lines are set aside, named, and
    the rest is checked."""
    b = binary_or_skip()
    keys = schema(b)
    p = tmp_path / "ds.json"
    p.write_text(json.dumps(cfg), encoding="utf-8")
    text = run_tool(p, *args, *(["--hf-args", *hf] if hf else [])).stdout
    # the highest ZeRO stage the binary takes (its schema's range; --check with no data fails on the
    # missing data.train, not on the key, so the error text decides)
    top_stage = 1
    for stage in (3, 2):
        probe = subprocess.run([b, "--check", f"--train.zero={stage}"], capture_output=True, text=True, timeout=60,
                               env=nr.mpi_env())
        if "train.zero" not in probe.stderr:
            top_stage = stage
            break
    kept, set_aside, section = [], [], None
    for line in text.splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        key = f"{section}.{line.split('=')[0].strip()}" if "=" in line and not line.startswith("#") else None
        if key and ((key in PENDING and key not in keys)
                    or (key == "train.zero" and int(line.split("=")[1]) > top_stage)):
            set_aside.append(line)
            continue
        kept.append(line)
    ini = tmp_path / f"{name}.ini"
    ini.write_text("\n".join(kept) + "\n", encoding="utf-8")
    # --check opens the dataset's header: a small GPT-2 token stream stands for the job's [data] section
    data = tmp_path / "train.h5"
    nr.write_stream(data, np.arange(200_000, dtype=np.int64) % 50_000)
    r = subprocess.run([b, str(ini), "--check", f"--data.train={data}"], capture_output=True, text=True,
                       timeout=60, env=nr.mpi_env())
    assert r.returncode == 0, f"{name}: the tool's INI fails nlptrain --check:\n{r.stderr}\n{text}"
    if set_aside:
        report(f"{name}: keys or stages this binary does not take, not checked: {set_aside}")


# ---- against HF's own filling of "auto" ------------------------------------------------------------------

HF_KWARGS = dict(per_device_train_batch_size=8, gradient_accumulation_steps=2, bf16=True, max_steps=1000,
                 warmup_steps=40, learning_rate=3e-5, weight_decay=0.01, max_grad_norm=0.5, adam_beta2=0.98)
HF_DECAY = dict(HF_ZERO3, bf16={"enabled": "auto"}, scheduler={"type": "WarmupDecayLR", "params": {
    "warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto",
    "warmup_type": "linear"}})


def hf_filled(cfg, tmp_path):
    """cfg with its "auto" values filled by transformers' own HfTrainerDeepSpeedConfig (its two stages,
    for a model of hidden size 768 and max_steps training steps), or a skip."""
    pytest.importorskip("transformers", reason="transformers is not installed: HF's own filling is not compared")
    acc = pytest.importorskip("accelerate.utils.deepspeed", reason="accelerate is not installed")
    import copy
    import types
    from functools import partialmethod
    from transformers import TrainingArguments
    try:
        from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig as H
        H.trainer_config_process, H.trainer_config_finalize, H.fill_match, H.is_auto  # noqa: B018
    except (ImportError, AttributeError) as e:
        pytest.skip(f"transformers' DeepSpeed integration has another layout ({e}): not compared")

    # HF's class needs the deepspeed package to construct; its filling methods do not: borrow them onto
    # accelerate's config class (the base HF's class has when deepspeed is installed).
    class Filler(acc.HfDeepSpeedConfig):
        is_auto, fill_match = H.is_auto, H.fill_match
        fill_only = partialmethod(H.fill_match, must_match=False)
        trainer_config_process, trainer_config_finalize = H.trainer_config_process, H.trainer_config_finalize

    f = Filler(copy.deepcopy(cfg))
    f.mismatches, f._dtype = [], None
    args = TrainingArguments(output_dir=str(tmp_path / "hf"), report_to=[], use_cpu=True, **HF_KWARGS)
    f.trainer_config_process(args)
    f.trainer_config_finalize(args, types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=768)),
                              HF_KWARGS["max_steps"])
    assert args.world_size == 1

    # Then accelerate's DeepSpeed plugin sets the mixed precision HF Trainer asks for (bf16 here).
    plugin_cls = getattr(pytest.importorskip("accelerate.utils"), "DeepSpeedPlugin", None)
    if plugin_cls is None or not hasattr(plugin_cls, "set_mixed_precision"):
        pytest.skip("accelerate's DeepSpeedPlugin has another layout: not compared")

    class Plugin:
        set_mixed_precision, fill_match = plugin_cls.set_mixed_precision, plugin_cls.fill_match

    plugin = Plugin()
    plugin.hf_ds_config, plugin.deepspeed_config = f, f.config
    plugin.set_mixed_precision("bf16" if HF_KWARGS["bf16"] else "no")
    return f.config


@pytest.mark.parametrize("name,cfg", [("zero2", HF_ZERO2), ("zero3", HF_ZERO3), ("decay", HF_DECAY)])
def test_auto_resolved_as_hf_fills_it(tmp_path, name, cfg):
    """The tool's "auto" values from HF's arguments are those HF Trainer itself fills in: the keys of
    the auto config with --hf-args equal the keys of the config HF filled, read without them."""
    filled = hf_filled(cfg, tmp_path)
    hf_args = [t for k, v in HF_KWARGS.items() for t in ((f"--{k}",) if v is True else (f"--{k}", str(v)))]
    a = convert(cfg, tmp_path, hf=hf_args + ["--model_name_or_path", "gpt2"], ranks=1)
    b = convert(filled, tmp_path, ranks=1, hidden=768)
    only_hf = {"train.seed", "train.steps", "output.dir"}  # HF's own arguments, not in a DeepSpeed config
    expect = {k: v for k, v in a.keys.items() if k not in only_hf or k in b.keys}
    assert b.keys == expect, f"{name}: HF filled {filled}"
    assert a.keys["train.warmup_steps"] == 40 and a.keys["train.precision"] == "bf16"


def test_refused_where_hf_refuses(tmp_path):
    """Values that are not "auto" and contradict HF's arguments: HF's own filling refuses them, and so
    does the tool, naming the same settings."""
    cfg = json.loads(json.dumps(HF_DECAY))
    cfg["scheduler"]["params"]["warmup_num_steps"] = 100   # HF_KWARGS: warmup_steps 40
    cfg["optimizer"]["params"]["lr"] = 1e-4                # HF_KWARGS: learning_rate 3e-5
    with pytest.raises(ValueError) as hf_error:
        hf_filled(cfg, tmp_path)
    hf_args = [t for k, v in HF_KWARGS.items() for t in ((f"--{k}",) if v is True else (f"--{k}", str(v)))]
    with pytest.raises(dti.ToolError) as e:
        convert(cfg, tmp_path, hf=hf_args + ["--model_name_or_path", "gpt2"], ranks=1)
    for setting in ("scheduler.params.warmup_num_steps", "optimizer.params.lr"):
        assert setting in str(hf_error.value) and setting in str(e.value), (hf_error.value, e.value)
