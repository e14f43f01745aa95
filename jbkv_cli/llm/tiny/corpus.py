"""The embedded LM's language: a synthetic key–value store that only attention can read.

A document is a stream of three kinds of events (after a first ``<s>``):

- a **binding** ``k7=3``: one token naming key ``7`` and value ``3``; it (re)binds the key, so
  the latest binding of a key wins;
- a **query** ``k7?`` followed by its **answer** ``=3``, the value of the key's latest binding
  (queries ask only for keys bound earlier in the document);
- **filler** words ``w0 … w{F-1}``, uniform noise.

Fillers, bindings and queried keys are unpredictable, so their loss is fixed by the data; an
answer costs nothing to a model that finds the key's latest binding, which may lie anywhere
back in the document: in a chunked prefill, often in the cached prefix. One attention head
suffices (the query token matches the binding token of its key, whose value it copies out),
and the rebinding rule makes it prefer the *latest* binding: if noise on cached keys inflates
their scores (the Jensen bias), an old binding in the cache can out-vote a newer one in the
current chunk, which is exactly the failure the correction targets.

Tokens are whitespace-separated words, which the model's word-level tokenizer
(:mod:`jbkv_cli.llm.tiny.tokenizer`) maps one to one; ``render`` writes a document as text.
Generation is deterministic given a ``torch.Generator``; evaluation documents come from a seed
stream disjoint from training (:func:`eval_generator`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BOS = "<s>"
UNK = "<unk>"
SPECIALS = (UNK, BOS)
EVAL_STREAM = 1 << 40  # evaluation documents are drawn from seeds offset by this


@dataclass(frozen=True)
class CorpusConfig:
    """The synthetic language: how many fillers, keys and values, and how often events occur."""

    fillers: int = 64
    keys: int = 16
    values: int = 8
    bind_prob: float = 0.05
    query_prob: float = 0.1

    def vocabulary(self) -> list[str]:
        """Every token, in id order: the specials, fillers, bindings, queries, answers."""
        words = [*SPECIALS, *(f"w{i}" for i in range(self.fillers))]
        words += [f"k{a}={b}" for a in range(self.keys) for b in range(self.values)]
        words += [f"k{a}?" for a in range(self.keys)]
        words += [f"={b}" for b in range(self.values)]
        return words

    @property
    def vocab_size(self) -> int:
        return len(SPECIALS) + self.fillers + self.keys * self.values + self.keys + self.values

    # token ids
    def filler(self, i: int) -> int:
        return len(SPECIALS) + i

    def binding(self, key: int, value: int) -> int:
        return len(SPECIALS) + self.fillers + key * self.values + value

    def query(self, key: int) -> int:
        return len(SPECIALS) + self.fillers + self.keys * self.values + key

    def answer(self, value: int) -> int:
        return self.query(self.keys) + value


def document_ids(length: int, cfg: CorpusConfig, gen: torch.Generator) -> list[int]:
    """One document of ``length`` token ids (``<s>`` first), see the module docstring."""
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    ids = [SPECIALS.index(BOS)]
    bound: dict[int, int] = {}
    while len(ids) < length:
        u = float(torch.rand(1, generator=gen))
        if u < cfg.bind_prob:
            key = int(torch.randint(cfg.keys, (1,), generator=gen))
            value = int(torch.randint(cfg.values, (1,), generator=gen))
            bound[key] = value
            ids.append(cfg.binding(key, value))
        elif u < cfg.bind_prob + cfg.query_prob and bound:
            keys = sorted(bound)
            key = keys[int(torch.randint(len(keys), (1,), generator=gen))]
            ids += [cfg.query(key), cfg.answer(bound[key])]
        else:
            ids.append(cfg.filler(int(torch.randint(cfg.fillers, (1,), generator=gen))))
    return ids[:length]


def answer_mask(ids: torch.Tensor, cfg: CorpusConfig) -> torch.Tensor:
    """True at answer tokens (the ones the prefix makes predictable)."""
    return ids >= cfg.answer(0)


def render(ids: list[int], cfg: CorpusConfig) -> str:
    """The text of a document (without ``<s>``, which the tokenizer adds back)."""
    vocab = cfg.vocabulary()
    return " ".join(vocab[i] for i in ids if i >= len(SPECIALS))


def eval_generator(seed: int, index: int) -> torch.Generator:
    """The generator of evaluation document ``index`` for ``seed`` (disjoint from training)."""
    return torch.Generator().manual_seed(EVAL_STREAM + seed * 1_000_003 + index)


def eval_document(seed: int, index: int, tokens: int, cfg: CorpusConfig | None = None) -> str:
    """Evaluation document ``index`` of ``tokens`` tokens after ``<s>``, as text."""
    cfg = cfg or CorpusConfig()
    return render(document_ids(tokens + 1, cfg, eval_generator(seed, index)), cfg)
