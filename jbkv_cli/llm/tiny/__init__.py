"""The embedded LM: a tiny Llama-architecture model of a synthetic key–value language.

:mod:`~jbkv_cli.llm.tiny.corpus` defines the language, :mod:`~jbkv_cli.llm.tiny.tokenizer` its
word-level tokenizer, :mod:`~jbkv_cli.llm.tiny.train` trains the model on one CPU thread and
writes the Hugging Face folder shipped in ``weights/``.
"""
