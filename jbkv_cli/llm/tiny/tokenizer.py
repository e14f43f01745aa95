"""The embedded LM's tokenizer: one token per whitespace-separated word of its language.

A ``tokenizers`` WordLevel model over :meth:`CorpusConfig.vocabulary
<jbkv_cli.llm.tiny.corpus.CorpusConfig.vocabulary>` (unknown words map to ``<unk>``), with
``<s>`` prepended to every text, wrapped as a transformers ``PreTrainedTokenizerFast`` so it is
saved and loaded like any Hugging Face tokenizer (``tokenizer.json`` in the model folder).
"""

from __future__ import annotations

from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from tokenizers.processors import TemplateProcessing
from transformers import PreTrainedTokenizerFast

from jbkv_cli.llm.tiny.corpus import BOS, UNK, CorpusConfig


def build_tokenizer(cfg: CorpusConfig | None = None) -> PreTrainedTokenizerFast:
    """The word-level tokenizer of ``cfg``'s vocabulary (ids in vocabulary order)."""
    cfg = cfg or CorpusConfig()
    vocab = {w: i for i, w in enumerate(cfg.vocabulary())}
    tok = Tokenizer(WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.post_processor = TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=UNK, bos_token=BOS)
