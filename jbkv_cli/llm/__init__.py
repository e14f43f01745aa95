"""The paper's LLM cross-check (§5.4, App. O): chunked prefill with a quantized cached prefix.

- :mod:`~jbkv_cli.llm.hosting`: jbkv's cache and corrected attention inside any Hugging Face
  decoder-only model whose attention goes through ``AttentionInterface`` (no fork).
- :mod:`~jbkv_cli.llm.prefill`: teacher-forced NLL of a current chunk over a stored prefix.
- :mod:`~jbkv_cli.llm.data`, :mod:`~jbkv_cli.llm.models`: prompts and models, validated.
- :mod:`~jbkv_cli.llm.run`, :mod:`~jbkv_cli.llm.evaluate`, :mod:`~jbkv_cli.llm.report`,
  :mod:`~jbkv_cli.llm.gate`: the run folder, the job, the table and the regression gate.
- :mod:`~jbkv_cli.llm.tiny`: the embedded LM (trained by a script here, shipped small).
"""
