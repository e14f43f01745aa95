"""Models by name. Adding one is one module plus one line here (imported lazily).

A model module provides ``load_model(**options) -> VideoModel``, ``check_options(**options)``
(what ``load_model`` would refuse, without building anything) and, when it reads only some
prompts (the tiny model's closed grammar), ``check_prompt(prompt)``, which raises
:class:`~jbkv_cli.utils.errors.UsageError` for a prompt it cannot read; commands call it for every
prompt before anything is created. A model that reads more than a prompt (an image, a camera
trajectory: :class:`~jbkv_cli.models.cases.Case`) provides ``check_cases(cases, **options)``, which
refuses a case it cannot generate with those options; every other model takes prompt-only
cases (:func:`check_cases`). A model that reads files (weights, configs, a pose file option)
provides ``input_paths(**options)``: role -> each file or folder ``load_model`` would read,
located as it locates them (``--weights``, an environment variable, the Hugging Face cache)
without reading them. The one list of what a model reads: commands refuse an output path onto
any of them (:mod:`jbkv_cli.cli.outputs`), and a run fingerprints them by role
(:mod:`jbkv_cli.run.fingerprints`) to refuse a resume from changed files.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from jbkv_cli.models.base import VideoModel, text_case
from jbkv_cli.models.cases import Case
from jbkv_cli.utils.errors import UsageError
from jbkv_cli.utils.library_output import quiet_warnings

# name -> "module:factory"; factory(**options) -> VideoModel
MODELS: dict[str, str] = {
    "tiny": "jbkv_cli.models.tiny:load_model",
    "magi1": "jbkv_cli.models.magi1:load_model",
    "skyreels-v2": "jbkv_cli.models.wan.skyreels_v2:load_model",
    "self-forcing": "jbkv_cli.models.wan.self_forcing:load_model",
    "rolling-forcing": "jbkv_cli.models.wan.rolling_forcing:load_model",
    "hy-worldplay": "jbkv_cli.models.hy_worldplay:load_model",
    "matrix-game-2": "jbkv_cli.models.wan.matrix_game:load_model",
}

DEFAULT_MODEL = "tiny"


def _module(name: str) -> tuple[Any, str]:
    if name not in MODELS:
        raise UsageError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    module_name, factory = MODELS[name].split(":")
    return importlib.import_module(module_name), factory


def load_model(name: str, **options: Any) -> VideoModel:
    """Build the model registered as ``name``; options are model-specific (weights, steps, ...)."""
    module, factory = _module(name)
    with quiet_warnings():  # torch's, Pillow's and numpy's own warnings while it loads
        return getattr(module, factory)(**options)


def check_options(name: str, **options: Any) -> None:
    """Raise what ``load_model(name, **options)`` would raise for its options and weight files,
    without building the model (the module's ``check_options``; commands check every model of a
    run before any runs)."""
    module, _ = _module(name)
    check = getattr(module, "check_options", None)
    if check is not None:
        check(**options)


def check_prompts(name: str, prompts: Iterable[str]) -> None:
    """Raise :class:`UsageError` for the first prompt model ``name`` cannot read."""
    check = getattr(_module(name)[0], "check_prompt", None)
    if check is not None:
        for prompt in prompts:
            check(prompt)


def check_cases(name: str, cases: Iterable[Case], **options: Any) -> None:
    """Raise :class:`UsageError` for the first case model ``name`` cannot generate with
    ``options`` (its module's ``check_cases``; else a case must be a prompt, and the prompts
    must pass :func:`check_prompts`). Called before anything is created."""
    cases = list(cases)
    check = getattr(_module(name)[0], "check_cases", None)
    if check is not None:
        check(cases, **options)
        return
    check_prompts(name, [text_case(c, name).prompt for c in cases])


def input_paths(name: str, **options: Any) -> dict[str, Path]:
    """Role -> the file or folder model ``name`` reads with ``options`` (its module's
    ``input_paths``; none for a model that reads no file, such as a tiny-random config)."""
    paths = getattr(_module(name)[0], "input_paths", None)
    return {} if paths is None else {role: Path(p) for role, p in paths(**options).items()}
