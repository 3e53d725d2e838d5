#!/usr/bin/env python3
"""Import a Hugging Face model directory into nlptrain's HDF5 weights layout.

    python3 tools/hf_import.py SRC_DIR OUT.h5

SRC_DIR holds config.json and the weights: model.safetensors, a sharded model.safetensors.index.json,
pytorch_model.bin (read with torch.load(weights_only=True)) or a sharded pytorch_model.bin.index.json
(the first of these that exists is used, as transformers does).

OUT.h5 gets one float32 dataset per tensor, named like the state_dict key (float16/bfloat16/float64
tensors are converted, with a note), and config.json as root attributes: strings as strings, ints as
int64, floats as float64, bools as int64 0/1; the whole config.json is also kept as the JSON string
attribute 'hf_config_json', so that tools/hf_export.py restores it exactly. Non-float tensors are an
error, except buffers that are not weights (GPT-2's attn.bias / attn.masked_bias masks, BERT's
position_ids / token_type_ids), which are skipped with a note. A tied output head (lm_head.weight)
equal to the input embedding is dropped (nlptrain ties it); one that differs is kept with a warning
(nlptrain ties the head, so it would be ignored).

The output is written to a temporary file next to OUT.h5 and renamed onto it when complete: on any
error nothing is left behind. When SRC_DIR also holds a tokenizer (tokenizer.json, vocab.json +
merges.txt, encoder.json + vocab.bpe or vocab.txt), its fingerprints are recorded as the root
attributes tokenizer_files, tokenizer_sha256, vocab_sha256 and tokenizer_vocab_size (defined in
tools/hub_tokenizer.py), so that hf_export.py can copy the tokenizer along and nlptrain can check
that a dataset was tokenized with the same vocabulary.

Only the model types nlptrain runs are imported (model_type "gpt2", "bert", "roberta", "electra";
any other is refused, naming these): every tensor is copied. An ELECTRA generator (ElectraForMaskedLM:
generator_lm_head.*) is refused, as nlptrain fine-tunes the discriminator; the discriminator's own
head of ElectraForPreTraining (discriminator_predictions.*) is kept, and nlptrain reports it unused.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_layout import (CONFIG_JSON_ATTR, SUPPORTED_MODEL_TYPES, TIED_HEADS, WEIGHT_FILES, Log,  # noqa: E402
                       ToolError,
                       atomic_file, config_to_attrs, is_buffer_name, is_weight_name_ok, json_text,
                       main_wrapper)

TOOL = "hf_import"


# ---- reading the source directory ---------------------------------------------------------------------

def read_config(src: Path) -> dict:
    path = src / "config.json"
    if not path.is_file():
        raise ToolError(f"'{path}' not found (a Hugging Face model directory has config.json)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ToolError(f"cannot read '{path}': {e}") from None
    if not isinstance(config, dict):
        raise ToolError(f"'{path}' is not a JSON object")
    mt = config.get("model_type")
    if not isinstance(mt, str) or not mt:
        raise ToolError(f"'{path}' has no 'model_type' string (e.g. \"gpt2\", \"bert\")")
    if mt not in SUPPORTED_MODEL_TYPES:
        forms = "; ".join(f"{t} ({', '.join(c)})" for t, c in SUPPORTED_MODEL_TYPES.items())
        raise ToolError(f"'{path}' has model_type = {mt!r}, which nlptrain cannot run; it runs these model "
                        f"types, from these checkpoint forms: {forms}")
    return config


def check_checkpoint_form(config: dict, names: list[str], src: Path, log: Log) -> None:
    """Refuse an ELECTRA generator; say what nlptrain does with the discriminator's own head."""
    if config["model_type"] != "electra":
        return
    gen = [n for n in names if n.startswith(("generator_lm_head.", "generator_predictions."))]
    archs = config.get("architectures") or []
    if gen or "ElectraForMaskedLM" in archs:
        what = f"tensor '{gen[0]}'" if gen else "architectures = ['ElectraForMaskedLM']"
        raise ToolError(f"'{src}' is an ELECTRA generator ({what}): nlptrain fine-tunes the discriminator "
                        f"(ElectraModel or ElectraForPreTraining, e.g. the Hub's *-discriminator folders)")
    disc = [n for n in names if n.startswith("discriminator_predictions.")]
    if disc:
        log.note(f"kept {len(disc)} tensor(s) of ElectraForPreTraining's discriminator head "
                 f"(discriminator_predictions.*): nlptrain's tasks do not use them and report them unused")


