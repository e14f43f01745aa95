"""Which checkpoints each VBench dimension loads, where they must lie, and whether they do.

jbkv never downloads them (VBench would shell out to ``wget``): a missing file is reported with
the place it must go and the address it comes from. Cache roots, as VBench and its libraries
resolve them:

- ``vbench``: ``$VBENCH_CACHE_DIR`` or ``~/.cache/vbench`` (read by ``vbench.utils`` at import);
- ``torch_hub``: ``$TORCH_HOME/hub`` (``$TORCH_HOME`` defaults to ``$XDG_CACHE_HOME/torch`` or
  ``~/.cache/torch``); hub repositories as ``<owner>_<repo>_<ref>/``, weights in ``checkpoints/``;
- ``clip``: ``~/.cache/clip`` (openai-clip's default download root);
- ``home_cache``: ``~/.cache`` (VBench-Long hard-codes it for DreamSim);
- ``hf_hub``: ``$HF_HUB_CACHE`` or ``$HF_HOME/hub`` or ``~/.cache/huggingface/hub``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from jbkv_cli.utils.errors import WeightsNotFoundError

_CLIP = "https://openaipublic.azureedge.net/clip/models"
_VBENCH_HF = "https://huggingface.co/OpenGVLab/VBench_Used_Models/resolve/main"
_DREAMSIM = "dreamsim_ensemble_checkpoint.zip from github.com/ssundaram21/dreamsim releases v0.2.0-checkpoints, unzipped"


@dataclass(frozen=True)
class WeightFile:
    """One file (or folder) a dimension loads.

    ``long_only``: needed only by VBench-Long's clip-to-clip pass (``dev_flag``: DINOv2 for
    subject, DreamSim for background consistency).
    """

    root: str
    path: str
    source: str
    is_dir: bool = False
    long_only: bool = False


_VIT_B32 = WeightFile(
    "clip",
    "ViT-B-32.pt",
    f"{_CLIP}/40d365715913c9da98579312b702a82c18be219cc2a73407c4526f58eba950af/ViT-B-32.pt",
)
_GRIT = WeightFile(
    "vbench",
    "grit_model/grit_b_densecap_objectdet.pth",
    "https://datarelease.blob.core.windows.net/grit/models/grit_b_densecap_objectdet.pth",
)
_BERT = WeightFile(
    "hf_hub",
    "models--bert-base-uncased",
    "Hugging Face model bert-base-uncased (snapshot in the HF hub cache)",
    is_dir=True,
)
# ViCLIP's tokenizer vocabulary (ViCLIP/bpe_simple_vocab_16e6.txt.gz) is not listed: the runner
# copies it from the openai-clip package, which ships the same file.
_VICLIP = (
    WeightFile(
        "vbench",
        "ViCLIP/ViClip-InternVid-10M-FLT.pth",
        f"{_VBENCH_HF}/ViClip-InternVid-10M-FLT.pth",
    ),
)

WEIGHTS: dict[str, tuple[WeightFile, ...]] = {
    "subject_consistency": (
        WeightFile(
            "torch_hub",
            "facebookresearch_dino_main",
            "GitHub repository facebookresearch/dino, branch main (torch.hub cache)",
            is_dir=True,
        ),
        WeightFile(
            "torch_hub",
            "checkpoints/dino_vitbase16_pretrain.pth",
            "https://dl.fbaipublicfiles.com/dino/dino_vitbase16_pretrain/dino_vitbase16_pretrain.pth",
        ),
        WeightFile(
            "torch_hub",
            "facebookresearch_dinov2_main",
            "GitHub repository facebookresearch/dinov2, branch main (torch.hub cache)",
            is_dir=True,
            long_only=True,
        ),
        WeightFile(
            "torch_hub",
            "checkpoints/dinov2_vitb14_pretrain.pth",
            "https://dl.fbaipublicfiles.com/dinov2/dinov2_vitb14/dinov2_vitb14_pretrain.pth",
            long_only=True,
        ),
    ),
    "background_consistency": (
        _VIT_B32,
        WeightFile("home_cache", "dino_vitb16_pretrain.pth", _DREAMSIM, long_only=True),
        WeightFile("home_cache", "open_clip_vitb16_pretrain.pth.tar", _DREAMSIM, long_only=True),
        WeightFile("home_cache", "clip_vitb16_pretrain.pth.tar", _DREAMSIM, long_only=True),
        WeightFile("home_cache", "ensemble_lora", _DREAMSIM, is_dir=True, long_only=True),
    ),
    "temporal_flickering": (),
    "motion_smoothness": (
        WeightFile(
            "vbench",
            "amt_model/amt-s.pth",
            "https://huggingface.co/lalala125/AMT/resolve/main/amt-s.pth",
        ),
    ),
    "dynamic_degree": (
        WeightFile(
            "vbench",
            "raft_model/models/raft-things.pth",
            "https://dl.dropboxusercontent.com/s/4j4z58wuv8o0mfz/models.zip (unzipped)",
        ),
    ),
    "aesthetic_quality": (
        WeightFile(
            "clip",
            "ViT-L-14.pt",
            f"{_CLIP}/b8cca3fd41ae0c99ba7e8951adf17d267cdb84cd88be6f7c2e0eca1737a03836/ViT-L-14.pt",
        ),
        WeightFile(
            "vbench",
            "aesthetic_model/emb_reader/sa_0_4_vit_l_14_linear.pth",
            "https://github.com/LAION-AI/aesthetic-predictor/blob/main/sa_0_4_vit_l_14_linear.pth?raw=true",
        ),
    ),
    "imaging_quality": (
        WeightFile(
            "vbench",
            "pyiqa_model/musiq_spaq_ckpt-358bb6af.pth",
            "https://github.com/chaofengc/IQA-PyTorch/releases/download/v0.1-weights/musiq_spaq_ckpt-358bb6af.pth",
        ),
    ),
    "object_class": (_GRIT, _BERT),
    "multiple_objects": (_GRIT, _BERT),
    "color": (_GRIT, _BERT),
    "spatial_relationship": (_GRIT, _BERT),
    "human_action": (
        WeightFile(
            "vbench",
            "umt_model/l16_ptk710_ftk710_ftk400_f16_res224.pth",
            f"{_VBENCH_HF}/l16_ptk710_ftk710_ftk400_f16_res224.pth",
        ),
    ),
    "scene": (
        WeightFile(
            "vbench",
            "caption_model/tag2text_swin_14m.pth",
            "https://huggingface.co/spaces/xinyu1205/recognize-anything/resolve/main/tag2text_swin_14m.pth",
        ),
        _BERT,
    ),
    "appearance_style": (_VIT_B32,),
    "temporal_style": _VICLIP,
    "overall_consistency": _VICLIP,
}

# Python packages a dimension imports that cannot be installed from PyPI.
EXTRA_PACKAGES: dict[str, tuple[str, ...]] = {
    d: ("detectron2",)
    for d in ("object_class", "multiple_objects", "color", "spatial_relationship")
}


def cache_roots(environ: Mapping[str, str] | None = None) -> dict[str, Path]:
    """Where each cache root lies under ``environ`` (default: this process's environment)."""
    env = os.environ if environ is None else environ
    home = Path(env.get("HOME") or Path.home())
    xdg = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else home / ".cache"
    torch_home = Path(env["TORCH_HOME"]) if env.get("TORCH_HOME") else xdg / "torch"
    if env.get("HF_HUB_CACHE"):
        hf_hub = Path(env["HF_HUB_CACHE"])
    elif env.get("HF_HOME"):
        hf_hub = Path(env["HF_HOME"]) / "hub"
    else:
        hf_hub = xdg / "huggingface" / "hub"
    return {
        "vbench": Path(env["VBENCH_CACHE_DIR"])
        if env.get("VBENCH_CACHE_DIR")
        else home / ".cache" / "vbench",
        "torch_hub": torch_home / "hub",
        "clip": home / ".cache" / "clip",
        "home_cache": home / ".cache",
        "hf_hub": hf_hub,
    }


@dataclass(frozen=True)
class MissingWeight:
    dimension: str
    path: Path
    source: str


def required_files(
    dimension: str, long_mode: bool, static_filter: bool = False
) -> tuple[WeightFile, ...]:
    """The files ``dimension`` loads in long (VBench-Long, dev_flag) or short mode.

    ``static_filter``: temporal_flickering's official filter runs RAFT (dynamic_degree's model).
    """
    if dimension not in WEIGHTS:
        raise KeyError(dimension)
    files = tuple(w for w in WEIGHTS[dimension] if long_mode or not w.long_only)
    if static_filter and dimension == "temporal_flickering":
        files += WEIGHTS["dynamic_degree"]
    return files


def missing_weights(
    dimensions: Iterable[str],
    long_mode: bool = True,
    environ: Mapping[str, str] | None = None,
    static_filter: bool = False,
) -> list[MissingWeight]:
    """Every required file of ``dimensions`` that is absent, with where it must go."""
    roots = cache_roots(environ)
    out: list[MissingWeight] = []
    for dim in dimensions:
        for w in required_files(dim, long_mode, static_filter):
            path = roots[w.root] / w.path
            ok = path.is_dir() if w.is_dir else path.is_file()
            if not ok:
                out.append(MissingWeight(dim, path, w.source))
    return out


def weights_status(
    dimensions: Iterable[str], long_mode: bool = True, environ: Mapping[str, str] | None = None
) -> dict[str, list[MissingWeight]]:
    """Per dimension, the list of missing files (empty: ready)."""
    dims = list(dimensions)
    missing = missing_weights(dims, long_mode, environ)
    return {d: [m for m in missing if m.dimension == d] for d in dims}


def require_weights(
    dimensions: Iterable[str],
    long_mode: bool = True,
    environ: Mapping[str, str] | None = None,
    static_filter: bool = False,
) -> None:
    """Raise :class:`WeightsNotFoundError` naming a missing file and where it must go."""
    missing = missing_weights(dimensions, long_mode, environ, static_filter)
    if missing:
        dims = sorted({m.dimension for m in missing}, key=list(WEIGHTS).index)
        first = missing[0]
        raise WeightsNotFoundError(
            f"VBench weights missing for {', '.join(dims)}: {len(missing)} file(s), e.g. "
            f"{first.path} (from {first.source}); `jbkv vbench setup` lists them all"
        )
