"""Self-Forcing / LongLive generator checkpoints: reading them safely, LoRA, diffusers names.

Upstream generator files (``self_forcing_dmd.pt``, LongLive's ``longlive_base.pt``) are torch
pickles of ``{"generator": sd, "generator_ema": sd, "critic": …}`` whose state dicts use the
parameter names of upstream's ``CausalWanModel`` under the wrapper's ``model.`` prefix (EMA
copies may carry FSDP's ``_fsdp_wrapped_module.`` inside names). jbkv never runs pickle code:
``.pt`` files are read with ``torch.load(weights_only=True)`` (memory-mapped where the file
allows), and a pickle that needs anything beyond tensors and containers is refused with one
line naming the class it wanted (``posix.system``); a pickle that the restricted unpickler
accepts but cannot build (``OrderedDict(5)``) is one line naming the file. Only regular files
are read. ``jbkv convert-checkpoint`` writes the chosen state dict once as safetensors, through
the atomic writer (never onto its own input, nor over a file it did not write).

LongLive's ``lora.pt`` is a PEFT LoRA state dict (``base_model.model.<module>.lora_A.weight``
``[r, in]`` and ``lora_B.weight`` ``[out, r]``, on every Linear of every attention block, rank
and alpha 256 in ``configs/longlive_inference.yaml``); it is merged into the base weights:
``W ← W + (α/r) B A``.

Upstream → diffusers names (the renames of diffusers' ``scripts/convert_wan_to_diffusers.py``;
upstream's block norms are called norm1 (self-attn, no affine), norm3 (cross-attn, affine) and
norm2 (FFN, no affine); diffusers orders them norm1, norm2, norm3):

    patch_embedding            → patch_embedding
    text_embedding.{0,2}       → condition_embedder.text_embedder.linear_{1,2}
    time_embedding.{0,2}       → condition_embedder.time_embedder.linear_{1,2}
    time_projection.1          → condition_embedder.time_proj
    head.head / head.modulation → proj_out / scale_shift_table
    blocks.i.self_attn.{q,k,v,o,norm_q,norm_k} → blocks.i.attn1.{to_q,to_k,to_v,to_out.0,norm_q,norm_k}
    blocks.i.cross_attn.…      → blocks.i.attn2.… (same renames)
    blocks.i.norm3             → blocks.i.norm2
    blocks.i.ffn.{0,2}         → blocks.i.ffn.net.{0.proj,2}
    blocks.i.modulation        → blocks.i.scale_shift_table
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from jbkv_cli.cli.outputs import check_output_file
from jbkv_cli.models.safetensors_io import not_regular, open_safetensors
from jbkv_cli.models.wan.weights import first_line
from jbkv_cli.utils.atomic import atomic_path, remove_stale_temps_of
from jbkv_cli.utils.errors import JbkvError, UsageError

STATE_KEYS = ("generator_ema", "generator", "model")
WRAPPERS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
LORA_PREFIX = "base_model.model."

_TOP = {
    "patch_embedding": "patch_embedding",
    "text_embedding.0": "condition_embedder.text_embedder.linear_1",
    "text_embedding.2": "condition_embedder.text_embedder.linear_2",
    "time_embedding.0": "condition_embedder.time_embedder.linear_1",
    "time_embedding.2": "condition_embedder.time_embedder.linear_2",
    "time_projection.1": "condition_embedder.time_proj",
    "head.head": "proj_out",
    "head.modulation": "scale_shift_table",
}
_ATTN = {
    "q": "to_q",
    "k": "to_k",
    "v": "to_v",
    "o": "to_out.0",
    "norm_q": "norm_q",
    "norm_k": "norm_k",
}
_BLOCK = {
    **{f"self_attn.{a}": f"attn1.{b}" for a, b in _ATTN.items()},
    **{f"cross_attn.{a}": f"attn2.{b}" for a, b in _ATTN.items()},
    "norm3": "norm2",
    "ffn.0": "ffn.net.0.proj",
    "ffn.2": "ffn.net.2",
    "modulation": "scale_shift_table",
}
_BLOCK_KEY = re.compile(r"blocks\.(\d+)\.(.+)")


# --------------------------------------------------------------------------- names


def diffusers_name(name: str) -> str | None:
    """The diffusers ``WanTransformer3DModel`` name of upstream parameter ``name`` (no wrapper
    prefix), or None when upstream's causal Wan T2V model has no such parameter."""
    table, prefix, rest = _TOP, "", name
    match = _BLOCK_KEY.fullmatch(name)
    if match:
        table, prefix, rest = _BLOCK, f"blocks.{match.group(1)}.", match.group(2)
    for module, target in table.items():
        if rest == module:  # a parameter that is a module attribute (modulation tables)
            return prefix + target
        if rest.startswith(module + ".") and rest.count(".") == module.count(".") + 1:
            return prefix + target + rest[len(module) :]
    return None