# A tensor getter: called once, returns a torch.Tensor.
Entry = tuple[str, Path, Callable]


def _open_safetensors(path: Path, stack: contextlib.ExitStack) -> list[Entry]:
    from safetensors import safe_open

    if not path.is_file():
        raise ToolError(f"weights file '{path}' not found")
    try:
        f = stack.enter_context(safe_open(str(path), framework="pt"))
        keys = list(f.keys())
    except Exception as e:  # SafetensorError, OSError, ...
        raise ToolError(f"cannot read safetensors file '{path}': {e}") from None

    def getter(k):
        def get():
            try:
                return f.get_tensor(k)
            except Exception as e:
                raise ToolError(f"cannot read tensor '{k}' from '{path}': {e}") from None
        return get

    return [(k, path, getter(k)) for k in keys]


def _open_bin(path: Path) -> list[Entry]:
    import pickle

    import torch

    if not path.is_file():
        raise ToolError(f"weights file '{path}' not found")
    sd = None
    err: Exception | None = None
    for mmap in (True, False):
        try:
            sd = torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)
            break
        except (RuntimeError, pickle.UnpicklingError, EOFError, OSError, ValueError, KeyError,
                AttributeError, TypeError, ImportError, IndexError) as e:
            err = e
    if sd is None:
        raise ToolError(f"cannot read PyTorch weights file '{path}' (torch.load, weights_only=True): "
                        f"{_torch_load_reason(err)}")
    if not isinstance(sd, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                           for k, v in sd.items()):
        hint = ""
        if isinstance(sd, dict):
            nested = [k for k, v in sd.items() if isinstance(v, dict)]
            if nested:
                hint = f" (it has nested dicts: {', '.join(map(str, nested[:5]))})"
        raise ToolError(f"'{path}' is not a state_dict (a dict of tensor name -> tensor){hint}")
    return [(k, path, (lambda v=v: v)) for k, v in sd.items()]


def _torch_load_reason(err: Exception) -> str:
    """The useful part of a torch.load error (its weights_only message is mostly advice)."""
    text = str(err).strip()
    if "WeightsUnpickler error:" in text:
        detail = text.split("WeightsUnpickler error:", 1)[1].split("Check the documentation", 1)[0]
        detail = " ".join(detail.split())
        return (f"the file is corrupt or holds objects other than tensors, which weights_only=True "
                f"refuses ({detail})")
    first = text.splitlines()[0] if text else type(err).__name__
    return first.split(" This is an internal miniz error.")[0]


