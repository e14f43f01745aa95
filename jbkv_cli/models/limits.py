"""Option specs the model adapters share (:mod:`jbkv_cli.utils.fields`): device, dtype, steps,
chunks, frame size, seeds.

Every adapter declares each option it takes as a :class:`~jbkv_cli.utils.fields.Spec` and parses the
options through :func:`~jbkv_cli.utils.fields.parse_options` first in its ``check_options``, so a
value of the wrong type or out of range is a usage error (exit 2) naming the option and its
range before a model is built or a run folder created. The bounds keep a run's memory and time
finite: at most :data:`MAX_STEPS` denoising steps (the 1,000 training timesteps of these
diffusion schedules) and :data:`MAX_CHUNKS` chunks; frame sides up to :data:`MAX_SIDE` pixels.
"""

from __future__ import annotations

from jbkv_cli.models.dtypes import DTYPES
from jbkv_cli.utils.fields import MAX_SEED, Spec

MAX_STEPS = 1000
MAX_CHUNKS = 1024
MAX_SIDE = 4096
MAX_FPS = 240

DEVICE = Spec("str", pattern=r"cpu|cuda(:\d+)?", what="cpu or cuda[:N]")
DTYPE = Spec("str", choices=tuple(DTYPES))
PATH = Spec("path")
SEED = Spec("int", lo=0, hi=MAX_SEED)
STEPS = Spec("int", lo=1, hi=MAX_STEPS)
CHUNKS = Spec("int", lo=1, hi=MAX_CHUNKS)
SIDE = Spec("int", lo=16, hi=MAX_SIDE)
FPS = Spec("int", lo=1, hi=MAX_FPS)
FLAG = Spec("bool")

__all__ = [
    "CHUNKS",
    "DEVICE",
    "DTYPE",
    "FLAG",
    "FPS",
    "MAX_CHUNKS",
    "MAX_FPS",
    "MAX_SIDE",
    "MAX_STEPS",
    "PATH",
    "SEED",
    "SIDE",
    "STEPS",
]
