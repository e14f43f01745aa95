"""Models by name. Adding one is one module plus one line here (imported lazily)."""

from __future__ import annotations

import importlib
from typing import Any

from jbkv_cli.errors import JbkvError
from jbkv_cli.models.base import VideoModel

# name -> "module:factory"; factory(**options) -> VideoModel
MODELS: dict[str, str] = {
    "tiny": "jbkv_cli.models.tiny:load_model",
    "magi1": "jbkv_cli.models.magi1:load_model",
    "skyreels-v2": "jbkv_cli.models.skyreels_v2:load_model",
    "self-forcing": "jbkv_cli.models.self_forcing:load_model",
}

DEFAULT_MODEL = "tiny"


def load_model(name: str, **options: Any) -> VideoModel:
    """Build the model registered as ``name``; options are model-specific (weights, steps, ...)."""
    if name not in MODELS:
        raise JbkvError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    module_name, factory = MODELS[name].split(":")
    module = importlib.import_module(module_name)
    return getattr(module, factory)(**options)
