"""A model folder's config is checked before transformers reads it (``jbkv_cli.llm.load_errors``;
the damaged folders themselves go through the installed ``jbkv`` in test_cli_llm.py)."""

from __future__ import annotations

import json

import pytest

from jbkv_cli.llm.load_errors import check_config
from jbkv_cli.utils.errors import JbkvError


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"num_attention_heads": 0}, "num_attention_heads is 0"),
        ({"hidden_size": 2.5}, "hidden_size is 2.5"),
        ({"head_dim": True}, "head_dim is true"),
        ({"text_config": {"num_key_value_heads": -1}}, "text_config.num_key_value_heads is -1"),
        ([1, 2], "is not a JSON object"),
    ],
)
def test_sizes_that_build_no_model_are_refused_naming_the_field(tmp_path, config, needle):
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(JbkvError) as err:
        check_config(tmp_path, "m")
    assert needle in str(err.value) and str(tmp_path / "config.json") in str(err.value)


@pytest.mark.parametrize(
    "config",
    [{"hidden_size": 64, "head_dim": None}, {"intermediate_size": [64, 128]}, {}],
)
def test_what_transformers_judges_itself_passes(tmp_path, config):
    """A missing size, one left to its default (null) or given per layer (a list)."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    check_config(tmp_path, "m")
