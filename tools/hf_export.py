#!/usr/bin/env python3
"""Export an nlptrain HDF5 weights file or checkpoint as a Hugging Face model directory.

    python3 tools/hf_export.py IN.h5 OUT_DIR [--format safetensors|bin]

OUT_DIR gets config.json and model.safetensors (or pytorch_model.bin with --format bin) so that
transformers' from_pretrained(OUT_DIR) loads it (AutoModelForCausalLM for GPT-2, the class named in
config.json for BERT, RoBERTa and ELECTRA) with no missing or unexpected keys.

Tensors: every float dataset at the root of IN.h5, under its own name, as float32. The 'optimizer/'
group of a checkpoint (AdamW moments) is skipped.

config.json: the 'hf_config_json' attribute that tools/hf_import.py stores (restored exactly), or
--config FILE; root attributes that say something else override it (with a warning). Without either,
config.json is rebuilt from the root attributes (model_type, the HF config names; bools restored from
0/1; 'architectures' from the attribute, --architecture, or the tensor names). The 'nlptrain_*'
attributes of a checkpoint are skipped.

Tokenizer: the files named by the 'tokenizer_files' root attribute (written by hf_import.py and
copied by nlptrain from its training data) are copied into OUT_DIR, or those of --tokenizer PATH (a
Hugging Face tokenizer folder or file; it wins over the attribute). Without either, a loud warning:
AutoTokenizer cannot load the folder (--no-tokenizer: export the model alone, knowingly, no warning). The tokenizer's bos/eos/pad ids go into config.json
(bos_token_id, eos_token_id, pad_token_id) where the config has none; the tokenizer attributes are
not config entries. A tokenizer larger than the model's vocab_size is an error.

Before anything is written the tensors are checked against the architecture instantiated by
transformers on the 'meta' device (names and shapes; skip with --no-check). The directory is built
under a temporary name next to OUT_DIR and renamed when complete: on any error nothing is left.
OUT_DIR must not exist (or be empty) unless --overwrite is given, which replaces config.json and the
weights file one file at a time (each atomically) and removes stale weight files of other formats.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_layout import (CONFIG_JSON_ATTR, DEFAULT_ARCHITECTURE, NLPTRAIN_ATTR_PREFIX,  # noqa: E402
                       NULL_PAD_TOKEN_ID, OPTIMIZER_GROUP, WEIGHT_FILES, Log, ToolError, atomic_dir,
                       attr_matches_config, attr_to_python, check_parent, float32_shortest,
                       id2label_list, json_text, label_maps, main_wrapper, _fsync_dir, _fsync_file,
                       _umask)

TOOL = "hf_export"
# Root attributes that describe the tokenizer (hf_import.py, nlptrain), not the model config.
TOKENIZER_ATTRS = ("tokenizer_files", "tokenizer_sha256", "vocab_sha256", "tokenizer_vocab_size")
WEIGHT_FILE = {"safetensors": "model.safetensors", "bin": "pytorch_model.bin"}


# ---- reading the HDF5 file ------------------------------------------------------------------------------

def read_h5(path: Path, log: Log):
    """(tensors {name: float32 ndarray}, model attributes {name: python value}, hf_config_json or None)."""
    import h5py
    import numpy as np

    if not path.exists():
        raise ToolError(f"input file '{path}' not found")
    if path.is_dir():
        raise ToolError(f"input '{path}' is a directory (expected an nlptrain HDF5 weights file)")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise ToolError(f"cannot read HDF5 file '{path}': {e}") from None
    tensors: dict[str, np.ndarray] = {}
    attrs: dict = {}
    config_json = None
    converted: dict[str, int] = {}
    with f:
        try:
            for key in f.attrs.keys():
                if key.startswith(NLPTRAIN_ATTR_PREFIX):
                    continue
                val = attr_to_python(f.attrs[key])
                if key == CONFIG_JSON_ATTR:
                    if not isinstance(val, str):
                        raise ToolError(f"'{path}': attribute '{CONFIG_JSON_ATTR}' is not a string")
                    config_json = val
                else:
                    attrs[key] = val
            for name, obj in f.items():
                if isinstance(obj, h5py.Group):
                    if name == OPTIMIZER_GROUP:
                        log.note(f"skipped the '{name}/' group (optimizer state)")
                    else:
                        log.note(f"skipped the '{name}/' group (not a model tensor)")
                    continue
                if not isinstance(obj, h5py.Dataset):
                    continue
                if obj.dtype.kind != "f":
                    raise ToolError(f"'{path}': dataset '{name}' has dtype {obj.dtype}, expected float32 "
                                    f"(is this an nlptrain weights file?)")
                arr = obj[()]
                if arr.dtype != np.float32:
                    converted[str(arr.dtype)] = converted.get(str(arr.dtype), 0) + 1
                    arr = arr.astype(np.float32)
                tensors[name] = np.ascontiguousarray(arr)
        except ToolError:
            raise
        except (OSError, KeyError, ValueError, RuntimeError) as e:
            raise ToolError(f"cannot read HDF5 file '{path}': {e}") from None
    for dt, n in converted.items():
        log.note(f"converted {n} {dt} dataset(s) to float32")
    if not tensors:
        raise ToolError(f"'{path}' has no tensors at its root (expected nlptrain weights: one float32 "
                        f"dataset per Hugging Face state_dict key)")
    if not isinstance(attrs.get("model_type"), str) or not attrs["model_type"]:
        if config_json is None:
            raise ToolError(f"'{path}' has no 'model_type' root attribute (expected \"gpt2\" or \"bert\"); "
                            f"is it an nlptrain weights file?")
    return tensors, attrs, config_json


# ---- config.json ------------------------------------------------------------------------------------------

def infer_architecture(model_type: str, names) -> str | None:
    """The transformers class for a file without 'architectures', from model_type and tensor names."""
    if model_type in DEFAULT_ARCHITECTURE:
        return DEFAULT_ARCHITECTURE[model_type]
    if model_type == "bert":
        def has(prefix):
            return any(n.startswith(prefix) for n in names)
        if has("cls.predictions.") and has("cls.seq_relationship."):
            return "BertForPreTraining"
        if has("cls.predictions."):
            return "BertForMaskedLM"
        if has("cls.seq_relationship."):
            return "BertForNextSentencePrediction"
        if has("qa_outputs."):
            return "BertForQuestionAnswering"
        if "classifier.weight" in names:
            return "BertForSequenceClassification" if has("bert.pooler.") else "BertForTokenClassification"
        if has("embeddings.") and not has("bert."):
            return "BertModel"
    if model_type in ("roberta", "electra"):
        family = "Roberta" if model_type == "roberta" else "Electra"

        def has(prefix):
            return any(n.startswith(prefix) for n in names)
        if has("lm_head."):
            return "RobertaForMaskedLM" if model_type == "roberta" else None
        if has("discriminator_predictions."):
            return "ElectraForPreTraining" if model_type == "electra" else None
        if has("qa_outputs."):
            return f"{family}ForQuestionAnswering"
        if "classifier.out_proj.weight" in names:
            return f"{family}ForSequenceClassification"
        if "classifier.weight" in names:
            return f"{family}ForTokenClassification"
        if has("embeddings.") and not has(f"{model_type}."):
            return f"{family}Model"
    return None


class ConfigDefaults:
    """Default values of transformers' config class for model_type (none without transformers),
    looked up only when needed (importing transformers takes seconds)."""

    def __init__(self, model_type: str):
        self.model_type = model_type
        self._values: dict | None = None

    def get(self, key: str, default=None):
        if self._values is None:
            try:
                from transformers import AutoConfig
                self._values = AutoConfig.for_model(self.model_type).to_dict()
            except Exception:  # transformers missing or model_type unknown to it
                self._values = {}
        return self._values.get(key, default)


def restore_value(key: str, val, ref_default):
    """An attribute value as a config.json value: 'architectures' as a list, bools from 0/1,
    pad_token_id -1 as null, id2label from a JSON list of names to config.json's {"0": name} dict,
    float32-rounded floats as their shortest decimal."""
    if key == "architectures" and isinstance(val, str):
        s = val.strip()
        if s.startswith("["):
            try:
                lst = json.loads(s)
                if isinstance(lst, list):
                    return lst
            except json.JSONDecodeError:
                pass
        return [val]
    if key == "pad_token_id" and val == NULL_PAD_TOKEN_ID:
        return None
    if key == "id2label" and isinstance(val, str) and val.strip().startswith("["):
        try:
            names = json.loads(val)
        except json.JSONDecodeError:
            names = None
        if isinstance(names, list) and all(isinstance(n, str) for n in names):
            return label_maps(names)[0]
    if isinstance(ref_default, bool) and isinstance(val, int) and val in (0, 1):
        return bool(val)
    if isinstance(val, float):
        return float32_shortest(val)
    return val


def build_config(in_path: Path, tensors: dict, attrs: dict, config_json: str | None,
                 base_path: Path | None, architecture: str | None, log: Log) -> dict:
    base = None
    if base_path is not None:
        p = base_path / "config.json" if base_path.is_dir() else base_path
        try:
            base = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ToolError(f"cannot read config '{p}': {e}") from None
        if not isinstance(base, dict):
            raise ToolError(f"config '{p}' is not a JSON object")
        where = f"'{p}'"
    elif config_json is not None:
        try:
            base = json.loads(config_json)
        except json.JSONDecodeError as e:
            raise ToolError(f"'{in_path}': attribute '{CONFIG_JSON_ATTR}' is not valid JSON: {e}") from None
        if not isinstance(base, dict):
            raise ToolError(f"'{in_path}': attribute '{CONFIG_JSON_ATTR}' is not a JSON object")
        where = f"the '{CONFIG_JSON_ATTR}' attribute"

    model_type = attrs.get("model_type") or (base or {}).get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ToolError(f"'{in_path}': no model_type (neither a root attribute nor in the config)")
    defaults = ConfigDefaults(model_type)

    if base is not None:
        config = dict(base)
        if base.get("model_type") not in (None, model_type):
            raise ToolError(f"'{in_path}' has model_type = {model_type!r} but {where} says "
                            f"{base.get('model_type')!r}")
        for key, val in attrs.items():
            if attr_matches_config(key, val, config):
                continue
            new = restore_value(key, val, config[key] if key in config else defaults.get(key))
            if key in config:
                log.warn(f"root attribute {key} = {val!r} overrides {config[key]!r} from {where}")
            else:
                log.note(f"root attribute {key} = {new!r} added to the config ({where} has no '{key}')")
            config[key] = new
    else:
        config = {"model_type": model_type}
        for key, val in attrs.items():
            if key != "model_type":
                config[key] = restore_value(key, val, defaults.get(key) if isinstance(val, int) else None)
        # transformers' default special token ids (GPT-2: 50256) do not exist in a smaller vocabulary
        vocab = config.get("vocab_size")
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            d = defaults.get(key)
            if key not in config and isinstance(vocab, int) and isinstance(d, int) and d >= vocab:
                config[key] = None
                log.note(f"{key} = null (the {model_type} default {d} is outside vocab_size = {vocab})")

    if architecture:
        if config.get("architectures") not in (None, [architecture]):
            log.note(f"architectures = [{architecture!r}] (--architecture) replaces "
                     f"{config['architectures']!r}")
        config["architectures"] = [architecture]
    elif not config.get("architectures"):
        arch = infer_architecture(model_type, tensors.keys())
        if arch is None:
            raise ToolError(f"'{in_path}' does not say which {model_type} architecture it holds (no "
                            f"'architectures' attribute) and the tensor names do not tell: "
                            f"pass --architecture (e.g. BertForSequenceClassification)")
        log.note(f"architectures = [{arch!r}] (inferred from model_type and tensor names)")
        config["architectures"] = [arch]
    # Label names from the id2label attribute (nlptrain writes a JSON list): label2id follows them.
    if "id2label" in attrs and not (base is not None and attr_matches_config("id2label", attrs["id2label"], base)):
        names = id2label_list(config.get("id2label"))
        if names is not None:
            config["label2id"] = label_maps(names)[1]
    # A classification head without num_labels / id2label: take the label count from the tensor.
    arch0 = config["architectures"][0] if config.get("architectures") else ""
    cls_w = tensors.get("classifier.weight", tensors.get("classifier.out_proj.weight"))
    if (cls_w is not None and cls_w.ndim == 2 and arch0.endswith("Classification")
            and "num_labels" not in config and "id2label" not in config):
        config["num_labels"] = int(cls_w.shape[0])
        log.note(f"num_labels = {cls_w.shape[0]} (from classifier.weight)")
    for key in ("dtype", "torch_dtype"):
        if key in config and config[key] not in (None, "float32"):
            log.note(f"config {key} = {config[key]!r} set to 'float32' (the exported weights are float32)")
            config[key] = "float32"
    return config


# ---- checking against transformers ----------------------------------------------------------------------

def check_with_transformers(config_dir: Path, config: dict, tensors: dict, log: Log) -> None:
    """Instantiate config.json's architecture on the meta device; every parameter (tied ones once)
    and persistent buffer must be in `tensors` with the same shape, and nothing else."""
    try:
        import torch
        import transformers
    except ImportError:
        log.note("transformers is not installed: the tensors were not checked against the architecture")
        return
    archs = config.get("architectures") or []
    arch = archs[0] if archs else None
    cls = getattr(transformers, arch, None) if isinstance(arch, str) else None
    if cls is None:
        log.note(f"transformers has no class {arch!r}: the tensors were not checked against it")
        return
    import logging
    prev = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        cfg = transformers.AutoConfig.from_pretrained(str(config_dir))
        with torch.device("meta"):
            model = cls(cfg)
    except Exception as e:
        raise ToolError(f"transformers cannot build {arch} from the exported config.json: "
                        f"{type(e).__name__}: {e} (use --no-check to export anyway)") from None
    finally:
        transformers.logging.set_verbosity(prev)
    sd = model.state_dict()
    names = {n: n for n in tensors}
    prefix = getattr(model, "base_model_prefix", "") or ""
    if prefix and not any(n.startswith(prefix + ".") for n in sd) and \
            any(n.startswith(prefix + ".") for n in tensors):
        # a base model (GPT2Model, BertModel) from a file of a model with a head: transformers
        # strips the prefix ('transformer.', 'bert.') when it loads
        names = {(n[len(prefix) + 1:] if n.startswith(prefix + ".") else n): n for n in tensors}
    tensors = {k: tensors[v] for k, v in names.items()}
    params = dict(model.named_parameters())  # tied parameters once, under their first name
    all_params = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    expected = set(params) | {n for n in sd if n not in all_params}
    missing = sorted(expected - set(tensors))
    unexpected = sorted(set(tensors) - set(sd))
    mismatched = sorted(n for n in set(tensors) & set(sd) if tuple(sd[n].shape) != tuple(tensors[n].shape))
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing (e.g. '{missing[0]}' {list(sd[missing[0]].shape)})")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected (e.g. '{unexpected[0]}')")
    if mismatched:
        n = mismatched[0]
        problems.append(f"{len(mismatched)} with another shape (e.g. '{n}' is {list(tensors[n].shape)}, "
                        f"{arch} has {list(sd[n].shape)})")
    if problems:
        raise ToolError(f"the tensors do not match {arch} built from config.json: {'; '.join(problems)} "
                        f"(choose the class with --architecture, or export anyway with --no-check)")


# ---- writing ----------------------------------------------------------------------------------------------

def write_files(tmp: Path, tensors: dict, fmt: str) -> None:
    weights = tmp / WEIGHT_FILE[fmt]
    if fmt == "safetensors":
        from safetensors.numpy import save_file
        save_file(tensors, str(weights), metadata={"format": "pt"})
    else:
        import torch
        torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, str(weights))


def stale_weight_files(out: Path, keep: str) -> list[Path]:
    stale = [out / n for n in WEIGHT_FILES if n != keep and (out / n).exists()]
    stale += sorted(out.glob("model-*-of-*.safetensors")) + sorted(out.glob("pytorch_model-*-of-*.bin"))
    return stale


def find_tokenizer(in_path: Path, tok_attrs: dict, tokenizer: str | None, log: Log, none_ok: bool = False):
    """The tokenizer to copy (hub_tokenizer.HubTokenizer) or None, with a warning when there is none."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import hub_tokenizer as ht

    if tokenizer:
        try:
            tok = ht.load(tokenizer)
        except ht.DataError as e:
            raise ToolError(f"--tokenizer: {e}") from None
        if tok.kind != "hub":
            raise ToolError(f"--tokenizer {tokenizer}: give a tokenizer folder or file (the built-in "
                            f"'{tok.kind}' has no files to export)")
        want = tok_attrs.get("vocab_sha256")
        if isinstance(want, str) and want != tok.vocab_sha256:
            log.warn(f"--tokenizer {tokenizer} has vocab_sha256 {tok.vocab_sha256[:12]}..., but '{in_path}' was "
                     f"made with {want[:12]}...: a different vocabulary")
        return tok
    files = tok_attrs.get("tokenizer_files")
    if isinstance(files, str) and files.strip():
        paths = [p for p in files.split("\n") if p]
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            log.warn(f"the tokenizer file '{missing[0]}' named by '{in_path}' is gone: the export has NO "
                     f"tokenizer (pass --tokenizer PATH)")
            return None
        try:
            tok = ht.load(paths[0])
        except ht.DataError as e:
            log.warn(f"the tokenizer named by '{in_path}' does not load ({e}): the export has NO tokenizer "
                     f"(pass --tokenizer PATH)")
            return None
        tok.files = paths
        want = tok_attrs.get("tokenizer_sha256")
        if isinstance(want, str) and ht.files_sha256(paths) != want:
            log.warn(f"the tokenizer files named by '{in_path}' changed since it was written (tokenizer_sha256 "
                     f"differs)")
        return tok
    if none_ok:
        return None
    log.warn(f"'{in_path}' names no tokenizer (no tokenizer_files attribute) and no --tokenizer was given: "
             f"the export has NO tokenizer files, and AutoTokenizer.from_pretrained on it will fail or "
             f"build a useless one; pass --tokenizer PATH (the folder the training data was made with)")
    return None


