"""MAGI-1's caption conditioning: T5 v1.1-XXL embeddings, special tokens, null captions.

Per chunk ``i`` of ``N`` the caption is ``[DURATION_{min(N-1-i, 7)}, HQ, t5 tokens…]`` cut to
``caption_max_length`` (upstream ``PAD_HQ=1 PAD_DURATION=1``, as in its ``run.sh``); the mask
grows by one valid token per special token. The null caption is the DiT's learned
``null_caption_embedding`` with its first 50 tokens valid. Special tokens come from upstream's
``special_tokens.npz`` (``other_tokens[1]`` = HQ, ``other_tokens[7 + n]`` = DURATION_{n+1}),
rounded to float16 as upstream loads them.
"""

from __future__ import annotations

import html
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from jbkv_cli.models.magi1.sampler import TextCondition
from jbkv_cli.utils.errors import JbkvError, WeightsNotFoundError
from jbkv_cli.utils.pretrained import from_pretrained

NULL_TOKEN_LENGTH = 50
MAX_DURATION_TOKENS = 8

_URL = re.compile(r"\b(?:https?://|www\.)\S+|\b[\w.\-]+\.(?:com|co|ru|net|org|edu|gov|it)[\w/\-]*")
_TAG = re.compile(r"<[^>]+>")
_HANDLE = re.compile(r"@[\w\d]+\b")
_CJK = re.compile(
    r"[\u31c0-\u31ef\u31f0-\u31ff\u3200-\u32ff\u3300-\u33ff\u3400-\u4dbf\u4dc0-\u4dff\u4e00-\u9fff]+"
)
_DASHES = re.compile(
    r"[\u002D\u058A\u05BE\u1400\u1806\u2010-\u2015\u2E17\u2E1A\u2E3A\u2E3B\u2E40\u301C\u3030\u30A0\uFE31\uFE32\uFE58\uFE63\uFF0D]+"
)
_BAD_PUNCT = re.compile(r"[#®•©™&@·º½¾¿¡§~\)\(\]\[\}\{\|\\/\*]{1,}")


def clean_caption(text: str) -> str:
    """A light version of upstream's T5 caption cleaning (DeepFloyd-IF style).

    Lower-cases, unquotes URL escapes and HTML entities, drops URLs, HTML tags, @handles and
    CJK characters, unifies dashes and quotes, removes stray punctuation and collapses
    whitespace. Upstream additionally runs ``ftfy`` and BeautifulSoup, which jbkv does not
    depend on; for plain English prompts both give the same text.
    """
    s = urllib.parse.unquote_plus(str(text)).strip().lower()
    s = s.replace("<person>", "person")
    s = _URL.sub("", s)
    s = _TAG.sub("", html.unescape(html.unescape(s)))
    s = _HANDLE.sub("", s)
    s = _CJK.sub("", s)
    s = _DASHES.sub("-", s)
    s = re.sub(r"[`´«»“”¨]", '"', s)
    s = re.sub(r"[‘’]", "'", s)
    s = re.sub(r"[\"\']{2,}", '"', s)
    s = re.sub(r"[\.]{2,}", " ", s)
    s = _BAD_PUNCT.sub(" ", s)
    s = re.sub(r"\s+\.\s+", " ", s)
    if len(re.findall(r"[-_]", s)) > 3:
        s = re.sub(r"[-_]", " ", s)
    s = re.sub(r"\s+", " ", s).strip()
    s = re.sub(r"^[\"\']([\w\W]+)[\"\']$", r"\1", s)
    return s.strip()


