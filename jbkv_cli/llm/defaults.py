"""The llm-prefill job's defaults: the embedded LM's (small, CPU) and the paper's (§5.4, App. O),
chosen per model by :func:`jbkv_cli.llm.job.prepare`, and the bound on ``--examples``. Light
(no torch), for the command line's help."""

from __future__ import annotations

EMBEDDED_DEFAULTS = {"data": "synthetic", "bins": "128-256,256-512", "chunks": "32,64,128,256"}
PAPER_DEFAULTS = {
    "data": "longbench-pro",
    "bins": "256-512,512-1024",
    "chunks": "128,512,2048,8192",
}
MAX_EXAMPLES = 100_000
