"""Matrix-Game-2.0 checkpoint keys → :class:`~jbkv_cli.models.wan.matrix_game.dit.MatrixGameDiT`.

Upstream's ``inference.py`` loads ``base_distilled_model/base_distill.safetensors`` (universal;
GTA ``gta_distilled_model/gta_keyboard2dim.safetensors``, TempleRun
``templerun_distilled_model/templerun_7dim_onlykey.safetensors`` of HF
``Skywork/Matrix-Game-2.0``) with ``pipeline.generator.load_state_dict`` — the
``WanDiffusionWrapper``, whose ``model`` is the ``CausalWanModel``: keys ``model.<name>``.
jbkv's module names are upstream's, so the rename strips that prefix (and FSDP's
``_fsdp_wrapped_module.``, which training checkpoints carry). upstream's ``freqs`` tables are
plain attributes, not buffers: no key.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from jbkv_cli.utils.errors import JbkvError

PREFIXES = ("model.", "_fsdp_wrapped_module.")


def rename_key(key: str) -> str:
    """An upstream key as jbkv's DiT names it."""
    for prefix in PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix) :]
    return key.replace("._fsdp_wrapped_module", "")


def rename_keys(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with every key renamed (:func:`rename_key`); two keys landing on one name
    is a :class:`JbkvError`."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        new = rename_key(key)
        if new in out:
            raise JbkvError(f"checkpoint keys {key!r} and another both map to {new!r}")
        out[new] = value
    return out


def load_strict(dit: torch.nn.Module, state: Mapping[str, torch.Tensor], what: str) -> None:
    """Load renamed ``state`` into ``dit``; missing or unexpected keys are one
    :class:`JbkvError` naming the first of each."""
    renamed = rename_keys(state)
    want = set(dit.state_dict())
    missing, extra = sorted(want - set(renamed)), sorted(set(renamed) - want)
    if missing or extra:
        raise JbkvError(
            f"{what}: {len(missing)} missing key(s) (first {missing[:1]}), "
            f"{len(extra)} unexpected (first {extra[:1]})"
        )
    dit.load_state_dict(renamed, strict=True, assign=True)
