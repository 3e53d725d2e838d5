"""Shared helpers of tools/hf_import.py and tools/hf_export.py (Hugging Face <-> nlptrain HDF5).

nlptrain's weights layout (README.md, "HDF5 layouts"): one float32 dataset per tensor at the root of
the file, named exactly like the transformers state_dict key, plus the model config as root attributes
(``model_type`` as a variable-length UTF-8 string, the HF config names: ints as int64, floats as
float64, strings as strings, bools as int64 0/1). The importer also stores the whole config.json as
the JSON string attribute ``hf_config_json`` so that the exporter restores it exactly. An nlptrain
checkpoint adds an ``optimizer/`` group and ``nlptrain_*`` root attributes, which the exporter skips.

Nothing here is specific to one model type: every tensor is copied, every config entry maps to an
attribute. The few model-specific facts (tied heads, buffers that are not weights, the default
architecture of a model type) are the tables below.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

# Root attribute holding the whole config.json (written by hf_import.py).
CONFIG_JSON_ATTR = "hf_config_json"
# Root attributes with this prefix are nlptrain run state (checkpoints), never model config.
NLPTRAIN_ATTR_PREFIX = "nlptrain_"
# The pad_token_id attribute of a config.json whose pad_token_id is null (nlptrain's "none").
NULL_PAD_TOKEN_ID = -1
# Groups of an nlptrain checkpoint that hold no model weights.
OPTIMIZER_GROUP = "optimizer"

# Tied output heads by model_type: head tensor -> the input embedding it is tied to (when
# tie_word_embeddings, the default). nlptrain always ties them.
TIED_HEADS = {
    "gpt2": {"lm_head.weight": "transformer.wte.weight"},  # GPT2LMHeadModel
    "bert": {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight"},  # ForMaskedLM, ForPreTraining
    "roberta": {"lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight"},  # RobertaForMaskedLM
}

# The model_type values nlptrain runs (model.type), and the checkpoint forms of each that
# tools/hf_import.py takes (transformers' class names; a base model's file has no head).
SUPPORTED_MODEL_TYPES = {
    "gpt2": ("GPT2Model", "GPT2LMHeadModel"),
    "bert": ("BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
             "BertForTokenClassification", "BertForQuestionAnswering"),
    "roberta": ("RobertaModel", "RobertaForMaskedLM", "RobertaForSequenceClassification",
                "RobertaForTokenClassification", "RobertaForQuestionAnswering"),
    "electra": ("ElectraModel", "ElectraForPreTraining", "ElectraForSequenceClassification",
                "ElectraForTokenClassification", "ElectraForQuestionAnswering"),
}

# Buffers that appear in (older) state_dicts but are not weights: the causal mask of GPT-2 attention
# and the index buffers of BERT embeddings. transformers rebuilds them; nlptrain does not read them.
BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".crossattention.bias",
                   ".crossattention.masked_bias", "position_ids", "embeddings.token_type_ids")

# The architecture written to config.json for a file that carries none (an nlptrain checkpoint
# without an 'architectures' attribute), by model_type; BERT is inferred from the head tensors.
DEFAULT_ARCHITECTURE = {"gpt2": "GPT2LMHeadModel"}

# Weight files of a Hugging Face model directory, in the order transformers prefers them.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json",
                "pytorch_model.bin", "pytorch_model.bin.index.json")


class ToolError(Exception):
    """An error reported as 'tool: error: message' with exit status 1 (no traceback)."""


class Log:
    """Notes and warnings on stderr, prefixed with the tool name; quiet drops the notes."""

    def __init__(self, tool: str, quiet: bool = False):
        self.tool = tool
        self.quiet = quiet

    def note(self, msg: str) -> None:
        if not self.quiet:
            print(f"{self.tool}: note: {msg}", file=sys.stderr)

    def warn(self, msg: str) -> None:
        print(f"{self.tool}: warning: {msg}", file=sys.stderr)

    def error(self, msg: str) -> None:
        print(f"{self.tool}: error: {msg}", file=sys.stderr)


def main_wrapper(tool: str, fn, argv=None) -> int:
    """Run fn(argv) and turn a ToolError (or an unexpected exception) into a message and exit 1."""
    log = Log(tool)
    try:
        fn(argv)
        return 0
    except ToolError as e:
        log.error(str(e))
        return 1
    except KeyboardInterrupt:
        log.error("interrupted (no output written)")
        return 130
    except MemoryError:
        log.error("out of memory (no output written)")
        return 1


def is_buffer_name(name: str) -> bool:
    return any(name.endswith(s) for s in BUFFER_SUFFIXES)


def is_weight_name_ok(name: str) -> bool:
    """A tensor name usable as an HDF5 root dataset name (HF names never contain '/')."""
    return bool(name) and "/" not in name and name not in (".",) and "\0" not in name


# ---- config.json <-> root attributes ------------------------------------------------------------------

def config_to_attrs(config: dict, log: Log) -> dict[str, Any]:
    """The scalar entries of config.json as HDF5 root attribute values (numpy scalars / str).

    Strings stay strings, ints become int64, floats float64, bools int64 0/1. None, lists and dicts
    are left to the hf_config_json attribute. Derived attributes are added for nlptrain:
    'architectures' as a plain string when the list has one entry (nlptrain writes it that way),
    'num_labels' = len(id2label) when config.json has id2label but no num_labels, 'id2label' as a
    JSON list of the names (the form of nlptrain's datasets and checkpoints) when config.json's
    id2label maps "0".."n-1" to strings, and 'pad_token_id' = -1 for a null pad_token_id (no
    padding_idx; nlptrain's model.pad_token_id = -1).
    """
    import numpy as np

    attrs: dict[str, Any] = {}
    for key, val in config.items():
        if key == CONFIG_JSON_ATTR or key.startswith(NLPTRAIN_ATTR_PREFIX):
            log.warn(f"config entry '{key}' clashes with a reserved attribute name; kept only in "
                     f"{CONFIG_JSON_ATTR}")
            continue
        if isinstance(val, bool):
            attrs[key] = np.int64(1 if val else 0)
        elif isinstance(val, int):
            if -2**63 <= val < 2**63:
                attrs[key] = np.int64(val)
            else:
                log.note(f"config entry '{key}' = {val} does not fit in int64; kept only in {CONFIG_JSON_ATTR}")
        elif isinstance(val, float):
            attrs[key] = np.float64(val)
        elif isinstance(val, str):
            attrs[key] = val
        # None, list, dict: only in hf_config_json
    archs = config.get("architectures")
    if isinstance(archs, list) and len(archs) == 1 and isinstance(archs[0], str):
        attrs["architectures"] = archs[0]
    id2label = config.get("id2label")
    if "num_labels" not in config and isinstance(id2label, dict) and id2label:
        attrs["num_labels"] = np.int64(len(id2label))
    names = id2label_list(id2label)
    if names is not None:
        attrs["id2label"] = json.dumps(names, ensure_ascii=False)
    if "pad_token_id" in config and config["pad_token_id"] is None:
        attrs["pad_token_id"] = np.int64(NULL_PAD_TOKEN_ID)
    return attrs


def id2label_list(id2label) -> list[str] | None:
    """config.json's id2label ({"0": "NEG", "1": "POS"}) as a list of names, or None when it is not
    a dict of string names keyed 0..n-1."""
    if not isinstance(id2label, dict) or not id2label:
        return None
    try:
        keys = sorted(int(k) for k in id2label)
    except (TypeError, ValueError):
        return None
    if keys != list(range(len(id2label))) or not all(isinstance(v, str) for v in id2label.values()):
        return None
    by_index = {int(k): v for k, v in id2label.items()}
    return [by_index[i] for i in range(len(by_index))]


def label_maps(names: list[str]) -> tuple[dict, dict]:
    """(id2label, label2id) of config.json for a list of label names."""
    return {str(i): n for i, n in enumerate(names)}, {n: i for i, n in enumerate(names)}


def attr_to_python(val: Any) -> Any:
    """An h5py attribute value as a JSON-able Python value."""
    import numpy as np

    if isinstance(val, bytes):
        return val.decode("utf-8")
    if isinstance(val, np.ndarray):
        if val.dtype.kind in ("S", "O"):
            return [attr_to_python(v) for v in val.tolist()]
        return val.tolist()
    if isinstance(val, np.bool_):
        return bool(val)
    if isinstance(val, np.integer):
        return int(val)
    if isinstance(val, np.floating):
        return float(val)
    return val


def attr_matches_config(key: str, attr: Any, config: dict) -> bool:
    """Whether a root attribute says the same as config.json (with the conversions of
    config_to_attrs undone: bools as 0/1, the derived 'architectures' and 'num_labels')."""
    if key == "architectures" and isinstance(attr, str):
        return config.get("architectures") == [attr]
    if key == "num_labels" and "num_labels" not in config and isinstance(config.get("id2label"), dict):
        return attr == len(config["id2label"])
    if key == "pad_token_id" and attr == NULL_PAD_TOKEN_ID:
        return key in config and config[key] is None
    if key == "id2label" and isinstance(attr, str):
        try:
            return json.loads(attr) == id2label_list(config.get("id2label"))
        except json.JSONDecodeError:
            return False
    if key not in config:
        return False
    ref = config[key]
    if isinstance(ref, bool):
        return attr in (0, 1) and bool(attr) == ref
    if isinstance(ref, (int, float)) and isinstance(attr, (int, float)) and not isinstance(attr, bool):
        if attr == ref or (isinstance(ref, float) and math.isnan(ref) and math.isnan(attr)):
            return True
        # nlptrain keeps float config in float32: 1e-5 comes back as 9.99999974737875e-06
        return isinstance(attr, float) and float32_shortest(attr) != attr and \
            float32_shortest(attr) == float32_shortest(float(ref))
    return attr == ref


def float32_shortest(v: float) -> float:
    """A float32-valued double (nlptrain stores its float config as float32, e.g. 1e-5 becomes
    9.99999974737875e-06) as the shortest decimal that rounds to the same float32 (1e-05); values
    that are not exactly float32 are returned unchanged."""
    import numpy as np

    if not math.isfinite(v):
        return v
    f32 = np.float32(v)
    if float(f32) != v:
        return v
    return float(str(f32))


# ---- atomic outputs -------------------------------------------------------------------------------------

def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(str(path), os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_parent(path: Path, what: str) -> Path:
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ToolError(f"cannot write {what} '{path}': directory '{parent}' does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ToolError(f"cannot write {what} '{path}': directory '{parent}' is not writable")
    return parent


@contextlib.contextmanager
def atomic_file(path: Path, what: str = "output") -> Iterator[Path]:
    """Yield a temporary path next to `path`; on success it is synced and renamed onto `path`,
    on any failure (or interrupt) it is removed, so `path` is never half-written."""
    path = Path(path)
    parent = check_parent(path, what)
    if path.is_dir():
        raise ToolError(f"cannot write {what} '{path}': it is a directory")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        _fsync_file(tmp_path)
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp made it 0600
        os.replace(tmp_path, path)
        _fsync_dir(parent)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp_path.unlink()
        raise


@contextlib.contextmanager
def atomic_dir(path: Path, what: str = "output directory") -> Iterator[Path]:
    """Yield a new temporary directory next to `path`; on success its files are synced and the
    directory is renamed onto `path` (which must not exist, or be an empty directory); on failure
    it is removed."""
    path = Path(path)
    parent = check_parent(path, what)
    if path.exists() and not (path.is_dir() and not any(path.iterdir())):
        raise ToolError(f"{what} '{path}' already exists and is not an empty directory")
    tmp_path = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent))
    try:
        yield tmp_path
        for p in tmp_path.iterdir():
            _fsync_file(p)
            os.chmod(p, 0o666 & ~_umask())
        os.chmod(tmp_path, 0o777 & ~_umask())
        if path.is_dir():
            path.rmdir()  # empty (checked above); rename(2) would replace it too, this is clearer
        os.rename(tmp_path, path)
        _fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp_path, ignore_errors=True)
        raise


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def json_text(obj: Any) -> str:
    """config.json text as transformers writes it (2-space indent, insertion order, newline)."""
    return json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=True) + "\n"