def _open_index(path: Path, stack: contextlib.ExitStack, opener, log: Log) -> list[Entry]:
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
        weight_map = index["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                       for k, v in weight_map.items()):
            raise ValueError("'weight_map' is not a dict of tensor name -> file name")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ToolError(f"cannot read shard index '{path}': {e!s}") from None
    shards: list[str] = []
    for shard in weight_map.values():
        if shard not in shards:
            shards.append(shard)
    entries: list[Entry] = []
    for shard in shards:
        shard_path = path.parent / shard
        if Path(shard).is_absolute() or ".." in Path(shard).parts:
            raise ToolError(f"shard index '{path}' names '{shard}', which is outside the directory")
        if not shard_path.is_file():
            raise ToolError(f"shard '{shard_path}' (listed in '{path}') not found")
        got = opener(shard_path, stack) if opener is _open_safetensors else opener(shard_path)
        for name, p, get in got:
            listed = weight_map.get(name)
            if listed is None:
                log.note(f"tensor '{name}' in '{shard_path}' is not listed in '{path}'; imported anyway")
            elif listed != shard:
                continue  # listed in another shard: that one is authoritative
            entries.append((name, p, get))
    found = {e[0] for e in entries}
    missing = [k for k in weight_map if k not in found]
    if missing:
        raise ToolError(f"shard index '{path}' lists {len(missing)} tensor(s) not found in their shard, "
                        f"e.g. '{missing[0]}' in '{path.parent / weight_map[missing[0]]}'")
    return entries


def open_weights(src: Path, stack: contextlib.ExitStack, log: Log) -> tuple[Path, list[Entry]]:
    present = [name for name in WEIGHT_FILES if (src / name).exists()]
    if not present:
        raise ToolError(f"no weights in '{src}' (expected one of: {', '.join(WEIGHT_FILES)})")
    name = present[0]
    if len(present) > 1:
        log.note(f"'{src}' has {', '.join(present)}; reading {name}")
    path = src / name
    if name == "model.safetensors":
        entries = _open_safetensors(path, stack)
    elif name == "pytorch_model.bin":
        entries = _open_bin(path)
    elif name == "model.safetensors.index.json":
        entries = _open_index(path, stack, _open_safetensors, log)
    else:
        entries = _open_index(path, stack, _open_bin, log)
    return path, entries


# ---- conversion -------------------------------------------------------------------------------------------

def to_float32(name: str, file: Path, t, log: Log, converted: dict):
    """A torch tensor as a float32 numpy array (None for a skipped buffer); raises for non-float."""
    import torch

    if is_buffer_name(name):
        converted.setdefault("buffers", []).append(name)
        return None
    if not t.is_floating_point():
        raise ToolError(f"tensor '{name}' in '{file}' has dtype {str(t.dtype).replace('torch.', '')}: "
                        f"nlptrain weights are float32 (only float tensors can be imported)")
    if t.dtype != torch.float32:
        t32 = t.to(torch.float32)
        key = str(t.dtype).replace("torch.", "")
        converted[key] = converted.get(key, 0) + 1
        if t.dtype == torch.float64 and not torch.equal(t32.to(torch.float64), t):
            converted.setdefault("lossy", []).append(name)
        t = t32
    return t.detach().contiguous().numpy()


def gpt2_support_warnings(config: dict, log: Log) -> None:
    """Warn about GPT-2 config features that nlptrain's GPT-2 does not implement."""
    act = config.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        log.warn(f"activation_function = {act!r}: nlptrain's GPT-2 uses gelu_new (tanh approximation)")
    n_inner, n_embd = config.get("n_inner"), config.get("n_embd")
    if n_inner is not None and isinstance(n_embd, int) and n_inner != 4 * n_embd:
        log.warn(f"n_inner = {n_inner}: nlptrain's GPT-2 uses 4 * n_embd = {4 * n_embd}")
    for key, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                    ("add_cross_attention", False)):
        if key in config and bool(config[key]) != ok:
            log.warn(f"{key} = {config[key]}: nlptrain's GPT-2 implements only {key} = {ok}")


def tokenizer_attrs(src: Path, log: Log) -> dict:
    """tokenizer_files / tokenizer_sha256 / vocab_sha256 / tokenizer_vocab_size of the tokenizer in
    src (tools/hub_tokenizer.py), or {} when src holds none (or one that does not load: a warning)."""
    import numpy as np

    import hub_tokenizer as ht

    if not any((src / n).is_file() for names in ht.MODEL_FILES for n in names):
        log.note(f"'{src}' holds no tokenizer files: no tokenizer fingerprints recorded")
        return {}
    try:
        tok = ht.load(str(src))
    except ht.DataError as e:
        log.warn(f"the tokenizer in '{src}' does not load ({e}): no tokenizer fingerprints recorded")
        return {}
    log.note(f"recorded the tokenizer {', '.join(os.path.basename(p) for p in tok.files)} "
             f"(vocab_sha256 {tok.vocab_sha256[:12]}..., {tok.vocab_size} tokens)")
    return {"tokenizer_files": "\n".join(tok.files), "tokenizer_sha256": tok.tokenizer_sha256,
            "vocab_sha256": tok.vocab_sha256, "tokenizer_vocab_size": np.int64(tok.vocab_size)}


