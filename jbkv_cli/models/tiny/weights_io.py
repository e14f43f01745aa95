"""Save and load the tiny model: a safetensors file (config in its metadata) + a JSON log."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from jbkv_cli.models.safetensors_io import check_state_dict, not_regular, open_safetensors
from jbkv_cli.models.tiny.model import TinyConfig, TinyDiT
from jbkv_cli.utils.errors import JbkvError, WeightsNotFoundError

DEFAULT_WEIGHTS = Path(__file__).parent / "weights" / "tiny.safetensors"
LONG_WEIGHTS = DEFAULT_WEIGHTS.with_name("tiny-long.safetensors")  # RECIPE's stage 3


def save_weights(model: TinyDiT, path: Path, log: dict) -> None:
    """Write ``path`` (fp32 tensors, ``{"config": ...}`` metadata) and ``path.json`` (the log)."""
    path = Path(path)
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(path), metadata={"config": json.dumps(model.cfg.to_dict())})
    summary = {k: v for k, v in log.items() if k != "history"}
    summary["history"] = log.get("history", [])
    path.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")


def weights_file(path: Path | str | None = None) -> Path:
    """The weights file (default: the shipped one); :class:`WeightsNotFoundError` when absent,
    a one-line error when it is there but not a regular file (a directory, a FIFO, /dev/zero)."""
    path = Path(path) if path is not None else DEFAULT_WEIGHTS
    problem = not_regular(path)
    if problem is not None:
        raise JbkvError(f"tiny model weights {problem}")
    if not path.is_file():
        stage3 = f" --stages 3 --init {DEFAULT_WEIGHTS}" if path == LONG_WEIGHTS else ""
        raise WeightsNotFoundError(
            f"tiny model weights not found at {path}; train them with "
            f"`python -m jbkv_cli.models.tiny.train --out {path}{stage3}`"
        )
    return path


def load_weights(path: Path | str | None = None, device: str = "cpu") -> TinyDiT:
    """Build a :class:`TinyDiT` from a safetensors file (default: the shipped weights)."""
    path = weights_file(path)
    with open_safetensors(path) as f:
        cfg = _config(f.metadata(), path)
        state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    model = TinyDiT(cfg)
    check_state_dict(model, state, f"tiny model weights {path}")
    model.load_state_dict(state)
    return model.to(device).eval().requires_grad_(False)


def _config(metadata: dict[str, str] | None, path: Path) -> TinyConfig:
    """The :class:`TinyConfig` stored in the file's metadata (one-line error when absent/bad)."""
    try:
        return TinyConfig(**json.loads((metadata or {})["config"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise JbkvError(
            f"{path} has no valid tiny-model config in its metadata ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:120]})"
        ) from exc
