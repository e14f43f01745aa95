"""LPIPS (Zhang et al. 2018) with the AlexNet backbone, strictly offline.

LPIPS(x, y) = Σ_l (1 / H_l W_l) Σ_{h,w} ‖ w_l ⊙ (φ̂_l(x)_{hw} − φ̂_l(y)_{hw}) ‖²,
φ̂_l = AlexNet features at layer l, unit-normalized over channels; w_l = the learned linear heads
shipped by the ``lpips`` package (v0.1). Frames are scaled from uint8 to [−1, 1].

The AlexNet backbone weights are torchvision's ``alexnet-owt-7be5be79.pth`` read from
``$TORCH_HOME/hub/checkpoints`` (``torch.hub.get_dir()``). The file is checked *before* anything is
built; if it is absent or unusable, LPIPS is unavailable with a one-line reason (absent: "run:
jbkv weights fetch lpips", which downloads and verifies it; :mod:`jbkv_cli.weights`). Nothing here
downloads, and no substitute network is ever used: the model is built on the meta device
(``pnet_rand=True``: no download, no initialization), then every parameter is filled from the
AlexNet file or the lpips heads, and the fixed input scaling layer is rebuilt.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from jbkv_cli.utils.errors import JbkvError

ALEXNET_FILE = "alexnet-owt-7be5be79.pth"
ALEXNET_URL = f"https://download.pytorch.org/models/{ALEXNET_FILE}"
LPIPS_VERSION = "0.1"
DESCRIPTION = "LPIPS v0.1, AlexNet backbone, inputs scaled to [-1, 1]"


class LpipsUnavailableError(JbkvError):
    """LPIPS cannot run offline here; the message says what to place where."""


def alexnet_checkpoint_path() -> Path:
    """Where torchvision keeps the AlexNet weights: ``$TORCH_HOME/hub/checkpoints/<file>``."""
    return Path(torch.hub.get_dir()) / "checkpoints" / ALEXNET_FILE


@dataclass
class LpipsAlex:
    """A loaded LPIPS-AlexNet scorer; ``per_frame`` gives one distance per frame pair."""

    model: torch.nn.Module
    device: torch.device
    batch_size: int = 8
    checkpoint: Path = field(default_factory=alexnet_checkpoint_path)

    def per_frame(self, ref: torch.Tensor, test: torch.Tensor) -> torch.Tensor:
        """LPIPS per frame (float64 [T], CPU) of uint8 frames [T, H, W, 3]."""
        if ref.shape != test.shape or ref.ndim != 4 or ref.shape[-1] != 3:
            raise ValueError(
                f"frames must be [T, H, W, 3] of equal shape, got {ref.shape}, {test.shape}"
            )
        scores = []
        with torch.inference_mode():
            for start in range(0, ref.shape[0], self.batch_size):
                a = _to_unit_range(ref[start : start + self.batch_size], self.device)
                b = _to_unit_range(test[start : start + self.batch_size], self.device)
                scores.append(self.model(a, b).flatten().to(torch.float64).cpu())
        return torch.cat(scores)


def load_lpips(device: torch.device | str | None = None) -> LpipsAlex:
    """Build LPIPS-AlexNet from local files only; raises ``LpipsUnavailableError`` otherwise."""
    checkpoint = alexnet_checkpoint_path()
    if not checkpoint.is_file():
        raise LpipsUnavailableError(
            f"LPIPS unavailable: AlexNet weights {ALEXNET_FILE} not found at {checkpoint}; "
            "run: jbkv weights fetch lpips (or place the file there; TORCH_HOME moves it)"
        )
    try:
        import lpips
    except ImportError as exc:
        raise LpipsUnavailableError(f"LPIPS unavailable: cannot import lpips ({exc})") from exc
    backbone = _load_state(checkpoint, "AlexNet weights")
    heads_file = Path(lpips.__file__).parent / "weights" / f"v{LPIPS_VERSION}" / "alex.pth"
    heads = _load_state(heads_file, "lpips linear heads")
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = lpips.LPIPS(
            net="alex", version=LPIPS_VERSION, pretrained=False, pnet_rand=True, verbose=False
        )
    model.to_empty(device="cpu")
    model.scaling_layer = type(model.scaling_layer)()
    copied = _copy_backbone(model, backbone, checkpoint) | _copy_heads(model, heads, heads_file)
    _check_complete(model, copied)
    target = torch.device(device) if device is not None else torch.device("cpu")
    model = model.to(target).eval()
    return LpipsAlex(model=model, device=target, checkpoint=checkpoint)


def try_load_lpips(device: torch.device | str | None = None) -> tuple[LpipsAlex | None, str]:
    """(scorer, description) or (None, one-line reason it is unavailable)."""
    try:
        return load_lpips(device), DESCRIPTION
    except LpipsUnavailableError as exc:
        return None, str(exc)


def _load_state(path: Path, what: str) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise LpipsUnavailableError(
            f"LPIPS unavailable: cannot load {what} {path} "
            f"({type(exc).__name__}: not a readable weights-only PyTorch checkpoint)"
        ) from exc
    if not isinstance(state, dict):
        raise LpipsUnavailableError(f"LPIPS unavailable: {path} is not a state dict")
    return state


def _copy_backbone(model: torch.nn.Module, state: dict[str, torch.Tensor], path: Path) -> set[str]:
    """lpips splits ``features`` into slices keeping the indices: ``sliceK.i.p`` = ``features.i.p``."""
    copied = set()
    for name, param in model.net.named_parameters():
        _, index, kind = name.split(".")
        _copy(param, state, f"features.{index}.{kind}", path)
        copied.add(f"net.{name}")
    return copied


def _copy_heads(model: torch.nn.Module, state: dict[str, torch.Tensor], path: Path) -> set[str]:
    copied = set()
    for name, param in model.named_parameters():
        if name.startswith("lin"):
            _copy(param, state, name, path)
            copied.add(name)
    return copied


def _check_complete(model: torch.nn.Module, copied: set[str]) -> None:
    """The model was built on the meta device: every parameter must come from a file."""
    params = {name for name, _ in model.named_parameters()}
    buffers = {name for name, _ in model.named_buffers() if not name.startswith("scaling_layer.")}
    if params != copied or buffers:
        raise RuntimeError(f"unexpected LPIPS layout: {sorted(params - copied) + sorted(buffers)}")


def _copy(param: torch.Tensor, state: dict[str, torch.Tensor], key: str, path: Path) -> None:
    value = state.get(key)
    if not isinstance(value, torch.Tensor) or value.shape != param.shape:
        found = "missing" if value is None else f"shape {list(getattr(value, 'shape', []))}"
        raise LpipsUnavailableError(
            f"LPIPS unavailable: {path} does not fit LPIPS-AlexNet ({key}: {found}, "
            f"expected {list(param.shape)})"
        )
    with torch.no_grad():
        param.copy_(value)


def _to_unit_range(frames: torch.Tensor, device: torch.device) -> torch.Tensor:
    """uint8 [N, H, W, 3] -> float32 [N, 3, H, W] in [−1, 1]: x / 127.5 − 1."""
    return frames.to(device).permute(0, 3, 1, 2).to(torch.float32) / 127.5 - 1.0
