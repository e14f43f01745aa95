"""Models by name. Adding one is one module plus one line here (imported on first use).

The module exports ``ENTRY``, a :class:`~jbkv_cli.models.contract.ModelEntry`: its factory and
the checks commands run before anything is created (what each does, and the defaults of the
optional ones, are stated there). The functions below call them by model name. Importing this
module imports no model and no torch: the command line takes ``MODELS`` and ``DEFAULT_MODEL``
from here for its choices and help.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jbkv_cli.utils.errors import UsageError
from jbkv_cli.utils.library_output import quiet_warnings

if TYPE_CHECKING:  # torch: imported where a model is used
    from jbkv_cli.models.cases import Case
    from jbkv_cli.models.contract import ModelEntry, VideoModel

# name -> the module whose ENTRY (a ModelEntry) is the model
MODELS: dict[str, str] = {
    "tiny": "jbkv_cli.models.tiny",
    "magi1": "jbkv_cli.models.magi1",
    "skyreels-v2": "jbkv_cli.models.wan.skyreels_v2",
    "self-forcing": "jbkv_cli.models.wan.self_forcing",
    "rolling-forcing": "jbkv_cli.models.wan.rolling_forcing",
    "hy-worldplay": "jbkv_cli.models.hy_worldplay",
    "matrix-game-2": "jbkv_cli.models.wan.matrix_game",
}

DEFAULT_MODEL = "tiny"


def entry(name: str) -> ModelEntry:
    """The :class:`ModelEntry` of the model registered as ``name`` (its module imported now);
    an unknown name is a :class:`UsageError`, a module without a ``ModelEntry`` as ``ENTRY`` a
    :class:`TypeError` (a registration bug)."""
    from jbkv_cli.models.contract import ModelEntry

    if name not in MODELS:
        raise UsageError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    module = importlib.import_module(MODELS[name])
    found = module.__dict__.get("ENTRY")
    if not isinstance(found, ModelEntry):
        raise TypeError(f"{MODELS[name]}.ENTRY must be a ModelEntry, got {type(found).__name__}")
    return found


def load_model(name: str, **options: Any) -> VideoModel:
    """Build the model registered as ``name``; options are model-specific (weights, steps, ...)."""
    load = entry(name).load_model
    with quiet_warnings():  # torch's, Pillow's and numpy's own warnings while it loads
        return load(**options)


def check_options(name: str, **options: Any) -> None:
    """Raise what ``load_model(name, **options)`` would raise for its options and weight files,
    without building the model (its entry's ``check_options``)."""
    entry(name).check_options(**options)


def check_prompts(name: str, prompts: Iterable[str]) -> None:
    """Raise :class:`UsageError` for the first prompt model ``name`` cannot read."""
    check = entry(name).check_prompt
    for prompt in prompts:
        check(prompt)


def check_cases(name: str, cases: Iterable[Case], **options: Any) -> None:
    """Raise :class:`UsageError` for the first case model ``name`` cannot generate with
    ``options`` (its entry's ``check_cases``; without one a case must be a prompt, and the
    prompts must pass :func:`check_prompts`). Called before anything is created."""
    from jbkv_cli.models.base import text_case

    cases = list(cases)
    check = entry(name).check_cases
    if check is not None:
        check(cases, **options)
        return
    check_prompts(name, [text_case(c, name).prompt for c in cases])


def horizon_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with model ``name``'s ``horizon_options`` under them (``--horizon``: the
    user's options win)."""
    return {**entry(name).horizon_options, **options}


def input_paths(name: str, **options: Any) -> dict[str, Path]:
    """Role -> the file or folder model ``name`` reads with ``options`` (its entry's
    ``input_paths``)."""
    return {role: Path(p) for role, p in entry(name).input_paths(**options).items()}