def strip_wrappers(name: str) -> str:
    """``model._fsdp_wrapped_module.blocks.0…`` → ``blocks.0…``: drop FSDP/compile wrapper names
    anywhere, then PEFT's leading ``base_model.model.`` or the generator wrapper's ``model.``."""
    for wrapper in WRAPPERS:
        name = name.replace(wrapper, "")
    return name.removeprefix(LORA_PREFIX).removeprefix("model.")


def to_diffusers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename an upstream generator state dict to diffusers names; one error lists the keys
    that have no diffusers counterpart."""
    out, unknown = {}, []
    for name, tensor in state.items():
        target = diffusers_name(strip_wrappers(name))
        if target is None:
            unknown.append(name)
        else:
            out[target] = tensor
    if unknown:
        shown = ", ".join(sorted(unknown)[:5])
        raise JbkvError(
            f"generator checkpoint has {len(unknown)} key(s) that are not part of a causal "
            f"Wan2.1 T2V model: {shown}"
        )
    return out


# --------------------------------------------------------------------------- reading


def read_tensors(path: Path) -> object:
    """What a checkpoint file holds: safetensors as a dict; a ``.pt`` pickle with
    ``torch.load(weights_only=True)`` only (never arbitrary pickle code)."""
    if path.suffix == ".safetensors":
        with open_safetensors(path) as handle:
            return {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    problem = not_regular(path)
    if problem is not None:
        raise JbkvError(f"checkpoint {problem}")
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:  # legacy (non-zip) files cannot be memory-mapped
            if "mmap" not in str(exc):
                raise
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise JbkvError(pickle_refusal(path, exc)) from exc
    except OSError as exc:
        raise JbkvError(f"cannot read checkpoint {path}: {exc.strerror or exc}") from exc
    except MemoryError:
        raise
    except Exception as exc:  # an allowed global fed bad arguments: any type
        raise JbkvError(
            f"cannot read checkpoint {path}: {type(exc).__name__}: {first_line(exc)}"
        ) from exc


_GLOBAL = re.compile(r"GLOBAL\s+([A-Za-z_][\w.]*)")


def _blocked_global(exc: BaseException) -> str | None:
    """The ``module.name`` a weights-only load refused (``posix.system``), if that is why."""
    match = _GLOBAL.search(str(exc))
    return match.group(1) if match else None


def pickle_refusal(path: Path | str, exc: BaseException) -> str:
    """One line for a pickle ``torch.load(weights_only=True)`` refused: the global it asks
    for (``posix.system``), else what the unpickler could not build."""
    wanted = _blocked_global(exc)
    if wanted is not None:
        return (
            f"{path} needs pickle code to load (it asks for {wanted}); jbkv reads "
            "checkpoints with torch.load(weights_only=True) and never runs it"
        )
    return f"cannot read checkpoint {path}: {_unpickler_reason(exc)}"


def _unpickler_reason(exc: BaseException) -> str:
    """The useful sentence of torch's weights-only error (what the unpickler refused): its
    first line that is not the generic advice around it."""
    text = str(exc).split("WeightsUnpickler error:", 1)[-1]
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("Weights only load failed", "Check the documentation")):
            return " ".join(line.split())[:200]
    return first_line(exc)


def _tensor_dict(obj: object) -> bool:
    return (
        isinstance(obj, dict)
        and bool(obj)
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())
    )


def select_state(obj: object, ema: bool, path: Path | str) -> dict[str, torch.Tensor]:
    """The generator state dict inside a loaded checkpoint: ``generator_ema`` when ``ema`` and
    present, else ``generator``, else ``model``; a flat dict of tensors is taken as it is."""
    if _tensor_dict(obj):
        return dict(obj)  # type: ignore[arg-type]
    if isinstance(obj, dict):
        order = STATE_KEYS if ema else STATE_KEYS[1:] + STATE_KEYS[:1]
        for key in order:
            if _tensor_dict(obj.get(key)):
                return dict(obj[key])
        keys = ", ".join(map(str, list(obj)[:8])) or "none"
        raise JbkvError(
            f"{path} holds no generator state dict (looked for {', '.join(order)}; found keys: "
            f"{keys})"
        )
    raise JbkvError(f"{path} holds a {type(obj).__name__}, not a state dict of tensors")


def read_generator(path: Path, ema: bool) -> dict[str, torch.Tensor]:
    """The generator's state dict (upstream names, wrappers stripped) from ``path``."""
    state = select_state(read_tensors(path), ema, path)
    return {strip_wrappers(k): v for k, v in state.items()}


def read_lora(path: Path) -> dict[str, torch.Tensor]:
    """A PEFT LoRA state dict from ``path`` (a ``{"generator_lora": sd}`` wrapper is opened)."""
    obj = read_tensors(path)
    if isinstance(obj, dict) and _tensor_dict(obj.get("generator_lora")):
        obj = obj["generator_lora"]
    if not _tensor_dict(obj):
        raise JbkvError(f"{path} is not a LoRA state dict of tensors")
    return dict(obj)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- LoRA


