"""Why ``--model`` could not be loaded, as one line naming the file at fault.

transformers reports a damaged model folder in its own words, often without the file: a raw
``UnpicklingError`` for a pickle its weights-only loader refuses, ``SafetensorError`` for a cut
safetensors file, ``ZeroDivisionError`` for ``num_attention_heads: 0``, or an 11-line load
report and "You set `ignore_mismatched_sizes` to `False`" for weights of another shape than
the config's. :func:`check_config` refuses sizes that cannot build a model before transformers
reads the folder; :func:`load_failure` turns what still fails into one line.
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

from jbkv_cli.utils.errors import JbkvError, shown
from jbkv_cli.utils.jsonio import read_json
from jbkv_cli.utils.library_output import Said, report_rows

# what a causal LM's config counts: each, where present, a whole number of at least 1
SIZES = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
)
_SHAPES = re.compile(
    r"ckpt:\s*torch\.Size\((\[[^\]]*\])\)\s*vs model:\s*torch\.Size\((\[[^\]]*\])\)"
)


def check_config(folder: Path, name: str) -> None:
    """Refuse a ``config.json`` (or its ``text_config``) whose sizes are numbers but not whole
    numbers of at least 1 (``num_attention_heads: 0`` divided by zero inside transformers),
    naming the file and the field."""
    path = folder / "config.json"
    config = read_json(path, "model config")
    if not isinstance(config, dict):
        raise JbkvError(f"--model {shown(name)}: {path} is not a JSON object")
    for where, part in (("", config), ("text_config.", config.get("text_config"))):
        if not isinstance(part, dict):
            continue
        for key in SIZES:
            value = part.get(key)  # a list (sizes per layer) or a string: transformers' to judge
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if isinstance(value, bool) or (number and (value < 1 or value != int(value))):
                raise JbkvError(
                    f"--model {shown(name)}: {path}: {where}{key} is {json.dumps(value)[:40]}; "
                    "it must be a whole number of at least 1"
                )


def _weights(folder: Path, suffixes: tuple[str, ...]) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix in suffixes and p.is_file())


def _named(files: list[Path], folder: Path, kind: str) -> str:
    if len(files) == 1:
        return str(files[0])
    return f"{folder} (one of its {len(files)} {kind} files)" if files else str(folder)


def _damaged_safetensors(folder: Path) -> str:
    """The first safetensors file of ``folder`` whose header cannot be read, as a reason."""
    from jbkv_cli.models.safetensors_io import open_safetensors

    files = _weights(folder, (".safetensors",))
    for path in files:
        try:
            with open_safetensors(path):
                pass
        except JbkvError as exc:
            return str(exc)
    return f"cannot read the weights in {_named(files, folder, 'safetensors')}"


def _mismatch(folder: Path, said: list[Said]) -> str:
    """The first tensor whose shape in the files is not the config's, from transformers'
    load report."""
    files = _named(_weights(folder, (".safetensors", ".bin")), folder, "weight")
    for record in said:
        for key, status, details in report_rows(record.text):
            if status == "MISMATCH":
                shapes = _SHAPES.search(details)
                how = f"{shapes[1]} in the file, {shapes[2]} by the config" if shapes else details
                return (
                    f"{files} does not fit {folder / 'config.json'}: {key} is {how} "
                    "(head_dim, hidden_size or the head counts disagree with the weights)"
                )
    return f"{files} does not fit {folder / 'config.json'}: tensors of another shape"


def load_failure(name: str, where: str, exc: BaseException, said: list[Said]) -> JbkvError:
    """One line for ``exc``, raised while transformers loaded ``--model name`` from ``where``
    (a folder or a hub id); ``said``: what transformers logged meanwhile."""
    from safetensors import SafetensorError

    folder = Path(where)
    prefix = f"cannot load --model {shown(name)}"
    first = " ".join(str(exc).split())[:200]
    if not folder.is_dir():
        return JbkvError(f"{prefix}: {first or type(exc).__name__}")
    if isinstance(exc, pickle.UnpicklingError):
        from jbkv_cli.models.wan.self_forcing.checkpoint import pickle_refusal

        pickles = _weights(folder, (".bin", ".pt", ".pth", ".ckpt"))
        return JbkvError(f"{prefix}: {pickle_refusal(_named(pickles, folder, 'pickle'), exc)}")
    if isinstance(exc, SafetensorError):
        return JbkvError(f"{prefix}: {_damaged_safetensors(folder)}")
    if isinstance(exc, RuntimeError) and "ignore_mismatched_sizes" in str(exc):
        return JbkvError(f"{prefix}: {_mismatch(folder, said)}")
    if isinstance(exc, ArithmeticError):
        return JbkvError(
            f"{prefix}: {folder / 'config.json'} describes no model transformers can build "
            f"({type(exc).__name__}: {first})"
        )
    return JbkvError(f"{prefix}: {first or type(exc).__name__}")


LOAD_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    ValueError,
    KeyError,
    ImportError,
    RuntimeError,
    ArithmeticError,
    pickle.UnpicklingError,
)


def load_errors() -> tuple[type[BaseException], ...]:
    """What :func:`load_failure` maps: :data:`LOAD_ERRORS` and safetensors' error."""
    from safetensors import SafetensorError

    return (*LOAD_ERRORS, SafetensorError)


__all__ = ["SIZES", "check_config", "load_errors", "load_failure"]
