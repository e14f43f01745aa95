"""Shared fixtures for the MAGI-1 tests: a tiny random DiT (the oracle cache is
``tests/models/conftest.py``'s ``plain_cache``)."""

import pytest
import torch


@pytest.fixture(scope="module")
def tiny():
    from jbkv_cli.models.magi1.tiny import tiny_dit

    torch.manual_seed(0)
    return tiny_dit(seed=0).eval()
