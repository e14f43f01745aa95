"""Which causal LM ``--model`` names, loaded with jbkv attention and checked before any work.

- ``tiny`` (default): the embedded LM, a 2-layer Llama-architecture model trained by
  :mod:`jbkv_cli.llm.tiny.train` on the synthetic key–value language of
  :mod:`jbkv_cli.llm.tiny.corpus` and shipped in ``jbkv_cli/llm/tiny/weights/`` (a Hugging Face
  model folder: ``config.json``, ``model.safetensors``, ``tokenizer.json``). Not a natural-
  language model: it shows the mechanism, not English NLL.
- a local folder holding a Hugging Face causal LM and its tokenizer;
- a Hugging Face hub id (``owner/name``): transformers downloads it into its own cache on
  request (nothing else in jbkv downloads a model).

The model runs in ``dtype`` (``auto``: float32 on a CPU, bfloat16 on CUDA, the paper's BF16
reference) and is switched to ``attn_implementation="jbkv"`` (:func:`jbkv_cli.llm.hosting.host`).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from jbkv_cli.llm.load_errors import check_config, load_errors, load_failure
from jbkv_cli.utils import library_output
from jbkv_cli.utils.errors import JbkvError, UsageError, WeightsNotFoundError, shown
from jbkv_cli.utils.jsonio import read_json
from jbkv_cli.utils.pretrained import from_pretrained

EMBEDDED = "tiny"
EMBEDDED_DIR = Path(__file__).resolve().parent / "tiny" / "weights"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class LoadedLM:
    """A model ready for :mod:`jbkv_cli.llm.prefill`, and what the run records about it."""

    name: str
    model: Any
    tokenizer: Any
    fingerprint: str
    dtype: str
    embedded: bool

    @property
    def config(self) -> Any:
        return self.model.config.get_text_config()

    @property
    def head_dim(self) -> int:
        cfg = self.config
        return int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)

    @property
    def max_positions(self) -> int | None:
        value = getattr(self.config, "max_position_embeddings", None)
        return int(value) if value else None

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])


def resolve_dtype(name: str, device: str) -> str:
    """``auto`` -> float32 on a CPU, bfloat16 on CUDA; else one of :data:`DTYPES`."""
    if name == "auto":
        return "bfloat16" if device.startswith("cuda") else "float32"
    if name not in DTYPES:
        raise UsageError(f"--dtype must be auto, {', '.join(DTYPES)}; got {shown(name)}")
    return name


def model_path(name: str) -> tuple[str, bool]:
    """(what ``from_pretrained`` gets, whether it is the embedded LM); usage error if neither
    a folder nor a hub id."""
    if name == EMBEDDED:
        if not (EMBEDDED_DIR / "config.json").is_file():
            raise WeightsNotFoundError(
                f"the embedded LM is missing from {EMBEDDED_DIR}; train it with "
                f"`python -m jbkv_cli.llm.tiny.train --out {EMBEDDED_DIR}`"
            )
        return str(EMBEDDED_DIR), True
    path = Path(name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageError(f"--model {shown(name)} is a folder without a config.json")
        return str(path), False
    if path.exists():
        raise UsageError(f"--model {shown(name)} is a file; give a model folder or a hub id")
    if _HUB_ID.match(name):
        return name, False
    raise UsageError(
        f"--model {shown(name)} is neither 'tiny', a model folder nor a hub id (owner/name)"
    )


def model_files(name: str) -> list[Path]:
    """What ``--model`` reads: its folder (the embedded LM's for ``tiny``), or a hub id's
    folder in the Hugging Face cache when it is there (what an output may not overwrite; the
    files of a folder, by content: :func:`folder_files`)."""
    where, _ = model_path(name)
    if Path(where).is_dir():
        return [Path(where)]
    from huggingface_hub import constants

    cached = Path(constants.HF_HUB_CACHE) / ("models--" + where.replace("/", "--"))
    return [cached] if cached.is_dir() else []


MODEL_FILE_SUFFIXES = (".json", ".safetensors", ".bin", ".model", ".txt", ".tiktoken")


def folder_files(where: str) -> dict[str, Path]:
    """Name -> file of what loading the model folder ``where`` (:func:`model_files`) may read:
    its top-level files ending in :data:`MODEL_FILE_SUFFIXES` (config, weights, tokenizer),
    which the run fingerprints by content (:mod:`jbkv_cli.run.fingerprints`); none for a hub id,
    whose commit in the run's settings names its content."""
    path = Path(where)
    if not path.is_dir():
        return {}
    return {
        f.name: f
        for f in sorted(path.iterdir())
        if f.suffix in MODEL_FILE_SUFFIXES and not f.name.startswith(".") and f.is_file()
    }


GENERIC_TOKENIZERS = ("PreTrainedTokenizerFast", "TokenizersBackend")


def load_tokenizer(where: str) -> Any:
    """The folder's tokenizer. A folder that declares the generic fast tokenizer (its
    ``tokenizer.json`` is the whole tokenizer, as the embedded LM's) gets exactly that:
    ``AutoTokenizer`` in transformers 5 would pick the model type's own class instead and
    rebuild it from the file, which loses a tokenizer of another kind."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = Path(where)
    config = path / "tokenizer_config.json"
    if path.is_dir() and config.is_file() and (path / "tokenizer.json").is_file():
        try:
            declared = read_json(config, "tokenizer config").get("tokenizer_class")
        except (JbkvError, AttributeError):
            declared = None  # transformers says what is wrong with it
        if declared in GENERIC_TOKENIZERS:
            return from_pretrained(PreTrainedTokenizerFast, where)
    return from_pretrained(AutoTokenizer, where)


def _fingerprint(where: str, embedded: bool, model: Any) -> str:
    """What identifies the weights in the run's settings: a hash of the config and the weight
    files' names and sizes (a folder), or the hub commit. Kept as runs of earlier versions
    recorded it; the weights' content is checked by the run's ``inputs``
    (:func:`folder_files`)."""
    path = Path(where)
    if not path.is_dir():
        commit = getattr(model.config, "_commit_hash", None)
        return f"hub:{where}@{commit}" if commit else f"hub:{where}"
    digest = hashlib.sha256((path / "config.json").read_bytes())
    for f in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")):
        digest.update(f"{f.name}:{f.stat().st_size}".encode())
    if embedded:
        digest.update((path / "model.safetensors").read_bytes())
    return f"sha256:{digest.hexdigest()[:16]}"


def load_lm(name: str, dtype: str, device: str) -> LoadedLM:
    """Load ``--model`` with its tokenizer in ``dtype`` on ``device``, hosted by jbkv."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from jbkv_cli.llm.hosting import ATTENTION, host, register
    from jbkv_cli.llm.prefill import check_model

    where, embedded = model_path(name)
    register()
    hf_logging.disable_progress_bar()  # stderr is jbkv's: its own progress, warnings, errors
    if Path(where).is_dir():
        check_config(Path(where), name)
    # transformers' logs kept (a load report names the tensor at fault), torch's warnings dropped
    quiet = contextlib.ExitStack()
    said = quiet.enter_context(library_output.capture())
    quiet.enter_context(library_output.quiet_warnings())
    try:
        from_pretrained(AutoConfig, where)  # a model that needs its own code: refused first
        tokenizer = load_tokenizer(where)
        model = from_pretrained(
            AutoModelForCausalLM, where, dtype=DTYPES[dtype], attn_implementation=ATTENTION
        )
    except load_errors() as exc:
        raise load_failure(name, where, exc, said) from exc
    finally:
        quiet.close()
    for record in said:  # a load that went through: what it reported, one line each
        library_output.show(record)
    try:
        host(model)
        check_model(model)
    except ValueError as exc:
        raise JbkvError(f"--model {shown(name)}: {exc}") from exc
    model = model.to(device).eval().requires_grad_(False)
    return LoadedLM(name, model, tokenizer, _fingerprint(where, embedded, model), dtype, embedded)