def import_dir(src: Path, out: Path, log: Log) -> None:
    import h5py
    import numpy as np

    if not src.exists():
        raise ToolError(f"source directory '{src}' not found")
    if not src.is_dir():
        raise ToolError(f"source '{src}' is not a directory (expected a Hugging Face model directory)")
    config = read_config(src)
    model_type = config["model_type"]
    if model_type == "gpt2":
        gpt2_support_warnings(config, log)
    tied = config.get("tie_word_embeddings", True) is not False
    tied_heads = TIED_HEADS.get(model_type, {})

    with contextlib.ExitStack() as stack:
        weights_path, entries = open_weights(src, stack, log)
        seen: dict[str, Path] = {}
        for name, file, _ in entries:
            if not is_weight_name_ok(name):
                raise ToolError(f"tensor name {name!r} in '{file}' cannot be an HDF5 dataset name")
            if name in seen:
                raise ToolError(f"tensor '{name}' appears twice (in '{seen[name]}' and '{file}')")
            seen[name] = file
        if not entries:
            raise ToolError(f"'{weights_path}' holds no tensors")
        check_checkpoint_form(config, [e[0] for e in entries], src, log)

        converted: dict = {}
        written = 0
        with atomic_file(out, "HDF5 output") as tmp:
            with h5py.File(tmp, "w") as f:
                heads = []
                for name, file, get in entries:
                    if name in tied_heads:
                        heads.append((name, file, get))
                        continue
                    arr = to_float32(name, file, get(), log, converted)
                    if arr is not None:
                        f.create_dataset(name, data=arr)
                        written += 1
                for name, file, get in heads:
                    emb = tied_heads[name]
                    arr = to_float32(name, file, get(), log, converted)
                    if arr is None:
                        continue
                    if not tied:
                        log.warn(f"config.json has tie_word_embeddings = false and '{name}' is kept, but "
                                 f"nlptrain ties the head to '{emb}' and ignores '{name}'")
                    elif emb in f and f[emb].shape == arr.shape and np.array_equal(f[emb][()], arr):
                        log.note(f"dropped '{name}': equal to '{emb}' (tied)")
                        continue
                    else:
                        log.warn(f"'{name}' differs from '{emb}'; it is kept, but nlptrain ties the head "
                                 f"to '{emb}' and ignores '{name}'")
                    f.create_dataset(name, data=arr)
                    written += 1
                if written == 0:
                    raise ToolError(f"'{weights_path}' holds no weight tensors (only buffers)")

                for key, val in config_to_attrs(config, log).items():
                    f.attrs[key] = val
                f.attrs[CONFIG_JSON_ATTR] = json_text(config)
                for key, val in tokenizer_attrs(src, log).items():
                    f.attrs[key] = val
        for dt in ("float16", "bfloat16", "float64"):
            if converted.get(dt):
                log.note(f"converted {converted[dt]} {dt} tensor(s) to float32")
        for dt, n in converted.items():
            if dt not in ("float16", "bfloat16", "float64", "lossy", "buffers"):
                log.note(f"converted {n} {dt} tensor(s) to float32")
        if converted.get("buffers"):
            skipped = converted["buffers"]
            shown = ", ".join(f"'{n}'" for n in skipped[:4]) + (", ..." if len(skipped) > 4 else "")
            log.note(f"skipped {len(skipped)} buffer(s) that are not weights (transformers rebuilds them): "
                     f"{shown}")
        if converted.get("lossy"):
            lossy = converted["lossy"]
            log.warn(f"{len(lossy)} float64 tensor(s) lost precision in float32, e.g. '{lossy[0]}'")
    log.note(f"wrote '{out}': {written} tensors, model_type = {model_type!r}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="hf_import.py",
        description="Import a Hugging Face model directory (config.json + model.safetensors / sharded "
                    "safetensors / pytorch_model.bin) into an nlptrain HDF5 weights file.",
        epilog="Every tensor becomes a float32 dataset named like its state_dict key; config.json "
               "becomes root attributes (plus the whole file as the 'hf_config_json' attribute). "
               "The output is written atomically (temporary file, then rename).")
    ap.add_argument("src_dir", metavar="SRC_DIR", type=Path,
                    help="Hugging Face model directory (config.json and weights)")
    ap.add_argument("out", metavar="OUT.h5", type=Path, help="nlptrain weights file to write")
    ap.add_argument("-q", "--quiet", action="store_true", help="print warnings and errors only")
    args = ap.parse_args(argv)
    import_dir(args.src_dir, args.out, Log(TOOL, args.quiet))


if __name__ == "__main__":
    sys.exit(main_wrapper(TOOL, main))
