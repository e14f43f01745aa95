"""Hugging Face ``from_pretrained`` without ever running code from the folder it reads.

transformers runs the Python files a model folder (or hub repository) ships when its
``config.json`` or ``tokenizer_config.json`` names them in ``auto_map`` for a type it does not
know: with ``trust_remote_code`` left unset it asks "Do you wish to run the custom code? [y/N]" on
stdin (a pipe saying ``y`` answers it) and copies the files into ``$HF_MODULES_CACHE`` first.
jbkv never does either. Every ``from_pretrained`` in jbkv goes through :func:`from_pretrained`
(``tests/utils/test_pretrained.py`` holds the package to that), which passes
``trust_remote_code=False``: transformers then asks nothing, copies nothing and refuses, and the
refusal becomes one line naming the folder (:class:`CustomCodeError`, exit 1). A folder whose
``auto_map`` sits beside a type transformers knows loads with transformers' own class, as it
would anyway. diffusers' concrete classes (``AutoencoderKLWan``, a scheduler) read no ``auto_map``
and ignore the argument, so one helper serves both libraries.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

from jbkv_cli.utils.errors import JbkvError

T = TypeVar("T")
_ASKS_FOR_CODE = "trust_remote_code"  # transformers' refusal names the argument that would allow it


class CustomCodeError(JbkvError):
    """A model folder that loads only by running its own Python code (exit 1)."""


def from_pretrained(cls: type[T], where: str | os.PathLike[str], **kwargs: Any) -> T:
    """``cls.from_pretrained(where, trust_remote_code=False, **kwargs)``; a folder that needs
    its own code is a :class:`CustomCodeError` naming ``where``."""
    try:
        load = cls.from_pretrained  # type: ignore[attr-defined]
        return load(where, trust_remote_code=False, **kwargs)
    except ValueError as exc:
        if _ASKS_FOR_CODE not in str(exc):
            raise
        raise CustomCodeError(
            f"{os.fspath(where)} loads only by running its own Python code (auto_map in its "
            "config); jbkv never runs code from a model folder"
        ) from None