def export(in_path: Path, out: Path, fmt: str, architecture: str | None, base_config: Path | None,
           check: bool, overwrite: bool, log: Log, tokenizer: str | None = None, no_tokenizer: bool = False) -> None:
    tensors, attrs, config_json = read_h5(in_path, log)
    tok_attrs = {k: attrs.pop(k) for k in TOKENIZER_ATTRS if k in attrs}
    if no_tokenizer and tokenizer:
        raise ToolError("--no-tokenizer and --tokenizer exclude each other")
    tok = None if no_tokenizer else find_tokenizer(in_path, tok_attrs, tokenizer, log)
    config = build_config(in_path, tensors, attrs, config_json, base_config, architecture, log)
    if tok is not None:
        vs = config.get("vocab_size")
        if isinstance(vs, int) and tok.vocab_size > vs:
            raise ToolError(f"the tokenizer ({', '.join(tok.files)}) has {tok.vocab_size} tokens, more than the "
                            f"model's vocab_size = {vs}")
        for key in ("bos", "eos", "pad"):
            i = tok.special.get(key)
            if i is None:
                continue
            cur = config.get(f"{key}_token_id")
            if cur is None:
                config[f"{key}_token_id"] = i
                log.note(f"{key}_token_id = {i} (from the tokenizer)")
            elif cur != i:
                log.warn(f"config.json {key}_token_id = {cur} but the tokenizer's {key} token is {i}")
    check_parent(out, "output directory")
    if out.exists() and not out.is_dir():
        raise ToolError(f"output directory '{out}' exists and is not a directory")
    replace_in_place = out.is_dir() and any(out.iterdir())
    if replace_in_place and not overwrite:
        raise ToolError(f"output directory '{out}' already exists and is not empty (use --overwrite to "
                        f"replace its config.json and weights)")

    tok_names = [os.path.basename(p) for p in tok.files] if tok is not None else []

    def build(tmp: Path):
        (tmp / "config.json").write_text(json_text(config), encoding="utf-8")
        if check:
            check_with_transformers(tmp, config, tensors, log)
        write_files(tmp, tensors, fmt)
        for p in (tok.files if tok is not None else []):
            if os.path.basename(p) == "config.json":
                continue
            shutil.copyfile(p, tmp / os.path.basename(p))

    if not replace_in_place:
        with atomic_dir(out) as tmp:
            build(tmp)
    else:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out))
        try:
            build(tmp)
            for name in [n for n in tok_names if n != "config.json"] + [WEIGHT_FILE[fmt], "config.json"]:
                _fsync_file(tmp / name)
                os.chmod(tmp / name, 0o666 & ~_umask())
                os.replace(tmp / name, out / name)
            for p in stale_weight_files(out, WEIGHT_FILE[fmt]):
                log.note(f"removed stale weights file '{p}'")
                p.unlink()
            _fsync_dir(out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log.note(f"wrote '{out}': config.json ({config['architectures'][0]}) and {WEIGHT_FILE[fmt]} "
             f"({len(tensors)} tensors)" + (f", tokenizer {', '.join(tok_names)}" if tok_names else ", NO tokenizer"))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="hf_export.py",
        description="Export an nlptrain HDF5 weights file or checkpoint as a Hugging Face model directory "
                    "(config.json + model.safetensors or pytorch_model.bin) that transformers' "
                    "from_pretrained loads.",
        epilog="config.json comes from the 'hf_config_json' attribute written by hf_import.py (or "
               "--config), else it is rebuilt from the root attributes. The optimizer/ group and the "
               "nlptrain_* attributes of a checkpoint are skipped. The directory is written atomically "
               "(temporary directory, then rename).")
    ap.add_argument("in_path", metavar="IN.h5", type=Path, help="nlptrain weights file or checkpoint")
    ap.add_argument("out", metavar="OUT_DIR", type=Path,
                    help="directory to create (must not exist or be empty, unless --overwrite)")
    ap.add_argument("--format", choices=("safetensors", "bin"), default="safetensors",
                    help="weights file: model.safetensors (default) or pytorch_model.bin")
    ap.add_argument("--architecture", metavar="CLASS",
                    help="transformers class for config.json 'architectures' (default: from the file, "
                         "else GPT2LMHeadModel for gpt2 / inferred from the BERT head tensors)")
    ap.add_argument("--config", metavar="PATH", type=Path, dest="base_config",
                    help="config.json (or a model directory holding one) to start from instead of the "
                         "file's hf_config_json, e.g. the original model's when exporting a fine-tuned "
                         "checkpoint; root attributes override it")
    ap.add_argument("--tokenizer", metavar="PATH",
                    help="Hugging Face tokenizer folder or file to copy into OUT_DIR (default: the files named "
                         "by the weights file's tokenizer_files attribute)")
    ap.add_argument("--no-tokenizer", action="store_true",
                    help="export the model without tokenizer files, without the warning")
    ap.add_argument("--no-check", action="store_true",
                    help="do not check the tensors against the architecture built by transformers")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace config.json and the weights in an existing non-empty OUT_DIR")
    ap.add_argument("-q", "--quiet", action="store_true", help="print warnings and errors only")
    args = ap.parse_args(argv)
    export(args.in_path, args.out, args.format, args.architecture, args.base_config, not args.no_check,
           args.overwrite, Log(TOOL, args.quiet), args.tokenizer, args.no_tokenizer)


if __name__ == "__main__":
    sys.exit(main_wrapper(TOOL, main))
