"""Shared helpers for checking nlptrain against Hugging Face transformers' GPT-2.

- build a random ``GPT2LMHeadModel`` whose weights are exactly representable in float32 (the
  float64 reference and nlptrain's float32 copy hold the same numbers);
- write those weights in nlptrain's HDF5 layout (one float32 dataset per HF state_dict key, the
  config as root attributes);
- write token datasets (2-D ``input_ids`` / ``attention_mask`` / ``labels`` or a 1-D ``tokens``
  stream);
- run the nlptrain binary (optionally under mpirun) and read what it wrote.

The binary is ``$NLPTRAIN_BIN`` (set by CTest), else ``<repo>/build/nlptrain`` (nlp_run.binary).
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Iterable, Mapping

import h5py
import numpy as np
import torch

import nlp_run as nr

REPO = Path(__file__).resolve().parents[2]


# ---- the binary -------------------------------------------------------------------------------------

def nlptrain_bin() -> Path:
    """Path of the nlptrain binary; raises (never skips) when it does not exist."""
    return Path(nr.binary())


def run_env(threads: int | None = None) -> dict:
    return nr.mpi_env(threads)


def write_ini(path: str | os.PathLike, sections: Mapping[str, Mapping[str, object]]) -> Path:
    """Write an INI file: {section: {key: value}}; bools as true/false."""
    lines = []
    for sec, kv in sections.items():
        lines.append(f"[{sec}]")
        for k, v in kv.items():
            if isinstance(v, bool):
                v = "true" if v else "false"
            lines.append(f"{k} = {v}")
        lines.append("")
    path = Path(path)
    path.write_text("\n".join(lines))
    return path


def overrides(sections: Mapping[str, Mapping[str, object]]) -> list[str]:
    """The same dictionary as --section.key=value command-line overrides."""
    out = []
    for sec, kv in sections.items():
        for k, v in kv.items():
            if isinstance(v, bool):
                v = "true" if v else "false"
            out.append(f"--{sec}.{k}={v}")
    return out


def run_nlptrain(ini: str | os.PathLike | None, extra_args: Iterable[str] = (), *, ranks: int = 1,
                 timeout: float = 900, cwd: str | os.PathLike | None = None,
                 threads: int | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run nlptrain [ini] [extra_args] (under mpirun -np ranks when ranks > 1)."""
    cmd = [str(nlptrain_bin())]
    if ini is not None:
        cmd.append(str(ini))
    cmd += list(extra_args)
    if ranks > 1:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)] + cmd
    proc = subprocess.run(cmd, cwd=cwd, env=run_env(threads), capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"nlptrain failed (exit {proc.returncode}): {shlex.join(cmd)}\n"
            f"--- stdout (tail) ---\n{proc.stdout[-4000:]}\n--- stderr (tail) ---\n{proc.stderr[-4000:]}")
    return proc


# ---- models -----------------------------------------------------------------------------------------

def make_config(n_layer=2, n_head=4, n_embd=64, vocab_size=1000, n_positions=32,
                initializer_range=0.02, layer_norm_epsilon=1e-5, dropout=0.0,
                attn_implementation="eager"):
    """GPT2Config with eager attention by default (the plain float64 matmul/softmax reference)."""
    from transformers import GPT2Config
    return GPT2Config(attn_implementation=attn_implementation,
        n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=vocab_size,
        n_positions=n_positions, n_ctx=n_positions, initializer_range=initializer_range,
        layer_norm_epsilon=layer_norm_epsilon, embd_pdrop=dropout, attn_pdrop=dropout,
        resid_pdrop=dropout, activation_function="gelu_new",
        bos_token_id=0, eos_token_id=0, tie_word_embeddings=True)


def build_model(config, seed: int, perturb: bool = True, dtype=torch.float64):
    """A random GPT2LMHeadModel in `dtype` (eval mode) whose parameters are float32-representable.

    perturb: LayerNorm weights 1 + 0.1 N(0,1), LayerNorm biases and every other bias 0.05 N(0,1),
    so that none of them is trivially 1 or 0.
    """
    from transformers import GPT2LMHeadModel
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config).to(dtype)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if perturb:
                noise = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(dtype)
                if ".ln_" in name and name.endswith(".weight"):
                    p.copy_(1.0 + 0.1 * noise)
                elif name.endswith(".bias"):
                    p.copy_(0.05 * noise)
            # the reference and nlptrain must hold the same numbers
            p.copy_(p.to(torch.float32).to(dtype))
    model.eval()
    assert model.lm_head.weight is model.transformer.wte.weight, "LM head is not tied"
    return model


