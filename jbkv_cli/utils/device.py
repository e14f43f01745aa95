"""``--device``: cpu or cuda[:N], defaulting to CUDA where there is one."""

from __future__ import annotations

from jbkv_cli.utils.errors import UsageError


def resolve_device(device: str | None) -> str:
    """``None`` -> ``cuda`` when a CUDA device is available, else ``cpu``; ``cpu`` and
    ``cuda[:N]`` as given (CUDA only where there is one); anything else is a usage error."""
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {device}: no CUDA device is available here")
    if not (device == "cpu" or device.startswith("cuda")):
        raise UsageError(f"--device must be cpu or cuda[:N], got {device!r}")
    return device