class T5TextEncoder:
    """A ``transformers`` T5 encoder + tokenizer, run in float32 (upstream ``T5Embedder``)."""

    def __init__(self, tokenizer, model, max_length: int) -> None:
        self.tokenizer = tokenizer
        self.model = model.eval()
        self.max_length = max_length

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def to(self, device: torch.device | str) -> T5TextEncoder:
        self.model.to(device)
        return self

    @torch.no_grad()
    def encode(self, prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(embeddings [1, L, C] float32, mask [1, L] int64)`` with ``L = max_length``."""
        tok = self.tokenizer(
            [clean_caption(prompt)],
            max_length=self.max_length,
            padding="max_length",
            truncation=True,
            return_attention_mask=True,
            add_special_tokens=True,
            return_tensors="pt",
        )
        ids = tok["input_ids"].to(self.device)
        mask = tok["attention_mask"].to(self.device)
        out = self.model(input_ids=ids, attention_mask=mask)["last_hidden_state"]
        return out.float(), mask


def t5_dir(path: Path) -> Path:
    """``path`` itself or its ``t5-v1_1-xxl`` subfolder (upstream's ``ckpt/t5`` layout)."""
    sub = path / "t5-v1_1-xxl"
    return sub if (sub / "config.json").is_file() else path


def load_t5(path: str | Path, max_length: int, device: str | torch.device = "cpu") -> T5TextEncoder:
    """Load T5 v1.1-XXL (tokenizer + encoder) from a local directory, offline, in float32."""
    try:
        from transformers import AutoTokenizer, T5EncoderModel
    except ImportError as e:  # pragma: no cover - dependency guard
        raise JbkvError("MAGI-1 needs the 'transformers' package for its T5 text encoder") from e
    path = t5_dir(Path(path))
    if not (path / "config.json").is_file():
        raise WeightsNotFoundError(f"T5 encoder not found: expected {path / 'config.json'}")
    try:
        tokenizer = from_pretrained(AutoTokenizer, path, local_files_only=True)
    except (ValueError, ImportError, OSError) as e:
        raise JbkvError(
            f"cannot load the T5 tokenizer from {path} ({e}); the sentencepiece model "
            "(spiece.model) needs the 'sentencepiece' package"
        ) from e
    model = from_pretrained(T5EncoderModel, path, torch_dtype=torch.float32, local_files_only=True)
    return T5TextEncoder(tokenizer, model.to(device), max_length)


@dataclass
class SpecialTokens:
    """The HQ token ``[C]`` and the eight DURATION tokens ``[8, C]`` (float32 values of fp16)."""

    hq: torch.Tensor
    duration: torch.Tensor

    @classmethod
    def from_npz(cls, path: str | Path) -> SpecialTokens:
        path = Path(path)
        if not path.is_file():
            raise WeightsNotFoundError(
                f"special tokens not found: expected {path} (upstream example/assets/special_tokens.npz)"
            )
        with np.load(path, allow_pickle=False) as data:
            other = torch.from_numpy(data["other_tokens"].astype(np.float16)).float()
        return cls(hq=other[1], duration=other[7 : 7 + MAX_DURATION_TOKENS])

    @classmethod
    def random(cls, channels: int, generator: torch.Generator) -> SpecialTokens:
        g = generator
        return cls(
            hq=torch.randn(channels, generator=g),
            duration=torch.randn(MAX_DURATION_TOKENS, channels, generator=g),
        )


def _prepend(token: torch.Tensor, emb: torch.Tensor, mask: torch.Tensor):
    length = emb.shape[0]
    emb = torch.cat([token[None].to(emb), emb])[:length]
    mask = torch.cat([mask.new_ones(1), mask])[:length]
    return emb, mask


def build_text_condition(
    emb: torch.Tensor,
    mask: torch.Tensor,
    null_embedding: torch.Tensor,
    num_chunks: int,
    special: SpecialTokens | None,
) -> TextCondition:
    """Per-chunk captions from one T5 encoding ``emb [1, L, C]`` / ``mask [1, L]``.

    ``special=None`` skips the HQ/DURATION tokens. An empty caption (all-zero mask) makes the
    conditional caption the null caption, as upstream does.
    """
    emb, mask = emb[0].float(), mask[0].long()
    null = null_embedding.detach().float().to(emb.device)
    length = null.shape[0]
    null_mask = torch.zeros(length, dtype=torch.long, device=emb.device)
    null_mask[:NULL_TOKEN_LENGTH] = 1
    nulls = null[None].expand(num_chunks, -1, -1).contiguous()
    null_masks = null_mask[None].expand(num_chunks, -1).contiguous()
    if mask.sum() == 0:
        return TextCondition(nulls.clone(), null_masks.clone(), nulls, null_masks)
    conds, masks = [], []
    for i in range(num_chunks):
        e, m = emb, mask
        if special is not None:
            e, m = _prepend(special.hq, e, m)
            dur = special.duration[min(num_chunks - i - 1, MAX_DURATION_TOKENS - 1)]
            e, m = _prepend(dur, e, m)
        conds.append(e)
        masks.append(m)
    return TextCondition(torch.stack(conds), torch.stack(masks), nulls, null_masks)