def param_dict(model) -> dict[str, torch.Tensor]:
    """Parameters by HF name (tied weights once: transformer.wte.weight)."""
    return dict(model.named_parameters())


def save_weights(model, path: str | os.PathLike, include_lm_head: bool = True) -> Path:
    """Write model's state_dict as float32 datasets + GPT-2 config root attributes (nlptrain layout)."""
    cfg = model.config
    path = Path(path)
    sd = model.state_dict()
    with h5py.File(path, "w") as f:
        for k, v in sd.items():
            if k == "lm_head.weight" and not include_lm_head:
                continue
            if not torch.is_floating_point(v):
                continue  # (older transformers: boolean attn.bias buffers)
            if k.endswith(".attn.bias") or k.endswith(".attn.masked_bias"):
                continue
            f.create_dataset(k, data=v.detach().to(torch.float32).cpu().numpy())
        f.attrs["model_type"] = "gpt2"
        for key in ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions"):
            f.attrs[key] = np.int64(getattr(cfg, key))
        f.attrs["layer_norm_epsilon"] = np.float64(cfg.layer_norm_epsilon)
        for key in ("embd_pdrop", "attn_pdrop", "resid_pdrop", "initializer_range"):
            f.attrs[key] = np.float64(getattr(cfg, key))
    return path


# ---- datasets ---------------------------------------------------------------------------------------

def write_dataset(path: str | os.PathLike, input_ids, attention_mask=None, labels=None) -> Path:
    """2-D dataset: input_ids [N,T] int32, optional attention_mask and labels (-100 = ignore)."""
    nr.write_rows(path, input_ids, attention_mask, labels)
    return Path(path)


def write_token_stream(path: str | os.PathLike, tokens) -> Path:
    nr.write_stream(path, tokens)
    return Path(path)


def read_gradients(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every dataset of gradients.h5 (loss as a 0-d float64 array)."""
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = obj[()]
        f.visititems(visit)
    return out


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """Training lines of metrics.jsonl (those with no 'split' or split == 'train')."""
    rows = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        rec = json.loads(line)
        if rec.get("split", "train") == "train" and "loss" in rec:
            rows.append(rec)
    return rows


def rel_err(a, b) -> float:
    """Norm-wise relative error ||a - b|| / ||b|| in float64 (0 when both are zero)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, f"shape {a.shape} != reference shape {b.shape}"
    nb = np.linalg.norm(b.ravel())
    na = np.linalg.norm((a - b).ravel())
    if nb == 0.0:
        return 0.0 if na == 0.0 else float("inf")
    return float(na / nb)


# ---- the Hugging Face reference ---------------------------------------------------------------------

def clm_loss_f64(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """HF's ForCausalLMLoss (shift inside, ignore_index -100, mean over kept targets) kept in the
    logits' dtype. (transformers' own loss upcasts with logits.float(), which for float64 logits
    means a cast DOWN to float32; the reference here stays in float64.)"""
    V = logits.shape[-1]
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), shifted.reshape(-1),
                                             ignore_index=-100, reduction="mean")


def hf_reference(model, input_ids, attention_mask=None, labels=None):
    """Float64 reference: (loss, logits, {name: grad}, hf_loss) for one batch.

    The model is called like the HF docs say (input_ids, attention_mask, labels) and HF's own loss
    is returned as hf_loss for a cross-check; the loss that is differentiated is the same formula
    evaluated in float64 (clm_loss_f64)."""
    ids = torch.as_tensor(np.asarray(input_ids), dtype=torch.long)
    am = None if attention_mask is None else torch.as_tensor(np.asarray(attention_mask), dtype=torch.long)
    lab = ids.clone() if labels is None else torch.as_tensor(np.asarray(labels), dtype=torch.long)
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=am, labels=lab)
    loss = clm_loss_f64(out.logits, lab)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return loss.detach(), out.logits.detach(), grads, out.loss.detach()


def hf_decay_parameter_names(model) -> set[str]:
    """The HF Trainer's weight-decay parameter set (Trainer.get_decay_parameter_names)."""
    try:
        from transformers import Trainer
        names = Trainer.get_decay_parameter_names(None, model)
    except Exception:  # pragma: no cover - older/newer transformers
        from transformers.trainer_pt_utils import get_parameter_names
        names = get_parameter_names(model, [torch.nn.LayerNorm])
        names = [n for n in names if "bias" not in n]
    return set(names)