def merge_lora(
    state: dict[str, torch.Tensor], lora: dict[str, torch.Tensor], alpha: float
) -> dict[str, torch.Tensor]:
    """``W ← W + (α/r) B A`` for every ``<module>.lora_A.weight`` / ``lora_B.weight`` pair
    (float32 arithmetic, result in W's dtype); returns a new dict, ``state`` is untouched."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in lora.items():
        match = re.fullmatch(r"(.+)\.lora_([AB])(?:\.default)?\.weight", name)
        if match is None:
            raise JbkvError(f"unexpected LoRA key {name} (want <module>.lora_A/B.weight)")
        module = strip_wrappers(match.group(1))
        pairs.setdefault(module, {})[match.group(2)] = tensor
    merged = dict(state)
    problems = []
    for module, ab in sorted(pairs.items()):
        weight = f"{module}.weight"
        if set(ab) != {"A", "B"} or weight not in state:
            problems.append(weight if weight not in state else f"{module} (unpaired A/B)")
            continue
        a, b = ab["A"].float(), ab["B"].float()
        w = state[weight]
        if a.shape[0] != b.shape[1] or (b.shape[0], a.shape[1]) != tuple(w.shape):
            problems.append(f"{module} B{tuple(b.shape)}·A{tuple(a.shape)} vs W{tuple(w.shape)}")
            continue
        merged[weight] = (w.float() + (alpha / a.shape[0]) * (b @ a)).to(w.dtype)
    if problems:
        raise JbkvError(f"LoRA does not fit the generator: {', '.join(problems[:5])}")
    return merged


# --------------------------------------------------------------------------- converting


def check_conversion(src: Path, dst: Path) -> None:
    """Refuse, before anything is read or written, a conversion that could destroy a file:
    ``dst`` that is ``src`` itself (the same path, a symlink to it, a hard link of it), ``dst``
    that is not a file, or an existing ``dst`` that ``convert-checkpoint`` did not write."""
    problem = not_regular(src)
    if problem is not None:
        raise UsageError(f"checkpoint {problem}")
    if not src.is_file():
        raise UsageError(f"no checkpoint file {src}")
    if dst.suffix != ".safetensors":
        raise UsageError(f"{dst}: the converted file must end in .safetensors")
    if dst.resolve() == src.resolve() or (dst.exists() and os.path.samefile(src, dst)):
        raise UsageError(
            f"{dst} is the checkpoint being converted ({src}); give another DST"
            + (" (SRC is already .safetensors)" if src.suffix == ".safetensors" else "")
        )
    problem = not_regular(dst)
    if problem is not None:
        raise UsageError(f"cannot write the converted checkpoint: {problem}")
    if dst.exists() and not _written_by_convert(dst):
        raise UsageError(
            f"{dst} exists and was not written by convert-checkpoint; jbkv does not overwrite "
            "it: remove it or give another DST"
        )
    check_output_file(dst, "converted checkpoint")  # writable, and not a file of a run folder


def _written_by_convert(path: Path) -> bool:
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            return (handle.metadata() or {}).get("jbkv") == "convert-checkpoint"
    except (SafetensorError, OSError, ValueError):
        return False


def convert_checkpoint(src: Path, dst: Path, ema: bool = True, lora: bool = False) -> int:
    """Write the generator (or, with ``lora``, the LoRA) state dict of ``src`` to the safetensors
    file ``dst`` with upstream names, wrapper prefixes stripped; returns the number of tensors.

    Checked first (:func:`check_conversion`); written through :func:`atomic_path`, so ``dst`` is
    complete or untouched, an interrupted write leaves no temp file (one a killed process left
    is removed by the next conversion to ``dst``), and the file follows the umask. A failed
    write (a full disk) is one line naming ``dst``.
    """
    check_conversion(src, dst)
    state = read_lora(src) if lora else read_generator(src, ema)
    tensors = {k: v.detach().contiguous().clone() for k, v in state.items()}
    remove_stale_temps_of(dst)
    metadata = {"source": src.name, "jbkv": "convert-checkpoint"}
    try:
        with atomic_path(dst) as tmp:
            save_file(tensors, str(tmp), metadata=metadata)
    except (SafetensorError, OSError) as exc:
        raise JbkvError(f"cannot write {dst}: {_write_reason(exc)}") from exc
    return len(tensors)


def _write_reason(exc: BaseException) -> str:
    """``No space left on device`` from safetensors' ``Error while serializing: I/O error: No
    space left on device (os error 28)`` (or an OSError's own text)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = first_line(exc).removeprefix("Error while serializing: ").removeprefix("I/O error: ")
    return re.sub(r"\s*\(os error \d+\)$", "", text)[:200]
